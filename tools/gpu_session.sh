#!/usr/bin/env bash
# One call on a GPU machine, no internet needed: the whole bounded sweep on gpt2-124m (10 warm-up
# + 50 timed steps a step, presets.SWEEP_LENGTH), profiled (--profile: where each step's time
# goes, after its timed window), then the GPU tests the sweep does not cover (tests/test_gpu.py,
# `-m "gpu and not slow"`); everything (results, logs, versions, pip freeze, nvidia-smi, the
# compile caches) in one folder OUT. The sweep comes first: it is the ladder's numbers and, with
# its parity column, a CUDA correctness check of every step.
#
#   tools/gpu_session.sh OUT [--data FILE] [--bpe DIR] [--wheels DIR] [--no-tests] [--no-sweep]
#                            [--slow-tests] [--budget SECONDS] [--resume PATH] [--pack FILE]
#                            [--pack-limit MIB] [--no-cache-pack]
#                            [any `python -m speed_ladder run` flag: --steps, --device, --preset, ...]
#
#   --data FILE   the training text (default: data/middlemarch.txt, or the offline mirror)
#   --bpe DIR     GPT-2's BPE files for tiktoken: encoder.json + vocab.bpe, or a tiktoken cache
#                 folder (the files under their sha1 names); else $TIKTOKEN_CACHE_DIR as set
#   --wheels DIR  wheels to install offline where a package is missing (liger-kernel for step 12:
#                 pip install --no-index --no-deps); pip download them where pip works. Where
#                 site-packages is read-only they go to OUT/site, put on PYTHONPATH
#   --no-tests    the sweep only
#   --no-sweep    the tests only
#   --slow-tests  the whole GPU suite (-m gpu: every script on tiny on CUDA too), not the fast part
#   --no-profile  no time breakdown (the sweep runs with --profile otherwise)
#   --budget S    the whole call ends within S seconds (a machine lent by the hour, a call with a
#                 time limit): the sweep runs with --budget (runs that do not fit are left for the
#                 next call), the tests get what is left, only once the sweep has nothing left
#                 (a test still going at the end is recorded cut), then --pack; 45 s kept for
#                 it (30 s without --pack or with --no-cache-pack)
#   --resume PATH an earlier call's --pack archive, its OUT folder, or its OUT/results: its
#                 results (the sweep resumes them), its test state (only the tests that did not
#                 finish run) and its compile caches are copied in first. Where every call is a
#                 fresh machine of one kind, set SPEED_LADDER_HOST_ID=NAME (speed_ladder/machine.py)
#   --pack FILE   everything in OUT (less the staged inputs) in one .tar.gz at the end, also
#                 when the budget ran out or a signal stopped the call; for a machine that
#                 hands back only a few files. The compile caches (OUT/cache: inductor's and
#                 Triton's) go in when the archive stays within --pack-limit MiB (default 16)
#   --no-cache-pack  the archive without the compile caches, tried no more (a lease's calls: the
#                 86 MiB an H200 sweep compiles never fits a 16 MiB file: the 2026-11-27 pack
#                 gzipped it, found it over and archived again, 20 s after the sweep)
#   A later call into the same OUT on the same machine (its boot id in OUT/.setup) skips the set-up
#   done there: the wheel install, the Liger check, nvidia-smi, pip freeze and versions.txt
#
#   tools/gpu_session.sh --plan [--kind K] [--lease S] [--cap S] [--steps LIST] [--tests S]
#                               [--extra LIST] [--no-profile] [--slower X] [--results DIR]
#   prints the plan of a session on a lent GPU (default: the 15-minute lease, the H200's
#   measured durations): this script once in the background (tools/gpu_lease.sh), waited for by
#   calls of the same command, or calls that each run a part; the exact `run` calls; then exits
#   (0: it fits with room for a rerun, 1: it does not, the shortfall and what to drop;
#   speed_ladder/sweep/lease_plan.py)
#
# Smoke test on a CPU (tests/test_gpu_session.py): tools/gpu_session.sh OUT --device cpu --preset tiny
#   --steps 00 --max-steps 3 --warmup-steps 1 --data TEXT
# OUT/status.txt says each phase: `ok`, `partial (what is left)`, `not started (why)` or
# `failed (why)`. Exit status: 0 when every phase is ok, 3 when --budget left work for the next
# call and nothing failed, 2 on bad flags, 1 otherwise, a signal included.
set -u -o pipefail
# a write to a closed pipe (the log's tee, gone with a signal to the whole group) is an error
# to go on from, not a silent death: the TERM trap below must still pack
trap '' PIPE

