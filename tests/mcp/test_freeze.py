"""Revocation and the real stop: `revoke` takes tools away from the next call
but leaves running processes running (positive control); `freeze` stops
every process in the sandbox (cgroup freezer where there is one, SIGSTOP of
the whole pid namespace otherwise), refuses calls at once without a tmux
round trip, shows in ps / sandbox_status / the journal, and `thaw` resumes.
Everything is checked on the host: /proc, the cgroup, the workspace file."""

import json
import os
import pathlib
import re
import subprocess
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import BIN, audit_records, call, connect, descendants, runtime_dir_of, serve_pids, tmux_server_pid

pytestmark = pytest.mark.anyio

LOOP = 'i=0; while :; do i=$((i+1)); echo "$i $(stty size)" > .c.tmp && mv .c.tmp counter; sleep 0.05; done'
# A process that hops pids as fast as it can fork: each generation forks the
# next and exits; every 200 hops it writes its count.
HOPPER = ("python3 -c \"import os\nn=0\nwhile True:\n  n+=1\n  if n%200==0: open('hops','w').write(str(n))\n"
          "  if os.fork(): os._exit(0)\"")


def sm(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=env)


def instance(ws):
    pid = serve_pids(ws[0])[0]
    return pid, runtime_dir_of(pid)


def read_counter(ws, name="counter"):
    """The words of a file the agent rewrites (None while it is empty or absent)."""
    try:
        return (ws[0] / name).read_text().split() or None
    except OSError:
        return None


