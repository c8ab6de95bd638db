#!/usr/bin/env bash
# The installed package works for a user: `cmake --install` into a temporary
# prefix, then one small program built with find_package(Ember) and once more
# with pkg-config (ember.pc) runs an op; the installed library exports no
# em__ internal; the installed bin/ember runs, also from a moved prefix. Usage: install_package.sh BUILD_DIR [cmake] [cc]
# Exit status 77 (CTest: skipped) where a tool it needs is missing.
set -euo pipefail
build="${1:?usage: install_package.sh BUILD_DIR [cmake] [cc]}"
cmake="${2:-cmake}"
cc="${3:-cc}"
for tool in "$cmake" "$cc" pkg-config nm; do
  command -v "$tool" >/dev/null || { echo "install_package: $tool not found: skipped"; exit 77; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --prefix "$tmp/prefix" >/dev/null
mkdir "$tmp/src"
cat > "$tmp/src/main.c" <<'C'
#include <ember/ember.h>
#include <stdio.h>
int main(void)
{
    if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    em_scope_begin();
    double v = 0;
    em_status st = em_item(em_sum_all(em_full((int64_t[]){2, 2}, 2, EM_F32, 3.0)), &v);
    em_scope_end();
    em_shutdown();
    printf("installed ember: sum = %g\n", v);
    return st == EM_OK && v == 12.0 ? 0 : 1;
}
C
cat > "$tmp/src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(Ember REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE Ember::ember)
CM
"$cmake" -S "$tmp/src" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
"$cmake" --build "$tmp/b" >/dev/null
"$tmp/b/consumer"
pc="$(dirname "$(find "$tmp/prefix" -name ember.pc | head -1)")"
# shellcheck disable=SC2046
"$cc" "$tmp/src/main.c" -o "$tmp/pc_consumer" $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs ember)
"$tmp/pc_consumer"
lib="$(find "$tmp/prefix" -name 'libember.so' | head -1)"
# grep without -q: under pipefail an early exit of grep -q would SIGPIPE awk and hide a match
if nm -D --defined-only "$lib" | awk '{print $3}' | grep '^em__' > /dev/null; then
  echo "install_package: the installed $lib exports em__ internals" >&2
  exit 1
fi
# the installed program finds its library from any prefix chosen at install
# time, also after the prefix is moved (RUNPATH $ORIGIN/../lib, issue #20)
"$tmp/prefix/bin/ember" version > "$tmp/version.log" || { echo "install_package: installed bin/ember does not run" >&2; exit 1; }
mv "$tmp/prefix" "$tmp/moved"
"$tmp/moved/bin/ember" version > "$tmp/version2.log" || { echo "install_package: bin/ember does not run after moving the prefix" >&2; exit 1; }
STARPU_SILENT=1 "$tmp/moved/bin/ember" devices > "$tmp/devices.log" || { echo "install_package: installed ember devices failed" >&2; exit 1; }
grep -q "^ember " "$tmp/version2.log" || { echo "install_package: ember version printed: $(cat "$tmp/version2.log")" >&2; exit 1; }
echo "install_package: ok (find_package, pkg-config, bin/ember from a moved prefix)"
