/* Gradient aggregation (backward_passes_per_step) and
 * gs_broadcast_parameters.
 *
 * An aggregator keeps, per gradient name, the sum of the passes seen since
 * the last communication, in the gradient's dtype. The passes-th call for a
 * name adds the current gradient, writes the sum (divided by passes when
 * average_aggregated) into the caller's buffer, and allreduces that buffer
 * in place with gs_allreduce_async; the other calls only accumulate and
 * return a handle that is already complete. Since the allreduce runs on the
 * caller's buffer, never on the accumulator, no op in flight refers to the
 * aggregator: it may be destroyed at any time.
 *
 * Owns: the table of names and their accumulators. Threads: the table is
 * guarded by a mutex, so different names may be passed from different
 * threads; one name's accumulator is not guarded: all passes for one name
 * must come from one thread at a time (as a training loop does). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "dtype.h"
#include "sparse.h"
#include "worker.h"

/* One name's accumulation. Touched by one thread at a time (see above). */
typedef struct agg_entry {
  char *name;
  int sparse; /* accumulates dense scatters of sparse gradients */
  gs_dtype dtype;
  size_t count;       /* elements (sparse: dense_rows x row_len) */
  int64_t dense_rows; /* sparse only */
  size_t row_len;     /* sparse only */
  int seen;           /* passes accumulated since the last communication */
  void *acc;          /* count elements; NULL when passes == 1 */
  UT_hash_handle hh;
} agg_entry;

struct gs_aggregator {
  gs_ctx *ctx;
  int passes;
  int average;
  pthread_mutex_t mu; /* guards the table (not the entries' contents) */
  agg_entry *by_name;
};

gs_status gs_aggregator_create(gs_ctx *ctx, int passes, int average_aggregated,
                               gs_aggregator **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_aggregator_create: out is NULL");
  *out = NULL;
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "gs_aggregator_create: ctx is NULL");
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_aggregator_create", NULL);
  if (passes < 1)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_aggregator_create: passes=%d; the backward passes per step must be "
                         "1 or more",
                         passes);
  gs_aggregator *agg = calloc(1, sizeof *agg);
  if (!agg) return gs__set_error(GS_ERR_NO_MEMORY, "gs_aggregator_create: out of memory");
  agg->ctx = ctx;
  agg->passes = passes;
  agg->average = average_aggregated != 0;
  pthread_mutex_init(&agg->mu, NULL);
  *out = agg;
  return GS_OK;
}

void gs_aggregator_destroy(gs_aggregator *agg) {
  if (!agg) return;
  agg_entry *e, *tmp;
  HASH_ITER(hh, agg->by_name, e, tmp) {
    HASH_DEL(agg->by_name, e);
    free(e->name);
    free(e->acc);
    free(e);
  }
  pthread_mutex_destroy(&agg->mu);
  free(agg);
}

/* Finds name's entry, or creates it with the given layout. An existing entry
 * whose layout differs is an error naming the name. */
