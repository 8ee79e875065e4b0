#!/usr/bin/env python3
"""Scale: many `sandmux serve` instances at once, and one instance under an
output flood. Every server is driven by the official Python MCP SDK client
(`mcp.Client(stdio_client(...), mode="legacy")`) over stdio.

Run through bench/scale, which finds (or builds) the sandmux binary, makes the
venv (pinned `mcp`) and a private temp dir, and passes the paths.

1. Start-up at scale. For each N, N servers are spawned at once (one asyncio
   task each, all in this process), each with its own workspace and audit log.
   Each task: spawn -> initialize -> tools/call list_panes (must list the
   "main" session's pane). Reported: the time from the first spawn until the
   first, median and last instance had its list_panes answer (the last one is
   "all answered"). With all N up and idle, the memory of every instance's
   process tree is read (the serve process and all its descendants: sandbox
   init, tmux server, the pane's shell, tmux control clients): VmRSS summed per
   tree, Pss summed per tree, and the drop of the machine's MemAvailable.
   Then every client closes the server's stdin, and the time until every serve
   process is gone is taken.
2. Flood. One fresh instance. A second session "flood" is created; 200
   list_panes calls (session "main", one at a time from the same client) are
   timed: before the flood, while the flood pane runs `timeout S yes flood`,
   and after C-c has stopped it. During each phase the CPU time of the
   instance's processes and its peak tree RSS are sampled.

Times are never asserted on. Exit status 1: something failed to run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata as md
import json
import os
import platform
import statistics
import sys
import threading
import time
import traceback

import anyio
import mcp.client.stdio as mcp_stdio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

# The SDK closes the server's stdin on exit and kills the process tree if it
# has not exited after 2 s. With 50 servers tearing down at once on 2 cores
# that can take longer; give them time to end on their own (stdin EOF), which
# is the shutdown being measured.
mcp_stdio.PROCESS_TERMINATION_TIMEOUT = 60.0

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"scale: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# /proc helpers

def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except OSError:
            pass
    return out


def descendants(pid: int) -> list[int]:
    seen: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo.extend(children(p))
    return seen


def status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for ln in fh:
                if ln.startswith(key):
                    return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for ln in fh:
                if ln.startswith("Pss:"):
                    return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, ValueError, IndexError):
        return 0


def start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


SEEN: set[tuple[int, int]] = set()  # (pid, start time) of every instance process seen


def remember(pids: list[int], into: set[tuple[int, int]] | None = None) -> None:
    for p in pids:
        st = start_time(p)
        if st is not None:
            SEEN.add((p, st))
            if into is not None:
                into.add((p, st))


def survivors(seen: set[tuple[int, int]] | None = None, zombies: bool = False) -> list[int]:
    """Instance processes seen during the run that are still running (zombies=False)
    or that have exited but not been reaped yet (zombies=True)."""
    return sorted(p for p, st in (SEEN if seen is None else seen)
                  if start_time(p) == st and is_zombie(p) == zombies)


LINGERED: dict[str, int] = {}  # "running: comm" / "zombie: comm" -> count, over the whole run


async def linger(seen: set[tuple[int, int]], limit: float = 10.0) -> tuple[int, int, float]:
    """Right after the clients are done (every serve process has exited and been
    reaped by the SDK): how many instance processes were still running, how many
    had exited but were still unreaped (zombies: reparented to pid 1 because
    serve exited without waiting for them), and how long until every one of
    them was gone from /proc (gone = reaped)."""
    t0 = time.perf_counter()
    running, zombies = survivors(seen), survivors(seen, zombies=True)
    for kind, ps in (("running", running), ("zombie", zombies)):
        for p in ps:
            key = f"{kind}: {comm(p)}"
            LINGERED[key] = LINGERED.get(key, 0) + 1
    while (survivors(seen) or survivors(seen, zombies=True)) and time.perf_counter() - t0 < limit:
        await anyio.sleep(0.01)
    gone_ms = (time.perf_counter() - t0) * 1000 if running or zombies else 0.0
    return len(running), len(zombies), gone_ms


def ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [os.fsdecode(a) for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def wchar(pids: list[int]) -> int:
    """Bytes written (write(2) and friends) by these processes, from /proc/PID/io."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/io") as fh:
                for ln in fh:
                    if ln.startswith("wchar:"):
                        total += int(ln.split()[1])
        except (OSError, ValueError):
            pass
    return total


