#!/usr/bin/env python3
"""MCP tool-call latency: sandmux vs libtmux-mcp, both driven by the official
Python MCP SDK client over stdio, plus raw tmux floors.

Run through bench/mcp-latency, which builds sandmux, makes the venv (mcp,
libtmux-mcp, matplotlib) and passes the paths. Measures, alternating the
servers round by round so machine noise hits both:

  1. spawn -> initialize result, and spawn -> first tool result
     (initialize, tools/list, list_sessions), a fresh server per sample
  2. MCP ping, list_panes, capture_pane, send_keys (one long-lived server each)
  3. run_command `echo hi` (exit status checked)
  4. wait reaction: the pane prints a marker with $EPOCHREALTIME while a
     wait_for_text call is waiting for it; reaction = time the call returned
     (client wall clock) - time the pane printed
  5. peak RSS of each server's process tree (VmRSS of the server pid and all
     descendants, summed, sampled every 50 ms during phase 2-4)

Floors: the same list-panes / capture-pane commands over one bare `tmux -C`
control connection, and as one `tmux` CLI process per command (what libtmux
does), each against a private tmux server.

Times are never asserted on. Exit status 1 means something failed to run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from lines import Lines

warnings.filterwarnings("ignore")  # send_ping's deprecation warning (legacy mode is what we use)

PERMS3 = [(0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1), (2, 0, 1), (1, 0, 2)]
# sandmux's drift probes (src/mcp/drift.rs), run before every call and after every mutating one
DRIFT_PROBES = [
    "show-hooks -g", "show-hooks -gw", "show-hooks -gp", "show-options -s command-alias",
    "show-options -g default-shell", "show-options -g default-command", "show-options -g status",
    "show-options -g lock-command", "show-options -g lock-after-time", "show-options -gw allow-passthrough",
    "show-options -s set-clipboard", "show-options -g update-environment",
]
WAIT_DELAY = 0.3  # seconds the pane sleeps before printing the wait marker


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"mcp-latency: {msg}", file=sys.stderr, flush=True)


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
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo.extend(children(p))
    return seen


def mem_kb(pid: int, pss: bool) -> int:
    """VmRSS (or Pss from smaps_rollup) of one process in KiB; 0 if it is gone."""
    path, key = (f"/proc/{pid}/smaps_rollup", "Pss:") if pss else (f"/proc/{pid}/status", "VmRSS:")
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0  # gone, or a kernel thread


class RssSampler(threading.Thread):
    """Samples named groups of processes every `interval` s: the sums of VmRSS
    and of Pss over each group's processes."""

    def __init__(self, groups: dict[str, tuple[list[int], bool]], interval: float = 0.05):
        # groups: name -> (root pids, include descendants)
        super().__init__(daemon=True)
        self.groups = groups
        self.interval = interval
        self.rss = {k: [] for k in groups}
        self.pss = {k: [] for k in groups}
        self.samples = 0
        self._halt = threading.Event()

    def sample(self) -> None:
        for name, (roots, tree) in self.groups.items():
            pids: set[int] = set()
            for r in roots:
                pids.update(descendants(r) if tree else [r])
            self.rss[name].append(sum(mem_kb(p, False) for p in pids))
            self.pss[name].append(sum(mem_kb(p, True) for p in pids))
        self.samples += 1

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()

    def summary(self) -> dict:
        out = {"_samples": self.samples}
        for k in self.groups:
            out[f"{k}|rss_peak"] = max(self.rss[k]) / 1024
            out[f"{k}|rss_median"] = statistics.median(self.rss[k]) / 1024
            out[f"{k}|pss_median"] = statistics.median(self.pss[k]) / 1024
        return out


# --------------------------------------------------------------------------
# raw tmux floors

