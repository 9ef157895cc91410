/* The coordinator's gRPC transport (gRPC C core 1.51): call plumbing and the
 * service table.
 *
 * One completion queue, drained by the thread in gs__server_run, which owns
 * every call object and runs every service callback: nothing here takes a
 * lock and nothing blocks. Periodic work (the services' ticks, the stop
 * check) runs when completion_queue_next returns on its deadline.
 *
 * Calls: unary calls are answered with one batch holding the reply and
 * RECV_CLOSE_ON_SERVER. Streams get RECV_CLOSE_ON_SERVER as the
 * cancel/disconnect signal, one RECV_MESSAGE kept armed (bidi), and one
 * SEND_MESSAGE in flight with a bounded queue behind it; the status goes
 * out once the queue drained. A call is freed when it is closed and none of
 * its batches is pending. A catch-all request answers unknown methods with
 * UNIMPLEMENTED. */
#include "transport.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clock.h"
#include "grpc_util.h"
#include "log.h"
#include "secret.h"
#include "status.h"
#include "tls_files.h"

#define MAX_METHODS 64
#define MAX_SERVICES 16
#define REQUESTS_PER_METHOD 8
#define DEFAULT_TICK_MS 50
#define DEFAULT_MAX_QUEUED ((size_t)256 << 20)
#define GENERIC (-1)
/* Events drained before a tick that comes due (see gs__server_run). */
#define MAX_EVENTS_BEFORE_TICK 4096
/* A tick this late means the loop did not run for a while (a long pass,
 * or the process was stopped or starved of CPU): it is postponed by
 * CATCH_UP_MS, once, so that what the peers sent meanwhile (heartbeats,
 * requests), still in the sockets, is read before liveness, stalls and
 * deadlocks are judged. */
#define LATE_TICK_MS 500
#define CATCH_UP_MS 1000
/* Of the shutdown grace: kept for closing after the drain (see
 * gs__server_run). */
#define CLOSE_RESERVE_MS 2000
/* Header bytes (all metadata of one batch) a call may carry: the token and
 * the rank's identity need under 300. */
#define MAX_METADATA_BYTES (16 << 10)
/* Messages of the open methods (no token: health checks, reflection; each
 * message of a reflection stream) that gRPC reads at once: one per
 * OPEN_READ_QUOTA_SHARE bytes of the gRPC memory quota (each may be up to
 * GS__MAX_MESSAGE while gRPC reads it, before its length can be judged), at
 * least 1 and at most MAX_OPEN_READS. The rest wait, unread, at most
 * MAX_OPEN_QUEUED calls in all, in one FIFO per connection; the peer hosts
 * (the connection's address without its port) are served in rounds, and
 * the connections of one host in rounds of their own (open_next_waiting):
 * a probe from another host waits for at most one read of each other host,
 * however many connections and calls one of them opened, and a probe on its
 * own connection from a flooder's host for one read of each connection of
 * that host between its host's turns.
 * When the queue is full, a call from a host with fewer waiting calls than
 * the one with most takes the place of that one's newest call (of its
 * connection with most; that call is refused); otherwise it is refused
 * itself. A waiting call's message
 * stays in the peer but for the HTTP/2 stream window (64 KiB: the BDP
 * probe, which grows every stream's window, is off). */
#define MAX_OPEN_READS 16
#define OPEN_READ_QUOTA_SHARE ((size_t)4 * GS__MAX_MESSAGE)
#define MAX_OPEN_QUEUED 256
/* An open call being read that has not sent its whole request after this
 * long is cut off (DEADLINE_EXCEEDED), so that calls that never send cannot
 * hold the read slots: a health request is a few bytes. */
#define OPEN_READ_TIMEOUT_MS 2000
/* ... and a unary or server-streaming one after this long when a call of
 * another connection waits, so that a probe waits for at most about this
 * long per read slot (plus a tick) rather than OPEN_READ_TIMEOUT_MS for a
 * flooder's call that never sends: gRPC clients send the request of such a
 * call with the call, and a waiting call's request is already in
 * gradsyncd's stream window when its read begins. Not for streams: a
 * client may send a stream's messages later (measured: python3-grpcio's
 * reflection streams under load). */
#define OPEN_READ_YIELD_MS 250
/* Warnings about refused requests (one per call a peer makes): at most
 * this many a second, then one line saying how many were suppressed. */
#define MAX_REFUSAL_WARNINGS_PER_S 5

typedef enum {
  T_NEW,
  T_PAYLOAD,
  T_UNARY,
  T_START,
  T_RECV,
  T_SEND,
  T_STATUS,
  T_CLOSE,
  T_SHUTDOWN
} tag_kind;

typedef struct tag {
  tag_kind kind;
  struct gs__call *call;
} tag;

typedef struct out_node {
  grpc_byte_buffer *bb;
  size_t bytes;
  struct out_node *next;
} out_node;

/* One registered method. */
typedef struct method_slot {
  const gs__method *m;
  const gs__service *svc;
  void *handle; /* grpc_server_register_method */
} method_slot;

/* One call. Owned by the completion-queue thread. */
struct gs__call {
  gs__server *srv;
  int idx; /* into srv->methods, or GENERIC */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array req_md;
  grpc_call_details details; /* catch-all calls only */
  grpc_byte_buffer *payload; /* unary / server-streaming request, read after the auth check */
  uint8_t *req;
  size_t req_len;
  tag t_new, t_payload, t_unary, t_start, t_recv, t_send, t_status, t_close;
  int pending; /* batches started and not yet completed */
  int cancelled, closed;
  int opened;      /* on_call ran: on_close is owed (streams; unary calls that watch) */
  int close_armed; /* RECV_CLOSE_ON_SERVER started on its own (streams, watching unary) */
  int got_first;   /* bidi: the first message arrived */
  int answered;    /* unary: reply or fail sent */
  grpc_byte_buffer *resp_bb;
  grpc_slice status_details;
  int have_details;
  char *peer;
  void *data;
  /* streams */
  grpc_byte_buffer *recv_bb, *send_bb;
  out_node *q_head, *q_tail;
  size_t q_bytes;
  int send_busy, finishing, status_sent;
  grpc_status_code final_status;
  char *final_msg;
  /* open methods: waiting for a read slot (in its connection's FIFO), or
   * reading */
  int open_waiting, open_reading, open_cut;
  uint64_t open_read_since;
  struct open_peer *open_group;
  struct gs__call *open_prev, *open_next;
};

