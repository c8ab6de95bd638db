# Sourced by scripts/gpu-run.sh and scripts/gpu-scaling.sh on the GPU machine:
# library paths for the carried build. Needs DEPS, BUILD and WORK set; sets
# LD_LIBRARY_PATH, PATH, STARPU_HOME (one bus calibration per run),
# EMBER_DATA_DIR (the carried Fashion-MNIST) and EMBER_ORIG_LD_LIBRARY_PATH
# (the image's own path, for PyTorch).
EMBER_ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
FB="$WORK/fallback"
mkdir -p "$FB"
# fallback libraries only where the image has no library of that soname
ldconfig -p >"$WORK/ldcache" 2>/dev/null || true
for f in "$DEPS"/fallback/*; do
  [ -e "$f" ] || continue
  so=$(basename "$f")
  if ! grep -q "^[[:space:]]*$so " "$WORK/ldcache" && ! ls /usr/local/cuda/lib64/"$so" >/dev/null 2>&1; then
    ln -s "$f" "$FB/$so"
  fi
done
CUDA_LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && CUDA_LIBS="$CUDA_LIBS:$d"; done
export LD_LIBRARY_PATH="$BUILD:$DEPS/starpu/lib:$DEPS/lib:$FB$CUDA_LIBS${EMBER_ORIG_LD_LIBRARY_PATH:+:$EMBER_ORIG_LD_LIBRARY_PATH}"
export PATH="$DEPS/starpu/bin:/usr/local/cuda/bin:$PATH"
export STARPU_HOME="$WORK/starpu-home"
mkdir -p "$STARPU_HOME"
# the image lacks Debian's dataset package: ember and the e2e tests read the carried copy
if [ -f "$DEPS/fashion-mnist/train-images-idx3-ubyte.gz" ]; then export EMBER_DATA_DIR="$DEPS/fashion-mnist"; fi
