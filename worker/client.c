/* gRPC C core client of the coordinator (see client.h).
 *
 * The Session stream lives on its own "next" completion queue driven by
 * gs__client_session_poll: one RECV_MESSAGE kept armed, one SEND_MESSAGE in
 * flight with a queue behind it, RECV_STATUS_ON_CLIENT telling the end.
 * The send side (the message in flight, the queue, half-close) is guarded
 * by send_mu, so that any thread may send (gRPC allows a batch to be
 * started from any thread; one send in flight per call); everything else
 * of the session belongs to the polling thread. Unary calls use a pluck
 * queue per call, so any thread may make them. */
#include "client.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clock.h"
#include "codec.h"
#include "grpc_util.h"
#include "handoff_trace.h"
#include "log.h"
#include "secret.h"
#include "status.h"

typedef enum { C_START, C_RECV, C_SEND, C_STATUS, C_CLOSE, C_KICK } ctag_kind;

typedef struct ctag {
  ctag_kind kind;
} ctag;

typedef struct send_node {
  grpc_byte_buffer *bb; /* NULL = half-close */
  struct send_node *next;
} send_node;

struct gs__client {
  char *target;
  grpc_channel *ch;
  void *h_join, *h_session, *h_kv_set, *h_kv_get, *h_kv_delete;
  grpc_metadata md[3]; /* authorization, then the identity once joined */
  size_t nmd;
  uint8_t secret[GS__SECRET_BYTES];
  /* the session (one thread at a time) */
  grpc_completion_queue *cq;
  grpc_call *call;
  ctag t_start, t_recv, t_send, t_status, t_kick;
  unsigned kicks; /* kicks consumed, not yet taken */
  grpc_metadata_array init_md, trail;
  grpc_status_code status;
  grpc_slice details;
  grpc_byte_buffer *recv_bb;
  atomic_int pending; /* batches started, not completed (kicks not counted) */
  atomic_int ended;   /* the stream is over (or a batch could not start) */
  int recv_armed;
  pthread_mutex_t send_mu; /* guards the fields below */
  grpc_byte_buffer *send_bb;
  send_node *q_head, *q_tail;
  int send_busy, half_closed;
  int tls; /* the channel uses TLS */
};

/* Channel credentials from the PEM files of o: TLS when tls_ca is set. */
static int make_creds(const gs__client_opts *o, grpc_channel_credentials **out, char *err,
                      size_t errlen) {
  *out = NULL;
  if (!o->tls_ca || !*o->tls_ca) {
    *out = grpc_insecure_credentials_create();
    return GS__OK;
  }
  char *ca = NULL, *cert = NULL, *key = NULL;
  int rc = gs__pem_read(o->tls_ca, "GRADSYNC_TLS_CA", &ca, err, errlen);
  if (!rc && o->tls_cert && *o->tls_cert)
    rc = gs__pem_read(o->tls_cert, "GRADSYNC_TLS_CERT", &cert, err, errlen);
  if (!rc && o->tls_key && *o->tls_key)
    rc = gs__pem_read(o->tls_key, "GRADSYNC_TLS_KEY", &key, err, errlen);
  if (!rc) {
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    *out = grpc_ssl_credentials_create(ca, cert && key ? &pair : NULL, NULL, NULL);
    if (!*out) {
      snprintf(err, errlen, "gRPC refused the TLS files (GRADSYNC_TLS_CA %s)", o->tls_ca);
      rc = GS__ERR_INVALID_ARG;
    }
  }
  free(ca);
  free(cert);
  if (key) {
    memset(key, 0, strlen(key));
    free(key);
  }
  return rc;
}

