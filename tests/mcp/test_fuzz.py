"""Fuzzing the tool-argument layer through the real server: hostile arguments
for every tool in tools/list, derived from each tool's inputSchema, sent with
the official MCP SDK; and, below the SDK, tools/call lines whose JSON the SDK
cannot even produce (lone surrogates, invalid UTF-8, nesting past the parser's
limit). Seeded, so a failure is reproducible; the number of calls is printed.

What must hold for every call: a reply (result, isError, or JSON-RPC error)
within a deadline; the server alive and answering list_panes after each batch;
no `#(...)` job ever runs (canary files on the host, in the workspace and in
the sandbox's /tmp); exactly one audit record per call, and a log that
`sandmux audit verify` accepts."""

import json
import os
import pathlib
import random
import re
import select
import subprocess
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import BIN, alive, call, connect, serve_pids

pytestmark = pytest.mark.anyio
ALL = ["--toolsets", "inspect,manage,execute,teardown"]
SEED = int(os.environ.get("SANDMUX_FUZZ_SEED", "0x5A4DF022"), 0)
CALLS = int(os.environ.get("SANDMUX_FUZZ_CALLS", "1500"))  # hostile calls (plus checks between batches)
BATCH = 100
TRACE = os.environ.get("SANDMUX_FUZZ_TRACE") == "1"  # print every call
DEADLINE = 20.0  # seconds for one reply; the profile's wait ceiling is 2 s
TEARDOWN = {"kill_session", "kill_window", "kill_pane", "clear_pane", "delete_buffer"}


def audit_records(ws):
    """The audit log's records before the seal (see conftest.audit_records),
    lines split on "\n" only."""
    path = ws[1] / "audit.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(l) for l in path.read_text().split("\n") if l]
    return recs[:-1] if recs and recs[-1]["tool"] == "(sealed)" else recs


def fuzz_profile(ws, **limits):
    """The default profile with a short wait ceiling (and optional [limits]
    overrides), written outside the workspace (profiles never come from it)."""
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text = re.sub(r"^wait_max_seconds = .*$", "wait_max_seconds = 2", text, flags=re.M)
    for k, v in limits.items():
        text, n = re.subn(rf"^{k} = .*$", f"{k} = {json.dumps(v)}", text, flags=re.M)
        assert n == 1, k
    p = ws[1] / "fuzz-profile.toml"
    p.write_text(text)
    return p


