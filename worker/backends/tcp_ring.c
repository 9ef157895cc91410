/* TCP ring backend: the CPU data plane.
 *
 * Each rank owns two TCP connections: one it dialled to its right neighbour
 * ((rank+1) % size), which it only writes, and one it accepted from its left
 * neighbour, which it only reads (for size 2 these are two separate
 * connections between the same pair). Peers find each other through the
 * rendezvous store: every rank publishes "<addr>:<port>" of its listener
 * under "<prefix>ring/addr/<rank>".
 *
 * Every collective is one byte stream to the right and one from the left,
 * driven by a single poll() loop over non-blocking sockets, so sending and
 * receiving always overlap and two ranks pushing large chunks at each other
 * cannot deadlock. The stream shape that makes this simple: what a rank sends
 * is its own data followed by what it received and passes on, in the order
 * it arrived (reduce-scatter then allgather for allreduce, the first half
 * for reducescatter, plain forwarding for allgatherv, broadcast and the
 * relayed blocks of alltoallv). So the send side may run as far as "own
 * bytes + forwarded bytes received and processed", segment by segment,
 * which pipelines the steps of the ring without per-step barriers. Each
 * allreduce chunk is reduced by one chain of ranks in one fixed order and
 * then copied out, so all ranks end bitwise identical.
 *
 * Failures are bounded and loud: every wait has a deadline (connect timeout
 * for the rendezvous, io timeout per stretch without progress; agree alone
 * waits without one until every rank has entered, see stream.patient,
 * ending only on abort or a closed connection), a close or
 * reset by a neighbour fails the collective at once, and a rank that gives
 * up tells its neighbours right away (see poison) so the whole ring fails
 * within milliseconds, naming the rank that failed first where it can.
 * After a failure the ring is unusable; every later call repeats the error.
 *
 * Threads: one collective at a time, from the worker's background thread,
 * which owns everything here. abort() may be called from any thread while a
 * collective runs (not concurrently with destroy): it only sets an atomic
 * flag and signals an eventfd that every poll watches. */
#include "backend.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "log.h"
#include "messages.h"
#include "netaddr.h"
#include "secret.h"
#include "status.h"

/* Reduce-scatter data arrives in segments of this size; each is reduced as
 * soon as it is complete and may then be forwarded right away. */
#define SEG_BYTES (512u * 1024u)
/* A segmented allreduce packs members smaller than this (see
 * ring_allreduce_segs_vt). */
#define SEG_SMALL_BYTES (64u * 1024u)
/* Requested socket buffers. Large enough to keep a segment or two in flight
 * per direction; the kernel caps them at net.core.[rw]mem_max. */
#define SOCK_BUF_BYTES (4 * 1024 * 1024)
#define HELLO_MAGIC 0x47535248u     /* "GSRH" */
#define CHALLENGE_MAGIC 0x47535243u /* "GSRC" */
#define RESPONSE_MAGIC 0x47535250u  /* "GSRP" */
#define ACK_MAGIC 0x4753524bu       /* "GSRK" */
#define NOTICE_MAGIC 0x4753524eu    /* "GSRN" */
#define PROTO_VERSION 2u
#define NONCE_BYTES 16
#define MAC_BYTES 32
#define HELLO_BYTES (16 + NONCE_BYTES) /* magic, version, rank, size, nonce */
#define CHALLENGE_BYTES (4 + NONCE_BYTES + MAC_BYTES)
#define RESPONSE_BYTES (4 + MAC_BYTES)
#define ACK_BYTES 8
#define HELLO_WAIT_MS 2000 /* a connection must finish its handshake this fast */
#define MAX_CANDIDATES 16  /* unproven connections held at once */
#define ADDR_MAX 300       /* "<host>:<port>", host up to 255 */
#define CONNECT_RETRY_MS 20
/* Collectives of up to SPIN_BYTES (both streams together) spin on their
 * sockets for up to SPIN_NS before each blocking poll: the next bytes of a
 * small collective come within microseconds, and a blocked rank pays for a
 * wake-up each time (tens of us where an idle CPU must be woken, as in a
 * VM). The spin yields the CPU between two looks, so where ranks share a
 * CPU (more ranks than cores) the peer it waits for runs instead. Bounded,
 * so a rank whose peers are away blocks after that (agree: for as long as
 * they are away, at no CPU cost). Measured with gs-transport-bench
 * (docs/benchmarks.md): 20, 50 and 100 us gave the same np=2 figures; 50
 * us was needed at np=4 on 2 cores. 500 us since, as shm's (its SPIN_NS):
 * a fast round's agreement often waits longer than 50 us for the last
 * rank, and the rank that slept then let its idle vCPU halt (np=4 on 2
 * vCPUs, ResNet-50 control-only over the ring: 0.251 -> 0.141 ms, np=2
 * unchanged; docs/benchmarks.md "The exec thread's yield-spin"). The cost
 * is idle cpu burned for up to 500 us per wait. */
#define SPIN_BYTES (64u * 1024u)
/* An allreduce (agree included) of up to this many bytes moves as one
 * chunk: one token that goes round the ring twice (reduce, then
 * allgather), one rank at a time, instead of size chunks of a few bytes
 * with every rank busy at every step; the hops are as many either way.
 * On loopback with ranks sharing CPUs (np=4 on 2 cores) one chunk took a
 * third of the time up to 64 KiB (4 KiB: 100 -> 35 us; 64 KiB: 206 -> 85);
 * across hosts each hop then carries size times the bytes, which a
 * 10 Gb/s link pays for from a few KiB on: hence 8 KiB. */
#define ONE_CHUNK_BYTES (8u * 1024u)
#define SPIN_NS 500000

typedef struct piece {
  char *p;
  size_t len;
  int fwd; /* recv pieces: replayed later in the send stream */
  /* Reduced recv pieces: this rank's own contribution when it does not
   * live at p (a segmented allreduce whose tensor's send and recv buffers
   * differ): p receives local (op) the incoming data. NULL: in place. */
  const char *local;
} piece;

/* GRADSYNC_TCP_CONGESTION, resolved once per ring: which congestion control
 * the ring's sockets ask for. */
typedef struct cc_pref {
  int mode;      /* CC_AUTO, CC_SYSTEM or CC_NAMED */
  char name[16]; /* CC_NAMED: the algorithm (TCP_CA_NAME_MAX is 16) */
  int rank;      /* for the warning */
  int warned;    /* the one warning about a refused name was logged */
} cc_pref;
enum { CC_AUTO, CC_SYSTEM, CC_NAMED };

typedef struct ring {
  gs__backend base;
  int rank, size, left, right;
  int io_timeout_ms;
  int send_fd;  /* dialled to the right neighbour; written only */
  int recv_fd;  /* accepted from the left neighbour; read only */
  int abort_fd; /* eventfd, readable once abort was called */
  atomic_int aborted;
  /* After a failed collective the two streams are out of step with the
   * peers', so the ring refuses further work and repeats the first error. */
  int broken;
  int poisoned; /* peers were told (see poison) */
  char broken_msg[1024];
  char left_addr[ADDR_MAX], right_addr[ADDR_MAX];
  unsigned char key[GS__SECRET_BYTES]; /* the job's ring key */
  char prefix[256];                    /* kv key prefix: binds proofs to the epoch */
  char *scratch;                       /* SEG_BYTES: incoming reduce-scatter segment */
  float *work;                         /* float32 workspace for float16/bfloat16 */
  size_t work_cap;                     /* elements */
  piece *send, *recv;                  /* 2 * size entries each, rebuilt per collective */
  piece *seg_send, *seg_recv;          /* the segmented allreduce's pieces */
  size_t seg_cap;                      /* entries of each */
  size_t *offs;                        /* size + 1 block offsets for allgatherv */
  void *fusion;                        /* host fusion staging (gs__host_staging) */
  size_t fusion_cap;
  int *ids;          /* size entries: the job rank of each ring rank, named in messages
                        (a ring of a subset of the job: the hosts' leaders); NULL = itself */
  int deterministic; /* reduce every element in rank order (see det_reduce) */
  cc_pref cc;        /* GRADSYNC_TCP_CONGESTION */
  char *det;         /* its scratch: contributions received and relayed */
  size_t det_cap;
} ring;

/* One collective as two streams. After its first pre bytes (this rank's
 * own data), the send stream replays, in order, the recv pieces marked fwd,
 * so it may run as far as pre + the fwd bytes received and processed. */
typedef struct stream {
  const char *what;
  const piece *send;
  int nsend;
  size_t pre;
  const piece *recv;
  int nrecv;
  int nreduce; /* the first nreduce recv pieces are reduced into place */
  gs__dtype dt;
  gs__reduce_op op;
  /* The last reduced pieces (recv[fin_from..nreduce-1], the block this
   * rank ends up owning) are finished as they are reduced when finish is
   * set: divided by
   * divisor (the average) and multiplied by factor (the postscale), and
   * written to out in out_dt (a float32 accumulation rounded to 16 bits)
   * instead of in place when out is set; then what is forwarded of it is
   * out's bytes. So no pass over the whole buffer follows the ring. */
  int finish;
  int fin_from;
  int divisor;
  double factor;
  char *out;
  gs__dtype out_dt;
  /* agree: until this many recv bytes are processed (the first piece that
   * holds every rank's contribution), peers may not have entered the
   * collective yet, so the wait has no deadline: only abort or a closed
   * connection ends it. 0: the io timeout applies from the start. */
  size_t patient;
} stream;

static const gs__backend_vtbl k_vtbl;

/* ---- small helpers ---------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int ms_left(int64_t deadline) {
  int64_t left = deadline - now_ms();
  if (left < 0) return 0;
  if (left > 1000000000) return 1000000000;
  return (int)left;
}

/* The rank messages name for ring rank q: its job rank (see ring.ids). */
static int id(const ring *r, int q) {
  return r->ids ? r->ids[q] : q;
}

/* errno -> text: the one place errno is translated into words. */
static const char *errtext(int e, char *buf, size_t len) {
  return strerror_r(e, buf, len); /* GNU: may return a static string */
}

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* auto: where the socket's algorithm (the system's default) is BBR, ask for
 * CUBIC (or, where only the allowed list's algorithms may be chosen, Reno):
 * BBR paces every send with a timer, and the ring's bursts of a chunk at a
 * time, between ranks one hop apart, only wait for it. Measured with
 * gs-transport-bench, np=2, float32 SUM, 1 MiB: between two network
 * namespaces over a veth pair 790-860 us under BBR, 345-460 under CUBIC or
 * Reno; on loopback 470-510 against 350-415. Any other algorithm the
 * administrator chose is left as it is. system: never touched. A name: asked
 * for on every socket; where the kernel refuses, one warning per ring and the
 * system's algorithm stays. */
static void set_congestion(int fd, cc_pref *cc) {
  if (!cc || cc->mode == CC_SYSTEM) return;
  if (cc->mode == CC_NAMED) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc->name, (socklen_t)strlen(cc->name)) == 0 ||
        cc->warned)
      return;
    int e = errno;
    char eb[128], allowed[256] = "unreadable";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_allowed_congestion_control", "r");
    if (f) {
      if (!fgets(allowed, sizeof allowed, f)) snprintf(allowed, sizeof allowed, "unreadable");
      fclose(f);
      allowed[strcspn(allowed, "\n")] = 0;
    }
    cc->warned = 1;
    GS_LOG_WARN("tcp ring: rank %d: the kernel refused GRADSYNC_TCP_CONGESTION=%s (%s); the ring "
                "keeps the system's algorithm. An unprivileged process may choose only those of "
                "net.ipv4.tcp_allowed_congestion_control (here: %s); load the module or add the "
                "name there, or set GRADSYNC_TCP_CONGESTION=auto",
                cc->rank, cc->name, errtext(e, eb, sizeof eb), allowed);
    return;
  }
  char cur[16] = {0};
  socklen_t len = sizeof cur - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cur, &len) != 0 || strcmp(cur, "bbr") != 0)
    return;
  static const char *const alt[] = {"cubic", "reno"};
  for (size_t i = 0; i < sizeof alt / sizeof alt[0]; i++)
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, alt[i], (socklen_t)strlen(alt[i])) == 0) return;
}

static void tune_socket(int fd, cc_pref *cc) {
  int one = 1, buf = SOCK_BUF_BYTES;
  /* best effort: a failure only costs speed */
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  set_congestion(fd, cc);
}

/* Splits "host:port" / "[v6]:port" into its parts. 0 on success. */
static int split_host_port(const char *s, char *host, size_t hostlen, char *port, size_t portlen) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s || !colon[1]) return -1;
  const char *h = s, *he = colon;
  if (*h == '[') {
    if (he[-1] != ']') return -1;
    h++, he--;
  }
  size_t hl = (size_t)(he - h), pl = strlen(colon + 1);
  if (hl == 0 || hl >= hostlen || pl >= portlen) return -1;
  memcpy(host, h, hl);
  host[hl] = 0;
  memcpy(port, colon + 1, pl + 1);
  return 0;
}

/* ---- rendezvous --------------------------------------------------------- */

/* The local address (IPv4 or IPv6) the kernel would use toward the
 * coordinator: a UDP socket connect()ed there (nothing is sent) is bound to
 * it. Tries each address the coordinator's name resolves to. */
