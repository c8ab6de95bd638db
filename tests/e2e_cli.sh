#!/usr/bin/env bash
# End-to-end checks of the `ember` command line (issue #20, items 2, 4, 6, 9):
# - every numeric flag is parsed strictly: a bad value, an unknown option, a
#   missing value or a stray operand exits 2 naming the flag, and writes nothing;
# - an unwritable --out fails before training (exit 1, naming the directory);
# - the progress bar fits the terminal (a pseudo-terminal of 80 and 40
#   columns, $COLUMNS when not a terminal), is off when stdout is not a
#   terminal, and --no-progress prints the epoch lines only; epoch lines fit
#   100 columns;
# - --resume with --epochs not above the epochs done exits 2 naming both;
#   --resume needs no model option (model, normalisation and augmentation
#   from the checkpoint, and so do the training settings: the resumed run is byte-identical to an uninterrupted
#   one) and a disagreeing --model is an error naming both models;
# - --init-from starts a new run from a PyTorch weights-only file (its
#   validation loss and accuracy are PyTorch's) or from a checkpoint, and a
#   file of another model is an error naming the key and the shapes;
# - a diverged (NaN) run: one warning, top-1 / top-5 0, predict prints nan and
#   exits 1, eval counts the samples wrong and says so.
# Usage: e2e_cli.sh path/to/ember
set -euo pipefail
EMBER="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
T="$(mktemp -d)"
trap 'chmod -R u+w "$T" 2>/dev/null || true; rm -rf "$T"' EXIT
export STARPU_SILENT=1
tiny=(--limit 256 --epochs 1 --hidden 16 --no-progress)
fail() { echo "FAIL: $*" >&2; exit 1; }
pass=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }

# run CMD...: sets rc, stdout in $T/out.log, stderr in $T/err.log
run() {
  set +e
  "$@" > "$T/out.log" 2> "$T/err.log"
  rc=$?
  set -e
}

# a checkpoint for eval / predict / resume
"$EMBER" train "${tiny[@]}" --out "$T/base" > "$T/base.log"
CK="$T/base/checkpoint.safetensors"
[ -f "$CK" ] || fail "no checkpoint from the base run"

