#!/usr/bin/env bash
# ONNX inference speed, Ember against onnxruntime (issue #19): the MLP and
# CNN that tests/onnx_torch_export.py exports from Debian's torch, at batch 1
# and 64, each side timed over REPEAT runs after a warm-up (median, fastest,
# slowest ms per run), the two sides alternating, ROUNDS rounds.
# Usage: scripts/onnx-bench.sh [BUILD] [ROUNDS] [REPEAT] [DEVICE]
#        (default build 3 200 cpu; onnxruntime from BUILD/ort-venv, which
#        ctest's onnx_torch makes)
set -euo pipefail
BUILD="${1:-build}"
ROUNDS="${2:-3}"
REPEAT="${3:-200}"
DEV="${4:-cpu}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1
/usr/bin/python3 "$HERE/tests/onnx_torch_export.py" "$T" > /dev/null 2>&1
ORT="$BUILD/ort-venv/bin/python"
[ -x "$ORT" ] || { echo "onnx-bench: $ORT missing (run ctest -R onnx_torch first)" >&2; exit 1; }
echo "# $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); Ember device $DEV"
for r in $(seq 1 "$ROUNDS"); do
  for model in mlp cnn; do
    for b in 1 64; do
      ember_line() {
        "$BUILD/ember" run "$T/$model.onnx" --input "x=$T/x$b.npy" --repeat "$REPEAT" --print-limit 0 --device "$DEV" \
          | sed -n 's/^time per run over [0-9]* runs: /ember       /p'
      }
      ort_line() {
        "$ORT" - "$T/$model.onnx" "$T/x$b.npy" "$REPEAT" <<'PYEOF'
import sys, time
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = {"x": np.load(sys.argv[2])}
s.run(None, x)
t = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); s.run(None, x); t.append((time.perf_counter() - t0) * 1e3)
t.sort()
print(f"onnxruntime median {t[len(t) // 2]:.3f} ms, fastest {t[0]:.3f} ms, slowest {t[-1]:.3f} ms ({ort.__version__})")
PYEOF
      }
      if [ $((r % 2)) = 1 ]; then e="$(ember_line)"; o="$(ort_line)"; else o="$(ort_line)"; e="$(ember_line)"; fi
      echo "round $r $model batch $b: $e | $o"
    done
  done
done
