#!/usr/bin/env bash
# End-to-end checks of run folders and Ctrl-C in `ember train` (issue #20,
# items 1 and 5): a second run with no --out goes to runs/fashion-mnist-2; an
# explicit --out holding a run is refused (exit 2, every file byte-identical)
# and --overwrite replaces it; SIGINT mid-run exits 130 with the resume command,
# keeps a loadable checkpoint, and resuming with that command ends byte-identical
# to an uninterrupted run with no duplicated metrics row; a second signal
# ends the process at once; stale Ember tmp files are removed at start;
# --resume drops metrics rows after the checkpoint's epoch.
# Usage: e2e_runs.sh path/to/ember
set -euo pipefail
EMBER="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
T="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
export STARPU_SILENT=1
tiny=(--limit 512 --hidden 16 --seed 5 --no-progress --epochs 2)
fail() { echo "FAIL: $*" >&2; exit 1; }
sums() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs md5sum); }
# the epochs of metrics.csv in $1, one line
epochs_of() { awk -F, 'NR > 1 { printf "%s ", $1 }' "$1"; }

# ---- 1. no --out: the default folder, then a numbered sibling ----
mkdir "$T/cwd"
(cd "$T/cwd" && "$EMBER" train "${tiny[@]}" > "$T/d1.log")
grep -q "^run folder: runs/fashion-mnist$" "$T/d1.log" || fail "first run: no 'run folder: runs/fashion-mnist' line: $(cat "$T/d1.log")"
grep -q "checkpoints in runs/fashion-mnist/" "$T/d1.log" || fail "first run: final line names another folder"
sum1=$(sums "$T/cwd/runs/fashion-mnist")
(cd "$T/cwd" && "$EMBER" train "${tiny[@]}" --hidden 8 > "$T/d2.log")
grep -q "^run folder: runs/fashion-mnist-2 (runs/fashion-mnist holds an earlier run)$" "$T/d2.log" ||
  fail "second run: not announced as runs/fashion-mnist-2: $(cat "$T/d2.log")"
[ -f "$T/cwd/runs/fashion-mnist-2/checkpoint.safetensors" ] || fail "second run: no runs/fashion-mnist-2/checkpoint.safetensors"
[ "$sum1" = "$(sums "$T/cwd/runs/fashion-mnist")" ] || fail "second run modified the first run's folder"
(cd "$T/cwd" && "$EMBER" train "${tiny[@]}" > "$T/d3.log")
grep -q "^run folder: runs/fashion-mnist-3 " "$T/d3.log" || fail "third run: not in runs/fashion-mnist-3"
[ "$(epochs_of "$T/cwd/runs/fashion-mnist/metrics.csv")" = "1 2 " ] || fail "first run's metrics.csv changed"
# --resume without --out continues in the checkpoint's folder
(cd "$T/cwd" && "$EMBER" train "${tiny[@]}" --hidden 8 --epochs 3 --resume runs/fashion-mnist-2/checkpoint.safetensors > "$T/d4.log")
grep -q "^run folder: runs/fashion-mnist-2 (the folder of --resume)$" "$T/d4.log" || fail "--resume: not in the checkpoint's folder: $(cat "$T/d4.log")"
[ "$(epochs_of "$T/cwd/runs/fashion-mnist-2/metrics.csv")" = "1 2 3 " ] || fail "--resume in place: metrics epochs $(epochs_of "$T/cwd/runs/fashion-mnist-2/metrics.csv")"
[ ! -e "$T/cwd/runs/fashion-mnist-4" ] || fail "--resume made a new numbered folder"
echo "ok: no --out: runs/fashion-mnist, then -2 and -3; --resume continues in its folder"

