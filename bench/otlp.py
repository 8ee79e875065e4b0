#!/usr/bin/env python3
"""What OTLP span export costs a call (docs/observability.md, "OTLP
export"): spawn to first tool result and per-call latency of `list_windows`
over stdio (the official Python MCP SDK), each call with a sampled
`traceparent` in `_meta`, for: a baseline binary (optional), this binary
with export off, with export on (a collector stand-in from
tests/mcp/test_otlp.py in a process of its own), and with export on but
calls carrying no context. Configurations run in a shuffled order each
round so machine noise hits all. Times are never asserted on.

Usage: python bench/otlp.py --sandmux-bin BIN [--base-bin OLD] [--calls 300] [--rounds 6]
(with the venv that runs tests/mcp: mcp, opentelemetry-proto).
"""

import argparse
import asyncio
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

from mcp import Client, StdioServerParameters

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TESTS = pathlib.Path(__file__).resolve().parents[1] / "tests" / "mcp"


async def run(binary, extra, calls, tp):
    with tempfile.TemporaryDirectory(prefix="otlp-bench-") as w, tempfile.TemporaryDirectory(prefix="otlp-bench-h-") as h:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDMUX_", "OTEL_"))}
        args = ["serve", "-w", w, "--workspace-mode", "live", "--audit-log", h + "/a.jsonl", *extra]
        t0 = time.perf_counter()
        async with Client(StdioServerParameters(command=binary, args=args, env=env), mode="auto") as c:
            await c.call_tool("list_windows", {})
            start = time.perf_counter() - t0
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                await c.call_tool("list_windows", {}, meta={"traceparent": tp} if tp else None)
                ts.append(time.perf_counter() - t)
        return start, statistics.median(ts), statistics.mean(ts)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--base-bin")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    code = f"import sys,time; sys.path.insert(0,{str(TESTS)!r}); from test_otlp import Collector; c=Collector(); print(c.url, flush=True); time.sleep(3600)"
    col = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        url = col.stdout.readline().strip()
        cfgs = {"off": (a.sandmux_bin, [], TP), "on": (a.sandmux_bin, ["--otlp-endpoint", url], TP),
                "on, untraced calls": (a.sandmux_bin, ["--otlp-endpoint", url], None)}
        if a.base_bin:
            cfgs["baseline binary"] = (a.base_bin, [], TP)
        res = {k: [] for k in cfgs}
        for _ in range(a.rounds):
            order = list(cfgs.items())
            random.shuffle(order)
            for k, (b, x, tp) in order:
                res[k].append(await run(b, x, a.calls, tp))
        print(f"| configuration | spawn to first result (median) | per call, median of medians | per call, median of means |\n|---|---|---|---|")
        for k, v in res.items():
            s, m, mean = (statistics.median(x[i] for x in v) * 1000 for i in range(3))
            print(f"| {k} | {s:.0f} ms | {m:.2f} ms | {mean:.2f} ms |")
    finally:
        col.kill()


if __name__ == "__main__":
    asyncio.run(main())
