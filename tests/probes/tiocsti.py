# TIOCSTI on stdin/stdout/stderr and /dev/tty, plainly and with high bits
# set in the request (escape.rs::tiocsti_injection_refused): prints
# INJECTED for any that worked, else fd:errno for each.
import fcntl,os
res=[]
fds=[0,1,2]
try:
  fds.append(os.open('/dev/tty',os.O_RDWR))
except OSError as e:
  res.append('tty:%d'%e.errno)
for fd in fds:
  for req in (0x5412, 0x5412|(1<<32)):
    try:
      fcntl.ioctl(fd, req, b'X'); res.append('INJECTED')
    except OSError as e:
      res.append('%d:%d'%(fd,e.errno))
    except OverflowError:
      import ctypes; r=ctypes.CDLL(None,use_errno=True).syscall(16, fd, ctypes.c_ulong(req), b'X'); res.append('INJECTED' if r==0 else '%d:%d'%(fd,ctypes.get_errno()))
print(' '.join(res))
