#!/bin/bash
# Exp 2: pipe-pane with a stopped reader. Pane floods (yes), pipe-pane -O 'cat > /dev/null',
# reader SIGSTOPped at t=1s. Prints every 0.5 s: tmux server RSS (MiB), bytes the pane's
# writer has written (wchar of `yes`), and bytes cat has read (rchar). Stops at 12 s or RSS > 3 GiB.
S=pp2$$
tmux -L $S -f /dev/null new-session -d -x 80 -y 24 "exec yes 0123456789012345678901234567890123456789"
SPID=$(tmux -L $S display -p '#{pid}'); PP=$(tmux -L $S display -p '#{pane_pid}')
tmux -L $S pipe-pane -O -t %0 'exec cat > /dev/null'
sleep 0.3; CAT=$(pgrep -P $SPID -x cat)
echo "server=$SPID yes=$PP cat=$CAT"
for i in $(seq 1 24); do
  [ $i = 3 ] && kill -STOP $CAT && echo "--- reader stopped"
  rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$SPID/status)
  w=$(awk '/wchar/{print $2}' /proc/$PP/io); r=$(awk '/rchar/{print $2}' /proc/$CAT/io)
  echo "t=$(echo "$i*0.5"|bc) rss_MiB=$rss yes_written_MB=$((w/1000000)) cat_read_MB=$((r/1000000))"
  [ "$rss" -gt 3072 ] && echo "stop: RSS over 3 GiB" && break
  sleep 0.5
done
kill -CONT $CAT; tmux -L $S kill-server