# ---- item 2: strict flags, exit 2, the flag named, nothing written --------
# each case: "subcommand|arguments|text that must appear in stderr"
cases=(
  "train|--batch-size 1e3|--batch-size: '1e3' is not an integer"
  "train|--batch-size 0|--batch-size: 0 is out of range (expected an integer in [1, 1048576])"
  "train|--batch-size 64x|--batch-size"
  "train|--lr abc|--lr: 'abc' is not a number (expected a finite number > 0)"
  "train|--lr nan|--lr: 'nan' is not a finite number"
  "train|--lr inf|--lr: 'inf' is not a finite number"
  "train|--lr -0.1|--lr: -0.1 is out of range"
  "train|--lr 0|--lr: 0 is out of range"
  "train|--optimizer sgd --momentum abc|--momentum: 'abc' is not a number"
  "train|--optimizer sgd --momentum 1.5|--momentum: 1.5 is out of range (expected a number in [0, 1])"
  "train|--momentum 0.9|--momentum applies to --optimizer sgd and rmsprop"
  "train|--dropout -0.1|--dropout: -0.1 is out of range (expected a number in [0, 1))"
  "train|--dropout 1|--dropout: 1 is out of range"
  "train|--weight-decay -1|--weight-decay: -1 is out of range (expected a finite number >= 0)"
  "train|--clip-grad-norm -1|--clip-grad-norm: -1 is out of range"
  "train|--patience -1|--patience: -1 is out of range"
  "train|--patience 2.5|--patience: '2.5' is not an integer"
  "train|--label-smoothing -0.1|--label-smoothing: -0.1 is out of range (expected a number in [0, 1])"
  "train|--label-smoothing 1.5|--label-smoothing: 1.5 is out of range"
  "train|--seed -1|--seed: -1 is out of range (expected an integer >= 0)"
  "train|--seed 99999999999999999999|--seed: 99999999999999999999 is out of range"
  "train|--workers -1|--workers: -1 is out of range (expected an integer in [0, 256])"
  "train|--workers 1000|--workers: 1000 is out of range"
  "train|--limit 0|--limit: 0 is out of range (expected an integer >= 1)"
  "train|--limit ten|--limit: 'ten' is not an integer"
  "train|--epochs 0|--epochs: 0 is out of range"
  "train|--epochs 2.0|--epochs: '2.0' is not an integer"
  "train|--stop-after-epoch -1|--stop-after-epoch: -1 is out of range"
  "train|--global-batch 0|--global-batch: 0 is out of range"
  "train|--global-batch 1e6|--global-batch: '1e6' is not an integer"
  "train|--hidden 16,,8|--hidden: '16,,8' is not a list of layer sizes"
  "train|--hidden 16,-8|--hidden: '16,-8'"
  "train|--model mlp:784-x-10|bad model spec 'mlp:784-x-10'"
  "train|--model mlp:784-16-10:dropout=2|bad model spec"
  "train|--scheduler nope|unknown scheduler 'nope'"
  "train|--optimizer nope|unknown optimizer 'nope'"
  "train|--bogus|unknown option '--bogus'"
  "train|-x|unknown option '-x'"
  "train|extra|unexpected argument 'extra'"
  "train|--resume $CK --init-from $CK|not both"
  "train|--lr|--lr needs a value"
  "train|--device foo|--device: unknown device 'foo'"
  "train|--out=|--out: the folder name is empty"
  "eval|--checkpoint $CK --device cuda:x|--device: bad device 'cuda:x'"
  "train|--scheduler warmup-cosine --warmup 1|--warmup 1 must be below the run's 1 optimizer step (1 epoch x 1 step)"
  "eval|--checkpoint $CK --batch-size 0|--batch-size: 0 is out of range (expected an integer in [1, 1048576])"
  "eval|--checkpoint $CK --batch-size -7|--batch-size: -7 is out of range"
  "eval|--checkpoint $CK --batch-size 2e9|--batch-size: '2e9' is not an integer"
  "eval|--checkpoint $CK --batch-size 2000000000|--batch-size: 2000000000 is out of range"
  "eval|--checkpoint $CK --limit 0|--limit: 0 is out of range"
  "eval|--checkpoint $CK --bogus|unknown option '--bogus'"
  "eval|--checkpoint $CK extra|unexpected argument 'extra'"
  "eval||--checkpoint FILE is required"
  "eval|--checkpoint|--checkpoint needs a value"
  "predict|--checkpoint $CK --top 0|--top: 0 is out of range"
  "predict|--checkpoint $CK --top -1|--top: -1 is out of range"
  "predict|--checkpoint $CK --top 3x|--top: '3x' is not an integer"
  "predict|--checkpoint $CK --top 11|--top: 11 is out of range (expected an integer in [1, 10])"
  "predict|--checkpoint $CK --top 0|--top: 0 is out of range (expected an integer in [1, 10])"
  "predict|--checkpoint $CK --index 3,10000|--index 10000 is out of range: the test split has 10000 images (0 to 9999)"
  "predict|--checkpoint $CK --index 1,x|--index: '1,x' is not a list of image numbers"
  "predict|--checkpoint $CK --index -1|--index: '-1'"
  "predict|--checkpoint $CK --bogus|unknown option '--bogus'"
  "predict|--checkpoint $CK --top|--top needs a value"
  "devices|--bogus|unknown option '--bogus'"
  "devices|extra|unexpected argument 'extra'"
  "version|--bogus|ember version: unknown option '--bogus' (see 'ember version --help')"
  "version|extra|ember version: unexpected argument 'extra'"
)
for c in "${cases[@]}"; do
  IFS='|' read -r sub args want <<< "$c"
  extra=()
  [ "$sub" = train ] && extra=(--limit 64 --epochs 1 --no-progress --out "$T/usage")
  # the value-less cases put the flag last; an empty argument list is none
  read -r -a argv <<< "$args"
  if [ "${argv[*]: -1}" = "--lr" ]; then run "$EMBER" "$sub" "${extra[@]}" "${argv[@]}"
  else run "$EMBER" "$sub" "${argv[@]}" "${extra[@]}"; fi
  [ "$rc" = 2 ] || fail "'ember $sub $args' exited $rc, not 2: $(cat "$T/err.log")"
  grep -qF -- "$want" "$T/err.log" || fail "'ember $sub $args': stderr lacks \"$want\": $(cat "$T/err.log")"
  [ ! -e "$T/usage" ] || fail "'ember $sub $args' wrote $T/usage"
  [ ! -s "$T/out.log" ] || fail "'ember $sub $args' printed to stdout: $(head -3 "$T/out.log")"
