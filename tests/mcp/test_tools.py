"""Every tool, through the official MCP Python SDK, against the real binary.
Structured results are validated against the output schema each tool
publishes in tools/list."""

import json
import time
import subprocess

import anyio
import jsonschema
import pytest

from conftest import BIN, audit_records, call, connect

pytestmark = pytest.mark.anyio

ALL = ["--toolsets", "inspect,manage,execute,teardown"]


async def test_every_tool_once_with_schema_checked_results(ws):
    async with connect(ws, *ALL) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert len(tools) == 55
        called = set()

        async def run(name, args=None, ok=True):
            called.add(name)
            r = await c.call_tool(name, args or {})
            if ok:
                assert not r.is_error, f"{name}: {r.content[0].text}"
                if tools[name].output_schema is not None:
                    jsonschema.validate(r.structured_content, tools[name].output_schema)
                else:  # a Done: one sentence
                    assert set(r.structured_content) == {"done"}, r.structured_content
                assert_no_nulls(r.structured_content, name)
                return r.structured_content
            assert r.is_error, f"{name} should fail: {r.structured_content}"
            return r.content[0].text

        s = await run("create_session", {"session_name": "work", "window_name": "work"})
        pane = s["pane_id"]
        w2 = await run("create_window", {"session_name": "work", "window_name": "two"})
        sp = await run("split_window", {"pane_id": pane, "direction": "right"})
        await run("list_sessions")
        await run("get_session_info", {"session_name": "work"})
        await run("list_windows", {"session_name": "work"})
        await run("get_window_info", {"window_id": w2["window_id"]})
        panes = await run("list_panes", {"filters": {"session_name": "work"}})
        assert all(p["is_caller"] is False for p in panes["panes"])
        await run("get_pane_info", {"pane_id": pane})
        await run("find_pane_by_position", {"corner": "top-right", "window_id": s["window_id"]})
        info = await run("get_server_info")
        assert info["drift"] == "none" and info["version"].startswith("tmux")
        r = await run("run_command", {"pane_id": pane, "command": "echo hello-$((40+2))"})
        assert r["status"] == "completed" and r["exit_status"] == 0 and r["output"] == "hello-42"
        long = await run("run_command", {"pane_id": pane, "command": "sleep 1; echo late-$((6*7))", "timeout": 0.2})
        assert long["status"] == "timeout" and long["command_id"], long
        got = await run("wait_for_command", {"command_id": long["command_id"], "timeout": 10})
        assert got["status"] == "completed" and got["exit_status"] == 0 and got["output"] == "late-42", got
        cap = await run("capture_pane", {"pane_id": pane})
        assert "hello-42" in cap["text"]
        first = await run("capture_since", {"pane_id": pane})
        sent = await run("send_keys", {"pane_id": pane, "text": "echo since-marker"})
        await run("wait_for_text", {"cursor": sent["cursor"], "patterns": ["^since-marker"], "regex": True})
        later = await run("capture_since", {"pane_id": pane, "cursor": first["cursor"]})
        assert "since-marker" in later["text"] and not later["full_screen"]
        await run("snapshot_pane", {"pane_id": pane})
        found = await run("search_panes", {"pattern": "hello-42"})
        assert found["total_panes_matched"] >= 1
        d = await run("display_message", {"pane_id": pane, "format_string": "cmd=#{pane_current_command} ##"})
        assert d["text"] == "cmd=bash #"
        await run("wait_for_stable", {"pane_id": pane, "quiet_ms": 100})
        await run("wait_for_gone", {"pane_id": pane, "patterns": ["no-such-text-anywhere"]})
        assert (await run("show_option", {"option": "history-limit", "global_": True}))["value"] == "10000"
        await run("show_environment")
        assert (await run("show_hooks", {"global_": True}))["hooks"]
        await run("show_hook", {"hook_name": "after-new-window", "global_": True})
        b = await run("load_buffer", {"content": "line one\nline two", "logical_name": "notes"})
        shown = await run("show_buffer", {"buffer_name": b["buffer_name"]})
        assert "line two" in shown["text"]
        await run("paste_buffer", {"buffer_name": b["buffer_name"], "pane_id": sp["pane_id"], "bracket": True})
        await run("delete_buffer", {"buffer_name": b["buffer_name"]})
        await run("paste_text", {"text": "echo pasted\n", "pane_id": sp["pane_id"]})
        batch = await run("call_read_tools_batch", {"operations": [{"tool": "list_sessions"}, {"tool": "get_pane_info", "arguments": {"pane_id": pane}}]})
        assert all(x["ok"] for x in batch["results"])
        await run("send_keys_batch", {"operations": [{"pane_id": pane, "keys": ["C-l"]}, {"pane_id": pane, "text": "true"}]})
        rep = await run("export_replay", {"pane_id": pane})
        assert rep["mode"] == "snapshot" and rep["cast"].startswith('{"')
        st = await run("sandbox_status")
        assert {l["layer"] for l in st["layers"] if l["enforced"]} >= {"userns", "mount", "landlock", "seccomp", "caps", "no-new-privs"}
        await run("rename_session", {"session_name": "work", "new_name": "renamed"})
        await run("rename_window", {"window_id": w2["window_id"], "new_name": "two-b"})
        await run("select_window", {"window_id": w2["window_id"], "session_name": "renamed"})
        await run("select_layout", {"window_id": s["window_id"], "layout": "tiled"})
        await run("resize_window", {"window_id": s["window_id"], "width": 120, "height": 40})
        await run("move_window", {"window_id": w2["window_id"], "destination_index": "7"})
        await run("select_pane", {"pane_id": sp["pane_id"]})
        await run("swap_pane", {"source_pane_id": pane, "target_pane_id": sp["pane_id"]})
        await run("resize_pane", {"pane_id": pane, "zoom": True})
        await run("set_pane_title", {"pane_id": pane, "title": "my #(title)"})
        t = await run("get_pane_info", {"pane_id": pane})
        assert t["title"] == "my #(title)"
        await run("enter_copy_mode", {"pane_id": pane, "scroll_up": 2})
        await run("exit_copy_mode", {"pane_id": pane})
        await run("set_option", {"option": "remain-on-exit", "value": "on", "scope": "window", "target": s["window_id"]})
        await run("set_environment", {"name": "MY_VAR", "value": "x y", "session_name": "renamed"})
        await run("respawn_pane", {"pane_id": sp["pane_id"], "shell": "echo respawned; sleep 5"})
        await run("wait_for_text", {"pane_id": sp["pane_id"], "patterns": ["respawned"], "timeout": 5})
        await run("clear_pane", {"pane_id": pane})
        await run("kill_pane", {"pane_id": sp["pane_id"]})
        await run("kill_window", {"window_id": w2["window_id"]})
        await run("kill_session", {"session_name": "renamed"})
        await run("kill_server")
        assert called == set(tools), f"not called: {set(tools) - called}"
    recs = audit_records(ws)
    assert {r["tool"] for r in recs} >= set(tools)
    assert subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True).returncode == 0