usage() { sed -n '2,55p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = --plan ]; then  # the plan only: speed_ladder/sweep/lease_plan.py, before any other work
    shift; cd "$(dirname "$0")/.." || exit 2
    exec "${PYTHON:-python3}" -m speed_ladder.sweep.lease_plan "$@"
fi
case "$1" in -h|--help) usage ;; -*) echo "error: OUT first (a folder), then flags" >&2; exit 2 ;; esac
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "error: cannot make $1" >&2; exit 2; }
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DATA="" BPE="" WHEELS="" TESTS=1 RUN_SWEEP=1 PROFILE=1 SWEEP=() HAVE_DEVICE=0
BUDGET="" RESUME="" PACK="" PACK_LIMIT=16 MARK="gpu and not slow" CACHE_PACK=1
T0=$(date +%s)
MARGIN=45  # seconds kept for a run's kill, the summary, the charts and the pack after a phase
num() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] \
    || { echo "error: $1 $2: a whole number of seconds above 0" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
        --data) DATA=$(cd "$(dirname "$2")" && pwd)/$(basename "$2") \
                    || { echo "error: --data $2: no such folder" >&2; exit 2; }
                SWEEP+=(--data "$DATA"); shift 2 ;;
        --bpe) BPE=$(cd "$2" && pwd) || { echo "error: --bpe $2: no such folder" >&2; exit 2; }
               shift 2 ;;
        --wheels) WHEELS=$(cd "$2" && pwd) || { echo "error: --wheels $2: no such folder" >&2; exit 2; }
                  shift 2 ;;
        --no-tests) TESTS=0; shift ;;
        --no-sweep) RUN_SWEEP=0; shift ;;
        --budget) num --budget "${2-}"; BUDGET=$((10#$2)); shift 2 ;;
        --resume) if [ -f "${2-}" ]; then RESUME=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
                  else RESUME=$(cd "${2-}" 2>/dev/null && pwd) \
                      || { echo "error: --resume ${2-}: no such archive or folder" >&2; exit 2; }
                  fi; shift 2 ;;
        --pack-limit) num --pack-limit "${2-}"; PACK_LIMIT=$((10#$2)); shift 2 ;;
        --slow-tests) MARK=gpu; shift ;;
        --pack) [ -n "${2-}" ] && mkdir -p "$(dirname "$2")" \
                    || { echo "error: --pack ${2-}: cannot make its folder" >&2; exit 2; }
                PACK=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
        --no-profile) PROFILE=0; shift ;;
        --no-cache-pack) CACHE_PACK=0; shift ;;
        --device) HAVE_DEVICE=1; SWEEP+=("$1" "$2"); shift 2 ;;
        -h|--help) usage ;;
        *) SWEEP+=("$1"); shift ;;
    esac
done
[ $HAVE_DEVICE = 1 ] || SWEEP+=(--device cuda)
# without the compile cache the pack is a tar of ~2 MB, not a gzip of ~86 MiB (20 s measured on
# an H200 with it), and without --pack there is none: 15 s less to keep (lease_costs.py's KEPT_S)
{ [ $CACHE_PACK = 1 ] && [ -n "$PACK" ]; } || MARGIN=30
[ $PROFILE = 1 ] && SWEEP+=(--profile)
left() { echo $(( T0 + BUDGET - $(date +%s) - MARGIN )); }  # seconds left for a phase

tar_out() {  # OUT into $PACK.tmp less the staged inputs and any extra --exclude given
    local rc=0  # 1: a log changed while it was read (tee's last lines): the archive is whole
    tar -czf "$PACK.tmp" --warning=no-file-changed -C "$OUT" --exclude=./offline --exclude=./site \
        --exclude=./.resume --exclude="$(basename "$PACK").tmp" "$@" . || rc=$?
    [ $rc -le 1 ]
}

