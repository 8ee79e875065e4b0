# Every way to give a file a set-ID mode or a file capability, and to make
# special files, in the current directory; prints NAME=ok or NAME=ERRNO
# (escape.rs::setid_files_capabilities_and_special_files_never_reach_the_host).
import ctypes, errno, os, stat, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def tr(name, f):
    try:
        f()
        r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(f"{name}={r}", flush=True)
def make(path, flags, mode):
    os.close(os.open(path, flags | os.O_WRONLY, mode))
tr("open_creat", lambda: make("o-creat", os.O_CREAT, 0o4755))
tr("open_creat_sgid", lambda: make("o-creat-g", os.O_CREAT | os.O_EXCL, 0o2755))
tr("tmpfile", lambda: make(".", os.O_TMPFILE, 0o4755))
def creat():
    r = libc.syscall(85, b"creat", 0o4755)
    if r < 0:
        raise OSError(ctypes.get_errno(), "creat")
    os.close(r)
tr("creat", creat)
fd = os.open("plain", os.O_RDONLY)
tr("fchmod", lambda: os.fchmod(fd, 0o4755))
tr("fchmodat", lambda: os.chmod("plain", 0o6755))
def fchmodat2():
    if libc.syscall(452, -100, b"plain", 0o4755, 0) < 0:
        raise OSError(ctypes.get_errno(), "fchmodat2")
tr("fchmodat2", fchmodat2)
tr("mknod_reg", lambda: os.mknod("mknod-reg", stat.S_IFREG | 0o4755))
tr("mkfifo", lambda: os.mkfifo("fifo"))
tr("mknod_sock", lambda: os.mknod("sock-node", stat.S_IFSOCK | 0o600))
tr("whiteout", lambda: os.mknod("whiteout", stat.S_IFCHR | 0o600, 0))
open("to-rename", "w").close()
def rename_whiteout():
    if libc.syscall(316, -100, b"to-rename", -100, b"renamed", 4) < 0:
        raise OSError(ctypes.get_errno(), "renameat2")
tr("rename_whiteout", rename_whiteout)
import socket
s = socket.socket(socket.AF_UNIX)
s.bind("bound.sock")
print("bound=" + ("socket" if stat.S_ISSOCK(os.lstat("bound.sock").st_mode) else "?"), flush=True)
how = ctypes.create_string_buffer(struct.pack("<QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0))
def openat2():
    r = libc.syscall(437, -100, b"openat2", how, 24)
    if r < 0:
        raise OSError(ctypes.get_errno(), "openat2")
    os.close(r)
tr("openat2", openat2)
cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)
tr("setcap", lambda: os.setxattr("plain", "security.capability", cap))
tr("plain_chmod", lambda: os.chmod("plain", 0o750))