int gs__client_create(const gs__client_opts *o, gs__client **out, char *err, size_t errlen) {
  *out = NULL;
  int forked_from = gs__grpc_forked_from();
  if (forked_from) {
    snprintf(err, errlen,
             "process %d was forked by process %d while gradsync's gRPC client was live there "
             "(a gradsync context that had not been shut down); gRPC cannot start again in such "
             "a child (it would hang, and could take events of the parent's connections): call "
             "gs_init in a process started with exec (e.g. multiprocessing's 'spawn' start "
             "method), or fork before the parent's gs_init or after its gs_shutdown",
             (int)getpid(), forked_from);
    return GS__ERR_FORKED;
  }
  const char *target = o->target, *token = o->token;
  gs__client *c = calloc(1, sizeof *c);
  if (!c || !(c->target = strdup(target))) {
    free(c);
    snprintf(err, errlen, "out of memory");
    return GS__ERR_NO_MEMORY;
  }
  c->tls = o->tls_ca && *o->tls_ca;
  pthread_mutex_init(&c->send_mu, NULL);
  atomic_fetch_add(&gs__grpc_users, 1); /* before gRPC starts threads: fork.c */
  grpc_init();
  grpc_channel_credentials *creds = NULL;
  int rc = make_creds(o, &creds, err, errlen);
  if (rc) {
    pthread_mutex_destroy(&c->send_mu);
    free(c->target);
    free(c);
    grpc_shutdown();
    atomic_fetch_sub(&gs__grpc_users, 1);
    return rc;
  }
  /* Keepalive: a coordinator that vanishes without closing the connection
   * is noticed within about 7 s, inside the default rank timeout. */
  grpc_arg args[] = {
      gs__int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, 2000),
      gs__int_arg(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000),
      gs__int_arg(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
      gs__int_arg(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0),
      gs__int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20),
      /* A coordinator that is not up yet is found within 2 s of starting
       * (gRPC's default backoff grows to 120 s). Not
       * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC 1.51 takes it as the
       * shortest time a connection attempt may take (default 20 s), and at
       * 250 ms a TLS handshake with a busy coordinator (many ranks joining,
       * a loaded host, valgrind) was cut off on every attempt until
       * GRADSYNC_JOIN_TIMEOUT_MS ran out ("tcp handshaker shutdown"). */
      gs__int_arg(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250),
      gs__int_arg(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000),
  };
  grpc_channel_args ca = {sizeof args / sizeof *args, args};
  c->ch = grpc_channel_create(target, creds, &ca);
  grpc_channel_credentials_release(creds);
  c->h_join = grpc_channel_register_call(c->ch, "/gradsync.v1.Coordinator/Join", NULL, NULL);
  c->h_session = grpc_channel_register_call(c->ch, "/gradsync.v1.Coordinator/Session", NULL, NULL);
  c->h_kv_set = grpc_channel_register_call(c->ch, "/gradsync.v1.Coordinator/KvSet", NULL, NULL);
  c->h_kv_get = grpc_channel_register_call(c->ch, "/gradsync.v1.Coordinator/KvGet", NULL, NULL);
  c->h_kv_delete =
      grpc_channel_register_call(c->ch, "/gradsync.v1.Coordinator/KvDelete", NULL, NULL);
  if (token && *token) {
    char v[1024];
    snprintf(v, sizeof v, "Bearer %s", token);
    memset(c->md, 0, sizeof c->md);
    c->md[0].key = grpc_slice_from_static_string("authorization");
    c->md[0].value = grpc_slice_from_copied_string(v);
    c->nmd = 1;
  }
  c->t_start = (ctag){C_START};
  c->t_recv = (ctag){C_RECV};
  c->t_send = (ctag){C_SEND};
  c->t_status = (ctag){C_STATUS};
  c->t_kick = (ctag){C_KICK};
  c->details = grpc_empty_slice();
  grpc_metadata_array_init(&c->init_md);
  grpc_metadata_array_init(&c->trail);
  *out = c;
  return GS__OK;
}

static const char *grpc_code_name(grpc_status_code code) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  return (int)code >= 0 && (int)code <= 16 ? names[code] : "UNKNOWN";
}

/* The one place gRPC status codes become gradsync statuses. */
static int status_of(grpc_status_code code) {
  switch (code) {
  case GRPC_STATUS_OK:
    return GS__OK;
  case GRPC_STATUS_INVALID_ARGUMENT:
  case GRPC_STATUS_FAILED_PRECONDITION:
    return GS__ERR_JOIN_REFUSED;
  case GRPC_STATUS_ALREADY_EXISTS:
    return GS__ERR_ALREADY_JOINED;
  case GRPC_STATUS_UNAUTHENTICATED:
  case GRPC_STATUS_PERMISSION_DENIED:
    return GS__ERR_UNAUTHENTICATED;
  case GRPC_STATUS_ABORTED:
    return GS__ERR_ABORTED;
  case GRPC_STATUS_RESOURCE_EXHAUSTED:
    return GS__ERR_NO_MEMORY;
  case GRPC_STATUS_UNIMPLEMENTED:
    return GS__ERR_UNSUPPORTED;
  default:
    return GS__ERR_COORDINATOR_LOST;
  }
}

