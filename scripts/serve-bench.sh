#!/usr/bin/env bash
# The serving benchmark of issue #18 (docs/benchmarks.md "Serving"), the same
# on the CPU box and on the GPU machine (scripts/gpu-run.sh serve):
#
#   for each round, for each instance list (the order alternates per round):
#     1. offline: `ember serve --benchmark S` = the batched forward of
#        max_batch_size rows on all the model's instances at once, no HTTP
#     2. server:  `ember serve --instances LIST` under serve_load, closed loop,
#        requests of ROWS rows (binary tensors) at each concurrency; saturation
#        = the best rows/s over the levels; ratio = server / offline
#     3. small batches: a model with max_batch_size SMALL_MAX and 1-row
#        requests (the dynamic batcher merges them), closed loop at SMALL_CONNS
#     4. half saturation (when serve_load has --rate): open loop at half the
#        step-2 request rate; p99 against max_queue_delay + 2 x one batch
#   then, with SOAK_REQUESTS > 0, a soak run of that many requests on the last
#   list, with the server's RSS sampled each second.
#
# usage: scripts/serve-bench.sh EMBER SERVE_LOAD CHECKPOINT WORKDIR
# env:   SERVE_LISTS   instance lists separated by ';' (default "cpu:1")
#        SERVE_ROUNDS  rounds (default 2)     SERVE_SECONDS  seconds per level (default 4)
#        SERVE_CONNS   closed-loop levels (default 1,4,16,64)
#        SERVE_ROWS    rows per request = max_batch_size of the big-batch model (default 64)
#        SMALL_MAX     max_batch_size of the small-batch model (default 8); SMALL_CONNS (default 64)
#        SOAK_REQUESTS soak requests (default 0 = none); SOAK_CONNS (default 16)
# Prints lines starting with "serve-bench:" (the summary) and keeps every log in WORKDIR.
set -uo pipefail
EMBER="$1" LOAD="$2" CKPT="$3" W="$4"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
LISTS="${SERVE_LISTS:-cpu:1}"
ROUNDS="${SERVE_ROUNDS:-2}" SECS="${SERVE_SECONDS:-4}" CONNS="${SERVE_CONNS:-1,4,16,64}" ROWS="${SERVE_ROWS:-64}"
SMALL_MAX="${SMALL_MAX:-8}" SMALL_CONNS="${SMALL_CONNS:-64}"
mkdir -p "$W"
export STARPU_SILENT=1
PY=python3
command -v "$PY" >/dev/null || PY=/usr/bin/python3

# the model repository: the same checkpoint as "big" (max_batch_size ROWS) and "small"
R="$W/repo"
rm -rf "$R"
mkdir -p "$R/big/1" "$R/small/1"
cp "$CKPT" "$R/big/1/model.safetensors"
cp "$CKPT" "$R/small/1/model.safetensors"
echo "{\"max_batch_size\": $ROWS}" >"$R/big/config.json"
echo "{\"max_batch_size\": $SMALL_MAX, \"dynamic_batching\": {\"max_queue_delay_microseconds\": 100}}" >"$R/small/config.json"
"$PY" "$HERE/bench/serve_body.py" --rows "$ROWS" --binary "$W/big.bin"
"$PY" "$HERE/bench/serve_body.py" --rows 1 --binary "$W/one.bin"
HAVE_RATE=0
"$LOAD" --help 2>&1 | grep -c -- '--rate' >/dev/null && HAVE_RATE=1

PID=""
start_server() { # LIST LOG -> PORT in $PORT, pid in $PID
  "$EMBER" serve --model-repository "$R" --port 0 --instances "$1" >"$2" 2>&1 &
  PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$2")
    [ -n "$PORT" ] && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "serve-bench: the server did not start: $(tail -n 3 "$2")"
  return 1
}
stop_server() {
  [ -n "$PID" ] || return 0
  kill -TERM "$PID" 2>/dev/null
  wait "$PID"
  local rc=$?
  [ "$rc" = 0 ] || echo "serve-bench: the server exited with $rc after SIGTERM"
  PID=""
}
trap 'stop_server' EXIT

best_rps() { # LOGFILE -> the best req/s over the levels
  sed -n 's/.* = \([0-9.]*\) req\/s.*/\1/p' "$1" | sort -g | tail -n 1
}

