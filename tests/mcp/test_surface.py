"""A lean, standard tool surface (issue 10): the size of `tools/list` for the
default surface and the `core` preset, measured as a bare JSON-RPC client sees
it (the `result`, serialized compactly), and schemas generic clients read."""

import json
import os
import subprocess
import tempfile

import pytest

from conftest import BIN

BUDGET = 36_000  # bytes of the compact `result` of tools/list, default surface (35,472 measured; issue 42's goal, see docs/mcp.md)
CHOICES = {  # every argument that picks one of a few words is an enum
    ("find_pane_by_position", "corner"), ("call_read_tools_batch", "on_error"), ("send_keys_batch", "on_error"),
    ("create_window", "direction"), ("split_window", "direction"), ("select_window", "direction"),
    ("select_pane", "direction"), ("select_layout", "layout"), ("run_command", "when_busy"),
    ("show_option", "scope"), ("show_hooks", "scope"), ("show_hook", "scope"),
}


# The shared target arguments: described once, in the server's instructions,
# not in every tool's schema (the default surface's budget).
TARGETS = {"pane_id", "window_id", "window_index", "session_id", "session_name"}
INSTRUCTIONS = [""]


def tools_list(*args):
    """The `result` of tools/list from a fresh `sandmux serve`, over raw stdio."""
    with tempfile.TemporaryDirectory() as ws, tempfile.TemporaryDirectory() as host:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        # (An explicit audit log: as uid 65534 there is no home to default to.)
        p = subprocess.Popen([BIN, "serve", "-w", ws, "--no-session", "--audit-log", f"{host}/audit.jsonl", *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

        def ask(i, method, params=None):
            msg = {"jsonrpc": "2.0", "id": i, "method": method}
            if params is not None:
                msg["params"] = params
            p.stdin.write((json.dumps(msg) + "\n").encode())
            p.stdin.flush()
            while True:
                m = json.loads(p.stdout.readline())
                if m.get("id") == i:
                    return m

        init = ask(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
        INSTRUCTIONS[0] = init["result"].get("instructions", "")
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        r = ask(1, "tools/list")["result"]
        p.stdin.close()
        p.wait(timeout=20)
        return r


def size(r):
    return len(json.dumps(r, separators=(",", ":")))


def test_the_default_surface_fits_its_budget():
    r = tools_list()
    assert len(r["tools"]) == 49
    assert size(r) < BUDGET, f"tools/list is {size(r)} bytes (budget {BUDGET})"


def test_the_core_preset_is_small_and_made_of_real_toolsets():
    r = tools_list("--toolsets", "core")
    names = {t["name"] for t in r["tools"]}
    assert 8 <= len(names) <= 10 and {"run_command", "wait_for_command", "capture_pane", "send_keys"} <= names, names
    assert size(r) < 15_000, size(r)
    # Combined with a toolset: the union.
    both = {t["name"] for t in tools_list("--toolsets", "core,teardown")["tools"]}
    assert names < both and "kill_server" in both


def walk(v, path=""):
    if isinstance(v, dict):
        yield path, v
        for k, x in v.items():
            yield from walk(x, f"{path}.{k}")
    elif isinstance(v, list):
        for x in v:
            yield from walk(x, path)


def test_schemas_are_plain_json_schema():
    r = tools_list("--toolsets", "inspect,manage,execute,teardown")
    for t in r["tools"]:
        for key in ("inputSchema", "outputSchema"):
            for path, node in walk(t.get(key, {})):
                where = f"{t['name']}.{key}{path}"
                assert not isinstance(node.get("type"), list), f"{where}: type array {node['type']}"
                assert "format" not in node, f"{where}: format {node.get('format')}"
                assert "$ref" not in node and "$defs" not in node, where
                assert node.get("type") != "null", where
                d = node.get("description")
                assert not isinstance(d, str) or len(d) > 12, f"{where}: placeholder description {d!r}"
        assert t["inputSchema"]["type"] == "object"
        # Tool descriptions are real sentences.
        assert len(t["description"]) > 12, t["name"]
    props = {(t["name"], k): v for t in r["tools"] for k, v in t["inputSchema"].get("properties", {}).items()}
    # Every argument the model fills in is described (the doc comment of its
    # field becomes its description); the shared targets once, in the
    # instructions the same server gave.
    undescribed = sorted(k for k, v in props.items() if k[1] not in TARGETS and not v.get("description"))
    assert not undescribed, f"arguments without a description: {undescribed}"
    for name in TARGETS:
        assert name in INSTRUCTIONS[0], f"the instructions do not describe {name}"
    for c in CHOICES:
        assert props[c].get("type") == "string" and props[c].get("enum"), (c, props[c])