async def until(cond, timeout=10, every=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        await anyio.sleep(every)
    return cond()


async def advances(ws, name="counter", over=1.0):
    a = read_counter(ws, name)
    await anyio.sleep(over)
    b = read_counter(ws, name)
    return a is not None and b is not None and a[0] != b[0]


def ps_row(iid):
    return next(r for r in json.loads(sm("ps", "--json").stdout) if r["id"] == iid)


def proc_text(pid, name):
    """A /proc file of a process, or "" once it is gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def sandbox_members(serve_pid):
    """Host pids and states of every process in the sandbox's pid namespace
    (the namespace the outer `__init` makes for its children): PID 1 (its
    child; its namespace link is not readable for an unprivileged host uid),
    and every process whose namespace link says so."""
    outer = next(k for k in descendants(serve_pid) if "__init" in proc_text(k, "cmdline"))
    ns = os.readlink(f"/proc/{outer}/ns/pid_for_children")
    out = {}
    for p in proc_text(outer, f"task/{outer}/children").split():
        st = proc_text(p, "stat")
        if st:
            out[int(p)] = st[st.rfind(")") + 2]
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "ns" / "pid") == ns:
                    st = (p / "stat").read_text()
                    out[int(p.name)] = st[st.rfind(")") + 2]
            except OSError:
                pass
    return outer, out


def freezer_file(rundir):
    """(file, frozen value) of the instance's cgroup freezer, if it has one."""
    cg = json.loads((rundir / "cgroup.json").read_text()) if (rundir / "cgroup.json").exists() else {"dirs": []}
    for d in map(pathlib.Path, cg["dirs"]):
        if (d / "cgroup.freeze").exists():
            return d / "cgroup.events", "frozen 1"
        if (d / "freezer.state").exists():
            return d / "freezer.state", "FROZEN"
    return None, None


async def assert_nothing_runs(serve_pid, rundir, method):
    """Nothing inside can run: the cgroup says frozen, or every process of
    the namespace is stopped (T) or dead (Z). Host tmux clients run on."""
    if "cgroup" in method:
        f, want = freezer_file(rundir)
        assert f is not None and want in f.read_text(), (method, f and f.read_text())
    else:
        ok = await until(lambda: all(s in "TtZ" for s in sandbox_members(serve_pid)[1].values()), timeout=5)
        assert ok, sandbox_members(serve_pid)
    inside = sandbox_members(serve_pid)[1]
    clients = [k for k in descendants(serve_pid) if proc_text(k, "comm").startswith("tmux") and k not in inside]
    assert clients and all(proc_text(k, "stat").split(") ")[1][0] in "SR" for k in clients), clients


async def assert_refused_frozen(c, name, args):
    r = await c.call_tool(name, args)
    assert r.is_error and "instance is frozen" in r.content[0].text, (name, r)


async def test_revoke_leaves_a_running_loop_and_freeze_stops_it(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "bg"})
        await call(c, "send_keys", {"pane_id": s["pane_id"], "text": LOOP})
        assert await until(lambda: read_counter(ws)), "the loop never wrote"
        serve, rundir = instance(ws)
        iid = rundir.name
        # Positive control: revoking execute stops no process, and a manage
        # tool still steers it (a resize is seen by the loop as SIGWINCH).
        r = sm("revoke", iid, "--toolset", "execute")
        assert r.returncode == 0, r.stderr
        with pytest.raises(MCPError, match="Unknown tool: send_keys"):
            await c.call_tool("send_keys", {"pane_id": s["pane_id"], "keys": ["C-c"]})
        assert await advances(ws), "the loop stopped at revoke"
        win = (await call(c, "list_panes", {"session_name": "bg"}))["panes"][0]["window_id"]
        await call(c, "resize_window", {"window_id": win, "width": 77, "height": 20})
        assert await until(lambda: (read_counter(ws) or ["", "", ""])[2] == "77"), read_counter(ws)
        assert ps_row(iid)["frozen"] is None

        r = sm("freeze", iid)
        assert r.returncode == 0 and "frozen" in r.stdout, (r.stdout, r.stderr)
        method = ps_row(iid)["frozen"]["method"]
        print(f"\nfrozen with: {method}")
        await assert_nothing_runs(serve, rundir, method)
        assert not await advances(ws), "the loop ran on while frozen"
        # Every call answers at once with the refusal; none reaches tmux.
        await assert_refused_frozen(c, "list_panes", {})
        await assert_refused_frozen(c, "capture_pane", {"pane_id": s["pane_id"]})
        await assert_refused_frozen(c, "resize_window", {"window_id": win, "width": 60, "height": 20})
        await assert_refused_frozen(c, "wait_for_text", {"patterns": ["x"], "timeout": 30})
        with pytest.raises(MCPError, match="frozen"):
            await c.read_resource("tmux://sessions")
        st = await call(c, "sandbox_status")
        assert st["frozen"] is True and st.get("in_use") is None, st
        table = sm("ps").stdout
        assert re.search(rf"^{iid}\s.*\bfrozen\b", table, re.M), table
        a = sm("attach", iid)
        assert a.returncode != 0 and f"instance {iid} is frozen (sandmux thaw {iid})" in a.stderr, a.stderr
        again = sm("freeze", iid)
        assert again.returncode == 0 and "already frozen" in again.stdout, again.stdout

        r = sm("thaw", iid)
        assert r.returncode == 0 and "thawed" in r.stdout, (r.stdout, r.stderr)
        assert await until(lambda: all(s not in "T" for s in sandbox_members(serve)[1].values()), timeout=5)
        assert await advances(ws), "the loop did not resume"
        assert (await call(c, "sandbox_status"))["frozen"] is False
        await call(c, "resize_window", {"window_id": win, "width": 66, "height": 20})
        assert await until(lambda: (read_counter(ws) or ["", "", ""])[2] == "66"), read_counter(ws)
        assert sm("grant", iid, "--toolset", "execute").returncode == 0
        await call(c, "send_keys", {"pane_id": s["pane_id"], "keys": ["C-c"]})

    recs = audit_records(ws)
    fr = [r for r in recs if r["tool"] == "(freeze)"]
    th = [r for r in recs if r["tool"] == "(thaw)"]
    assert len(fr) == 1 and fr[0]["outcome"] == "event" and fr[0]["args"]["by"] == "operator", fr
    assert fr[0]["args"]["method"] == method and fr[0]["args"]["processes"] >= 3 and fr[0]["args"]["error"] is None, fr
    assert len(th) == 1 and th[0]["args"]["by"] == "operator", th
    refused = [r for r in recs if r["error_type"] == "frozen"]
    assert {r["tool"] for r in refused} >= {"list_panes", "capture_pane", "resize_window", "wait_for_text"}, refused
    assert all(r["outcome"] == "refused" for r in refused)
    assert recs.index(fr[0]) < recs.index(refused[0]) < recs.index(th[0])


