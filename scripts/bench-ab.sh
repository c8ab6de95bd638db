#!/usr/bin/env bash
# A/B of bench_overhead (per-op cost of a chain of tiny em_add) between two
# builds, alternating the sides, with medians and ranges of the total
# microseconds per op. Run on an otherwise idle machine.
#
#   scripts/bench-ab.sh BUILD_A BUILD_B [rounds]     (default 7 rounds)
#
# Each round runs A then B (odd rounds) or B then A (even rounds); the CPU
# runs use OCL_ICD_VENDORS=/nonexistent (no OpenCL worker). Extra
# environment (EMBER_DEVICE=cuda:0, ...) passes through.
set -euo pipefail
A="$1"; B="$2"; R="${3:-7}"
export STARPU_SILENT=1
: "${OCL_ICD_VENDORS:=/nonexistent}"; export OCL_ICD_VENDORS
TMP=$(mktemp -d)
run() { "$1/bench/bench_overhead" 2>/dev/null | awk -v side="$2" '$1 == 1 || $1 == 16 { print side, $1, $2, $3 }' >>"$TMP/rows"; }
for i in $(seq 1 "$R"); do
  if [ $((i % 2)) = 1 ]; then run "$A" A; run "$B" B; else run "$B" B; run "$A" A; fi
done
python3 - "$TMP/rows" "$A" "$B" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
print(f"bench_overhead, {len(rows)//4} rounds alternating; A = {sys.argv[2]}, B = {sys.argv[3]}")
print(f"{'side':>4} {'numel':>5} {'submit_us/op median [range]':>30} {'total_us/op median [range]':>30}")
for n in ("1", "16"):
    for side in ("A", "B"):
        s = [float(r[2]) for r in rows if r[0] == side and r[1] == n]
        t = [float(r[3]) for r in rows if r[0] == side and r[1] == n]
        print(f"{side:>4} {n:>5} {st.median(s):>12.2f} [{min(s):.2f}, {max(s):.2f}] {st.median(t):>16.2f} [{min(t):.2f}, {max(t):.2f}]")
PY
rm -rf "$TMP"
