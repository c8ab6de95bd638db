#!/usr/bin/env bash
# End-to-end checks of the training plots: `ember train` writes loss.png,
# accuracy.png, loss.svg and accuracy.svg next to metrics.csv after every
# epoch (atomically: no .tmp left); `ember plot RUN` redraws them, `ember plot
# A B --out PREFIX` overlays two runs; usage errors exit 2, an unreadable or
# malformed metrics.csv exits 1 and writes nothing. Exits 77 (skipped) when
# this ember was built without cairo, after checking that it says so.
# Usage: e2e_plot.sh path/to/ember
set -euo pipefail
EMBER="$1"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1
common=(--hidden 16 --batch-size 64 --seed 5 --no-progress --limit 256)
fail() { echo "FAIL: $*" >&2; exit 1; }
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "$1 is not a PNG"; }
curves() { grep -o 'class="curve"' "$1" > "$T/curves" || true; wc -l < "$T/curves"; }

"$EMBER" train "${common[@]}" --epochs 2 --out "$T/runs/a" > "$T/a.log" 2> "$T/a.err"
if grep -q "plotting is unavailable" "$T/a.err"; then
  [ "$(grep -c "plots not written" "$T/a.err")" = 1 ] || fail "the missing-cairo message is not printed once"
  set +e; "$EMBER" plot "$T/runs/a" > /dev/null 2>&1; rc=$?; set -e
  [ "$rc" = 1 ] || fail "ember plot without cairo exited $rc"
  echo "skipped: built without cairo (the program says so once)"
  exit 77
fi
[ ! -s "$T/a.err" ] || fail "train printed errors: $(cat "$T/a.err")"
for f in loss.png accuracy.png loss.svg accuracy.svg; do [ -s "$T/runs/a/$f" ] || fail "train did not write $f"; done
is_png "$T/runs/a/loss.png"
is_png "$T/runs/a/accuracy.png"
[ "$(curves "$T/runs/a/loss.svg")" = 2 ] || fail "loss.svg: not 2 curves (train, validation)"
ls "$T/runs/a" > "$T/ls"
if grep -q '\.tmp' "$T/ls"; then fail "a .tmp file is left: $(cat "$T/ls")"; fi
echo "ok: train writes loss/accuracy .png and .svg"

# after a 1-epoch run too, and they follow each epoch (3 epochs: 3 points on each curve)
"$EMBER" train "${common[@]}" --epochs 3 --optimizer sgd --out "$T/runs/b" > /dev/null
grep -o 'class="curve"[^>]*d="[^"]*"' "$T/runs/b/loss.svg" | head -1 > "$T/path"
[ "$(grep -o '[ML][0-9]' "$T/path" | wc -l)" = 3 ] || fail "run b: the curve has not 3 points: $(cat "$T/path")"
echo "ok: the plots hold every epoch"

# redraw one run in place
rm "$T/runs/a/loss.png" "$T/runs/a/accuracy.svg"
"$EMBER" plot "$T/runs/a" > "$T/p1.log"
[ -s "$T/runs/a/loss.png" ] && [ -s "$T/runs/a/accuracy.svg" ] || fail "ember plot RUN did not redraw in RUN"
echo "ok: ember plot RUN redraws $(cat "$T/p1.log")"

# two runs overlaid
# --out FOLDER/ that does not exist (two levels): created, as --help says ("a folder (ending in / or existing)")
"$EMBER" plot "$T/runs/a" "$T/runs/b/" --out "$T/cmp/" > "$T/p2.log"
for f in loss.png accuracy.png loss.svg accuracy.svg; do [ -s "$T/cmp/$f" ] || fail "overlay: no $f"; done
is_png "$T/cmp/accuracy.png"
[ "$(curves "$T/cmp/accuracy.svg")" = 4 ] || fail "overlay accuracy.svg: not 4 curves"
grep -q "$T/runs/a vs $T/runs/b: accuracy" "$T/cmp/accuracy.svg" || fail "overlay title does not name the runs"
"$EMBER" plot "$T/runs/a" "$T/runs/b/metrics.csv" --out "$T/cmp/pre-" > /dev/null
[ -s "$T/cmp/pre-loss.png" ] || fail "--out PREFIX: no pre-loss.png"
"$EMBER" plot "$T/runs/a" "$T/runs/b" --out "$T/new/deeper//" > "$T/p3.log"
[ -s "$T/new/deeper/loss.svg" ] || fail "--out into a missing nested folder: no loss.svg"
grep -qx "wrote $T/new/deeper/loss.png, $T/new/deeper/accuracy.png, $T/new/deeper/loss.svg, $T/new/deeper/accuracy.svg" "$T/p3.log" ||
  fail "--out DIR//: the paths are not DIR/NAME: $(cat "$T/p3.log")"