def assert_no_nulls(v, where):
    """A field without a value is left out, never null (issue 10)."""
    if isinstance(v, dict):
        for k, x in v.items():
            assert x is not None, f"{where}: {k} is null"
            assert_no_nulls(x, f"{where}.{k}")
    elif isinstance(v, list):
        for x in v:
            assert_no_nulls(x, where)


def hints(t):
    """A tool's hints as the spec reads them: an absent hint has its default
    (readOnly false, destructive true, idempotent false, openWorld true), and
    destructive and idempotent mean nothing for a read-only tool."""
    a = t.annotations
    ro = bool(a.read_only_hint)
    d = None if ro else (True if a.destructive_hint is None else a.destructive_hint)
    i = None if ro else bool(a.idempotent_hint)
    return ro, d, i, True if a.open_world_hint is None else a.open_world_hint


async def test_annotations_are_precise(ws):
    async with connect(ws, *ALL) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    for name in ["list_panes", "capture_pane", "wait_for_text", "sandbox_status", "search_panes", "wait_for_command"]:
        assert hints(tools[name])[0] is True, name
    for name in ["kill_session", "kill_pane", "send_keys", "run_command"]:
        assert hints(tools[name])[:2] == (False, True), name
    assert hints(tools["create_session"])[1] is False
    assert hints(tools["capture_pane"])[3] is True
    assert hints(tools["list_panes"])[3] is False
    # Hints that mean nothing are not sent (the default surface's budget).
    assert tools["list_panes"].annotations.idempotent_hint is None
    assert tools["list_panes"].annotations.destructive_hint is None
    assert hints(tools["rename_window"])[1:3] == (True, True)
    assert hints(tools["create_session"])[2] is False


