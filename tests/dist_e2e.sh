#!/usr/bin/env bash
# End-to-end checks of `mpirun -np 2 ember train` (issue #7, DESIGN.md §7):
#   1. a 2-rank run completes, only rank 0 prints and writes --out, and its
#      test accuracy is close to a single-process run with the same global
#      batch (both printed);
#   2. ranks started with different settings stop at once with a clear
#      "configuration mismatch" error on every rank and a non-zero exit;
#   3. a rank killed mid-training ends the job within bounded time;
#   4. a hung rank (SIGSTOP) makes the other abort through the collective
#      watchdog (EMBER_DIST_TIMEOUT) within bounded time, with a message.
# Usage: dist_e2e.sh path/to/ember [path/to/mpirun]
set -euo pipefail
EMBER="$1"
MPIRUN="${2:-mpirun}"
T="$(mktemp -d)"
JOB=""
cleanup() {
  # only what this script started: the mpirun job and its ranks
  if [ -n "$JOB" ]; then
    for p in $(pgrep -P "$JOB" 2>/dev/null || true); do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
    kill -KILL "$JOB" 2>/dev/null || true
  fi
  rm -rf "$T"
}
trap cleanup EXIT
export STARPU_SILENT=1 OCL_ICD_VENDORS=/nonexistent
MPI=("$MPIRUN" -np 2 --allow-run-as-root --oversubscribe -x STARPU_NCPU=1 -x STARPU_WORKERS_GETBIND=1
     -x STARPU_SILENT=1 -x OCL_ICD_VENDORS -x EMBER_DIST_TIMEOUT)
export EMBER_DIST_TIMEOUT=60
common=(--hidden 32 --seed 3 --no-progress --workers 1)
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

# ---- 1. two ranks vs one process, same global batch (128) --------------------
t0=$(now)
"$EMBER" train "${common[@]}" --epochs 2 --batch-size 128 --out "$T/single" > "$T/single.log"
t1=$(now)
timeout 300 "${MPI[@]}" "$EMBER" train "${common[@]}" --epochs 2 --global-batch 128 --out "$T/dist" > "$T/dist.log" 2> "$T/dist.err" \
  || fail "2-rank training failed: $(tail -5 "$T/dist.err")"
t2=$(now)
acc1=$(awk '/^final test accuracy/ {print $4}' "$T/single.log")
acc2=$(awk '/^final test accuracy/ {print $4}' "$T/dist.log")
[ -n "$acc2" ] || fail "no final accuracy from the 2-rank run: $(cat "$T/dist.log")"
[ "$(grep -c '^final test accuracy' "$T/dist.log")" = 1 ] || fail "more than one rank printed the summary"
[ "$(grep -c '^epoch 2/2' "$T/dist.log")" = 1 ] || fail "epoch lines printed by several ranks"
grep -q "distributed: 2 ranks, batch 64 per rank = global batch 128" "$T/dist.log" || fail "no distributed banner"
[ -f "$T/dist/checkpoint.safetensors" ] && [ "$(wc -l < "$T/dist/metrics.csv")" = 3 ] || fail "rank 0 did not write checkpoint + metrics once per epoch"
# epoch rows: "epoch 2/2", train_loss, train_acc, val_loss, val_acc, val_top5, lr, samples/s, time
sps1=$(awk '/^epoch 2\/2/ {print $9}' "$T/single.log")
sps2=$(awk '/^epoch 2\/2/ {print $9}' "$T/dist.log")
printf "single process: test accuracy %s, %s samples/s (%.1fs wall)\n" "$acc1" "$sps1" "$(sub "$t1" "$t0")"
printf "2 MPI ranks:    test accuracy %s, %s samples/s (%.1fs wall)\n" "$acc2" "$sps2" "$(sub "$t2" "$t1")"
awk -v a="$acc1" -v b="$acc2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' \
  || fail "2-rank accuracy $acc2 is not within 0.01 of the single-process $acc1"