# ---- 2. --out DIR holding a run: refused, nothing touched; --overwrite replaces ----
"$EMBER" train "${tiny[@]}" --out "$T/a" > /dev/null
printf 'stale plot\n' > "$T/a/loss.png"
cp "$T/a/loss.png" "$T/stale.png"
before=$(sums "$T/a")
set +e
"$EMBER" train "${tiny[@]}" --out "$T/a" > "$T/r.out" 2> "$T/r.err"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--out with a run exited $rc, not 2"
grep -q -- "--resume $T/a/checkpoint.safetensors" "$T/r.err" || fail "refusal does not name --resume DIR/checkpoint.safetensors: $(cat "$T/r.err")"
grep -q -- "--overwrite" "$T/r.err" || fail "refusal does not name --overwrite: $(cat "$T/r.err")"
[ "$before" = "$(sums "$T/a")" ] || fail "a refused run changed files"
# any run file counts, the plots included; other files do not
for f in checkpoint.safetensors best.safetensors metrics.csv loss.png accuracy.png loss.svg accuracy.svg; do
  rm -rf "$T/one" && mkdir "$T/one" && echo x > "$T/one/$f"
  set +e
  "$EMBER" train "${tiny[@]}" --out "$T/one" > /dev/null 2> "$T/one.err"
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "--out holding only $f: exit $rc, not 2"
  grep -q "$f" "$T/one.err" || fail "refusal does not name $f: $(cat "$T/one.err")"
done
rm -rf "$T/one" && mkdir "$T/one" && echo notes > "$T/one/notes.txt"
"$EMBER" train "${tiny[@]}" --out "$T/one" > /dev/null || fail "--out with only an unrelated file refused"
[ "$(cat "$T/one/notes.txt")" = notes ] || fail "unrelated file changed"
# --resume of another folder into a folder holding a run: refused as well
set +e
"$EMBER" train "${tiny[@]}" --epochs 3 --out "$T/a" --resume "$T/one/checkpoint.safetensors" > /dev/null 2> "$T/r2.err"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--resume elsewhere into a folder holding a run: exit $rc, not 2"
[ "$before" = "$(sums "$T/a")" ] || fail "a refused resume changed files"
# --overwrite together with --resume of a checkpoint in the same folder would delete it: refused
set +e
"$EMBER" train "${tiny[@]}" --epochs 3 --out "$T/a" --resume "$T/a/checkpoint.safetensors" --overwrite > /dev/null 2> "$T/r3.err"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--overwrite with --resume in the same folder: exit $rc, not 2"
[ "$before" = "$(sums "$T/a")" ] || fail "--overwrite + --resume changed files"
# --overwrite: a fresh run, no stale row, best model or plot of the old one
"$EMBER" train "${tiny[@]}" --hidden 8 --epochs 1 --out "$T/ow" > /dev/null
nrun=0
for f in checkpoint.safetensors best.safetensors metrics.csv loss.png accuracy.png loss.svg accuracy.svg; do
  [ -e "$T/a/$f" ] && nrun=$((nrun + 1))
done
"$EMBER" train "${tiny[@]}" --hidden 8 --epochs 1 --out "$T/a" --overwrite > "$T/ow.log"
grep -q "removed $nrun files of the earlier run" "$T/ow.log" || fail "--overwrite does not report what it removed: $(cat "$T/ow.log")"
[ "$(epochs_of "$T/a/metrics.csv")" = "1 " ] || fail "--overwrite: metrics epochs are '$(epochs_of "$T/a/metrics.csv")', not '1 '"
[ "$(grep -c '^epoch,' "$T/a/metrics.csv")" = 1 ] || fail "--overwrite: metrics.csv has more than one header"
cmp "$T/a/best.safetensors" "$T/ow/best.safetensors" || fail "--overwrite: best.safetensors is not the new run's"
cmp "$T/a/checkpoint.safetensors" "$T/ow/checkpoint.safetensors" || fail "--overwrite: checkpoint is not the new run's"
if [ -e "$T/a/loss.png" ] && cmp -s "$T/a/loss.png" "$T/stale.png"; then fail "--overwrite kept the old run's loss.png"; fi
echo "ok: --out with a run refused (exit 2, files byte-identical), --overwrite replaces every run file"

