#!/usr/bin/env bash
# One call on a GPU machine, no internet needed: the GPU tests, then the whole bounded sweep on
# gpt2-124m (10 warm-up + 50 timed steps a step, presets.SWEEP_LENGTH), profiled (--profile:
# where each step's time goes, after its timed window), everything (results, logs, versions,
# pip freeze, nvidia-smi) in one folder OUT.
#
#   tools/gpu_session.sh OUT [--data FILE] [--bpe DIR] [--wheels DIR] [--no-tests] [--no-sweep]
#                            [--budget SECONDS] [--resume DIR] [--pack FILE]
#                            [any `python -m harness run` flag: --steps, --device, --preset, ...]
#
#   --data FILE   the training text (default: data/middlemarch.txt, or the offline mirror)
#   --bpe DIR     GPT-2's BPE files for tiktoken: encoder.json + vocab.bpe, or a tiktoken cache
#                 folder (the files under their sha1 names); else $TIKTOKEN_CACHE_DIR as set
#   --wheels DIR  wheels to install offline where a package is missing (liger-kernel for step 12:
#                 pip install --no-index --no-deps); pip download them where pip works. Where
#                 site-packages is read-only they go to OUT/site, put on PYTHONPATH
#   --no-tests    the sweep only
#   --no-sweep    the tests only
#   --no-profile  no time breakdown (the sweep runs with --profile otherwise)
#   --budget S    the whole call ends within S seconds (a machine lent by the hour, a call with a
#                 time limit): the tests get what is left less 65 s, the sweep then runs with
#                 --budget (runs that do not fit are left for the next call), then --pack
#   --resume DIR  results of an earlier session (its OUT/results, e.g. unpacked from its --pack),
#                 copied into OUT/results first: the sweep resumes them. Where every call is a
#                 fresh machine of one kind, set SPEED_LADDER_HOST_ID=NAME (harness/machine.py)
#   --pack FILE   everything in OUT (less the staged inputs) in one .tar.gz at the end, also
#                 when the budget ran out or a signal stopped the call; for a machine that
#                 hands back only a few files
#
#   tools/gpu_session.sh --plan [--gpu NAME] [--preset P] [--budget S] [--steps A-B] [--lease S]
#                               [--tests-budget S] [--results DIR] [--target S] [--slower X]
#   prints the calls a lent GPU needs for the bounded ladder and their expected device time,
#   then exits (0: within the 20-minute target, 1: over; harness/lease_plan.py says the model)
#
# Smoke test on a CPU (tests/test_tools.py): tools/gpu_session.sh OUT --device cpu --preset tiny
#   --steps 00 --max-steps 3 --warmup-steps 1 --data TEXT
# Exit status: 0 when the tests and every step passed, 3 when --budget left runs for the next
# call and nothing failed, 2 on bad flags, 1 otherwise, a signal included (OUT/status.txt
# says which).
set -u -o pipefail
# a write to a closed pipe (the log's tee, gone with a signal to the whole group) is an error
# to go on from, not a silent death: the TERM trap below must still pack
trap '' PIPE

usage() { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = --plan ]; then  # the plan only: harness/lease_plan.py, before any other work
    shift; cd "$(dirname "$0")/.." || exit 2
    exec "${PYTHON:-python3}" -m harness.lease_plan "$@"
fi
case "$1" in -h|--help) usage ;; -*) echo "error: OUT first (a folder), then flags" >&2; exit 2 ;; esac
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "error: cannot make $1" >&2; exit 2; }
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DATA="" BPE="" WHEELS="" TESTS=1 RUN_SWEEP=1 PROFILE=1 SWEEP=() HAVE_DEVICE=0
BUDGET="" RESUME="" PACK=""
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
        --resume) RESUME=$(cd "${2-}" 2>/dev/null && pwd) \
                      || { echo "error: --resume ${2-}: no such folder" >&2; exit 2; }
                  shift 2 ;;
        --pack) [ -n "${2-}" ] && mkdir -p "$(dirname "$2")" \
                    || { echo "error: --pack ${2-}: cannot make its folder" >&2; exit 2; }
                PACK=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
        --no-profile) PROFILE=0; shift ;;
        --device) HAVE_DEVICE=1; SWEEP+=("$1" "$2"); shift 2 ;;
        -h|--help) usage ;;
        *) SWEEP+=("$1"); shift ;;
    esac
done
[ $HAVE_DEVICE = 1 ] || SWEEP+=(--device cuda)
[ $PROFILE = 1 ] && SWEEP+=(--profile)
left() { echo $(( T0 + BUDGET - $(date +%s) - MARGIN )); }  # seconds left for a phase

pack() {  # one archive of OUT, the staged inputs left out
    [ -n "$PACK" ] || return 0
    local rc=0  # 1: a log changed while it was read (tee's last lines): the archive is whole
    tar -czf "$PACK.tmp" --warning=no-file-changed -C "$OUT" --exclude=./offline --exclude=./site \
        --exclude="$(basename "$PACK").tmp" . || rc=$?
    [ $rc -le 1 ] && mv "$PACK.tmp" "$PACK" \
        && echo "packed: $PACK ($(du -h "$PACK" | cut -f1))" \
        || echo "error: cannot pack $OUT into $PACK" >&2
}

