/* The coordinator's gRPC transport (gRPC C core 1.51).
 *
 * One completion queue, drained by the thread in gs__server_run, which owns
 * every call object, the engine and the kv store: nothing here takes a lock
 * and nothing blocks. Periodic work (engine ticks, KvGet deadlines, the stop
 * check) runs when completion_queue_next returns on its deadline.
 *
 * Calls: Join and the Kv methods are unary (one batch with the reply and
 * RECV_CLOSE_ON_SERVER); Session is a bidi stream with RECV_CLOSE_ON_SERVER
 * as the disconnect signal, one RECV_MESSAGE kept armed, and one
 * SEND_MESSAGE in flight with a bounded queue behind it. A call is freed
 * when it is closed and none of its batches is pending. A catch-all request
 * answers unknown methods with UNIMPLEMENTED. */
#include "transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "clock.h"
#include "codec.h"
#include "engine.h"
#include "grpc_util.h"
#include "kv.h"
#include "log.h"
#include "status.h"

enum { M_JOIN, M_SESSION, M_KV_SET, M_KV_GET, M_KV_DELETE, M_COUNT, M_GENERIC = -1 };

static const struct {
  const char *path;
  int streaming;
} k_methods[M_COUNT] = {
    [M_JOIN] = {"/gradsync.v1.Coordinator/Join", 0},
    [M_SESSION] = {"/gradsync.v1.Coordinator/Session", 1},
    [M_KV_SET] = {"/gradsync.v1.Coordinator/KvSet", 0},
    [M_KV_GET] = {"/gradsync.v1.Coordinator/KvGet", 0},
    [M_KV_DELETE] = {"/gradsync.v1.Coordinator/KvDelete", 0},
};

#define REQUESTS_PER_METHOD 8
#define TICK_MS 50
#define MAX_QUEUED_BYTES ((size_t)256 << 20)

typedef enum { T_NEW, T_UNARY, T_START, T_RECV, T_SEND, T_STATUS, T_CLOSE, T_SHUTDOWN } tag_kind;

struct rpc;
typedef struct tag {
  tag_kind kind;
  struct rpc *rpc;
} tag;

typedef struct out_node {
  grpc_byte_buffer *bb;
  size_t bytes;
  struct out_node *next;
} out_node;

/* One call. Owned by the completion-queue thread. */
typedef struct rpc {
  gs__server *srv;
  int method;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array req_md;
  grpc_call_details details; /* catch-all calls only */
  grpc_byte_buffer *payload; /* unary request */
  tag t_new, t_unary, t_start, t_recv, t_send, t_status, t_close;
  int pending; /* batches started and not yet completed */
  int cancelled, closed;
  grpc_byte_buffer *resp_bb;
  grpc_slice status_details;
  int have_details;
  /* streams */
  grpc_byte_buffer *recv_bb, *send_bb;
  out_node *q_head, *q_tail;
  size_t q_bytes;
  int send_busy, finishing, status_sent;
  grpc_status_code final_status;
  char final_msg[GS__MAX_TEXT + 256];
  int32_t rank; /* session: -1 until hello */
  int left;     /* session: the rank sent a leave */
  /* KvGet waiting for its key */
  char *wait_key;
  uint64_t wait_until_ms;
  struct rpc *prev, *next; /* in sessions or waiters list */
} rpc;

struct gs__server {
  gs__server_opts o;
  char *token;
  grpc_server *server;
  grpc_completion_queue *cq;
  void *mh[M_COUNT];
  int port;
  gs__engine *engine;
  gs__kv_store *kv;
  gs__outbox box;
  rpc *sessions; /* streams of Session */
  rpc *waiters;  /* KvGet calls waiting for a key */
  int shutting_down;
  int shutdown_done;
  size_t live_rpcs;
  tag t_shutdown;
};

static void rpc_request(gs__server *s, int method);

/* ---- call plumbing ------------------------------------------------------ */