static gs_status entry_get(gs_aggregator *agg, const char *what, const char *name, int sparse,
                           gs_dtype dtype, size_t count, int64_t dense_rows, size_t row_len,
                           agg_entry **out) {
  gs_status st = GS_OK;
  pthread_mutex_lock(&agg->mu);
  agg_entry *e = NULL;
  HASH_FIND_STR(agg->by_name, name, e);
  if (e) {
    if (e->sparse != sparse) {
      st = gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s' was aggregated as a %s gradient and is now passed as a "
                         "%s one; a name must keep its kind in every pass",
                         what, name, e->sparse ? "sparse" : "dense", sparse ? "sparse" : "dense");
    } else if (e->dtype != dtype || e->count != count || e->dense_rows != dense_rows ||
               e->row_len != row_len) {
      char was[128], now[128];
      if (sparse) {
        snprintf(was, sizeof was, "%lld x %zu %s", (long long)e->dense_rows, e->row_len,
                 gs__dtype_name((gs__dtype)e->dtype));
        snprintf(now, sizeof now, "%lld x %zu %s", (long long)dense_rows, row_len,
                 gs__dtype_name((gs__dtype)dtype));
      } else {
        snprintf(was, sizeof was, "%zu %s", e->count, gs__dtype_name((gs__dtype)e->dtype));
        snprintf(now, sizeof now, "%zu %s", count, gs__dtype_name((gs__dtype)dtype));
      }
      st = gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s' was aggregated as %s elements (%d of %d passes done) but "
                         "this pass gives %s elements; every pass of a name must have the same "
                         "count and dtype",
                         what, name, was, e->seen, agg->passes, now);
    }
  } else {
    e = calloc(1, sizeof *e);
    size_t bytes = count * gs_dtype_size(dtype);
    if (e) e->name = strdup(name);
    if (e && agg->passes > 1) e->acc = calloc(1, bytes ? bytes : 1);
    if (!e || !e->name || (agg->passes > 1 && !e->acc)) {
      if (e) {
        free(e->name);
        free(e->acc);
      }
      free(e);
      e = NULL;
      st = gs__set_error(GS_ERR_NO_MEMORY, "%s: tensor '%s': out of memory for %zu bytes", what,
                         name, bytes);
    } else {
      e->sparse = sparse;
      e->dtype = dtype;
      e->count = count;
      e->dense_rows = dense_rows;
      e->row_len = row_len;
      HASH_ADD_KEYPTR(hh, agg->by_name, e->name, strlen(e->name), e);
    }
  }
  pthread_mutex_unlock(&agg->mu);
  *out = e;
  return st;
}

/* A handle for a pass that does not communicate: built like any op's (so
 * the name, dtype and shape are checked) but completed at once and never
 * submitted; only the caller holds it. */
static gs_status completed_handle(gs_ctx *ctx, const char *name, gs_dtype dtype,
                                  const int64_t *shape, int ndim, size_t count, gs_handle **out) {
  struct gs_handle *h;
  gs_status st = gs__op_new_counted(ctx, name, GS__OP_ALLREDUCE, dtype, shape, ndim, count, &h);
  if (st) return st;
  gs__op_complete_unsubmitted(h);
  *out = h;
  return GS_OK;
}

/* The op checks every pass shares, so a bad op fails on the first pass, not
 * only on the communicating one. */
static gs_status check_op(const char *what, const char *name, gs_reduce_op op) {
  if ((int)op < 0 || (int)op >= GS__REDUCE_OP_COUNT)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': reduce op %d is not a gs_reduce_op (GS_SUM .. "
                         "GS_ADASUM)",
                         what, name ? name : "?", (int)op);
  if (op == GS_ADASUM)
    return gs__set_error(GS_ERR_UNSUPPORTED,
                         "%s: tensor '%s': the adasum reduce op is not supported yet; use "
                         "GS_AVERAGE or GS_SUM",
                         what, name ? name : "?");
  return GS_OK;
}