static void slice_text(grpc_slice s, char *out, size_t outlen) {
  size_t n = GRPC_SLICE_LENGTH(s);
  if (n >= outlen) n = outlen - 1;
  memcpy(out, GRPC_SLICE_START_PTR(s), n);
  out[n] = 0;
}

/* One unary call on a private pluck queue. *resp receives the reply bytes
 * (malloc'd) on GRPC_STATUS_OK. Returns the gRPC status code. */
static grpc_status_code unary(gs__client *c, void *method, const uint8_t *req, size_t reqlen,
                              int timeout_ms, uint8_t **resp, size_t *resplen, char *details,
                              size_t dlen) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_call *call = grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                        method, gs__deadline_ms(timeout_ms), NULL);
  grpc_metadata_array init_md, trail;
  grpc_metadata_array_init(&init_md);
  grpc_metadata_array_init(&trail);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  grpc_byte_buffer *out = gs__bb_from_bytes(req, reqlen), *in = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = c->nmd;
  ops[0].data.send_initial_metadata.metadata = c->md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trail;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &det;
  int tag;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) == GRPC_CALL_OK) {
    /* The call's deadline bounds this wait. */
    grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  } else {
    status = GRPC_STATUS_INTERNAL;
  }
  *resp = NULL;
  *resplen = 0;
  if (status == GRPC_STATUS_OK && gs__bb_to_bytes(in, resp, resplen) != 0)
    status = GRPC_STATUS_RESOURCE_EXHAUSTED;
  slice_text(det, details, dlen);
  grpc_slice_unref(det);
  if (in) grpc_byte_buffer_destroy(in);
  grpc_byte_buffer_destroy(out);
  grpc_metadata_array_destroy(&init_md);
  grpc_metadata_array_destroy(&trail);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
  return status;
}

#define JOIN_REPORT_MS 3000 /* progress lines while the coordinator is not up */
/* A TLS rank whose handshakes with a TLS coordinator fail this long: its
 * certificates do not fit (waiting will not cure that). */
#define HANDSHAKE_GIVEUP_MS 5000
#define PROBE_MS 2000 /* the most a probe waits for its connection, then its answer */

/* A connected TCP socket to target ("host:port", "[v6]:port") within
 * timeout_ms, or -1. */
static int connect_target(const char *target, int timeout_ms) {
  char host[256], port[32];
  const char *colon = strrchr(target, ':');
  if (!colon) return -1;
  size_t hl = (size_t)(colon - target);
  const char *h = target;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2;
  if (hl == 0 || hl >= sizeof host || strlen(colon + 1) >= sizeof port) return -1;
  memcpy(host, h, hl);
  host[hl] = 0;
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &ai) != 0) return -1;
  int connected = -1;
  for (struct addrinfo *a = ai; a && connected < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int e = 0;
      socklen_t sl = sizeof e;
      ok = poll(&pfd, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) == 0 &&
           !e;
    }
    if (ok)
      connected = fd;
    else
      close(fd);
  }
  freeaddrinfo(ai);
  return connected;
}

/* What listens at a target where gRPC cannot set up a connection. */
typedef enum {
  PEER_UNKNOWN,  /* no connection, no answer in time, or not HTTP/2 nor TLS */
  PEER_H2_CLEAR, /* an HTTP/2 server without TLS: it sent its SETTINGS */
  PEER_TLS,      /* a TLS server: a TLS record, or it closed on the preface */
} peer_kind;

/* Asks target directly: sends the HTTP/2 client preface and an empty
 * SETTINGS frame in plaintext and reads the first frame header back. A gRPC
 * server without TLS sends SETTINGS whatever it receives; a TLS server
 * answers the non-ClientHello with an alert record or closes the connection.
 * A busy server that has not answered within timeout_ms is PEER_UNKNOWN,
 * so load never reads as a mismatch. */
