/* The worker's comm thread: it sleeps on the session's completion queue
 * until something happens (a message from the coordinator, a finished
 * send, a kick from a thread that has work for it, or its own next due
 * time: a heartbeat or a change of the blocked-on set). It receives what
 * the coordinator sent (plans go to the exec thread's queue; aborts fail
 * the job and abort the backend, interrupting a running collective), then,
 * when no message is in flight, sends in one message the ops submitted
 * since, the numbers of the plans executed, the tensor names application
 * threads are blocked on when that set changed, and a heartbeat when one is
 * due. While a message is in flight, work accumulates and goes out together
 * when it completes (Nagle's rule): no clock on the critical path.
 *
 * Owns the client session; touches handles, the submission queue, the
 * waiter list and the plan queue only under ctx->mu. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "handoff_trace.h"
#include "log.h"
#include "status.h"
#include "worker.h"

/* A wait counts as blocked once it has lasted this long on ops that no plan
 * names yet: short enough to catch deadlocks fast, long enough that ordinary
 * waits during a step never show up. */
#define BLOCKED_GRACE_MS 50
/* An op no thread is inside a wait on still counts as blocked while some
 * thread waited on or tested it this recently: the gap between two timed
 * waits (gs_wait(h, 1000) in a loop) or two gs_test polls. */
#define BLOCKED_RECENT_MS 2000

void gs__handle_unref(struct gs_handle *h) {
  gs__handle_unref_n(h, 1);
}

void gs__handle_unref_n(struct gs_handle *h, int n) {
  /* Holding every reference left (refs == n, read with acquire order: the
   * other holders' writes, released by their own unrefs, are visible),
   * the caller frees without a locked read-modify-write: no one else
   * holds a reference, so no one can change refs (a reference is only
   * ever taken from one already held: the library's, while the op is in
   * a table or queue). The usual case of gs_handle_free, once per op. */
  if (atomic_load_explicit(&h->refs, memory_order_acquire) == n ||
      atomic_fetch_sub_explicit(&h->refs, n, memory_order_acq_rel) == n) {
    /* Mostly all NULL (a successful allreduce): no call for those. */
    if (h->error) free(h->error);
    if (h->result_free)
      h->result_free(h->result);
    else if (h->result)
      free(h->result);
    if (h->rank_dims) free(h->rank_dims);
    if (h->splits) free(h->splits);
    if (h->free_data) h->free_data(h->data);
    gs__handle_mem_free(h);
  }
}

void gs__plan_node_free(plan_node *n) {
  for (size_t i = 0; i < n->nops; i++)
    if (n->ops[i]) gs__handle_unref(n->ops[i]);
  free(n->ops);
  gs__plan_free(&n->plan);
  free(n);
}

int gs__comm_wake_locked(gs_ctx *ctx, int requests) {
  if (!ctx->comm_running || ctx->kicked || ctx->comm_send_busy) return 0;
  if (requests && ctx->comm_req_held) return 0; /* they go with the answer */
  ctx->kicked = 1;
  return 1;
}

void gs__comm_kick(gs_ctx *ctx) {
  gs__client_session_kick(ctx->client);
}

int gs__handle_waited_locked(gs_ctx *ctx, struct gs_handle *h, uint64_t now) {
  if (atomic_load_explicit(&h->done, memory_order_relaxed)) return 0;
  int kick = 0;
  if (!h->wait_since_ms) {
    h->wait_since_ms = now ? now : 1;
    h->wprev = NULL;
    h->wnext = ctx->waited;
    if (ctx->waited) ctx->waited->wprev = h;
    ctx->waited = h;
    /* This op may count as blocked from wait_since + the grace: make sure
     * the comm thread looks by then. Not for an op on the fast queue: the
     * coordinator runs no deadlock check in fast mode, a round with nothing
     * in common escalates at once (and the escalation's message carries
     * the blocked-on set), and a wake-up of the comm thread at every
     * step's first wait would cost the fast path a thread switch. */
    if (!h->planned && !h->fast && ctx->comm_next_ms > h->wait_since_ms + BLOCKED_GRACE_MS &&
        ctx->comm_running && !ctx->kicked) {
      ctx->kicked = 1;
      kick = 1;
    }
  }
  h->wait_last_ms = now;
  return kick;
}

/* Caller holds ctx->mu; wakes the waiting threads when wake is set.
 * Releases the library's reference (unless h is in a fast round: the
 * round releases it at its end, see gs_handle.round) and `extra` more of
 * the caller's (in one atomic), also when h was already complete (then
 * only those). */
static void complete_quiet_locked(gs_ctx *ctx, struct gs_handle *h, gs_status status,
                                  const char *msg, int wake, int extra) {
  if (atomic_load_explicit(&h->done, memory_order_relaxed)) {
    if (extra) gs__handle_unref_n(h, extra);
    return;
  }
  if (h->wait_since_ms) {
    if (h->wprev)
      h->wprev->wnext = h->wnext;
    else
      ctx->waited = h->wnext;
    if (h->wnext) h->wnext->wprev = h->wprev;
    h->wprev = h->wnext = NULL;
  }
  if (h->fast) { /* failed while on the fast queue (not in a round): unlink it */
    struct gs_handle **p = &ctx->fast_head, *prev = NULL;
    while (*p && *p != h) {
      prev = *p;
      p = &(*p)->next_submit;
    }
    if (*p) {
      *p = h->next_submit;
      if (ctx->fast_tail == h) ctx->fast_tail = prev;
      ctx->nfast--;
    }
    h->next_submit = NULL;
    h->fast = 0;
    h->planned = 1; /* never counted in nunplanned */
  }
  GS_TRACE(GS__TR_COMPLETE, h->req.op, 0);
  h->status = status;
  h->error = msg ? strdup(msg) : NULL;
  if (!h->planned) ctx->nunplanned--;
  gs__inflight_del_locked(ctx, h);
  int refs = !h->round + extra;
  atomic_store_explicit(&h->done, 1, memory_order_release);
  if (wake) pthread_cond_broadcast(&ctx->cv);
  if (refs) gs__handle_unref_n(h, refs);
}

