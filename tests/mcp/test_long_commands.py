"""Long commands are first-class, and the agent sees its own terminal (issue
10): a run_command that outlives its timeout keeps a command_id that
wait_for_command collects after any number of other calls, from any pane; the
markers never reach the screen, and the pane shows the command as written."""

import json

import anyio
import pytest

from conftest import call, connect

pytestmark = pytest.mark.anyio


async def test_a_long_command_is_collected_after_other_calls_and_panes(ws):
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "sleep 2; printf 'slow\\n%.0s' 1 2 3; (exit 5)", "timeout": 0.3})
        assert r["status"] == "timeout" and r["command_id"].startswith("cmd-"), r
        cid = r["command_id"]
        # Other calls in between, in another pane.
        sp = await call(c, "split_window", {})
        assert (await call(c, "run_command", {"pane_id": sp["pane_id"], "command": "echo other"}))["output"] == "other"
        again = await call(c, "wait_for_command", {"command_id": cid, "timeout": 0.2})
        assert again["status"] == "timeout" and again["command_id"] == cid, again
        seen = []

        async def progress(done, total, message):
            seen.append(done)

        got = await c.call_tool("wait_for_command", {"command_id": cid, "timeout": 20}, progress_callback=progress)
        got = got.structured_content
        assert got["status"] == "completed" and got["exit_status"] == 5, got
        assert got["output"] == "slow\nslow\nslow" and got["command_id"] == cid, got
        # Collected again later: the same answer.
        assert (await call(c, "wait_for_command", {"command_id": cid}))["exit_status"] == 5


async def test_a_long_command_whose_output_outgrows_the_ring_still_reports_its_status(ws):
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "sleep 1; seq 1 200000; echo end-here; (exit 3)", "timeout": 0.3, "max_lines": 3})
        got = await call(c, "wait_for_command", {"command_id": r["command_id"], "timeout": 30})
        assert got["status"] == "completed" and got["exit_status"] == 3, {k: v for k, v in got.items() if k != "output"}
        assert got["truncated"] and got["output"].splitlines()[-1] == "end-here"


async def test_a_long_command_that_ends_its_shell_reports_pane_exited(ws):
    async with connect(ws) as c:
        sp = await call(c, "split_window", {})
        r = await call(c, "run_command", {"pane_id": sp["pane_id"], "command": "sleep 1; echo going; exit 4", "timeout": 0.3})
        got = await call(c, "wait_for_command", {"command_id": r["command_id"], "timeout": 20})
        assert got["status"] == "pane_exited" and got["exit_status"] == 4, got
        # What the shell printed last can be lost: tmux sends its control
        # clients nothing more for a pane it has destroyed (docs/mcp.md).
        assert got["output"] == "" or got["output"].startswith("going"), got


async def test_unknown_command_ids_are_clear_errors(ws):
    async with connect(ws) as c:
        msg = await call(c, "wait_for_command", {"command_id": "cmd-999"}, ok=False)
        assert "command_id" in msg and "run_command" in msg, msg


async def test_the_screen_shows_the_command_not_sandmux_plumbing(ws):
    async with connect(ws) as c:
        first = await call(c, "capture_since", {})
        r = await call(c, "run_command", {"command": "echo \"it's $((6*7))\" | tr 4 four"})
        assert r["output"] == "it's f2", r
        for text in [(await call(c, "capture_pane", {}))["text"],
                     (await call(c, "capture_since", {"cursor": first["cursor"]}))["text"],
                     (await call(c, "snapshot_pane", {}))["content"]["text"]]:
            # The command as written (issue 26: not sandmux's wrapper
            # with its quote shown as '\''), the output, no markers or escapes.
            assert "echo \"it's $((6*7))\" | tr 4 four" in text, text
            assert "__sandmux_run" not in text, text
            assert "it's f2" in text
            assert "SANDMUX_" not in text and "6973" not in text and "\\047" not in text, text
        # A 30 KB heredoc stays about 30 KB on screen (it used to be typed as ~120 KB of escapes).
        body = "\n".join(f"line {i:05d} with some text, quotes ' \" and $dollars" for i in range(600))
        assert len(body) > 30_000
        cur = await call(c, "capture_since", {})
        r = await call(c, "run_command", {"command": f"cat > /tmp/big <<'EOF'\n{body}\nEOF\nwc -c < /tmp/big", "timeout": 30})
        assert r["status"] == "completed" and int(r["output"].split()[-1]) == len(body) + 1, {k: v for k, v in r.items() if k != "output"}
        since = await call(c, "capture_since", {"cursor": cur["cursor"], "max_bytes": 1_000_000})
        assert len(since["text"]) < 1.3 * len(body), len(since["text"])


async def test_long_command_ids_are_bounded(ws):
    """64 running long commands at most; the next is refused with a clear
    error until one ends (finished ones are evicted first)."""
    async with connect(ws) as c:
        panes, ids = [], []
        for i in range(64):
            w = await call(c, "create_window", {"window_name": f"w{i}"})
            panes.append(w["pane_id"])
            r = await call(c, "run_command", {"pane_id": w["pane_id"], "command": "sleep 300", "timeout": 0.05})
            assert r["command_id"], r
            ids.append(r["command_id"])
        w = await call(c, "create_window", {})
        msg = await call(c, "run_command", {"pane_id": w["pane_id"], "command": "echo one-too-many"}, ok=False)
        assert "64" in msg and "wait_for_command" in msg, msg
        # C-c aborts the command (its end marker never comes): its shell's
        # next prompt ends it, and its slot can be reused.
        await call(c, "send_keys", {"pane_id": panes[0], "keys": ["C-c"]})
        got = await call(c, "wait_for_command", {"command_id": ids[0], "timeout": 10})
        assert got["status"] == "interrupted" and got["exit_status"] == 130, got
        r = await call(c, "run_command", {"pane_id": w["pane_id"], "command": "echo room-again", "timeout": 10})
        assert r["output"] == "room-again", r


async def test_a_command_that_mentions_the_missing_function_message_runs_once(ws):
    async with connect(ws) as c:
        r = await call(c, "run_command", {"command": "echo x >> /tmp/count; echo 'bash: __sandmux_run: command not found'; wc -l < /tmp/count"})
        assert r["status"] == "completed" and r["output"].splitlines()[-1] == "1", r

