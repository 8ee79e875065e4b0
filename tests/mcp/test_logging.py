"""Diagnostics through `tracing` (docs/logging.md), attacked from the
agent's side: at the most verbose level (`SANDMUX_LOG=trace`) serve's stdout
stays pure JSON-RPC, a secret argument never reaches the log, a hostile
string reaches it only escaped, and nothing is written into a pane."""

import json
import os
import re
import subprocess
import tempfile

import pytest

from conftest import BIN, runtime_dir_of

SECRET = "hunter2-SECRET-7f3a"
# ESC, BEL, an OSC 52 clipboard write, C1 CSI, RLO and an isolate: none may
# reach the operator's terminal raw.
HOSTILE = "evil\x1b]52;c;QUFB\x07\x9b31m\u202eX\u2066"
RAW = [b"\x1b", b"\x07", b"\xc2\x9b", "\u202e".encode(), "\u2066".encode()]


def _env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    e.update(extra)
    return e


def _serve(ws, fmt):
    """One traced serve session over raw JSON-RPC: (stdout lines, stderr
    bytes, instance id, the pane's text)."""
    work, host = ws
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(
        [BIN, "--log-format", fmt, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=_env(SANDMUX_LOG="trace"),
    )
    lines, n = [], 0

    def rpc(method, params):
        nonlocal n
        n += 1
        p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\n").encode())
        p.stdin.flush()
        while True:
            line = p.stdout.readline()
            assert line, "serve ended"
            lines.append(line)
            m = json.loads(line)
            if m.get("id") == n:
                return m

    def tool(name, args):
        return rpc("tools/call", {"name": name, "arguments": args})["result"]

    rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": HOSTILE, "version": "1"}})
    p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    p.stdin.flush()
    iid = runtime_dir_of(p.pid).name
    pane = tool("list_panes", {})["structuredContent"]["panes"][0]["pane_id"]
    sent = tool("send_keys", {"pane_id": pane, "text": f"echo {SECRET}"})["structuredContent"]
    assert "error" in rpc("tools/call", {"name": HOSTILE, "arguments": {}})
    tool("create_session", {"session_name": HOSTILE})
    shown = tool("wait_for_text", {"cursor": sent["cursor"], "patterns": [SECRET[:-2]], "timeout": 10})
    assert shown["structuredContent"]["outcome"] == "matched", shown
    text = tool("capture_pane", {"pane_id": pane})["structuredContent"]["text"]
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    lines += p.stdout.readlines()
    err.seek(0)
    return lines, err.read(), iid, text


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_serve_at_trace_keeps_stdout_pure_and_secrets_out(ws, fmt):
    out, err, iid, pane = _serve(ws, fmt)
    # stdout: JSON-RPC only, every line.
    assert out and all(json.loads(l)["jsonrpc"] == "2.0" for l in out), out[:3]
    # Positive control: the secret was typed and the pane showed it (on the
    # MCP channel, where the client asked for it).
    assert SECRET in pane and any(SECRET.encode() in l for l in out)
    assert SECRET.encode() not in err, "the log holds a secret argument"
    for raw in RAW:
        assert raw not in err, f"the log holds raw {raw!r}"
    # Nothing inside the sandbox logged into the pane.
    assert not any(l.startswith("sandmux: ") or '"level"' in l for l in pane.splitlines()), pane
    text = err.decode()
    if fmt == "json":
        events = [json.loads(l) for l in text.splitlines()]
        msgs = {e["message"] for e in events}
        assert {"audit record", "tool call refused", "serving MCP on stdio", "shutdown: the instance ended"} <= msgs, msgs
        # The instance id is on every event once the instance exists.
        after = events[next(i for i, e in enumerate(events) if e.get("instance")):]
        assert all(e.get("instance") == iid for e in after), [e for e in after if e.get("instance") != iid][:2]
        # The hostile name reached the log as itself, only escaped.
        refused = [e for e in events if e["message"] == "tool call refused"]
        assert any(e["tool"] == HOSTILE and HOSTILE in e["reason"] for e in refused), refused
        assert any("send_keys" in e.get("record", "") and '"sha256"' in e["record"] for e in events)
    else:
        assert all(l.startswith("sandmux: ") or l.startswith("  ") for l in text.splitlines()), text[:500]
        assert re.search(r"^sandmux: debug: tool call refused tool=evil\\x1b\]52;c;QUFB\\x07\\x9b31m\\u\{202e\}X\\u\{2066\} ", text, re.M), text
        assert f"instance={iid}" in text


def test_debug_shows_each_layer_as_json_lines(ws):
    work, _ = ws
    # -q: the line naming dropped layers (as uid 65534: cgroup) is the
    # sandbox's own, written before the command starts, not a log event.
    run = [BIN, "--log-format", "json", "run", "-q", "-w", str(work), "--", "true"]
    p = subprocess.run(run, env=_env(SANDMUX_LOG="debug"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    events = [json.loads(l) for l in p.stderr.splitlines()]
    layers = [e for e in events if e["message"] in ("layer enforced", "layer dropped")]
    names = {e["layer"] for e in layers}
    assert {"cgroup", "mount", "seccomp", "caps"} <= names, names
    ids = {e["instance"] for e in events}
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{12}", ids.pop()), events[:2]
    assert all(e["level"] == "DEBUG" and e["ts"].endswith("Z") for e in layers)
    # Control: at the default level (info) the same run says nothing.
    q = subprocess.run(run, env=_env(), capture_output=True, text=True, timeout=60)
    assert q.returncode == 0 and q.stderr == "", q.stderr


def test_sandmux_log_is_read_and_kept_out_of_the_sandbox(ws):
    work, host = ws
    # The log level does not enter the sandbox (control: PATH does).
    p = subprocess.run([BIN, "run", "-w", str(work), "--", "env"], env=_env(SANDMUX_LOG="info"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "PATH=" in p.stdout and "SANDMUX" not in p.stdout, p.stdout
    # A filter that does not parse stops every command, with the reason.
    bad = subprocess.run([BIN, "ps"], env=_env(SANDMUX_LOG="sandmux=loud"), capture_output=True, text=True, timeout=20)
    assert bad.returncode == 2 and "SANDMUX_LOG=sandmux=loud" in bad.stderr, bad.stderr
    # serve reads SANDMUX_LOG (E30 names it) and still refuses any other SANDMUX_* name.
    serve = [BIN, "serve", "-w", str(work), "--audit-log", str(host / "b.jsonl")]
    r = subprocess.run(serve, env=_env(SANDMUX_LOG="debug", SANDMUX_SAFETY="off"), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "unknown environment variable SANDMUX_SAFETY" in r.stderr, r.stderr
    assert "SANDMUX_LOG" in r.stderr  # named among the variables sandmux reads
    ok = subprocess.run(serve, env=_env(SANDMUX_LOG="debug"), stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=60)
    # (stdin ends before the handshake: the MCP start-up fails, after the sandbox started.)
    assert "unknown environment variable" not in ok.stderr and "initialize request" in ok.stderr, ok.stderr
    assert "layer enforced" in ok.stderr and ok.stdout == "", (ok.stdout, ok.stderr)
