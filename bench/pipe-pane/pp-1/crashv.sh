#!/bin/bash
# Exp 1b with server log (-v): why the server dies. Log lands in ./tmux-server-PID.log
S=pp1crashv$$; cd /tmp/pp-1
tmux -v -L $S -f /dev/null new-session -d -x 80 -y 24 "sleep 0.5; seq 1 2000000; sleep 600"
P=$(tmux -L $S list-panes -F '#{pane_id}')
SPID=$(tmux -L $S display -p '#{pid}')
( sleep 1; echo "refresh-client -A '$P:off' ; pipe-pane -O -t $P 'cat > /dev/null'"; sleep 3 ) \
  | timeout 6 tmux -L $S -C attach | (timeout 6 bash -c 'while dd bs=4k count=1 status=none of=/dev/null; do sleep 0.001; done') &
sleep 3
if kill -0 $SPID 2>/dev/null; then echo "server alive"; else echo "server DEAD"; fi
timeout 2 tmux -L $S kill-server 2>/dev/null; wait
echo log: tmux-server-$SPID.log