/* A peer host (gRPC's peer string without the port) with calls waiting
 * for a read slot. Owned by the server; freed when its last call leaves. */
typedef struct open_host {
  char *host;
  size_t n;            /* its waiting calls, all its connections */
  size_t conns;        /* its connections with waiting calls */
  uint64_t round;      /* the round in which it is served next (srv's open_round) */
  uint64_t conn_round; /* the round of its connection served last */
  struct open_host *prev, *next;
} open_host;

/* The open calls of one connection (gRPC's peer string: address and port)
 * that wait for a read slot, oldest first. Owned by the server; freed when
 * its last call leaves. */
typedef struct open_peer {
  char *peer;
  open_host *host;
  struct gs__call *head, *tail;
  size_t n;
  uint64_t round; /* the round in which it is served next among its host's (host's conn_round) */
  struct open_peer *prev, *next;
} open_peer;

struct gs__server {
  gs__server_opts o;
  char *listen;
  char *token;
  grpc_server *server;
  grpc_completion_queue *cq;
  method_slot methods[MAX_METHODS];
  size_t n_methods;
  const gs__service *services[MAX_SERVICES];
  size_t n_services;
  int started;
  int port;
  int shutting_down; /* shutdown began (the drain, then closing) */
  int closing;       /* the listener is closing: no more calls are requested */
  int shutdown_done;
  size_t live_calls;
  tag t_shutdown;
  gs__tls_files *tls; /* NULL: plaintext */
  /* open-method messages being read; the connections with calls waiting
   * for a read, in the order they joined */
  size_t open_reading, open_waiting, max_open_reads;
  gs__call *open_readers[MAX_OPEN_READS];
  open_peer *open_peers;
  open_host *open_hosts;
  uint64_t open_round; /* the round of the host served last */
  /* refusal warnings: the current one-second window */
  uint64_t warn_window_ms;
  unsigned warn_count, warn_suppressed;
};

static void call_request(gs__server *s, int idx);

/* ---- call plumbing ------------------------------------------------------ */

static const char *call_path(const gs__call *c) {
  return c->idx >= 0 ? c->srv->methods[c->idx].m->path : "(unknown method)";
}

static void start_batch(gs__call *c, const grpc_op *ops, size_t n, tag *t) {
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
  if (e != GRPC_CALL_OK) {
    /* Our own sequencing bug; nothing a peer can cause. */
    GS_LOG_ERROR("internal: grpc_call_start_batch(kind %d) on %s failed: %s", t->kind, call_path(c),
                 grpc_call_error_to_string(e));
    abort();
  }
  c->pending++;
}

static gs__call *call_new(gs__server *s, int idx) {
  gs__call *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->srv = s;
  c->idx = idx;
  grpc_metadata_array_init(&c->req_md);
  grpc_call_details_init(&c->details);
  c->t_new = (tag){T_NEW, c};
  c->t_payload = (tag){T_PAYLOAD, c};
  c->t_unary = (tag){T_UNARY, c};
  c->t_start = (tag){T_START, c};
  c->t_recv = (tag){T_RECV, c};
  c->t_send = (tag){T_SEND, c};
  c->t_status = (tag){T_STATUS, c};
  c->t_close = (tag){T_CLOSE, c};
  s->live_calls++;
  return c;
}

static void queue_drop(gs__call *c) {
  while (c->q_head) {
    out_node *n = c->q_head;
    c->q_head = n->next;
    grpc_byte_buffer_destroy(n->bb);
    free(n);
  }
  c->q_tail = NULL;
  c->q_bytes = 0;
}

static void call_free(gs__call *c) {
  gs__server *s = c->srv;
  queue_drop(c);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->resp_bb) grpc_byte_buffer_destroy(c->resp_bb);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->have_details) grpc_slice_unref(c->status_details);
  grpc_metadata_array_destroy(&c->req_md);
  grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  if (c->peer) gpr_free(c->peer);
  free(c->req);
  free(c->final_msg);
  s->live_calls--;
  free(c);
}

static void call_maybe_free(gs__call *c) {
  if (c->closed && c->pending == 0) call_free(c);
}

static int auth_ok(const gs__server *s, const gs__call *c) {
  if (!s->token || c->srv->methods[c->idx].m->auth == GS__AUTH_OPEN) return 1;
  const char *v = NULL;
  size_t n = 0;
  /* "Bearer " + token, compared over its whole length in constant time */
  if (!gs__md_view(&c->req_md, "authorization", &v, &n) || n < 7 || memcmp(v, "Bearer ", 7) != 0)
    return 0;
  return gs__token_equal(v + 7, n - 7, s->token, strlen(s->token));
}

static const char k_unauth[] =
    "missing or wrong job token: set GRADSYNC_JOB_TOKEN to the token gradsyncd was started with";

/* Says how many refusal warnings the window that ended suppressed. */
static void warn_flush(gs__server *s, uint64_t now) {
  if (now - s->warn_window_ms < 1000) return;
  if (s->warn_suppressed)
    GS_LOG_WARN("suppressed %u similar warnings about refused requests in the last %.1f s",
                s->warn_suppressed, (double)(now - s->warn_window_ms) / 1000.0);
  s->warn_window_ms = now;
  s->warn_count = 0;
  s->warn_suppressed = 0;
}

/* A request refused by a limit: logged, at most MAX_REFUSAL_WARNINGS_PER_S
 * a second, so that a flood of them cannot flood the log. */
static void warn_refused(gs__call *c, const char *msg) {
  gs__server *s = c->srv;
  warn_flush(s, gs__now_ms());
  if (s->warn_count >= MAX_REFUSAL_WARNINGS_PER_S) {
    s->warn_suppressed++;
    return;
  }
  s->warn_count++;
  GS_LOG_WARN("%s (from %s)", msg, gs__call_peer(c));
}

/* ---- unary calls -------------------------------------------------------- */

