#!/usr/bin/env bash
# Runs Ember's tests, the cross-device consistency test and the benchmarks on
# the GPU machine (Ubuntu 24.04, CUDA 13, driver 580, H200; no StarPU, no
# hwloc, no registry access), in one go, writing every log under $OUT.
#
# Prepare HERE first:   scripts/gpu-pack.sh      (builds build-gpu/, fills .deps/)
# Then on the device:   carry [".deps", "build-gpu"], command:
#                       bash scripts/gpu-run.sh [step ...]
# Steps, in this order (default: all): env consistency tests bench sanitizer
#   env          nvidia-smi, StarPU's view of the machine, `ember devices`, ldd
#   consistency  tests/test_consistency with the CUDA workers (every op on CPU
#                and CUDA, forward + backward, sentinel checks) + a diagnostic
#                bit-exactness run (EMBER_CONSISTENCY_EXACT=1, not a failure)
#   tests        the whole CTest suite (ctest), sequential
#   bench        every build-gpu/bench/bench_* on the CPU and with EMBER_DEVICE=cuda:0
#   vision       the CNN / conv / ResNet-18 anchors side by side (not in the default list)
#   precision    issue #15 side by side (not in the default list): bench_gemm_half
#                (bf16/f16/TF32 GEMM task vs cuBLAS direct, bf16 add vs copy), then
#                PRECISION_PAIRS (default 3) alternating rounds of the MLP (bench_cuda
#                mlp vs mlp_torch_gpu.py) and CNN (bench_cnn vs cnn_torch.py) in f32
#                and bf16 autocast, then `ember train --precision f32/bf16` on cuda:0
#   gpt          issue #16 side by side (not in the default list): the char-level
#                GPT and GPT-2 124M training steps, bench_gpt vs bench/gpt_torch.py
#                (eager f32/TF32/bf16, compiled bf16)
#   gpttrain     `ember train --model gpt` (the anchor run; GPT_ITERS, GPT_PRECISION)
#                then `ember generate` on cuda:0 and the CPU (not in the default list)
#   attention    the attention kernels' harness and torch's SDPA (not in the default list)
#   onnx         issue #19: ember run on cuda:0 vs the host's CPU workers, and
#                the ONNX node tests on cuda:0 (run_onnx below says what to put
#                in gpu-onnx/)
#   serve        issue #18: scripts/serve-bench.sh (offline vs server throughput for
#                cuda:0, cpu+cuda:0 and cpu instances, a soak run; not in the default list)
#   sanitizer    test_consistency under compute-sanitizer memcheck (out-of-bounds
#                accesses in CUDA kernels), when compute-sanitizer exists
# Time: the whole run stays within GPU_RUN_BUDGET_S seconds (default 560, the
# device tool allows 600 per command); each step gets what is left, so the
# steps at the end may be cut short (their logs say so). Split the steps
# over several calls when that happens.
# Output: $OUT/summary.txt (step statuses, the consistency table, failures,
# benchmark tables) plus one log per step. Exit status: 0 when the
# consistency test and the test suite pass, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
BUILD="${EMBER_GPU_BUILD:-$ROOT/build-gpu}"   # EMBER_GPU_BUILD: a trimmed copy when the carry is tight
DEPS="$ROOT/.deps"
START=$(date +%s)
BUDGET="${GPU_RUN_BUDGET_S:-560}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# timeout for a step: min(wanted, time left - 10 s), at least 5 s
tlimit() { local l; l=$(( $(left) - 10 )); [ "$l" -lt 5 ] && l=5; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }

STEPS="${*:-env consistency tests bench sanitizer}"
say "gpu-run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), steps: $STEPS, budget ${BUDGET}s, logs in $OUT"

if [ ! -f "$BUILD/libember.so" ] || [ ! -d "$DEPS/starpu/lib" ]; then
  say "gpu-run: build-gpu/ or .deps/ missing: run scripts/gpu-pack.sh on the build machine and carry both"
  exit 1
fi
[ -f "$DEPS/MANIFEST" ] && cat "$DEPS/MANIFEST" >"$OUT/manifest.txt"

