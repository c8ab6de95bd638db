#!/usr/bin/env bash
# A/B timing of the wide-MLP data-parallel benchmark on the GPU machine under
# several environment variants, in one lease (runs differ by several percent
# between leases, much less within one). Layout as scripts/gpu-scaling.sh
# (carry .deps and build-gpu after scripts/gpu-pack.sh).
#   AB_VARIANTS="base: fence0:EMBER_DIST_FENCE=0 ctas8:NCCL_MAX_CTAS=8"
#   AB_FORMS="1gpu mpirun2 1p2"   AB_REPEAT=2   AB_STEPS=300
# Prints one line per run: variant form samples/s.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
BUILD="$ROOT/build-gpu"
DEPS="$ROOT/.deps"
WORK=$(mktemp -d /tmp/ember-ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent STARPU_WORKERS_NOBIND=1 EMBER_NCPU="${EMBER_NCPU:-2}" NCCL_NVLS_ENABLE=0
export STARPU_NWORKER_PER_CUDA="${STARPU_NWORKER_PER_CUDA:-2}"
"$BUILD/ember" devices >/dev/null 2>&1   # bus calibration once
args=(--hidden "${AB_HIDDEN:-4096,4096,4096}" --batch "${AB_BATCH:-512}" --steps "${AB_STEPS:-300}" --warmup 20 --label ab)
for rep in $(seq "${AB_REPEAT:-2}"); do
  for v in ${AB_VARIANTS:-base:}; do
    name=${v%%:*}; envs=${v#*:}
    envargs=(); xargs=()
    IFS=',' read -ra kv <<<"$envs"
    for e in "${kv[@]}"; do [ -n "$e" ] && envargs+=("$e") && xargs+=(-x "${e%%=*}"); done
    for form in ${AB_FORMS:-1gpu mpirun2 1p2}; do
      case $form in
        1gpu) cmd=("$BUILD/bench/bench_scaling" --device cuda:0) ;;
        mpirun2) cmd=(mpirun --allow-run-as-root --bind-to none --mca btl_vader_single_copy_mechanism none
                      -x LD_LIBRARY_PATH -x PATH -x STARPU_HOME -x STARPU_SILENT -x OCL_ICD_VENDORS -x STARPU_WORKERS_NOBIND
                      -x EMBER_NCPU -x NCCL_NVLS_ENABLE -x STARPU_NWORKER_PER_CUDA "${xargs[@]}" -np 2
                      "$BUILD/bench/bench_scaling" --device cuda:0) ;;
        1p2) cmd=("$BUILD/bench/bench_scaling" --devices cuda:0,cuda:1) ;;
      esac
      r=$(env "${envargs[@]}" timeout 120 "${cmd[@]}" "${args[@]}" 2>&1 | grep RESULT | head -1 | grep -o 'samples_per_s=[0-9.]*' | cut -d= -f2)
      printf '%-10s %-8s %s\n' "$name" "$form" "${r:-FAILED}"
    done
  done
done
