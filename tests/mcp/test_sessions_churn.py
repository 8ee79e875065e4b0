"""tmux 3.3 kills its server when a notification reaches a control client that
is still identifying. sandmux attaches its watcher clients only in quiet
(src/tmux/hub.rs); these tests repeat what used to kill the server in about a
quarter of fresh instances (quick, concurrent create_session calls right after
start, sessions killed while others are made) across many fresh instances."""

import anyio
import pytest

from conftest import call, connect

pytestmark = pytest.mark.anyio

INSTANCES = 30


async def churn(c):
    made = [f"s{i}" for i in range(6)]
    async with anyio.create_task_group() as tg:
        for n in made:
            tg.start_soon(call, c, "create_session", {"session_name": n})
    async with anyio.create_task_group() as tg:
        for n in made[:3]:
            tg.start_soon(call, c, "kill_session", {"session_name": n})
        for n in ("t0", "t1", "t2"):
            tg.start_soon(call, c, "create_session", {"session_name": n})
    rows = (await call(c, "list_sessions"))["sessions"]
    return sorted(r["session_name"] for r in rows)


async def test_quick_session_churn_never_kills_the_server(ws):
    want = sorted(["main", "s3", "s4", "s5", "t0", "t1", "t2"])
    for i in range(INSTANCES):
        async with connect(ws, "--toolsets", "inspect,manage,execute,teardown") as c:
            got = await churn(c)
            assert got == want, f"instance {i}: sessions {got}"
            # Output still flows from a session made in the churn (its watcher works).
            r = await call(c, "run_command", {"session_name": "t1", "command": "echo churn-ok"})
            assert r["status"] == "completed" and "churn-ok" in r["output"], r