static peer_kind probe_peer(const char *target, int timeout_ms) {
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                "\0\0\0\x04\0\0\0\0\0"; /* + SETTINGS, empty */
  int fd = connect_target(target, timeout_ms);
  if (fd < 0) return PEER_UNKNOWN;
  peer_kind kind = PEER_UNKNOWN;
  unsigned char hdr[9];
  size_t got = 0;
  uint64_t end = gs__now_ms() + (uint64_t)timeout_ms;
  if (send(fd, preface, sizeof preface - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof preface - 1)) {
    close(fd);
    return PEER_UNKNOWN;
  }
  for (;;) {
    uint64_t now = gs__now_ms();
    if (now >= end) break;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)(end - now));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    ssize_t n = recv(fd, hdr + got, sizeof hdr - got, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) { /* closed (or reset) on the preface, before a byte */
      if (got == 0 && (n == 0 || errno == ECONNRESET)) kind = PEER_TLS;
      break;
    }
    got += (size_t)n;
    if (hdr[0] == 0x15 || hdr[0] == 0x16) { /* TLS alert or handshake record */
      kind = PEER_TLS;
      break;
    }
    if (got == sizeof hdr) {
      if (hdr[3] == 0x04 && !(hdr[4] & 0x01)) kind = PEER_H2_CLEAR; /* SETTINGS, not ACK */
      break;
    }
  }
  close(fd);
  return kind;
}

int gs__client_join(gs__client *c, const gs__join_request *req, int timeout_ms,
                    gs__join_response *resp, char *err, size_t errlen) {
  uint8_t *buf = NULL, *rbuf = NULL;
  size_t len, rlen;
  int rc = gs__encode_join_request(req, &buf, &len);
  if (rc) {
    snprintf(err, errlen, "could not encode the join request");
    return rc;
  }
  uint64_t start = gs__now_ms(), end = start + (uint64_t)timeout_ms;
  uint64_t next_report = start + JOIN_REPORT_MS, handshake_fail_since = 0;
  char details[GS__MAX_TEXT];
  grpc_status_code code;
  for (;;) {
    uint64_t now = gs__now_ms();
    int left = now < end ? (int)(end - now) : 0;
    code =
        unary(c, c->h_join, buf, len, left > 0 ? left : 1, &rbuf, &rlen, details, sizeof details);
    /* The coordinator may still be starting: retry while time is left,
     * saying every few seconds why (refused, unreachable, unresolvable). */
    if (code != GRPC_STATUS_UNAVAILABLE || gs__now_ms() + 200 >= end) break;
    now = gs__now_ms();
    /* Something there, but gRPC cannot set up a connection: ask it what it
     * speaks. A TLS mismatch is reported at once (waiting will not cure
     * it); a TLS rank whose handshakes with a TLS coordinator keep failing
     * has certificates that do not fit; anything undecided (a busy server)
     * waits on. */
    peer_kind peer = PEER_UNKNOWN;
    int probe_ms = end > now + 200 ? (int)((end - now - 200) / 2) : 0;
    if (probe_ms > PROBE_MS) probe_ms = PROBE_MS;
    if (probe_ms > 0 && !strstr(details, "Connection refused") && !strstr(details, "DNS"))
      peer = probe_peer(c->target, probe_ms);
    const char *why = NULL;
    if (!c->tls && peer == PEER_TLS)
      why = "the coordinator serves TLS (gradsyncd --tls-cert) and this rank speaks plaintext; "
            "set GRADSYNC_TLS_CA (and GRADSYNC_TLS_CERT/KEY under mTLS)";
    else if (c->tls && peer == PEER_H2_CLEAR)
      why = "the coordinator serves plaintext and this rank speaks TLS (GRADSYNC_TLS_CA is "
            "set); start gradsyncd with --tls-cert/--tls-key or unset GRADSYNC_TLS_CA, "
            "GRADSYNC_TLS_CERT and GRADSYNC_TLS_KEY";
    if (c->tls && peer == PEER_TLS) {
      if (!handshake_fail_since) handshake_fail_since = now;
      if (now - handshake_fail_since >= HANDSHAKE_GIVEUP_MS)
        why = "the coordinator does not trust this rank's certificate, requires one (mTLS: set "
              "GRADSYNC_TLS_CERT and GRADSYNC_TLS_KEY), or its certificate does not match "
              "GRADSYNC_TLS_CA or the address";
    } else {
      handshake_fail_since = 0;
    }
    if (why) {
      free(buf);
      snprintf(err, errlen,
               "reached %s, but the connection to the coordinator could not be set up (%s). "
               "This is a TLS mismatch: %s",
               c->target, details, why);
      return GS__ERR_UNAUTHENTICATED;
    }
    now = gs__now_ms();
    if (now >= next_report) {
      GS_LOG_WARN("rank %d: waiting for the coordinator at %s for %llu s (%s); retrying for "
                  "another %llu s (GRADSYNC_JOIN_TIMEOUT_MS)",
                  req->rank, c->target, (unsigned long long)((now - start) / 1000), details,
                  (unsigned long long)((end - now) / 1000));
      next_report = now + JOIN_REPORT_MS;
    }
    gs__sleep_ms(200);
  }
  free(buf);
  if (code != GRPC_STATUS_OK) {
    rc = status_of(code);
    if (code == GRPC_STATUS_UNAVAILABLE && strstr(details, "gradsyncd is shutting down"))
      snprintf(err, errlen,
               "the coordinator at %s is shutting down and took no new ranks within %d ms "
               "(GRADSYNC_JOIN_TIMEOUT_MS): %s",
               c->target, timeout_ms, details);
    else if (rc == GS__ERR_COORDINATOR_LOST)
      snprintf(err, errlen,
               "cannot reach the coordinator at %s within %d ms (%s: %s); check that gradsyncd "
               "is running and GRADSYNC_COORDINATOR is right",
               c->target, timeout_ms, grpc_code_name(code), details);
    else
      snprintf(err, errlen, "the coordinator at %s refused to let this rank join: %s", c->target,
               details);
    return rc;
  }
  rc = gs__decode_join_response(rbuf, rlen, resp, err, errlen);
  free(rbuf);
  return rc;
}