/* Caller holds ctx->mu. */
static void complete_locked(gs_ctx *ctx, struct gs_handle *h, gs_status status, const char *msg) {
  complete_quiet_locked(ctx, h, status, msg, 1, 0);
}

void gs__handles_complete_ok(gs_ctx *ctx, struct gs_handle *const *hs, size_t n) {
  gs__handles_complete_ok_unref(ctx, hs, n, 0);
}

void gs__handles_complete_ok_unref(gs_ctx *ctx, struct gs_handle *const *hs, size_t n, int extra) {
  /* One lock and one wake-up for all: a thread waiting on them one after
   * another (gs_wait in a loop) then runs once, not once per handle. */
  pthread_mutex_lock(&ctx->mu);
  for (size_t i = 0; i < n; i++)
    if (hs[i]) complete_quiet_locked(ctx, hs[i], GS_OK, NULL, 0, extra);
  pthread_mutex_unlock(&ctx->mu);
  /* After unlocking: a waiter woken while mu is still held would only
   * block again on mu (one more sleep and wake-up on its way out). Every
   * waiter checks done under mu or by an acquire load, so none misses it. */
  pthread_cond_broadcast(&ctx->cv);
}

void gs__handles_complete_ok_unref_locked(gs_ctx *ctx, struct gs_handle *const *hs, size_t n,
                                          int extra) {
  for (size_t i = 0; i < n; i++)
    if (hs[i]) complete_quiet_locked(ctx, hs[i], GS_OK, NULL, 0, extra);
}

void gs__handle_complete(gs_ctx *ctx, struct gs_handle *h, gs_status status, const char *msg) {
  pthread_mutex_lock(&ctx->mu);
  complete_quiet_locked(ctx, h, status, msg, 0, 0);
  pthread_mutex_unlock(&ctx->mu);
  pthread_cond_broadcast(&ctx->cv); /* after unlocking: see gs__handles_complete_ok_unref */
}

void gs__handle_complete_ok_locked(gs_ctx *ctx, struct gs_handle *h) {
  complete_quiet_locked(ctx, h, GS_OK, NULL, 0, 0);
}

void gs__ctx_fail(gs_ctx *ctx, gs_status status, const char *msg) {
  pthread_mutex_lock(&ctx->mu);
  if (!ctx->fatal) {
    ctx->fatal = status;
    snprintf(ctx->fatal_msg, sizeof ctx->fatal_msg, "%s", msg);
  }
  ctx->sub_head = ctx->sub_tail = NULL;
  /* The fast queue's ops are failed below like every op in flight; a
   * round in progress finds fatal set and touches none of them. */
  for (struct gs_handle *f = ctx->fast_head; f; f = f->next_submit) {
    f->fast = 0;
    f->planned = 1; /* never counted in nunplanned */
  }
  ctx->fast_head = ctx->fast_tail = NULL;
  ctx->nfast = 0;
  ctx->fast = 0;
  struct gs_handle *h, *tmp;
  HASH_ITER(hh, ctx->inflight, h, tmp) complete_locked(ctx, h, ctx->fatal, ctx->fatal_msg);
  gs__wcache *c, *ctmp; /* and those listed in their cache entry (none leaves the cache) */
  HASH_ITER(hh_id, ctx->cache_by_id, c, ctmp) {
    if (c->inflight) complete_locked(ctx, c->inflight, ctx->fatal, ctx->fatal_msg);
  }
  pthread_cond_broadcast(&ctx->cv); /* waits, and the exec thread awaiting a verdict */
  gs__exec_bell_locked(ctx);
  pthread_cond_broadcast(&ctx->exec_cv);
  int kick = gs__comm_wake_locked(ctx, 0); /* the comm thread ends the session */
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
}

/* The job is over for this rank: fail everything and interrupt the data
 * plane (the first failure's message wins). */
static void fail_job(gs_ctx *ctx, gs_status status, const char *msg) {
  GS_LOG_ERROR("%s", msg);
  gs__ctx_fail(ctx, status, msg);
  gs__ctx_abort_backends(ctx);
}

void gs__ctx_abort_backends(gs_ctx *ctx) {
  for (int d = 0; d < GS__DEVICE_COUNT; d++)
    if (ctx->backends[d]) ctx->backends[d]->v->abort(ctx->backends[d]);
}

/* Forgets a cache entry (caller holds ctx->mu, or no other thread runs);
 * its op in flight, if any, goes to ctx->inflight (its name has no entry
 * any more). */
static void cache_drop(gs_ctx *ctx, gs__wcache *c) {
  struct gs_handle *h = c->inflight;
  if (h) {
    h->wc = NULL;
    gs__inflight_add_locked(ctx, h, NULL);
  }
  /* No prediction may lead to a freed entry (api.c, submit_find_locked). */
  if (c->seq_next) c->seq_next->seq_prev = NULL;
  if (c->seq_prev) c->seq_prev->seq_next = NULL;
  if (ctx->seq_last == c) ctx->seq_last = NULL;
  HASH_DELETE(hh_name, ctx->cache_by_name, c);
  HASH_DELETE(hh_id, ctx->cache_by_id, c);
  free(c);
}

