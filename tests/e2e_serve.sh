#!/usr/bin/env bash
# End-to-end checks of `ember serve` (issue #18) over loopback, with curl, as a
# user would run it:
# - a repository with an MLP in two versions (different weights; the newest
#   serves by default, /versions/1 with version_policy all), a CNN, a GPT, a
#   broken checkpoint and a config.json with an unknown key: the server starts,
#   logs both bad models as skipped with the reason, and serves the rest;
# - every endpoint: live, ready, /v2, model metadata (names, shapes, datatypes),
#   model ready, versions, unknown model / path 404, wrong method 405;
# - JSON infer of 3 Fashion-MNIST test images: probabilities sum to 1, logits
#   equal a reference forward computed from the SafeTensors file (serve_ref.py,
#   1e-4 relative), argmax and probability equal `ember predict`'s; version 1
#   gives version 1's logits; the CNN's top-1 equals `ember predict`'s;
#   config.json's "normalize": false and a renamed, reshaped input;
# - the binary-data extension: binary input, binary logits equal the JSON ones;
# - GPT: logits [N, vocab], deterministic, a token id >= vocab is a 400 naming it;
# - bad requests (malformed JSON, wrong input name / datatype / shape, batch >
#   max_batch_size, data count, bad Inference-Header-Content-Length, body >
#   --max-body-mb, unknown output, Content-Encoding): the status and message;
#   the server still answers after them and /metrics counts them;
# - overload: a full queue answers 503 at once, the queued requests then 200;
#   a per-request timeout answers 504; dynamic batching merges 8 concurrent
#   1-row requests into one batch of 8 (/metrics batch-size histogram);
# - /metrics: success / bad_request counters, batches and rows per device,
#   queue-size and in-flight gauges;
# - a short serve_load run at 1 and 8 connections: no error, RSS reported; a
#   load of bad requests at 8 connections: every one a 400, the server unharmed;
# - HEAD requests; --max-connections-per-ip.
# - SIGTERM and SIGINT drain: a queued request still gets its 200, exit 0, the
#   log says what it drained; an idle keep-alive connection does not hold it up;
# - the command line: --help, missing --model-repository (2), bad --instances,
#   a port in use (1, "Address already in use"), no valid model (1).
# - ONNX models (issue #19; skipped, saying so, without Debian's torch): an MLP
#   exported by torch serves beside a checkpoint (and one picked by "platform"),
#   its metadata gives the ONNX input's name and shape, its logits equal `ember
#   run`'s within 1e-5 (also with config.json's input name and normalisation);
#   a wrong shape is a 400; models of two inputs or an INT64
#   input, a folder with both files and config.json dims that do not fit are
#   skipped with the reason while the others serve.
# Usage: e2e_serve.sh path/to/ember path/to/serve_load
set -euo pipefail
EMBER="$1"
SERVE_LOAD="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
REF="$HERE/serve_ref.py"
T="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
export STARPU_SILENT=1
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.err; do [ -f "$f" ] && { echo "--- $f (tail)" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}
pass=0
t0=$SECONDS
ok() { echo "ok: $* [$((SECONDS - t0)) s]"; pass=$((pass + 1)); }

# run CMD...: sets rc, stdout in $T/out.log, stderr in $T/err.log
run() {
  set +e
  "$@" > "$T/out.log" 2> "$T/err.log"
  rc=$?
  set -e
}

# start_server NAME ARGS...: ember serve --port 0 ARGS in the background; waits
# (30 s at most) for its "listening on" line; sets SPID, PORT and U (base URL)
start_server() {
  local name="$1"; shift
  "$EMBER" serve --port 0 "$@" > "$T/$name.out" 2> "$T/$name.err" &
  SPID=$!
  PIDS+=("$SPID")
  PORT=""
  local i
  for i in $(seq 300); do
    PORT="$(sed -n 's|^ember serve: listening on http://127\.0\.0\.1:\([0-9][0-9]*\) .*|\1|p' "$T/$name.err")"
    [ -n "$PORT" ] && break
    kill -0 "$SPID" 2>/dev/null || fail "server $name exited before listening"
    sleep 0.1
  done
  [ -n "$PORT" ] || fail "server $name: no 'listening on' line within 30 s"
  U="http://127.0.0.1:$PORT"
}

# req METHOD PATH [CURL ARGS...]: sets code (HTTP status) and body ($T/body)
req() {
  local m="$1" p="$2"; shift 2
  code="$(curl -s --max-time 20 -X "$m" -o "$T/body" -w '%{http_code}' "$@" "$U$p")" || code="curl-failed"
}
# expect CODE SUBSTRING WHAT: the last req's status and a substring of its body
expect() {
  [ "$code" = "$1" ] || fail "$3: status $code, expected $1: $(cat "$T/body")"
  [[ "$(cat "$T/body")" == *"$2"* ]] || fail "$3: body lacks '$2': $(cat "$T/body")"
}
# metric 'NAME{LABELS}': its value in a fresh /metrics scrape (empty when absent)
metric() {
  curl -s --max-time 10 -o "$T/metrics.txt" "$U/metrics" || fail "GET /metrics failed"
  awk -v k="$1" '$1 == k { print $2 }' "$T/metrics.txt"
}
# wait_metric 'NAME{LABELS}' VALUE WHAT: polls /metrics (10 s at most) until it is VALUE
wait_metric() {
  local i v=""
  for i in $(seq 200); do
    v="$(metric "$1")"
    [ "$v" = "$2" ] && return 0
    sleep 0.05
  done
  fail "$3: $1 is '$v', expected $2"
}
JSONH=(-H 'Content-Type: application/json')

# ---- models -----------------------------------------------------------------
tiny=(--limit 2048 --epochs 1 --hidden 16 --no-progress)
"$EMBER" train "${tiny[@]}" --seed 1 --out "$T/mlp1" > "$T/train.log"
"$EMBER" train "${tiny[@]}" --seed 2 --out "$T/mlp2" >> "$T/train.log"
"$EMBER" train --model cnn --limit 512 --epochs 1 --no-progress --out "$T/cnn" >> "$T/train.log"
for i in $(seq 300); do echo "to be, or not to be, that is the question: line $i of a tiny corpus."; done > "$T/corpus.txt"
"$EMBER" train --model gpt --data "$T/corpus.txt" --iters 20 --warmup 2 --eval-interval 20 --eval-iters 2 \
  --batch-size 4 --block-size 32 --n-layer 2 --n-head 2 --n-embd 32 --out "$T/gpt" >> "$T/train.log" 2>&1
