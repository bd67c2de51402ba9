#!/usr/bin/env bash
# GPU validation (issue 44): one run on the device machine, from the repo root, in under 8 minutes.
#
#   FUSEG_GIT_COMMIT=<sha> bash perf/gpu_validate.sh             the run (an H100: see README "On a GPU")
#   OUT=/tmp/gpu_dry bash perf/gpu_validate.sh --dry-run           the same steps on this machine's CPU, at tiny
#                                                                  sizes (checks the plumbing; no figure is a result)
#   STEPS="install env tests compiled" bash perf/gpu_validate.sh    only the steps named (summary always runs), for a
#                                                                  second run in what device time is left
#
# Every log and JSON record goes to $OUT (./gpu_out without it), named with the GPU's tag (h100, h200,
# ...: cpu in a dry run), ready to be copied into perf/results/. Steps, in order, each under its own
# time budget (timeout; time a step leaves unused goes to the next) and each run whatever the others
# did; the whole run stops starting steps once TOTAL_S is spent:
#   install    pip install -e . (no deps, no build isolation, no network)                      40 s
#   env        versions (python, torch, CUDA, driver, CuPy, Triton, transformers), nvidia-smi     20 s
#   tests      the whole GPU test table (tests/test_gpu*.py) in SHARDS parallel pytest processes 120 s
#   dynamic    perf.dynamic_shapes --device cuda on qwen2 (issue 41): generation (aot_eager, Inductor,
#              fuseg: NVRTC compiles per generate, tokens against eager's, full collections per
#              generate, one profiled generate each) and training on changing lengths (Inductor,
#              fuseg: loss and gradients against eager, symbolic plans or why there are none)   200 s
#   compiled   perf.compiled --device cuda --set gpu: eager / Inductor / Inductor reduce-overhead /
#              fuseg / fuseg with CUDA graphs, six models, record written after each model      175 s
#   bias       perf.compiled again on the four models with an addmm's bias (gpt2-tiny, bert-tiny,
#              qwen2-tiny, vit) with FUSEG_BIAS_AFTER_MATMUL=0 (Note [a matmul's bias after it] off):
#              fuseg and fuseg with CUDA graphs as before that change, on the same machine       60 s
#   bandwidth  perf.gpu.gpu_bandwidth: softmax / layer norm / RMS norm 4096x4096 fp32 and five RoPE
#              blocks against a device copy of the same bytes                                    80 s
#   before     perf.gpu.gpu_bandwidth again with FUSEG_CUDA_TUNING=0 (Note [CUDA launch shapes]), no
#              Inductor: fuseg's kernels as they were before that tuning, on the same machine     45 s
#   loads      perf.gpu.gpu_bandwidth again with FUSEG_ROW_REGS=0 FUSEG_BCAST_EPT=0 (Note [row registers]
#              and Note [elements along a broadcast dim] off: the row and RoPE kernels as they were
#              before them, on the same machine), no Inductor                                    30 s
#   whole      the RoPE blocks with FUSEG_BCAST_WHOLE=0 (Note [elements along a broadcast dim]: a
#              small dim taken whole, on since run 5), no Inductor: the before of that change    40 s
#   kernels    perf.gpu.gpu_kernels: per-kernel device time of vit and bert-tiny, fuseg with CUDA graphs
#              against Inductor reduce-overhead (vit missed the 1.1x target in runs 3 and 4)   40 s
#   overhead   perf.benchmarks.launch_overhead: host time per call of a one-kernel program, with a graph   20 s
#   host       perf.benchmarks.launch_overhead --program rope-seed: host time per call of the RoPE seed block's
#              one-kernel program, built as it is and with FUSEG_BCAST_EPT=0 / FUSEG_CUDA_TUNING=0
#              (run 5: ~55 us against ~35 us with either off), each profiled                   20 s
#   summary    perf.gpu.gpu_summary: what each step did, and what missed issue 44's targets          10 s
# Budgets add up to 900 s (TOTAL_S, 470 s, stops the run sooner); nvFuser is not run (no wheel for this torch).
set -u
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TOTAL_S=${TOTAL_S:-470}
SHARDS=${SHARDS:-8}
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export FUSEG_GIT_COMMIT=${FUSEG_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
START=$(date +%s)
: > "$OUT/steps.txt"

if [ $DRY = 1 ]; then
  TAG=cpu
  SHARDS=1
else
  NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  TAG=$(echo "$NAME" | grep -oiE 'h100|h200|a100|l40s|l4|a10g|b200' | head -1 | tr 'A-Z' 'a-z')
  TAG=${TAG:-gpu}
fi
echo "gpu_validate: tag $TAG, commit $FUSEG_GIT_COMMIT, out $OUT, dry run $DRY"

# step NAME BUDGET_S LOG COMMAND...: runs COMMAND under its budget, plus what earlier steps left
# unused (BANK), at most the time left, with its output in $OUT/LOG; records its exit status and
# seconds in steps.txt (124: cut by its budget) and shows its tail. Every step still gets its own
# budget: the budgets add up to less than TOTAL_S, and a step only spends what earlier ones saved.
BANK=0
step() {
  local name=$1 budget=$2 log=$3
  shift 3
  local now left t0 rc used
  if [ -n "${STEPS:-}" ] && [ "$name" != summary ] && [[ " $STEPS " != *" $name "* ]]; then
    echo "$name: not asked (STEPS=$STEPS)" | tee -a "$OUT/steps.txt"
    return
  fi
  now=$(date +%s)
  left=$((START + TOTAL_S - now))
  if [ "$left" -lt 5 ]; then
    echo "$name: skipped (no time left of ${TOTAL_S}s)" | tee -a "$OUT/steps.txt"
    return
  fi
  budget=$((budget + BANK))
  [ "$budget" -gt "$left" ] && budget=$left
  echo "=== $name (budget ${budget}s) ==="
  t0=$(date +%s)
  # (bash -c: a step may be one of the functions below; timeout signals the step's whole process group)
  timeout -k 5 "$budget" bash -c '"$@"' "$name" "$@" > "$OUT/$log" 2>&1
  rc=$?
  used=$(( $(date +%s) - t0 ))
  BANK=$((budget > used ? budget - used : 0))
  echo "$name: exit $rc, ${used}s of ${budget}s, log $log" | tee -a "$OUT/steps.txt"
  tail -n 4 "$OUT/$log"
}

install() {
  "$PY" -m pip install --no-deps --no-build-isolation --no-index -e . && "$PY" -c "import runtime, segmenter, alias, perf"
}

env_record() {
  nvidia-smi || echo "(no nvidia-smi)"
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|cupy|triton|transformers|numpy|pandas|pytest|nvidia-cuda)' || true
  "$PY" - "$1" "$2" <<'PY'
import json, sys, torch
from perf.bench import environment
env = environment(sys.argv[2])
try:
    import cupy
    env["cupy_sees_cuda"] = bool(cupy.cuda.is_available())
    env["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion() if env["cupy_sees_cuda"] else None
except Exception as e:  # recorded, not fatal
    env["cupy_sees_cuda"] = f"{type(e).__name__}: {e}"
with open(sys.argv[1], "w") as f:
    json.dump(env, f, indent=1)
print(json.dumps(env, indent=1))
PY
}

# the GPU test table, sharded: collect the ids, deal them round-robin, one pytest per shard
gpu_tests() {
  local ids="$OUT/gpu_tests_${TAG}_ids.txt" k pids=()
  "$PY" -m pytest --collect-only -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_cudagraphs.py \
    > "$OUT/gpu_tests_${TAG}_collect.log" 2>&1
  grep '::' "$OUT/gpu_tests_${TAG}_collect.log" > "$ids"
  echo "$(wc -l < "$ids") tests in $SHARDS shards; collection: $(tail -n 1 "$OUT/gpu_tests_${TAG}_collect.log")"
  grep -iE '^(ERROR|E ) ' "$OUT/gpu_tests_${TAG}_collect.log" | head -n 20
  for k in $(seq 0 $((SHARDS - 1))); do
    awk -v n="$SHARDS" -v k="$k" '(NR - 1) % n == k' "$ids" > "$OUT/gpu_tests_${TAG}_shard$k.ids"
    # (-r: a shard with no ids runs nothing, not the whole suite)
    xargs -r -a "$OUT/gpu_tests_${TAG}_shard$k.ids" -d '\n' "$PY" -m pytest -q -p no:cacheprovider -rfEs \
      --junitxml="$OUT/gpu_tests_${TAG}_shard$k.xml" > "$OUT/gpu_tests_${TAG}_shard$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for k in $(seq 0 $((SHARDS - 1))); do
    echo "--- shard $k: $(tail -n 1 "$OUT/gpu_tests_${TAG}_shard$k.log")"
    grep -E '^(FAILED|ERROR) ' "$OUT/gpu_tests_${TAG}_shard$k.log" | head -n 60
  done
  return $rc
}


# dynamic_shapes DEVICE "GENERATE BACKENDS" "TRAIN BACKENDS": qwen2's generation with the first
# backends, each protocol ending with one profiled generate (kernels, launches, ATen calls), then
# its training on changing lengths with the second (issue 41), each record written when done
dynamic_shapes() {
  local device=$1
  "$PY" -m perf.dynamic_shapes --device "$device" --models qwen2 --backends $2 --repeats 3 --profile \
    --out "$OUT/gpu_dynamic_generate_$TAG.json"
  local gen=$?
  "$PY" -m perf.dynamic_shapes --device "$device" --train --models qwen2 --backends $3 \
    --out "$OUT/gpu_dynamic_train_$TAG.json" || return $?
  return $gen
}

export -f install env_record gpu_tests dynamic_shapes
export OUT TAG SHARDS PY

if [ $DRY = 1 ]; then
  echo "install: skipped in a dry run" | tee -a "$OUT/steps.txt"
  step env 20 "gpu_env_$TAG.txt" env_record "$OUT/gpu_env_$TAG.json" cpu
  step tests 120 "gpu_tests_$TAG.txt" gpu_tests
  step dynamic 110 "gpu_dynamic_$TAG.log" dynamic_shapes cpu eager eager
  step compiled 175 "gpu_compiled_$TAG.log" "$PY" -m perf.compiled mlp --device cpu \
    --variants fuseg,fuseg_graphs,floor --rounds 1 --calls 2 --no-first-call --out "$OUT/gpu_compiled_$TAG.json"
  step bias 60 "gpu_compiled_bias_fused_$TAG.log" env FUSEG_BIAS_AFTER_MATMUL=0 "$PY" -m perf.compiled mlp --device cpu \
    --variants fuseg,fuseg_graphs --rounds 1 --calls 2 --no-first-call --out "$OUT/gpu_compiled_bias_fused_$TAG.json"
  step bandwidth 80 "gpu_bandwidth_$TAG.log" "$PY" -m perf.gpu.gpu_bandwidth --device cpu --size 256 --rope rope-seed \
    --rounds 1 --iters 2 --no-inductor --out "$OUT/gpu_bandwidth_$TAG.json"
  step before 45 "gpu_bandwidth_before_$TAG.log" env FUSEG_CUDA_TUNING=0 "$PY" -m perf.gpu.gpu_bandwidth --device cpu \
    --size 256 --rope rope-seed --rounds 1 --iters 2 --no-inductor --out "$OUT/gpu_bandwidth_before_$TAG.json"
  step kernels 40 "gpu_kernels_$TAG.log" "$PY" -m perf.gpu.gpu_kernels mlp --device cpu --variants fuseg,dynamo \
    --calls 2 --out "$OUT/gpu_kernels_$TAG.json"
  step overhead 20 "gpu_launch_overhead_$TAG.log" "$PY" -m perf.benchmarks.launch_overhead --device cpu --calls 20 \
    --out "$OUT/gpu_launch_overhead_$TAG.json"
  step host 20 "gpu_launch_overhead_rope_$TAG.log" "$PY" -m perf.benchmarks.launch_overhead --device cpu --program rope-seed \
    --calls 20 --rounds 2 --out "$OUT/gpu_launch_overhead_rope_$TAG.json"
else
  step install 40 "gpu_install_$TAG.log" install
  step env 20 "gpu_env_$TAG.txt" env_record "$OUT/gpu_env_$TAG.json" cuda
  step tests 120 "gpu_tests_$TAG.txt" gpu_tests
  step dynamic 200 "gpu_dynamic_$TAG.log" dynamic_shapes cuda "aot_eager inductor fuseg" "inductor fuseg"
  step compiled 175 "gpu_compiled_$TAG.log" "$PY" -m perf.compiled --device cuda --set gpu --rounds 5 --calls 20 \
    --out "$OUT/gpu_compiled_$TAG.json"
  step bias 60 "gpu_compiled_bias_fused_$TAG.log" env FUSEG_BIAS_AFTER_MATMUL=0 "$PY" -m perf.compiled gpt2-tiny bert-tiny \
    qwen2-tiny vit --device cuda --variants fuseg,fuseg_graphs --rounds 5 --calls 20 --no-first-call \
    --out "$OUT/gpu_compiled_bias_fused_$TAG.json"
  step bandwidth 80 "gpu_bandwidth_$TAG.log" "$PY" -m perf.gpu.gpu_bandwidth --device cuda --rounds 5 --iters 10 \
    --out "$OUT/gpu_bandwidth_$TAG.json"
  step before 45 "gpu_bandwidth_before_$TAG.log" env FUSEG_CUDA_TUNING=0 "$PY" -m perf.gpu.gpu_bandwidth --device cuda \
    --rounds 5 --iters 10 --no-inductor --out "$OUT/gpu_bandwidth_before_$TAG.json"
  step loads 30 "gpu_bandwidth_loads_$TAG.log" env FUSEG_ROW_REGS=0 FUSEG_BCAST_EPT=0 "$PY" -m perf.gpu.gpu_bandwidth \
    --device cuda --rounds 5 --iters 10 --no-inductor --out "$OUT/gpu_bandwidth_loads_$TAG.json"
  step whole 40 "gpu_whole_$TAG.log" env FUSEG_BCAST_WHOLE=0 "$PY" -m perf.gpu.gpu_bandwidth --device cuda --cases rope \
    --rounds 5 --iters 10 --no-inductor --out "$OUT/gpu_bandwidth_whole_off_$TAG.json"
  step kernels 40 "gpu_kernels_$TAG.log" "$PY" -m perf.gpu.gpu_kernels vit bert-tiny --device cuda \
    --out "$OUT/gpu_kernels_$TAG.json"
  step overhead 20 "gpu_launch_overhead_$TAG.log" "$PY" -m perf.benchmarks.launch_overhead --device cuda --calls 2000 \
    --out "$OUT/gpu_launch_overhead_$TAG.json"
  step host 20 "gpu_launch_overhead_rope_$TAG.log" "$PY" -m perf.benchmarks.launch_overhead --device cuda --program rope-seed \
    --calls 500 --rounds 3 --out "$OUT/gpu_launch_overhead_rope_$TAG.json"
fi
step summary 10 "gpu_summary_$TAG.log" "$PY" -m perf.gpu.gpu_summary "$OUT" --tag "$TAG"
cat "$OUT/gpu_validate_summary_$TAG.txt" 2>/dev/null
# the shards' files in one archive (the device tool brings back a limited number of files: run 7
# lost them), after the summary has read them (untar it beside them to run perf.gpu.gpu_summary again)
if ls "$OUT"/gpu_tests_"${TAG}"_shard* > /dev/null 2>&1; then
  (cd "$OUT" && tar czf "gpu_tests_${TAG}_all_shards.tgz" gpu_tests_"${TAG}"_shard* && rm -f gpu_tests_"${TAG}"_shard*)
fi
echo "gpu_validate: $(( $(date +%s) - START ))s in all"
