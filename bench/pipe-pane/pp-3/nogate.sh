#!/bin/sh
# positive control: same uid, no Landlock layer
exec /bin/sh "$@"