static void unary_finish(gs__call *c, grpc_byte_buffer *resp, grpc_status_code code,
                         const char *msg) {
  if (c->answered) {
    GS_LOG_ERROR("internal: %s answered twice", call_path(c));
    if (resp) grpc_byte_buffer_destroy(resp);
    return;
  }
  c->answered = 1;
  c->opened = 0; /* a watching call is answered: no on_close */
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (resp) {
    c->resp_bb = resp;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = resp;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  if (msg) {
    c->status_details = grpc_slice_from_copied_string(msg);
    c->have_details = 1;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
  }
  n++;
  if (!c->close_armed) {
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
  }
  start_batch(c, ops, n, &c->t_unary);
}

void gs__call_reply(gs__call *c, const uint8_t *buf, size_t len) {
  unary_finish(c, gs__bb_from_bytes(buf, len), GRPC_STATUS_OK, NULL);
}

void gs__call_fail(gs__call *c, grpc_status_code code, const char *msg) {
  unary_finish(c, NULL, code, msg);
}

void gs__call_watch_close(gs__call *c) {
  if (c->answered || c->closed) return;
  if (c->close_armed) { /* armed while the call waited for a read slot */
    c->opened = 1;
    return;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  c->close_armed = 1;
  c->opened = 1;
  start_batch(c, &op, 1, &c->t_close);
}

/* ---- streams ------------------------------------------------------------ */

static void stream_maybe_send_status(gs__call *c) {
  if (!c->finishing || c->send_busy || c->status_sent || c->closed) return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  op.data.send_status_from_server.status = c->final_status;
  if (c->final_msg && c->final_msg[0]) {
    c->status_details = grpc_slice_from_copied_string(c->final_msg);
    c->have_details = 1;
    op.data.send_status_from_server.status_details = &c->status_details;
  }
  c->status_sent = 1;
  start_batch(c, &op, 1, &c->t_status);
}

void gs__call_finish(gs__call *c, grpc_status_code code, const char *msg) {
  if (c->finishing) return;
  c->finishing = 1;
  c->final_status = code;
  c->final_msg = msg ? strdup(msg) : NULL;
  stream_maybe_send_status(c);
}

static void stream_send_now(gs__call *c, grpc_byte_buffer *bb) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  c->send_bb = bb;
  c->send_busy = 1;
  start_batch(c, &op, 1, &c->t_send);
}

struct gs__msg_bytes {
  grpc_slice s; /* owns the bytes; each byte buffer made from it holds a ref */
};

gs__msg_bytes *gs__msg_bytes_wrap(uint8_t *buf, size_t len) {
  gs__msg_bytes *m = malloc(sizeof *m);
  if (!m) {
    free(buf);
    return NULL;
  }
  m->s = grpc_slice_new(buf, len, free);
  return m;
}

void gs__msg_bytes_release(gs__msg_bytes *m) {
  if (!m) return;
  grpc_slice_unref(m->s);
  free(m);
}

static int call_send_bb(gs__call *c, grpc_byte_buffer *bb, size_t len);

/* Only one SEND_MESSAGE may be in flight per call; the rest wait in a queue
 * whose size is bounded: a peer that stops reading is cut off rather than
 * growing the coordinator's memory. */
int gs__call_send(gs__call *c, const uint8_t *buf, size_t len) {
  if (c->closed || c->finishing) return -1;
  return call_send_bb(c, gs__bb_from_bytes(buf, len), len);
}

int gs__call_send_shared(gs__call *c, const gs__msg_bytes *m) {
  if (c->closed || c->finishing) return -1;
  grpc_slice s = m->s; /* the byte buffer takes its own reference */
  return call_send_bb(c, grpc_raw_byte_buffer_create(&s, 1), GRPC_SLICE_LENGTH(m->s));
}

static int call_send_bb(gs__call *c, grpc_byte_buffer *bb, size_t len) {
  if (!c->send_busy) {
    stream_send_now(c, bb);
    return 0;
  }
  size_t max = c->srv->methods[c->idx].m->max_queued_bytes;
  if (!max) max = DEFAULT_MAX_QUEUED;
  out_node *n = malloc(sizeof *n);
  if (!n || c->q_bytes + len > max) {
    free(n);
    grpc_byte_buffer_destroy(bb);
    queue_drop(c);
    gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "this client stopped reading its stream; gradsyncd cut it off");
    return -2;
  }
  n->bb = bb;
  n->bytes = len;
  n->next = NULL;
  if (c->q_tail)
    c->q_tail->next = n;
  else
    c->q_head = n;
  c->q_tail = n;
  c->q_bytes += len;
  return 0;
}

size_t gs__call_queued_bytes(const gs__call *c) {
  return c->q_bytes;
}

static void stream_arm_recv(gs__call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  start_batch(c, &op, 1, &c->t_recv);
}

/* Unary and server-streaming requests are read only once the call passed
 * the auth check (the methods are registered GRPC_SRM_PAYLOAD_NONE): a
 * caller without the token makes gradsyncd read none of its message. */
static void payload_arm(gs__call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  start_batch(c, &op, 1, &c->t_payload);
}

static int is_open(const gs__call *c) {
  return c->srv->methods[c->idx].m->auth == GS__AUTH_OPEN;
}

static int is_bidi(const gs__call *c) {
  return c->srv->methods[c->idx].m->kind == GS__RPC_BIDI;
}

static void stream_arm_recv(gs__call *c);

static void open_read_start(gs__call *c) {
  gs__server *s = c->srv;
  for (size_t i = 0; i < MAX_OPEN_READS; i++) {
    if (s->open_readers[i]) continue;
    s->open_readers[i] = c;
    s->open_reading++;
    c->open_reading = 1;
    c->open_cut = 0;
    c->open_read_since = gs__now_ms();
    if (is_bidi(c))
      stream_arm_recv(c);
    else
      payload_arm(c);
    return;
  }
  GS_LOG_ERROR("internal: no free open read slot");
  abort();
}

static open_peer *open_peer_find(gs__server *s, const char *peer);

/* Cuts off the open calls whose message has not arrived OPEN_READ_TIMEOUT_MS
 * after its read began (the first or only message of a call at once, a
 * stream's later one only while other calls wait: a reflection client may
 * pause between questions while nobody needs the slot), or
 * OPEN_READ_YIELD_MS after it (not streams) while a call of another
 * connection waits.
 * Their slots free when the read completes. */