class Fuzz:
    def __init__(self, rng, ws, token, targets):
        self.r = rng
        self.token = token
        work, host = ws
        self.canaries = [f"/tmp/{token}-in", f"{work}/{token}-ws", f"{host}/{token}-host"]
        self.targets = targets  # real ids/names, so some calls get past target resolution

    def hostile_string(self):
        r = self.r
        c = r.choice(self.canaries)
        pool = [
            "", " ", "-", "--", "-t", "-nfoo", "-w", ";", "\\;", " ; ", "{}", "{", "}", "{ kill-server }",
            "%1;kill-server", "%1 \\; kill-server", "$", "$0", "$1;kill-server", "$HOME", "${HOME}", "@", "@1",
            "@99999999999999999999", "%", "%-1", "%1.0", "main:0.0", "=main", "main;kill-server", "main\\;kill-server",
            "!", "^", "{last}", "{mouse}", "~", "~root", "'", '"', "\\", "\\\\", "\\012", "C-c", "Enter", "C-",
            f"#(touch {c})", f"x#(touch {c})", f"#{{E:#(touch {c})}}", "#{E:HOME}", "#{T:status-left}", "#{pane_pid}",
            "#{s/a/b/:pane_id}", "#{?pane_dead,a,b}", "#{l:#(id)}", "##", "#", "#[fg=red]",
            "a\0b", "\0", "\x1b]52;c;aGk=\x07", "\x1b[2J", "\r\n", "\n", "\t", "\x7f", "\u0085", "\u2028",
            "é", "\u202e", "\U0001f600", "\ufffd", "../../etc/passwd", "/etc/shadow", "/proc/self/root", "/run/sandmux/sock",
            "default-shell", "default-command", "status-left", "set-clipboard", "command-alias", "update-environment",
            "@user-opt", "history-limit", "status-left[0]", "LD_PRELOAD", "TMUX", "-1", "1e999", "NaN",
        ]
        pick = r.random()
        if pick < 0.04:
            return "x" * r.choice([32769, 40000])
        if pick < 0.05:
            return "y" * (1 << 20)
        if pick < 0.25:
            return "".join(r.choice(pool) for _ in range(r.randint(2, 5)))
        if pick < 0.35:
            return "".join(chr(r.choice([r.randint(0, 0x7f), r.randint(0x80, 0x7ff), r.randint(0x800, 0xd7ff), r.randint(0xe000, 0x10FFFF)])) for _ in range(r.randint(1, 40)))
        return r.choice(pool)

    def number(self):
        return self.r.choice([-1, 0, 1, 2, -(2**31), 2**31, 2**32, 2**53 + 1, 2**63, -(2**63), 2**64, 10**30, 1e308, -1e308, 0.5, -0.0, 3.7])

    def wrong(self, depth_ok=True):
        r = self.r
        v = r.choice([None, True, False, 0, -5, 1.5, "s", [], {}, [1, "a", None], {"a": {"b": [1]}}, self.number()])
        if depth_ok and r.random() < 0.1:
            for _ in range(r.randint(20, 100)):
                v = [v] if r.random() < 0.5 else {"k": v}
        return v

    def value_for(self, name, spec):
        r = self.r
        types = spec.get("type")
        if isinstance(types, str):
            types = [types]
        if not types:
            types = ["string", "object", "array"]
        t = r.choice([t for t in types if t != "null"] or ["null"])
        if r.random() < 0.12:
            return self.wrong()
        if t == "string":
            if r.random() < 0.3 and self.targets.get(name):
                return r.choice(self.targets[name])
            if name in ("option", "hook_name") and r.random() < 0.5:
                return r.choice(["default-shell", "status-left", "set-clipboard", "history-limit", "mode-keys", "remain-on-exit", "@x", "after-new-window", "pane-exited", "command-alias[0]", "status-right", "lock-command"])
            return self.hostile_string()
        if t in ("integer", "number"):
            return self.number()
        if t == "boolean":
            return r.random() < 0.5
        if t == "array":
            return [self.hostile_string() for _ in range(r.randint(0, 4))]
        if t == "object":
            return {self.hostile_string()[:64]: self.hostile_string() for _ in range(r.randint(0, 3))}
        return None

    def args_for(self, tool):
        r = self.r
        schema = tool.input_schema or {}
        props = schema.get("properties", {}) or {}
        required = schema.get("required", []) or []
        args = {}
        for k, spec in props.items():
            if k in required or r.random() < 0.4:
                args[k] = self.value_for(k, spec)
        if tool.name == "call_read_tools_batch" and r.random() < 0.7:
            args["operations"] = [
                {"tool": r.choice(["list_panes", "capture_pane", "display_message", "wait_for_text", "run_command", "call_read_tools_batch", "nope", self.hostile_string()]), "arguments": r.choice([{}, {"format_string": f"#(touch {self.canaries[0]})"}, self.wrong(False)])}
                for _ in range(r.randint(0, 5))
            ]
        for _ in range(r.randint(0, 2)):
            m = r.random()
            if m < 0.3 and required:
                args.pop(r.choice(required), None)
            elif m < 0.6:
                args[r.choice(["socket", "socket_name", "socket_path", "extra", "", "__proto__", "Target", "pane_id ", "x" * 300])] = self.wrong()
            elif props:
                args[r.choice(list(props))] = self.wrong()
        if tool.name == "kill_server":
            # Only calls that must be refused: an unknown argument.
            args = {r.choice(["socket", "force", "x"]): self.wrong(False)}
        return args


