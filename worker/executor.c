/* The worker's exec thread: runs the plans the comm thread queued, strictly
 * in order, on the backend, and completes handles as it goes.
 *
 * Owns the backend's collectives (the comm thread may only call abort);
 * takes plans from ctx->plans_* and reports finished plan numbers into
 * ctx->done_plans, both under ctx->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "fusion_layout.h"
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

/* Grows the persistent fusion buffer to at least bytes. */
static uint8_t *fusion_buffer(gs_ctx *ctx, size_t bytes) {
  if (bytes > ctx->fusion_cap) {
    size_t cap = ctx->fusion_cap ? ctx->fusion_cap : 1 << 20;
    while (cap < bytes) cap *= 2;
    uint8_t *b = realloc(ctx->fusion_buf, cap);
    if (!b) return NULL;
    ctx->fusion_buf = b;
    ctx->fusion_cap = cap;
  }
  return ctx->fusion_buf;
}

/* Completes a successful op, running its finish step first. */
static void succeed(gs_ctx *ctx, struct gs_handle *h) {
  char err[1024];
  int rc = h->finish ? h->finish(h, err, sizeof err) : GS__OK;
  gs__handle_complete(ctx, h, (gs_status)rc, rc ? err : NULL);
}

static void add_stats(gs_ctx *ctx, size_t ntensors) {
  pthread_mutex_lock(&ctx->mu);
  ctx->stats.collectives++;
  ctx->stats.tensors += ntensors;
  if (ntensors > 1) ctx->stats.fused_collectives++;
  pthread_mutex_unlock(&ctx->mu);
}

/* Copies h's input into the wire buffer at dst: converted to the wire
 * dtype when compressed, then prescaled. */
static void pack(uint8_t *dst, const struct gs_handle *h, const gs__response *r) {
  if (!h->count) return;
  if (h->compress) {
    const float *src = h->send;
    uint16_t *d = (uint16_t *)dst;
    for (size_t k = 0; k < h->count; k++)
      d[k] = r->dtype == GS__FLOAT16 ? gs__float_to_half(src[k]) : gs__float_to_bf16(src[k]);
  } else {
    memcpy(dst, h->send, h->count * gs__dtype_size(r->dtype));
  }
  gs__scale(dst, h->count, r->dtype, r->prescale);
}

/* The reverse of pack: postscale, then back to h's recv (and dtype). */
static void unpack(struct gs_handle *h, uint8_t *src, const gs__response *r) {
  if (!h->count) return;
  gs__scale(src, h->count, r->dtype, r->postscale);
  if (h->compress) {
    const uint16_t *s = (const uint16_t *)src;
    float *d = h->recv;
    for (size_t k = 0; k < h->count; k++)
      d[k] = r->dtype == GS__FLOAT16 ? gs__half_to_float(s[k]) : gs__bf16_to_float(s[k]);
  } else {
    memcpy(h->recv, src, h->count * gs__dtype_size(r->dtype));
  }
}

/* Runs one allreduce response: a lone unscaled tensor in place in its recv
 * buffer; otherwise packed (with prescale) into the fusion buffer at the
 * offsets of the shared layout, reduced once, and unpacked (with
 * postscale). Returns GS__OK, or a failure that ends the job (message in
 * err). */
