#!/usr/bin/env python3
"""Confined workload overhead: one file- and process-heavy job, run with plain
`bash` and with `sandmux run -w WS -- bash`, in interleaved rounds.

Run through bench/workload-overhead, which finds (or builds) the sandmux binary
and makes the workspace. Standard library only.

The job (JOB below, written to WS/job.sh) works on a deterministic tree of
small C files generated once, untimed, into WS/src.tar:

  untar    tar xf src.tar                                 (~3000 .c + 300 .h files)
  grep     three grep -r passes (literal, regex, count)
  find-wc  find | xargs wc -l
  spawn    400 short processes: `cksum < file` for 400 files, one at a time
  tar      tar cf of the whole tree
  cc       gcc -O0 -c of 40 files, one link, run the program
  rm       rm -rf of everything the job made

Each phase's time is taken inside the job with $EPOCHREALTIME; the harness
takes the wall time of the whole command (spawn to exit). The job's results
(counts, checksums, the program's output) must be identical in both
environments, or the run fails.

Sandbox start is measured separately in the same rounds (`sandmux run -w WS --
true` against plain `true`), so the job overhead can be reported net of it.

Times are never asserted on. Exit status 1: something failed to run or the two
environments disagreed about the job's results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

N_DIRS = 30
FILES_PER_DIR = 100  # 3000 .c files
HEADERS_PER_DIR = 10  # 300 .h files
N_COMPILE = 40
N_SPAWN = 400
STARTS_PER_ROUND = 5  # `sandmux run -- true` and `true` samples per round

PHASES = ["untar", "grep", "find-wc", "spawn", "tar", "cc", "rm"]

# The job. $1 = the workspace. Everything it writes stays inside the workspace
# (TMPDIR too, so gcc's temporaries land on the same filesystem in both runs;
# inside the sandbox /tmp is a tmpfs). Locale and PATH are pinned because the
# sandbox clears the environment.
JOB = r"""#!/bin/bash
set -euo pipefail
export LC_ALL=C PATH=/usr/bin:/bin
cd "$1"
export TMPDIR="$PWD/tmp"
last=$EPOCHREALTIME
phase() {  # phase NAME: print the time since the previous mark, in microseconds
    local now=$EPOCHREALTIME
    echo "phase $1 $(( ${now/./} - ${last/./} ))"
    last=$now
}
rm -rf work tmp out.tar
mkdir work tmp
last=$EPOCHREALTIME

tar xf src.tar -C work
phase untar

echo "result grep-todo $(grep -rn 'TODO' work | wc -l)"
echo "result grep-regex $(grep -rlE 'f_[0-9]*7 *\(' work | wc -l)"
echo "result grep-count $(grep -rc 'return' work | cksum | cut -d' ' -f1)"
phase grep

echo "result wc $(find work -type f -name '*.[ch]' -print0 | sort -z | xargs -0 wc -l | tail -n 1 | tr -s ' ' | cut -d' ' -f2)"
phase find-wc

n=0
while IFS= read -r f; do
    cksum < "$f"
    n=$((n + 1))
done < <(find work -type f -name '*.c' | sort | head -n __N_SPAWN__) > tmp/spawn.txt
echo "result spawn $n $(cksum < tmp/spawn.txt | cut -d' ' -f1)"
phase spawn

tar cf out.tar work
echo "result tar-bytes $(stat -c %s out.tar)"
phase tar

objs=()
for i in $(seq 0 $((__N_COMPILE__ - 1))); do
    d=$((i % __N_DIRS__))
    gcc -O0 -Iwork/src/include -c "work/src/d$(printf %02d $d)/f$(printf %04d $i).c" -o "tmp/f$i.o"
    objs+=("tmp/f$i.o")
done
gcc -O0 -Iwork/src/include work/src/main.c "${objs[@]}" -o tmp/prog
echo "result prog $(./tmp/prog)"
phase cc