done
ok "${#cases[@]} bad flags, unknown options, missing values and operands exit 2 naming the flag, nothing written"
run "$EMBER"
[ "$rc" = 2 ] && grep -q "usage: ember <command>" "$T/err.log" || fail "'ember' without a command: rc $rc"
for sub in train eval predict devices version; do
  run "$EMBER" "$sub" --help
  [ "$rc" = 0 ] && grep -q "^Exit status: 0 success; 1 runtime error" "$T/out.log" || fail "ember $sub --help: rc $rc, no exit codes"
done
run "$EMBER" version
[ "$rc" = 0 ] && grep -q "^ember [0-9]" "$T/out.log" || fail "ember version: rc $rc: $(cat "$T/out.log" "$T/err.log")"
ok "exit codes documented in every --help"

# EMBER_NCPU / EMBER_NCUDA / EMBER_NOPENCL: the whole value an integer >= -1, else em_init fails naming it
for ev in "EMBER_NCPU=abc" "EMBER_NCPU=2x" "EMBER_NCPU= 1" "EMBER_NCPU=-2" "EMBER_NCPU=99999999999" "EMBER_NCUDA=one" "EMBER_NOPENCL=1.5"; do
  run env "$ev" "$EMBER" devices
  [ "$rc" = 1 ] && grep -qF "ember devices: em_init: ${ev%%=*}='${ev#*=}' is not a worker count (expected an integer >= -1" "$T/err.log" ||
    fail "$ev ember devices: rc $rc: $(cat "$T/err.log")"
done
run env EMBER_NCPU=1 "$EMBER" devices
[ "$rc" = 0 ] || fail "EMBER_NCPU=1 ember devices: rc $rc: $(cat "$T/err.log")"
ok "EMBER_NCPU / EMBER_NCUDA / EMBER_NOPENCL parsed strictly (exit 1 naming the variable and value)"

# ---- item 4: an unwritable --out fails before training ---------------------
touch "$T/afile"
for out in "$T/afile/run" "$T/afile/a/b" "$T/afile"; do
  run "$EMBER" train "${tiny[@]}" --out "$out"
  [ "$rc" = 1 ] || fail "--out $out: exit $rc, not 1: $(cat "$T/err.log")"
  grep -qF -- "--out:" "$T/err.log" && grep -qF -- "$out" "$T/err.log" || fail "--out $out: message does not name it: $(cat "$T/err.log")"
  if grep -q "^epoch\|train_loss" "$T/out.log"; then fail "--out $out: training started before the error"; fi
  grep -qF "$T/afile exists and is not a directory" "$T/err.log" || grep -qF ": $T/afile is not a directory" "$T/err.log" ||
    fail "--out $out: the message does not say that $T/afile is not a directory: $(cat "$T/err.log")"
done
if [ "$(id -u)" != 0 ]; then # root writes anywhere: permissions only bite a normal user
  mkdir -p "$T/ro" && chmod 555 "$T/ro"
  for out in "$T/ro" "$T/ro/sub"; do
    run "$EMBER" train "${tiny[@]}" --out "$out"
    [ "$rc" = 1 ] && grep -qF "$T/ro" "$T/err.log" || fail "read-only --out $out: rc $rc: $(cat "$T/err.log")"
  done
  chmod 755 "$T/ro"