cmp -s "$T/mlp1/checkpoint.safetensors" "$T/mlp2/checkpoint.safetensors" && fail "the two MLP versions are identical"

R="$T/repo"
mkdir -p "$R"/{mlp/1,mlp/2,cnn/1,gpt/1,broken/1,badcfg/1,ovl/1,tmo/1,bat/1,drn/1,raw/1,ren/1}
cp "$T/mlp1/checkpoint.safetensors" "$R/mlp/1/model.safetensors"
cp "$T/mlp2/checkpoint.safetensors" "$R/mlp/2/model.safetensors"
cp "$T/cnn/checkpoint.safetensors" "$R/cnn/1/model.safetensors"
cp "$T/gpt/checkpoint.safetensors" "$R/gpt/1/model.safetensors"
echo "this is not a safetensors file" > "$R/broken/1/model.safetensors"
for m in badcfg ovl tmo bat drn raw ren; do cp "$T/mlp1/checkpoint.safetensors" "$R/$m/1/model.safetensors"; done
echo '{"max_batch_size": 8, "version_policy": {"all": {}}}' > "$R/mlp/config.json"
echo '{"max_batch_size": 8, "dynamic_batchin": {}}' > "$R/badcfg/config.json"
echo '{"normalize": false}' > "$R/raw/config.json"
echo '{"input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [1, 28, 28]}]}' > "$R/ren/config.json"
echo '{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 3000000,
       "default_queue_policy": {"max_queue_size": 2}}}' > "$R/ovl/config.json"
echo '{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 5000000,
       "default_queue_policy": {"default_timeout_microseconds": 200000}}}' > "$R/tmo/config.json"
echo '{"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 5000000}}' > "$R/bat/config.json"
echo '{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 20000000}}' > "$R/drn/config.json"
ok "models trained and repository laid out ($((SECONDS - t0)) s)"

# ---- command line -----------------------------------------------------------
run "$EMBER" serve --help
[ "$rc" = 0 ] || fail "serve --help: exit $rc"
[[ "$(cat "$T/out.log" "$T/err.log")" == *--model-repository* ]] || fail "serve --help does not mention --model-repository"
run "$EMBER" serve --port 0
[ "$rc" = 2 ] || fail "serve without --model-repository: exit $rc, expected 2"
[[ "$(cat "$T/err.log")" == *"--model-repository"* ]] || fail "serve without --model-repository: $(cat "$T/err.log")"
run timeout 30 "$EMBER" serve --model-repository "$R" --port 0 --bogus
[ "$rc" = 2 ] || fail "serve --bogus: exit $rc, expected 2"
for inst in tpu:0 cuda:7 cpu:0 cpu:x; do
  run timeout 30 "$EMBER" serve --model-repository "$R" --port 0 --instances "$inst"
  { [ "$rc" = 1 ] || [ "$rc" = 2 ]; } || fail "--instances $inst: exit $rc, expected 1 or 2"
  [[ "$(cat "$T/err.log")" == *"$inst"* ]] || fail "--instances $inst: the message does not name it: $(cat "$T/err.log")"
  [[ "$(cat "$T/err.log")" == *"listening on"* ]] && fail "--instances $inst: the server listened"
done
mkdir -p "$T/empty/broken/1"
cp "$R/broken/1/model.safetensors" "$T/empty/broken/1/"
run timeout 30 "$EMBER" serve --model-repository "$T/empty" --port 0
[ "$rc" = 1 ] || fail "a repository without a valid model: exit $rc, expected 1"
run timeout 30 "$EMBER" serve --model-repository "$T/nonexistent" --port 0
[ "$rc" = 1 ] || fail "a missing repository: exit $rc, expected 1"
[[ "$(cat "$T/err.log")" == *nonexistent* ]] || fail "a missing repository: the message does not name it"
ok "command line: --help, usage errors (2), --instances tpu:0 / cuda:7 / cpu:0 / cpu:x, no valid model (1)"

# ---- start; the bad models are skipped ----------------------------------------
start_server main --model-repository "$R" --max-body-mb 1
MAIN_PID=$SPID
MAIN_URL=$U
log="$(cat "$T/main.err")"
[[ "$log" == *"model 'broken'"*skipped*"broken/1/model.safetensors"* ]] || fail "the broken model is not reported as skipped with its file: $log"
[[ "$log" == *"model 'badcfg' skipped"*"dynamic_batchin"* ]] || fail "the bad config.json is not reported as skipped naming the key: $log"
[[ "$log" == *"model 'mlp' version 2: classifier"*"model 'mlp' version 1: classifier"* ]] || fail "mlp versions 2 and 1 not both loaded: $log"
for m in cnn gpt ovl tmo bat drn raw ren; do
  [[ "$log" == *"model '$m' version 1: "* ]] || fail "model $m not loaded: $log"
done
[ "$(grep -c -E '^ember serve: model .* version [0-9]+: (classifier|GPT);' "$T/main.err")" = 10 ] || fail "not 10 model versions loaded: $log"
ok "server up on port $PORT; broken checkpoint and unknown config key skipped with the reason"

# an idle server pauses StarPU's workers (they would spin on every core they own)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sleep 0.5
c0=$(cpu_ticks "$MAIN_PID"); sleep 2; c1=$(cpu_ticks "$MAIN_PID")
hz=$(getconf CLK_TCK)
[ $((c1 - c0)) -le $((hz / 5)) ] || fail "the idle server used $((c1 - c0)) CPU ticks (of $hz per second) in 2 s"
ok "idle server: $((c1 - c0)) CPU ticks in 2 s (workers paused)"

