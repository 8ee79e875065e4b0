"""Spends as much of the inotify budget as it is given, from inside the
sandbox: watches (up to argv[2]) and instances (up to argv[3]); prints
what it got and the errno that stopped it, then "held" and keeps it all
until its standard input closes."""
import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
d, most_watches, most_instances = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
fd = libc.inotify_init1(0)
n = 0
stopped = "none"
while n < most_watches:
    p = f"{d}/{n}"
    open(p, "w").close()
    if libc.inotify_add_watch(fd, p.encode(), 2) < 0:
        stopped = str(ctypes.get_errno())
        break
    n += 1
print(f"watches {n} stopped {stopped}", flush=True)
held, stopped = [fd], "none"
while len(held) < most_instances:
    f = libc.inotify_init1(0)
    if f < 0:
        stopped = str(ctypes.get_errno())
        break
    held.append(f)
print(f"instances {len(held)} stopped {stopped}", flush=True)
print("held", flush=True)
sys.stdin.read()