async def test_run_command_statuses_quoting_and_truncation(ws):
    async with connect(ws) as c:
        await call(c, "create_session", {"session_name": "s"})
        r = await call(c, "run_command", {"command": "false"})
        assert r["exit_status"] == 1
        r = await call(c, "run_command", {"command": "sh -c 'exit 7'"})
        assert r["exit_status"] == 7
        # An unbalanced quote is a syntax error, not a hung prompt that swallows the marker.
        r = await call(c, "run_command", {"command": "echo 'unbalanced", "timeout": 10})
        assert r["status"] == "completed" and r["exit_status"] != 0, r
        r = await call(c, "run_command", {"command": "echo still-alive"})
        assert r["output"] == "still-alive"
        r = await call(c, "run_command", {"command": "seq 1 2000", "max_lines": 10})
        # Head and tail, and the command's own counts (issue 26).
        head, marker, tail = r["output"].split("\n")[:5], r["output"].split("\n")[5], r["output"].split("\n")[6:]
        assert r["truncated"] and head == ["1", "2", "3", "4", "5"] and tail == [str(i) for i in range(1996, 2001)], r
        assert marker == "…[1990 lines, 8858 bytes not shown]…", marker
        assert r["truncated_lines"] == 1990 and r["lines"] == 2000 and r["bytes"] == 8893, r
        r = await call(c, "run_command", {"command": "printf 'a\\nb\\n'; echo $'\\e[31mred\\e[0m'"})
        assert r["output"] == "a\nb\nred", repr(r["output"])
        r = await call(c, "run_command", {"command": "sleep 5", "timeout": 0.5})
        assert r["status"] == "timeout" and "exit_status" not in r, r
        # The sleep still runs: the pane is busy until it is interrupted.
        await call(c, "run_command", {"command": "true"}, ok=False)
        await call(c, "send_keys", {"keys": ["C-c"]})
        await call(c, "wait_for_stable", {"timeout": 5})
        r = await call(c, "run_command", {"command": "sleep 5", "timeout": 0.5, "interrupt_on_timeout": True})
        assert r["status"] == "interrupted"
        r = await call(c, "run_command", {"command": "echo after-interrupt"})
        assert r["output"] == "after-interrupt"
        assert r["timeout"] == 30 and "note" not in r, r
        # A timeout above the profile's ceiling is not cut silently.
        r = await call(c, "run_command", {"command": "true", "timeout": 1000})
        assert r["timeout"] == 300 and "wait_max_seconds" in r["note"], r
        # Up to it, a long wait is one call (issue 26: a 10-minute build
        # cost ~21 calls at the old 30 s ceiling).
        r = await call(c, "run_command", {"command": "sleep 32; echo long", "timeout": 60})
        assert r["status"] == "completed" and r["output"] == "long", r


async def test_run_command_completes_after_output_larger_than_the_buffer(ws):
    """Regression (issue 10): output past the pane's output ring used to lose
    the begin marker, and the call waited its whole timeout."""
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "seq 1 300000; echo tail-here", "timeout": 25, "max_lines": 5})
        assert r["status"] == "completed" and r["exit_status"] == 0, {k: v for k, v in r.items() if k != "output"}
        assert r["truncated"] and r["output"].splitlines()[-1] == "tail-here", r["output"][-200:]
        r = await call(c, "run_command", {"command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; exit_code_check() { return 4; }; exit_code_check", "timeout": 25, "max_lines": 2})
        assert r["status"] == "completed" and r["exit_status"] == 4, {k: v for k, v in r.items() if k != "output"}
        assert (await call(c, "run_command", {"command": "echo next"}))["output"] == "next"