static void open_reads_check(gs__server *s, uint64_t now) {
  for (size_t i = 0; i < MAX_OPEN_READS; i++) {
    gs__call *c = s->open_readers[i];
    if (!c || c->open_cut) continue;
    uint64_t held = now - c->open_read_since;
    int timed_out = held >= OPEN_READ_TIMEOUT_MS && (!c->got_first || s->open_waiting);
    if (!timed_out) {
      if (is_bidi(c) || held < OPEN_READ_YIELD_MS || !s->open_peers) continue;
      /* another connection waits: any but this call's own */
      const open_peer *own = open_peer_find(s, gs__call_peer(c));
      if (own && own == s->open_peers && !own->next) continue;
    }
    c->open_cut = 1;
    char msg[400];
    if (!timed_out)
      snprintf(msg, sizeof msg,
               "the request of this %s call did not arrive within %d ms while calls of other "
               "connections waited; gradsyncd reads only %zu requests of open calls (health "
               "checks, reflection) at once and cut this one off; send the request with the call "
               "and try again",
               call_path(c), OPEN_READ_YIELD_MS, s->max_open_reads);
    else if (c->got_first)
      snprintf(msg, sizeof msg,
               "the next message of this %s stream did not arrive within %d ms while other open "
               "calls waited; gradsyncd reads only %zu messages of open calls (health checks, "
               "reflection) at once and cut this one off; open a new stream to ask again",
               call_path(c), OPEN_READ_TIMEOUT_MS, s->max_open_reads);
    else
      snprintf(msg, sizeof msg,
               "the request of this %s call did not arrive within %d ms; gradsyncd reads only %zu "
               "requests of open calls (health checks) at once and cut this one off",
               call_path(c), OPEN_READ_TIMEOUT_MS, s->max_open_reads);
    warn_refused(c, msg);
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
  }
}

static open_peer *open_peer_find(gs__server *s, const char *peer) {
  for (open_peer *p = s->open_peers; p; p = p->next)
    if (strcmp(p->peer, peer) == 0) return p;
  return NULL;
}

/* "ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1", "ipv6:[::1]:5000" ->
 * "ipv6:[::1]" (also %5B..%5D): the peer without a trailing ":PORT";
 * anything else (unix:PATH) whole. At most outlen - 1 bytes. */
