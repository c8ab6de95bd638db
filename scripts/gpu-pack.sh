#!/usr/bin/env bash
# Prepares a GPU run: builds Ember (Release, CUDA kernels on) into build-gpu/
# and fills .deps/ with what the GPU machine's image lacks, so that the device
# tool can carry `.deps` and `build-gpu` next to the working tree and
# scripts/gpu-run.sh can run everything there. Run it HERE (the machine with
# the CUDA toolkit and /opt/ember-deps), not on the GPU machine.
#
#   scripts/gpu-pack.sh            build + pack
#   scripts/gpu-pack.sh --no-build pack an existing build-gpu/
#
# .deps/ layout:
#   .deps/starpu/      StarPU's installed prefix (from $EMBER_DEPS_PREFIX,
#                      default /opt/ember-deps) without static archives and
#                      libtool files, shared libraries stripped of debug info
#   .deps/lib/         libraries the image lacks for sure (hwloc, jansson,
#                      cmocka): always first in LD_LIBRARY_PATH
#   .deps/fallback/    other non-system libraries Ember's binaries load
#                      (OpenCL loader, OpenBLAS when it fits, gfortran, ...):
#                      gpu-run.sh uses each one only when the image has no
#                      library of that soname
#   .deps/MANIFEST     what was packed, the build path, the sizes
# Never packed: glibc, libstdc++/libgcc_s, CUDA libraries (the image has CUDA
# 13), Open MPI (the image has 4.1.6).
#
# The carry limit is 64 MiB for the working tree plus the carried folders;
# the script prints the total and fails when it is over.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PREFIX="${EMBER_DEPS_PREFIX:-/opt/ember-deps}"
BUILD="$ROOT/build-gpu"
DEPS="$ROOT/.deps"
LIMIT_MIB=64
DO_BUILD=1
[ "${1:-}" = "--no-build" ] && DO_BUILD=0

if [ ! -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ]; then
  echo "gpu-pack: StarPU 1.4 not found in $PREFIX (run scripts/install-deps.sh first)" >&2
  exit 1
fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu-pack: nvcc not found (CUDA toolkit at /usr/local/cuda?)" >&2; exit 1; }

# ---- 1. build ---------------------------------------------------------------
if [ "$DO_BUILD" = 1 ]; then
  echo "gpu-pack: building Ember (Release, CUDA sm_90 + PTX) into $BUILD"
  # H200 = sm_90; the PTX copy lets newer GPUs JIT the kernels.
  # EMBER_CUDA_ARCHS=90-real leaves the PTX out: the tests that link the
  # library's objects (test_core, test_consistency, test_faults) each carry
  # the kernels, and with the PTX the pack can exceed the carry limit.
  # oneDNN (CPU convolutions) is left out: libdnnl.so.2 alone is 40 MB, more
  # than the carry limit leaves; the GPU machine's CPU convs use im2col.
  # cairo (the training plots) is left out too: with its X11/font libraries
  # it adds 5 MiB to the fallback libraries; e2e_plot is skipped there (77).
  # EMBER_TEST_EXPORTS: the white-box tests link libember.so (which then
  # exports their few internals) instead of a 6 MB copy of the objects each;
  # check_symbols and install_package are not built there (CI runs them).
  mkdir -p "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEMBER_DEPS_PREFIX="$PREFIX" \
    -DEMBER_CUDA=ON -DEMBER_OPENCL=ON "-DCMAKE_CUDA_ARCHITECTURES=${EMBER_CUDA_ARCHS:-90-real;90-virtual}" \
    -DEMBER_DNNL=OFF -DEMBER_CAIRO=OFF -DEMBER_TEST_EXPORTS=ON -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON >"$BUILD/configure.log" 2>&1 ||
    { tail -30 "$BUILD/configure.log"; exit 1; }
  grep -q "CUDA kernels ON" "$BUILD/configure.log" ||
    { echo "gpu-pack: CMake did not enable the CUDA kernels:"; grep "Ember:" "$BUILD/configure.log"; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)"
