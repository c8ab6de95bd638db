#!/bin/bash
# Builds the standalone attention harness (bench/attention_harness.cu +
# devices/cuda/attention.cu, no StarPU library) into build-attn/ as
# attention_harness_NAME, once per NAME:NVCC_FLAGS argument (default: one
# build "v0" with no extra flags). The tile-product variants are chosen in
# attention.cu's Cfg table (the build-time knobs of the 2026-12-02 sweep were
# folded into it).
# Needs nvcc and StarPU's headers (emcuda.h includes starpu.h).
set -euo pipefail
cd "$(dirname "$0")/.."
OUTD=${OUTD:-build-attn}
mkdir -p "$OUTD"
NV="nvcc -O3 -arch=sm_90 -std=c++17 -I. -Iinclude -I${STARPU_INC:-/opt/ember-deps/include/starpu/1.4}"
$NV -c bench/attention_harness.cu -o "$OUTD/harness.o"
[ $# -gt 0 ] || set -- "v0:"
for spec in "$@"; do
    name=${spec%%:*}
    flags=${spec#*:}
    $NV $flags -c devices/cuda/attention.cu -o "$OUTD/attention_$name.o"
    nvcc -arch=sm_90 "$OUTD/harness.o" "$OUTD/attention_$name.o" -o "$OUTD/attention_harness_$name"
    echo "built $OUTD/attention_harness_$name ($flags)"
done
cp bench/attention_run.sh bench/attention_torch.py "$OUTD/"
