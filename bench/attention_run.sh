#!/bin/bash
# One device call: the attention harness (correctness + timing), then torch's
# SDPA at the same shapes, side by side. Expects the built harness and the
# scripts in build-attn/ (carried); logs go to $OUT.
set -u
D=build-attn
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
"./$D/attention_harness" --times "$OUT/ember_times.txt" "$@" > "$OUT/harness.log" 2>&1
echo "harness rc=$?" >> "$OUT/harness.log"
grep -E "^FAIL|FAIL|TOTAL|rc=|error" "$OUT/harness.log"
sed -n '/^Timing/,$p' "$OUT/harness.log"
python3 "$D/attention_torch.py" --ember "$OUT/ember_times.txt" > "$OUT/torch.log" 2>&1
echo "torch rc=$?" >> "$OUT/torch.log"
cat "$OUT/torch.log"
