/* The settings table (see settings.h for how to add a setting) and the one
 * parser, printer and documenter that every program uses. Plain data and
 * pure functions; gs__settings_load reads the environment. */
#include "settings.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "status.h"

#define DAY_MS 86400000LL

/* One row per setting; the order of rows is the order of --help, the docs
 * and the log line. Help text is plain prose (docs quote it as is). */
static const gs__setting table[GS__S_COUNT] = {
    [GS__S_LISTEN] = {"listen", "--listen", "GRADSYNC_LISTEN", NULL, GS__T_ADDRESS, "127.0.0.1:0",
                      NULL, 0, 65535, NULL, GS__FOR_SERVER, "HOST:PORT",
                      "Address to serve on; port 0 picks a free one (printed). IPv6 as "
                      "[ADDR]:PORT."},
    [GS__S_WORLD_SIZE] = {"world_size", "--world-size", "GRADSYNC_WORLD_SIZE", NULL, GS__T_INT, "0",
                          "size given by the first rank", 0, 65536, NULL, GS__FOR_SERVER, "N",
                          "Ranks in the job; joins with another size are refused. 0: the size "
                          "the first rank gives."},
    [GS__S_JOB_ID] = {"job_id", "--job-id", "GRADSYNC_JOB_ID", NULL, GS__T_STRING, NULL, "any", 0,
                      0, NULL, GS__FOR_SERVER | GS__FOR_WORKER, "ID",
                      "Job id: the coordinator refuses ranks that name another job."},
    [GS__S_JOB_TOKEN] = {"job_token", "--token", "GRADSYNC_JOB_TOKEN", NULL, GS__T_SECRET, NULL,
                         "none", 0, 0, NULL, GS__FOR_SERVER | GS__FOR_WORKER, "TOKEN",
                         "Job token: the coordinator requires 'authorization: Bearer TOKEN' on "
                         "Join, Session and Kv calls; ranks present it."},
    [GS__S_CYCLE_TIME] = {"cycle_time_ms", "--cycle-time-ms", "GRADSYNC_CYCLE_TIME",
                          "HOROVOD_CYCLE_TIME", GS__T_MILLI, "1", NULL, 0, 60000 * 1000LL, NULL,
                          GS__FOR_SERVER, "MS",
                          "Longest a worker holds submissions back while its last request message "
                          "is unanswered (batching; fractions allowed, e.g. 0.5), imposed on "
                          "every rank; the window policy's emission period.",
                          "--cycle-time-ms", 0, "MS"},
    [GS__S_FUSION_THRESHOLD] = {"fusion_threshold", "--fusion-threshold",
                                "GRADSYNC_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", GS__T_INT,
                                "1048576", NULL, 0, 1LL << 40, NULL, GS__FOR_SERVER, "BYTES",
                                "Fuse compatible allreduces (and allgathers) up to this many "
                                "bytes; 0 turns fusion off. 1 MiB, not Horovod's 64 MiB: see "
                                "docs/benchmarks.md.",
                                "--fusion-threshold-mb", 1048576, "MB"},
    [GS__S_EMIT_POLICY] = {"emit_policy", "--emit-policy", "GRADSYNC_EMIT_POLICY", NULL,
                           GS__T_CHOICE, "adaptive", NULL, 0, 0, "adaptive|window", GS__FOR_SERVER,
                           "POLICY",
                           "adaptive: emit ready tensors at once while fewer than "
                           "--max-plans-in-flight plans are unfinished, else let them accumulate "
                           "(and fuse) until a plan finishes or the threshold fills; window: emit "
                           "every cycle time (Horovod's behaviour)."},
    [GS__S_MAX_PLANS_IN_FLIGHT] = {"max_plans_in_flight", "--max-plans-in-flight",
                                   "GRADSYNC_MAX_PLANS_IN_FLIGHT", NULL, GS__T_INT, "2", NULL, 1,
                                   1024, NULL, GS__FOR_SERVER, "N",
                                   "Depth of the adaptive policy."},
    [GS__S_MAX_PENDING_PER_RANK] = {"max_pending_per_rank", "--max-pending-per-rank",
                                    "GRADSYNC_MAX_PENDING_PER_RANK", NULL, GS__T_INT, "65536", NULL,
                                    1, 1 << 24, NULL, GS__FOR_SERVER, "N",
                                    "Tensors one rank may have pending at the coordinator (and "
                                    "the largest group); past it that rank's op fails with an "
                                    "error naming the limit, other ranks are unaffected."},
    [GS__S_CACHE_CAPACITY] = {"cache_capacity", "--cache-capacity", "GRADSYNC_CACHE_CAPACITY",
                              "HOROVOD_CACHE_CAPACITY", GS__T_INT, "1024", NULL, 0, 1 << 24, NULL,
                              GS__FOR_SERVER, "N",
                              "Response cache entries (LRU); 0 turns the cache off.",
                              "--cache-capacity", 0, "N"},
    [GS__S_STALL_WARNING] =
        {"stall_warning_s", "--stall-warning-s", "GRADSYNC_STALL_CHECK_TIME_SECONDS",
         "HOROVOD_STALL_CHECK_TIME_SECONDS", GS__T_INT, "60", NULL, 0, 86400, NULL, GS__FOR_SERVER,
         "S",
         "Every S seconds, log tensors that some ranks submitted more than S "
         "seconds ago, grouped by missing rank; 0 = off.",
         "--stall-check-warning-time-seconds", 0, "S"},
    [GS__S_STALL_SHUTDOWN] = {"stall_shutdown_s", "--stall-shutdown-s",
                              "GRADSYNC_STALL_SHUTDOWN_TIME_SECONDS",
                              "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", GS__T_INT, "0", "0 (never)", 0,
                              86400 * 7, NULL, GS__FOR_SERVER, "S",
                              "Abort the job (GS_ERR_STALL) when a tensor has waited S seconds; "
                              "0 = never.",
                              "--stall-check-shutdown-time-seconds", 0, "S"},
    [GS__S_DEADLOCK_TIME] = {"deadlock_time_ms", "--deadlock-time-ms", "GRADSYNC_DEADLOCK_TIME_MS",
                             NULL, GS__T_INT, "5000", NULL, 0, DAY_MS, NULL, GS__FOR_SERVER, "MS",
                             "Every live rank blocked on unscheduled tensors and no new request "
                             "for MS milliseconds = deadlock; 0 = off."},
    [GS__S_DEADLOCK_ACTION] = {"deadlock_action", "--deadlock-action", "GRADSYNC_DEADLOCK_ACTION",
                               NULL, GS__T_CHOICE, "abort", NULL, 0, 0, "abort|warn",
                               GS__FOR_SERVER, "ACTION",
                               "abort (every rank's blocked ops fail with GS_ERR_DEADLOCK) or "
                               "warn (log only)."},
    [GS__S_RANK_TIMEOUT] = {"rank_timeout_ms", "--rank-timeout-ms", "GRADSYNC_RANK_TIMEOUT_MS",
                            NULL, GS__T_INT, "10000", NULL, 0, DAY_MS, NULL, GS__FOR_SERVER, "MS",
                            "A connected rank silent this long is lost; 0 = off."},
    [GS__S_HEARTBEAT] = {"heartbeat_ms", "--heartbeat-ms", "GRADSYNC_HEARTBEAT_MS", NULL, GS__T_INT,
                         "1000", NULL, 10, 60000, NULL, GS__FOR_SERVER, "MS",
                         "How often ranks send a heartbeat."},
    [GS__S_LOG_LEVEL] = {"log_level", "--log-level", "GRADSYNC_LOG_LEVEL", NULL, GS__T_CHOICE,
                         "info", NULL, 0, 0, "error|warn|info|debug",
                         GS__FOR_SERVER | GS__FOR_WORKER, "LEVEL", "Log level (stderr)."},
    [GS__S_JOB_TOKEN_FILE] = {"job_token_file", "--token-file", "GRADSYNC_TOKEN_FILE", NULL,
                              GS__T_STRING, NULL, "none", 0, 0, NULL, GS__FOR_SERVER, "FILE",
                              "Read the job token from the first line of FILE (better than "
                              "--token, which other users can see in ps); wins over --token."},
    [GS__S_INSECURE] = {"insecure", "--insecure", "GRADSYNC_INSECURE", NULL, GS__T_BOOL, "0", NULL,
                        0, 1, NULL, GS__FOR_SERVER, "BOOL",
                        "Allow serving a non-loopback address without a job token or TLS. "
                        "Without it gradsyncd refuses to start there: anyone who reaches the "
                        "port could join the job."},
    [GS__S_SERVER_TLS_CERT] = {"tls_cert", "--tls-cert", "GRADSYNC_SERVER_CERT", NULL, GS__T_STRING,
                               NULL, "none (plaintext)", 0, 0, NULL, GS__FOR_SERVER, "FILE",
                               "Serve TLS with this PEM certificate (chain); needs --tls-key."},
    [GS__S_SERVER_TLS_KEY] = {"tls_key", "--tls-key", "GRADSYNC_SERVER_KEY", NULL, GS__T_STRING,
                              NULL, "none", 0, 0, NULL, GS__FOR_SERVER, "FILE",
                              "The PEM private key of --tls-cert."},
    [GS__S_TLS_CLIENT_CA] = {"tls_client_ca", "--tls-client-ca", "GRADSYNC_CLIENT_CA", NULL,
                             GS__T_STRING, NULL, "none", 0, 0, NULL, GS__FOR_SERVER, "FILE",
                             "mTLS: require every client to present a certificate signed by "
                             "this PEM CA."},
    [GS__S_KV_MAX_BYTES] = {"kv_max_bytes", "--kv-max-bytes", "GRADSYNC_KV_MAX_BYTES", NULL,
                            GS__T_INT, "67108864", NULL, 1024, 1LL << 40, NULL, GS__FOR_SERVER,
                            "BYTES",
                            "Rendezvous store limit (keys plus values); a KvSet past it fails "
                            "with RESOURCE_EXHAUSTED."},
    [GS__S_KV_MAX_KEYS] = {"kv_max_keys", "--kv-max-keys", "GRADSYNC_KV_MAX_KEYS", NULL, GS__T_INT,
                           "65536", NULL, 16, 1 << 24, NULL, GS__FOR_SERVER, "N",
                           "Rendezvous store key limit; a KvSet of a new key past it fails with "
                           "RESOURCE_EXHAUSTED."},
    [GS__S_SESSION_QUEUE_MAX_BYTES] =
        {"session_queue_max_bytes", "--session-queue-max-bytes",
         "GRADSYNC_SESSION_QUEUE_MAX_BYTES", NULL, GS__T_INT, "268435456", NULL, 65536, 1LL << 40,
         NULL, GS__FOR_SERVER, "BYTES",
         "Bytes of plans that may wait for one rank that does not read its session stream; "
         "past it that rank is cut off and declared lost (the others are told), so a stuck "
         "rank cannot grow gradsyncd's memory."},
    [GS__S_GRPC_MEMORY_MAX_BYTES] =
        {"grpc_memory_max_bytes", "--grpc-memory-max-bytes", "GRADSYNC_GRPC_MEMORY_MAX_BYTES", NULL,
         GS__T_INT, "536870912", NULL, 16 << 20, 1LL << 40, NULL, GS__FOR_SERVER, "BYTES",
         "gRPC's memory quota for all that the connections buffer, also before a call's token "
         "is checked; it also sets how many messages of the open methods (health checks, "
         "reflection) gRPC reads at once: one per 256 MiB, 1 to 16 (the rest wait unread, 256 at "
         "most, served by connection in turn). A "
         "backstop: past it gRPC closes idle connections and cancels streams of "
         "its choice, a rank's too (RESOURCE_EXHAUSTED, RST_STREAM code 11), so keep it well "
         "above the job's needs; each peer is bounded first by --max-streams-per-connection, "
         "16 KiB of headers and per-method message limits."},
    [GS__S_MAX_STREAMS_PER_CONNECTION] =
        {"max_streams_per_connection", "--max-streams-per-connection",
         "GRADSYNC_MAX_STREAMS_PER_CONNECTION", NULL, GS__T_INT, "256", NULL, 8, 1 << 20, NULL,
         GS__FOR_SERVER, "N",
         "Calls one connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS); a client "
         "queues the rest. A rank needs a few."},
    [GS__S_DIAGNOSTICS_OPEN] = {"diagnostics_open", "--diagnostics-open",
                                "GRADSYNC_DIAGNOSTICS_OPEN", NULL, GS__T_BOOL, "0", NULL, 0, 1,
                                NULL, GS__FOR_SERVER, "BOOL",
                                "Let gradsync.v1.Diagnostics' read-only calls through without "
                                "the job token (AbortJob still needs it). Health and reflection "
                                "are always open."},
    [GS__S_METRICS_LISTEN] = {"metrics_listen", "--metrics-listen", "GRADSYNC_METRICS_LISTEN", NULL,
                              GS__T_ADDRESS, NULL, "off", 0, 65535, NULL, GS__FOR_SERVER,
                              "HOST:PORT",
                              "Serve Prometheus metrics over HTTP at http://HOST:PORT/metrics "
                              "(libmicrohttpd); port 0 picks a free one (printed as the second "
                              "stdout line). Unset: no HTTP server."},
    [GS__S_LOG_FORMAT] =
        {"log_format", "--log-format", "GRADSYNC_LOG_FORMAT", NULL, GS__T_CHOICE, "logfmt", NULL, 0,
         0, "logfmt|json|text", GS__FOR_SERVER, "FORMAT",
         "gradsyncd's log lines on stderr: logfmt (time=... level=... msg=\"...\"), "
         "json (one object per line) or text. A multi-line report stays one "
         "line in logfmt and json."},
    [GS__S_TIMELINE] = {"timeline", "--timeline", "GRADSYNC_TIMELINE", "HOROVOD_TIMELINE",
                        GS__T_STRING, NULL, "off", 0, 0, NULL, GS__FOR_SERVER, "FILE",
                        "Write a Chrome trace-event timeline (chrome://tracing, Perfetto) of "
                        "every tensor to FILE on gradsyncd's host from the start; complete JSON "
                        "once stopped (StopTimeline, SIGTERM, the job's end).",
                        "--timeline-filename", 0, "FILE"},
    [GS__S_SERVE_FOREVER] = {"serve_forever", "--serve-forever", "GRADSYNC_SERVE_FOREVER", NULL,
                             GS__T_BOOL, "0", NULL, 0, 1, NULL, GS__FOR_SERVER, "BOOL",
                             "Serve job after job: once every rank of a job left (or the job "
                             "failed and its sessions closed), start a fresh job (state reset, "
                             "next epoch). Without it gradsyncd serves one job and exits: 0 when "
                             "every rank left cleanly, 3 when the job failed."},
    [GS__S_SHUTDOWN_GRACE] = {"shutdown_grace_s", "--shutdown-grace-s", "GRADSYNC_SHUTDOWN_GRACE_S",
                              NULL, GS__T_INT, "10", NULL, 0, 3600, NULL, GS__FOR_SERVER, "S",
                              "On SIGTERM/SIGINT every rank is told the coordinator is going "
                              "away, then gradsyncd drains with its port open (health "
                              "NOT_SERVING, new ranks refused) for S seconds less 2 (half of S "
                              "under 4; a second signal ends it), closes, cancels calls still "
                              "open after S seconds and exits 0. Also bounds how long a failed "
                              "job's ranks get to close their sessions."},
    [GS__S_FAST_PATH] =
        {"fast_path", "--fast-path", "GRADSYNC_FAST_PATH", NULL, GS__T_BOOL, "on", NULL, 0, 1,
         NULL, GS__FOR_SERVER, "BOOL",
         "on: let the ranks agree on cached requests among themselves over the data plane (the "
         "fast path) once every rank is connected, nothing is pending and the response cache "
         "holds what they submit; they come back to gradsyncd for anything it must see (a new "
         "tensor, a mismatch, a reordering, a deadlock, a departure, a timeline). off: every "
         "request goes through gradsyncd, step after step."},
    [GS__S_FAST_PATH_BACKOFF] =
        {"fast_path_backoff", "--fast-path-backoff", "GRADSYNC_FAST_PATH_BACKOFF", NULL,
         GS__T_INT, "64", NULL, 0, 1048576, NULL, GS__FOR_SERVER, "N",
         "When the ranks come back from the fast path at their first fast round, for an op a "
         "fast round cannot run (uncached, or an allgather, alltoall, join or sparse op), "
         "that round was wasted. With N > 0, from the second such time in a row gradsyncd "
         "holds the fast path back for the next 1, 2, 4 .. N plans that empty its table (about "
         "one per step), so that a job whose every step has such an op runs as with "
         "--fast-path off; once the ranks run a fast round again it starts over. 0: never hold "
         "it back, for jobs on one host (there such a job is up to 1.3x faster without the "
         "backoff; across hosts 0.1 ms or more apart one way it is up to 1.5x "
         "slower: docs/benchmarks.md)."},
    [GS__S_COORDINATOR] = {"coordinator", NULL, "GRADSYNC_COORDINATOR", NULL, GS__T_ADDRESS, NULL,
                           "required", 1, 65535, NULL, GS__FOR_WORKER, "HOST:PORT",
                           "Address of gradsyncd: a host name, an IPv4 address or [IPv6]:PORT."},
    [GS__S_RANK] = {"rank", NULL, "GRADSYNC_RANK", "HOROVOD_RANK", GS__T_INT, NULL,
                    "from the scheduler", 0, 65535, NULL, GS__FOR_WORKER, "N",
                    "This process's rank. Unset: read from the scheduler's environment (see "
                    "\"Rank and size from the scheduler\")."},
    [GS__S_SIZE] = {"size", NULL, "GRADSYNC_SIZE", "HOROVOD_SIZE", GS__T_INT, NULL,
                    "from the scheduler", 1, 65536, NULL, GS__FOR_WORKER, "N",
                    "Ranks in the job. Unset: read from the scheduler's environment."},
    [GS__S_LOCAL_RANK] = {"local_rank", NULL, "GRADSYNC_LOCAL_RANK", "HOROVOD_LOCAL_RANK",
                          GS__T_INT, NULL, "from the scheduler, else 0", 0, 65535, NULL,
                          GS__FOR_WORKER, "N", "This process's rank among those on its host."},
    [GS__S_LOCAL_SIZE] = {"local_size", NULL, "GRADSYNC_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE",
                          GS__T_INT, NULL, "from the scheduler, else 1", 1, 65536, NULL,
                          GS__FOR_WORKER, "N", "Ranks on this process's host."},
    [GS__S_JOIN_TIMEOUT] = {"join_timeout_ms", "--join-timeout-ms", "GRADSYNC_JOIN_TIMEOUT_MS",
                            NULL, GS__T_INT, "60000", NULL, 1, DAY_MS, NULL,
                            GS__FOR_SERVER | GS__FOR_WORKER, "MS",
                            "How long gs_init waits for the coordinator, for every rank to join "
                            "and for the ring to connect. gradsyncd releases a rank that joined "
                            "but opened no session within it."},
    [GS__S_DATA_TIMEOUT] = {"data_timeout_ms", NULL, "GRADSYNC_DATA_TIMEOUT_MS", NULL, GS__T_INT,
                            "60000", NULL, 1, DAY_MS, NULL, GS__FOR_WORKER, "MS",
                            "Longest wait for a peer inside one step of a collective. A "
                            "fast round (the fast path) waits for the other ranks to enter it "
                            "without this bound, as they may still be computing: until they "
                            "enter, one of them dies or leaves, or the job shuts down; then the "
                            "bound applies."},
    [GS__S_SCALE_LOCAL] = {"scale_local", NULL, "GRADSYNC_SCALE_LOCAL", NULL, GS__T_BOOL, "1", NULL,
                           0, 1, NULL, GS__FOR_WORKER, "BOOL",
                           "An average on a local tensor returns input / size (0: input "
                           "unchanged)."},
    [GS__S_ADVERTISE_ADDR] = {"advertise_addr", NULL, "GRADSYNC_ADVERTISE_ADDR", NULL, GS__T_STRING,
                              NULL, "local address toward the coordinator", 0, 0, NULL,
                              GS__FOR_WORKER, "HOST",
                              "Address (or host name) peers use to reach this rank's ring "
                              "listener."},
    [GS__S_DATA_ADDR] = {"data_addr", NULL, "GRADSYNC_DATA_ADDR", NULL, GS__T_STRING, NULL,
                         "all interfaces", 0, 0, NULL, GS__FOR_WORKER, "HOST",
                         "Local address the ring listener binds to (IPv4, IPv6 or a host name); "
                         "also advertised to peers unless GRADSYNC_ADVERTISE_ADDR is set."},
    [GS__S_DATA_PORT_RANGE] = {"data_port_range", NULL, "GRADSYNC_DATA_PORT_RANGE", NULL,
                               GS__T_RANGE, NULL, "any free port", 1, 65535, NULL, GS__FOR_WORKER,
                               "LOW-HIGH",
                               "Ports the ring listener may use (the first free one), so that "
                               "a firewall can open just these."},
    [GS__S_BACKEND] = {"backend", NULL, "GRADSYNC_BACKEND", NULL, GS__T_CHOICE, "auto", NULL, 0, 0,
                       "auto|tcp|nccl|shm", GS__FOR_WORKER, "KIND",
                       "Data plane. GPU buffers: nccl (fails gs_init when it cannot run), or "
                       "auto (nccl when the library has it and every rank has a usable CUDA "
                       "device; each rank logs which and why); tcp and shm refuse them. Host "
                       "buffers: tcp = the TCP ring of all ranks; shm = shared memory among the "
                       "ranks of a host and a TCP ring between one leader per host (fails "
                       "gs_init when it cannot start); auto and nccl = shm where ranks share a "
                       "host, else (or when shm cannot start on some rank) the TCP ring."},
    [GS__S_DETERMINISTIC] = {"deterministic", NULL, "GRADSYNC_DETERMINISTIC", NULL, GS__T_BOOL, "0",
                             NULL, 0, 1, NULL, GS__FOR_WORKER, "BOOL",
                             "Reduce every element of a CPU allreduce in rank order 0..n-1, so "
                             "that identical runs give bitwise-identical results whatever the "
                             "fusion and timing (costs bandwidth above 2 ranks: see "
                             "docs/benchmarks.md). Every rank must set the same value."},
    [GS__S_TCP_CONGESTION] =
        {"tcp_congestion", NULL, "GRADSYNC_TCP_CONGESTION", NULL, GS__T_STRING, "auto", NULL, 0, 0,
         NULL, GS__FOR_WORKER, "NAME",
         "Congestion control of the TCP ring's sockets. auto: cubic (else reno) only where the "
         "system's is bbr, which paces every send and made the ring 1.7-2.9x slower between hosts "
         "(see docs/troubleshooting.md); system: the kernel's choice, untouched; an algorithm "
         "name (reno, cubic, ...): asked for on every ring socket, and where the kernel refuses "
         "it (not in net.ipv4.tcp_allowed_congestion_control) one warning and the system's."},
    [GS__S_CUDA_DEVICE] = {"cuda_device", NULL, "GRADSYNC_CUDA_DEVICE", NULL, GS__T_INT, NULL,
                           "the local rank", 0, 65535, NULL, GS__FOR_WORKER, "N",
                           "CUDA device the nccl backend uses."},
    [GS__S_TLS_CA] = {"tls_ca", NULL, "GRADSYNC_TLS_CA", NULL, GS__T_STRING, NULL,
                      "none (plaintext)", 0, 0, NULL, GS__FOR_WORKER, "FILE",
                      "PEM CA of the coordinator's certificate: setting it turns TLS on. The "
                      "coordinator address must match a name or IP of that certificate."},
    [GS__S_TLS_CERT] = {"tls_cert_client", NULL, "GRADSYNC_TLS_CERT", NULL, GS__T_STRING, NULL,
                        "none", 0, 0, NULL, GS__FOR_WORKER, "FILE",
                        "mTLS: this rank's PEM certificate (with GRADSYNC_TLS_KEY)."},
    [GS__S_TLS_KEY] = {"tls_key_client", NULL, "GRADSYNC_TLS_KEY", NULL, GS__T_STRING, NULL, "none",
                       0, 0, NULL, GS__FOR_WORKER, "FILE", "mTLS: this rank's PEM private key."},
};

