#!/bin/bash
# netns.sh BINDIR [hier]: the multi-host path of gradsync, on one machine.
#
# Builds a small private network out of network namespaces: a hub namespace
# holding a bridge, and one namespace each for the coordinator and three
# ranks, joined to the bridge by veth pairs, addressed from TEST-NET-1
# (coordinator 192.0.2.1, ranks 192.0.2.11-13). Runs gradsyncd in its
# namespace and `gs-test-worker ops` as ranks 0..2, each in its own namespace,
# so every control and data connection crosses the bridge between distinct
# addresses. Asserts that every rank passes, that each rank holds an
# established data-plane connection to another rank's 192.0.2.x address
# (and one to the coordinator), and that gradsyncd exits 0 by itself once
# the job is over.
#
# With "hier": two rank namespaces ("hosts") of two ranks each (ranks 0,1 at
# 192.0.2.11, ranks 2,3 at 192.0.2.12) under GRADSYNC_BACKEND=shm, so the
# hierarchical transport must run (shared memory inside each namespace, a
# TCP ring between the leaders, ranks 0 and 2); every rank must log it and
# pass every check, and no segment of the job may stay in /dev/shm.
#
# Exit 0 = PASS, 1 = FAIL, 77 = SKIP (not root, or `ip netns` unusable).
# Everything it creates (processes, namespaces, links, files) is removed on
# exit; no traffic leaves its namespaces.
set -u

BIN=${1:-}
MODE=${2:-flat}
P="gs-$$"
HUB="$P-hub"
COORD_NS="$P-coord"
COORD_IP=192.0.2.1
if [ "$MODE" = hier ]; then # rank i runs in host namespace i / PER
  HOST_NS=("$P-r0" "$P-r1")
  HOST_IP=(192.0.2.11 192.0.2.12)
  NR=4 PER=2 BACKEND=shm
else
  HOST_NS=("$P-r0" "$P-r1" "$P-r2")
  HOST_IP=(192.0.2.11 192.0.2.12 192.0.2.13)
  NR=3 PER=1 BACKEND=auto
