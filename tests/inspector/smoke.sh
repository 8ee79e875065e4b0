#!/usr/bin/env bash
# Smoke test: drive `sandmux serve` (MCP over stdio) with MCP Inspector's CLI mode.
#
#   npm ci --prefix tests/inspector        # once, as root, before (needs the npm registry)
#   bash tests/inspector/smoke.sh          # any user; SANDMUX_BIN overrides the binary
#
# Every Inspector CLI call spawns its own `sandmux serve`, so nothing (no tmux
# session) survives from one call to the next. Runs as root and as an
# unprivileged user with HOME=/nonexistent: all it writes is under one mktemp dir.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${SANDMUX_BIN:-$here/../../target/debug/sandmux}"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
inspector="$here/node_modules/.bin/mcp-inspector"
# The Inspector CLI hands its whole environment to the server, and sandmux
# refuses to start on a SANDMUX_* variable it does not know (SANDMUX_BIN is
# one): keep every SANDMUX_* out, which also keeps the toolsets the profile's.
for v in $(compgen -e | grep '^SANDMUX_'); do unset "$v"; done

if [ ! -x "$bin" ]; then
    echo "inspector smoke: sandmux binary not found at $bin (build it or set SANDMUX_BIN)" >&2
    exit 2
fi
if [ ! -x "$inspector" ]; then
    echo "inspector smoke: $inspector missing; run: npm ci --prefix tests/inspector" >&2
    exit 2
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sandmux-inspector.XXXXXX")" || exit 2
trap 'rm -rf "$tmp"' EXIT
ws="$tmp/ws"
log="$tmp/audit.log" # outside the workspace, as serve requires
mkdir "$ws" || exit 2

passed=0
failed=0
out="$tmp/out"
err="$tmp/err"
serr="$tmp/sandmux.err" # sandmux's own stderr, which the Inspector would swallow

# inspect ARGS...: one Inspector CLI call against a fresh `sandmux serve`; stdout
# (the result as JSON.stringify(result, null, 2)) in $out, the Inspector's
# stderr in $err, sandmux's in $serr (bash only redirects it, then execs sandmux).
inspect() {
    : >"$serr"
    timeout -k 5 60 "$inspector" --cli \
        bash -c 'exec "$@" 2>>"$0"' "$serr" "$bin" serve -w "$ws" --audit-log "$log" "$@" \
        </dev/null >"$out" 2>"$err"
}

# check NAME STATUS [PATTERN...]: PATTERN is a fixed string that must occur in
# $out, or !STRING that must not.
check() {
    local name="$1" status="$2" why=""
    shift 2
    [ "$status" -eq 0 ] || why="inspector exited $status"
    local p
    for p in "$@"; do
        [ -n "$why" ] && break
        if [ "${p#!}" != "$p" ]; then
            grep -qF -- "${p#!}" "$out" && why="output contains ${p#!}"
        else
            grep -qF -- "$p" "$out" || why="output lacks $p"
        fi
    done
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "ok - $name"
    else
        failed=$((failed + 1))
        echo "FAIL - $name: $why"
        echo "  stdout:"; head -c 4000 "$out" | sed 's/^/    /'
        echo "  stderr:"; tail -n 30 "$err" | sed 's/^/    /'
        echo "  sandmux stderr:"; tail -n 30 "$serr" | sed 's/^/    /'
    fi
}

# (a) the catalogue: sandmux's tools, not libtmux-mcp's server-wide ones.
inspect --method tools/list
check "tools/list has run_command and sandbox_status, not list_servers" $? \
    '"name": "run_command"' '"name": "sandbox_status"' '!list_servers'

# (b) create_session (the SDK client also checks structuredContent against outputSchema).
inspect --method tools/call --tool-name create_session --tool-arg session_name=smoke
check "tools/call create_session" $? '"isError": false' '"session_name": "smoke"'

# (c) run_command. This is a new sandmux process with a fresh tmux server; serve
# starts it with one session ("main"), so the command runs there.
inspect --method tools/call --tool-name run_command --tool-arg 'command=echo inspector-$((6*7))'
check "tools/call run_command returns output and exit status" $? \
    '"isError": false' '"output": "inspector-42"' '"exit_status": 0'

# (d) typed arguments: the Inspector converts --tool-arg values by the schema's
# type, which it can only do for plain `number`/`boolean` (not ["number","null"]).
# max_lines=3 keeps the head and the tail: lines 1 and 2, a marker, line 10.
inspect --method tools/call --tool-name run_command --tool-arg 'command=seq 1 10' \
    --tool-arg timeout=5 --tool-arg max_lines=3 --tool-arg suppress_history=false
check "tools/call run_command with a number, an integer and a boolean" $? \
    '"isError": false' '"timeout": 5' '"output": "1\n2\n' '\n10"' '"truncated_lines": 7'
inspect --method tools/call --tool-name send_keys --tool-arg text=typed --tool-arg enter=false
check "tools/call send_keys with enter=false" $? '"isError": false' '"keys": []'
# No schema uses a format the SDK's validator does not know.
inspect --method tools/list
check "tools/list schemas have no unknown formats" $? '"name": "run_command"'
if grep -q 'unknown format' "$err"; then
    failed=$((failed + 1)); echo "FAIL - the Inspector warned: $(grep -m1 'unknown format' "$err")"
fi

# (e) resources.
inspect --method resources/list
check "resources/list has sandmux://status" $? '"uri": "sandmux://status"'

echo "inspector-smoke: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
