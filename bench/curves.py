#!/usr/bin/env python3
"""Scaling curves: sandmux beside libtmux-mcp (on an equal, private tmux
server) and a floor, interleaved, medians with their spread.

Every MCP server is spoken to with bare JSON-RPC (newline-delimited over
stdio, plain JSON over HTTP), so the client's own cost is small and the same
for both. Four curves:

- panes: 1, 16, 100 panes in one instance: list_panes and capture_pane, and
  one `tmux -C` round trip of the same listing (the fields and filter sandmux
  sends) and capture on a plain tmux server (the floor); CPU per call of the
  MCP server and of its tmux server.
- output: a pane prints 1, 10, 100 MB of a build log; run_command -> done for
  both servers; the floors: tmux alone (no client attached) and tmux with one
  control client reading and discarding %output with sandmux's flags. Wall,
  CPU per process (on-CPU time from schedstat), peak RSS.
- http: 1, 8, 32 clients calling list_panes for a fixed time over streamable
  HTTP (one session each): calls/s, p50, p99.
- instances: N = 1, 4, 16, 32, 64 servers started at once: time until all
  answered list_panes, PSS and processes per instance, teardown, failures.

Run through bench/curves. Times are never asserted on. Exit status 1:
something failed to run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

from lines import Lines

# The fields sandmux's list_panes asks tmux for (src/mcp/targets.rs).
PANE_FIELDS = ("session_id q:session_name window_id window_index q:window_name pane_id pane_index "
               "pane_active q:pane_title q:pane_current_command q:pane_current_path pane_width "
               "pane_height pane_pid pane_dead pane_dead_status pane_in_mode alternate_on cursor_x "
               "cursor_y history_size scroll_position pane_left pane_top pane_right pane_bottom").split()
WATCH_FLAGS = "ignore-size,pause-after=2"  # sandmux's watcher (src/tmux/hub.rs)
TOOLSETS = "inspect,manage,execute,teardown"
SHELL = "env PS1='bench$ ' bash --norc --noprofile"


class BenchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"curves: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# /proc

def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{t}/children") as fh:
                    todo.extend(int(x) for x in fh.read().split())
    return out


def on_cpu_ns(pids: list[int]) -> int:
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/task/{t}/schedstat") as fh:
                    total += int(fh.read().split()[0])
    return total


def status_kb(pid: int, key: str) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def pss_kb(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def comm(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()
    return ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def tmux_server_in(pids: list[int]) -> list[int]:
    return [p for p in pids if comm(p).startswith("tmux: server")]


def settle(pids_of, limit: float = 60.0) -> None:
    """Waits until the processes use under 2 % of a core for half a second."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        a = on_cpu_ns(pids_of())
        time.sleep(0.5)
        if on_cpu_ns(pids_of()) - a < 10_000_000:
            return


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    at = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return {"n": len(xs), "median": statistics.median(xs), "p10": at(0.10), "p90": at(0.90),
            "p99": at(0.99), "min": xs[0], "max": xs[-1]}


# --------------------------------------------------------------------------
# clients

class Rpc:
    """Bare JSON-RPC over a server's stdio."""

    def __init__(self, argv: list[str], env: dict, errlog):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                                  env=env, start_new_session=True, bufsize=0)
        self.lines, self.n = Lines(self.p.stdout.fileno(), f"{argv[0]}'s stdout", BenchError), 0

    def start(self) -> None:
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "curves", "version": "0"}})
        self.p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def _line(self) -> bytes:
        return self.lines.next()

    def request(self, method: str, params: dict) -> dict:
        self.n += 1
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                       "params": params}).encode() + b"\n")
        while True:
            ln = self._line().strip()
            msg = json.loads(ln) if ln else {}
            if msg.get("id") == self.n and ("result" in msg or "error" in msg):
                if "error" in msg or msg["result"].get("isError"):
                    raise BenchError(f"{method}: {json.dumps(msg)[:400]}")
                return msg["result"]

    def call(self, tool: str, args: dict) -> dict:
        r = self.request("tools/call", {"name": tool, "arguments": args})
        if "structuredContent" in r:
            return r["structuredContent"]
        return json.loads(r["content"][0]["text"]) if r.get("content") else {}

    def close(self, wait: float = 30) -> None:
        with contextlib.suppress(Exception):
            self.p.stdin.close()
        try:
            self.p.wait(wait)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, 9)
            self.p.wait()


