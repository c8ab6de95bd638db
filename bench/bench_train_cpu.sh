#!/usr/bin/env bash
# CPU training benchmark: `ember train` against the same training in PyTorch
# (bench/train_mlp_torch.py: MLP 784-256-128-10, Adam lr 1e-3, cosine LR,
# batch 64, cross-entropy, Fashion-MNIST, evaluation on the test set after
# each epoch, as ember train does).
#
# Usage: bench/bench_train_cpu.sh [EPOCHS] [THREADS]      (from the repo root)
#   EPOCHS   epochs of each run (default 2)
#   THREADS  PyTorch threads (torch.set_num_threads); default: the number of
#            CPU workers Ember reports (EMBER_NCPU, if set, picks Ember's)
# Environment: EMBER (default build/ember), PYTHON (default /usr/bin/python3),
#   DATA (default /usr/share/datasets/fashion-mnist), KEEP=1 keeps the logs.
#
# PyTorch runs twice: as installed (Debian's torch calls OpenBLAS, whose own
# thread pool then competes with torch's OpenMP threads) and with
# OPENBLAS_NUM_THREADS=1 (BLAS single-threaded inside torch's threads, which is
# also how Ember runs OpenBLAS in each of its workers).
#
# Prints each run's per-epoch times and the ratios PyTorch time / Ember time
# (>= 1 means Ember is faster), for the whole epoch (training + evaluation)
# and for the training pass alone.
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS="${1:-2}"
THREADS="${2:-}"
EMBER="${EMBER:-build/ember}"
PYTHON="${PYTHON:-/usr/bin/python3}"
DATA="${DATA:-/usr/share/datasets/fashion-mnist}"
T="$(mktemp -d /tmp/ember-bench-train.XXXXXX)"
if [ "${KEEP:-0}" = 1 ]; then echo "logs in $T"; else trap 'rm -rf "$T"' EXIT; fi
[ -x "$EMBER" ] || { echo "no $EMBER: build first (cmake --build build)" >&2; exit 1; }

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- Ember ----
echo "== ember: $EMBER train --epochs $EPOCHS --no-progress --data $DATA --out $T/ember-run"
STARPU_SILENT=1 "$EMBER" train --epochs "$EPOCHS" --no-progress --data "$DATA" --out "$T/ember-run" > "$T/ember.log"
grep -E '^(ember train:|epoch |final)' "$T/ember.log"
workers=$(sed -n 's/.* \([0-9][0-9]*\) CPU workers.*/\1/p' "$T/ember.log" | head -1)
THREADS="${THREADS:-$workers}"
# epoch lines: "... <lr> <S> <T>s" (the epoch table: samples/s, then the epoch time); training
# time = 60000 / S (samples/s covers the training pass only, the epoch time includes evaluation)
ember_epoch=$(awk '/^epoch /{print $(NF)}' "$T/ember.log" | tr -d s | tr '\n' ' ')
ember_sps=$(awk '/^epoch /{print $(NF-1)}' "$T/ember.log" | tr '\n' ' ')
ntrain=$(sed -n 's/^data: .*(\([0-9]*\) train.*/\1/p' "$T/ember.log")

# ---- PyTorch ----
run_torch() { # tag, env...
    local tag="$1"
    shift
    echo "== torch ($tag): $PYTHON bench/train_mlp_torch.py --epochs $EPOCHS --threads $THREADS"
    env "$@" "$PYTHON" bench/train_mlp_torch.py --epochs "$EPOCHS" --threads "$THREADS" --data "$DATA" > "$T/torch-$tag.log"
    cat "$T/torch-$tag.log"
}
run_torch default
run_torch blas1 OPENBLAS_NUM_THREADS=1

mean() { awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF}'; }
em_mean=$(echo "$ember_epoch" | mean)
em_train=$(echo "$ember_sps" | awk -v n="$ntrain" '{s = 0; for (i = 1; i <= NF; i++) s += n / $i; printf "%.3f", s / NF}')
echo
echo "== summary ($EPOCHS epochs; Ember $workers CPU workers, PyTorch $THREADS threads)"
tv=$("$PYTHON" -c 'import torch; print(torch.__version__)')
fmt='%-40s %-16s %9s %10s %12s %12s\n'
printf "$fmt" run "epoch times (s)" "mean (s)" "train (s)" "ratio epoch" "ratio train"
printf "$fmt" "ember ($workers CPU workers)" "$ember_epoch" "$em_mean" "$em_train" "1" "1"
for tag in default blas1; do
    times=$(awk '/^epoch /{print $NF}' "$T/torch-$tag.log" | tr -d s | tr '\n' ' ')
    train=$(awk '/^epoch /{print $(NF-2)}' "$T/torch-$tag.log" | tr -d s | tr '\n' ' ')
    tm=$(echo "$times" | mean)
    trm=$(echo "$train" | mean)
    if [ "$tag" = blas1 ]; then name="torch $tv, OPENBLAS_NUM_THREADS=1"; else name="torch $tv, as installed"; fi
    printf "$fmt" "$name" "$times" "$tm" "$trm" \
        "$(awk -v a="$tm" -v b="$em_mean" 'BEGIN{printf "%.2f", a / b}')" \
        "$(awk -v a="$trm" -v b="$em_train" 'BEGIN{printf "%.2f", a / b}')"
done
echo "(ratio = PyTorch time / Ember time: >= 1 means Ember is faster)"
