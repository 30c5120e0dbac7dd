#!/usr/bin/env bash
# The ladder on a GPU machine in one command, offline: the bounded sweep on gpt2-124m, profiled
# (the lower rungs once, the top rungs in rounds with an A/A control), then the peer (--peer),
# then the fast GPU tests (tests/test_gpu.py, -m "gpu and not slow"). Everything lands in OUT:
# results/, status.txt, session.log, sweep.log, peer.txt, peer*.log, pytest-gpu.*, versions.txt,
# pip-freeze.txt, nvidia-smi.txt and cache/ (the compiled kernels).
#
#   tools/gpu_session.sh OUT [--data FILE] [--bpe DIR] [--wheels DIR] [--budget S] [--resume PATH]
#                            [--pack FILE] [--once SPEC] [--rounds SPEC] [--repeats K] [--peer SRC]
#                            [--no-sweep] [--no-tests] [--slow-tests] [--no-profile]
#                            [any `python -m speed_ladder run` flag: --steps, --preset, --device]
#
#   --data FILE    the training text (default: data/middlemarch.txt, downloaded once)
#   --bpe DIR      GPT-2's BPE files: a folder with encoder.json and vocab.bpe, or tiktoken's cache
#   --wheels DIR   wheels of packages this Python lacks (liger-kernel for step 12), installed
#                  offline into OUT/site, which goes on PYTHONPATH
#   --budget S     end within S seconds: the sweep runs with --budget (what is left less 45 s,
#                  kept for the archive), the peer and then the tests only once the phase before
#                  has nothing left, and a peer or test still going at the end is cut (not
#                  recorded); a rerun goes on
#   --resume PATH  go on from an earlier run, its --pack archive or its OUT folder: its results and
#                  compile caches are copied in first (a rerun into the same OUT goes on
#                  without it). The sweep skips what is done, the peer what is recorded; the
#                  GPU tests run again. Where each run starts on a fresh machine of one kind (a
#                  batch cluster), set SPEED_LADDER_HOST_ID=NAME on each, so the sweep counts
#                  their runs as one machine's (speed_ladder/machine.py)
#   --pack FILE    OUT (less the staged inputs and the made peers) in one .tar.gz at the end, also
#                  after SIGTERM or Ctrl-C
#   --once SPEC    the steps run once, first (default 00-09; none: no such pass)
#   --rounds SPEC  the steps run next in --repeats rounds, with the A/A control (the first of them
#                  twice a round), into the same results folder (default: 10 to the top rung;
#                  none: no such pass)
#   --repeats K    the rounds (default 2); with --steps, that one sweep's --repeats instead
#   --peer SRC     a fetched 01_opt_single_gpu.py (rasbt/LLMs-from-scratch ch05/10): after the
#                  sweep, tools/peer.py makes it as published and with --no-dropout, each runs
#                  with the sweep's preset and length, timed as the ladder times a step, its
#                  record in results/<tag>/peer.jsonl, and OUT/peer.txt compares them with the
#                  rungs that train the same model (tools/peer_compare.py)
#   --no-sweep, --no-tests: leave a phase out; --slow-tests: every GPU test; --no-profile: no
#                  time breakdown; --steps SPEC: one sweep of those steps instead of the passes
#
# OUT/status.txt says each phase: ok, partial (...), not started (...) or failed (...).
# Exit: 0 all ok, 3 --budget left work for a rerun and nothing failed, 1 a failure or a signal,
# 2 bad flags.
set -u -o pipefail
trap '' PIPE # the log's tee may die with a signal; the script still has to pack

usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "error: $*" >&2; exit 2; }
abs() { [ -n "$1" ] && (cd "$(dirname "$1")" 2>/dev/null && echo "$(pwd)/$(basename "$1")"); }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; -*) die "OUT first (a folder), then flags" ;; esac
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || die "cannot make $1"
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DATA="" BPE="" WHEELS="" BUDGET="" RESUME="" PACK="" SWEEP=1 TESTS=1 MARK="gpu and not slow"
PROFILE=(--profile) ARGS=() DEVICE=(--device cuda) PEER="" STEPS="" ONCE="" ROUNDS="" REPEATS=""
LENGTH=(--device cuda) # the sweep's --device, --preset, --max-steps, --warmup-steps: the peer's
MARGIN=45 # seconds kept at the end of a --budget: a cut run's kill, the summary, the archive
T0=$(date +%s)
while [ $# -gt 0 ]; do
    case "$1" in
        --data) DATA=$(abs "${2-}") && [ -f "$DATA" ] || die "--data ${2-}: no such file"
                ARGS+=(--data "$DATA"); shift 2 ;;
        --bpe) BPE=$(cd "${2-}" 2>/dev/null && pwd) || die "--bpe ${2-}: no such folder"; shift 2 ;;
        --wheels) WHEELS=$(cd "${2-}" 2>/dev/null && pwd) || die "--wheels ${2-}: no such folder"
                  shift 2 ;;
        --budget) [[ "${2-}" =~ ^[0-9]+$ ]] && [ $((10#$2)) -gt 0 ] \
                      || die "--budget ${2-}: a whole number of seconds above 0"
                  BUDGET=$((10#$2)); shift 2 ;;
        --resume) RESUME=$(abs "${2-}") && [ -e "$RESUME" ] \
                      || die "--resume ${2-}: no such archive or folder"
                  shift 2 ;;
        --pack) PACK=$(mkdir -p "$(dirname "${2:-.}")" 2>/dev/null && abs "${2-}") \
                    || die "--pack ${2-}: cannot make its folder"
                shift 2 ;;
        --no-sweep) SWEEP=0; shift ;;
        --no-tests) TESTS=0; shift ;;
        --slow-tests) MARK=gpu; shift ;;
        --no-profile) PROFILE=(); shift ;;
        --once) ONCE=${2-}; shift 2 ;;
        --rounds) ROUNDS=${2-}; shift 2 ;;
        --repeats) [[ "${2-}" =~ ^[0-9]+$ ]] && [ $((10#$2)) -gt 0 ] \
                       || die "--repeats ${2-}: a whole number of rounds above 0"
                   REPEATS=$((10#$2)); shift 2 ;;
        --peer) PEER=$(abs "${2-}") && [ -f "$PEER" ] || die "--peer ${2-}: no such file"
                shift 2 ;;
        --steps) STEPS=${2-}; ARGS+=("$1" "${2-}"); shift 2 ;;
        --device) DEVICE=(); LENGTH=(); ARGS+=("$1" "${2-}"); LENGTH+=("$1" "${2-}"); shift 2 ;;
        --preset | --max-steps | --warmup-steps) ARGS+=("$1" "${2-}"); LENGTH+=("$1" "${2-}")
                                                 shift 2 ;;
        -h|--help) usage 0 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
ARGS+=(${DEVICE[@]+"${DEVICE[@]}"} ${PROFILE[@]+"${PROFILE[@]}"})
left() { echo $((T0 + BUDGET - $(date +%s) - MARGIN)); } # seconds left for a phase
# the sweep's passes: --steps, one sweep; else the lower rungs once, then the top ones in rounds
check_spec() { # FLAG SPEC: steps the ladder has (or none), else one line now, not a failed sweep
    [ "$2" = none ] && return
    msg=$("$PY" -c "import sys; sys.path.insert(0, sys.argv[2])
from speed_ladder.errors import UserError
from speed_ladder.ladder import parse_steps, rungs
try: parse_steps(sys.argv[1], list(rungs()))
except UserError as e: sys.exit(str(e))" "$2" "$ROOT" 2>&1) || die "$1 ${msg#--steps }"
}
if [ -n "$STEPS" ]; then
    [ -z "$ONCE$ROUNDS" ] || die "--steps chooses one sweep's steps: leave out --once, --rounds"
else
    TOP=$(cd "$ROOT/steps" && ls [0-9][0-9]_*.py | tail -1 | cut -c1-2)
    ONCE=${ONCE:-00-09} ROUNDS=${ROUNDS:-10-$TOP} REPEATS=${REPEATS:-2}
    check_spec --once "$ONCE"
    check_spec --rounds "$ROUNDS"
    [ "$ONCE$ROUNDS" != nonenone ] || die "--once none --rounds none: no sweep; use --no-sweep"
fi
if [ -n "$PEER" ]; then # the peer this tool knows, or one line now
    msg=$("$PY" "$ROOT/tools/peer.py" "$PEER" --check 2>&1) || die "--peer $PEER: ${msg#error: }"
fi

# ---- an earlier run to go on from: its results and compile caches
if [ -n "$RESUME" ]; then
    SRC=$RESUME
    if [ -f "$RESUME" ]; then # an archive, unpacked into OUT/.resume (never packed)
        SRC=$OUT/.resume
        rm -rf "$SRC" && mkdir -p "$SRC" && tar -xzf "$RESUME" -C "$SRC" 2>/dev/null \
            || die "--resume $RESUME: not a .tar.gz of --pack"
    fi
    [ -f "$SRC/status.txt" ] || die "--resume $RESUME: not an OUT folder or a --pack archive"
    for part in results cache; do
        [ ! -e "$SRC/$part" ] || [ "$SRC" -ef "$OUT" ] || cp -R "$SRC/$part" "$OUT/" \
            || die "cannot copy $SRC/$part into $OUT"
    done
    rm -rf "$OUT/.resume"
    echo "resuming from $RESUME"
fi

exec > >(tee -a "$OUT/session.log") 2>&1
cd "$ROOT" || exit 2
: > "$OUT/status.txt"
FAILED=0 PARTIAL=0
say() { echo "$1: $2" | tee -a "$OUT/status.txt"; }
status() { # a phase's line; anything but ok, partial or not started is a failure
    say "$1" "$2"
    case "$2" in ok*) ;; partial* | "not started"*) PARTIAL=1 ;; *) FAILED=1 ;; esac
}
pack() { # tar's exit 1: a log grew while it was read; the archive is whole
    [ -n "$PACK" ] || return 0
    tar -czf "$PACK.tmp" --warning=no-file-changed -C "$OUT" --exclude=./offline \
        --exclude=./site --exclude=./.resume --exclude=./peer .
    if [ $? -le 1 ] && mv "$PACK.tmp" "$PACK"; then echo "packed: $PACK ($(du -h "$PACK" | cut -f1))"
    else echo "error: cannot pack $OUT into $PACK" >&2; fi
}
trap 'exec >>"$OUT/session.log" 2>&1; echo "session: stopped by a signal" >>"$OUT/status.txt"
      pack; exit 1' TERM INT

