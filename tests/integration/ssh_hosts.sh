#!/bin/bash
# ssh_hosts.sh BINDIR [4|6]: gradsync-run across "hosts" over real OpenSSH.
#
# Builds a private network of network namespaces (a hub with a bridge; one
# namespace for the launcher and three "hosts"), addressed from TEST-NET-1
# (IPv4, the default) or from fd00:6773::/64 with no IPv4 on the link at all
# (argument 6). Each host runs Debian's sshd, started here with a throwaway
# host key and an authorized key, on port 2222. The launcher's namespace
# sees its own /etc/passwd copy whose root home is a temporary directory, so
# ssh's known_hosts goes there and nothing of the machine's ~/.ssh is used.
#
# Jobs, all `gradsync-run -np 4 -H h1:2,h2:1,h3:1` from the launcher's
# namespace:
#   A  the demo trains and ends with identical parameters on all 4 ranks
#      (--ssh-port, --ssh-identity, --tag-output, a ring port range);
#   B  a long demo: every host holds ring connections to other hosts'
#      addresses on ports of GRADSYNC_DATA_PORT_RANGE and one to the
#      coordinator; then rank 2 is SIGKILLed on its host: every other rank
#      fails naming rank 2, gradsync-run fails, and no process of the job
#      is left on any host;
#   C  the demo via --rsh (a wrapper that logs how it was called and execs
#      ssh): it ran once per rank as "CMD -p PORT -i FILE HOST COMMAND", every
#      rank got the job token gradsync-run made, and it is in no command line;
#      a refusing ssh port fails with ssh's error and status 255 explained;
#   D  ranks that ignore SIGPIPE and SIGHUP; the launcher is SIGKILLed: no
#      rank is left on any host;
#   E  --bind-to core --report-bindings, the third host's sshd started under
#      `taskset -c LAST`: every rank reads its own Cpus_allowed_list, which is
#      its host's i-th cpu (the third host's only cpu for rank 3), and the
#      launcher reports the same; then 2 ranks on that one-cpu host are
#      refused with the exact text, exit 2, and the demo's rank 0 waiting on
#      the first host is stopped (needs 2 cpus, else skipped).
# IPv6 runs A, D and E.
#
# Exit 0 = PASS, 1 = FAIL, 77 = SKIP (not root, no ip netns, no sshd/ssh).
set -u

BIN=${1:-}
FAMILY=${2:-4}
P="gsl$$"
NSS=()
TMP=""
SSHD_PIDS=()
PASSED=0

