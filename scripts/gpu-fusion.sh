#!/usr/bin/env bash
# On the GPU machine, from the checkout the device tool copies (run scripts/gpu-pack.sh there first;
# carry [".deps", "build-gpu"]; drop .deps/fashion-mnist if the carry is over 64 MiB): the fusion
# tests (the FUSED case and the fused chains on cuda:0, test_fusion on cuda:0) and bench_fusion on
# cuda:0 and the CPU; logs and summary.txt under $OUT.
set -uo pipefail
ROOT=$(pwd -P); BUILD=$ROOT/build-gpu; DEPS=$ROOT/.deps; WORK=$(mktemp -d /tmp/ember-gpu.XXXXXX)
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent EMBER_TEST_DATA="$ROOT/tests/fixtures"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S="$OUT/summary.txt"
nvidia-smi -L >"$S" 2>&1
cd "$BUILD/tests"
run() { local name=$1 t=$2; shift 2; local st=$(date +%s); ( timeout "$t" "$@" ) >"$OUT/$name.log" 2>&1; echo "$name: rc $? ($(( $(date +%s) - st )) s)" >>"$S"; }
run cons_fused_case 200 env EMBER_CONSISTENCY_OPS=fused,gelu,add,mul,tanh EMBER_CONSISTENCY_REQUIRE=cuda ./test_consistency
run cons_chains 240 env EMBER_FUSION=1 EMBER_CONSISTENCY_FUSED=1 EMBER_CONSISTENCY_REQUIRE=cuda ./test_consistency
run test_fusion_cuda 150 env EMBER_DEVICE=cuda:0 ./test_fusion
cd "$BUILD/bench"
run bench_fusion_cuda 200 ./bench_fusion --device cuda:0
run bench_fusion_cpu 200 ./bench_fusion --device cpu
for f in cons_fused_case cons_chains test_fusion_cuda; do echo "== $f" >>"$S"; grep -E "^op |^fused|^gelu|^add |^mul |^tanh|FAIL|chains|worst|variants|PASSED|FAILED|fusion:|CUDA:" "$OUT/$f.log" | head -40 >>"$S"; done
for f in bench_fusion_cuda bench_fusion_cpu; do echo "== $f" >>"$S"; cat "$OUT/$f.log" >>"$S"; done
cat "$S"
