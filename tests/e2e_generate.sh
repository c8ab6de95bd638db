#!/usr/bin/env bash
# End-to-end checks of `ember generate` (issue #16, item 5), on tiny GPT
# checkpoints written by tests/gpt_checkpoint.c the way `ember train --model
# gpt` writes them (ember.model = em_gpt2_config_format, ember.tokenizer =
# bytes):
# - listed in `ember --help`; `ember generate --help`;
# - strict flags: a bad number, an unknown option, a missing value, a stray
#   operand, an empty prompt or stop string, a bad device, more new tokens
#   than the context holds: exit 2 naming the flag and value;
# - bad checkpoints: a missing file, a file that is not SafeTensors, no
#   'ember.model', a model that is not a GPT, no 'ember.tokenizer', an
#   unsupported tokenizer, a malformed config, tensors that do not match the
#   config, no checkpoint keys: exit 1 naming the file and the cause;
# - stdout is the prompt, then one byte per new token (byte tokenizer), then
#   a newline; stderr has the summary (tokens, prefill, tokens/s); the
#   default --max-new-tokens fills the context;
# - the same seed gives the same bytes, another seed others; greedy twice is
#   the same, and --top-k 1 is greedy;
# - --stop: the text ends just before the first occurrence of the stop
#   string in the generated text, which is otherwise the text of the same
#   run without --stop.
# Usage: e2e_generate.sh path/to/ember path/to/gpt_checkpoint
set -euo pipefail
EMBER="$1"
WRITE="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1 LC_ALL=C
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
# expect RC TEXT CMD...: the exit status is RC and stderr contains TEXT
expect() {
  local want="$1" text="$2"
  shift 2
  run "$@"
  [ "$rc" = "$want" ] || { cat "$T/err.log" >&2; fail "'${*:2}': exit $rc, expected $want"; }
  grep -F -q -- "$text" "$T/err.log" || { cat "$T/err.log" >&2; fail "'${*:2}': stderr lacks '$text'"; }
  ok "exit $want: ${*:2} -> $text"
}
size() { stat -c %s "$1"; }

for k in ok no-model no-tokenizer tokenizer-bpe mlp bad-config mismatch small-vocab padded-vocab no-format; do
  "$WRITE" "$T/$k.safetensors" "$k" || fail "gpt_checkpoint $k"
done
CK="$T/ok.safetensors"

# ---- help ------------------------------------------------------------------------
run "$EMBER" --help
[ "$rc" = 0 ] && grep -q "^  generate " "$T/out.log" || fail "ember --help does not list generate"
ok "ember --help lists generate"
run "$EMBER" generate --help
[ "$rc" = 0 ] && grep -q -- "--top-p P" "$T/out.log" && grep -q "Exit status" "$T/out.log" || fail "ember generate --help"
ok "ember generate --help"

# ---- usage errors: exit 2 --------------------------------------------------------
expect 2 "--checkpoint FILE is required" "$EMBER" generate --prompt hi
expect 2 "--temperature: -1 is out of range (expected a finite number >= 0)" "$EMBER" generate --checkpoint "$CK" --temperature -1
expect 2 "--temperature: 'abc' is not a number" "$EMBER" generate --checkpoint "$CK" --temperature abc
expect 2 "--temperature: 'nan' is not a finite number" "$EMBER" generate --checkpoint "$CK" --temperature nan
expect 2 "--top-p: 0 is out of range (expected a number in (0, 1])" "$EMBER" generate --checkpoint "$CK" --top-p 0
expect 2 "--top-p: 1.5 is out of range" "$EMBER" generate --checkpoint "$CK" --top-p 1.5
expect 2 "--top-k: -1 is out of range (expected an integer >= 0)" "$EMBER" generate --checkpoint "$CK" --top-k -1
expect 2 "--top-k: '1.5' is not an integer" "$EMBER" generate --checkpoint "$CK" --top-k 1.5
expect 2 "--max-new-tokens: 0 is out of range" "$EMBER" generate --checkpoint "$CK" --max-new-tokens 0
expect 2 "--max-new-tokens: '1e3' is not an integer" "$EMBER" generate --checkpoint "$CK" --max-new-tokens 1e3
expect 2 "--seed: -1 is out of range" "$EMBER" generate --checkpoint "$CK" --seed -1
expect 2 "--seed: '12x' is not an integer" "$EMBER" generate --checkpoint "$CK" --seed 12x
expect 2 "--prompt: the prompt is empty" "$EMBER" generate --checkpoint "$CK" --prompt ""
expect 2 "--stop: the stop string is empty" "$EMBER" generate --checkpoint "$CK" --stop ""
expect 2 "unknown option '--batch'" "$EMBER" generate --checkpoint "$CK" --batch 2
expect 2 "--seed needs a value" "$EMBER" generate --checkpoint "$CK" --seed
expect 2 "unexpected argument 'extra'" "$EMBER" generate --checkpoint "$CK" extra
expect 2 "--device:" "$EMBER" generate --checkpoint "$CK" --device gpu7
# the context: n_positions 64; a 4-byte prompt leaves 60
expect 2 "--max-new-tokens 61: the prompt (4 tokens) + 61 new tokens exceed the model's context n_positions = 64; give at most 60" \
  "$EMBER" generate --checkpoint "$CK" --prompt "abcd" --max-new-tokens 61