static void start_batch(rpc *r, const grpc_op *ops, size_t n, tag *t) {
  grpc_call_error e = grpc_call_start_batch(r->call, ops, n, t, NULL);
  if (e != GRPC_CALL_OK) {
    /* Our own sequencing bug; nothing a peer can cause. */
    GS_LOG_ERROR("internal: grpc_call_start_batch(kind %d) failed: %s", t->kind,
                 grpc_call_error_to_string(e));
    abort();
  }
  r->pending++;
}

static rpc *rpc_new(gs__server *s, int method) {
  rpc *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->srv = s;
  r->method = method;
  r->rank = -1;
  grpc_metadata_array_init(&r->req_md);
  grpc_call_details_init(&r->details);
  r->t_new = (tag){T_NEW, r};
  r->t_unary = (tag){T_UNARY, r};
  r->t_start = (tag){T_START, r};
  r->t_recv = (tag){T_RECV, r};
  r->t_send = (tag){T_SEND, r};
  r->t_status = (tag){T_STATUS, r};
  r->t_close = (tag){T_CLOSE, r};
  s->live_rpcs++;
  return r;
}

static void queue_drop(rpc *r) {
  while (r->q_head) {
    out_node *n = r->q_head;
    r->q_head = n->next;
    grpc_byte_buffer_destroy(n->bb);
    free(n);
  }
  r->q_tail = NULL;
  r->q_bytes = 0;
}

