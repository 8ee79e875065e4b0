"""The supervisor confines itself (host side, issue 11): once `serve` has
started its sandbox, a bug in handling agent input must not become host
access. The attack is the worst case of such a bug: code running inside the
supervisor. gdb injects calls into every thread of the real `serve` process
(and into processes it starts from there) that try what the code would:
read a host file, plant one, run a shell that does both, reach the network,
ptrace another host process, make a namespace. The host side checks that
nothing happened. The positive control is the same injection into the
broker, an unconfined process of the same binary beside it: there
every attack works."""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time

import anyio
import pytest
import test_faults
import test_workspace

from conftest import BIN, call, connect, runtime_dir_of, serve_pids, tmux_server_pid

pytestmark = pytest.mark.anyio

GDB = shutil.which("gdb")


def threads(pid):
    return sorted(int(t.name) for t in pathlib.Path(f"/proc/{pid}/task").iterdir())


def status(pid, tid):
    text = pathlib.Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return dict(l.split(":\t", 1) for l in text.splitlines() if ":\t" in l)


def broker_of(serve_pid):
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
                st = (p / "stat").read_text()
            except OSError:
                continue
            if cmd[:2] == [b"sandmux-broker", b"__broker"] and int(st[st.rfind(")") + 2 :].split()[1]) == serve_pid:
                return int(p.name)
    return None