long="$(printf 'x%.0s' $(seq 64))"
expect 2 "the prompt is 64 tokens, the model's context n_positions = 64 leaves no room" "$EMBER" generate --checkpoint "$CK" --prompt "$long"
expect 2 "byte 1 of the prompt is token 200, outside the model's vocabulary of 100" \
  "$EMBER" generate --checkpoint "$T/small-vocab.safetensors" --prompt "a$(printf '\310')"

# ---- bad checkpoints: exit 1 -----------------------------------------------------
expect 1 "$T/none.safetensors" "$EMBER" generate --checkpoint "$T/none.safetensors"
echo "not a checkpoint" > "$T/text.safetensors"
expect 1 "text.safetensors" "$EMBER" generate --checkpoint "$T/text.safetensors"
expect 1 "no-model.safetensors: no 'ember.model' metadata" "$EMBER" generate --checkpoint "$T/no-model.safetensors"
expect 1 "the model is 'mlp:784-256-128-10' (metadata 'ember.model'), not a GPT" "$EMBER" generate --checkpoint "$T/mlp.safetensors"
expect 1 "no 'ember.tokenizer' metadata" "$EMBER" generate --checkpoint "$T/no-tokenizer.safetensors"
expect 1 "tokenizer 'gpt2-bpe' (metadata 'ember.tokenizer') is not supported: only 'bytes'" \
  "$EMBER" generate --checkpoint "$T/tokenizer-bpe.safetensors"
expect 1 "metadata 'ember.model': em_gpt2_config_parse: bad integer 'abc' for 'vocab_size'" \
  "$EMBER" generate --checkpoint "$T/bad-config.safetensors"
expect 1 "model.transformer.wte.weight" "$EMBER" generate --checkpoint "$T/mismatch.safetensors"
expect 1 "not an Ember checkpoint" "$EMBER" generate --checkpoint "$T/no-format.safetensors"

# ---- generation ------------------------------------------------------------------
gen() { # gen OUTFILE ARGS...: a successful run, stdout in OUTFILE, stderr in OUTFILE.err
  local o="$1"
  shift
  "$EMBER" generate --checkpoint "$CK" "$@" > "$o" 2> "$o.err" || { cat "$o.err" >&2; fail "generate $*"; }
}
P="To be"
gen "$T/a" --prompt "$P" --max-new-tokens 40 --seed 1
[ "$(size "$T/a")" = $((5 + 40 + 1)) ] || fail "stdout is not prompt + 40 bytes + newline ($(size "$T/a") bytes)"
[ "$(head -c 5 "$T/a")" = "$P" ] || fail "stdout does not start with the prompt"
[ "$(tail -c 1 "$T/a" | od -An -tx1 | tr -d ' ')" = 0a ] || fail "stdout does not end with a newline"
grep -q "prompt 5 tokens, generated 40 tokens (stopped by max-new-tokens); prefill .* ms .*decode 39 tokens in .* s = .* tokens/s" "$T/a.err" \
  || { cat "$T/a.err" >&2; fail "no summary on stderr"; }