static void peer_host(const char *peer, char *out, size_t outlen) {
  size_t n = strlen(peer);
  const char *colon = strrchr(peer, ':');
  if ((strncmp(peer, "ipv4:", 5) == 0 || strncmp(peer, "ipv6:", 5) == 0) && colon &&
      colon > peer + 4 && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
    n = (size_t)(colon - peer);
  if (n >= outlen) n = outlen - 1;
  memcpy(out, peer, n);
  out[n] = 0;
}

static open_host *open_host_find(gs__server *s, const char *host) {
  for (open_host *h = s->open_hosts; h; h = h->next)
    if (strcmp(h->host, host) == 0) return h;
  return NULL;
}

/* The host with the most waiting calls; the connection of host h with
 * most (at most MAX_OPEN_QUEUED of them: the scans are bounded). */
static open_host *open_host_largest(gs__server *s) {
  open_host *big = NULL;
  for (open_host *h = s->open_hosts; h; h = h->next)
    if (!big || h->n > big->n) big = h;
  return big;
}

static open_peer *open_peer_largest(gs__server *s, const open_host *h) {
  open_peer *big = NULL;
  for (open_peer *p = s->open_peers; p; p = p->next)
    if (p->host == h && (!big || p->n > big->n)) big = p;
  return big;
}

static void open_unlink(gs__call *c) {
  gs__server *s = c->srv;
  open_peer *p = c->open_group;
  if (c->open_prev)
    c->open_prev->open_next = c->open_next;
  else
    p->head = c->open_next;
  if (c->open_next)
    c->open_next->open_prev = c->open_prev;
  else
    p->tail = c->open_prev;
  c->open_prev = c->open_next = NULL;
  c->open_group = NULL;
  c->open_waiting = 0;
  s->open_waiting--;
  open_host *h = p->host;
  h->n--;
  if (--p->n) return;
  /* its last call left: the connection leaves the rounds */
  if (p->prev)
    p->prev->next = p->next;
  else
    s->open_peers = p->next;
  if (p->next) p->next->prev = p->prev;
  free(p->peer);
  free(p);
  if (--h->conns) return;
  /* ... and its host's last connection: the host leaves them */
  if (h->prev)
    h->prev->next = h->next;
  else
    s->open_hosts = h->next;
  if (h->next) h->next->prev = h->prev;
  free(h->host);
  free(h);
}

/* The call read next: of the host with the earliest round (the one that
 * joined first of those), of its connection with the earliest round among
 * its own (likewise), the oldest waiting call; host and connection then
 * wait for their next rounds. A host that joins takes the current round: it
 * is served after the others of that round, before those served in it
 * already, so a probe from another host waits for at most one read of each
 * other host, also when a flooder opens new connections; a connection
 * joins its host's rounds alike. Scans of at most MAX_OPEN_QUEUED. */
static gs__call *open_next_waiting(gs__server *s) {
  open_host *h = NULL;
  for (open_host *q = s->open_hosts; q; q = q->next)
    if (!h || q->round < h->round) h = q;
  if (!h) return NULL;
  open_peer *p = NULL;
  for (open_peer *q = s->open_peers; q; q = q->next)
    if (q->host == h && (!p || q->round < p->round)) p = q;
  s->open_round = h->round++;
  h->conn_round = p->round++;
  gs__call *c = p->head;
  open_unlink(c);
  return c;
}

/* An open call that finds the queue full (or no memory to queue it) is
 * refused unread. */
static void open_refuse(gs__call *c) {
  gs__server *s = c->srv;
  char msg[300];
  snprintf(msg, sizeof msg,
           "gradsyncd reads at most %zu requests of open calls (health checks) at once and "
           "queues %d more; this %s call was refused unread; try again",
           s->max_open_reads, MAX_OPEN_QUEUED, call_path(c));
  warn_refused(c, msg);
  if (s->methods[c->idx].m->kind == GS__RPC_UNARY)
    unary_finish(c, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
  else
    gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
}

/* Queues c at the end of its connection's FIFO; a new host joins the
 * current round, after the hosts already in the list, a new connection its
 * host's current round likewise (open_next_waiting). Returns -1 (nothing
 * queued) when out of memory. */
static int open_enqueue(gs__call *c, open_peer *p) {
  gs__server *s = c->srv;
  if (!p) {
    char name[256];
    peer_host(gs__call_peer(c), name, sizeof name);
    open_host *h = open_host_find(s, name);
    if (!h) {
      h = calloc(1, sizeof *h);
      if (!h || !(h->host = strdup(name))) {
        free(h);
        return -1;
      }
      open_host *lasth = s->open_hosts;
      while (lasth && lasth->next) lasth = lasth->next;
      h->prev = lasth;
      if (lasth)
        lasth->next = h;
      else
        s->open_hosts = h;
      h->round = s->open_round;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->peer = strdup(gs__call_peer(c)))) {
      free(p);
      if (!h->conns) { /* it came for this connection only */
        if (h->prev)
          h->prev->next = h->next;
        else
          s->open_hosts = h->next;
        free(h->host);
        free(h);
      }
      return -1;
    }
    p->host = h;
    h->conns++;
    p->round = h->conn_round;
    open_peer *last = s->open_peers;
    while (last && last->next) last = last->next;
    p->prev = last;
    if (last)
      last->next = p;
    else
      s->open_peers = p;
  }
  c->open_group = p;
  c->open_prev = p->tail;
  if (p->tail)
    p->tail->open_next = c;
  else
    p->head = c;
  p->tail = c;
  p->n++;
  p->host->n++;
  c->open_waiting = 1;
  s->open_waiting++;
  return 0;
}

/* The next message of a call that passed the auth check is read: at once
 * for the token methods; for the open methods (every message of a
 * reflection stream, too), while fewer than max_open_reads are being read,
 * else when its connection's turn comes, or refused when MAX_OPEN_QUEUED
 * wait already and its connection has as many waiting as any other. A
 * peer without the token thus makes gRPC hold at most max_open_reads
 * messages, whoever else floods, and a flood costs other connections at
 * most one read each of the flooder's in turn. */
static void read_request(gs__call *c) {
  gs__server *s = c->srv;
  if (!is_open(c)) {
    if (is_bidi(c))
      stream_arm_recv(c);
    else
      payload_arm(c);
    return;
  }
  if (s->open_reading < s->max_open_reads) {
    open_read_start(c);
    return;
  }
  open_peer *p = open_peer_find(s, gs__call_peer(c));
  if (s->open_waiting >= MAX_OPEN_QUEUED) {
    /* Full: the host with most waiting calls pays (its connection with
     * most), unless it is this one's (or no larger than it); then this
     * host's connection with most, unless it is this one (or no larger). */
    char name[256];
    peer_host(gs__call_peer(c), name, sizeof name);
    const open_host *mh = p ? p->host : open_host_find(s, name);
    const open_host *bigh = open_host_largest(s);
    open_peer *big = NULL;
    if (bigh && bigh != mh && bigh->n > (mh ? mh->n : 0) + 1)
      big = open_peer_largest(s, bigh);
    else if (mh && (big = open_peer_largest(s, mh)) && big->n <= (p ? p->n : 0) + 1)
      big = NULL;
    if (!big) {
      open_refuse(c);
      return;
    }
    gs__call *victim = big->tail;
    open_unlink(victim);
    /* big keeps calls (it had more than this connection + 1: p is not big)
     * and so does its host: p and its host stay valid */
    open_refuse(victim);
  }
  if (!c->close_armed) {
    /* the cancel signal, so that a call that gives up leaves the queue */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->close_armed = 1;
    start_batch(c, &op, 1, &c->t_close);
  }
  if (open_enqueue(c, p) != 0) open_refuse(c);
}

/* An open-method message was read (or its call ended): the next waiting
 * one is read. */
static void open_read_done(gs__call *c) {
  gs__server *s = c->srv;
  if (!c->open_reading) return;
  c->open_reading = 0;
  s->open_reading--;
  for (size_t i = 0; i < MAX_OPEN_READS; i++)
    if (s->open_readers[i] == c) s->open_readers[i] = NULL;
  gs__call *next = open_next_waiting(s);
  if (next) open_read_start(next);
}

static size_t request_limit(const gs__method *m) {
  return m->max_request_bytes ? m->max_request_bytes : GS__DEFAULT_MAX_REQUEST;
}

/* The request of a unary or server-streaming call arrived (or not): judged
 * by its length, copied, handed to the method. */
static void payload_ready(gs__call *c, int ok) {
  const method_slot *ms = &c->srv->methods[c->idx];
  int unary = ms->m->kind == GS__RPC_UNARY;
  grpc_status_code code = GRPC_STATUS_OK;
  char msg[300] = "";
  size_t limit = request_limit(ms->m);
  open_read_done(c);
  if (!ok || !c->payload) {
    code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, sizeof msg, "request message missing");
  } else if (grpc_byte_buffer_length(c->payload) > limit) {
    code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, sizeof msg,
             "the request of a %s call (%zu bytes) exceeds the limit of %zu bytes; refused "
             "without reading it",
             call_path(c), grpc_byte_buffer_length(c->payload), limit);
    warn_refused(c, msg);
  } else if (gs__bb_to_bytes(c->payload, &c->req, &c->req_len) != 0) {
    code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, sizeof msg, "out of memory reading the request");
  }
  if (c->payload) {
    grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
  }
  if (!unary && c->closed) return; /* the peer went away meanwhile: nothing was opened */
  if (code != GRPC_STATUS_OK) {
    if (unary)
      unary_finish(c, NULL, code, msg);
    else
      gs__call_finish(c, code, msg);
    return;
  }
  if (!unary) c->opened = 1;
  ms->m->on_call(ms->svc->svc, c);
}

static void stream_begin(gs__call *c) {
  gs__server *s = c->srv;
  const method_slot *ms = &s->methods[c->idx];
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER; /* the cancel / disconnect signal */
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  c->close_armed = 1;
  start_batch(c, &op, 1, &c->t_close);
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  start_batch(c, &op, 1, &c->t_start);
  if (!auth_ok(s, c)) {
    gs__call_finish(c, GRPC_STATUS_UNAUTHENTICATED, k_unauth);
    return;
  }
  if (ms->m->kind == GS__RPC_SERVER_STREAM) {
    read_request(c); /* opened in payload_ready */
    return;
  }
  read_request(c);
  c->opened = 1;
  ms->m->on_call(ms->svc->svc, c);
}

/* ---- dispatcher --------------------------------------------------------- */