int gs__client_kv_set(gs__client *c, const char *key, const void *val, size_t len, char *err,
                      size_t errlen) {
  gs__kv_msg m = {0};
  m.key = (char *)key;
  m.value = (uint8_t *)val;
  m.value_len = len;
  uint8_t *buf = NULL, *rbuf = NULL;
  size_t blen, rlen;
  if (gs__encode_kv(GS__KV_SET_REQ, &m, &buf, &blen)) {
    snprintf(err, errlen, "could not encode kv key '%s'", key);
    return GS__ERR_NO_MEMORY;
  }
  char details[GS__MAX_TEXT];
  grpc_status_code code =
      unary(c, c->h_kv_set, buf, blen, 10000, &rbuf, &rlen, details, sizeof details);
  free(buf);
  free(rbuf);
  if (code != GRPC_STATUS_OK) {
    snprintf(err, errlen, "storing rendezvous key '%s' at the coordinator %s failed (%s: %s)", key,
             c->target, grpc_code_name(code), details);
    return status_of(code) == GS__ERR_UNAUTHENTICATED ? GS__ERR_UNAUTHENTICATED
                                                      : GS__ERR_COORDINATOR_LOST;
  }
  return GS__OK;
}

int gs__client_kv_get(gs__client *c, const char *key, int wait_ms, void **val, size_t *len,
                      char *err, size_t errlen) {
  *val = NULL;
  *len = 0;
  gs__kv_msg m = {0};
  m.key = (char *)key;
  m.wait_ms = wait_ms > 0 ? (uint32_t)wait_ms : 0;
  uint8_t *buf = NULL, *rbuf = NULL;
  size_t blen, rlen;
  if (gs__encode_kv(GS__KV_GET_REQ, &m, &buf, &blen)) {
    snprintf(err, errlen, "could not encode kv key '%s'", key);
    return GS__ERR_NO_MEMORY;
  }
  char details[GS__MAX_TEXT];
  grpc_status_code code = unary(c, c->h_kv_get, buf, blen, (wait_ms > 0 ? wait_ms : 0) + 10000,
                                &rbuf, &rlen, details, sizeof details);
  free(buf);
  if (code != GRPC_STATUS_OK) {
    free(rbuf);
    snprintf(err, errlen, "reading rendezvous key '%s' from the coordinator %s failed (%s: %s)",
             key, c->target, grpc_code_name(code), details);
    return status_of(code) == GS__ERR_UNAUTHENTICATED ? GS__ERR_UNAUTHENTICATED
                                                      : GS__ERR_COORDINATOR_LOST;
  }
  gs__kv_msg r;
  int rc = gs__decode_kv(GS__KV_GET_RESP, rbuf, rlen, &r, err, errlen);
  free(rbuf);
  if (rc) return rc;
  if (!r.found) {
    gs__kv_msg_free(&r);
    snprintf(err, errlen, "rendezvous key '%s' did not appear within %d ms", key, wait_ms);
    return GS__ERR_TIMEOUT;
  }
  *val = r.value;
  *len = r.value_len;
  r.value = NULL;
  gs__kv_msg_free(&r);
  return GS__OK;
}

