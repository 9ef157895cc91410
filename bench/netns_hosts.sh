#!/bin/bash
# bench/netns_hosts.sh — gradsync vs OpenMPI over TCP across "hosts": every
# rank in its own network namespace (the "Across hosts" section of
# docs/benchmarks.md).
#
#   bench/netns_hosts.sh [--build DIR] [--rounds R] [--np N] [--sizes B,B,...] [--out FILE]
#
# Builds the network of tests/integration/netns.sh: a hub namespace with a
# bridge, one namespace for the coordinator (192.0.2.1) and one per rank
# (192.0.2.11, .12, ...), joined to the bridge by veth pairs, so every
# connection crosses the bridge between distinct addresses (no loopback, no
# shared memory between ranks). Per round (rounds interleaved) and size:
#   gs-tcp   gradsync end to end: gradsyncd in its namespace (job token),
#            one gradsync-bench --raw-allreduce per rank namespace
#            (GS_AVERAGE, GRADSYNC_BACKEND=auto: the TCP ring, as each
#            rank is alone on its host); the median step time
#   ompi-tcp OpenMPI's MPI_Allreduce (MPI_SUM, btl self,tcp over eth0),
#            mpirun in the coordinator's namespace launching one rank per
#            rank namespace through an rsh agent that runs `ip netns exec`
# Prints the load average before and after, the raw RESULT lines, and a
# table of medians over rounds with ratio = OpenMPI time / gradsync time
# (>= 1: gradsync as fast or faster). Needs root and ip(8); not a test.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
np=2
sizes="1048576,4194304,16777216,67108864"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --np) np=$2; shift 2 ;;
  --sizes) sizes=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "netns_hosts.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
bin=$build/bin
[ "$(id -u)" = 0 ] || { echo "netns_hosts.sh: needs root (ip netns)" >&2; exit 1; }
for f in gradsyncd gradsync-bench; do
  [ -x "$bin/$f" ] || { echo "netns_hosts.sh: $bin/$f not found; build first" >&2; exit 1; }
