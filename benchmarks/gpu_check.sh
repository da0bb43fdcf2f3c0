#!/usr/bin/env bash
# One prepared check of hf_optbench's CUDA paths on one GPU, inside 8 minutes (the time limits below sum to 480 s):
#
#   benchmarks/gpu_check.sh OUT_DIR [STEP ...]      STEP: env tests mfu memory headline zero (default: all, in order)
#
#   env       versions and device (20 s)
#   tests     the `gpu`-marked tests (pytest -m gpu, 4 workers) (45 s)
#   mfu       benchmarks/bench_gpu_mfu.py at gpt2: bf16, SDPA, torch.compile, plain loop vs hf_optbench, the largest
#             power-of-two micro-batch that fits, tokens/s, MFU against the datasheet bf16 peak (115 s)
#   memory    benchmarks/bench_cuda_memory.py: CUDA peak allocated and optimizer state against the planner for
#             adamw, lion, muon at gpt2 and gpt2-medium (55 s)
#   headline  `accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml` on one GPU with locally generated
#             data, 100 steps with a checkpoint at 50, then a resume from it (benchmarks/gpu_check.py) (215 s)
#   zero      ZeRO-2 (accelerate_configs/a100x4_zero2.yaml, one process) with hf_optbench's Lion at gpt2 (30 s)
#
# Each step has its own time limit, so one failure or hang does not eat the rest. Everything measured goes to
# OUT_DIR/gpu_check.json (one object per step: status, exit code, seconds, the step's figures) and the whole
# console to OUT_DIR/gpu_check.log, nothing else (the device tool brings back at most 8 files); each step's own
# JSON and the run directories stay in a temporary folder. Without a CUDA device it says in
# one line what it would run and exits 0. Where ./.whl holds wheels (`make gpu-wheels`), they are installed into
# a temporary --target first and put on PYTHONPATH (the GPU machine reaches no package registry).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR [env tests mfu memory headline zero]}
shift
STEPS=${*:-env tests mfu memory headline zero}
PY=${PYTHON:-python3}
# Limits from the first run on an H100 (2026-11-26, benchmarks/results/gpu_check_h100_run*.json): env 19 s (cold
# imports), tests 94 s of which 62 s were the MFU benchmark's own test (deselected here: the mfu step runs it at
# full size), mfu 108 s, memory 48 s, headline 149 s for the compiled 100-step run alone (its resume, 50 steps
# with a warm compile cache, did not run there yet: 66 s is an estimate; zero's 30 s too).
declare -A LIMIT=([env]=20 [tests]=45 [mfu]=115 [memory]=55 [headline]=215 [zero]=30)
for step in $STEPS; do
    [[ -n ${LIMIT[$step]+x} ]] || { echo "gpu_check: unknown step '$step': choose from env tests mfu memory headline zero"; exit 2; }
    # GPU_CHECK_LIMIT_<step>=SECONDS overrides a step's limit (a rerun of the steps that ran out of time)
    override=GPU_CHECK_LIMIT_$step
    if [[ -n ${!override:-} ]]; then
        [[ ${!override} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: $override must be a whole number of seconds, got '${!override}'"; exit 2; }
        LIMIT[$step]=${!override}
    fi
done

# GPU_CHECK_REHEARSE=1: every step's code path on the CPU at toy shapes (tiny, fp32, no compile), no wheels
# installed: a check of this script before a GPU is lent, never a measurement.
REHEARSE=${GPU_CHECK_REHEARSE:-0}
if [[ $REHEARSE != 1 ]] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device here, nothing run; on a GPU it runs [$STEPS] (limits: env 20 s, tests 45 s, mfu 115 s, memory 55 s, headline 215 s, zero 30 s) and writes $OUT/gpu_check.json and $OUT/gpu_check.log"
    exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
: > "$WORK/steps.tsv"

main() {
echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), steps [$STEPS], work $WORK"

MFU_ARGS=(--sizes gpt2 --block 1024 --steps 10 --rounds 1)
MEM_ARGS=(--sizes gpt2 gpt2-medium --micro-batch 8 --block 1024)
PY_ARGS=()
# GPU_CHECK_HEADLINE_COMPILE=0: the headline step's two runs without torch.compile (a rerun short of time)
HEADLINE_ARGS=()
[[ ${GPU_CHECK_HEADLINE_COMPILE:-1} == 0 ]] && HEADLINE_ARGS=(--no-compile)
if [[ $REHEARSE == 1 ]]; then
    echo "gpu_check: REHEARSAL on the CPU (toy shapes; no figure here is a measurement)"
    MFU_ARGS=(--device cpu --sizes tiny --batch 2 --block 64 --steps 3 --rounds 1 --no-compile --dtype fp32)
    MEM_ARGS=(--device cpu --sizes tiny --micro-batch 2 --block 64)
    PY_ARGS=(--rehearse)
fi
if [[ $REHEARSE != 1 ]] && compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
        || { echo "gpu_check: installing .whl/*.whl failed"; return 1; }
    export PYTHONPATH="$WORK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # console scripts of the wheels (accelerate's is the image's own) are not needed: python -m is used throughout
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled PYTHONUNBUFFERED=1
export HF_OPTBENCH_CACHE="$WORK/cache" HF_HOME="$WORK/hf" TRITON_CACHE_DIR="$WORK/triton"

run_step() {  # name, then the command; the step's own limit; a row in steps.tsv whatever happens
    local name=$1
    shift
    local limit=${LIMIT[$name]}
    echo
    echo "=== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$WORK/steps.tsv"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
}

for step in $STEPS; do
    case $step in
        env) run_step env "$PY" benchmarks/gpu_check.py env "$WORK/env.json" ;;
        tests) run_step tests "$PY" -m pytest -q -m gpu -n 4 -p no:cacheprovider --timeout 100 \
                   --continue-on-collection-errors \
                   --deselect tests/test_benchmarks.py::test_bench_gpu_mfu_on_cuda_reports_mfu \
                   --junitxml "$WORK/junit.xml" tests
               "$PY" - "$WORK/junit.xml" "$WORK/tests.json" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    json.dump({"error": f"no junit report: {exc}"}, open(sys.argv[2], "w")); sys.exit(0)
