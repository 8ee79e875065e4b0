#!/usr/bin/env python3
"""Per-call MCP latency over stdio and over streamable HTTP, one sandmux
binary, the official Python MCP SDK as the client on both: stdio
(`mode="legacy"`), HTTP with a session (2025-11-25, `mode="legacy"`) and HTTP
stateless (2026-07-28). One long-lived server per transport; rounds are
interleaved (the r-th of the 6 orders) so machine noise hits all three.
Every time is the client's wall clock around one call. Times are never
asserted on; exit status 1 means something failed to run.

Usage (from bench/http-latency): http_latency.py --sandmux-bin BIN --rounds N --tmp-dir DIR --out-md FILE
"""

import argparse
import contextlib
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

PERMS3 = [(0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1), (2, 0, 1), (1, 0, 2)]
CALLS = [
    ("list_panes", "list_panes", {}),
    ("capture_pane", "capture_pane", {}),
    ("run_command `echo hi`", "run_command", {"command": "echo hi"}),
]


def env():
    return {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}


@contextlib.contextmanager
def http_serve(bin_, tmp, name):
    ws = tmp / f"ws-{name}"
    ws.mkdir()
    err = open(tmp / f"{name}.err", "w+")
    p = subprocess.Popen([bin_, "serve", "-w", str(ws), "--audit-log", str(tmp / f"audit-{name}.jsonl"), "--http", "127.0.0.1:0"],
                         env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        for _ in range(600):
            err.seek(0)
            line = next((l for l in err if "serving MCP at" in l), None)
            if line:
                break
            if p.poll() is not None:
                raise SystemExit(f"serve --http exited {p.returncode}")
            time.sleep(0.05)
        else:
            raise SystemExit("serve --http did not start")
        url = line.split("serving MCP at ")[1].split()[0]
        token = pathlib.Path(re.search(r"Bearer token in (.+?)\)( |$)", line).group(1)).read_text().strip()
        yield url, token
    finally:
        p.terminate()
        p.wait(timeout=30)
        err.close()


async def one(c, tool, args):
    t0 = time.perf_counter()
    r = await c.call_tool(tool, args)
    if r.is_error:
        raise SystemExit(f"{tool} failed: {r.content[0].text if r.content else r}")
    return time.perf_counter() - t0


async def run(a):
    tmp = pathlib.Path(a.tmp_dir)
    wsd = tmp / "ws-stdio"
    wsd.mkdir()
    stdio = StdioServerParameters(command=a.sandmux_bin, args=["serve", "-w", str(wsd), "--audit-log", str(tmp / "audit-stdio.jsonl")], env=env())
    names = ["stdio", "HTTP 2025-11-25 (session)", "HTTP 2026-07-28 (stateless)"]
    times = {n: {c[0]: [] for c in CALLS} for n in names}
    with http_serve(a.sandmux_bin, tmp, "s") as (u1, t1), http_serve(a.sandmux_bin, tmp, "l") as (u2, t2):
        async with contextlib.AsyncExitStack() as st:
            h1 = await st.enter_async_context(httpx2.AsyncClient(headers={"Authorization": f"Bearer {t1}"}, timeout=60))
            h2 = await st.enter_async_context(httpx2.AsyncClient(headers={"Authorization": f"Bearer {t2}"}, timeout=60))
            clients = [
                await st.enter_async_context(Client(stdio, mode="legacy")),
                await st.enter_async_context(Client(streamable_http_client(u1, http_client=h1), mode="legacy")),
                await st.enter_async_context(Client(streamable_http_client(u2, http_client=h2), mode="2026-07-28")),
            ]
            for r in range(a.rounds + 5):
                for i in PERMS3[r % 6]:
                    for label, tool, args in CALLS:
                        dt = await one(clients[i], tool, args)
                        if r >= 5:
                            times[names[i]][label].append(dt)
    return names, times


def q99(v):
    return statistics.quantiles(v, n=100, method="inclusive")[98] if len(v) > 1 else v[0]


def table(names, times, rounds, note):
    ms = lambda s: f"{s * 1000:.2f}"
    rows = ["| call | " + " | ".join(f"{n} median (p99), ms" for n in names) + " | HTTP session / stdio (median) |",
            "|---|" + "---:|" * len(names) + "---:|"]
    for label, _, _ in CALLS:
        cells = [f"{ms(statistics.median(times[n][label]))} ({ms(q99(times[n][label]))})" for n in names]
        ratio = statistics.median(times[names[1]][label]) / statistics.median(times[names[0]][label])
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return f"{rounds} rounds; {note}\n\n" + "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sandmux-bin", required=True)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--tmp-dir", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args()
    names, times = anyio.run(run, a)
    md = table(names, times, a.rounds, os.environ.get("BENCH_NOTE", ""))
    pathlib.Path(a.out_md).write_text(md)
    pathlib.Path(a.out_md).with_suffix(".json").write_text(json.dumps(times))
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