async def test_hostile_arguments_for_every_tool(ws, capfd):
    rng = random.Random(SEED)
    token = f"sandmux-canary-{SEED:x}"
    made = []  # tool names in call order, every call this test sends
    problems = []
    outcomes = {}
    t_start = time.monotonic()

    async with connect(ws, "-p", str(fuzz_profile(ws)), *ALL) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert len(tools) > 40, sorted(tools)
        pid = serve_pids(ws[0])[0]

        async def do(name, args):
            made.append(name)
            t0 = time.monotonic()
            r = None
            try:
                with anyio.fail_after(DEADLINE):
                    r = await c.call_tool(name, args)
                kind = "isError" if r.is_error else "ok"
            except TimeoutError:
                problems.append(f"no reply within {DEADLINE}s: {name} {str(args)[:300]}")
                kind = "timeout"
            except MCPError as e:
                kind = "rpc-error"
                r = e
            except Exception as e:  # the SDK rejected what the server sent
                problems.append(f"{name}: client-side {type(e).__name__}: {str(e)[:300]} for {str(args)[:300]}")
                kind = "client-exception"
                r = e
            outcomes[kind] = outcomes.get(kind, 0) + 1
            return kind, r, time.monotonic() - t0

        s = await call(c, "create_session", {"session_name": "fuzz"})
        made.append("create_session")
        targets = {
            "pane_id": [s["pane_id"], "%1", "%0", "%999"],
            "session_id": [s["session_id"], "$1", "$0"],
            "session_name": ["fuzz", "main"],
            "window_id": [s["window_id"], "@1"],
            "window_index": ["0", "1", "-1"],
            "source_pane_id": [s["pane_id"], "%1"],
            "target_pane_id": ["%1", s["pane_id"]],
            "corner": ["top-left", "bottom-right", "middle"],
            "scope": ["server", "session", "window", "pane", "global", ""],
            "layout": ["tiled", "even-horizontal", "bb62,159x48,0,0{79x48,0,0,79x48,80,0,80}"],
            "direction": ["up", "next", "before", "below", "sideways"],
            "buffer_name": ["sandmux-buf-1", "buffer0"],
            "on_error": ["continue", "stop", "explode"],
        }
        fz = Fuzz(rng, ws, token, targets)
        ordinary = sorted(n for n in tools if n not in TEARDOWN)
        plan = [rng.choice(ordinary) for _ in range(CALLS - 110)]
        plan += [rng.choice(sorted(TEARDOWN & set(tools))) for _ in range(100)]
        plan += [rng.choice(["list_servers", "pipe_pane", "", "list_panes\0", "LIST_PANES", "list_panes ", "run-shell", "x" * 150]) for _ in range(5)]
        plan += ["kill_server"] * 5
        slow = []
        for i, name in enumerate(plan):
            args = fz.args_for(tools[name]) if name in tools else {}
            kind, r, dt = await do(name, args)
            if TRACE:
                print(f"call {i}: {dt:.2f}s {kind} {name} {str(args)[:300]!r}", flush=True)
            if dt > 3:
                slow.append((round(dt, 1), name))
                print(f"slow call {i}: {dt:.1f}s {name} {str(args)[:300]!r}", flush=True)
            if name == "kill_server" and kind != "isError":
                problems.append(f"kill_server with {args} was not refused: {kind}")
            if (i + 1) % BATCH == 0 or i == len(plan) - 1:
                assert alive(pid), f"sandmux died after call {i}: {name} {str(args)[:300]}"
                kind, r, _ = await do("list_panes", {})
                assert kind == "ok", f"list_panes failed after call {i} ({name} {str(args)[:300]}): {r}"

        # No #() job ran: not in the sandbox's /tmp (positive control: a file a
        # pane makes there is seen), not in the workspace, not on the host.
        made.append("create_session")
        chk = await call(c, "create_session", {"session_name": "canary-check"})
        made.append("run_command")
        out = await call(c, "run_command", {"pane_id": chk["pane_id"], "command": f"touch /tmp/{token}-control; ls -a /tmp {ws[0]} | grep -c -- {token}-; ls -a /tmp | grep -- {token}-"})
        assert out["output"].splitlines() == ["1", f"{token}-control"], out
        assert not list((ws[0]).rglob(f"{token}*")), list(ws[0].rglob(f"{token}*"))
        assert not list((ws[1]).rglob(f"{token}*"))
        made.append("get_server_info")
        assert (await call(c, "get_server_info"))["drift"] == "none"
    elapsed = time.monotonic() - t_start

    err = capfd.readouterr().err
    assert "panicked" not in err, err[-3000:]
    print(f"\nfuzz: {len(made)} calls ({len(plan)} hostile) in {elapsed:.1f}s; outcomes {outcomes}; slow {slow}")
    assert not problems, "\n".join(problems[:20])

    # Exactly one record per call: per tool name, and one per request id.
    recs = [r for r in audit_records(ws) if r["request_id"] != "batch" and not r["tool"].startswith("resource:")]
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids)), [i for i in set(ids) if ids.count(i) > 1][:10]
    assert len(recs) == len(made), (len(recs), len(made))
    from collections import Counter

    # The log cuts strings over 1 KiB; no tool name used here is longer.
    assert Counter(r["tool"] for r in recs) == Counter(made)
    assert {r["outcome"] for r in recs} <= {"ok", "error", "refused", "malformed"}
    v = subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True, text=True)
    assert v.returncode == 0 and "chain intact" in v.stdout, (v.stdout, v.stderr)


