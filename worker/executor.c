/* The worker's exec thread: runs the plans the comm thread queued, strictly
 * in order, on the backend, and completes handles as it goes.
 *
 * Owns the backend's collectives (the comm thread may only call abort);
 * takes plans from ctx->plans_* and reports finished plan numbers into
 * ctx->done_plans, both under ctx->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "status.h"
#include "worker.h"

static struct gs_handle *find_op(gs_ctx *ctx, const char *name) {
  struct gs_handle *h = NULL;
  pthread_mutex_lock(&ctx->mu);
  HASH_FIND_STR(ctx->inflight, name, h);
  pthread_mutex_unlock(&ctx->mu);
  return h;
}

static int job_failed(gs_ctx *ctx) {
  pthread_mutex_lock(&ctx->mu);
  int f = ctx->fatal != GS_OK;
  pthread_mutex_unlock(&ctx->mu);
  return f;
}

/* Runs one collective response. Returns GS__OK, or a failure that ends the
 * job (message in err). */
static int run_collective(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  for (size_t i = 0; i < r->ntensors; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    struct gs_handle *h = find_op(ctx, t->name);
    if (!h) {
      if (job_failed(ctx)) return GS__OK; /* its op was failed with the job */
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

/* Caller holds ctx->mu. */
static void remember_done(gs_ctx *ctx, uint64_t seq) {
  if (ctx->ndone == ctx->done_cap) {
    size_t cap = ctx->done_cap ? ctx->done_cap * 2 : 16;
    uint64_t *d = realloc(ctx->done_plans, cap * sizeof *d);
    if (!d) return; /* only the coordinator's flow control loses a number */
    ctx->done_plans = d;
    ctx->done_cap = cap;
  }
  ctx->done_plans[ctx->ndone++] = seq;
}

void *gs__executor_main(void *arg) {
  gs_ctx *ctx = arg;
  char err[4096];
  pthread_mutex_lock(&ctx->mu);
  for (;;) {
    while (!ctx->plans_head && !ctx->exec_stop) pthread_cond_wait(&ctx->exec_cv, &ctx->mu);
    if (!ctx->plans_head) break; /* stopped and drained */
    plan_node *n = ctx->plans_head;
    ctx->plans_head = n->next;
    if (!ctx->plans_head) ctx->plans_tail = NULL;
    int failed = ctx->fatal != GS_OK;
    pthread_mutex_unlock(&ctx->mu);
    /* After a failure the job is over: drop the plans, their ops already
     * failed with it. */
    int rc = failed ? GS__OK : run_plan(ctx, &n->plan, err, sizeof err);
    if (rc) {
      GS_LOG_ERROR("%s", err);
      gs__ctx_fail(ctx, (gs_status)rc, err);
    }
    pthread_mutex_lock(&ctx->mu);
    remember_done(ctx, n->plan.seq);
    gs__plan_free(&n->plan);
    free(n);
  }
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}
