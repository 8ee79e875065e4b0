"""The unconfined supervisor stays bounded (issue 11): what the agent makes
sandmux hold on the host is freed when it is gone."""

import anyio
import pytest

from conftest import call, connect, serve_pids

pytestmark = pytest.mark.anyio


def rss_kb(pid):
    return int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")).split()[1])


async def test_output_of_closed_panes_is_freed(ws):
    """Pane churn: short-lived windows that each print 200 KB. Their rings
    used to stay for the instance's life (tens of MB for one live pane)."""
    async with connect(ws) as c:
        pid = serve_pids(ws[0])[0]
        await call(c, "run_command", {"command": "true"})
        start = rss_kb(pid)
        for _ in range(150):
            await call(c, "create_window", {"shell": "head -c 200000 /dev/zero | tr '\\0' y; sleep 0.2"})
        await anyio.sleep(1)
        held = (await call(c, "sandbox_status"))["buffered_output_bytes"]
        assert held > 2_000_000, held  # the churn really went through sandmux
        for _ in range(40):
            await anyio.sleep(0.5)
            st = await call(c, "sandbox_status")
            if st["buffered_output_bytes"] < 300_000:
                break
        assert st["buffered_output_bytes"] < 300_000, st["buffered_output_bytes"]
        assert rss_kb(pid) - start < 8_000, (start, rss_kb(pid))
        # The live pane still works, and its output is still followed.
        assert (await call(c, "run_command", {"command": "echo still-here"}))["output"] == "still-here"
