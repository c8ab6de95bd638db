#!/usr/bin/env bash
# End-to-end checks of `ember train --model gpt` on a small text made here
# (no corpus needed): --help documents every option; a short run prints one
# table row per evaluation (0, every --eval-interval, the end) and writes
# metrics.csv, checkpoint.safetensors (ember.model = the GPT config,
# ember.tokenizer = bytes) and best.safetensors; bad options exit 2 naming the
# flag and write nothing; a missing corpus exits 1 naming
# scripts/install-deps.sh; --stop-after-iter + --resume ends byte-identical to
# an uninterrupted run; a run folder is never silently replaced; SIGINT exits
# 130 with the command that resumes. Usage: e2e_gpt.sh path/to/ember
set -euo pipefail
EMBER="$1"
T="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
export STARPU_SILENT=1
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

for i in $(seq 1 400); do echo "line $i: to be, or not to be, that is the question; whether 'tis nobler in the mind"; done > "$T/text.txt"
tiny=(--model gpt --data "$T/text.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4
      --iters 30 --eval-interval 10 --eval-iters 2 --warmup 3 --no-progress)

# ---- --help ----
"$EMBER" train --model gpt --help > "$T/help.txt"
for o in --data --iters --eval-interval --eval-iters --batch-size --block-size --n-layer --n-head --n-embd --dropout --lr \
         --min-lr --warmup --weight-decay --beta2 --clip-grad --precision --device --out --resume --seed --progress \
         --no-progress --stop-after-iter --overwrite scripts/install-deps.sh "Exit status"; do
  grep -qF -- "$o" "$T/help.txt" || fail "ember train --model gpt --help does not mention $o"
done
"$EMBER" train --help > "$T/help0.txt"
grep -qF -- "--model gpt" "$T/help0.txt" || fail "ember train --help does not point to --model gpt"
ok "--help documents every option"

# ---- a short run ----
"$EMBER" train "${tiny[@]}" --out "$T/a" > "$T/a.log"
grep -q "^ember train: model gpt (1 layers, 2 heads, width 16, block 16, dropout 0.2; [0-9]* parameters)" "$T/a.log" ||
  fail "no model line: $(cat "$T/a.log")"
grep -qE '^ +train_loss +val_loss +lr +tokens/s +elapsed$' "$T/a.log" || fail "no table header: $(cat "$T/a.log")"
grep -qE '^iter 0/30 +- +[0-9]+\.[0-9]{4} +[0-9.]+e-[0-9]+ +- +[0-9.]+s$' "$T/a.log" || fail "no iteration-0 row: $(cat "$T/a.log")"
for it in 10 20 30; do
  grep -qE "^iter $it/30 +[0-9]+\.[0-9]{4} +[0-9]+\.[0-9]{4} +[0-9.]+e-[0-9]+ +[0-9,]+ +[0-9.]+s$" "$T/a.log" ||
    fail "no row for iteration $it: $(cat "$T/a.log")"
done
grep -q "^final val loss [0-9.]* at iteration 30 " "$T/a.log" || fail "no final line: $(cat "$T/a.log")"
[ "$(head -1 "$T/a/metrics.csv")" = "iter,train_loss,val_loss,lr,tokens_per_s,elapsed_s" ] || fail "metrics.csv header: $(head -1 "$T/a/metrics.csv")"
[ "$(cut -d, -f1 "$T/a/metrics.csv" | tr '\n' ' ')" = "iter 0 10 20 30 " ] || fail "metrics.csv rows: $(cat "$T/a/metrics.csv")"
[ -f "$T/a/checkpoint.safetensors" ] && [ -f "$T/a/best.safetensors" ] || fail "no checkpoint / best: $(ls "$T/a")"
# the loss plot after each evaluation, against the iteration (unless built without cairo)
if [ -f "$T/a/loss.svg" ]; then
  grep -q '>iteration</text>' "$T/a/loss.svg" || fail "loss.svg has no iteration axis"
  [ ! -e "$T/a/accuracy.svg" ] || fail "an accuracy plot for a language model"
