#!/usr/bin/env bash
# What libember.so exports (DESIGN.md §11): exactly the public API.
#   1. every defined dynamic symbol starts with em_ or EM_, and none with em__
#      (internals are hidden: -fvisibility=hidden, EM_API marks the API);
#   2. every function declared EM_API in include/ember/*.h is exported (a
#      definition that does not see its EM_API declaration is hidden).
# Usage: scripts/check-symbols.sh path/to/libember.so [include-dir]
# Exit status: 0 ok, 1 violations, 77 skipped (no nm).
set -euo pipefail
lib="${1:?usage: check-symbols.sh libember.so [include-dir]}"
inc="${2:-$(dirname "$0")/../include/ember}"
command -v nm >/dev/null || { echo "check-symbols: nm not found: skipped" >&2; exit 77; }

exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u)
# Symbols a toolchain adds to every shared object.
standard='^(_init|_fini|_edata|_end|__bss_start|_etext|__data_start|__dso_handle|_IO_stdin_used)$'
bad=$(printf '%s\n' "$exported" | grep -Ev "$standard" | grep -Ev '^(em|EM)_' || true)
internal=$(printf '%s\n' "$exported" | grep -E '^(em|EM)__' || true)
fail=0
if [ -n "$bad$internal" ]; then
  echo "check-symbols: $lib exports symbols outside the public API (em_*/EM_*, never em__*):"
  printf '%s\n' $bad $internal | sort -u | sed 's/^/  /'
  fail=1
fi

declared=$(cat "$inc"/*.h | tr '\n' ' ' | grep -oE 'EM_API[^;{(]*\(' | sed -E 's/\($//; s/.*[ *]//' | grep -v '^__' | sort -u)
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
if [ -n "$missing" ]; then
  echo "check-symbols: declared EM_API in $inc but not exported by $lib:"
  printf '%s\n' "$missing" | sed 's/^/  /'
  fail=1
fi
n=$(printf '%s\n' "$exported" | grep -c . || true)
nd=$(printf '%s\n' "$declared" | grep -c . || true)
[ "$fail" = 0 ] && echo "check-symbols: ok: $n exported symbols, all public; all $nd EM_API functions exported"
exit "$fail"