run timeout 30 "$EMBER" serve --model-repository "$R" --port "$PORT"
[ "$rc" = 1 ] || fail "a port in use: exit $rc, expected 1"
[[ "$(cat "$T/err.log")" == *"Address already in use"* ]] || fail "a port in use: $(cat "$T/err.log")"
ok "a second server on port $PORT: exit 1, Address already in use"

# ---- endpoints ----------------------------------------------------------------
req GET /v2/health/live;  expect 200 "" "live"
req GET /v2/health/ready; expect 200 "" "ready"
req GET /v2;              expect 200 '"extensions":[' "server metadata"
python3 - "$T/body" <<'EOF' || fail "server metadata: $(cat "$T/body")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["name"] == "ember" and m["version"] and "binary_tensor_data" in m["extensions"], m
EOF
req GET /v2/models/mlp; expect 200 '"name":"mlp"' "mlp metadata"
python3 - "$T/body" <<'EOF' || fail "mlp metadata: $(cat "$T/body")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["name"] == "mlp" and sorted(m["versions"]) == ["1", "2"] and m["platform"] == "ember", m
assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}], m["inputs"]
assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}], m["outputs"]
EOF
req GET /v2/models/cnn; expect 200 '"name":"cnn"' "cnn metadata"
python3 - "$T/body" <<'EOF' || fail "cnn metadata: $(cat "$T/body")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}], m["inputs"]
assert [o["shape"] for o in m["outputs"]] == [[-1, 10], [-1, 10]], m["outputs"]
EOF
req GET /v2/models/gpt; expect 200 '"name":"gpt"' "gpt metadata"
python3 - "$T/body" <<'EOF' || fail "gpt metadata: $(cat "$T/body")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}], m["inputs"]
assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 256]}], m["outputs"]
EOF
req GET /v2/models/mlp/ready;            expect 200 '"ready":true' "model ready"
req GET /v2/models/mlp/versions/1;       expect 200 '"name":"mlp"' "version 1 metadata"
req GET /v2/models/mlp/versions/2/ready; expect 200 '"ready":true' "version 2 ready"
req GET /v2/models/mlp/versions/3;       expect 404 "version '3'" "unknown version"
req GET /v2/models/nope;                 expect 404 "nope" "unknown model"
req GET /v2/models/broken;               expect 404 "broken" "skipped model"
req POST /v2/models/nope/infer "${JSONH[@]}" -d '{"inputs":[]}'; expect 404 "nope" "infer of an unknown model"
req GET /v2/nothing;                     expect 404 '"error"' "unknown path"
req GET /;                               expect 404 '"error"' "root path"
req DELETE /v2/models/mlp;               expect 405 '"error"' "DELETE model metadata"
req GET /v2/models/mlp/infer;            expect 405 "POST" "GET infer"
req POST /v2/health/live;                expect 405 "GET" "POST live"
ok "endpoints: live, ready, /v2, metadata of mlp/cnn/gpt (shapes, datatypes), ready, versions, 404s, 405s"

# ---- JSON infer: the reference forward and ember predict -------------------------
N_OK=0; N_ROWS=0   # successful requests and rows to mlp version 2 (the default)
python3 "$REF" mkreq "$T/req3.json" 0,1,2
"$EMBER" predict --checkpoint "$R/mlp/2/model.safetensors" --index 0,1,2 --top 1 > "$T/pred2.txt"
req POST /v2/models/mlp/infer "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 200 '"model_version":"2"' "infer mlp"
N_OK=$((N_OK + 1)); N_ROWS=$((N_ROWS + 3))
cp "$T/body" "$T/resp3.json"
msg="$(python3 "$REF" check "$T/resp3.json" "$R/mlp/2/model.safetensors" 0,1,2 "$T/pred2.txt")" || fail "mlp v2 infer"
ok "mlp (v2 by default), 3 rows: probabilities sum to 1, logits = reference forward ($msg)"
"$EMBER" predict --checkpoint "$R/mlp/1/model.safetensors" --index 0,1,2 --top 1 > "$T/pred1.txt"
req POST /v2/models/mlp/versions/1/infer "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 200 '"model_version":"1"' "infer mlp v1"
msg="$(python3 "$REF" check "$T/body" "$R/mlp/1/model.safetensors" 0,1,2 "$T/pred1.txt")" || fail "mlp v1 infer"
python3 "$REF" check "$T/body" "$R/mlp/2/model.safetensors" 0,1,2 2> /dev/null > /dev/null && fail "version 1 answers version 2's logits"
ok "mlp /versions/1: version 1's logits ($msg)"

python3 "$REF" mkreq "$T/cnn3.json" 0,1,2,3 cnn
"$EMBER" predict --checkpoint "$R/cnn/1/model.safetensors" --index 0,1,2,3 --top 1 > "$T/predc.txt"
req POST /v2/models/cnn/infer "${JSONH[@]}" --data-binary @"$T/cnn3.json"; expect 200 '"model_name":"cnn"' "infer cnn"
python3 - "$T/body" "$T/predc.txt" <<'EOF' || fail "cnn infer does not match ember predict"
import json, sys
CL = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
o = {x["name"]: x for x in json.load(open(sys.argv[1]))["outputs"]}
p = o["probabilities"]["data"]
assert o["probabilities"]["shape"] == [4, 10] and o["logits"]["shape"] == [4, 10]
pred = [l for l in open(sys.argv[2]).read().splitlines() if l.startswith("image ")]
for r, l in enumerate(pred):
    name, prob = l.split("):", 1)[1].strip().rsplit(" ", 1)
    row = p[r * 10:(r + 1) * 10]
    assert abs(sum(row) - 1) < 1e-5, sum(row)
    am = max(range(10), key=lambda c: row[c])
    assert CL[am] == name and abs(row[am] - float(prob)) < 0.0006, (r, CL[am], row[am], l)
EOF
ok "cnn, 4 images [4,1,28,28]: top-1 and its probability = ember predict's"

