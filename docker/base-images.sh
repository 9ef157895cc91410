#!/usr/bin/env bash
# Makes the base images docker/Dockerfile builds FROM, without a registry:
# docker.io/library/debian:12 and docker.io/library/debian:12-slim, each a
# `debootstrap --variant=minbase bookworm` root cleaned the way the official
# images are (debuerreotype): apt lists and caches removed, the container apt
# settings (no recommends kept, no translations, caches cleaned after every
# install), an empty machine-id, no logs; the slim one also without docs
# (copyright files kept), man pages and locales, and dpkg set to keep them
# out of later installs.
#
# The root file system tarballs are cached in $GRADSYNC_IMAGE_CACHE
# (default /var/cache/gradsync), outside any clone, so that CI builds them
# once per machine; an image already present in podman is left alone.
# Needs root, debootstrap and podman. The Debian mirror is the one apt is
# configured with (first bookworm source), or $GRADSYNC_DEBIAN_MIRROR.
#
#   docker/base-images.sh            # make whatever is missing
#   docker/base-images.sh --rebuild  # throw the cache away and start again
set -euo pipefail

cache=${GRADSYNC_IMAGE_CACHE:-/var/cache/gradsync}
suite=bookworm
rebuild=0
[ "${1:-}" = --rebuild ] && rebuild=1
podman=(podman --runtime runc)

log() { echo "base-images: $*" >&2; }

mirror() {
  if [ -n "${GRADSYNC_DEBIAN_MIRROR:-}" ]; then
    echo "$GRADSYNC_DEBIAN_MIRROR"
    return
  fi
  local f uri
  # deb822 sources first (Debian 12's default), then one-line sources.
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ && u !~ /security/ {print u; exit}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  uri=$(grep -hs '^deb .* bookworm ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '{print $2; exit}')
  echo "${uri:-http://deb.debian.org/debian}"
}

# clean ROOT: what the official debian:12 image does after debootstrap.
clean_common() {
  local root=$1
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  # Services never start inside an image build.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  # Sources in deb822 form, as the official image has them.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $2
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${2%/debian}/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/cache/apt/archives/partial/* "$root"/var/cache/debconf/*-old \
    "$root"/var/lib/dpkg/*-old "$root"/tmp/* "$root"/var/tmp/*
  find "$root/var/log" -type f -exec truncate -s 0 {} +
  : >"$root/etc/machine-id"
  rm -f "$root/var/lib/dbus/machine-id" "$root/etc/hostname" "$root/etc/resolv.conf"
  printf 'localhost\n' >"$root/etc/hostname"
}

# slim: no docs, man pages or locales, now or in later installs.
clean_slim() {
  local root=$1
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/groff/* "$root"/usr/share/info/* \
    "$root"/usr/share/lintian/* "$root"/usr/share/linda/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
}

# make_tarball NAME: the tarball for NAME (12, or 12-slim made from 12's).
make_tarball() {
  local name=$1 tar=$cache/debian-$1.tar root m
  [ -s "$tar" ] && return 0
  root=$(mktemp -d "$cache/root.XXXXXX")
  if [ "$name" = 12-slim ]; then
    make_tarball 12
    tar --numeric-owner --xattrs -C "$root" -xf "$cache/debian-12.tar"
    clean_slim "$root"
  else
    m=$(mirror)
    log "debootstrap --variant=minbase $suite from $m (a few minutes, once per machine)"
    if ! debootstrap --variant=minbase "$suite" "$root" "$m" >"$root.log" 2>&1; then
      tail -20 "$root.log" >&2
      rm -rf "$root" "$root.log"
      log "debootstrap failed (log above); check the mirror $m or set GRADSYNC_DEBIAN_MIRROR"
      return 1
    fi
    rm -f "$root.log"
    clean_common "$root" "$m"
  fi
  tar --numeric-owner --xattrs -C "$root" -cf "$tar.tmp" .
  mv "$tar.tmp" "$tar"
  rm -rf "$root"
  log "$tar: $(du -h "$tar" | cut -f1)"
}

if [ "$(id -u)" -ne 0 ]; then
  log "needs root (debootstrap)"
  exit 1
fi
for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || {
    log "$tool not installed"
    exit 1
  }
done
mkdir -p "$cache"
if [ "$rebuild" = 1 ]; then
  rm -f "$cache"/debian-12.tar "$cache"/debian-12-slim.tar
  "${podman[@]}" rmi -f docker.io/library/debian:12 docker.io/library/debian:12-slim >/dev/null 2>&1 || true
fi
# One lock so that two CI runs on one machine do not debootstrap twice.
exec 9>"$cache/.lock"
flock 9
for name in 12 12-slim; do
  image=docker.io/library/debian:$name
  if "${podman[@]}" image exists "$image"; then
    continue
  fi
  make_tarball "$name"
  "${podman[@]}" import --change 'CMD ["bash"]' "$cache/debian-$name.tar" "$image" >/dev/null
  log "imported $image ($("${podman[@]}" image inspect --format '{{.Size}}' "$image") bytes)"
done