/* Remembers that h's request is cached under id (replacing what the name
 * had). h is in flight (its hashv is its name's hash); a new entry
 * lists it (see gs__inflight_add_locked). Caller holds ctx->mu. */
static void cache_put(gs_ctx *ctx, uint32_t id, struct gs_handle *h) {
  const gs__tensor_request *req = &h->req;
  gs__wcache *c = NULL;
  /* Every plan names the cache id again: in steady state nothing changes,
   * which the id alone finds (no walk by name). */
  HASH_FIND(hh_id, ctx->cache_by_id, &id, sizeof id, c);
  if (c && gs__tensor_request_equal(&c->req, req)) {
    assert(h->wc == c); /* the entry of its name lists it */
    return;
  }
  if (c) cache_drop(ctx, c);
  c = NULL;
  HASH_FIND_BYHASHVALUE(hh_name, ctx->cache_by_name, req->name, h->name_len, h->hashv, c);
  if (c) cache_drop(ctx, c);
  if (!(c = aligned_alloc(_Alignof(gs__wcache), sizeof *c))) return; /* only a cache hit is lost */
  memset(c, 0, sizeof *c);
  c->id = id;
  c->req = *req;
  c->name_len = h->name_len;
  c->hashv = h->hashv;
  HASH_ADD_KEYPTR_BYHASHVALUE(hh_name, ctx->cache_by_name, c->req.name, c->name_len, c->hashv, c);
  HASH_ADD(hh_id, ctx->cache_by_id, id, sizeof c->id, c);
  /* The name had no entry (dropped above), so h is in ctx->inflight. */
  assert(!h->wc);
  gs__inflight_del_locked(ctx, h);
  gs__inflight_add_locked(ctx, h, c);
  ctx->live_dirty = 1; /* its fast-vector slot is computed on entering fast mode */
}

static void template_drop(gs_ctx *ctx, gs__wtemplate *t) {
  HASH_DEL(ctx->templates, t);
  gs__plan_free(&t->plan);
  free(t);
}

void gs__cache_clear(gs_ctx *ctx) {
  gs__wcache *c, *tmp;
  HASH_ITER(hh_id, ctx->cache_by_id, c, tmp) cache_drop(ctx, c);
  gs__wtemplate *t, *ttmp;
  HASH_ITER(hh, ctx->templates, t, ttmp) template_drop(ctx, t);
  free(ctx->live);
  ctx->live = NULL;
  ctx->nlive = ctx->live_cap = 0;
}

/* Applies the plan-template bookkeeping of a plan: forgets, fills in a
 * replayed plan's responses, remembers a new template. Returns non-zero
 * when a replay names a template this rank does not have. */
static int apply_templates(gs_ctx *ctx, gs__plan *plan) {
  for (size_t i = 0; i < plan->nforget; i++) {
    gs__wtemplate *t = NULL;
    HASH_FIND(hh, ctx->templates, &plan->forget_templates[i], sizeof(uint32_t), t);
    if (t) template_drop(ctx, t);
  }
  if (plan->replay_of) {
    pthread_mutex_lock(&ctx->mu);
    ctx->stats.plans_replayed++;
    pthread_mutex_unlock(&ctx->mu);
    gs__wtemplate *t = NULL;
    HASH_FIND(hh, ctx->templates, &plan->replay_of, sizeof plan->replay_of, t);
    gs__plan copy;
    if (!t || gs__plan_copy_responses(&t->plan, &copy) != 0) return -1;
    plan->responses = copy.responses;
    plan->nresponses = copy.nresponses;
  }
  if (plan->template_id) {
    gs__wtemplate *t = NULL;
    HASH_FIND(hh, ctx->templates, &plan->template_id, sizeof plan->template_id, t);
    if (t) template_drop(ctx, t);
    t = calloc(1, sizeof *t);
    if (t && gs__plan_copy_responses(plan, &t->plan) == 0) {
      t->id = plan->template_id;
      HASH_ADD(hh, ctx->templates, id, sizeof t->id, t);
    } else {
      free(t); /* a later replay of it then fails the job clearly */
    }
  }
  return 0;
}

/* 1 when running plan node n needs no data plane: only errors, and
 * barriers of ops in flight (the exec thread completes those without a
 * backend, too; a barrier naming an op this rank never submitted is left
 * to it, which reports that as the gradsync bug it is). Caller holds
 * ctx->mu. */
static int control_only_locked(const plan_node *n) {
  size_t base = 0;
  for (size_t i = 0; i < n->plan.nresponses; i++) {
    const gs__response *r = &n->plan.responses[i];
    size_t at = base;
    base += r->ntensors;
    if (r->kind == GS__RESP_ERROR) continue;
    if (r->kind != GS__RESP_COLLECTIVE || r->op != GS__OP_BARRIER || !r->ntensors) return 0;
    const struct gs_handle *h = n->ops[at];
    if (!h || atomic_load_explicit(&h->done, memory_order_relaxed)) return 0;
  }
  return 1;
}

/* Queues a plan for the exec thread (or runs it here, see control_only);
 * marks the ops it names as planned so waits on them no longer count as
 * blocked, and learns the cache ids the coordinator assigned or withdrew. */