gs_status gs_aggregator_allreduce_async(gs_aggregator *agg, const char *name, void *grad,
                                        size_t count, gs_dtype dtype, gs_reduce_op op,
                                        const gs_allreduce_opts *opts, gs_handle **out) {
  static const char what[] = "gs_aggregator_allreduce_async";
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "%s: out is NULL", what);
  *out = NULL;
  if (!agg) return gs__set_error(GS_ERR_INVALID_ARG, "%s: agg is NULL", what);
  if (gs__forked(agg->ctx)) return gs__fork_error(agg->ctx, what, name);
  gs_status st = check_op(what, name, op);
  if (st) return st;
  gs_allreduce_opts ro;
  gs_allreduce_opts_init(&ro);
  if (opts) {
    if ((st = gs__opts_copy(&ro, opts, "gs_allreduce_opts"))) return st;
    opts = &ro;
  }
  /* The passes accumulate on the host. */
  if ((st = gs__host_only(agg->ctx, grad, what, name))) return st;
  if (count > 0 && !grad)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: tensor '%s': grad is NULL for %zu elements", what,
                         name ? name : "?", count);
  if (count > (size_t)INT64_MAX / 16)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: tensor '%s': count %zu is too large", what,
                         name ? name : "?", count);
  int64_t flat = (int64_t)count;
  const int64_t *shape = opts && opts->ndim > 0 ? opts->shape : &flat;
  int ndim = opts && opts->ndim > 0 ? opts->ndim : 1;
  /* Build the early handle first: it checks the name, dtype and shape, and
   * nothing can fail after the accumulation. */
  gs_handle *done_h;
  st = completed_handle(agg->ctx, name, dtype, shape, ndim, count, &done_h);
  if (st) return st;
  agg_entry *e;
  st = entry_get(agg, what, name, 0, dtype, count, 0, 0, &e);
  if (st) goto out_free_handle;
  size_t bytes = count * gs_dtype_size(dtype);

  if (e->seen + 1 < agg->passes) {
    if (e->seen == 0) {
      if (bytes) memcpy(e->acc, grad, bytes);
    } else {
      gs__reduce(e->acc, grad, count, (gs__dtype)dtype, GS__SUM);
    }
    e->seen++;
    *out = done_h;
    return GS_OK;
  }

  /* The communicating pass: grad becomes the sum of the passes. A failed
   * submission (a name still in flight, bad opts) must leave grad and the
   * accumulation as they were, so the caller's gradient is kept aside. */
  gs_handle_free(done_h);
  void *saved = NULL;
  if (agg->passes > 1) {
    saved = malloc(bytes ? bytes : 1);
    if (!saved)
      return gs__set_error(GS_ERR_NO_MEMORY, "%s: tensor '%s': out of memory for %zu bytes", what,
                           name, bytes);
    if (bytes) memcpy(saved, grad, bytes);
    gs__reduce(grad, e->acc, count, (gs__dtype)dtype, GS__SUM);
    if (agg->average) gs__divide(grad, count, (gs__dtype)dtype, agg->passes);
  }
  st = gs_allreduce_async(agg->ctx, name, grad, grad, count, dtype, op, opts, out);
  if (st) {
    if (saved && bytes) memcpy(grad, saved, bytes);
  } else {
    e->seen = 0; /* the next pass overwrites the accumulator */
  }
  free(saved);
  return st;

out_free_handle:
  gs_handle_free(done_h);
  return st;
}

gs_status gs_aggregator_sparse_allreduce_async(gs_aggregator *agg, const char *name,
                                               const int64_t *indices, const void *values,
                                               size_t nnz, size_t row_len, gs_dtype dtype,
                                               gs_reduce_op op, const gs_sparse_opts *opts,
                                               gs_handle **out) {
  static const char what[] = "gs_aggregator_sparse_allreduce_async";
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "%s: out is NULL", what);
  *out = NULL;
  if (!agg) return gs__set_error(GS_ERR_INVALID_ARG, "%s: agg is NULL", what);
  if (gs__forked(agg->ctx)) return gs__fork_error(agg->ctx, what, name);
  gs_sparse_opts so;
  gs_sparse_opts_init(&so);
  if (opts) {
    gs_status cst = gs__opts_copy(&so, opts, "gs_sparse_opts");
    if (cst) return cst;
    opts = &so;
  }
  if (!opts || !opts->sparse_as_dense)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': sparse gradients in an aggregator need "
                         "opts->sparse_as_dense = 1 (with dense_rows and dense_out): the passes "
                         "are accumulated in the dense form; or reduce them without an "
                         "aggregator (gs_sparse_allreduce_async)",
                         what, name ? name : "?");
  gs_status st = gs__sparse_check_op(what, name, op);
  if (st) return st;
  size_t count;
  if ((st = gs__sparse_check_dense(what, name, opts, row_len, &count))) return st;
  st = gs__sparse_check_rows(what, name, indices, values, nnz, row_len, dtype, opts->dense_rows);
  if (st) return st;
  int64_t shape[2] = {opts->dense_rows, (int64_t)row_len};
  gs_handle *done_h;
  st = completed_handle(agg->ctx, name, dtype, shape, 2, count, &done_h);
  if (st) return st;
  agg_entry *e;
  st = entry_get(agg, what, name, 1, dtype, count, opts->dense_rows, row_len, &e);
  if (st) {
    gs_handle_free(done_h);
    return st;
  }
  size_t bytes = count * gs_dtype_size(dtype);

  if (e->seen + 1 < agg->passes) {
    if (e->seen == 0 && bytes) memset(e->acc, 0, bytes);
    gs__sparse_scatter_add(e->acc, indices, values, nnz, row_len, dtype);
    e->seen++;
    *out = done_h;
    return GS_OK;
  }

  /* The communicating pass: dense_out is an output only, so a failed
   * submission leaves the accumulation as it was (dense_out undefined). */
  gs_handle_free(done_h);
  if (bytes) memset(opts->dense_out, 0, bytes);
  gs__sparse_scatter_add(opts->dense_out, indices, values, nnz, row_len, dtype);
  if (agg->passes > 1) {
    gs__reduce(opts->dense_out, e->acc, count, (gs__dtype)dtype, GS__SUM);
    if (agg->average) gs__divide(opts->dense_out, count, (gs__dtype)dtype, agg->passes);
  }
  gs_allreduce_opts ao;
  gs_allreduce_opts_init(&ao);
  ao.shape = shape;
  ao.ndim = 2;
  st = gs_allreduce_async(agg->ctx, name, opts->dense_out, opts->dense_out, count, dtype, op, &ao,
                          out);
  if (!st) e->seen = 0;
  return st;
}