rm -rf work tmp out.tar
phase rm
"""


def log(msg: str) -> None:
    print(f"workload-overhead: {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------
# the source tree

def c_file(rng: random.Random, i: int) -> str:
    """A small, valid C file defining int f_<i>(int)."""
    d = i % N_DIRS
    lines = [f"/* f{i:04d}.c: generated for bench/workload-overhead */",
             f'#include "h{d:02d}_{i % HEADERS_PER_DIR}.h"', ""]
    helpers = rng.randint(2, 6)
    for h in range(helpers):
        a, b, c = rng.randint(1, 97), rng.randint(1, 97), rng.randint(1, 13)
        if rng.random() < 0.15:
            lines.append(f"/* TODO: tune helper {h} of f_{i} */")
        lines += [f"static int h{h}_{i}(int x)", "{",
                  f"    int acc = {a};",
                  f"    for (int k = 0; k < {c}; k++)",
                  f"        acc = (acc * {b} + x + k) % 1000003;",
                  "    return acc;", "}", ""]
    lines += [f"int f_{i}(int x)", "{", "    int s = x;"]
    for h in range(helpers):
        lines.append(f"    s = (s + h{h}_{i}(s)) % 1000003;")
    lines += ["    return s;", "}", ""]
    return "\n".join(lines)


def make_tree(ws: str, seed: int = 20261130) -> None:
    """Write WS/src.tar (fixed content and mtimes), removing the loose files."""
    rng = random.Random(seed)
    root = os.path.join(ws, "gen")
    src = os.path.join(root, "src")
    os.makedirs(os.path.join(src, "include"))
    for d in range(N_DIRS):
        os.makedirs(os.path.join(src, f"d{d:02d}"))
        for h in range(HEADERS_PER_DIR):
            with open(os.path.join(src, "include", f"h{d:02d}_{h}.h"), "w") as fh:
                fh.write(f"#ifndef H{d:02d}_{h}\n#define H{d:02d}_{h}\n"
                         f"/* header {d}/{h}; TODO: document */\n"
                         f"#define K{d:02d}_{h} {rng.randint(1, 1 << 20)}\n#endif\n")
    for i in range(N_DIRS * FILES_PER_DIR):
        with open(os.path.join(src, f"d{i % N_DIRS:02d}", f"f{i:04d}.c"), "w") as fh:
            fh.write(c_file(rng, i))
    with open(os.path.join(src, "main.c"), "w") as fh:
        fh.write("#include <stdio.h>\n")
        fh.write("".join(f"int f_{i}(int);\n" for i in range(N_COMPILE)))
        fh.write("int main(void)\n{\n    long t = 0;\n")
        fh.write("".join(f"    t += f_{i}({i});\n" for i in range(N_COMPILE)))
        fh.write('    printf("%ld\\n", t);\n    return 0;\n}\n')

    def norm(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 1700000000, 0, 0, "", ""
        return ti

    with tarfile.open(os.path.join(ws, "src.tar"), "w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(src, arcname="src", filter=norm)
    shutil.rmtree(root)


# --------------------------------------------------------------------------
# running

CPU_MS: list[float] = [0.0]  # user + system CPU time of the last run() and all its waited-for descendants


def children_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1000.0


def run(argv: list[str], capture: bool) -> tuple[float, subprocess.CompletedProcess]:
    c0 = children_cpu_ms()
    t0 = time.perf_counter_ns()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                       stderr=subprocess.PIPE, close_fds=True)
    ms = (time.perf_counter_ns() - t0) / 1e6
    CPU_MS[0] = children_cpu_ms() - c0
    return ms, p


def cpu_pressure_us() -> int | None:
    """PSI 'some' total for the CPU (microseconds some task waited for a CPU), or None."""
    try:
        with open("/proc/pressure/cpu") as fh:
            for ln in fh:
                if ln.startswith("some "):
                    return int(ln.split("total=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def run_checked(name: str, argv: list[str], capture: bool) -> tuple[float, subprocess.CompletedProcess]:
    ms, p = run(argv, capture)
    if p.returncode != 0:
        raise BenchError(f"{name} failed (exit {p.returncode}): {shlex.join(argv)}\n"
                         f"{p.stderr.decode(errors='replace').rstrip()}")
    return ms, p


def parse_job(out: bytes) -> tuple[dict[str, float], list[str]]:
    phases: dict[str, float] = {}
    results: list[str] = []
    for ln in out.decode(errors="replace").splitlines():
        parts = ln.split()
        if len(parts) == 3 and parts[0] == "phase":
            phases[parts[1]] = int(parts[2]) / 1000.0
        elif parts and parts[0] == "result":
            results.append(ln)
    if sorted(phases) != sorted(PHASES):
        raise BenchError(f"job printed phases {sorted(phases)}, expected {sorted(PHASES)}:\n{out.decode(errors='replace')}")
    return phases, results


def pct(q: float, xs: list[float]) -> float:
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--out-md", required=True)
    args = ap.parse_args()
    ws = args.workspace
    if os.path.realpath(ws) != ws:
        raise BenchError(f"workspace {ws} has a symlink in its path; pass its realpath")

    t = time.perf_counter()
    make_tree(ws)
    job_path = os.path.join(ws, "job.sh")
    with open(job_path, "w") as fh:
        fh.write(JOB.replace("__N_SPAWN__", str(N_SPAWN)).replace("__N_COMPILE__", str(N_COMPILE))
                 .replace("__N_DIRS__", str(N_DIRS)))
    log(f"generated {N_DIRS * FILES_PER_DIR} .c + {N_DIRS * HEADERS_PER_DIR} .h files into "
        f"{ws}/src.tar ({os.path.getsize(os.path.join(ws, 'src.tar')) // 1024} KiB) in {time.perf_counter() - t:.1f} s")

    true_bin = shutil.which("true") or "/usr/bin/true"
    bash = shutil.which("bash") or "/bin/bash"
    cmds = {
        "plain": [bash, job_path, ws],
        "sandmux": [args.sandmux_bin, "run", "-w", ws, "--", bash, job_path, ws],
        "true": [true_bin],
        "sandmux-true": [args.sandmux_bin, "run", "-w", ws, "--", "true"],
    }

    # Smoke + warm-up (page cache, gcc's files): one untimed run of each; the
    # two job runs must agree on every result line.
    ref: dict[str, list[str]] = {}
    for name in ("plain", "sandmux"):
        _, p = run_checked(name, cmds[name], capture=True)
        ref[name] = parse_job(p.stdout)[1]
    if ref["plain"] != ref["sandmux"]:
        raise BenchError("plain and sandmux runs of the job disagree:\n  plain:   "
                         + "\n           ".join(ref["plain"]) + "\n  sandmux: " + "\n           ".join(ref["sandmux"]))
    if len(ref["plain"]) != 7:
        raise BenchError(f"job printed {len(ref['plain'])} result lines, expected 7: {ref['plain']}")
    for name in ("true", "sandmux-true"):
        run_checked(name, cmds[name], capture=False)

    wall: dict[str, list[float]] = {"plain": [], "sandmux": []}
    cpu: dict[str, list[float]] = {"plain": [], "sandmux": []}
    psi0 = cpu_pressure_us()
    phases: dict[str, dict[str, list[float]]] = {n: {ph: [] for ph in PHASES} for n in wall}
    ratios: list[float] = []
    starts: dict[str, list[float]] = {"true": [], "sandmux-true": []}
    t_all = time.perf_counter()
    for r in range(args.rounds):
        order = ("plain", "sandmux") if r % 2 == 0 else ("sandmux", "plain")
        this: dict[str, float] = {}
        for name in order:
            ms, p = run_checked(name, cmds[name], capture=True)
            ph, res = parse_job(p.stdout)
            if res != ref["plain"]:
                raise BenchError(f"round {r + 1}: {name} results changed:\n  " + "\n  ".join(res))
            wall[name].append(ms)
            cpu[name].append(CPU_MS[0])
            this[name] = ms
            for k, v in ph.items():
                phases[name][k].append(v)
        ratios.append(this["sandmux"] / this["plain"])
        for i in range(STARTS_PER_ROUND):
            for name in (("true", "sandmux-true") if (r + i) % 2 == 0 else ("sandmux-true", "true")):
                ms, _ = run_checked(name, cmds[name], capture=False)
                starts[name].append(ms)
        log(f"round {r + 1}/{args.rounds}: plain {this['plain']:.0f} ms, sandmux {this['sandmux']:.0f} ms "
            f"({(this['sandmux'] / this['plain'] - 1) * 100:+.1f}%)")
    elapsed = time.perf_counter() - t_all
    psi1 = cpu_pressure_us()
    psi_note = ("n/a" if psi0 is None or psi1 is None
                else f"{(psi1 - psi0) / 1e6 / elapsed * 100:.0f}% of the time some task was waiting for a CPU "
                     "(`/proc/pressure/cpu`, machine-wide)")

    # ---- statistics
    med = {n: statistics.median(v) for n, v in wall.items()}
    start_med = {n: statistics.median(v) for n, v in starts.items()}
    start_cost = start_med["sandmux-true"] - start_med["true"]
    overhead = med["sandmux"] / med["plain"] - 1
    paired = statistics.median(ratios) - 1
    net = (med["sandmux"] - start_cost) / med["plain"] - 1

    def f(x: float) -> str:
        return f"{x:.1f}"

    def sgn(x: float) -> str:
        return f"{x * 100:+.1f}%"

    rows = ["| command | median ms | p90 ms | min ms | max ms | median CPU ms (user+sys) |",
            "|---|---:|---:|---:|---:|---:|"]
    label = {"plain": "`bash job.sh WS` (plain)", "sandmux": "`sandmux run -w WS -- bash job.sh WS`"}
    for n in ("plain", "sandmux"):
        v = wall[n]
        rows.append(f"| {label[n]} | {f(med[n])} | {f(pct(90, v))} | {f(min(v))} | {f(max(v))} "
                    f"| {f(statistics.median(cpu[n]))} |")
    for n, lab in (("true", "`true` (plain)"), ("sandmux-true", "`sandmux run -w WS -- true`")):
        v = starts[n]
        rows.append(f"| {lab} | {statistics.median(v):.2f} | {pct(90, v):.2f} | {min(v):.2f} | {max(v):.2f} | |")
    wall_table = "\n".join(rows)

    summary = "\n".join([
        "| figure | value |", "|---|---:|",
        f"| job overhead, ratio of medians (sandmux / plain - 1) | **{sgn(overhead)}** |",
        f"| job overhead, median of per-round ratios | {sgn(paired)} |",
        f"| sandbox start (median `sandmux run -- true` - median `true`) | {start_cost:.2f} ms |",
        f"| job overhead net of sandbox start | {sgn(net)} |",
        f"| per-round ratios: min, quartiles, max | {sgn(min(ratios) - 1)}, {sgn(pct(25, ratios) - 1)} .. "
        f"{sgn(pct(75, ratios) - 1)}, {sgn(max(ratios) - 1)} |",
        f"| CPU time (user+sys), ratio of medians | {sgn(statistics.median(cpu['sandmux']) / statistics.median(cpu['plain']) - 1)} |",
    ])

    prow = ["| phase | plain median ms | sandmux median ms | difference |", "|---|---:|---:|---:|"]
    for ph in PHASES:
        a, b = statistics.median(phases["plain"][ph]), statistics.median(phases["sandmux"][ph])
        prow.append(f"| {ph} | {f(a)} | {f(b)} | {sgn(b / a - 1) if a > 0 else 'n/a'} |")
    a = sum(statistics.median(phases["plain"][ph]) for ph in PHASES)
    b = sum(statistics.median(phases["sandmux"][ph]) for ph in PHASES)
    prow.append(f"| sum of phase medians | {f(a)} | {f(b)} | {sgn(b / a - 1)} |")
    phase_table = "\n".join(prow)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    q = shlex.join
    doc = f"""# confined workload overhead: `sandmux run` vs plain `bash`