static int run_allreduce(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  size_t n = r->ntensors, esize = gs__dtype_size(r->dtype);
  struct gs_handle **hs = calloc(n, sizeof *hs);
  uint64_t *offs = calloc(n, sizeof *offs);
  int rc = GS__OK;
  if (!hs || !offs) {
    snprintf(err, errlen, "out of memory running a collective of %zu tensors", n);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  int missing = 0;
  for (size_t i = 0; i < n; i++) {
    hs[i] = find_op(ctx, r->tensors[i].name);
    if (hs[i]) continue;
    if (job_failed(ctx)) goto out_free; /* its op was failed with the job */
    pthread_mutex_lock(&ctx->mu);
    int joined = ctx->joined;
    pthread_mutex_unlock(&ctx->mu);
    if (joined) { /* gs_join: this rank adds zeros to the others' tensors */
      missing++;
      continue;
    }
    snprintf(err, errlen,
             "internal: plan names tensor '%s', which rank %d has not submitted (a gradsync bug; "
             "please report it with the coordinator's log)",
             r->tensors[i].name, ctx->rank);
    rc = GS__ERR_INTERNAL;
    goto out_free;
  }
  /* The layout follows from the plan alone: every rank reduces the same
   * number of elements, whichever tensors it holds. A lone unscaled tensor
   * is reduced in place in its recv buffer (or in the fusion buffer when it
   * is compressed or this rank has joined); anything else is packed at the
   * offsets of the shared layout. */
  int packed = n > 1 || r->prescale != 1.0 || r->postscale != 1.0;
  uint64_t total = packed ? gs__fusion_offsets(r, offs)
                          : gs__tensor_bytes(r->dtype, r->tensors[0].shape, r->tensors[0].ndim);
  size_t count = (size_t)(total / esize);
  void *buf;
  if (!packed && hs[0] && !hs[0]->compress) {
    struct gs_handle *h = hs[0];
    if (h->send != h->recv && h->count) memcpy(h->recv, h->send, h->count * esize);
    buf = h->recv;
  } else {
    uint8_t *fb = fusion_buffer(ctx, total ? total : 1);
    if (!fb) {
      snprintf(err, errlen, "out of memory for a fusion buffer of %llu bytes",
               (unsigned long long)total);
      rc = GS__ERR_NO_MEMORY;
      goto out_free;
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
      const gs__plan_tensor *t = &r->tensors[i];
      size_t bytes = (size_t)gs__tensor_bytes(r->dtype, t->shape, t->ndim);
      memset(fb + at, 0, offs[i] - at); /* alignment padding */
      if (!hs[i])
        memset(fb + offs[i], 0, bytes); /* joined: zeros */
      else
        pack(fb + offs[i], hs[i], r);
      at = offs[i] + bytes;
    }
    memset(fb + at, 0, total - at);
    buf = fb;
  }
  rc = ctx->backend->v->allreduce(ctx->backend, buf, count, r->dtype, r->reduce_op, err, errlen);
  if (rc) {
    char *detail = strdup(err);
    snprintf(err, errlen, "tensor '%s'%s (rank %d on %s): %s", r->tensors[0].name,
             n > 1 ? " and the tensors fused with it" : "", ctx->rank, ctx->host,
             detail ? detail : "data-plane failure");
    free(detail);
    rc = rc == GS__ERR_ABORTED ? GS__ERR_ABORTED : GS__ERR_DATA_PLANE;
    goto out_free;
  }
  add_stats(ctx, n - (size_t)missing); /* before the completions, so waiters see them */
  for (size_t i = 0; i < n; i++) {
    if (!hs[i]) continue;
    if (buf != hs[i]->recv) unpack(hs[i], (uint8_t *)buf + offs[i], r);
    succeed(ctx, hs[i]);
  }
out_free:
  free(hs);
  free(offs);
  return rc;
}

/* The ops a non-fused response names, or a job failure. */
static int lone_op(gs_ctx *ctx, const gs__response *r, struct gs_handle **h, char *err,
                   size_t errlen) {
  *h = find_op(ctx, r->tensors[0].name);
  if (*h || job_failed(ctx)) return GS__OK;
  snprintf(err, errlen,
           "internal: plan names tensor '%s', which rank %d has not submitted (a gradsync bug; "
           "please report it with the coordinator's log)",
           r->tensors[0].name, ctx->rank);
  return GS__ERR_INTERNAL;
}

static int data_plane_error(gs_ctx *ctx, const char *name, int rc, char *err, size_t errlen) {
  char *detail = strdup(err);
  snprintf(err, errlen, "tensor '%s' (rank %d on %s): %s", name, ctx->rank, ctx->host,
           detail ? detail : "data-plane failure");
  free(detail);
  return rc == GS__ERR_ABORTED ? GS__ERR_ABORTED : GS__ERR_DATA_PLANE;
}

/* Allgather, alone or fused: the per-rank first dimensions come in the
 * plan. In a fused allgather rank q's block holds, tensor after tensor, the
 * rows rank q contributes to each, so every rank computes the same block
 * sizes from the plan alone; the gathered rows are then split per tensor
 * into buffers the handles own. */
static int run_allgather(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  size_t n = r->ntensors, nr = (size_t)ctx->size, me = (size_t)ctx->rank;
  struct gs_handle **hs = calloc(n, sizeof *hs);
  uint64_t *row = calloc(n, sizeof *row);
  size_t *bytes = calloc(nr, sizeof *bytes);
  uint8_t *send = NULL, *recv = NULL;
  int rc = GS__OK;
  if (!hs || !row || !bytes) {
    snprintf(err, errlen, "out of memory running an allgather of %zu tensors", n);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    if (t->nrank_dims != nr) {
      snprintf(err, errlen, "internal: allgather plan for '%s' carries %zu sizes for %zu ranks",
               t->name, t->nrank_dims, nr);
      rc = GS__ERR_INTERNAL;
      goto out_free;
    }
    hs[i] = find_op(ctx, t->name);
    if (!hs[i]) {
      if (!job_failed(ctx)) {
        snprintf(err, errlen,
                 "internal: plan names tensor '%s', which rank %d has not submitted (a gradsync "
                 "bug; please report it with the coordinator's log)",
                 t->name, ctx->rank);
        rc = GS__ERR_INTERNAL;
      }
      goto out_free;
    }
    row[i] = gs__tensor_bytes(r->dtype, t->shape + 1, t->ndim > 0 ? t->ndim - 1 : 0);
    for (size_t q = 0; q < nr; q++) bytes[q] += (size_t)(row[i] * (uint64_t)t->rank_dims[q]);
  }
  for (size_t q = 0; q < nr; q++) total += bytes[q];
  recv = malloc(total ? total : 1);
  if (n > 1) send = malloc(bytes[me] ? bytes[me] : 1);
  if (!recv || (n > 1 && !send)) {
    snprintf(err, errlen, "out of memory for an allgather of %llu bytes",
             (unsigned long long)total);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  if (n > 1) {
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
      size_t b = (size_t)(row[i] * (uint64_t)r->tensors[i].rank_dims[me]);
      if (b) memcpy(send + at, hs[i]->send, b);
      at += b;
    }
  }
  rc = ctx->backend->v->allgatherv(ctx->backend, n > 1 ? send : hs[0]->send, recv, bytes, err,
                                   errlen);
  if (rc) {
    rc = data_plane_error(ctx, r->tensors[0].name, rc, err, errlen);
    goto out_free;
  }
  add_stats(ctx, n);
  for (size_t i = 0; i < n; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    struct gs_handle *h = hs[i];
    int64_t *dims = malloc(nr * sizeof *dims);
    uint64_t mine = 0;
    for (size_t q = 0; q < nr; q++) mine += row[i] * (uint64_t)t->rank_dims[q];
    void *out = n == 1 ? recv : malloc(mine ? mine : 1);
    if (!dims || !out) {
      free(dims);
      if (out != recv) free(out);
      gs__handle_complete(ctx, h, GS_ERR_NO_MEMORY, "out of memory for an allgather result");
      continue;
    }
    if (n > 1) {
      /* Tensor i's rows sit in every rank's block after the tensors before it. */
      size_t block = 0, at = 0;
      for (size_t q = 0; q < nr; q++) {
        size_t within = 0;
        for (size_t k = 0; k < i; k++)
          within += (size_t)(row[k] * (uint64_t)r->tensors[k].rank_dims[q]);
        size_t b = (size_t)(row[i] * (uint64_t)t->rank_dims[q]);
        if (b) memcpy((uint8_t *)out + at, recv + block + within, b);
        at += b;
        block += bytes[q];
      }
    } else {
      recv = NULL; /* handed to the handle */
    }
    for (size_t q = 0; q < nr; q++) dims[q] = t->rank_dims[q];
    h->result = out; /* published to other threads by the completion below */
    h->result_bytes = (size_t)mine;
    h->rank_dims = dims;
    h->nrank_dims = nr;
    succeed(ctx, h);
  }
out_free:
  free(hs);
  free(row);
  free(bytes);
  free(send);
  free(recv);
  return rc;
}

static int run_broadcast(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, &h, err, errlen);
  if (rc || !h) return rc;
  rc = ctx->backend->v->broadcast(ctx->backend, h->recv, h->count * gs__dtype_size(r->dtype),
                                  r->root_rank, err, errlen);
  if (rc) return data_plane_error(ctx, h->req.name, rc, err, errlen);
  add_stats(ctx, 1);
  succeed(ctx, h);
  return GS__OK;
}