async def test_revoke_freeze_and_journal(ws):
    async with connect(ws) as c:
        await call(c, "list_panes")
        serve, rundir = instance(ws)
        iid = rundir.name
        r = sm("revoke", iid, "--toolset", "execute", "--freeze")
        assert r.returncode == 0 and "revoke:" in r.stdout and "frozen" in r.stdout, (r.stdout, r.stderr)
        row = ps_row(iid)
        assert row["frozen"] is not None and "execute" not in row["toolsets"], row
        j = sm("journal", iid).stdout
        assert "(freeze)" in j, j
        assert sm("thaw", iid).returncode == 0
        assert sm("thaw", iid).stdout.strip().endswith("was not frozen")
        await call(c, "list_panes")


async def test_a_fork_loop_cannot_escape_the_freeze_and_stop_ends_it_frozen(ws):
    async with connect(ws) as c:
        s = await call(c, "create_session", {"session_name": "hop"})
        await call(c, "send_keys", {"pane_id": s["pane_id"], "text": HOPPER})
        # Well under way first (thousands of pids used, so they wrap too).
        hops = lambda: int((read_counter(ws, "hops") or ["0"])[0])  # noqa: E731
        assert await until(lambda: hops() >= 2000, timeout=30), "the hopper did not get going"
        serve, rundir = instance(ws)
        iid = rundir.name
        r = sm("freeze", iid)
        assert r.returncode == 0, r.stderr
        method = ps_row(iid)["frozen"]["method"]
        # Stable: checked several times over two seconds.
        for _ in range(4):
            await assert_nothing_runs(serve, rundir, method)
            await anyio.sleep(0.5)
        assert not await advances(ws, "hops", 2.0), "the hopper ran on while frozen"
        outer, members = sandbox_members(serve)
        cg_dirs = json.loads((rundir / "cgroup.json").read_text())["dirs"] if (rundir / "cgroup.json").exists() else []
        # `stop` ends the frozen instance: nothing inside ran again, nothing is left.
        assert sm("stop", iid).returncode == 0
        assert await until(lambda: not serve_pids(ws[0]), timeout=15), "serve outlived stop"
    last = read_counter(ws, "hops")
    await anyio.sleep(0.3)
    assert read_counter(ws, "hops") == last
    left = [p for p in [outer, *members] if proc_text(p, "stat") and " Z " not in proc_text(p, "stat")]
    assert not left, left
    assert not rundir.exists()
    assert not any(pathlib.Path(d).exists() for d in cg_dirs), cg_dirs
    assert subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True).returncode == 0


def restart_profile(ws):
    text = sm("profile", "show", "default").stdout
    text, n = re.subn(r'^on_server_exit = "end".*$', 'on_server_exit = "restart"', text, flags=re.M)
    assert n == 1
    p = ws[1] / "restart.toml"
    p.write_text(text)
    return str(p)