"$EMBER" plot "$T/runs/a//" > "$T/p4.log"
if grep -q '//' "$T/p4.log"; then fail "ember plot RUN//: a double slash: $(cat "$T/p4.log")"; fi
echo "ok: ember plot A B overlays two runs; --out DIR/ is created; no double slash"

# a diverged run: every value NaN: the frame with a centred note, no empty legend, no NaN coordinates
mkdir -p "$T/nan"
printf 'epoch,train_loss,train_accuracy,val_loss,val_accuracy\n1,nan,nan,nan,nan\n2,nan,nan,nan,nan\n' > "$T/nan/metrics.csv"
"$EMBER" plot "$T/nan" > "$T/pn.log"
for f in loss accuracy; do
  is_png "$T/nan/$f.png"
  grep -q ">no finite values</text>" "$T/nan/$f.svg" || fail "NaN run: $f.svg has no 'no finite values' note"
  [ "$(curves "$T/nan/$f.svg")" = 0 ] || fail "NaN run: $f.svg has curves"
  grep -o '<rect' "$T/nan/$f.svg" > "$T/rects" || true
  [ "$(wc -l < "$T/rects")" = 2 ] || fail "NaN run: $f.svg: not just the background and the frame (an empty legend box?)"
  if grep -qi '="-\?nan\|="-\?inf' "$T/nan/$f.svg"; then fail "NaN run: $f.svg has non-finite coordinates"; fi
  grep -q '>2</text>' "$T/nan/$f.svg" || fail "NaN run: $f.svg: the epoch axis has no ticks"
done
echo "ok: a NaN-only run: an empty frame with 'no finite values'"

# errors
expect_rc() {
  local want=$1 msg=$2; shift 2
  set +e; "$EMBER" plot "$@" > "$T/e.log" 2>&1; local rc=$?; set -e
  [ "$rc" = "$want" ] || fail "ember plot $* exited $rc, not $want: $(cat "$T/e.log")"
  grep -q -- "$msg" "$T/e.log" || fail "ember plot $*: '$(cat "$T/e.log")' does not say '$msg'"
  echo "ok: ember plot $* -> exit $rc ($(head -1 "$T/e.log"))"
}
expect_rc 2 "no run given"
expect_rc 2 "^ember plot: unknown option '--bogus' (see 'ember plot --help')$" --bogus "$T/runs/a"
expect_rc 2 "^ember plot: unknown option '-x' (see 'ember plot --help')$" -x "$T/runs/a"
expect_rc 2 "^ember plot: --out needs a value (see 'ember plot --help')$" "$T/runs/a" --out
expect_rc 1 "cannot open $T/nope/metrics.csv" "$T/nope"
mkdir -p "$T/bad" "$T/out"
printf 'epoch,train_loss,train_accuracy,val_loss,val_accuracy\n1,0.5,0.8,0.6,0.7\n2,0.4,oops,0.5,0.8\n' > "$T/bad/metrics.csv"
expect_rc 1 "line 3: train_accuracy 'oops' is not a number" "$T/runs/a" "$T/bad" --out "$T/out/"
[ -z "$(ls -A "$T/out")" ] || fail "a malformed metrics.csv still wrote $(ls "$T/out")"
expect_rc 1 "line 3: train_accuracy 'oops' is not a number" "$T/runs/a" "$T/bad" --out "$T/out2/"
[ ! -e "$T/out2" ] || fail "a malformed metrics.csv still created the --out folder"
"$EMBER" plot --help > "$T/help.log"
grep -q "usage: ember plot RUN_DIR" "$T/help.log" || fail "ember plot --help"
echo "all plot checks passed"
