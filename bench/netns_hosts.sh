#!/bin/bash
# bench/netns_hosts.sh — gradsync vs OpenMPI across "hosts": every host a
# network namespace (the "Across hosts" section of docs/benchmarks.md).
#
#   bench/netns_hosts.sh [--build DIR] [--rounds R] [--hosts H] [--np "2 4"]
#                        [--sizes B,B,...] [--iters I] [--out FILE] [--markdown FILE]
#                        [--workload FILE] [--step-np N] [--steps S] [--no-step]
#   bench/netns_hosts.sh --escalating [--delay-us "0 100 1000"] [--rounds R]
#                        [--hosts H] [--np "2 4"] [--out FILE]
#
# Builds the network of tests/integration/netns.sh: a hub namespace with a
# bridge, one namespace for the coordinator (192.0.2.1) and one per host
# (192.0.2.11, .12, ...), joined to the bridge by veth pairs (MTU 1500), so
# every connection between hosts crosses the bridge between distinct
# addresses. np ranks are placed in blocks of np/H per host (np=2: one rank
# per host; np=4 on 2 hosts: two per host). Per round (rounds interleaved),
# per np, one float32 MPI_SUM / GS_SUM allreduce per size, each call after a
# barrier, the median over calls of the slowest rank:
#   gs          gradsync end to end (gradsync-dataplane --mode e2e --op sum):
#               gradsyncd in its namespace (job token), the ranks in their
#               hosts' namespaces, GRADSYNC_BACKEND=auto: the TCP ring with
#               one rank per host, hierarchical (shm inside a host, the TCP
#               ring between host leaders) with more
#   ompi-tcp    OpenMPI's MPI_Allreduce, --mca btl self,tcp over eth0:
#               mpirun in the coordinator's namespace, one orted per host
#               namespace through an rsh agent that runs `ip netns exec`
#   ompi-hier   (more than one rank per host) the same with btl
#               self,vader,tcp: shared memory inside a host, TCP between
#   ompi-tcp-lo the reference: OpenMPI btl self,tcp on loopback, all ranks
#               in this namespace, same flags: what its TCP path costs with
#               no network in between, measured in the same round
#   gs-tcp-lo   likewise gradsync's TCP ring on loopback (gradsync-run,
#               GRADSYNC_BACKEND=tcp)
# Then per round a training step across the hosts (unless --no-step):
#   gs-step     gradsync-bench --workload FILE (default ResNet-50), S steps
#               (default 8) + 1 warm-up, GS_AVERAGE, --step-np N ranks
#               (default 2 per host: hierarchical), laid out as above; the
#               median step of the slowest rank
#   ompi-step-hier, ompi-step-tcp  OpenMPI's MPI_Allreduce of the step's
#               bytes (one float32 buffer), btl self,vader,tcp and self,tcp
#               across the same hosts, S calls: what one allreduce of a
#               step's bytes costs OpenMPI (as run.sh --steps on one host)
# OpenMPI's set-up, the same as on loopback (bench/transport.sh), because
# every "host" here is the same machine:
# - --bind-to none: OpenMPI's default binding (to a core, per node) pins the
#   first rank of every host to core 0, so ranks of different hosts share one
#   core and every call waits for the scheduler (8-24 ms per call whatever the
#   size: the stall this script once showed);
# - mpi_yield_when_idle 1 when np exceeds the machine's CPUs: on loopback
#   mpirun sees the oversubscription and makes idle ranks yield; across hosts
#   each orted sees only its own ranks and would spin them (20-30x slower at
#   np=4 on 2 vCPUs);
# - per host its own vader backing directory and session directory: the
#   hosts share /dev/shm and the hostname, and vader's segment names
#   (hostname, job, local rank) collide between hosts (a segfault in
#   mca_btl_vader_poll_handle_frag).
# Prints the load average before and after, the raw RESULT lines, and
# a markdown table of medians over rounds (also to --markdown FILE) with
# ratio = OpenMPI time / gradsync time (>= 1: gradsync as fast or faster).
# Needs root, ip(8), openmpi-bin and libopenmpi-dev (mpicc); not a test.
#
# With --escalating, only this instead (no OpenMPI): bench/fastpath.sh
# --escalating's job across the hosts, a job whose every step goes back to
# gradsyncd (gradsync-bench --allgather first --barrier off: the ResNet-50
# control-only step, 161 x 4 B, and a step of 4 x 4 B), with gradsyncd's
# fast path on and --fast-path-backoff 0 (every step escalates after one
# fast round), on with --fast-path-backoff 64 (the default), and off, per
# np and per link delay, interleaved in every round; medians over rounds of
# each run's median step (rank 0).
# --delay-us LIST (default "0"): every host's link to the hub waits US
# microseconds each way (the coordinator's link none), so a host reaches
# gradsyncd in US and another host in 2 US one way. This kernel has no
# netem qdisc, so the hub is then bench/delay_hub.c (the build's
# bin/delay-hub), a user-space hub forwarding between the
# hub's veth ends after the delay, instead of the bridge (also at 0: the
# same path for every delay).
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${GRADSYNC_BUILD:-$root/build-bench}
rounds=3
hosts=2
nps="2 4"
sizes="1048576,4194304,16777216,67108864"
iters=10
out=""
md=""
workload=$root/bench/workloads/resnet50.txt
step_np=""
steps=8
escalating=0
delays=0
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --hosts) hosts=$2; shift 2 ;;
  --np) nps=$2; shift 2 ;;
  --sizes) sizes=$2; shift 2 ;;
  --iters) iters=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --markdown) md=$2; shift 2 ;;
  --workload) workload=$2; shift 2 ;;
  --step-np) step_np=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --no-step) step_np=0; shift ;;
  --escalating) escalating=1; shift ;;
  --delay-us) delays=$2; shift 2 ;;
  -h | --help) sed -n '2,76p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "netns_hosts.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
