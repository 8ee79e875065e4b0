#!/bin/bash
# Exp 4 driver: tmux server as uid 65534; supervisor as $1 (root | nobody)
D=/tmp/pp-4; rm -f $D/go; L=pp4$$
U="setpriv --reuid 65534 --regid 65534 --clear-groups env -i PATH=/usr/bin:/bin SHELL=/bin/sh TMUX_TMPDIR=$D"
$U tmux -L $L -f /dev/null new-session -d "while [ ! -e $D/go ]; do sleep 0.01; done; seq 1 300000; sleep 30"
if [ "$1" = root ]; then env TMUX_TMPDIR=$D python3 $D/handoff.py $D/tmux-65534/$L; else $U python3 $D/handoff.py $D/tmux-65534/$L; fi
# fds: does the pipe command inherit any descriptor of the server beyond 0-2? (server started with fd 9 open)
$U bash -c "exec 9>$D/fd9; tmux -L ${L}b -f /dev/null new-session -d 'sleep 30'"
P=$($U tmux -L ${L}b display -p '#{pid}'); echo "server ${L}b fds: $(ls /proc/$P/fd | tr '\n' ' ') (9 -> $(readlink /proc/$P/fd/9))"
$U tmux -L ${L}b pipe-pane -O -t %0 "ls -l /proc/self/fd > $D/pipefds 2>&1; echo >&9 x 2>>$D/pipefds"; sleep 0.3
echo "pipe command's fds:"; awk 'NR>1{print "   ", $9, $10, $11}' $D/pipefds; grep -i bad $D/pipefds | sed 's/^/    /'
$U tmux -L $L kill-server; $U tmux -L ${L}b kill-server
# decoy: a pane process that looks like the holder (child of the server, fd 0 a socket, comm sleep)
rm -f $D/go; $U tmux -L ${L}c -f /dev/null new-session -d "while [ ! -e $D/go ]; do sleep 0.01; done; seq 1 300000; sleep 30"
$U tmux -L ${L}c new-window "exec python3 -c \"import socket,os; a,b=socket.socketpair(); os.dup2(b.fileno(),0); os.execvp('sleep',['sleep','30'])\""
sleep 0.3; echo "with a decoy pane:"
if [ "$1" = root ]; then env TMUX_TMPDIR=$D python3 $D/handoff.py $D/tmux-65534/${L}c; else $U python3 $D/handoff.py $D/tmux-65534/${L}c; fi
$U tmux -L ${L}c kill-server
