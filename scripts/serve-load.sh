#!/usr/bin/env bash
# Load test of `ember serve` with both generators at the same concurrencies: bench/serve_load.c (self-contained, the
# one on machines without wrk) and, where wrk is installed, wrk with bench/serve_wrk.lua, alternating the two at each
# level (serve_load, wrk, serve_load, wrk, ...) and printing both lines.
#
#   scripts/serve-load.sh URL BODY_FILE [HEADER_LEN] [CONNECTIONS_LIST] [SECONDS]
#     e.g. scripts/serve-load.sh http://127.0.0.1:8000/v2/models/mlp/infer req.json "" 1,4,16,64 10
#
# HEADER_LEN (empty for a JSON body) is sent as Inference-Header-Content-Length with Content-Type
# application/octet-stream (the binary tensor extension). CONNECTIONS_LIST defaults to 1,4,16,64, SECONDS (per run)
# to 10. SERVE_LOAD names the generator (default build/serve_load); WRK_THREADS caps wrk's threads (default nproc).
# Extra serve_load options (e.g. "--pid 1234 --csv rows.csv") come from SERVE_LOAD_ARGS. Each run is bounded by
# `timeout` (SECONDS + 60 s). The exit status is 1 when any run reported errors.
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
URL="$1"; BODY="$2"; HEADER_LEN="${3:-}"; CONNS="${4:-1,4,16,64}"; SECS="${5:-10}"
SERVE_LOAD="${SERVE_LOAD:-build/serve_load}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
LUA="$HERE/bench/serve_wrk.lua"
[ -r "$BODY" ] || { echo "serve-load.sh: cannot read BODY_FILE '$BODY'" >&2; exit 2; }
[ -x "$SERVE_LOAD" ] || { echo "serve-load.sh: no serve_load at '$SERVE_LOAD' (set SERVE_LOAD)" >&2; exit 2; }
HAVE_WRK=0; command -v wrk >/dev/null 2>&1 && HAVE_WRK=1
if [ -n "$HEADER_LEN" ]; then
  HDRS=(--header "Content-Type: application/octet-stream" --header "Inference-Header-Content-Length: $HEADER_LEN")
else
  HDRS=(--header "Content-Type: application/json")
fi
LIMIT=$((SECS + 60))
MAXT="${WRK_THREADS:-$(nproc)}"
STATUS=0
echo "serve-load: $URL body $BODY (${HEADER_LEN:+header length $HEADER_LEN, }$(wc -c <"$BODY") bytes), ${SECS} s per run"
[ "$HAVE_WRK" = 1 ] || echo "serve-load: wrk not found, serve_load only"
IFS=',' read -r -a LEVELS <<<"$CONNS"
for c in "${LEVELS[@]}"; do
  printf 'serve_load '
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$SERVE_LOAD" --url "$URL" --body "$BODY" "${HDRS[@]}" --connections "$c" --duration "$SECS" \
    ${SERVE_LOAD_ARGS:-} || STATUS=1
  if [ "$HAVE_WRK" = 1 ]; then
    t=$((c < MAXT ? c : MAXT))
    line=$(BODY="$BODY" HEADER_LEN="$HEADER_LEN" timeout "$LIMIT" wrk -t"$t" -c"$c" -d"${SECS}s" --timeout 30s -s "$LUA" "$URL" \
      2>&1 | grep '^wrk: ') || STATUS=1
    echo "${line:-wrk: connections $c: no result} (connections $c, threads $t)"
    case "$line" in *" non200 0 socket_errors 0 timeouts 0") ;; *) STATUS=1 ;; esac
  fi
done
exit "$STATUS"