bin=$build/bin
[ "$(id -u)" = 0 ] || { echo "netns_hosts.sh: needs root (ip netns)" >&2; exit 1; }
command -v ip >/dev/null || { echo "netns_hosts.sh: ip(8) not found (apt-get install iproute2)" >&2; exit 1; }
for f in gradsyncd gradsync-run gradsync-dataplane gradsync-bench; do
  [ -x "$bin/$f" ] || { echo "netns_hosts.sh: $bin/$f not found; build first" >&2; exit 1; }
done
for np in $nps; do
  [ $((np % hosts)) = 0 ] && [ "$np" -ge "$hosts" ] ||
    { echo "netns_hosts.sh: np=$np is not a multiple of --hosts $hosts" >&2; exit 2; }
done
[ -n "$step_np" ] || step_np=$((2 * hosts))
if [ "$escalating" = 1 ]; then
  step_np=0
  for d in $delays; do
    case $d in '' | *[!0-9]*) echo "netns_hosts.sh: --delay-us: '$d' is not a number of microseconds" >&2; exit 2 ;; esac
  done
  hub=$bin/delay-hub
  [ -x "$hub" ] || { echo "netns_hosts.sh: $hub not found; build the tree first (cmake --build $build)" >&2; exit 1; }
elif [ "$delays" != 0 ]; then
  echo "netns_hosts.sh: --delay-us needs --escalating (the allreduce runs have no delay)" >&2
  exit 2
fi
if [ "$step_np" != 0 ]; then
  [ $((step_np % hosts)) = 0 ] ||
    { echo "netns_hosts.sh: --step-np $step_np is not a multiple of --hosts $hosts" >&2; exit 2; }
  [ -r "$workload" ] || { echo "netns_hosts.sh: workload $workload not found (--workload FILE)" >&2; exit 1; }
fi
mpi=$bin/mpi-allreduce
if [ "$escalating" = 1 ]; then
  :
