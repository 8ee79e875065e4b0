#!/usr/bin/env python3
"""The copy-on-write door at scale: `sandmux diff` and `sandmux apply` of
layers with 1,000 to 30,000 changed paths, and of one rewritten lockfile,
beside `cp -a` and `git diff --no-index` on the same trees.

Cases (each in a fresh workspace: a git repository with one commit, under
/var/tmp or bench/door's --dir / --tmpfs, with the layers in a private XDG_STATE_HOME on the same file
system):

- files N (N = 1,000, 10,000, 30,000; --quick: 1,000 and 10,000): the
  workspace holds tree/dNNNN/f00.txt .. f49.txt in N/100 directories; the
  agent, `sandmux run --on-end keep -w WS -- sh -c GEN ...`, rewrites line 3
  of each of those (M) and adds f50.txt .. f99.txt beside them (A): N
  changed paths, 100 per directory, about 390 bytes of text each.
- lockfile: the workspace holds Cargo.lock, 25,000 lines (825 KB, under the
  1 MiB `sandmux diff` shows as text); the agent rewrites every line.

What is timed, as whole processes (fork+exec to exit, perf_counter), R
rounds (5; --quick 3), each pair interleaved and its order alternated
round by round:

  `sandmux diff ID --names-only`   vs `git diff --no-index --stat OLD NEW`
  `sandmux diff ID` (>/dev/null)   vs `git diff --no-index OLD NEW` (>/dev/null)
  `sandmux apply ID`               vs `cp -a LAYER/upper DST` (DST fresh)
  `sandmux apply ID --undo`        vs the same `cp -a` (no goal; informative)
  `sandmux apply ID` (same samples) vs `cp -a LAYER/upper DST && sync -f DST`
                                   (apply ends durable; no goal; informative)

OLD is a copy of the workspace's files without .git, NEW the same with the
agent's writes (made on the host by the same script). Every round gets a
fresh layer made the same way (untimed), so no round follows an undo; the
first layer is also applied again once after its undo (it must apply
cleanly: the undo notes what it put back), and what that said is reported.

Goals (from the issue): linear in size; apply <= 2x cp -a; `diff
--names-only` of 30,000 paths <= 1 s. "Linear" is read here as the scaling
exponent k (t ~ N^k) between the two largest sizes <= 1.1. Nothing is
asserted on times; "met?" is information.

Run through bench/door. Exit status: 0 if every case ran (conflicts,
refusals and timeouts of a door command are recorded in the report); 1 if a
case could not be set up; 130 if interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

PER_DIR = 100
LOCK_LINES = 25_000

# One script writes every tree: the workspace's original files (orig), and
# the agent's writes (agent), inside the sandbox and again on the host for
# the baselines' NEW tree. Plain sh (dash): no fork per file.
GEN = r'''
set -e
kind=$1 mode=$2 n=$3
i=0
case $kind in
files)
    while [ $i -lt $n ]; do
        k=$((i % 100)); d=$((10000 + i / 100)); d=tree/d${d#1}; j=$((100 + k)); f=$d/f${j#1}.txt
        i=$((i + 1))
        if [ $k -lt 50 ]; then
            if [ $mode = orig ]; then l3="line 3: an original line that the agent will change in $f"
            else l3="line 3: a line the agent changed in $f, as a refactoring would"; fi
        else
            [ $mode = orig ] && continue
            l3="line 3: a new file that the agent added as $f"
        fi
        [ -d $d ] || mkdir -p $d
        printf '%s\n' "// $f: a text file of bench/door" \
            "line 1: the quick brown fox jumps over the lazy dog in $f" \
            "line 2: lorem ipsum dolor sit amet, consectetur adipiscing elit" \
            "$l3" \
            "line 4: sed do eiusmod tempor incididunt ut labore et dolore magna" \
            "line 5: ut enim ad minim veniam, quis nostrud exercitation ullamco" \
            "line 6: the end of $f" >$f
    done ;;
lock)
    if [ $mode = orig ]; then v=1.0.0 r=a; else v=1.0.1 r=b; fi
    while [ $i -lt $n ]; do
        k=$((100000 + i)); k=${k#1}
        printf 'pkg-%s = "%s" # rev %s%s\n' $k $v $r $k
        i=$((i + 1))
    done >Cargo.lock ;;
esac
'''

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "bench",
           "GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@example.invalid", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}

# measurement key -> (sandmux label, baseline label)
MEAS = {
    "names": ("`sandmux diff ID --names-only`", "`git diff --no-index --stat OLD NEW`"),
    "diff": ("`sandmux diff ID` >/dev/null", "`git diff --no-index OLD NEW` >/dev/null"),
    "apply": ("`sandmux apply ID`", "`cp -a LAYER/upper DST`"),
    "undo": ("`sandmux apply ID --undo`", "`cp -a LAYER/upper DST` (same samples)"),
    # apply ends durable (one syncfs); this copy too: informative, no goal.
    "durable": ("`sandmux apply ID` (same samples)", "`cp -a LAYER/upper DST && sync -f DST`"),
}
SHORT = {"names": "diff --names-only", "diff": "diff", "apply": "apply", "undo": "apply --undo",
         "durable": "cp -a && sync -f"}
APPLY_GOAL = 2.0        # apply <= 2x cp -a
NAMES_GOAL_S = 1.0      # diff --names-only of 30,000 paths <= 1 s
NAMES_GOAL_N = 30_000
LINEAR_GOAL_K = 1.1     # "linear in size": t ~ N^k, k <= 1.1 between the two largest sizes


class SetupError(Exception):
    pass


def log(msg: str) -> None:
    print(f"door: {msg}", file=sys.stderr, flush=True)


def n_str(n: int) -> str:
    return f"{n:,}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10:
        return f"{x:.1f} s"
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x * 1000:.0f} ms" if x >= 0.1 else f"{x * 1000:.1f} ms"


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.sandmux = a.sandmux_bin
        self.base = a.tmp_dir
        self.state = os.path.join(self.base, "state")
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(self.base, "config"), mode=0o700, exist_ok=True)
        self.env = dict(os.environ, XDG_STATE_HOME=self.state, XDG_CONFIG_HOME=os.path.join(self.base, "config"))
        self.genv = dict(os.environ, **GIT_ENV)
        self.scratch = os.path.join(self.base, "out.txt")

    # --- processes -------------------------------------------------------
    def run(self, argv: list[str], cwd: str | None = None, env: dict | None = None, check: bool = True,
            what: str = "") -> subprocess.CompletedProcess:
        p = subprocess.run(argv, cwd=cwd, env=env or self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if check and p.returncode != 0:
            raise SetupError(f"{what or argv[0]} failed (exit {p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
        return p

    def timed(self, argv: list[str], env: dict, cwd: str | None = None, keep_out: bool = True) -> dict:
        """One whole-process run: seconds, exit status, timed out?, stdout
        (written to a scratch file, or /dev/null) and stderr's tail."""
        out = open(self.scratch, "wb") if keep_out else open(os.devnull, "wb")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=cwd or self.base, env=env, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.PIPE, timeout=self.a.timeout)
            dt, rc, err, to = time.perf_counter() - t0, p.returncode, p.stderr, False
        except subprocess.TimeoutExpired as e:
            dt, rc, err, to = time.perf_counter() - t0, None, e.stderr or b"", True
        finally:
            out.close()
        text = ""
        if keep_out:
            with open(self.scratch, "rb") as fh:
                text = fh.read().decode(errors="replace")
        return {"s": dt, "rc": rc, "timeout": to, "out": text, "err": err.decode(errors="replace")[-1000:]}

    def sm(self, *args: str) -> list[str]:
        return [self.sandmux, *args]

    # --- trees -----------------------------------------------------------
    def gen(self, kind: str, mode: str, n: int, cwd: str) -> None:
        self.run(["sh", "-c", GEN, "gen", kind, mode, str(n)], cwd=cwd, what=f"writing the {mode} files")

    def rmtree(self, path: str) -> None:
        if not os.path.lexists(path):
            return
        # An overlay's work/work is mode 000 for an unprivileged owner.
        subprocess.run(["chmod", "-R", "u+rwX", path], stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--", path], stderr=subprocess.DEVNULL)

    def make_layer(self, ws: str, kind: str, n: int) -> tuple[str, float]:
        """`sandmux run --on-end keep`: the agent's writes, in a kept layer."""
        # The door calls a host file changed when its ctime is later than
        # 20 ms before the instance started: let the host's last writes age.
        time.sleep(0.1)
        layers = os.path.join(self.state, "sandmux", "layers")
        before = set(os.listdir(layers)) if os.path.isdir(layers) else set()
        t0 = time.perf_counter()
        p = self.run(self.sm("run", "--on-end", "keep", "-w", ws, "--", "sh", "-c", GEN, "gen", kind, "agent", str(n)),
                     check=False)
        dt = time.perf_counter() - t0
        err = p.stderr.decode(errors="replace")
        m = re.search(r"`sandmux diff ([A-Za-z0-9]+)`", err)
        lid = m.group(1) if m else None
        if lid is None:
            new = sorted(set(os.listdir(layers)) - before) if os.path.isdir(layers) else []
            lid = new[0] if len(new) == 1 else None
        if p.returncode != 0 or lid is None or not os.path.isdir(self.upper(lid)):
            raise SetupError(f"`sandmux run --on-end keep` made no layer (exit {p.returncode}): {err[-2000:]}")
        os.sync()
        return lid, dt

    def upper(self, lid: str) -> str:
        return os.path.join(self.state, "sandmux", "layers", lid, "upper")

    def discard(self, lid: str) -> None:
        p = self.run(self.sm("discard", lid), check=False)
        if p.returncode != 0:
            log(f"discard {lid}: exit {p.returncode}: {p.stderr.decode(errors='replace').strip()[:300]}")
            self.rmtree(os.path.join(self.state, "sandmux", "layers", lid))

    def git_dirty(self, ws: str) -> list[str]:
        p = self.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ws, env=self.genv, check=False)
        return p.stdout.decode(errors="replace").splitlines()

    def restore(self, ws: str) -> None:
        self.run(["git", "checkout", "-q", "--", "."], cwd=ws, env=self.genv, check=False)
        self.run(["git", "clean", "-fdq"], cwd=ws, env=self.genv, check=False)

    # --- one case --------------------------------------------------------
    def case(self, kind: str, n: int) -> dict:
        label = f"{n_str(n)} paths" if kind == "files" else f"lockfile, {n_str(n)} lines rewritten"
        paths = n if kind == "files" else 1
        res: dict = {"case": kind, "label": label, "n": n, "paths": paths, "notes": [], "ok": True}
        cdir = os.path.join(self.base, f"{kind}-{n}")
        ws, old, new = (os.path.join(cdir, x) for x in ("ws", "old", "new"))
        lids: list[str] = []
        try:
            t0 = time.perf_counter()
            log(f"[{label}] workspace: writing the files, git init, add, commit")
            os.makedirs(ws)
            with open(os.path.join(ws, "README.md"), "w") as fh:
                fh.write("A workspace of bench/door.\n")
            self.gen(kind, "orig", n, ws)
            self.run(["git", "init", "-q"], cwd=ws, env=self.genv, what="git init")
            self.run(["git", "add", "-A"], cwd=ws, env=self.genv, what="git add")
            # No automatic gc: at 30,000 loose objects `git commit` starts one
            # in the background, which repacks while the tree is copied.
            self.run(["git", "-c", "gc.auto=0", "commit", "-q", "-m", "the workspace before the agent"],
                     cwd=ws, env=self.genv, what="git commit")
            self.run(["git", "config", "gc.auto", "0"], cwd=ws, env=self.genv, what="git config gc.auto")
            # The baselines' trees: the workspace's files without .git (OLD),
            # and the same with the agent's writes (NEW).
            self.run(["cp", "-a", ws, old], what="cp -a ws old")
            self.rmtree(os.path.join(old, ".git"))
            self.run(["cp", "-a", old, new], what="cp -a old new")
            self.gen(kind, "agent", n, new)
            res["setup_s"] = time.perf_counter() - t0
            log(f"[{label}] the agent's layer: sandmux run --on-end keep -w WS -- sh -c GEN")
            lid, run_s = self.make_layer(ws, kind, n)
            lids.append(lid)
            res["layer_run_s"] = [run_s]
            res["upper_bytes"] = int(self.run(["du", "-sb", self.upper(lid)]).stdout.split()[0])
            res["dirs"] = (n + PER_DIR - 1) // PER_DIR if kind == "files" else 0
            # What the door sees, once, untimed.
            p = self.run(self.sm("diff", lid, "--names-only"), check=False)
            # One line a path, "S path" (S: A, M, D, H ...); "#" lines are
            # remarks (the digest), not paths.
            out_lines = p.stdout.decode(errors="replace").splitlines()
            lines = [ln for ln in out_lines if re.match(r"[A-Z] ", ln)]
            counts: dict[str, int] = {}
            for ln in lines:
                counts[ln[:1]] = counts.get(ln[:1], 0) + 1
            res["names_only"] = {"exit": p.returncode, "lines": len(lines), "by_status": counts,
                                 "other_lines": [ln for ln in out_lines if not re.match(r"[A-Z] ", ln)][:5]}
            if len(lines) != paths:
                res["notes"].append(f"`diff --names-only` listed {len(lines)} paths, expected {paths} "
                                    f"(by status: {counts}; exit {p.returncode})")
            log(f"[{label}] layer {lid}: {len(lines)} paths ({counts}), upper {res['upper_bytes'] / 1e6:.1f} MB; "
                f"{self.a.rounds} rounds")

            samples: dict[str, dict[str, list[float]]] = {k: {"sandmux": [], "baseline": []} for k in MEAS}
            timed_out: dict[str, float] = {}
            rounds_log: list[dict] = []
            for r in range(self.a.rounds):
                if r > 0:
                    lid, run_s = self.make_layer(ws, kind, n)
                    lids.append(lid)
                    res["layer_run_s"].append(run_s)
                rl = self.round(r, lid, old, new, ws, paths, samples, timed_out)
                rounds_log.append(rl)
                if r == 0:
                    res["reapply_after_undo"] = self.reapply(lid, ws)
                self.discard(lid)
                lids.remove(lid)
                log(f"[{label}] round {r + 1}/{self.a.rounds}: " + ", ".join(
                    f"{SHORT[k]} {fmt_s(samples[k]['sandmux'][-1]) if samples[k]['sandmux'] else '—'}"
                    f" / {fmt_s(samples[k]['baseline'][-1]) if samples[k]['baseline'] else '—'}" for k in MEAS)
                    + (f"; apply exit {rl['apply'].get('rc')}" if rl['apply'].get('rc') not in (0, None) else ""))
            res["rounds"] = rounds_log
            res["timed_out"] = timed_out
            res["stats"] = {k: {w: stats(v) for w, v in samples[k].items()} for k in MEAS}
            for k in MEAS:
                if k in timed_out:
                    res["notes"].append(f"`{SHORT[k]}` did not end within {timed_out[k]:.0f} s (killed); "
                                        f"later rounds skipped it")
            bad = [(rl["round"], rl["apply"]) for rl in rounds_log if rl["apply"].get("rc") != 0]
            for rnd, ap in bad:
                res["notes"].append(f"round {rnd + 1}: `apply` exit {ap.get('rc')}"
                                    f"{' (timed out)' if ap.get('timeout') else ''}: {ap.get('applied')} applied, "
                                    f"{ap.get('conflicts')} conflicts, {ap.get('held')} held back"
                                    + (f"; stderr: {ap['err'].strip()[:200]}" if ap.get("err", "").strip() else ""))
            for rl in rounds_log:
                if rl["apply"].get("applied") not in (None, paths) and rl["apply"].get("rc") == 0:
                    res["notes"].append(f"round {rl['round'] + 1}: `apply` said applied for "
                                        f"{rl['apply']['applied']} paths, expected {paths}")
                if rl.get("undo", {}).get("rc") not in (0, None):
                    res["notes"].append(f"round {rl['round'] + 1}: `apply --undo` exit {rl['undo']['rc']}: "
                                        f"{(rl['undo'].get('out', '') + rl['undo'].get('err', '')).strip()[:200]}")
                if rl.get("dirty_after_undo"):
                    res["notes"].append(f"round {rl['round'] + 1}: after `--undo` git status listed "
                                        f"{rl['dirty_after_undo']} paths (restored with git checkout/clean)")
        except (SetupError, OSError, subprocess.SubprocessError) as e:
            res["ok"] = False
            res["error"] = str(e)
            log(f"[{label}] FAILED: {e}")
        finally:
            for lid in lids:
                self.discard(lid)
            self.rmtree(cdir)
        return res

    def round(self, r: int, lid: str, old: str, new: str, ws: str, paths: int,
              samples: dict, timed_out: dict) -> dict:
        """One round: the four pairs, the order alternated by round."""
        rl: dict = {"round": r, "layer": lid}
        sandmux_first = r % 2 == 0
        dst = os.path.join(self.base, "cp-dst")

        def measure(key: str, who: str, argv: list[str], env: dict, keep_out: bool = True) -> dict | None:
            if who == "sandmux" and key in timed_out:
                return None
            x = self.timed(argv, env, keep_out=keep_out)
            if x["timeout"]:
                timed_out[key] = self.a.timeout
                log(f"{SHORT[key]}: killed after {self.a.timeout:.0f} s")
            else:
                samples[key][who].append(x["s"])
            return x

        def pair(key: str, s_argv: list[str], b_argv: list[str], keep_out: bool) -> None:
            order = [("sandmux", s_argv, self.env), ("baseline", b_argv, self.genv)]
            if not sandmux_first:
                order.reverse()
            for who, argv, env in order:
                x = measure(key, who, argv, env, keep_out)
                if x is not None:
                    rl.setdefault(key, {})[who] = {"s": x["s"], "rc": x["rc"], "timeout": x["timeout"]}

        # old/new are relative to the base (cwd of the timed commands).
        o, nw = os.path.relpath(old, self.base), os.path.relpath(new, self.base)
        pair("names", self.sm("diff", lid, "--names-only"), ["git", "diff", "--no-index", "--stat", o, nw], True)
        pair("diff", self.sm("diff", lid), ["git", "diff", "--no-index", o, nw], False)

        # apply + undo against cp -a of the same layer's upper directory.
        def sandmux_side() -> None:
            ap = measure("apply", "sandmux", self.sm("apply", lid), self.env)
            info: dict = {"rc": None, "timeout": True} if ap is None else {"s": ap["s"], "rc": ap["rc"],
                                                                          "timeout": ap["timeout"], "err": ap["err"]}
            if ap is not None:
                out = ap["out"].splitlines()
                info["applied"] = sum(1 for ln in out if ln.startswith("applied "))
                info["conflicts"] = sum(1 for ln in out if ln.startswith("conflict "))
                info["held"] = sum(1 for ln in out if ln.startswith("held back "))
            rl["apply"] = info
            if ap is not None and not ap["timeout"]:
                samples["durable"]["sandmux"].append(ap["s"])
            if ap is not None and ap["rc"] in (0, 3) or ap is not None and ap["timeout"]:
                un = measure("undo", "sandmux", self.sm("apply", lid, "--undo"), self.env)
                if un is not None:
                    rl["undo"] = {"s": un["s"], "rc": un["rc"], "timeout": un["timeout"],
                                  "out": un["out"][-300:], "err": un["err"][-300:]}
            dirty = self.git_dirty(ws)
            if dirty:
                rl["dirty_after_undo"] = len(dirty)
                self.restore(ws)

        def baseline_side() -> None:
            self.rmtree(dst)
            x = self.timed(["cp", "-a", self.upper(lid), dst], self.genv, keep_out=False)
            if x["rc"] != 0:
                raise SetupError(f"cp -a of the layer failed (exit {x['rc']}): {x['err']}")
            samples["apply"]["baseline"].append(x["s"])
            samples["undo"]["baseline"].append(x["s"])
            rl["cp"] = {"s": x["s"]}
            t0 = time.perf_counter()
            self.rmtree(dst)
            rl["cp"]["rm_s"] = time.perf_counter() - t0
            os.sync()
            y = self.timed(["sh", "-c", 'cp -a "$1" "$2" && sync -f "$2"', "sh", self.upper(lid), dst],
                           self.genv, keep_out=False)
            if y["rc"] != 0:
                raise SetupError(f"cp -a && sync -f of the layer failed (exit {y['rc']}): {y['err']}")
            samples["durable"]["baseline"].append(y["s"])
            rl["cp"]["durable_s"] = y["s"]
            self.rmtree(dst)

        for side in ((sandmux_side, baseline_side) if sandmux_first else (baseline_side, sandmux_side)):
            side()
            os.sync()
        return rl

    def reapply(self, lid: str, ws: str) -> dict:
        """After the first round's apply and undo: the same layer applied
        again (untimed), and undone; what it said."""
        p = self.run(self.sm("apply", lid), check=False)
        out = p.stdout.decode(errors="replace").splitlines()
        r = {"rc": p.returncode, "applied": sum(1 for ln in out if ln.startswith("applied ")),
             "conflicts": sum(1 for ln in out if ln.startswith("conflict ")),
             "first_conflict": next((ln for ln in out if ln.startswith("conflict ")), None)}
        u = self.run(self.sm("apply", lid, "--undo"), check=False)
        r["undo_rc"] = u.returncode
        dirty = self.git_dirty(ws)
        if dirty:
            r["dirty_after_undo"] = len(dirty)
            self.restore(ws)
        return r