# ---- offline inputs: an offline folder (speed_ladder/files.py, mirror()) the sweep and the
# tests read: the text as its middlemarch.txt, the BPE files as its gpt2_bpe/
if [ -n "$DATA$BPE" ]; then
    mkdir -p "$OUT/offline/data"
    [ -z "$DATA" ] || cp "$DATA" "$OUT/offline/data/middlemarch.txt"
    if [ -f "$BPE/encoder.json" ] && [ -f "$BPE/vocab.bpe" ]; then
        mkdir -p "$OUT/offline/data/gpt2_bpe"
        cp "$BPE/encoder.json" "$BPE/vocab.bpe" "$OUT/offline/data/gpt2_bpe/"
    elif [ -n "$BPE" ]; then
        export TIKTOKEN_CACHE_DIR=$BPE
    fi
    export SPEED_LADDER_SHARED=$OUT/offline
fi
echo "SPEED_LADDER_SHARED=${SPEED_LADDER_SHARED:-unset} TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-unset}"

# ---- wheels of what this Python lacks, into OUT/site
if [ -n "$WHEELS" ]; then
    for whl in "$WHEELS"/*.whl; do
        name=$(basename "$whl")
        [ -f "$whl" ] || continue
        "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "${name%%-*}" \
            2>/dev/null && continue # installed already
        if "$PY" -m pip install -q --no-index --no-deps --target "$OUT/site" "$whl"; then
            say wheels "ok ($name into OUT/site)"
        else
            status wheels "failed (pip install --no-index --no-deps --target OUT/site $whl)"
        fi
    done
fi
[ -d "$OUT/site" ] && export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"

# ---- Liger for step 12: the import the step makes (steps/12_liger_fused_ce.py); without it step
# 12 falls back to step 11's PyTorch loss (its record says so, step_active false), and
# status.txt says so here too
if LIGER=$("$PY" -c "import importlib.metadata as md
from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
print(md.version('liger-kernel'))" 2>&1); then
    say liger "ok (liger-kernel $LIGER)"
else
    say liger "missing (${LIGER##*$'\n'}; step 12 runs step 11's PyTorch loss instead, marked inactive)"
fi

# ---- what this machine is
{ nvidia-smi || echo "no nvidia-smi"; } > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -m pip freeze > "$OUT/pip-freeze.txt" 2>&1
"$PY" - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import platform, sys, torch
print("python", sys.version.split()[0], platform.platform())
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, compute capability {p.major}.{p.minor}, "
          f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
EOF

# ---- compiled kernels in OUT/cache (unless set): archived, so a rerun loads instead of compiling
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/cache/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$OUT/cache/triton}

# ---- the sweep first: the ladder's numbers, and with its parity column a CUDA check of each step.
# Two passes into the same results folder: the lower rungs once, then the top rungs in rounds,
# with the A/A control; the second writes the summary, whose effects pair runs round by round
# (a step of one round beside one of two pairs its round 1) and whose noise floor is the
# control's. Each pass gets what is left of --budget; a pass it leaves runs for goes to a rerun.
SWEEP_LEFT=0 RCS=""
pass_of_sweep() { # the sweep's own flags for this pass; its exit code (or "short") into RCS
    if [ -n "$BUDGET" ] && [ "$(left)" -lt 60 ]; then RCS+=" short"; return; fi
    local budget=()
    [ -z "$BUDGET" ] || budget=(--budget "$(left)")
    echo "== python -m speed_ladder run --results-dir $OUT/results ${ARGS[*]} $* ${budget[*]}"
    "$PY" -m speed_ladder run --results-dir "$OUT/results" "${ARGS[@]}" "$@" \
        ${budget[@]+"${budget[@]}"} 2>&1 | tee -a "$OUT/sweep.log"
    RCS+=" ${PIPESTATUS[0]}"
}
if [ $SWEEP = 1 ]; then
    : > "$OUT/sweep.log"
    if [ -n "$STEPS" ]; then
        pass_of_sweep ${REPEATS:+--repeats "$REPEATS"}
    else
        [ "$ONCE" = none ] || pass_of_sweep --steps "$ONCE" --repeats 1 --no-control
        [ "$ROUNDS" = none ] || pass_of_sweep --steps "$ROUNDS" --repeats "$REPEATS"
    fi
    bad=$(echo "$RCS" | tr ' ' '\n' | grep -v -x -e '' -e 0 -e 3 -e short | head -1)
    left_runs=$(grep '^not run, --budget' "$OUT/sweep.log" | tr '\n' ' ' | cut -c1-300)
    if [ -n "$bad" ]; then
        status sweep "failed (exit $bad; see sweep.log)"
    elif [[ " $RCS " != *" 0 "* && " $RCS " != *" 3 "* ]]; then
        status sweep "not started (under a minute of --budget left)"
        SWEEP_LEFT=1
    elif [[ " $RCS " == *" 3 "* || " $RCS " == *" short "* ]]; then
        SWEEP_LEFT=1 # the sweep's closing lines name the runs left
        [[ " $RCS " != *" short "* ]] || left_runs+="a pass not started: under a minute left"
        status sweep "partial (${left_runs% })"
    else
        status sweep ok
    fi
fi

# ---- the peer (--peer): Raschka's script as published and with dropout 0, made by
# tools/peer.py with the sweep's preset and length and timed as the ladder times a step, each
# record in the sweep's results folder (peer.jsonl, beside runs.jsonl: a rerun skips a peer
# recorded there); OUT/peer.txt sets them beside the rungs that train their model
# (tools/peer_compare.py). Only once the sweep has nothing left, a peer only with PEER_S of
# --budget left, and one still going at the end is stopped and not recorded.
PEERS_LEFT=0
PEER_S=60 # about what one takes on a GPU: its torch.compile, 60 steps, start-up and data
# the speed sweep's tag, never a time-to-loss one (<hardware>-to-loss-x1) in the same folder
RUNS_FILE=$(ls -t "$OUT"/results/*-x1/runs.jsonl 2>/dev/null | grep -v -- '-to-loss-x1/' | head -1)
if [ -z "$PEER" ]; then
    :
elif [ $SWEEP_LEFT = 1 ]; then
    status peers "not started (the sweep has runs left)"
    PEERS_LEFT=1
elif [ -z "$RUNS_FILE" ]; then
    status peers "failed (no sweep results in OUT/results to set the peers beside)"
elif ! TEXT=${DATA:-$("$PY" -c "from speed_ladder.measure.data import read_text
print(read_text(None)[1])" 2>/dev/null | tail -1)} || [ ! -f "$TEXT" ]; then
    status peers "failed (no text: --data FILE)"
else
    TAG_DIR=$(dirname "$RUNS_FILE")
    HIDE=() # the peer runs where it finds a GPU: none where the sweep ran on a CPU
    case " ${LENGTH[*]} " in
        *" --device cpu "* | *" --device mps "*) HIDE=(CUDA_VISIBLE_DEVICES=) ;;
    esac
    ran=() cut=() failed=()
    for name in peer peer-no-dropout; do
        dir=$OUT/peer/$name log=$OUT/$name.log flags=()
        [ $name = peer ] || flags=(--no-dropout)
        rm -rf "$dir"
        if ! "$PY" tools/peer.py "$PEER" --out "$dir" --results "$TAG_DIR/peer.jsonl" \
                --text "$TEXT" ${BPE:+--bpe "$BPE"} ${LENGTH[@]+"${LENGTH[@]}"} \
                ${flags[@]+"${flags[@]}"} > "$log" 2>&1; then
            failed+=("$name: $(tail -1 "$log")")
            continue
        fi
        cat "$log"
        if [ ! -f "$dir/01_opt_single_gpu.py" ]; then ran+=("$name up to date"); continue; fi
        if [ -n "$BUDGET" ] && [ "$(left)" -lt $PEER_S ]; then cut+=("$name"); continue; fi
        LIMIT=()
        [ -z "$BUDGET" ] || LIMIT=(timeout --signal=TERM --kill-after=10 "$(left)")
        (cd "$dir" && env ${HIDE[@]+"${HIDE[@]}"} ${LIMIT[@]+"${LIMIT[@]}"} \
            "$PY" 01_opt_single_gpu.py) 2>&1 | tee -a "$log"
        rc=${PIPESTATUS[0]}
        case $rc in
            0) ran+=("$name") ;;
            124 | 137) cut+=("$name") ;;
            *) failed+=("$name: exit $rc, see $name.log") ;;
        esac
    done
    short=""
    if "$PY" tools/peer_compare.py "$TAG_DIR" > "$OUT/peer.txt" 2>&1; then
        cat "$OUT/peer.txt"
        short=$(tail -1 "$OUT/peer.txt")
        short="${short#in short: }; see peer.txt"
    fi
    if [ ${#failed[@]} -gt 0 ]; then
        status peers "failed (${failed[*]})"
    elif [ ${#cut[@]} -gt 0 ]; then
        PEERS_LEFT=1
        status peers "partial (${cut[*]} left: under $PEER_S s of --budget, or cut at its end)"
    else
        status peers "ok (${short:-${ran[*]}})"
    fi
fi

# ---- the GPU tests the sweep does not cover (skipped, not failed, without CUDA), once the sweep
# has nothing left; each has its own time limit (pytest-timeout)
tests_line() {  # pytest's JUnit XML as one line: "P passed, F failed, S skipped"
    "$PY" - "$OUT/pytest-gpu.xml" <<'EOF' 2>/dev/null || echo "no report"
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
bad = n["failures"] + n["errors"]
print(f"{n['tests'] - bad - n['skipped']} passed, " + (f"{bad} failed, " if bad else "")
      + f"{n['skipped']} skipped")
EOF
}
if [ $TESTS = 1 ] && [ $SWEEP_LEFT = 1 ]; then
    status tests "not started (the sweep has runs left)"
elif [ $TESTS = 1 ] && [ $PEERS_LEFT = 1 ]; then
    status tests "not started (the peers have runs left)"
elif [ $TESTS = 1 ] && [ -n "$BUDGET" ] && [ "$(left)" -lt 50 ]; then
    status tests "not started (under 50 s of --budget left)"
elif [ $TESTS = 1 ]; then
    LIMIT=()
    # --foreground: pytest stays in this group, so a signal to the group reaches it at once;
    # INT (pytest ends the test in flight and writes its report), KILL 20 s later
    [ -n "$BUDGET" ] && LIMIT=(timeout --foreground --signal=INT --kill-after=20 $(( $(left) - 20 )))
    # the sweep's records of this GPU stand in for runs it already made (tests/session_records.py)
    ${LIMIT[@]+"${LIMIT[@]}"} env SPEED_LADDER_SESSION_RESULTS="$OUT/results" \
        "$PY" -m pytest -m "$MARK" tests/test_gpu.py -v -rs \
        --junitxml="$OUT/pytest-gpu.xml" 2>&1 | tee "$OUT/pytest-gpu.log"
    rc=${PIPESTATUS[0]}
    case $rc in  # passed, nothing selected, stopped by the budget; else failed or broken
        0|5) status tests "ok ($(tests_line))" ;;
        124|137) status tests "partial (cut by --budget: $(tests_line); see pytest-gpu.log)" ;;
        *) status tests "failed (pytest exit $rc: $(tests_line); see pytest-gpu.log)" ;;
    esac
fi

echo "== done: $OUT ($(($(date +%s) - T0)) s)"
cat "$OUT/status.txt"
trap - TERM INT
pack
[ $FAILED = 1 ] && exit 1
[ $PARTIAL = 1 ] && exit 3
exit 0