# config.json's "normalize": false and a renamed, reshaped input
req POST /v2/models/raw/infer "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 200 '"model_name":"raw"' "infer raw"
SERVE_REF_NORM=none python3 "$REF" check "$T/body" "$R/raw/1/model.safetensors" 0,1,2 > /dev/null || fail "normalize false"
python3 "$REF" check "$T/body" "$R/raw/1/model.safetensors" 0,1,2 2> /dev/null > /dev/null && fail "normalize false: still normalised"
req GET /v2/models/ren; expect 200 '"inputs":[{"name":"pixels","datatype":"FP32","shape":[-1,1,28,28]}]' "renamed input metadata"
sed 's/"name": "input"/"name": "pixels"/' "$T/cnn3.json" > "$T/ren4.json"
req POST /v2/models/ren/infer "${JSONH[@]}" --data-binary @"$T/ren4.json"; expect 200 '"model_name":"ren"' "infer ren"
python3 "$REF" check "$T/body" "$R/ren/1/model.safetensors" 0,1,2,3 > /dev/null || fail "renamed input"
req POST /v2/models/ren/infer "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 400 "'pixels'" "ren with the old name"
ok "config.json: normalize false = the raw reference forward; input renamed 'pixels' [-1,1,28,28] = the MLP's"

# ---- binary extension -------------------------------------------------------------
hl="$(python3 "$REF" mkbin "$T/req3.bin" 0,1,2)"
code="$(curl -s --max-time 20 -o "$T/resp3.bin" -D "$T/hdr3.txt" -w '%{http_code}' \
  -H 'Content-Type: application/octet-stream' -H "Inference-Header-Content-Length: $hl" \
  --data-binary @"$T/req3.bin" "$U/v2/models/mlp/infer")"
[ "$code" = 200 ] || fail "binary infer: status $code: $(cat "$T/resp3.bin")"
N_OK=$((N_OK + 1)); N_ROWS=$((N_ROWS + 3))
msg="$(python3 "$REF" checkbin "$T/resp3.bin" "$T/hdr3.txt" "$T/resp3.json")" || fail "binary infer"
ok "binary input and binary logits: $msg"

# ---- GPT ---------------------------------------------------------------------------
gpt='{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[2,5],"data":[116,111,32,98,101,44,32,111,114,32]}]}'
req POST /v2/models/gpt/infer "${JSONH[@]}" -d "$gpt"; expect 200 '"shape":[2,256]' "gpt infer"
cp "$T/body" "$T/gpt1.json"
req POST /v2/models/gpt/infer "${JSONH[@]}" -d "$gpt"; expect 200 '"shape":[2,256]' "gpt infer again"
python3 - "$T/gpt1.json" "$T/body" <<'EOF' || fail "gpt logits"
import json, math, sys
a, b = (json.load(open(f))["outputs"] for f in sys.argv[1:3])
assert len(a) == 1 and a[0]["name"] == "logits" and a[0]["datatype"] == "FP32"
d = a[0]["data"]
assert len(d) == 512 and all(math.isfinite(v) for v in d)
assert d[:256] != d[256:], "two different prompts gave the same logits"
assert d == b[0]["data"], "the same request gave different logits"
EOF
req POST /v2/models/gpt/infer "${JSONH[@]}" -d '{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,3],"data":[1,2,256]}]}'
expect 400 "token id 256" "gpt token id 256"
ok "gpt: logits [2, 256], finite, the same twice; token id 256 -> 400 naming it"

# ---- bad requests -----------------------------------------------------------------
python3 - "$T" <<'EOF'
import json, sys
def w(f, name, dt, shape, n):
    json.dump({"inputs": [{"name": name, "datatype": dt, "shape": shape, "data": [0] * n}]}, open(sys.argv[1] + "/" + f, "w"))
w("b_name.json", "pixels", "FP32", [1, 784], 784)
w("b_dtype.json", "input", "INT64", [1, 784], 784)
w("b_shape.json", "input", "FP32", [1, 783], 783)
w("b_rank.json", "input", "FP32", [784], 784)
w("b_batch.json", "input", "FP32", [9, 784], 9 * 784)
w("b_count.json", "input", "FP32", [2, 784], 784)
json.dump({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0.5] * 784}],
           "outputs": [{"name": "scores"}]}, open(sys.argv[1] + "/b_out.json", "w"))
open(sys.argv[1] + "/b_big.json", "w").write('{"inputs":[{"name":"input","datatype":"FP32","shape":[1,784],"data":[' + "0," * 600000 + '0]}]}')
EOF
I=/v2/models/mlp/infer
N_BAD=0
bad() { # CODE SUBSTRING WHAT CURL-ARGS...
  local c="$1" s="$2" w="$3"; shift 3
  req POST "$I" "$@"; expect "$c" "$s" "$w"; N_BAD=$((N_BAD + 1))
}
bad 400 "not valid JSON" "malformed JSON" "${JSONH[@]}" -d '{"inputs":[{"name":'
bad 400 "'pixels'" "wrong input name" "${JSONH[@]}" --data-binary @"$T/b_name.json"
bad 400 "datatype INT64" "wrong datatype" "${JSONH[@]}" --data-binary @"$T/b_dtype.json"
bad 400 "[1, 783]" "wrong shape" "${JSONH[@]}" --data-binary @"$T/b_shape.json"
bad 400 "[784]" "wrong rank" "${JSONH[@]}" --data-binary @"$T/b_rank.json"
bad 400 "max_batch_size" "batch 9 > max_batch_size 8" "${JSONH[@]}" --data-binary @"$T/b_batch.json"
bad 400 "1568 elements but data has 784" "data count" "${JSONH[@]}" --data-binary @"$T/b_count.json"
bad 400 "unknown output 'scores'" "unknown output" "${JSONH[@]}" --data-binary @"$T/b_out.json"
bad 400 "Inference-Header-Content-Length" "header length past the body" -H 'Inference-Header-Content-Length: 99999' --data-binary @"$T/req3.bin"
bad 400 "Inference-Header-Content-Length" "header length not a number" -H 'Inference-Header-Content-Length: 12x' --data-binary @"$T/req3.bin"
bad 400 "" "header length cutting the JSON" -H 'Inference-Header-Content-Length: 40' --data-binary @"$T/req3.bin"
hl1=$((hl + 4))
bad 400 "" "header length off by 4" -H "Inference-Header-Content-Length: $hl1" --data-binary @"$T/req3.bin"
bad 400 "" "JSON header without binary data" -H "Inference-Header-Content-Length: $hl" --data-binary @"$T/req3.json"
bad 413 "bytes this endpoint takes" "body of 1.2 MB > what a full batch (8 rows) of the model needs" "${JSONH[@]}" --data-binary @"$T/b_big.json"
req POST /v2/models/raw/infer "${JSONH[@]}" --data-binary @"$T/b_big.json"
expect 413 "--max-body-mb" "body of 1.2 MB > --max-body-mb 1 (a model taking 64 rows)"
bad 415 "Content-Encoding" "Content-Encoding gzip" "${JSONH[@]}" -H 'Content-Encoding: gzip' --data-binary @"$T/req3.json"
req GET /v2/health/ready; expect 200 "" "ready after the bad requests"
req POST "$I" "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 200 '"model_version":"2"' "infer after the bad requests"
N_OK=$((N_OK + 1)); N_ROWS=$((N_ROWS + 3))
cmp -s "$T/body" "$T/resp3.json" || fail "the logits after the bad requests differ"
kill -0 "$MAIN_PID" || fail "the server died"
ok "$N_BAD bad requests: 400 / 413 / 415 with the message; the server still answers the same"