def mem_available_kb() -> int:
    with open("/proc/meminfo") as fh:
        for ln in fh:
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1])
    return 0


def serve_pids(binary: str) -> dict[str, int]:
    """Our `sandmux serve` children, by workspace."""
    out = {}
    for pid in children(os.getpid()):
        argv = cmdline(pid)
        if len(argv) >= 2 and os.path.realpath(argv[0]) == binary and argv[1] == "serve" and "-w" in argv:
            out[argv[argv.index("-w") + 1]] = pid
    return out


def sandmux_procs_under(tmp: str) -> list[int]:
    """Any process whose command line mentions our temp dir (there must be none at the end)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            argv = cmdline(int(d))
            if any(tmp in a for a in argv):
                found.append(int(d))
    return found


# --------------------------------------------------------------------------
# MCP

def params(binary: str, ws: str, audit: str) -> StdioServerParameters:
    return StdioServerParameters(command=binary, args=["serve", "-w", ws, "--audit-log", audit])


async def call(c: Client, tool: str, args: dict) -> dict:
    r = await c.call_tool(tool, args)
    if r.is_error:
        text = r.content[0].text if r.content else repr(r)
        raise BenchError(f"{tool}({json.dumps(args)}) failed: {text}")
    return r.structured_content or {}


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1]


# --------------------------------------------------------------------------
# 1. start-up at scale

async def scale_once(n: int, rep: int, a, errdir: str) -> dict:
    base = os.path.join(a.tmp_dir, f"n{n}-r{rep}")
    os.makedirs(base)
    wss, audits = [], []
    for i in range(n):
        ws = os.path.join(base, f"ws{i:02d}")
        os.makedirs(ws)
        wss.append(os.path.realpath(ws))
        audits.append(os.path.join(base, f"audit{i:02d}.jsonl"))
    init_ms = [0.0] * n
    first_ms = [0.0] * n
    ready = [0]
    all_ready = anyio.Event()
    release = anyio.Event()
    errlogs = [open(os.path.join(errdir, f"n{n}-r{rep}-{i:02d}.stderr"), "w") for i in range(n)]
    avail0 = mem_available_kb()

    async def instance(i: int, t0: int) -> None:
        async with Client(stdio_client(params(a.sandmux_bin, wss[i], audits[i]), errlog=errlogs[i]),
                          mode="legacy", cache=None) as c:
            init_ms[i] = (time.perf_counter_ns() - t0) / 1e6
            res = await call(c, "list_panes", {})
            first_ms[i] = (time.perf_counter_ns() - t0) / 1e6
            panes = res.get("panes") or []
            if not any(p.get("session_name") == "main" for p in panes):
                raise BenchError(f"instance {i}: list_panes has no pane of session main: {json.dumps(res)[:300]}")
            ready[0] += 1
            if ready[0] == n:
                all_ready.set()
            await release.wait()

    mem: dict = {}
    seen: set[tuple[int, int]] = set()
    t_close = [0]
    try:
        async with anyio.create_task_group() as tg:
            t0 = time.perf_counter_ns()
            for i in range(n):
                tg.start_soon(instance, i, t0)
            with anyio.fail_after(a.start_timeout):
                await all_ready.wait()
            # All up; let the idle servers settle, then read their memory.
            await anyio.sleep(1.0)
            pids = serve_pids(a.sandmux_bin)
            missing = [w for w in wss if w not in pids]
            if missing:
                raise BenchError(f"{len(missing)} serve processes not found among this process's children")
            rss, pss, nprocs = [], [], []
            for w in wss:
                tree = descendants(pids[w])
                remember(tree, seen)
                rss.append(sum(status_kb(p, "VmRSS:") for p in tree))
                pss.append(sum(pss_kb(p) for p in tree))
                nprocs.append(len(tree))
            avail1 = mem_available_kb()
            mem = dict(rss=rss, pss=pss, nprocs=nprocs, avail_drop=avail0 - avail1,
                       serve_alone=[status_kb(pids[w], "VmRSS:") for w in wss],
                       tree_comms=sorted(comm(p) for p in descendants(pids[wss[0]])))
            t_close[0] = time.perf_counter_ns()
            release.set()
    finally:
        release.set()
        for fh in errlogs:
            fh.close()
    # Every client has closed its server's stdin and the SDK has waited for its exit.
    gone_ms = (time.perf_counter_ns() - t_close[0]) / 1e6
    left = [w for w in serve_pids(a.sandmux_bin)]
    if left:
        raise BenchError(f"{len(left)} serve processes still running after their clients closed")
    n_left, n_zombies, linger_ms = await linger(seen)
    return dict(n=n, rep=rep, init=init_ms, first=first_ms, teardown_ms=gone_ms, left=n_left,
                zombies=n_zombies, linger_ms=linger_ms, **mem)


# --------------------------------------------------------------------------
# 2. flood

class Sampler(threading.Thread):
    """Peak tree RSS of one root pid, sampled every 50 ms."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0
        self.stop_ev = threading.Event()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            self.peak = max(self.peak, sum(status_kb(p, "VmRSS:") for p in descendants(self.root)))
            self.stop_ev.wait(0.05)

    def stop(self) -> int:
        self.stop_ev.set()
        self.join()
        return self.peak