async def test_run_command_reports_a_shell_that_exited(ws):
    """Regression (issue 10): `exit` or `set -e` ending the pane's shell used
    to be reported as a timeout about a pane that no longer existed."""
    async with connect(ws) as c:
        for cmd, want, status in [("echo bye; exit 3", "bye", 3), ("set -e; echo before; false; echo never", "before", 1)]:
            sp = await call(c, "split_window", {})
            r = await call(c, "run_command", {"pane_id": sp["pane_id"], "command": cmd, "timeout": 30})
            # Issue 46: the status the shell ended with (it came back null).
            assert r["status"] == "pane_exited" and r["exit_status"] == status, r
            # What the shell wrote just before it exited may never reach a
            # control client (docs/mcp.md): what does arrive is right.
            assert "never" not in r["output"] and (want in r["output"] or not r["output"]), r
            assert r["elapsed"] < 30, r
        # The instance and its first pane are fine.
        assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"


async def test_run_command_refuses_a_pane_that_is_not_at_its_prompt(ws):
    """Regression (issue 10): keystrokes used to be typed into a REPL or
    queue behind a running job."""
    async with connect(ws) as c:
        sp = await call(c, "split_window", {})
        pane = sp["pane_id"]
        k = await call(c, "send_keys", {"pane_id": pane, "text": "python3 -q", "enter": True})
        w = await call(c, "wait_for_text", {"pane_id": pane, "patterns": [">>>"], "cursor": k["cursor"], "timeout": 10})
        assert w["outcome"] == "matched", w
        msg = await call(c, "run_command", {"pane_id": pane, "command": "echo hi"}, ok=False)
        assert "python3" in msg and "when_busy" in msg and "send_keys" in msg, msg
        # Nothing was typed into the REPL.
        cap = await call(c, "capture_pane", {"pane_id": pane})
        assert "echo hi" not in json.dumps(cap), cap
        k = await call(c, "send_keys", {"pane_id": pane, "text": "exit()", "enter": True})
        await call(c, "wait_for_stable", {"pane_id": pane, "timeout": 5})
        # Back at the prompt, run_command works again.
        r = await call(c, "run_command", {"pane_id": pane, "command": "echo back"})
        assert r["output"] == "back", r
        # A job still running in the foreground is refused the same way.
        r = await call(c, "run_command", {"pane_id": pane, "command": "sleep 30", "timeout": 0.5})
        assert r["status"] == "timeout", r
        msg = await call(c, "run_command", {"pane_id": pane, "command": "echo queued"}, ok=False)
        assert "sleep" in msg, msg
        # Asked for explicitly, the keys are typed anyway (here: queued behind the job).
        await call(c, "send_keys", {"pane_id": pane, "keys": ["C-c"]})
        await call(c, "wait_for_stable", {"pane_id": pane, "timeout": 5})
        await call(c, "run_command", {"pane_id": pane, "command": "sleep 2", "timeout": 0.3})
        r = await call(c, "run_command", {"pane_id": pane, "command": "echo typed", "when_busy": "type", "timeout": 15})
        assert r["status"] == "completed" and r["output"] == "typed", r