# ---- environment ------------------------------------------------------------------
WORK=$(mktemp -d /tmp/ember-gpu.XXXXXX)
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1
export OCL_ICD_VENDORS=/nonexistent      # CUDA, not OpenCL, drives the GPU here
export EMBER_TEST_DATA="$ROOT/tests/fixtures"
say "gpu-run: fallback libraries used: $(ls "$FB" | tr '\n' ' ')"

MISSING=$(for e in "$BUILD/libember.so" "$BUILD"/tests/test_* "$BUILD"/bench/bench_*; do
  [ -x "$e" ] || [ -f "$e" ] || continue
  ldd "$e" 2>/dev/null | grep "not found"
done | sort -u)
if [ -n "$MISSING" ]; then
  say "gpu-run: WARNING: unresolved libraries:"
  say "$MISSING"
fi

FAILED=0
status() { # step name, rc
  local s="ok"
  [ "$2" -eq 124 ] || [ "$2" -eq 137 ] && s="TIMEOUT"
  [ "$2" -ne 0 ] && [ "$s" = ok ] && s="FAIL (rc $2)"
  say "step $1: $s"
}

run_env() {
  {
    echo "== nvidia-smi"; nvidia-smi 2>&1
    echo "== nvcc"; nvcc --version 2>&1 | tail -2
    echo "== starpu_machine_display"; timeout "$(tlimit 60)" starpu_machine_display 2>&1
    echo "== ember devices"; timeout "$(tlimit 60)" "$BUILD/ember" devices 2>&1
    echo "== ldd libember.so"; ldd "$BUILD/libember.so"
    echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  } >"$OUT/env.log" 2>&1
  status env 0
  grep -E "^workers:|worker .* cuda" "$OUT/env.log" | tee -a "$SUMMARY"
}

run_consistency() {
  local rc
  ( cd "$BUILD/tests" && timeout "$(tlimit 240)" ./test_consistency ) >"$OUT/consistency.log" 2>&1
  rc=$?
  status consistency "$rc"
  [ "$rc" -ne 0 ] && FAILED=1
  grep -q "CUDA: [0-9]* worker" "$OUT/consistency.log" || say "gpu-run: WARNING: the consistency test saw no CUDA worker"
  sed -n '/^op /,/^consistency: [0-9]* case/p' "$OUT/consistency.log" >>"$SUMMARY"
  grep -E "^consistency: (CUDA|OpenCL)" "$OUT/consistency.log" >>"$SUMMARY"
  # diagnostic: which ops are bit-identical to the CPU (failures here are expected for libm-based ops)
  ( cd "$BUILD/tests" && EMBER_CONSISTENCY_EXACT=1 timeout "$(tlimit 120)" ./test_consistency ) >"$OUT/consistency-exact.log" 2>&1
  say "consistency (bit-exact diagnostic): $(grep -c '^FAIL ' "$OUT/consistency-exact.log") op/device pairs differ in some bit (details in consistency-exact.log)"
}

