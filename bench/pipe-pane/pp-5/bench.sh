#!/bin/bash
# Exp 5: a pane prints 20 MB (cat of base64 text); one config per run; prints: config wall_s tmux_cpu_s
# A none | B control client with %output | C client, pane paused + pipe-pane 'cat >/dev/null'
# D client paused + pipe into a unix-socket reader outside (sockcat -> sink.py) | E client paused + hand-off (grab.py)
CFG=$1; D=/tmp/pp-5; cd $D; L=pp5_$$; WANT=$2
rm -f go t0 t1 cnt cnt.ready ctl; mkfifo ctl
tmux -L $L -f /dev/null new-session -d -x 80 -y 24 "while [ ! -e $D/go ]; do sleep 0.005; done; date +%s.%N > $D/t0; cat $D/data; date +%s.%N > $D/t1; sleep 600"
SPID=$(tmux -L $L display -p '#{pid}')
if [ $CFG != A ]; then tmux -L $L -C attach < ctl > /dev/null & CL=$!; exec 7>ctl; fi
sleep 0.2
case $CFG in
 C) echo "refresh-client -A '%0:pause'" >&7; tmux -L $L pipe-pane -O -t %0 "exec cat > /dev/null";;
 D) rm -f $D/s.sock; python3 sink.py $D/s.sock $D/cnt $WANT & while [ ! -S $D/s.sock ]; do sleep 0.01; done; echo "refresh-client -A '%0:pause'" >&7; tmux -L $L pipe-pane -O -t %0 "exec $D/sockcat $D/s.sock";;
 E) python3 grab.py $SPID $D/cnt $WANT & echo "refresh-client -A '%0:pause'" >&7; tmux -L $L pipe-pane -O -t %0 "exec sleep 60"
    while [ ! -e cnt.ready ]; do sleep 0.005; done;;
esac
sleep 0.2
c0=$(awk '{print $14+$15}' /proc/$SPID/stat); s0=$(date +%s.%N); touch go
while [ ! -e t1 ]; do sleep 0.01; done
if [ $CFG = D -o $CFG = E ]; then for i in $(seq 1 2000); do [ -s cnt ] && break; sleep 0.005; done; fi
s1=$(date +%s.%N); c1=$(awk '{print $14+$15}' /proc/$SPID/stat)
echo "$CFG wall=$(echo "$(cat t1) - $(cat t0)" | bc) reader_done=$(echo "$s1 - $s0" | bc) tmux_cpu=$(echo "($c1 - $c0)/100" | bc -l | cut -c1-5) got=$(cat cnt 2>/dev/null)"
tmux -L $L kill-server; exec 7>&-; wait 2>/dev/null
