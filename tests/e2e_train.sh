#!/usr/bin/env bash
# End-to-end checks of `ember train/eval/predict` on Fashion-MNIST with a small
# MLP and a CNN on a subset: an interrupted + resumed run ends byte-identical to an uninterrupted
# one (also with two replicas in one process, --devices cpu,cpu); eval
# reproduces the final test accuracy; bad input fails cleanly and overwrites
# nothing. Usage: e2e_train.sh path/to/ember
set -euo pipefail
EMBER="$1"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1
common=(--hidden 32 --batch-size 256 --seed 7 --no-progress --workers 2)
fail() { echo "FAIL: $*" >&2; exit 1; }

"$EMBER" train "${common[@]}" --epochs 3 --out "$T/a" > "$T/a.log"
"$EMBER" train "${common[@]}" --epochs 3 --stop-after-epoch 2 --out "$T/b" > "$T/b.log"
grep -q "stopping after epoch 2" "$T/b.log" || fail "--stop-after-epoch ignored"
"$EMBER" train "${common[@]}" --epochs 3 --out "$T/b" --resume "$T/b/checkpoint.safetensors" > "$T/b2.log"
grep -q "resumed from" "$T/b2.log" || fail "resume not reported"
cmp "$T/a/checkpoint.safetensors" "$T/b/checkpoint.safetensors" || fail "resumed run differs from the uninterrupted one"
echo "ok: resumed run is byte-identical to the uninterrupted one"

# step capture (issue #17): the Learner (as run "a" above, by default) captures the second step of
# each epoch and replays it; the same run with capture off, and with fusion off too, ends
# byte-identical (the resumed run "b" above was captured too)
EMBER_LOG=debug "$EMBER" train "${common[@]}" --epochs 1 --out "$T/cap" > /dev/null 2> "$T/cap.err"
grep -q "step captured: " "$T/cap.err" || fail "the Learner did not capture its step: $(grep -i 'eagerly\|captur' "$T/cap.err")"
EMBER_CAPTURE=0 "$EMBER" train "${common[@]}" --epochs 3 --out "$T/nc" > "$T/nc.log"
cmp "$T/a/checkpoint.safetensors" "$T/nc/checkpoint.safetensors" || fail "capture on and off: different checkpoints"
EMBER_CAPTURE=0 EMBER_FUSION=0 "$EMBER" train "${common[@]}" --epochs 3 --out "$T/nf" > "$T/nf.log"
cmp "$T/a/checkpoint.safetensors" "$T/nf/checkpoint.safetensors" || fail "fusion and capture on and off: different checkpoints"
echo "ok: capture and fusion on / off, and a captured run resumed: byte-identical checkpoints"

acc_train=$(grep '^final test accuracy' "$T/a.log" | awk '{print $4}')
acc_eval=$("$EMBER" eval --checkpoint "$T/a/checkpoint.safetensors" | awk '/^test loss/ {print $5}')
[ "$acc_train" = "$acc_eval" ] || fail "eval accuracy $acc_eval != training's final $acc_train"
echo "ok: eval reproduces accuracy $acc_eval"
"$EMBER" predict --checkpoint "$T/a/best.safetensors" --index 0,1 > "$T/predict.log"
grep -q "image 1 (true: Pullover)" "$T/predict.log" || fail "predict output"
echo "ok: predict"

# [dist] one process, two replicas (--devices): a resumed run is byte-identical
# too (resume copies replica 0 into the others), and the accuracy is that of
# one model with the same total batch (2 x 128 = 256 as above)
rep=(--hidden 32 --batch-size 128 --seed 7 --no-progress --workers 2 --devices cpu,cpu)
"$EMBER" train "${rep[@]}" --epochs 3 --out "$T/r" > "$T/r.log"
grep -q "replicas: 2 in this process" "$T/r.log" || fail "--devices: no replicas line: $(head -5 "$T/r.log")"
"$EMBER" train "${rep[@]}" --epochs 3 --stop-after-epoch 2 --out "$T/r2" > /dev/null
"$EMBER" train "${rep[@]}" --epochs 3 --out "$T/r2" --resume "$T/r2/checkpoint.safetensors" > /dev/null
cmp "$T/r/checkpoint.safetensors" "$T/r2/checkpoint.safetensors" || fail "--devices: resumed run differs from the uninterrupted one"
acc_rep=$(grep '^final test accuracy' "$T/r.log" | awk '{print $4}')
awk -v a="$acc_rep" -v b="$acc_train" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.01) }' ||
  fail "--devices cpu,cpu accuracy $acc_rep is not within 0.01 of the single model's $acc_train"
echo "ok: --devices cpu,cpu: accuracy $acc_rep (one model: $acc_train), resumed run byte-identical"
# dropout in replica threads: one random stream per replica, so a seeded run repeats exactly
"$EMBER" train "${rep[@]}" --dropout 0.2 --epochs 1 --out "$T/d1" > /dev/null
"$EMBER" train "${rep[@]}" --dropout 0.2 --epochs 1 --out "$T/d2" > /dev/null
cmp "$T/d1/checkpoint.safetensors" "$T/d2/checkpoint.safetensors" || fail "--devices with dropout: two seeded runs differ"
echo "ok: --devices cpu,cpu with dropout: two seeded runs are byte-identical"
if "$EMBER" train "${rep[@]/cpu,cpu/cpu,cuda:9}" --epochs 1 --out "$T/r3" 2> "$T/err4.log" >/dev/null; then fail "--devices with a missing GPU accepted"; fi
grep -q "cuda:9" "$T/err4.log" || fail "missing-device error does not name it: $(cat "$T/err4.log")"

