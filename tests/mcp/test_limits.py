"""Sessions, windows and panes are bounded by the profile (`[limits]
max_sessions`, `max_panes`), and so are the supervisor's tmux clients on the
host (one command client plus one watcher per session: at most
1 + max_sessions). Attacks come from the agent's side (tool calls, concurrent
calls, `tmux` run inside a pane); the counts are checked on the host (tmux
listings over the real socket, the serve process's children in /proc)."""

import json
import pathlib
import re
import subprocess

import anyio
import pytest

from conftest import BIN, call, connect, runtime_dir_of, serve_pids, tmux_host

pytestmark = pytest.mark.anyio

ALL = ("--toolsets", "inspect,manage,execute,teardown")
SESSIONS, PANES = 3, 5


def bounded_profile(ws, max_sessions=SESSIONS, max_panes=PANES):
    """The built-in default with other session and pane limits, written
    outside the workspace and validated by sandmux itself."""
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    for k, v in (("max_sessions", max_sessions), ("max_panes", max_panes)):
        text, n = re.subn(rf"^{k} = .*$", f"{k} = {v}", text, flags=re.M)
        assert n == 1, k
    p = ws[1] / f"bounded-{max_sessions}-{max_panes}.toml"
    p.write_text(text)
    v = subprocess.run([BIN, "profile", "validate", str(p)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return str(p)


def host_tmux_clients(serve_pid):
    """Live tmux processes whose parent is `serve` (its host-side clients)."""
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            st = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        state, ppid = st[st.rfind(")") + 2 :].split()[:2]
        if int(ppid) == serve_pid and state != "Z" and pathlib.Path(cmd[0].decode()).name == "tmux":
            assert b"-C" in cmd, cmd  # only control-mode clients, nothing else
            out.append(int(p.name))
    return out


class Host:
    """The instance seen from the host: its serve pid and tmux socket."""

    def __init__(self, ws):
        self.pid = serve_pids(ws[0])[0]
        self.sock = runtime_dir_of(self.pid) / "sock" / "tmux.sock"

    def counts(self):
        """(sessions, panes) on the server, sandmux's control session aside."""
        r = tmux_host(self.sock, "list-panes", "-a", "-F", "#{session_name}")
        names = [n for n in r.stdout.splitlines() if n != "_sandmux"]
        return len(set(names)), len(names)

    def clients(self):
        return len(host_tmux_clients(self.pid))


async def refused(c, tool, args, limit):
    text = await call(c, tool, args, ok=False)
    assert text.startswith("limit reached:") and f"limits.{limit} is" in text and "hint:" in text, text
    assert ("kill_session" if limit == "max_sessions" else "kill_pane") in text, text
    return text


async def fill(c, tool, args, tries=12):
    """Calls `tool` until it fails; returns (successes, the first error text)."""
    made = 0
    for _ in range(tries):
        r = await c.call_tool(tool, args)
        if r.is_error:
            return made, r.content[0].text
        made += 1
    return made, None


async def test_sessions_windows_and_splits_stop_at_the_limits(ws):
    async with connect(ws, "-p", bounded_profile(ws), *ALL) as c:
        h = Host(ws)
        st = await call(c, "sandbox_status")
        lim = st["limits"]
        assert (lim["max_sessions"], lim["max_panes"], lim["max_host_clients"]) == (3, 5, 4), lim
        assert st["in_use"] == {"sessions": 1, "panes": 1, "host_clients": 2}, st["in_use"]
        made, err = await fill(c, "create_session", {})
        assert made == SESSIONS - 1 and "limits.max_sessions is 3, and 3 sessions exist" in err, (made, err)
        await refused(c, "create_session", {"session_name": "one-more"}, "max_sessions")
        assert h.counts() == (3, 3)
        assert h.clients() == 1 + SESSIONS == (await call(c, "sandbox_status"))["in_use"]["host_clients"]
        # Panes: one window, then splits, until max_panes.
        await call(c, "create_window", {})
        made, err = await fill(c, "split_window", {})
        assert made == 1 and "limits.max_panes is 5, and 5 panes exist" in err, (made, err)
        await refused(c, "create_window", {"shell": "sleep 100"}, "max_panes")
        await refused(c, "split_window", {"direction": "right"}, "max_panes")
        assert h.counts() == (3, 5)
        st = await call(c, "sandbox_status")
        assert st["in_use"] == {"sessions": 3, "panes": 5, "host_clients": 4}, st["in_use"]
        assert "more than 3 sessions or 5 panes at once" in " ".join(st["limits"]["impossible"])
        # Dead panes count: a pane kept after its command ends holds its place.
        sp = (await call(c, "list_panes", {"session_name": "main"}))["panes"][-1]
        await call(c, "kill_pane", {"pane_id": sp["pane_id"]})
        await call(c, "set_option", {"option": "remain-on-exit", "value": "on", "scope": "window", "global_": True})
        dead = await call(c, "create_window", {"shell": "true"})
        for _ in range(50):
            if (await call(c, "get_pane_info", {"pane_id": dead["pane_id"]}))["dead"]:
                break
            await anyio.sleep(0.1)
        assert (await call(c, "get_pane_info", {"pane_id": dead["pane_id"]}))["dead"]
        await refused(c, "split_window", {}, "max_panes")
        assert h.counts() == (3, 5)
        # Killing frees the place again.
        await call(c, "kill_session", {"session_name": "main"})
        assert h.counts() == (2, 2)
        sess = await call(c, "create_session", {"session_name": "again"})
        assert sess["session_name"] == "again" and h.counts() == (3, 3)
        await refused(c, "create_session", {}, "max_sessions")
        await call(c, "kill_window", {"window_id": sess["window_id"]})
        assert h.counts() == (2, 2)
        assert (await call(c, "create_session", {}))["pane_id"].startswith("%")
        assert h.counts() == (3, 3) and h.clients() == 4
        # The refusals are audited as refused, with their kind.
        recs = [json.loads(l) for l in (ws[1] / "audit.jsonl").read_text().splitlines()]
        kinds = {r.get("error_type") for r in recs if r.get("outcome") == "refused"}
        assert "limit_reached" in kinds, kinds


async def test_concurrent_creation_never_exceeds_the_limits(ws):
    async with connect(ws, "-p", bounded_profile(ws), *ALL) as c:
        h = Host(ws)
        results = []

        async def one(tool, args):
            r = await c.call_tool(tool, args)
            results.append((tool, r.is_error, r.content[0].text if r.is_error else r.structured_content))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, "create_session", {"session_name": f"c{i}"})
        ok = [r[2] for r in results if not r[1]]
        assert len(ok) == SESSIONS - 1, results
        assert all("limits.max_sessions is 3" in r[2] for r in results if r[1]), results
        assert h.counts() == (3, 3) and h.clients() == 4
        results.clear()
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, "split_window", {})
                tg.start_soon(one, "create_window", {})
                tg.start_soon(one, "create_session", {})
        assert len([r for r in results if not r[1]]) == PANES - 3, results
        assert all(r[2].startswith("limit reached:") for r in results if r[1]), results
        assert h.counts() == (3, 5) and h.clients() == 4
        # Output still flows from a session made in the rush (its watcher works).
        r = await call(c, "run_command", {"session_id": ok[0]["session_id"], "command": "echo rush-ok"})
        assert r["status"] == "completed" and r["output"] == "rush-ok", r