const gs__setting *gs__setting_get(gs__setting_id id) {
  if ((int)id < 0 || id >= GS__S_COUNT) return NULL;
  return &table[id];
}

/* ---- parsing ---------------------------------------------------------------- */

static int bad(char *err, size_t errlen, const char *from, const char *text, const char *want) {
  snprintf(err, errlen, "%s='%s' is not valid: expected %s", from, text, want);
  return GS__ERR_INVALID_ARG;
}

static int parse_i64(const char *t, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(t, &end, 10);
  if (errno || end == t || *end || isspace((unsigned char)*t)) return -1;
  *out = v;
  return 0;
}

/* "12", "0.5", "1.250" -> x1000, at most 3 fraction digits. */
static int parse_milli(const char *t, int64_t *out) {
  const char *p = t;
  if (!isdigit((unsigned char)*p) && *p != '.') return -1;
  int64_t whole = 0, frac = 0;
  int digits = 0;
  for (; isdigit((unsigned char)*p); p++) {
    whole = whole * 10 + (*p - '0');
    if (whole > INT64_MAX / 10000) return -1;
    digits++;
  }
  if (*p == '.') {
    p++;
    int fd = 0;
    for (; isdigit((unsigned char)*p); p++, fd++) {
      if (fd >= 3) {
        if (*p != '0') return -1; /* finer than 1/1000: refuse rather than round */
        continue;
      }
      frac = frac * 10 + (*p - '0');
      digits++;
    }
    for (int k = fd; k < 3; k++) frac *= 10;
  }
  if (*p || digits == 0) return -1;
  *out = whole * 1000 + frac;
  return 0;
}

