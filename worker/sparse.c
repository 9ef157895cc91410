/* Sparse gradients (IndexedSlices): gs_sparse_allreduce_async and
 * gs_sparse_result.
 *
 * Default path: every rank's rows travel in ONE allgather of shape
 * [nnz, slots + row_len] in the values' dtype, each row being its int64
 * index packed into the first `slots` elements (slots = 8 / dtype size:
 * float64/int64 1, float32/int32 2, float16/bfloat16 4, int8/uint8 8)
 * followed by the row's values. Two allgathers (indices, then values), as
 * the design first had it, would cost two negotiations with the
 * coordinator and two collectives for every sparse gradient, and the two
 * could interleave with other tensors; the packed form costs one of each
 * and the coordinator still checks what matters across ranks: the dtype
 * and the row length (the second dimension), while nnz (the first) may
 * differ per rank, 0 included. The bytes travel unchanged (the ring copies
 * them), so the index survives the trip whatever the dtype.
 *
 * The exec thread unpacks the gathered rows in the op's finish hook, before
 * the handle completes: the indices into an array the handle owns, the
 * values compacted in place in the allgather result (so gs_handle_result and
 * gs_allgather_dims of a sparse op give the values and each rank's row
 * count), divided by size for GS_AVERAGE. Each row is divided on its own,
 * as Horovod does (values / size), so integer averages truncate per row;
 * sparse_as_dense truncates the dense sum instead. For floats both paths
 * give the same dense result up to rounding.
 *
 * sparse_as_dense: the rows are scatter-added (repeated indices add up) into
 * the caller's zeroed dense_out on the calling thread, which is then
 * allreduced in place through gs_allreduce_async. dense_out is an output:
 * when that submission fails (a name in flight, a failed job) its contents
 * are undefined, though nothing else changed.
 *
 * Owns: the packed send buffer and the gathered indices of each op (the
 * handle's data). Runs on application threads, except the finish hook (the
 * exec thread). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "sparse.h"
#include "status.h"
#include "worker.h"

/* What a sparse op keeps in its handle (h->data). Written by the calling
 * thread before submission and by the exec thread's finish hook before the
 * completion publishes it; read-only afterwards. */
typedef struct sparse_op {
  void *packed;     /* this rank's rows as sent (h->send) */
  int64_t *indices; /* the gathered indices, valid once done */
  size_t nnz;       /* gathered rows, valid once done */
  size_t row_len;
  size_t slots; /* elements of the dtype that carry one int64 index */
  int divisor;  /* GS_AVERAGE: size (1 when the values stay as they are) */
} sparse_op;

static void sparse_op_free(void *data) {
  sparse_op *s = data;
  if (!s) return;
  free(s->packed);
  free(s->indices);
  free(s);
}

gs_status gs__sparse_check_op(const char *what, const char *name, gs_reduce_op op) {
  if (op == GS_SUM || op == GS_AVERAGE) return GS_OK;
  const char *op_name = (int)op >= 0 && (int)op < GS__REDUCE_OP_COUNT
                            ? gs__reduce_op_name((gs__reduce_op)op)
                            : "unknown";
  return gs__set_error(GS_ERR_INVALID_ARG,
                       "%s: tensor '%s': reduce op %s (%d) is not supported for sparse gradients; "
                       "valid ops are GS_SUM and GS_AVERAGE",
                       what, name ? name : "?", op_name, (int)op);
}

gs_status gs__sparse_check_rows(const char *what, const char *name, const int64_t *indices,
                                const void *values, size_t nnz, size_t row_len, gs_dtype dtype,
                                int64_t dense_rows) {
  const char *n = name ? name : "?";
  if (gs_dtype_size(dtype) == 0)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': dtype %d is not a gs_dtype (GS_FLOAT32 .. GS_INT16)",
                         what, n, (int)dtype);
  if (nnz > 0 && (!indices || (!values && row_len > 0)))
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: tensor '%s': %s is NULL for nnz=%zu rows", what,
                         n, !indices ? "indices" : "values", nnz);
  for (size_t i = 0; i < nnz; i++) {
    if (indices[i] < 0)
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "%s: tensor '%s': indices[%zu] = %lld is negative; row indices must be "
                           "0 or more",
                           what, n, i, (long long)indices[i]);
    if (dense_rows > 0 && indices[i] >= dense_rows)
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "%s: tensor '%s': indices[%zu] = %lld is out of range for a dense "
                           "tensor of dense_rows=%lld rows (valid: 0..%lld)",
                           what, n, i, (long long)indices[i], (long long)dense_rows,
                           (long long)dense_rows - 1);
  }
  return GS_OK;
}