fi
[ -f "$BUILD/libember.so" ] || { echo "gpu-pack: $BUILD/libember.so missing (build first)" >&2; exit 1; }
# the standalone attention harness (gpu-run.sh step attention)
if [ "${1:-}" != --no-build ] && command -v nvcc >/dev/null; then
  OUTD="$BUILD/attn" STARPU_INC="$PREFIX/include/starpu/1.4" bash "$ROOT/bench/attention_build.sh" >"$BUILD/attn-build.log" 2>&1 ||
    { tail -20 "$BUILD/attn-build.log"; exit 1; }
  rm -f "$BUILD"/attn/*.o
fi
# the GPU machine needs binaries and CTest files, not object files
find "$BUILD" -name '*.o' -delete
find "$BUILD" -name '*.o.d' -delete
# nor CMake's compiler-identification leftovers (about 10 MiB with CUDA)
rm -rf "$BUILD"/CMakeFiles/CheckCUDA "$BUILD"/CMakeFiles/[0-9]*/CompilerId*

# ---- 2. StarPU prefix ----------------------------------------------------------
rm -rf "$DEPS"
mkdir -p "$DEPS/starpu" "$DEPS/lib" "$DEPS/fallback"
cp -a "$PREFIX/." "$DEPS/starpu/"
find "$DEPS/starpu" \( -name '*.a' -o -name '*.la' \) -delete
find "$DEPS/starpu/lib" -name '*.so*' -type f -exec strip --strip-debug {} \;

# ---- 3. shared libraries the binaries need ------------------------------------------
# Classified by soname: "skip" = provided by the GPU image (system, CUDA, MPI);
# "must" = known absent there; everything else goes to fallback/.
classify() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libutil.so*) echo skip ;;
    libstdc++.so*|libgcc_s.so*) echo skip ;;
    libcuda.so*|libcudart.so*|libcublas*.so*|libcusolver*.so*|libcusparse*.so*|libnvJitLink.so*|libnvrtc*.so*|libcufft*.so*|libcurand*.so*|libcudnn*.so*|libnccl*.so*|libnvidia*.so*) echo skip ;;
    libmpi*.so*|libopen-pal.so*|libopen-rte.so*|libopen-orted*.so*|libpmix.so*|libevent*.so*) echo skip ;;
    libstarpu*.so*) echo skip ;;   # in .deps/starpu/lib
    libember.so*) echo skip ;;     # in build-gpu/
    libhwloc.so*|libjansson.so*|libcmocka.so*) echo must ;;
    *) echo fallback ;;
  esac
}
ELFS=$(find "$BUILD" -maxdepth 3 -type f \( -name 'libember.so*' -o -perm -u+x \) ! -name '*.sh' ! -path '*/CMakeFiles/*' 2>/dev/null)
ELFS="$ELFS $(find "$DEPS/starpu/lib" -name '*.so.*' -type f) $DEPS/starpu/bin/starpu_machine_display"
declare -A SEEN
for elf in $ELFS; do
  file -b "$elf" 2>/dev/null | grep -q ELF || continue
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ -f "$path" ] || continue
    [ -n "${SEEN[$soname]:-}" ] && continue
    SEEN[$soname]=1
    kind=$(classify "$soname")
    case "$kind" in
      must) cp -L "$path" "$DEPS/lib/$soname" ;;
      fallback) cp -L "$path" "$DEPS/fallback/$soname" ;;
    esac
  done < <(LD_LIBRARY_PATH="$BUILD:$PREFIX/lib" ldd "$elf" 2>/dev/null)
