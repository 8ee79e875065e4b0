"""Policy on the wire: toolsets, start-up refusals, P3 refusals, drift,
audit, protocol versions, malformed JSON-RPC, resources, prompts, teardown."""

import json
import os
import re
import pathlib
import subprocess
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import BIN, alive, audit_records, call, connect, descendants, runtime_dir_of, serve_pids, server_params, tmux_host

pytestmark = pytest.mark.anyio
ALL = ["--toolsets", "inspect,manage,execute,teardown"]


async def test_toolsets_filter_the_wire(ws):
    async with connect(ws, "--toolsets", "inspect", "--tools", "send_keys", "--exclude-tools", "capture_pane") as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert "list_panes" in names and "send_keys" in names
        assert "capture_pane" not in names and "run_command" not in names and "kill_server" not in names
        with pytest.raises(MCPError, match="Unknown tool: run_command"):
            await c.call_tool("run_command", {"command": "id"})
        with pytest.raises(MCPError, match="Unknown tool: capture_pane"):
            await c.call_tool("capture_pane", {})
    recs = [r for r in audit_records(ws) if r["tool"] in ("run_command", "capture_pane")]
    assert [r["outcome"] for r in recs] == ["refused", "refused"]


def test_unknown_names_fail_startup(ws):
    work, host = ws
    base = [BIN, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl")]
    for extra, env, needle in [
        (["--toolsets", "inspect,evrything"], {}, "valid toolsets: inspect, manage, execute, teardown"),
        (["--tools", "list_servers"], {}, "valid tools:"),
        (["--exclude-tools", "nope"], {}, "valid tools:"),
        ([], {"SANDMUX_TOOLSETS": "bogus"}, "unknown toolset"),
        ([], {"SANDMUX_SAFETY": "readonly"}, "unknown environment variable SANDMUX_SAFETY"),
    ]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        e.update(env)
        p = subprocess.run(base + extra, env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        assert p.returncode == 2, (extra, env, p.stderr)
        assert needle in p.stderr, p.stderr
    # Nothing started: no runtime directory was left for these.
    assert not any(serve_pids(work))


def test_host_files_are_refused_inside_the_workspace(ws, tmp_path):
    """The audit log and the recording are the human's evidence: the agent can
    write the workspace and the profile's other read_write trees, so neither
    file may be placed there, however the path is spelled (absolute, relative
    to the cwd, through a symlinked directory, below directories that do not
    exist yet, with `..`)."""
    work, host = ws
    (tmp_path / "link").symlink_to(work)
    extra = tmp_path / "extra"
    extra.mkdir()
    base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    prof = host / "extra-rw.toml"
    prof.write_text(base.replace('read_write = ["{workspace}"]', f'read_write = ["{{workspace}}", "{extra}"]'))
    assert prof.read_text() != base
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    spellings = [
        ([], str(work / "x.out"), None, "the workspace"),
        ([], "x.out", work, "the workspace"),
        ([], str(tmp_path / "link" / "x.out"), None, "the workspace"),
        ([], str(tmp_path / "link" / "new" / "deeper" / "x.out"), None, "the workspace"),
        ([], str(work / ".." / work.name / "y.out"), None, "the workspace"),
        (["-p", str(prof)], str(extra / "x.out"), None, f"the read-write tree {extra}"),
    ]
    for flag, what in [("--audit-log", "the audit log"), ("--record", "the recording")]:
        for pre, path, cwd, where in spellings:
            args = [BIN, "serve", "-w", str(work), *pre, flag, path]
            if flag == "--record":
                args += ["--audit-log", str(host / "a.jsonl")]
            p = subprocess.run(args, env=e, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
            assert p.returncode == 2 and f"{what} " in p.stderr and f"inside {where}," in p.stderr, (flag, path, p.stderr)
    # Nothing was created in either tree, and nothing started.
    assert sorted(x.name for x in work.iterdir()) == [] and list(extra.iterdir()) == [], list(work.iterdir())
    assert not any(serve_pids(work))
    # `..` below a directory that does not exist cannot be resolved: refused.
    p = subprocess.run([BIN, "serve", "-w", str(work), "--audit-log", str(tmp_path / "nope" / ".." / "link" / "b.jsonl")],
                       env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "cannot be resolved" in p.stderr, p.stderr
    # Control: the same flags outside the agent's trees start (and stop at the
    # missing initialize request, since no client speaks), even below a new
    # directory.
    p = subprocess.run([BIN, "serve", "-w", str(work), "-p", str(prof), "--audit-log", str(host / "new" / "a.jsonl"), "--record", str(host / "r.cast")],
                       env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    assert "inside" not in p.stderr and (host / "new" / "a.jsonl").exists() and (host / "r.cast").exists(), p.stderr


async def test_reconfiguration_is_refused(ws, tmp_path):
    canary = tmp_path / "canary"
    async with connect(ws, *ALL) as c:
        await call(c, "create_session", {"session_name": "s"})
        for opt, val in [("default-shell", "/bin/sh"), ("default-command", "sh"), ("status-left", f"#(touch {canary})"), ("allow-passthrough", "on"), ("set-clipboard", "on"), ("update-environment", "SSH_AUTH_SOCK"), ("command-alias", "x=run-shell")]:
            err = await call(c, "set_option", {"option": opt, "value": val, "global_": True}, ok=False)
            assert "refused" in err, (opt, err)
        err = await call(c, "set_option", {"option": "history-limit", "value": "#(id)"}, ok=False)
        assert "not allowed" in err
        for fmt in [f"#(touch {canary})", "#{E:HOME}", "#{T:status-left}", "#{?pane_dead,a,b}", "#{s/a/b/:pane_id}"]:
            err = await call(c, "display_message", {"format_string": fmt}, ok=False)
            assert "refused" in err, (fmt, err)
        for name in ["LD_PRELOAD", "TMUX", "TMUX_PANE", "SANDMUX_TOOLSETS", "GLIBC_TUNABLES", "DBUS_SESSION_BUS_ADDRESS"]:
            err = await call(c, "set_environment", {"name": name, "value": "x"}, ok=False)
            assert "refused" in err, (name, err)
            err = await call(c, "create_window", {"session_name": "s", "environment": {name: "x"}}, ok=False)
            assert "refused" in err
        # Names and titles are stored as text: #(...) never runs in the server.
        s = await call(c, "create_session", {"session_name": f"n#(touch {canary})", "window_name": f"w#(touch {canary})#{{pid}}"})
        await call(c, "rename_window", {"window_id": s["window_id"], "new_name": f"r#(touch {canary})"})
        await call(c, "set_pane_title", {"pane_id": s["pane_id"], "title": f"t#(touch {canary})"})
        info = await call(c, "get_pane_info", {"pane_id": s["pane_id"]})
        assert info["session_name"] == f"n#(touch {canary})"
        assert info["window_name"] == f"r#(touch {canary})"
        assert info["title"] == f"t#(touch {canary})"
        hooks = await call(c, "show_hooks", {"global_": True})
        assert not any("[" in h for h in hooks["hooks"])
        assert (await call(c, "get_server_info"))["drift"] == "none"
    time.sleep(0.3)
    assert not canary.exists(), "a #( job ran"


async def test_drift_stops_further_calls(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        sock = runtime_dir_of(pid) / "sock" / "tmux.sock"
        # Positive control: the host-side socket works for the harness.
        assert tmux_host(sock, "set-hook", "-g", "after-new-window", "display-message x").returncode == 0
        err = await call(c, "list_sessions", ok=False)
        assert "drift" in err and "show-hooks" in err, err
        err = await call(c, "get_server_info", ok=False)
        assert "drift" in err
    recs = audit_records(ws)
    assert recs[-1]["outcome"] == "refused" and recs[-1]["error_type"] == "drift"


# Every setting the drift check watches, changed from the host side the way an
# operator's tmux client could; the refusal must name it. A typo in a probe (a
# format that looks up no option reads as empty for ever) makes its case fail.
# The very next call is refused, even a read and even for a setting local to
# one session, window or pane: tmux's message log shows the host client's
# command, so the full scan runs before the call.
DRIFTS = [
    ("global", ["set-hook", "-g", "after-new-window", "display-message x"], "show-hooks -g"),
    ("global", ["set-hook", "-gw", "pane-exited", "display-message x"], "show-hooks -gw"),
    ("global", ["set-option", "-s", "command-alias[99]", "zz=display-message x"], "command-alias"),
    ("global", ["set-option", "-g", "update-environment[0]", "FOO"], "update-environment"),
    ("global", ["set-option", "-g", "default-shell", "/bin/sh"], "default-shell"),
    ("global", ["set-option", "-g", "default-command", "id"], "default-command"),
    ("global", ["set-option", "-g", "status", "on"], "status"),
    ("global", ["set-option", "-g", "lock-command", "id"], "lock-command"),
    ("global", ["set-option", "-g", "lock-after-time", "5"], "lock-after-time"),
    ("global", ["set-option", "-gw", "allow-passthrough", "on"], "allow-passthrough"),
    ("global", ["set-option", "-s", "set-clipboard", "on"], "set-clipboard"),
    ("global", ["set-option", "-s", "message-limit", "100000"], "message-limit"),
    ("global", ["set-option", "-s", "copy-command", "id"], "copy-command"),
    ("global", ["set-option", "-s", "editor", "id"], "editor"),
    ("global", ["set-option", "-gw", "automatic-rename-format", "#(id)"], "automatic-rename-format"),
    ("global", ["set-option", "-g", "set-titles-string", "#(id)"], "set-titles-string"),
    ("global", ["set-option", "-gw", "pane-border-format", "#(id)"], "pane-border-format"),
    ("global", ["bind-key", "-T", "copy-mode", "j", "set-option -g lock-after-time 5"], "list-keys -T copy-mode"),
    ("global", ["bind-key", "-T", "copy-mode-vi", "j", "run-shell id"], "list-keys -T copy-mode-vi"),
    ("local", ["set-hook", "-p", "-t", "main:", "pane-focus-in", "display-message x"], "pane-focus-in"),
    ("local", ["set-hook", "-w", "-t", "main:", "window-renamed", "display-message x"], "window-renamed"),
    ("local", ["set-hook", "-t", "main", "session-renamed", "display-message x"], "session-renamed"),
    ("local", ["set-option", "-t", "main", "default-shell", "/bin/sh"], "default-shell"),
    ("local", ["set-option", "-p", "-t", "main:", "allow-passthrough", "on"], "allow-passthrough"),
    ("local", ["set-option", "-t", "main", "update-environment[3]", "FOO"], "update-environment"),
    ("local", ["set-option", "-w", "-t", "main:", "automatic-rename-format", "#(id)"], "automatic-rename-format"),
]


@pytest.mark.parametrize("scope,change,named", DRIFTS, ids=[f"{d[0]}:{d[2]}:{d[1][-2]}" for d in DRIFTS])
async def test_drift_names_each_watched_setting(ws, scope, change, named):
    async with connect(ws) as c:
        assert (await call(c, "get_server_info"))["drift"] == "none"
        await call(c, "list_panes")
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        await call(c, "list_panes")
        r = tmux_host(sock, *change)
        assert r.returncode == 0, r.stderr
        r = await c.call_tool("list_panes", {})
        assert r.is_error, f"{scope} {change} went unnoticed"
        err = r.content[0].text
        assert "drift" in err and named in err, err


# The fast path trusts the message log only back to its previous mark, and the
# log keeps eight entries: a host client that changes a local setting and then
# pushes its command out of the log with more commands, or empties the log
# first, is still caught before the next call. (Positive control: each host
# command succeeded, so the change is in force.)
HIDDEN = [
    ("flood", [["set-hook", "-p", "-t", "main:", "pane-focus-in", "display-message x"]] + [["display-message", "-p", "x"]] * 20, "pane-focus-in"),
    ("emptied", [["set-option", "-s", "message-limit", "0"], ["set-hook", "-p", "-t", "main:", "pane-focus-in", "display-message x"]], "message-limit"),
]


@pytest.mark.parametrize("how,changes,named", HIDDEN, ids=[h[0] for h in HIDDEN])
async def test_drift_hidden_from_the_message_log_is_caught(ws, how, changes, named):
    async with connect(ws) as c:
        for _ in range(3):
            await call(c, "list_panes")
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        for change in changes:
            r = tmux_host(sock, *change)
            assert r.returncode == 0, (change, r.stderr)
        err = await call(c, "capture_pane", ok=False)
        assert "drift" in err and named in err, err


async def test_local_drift_is_caught_while_the_agent_only_reads(ws):
    async with connect(ws) as c:
        await call(c, "list_panes")
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        assert tmux_host(sock, "set-hook", "-p", "-t", "main:", "pane-focus-in", "display-message x").returncode == 0
        # Only reads from here on: the idle scan (every 2 s) must catch it.
        err = None
        deadline = time.monotonic() + 15
        while err is None and time.monotonic() < deadline:
            await anyio.sleep(0.5)
            r = await c.call_tool("capture_pane", {})
            if r.is_error:
                err = r.content[0].text
        assert err is not None, "a local hook went unnoticed for 15 s"
        assert "drift" in err and "pane-focus-in" in err, err


async def test_a_drifted_hook_never_runs_on_the_agents_read(ws):
    """A hook another client set on a read command (`after-list-panes`)
    must not run on the agent's read: the call is refused before tmux
    sees the read. (A read sent beside the drift mark, to save its round
    trip, would run it once before the refusal.)"""
    async with connect(ws) as c:
        await call(c, "list_panes")
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        hook = "set-option -g @sandmux_hook_ran yes"
        assert tmux_host(sock, "set-hook", "-g", "after-list-panes", hook).returncode == 0
        err = await call(c, "list_panes", ok=False)
        assert "drift" in err and "after-list-panes" in err, err
        ran = tmux_host(sock, "show-options", "-gqv", "@sandmux_hook_ran")
        assert ran.stdout.strip() == "", "the drifted hook ran on the agent's read"
        # Positive control: the hook runs on a list-panes.
        assert tmux_host(sock, "list-panes").returncode == 0
        ran = tmux_host(sock, "show-options", "-gqv", "@sandmux_hook_ran")
        assert ran.stdout.strip() == "yes", ran


async def test_audit_log_chain_and_tamper_detection(ws):
    secret = "hunter2-very-secret"
    async with connect(ws) as c:
        await call(c, "create_session")
        await call(c, "send_keys", {"text": f"echo {secret}", "enter": False})
        await call(c, "run_command", {"command": f"true {secret}"})
        await call(c, "get_pane_info", {"pane_id": "%99"}, ok=False)
    log = ws[1] / "audit.jsonl"
    text = log.read_text()
    assert secret not in text
    recs = [json.loads(l) for l in text.splitlines()]
    send = next(r for r in recs if r["tool"] == "send_keys")
    assert set(send["args"]["text"]) == {"len", "sha256"} and send["args"]["text"]["len"] == len(f"echo {secret}")
    assert {r["outcome"] for r in recs} >= {"ok", "error"}
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    # Request ids as the client sent them, never a Rust spelling (issue 10).
    ids = [r["request_id"] for r in recs if r["tool"] == "send_keys"]
    assert ids and all(i.isdigit() for i in ids), ids
    ok = subprocess.run([BIN, "audit", "verify", str(log)], capture_output=True, text=True)
    assert ok.returncode == 0 and "chain intact" in ok.stdout
    lines = text.splitlines()
    for tampered in [text.replace('"ok"', '"error"', 1), "\n".join(lines[:1] + lines[2:]) + "\n", "\n".join([lines[1], lines[0]] + lines[2:]) + "\n"]:
        log.write_text(tampered)
        bad = subprocess.run([BIN, "audit", "verify", str(log)], capture_output=True, text=True)
        assert bad.returncode == 1 and "line" in bad.stderr, bad.stderr


@pytest.mark.parametrize("mode,version", [("legacy", "2025-11-25"), ("auto", "2026-07-28")])
async def test_protocol_versions(ws, mode, version):
    async with connect(ws, mode=mode) as c:
        assert c.protocol_version == version
        await call(c, "create_session")
        r = await call(c, "run_command", {"command": "echo v"})
        assert r["output"] == "v"


def test_malformed_json_rpc_gets_errors_not_crashes(ws):
    work, host = ws
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    p = subprocess.Popen([BIN, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(obj):
        p.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n")
        p.stdin.flush()

    def recv():
        return json.loads(p.stdout.readline())

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    assert recv()["result"]["serverInfo"]["name"] == "sandmux"
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send("{not json")
    send("\xff\xfe garbage")
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 5}})
    r = recv()
    assert r["id"] == 2 and r["error"]["code"] == -32602
    send({"jsonrpc": "2.0", "id": 3, "method": "no/such/method", "params": {}})
    r = recv()
    assert r["id"] == 3 and r["error"]["code"] == -32601
    send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "list_panes", "arguments": {"filters": 12}}})
    r = recv()
    assert r["id"] == 4 and r["result"]["isError"] is True
    send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "list_sessions", "arguments": {"filters": "x" * 2_000_000}}})
    r = recv()
    assert r["id"] == 5 and r["result"]["isError"] is True
    send({"jsonrpc": "2.0", "id": 6, "method": "tools/list"})
    r = recv()
    assert r["id"] == 6 and len(r["result"]["tools"]) > 10
    p.stdin.close()
    assert p.wait(timeout=15) == 0


