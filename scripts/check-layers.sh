#!/usr/bin/env bash
# The layer rules of DESIGN.md §1, checked (CTest: check_layers).
#
#   scripts/check-layers.sh [OBJECT_FILE...]
#
# 1. Includes. Every #include in every library source directory is checked
#    against the matrix below: a layer includes the public headers, the
#    devices-side headers and the layers below it in DESIGN.md §1 — nothing
#    above it. devices/ include only devices/, <ember/core.h> and the op table
#    tasks/ops.def (a data file: every kernel table is indexed by it). tools/
#    (a program) includes only public headers. Public headers include only
#    public headers. <starpu.h> (and <starpu_*.h>) only in runtime/, tasks/
#    and devices/.
# 2. Calls (when object files are given, as CTest does): every undefined
#    symbol of an object of layer L that another library object defines must
#    be defined in a layer L may call (the same matrix, without devices/ for
#    the layers above tasks/; devices/ may call the runtime's public em_*
#    functions only). So runtime/ calls nothing in tasks/ or autodiff/, and
#    tasks/ nothing in autodiff/: upper layers plug in through hooks.
#
# Every violation is listed as file:line (or object: symbol) with the rule it
# breaks; the exit status is 1 when there is any. Plain bash, grep, awk, nm.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2

# Library layers, bottom-up (DESIGN.md §1). fusion/ and serve/ are checked
# once they exist.
ORDER=(runtime tasks autodiff fusion nn optim data store train dist serve)
DEVAPI="devices/kargs.h devices/devices.h devices/half.h devices/half_host.h"   # what devices/ offer the layers above (half*.h: inline f16/bf16 conversions)
STARPU_LAYERS=" runtime tasks devices "

# Calls allowed across layers that DESIGN.md §1's order does not give:
#   train -> dist: the Learner drives data-parallel training through dist's
#   public API (em_dist_*, em_replicas_*), while §1 lists dist/ above train/.
CALL_EXTRA="train:dist"

declare -A INC CALL
INC[runtime]="public runtime $DEVAPI"
INC[tasks]="public runtime tasks $DEVAPI"
INC[devices]="ember/core.h devices tasks/ops.def"
# tools/ -> serve/: `ember serve` drives the inference server through its API
# header (serve/server.h, which includes serve/protocol.h). serve/ is a
# static library above libember (it links libmicrohttpd, which libember
# does not), so that API is not in include/ember/.
INC[tools]="public tools serve/server.h"
INC[include]="public"
CALL[runtime]="runtime"
CALL[tasks]="runtime tasks devices"
CALL[devices]="devices runtime-public"
below=""
for l in "${ORDER[@]}"; do
  if [ -z "${INC[$l]:-}" ]; then
    INC[$l]="public $DEVAPI $below $l"
    CALL[$l]="$below $l"
  fi
  below="$below $l"
done
for e in $CALL_EXTRA; do CALL[${e%%:*}]="${CALL[${e%%:*}]} ${e#*:}"; done

rules() { echo $1 | sed 's/ /, /g'; } # the allow list of a layer, for messages

layer_of() { # path relative to the root -> layer
  case "$1" in
    include/*) echo include ;;
    devices/*) echo devices ;;
    *) echo "${1%%/*}" ;;
  esac
}

allowed() { # allowed LIST TARGET: TARGET (a root-relative path) matches an entry
  local e t="$2"
  for e in $1; do
    case "$e" in
      public) [[ "$t" == include/ember/* ]] && return 0 ;;
      */*) [[ "$t" == "$e" || "$t" == "include/$e" ]] && return 0 ;;
      *) [[ "$(layer_of "$t")" == "$e" ]] && return 0 ;;
    esac
  done
  return 1
}