fi
# a writable --out keeps no probe file
ls -A "$T/base" > "$T/ls.log"
if grep -q "probe" "$T/ls.log"; then fail "probe file left in --out: $(cat "$T/ls.log")"; fi
ok "unwritable --out: exit 1 before training, naming the directory; no probe file left"

# ---- item 6: the terminal --------------------------------------------------
# longest segment between \r / \n of the bar lines (starting "train " / "valid "), and of every line
seg_max() { tr '\r' '\n' < "$1" | awk -v pat="$2" '$0 ~ pat { if (length($0) > m) m = length($0) } END { print m + 0 }'; }
if command -v script > /dev/null; then
  for cols in 80 40; do
    script -qec "stty cols $cols; '$EMBER' train --limit 2048 --epochs 2 --hidden 16 --out '$T/pty$cols'" /dev/null > "$T/pty$cols.log"
    tr '\r' '\n' < "$T/pty$cols.log" > "$T/pty$cols.seg"
    nbar=$(grep -c '^train [0-9]*/2 ' "$T/pty$cols.seg" || true)
    [ "$nbar" -ge 4 ] || fail "$cols columns: no progress bar on a terminal ($nbar redraws): $(head -c 600 "$T/pty$cols.log")"
    m=$(seg_max "$T/pty$cols.log" '^(train|valid) ')
    [ "$m" -lt "$cols" ] || fail "$cols columns: a progress line of $m characters: $(tr '\r' '\n' < "$T/pty$cols.log" | grep -E '^(train|valid) ' | awk 'length($0) >= '"$cols" | head -3)"
    # the bar redraws one line: all redraws of a phase are on one \n-terminated line
    for ph in 'train 1/2 \[' 'train 2/2 \['; do
      [ "$(grep -c "$ph" "$T/pty$cols.log")" = 1 ] || fail "$cols columns: the redraws of '$ph' span several lines"
    done
    m=$(seg_max "$T/pty$cols.log" '^epoch ')
    [ "$m" -le 100 ] || fail "epoch line of $m characters"
  done
  script -qec "stty cols 80; '$EMBER' train --limit 512 --epochs 2 --hidden 16 --no-progress --out '$T/ptyn'" /dev/null > "$T/ptyn.log"
  sed 's/\r$//' "$T/ptyn.log" > "$T/ptyn.cr" # a \r left inside a line is a redraw (written to a file: no '| grep -q')
  if grep -q $'\r' "$T/ptyn.cr"; then fail "--no-progress on a terminal still redraws"; fi
  grep -v $'^\r$' "$T/ptyn.log" | tr -d '\r' > "$T/ptyn.txt"
  # (StarPU's own warnings, "[starpu]...", are not Ember's output: the GPU machine's StarPU warns of a
  # missing installation directory)
  grep -v '^\[starpu\]' "$T/ptyn.txt" > "$T/ptyn-ember.txt" || true
  if grep -qv '^ember train: \|^data: \|^ *train_loss \|^epoch [12]/2 \|^final test accuracy' "$T/ptyn-ember.txt"; then
    fail "--no-progress prints more than the epoch lines: $(grep -v '^ember train: \|^data: \|^ *train_loss \|^epoch [12]/2 \|^final test accuracy' "$T/ptyn-ember.txt" | head -3)"
  fi
  ok "progress bar fits 80 and 40 columns in a pty and redraws one line; --no-progress: epoch lines only"
else
  echo "skip: no 'script' (util-linux): the pseudo-terminal checks did not run"
fi
"$EMBER" train --limit 512 --epochs 1 --hidden 16 --out "$T/pipe" > "$T/pipe.log"
if grep -q $'\r' "$T/pipe.log"; then fail "progress bar drawn when stdout is not a terminal"; fi
COLUMNS=50 "$EMBER" train --limit 512 --epochs 1 --hidden 16 --progress --out "$T/cols" > "$T/cols.log"
grep -q $'\rtrain 1/1 \[' "$T/cols.log" || fail "--progress draws no bar when not a terminal"
m=$(seg_max "$T/cols.log" '^(train|valid) ')
[ "$m" -lt 50 ] || fail "COLUMNS=50: a progress line of $m characters"
m=$(seg_max "$T/pipe.log" '^epoch ')
[ "$m" -le 100 ] && grep -q '^ *train_loss  train_acc  val_loss  val_acc  val_top5 ' "$T/pipe.log" || fail "epoch table: $(cat "$T/pipe.log")"
ok "no bar when piped, --progress follows \$COLUMNS, epoch lines <= 100 columns"

