/* The gradsync.v1.Coordinator service: Join (unary), Session (one bidi
 * stream per rank), KvSet / KvGet (waits with a deadline) / KvDelete.
 *
 * Who may do what (the transport has checked the job token already): Join
 * hands each rank a fresh identity secret and the job's ring key; the
 * Session hello must carry the secret of the rank it claims; KvSet and
 * KvDelete must carry some rank's identity, and a rank's own keys (its ring
 * address) only that rank's. Everything a peer controls is bounded: the
 * first Session message (64 KiB), kv keys and bytes, waiting KvGets (count
 * and wait), a joined rank's time to open its Session, and a session's
 * send queue (a rank cut off for not reading is a lost rank).
 *
 * Job lifecycle: a job is over when every rank left (finished) or the
 * engine aborted it (failed); once its sessions are closed (a failed job's
 * ranks get drain_ms) it is done: in one-job mode the outcome is final and
 * gradsyncd exits; with serve_forever the engine and kv store are reset
 * for the next job (epoch + 1). Joins in between get UNAVAILABLE.
 *
 * Owns the engine, the kv store, the open sessions and the waiting KvGets.
 * Runs on the transport's completion-queue thread only: it decodes, calls
 * the engine and sends what the engine returns, and never blocks. */
#include "coordinator.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "codec.h"
#include "handoff_trace.h"
#include "identity.h"
#include "kv.h"
#include "log.h"
#include "timeline.h"
#include "secret.h"
#include "status.h"

/* A Session's first message (the hello) may not be larger. */
#define MAX_FIRST_MESSAGE ((size_t)64 << 10)
/* KvGet: at most this many calls wait for keys at once, each at most this
 * long (a longer wait_ms is cut to it: the caller then sees "not found"). */
#define MAX_KV_WAITERS 4096
#define MAX_KV_WAIT_MS 600000u
#define DEFAULT_JOIN_TIMEOUT_MS 60000u

/* One rank's Session stream (the call's data). */
typedef struct session {
  gs__call *call;
  int32_t rank; /* -1 until hello, and once the engine was told it is gone */
  int left;     /* the rank sent a leave */
  int cut_off;  /* its send queue overflowed: to be reported lost */
  struct session *prev, *next;
} session;

/* A KvGet waiting for its key. */
typedef struct waiter {
  gs__call *call;
  char *key;
  uint64_t until_ms;
  struct waiter *prev, *next;
} waiter;

enum { M_JOIN, M_SESSION, M_KV_SET, M_KV_GET, M_KV_DELETE, M_COUNT };

struct gs__coordinator {
  gs__server *srv;
  gs__engine *engine;
  gs__kv_store *kv;
  gs__outbox box;
  session *sessions; /* open streams whose rank said hello */
  waiter *waiters;
  size_t nwaiters;
  size_t cut_offs; /* sessions cut off and not yet reported to the engine */
  gs__identities *ids;
  uint8_t ring_key[GS__SECRET_BYTES]; /* the job's data-plane key */
  uint64_t join_timeout_ms;
  gs__event_sink sink;
  void *sink_arg;
  gs__timeline *timeline; /* NULL when off */
  gs__method methods[M_COUNT];
  gs__service service;
  int serve_forever;
  uint32_t drain_ms;
  size_t kv_max_bytes, kv_max_keys; /* for the next job's kv store */
  gs__job_outcome over;             /* the current job ended this way (RUNNING: not yet) */
  uint64_t over_ms;                 /* when it ended */
  gs__job_outcome done;             /* one-job mode: final outcome once drained */
  int shutdown_closed;              /* the shutdown ended the running job's sessions */
};

static void flush_outbox(gs__coordinator *co);

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

static void reply_encoded(gs__call *c, uint8_t *buf, size_t len, int rc) {
  if (rc != GS__OK) {
    gs__call_fail(c, GRPC_STATUS_INTERNAL, "coordinator could not encode its reply");
    return;
  }
  gs__call_reply(c, buf, len);
  free(buf);
}

/* ---- Join --------------------------------------------------------------- */

/* Join and Session while shutdown drains (the listener is still open). */
static const char k_refuse_shutdown[] =
    "gradsyncd is shutting down (SIGTERM/SIGINT) and takes no new ranks; the job it served has "
    "ended: start the job again with a new coordinator";