static void on_new_call(gs__call *c) {
  gs__server *s = c->srv;
  if (c->idx == GENERIC) {
    char *m = grpc_slice_to_c_string(c->details.method);
    GS_LOG_DEBUG("unknown method %s -> UNIMPLEMENTED", m);
    gpr_free(m);
    unary_finish(c, NULL, GRPC_STATUS_UNIMPLEMENTED, "method not implemented by gradsyncd");
    return;
  }
  const method_slot *ms = &s->methods[c->idx];
  if (ms->m->kind != GS__RPC_UNARY) {
    stream_begin(c);
    return;
  }
  if (!auth_ok(s, c)) {
    unary_finish(c, NULL, GRPC_STATUS_UNAUTHENTICATED, k_unauth);
    return;
  }
  /* The payload can be NULL: the client half-closed without a message. */
  read_request(c);
}

static void notify_close(gs__call *c) {
  if (!c->opened) return;
  c->opened = 0;
  const method_slot *ms = &c->srv->methods[c->idx];
  if (ms->m->on_close) ms->m->on_close(ms->svc->svc, c, c->cancelled);
}

static void on_event(gs__server *s, tag *t, int ok) {
  gs__call *c = t->call;
  if (t->kind == T_SHUTDOWN) {
    s->shutdown_done = 1;
    return;
  }
  c->pending--;
  switch (t->kind) {
  case T_NEW:
    if (!ok) { /* the server is shutting down: no call materialised */
      call_free(c);
      return;
    }
    if (!s->closing) call_request(s, c->idx); /* also while draining */
    on_new_call(c);
    break;
  case T_PAYLOAD:
    payload_ready(c, ok);
    break;
  case T_UNARY:
    if (!c->close_armed) c->closed = 1; /* RECV_CLOSE_ON_SERVER was part of the batch */
    break;
  case T_START:
  case T_STATUS:
    break;
  case T_RECV: {
    open_read_done(c);
    /* The first message (before it, nobody is known) and every later one
     * have their own limits: an oversized one is refused by its length,
     * before it is copied or decoded. */
    const gs__method *m = s->methods[c->idx].m;
    size_t limit = c->got_first ? m->max_request_bytes : m->max_first_message;
    if (ok && c->recv_bb && limit && grpc_byte_buffer_length(c->recv_bb) > limit) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "%s of a %s call (%zu bytes) exceeds the limit of %zu bytes; refused without "
               "reading it",
               c->got_first ? "a message" : "the first message", call_path(c),
               grpc_byte_buffer_length(c->recv_bb), limit);
      warn_refused(c, msg);
      grpc_byte_buffer_destroy(c->recv_bb);
      c->recv_bb = NULL;
      gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
      break;
    }
    if (ok && c->recv_bb) {
      c->got_first = 1;
      uint8_t *buf = NULL;
      size_t len = 0;
      int rc = 0, copied = 0;
      grpc_byte_buffer *bb = c->recv_bb;
      if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
          bb->data.raw.slice_buffer.count == 1) {
        /* One uncompressed slice (every small message): read it in place,
         * no copy and no allocation per message. Through a pointer to the
         * byte buffer's own slice: a slice of a few bytes keeps them inline
         * in the struct, so a copy of the struct would leave buf pointing
         * into a local that ends with this block. */
        grpc_slice *sl = &bb->data.raw.slice_buffer.slices[0];
        buf = GRPC_SLICE_START_PTR(*sl);
        len = GRPC_SLICE_LENGTH(*sl);
      } else {
        rc = gs__bb_to_bytes(bb, &buf, &len);
        copied = 1;
      }
      if (rc == 0) {
        const method_slot *ms = &s->methods[c->idx];
        if (c->opened && !c->finishing) ms->m->on_message(ms->svc->svc, c, buf, len);
        if (copied) free(buf);
      }
      grpc_byte_buffer_destroy(bb);
      c->recv_bb = NULL;
      if (rc != 0) {
        gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory reading a message");
      }
      if (!c->closed && !c->finishing) read_request(c);
    } else {
      /* The peer half-closed (or the call failed). */
      const method_slot *ms = &s->methods[c->idx];
      if (c->opened && !c->finishing) ms->m->on_message(ms->svc->svc, c, NULL, 0);
      gs__call_finish(c, GRPC_STATUS_OK, NULL);
    }
    break;
  }
  case T_SEND:
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    c->send_busy = 0;
    if (ok && c->q_head && !c->closed) {
      out_node *n = c->q_head;
      c->q_head = n->next;
      if (!c->q_head) c->q_tail = NULL;
      c->q_bytes -= n->bytes;
      grpc_byte_buffer *bb = n->bb;
      free(n);
      stream_send_now(c, bb);
    } else {
      stream_maybe_send_status(c);
    }
    break;
  case T_CLOSE:
    c->closed = 1;
    if (c->open_waiting) open_unlink(c);
    queue_drop(c);
    notify_close(c);
    break;
  case T_SHUTDOWN:
    break;
  }
  call_maybe_free(c);
}

static void call_request(gs__server *s, int idx) {
  gs__call *c = call_new(s, idx);
  if (!c) {
    GS_LOG_ERROR("out of memory arming a call for %s",
                 idx >= 0 ? s->methods[idx].m->path : "unknown methods");
    return;
  }
  grpc_call_error e;
  c->pending = 1;
  if (idx == GENERIC) {
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->req_md, s->cq, s->cq,
                                 &c->t_new);
  } else {
    e = grpc_server_request_registered_call(s->server, s->methods[idx].handle, &c->call,
                                            &c->deadline, &c->req_md, NULL, s->cq, s->cq,
                                            &c->t_new);
  }
  if (e != GRPC_CALL_OK) {
    GS_LOG_ERROR("internal: request call failed: %s", grpc_call_error_to_string(e));
    c->pending = 0;
    call_free(c);
  }
}

/* ---- call accessors ----------------------------------------------------- */

void gs__call_request(const gs__call *c, const uint8_t **buf, size_t *len) {
  *buf = c->req;
  *len = c->req_len;
}

int gs__call_metadata(const gs__call *c, const char *key, char *out, size_t outlen) {
  return gs__md_get(&c->req_md, key, out, outlen);
}