# ---- item 9: resume and weights -------------------------------------------
sum_before=$(md5sum "$CK")
run "$EMBER" train --limit 256 --no-progress --resume "$CK" --epochs 1 --out "$T/base"
[ "$rc" = 2 ] || fail "--resume with --epochs 1 after 1 epoch: exit $rc: $(cat "$T/err.log")"
grep -q "has done 1 epoch and --epochs is 1 " "$T/err.log" || fail "--resume with too few epochs: $(cat "$T/err.log")"
run "$EMBER" train --limit 256 --no-progress --resume "$CK" --out "$T/base" --epochs 3 --model cnn
[ "$rc" = 2 ] && grep -q "holds model mlp:784-16-10, but the options (--model cnn) give cnn:" "$T/err.log" ||
  fail "--resume with a conflicting --model: rc $rc: $(cat "$T/err.log")"
[ "$sum_before" = "$(md5sum "$CK")" ] || fail "a refused --resume modified the checkpoint"
ok "--resume with --epochs not above the epochs done / a conflicting --model: exit 2 naming both"

# model (with dropout), normalisation and augmentation from the checkpoint: byte-identical to an uninterrupted run
full=(--limit 256 --hidden 16 --dropout 0.1 --augment --seed 5 --epochs 2 --no-progress)
"$EMBER" train "${full[@]}" --out "$T/u" > /dev/null
"$EMBER" train "${full[@]}" --stop-after-epoch 1 --out "$T/s" > /dev/null
"$EMBER" train --limit 256 --seed 5 --epochs 2 --no-progress --resume "$T/s/checkpoint.safetensors" --out "$T/s" > "$T/s2.log"
grep -q "model mlp:784-16-10:dropout=0.1 " "$T/s2.log" && grep -q "randomly cropped" "$T/s2.log" ||
  fail "--resume did not take model and augmentation from the checkpoint: $(head -3 "$T/s2.log")"
cmp "$T/u/checkpoint.safetensors" "$T/s/checkpoint.safetensors" || fail "--resume without model options differs from the uninterrupted run"
ok "--resume without --hidden/--dropout/--augment: byte-identical to the uninterrupted run"

# the training settings too ('ember.train'): only --resume and --epochs, with SGD, its own lr,
# momentum, weight decay, batch size, scheduler, label smoothing, clipping, seed and --limit
sgd=(--limit 320 --hidden 16 --optimizer sgd --lr 0.02 --momentum 0.5 --weight-decay 1e-4 --batch-size 32
     --scheduler step --label-smoothing 0.1 --clip-grad-norm 1 --seed 9 --epochs 3 --no-progress)
"$EMBER" train "${sgd[@]}" --out "$T/gu" > /dev/null
"$EMBER" train "${sgd[@]}" --stop-after-epoch 2 --out "$T/gs" > /dev/null
"$EMBER" train --epochs 3 --no-progress --resume "$T/gs/checkpoint.safetensors" > "$T/gs2.log"
grep -q "^settings from the checkpoint: optimizer sgd, lr 0.02, momentum 0.5, weight_decay 0.0001, batch 32, scheduler step, label_smoothing 0.1, clip_grad_norm 1, seed 9, limit 320$" "$T/gs2.log" ||
  fail "--resume: settings line: $(grep settings "$T/gs2.log")"
cmp "$T/gu/checkpoint.safetensors" "$T/gs/checkpoint.safetensors" || fail "--resume with only --epochs differs from the uninterrupted SGD run"
# an explicit option wins over the checkpoint's
"$EMBER" train --epochs 4 --lr 0.01 --no-progress --resume "$T/gu/checkpoint.safetensors" > "$T/gu2.log"
grep -q "SGD lr 0.01," "$T/gu2.log" && ! grep -q "settings from the checkpoint: .*lr 0.02" "$T/gu2.log" ||
  fail "--resume --lr 0.01: $(head -4 "$T/gu2.log")"
