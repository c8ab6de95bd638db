#!/usr/bin/env bash
# An unusable $HOME or STARPU_HOME never makes StarPU abort (issue #20):
# with $HOME unwritable Ember falls back to $TMPDIR/ember-starpu-UID with a
# warning; a STARPU_HOME / STARPU_PERF_MODEL_DIR the user chose that cannot be
# written is a clear error (exit 1) naming it. A path under a regular file is
# unwritable for root too. Usage: e2e_home.sh path/to/ember
set -euo pipefail
EMBER="$1"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
touch "$T/file"
unset STARPU_HOME STARPU_PERF_MODEL_DIR
export STARPU_SILENT=1

rc=0; HOME="$T/file" TMPDIR="$T" "$EMBER" devices > "$T/o1.log" 2> "$T/e1.log" || rc=$?
[ "$rc" = 0 ] || fail "unwritable HOME: exit $rc: $(cat "$T/e1.log")"
grep -q "is not writable: StarPU's performance models go to $T/ember-starpu-" "$T/e1.log" || fail "no fallback warning: $(cat "$T/e1.log")"
[ -d "$T/ember-starpu-$(id -u)/.starpu/sampling" ] || fail "fallback directory not made"
echo "ok: unwritable HOME falls back to TMPDIR with a warning"

rc=0; STARPU_HOME="$T/file" "$EMBER" devices > "$T/o2.log" 2> "$T/e2.log" || rc=$?
[ "$rc" = 1 ] || fail "unwritable STARPU_HOME: exit $rc (want 1): $(cat "$T/e2.log")"
grep -q "'$T/file/.starpu/sampling' (from \$STARPU_HOME) cannot be created or written" "$T/e2.log" || fail "error does not name STARPU_HOME's directory: $(cat "$T/e2.log")"
if grep -qi "abort" "$T/e2.log"; then fail "StarPU aborted"; fi
echo "ok: unwritable STARPU_HOME is an error naming it"

rc=0; STARPU_PERF_MODEL_DIR="$T/file/models" "$EMBER" devices > "$T/o3.log" 2> "$T/e3.log" || rc=$?
[ "$rc" = 1 ] || fail "unwritable STARPU_PERF_MODEL_DIR: exit $rc (want 1)"
grep -q "from \$STARPU_PERF_MODEL_DIR" "$T/e3.log" || fail "error does not name STARPU_PERF_MODEL_DIR: $(cat "$T/e3.log")"
echo "ok: unwritable STARPU_PERF_MODEL_DIR is an error naming it"