static void queue_plan(gs_ctx *ctx, gs__plan *plan) {
  if (apply_templates(ctx, plan)) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "internal: plan %llu replays template %u, which rank %d does not hold (a gradsync "
             "bug or out of memory; report it with the coordinator's log)",
             (unsigned long long)plan->seq, plan->replay_of, ctx->rank);
    fail_job(ctx, GS_ERR_INTERNAL, msg);
    return;
  }
  GS_TRACE(GS__TR_PLAN_RECV, plan->seq, plan->nresponses ? plan->responses[0].op : 0);
  plan_node *n = calloc(1, sizeof *n);
  if (!n) {
    fail_job(ctx, GS_ERR_NO_MEMORY, "out of memory queueing a plan");
    return;
  }
  n->plan = *plan;
  memset(plan, 0, sizeof *plan);
  size_t nops = 0;
  for (size_t i = 0; i < n->plan.nresponses; i++) nops += n->plan.responses[i].ntensors;
  if (nops && !(n->ops = calloc(nops, sizeof *n->ops))) {
    gs__plan_node_free(n); /* nops 0: no references yet */
    fail_job(ctx, GS_ERR_NO_MEMORY, "out of memory queueing a plan");
    return;
  }
  pthread_mutex_lock(&ctx->mu); /* application threads read the cache too */
  n->nops = nops;
  /* The one lookup by name of each tensor on this rank's side: the exec
   * thread (or this thread, below) takes the ops from n->ops. */
  size_t j = 0;
  for (size_t i = 0; i < n->plan.nresponses; i++)
    for (size_t k = 0; k < n->plan.responses[i].ntensors; k++, j++) {
      const gs__plan_tensor *t = &n->plan.responses[i].tensors[k];
      struct gs_handle *h = NULL;
      if (t->cache_id) /* also when this rank holds none */
        gs__live_add_locked(ctx, t->cache_id, &n->plan.responses[i], t);
      h = gs__inflight_find_str_locked(ctx, t->name);
      if (!h) continue;
      atomic_fetch_add_explicit(&h->refs, 1, memory_order_relaxed); /* the node's */
      n->ops[j] = h;
      if (!h->planned) ctx->nunplanned--;
      h->planned = 1;
      if (t->cache_id) cache_put(ctx, t->cache_id, h);
    }
  /* The evictions after the assignments: the engine assigns the plan's ids
   * one after another, and a cache smaller than the plan evicts some of
   * them within the same plan (ids are never reused). */
  for (size_t i = 0; i < n->plan.nevicted; i++) {
    gs__wcache *c = NULL;
    HASH_FIND(hh_id, ctx->cache_by_id, &n->plan.evicted[i], sizeof(uint32_t), c);
    if (c) cache_drop(ctx, c);
    gs__live_del_locked(ctx, n->plan.evicted[i]);
  }
  /* A plan without data-plane work, while the exec thread has nothing to
   * do, is run here: one thread hand-off less for a barrier. */
  if (ctx->live_oom) {
    pthread_mutex_unlock(&ctx->mu);
    gs__plan_node_free(n);
    fail_job(ctx, GS_ERR_NO_MEMORY, "out of memory recording the response cache's ids");
    return;
  }
  /* The marker: submissions go to the fast queue from now on. The exec
   * thread runs fast rounds only when no plan is left to run, so every
   * plan up to this one runs first; and no later plan comes before every
   * rank escalated. (Entering at once rather than when the exec thread
   * finished this plan keeps the ops submitted meanwhile off the
   * coordinator, which would hold them and make the first round escalate.) */
  for (size_t i = 0; i < n->plan.nreg_acks; i++)
    if (n->plan.reg_ack_ranks[i] == ctx->rank && n->plan.reg_ack_seqs[i] > ctx->reg_acked)
      ctx->reg_acked = n->plan.reg_ack_seqs[i];
  if (n->plan.fast_after && !ctx->fatal && !ctx->stop) {
    /* Registrations sent before the marker that the coordinator had not
     * applied when it sent it may still be on their way: another rank's
     * request must not reach it first (users rely on "(un)register,
     * barrier, submit"), so this rank's first round is not clear and
     * every rank goes back, its escalation behind them on this stream. */
    if (ctx->reg_acked < ctx->reg_sent && !ctx->fast_stop) ctx->fast_stop = 1;
    gs__fast_enter_locked(ctx);
  }
  int here = !ctx->exec_busy && !ctx->plans_head && !ctx->fatal && control_only_locked(n);
  if (here) {
    GS_TRACE(GS__TR_EXEC_WAKE, n->plan.seq, 1);
    j = 0;
    for (size_t i = 0; i < n->plan.nresponses; i++)
      for (size_t k = 0; k < n->plan.responses[i].ntensors; k++, j++) {
        const gs__response *r = &n->plan.responses[i];
        struct gs_handle *h = n->ops[j];
        if (!h) continue;
        if (r->kind == GS__RESP_ERROR)
          complete_locked(ctx, h, (gs_status)r->error_status,
                          r->error_message ? r->error_message : "error from the coordinator");
        else
          complete_locked(ctx, h, GS_OK, NULL);
      }
    gs__plan_done_locked(ctx, n->plan.seq); /* goes out with this thread's next message */
    GS_TRACE(GS__TR_PLAN_DONE, n->plan.seq, 1);
    pthread_mutex_unlock(&ctx->mu);
    gs__plan_node_free(n);
    return;
  }
  if (ctx->plans_tail)
    ctx->plans_tail->next = n;
  else
    ctx->plans_head = n;
  ctx->plans_tail = n;
  gs__exec_bell_locked(ctx);
  pthread_cond_signal(&ctx->exec_cv);
  pthread_mutex_unlock(&ctx->mu);
}