grep -q "model gpt:vocab_size=256,n_positions=64,n_embd=32,n_layer=2,n_head=4" "$T/a.err" || fail "the model line"
ok "prompt + 40 bytes + newline on stdout, summary on stderr"
gen "$T/a2" --prompt "$P" --max-new-tokens 40 --seed 1 --device cpu
cmp -s "$T/a" "$T/a2" || fail "the same seed gave different text"
gen "$T/b" --prompt "$P" --max-new-tokens 40 --seed 2
! cmp -s "$T/a" "$T/b" || fail "seeds 1 and 2 gave the same text"
ok "same seed -> same bytes, another seed -> others"
gen "$T/g1" --prompt "$P" --max-new-tokens 30 --temperature 0 --seed 1
gen "$T/g2" --prompt "$P" --max-new-tokens 30 --temperature 0 --seed 9
gen "$T/k1" --prompt "$P" --max-new-tokens 30 --top-k 1 --temperature 1.5 --seed 4
cmp -s "$T/g1" "$T/g2" || fail "greedy depends on the seed"
cmp -s "$T/g1" "$T/k1" || fail "--top-k 1 is not greedy"
gen "$T/p" --prompt "$P" --max-new-tokens 30 --top-p 0.5 --top-k 0 --seed 4
ok "greedy ignores the seed, --top-k 1 = --temperature 0, --top-p runs"
# a vocabulary padded past the tokenizer's 256 ids: only byte ids are drawn (an id >= 256 would fail to decode)
"$EMBER" generate --checkpoint "$T/padded-vocab.safetensors" --prompt "$P" --max-new-tokens 58 --temperature 2 --top-k 0 \
  > "$T/pad" 2> "$T/pad.err" || { cat "$T/pad.err" >&2; fail "padded vocabulary"; }
[ "$(size "$T/pad")" = $((5 + 58 + 1)) ] || fail "padded vocabulary: $(size "$T/pad") bytes"
# the small vocabulary (100 ids): every generated byte is below 100
"$EMBER" generate --checkpoint "$T/small-vocab.safetensors" --prompt "AB C" --max-new-tokens 58 --temperature 2 --top-k 0 \
  > "$T/small" 2> "$T/small.err" || { cat "$T/small.err" >&2; fail "small vocabulary"; }
big=$(dd if="$T/small" bs=1 skip=4 count=58 status=none | od -An -tu1 -v | tr -s ' ' '\n' | awk '$1 >= 100' | wc -l)
[ "$big" = 0 ] || fail "small vocabulary: $big generated bytes >= 100"
ok "a padded vocabulary draws byte ids only; a 100-id vocabulary draws ids < 100"
gen "$T/full" --prompt "$P"
[ "$(size "$T/full")" = $((64 + 1)) ] || fail "the default --max-new-tokens does not fill the context ($(size "$T/full") bytes)"
grep -q "generated 59 tokens" "$T/full.err" || fail "default: 59 new tokens"
ok "default --max-new-tokens fills n_positions"

# --stop: two bytes of run a's generated text (no NUL, no newline), from offset 15 on
stop=""
for off in $(seq 15 42); do
  dd if="$T/a" of="$T/s" bs=1 skip="$off" count=2 status=none
  [ "$(od -An -tx1 "$T/s" | grep -c -E '(^| )(00|0a)( |$)' || true)" = 0 ] || continue
  stop="$(cat "$T/s"; echo x)"
  stop="${stop%x}"
  break
done
[ -n "$stop" ] || fail "no usable stop string in run a's text"
gen "$T/st" --prompt "$P" --max-new-tokens 40 --seed 1 --stop="$stop"
n=$(( $(size "$T/st") - 1 ))              # the text without the final newline
[ "$n" -ge 5 ] && [ "$n" -le "$off" ] || fail "stop: $n bytes of text, expected 5..$off"
cmp -s -n "$n" "$T/a" "$T/st" || fail "stop: the text is not the start of the run without --stop"
dd if="$T/a" of="$T/after" bs=1 skip="$n" count=2 status=none
cmp -s "$T/after" "$T/s" || fail "stop: the text does not end just before the stop string"
dd if="$T/st" of="$T/gen" bs=1 skip=5 count=$((n - 5)) status=none
! grep -a -F -q -- "$stop" "$T/gen" || fail "stop: the printed text contains the stop string"
grep -q "stopped by the stop string" "$T/st.err" || fail "stop: the summary does not say why it stopped"
ok "--stop cuts the text before the stop string ($n bytes)"

echo "e2e_generate: $pass checks passed"