ok "--resume with only --epochs: optimizer, lr, batch, scheduler, seed, ... from the checkpoint (byte-identical); an explicit --lr wins"

# --init-from a PyTorch state_dict (tests/fixtures/gen_init_from_fixture.py): with a vanishing lr the
# validation loss and accuracy are PyTorch's on the same 256 test images
read -r _ ploss _ pacc < "$HERE/fixtures/init_mlp16.txt"
"$EMBER" train "${tiny[@]}" --lr 1e-30 --init-from "$HERE/fixtures/init_mlp16.safetensors" --out "$T/i" > "$T/i.log"
grep -q "^weights from .*init_mlp16.safetensors (a new run" "$T/i.log" || fail "--init-from: no weights line"
row=$(grep '^epoch 1/1 ' "$T/i.log") || fail "--init-from: no epoch 1 row: $(cat "$T/i.log")"
eloss=$(echo "$row" | awk '{print $5}')
eacc=$(echo "$row" | awk '{print $6}')
awk -v a="$eloss" -v b="$ploss" -v c="$eacc" -v d="$pacc" 'BEGIN { e = a - b; f = c - d; if (e < 0) e = -e; if (f < 0) f = -f; exit !(e < 2e-4 && f < 1e-4) }' ||
  fail "--init-from: val loss $eloss acc $eacc, PyTorch $ploss $pacc"
run "$EMBER" train "${tiny[@]}" --hidden 32 --init-from "$HERE/fixtures/init_mlp16.safetensors" --out "$T/i2"
[ "$rc" = 1 ] && grep -q "key '1.weight': shape \[16, 784\] in file, \[32, 784\] in model" "$T/err.log" ||
  fail "--init-from another model: rc $rc: $(cat "$T/err.log")"
[ ! -e "$T/i2" ] || fail "--init-from another model wrote $T/i2"
# from a checkpoint (best.safetensors): its model is used, a fresh run from epoch 1
"$EMBER" train --limit 256 --epochs 1 --no-progress --init-from "$T/base/best.safetensors" --out "$T/i3" > "$T/i3.log"
grep -q "model mlp:784-16-10 " "$T/i3.log" && grep -q "^epoch 1/1 " "$T/i3.log" || fail "--init-from a checkpoint: $(cat "$T/i3.log")"
if grep -q "resumed" "$T/i3.log"; then fail "--init-from resumed instead of starting a new run"; fi
ok "--init-from: PyTorch weights give PyTorch's loss ($eloss vs $ploss) and accuracy ($eacc vs $pacc); another model is an error naming key and shapes; from a checkpoint"
# ---- a diverged run: NaN outputs -------------------------------------------
# training warns once; NaN samples are wrong for top-1 and top-5; predict prints "nan" and exits 1 (it
# used to read FMNIST_CLASSES[-1] and abort with "double free"); eval counts them wrong and says so
"$EMBER" train --limit 2000 --epochs 3 --hidden 16 --lr 1e6 --optimizer sgd --no-progress --out "$T/nan" > "$T/nan.log"
grep -c "^warning: the \(training\|validation\) loss is nan in epoch [0-9]*: the run has diverged (lower --lr?)$" "$T/nan.log" > "$T/nwarn" || true
[ "$(cat "$T/nwarn")" = 1 ] || fail "diverged run: not one divergence warning: $(cat "$T/nan.log")"
awk '/^epoch [23]\/3 / && ($5 != "nan" || $6 != "0.0000" || $7 != "0.0000") { bad = 1 } END { exit bad }' "$T/nan.log" ||
  fail "diverged run: val_acc / val_top5 of a NaN model are not 0: $(cat "$T/nan.log")"
