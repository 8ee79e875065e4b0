#!/usr/bin/env python3
"""The workspace's history (issue 43): what a checkpoint per changing call
costs `run_command`, and what a rewind costs, at layers of 0, 10,000 and
100,000 files.

For each layer size L, two `serve` instances on the same kind of workspace
(copy-on-write, XDG_STATE_HOME private, under /var/tmp), one with the
default profile (history on) and one with `[workspace] history_bytes = 0`
(history off); in each, the agent first makes L files in the layer (one
`run_command`, untimed), then R rounds of `run_command {"command": "true"}`
(a call that changes nothing) and of `run_command {"command": "echo x >>
f"}` (a call that changes one file), timed from the client (the official
MCP Python SDK) as the call's round trip, interleaved between the two
instances. After the instance ends, `sandmux rewind ID N` to the
checkpoint before the last call is timed as a whole process.

Reported: medians and means per case (the mean carries the whole listing
every 32nd checkpoint) and the paired ratio of medians on/off. Nothing is
asserted. Usage: SANDMUX_BIN=target/release/sandmux python3 bench/history.py
[--rounds R] [--sizes 0,10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

BIN = os.environ.get("SANDMUX_BIN", "target/release/sandmux")


def profile(base: str, off: bool) -> str:
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    if off:
        text = text.replace("[workspace]\n", "[workspace]\nhistory_bytes = 0\n", 1)
        assert "history_bytes = 0" in text
    p = os.path.join(base, "off.toml" if off else "on.toml")
    with open(p, "w") as f:
        f.write(text)
    return p


async def timed(s: ClientSession, cmd: str) -> float:
    t = time.perf_counter()
    r = await s.call_tool("run_command", {"command": cmd, "timeout": 600})
    took = time.perf_counter() - t
    assert not r.is_error, r
    return took


async def case(size: int, rounds: int) -> dict:
    base = tempfile.mkdtemp(prefix="sandmux-bench-history-", dir="/var/tmp")
    out = {}
    sessions = {}
    stacks = []
    try:
        for off in (False, True):
            ws = os.path.join(base, f"ws-{int(off)}")
            os.makedirs(ws)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
            env["XDG_STATE_HOME"] = os.path.join(base, f"state-{int(off)}")
            params = StdioServerParameters(command=BIN, args=["serve", "-w", ws, "-p", profile(base, off), "--workspace-mode", "copy-on-write", "--audit-log", os.path.join(base, f"audit-{int(off)}.jsonl")], env=env)
            cm = stdio_client(params)
            r, w = await cm.__aenter__()
            sc = ClientSession(r, w)
            await sc.__aenter__()
            await sc.initialize()
            stacks.append((cm, sc))
            if size:
                await timed(sc, f"mkdir -p big && (cd big && seq -f 'f%g' {size} | xargs touch)")
            sessions[off] = (sc, env)
        times = {(off, k): [] for off in (False, True) for k in ("nothing", "one file")}
        for i in range(rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for off in order:
                sc = sessions[off][0]
                times[(off, "nothing")].append(await timed(sc, "true"))
                times[(off, "one file")].append(await timed(sc, "echo x >> f"))
        for k in ("nothing", "one file"):
            on, no = statistics.median(times[(False, k)]), statistics.median(times[(True, k)])
            out[k] = (on, no, statistics.mean(times[(False, k)]), statistics.mean(times[(True, k)]))
        st = await sessions[False][0].call_tool("sandbox_status", {})
        lid = re.search(r"sandmux diff (\w+)", str(st.structured_content)).group(1)
    finally:
        for cm, sc in reversed(stacks):
            await sc.__aexit__(None, None, None)
            await cm.__aexit__(None, None, None)
    env = sessions[False][1]
    log = subprocess.run([BIN, "log", lid, "--json"], capture_output=True, text=True, env=env).stdout.splitlines()
    n = len(log) - 2
    t = time.perf_counter()
    rw = subprocess.run([BIN, "rewind", lid, str(n)], capture_output=True, text=True, env=env)
    out["rewind"] = (time.perf_counter() - t, rw.returncode)
    subprocess.run(["rm", "-rf", base])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sizes", default="0,10000,100000")
    a = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# bench/history.py, sandmux {rev}, {BIN}, {a.rounds} rounds")
    print("| layer files | call | history on (median) | off (median) | on/off | on (mean) | off (mean) | rewind of the last call |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for size in [int(x) for x in a.sizes.split(",")]:
        r = asyncio.run(case(size, a.rounds))
        rw, code = r["rewind"]
        for k in ("nothing", "one file"):
            on, off, mon, moff = r[k]
            print(f"| {size:,} | `run_command` that changes {k} | {on*1000:.1f} ms | {off*1000:.1f} ms | {on/off:.2f}x | {mon*1000:.1f} ms | {moff*1000:.1f} ms | {rw*1000:.0f} ms (exit {code}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
