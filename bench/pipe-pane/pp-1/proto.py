#!/usr/bin/env python3
"""Exp 1 (v2): hand-over of a flooding pane from %output to pipe-pane, plain tmux 3.3a.
usage: proto.py MODE TRIALS [FLAGS]     (FLAGS: control client flags, e.g. pause-after=2)
  offpipe : one list on the watcher: `refresh-client -A %P:off ; pipe-pane -O -t %P 'cat > F'`
  pausepipe: one list: `refresh-client -A %P:pause ; pipe-pane -O ...`
  proto   : `pipe-pane -O ...` on the watcher; bytes of %output before that command's %end
            are the prefix; after the %end arrives: `refresh-client -A %P:pause`
  fail    : proto with a reader that dies (head -c K); when #{pane_pipe} is 0: `-A %P:continue`
Counts: numbered lines 1..N (seq), concatenation prefix+pipe (+ %output after continue)."""
import os, re, subprocess, sys, time, random, select
MODE, TRIALS = sys.argv[1], int(sys.argv[2]); FLAGS = sys.argv[3] if len(sys.argv) > 3 else ""
N = int(os.environ.get("N", "300000")); D = "/tmp/pp-1"
def tm(sock, *a): return subprocess.run(["tmux", "-L", sock, *a], capture_output=True, text=True).stdout
def decode(s):
    out = bytearray(); i = 0
    while i < len(s):
        if s[i] == 0x5c: out.append(int(s[i+1:i+4], 8)); i += 4
        else: out.append(s[i]); i += 1
    return bytes(out)
def nums(b): return [int(x) for x in re.findall(rb"(\d+)\r\n", b)]
def verdict(seq):
    gaps = dups = lost = 0
    for a, b in zip(seq, seq[1:]):
        if b == a + 1: continue
        if b <= a: dups += 1
        else: gaps += 1; lost += b - a - 1
    return gaps, dups, lost
tot = {"crash": 0, "gap": 0, "dup": 0, "clean": 0}
for t in range(TRIALS):
    sock = f"pp1p_{os.getpid()}_{t}"; pf = f"{D}/pipe.{os.getpid()}.{t}"; go = f"{D}/go.{os.getpid()}.{t}"
    gen = f"while [ ! -e {go} ]; do sleep 0.01; done; seq 1 {N}; sleep 600"
    subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", gen], check=True)
    pane = tm(sock, "list-panes", "-F", "#{pane_id}").strip(); spid = int(tm(sock, "display", "-p", "#{pid}"))
    argv = ["tmux", "-L", sock, "-C", "attach"] + (["-f", FLAGS] if FLAGS else [])
    w = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    time.sleep(0.2); open(go, "w").close()
    buf = b""; outb = bytearray(); state = 0; split = None; after = None
    delay = random.uniform(0.02, 0.5); t0 = time.time(); last = t0; blocks = 0; pending_end = False
    reader = f"cat > {pf}" if MODE != "fail" else f"head -c {random.randint(20000, 300000)} > {pf}"
    slow = random.random() < 0.5
    while True:
        r, _, _ = select.select([w.stdout], [], [], 0.2)
        if r:
            chunk = os.read(w.stdout.fileno(), 1 << 14 if slow else 1 << 16)
            if not chunk: break
            if slow: time.sleep(0.002)       # a reader that lags: tmux queues blocks for it
            buf += chunk; last = time.time()
            *lines, buf = buf.split(b"\n")
            for l in lines:
                p = pane.encode()
                if l.startswith(b"%output " + p + b" "): outb += decode(l[len(p) + 9:])
                elif l.startswith(b"%extended-output " + p + b" "): outb += decode(l.split(b" : ", 1)[1])
                elif l.startswith(b"%end ") or l.startswith(b"%error "):
                    blocks += 1
                    if pending_end and blocks == want: split = len(outb); pending_end = False
                elif l.startswith(b"%pause"): pass
        now = time.time()
        if state == 0 and now - t0 > delay:
            state = 1
            if MODE == "offpipe": w.stdin.write(f"refresh-client -A '{pane}:off' ; pipe-pane -O -t {pane} '{reader}'\n".encode())
            elif MODE == "pausepipe": w.stdin.write(f"refresh-client -A '{pane}:pause' ; pipe-pane -O -t {pane} '{reader}'\n".encode())
            else:
                w.stdin.write(f"pipe-pane -O -t {pane} '{reader}'\n".encode())
                want = blocks + 2   # +1: the attach's own reply block, counted once below
                want = 2 if blocks == 0 else blocks + 1
                pending_end = True
            tsw = now
        if state == 1 and MODE in ("proto", "fail") and split is not None:
            state = 2; w.stdin.write(f"refresh-client -A '{pane}:pause'\n".encode())
        if state == 2 and MODE == "fail" and now - tsw > 0.01:
            if tm(sock, "display", "-p", "-t", pane, "#{pane_pipe}").strip() == "0":
                state = 3; after = len(outb); w.stdin.write(f"refresh-client -A '{pane}:continue'\n".encode())
        if state >= 1 and now - last > 1.0: break
        if now - t0 > 90: break
    time.sleep(0.3)
    pipeb = open(pf, "rb").read() if os.path.exists(pf) else b""
    try: alive = open(f"/proc/{spid}/stat").read().split(") ")[1][0] not in "ZX"
    except OSError: alive = False
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True); w.kill()
    for f in (pf, go):
        if os.path.exists(f): os.unlink(f)
    if MODE in ("proto", "fail"):
        pre = bytes(outb[:split]) if split is not None else bytes(outb)
        stream = pre + pipeb + (bytes(outb[after:]) if after is not None else b"")
        # overlap check: %output bytes between the split and the pause must equal the pipe's prefix
        mid = bytes(outb[split:after if after is not None else len(outb)]) if split is not None else b""
        ovl_ok = pipeb.startswith(mid) if MODE == "proto" else None
    else:
        stream = bytes(outb) + pipeb; ovl_ok = None
    s = nums(stream); g, d, lost = verdict(s)
    complete = s[:1] == [1] and s[-1:] == [N]
    k = "crash" if not alive else ("gap" if g or not complete else ("dup" if d else "clean"))
    tot[k] += 1
    print(f"t={t} slow={int(slow)} delay={delay:.2f} out={len(outb)} split={split} pipe={len(pipeb)} gaps={g} lost_lines={lost} dups={d} complete={complete} overlap_ok={ovl_ok} alive={alive}", flush=True)
print(MODE, FLAGS, tot)