def inject(pid, calls, thread=None):
    """Runs each C expression in `pid` through gdb (in every thread, or in
    one) and returns, per expression, one (value, errno) per thread. The
    errno is read in the same expression, before the thread runs again."""
    args = [GDB, "-nx", "-batch", "-p", str(pid), "-ex", "set debuginfod enabled off", "-ex", "set pagination off",
            # Only the thread making a call runs meanwhile: no thread comes or goes.
            "-ex", "set scheduler-locking on"]
    for c in calls:
        args += ["-ex", f"thread apply {thread or 'all'} print ({c}) * 1000 + *(int*)__errno_location()"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120).stdout
    values = [int(v) for v in re.findall(r"^\$\d+ = (-?\d+)", out, re.M)]
    per = len(values) // len(calls)
    assert values and per * len(calls) == len(values), out
    pairs = [((v - v % 1000) // 1000, v % 1000) for v in values]
    return [pairs[i * per:(i + 1) * per] for i in range(len(calls))], out


def attacks(host, work, port, victim, cgroup_file):
    """C expressions, each an attack; `0101` is O_WRONLY|O_CREAT (octal),
    `010644` a fifo, `04755` a set-user-ID mode."""
    return [
        f'(int)open("{host / "secret.txt"}", 0)',
        f'(int)open("{host / "planted"}", 0101, 0644)',
        f'(int)system("cat {host / "secret.txt"} > {host / "shell-planted"}")',
        f'(int)system("bash -c \'echo hi >/dev/tcp/127.0.0.1/{port}\'")',
        "(int)socket(2, 1, 0)",
        f"(long)ptrace(16, {victim}, 0, 0)",
        "(int)unshare(0x10000000)",
        f'(int)mknod("{host / "node"}", 010644, 0)',
        f'(int)chmod("{work / "setid"}", 04755)',
        f'(int)system("cp /bin/true {work / "setid2"} && chmod 4755 {work / "setid2"}")',
        f'(int)open("{cgroup_file}", 1)',
    ]


async def test_every_thread_of_serve_is_confined_and_says_so(ws):
    """Every thread has the filter and no_new_privs, no core dumps; the
    layer is reported as enforced in sandbox_status and in check."""
    async with connect(ws) as c:
        st = await call(c, "sandbox_status")
        sup = [l for l in st["layers"] if l["layer"] == "supervisor"]
        assert sup and sup[0]["enforced"], st["layers"]
        assert "Landlock ABI" in sup[0]["detail"] and "seccomp on every thread" in sup[0]["detail"], sup
        pid = serve_pids(ws[0])[0]
        tids = threads(pid)
        assert len(tids) >= 3, tids  # main, the guard, the signal thread
        for t in tids:
            s = status(pid, t)
            assert s["NoNewPrivs"] == "1" and s["Seccomp"] == "2", (t, s["Name"], s["Seccomp"])
        limits = pathlib.Path(f"/proc/{pid}/limits").read_text()
        assert re.search(r"^Max core file size\s+0\s+0\s", limits, re.M), limits
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    chk = subprocess.run([BIN, "check", "-w", str(ws[0]), "--json"], capture_output=True, text=True, timeout=120, env=env)
    rep = json.loads(chk.stdout)
    sup = [l for l in rep["layers"] if l["layer"] == "supervisor"]
    assert sup and sup[0]["enforced"], rep["layers"]


@pytest.mark.skipif(GDB is None, reason="gdb is not installed (.ci/run installs it)")
async def test_code_inside_serve_cannot_reach_the_host(ws):
    work, host = ws
    (host / "secret.txt").write_text("the host's secret\n")
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    lst.settimeout(0.5)
    port = lst.getsockname()[1]
    victim = subprocess.Popen(["sleep", "120"])
    (work / "setid").write_text("#!/bin/sh\n")
    prof = test_faults.limited_profile(ws, on_server_exit="restart")
    try:
        async with connect(ws, "-p", prof) as c:
            await call(c, "list_sessions")
            pid = serve_pids(work)[0]
            broker = broker_of(pid)
            assert broker, "no broker beside serve"
            n = len(threads(pid))
            # Another cgroup's file: the parent of this instance's own directory.
            cg = runtime_dir_of(pid) / "cgroup.json"
            parent = json.loads(cg.read_text())["instance"][0] if cg.exists() else None
            cgroup_file = pathlib.Path(parent).parent / "cgroup.procs" if parent else host / "no-cgroup"
            calls = attacks(host, work, port, victim.pid, cgroup_file)
            # One gdb run: every attack in every thread of serve.
            got, out = await anyio.to_thread.run_sync(inject, pid, calls)
            assert all(len(g) == n for g in got), out
            denied = lambda i, errno: all(rc == -1 and e == errno for rc, e in got[i])
            assert denied(0, 13), ("read a host file", got[0], out)
            assert denied(1, 13), ("planted a host file", got[1], out)
            assert all(rc != 0 for rc, _ in got[2] + got[3]), ("a shell did it", got[2:4], out)
            assert denied(4, 1), ("an inet socket", got[4], out)
            assert denied(5, 1), ("ptrace", got[5], out)
            assert denied(6, 1), ("unshare", got[6], out)
            assert denied(7, 1), ("mknod", got[7], out)
            assert denied(8, 1), ("a set-user-ID bit", got[8], out)
            assert all(rc != 0 for rc, _ in got[9]), ("a shell made a set-user-ID file", got[9], out)
            if parent:
                assert denied(10, 13), ("another cgroup's file", got[10], out)
            assert not (host / "node").exists()
            assert not (work / "setid").stat().st_mode & 0o6000
            assert not (work / "setid2").exists() or not (work / "setid2").stat().st_mode & 0o6000
            # The host saw nothing: no file, no connection, the victim untraced.
            assert not (host / "planted").exists() and not (host / "shell-planted").exists()
            with pytest.raises(socket.timeout):
                lst.accept()
            assert status(victim.pid, victim.pid)["TracerPid"] == "0"
            # serve still works after the attempts.
            assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"

            # Positive control: the same attacks in the unconfined broker work.
            got, out = await anyio.to_thread.run_sync(inject, broker, calls, 1)
            rc = [g[0][0] for g in got]
            assert rc[0] >= 0 and rc[1] >= 0, ("the control could not open", out)
            assert rc[2] == 0 and (host / "shell-planted").read_text() == "the host's secret\n", out
            assert rc[3] == 0, out
            conn, _ = lst.accept()
            conn.close()
            assert rc[4] >= 0 and rc[5] == 0, out
            t0 = time.monotonic()
            while status(victim.pid, victim.pid)["TracerPid"] != str(broker) and time.monotonic() - t0 < 5:
                await anyio.sleep(0.05)
            assert status(victim.pid, victim.pid)["TracerPid"] == str(broker)
            assert rc[6] == 0, out
            assert rc[7] == 0 and (host / "node").exists(), out
            assert rc[8] == 0 and (work / "setid").stat().st_mode & 0o4000, out
            assert rc[9] == 0 and (work / "setid2").stat().st_mode & 0o4000, out
            if parent:
                assert rc[10] >= 0, ("the control could not open the parent cgroup's file", out)
    finally:
        victim.kill()
        victim.wait()
        lst.close()


def git_profile(ws, git):
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text, n = re.subn(r'^on_server_exit = "end".*$', 'on_server_exit = "restart"', text, flags=re.M)
    text, m = re.subn(r'^git = "read-only"', f'git = "{git}"', text, flags=re.M)
    assert n == 1 and m == 1
    p = ws[1] / f"{git}.toml"
    p.write_text(text)
    return str(p)


PLANT = "printf '#!/bin/sh\\ntouch /tmp/x\\n' > .git/hooks/post-checkout; a=$?; git config core.hooksPath /tmp; echo rc=$a,$?"


async def plant_in_a_later_generation(ws, git):
    """The agent waits for a restart, then plants a hook and a hooks path
    in the real repository from the new generation's pane."""
    async with connect(ws, "-p", git_profile(ws, git)) as c:
        first = (await call(c, "run_command", {"command": PLANT}))["output"]
        gen = (await call(c, "get_server_info"))["generation"]
        pid = serve_pids(ws[0])[0]
        os.kill(tmux_server_pid(pid), 9)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            r = await c.call_tool("get_server_info", {})
            if not r.is_error and r.structured_content["generation"] != gen:
                break
            await anyio.sleep(0.1)
        assert not r.is_error and r.structured_content["generation"] != gen, r
        later = (await call(c, "run_command", {"command": PLANT}))["output"]
    return first, later


async def test_a_later_generation_guards_the_repository_like_the_first(ws):
    """Found in review: the broker built later generations from the profile
    as it was before the workspace guard added its paths, so in commit mode
    a restarted server let the agent write the real `.git`."""
    work = ws[0]
    test_workspace.make_repo(work)
    first, later = await plant_in_a_later_generation(ws, "commit")
    assert first.endswith("rc=1,255") or "rc=" in first and not first.endswith("rc=0,0"), first
    assert later.split("rc=")[-1] != "0,0" and later.split("rc=")[-1].split(",")[0] != "0", later
    assert not (work / ".git/hooks/post-checkout").exists()
    assert "hookspath" not in (work / ".git/config").read_text().lower()


async def test_control_without_the_guard_a_later_generation_plants_the_hook(ws):
    work = ws[0]
    test_workspace.make_repo(work)
    _, later = await plant_in_a_later_generation(ws, "unguarded")
    assert later.endswith("rc=0,0"), later
    assert (work / ".git/hooks/post-checkout").exists()
    assert "hookspath" in (work / ".git/config").read_text().lower()