done
mpi=$bin/mpi-allreduce
if [ ! -x "$mpi" ] || [ "$here/mpi_allreduce.c" -nt "$mpi" ]; then
  command -v mpicc >/dev/null || { echo "netns_hosts.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
  mpicc -O2 -o "$mpi" "$here/mpi_allreduce.c" || exit 1
fi

P="gsb-$$"
HUB="$P-hub" COORD_NS="$P-c" COORD_IP=192.0.2.1
NSS=() TMP=""
cleanup() {
  local ns pids
  trap - EXIT INT TERM HUP
  for ns in "${NSS[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [ -n "$TMP" ] && rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
TMP=$(mktemp -d /tmp/gsb-netns-XXXXXX) || exit 1
add_ns() { ip netns add "$1" && NSS+=("$1") && ip -n "$1" link set lo up; }
attach() { # NS ADDR PEER
  add_ns "$1" || exit 1
  ip -n "$1" link add eth0 type veth peer name "$3" netns "$HUB" &&
    ip -n "$HUB" link set "$3" master br0 && ip -n "$HUB" link set "$3" up &&
    ip -n "$1" addr add "$2/24" dev eth0 && ip -n "$1" link set eth0 up || exit 1
}
add_ns "$HUB" || exit 1
ip -n "$HUB" link add br0 type bridge && ip -n "$HUB" link set br0 up || exit 1
attach "$COORD_NS" "$COORD_IP" p-c
HOST_IPS=()
: >"$TMP/hosts.map"
for i in $(seq 0 $((np - 1))); do
  ip=192.0.2.$((11 + i))
  attach "$P-r$i" "$ip" "p-r$i"
  HOST_IPS+=("$ip")
  echo "$ip $P-r$i" >>"$TMP/hosts.map"
done
for i in $(seq 0 $((np - 1))); do # the bridge forwards at once; check anyway
  for _ in $(seq 1 50); do
    ip netns exec "$P-r$i" ping -c1 -W1 "$COORD_IP" >/dev/null 2>&1 && break
    sleep 0.2
  done
done
# mpirun's rsh agent: "agent HOST CMD..." runs CMD in HOST's namespace.
cat >"$TMP/agent" <<EOF
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$TMP/hosts.map")
[ -n "\$ns" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$TMP/agent"
TOKEN=$(openssl rand -hex 32)
printf '%s\n' "$TOKEN" >"$TMP/token"
chmod 600 "$TMP/token"
export MALLOC_MMAP_THRESHOLD_=1073741824
reps_of() { if [ "$1" -ge 16777216 ]; then echo 10; else echo 30; fi; }
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-netns-hosts.XXXXXX)
: >"$out"

gs_run() { # BYTES -> median step ms of rank 0's RESULT line, or nothing
  local s=$1 coord addr="" i pids=()
  ip netns exec "$COORD_NS" timeout -k 5 300 "$bin/gradsyncd" --listen "$COORD_IP:0" \
    --world-size "$np" --token-file "$TMP/token" >"$TMP/coord.out" 2>&1 &
  coord=$!
  for _ in $(seq 1 300); do
    addr=$(sed -n 's/^gradsyncd listening on \([^[:space:]]*\)[[:space:]]*$/\1/p' "$TMP/coord.out" | head -n1)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { kill $coord 2>/dev/null; return; }
  for i in $(seq 0 $((np - 1))); do
    ip netns exec "$P-r$i" env GRADSYNC_COORDINATOR="$addr" GRADSYNC_RANK=$i GRADSYNC_SIZE=$np \
      GRADSYNC_LOCAL_RANK=0 GRADSYNC_LOCAL_SIZE=1 GRADSYNC_JOB_TOKEN="$TOKEN" \
      timeout -k 5 300 "$bin/gradsync-bench" --raw-allreduce "$s" --steps "$(reps_of "$s")" \
      --warmup 3 >"$TMP/rank$i.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  wait $coord 2>/dev/null
  sed -n 's/^.*RESULT .* step_ms=\([0-9.]*\).*/\1/p' "$TMP/rank0.out" | head -n1
}

echo "netns_hosts.sh: $(date -u +%FT%TZ), np=$np (one rank per namespace), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
hosts=$(IFS=,; echo "${HOST_IPS[*]}")
# where OpenMPI's ranks run: each must report its own namespace's address
ip netns exec "$COORD_NS" timeout -k 5 60 mpirun --allow-run-as-root -np "$np" -H "$hosts" \
  --mca plm_rsh_agent "$TMP/agent" --mca oob_tcp_if_include eth0 \
  sh -c 'echo "netns_hosts.sh: OpenMPI rank $OMPI_COMM_WORLD_RANK runs at $(ip -4 -o addr show dev eth0 | awk "{print \$4}")"' 2>&1
for round in $(seq 1 "$rounds"); do
  for s in ${sizes//,/ }; do
    ms=$(gs_run "$s")
    if [ -n "$ms" ]; then
      awk -v r="$round" -v n="$np" -v b="$s" -v ms="$ms" 'BEGIN { us = ms * 1000;
        printf "RESULT round=%s impl=gs-tcp np=%d bytes=%d median_us=%.1f busbw_gbs=%.2f\n",
          r, n, b, us, 2.0 * (n - 1) / n * b / us / 1e3 }' >>"$out"
    else
      echo "netns_hosts.sh: gradsync np=$np $s failed:" >&2
      tail -n 3 "$TMP"/rank0.out "$TMP"/coord.out >&2
    fi
    ip netns exec "$COORD_NS" timeout -k 5 300 mpirun --allow-run-as-root -np "$np" -H "$hosts" \
      --mca plm_rsh_agent "$TMP/agent" --mca pml ob1 --mca btl self,tcp \
      --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 -x MALLOC_MMAP_THRESHOLD_ \
      "$mpi" --sizes "$s" --reps "$(reps_of "$s")" --tag ompi-tcp >"$TMP/mpi.out" 2>&1
    if grep -q '^RESULT' "$TMP/mpi.out"; then
      grep '^RESULT' "$TMP/mpi.out" | sed "s/^RESULT /RESULT round=$round /" >>"$out"
    else
      echo "netns_hosts.sh: OpenMPI np=$np $s failed:" >&2
      tail -n 5 "$TMP/mpi.out" >&2
    fi
  done
done
echo "netns_hosts.sh: $(($(date +%s) - start)) s, load average after: $(cut -d' ' -f1-3 /proc/loadavg); raw lines in $out"
cat "$out"

med() { # IMPL BYTES -> median over rounds
  grep " impl=$1 np=$np bytes=$2 " "$out" | sed -n 's/.* median_us=\([0-9.]*\).*/\1/p' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
          else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo
echo "| np | size | OpenMPI tcp µs (GB/s) | gradsync e2e µs (GB/s) | ratio (OpenMPI / gradsync time) |"
echo "|---|---|---|---|---|"
for s in ${sizes//,/ }; do
  o=$(med ompi-tcp "$s") g=$(med gs-tcp "$s")
  awk -v n="$np" -v b="$s" -v o="$o" -v g="$g" 'BEGIN {
    bw = 2.0 * (n - 1) / n * b / 1e3
    printf "| %d | %d MiB | %s (%s) | %s (%s) | %s |\n", n, b / 1048576, o,
      o == "-" ? "-" : sprintf("%.2f", bw / o), g, g == "-" ? "-" : sprintf("%.2f", bw / g),
      (o == "-" || g == "-") ? "-" : sprintf("%.2f", o / g) }'
done
