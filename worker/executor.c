/* The worker's exec thread: runs the plans the comm thread queued, strictly
 * in order, on the backend, and completes handles as it goes.
 *
 * Owns the backend's collectives (the comm thread may only call abort);
 * takes plans from ctx->plans_* and reports finished plan numbers into
 * ctx->done_plans, both under ctx->mu. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "dtype.h"
#include "fusion_layout.h"
#include "handoff_trace.h"
#include "log.h"
#include "status.h"
#include "worker.h"

/* The op the plan node holds for a tensor (plan_node.ops: found by the
 * comm thread when the plan came), or NULL when there was none or it has
 * completed since (failed with the job): as a lookup of the ops in
 * flight now would find, without one. */
static struct gs_handle *live_op(struct gs_handle *h) {
  return h && !atomic_load_explicit(&h->done, memory_order_acquire) ? h : NULL;
}

static int job_failed(gs_ctx *ctx) {
  pthread_mutex_lock(&ctx->mu);
  int f = ctx->fatal != GS_OK;
  pthread_mutex_unlock(&ctx->mu);
  return f;
}

/* The backend of a response's device. */
static gs__backend *backend_of(gs_ctx *ctx, const gs__response *r, char *err, size_t errlen) {
  gs__backend *b =
      (int)r->device >= 0 && r->device < GS__DEVICE_COUNT ? ctx->backends[r->device] : NULL;
  if (!b)
    snprintf(err, errlen,
             "internal: plan for tensor '%s' is on %s memory, for which rank %d has no backend (a "
             "gradsync bug: submission checks the device)",
             r->ntensors ? r->tensors[0].name : "?", gs__device_name(r->device), ctx->rank);
  return b;
}

/* Orders the backend's work after the callers' streams of the n ops (NULL
 * entries skipped). Host backends need nothing. */
static int begin(gs__backend *b, struct gs_handle *const *hs, size_t n, char *err, size_t errlen) {
  if (!b->v->begin) return GS__OK;
  void **streams = calloc(n ? n : 1, sizeof *streams);
  if (!streams) {
    snprintf(err, errlen, "out of memory ordering %zu tensors", n);
    return GS__ERR_NO_MEMORY;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (!hs[i]) continue;
    size_t j = 0;
    while (j < k && streams[j] != hs[i]->stream) j++;
    if (j == k) streams[k++] = hs[i]->stream;
  }
  int rc = b->v->begin(b, streams, k, err, errlen);
  free(streams);
  return rc;
}

/* Waits until everything enqueued since begin is done. */
static int finish(gs__backend *b, char *err, size_t errlen) {
  return b->v->finish ? b->v->finish(b, err, errlen) : GS__OK;
}

/* Completes a successful op, running its finish step first. */
static void succeed(gs_ctx *ctx, struct gs_handle *h) {
  char err[1024];
  int rc = h->finish ? h->finish(h, err, sizeof err) : GS__OK;
  gs__handle_complete(ctx, h, (gs_status)rc, rc ? err : NULL);
}

static void add_stats(gs_ctx *ctx, const gs__backend *b, size_t ntensors) {
  pthread_mutex_lock(&ctx->mu);
  ctx->stats.collectives++;
  if (b->v->device == GS__DEVICE_GPU) ctx->stats.gpu_collectives++;
  ctx->stats.tensors += ntensors;
  if (ntensors > 1) ctx->stats.fused_collectives++;
  pthread_mutex_unlock(&ctx->mu);
}

/* Wraps a backend failure with the tensor, rank and host; an abort stays
 * an abort, anything else is a data-plane failure. */
static int data_plane_error(gs_ctx *ctx, const char *name, int fused, int rc, char *err,
                            size_t errlen) {
  if (rc == GS__ERR_NO_MEMORY || rc == GS__ERR_INTERNAL) return rc;
  char *detail = strdup(err);
  snprintf(err, errlen, "tensor '%s'%s (rank %d on %s): %s", name,
           fused ? " and the tensors fused with it" : "", ctx->rank, ctx->host,
           detail ? detail : "data-plane failure");
  free(detail);
  return rc == GS__ERR_ABORTED ? GS__ERR_ABORTED : GS__ERR_DATA_PLANE;
}

/* A fused allreduce over the members' own buffers (backend allreduce_segs):
 * segments in the order of the shared layout, alignment gaps and the
 * members of a rank that joined as zeros. GS__ERR_UNSUPPORTED when the
 * response or the backend needs the packed path (nothing happened then). */