static void on_join(void *arg, gs__call *c) {
  gs__coordinator *co = arg;
  const uint8_t *buf;
  size_t len;
  char err[GS__MAX_TEXT];
  if (gs__server_shutting_down(co->srv)) {
    gs__call_fail(c, GRPC_STATUS_UNAVAILABLE, k_refuse_shutdown);
    return;
  }
  if (co->over != GS__JOB_RUNNING) {
    char msg[GS__MAX_TEXT];
    snprintf(msg, sizeof msg, "the previous job %s; %s",
             co->over == GS__JOB_FINISHED ? "finished" : "failed",
             co->serve_forever ? "the next job starts once its ranks closed their sessions "
                                 "(retry in a moment)"
                               : "this coordinator served one job and is exiting: start a new "
                                 "gradsyncd for the next job, or run it with --serve-forever");
    gs__call_fail(c, GRPC_STATUS_UNAVAILABLE, msg);
    return;
  }
  gs__call_request(c, &buf, &len);
  gs__join_request req;
  int rc = gs__decode_join_request(buf, len, &req, err, sizeof err);
  if (rc) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  gs__join_response resp;
  memset(&resp, 0, sizeof resp);
  uint64_t now = gs__now_ms();
  rc = gs__engine_join(co->engine, &req, now, &resp, err, sizeof err);
  if (rc) {
    GS_LOG_WARN("join refused: %s", err);
    gs__call_fail(c, grpc_code_of(rc), err);
    return;
  }
  if (gs__identities_issue(co->ids, req.rank, now, resp.rank_secret) != GS__OK) {
    /* the engine counts the rank joined: release it again */
    gs__engine_session_closed(co->engine, req.rank, "the coordinator could not make its secret",
                              now, &co->box);
    flush_outbox(co);
    gs__call_fail(c, GRPC_STATUS_INTERNAL,
                  "the coordinator could not make this rank's identity secret (OpenSSL)");
    return;
  }
  memcpy(resp.ring_key, co->ring_key, sizeof resp.ring_key);
  snprintf(resp.version, sizeof resp.version, "%s", GS__VERSION);
  GS_LOG_INFO("rank %d joined from %s (pid %d, libgradsync %s)", req.rank, req.host, req.pid,
              req.version[0] ? req.version : "of unknown version");
  size_t olen;
  uint8_t *out = NULL;
  rc = gs__encode_join_response(&resp, &out, &olen);
  memset(&resp, 0, sizeof resp);
  reply_encoded(c, out, olen, rc);
}

/* ---- Kv ----------------------------------------------------------------- */

static void kv_reply(gs__call *c, gs__kv_kind kind, const gs__kv_msg *m) {
  uint8_t *out = NULL;
  size_t olen;
  int rc = gs__encode_kv(kind, m, &out, &olen);
  reply_encoded(c, out, olen, rc);
}

/* Answers a KvGet with the stored value (found or not). */
static void kv_answer_get(gs__coordinator *co, gs__call *c, const char *key) {
  gs__kv_msg m = {0};
  size_t len = 0;
  const uint8_t *v = gs__kv_store_get(co->kv, key, &len);
  m.found = v != NULL;
  m.value = (uint8_t *)v;
  m.value_len = v ? len : 0;
  kv_reply(c, GS__KV_GET_RESP, &m);
}