static int local_addr_toward(const char *coordinator, char *out, size_t outlen, char *err,
                             size_t errlen) {
  char host[256], port[32], eb[128];
  if (!coordinator || !*coordinator) {
    /* no coordinator to aim at (single-host tests): loopback */
    snprintf(out, outlen, "127.0.0.1");
    return GS__OK;
  }
  if (split_host_port(coordinator, host, sizeof host, port, sizeof port) != 0) {
    snprintf(err, errlen,
             "tcp ring: coordinator address \"%s\" is not \"host:port\"; cannot work out "
             "which local address the other ranks can reach (or set GRADSYNC_ADVERTISE_ADDR)",
             coordinator);
    return GS__ERR_INVALID_ARG;
  }
  int gai = 0, e = 0;
  if (gs__local_addr_toward(host, port, out, outlen, &gai, &e) == 0) return GS__OK;
  if (gai != 0) {
    snprintf(err, errlen,
             "tcp ring: cannot resolve the coordinator host \"%s\" (%s); set "
             "GRADSYNC_ADVERTISE_ADDR (or GRADSYNC_DATA_ADDR) to this host's address",
             host, gai_strerror(gai));
    return GS__ERR_DATA_PLANE;
  }
  snprintf(err, errlen,
           "tcp ring: cannot find a local address toward the coordinator %s: %s; set "
           "GRADSYNC_ADVERTISE_ADDR to this host's address",
           coordinator, errtext(e, eb, sizeof eb));
  return GS__ERR_DATA_PLANE;
}

/* One listening socket of p on port (0: the kernel picks). Bind and listen
 * both count: with SO_REUSEADDR two sockets that are not listening yet may
 * bind the same port (two ranks of a host starting at the bottom of
 * GRADSYNC_DATA_PORT_RANGE at once), and then the later listen fails with
 * EADDRINUSE; the socket is then spent and the caller tries the next port
 * with a fresh one. Returns the socket, or -1 with *e set. */
static int listen_one(struct addrinfo *p, const char *node, int port, cc_pref *cc, int *e) {
  int fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 && !node && p->ai_family == AF_INET6) {
    /* IPv6 disabled in this kernel: fall back to IPv4 */
    struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    memcpy(p->ai_addr, &any4, sizeof any4);
    p->ai_addrlen = sizeof any4;
    p->ai_family = AF_INET;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  }
  if (fd < 0) {
    *e = errno;
    return -1;
  }
  int one = 1, zero = 0;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (p->ai_family == AF_INET6 && !node)
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  tune_socket(fd, cc); /* inherited by the accepted socket */
  if (p->ai_family == AF_INET6)
    ((struct sockaddr_in6 *)p->ai_addr)->sin6_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in *)p->ai_addr)->sin_port = htons((uint16_t)port);
  if (bind(fd, p->ai_addr, p->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    *e = errno;
    close(fd);
    return -1;
  }
  *e = 0;
  return fd;
}

/* Binds a listening socket: to data_addr when given (an IPv4 or IPv6
 * address or a host name), else to every interface (IPv6 dual-stack, or
 * IPv4 where the host has no IPv6); on the first free port of [lo, hi] when
 * lo > 0, else on a port the kernel picks. Returns the socket and its port,
 * or -1 with a message. */
static int listen_on(const char *data_addr, int lo, int hi, int rank, cc_pref *cc, int *port_out,
                     char *err, size_t errlen) {
  char eb[128];
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *ai = NULL;
  const char *node = data_addr && *data_addr ? data_addr : NULL;
  if (!node) hints.ai_family = AF_INET6;
  int rc = getaddrinfo(node, "0", &hints, &ai);
  if (rc != 0 && !node) { /* no IPv6 here: listen on IPv4 */
    hints.ai_family = AF_INET;
    rc = getaddrinfo(NULL, "0", &hints, &ai);
  }
  if (rc != 0) {
    snprintf(err, errlen,
             "tcp ring: rank %d cannot resolve GRADSYNC_DATA_ADDR \"%s\": %s; give an address "
             "of this host",
             rank, node ? node : "(any)", gai_strerror(rc));
    return -1;
  }
  int lfd = -1, e = 0;
  const char *where = node ? node : "all interfaces";
  for (struct addrinfo *p = ai; p && lfd < 0; p = p->ai_next) {
    int first = lo > 0 ? lo : 0, last = lo > 0 ? hi : 0;
    for (int port = first; port <= last && lfd < 0; port++) {
      lfd = listen_one(p, node, port, cc, &e);
      if (lfd < 0 && e != EADDRINUSE) break;
    }
    if (lfd >= 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      if (getsockname(lfd, (struct sockaddr *)&ss, &sl) == 0) {
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
      } else {
        e = errno;
        close(lfd);
        lfd = -1;
      }
    }
  }
  freeaddrinfo(ai);
  if (lfd < 0) {
    if (lo > 0 && e == EADDRINUSE)
      snprintf(err, errlen,
               "tcp ring: rank %d cannot listen on %s: every port of GRADSYNC_DATA_PORT_RANGE="
               "%d-%d is in use; widen the range (one port per rank on this host)",
               rank, where, lo, hi);
    else
      snprintf(err, errlen, "tcp ring: rank %d cannot listen on %s%s: %s", rank, where,
               lo > 0 ? " in GRADSYNC_DATA_PORT_RANGE" : "", errtext(e, eb, sizeof eb));
  }
  return lfd;
}

/* Is text a wildcard bind address (nothing to advertise)? */
static int is_wildcard(const char *text) {
  return !strcmp(text, "0.0.0.0") || !strcmp(text, "::") || !strcmp(text, "[::]");
}

/* "host:port", with an IPv6 literal in brackets. */
static void format_addr(char *out, size_t cap, const char *host, int port) {
  size_t n = strlen(host);
  if (strchr(host, ':') && !(host[0] == '[' && host[n - 1] == ']'))
    snprintf(out, cap, "[%s]:%d", host, port);
  else
    snprintf(out, cap, "%s:%d", host, port);
}

static void addr_key(char *key, size_t len, const char *prefix, int rank) {
  snprintf(key, len, "%sring/addr/%d", prefix, rank);
}

/* The number in ring rank r's kv key: the job rank it runs for when the
 * ring is a subset of the job (the coordinator lets only that rank write
 * "<...>/addr/<rank>"). */
static int key_rank(const gs__tcp_ring_opts *o, int r) {
  return o->kv_ranks ? o->kv_ranks[r] : r;
}

/* Reads rank peer's published address into out. */
static int get_peer_addr(const gs__tcp_ring_opts *o, const char *prefix, int peer, int timeout_ms,
                         char *out, char *err, size_t errlen) {
  char key[512];
  void *val = NULL;
  size_t len = 0;
  addr_key(key, sizeof key, prefix, key_rank(o, peer));
  int rc = o->kv.get(o->kv.ctx, key, timeout_ms, &val, &len, err, errlen);
  if (rc != GS__OK) return rc;
  if (len == 0 || len >= ADDR_MAX || memchr(val, 0, len)) {
    snprintf(err, errlen, "tcp ring: key \"%s\" holds %zu bytes, not \"<addr>:<port>\"", key, len);
    free(val);
    return GS__ERR_DATA_PLANE;
  }
  memcpy(out, val, len);
  out[len] = 0;
  free(val);
  return GS__OK;
}

/* Writes or reads exactly len bytes on a non-blocking socket before the
 * deadline. 0 on success, else an errno value (ETIMEDOUT, ECONNRESET, and
 * EPIPE for an orderly close by the peer). */
static int io_exact(int fd, void *buf, size_t len, int writing, int64_t deadline) {
  char *p = buf;
  while (len > 0) {
    ssize_t k =
        writing ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (k > 0) {
      p += k, len -= (size_t)k;
      continue;
    }
    if (k == 0) return EPIPE;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
    int left = ms_left(deadline);
    if (left == 0) return ETIMEDOUT;
    int pr = poll(&pfd, 1, left);
    if (pr < 0 && errno != EINTR) return errno;
  }
  return 0;
}

/* Dials host:port until it answers or the deadline passes, retrying while
 * the peer refuses (not listening yet) or is unreachable for a moment.
 * Returns the connected non-blocking socket, or -1 with *last_errno. */
static int dial(const char *addr, cc_pref *cc, int64_t deadline, int *last_errno, char *why,
                size_t whylen) {
  char host[256], port[32];
  *last_errno = ETIMEDOUT;
  if (split_host_port(addr, host, sizeof host, port, sizeof port) != 0) {
    snprintf(why, whylen, "the address is not \"<addr>:<port>\"");
    *last_errno = EINVAL;
    return -1;
  }
  for (;;) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
      snprintf(why, whylen, "cannot resolve \"%s\": %s", host, gai_strerror(rc));
    } else {
      /* the first address the name resolves to (as a client would) */
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        *last_errno = errno;
        freeaddrinfo(ai);
        snprintf(why, whylen, "socket() failed");
        return -1;
      }
      tune_socket(fd, cc); /* before connect: the window scale is fixed at SYN */
      int e = 0;
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        e = errno;
        if (e == EINPROGRESS) {
          struct pollfd pfd = {.fd = fd, .events = POLLOUT};
          int pr = poll(&pfd, 1, ms_left(deadline));
          if (pr > 0) {
            socklen_t sl = sizeof e;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0) e = errno;
          } else {
            e = pr == 0 ? ETIMEDOUT : errno;
          }
        }
      }
      freeaddrinfo(ai);
      if (e == 0) return fd;
      close(fd);
      *last_errno = e;
      why[0] = 0;
    }
    if (ms_left(deadline) == 0) return -1;
    int pause = ms_left(deadline) < CONNECT_RETRY_MS ? ms_left(deadline) : CONNECT_RETRY_MS;
    poll(NULL, 0, pause);
  }
}

/* ---- membership proof ---------------------------------------------------
 *
 * A ring connection proves that both ends hold the job's ring key (handed
 * to every rank in its JoinResponse) by HMAC-SHA256 challenge-response:
 *
 *   dialer d -> acceptor a  HELLO      magic, version, d, size, nonce_d
 *   a -> d                  CHALLENGE  magic, nonce_a,
 *                                      HMAC(K, "acceptor" a d size nonce_d nonce_a prefix)
 *   d -> a                  RESPONSE   magic, HMAC(K, "dialer" d a size nonce_a nonce_d prefix)
 *   a -> d                  ACK        magic, a
 *
 * The labels differ per direction (no reflection), each side's MAC covers
 * the nonce the other side chose (no replay), and the key prefix binds the
 * proof to this job's epoch. Connections that do not finish this within
 * HELLO_WAIT_MS are closed and counted as strays; the ring goes on. Only
 * who connects is proven: the data itself is neither encrypted nor MACed. */

static void put_hello(unsigned char *p, int rank, int size,
                      const unsigned char nonce[NONCE_BYTES]) {
  put_u32(p, HELLO_MAGIC);
  put_u32(p + 4, PROTO_VERSION);
  put_u32(p + 8, (uint32_t)rank);
  put_u32(p + 12, (uint32_t)size);
  memcpy(p + 16, nonce, NONCE_BYTES);
}

/* MAC of one direction: label, then the proving rank, the other rank, the
 * size, the other side's nonce, this side's nonce and the key prefix. */
static void ring_mac(const ring *r, const char *label, int prover, int other,
                     const unsigned char *their_nonce, const unsigned char *my_nonce,
                     unsigned char out[MAC_BYTES]) {
  unsigned char msg[64 + 12 + 2 * NONCE_BYTES + 256];
  size_t n = 0, ll = strlen(label), pl = strlen(r->prefix);
  memcpy(msg, label, ll), n += ll;
  put_u32(msg + n, (uint32_t)prover), n += 4;
  put_u32(msg + n, (uint32_t)other), n += 4;
  put_u32(msg + n, (uint32_t)r->size), n += 4;
  memcpy(msg + n, their_nonce, NONCE_BYTES), n += NONCE_BYTES;
  memcpy(msg + n, my_nonce, NONCE_BYTES), n += NONCE_BYTES;
  if (pl > 255) pl = 255;
  memcpy(msg + n, r->prefix, pl), n += pl;
  gs__hmac_sha256(r->key, sizeof r->key, msg, n, out);
}

/* An accepted connection that has not proven itself yet. */
typedef struct candidate {
  int fd;
  int got_hello;
  size_t have; /* bytes of the current message read so far */
  unsigned char buf[CHALLENGE_BYTES];
  unsigned char nonce_d[NONCE_BYTES], nonce_a[NONCE_BYTES];
  int64_t deadline;
} candidate;

/* Reads what is available toward a message of want bytes into buf.
 * 1 = complete, 0 = not yet, -1 = closed or failed. */
