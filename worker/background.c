/* The worker's background thread: every cycle it sends the ops submitted
 * since the last cycle to the coordinator (plus heartbeats and the numbers
 * of the plans it finished), receives plans, and runs them strictly in
 * order on the backend, completing handles as it goes.
 *
 * Owns the client session, the backend and the plan queue (see worker.h);
 * touches handles and the submission queue only under ctx->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "dtype.h"
#include "log.h"
#include "status.h"
#include "worker.h"

void gs__handle_unref(struct gs_handle *h) {
  if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) == 1) {
    free(h->error);
    free(h);
  }
}

/* Caller holds ctx->mu. */
static void complete_locked(gs_ctx *ctx, struct gs_handle *h, gs_status status, const char *msg) {
  if (atomic_load_explicit(&h->done, memory_order_relaxed)) return;
  h->status = status;
  h->error = msg ? strdup(msg) : NULL;
  HASH_DEL(ctx->inflight, h);
  atomic_store_explicit(&h->done, 1, memory_order_release);
  pthread_cond_broadcast(&ctx->cv);
  gs__handle_unref(h);
}

void gs__handle_complete(gs_ctx *ctx, struct gs_handle *h, gs_status status, const char *msg) {
  pthread_mutex_lock(&ctx->mu);
  complete_locked(ctx, h, status, msg);
  pthread_mutex_unlock(&ctx->mu);
}

void gs__ctx_fail(gs_ctx *ctx, gs_status status, const char *msg) {
  pthread_mutex_lock(&ctx->mu);
  if (!ctx->fatal) {
    ctx->fatal = status;
    snprintf(ctx->fatal_msg, sizeof ctx->fatal_msg, "%s", msg);
  }
  ctx->sub_head = ctx->sub_tail = NULL;
  struct gs_handle *h, *tmp;
  HASH_ITER(hh, ctx->inflight, h, tmp) complete_locked(ctx, h, ctx->fatal, ctx->fatal_msg);
  pthread_mutex_unlock(&ctx->mu);
}

static struct gs_handle *find_op(gs_ctx *ctx, const char *name) {
  struct gs_handle *h = NULL;
  pthread_mutex_lock(&ctx->mu);
  HASH_FIND_STR(ctx->inflight, name, h);
  pthread_mutex_unlock(&ctx->mu);
  return h;
}

/* Runs one collective response. Returns GS__OK, or a data-plane failure
 * that ends the job (message in err). */
static int run_collective(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  for (size_t i = 0; i < r->ntensors; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    struct gs_handle *h = find_op(ctx, t->name);
    if (!h) {
      snprintf(err, errlen,
               "internal: plan names tensor '%s', which rank %d has not submitted (a gradsync "
               "bug; please report it with the coordinator's log)",
               t->name, ctx->rank);
      return GS__ERR_INTERNAL;
    }
    if (r->op != GS__OP_ALLREDUCE) {
      char msg[512];
      snprintf(msg, sizeof msg, "tensor '%s': %s is not supported by this library version",
               t->name, gs__op_type_name(r->op));
      gs__handle_complete(ctx, h, GS_ERR_UNSUPPORTED, msg);
      continue;
    }
    size_t bytes = h->count * gs__dtype_size(h->req.dtype);
    if (h->send != h->recv && bytes) memcpy(h->recv, h->send, bytes);
    int rc = ctx->backend->v->allreduce(ctx->backend, h->recv, h->count, h->req.dtype,
                                        h->req.reduce_op, err, errlen);
    if (rc) {
      char *detail = strdup(err);
      snprintf(err, errlen, "tensor '%s' (rank %d on %s): %s", t->name, ctx->rank, ctx->host,
               detail ? detail : "data-plane failure");
      free(detail);
      return rc == GS__ERR_ABORTED ? GS__ERR_ABORTED : GS__ERR_DATA_PLANE;
    }
    gs__handle_complete(ctx, h, GS_OK, NULL);
  }
  return GS__OK;
}

static int run_plan(gs_ctx *ctx, const gs__plan *p, char *err, size_t errlen) {
  for (size_t i = 0; i < p->nresponses; i++) {
    const gs__response *r = &p->responses[i];
    if (r->kind == GS__RESP_ERROR) {
      for (size_t k = 0; k < r->ntensors; k++) {
        struct gs_handle *h = find_op(ctx, r->tensors[k].name);
        if (h)
          gs__handle_complete(ctx, h, (gs_status)r->error_status,
                              r->error_message ? r->error_message : "error from the coordinator");
      }
      continue;
    }
    int rc = run_collective(ctx, r, err, errlen);
    if (rc) return rc;
  }
  return GS__OK;
}

static void remember_done(gs_ctx *ctx, uint64_t seq) {
  if (ctx->ndone == ctx->done_cap) {
    size_t cap = ctx->done_cap ? ctx->done_cap * 2 : 16;
    uint64_t *d = realloc(ctx->done_plans, cap * sizeof *d);
    if (!d) return; /* only diagnostics lose a number */
    ctx->done_plans = d;
    ctx->done_cap = cap;
  }
  ctx->done_plans[ctx->ndone++] = seq;
}