# ---- overload: a full queue is a 503 at once -----------------------------------------
python3 "$REF" mkreq "$T/req1.json" 7
curl -s --max-time 20 -o "$T/ovl1.json" -w '%{http_code}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/ovl/infer" > "$T/ovl1.code" &
PIDS+=($!); o1=$!
curl -s --max-time 20 -o "$T/ovl2.json" -w '%{http_code}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/ovl/infer" > "$T/ovl2.code" &
PIDS+=($!); o2=$!
wait_metric 'ember_inference_queue_size{model="ovl",version="1"}' 2 "two requests queued"
[ "$(metric ember_inference_in_flight_requests)" = 2 ] || fail "in-flight gauge with 2 queued: $(metric ember_inference_in_flight_requests)"
code="$(curl -s --max-time 20 -o "$T/body" -w '%{http_code} %{time_total}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/ovl/infer")"
t503="${code#* }"; code="${code%% *}"
expect 503 '"error"' "third request to a full queue"
awk -v t="$t503" 'BEGIN { exit !(t < 0.5) }' || fail "the 503 took $t503 s"
wait "$o1" "$o2" || fail "queued requests: curl failed"
[ "$(cat "$T/ovl1.code") $(cat "$T/ovl2.code")" = "200 200" ] || fail "queued requests: $(cat "$T/ovl1.code") $(cat "$T/ovl2.code")"
python3 "$REF" probs "$T/ovl1.json" 1 || fail "queued request answer"
[ "$(metric 'ember_inference_requests_total{model="ovl",version="1",outcome="overload"}')" = 1 ] || fail "overload not counted"
[ "$(metric 'ember_inference_batch_size_sum{model="ovl",version="1"}')" = 2 ] || fail "the two queued requests were not one batch of 2"
ok "overload: queue of 2 full -> 503 in $t503 s; the 2 queued then 200 in one batch of 2"

# ---- timeout: 504 --------------------------------------------------------------------
code="$(curl -s --max-time 20 -o "$T/body" -w '%{http_code} %{time_total}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/tmo/infer")"
t504="${code#* }"; code="${code%% *}"
expect 504 '"error"' "request past its timeout"
awk -v t="$t504" 'BEGIN { exit !(t >= 0.19 && t < 2) }' || fail "the 504 came after $t504 s (timeout 0.2 s)"
[ "$(metric 'ember_inference_requests_total{model="tmo",version="1",outcome="timeout"}')" = 1 ] || fail "timeout not counted"
ok "timeout 200 ms with a 5 s queue delay -> 504 after $t504 s"

# ---- dynamic batching merges ------------------------------------------------------------
bp=()
for i in 1 2 3 4 5 6 7 8; do
  curl -s --max-time 20 -o "$T/bat$i.json" -w '%{http_code}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/bat/infer" > "$T/bat$i.code" &
  PIDS+=($!); bp+=($!)
done
wait "${bp[@]}" || fail "batched requests: curl failed"
for i in 1 2 3 4 5 6 7 8; do
  [ "$(cat "$T/bat$i.code")" = 200 ] || fail "batched request $i: $(cat "$T/bat$i.code")"
  cmp -s "$T/bat$i.json" "$T/bat1.json" || fail "batched request $i answered differently from request 1"
done
[ "$(metric 'ember_inference_batch_size_count{model="bat",version="1"}')" = 1 ] || fail "8 requests, not one batch: $(grep 'batch_size_[cs].*bat' "$T/metrics.txt")"
[ "$(metric 'ember_inference_batch_size_sum{model="bat",version="1"}')" = 8 ] || fail "batch size sum $(metric 'ember_inference_batch_size_sum{model="bat",version="1"}')"
[ "$(metric 'ember_inference_batch_size_bucket{model="bat",version="1",le="4"}')" = 0 ] || fail "batch-size histogram"
[ "$(metric 'ember_inference_batch_size_bucket{model="bat",version="1",le="8"}')" = 1 ] || fail "batch-size histogram"
ok "dynamic batching: 8 concurrent 1-row requests -> 1 batch of 8 (preferred 8), all 200 and equal"