static int kv_decode(gs__call *c, gs__kv_kind kind, gs__kv_msg *m) {
  const uint8_t *buf;
  size_t len;
  char err[GS__MAX_TEXT];
  gs__call_request(c, &buf, &len);
  if (gs__decode_kv(kind, buf, len, m, err, sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return -1;
  }
  return 0;
}

static void waiter_unlink(gs__coordinator *co, waiter *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    co->waiters = w->next;
  if (w->next) w->next->prev = w->prev;
  co->nwaiters--;
}

/* Answers a waiting KvGet and frees its waiter. */
static void waiter_answer(gs__coordinator *co, waiter *w) {
  waiter_unlink(co, w);
  gs__call_set_data(w->call, NULL);
  kv_answer_get(co, w->call, w->key);
  free(w->key);
  free(w);
}

/* KvSet and KvDelete come from ranks of this job only, and a rank's own
 * keys (its ring address) from that rank only. 0, or -1 after refusing. */
static int kv_write_allowed(gs__coordinator *co, gs__call *c, const char *key) {
  char rank[16], secret[2 * GS__SECRET_BYTES + 2], err[GS__MAX_TEXT];
  int32_t who = -1, owner = gs__kv_key_owner(key);
  if (!gs__call_metadata(c, "gradsync-rank", rank, sizeof rank) ||
      !gs__call_metadata(c, "gradsync-rank-secret", secret, sizeof secret) ||
      !gs__identities_check_text(co->ids, rank, secret, &who))
    who = -1;
  if (who >= 0 && (owner < 0 || owner == who)) return 0;
  if (who < 0)
    snprintf(err, sizeof err,
             "writing rendezvous key '%.200s' needs a rank's identity (the secret from its Join); "
             "this call carries none that is valid",
             key);
  else
    snprintf(err, sizeof err,
             "rank %d may not write rendezvous key '%.200s': it belongs to rank %d", who, key,
             owner);
  GS_LOG_WARN("kv write refused: %s (from %s)", err, gs__call_peer(c));
  gs__call_fail(c, GRPC_STATUS_PERMISSION_DENIED, err);
  return -1;
}

/* KvSet and KvDelete during the drain: the job's sessions are ended, so no
 * rank can use what a write would leave (refused before the identity
 * check: the answer is the same for every caller). 0 when the write may
 * go on. */
static int kv_write_refused_draining(gs__coordinator *co, gs__call *c, const char *key,
                                     const char *done) {
  if (!gs__server_shutting_down(co->srv)) return 0;
  char err[GS__MAX_TEXT];
  snprintf(err, sizeof err,
           "gradsyncd is shutting down (SIGTERM/SIGINT) and takes no rendezvous writes; '%.200s' "
           "was not %s: the job it served has ended: start the job again with a new coordinator",
           key, done);
  gs__call_fail(c, GRPC_STATUS_UNAVAILABLE, err);
  return -1;
}

static void on_kv_set(void *arg, gs__call *c) {
  gs__coordinator *co = arg;
  gs__kv_msg m, reply = {0};
  char err[GS__MAX_TEXT];
  if (kv_decode(c, GS__KV_SET_REQ, &m)) return;
  if (kv_write_refused_draining(co, c, m.key, "stored") || kv_write_allowed(co, c, m.key))
    goto out_free_msg;
  if (gs__kv_store_set(co->kv, m.key, m.value, m.value_len, err, sizeof err) != GS__OK) {
    GS_LOG_WARN("kv write refused: %s (from %s)", err, gs__call_peer(c));
    gs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, err);
    goto out_free_msg;
  }
  kv_reply(c, GS__KV_SET_RESP, &reply);
  /* Wake the readers waiting for this key. */
  for (waiter *w = co->waiters, *next; w; w = next) {
    next = w->next;
    if (strcmp(w->key, m.key) == 0) waiter_answer(co, w);
  }
out_free_msg:
  gs__kv_msg_free(&m);
}

static void on_kv_get(void *arg, gs__call *c) {
  gs__coordinator *co = arg;
  gs__kv_msg m;
  size_t vlen;
  if (kv_decode(c, GS__KV_GET_REQ, &m)) return;
  waiter *w = NULL;
  if (gs__kv_store_get(co->kv, m.key, &vlen) || m.wait_ms == 0 ||
      gs__server_shutting_down(co->srv)) {
    kv_answer_get(co, c, m.key);
    gs__kv_msg_free(&m);
    return;
  }
  if (co->nwaiters >= MAX_KV_WAITERS || !(w = calloc(1, sizeof *w))) {
    char err[200];
    snprintf(err, sizeof err,
             "too many KvGet calls are waiting for keys (limit %d); try again when fewer wait",
             MAX_KV_WAITERS);
    gs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, err);
    gs__kv_msg_free(&m);
    return;
  }
  w->call = c;
  w->key = m.key;
  m.key = NULL;
  w->until_ms = gs__now_ms() + (m.wait_ms < MAX_KV_WAIT_MS ? m.wait_ms : MAX_KV_WAIT_MS);
  w->next = co->waiters;
  if (co->waiters) co->waiters->prev = w;
  co->waiters = w;
  co->nwaiters++;
  /* A caller that gives up frees its waiter at once (on_kv_get_close). */
  gs__call_set_data(c, w);
  gs__call_watch_close(c);
  gs__kv_msg_free(&m);
}

/* A waiting KvGet's caller gave up (deadline, cancel, gone). */
static void on_kv_get_close(void *arg, gs__call *c, int cancelled) {
  gs__coordinator *co = arg;
  waiter *w = gs__call_data(c);
  (void)cancelled;
  if (!w) return;
  gs__call_set_data(c, NULL);
  waiter_unlink(co, w);
  free(w->key);
  free(w);
}

static void on_kv_delete(void *arg, gs__call *c) {
  gs__coordinator *co = arg;
  gs__kv_msg m, reply = {0};
  if (kv_decode(c, GS__KV_DELETE_REQ, &m)) return;
  if (kv_write_refused_draining(co, c, m.key, "deleted") || kv_write_allowed(co, c, m.key))
    goto out_free_msg;
  reply.deleted = gs__kv_store_delete(co->kv, m.key);
  kv_reply(c, GS__KV_DELETE_RESP, &reply);
out_free_msg:
  gs__kv_msg_free(&m);
}