async def test_run_command_sends_progress(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        seen = []

        async def progress(done, total, message):
            seen.append((done, total, message))

        r = await c.call_tool("run_command", {"command": "sleep 4.5; echo done"}, progress_callback=progress)
        assert r.structured_content["output"] == "done"
        assert len(seen) >= 2, seen


async def test_waits(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session")
        p = s["pane_id"]
        sent = await call(c, "send_keys", {"pane_id": p, "text": "echo old-output"})
        await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^old-output"], "regex": True})
        # Only output written after the call began counts.
        r = await call(c, "wait_for_text", {"pane_id": p, "patterns": ["old-output"], "timeout": 0.5})
        assert r["outcome"] == "timeout"
        # The words are split with '' so the echoed command line cannot match, only
        # the output can. The stream may begin before the prompt is drawn, so the
        # output line can carry the prompt in front of it.
        await call(c, "send_keys", {"pane_id": p, "text": "(sleep 0.3; echo FA''TAL; echo never''-mind) &"})
        r = await call(c, "wait_for_text", {"pane_id": p, "patterns": ["never-mind"], "stop": ["FATAL"]})
        assert r["outcome"] == "stopped", r
        assert len(r["matched_lines"]) == 1 and r["matched_lines"][0].endswith("FATAL"), r
        await call(c, "send_keys", {"pane_id": p, "text": "sleep 0.2; echo x"})
        r = await call(c, "wait_for_text", {"pane_id": p})
        assert r["outcome"] == "any_output"
        sent = await call(c, "send_keys", {"pane_id": p, "text": "sleep 0.5; echo y"})
        r = await call(c, "wait_for_text", {"pane_id": p, "patterns": ["^y$"], "regex": True, "cursor": sent["cursor"], "timeout": 999})
        assert r["outcome"] == "matched" and r["effective_timeout"] == 300, r
        r = await call(c, "wait_for_stable", {"pane_id": p, "quiet_ms": 200})
        assert r["outcome"] == "stable"
        sent = await call(c, "send_keys", {"pane_id": p, "text": "clear; echo BUSY; sleep 0.5; clear"})
        await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^BUSY"], "regex": True})
        r = await call(c, "wait_for_gone", {"pane_id": p, "patterns": ["^BUSY"], "regex": True, "timeout": 5})
        assert r["outcome"] == "gone"


async def test_keys_and_text_are_kept_apart(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session")
        p = s["pane_id"]
        # The shell is at its prompt, and `sleep` runs, before the ^C: under
        # load, keys typed ahead of a shell still starting are read after
        # the ^C was spent (the premise below would not hold).
        await call(c, "run_command", {"pane_id": p, "command": "true"})
        await call(c, "send_keys", {"pane_id": p, "text": "sleep 30"})
        t0 = time.monotonic()
        while (await call(c, "get_pane_info", {"pane_id": p}))["current_command"] != "sleep":
            assert time.monotonic() - t0 < 10, "sleep never started"
            await anyio.sleep(0.05)
        await call(c, "send_keys", {"pane_id": p, "keys": ["C-c"]})
        # The ^C reached `sleep`; the shell is back at its prompt a moment later.
        t0 = time.monotonic()
        while True:
            r = await c.call_tool("run_command", {"pane_id": p, "command": "echo back"})
            busy = r.is_error and "not at its shell prompt" in r.content[0].text
            if not busy or time.monotonic() - t0 > 10:
                break
            await anyio.sleep(0.05)
        assert not r.is_error and r.structured_content["output"] == "back", r
        err = await call(c, "send_keys", {"pane_id": p, "keys": ["ls -la"]}, ok=False)
        assert "not a key name" in err and "text" in err
        # "C-c" as text is typed literally. The cursor send_keys returns makes the
        # wait see output that came before wait_for_text was called.
        sent = await call(c, "send_keys", {"pane_id": p, "text": "echo C-c", "enter": True})
        r = await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^C-c$"], "regex": True})
        assert r["outcome"] == "matched"
        # A bracketed paste is inserted, not run line by line: nothing runs until Enter.
        sent = await call(c, "paste_text", {"pane_id": p, "text": "echo one\necho two\n"})
        r = await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^two$"], "regex": True, "timeout": 1})
        assert r["outcome"] == "timeout", r
        await call(c, "send_keys", {"pane_id": p, "keys": ["Enter"]})
        r = await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^two$"], "regex": True})
        assert r["outcome"] == "matched"


async def test_invalid_arguments_get_tool_errors_with_hints(ws):
    async with connect(ws, *ALL) as c:
        await call(c, "create_session")
        cases = [
            ("get_pane_info", {"pane_id": "%999"}, "list_panes"),
            ("get_pane_info", {"pane_id": "3"}, "ids look like"),
            ("capture_pane", {"socket_name": "default"}, "no tool takes a socket"),
            ("capture_pane", {"bogus": 1}, "accepted arguments"),
            ("capture_pane", {"max_lines": "many"}, "invalid argument `max_lines`"),
            ("capture_pane", {"pane_id": 5}, "invalid argument `pane_id`"),
            ("send_keys", {"text": "x", "enter": "yes"}, "invalid argument `enter`"),
            ("run_command", {}, "invalid argument `command`: missing field"),
            ("run_command", {"command": ""}, "empty"),
            ("run_command", {"command": "x" * 40000}, "limit is 32768"),
            ("send_keys", {"text": "a\u0000b"}, "NUL"),
            ("wait_for_text", {"patterns": ["("], "regex": True}, "regular expression"),
            ("wait_for_text", {"timeout": -1}, "positive"),
            ("kill_session", {}, "explicit session"),
            ("search_panes", {"pattern": ""}, "empty"),
            ("create_session", {"start_directory": "/etc/../root"}, "start_directory"),
            ("list_panes", {"filters": {"nope__contains": "x"}}, "unknown field"),
            ("capture_since", {"cursor": "forged"}, "not a cursor"),
        ]
        for name, args, hint in cases:
            r = await c.call_tool(name, args)
            assert r.is_error, f"{name} {args}: {r.structured_content}"
            assert hint in r.content[0].text, f"{name}: {r.content[0].text}"
        # Still serving afterwards.
        assert (await call(c, "get_server_info"))["alive"]
    recs = audit_records(ws)
    assert sum(1 for r in recs if r["outcome"] == "malformed") >= 5
    assert not any("x" * 300 in json.dumps(r) for r in recs)


async def test_short_lived_commands_in_new_panes_are_not_reported_as_failures(ws):
    """A command that ends at once closes its pane before the reply is read:
    the call still succeeds (the ids come from tmux at creation), so an agent
    has no reason to run the command twice."""
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "quick"})
        for i in range(20):
            r = await call(c, "split_window", {"pane_id": s["pane_id"], "shell": "true"})
            assert r["pane_id"].startswith("%") and r["window_id"] == s["window_id"], r
            r = await call(c, "create_window", {"session_name": "quick", "shell": f"echo {i} > w{i}"})
            assert r["session_name"] == "quick" and r["session_id"] == s["session_id"], r
        # The shell makes the file (the redirection) before echo writes it:
        # wait for the line, not for the name (CI read one empty once).
        def written(i):
            f = ws[0] / f"w{i}"
            return f.exists() and f.read_text().endswith("\n")

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(written(i) for i in range(20)):
            await anyio.sleep(0.05)
        for i in range(20):
            assert (ws[0] / f"w{i}").read_text().strip() == str(i)


async def test_select_layout_refuses_what_would_crash_tmux(ws):
    """tmux 3.3a's server exits on `select-layout -- -x` and on some layout
    strings that carry a valid checksum: only the five names reach tmux."""
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "lay"})
        await call(c, "split_window", {"pane_id": s["pane_id"]})
        await call(c, "split_window", {"pane_id": s["pane_id"]})
        crash = "a526,200x50,0,0[200x4294967295,0,0,1,200x20,0,21,2,200x8,0,42,3]"
        for bad in ["--", "-x", "-", "tiled;kill-server", "1234", crash]:
            err = await call(c, "select_layout", {"window_id": s["window_id"], "layout": bad}, ok=False)
            assert "layout" in err, err
        for name in ["even-horizontal", "even-vertical", "main-horizontal", "main-vertical", "tiled"]:
            await call(c, "select_layout", {"window_id": s["window_id"], "layout": name})
        await call(c, "list_panes")


