/* Internal helpers for sparse gradients (rows of a dense tensor given as
 * indices + values), shared by sparse.c and aggregator.c. Pure functions of
 * their arguments; any thread. */
#ifndef GS_WORKER_SPARSE_H
#define GS_WORKER_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "gradsync.h"

/* GS_OK when op is GS_SUM or GS_AVERAGE, else GS_ERR_INVALID_ARG with a
 * message (prefixed by what, naming the tensor) listing the valid ops. */
gs_status gs__sparse_check_op(const char *what, const char *name, gs_reduce_op op);

/* Checks the arguments every sparse call shares: dtype, the buffers for nnz
 * rows, and every index against [0, dense_rows) (dense_rows <= 0: only
 * against 0). On failure sets the error (prefixed by what) and returns it. */
gs_status gs__sparse_check_rows(const char *what, const char *name, const int64_t *indices,
                                const void *values, size_t nnz, size_t row_len, gs_dtype dtype,
                                int64_t dense_rows);

/* Checks the sparse_as_dense settings of opts (dense_rows > 0, dense_out,
 * dense_rows x row_len elements addressable) and writes the dense element
 * count to *count. */
gs_status gs__sparse_check_dense(const char *what, const char *name, const gs_sparse_opts *opts,
                                 size_t row_len, size_t *count);

/* dense[indices[i]] += values row i for i < nnz (rows of row_len elements
 * of dtype; repeated indices add up). Indices must have been checked. */
void gs__sparse_scatter_add(void *dense, const int64_t *indices, const void *values, size_t nnz,
                            size_t row_len, gs_dtype dtype);

#endif