/* Answers the KvGets whose deadline passed (all of them when force). */
static void expire_waiters(gs__coordinator *co, uint64_t now, int force) {
  for (waiter *w = co->waiters, *next; w; w = next) {
    next = w->next;
    if (force || now >= w->until_ms) waiter_answer(co, w);
  }
}

/* ---- Session ------------------------------------------------------------ */

static void session_unlink(gs__coordinator *co, session *ss) {
  if (ss->prev)
    ss->prev->next = ss->next;
  else if (co->sessions == ss)
    co->sessions = ss->next;
  if (ss->next) ss->next->prev = ss->prev;
  ss->prev = ss->next = NULL;
}

static session *session_of_rank(gs__coordinator *co, int32_t rank) {
  for (session *ss = co->sessions; ss; ss = ss->next)
    if (ss->rank == rank) return ss;
  return NULL;
}

static void session_send(gs__coordinator *co, session *ss, const gs__msg_bytes *m) {
  if (gs__call_send_shared(ss->call, m) != -2 || ss->rank < 0 || ss->cut_off ||
      gs__server_shutting_down(co->srv))
    return;
  GS_LOG_ERROR("rank %d is not reading its session stream (its send queue overflowed); cutting "
               "it off",
               ss->rank);
  /* The engine hears of it once flush_outbox is done with its items. */
  ss->cut_off = 1;
  co->cut_offs++;
}

/* What a rank message means for the timeline: submissions (in full or by
 * cache id) and plans it finished. Before the engine sees the message,
 * so a cache id still resolves. */
static void timeline_rank_msg(gs__coordinator *co, int32_t rank, const gs__rank_msg *m) {
  uint64_t now = gs__now_us();
  /* Plans finished first: a rank with nothing else in flight reports them
   * with its next requests (worker/background.c), whose negotiation spans
   * begin after the plans' execution spans end. */
  if (m->ndone) {
    gs__engine_stats st;
    gs__engine_get_stats(co->engine, &st);
    for (size_t i = 0; i < m->ndone; i++)
      gs__timeline_done(co->timeline, m->done_plans[i], rank, st.connected, st.world_size, now);
  }
  for (size_t i = 0; i < m->nrequests; i++)
    gs__timeline_submit(co->timeline, m->requests[i].name, m->requests[i].op, rank, now);
  for (size_t i = 0; i < m->ncached; i++) {
    const gs__tensor_request *r = gs__engine_cached_request(co->engine, m->cached[i]);
    if (r) gs__timeline_submit(co->timeline, r->name, r->op, rank, now);
  }
}

/* The engine hears of it (no output: after a stop the fast path's marker
 * waits for the next event or tick, so this may run inside flush_outbox). */
static void timeline_stop(gs__coordinator *co, const char *why) {
  if (!co->timeline) return;
  char path[GS__DIAG_MAX_PATH];
  snprintf(path, sizeof path, "%s", gs__timeline_path(co->timeline));
  gs__engine_stats st;
  gs__engine_get_stats(co->engine, &st);
  uint64_t n = gs__timeline_stop(co->timeline, st.world_size, gs__now_us());
  co->timeline = NULL;
  gs__engine_set_timeline(co->engine, 0, gs__now_ms(), &co->box);
  GS_LOG_INFO("timeline %s stopped (%s): %llu events", path, why, (unsigned long long)n);
}

/* Sends what the engine produced, in order. */
static void session_gone(gs__coordinator *co, session *ss, const char *detail);