violations=()
notes=()
nfiles=0
dirs=(include/ember devices "${ORDER[@]}" tools)
while IFS= read -r f; do
  nfiles=$((nfiles + 1))
  L="$(layer_of "$f")"
  while IFS=: read -r line text; do
    if [[ "$text" =~ \#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
      inc="${BASH_REMATCH[1]}"
      # store/onnx.proto's protoc-c output lives in the build tree (store/)
      if [ "$inc" = "onnx.pb-c.h" ] && [ "$L" = store ]; then continue; fi
      if [ -e "$inc" ]; then t="$inc"
      elif [ -e "$(dirname "$f")/$inc" ]; then t="$(realpath --relative-to=. "$(dirname "$f")/$inc")"
      elif [ -e "include/$inc" ]; then t="include/$inc"
      else violations+=("$f:$line: #include \"$inc\": not found under the source root"); continue
      fi
      if ! allowed "${INC[$L]}" "$t"; then
        violations+=("$f:$line: #include \"$inc\": $L/ may include only: $(rules "${INC[$L]}")")
      fi
    elif [[ "$text" =~ \#[[:space:]]*include[[:space:]]*\<(starpu[a-z_0-9]*\.h)\> ]]; then
      inc="${BASH_REMATCH[1]}"
      if [[ "$STARPU_LAYERS" != *" $L "* ]]; then
        violations+=("$f:$line: #include <$inc>: only runtime/, tasks/ and devices/ include StarPU")
      fi
    elif [[ "$text" =~ \#[[:space:]]*include[[:space:]]*\<(ember/[^\>]+)\> ]]; then
      inc="${BASH_REMATCH[1]}"
      if ! allowed "${INC[$L]}" "include/$inc"; then
        violations+=("$f:$line: #include <$inc>: $L/ may include only: $(rules "${INC[$L]}")")
      fi
    elif [[ "$text" =~ \#[[:space:]]*include[[:space:]]*\<([^\>]+)\> ]] && [ -f "${BASH_REMATCH[1]}" ]; then
      # <tasks/x.h>: the source root is on the include path, so a project
      # header in angle brackets is an include like "tasks/x.h"
      inc="${BASH_REMATCH[1]}"
      if ! allowed "${INC[$L]}" "$inc"; then
        violations+=("$f:$line: #include <$inc>: $L/ may include only: $(rules "${INC[$L]}")")
      fi
    fi
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include' "$f")
done < <(find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.def' -o -name '*.inc' \) 2>/dev/null | sort)

# ---- calls, from the objects ------------------------------------------------
ncalls=0
nmissing=0
for o in "$@"; do [ -e "$o" ] || nmissing=$((nmissing + 1)); done
if [ "$#" -gt 0 ] && [ "$nmissing" -gt 0 ]; then
  # scripts/gpu-pack.sh deletes the objects of the build it ships: includes only
  notes+=("call check skipped: $nmissing of $# object files are missing (build first)")
  set --
elif [ "$#" -gt 0 ] && ! command -v nm >/dev/null; then
  notes+=("call check skipped: nm not found")
  set --
fi
if [ "$#" -gt 0 ]; then
  matrix=""
  for l in "${!CALL[@]}"; do matrix="$matrix$l=${CALL[$l]};"; done
  tmp="$(mktemp)"
  trap 'rm -f "$tmp"' EXIT
  for o in "$@"; do
    # .../ember_objs.dir/<layer>/<file>.o ; the generated OpenCL sources are devices/,
    # the protoc-c output of store/onnx.proto is store/
    rel="${o#*.dir/}"
    case "$rel" in generated/onnx.pb-c.*) l=store ;; generated/*) l=devices ;; *) l="$(layer_of "$rel")" ;; esac
    nm -P "$o" 2>/dev/null | awk -v o="$rel" -v l="$l" 'NF >= 2 { print l, o, $1, $2 }' >> "$tmp"
  done
  out="$(awk -v matrix="$matrix" '
    BEGIN {
      n = split(matrix, rows, ";")
      for (i = 1; i <= n; i++) if (rows[i] != "") {
        split(rows[i], kv, "="); m = split(kv[2], ls, " ")
        for (j = 1; j <= m; j++) ok[kv[1] " " ls[j]] = 1
      }
    }
    { L = $1; obj = $2; sym = $3; t = $4 }
    t ~ /^[TDBRGSCVWu]$/ { strong = (t != "V" && t != "W"); if (strong) sdef[sym] = sdef[sym] " " L; else wdef[sym] = wdef[sym] " " L; next }
    t == "U" { nu++; ul[nu] = L; uo[nu] = obj; us[nu] = sym }
    END {
      for (i = 1; i <= nu; i++) {
        d = (us[i] in sdef) ? sdef[us[i]] : ((us[i] in wdef) ? wdef[us[i]] : "")
        if (d == "") continue
        calls++
        m = split(d, ds, " "); good = 0; where = ""
        for (j = 1; j <= m; j++) {
          if (ds[j] == ul[i] || ((ul[i] " " ds[j]) in ok)) good = 1
          if (ds[j] == "runtime" && ((ul[i] " runtime-public") in ok) && us[i] !~ /^em__/) good = 1
          where = ds[j]
        }
        if (!good) print "V " uo[i] ": calls " us[i] " (defined in " where "/): " ul[i] "/ may call only its own layer and below"
      }
      print "N " calls + 0
    }' "$tmp")"
  while IFS= read -r l; do
    case "$l" in
      "V "*) violations+=("${l#V }") ;;
      "N "*) ncalls="${l#N }" ;;
    esac
  done <<< "$out"
fi

for n in "${notes[@]}"; do echo "check-layers: note: $n"; done
if [ "${#violations[@]}" -gt 0 ]; then
  echo "check-layers: ${#violations[@]} layer violation(s) (DESIGN.md §1; rules in scripts/check-layers.sh):"
  printf '  %s\n' "${violations[@]}"
  exit 1
fi
echo "check-layers: ok: $nfiles files' includes$([ "$#" -gt 0 ] && echo ", $ncalls cross-object references in $# objects") follow the layers"
