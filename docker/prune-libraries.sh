#!/usr/bin/env bash
# prune-libraries.sh NEEDED PKG...: in the runtime image, removes the shared
# libraries that the packages PKG (those the image build just added) ship
# but no gradsync program loads. NEEDED lists the real paths of every library
# the programs load (ldd in the build stage, same package versions).
#
# Why: Debian's libgrpc29 depends on libprotobuf32 and libprotoc32 (for
# grpc's code-generator plugin library) and ships libgrpc_unsecure beside
# libgrpc; none of them is loaded by gradsync, and together they are 11 MB,
# more than the image's budget allows. The packages stay installed (so apt
# sees every dependency met); only the unused library files go, as the slim
# base image leaves out docs. Afterwards every program must still resolve
# every library (ldd), or this fails.
set -euo pipefail
needed=$1
shift
removed=0
for pkg in "$@"; do
  while read -r f; do
    case "$f" in
      */lib/*.so | */lib/*.so.* | */lib/*/*.so | */lib/*/*.so.* | */lib/*/*/*.so) ;;
      *) continue ;;
    esac
    [ -e "$f" ] || continue
    real=$(readlink -f "$f")
    grep -qxF "$real" "$needed" && continue
    echo "prune-libraries: $pkg: $f (not loaded by gradsync)"
    [ -L "$f" ] || removed=$((removed + $(stat -c %s "$f")))
    rm -f "$f"
  done < <(dpkg -L "$pkg" | sort -r)
done
# Dangling links left by the removals.
find / -xdev -xtype l -path '*/lib/*' -name '*.so*' -delete
ldconfig
echo "prune-libraries: removed $((removed / 1024)) KiB"
bad=$(ldd /usr/bin/gradsync* /usr/lib/libgradsync.so.0 2>&1 | grep 'not found' || true)
if [ -n "$bad" ]; then
  echo "prune-libraries: a needed library is gone: $bad" >&2
  exit 1
fi
