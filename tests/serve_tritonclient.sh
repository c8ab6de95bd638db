#!/usr/bin/env bash
# `ember serve` with Triton's Python client (issue #18, item 5): makes a venv
# BUILD_DIR/serve-venv with tritonclient[http] from PyPI (once; a finished venv
# is marked and reused), then runs tests/serve_tritonclient.py against a server
# on loopback. Exit 77 (skipped by ctest) when PyPI cannot be reached; a venv
# that cannot be made (python3-venv missing) or a failing pip with PyPI
# reachable is a failure.
# Usage: serve_tritonclient.sh path/to/ember BUILD_DIR      ($PYTHON: default python3)
set -euo pipefail
EMBER="$1"
BUILD="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
VENV="$BUILD/serve-venv"
STAMP="$VENV/.ember-tritonclient-ok"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1

if [ ! -f "$STAMP" ] || ! "$VENV/bin/python" -c 'import tritonclient.http, numpy' 2> /dev/null; then
  "$PY" -m venv --clear "$VENV" || { echo "FAIL: '$PY -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  if ! timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 30 'tritonclient[http]' > "$T/pip.log" 2>&1; then
    cat "$T/pip.log" >&2
    # PyPI (or $PIP_INDEX_URL) unreachable: skip; reachable: a real failure
    if ! "$PY" - "${PIP_INDEX_URL:-https://pypi.org/simple/}" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/tritonclient/", timeout=20).read(1)
except Exception as e:
    print("serve_tritonclient: %s unreachable: %s" % (sys.argv[1], e), file=sys.stderr)
    sys.exit(1)
EOF
    then
      echo "SKIPPED: cannot install tritonclient[http]: the package index is unreachable" >&2
      exit 77
    fi
    echo "FAIL: pip install 'tritonclient[http]' failed with the index reachable" >&2
    exit 1
  fi
  "$VENV/bin/python" -c 'import tritonclient.http, numpy' || { echo "FAIL: tritonclient installed but not importable" >&2; exit 1; }
  touch "$STAMP"
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("tritonclient", m.version("tritonclient"), "numpy", m.version("numpy"))'
"$VENV/bin/python" "$HERE/serve_tritonclient.py" "$EMBER" "$T"