static void flush_outbox(gs__coordinator *co) {
  for (size_t i = 0; i < co->box.n; i++) {
    gs__out *o = &co->box.items[i];
    if (o->kind == GS__OUT_LOG) {
      if (o->level >= 0) gs__log((gs__log_level)o->level, "%s", o->text ? o->text : "");
      if (o->event && co->sink)
        co->sink(co->sink_arg, o->event, o->event_rank, o->text ? o->text : "");
      if (o->event == GS__EV_JOB_FINISHED) timeline_stop(co, "the job finished");
      continue;
    }
    if (o->kind == GS__OUT_CLOSE_RANK) {
      session *ss = session_of_rank(co, o->rank);
      if (ss) {
        ss->rank = -1; /* the engine already counts it lost */
        session_unlink(co, ss);
        char msg[GS__MAX_TEXT];
        snprintf(msg, sizeof msg, "the coordinator declared this rank lost: %s",
                 o->text ? o->text : "");
        gs__call_finish(ss->call, GRPC_STATUS_UNAVAILABLE, msg);
      }
      continue;
    }
    if (co->timeline && o->kind == GS__OUT_TO_ALL && o->msg.kind == GS__MSG_PLAN)
      gs__timeline_plan(co->timeline, &o->msg.plan, gs__now_us());
    uint8_t *buf = NULL;
    size_t len = 0;
    if (gs__encode_plan_msg(&o->msg, &buf, &len) != GS__OK) {
      GS_LOG_ERROR("internal: could not encode a message of kind %d", o->msg.kind);
      continue;
    }
    /* Encoded once; every stream's send shares these bytes. */
    gs__msg_bytes *mb = gs__msg_bytes_wrap(buf, len);
    if (!mb) {
      GS_LOG_ERROR("out of memory sending a message of kind %d", o->msg.kind);
      continue;
    }
    if (o->kind == GS__OUT_TO_RANK) {
      session *ss = session_of_rank(co, o->rank);
      if (ss) session_send(co, ss, mb);
    } else {
      for (session *ss = co->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (ss->rank >= 0) session_send(co, ss, mb);
      }
      if (o->msg.kind == GS__MSG_PLAN)
        GS_TRACE(GS__TR_CO_PLAN, o->msg.plan.seq,
                 o->msg.plan.nresponses ? o->msg.plan.responses[0].op : 0);
    }
    gs__msg_bytes_release(mb);
  }
  gs__outbox_clear(&co->box);
  /* Sessions cut off above are lost ranks: tell the engine now that the
   * outbox is empty (session_gone flushes what that produces). */
  while (co->cut_offs > 0) {
    co->cut_offs--;
    for (session *ss = co->sessions; ss; ss = ss->next) {
      if (ss->cut_off && ss->rank >= 0) {
        session_gone(co, ss,
                     "it stopped reading its session stream (more messages waited for it than "
                     "the send queue holds), so the coordinator cut it off");
        break;
      }
    }
  }
}

/* The rank's stream is gone: tell the engine (once). */
static void session_gone(gs__coordinator *co, session *ss, const char *detail) {
  if (ss->rank < 0) return;
  int32_t rank = ss->rank;
  ss->rank = -1;
  session_unlink(co, ss);
  gs__identities_forget(co->ids, rank);
  if (!ss->left) gs__engine_session_closed(co->engine, rank, detail, gs__now_ms(), &co->box);
  flush_outbox(co);
}

static void check_job(gs__coordinator *co, uint64_t now);

static void on_session_open(void *arg, gs__call *c) {
  gs__coordinator *co = arg;
  if (gs__server_shutting_down(co->srv)) {
    gs__call_finish(c, GRPC_STATUS_UNAVAILABLE, k_refuse_shutdown);
    return;
  }
  session *ss = calloc(1, sizeof *ss);
  if (!ss) {
    gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "coordinator out of memory");
    return;
  }
  ss->call = c;
  ss->rank = -1;
  gs__call_set_data(c, ss);
}

static void on_session_msg(void *arg, gs__call *c, const uint8_t *buf, size_t len) {
  gs__coordinator *co = arg;
  session *ss = gs__call_data(c);
  char err[GS__MAX_TEXT];
  if (!ss) return;
  if (!buf) { /* the rank half-closed */
    session_gone(co, ss,
                 "its session stream ended without a leave message (the process exited or "
                 "crashed)");
    return;
  }
  gs__rank_msg m;
  int rc = gs__decode_rank_msg(buf, len, &m, err, sizeof err);
  if (rc) {
    char msg[GS__MAX_TEXT + 64];
    snprintf(msg, sizeof msg, "malformed message from rank %d: %s", ss->rank, err);
    GS_LOG_WARN("%s", msg);
    gs__call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
    session_gone(co, ss, msg);
    return;
  }
  if (ss->rank < 0) {
    if (!m.has_hello) {
      gs__call_finish(c, GRPC_STATUS_FAILED_PRECONDITION,
                      "the first message of a session must say hello with the rank");
      goto out_free_msg;
    }
    if (!gs__identities_check(co->ids, m.hello_rank, m.hello_secret)) {
      /* Not the process that joined as that rank: refuse it and leave the
       * real rank alone. */
      snprintf(err, sizeof err,
               "session hello for rank %d refused: it does not carry the secret that rank got "
               "from Join (a second process claiming rank %d?); each process must join as its "
               "own rank",
               m.hello_rank, m.hello_rank);
      GS_LOG_WARN("%s (from %s)", err, gs__call_peer(c));
      gs__call_finish(c, GRPC_STATUS_PERMISSION_DENIED, err);
      goto out_free_msg;
    }
    rc = gs__engine_session_open(co->engine, m.hello_rank, gs__now_ms(), &co->box, err, sizeof err);
    if (rc) {
      GS_LOG_WARN("session refused: %s", err);
      gs__call_finish(c,
                      rc == GS__ERR_ALREADY_JOINED ? GRPC_STATUS_ALREADY_EXISTS
                                                   : GRPC_STATUS_FAILED_PRECONDITION,
                      err);
      goto out_free_msg;
    }
    ss->rank = m.hello_rank;
    gs__identities_session_opened(co->ids, ss->rank);
    ss->prev = NULL;
    ss->next = co->sessions;
    if (co->sessions) co->sessions->prev = ss;
    co->sessions = ss;
  }
  if (m.has_leave) ss->left = 1;
  GS_TRACE(GS__TR_CO_RECV, ss->rank, m.nrequests + m.ncached);
  if (co->timeline) timeline_rank_msg(co, ss->rank, &m);
  gs__engine_rank_message(co->engine, ss->rank, &m, gs__now_ms(), &co->box);
  flush_outbox(co);
  check_job(co, gs__now_ms());
out_free_msg:
  gs__rank_msg_free(&m);
}