elif [ ! -x "$mpi" ] || [ "$here/mpi_allreduce.c" -nt "$mpi" ]; then
  command -v mpicc >/dev/null || { echo "netns_hosts.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
  mpicc -O2 -o "$mpi" "$here/mpi_allreduce.c" || exit 1
fi

P="gsb-$$"
HUB="$P-hub" COORD_NS="$P-c" COORD_IP=192.0.2.1
NSS=() TMP="" SHM_BASE=/dev/shm/$P HUB_PID=""
cleanup() {
  local ns pids
  trap - EXIT INT TERM HUP
  [ -n "$HUB_PID" ] && kill "$HUB_PID" 2>/dev/null && wait "$HUB_PID" 2>/dev/null
  for ns in "${NSS[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${NSS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [ -n "$TMP" ] && rm -rf "$TMP"
  rm -rf "$SHM_BASE"-*
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
HOST_IP=()
: >"$TMP/hosts.map"
for h in $(seq 0 $((hosts - 1))); do
  attach "$P-h$h" "192.0.2.$((11 + h))" "p-h$h"
  HOST_IP+=("192.0.2.$((11 + h))")
  echo "192.0.2.$((11 + h)) $P-h$h" >>"$TMP/hosts.map"
done
# every host reaches the coordinator over the bridge (bash's /dev/tcp needs
# a listener: probe with the coordinator's own gradsyncd below instead; the
# bridge forwards at once, a short settle is enough)
sleep 0.5
# mpirun's rsh agent: "agent HOST CMD..." runs CMD in HOST's namespace.
cat >"$TMP/agent" <<EOF
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$TMP/hosts.map")
[ -n "\$ns" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
mkdir -p "$SHM_BASE-\$ns" "$TMP/sess-\$ns"
exec ip netns exec "\$ns" env OMPI_MCA_btl_vader_backing_directory="$SHM_BASE-\$ns" \\
  OMPI_MCA_orte_tmpdir_base="$TMP/sess-\$ns" sh -c "\$*"
EOF
chmod +x "$TMP/agent"
TOKEN=$(openssl rand -hex 32)
printf '%s\n' "$TOKEN" >"$TMP/token"
chmod 600 "$TMP/token"
export MALLOC_MMAP_THRESHOLD_=1073741824
[ -n "$out" ] || out=$(mktemp /tmp/gradsync-netns-hosts.XXXXXX)
: >"$out"

hostlist() { # NP -> "ip:per,ip:per"
  local per=$(($1 / hosts)) h l=""
  for h in $(seq 0 $((hosts - 1))); do l="$l${l:+,}${HOST_IP[$h]}:$per"; done
  echo "$l"
}
ompi_flags=(--allow-run-as-root --bind-to none --mca pml ob1 -x MALLOC_MMAP_THRESHOLD_)
ompi_net() { # ROUND NP BTL TAG [SIZES REPS]
  local y=0 sz=${5:-$sizes} reps=${6:-$iters}
  [ "$2" -gt "$(nproc)" ] && y=1
  ip netns exec "$COORD_NS" timeout -k 5 300 mpirun "${ompi_flags[@]}" -np "$2" -H "$(hostlist "$2")" \
    --mca mpi_yield_when_idle $y \
    --mca plm_rsh_agent "$TMP/agent" --mca btl "$3" --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 "$mpi" --sizes "$sz" --reps "$reps" --tag "$4" >"$TMP/mpi.out" 2>&1
  keep "$1" "$4" "$2" "$TMP/mpi.out"
}
ompi_lo() { # ROUND NP
  timeout -k 5 300 mpirun "${ompi_flags[@]}" --oversubscribe -np "$2" --mca btl self,tcp \
    --mca btl_tcp_if_include lo "$mpi" --sizes "$sizes" --reps "$iters" --tag ompi-tcp-lo \
    >"$TMP/mpi.out" 2>&1
  keep "$1" ompi-tcp-lo "$2" "$TMP/mpi.out"
}
keep() { # ROUND TAG NP FILE: its RESULT lines, normalized, into $out
  if grep -q 'RESULT' "$4"; then
    sed -n 's/^\(\[0\] \)\{0,1\}RESULT //p' "$4" | sed 's/ median_us=/ us=/' |
      awk -v r="$1" -v t="$2" '{ s = ""; for (i = 1; i <= NF; i++) if ($i !~ /^(impl|mode|op|det)=/) s = s " " $i
        print "RESULT round=" r " impl=" t s }' >>"$out"
  else
    echo "netns_hosts.sh: $2 np=$3 (round $1) failed; its output:" >&2
    tail -n 8 "$4" >&2
  fi
  # OpenMPI's notices (e.g. about routed/oob) are worth seeing
  case $2 in ompi*) grep -v 'RESULT' "$4" | grep -m3 -e WARNING -e NOTICE -e 'MCA param' >&2 ;; esac
}
gs_job() { # NP PROGRAM ARGS...: gradsyncd in its namespace, rank i of NP in
  # host i / (NP / hosts)'s namespace running PROGRAM; rank i's output in
  # $TMP/rank$i.out. Returns 1 when gradsyncd did not start.
  local np=$1 per=$(($1 / hosts)) coord addr="" i pids=() p
  shift
  # emptied here, not by the background job's redirection: the loop below
  # must not read the previous job's address
  : >"$TMP/coord.out"
  ip netns exec "$COORD_NS" timeout -k 5 300 "$bin/gradsyncd" --listen "$COORD_IP:0" \
    --world-size "$np" --token-file "$TMP/token" "${COORD_ARGS[@]}" >"$TMP/coord.out" 2>&1 &
  coord=$!
  for _ in $(seq 1 300); do
    addr=$(sed -n 's/^gradsyncd listening on \([^[:space:]]*\)[[:space:]]*$/\1/p' "$TMP/coord.out" | head -n1)
    [ -n "$addr" ] && break
    kill -0 $coord 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "netns_hosts.sh: gradsyncd did not start:" >&2
    tail -n 3 "$TMP/coord.out" >&2
    kill $coord 2>/dev/null
    wait $coord 2>/dev/null
    return 1
  fi
  for i in $(seq 0 $((np - 1))); do
    ip netns exec "$P-h$((i / per))" env GRADSYNC_COORDINATOR="$addr" GRADSYNC_RANK=$i \
      GRADSYNC_SIZE=$np GRADSYNC_LOCAL_RANK=$((i % per)) GRADSYNC_LOCAL_SIZE=$per \
      GRADSYNC_JOB_TOKEN="$TOKEN" GRADSYNC_BACKEND=auto timeout -k 5 300 "$@" >"$TMP/rank$i.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  wait $coord 2>/dev/null
  return 0
}
gs_net() { # ROUND NP
  gs_job "$2" "$bin/gradsync-dataplane" --mode e2e --op sum --sizes "${sizes//,/ }" --iters "$iters" &&
    keep "$1" gs "$2" "$TMP/rank0.out"
}
step_bytes=""
gs_step() { # ROUND NP: the workload's step across hosts, then OpenMPI's allreduce of its bytes
  local line ms
  gs_job "$2" "$bin/gradsync-bench" --workload "$workload" --steps "$steps" --warmup 1 || return
  line=$(grep -m1 '^RESULT ' "$TMP/rank0.out")
  ms=$(echo "$line" | sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p')
  step_bytes=$(echo "$line" | sed -n 's/.* bytes=\([0-9]*\).*/\1/p')
  if [ -z "$ms" ] || [ -z "$step_bytes" ]; then
    echo "netns_hosts.sh: gs-step np=$2 (round $1) failed; rank 0's output:" >&2
    tail -n 8 "$TMP/rank0.out" >&2
    return
  fi
  awk -v r="$1" -v n="$2" -v b="$step_bytes" -v ms="$ms" \
    'BEGIN { printf "RESULT round=%s impl=gs-step np=%s bytes=%s us=%.1f\n", r, n, b, ms * 1000 }' >>"$out"
  [ "$2" -gt "$hosts" ] && ompi_net "$1" "$2" self,vader,tcp ompi-step-hier "$step_bytes" "$steps"
  ompi_net "$1" "$2" self,tcp ompi-step-tcp "$step_bytes" "$steps"
}
gs_lo() { # ROUND NP
  timeout -k 5 300 "$bin/gradsync-run" -np "$2" env GRADSYNC_BACKEND=tcp "$bin/gradsync-dataplane" \
    --mode e2e --op sum --sizes "${sizes//,/ }" --iters "$iters" >"$TMP/lo.out" 2>&1
  keep "$1" gs-tcp-lo "$2" "$TMP/lo.out"
}

COORD_ARGS=()

if [ "$escalating" = 1 ]; then
  # shellcheck source=bench/lib.sh
  . "$here/lib.sh"
  ports=(p-c p-h$(seq -s ' p-h' 0 $((hosts - 1))))
  for p in "${ports[@]}"; do ip -n "$HUB" link set "$p" nomaster || exit 1; done
  hub_start() { # US: the hosts' links wait US each way
    local a=(p-c=0) h
    for h in $(seq 0 $((hosts - 1))); do a+=("p-h$h=$1"); done
    ip netns exec "$HUB" "$hub" "${a[@]}" 2>>"$TMP/hub.err" &
    HUB_PID=$!
    sleep 0.3
    kill -0 "$HUB_PID" 2>/dev/null || { echo "netns_hosts.sh: delay-hub did not start:" >&2; cat "$TMP/hub.err" >&2; exit 1; }
  }
  hub_stop() {
    kill "$HUB_PID" 2>/dev/null
    wait "$HUB_PID" 2>/dev/null
    HUB_PID=""
  }
  esc() { # CASE ROUND US NP FP BENCH-ARGS...
    local c=$1 r=$2 d=$3 np=$4 fp=$5 line
    shift 5
    case $fp in
    on) COORD_ARGS=(--fast-path on --fast-path-backoff 0) ;;
    backoff) COORD_ARGS=(--fast-path on --fast-path-backoff 64) ;;
    off) COORD_ARGS=(--fast-path off) ;;
    esac
    gs_job "$np" "$bin/gradsync-bench" "$@" || return
    line=$(sed -n 's/^RESULT //p' "$TMP/rank0.out" | head -1)
    if [ -z "$line" ]; then
      echo "netns_hosts.sh: $c np=$np delay ${d} us fast path $fp (round $r) failed; rank 0's output:" >&2
      tail -n 5 "$TMP/rank0.out" >&2
      return
    fi
    echo "CASE $c.$fp.$d round=$r np=$np $line" >>"$out"
  }
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  echo "netns_hosts.sh --escalating: $(date -u +%FT%TZ), commit $commit, $hosts hosts, np \"$nps\"," \
    "delays \"$delays\" us, load average before: $load0"
  start=$(date +%s)
  for r in $(seq 1 "$rounds"); do
    for d in $delays; do
      echo "netns_hosts.sh: round $r/$rounds delay $d us ($(($(date +%s) - start)) s so far)" >&2
      hub_start "$d"
      for np in $nps; do
        for fp in on backoff off; do
          esc esc "$r" "$d" "$np" "$fp" --workload "$workload" --scale 1e9 --steps 100 --warmup 5 \
            --allgather first --barrier off
          esc esc4 "$r" "$d" "$np" "$fp" --uniform 4x4 --steps 300 --warmup 5 --allgather first \
            --barrier off
        done
      done
      hub_stop
    done
  done
  us() { awk -v a="$1" 'BEGIN { if (a == "nan") print "n/a"; else printf "%.0f", a * 1000 }'; }
  echo
  echo "Every step goes back to gradsyncd across $hosts hosts (network namespaces, bench/delay_hub.c between" \
    "them), $(nproc) CPUs, rounds=$rounds, $(($(date +%s) - start)) s, commit $commit, load average $load0 before," \
    "$(cut -d' ' -f1-3 /proc/loadavg) after; raw lines: $out"
  grep -h 'frames sent' "$TMP/hub.err" | awk '{ s += $2; d += $5; e += $9 } END { printf "delay-hub: %d frames sent, %d dropped, %d send errors in all\n", s, d, e }'
  echo
  echo "Median µs step (each a median over rounds of rank 0's median step); escalations per step on / backoff 64:"
  echo
  echo "| delay per host link | np (per host) | step | fast path on | on, --fast-path-backoff 64 | off | escalations/step |"
  echo "|---|---|---|---|---|---|---|"
  for d in $delays; do
    for np in $nps; do
      for c in "esc ResNet-50 (161 x 4 B)" "esc4 4 x 4 B"; do
        set -- $c
        k=$1
        shift
        echo "| $d us | $np ($((np / hosts))) | $* | $(us "$(med $k.on.$d step_ms "$np")") |" \
          "$(us "$(med $k.backoff.$d step_ms "$np")") | $(us "$(med $k.off.$d step_ms "$np")") |" \
          "$(med $k.on.$d fast_escalations "$np") / $(med $k.backoff.$d fast_escalations "$np") |"
      done
    done
  done
  exit 0