async def test_non_ascii_scope_target_gets_a_reply(ws, capfd):
    async with connect(ws, *ALL) as c:
        for tool, args in [("show_option", {"option": "history-limit", "scope": "window", "target": "\u00e9"}), ("set_option", {"option": "history-limit", "value": "100", "scope": "pane", "target": "\ufffd1"})]:
            with anyio.fail_after(5):
                r = await c.call_tool(tool, args)
            assert r.is_error and "not a session, window or pane id" in r.content[0].text, r
        await call(c, "list_panes")
    assert [r["tool"] for r in audit_records(ws)] == ["show_option", "set_option", "list_panes"]
    assert "panicked" not in capfd.readouterr().err


async def test_huge_timeout_gets_a_reply(ws, capfd):
    # A 2 s ceiling: each huge timeout must be clamped to it (not panic).
    async with connect(ws, "--profile", str(fuzz_profile(ws))) as c:
        for tool, args in [("run_command", {"command": "echo hi", "timeout": 2**64}), ("wait_for_gone", {"patterns": ["zz"], "timeout": 1e308}), ("wait_for_text", {"patterns": ["zz"], "timeout": 1e30})]:
            with anyio.fail_after(8):
                r = await c.call_tool(tool, args)
            sc = r.structured_content or {}
            # The waits report the timeout they used; run_command its elapsed time.
            assert r.is_error or sc.get("effective_timeout", sc.get("elapsed")) <= 2.5, r
        await call(c, "list_panes")
    assert [r["tool"] for r in audit_records(ws)] == ["run_command", "wait_for_gone", "wait_for_text", "list_panes"]
    assert "panicked" not in capfd.readouterr().err


async def test_run_command_in_copy_mode_keeps_the_instance_answering(ws):
    async with connect(ws) as c:
        await call(c, "enter_copy_mode")
        with anyio.fail_after(30):
            await c.call_tool("run_command", {"command": "echo hi"})  # may fail; it must not wedge
            r = await c.call_tool("list_panes", {})
        assert not r.is_error, r.content[0].text


def nested(depth):
    return "[" * depth + '"x"' + "]" * depth