# ---- /metrics ------------------------------------------------------------------------------
m2='model="mlp",version="2"'
[ "$(metric "ember_inference_requests_total{$m2,outcome=\"success\"}")" = "$N_OK" ] || fail "success count $(metric "ember_inference_requests_total{$m2,outcome=\"success\"}"), sent $N_OK"
nb="$(metric "ember_inference_requests_total{$m2,outcome=\"bad_request\"}")"
# the 413 and 415 are answered before the model's decoder: not counted under the model
[ -n "$nb" ] && [ "$nb" -ge $((N_BAD - 2)) ] && [ "$nb" -le "$N_BAD" ] || fail "bad_request count '$nb' for $N_BAD bad requests"
[ "$(metric "ember_inference_batches_total{$m2,instance=\"0\",device=\"cpu\"}")" = "$N_OK" ] || fail "batches_total on cpu: $(grep batches_total "$T/metrics.txt")"
[ "$(metric "ember_inference_rows_total{$m2,instance=\"0\",device=\"cpu\"}")" = "$N_ROWS" ] || fail "rows_total on cpu"
[ "$(metric "ember_inference_batch_size_sum{$m2}")" = "$N_ROWS" ] || fail "batch size sum"
[ "$(metric "ember_inference_compute_duration_seconds_count{$m2}")" = "$N_OK" ] || fail "compute duration count"
[ "$(metric "ember_inference_queue_duration_seconds_count{$m2}")" = "$N_OK" ] || fail "queue duration count"
[ "$(metric "ember_inference_requests_total{model=\"mlp\",version=\"1\",outcome=\"success\"}")" = 1 ] || fail "version 1 success count"
[ "$(metric ember_inference_in_flight_requests)" = 0 ] || fail "in-flight gauge at rest"
[ "$(metric 'ember_inference_queue_size{model="bat",version="1"}')" = 0 ] || fail "queue size at rest"
[ "$(metric 'ember_http_requests_total{code="5xx"}')" -ge 2 ] || fail "5xx count"
python3 - "$T/metrics.txt" <<'EOF' || fail "/metrics is not Prometheus text"
import re, sys
types = {}
for l in open(sys.argv[1]).read().splitlines():
    if l.startswith("# TYPE "):
        _, _, n, t = l.split(" ", 3); types[n] = t; continue
    if not l or l.startswith("#"):
        continue
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)', l)
    assert m, l
    float(m.group(3))
    base = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
    assert m.group(1) in types or base in types, "no # TYPE for " + l
EOF
ok "/metrics: $N_OK successes, $nb bad requests, $N_OK batches / $N_ROWS rows on cpu, gauges at 0, valid text"

# ---- load -----------------------------------------------------------------------------
run "$SERVE_LOAD" --url "$U/v2/models/mlp/infer" --body "$T/req1.json" --header 'Content-Type: application/json' \
  --connections 1,8 --duration 2 --pid "$MAIN_PID" --csv "$T/load.csv"
[ "$rc" = 0 ] || fail "serve_load: exit $rc: $(cat "$T/out.log" "$T/err.log")"
cat "$T/out.log"
[ "$(wc -l < "$T/load.csv")" -ge 2 ] || fail "serve_load csv: $(cat "$T/load.csv")"
awk -F, '$1 ~ /^[0-9]+$/ { n++; if ($2 < 10 || $9 != 0) bad = 1 } END { exit !(n == 2 && !bad) }' "$T/load.csv" || fail "serve_load rows: $(cat "$T/load.csv")"
rss="$(awk '$1 == "rss" && $2 == "KiB" && $4 > 0 { m = $8 } END { print m }' "$T/out.log")"
[ -n "$rss" ] || fail "serve_load printed no RSS of the server"
kill -0 "$MAIN_PID" || fail "the server died under load"
rps="$(awk -F, '$1 ~ /^[0-9]+$/ { printf "%s%s conn %.0f req/s p99 %s ms", s, $1, $4, $7; s = "; " }' "$T/load.csv")"
ok "serve_load 1,8 connections x 2 s: 0 errors ($rps; server RSS max $rss KiB)"
run "$SERVE_LOAD" --url "$U/v2/models/mlp/infer" --body "$T/b_dtype.json" --header 'Content-Type: application/json' \
  --connections 8 --duration 1 --expect-status 400
[ "$rc" = 0 ] || fail "serve_load of bad requests: exit $rc: $(cat "$T/out.log" "$T/err.log")"
req POST "$I" "${JSONH[@]}" --data-binary @"$T/req3.json"; expect 200 '"model_version":"2"' "infer after a load of bad requests"
cmp -s "$T/body" "$T/resp3.json" || fail "the logits after a load of bad requests differ"
ok "serve_load of bad requests, 8 connections x 1 s: every one a 400 ($(sed -n 's/.*= \([0-9.]*\) req\/s.*/\1/p' "$T/out.log") req/s), the server unharmed"

# ---- SIGTERM drain ------------------------------------------------------------------------
curl -s --max-time 20 -o "$T/drn.json" -w '%{http_code}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/drn/infer" > "$T/drn.code" &
PIDS+=($!); dp=$!
wait_metric 'ember_inference_queue_size{model="drn",version="1"}' 1 "the drain request queued"
[ "$(metric ember_inference_in_flight_requests)" = 1 ] || fail "in-flight gauge with 1 queued"
exec 3<> "/dev/tcp/127.0.0.1/$PORT"   # an idle connection, as a client's keep-alive pool holds
ts=$SECONDS
kill -TERM "$MAIN_PID"
set +e; wait "$MAIN_PID"; src=$?; set -e
exec 3>&-
[ $((SECONDS - ts)) -le 5 ] || fail "SIGTERM: the server took $((SECONDS - ts)) s to stop (the queued request should go at once, not after its 20 s queue delay)"
wait "$dp" || fail "the request in flight at SIGTERM: curl failed"
[ "$(cat "$T/drn.code")" = 200 ] || fail "the request in flight at SIGTERM: $(cat "$T/drn.code") $(cat "$T/drn.json")"
python3 "$REF" probs "$T/drn.json" 1 || fail "the request in flight at SIGTERM: its answer"
[ "$src" = 0 ] || fail "SIGTERM: the server exited $src"
[[ "$(cat "$T/main.err")" == *"SIGTERM: not accepting connections; finishing 1 in-flight request(s)"* ]] || fail "SIGTERM: no drain line"
[[ "$(cat "$T/main.err")" == *"stopped after"* ]] || fail "SIGTERM: no stop line"
curl -s --max-time 5 -o /dev/null "$MAIN_URL/v2/health/live" && fail "the server still answers after SIGTERM"
ok "SIGTERM with a queued request and an idle connection: the request got 200, the log drained 1 request, exit 0"

# ---- SIGINT drain, a second server --------------------------------------------------------
mkdir -p "$T/repo2"
cp -r "$R/drn" "$T/repo2/"
start_server sigint --model-repository "$T/repo2" --instances cpu:2 --max-connections-per-ip 3
[ "$(metric 'ember_inference_batches_total{model="drn",version="1",instance="1",device="cpu"}')" = 0 ] || fail "--instances cpu:2: no instance 1"
# HEAD is GET without a body
hc="$(curl -s --max-time 5 -I -o /dev/null -w '%{http_code}' "$U/v2/health/live")" || hc=curl-failed
[ "$hc" = 200 ] || fail "HEAD /v2/health/live: $hc"
# --max-connections-per-ip 3: with 3 connections held open, a 4th from the same address is refused
exec 4<> "/dev/tcp/127.0.0.1/$PORT" 5<> "/dev/tcp/127.0.0.1/$PORT" 6<> "/dev/tcp/127.0.0.1/$PORT"
sleep 0.3
if curl -s --max-time 5 -o /dev/null "$U/v2/health/live"; then fail "--max-connections-per-ip 3: a 4th connection was served"; fi
exec 4>&- 5>&- 6>&-
sleep 0.3
curl -s --max-time 5 -o /dev/null "$U/v2/health/live" || fail "--max-connections-per-ip 3: refused after the others closed"
ok "HEAD answers as GET; --max-connections-per-ip 3 refuses a 4th connection and serves once they close"
curl -s --max-time 20 -o "$T/drn2.json" -w '%{http_code}' "${JSONH[@]}" --data-binary @"$T/req1.json" "$U/v2/models/drn/infer" > "$T/drn2.code" &
PIDS+=($!); dp=$!
wait_metric 'ember_inference_queue_size{model="drn",version="1"}' 1 "the SIGINT request queued"
kill -INT "$SPID"
set +e; wait "$SPID"; src=$?; set -e
wait "$dp" || fail "the request in flight at SIGINT: curl failed"
[ "$(cat "$T/drn2.code")" = 200 ] || fail "the request in flight at SIGINT: $(cat "$T/drn2.code")"
[ "$src" = 0 ] || fail "SIGINT: the server exited $src"
[[ "$(cat "$T/sigint.err")" == *"SIGINT: not accepting connections; finishing 1 in-flight request(s)"* ]] || fail "SIGINT: no drain line"
ok "SIGINT with a queued request (2 cpu instances): 200, exit 0"

# ---- ONNX models (issue #19, item 4), a third server ------------------------------------------
# Debian's torch exports the models (tests/onnx_torch_export.py: an MLP with a
# dynamic batch; two bad ones here); without it this part is skipped.
TPY="${TORCH_PYTHON:-/usr/bin/python3}"
if ! "$TPY" -c 'import torch, numpy' 2> /dev/null; then
  echo "SKIPPED: the ONNX models ($TPY cannot import torch and numpy; Debian: apt-get install python3-torch python3-numpy)"
else
  O="$T/onnx"
  "$TPY" "$HERE/onnx_torch_export.py" "$O" > "$T/onnx_export.log" 2>&1 || fail "onnx_torch_export.py: $(cat "$T/onnx_export.log")"
  "$TPY" - "$O" > "$T/onnx_bad.log" 2>&1 <<'EOF' || fail "exporting the bad ONNX models: $(cat "$T/onnx_bad.log")"
import sys, torch
class Two(torch.nn.Module):  # two inputs
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 2)
    def forward(self, a, b):
        return self.l(a + b)
class Ids(torch.nn.Module):  # an INT64 input
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(5, 3)
    def forward(self, ids):
        return self.l(ids.float())
torch.onnx.export(Two(), (torch.rand(1, 4), torch.rand(1, 4)), sys.argv[1] + "/two.onnx", input_names=["a", "b"],
                  output_names=["y"], dynamic_axes={"a": {0: "N"}, "b": {0: "N"}}, opset_version=17)
torch.onnx.export(Ids(), torch.zeros(1, 5, dtype=torch.int64), sys.argv[1] + "/ids.onnx", input_names=["ids"],
                  output_names=["y"], dynamic_axes={"ids": {0: "N"}}, opset_version=17)
EOF
  R3="$T/repo3"
  mkdir -p "$R3"/{omlp/1,mlp/1,two/1,ids/1,both/1,ocfg/1,plat/1,oren/1}
  cp "$O/mlp.onnx" "$R3/omlp/1/model.onnx"
  cp "$T/mlp2/checkpoint.safetensors" "$R3/mlp/1/model.safetensors"
  cp "$O/two.onnx" "$R3/two/1/model.onnx"
  cp "$O/ids.onnx" "$R3/ids/1/model.onnx"
  for m in both plat; do cp "$O/mlp.onnx" "$R3/$m/1/model.onnx"; cp "$T/mlp2/checkpoint.safetensors" "$R3/$m/1/model.safetensors"; done
  echo '{"platform": "onnxruntime_onnx"}' > "$R3/plat/config.json"
  cp "$O/mlp.onnx" "$R3/ocfg/1/model.onnx"
  echo '{"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [784]}]}' > "$R3/ocfg/config.json"
  # renamed input and config.json's normalisation: (x - 0.5) / 0.25
  cp "$O/mlp.onnx" "$R3/oren/1/model.onnx"
  echo '{"input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [1, 28, 28]}], "normalize": {"mean": [0.5], "std": [0.25]}}' \
    > "$R3/oren/config.json"
  start_server onnx --model-repository "$R3"
  log="$(cat "$T/onnx.err")"
  [[ "$log" == *"model 'omlp' version 1: ONNX classifier; input 'x' FP32 [-1, 1, 28, 28] -> logits, probabilities [-1, 10];"* ]] \
    || fail "the ONNX MLP is not loaded as a classifier of input 'x' [-1, 1, 28, 28]: $log"
  [[ "$log" == *"model 'plat' version 1: ONNX classifier;"* ]] || fail "\"platform\": \"onnxruntime_onnx\" does not pick model.onnx: $log"
  [[ "$log" == *"model 'mlp' version 1: classifier;"* ]] || fail "the checkpoint beside the ONNX models is not served: $log"
  [[ "$log" == *"model 'oren' version 1: ONNX classifier; input 'pixels' FP32 [-1, 1, 28, 28]"* ]] || fail "config.json's input name is not used: $log"
  [[ "$log" == *"model 'two' skipped: version 1: $R3/two/1/model.onnx: the ONNX model has 2 inputs ('a', 'b')"* ]] \
    || fail "the ONNX model of two inputs is not skipped with its reason: $log"
  [[ "$log" == *"model 'ids' skipped: version 1: $R3/ids/1/model.onnx: the ONNX model's input 'ids' is int64"* ]] \
    || fail "the ONNX model of an INT64 input is not skipped with its reason: $log"
  [[ "$log" == *"model 'both' skipped: version 1: $R3/both/1 holds both model.safetensors and model.onnx"* ]] \
    || fail "a version folder with both files is not skipped naming both: $log"
  [[ "$log" == *"model 'ocfg' skipped: version 1: config.json input dims [-1, 784] do not fit the ONNX model's input 'x' [-1, 1, 28, 28]"* ]] \
    || fail "config.json dims that do not fit the ONNX input are not reported: $log"
  ok "ONNX: the MLP and \"platform\": \"onnxruntime_onnx\" load beside a checkpoint; 2 inputs, an INT64 input, both files and config dims skipped with their reasons"
  req GET /v2/models/omlp/ready; expect 200 '"ready":true' "onnx model ready"
  req GET /v2/models/omlp; expect 200 '"name":"omlp"' "onnx metadata"
  "$TPY" - "$T/body" <<'EOF' || fail "onnx metadata: $(cat "$T/body")"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["platform"] == "onnx", m
assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 28, 28]}], m["inputs"]
assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}], m["outputs"]
EOF
  ok "ONNX metadata: input 'x' FP32 [-1, 1, 28, 28], logits and probabilities [-1, 10]; ready"
  # 5 rows of the exporter's inputs: the server's logits are `ember run`'s
  "$TPY" - "$O/x64.npy" "$T/ox.npy" "$T/oreq.json" "$T/oxn.npy" "$T/oreq_pixels.json" <<'EOF'