gs_status gs__sparse_check_dense(const char *what, const char *name, const gs_sparse_opts *opts,
                                 size_t row_len, size_t *count) {
  const char *n = name ? name : "?";
  if (!opts || opts->dense_rows <= 0)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': sparse_as_dense needs opts->dense_rows > 0 (the rows "
                         "of the dense tensor), got %lld",
                         what, n, opts ? (long long)opts->dense_rows : 0LL);
  if (!opts->dense_out)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': sparse_as_dense needs opts->dense_out, a buffer of "
                         "dense_rows x row_len = %lld x %zu elements",
                         what, n, (long long)opts->dense_rows, row_len);
  if (row_len > 0 && (uint64_t)opts->dense_rows > (uint64_t)(INT64_MAX / 16) / row_len)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': dense_rows x row_len = %lld x %zu elements is too "
                         "large",
                         what, n, (long long)opts->dense_rows, row_len);
  *count = (size_t)opts->dense_rows * row_len;
  return GS_OK;
}

void gs__sparse_scatter_add(void *dense, const int64_t *indices, const void *values, size_t nnz,
                            size_t row_len, gs_dtype dtype) {
  size_t row = row_len * gs_dtype_size(dtype);
  if (row == 0) return;
  for (size_t i = 0; i < nnz; i++)
    gs__reduce((uint8_t *)dense + (size_t)indices[i] * row, (const uint8_t *)values + i * row,
               row_len, (gs__dtype)dtype, GS__SUM);
}

/* Finish hook (exec thread, before the completion): splits the gathered
 * packed rows into indices and values. */
static int unpack_rows(struct gs_handle *h, char *err, size_t errlen) {
  sparse_op *s = h->data;
  size_t esize = gs__dtype_size(h->req.dtype);
  size_t packed_row = (s->slots + s->row_len) * esize, row = s->row_len * esize;
  size_t n = h->result_bytes / packed_row; /* packed_row >= 8 */
  int64_t *idx = malloc((n ? n : 1) * sizeof *idx);
  if (!idx) {
    snprintf(err, errlen, "tensor '%s': out of memory for the indices of %zu gathered sparse rows",
             h->req.name, n);
    return GS__ERR_NO_MEMORY;
  }
  uint8_t *base = h->result;
  /* Row i's values move to i * row, never past where they are read from. */
  for (size_t i = 0; i < n; i++) {
    memcpy(&idx[i], base + i * packed_row, sizeof idx[i]);
    if (row) memmove(base + i * row, base + i * packed_row + s->slots * esize, row);
  }
  h->result_bytes = n * row;
  void *shrunk = realloc(h->result, h->result_bytes ? h->result_bytes : 1);
  if (shrunk) h->result = shrunk;
  if (s->divisor > 1) gs__divide(h->result, n * s->row_len, h->req.dtype, s->divisor);
  s->indices = idx;
  s->nnz = n;
  return GS__OK;
}

/* A tensor registered local on this rank never leaves it: the result is
 * this rank's own rows, unpacked at once (as gs_allreduce_async does for
 * local tensors). */
static gs_status complete_local(struct gs_handle *h, size_t nnz, gs_handle **out) {
  sparse_op *s = h->data;
  size_t bytes = nnz * (s->slots + s->row_len) * gs__dtype_size(h->req.dtype);
  h->rank_dims = malloc(sizeof *h->rank_dims);
  if (!h->rank_dims) {
    gs__set_error(GS_ERR_NO_MEMORY, "gs_sparse_allreduce_async: tensor '%s': out of memory",
                  h->req.name);
    sparse_op_free(s);
    free(h);
    return GS_ERR_NO_MEMORY;
  }
  h->rank_dims[0] = (int64_t)nnz;
  h->nrank_dims = 1;
  h->result = s->packed; /* the handle frees it now */
  h->result_bytes = bytes;
  s->packed = NULL;
  char err[512];
  int rc = unpack_rows(h, err, sizeof err);
  if (rc) {
    gs__set_error((gs_status)rc, "gs_sparse_allreduce_async: %s", err);
    gs__handle_unref(h); /* the library's reference */
    gs__handle_unref(h); /* and the caller's: frees it */
    return (gs_status)rc;
  }
  h->send = NULL;
  gs__op_complete_unsubmitted(h);
  *out = h;
  return GS_OK;
}

/* sparse_as_dense: scatter-add into dense_out, allreduce it in place. */
static gs_status as_dense(gs_ctx *ctx, const char *name, const int64_t *indices, const void *values,
                          size_t nnz, size_t row_len, gs_dtype dtype, gs_reduce_op op,
                          const gs_sparse_opts *opts, gs_handle **out) {
  static const char what[] = "gs_sparse_allreduce_async";
  size_t count;
  gs_status st = gs__sparse_check_dense(what, name, opts, row_len, &count);
  if (st) return st;
  st = gs__sparse_check_rows(what, name, indices, values, nnz, row_len, dtype, opts->dense_rows);
  if (st) return st;
  if (count) memset(opts->dense_out, 0, count * gs_dtype_size(dtype));
  gs__sparse_scatter_add(opts->dense_out, indices, values, nnz, row_len, dtype);
  int64_t shape[2] = {opts->dense_rows, (int64_t)row_len};
  gs_allreduce_opts ao;
  gs_allreduce_opts_init(&ao);
  ao.shape = shape;
  ao.ndim = 2;
  return gs_allreduce_async(ctx, name, opts->dense_out, opts->dense_out, count, dtype, op, &ao,
                            out);
}