run "$EMBER" predict --checkpoint "$T/nan/checkpoint.safetensors" --index 0,1
[ "$rc" = 1 ] || fail "predict on a NaN model: exit $rc, not 1: $(cat "$T/err.log")"
grep -q "^image 0 (true: Ankle boot):  [A-Za-z/-]* nan  [A-Za-z/-]* nan  [A-Za-z/-]* nan$" "$T/out.log" && grep -q "^image 1 " "$T/out.log" ||
  fail "predict on a NaN model: $(cat "$T/out.log")"
grep -qx "ember predict: the model's outputs are not finite (NaN or inf): the checkpoint has diverged" "$T/err.log" ||
  fail "predict on a NaN model: stderr: $(cat "$T/err.log")"
run "$EMBER" eval --checkpoint "$T/nan/checkpoint.safetensors" --limit 500
[ "$rc" = 0 ] && grep -q "^test loss nan  accuracy 0.0000  top-5 accuracy 0.0000$" "$T/out.log" &&
  grep -q "^500 of 500 samples have non-finite outputs (NaN or inf): counted as wrong, not in the matrix$" "$T/out.log" &&
  grep -q "not finite (NaN or inf) for 500 of 500 samples: the checkpoint has diverged" "$T/err.log" ||
  fail "eval on a NaN model: rc $rc: $(cat "$T/out.log" "$T/err.log")"
ok "diverged run: one warning, top-1 / top-5 0 (train and eval), predict prints nan and exits 1"

# ---- issue #15: --precision ----------------------------------------------------
run "$EMBER" train "${tiny[@]}" --precision f8 --out "$T/p0"
[ "$rc" = 2 ] && grep -qx "ember train: --precision: unknown precision 'f8' (f32, tf32, bf16, f16)" "$T/err.log" && [ ! -e "$T/p0" ] ||
  fail "--precision f8: rc $rc: $(cat "$T/err.log")"
run "$EMBER" train "${tiny[@]}" --epochs 2 --stop-after-epoch 1 --precision bf16 --out "$T/p1"
[ "$rc" = 0 ] && grep -qx "precision: bf16 autocast (matmul/conv in bf16, the rest f32, f32 weights)" "$T/out.log" ||
  fail "--precision bf16: rc $rc: $(cat "$T/out.log" "$T/err.log")"
strings "$T/p1/checkpoint.safetensors" > "$T/p1.meta"
grep -q "precision=bf16" "$T/p1.meta" || fail "the checkpoint does not record precision=bf16"
run "$EMBER" train --no-progress --epochs 2 --resume "$T/p1/checkpoint.safetensors"
[ "$rc" = 0 ] && grep -q "^settings from the checkpoint: .*precision bf16" "$T/out.log" && grep -q "^epoch 2/2 " "$T/out.log" ||
  fail "resume of a bf16 run: rc $rc: $(cat "$T/out.log" "$T/err.log")"
run "$EMBER" train "${tiny[@]}" --precision f16 --out "$T/p2"
[ "$rc" = 0 ] && grep -qx "precision: f16 autocast (matmul/conv in f16, the rest f32, f32 weights), loss scaling" "$T/out.log" ||
  fail "--precision f16: rc $rc: $(cat "$T/out.log" "$T/err.log")"
run "$EMBER" eval --checkpoint "$T/p2/checkpoint.safetensors" --limit 200
[ "$rc" = 0 ] && grep -q "^test loss [0-9.]*  accuracy 0\.[0-9]*" "$T/out.log" || fail "eval of an f16 run: rc $rc: $(cat "$T/out.log" "$T/err.log")"
run "$EMBER" train "${tiny[@]}" --precision f16 --devices cpu,cpu --out "$T/p3"
[ "$rc" = 2 ] && grep -q "^ember train: --precision f16 with several --devices is not supported yet" "$T/err.log" && [ ! -e "$T/p3" ] ||
  fail "--precision f16 --devices cpu,cpu: rc $rc: $(cat "$T/err.log")"
ok "--precision: bad value exit 2; f16 with several --devices exit 2; bf16 recorded in the checkpoint and kept by --resume; f16 trains; eval reads it"

echo "$pass passed, 0 failed"
