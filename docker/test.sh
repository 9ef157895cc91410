#!/usr/bin/env bash
# docker/test.sh BUILD_DIR: the container images, proven to run, with
# podman (runc, host networking), as an operator would use them.
#
#  1. base images debian:12 / debian:12-slim from debootstrap (cached in
#     /var/cache/gradsync: docker/base-images.sh);
#  2. both images (coordinator, the default target, and worker) built
#     with `podman build --format docker`;
#  3. the .deb the build stage made (cpack) installed with apt into a
#     clean debian:12-slim root: its computed Depends suffice for gradsyncd
#     and a 2-rank demo job; the coordinator image: at most 100 MB, user
#     10001, port 50051, STOPSIGNAL SIGTERM, the version label, every
#     library of every program resolved, no token = refusal;
#  4. a job: the coordinator container and 2 worker containers on host
#     networking (free ports): both workers exit 0, the HEALTHCHECK turns
#     healthy while the job runs (when the image has one), the coordinator
#     container exits 0 after the job;
#  5. SIGTERM mid-job (`podman stop`): while the coordinator drains,
#     gradsyncctl health (from the host) gets NOT_SERVING; the coordinator
#     container exits 0 within its grace period (by its log's clock) and
#     every worker fails with GS_ERR_COORDINATOR_LOST saying the
#     coordinator was shut down.
# Prints what each step cost and the total. Exit 0 pass, 1 fail, 77 skip
# (not root, podman/runc/debootstrap missing, podman cannot run a
# container here, or BUILD_DIR is a sanitizer build: CI runs it once, with
# the plain build).
set -euo pipefail
build=$(cd "${1:?usage: docker/test.sh BUILD_DIR}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
t0=$SECONDS
tag=$$
P=(podman --runtime runc)
RUN=(--network host --ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
img_co=localhost/gradsyncd:test-$tag
img_wk=localhost/gradsync-train:test-$tag
img_bd=localhost/gradsync-build:test-$tag
containers=()
tmp=$(mktemp -d /tmp/gs-container.XXXXXX)
# The host's apt archive (scripts/install-deps.sh filled it) as an overlay
# for the image builds and the .deb's root: apt takes the packages it
# already holds instead of downloading them again, and whatever apt writes
# or deletes there stays in the overlay. GRADSYNC_APT_ARCHIVE= turns it off.
archive=${GRADSYNC_APT_ARCHIVE-/var/cache/apt/archives}
APT=()
[ -n "$archive" ] && [ -d "$archive" ] && APT=(-v "$archive:/var/cache/apt/archives:O")

say() { echo "container-test: $*"; }
skip() {
  say "SKIP: $*"
  exit 77
}
fail() {
  say "FAIL: $*"
  for c in "${containers[@]}"; do
    echo "---- podman logs $c ----"
    "${P[@]}" logs "$c" 2>&1 | tail -40 | sed 's/^/    /' || true
  done
  exit 1
}
cleanup() {
  for c in "${containers[@]}"; do "${P[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  "${P[@]}" rmi -f "$img_co" "$img_wk" "$img_bd" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
lap() {
  say "$1: $((SECONDS - lap_t)) s"
  lap_t=$SECONDS
}
lap_t=$SECONDS

[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, rootful podman)"
for tool in podman runc debootstrap python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh installs it)"
done
if grep -q '^GRADSYNC_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  skip "$build is a sanitizer build; the container test runs with the plain build"
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# start NAME ARGS...: podman run -d, remembered for the logs and the cleanup.
start() {
  local name=$1
  shift
  containers+=("$name")
  "${P[@]}" run -d --name "$name" "${RUN[@]}" "$@" >/dev/null
}
# wait_exit NAME SECONDS: the container's exit code ("timeout" if still running).
wait_exit() {
  local name=$1 limit=$2 end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    if [ "$("${P[@]}" inspect -f '{{.State.Running}}' "$name")" = false ]; then
      "${P[@]}" inspect -f '{{.State.ExitCode}}' "$name"
      return
    fi
    sleep 0.5
  done
  echo "timeout after ${limit}s"
}
# wait_log NAME TEXT SECONDS: until the container's output has TEXT.
wait_log() {
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    "${P[@]}" logs "$1" 2>&1 | grep -F -- "$2" >/dev/null && return 0
    sleep 0.5
  done
  fail "$1 did not print \"$2\" within $3 s"
}
expect_log() {
  "${P[@]}" logs "$1" 2>&1 | grep -F -- "$2" >/dev/null || fail "$1: output lacks \"$2\""
}

# ---- 1. base images ----------------------------------------------------------
bash "$src/docker/base-images.sh" || fail "could not make the base images"
if ! "${P[@]}" run --rm "${RUN[@]}" docker.io/library/debian:12-slim true >"$tmp/probe" 2>&1; then
  cat "$tmp/probe"
  skip "podman cannot run a container here (output above)"
fi
lap "base images"

# ---- 2. the images -------------------------------------------------------------------
build_image() {
  "${P[@]}" build --format docker --pull=never "${RUN[@]}" "${APT[@]}" \
    -f "$src/docker/Dockerfile" "$@" "$src" >"$tmp/build.log" 2>&1 || {
    tail -40 "$tmp/build.log"
    fail "podman build $* failed"
  }
}
build_image -t "$img_co"
build_image --target worker -t "$img_wk"
lap "images built"

# ---- 3. the .deb into a clean debian:12-slim root ---------------------------------
# The .deb the image's build stage made (cpack -G DEB, Depends computed by
# dpkg-shlibdeps; built once, for both images and this step). The host's
# own build may link the nccl backend against a CUDA outside Debian
# (/usr/local/cuda), whose package no Debian root can satisfy.
build_image --target build -t "$img_bd"
containers+=("gs-debx-$tag")
"${P[@]}" create --name "gs-debx-$tag" "$img_bd" true >/dev/null
mkdir -p "$tmp/deb"
"${P[@]}" cp "gs-debx-$tag:/pkg/." "$tmp/deb/" || fail "copying the .deb out of the build stage"
"${P[@]}" rm -f "gs-debx-$tag" >/dev/null
ls "$tmp"/deb/gradsync_*.deb >/dev/null 2>&1 || fail "the build stage made no gradsync_*.deb"
containers+=("gs-deb-$tag")
"${P[@]}" run --name "gs-deb-$tag" "${RUN[@]}" "${APT[@]}" -v "$tmp/deb:/deb:ro" docker.io/library/debian:12-slim \
  sh -ec 'apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends /deb/gradsync_*.deb >/dev/null
    gradsyncd --help >/dev/null
    ldd /usr/bin/gradsyncd /usr/bin/gradsync-train | grep "not found" && exit 1
    gradsync-run -np 2 gradsync-train --steps 10' >"$tmp/deb.log" 2>&1 ||
  fail "installing the .deb with apt into debian:12-slim and running a job: $(tail -20 "$tmp/deb.log")"
grep -q "parameters identical on all 2 ranks" "$tmp/deb.log" ||
  fail "the job in the .deb's root did not finish: $(tail -20 "$tmp/deb.log")"
"${P[@]}" rm -f "gs-deb-$tag" >/dev/null
lap ".deb installed with apt into debian:12-slim, 2-rank job ran"

size=$("${P[@]}" image inspect -f '{{.Size}}' "$img_co")
say "coordinator image: $size bytes ($((size / 1000000)) MB)"
[ "$size" -le 100000000 ] || fail "the coordinator image is $size bytes, more than 100 MB"
inspect() { "${P[@]}" image inspect -f "$1" "$img_co"; }
[ "$(inspect '{{.Config.User}}')" = 10001:10001 ] || fail "image user is $(inspect '{{.Config.User}}')"
inspect '{{.Config.ExposedPorts}}' | grep 50051 >/dev/null || fail "image does not expose 50051"
[ "$(inspect '{{.Config.StopSignal}}')" = SIGTERM ] || fail "STOPSIGNAL is $(inspect '{{.Config.StopSignal}}')"
version=$(sed -n 's/^project(gradsync VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ "$(inspect '{{index .Config.Labels "org.opencontainers.image.version"}}')" = "$version" ] ||
  fail "label org.opencontainers.image.version is not $version"
health=$(inspect '{{if .Config.Healthcheck}}{{.Config.Healthcheck.Test}}{{end}}')
missing=$("${P[@]}" run --rm "${RUN[@]}" --entrypoint sh "$img_co" -c \
  'ldd /usr/bin/gradsync* /usr/lib/libgradsync.so.0 | grep "not found" || true')
[ -z "$missing" ] || fail "libraries missing in the image: $missing"

# No token, no TLS, on the image's 0.0.0.0: refused (exit 2), unless
# GRADSYNC_INSECURE=1.
rc=0
"${P[@]}" run --rm "${RUN[@]}" -e GRADSYNC_LISTEN=0.0.0.0:$(free_port) "$img_co" >"$tmp/refuse.log" 2>&1 ||
  rc=$?
[ "$rc" = 2 ] || fail "the coordinator without a token exited with $rc, expected 2: $(cat "$tmp/refuse.log")"
grep -q "refusing to serve 0.0.0.0:.* without authentication" "$tmp/refuse.log" ||
  fail "no refusal text: $(cat "$tmp/refuse.log")"
lap "image checks; no token on 0.0.0.0 refused"

# ---- 4. a job: coordinator + 2 workers ---------------------------------------------
# The coordinator reads the token from a file (as from a Kubernetes or
# compose secret), the workers from GRADSYNC_JOB_TOKEN.
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token" >"$tmp/token"
chmod 644 "$tmp/token"
port=$(free_port)
co=gs-co-$tag
start "$co" --health-interval disable -e GRADSYNC_LISTEN=0.0.0.0:$port -e GRADSYNC_WORLD_SIZE=2 \
  -v "$tmp/token:/run/secrets/job_token:ro" -e GRADSYNC_TOKEN_FILE=/run/secrets/job_token "$img_co"
wait_log "$co" "gradsyncd listening on 0.0.0.0:$port" 30
if [ -n "$health" ]; then
  "${P[@]}" healthcheck run "$co" >/dev/null 2>&1 || fail "the HEALTHCHECK ($health) is not healthy"
  [ "$("${P[@]}" inspect -f '{{.State.Health.Status}}' "$co")" = healthy ] ||
    fail "health status is $("${P[@]}" inspect -f '{{.State.Health.Status}}' "$co")"
  say "HEALTHCHECK $health: healthy"
else
  fail "the coordinator image has no HEALTHCHECK"
fi
for r in 0 1; do
  start "gs-w$r-$tag" -e GRADSYNC_COORDINATOR=127.0.0.1:$port -e GRADSYNC_RANK=$r -e GRADSYNC_SIZE=2 \
    -e GRADSYNC_JOB_TOKEN="$token" "$img_wk" --steps 100
done
for r in 0 1; do
  rc=$(wait_exit "gs-w$r-$tag" 180)
  [ "$rc" = 0 ] || fail "worker $r exited with $rc"
done
expect_log "gs-w0-$tag" "parameters identical on all 2 ranks"
rc=$(wait_exit "$co" 60)
[ "$rc" = 0 ] || fail "the coordinator container exited with $rc after the job, expected 0"
expect_log "$co" "job (epoch 1) finished: all 2 ranks left cleanly"
lap "job: 2 worker containers exit 0, coordinator container exits 0"

# ---- 5. SIGTERM mid-job ----------------------------------------------------------------
port=$(free_port)
co=gs-co2-$tag
grace=10
start "$co" --health-interval disable -e GRADSYNC_LISTEN=127.0.0.1:$port -e GRADSYNC_WORLD_SIZE=2 \
  -e GRADSYNC_JOB_TOKEN="$token" "$img_co"
wait_log "$co" "gradsyncd listening on 127.0.0.1:$port" 30
for r in 0 1; do
  start "gs-t$r-$tag" -e GRADSYNC_COORDINATOR=127.0.0.1:$port -e GRADSYNC_RANK=$r -e GRADSYNC_SIZE=2 \
    -e GRADSYNC_JOB_TOKEN="$token" "$img_wk" --steps 1000000 --log-every 10
done
wait_log "gs-t0-$tag" "step 20/1000000" 120
stop_t=$SECONDS
# podman stop sends the image's STOPSIGNAL, then SIGKILL after -t seconds.
"${P[@]}" stop -t $((grace + 5)) "$co" >/dev/null &
stop_pid=$!
# The drain: the port stays open and health answers NOT_SERVING.
wait_log "$co" "draining for $((grace - 2)).0 s: health NOT_SERVING" 30
probe=$("$build/bin/gradsyncctl" --addr "127.0.0.1:$port" --timeout-s 4 health 2>&1) && prc=0 || prc=$?
[ "$prc" = 3 ] && [ "$probe" = NOT_SERVING ] ||
  fail "gradsyncctl health during the drain: exit $prc, '$probe' (expected NOT_SERVING, exit 3)"
wait "$stop_pid" || fail "podman stop failed"
took=$((SECONDS - stop_t))
rc=$("${P[@]}" inspect -f '{{.State.ExitCode}}' "$co")
[ "$rc" = 0 ] || fail "the coordinator container exited with $rc on SIGTERM, expected 0"
expect_log "$co" "received SIGTERM"
# Within the grace, by gradsyncd's own clock (podman's stop adds its own time).
stamp() {
  "${P[@]}" logs "$co" 2>&1 | sed -n "s/^time=\([^ ]*\) .*$1.*/\1/p" | head -1
}
t_sig=$(stamp 'received SIGTERM') t_end=$(stamp 'msg="stopped"')
[ -n "$t_sig" ] && [ -n "$t_end" ] || fail "no 'received SIGTERM' / 'stopped' log lines"
ms=$(($(date -d "$t_end" +%s%3N) - $(date -d "$t_sig" +%s%3N)))
[ "$ms" -le $((grace * 1000)) ] || fail "gradsyncd took $ms ms from SIGTERM to exit, more than its grace of $grace s"
for r in 0 1; do
  rc=$(wait_exit "gs-t$r-$tag" $((grace + 20)))
  [ "$rc" = 1 ] || fail "worker $r exited with $rc after the coordinator's SIGTERM, expected 1"
  expect_log "gs-t$r-$tag" "failed: GS_ERR_COORDINATOR_LOST: "
  expect_log "gs-t$r-$tag" "it was shut down while the job ran"
done
lap "SIGTERM mid-job: health NOT_SERVING during the drain, gradsyncd exit 0 $ms ms after the signal (podman stop: ${took} s), workers GS_ERR_COORDINATOR_LOST"

say "PASS in $((SECONDS - t0)) s"