# ---- 2b. a folder in use by a running run (its lock, DIR/.ember-lock, held) is never shared ----
mkdir -p "$T/busy/runs/fashion-mnist"
# (exec: the lock's holder is the process $! names, so killing it frees the lock)
(exec 9> "$T/busy/runs/fashion-mnist/.ember-lock"; flock 9; exec sleep 60) &
holder=$!
for _ in $(seq 1 500); do [ -e "$T/busy/runs/fashion-mnist/.ember-lock" ] && break; sleep 0.01; done
sleep 0.2
(cd "$T/busy" && "$EMBER" train "${tiny[@]}" --epochs 1 > "$T/busy.log")
grep -q "^run folder: runs/fashion-mnist-2 (runs/fashion-mnist is in use or holds an earlier run)$" "$T/busy.log" ||
  fail "a default folder in use was not skipped: $(grep 'run folder' "$T/busy.log")"
[ -f "$T/busy/runs/fashion-mnist-2/checkpoint.safetensors" ] || fail "no run in runs/fashion-mnist-2"
[ ! -e "$T/busy/runs/fashion-mnist/metrics.csv" ] || fail "a run wrote into the folder in use"
set +e
"$EMBER" train "${tiny[@]}" --epochs 1 --out "$T/busy/runs/fashion-mnist" > /dev/null 2> "$T/busy.err"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--out DIR in use: exit $rc, not 2"
grep -q "runs/fashion-mnist is in use by another run (pid " "$T/busy.err" || fail "--out DIR in use: $(cat "$T/busy.err")"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
# once the other run has ended (its lock goes with it), the folder is free again
"$EMBER" train "${tiny[@]}" --epochs 1 --out "$T/busy/runs/fashion-mnist" > /dev/null || fail "folder not free after the lock holder ended"
echo "ok: a folder in use by a running run is skipped (default) or refused (--out, exit 2), free again after it ends"

# ---- 2c. --resume: the lr comes from the resumed run's schedule; another folder gets the history ----
"$EMBER" train "${tiny[@]}" --epochs 3 --out "$T/lr" > /dev/null
"$EMBER" train --no-progress --epochs 5 --resume "$T/lr/checkpoint.safetensors" --out "$T/lr5" > "$T/lr5.log"
# cosine over 5 epochs: epoch 4 runs at 0.001 * (1 + cos(3 pi / 5)) / 2 = 0.000345 (not the 3-epoch run's 0)
awk '$1 == "epoch" && $2 == "4/5" && $8 == "0.000345" { f = 1 } END { exit !f }' "$T/lr5.log" ||
  fail "resumed epoch 4 of 5 does not run at the 5-epoch cosine's lr: $(grep '^epoch 4/5' "$T/lr5.log")"
[ "$(epochs_of "$T/lr5/metrics.csv")" = "1 2 3 4 5 " ] || fail "--resume into another folder: metrics epochs '$(epochs_of "$T/lr5/metrics.csv")'"
[ -f "$T/lr5/best.safetensors" ] || fail "--resume into another folder: no best.safetensors"
cmp -s "$T/lr/metrics.csv" <(head -4 "$T/lr5/metrics.csv") || fail "--resume into another folder: the first 3 rows differ from the run's"
set +e
"$EMBER" train --no-progress --epochs 5 --resume "$T/lr/best.safetensors" --out "$T/lrb" > /dev/null 2> "$T/lrb.err"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "no optimizer state (best.safetensors is such a file).*--init-from" "$T/lrb.err" ||
  fail "--resume best.safetensors: exit $rc: $(cat "$T/lrb.err")"
echo "ok: --resume with more epochs runs the new schedule's lr; into another folder it carries metrics.csv and best; best.safetensors is refused naming --init-from"

# ---- 3. stale Ember tmp files are removed at start, nothing else ----
mkdir "$T/s"
echo partial > "$T/s/checkpoint.safetensors.tmp.Ab12Yz"
echo partial > "$T/s/metrics.csv.tmp.000000"
echo mine > "$T/s/checkpoint.safetensors.tmp"
echo mine > "$T/s/checkpoint.safetensors.tmp.toolong7"
echo mine > "$T/s/other.tmp.Ab12Yz"
"$EMBER" train "${tiny[@]}" --epochs 1 --out "$T/s" > "$T/s.log"
[ ! -e "$T/s/checkpoint.safetensors.tmp.Ab12Yz" ] || fail "stale checkpoint tmp file not removed"
[ ! -e "$T/s/metrics.csv.tmp.000000" ] || fail "stale metrics tmp file not removed"
grep -q "removed $T/s/checkpoint.safetensors.tmp.Ab12Yz" "$T/s.log" || fail "tmp removal not reported: $(cat "$T/s.log")"
for f in checkpoint.safetensors.tmp checkpoint.safetensors.tmp.toolong7 other.tmp.Ab12Yz; do
  [ "$(cat "$T/s/$f")" = mine ] || fail "$f (not Ember's tmp naming) was touched"
