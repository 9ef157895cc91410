#!/usr/bin/env bash
# test_install BUILD_DIR SOURCE_DIR: what a user of an installed gradsync
# relies on. Installs the build into a temporary prefix, MOVES the prefix
# (everything must be relocatable), then:
#  - the layout: programs, libgradsync.so.0 (soname), a self-contained
#    libgradsync.a, gradsync.h, gradsync.pc, the CMake package;
#  - the installed programs run without LD_LIBRARY_PATH: a 2-rank demo job
#    (gradsync-run starts the installed gradsyncd);
#  - tests/install/consumer/app.c (the README's example plus a value check)
#    built four ways, each run as a 2-rank job that must average correctly:
#    pkg-config shared (the README's command), pkg-config static, CMake
#    gradsync::gradsync, CMake gradsync::gradsync_static; the static ones
#    must not need libgradsync.so;
#  - `cpack -G DEB`: two packages whose Depends were computed by
#    dpkg-shlibdeps (libgrpc, libprotobuf-c, libc6) and that hold the files.
# $GS_EXTRA_FLAGS (the sanitizer flags of an ASan build) is added to every
# compile and link of the consumer.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
extra=${GS_EXTRA_FLAGS:-}
tmp=$(mktemp -d /tmp/gs-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
fail() {
  echo "test_install: FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }
# has PATTERN: grep that reads all its input (grep -q would end a pipe early,
# and pipefail would take the writer's SIGPIPE for a failure).
has() { grep "$@" >/dev/null; }

for tool in pkg-config cc cmake; do
  command -v "$tool" >/dev/null || {
    echo "test_install: $tool missing; SKIP"
    exit 77
  }
done

step "cmake --install into a temporary prefix, then move it"
cmake --install "$build" --prefix "$tmp/staging" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install failed"
}
mv "$tmp/staging" "$tmp/prefix"
p=$tmp/prefix
for f in bin/gradsyncd bin/gradsync-run bin/gradsync-train lib/libgradsync.so.0 lib/libgradsync.so \
  lib/libgradsync.a include/gradsync.h lib/pkgconfig/gradsync.pc \
  lib/cmake/gradsync/gradsyncConfig.cmake lib/cmake/gradsync/gradsyncConfigVersion.cmake; do
  [ -e "$p/$f" ] || fail "$f not installed (have: $(cd "$p" && find . -type f | sort | tr '\n' ' '))"
done
if [ -e "$build/bin/gradsyncctl" ] && [ ! -x "$p/bin/gradsyncctl" ]; then
  fail "gradsyncctl is built but not installed"
fi
soname=$(readelf -d "$p/lib/libgradsync.so.0" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libgradsync.so.0 ] || fail "libgradsync.so soname is '$soname', expected libgradsync.so.0"
for prog in gradsyncd gradsync-run gradsync-train; do
  rp=$(readelf -d "$p/bin/$prog" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  [ "$rp" = '$ORIGIN/../lib' ] || fail "$prog has RPATH '$rp', expected \$ORIGIN/../lib"
done
# Self-contained: every symbol the archive uses is defined in it or in the
# libraries gradsync.pc names. Linking a program that references the whole
# public API proves it below; here, no internal symbol may stay undefined.
undef=$(nm "$p/lib/libgradsync.a" 2>/dev/null | awk '$1 == "U" && $2 ~ /^gs_/ {print $2}' | sort -u)
def=$(nm --defined-only "$p/lib/libgradsync.a" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u)
missing=$(comm -23 <(echo "$undef") <(echo "$def") | tr '\n' ' ')
[ -z "${missing// /}" ] || fail "libgradsync.a is not self-contained: undefined $missing"

step "installed programs run without LD_LIBRARY_PATH: gradsync-run -np 2 gradsync-train"
ldd "$p/bin/gradsync-train" | has "libgradsync.so.0 => $p/bin/../lib/" ||
  fail "gradsync-train does not find libgradsync.so.0 in $p/lib: $(ldd "$p/bin/gradsync-train")"
"$p/bin/gradsyncd" --help >/dev/null || fail "gradsyncd --help failed"
timeout 300 "$p/bin/gradsync-run" -np 2 "$p/bin/gradsync-train" --steps 20 >"$tmp/train.log" 2>&1 || {
  cat "$tmp/train.log"
  fail "the installed demo job failed"
}
grep -q "identical" "$tmp/train.log" || {
  cat "$tmp/train.log"
  fail "the installed demo did not report identical parameters"
}

export PKG_CONFIG_PATH=$p/lib/pkgconfig
[ "$(pkg-config --modversion gradsync)" = "$(sed -n 's/^Version: //p' "$p/lib/pkgconfig/gradsync.pc")" ] ||
  fail "pkg-config --modversion gradsync"
[ "$(pkg-config --variable=libdir gradsync)" -ef "$p/lib" ] ||
  fail "gradsync.pc libdir $(pkg-config --variable=libdir gradsync) is not the moved prefix's lib"
pkg-config --print-requires-private gradsync | has grpc || fail "Requires.private lacks grpc"
cp "$src/tests/install/consumer/app.c" "$tmp/app.c"
cd "$tmp"

# run_app PROGRAM: a 2-rank job with the installed launcher and coordinator.
run_app() {
  timeout 120 "$p/bin/gradsync-run" -np 2 "./$1" >"$tmp/$1.log" 2>&1 || {
    cat "$tmp/$1.log"
    fail "$1: the 2-rank job failed"
  }
  [ "$(grep -c "fc1/weight averaged correctly" "$tmp/$1.log")" = 2 ] || {
    cat "$tmp/$1.log"
    fail "$1: not both ranks averaged correctly"
  }
}
# static_only PROGRAM: libgradsync linked in, not needed at run time.
static_only() {
  if readelf -d "$1" | has 'NEEDED.*libgradsync'; then
    fail "$1 needs libgradsync.so although linked against libgradsync.a"
  fi
  nm "$1" | has ' T gs_allreduce_async$' || fail "$1 does not contain gs_allreduce_async"
}

step "pkg-config, shared (the README's command)"
# shellcheck disable=SC2046,SC2086
cc app.c -o app-pc $(pkg-config --cflags --libs gradsync) -Wl,-rpath,"$(pkg-config --variable=libdir gradsync)" $extra
run_app app-pc

step "pkg-config, static (libgradsync.a + Libs.private/Requires.private)"
# shellcheck disable=SC2046,SC2086
cc app.c -o app-pc-static $(pkg-config --cflags gradsync) "$(pkg-config --variable=libdir gradsync)/libgradsync.a" \
  -Wl,--as-needed $(pkg-config --static --libs gradsync) $extra
static_only app-pc-static
run_app app-pc-static

step "CMake: find_package(gradsync) -> gradsync::gradsync, gradsync::gradsync_static"
mkdir consumer
cp "$src/tests/install/consumer/CMakeLists.txt" consumer/
cp app.c consumer/
cmake -S consumer -B consumer/build -DCMAKE_PREFIX_PATH="$p" -DCMAKE_C_FLAGS="$extra" \
  -DCMAKE_EXE_LINKER_FLAGS="$extra" >"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log"
  fail "configuring a project with find_package(gradsync)"
}
cmake --build consumer/build >>"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log"
  fail "building against gradsync::gradsync / gradsync::gradsync_static"
}
cp consumer/build/app-cmake consumer/build/app-cmake-static .
static_only app-cmake-static
run_app app-cmake
run_app app-cmake-static