cases = []
for c in root.iter("testcase"):
    kind = next((k.tag for k in c if k.tag in ("failure", "error", "skipped")), "passed")
    msg = next((k.get("message", "")[:300] for k in c if k.tag in ("failure", "error", "skipped")), "")
    cases.append({"test": f"{c.get('classname')}::{c.get('name')}", "outcome": kind, "s": float(c.get("time", 0)), "message": msg})
counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
json.dump({"counts": counts, "cases": cases}, open(sys.argv[2], "w"), indent=1)
print(counts)
EOF
               ;;
        mfu) run_step mfu "$PY" benchmarks/bench_gpu_mfu.py "${MFU_ARGS[@]}" --json "$WORK/mfu.json" ;;
        memory) run_step memory "$PY" benchmarks/bench_cuda_memory.py "${MEM_ARGS[@]}" \
                    --optimizers adamw lion muon --json "$WORK/memory.json" ;;
        headline) run_step headline "$PY" benchmarks/gpu_check.py headline "$WORK/headline" "$WORK/headline.json" \
                      --timeout $((LIMIT[headline] - 5)) "${PY_ARGS[@]}" "${HEADLINE_ARGS[@]}" ;;
        zero) run_step zero "$PY" benchmarks/gpu_check.py zero "$WORK/zero" "$WORK/zero.json" \
                  --timeout $((LIMIT[zero] - 5)) "${PY_ARGS[@]}" ;;
    esac
done

echo
"$PY" benchmarks/gpu_check.py collect "$WORK" "$OUT"
echo "gpu_check: wrote $OUT/gpu_check.json and $OUT/gpu_check.log"
# exit 0 only when every step passed
! cut -f2 "$WORK/steps.tsv" | grep -qv '^0$'
}

# a pipeline, not `exec > >(tee ...)`: the script returns only after tee has written the whole log
main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