pack() {  # one archive of OUT, the staged inputs left out; the caches when the archive fits
    [ -n "$PACK" ] || return 0
    local ok=0 cache=0
    if [ -n "$(find "$OUT/cache" -type f 2>/dev/null | head -n 1)" ] && [ $CACHE_PACK = 0 ]; then
        note cache "not packed (--no-cache-pack)"
        tar_out --exclude=./cache && ok=1
    elif [ -n "$(find "$OUT/cache" -type f 2>/dev/null | head -n 1)" ]; then
        cache=1  # said first, so that the archive's status.txt says it; undone if over
        note cache "packed ($(du -sm "$OUT/cache" | cut -f1) MiB before compression): a fresh machine loads compiled kernels from it"
    fi
    [ $ok = 1 ] || tar_out && ok=1
    if [ $ok = 1 ] && [ $cache = 1 ] \
        && [ "$(stat -c %s "$PACK.tmp")" -gt $(( PACK_LIMIT * 1048576 )) ]; then
        local mib=$(( $(stat -c %s "$PACK.tmp") / 1048576 ))
        sed -i '$d' "$OUT/status.txt"  # the cache line just written
        note cache "not packed (with it the archive is $mib MiB, over --pack-limit $PACK_LIMIT MiB)"
        ok=0 && tar_out --exclude=./cache && ok=1
    fi
    [ $ok = 1 ] && mv "$PACK.tmp" "$PACK" \
        && echo "packed: $PACK ($(du -h "$PACK" | cut -f1))" \
        || echo "error: cannot pack $OUT into $PACK" >&2
}

exec > >(tee -a "$OUT/session.log") 2>&1
echo "== gpu_session $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT -> $OUT"
cd "$ROOT" || exit 2
: > "$OUT/status.txt"
FAILED=0
status() { echo "$1: $2" | tee -a "$OUT/status.txt"; [[ "$2" == ok* ]] || FAILED=1; }
note() { echo "$1: $2" | tee -a "$OUT/status.txt"; }  # information, never a failure
partial() { echo "$1: $2" | tee -a "$OUT/status.txt"; PARTIAL=1; }  # --budget: left for later
PARTIAL=0
# stopped from outside (a lease's end, Ctrl-C): the tee behind stdout may be gone with us, so
# the log is written directly; pack what there is
trap 'exec >>"$OUT/session.log" 2>&1; echo "session: stopped by a signal" >>"$OUT/status.txt"
      pack; exit 1' TERM INT

# ---- offline inputs: a mirror folder the harness and the tests read (speed_ladder/files.py mirror())
MIRROR="$OUT/offline/data"
STAGED=0
mkdir -p "$MIRROR"
if [ -n "$DATA" ]; then
    [ -f "$DATA" ] || { echo "error: --data $DATA: no such file" >&2; exit 2; }
    cp "$DATA" "$MIRROR/middlemarch.txt" && STAGED=1  # the GPU tests' default text
fi
if [ -n "$BPE" ]; then
    if [ -f "$BPE/encoder.json" ] && [ -f "$BPE/vocab.bpe" ]; then
        mkdir -p "$MIRROR/gpt2_bpe" && cp "$BPE/encoder.json" "$BPE/vocab.bpe" "$MIRROR/gpt2_bpe/"
        STAGED=1
        export TIKTOKEN_CACHE_DIR="$OUT/offline/tiktoken"
        "$PY" -c "import sys; from pathlib import Path; sys.path.insert(0, '.');
from speed_ladder.measure.data import stage_bpe; stage_bpe(Path('$BPE'), Path('$TIKTOKEN_CACHE_DIR'))" \
            || { echo "error: cannot stage the BPE files from $BPE" >&2; exit 2; }
    else
        export TIKTOKEN_CACHE_DIR="$BPE"  # already tiktoken's cache folder
    fi
fi
[ $STAGED = 1 ] && export SPEED_LADDER_SHARED="$OUT/offline"  # else: as it was
echo "TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-unset} SPEED_LADDER_SHARED=${SPEED_LADDER_SHARED:-unset}"

# ---- set-up done already by an earlier call into this OUT on this machine (same boot id): its
# status lines again, its OUT/site on PYTHONPATH, and nothing run twice
BOOT=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
AGAIN=0
[ "$BOOT" != none ] && [ -f "$OUT/.setup" ] && [ "$(head -n 1 "$OUT/.setup")" = "$BOOT" ] && AGAIN=1
if [ $AGAIN = 1 ]; then
    echo "set-up: done by an earlier call on this machine (OUT/.setup): not run again"
    [ -d "$OUT/site" ] && export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
    while IFS= read -r line; do note "${line%%: *}" "${line#*: }"; done < <(tail -n +2 "$OUT/.setup")
