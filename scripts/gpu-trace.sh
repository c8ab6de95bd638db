#!/usr/bin/env bash
# Task timelines (EMBER_TRACE, runtime/trace.c) of the data-parallel
# benchmark on the GPU machine, for offline analysis with
# scripts/trace-summary.py. Layout as scripts/gpu-scaling.sh (carry .deps and
# build-gpu after scripts/gpu-pack.sh). For each model (wide: 784-4096x3-10
# batch 512; small: 784-256-128-10 batch 64) it traces TRACE_STEPS steps on
# 1 GPU, on 2 GPUs with mpirun (one file per rank) and on 2 GPUs in one
# process (--devices) (TRACE_MODELS: which models, default "wide small"), and writes $OUT/traces/<model>-<form>.json[.rankN].gz
# plus $OUT/traces/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
OUT="${OUT:-$ROOT/gpu-out}"
BUILD="$ROOT/build-gpu"
DEPS="$ROOT/.deps"
WORK=$(mktemp -d /tmp/ember-trace.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent STARPU_WORKERS_NOBIND=1 EMBER_NCPU="${EMBER_NCPU:-2}" NCCL_NVLS_ENABLE=0
export STARPU_NWORKER_PER_CUDA="${STARPU_NWORKER_PER_CUDA:-2}" EMBER_DIST_BUCKET_KB="${EMBER_DIST_BUCKET_KB:-25600}"
STEPS="${TRACE_STEPS:-60}"
T="$OUT/traces"
mkdir -p "$T"
MPIRUN=(mpirun --allow-run-as-root --bind-to none --mca btl_vader_single_copy_mechanism none
        -x LD_LIBRARY_PATH -x PATH -x STARPU_HOME -x STARPU_SILENT -x OCL_ICD_VENDORS -x STARPU_WORKERS_NOBIND -x EMBER_NCPU
        -x NCCL_NVLS_ENABLE -x STARPU_NWORKER_PER_CUDA -x EMBER_DIST_BUCKET_KB -x EMBER_TRACE ${TRACE_MPI_ARGS:-})
"$BUILD/ember" devices >/dev/null 2>&1   # bus calibration once
for model in ${TRACE_MODELS:-wide small}; do
  if [ "$model" = wide ]; then args=(--hidden 4096,4096,4096 --batch 512); else args=(--hidden 256,128 --batch 64); fi
  args+=(--steps "$STEPS" --warmup 10 --label "$model")
  EMBER_TRACE="$T/$model-1gpu.json" timeout 120 "$BUILD/bench/bench_scaling" --device cuda:0 "${args[@]}" 2>&1 | grep RESULT
  EMBER_TRACE="$T/$model-mpirun2.json" timeout 120 "${MPIRUN[@]}" -np 2 "$BUILD/bench/bench_scaling" --device cuda:0 "${args[@]}" 2>&1 | grep RESULT
  EMBER_TRACE="$T/$model-1p2.json" timeout 120 "$BUILD/bench/bench_scaling" --devices cuda:0,cuda:1 "${args[@]}" 2>&1 | grep RESULT
done
python3 "$ROOT/scripts/trace-summary.py" "$T"/*.json* >"$T/summary.txt" 2>&1
gzip -f "$T"/*.json "$T"/*.json.rank* 2>/dev/null
cat "$T/summary.txt"