# tools/call lines the SDK cannot produce: valid framing, an id, but JSON the
# server's parser rejects (serde_json: lone surrogates, invalid UTF-8,
# nesting deeper than 128). The existing malformed-JSON test
# (test_policy.py) sends garbage without an id and checks only that the
# server goes on; these carry an id.
UNPARSEABLE = [
    ("lone-surrogate", b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"send_keys","arguments":{"text":"a\\ud800b","enter":false}}}'),
    ("lone-surrogate-name", b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list\\udc00panes","arguments":{}}}'),
    ("invalid-utf8", b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"send_keys","arguments":{"text":"a\xff\xfe\xc3b","enter":false}}}'),
    ("nested-200", b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list_panes","arguments":{"filters":' + nested(200).encode() + b"}}}"),
    ("nested-100000", b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"list_panes","arguments":{"filters":' + nested(100_000).encode() + b"}}}"),
]


class Raw:
    """sandmux serve on plain pipes, for lines the SDK would refuse to send."""

    def __init__(self, ws):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        self.p = subprocess.Popen([BIN, "serve", "-w", str(ws[0]), "--audit-log", str(ws[1] / "audit.jsonl")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw-fuzz", "version": "0"}}}).encode())
        assert json.loads(self.recv(20))["id"] == 1
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, line):
        self.p.stdin.write(line + b"\n")
        self.p.stdin.flush()

    def recv(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        return self.p.stdout.readline() if r else None

    def close(self):
        self.p.stdin.close()
        return self.p.wait(timeout=15)


def test_unparseable_tool_calls_leave_the_server_serving(ws):
    raw = Raw(ws)
    try:
        for i, (what, line) in enumerate(UNPARSEABLE):
            raw.send(line % (100 + i))
            raw.recv(0.5)  # whatever comes (today: nothing)
            assert raw.p.poll() is None, f"sandmux exited on {what}"
            raw.send(json.dumps({"jsonrpc": "2.0", "id": 200 + i, "method": "tools/call", "params": {"name": "list_panes", "arguments": {}}}).encode())
            reply = None
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                line_ = raw.recv(10)
                assert line_, f"no reply to list_panes after {what}"
                msg = json.loads(line_)
                if msg.get("id") == 200 + i:
                    reply = msg
                    break
            assert reply and reply["result"].get("isError") is not True, (what, reply)
    finally:
        assert raw.close() == 0
    print(f"\nfuzz: {len(UNPARSEABLE)} unparseable tool calls sent on the wire")


def test_unparseable_tool_calls_are_answered_and_audited(ws):
    """Lines that are not JSON get a JSON-RPC parse error (-32700) under the
    id they carried, and one audit record each (P7); lines with no readable
    id get no reply (there is nothing to answer to) but are audited too."""
    raw = Raw(ws)
    missing = []
    overlong = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"send_keys","arguments":{"text":"' + b"x" * (9 << 20) + b'"}}}'
    cases = UNPARSEABLE + [("overlong-9MiB", overlong)]
    try:
        for i, (what, line) in enumerate(cases):
            raw.send(line % (100 + i))
            reply = raw.recv(5)
            if reply is None:
                missing.append(f"{what}: no reply")
                continue
            msg = json.loads(reply)
            if msg.get("id") != 100 + i or msg.get("error", {}).get("code") != -32700:
                missing.append(f"{what}: {msg}")
        for garbage in [b"{not json", b"\xff\xfe garbage", b'{"method": "tools/call", "params": '] :
            raw.send(garbage)
        raw.send(json.dumps({"jsonrpc": "2.0", "id": 999, "method": "tools/call", "params": {"name": "list_panes", "arguments": {}}}).encode())
        while True:
            line_ = raw.recv(10)
            assert line_, "no reply to the call after the garbage"
            msg = json.loads(line_)
            assert msg.get("id") in (999, None) or "error" not in msg, f"a garbage line was answered: {msg}"
            if msg.get("id") == 999:
                assert not msg["result"].get("isError"), msg
                break
    finally:
        assert raw.close() == 0
    recs = audit_records(ws)
    bad = [r for r in recs if r["tool"] == "(unparseable)"]
    if len(bad) != len(cases) + 3 or any(r["outcome"] != "malformed" for r in bad):
        missing.append(f"{len(bad)} unparseable records for {len(cases) + 3} lines: {bad[:3]}")
    if [r["tool"] for r in recs if r["tool"] != "(unparseable)"] != ["list_panes"]:
        missing.append(f"other records: {[r['tool'] for r in recs]}")
    v = subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True, text=True)
    if v.returncode != 0:
        missing.append(v.stdout + v.stderr)
    assert not missing, missing