static int no_backend_op(const char *name, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "tensor '%s': the data plane has no %s", name, what);
  return GS__ERR_UNSUPPORTED;
}

/* Alltoall: the ranks first gather everyone's splits over the data plane
 * (so the coordinator never carries the size x size matrix), then exchange
 * the rows. The result and the rows received from each rank stay with the
 * handle. */
static int run_alltoall(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, &h, err, errlen);
  if (rc || !h) return rc;
  gs__backend *b = ctx->backend;
  size_t n = (size_t)ctx->size;
  if (!b->v->alltoallv) {
    rc = no_backend_op(h->req.name, "alltoall", err, errlen);
    gs__handle_complete(ctx, h, (gs_status)rc, err);
    return GS__OK;
  }
  uint64_t row = gs__tensor_bytes(r->dtype, h->req.shape + 1, h->req.ndim - 1);
  int64_t *matrix = malloc(n * n * sizeof *matrix);
  size_t *bytes = malloc(n * sizeof *bytes), *send_bytes = malloc(n * sizeof *send_bytes),
         *recv_bytes = malloc(n * sizeof *recv_bytes);
  int64_t *recv_rows = malloc(n * sizeof *recv_rows);
  void *out = NULL;
  if (!matrix || !bytes || !send_bytes || !recv_bytes || !recv_rows) {
    snprintf(err, errlen, "tensor '%s': out of memory for an alltoall", h->req.name);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  for (size_t q = 0; q < n; q++) bytes[q] = n * sizeof *matrix;
  rc = b->v->allgatherv(b, h->splits, matrix, bytes, err, errlen);
  if (rc) {
    rc = data_plane_error(ctx, h->req.name, rc, err, errlen);
    goto out_free;
  }
  uint64_t total = 0;
  for (size_t q = 0; q < n; q++) {
    recv_rows[q] = matrix[q * n + (size_t)ctx->rank];
    send_bytes[q] = (size_t)(row * (uint64_t)h->splits[q]);
    recv_bytes[q] = (size_t)(row * (uint64_t)recv_rows[q]);
    total += recv_bytes[q];
  }
  out = malloc(total ? total : 1);
  if (!out) {
    snprintf(err, errlen, "tensor '%s': out of memory for %llu bytes", h->req.name,
             (unsigned long long)total);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  rc = b->v->alltoallv(b, h->send, send_bytes, out, recv_bytes, err, errlen);
  if (rc) {
    rc = data_plane_error(ctx, h->req.name, rc, err, errlen);
    goto out_free;
  }
  h->result = out;
  h->result_bytes = (size_t)total;
  h->rank_dims = recv_rows;
  h->nrank_dims = n;
  out = NULL;
  recv_rows = NULL;
  add_stats(ctx, 1);
  succeed(ctx, h);
out_free:
  free(out);
  free(matrix);
  free(bytes);
  free(send_bytes);
  free(recv_bytes);
  free(recv_rows);
  return rc;
}

/* Reducescatter: rank r keeps rows [start_r, start_r + rows_r) of the
 * reduced tensor, the rows split as evenly as possible with the extra rows
 * on the lowest ranks (as Horovod). */
static int run_reducescatter(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, &h, err, errlen);
  if (rc || !h) return rc;
  gs__backend *b = ctx->backend;
  size_t n = (size_t)ctx->size, esize = gs__dtype_size(r->dtype);
  if (!b->v->reducescatter) {
    rc = no_backend_op(h->req.name, "reducescatter", err, errlen);
    gs__handle_complete(ctx, h, (gs_status)rc, err);
    return GS__OK;
  }
  int64_t rows = h->req.shape[0];
  size_t row_elems = (size_t)gs__shape_elements(h->req.shape + 1, h->req.ndim - 1);
  size_t *counts = malloc(n * sizeof *counts);
  int64_t *dims = malloc(n * sizeof *dims);
  void *work = malloc(h->count ? h->count * esize : 1);
  if (!counts || !dims || !work) {
    free(counts);
    free(dims);
    free(work);
    snprintf(err, errlen, "tensor '%s': out of memory for a reducescatter", h->req.name);
    return GS__ERR_NO_MEMORY;
  }
  size_t start = 0;
  for (size_t q = 0; q < n; q++) {
    dims[q] = rows / (int64_t)n + ((int64_t)q < rows % (int64_t)n ? 1 : 0);
    counts[q] = (size_t)dims[q] * row_elems;
    if ((int)q < ctx->rank) start += counts[q];
  }
  if (h->count) memcpy(work, h->send, h->count * esize);
  rc = b->v->reducescatter(b, work, counts, r->dtype, r->reduce_op, err, errlen);
  if (rc) {
    free(counts);
    free(dims);
    free(work);
    return data_plane_error(ctx, h->req.name, rc, err, errlen);
  }
  size_t mine = counts[ctx->rank] * esize;
  if (start) memmove(work, (uint8_t *)work + start * esize, mine);
  h->result = work;
  h->result_bytes = mine;
  h->rank_dims = dims;
  h->nrank_dims = n;
  free(counts);
  add_stats(ctx, 1);
  succeed(ctx, h);
  return GS__OK;
}