done
chmod u+w "$DEPS"/lib/* "$DEPS"/fallback/* 2>/dev/null || true
strip --strip-debug "$DEPS"/lib/* "$DEPS"/fallback/* 2>/dev/null || true

# ---- 4. size check --------------------------------------------------------------------
# Fashion-MNIST for the GPU training run (the GPU image lacks the Debian package).
# EMBER_PACK_FMNIST_TRAIN=N carries only the first N training images (and
# labels), to fit the carry limit: the e2e tests compare runs with each other,
# they need no particular accuracy; the scaling benchmarks want the full set.
if [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p "$DEPS/fashion-mnist"
  if [ -n "${EMBER_PACK_FMNIST_TRAIN:-}" ]; then
    cp -u /usr/share/datasets/fashion-mnist/t10k-*.gz "$DEPS/fashion-mnist/"
    python3 - /usr/share/datasets/fashion-mnist "$DEPS/fashion-mnist" "$EMBER_PACK_FMNIST_TRAIN" <<'PY'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, item in (("train-images-idx3-ubyte.gz", 28 * 28), ("train-labels-idx1-ubyte.gz", 1)):
    data = gzip.open(f"{src}/{name}").read()
    ndim = data[3]
    head = bytearray(data[:4 + 4 * ndim])
    struct.pack_into(">I", head, 4, n)  # the first dim is the count
    with gzip.open(f"{dst}/{name}", "wb") as f:
        f.write(bytes(head) + data[4 + 4 * ndim:4 + 4 * ndim + n * item])
PY
    echo "gpu-pack: Fashion-MNIST training set cut to its first $EMBER_PACK_FMNIST_TRAIN samples (EMBER_PACK_FMNIST_TRAIN)"
  else
    cp -u /usr/share/datasets/fashion-mnist/*.gz "$DEPS/fashion-mnist/"
  fi
fi
# The Shakespeare corpus (5 MB) for the language-model run (gpu-run.sh step gpttrain).
if [ -f "$PREFIX/share/ember/shakespeare.txt" ]; then
  mkdir -p "$DEPS/share/ember"
  cp -u "$PREFIX/share/ember/shakespeare.txt" "$DEPS/share/ember/"
fi
mib() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
# working tree that travels: tracked + untracked-not-ignored files
TREE_KIB=$(git -C "$ROOT" ls-files -co --exclude-standard -z | xargs -0 du -skL 2>/dev/null | awk '{s += $1} END {print s + 0}')
TREE_MIB=$(( (TREE_KIB + 1023) / 1024 ))
total() { echo $(( TREE_MIB + $(mib "$DEPS") + $(mib "$BUILD") )); }
TOTAL=$(total)
if [ "$TOTAL" -gt "$LIMIT_MIB" ] && [ -f "$DEPS/fallback/libopenblas.so.0" ]; then
  echo "gpu-pack: ${TOTAL} MiB is over the limit: dropping the OpenBLAS fallback (the image has OpenBLAS)"
  rm -f "$DEPS/fallback/libopenblas.so.0"
  TOTAL=$(total)
fi
if [ "$TOTAL" -gt "$LIMIT_MIB" ]; then
  echo "gpu-pack: ${TOTAL} MiB is still over: dropping OpenBLAS's runtime libraries (gfortran, quadmath, gomp) from the fallback"
  rm -f "$DEPS"/fallback/libgfortran.so.* "$DEPS"/fallback/libquadmath.so.* "$DEPS"/fallback/libgomp.so.*
  TOTAL=$(total)
fi

{
  echo "built_from=$ROOT"
  echo "build_dir=$BUILD"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo none)"
  echo "starpu_prefix=$PREFIX"
  echo "lib: $(cd "$DEPS/lib" && ls | tr '\n' ' ')"
  echo "fallback: $(cd "$DEPS/fallback" && ls | tr '\n' ' ')"
  echo "size_mib: tree=$TREE_MIB deps=$(mib "$DEPS") build=$(mib "$BUILD") total=$TOTAL limit=$LIMIT_MIB"
} >"$DEPS/MANIFEST"
cat "$DEPS/MANIFEST"
du -sh "$DEPS/starpu" "$DEPS/lib" "$DEPS/fallback" "$BUILD"
if [ "$TOTAL" -gt "$LIMIT_MIB" ]; then
  echo "gpu-pack: FAIL: ${TOTAL} MiB > ${LIMIT_MIB} MiB carry limit" >&2
  exit 1
fi
echo "gpu-pack: ok, ${TOTAL} MiB of ${LIMIT_MIB} MiB. Carry [\".deps\", \"build-gpu\"] and run: bash scripts/gpu-run.sh"