done
echo "ok: stale Ember tmp files removed at start, other files kept"

# ---- 4. --resume drops metrics rows after the checkpoint's epoch ----
"$EMBER" train "${tiny[@]}" --epochs 4 --out "$T/full" > /dev/null
"$EMBER" train "${tiny[@]}" --epochs 4 --stop-after-epoch 2 --out "$T/m" > /dev/null
sed -n 4p "$T/full/metrics.csv" >> "$T/m/metrics.csv" # a row of epoch 3 the checkpoint (epoch 2) does not hold
"$EMBER" train "${tiny[@]}" --epochs 4 --resume "$T/m/checkpoint.safetensors" > "$T/m.log"
grep -q "dropped 1 row of epochs after the checkpoint's epoch 2" "$T/m.log" || fail "resume: the dropped row is not reported: $(cat "$T/m.log")"
[ "$(epochs_of "$T/m/metrics.csv")" = "1 2 3 4 " ] || fail "resume: metrics epochs '$(epochs_of "$T/m/metrics.csv")'"
cmp "$T/full/checkpoint.safetensors" "$T/m/checkpoint.safetensors" || fail "stop + resume differs from the uninterrupted run"
echo "ok: --resume drops metrics rows after the checkpoint's epoch"

# ---- 5. Ctrl-C ----
# batch 1: ~0.3 s per epoch on the 2-core box, so a signal sent once the first
# checkpoint exists lands in epoch 2 or later, long before epoch 8
sig=(--limit 512 --hidden 16 --seed 5 --no-progress --batch-size 1 --epochs 8)
wait_ckpt() { # $1 folder, $2 pid
  for _ in $(seq 1 3000); do
    [ -f "$1/checkpoint.safetensors" ] && return 0
    kill -0 "$2" 2> /dev/null || fail "training $1 ended before its first checkpoint"
    sleep 0.01
  done
  fail "no checkpoint in $1 after 30 s"
}
"$EMBER" train "${sig[@]}" --out "$T/u" > "$T/u.log" &
pids+=($!)
"$EMBER" train "${sig[@]}" --out "$T/i" > "$T/i.log" 2> "$T/i.err" &
pid=$!
pids+=("$pid")
wait_ckpt "$T/i" "$pid"
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 130 ] || fail "SIGINT: exit $rc, not 130: $(cat "$T/i.err")"
grep -q "^ember train: interrupted in epoch [0-9]* (" "$T/i.err" || fail "SIGINT: no 'interrupted in epoch' message: $(cat "$T/i.err")"
grep -q "^interrupted: resume with: ember train .*--resume $T/i/checkpoint.safetensors$" "$T/i.err" || fail "SIGINT: no resume command: $(cat "$T/i.err")"
ep=$(sed -n 's/^ember train: interrupted in epoch \([0-9]*\) .*/\1/p' "$T/i.err")
[ "$ep" -ge 2 ] && [ "$ep" -le 8 ] || fail "interrupted in epoch '$ep'"
grep -q "the last checkpoint is $T/i/checkpoint.safetensors (epoch $((ep - 1)))" "$T/i.err" || fail "SIGINT: last checkpoint not named: $(cat "$T/i.err")"
"$EMBER" eval --checkpoint "$T/i/checkpoint.safetensors" --limit 512 > "$T/i.eval" || fail "interrupted run's checkpoint does not load"
ls "$T/i" > "$T/i.ls"
if grep -q '\.tmp' "$T/i.ls"; then fail "SIGINT left a tmp file: $(cat "$T/i.ls")"; fi
[ "$(epochs_of "$T/i/metrics.csv")" = "$(seq -s ' ' 1 $((ep - 1))) " ] || fail "SIGINT: metrics epochs '$(epochs_of "$T/i/metrics.csv")' (interrupted in $ep)"
# the printed command resumes it (in place), and the end is byte-identical to the uninterrupted run
cmd=$(sed -n 's/^interrupted: resume with: ember train //p' "$T/i.err")
eval "\"\$EMBER\" train $cmd" > "$T/i2.log"
grep -q "resumed from $T/i/checkpoint.safetensors at epoch $((ep - 1))" "$T/i2.log" || fail "resume: $(head -5 "$T/i2.log")"
wait "${pids[0]}" || fail "the uninterrupted run failed"
cmp "$T/u/checkpoint.safetensors" "$T/i/checkpoint.safetensors" || fail "interrupted + resumed run differs from the uninterrupted one"
cmp "$T/u/best.safetensors" "$T/i/best.safetensors" || fail "interrupted + resumed best.safetensors differs"
[ "$(epochs_of "$T/i/metrics.csv")" = "$(seq -s ' ' 1 8) " ] || fail "after interrupt + resume: metrics epochs '$(epochs_of "$T/i/metrics.csv")'"
echo "ok: SIGINT in epoch $ep: exit 130, resume command, loadable checkpoint; resumed run byte-identical, metrics epochs 1..8 once each"