# the CNN (--model cnn) on a subset: seeded augmentation gives byte-identical
# checkpoints with 1 and 3 loader threads; eval and predict need no model
# options (spec and normalisation come from the checkpoint) and agree with
# training; BatchNorm's running statistics are saved under PyTorch's keys
cnn=(--model cnn --limit 384 --batch-size 64 --epochs 1 --seed 3 --no-progress)
"$EMBER" train "${cnn[@]}" --workers 1 --out "$T/cnn1" > "$T/cnn1.log"
"$EMBER" train "${cnn[@]}" --workers 3 --out "$T/cnn3" > "$T/cnn3.log"
grep -q "model cnn:1x28x28-" "$T/cnn1.log" || fail "--model cnn: no model line: $(head -2 "$T/cnn1.log")"
grep -q "randomly cropped (padding 2) and flipped" "$T/cnn1.log" || fail "--model cnn: augmentation not on by default"
cmp "$T/cnn1/checkpoint.safetensors" "$T/cnn3/checkpoint.safetensors" || fail "--model cnn: 1 and 3 loader threads give different models"
# the header is read into a file first: `head | grep -q` under pipefail fails
# whenever grep exits at its match before head has written everything (SIGPIPE)
head -c 20000 "$T/cnn1/checkpoint.safetensors" > "$T/cnn1.hdr"
head -c 20000 "$T/a/checkpoint.safetensors" > "$T/a.hdr"
for key in '"model.0.weight"' '"model.1.running_mean"' '"model.1.num_batches_tracked"' '"ember.norm_mean"' '"ember.norm_std"'; do
  grep -aq "$key" "$T/cnn1.hdr" || fail "cnn checkpoint lacks $key"
done
if grep -aq '"model.0.bias"' "$T/cnn1.hdr"; then fail "conv before BatchNorm has a bias"; fi
acc_cnn=$(grep '^final test accuracy' "$T/cnn1.log" | awk '{print $4}')
acc_cnn_eval=$("$EMBER" eval --checkpoint "$T/cnn1/checkpoint.safetensors" --limit 384 | awk '/^test loss/ {print $5}')
[ "$acc_cnn" = "$acc_cnn_eval" ] || fail "cnn: eval accuracy $acc_cnn_eval != training's final $acc_cnn"
"$EMBER" predict --checkpoint "$T/cnn1/best.safetensors" --index 0,1 > "$T/cnn_predict.log"
grep -q "image 1 (true: Pullover)" "$T/cnn_predict.log" || fail "cnn: predict output"
"$EMBER" train "${cnn[@]}" --no-augment --out "$T/cnn0" > "$T/cnn0.log"
if grep -q "randomly cropped" "$T/cnn0.log"; then fail "--no-augment ignored"; fi
cmp -s "$T/cnn0/checkpoint.safetensors" "$T/cnn1/checkpoint.safetensors" && fail "--no-augment trains the same model"
# an MLP checkpoint also carries its normalisation now
grep -aq '"ember.norm_mean"' "$T/a.hdr" || fail "mlp checkpoint lacks ember.norm_mean"
# usage errors: exit 2, and nothing written
for args in "--model resnet" "--model cnn --hidden 32" "--model cnn:1x28x28-10" "--model cnn:1x28x28-32x2" \
            "--model cnn:1x28x28-fc64-32-10" "--model cnn:1x28x28-32-32-32-32-32-10" "--model cnn:3x32x32-32-10" \
            "--model mlp:784-32-10 --hidden 16" "--model cnn --dropout 1.5"; do
  set +e
  # shellcheck disable=SC2086
  "$EMBER" train $args --limit 64 --epochs 1 --out "$T/usage" > /dev/null 2> "$T/usage.log"
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "'ember train $args' exited with $rc, not 2: $(cat "$T/usage.log")"
  [ ! -e "$T/usage" ] || fail "'ember train $args' wrote files"
done
echo "ok: --model cnn: augmented runs identical with 1 and 3 loader threads, eval ($acc_cnn_eval) and predict from the checkpoint alone, usage errors exit 2"

# bad input: nothing is overwritten
sum_before=$(md5sum "$T/a/checkpoint.safetensors" "$T/a/best.safetensors" "$T/a/metrics.csv")
if "$EMBER" train "${common[@]}" --hidden 64 --epochs 4 --out "$T/a" --resume "$T/a/checkpoint.safetensors" 2> "$T/err.log" >/dev/null; then
  fail "resuming with another model succeeded"
fi
grep -q "holds model mlp:784-32-10, but the options (--hidden 64) give mlp:784-64-10" "$T/err.log" ||
  fail "no message naming both models: $(cat "$T/err.log")"
head -c 100 "$T/a/checkpoint.safetensors" > "$T/trunc.safetensors"
if "$EMBER" eval --checkpoint "$T/trunc.safetensors" 2> "$T/err2.log" >/dev/null; then fail "truncated checkpoint accepted"; fi
grep -q "trunc.safetensors" "$T/err2.log" || fail "error does not name the file: $(cat "$T/err2.log")"
if "$EMBER" train --data "$T/nonexistent" --epochs 1 --out "$T/c" 2> "$T/err3.log" >/dev/null; then fail "missing data accepted"; fi
grep -q "nonexistent" "$T/err3.log" || fail "missing-data error does not name the folder"
[ "$sum_before" = "$(md5sum "$T/a/checkpoint.safetensors" "$T/a/best.safetensors" "$T/a/metrics.csv")" ] || fail "a failed run modified files"
echo "ok: bad input fails cleanly, nothing overwritten"
echo "1 passed, 0 failed"