static int run_segments(gs__backend *b, const gs__response *r, struct gs_handle *const *hs,
                        const uint64_t *offs, uint64_t total, char *err, size_t errlen) {
  size_t n = r->ntensors, esize = gs__dtype_size(r->dtype), nseg = 0;
  if (r->prescale != 1.0) return GS__ERR_UNSUPPORTED;
  for (size_t i = 0; i < n; i++)
    if (hs[i] && hs[i]->compress) return GS__ERR_UNSUPPORTED;
  /* Not zeroed: only the nseg entries written below are read (a round of
   * a few hundred small tensors would zero kilobytes on its critical
   * path for nothing). */
  gs__seg *sg = n < SIZE_MAX / (2 * sizeof *sg) ? malloc((2 * n + 1) * sizeof *sg) : NULL;
  if (!sg) {
    snprintf(err, errlen, "out of memory running a collective of %zu tensors", n);
    return GS__ERR_NO_MEMORY;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    size_t elems = (size_t)(gs__tensor_bytes(r->dtype, t->shape, t->ndim) / esize);
    if (hs[i] && hs[i]->count != elems) { /* cannot happen after validation; pack then */
      free(sg);
      return GS__ERR_UNSUPPORTED;
    }
    if (offs[i] > at) sg[nseg++] = (gs__seg){NULL, NULL, (size_t)(offs[i] - at) / esize};
    sg[nseg++] = hs[i] ? (gs__seg){hs[i]->send, hs[i]->recv, elems} : (gs__seg){NULL, NULL, elems};
    at = offs[i] + (uint64_t)elems * esize;
  }
  if (total > at) sg[nseg++] = (gs__seg){NULL, NULL, (size_t)(total - at) / esize};
  int rc = b->v->allreduce_segs(b, sg, nseg, r->dtype, r->reduce_op, r->postscale, err, errlen);
  free(sg);
  return rc;
}

/* Runs one allreduce response: a lone unscaled tensor in place in its recv
 * buffer; otherwise packed (with prescale, as one batch) into the backend's
 * fusion staging at the offsets of the shared layout, reduced once, and
 * unpacked (with postscale, one batch). Returns GS__OK, or a failure that
 * ends the job (message in err). */
