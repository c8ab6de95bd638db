#!/usr/bin/env bash
# End-to-end checks of `ember convert IN.pt OUT.safetensors` on the torch
# fixtures (tests/fixtures/make_pt_fixtures.py): the one-line report, the
# keys, dtypes and shapes written, --rename, a nested checkpoint; errors
# (legacy format, truncated file, unsupported input, bad --rename, bad
# operands) exit 1 or 2 with a message naming the file, leave no OUT, no
# temporary file and an existing OUT untouched.
# Usage: e2e_convert.sh path/to/ember path/to/tests/fixtures
set -euo pipefail
EMBER="$1"
FX="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -aqF -- "$2" "$1" || fail "$1 does not contain: $2 ($(head -c 600 "$1"))"; }
run() { set +e; "$EMBER" "$@" > "$T/out" 2> "$T/err"; rc=$?; set -e; }

cp "$FX/pt_mlp.pt" "$T/mlp.pt"
run convert "$T/mlp.pt" "$T/mlp.safetensors"
[ "$rc" = 0 ] || fail "convert exited $rc: $(cat "$T/err")"
[ "$(cat "$T/out")" = "$T/mlp.pt -> $T/mlp.safetensors: 4 tensors, 268 bytes" ] || fail "report: $(cat "$T/out")"
[ ! -s "$T/err" ] || fail "convert printed errors: $(cat "$T/err")"
has "$T/mlp.safetensors" '"__metadata__":{"format":"pt"}'
has "$T/mlp.safetensors" '"fc1.weight":{"dtype":"F32","shape":[8,4],'
has "$T/mlp.safetensors" '"fc2.bias":{"dtype":"F32","shape":[3],'
hl=$(od -An -tu4 -N4 "$T/mlp.safetensors" | tr -d ' ')
[ "$(stat -c %s "$T/mlp.safetensors")" = $((8 + hl + 268)) ] || fail "file size is not 8 + header + 268"
echo "ok: convert writes the state_dict's 4 tensors"

run convert --rename '^fc1\.=0.' --rename '^fc2\.=2.' "$T/mlp.pt" "$T/seq.safetensors"
[ "$rc" = 0 ] || fail "convert --rename exited $rc: $(cat "$T/err")"
has "$T/seq.safetensors" '"0.weight":{"dtype":"F32","shape":[8,4],'
has "$T/seq.safetensors" '"2.bias":'
echo "ok: --rename"

run convert "$FX/pt_nested.pt" "$T/nested.safetensors"
[ "$rc" = 0 ] || fail "nested: exited $rc: $(cat "$T/err")"
has "$T/out" ": 16 tensors, 820 bytes"
has "$T/nested.safetensors" '"model.fc1.weight":'
has "$T/nested.safetensors" '"optim.state.0.exp_avg":'
run convert "$FX/pt_dtypes.pt" "$T/dtypes.safetensors"
[ "$rc" = 0 ] || fail "dtypes: exited $rc: $(cat "$T/err")"
for d in '"bf16":{"dtype":"BF16"' '"f16":{"dtype":"F16"' '"bool":{"dtype":"BOOL"' '"u8":{"dtype":"U8"' '"i64":{"dtype":"I64"'; do
  has "$T/dtypes.safetensors" "$d"
done
run convert "$FX/pt_views.pt" "$T/views.safetensors"
[ "$rc" = 0 ] || fail "views: exited $rc: $(cat "$T/err")"
has "$T/views.safetensors" '"transposed":{"dtype":"F32","shape":[6,4],'
echo "ok: nested checkpoints, every dtype, views"

# errors: nothing written, an existing OUT untouched
echo keep > "$T/keep.safetensors"
run convert "$FX/pt_legacy.pt" "$T/keep.safetensors"
[ "$rc" = 1 ] || fail "legacy: exited $rc"
has "$T/err" "pt_legacy.pt: legacy (pre-1.6) torch.save format is not supported; re-save with torch>=1.6"
head -c 1000 "$T/mlp.pt" > "$T/cut.pt"
run convert "$T/cut.pt" "$T/keep.safetensors"
[ "$rc" = 1 ] || fail "truncated: exited $rc"
has "$T/err" "cut.pt: "
run convert "$T/mlp.pt" "$T/keep.safetensors" --rename '^fc[12]\.=x.'
[ "$rc" = 1 ] || fail "duplicate names: exited $rc"
has "$T/err" "mlp.pt: --rename maps both 'fc1.weight' and 'fc2.weight' to 'x.weight'"
[ "$(cat "$T/keep.safetensors")" = keep ] || fail "a failed convert changed an existing OUT"
run convert "$T/missing.pt" "$T/none.safetensors"
[ "$rc" = 1 ] || fail "missing input: exited $rc"
has "$T/err" "missing.pt: cannot open"
[ ! -e "$T/none.safetensors" ] || fail "a failed convert wrote OUT"
ls -a "$T" > "$T/ls"
if grep -q 'tmp' "$T/ls"; then fail "a temporary file is left: $(cat "$T/ls")"; fi
echo "ok: errors exit 1 and write nothing"

run convert "$T/model.h5" "$T/o.safetensors"
[ "$rc" = 2 ] || fail "h5: exited $rc"
has "$T/err" "unsupported input format '.h5' (known: .pt .pth .bin .ckpt .onnx)"
printf 'not protobuf' > "$T/bad.onnx"
run convert "$T/bad.onnx" "$T/o.safetensors"
[ "$rc" = 1 ] || fail "a corrupt .onnx: exited $rc"
has "$T/err" "bad.onnx"
[ ! -e "$T/o.safetensors" ] || fail "a failed ONNX convert wrote OUT"
run convert "$T/mlp.pt" "$T/o.bin"
[ "$rc" = 2 ] || fail "output extension: exited $rc"
has "$T/err" "the output must be a .safetensors file"
run convert "$T/mlp.pt"
[ "$rc" = 2 ] || fail "one operand: exited $rc"
has "$T/err" "expected IN and OUT.safetensors, got 1 argument"
run convert --rename 'a(=b' "$T/mlp.pt" "$T/o.safetensors"
[ "$rc" = 2 ] || fail "bad regex: exited $rc"
has "$T/err" "--rename: key rule 1 'a(=b': bad regex"
run convert --bogus
[ "$rc" = 2 ] || fail "unknown option: exited $rc"
run convert --help
[ "$rc" = 0 ] || fail "--help exited $rc"
has "$T/out" "usage: ember convert IN OUT.safetensors"
[ ! -e "$T/o.safetensors" ] || fail "a usage error wrote OUT"
echo "ok: usage errors exit 2"