else
  "$EMBER" plot "$T/a" > "$T/plot.out" 2>&1 || true
  grep -q "plotting is unavailable" "$T/plot.out" || fail "no loss.svg and plotting is available: $(ls "$T/a")"
fi
grep -aqF '"ember.tokenizer":"bytes"' "$T/a/checkpoint.safetensors" || fail "checkpoint lacks ember.tokenizer = bytes"
grep -aqF '"ember.model":"gpt:vocab_size=256,n_positions=16,n_embd=16,n_layer=1,n_head=2,' "$T/a/checkpoint.safetensors" ||
  fail "checkpoint lacks the GPT config in ember.model"
grep -aqF '"ember.step":"30"' "$T/a/checkpoint.safetensors" || fail "checkpoint lacks ember.step 30"
# the lr column: the anchor's lr_at(i) for the row's last iteration i (warm-up 3, cosine over 30 to 1e-4; row 0: lr_at(0))
bad_lr=$(awk -F, 'NR > 1 { i = ($1 > 0 ? $1 - 1 : 0); W = 3; N = 30
  want = (i < W) ? 1e-3 * (i + 1) / W : 1e-4 + 0.5 * (1 + cos(3.141592653589793 * (i - W) / (N - W))) * (1e-3 - 1e-4)
  d = $4 - want; if (d < 0) d = -d; if (d > 1e-7 * want) print "iter " $1 ": lr " $4 ", lr_at " want }' "$T/a/metrics.csv")
[ -z "$bad_lr" ] || fail "the lr column is not the anchor's lr_at: $bad_lr"
ok "a short run: one row per evaluation, metrics.csv (lr = the anchor's lr_at), checkpoint with ember.model / ember.tokenizer, best"

# ---- bad options: exit 2, the flag named, nothing written ----
cases=(
  "--iters 0|--iters: 0 is out of range (expected an integer in [1, 1000000000])"
  "--iters abc|--iters: 'abc' is not"
  "--iters 1e3|--iters: '1e3' is not"
  "--eval-interval -1|--eval-interval: -1 is out of range"
  "--eval-iters -1|--eval-iters: -1 is out of range"
  "--batch-size 0|--batch-size: 0 is out of range"
  "--block-size 0|--block-size: 0 is out of range"
  "--n-layer 0|--n-layer: 0 is out of range"
  "--n-head 0|--n-head: 0 is out of range"
  "--n-embd 0|--n-embd: 0 is out of range"
  "--n-head 3|--n-embd 16 is not a multiple of --n-head 3"
  "--dropout 1|--dropout: 1 is out of range (expected a number in [0, 1))"
  "--lr 0|--lr: 0 is out of range"
  "--lr -1|--lr: -1 is out of range"
  "--min-lr -1|--min-lr: -1 is out of range"
  "--min-lr 1|--min-lr 1 is above --lr 0.001"
  "--warmup 30|--warmup 30 must be below --iters 30"
  "--weight-decay -0.1|--weight-decay: -0.1 is out of range"
  "--beta2 1|--beta2: 1 is out of range (expected a number in [0, 1))"
  "--clip-grad -1|--clip-grad: -1 is out of range"
  "--seed -1|--seed: -1 is out of range"
  "--stop-after-iter 0|--stop-after-iter: 0 is out of range"
  "--precision fp8|--precision: unknown precision 'fp8'"
  "--device nowhere|--device:"
  "--bogus|--bogus"
  "--iters|--iters"
  "extra|unexpected argument 'extra'"
  "--model cnn|a GPT run takes --model gpt only"
)
for c in "${cases[@]}"; do
  IFS='|' read -r args want <<< "$c"
  read -r -a argv <<< "$args"
  set +e
  if [ "${argv[*]: -1}" = "--iters" ]; then "$EMBER" train "${tiny[@]}" --out "$T/usage" "${argv[@]}" > "$T/out.log" 2> "$T/err.log"
  else "$EMBER" train "${tiny[@]}" "${argv[@]}" --out "$T/usage" > "$T/out.log" 2> "$T/err.log"; fi
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "'ember train --model gpt $args' exited $rc, not 2: $(cat "$T/err.log")"
  grep -qF -- "$want" "$T/err.log" || fail "'$args': stderr lacks \"$want\": $(cat "$T/err.log")"
  [ ! -e "$T/usage" ] || fail "'$args' wrote $T/usage"
  [ ! -s "$T/out.log" ] || fail "'$args' printed to stdout: $(cat "$T/out.log")"
