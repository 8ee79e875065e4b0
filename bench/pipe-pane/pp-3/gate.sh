#!/bin/sh
# stand-in for the pane gate: one Landlock layer with scopes; /tmp/pp-3/chan not granted
exec /tmp/pp-3/llwrap -s -r /usr -r /bin -r /lib -r /lib64 -r /etc -r /proc -r /tmp/pp-3/bin -w /dev -w /tmp/pp-3/pane -- /bin/sh "$@"
