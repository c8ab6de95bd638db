#!/usr/bin/env bash
# Configures, builds and runs Ember's whole test suite (CTest + cmocka).
# Usage: scripts/test.sh [build-dir]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
PREFIX="${EMBER_DEPS_PREFIX:-/opt/ember-deps}"
if [ ! -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ]; then
  echo "test.sh: StarPU 1.4 not found in $PREFIX: run scripts/install-deps.sh first" >&2
  exit 1
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_DEPS_PREFIX="$PREFIX" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
cd "$BUILD"
ctest --output-on-failure --timeout 900