{now}; {args.rounds} interleaved rounds (order alternates each round); {STARTS_PER_ROUND} start samples of each
kind per round; uid {os.getuid()}; {elapsed:.0f} s of measuring.
CPU contention during the run: {psi_note}.
Machine: {os.environ.get('BENCH_MACHINE', '?')}.
Versions: {os.environ.get('BENCH_VERSIONS', '?')}.

Wall time of the whole command (spawn to exit, `time.perf_counter_ns`):

{wall_table}

{summary}

Per phase (timed inside the job with `$EPOCHREALTIME`, so without sandbox start or teardown):

{phase_table}

The job: {N_DIRS * FILES_PER_DIR} small C files + {N_DIRS * HEADERS_PER_DIR} headers in `src.tar`
({os.path.getsize(os.path.join(ws, 'src.tar')) // 1024} KiB, generated once with a fixed seed); untar; 3x `grep -r`;
`find | xargs wc -l`; {N_SPAWN} x `cksum < file` (one process each); `tar cf`; `gcc -O0 -c` of {N_COMPILE} files, a link
and a run; `rm -rf`. TMPDIR is in the workspace in both runs. Results (grep counts, checksums, tar size, the
program's output) were identical in both environments in every round.

Commands:
- plain: `{q(cmds['plain'])}`
- sandmux: `{q(cmds['sandmux'])}`
- start: `{q(cmds['sandmux-true'])}` and `{q(cmds['true'])}`
"""
    print(doc)

    # The same figures, machine-readable, beside the tables (bench/run reads it).
    def stats(v: list[float]) -> dict:
        return {"median": statistics.median(v), "p90": pct(90, v), "min": min(v), "max": max(v), "n": len(v)}
    data = {
        "benchmark": "workload-overhead", "date": now, "rounds": args.rounds, "uid": os.getuid(),
        "elapsed_s": elapsed, "cpu_pressure": psi_note,
        "machine": os.environ.get("BENCH_MACHINE", "?"), "versions": os.environ.get("BENCH_VERSIONS", "?"),
        "commands": {n: q(c) for n, c in cmds.items()},
        "wall_ms": {n: stats(v) for n, v in wall.items()},
        "start_ms": {n: stats(v) for n, v in starts.items()},
        "cpu_ms": {n: stats(v) for n, v in cpu.items()},
        "ratio": med["sandmux"] / med["plain"],  # sandmux / plain, ratio of medians
        "overhead": overhead, "overhead_paired": paired, "overhead_net_of_start": net,
        "start_cost_ms": start_cost,
        "round_ratios": ratios,
        "phases_ms": {n: {ph: statistics.median(v) for ph, v in phs.items()} for n, phs in phases.items()},
    }

    def write_both(md_path: str) -> None:
        os.makedirs(os.path.dirname(md_path), exist_ok=True)
        with open(md_path, "w") as fh:
            fh.write(doc)
        with open(os.path.splitext(md_path)[0] + ".json", "w") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
    try:
        write_both(args.out_md)
        log(f"wrote {args.out_md} and {os.path.splitext(args.out_md)[0]}.json")
    except OSError as e:
        alt = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"workload-overhead.{os.getuid()}.md")
        log(f"cannot write {args.out_md} ({e.strerror}); writing {alt} instead")
        write_both(alt)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
