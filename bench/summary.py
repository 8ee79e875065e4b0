#!/usr/bin/env python3
"""One summary table of the six benchmarks' headline figures.

Reads the JSON files the benchmarks write beside their markdown reports
(sandbox-start.json, mcp-latency.json, workload-overhead.json, scale.json,
curves.json, door.json in
the output directory) and writes summary.md (and summary.json, the same rows)
there; the markdown also goes to stdout. bench/run calls this after running the
benchmarks; it can also be run on its own to redo the table from the last JSONs:

    bench/summary.py [--out-dir bench/out] [--failed NAME,...] [--note TEXT]

Columns: measurement | sandmux | compared against (what) | other median |
ratio | goal | met?. ratio = sandmux / other (below 1: sandmux is faster or
smaller). Goals are sandmux's own (from bench/mcp_latency.py, bench/door.py and
docs/benchmarks.md); "met?" is informational, nothing is asserted on times.

Exit status: 0 if every benchmark not named in --failed had a readable JSON;
1 otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

BENCHES = ["sandbox-start", "mcp-latency", "workload-overhead", "scale", "curves", "door"]

# Goal not stated in a benchmark's own output: confined workload overhead
# ≤ 3% (docs/benchmarks.md), i.e. sandmux / plain ≤ 1.03.
WORKLOAD_GOAL_RATIO = 1.03
# Sandbox start: no slower than bubblewrap (issue goal), i.e. sandmux / bwrap ≤ 1.
SANDBOX_START_GOAL_RATIO = 1.0


def fmt(x: float | None) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, bench: str, measurement: str, value: float | None, unit: str, what: str = "—",
            other: float | None = None, goal: dict | None = None, goal_on_ratio: bool = False) -> None:
        """goal: {"op": "≤", "value": v} on the sandmux figure (or on the ratio if goal_on_ratio)."""
        ratio = value / other if value is not None and other else None
        met = None
        gtext = "—"
        if goal:
            gunit = "x" if goal_on_ratio else f" {unit}"
            gtext = f"{goal['op']} {goal['value']:g}{gunit}"
            x = ratio if goal_on_ratio else value
            if x is not None:
                met = x <= goal["value"] if goal["op"] in ("≤", "<=") else x >= goal["value"]
        self.rows.append(dict(
            bench=bench, measurement=measurement, unit=unit, sandmux=value, compared_against=what, other=other,
            ratio=ratio, goal=goal and dict(goal, on="ratio" if goal_on_ratio else "sandmux"), met=met,
            cells=[measurement, f"{fmt(value)} {unit}" if value is not None else "—", what,
                   f"{fmt(other)} {unit}" if other is not None else "—",
                   f"{ratio:.2f}x" if ratio is not None else "—", gtext,
                   "—" if met is None else ("yes" if met else "no")]))

    def missing(self, bench: str, why: str) -> None:
        self.rows.append(dict(bench=bench, measurement=f"{bench}: {why}", missing=True,
                              cells=[f"**{bench}: {why}**", "—", "—", "—", "—", "—", "—"]))

    def markdown(self) -> str:
        head = ["measurement", "sandmux", "compared against (what)", "other median", "ratio", "goal", "met?"]
        lines = ["| " + " | ".join(head) + " |", "|---|---:|---|---:|---:|---|---|"]
        lines += ["| " + " | ".join(r["cells"]) + " |" for r in self.rows]
        return "\n".join(lines)


def sandbox_start(t: Table, d: dict) -> None:
    ms = d["ms"]
    t.add("sandbox-start", "sandbox start: `sandmux run -w WS -- true`, median", ms["sandmux"]["med"], "ms",
          "bubblewrap, same namespaces and view, `true`", ms["bwrap"]["med"],
          {"op": "≤", "value": SANDBOX_START_GOAL_RATIO}, goal_on_ratio=True)
    t.add("sandbox-start", "sandbox start over the fork+exec floor, median", ms["sandmux"]["med"], "ms",
          "plain `true`", ms["true"]["med"])


def mcp_latency(t: Table, d: dict) -> None:
    ms, goals = d["ms"], d["goals_ms"]
    B = "libtmux-mcp"

    def fig(key: str, who: str, stat: str) -> float | None:
        return ms.get(key, {}).get(who, {}).get(stat)

    def row(key: str, label: str, stat: str = "median", goal: bool = True) -> None:
        t.add("mcp-latency", f"MCP {label}, {stat}", fig(key, "sandmux", stat), "ms",
              f"libtmux-mcp{'' if stat == 'median' else f' {stat}'}, same MCP client", fig(key, B, stat),
              goals.get(key) if goal and stat == "median" else None)

    row("spawn_first", "spawn → first tool result")
    for key, label in (("list_panes", "list_panes"), ("capture_pane", "capture_pane"),
                       ("send_keys", "send_keys (text, no Enter)")):
        row(key, label)
        row(key, label, "p99")
    row("run_command", "run_command `echo hi`")
    row("wait", "wait reaction (pane prints → wait_for_text returns)")
    mem, gmem = d["mem_mb"], d.get("goals_mb", {})
    t.add("mcp-latency", "MCP server process tree, peak RSS (VmRSS sum)", mem["sandmux tree"]["rss_peak"], "MB",
          "libtmux-mcp process tree", mem[f"{B} tree"]["rss_peak"], gmem.get("sandmux tree|rss_peak"))
    t.add("mcp-latency", "MCP server process tree, PSS (median over samples)", mem["sandmux tree"]["pss_median"],
          "MB", "libtmux-mcp process tree", mem[f"{B} tree"]["pss_median"])


def workload_overhead(t: Table, d: dict) -> None:
    w = d["wall_ms"]
    t.add("workload-overhead", "confined workload (untar, grep, find, 400 processes, tar, gcc, rm), wall median",
          w["sandmux"]["median"], "ms", "the same job, plain `bash` (ratio = inside / outside)", w["plain"]["median"],
          {"op": "≤", "value": WORKLOAD_GOAL_RATIO}, goal_on_ratio=True)


def scale(t: Table, d: dict) -> None:
    s = d["summary"]
    reps = f", median of {s['reps']} reps" if s["reps"] > 1 else ""
    for n in s["sizes"]:
        t.add("scale", f"scale: {n} `sandmux serve` started at once → all answered list_panes{reps}",
              s["startup"][str(n)]["all_answered_s"], "s")
    big = str(max(s["sizes"]))
    m = s["memory"][big]
    t.add("scale", f"scale: VmRSS per instance (process tree, N={big}, median)", m["rss_mib_per_instance"], "MiB")
    t.add("scale", f"scale: Pss per instance (process tree, N={big}, median)", m["pss_mib_per_instance"], "MiB")
    fl = s["flood"]
    t.add("scale", "scale: list_panes p99 while another pane floods output (`yes`)", fl["during"]["p99"], "ms",
          "same instance, no flood (p99, before)", fl["before"]["p99"])


def curves(t: Table, d: dict) -> None:
    for r in d["summary"]:
        goal = None
        if r["goal"]:
            goal = {"op": "≤", "value": float(r["goal"].split()[1].rstrip("x"))}
        t.add("curves", r["measurement"], r["sandmux"], r["unit"], r["other_what"], r["other"], goal,
              goal_on_ratio=goal is not None)


def door(t: Table, d: dict) -> None:
    # Rows as bench/door.py writes them; goal: {"op", "value", "on": "ratio" | "sandmux"} or null.
    for r in d["summary"]:
        g = r.get("goal")
        t.add("door", r["measurement"], r["sandmux"], r["unit"], r.get("other_what") or "—", r.get("other"),
              {"op": g["op"], "value": g["value"]} if g else None, goal_on_ratio=bool(g) and g.get("on") == "ratio")


READERS = {"sandbox-start": sandbox_start, "mcp-latency": mcp_latency,
           "workload-overhead": workload_overhead, "scale": scale, "curves": curves, "door": door}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "out"))
    ap.add_argument("--failed", default="", help="comma-separated benchmarks that failed (their rows say so)")
    ap.add_argument("--note", default="", help="a line for the header (e.g. the command that was run)")
    a = ap.parse_args()
    failed = {x for x in a.failed.split(",") if x}

    t = Table()
    data: dict[str, dict] = {}
    ok = True
    for b in BENCHES:
        path = os.path.join(a.out_dir, f"{b}.json")
        if b in failed:
            t.missing(b, f"failed (see {b}.log)")
            continue
        try:
            with open(path) as fh:
                data[b] = json.load(fh)
            READERS[b](t, data[b])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"summary: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            t.missing(b, f"no usable {b}.json")
            ok = False

    first = next(iter(data.values()), {})
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = "; ".join(
        f"{b}: {d['meta']['when']}, {d['meta']['minutes']:.1f} min" if b == "curves" else
        f"{b}: {d.get('date') or d.get('summary', {}).get('date', '?')}, "
        + (f"{d['rounds']} rounds" if "rounds" in d else
           f"N = {','.join(map(str, d['summary']['sizes']))}, {d['summary']['reps']} rep(s), "
           f"{d['summary']['calls']} flood calls per phase" if "summary" in d else "?")
        for b, d in data.items())
    versions = first.get("versions", "?")
    chart = data.get("mcp-latency", {}).get("chart")
    doc = f"""# sandmux benchmarks: summary

{now}.{(' ' + a.note) if a.note else ''}
Machine: {first.get('machine', '?')}.
Versions ({next(iter(data), '?')}): {versions}.
Runs: {runs or 'none'}.

{t.markdown()}

Figures are medians unless the row says p99. ratio = sandmux / other: below 1 means sandmux is faster or
smaller. Goals are sandmux's own (the ≤ 3% workload overhead is the ratio ≤ 1.03); "met?" is for information
only, nothing asserts on times. The per-benchmark reports, with method, spread and more rows, are beside this
file: {', '.join(f'{b}.md' for b in BENCHES)}{f'; the MCP latency chart is {os.path.basename(chart)}' if chart else ''}.
"""
    print(doc)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "summary.md"), "w") as fh:
        fh.write(doc)
    with open(os.path.join(a.out_dir, "summary.json"), "w") as fh:
        rows = [{k: v for k, v in r.items() if k != "cells"} for r in t.rows]
        json.dump({"date": now, "note": a.note, "failed": sorted(failed), "rows": rows}, fh, indent=1)
        fh.write("\n")
    print(f"summary: wrote {os.path.join(a.out_dir, 'summary.md')} and summary.json", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