fi

load0=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
when=$(date -u +%FT%TZ)
echo "netns_hosts.sh: $when, commit $commit, $hosts hosts, np \"$nps\", load average before: $load0"
start=$(date +%s)
# where OpenMPI's ranks run and how they are bound: each must report its own
# host's address and no binding
for np in $nps; do
  ip netns exec "$COORD_NS" timeout -k 5 60 mpirun "${ompi_flags[@]}" -np "$np" -H "$(hostlist "$np")" \
    --mca plm_rsh_agent "$TMP/agent" --mca oob_tcp_if_include eth0 --report-bindings \
    sh -c 'echo "netns_hosts.sh: OpenMPI rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE runs at $(ip -4 -o addr show dev eth0 | awk "{print \$4}")"' 2>&1 |
    sed 's/^\[[^]]*\] MCW/netns_hosts.sh: OpenMPI: MCW/' | sort
done
for round in $(seq 1 "$rounds"); do
  for np in $nps; do
    echo "netns_hosts.sh: round $round/$rounds np=$np ($(($(date +%s) - start)) s so far)" >&2
    gs_net "$round" "$np"
    ompi_net "$round" "$np" self,tcp ompi-tcp
    [ "$np" -gt "$hosts" ] && ompi_net "$round" "$np" self,vader,tcp ompi-hier
    ompi_lo "$round" "$np"
    gs_lo "$round" "$np"
  done
  if [ "$step_np" != 0 ]; then
    echo "netns_hosts.sh: round $round/$rounds step np=$step_np ($(($(date +%s) - start)) s so far)" >&2
    gs_step "$round" "$step_np"
  fi
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
secs=$(($(date +%s) - start))
echo "netns_hosts.sh: $secs s, load average after: $load1; raw lines in $out"
cat "$out"