static void format_milli(int64_t v, char *buf, size_t cap) {
  if (v % 1000 == 0) {
    snprintf(buf, cap, "%lld", (long long)(v / 1000));
    return;
  }
  char frac[8];
  snprintf(frac, sizeof frac, "%03lld", (long long)(v % 1000));
  for (int k = 2; k > 0 && frac[k] == '0'; k--) frac[k] = 0;
  snprintf(buf, cap, "%lld.%s", (long long)(v / 1000), frac);
}

static int choice_index(const char *choices, const char *t) {
  int idx = 0;
  const char *p = choices;
  size_t n = strlen(t);
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncasecmp(p, t, n) == 0) return idx;
    idx++;
    if (!bar) break;
    p = bar + 1;
  }
  return -1;
}

static int choice_name(const char *choices, int idx, char *buf, size_t cap) {
  const char *p = choices;
  for (int k = 0; k < idx && p; k++) {
    p = strchr(p, '|');
    if (p) p++;
  }
  if (!p) return -1;
  const char *bar = strchr(p, '|');
  size_t len = bar ? (size_t)(bar - p) : strlen(p);
  snprintf(buf, cap, "%.*s", (int)len, p);
  return 0;
}

int gs__split_host_port(const char *text, char *host, size_t hostcap, int *port) {
  const char *colon = NULL;
  size_t hlen;
  const char *h = text;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close) return -1;
    h = text + 1;
    hlen = (size_t)(close - h);
    if (close[1] == ':')
      colon = close + 1;
    else if (close[1] != 0)
      return -1;
  } else {
    const char *first = strchr(text, ':');
    const char *last = strrchr(text, ':');
    if (first && first == last) colon = first; /* host:port; more colons = bare IPv6 */
    hlen = colon ? (size_t)(colon - text) : strlen(text);
  }
  if (hlen == 0 || hlen >= hostcap) return -1;
  memcpy(host, h, hlen);
  host[hlen] = 0;
  *port = -1;
  if (colon) {
    int64_t p;
    if (parse_i64(colon + 1, &p) || p < 0 || p > 65535) return -2;
    *port = (int)p;
  }
  return 0;
}