static void on_session_close(void *arg, gs__call *c, int cancelled) {
  gs__coordinator *co = arg;
  session *ss = gs__call_data(c);
  if (!ss) return;
  session_gone(co, ss,
               cancelled ? "its connection dropped (the process died or the network failed)"
                         : "its session ended without a leave message");
  gs__call_set_data(c, NULL);
  free(ss);
  check_job(co, gs__now_ms());
}

/* ---- job lifecycle --------------------------------------------------------- */

/* Ends the sessions still open (the job is over) with why. */
static void close_sessions(gs__coordinator *co, const char *why) {
  for (session *ss = co->sessions, *next; ss; ss = next) {
    next = ss->next;
    ss->rank = -1;
    session_unlink(co, ss);
    gs__call_finish(ss->call, GRPC_STATUS_UNAVAILABLE, why);
  }
}

/* After every event: notices the end of the job, and once it is drained
 * makes it final (one job) or starts the next one (serve_forever). */
static void check_job(gs__coordinator *co, uint64_t now) {
  if (co->done != GS__JOB_RUNNING) return;
  gs__engine_stats st;
  gs__engine_get_stats(co->engine, &st);
  if (gs__server_shutting_down(co->srv)) return; /* stopped by a signal: not the job's end */
  if (co->over == GS__JOB_RUNNING) {
    if (st.aborted) {
      co->over = GS__JOB_FAILED;
      if (co->sessions)
        GS_LOG_ERROR("job (epoch %u) failed: every rank was told; waiting up to %u ms for the "
                     "remaining ranks to close their sessions",
                     st.epoch, co->drain_ms);
      else
        GS_LOG_ERROR("job (epoch %u) failed: every rank was told", st.epoch);
    } else if (st.world_size > 0 && st.left == st.world_size) {
      co->over = GS__JOB_FINISHED;
      GS_LOG_INFO("job (epoch %u) finished: all %d ranks left cleanly", st.epoch, st.world_size);
    } else {
      return;
    }
    co->over_ms = now;
  }
  if (co->sessions && now - co->over_ms < co->drain_ms) return;
  if (co->sessions)
    close_sessions(co, co->over == GS__JOB_FAILED
                           ? "the job failed and is over (see the abort before this)"
                           : "the job is over");
  expire_waiters(co, now, 1);
  if (!co->serve_forever) {
    co->done = co->over;
    return;
  }
  /* A fresh job: new engine state, kv store, rank identities and ring key
   * (nothing of the last job is valid for the next one). */
  uint32_t next = st.epoch + 1;
  gs__kv_store *kv = gs__kv_store_create(co->kv_max_bytes, co->kv_max_keys);
  gs__identities *ids = gs__identities_create();
  if (!kv || !ids || gs__random_bytes(co->ring_key, sizeof co->ring_key) != GS__OK ||
      gs__engine_reset(co->engine, next) != GS__OK) {
    /* Cannot start a fresh job: end like one-job mode, with the failure. */
    gs__kv_store_destroy(kv);
    gs__identities_destroy(ids);
    GS_LOG_ERROR("out of memory or randomness starting job epoch %u; exiting", next);
    co->serve_forever = 0;
    co->done = GS__JOB_FAILED;
    return;
  }
  gs__kv_store_destroy(co->kv);
  co->kv = kv;
  gs__identities_destroy(co->ids);
  co->ids = ids;
  co->over = GS__JOB_RUNNING;
  /* The fresh engine knows of no timeline: one still recording keeps the
   * next job off the fast path too (no output: not in fast mode). */
  if (co->timeline) gs__engine_set_timeline(co->engine, 1, now, &co->box);
  GS_LOG_INFO("--serve-forever: ready for the next job (epoch %u)", next);
}