class Ctl:
    """A `tmux -C` client; with `watch`, a thread reads and discards %output
    (resuming paused panes, as sandmux's watcher does)."""

    def __init__(self, sock: str, session: str, flags: str = "no-output", watch: bool = False):
        self.p = subprocess.Popen(["tmux", "-S", sock, "-C", "attach-session", "-t", session, "-f", flags],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  bufsize=0)
        self.lines = Lines(self.p.stdout.fileno(), "tmux -C", BenchError)
        if watch:
            threading.Thread(target=self._drain, daemon=True).start()
        else:
            if self.cmd("display-message -p sync") != [b"sync"]:
                raise BenchError("tmux -C: the first reply is not the first command's")

    def _drain(self) -> None:
        rest = b""
        while True:
            chunk = os.read(self.p.stdout.fileno(), 1 << 16)
            if not chunk:
                return
            rest += chunk
            if b"%pause" in rest:
                for m in re.finditer(rb"%pause (%\d+)", rest):
                    self.p.stdin.write(b"refresh-client -A '" + m.group(1) + b":continue'\n")
            rest = rest[rest.rfind(b"\n") + 1:]

    def _line(self) -> bytes:
        return self.lines.next()

    def cmd(self, line: str) -> list[bytes]:
        self.p.stdin.write(line.encode() + b"\n")
        return self._block(line)

    def _block(self, line: str = "") -> list[bytes]:
        # Only this client's commands have flags 1: the attach's own block
        # (flags 0) may come before or after the first command's.
        while not ((ln := self._line()).startswith(b"%begin ") and ln.split()[3:4] == [b"1"]):
            pass
        body = []
        while not (ln := self._line()).startswith((b"%end ", b"%error ")):
            body.append(ln)
        if ln.startswith(b"%error "):
            raise BenchError(f"tmux -C {line!r}: {body}")
        return body

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.p.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(5)


def tmux(sock: str, *args: str) -> str:
    p = subprocess.run(["tmux", "-S", sock, *args], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise BenchError(f"tmux {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def plain_server(sock: str, windows: int = 1) -> int:
    """A private tmux server, 200x50 like sandmux's panes, plain bash."""
    tmux(sock, "-f", "/dev/null", "new-session", "-d", "-s", "main", "-x", "200", "-y", "50", SHELL)
    for _ in range(windows - 1):
        tmux(sock, "new-window", "-d", "-t", "main", SHELL)
    return int(tmux(sock, "display-message", "-p", "#{pid}").strip())


class Env:
    """Paths and environments for both servers."""

    def __init__(self, a):
        self.a, self.tmp, self.k = a, a.tmp_dir, 0
        self.errlog = open(os.path.join(a.tmp_dir, "servers-stderr.log"), "ab")
        self.base = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "TERM", "LANG", "USER", "LOGNAME")}

    def fresh(self, what: str) -> str:
        self.k += 1
        d = os.path.join(self.tmp, f"{what}{self.k}")
        os.mkdir(d)
        return d

    def sandmux_argv(self, ws: str, *extra: str) -> list[str]:
        audit = os.path.join(self.fresh("audit"), "audit.jsonl")
        return [self.a.sandmux_bin, "serve", "-w", ws, "--audit-log", audit, "--toolsets", TOOLSETS, *extra]

    def sandmux(self, ws: str | None = None) -> Rpc:
        return Rpc(self.sandmux_argv(ws or self.fresh("ws")), self.base, self.errlog)

    def libtmux_env(self, sock: str) -> dict:
        return {**self.base, "LIBTMUX_SOCKET_PATH": sock, "LIBTMUX_TOOLSETS": TOOLSETS}

    def libtmux(self, sock: str) -> Rpc:
        return Rpc([self.a.libtmux_mcp], self.libtmux_env(sock), self.errlog)

    def sock(self) -> str:
        self.k += 1
        return os.path.join(self.tmp, f"s{self.k}.sock")


# --------------------------------------------------------------------------
# panes: listing and capture against one control-mode round trip

def listing_cmd(exclude_session: str) -> str:
    sep, end = "<s0a1b2c3d4e5f>", "<e0a1b2c3d4e5f>"
    fmt = sep.join("#{%s}" % f for f in PANE_FIELDS) + end
    return f"list-panes -a -f '#{{!=:#{{session_name}},{exclude_session}}}' -F '{fmt}'"


