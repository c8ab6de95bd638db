#!/usr/bin/env bash
# Builds the libFuzzer targets of the IDX, SafeTensors, ONNX and PyTorch (.pt) readers and of the
# inference server's request decoder (serve/protocol.c) with
# clang (-fsanitize=fuzzer,address,undefined) and runs each for a short time.
# Usage: scripts/fuzz.sh [seconds-per-target] [build-dir]   (default 30, build)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-30}"
BUILD="${2:-build}"
CC_FUZZ="${CC_FUZZ:-clang}"
command -v "$CC_FUZZ" >/dev/null || { echo "fuzz.sh: $CC_FUZZ not found (scripts/install-deps.sh installs clang)" >&2; exit 1; }
[ -f "$BUILD/libember.so" ] || { echo "fuzz.sh: build Ember first ($BUILD/libember.so missing)" >&2; exit 1; }
OUT="$BUILD/fuzz"
mkdir -p "$OUT"
PREFIX="${EMBER_DEPS_PREFIX:-/opt/ember-deps}"
STARPU_CFLAGS=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags starpu-1.4)
FLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -Iinclude -I. $STARPU_CFLAGS)
# The readers and the error functions are compiled in (libember hides its
# internal symbols); the rest comes from libember.
"$CC_FUZZ" "${FLAGS[@]}" tests/fuzz/fuzz_idx.c data/idx.c runtime/error.c \
  -L"$BUILD" -Wl,-rpath,"$PWD/$BUILD" -lember -lz -o "$OUT/fuzz_idx"
"$CC_FUZZ" "${FLAGS[@]}" tests/fuzz/fuzz_safetensors.c store/safetensors.c runtime/error.c \
  -L"$BUILD" -Wl,-rpath,"$PWD/$BUILD" -lember -ljansson -o "$OUT/fuzz_safetensors"
# The ONNX reader: its sources (store/onnx*.c, the protoc-c output) compiled in.
"$CC_FUZZ" "${FLAGS[@]}" -I"$BUILD/generated" tests/fuzz/fuzz_onnx.c store/onnx*.c "$BUILD/generated/onnx.pb-c.c" runtime/error.c \
  -L"$BUILD" -Wl,-rpath,"$PWD/$BUILD" -lember -lprotobuf-c -o "$OUT/fuzz_onnx"
# Seeds: the node tests' small models, when ctest's onnx_node_tests wrote them.
mkdir -p "$OUT/corpus_fuzz_onnx"
if [ -d "$BUILD/onnx-node-tests" ]; then
  find "$BUILD/onnx-node-tests" -name model.onnx -size -4k | sort | awk 'NR % 8 == 1' | while read -r f; do
    cp "$f" "$OUT/corpus_fuzz_onnx/$(basename "$(dirname "$f")").onnx"
  done
fi
# (undefined behaviour in the .pt reader stops the run, as a crash does)
"$CC_FUZZ" "${FLAGS[@]}" -fno-sanitize-recover=undefined tests/fuzz/fuzz_pt.c store/pt.c runtime/error.c \
  -L"$BUILD" -Wl,-rpath,"$PWD/$BUILD" -lember -lz -o "$OUT/fuzz_pt"
# The request decoder needs no libember: its source and jansson only.
"$CC_FUZZ" -g -O1 -fsanitize=fuzzer,address,undefined -std=gnu11 -Iinclude -I. tests/fuzz/fuzz_serve_request.c serve/protocol.c \
  -ljansson -o "$OUT/fuzz_serve_request"
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent ASAN_OPTIONS=detect_leaks=0
for t in fuzz_idx fuzz_safetensors fuzz_onnx fuzz_pt fuzz_serve_request; do
  mkdir -p "$OUT/corpus_$t"
  # the PyTorch reader starts from the fixtures written by torch (small, valid files)
  [ "$t" = fuzz_pt ] && cp tests/fixtures/pt_*.pt "$OUT/corpus_$t"/
  echo "fuzz.sh: running $t for ${SECS}s"
  # leaks are checked where no StarPU runs (the request decoder: its source and jansson only)
  leaks=0
  [ "$t" = fuzz_serve_request ] && leaks=1
  [ "$t" = fuzz_pt ] && leaks=1 # the .pt reader starts no StarPU either
  # a .pt input slower than 10 s is a bug (a walk or gather the limits should have stopped)
  slow=()
  [ "$t" = fuzz_pt ] && slow=(-timeout=10)
  # fuzz_onnx runs graphs whose shapes come from the input: a huge
  # allocation must come back as NULL (EM_ERR_NOMEM), as it does without ASan
  ASAN_OPTIONS="detect_leaks=$leaks:allocator_may_return_null=1" "$OUT/$t" -max_total_time="$SECS" -max_len=4096 "${slow[@]}" -print_final_stats=1 "$OUT/corpus_$t" 2>"$OUT/$t.log" \
    || { tail -n 40 "$OUT/$t.log"; echo "fuzz.sh: $t found a crash" >&2; exit 1; }
  grep -E "stat::number_of_executed_units" "$OUT/$t.log" || true
done
echo "fuzz.sh: no crash in ${SECS}s per target"