# SIGINT in epoch 1: nothing to resume, still 130
"$EMBER" train "${sig[@]}" --progress --out "$T/e1" > "$T/e1.log" 2> "$T/e1.err" &
pid=$!
pids+=("$pid")
# the first progress bar (forced into the log by --progress) says the Learner, and its handler, runs
for _ in $(seq 1 3000); do grep -aq "train 1/8 \[" "$T/e1.log" && break; sleep 0.01; done
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 130 ] || fail "SIGINT in epoch 1: exit $rc, not 130"
if [ -f "$T/e1/checkpoint.safetensors" ]; then
  grep -q "^interrupted: resume with" "$T/e1.err" || fail "SIGINT: a checkpoint but no resume command"
else
  grep -q "^interrupted: no checkpoint was written, nothing to resume$" "$T/e1.err" || fail "SIGINT in epoch 1: $(cat "$T/e1.err")"
  [ ! -e "$T/e1/metrics.csv" ] || fail "SIGINT in epoch 1 wrote a metrics row without a checkpoint"
fi
# SIGTERM is graceful too (exit 143)
"$EMBER" train "${sig[@]}" --out "$T/t" > /dev/null 2> "$T/t.err" &
pid=$!
pids+=("$pid")
wait_ckpt "$T/t" "$pid"
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 143 ] || fail "SIGTERM: exit $rc, not 143"
grep -q "^interrupted: resume with" "$T/t.err" || fail "SIGTERM: no resume command"
# a second signal ends the process at once: with the process stopped, SIGINT
# and SIGTERM are both pending (two SIGINTs would merge into one); whichever
# comes second (default action, or the handler's _exit when both reach two
# threads at once) ends the process before the graceful exit, which would
# print the "interrupted ..." lines
"$EMBER" train "${sig[@]}" --out "$T/x" > /dev/null 2> "$T/x.err" &
pid=$!
pids+=("$pid")
wait_ckpt "$T/x" "$pid"
kill -STOP "$pid"
kill -INT "$pid"
kill -TERM "$pid"
kill -CONT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 143 ] || [ "$rc" = 130 ] || fail "second signal: exit $rc: $(cat "$T/x.err")"
if grep -q "interrupted" "$T/x.err"; then fail "second signal: the process still exited gracefully: $(cat "$T/x.err")"; fi
grep -q "stopping after the current step (press Ctrl-C again to quit at once)\|stopping after the current step (a second signal quits at once)" "$T/x.err" || fail "first signal not acknowledged: $(cat "$T/x.err")"
"$EMBER" train "${sig[@]}" --resume "$T/x/checkpoint.safetensors" --stop-after-epoch 1 > "$T/x2.log" 2>&1 ||
  fail "a run killed by the second signal cannot be resumed: $(cat "$T/x2.log")"
echo "ok: SIGINT in epoch 1 (nothing to resume) and SIGTERM exit gracefully; a second signal ends the process at once"
echo "1 passed, 0 failed"
