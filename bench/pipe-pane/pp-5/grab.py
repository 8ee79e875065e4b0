# config E: the supervisor takes the holder's fd 0 (pidfd_getfd), kills the holder, reads to COUNTFILE
import os, sys, socket, ctypes, signal, time
libc = ctypes.CDLL(None, use_errno=True)
spid, out, want = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
h = None
while not h:
    for p in open(f"/proc/{spid}/task/{spid}/children").read().split():
        try:
            if open(f"/proc/{p}/comm").read().strip() == "sleep" and os.readlink(f"/proc/{p}/fd/0").startswith("socket:"): h = int(p)
        except OSError: pass
pfd = os.pidfd_open(h); fd = libc.syscall(438, pfd, 0, 0); libc.syscall(424, pfd, 9, None, 0)
s = socket.socket(fileno=fd); n = 0; open(out + ".ready", "w").close()
while n < want:
    b = s.recv(1 << 17)
    if not b: break
    n += len(b)
open(out, "w").write(str(n))
