#!/usr/bin/env bash
# Before/after on the GPU machine: the per-op rows of bench_cuda and
# bench_overhead (EMBER_DEVICE=cuda:0) of two builds, alternating the sides,
# with medians and ranges. Prepare HERE: scripts/gpu-pack.sh for the new
# build (build-gpu/), and the old build's libember.so* and bench/ copied into
# build-gpu-base/ (a Release CUDA build of the old commit, e.g. made by
# gpu-pack.sh in a worktree of it). Carry .deps, build-gpu, build-gpu-base.
#
#   bash scripts/gpu-ab-builds.sh [rounds]          (default 4)
# Output: $OUT/ab-builds.txt (and the raw logs under $OUT/ab/).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
OUT="${OUT:-$ROOT/gpu-out}"
R="${1:-4}"
mkdir -p "$OUT/ab"
DEPS="$ROOT/.deps"
WORK=$(mktemp -d /tmp/ember-ab.XXXXXX)
BUILD="$ROOT/build-gpu"
. "$ROOT/scripts/gpu-env.sh"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent
BASE_LD="$ROOT/build-gpu-base:${LD_LIBRARY_PATH#"$BUILD":}"
NEW_LD="$LD_LIBRARY_PATH"
run() { # side build
  local side=$1 b=$2 ld
  [ "$side" = A ] && ld="$BASE_LD" || ld="$NEW_LD"
  LD_LIBRARY_PATH="$ld" EMBER_DEVICE=cuda:0 timeout 120 "$b/bench/bench_overhead" 20000 >"$OUT/ab/ovh.$side.$i.log" 2>&1
  LD_LIBRARY_PATH="$ld" timeout 150 "$b/bench/bench_cuda" 2048 >"$OUT/ab/cuda.$side.$i.log" 2>&1
  awk -v s="$side" '$1 == 1 || $1 == 16 { print s, "ovh" $1, $3 }' "$OUT/ab/ovh.$side.$i.log" >>"$OUT/ab/rows"
  grep -o "per-op cost.*: [0-9.]* us/op" "$OUT/ab/cuda.$side.$i.log" | awk -v s="$side" '{ print s, "perop", $(NF-1) }' >>"$OUT/ab/rows"
  grep -o "batch [0-9]*: Ember [0-9]* samples/s" "$OUT/ab/cuda.$side.$i.log" | awk -v s="$side" '{ sub(":", "", $2); print s, "mlp" $2, $4 }' >>"$OUT/ab/rows"
}
: >"$OUT/ab/rows"
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) = 1 ]; then run A "$ROOT/build-gpu-base"; run B "$BUILD"; else run B "$BUILD"; run A "$ROOT/build-gpu-base"; fi
done
python3 - "$OUT/ab/rows" "$R" >"$OUT/ab-builds.txt" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
print(f"A = build-gpu-base (before), B = build-gpu (after); {sys.argv[2]} rounds alternating; median [min, max]")
names = {"ovh1": "bench_overhead cuda:0, numel 1, total us/op", "ovh16": "bench_overhead cuda:0, numel 16, total us/op",
         "perop": "bench_cuda per-op cost, us/op", "mlp64": "bench_cuda MLP batch 64, samples/s", "mlp512": "bench_cuda MLP batch 512, samples/s"}
for key, label in names.items():
    out = [label]
    for side in "AB":
        v = [float(r[2]) for r in rows if r[0] == side and r[1] == key]
        out.append(f"{side}: {st.median(v):.1f} [{min(v):.1f}, {max(v):.1f}] (n={len(v)})" if v else f"{side}: -")
    print(" | ".join(out))
PY
cat "$OUT/ab-builds.txt"