async def test_the_supervisor_keeps_a_frozen_server(ws):
    """Frozen longer than every tmux deadline, the prune interval and the
    drift scan's: no restart (with on_server_exit = "restart"), no end; after
    the thaw the same server answers, output flows again."""
    async with connect(ws, "-p", restart_profile(ws)) as c:
        p = (await call(c, "list_panes"))["panes"][0]["pane_id"]
        serve, rundir = instance(ws)
        srv = tmux_server_pid(serve)
        # A long command followed in the background, across the freeze.
        r = await call(c, "run_command", {"pane_id": p, "command": "sleep 8; echo slept", "timeout": 1})
        assert r.get("command_id"), r
        assert sm("freeze", rundir.name).returncode == 0
        await anyio.sleep(6)
        assert serve_pids(ws[0]) == [serve] and tmux_server_pid(serve) == srv
        await assert_refused_frozen(c, "wait_for_command", {"command_id": r["command_id"], "timeout": 1})
        assert sm("thaw", rundir.name).returncode == 0
        assert tmux_server_pid(serve) == srv
        done = await call(c, "wait_for_command", {"command_id": r["command_id"], "timeout": 20})
        assert done["output"].endswith("slept"), json.dumps([done, audit_records(ws)[-8:]])
        s = await call(c, "create_session", {"session_name": "after"})
        out = await call(c, "run_command", {"pane_id": s["pane_id"], "command": "echo thawed"})
        assert out["output"] == "thawed"
        assert (await call(c, "wait_for_text", {"pane_id": p, "patterns": ["slept"], "timeout": 5}))
    assert not [r for r in audit_records(ws) if r["tool"] == "(server-restart)"]


async def test_kill_server_ends_a_frozen_instance(ws):
    async with connect(ws, "--toolsets", "inspect,execute,teardown") as c:
        s = await call(c, "create_session", {"session_name": "bg"})
        await call(c, "send_keys", {"pane_id": s["pane_id"], "text": LOOP})
        assert await until(lambda: read_counter(ws))
        serve, rundir = instance(ws)
        assert sm("freeze", rundir.name).returncode == 0
        outer, members = sandbox_members(serve)
        await call(c, "kill_server")
        assert await until(lambda: not serve_pids(ws[0]), timeout=15)
    last = read_counter(ws)
    await anyio.sleep(0.3)
    assert read_counter(ws) == last
    assert not [p for p in [outer, *members] if proc_text(p, "stat") and " Z " not in proc_text(p, "stat")]
    assert not rundir.exists()


def cgroup_profile(ws):
    """The default profile with the cgroup layer required; skips (quoting
    sandmux's refusal) where no cgroup can be made."""
    text = sm("profile", "show", "default").stdout
    text, n = re.subn(r"^best_effort = .*$", "best_effort = []", text, flags=re.M)
    assert n == 1
    p = ws[1] / "cgroup.toml"
    p.write_text(text)
    probe = subprocess.run([BIN, "serve", "-w", str(ws[0]), "--audit-log", str(ws[1] / "probe.jsonl"), "-p", str(p)],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")})
    if probe.returncode != 0 and "initialize request" not in probe.stderr:
        assert "cgroup" in probe.stderr, probe.stderr
        pytest.skip(f"no delegated cgroup here: {probe.stderr.strip()[:300]}")
    return str(p)


async def test_freeze_uses_the_cgroup_freezer_where_there_is_one(ws):
    prof = cgroup_profile(ws)
    async with connect(ws, "-p", prof) as c:
        s = await call(c, "create_session", {"session_name": "bg"})
        await call(c, "send_keys", {"pane_id": s["pane_id"], "text": LOOP})
        assert await until(lambda: read_counter(ws))
        serve, rundir = instance(ws)
        f, want = freezer_file(rundir)
        if f is None:
            pytest.skip("the instance's cgroup has no freezer (no v1 freezer hierarchy)")
        assert want not in f.read_text()  # positive control: not frozen yet
        assert sm("freeze", rundir.name).returncode == 0
        assert "cgroup" in ps_row(rundir.name)["frozen"]["method"]
        assert want in f.read_text()
        assert not await advances(ws)
        assert sm("thaw", rundir.name).returncode == 0
        assert want not in f.read_text()
        assert await advances(ws)