say() { echo "ssh_hosts($FAMILY): $*"; }
skip() {
  say "SKIP: $*"
  exit 77
}
dump() {
  local f
  for f in "$TMP"/*.out; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") ----"
    tail -n 60 "$f" | sed 's/^/    /'
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
  exec 2>/dev/null
  for ns in "${NSS[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${NSS[@]}"; do
    for _ in $(seq 1 20); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null
  done
  wait 2>/dev/null
  [ -n "$TMP" ] && [ -z "${KEEP:-}" ] && rm -rf "$TMP"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ "$PASSED" -eq 0 ] && say "FAIL (exit $rc)"
  exit "$rc"
}

[ -n "$BIN" ] || {
  echo "usage: ssh_hosts.sh BINDIR [4|6]" >&2
  exit 2
}
[ "$(id -u)" = 0 ] || skip "needs root"
for t in ip ss timeout ssh ssh-keygen unshare mount setsid; do
  command -v "$t" >/dev/null 2>&1 || skip "no $t"
done
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || skip "no sshd (Debian openssh-server)"
ip netns add "$P-probe" 2>/dev/null || skip "ip netns does not work here"
ip netns del "$P-probe"
for prog in gradsyncd gradsync-run gradsync-train; do
  [ -x "$BIN/$prog" ] || {
    say "FAIL: $BIN/$prog missing"
    exit 1
  }
done
BIN=$(cd "$BIN" && pwd)

trap cleanup EXIT
trap 'exit 1' INT TERM HUP
TMP=$(mktemp -d /tmp/gs-ssh-XXXXXX) || fail "mktemp"
chmod 755 "$TMP"

# ---- the network --------------------------------------------------------------
if [ "$FAMILY" = 6 ]; then
  LIP=fd00:6773::1
  HIP=(fd00:6773::11 fd00:6773::12 fd00:6773::13)
  PLEN=64
  HOSTS="[${HIP[0]}]:2,[${HIP[1]}]:1,[${HIP[2]}]:1"
else
  LIP=192.0.2.1
  HIP=(192.0.2.11 192.0.2.12 192.0.2.13)
  PLEN=24
  HOSTS="${HIP[0]}:2,${HIP[1]}:1,${HIP[2]}:1"
fi
HUB="$P-hub"
LNS="$P-l"
HNS=("$P-h1" "$P-h2" "$P-h3")

add_ns() {
  ip netns add "$1" || fail "ip netns add $1"
  NSS+=("$1")
  ip -n "$1" link set lo up || fail "lo up in $1"
}
add_ns "$HUB"
ip -n "$HUB" link add br0 type bridge || fail "bridge"
ip -n "$HUB" link set br0 up || fail "br0 up"
attach() {
  local ns=$1 addr=$2 peer=$3
  add_ns "$ns"
  ip -n "$ns" link add eth0 type veth peer name "$peer" netns "$HUB" || fail "veth $ns"
  ip -n "$HUB" link set "$peer" master br0 || fail "$peer into br0"
  ip -n "$HUB" link set "$peer" up || fail "$peer up"
  if [ "$FAMILY" = 6 ]; then
    ip -n "$ns" addr add "$addr/$PLEN" dev eth0 nodad || fail "address $addr in $ns"
  else
    ip -n "$ns" addr add "$addr/$PLEN" dev eth0 || fail "address $addr in $ns"
  fi
  ip -n "$ns" link set eth0 up || fail "eth0 up in $ns"
}
attach "$LNS" "$LIP" p-l
for i in 0 1 2; do attach "${HNS[$i]}" "${HIP[$i]}" "p-h$i"; done

# ---- sshd on every host, a key for the launcher -----------------------------
mkdir -p /run/sshd # sshd's privilege separation directory
ssh-keygen -q -t ed25519 -N '' -f "$TMP/hostkey" || fail "ssh-keygen host key"
ssh-keygen -q -t ed25519 -N '' -f "$TMP/id" || fail "ssh-keygen client key"
cp "$TMP/id.pub" "$TMP/authorized_keys"
cat >"$TMP/sshd_config" <<EOF
Port 2222
HostKey $TMP/hostkey
AuthorizedKeysFile $TMP/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
EOF
"$SSHD" -t -f "$TMP/sshd_config" || fail "sshd -t rejects the test's config"
# The cpus this test may use ("0-3,8" and expanded). The third host's sshd
# runs under `taskset -c LAST`: its sessions, and the ranks there, may use
# only the last of them (job E binds by each host's own cpus).
# shellcheck source=tests/integration/cpus.sh
. "$(dirname "$0")/cpus.sh"
LAST=${CPUS[${#CPUS[@]} - 1]}
for i in 0 1 2; do
  pin=()
  [ "$i" = 2 ] && pin=(taskset -c "$LAST")
  ip netns exec "${HNS[$i]}" "${pin[@]}" "$SSHD" -D -e -f "$TMP/sshd_config" \
    -o "ListenAddress=${HIP[$i]}" -o "PidFile=$TMP/sshd$i.pid" >"$TMP/sshd$i.out" 2>&1 &
  SSHD_PIDS+=($!)
done
# The launcher's namespace gets a passwd whose root home is $TMP/home.
mkdir -p "$TMP/home/.ssh" && chmod 700 "$TMP/home/.ssh"
awk -F: -v OFS=: -v h="$TMP/home" '$3 == 0 { $6 = h } { print }' /etc/passwd >"$TMP/passwd"

# in_launcher CMD...: runs CMD in the launcher's namespace with that passwd.
in_launcher() {
  ip netns exec "$LNS" unshare -m --propagation private \
    sh -c 'mount --bind "$0" /etc/passwd && cd "$1" && shift && exec "$@"' \
    "$TMP/passwd" "$TMP" "$@"
}

# Wait until every sshd answers.
for i in 0 1 2; do
  ok=0
  for _ in $(seq 1 100); do
    if ip netns exec "${HNS[$i]}" ss -ltnH | grep -q ':2222 '; then
      ok=1
      break
    fi
    sleep 0.1
  done
  [ "$ok" = 1 ] || fail "sshd on ${HIP[$i]} did not start: $(cat "$TMP/sshd$i.out")"
done
in_launcher ssh -o BatchMode=yes -o StrictHostKeyChecking=no -p 2222 -i "$TMP/id" "${HIP[1]}" true \
  >"$TMP/probe.out" 2>&1 || fail "plain ssh to ${HIP[1]} does not work: $(cat "$TMP/probe.out")"

# procs_left NAME: "ns:pid" of processes named NAME in the hosts' namespaces.
procs_left() {
  local ns pid left=""
  for ns in "${HNS[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && left="$left $ns:$pid"
    done
  done
  echo "$left"
}
# expect_nothing_left NAME: within 15 s, no process NAME on any host.
expect_nothing_left() {
  local left=""
  for _ in $(seq 1 150); do
    left=$(procs_left "$1")
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  fail "$1 processes left behind on the hosts:$left"
}

RUN=(env GRADSYNC_GRADSYNCD="$BIN/gradsyncd"
  GRADSYNC_DATA_PORT_RANGE=29500-29509 GRADSYNC_JOIN_TIMEOUT_MS=60000
  timeout 180 "$BIN/gradsync-run" -np 4 -H "$HOSTS" --ssh-port 2222 --ssh-identity "$TMP/id"
  -x ASAN_OPTIONS -x LSAN_OPTIONS -x UBSAN_OPTIONS) # the sanitizer build's settings, where set

# ---- A: the demo across three hosts -------------------------------------------
say "A: gradsync-run -np 4 -H $HOSTS gradsync-train --steps 200"
in_launcher "${RUN[@]}" --tag-output "$BIN/gradsync-train" --steps 200 >"$TMP/A.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "A: gradsync-run exited $rc"
grep -q "parameters identical on all 4 ranks" "$TMP/A.out" || fail "A: no identical parameters"
for r in 0 1 2 3; do
  case $r in 0 | 1) h=${HIP[0]} ;; 2) h=${HIP[1]} ;; 3) h=${HIP[2]} ;; esac
  grep -q "^\[$r@$h\] .*joined the job at .* as rank $r of 4" "$TMP/A.out" ||
    fail "A: rank $r did not join from $h"
done
grep -q "^\[1@${HIP[0]}\] .*local rank 1 of 2" "$TMP/A.out" || fail "A: rank 1 is not local rank 1 of 2"
grep -q "listening on \[\?$LIP\]\?:" "$TMP/A.out" || fail "A: gradsyncd does not listen on $LIP"
expect_nothing_left gradsync-train

if [ "$FAMILY" = 4 ]; then
  # ---- B: ring connections between hosts, then a lost rank ---------------------
  say "B: ring connections, then SIGKILL of rank 2 on ${HIP[1]}"
  in_launcher "${RUN[@]}" "$BIN/gradsync-train" --steps 100000000 --log-every 20 >"$TMP/B.out" 2>&1 &
  BPID=$!
  # training under way (a generous hang bound: the sanitizer build under
  # load runs about 12 steps/s)
  for _ in $(seq 1 1800); do grep -q "step 40/" "$TMP/B.out" && break; sleep 0.1; done
  grep -q "step 40/" "$TMP/B.out" || fail "B: the job did not start training"
  for i in 0 1 2; do
    est=$(ip netns exec "${HNS[$i]}" ss -tnH state established)
    echo "$est" >"$TMP/B-ss-$i.out"
    # a ring connection: this host and another host, one side on a port of the range
    peers=0
    for j in 0 1 2; do
      [ "$j" = "$i" ] && continue
      echo "$est" | grep -E "${HIP[$i]}:[0-9]+ +${HIP[$j]}:295(0[0-9])\b|${HIP[$i]}:295(0[0-9]) +${HIP[$j]}:[0-9]+" \
        >/dev/null && peers=$((peers + 1))
    done
    [ "$peers" -ge 1 ] || fail "B: host ${HIP[$i]} holds no ring connection to another host on ports 29500-29509: $est"
    echo "$est" | grep -q "${HIP[$i]}:[0-9]* *$LIP:" || fail "B: host ${HIP[$i]} has no connection to the coordinator at $LIP"
  done
  victim=""
  for pid in $(ip netns pids "${HNS[1]}"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = gradsync-train ] && victim=$pid
  done
  [ -n "$victim" ] || fail "B: no gradsync-train on ${HIP[1]}"
  kill -9 "$victim"
  wait "$BPID"
  rc=$?
  [ "$rc" -ne 0 ] || fail "B: gradsync-run exited 0 after a rank was killed"
  for r in 0 1 3; do
    grep -E "^\[$r\] .*(GS_ERR_RANK_LOST.*rank 2 \(|GS_ERR_DATA_PLANE.*connection to rank 2)" \
      "$TMP/B.out" >/dev/null || fail "B: rank $r does not name the lost rank 2"
  done
  # the first failure the launcher sees: rank 2's SIGKILL (137 through ssh)
  # or another rank failing on it, whichever reaches this machine first
  grep -Eq "^gradsync-run: rank [0-3] on 192\.0\.2\.1[123] exited with status (137|1); stopping the other ranks" "$TMP/B.out" ||
    fail "B: gradsync-run does not report the first failure"
  expect_nothing_left gradsync-train

  # ---- C: --rsh ----------------------------------------------------------------
  say "C: the demo via --rsh"
  cat >"$TMP/myrsh" <<EOF
#!/bin/sh
# one short line per call (O_APPEND: whole), and whether the token is in argv
echo "call \$1 \$2 \$3 \$4 \$5" >>"$TMP/rsh.log"
printf '%s\n' "\$*" >>"$TMP/rsh-args.log"
exec ssh -o BatchMode=yes -o StrictHostKeyChecking=no "\$@"
EOF
  chmod +x "$TMP/myrsh"
  # each rank notes the job token it got (over its command's stdin)
  in_launcher "${RUN[@]}" --rsh "$TMP/myrsh" sh -c \
    'printf %s "$GRADSYNC_JOB_TOKEN" >"$0/token.$GRADSYNC_RANK"; exec "$1" --steps 50' \
    "$TMP" "$BIN/gradsync-train" >"$TMP/C.out" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || fail "C: gradsync-run --rsh exited $rc"
  grep -q "parameters identical on all 4 ranks" "$TMP/C.out" || fail "C: no identical parameters"
  n=$(grep -cE "^call -p 2222 -i $TMP/id (${HIP[0]}|${HIP[1]}|${HIP[2]})\$" "$TMP/rsh.log")
  [ "$n" -eq 4 ] || fail "C: --rsh was called $n times as 'CMD -p 2222 -i FILE HOST COMMAND' (want 4): $(cat "$TMP/rsh.log")"
  for r in 0 1 2 3; do
    tok=$(cat "$TMP/token.$r" 2>/dev/null)
    [ "${#tok}" -ge 32 ] || fail "C: rank $r got no job token"
    grep -qF -- "$tok" "$TMP/rsh-args.log" && fail "C: the job token is in the remote command line"
  done
  expect_nothing_left gradsync-train

  # a host whose ssh refuses: the rank's ssh error, then the launcher's verdict
  in_launcher env GRADSYNC_GRADSYNCD="$BIN/gradsyncd" timeout 60 "$BIN/gradsync-run" -np 1 \
    -H "${HIP[2]}:1" --ssh-port 2223 -i "$TMP/id" "$BIN/gradsync-train" >"$TMP/C2.out" 2>&1
  rc=$?
  [ "$rc" -eq 255 ] || fail "C: gradsync-run to a refusing ssh port exited $rc, not 255"
  grep -q "^\[0\] ssh: connect to host ${HIP[2]} port 2223: Connection refused" "$TMP/C2.out" ||
    fail "C: ssh's own error is not shown"
  grep -q "^gradsync-run: rank 0 on ${HIP[2]}: the remote shell exited with status 255 (ssh could not connect or log in" \
    "$TMP/C2.out" || fail "C: the launcher does not explain status 255"
fi

# ---- D: the launcher is SIGKILLed; ranks ignore SIGPIPE and SIGHUP ------------
say "D: SIGKILL of the launcher"
in_launcher "${RUN[@]}" sh -c 'trap "" PIPE HUP; echo "up $GRADSYNC_RANK"; exec sleep 600' >"$TMP/D.out" 2>&1 &
DPID=$!
for _ in $(seq 1 1200); do [ "$(grep -c '\] up ' "$TMP/D.out")" -ge 4 ] && break; sleep 0.1; done
[ "$(grep -c '\] up ' "$TMP/D.out")" -ge 4 ] || fail "D: the ranks did not all start"
[ -n "$(procs_left sleep)" ] || fail "D: no rank process seen on the hosts"
# the launcher itself: gradsync-run in the launcher namespace
lpid=""
for pid in $(ip netns pids "$LNS"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = gradsync-run ] && lpid=$pid
done
[ -n "$lpid" ] || fail "D: gradsync-run not found"
kill -9 "$lpid"
wait "$DPID" 2>/dev/null
expect_nothing_left sleep

# ---- E: --bind-to core on the hosts: each host's i-th cpu, or refused --------
if [ "${#CPUS[@]}" -ge 2 ]; then
  say "E: --bind-to core --report-bindings (host ${HIP[2]} may use cpu $LAST only)"
  RANK_CMD='sed -n "s/^Cpus_allowed_list:[[:space:]]*/cpus /p" /proc/self/status'
  in_launcher "${RUN[@]}" --bind-to core --report-bindings \
    sh -c "$RANK_CMD" >"$TMP/E.out" 2>"$TMP/E.err.out"
  rc=$?
  [ "$rc" -eq 0 ] || fail "E: gradsync-run --bind-to core exited $rc"
  # what each rank read from inside: ranks 0 and 1 on the first host get its
  # cpus 0 and 1, rank 2 the second host's first cpu, rank 3 the third host's
  # only cpu
  got=$(grep "^\[[0-9]\] " "$TMP/E.out" | sort)
  want="[0] cpus ${CPUS[0]}
[1] cpus ${CPUS[1]}
[2] cpus ${CPUS[0]}
[3] cpus $LAST"
  [ "$got" = "$want" ] || fail "E: the ranks' cpus are
$got
not
$want"
  got=$(grep '^gradsync-run: ' "$TMP/E.err.out" | sort)
  want="gradsync-run: rank 0 on ${HIP[0]}: bound to cpu ${CPUS[0]}
gradsync-run: rank 1 on ${HIP[0]}: bound to cpu ${CPUS[1]}
gradsync-run: rank 2 on ${HIP[1]}: bound to cpu ${CPUS[0]}
gradsync-run: rank 3 on ${HIP[2]}: bound to cpu $LAST"
  [ "$got" = "$want" ] || fail "E: --report-bindings said
$got
not
$want"

  # two ranks of the demo on the one-cpu host: refused there, and rank 0,
  # started on the first host and waiting for the others, is stopped
  say "E: 2 ranks on ${HIP[2]} (1 cpu) with --bind-to core: refused"
  h3=${HIP[2]} h1=${HIP[0]}
  [ "$FAMILY" = 6 ] && h3="[$h3]" h1="[$h1]"
  in_launcher env GRADSYNC_GRADSYNCD="$BIN/gradsyncd" timeout 120 "$BIN/gradsync-run" -np 3 \
    -H "$h1:1,$h3:2" --ssh-port 2222 --ssh-identity "$TMP/id" --bind-to core \
    "$BIN/gradsync-train" --steps 20 >"$TMP/E2.out" 2>"$TMP/E2.err.out"
  rc=$?
  [ "$rc" -eq 2 ] || fail "E: the refusal on ${HIP[2]} exited $rc, not 2"
  grep -E '^\[[12]\] ' "$TMP/E2.out" "$TMP/E2.err.out" && fail "E: a rank ran on ${HIP[2]}"
  got=$(grep '^gradsync-run: ' "$TMP/E2.err.out")
  want="gradsync-run: --bind-to core: 2 ranks to bind on ${HIP[2]} but the remote shell there may \
use only 1 cpu ($LAST); run at most 1 rank there (-H $h3:1), give its sessions more cpus (the \
cpuset or CPUAffinity of that host's sshd), or use --bind-to none
gradsync-run: --bind-to core was refused on ${HIP[2]} (see above); stopping the other ranks"
  [ "$got" = "$want" ] || fail "E: the refusal said
$got
not
$want"
  expect_nothing_left gradsync-train
else
  say "E: skipped (this test may use only one cpu: $MASK)"
fi

PASSED=1
say "PASS"
exit 0
