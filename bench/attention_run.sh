#!/bin/bash
# One device call: every built harness variant in build-attn/ (correctness
# + timing), then torch's SDPA at the same shapes, side by side. Expects the
# binaries and scripts in build-attn/ (bench/attention_build.sh; carried);
# logs go to $OUT.
set -u
D=build-attn
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
EM=()
for bin in "$D"/attention_harness_*; do
    [ -x "$bin" ] || continue
    v=${bin##*_}
    "$bin" --times "$OUT/ember_times_$v.txt" > "$OUT/harness_$v.log" 2>&1
    echo "harness rc=$?" >> "$OUT/harness_$v.log"
    echo "== variant $v"
    grep -E "^FAIL|TOTAL|rc=" "$OUT/harness_$v.log"
    EM+=(--ember "$v=$OUT/ember_times_$v.txt")
done
sed -n '/^Timing/,$p' "$OUT/harness_v0.log"
python3 "$D/attention_torch.py" "${EM[@]}" > "$OUT/torch.log" 2>&1
echo "torch rc=$?" >> "$OUT/torch.log"
cat "$OUT/torch.log"
