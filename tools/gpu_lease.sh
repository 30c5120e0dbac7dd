#!/usr/bin/env bash
# One GPU session across several calls of a lent machine, with no work lost between them:
# tools/gpu_session.sh runs in the background in a process session of its own (setsid), and each
# call only waits for it and brings back what it has done so far.
#
#   tools/gpu_lease.sh OUT BACK WAIT [gpu_session.sh flags ...]
#
#   OUT    the session's folder on the machine (/tmp/s): gpu_session.sh OUT FLAGS runs there once
#   BACK   a folder whose files come back from the call (the device tool's $OUT)
#   WAIT   seconds this call waits at most for the session to end (a call's timeout_s less ~20 s)
#
# The first call into OUT starts `setsid tools/gpu_session.sh OUT FLAGS` (its --budget bounds the
# whole session, not one call); a later call into the same OUT (the same machine, within the
# 30 s it stays warm) starts nothing and waits again. The device tool ends what a command leaves
# running when it returns, except a process that started a session of its own (setsid), which
# runs on until the machine goes back (/work/.library/device/README.md): so the machine works
# through the idle gap between two calls, and a session needs one set-up, one sweep start and
# one pack, not one a call (speed_ladder/sweep/lease_session.py, the plan of such a session).
#
# Every call leaves in BACK: status.txt (gpu_session.sh's, each phase), lease.txt (this script's
# lines) and session.tgz, OUT less the compile caches and the staged inputs (results, logs, test
# state; ~2 MB): while the session runs, what it has finished; once it has ended, all of it.
# Exit: the session's own status once it has ended (0 ok, 3 work left for a later session, 1
# failed), 4 while it still runs (call again at once: the same command), 5 when it was started
# here and is gone without a status (the machine lost it), 2 on bad arguments.
set -u -o pipefail

[ $# -ge 3 ] || { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
OUT=$1 BACK=$2 WAIT=$3
shift 3
[[ "$WAIT" =~ ^[0-9]+$ ]] || { echo "error: WAIT $WAIT: a whole number of seconds" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SESSION=${GPU_SESSION:-$ROOT/tools/gpu_session.sh}  # the tests put a stand-in here
mkdir -p "$OUT" "$BACK" || { echo "error: cannot make $OUT or $BACK" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
LOG=$BACK/lease.txt
say() { echo "gpu_lease $(date -u +%H:%M:%S): $*" | tee -a "$LOG"; }
T0=$(date +%s)

if [ -f "$OUT/.lease-pid" ]; then
    say "the session in $OUT is already started (pid $(cat "$OUT/.lease-pid")): waiting for it"
else
    # the exit status is written by the session's own shell, so a later call can read it
    setsid bash -c '"$0" "$@"; echo $? > "$1/.lease-rc"' "$SESSION" "$OUT" "$@" \
        > "$OUT/lease-session.log" 2>&1 < /dev/null &
    echo $! > "$OUT/.lease-pid"
    say "started: $(basename "$SESSION") $OUT $* (pid $!, its own process session)"
fi
PID=$(cat "$OUT/.lease-pid")

while [ ! -f "$OUT/.lease-rc" ] && kill -0 "$PID" 2>/dev/null \
    && [ $(( $(date +%s) - T0 )) -lt "$WAIT" ]; do
    sleep 1
done

back() {  # OUT into BACK/session.tgz (no caches, no staged inputs) and its status.txt
    [ -f "$OUT/status.txt" ] && cp "$OUT/status.txt" "$BACK/status.txt"
    tar -czf "$BACK/session.tgz.tmp" --warning=no-file-changed -C "$OUT" --exclude=./cache \
        --exclude=./offline --exclude=./site . 2>/dev/null
    [ $? -le 1 ] && mv "$BACK/session.tgz.tmp" "$BACK/session.tgz"  # 1: a log grew while read
}

if [ -f "$OUT/.lease-rc" ]; then
    rc=$(cat "$OUT/.lease-rc")
    back
    say "the session has ended (exit $rc) after this call's $(( $(date +%s) - T0 )) s: session.tgz holds all of it"
    exit "$rc"
elif kill -0 "$PID" 2>/dev/null; then
    back
    say "still running after this call's $WAIT s: session.tgz holds what is done; the same command again (within 30 s) waits for the rest"
    exit 4
fi
back
say "the session (pid $PID) is gone without an exit status: session.tgz holds what it left"
exit 5