def tree_cpu(root: int) -> dict[str, int]:
    """CPU ticks by role over the tree."""
    out: dict[str, int] = {}
    for p in descendants(root):
        name = comm(p)
        if name.startswith("tmux"):
            # tmux sets its process title ("tmux: server", "tmux: client"), so argv is gone;
            # the control clients are serve's own children, the server lives in the sandbox.
            name = ("tmux -C clients (serve's children)" if ppid(p) == root
                    else "tmux server (in the sandbox)")
        elif p == root:
            name = "sandmux serve"
        elif name == "sandmux":
            name = "sandmux sandbox init (2 processes)"
        elif name in ("timeout", "yes"):
            name = "timeout + yes"
        out[name] = out.get(name, 0) + cpu_ticks(p)
    return out


async def pane_command(c: Client, session: str) -> str:
    res = await call(c, "list_panes", {"session_name": session})
    return (res.get("panes") or [{}])[0].get("current_command", "")


async def flood(a, errdir: str) -> dict:
    base = os.path.join(a.tmp_dir, "flood")
    ws = os.path.realpath(os.path.join(base, "ws"))
    os.makedirs(ws)
    errlog = open(os.path.join(errdir, "flood.stderr"), "w")
    phases: dict[str, dict] = {}
    try:
        async with Client(stdio_client(params(a.sandmux_bin, ws, os.path.join(base, "audit.jsonl")), errlog=errlog),
                          mode="legacy", cache=None) as c:
            await call(c, "list_panes", {})
            root = serve_pids(a.sandmux_bin)[ws]
            seen: set[tuple[int, int]] = set()
            remember(descendants(root), seen)
            fl = await call(c, "create_session", {"session_name": "flood"})
            fpane = fl["pane_id"]
            for _ in range(20):  # warm-up
                await call(c, "list_panes", {"session_name": "main"})

            async def measure(name: str, check_flooding: bool) -> None:
                cpu0, s = tree_cpu(root), Sampler(root)
                yes = [p for p in descendants(root) if comm(p) == "yes"]
                w0 = wchar(yes)
                s.start()
                t0 = time.perf_counter()
                lat = []
                for _ in range(a.calls):
                    t = time.perf_counter_ns()
                    res = await call(c, "list_panes", {"session_name": "main"})
                    lat.append((time.perf_counter_ns() - t) / 1e6)
                    if len(res.get("panes") or []) != 1:
                        raise BenchError(f"list_panes(main) returned {json.dumps(res)[:300]}")
                wall = time.perf_counter() - t0
                rate = (wchar(yes) - w0) / wall / 1e6 if yes else 0.0
                peak = s.stop()
                cpu1 = tree_cpu(root)
                still = await pane_command(c, "flood") if check_flooding else ""
                if check_flooding and still not in ("timeout", "yes"):
                    raise BenchError(f"the flood ended before the {a.calls} calls did (pane command {still!r}); "
                                     "raise --flood-seconds")
                cpu = {k: (cpu1.get(k, 0) - cpu0.get(k, 0)) / CLK_TCK / wall * 100 for k in cpu1}
                phases[name] = dict(lat=lat, wall=wall, peak_kb=peak, cpu=cpu, rate=rate)
                log(f"flood: {name}: p50 {q(lat, 50):.2f} ms, p99 {q(lat, 99):.2f} ms over {wall:.1f} s")

            await measure("before", False)
            await call(c, "send_keys", {"pane_id": fpane, "text": f"timeout {a.flood_seconds} yes flood"})
            with anyio.fail_after(15):
                while await pane_command(c, "flood") not in ("timeout", "yes"):
                    await anyio.sleep(0.05)
            remember(descendants(root), seen)
            await anyio.sleep(0.5)  # let the output stream reach full speed
            await measure("during", True)
            await call(c, "send_keys", {"pane_id": fpane, "keys": ["C-c"]})
            t_stop = time.perf_counter()
            with anyio.fail_after(60):
                while await pane_command(c, "flood") in ("timeout", "yes"):
                    await anyio.sleep(0.05)
                await call(c, "wait_for_stable", {"pane_id": fpane, "quiet_ms": 500})
            stop_s = time.perf_counter() - t_stop
            await measure("after", False)
            tail = await call(c, "capture_pane", {"pane_id": fpane, "max_lines": 5})
    finally:
        errlog.close()
    if ws in serve_pids(a.sandmux_bin):
        raise BenchError("the flood instance's serve process is still running after its client closed")
    n_left, n_zombies, linger_ms = await linger(seen)
    return dict(phases=phases, stop_s=stop_s, tail=tail, left=n_left, zombies=n_zombies, linger_ms=linger_ms)