/* Runs one collective response. */
static int run_collective(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  switch (r->op) {
  case GS__OP_ALLREDUCE:
    return run_allreduce(ctx, r, err, errlen);
  case GS__OP_ALLGATHER:
    return run_allgather(ctx, r, err, errlen);
  case GS__OP_BROADCAST:
    return run_broadcast(ctx, r, err, errlen);
  case GS__OP_ALLTOALL:
    return run_alltoall(ctx, r, err, errlen);
  case GS__OP_REDUCESCATTER:
    return run_reducescatter(ctx, r, err, errlen);
  case GS__OP_JOIN: {
    /* Every rank has joined: the join round is over. */
    struct gs_handle *h;
    int rc = lone_op(ctx, r, &h, err, errlen);
    pthread_mutex_lock(&ctx->mu);
    ctx->joined = 0;
    pthread_mutex_unlock(&ctx->mu);
    if (!rc && h) {
      h->join_last = r->root_rank;
      gs__handle_complete(ctx, h, GS_OK, NULL);
    }
    return rc;
  }
  case GS__OP_BARRIER: {
    /* The plan itself is the barrier: every rank has arrived. */
    struct gs_handle *h;
    int rc = lone_op(ctx, r, &h, err, errlen);
    if (!rc && h) gs__handle_complete(ctx, h, GS_OK, NULL);
    return rc;
  }
  default:
    break;
  }
  for (size_t i = 0; i < r->ntensors; i++) {
    struct gs_handle *h = find_op(ctx, r->tensors[i].name);
    char msg[512];
    snprintf(msg, sizeof msg, "tensor '%s': %s is not supported by this library version",
             r->tensors[i].name, gs__op_type_name(r->op));
    if (h) gs__handle_complete(ctx, h, GS_ERR_UNSUPPORTED, msg);
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

/* A peer's connection broke: the coordinator usually knows why (which rank
 * died, on which host, with which pid) a moment later. Wait a little for its
 * verdict so that every rank reports the same cause. */
#define VERDICT_WAIT_MS 1000

static void await_verdict(gs_ctx *ctx) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += VERDICT_WAIT_MS / 1000;
  ts.tv_nsec += (long)(VERDICT_WAIT_MS % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&ctx->mu);
  while (!ctx->fatal && !ctx->stop)
    if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &ts) != 0) break;
  pthread_mutex_unlock(&ctx->mu);
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
    if (rc == GS__ERR_DATA_PLANE) await_verdict(ctx);
    if (rc) {
      GS_LOG_ERROR("%s", err);
      gs__ctx_fail(ctx, (gs_status)rc, err); /* the coordinator's verdict, if any, wins */
    }
    pthread_mutex_lock(&ctx->mu);
    remember_done(ctx, n->plan.seq);
    ctx->stats.plans_executed++;
    gs__plan_free(&n->plan);
    free(n);
  }
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}
