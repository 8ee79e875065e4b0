# the "supervisor" reader for D: accepts one connection on PATH, counts bytes into COUNTFILE when done
import socket, sys, os
p, out = sys.argv[1], sys.argv[2]
if os.path.exists(p): os.unlink(p)
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(1)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 17)
    if not b: break
    n += len(b)
    if n >= int(sys.argv[3]): open(out, "w").write(str(n)); 
open(out, "w").write(str(n))