# --------------------------------------------------------------------------
# report

def mib(kb: float) -> str:
    return f"{kb / 1024:.1f}"


def report(runs: list[dict], fl: dict, a, meta: dict) -> str:
    rows = ["| N | reps | first answered s | median answered s | **all answered s** | initialize, all s "
            "| teardown: stdin closed -> every serve exited s | instance processes then still running / exited but unreaped "
            "| ... all reaped after ms |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    mrows = ["| N | processes per instance | VmRSS per instance MiB, median (min..max) | Pss per instance MiB, median "
             "| VmRSS sum, all N MiB | Pss sum, all N MiB | MemAvailable drop MiB (per instance) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in a.sizes:
        rs = [r for r in runs if r["n"] == n]

        def med_range(key, fn):
            vals = [fn(r[key]) for r in rs]
            m = statistics.median(vals)
            return f"{m / 1000:.2f}" + (f" ({min(vals) / 1000:.2f}..{max(vals) / 1000:.2f})" if len(vals) > 1 else "")

        left = ", ".join(f"{r['left']} / {r['zombies']}" for r in rs)
        lingered = "/".join(f"{r['linger_ms']:.0f}" for r in rs)
        rows.append(f"| {n} | {len(rs)} | {med_range('first', min)} | {med_range('first', statistics.median)} "
                    f"| **{med_range('first', max)}** | {med_range('init', max)} "
                    f"| {statistics.median(r['teardown_ms'] for r in rs) / 1000:.2f} "
                    f"| {left} | {lingered} |")
        last = rs[-1]  # memory: the last rep of this N
        procs = sorted(set(last["nprocs"]))
        mrows.append(f"| {n} | {'/'.join(map(str, procs))} | {mib(statistics.median(last['rss']))} "
                     f"({mib(min(last['rss']))}..{mib(max(last['rss']))}) | {mib(statistics.median(last['pss']))} "
                     f"| {mib(sum(last['rss']))} | {mib(sum(last['pss']))} "
                     f"| {mib(last['avail_drop'])} ({mib(last['avail_drop'] / n)}) |")
    tree = ", ".join(runs[-1]["tree_comms"])

    ph = fl["phases"]
    frows = ["| phase | calls | p50 ms | p90 ms | p99 ms | max ms | phase wall s | peak tree VmRSS MiB | flood MB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    label = {"before": "no flood (before)", "during": f"flood: `timeout {a.flood_seconds} yes flood` in session flood",
             "after": "no flood (after C-c)"}
    for k in ("before", "during", "after"):
        lat = ph[k]["lat"]
        rate = f"{ph[k]['rate']:.1f}" if k == "during" else ""
        frows.append(f"| {label[k]} | {len(lat)} | {q(lat, 50):.2f} | {q(lat, 90):.2f} | {q(lat, 99):.2f} "
                     f"| {max(lat):.2f} | {ph[k]['wall']:.2f} | {mib(ph[k]['peak_kb'])} | {rate} |")
    names = sorted({n for k in ph for n in ph[k]["cpu"]})
    crows = ["| process | " + " | ".join(label[k].split(':')[0] for k in ("before", "during", "after")) + " |",
             "|---|" + "---:|" * 3]
    for n in names:
        crows.append(f"| {n} | " + " | ".join(f"{ph[k]['cpu'].get(n, 0):.0f}%" for k in ("before", "during", "after")) + " |")

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""# scale: many `sandmux serve` instances; one instance under an output flood

{now}; uid {os.getuid()}.
Machine: {meta['machine']}.
Versions: {meta['versions']}.

## N instances started at once

Each instance: `sandmux serve -w <own workspace> --audit-log <own file>` (default profile), driven by its own
`mcp.Client(stdio_client(...), mode="legacy")` in one Python process (asyncio). Times from the first spawn;
"answered" = the `list_panes` result arrived (initialize, then `tools/call list_panes`). Medians over
{a.reps} rep(s), range in parentheses.

{chr(10).join(rows)}

Memory with all N instances up and idle (the last rep), per instance = the serve process and all its descendants:

{chr(10).join(mrows)}

Instance processes left when their serve process had exited (all runs, by state and name):
{', '.join(f'{k} x{v}' for k, v in sorted(LINGERED.items())) or 'none'}. An unreaped (zombie) process has already
exited; it stays in /proc until its new parent (pid 1 here) reaps it.

One instance's process tree: {tree}. VmRSS counts shared pages (the sandmux and tmux
binaries, libc) once per process, so its sum over N instances overstates the total; Pss divides each shared
page among the processes that map it, and the MemAvailable drop is the machine's own view (noisy: other work
on the machine changes it too).

