"""Faults the MCP layer must survive or report: an output flood, and the
tmux server dying (SIGKILL) or stopping (SIGSTOP) under a pending call."""

import os
import pathlib
import signal
import time

import anyio
import pytest

from conftest import call, connect, descendants, serve_pids, tmux_server_pid

pytestmark = pytest.mark.anyio


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


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


async def wait_while_the_server_is_killed(c, srv, delay):
    """Starts a 20 s wait_for_text and SIGKILLs the tmux server `delay` s in;
    returns (seconds the wait took, its result)."""

    async def kill_soon():
        await anyio.sleep(delay)
        os.kill(srv, signal.SIGKILL)

    async with anyio.create_task_group() as tg:
        tg.start_soon(kill_soon)
        t0 = time.monotonic()
        r = await c.call_tool("wait_for_text", {"patterns": ["never-printed"], "timeout": 20})
        return time.monotonic() - t0, r


async def test_server_sigkill_fails_pending_calls_and_ends_the_instance(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        srv = tmux_server_pid(pid)
        assert srv
        elapsed, r = await wait_while_the_server_is_killed(c, srv, 0.5)
        # The wait ends with the server, not at its own deadline.
        assert elapsed < 10, elapsed
        assert r.is_error or r.structured_content["outcome"] != "matched"
    t0 = time.monotonic()
    while pathlib.Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < 10:
        await anyio.sleep(0.05)
    assert not pathlib.Path(f"/proc/{pid}").exists(), "sandmux outlived its tmux server"


async def a_call_times_out_while_stopped(c, srv):
    """SIGSTOPs the tmux server, checks one call fails in bounded time, resumes it."""
    os.kill(srv, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = await c.call_tool("list_panes", {})
        # The call's own command times out, or (if the stop caught the drift
        # scan the previous call asked for) its wait for that scan.
        text = r.content[0].text if r.content else ""
        assert r.is_error and ("did not answer" in text or "did not finish" in text), r
        assert time.monotonic() - t0 < 15
    finally:
        os.kill(srv, signal.SIGCONT)


async def test_stopped_server_gives_timeouts_not_hangs(ws):
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        await a_call_times_out_while_stopped(c, tmux_server_pid(pid))
        # Replies to the timed-out command arrive late and are matched to it,
        # not to the next call.
        await anyio.sleep(0.5)
        r = await call(c, "run_command", {"command": "echo resumed"})
        assert r["output"] == "resumed"


# --- resource exhaustion inside, and start/stop cycles -----------------------

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402

from conftest import BIN, alive, audit_records, runtime_dir_of, server_params  # noqa: E402


def limited_profile(ws, best_effort=None, **limits):
    """The default profile with [limits] overrides (and optionally another
    best_effort list), written beside the audit log, outside the workspace."""
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    for k, v in limits.items():
        text, n = re.subn(rf"^{k} = .*$", f"{k} = {json.dumps(v)}", text, flags=re.M)
        assert n == 1, k
    if best_effort is not None:
        text, n = re.subn(r"^best_effort = .*$", f"best_effort = {json.dumps(best_effort)}", text, flags=re.M)
        assert n == 1
    p = ws[1] / "limits.toml"
    p.write_text(text)
    return str(p)


def host_ok():
    """A host command answers promptly (the host is not starved)."""
    t0 = time.monotonic()
    subprocess.run(["true"], check=True, timeout=10)
    return time.monotonic() - t0


def memory_limited_profile(ws):
    """The default profile with a required 256 MiB cgroup memory limit; skips
    (quoting sandmux's own refusal) where no delegated cgroup exists."""
    prof = limited_profile(ws, best_effort=[], memory="256MiB")
    # The memory limit is a cgroup limit: with the cgroup layer required, an
    # instance either has it or refuses to start (P5). Only that refusal skips.
    probe = subprocess.run([BIN, "serve", "-w", str(ws[0]), "--audit-log", str(ws[1] / "probe.jsonl"), "-p", prof], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, env={k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")})
    # (Without a client it stops at the missing initialize request; a
    # refusal to start names the layer.)
    if probe.returncode != 0 and "initialize request" not in probe.stderr:
        assert "cgroup" in probe.stderr, probe.stderr
        pytest.skip(f"no delegated cgroup here, so no memory limit to test: {probe.stderr.strip()[:300]}")
    return prof


BOMB = (
    "python3 -c \"import sys\nb=[]\nfor i in range(64):\n  b.append(bytearray(16<<20))\n"
    "  print('MiB', (i+1)*16, flush=True)\nprint('survived')\"; echo status=$?"
)


async def test_memory_bomb_is_contained_by_the_memory_limit(ws):
    prof = memory_limited_profile(ws)
    async with connect(ws, "-p", prof) as c:
        st = await call(c, "sandbox_status")
        assert any(l["layer"] == "cgroup" and l["enforced"] for l in st["layers"]), st["layers"]
        assert st["oom_kills"] == 0, st
        s = await call(c, "create_session", {"session_name": "bomb"})
        # Allocates and touches 16 MiB at a time, reporting progress; stops by
        # itself at 1 GiB so that a broken limit cannot take the host down.
        bomb = BOMB
        t0 = time.monotonic()
        r = await call(c, "run_command", {"pane_id": s["pane_id"], "command": bomb, "timeout": 25})
        took = time.monotonic() - t0
        out = r["output"]
        assert "survived" not in out, out[-500:]
        reached = max([int(m) for m in re.findall(r"MiB (\d+)", out)] or [0])
        assert reached <= 256, out[-500:]
        assert re.search(r"status=(137|1)\b", out), out[-500:]
        # The supervisor and the server go on; the host stayed responsive.
        assert host_ok() < 2
        assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"
        await call(c, "list_panes")
        # The kill is reported, from the instance's cgroup.
        if "status=137" in out:
            kills = (await call(c, "sandbox_status"))["oom_kills"]
            assert kills >= 1
            # ... and journaled as an event of its own (read once a second).
            deadline = time.monotonic() + 5
            while not (ev := [r for r in audit_records(ws) if r["tool"] == "(oom-kill)"]) and time.monotonic() < deadline:
                await anyio.sleep(0.2)
            assert ev and ev[-1]["outcome"] == "event" and ev[-1]["error_type"] == "oom_kill", ev
            assert 1 <= ev[-1]["args"]["oom_kills"] <= kills and ev[0]["args"]["new"] >= 1, ev
        print(f"\nmemory bomb: stopped at {reached} MiB of 1024 ({out.splitlines()[-1]}) in {took:.1f}s")
    assert subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True).returncode == 0


async def test_an_oom_kill_just_before_the_end_is_audited(ws):
    """The count is read once a second, and once more as the instance ends:
    a kill right before the client leaves (or the one that ended the
    instance) still gets its record."""
    prof = memory_limited_profile(ws)
    async with connect(ws, "-p", prof) as c:
        pid = serve_pids(ws[0])[0]
        r = await call(c, "run_command", {"command": BOMB, "timeout": 25})
        if "status=137" not in r["output"]:
            pytest.skip(f"the bomb ended without an OOM kill: {r['output'][-200:]}")
    t0 = time.monotonic()
    while alive(pid) and time.monotonic() - t0 < 10:
        await anyio.sleep(0.05)
    assert not alive(pid)
    ev = [r for r in audit_records(ws) if r["tool"] == "(oom-kill)"]
    assert len(ev) == 1 and ev[0]["outcome"] == "event" and ev[0]["args"]["oom_kills"] >= 1, ev
    assert subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True).returncode == 0


async def test_restart_profile_starts_fresh_generations_then_ends(ws):
    """`on_server_exit = "restart"`: each SIGKILL of the tmux server fails the
    pending call at once, then a fresh generation (new sandbox, new server,
    same runtime directory and MCP session) answers; the fourth death is past
    the budget and ends the instance, leaving nothing behind."""
    prof = limited_profile(ws, on_server_exit="restart")
    async with connect(ws, "-p", prof) as c:
        pid = serve_pids(ws[0])[0]
        rundir = runtime_dir_of(pid)
        seen = [await call(c, "get_server_info")]
        for n in (1, 2, 3):
            srv = tmux_server_pid(pid)
            assert srv
            elapsed, r = await wait_while_the_server_is_killed(c, srv, 0.3)
            assert elapsed < 10 and (r.is_error or r.structured_content["outcome"] != "matched"), (elapsed, r)
            # The fresh generation answers (calls made while it starts may fail).
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15:
                r = await c.call_tool("get_server_info", {})
                if not r.is_error and r.structured_content["generation"] != seen[-1]["generation"]:
                    break
                await anyio.sleep(0.1)
            info = r.structured_content
            assert not r.is_error and info["generation"] not in [i["generation"] for i in seen], r
            seen.append(info)
            assert alive(srv) is False and tmux_server_pid(pid) not in (None, srv)
            assert [s["session_name"] for s in (await call(c, "list_sessions"))["sessions"]] == ["main"]
            assert (await call(c, "run_command", {"command": f"echo gen{n}"}))["output"] == f"gen{n}"
            # The new generation is confined like the first: a pane of it has
            # no privileges, cannot see the socket and cannot signal its server.
            probe = ("grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status | tr -s '\\t ' ' '; "
                     f"ls /run/sandmux/sock >/dev/null 2>&1; echo ls=$?; kill -0 {info['pid']} 2>/dev/null; echo kill=$?")
            out = (await call(c, "run_command", {"command": probe}))["output"].splitlines()
            assert out == ["CapEff: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2", "ls=2", "kill=1"], out
            assert runtime_dir_of(pid) == rundir and rundir.exists()
        ev = [r for r in audit_records(ws) if r["tool"] == "(server-restart)"]
        assert [e["args"]["restart"] for e in ev] == [1, 2, 3], ev
        assert [e["args"]["generation"] for e in ev] == [i["generation"] for i in seen[1:]], ev
        # Past the budget: the next death ends the instance.
        os.kill(tmux_server_pid(pid), signal.SIGKILL)
        t0 = time.monotonic()
        while alive(pid) and time.monotonic() - t0 < 10:
            await anyio.sleep(0.05)
        assert not alive(pid), "sandmux went on past its restart budget"
    assert not rundir.exists()
    assert subprocess.run([BIN, "audit", "verify", str(ws[1] / "audit.jsonl")], capture_output=True).returncode == 0


async def test_calls_during_restarts_never_kill_the_next_server(ws):
    """Found in review: a call on the dead generation's hub reconnected to the
    socket the next generation's server listens on while the new hub made its
    sessions; two control clients identifying at once killed the new server
    (tmux 3.3a, a NULL read in control_write). Calls keep coming through three
    restarts in each of four instances: every new generation answers, and
    the kernel logs no tmux segfault."""
    prof = limited_profile(ws, on_server_exit="restart")
    before = segfaults()
    for _ in range(4):
        async with connect(ws, "-p", prof) as c:
            pid = serve_pids(ws[0])[0]
            for n in (1, 2, 3):
                srv = tmux_server_pid(pid)
                gen = (await call(c, "get_server_info"))["generation"]
                done = anyio.Event()

                async def hammer():
                    while not done.is_set():
                        await c.call_tool("list_panes", {})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(hammer)
                    tg.start_soon(hammer)
                    os.kill(srv, signal.SIGKILL)
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < 15:
                        r = await c.call_tool("get_server_info", {})
                        if not r.is_error and r.structured_content["generation"] != gen:
                            break
                        await anyio.sleep(0.05)
                    done.set()
                assert not r.is_error and r.structured_content["generation"] != gen, r
                # The new server stays up past its start-up.
                await anyio.sleep(0.2)
                assert (await call(c, "run_command", {"command": f"echo r{n}"}))["output"] == f"r{n}"
    assert segfaults() == before, "a tmux server crashed"


def segfaults():
    """tmux segfaults in the kernel log (0 when it cannot be read)."""
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    return sum("tmux" in line and "segfault" in line for line in r.stdout.splitlines())


async def test_disk_fill_hits_the_tmpfs_and_file_size_limits(ws):
    prof = limited_profile(ws, tmpfs_size="32MiB", file_size="8MiB")
    host_tmp = os.statvfs(tempfile_dir())
    free_before = host_tmp.f_bavail * host_tmp.f_frsize
    async with connect(ws, "-p", prof) as c:
        s = await call(c, "create_session", {"session_name": "fill"})
        p = s["pane_id"]
        # The sandbox's /tmp is a 32 MiB tmpfs: filling it ends in ENOSPC
        # (each write stays under the 8 MiB file size limit).
        fill = (
            "python3 -c \"import errno\nn=0\ntry:\n  for i in range(100):\n"
            "    with open('/tmp/fill%d' % i, 'wb') as f:\n      for j in range(4):\n        f.write(b'x' * (1<<20)); f.flush(); n += 1\n"
            "except OSError as e:\n  print('errno', errno.errorcode[e.errno], 'MiB', n)\n\"; df -k /tmp | tail -1"
        )
        r = await call(c, "run_command", {"pane_id": p, "command": fill, "timeout": 25})
        m = re.search(r"errno (\w+) MiB (\d+)", r["output"])
        assert m and m.group(1) == "ENOSPC", r["output"]
        assert 16 <= int(m.group(2)) <= 32, r["output"]
        # In the workspace, the file size rlimit: EFBIG (SIGXFSZ ignored so
        # the error is seen rather than the signal).
        big = (
            "python3 -c \"import signal, errno\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nn=0\n"
            "try:\n  with open('big.bin', 'wb') as f:\n    for j in range(64):\n      f.write(b'y' * (1<<20)); f.flush(); n += 1\n"
            "except OSError as e:\n  print('errno', errno.errorcode[e.errno], 'MiB', n)\n\""
        )
        r = await call(c, "run_command", {"pane_id": p, "command": big, "timeout": 25})
        assert "errno EFBIG MiB 8" in r["output"], r["output"]
        assert (ws[0] / "big.bin").stat().st_size == 8 << 20
        # A plain writer is stopped by the signal at the same size.
        r = await call(c, "run_command", {"pane_id": p, "command": "head -c 20000000 /dev/zero > big2.bin; echo status=$?", "timeout": 25})
        assert "status=153" in r["output"], r["output"]  # 128 + SIGXFSZ (25)
        assert (ws[0] / "big2.bin").stat().st_size == 8 << 20
        assert (await call(c, "run_command", {"pane_id": p, "command": "rm -f /tmp/fill*; echo ok"}))["output"] == "ok"
    host_tmp = os.statvfs(tempfile_dir())
    free_after = host_tmp.f_bavail * host_tmp.f_frsize
    # The host's /tmp lost at most the workspace files (16 MiB) plus slack
    # for other activity: the 32 MiB tmpfs is not host disk.
    assert free_before - free_after < 48 << 20, (free_before, free_after)


def tempfile_dir():
    import tempfile

    return tempfile.gettempdir()


def open_fds():
    """This process's descriptors and what they point to."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def mentions(needle):
    """Host pids whose command line mentions `needle`."""
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


CYCLES = 100


async def test_serve_start_stop_cycles_leak_nothing(ws):
    mounts_before = pathlib.Path("/proc/self/mountinfo").read_text()
    fds_before = open_fds()
    kids_before = set(descendants(os.getpid()))
    rundirs, pids = [], []
    t0 = time.monotonic()
    for i in range(CYCLES):
        async with connect(ws) as c:
            r = await c.call_tool("list_panes", {})
            assert not r.is_error, r
            pid = serve_pids(ws[0])
            assert len(pid) == 1, pid
            pids.append(pid[0])
            d = runtime_dir_of(pid[0])
            assert d is not None and d.exists()
            rundirs.append(d)
    elapsed = time.monotonic() - t0
    # Everything ends within a short grace period after the last close.
    t1 = time.monotonic()
    while time.monotonic() - t1 < 5:
        left = [p for p in pids if alive(p)] + [p for d in rundirs for p in mentions(str(d))]
        if not left and not any(d.exists() for d in rundirs) and set(descendants(os.getpid())) <= kids_before:
            break
        await anyio.sleep(0.1)
    print(f"\n{CYCLES} serve cycles in {elapsed:.1f}s ({elapsed / CYCLES * 1000:.0f} ms each)")
    assert not [p for p in pids if alive(p)], "a sandmux serve outlived its client"
    leaked = {str(d): mentions(str(d)) for d in rundirs if mentions(str(d))}
    assert not leaked, leaked
    assert set(descendants(os.getpid())) <= kids_before, set(descendants(os.getpid())) - kids_before
    assert not [d for d in rundirs if d.exists()], "runtime directories left behind"
    assert len(set(rundirs)) == CYCLES
    base = rundirs[0].parent
    assert not (set(base.iterdir()) & set(rundirs))
    assert pathlib.Path("/proc/self/mountinfo").read_text() == mounts_before
    # No descriptor opened during the cycles stays open (one that pytest or
    # the event loop closed meanwhile is not a leak).
    new = {fd: t for fd, t in open_fds().items() if fds_before.get(fd) != t}
    assert not new, new


async def test_concurrent_calls_after_a_timeout_share_one_reconnect(ws):
    """After a call times out on a stopped server, its connection is replaced.
    Several calls arriving together must share one new connection: a second
    one, thrown away, must not be taken for the server's death."""
    async with connect(ws) as c:
        await call(c, "create_session")
        pid = serve_pids(ws[0])[0]
        await a_call_times_out_while_stopped(c, tmux_server_pid(pid))
        results = []

        async def one():
            results.append(await c.call_tool("list_panes", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
        assert all(not r.is_error for r in results), [r.content[0].text for r in results if r.is_error]
        await anyio.sleep(1)
        assert alive(pid), "sandmux ended a healthy instance"
        assert (await call(c, "run_command", {"command": "echo still-here"}))["output"] == "still-here"