async def test_positive_control_a_large_limit_lets_the_same_loop_exceed(ws):
    """The same loops under the built-in limits (16 sessions, 128 panes) make
    more than the small limits allow, and the host then runs more clients
    than 1 + 3: the loop and the host count can see an excess."""
    async with connect(ws, *ALL) as c:
        h = Host(ws)
        made, err = await fill(c, "create_session", {}, tries=SESSIONS + 2)
        assert made == SESSIONS + 2 and err is None
        assert (await fill(c, "split_window", {}, tries=PANES))[0] == PANES
        s, p = h.counts()
        assert s > SESSIONS and p > PANES, (s, p)
        assert h.clients() == 1 + s > 1 + SESSIONS, (h.clients(), s)


async def wait_for_clients(c, want, rounds=50):
    """Polls sandbox_status until host_clients == want (or gives up)."""
    seen = []
    for _ in range(rounds):
        seen.append((await call(c, "sandbox_status"))["in_use"]["host_clients"])
        if seen[-1] == want:
            break
        await anyio.sleep(0.1)
    return seen


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "positive-control"])
async def test_sessions_made_on_the_host_get_no_watcher_beyond_the_limit(ws, bounded):
    """A human's host-side client can make sessions past the limit; the hub
    gives at most max_sessions of them a watcher, so the host's clients stay
    at 1 + max_sessions, and the agent's tools count them (refused). Positive
    control: under the built-in limit each such session gets a watcher."""
    extra = ("-p", bounded_profile(ws)) if bounded else ()
    async with connect(ws, *extra, *ALL) as c:
        h = Host(ws)
        assert (await fill(c, "create_session", {}, tries=SESSIONS - 1))[0] == SESSIONS - 1
        seen = []
        for i in range(3):
            r = tmux_host(h.sock, "new-session", "-d", "-s", f"human{i}")
            assert r.returncode == 0, r.stderr
            # The watcher sync runs on %sessions-changed: wait for it in the
            # positive control (one session at a time); sample as long here.
            seen += await wait_for_clients(c, 1 + SESSIONS + (0 if bounded else i + 1))
        assert h.counts()[0] == SESSIONS + 3
        if bounded:
            assert max(seen) <= 1 + SESSIONS and h.clients() == 1 + SESSIONS, seen
            await refused(c, "create_session", {}, "max_sessions")
        else:
            assert seen[-1] == h.clients() == 1 + SESSIONS + 3, seen


async def test_tmux_run_inside_a_pane_creates_nothing_sandmux_counts(ws):
    """From inside, the server's socket is covered (T1): `tmux` in a pane can
    neither reach it nor make windows there; a server it starts for itself
    lives inside the sandbox (its processes under the sandbox's limits) and
    costs no host process. Positive control: the same new-window from the
    host, against the same socket, does make a window."""
    async with connect(ws, "-p", bounded_profile(ws), *ALL) as c:
        h = Host(ws)
        # The handshake does not wait for the first sessions; a call does.
        await call(c, "list_sessions")
        before = (h.counts(), h.clients())
        r = await call(c, "run_command", {"command": "tmux -S /run/sandmux/sock/tmux.sock new-window; echo rc=$?", "timeout": 20})
        assert "rc=1" in r["output"], r
        r = await call(c, "run_command", {"command": "for i in 1 2 3 4; do tmux new-session -d -s inner$i; done; tmux ls | wc -l", "timeout": 20})
        assert r["status"] == "completed" and r["output"].splitlines()[-1].strip() == "4", r
        await anyio.sleep(0.5)
        assert (h.counts(), h.clients()) == before, before
        rows = (await call(c, "list_sessions"))["sessions"]
        assert not any(s["session_name"].startswith("inner") for s in rows), rows
        await call(c, "run_command", {"command": "tmux kill-server; true"})
        r = tmux_host(h.sock, "new-window", "-d", "-t", "main:")
        assert r.returncode == 0 and h.counts() == (before[0][0], before[0][1] + 1), r.stderr