/* Handles one message from the coordinator. Returns non-zero when the job
 * is over for this rank. */
static int on_message(gs_ctx *ctx, gs__plan_msg *m) {
  switch (m->kind) {
  case GS__MSG_PLAN: {
    plan_node *n = calloc(1, sizeof *n);
    if (!n) {
      gs__ctx_fail(ctx, GS_ERR_NO_MEMORY, "out of memory queueing a plan");
      return 1;
    }
    n->plan = m->plan;
    memset(&m->plan, 0, sizeof m->plan);
    if (ctx->plans_tail) ctx->plans_tail->next = n;
    else ctx->plans_head = n;
    ctx->plans_tail = n;
    return 0;
  }
  case GS__MSG_RANK_ERROR: {
    struct gs_handle *h = find_op(ctx, m->name);
    if (h) gs__handle_complete(ctx, h, (gs_status)m->status, m->text ? m->text : "");
    return 0;
  }
  case GS__MSG_ABORT: {
    char msg[4096];
    snprintf(msg, sizeof msg, "the coordinator aborted the job: %s", m->text ? m->text : "");
    GS_LOG_ERROR("%s", msg);
    ctx->backend->v->abort(ctx->backend);
    gs__ctx_fail(ctx, (gs_status)m->status, msg);
    return 1;
  }
  default: return 0;
  }
}

/* Moves the ops submitted since the last cycle into one message, together
 * with the finished plans and a heartbeat when one is due, and sends it. */
static int send_cycle(gs_ctx *ctx, int stopping, char *err, size_t errlen) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  pthread_mutex_lock(&ctx->mu);
  struct gs_handle *list = ctx->sub_head;
  ctx->sub_head = ctx->sub_tail = NULL;
  pthread_mutex_unlock(&ctx->mu);
  size_t n = 0;
  for (struct gs_handle *h = list; h; h = h->next_submit) n++;
  if (n) {
    m.requests = malloc(n * sizeof *m.requests);
    if (!m.requests) {
      snprintf(err, errlen, "out of memory batching %zu requests", n);
      return GS__ERR_NO_MEMORY;
    }
    for (struct gs_handle *h = list; h; h = h->next_submit) m.requests[m.nrequests++] = h->req;
  }
  m.done_plans = ctx->done_plans;
  m.ndone = ctx->ndone;
  uint64_t now = gs__now_ms();
  uint32_t hb = ctx->join.config.heartbeat_ms ? ctx->join.config.heartbeat_ms : 1000;
  m.heartbeat = now - ctx->last_send_ms >= hb;
  if (stopping) {
    m.has_leave = 1;
    snprintf(m.leave_reason, sizeof m.leave_reason, "gs_shutdown");
  }
  int rc = GS__OK;
  if (m.nrequests || m.ndone || m.heartbeat || m.has_leave) {
    rc = gs__client_session_send(ctx->client, &m, err, errlen);
    ctx->last_send_ms = now;
    ctx->ndone = 0;
  }
  free(m.requests);
  return rc;
}

void *gs__background_main(void *arg) {
  gs_ctx *ctx = arg;
  char err[4096];
  int cycle_ms = (int)((ctx->join.config.cycle_time_us + 999) / 1000);
  if (cycle_ms < 1) cycle_ms = 1;
  int over = 0, stopping = 0;
  while (!over) {
    /* 1. Receive: wait up to one cycle for the first message, then take
     * whatever else is ready. */
    int wait = cycle_ms;
    for (;;) {
      gs__plan_msg m;
      int got = 0;
      int rc = gs__client_session_poll(ctx->client, wait, &m, &got, err, sizeof err);
      if (rc) {
        GS_LOG_ERROR("%s", err);
        ctx->backend->v->abort(ctx->backend);
        gs__ctx_fail(ctx, (gs_status)rc, err);
        over = 1;
        break;
      }
      if (!got) break;
      over = on_message(ctx, &m);
      gs__plan_msg_free(&m);
      if (over) break;
      wait = 0;
    }
    if (over) break;
    /* 2. Run the plans in order. */
    while (ctx->plans_head) {
      plan_node *n = ctx->plans_head;
      ctx->plans_head = n->next;
      if (!ctx->plans_head) ctx->plans_tail = NULL;
      int rc = run_plan(ctx, &n->plan, err, sizeof err);
      remember_done(ctx, n->plan.seq);
      gs__plan_free(&n->plan);
      free(n);
      if (rc) {
        GS_LOG_ERROR("%s", err);
        gs__ctx_fail(ctx, (gs_status)rc, err);
        over = 1;
        break;
      }
    }
    if (over) break;
    /* 3. Send this cycle's submissions. */
    pthread_mutex_lock(&ctx->mu);
    stopping = ctx->stop;
    pthread_mutex_unlock(&ctx->mu);
    if (send_cycle(ctx, stopping, err, sizeof err) != GS__OK) {
      gs__ctx_fail(ctx, GS_ERR_COORDINATOR_LOST, err);
      break;
    }
    if (stopping) break;
  }
  /* Leave cleanly (bounded): flush the leave message, half-close, wait for
   * the coordinator to end the stream. */
  gs__client_session_close(ctx->client, 2000);
  return NULL;
}
