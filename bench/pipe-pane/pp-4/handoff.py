#!/usr/bin/env python3
"""Exp 4: the pipe's socket handed to the supervisor. pipe-pane -O runs a holder (`exec sleep 30`)
inside; the supervisor (this script, outside any Landlock domain) finds the tmux server's child
whose fd 0 is a socket, takes that fd with pidfd_getfd(2), checks SO_PEERCRED.pid == server pid,
kills the holder, and reads the pane's raw bytes itself. Run as root or as uid 65534 (setpriv).
argv: SOCKET PATH  (a tmux server running as the same uid, pane %0 prints seq 1..N after /tmp/pp-4/go)"""
import os, sys, socket, struct, ctypes, time, subprocess, re, signal
L = sys.argv[1]; N = int(os.environ.get("N", "300000"))
libc = ctypes.CDLL(None, use_errno=True)
def tm(*a): return subprocess.run(["tmux", "-S", L, *a], capture_output=True, text=True).stdout.strip()
spid = int(tm("display", "-p", "#{pid}"))
t0 = time.time()
tm("pipe-pane", "-O", "-t", "%0", "exec sleep 30")
holder = None; fd = -1; seen = set()
for _ in range(400):
    for p in open(f"/proc/{spid}/task/{spid}/children").read().split():
        p = int(p)
        if p in seen: continue
        try:
            if not (os.readlink(f"/proc/{p}/fd/0").startswith("socket:") and open(f"/proc/{p}/comm").read().strip() == "sleep"): continue
        except OSError: continue
        seen.add(p)
        pfd = os.pidfd_open(p)
        f = libc.syscall(438, pfd, 0, 0)
        if f < 0: print(f"candidate {p}: pidfd_getfd: {os.strerror(ctypes.get_errno())}"); continue
        c = socket.socket(fileno=f)
        cpid, cuid, _ = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        verdict = "OK" if cpid == spid else "REJECT (decoy)"
        print(f"candidate {p}: SO_PEERCRED pid={cpid} (server {spid}) -> {verdict}")
        if cpid == spid: holder, fd, s, hpfd = p, f, c, pfd
        else: c.close()
    if holder: break
    time.sleep(0.001)
pfd = hpfd
r = libc.syscall(424, pfd, signal.SIGKILL, None, 0)   # pidfd_send_signal: the holder goes
if r: print("pidfd_send_signal:", os.strerror(ctypes.get_errno()))
print(f"uid={os.getuid()} holder={holder} took fd={fd} in {1000*(time.time()-t0):.1f} ms; ")
time.sleep(0.2)
print("after the holder is killed: pane_pipe =", tm("display", "-p", "-t", "%0", "#{pane_pipe}"), "; holder state:", open(f"/proc/{holder}/stat").read().split(") ")[1][0] if os.path.exists(f"/proc/{holder}/stat") else "gone")
open("/tmp/pp-4/go", "w").close()
data = bytearray(); s.settimeout(2.0)
try:
    while True:
        b = s.recv(1 << 16)
        if not b: break
        data += b
except socket.timeout: pass
nums = [int(x) for x in re.findall(rb"(\d+)\r\n", data)]
ok = nums == list(range(1, N + 1))
print(f"read {len(data)} bytes directly from tmux's socketpair; sequence 1..{N} exact: {ok}")