async def test_values_starting_with_a_dash_stay_values(ws):
    """A `--` goes only before the first positional argument: a value such as
    -O2 after a name is passed as it is."""
    async with connect(ws) as c:
        await call(c, "set_environment", {"name": "CFLAGS", "value": "-O2"})
        r = await call(c, "show_environment", {})
        assert "-O2" in json.dumps(r), r
        await call(c, "rename_session", {"session_name": "main", "new_name": "-dash"})
        assert any(s["session_name"] == "-dash" for s in (await call(c, "list_sessions"))["sessions"])


async def test_keys_are_bounded_and_a_busy_pane_names_its_command(ws):
    """Issue 26: thousands of key names overflowed tmux's parser, a bad key
    name came back whole in the error, and a pane busy with a long command
    of ours was refused without naming the command to collect."""
    async with connect(ws) as c:
        s = await call(c, "create_session")
        p = s["pane_id"]
        err = await call(c, "send_keys", {"pane_id": p, "keys": ["a"] * 10000}, ok=False)
        assert "keys" in err and "at most 512" in err and len(err) < 1000, err[:2000]
        sent = await call(c, "send_keys", {"pane_id": p, "keys": ["BSpace"] * 512})
        assert len(sent["keys"]) == 512
        err = await call(c, "send_keys", {"pane_id": p, "keys": ["x" * 100000]}, ok=False)
        assert "not a key name" in err and "keys" in err and len(err) < 2000, err[:3000]
        r = await call(c, "run_command", {"pane_id": p, "command": "sleep 30", "timeout": 0.5})
        assert r["status"] == "timeout" and r["command_id"], r
        err = await call(c, "run_command", {"pane_id": p, "command": "echo hi"}, ok=False)
        assert r["command_id"] in err and "wait_for_command" in err, err
        await call(c, "send_keys", {"pane_id": p, "keys": ["C-c"]})