const char *gs__call_peer(gs__call *c) {
  if (!c->peer && c->call) c->peer = grpc_call_get_peer(c->call);
  return c->peer ? c->peer : "";
}

const gs__method *gs__call_method(const gs__call *c) {
  return c->idx >= 0 ? c->srv->methods[c->idx].m : NULL;
}

void gs__call_set_data(gs__call *c, void *data) {
  c->data = data;
}

void *gs__call_data(const gs__call *c) {
  return c->data;
}

/* ---- lifecycle ---------------------------------------------------------- */

int gs__server_create(const gs__server_opts *o, gs__server **out, char *err, size_t errlen) {
  *out = NULL;
  gs__server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory creating the server");
    return GS__ERR_NO_MEMORY;
  }
  s->o = *o;
  s->t_shutdown = (tag){T_SHUTDOWN, NULL};
  s->listen = strdup(o->listen ? o->listen : "127.0.0.1:0");
  if (o->token && *o->token) s->token = strdup(o->token);
  s->o.listen = s->listen;
  s->o.token = s->token;

  grpc_init();
  /* What a peer can make gRPC hold before a call reaches us (and so before
   * the token is checked): the connections' buffers under one memory quota,
   * streams per connection, header bytes; messages are read only after
   * the auth check (payload_arm), each judged by its method's limit. */
  grpc_resource_quota *quota = NULL;
  if (o->grpc_memory_max_bytes) {
    quota = grpc_resource_quota_create("gradsyncd");
    grpc_resource_quota_resize(quota, o->grpc_memory_max_bytes);
  }
  grpc_arg args[] = {
      gs__int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)GS__MAX_MESSAGE),
      gs__int_arg(GRPC_ARG_MAX_METADATA_SIZE, MAX_METADATA_BYTES),
      gs__int_arg(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                  o->max_streams_per_connection > 0 ? o->max_streams_per_connection : INT_MAX),
      gs__int_arg(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
      /* workers ping every couple of seconds: allow it */
      gs__int_arg(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500),
      gs__int_arg(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0),
      gs__int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, 5000),
      /* The BDP probe grows every stream's window, also of a stream whose
       * message nobody asked for (an open call waiting for a read slot:
       * measured 2.7 MB held per unread 16 MiB message after 18 s, and
       * growing; 64 KiB without it). A stream being read gets a window
       * for its whole message anyway. */
      gs__int_arg(GRPC_ARG_HTTP2_BDP_PROBE, 0),
      /* a second coordinator on the same port must fail, not share it */
      gs__int_arg(GRPC_ARG_ALLOW_REUSEPORT, 0),
      /* last: only with a quota */
      {.type = GRPC_ARG_POINTER,
       .key = (char *)GRPC_ARG_RESOURCE_QUOTA,
       .value.pointer = {quota, grpc_resource_quota_arg_vtable()}},
  };
  grpc_channel_args ca = {sizeof args / sizeof *args - (quota ? 0 : 1), args};
  s->server = grpc_server_create(&ca, NULL);
  if (quota) grpc_resource_quota_unref(quota); /* the server holds its own reference */
  size_t reads =
      o->grpc_memory_max_bytes ? o->grpc_memory_max_bytes / OPEN_READ_QUOTA_SHARE : MAX_OPEN_READS;
  s->max_open_reads = reads < 1 ? 1 : reads > MAX_OPEN_READS ? MAX_OPEN_READS : reads;
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  *out = s;
  return GS__OK;
}