static int read_some(int fd, unsigned char *buf, size_t *have, size_t want) {
  while (*have < want) {
    ssize_t k = recv(fd, buf + *have, want - *have, MSG_DONTWAIT);
    if (k > 0) {
      *have += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  return 1;
}

/* Advances candidate c: 1 = proven (ACK sent), 0 = in progress, -1 = reject. */
static int candidate_step(ring *r, candidate *c, int64_t deadline) {
  if (!c->got_hello) {
    int k = read_some(c->fd, c->buf, &c->have, HELLO_BYTES);
    if (k <= 0) return k;
    if (get_u32(c->buf) != HELLO_MAGIC || get_u32(c->buf + 4) != PROTO_VERSION ||
        get_u32(c->buf + 8) != (uint32_t)r->left || get_u32(c->buf + 12) != (uint32_t)r->size)
      return -1;
    memcpy(c->nonce_d, c->buf + 16, NONCE_BYTES);
    if (gs__random_bytes(c->nonce_a, NONCE_BYTES) != 0) return -1;
    unsigned char ch[CHALLENGE_BYTES];
    put_u32(ch, CHALLENGE_MAGIC);
    memcpy(ch + 4, c->nonce_a, NONCE_BYTES);
    ring_mac(r, "gradsync ring acceptor", r->rank, r->left, c->nonce_d, c->nonce_a,
             ch + 4 + NONCE_BYTES);
    if (io_exact(c->fd, ch, sizeof ch, 1, c->deadline) != 0) return -1;
    c->got_hello = 1;
    c->have = 0;
  }
  int k = read_some(c->fd, c->buf, &c->have, RESPONSE_BYTES);
  if (k <= 0) return k;
  unsigned char want[MAC_BYTES];
  ring_mac(r, "gradsync ring dialer", r->left, r->rank, c->nonce_a, c->nonce_d, want);
  if (get_u32(c->buf) != RESPONSE_MAGIC || !gs__bytes_equal(c->buf + 4, want, MAC_BYTES)) return -1;
  unsigned char ack[ACK_BYTES];
  put_u32(ack, ACK_MAGIC);
  put_u32(ack + 4, (uint32_t)r->rank);
  return io_exact(c->fd, ack, sizeof ack, 1, deadline) == 0 ? 1 : -1;
}

/* The two halves of the rendezvous run together in one poll loop: this
 * rank proves itself to its right neighbour (on send_fd, already connected
 * and greeted with nonce_d) while it accepts and checks connections from
 * its left. Running them together is what keeps the ring from waiting in a
 * cycle: every rank answers challenges while it waits for its own.
 * Returns 0, or an errno-style code in *e with the half that failed in
 * *which (0 = right, 1 = left). */
static int handshake(ring *r, int lfd, const unsigned char nonce_d[NONCE_BYTES], int64_t deadline,
                     int *strays, int *which, int *proof_failed) {
  candidate cand[MAX_CANDIDATES];
  int ncand = 0, right_done = 0, right_stage = 0, e = 0;
  size_t rhave = 0;
  unsigned char rbuf[CHALLENGE_BYTES];
  *proof_failed = 0;
  while (!right_done || r->recv_fd < 0) {
    struct pollfd pfd[MAX_CANDIDATES + 2];
    int n = 0;
    int64_t now = now_ms(), wake = deadline;
    if (!right_done) pfd[n++] = (struct pollfd){.fd = r->send_fd, .events = POLLIN};
    int lidx = -1;
    if (r->recv_fd < 0) {
      lidx = n;
      pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    }
    int cbase = n;
    for (int i = 0; i < ncand; i++) {
      pfd[n++] = (struct pollfd){.fd = cand[i].fd, .events = POLLIN};
      if (cand[i].deadline < wake) wake = cand[i].deadline;
    }
    if (now >= deadline) {
      e = ETIMEDOUT;
      *which = right_done ? 1 : 0;
      goto out_close;
    }
    int pr = poll(pfd, (nfds_t)n, ms_left(wake));
    if (pr < 0 && errno != EINTR) {
      e = errno;
      *which = 1;
      goto out_close;
    }
    now = now_ms();
    /* the right neighbour's challenge, then its ack */
    if (!right_done && (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      size_t want = right_stage == 0 ? CHALLENGE_BYTES : ACK_BYTES;
      int k = read_some(r->send_fd, rbuf, &rhave, want);
      if (k < 0) {
        e = EPIPE;
        *which = 0;
        goto out_close;
      }
      if (k > 0 && right_stage == 0) {
        unsigned char want_mac[MAC_BYTES], resp[RESPONSE_BYTES];
        ring_mac(r, "gradsync ring acceptor", r->right, r->rank, nonce_d, rbuf + 4, want_mac);
        if (get_u32(rbuf) != CHALLENGE_MAGIC ||
            !gs__bytes_equal(rbuf + 4 + NONCE_BYTES, want_mac, MAC_BYTES)) {
          e = EPROTO;
          *which = 0;
          *proof_failed = 1;
          goto out_close;
        }
        put_u32(resp, RESPONSE_MAGIC);
        ring_mac(r, "gradsync ring dialer", r->rank, r->right, rbuf + 4, nonce_d, resp + 4);
        e = io_exact(r->send_fd, resp, sizeof resp, 1, deadline);
        if (e) {
          *which = 0;
          goto out_close;
        }
        right_stage = 1;
        rhave = 0;
      } else if (k > 0) {
        if (get_u32(rbuf) != ACK_MAGIC || get_u32(rbuf + 4) != (uint32_t)r->right) {
          e = EPROTO;
          *which = 0;
          goto out_close;
        }
        right_done = 1;
      }
    }
    /* candidates from the left: advance, reject or expire */
    for (int i = ncand - 1; i >= 0; i--) {
      int k = 0;
      if (pfd[cbase + i].revents) k = candidate_step(r, &cand[i], deadline);
      if (k == 0 && now >= cand[i].deadline) k = -1;
      if (k == 0) continue;
      if (k > 0 && r->recv_fd < 0) {
        tune_socket(cand[i].fd, &r->cc);
        r->recv_fd = cand[i].fd;
      } else {
        close(cand[i].fd);
        (*strays)++;
      }
      cand[i] = cand[--ncand];
    }
    if (r->recv_fd >= 0) {
      /* proven: whoever else is still trying is not needed */
      for (int i = 0; i < ncand; i++) close(cand[i].fd);
      ncand = 0;
    } else if (lidx >= 0 && (pfd[lidx].revents & POLLIN)) {
      int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (ncand == MAX_CANDIDATES) { /* make room: the oldest has had longest */
          int oldest = 0;
          for (int i = 1; i < ncand; i++)
            if (cand[i].deadline < cand[oldest].deadline) oldest = i;
          close(cand[oldest].fd);
          (*strays)++;
          cand[oldest] = cand[--ncand];
        }
        memset(&cand[ncand], 0, sizeof cand[ncand]);
        cand[ncand].fd = fd;
        cand[ncand].deadline = now + HELLO_WAIT_MS < deadline ? now + HELLO_WAIT_MS : deadline;
        ncand++;
      } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        e = errno;
        *which = 1;
        goto out_close;
      }
    }
  }
  return 0;
out_close:
  for (int i = 0; i < ncand; i++) close(cand[i].fd);
  return e;
}

static int rendezvous(ring *r, const gs__tcp_ring_opts *o, char *err, size_t errlen) {
  char eb[128], my_addr[ADDR_MAX], host[256], key[512];
  const char *prefix = o->key_prefix ? o->key_prefix : "";
  int64_t deadline = now_ms() + o->connect_timeout_ms;
  int status = GS__ERR_DATA_PLANE;

  int my_port = 0;
  int lfd = listen_on(o->data_addr, o->port_lo, o->port_hi, id(r, r->rank), &r->cc, &my_port, err,
                      errlen);
  if (lfd < 0) return GS__ERR_DATA_PLANE;

  if (o->advertise_addr && *o->advertise_addr) {
    snprintf(host, sizeof host, "%s", o->advertise_addr);
  } else if (o->data_addr && *o->data_addr && !is_wildcard(o->data_addr)) {
    snprintf(host, sizeof host, "%s", o->data_addr);
  } else {
    status = local_addr_toward(o->coordinator, host, sizeof host, err, errlen);
    if (status != GS__OK) goto out_close_listener;
    status = GS__ERR_DATA_PLANE;
  }
  format_addr(my_addr, sizeof my_addr, host, my_port);
  addr_key(key, sizeof key, prefix, key_rank(o, r->rank));
  int rc = o->kv.set(o->kv.ctx, key, my_addr, strlen(my_addr), err, errlen);
  if (rc != GS__OK) {
    status = rc;
    goto out_close_listener;
  }

  /* Both neighbours' addresses: the right one to dial, the left one to name
   * in error messages. */
  rc = get_peer_addr(o, prefix, r->right, ms_left(deadline), r->right_addr, err, errlen);
  if (rc == GS__OK && r->left != r->right)
    rc = get_peer_addr(o, prefix, r->left, ms_left(deadline), r->left_addr, err, errlen);
  else if (rc == GS__OK)
    memcpy(r->left_addr, r->right_addr, sizeof r->left_addr);
  if (rc == GS__ERR_TIMEOUT) {
    /* name every neighbour still missing, not just the first we waited on */
    char tmp[ADDR_MAX], e2[64];
    int miss_r = !r->right_addr[0];
    int miss_l = r->left != r->right &&
                 (!r->left_addr[0] && get_peer_addr(o, prefix, r->left, 0, tmp, e2, sizeof e2));
    char who[64];
    if (miss_r && miss_l)
      snprintf(who, sizeof who, "ranks %d and %d", id(r, r->right), id(r, r->left));
    else
      snprintf(who, sizeof who, "rank %d", miss_r ? id(r, r->right) : id(r, r->left));
    snprintf(err, errlen,
             "tcp ring: rank %d could not reach %s: no address was published under \"%sring/"
             "addr/<rank>\" within %d ms. %s never started or failed before joining the ring; "
             "check %s.",
             id(r, r->rank), who, prefix, o->connect_timeout_ms,
             miss_r && miss_l ? "Those ranks" : "That rank",
             miss_r && miss_l ? "their logs" : "its log");
    goto out_close_listener;
  }
  if (rc != GS__OK) {
    status = rc;
    goto out_close_listener;
  }

  /* connect() completes against the right's listen backlog, so dialling
   * first and accepting second cannot wait in a cycle. */
  int e = 0;
  char why[400] = "";
  r->send_fd = dial(r->right_addr, &r->cc, deadline, &e, why, sizeof why);
  if (r->send_fd < 0) {
    snprintf(err, errlen,
             "tcp ring: rank %d could not connect to rank %d at %s within %d ms: %s%s%s. Check "
             "that the rank is running and that its address is reachable from this host "
             "(firewall, GRADSYNC_ADVERTISE_ADDR).",
             id(r, r->rank), id(r, r->right), r->right_addr, o->connect_timeout_ms,
             errtext(e, eb, sizeof eb), why[0] ? "; " : "", why);
    goto out_close_listener;
  }
  unsigned char hello[HELLO_BYTES], nonce_d[NONCE_BYTES];
  if (gs__random_bytes(nonce_d, sizeof nonce_d) != 0) {
    snprintf(err, errlen, "tcp ring: rank %d: no random bytes for the ring handshake (OpenSSL)",
             id(r, r->rank));
    status = GS__ERR_INTERNAL;
    goto out_close_listener;
  }
  put_hello(hello, r->rank, r->size, nonce_d);
  e = io_exact(r->send_fd, hello, sizeof hello, 1, deadline);
  if (e != 0) {
    snprintf(err, errlen, "tcp ring: rank %d lost its new connection to rank %d (%s): %s",
             id(r, r->rank), id(r, r->right), r->right_addr, errtext(e, eb, sizeof eb));
    goto out_close_listener;
  }

  int strays = 0, which = 0, proof_failed = 0;
  e = handshake(r, lfd, nonce_d, deadline, &strays, &which, &proof_failed);
  if (e != 0 && which == 1) {
    char extra[200] = "";
    if (strays)
      snprintf(extra, sizeof extra,
               " (%d other connection(s) that did not prove membership of this job were "
               "dropped: another job, a stale address, or a process without the ring key)",
               strays);
    snprintf(err, errlen,
             "tcp ring: rank %d: rank %d (%s) did not connect to %s within %d ms: %s%s. Check "
             "that rank's log, and that this host's port %u is reachable from it (firewall, "
             "GRADSYNC_ADVERTISE_ADDR).",
             id(r, r->rank), id(r, r->left), r->left_addr, my_addr, o->connect_timeout_ms,
             errtext(e, eb, sizeof eb), extra, (unsigned)my_port);
    goto out_close_listener;
  }
  if (e != 0) {
    if (proof_failed)
      snprintf(err, errlen,
               "tcp ring: rank %d connected to rank %d at %s but the peer did not prove "
               "membership of this job (its HMAC under the job's ring key is wrong): that "
               "address belongs to another process or job. Check GRADSYNC_ADVERTISE_ADDR and "
               "that every rank uses the same coordinator.",
               id(r, r->rank), id(r, r->right), r->right_addr);
    else
      snprintf(err, errlen,
               "tcp ring: rank %d connected to rank %d at %s but it did not confirm within %d "
               "ms: %s. If that address belongs to another process, check "
               "GRADSYNC_ADVERTISE_ADDR and the key prefix; else check that rank's log.",
               id(r, r->rank), id(r, r->right), r->right_addr, o->connect_timeout_ms,
               errtext(e, eb, sizeof eb));
    goto out_close_listener;
  }
  status = GS__OK;
out_close_listener:
  close(lfd);
  return status;
}

/* ---- failure: fail fast, name the first culprit ----------------------------
 *
 * A rank that gives up on a collective poisons its ring at once instead of
 * leaving its neighbours to time out: it shuts down the send side (the right
 * neighbour reads EOF) and writes a notice on the otherwise unused reverse
 * direction of the connection from its left, naming the rank that caused
 * the failure. The left neighbour reads it where it expects nothing but a
 * close, reports that culprit rather than "rank X closed", and passes the
 * notice on to its own left. (Nothing can travel right without corrupting
 * the data stream, so ranks to the right see a plain close.) */

enum { NOTE_LOST = 1, NOTE_TIMEOUT = 2, NOTE_ABORTED = 3, NOTE_REFUSED = 4 };
#define NOTE_BYTES 20

static void send_notice(ring *r, int origin, int culprit, int kind, int val) {
  if (r->poisoned) return;
  r->poisoned = 1;
  unsigned char note[NOTE_BYTES];
  put_u32(note, NOTICE_MAGIC);
  put_u32(note + 4, (uint32_t)origin);
  put_u32(note + 8, (uint32_t)culprit);
  put_u32(note + 12, (uint32_t)kind);
  put_u32(note + 16, (uint32_t)val);
  /* best effort: the reverse direction is empty, so a notice always fits
   * unless the left neighbour is already gone */
  if (r->recv_fd >= 0) {
    ssize_t k = send(r->recv_fd, note, sizeof note, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)k;
  }
  if (r->send_fd >= 0) (void)shutdown(r->send_fd, SHUT_WR);
}

/* This rank gives up because of culprit (kind: NOTE_*, val: errno or ms). */
static void poison(ring *r, int culprit, int kind, int val) {
  send_notice(r, r->rank, culprit, kind, val);
}

static int fail(ring *r, int status, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Records a collective's failure: the message goes to err and is kept for
 * every later call. The caller poisons the ring. */
static int fail(ring *r, int status, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->broken_msg, sizeof r->broken_msg, fmt, ap);
  va_end(ap);
  r->broken = status;
  snprintf(err, errlen, "%s", r->broken_msg);
  return status;
}

static int lost_peer(ring *r, int peer_is_right, int e, const char *what, char *err,
                     size_t errlen) {
  char eb[128];
  const char *why = e ? errtext(e, eb, sizeof eb) : "the peer closed the connection";
  int peer = peer_is_right ? r->right : r->left;
  poison(r, peer, NOTE_LOST, e);
  return fail(r, GS__ERR_DATA_PLANE, err, errlen,
              "tcp ring: rank %d lost its connection to rank %d (%s) during %s: %s. The peer "
              "process probably died, or gave up after an error of its own; check its log.",
              id(r, r->rank), id(r, peer), peer_is_right ? r->right_addr : r->left_addr, what, why);
}

static int sock_error(int fd) {
  int e = 0;
  socklen_t sl = sizeof e;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0) e = errno;
  return e;
}