int gs__settings_set(gs__settings *s, gs__setting_id id, const char *text, gs__setting_source src,
                     const char *from, char *err, size_t errlen) {
  const gs__setting *d = gs__setting_get(id);
  if (!d || !text) return bad(err, errlen, from ? from : "?", text ? text : "", "a value");
  if (!from) from = d->env;
  int64_t i = 0, i2 = 0;
  char want[256];
  switch (d->type) {
  case GS__T_INT:
    if (parse_i64(text, &i) || i < d->min || i > d->max) {
      snprintf(want, sizeof want, "an integer from %lld to %lld", (long long)d->min,
               (long long)d->max);
      return bad(err, errlen, from, text, want);
    }
    break;
  case GS__T_MILLI:
    if (parse_milli(text, &i) || i < d->min || i > d->max) {
      char lo[32], hi[32];
      format_milli(d->min, lo, sizeof lo);
      format_milli(d->max, hi, sizeof hi);
      snprintf(want, sizeof want, "a number from %s to %s (up to 3 decimals, e.g. 0.5)", lo, hi);
      return bad(err, errlen, from, text, want);
    }
    break;
  case GS__T_STRING:
  case GS__T_SECRET:
    if (id == GS__S_TCP_CONGESTION) {
      size_t n = strspn(text, "abcdefghijklmnopqrstuvwxyz0123456789_-");
      if (n == 0 || text[n] || n > 15)
        return bad(err, errlen, from, text,
                   "auto, system or an algorithm name of 1 to 15 lower-case letters, digits, "
                   "_ or - (e.g. cubic)");
    }
    break;
  case GS__T_CHOICE:
    i = choice_index(d->choices, text);
    if (i < 0 && id == GS__S_LOG_LEVEL && strcasecmp(text, "warning") == 0) i = 1;
    if (i < 0) {
      snprintf(want, sizeof want, "one of %s", d->choices);
      return bad(err, errlen, from, text, want);
    }
    break;
  case GS__T_BOOL:
    if (!strcmp(text, "1") || !strcasecmp(text, "true") || !strcasecmp(text, "yes") ||
        !strcasecmp(text, "on"))
      i = 1;
    else if (!strcmp(text, "0") || !strcasecmp(text, "false") || !strcasecmp(text, "no") ||
             !strcasecmp(text, "off"))
      i = 0;
    else
      return bad(err, errlen, from, text, "1 or 0 (true/false, yes/no, on/off)");
    break;
  case GS__T_ADDRESS: {
    char host[256];
    int port = -1;
    int rc = gs__split_host_port(text, host, sizeof host, &port);
    if (rc == 0 && port < 0) rc = -1;
    if (rc != 0 || port < d->min || port > d->max) {
      snprintf(want, sizeof want, "HOST:PORT with a port from %lld to %lld (IPv6 as [ADDR]:PORT)",
               (long long)d->min, (long long)d->max);
      return bad(err, errlen, from, text, want);
    }
    i = port;
    break;
  }
  case GS__T_RANGE: {
    const char *dash = strchr(text, '-');
    char lo[32];
    int ok = dash && (size_t)(dash - text) < sizeof lo;
    if (ok) {
      snprintf(lo, sizeof lo, "%.*s", (int)(dash - text), text);
      ok =
          !parse_i64(lo, &i) && !parse_i64(dash + 1, &i2) && i >= d->min && i2 <= d->max && i <= i2;
    }
    if (!ok) {
      snprintf(want, sizeof want, "LOW-HIGH with %lld <= LOW <= HIGH <= %lld (e.g. 29500-29599)",
               (long long)d->min, (long long)d->max);
      return bad(err, errlen, from, text, want);
    }
    break;
  }
  }
  char *copy = strdup(text);
  if (!copy) {
    snprintf(err, errlen, "out of memory storing %s", from);
    return GS__ERR_NO_MEMORY;
  }
  gs__setting_value *v = &s->v[id];
  free(v->s);
  v->s = copy;
  v->i = i;
  v->i2 = i2;
  v->src = src;
  v->from = from;
  return GS__OK;
}