fi

# ---- carried wheels, installed offline where the package is missing; where site-packages is
# read-only (a lent machine's image), into OUT/site, put on PYTHONPATH for everything after
if [ $AGAIN = 1 ]; then :
elif [ -n "$WHEELS" ]; then
    if "$PY" -c "import liger_kernel" 2>/dev/null; then
        echo "liger-kernel present: --wheels $WHEELS not needed"
    elif "$PY" -c "import os, sys, sysconfig
sys.exit(not os.access(sysconfig.get_paths()['purelib'], os.W_OK))" \
        && "$PY" -m pip install --no-index --no-deps "$WHEELS"/*.whl; then
        status wheels ok
    else
        echo "site-packages not writable: pip install --target $OUT/site, on PYTHONPATH"
        if "$PY" -m pip install --no-index --no-deps --target "$OUT/site" "$WHEELS"/*.whl; then
            export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
            note wheels "ok (site-packages read-only: installed into OUT/site, on PYTHONPATH)"
        else
            status wheels "failed (pip install --no-index --no-deps [--target $OUT/site] $WHEELS/*.whl)"
        fi
    fi
fi

# ---- Liger for step 12: the import the step makes (speed_ladder/fused_loss.py); without it step
# 12 falls back to step 11's PyTorch loss (its record says so, step_active false), and
# status.txt says so here too
if [ $AGAIN = 1 ]; then :
elif LIGER=$("$PY" -c "import importlib.metadata as md
from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
print(md.version('liger-kernel'))" 2>&1); then
    note liger "ok (liger-kernel ${LIGER##*$'\n'})"
else
    note liger "missing (${LIGER##*$'\n'}; step 12 runs step 11's PyTorch loss instead, marked inactive)"
fi

# ---- what this machine is
[ $AGAIN = 1 ] || {
{ command -v nvidia-smi >/dev/null && nvidia-smi || echo "no nvidia-smi"; } > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -m pip freeze > "$OUT/pip-freeze.txt" 2>&1
"$PY" - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import platform, sys, torch
print("python", sys.version.split()[0], platform.platform())
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", getattr(torch.version, "hip", None))
print("cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, compute capability {p.major}.{p.minor}, "
          f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
try:
    import importlib.metadata as md
    print("liger-kernel", md.version("liger-kernel"), "triton", md.version("triton"))
except Exception as e:
    print("liger-kernel/triton:", e.__class__.__name__, e)
EOF
# this boot's id and the set-up's status lines, for a later call into this OUT; not after a failure
[ $FAILED = 0 ] && { echo "$BOOT"; cat "$OUT/status.txt"; } > "$OUT/.setup"
}

# ---- an earlier call, to resume: its results, its test state and its compile caches
STATE="$OUT/pytest-gpu-state.json"
if [ -n "$RESUME" ]; then
    SRC=$RESUME
    if [ -f "$RESUME" ]; then  # an archive of --pack
        rm -rf "$OUT/.resume" && mkdir -p "$OUT/.resume" && tar -xzf "$RESUME" -C "$OUT/.resume" \
            || { echo "error: --resume $RESUME: not a .tar.gz of --pack" >&2; exit 2; }
        SRC="$OUT/.resume"
    fi
    if [ -d "$SRC/results" ] || [ -f "$SRC/status.txt" ]; then  # an OUT folder
        [ -f "$SRC/pytest-gpu-state.json" ] && cp "$SRC/pytest-gpu-state.json" "$STATE"
        [ -d "$SRC/cache" ] && mkdir -p "$OUT/cache" && cp -R "$SRC/cache"/. "$OUT/cache"/
        SRC="$SRC/results"
    fi
    if [ -d "$SRC" ]; then
        mkdir -p "$OUT/results" && cp -R "$SRC"/. "$OUT/results"/ \
            || { echo "error: cannot copy --resume $SRC into $OUT/results" >&2; exit 2; }
    fi
    echo "resuming from $RESUME: results $(ls "$OUT/results" 2>/dev/null | tr '\n' ' ')" \
         "tests $( [ -f "$STATE" ] && echo "($("$PY" tests/budget.py "$STATE"))" || echo none)," \
         "cache $(du -sh "$OUT/cache" 2>/dev/null | cut -f1 || echo none)"
    rm -rf "$OUT/.resume"
fi

# ---- compiled kernels (inductor's FX graph cache, Triton's) in OUT/cache, unless set: packed
# when they fit, so that a fresh machine of the same kind loads instead of compiling
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/cache/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$OUT/cache/triton}

# ---- the bounded sweep, first: the ladder's numbers and a CUDA parity check of every step
SWEEP_LEFT=0
if [ $RUN_SWEEP = 1 ] && [ -n "$BUDGET" ] && [ "$(left)" -lt 60 ]; then
    partial sweep "not started (under a minute of --budget left; the same command with --resume runs it)"
    SWEEP_LEFT=1
elif [ $RUN_SWEEP = 1 ]; then
    [ -n "$BUDGET" ] && SWEEP+=(--budget "$(left)")
    echo "== python -m speed_ladder run --results-dir $OUT/results ${SWEEP[*]}"
    "$PY" -m speed_ladder run --results-dir "$OUT/results" "${SWEEP[@]}" 2>&1 | tee -a "$OUT/sweep.log"
    rc=${PIPESTATUS[0]}
    said() { grep "^$1" "$OUT/sweep.log" | tail -n 1 | cut -c1-400; }  # the sweep's closing lines
    case $rc in
        0) status sweep ok ;;
        3) SWEEP_LEFT=1
           partial sweep "partial ($(said 'not run, --budget' | sed 's/; the same command.*//');\
 the same command with --resume goes on)" ;;
        *) status sweep "failed (exit $rc: $(said 'failed: ' || true); see sweep.log)" ;;
    esac
    off=$(said 'parity off: ')
    [ -n "$off" ] && note parity "${off#parity off: } (off: see summary.csv parity_detail)"