gs__job_outcome gs__coordinator_outcome(const gs__coordinator *c) {
  return c->done;
}

int gs__coordinator_job_over(const gs__coordinator *c) {
  return c->over != GS__JOB_RUNNING || c->done != GS__JOB_RUNNING;
}

int gs__coordinator_draining(const gs__coordinator *c) {
  return gs__server_shutting_down(c->srv);
}

int gs__coordinator_sessions_closed_by_shutdown(const gs__coordinator *c) {
  return c->shutdown_closed;
}

/* ---- service ------------------------------------------------------------ */

static void coordinator_tick(void *arg, uint64_t now) {
  gs__coordinator *co = arg;
  if (gs__server_shutting_down(co->srv)) {
    /* The drain: the sessions are closed and the job is over; the engine,
     * not told of it, must not judge the ranks (silent, stalled) now. */
    expire_waiters(co, now, 1);
    return;
  }
  gs__engine_tick(co->engine, now, &co->box);
  flush_outbox(co);
  expire_waiters(co, now, gs__server_shutting_down(co->srv));
  /* A rank that joined and never opened its session frees its slot. */
  for (int32_t rank; (rank = gs__identities_overdue(co->ids, now, co->join_timeout_ms)) >= 0;) {
    char detail[200];
    snprintf(detail, sizeof detail,
             "it joined but opened no session within %.1f s (gradsyncd --join-timeout-ms)",
             (double)co->join_timeout_ms / 1000.0);
    gs__identities_forget(co->ids, rank);
    gs__engine_session_closed(co->engine, rank, detail, now, &co->box);
    flush_outbox(co);
  }
  check_job(co, now);
}

static void coordinator_shutdown(void *arg) {
  gs__coordinator *co = arg;
  gs__engine_set_draining(co->engine); /* no fast path from now on */
  timeline_stop(co, "gradsyncd is shutting down");
  if (co->done != GS__JOB_RUNNING) return; /* the job is over; its sessions are closed */
  GS_LOG_INFO("shutting down: closing %s sessions", co->sessions ? "open" : "no");
  co->shutdown_closed = 1;
  /* The ranks are told why; the engine is not (they are not lost). */
  close_sessions(co, "gradsyncd is shutting down (SIGTERM/SIGINT); the job cannot continue");
  expire_waiters(co, gs__now_ms(), 1);
}

int gs__coordinator_create(const gs__coordinator_opts *o, gs__server *s, gs__coordinator **out,
                           char *err, size_t errlen) {
  *out = NULL;
  gs__coordinator *co = calloc(1, sizeof *co);
  if (!co) {
    snprintf(err, errlen, "out of memory");
    return GS__ERR_NO_MEMORY;
  }
  co->srv = s;
  gs__engine_config ec;
  memset(&ec, 0, sizeof ec);
  ec.world_size = o->world_size;
  snprintf(ec.job_id, sizeof ec.job_id, "%s", o->job_id ? o->job_id : "");
  ec.job = o->job;
  ec.deadlock_warn_only = o->deadlock_warn_only;
  ec.policy = o->window_policy ? GS__POLICY_WINDOW : GS__POLICY_ADAPTIVE;
  ec.max_plans_in_flight = o->max_plans_in_flight;
  ec.max_pending_per_rank = o->max_pending_per_rank;
  ec.epoch = 1;
  ec.fast_path = o->fast_path;
  ec.fast_backoff_max = o->fast_path_backoff;
  co->serve_forever = o->serve_forever;
  co->drain_ms = o->drain_ms;
  co->kv_max_bytes = o->kv_max_bytes;
  co->kv_max_keys = o->kv_max_keys;
  int rc = gs__engine_create(&ec, &co->engine);
  if (rc) {
    snprintf(err, errlen, "invalid world size %d (expected 0..%d)", o->world_size, GS__MAX_WORLD);
    free(co);
    return rc;
  }
  co->kv = gs__kv_store_create(o->kv_max_bytes, o->kv_max_keys);
  co->ids = gs__identities_create();
  co->join_timeout_ms = o->join_timeout_ms ? (uint64_t)o->join_timeout_ms : DEFAULT_JOIN_TIMEOUT_MS;
  if (!co->kv || !co->ids || gs__random_bytes(co->ring_key, sizeof co->ring_key) != GS__OK) {
    snprintf(err, errlen, "out of memory or randomness (OpenSSL)");
    gs__kv_store_destroy(co->kv);
    gs__identities_destroy(co->ids);
    gs__engine_destroy(co->engine);
    free(co);
    return GS__ERR_NO_MEMORY;
  }
  co->methods[M_JOIN] = (gs__method){.path = "/gradsync.v1.Coordinator/Join",
                                     .kind = GS__RPC_UNARY,
                                     .auth = GS__AUTH_TOKEN,
                                     .on_call = on_join};
  co->methods[M_SESSION] = (gs__method){.path = "/gradsync.v1.Coordinator/Session",
                                        .kind = GS__RPC_BIDI,
                                        .auth = GS__AUTH_TOKEN,
                                        .on_call = on_session_open,
                                        .on_message = on_session_msg,
                                        .on_close = on_session_close,
                                        .max_first_message = MAX_FIRST_MESSAGE,
                                        .max_queued_bytes = o->session_queue_max_bytes};
  co->methods[M_KV_SET] =
      (gs__method){.path = "/gradsync.v1.Coordinator/KvSet",
                   .kind = GS__RPC_UNARY,
                   .auth = GS__AUTH_TOKEN,
                   .on_call = on_kv_set,
                   /* the largest key and value, and framing */
                   .max_request_bytes = GS__MAX_KV_KEY + GS__MAX_KV_VALUE + 1024};
  co->methods[M_KV_GET] = (gs__method){.path = "/gradsync.v1.Coordinator/KvGet",
                                       .kind = GS__RPC_UNARY,
                                       .auth = GS__AUTH_TOKEN,
                                       .on_call = on_kv_get,
                                       .on_close = on_kv_get_close};
  co->methods[M_KV_DELETE] = (gs__method){.path = "/gradsync.v1.Coordinator/KvDelete",
                                          .kind = GS__RPC_UNARY,
                                          .auth = GS__AUTH_TOKEN,
                                          .on_call = on_kv_delete};
  /* The window policy emits every cycle time from the tick. */
  uint32_t cycle_ms = o->job.cycle_time_us / 1000u;
  co->service = (gs__service){
      .name = "gradsync.v1.Coordinator",
      .methods = co->methods,
      .n_methods = M_COUNT,
      .svc = co,
      .tick = coordinator_tick,
      .tick_ms = o->window_policy ? (cycle_ms ? cycle_ms : 1) : 0,
      .shutdown = coordinator_shutdown,
  };
  *out = co;
  return GS__OK;
}