## list_panes under an output flood (one instance)

One client, one `sandmux serve`; session `flood` has one pane running `timeout {a.flood_seconds} yes flood`
(stopped with C-c once the calls are done); {a.calls} sequential `list_panes {{"session_name": "main"}}` calls per
phase, client wall clock around `await client.call_tool(...)`. C-c to quiet pane: {fl['stop_s']:.2f} s.
After the client closed stdin and serve exited, {fl['left']} of the instance's processes were still running and
{fl['zombies']} had exited but were unreaped (all reaped {fl['linger_ms']:.0f} ms later).

{chr(10).join(frows)}

flood MB/s: bytes `yes` wrote into the pane's terminal during the phase (`wchar` in /proc/PID/io) per second;
tmux reads the terminal only as fast as it can process it, so this is the rate the pane actually produced.

CPU use of the instance's processes during each phase (% of one core, from /proc/PID/stat):

{chr(10).join(crows)}
"""


def summary(runs: list[dict], fl: dict, a, meta: dict) -> dict:
    """The report's headline figures (the same reductions as its tables), for bench/run."""
    out: dict = {"benchmark": "scale", "sizes": a.sizes, "reps": a.reps, "calls": a.calls,
                 "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": meta["machine"], "versions": meta["versions"], "startup": {}, "memory": {}, "flood": {}}
    for n in a.sizes:
        rs = [r for r in runs if r["n"] == n]
        out["startup"][str(n)] = {
            # medians over the reps of: the last / first / median instance's list_panes answer, s
            "all_answered_s": statistics.median(max(r["first"]) for r in rs) / 1000,
            "first_answered_s": statistics.median(min(r["first"]) for r in rs) / 1000,
            "median_answered_s": statistics.median(statistics.median(r["first"]) for r in rs) / 1000,
            "teardown_s": statistics.median(r["teardown_ms"] for r in rs) / 1000,
        }
        last = rs[-1]  # memory: the last rep of this N, as in the table
        out["memory"][str(n)] = {
            "rss_mib_per_instance": statistics.median(last["rss"]) / 1024,
            "pss_mib_per_instance": statistics.median(last["pss"]) / 1024,
            "rss_mib_sum": sum(last["rss"]) / 1024, "pss_mib_sum": sum(last["pss"]) / 1024,
            "avail_drop_mib": last["avail_drop"] / 1024,
        }
    for k, ph in fl["phases"].items():
        lat = ph["lat"]
        out["flood"][k] = {"p50": q(lat, 50), "p90": q(lat, 90), "p99": q(lat, 99), "max": max(lat), "n": len(lat),
                           "peak_tree_rss_mib": ph["peak_kb"] / 1024, "flood_mb_s": ph["rate"]}
    return out