def stats(xs: list[float]) -> dict:
    if not xs:
        return {"med": None, "min": None, "max": None, "n": 0, "samples": []}
    return {"med": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "samples": xs}


def exponent(n1: int, t1: float | None, n2: int, t2: float | None) -> float | None:
    import math
    if not t1 or not t2 or n1 == n2:
        return None
    return math.log(t2 / t1) / math.log(n2 / n1)


def report(cases: list[dict], a: argparse.Namespace, meta: dict) -> tuple[str, list[dict], dict]:
    main_rows: list[list[str]] = []
    summary: list[dict] = []
    files = [c for c in cases if c["case"] == "files" and c.get("ok")]
    largest = max((c["n"] for c in files), default=None)

    def med(c: dict, k: str, who: str) -> float | None:
        return c["stats"][k][who]["med"]

    for c in cases:
        if not c.get("ok"):
            main_rows.append([c["label"], f"**could not be set up: {c.get('error', '?')[:200]}**", "—", "—", "—", "—", "—", "—"])
            continue
        for k in MEAS:
            s, b = med(c, k, "sandmux"), med(c, k, "baseline")
            ratio = s / b if s is not None and b else None
            fs, fb = c["stats"][k]["sandmux"]["min"], c["stats"][k]["baseline"]["min"]
            fratio = fs / fb if fs is not None and fb else None
            goal, met = "—", None
            if k == "apply":
                # Met on the medians and on the fastest rounds both.
                goal = f"≤ {APPLY_GOAL:g}x cp -a"
                met = ratio is not None and ratio <= APPLY_GOAL and fratio is not None and fratio <= APPLY_GOAL
            if k == "names" and c["case"] == "files" and c["n"] == NAMES_GOAL_N:
                goal = f"≤ {NAMES_GOAL_S:g} s"
                met = s is not None and s <= NAMES_GOAL_S
            s_cell = fmt_s(s) if k not in c["timed_out"] else f"> {c['timed_out'][k]:.0f} s (killed)"
            if k in c["timed_out"] and s is not None:
                s_cell = f"{fmt_s(s)} ({c['stats'][k]['sandmux']['n']} runs; one > {c['timed_out'][k]:.0f} s)"
            if k in c["timed_out"] and goal != "—":
                met = False
            main_rows.append([c["label"], f"{MEAS[k][0]} vs {MEAS[k][1]}", s_cell, fmt_s(b),
                              f"{ratio:.2f}x" if ratio is not None else "—",
                              f"{fratio:.2f}x" if fratio is not None else "—", goal,
                              "—" if goal == "—" else ("yes" if met else "no")])
            what = f"{MEAS[k][1]}, same tree"
            g = None
            if k == "apply":
                g = {"op": "≤", "value": APPLY_GOAL, "on": "ratio"}
            elif k == "names" and c["case"] == "files" and c["n"] == NAMES_GOAL_N:
                g = {"op": "≤", "value": NAMES_GOAL_S, "on": "sandmux"}
            # The summary table: the largest size and the lockfile, not undo.
            if (c["case"] == "lock" or c["n"] == largest) and k != "undo" and (k != "names" or c["case"] == "files"):
                if g and g["on"] == "sandmux":
                    g = dict(g, value=g["value"] * 1000)
                summary.append({"measurement": f"door: {MEAS[k][0]}, {c['label']}, median", "unit": "ms",
                                "sandmux": s * 1000 if s is not None else None,
                                "other": b * 1000 if b is not None else None,
                                "other_what": what, "ratio": ratio, "goal": g,
                                "met": None if g is None else (met if k not in c["timed_out"] else False)})

    # Scaling over the files cases.
    scaling: dict = {}
    scale_rows: list[list[str]] = []
    if len(files) >= 2:
        ns = [c["n"] for c in files]
        for k in MEAS:
            for who in ("sandmux", "baseline"):
                t = [med(c, k, who) for c in files]
                per = [x / n * 1e6 if x is not None else None for x, n in zip(t, ns)]
                marg = [(t[i + 1] - t[i]) / (ns[i + 1] - ns[i]) * 1e6 if t[i] is not None and t[i + 1] is not None
                        else None for i in range(len(ns) - 1)]
                k_top = exponent(ns[-2], t[-2], ns[-1], t[-1])
                k_all = exponent(ns[0], t[0], ns[-1], t[-1])
                scaling.setdefault(k, {})[who] = {"us_per_path": per, "marginal_us_per_path": marg,
                                                  "k_top": k_top, "k_all": k_all}
                if who == "baseline" and k == "undo":
                    continue
                label = MEAS[k][0] if who == "sandmux" else MEAS[k][1]
                timed = who == "sandmux" and any(k in c["timed_out"] for c in files)
                scale_rows.append([label + (" (a run was killed: figures are of the runs that ended)" if timed else ""),
                                   *[f"{x:.1f}" if x is not None else "—" for x in per],
                                   *[f"{x:.1f}" if x is not None else "—" for x in marg],
                                   f"{k_all:.2f}" if k_all is not None else "—",
                                   *([f"{k_top:.2f}" if k_top is not None else "—"] if len(ns) > 2 else [])])
        for k in ("names", "diff", "apply", "undo"):
            kt = scaling[k]["sandmux"]["k_top"]
            kb = scaling[k]["baseline"]["k_top"]
            timed = any(k in c["timed_out"] for c in files)
            met = None if kt is None or timed else kt <= LINEAR_GOAL_K
            size = f"{n_str(ns[-2])} → {n_str(ns[-1])} paths"
            main_rows.append([size, f"{MEAS[k][0]}: scaling exponent k (t ∝ N^k)",
                              f"{kt:.2f}" if kt is not None else "—",
                              f"{kb:.2f}" if kb is not None and k != "undo" else "—", "—", "—",
                              f"linear: k ≤ {LINEAR_GOAL_K:g}", "—" if met is None else ("yes" if met else "no")])
            if k != "undo":
                summary.append({"measurement": f"door: {MEAS[k][0]}, scaling exponent k (t ∝ N^k), "
                                               f"{n_str(ns[-2])} → {n_str(ns[-1])} paths",
                                "unit": "", "sandmux": kt, "other": None,
                                "other_what": f"(baseline {MEAS[k][1]}: k = {kb:.2f})" if kb is not None else "—",
                                "ratio": None, "goal": {"op": "≤", "value": LINEAR_GOAL_K, "on": "sandmux"},
                                "met": met})

    head = ["size", "measurement (sandmux vs baseline)", "sandmux median", "baseline median", "ratio",
            "ratio of fastest rounds", "goal", "met?"]
    table = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|---|---|"]
    table += ["| " + " | ".join(r) + " |" for r in main_rows]

    scale_md = ""
    if scale_rows:
        ns = [c["n"] for c in files]
        sh = (["command"] + [f"µs/path at {n_str(n)}" for n in ns]
              + [f"marginal µs/path {n_str(ns[i])} → {n_str(ns[i + 1])}" for i in range(len(ns) - 1)]
              + [f"k {n_str(ns[0])} → {n_str(ns[-1])}"] + ([f"k {n_str(ns[-2])} → {n_str(ns[-1])}"] if len(ns) > 2 else []))
        scale_md = "\n".join(["| " + " | ".join(sh) + " |", "|---" + "|---:" * (len(sh) - 1) + "|"]
                             + ["| " + " | ".join(r) + " |" for r in scale_rows])

    spread = ["| case | command | median | min | max | n |", "|---|---|---:|---:|---:|---:|"]
    for c in cases:
        if not c.get("ok"):
            continue
        for k in MEAS:
            for who in ("sandmux", "baseline"):
                if k == "undo" and who == "baseline":
                    continue
                st = c["stats"][k][who]
                spread.append(f"| {c['label']} | {MEAS[k][0] if who == 'sandmux' else MEAS[k][1]} | {fmt_s(st['med'])} "
                              f"| {fmt_s(st['min'])} | {fmt_s(st['max'])} | {st['n']} |")

    notes = []
    for c in cases:
        if not c.get("ok"):
            notes.append(f"- {c['label']}: could not be set up: {c.get('error')}")
            continue
        ra = c.get("reapply_after_undo")
        setup = (f"- {c['label']}: {str(c['dirs']) + ' directories; ' if c.get('dirs') else ''}the layer's upper directory "
                 f"{c['upper_bytes'] / 1e6:.1f} MB; `diff --names-only` listed {c['names_only']['lines']} "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(c['names_only']['by_status'].items()))}); "
                 f"`sandmux run` writing the layer: median {fmt_s(statistics.median(c['layer_run_s']))}")
        if ra:
            setup += (f"; the first layer applied again after its `--undo`: exit {ra['rc']}, {ra['applied']} applied, "
                      f"{ra['conflicts']} conflicts"
                      + (f" (`{ra['first_conflict']}`)" if ra.get("first_conflict") else "")
                      + f", undo exit {ra['undo_rc']}")
        notes.append(setup)
        notes += [f"  - {x}" for x in c["notes"]]

    now = meta["when"]
    doc = f"""# the door at scale: `sandmux diff` / `apply` vs `git diff --no-index` / `cp -a`

{now}; {a.rounds} rounds per measurement (pairs interleaved, order alternated by round); uid {os.getuid()};
the run took {meta['minutes']:.1f} min.
Machine: {meta['machine']}.
Versions: {meta['versions']}.
Command: `bench/door{' --quick' if a.quick else ''}{' --rounds ' + str(a.rounds) if a.rounds_given else ''}{' ' + a.where_flag if a.where_flag else ''}`.

{chr(10).join(table)}

ratio = sandmux / baseline of the medians (below 1: sandmux is faster); ratio of fastest rounds: of each
command's fastest round. The `apply` goal is met when both ratios are within it. Goals (from the issue): linear in size (read here as
the exponent k of t ∝ N^k between the two largest sizes ≤ {LINEAR_GOAL_K:g}); `apply` ≤ {APPLY_GOAL:g}x `cp -a`;
`diff --names-only` of {n_str(NAMES_GOAL_N)} paths ≤ {NAMES_GOAL_S:g} s{'' if largest == NAMES_GOAL_N else ' (not run: no ' + n_str(NAMES_GOAL_N) + '-path case in this run)'}.
"met?" is information; nothing asserts on times.

## Scaling (medians per changed path)

{scale_md or '(needs two or more sizes)'}

Marginal µs/path: the extra time per extra path between two sizes (the fixed cost of a process start cancels);
equal marginals mean linear. k: the exponent of t ∝ N^k (a fixed cost pulls it below 1).

## Spread

{chr(10).join(spread)}

## Method

- Each case is a fresh workspace under {a.where}: a git repository with one commit. Files N: `tree/dNNNN/`
  directories of {PER_DIR} paths each; the workspace holds f00..f49.txt of each, the agent rewrites line 3 of
  those (M) and adds f50..f99.txt (A), about 390 bytes of text each. Lockfile: `Cargo.lock`, {n_str(LOCK_LINES)}
  lines of 33 bytes (825 KB, below the 1 MiB `sandmux diff` shows as text), every line rewritten.
- The agent's writes come from `sandmux run --on-end keep -w WS -- sh -c GEN` (default profile), with
  XDG_STATE_HOME and XDG_CONFIG_HOME set to private directories beside the workspace (same file system).
- Timed: whole processes from fork+exec to exit; stdout of `--names-only`, `--stat` and `apply` to a file,
  of the full diffs to /dev/null. OLD = a copy of the workspace's files without .git, NEW = OLD with the
  agent's writes made on the host by the same script; git runs with no system or global configuration.
- `apply` copies the layer's files into the workspace, each written beside its place and renamed
  over it, with a journal, all made durable by one `syncfs` at the end (src/door/apply.rs); `cp -a` makes a fresh copy of the layer's upper directory on
  the same file system and fsyncs nothing. `--undo` is shown against the same `cp -a` samples, with no goal.
- Every round applies a fresh layer (made the same way, untimed), so no round follows an undo; the first
  layer is also applied again after its `--undo` (see the notes). The diff pairs use that round's layer too. After each undo, `git status` checks that the workspace is as it was.
- The page cache is warm (every tree was just written); `sync` after each setup step and each apply pair.
  A command running past {a.timeout:.0f} s is killed and recorded (later rounds skip it).

## Notes

{chr(10).join(notes) if notes else '- none'}
"""
    return doc, summary, scaling


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--tmp-dir", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--where", default="/var/tmp (a disk)")
    ap.add_argument("--where-flag", default="")
    a = ap.parse_args()
    a.rounds_given = a.rounds is not None
    if a.rounds is None:
        a.rounds = 3 if a.quick else 5
    sizes = [1_000, 10_000] if a.quick else [1_000, 10_000, 30_000]
    t_start = time.time()
    b = Bench(a)
    cases = []
    try:
        for n in sizes:
            cases.append(b.case("files", n))
        cases.append(b.case("lock", LOCK_LINES))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "minutes": (time.time() - t_start) / 60, "machine": os.environ.get("BENCH_MACHINE", "?"),
            "versions": os.environ.get("BENCH_VERSIONS", "?")}
    doc, summary, scaling = report(cases, a, meta)
    print(doc)
    data = {"benchmark": "door", "date": meta["when"], "rounds": a.rounds, "quick": a.quick, "sizes": sizes,
            "lock_lines": LOCK_LINES, "timeout_s": a.timeout, "uid": os.getuid(), "machine": meta["machine"],
            "versions": meta["versions"], "minutes": meta["minutes"], "sandmux": a.sandmux_bin,
            "goals": {"apply_over_cp": APPLY_GOAL, "names_only_30k_s": NAMES_GOAL_S, "linear_k": LINEAR_GOAL_K},
            "cases": cases, "scaling": scaling, "summary": summary}
    md = a.out_md
    os.makedirs(os.path.dirname(os.path.abspath(md)), exist_ok=True)
    with open(md, "w") as fh:
        fh.write(doc)
    js = os.path.splitext(md)[0] + ".json"
    with open(js, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    log(f"wrote {md} and {js}")
    return 0 if all(c.get("ok") for c in cases) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