done
ok "${#cases[@]} bad options exit 2 naming the flag, nothing written"

# ---- missing data: exit 1, the corpus' installer named ----
set +e
EMBER_SHAKESPEARE="$T/none.txt" "$EMBER" train --model gpt --iters 5 --warmup 1 --out "$T/nocorpus" > /dev/null 2> "$T/nc.err"
rc=$?
set -e
[ "$rc" = 1 ] || fail "missing corpus: exit $rc, not 1"
grep -qF "the Shakespeare corpus $T/none.txt is missing: scripts/install-deps.sh installs it" "$T/nc.err" || fail "missing corpus: $(cat "$T/nc.err")"
[ ! -e "$T/nocorpus" ] || fail "missing corpus: the run folder was made"
set +e
"$EMBER" train "${tiny[@]}" --data "$T/nothere.txt" --out "$T/nodata" > /dev/null 2> "$T/nd.err"
rc=$?
set -e
[ "$rc" = 1 ] && grep -qF -- "--data $T/nothere.txt: No such file or directory" "$T/nd.err" || fail "missing --data: exit $rc: $(cat "$T/nd.err")"
head -c 20 "$T/text.txt" > "$T/short.txt"
set +e
"$EMBER" train "${tiny[@]}" --data "$T/short.txt" --out "$T/short" > /dev/null 2> "$T/sh.err"
rc=$?
set -e
[ "$rc" = 2 ] && grep -qF "too few for one window of --block-size 16" "$T/sh.err" || fail "a too short text: exit $rc: $(cat "$T/sh.err")"
ok "a missing corpus names scripts/install-deps.sh (exit 1); a missing or too short --data file is refused"

# ---- stop + resume: byte-identical to the uninterrupted run ----
"$EMBER" train "${tiny[@]}" --stop-after-iter 20 --out "$T/b" > "$T/b.log"
grep -q "^stopping after iteration 20 as asked" "$T/b.log" || fail "--stop-after-iter: $(cat "$T/b.log")"
"$EMBER" train --resume "$T/b/checkpoint.safetensors" --no-progress > "$T/b2.log"
grep -q "^resumed from $T/b/checkpoint.safetensors at iteration 20$" "$T/b2.log" || fail "resume not reported: $(cat "$T/b2.log")"
grep -q "^run folder: $T/b (the folder of --resume)$" "$T/b2.log" || fail "resume not in place: $(cat "$T/b2.log")"
cmp "$T/a/checkpoint.safetensors" "$T/b/checkpoint.safetensors" || fail "resumed run differs from the uninterrupted one"
cmp "$T/a/best.safetensors" "$T/b/best.safetensors" || fail "resumed run's best differs from the uninterrupted one's"
[ "$(cut -d, -f1-4 "$T/a/metrics.csv")" = "$(cut -d, -f1-4 "$T/b/metrics.csv")" ] ||
  fail "resumed metrics differ: $(cat "$T/a/metrics.csv") vs $(cat "$T/b/metrics.csv")"