fi
NH=${#HOST_NS[@]}
RANKS=$(seq 0 $((NR - 1)))
HOSTS=$(seq 0 $((NH - 1)))
NSS=()
TMP=""
PASSED=0

say() { echo "netns: $*"; }
skip() {
  say "SKIP: $*"
  exit 77
}

dump() {
  local f
  for f in "$TMP"/*.out; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") ----"
    sed 's/^/    /' "$f"
  done
}

fail() {
  say "FAIL: $*"
  dump
  exit 1
}

cleanup() {
  local rc=$? ns pids
  trap - EXIT INT TERM HUP
  exec 2>/dev/null # no "Killed" job notices for what we kill here
  # Every process in our namespaces, then the namespaces; deleting a
  # namespace removes its end of each veth pair and with it the peer.
  for ns in "${NSS[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${NSS[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null
  done
  wait 2>/dev/null
  [ -n "$TMP" ] && rm -rf "$TMP"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ "$PASSED" -eq 0 ]; then
    say "FAIL (exit $rc)"
  fi
  exit "$rc"
}

[ -n "$BIN" ] || {
  echo "usage: netns.sh BINDIR" >&2
  exit 2
}
[ "$(id -u)" = 0 ] || skip "needs root"
command -v ip >/dev/null 2>&1 || skip "no ip(8)"
command -v ss >/dev/null 2>&1 || skip "no ss(8)"
command -v timeout >/dev/null 2>&1 || skip "no timeout(1)"
ip netns add "$P-probe" 2>/dev/null || skip "ip netns does not work here"
ip netns del "$P-probe"
for prog in gradsyncd gs-test-worker; do
  [ -x "$BIN/$prog" ] || {
    say "FAIL: $BIN/$prog missing"
    exit 1
  }
done

trap cleanup EXIT
trap 'exit 1' INT TERM HUP
TMP=$(mktemp -d /tmp/gs-netns-XXXXXX) || fail "mktemp"

# ---- the network ------------------------------------------------------------
add_ns() {
  ip netns add "$1" || fail "ip netns add $1"
  NSS+=("$1")
  ip -n "$1" link set lo up || fail "lo up in $1"
}

add_ns "$HUB"
ip -n "$HUB" link add br0 type bridge || fail "bridge in $HUB"
ip -n "$HUB" link set br0 up || fail "br0 up"

# attach NS ADDR PEERNAME: eth0 in NS, its peer on the hub's bridge.
attach() {
  local ns=$1 addr=$2 peer=$3
  add_ns "$ns"
  ip -n "$ns" link add eth0 type veth peer name "$peer" netns "$HUB" || fail "veth $ns"
  ip -n "$HUB" link set "$peer" master br0 || fail "$peer into br0"
  ip -n "$HUB" link set "$peer" up || fail "$peer up"
  ip -n "$ns" addr add "$addr/24" dev eth0 || fail "address $addr in $ns"
  ip -n "$ns" link set eth0 up || fail "eth0 up in $ns"
}

attach "$COORD_NS" "$COORD_IP" p-coord
for h in $HOSTS; do attach "${HOST_NS[$h]}" "${HOST_IP[$h]}" "p-r$h"; done

# The bridge forwards at once (no STP); where ping(8) exists, make sure every
# rank reaches the coordinator before starting anything (bounded).
if command -v ping >/dev/null 2>&1; then
  for h in $HOSTS; do
    ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "${HOST_NS[$h]}" ping -c1 -W1 "$COORD_IP" >/dev/null 2>&1; then
        ok=1
        break
      fi
      sleep 0.2
    done
    [ $ok -eq 1 ] || fail "${HOST_NS[$h]} (${HOST_IP[$h]}) cannot reach $COORD_IP over the bridge"
  done
fi

# ---- the coordinator ----------------------------------------------------------
# Off loopback gradsyncd refuses to start without authentication.
if ip netns exec "$COORD_NS" env -u GRADSYNC_JOB_TOKEN timeout -k 5 20 "$BIN/gradsyncd" \
  --listen "$COORD_IP:0" --world-size $NR >"$TMP/refused.out" 2>&1; then
  fail "gradsyncd served $COORD_IP without a token or TLS"
fi
grep -q -- "--token-file" "$TMP/refused.out" && grep -q -- "--insecure" "$TMP/refused.out" ||
  fail "gradsyncd's refusal does not name --token-file and --insecure: $(cat "$TMP/refused.out")"
TOKEN=$(openssl rand -hex 32)
printf '%s\n' "$TOKEN" >"$TMP/token"
chmod 600 "$TMP/token"
ip netns exec "$COORD_NS" timeout -k 5 150 "$BIN/gradsyncd" --listen "$COORD_IP:0" --world-size $NR \
  --token-file "$TMP/token" >"$TMP/gradsyncd.out" 2>&1 &
COORD_PID=$!
ADDR=""
for _ in $(seq 1 300); do
  ADDR=$(sed -n 's/^gradsyncd listening on \([^[:space:]]*\)[[:space:]]*$/\1/p' "$TMP/gradsyncd.out" | head -n1)
  [ -n "$ADDR" ] && break
  kill -0 $COORD_PID 2>/dev/null || break
  sleep 0.1
done
[ -n "$ADDR" ] || fail "gradsyncd did not print 'gradsyncd listening on HOST:PORT'"
PORT=${ADDR##*:}
[ "${ADDR%:*}" = "$COORD_IP" ] || fail "gradsyncd listens on $ADDR, expected $COORD_IP:PORT"
case $PORT in
'' | *[!0-9]*) fail "bad port in '$ADDR'" ;;
esac
say "gradsyncd listening on $ADDR in $COORD_NS"

# ---- the ranks ---------------------------------------------------------------
RELEASE="$TMP/release"
RANK_PID=()
for i in $RANKS; do
  ip netns exec "${HOST_NS[$((i / PER))]}" env -u GRADSYNC_ADVERTISE_ADDR \
    GRADSYNC_COORDINATOR="$COORD_IP:$PORT" GRADSYNC_RANK=$i GRADSYNC_SIZE=$NR \
    GRADSYNC_LOCAL_RANK=$((i % PER)) GRADSYNC_LOCAL_SIZE=$PER GRADSYNC_JOIN_TIMEOUT_MS=60000 \
    GRADSYNC_BACKEND=$BACKEND GRADSYNC_LOG_LEVEL=info \
    GRADSYNC_JOB_TOKEN="$TOKEN" GS_TEST_WAIT_FILE="$RELEASE" \
    timeout -k 5 120 "$BIN/gs-test-worker" ops >"$TMP/rank$i.out" 2>&1 &
  RANK_PID+=($!)
done

# Every rank checks its results, then waits for $RELEASE with its data plane
# still up: look at its connections meanwhile.
for i in $RANKS; do
  ok=0
  for _ in $(seq 1 1200); do
    if grep -q "waiting for $RELEASE" "$TMP/rank$i.out" 2>/dev/null; then
      ok=1
      break
    fi
    kill -0 "${RANK_PID[$i]}" 2>/dev/null || break
    sleep 0.1
  done
  [ $ok -eq 1 ] || fail "rank $i did not finish its checks"
  grep -q "ops: [0-9]* checks passed" "$TMP/rank$i.out" || fail "rank $i: no 'checks passed'"
done

# established TCP connections in NS as "LOCALIP PEERIP" lines
conns() {
  ip netns exec "$1" ss -tnH state established 2>/dev/null | awk '{
    n = 0
    for (f = 1; f <= NF; f++)
      if ($f ~ /^(\[::ffff:)?192\.0\.2\.[0-9]+\]?:[0-9]+$/) a[++n] = $f
    if (n >= 2) {
      for (k = 1; k <= 2; k++) { sub(/^\[::ffff:/, "", a[k]); sub(/\]/, "", a[k]) }
      p = a[2]
      sub(/:[0-9]+$/, "", a[1]); sub(/:[0-9]+$/, "", a[2])
      print a[1], a[2], p
    }
  }'
}

for h in $HOSTS; do
  conns "${HOST_NS[$h]}" >"$TMP/conns$h.txt"
  {
    echo "${HOST_NS[$h]} connections:"
    sed 's/^/    /' "$TMP/conns$h.txt"
  } >>"$TMP/ss.out"
  peers=$(awk -v me="${HOST_IP[$h]}" '$1 == me && $2 ~ /^192\.0\.2\.1[1-3]$/ && $2 != me { print $2 }' \
    "$TMP/conns$h.txt" | sort -u | tr '\n' ' ')
  [ -n "$peers" ] || fail "${HOST_NS[$h]} (${HOST_IP[$h]}): no data-plane connection to another host"
  awk -v me="${HOST_IP[$h]}" -v c="$COORD_IP:$PORT" '$1 == me && $3 == c { f = 1 } END { exit !f }' \
    "$TMP/conns$h.txt" || fail "${HOST_NS[$h]} (${HOST_IP[$h]}): no connection to the coordinator $COORD_IP:$PORT"
  say "${HOST_NS[$h]} (${HOST_IP[$h]}): data plane connected to ${peers% }"
done

# The transport each rank chose (its log line), and no segment left behind.
for i in $RANKS; do
  h=$((i / PER))
  if [ "$MODE" = hier ]; then
    want="host buffers: hierarchical (2 hosts; ranks [$((h * PER)),$((h * PER + 1))] on this host over shared memory, leader rank $((h * PER)) in a TCP ring of the hosts' leaders; segment /gradsync-"
  else
    want="host buffers: tcp (each of the 3 ranks is alone on its host)"
  fi
  grep -qF "$want" "$TMP/rank$i.out" || fail "rank $i did not log: $want"
  seg=$(sed -n 's/.*host buffers: hierarchical .*; segment \(\/gradsync-[0-9a-f-]*\),.*/\1/p' \
    "$TMP/rank$i.out" | head -n1)
  [ "$MODE" != hier ] || [ -n "$seg" ] || fail "rank $i did not log its segment"
  [ -z "$seg" ] || [ ! -e "/dev/shm$seg" ] || fail "/dev/shm$seg exists while the job runs"
done

touch "$RELEASE"
for i in $RANKS; do
  wait "${RANK_PID[$i]}"
  rc=$?
  [ $rc -eq 0 ] || fail "rank $i exited with $rc"
done

# One job per coordinator: once every rank left, gradsyncd exits 0 by
# itself (timeout(1) passes its status on).
wait $COORD_PID
rc=$?
[ $rc -eq 0 ] || fail "gradsyncd exited with $rc after the job, expected 0"
grep -q "job (epoch 1) finished: all $NR ranks left cleanly" "$TMP/gradsyncd.out" ||
  fail "gradsyncd did not log that the job finished"

PASSED=1
say "PASS: gradsyncd at $COORD_IP:$PORT and $NR ranks in $NH namespaces ($MODE); ops checked on every rank"
exit 0