class ControlConn:
    """One bare `tmux -C` client: write a command line, read its %begin/%end block."""

    def __init__(self, sock: str, session: str):
        self.p = subprocess.Popen(
            ["tmux", "-S", sock, "-C", "attach-session", "-t", session, "-f", "no-output"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
        )
        self.lines = Lines(self.p.stdout.fileno(), "tmux -C connection", BenchError)
        self.cmd("display-message -p sync")  # the attach done; notifications are skipped

    def _line(self) -> bytes:
        return self.lines.next()

    def cmd(self, line: str) -> list[bytes]:
        self.p.stdin.write(line.encode() + b"\n")
        return self._block(line)

    def cmd_many(self, lines: list[str]) -> None:
        """Pipelined: all lines in one write, then every reply (as sandmux's drift check does)."""
        self.p.stdin.write("".join(l + "\n" for l in lines).encode())
        for line in lines:
            self._block(line)

    def _block(self, line: str) -> list[bytes]:
        # Skip notifications until our block starts, then collect until its end.
        while True:
            ln = self._line()
            # Only this client's commands have flags 1: the attach's own
            # block (flags 0) can come after the first command's reply.
            if ln.startswith(b"%begin ") and ln.split()[3:4] == [b"1"]:
                num = ln.split()[2]
                break
        body = []
        while True:
            ln = self._line()
            if ln.startswith((b"%end ", b"%error ")) and ln.split()[2] == num:
                if ln.startswith(b"%error "):
                    raise BenchError(f"tmux -C {line!r}: {b' '.join(body).decode(errors='replace')}")
                return body
            body.append(ln)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.p.stdin.close()
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class RawRpc:
    """The same server spawned again and spoken to with bare newline-delimited
    JSON-RPC (no SDK): the difference to the SDK figures is client overhead."""

    def __init__(self, params: StdioServerParameters, errlog):
        keep = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")  # what the SDK passes on by default
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(params.env or {})
        self.p = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=errlog, env=env, start_new_session=True, bufsize=0)
        self.lines = Lines(self.p.stdout.fileno(), f"{params.command}: stdout (raw JSON-RPC)", BenchError)
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "mcp-latency-raw", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, msg: dict) -> None:
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")

    def _line(self) -> bytes:
        return self.lines.next()

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        rid = self.next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            ln = self._line().strip()
            if not ln:
                continue
            msg = json.loads(ln)
            if msg.get("id") == rid and ("result" in msg or "error" in msg):
                if "error" in msg or msg["result"].get("isError"):
                    raise BenchError(f"raw {method}: {json.dumps(msg)[:400]}")
                return msg["result"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.p.stdin.close()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def tmux(sock: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["tmux", "-S", sock, *args], capture_output=True, text=True, timeout=10)
    if check and p.returncode != 0:
        raise BenchError(f"tmux -S {sock} {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def start_private_tmux(sock: str, session: str) -> int:
    # A plain bash without rc files (root's rc here may be slow or print), 200x50 like sandmux's pane.
    tmux(sock, "-f", "/dev/null", "new-session", "-d", "-s", session, "-x", "200", "-y", "50",
         "env PS1='bench$ ' bash --norc --noprofile")
    tmux(sock, "set-option", "-g", "history-limit", "2000")
    return int(tmux(sock, "display-message", "-p", "#{pid}").stdout.strip())


# --------------------------------------------------------------------------
# the two MCP servers

class Server:
    name = ""
    label = ""

    def __init__(self, tmpdir: str, errlog):
        self.tmpdir = tmpdir
        self.errlog = errlog
        self.spawn_count = 0

    def params(self) -> StdioServerParameters:
        raise NotImplementedError

    def client(self) -> Client:
        return Client(stdio_client(self.params(), errlog=self.errlog), mode="legacy", cache=None)

    # argument shapes differ a little between the two
    def pane_of(self, listing: dict) -> str:
        raise NotImplementedError

    def send_text(self, pane: str, text: str, enter: bool) -> dict:
        raise NotImplementedError

    def clear_line(self, pane: str) -> dict:
        raise NotImplementedError

    def run_ok(self, res: dict) -> bool:
        raise NotImplementedError


class Sandmux(Server):
    name, label = "sandmux", "sandmux"

    def __init__(self, tmpdir, errlog, binary):
        super().__init__(tmpdir, errlog)
        self.binary = binary
        self.ws = os.path.realpath(tempfile.mkdtemp(prefix="ws-", dir=tmpdir))
        self.host = tempfile.mkdtemp(prefix="audit-", dir=tmpdir)

    def params(self):
        self.spawn_count += 1
        audit = os.path.join(self.host, f"audit-{self.spawn_count}.jsonl")
        return StdioServerParameters(command=self.binary, args=["serve", "-w", self.ws, "--audit-log", audit,
                                         "--toolsets", "inspect,manage,execute,teardown"])

    def pane_of(self, listing):
        return listing["panes"][0]["pane_id"]

    def send_text(self, pane, text, enter):
        return {"pane_id": pane, "text": text, "enter": enter}

    def clear_line(self, pane):
        return {"pane_id": pane, "keys": ["C-u"]}

    def run_ok(self, res):
        return res.get("exit_status") == 0 and res.get("status") == "completed" and "hi" in res.get("output", "")


class LibtmuxMcp(Server):
    name, label = "libtmux-mcp", "libtmux-mcp"

    def __init__(self, tmpdir, errlog, script, sock):
        super().__init__(tmpdir, errlog)
        self.script = script
        self.sock = sock

    def params(self):
        self.spawn_count += 1
        return StdioServerParameters(command=self.script, args=[], env={"LIBTMUX_SOCKET_PATH": self.sock,
                                         "LIBTMUX_TOOLSETS": "inspect,manage,execute,teardown"})

    def pane_of(self, listing):
        return listing["result"][0]["pane_id"]

    def send_text(self, pane, text, enter):
        return {"pane_id": pane, "keys": text, "enter": enter, "literal": True}

    def clear_line(self, pane):
        return {"pane_id": pane, "keys": "C-u", "enter": False}

    def run_ok(self, res):
        return res.get("exit_status") == 0 and not res.get("timed_out") and "hi" in res.get("output", [])


async def call(c: Client, server: Server, tool: str, args: dict) -> dict:
    r = await c.call_tool(tool, args)
    if r.is_error:
        text = r.content[0].text if r.content else repr(r)
        raise BenchError(f"{server.name}: {tool}({json.dumps(args)}) failed: {text}")
    return r.structured_content or {}


async def timed(c, server, tool, args) -> tuple[float, dict]:
    t0 = time.perf_counter_ns()
    r = await c.call_tool(tool, args)
    t1 = time.perf_counter_ns()
    if r.is_error:
        text = r.content[0].text if r.content else repr(r)
        raise BenchError(f"{server.name}: {tool}({json.dumps(args)}) failed: {text}")
    return (t1 - t0) / 1e6, (r.structured_content or {})


def server_pid_new(before: set[int]) -> int:
    new = set(children(os.getpid())) - before
    if len(new) != 1:
        raise BenchError(f"could not tell the server's pid (new children: {sorted(new)})")
    return new.pop()


# --------------------------------------------------------------------------
# measurements

class Samples(dict):
    def add(self, key: str, ms: float) -> None:
        self.setdefault(key, []).append(ms)


async def spawn_once(server: Server) -> tuple[float, float]:
    """(spawn -> initialize result, spawn -> first list_sessions result) in ms."""
    t0 = time.perf_counter_ns()
    async with server.client() as c:
        t_init = time.perf_counter_ns()
        await c.list_tools()
        await call(c, server, "list_sessions", {})
        t_first = time.perf_counter_ns()
    return (t_init - t0) / 1e6, (t_first - t0) / 1e6


async def wait_reaction(c, server: Server, pane: str, tag: str, extra: dict) -> tuple[float | None, dict]:
    """Type `sleep; printf MARK $EPOCHREALTIME`, then wait_for_text for the marker.

    Returns (ms from the pane's print to the wait's return, or None if the
    wait began after the print), and the wait's result.
    """
    marker = f"WM-{tag}-"
    line = f"sleep {WAIT_DELAY}; printf 'WM-%s-%s\\n' {tag} \"$EPOCHREALTIME\""
    await call(c, server, "send_keys", server.send_text(pane, line, True))
    started = time.time()
    res = await call(c, server, "wait_for_text", {"pane_id": pane, "patterns": [marker], "timeout": 5, **extra})
    returned = time.time()
    pat = re.escape(marker) + r"([0-9]+\.[0-9]+)"
    m = re.search(pat, json.dumps(res))
    if not m:  # the result did not quote the line: read it from the screen (untimed)
        r = await c.call_tool("capture_pane", {"pane_id": pane})
        text = "\n".join(getattr(x, "text", "") for x in r.content) + json.dumps(r.structured_content)
        m = re.search(pat, text)
    if not m:
        raise BenchError(f"{server.name}: wait marker {marker} not on the screen after wait_for_text: {json.dumps(res)[:400]}")
    printed = float(m.group(1))
    found = res.get("found", res.get("outcome") in ("matched", "found"))
    if not found:
        raise BenchError(f"{server.name}: wait_for_text did not report the marker: {json.dumps(res)[:400]}")
    if printed < started:
        return None, res
    return (returned - printed) * 1e3, res


async def per_call_round(c, server: Server, pane: str, raw: RawRpc, s: Samples, r: int, record: bool) -> None:
    add = s.add if record else (lambda k, v: None)
    t0 = time.perf_counter_ns()
    raw.request("ping", {})
    add(f"raw_ping/{server.name}", (time.perf_counter_ns() - t0) / 1e6)
    t0 = time.perf_counter_ns()
    raw.request("tools/call", {"name": "list_panes", "arguments": {}})
    add(f"raw_list_panes/{server.name}", (time.perf_counter_ns() - t0) / 1e6)
    await call(c, server, "clear_pane", {"pane_id": pane})
    t0 = time.perf_counter_ns()
    await c.send_ping()
    add(f"ping/{server.name}", (time.perf_counter_ns() - t0) / 1e6)
    ms, _ = await timed(c, server, "list_panes", {})
    add(f"list_panes/{server.name}", ms)
    ms, _ = await timed(c, server, "capture_pane", {"pane_id": pane})
    add(f"capture_pane/{server.name}", ms)
    ms, _ = await timed(c, server, "send_keys", server.send_text(pane, "echo typed-not-run", False))
    add(f"send_keys/{server.name}", ms)
    await call(c, server, "send_keys", server.clear_line(pane))
    ms, res = await timed(c, server, "run_command", {"pane_id": pane, "command": "echo hi"})
    if not server.run_ok(res):
        raise BenchError(f"{server.name}: run_command `echo hi` did not report exit 0 with output 'hi': {json.dumps(res)[:400]}")
    add(f"run_command/{server.name}", ms)
    variants = [("wait", {})]
    if server.name == "libtmux-mcp":
        variants.append(("wait_fast", {"interval": 0.01}))
    for v, (key, extra) in enumerate(variants):
        ms, _ = await wait_reaction(c, server, pane, f"{r}{'ab'[v]}{server.name[0]}", extra)
        if ms is None:
            add(f"{key}_late/{server.name}", 1)
        else:
            add(f"{key}/{server.name}", ms)


def floor_round(ctl: ControlConn, raw_sock: str, s: Samples, record: bool) -> None:
    add = s.add if record else (lambda k, v: None)
    for key, line in (("list_panes", "list-panes -a"), ("capture_pane", "capture-pane -p -t %0")):
        t0 = time.perf_counter_ns()
        ctl.cmd(line)
        add(f"{key}/tmux -C", (time.perf_counter_ns() - t0) / 1e6)
    t0 = time.perf_counter_ns()
    ctl.cmd_many(DRIFT_PROBES)
    add("drift/tmux -C", (time.perf_counter_ns() - t0) / 1e6)
    t0 = time.perf_counter_ns()
    for line in DRIFT_PROBES:
        ctl.cmd(line)
    add("drift_seq/tmux -C", (time.perf_counter_ns() - t0) / 1e6)
    for key, argv in (("list_panes", ["list-panes", "-a"]), ("capture_pane", ["capture-pane", "-p", "-t", "%0"])):
        t0 = time.perf_counter_ns()
        p = subprocess.run(["tmux", "-S", raw_sock, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        add(f"{key}/tmux CLI", (time.perf_counter_ns() - t0) / 1e6)
        if p.returncode != 0:
            raise BenchError(f"tmux {' '.join(argv)}: {p.stderr.decode(errors='replace').strip()}")


# --------------------------------------------------------------------------
# report

def pct(xs: list[float], q: int) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def fmt(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


ROWS = [
    # key, label, sandmux goal (ms or MB), floor key prefix
    ("spawn_init", "spawn → initialize result", None),
    ("spawn_first", "spawn → first tool result (initialize, tools/list, list_sessions)", ("≤", 100)),
    ("ping", "MCP ping (protocol + client floor, no tool)", None),
    ("raw_ping", "MCP ping, bare JSON-RPC over stdio (no SDK client)", None),
    ("list_panes", "list_panes", ("≤", 1)),
    ("raw_list_panes", "list_panes, bare JSON-RPC over stdio (no SDK client)", None),
    ("capture_pane", "capture_pane", ("≤", 1)),
    ("drift_seq", "raw only: sandmux's 12 drift probes, one round trip each over `tmux -C` (one drift check)", None),
    ("drift", "raw only: the same 12 probes pipelined in one write", None),
    ("send_keys", "send_keys (text, no Enter)", ("≤", 1)),
    ("run_command", "run_command `echo hi`", ("≤", 10)),
    ("wait", "wait reaction (pane prints → wait_for_text returns)", ("≤", 5)),
    ("wait_fast", "wait reaction, libtmux-mcp with interval=0.01 (its minimum)", None),
]
RSS_GOAL_MB = 20  # sandmux goal for the peak RSS of its process tree (VmRSS sum)


def build_report(s: Samples, rss: dict, args, meta: dict) -> tuple[str, dict]:
    A, B = "sandmux", "libtmux-mcp"

    def st(key, who):
        xs = s.get(f"{key}/{who}")
        if not xs:
            return None, None, 0
        return statistics.median(xs), pct(xs, 99), len(xs)

    lines = [
        "| measurement | sandmux median | sandmux p99 | libtmux-mcp median | libtmux-mcp p99 | libtmux-mcp / sandmux (median) | libtmux-mcp / sandmux (p99) | raw tmux floor median (p99) | sandmux goal |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    chart = {}
    for key, label, goal in ROWS:
        am, ap, an = st(key, A)
        bm, bp, bn = st(key, B)
        if key == "wait_fast":
            am2 = st("wait", A)[0]
            ratio_m = f"{bm / am2:.1f}x" if bm and am2 else "—"
            ratio_p = "—"
        else:
            ratio_m = f"{bm / am:.1f}x" if am and bm else "—"
            ratio_p = f"{bp / ap:.1f}x" if ap and bp else "—"
        floor = "—"
        if key in ("list_panes", "capture_pane"):
            cm, cp, _ = st(key, "tmux -C")
            lm, lp, _ = st(key, "tmux CLI")
            cmd = "list-panes -a" if key == "list_panes" else "capture-pane -p"
            floor = f"`tmux -C` {cmd}: {fmt(cm)} ({fmt(cp)}); `tmux` CLI process: {fmt(lm)} ({fmt(lp)})"
            chart[key] = {A: am, B: bm, "tmux -C": cm, "tmux CLI": lm}
        elif key in ("drift", "drift_seq"):
            cm, cp, _ = st(key, "tmux -C")
            floor = f"`tmux -C` 12 commands: {fmt(cm)} ({fmt(cp)})"
            chart[key] = {"tmux -C": cm}
        elif key != "wait_fast":
            chart[key] = {A: am, B: bm}
        else:
            chart[key] = {B: bm}
        g = "—"
        if goal and am is not None:
            g = f"{goal[0]} {goal[1]} ms: {'met' if am <= goal[1] else 'missed'}"
        lines.append(f"| {label} | {fmt(am)} | {fmt(ap)} | {fmt(bm)} | {fmt(bp)} | {ratio_m} | {ratio_p} | {floor} | {g} |")

    def rrow(label, a, b, goal=None):
        ratio = f"{b / a:.1f}x" if a and b else "—"
        g = "—"
        if goal is not None and a is not None:
            g = f"≤ {goal} MB: {'met' if a <= goal else 'missed'}"
        lines.append(f"| {label} | {fmt(a)} MB | — | {fmt(b)} MB | — | {ratio} | — | — | {g} |")
    A_, B_ = "sandmux tree", "libtmux-mcp tree"
    rrow("peak RSS, server process tree (VmRSS of server pid + descendants, summed)", rss[f"{A_}|rss_peak"], rss[f"{B_}|rss_peak"], RSS_GOAL_MB)
    rrow("median RSS over the samples, server process tree", rss[f"{A_}|rss_median"], rss[f"{B_}|rss_median"])
    rrow("median PSS over the samples, server process tree (shared pages split, not double-counted)", rss[f"{A_}|pss_median"], rss[f"{B_}|pss_median"])
    rrow("peak RSS, server process alone", rss["sandmux alone|rss_peak"], rss["libtmux-mcp alone|rss_peak"])
    rrow("peak RSS, server tree + the tmux server it drives (sandmux's is in its tree)", rss[f"{A_}|rss_peak"], rss["libtmux-mcp tree + tmux|rss_peak"])
    chart["rss"] = {
        "sandmux": rss[f"{A_}|rss_peak"], "sandmux serve alone": rss["sandmux alone|rss_peak"],
        "libtmux-mcp": rss[f"{B_}|rss_peak"], "libtmux-mcp alone": rss["libtmux-mcp alone|rss_peak"],
        "libtmux-mcp + tmux": rss["libtmux-mcp tree + tmux|rss_peak"],
    }
    table = "\n".join(lines)

    late = {w: sum(s.get(f"{k}_late/{w}", [])) for k in ("wait", "wait_fast") for w in (A, B)}
    n = {k: len(v) for k, v in s.items()}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = f"""# MCP latency: sandmux vs libtmux-mcp

{now}. {args.rounds} rounds per measurement (after {args.warmup} warm-up rounds), alternating the servers
round by round; spawn rounds: {args.spawn_rounds}. Times in ms (client wall clock around `await client.call_tool(...)`,
so every figure includes the Python SDK client, JSON-RPC over stdio and the server).
Machine: {meta['machine']}.
Versions: {meta['versions']}.

{table}

- Samples per cell: {min(v for k, v in n.items() if not '_late' in k)}–{max(v for k, v in n.items() if not '_late' in k)}.
  Wait samples dropped because the wait call began after the pane printed: {sum(late.values())}.
- Both servers are driven by the same client: `mcp.Client(stdio_client(StdioServerParameters(...)), mode="legacy")`.
- sandmux: `{meta['sandmux_cmd']}` (its own sandboxed tmux server, started by the spawn itself).
  libtmux-mcp: `{meta['libtmux_cmd']}` against a private, already running tmux server
  (`tmux -S <tmp>/lib.sock -f /dev/null new-session -d -s main -x 200 -y 50 'bash --norc --noprofile'`),
  so its spawn figure does not include starting tmux.
- send_keys types `echo typed-not-run` without Enter (sandmux `{{"text": ..., "enter": false}}`,
  libtmux-mcp `{{"keys": ..., "enter": false, "literal": true}}`); the line is then cleared with C-u (untimed).
  Each round starts with an untimed `clear_pane`, so capture_pane reads a near-empty 200x50 screen on both.
- Wait reaction: the pane runs `sleep {WAIT_DELAY}; printf 'WM-%s-%s\\n' <tag> "$EPOCHREALTIME"`, typed (untimed)
  just before `wait_for_text {{"patterns": ["WM-<tag>-"]}}`; the figure is the client's `time.time()` when the call
  returned minus the pane's printed timestamp. libtmux-mcp polls (`interval` default 0.05 s); sandmux ignores
  `interval` (event-driven).
- Raw floors, against a private tmux server with the same 200x50 bash pane: `tmux -C` = one command line written to a
  long-lived `tmux -C attach -f no-output` client, reply read up to its `%end`; `tmux` CLI = a fresh `tmux -S sock
  <command>` process per command (fork + exec + connect), which is how libtmux runs every tmux command.
- Bare JSON-RPC rows: a second instance of each server, spawned the same way and sent newline-delimited JSON-RPC
  (`initialize` with protocol 2025-06-18, then `ping` / `tools/call`) from a blocking write + read, no SDK. Their
  difference to the SDK rows is the Python client's own cost (pydantic models, output-schema validation, anyio).
- RSS: VmRSS summed over the server pid and all its descendants (sandmux: serve, the sandbox init processes, the
  sandboxed tmux server, its panes, the `tmux -C` control and watcher clients; libtmux-mcp: the Python process and any
  `tmux` child it has at that moment), sampled every 50 ms during the per-call rounds ({rss['_samples']} samples).
  A sum of VmRSS counts shared pages once per process: a libtmux-mcp child caught between fork and exec shows the
  whole Python image again, so its tree peak is roughly twice its median. PSS (from `smaps_rollup`) splits shared
  pages instead; it is given as a median because the processes of one sample are read one after another, so a fork
  between two reads can count the same pages twice even in PSS. The last RSS row adds the private tmux server tree libtmux-mcp drives, for a like-for-like total.
"""
    return doc, chart


def build_json(s: Samples, rss: dict, args, meta: dict) -> dict:
    """The report's figures, machine-readable (bench/out/mcp-latency.json, read by bench/run)."""
    ms: dict[str, dict] = {}
    for key, _, _ in ROWS:
        for who in ("sandmux", "libtmux-mcp", "tmux -C", "tmux CLI"):
            xs = s.get(f"{key}/{who}")
            if xs:
                ms.setdefault(key, {})[who] = {"median": statistics.median(xs), "p99": pct(xs, 99), "n": len(xs)}
    mem: dict[str, dict] = {}
    for k, v in rss.items():
        if "|" in k:
            group, fig = k.split("|")
            mem.setdefault(group, {})[fig] = v
    return {
        "benchmark": "mcp-latency",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds, "spawn_rounds": args.spawn_rounds,
        "machine": meta["machine"], "versions": meta["versions"],
        "labels": {key: label for key, label, _ in ROWS},
        "ms": ms,
        "goals_ms": {key: {"op": goal[0], "value": goal[1]} for key, _, goal in ROWS if goal},
        "mem_mb": mem, "mem_samples": rss["_samples"],
        "goals_mb": {"sandmux tree|rss_peak": {"op": "≤", "value": RSS_GOAL_MB}},
        "wait_late": {k: len(v) for k, v in s.items() if "_late" in k},
        "chart": os.path.abspath(args.out_png),
    }


def plot(chart: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [k for k, _, _ in ROWS if k in chart]
    names = {k: lbl for k, lbl, _ in ROWS}
    short = {
        "spawn_init": "spawn → initialize",
        "spawn_first": "spawn → first tool result",
        "ping": "MCP ping",
        "raw_ping": "ping, bare JSON-RPC",
        "list_panes": "list_panes",
        "raw_list_panes": "list_panes, bare JSON-RPC",
        "capture_pane": "capture_pane",
        "drift_seq": "12 drift probes, sequential (raw)",
        "drift": "12 drift probes, pipelined (raw)",
        "send_keys": "send_keys",
        "run_command": "run_command echo hi",
        "wait": "wait reaction",
        "wait_fast": "wait reaction, libtmux interval=0.01",
    }
    series = ["sandmux", "libtmux-mcp", "tmux -C", "tmux CLI"]
    colors = {"sandmux": "#1f77b4", "libtmux-mcp": "#ff7f0e", "tmux -C": "#2ca02c", "tmux CLI": "#9467bd",
              "libtmux-mcp + tmux": "#ffbb78", "sandmux serve alone": "#aec7e8", "libtmux-mcp alone": "#ffd8a8"}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(18, 7), gridspec_kw={"width_ratios": [5, 1.2]})
    width = 0.2
    for i, k in enumerate(order):
        present = [sr for sr in series if chart[k].get(sr)]
        for j, sr in enumerate(present):
            x = i + (j - (len(present) - 1) / 2) * width
            v = chart[k][sr]
            ax.bar(x, v, width, color=colors[sr], label=sr if sr not in ax.get_legend_handles_labels()[1] else None)
            ax.text(x, v * 1.08, fmt(v), ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([short.get(k, names[k]) for k in order], fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel("median ms (log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", which="both", alpha=0.3)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 3)

    rs = chart["rss"]
    keys = ["sandmux", "sandmux serve alone", "libtmux-mcp", "libtmux-mcp alone", "libtmux-mcp + tmux"]
    labels = ["sandmux tree", "sandmux serve only", "libtmux-mcp tree", "libtmux-mcp only", "libtmux-mcp + its tmux"]
    for i, k in enumerate(keys):
        ax2.bar(i, rs[k], 0.7, color=colors[k])
        ax2.text(i, rs[k] * 1.01, f"{rs[k]:.1f}", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(keys)))
    ax2.set_xticklabels(labels, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
    ax2.set_ylabel("peak RSS, MB")
    ax2.set_title("peak memory (sum of VmRSS)", fontsize=10)
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------

async def main_async(args, meta: dict) -> int:
    tmpdir = args.tmp_dir
    errlog = open(os.path.join(tmpdir, "servers-stderr.log"), "w")
    lib_sock = os.path.join(tmpdir, "lib.sock")
    raw_sock = os.path.join(tmpdir, "raw.sock")
    ctl = None
    raws: dict[str, RawRpc] = {}
    s = Samples()
    try:
        lib_tmux_pid = start_private_tmux(lib_sock, "main")
        start_private_tmux(raw_sock, "raw")
        servers = [Sandmux(tmpdir, errlog, args.sandmux_bin), LibtmuxMcp(tmpdir, errlog, args.libtmux_mcp, lib_sock)]

        # 1. spawn -> first result, a fresh server each time
        total = args.spawn_warmup + args.spawn_rounds
        log(f"spawn: {args.spawn_warmup} warm-up + {args.spawn_rounds} rounds")
        for r in range(total):
            order = servers if r % 2 == 0 else servers[::-1]
            for srv in order:
                init_ms, first_ms = await spawn_once(srv)
                if r >= args.spawn_warmup:
                    s.add(f"spawn_init/{srv.name}", init_ms)
                    s.add(f"spawn_first/{srv.name}", first_ms)
            if (r + 1) % 25 == 0:
                log(f"spawn: {r + 1}/{total}")

        # 2-5. long-lived servers
        async with contextlib.AsyncExitStack() as stack:
            conns, panes, pids = {}, {}, {}
            for srv in servers:
                before = set(children(os.getpid()))
                c = await stack.enter_async_context(srv.client())
                pids[srv.name] = server_pid_new(before)
                await c.list_tools()
                panes[srv.name] = srv.pane_of(await call(c, srv, "list_panes", {}))
                conns[srv.name] = c
            for srv in servers:
                raws[srv.name] = RawRpc(srv.params(), errlog)
            ctl = ControlConn(raw_sock, "raw")
            sampler = RssSampler({
                "sandmux tree": ([pids["sandmux"]], True),
                "sandmux alone": ([pids["sandmux"]], False),
                "libtmux-mcp tree": ([pids["libtmux-mcp"]], True),
                "libtmux-mcp alone": ([pids["libtmux-mcp"]], False),
                "libtmux-mcp tree + tmux": ([pids["libtmux-mcp"], lib_tmux_pid], True),
            })
            sampler.start()
            total = args.warmup + args.rounds
            log(f"per-call: {args.warmup} warm-up + {args.rounds} rounds (sandmux pane {panes['sandmux']}, "
                f"libtmux-mcp pane {panes['libtmux-mcp']})")
            try:
                for r in range(total):
                    record = r >= args.warmup
                    for i in PERMS3[r % 6]:
                        if i == 2:
                            floor_round(ctl, raw_sock, s, record)
                        else:
                            srv = servers[i]
                            await per_call_round(conns[srv.name], srv, panes[srv.name], raws[srv.name], s, r, record)
                    if (r + 1) % 25 == 0:
                        log(f"per-call: {r + 1}/{total}")
            finally:
                sampler.stop()
            rss = sampler.summary()
    finally:
        if ctl:
            ctl.close()
        for rr in raws.values():
            rr.close()
        for sock in (lib_sock, raw_sock):
            if os.path.exists(sock):
                tmux(sock, "kill-server", check=False)
        errlog.close()

    doc, chart = build_report(s, rss, args, meta)
    print(doc)
    os.makedirs(os.path.dirname(os.path.abspath(args.out_md)), exist_ok=True)
    with open(args.out_md, "w") as fh:
        fh.write(doc)
    log(f"wrote {args.out_md}")
    plot(chart, args.out_png, f"MCP tool-call medians, {args.rounds} rounds (lower is better)")
    log(f"wrote {args.out_png}")
    out_json = os.path.splitext(args.out_md)[0] + ".json"
    with open(out_json, "w") as fh:
        json.dump(build_json(s, rss, args, meta), fh, indent=1)
        fh.write("\n")
    log(f"wrote {out_json}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="20 rounds")
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--libtmux-mcp", required=True, help="path to the libtmux-mcp console script")
    ap.add_argument("--tmp-dir", required=True, help="an empty directory this run owns (sockets, workspace, logs)")
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--sandmux-cmd-note", default="")
    a = ap.parse_args()
    if a.quick:
        a.rounds = 20
    if a.rounds < 1:
        ap.error("--rounds must be positive")
    a.warmup = min(5, a.rounds)
    # Spawns are few: libtmux-mcp takes seconds each and its median is steady
    # long before 200 (this keeps a full bench/run within 30 minutes).
    a.spawn_rounds = min(a.rounds, 60)
    a.spawn_warmup = 2

    # SIGTERM/SIGHUP -> KeyboardInterrupt, so the finally blocks clean up.
    def _stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "?"
    tmux_v = subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip()
    sm_v = subprocess.run([a.sandmux_bin, "--version"], capture_output=True, text=True).stdout.strip()
    meta = {
        "machine": os.environ.get("BENCH_MACHINE", platform.platform()),
        "versions": f"{sm_v} ({os.environ.get('BENCH_GIT', '?')}); libtmux-mcp {ver('libtmux-mcp')} "
                    f"(fastmcp {ver('fastmcp')}, libtmux {ver('libtmux')}); client mcp {ver('mcp')}; "
                    f"{tmux_v}; Python {platform.python_version()}",
        "sandmux_cmd": "sandmux serve -w <ws> --audit-log <tmp>/audit-N.jsonl --toolsets inspect,manage,execute,teardown",
        "libtmux_cmd": "LIBTMUX_SOCKET_PATH=<tmp>/lib.sock LIBTMUX_TOOLSETS=inspect,manage,execute,teardown libtmux-mcp",
    }
    try:
        return anyio.run(main_async, a, meta)
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    except BaseExceptionGroup as eg:  # the client's task groups wrap what went wrong
        bench, rest = eg.split(BenchError)
        if bench is not None:
            while isinstance(bench, BaseExceptionGroup):
                bench = bench.exceptions[0]
            log(f"FAILED: {bench}")
            return 1
        if rest is not None and rest.subgroup(KeyboardInterrupt) is not None:
            log("interrupted")
            return 130
        log(f"FAILED: {type(eg).__name__}: {eg}")
        import traceback
        traceback.print_exception(eg)
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except BaseException as e:  # an exception group from the client's task group, an OSError, ...
        log(f"FAILED: {type(e).__name__}: {e}")
        import traceback
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