void gs__settings_init(gs__settings *s) {
  memset(s, 0, sizeof *s);
  char err[256];
  for (int id = 0; id < GS__S_COUNT; id++)
    if (table[id].def) {
      /* Defaults are checked by test_settings; a bad one stays unset. */
      gs__settings_set(s, (gs__setting_id)id, table[id].def, GS__SRC_DEFAULT, "default", err,
                       sizeof err);
    }
}

void gs__settings_free(gs__settings *s) {
  if (!s) return;
  for (int id = 0; id < GS__S_COUNT; id++) {
    free(s->v[id].s);
    s->v[id].s = NULL;
  }
}

int gs__settings_load(gs__settings *s, unsigned scope, char *err, size_t errlen) {
  gs__settings_init(s);
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = &table[id];
    if (!(d->scope & scope)) continue;
    const char *v = getenv(d->env);
    gs__setting_source src = GS__SRC_ENV;
    const char *from = d->env;
    if ((!v || !*v) && d->alias) {
      v = getenv(d->alias);
      src = GS__SRC_ALIAS;
      from = d->alias;
    }
    if (!v || !*v) continue;
    int rc = gs__settings_set(s, (gs__setting_id)id, v, src, from, err, errlen);
    if (rc) return rc;
  }
  return GS__OK;
}