/* Handles one message from the coordinator. Returns non-zero when the job
 * is over for this rank. */
static int on_message(gs_ctx *ctx, gs__plan_msg *m) {
  switch (m->kind) {
  case GS__MSG_PLAN:
    queue_plan(ctx, &m->plan);
    return 0;
  case GS__MSG_RANK_ERROR: {
    pthread_mutex_lock(&ctx->mu);
    struct gs_handle *h = gs__inflight_find_str_locked(ctx, m->name);
    if (h) complete_locked(ctx, h, (gs_status)m->status, m->text ? m->text : "");
    pthread_mutex_unlock(&ctx->mu);
    return 0;
  }
  case GS__MSG_FAST_STOP:
    gs__fast_stop(ctx, m->abort_round, m->text ? m->text : "");
    return 0;
  case GS__MSG_ABORT: {
    char msg[4096];
    snprintf(msg, sizeof msg, "the coordinator aborted the job: %s", m->text ? m->text : "");
    fail_job(ctx, (gs_status)m->status, msg);
    return 1;
  }
  default:
    return 0;
  }
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

static void earliest(uint64_t *next, uint64_t t) {
  if (t < *next) *next = t;
}

/* Collects the names this rank's threads are blocked on into m (sorted,
 * deduplicated) when the set differs from the last one reported. Lowers
 * *next to the earliest time the set can change without anything else
 * happening (a wait passing its grace period, a polled op going stale). */
static void blocked_update(gs_ctx *ctx, uint64_t now, gs__rank_msg *m, uint64_t *next) {
  char(*names)[GS__MAX_NAME + 1] = NULL;
  size_t n = 0;
  pthread_mutex_lock(&ctx->mu);
  /* Threads inside a wait: blocked when none of their ops is done or
   * planned (a wait on any of several ends when one is) and each has been
   * waited on since the grace period, counted from the op's first wait. */
  for (gs__waiter *w = ctx->waiters; w; w = w->next) {
    int blocked = 1, settled = 0;
    uint64_t latest = 0;
    for (size_t i = 0; i < w->n && !settled; i++) {
      const struct gs_handle *h = w->hs[i];
      if (atomic_load_explicit(&h->done, memory_order_relaxed) || h->planned || !h->wait_since_ms) {
        blocked = 0;
        settled = 1; /* changes only with a plan or a completion */
      } else if (h->wait_since_ms > now || now - h->wait_since_ms < BLOCKED_GRACE_MS) {
        blocked = 0;
      }
      if (h->wait_since_ms > latest) latest = h->wait_since_ms;
    }
    if (!blocked && !settled) earliest(next, latest + BLOCKED_GRACE_MS);
    for (size_t i = 0; blocked && i < w->n && n < GS__MAX_BLOCKED; i++) {
      if (!names && !(names = malloc(GS__MAX_BLOCKED * sizeof *names))) break;
      memcpy(names[n++], w->hs[i]->req.name, sizeof names[0]);
    }
  }
  /* Ops no thread waits on right now but that one waited on or tested
   * recently: between two timed waits, or polled with gs_test. */
  for (const struct gs_handle *h = ctx->waited; h && n < GS__MAX_BLOCKED; h = h->wnext) {
    if (h->nwaiting || h->planned) continue;
    if (h->wait_since_ms > now || now - h->wait_since_ms < BLOCKED_GRACE_MS) {
      earliest(next, h->wait_since_ms + BLOCKED_GRACE_MS);
      continue;
    }
    if (h->wait_last_ms < now && now - h->wait_last_ms > BLOCKED_RECENT_MS) continue;
    earliest(next, h->wait_last_ms + BLOCKED_RECENT_MS + 1);
    if (!names && !(names = malloc(GS__MAX_BLOCKED * sizeof *names))) break;
    memcpy(names[n++], h->req.name, sizeof names[0]);
  }
  pthread_mutex_unlock(&ctx->mu);
  if (n > 1) qsort(names, n, sizeof *names, cmp_name);
  size_t u = 0;
  uint64_t sig = 1469598103934665603ull; /* FNV-1a over the sorted unique names */
  for (size_t i = 0; i < n; i++) {
    if (u && !strcmp(names[u - 1], names[i])) continue;
    if (u != i) memcpy(names[u], names[i], sizeof names[0]);
    for (const char *c = names[u]; *c; c++) sig = (sig ^ (unsigned char)*c) * 1099511628211ull;
    sig = (sig ^ 0xff) * 1099511628211ull;
    u++;
  }
  if (!u) sig = 0;
  if (sig == ctx->blocked_sig) {
    free(names);
    return;
  }
  ctx->blocked_sig = sig;
  m->blocked_update = 1;
  m->blocked_on = names;
  m->nblocked = u;
}

/* Puts the ops of list into m: a request the coordinator has cached as its
 * id, the others in full. Caller holds ctx->mu (the cache is read and
 * changed only under it). Returns non-zero when out of memory (m then
 * holds nothing). */
static int requests_locked(gs_ctx *ctx, struct gs_handle *list, gs__rank_msg *m) {
  size_t n = 0;
  for (struct gs_handle *h = list; h; h = h->next_submit) n++;
  if (!n) return 0;
  m->requests = malloc(n * sizeof *m->requests);
  m->cached = malloc(n * sizeof *m->cached);
  if (!m->requests || !m->cached) {
    free(m->requests);
    free(m->cached);
    m->requests = NULL;
    m->cached = NULL;
    return -1;
  }
  for (struct gs_handle *h = list; h; h = h->next_submit) {
    h->queued = 0;
    gs__wcache *c = h->wc; /* h is in flight: its name's entry, if any */
    if (c && gs__tensor_request_equal(&c->req, &h->req)) {
      m->cached[m->ncached++] = c->id;
      continue;
    }
    if (c) cache_drop(ctx, c);
    m->requests[m->nrequests++] = h->req;
  }
  ctx->stats.cache_hits += m->ncached;
  return 0;
}

/* Puts into m the ops submitted in fast mode that have waited more than
 * FAST_PENDING_MS for the other ranks (fast_pending), when that set
 * differs from the one last reported; lowers *next to when the next op
 * would pass that age. Caller holds ctx->mu. Returns non-zero when out of
 * memory (nothing changed then). */
#define FAST_PENDING_MS 1000
static int fast_pending_locked(gs_ctx *ctx, uint64_t now, gs__rank_msg *m, uint64_t *next) {
  size_t n = 0;
  uint64_t sig = 1469598103934665603ull;
  for (const struct gs_handle *h = ctx->fast_head; h; h = h->next_submit) {
    if (h->fast_since_ms > now || now - h->fast_since_ms < FAST_PENDING_MS) {
      earliest(next, h->fast_since_ms + FAST_PENDING_MS);
      continue;
    }
    if (n == GS__MAX_BLOCKED) break;
    n++;
    for (const char *c = h->req.name; *c; c++) sig = (sig ^ (unsigned char)*c) * 1099511628211ull;
    sig = (sig ^ 0xff) * 1099511628211ull;
  }
  if (!n) sig = 0;
  if (sig == ctx->fast_pending_sig) return 0;
  gs__fast_pending *v = n ? calloc(n, sizeof *v) : NULL;
  if (n && !v) return -1;
  size_t k = 0;
  for (const struct gs_handle *h = ctx->fast_head; h && k < n; h = h->next_submit) {
    if (h->fast_since_ms > now || now - h->fast_since_ms < FAST_PENDING_MS) continue;
    memcpy(v[k].name, h->req.name, sizeof v[k].name);
    v[k].cache_id = h->fast_id;
    uint64_t age = now - h->fast_since_ms;
    v[k].age_ms = age > UINT32_MAX ? UINT32_MAX : (uint32_t)age;
    k++;
  }
  ctx->fast_pending_sig = sig;
  m->fast_pending_update = 1;
  m->fast_pending = v;
  m->nfast_pending = n;
  return 0;
}

/* Moves the executed plans and the local registrations made so far into m:
 * they ride with the next message. Registrations must reach the
 * coordinator no later than the requests submitted after them (it applies
 * a message's registrations before its requests): the local/global check
 * depends on it. Caller holds ctx->mu. */
static void take_reports_locked(gs_ctx *ctx, gs__rank_msg *m) {
  m->done_plans = ctx->done_plans;
  m->ndone = ctx->ndone;
  ctx->done_plans = NULL;
  ctx->ndone = ctx->done_cap = 0;
  /* In fast mode they wait for the escalation, which they force (the next
   * round says "not clear", fast_round.c): a message of their own could
   * reach the coordinator after another rank's escalated request, which
   * it would then check against the old registrations. */
  if (gs__regs_due_locked(ctx)) {
    m->reg = ctx->reg;
    m->nreg = ctx->nreg;
    m->unreg = ctx->unreg;
    m->nunreg = ctx->nunreg;
    ctx->reg = ctx->unreg = NULL;
    ctx->nreg = ctx->nunreg = ctx->reg_cap = ctx->unreg_cap = 0;
    ctx->reg_sent += m->nreg + m->nunreg;
    m->reg_seq = ctx->reg_sent;
  }
  /* The escalation goes with the requests it moved back to the submission
   * queue (fast_round.c): the same message. */
  m->escalate_round = ctx->escalate_round;
  ctx->escalate_round = 0;
}

/* A request message goes out at now_us: later submissions wait for the
 * answer (Nagle's rule), at most one cycle. Caller holds ctx->mu. */
static void hold_requests_locked(gs_ctx *ctx, uint64_t now_us) {
  ctx->req_unanswered = 1;
  ctx->req_hold_until_us =
      now_us + (ctx->join.config.cycle_time_us ? ctx->join.config.cycle_time_us : 1000);
}

/* Caller holds ctx->mu. */
static void count_sent_locked(gs_ctx *ctx, const gs__rank_msg *m, size_t bytes) {
  ctx->stats.requests_sent += m->nrequests + m->ncached;
  ctx->stats.bytes_to_coordinator += bytes;
  ctx->stats.messages_to_coordinator++;
}

int gs__requests_claim_locked(gs_ctx *ctx, gs__rank_msg *m) {
  /* Only where the comm thread would send them at once itself: it is
   * running, no message is in flight and no request message is
   * unanswered (Nagle's rule). A kick may be outstanding: the comm thread
   * then wakes, sees the stream busy or the queue empty, and sleeps. */
  if (!ctx->comm_running || ctx->comm_send_busy || ctx->req_unanswered || !ctx->sub_head ||
      ctx->stop || ctx->fatal)
    return 0;
  memset(m, 0, sizeof *m);
  if (requests_locked(ctx, ctx->sub_head, m)) return 0; /* the comm thread tries */
  ctx->sub_head = ctx->sub_tail = NULL;
  take_reports_locked(ctx, m);
  ctx->comm_send_busy = 1; /* the send's completion wakes the comm thread */
  ctx->app_sending = 1;
  hold_requests_locked(ctx, gs__now_us());
  return 1;
}

void gs__requests_send(gs_ctx *ctx, gs__rank_msg *m) {
  char err[512];
  size_t bytes = 0;
  int rc = gs__client_session_send(ctx->client, m, &bytes, err, sizeof err);
  GS_TRACE(GS__TR_SENT, m->nrequests + m->ncached, 1);
  pthread_mutex_lock(&ctx->mu);
  ctx->app_sending = 0;
  count_sent_locked(ctx, m, bytes);
  int kick = 0;
  if (gs__client_session_idle(ctx->client)) {
    /* The send completed, and the comm thread took the completion, before
     * the claim ended: it saw app_sending and left comm_send_busy set, and
     * no completion will come to clear it. End the claim for it, and wake
     * it for what was queued meanwhile (it was not kicked for that). */
    ctx->comm_send_busy = 0;
    if (ctx->sub_head || ctx->ndone || gs__regs_due_locked(ctx) || ctx->escalate_round)
      kick = gs__comm_wake_locked(ctx, 0);
  }
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
  gs__rank_msg_free(m);
  /* The session ended (the comm thread finds out too) or out of memory. */
  if (rc) fail_job(ctx, (gs_status)rc, err);
}

/* Sends the ops submitted since the last message in one message, together
 * with the executed plans, the blocked-on names when they changed and a
 * heartbeat when one is due (nothing when there is nothing to say).
 *
 * Batching (Nagle's rule): requests go out at once when no request message
 * is unanswered; while one is (sent, and nothing came back from the
 * coordinator since), new requests wait for the answer, at most one cycle
 * time, or ride along with a message that goes out for another reason. The
 * first gradient of a burst thus costs one round trip and the rest follow
 * in one message, without a clock on the critical path. *next receives
 * when to come back on its own: the next heartbeat, the end of the hold, or
 * sooner when the blocked-on set can change. */
static int send_cycle(gs_ctx *ctx, int stopping, uint64_t *next, char *err, size_t errlen) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  uint64_t now = gs__now_ms(), now_us = gs__now_us();
  uint32_t hb = ctx->join.config.heartbeat_ms ? ctx->join.config.heartbeat_ms : 1000;
  *next = UINT64_MAX;
  blocked_update(ctx, now, &m, next);
  m.heartbeat = now - ctx->last_send_ms >= hb;
  if (stopping) {
    m.has_leave = 1;
    snprintf(m.leave_reason, sizeof m.leave_reason, "gs_shutdown");
  }
  pthread_mutex_lock(&ctx->mu);
  int hold = ctx->req_unanswered && now_us < ctx->req_hold_until_us;
  /* Executed plans are news for the coordinator only while it may be
   * holding ready tensors back for them (the adaptive policy's plans in
   * flight), which needs this rank's requests: with none of its ops
   * waiting for a plan they ride along with the next message instead. */
  int done_due = ctx->ndone && ctx->nunplanned;
  /* The ops waiting in fast mode for more than a second (news for
   * ListPending and the stall inspector; an allocation failure only
   * delays them to the next cycle). */
  fast_pending_locked(ctx, now, &m, next);
  int regs = gs__regs_due_locked(ctx);
  if (m.blocked_update || m.heartbeat || m.has_leave || done_due || regs || ctx->escalate_round ||
      m.fast_pending_update)
    hold = 0; /* a message goes out anyway: the requests ride along */
  struct gs_handle *list = NULL;
  if (hold) {
    /* Submissions made while held wait for this wake-up, not a kick. */
    earliest(next, (ctx->req_hold_until_us + 999) / 1000);
  } else {
    list = ctx->sub_head;
    ctx->sub_head = ctx->sub_tail = NULL;
  }
  ctx->comm_req_held = hold; /* new submissions need no kick while held */
  int oom = requests_locked(ctx, list, &m);
  int go = list || done_due || m.heartbeat || m.has_leave || m.blocked_update || regs ||
           ctx->escalate_round || m.fast_pending_update;
  if (go) { /* (without it there are no registrations to take) */
    take_reports_locked(ctx, &m);
    /* The fast rounds' counters ride along when they changed (never a
     * message of their own: heartbeats carry them at least every second). */
    if (memcmp(&ctx->fast_report, &ctx->fast_report_sent, sizeof ctx->fast_report)) {
      m.has_fast_report = 1;
      m.fast_report = ctx->fast_report;
      ctx->fast_report_sent = ctx->fast_report;
    }
    ctx->comm_send_busy = 1; /* an application thread sends nothing meanwhile */
  }
  pthread_mutex_unlock(&ctx->mu);
  int rc = GS__OK;
  if (oom) {
    snprintf(err, errlen, "out of memory batching requests");
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  if (m.nrequests || m.ncached || m.ndone || m.heartbeat || m.has_leave || m.blocked_update ||
      m.nreg || m.nunreg || m.escalate_round || m.has_fast_report || m.fast_pending_update) {
    size_t bytes = 0;
    rc = gs__client_session_send(ctx->client, &m, &bytes, err, errlen);
    if (m.nrequests || m.ncached) GS_TRACE(GS__TR_SENT, m.nrequests + m.ncached, 0);
    ctx->last_send_ms = now;
    pthread_mutex_lock(&ctx->mu);
    if (m.nrequests || m.ncached) hold_requests_locked(ctx, now_us);
    ctx->comm_send_busy = 1; /* until the comm thread sees the send complete */
    count_sent_locked(ctx, &m, bytes);
    pthread_mutex_unlock(&ctx->mu);
  }
  earliest(next, ctx->last_send_ms + hb);
out_free:
  gs__rank_msg_free(&m);
  return rc;
}

/* Bounds a sleep while a message is in flight (its completion wakes the
 * thread; this only caps the wait if it never came). */
#define SEND_WAIT_MS 1000

/* Bounds the wait for the exec thread's plan before the leave. */
#define LEAVE_PLAN_WAIT_MS 1000

/* Before the leave, this rank's last message: the exec thread completes a
 * plan's ops (which wakes the application, which may then call
 * gs_shutdown at once) before it records the plan as done, so a leave sent
 * meanwhile lacked the job's last plan, and nothing is sent after a
 * leave: the coordinator's timeline missed that rank's "done" of it (1 run
 * in 7 of a 2-rank job). Wait for the plan the exec thread is running to
 * be recorded. Bounded: an op still in flight at gs_shutdown may wait on
 * peers. Never for a fast round, which may wait for ranks that wait for
 * this leave (the coordinator ends theirs when it gets it). */
static void await_exec_plan(gs_ctx *ctx) {
  uint64_t until = gs__now_ms() + LEAVE_PLAN_WAIT_MS;
  pthread_mutex_lock(&ctx->mu);
  while (ctx->exec_busy && !ctx->fast_in_round && ctx->fatal == GS_OK && gs__now_ms() < until) {
    pthread_mutex_unlock(&ctx->mu);
    struct timespec ts = {0, 100000}; /* the window is a few microseconds */
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&ctx->mu);
  }
  pthread_mutex_unlock(&ctx->mu);
}