med() { # IMPL NP BYTES -> median over rounds
  grep " impl=$1 np=$2 bytes=$3 " "$out" | sed -n 's/.* us=\([0-9.e+]*\).*/\1/p' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) printf "%.1f\n", v[(NR + 1) / 2];
          else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
cell() { # US NP BYTES -> "us (GB/s)"
  awk -v m="$1" -v n="$2" -v b="$3" 'BEGIN { if (m == "-") print "-";
    else printf "%s (%.2f)", m, 2.0 * (n - 1) / n * b / m / 1e3 }'
}
rat() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }
human() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024 }'; }
table() {
  echo "Across $hosts hosts (network namespaces on one bridge, MTU 1500), $when, commit \`$commit\`,"
  echo "$rounds rounds of $iters calls per size, $secs s; load average $load0 before, $load1 after."
  echo "Median µs per allreduce (bus bandwidth GB/s); ratio = OpenMPI time / gradsync time (≥ 1: gradsync as fast or faster)."
  echo
  echo "| np (ranks per host) | size | gradsync across hosts | OpenMPI tcp across hosts | OpenMPI shm+tcp across hosts | ratio tcp | ratio shm+tcp | OpenMPI tcp loopback (ref) | gradsync tcp loopback (ref) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  local np s g o h
  for np in $nps; do
    for s in ${sizes//,/ }; do
      g=$(med gs "$np" "$s") o=$(med ompi-tcp "$np" "$s") h=$(med ompi-hier "$np" "$s")
      echo "| $np ($((np / hosts))) | $(human "$s") | $(cell "$g" "$np" "$s") | $(cell "$o" "$np" "$s") |" \
        "$(cell "$h" "$np" "$s") | $(rat "$o" "$g") | $(rat "$h" "$g") |" \
        "$(cell "$(med ompi-tcp-lo "$np" "$s")" "$np" "$s") | $(cell "$(med gs-tcp-lo "$np" "$s")" "$np" "$s") |"
    done
  done
  [ "$step_np" != 0 ] || return 0
  local g h o
  g=$(med gs-step "$step_np" "$step_bytes") h=$(med ompi-step-hier "$step_np" "$step_bytes")
  o=$(med ompi-step-tcp "$step_np" "$step_bytes")
  msec() { awk -v m="$1" 'BEGIN { if (m == "-") print "-"; else printf "%.1f", m / 1e3 }'; }
  echo
  echo "A $(basename "$workload" .txt) step across the same hosts: gradsync-bench, $step_np ranks ($((step_np / hosts)) per host:" \
    "$([ "$step_np" -gt "$hosts" ] && echo "hierarchical, shm inside a host" || echo "TCP ring")), GS_AVERAGE, $steps steps + 1 warm-up per round," \
    "median step of the slowest rank; OpenMPI = one MPI_Allreduce of the step's $(human "${step_bytes:-0}") (float32), $steps calls per round."
  echo "Median over rounds, ms; ratio = OpenMPI time / gradsync step (≥ 1: a gradsync step costs at most one OpenMPI allreduce of its bytes)."
  echo
  echo "| np (ranks per host) | gradsync step | OpenMPI shm+tcp allreduce | OpenMPI tcp allreduce | ratio shm+tcp | ratio tcp |"
  echo "|---|---|---|---|---|---|"
  echo "| $step_np ($((step_np / hosts))) | $(msec "$g") | $(msec "$h") | $(msec "$o") | $(rat "$h" "$g") | $(rat "$o" "$g") |"
}
echo
if [ -n "$md" ]; then table | tee "$md"; else table; fi
