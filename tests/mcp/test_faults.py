"""Faults the MCP layer must survive or report: an output flood, and the
tmux server dying (SIGKILL) or stopping (SIGSTOP) under a pending call."""

import os
import pathlib
import signal
import time

import anyio
import pytest

from conftest import call, connect, descendants, serve_pids

pytestmark = pytest.mark.anyio


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tmux_server_pid(serve_pid):
    """Host pid of the sandboxed tmux server (a descendant named 'tmux: server')."""
    for k in descendants(serve_pid):
        try:
            if pathlib.Path(f"/proc/{k}/comm").read_text().strip() == "tmux: server":
                return k
        except OSError:
            pass
    return None


async def test_output_flood_keeps_memory_bounded_and_calls_answering(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "flood"})
        quiet = await call(c, "create_session", {"session_name": "quiet"})
        pid = serve_pids(ws[0])[0]
        before = rss_kib(pid)
        await call(c, "send_keys", {"pane_id": s["pane_id"], "text": "timeout 6 yes sandmux-flood-line"})
        worst = 0.0
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            r = await call(c, "run_command", {"pane_id": quiet["pane_id"], "command": "echo ok"})
            worst = max(worst, time.monotonic() - t0)
            assert r["output"] == "ok"
            await anyio.sleep(0.2)
        after = rss_kib(pid)
        # The rings hold at most 256 KiB a pane: growth stays far below the flood's volume.
        assert after - before < 64 * 1024, (before, after)
        assert worst < 5, worst
        st = await call(c, "sandbox_status")
        assert st["buffered_output_bytes"] <= 3 * 256 * 1024


async def test_server_sigkill_fails_pending_calls_and_ends_the_instance(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        srv = tmux_server_pid(pid)
        assert srv

        async def kill_soon():
            await anyio.sleep(0.5)
            os.kill(srv, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            t0 = time.monotonic()
            r = await c.call_tool("wait_for_text", {"patterns": ["never-printed"], "timeout": 20})
            elapsed = time.monotonic() - t0
        # The wait ends with the server, not at its own deadline.
        assert elapsed < 10, elapsed
        assert r.is_error or r.structured_content["outcome"] != "matched"
    t0 = time.monotonic()
    while pathlib.Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < 10:
        await anyio.sleep(0.05)
    assert not pathlib.Path(f"/proc/{pid}").exists(), "sandmux outlived its tmux server"


async def test_stopped_server_gives_timeouts_not_hangs(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        srv = tmux_server_pid(pid)
        os.kill(srv, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            r = await c.call_tool("list_panes", {})
            assert r.is_error and "did not answer" in r.content[0].text, r
            assert time.monotonic() - t0 < 15
        finally:
            os.kill(srv, signal.SIGCONT)
        # Replies to the timed-out command arrive late and are matched to it,
        # not to the next call.
        await anyio.sleep(0.5)
        r = await call(c, "run_command", {"command": "echo resumed"})
        assert r["output"] == "resumed"