exec > >(tee -a "$OUT/session.log") 2>&1
echo "== gpu_session $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT -> $OUT"
cd "$ROOT" || exit 2
: > "$OUT/status.txt"
FAILED=0
status() { echo "$1: $2" | tee -a "$OUT/status.txt"; [ "$2" = ok ] || FAILED=1; }
note() { echo "$1: $2" | tee -a "$OUT/status.txt"; }  # information, never a failure
partial() { echo "$1: $2" | tee -a "$OUT/status.txt"; PARTIAL=1; }  # --budget: left for later
PARTIAL=0
# stopped from outside (a lease's end, Ctrl-C): the tee behind stdout may be gone with us, so
# the log is written directly; pack what there is
trap 'exec >>"$OUT/session.log" 2>&1; echo "session: stopped by a signal" >>"$OUT/status.txt"
      pack; exit 1' TERM INT

# ---- offline inputs: a mirror folder the harness and the tests read (harness/files.py mirror())
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
from harness.data import stage_bpe; stage_bpe(Path('$BPE'), Path('$TIKTOKEN_CACHE_DIR'))" \
            || { echo "error: cannot stage the BPE files from $BPE" >&2; exit 2; }
    else
        export TIKTOKEN_CACHE_DIR="$BPE"  # already tiktoken's cache folder
    fi
fi
[ $STAGED = 1 ] && export SPEED_LADDER_SHARED="$OUT/offline"  # else: as it was
echo "TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-unset} SPEED_LADDER_SHARED=${SPEED_LADDER_SHARED:-unset}"

# ---- carried wheels, installed offline where the package is missing; where site-packages is
# read-only (a lent machine's image), into OUT/site, put on PYTHONPATH for everything after
if [ -n "$WHEELS" ]; then
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

# ---- Liger for step 12: the import the step makes; without it step 12 falls back to chunked
# PyTorch (its record says so, step_active false), and status.txt says so here too
if LIGER=$("$PY" -c "import importlib.metadata as md
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
print(md.version('liger-kernel'))" 2>&1); then
    note liger "ok (liger-kernel ${LIGER##*$'\n'})"
else
    note liger "missing (${LIGER##*$'\n'}; step 12 runs chunked PyTorch instead, marked inactive)"
fi

# ---- what this machine is
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

# ---- results of an earlier session, to resume
if [ -n "$RESUME" ]; then
    mkdir -p "$OUT/results" && cp -R "$RESUME"/. "$OUT/results"/ \
        && echo "resuming: $(ls "$OUT/results" | tr '\n' ' ')from $RESUME" \
        || { echo "error: cannot copy --resume $RESUME into $OUT/results" >&2; exit 2; }
fi

# ---- the GPU tests (skipped, not failed, without CUDA); under --budget, stopped (SIGINT: pytest
# still writes its report) when the budget is spent
if [ $TESTS = 1 ]; then
    LIMIT=()
    # --foreground: pytest stays in this group, so a signal to the group reaches it at once;
    # INT, then KILL 20 s later, all inside the budget
    [ -n "$BUDGET" ] && LIMIT=(timeout --foreground --signal=INT --kill-after=20 $(( $(left) - 20 )))
    if [ -n "$BUDGET" ] && [ "$(left)" -lt 50 ]; then
        partial tests "not started (under 50 s of --budget left)"
    else
    ${LIMIT[@]+"${LIMIT[@]}"} "$PY" -m pytest -m gpu tests/test_gpu.py -v -rs \
        --junitxml="$OUT/pytest-gpu.xml" 2>&1 | tee "$OUT/pytest-gpu.log"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) status tests ok ;;
        124|137) if [ -n "$BUDGET" ]; then
                     partial tests "stopped at the --budget's end (see pytest-gpu.log)"
                 else status tests "failed (exit $rc, see pytest-gpu.log)"; fi ;;
        *) status tests "failed (exit $rc, see pytest-gpu.log)" ;;
    esac
    fi
fi

# ---- the bounded sweep
if [ $RUN_SWEEP = 1 ] && [ -n "$BUDGET" ] && [ "$(left)" -lt 60 ]; then
    partial sweep "not started (under a minute of --budget left; the same command with --resume runs it)"
elif [ $RUN_SWEEP = 1 ]; then
    [ -n "$BUDGET" ] && SWEEP+=(--budget "$(left)")
    echo "== python -m harness run --results-dir $OUT/results ${SWEEP[*]}"
    "$PY" -m harness run --results-dir "$OUT/results" "${SWEEP[@]}" 2>&1 | tee -a "$OUT/sweep.log"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) status sweep ok ;;
        3) partial sweep "partial (--budget ran out; the same command with --resume goes on)" ;;
        *) status sweep "failed (exit $rc, see sweep.log)" ;;
    esac
fi

echo "== done: $OUT ($(( $(date +%s) - T0 )) s)"; cat "$OUT/status.txt"
trap - TERM INT
pack
[ $FAILED = 1 ] && exit 1
[ $PARTIAL = 1 ] && exit 3
exit 0