gs_status gs_sparse_allreduce_async(gs_ctx *ctx, const char *name, const int64_t *indices,
                                    const void *values, size_t nnz, size_t row_len, gs_dtype dtype,
                                    gs_reduce_op op, const gs_sparse_opts *opts, gs_handle **out) {
  static const char what[] = "gs_sparse_allreduce_async";
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "%s: out is NULL", what);
  *out = NULL;
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "%s: ctx is NULL", what);
  if (gs__forked(ctx)) return gs__fork_error(ctx, what, name);
  gs_status st = gs__sparse_check_op(what, name, op);
  if (st) return st;
  gs_sparse_opts so;
  gs_sparse_opts_init(&so);
  if (opts) {
    if ((st = gs__opts_copy(&so, opts, "gs_sparse_opts"))) return st;
    opts = &so;
  }
  if ((st = gs__host_only(ctx, values, what, name)) ||
      (st = gs__host_only(ctx, indices, what, name)) ||
      (opts && (st = gs__host_only(ctx, opts->dense_out, what, name))))
    return st;
  if (opts && opts->sparse_as_dense)
    return as_dense(ctx, name, indices, values, nnz, row_len, dtype, op, opts, out);
  /* dense_rows is optional here; when given, the indices are checked
   * against it as well. */
  st = gs__sparse_check_rows(what, name, indices, values, nnz, row_len, dtype,
                             opts ? opts->dense_rows : 0);
  if (st) return st;

  size_t esize = gs_dtype_size(dtype), slots = sizeof(int64_t) / esize;
  if (row_len > (SIZE_MAX / 16) / esize - slots ||
      (nnz > 0 && nnz > ((SIZE_MAX / 16) / esize) / (slots + row_len)))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: tensor '%s': nnz=%zu rows of row_len=%zu elements is too large", what,
                         name ? name : "?", nnz, row_len);
  int64_t shape[2] = {(int64_t)nnz, (int64_t)(slots + row_len)};
  struct gs_handle *h;
  st = gs__op_new(ctx, name, GS__OP_ALLGATHER, dtype, shape, 2, &h);
  if (st) return st;
  sparse_op *s = calloc(1, sizeof *s);
  size_t row = row_len * esize, packed_row = (slots + row_len) * esize;
  if (s) s->packed = malloc(nnz ? nnz * packed_row : 1); /* never NULL, even for nnz = 0 */
  if (!s || !s->packed) {
    free(s);
    free(h);
    return gs__set_error(GS_ERR_NO_MEMORY, "%s: tensor '%s': out of memory for %zu rows", what,
                         name, nnz);
  }
  for (size_t i = 0; i < nnz; i++) {
    uint8_t *dst = (uint8_t *)s->packed + i * packed_row;
    memcpy(dst, &indices[i], sizeof indices[i]);
    if (row) memcpy(dst + slots * esize, (const uint8_t *)values + i * row, row);
  }
  s->row_len = row_len;
  s->slots = slots;
  s->divisor = op == GS_AVERAGE ? ctx->size : 1;
  h->send = s->packed;
  h->finish = unpack_rows;
  h->data = s;
  h->free_data = sparse_op_free;
  if (gs_is_local(ctx, name)) {
    if (op == GS_AVERAGE && !ctx->scale_local) s->divisor = 1;
    return complete_local(h, nnz, out);
  }
  st = gs__op_submit(ctx, h, out);
  if (st) sparse_op_free(s); /* gs__op_submit freed only the handle */
  return st;
}

gs_status gs_sparse_result(const gs_handle *h, const int64_t **indices, const void **values,
                           size_t *nnz) {
  if (!h || !indices || !values || !nnz)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_sparse_result: NULL argument");
  struct gs_handle *hh = (struct gs_handle *)h;
  if (!atomic_load_explicit(&hh->done, memory_order_acquire))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_sparse_result: tensor '%s': the op is still pending; gs_wait for it "
                         "first",
                         h->req.name);
  if (h->status != GS_OK)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_sparse_result: tensor '%s': the op failed, it has no result (%s)",
                         h->req.name, h->error ? h->error : gs_status_str(h->status));
  if (h->free_data != sparse_op_free)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_sparse_result: tensor '%s' is not a sparse op with gathered rows (its "
                         "op is %s); a sparse_as_dense op writes its result to opts->dense_out",
                         h->req.name, gs__op_type_name(h->req.op));
  const sparse_op *s = h->data;
  *indices = s->indices;
  *values = h->result;
  *nnz = s->nnz;
  return GS_OK;
}