static int is_bool_word(const char *t) {
  static const char *const words[] = {"1", "0", "true", "false", "yes", "no", "on", "off"};
  for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
    if (!strcasecmp(t, words[k])) return 1;
  return 0;
}

int gs__settings_take_flag(gs__settings *s, unsigned scope, int argc, char **argv, int *i,
                           char *err, size_t errlen) {
  const char *a = argv[*i];
  if (a[0] != '-' || a[1] != '-') return 0;
  const char *eq = strchr(a, '=');
  size_t n = eq ? (size_t)(eq - a) : strlen(a);
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = &table[id];
    if (!d->flag || !(d->scope & scope) || strlen(d->flag) != n || strncmp(d->flag, a, n) != 0)
      continue;
    const char *val;
    int used = 0;
    if (eq) {
      val = eq + 1;
    } else if (d->type == GS__T_BOOL) {
      /* "--flag" alone is on; "--flag off" (a boolean word next) also
       * reads as documented ("--fast-path on|off"). */
      val = "1";
      if (*i + 1 < argc && is_bool_word(argv[*i + 1])) {
        val = argv[*i + 1];
        used = 1;
      }
    } else if (*i + 1 < argc) {
      val = argv[*i + 1];
      used = 1;
    } else {
      snprintf(err, errlen, "%s needs a value (%s)", d->flag, d->metavar);
      return -1;
    }
    if (gs__settings_set(s, (gs__setting_id)id, val, GS__SRC_FLAG, d->flag, err, errlen) != GS__OK)
      return -1;
    *i += used;
    return 1;
  }
  return 0;
}