/* ---- session -------------------------------------------------------------- */

static void start(gs__client *c, const grpc_op *ops, size_t n, ctag *t) {
  /* Counted before the start: the batch may complete on another thread
   * before grpc_call_start_batch returns. */
  atomic_fetch_add(&c->pending, 1);
  if (grpc_call_start_batch(c->call, ops, n, t, NULL) != GRPC_CALL_OK) {
    atomic_fetch_sub(&c->pending, 1);
    atomic_store(&c->ended, 1); /* only our own misuse gets here; treat as an ended stream */
  }
}

/* Caller holds send_mu. */
static void send_now(gs__client *c, grpc_byte_buffer *bb) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  if (bb) {
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
  } else {
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    c->half_closed = 1;
  }
  c->send_bb = bb;
  c->send_busy = 1;
  start(c, &op, 1, &c->t_send);
}

/* Caller holds send_mu. */
static void enqueue(gs__client *c, grpc_byte_buffer *bb) {
  if (!c->send_busy) {
    send_now(c, bb);
    return;
  }
  send_node *n = malloc(sizeof *n);
  if (!n) {
    if (bb) grpc_byte_buffer_destroy(bb);
    return;
  }
  n->bb = bb;
  n->next = NULL;
  if (c->q_tail)
    c->q_tail->next = n;
  else
    c->q_head = n;
  c->q_tail = n;
}

static void arm_recv(gs__client *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  c->recv_armed = 1;
  start(c, &op, 1, &c->t_recv);
}

void gs__client_set_identity(gs__client *c, int32_t rank, const uint8_t *secret) {
  if (c->nmd + 2 > sizeof c->md / sizeof *c->md) return; /* set once */
  char rank_s[16], hex[2 * GS__SECRET_BYTES + 1];
  memcpy(c->secret, secret, sizeof c->secret);
  snprintf(rank_s, sizeof rank_s, "%d", rank);
  gs__hex(secret, GS__SECRET_BYTES, hex);
  memset(&c->md[c->nmd], 0, 2 * sizeof *c->md);
  c->md[c->nmd].key = grpc_slice_from_static_string("gradsync-rank");
  c->md[c->nmd++].value = grpc_slice_from_copied_string(rank_s);
  c->md[c->nmd].key = grpc_slice_from_static_string("gradsync-rank-secret");
  c->md[c->nmd++].value = grpc_slice_from_copied_string(hex);
}

int gs__client_session_open(gs__client *c, int32_t rank, uint64_t epoch, char *err, size_t errlen) {
  c->cq = grpc_completion_queue_create_for_next(NULL);
  c->call =
      grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, c->h_session,
                                          gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  if (!c->call) {
    snprintf(err, errlen, "could not create the session call to %s", c->target);
    return GS__ERR_INTERNAL;
  }
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = c->nmd;
  ops[0].data.send_initial_metadata.metadata = c->md;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &c->init_md;
  start(c, ops, 2, &c->t_start);
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &c->trail;
  ops[0].data.recv_status_on_client.status = &c->status;
  ops[0].data.recv_status_on_client.status_details = &c->details;
  start(c, ops, 1, &c->t_status);
  arm_recv(c);
  gs__rank_msg hello;
  memset(&hello, 0, sizeof hello);
  hello.has_hello = 1;
  hello.hello_rank = rank;
  hello.hello_epoch = epoch;
  hello.hello_fast_path = 1; /* this worker runs fast rounds (worker/fast_round.c) */
  memcpy(hello.hello_secret, c->secret, sizeof hello.hello_secret);
  return gs__client_session_send(c, &hello, NULL, err, errlen);
}

