# Forks until refused (at most 5,000), counts, then kills its children
# (escape.rs::fork_bomb_is_contained).
import os,time
pids=[]
err=None
for i in range(5000):
  try:
    p=os.fork()
  except OSError as e:
    err=e.errno
    break
  if p==0:
    time.sleep(20)
    os._exit(0)
  pids.append(p)
print('forked',len(pids),'err',err,'procs',len([d for d in os.listdir('/proc') if d.isdigit()]),flush=True)
for p in pids:
  os.kill(p,9)