async def test_resources_and_prompts(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "res"})
        await call(c, "run_command", {"pane_id": s["pane_id"], "command": "echo resource-text"})
        uris = {str(r.uri) for r in (await c.list_resources()).resources}
        assert {"sandmux://status", "sandmux://journal", "tmux://sessions"} <= uris
        templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
        assert "tmux://panes/{pane_id}/content" in templates
        status = json.loads((await c.read_resource("sandmux://status")).contents[0].text)
        assert status["profile"] == "default" and any(l["layer"] == "landlock" and l["enforced"] for l in status["layers"])
        content = (await c.read_resource(f"tmux://panes/{s['pane_id']}/content")).contents[0].text
        assert "resource-text" in content
        sess = json.loads((await c.read_resource("tmux://sessions/res")).contents[0].text)
        assert sess["session_name"] == "res"
        journal = json.loads((await c.read_resource("sandmux://journal")).contents[0].text)
        assert any(r["tool"] == "run_command" for r in journal["records"])
        with pytest.raises(MCPError):
            await c.read_resource("tmux://panes/%999/content")
        prompts = {p.name for p in (await c.list_prompts()).prompts}
        assert prompts == {"run_and_wait", "diagnose_failing_pane", "build_dev_workspace", "interrupt_gracefully"}
        msg = await c.get_prompt("run_and_wait", {"command": "make", "pane_id": "%1", "timeout": "999"})
        assert "timeout=300" in msg.messages[0].content.text
        msg = await c.get_prompt("interrupt_gracefully", {"pane_id": "%1"})
        assert '["C-c"]' in msg.messages[0].content.text
    assert any(r["tool"].startswith("resource:") for r in audit_records(ws))