step "cpack -G DEB: dependencies computed by dpkg-shlibdeps"
if ! command -v dpkg-shlibdeps >/dev/null; then
  echo "test_install: dpkg-shlibdeps missing (dpkg-dev); the .deb part is not checked"
  exit 77
fi
(cd "$build" && cpack -G DEB -B "$tmp/deb" >"$tmp/cpack.log" 2>&1) || {
  cat "$tmp/cpack.log"
  fail "cpack -G DEB failed"
}
rt=$(ls "$tmp"/deb/gradsync_*.deb)
dev=$(ls "$tmp"/deb/gradsync-dev_*.deb)
depends=$(dpkg-deb -f "$rt" Depends)
echo "gradsync Depends: $depends"
for need in libc6 libgrpc29 libprotobuf-c1; do
  grep -q "\b$need\b" <<<"$depends" || fail "$rt: Depends lacks $need: $depends"
done
dpkg-deb -c "$rt" | has '/usr/bin/gradsyncd$' || fail "$rt lacks /usr/bin/gradsyncd"
dpkg-deb -c "$rt" | has '/usr/lib/libgradsync.so.0' || fail "$rt lacks libgradsync.so.0"
dpkg-deb -f "$dev" Depends | has 'gradsync (=' || fail "$dev does not depend on gradsync"
dpkg-deb -c "$dev" | has '/usr/include/gradsync.h$' || fail "$dev lacks gradsync.h"
dpkg-deb -c "$dev" | has '/usr/lib/pkgconfig/gradsync.pc$' || fail "$dev lacks gradsync.pc"
echo "test_install: all checks passed"
