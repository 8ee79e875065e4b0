#!/usr/bin/env python3
"""Exp 1: %output -> pipe-pane hand-over (and back) in one command list; count gaps/dups.
usage: switch.py MODE TRIALS   MODE = fwd | fwdt | back | fail
  fwd : one client; `refresh-client -A %P:off ; pipe-pane -O -t %P 'cat > F'`
  fwdt: command client (no-output) sends `refresh-client -t WATCHER -A ... ; pipe-pane ...`
  back: fwd, then planned switch back: `refresh-client -A %P:on ; pipe-pane -t %P` (close)
  fail: fwd with a reader that dies (head -c), then `on` after #{pane_pipe}==0 is seen
"""
import os, re, subprocess, sys, time, random, select
MODE, TRIALS = sys.argv[1], int(sys.argv[2])
N = int(os.environ.get("N", "400000"))
D = "/tmp/pp-1"
def tm(sock, *a): return subprocess.run(["tmux", "-L", sock, *a], capture_output=True, text=True).stdout
def decode(s):
    out = bytearray(); i = 0
    while i < len(s):
        c = s[i]
        if c == 0x5c: out.append(int(s[i+1:i+4], 8)); i += 4
        else: out.append(c); i += 1
    return bytes(out)
def check(data):
    nums = [int(x) for x in re.findall(rb"(\d+)\r?\n", data)]
    gaps = dups = 0; lost = 0
    for a, b in zip(nums, nums[1:]):
        if b == a + 1: continue
        if b <= a: dups += 1
        else: gaps += 1; lost += b - a - 1
    return nums, gaps, dups, lost
res = []
for t in range(TRIALS):
    sock = f"pp1_{os.getpid()}_{t}"
    pf = f"{D}/pipe.{t}"
    if os.path.exists(pf): os.unlink(pf)
    # the generator waits for a go file, so the control client is attached first
    gen = f"while [ ! -e {D}/go.{t} ]; do sleep 0.01; done; seq 1 {N}; sleep 600"
    subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", gen], check=True)
    pane = tm(sock, "list-panes", "-F", "#{pane_id}").strip()
    w = subprocess.Popen(["tmux", "-L", sock, "-C", "attach"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    cmdc = None
    if MODE == "fwdt":
        cmdc = subprocess.Popen(["tmux", "-L", sock, "-C", "attach", "-f", "no-output"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        time.sleep(0.2)
        wname = [l for l in tm(sock, "list-clients", "-F", "#{client_name} #{client_flags}").splitlines() if "no-output" not in l][0].split()[0]
    time.sleep(0.2)
    open(f"{D}/go.{t}", "w").close()
    buf = b""; outb = bytearray(); switched = False; back = False
    delay = random.uniform(0.05, 0.6)   # when to switch (mid-flood)
    t0 = time.time(); last = time.time()
    reader = "cat > " + pf if MODE != "fail" else f"head -c {random.randint(20000,400000)} > {pf}"
    while True:
        r, _, _ = select.select([w.stdout], [], [], 0.3)
        if r:
            chunk = os.read(w.stdout.fileno(), 1 << 16)
            if not chunk: break
            buf += chunk; last = time.time()
            *lines, buf = buf.split(b"\n")
            for l in lines:
                if l.startswith(b"%output " + pane.encode() + b" "):
                    outb += decode(l[len(pane) + 9:])
        now = time.time()
        if not switched and now - t0 > delay:
            switched = True
            if MODE == "fwdt":
                cmdc.stdin.write(f"refresh-client -t {wname} -A '{pane}:off' ; pipe-pane -O -t {pane} '{reader}'\n".encode())
            else:
                w.stdin.write(f"refresh-client -A '{pane}:off' ; pipe-pane -O -t {pane} '{reader}'\n".encode())
            tsw = now
        if MODE == "back" and switched and not back and now - tsw > random.uniform(0.05, 0.3):
            back = True
            w.stdin.write(f"refresh-client -A '{pane}:on' ; pipe-pane -t {pane}\n".encode())
        if MODE == "fail" and switched and not back and now - tsw > 0.02:
            if tm(sock, "display", "-p", "-t", pane, "#{pane_pipe}").strip() == "0":
                back = True
                w.stdin.write(f"refresh-client -A '{pane}:on'\n".encode())
        if switched and now - last > 1.0: break
        if now - t0 > 60: break
    time.sleep(0.3)
    pipeb = open(pf, "rb").read() if os.path.exists(pf) else b""
    alive = tm(sock, "display", "-p", "#{pid}").strip() != ""
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    w.kill(); cmdc and cmdc.kill()
    if MODE in ("back", "fail"):
        # order: output before switch, pipe, output after switch-back: %output bytes are one stream,
        # split where numbers jump back/forward; simplest: merge by number
        n1, *_ = check(bytes(outb)); n2, *_ = check(pipeb)
        allnums = sorted(n1 + n2)
        s = set(allnums)
        lost = N - len(s); dups = len(allnums) - len(s)
        res.append((t, len(outb), len(pipeb), "lost_lines", lost, "dup_lines", dups, "server_alive", alive))
    else:
        nums, gaps, dups, lost = check(bytes(outb) + pipeb)
        ok = nums[:1] == [1] and nums[-1:] == [N]
        res.append((t, len(outb), len(pipeb), "gaps", gaps, "dups", dups, "lost", lost, "first_last_ok", ok, "server_alive", alive))
    print(*res[-1], flush=True)
    os.unlink(f"{D}/go.{t}")