async def test_client_disconnect_tears_everything_down(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        await call(c, "send_keys", {"text": "(setsid sleep 300 &); nohup sleep 301 >/dev/null 2>&1 &"})
        await call(c, "run_command", {"command": "true"})
        pid = serve_pids(ws[0])[0]
        rundir = runtime_dir_of(pid)
        procs = descendants(pid)
        assert len(procs) >= 5
    t0 = time.monotonic()
    while (any(alive(p) for p in procs + [pid]) or rundir.exists()) and time.monotonic() - t0 < 5:
        await anyio.sleep(0.05)
    assert not any(alive(p) for p in procs), "processes outlived the client"
    assert not rundir.exists()
    assert time.monotonic() - t0 < 3


async def test_kill_server_ends_the_instance(ws):
    async with connect(ws, *ALL) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        r = await call(c, "kill_server")
        assert "ending" in r["done"]
    t0 = time.monotonic()
    while alive(pid) and time.monotonic() - t0 < 5:
        await anyio.sleep(0.05)
    assert not alive(pid)


async def test_killing_the_last_session_says_so_and_keeps_the_instance(ws):
    """The agent's last session can go; sandmux's own control session cannot,
    so the instance stays up, says so, and takes a new session."""
    async with connect(ws, *ALL) as c:
        pid = serve_pids(ws[0])[0]
        extra = await call(c, "create_session", {"session_name": "extra"})
        r = await call(c, "kill_session", {"session_id": extra["session_id"]})
        assert "last session" not in r["done"], r
        main = [s for s in (await call(c, "list_sessions"))["sessions"] if s["session_name"] == "main"]
        assert len(main) == 1, main
        r = await call(c, "kill_session", {"session_id": main[0]["session_id"]})
        assert "that was the last session" in r["done"] and "create_session" in r["done"], r
        assert (await call(c, "list_sessions"))["sessions"] == [] and alive(pid)
        s = await call(c, "create_session", {"session_name": "again"})
        assert (await call(c, "run_command", {"pane_id": s["pane_id"], "command": "echo back"}))["output"] == "back"
        r = await call(c, "kill_pane", {"pane_id": s["pane_id"]})
        assert "that was the last session" in r["done"], r
        assert alive(pid)


async def test_forged_control_mode_framing_is_harmless(ws):
    """T7: a pane prints lines that look like control-mode guards and
    notifications for many plausible command numbers, then the agent captures
    that pane. The capture either succeeds or fails cleanly; nothing forged is
    believed, and the server keeps answering."""
    async with connect(ws) as c:
        s = await call(c, "create_session", {"x": 200, "y": 50})
        p = s["pane_id"]
        script = (
            "python3 -c \"import time\n"
            "t=int(time.time())\n"
            "for n in range(0, 1500):\n"
            "  for d in (0,1):\n"
            "    print('%%end %d %d 1' % (t+d, n))\n"
            "print('%output %1 SANDMUX_Eforged:0')\n"
            "print('%exit')\n\""
        )
        await call(c, "run_command", {"pane_id": p, "command": script, "timeout": 20})
        forged = 0
        for _ in range(3):
            r = await c.call_tool("capture_pane", {"pane_id": p, "start": -3100, "max_lines": 20})
            if r.is_error:
                assert "forge" in r.content[0].text, r.content[0].text
                forged += 1
        # The guesses cover the command numbers in use, so the forgery was attempted and caught.
        assert forged >= 1
        out = await call(c, "run_command", {"pane_id": p, "command": "echo still-in-sync"})
        assert out["output"] == "still-in-sync" and out["exit_status"] == 0
        assert (await call(c, "get_server_info"))["alive"]


async def test_tool_environment_reaches_panes(ws):
    async with connect(ws, *ALL) as c:
        s = await call(c, "create_session", {"session_name": "env", "environment": {"FOO_FROM_TOOL": "bar baz"}})
        r = await call(c, "run_command", {"pane_id": s["pane_id"], "command": "echo \"[$FOO_FROM_TOOL]\"; env | grep -c -E '^(TMUX|SANDMUX|LD_)'"})
        assert r["output"].splitlines() == ["[bar baz]", "0"], r
        await call(c, "set_environment", {"name": "LATER_VAR", "value": "later", "session_name": "env"})
        w = await call(c, "create_window", {"session_name": "env"})
        r = await call(c, "run_command", {"pane_id": w["pane_id"], "command": "echo \"[$LATER_VAR]\""})
        assert r["output"] == "[later]"
        # The interactive shell has the profile's PATH, not /etc/profile's
        # (a login shell would read it and replace PATH, dropping the sbin dirs).
        prof = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
        path = re.search(r'PATH = "([^"]+)"', prof).group(1)
        r = await call(c, "run_command", {"pane_id": w["pane_id"], "command": "echo \"[$PATH]\"; shopt -q login_shell; echo login=$?"})
        assert r["output"].splitlines() == [f"[{path}]", "login=1"], (r, path)


async def test_malformed_tool_call_is_audited(ws):
    work, host = ws
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    p = subprocess.Popen([BIN, "serve", "-w", str(work), "--audit-log", str(host / "audit.jsonl")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": 7, "arguments": "secret-args-value"}},
    ]
    for l in lines:
        p.stdin.write(json.dumps(l).encode() + b"\n")
        p.stdin.flush()
        if "id" in l:
            json.loads(p.stdout.readline())
    p.stdin.close()
    p.wait(timeout=15)
    recs = audit_records(ws)
    bad = [r for r in recs if r["outcome"] == "malformed"]
    assert bad and "secret-args-value" not in json.dumps(recs)


def test_stdio_over_a_socket_pair(ws):
    """Clients built on libuv (Node) give the server a socket pair, not pipes,
    as stdin/stdout; both kinds are served, and EOF ends the instance."""
    import socket

    work, host = ws
    a, b = socket.socketpair()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    p = subprocess.Popen([BIN, "serve", "-w", str(work), "--audit-log", str(host / "audit.jsonl")], stdin=b.fileno(), stdout=b.fileno(), env=env)
    b.close()
    f = a.makefile("rwb")

    def send(m):
        f.write((json.dumps(m) + "\n").encode())
        f.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert json.loads(f.readline())["id"] == 1
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_sessions", "arguments": {}}})
    r = json.loads(f.readline())
    assert r["id"] == 2 and not r["result"].get("isError"), r
    a.shutdown(socket.SHUT_WR)
    assert p.wait(timeout=10) == 0
    f.close()
    a.close()


async def test_the_control_pane_is_never_a_target(ws):
    """Typing and capture by pane id ask tmux nothing first: the control
    session's pane must still be refused, however its number is spelled
    (tmux reads %00 as %0)."""
    async with connect(ws) as c:
        mine = (await call(c, "list_panes"))["panes"][0]["pane_id"]
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        r = tmux_host(sock, "list-panes", "-t", "_sandmux", "-F", "#{pane_id}")
        assert r.returncode == 0, r.stderr
        ctl = r.stdout.strip()
        num = ctl[1:]
        # Positive control: the same calls work on the agent's own pane.
        await call(c, "send_keys", {"pane_id": mine, "text": "x", "enter": False})
        await call(c, "capture_pane", {"pane_id": mine})
        for pid in [ctl, f"%0{num}", f"%00{num}"]:
            for tool, args in [
                ("capture_pane", {"pane_id": pid}),
                ("send_keys", {"pane_id": pid, "text": "x"}),
                ("send_keys", {"pane_id": pid, "keys": ["Enter"]}),
            ]:
                err = await call(c, tool, args, ok=False)
                assert "not found" in err.lower() or "list_panes" in err, (tool, pid, err)
            r = await call(c, "send_keys_batch", {"operations": [{"pane_id": pid, "text": "x"}]})
            assert not r["results"][0]["success"], (pid, r)
        # A pane that does not exist is "not found", not a tmux error.
        err = await call(c, "send_keys", {"pane_id": "%999", "text": "x"}, ok=False)
        assert "list_panes" in err, err