import json, sys
import numpy as np
x = np.load(sys.argv[1])[:5]
np.save(sys.argv[2], x)
np.save(sys.argv[4], (x - np.float32(0.5)) / np.float32(0.25))  # oren's normalisation, for ember run
for name, path in (("x", sys.argv[3]), ("pixels", sys.argv[5])):
    json.dump({"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}, open(path, "w"))
EOF
  mkdir -p "$T/orun/omlp" "$T/orun/oren"
  run "$EMBER" run "$O/mlp.onnx" --input "x=$T/ox.npy" --output-dir "$T/orun/omlp" --print-limit 0
  [ "$rc" = 0 ] || fail "ember run mlp.onnx: exit $rc: $(cat "$T/out.log" "$T/err.log")"
  cp -r "$T/orun/omlp" "$T/orun/plat"
  run "$EMBER" run "$O/mlp.onnx" --input "x=$T/oxn.npy" --output-dir "$T/orun/oren" --print-limit 0
  [ "$rc" = 0 ] || fail "ember run mlp.onnx (normalised input): exit $rc: $(cat "$T/out.log" "$T/err.log")"
  msgs=""
  for m in omlp plat oren; do
    rq="$T/oreq.json"
    [ "$m" = oren ] && rq="$T/oreq_pixels.json"
    req POST "/v2/models/$m/infer" "${JSONH[@]}" --data-binary @"$rq"; expect 200 "\"model_name\":\"$m\"" "infer $m"
    "$TPY" - "$T/body" "$T/o_$m.npy" <<'EOF' || fail "$m infer: $(head -c 400 "$T/body")"
import json, sys
import numpy as np
o = {t["name"]: t for t in json.load(open(sys.argv[1]))["outputs"]}
lg = np.array(o["logits"]["data"], dtype=np.float32).reshape(o["logits"]["shape"])
pr = np.array(o["probabilities"]["data"], dtype=np.float64).reshape(o["probabilities"]["shape"])
assert lg.shape == (5, 10) and pr.shape == (5, 10), (lg.shape, pr.shape)
e = np.exp(lg.astype(np.float64) - lg.max(1, keepdims=True))
assert np.abs(pr - e / e.sum(1, keepdims=True)).max() < 1e-6, "probabilities are not softmax(logits)"
np.save(sys.argv[2], lg)
EOF
    msg="$("$TPY" "$HERE/onnx_compare.py" "$T/o_$m.npy" "$T/orun/$m/logits.npy" 1e-5 "$m: serve vs ember run")" || fail "$msg"
    msgs="${msgs:+$msgs; }$msg"
  done
  ok "ONNX infer, 5 rows: logits equal ember run's ($msgs; oren: input 'pixels', normalised by config.json), probabilities = softmax(logits)"
  printf '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,784],"data":[%s0]}]}' "$(printf '0,%.0s' $(seq 783))" > "$T/obad.json"
  req POST /v2/models/omlp/infer "${JSONH[@]}" --data-binary @"$T/obad.json"
  expect 400 "input 'x': shape [1, 784] does not match [-1, 1, 28, 28] of model 'omlp'" "onnx wrong shape"
  req POST /v2/models/omlp/infer "${JSONH[@]}" -d '{"inputs":[{"name":"input","datatype":"FP32","shape":[1,1],"data":[0]}]}'
  expect 400 "unexpected input 'input': model 'omlp' takes one input, 'x'" "onnx wrong input name"
  req POST /v2/models/mlp/infer "${JSONH[@]}" --data-binary @"$T/req1.json"; expect 200 '"model_name":"mlp"' "the checkpoint beside the ONNX models"
  kill -TERM "$SPID"
  set +e; wait "$SPID"; src=$?; set -e
  [ "$src" = 0 ] || fail "the ONNX server: SIGTERM exit $src"
  ok "ONNX bad requests: a wrong shape and a wrong input name give 400 with the message; the checkpoint still serves; SIGTERM exit 0"
fi

echo "e2e_serve: all $pass checks passed in $((SECONDS - t0)) s"
