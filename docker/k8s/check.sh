#!/usr/bin/env bash
# docker/k8s/check.sh: lints the deployment manifests. yamllint (Debian's,
# strict) over docker/compose.yaml and docker/k8s/*.yaml, then every
# Kubernetes document validated against the API's JSON schemas with the npm
# package kubernetes-models (docker/k8s/validate.mjs), installed once into
# $GRADSYNC_NPM_CACHE (default /var/cache/gradsync/npm), outside the clone.
# Exit 0 pass, 1 fail, 77 skip (yamllint, node or npm missing, or npm
# cannot install).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${GRADSYNC_NPM_CACHE:-/var/cache/gradsync/npm}
for tool in yamllint node npm; do
  command -v "$tool" >/dev/null || {
    echo "k8s-check: SKIP: $tool is not installed (scripts/install-deps.sh installs it)"
    exit 77
  }
done
yamllint -s "$here/../compose.yaml" "$here"/*.yaml
echo "k8s-check: yamllint -s: clean"
if [ ! -d "$cache/node_modules/kubernetes-models" ] || [ ! -d "$cache/node_modules/yaml" ]; then
  mkdir -p "$cache"
  if ! npm install --prefix "$cache" --no-audit --no-fund --silent kubernetes-models@5 yaml@2 \
    >"$cache/install.log" 2>&1; then
    cat "$cache/install.log"
    echo "k8s-check: SKIP: npm could not install kubernetes-models"
    exit 77
  fi
fi
# Node resolves packages from the script's directory upwards: run a copy
# beside the cached node_modules.
cp "$here/validate.mjs" "$cache/validate.mjs"
node "$cache/validate.mjs" "$here"/*.yaml
# The validator must also reject: a port that is not a number and a
# restartPolicy Kubernetes does not know.
bad=$(mktemp --suffix=.yaml)
trap 'rm -f "$bad"' EXIT
sed 's/containerPort: 50051/containerPort: "grpc-port"/; s/restartPolicy: Never/restartPolicy: Sometimes/' \
  "$here/coordinator.yaml" >"$bad"
if node "$cache/validate.mjs" "$bad" >"$bad.out" 2>&1; then
  cat "$bad.out"
  echo "k8s-check: FAIL: the validator accepted a broken manifest"
  rm -f "$bad.out"
  exit 1
fi
grep -q "containerPort must be integer" "$bad.out" && grep -q "restartPolicy must be equal to one of" "$bad.out" || {
  cat "$bad.out"
  rm -f "$bad.out"
  echo "k8s-check: FAIL: the validator did not name both faults"
  exit 1
}
rm -f "$bad.out"
echo "k8s-check: a broken manifest is rejected naming both faults; PASS"