void gs__coordinator_set_event_sink(gs__coordinator *co, gs__event_sink fn, void *arg) {
  co->sink = fn;
  co->sink_arg = arg;
}

void gs__coordinator_abort(gs__coordinator *co, const char *reason) {
  gs__engine_abort(co->engine, reason, &co->box);
  flush_outbox(co);
}

int gs__coordinator_timeline_start(gs__coordinator *co, const char *path, char *err,
                                   size_t errlen) {
  gs__timeline *t = NULL;
  int rc = gs__timeline_start(path, &t, err, errlen);
  if (rc) return rc;
  timeline_stop(co, "replaced by a new timeline");
  co->timeline = t;
  GS_LOG_INFO("timeline started: %s", path);
  /* In fast mode the ranks are told to come back: a timeline sees every
   * request. */
  gs__engine_set_timeline(co->engine, 1, gs__now_ms(), &co->box);
  flush_outbox(co);
  return GS__OK;
}

int gs__coordinator_timeline_stop(gs__coordinator *co, char *path, size_t cap, uint64_t *events) {
  if (!co->timeline) return -1;
  snprintf(path, cap, "%s", gs__timeline_path(co->timeline));
  gs__engine_stats st;
  gs__engine_get_stats(co->engine, &st);
  *events = gs__timeline_stop(co->timeline, st.world_size, gs__now_us());
  co->timeline = NULL;
  gs__engine_set_timeline(co->engine, 0, gs__now_ms(), &co->box);
  GS_LOG_INFO("timeline %s stopped (StopTimeline): %llu events", path, (unsigned long long)*events);
  return 0;
}

int gs__coordinator_sessions(const gs__coordinator *co) {
  int n = 0;
  for (const session *ss = co->sessions; ss; ss = ss->next) n++;
  return n;
}

const gs__service *gs__coordinator_service(gs__coordinator *c) {
  return &c->service;
}

gs__engine *gs__coordinator_engine(gs__coordinator *c) {
  return c->engine;
}

void gs__coordinator_destroy(gs__coordinator *co) {
  if (!co) return;
  timeline_stop(co, "gradsyncd exits");
  for (waiter *w = co->waiters, *next; w; w = next) {
    next = w->next;
    free(w->key);
    free(w);
  }
  gs__outbox_free(&co->box);
  gs__engine_destroy(co->engine);
  gs__kv_store_destroy(co->kv);
  gs__identities_destroy(co->ids);
  memset(co->ring_key, 0, sizeof co->ring_key);
  free(co);
}