int gs__client_session_send(gs__client *c, const gs__rank_msg *m, size_t *bytes, char *err,
                            size_t errlen) {
  uint8_t *buf = NULL;
  size_t len;
  if (gs__encode_rank_msg(m, &buf, &len)) {
    snprintf(err, errlen, "could not encode a message for the coordinator");
    return GS__ERR_NO_MEMORY;
  }
  grpc_byte_buffer *bb = gs__bb_from_bytes(buf, len);
  free(buf);
  pthread_mutex_lock(&c->send_mu);
  int over = atomic_load(&c->ended) || c->half_closed;
  if (!over) enqueue(c, bb);
  pthread_mutex_unlock(&c->send_mu);
  if (over) {
    grpc_byte_buffer_destroy(bb);
    snprintf(err, errlen, "the session with the coordinator %s has ended", c->target);
    return GS__ERR_COORDINATOR_LOST;
  }
  if (bytes) *bytes = len;
  return GS__OK;
}

int gs__client_session_idle(gs__client *c) {
  pthread_mutex_lock(&c->send_mu);
  int idle = !c->send_busy && !c->q_head;
  pthread_mutex_unlock(&c->send_mu);
  return idle;
}

static int lost(gs__client *c, char *err, size_t errlen) {
  char det[GS__MAX_TEXT];
  slice_text(c->details, det, sizeof det);
  if (strstr(det, "declared this rank lost")) {
    /* The coordinator is fine: it gave up on this rank (it was stopped or
     * silent too long). */
    snprintf(err, errlen,
             "%s (coordinator %s). The job went on without this rank and aborted; restart it", det,
             c->target);
    return GS__ERR_RANK_LOST;
  }
  if (strstr(det, "gradsyncd is shutting down")) {
    snprintf(err, errlen,
             "lost the coordinator at %s: it was shut down while the job ran (%s: %s). Restart "
             "the job once the coordinator is back",
             c->target, grpc_code_name(c->status), det);
    return GS__ERR_COORDINATOR_LOST;
  }
  snprintf(err, errlen,
           "lost the coordinator at %s: its session stream ended (%s%s%s). The coordinator "
           "process died, was stopped, or cannot be reached; check its log",
           c->target, grpc_code_name(c->status), det[0] ? ": " : "", det);
  return GS__ERR_COORDINATOR_LOST;
}

void gs__client_session_kick(gs__client *c) {
  /* C core 1.51 has no public alarm: a connectivity watch whose deadline has
   * passed completes at once with its tag, which wakes the queue's owner. */
  grpc_connectivity_state st = grpc_channel_check_connectivity_state(c->ch, 0);
  grpc_channel_watch_connectivity_state(c->ch, st, gpr_inf_past(GPR_CLOCK_MONOTONIC), c->cq,
                                        &c->t_kick);
}

unsigned gs__client_session_kicks_taken(gs__client *c) {
  unsigned k = c->kicks;
  c->kicks = 0;
  return k;
}

/* A send completed: start the next queued one. */
static void send_done(gs__client *c, int success) {
  pthread_mutex_lock(&c->send_mu);
  grpc_byte_buffer *done = c->send_bb, *drop = NULL;
  c->send_bb = NULL;
  c->send_busy = 0;
  send_node *n = c->q_head;
  if (n) {
    c->q_head = n->next;
    if (!c->q_head) c->q_tail = NULL;
    if (success)
      send_now(c, n->bb);
    else
      drop = n->bb;
  }
  pthread_mutex_unlock(&c->send_mu);
  free(n);
  if (done) grpc_byte_buffer_destroy(done);
  if (drop) grpc_byte_buffer_destroy(drop);
}

