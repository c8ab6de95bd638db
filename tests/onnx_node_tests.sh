#!/usr/bin/env bash
# The ONNX backend node tests (issue #19): makes a venv BUILD_DIR/onnx-venv
# with onnx 1.23 from PyPI (once; marked and reused), writes the 1 884 node
# tests to BUILD_DIR/onnx-node-tests (once per onnx version), and runs
# onnx_node_runner on the CPU with --min-pass from tests/onnx_node_pass_count.
# The per-test results go to BUILD_DIR/onnx-node-results.txt
# (scripts/onnx-conformance-doc.sh turns them into docs/onnx-conformance.md).
# Exit 77 (skipped) when PyPI cannot be reached.
# Usage: onnx_node_tests.sh path/to/onnx_node_runner BUILD_DIR [DEVICE]
#        (DEVICE: cpu by default; $PYTHON: default python3). Two runs at once
#        (ctest -j) share the venv and the cases under a lock.
set -euo pipefail
RUNNER="$1"
BUILD="$2"
DEV="${3:-cpu}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
ONNX_VERSION=1.23.0
VENV="$BUILD/onnx-venv"
STAMP="$VENV/.ember-onnx-$ONNX_VERSION"
CASES="$BUILD/onnx-node-tests"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT

exec 9> "$BUILD/.onnx-node-tests.lock"
flock 9
if [ ! -f "$STAMP" ] || ! "$VENV/bin/python" -c 'import onnx, numpy' 2> /dev/null; then
  "$PY" -m venv --clear "$VENV" || { echo "FAIL: '$PY -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  if ! timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 30 "onnx==$ONNX_VERSION" numpy > "$T/pip.log" 2>&1; then
    cat "$T/pip.log" >&2
    if ! "$PY" - "${PIP_INDEX_URL:-https://pypi.org/simple/}" <<'PYEOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/onnx/", timeout=20).read(1)
except Exception as e:
    print("onnx_node_tests: %s unreachable: %s" % (sys.argv[1], e), file=sys.stderr)
    sys.exit(1)
PYEOF
    then
      echo "SKIPPED: cannot install onnx $ONNX_VERSION: the package index is unreachable" >&2
      exit 77
    fi
    echo "FAIL: pip install onnx==$ONNX_VERSION failed with the index reachable" >&2
    exit 1
  fi
  touch "$STAMP"
fi
if [ ! -f "$CASES/.ember-onnx-$ONNX_VERSION" ]; then
  rm -rf "$CASES"
  "$VENV/bin/python" "$HERE/../scripts/onnx_node_tests.py" "$CASES"
  touch "$CASES/.ember-onnx-$ONNX_VERSION"
fi
flock -u 9
MIN="$(tr -dc '0-9' < "$HERE/onnx_node_pass_count")"
RES="$BUILD/onnx-node-results.txt"
[ "$DEV" = cpu ] || RES="$BUILD/onnx-node-results-${DEV%%:*}.txt"
"$RUNNER" --device "$DEV" --min-pass "$MIN" --exceptions "$HERE/onnx_tolerance_exceptions.txt" --results "$RES" "$CASES" > "$T/out.txt" || rc=$?
grep -v '^PASS ' "$T/out.txt" | sed -n '1,400p' || true
tail -n 1 "$T/out.txt"
exit "${rc:-0}"