void *gs__background_main(void *arg) {
  gs_ctx *ctx = arg;
  char err[4096];
  int over = 0;
  int64_t wait_us = 0; /* first pass: only what is ready */
  uint64_t next_ms = 0;
  while (!over) {
    /* 1. Sleep until something happens or comes due, then take whatever
     * else is ready without sleeping. */
    for (;;) {
      gs__plan_msg m;
      int got = GS__POLL_NOTHING;
      int rc = gs__client_session_poll(ctx->client, wait_us, &m, &got, err, sizeof err);
      if (rc) {
        fail_job(ctx, (gs_status)rc, err);
        over = 1;
        break;
      }
      if (got == GS__POLL_NOTHING) break;
      wait_us = 0;
      if (got != GS__POLL_MESSAGE) continue;
      pthread_mutex_lock(&ctx->mu);
      ctx->req_unanswered = 0; /* the coordinator answered: held requests may go */
      pthread_mutex_unlock(&ctx->mu);
      over = on_message(ctx, &m);
      gs__plan_msg_free(&m);
      if (over) break;
    }
    if (over) break;
    /* 2. Say what there is to say, unless a message is still in flight:
     * then it goes out when that one completes. A consumed kick is cleared
     * before the queues are read, so that work arriving from now on kicks
     * again. */
    unsigned kicks = gs__client_session_kicks_taken(ctx->client);
    pthread_mutex_lock(&ctx->mu);
    /* Read under mu (lock order: ctx->mu, then the client's send lock):
     * an application thread's send is claimed and finished under mu. */
    int idle = gs__client_session_idle(ctx->client) && !ctx->app_sending;
    if (kicks) ctx->kicked = 0;
    ctx->comm_send_busy = !idle;
    int stopping = ctx->stop;
    int failed = ctx->fatal != GS_OK;
    pthread_mutex_unlock(&ctx->mu);
    if (failed) break; /* e.g. the data plane failed on the exec thread */
    if (idle) {
      if (stopping) await_exec_plan(ctx);
      if (send_cycle(ctx, stopping, &next_ms, err, sizeof err) != GS__OK) {
        fail_job(ctx, GS_ERR_COORDINATOR_LOST, err);
        break;
      }
      if (stopping) break;
      pthread_mutex_lock(&ctx->mu);
      ctx->comm_next_ms = next_ms;
      pthread_mutex_unlock(&ctx->mu);
    }
    /* A FastStop with abort_round gave the round in progress a grace
     * period (fast_round.c): end it when that passed. */
    uint64_t abort_due = gs__fast_abort_check(ctx, gs__now_ms());
    if (abort_due && abort_due < next_ms) next_ms = abort_due;
    /* 3. Until when to sleep: the finished send or a kick wakes it sooner. */
    uint64_t now_us = gs__now_us(), due_us = next_ms * 1000;
    if (!gs__client_session_idle(ctx->client) && due_us <= now_us)
      due_us = now_us + (uint64_t)SEND_WAIT_MS * 1000;
    wait_us = due_us > now_us ? (int64_t)(due_us - now_us) : 0;
  }
  pthread_mutex_lock(&ctx->mu);
  ctx->comm_running = 0;
  /* A fast round in progress waits for the other ranks without a
   * data-plane timeout; this rank is leaving, so end it (the coordinator
   * sends the others a FastStop that ends theirs). */
  if (ctx->fast_in_round) gs__ctx_abort_backends(ctx);
  pthread_mutex_unlock(&ctx->mu);
  /* Leave (bounded): flush the leave message, half-close, wait for the
   * coordinator to end the stream. Then let the exec thread finish the plans
   * it has and stop. */
  gs__client_session_close(ctx->client, 2000);
  pthread_mutex_lock(&ctx->mu);
  ctx->exec_stop = 1;
  gs__exec_bell_locked(ctx);
  pthread_cond_broadcast(&ctx->exec_cv);
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}
