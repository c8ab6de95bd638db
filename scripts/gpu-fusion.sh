#!/usr/bin/env bash
# On the GPU machine, from the checkout the device tool copies (run scripts/gpu-pack.sh there first;
# carry [".deps", "build-gpu"]; drop .deps/fashion-mnist if the carry is over 64 MiB): the fusion
# tests (the FUSED and STEP cases and the fused chains on cuda:0, test_fusion on cuda:0), bench_fusion on
# cuda:0 and the CPU, the MLP step against PyTorch eager and CUDA graph (3 alternating rounds), and
# `ember train` on cuda:0 with capture on and off; logs and summary.txt under $OUT.
set -uo pipefail
ROOT=$(pwd -P); BUILD=$ROOT/build-gpu; DEPS=$ROOT/.deps; WORK=$(mktemp -d /tmp/ember-gpu.XXXXXX)
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent EMBER_TEST_DATA="$ROOT/tests/fixtures"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S="$OUT/summary.txt"
PARTS="${*:-tests bench pairs train gpt profile}"   # split over calls: each device call may run 600 s at most
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi -L >"$S" 2>&1
echo "parts: $PARTS" >>"$S"
cd "$BUILD/tests"
run() { local name=$1 t=$2; shift 2; local st=$(date +%s); ( timeout "$t" "$@" ) >"$OUT/$name.log" 2>&1; echo "$name: rc $? ($(( $(date +%s) - st )) s)" >>"$S"; }
has tests && run cons_fused_case 200 env EMBER_CONSISTENCY_OPS=fused,step,gelu,add,mul,tanh,matmul,adam_step EMBER_CONSISTENCY_REQUIRE=cuda ./test_consistency
has tests && run cons_chains 200 env EMBER_FUSION=1 EMBER_CONSISTENCY_FUSED=1 EMBER_CONSISTENCY_REQUIRE=cuda ./test_consistency
has tests && run test_fusion_cuda 100 env EMBER_DEVICE=cuda:0 ./test_fusion
cd "$BUILD/bench"
has bench && run bench_fusion_cuda 150 ./bench_fusion --device cuda:0
has bench && run bench_fusion_cpu 100 ./bench_fusion --device cpu --rounds 3
# the MLP step side by side: Ember eager / fused / captured (bench_fusion) and PyTorch eager /
# whole-step CUDA graph (bench/mlp_torch_gpu.py graph), alternating, 3 rounds, batch 64 and 512; the
# MNIST CNN at batch 64: bench_cnn eager and --capture, bench/cnn_torch.py eager and CUDA graph
: >"$OUT/mlp_pairs.log"
has pairs && for r in 1 2 3; do
  for b in 64 512; do
    echo "== round $r batch $b ember" >>"$OUT/mlp_pairs.log"
    timeout 90 ./bench_fusion --device cuda:0 --mlp-only --batch $b --rounds 3 --steps 200 >>"$OUT/mlp_pairs.log" 2>&1
  done
  echo "== round $r torch" >>"$OUT/mlp_pairs.log"
  timeout 120 python3 "$ROOT/bench/mlp_torch_gpu.py" graph >>"$OUT/mlp_pairs.log" 2>&1
  echo "== round $r cnn" >>"$OUT/mlp_pairs.log"
  timeout 60 ./bench_cnn --device cuda:0 --steps 200 --warmup 10 64 >>"$OUT/mlp_pairs.log" 2>&1
  timeout 60 ./bench_cnn --device cuda:0 --steps 200 --warmup 10 --capture 64 >>"$OUT/mlp_pairs.log" 2>&1
  timeout 90 python3 "$ROOT/bench/cnn_torch.py" --device cuda --steps 300 --warmup 20 --runs 1 64 >>"$OUT/mlp_pairs.log" 2>&1
done
has pairs && echo "mlp_pairs: done" >>"$S"
# the char-level GPT's training step with fusion off and on (bench_gpt; the step is not captured:
# its attention dropout cannot be replayed), 2 alternating rounds, and PyTorch eager once
if has gpt; then
  : >"$OUT/gpt.log"
  for r in 1 2; do
    for p in f32 bf16; do
      for f in 0 1; do
        echo "== round $r $p EMBER_FUSION=$f" >>"$OUT/gpt.log"
        EMBER_FUSION=$f timeout 90 ./bench_gpt --device cuda:0 --config char --steps 30 --precision $p >>"$OUT/gpt.log" 2>&1
      done
    done
  done
  timeout 90 python3 "$ROOT/bench/gpt_torch.py" --config char --steps 30 --precision fp32 >>"$OUT/gpt.log" 2>&1
  echo "gpt: done" >>"$S"
fi
# where a captured step's GPU time goes: EMBER_STEP_PROFILE=1 (each recorded task timed with events)
if has profile; then
  EMBER_STEP_PROFILE=1 timeout 60 ./bench_fusion --device cuda:0 --mlp-only --rounds 1 --steps 100 >"$OUT/profile.log" 2>&1
  EMBER_STEP_PROFILE=1 timeout 60 ./bench_cnn --device cuda:0 --steps 50 --warmup 5 --capture 64 >>"$OUT/profile.log" 2>&1
  echo "profile: done" >>"$S"
fi
# the Learner on cuda:0 with capture on and off (the carried Fashion-MNIST subset)
if has train && [ -n "${EMBER_DATA_DIR:-}" ]; then
  for c in 1 0 1 0; do
    run "train_capture$c" 120 env EMBER_CAPTURE=$c EMBER_LOG=debug "$BUILD/ember" train --device cuda:0 --epochs 2 --no-progress --out "$WORK/t$c"
    grep -E "captured|eagerly|^epoch|final" "$OUT/train_capture$c.log" >>"$S"
  done
fi
for f in cons_fused_case cons_chains test_fusion_cuda; do [ -f "$OUT/$f.log" ] || continue; echo "== $f" >>"$S"; grep -E "^op |^fused|^gelu|^add |^mul |^tanh|FAIL|chains|worst|variants|PASSED|FAILED|fusion:|CUDA:" "$OUT/$f.log" | head -40 >>"$S"; done
for f in bench_fusion_cuda bench_fusion_cpu mlp_pairs gpt profile; do [ -s "$OUT/$f.log" ] || continue; echo "== $f" >>"$S"; cat "$OUT/$f.log" >>"$S"; done
cat "$S"