static int run_allreduce(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                         char *err, size_t errlen) {
  size_t n = r->ntensors, esize = gs__dtype_size(r->dtype);
  struct gs_handle **hs = calloc(n, sizeof *hs);
  uint64_t *offs = calloc(n, sizeof *offs);
  /* tensors and the gaps before them; not zeroed (as run_segments' sg) */
  gs__copy *cp = n < SIZE_MAX / (2 * sizeof *cp) ? malloc((2 * n + 1) * sizeof *cp) : NULL;
  int rc = GS__OK;
  if (!hs || !offs || !cp) {
    snprintf(err, errlen, "out of memory running a collective of %zu tensors", n);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  gs__backend *b = backend_of(ctx, r, err, errlen);
  if (!b) {
    rc = GS__ERR_INTERNAL;
    goto out_free;
  }
  int missing = 0;
  for (size_t i = 0; i < n; i++) {
    hs[i] = live_op(ops[i]);
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
   * is reduced in place in its recv buffer (or in the staging buffer when it
   * is compressed or this rank has joined); anything else is packed at the
   * offsets of the shared layout. */
  /* A backend that scales inside its reduction (allreduce_scaled) applies
   * the postscale there; otherwise the unpack does. */
  int post_in_backend = b->v->allreduce_scaled != NULL;
  double unpack_scale = post_in_backend ? 1.0 : r->postscale;
  int packed = n > 1 || r->prescale != 1.0 || (r->postscale != 1.0 && !post_in_backend);
  uint64_t total = packed ? gs__fusion_offsets(r, offs)
                          : gs__tensor_bytes(r->dtype, r->tensors[0].shape, r->tensors[0].ndim);
  if (total == UINT64_MAX || total > SIZE_MAX) {
    snprintf(err, errlen,
             "tensor '%s'%s: the plan's sizes overflow on rank %d (%s); every rank must pass "
             "shapes whose total fits in memory",
             r->tensors[0].name, n > 1 ? " and the tensors fused with it" : "", ctx->rank,
             ctx->host);
    rc = GS__ERR_INVALID_ARG;
    goto out_free;
  }
  size_t count = (size_t)(total / esize), ncp = 0;
  if ((rc = begin(b, hs, n, err, errlen))) goto out_fail;
  void *buf;
  if (packed && b->v->allreduce_segs) {
    /* Reduce straight from and into the tensors' own buffers (shm, the
     * TCP ring, hierarchical): no pack or unpack pass. Not with a prescale
     * or compression (the pack applies those); a backend that cannot (the
     * ring in deterministic mode, NCCL) says so before
     * doing anything, and the fused buffer is packed instead. */
    rc = run_segments(b, r, hs, offs, total, err, errlen);
    if (rc == GS__OK) goto out_done;
    if (rc != GS__ERR_UNSUPPORTED) goto out_fail;
    rc = GS__OK;
  }
  if (!packed && hs[0] && !hs[0]->compress) {
    struct gs_handle *h = hs[0];
    if (h->send != h->recv && h->count) {
      cp[0] = (gs__copy){h->send, h->recv, h->count, r->dtype, r->dtype, 1.0};
      if ((rc = b->v->copy(b, cp, 1, err, errlen))) goto out_fail;
    }
    buf = h->recv;
  } else {
    uint8_t *fb = b->v->staging(b, total ? total : 1, err, errlen);
    if (!fb) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free;
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
      const gs__plan_tensor *t = &r->tensors[i];
      size_t bytes = (size_t)gs__tensor_bytes(r->dtype, t->shape, t->ndim);
      if (offs[i] > at) /* alignment padding: whole elements (alignment % esize == 0) */
        cp[ncp++] =
            (gs__copy){NULL, fb + at, (size_t)(offs[i] - at) / esize, r->dtype, r->dtype, 1.0};
      if (!hs[i]) /* joined: zeros */
        cp[ncp++] = (gs__copy){NULL, fb + offs[i], bytes / esize, r->dtype, r->dtype, 1.0};
      else
        cp[ncp++] = (gs__copy){hs[i]->send,  fb + offs[i],
                               hs[i]->count, hs[i]->compress ? GS__FLOAT32 : r->dtype,
                               r->dtype,     r->prescale};
      at = offs[i] + bytes;
    }
    if (total > at)
      cp[ncp++] = (gs__copy){NULL, fb + at, (size_t)(total - at) / esize, r->dtype, r->dtype, 1.0};
    if ((rc = b->v->copy(b, cp, ncp, err, errlen))) goto out_fail;
    buf = fb;
  }
  rc = post_in_backend ? b->v->allreduce_scaled(b, buf, count, r->dtype, r->reduce_op, r->postscale,
                                                err, errlen)
                       : b->v->allreduce(b, buf, count, r->dtype, r->reduce_op, err, errlen);
  if (rc) goto out_fail;
  ncp = 0;
  for (size_t i = 0; i < n; i++)
    if (hs[i] && buf != hs[i]->recv)
      cp[ncp++] = (gs__copy){(uint8_t *)buf + offs[i],
                             hs[i]->recv,
                             hs[i]->count,
                             r->dtype,
                             hs[i]->compress ? GS__FLOAT32 : r->dtype,
                             unpack_scale};
  if (ncp && (rc = b->v->copy(b, cp, ncp, err, errlen))) goto out_fail;
out_done:
  if ((rc = finish(b, err, errlen))) goto out_fail;
  add_stats(ctx, b, n - (size_t)missing); /* before the completions, so waiters see them */
  for (size_t i = 0; i < n; i++)
    if (hs[i] && hs[i]->finish) {
      succeed(ctx, hs[i]);
      hs[i] = NULL;
    }
  gs__handles_complete_ok(ctx, hs, n); /* the rest at once */
  goto out_free;
out_fail:
  rc = data_plane_error(ctx, r->tensors[0].name, n > 1, rc, err, errlen);
out_free:
  free(hs);
  free(offs);
  free(cp);
  return rc;
}

/* The op a non-fused response names (ops: the plan node's), or a job
 * failure. */
static int lone_op(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                   struct gs_handle **h, char *err, size_t errlen) {
  *h = live_op(ops[0]);
  if (*h || job_failed(ctx)) return GS__OK;
  snprintf(err, errlen,
           "internal: plan names tensor '%s', which rank %d has not submitted (a gradsync bug; "
           "please report it with the coordinator's log)",
           r->tensors[0].name, ctx->rank);
  return GS__ERR_INTERNAL;
}

/* Bytes of `rows` rows of `row` bytes into *out, and *total += that, both
 * checked: rows may come from other ranks (the plan's per-rank sizes, an
 * alltoall's split matrix). 0, or -1 when rows is negative or a size
 * overflows (the caller reports it). */
static int rows_bytes(uint64_t row, int64_t rows, size_t *out, uint64_t *total) {
  uint64_t b;
  if (rows < 0 || row == UINT64_MAX || __builtin_mul_overflow(row, (uint64_t)rows, &b) ||
      b > SIZE_MAX || (total && __builtin_add_overflow(*total, b, total)) ||
      (total && *total > SIZE_MAX))
    return -1;
  *out = (size_t)b;
  return 0;
}

static int size_overflow(gs_ctx *ctx, const char *name, const char *op, size_t q, int64_t rows,
                         uint64_t row, char *err, size_t errlen) {
  snprintf(err, errlen,
           "tensor '%s': the %s's sizes overflow on rank %d (%s): %lld rows of %llu bytes from "
           "rank %zu; every rank must pass shapes whose total fits in memory",
           name, op, ctx->rank, ctx->host, (long long)rows, (unsigned long long)row, q);
  return GS__ERR_INVALID_ARG;
}

/* Allgather, alone or fused: the per-rank first dimensions come in the
 * plan. In a fused allgather rank q's block holds, tensor after tensor, the
 * rows rank q contributes to each, so every rank computes the same block
 * sizes from the plan alone; the gathered rows are then split per tensor
 * into buffers the handles own (on the backend's device). */
static int run_allgather(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                         char *err, size_t errlen) {
  size_t n = r->ntensors, nr = (size_t)ctx->size, me = (size_t)ctx->rank;
  struct gs_handle **hs = calloc(n, sizeof *hs);
  uint64_t *row = calloc(n, sizeof *row);
  size_t *bytes = calloc(nr, sizeof *bytes);
  void **outs = calloc(n, sizeof *outs);
  gs__copy *cp = calloc(n * nr + 1, sizeof *cp);
  uint8_t *send = NULL, *recv = NULL;
  int rc = GS__OK;
  gs__backend *b = NULL;
  if (!hs || !row || !bytes || !outs || !cp) {
    snprintf(err, errlen, "out of memory running an allgather of %zu tensors", n);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  if (!(b = backend_of(ctx, r, err, errlen))) {
    rc = GS__ERR_INTERNAL;
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
    hs[i] = live_op(ops[i]);
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
    for (size_t q = 0; q < nr; q++) {
      size_t part;
      uint64_t sum = bytes[q];
      if (rows_bytes(row[i], t->rank_dims[q], &part, &sum) ||
          __builtin_add_overflow(total, (uint64_t)part, &total) || total > SIZE_MAX) {
        rc = size_overflow(ctx, t->name, "allgather", q, t->rank_dims[q], row[i], err, errlen);
        goto out_free;
      }
      bytes[q] = (size_t)sum;
    }
  }
  recv = b->v->mem_alloc(b, total ? total : 1);
  if (n > 1) send = b->v->staging(b, bytes[me] ? bytes[me] : 1, err, errlen);
  if (!recv || (n > 1 && !send)) {
    snprintf(err, errlen, "out of memory for an allgather of %llu bytes",
             (unsigned long long)total);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  if ((rc = begin(b, hs, n, err, errlen))) goto out_fail;
  if (n > 1) {
    size_t at = 0, ncp = 0;
    for (size_t i = 0; i < n; i++) {
      size_t bb = (size_t)(row[i] * (uint64_t)r->tensors[i].rank_dims[me]);
      if (bb) cp[ncp++] = (gs__copy){hs[i]->send, send + at, bb, GS__UINT8, GS__UINT8, 1.0};
      at += bb;
    }
    if (ncp && (rc = b->v->copy(b, cp, ncp, err, errlen))) goto out_fail;
  }
  rc = b->v->allgatherv(b, n > 1 ? send : hs[0]->send, recv, bytes, err, errlen);
  if (rc) goto out_fail;
  if (n == 1) {
    outs[0] = recv;
    recv = NULL; /* handed to the handle */
  } else {
    /* Tensor i's rows sit in every rank's block after the tensors before it. */
    size_t ncp = 0;
    for (size_t i = 0; i < n; i++) {
      const gs__plan_tensor *t = &r->tensors[i];
      uint64_t mine = 0;
      for (size_t q = 0; q < nr; q++) mine += row[i] * (uint64_t)t->rank_dims[q];
      if (!(outs[i] = b->v->mem_alloc(b, mine ? mine : 1))) {
        snprintf(err, errlen, "out of memory for an allgather result of %llu bytes",
                 (unsigned long long)mine);
        rc = GS__ERR_NO_MEMORY;
        goto out_fail;
      }
      size_t block = 0, at = 0;
      for (size_t q = 0; q < nr; q++) {
        size_t within = 0;
        for (size_t k = 0; k < i; k++)
          within += (size_t)(row[k] * (uint64_t)r->tensors[k].rank_dims[q]);
        size_t bb = (size_t)(row[i] * (uint64_t)t->rank_dims[q]);
        if (bb)
          cp[ncp++] = (gs__copy){
              recv + block + within, (uint8_t *)outs[i] + at, bb, GS__UINT8, GS__UINT8, 1.0};
        at += bb;
        block += bytes[q];
      }
    }
    if (ncp && (rc = b->v->copy(b, cp, ncp, err, errlen))) goto out_fail;
  }
  if ((rc = finish(b, err, errlen))) goto out_fail;
  add_stats(ctx, b, n);
  for (size_t i = 0; i < n; i++) {
    const gs__plan_tensor *t = &r->tensors[i];
    struct gs_handle *h = hs[i];
    int64_t *dims = malloc(nr * sizeof *dims);
    if (!dims) {
      gs__handle_complete(ctx, h, GS_ERR_NO_MEMORY, "out of memory for an allgather result");
      continue;
    }
    uint64_t mine = 0;
    for (size_t q = 0; q < nr; q++) {
      dims[q] = t->rank_dims[q];
      mine += row[i] * (uint64_t)t->rank_dims[q];
    }
    h->result = outs[i]; /* published to other threads by the completion below */
    h->result_free = b->v->mem_free;
    outs[i] = NULL;
    h->result_bytes = (size_t)mine;
    h->rank_dims = dims;
    h->nrank_dims = nr;
    succeed(ctx, h);
  }
  goto out_free;
out_fail:
  rc = data_plane_error(ctx, r->tensors[0].name, n > 1, rc, err, errlen);
out_free:
  if (b) {
    for (size_t i = 0; outs && i < n; i++) b->v->mem_free(outs[i]);
    b->v->mem_free(recv);
  }
  free(outs);
  free(cp);
  free(hs);
  free(row);
  free(bytes);
  return rc;
}

static int run_broadcast(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                         char *err, size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, ops, &h, err, errlen);
  if (rc || !h) return rc;
  gs__backend *b = backend_of(ctx, r, err, errlen);
  if (!b) return GS__ERR_INTERNAL;
  if ((rc = begin(b, &h, 1, err, errlen)) ||
      (rc = b->v->broadcast(b, h->recv, h->count * gs__dtype_size(r->dtype), r->root_rank, err,
                            errlen)) ||
      (rc = finish(b, err, errlen)))
    return data_plane_error(ctx, h->req.name, 0, rc, err, errlen);
  add_stats(ctx, b, 1);
  succeed(ctx, h);
  return GS__OK;
}

static int no_backend_op(const char *name, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "tensor '%s': the data plane has no %s", name, what);
  return GS__ERR_UNSUPPORTED;
}

/* Alltoall: the ranks first gather everyone's splits over the host data
 * plane (so the coordinator never carries the size x size matrix), then
 * exchange the rows on the tensor's device. The result and the rows
 * received from each rank stay with the handle. */
static int run_alltoall(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops, char *err,
                        size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, ops, &h, err, errlen);
  if (rc || !h) return rc;
  gs__backend *b = backend_of(ctx, r, err, errlen), *host = ctx->backends[GS__DEVICE_CPU];
  if (!b) return GS__ERR_INTERNAL;
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
  rc = host->v->allgatherv(host, h->splits, matrix, bytes, err, errlen);
  if (rc) {
    rc = data_plane_error(ctx, h->req.name, 0, rc, err, errlen);
    goto out_free;
  }
  uint64_t total = 0;
  for (size_t q = 0; q < n; q++) {
    recv_rows[q] = matrix[q * n + (size_t)ctx->rank];
    if (rows_bytes(row, h->splits[q], &send_bytes[q], NULL) ||
        rows_bytes(row, recv_rows[q], &recv_bytes[q], &total)) {
      rc = size_overflow(ctx, h->req.name, "alltoall", q, recv_rows[q], row, err, errlen);
      goto out_free;
    }
  }
  out = b->v->mem_alloc(b, total ? total : 1);
  if (!out) {
    snprintf(err, errlen, "tensor '%s': out of memory for %llu bytes", h->req.name,
             (unsigned long long)total);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  if ((rc = begin(b, &h, 1, err, errlen)) ||
      (rc = b->v->alltoallv(b, h->send, send_bytes, out, recv_bytes, err, errlen)) ||
      (rc = finish(b, err, errlen))) {
    rc = data_plane_error(ctx, h->req.name, 0, rc, err, errlen);
    goto out_free;
  }
  h->result = out;
  h->result_free = b->v->mem_free;
  h->result_bytes = (size_t)total;
  h->rank_dims = recv_rows;
  h->nrank_dims = n;
  out = NULL;
  recv_rows = NULL;
  add_stats(ctx, b, 1);
  succeed(ctx, h);
out_free:
  b->v->mem_free(out);
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
static int run_reducescatter(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                             char *err, size_t errlen) {
  struct gs_handle *h;
  int rc = lone_op(ctx, r, ops, &h, err, errlen);
  if (rc || !h) return rc;
  gs__backend *b = backend_of(ctx, r, err, errlen);
  if (!b) return GS__ERR_INTERNAL;
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
  void *work = b->v->mem_alloc(b, h->count ? h->count * esize : 1), *out = NULL;
  if (!counts || !dims || !work) {
    snprintf(err, errlen, "tensor '%s': out of memory for a reducescatter", h->req.name);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  size_t start = 0;
  for (size_t q = 0; q < n; q++) {
    dims[q] = rows / (int64_t)n + ((int64_t)q < rows % (int64_t)n ? 1 : 0);
    counts[q] = (size_t)dims[q] * row_elems;
    if ((int)q < ctx->rank) start += counts[q];
  }
  size_t mine = counts[ctx->rank];
  if (!(out = b->v->mem_alloc(b, mine ? mine * esize : 1))) {
    snprintf(err, errlen, "tensor '%s': out of memory for a reducescatter", h->req.name);
    rc = GS__ERR_NO_MEMORY;
    goto out_free;
  }
  gs__copy in = {h->send, work, h->count, r->dtype, r->dtype, 1.0};
  gs__copy res = {(uint8_t *)work + start * esize, out, mine, r->dtype, r->dtype, 1.0};
  if ((rc = begin(b, &h, 1, err, errlen)) ||
      (h->count && (rc = b->v->copy(b, &in, 1, err, errlen))) ||
      (rc = b->v->reducescatter(b, work, counts, r->dtype, r->reduce_op, err, errlen)) ||
      (mine && (rc = b->v->copy(b, &res, 1, err, errlen))) || (rc = finish(b, err, errlen))) {
    rc = data_plane_error(ctx, h->req.name, 0, rc, err, errlen);
    goto out_free;
  }
  h->result = out;
  h->result_free = b->v->mem_free;
  h->result_bytes = mine * esize;
  h->rank_dims = dims;
  h->nrank_dims = n;
  out = NULL;
  dims = NULL;
  add_stats(ctx, b, 1);
  succeed(ctx, h);
out_free:
  b->v->mem_free(work);
  b->v->mem_free(out);
  free(counts);
  free(dims);
  return rc;
}

/* Runs one collective response; ops: its tensors' ops (plan_node.ops). */
static int run_collective(gs_ctx *ctx, const gs__response *r, struct gs_handle *const *ops,
                          char *err, size_t errlen) {
  switch (r->op) {
  case GS__OP_ALLREDUCE:
    return run_allreduce(ctx, r, ops, err, errlen);
  case GS__OP_ALLGATHER:
    return run_allgather(ctx, r, ops, err, errlen);
  case GS__OP_BROADCAST:
    return run_broadcast(ctx, r, ops, err, errlen);
  case GS__OP_ALLTOALL:
    return run_alltoall(ctx, r, ops, err, errlen);
  case GS__OP_REDUCESCATTER:
    return run_reducescatter(ctx, r, ops, err, errlen);
  case GS__OP_JOIN: {
    /* Every rank has joined: the join round is over. */
    struct gs_handle *h;
    int rc = lone_op(ctx, r, ops, &h, err, errlen);
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
    int rc = lone_op(ctx, r, ops, &h, err, errlen);
    if (!rc && h) gs__handle_complete(ctx, h, GS_OK, NULL);
    return rc;
  }
  default:
    break;
  }
  for (size_t i = 0; i < r->ntensors; i++) {
    struct gs_handle *h = live_op(ops[i]);
    char msg[512];
    snprintf(msg, sizeof msg, "tensor '%s': %s is not supported by this library version",
             r->tensors[i].name, gs__op_type_name(r->op));
    if (h) gs__handle_complete(ctx, h, GS_ERR_UNSUPPORTED, msg);
  }
  return GS__OK;
}

int gs__run_plan(gs_ctx *ctx, const plan_node *n, char *err, size_t errlen) {
  const gs__plan *p = &n->plan;
  struct gs_handle *const *ops = n->ops;
  for (size_t i = 0; i < p->nresponses; i++) {
    const gs__response *r = &p->responses[i];
    if (r->kind == GS__RESP_ERROR) {
      for (size_t k = 0; k < r->ntensors; k++) {
        struct gs_handle *h = live_op(ops[k]);
        if (h)
          gs__handle_complete(ctx, h, (gs_status)r->error_status,
                              r->error_message ? r->error_message : "error from the coordinator");
      }
    } else {
      int rc = run_collective(ctx, r, ops, err, errlen);
      if (rc) return rc;
    }
    ops += r->ntensors;
  }
  return GS__OK;
}

void gs__plan_done_locked(gs_ctx *ctx, uint64_t seq) {
  ctx->stats.plans_executed++;
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

void gs__await_verdict(gs_ctx *ctx) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += VERDICT_WAIT_MS / 1000;
  ts.tv_nsec += (long)(VERDICT_WAIT_MS % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&ctx->mu);
  while (!ctx->fatal && !ctx->stop && ctx->fast_stop != 2)
    if (pthread_cond_timedwait(&ctx->cv, &ctx->mu, &ts) != 0) break;
  pthread_mutex_unlock(&ctx->mu);
}

/* Right after a fast round the exec thread does not sleep at once: its
 * next work is usually microseconds away (the application, which the round
 * just served, submits its next ops or barrier), and a thread that sleeps
 * lets an otherwise idle vCPU halt, whose wake-up goes through the
 * hypervisor (hundreds of us: docs/benchmarks.md "Idle vCPUs"). It yields
 * between looks at exec_bell for up to EXEC_SPIN_US, then sleeps on exec_cv
 * as before. Once the bell rang it keeps yielding while it keeps ringing (a
 * burst of submissions), for up to SETTLE_US, so that the next round takes
 * the burst whole, as a thread woken from its sleep did: a round of the
 * burst's first op alone would cost every rank one more agreement. Only
 * where this thread may run on more than one cpu: on one (a rank bound to
 * a core) the submitting thread runs only when this one does not, so
 * looking in between only takes its turns (np=2 bound: 2 us slower).
 * Measured (np=4 on 2 vCPUs, ResNet-50 control-only): see "Exec thread's
 * yield-spin" in docs/benchmarks.md. Cost: after a round that nothing
 * follows soon (once per training step), up to EXEC_SPIN_US of a cpu that
 * nothing else wanted (a yield lets any runnable thread run first); a job
 * whose ranks wait for nothing spins never. */
#define EXEC_SPIN_US 500
#define SETTLE_US 100

static int spin_pays(void) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) > 1;
}

static void await_work(gs_ctx *ctx, unsigned bell) {
  uint64_t t0 = gs__now_us();
  unsigned b;
  while ((b = atomic_load_explicit(&ctx->exec_bell, memory_order_relaxed)) == bell) {
    if (gs__now_us() - t0 >= EXEC_SPIN_US) return;
    sched_yield();
  }
  t0 = gs__now_us();
  for (;;) {
    sched_yield();
    unsigned b2 = atomic_load_explicit(&ctx->exec_bell, memory_order_relaxed);
    if (b2 == b || gs__now_us() - t0 >= SETTLE_US) return;
    b = b2;
  }
}

/* Fast work for this thread: none while an application thread runs a
 * round (gs__fast_round_caller); that thread wakes this one when it parks
 * its round, and a waiter's round leaves what it did not take for the next
 * submission's or wait's wake-up. */
static int exec_fast_work_locked(const gs_ctx *ctx) {
  return gs__fast_work_locked(ctx) && !ctx->fast_in_round;
}

/* Bound to one cpu (np=2 under --bind-to core), this thread shares it with
 * the application: a submission that wakes it should not hand it the cpu
 * at once (a round of the step's first op alone, while the application
 * still submits; the application waiting on the whole step then runs the
 * round itself: gs__fast_round_caller). SCHED_BATCH takes the thread out
 * of wake-up preemption only; it keeps its fair share of the cpu (it runs
 * when the application sleeps, yields, or used its slice), so ops still
 * complete without a wait. Elsewhere the thread stays SCHED_OTHER. */
static void one_cpu_batch(void) {
  if (spin_pays()) return;
  struct sched_param sp = {0};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
}

/* Runs a fast round (gs__fast_round, or gs__fast_round_resume for one an
 * application thread parked) with mu released and this thread marked
 * busy (caller holds mu). */
static void exec_round_locked(gs_ctx *ctx, void (*round)(gs_ctx *)) {
  ctx->exec_busy = 1;
  pthread_mutex_unlock(&ctx->mu);
  round(ctx);
  pthread_mutex_lock(&ctx->mu);
  ctx->exec_busy = 0;
}

void *gs__executor_main(void *arg) {
  gs_ctx *ctx = arg;
  char err[4096];
  int after_round = 0; /* a fast round just ended: see await_work */
  uint64_t spun_round = 0;
  one_cpu_batch();
  pthread_mutex_lock(&ctx->mu);
  for (;;) {
    if (ctx->fast_parked) { /* an application thread's round, first */
      ctx->fast_parked = 0;
      exec_round_locked(ctx, gs__fast_round_resume);
      after_round = 1;
      continue;
    }
    if (after_round && ctx->fast && !ctx->plans_head && !ctx->exec_stop &&
        !exec_fast_work_locked(ctx)) {
      unsigned bell = atomic_load_explicit(&ctx->exec_bell, memory_order_relaxed);
      pthread_mutex_unlock(&ctx->mu);
      if (spin_pays()) await_work(ctx, bell);
      pthread_mutex_lock(&ctx->mu);
    }
    after_round = 0;
    /* An application thread's round (api.c) took this thread's work: as
     * after a round of its own, look for the next (the next step's first
     * submission then finds it awake, with no futex wake-up, and its cpu
     * stays awake), once per such round, and only where it spins at all. */
    if (ctx->fast && ctx->fast_in_round && ctx->fast_round != spun_round && spin_pays()) {
      spun_round = ctx->fast_round;
      after_round = 1;
      continue;
    }
    /* exec_idle: see worker.h for why a submission in fast mode never
     * finds this thread asleep with work queued. */
    /* While an application thread runs a round, nothing (it wakes this
     * thread at the round's end when work is left, or when it parks it). */
    while (!ctx->fast_parked && (ctx->fast_in_round || (!ctx->plans_head && !ctx->exec_stop &&
                                                        !gs__fast_work_locked(ctx)))) {
      ctx->exec_idle = 1;
      pthread_cond_wait(&ctx->exec_cv, &ctx->mu);
      ctx->exec_idle = 0;
    }
    if (ctx->fast_parked) continue;
    if (!ctx->plans_head && gs__fast_work_locked(ctx)) {
      exec_round_locked(ctx, gs__fast_round);
      after_round = 1;
      continue;
    }
    if (!ctx->plans_head) break; /* stopped and drained */
    plan_node *n = ctx->plans_head;
    ctx->plans_head = n->next;
    if (!ctx->plans_head) ctx->plans_tail = NULL;
    ctx->exec_busy = 1; /* the comm thread runs no plan meanwhile (background.c) */
    ctx->exec_plan = 1; /* nor an application thread a round (api.c) */
    int failed = ctx->fatal != GS_OK;
    pthread_mutex_unlock(&ctx->mu);
    GS_TRACE(GS__TR_EXEC_WAKE, n->plan.seq, 0);
    /* After a failure the job is over: drop the plans, their ops already
     * failed with it. */
    int rc = failed ? GS__OK : gs__run_plan(ctx, n, err, sizeof err);
    GS_TRACE(GS__TR_PLAN_DONE, n->plan.seq, 0);
    if (rc == GS__ERR_DATA_PLANE) gs__await_verdict(ctx);
    if (rc) {
      GS_LOG_ERROR("%s", err);
      gs__ctx_fail(ctx, (gs_status)rc, err); /* the coordinator's verdict, if any, wins */
    }
    pthread_mutex_lock(&ctx->mu);
    gs__plan_done_locked(ctx, n->plan.seq);
    ctx->exec_busy = 0;
    ctx->exec_plan = 0;
    /* Reported at once only while this rank has ops waiting for a plan
     * (the coordinator may hold them for this report); otherwise with the
     * next message (background.c, send_cycle). */
    int kick = ctx->nunplanned ? gs__comm_wake_locked(ctx, 0) : 0;
    pthread_mutex_unlock(&ctx->mu);
    if (kick) gs__comm_kick(ctx);
    gs__plan_node_free(n);
    pthread_mutex_lock(&ctx->mu);
  }
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}