# the checkpoint is an ordinary one: eval reproduces the accuracy
acc_eval=$("$EMBER" eval --checkpoint "$T/dist/checkpoint.safetensors" | awk '/^test loss/ {print $5}')
[ "$acc_eval" = "$acc2" ] || fail "eval of the 2-rank checkpoint gives $acc_eval, training printed $acc2"
echo "ok: 2-rank training matches the single process; rank 0 alone prints and writes"

# ---- 2. configuration mismatch ---------------------------------------------------
t0=$(now)
if timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -x STARPU_NCPU=1 -x STARPU_WORKERS_GETBIND=1 -x STARPU_SILENT=1 \
     -np 1 "$EMBER" train "${common[@]}" --epochs 1 --out "$T/mm" : \
     -np 1 "$EMBER" train --hidden 16 --seed 3 --no-progress --epochs 1 --out "$T/mm" > "$T/mm.log" 2>&1; then
  fail "ranks with different models trained together"
fi
dt=$(sub "$(now)" "$t0")
grep -q "rank 0: configuration mismatch across ranks: rank 1 runs a different model" "$T/mm.log" || fail "no mismatch message on rank 0: $(cat "$T/mm.log")"
grep -q "rank 1: configuration mismatch" "$T/mm.log" || fail "no mismatch message on rank 1"
grep "rank 0: configuration mismatch" "$T/mm.log" | head -1
[ ! -e "$T/mm/checkpoint.safetensors" ] || fail "a mismatched run wrote a checkpoint"
printf "ok: configuration mismatch reported by every rank, exit non-zero after %.1fs\n" "$dt"

# ---- 3./4. failures end the job in bounded time --------------------------------
# Starts a long 2-rank run in the background, waits for training, then applies
# signal $1 to one rank; the job must end non-zero within $2 seconds
# (watchdog EMBER_DIST_TIMEOUT=$4).
fail_run() {
  local sig="$1" limit="$2" tag="$3" wd="$4"
  EMBER_DIST_TIMEOUT="$wd" "${MPI[@]}" "$EMBER" train "${common[@]}" --epochs 50 --batch-size 64 --out "$T/$tag" > "$T/$tag.log" 2>&1 &
  JOB=$!
  for _ in $(seq 1 300); do [ -f "$T/$tag/metrics.csv" ] && break; sleep 0.1; done
  [ -f "$T/$tag/metrics.csv" ] || fail "$tag: training did not start: $(tail -5 "$T/$tag.log")"
  local victim
  victim=$(pgrep -P "$JOB" | tail -1)
  [ -n "$victim" ] || fail "$tag: no rank process found under mpirun"
  local t0 rc=0
  t0=$(now)
  kill "-$sig" "$victim"
  # wait at most limit + 10 s (then it is a failure)
  for _ in $(seq 1 $(( (limit + 10) * 10 ))); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$JOB" 2>/dev/null; then fail "$tag: the job still runs $((limit + 10)) s after SIG$sig of one rank"; fi
  wait "$JOB" || rc=$?
  JOB=""
  local dt
  dt=$(sub "$(now)" "$t0")
  [ "$rc" != 0 ] || fail "$tag: the job exited 0 after SIG$sig of one rank"
  awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d <= l) }' || fail "$tag: the job took ${dt}s to end (limit ${limit}s)"
  # a stopped rank only sees mpirun's SIGTERM once continued
  [ "$sig" = STOP ] && kill -CONT "$victim" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$victim" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$victim" 2>/dev/null && { kill -KILL "$victim"; fail "$tag: the signalled rank survived the job"; }
  printf "ok: SIG%s of one rank ends the job in %.1fs (exit %d)\n" "$sig" "$dt" "$rc"
}

fail_run KILL 30 killed 60
grep -q "exited on signal 9" "$T/killed.log" || fail "mpirun did not report the killed rank: $(tail -5 "$T/killed.log")"
grep "exited on signal 9" "$T/killed.log" | head -1

fail_run STOP 30 hung 5
grep -q "did not complete within 5 s" "$T/hung.log" || fail "no watchdog message: $(tail -5 "$T/hung.log")"
grep "did not complete within" "$T/hung.log" | head -1
echo "4 passed, 0 failed"
