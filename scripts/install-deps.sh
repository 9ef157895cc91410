#!/usr/bin/env bash
# Installs the Debian 12 packages gradsync needs to build and test, if any
# is missing. Runs as root (or via sudo when available). Idempotent.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libgrpc-dev protobuf-compiler
  libprotobuf-dev protobuf-c-compiler libprotobuf-c-dev grpc-proto libcmocka-dev
  openssl valgrind uthash-dev libmicrohttpd-dev python3-grpcio python3-protobuf iproute2
  clang-format procps openssh-server openssh-client openmpi-bin libopenmpi-dev clang libclang-rt-14-dev
  python3-torch python3-numpy python3-pytest python3-pip python3-setuptools
  podman runc debootstrap dpkg-dev yamllint nodejs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (docker/k8s/check.sh): Debian's package, unless a node install brings
# its own (NodeSource's nodejs conflicts with Debian's npm).
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