/* The right neighbour's side of the connection became readable or closed:
 * a notice if it gave up, else it is gone. */
static int right_side_event(ring *r, const char *what, char *err, size_t errlen) {
  unsigned char note[NOTE_BYTES];
  ssize_t k = recv(r->send_fd, note, sizeof note, MSG_DONTWAIT | MSG_WAITALL);
  if (k != (ssize_t)sizeof note || get_u32(note) != NOTICE_MAGIC)
    return lost_peer(r, 1, k < 0 ? errno : sock_error(r->send_fd), what, err, errlen);
  int origin = (int)get_u32(note + 4), culprit = (int)get_u32(note + 8);
  int kind = (int)get_u32(note + 12), val = (int)get_u32(note + 16);
  char eb[128], why[400];
  send_notice(r, origin, culprit, kind, val); /* pass it on to the left */
  if (kind == NOTE_TIMEOUT && culprit == r->rank)
    snprintf(why, sizeof why,
             "rank %d timed out after %d ms waiting for this rank, which was itself still "
             "waiting for its peers. Look for the rank that stopped first (its neighbours' logs "
             "name it)",
             id(r, origin), val);
  else if (kind == NOTE_TIMEOUT)
    snprintf(why, sizeof why,
             "rank %d timed out after %d ms waiting for rank %d. Rank %d is stuck, stopped, or "
             "not running this collective; check its log (if it is just slow, raise "
             "GRADSYNC_DATA_TIMEOUT_MS)",
             id(r, origin), val, id(r, culprit), id(r, culprit));
  else if (kind == NOTE_REFUSED)
    snprintf(why, sizeof why,
             "rank %d refused the collective (its arguments disagree with the other ranks'); "
             "its log has the details",
             id(r, origin));
  else if (kind == NOTE_ABORTED)
    snprintf(why, sizeof why,
             "rank %d aborted its collectives (the job is being torn down); the first error is "
             "in the coordinator's and rank %d's logs",
             id(r, origin), id(r, origin));
  else
    snprintf(why, sizeof why,
             "rank %d lost its connection to rank %d: %s. Rank %d probably died; check its log",
             id(r, origin), id(r, culprit),
             val ? errtext(val, eb, sizeof eb) : "the peer closed the connection", id(r, culprit));
  return fail(r, GS__ERR_DATA_PLANE, err, errlen,
              "tcp ring: rank %d stopped %s on news from rank %d (%s): %s.", id(r, r->rank), what,
              id(r, r->right), r->right_addr, why);
}

/* The left neighbour closed or reset. If that is a cascade (it gave up
 * because our right neighbour failed first, and the news of that is
 * already waiting on the right side), name the first failure instead.
 * When this rank has sent the right all it needs, a plain close there may
 * be a neighbour that finished and left; only a notice or a reset (it
 * never read what we sent: it died or gave up) is news then. */
static int left_lost(ring *r, int e, int watching_right, const char *what, char *err,
                     size_t errlen) {
  struct pollfd pfd = {.fd = r->send_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&pfd, 1, 0) > 0 && pfd.revents) {
    if (watching_right) return right_side_event(r, what, err, errlen);
    unsigned char note[NOTE_BYTES];
    ssize_t k = recv(r->send_fd, note, sizeof note, MSG_DONTWAIT | MSG_PEEK);
    if (k == (ssize_t)sizeof note && get_u32(note) == NOTICE_MAGIC)
      return right_side_event(r, what, err, errlen);
    if (k < 0 && errno == ECONNRESET) return lost_peer(r, 1, ECONNRESET, what, err, errlen);
  }
  return lost_peer(r, 0, e, what, err, errlen);
}

static int aborted_status(ring *r, const char *what, char *err, size_t errlen) {
  poison(r, r->rank, NOTE_ABORTED, 0);
  snprintf(err, errlen,
           "tcp ring: rank %d: %s aborted (the job is being torn down after an error "
           "elsewhere)",
           id(r, r->rank), what);
  return GS__ERR_ABORTED;
}

/* ---- the stream engine ---------------------------------------------------- */

static int run_stream(ring *r, const stream *st, char *err, size_t errlen) {
  size_t send_total = 0, recv_total = 0;
  for (int i = 0; i < st->nsend; i++) send_total += st->send[i].len;
  for (int i = 0; i < st->nrecv; i++) recv_total += st->recv[i].len;
  size_t es = gs__dtype_size(st->dt);
  size_t sent = 0, recvd = 0, processed = 0, fwd_done = 0;
  int si = 0, ri = 0;
  size_t soff = 0, roff = 0;
  int64_t deadline = now_ms() + r->io_timeout_ms;
  int spin = send_total + recv_total <= SPIN_BYTES;

  while (sent < send_total || processed < recv_total) {
    if (atomic_load(&r->aborted)) return aborted_status(r, st->what, err, errlen);
    size_t allowed = st->pre + fwd_done < send_total ? st->pre + fwd_done : send_total;
    int want_send = sent < send_total, can_send = sent < allowed, want_recv = recvd < recv_total;
    int patient = processed < st->patient;
    struct pollfd pfd[3] = {
        {.fd = r->abort_fd, .events = POLLIN},
        /* The right neighbour only ever writes a failure notice to us. It
         * closes when it has all it needs from us, so watch it only while
         * it still does. */
        {.fd = want_send ? r->send_fd : -1,
         .events = POLLIN | POLLRDHUP | (can_send ? POLLOUT : 0)},
        {.fd = want_recv ? r->recv_fd : -1, .events = POLLIN | POLLRDHUP},
    };
    int pr = 0;
    if (spin) { /* see SPIN_NS */
      int64_t until = now_ns() + SPIN_NS;
      while ((pr = poll(pfd, 3, 0)) == 0 && now_ns() < until) sched_yield();
    }
    if (pr == 0) pr = poll(pfd, 3, patient ? -1 : ms_left(deadline));
    if (pr < 0) {
      if (errno == EINTR) continue;
      char eb[128];
      poison(r, r->rank, NOTE_LOST, 0);
      return fail(r, GS__ERR_INTERNAL, err, errlen, "tcp ring: rank %d: poll failed: %s",
                  id(r, r->rank), errtext(errno, eb, sizeof eb));
    }
    if (pr == 0) {
      if (patient || ms_left(deadline) > 0) continue;
      char who[2 * ADDR_MAX + 160];
      /* A stopped rank shows up as silence to its right and as a full
       * window to its left; name whichever this rank is waiting on. */
      if (want_recv && can_send && r->left == r->right)
        snprintf(who, sizeof who, "rank %d (%s) to send or accept data", id(r, r->left),
                 r->left_addr);
      else if (want_recv && can_send)
        snprintf(who, sizeof who, "rank %d (%s) to send data and for rank %d (%s) to accept data",
                 id(r, r->left), r->left_addr, id(r, r->right), r->right_addr);
      else if (want_recv || !can_send)
        snprintf(who, sizeof who, "rank %d (%s) to send data", id(r, r->left), r->left_addr);
      else
        snprintf(who, sizeof who, "rank %d (%s) to accept data", id(r, r->right), r->right_addr);
      poison(r, want_recv || !can_send ? r->left : r->right, NOTE_TIMEOUT, r->io_timeout_ms);
      return fail(r, GS__ERR_DATA_PLANE, err, errlen,
                  "tcp ring: rank %d timed out after %d ms during %s waiting for %s. That rank "
                  "is stuck, stopped, or not running this collective; if it is just slow, "
                  "raise GRADSYNC_DATA_TIMEOUT_MS.",
                  id(r, r->rank), r->io_timeout_ms, st->what, who);
    }
    if (pfd[0].revents) return aborted_status(r, st->what, err, errlen);
    /* Checked before the left side: when a rank dies its left neighbour
     * sees the reset (or a notice) here, and may see its own left neighbour
     * give up in the same wake-up; the first culprit is the one to name. */
    if (pfd[1].revents & (POLLIN | POLLERR | POLLHUP | POLLRDHUP))
      return right_side_event(r, st->what, err, errlen);
    int progress = 0;

    if (pfd[2].revents) {
      while (recvd < recv_total) {
        while (roff == st->recv[ri].len) ri++, roff = 0; /* skip empty pieces */
        const piece *pc = &st->recv[ri];
        int reduce = ri < st->nreduce;
        size_t seg_start = 0, want;
        char *dst;
        if (reduce) {
          seg_start = roff - roff % SEG_BYTES;
          size_t seg_end = pc->len - seg_start < SEG_BYTES ? pc->len : seg_start + SEG_BYTES;
          want = seg_end - roff;
          dst = r->scratch + (roff - seg_start);
        } else {
          want = pc->len - roff;
          dst = pc->p + roff;
        }
        ssize_t k = recv(r->recv_fd, dst, want, MSG_DONTWAIT);
        if (k == 0) return left_lost(r, 0, sent < send_total, st->what, err, errlen);
        if (k < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return left_lost(r, errno, sent < send_total, st->what, err, errlen);
        }
        progress = 1;
        roff += (size_t)k, recvd += (size_t)k;
        if (!reduce) {
          processed += (size_t)k;
          if (pc->fwd) fwd_done += (size_t)k;
        } else if ((size_t)k == want) { /* segment complete */
          size_t seg_len = roff - seg_start, fwd_len = seg_len, ne = seg_len / es;
          /* local (op) incoming, in this order whether in place or not:
           * the same bits as the packed path on the other ranks */
          const void *srcs[2] = {pc->local ? pc->local + seg_start : pc->p + seg_start, r->scratch};
          if (st->finish && ri >= st->fin_from) {
            if (pc->local) {
              gs__reduce_many(pc->p + seg_start, st->dt, srcs, 2, st->dt, ne, st->op, st->divisor,
                              st->factor);
            } else if (st->out) {
              size_t oes = gs__dtype_size(st->out_dt);
              gs__reduce_many(st->out + seg_start / es * oes, st->out_dt, srcs, 2, st->dt, ne,
                              st->op, st->divisor, st->factor);
              fwd_len = ne * oes;
            } else {
              gs__reduce_scaled(pc->p + seg_start, r->scratch, ne, st->dt, st->op, st->divisor,
                                st->factor);
            }
          } else if (pc->local) {
            gs__reduce_many(pc->p + seg_start, st->dt, srcs, 2, st->dt, ne, st->op, 1, 1.0);
          } else {
            gs__reduce(pc->p + seg_start, r->scratch, ne, st->dt, st->op);
          }
          processed += seg_len;
          if (pc->fwd) fwd_done += fwd_len;
        }
      }
    }

    /* Data just received may be sendable now: try without waiting for
     * another poll round; a full socket answers EAGAIN. */
    allowed = st->pre + fwd_done < send_total ? st->pre + fwd_done : send_total;
    while (sent < allowed) {
      while (soff == st->send[si].len) si++, soff = 0;
      const piece *pc = &st->send[si];
      size_t want = pc->len - soff;
      if (want > allowed - sent) want = allowed - sent;
      ssize_t k = send(r->send_fd, pc->p + soff, want, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return lost_peer(r, 1, errno, st->what, err, errlen);
      }
      progress = 1;
      soff += (size_t)k, sent += (size_t)k;
    }
    if (progress) deadline = now_ms() + r->io_timeout_ms;
  }
  return GS__OK;
}

/* Common entry checks: abort and an earlier failure win over everything. */
static int check_usable(ring *r, const char *what, char *err, size_t errlen) {
  if (atomic_load(&r->aborted)) return aborted_status(r, what, err, errlen);
  if (r->broken) {
    snprintf(err, errlen,
             "tcp ring: rank %d cannot run %s: an earlier collective failed and the ring is "
             "out of step (%s)",
             id(r, r->rank), what, r->broken_msg);
    return r->broken;
  }
  return GS__OK;
}

/* ---- collectives ---------------------------------------------------------- */

static size_t chunk_off(size_t count, int n, int c) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  return (size_t)c * base + ((size_t)c < extra ? (size_t)c : extra);
}

/* How many chunks of an allreduce of count elements of wes bytes carry
 * data: one up to ONE_CHUNK_BYTES, else one per rank. */
static int nchunks(const ring *r, size_t count, size_t wes) {
  return count * wes <= ONE_CHUNK_BYTES ? 1 : r->size;
}

/* Start of chunk c (0..size) when k chunks carry data: chunks k..size-1
 * are empty. */
static size_t cut(size_t count, int k, int c) {
  return chunk_off(count, k, c < k ? c : k);
}

static int mod(int a, int n) {
  return ((a % n) + n) % n;
}

static int is_half(gs__dtype dt) {
  return dt == GS__FLOAT16 || dt == GS__BFLOAT16;
}

/* The float32 workspace 16-bit types are reduced in: kept between calls,
 * grown to the largest count seen. */
