#!/usr/bin/env bash
# Data-parallel scaling on the GPU machine: Ember (mpirun, one rank per GPU,
# NCCL gradient all-reduce between GPU buffers) against PyTorch DDP (NCCL),
# same models, same per-GPU batch, for G = 1, 2, 4, 8 GPUs up to what
# `nvidia-smi -L` lists. Runs ON the GPU machine, with the layout of
# scripts/gpu-run.sh: .deps/ (StarPU, libraries, fashion-mnist) and build-gpu/.
#
# Prepare HERE first:   scripts/gpu-pack.sh      (builds build-gpu/, fills .deps/)
# Then on the device:   carry [".deps", "build-gpu"], command:
#                       bash scripts/gpu-scaling.sh
#
# Steps (each run under a timeout; the whole thing within SCALING_BUDGET_S,
# default 550 s; runs that no longer fit are skipped and say so):
#   env      GPUs, the NCCL library Ember will dlopen, PyTorch, and one
#            single-process `ember devices` so StarPU calibrates the bus once
#            (the ranks then share $STARPU_HOME instead of racing to do it)
#   check    tests/test_dist under mpirun -np 2 (and 4) with EMBER_DEVICE=cuda:0:
#            every dist test on the GPUs through the NCCL path (exact means,
#            steps equal to single-process steps, identical replicas)
#   wide     compute-bound MLP 784-4096-4096-4096-10, random data, batch
#            WIDE_BATCH (512) per GPU, WIDE_STEPS (300) timed steps after 20:
#            Ember build-gpu/bench/bench_scaling vs bench/ddp_torch.py --model wide
#   check1p  tests/test_replicas with one replica per GPU in ONE process
#            (EMBER_TEST_REPLICA_PATH=nccl: fails unless NCCL was used)
#   wide1p   the wide MLP with one process driving all G GPUs (bench_scaling --devices)
#   fmnist1p `ember train --devices cuda:0,...` (one process, G GPUs)
#   profile  (not default) nsys kernel traces of a few wide steps, CSV in $OUT/profile
#   fmnist   the `ember train` default MLP 784-256-128-10 on real Fashion-MNIST,
#            batch 64 per GPU, FMNIST_EPOCHS (3) epochs, throughput = mean of
#            epochs 2.. (train part only): `ember train --distributed` vs
#            bench/ddp_torch.py --model fmnist
# SCALING_TORCH=0 skips the PyTorch runs (tuning Ember alone).
# Weak scaling: the per-GPU batch is fixed, the global batch is G x batch.
# Scaling efficiency = samples/s at G / (G x samples/s at 1 GPU), per framework.
#
# Ember ranks: mpirun --bind-to none, STARPU_WORKERS_NOBIND=1 (mpirun's default
# binding for np <= 2 is one core per rank, which would put every StarPU
# thread of a rank on one core), EMBER_NCPU=SCALING_NCPU (2) CPU workers per
# rank (the work is on the GPU), NCCL_NVLS_ENABLE=0 (ENVIRONMENT.md). Each
# rank drives GPU <local rank> (em_dist_init binds it; --device cuda:0).
# PyTorch runs with the machine's own LD_LIBRARY_PATH (not Ember's, which
# puts /usr/local/cuda/lib64 first and could shadow torch's bundled CUDA libs).
#
# Output: $OUT/scaling.txt (the table, one line per model and G, plus which
# all-reduce path Ember used) and $OUT/scaling-logs/ (every run's log).
# $OUT defaults to ./gpu-out. Exit status 0 when every run gave a number.
# SCALING_DEVICE (default cuda:0) only exists to dry-run this script on a
# machine without a GPU (SCALING_DEVICE=cpu, a fake nvidia-smi on PATH).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
OUT="${OUT:-$ROOT/gpu-out}"
LOGS="$OUT/scaling-logs"
mkdir -p "$OUT" "$LOGS"
BUILD="$ROOT/build-gpu"
DEPS="$ROOT/.deps"
DATA="$DEPS/fashion-mnist"
START=$(date +%s)
BUDGET="${SCALING_BUDGET_S:-550}"
RES="$OUT/scaling.txt"
: >"$RES"
say() { echo "$*" | tee -a "$RES"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
tlimit() { local l; l=$(( $(left) - 5 )); [ "$l" -lt 1 ] && l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
fits() { [ "$(left)" -gt "$1" ]; }   # is there at least $1 s left?

WIDE_HIDDEN="${WIDE_HIDDEN:-4096,4096,4096}"
WIDE_BATCH="${WIDE_BATCH:-512}"
WIDE_STEPS="${WIDE_STEPS:-300}"
WIDE_WARMUP="${WIDE_WARMUP:-20}"
FMNIST_BATCH="${FMNIST_BATCH:-64}"
FMNIST_EPOCHS="${FMNIST_EPOCHS:-3}"
DEV="${SCALING_DEVICE:-cuda:0}"
STEPS="${*:-env check check1p wide wide1p fmnist fmnist1p}"

say "gpu-scaling: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), steps: $STEPS, budget ${BUDGET}s, logs in $LOGS"
if [ ! -x "$BUILD/ember" ] || [ ! -d "$DEPS/starpu/lib" ]; then
  say "gpu-scaling: build-gpu/ or .deps/ missing: run scripts/gpu-pack.sh on the build machine and carry both"
  exit 1
fi
[ -x "$BUILD/bench/bench_scaling" ] || say "gpu-scaling: WARNING: build-gpu/bench/bench_scaling missing (rebuild with scripts/gpu-pack.sh)"

# ---- environment (as scripts/gpu-run.sh) ---------------------------------------------
WORK=$(mktemp -d /tmp/ember-scaling.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
. "$ROOT/scripts/gpu-env.sh"
ORIG_LD="$EMBER_ORIG_LD_LIBRARY_PATH"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent
export STARPU_WORKERS_NOBIND=1 STARPU_WORKERS_GETBIND=0
export EMBER_NCPU="${SCALING_NCPU:-2}"
export EMBER_LOG="${EMBER_LOG:-info}"          # the logs then show the NCCL communicator lines
export EMBER_DIST_TIMEOUT="${EMBER_DIST_TIMEOUT:-120}"
export NCCL_NVLS_ENABLE=0
export EMBER_TEST_DATA="$ROOT/tests/fixtures"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
GS=""
for g in 1 2 4 8; do [ "$g" -le "$NGPU" ] && GS="$GS $g"; done
say "gpu-scaling: $NGPU GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs); G in:$GS"
[ "$NGPU" -ge 1 ] || { say "gpu-scaling: no GPU"; exit 1; }

# The NCCL library Ember dlopens (libnccl.so.2 through the loader path, else
# the copy in PyTorch's wheel).
if ! ldconfig -p | grep -q 'libnccl.so.2 ' && ! ls /usr/local/cuda/lib64/libnccl.so.2 >/dev/null 2>&1 &&
   ! ls /usr/local/cuda/targets/x86_64-linux/lib/libnccl.so.2 >/dev/null 2>&1; then
  cand=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
  [ -n "$cand" ] && [ -f "$cand" ] || cand=$(timeout 20 find / -xdev -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$cand" ] && export EMBER_NCCL_LIB="$cand"
fi
say "gpu-scaling: NCCL for Ember: ${EMBER_NCCL_LIB:-$( (ldconfig -p | grep -m1 'libnccl.so.2 ' | sed 's/.*=> //') || true)}${EMBER_NCCL_LIB:+ (EMBER_NCCL_LIB)}"
TORCH_OK=0
if [ "${SCALING_TORCH:-1}" = 0 ]; then
  say "gpu-scaling: PyTorch runs skipped (SCALING_TORCH=0)"
elif LD_LIBRARY_PATH="$ORIG_LD" python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  TORCH_OK=1
  say "gpu-scaling: PyTorch $(LD_LIBRARY_PATH="$ORIG_LD" python3 -c 'import torch; print(torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)"
else
  say "gpu-scaling: PyTorch with CUDA not found: DDP runs skipped"
fi

export EMBER_DIST_BUCKET_KB="${EMBER_DIST_BUCKET_KB:-25600}"   # DDP's default bucket_cap_mb=25
# two StarPU workers (streams) per GPU: ops on the first, NCCL on the second
export STARPU_NWORKER_PER_CUDA="${STARPU_NWORKER_PER_CUDA:-2}"
MPI_X=(-x LD_LIBRARY_PATH -x PATH -x STARPU_HOME -x STARPU_SILENT -x OCL_ICD_VENDORS -x STARPU_WORKERS_NOBIND
       -x STARPU_WORKERS_GETBIND -x EMBER_NCPU -x EMBER_LOG -x EMBER_DIST_TIMEOUT -x NCCL_NVLS_ENABLE -x EMBER_TEST_DATA
       -x EMBER_DIST_BUCKET_KB -x STARPU_NWORKER_PER_CUDA)
[ -n "${EMBER_NCCL_LIB:-}" ] && MPI_X+=(-x EMBER_NCCL_LIB)
# single_copy_mechanism none: containers often forbid the CMA (ptrace) copies
# Open MPI's shared-memory transport uses for large messages (the parameter
# broadcast). SCALING_MPI_ARGS: extra mpirun arguments.
# shellcheck disable=SC2206
MPIRUN=(mpirun --allow-run-as-root --bind-to none --mca btl_vader_single_copy_mechanism none ${SCALING_MPI_ARGS:-} "${MPI_X[@]}")  # + -np G prog args
TORCHRUN=(env LD_LIBRARY_PATH="$ORIG_LD" python3 -m torch.distributed.run --standalone)  # + --nproc_per_node G script args

# results: R[model,fw,G] = samples/s ("" = none); PATHS[model,G] = Ember's all-reduce path
declare -A R PATHS
FAILED=0
result_of() { sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' "$1" | tail -1; }
# mean samples/s of an `ember train` log's epochs 2.. (epoch 1 pays the start-up); epoch rows are
# "epoch N/M", train_loss, train_acc, val_loss, val_acc, val_top5, lr, samples/s, time
epoch_mean() {
  awk '/^epoch [0-9]+\/[0-9]+ / { split($2, e, "/"); v[e[1]] = $9 }
    END { s = 0; n = 0; for (k in v) if (k + 0 >= 2) { s += v[k]; n++ } if (n == 0) for (k in v) { s += v[k]; n++ } if (n) printf "%.1f", s / n }' "$1"
}
ember_path() { # which all-reduce path did Ember's ranks take (from EMBER_LOG=info lines)
  if [ "$2" = 1 ]; then echo "none (1 rank)"
  elif grep -q "NCCL .* communicator of" "$1"; then echo "NCCL"
  elif grep -q "through host memory with MPI" "$1"; then echo "host MPI"
  else echo "host MPI (no NCCL line in the log)"; fi
}

run_env() {
  ( timeout "$(tlimit 120)" "$BUILD/ember" devices ) >"$LOGS/env.log" 2>&1
  say "step env: ember devices rc $? ($(grep -cE 'worker +[0-9]+ +cuda' "$LOGS/env.log") CUDA worker(s)); bus calibrated once in \$STARPU_HOME"
  { nvidia-smi topo -m; mpirun --version; } >>"$LOGS/env.log" 2>&1 || true
  say "step env: $(mpirun --version 2>/dev/null | head -1)"
}

run_check() {
  local g rc
  for g in 2 4; do
    [ "$g" -le "$NGPU" ] || continue
    fits 40 || { say "step check G=$g: not run (time budget)"; continue; }
    EMBER_DEVICE="$DEV" timeout "$(tlimit 150)" "${MPIRUN[@]}" -x EMBER_DEVICE -np "$g" "$BUILD/tests/test_dist" \
      >"$LOGS/check-G$g.log" 2>&1
    rc=$?
    say "step check G=$g: test_dist on $DEV per rank: $([ $rc -eq 0 ] && echo ok || echo "FAIL (rc $rc)"), all-reduce path: $(ember_path "$LOGS/check-G$g.log" "$g")"
    [ $rc -ne 0 ] && FAILED=1
  done
}

run_wide() {
  local g log rc
  for g in $GS; do
    log="$LOGS/wide-ember-G$g.log"
    if fits 30 && [ -x "$BUILD/bench/bench_scaling" ]; then
      timeout "$(tlimit 120)" "${MPIRUN[@]}" -np "$g" "$BUILD/bench/bench_scaling" --device "$DEV" --label wide \
        --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps "$WIDE_STEPS" --warmup "$WIDE_WARMUP" >"$log" 2>&1
      rc=$?
      R[wide,ember,$g]=$(result_of "$log")
      PATHS[wide,$g]=$(ember_path "$log" "$g")
      say "run wide Ember G=$g: rc $rc, ${R[wide,ember,$g]:-no result} samples/s, all-reduce ${PATHS[wide,$g]}$(grep -o 'replicas differ by [^ ]*' "$log" | head -1 | sed 's/^/, /')"
      [ -z "${R[wide,ember,$g]}" ] && FAILED=1
    else
      say "run wide Ember G=$g: not run (time budget or no bench_scaling)"
    fi
    log="$LOGS/wide-torch-G$g.log"
    if [ "$TORCH_OK" = 1 ] && fits 30; then
      timeout "$(tlimit 120)" "${TORCHRUN[@]}" --nproc_per_node "$g" "$ROOT/bench/ddp_torch.py" --model wide \
        --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps "$WIDE_STEPS" --warmup "$WIDE_WARMUP" >"$log" 2>&1
      rc=$?
      R[wide,torch,$g]=$(result_of "$log")
      say "run wide PyTorch DDP G=$g: rc $rc, ${R[wide,torch,$g]:-no result} samples/s"
      [ -z "${R[wide,torch,$g]}" ] && FAILED=1
    elif [ "$TORCH_OK" = 1 ]; then
      say "run wide PyTorch DDP G=$g: not run (time budget)"
    fi
  done
}

run_fmnist() {
  local g log rc
  if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    say "step fmnist: skipped (no $DATA)"
    return
  fi
  for g in $GS; do
    log="$LOGS/fmnist-ember-G$g.log"
    if fits 40; then
      ( cd "$WORK" && timeout "$(tlimit 150)" "${MPIRUN[@]}" -np "$g" \
          "$BUILD/ember" train --distributed --device "$DEV" --data "$DATA" --no-progress --workers 1 \
          --batch-size "$FMNIST_BATCH" --epochs "$FMNIST_EPOCHS" --out "$WORK/fmnist-G$g" ) >"$log" 2>&1
      rc=$?
      R[fmnist,ember,$g]=$(epoch_mean "$log")
      PATHS[fmnist,$g]=$(ember_path "$log" "$g")
      say "run fmnist Ember G=$g: rc $rc, ${R[fmnist,ember,$g]:-no result} samples/s, all-reduce ${PATHS[fmnist,$g]}$(grep -o 'final test accuracy [0-9.]*' "$log" | sed 's/^/, /')"
      [ -z "${R[fmnist,ember,$g]}" ] && FAILED=1
    else
      say "run fmnist Ember G=$g: not run (time budget)"
    fi
    log="$LOGS/fmnist-torch-G$g.log"
    if [ "$TORCH_OK" = 1 ] && fits 30; then
      timeout "$(tlimit 150)" "${TORCHRUN[@]}" --nproc_per_node "$g" "$ROOT/bench/ddp_torch.py" --model fmnist \
        --data "$DATA" --batch "$FMNIST_BATCH" --epochs "$FMNIST_EPOCHS" >"$log" 2>&1
      rc=$?
      R[fmnist,torch,$g]=$(result_of "$log")
      say "run fmnist PyTorch DDP G=$g: rc $rc, ${R[fmnist,torch,$g]:-no result} samples/s"
      [ -z "${R[fmnist,torch,$g]}" ] && FAILED=1
    elif [ "$TORCH_OK" = 1 ]; then
      say "run fmnist PyTorch DDP G=$g: not run (time budget)"
    fi
  done
}

# ---- one process, several GPUs (em_replicas; no mpirun) ---------------------------------
devlist() { local i l="cuda:0"; for ((i = 1; i < $1; i++)); do l="$l,cuda:$i"; done; echo "$l"; }
replica_path() { grep -q "all-reduce nccl\|averaged by nccl" "$1" && echo "NCCL (1 process)" || echo "tasks (1 process)"; }

run_check1p() {
  local g rc
  for g in $GS; do
    [ "$g" -ge 2 ] || continue
    fits 30 || { say "step check1p G=$g: not run (time budget)"; continue; }
    EMBER_TEST_REPLICA_DEVICES=$(devlist "$g") EMBER_TEST_REPLICA_PATH=nccl timeout "$(tlimit 120)" "$BUILD/tests/test_replicas" \
      >"$LOGS/check1p-G$g.log" 2>&1
    rc=$?
    say "step check1p G=$g: test_replicas on $(devlist "$g") (NCCL required): $([ $rc -eq 0 ] && echo ok || echo "FAIL (rc $rc)")"
    [ $rc -ne 0 ] && FAILED=1
  done
}

run_wide1p() {
  local g log rc
  for g in $GS; do
    [ "$g" -ge 2 ] || continue
    log="$LOGS/wide1p-ember-G$g.log"
    if fits 30 && [ -x "$BUILD/bench/bench_scaling" ]; then
      timeout "$(tlimit 120)" "$BUILD/bench/bench_scaling" --devices "$(devlist "$g")" --label wide1p \
        --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps "$WIDE_STEPS" --warmup "$WIDE_WARMUP" >"$log" 2>&1
      rc=$?
      R[wide1p,ember,$g]=$(result_of "$log")
      PATHS[wide1p,$g]=$(replica_path "$log")
      say "run wide1p Ember G=$g (one process): rc $rc, ${R[wide1p,ember,$g]:-no result} samples/s, ${PATHS[wide1p,$g]}$(grep -o 'replicas differ by [^ ]*' "$log" | head -1 | sed 's/^/, /')"
      [ -z "${R[wide1p,ember,$g]}" ] && FAILED=1
    else
      say "run wide1p Ember G=$g: not run (time budget or no bench_scaling)"
    fi
  done
}

run_fmnist1p() {
  local g log rc
  [ -f "$DATA/train-images-idx3-ubyte.gz" ] || { say "step fmnist1p: skipped (no $DATA)"; return; }
  for g in $GS; do
    [ "$g" -ge 2 ] || continue
    log="$LOGS/fmnist1p-ember-G$g.log"
    if fits 40; then
      ( cd "$WORK" && timeout "$(tlimit 150)" "$BUILD/ember" train --devices "$(devlist "$g")" --data "$DATA" --no-progress \
          --workers 1 --batch-size "$FMNIST_BATCH" --epochs "$FMNIST_EPOCHS" --out "$WORK/fmnist1p-G$g" ) >"$log" 2>&1
      rc=$?
      R[fmnist1p,ember,$g]=$(epoch_mean "$log")
      PATHS[fmnist1p,$g]=$(replica_path "$log")
      say "run fmnist1p Ember G=$g (one process): rc $rc, ${R[fmnist1p,ember,$g]:-no result} samples/s, ${PATHS[fmnist1p,$g]}$(grep -o 'final test accuracy [0-9.]*' "$log" | sed 's/^/, /')"
      [ -z "${R[fmnist1p,ember,$g]}" ] && FAILED=1
    else
      say "run fmnist1p Ember G=$g: not run (time budget)"
    fi
  done
}

# nsys timelines of a few wide steps at the largest G (both forms), kernel
# traces as CSV for offline analysis; skipped without nsys.
run_profile() {
  local g=${NGPU} nsys
  [ "$g" -ge 2 ] || return
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$nsys" ] || { say "step profile: no nsys"; return; }
  fits 90 || { say "step profile: not run (time budget)"; return; }
  mkdir -p "$OUT/profile"
  timeout "$(tlimit 90)" "$nsys" profile -t cuda,nvtx -o "$OUT/profile/wide1p-G$g" -f true \
    "$BUILD/bench/bench_scaling" --devices "$(devlist "$g")" --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps 30 --warmup 10 \
    >"$LOGS/profile-wide1p.log" 2>&1
  "$nsys" stats -q --report cuda_gpu_trace --format csv -o "$OUT/profile/wide1p-G$g" "$OUT/profile/wide1p-G$g.nsys-rep" >>"$LOGS/profile-wide1p.log" 2>&1
  timeout "$(tlimit 90)" "$nsys" profile -t cuda,nvtx -o "$OUT/profile/wide-ember1-G1" -f true \
    "$BUILD/bench/bench_scaling" --device cuda:0 --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps 30 --warmup 10 \
    >"$LOGS/profile-wide1.log" 2>&1
  "$nsys" stats -q --report cuda_gpu_trace --format csv -o "$OUT/profile/wide-ember1-G1" "$OUT/profile/wide-ember1-G1.nsys-rep" >>"$LOGS/profile-wide1.log" 2>&1
  if [ "$TORCH_OK" = 1 ]; then
    timeout "$(tlimit 90)" env LD_LIBRARY_PATH="$ORIG_LD" "$nsys" profile -t cuda,nvtx -o "$OUT/profile/wide-torch-G$g" -f true \
      python3 -m torch.distributed.run --standalone --nproc_per_node "$g" "$ROOT/bench/ddp_torch.py" --model wide \
      --hidden "$WIDE_HIDDEN" --batch "$WIDE_BATCH" --steps 30 --warmup 10 >"$LOGS/profile-torch.log" 2>&1
    "$nsys" stats -q --report cuda_gpu_trace --format csv -o "$OUT/profile/wide-torch-G$g" "$OUT/profile/wide-torch-G$g.nsys-rep" >>"$LOGS/profile-torch.log" 2>&1
  fi
  rm -f "$OUT"/profile/*.nsys-rep "$OUT"/profile/*.sqlite
  gzip -f "$OUT"/profile/*.csv 2>/dev/null
  say "step profile: $(ls "$OUT/profile" | xargs)"
}

for s in $STEPS; do
  case "$s" in
    env) run_env ;;
    check) run_check ;;
    check1p) run_check1p ;;
    wide) run_wide ;;
    wide1p) run_wide1p ;;
    fmnist) run_fmnist ;;
    fmnist1p) run_fmnist1p ;;
    profile) run_profile ;;
    *) say "gpu-scaling: unknown step '$s'" ;;
  esac
done

# ---- the table --------------------------------------------------------------------------
eff() { # samples/s at G, samples/s at 1, G -> efficiency
  [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" -v g="$3" 'BEGIN { if (b > 0) printf "%.2f", a / (g * b); else printf "-" }' || printf -- "-"
}
{
  echo
  echo "Data-parallel scaling (weak: fixed per-GPU batch), samples/s over all GPUs; eff = samples/s at G / (G x samples/s at 1)"
  echo "wide   = MLP 784-${WIDE_HIDDEN//,/-}-10, random data, batch $WIDE_BATCH per GPU, Adam, $WIDE_STEPS timed steps"
  echo "fmnist = MLP 784-256-128-10 (ember train default), Fashion-MNIST, batch $FMNIST_BATCH per GPU, Adam, mean of epochs 2..$FMNIST_EPOCHS"
  printf "%-7s %3s %14s %6s %14s %6s %12s  %s\n" model G "Ember" eff "PyTorch DDP" eff "Ember/PyT" "Ember all-reduce"
  for m in wide wide1p fmnist fmnist1p; do
    b=${m%1p}  # one-process rows: efficiency against the same 1-GPU run, PyTorch DDP from the multi-process rows
    R[$m,ember,1]=${R[$m,ember,1]:-${R[$b,ember,1]:-}}
    for g in $GS; do
      [ "$m" != "$b" ] && R[$m,torch,$g]=${R[$b,torch,$g]:-}
      e="${R[$m,ember,$g]:-}"; t="${R[$m,torch,$g]:-}"
      [ -z "$e$t" ] && continue
      ratio=$( [ -n "$e" ] && [ -n "$t" ] && awk -v a="$e" -v b="$t" 'BEGIN { printf "%.2f", a / b }' || echo -)
      printf "%-7s %3s %14s %6s %14s %6s %12s  %s\n" "$m" "$g" "${e:--}" "$(eff "$e" "${R[$m,ember,1]:-}" "$g")" \
        "${t:--}" "$(eff "$t" "${R[$m,torch,1]:-}" "$g")" "$ratio" "${PATHS[$m,$g]:-}"
    done
  done
  echo
  echo "gpu-scaling: done in $(( $(date +%s) - START ))s, $([ $FAILED -eq 0 ] && echo 'every run gave a result' || echo 'SOME RUNS FAILED (see scaling-logs/)')"
} | tee -a "$RES"
cp -r "$STARPU_HOME/.starpu/sampling" "$LOGS/starpu-sampling" 2>/dev/null || true
exit "$FAILED"
