#!/usr/bin/env bash
# One prepared check of hf_optbench's CUDA paths on one GPU in about 5 minutes: a budget of 330 s of step limits,
# so that 15 minutes of device time hold machine start, the wheels' install and a rerun (issue 42).
#
#   benchmarks/gpu_check.sh OUT_DIR [STEP ...]   STEP: env tests memory zero resume mfu headline (default: all)
#
# First the untimed steps, together (they run at once, each with its own limit: the group takes the longest):
#   env       versions and device
#   tests     the `gpu`-marked tests (pytest -m gpu, 4 workers), the MFU benchmark's own test left to `mfu`
#   memory    benchmarks/bench_cuda_memory.py: CUDA peak allocated and optimizer state against the planner for
#             adamw, lion, muon at gpt2 and gpt2-medium (peaks are per process: the others do not move them)
#   zero      ZeRO-2 (accelerate_configs/a100x4_zero2.yaml, one process) with hf_optbench's Lion at gpt2
#   resume    recipes/lion_gpt2.yaml eager, 20 steps with a checkpoint at 10, then a resume from it: the plan's
#             identity check passes and the losses of steps 11-20 are compared (benchmarks/gpu_check.py)
# Then the timed steps, each alone on the GPU:
#   mfu       benchmarks/bench_gpu_mfu.py at gpt2: bf16, SDPA, torch.compile, nanoGPT's loop against hf_optbench at
#             micro-batch 64 (the largest that fitted an H100 before, no search), a sync every 10 steps
#   headline  recipes/lion_gpt2_large.yaml compiled, ~30 steps at the largest micro-batch the memory planner fits
#             (no accumulation), no checkpoint, no evaluation (benchmarks/gpu_check.py)
#
# Before anything runs it prints its plan: each step's limit and the budget (the untimed group's longest limit plus
# each timed step's); GPU_CHECK_PLAN=1 prints only the plan. Everything measured goes to OUT_DIR/gpu_check.json (one object per step: status, exit code,
# seconds, the step's figures) and the whole console to OUT_DIR/gpu_check.log, nothing else (the device tool
# brings back few files); each step's own JSON, log and run directories stay in a temporary folder. Without a CUDA
# device it prints the plan in one line and exits 0. Where ./.whl holds wheels (`make gpu-wheels`), they are
# installed into a temporary --target first and put on PYTHONPATH (the GPU machine reaches no package registry).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR [env tests memory zero resume mfu headline]}
shift
STEPS=${*:-env tests memory zero resume mfu headline}
PY=${PYTHON:-python3}
UNTIMED="env tests memory zero resume"
# Limits, from the first runs on an H100 (2026-11-26, benchmarks/results/gpu_check_h100_run*.json) and issue 42's
# reading of them: env took 19 s (cold imports), the gpu tests 32 s without the MFU benchmark's own (62 s of their
# 94), memory 48 s; ZeRO-2's launch alone outlasted 30 s (at least 90 s now); the resume is two gpt2 launches of
# ~20 s start-up each (a guess: it never ran there); mfu took 108 s with its micro-batch search (the search is gone:
# two compiles of gpt2 remain); the compiled gpt2-large headline took 149 s for 100 steps with a checkpoint and two
# evaluations, about 100 s of it start-up and compiling (30 steps, neither, now). The untimed ones share the
# machine, hence their margins (env timed out at 40 s in a CPU rehearsal beside the others).
declare -A LIMIT=([env]=60 [tests]=100 [memory]=100 [zero]=110 [resume]=110 [mfu]=90 [headline]=130)
for step in $STEPS; do
    [[ -n ${LIMIT[$step]+x} ]] || { echo "gpu_check: unknown step '$step': choose from env tests memory zero resume mfu headline"; exit 2; }
    # GPU_CHECK_LIMIT_<step>=SECONDS overrides a step's limit (a rerun of the steps that ran out of time)
    override=GPU_CHECK_LIMIT_$step
    if [[ -n ${!override:-} ]]; then
        [[ ${!override} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: $override must be a whole number of seconds, got '${!override}'"; exit 2; }
        LIMIT[$step]=${!override}
    fi
done

# the plan: the untimed steps asked for (run together), then each timed one; the budget is what the limits allow
together=() alone=() group=0 budget=0
for step in $STEPS; do
    if [[ " $UNTIMED " == *" $step "* ]]; then
        together+=("$step ${LIMIT[$step]} s")
        (( LIMIT[$step] > group )) && group=${LIMIT[$step]}
    else
        alone+=("$step ${LIMIT[$step]} s")
        budget=$((budget + LIMIT[$step]))
    fi
done
budget=$((budget + group))
plan_text() {
    local text="" item
    if ((${#together[@]})); then
        text="together: $(IFS=,; echo "${together[*]}" | sed 's/,/, /g') (longest ${group} s)"
    fi
    for item in "${alone[@]}"; do text+="${text:+; }then alone: $item"; done
    echo "$text; budget ${budget} s"
}
PLAN=$(plan_text)
# GPU_CHECK_PLAN=1: print the plan and stop (nothing imported, nothing run)
[[ ${GPU_CHECK_PLAN:-0} == 1 ]] && { echo "gpu_check: plan [$PLAN]"; exit 0; }

# GPU_CHECK_REHEARSE=1: every step's code path on the CPU at toy shapes (tiny, fp32, no compile), no wheels
# installed: a check of this script before a GPU is lent, never a measurement.
REHEARSE=${GPU_CHECK_REHEARSE:-0}
if [[ $REHEARSE != 1 ]] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device here, nothing run; on a GPU its plan is [$PLAN] and it writes $OUT/gpu_check.json and $OUT/gpu_check.log"
    exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
: > "$WORK/steps.tsv"

main() {
echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), steps [$STEPS], work $WORK"
echo "gpu_check: plan [$PLAN]"

MFU_ARGS=(--sizes gpt2 --block 1024 --batch 64 --steps 20 --rounds 1 --logging-steps 10)
MEM_ARGS=(--sizes gpt2 gpt2-medium --micro-batch 8 --block 1024)
PY_ARGS=()
if [[ $REHEARSE == 1 ]]; then
    echo "gpu_check: REHEARSAL on the CPU (toy shapes; no figure here is a measurement)"
    MFU_ARGS=(--device cpu --sizes tiny --batch 2 --block 64 --steps 4 --rounds 1 --no-compile --dtype fp32
              --logging-steps 2)
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

step_command() {  # the command of one step, as words
    case $1 in
        env) echo "$PY benchmarks/gpu_check.py env $WORK/env.json" ;;
        tests) echo "$PY benchmarks/gpu_check.py tests $WORK/tests.json --timeout $((LIMIT[tests] - 5))" ;;
        memory) echo "$PY benchmarks/bench_cuda_memory.py ${MEM_ARGS[*]} --optimizers adamw lion muon --json $WORK/memory.json" ;;
        zero) echo "$PY benchmarks/gpu_check.py zero $WORK/zero $WORK/zero.json --timeout $((LIMIT[zero] - 5)) ${PY_ARGS[*]}" ;;
        resume) echo "$PY benchmarks/gpu_check.py resume $WORK/resume $WORK/resume.json --timeout $((LIMIT[resume] - 5)) ${PY_ARGS[*]}" ;;
        mfu) echo "$PY benchmarks/bench_gpu_mfu.py ${MFU_ARGS[*]} --json $WORK/mfu.json" ;;
        headline) echo "$PY benchmarks/gpu_check.py headline $WORK/headline $WORK/headline.json --timeout $((LIMIT[headline] - 5)) ${PY_ARGS[*]}" ;;
    esac
}

run_step() {  # one step under its own limit, its console to WORK/<step>.log; a row in steps.tsv whatever happens
    local name=$1 limit=${LIMIT[$1]} t0=$SECONDS rc
    # shellcheck disable=SC2046  # the command's words, split on purpose (no word holds a space)
    timeout --kill-after=10 "$limit" $(step_command "$name") > "$WORK/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$WORK/steps.tsv"
}

show_step() {  # its console into the log, after it ended (steps run together do not interleave there)
    echo
    echo "=== $1 (limit ${LIMIT[$1]} s): $(step_command "$1")"
    cat "$WORK/$1.log" 2>/dev/null
    echo "=== $1: $(awk -F'\t' -v s="$1" '$1 == s {print "exit " $2 " after " $3 " s"}' "$WORK/steps.tsv")"
}

started=()
for step in $STEPS; do
    [[ " $UNTIMED " == *" $step "* ]] || continue
    run_step "$step" &
    started+=("$step")
done
if ((${#started[@]})); then
    echo "gpu_check: running together: ${started[*]}"
    wait
    for step in "${started[@]}"; do show_step "$step"; done
fi
for step in $STEPS; do
    [[ " $UNTIMED " == *" $step "* ]] && continue
    run_step "$step"
    show_step "$step"
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