static float *workspace(ring *r, size_t count, const char *what, char *err, size_t errlen) {
  if (count > r->work_cap) {
    float *w = realloc(r->work, count * sizeof *w);
    if (!w) {
      snprintf(err, errlen, "tcp ring: %s: out of memory for a %zu-byte float32 workspace", what,
               count * sizeof *w);
      return NULL;
    }
    r->work = w, r->work_cap = count;
  }
  return r->work;
}

static void half_to_f32(gs__dtype dt, float *w, const uint16_t *h, size_t n) {
  gs__convert(w, GS__FLOAT32, h, dt, n);
}

/* How a reduction is finished (see stream.finish). */
typedef struct finishing {
  int divisor;   /* 1 = none */
  double factor; /* 1.0 = none */
} finishing;

static finishing finishing_of(const ring *r, gs__reduce_op op, double postscale) {
  return (finishing){op == GS__AVERAGE ? r->size : 1, postscale};
}

static int det_reduce(ring *r, const char *what, char *buf, const size_t *offs, gs__dtype dt,
                      gs__reduce_op op, finishing fin, char *out, gs__dtype out_dt, char *err,
                      size_t errlen);
static int det_allreduce(ring *r, char *buf, gs__dtype dt, char *out, gs__dtype out_dt,
                         size_t count, gs__reduce_op op, finishing fin, char *err, size_t errlen);

/* Ring allreduce over count elements: the reduce-scatter runs on rs (in
 * rs_dt, reduced natively), the block this rank owns is finished as its
 * last step reduces it and written to ag (in ag_dt), and the allgather
 * runs on ag. rs == ag with equal dtypes is the plain in-place ring;
 * float16/bfloat16 reduce-scatter on a float32 workspace and allgather
 * their 16-bit result (half the bytes of a float32 allgather). */
static int ring_allreduce(ring *r, const char *what, char *rs, gs__dtype rs_dt, char *ag,
                          gs__dtype ag_dt, size_t count, gs__reduce_op op, finishing fin,
                          int patient, char *err, size_t errlen) {
  int n = r->size, np = 2 * (n - 1);
  size_t es = gs__dtype_size(rs_dt), aes = gs__dtype_size(ag_dt);
  int k = nchunks(r, count, es);
#define CUT(c) cut(count, k, c)
  /* recv piece j: reduce-scatter step j receives chunk rank-j-1 (reduced
   * into place); allgather step k = j-(n-1) receives final chunk rank-k.
   * All but the last are forwarded. */
  for (int j = 0; j < np; j++) {
    int c = j < n - 1 ? mod(r->rank - j - 1, n) : mod(r->rank - (j - (n - 1)), n);
    size_t off = CUT(c), end = CUT(c + 1);
    r->recv[j] = j < n - 1 ? (piece){rs + off * es, (end - off) * es, j < np - 1, NULL}
                           : (piece){ag + off * aes, (end - off) * aes, j < np - 1, NULL};
  }
  size_t off = CUT(r->rank), end = CUT(r->rank + 1);
  r->send[0] = (piece){rs + off * es, (end - off) * es, 0, NULL};
  for (int j = 1; j < np; j++) r->send[j] = r->recv[j - 1];
  /* the owned block, finished, as the allgather sends it */
  int own = mod(r->rank + 1, n);
  size_t oo = CUT(own), oe = CUT(own + 1);
#undef CUT
  r->send[n - 1] = (piece){ag + oo * aes, (oe - oo) * aes, 0, NULL};
  int in_place = rs == ag && rs_dt == ag_dt;
  stream st = {.what = what,
               .send = r->send,
               .nsend = np,
               .pre = r->send[0].len,
               .recv = r->recv,
               .nrecv = np,
               .nreduce = n - 1,
               .dt = rs_dt,
               .op = op,
               .finish = !in_place || fin.divisor > 1 || fin.factor != 1.0,
               .fin_from = n - 2,
               .divisor = fin.divisor,
               .factor = fin.factor,
               .out = in_place ? NULL : ag + oo * aes,
               .out_dt = ag_dt};
  if (patient) {
    /* every rank has entered once the first finished chunk is in: the
     * owned block's last reduce-scatter step, or an allgather piece (the
     * first that is not empty: count >= 1, so one of them is not) */
    for (int j = 0; j < np; j++) {
      st.patient += r->recv[j].len;
      if (j >= n - 2 && r->recv[j].len) break;
    }
  }
  return run_stream(r, &st, err, errlen);
}

/* Allreduce with the finish (the average's division, the postscale) and
 * 16-bit rounding done on each owned block in the ring's last
 * reduce-scatter step. */
static int allreduce(ring *r, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                     double postscale, char *err, size_t errlen) {
  int rc = check_usable(r, "allreduce", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("tcp ring", "allreduce", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (count > SIZE_MAX / 8) {
    snprintf(err, errlen, "tcp ring: allreduce: count %zu is too large", count);
    return GS__ERR_INVALID_ARG;
  }
  if (count == 0) return GS__OK;
  if (!buf) {
    snprintf(err, errlen, "tcp ring: allreduce: buf is NULL with count %zu", count);
    return GS__ERR_INVALID_ARG;
  }
  if (r->size == 1) { /* AVERAGE over 1 rank: identity; the postscale still applies */
    gs__scale(buf, count, dt, postscale);
    return GS__OK;
  }
  gs__reduce_op rop = op == GS__AVERAGE ? GS__SUM : op;
  finishing fin = finishing_of(r, op, postscale);
  if (r->deterministic) return det_allreduce(r, buf, dt, buf, dt, count, rop, fin, err, errlen);
  if (!is_half(dt))
    return ring_allreduce(r, "allreduce", buf, dt, buf, dt, count, rop, fin, 0, err, errlen);
  /* 16-bit floats: reduce in float32 and round once at the end, so the
   * result does not depend on how many partial sums were rounded. */
  float *w = workspace(r, count, "allreduce", err, errlen);
  if (!w) return GS__ERR_NO_MEMORY;
  half_to_f32(dt, w, buf, count);
  return ring_allreduce(r, "allreduce", (char *)w, GS__FLOAT32, buf, dt, count, rop, fin, 0, err,
                        errlen);
}

static int ring_allreduce_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt,
                             gs__reduce_op op, char *err, size_t errlen) {
  return allreduce((ring *)b, buf, count, dt, op, 1.0, err, errlen);
}

static int ring_allreduce_scaled_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt,
                                    gs__reduce_op op, double postscale, char *err, size_t errlen) {
  return allreduce((ring *)b, buf, count, dt, op, postscale, err, errlen);
}

/* ---- segmented allreduce -------------------------------------------------- */

/* The tensors of a fused allreduce as the ring sees them: segment k covers
 * elements start[k]..start[k+1] of the collective; the ring's buffer there
 * is at[k] (the result: the member's recv buffer, or fill) and this rank's
 * contribution at local[k] (NULL: at[k] already holds it). */
typedef struct seg_map {
  size_t nseg, es;
  const size_t *start;
  char *const *at;
  const char *const *local;
} seg_map;

/* Appends the pieces of elements [lo, hi) to ps (at most one per segment
 * the range touches); raw: pieces point at this rank's contribution (the
 * first send of the reduce-scatter) rather than the result. */
static void add_pieces(const seg_map *m, size_t lo, size_t hi, int fwd, int raw, piece *ps,
                       int *np) {
  size_t k = 0, a = 0, b = m->nseg;
  while (a < b) { /* the last segment starting at or before lo */
    size_t mid = (a + b) / 2;
    if (m->start[mid + 1] <= lo)
      a = mid + 1;
    else
      b = mid;
  }
  for (k = a; k < m->nseg && m->start[k] < hi; k++) {
    size_t from = lo > m->start[k] ? lo : m->start[k];
    size_t to = hi < m->start[k + 1] ? hi : m->start[k + 1];
    if (to <= from) continue;
    size_t off = (from - m->start[k]) * m->es;
    const char *loc = m->local[k] ? m->local[k] + off : NULL;
    ps[(*np)++] = raw && loc ? (piece){(char *)(uintptr_t)loc, (to - from) * m->es, fwd, NULL}
                             : (piece){m->at[k] + off, (to - from) * m->es, fwd, loc};
  }
}

/* Grows the segmented allreduce's piece arrays for a map of nseg
 * segments: a chunk boundary splits at most one segment, so each stream
 * has at most 2 * (nseg + size) pieces. */
static int seg_pieces(ring *r, size_t nseg, char *err, size_t errlen) {
  size_t need = 3 * (nseg + (size_t)r->size) + 2;
  if (need <= r->seg_cap) return GS__OK;
  piece *s = realloc(r->seg_send, need * sizeof *s);
  if (s) r->seg_send = s;
  piece *v = s ? realloc(r->seg_recv, need * sizeof *v) : NULL;
  if (!s || !v) {
    snprintf(err, errlen, "tcp ring: allreduce: out of memory for %zu segments", nseg);
    return GS__ERR_NO_MEMORY;
  }
  r->seg_recv = v, r->seg_cap = need;
  return GS__OK;
}

/* The ring allreduce of ring_allreduce over a seg_map instead of one
 * buffer: the same chunks, the same bytes on the wire in the same order
 * and the same arithmetic (local (op) incoming), so a rank may run this
 * while its neighbours run the packed path. */
static int ring_allreduce_map(ring *r, const seg_map *m, size_t count, gs__reduce_op op,
                              finishing fin, gs__dtype dt, char *err, size_t errlen) {
  int n = r->size, nch = 2 * (n - 1), k = nchunks(r, count, m->es);
  if (seg_pieces(r, m->nseg, err, errlen)) return GS__ERR_NO_MEMORY;
  piece *sp = r->seg_send, *rp = r->seg_recv;
  int ns = 0, nr = 0, nreduce = 0, fin_from = 0;
  /* recv: as ring_allreduce, chunk by chunk, each split at the segments */
  for (int j = 0; j < nch; j++) {
    int c = j < n - 1 ? mod(r->rank - j - 1, n) : mod(r->rank - (j - (n - 1)), n);
    if (j == n - 2) fin_from = nr;
    add_pieces(m, cut(count, k, c), cut(count, k, c + 1), j < nch - 1, 0, rp, &nr);
    if (j == n - 2) nreduce = nr;
  }
  /* send: this rank's own chunk as contributed, then every forwarded recv
   * piece (the owned block finished in place at its result) */
  add_pieces(m, cut(count, k, r->rank), cut(count, k, r->rank + 1), 0, 1, sp, &ns);
  size_t pre = 0;
  for (int i = 0; i < ns; i++) pre += sp[i].len;
  for (int i = 0; i < nr; i++)
    if (rp[i].fwd) sp[ns++] = (piece){rp[i].p, rp[i].len, 0, NULL};
  stream st = {.what = "allreduce",
               .send = sp,
               .nsend = ns,
               .pre = pre,
               .recv = rp,
               .nrecv = nr,
               .nreduce = nreduce,
               .dt = dt,
               .op = op,
               .finish = 1,
               .fin_from = fin_from,
               .divisor = fin.divisor,
               .factor = fin.factor};
  return run_stream(r, &st, err, errlen);
}

/* The 16-bit ring of allreduce() with the allgather over a seg_map: the
 * reduce-scatter runs on the float32 workspace w (converted straight from
 * the members), the owned block is finished and rounded into own_out (its
 * 16-bit result, contiguous, sent as the allgather's first piece) and the
 * allgather lands in the map (dt). The same pieces on the wire in the same
 * order and the same arithmetic as the packed path; the caller copies
 * own_out into the map afterwards. */
static int ring_allreduce_half_map(ring *r, float *w, const seg_map *m, char *own_out, size_t count,
                                   gs__reduce_op op, finishing fin, gs__dtype dt, char *err,
                                   size_t errlen) {
  int n = r->size, nch = 2 * (n - 1), k = nchunks(r, count, sizeof *w);
  if (seg_pieces(r, m->nseg, err, errlen)) return GS__ERR_NO_MEMORY;
  piece *sp = r->seg_send, *rp = r->seg_recv;
  int ns = 0, nr = 0;
  size_t fes = sizeof *w;
  for (int j = 0; j < n - 1; j++) { /* reduce-scatter: one workspace piece per step */
    int c = mod(r->rank - j - 1, n);
    size_t off = cut(count, k, c), end = cut(count, k, c + 1);
    rp[nr++] = (piece){(char *)(w + off), (end - off) * fes, 1, NULL};
  }
  for (int j = n - 1; j < nch; j++) { /* allgather: into the map */
    int c = mod(r->rank - (j - (n - 1)), n);
    add_pieces(m, cut(count, k, c), cut(count, k, c + 1), j < nch - 1, 0, rp, &nr);
  }
  size_t off = cut(count, k, r->rank), end = cut(count, k, r->rank + 1);
  sp[ns++] = (piece){(char *)(w + off), (end - off) * fes, 0, NULL};
  for (int j = 0; j < n - 2; j++) sp[ns++] = (piece){rp[j].p, rp[j].len, 0, NULL};
  int own = mod(r->rank + 1, n);
  size_t oo = cut(count, k, own), oe = cut(count, k, own + 1);
  sp[ns++] = (piece){own_out, (oe - oo) * m->es, 0, NULL};
  for (int i = n - 1; i < nr; i++)
    if (rp[i].fwd) sp[ns++] = (piece){rp[i].p, rp[i].len, 0, NULL};
  stream st = {.what = "allreduce",
               .send = sp,
               .nsend = ns,
               .pre = sp[0].len,
               .recv = rp,
               .nrecv = nr,
               .nreduce = n - 1,
               .dt = GS__FLOAT32,
               .op = op,
               .finish = 1,
               .fin_from = n - 2,
               .divisor = fin.divisor,
               .factor = fin.factor,
               .out = own_out,
               .out_dt = dt};
  return run_stream(r, &st, err, errlen);
}

/* Copies elements [lo, hi) of the collective from the contiguous from
 * into the map. */