int64_t gs__settings_int(const gs__settings *s, gs__setting_id id) {
  return s->v[id].i;
}

const char *gs__settings_str(const gs__settings *s, gs__setting_id id) {
  return s->v[id].src == GS__SRC_UNSET ? NULL : s->v[id].s;
}

int gs__settings_given(const gs__settings *s, gs__setting_id id) {
  return s->v[id].src != GS__SRC_UNSET && s->v[id].src != GS__SRC_DEFAULT;
}

const char *gs__settings_format(const gs__settings *s, gs__setting_id id, char *buf, size_t cap) {
  const gs__setting *d = &table[id];
  const gs__setting_value *v = &s->v[id];
  if (v->src == GS__SRC_UNSET) {
    snprintf(buf, cap, "(unset)");
    return buf;
  }
  switch (d->type) {
  case GS__T_INT:
  case GS__T_BOOL:
    snprintf(buf, cap, "%lld", (long long)v->i);
    break;
  case GS__T_MILLI:
    format_milli(v->i, buf, cap);
    break;
  case GS__T_SECRET:
    snprintf(buf, cap, "(set)");
    break;
  case GS__T_CHOICE:
    if (choice_name(d->choices, (int)v->i, buf, cap)) snprintf(buf, cap, "?");
    break;
  case GS__T_RANGE:
    snprintf(buf, cap, "%lld-%lld", (long long)v->i, (long long)v->i2);
    break;
  case GS__T_STRING:
  case GS__T_ADDRESS:
    snprintf(buf, cap, "%s", v->s);
    break;
  }
  return buf;
}