int gs__server_add_service(gs__server *s, const gs__service *svc) {
  if (s->started || s->n_services == MAX_SERVICES || s->n_methods + svc->n_methods > MAX_METHODS) {
    GS_LOG_ERROR("internal: cannot add service %s (%s)", svc->name,
                 s->started ? "server already started" : "too many services or methods");
    return GS__ERR_INVALID_ARG;
  }
  for (size_t i = 0; i < svc->n_methods; i++) {
    const gs__method *m = &svc->methods[i];
    method_slot *ms = &s->methods[s->n_methods++];
    ms->m = m;
    ms->svc = svc;
    /* Every request is read by the transport, after the auth check. */
    ms->handle = grpc_server_register_method(s->server, m->path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
  }
  s->services[s->n_services++] = svc;
  return GS__OK;
}

/* Server credentials: TLS (mTLS with a client CA) from PEM files that a
 * reload can replace (tls_files.h), or plaintext. */
static int server_credentials(gs__server *s, grpc_server_credentials **out, char *err,
                              size_t errlen) {
  *out = NULL;
  if (!s->o.tls_cert) {
    *out = grpc_insecure_server_credentials_create();
    return GS__OK;
  }
  char about[512];
  int rc = gs__tls_files_create(s->o.tls_cert, s->o.tls_key, s->o.tls_client_ca, &s->tls, about,
                                sizeof about, err, errlen);
  if (rc) return rc;
  *out = gs__tls_files_credentials(s->tls);
  if (!*out) {
    snprintf(err, errlen, "gRPC refused the TLS files (--tls-cert %s, --tls-key %s)", s->o.tls_cert,
             s->o.tls_key);
    return GS__ERR_INVALID_ARG;
  }
  GS_LOG_INFO("TLS: %s (--tls-cert %s); SIGHUP reloads the TLS files", about, s->o.tls_cert);
  return GS__OK;
}

int gs__server_reload_tls(gs__server *s, char *about, size_t aboutlen, char *err, size_t errlen) {
  if (!s->tls) {
    snprintf(err, errlen,
             "gradsyncd serves without TLS (no --tls-cert/--tls-key): there are no TLS files to "
             "reload; TLS can only be turned on by a restart");
    return GS__ERR_UNSUPPORTED;
  }
  return gs__tls_files_reload(s->tls, about, aboutlen, err, errlen);
}

int gs__server_start(gs__server *s, char *err, size_t errlen) {
  grpc_server_credentials *creds = NULL;
  int rc = server_credentials(s, &creds, err, errlen);
  if (rc) return rc;
  s->port = grpc_server_add_http2_port(s->server, s->listen, creds);
  grpc_server_credentials_release(creds);
  if (s->port == 0) {
    snprintf(err, errlen,
             "cannot listen on %s (address in use or not an address of this host); pick another "
             "--listen address",
             s->listen);
    return GS__ERR_INVALID_ARG;
  }
  grpc_server_start(s->server);
  s->started = 1;
  for (int m = 0; m < (int)s->n_methods; m++)
    for (int k = 0; k < REQUESTS_PER_METHOD; k++) call_request(s, m);
  call_request(s, GENERIC);
  return GS__OK;
}

int gs__server_port(const gs__server *s) {
  return s->port;
}

int gs__server_shutting_down(const gs__server *s) {
  return s->shutting_down;
}

static void drain(gs__server *s, int ms) {
  grpc_event ev = grpc_completion_queue_next(s->cq, gs__deadline_ms(ms), NULL);
  if (ev.type == GRPC_OP_COMPLETE) on_event(s, ev.tag, ev.success);
}

static void tick_all(gs__server *s) {
  uint64_t now = gs__now_ms();
  for (size_t i = 0; i < s->n_services; i++)
    if (s->services[i]->tick) s->services[i]->tick(s->services[i]->svc, now);
}

/* The event loop's timing (gs__server_run). */
typedef struct loop {
  uint64_t period, next_tick;
  int caught_up;
} loop;

/* One pass of the event loop: a tick when it is due, else a wait of at
 * most one period for events. */
static void loop_once(gs__server *s, loop *l) {
  uint64_t now = gs__now_ms();
  if (now >= l->next_tick && now - l->next_tick > LATE_TICK_MS && !l->caught_up) {
    /* The events already in the queue (below) are not all there is: the
     * peers' messages of the pause are still in the sockets, and only a
     * wait with a deadline reads them. A rank silent through our own
     * pause is not a silent rank. */
    GS_LOG_INFO("the event loop did not run for %.1f s; reading what the ranks sent meanwhile "
                "before checking liveness",
                (double)(now - l->next_tick + l->period) / 1000.0);
    l->next_tick = now + CATCH_UP_MS;
    l->caught_up = 1;
    return;
  }
  if (now >= l->next_tick) {
    l->caught_up = 0;
    /* Read what already waits in the queue first: after a long pass the
     * ranks' heartbeats are there, and a tick before them would take
     * healthy ranks for silent ones. Bounded, so that a flood cannot
     * starve the tick. */
    for (int k = 0; k < MAX_EVENTS_BEFORE_TICK; k++) {
      grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
      if (ev.type != GRPC_OP_COMPLETE) break;
      on_event(s, ev.tag, ev.success);
    }
    tick_all(s);
    warn_flush(s, gs__now_ms());
    open_reads_check(s, gs__now_ms());
    l->next_tick = gs__now_ms() + l->period;
    return;
  }
  /* At most one period per wait, also while catching up: a stop request
   * (SIGTERM) is seen within a period. */
  uint64_t wait = l->next_tick - now;
  drain(s, (int)(wait < l->period ? wait : l->period));
}

int gs__server_run(gs__server *s, gs__stop (*should_stop)(void *arg), void *arg) {
  loop l = {.period = DEFAULT_TICK_MS};
  for (size_t i = 0; i < s->n_services; i++)
    if (s->services[i]->tick && s->services[i]->tick_ms && s->services[i]->tick_ms < l.period)
      l.period = s->services[i]->tick_ms;
  l.next_tick = gs__now_ms() + l.period;
  gs__stop stop;
  while ((stop = should_stop(arg)) == GS__RUN_ON) loop_once(s, &l);

  /* Shutdown begins: the services stop taking work and end what runs. */
  uint64_t grace = (uint64_t)(s->o.shutdown_grace_ms > 0 ? s->o.shutdown_grace_ms : 0);
  uint64_t grace_end = gs__now_ms() + (grace ? grace : 2000);
  s->shutting_down = 1;
  for (size_t i = 0; i < s->n_services; i++)
    if (s->services[i]->shutdown) s->services[i]->shutdown(s->services[i]->svc);
  tick_all(s);

  /* The drain: the listener stays open, so that a health probe gets
   * NOT_SERVING and a rank that comes now is told that the coordinator is
   * shutting down, rather than finding the port closed; closing keeps
   * CLOSE_RESERVE_MS of the grace (half of a shorter one). */
  uint64_t reserve = grace / 2 < CLOSE_RESERVE_MS ? grace / 2 : CLOSE_RESERVE_MS;
  uint64_t drain_end = gs__now_ms() + (grace - reserve);
  if (stop == GS__STOP_DRAIN && grace > reserve) {
    GS_LOG_INFO("draining for %.1f s: health NOT_SERVING, new ranks refused; the listener closes "
                "after that (or at once on a second SIGTERM/SIGINT)",
                (double)(grace - reserve) / 1000.0);
    while (gs__now_ms() < drain_end) {
      if (should_stop(arg) == GS__STOP_NOW) {
        GS_LOG_INFO("ending the drain now");
        break;
      }
      loop_once(s, &l);
    }
  }

  /* Close: the last streams end, the listener closes, what is still open
   * at the end of the grace is cancelled. */
  s->closing = 1;
  for (size_t i = 0; i < s->n_services; i++)
    if (s->services[i]->close) s->services[i]->close(s->services[i]->svc);
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  int cancelled = 0;
  while (!s->shutdown_done || s->live_calls > 0) {
    if (!cancelled && gs__now_ms() >= grace_end) {
      grpc_server_cancel_all_calls(s->server);
      cancelled = 1;
    }
    drain(s, 50);
  }
  return 0;
}

void gs__server_destroy(gs__server *s) {
  if (!s) return;
  if (s->server) {
    if (!s->shutdown_done) {
      /* gs__server_run never ran: shut down here. */
      s->shutting_down = 1;
      for (size_t i = 0; s->started && i < s->n_services; i++)
        if (s->services[i]->shutdown) s->services[i]->shutdown(s->services[i]->svc);
      s->closing = 1;
      for (size_t i = 0; s->started && i < s->n_services; i++)
        if (s->services[i]->close) s->services[i]->close(s->services[i]->svc);
      grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
      grpc_server_cancel_all_calls(s->server);
      while (!s->shutdown_done || s->live_calls > 0) drain(s, 50);
    }
    grpc_server_destroy(s->server);
  }
  if (s->cq) {
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
  }
  /* gRPC's fetcher may be asked for a config until the listener is gone
   * with the server. */
  gs__tls_files_destroy(s->tls);
  free(s->listen);
  free(s->token);
  free(s);
  grpc_shutdown();
}