fi

# ---- the GPU tests the sweep does not cover (skipped, not failed, without CUDA), once the sweep
# has nothing left; with --state, so a call stopped by its budget records the test in flight as
# cut and the next call runs only what did not finish (tests/budget.py)
if [ $TESTS = 1 ] && [ $SWEEP_LEFT = 1 ]; then
    partial tests "not started (the sweep has runs left; the next call runs them first)"
elif [ $TESTS = 1 ] && [ -n "$BUDGET" ] && [ "$(left)" -lt 50 ]; then
    partial tests "not started (under 50 s of --budget left)"
elif [ $TESTS = 1 ]; then
    LIMIT=()
    # --foreground: pytest stays in this group, so a signal to the group reaches it at once;
    # INT (pytest records the test in flight as cut, writes its state), KILL 20 s later
    [ -n "$BUDGET" ] && LIMIT=(timeout --foreground --signal=INT --kill-after=20 $(( $(left) - 20 )))
    # the sweep's records of this GPU stand in for runs it already made (tests/session_records.py)
    ${LIMIT[@]+"${LIMIT[@]}"} env SPEED_LADDER_SESSION_RESULTS="$OUT/results" \
        "$PY" -m pytest -m "$MARK" tests/test_gpu.py -v -rs \
        --state "$STATE" --junitxml="$OUT/pytest-gpu.xml" 2>&1 | tee "$OUT/pytest-gpu.log"
    rc=${PIPESTATUS[0]}
    case $rc in  # passed, failed, nothing left to run, stopped by the budget: the state holds;
        0|1|5|124|137) trusted=1 ;;  # else interrupted or broken (a collection error)
        *) trusted=0 ;;
    esac
    if [ $trusted = 0 ] || [ ! -f "$STATE" ]; then
        status tests "failed (pytest exit $rc, see pytest-gpu.log)"
    else
        line=$("$PY" tests/budget.py "$STATE"); brc=$?
        case $brc in
            0) status tests "ok ($line)" ;;
            3) partial tests "partial ($line; the same command with --resume goes on)" ;;
            *) status tests "failed ($line; see pytest-gpu.log)" ;;
        esac
    fi
fi

echo "== done: $OUT ($(( $(date +%s) - T0 )) s)"; cat "$OUT/status.txt"
trap - TERM INT
pack
[ $FAILED = 1 ] && exit 1
[ $PARTIAL = 1 ] && exit 3
exit 0