static void list_remove(rpc **head, rpc *r) {
  if (r->prev)
    r->prev->next = r->next;
  else if (*head == r)
    *head = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

static void list_push(rpc **head, rpc *r) {
  r->prev = NULL;
  r->next = *head;
  if (*head) (*head)->prev = r;
  *head = r;
}

static void rpc_free(rpc *r) {
  gs__server *s = r->srv;
  queue_drop(r);
  if (r->payload) grpc_byte_buffer_destroy(r->payload);
  if (r->resp_bb) grpc_byte_buffer_destroy(r->resp_bb);
  if (r->recv_bb) grpc_byte_buffer_destroy(r->recv_bb);
  if (r->send_bb) grpc_byte_buffer_destroy(r->send_bb);
  if (r->have_details) grpc_slice_unref(r->status_details);
  grpc_metadata_array_destroy(&r->req_md);
  grpc_call_details_destroy(&r->details);
  if (r->call) grpc_call_unref(r->call);
  free(r->wait_key);
  s->live_rpcs--;
  free(r);
}

static void rpc_maybe_free(rpc *r) {
  if (r->closed && r->pending == 0) rpc_free(r);
}

static int auth_ok(const gs__server *s, const rpc *r) {
  if (!s->token) return 1;
  char v[1024], want[1024];
  snprintf(want, sizeof want, "Bearer %s", s->token);
  return gs__md_get(&r->req_md, "authorization", v, sizeof v) && gs__secret_equal(v, want);
}

static const char k_unauth[] =
    "missing or wrong job token: set GRADSYNC_JOB_TOKEN to the token gradsyncd was started with";

/* ---- unary calls -------------------------------------------------------- */

static void unary_finish(rpc *r, grpc_byte_buffer *resp, grpc_status_code code, const char *msg) {
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (resp) {
    r->resp_bb = resp;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = resp;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  if (msg) {
    r->status_details = grpc_slice_from_copied_string(msg);
    r->have_details = 1;
    ops[n].data.send_status_from_server.status_details = &r->status_details;
  }
  n++;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &r->cancelled;
  start_batch(r, ops, n, &r->t_unary);
}

static void unary_reply_bytes(rpc *r, uint8_t *buf, size_t len, int rc) {
  if (rc != GS__OK) {
    unary_finish(r, NULL, GRPC_STATUS_INTERNAL, "coordinator could not encode its reply");
    return;
  }
  unary_finish(r, gs__bb_from_bytes(buf, len), GRPC_STATUS_OK, NULL);
  free(buf);
}

static grpc_status_code grpc_code_of(int status) {
  switch (status) {
  case GS__ERR_INVALID_ARG:
    return GRPC_STATUS_INVALID_ARGUMENT;
  case GS__ERR_ALREADY_JOINED:
    return GRPC_STATUS_ALREADY_EXISTS;
  case GS__ERR_ABORTED:
    return GRPC_STATUS_ABORTED;
  case GS__ERR_NO_MEMORY:
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case GS__ERR_UNAUTHENTICATED:
    return GRPC_STATUS_UNAUTHENTICATED;
  default:
    return GRPC_STATUS_INTERNAL;
  }
}

/* Reads the unary request payload into bytes; answers INVALID_ARGUMENT and
 * returns -1 when there is none. */
static int unary_payload(rpc *r, uint8_t **buf, size_t *len) {
  if (!r->payload || gs__bb_to_bytes(r->payload, buf, len) != 0) {
    unary_finish(r, NULL, GRPC_STATUS_INVALID_ARGUMENT, "request message missing or unreadable");
    return -1;
  }
  return 0;
}

static void handle_join(rpc *r) {
  gs__server *s = r->srv;
  uint8_t *buf;
  size_t len;
  char err[GS__MAX_TEXT];
  if (!auth_ok(s, r)) {
    unary_finish(r, NULL, GRPC_STATUS_UNAUTHENTICATED, k_unauth);
    return;
  }
  if (s->shutting_down) {
    unary_finish(r, NULL, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
    return;
  }
  if (unary_payload(r, &buf, &len)) return;
  gs__join_request req;
  int rc = gs__decode_join_request(buf, len, &req, err, sizeof err);
  free(buf);
  if (rc) {
    unary_finish(r, NULL, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  gs__join_response resp;
  rc = gs__engine_join(s->engine, &req, gs__now_ms(), &resp, err, sizeof err);
  if (rc) {
    GS_LOG_WARN("join refused: %s", err);
    unary_finish(r, NULL, grpc_code_of(rc), err);
    return;
  }
  GS_LOG_INFO("rank %d joined from %s (pid %d)", req.rank, req.host, req.pid);
  size_t olen;
  uint8_t *out = NULL;
  rc = gs__encode_join_response(&resp, &out, &olen);
  unary_reply_bytes(r, out, olen, rc);
}

static void kv_reply(rpc *r, gs__kv_kind kind, const gs__kv_msg *m) {
  uint8_t *out = NULL;
  size_t olen;
  int rc = gs__encode_kv(kind, m, &out, &olen);
  unary_reply_bytes(r, out, olen, rc);
}

/* Answers a KvGet with the stored value (found or not). */
static void kv_answer_get(rpc *r) {
  gs__kv_msg m = {0};
  size_t len = 0;
  const uint8_t *v = gs__kv_store_get(r->srv->kv, r->wait_key, &len);
  m.found = v != NULL;
  m.value = (uint8_t *)v;
  m.value_len = v ? len : 0;
  kv_reply(r, GS__KV_GET_RESP, &m);
}

static void handle_kv(rpc *r) {
  gs__server *s = r->srv;
  static const gs__kv_kind req_kind[M_COUNT] = {
      [M_KV_SET] = GS__KV_SET_REQ, [M_KV_GET] = GS__KV_GET_REQ, [M_KV_DELETE] = GS__KV_DELETE_REQ};
  uint8_t *buf;
  size_t len;
  char err[GS__MAX_TEXT];
  if (!auth_ok(s, r)) {
    unary_finish(r, NULL, GRPC_STATUS_UNAUTHENTICATED, k_unauth);
    return;
  }
  if (unary_payload(r, &buf, &len)) return;
  gs__kv_msg m;
  int rc = gs__decode_kv(req_kind[r->method], buf, len, &m, err, sizeof err);
  free(buf);
  if (rc) {
    unary_finish(r, NULL, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  gs__kv_msg reply = {0};
  switch (r->method) {
  case M_KV_SET:
    if (gs__kv_store_set(s->kv, m.key, m.value, m.value_len) != GS__OK) {
      unary_finish(r, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED, "coordinator out of memory");
      break;
    }
    kv_reply(r, GS__KV_SET_RESP, &reply);
    /* Wake the readers waiting for this key. */
    for (rpc *w = s->waiters, *next; w; w = next) {
      next = w->next;
      if (strcmp(w->wait_key, m.key) == 0) {
        list_remove(&s->waiters, w);
        kv_answer_get(w);
      }
    }
    break;
  case M_KV_GET: {
    size_t vlen;
    r->wait_key = m.key;
    m.key = NULL;
    if (gs__kv_store_get(s->kv, r->wait_key, &vlen) || m.wait_ms == 0 || s->shutting_down) {
      kv_answer_get(r);
    } else {
      r->wait_until_ms = gs__now_ms() + m.wait_ms;
      list_push(&s->waiters, r);
    }
    break;
  }
  case M_KV_DELETE:
    reply.deleted = gs__kv_store_delete(s->kv, m.key);
    kv_reply(r, GS__KV_DELETE_RESP, &reply);
    break;
  }
  gs__kv_msg_free(&m);
}

/* ---- streams ------------------------------------------------------------ */

static void stream_maybe_send_status(rpc *r) {
  if (!r->finishing || r->send_busy || r->status_sent || r->closed) return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  op.data.send_status_from_server.status = r->final_status;
  if (r->final_msg[0]) {
    r->status_details = grpc_slice_from_copied_string(r->final_msg);
    r->have_details = 1;
    op.data.send_status_from_server.status_details = &r->status_details;
  }
  r->status_sent = 1;
  start_batch(r, &op, 1, &r->t_status);
}

/* Ends the stream with code once the queued messages are sent. */
static void stream_finish(rpc *r, grpc_status_code code, const char *msg) {
  if (r->finishing) return;
  r->finishing = 1;
  r->final_status = code;
  snprintf(r->final_msg, sizeof r->final_msg, "%s", msg ? msg : "");
  stream_maybe_send_status(r);
}

static void stream_send_now(rpc *r, grpc_byte_buffer *bb) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = bb;
  r->send_bb = bb;
  r->send_busy = 1;
  start_batch(r, &op, 1, &r->t_send);
}

/* Takes ownership of bb. Only one SEND_MESSAGE may be in flight per call;
 * the rest wait in a queue whose size is bounded: a rank that stops reading
 * is cut off rather than growing the coordinator's memory. */
static void stream_send(rpc *r, grpc_byte_buffer *bb) {
  if (r->closed || r->finishing) {
    grpc_byte_buffer_destroy(bb);
    return;
  }
  if (!r->send_busy) {
    stream_send_now(r, bb);
    return;
  }
  size_t bytes = grpc_byte_buffer_length(bb);
  out_node *n = malloc(sizeof *n);
  if (!n || r->q_bytes + bytes > MAX_QUEUED_BYTES) {
    free(n);
    grpc_byte_buffer_destroy(bb);
    GS_LOG_ERROR("rank %d is not reading its session (%zu bytes queued); closing it", r->rank,
                 r->q_bytes);
    queue_drop(r);
    stream_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "this rank stopped reading its session stream; the coordinator cut it off");
    return;
  }
  n->bb = bb;
  n->bytes = bytes;
  n->next = NULL;
  if (r->q_tail)
    r->q_tail->next = n;
  else
    r->q_head = n;
  r->q_tail = n;
  r->q_bytes += bytes;
}

static void stream_arm_recv(rpc *r) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &r->recv_bb;
  start_batch(r, &op, 1, &r->t_recv);
}

static rpc *session_of_rank(gs__server *s, int32_t rank) {
  for (rpc *r = s->sessions; r; r = r->next)
    if (r->rank == rank) return r;
  return NULL;
}

/* Sends what the engine produced, in order. */
static void flush_outbox(gs__server *s) {
  for (size_t i = 0; i < s->box.n; i++) {
    gs__out *o = &s->box.items[i];
    if (o->kind == GS__OUT_LOG) {
      gs__log((gs__log_level)o->level, "%s", o->text ? o->text : "");
      continue;
    }
    if (o->kind == GS__OUT_CLOSE_RANK) {
      rpc *r = session_of_rank(s, o->rank);
      if (r) {
        r->rank = -1; /* the engine already counts it lost */
        list_remove(&s->sessions, r);
        char msg[GS__MAX_TEXT];
        snprintf(msg, sizeof msg, "the coordinator declared this rank lost: %s",
                 o->text ? o->text : "");
        stream_finish(r, GRPC_STATUS_UNAVAILABLE, msg);
      }
      continue;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (gs__encode_plan_msg(&o->msg, &buf, &len) != GS__OK) {
      GS_LOG_ERROR("internal: could not encode a message of kind %d", o->msg.kind);
      continue;
    }
    grpc_byte_buffer *bb = gs__bb_from_bytes(buf, len);
    free(buf);
    if (o->kind == GS__OUT_TO_RANK) {
      rpc *r = session_of_rank(s, o->rank);
      if (r)
        stream_send(r, bb);
      else
        grpc_byte_buffer_destroy(bb);
      continue;
    }
    for (rpc *r = s->sessions; r; r = r->next)
      if (r->rank >= 0) stream_send(r, grpc_byte_buffer_copy(bb));
    grpc_byte_buffer_destroy(bb);
  }
  gs__outbox_clear(&s->box);
}

/* The rank's stream is gone: tell the engine (once). */
static void session_gone(rpc *r, const char *detail) {
  gs__server *s = r->srv;
  if (r->rank < 0) return;
  int32_t rank = r->rank;
  r->rank = -1;
  list_remove(&s->sessions, r);
  if (!r->left) gs__engine_session_closed(s->engine, rank, detail, gs__now_ms(), &s->box);
  flush_outbox(s);
}

static void session_on_msg(rpc *r, const uint8_t *buf, size_t len) {
  gs__server *s = r->srv;
  char err[GS__MAX_TEXT];
  gs__rank_msg m;
  int rc = gs__decode_rank_msg(buf, len, &m, err, sizeof err);
  if (rc) {
    char msg[GS__MAX_TEXT + 64];
    snprintf(msg, sizeof msg, "malformed message from rank %d: %s", r->rank, err);
    GS_LOG_WARN("%s", msg);
    stream_finish(r, GRPC_STATUS_INVALID_ARGUMENT, msg);
    session_gone(r, msg);
    return;
  }
  if (r->rank < 0) {
    if (!m.has_hello) {
      stream_finish(r, GRPC_STATUS_FAILED_PRECONDITION,
                    "the first message of a session must say hello with the rank");
      goto out_free_msg;
    }
    rc = gs__engine_session_open(s->engine, m.hello_rank, gs__now_ms(), &s->box, err, sizeof err);
    if (rc) {
      GS_LOG_WARN("session refused: %s", err);
      stream_finish(r,
                    rc == GS__ERR_ALREADY_JOINED ? GRPC_STATUS_ALREADY_EXISTS
                                                 : GRPC_STATUS_FAILED_PRECONDITION,
                    err);
      goto out_free_msg;
    }
    r->rank = m.hello_rank;
    list_push(&s->sessions, r);
  }
  if (m.has_leave) r->left = 1;
  gs__engine_rank_message(s->engine, r->rank, &m, gs__now_ms(), &s->box);
  flush_outbox(s);
out_free_msg:
  gs__rank_msg_free(&m);
}

static void stream_begin(rpc *r) {
  gs__server *s = r->srv;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER; /* the cancel / disconnect signal */
  op.data.recv_close_on_server.cancelled = &r->cancelled;
  start_batch(r, &op, 1, &r->t_close);
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_INITIAL_METADATA;
  start_batch(r, &op, 1, &r->t_start);
  if (!auth_ok(s, r)) {
    stream_finish(r, GRPC_STATUS_UNAUTHENTICATED, k_unauth);
    return;
  }
  if (s->shutting_down) {
    stream_finish(r, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
    return;
  }
  stream_arm_recv(r);
}

/* ---- dispatcher --------------------------------------------------------- */

static void on_new_call(rpc *r) {
  gs__server *s = r->srv;
  switch (r->method) {
  case M_GENERIC: {
    char *m = grpc_slice_to_c_string(r->details.method);
    GS_LOG_DEBUG("unknown method %s -> UNIMPLEMENTED", m);
    gpr_free(m);
    unary_finish(r, NULL, GRPC_STATUS_UNIMPLEMENTED, "method not implemented by gradsyncd");
    break;
  }
  case M_JOIN:
    handle_join(r);
    break;
  case M_SESSION:
    stream_begin(r);
    break;
  default:
    handle_kv(r);
    break;
  }
  (void)s;
}

static void on_event(gs__server *s, tag *t, int ok) {
  rpc *r = t->rpc;
  if (t->kind == T_SHUTDOWN) {
    s->shutdown_done = 1;
    return;
  }
  r->pending--;
  switch (t->kind) {
  case T_NEW:
    if (!ok) { /* the server is shutting down: no call materialised */
      rpc_free(r);
      return;
    }
    if (!s->shutting_down) rpc_request(s, r->method);
    on_new_call(r);
    break;
  case T_UNARY:
    r->closed = 1; /* RECV_CLOSE_ON_SERVER was part of the batch */
    break;
  case T_START:
  case T_STATUS:
    break;
  case T_RECV:
    if (ok && r->recv_bb) {
      uint8_t *buf;
      size_t len;
      int rc = gs__bb_to_bytes(r->recv_bb, &buf, &len);
      grpc_byte_buffer_destroy(r->recv_bb);
      r->recv_bb = NULL;
      if (rc == 0) {
        session_on_msg(r, buf, len);
        free(buf);
      }
      if (!r->closed && !r->finishing) stream_arm_recv(r);
    } else {
      /* The rank half-closed (or the call failed). */
      session_gone(r, "its session stream ended without a leave message (the process exited or "
                      "crashed)");
      stream_finish(r, GRPC_STATUS_OK, NULL);
    }
    break;
  case T_SEND:
    grpc_byte_buffer_destroy(r->send_bb);
    r->send_bb = NULL;
    r->send_busy = 0;
    if (ok && r->q_head && !r->closed) {
      out_node *n = r->q_head;
      r->q_head = n->next;
      if (!r->q_head) r->q_tail = NULL;
      r->q_bytes -= n->bytes;
      grpc_byte_buffer *bb = n->bb;
      free(n);
      stream_send_now(r, bb);
    } else {
      stream_maybe_send_status(r);
    }
    break;
  case T_CLOSE:
    r->closed = 1;
    queue_drop(r);
    session_gone(r, r->cancelled ? "its connection dropped (the process died or the network "
                                   "failed)"
                                 : "its session ended without a leave message");
    break;
  case T_SHUTDOWN:
    break;
  }
  rpc_maybe_free(r);
}

static void rpc_request(gs__server *s, int method) {
  rpc *r = rpc_new(s, method);
  if (!r) {
    GS_LOG_ERROR("out of memory arming a call for %s",
                 method >= 0 ? k_methods[method].path : "unknown methods");
    return;
  }
  grpc_call_error e;
  r->pending = 1;
  if (method == M_GENERIC) {
    e = grpc_server_request_call(s->server, &r->call, &r->details, &r->req_md, s->cq, s->cq,
                                 &r->t_new);
  } else {
    e = grpc_server_request_registered_call(
        s->server, s->mh[method], &r->call, &r->deadline, &r->req_md,
        k_methods[method].streaming ? NULL : &r->payload, s->cq, s->cq, &r->t_new);
  }
  if (e != GRPC_CALL_OK) {
    GS_LOG_ERROR("internal: request call failed: %s", grpc_call_error_to_string(e));
    r->pending = 0;
    rpc_free(r);
  }
}

/* Periodic work: engine tick and KvGet deadlines. */
static void tick(gs__server *s) {
  uint64_t now = gs__now_ms();
  gs__engine_tick(s->engine, now, &s->box);
  flush_outbox(s);
  for (rpc *w = s->waiters, *next; w; w = next) {
    next = w->next;
    if (now >= w->wait_until_ms || s->shutting_down) {
      list_remove(&s->waiters, w);
      kv_answer_get(w);
    }
  }
}

/* ---- lifecycle ---------------------------------------------------------- */

int gs__server_create(const gs__server_opts *o, gs__server **out, char *err, size_t errlen) {
  *out = NULL;
  gs__server *s = calloc(1, sizeof *s);
  if (!s) return GS__ERR_NO_MEMORY;
  s->o = *o;
  s->t_shutdown = (tag){T_SHUTDOWN, NULL};
  if (o->token && *o->token) s->token = strdup(o->token);
  gs__engine_config ec;
  memset(&ec, 0, sizeof ec);
  ec.world_size = o->world_size;
  snprintf(ec.job_id, sizeof ec.job_id, "%s", o->job_id ? o->job_id : "");
  ec.job = o->job;
  ec.deadlock_warn_only = o->deadlock_warn_only;
  ec.policy = o->window_policy ? GS__POLICY_WINDOW : GS__POLICY_ADAPTIVE;
  ec.max_plans_in_flight = o->max_plans_in_flight;
  int rc = gs__engine_create(&ec, &s->engine);
  if (rc) {
    snprintf(err, errlen, "invalid world size %d (expected 0..%d)", o->world_size, GS__MAX_WORLD);
    free(s->token);
    free(s);
    return rc;
  }
  s->kv = gs__kv_store_create();

  grpc_init();
  grpc_arg args[] = {
      gs__int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20),
      gs__int_arg(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
      /* workers ping every couple of seconds: allow it */
      gs__int_arg(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500),
      gs__int_arg(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0),
      gs__int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, 5000),
  };
  grpc_channel_args ca = {sizeof args / sizeof *args, args};
  s->server = grpc_server_create(&ca, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  for (int m = 0; m < M_COUNT; m++)
    s->mh[m] = grpc_server_register_method(
        s->server, k_methods[m].path, NULL,
        k_methods[m].streaming ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
        0);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  s->port = grpc_server_add_http2_port(s->server, o->listen, creds);
  grpc_server_credentials_release(creds);
  if (s->port == 0) {
    snprintf(err, errlen,
             "cannot listen on %s (address in use or not an address of this host); pick another "
             "--listen address",
             o->listen);
    gs__server_destroy(s);
    return GS__ERR_INVALID_ARG;
  }
  grpc_server_start(s->server);
  for (int m = 0; m < M_COUNT; m++)
    for (int k = 0; k < REQUESTS_PER_METHOD; k++) rpc_request(s, m);
  rpc_request(s, M_GENERIC);
  *out = s;
  return GS__OK;
}

int gs__server_port(const gs__server *s) {
  return s->port;
}

static void drain(gs__server *s, int ms) {
  grpc_event ev = grpc_completion_queue_next(s->cq, gs__deadline_ms(ms), NULL);
  if (ev.type == GRPC_OP_COMPLETE) on_event(s, ev.tag, ev.success);
}

int gs__server_run(gs__server *s, int (*should_stop)(void *arg), void *arg) {
  /* The window policy emits every cycle time from the tick. */
  uint64_t period = TICK_MS, cycle = s->o.job.cycle_time_us / 1000u;
  if (s->o.window_policy && cycle < period) period = cycle ? cycle : 1;
  uint64_t next_tick = gs__now_ms() + period;
  while (!should_stop(arg)) {
    uint64_t now = gs__now_ms();
    if (now >= next_tick) {
      tick(s);
      next_tick = now + period;
      continue;
    }
    drain(s, (int)(next_tick - now));
  }
  GS_LOG_INFO("shutting down: closing %s sessions", s->sessions ? "open" : "no");
  s->shutting_down = 1;
  for (rpc *r = s->sessions; r; r = r->next)
    stream_finish(r, GRPC_STATUS_UNAVAILABLE,
                  "gradsyncd is shutting down (SIGTERM/SIGINT); the job cannot continue");
  tick(s); /* answers waiting KvGets */
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  uint64_t grace_end =
      gs__now_ms() + (uint64_t)(s->o.shutdown_grace_ms > 0 ? s->o.shutdown_grace_ms : 2000);
  int cancelled = 0;
  while (!s->shutdown_done || s->live_rpcs > 0) {
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
    if (!s->shutdown_done && s->port != 0) {
      /* gs__server_run never ran: shut down here. */
      grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
      grpc_server_cancel_all_calls(s->server);
      while (!s->shutdown_done || s->live_rpcs > 0) drain(s, 50);
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
  gs__outbox_free(&s->box);
  gs__engine_destroy(s->engine);
  gs__kv_store_destroy(s->kv);
  free(s->token);
  free(s);
  grpc_shutdown();
}
