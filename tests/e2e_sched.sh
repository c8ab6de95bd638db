#!/usr/bin/env bash
# End-to-end checks of `ember train --scheduler NAME`: every scheduler at 1
# and 3 epochs trains, and the lr that the epoch line and metrics.csv report
# is the lr of that epoch (warmup-cosine: of its last step) as PyTorch's
# scheduler gives it (tests/fixtures/sched_fixtures.txt, written by
# gen_sched_fixtures.py); bad scheduler options exit 2 before training.
# Usage: e2e_sched.sh path/to/ember path/to/tests/fixtures
set -euo pipefail
EMBER="$1"
FIX="$2/sched_fixtures.txt"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
export STARPU_SILENT=1
common=(--hidden 16 --batch-size 64 --seed 3 --no-progress)
fail() { echo "FAIL: $*" >&2; exit 1; }

# the lr values of fixture config $1 (one per line)
fixture_lr() { awk -v c="config $1" '$0 == c {f = 1; next} f && $1 == "lr" {for (i = 5; i <= NF; i++) print $i; exit}' "$FIX"; }

# run NAME EPOCHS LIMIT CONFIG STEPS_PER_EPOCH [extra args]: the metrics.csv lr
# column must equal the fixture's lr of each epoch (per step: of its last step)
run() {
  local name=$1 epochs=$2 limit=$3 config=$4 spe=$5; shift 5
  local out="$T/$config"
  "$EMBER" train "${common[@]}" --scheduler "$name" --epochs "$epochs" --limit "$limit" --out "$out" "$@" > "$out.log" 2>&1 ||
    fail "--scheduler $name --epochs $epochs exited $?: $(tail -3 "$out.log")"
  fixture_lr "$config" > "$T/want"
  [ -s "$T/want" ] || fail "no fixture $config"
  awk -F, 'NR > 1 {print $7}' "$out/metrics.csv" > "$T/got"
  [ "$(wc -l < "$T/got")" = "$epochs" ] || fail "$config: $(wc -l < "$T/got") metrics rows for $epochs epochs"
  local e
  for ((e = 1; e <= epochs; e++)); do
    local got want
    got=$(sed -n "${e}p" "$T/got")
    want=$(sed -n "$((e * spe))p" "$T/want")
    awk -v g="$got" -v w="$want" 'BEGIN {d = g - w; if (d < 0) d = -d; exit !(d <= 1e-7 * w)}' ||
      fail "$config: epoch $e reports lr $got, PyTorch runs it at $want"
    # the epoch table's row: "epoch E/N", 5 metrics, then the lr (printed with 3 significant digits)
    awk -v e="$e/$epochs" -v g="$got" '$1 == "epoch" && $2 == e { d = $8 - g; if (d < 0) d = -d; found = d <= 5e-3 * g + 1e-12 }
      END { exit !found }' "$out.log" || fail "$config: no epoch row $e with lr $got: $(grep "^epoch $e/" "$out.log")"
  done
  echo "ok: --scheduler $name --epochs $epochs: lr per epoch as PyTorch ($(tr '\n' ' ' < "$T/got"))"
}

# 320 images / batch 64 = 5 steps per epoch, 448 = 7
for s in constant step cosine exponential; do
  run "$s" 1 320 "${s}_e1" 1
  run "$s" 3 320 "${s}_e3" 1
done
run warmup-cosine 1 448 warmup_cosine_e1_s7_w-1 7
run warmup-cosine 1 448 warmup_cosine_e1_s7_w3 7 --warmup 3
run warmup-cosine 3 320 warmup_cosine_e3_s5_w-1 5

# --scheduler cosine --epochs 1 runs (and prints) the base lr, not 0
awk '$1 == "epoch" && $2 == "1/1" && $8 == "0.001" { found = 1 } END { exit !found }' "$T/cosine_e1.log" || fail "cosine at 1 epoch: $(grep '^epoch' "$T/cosine_e1.log")"
echo "ok: --scheduler cosine --epochs 1 prints lr 0.001"

# bad options: exit 2, a message naming the option, nothing trained
bad() {
  local want=$1; shift
  set +e
  "$EMBER" train "${common[@]}" --limit 320 --epochs 1 --out "$T/bad" "$@" > "$T/bad.log" 2>&1
  local rc=$?
  set -e
  [ "$rc" = 2 ] || fail "$* exited $rc, not 2: $(cat "$T/bad.log")"
  grep -q -- "$want" "$T/bad.log" || fail "$*: message '$(cat "$T/bad.log")' does not say '$want'"
  [ ! -e "$T/bad/metrics.csv" ] || fail "$*: trained anyway"
  echo "ok: $* -> exit 2 ($(head -1 "$T/bad.log"))"
}
bad "unknown scheduler 'cosin'" --scheduler cosin
bad "--warmup applies to --scheduler warmup-cosine only" --scheduler cosine --warmup 2
bad "--warmup 5 must be below the run's 5 optimizer steps" --scheduler warmup-cosine --warmup 5
bad "--warmup: '1.5' is not an integer" --scheduler warmup-cosine --warmup 1.5
echo "all scheduler checks passed"
