#!/bin/bash
# Exp 1b: does `refresh-client -A %P:off` while the control client has a backlog kill tmux 3.3a?
# A control client that reads slowly (backlog queued inside tmux), pane floods, then off.
S=pp1crash$$; D=/tmp/pp-1
tmux -L $S -f /dev/null new-session -d -x 80 -y 24 "sleep 0.5; seq 1 2000000; sleep 600"
P=$(tmux -L $S list-panes -F '#{pane_id}')
SPID=$(tmux -L $S display -p '#{pid}')
# slow reader: the control client's stdout goes through a pipe read 4 KiB at a time slowly
( sleep 1; echo "refresh-client -A '$P:off' ; pipe-pane -O -t $P 'cat > /dev/null'"; sleep 3 ) \
  | tmux -L $S -C attach | (while dd bs=4k count=1 status=none of=/dev/null; do sleep 0.001; done) &
sleep 3
if kill -0 $SPID 2>/dev/null; then echo "server alive"; else echo "server DEAD"; fi
tmux -L $S kill-server 2>/dev/null; kill %1 2>/dev/null; wait