run_tests() {
  local rc recorded src
  recorded=$(sed -n 's/^build_dir=//p' "$DEPS/MANIFEST" 2>/dev/null)
  src=$(sed -n 's/^built_from=//p' "$DEPS/MANIFEST" 2>/dev/null)
  # CTest files hold the build machine's absolute paths: make them resolve here
  if [ -n "$recorded" ] && [ "$(cd "$recorded" 2>/dev/null && pwd -P)" != "$BUILD" ] && [ -n "$src" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$ROOT" "$src" 2>/dev/null &&
      say "gpu-run: linked $src -> $ROOT for CTest's absolute paths"
  fi
  if [ -n "$recorded" ] && [ "$(cd "$recorded" 2>/dev/null && pwd -P)" = "$BUILD" ] && command -v ctest >/dev/null; then
    ( cd "$BUILD" && timeout "$(tlimit 300)" ctest --output-on-failure --timeout 240 ) >"$OUT/ctest.log" 2>&1
    rc=$?
    grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" "$OUT/ctest.log" | tail -25 >>"$SUMMARY"
  else
    say "gpu-run: ctest unusable here (paths or ctest missing): running the test programs directly"
    rc=0
    for t in "$BUILD"/tests/test_*; do
      [ -x "$t" ] || continue
      local n; n=$(basename "$t")
      ( cd "$BUILD/tests" && timeout "$(tlimit 240)" "$t" ) >"$OUT/test-$n.log" 2>&1
      local r=$?
      say "  $n: $([ $r -eq 0 ] && echo ok || echo "FAIL (rc $r)")"
      [ $r -ne 0 ] && rc=1
    done
  fi
  status tests "$rc"
  [ "$rc" -ne 0 ] && FAILED=1
}

run_bench() {
  mkdir -p "$OUT/bench"
  local b n
  for b in "$BUILD"/bench/bench_*; do
    [ -x "$b" ] || continue
    n=$(basename "$b")
    local args_cpu="" args_gpu=""
    [ "$n" = bench_matmul ] && args_cpu="1024 2048 4096" && args_gpu="1024 2048 4096 8192"
    # shellcheck disable=SC2086
    timeout "$(tlimit 120)" "$b" $args_cpu >"$OUT/bench/$n.cpu.log" 2>&1
    say "bench $n (cpu): rc $?"
    cat "$OUT/bench/$n.cpu.log" >>"$SUMMARY"
    # shellcheck disable=SC2086
    EMBER_DEVICE=cuda:0 timeout "$(tlimit 120)" "$b" $args_gpu >"$OUT/bench/$n.cuda.log" 2>&1
    say "bench $n (EMBER_DEVICE=cuda:0): rc $?"
    cat "$OUT/bench/$n.cuda.log" >>"$SUMMARY"
  done
  status bench 0
}

# GPU anchors side by side: bench_cuda (GEMM vs cuBLAS, add bandwidth vs copy,
# per-op cost, MLP training) and PyTorch eager on the same MLP.
run_gpubench() {
  mkdir -p "$OUT/bench"
  if [ -x "$BUILD/bench/bench_cuda" ]; then
    timeout "$(tlimit 200)" "$BUILD/bench/bench_cuda" >"$OUT/bench/bench_cuda.log" 2>&1
    say "bench_cuda: rc $?"
    cat "$OUT/bench/bench_cuda.log" >>"$SUMMARY"
  fi
  if python3 -c 'import torch' 2>/dev/null; then
    timeout "$(tlimit 120)" python3 "$ROOT/bench/mlp_torch_gpu.py" >"$OUT/bench/mlp_torch_gpu.log" 2>&1
    say "mlp_torch_gpu: rc $?"
    cat "$OUT/bench/mlp_torch_gpu.log" >>"$SUMMARY"
  fi
  status gpubench 0
}

# Vision anchors side by side (issue #14), alternating Ember and PyTorch
# runs (VISION_PAIRS rounds, default 3): the MNIST CNN at batch 64 and 512
# (bench_cnn vs bench/cnn_torch.py eager and CUDA graph), one conv layer
# through Ember vs cuDNN direct (bench_conv_cuda), CIFAR ResNet-18 at batch
# 256 (bench_resnet vs bench/resnet_torch.py).
run_vision() {
  mkdir -p "$OUT/bench"
  local i have_torch=0
  python3 -c 'import torch' 2>/dev/null && have_torch=1
  for i in $(seq 1 "${VISION_PAIRS:-3}"); do
    if [ -x "$BUILD/bench/bench_cnn" ]; then
      timeout "$(tlimit 90)" "$BUILD/bench/bench_cnn" --device cuda:0 --steps 300 --warmup 20 64 512 >>"$OUT/bench/vision.log" 2>&1
    fi
    [ $have_torch = 1 ] && timeout "$(tlimit 120)" python3 "$ROOT/bench/cnn_torch.py" --device cuda --steps 300 --warmup 20 --runs 1 64 512 >>"$OUT/bench/vision.log" 2>&1
    if [ -x "$BUILD/bench/bench_cnn" ]; then # TF32 convolutions, as PyTorch's default (cudnn.allow_tf32)
      EMBER_TF32=1 timeout "$(tlimit 90)" "$BUILD/bench/bench_cnn" --device cuda:0 --steps 300 --warmup 20 64 512 >>"$OUT/bench/vision.log" 2>&1
    fi
    if [ -x "$BUILD/bench/bench_resnet" ]; then
      timeout "$(tlimit 90)" "$BUILD/bench/bench_resnet" --device cuda:0 --steps 20 256 >>"$OUT/bench/vision.log" 2>&1
      EMBER_TF32=1 timeout "$(tlimit 90)" "$BUILD/bench/bench_resnet" --device cuda:0 --steps 20 256 >>"$OUT/bench/vision.log" 2>&1
    fi
    [ $have_torch = 1 ] && timeout "$(tlimit 90)" python3 "$ROOT/bench/resnet_torch.py" --device cuda --steps 20 --runs 1 256 >>"$OUT/bench/vision.log" 2>&1
  done
  [ -x "$BUILD/bench/bench_conv_cuda" ] && timeout "$(tlimit 90)" "$BUILD/bench/bench_conv_cuda" >>"$OUT/bench/vision.log" 2>&1
  grep -E "samples/s|ratio|conv " "$OUT/bench/vision.log" >>"$SUMMARY"
  status vision 0
}

# Where a CNN step's time goes: EMBER_TRACE timelines of bench_cnn at batch
# 512 and 64 on cuda:0, summarised per worker and codelet (scripts/trace-summary.py).
run_cnnprofile() {
  local b
  for b in 512 64; do
    EMBER_TRACE="$WORK/cnn$b.json" timeout "$(tlimit 120)" "$BUILD/bench/bench_cnn" --device cuda:0 --steps 30 --warmup 10 "$b" \
      >"$OUT/cnnprofile-$b.log" 2>&1
    python3 "$ROOT/scripts/trace-summary.py" "$WORK/cnn$b.json" --skip 0.3 >>"$OUT/cnnprofile-$b.log" 2>&1
    cat "$OUT/cnnprofile-$b.log" >>"$SUMMARY"
  done
  status cnnprofile 0
}

# The main job on the GPU: ember train --device cuda:0 on Fashion-MNIST carried in .deps/fashion-mnist
# (EMBER_GPU_MODEL=cnn for the CNN, EMBER_GPU_EPOCHS epochs).
run_precision() {
  mkdir -p "$OUT/bench"
  local i have_torch=0 log="$OUT/bench/precision.log" data="$DEPS/fashion-mnist"
  python3 -c 'import torch' 2>/dev/null && have_torch=1
  [ -x "$BUILD/bench/bench_gemm_half" ] && timeout "$(tlimit 150)" "$BUILD/bench/bench_gemm_half" >>"$log" 2>&1
  say "bench_gemm_half: rc $?"
  for i in $(seq 1 "${PRECISION_PAIRS:-3}"); do
    timeout "$(tlimit 60)" "$BUILD/bench/bench_cuda" mlp >>"$log" 2>&1
    [ $have_torch = 1 ] && timeout "$(tlimit 60)" python3 "$ROOT/bench/mlp_torch_gpu.py" >>"$log" 2>&1
    for p in "" --bf16; do
      # shellcheck disable=SC2086
      timeout "$(tlimit 60)" "$BUILD/bench/bench_cnn" --device cuda:0 --steps 200 --warmup 20 $p 64 512 >>"$log" 2>&1
      # shellcheck disable=SC2086
      [ $have_torch = 1 ] && timeout "$(tlimit 60)" python3 "$ROOT/bench/cnn_torch.py" --device cuda --steps 200 --warmup 20 --runs 1 $p 64 512 >>"$log" 2>&1
    done
  done
  if [ -f "$data/train-images-idx3-ubyte.gz" ]; then
    for p in f32 bf16; do
      ( cd "$WORK" && timeout "$(tlimit 120)" "$BUILD/ember" train --device cuda:0 --data "$data" --no-progress \
          --epochs 3 --precision $p --out "$WORK/run-$p" ) >>"$log" 2>&1
      say "ember train --precision $p (cuda:0): rc $?"
    done
  fi
  grep -E "TFLOP|GB/s|check|samples/s|^epoch|^final|^precision|rc " "$log" >>"$SUMMARY"
  status precision 0
}

# Issue #16 side by side: GPT_PAIRS (default 2) alternating rounds of the
# char-level GPT training step (bench_gpt vs bench/gpt_torch.py eager, f32 and
# bf16), then torch.compile bf16 once, then GPT-2 124M (B=16, T=1024) in f32,
# TF32 and bf16 on both sides (compiled bf16 once).
tp() { [ "$1" = f32 ] && echo fp32 || echo "$1"; } # Ember's precision name -> gpt_torch.py's
run_gpt() {
  mkdir -p "$OUT/bench"
  local i p have_torch=0 log="$OUT/bench/gpt.log"
  python3 -c 'import torch' 2>/dev/null && have_torch=1
  for i in $(seq 1 "${GPT_PAIRS:-2}"); do
    for p in f32 bf16; do
      timeout "$(tlimit 90)" "$BUILD/bench/bench_gpt" --device cuda:0 --config char --steps 30 --precision $p >>"$log" 2>&1
      [ $have_torch = 1 ] && timeout "$(tlimit 90)" python3 "$ROOT/bench/gpt_torch.py" --config char --steps 30 \
          --precision "$(tp "$p")" >>"$log" 2>&1
    done
  done
  [ $have_torch = 1 ] && [ "${GPT_COMPILE:-1}" = 1 ] && timeout "$(tlimit 150)" python3 "$ROOT/bench/gpt_torch.py" --config char --mode compile --steps 50 \
      --warmup 5 --precision bf16 >>"$log" 2>&1
  for p in f32 tf32 bf16; do
    [ "${GPT_124M:-1}" = 1 ] || break
    timeout "$(tlimit 120)" "$BUILD/bench/bench_gpt" --device cuda:0 --config 124m --steps 10 --precision $p >>"$log" 2>&1
    [ $have_torch = 1 ] && timeout "$(tlimit 120)" python3 "$ROOT/bench/gpt_torch.py" --config 124m --steps 10 \
        --precision "$(tp "$p")" >>"$log" 2>&1
  done
  [ $have_torch = 1 ] && [ "${GPT_124M:-1}" = 1 ] && timeout "$(tlimit 150)" python3 "$ROOT/bench/gpt_torch.py" --config 124m --mode compile --steps 10 \
      --warmup 5 --precision bf16 >>"$log" 2>&1
  grep -E "tokens/s|Error|error" "$log" >>"$SUMMARY"
  status gpt 0
}

# Where a GPT step's time goes: an EMBER_TRACE timeline of bench_gpt (char,
# f32, cuda:0), summarised per worker and codelet (scripts/trace-summary.py).
run_gptprofile() {
  EMBER_TRACE="$WORK/gpt.json" timeout "$(tlimit 120)" "$BUILD/bench/bench_gpt" --device cuda:0 --config char --steps 6 --warmup 3 \
    >"$OUT/gptprofile.log" 2>&1
  python3 "$ROOT/scripts/trace-summary.py" "$WORK/gpt.json" --skip 0.4 --top 40 >>"$OUT/gptprofile.log" 2>&1
  cat "$OUT/gptprofile.log" >>"$SUMMARY"
  status gptprofile 0
}

# The language-model main job (issue #16): `ember train --model gpt` with the
# anchor's defaults on the carried Shakespeare corpus (GPT_ITERS, default
# 5000; GPT_PRECISION, default f32), then `ember generate` from its best
# checkpoint on cuda:0 and on the CPU (decode tokens/s with the KV cache).
run_gpttrain() {
  local data="$DEPS/share/ember/shakespeare.txt" prec="${GPT_PRECISION:-f32}"
  if [ ! -f "$data" ]; then
    say "step gpttrain: skipped (no $data: gpu-pack.sh carries it from the installed corpus)"
    return
  fi
  ( cd "$WORK" && timeout "$(tlimit "${GPT_TRAIN_S:-520}")" "$BUILD/ember" train --model gpt --device cuda:0 --precision "$prec" \
      --no-progress --data "$data" --iters "${GPT_ITERS:-5000}" --out "$WORK/gpt" ) >"$OUT/gpttrain.log" 2>&1
  local rc=$?
  say "ember train --model gpt --precision $prec (cuda:0): rc $rc"
  grep -E "^iter|^final|^ember train" "$OUT/gpttrain.log" >>"$SUMMARY"
  if [ -f "$WORK/gpt/best.safetensors" ]; then
    for dev in cuda:0 cpu; do
      timeout "$(tlimit 60)" "$BUILD/ember" generate --checkpoint "$WORK/gpt/best.safetensors" --device "$dev" \
        --prompt $'ROMEO:\n' --max-new-tokens 240 --seed 1337 >"$OUT/generate-$dev.log" 2>&1
      say "ember generate ($dev): rc $?"
      cat "$OUT/generate-$dev.log" >>"$SUMMARY"
    done
  fi
  status gpttrain "$rc"
}

# The attention kernels alone (bench/attention_harness.cu, built by
# scripts/gpu-pack.sh into build-gpu/attn): correctness against a double
# reference and forward+backward times, then torch's SDPA at the same shapes.
run_attention() {
  local d="$BUILD/attn"
  if [ ! -x "$d/attention_harness_v0" ]; then
    say "step attention: skipped (no $d/attention_harness_v0)"
    return
  fi
  timeout "$(tlimit 150)" "$d/attention_harness_v0" --times "$OUT/attn_times.txt" >"$OUT/attention.log" 2>&1
  local rc=$?
  python3 -c 'import torch' 2>/dev/null &&
    timeout "$(tlimit 120)" python3 "$d/attention_torch.py" --ember "v0=$OUT/attn_times.txt" >>"$OUT/attention.log" 2>&1
  grep -E "^FAIL|TOTAL" "$OUT/attention.log" >>"$SUMMARY"
  sed -n '/^Timing/,$p' "$OUT/attention.log" >>"$SUMMARY"
  status attention "$rc"
}

# Serving (issue #18): scripts/serve-bench.sh with an MLP trained here on the
# carried Fashion-MNIST subset: offline batched forward vs the server under
# serve_load, for GPU-only, CPU + GPU and CPU-only instances, alternating the
# order per round (SERVE_ROUNDS, default 2), then a soak run (SOAK_REQUESTS,
# default 200000). EMBER_NCPU=SERVE_NCPU (default 8) CPU workers, leaving
# cores for the HTTP threads and the load generator.
run_serve() {
  local data="$DEPS/fashion-mnist"
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ] || [ ! -x "$BUILD/serve_load" ]; then
    say "step serve: skipped (no $data or no $BUILD/serve_load)"
    return
  fi
  ( cd "$WORK" && timeout "$(tlimit 120)" "$BUILD/ember" train --device cuda:0 --data "$data" --no-progress --epochs 2 \
      --out "$WORK/serve-mlp" ) >"$OUT/serve-train.log" 2>&1
  local rc=$?
  if [ "$rc" != 0 ]; then
    status serve "$rc"
    return
  fi
  EMBER_NCPU="${SERVE_NCPU:-8}" SERVE_LISTS="${SERVE_LISTS:-cuda:0;cpu:1,cuda:0;cpu:1}" SOAK_REQUESTS="${SOAK_REQUESTS:-200000}" \
    timeout "$(tlimit "${SERVE_S:-500}")" bash "$ROOT/scripts/serve-bench.sh" "$BUILD/ember" "$BUILD/serve_load" \
    "$WORK/serve-mlp/checkpoint.safetensors" "$WORK/serve" >"$OUT/serve.log" 2>&1
  rc=$?
  mkdir -p "$OUT/serve"
  cp "$WORK"/serve/*.log "$WORK"/serve/*.txt "$OUT/serve/" 2>/dev/null || true
  grep '^serve-bench:' "$OUT/serve.log" >>"$SUMMARY"
  status serve "$rc"
}

run_train() {
  local data="$DEPS/fashion-mnist"
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    say "step train: skipped (no $data)"
    return
  fi
  ( cd "$WORK" && timeout "$(tlimit 300)" "$BUILD/ember" train --device cuda:0 --data "$data" --no-progress \
      --model "${EMBER_GPU_MODEL:-mlp}" --epochs "${EMBER_GPU_EPOCHS:-10}" --out "$WORK/run-gpu" ) >"$OUT/train-gpu.log" 2>&1
  local rc=$?
  status train "$rc"
  grep -E "^epoch|^final|^ember train" "$OUT/train-gpu.log" >>"$SUMMARY"
}

run_sanitizer() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -z "$cs" ]; then
    say "step sanitizer: skipped (no compute-sanitizer)"
    return
  fi
  ( cd "$BUILD/tests" && EMBER_NCPU=2 timeout "$(tlimit 300)" "$cs" --tool memcheck --leak-check no --print-limit 50 \
      --error-exitcode 9 ./test_consistency ) >"$OUT/sanitizer.log" 2>&1
  local rc=$?
  status sanitizer "$rc"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$OUT/sanitizer.log" | head -20 >>"$SUMMARY"
}

# issue #19: ONNX import on the GPU. $ONNX_DIR (default $ROOT/gpu-onnx) holds
# the models tests/onnx_torch_export.py writes (mlp.onnx, cnn.onnx, x1.npy,
# x64.npy; made on the build machine: the GPU host has no Debian torch) and
# optionally node-tests.tgz (a folder nodetests/ as scripts/onnx_node_tests.py
# writes it, tarred): `ember run` timings on cuda:0 and the CPU workers of
# this host, alternating, and the node-test runner on cuda:0.
run_onnx() {
  local d="${ONNX_DIR:-$ROOT/gpu-onnx}" rc=0 r m b dev
  [ -f "$d/mlp.onnx" ] || { say "step onnx: $d/mlp.onnx missing"; FAILED=1; return; }
  {
    for r in 1 2 3; do
      for m in mlp cnn; do
        for b in 1 64; do
          for dev in cuda:0 cpu; do
            [ $((r % 2)) = 0 ] && dev=$([ "$dev" = cpu ] && echo cuda:0 || echo cpu)
            echo "round $r $m batch $b $dev: $(timeout "$(tlimit 60)" "$BUILD/ember" run "$d/$m.onnx" --input "x=$d/x$b.npy" \
              --repeat 200 --print-limit 0 --device "$dev" 2>&1 | grep -E '^time per run|error|ember run: .*:' | tail -1)"
          done
        done
      done
    done
    # logits on cuda:0 against PyTorch's (torch_<model>_<batch>.npy, when present)
    for m in mlp cnn; do
      for b in 1 64; do
        [ -f "$d/torch_${m}_$b.npy" ] || continue
        "$BUILD/ember" run "$d/$m.onnx" --input "x=$d/x$b.npy" --device cuda:0 --print-limit 0 --output-dir "$WORK/o_${m}_$b" > /dev/null 2>&1
        python3 "$ROOT/tests/onnx_compare.py" "$WORK/o_${m}_$b/logits.npy" "$d/torch_${m}_$b.npy" 1e-5 "$m batch $b: ember cuda:0 vs torch" || rc=1
      done
    done
  } >"$OUT/onnx.log" 2>&1
  if [ -f "$d/node-tests.tgz" ]; then
    mkdir -p "$WORK/nt" && tar xzf "$d/node-tests.tgz" -C "$WORK/nt"
    timeout "$(tlimit 300)" "$BUILD/tests/onnx_node_runner" --device cuda:0 \
      --exceptions "$ROOT/tests/onnx_tolerance_exceptions.txt" --results "$OUT/onnx-node-results-cuda.txt" \
      "$WORK/nt/nodetests" >"$OUT/onnx-node-cuda.log" 2>&1 || rc=$?
    tail -1 "$OUT/onnx-node-cuda.log" >>"$SUMMARY"
  fi
  status onnx "$rc"
  grep -E '^(round|ok|FAIL)' "$OUT/onnx.log" >>"$SUMMARY"
}

for s in $STEPS; do
  if [ "$(left)" -le 15 ]; then
    say "step $s: not run (time budget spent)"
    continue
  fi
  case "$s" in
    env) run_env ;;
    consistency) run_consistency ;;
    tests) run_tests ;;
    bench) run_bench ;;
    gpubench) run_gpubench ;;
    vision) run_vision ;;
    precision) run_precision ;;
    gpt) run_gpt ;;
    gpttrain) run_gpttrain ;;
    attention) run_attention ;;
    gptprofile) run_gptprofile ;;
    cnnprofile) run_cnnprofile ;;
    train) run_train ;;
    serve) run_serve ;;
    onnx) run_onnx ;;
    sanitizer) run_sanitizer ;;
    *) say "gpu-run: unknown step '$s'" ;;
  esac
done
cp -r "$STARPU_HOME/.starpu/sampling" "$OUT/starpu-sampling" 2>/dev/null || true
say "gpu-run: done in $(( $(date +%s) - START ))s, $([ $FAILED -eq 0 ] && echo 'tests and consistency pass' || echo 'FAILURES (see the logs)')"
rm -rf "$WORK"
exit "$FAILED"