def timed(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e6


def panes_point(env: Env, n: int, rounds: int) -> dict:
    smx = env.sandmux()
    sock = env.sock()
    lib = None
    ctl = None
    try:
        smx.start()
        spane = smx.call("list_panes", {})["panes"][0]["pane_id"]
        for _ in range(n - 1):
            smx.call("create_window", {})
        tmux_pid = plain_server(sock, n)
        tmux(sock, "new-session", "-d", "-s", "ctl", SHELL)
        lpane = tmux(sock, "display-message", "-p", "-t", "main:0", "#{pane_id}").strip()
        lib = env.libtmux(sock)
        lib.start()
        ctl = Ctl(sock, "ctl")
        smx_tree = lambda: descendants(smx.p.pid)
        settle(lambda: smx_tree() + descendants(tmux_pid))
        got = {}
        listing = listing_cmd("ctl")
        shown = ctl.cmd(listing)
        if len(shown) != n or ctl.cmd("display-message -p check") != [b"check"]:
            raise BenchError(f"the floor's listing showed {len(shown)} lines, not {n} panes: {shown[:3]}")
        calls = {
            "sandmux": (lambda: smx.call("list_panes", {}), lambda: smx.call("capture_pane", {"pane_id": spane})),
            "libtmux-mcp": (lambda: lib.call("list_panes", {}), lambda: lib.call("capture_pane", {"pane_id": lpane})),
            "tmux -C": (lambda: ctl.cmd(listing), lambda: ctl.cmd(f"capture-pane -p -J -t {lpane}")),
        }
        if len(smx.call("list_panes", {})["panes"]) != n:
            raise BenchError(f"sandmux did not list {n} panes")
        who = list(calls)
        for r in range(rounds + 5):
            for w in who[r % 3:] + who[:r % 3]:
                for kind, fn in zip(("list_panes", "capture_pane"), calls[w]):
                    ms = timed(fn)
                    if r >= 5:
                        got.setdefault(f"{kind}|{w}", []).append(ms)
        out = {k: stats(v) for k, v in got.items()}
        # CPU per call, each server alone: its own process(es) and its tmux server.
        k = max(20, rounds // 2)
        groups = {
            "sandmux": (lambda: [p for p in smx_tree() if p not in tmux_server_in(smx_tree())],
                        lambda: tmux_server_in(smx_tree()), calls["sandmux"][0]),
            "libtmux-mcp": (lambda: descendants(lib.p.pid), lambda: [tmux_pid], calls["libtmux-mcp"][0]),
            "tmux -C": (lambda: [], lambda: [tmux_pid], calls["tmux -C"][0]),
        }
        for w, (server, tm, fn) in groups.items():
            s0, t0 = on_cpu_ns(server()), on_cpu_ns(tm())
            for _ in range(k):
                fn()
            out[f"cpu_server_ms|{w}"] = (on_cpu_ns(server()) - s0) / k / 1e6
            out[f"cpu_tmux_ms|{w}"] = (on_cpu_ns(tm()) - t0) / k / 1e6
        return out
    finally:
        for c in (ctl,):
            if c:
                c.close()
        for r in (smx, lib):
            if r:
                r.close()
        with contextlib.suppress(BenchError):
            tmux(sock, "kill-server")


# --------------------------------------------------------------------------
# output: a pane prints S MB

def build_log(path: str, mb: int) -> None:
    """Deterministic compiler-like output, about mb MB."""
    want, i = mb * 1_000_000, 0
    with open(path, "w") as fh:
        size = 0
        while size < want:
            i += 1
            line = (f"   Compiling crate-{i % 977} v0.{i % 13}.{i % 7} (/src/crates/crate-{i % 977})\n" if i % 5
                    else f"warning: unused variable `x{i}` --> src/lib.rs:{i % 900}:{i % 80}\n")
            fh.write(line)
            size += len(line)


class OutputRig:
    """One server of each kind, kept for all sizes (so each run is paired)."""

    def __init__(self, env: Env, ws: str):
        self.env = env
        self.smx = env.sandmux(ws)
        self.smx.start()
        self.spane = self.smx.call("list_panes", {})["panes"][0]["pane_id"]
        self.lsock, self.asock, self.fsock = env.sock(), env.sock(), env.sock()
        self.lpid = plain_server(self.lsock)
        self.lib = env.libtmux(self.lsock)
        self.lib.start()
        self.lpane = tmux(self.lsock, "display-message", "-p", "-t", "main", "#{pane_id}").strip()
        self.apid = plain_server(self.asock)
        self.fpid = plain_server(self.fsock)
        self.watch = Ctl(self.fsock, "main", WATCH_FLAGS, watch=True)
        # What sparing tmux the encoding would save: the same client, the pane's output off.
        self.osock = env.sock()
        self.opid = plain_server(self.osock)
        self.off = Ctl(self.osock, "main", WATCH_FLAGS, watch=True)
        opane = tmux(self.osock, "display-message", "-p", "-t", "main", "#{pane_id}").strip()
        self.off.p.stdin.write(f"refresh-client -A '{opane}:off'\n".encode())
        self.n = 0

    def plain(self, sock: str, path: str) -> None:
        self.n += 1
        tag = f"d{self.n}"
        tmux(sock, "send-keys", "-t", "main", f"cat {path}; tmux wait-for -S {tag}", "Enter")
        subprocess.run(["tmux", "-S", sock, "wait-for", tag], check=True, timeout=1800)
        tmux(sock, "clear-history", "-t", "main")

    def runs(self, path: str) -> dict:
        """Each system: (what it runs, [(role, pids)])."""
        smx_tree = lambda: descendants(self.smx.p.pid)
        tsrv = lambda: tmux_server_in(smx_tree())
        def smx_run():
            r = self.smx.call("run_command", {"pane_id": self.spane, "command": f"cat {path}", "timeout": 300})
            if r.get("status") != "completed" or r.get("exit_status") != 0:
                raise BenchError(f"sandmux run_command: {json.dumps(r)[:300]}")
        def lib_run():
            r = self.lib.call("run_command", {"pane_id": self.lpane, "command": f"cat {path}", "timeout": 300})
            if r.get("exit_status") != 0 or r.get("timed_out"):
                raise BenchError(f"libtmux-mcp run_command: {json.dumps(r)[:300]}")
        return {
            "sandmux": (smx_run, {"serve and its tmux clients": lambda: [p for p in smx_tree() if p not in tsrv()],
                                  "tmux server (with the pane)": lambda: descendants(tsrv()[0]) if tsrv() else []}),
            "libtmux-mcp": (lib_run, {"libtmux-mcp": lambda: descendants(self.lib.p.pid),
                                      "tmux server (with the pane)": lambda: descendants(self.lpid)}),
            "tmux alone": (lambda: self.plain(self.asock, path),
                           {"tmux server (with the pane)": lambda: descendants(self.apid)}),
            "tmux + control client": (lambda: self.plain(self.fsock, path),
                                      {"tmux server (with the pane)": lambda: descendants(self.fpid)}),
            "tmux + control client, pane's output off": (lambda: self.plain(self.osock, path),
                                                         {"tmux server (with the pane)": lambda: descendants(self.opid)}),
        }

    def close(self) -> None:
        self.watch.close()
        self.off.close()
        self.smx.close()
        self.lib.close()
        for s in (self.lsock, self.asock, self.fsock, self.osock):
            with contextlib.suppress(BenchError):
                tmux(s, "kill-server")


def output_curve(env: Env, sizes: list[int], reps: dict[int, int]) -> dict:
    ws = env.fresh("ws")
    for mb in sizes:
        build_log(os.path.join(ws, f"log-{mb}mb.txt"), mb)
    rig = OutputRig(env, ws)
    out: dict = {}
    try:
        settle(lambda: descendants(rig.smx.p.pid) + [rig.lpid, rig.apid, rig.fpid, rig.opid])
        for mb in sizes:
            path = os.path.join(ws, f"log-{mb}mb.txt")
            systems = rig.runs(path)
            # sandmux's pane sees the workspace at the same path (the default profile's view).
            who = list(systems)
            for r in range(reps[mb]):
                for w in who[r % len(who):] + who[:r % len(who)]:
                    fn, roles = systems[w]
                    before = {role: on_cpu_ns(pids()) for role, pids in roles.items()}
                    t0 = time.perf_counter()
                    fn()
                    wall = time.perf_counter() - t0
                    d = out.setdefault(f"{mb}|{w}", {"wall_s": [], "cpu_s": {}})
                    d["wall_s"].append(wall)
                    for role, pids in roles.items():
                        d["cpu_s"].setdefault(role, []).append((on_cpu_ns(pids()) - before[role]) / 1e9)
                    log(f"output {mb} MB, {w}: {wall:.2f} s")
        peaks = {"sandmux serve": status_kb(rig.smx.p.pid, "VmHWM"),
                 "sandmux's tmux server": max((status_kb(p, "VmHWM") for p in tmux_server_in(descendants(rig.smx.p.pid))), default=0),
                 "libtmux-mcp": status_kb(rig.lib.p.pid, "VmHWM"),
                 "libtmux-mcp's tmux server": status_kb(rig.lpid, "VmHWM"),
                 "tmux alone": status_kb(rig.apid, "VmHWM"),
                 "tmux + control client": status_kb(rig.fpid, "VmHWM"),
                 "tmux + control client, output off": status_kb(rig.opid, "VmHWM")}
        return {"runs": out, "peak_rss_kb": peaks}
    finally:
        rig.close()


# --------------------------------------------------------------------------
# http: C clients calling list_panes for a fixed time

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def sandmux_http(env: Env):
    d = env.fresh("http")
    err = os.path.join(d, "stderr")
    # The default profile, with room for one HTTP session per client (its cap is 8).
    prof = subprocess.run([env.a.sandmux_bin, "profile", "show", "default"], capture_output=True, text=True,
                          check=True).stdout
    if prof.count("\n[mcp]\n") != 1 or "http_max_sessions" in prof:
        raise BenchError("the default profile's [mcp] table is not as expected")
    with open(os.path.join(d, "http.toml"), "w") as fh:
        fh.write(prof.replace("\n[mcp]\n", "\n[mcp]\nhttp_max_sessions = 64\n"))
    with open(err, "w+") as fh:
        p = subprocess.Popen(env.sandmux_argv(env.fresh("ws"), "--http", "127.0.0.1:0", "--profile", os.path.join(d, "http.toml")), env=env.base,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh, text=True,
                             start_new_session=True)
        try:
            for _ in range(600):
                fh.seek(0)
                line = next((l for l in fh if "serving MCP at" in l), None)
                if line or p.poll() is not None:
                    break
                time.sleep(0.05)
            if not line:
                raise BenchError(f"serve --http did not start: {open(err).read()[-400:]}")
            url = line.split("serving MCP at ")[1].split()[0]
            token = open(re.search(r"Bearer token in (.+?)\)( |$)", line).group(1)).read().strip()
            yield url, {"Authorization": f"Bearer {token}"}
        finally:
            p.terminate()
            p.wait(30)


@contextlib.contextmanager
def libtmux_http(env: Env):
    sock, port = env.sock(), free_port()
    plain_server(sock)
    code = ("import sys; from libtmux_mcp.server import build_mcp_server; "
            "build_mcp_server().run(transport='http', host='127.0.0.1', port=int(sys.argv[1]), show_banner=False)")
    p = subprocess.Popen([env.a.libtmux_python, "-c", code, str(port)], env=env.libtmux_env(sock),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=env.errlog, start_new_session=True)
    try:
        for _ in range(600):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if p.poll() is not None:
                raise BenchError("libtmux-mcp over HTTP exited")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", {}
    finally:
        p.terminate()
        p.wait(30)
        with contextlib.suppress(BenchError):
            tmux(sock, "kill-server")


def sse_or_json(r) -> dict:
    if r.status_code >= 300 or not r.content:
        raise BenchError(f"{r.request.url}: HTTP {r.status_code}: {r.text[:200]}")
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith("data:") and '"id"' in line:
                return json.loads(line[5:])
        raise BenchError(f"no JSON-RPC answer in the event stream: {r.text[:200]}")
    return r.json()


async def http_clients(url: str, headers: dict, clients: int, seconds: float) -> dict:
    import httpx2
    lat: list[float] = []
    errors = [0]
    H = {**headers, "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    async def one(k: int) -> None:
        async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=1)) as h:
            r = await h.post(url, headers=H, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": f"c{k}", "version": "0"}}})
            sse_or_json(r)
            sid = r.headers.get("mcp-session-id")
            hs = {**H, **({"Mcp-Session-Id": sid} if sid else {}), "MCP-Protocol-Version": "2025-11-25"}
            await h.post(url, headers=hs, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            # The clock starts when every client has its session.
            ready[0] += 1
            if ready[0] == clients:
                clock[0], clock[1] = time.perf_counter(), time.perf_counter() + seconds
                go.set()
            await go.wait()
            stop = clock[1]
            n = 0
            while time.perf_counter() < stop:
                n += 1
                t0 = time.perf_counter()
                r = await h.post(url, headers=hs, json={"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                                         "params": {"name": "list_panes", "arguments": {}}})
                msg = sse_or_json(r)
                if "error" in msg or msg.get("result", {}).get("isError"):
                    errors[0] += 1
                elif time.perf_counter() < stop:
                    lat.append((time.perf_counter() - t0) * 1000)
            if sid:  # the session ends, as a client that is done ends it
                await h.delete(url, headers=hs)

    import asyncio
    ready, clock, go = [0], [0.0, 0.0], asyncio.Event()
    await asyncio.gather(*(one(k) for k in range(clients)))
    st = stats(lat)
    st["calls_per_s"] = len(lat) / seconds
    st["errors"] = errors[0]
    return st


def http_curve(env: Env, counts: list[int], seconds: float, reps: int) -> dict:
    import asyncio
    out: dict = {}
    with sandmux_http(env) as s, libtmux_http(env) as l:
        servers = {"sandmux": s, "libtmux-mcp": l}
        for r in range(reps):
            for c in counts:
                for w in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                    got = asyncio.run(http_clients(*servers[w], c, seconds))
                    out.setdefault(f"{c}|{w}", []).append(got)
                    log(f"http {c} clients, {w}: {got['calls_per_s']:.0f} calls/s, p50 {got.get('median', 0):.1f} ms")
    return out


# --------------------------------------------------------------------------
# instances: N started at once

def instances_point(env: Env, n: int, who: str) -> dict:
    socks = []
    if who == "libtmux-mcp":
        socks = [env.sock() for _ in range(n)]
        for s in socks:
            plain_server(s)
    t0 = time.perf_counter()
    rpcs = [env.sandmux() if who == "sandmux" else env.libtmux(socks[i]) for i in range(n)]
    answered: list[float] = []
    failures: list[str] = []

    def up(r: Rpc) -> None:
        try:
            r.start()
            r.call("list_panes", {})
            answered.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 (counted and reported)
            failures.append(str(e)[:200])

    ts = [threading.Thread(target=up, args=(r,)) for r in rpcs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    time.sleep(1.0)
    trees, own = [], []
    for i, r in enumerate(rpcs):
        tree = descendants(r.p.pid)
        own += tree
        if socks:
            tree += descendants(int(tmux(socks[i], "display-message", "-p", "#{pid}").strip()))
        trees.append(tree)
    pss = [sum(pss_kb(p) for p in t) / 1024 for t in trees]
    procs = [len(t) for t in trees]
    t1 = time.perf_counter()
    for r in rpcs:
        with contextlib.suppress(Exception):
            r.p.stdin.close()
    for r in rpcs:
        r.close(120)
    # Until every process of every server is gone (sandmux's sandbox and tmux
    # server included; libtmux-mcp's tmux server is not its own and is killed after).
    left = own
    while (left := [p for p in left if alive(p)]) and time.perf_counter() - t1 < 120:
        time.sleep(0.01)
    teardown = time.perf_counter() - t1
    for s in socks:
        with contextlib.suppress(BenchError):
            tmux(s, "kill-server")
    return {"all_answered_s": max(answered) if answered and not failures else None,
            "median_answered_s": statistics.median(answered) if answered else None,
            "pss_mib_per_instance": statistics.median(pss), "procs_per_instance": statistics.median(procs),
            "teardown_s": teardown, "failures": len(failures), "failure_samples": failures[:3]}


def instances_curve(env: Env, sizes: list[int], reps: dict[str, int]) -> dict:
    out: dict = {}
    for n in sizes:
        for who in ("sandmux", "libtmux-mcp"):
            for _ in range(reps[who]):
                got = instances_point(env, n, who)
                out.setdefault(f"{n}|{who}", []).append(got)
                log(f"instances {n}, {who}: all answered {got['all_answered_s']} s, "
                    f"PSS {got['pss_mib_per_instance']:.1f} MiB each, failures {got['failures']}")
    return out


# --------------------------------------------------------------------------
# report

def f(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def spread(st: dict) -> str:
    return f"{st['median']:.3f} ({st['p10']:.3f}–{st['p90']:.3f})"


def report(res: dict, a, meta: dict) -> tuple[str, list[dict]]:
    md, rows = [f"# Scaling curves (`bench/curves{' --quick' if a.quick else ''}`)\n",
                f"- {meta['when']}; git {meta['git']}; {meta['machine']}; uid {os.getuid()}; "
                f"the run took {meta['minutes']:.1f} min.",
                "- Every server is spoken to with bare JSON-RPC (no SDK); interleaved; median (p10–p90).\n"], []
    if "panes" in res:
        md += ["## Panes per instance: list_panes and capture_pane\n",
               "The floor: one `tmux -C` round trip of the same listing (sandmux's fields and filter) or capture "
               "(`capture-pane -p -J`) on a plain tmux server with the same panes. CPU per list_panes call: on-CPU "
               "time of the MCP server's processes, and of its tmux server.\n",
               "| panes | call | sandmux ms | libtmux-mcp ms | floor (`tmux -C`) ms | sandmux / floor | goal | met? "
               "| CPU/call sandmux + its tmux ms | libtmux-mcp + its tmux ms | floor's tmux ms |",
               "|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|"]
        for n, d in res["panes"].items():
            for call in ("list_panes", "capture_pane"):
                s, l, t = d[f"{call}|sandmux"], d[f"{call}|libtmux-mcp"], d[f"{call}|tmux -C"]
                ratio = s["median"] / t["median"]
                goal = "≤ 1.5×" if call == "list_panes" else "—"
                met = ("yes" if ratio <= 1.5 else "no") if call == "list_panes" else "—"
                cpu = ["—"] * 3
                if call == "list_panes":
                    cpu = [f"{d['cpu_server_ms|sandmux']:.3f} + {d['cpu_tmux_ms|sandmux']:.3f}",
                           f"{d['cpu_server_ms|libtmux-mcp']:.3f} + {d['cpu_tmux_ms|libtmux-mcp']:.3f}",
                           f"{d['cpu_tmux_ms|tmux -C']:.3f}"]
                md.append(f"| {n} | {call} | {spread(s)} | {spread(l)} | {spread(t)} | {ratio:.2f}× | {goal} | {met} | "
                          + " | ".join(cpu) + " |")
                rows.append({"measurement": f"curves: {call}, {n} panes, median", "sandmux": s["median"], "unit": "ms",
                             "other": t["median"], "other_what": "one `tmux -C` round trip, same command",
                             "goal": "≤ 1.5x" if call == "list_panes" else None,
                             "met": (ratio <= 1.5) if call == "list_panes" else None})
        md.append("")
    if "output" in res:
        runs = res["output"]["runs"]
        md += ["## Output volume: a pane prints a build log\n",
               "Wall from the call (or `send-keys`) until the command is done; CPU: on-CPU seconds per role "
               "during the run. The floor is tmux with one control client reading and discarding `%output` "
               f"(flags `{WATCH_FLAGS}`, as sandmux's watcher).\n",
               "| MB | system | runs | wall s, median (min–max) | / floor | goal | met? | CPU s by role |",
               "|---:|---|---:|---:|---:|---|---|---|"]
        sizes = sorted({int(k.split("|")[0]) for k in runs})
        for mb in sizes:
            floor = statistics.median(runs[f"{mb}|tmux + control client"]["wall_s"])
            for w in ("sandmux", "libtmux-mcp", "tmux alone", "tmux + control client",
                      "tmux + control client, pane's output off"):
                d = runs[f"{mb}|{w}"]
                med = statistics.median(d["wall_s"])
                goal = "≤ 1.1×" if w == "sandmux" and mb >= 10 else "—"
                met = ("yes" if med / floor <= 1.1 else "no") if goal != "—" else "—"
                cpu = "; ".join(f"{role} {statistics.median(v):.2f}" for role, v in d["cpu_s"].items())
                md.append(f"| {mb} | {w} | {len(d['wall_s'])} | {med:.2f} ({min(d['wall_s']):.2f}–{max(d['wall_s']):.2f}) "
                          f"| {med / floor:.2f}× | {goal} | {met} | {cpu} |")
            s = statistics.median(runs[f"{mb}|sandmux"]["wall_s"])
            rows.append({"measurement": f"curves: a pane prints {mb} MB, run_command → done", "sandmux": s, "unit": "s",
                         "other": floor, "other_what": "tmux + one control client discarding %output",
                         "goal": "≤ 1.1x" if mb >= 10 else None, "met": (s / floor <= 1.1) if mb >= 10 else None})
            lib = statistics.median(runs[f"{mb}|libtmux-mcp"]["wall_s"])
            rows.append({"measurement": f"curves: a pane prints {mb} MB, run_command → done (peer)", "sandmux": s,
                         "unit": "s", "other": lib, "other_what": "libtmux-mcp, same command", "goal": None, "met": None})
        pk = res["output"]["peak_rss_kb"]
        md.append("\nPeak RSS over the whole curve (VmHWM): " + ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in pk.items()) + ".\n")
    if "http" in res:
        md += ["## HTTP clients: list_panes over streamable HTTP\n",
               f"Each client: its own connection and session, list_panes in a loop for {a.http_seconds} s.\n",
               "| clients | sandmux calls/s | p50 ms | p99 ms | libtmux-mcp calls/s | p50 ms | p99 ms | sandmux / peer (calls/s) | errors |",
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        counts = sorted({int(k.split("|")[0]) for k in res["http"]})
        for c in counts:
            s = res["http"][f"{c}|sandmux"]
            l = res["http"][f"{c}|libtmux-mcp"]
            m = lambda xs, k: statistics.median(x.get(k, 0) for x in xs)
            md.append(f"| {c} | {m(s, 'calls_per_s'):.0f} | {m(s, 'median'):.1f} | {m(s, 'p99'):.1f} | "
                      f"{m(l, 'calls_per_s'):.0f} | {m(l, 'median'):.1f} | {m(l, 'p99'):.1f} | "
                      f"{m(s, 'calls_per_s') / max(m(l, 'calls_per_s'), 1e-9):.1f}× | "
                      f"{sum(x['errors'] for x in s)} / {sum(x['errors'] for x in l)} |")
            rows.append({"measurement": f"curves: HTTP, {c} clients, list_panes calls/s", "sandmux": m(s, "calls_per_s"),
                         "unit": "calls/s", "other": m(l, "calls_per_s"), "other_what": "libtmux-mcp over HTTP",
                         "goal": None, "met": None})
        md.append("")
    if "instances" in res:
        md += ["## Instances started at once\n",
               "Each: its own workspace (sandmux) or its own private tmux server started beforehand (libtmux-mcp, "
               "whose server's memory is counted with it). Time from the first spawn until all answered list_panes.\n",
               "| N | system | reps | all answered s | PSS per instance MiB | processes per instance | teardown s | failures |",
               "|---:|---|---:|---:|---:|---:|---:|---:|"]
        for key, xs in res["instances"].items():
            n, w = key.split("|")
            m = lambda k: statistics.median(x[k] for x in xs) if all(x[k] is not None for x in xs) else None
            md.append(f"| {n} | {w} | {len(xs)} | {f(m('all_answered_s'))} | {f(m('pss_mib_per_instance'), 1)} | "
                      f"{f(m('procs_per_instance'), 0)} | {f(m('teardown_s'))} | {sum(x['failures'] for x in xs)} |")
            if w == "sandmux":
                l = res["instances"].get(f"{n}|libtmux-mcp")
                lm = statistics.median(x["all_answered_s"] for x in l) if l and all(x["all_answered_s"] for x in l) else None
                rows.append({"measurement": f"curves: {n} instances at once → all answered", "sandmux": m("all_answered_s"),
                             "unit": "s", "other": lm, "other_what": "libtmux-mcp, same", "goal": None, "met": None})
        md.append("")
    return "\n".join(md) + "\n", rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="panes,output,http,instances")
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--libtmux-mcp", required=True)
    ap.add_argument("--libtmux-python", required=True)
    ap.add_argument("--tmp-dir", required=True)
    ap.add_argument("--out-md", required=True)
    a = ap.parse_args()
    a.http_seconds = 2.0 if a.quick else 5.0
    env = Env(a)
    only = set(a.only.split(","))
    t0 = time.monotonic()
    res: dict = {}
    try:
        if "panes" in only:
            res["panes"] = {}
            for n in ([1, 16] if a.quick else [1, 16, 100]):
                log(f"panes: {n}")
                res["panes"][n] = panes_point(env, n, 40 if a.quick else 200)
        if "output" in only:
            sizes = [1, 10] if a.quick else [1, 10, 100]
            res["output"] = output_curve(env, sizes, {1: 1 if a.quick else 5, 10: 1 if a.quick else 3, 100: 2})
        if "http" in only:
            res["http"] = http_curve(env, [1, 8] if a.quick else [1, 8, 32], a.http_seconds, 1 if a.quick else 2)
        if "instances" in only:
            res["instances"] = instances_curve(env, [1, 4, 16] if a.quick else [1, 4, 16, 32, 64],
                                               {"sandmux": 1 if a.quick else 3, "libtmux-mcp": 1})
    except BenchError as e:
        log(f"failed: {e}")
        return 1
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "git": os.environ.get("BENCH_GIT", "?"), "machine": os.environ.get("BENCH_MACHINE", platform.platform()),
            "minutes": (time.monotonic() - t0) / 60}
    md, rows = report(res, a, meta)
    with open(a.out_md, "w") as fh:
        fh.write(md)
    with open(os.path.splitext(a.out_md)[0] + ".json", "w") as fh:
        json.dump({"meta": meta, "results": res, "summary": rows}, fh, indent=1)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