int gs__client_session_poll(gs__client *c, int64_t timeout_us, gs__plan_msg *msg, int *got,
                            char *err, size_t errlen) {
  *got = GS__POLL_NOTHING;
  gpr_timespec deadline = gs__deadline_us(timeout_us);
  for (;;) {
    if (atomic_load(&c->ended)) return lost(c, err, errlen);
    grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE) return GS__OK; /* timeout */
    ctag *t = ev.tag;
    if (t->kind == C_KICK) {
      GS_TRACE(GS__TR_COMM_WAKE, 0, 0);
      c->kicks++;
      *got = GS__POLL_EVENT;
      return GS__OK;
    }
    atomic_fetch_sub(&c->pending, 1);
    switch (t->kind) {
    case C_START:
      break;
    case C_SEND:
      GS_TRACE(GS__TR_SEND_DONE, 0, 0);
      send_done(c, ev.success);
      *got = GS__POLL_EVENT;
      return GS__OK;
    case C_RECV:
      c->recv_armed = 0;
      if (ev.success && c->recv_bb) {
        uint8_t *buf;
        size_t len;
        int rc = gs__bb_to_bytes(c->recv_bb, &buf, &len);
        grpc_byte_buffer_destroy(c->recv_bb);
        c->recv_bb = NULL;
        arm_recv(c);
        if (rc != 0) {
          snprintf(err, errlen, "out of memory reading a message from the coordinator");
          return GS__ERR_NO_MEMORY;
        }
        char derr[GS__MAX_TEXT];
        rc = gs__decode_plan_msg(buf, len, msg, derr, sizeof derr);
        free(buf);
        if (rc) {
          snprintf(err, errlen, "the coordinator at %s sent a malformed message: %s", c->target,
                   derr);
          return GS__ERR_INTERNAL;
        }
        *got = GS__POLL_MESSAGE;
        return GS__OK;
      }
      /* End of the server's messages: the status follows. Wait for it
       * briefly so the error can say why. */
      deadline = gs__deadline_ms(1000);
      break;
    case C_STATUS:
      atomic_store(&c->ended, 1);
      return lost(c, err, errlen);
    case C_CLOSE:
    case C_KICK:
      break;
    }
  }
}

void gs__client_session_close(gs__client *c, int timeout_ms) {
  if (!c->call) return;
  pthread_mutex_lock(&c->send_mu);
  if (!atomic_load(&c->ended) && !c->half_closed) enqueue(c, NULL);
  pthread_mutex_unlock(&c->send_mu);
  uint64_t end = gs__now_ms() + (uint64_t)timeout_ms;
  int cancelled = 0;
  while (atomic_load(&c->pending) > 0) {
    uint64_t now = gs__now_ms();
    if (now >= end && !cancelled) {
      grpc_call_cancel(c->call, NULL);
      cancelled = 1;
    }
    grpc_event ev = grpc_completion_queue_next(
        c->cq, gs__deadline_ms(cancelled ? 1000 : (int64_t)(end > now ? end - now : 0)), NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
      if (cancelled) break; /* should not happen: a cancelled call completes its batches */
      continue;
    }
    ctag *t = ev.tag;
    if (t->kind == C_KICK) continue; /* not counted in pending */
    atomic_fetch_sub(&c->pending, 1);
    if (t->kind == C_SEND) {
      send_done(c, ev.success);
    } else if (t->kind == C_RECV) {
      c->recv_armed = 0;
      if (c->recv_bb) {
        grpc_byte_buffer_destroy(c->recv_bb);
        c->recv_bb = NULL;
        if (ev.success) arm_recv(c); /* drain until the server ends the stream */
      }
    } else if (t->kind == C_STATUS) {
      atomic_store(&c->ended, 1);
    }
  }
}

void gs__client_destroy(gs__client *c) {
  if (!c) return;
  if (c->call) {
    if (atomic_load(&c->pending) > 0) gs__client_session_close(c, 0);
    grpc_call_unref(c->call);
  }
  while (c->q_head) {
    send_node *n = c->q_head;
    c->q_head = n->next;
    if (n->bb) grpc_byte_buffer_destroy(n->bb);
    free(n);
  }
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  if (c->cq) {
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
  }
  grpc_slice_unref(c->details);
  grpc_metadata_array_destroy(&c->init_md);
  grpc_metadata_array_destroy(&c->trail);
  for (size_t i = 0; i < c->nmd; i++) {
    grpc_slice_unref(c->md[i].key);
    grpc_slice_unref(c->md[i].value);
  }
  grpc_channel_destroy(c->ch);
  pthread_mutex_destroy(&c->send_mu);
  free(c->target);
  free(c);
  grpc_shutdown();
  atomic_fetch_sub(&gs__grpc_users, 1); /* after gRPC's threads ended: fork.c */
}