void gs__settings_describe(const gs__settings *s, unsigned scope, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  for (int id = 0; id < GS__S_COUNT && used + 1 < cap; id++) {
    const gs__setting *d = &table[id];
    if (!(d->scope & scope)) continue;
    char val[160];
    gs__settings_format(s, (gs__setting_id)id, val, sizeof val);
    int n;
    if (gs__settings_given(s, (gs__setting_id)id))
      n = snprintf(buf + used, cap - used, "%s%s=%s (%s)", used ? " " : "", d->key, val,
                   s->v[id].from);
    else
      n = snprintf(buf + used, cap - used, "%s%s=%s", used ? " " : "", d->key, val);
    if (n < 0) break;
    used += (size_t)n;
    if (used >= cap) used = cap - 1;
  }
}

/* ---- help and docs ------------------------------------------------------- */

static void default_text(const gs__setting *d, char *buf, size_t cap) {
  if (d->def_doc)
    snprintf(buf, cap, "%s", d->def_doc);
  else if (d->def)
    snprintf(buf, cap, "%s", d->def);
  else
    snprintf(buf, cap, "none");
}

static void accepted_text(const gs__setting *d, char *buf, size_t cap) {
  char lo[32], hi[32];
  switch (d->type) {
  case GS__T_INT:
    snprintf(buf, cap, "%lld..%lld", (long long)d->min, (long long)d->max);
    break;
  case GS__T_MILLI:
    format_milli(d->min, lo, sizeof lo);
    format_milli(d->max, hi, sizeof hi);
    snprintf(buf, cap, "%s..%s, fractions allowed", lo, hi);
    break;
  case GS__T_CHOICE:
    snprintf(buf, cap, "%s", d->choices);
    break;
  case GS__T_BOOL:
    snprintf(buf, cap, "1|0");
    break;
  case GS__T_ADDRESS:
    snprintf(buf, cap, "HOST:PORT, port %lld..%lld", (long long)d->min, (long long)d->max);
    break;
  case GS__T_RANGE:
    snprintf(buf, cap, "LOW-HIGH, ports %lld..%lld", (long long)d->min, (long long)d->max);
    break;
  case GS__T_STRING:
  case GS__T_SECRET:
    snprintf(buf, cap, "text");
    break;
  }
}

/* Writes text wrapped to 80 columns from column col, continuation lines
 * indented by indent; returns the column it ends at (no newline). */
static int wrap(FILE *f, const char *text, int col, int indent) {
  const char *p = text;
  while (*p) {
    while (*p == ' ') p++;
    const char *w = p;
    while (*p && *p != ' ') p++;
    int len = (int)(p - w);
    if (len == 0) break;
    if (col > indent && col + 1 + len > 80) {
      fprintf(f, "\n%*s", indent, "");
      col = indent;
    } else if (col > indent) {
      fputc(' ', f);
      col++;
    }
    fprintf(f, "%.*s", len, w);
    col += len;
  }
  return col;
}

void gs__settings_usage(FILE *f, unsigned scope) {
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = &table[id];
    if (!d->flag || !(d->scope & scope)) continue;
    char head[96], def[96], acc[96], more[512];
    /* The help text is written as is (any length); only the bracket is
     * formatted into a buffer, whose parts are all short. */
    snprintf(head, sizeof head, "  %s %s", d->flag, d->metavar);
    fprintf(f, "%-28s", head);
    int col = (int)strlen(head) < 28 ? 28 : (int)strlen(head);
    if ((int)strlen(head) >= 28) {
      fprintf(f, "\n%28s", "");
      col = 28;
    }
    default_text(d, def, sizeof def);
    accepted_text(d, acc, sizeof acc);
    snprintf(more, sizeof more, "[%s; default %s; env %s%s%s]", acc, def, d->env,
             d->alias ? ", " : "", d->alias ? d->alias : "");
    col = wrap(f, d->help, col, 28);
    wrap(f, more, col, 28);
    fputc('\n', f);
  }
}

/* Markdown cell text: '|' would end the cell. */
static void md_cell(FILE *f, const char *text) {
  for (const char *p = text; *p; p++) {
    if (*p == '|')
      fputs(", ", f);
    else
      fputc(*p, f);
  }
}

void gs__settings_markdown(FILE *f, unsigned scope) {
  int flags = scope == GS__FOR_SERVER; /* only gradsyncd has flags */
  if (flags)
    fprintf(f, "| flag | environment | accepted | default | meaning |\n|---|---|---|---|---|\n");
  else
    fprintf(f, "| environment | accepted | default | meaning |\n|---|---|---|---|\n");
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = &table[id];
    if (!(d->scope & scope)) continue;
    char def[96], acc[96];
    default_text(d, def, sizeof def);
    accepted_text(d, acc, sizeof acc);
    if (flags) {
      if (d->flag)
        fprintf(f, "| `%s %s` ", d->flag, d->metavar);
      else
        fprintf(f, "| ");
      if (d->run_flag) fprintf(f, "(gradsync-run: `%s %s`) ", d->run_flag, d->run_metavar);
    }
    fprintf(f, "| `%s`%s%s%s | ", d->env, d->alias ? ", `" : "", d->alias ? d->alias : "",
            d->alias ? "`" : "");
    md_cell(f, acc);
    fputs(" | ", f);
    md_cell(f, def);
    fputs(" | ", f);
    md_cell(f, d->help);
    fputs(" |\n", f);
  }
}
