#!/usr/bin/env bash
# PyTorch-exported models through ONNX (issue #19): Debian's python3-torch
# exports an MLP and a CNN (tests/onnx_torch_export.py); `ember run` runs
# them at batch 1 and 64 and its logits must equal PyTorch's within 1e-5, and
# onnxruntime's (PyPI, in the venv BUILD/ort-venv) within 1e-5.
# Exit 77 (skipped) when Debian's torch is missing; the onnxruntime half is
# skipped, saying so, only when PyPI cannot be reached.
# Usage: onnx_torch.sh path/to/ember BUILD_DIR     ($TORCH_PYTHON: default /usr/bin/python3)
set -euo pipefail
EMBER="$1"
BUILD="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
TPY="${TORCH_PYTHON:-/usr/bin/python3}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
if ! "$TPY" -c 'import torch, numpy' 2> /dev/null; then
  echo "SKIPPED: $TPY cannot import torch and numpy (Debian: apt-get install python3-torch python3-numpy)" >&2
  exit 77
fi
"$TPY" "$HERE/onnx_torch_export.py" "$T" 2>&1 | grep -v Warning
fail=0
for model in mlp cnn; do
  for b in 1 64; do
    o="$T/out_${model}_$b"
    mkdir -p "$o"
    "$EMBER" run "$T/$model.onnx" --input "x=$T/x$b.npy" --output-dir "$o" --print-limit 0 > "$o/log.txt" 2>&1 \
      || { cat "$o/log.txt"; echo "FAIL: ember run $model.onnx at batch $b"; fail=1; continue; }
    "$TPY" "$HERE/onnx_compare.py" "$o/logits.npy" "$T/torch_${model}_$b.npy" 1e-5 "$model batch $b: ember vs torch" || fail=1
  done
done
# ember convert: the ONNX initializers under their names, equal to torch's state_dict
"$EMBER" convert "$T/mlp.onnx" "$T/mlp.safetensors" | tee "$T/convert.txt"
grep -F "mlp.onnx -> $T/mlp.safetensors: 4 tensors, 814120 bytes" "$T/convert.txt" > /dev/null || { echo "FAIL: ember convert mlp.onnx"; fail=1; }
"$TPY" - "$T/mlp.safetensors" <<'PYEOF' || fail=1
import json, struct, sys
import numpy as np
import torch
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).state_dict()
for k, v in ref.items():
    e = h[k]
    got = np.frombuffer(b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]], np.float32).reshape(e["shape"])
    if not np.array_equal(got, v.numpy()):
        print("FAIL ember convert: %s differs from torch's state_dict" % k)
        sys.exit(1)
print("ok ember convert mlp.onnx: keys %s equal torch's state_dict bit for bit" % sorted(ref))
PYEOF
# onnxruntime
VENV="$BUILD/ort-venv"
STAMP="$VENV/.ember-ort-ok"
if [ ! -f "$STAMP" ]; then
  python3 -m venv --clear "$VENV"
  if timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 30 onnxruntime numpy > "$T/pip.log" 2>&1; then
    touch "$STAMP"
  else
    cat "$T/pip.log" >&2
  fi
fi
if [ -f "$STAMP" ]; then
  for model in mlp cnn; do
    for b in 1 64; do
      [ -f "$T/out_${model}_$b/logits.npy" ] || continue
      "$VENV/bin/python" - "$T/$model.onnx" "$T/x$b.npy" "$T/ort_${model}_$b.npy" <<'PYEOF'
import sys
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
np.save(sys.argv[3], s.run(None, {"x": np.load(sys.argv[2])})[0])
PYEOF
      "$VENV/bin/python" "$HERE/onnx_compare.py" "$T/out_${model}_$b/logits.npy" "$T/ort_${model}_$b.npy" 1e-5 "$model batch $b: ember vs onnxruntime $("$VENV/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)')" || fail=1
    done
  done
else
  echo "onnxruntime comparison SKIPPED: pip could not install onnxruntime (is PyPI reachable?)"
fi
[ "$fail" = 0 ] && echo "onnx_torch: all checks passed" || { echo "onnx_torch: FAILED"; exit 1; }