# --------------------------------------------------------------------------

async def amain(a) -> int:
    errdir = os.path.join(a.tmp_dir, "stderr")
    os.makedirs(errdir)
    meta = dict(machine=os.environ.get("BENCH_MACHINE", "?"),
                versions=os.environ.get("BENCH_VERSIONS", "?")
                + f"; mcp {md.version('mcp')}, anyio {md.version('anyio')}, Python {platform.python_version()}")
    runs = []
    try:
        for rep in range(a.reps):
            for n in a.sizes:
                log(f"start-up: N={n} (rep {rep + 1}/{a.reps})")
                r = await scale_once(n, rep, a, errdir)
                runs.append(r)
                log(f"start-up: N={n}: all answered after {max(r['first']) / 1000:.2f} s; tree VmRSS median "
                    f"{mib(statistics.median(r['rss']))} MiB; teardown {r['teardown_ms'] / 1000:.2f} s")
                await anyio.sleep(1.0)
        log(f"flood: {a.calls} list_panes calls per phase")
        fl = await flood(a, errdir)
    except BaseException as e:  # noqa: BLE001 (task groups raise nested ExceptionGroups)
        def leaves(x: BaseException) -> list[BaseException]:
            subs = getattr(x, "exceptions", None)
            return [y for s in subs for y in leaves(s)] if subs else [x]
        errs = leaves(e)
        log(f"error: {len(errs)} failure(s):")
        for sub in errs[:10]:
            log("  " + "".join(traceback.format_exception_only(type(sub), sub)).strip())
        for f in sorted(os.listdir(errdir)):
            p = os.path.join(errdir, f)
            if os.path.getsize(p):
                with open(p, errors="replace") as fh:
                    log(f"{f}: {fh.read()[-600:]}")
        return 1
    doc = report(runs, fl, a, meta)
    print(doc)
    os.makedirs(os.path.dirname(os.path.abspath(a.out_md)), exist_ok=True)
    with open(a.out_md, "w") as fh:
        fh.write(doc)
    log(f"wrote {a.out_md}")
    with open(os.path.splitext(a.out_md)[0] + ".json", "w") as fh:
        json.dump(dict(runs=runs, flood=fl["phases"], summary=summary(runs, fl, a, meta)), fh)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,25,50")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--flood-seconds", type=int, default=60)
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--tmp-dir", required=True, help="an empty directory this run owns")
    ap.add_argument("--out-md", required=True)
    a = ap.parse_args()
    a.sizes = [int(x) for x in a.sizes.split(",")]
    a.sandmux_bin = os.path.realpath(a.sandmux_bin)
    a.tmp_dir = os.path.realpath(a.tmp_dir)
    rc = anyio.run(amain, a)
    time.sleep(0.5)
    left = sorted(set(sandmux_procs_under(a.tmp_dir)) | set(survivors()))
    if left:
        log("error: instance processes still running: " + ", ".join(f"{p} ({comm(p)})" for p in left))
        return 1
    log(f"checked: none of the {len(SEEN)} instance processes seen is still running")
    return rc


if __name__ == "__main__":
    sys.exit(main())