async def test_the_agent_is_never_stranded_when_the_last_shell_exits(ws):
    """Issue 26: under `core` (no create_session) an `exit` in the last pane
    left the agent with no pane and no tool to make one. run_command with
    no target now makes a fresh session and says so in `note`."""
    async with connect(ws, "--toolsets", "core") as c:
        for ender in ["exit", "set -e; false"]:
            r = await call(c, "run_command", {"command": ender})
            assert r["status"] == "pane_exited", r
            assert (await call(c, "list_panes"))["panes"] == []
            r = await call(c, "run_command", {"command": "echo back"})
            assert r["status"] == "completed" and r["output"] == "back", r
            assert "fresh session" in r["note"] and "exited" in r["note"], r
        # A named target that is gone is still an error, not a new session.
        err = await call(c, "run_command", {"command": "echo x", "pane_id": "%999"}, ok=False)
        assert "%999" in err, err
    # create_session excluded by name: the human withheld new sessions.
    async with connect(ws, "--toolsets", "core", "--exclude-tools", "create_session") as c:
        await call(c, "run_command", {"command": "exit"})
        err = await call(c, "run_command", {"command": "echo back"}, ok=False)
        assert "no sessions" in err, err


async def test_a_big_output_is_bounded_and_counted_truly(ws):
    """Issue 26: `seq 1 300000` came back as 239,244 bytes with missed false,
    and a 300 KB line came back whole. Now: head and tail within the
    budget, and the command's own counts."""
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "seq 1 300000", "timeout": 60})
        assert r["status"] == "completed" and r["bytes"] == 1988895 and r["lines"] == 300000, {k: v for k, v in r.items() if k != "output"}
        out = r["output"]
        assert r["truncated"] and out.startswith("1\n2\n3\n") and out.endswith("\n299999\n300000"), out[:50]
        assert "lines," in out and "not shown]" in out and len(out.encode()) <= 32768 + 100
        r = await call(c, "run_command", {"command": "python3 -c \"print('x' * 300000)\"", "timeout": 60})
        assert r["bytes"] == 300001 and r["lines"] == 1 and r["truncated"], {k: v for k, v in r.items() if k != "output"}
        assert 16000 < len(r["output"]) <= 32768 + 100, len(r["output"])
        r = await call(c, "run_command", {"command": "seq 1 3000", "max_bytes": 1000000, "max_lines": 100000})
        assert not r["truncated"] and r["output"].split("\n") == [str(i) for i in range(1, 3001)], r["truncated"]


async def test_output_reads_like_a_terminal(ws):
    """Issue 26: progress lines came back as every state glued together,
    padding stayed, and captures showed sandmux's own wrapper line."""
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "for i in 1 2 3; do printf '\\rstep %s of 3' $i; done; echo; printf 'pad   \\n'"})
        assert r["output"] == "step 3 of 3\npad", repr(r["output"])
        cap = await call(c, "capture_pane", {})
        assert "__sandmux_run" not in cap["text"], cap["text"]
        assert "for i in 1 2 3; do printf" in cap["text"], cap["text"]
        # Issue 46: a multi-line command showed the wrapper and its quoting.
        r = await call(c, "run_command", {"command": "echo 'one'\necho two"})
        assert r["output"] == "one\ntwo", repr(r["output"])
        cap = await call(c, "capture_pane", {})
        assert "__sandmux_run" not in cap["text"] and "echo 'one'" in cap["text"], cap["text"]