IFS=';' read -r -a L <<<"$LISTS"
for r in $(seq 1 "$ROUNDS"); do
  order=("${L[@]}")
  if [ $((r % 2)) = 0 ]; then # alternate the order of the lists per round
    order=()
    for ((i = ${#L[@]} - 1; i >= 0; i--)); do order+=("${L[$i]}"); done
  fi
  for list in "${order[@]}"; do
    tag="r$r-$(echo "$list" | tr ':,' '-_')"
    "$EMBER" serve --model-repository "$R" --instances "$list" --benchmark "$SECS" >"$W/offline-$tag.log" 2>&1
    off=$(sed -n 's/^benchmark big version 1: offline total \([0-9.]*\) rows.*/\1/p' "$W/offline-$tag.log")
    offs=$(sed -n 's/^benchmark small version 1: offline total \([0-9.]*\) rows.*/\1/p' "$W/offline-$tag.log")
    grep '^benchmark big' "$W/offline-$tag.log" | sed "s/^/serve-bench: [$list] round $r: /"
    start_server "$list" "$W/server-$tag.log" || continue
    "$LOAD" --url "http://127.0.0.1:$PORT/v2/models/big/infer" --body "$W/big.bin" \
      --header "Inference-Header-Content-Length: $(cat "$W/big.bin.hlen")" --connections "$CONNS" --duration "$SECS" --warmup 1 \
      --pid "$PID" >"$W/load-$tag.log" 2>&1
    sed "s/^/serve-bench: [$list] round $r: $ROWS-row requests: /" "$W/load-$tag.log"
    rps=$(best_rps "$W/load-$tag.log")
    if [ -n "$rps" ] && [ -n "$off" ]; then
      awk -v r="$rps" -v n="$ROWS" -v o="$off" -v l="$list" -v k="$r" \
        'BEGIN { printf "serve-bench: [%s] round %s: server %.1f rows/s at saturation vs offline %.1f rows/s = %.3fx\n", l, k, r * n, o, r * n / o }'
    fi
    "$LOAD" --url "http://127.0.0.1:$PORT/v2/models/small/infer" --body "$W/one.bin" \
      --header "Inference-Header-Content-Length: $(cat "$W/one.bin.hlen")" --connections "$SMALL_CONNS" --duration "$SECS" --warmup 1 \
      >"$W/small-$tag.log" 2>&1
    srps=$(best_rps "$W/small-$tag.log")
    sed "s/^/serve-bench: [$list] round $r: 1-row requests, max_batch_size $SMALL_MAX: /" "$W/small-$tag.log"
    [ -n "$srps" ] && [ -n "$offs" ] &&
      awk -v r="$srps" -v o="$offs" -v l="$list" -v k="$r" -v m="$SMALL_MAX" \
        'BEGIN { printf "serve-bench: [%s] round %s: small model: server %.1f rows/s vs offline %.1f rows/s (batches of %s) = %.3fx\n", l, k, r, o, m, r / o }'
    if [ "$HAVE_RATE" = 1 ] && [ -n "$rps" ]; then
      half=$(awk -v r="$rps" 'BEGIN { printf "%.1f", r / 2 }')
      "$LOAD" --url "http://127.0.0.1:$PORT/v2/models/big/infer" --body "$W/big.bin" \
        --header "Inference-Header-Content-Length: $(cat "$W/big.bin.hlen")" --connections 16 --rate "$half" --duration "$SECS" \
        >"$W/half-$tag.log" 2>&1
      sed "s/^/serve-bench: [$list] round $r: half saturation, open loop: /" "$W/half-$tag.log"
      bt=$(sed -n "s/^benchmark big version 1: instance 0 [^ ]*: .*(\([0-9.]*\) ms per batch).*/\1/p" "$W/offline-$tag.log" | head -n 1)
      [ -n "$bt" ] && echo "serve-bench: [$list] round $r: p99 bound = max_queue_delay 0 ms + 2 x $bt ms (one batch, instance 0)"
    fi
    if [ "$HAVE_RATE" = 1 ] && [ -n "$srps" ]; then
      half=$(awk -v r="$srps" 'BEGIN { printf "%.1f", r / 2 }')
      "$LOAD" --url "http://127.0.0.1:$PORT/v2/models/small/infer" --body "$W/one.bin" \
        --header "Inference-Header-Content-Length: $(cat "$W/one.bin.hlen")" --connections "$SMALL_CONNS" --rate "$half" --duration "$SECS" \
        >"$W/halfsmall-$tag.log" 2>&1
      sed "s/^/serve-bench: [$list] round $r: small model, half saturation, open loop: /" "$W/halfsmall-$tag.log"
      bs=$(sed -n "s/^benchmark small version 1: instance 0 [^ ]*: .*(\([0-9.]*\) ms per batch).*/\1/p" "$W/offline-$tag.log" | head -n 1)
      [ -n "$bs" ] && echo "serve-bench: [$list] round $r: small model p99 bound = max_queue_delay 0.1 ms + 2 x $bs ms (one batch of $SMALL_MAX, instance 0)"
    fi
    curl -s "http://127.0.0.1:$PORT/metrics" >"$W/metrics-$tag.txt" 2>/dev/null || true
    grep -E '^ember_inference_(batches|rows)_total' "$W/metrics-$tag.txt" 2>/dev/null | sed "s/^/serve-bench: [$list] round $r: /"
    stop_server
  done
done

if [ "${SOAK_REQUESTS:-0}" -gt 0 ]; then
  list="${L[${#L[@]}-1]}"
  start_server "$list" "$W/server-soak.log" && {
    "$LOAD" --url "http://127.0.0.1:$PORT/v2/models/small/infer" --body "$W/one.bin" \
      --header "Inference-Header-Content-Length: $(cat "$W/one.bin.hlen")" --connections "${SOAK_CONNS:-16}" \
      --requests "$SOAK_REQUESTS" --pid "$PID" >"$W/soak.log" 2>&1
    sed "s/^/serve-bench: [$list] soak $SOAK_REQUESTS requests: /" "$W/soak.log"
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^ember_inference_requests_total' | sed "s/^/serve-bench: soak: /"
    stop_server
  }
fi