static void map_write(const seg_map *m, size_t lo, size_t hi, const char *from) {
  for (size_t k = 0; k < m->nseg && lo < hi; k++) {
    size_t a = lo > m->start[k] ? lo : m->start[k];
    size_t e = hi < m->start[k + 1] ? hi : m->start[k + 1];
    if (e > a)
      memcpy(m->at[k] + (a - m->start[k]) * m->es, from + (a - lo) * m->es, (e - a) * m->es);
  }
}

static int det_allreduce_map(ring *r, const seg_map *cm, size_t count, gs__reduce_op op,
                             finishing fin, gs__dtype dt, char *err, size_t errlen);

/* allreduce_segs: the ring reads each member's send buffer and writes its
 * recv buffer, so a fused allreduce needs no pack or unpack pass. Padding
 * and the members of a rank that joined (NULL source and destination)
 * live in zeroed fill from the fusion staging. 16-bit floats are
 * converted from the members into the float32 workspace and allgathered
 * into them (ring_allreduce_half_map); in deterministic mode every dtype
 * is exchanged, reduced and gathered over the members (det_allreduce_map). */
static int ring_allreduce_segs_vt(gs__backend *b, const gs__seg *segs, size_t nseg, gs__dtype dt,
                                  gs__reduce_op op, double postscale, char *err, size_t errlen) {
  ring *r = (ring *)b;
  int rc = check_usable(r, "allreduce", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("tcp ring", "allreduce", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (nseg && !segs) {
    snprintf(err, errlen, "tcp ring: allreduce: segs is NULL with %zu segments", nseg);
    return GS__ERR_INVALID_ARG;
  }
  size_t es = gs__dtype_size(dt), count = 0, fill_bytes = 0;
  for (size_t k = 0; k < nseg; k++) {
    if (segs[k].count > SIZE_MAX / 8 - count) {
      snprintf(err, errlen, "tcp ring: allreduce: %zu segments of too many elements", nseg);
      return GS__ERR_INVALID_ARG;
    }
    count += segs[k].count;
    if (!segs[k].dst || segs[k].count * es < SEG_SMALL_BYTES) fill_bytes += segs[k].count * es;
  }
  if (count == 0) return GS__OK;
  gs__reduce_op rop = op == GS__AVERAGE ? GS__SUM : op;
  finishing fin = finishing_of(r, op, postscale);
  if (r->size == 1) { /* the finish alone */
    for (size_t k = 0; k < nseg; k++) {
      const gs__seg *sg = &segs[k];
      if (!sg->dst || !sg->count) continue;
      if (!sg->src) {
        memset(sg->dst, 0, sg->count * es);
        continue;
      }
      const void *src = sg->src;
      gs__reduce_many(sg->dst, dt, &src, 1, dt, sg->count, rop, fin.divisor, fin.factor);
    }
    return GS__OK;
  }
  /* 16-bit floats: the members converted straight into the float32
   * workspace; the owned block's 16-bit result in own_out after fill */
  int half = is_half(dt) && !r->deterministic, own = mod(r->rank + 1, r->size);
  int kc = nchunks(r, count, sizeof(float)); /* as ring_allreduce_half_map cuts */
  size_t oo = cut(count, kc, own), oe = cut(count, kc, own + 1);
  float *w = half ? workspace(r, count, "allreduce", err, errlen) : NULL;
  if (half && !w) return GS__ERR_NO_MEMORY;
  size_t staging = fill_bytes + (half ? (oe - oo) * es + 1 : 0);
  size_t *start = malloc((nseg + 1) * sizeof *start);
  char **at = malloc(nseg * sizeof *at);
  const char **local = malloc(nseg * sizeof *local);
  char *fill = NULL;
  if (staging && !(fill = gs__host_staging(&r->fusion, &r->fusion_cap, staging, err, errlen)))
    rc = GS__ERR_NO_MEMORY;
  if (!start || !at || !local) {
    snprintf(err, errlen, "tcp ring: allreduce: out of memory for %zu segments", nseg);
    rc = GS__ERR_NO_MEMORY;
  }
  if (rc != GS__OK) goto out_free;
  if (half) { /* the packed path's conversion, member by member */
    size_t el = 0;
    for (size_t k = 0; k < nseg; k++) {
      if (segs[k].src)
        half_to_f32(dt, w + el, segs[k].src, segs[k].count);
      else
        memset(w + el, 0, segs[k].count * sizeof *w);
      el += segs[k].count;
    }
  }
  /* The ring's view: large members in place; runs of consecutive small
   * members (and padding) packed into fill, where a piece of a few bytes
   * would cost more in syscalls and kernel calls than its copy; a large
   * member whose result is not wanted reduced in fill. 16-bit floats: the
   * allgather's view (their contributions are in the workspace). */
  size_t used = 0, at_el = 0, nmap = 0;
  int in_run = 0;
  for (size_t k = 0; k < nseg; k++) {
    const gs__seg *sg = &segs[k];
    size_t bytes = sg->count * es;
    if (bytes < SEG_SMALL_BYTES) {
      if (!in_run) start[nmap] = at_el, at[nmap] = fill + used, local[nmap++] = NULL;
      in_run = 1;
      if (!half && sg->src)
        memcpy(fill + used, sg->src, bytes);
      else if (!half && bytes)
        memset(fill + used, 0, bytes);
      used += bytes;
    } else {
      in_run = 0;
      start[nmap] = at_el;
      at[nmap] = sg->dst;
      local[nmap] = sg->src != sg->dst ? sg->src : NULL;
      if (!sg->dst) { /* not wanted: the ring still needs it to pass partial results on */
        at[nmap] = fill + used;
        used += bytes;
      }
      if (half) {
        local[nmap] = NULL;
      } else if (!sg->src) { /* zeros (0.0 in every dtype) contributed in place */
        memset(at[nmap], 0, bytes);
        local[nmap] = NULL;
      }
      nmap++;
    }
    at_el += sg->count;
  }
  start[nmap] = at_el;
  seg_map m = {nmap, es, start, at, local};
  if (half) {
    rc = ring_allreduce_half_map(r, w, &m, fill + fill_bytes, count, rop, fin, dt, err, errlen);
    if (rc == GS__OK) map_write(&m, oo, oe, fill + fill_bytes);
  } else if (r->deterministic) {
    rc = det_allreduce_map(r, &m, count, rop, fin, dt, err, errlen);
  } else {
    rc = ring_allreduce_map(r, &m, count, rop, fin, dt, err, errlen);
  }
  if (rc == GS__OK) { /* the small members' results out of fill */
    used = 0;
    for (size_t k = 0; k < nseg; k++) {
      size_t bytes = segs[k].count * es;
      if (bytes < SEG_SMALL_BYTES && segs[k].dst) memcpy(segs[k].dst, fill + used, bytes);
      if (bytes < SEG_SMALL_BYTES || !segs[k].dst) used += bytes;
    }
  }
out_free:
  free(start);
  free(at);
  free(local);
  return rc;
}

int gs__tcp_ring_allreduce_into(gs__backend *b, void *work, gs__dtype work_dt, void *out,
                                gs__dtype out_dt, size_t count, gs__reduce_op op, int divisor,
                                double factor, char *err, size_t errlen) {
  if (!b || b->v != &k_vtbl) {
    snprintf(err, errlen, "tcp ring: allreduce_into called on a %s backend (a gradsync bug)",
             b ? b->v->name : "NULL");
    return GS__ERR_INTERNAL;
  }
  ring *r = (ring *)b;
  int rc = check_usable(r, "allreduce", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("tcp ring", "allreduce", work_dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (op == GS__AVERAGE || divisor < 1 ||
      !(work_dt == out_dt || (work_dt == GS__FLOAT32 && is_half(out_dt))) ||
      (work == out && work_dt != out_dt) || count > SIZE_MAX / 8 || (count && (!work || !out))) {
    snprintf(err, errlen,
             "tcp ring: allreduce_into: invalid arguments (op %s, divisor %d, %s into %s, count "
             "%zu; a gradsync bug)",
             gs__reduce_op_name(op), divisor, gs__dtype_name(work_dt), gs__dtype_name(out_dt),
             count);
    return GS__ERR_INTERNAL;
  }
  if (count == 0) return GS__OK;
  finishing fin = {divisor, factor};
  if (r->size == 1) { /* nothing to exchange: the finish alone */
    const void *src = work;
    gs__reduce_many(out, out_dt, &src, 1, work_dt, count, op, divisor, factor);
    return GS__OK;
  }
  if (r->deterministic)
    return det_allreduce(r, work, work_dt, out, out_dt, count, op, fin, err, errlen);
  return ring_allreduce(r, "allreduce", work, work_dt, out, out_dt, count, op, fin, 0, err, errlen);
}

/* The reduce-scatter half of the ring, with rank r ending up owning block r
 * (elements offs[r]..offs[r+1]): step j sends block rank-1-j and receives
 * block rank-2-j. */
static int ring_reducescatter(ring *r, char *buf, const size_t *offs, gs__dtype dt,
                              gs__reduce_op op, finishing fin, char *out, gs__dtype out_dt,
                              char *err, size_t errlen) {
  int n = r->size;
  size_t es = gs__dtype_size(dt);
  for (int j = 0; j < n - 1; j++) {
    int c = mod(r->rank - 2 - j, n);
    r->recv[j] = (piece){buf + offs[c] * es, (offs[c + 1] - offs[c]) * es, j < n - 2, NULL};
  }
  int c0 = mod(r->rank - 1, n);
  r->send[0] = (piece){buf + offs[c0] * es, (offs[c0 + 1] - offs[c0]) * es, 0, NULL};
  for (int j = 1; j < n - 1; j++) r->send[j] = r->recv[j - 1];
  stream st = {.what = "reducescatter",
               .send = r->send,
               .nsend = n - 1,
               .pre = r->send[0].len,
               .recv = r->recv,
               .nrecv = n - 1,
               .nreduce = n - 1,
               .dt = dt,
               .op = op,
               .finish = out || fin.divisor > 1 || fin.factor != 1.0,
               .fin_from = n - 2,
               .divisor = fin.divisor,
               .factor = fin.factor,
               .out = out,
               .out_dt = out_dt};
  return run_stream(r, &st, err, errlen);
}

static int ring_reducescatter_vt(gs__backend *b, void *buf, const size_t *counts, gs__dtype dt,
                                 gs__reduce_op op, char *err, size_t errlen) {
  ring *r = (ring *)b;
  int rc = check_usable(r, "reducescatter", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("tcp ring", "reducescatter", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (!counts) {
    snprintf(err, errlen, "tcp ring: reducescatter: counts is NULL");
    return GS__ERR_INVALID_ARG;
  }
  int n = r->size;
  size_t *offs = r->offs, total = 0;
  for (int q = 0; q < n; q++) {
    if (counts[q] > SIZE_MAX / 8 - total) {
      snprintf(err, errlen, "tcp ring: reducescatter: the block counts are too large");
      return GS__ERR_INVALID_ARG;
    }
    offs[q] = total;
    total += counts[q];
  }
  offs[n] = total;
  if (total == 0 || n == 1) return GS__OK; /* AVERAGE over 1 rank: identity */
  if (!buf) {
    snprintf(err, errlen, "tcp ring: reducescatter: buf is NULL with %zu elements", total);
    return GS__ERR_INVALID_ARG;
  }
  gs__reduce_op rop = op == GS__AVERAGE ? GS__SUM : op;
  finishing fin = finishing_of(r, op, 1.0);
  size_t es = gs__dtype_size(dt);
  char *own = (char *)buf + offs[r->rank] * es;
  if (r->deterministic)
    return det_reduce(r, "reducescatter", buf, offs, dt, rop, fin, buf, dt, err, errlen);
  if (!is_half(dt)) return ring_reducescatter(r, buf, offs, dt, rop, fin, NULL, dt, err, errlen);
  float *w = workspace(r, total, "reducescatter", err, errlen);
  if (!w) return GS__ERR_NO_MEMORY;
  half_to_f32(dt, w, buf, total);
  return ring_reducescatter(r, (char *)w, offs, GS__FLOAT32, rop, fin, own, dt, err, errlen);
}

/* Allgatherv; what names the collective the caller runs, for messages. */
static int gather(ring *r, const char *what, const void *send, void *recv, const size_t *bytes,
                  char *err, size_t errlen) {
  int rc = check_usable(r, what, err, errlen);
  if (rc != GS__OK) return rc;
  int n = r->size;
  if (!bytes) {
    snprintf(err, errlen, "tcp ring: %s: bytes is NULL", what);
    return GS__ERR_INVALID_ARG;
  }
  size_t *offs = r->offs, total = 0;
  for (int i = 0; i < n; i++) {
    if (bytes[i] > SIZE_MAX - total) {
      snprintf(err, errlen, "tcp ring: %s: the block sizes overflow size_t", what);
      return GS__ERR_INVALID_ARG;
    }
    offs[i] = total;
    total += bytes[i];
  }
  offs[n] = total;
  if (total == 0) return GS__OK;
  if (!recv || (bytes[r->rank] && !send)) {
    snprintf(err, errlen, "tcp ring: %s: %s is NULL with %zu bytes to move", what,
             recv ? "send" : "recv", recv ? bytes[r->rank] : total);
    return GS__ERR_INVALID_ARG;
  }
  char *out = recv;
  size_t own_off = offs[r->rank];
  if (bytes[r->rank] && (const char *)send != out + own_off)
    memmove(out + own_off, send, bytes[r->rank]);
  if (n == 1) return GS__OK;

  /* step j receives block rank-j-1 and forwards it next step */
  for (int j = 0; j < n - 1; j++) {
    int c = mod(r->rank - j - 1, n);
    r->recv[j] = (piece){out + offs[c], bytes[c], j < n - 2, NULL};
  }
  r->send[0] = (piece){out + own_off, bytes[r->rank], 0, NULL};
  for (int j = 1; j < n - 1; j++) r->send[j] = r->recv[j - 1];
  stream st = {.what = what,
               .send = r->send,
               .nsend = n - 1,
               .pre = r->send[0].len,
               .recv = r->recv,
               .nrecv = n - 1,
               .nreduce = 0,
               .dt = GS__UINT8,
               .op = GS__SUM};
  return run_stream(r, &st, err, errlen);
}

static int ring_allgatherv_vt(gs__backend *b, const void *send, void *recv, const size_t *bytes,
                              char *err, size_t errlen) {
  return gather((ring *)b, "allgatherv", send, recv, bytes, err, errlen);
}

/* Bytes this rank relays in an exchange (below) with byte matrix m
 * (m[o*n+d]: bytes rank o sends rank d): every block that passes through
 * on its way further right. */
static size_t relay_size(const ring *r, const uint64_t *m) {
  int n = r->size, me = r->rank;
  size_t bytes = 0;
  for (int g = 0; g < n - 1; g++) {
    int o = mod(me - 1 - g, n);
    for (int k = 1; k < n - 1 - g; k++)
      bytes += (size_t)m[(size_t)o * (size_t)n + (size_t)mod(me + k, n)];
  }
  return bytes;
}

/* A seg_map's contribution, elements offs[d]..offs[d+1] for rank d (the
 * deterministic mode's exchange over the members' own buffers). */
typedef struct seg_send {
  const seg_map *map;
  const size_t *offs;
} seg_send;

/* The personalized exchange over the ring (see alltoallv below), sizes
 * known to every rank: this rank's block for rank d is at send + soff[d]
 * (m[me*n+d] bytes), or when from is set the pieces of its map's elements
 * from->offs[d]..from->offs[d+1]; the block from rank o lands at
 * recv + roff[o]; this rank's own block is not moved. relay holds
 * relay_size(m) bytes; rp has room for n*n pieces, sp for n*n more than the
 * map has segments. */
static int exchange(ring *r, const char *what, const void *send, const size_t *soff,
                    const seg_send *from, void *recv, const size_t *roff, const uint64_t *m,
                    char *relay, piece *sp, piece *rp, char *err, size_t errlen) {
  int n = r->size, me = r->rank, ns = 0, nr = 0;
  size_t pre = 0, rel = 0;
  for (int k = 1; k < n; k++) {
    int d = mod(me + k, n);
    size_t len = (size_t)m[(size_t)me * (size_t)n + (size_t)d];
    if (from)
      add_pieces(from->map, from->offs[d], from->offs[d + 1], 0, 1, sp, &ns);
    else
      sp[ns++] = (piece){(char *)send + soff[d], len, 0, NULL};
    pre += len;
  }
  for (int g = 0; g < n - 1; g++) {
    int o = mod(me - 1 - g, n);
    for (int k = 0; k < n - 1 - g; k++) {
      size_t len = (size_t)m[(size_t)o * (size_t)n + (size_t)mod(me + k, n)];
      if (k == 0) {
        rp[nr++] = (piece){(char *)recv + roff[o], len, 0, NULL};
      } else {
        rp[nr++] = (piece){relay + rel, len, 1, NULL};
        sp[ns++] = rp[nr - 1];
        rel += len;
      }
    }
  }
  stream st = {.what = what,
               .send = sp,
               .nsend = ns,
               .pre = pre,
               .recv = rp,
               .nrecv = nr,
               .nreduce = 0,
               .dt = GS__UINT8,
               .op = GS__SUM};
  return run_stream(r, &st, err, errlen);
}

/* ---- deterministic mode ----------------------------------------------------
 *
 * The ring reduces block c in the order c, c+1, ..., c-1 (mod n), and which
 * block an element falls in depends on the buffer's size, so on how tensors
 * were fused: float sums then differ in the last bits between runs. In
 * deterministic mode every element is reduced in rank order 0, 1, ..., n-1:
 * each rank sends its contribution to block d straight to rank d (the
 * exchange above: the block travels (d - o) mod n hops), rank d reduces
 * its block over the n contributions in rank order (gs__reduce_many,
 * 16-bit types accumulated in float32 and rounded once) and finishes it,
 * then an allgather spreads the blocks. At n = 2 this moves as many bytes
 * as the ring; at n ranks the first phase moves (n-1)/2 buffers per link
 * instead of (n-1)/n. */

/* Grows the deterministic mode's scratch to bytes. */
static char *det_scratch(ring *r, size_t bytes, const char *what, char *err, size_t errlen) {
  if (bytes > r->det_cap) {
    char *p = realloc(r->det, bytes);
    if (!p) {
      snprintf(err, errlen,
               "tcp ring: %s: out of memory for %zu bytes of deterministic-mode "
               "scratch",
               what, bytes);
      return NULL;
    }
    r->det = p, r->det_cap = bytes;
  }
  return r->det;
}

/* Reduces buf (elements offs[0..n], the same on every rank) so that this
 * rank's block offs[rank]..offs[rank+1] of out (out_dt: dt, or a 16-bit
 * float for a float32 buf) holds the finished reduction over ranks in rank
 * order; the other blocks are left as they were. */
static int det_reduce(ring *r, const char *what, char *buf, const size_t *offs, gs__dtype dt,
                      gs__reduce_op op, finishing fin, char *out, gs__dtype out_dt, char *err,
                      size_t errlen) {
  int n = r->size, me = r->rank, status = GS__ERR_NO_MEMORY;
  size_t es = gs__dtype_size(dt), nown = offs[me + 1] - offs[me], ob = nown * es;
  uint64_t *m = malloc((size_t)n * (size_t)n * sizeof *m);
  size_t *soff = malloc((size_t)n * sizeof *soff), *roff = malloc((size_t)n * sizeof *roff);
  piece *sp = malloc((size_t)n * (size_t)n * sizeof *sp),
        *rp = malloc((size_t)n * (size_t)n * sizeof *rp);
  const void **srcs = malloc((size_t)n * sizeof *srcs);
  if (!m || !soff || !roff || !sp || !rp || !srcs) {
    snprintf(err, errlen, "tcp ring: %s: out of memory", what);
    goto out_free;
  }
  for (int o = 0; o < n; o++)
    for (int d = 0; d < n; d++)
      m[(size_t)o * (size_t)n + (size_t)d] = o == d ? 0 : (offs[d + 1] - offs[d]) * es;
  for (int q = 0; q < n; q++) {
    soff[q] = offs[q] * es;
    roff[q] = (size_t)(q < me ? q : q > me ? q - 1 : 0) * ob; /* no slot for this rank */
  }
  size_t tmp_bytes = (size_t)(n - 1) * ob, relay = relay_size(r, m);
  char *tmp = det_scratch(r, tmp_bytes + relay + 1, what, err, errlen);
  if (!tmp) goto out_free;
  status = exchange(r, what, buf, soff, NULL, tmp, roff, m, tmp + tmp_bytes, sp, rp, err, errlen);
  if (status != GS__OK) goto out_free;
  char *own = buf + offs[me] * es;
  for (int q = 0; q < n; q++) srcs[q] = q == me ? own : tmp + roff[q];
  gs__reduce_many(out + offs[me] * gs__dtype_size(out_dt), out_dt, srcs, (size_t)n, dt, nown, op,
                  fin.divisor, fin.factor);
out_free:
  free(m);
  free(soff);
  free(roff);
  free(sp);
  free(rp);
  free(srcs);
  return status;
}

/* buf (dt) is reduced in rank order, finished into out (out_dt; may be
 * buf when the dtypes are equal) and gathered there. */
static int det_allreduce(ring *r, char *buf, gs__dtype dt, char *out, gs__dtype out_dt,
                         size_t count, gs__reduce_op op, finishing fin, char *err, size_t errlen) {
  int n = r->size;
  size_t es = gs__dtype_size(out_dt);
  size_t *offs = malloc(((size_t)n + 1) * sizeof *offs), *bytes = malloc((size_t)n * sizeof *bytes);
  int status = GS__ERR_NO_MEMORY;
  if (!offs || !bytes) {
    snprintf(err, errlen, "tcp ring: allreduce: out of memory");
    goto out_free;
  }
  for (int c = 0; c <= n; c++) offs[c] = chunk_off(count, n, c);
  for (int c = 0; c < n; c++) bytes[c] = (offs[c + 1] - offs[c]) * es;
  status =
      det_reduce(r, "allreduce (deterministic)", buf, offs, dt, op, fin, out, out_dt, err, errlen);
  if (status == GS__OK)
    status =
        gather(r, "allreduce (deterministic)", out + offs[r->rank] * es, out, bytes, err, errlen);
out_free:
  free(offs);
  free(bytes);
  return status;
}

/* The gather of det_allreduce over a seg_map: this rank's block (elements
 * offs[rank]..offs[rank+1]) is sent from the map, the others land in it. */
static int gather_map(ring *r, const char *what, const seg_map *m, const size_t *offs, char *err,
                      size_t errlen) {
  int n = r->size, ns = 0, nr = 0;
  if (seg_pieces(r, m->nseg, err, errlen)) return GS__ERR_NO_MEMORY;
  piece *sp = r->seg_send, *rp = r->seg_recv;
  for (int j = 0; j < n - 1; j++) {
    int c = mod(r->rank - j - 1, n);
    add_pieces(m, offs[c], offs[c + 1], j < n - 2, 0, rp, &nr);
  }
  add_pieces(m, offs[r->rank], offs[r->rank + 1], 0, 0, sp, &ns);
  size_t pre = 0;
  for (int i = 0; i < ns; i++) pre += sp[i].len;
  for (int i = 0; i < nr; i++)
    if (rp[i].fwd) sp[ns++] = (piece){rp[i].p, rp[i].len, 0, NULL};
  stream st = {.what = what,
               .send = sp,
               .nsend = ns,
               .pre = pre,
               .recv = rp,
               .nrecv = nr,
               .nreduce = 0,
               .dt = GS__UINT8,
               .op = GS__SUM};
  return run_stream(r, &st, err, errlen);
}

/* det_allreduce over a seg_map (the segmented allreduce in deterministic
 * mode): the contributions are sent from the members, this rank's block is
 * reduced in rank order straight into them (elementwise, so cut at the
 * members' boundaries it gives the packed path's bits) and the gather
 * lands in them. The same bytes on the wire as det_allreduce. */
static int det_allreduce_map(ring *r, const seg_map *cm, size_t count, gs__reduce_op op,
                             finishing fin, gs__dtype dt, char *err, size_t errlen) {
  const char *what = "allreduce (deterministic)";
  int n = r->size, me = r->rank, status = GS__ERR_NO_MEMORY;
  size_t es = cm->es, nn = (size_t)n * (size_t)n;
  size_t *offs = malloc(((size_t)n + 1) * sizeof *offs), *roff = malloc((size_t)n * sizeof *roff);
  uint64_t *m = malloc(nn * sizeof *m);
  piece *sp = malloc((nn + cm->nseg) * sizeof *sp), *rp = malloc(nn * sizeof *rp);
  const void **srcs = malloc((size_t)n * sizeof *srcs);
  if (!offs || !roff || !m || !sp || !rp || !srcs) {
    snprintf(err, errlen, "tcp ring: %s: out of memory for %zu segments", what, cm->nseg);
    goto out_free;
  }
  for (int c = 0; c <= n; c++) offs[c] = chunk_off(count, n, c);
  size_t lo = offs[me], hi = offs[me + 1], ob = (hi - lo) * es;
  for (int o = 0; o < n; o++)
    for (int d = 0; d < n; d++)
      m[(size_t)o * (size_t)n + (size_t)d] = o == d ? 0 : (offs[d + 1] - offs[d]) * es;
  for (int q = 0; q < n; q++) roff[q] = (size_t)(q < me ? q : q > me ? q - 1 : 0) * ob;
  size_t tmp_bytes = (size_t)(n - 1) * ob, relay = relay_size(r, m);
  char *tmp = det_scratch(r, tmp_bytes + relay + 1, what, err, errlen);
  if (!tmp) goto out_free;
  seg_send from = {cm, offs};
  status = exchange(r, what, NULL, NULL, &from, tmp, roff, m, tmp + tmp_bytes, sp, rp, err, errlen);
  if (status != GS__OK) goto out_free;
  for (size_t k = 0; k < cm->nseg; k++) { /* this rank's block, member by member */
    size_t a = lo > cm->start[k] ? lo : cm->start[k];
    size_t e = hi < cm->start[k + 1] ? hi : cm->start[k + 1];
    if (e <= a) continue;
    size_t off = (a - cm->start[k]) * es;
    char *dst = cm->at[k] + off;
    for (int q = 0; q < n; q++)
      srcs[q] = q != me ? tmp + roff[q] + (a - lo) * es : cm->local[k] ? cm->local[k] + off : dst;
    gs__reduce_many(dst, dt, srcs, (size_t)n, dt, e - a, op, fin.divisor, fin.factor);
  }
  status = gather_map(r, what, cm, offs, err, errlen);
out_free:
  free(offs);
  free(roff);
  free(m);
  free(sp);
  free(rp);
  free(srcs);
  return status;
}

/* Alltoallv over the ring: the block from rank o to rank d travels
 * (d - o) mod n hops, forwarded by every rank in between. Rank r sends its
 * own blocks nearest destination first, then forwards what it receives in
 * the order it came; what it receives from its left is, per origin
 * o = r-1, r-2, ..., the blocks o sent to r, r+1, ... in that order, the
 * first of which is r's own. Relayed blocks wait in a temporary buffer.
 * The size of every block is needed to cut these streams, so the ranks
 * first gather each other's send sizes. */
static int ring_alltoallv_vt(gs__backend *b, const void *send, const size_t *send_bytes, void *recv,
                             const size_t *recv_bytes, char *err, size_t errlen) {
  ring *r = (ring *)b;
  int rc = check_usable(r, "alltoallv", err, errlen);
  if (rc != GS__OK) return rc;
  int n = r->size, me = r->rank;
  if (!send_bytes || !recv_bytes) {
    snprintf(err, errlen, "tcp ring: alltoallv: %s is NULL",
             send_bytes ? "recv_bytes" : "send_bytes");
    return GS__ERR_INVALID_ARG;
  }
  size_t send_total = 0, recv_total = 0;
  for (int q = 0; q < n; q++) {
    if (send_bytes[q] > SIZE_MAX / 4 - send_total || recv_bytes[q] > SIZE_MAX / 4 - recv_total) {
      snprintf(err, errlen, "tcp ring: alltoallv: the block sizes overflow size_t");
      return GS__ERR_INVALID_ARG;
    }
    send_total += send_bytes[q];
    recv_total += recv_bytes[q];
  }
  if ((send_total && !send) || (recv_total && !recv)) {
    snprintf(err, errlen, "tcp ring: alltoallv: %s is NULL with bytes to move",
             send_total && !send ? "send" : "recv");
    return GS__ERR_INVALID_ARG;
  }

  int status = GS__ERR_NO_MEMORY;
  uint64_t *m = malloc((size_t)n * (size_t)n * sizeof *m); /* m[o*n+d]: bytes o -> d */
  size_t *soff = malloc(((size_t)n + 1) * sizeof *soff);   /* offsets in send */
  size_t *roff = malloc(((size_t)n + 1) * sizeof *roff);   /* offsets in recv */
  size_t *gb = malloc((size_t)n * sizeof *gb);
  size_t npieces = (size_t)n * (size_t)n; /* > n(n-1)/2 + n - 1 */
  piece *sp = malloc(npieces * sizeof *sp), *rp = malloc(npieces * sizeof *rp);
  char *relay = NULL;
  if (!m || !soff || !roff || !gb || !sp || !rp) {
    snprintf(err, errlen, "tcp ring: alltoallv: out of memory");
    goto out_free;
  }
  soff[0] = roff[0] = 0;
  for (int q = 0; q < n; q++) {
    soff[q + 1] = soff[q] + send_bytes[q];
    roff[q + 1] = roff[q] + recv_bytes[q];
  }

  /* everyone's send sizes */
  uint64_t *mine = m + (size_t)me * (size_t)n;
  for (int q = 0; q < n; q++) mine[q] = send_bytes[q], gb[q] = (size_t)n * sizeof *m;
  if (n > 1) {
    status = gather(r, "alltoallv", mine, m, gb, err, errlen);
    if (status != GS__OK) goto out_free;
  }
  for (int q = 0; q < n; q++) {
    if (m[(size_t)q * (size_t)n + (size_t)me] != recv_bytes[q]) {
      /* the other ranks go ahead with the exchange: stop them too */
      poison(r, me, NOTE_REFUSED, 0);
      status =
          fail(r, GS__ERR_INTERNAL, err, errlen,
               "tcp ring: alltoallv: rank %d sends %llu bytes to rank %d, which expects %zu "
               "(the split sizes disagree across ranks: a gradsync bug)",
               q, (unsigned long long)m[(size_t)q * (size_t)n + (size_t)me], me, recv_bytes[q]);
      goto out_free;
    }
  }
  if (send_bytes[me])
    memmove((char *)recv + roff[me], (const char *)send + soff[me], send_bytes[me]);

  relay = malloc(relay_size(r, m) ? relay_size(r, m) : 1);
  if (!relay) {
    snprintf(err, errlen, "tcp ring: alltoallv: out of memory for %zu relay bytes",
             relay_size(r, m));
    status = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  status =
      n > 1 ? exchange(r, "alltoallv", send, soff, NULL, recv, roff, m, relay, sp, rp, err, errlen)
            : GS__OK;
out_free:
  free(relay);
  free(m);
  free(soff);
  free(roff);
  free(gb);
  free(sp);
  free(rp);
  return status;
}

static int ring_broadcast_vt(gs__backend *b, void *buf, size_t len, int root, char *err,
                             size_t errlen) {
  ring *r = (ring *)b;
  int rc = check_usable(r, "broadcast", err, errlen);
  if (rc != GS__OK) return rc;
  if (root < 0 || root >= r->size) {
    snprintf(err, errlen, "tcp ring: broadcast: root %d is not a rank of this job (0..%d)", root,
             r->size - 1);
    return GS__ERR_INVALID_ARG;
  }
  if (len == 0 || r->size == 1) return GS__OK;
  if (!buf) {
    snprintf(err, errlen, "tcp ring: broadcast: buf is NULL with len %zu", len);
    return GS__ERR_INVALID_ARG;
  }
  /* A pipelined chain root -> root+1 -> ... -> root-1: every rank but the
   * root receives, every rank but the last forwards what it received. */
  int is_root = r->rank == root, is_last = r->right == root;
  piece whole = {buf, len, !is_last, NULL};
  stream st = {.what = "broadcast",
               .send = &whole,
               .nsend = is_last ? 0 : 1,
               .pre = is_root ? len : 0,
               .recv = &whole,
               .nrecv = is_root ? 0 : 1,
               .nreduce = 0,
               .dt = GS__UINT8,
               .op = GS__SUM};
  return run_stream(r, &st, err, errlen);
}

/* The agreement of a fast round: an allreduce (uint8 MIN or float32 SUM)
 * whose wait for the peers to enter has no deadline (see stream.patient).
 * It runs on the plain ring even when the ring is deterministic: MIN is
 * exact in any order, and the fast round lets nothing ride in a float32
 * SUM in deterministic mode (fast_round.c). Up to ONE_CHUNK_BYTES the sum
 * is in rank order 0..n-1 anyway (one chain from rank 0). */
static int ring_agree_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                         char *err, size_t errlen) {
  ring *r = (ring *)b;
  int rc = check_usable(r, "agree", err, errlen);
  if (rc == GS__OK) rc = gs__agree_args("tcp ring", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (count == 0 || r->size == 1) return GS__OK;
  if (!buf) {
    snprintf(err, errlen, "tcp ring: agree: buf is NULL with count %zu", count);
    return GS__ERR_INVALID_ARG;
  }
  if (count > SIZE_MAX / 8) {
    snprintf(err, errlen, "tcp ring: agree: count %zu is too large", count);
    return GS__ERR_INVALID_ARG;
  }
  return ring_allreduce(r, "agree", (char *)buf, dt, (char *)buf, dt, count, op,
                        (finishing){1, 1.0}, 1, err, errlen);
}

static void ring_abort_vt(gs__backend *b) {
  ring *r = (ring *)b;
  atomic_store(&r->aborted, 1);
  uint64_t one = 1;
  /* The eventfd stays readable: every later poll returns at once. A full
   * counter (EAGAIN) is as good as success. */
  ssize_t k = write(r->abort_fd, &one, sizeof one);
  (void)k;
}

static void ring_destroy_vt(gs__backend *b) {
  ring *r = (ring *)b;
  /* recv first: unread data makes that close a reset, which the left
   * neighbour sees at once, before the right one can react to our FIN and
   * close in turn (so a failing rank is named by both neighbours) */
  close_fd(&r->recv_fd);
  close_fd(&r->send_fd);
  close_fd(&r->abort_fd);
  free(r->scratch);
  free(r->work);
  free(r->send);
  free(r->recv);
  free(r->seg_send);
  free(r->seg_recv);
  free(r->offs);
  free(r->fusion);
  free(r->det);
  free(r->ids);
  free(r);
}

static void *ring_staging_vt(gs__backend *b, size_t bytes, char *err, size_t errlen) {
  ring *r = (ring *)b;
  return gs__host_staging(&r->fusion, &r->fusion_cap, bytes, err, errlen);
}

static int ring_copy_vt(gs__backend *b, const gs__copy *c, size_t n, char *err, size_t errlen) {
  (void)b;
  return gs__host_copy(c, n, err, errlen);
}

static const gs__backend_vtbl k_vtbl = {
    .name = "tcp",
    .device = GS__DEVICE_CPU,
    .staging = ring_staging_vt,
    .copy = ring_copy_vt,
    .mem_alloc = gs__host_alloc,
    .mem_free = gs__host_free,
    .allreduce = ring_allreduce_vt,
    .allreduce_scaled = ring_allreduce_scaled_vt,
    .allreduce_segs = ring_allreduce_segs_vt,
    .allgatherv = ring_allgatherv_vt,
    .broadcast = ring_broadcast_vt,
    .reducescatter = ring_reducescatter_vt,
    .alltoallv = ring_alltoallv_vt,
    .agree = ring_agree_vt,
    .abort = ring_abort_vt,
    .destroy = ring_destroy_vt,
};

int gs__tcp_ring_create(const gs__tcp_ring_opts *opts, gs__backend **out, char *err,
                        size_t errlen) {
  char eb[128];
  if (!opts || !out) {
    snprintf(err, errlen, "tcp ring: %s is NULL", opts ? "out" : "opts");
    return GS__ERR_INVALID_ARG;
  }
  *out = NULL;
  if (opts->size < 1 || opts->rank < 0 || opts->rank >= opts->size) {
    snprintf(err, errlen,
             "tcp ring: rank %d / size %d is not valid: need size >= 1 and 0 <= rank < size",
             opts->rank, opts->size);
    return GS__ERR_INVALID_ARG;
  }
  struct in6_addr a6;
  if (opts->advertise_addr &&
      ((strchr(opts->advertise_addr, ':') && inet_pton(AF_INET6, opts->advertise_addr, &a6) != 1) ||
       strlen(opts->advertise_addr) > 253)) {
    snprintf(err, errlen,
             "tcp ring: advertise_addr \"%.300s\" is not valid: give an IPv4 or IPv6 address "
             "or a host name, without a port (the ring picks its port; see "
             "GRADSYNC_DATA_PORT_RANGE)",
             opts->advertise_addr);
    return GS__ERR_INVALID_ARG;
  }
  if (opts->port_lo < 0 || opts->port_hi > 65535 || opts->port_lo > opts->port_hi ||
      (opts->port_lo == 0 && opts->port_hi != 0)) {
    snprintf(err, errlen, "tcp ring: port range %d-%d is not valid: need 1 <= low <= high <= 65535",
             opts->port_lo, opts->port_hi);
    return GS__ERR_INVALID_ARG;
  }
  if (opts->size > 1) {
    if (!opts->kv.set || !opts->kv.get) {
      snprintf(err, errlen, "tcp ring: the rendezvous store (kv.set/kv.get) is missing");
      return GS__ERR_INVALID_ARG;
    }
    if (!opts->ring_key) {
      snprintf(err, errlen, "tcp ring: ring_key is missing (the job's key from the coordinator)");
      return GS__ERR_INVALID_ARG;
    }
    if (opts->connect_timeout_ms <= 0 || opts->io_timeout_ms <= 0) {
      snprintf(err, errlen, "tcp ring: %s %d is not valid: need a positive number of milliseconds",
               opts->connect_timeout_ms <= 0 ? "connect_timeout_ms" : "io_timeout_ms",
               opts->connect_timeout_ms <= 0 ? opts->connect_timeout_ms : opts->io_timeout_ms);
      return GS__ERR_INVALID_ARG;
    }
  }

  const char *cc = opts->congestion;
  if (cc && (!*cc || strlen(cc) > 15)) {
    snprintf(err, errlen,
             "tcp ring: congestion control \"%.64s\" is not valid: give auto, system or an "
             "algorithm name of 1 to 15 characters (GRADSYNC_TCP_CONGESTION)",
             cc);
    return GS__ERR_INVALID_ARG;
  }

  int status = GS__ERR_NO_MEMORY;
  ring *r = calloc(1, sizeof *r);
  if (!r) goto out_nomem;
  r->base.v = &k_vtbl;
  r->rank = opts->rank;
  r->size = opts->size;
  r->left = mod(r->rank - 1, r->size);
  r->right = mod(r->rank + 1, r->size);
  r->io_timeout_ms = opts->io_timeout_ms;
  r->deterministic = opts->deterministic;
  r->cc.rank = opts->kv_ranks ? opts->kv_ranks[opts->rank] : opts->rank;
  r->cc.mode = !cc || !strcmp(cc, "auto") ? CC_AUTO : !strcmp(cc, "system") ? CC_SYSTEM : CC_NAMED;
  if (r->cc.mode == CC_NAMED) snprintf(r->cc.name, sizeof r->cc.name, "%s", cc);
  r->send_fd = r->recv_fd = -1;
  if (opts->ring_key) memcpy(r->key, opts->ring_key, sizeof r->key);
  snprintf(r->prefix, sizeof r->prefix, "%s", opts->key_prefix ? opts->key_prefix : "");
  atomic_init(&r->aborted, 0);
  r->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->abort_fd < 0) {
    snprintf(err, errlen, "tcp ring: eventfd failed: %s", errtext(errno, eb, sizeof eb));
    status = GS__ERR_INTERNAL;
    goto out_destroy;
  }
  r->offs = calloc((size_t)r->size + 1, sizeof *r->offs);
  if (!r->offs) goto out_nomem;
  if (opts->kv_ranks) {
    if (!(r->ids = malloc((size_t)r->size * sizeof *r->ids))) goto out_nomem;
    memcpy(r->ids, opts->kv_ranks, (size_t)r->size * sizeof *r->ids);
  }
  if (r->size > 1) {
    r->scratch = malloc(SEG_BYTES);
    r->send = calloc(2 * (size_t)r->size, sizeof *r->send);
    r->recv = calloc(2 * (size_t)r->size, sizeof *r->recv);
    if (!r->scratch || !r->send || !r->recv) goto out_nomem;
    status = rendezvous(r, opts, err, errlen);
    if (status != GS__OK) goto out_destroy;
  }
  *out = &r->base;
  return GS__OK;

out_nomem:
  snprintf(err, errlen, "tcp ring: out of memory creating the ring");
  status = GS__ERR_NO_MEMORY;
out_destroy:
  if (r) ring_destroy_vt(&r->base);
  return status;
}