gs_status gs_broadcast_parameters(gs_ctx *ctx, size_t n, const char *const *names,
                                  void *const *bufs, const size_t *counts, const gs_dtype *dtypes,
                                  int root) {
  static const char what[] = "gs_broadcast_parameters";
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "%s: ctx is NULL", what);
  if (gs__forked(ctx)) return gs__fork_error(ctx, what, NULL);
  if (n == 0) return GS_OK;
  if (!names || !bufs || !counts || !dtypes)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: %s is NULL for %zu parameters (names, bufs, counts and dtypes must "
                         "each hold n entries)",
                         what,
                         !names    ? "names"
                         : !bufs   ? "bufs"
                         : !counts ? "counts"
                                   : "dtypes",
                         n);
  if (root < 0 || root >= ctx->size)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: root %d is not a rank of this job (0..%d)", what,
                         root, ctx->size - 1);
  gs_handle **hs = calloc(n, sizeof *hs);
  if (!hs) return gs__set_error(GS_ERR_NO_MEMORY, "%s: out of memory", what);
  gs_status first = GS_OK;
  char *first_msg = NULL;
  /* A parameter that cannot be submitted does not stop the others: the
   * other ranks wait for them too. */
  for (size_t i = 0; i < n; i++) {
    if (gs_is_local(ctx, names[i])) continue;
    gs_status st =
        gs_broadcast_async(ctx, names[i], bufs[i], counts[i], dtypes[i], root, NULL, &hs[i]);
    if (st && !first) {
      first = st;
      if (asprintf(&first_msg, "parameter %zu ('%s') could not be submitted: %s", i,
                   names[i] ? names[i] : "(null)", gs_last_error(ctx)) < 0)
        first_msg = NULL;
    }
  }
  /* Every submitted broadcast is waited for, also after a failure: their
   * buffers are the caller's and must not be written after we return. The
   * library fails these waits when the job fails. */
  for (size_t i = 0; i < n; i++) {
    if (!hs[i]) continue;
    gs_status st = gs_wait(hs[i], -1);
    if (st && !first) {
      first = st;
      if (asprintf(&first_msg, "parameter %zu ('%s') failed: %s", i, names[i],
                   gs_handle_error(hs[i])) < 0)
        first_msg = NULL;
    }
    gs_handle_free(hs[i]);
  }
  free(hs);
  if (first) gs__set_error(first, "%s: %s", what, first_msg ? first_msg : gs_status_str(first));
  free(first_msg);
  return first;
}
