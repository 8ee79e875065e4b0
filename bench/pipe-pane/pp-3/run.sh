#!/bin/bash
# Exp 3: what a pane process (uid 65534, same as the tmux server) can do to pipe-pane channels.
# LABEL gate = pane under gate.sh (Landlock layer + scopes); LABEL nogate = positive control.
set -u; L=$1; D=/tmp/pp-3; cd $D
printf 'set -g default-shell %s/%s.sh\n' $D $L > $D/$L.conf
rm -rf chan pane sock; mkdir -p chan pane sock; mkfifo chan/fifo; chmod 777 chan/fifo
chown 65534:65534 chan pane sock; chmod 700 sock; : > listen.log; chmod 755 $D
python3 listen.py & LST=$!; sleep 0.3
cat chan/fifo > fifo.out & FR=$!
T="setpriv --reuid 65534 --regid 65534 --clear-groups env -i PATH=/usr/bin:/bin TMUX_TMPDIR=$D/sock SECRET_SERVER_ENV=1 tmux -L $L -f $D/$L.conf"
$T new-session -d 'while :; do date; sleep 0.2; done'
SPID=$($T display -p '#{pid}')
$T pipe-pane -O -t %0 "exec cat > $D/chan/out.A"
$T new-window 'while :; do date; sleep 0.2; done'; $T pipe-pane -O -t %1 "exec cat > $D/chan/fifo"
$T new-window 'while :; do date; sleep 0.2; done'; $T pipe-pane -O -t %2 "exec python3 $D/bin/sockcat.py $D/chan/sock"
sleep 0.5; CAT=$(for p in $(pgrep -P $SPID -x cat); do [ "$(readlink /proc/$p/fd/1)" = $D/chan/out.A ] && echo $p; done)
$T new-window "python3 $D/bin/attack.py $SPID $CAT $L > $D/pane/result.$L 2>&1; sleep 30"
sleep 3
cat pane/result.$L
echo "== listener (root side) saw:"; cat listen.log
echo "== FIFO reader got forged bytes: $(grep -c FORGED fifo.out)"
echo "== root view of the pipe child $CAT: fds:"; ls -l /proc/$CAT/fd | awk 'NR>1{print $9,$10,$11}'
echo "== its environ (keys):"; tr '\0' '\n' < /proc/$CAT/environ | cut -d= -f1 | tr '\n' ' '; echo
echo "== its Landlock domain vs pane: status of pipe child / attack pane"; grep -i -E "^(NoNewPrivs|Seccomp)" /proc/$CAT/status | tr '\n' ' '; echo
echo "== pipe states:"; $T list-panes -a -F '#{pane_id} pipe=#{pane_pipe}'
$T kill-server; kill $LST $FR 2>/dev/null; wait 2>/dev/null