# nothing left to train, a disagreeing model option, a weights-only file: refused (exit 2), nothing changed
set +e
"$EMBER" train --resume "$T/b/checkpoint.safetensors" > /dev/null 2> "$T/r1.err"; r1=$?
"$EMBER" train --resume "$T/b/checkpoint.safetensors" --iters 40 --n-layer 2 > /dev/null 2> "$T/r2.err"; r2=$?
"$EMBER" train --resume "$T/b/best.safetensors" --iters 40 > /dev/null 2> "$T/r3.err"; r3=$?
set -e
[ "$r1" = 2 ] && grep -qF "has done 30 iterations and --iters is 30" "$T/r1.err" || fail "resume of a finished run: exit $r1: $(cat "$T/r1.err")"
[ "$r2" = 2 ] && grep -qF -- "--n-layer disagrees" "$T/r2.err" || fail "resume with another --n-layer: exit $r2: $(cat "$T/r2.err")"
[ "$r3" = 2 ] && grep -qF "no optimizer state" "$T/r3.err" || fail "resume of best.safetensors: exit $r3: $(cat "$T/r3.err")"
cmp "$T/a/checkpoint.safetensors" "$T/b/checkpoint.safetensors" || fail "a refused resume changed the checkpoint"
# resumed with more iterations into another folder: the history comes along
"$EMBER" train --resume "$T/b/checkpoint.safetensors" --iters 40 --out "$T/c" --no-progress > "$T/c.log"
[ "$(cut -d, -f1 "$T/c/metrics.csv" | tr '\n' ' ')" = "iter 0 10 20 30 40 " ] || fail "resume elsewhere: rows $(cat "$T/c/metrics.csv")"
grep -q "^settings from the checkpoint: eval_interval 10, eval_iters 2, batch 4, warmup 3, lr 0.001, min_lr 0.0001, weight_decay 0.1, beta2 0.99, clip_grad 1, seed 1337, precision f32$" "$T/c.log" ||
  fail "settings from the checkpoint: $(cat "$T/c.log")"
ok "--stop-after-iter + --resume is byte-identical to an uninterrupted run; bad resumes refused"

# ---- run folders: a run is never silently replaced ----
set +e
"$EMBER" train "${tiny[@]}" --out "$T/a" > /dev/null 2> "$T/o.err"
rc=$?
set -e
[ "$rc" = 2 ] && grep -qF "$T/a already holds a run" "$T/o.err" || fail "--out holding a run: exit $rc: $(cat "$T/o.err")"
"$EMBER" train "${tiny[@]}" --seed 2 --out "$T/a" --overwrite > "$T/ow.log"
grep -q "^--overwrite: removed [0-9]* files of the earlier run in $T/a$" "$T/ow.log" || fail "--overwrite: $(cat "$T/ow.log")"
if cmp -s "$T/a/checkpoint.safetensors" "$T/b/checkpoint.safetensors"; then fail "--overwrite kept the old checkpoint"; fi
ok "--out holding a run refused (exit 2), --overwrite replaces it"

# ---- SIGINT: exit 130, the last checkpoint named, the resume command works ----
"$EMBER" train "${tiny[@]}" --iters 1000000 --eval-interval 10 --out "$T/i" > "$T/i.log" 2> "$T/i.err" &
pid=$!
pids+=("$pid")
for _ in $(seq 1 3000); do
  grep -q "^iter 10/" "$T/i.log" && break
  kill -0 "$pid" 2> /dev/null || fail "the run to interrupt ended: $(cat "$T/i.err")"
  sleep 0.01
done
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 130 ] || fail "SIGINT: exit $rc, not 130: $(cat "$T/i.err")"
grep -q "^ember train: interrupted at iteration [0-9]*.*; the iterations since the last evaluation were not saved, the last checkpoint is $T/i/checkpoint.safetensors (iteration [0-9]*)$" "$T/i.err" ||
  fail "SIGINT: message: $(cat "$T/i.err")"
grep -q "^interrupted: resume with: ember train .*--resume $T/i/checkpoint.safetensors$" "$T/i.err" || fail "SIGINT: no resume command: $(cat "$T/i.err")"
at=$(sed -n 's/.*(iteration \([0-9]*\))$/\1/p' "$T/i.err")
last_row=$(tail -1 "$T/i/metrics.csv" | cut -d, -f1)
[ "$at" = "$last_row" ] || fail "SIGINT: the checkpoint's iteration $at is not the last metrics row $last_row"
"$EMBER" train "${tiny[@]}" --iters 1000000 --eval-interval 10 --resume "$T/i/checkpoint.safetensors" --stop-after-iter $((at + 10)) > "$T/i2.log"
grep -q "^resumed from $T/i/checkpoint.safetensors at iteration $at$" "$T/i2.log" || fail "SIGINT: resume: $(cat "$T/i2.log")"
ok "SIGINT at iteration > $at: exit 130, the resume command, the checkpoint resumes"
