/* gs-sparse-worker: a real worker process for the tests of sparse gradients,
 * gradient aggregation and gs_broadcast_parameters (test_sparse.c).
 *
 * It uses only the public API (gradsync.h) and is configured by the
 * environment as a training process would be. Each mode runs one scenario,
 * checks every value or error text against a reference computed locally
 * (every rank can generate every other rank's data), prints one summary
 * line on stdout and exits 0 on success, non-zero otherwise.
 *
 * Modes:
 *   sparse      every dtype x {sum, average} x {gathered rows, sparse_as_dense}
 *               over 2 rounds of random rows with repeated indices (the last
 *               rank has none); both paths against a dense reference; then
 *               a name registered local (this rank's rows, at once)
 *   mlp         the gradient of an embedding lookup (gather on a dense weight
 *               matrix) feeding a small MLP: sparse rows, sparse_as_dense and
 *               the dense form must give the same averaged gradient
 *   errors      invalid op, out-of-range and negative index, missing
 *               sparse_as_dense settings, gs_sparse_result on a dense op,
 *               sparse in an aggregator without sparse_as_dense, a changed
 *               count in an aggregator; the job goes on afterwards
 *   aggregate   backward_passes_per_step = 4: one collective per 4 passes,
 *               the reduced sum (or average) of the passes; dense, sparse and
 *               local names
 *   broadcast   gs_broadcast_parameters from root 1, one name local per rank
 *
 * Single-threaded: the main thread submits and waits. */
#include "gradsync.h"
#include "worker_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_MS 60000 /* one op never takes this long on a healthy job */

/* ---- dtypes (the test's own float16/bfloat16 conversions) ----------------- */

/* v / size as the library averages: floats divided and rounded to the dtype,
 * integers truncated toward zero. */
static double averaged(gs_dtype d, double v, int size) {
  if (wu_is_float(d)) return wu_as_stored(d, v / size);
  return (double)((int64_t)v / size);
}

/* ---- common helpers ------------------------------------------------------- */

static void wait_ok(gs_handle *h, const char *name) {
  gs_status s = gs_wait(h, WAIT_MS);
  if (s != GS_OK)
    wu_die("tensor '%s': gs_wait: %s: %s", name, wu_status_name(s), gs_handle_error(h));
}

static uint64_t collectives(gs_ctx *ctx) {
  gs_stats st;
  gs_stats_init(&st);
  wu_must(gs_get_stats(ctx, &st), "gs_get_stats", "-");
  return st.collectives;
}

/* ---- mode: sparse ----------------------------------------------------------- */

#define SP_ROWS 7    /* rows of the dense tensor */
#define SP_ROW_LEN 5 /* elements per row */

/* Rows of rank r for case t in round k: 2..8, none on the last rank. */
static size_t sp_nnz(int r, unsigned t, unsigned k) {
  if (r == g_size - 1) return 0;
  return 2 + (size_t)(wu_hash4((uint64_t)r + 1, t, k, 999) % 7);
}

/* Row i's index; row 1 repeats row 0's so that every rank adds up a repeat. */
static int64_t sp_index(int r, unsigned t, unsigned k, size_t i) {
  if (i == 1) i = 0;
  return (int64_t)(wu_hash4((uint64_t)r + 1, t, k, 1000 + i) % SP_ROWS);
}

/* Small values (halves for float types with room) so that every sum is exact
 * in the dtype: at most 3 ranks x 8 rows x 3 = 72 per dense element. */
static double sp_value(gs_dtype d, int r, unsigned t, unsigned k, size_t i, size_t j) {
  uint64_t h = wu_hash4((uint64_t)r + 1, t, (uint64_t)k * 1000 + i, 5000 + j);
  double step = (wu_is_float(d) && d != GS_BFLOAT16) ? 0.5 : 1.0;
  int n = (int)(3 / step);
  if (d == GS_UINT8) return (double)(h % (uint64_t)(n + 1)) * step;
  return (double)((int64_t)(h % (uint64_t)(2 * n + 1)) - n) * step;
}

typedef struct sp_case {
  char name[96];
  unsigned id;
  gs_dtype dt;
  gs_reduce_op op;
  int as_dense;
  size_t nnz;
  int64_t *idx;
  void *vals;
  void *dense_out;
  gs_handle *h;
} sp_case;

/* The dense reference of case c: the sum over ranks of the scatter-added
 * rows (ref) and of their magnitudes (mag, for tolerances); and, for the
 * gathered path of an integer average, the sum of the per-row truncated
 * quotients (trunc). */
static void sp_reference(const sp_case *c, unsigned k, double *ref, double *mag, double *trunc) {
  size_t n = SP_ROWS * SP_ROW_LEN;
  for (size_t e = 0; e < n; e++) ref[e] = mag[e] = trunc[e] = 0;
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < sp_nnz(r, c->id, k); i++)
      for (size_t j = 0; j < SP_ROW_LEN; j++) {
        size_t e = (size_t)sp_index(r, c->id, k, i) * SP_ROW_LEN + j;
        double v = sp_value(c->dt, r, c->id, k, i, j);
        ref[e] += v;
        mag[e] += fabs(v);
        trunc[e] += averaged(c->dt, v, g_size);
      }
}

/* got against the dense reference element e. */
static void sp_check_dense(const sp_case *c, unsigned k, const char *path, size_t e, double got,
                           const double *ref, const double *mag, const double *trunc) {
  double want;
  double tol = 0;
  if (c->op == GS_SUM) {
    want = ref[e];
  } else if (wu_is_float(c->dt)) {
    want = ref[e] / g_size;
    tol = wu_rel_tol(c->dt) * mag[e] / g_size;
  } else {
    /* Integers: the gathered rows are divided one by one, the dense sum once. */
    want = strcmp(path, "rows") == 0 ? trunc[e] : (double)((int64_t)ref[e] / g_size);
  }
  if (fabs(got - want) > tol)
    wu_die("tensor '%s' (round %u, %s): dense element [%zu][%zu]: got %.9g, expected %.9g "
           "(tolerance %g)",
           c->name, k, path, e / SP_ROW_LEN, e % SP_ROW_LEN, got, want, tol);
}

static size_t sp_check(const sp_case *c, unsigned k) {
  size_t n = SP_ROWS * SP_ROW_LEN;
  double ref[SP_ROWS * SP_ROW_LEN], mag[SP_ROWS * SP_ROW_LEN], trunc[SP_ROWS * SP_ROW_LEN];
  double dense[SP_ROWS * SP_ROW_LEN] = {0};
  sp_reference(c, k, ref, mag, trunc);
  if (c->as_dense) {
    for (size_t e = 0; e < n; e++)
      sp_check_dense(c, k, "sparse_as_dense", e, wu_get(c->dt, c->dense_out, e), ref, mag, trunc);
    return n;
  }
  const int64_t *gi;
  const void *gv;
  size_t gn;
  wu_must(gs_sparse_result(c->h, &gi, &gv, &gn), "gs_sparse_result", c->name);
  size_t total = 0, checks = 0;
  for (int r = 0; r < g_size; r++) total += sp_nnz(r, c->id, k);
  if (gn != total)
    wu_die("tensor '%s' (round %u): %zu gathered rows, expected %zu", c->name, k, gn, total);
  int64_t dims[16];
  int64_t dims_total = -1;
  wu_must(gs_allgather_dims(c->h, dims, 16, &dims_total), "gs_allgather_dims", c->name);
  if (dims_total != (int64_t)total)
    wu_die("tensor '%s': gs_allgather_dims total %lld, expected %zu", c->name,
           (long long)dims_total, total);
  size_t row = 0;
  for (int r = 0; r < g_size; r++) {
    if (dims[r] != (int64_t)sp_nnz(r, c->id, k))
      wu_die("tensor '%s': rank %d contributed %lld rows, expected %zu", c->name, r,
             (long long)dims[r], sp_nnz(r, c->id, k));
    for (size_t i = 0; i < sp_nnz(r, c->id, k); i++, row++) {
      int64_t want_idx = sp_index(r, c->id, k, i);
      if (gi[row] != want_idx)
        wu_die(
            "tensor '%s' (round %u): gathered row %zu (rank %d row %zu): index %lld, expected %lld",
            c->name, k, row, r, i, (long long)gi[row], (long long)want_idx);
      for (size_t j = 0; j < SP_ROW_LEN; j++) {
        double v = sp_value(c->dt, r, c->id, k, i, j);
        double want = c->op == GS_SUM ? v : averaged(c->dt, v, g_size);
        double got = wu_get(c->dt, gv, row * SP_ROW_LEN + j);
        double tol = c->op == GS_AVERAGE ? wu_rel_tol(c->dt) * fabs(v) : 0;
        if (fabs(got - want) > tol)
          wu_die(
              "tensor '%s' (round %u): gathered row %zu (rank %d row %zu) element %zu: got %.9g, "
              "expected %.9g",
              c->name, k, row, r, i, j, got, want);
        dense[(size_t)want_idx * SP_ROW_LEN + j] += got;
        checks++;
      }
    }
  }
  for (size_t e = 0; e < n; e++) sp_check_dense(c, k, "rows", e, dense[e], ref, mag, trunc);
  return checks + n;
}

static int mode_sparse(gs_ctx *ctx) {
  static const gs_dtype dts[] = {GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16,
                                 GS_INT32,   GS_INT64,   GS_INT8,    GS_UINT8};
  static const gs_reduce_op ops[] = {GS_SUM, GS_AVERAGE};
  enum { NCASES = 8 * 2 * 2, ROUNDS = 2 };
  sp_case *cs = wu_xcalloc(NCASES, sizeof *cs);
  size_t n = 0;
  for (size_t d = 0; d < 8; d++)
    for (size_t o = 0; o < 2; o++)
      for (int dense = 0; dense < 2; dense++, n++) {
        sp_case *c = &cs[n];
        c->id = (unsigned)n;
        c->dt = dts[d];
        c->op = ops[o];
        c->as_dense = dense;
        snprintf(c->name, sizeof c->name, "sparse/%s/%s/%s", wu_dtype_name(c->dt),
                 c->op == GS_SUM ? "sum" : "average", dense ? "as_dense" : "rows");
        c->idx = wu_xcalloc(8, sizeof *c->idx);
        c->vals = wu_xcalloc(8 * SP_ROW_LEN, 8);
        c->dense_out = wu_xcalloc(SP_ROWS * SP_ROW_LEN, 8);
      }
  size_t checks = 0;
  /* Submit everything, then wait: the ops overlap, and the second round
   * repeats every name with other row counts. */
  for (unsigned k = 0; k < ROUNDS; k++) {
    for (size_t t = 0; t < n; t++) {
      sp_case *c = &cs[t];
      c->nnz = sp_nnz(g_rank, c->id, k);
      for (size_t i = 0; i < c->nnz; i++) {
        c->idx[i] = sp_index(g_rank, c->id, k, i);
        for (size_t j = 0; j < SP_ROW_LEN; j++)
          wu_put(c->dt, c->vals, i * SP_ROW_LEN + j, sp_value(c->dt, g_rank, c->id, k, i, j));
      }
      memset(c->dense_out, 0x5A, SP_ROWS * SP_ROW_LEN * 8); /* garbage: must be zeroed */
      gs_sparse_opts o = {sizeof(gs_sparse_opts), c->as_dense, c->as_dense ? SP_ROWS : 0,
                          c->dense_out};
      /* A rank without rows may pass NULL buffers. */
      wu_must(gs_sparse_allreduce_async(ctx, c->name, c->nnz ? c->idx : NULL,
                                        c->nnz ? c->vals : NULL, c->nnz, SP_ROW_LEN, c->dt, c->op,
                                        &o, &c->h),
              "gs_sparse_allreduce_async", c->name);
    }
    for (size_t t = 0; t < n; t++) {
      wait_ok(cs[t].h, cs[t].name);
      checks += sp_check(&cs[t], k);
      gs_handle_free(cs[t].h);
    }
  }
  /* A name registered local never leaves this rank: its own rows, divided
   * by size for an average (scale_local is on by default), at once. */
  wu_must(gs_register_local(ctx, "sparse/local"), "gs_register_local", "sparse/local");
  int64_t lidx[3] = {4, 1, 4};
  float lvals[3 * 2] = {2, 4, 6, 8, 10, 12};
  uint64_t before = collectives(ctx);
  gs_handle *lh;
  wu_must(gs_sparse_allreduce_async(ctx, "sparse/local", lidx, lvals, 3, 2, GS_FLOAT32, GS_AVERAGE,
                                    NULL, &lh),
          "gs_sparse_allreduce_async", "sparse/local");
  int done = 0;
  wu_must(gs_test(lh, &done), "gs_test", "sparse/local");
  if (!done) wu_die("tensor 'sparse/local': a local sparse op is not complete at once");
  wait_ok(lh, "sparse/local");
  const int64_t *gi;
  const void *gv;
  size_t gn;
  wu_must(gs_sparse_result(lh, &gi, &gv, &gn), "gs_sparse_result", "sparse/local");
  if (gn != 3) wu_die("tensor 'sparse/local': %zu rows, expected this rank's 3", gn);
  for (size_t i = 0; i < 3; i++, checks++) {
    if (gi[i] != lidx[i]) wu_die("tensor 'sparse/local': row %zu: index %lld", i, (long long)gi[i]);
    for (size_t j = 0; j < 2; j++)
      if (((const float *)gv)[i * 2 + j] != lvals[i * 2 + j] / (float)g_size)
        wu_die("tensor 'sparse/local': row %zu element %zu: got %g, expected %g", i, j,
               ((const float *)gv)[i * 2 + j], lvals[i * 2 + j] / (float)g_size);
  }
  if (collectives(ctx) != before) wu_die("tensor 'sparse/local' ran a collective");
  gs_handle_free(lh);
  for (size_t t = 0; t < n; t++) {
    free(cs[t].idx);
    free(cs[t].vals);
    free(cs[t].dense_out);
  }
  free(cs);
  printf("sparse: %zu checks passed (%zu tensors x %d rounds, rank %d of %d)\n", checks, n,
         (int)ROUNDS, g_rank, g_size);
  return 0;
}

/* ---- mode: mlp ----------------------------------------------------------------
 * An embedding matrix E [V x D] looked up by token ids (a gather on a dense
 * variable), then a linear layer W [D x C] and softmax cross-entropy. The
 * gradient of E is sparse: one row dL/dh per looked-up id. */

#define MLP_V 20
#define MLP_D 6
#define MLP_C 4
#define MLP_B 9

static float mlp_param(uint64_t which, size_t i) {
  return (float)((double)(wu_hash4(77, which, i, 0) % 2001) / 1000.0 - 1.0);
}

/* Rank r's batch: ids (with repeats) and labels. */
static void mlp_batch(int r, int64_t *ids, int *labels) {
  for (size_t b = 0; b < MLP_B; b++) {
    ids[b] = (int64_t)(wu_hash4((uint64_t)r + 1, 1, b, 0) % (MLP_V / 2)); /* repeats likely */
    labels[b] = (int)(wu_hash4((uint64_t)r + 1, 2, b, 0) % MLP_C);
  }
}

/* dL/dh for each sample of rank r's batch (float32 rows). */
static void mlp_grad_rows(int r, int64_t *ids, float *rows) {
  int labels[MLP_B];
  mlp_batch(r, ids, labels);
  for (size_t b = 0; b < MLP_B; b++) {
    float h[MLP_D], logits[MLP_C], p[MLP_C], mx = -INFINITY, z = 0;
    for (size_t d = 0; d < MLP_D; d++) h[d] = mlp_param(1, (size_t)ids[b] * MLP_D + d);
    for (size_t c = 0; c < MLP_C; c++) {
      logits[c] = 0;
      for (size_t d = 0; d < MLP_D; d++) logits[c] += h[d] * mlp_param(2, d * MLP_C + c);
      if (logits[c] > mx) mx = logits[c];
    }
    for (size_t c = 0; c < MLP_C; c++) z += p[c] = expf(logits[c] - mx);
    for (size_t c = 0; c < MLP_C; c++) p[c] = p[c] / z - (labels[b] == (int)c ? 1.0f : 0.0f);
    for (size_t d = 0; d < MLP_D; d++) {
      float g = 0;
      for (size_t c = 0; c < MLP_C; c++) g += mlp_param(2, d * MLP_C + c) * p[c];
      rows[b * MLP_D + d] = g / MLP_B;
    }
  }
}

static int mode_mlp(gs_ctx *ctx) {
  int64_t ids[MLP_B];
  float rows[MLP_B * MLP_D];
  float dense_grad[MLP_V * MLP_D] = {0}, as_dense[MLP_V * MLP_D];
  double ref[MLP_V * MLP_D] = {0}, from_rows[MLP_V * MLP_D] = {0};
  mlp_grad_rows(g_rank, ids, rows);
  for (size_t b = 0; b < MLP_B; b++)
    for (size_t d = 0; d < MLP_D; d++) dense_grad[ids[b] * MLP_D + d] += rows[b * MLP_D + d];
  for (int r = 0; r < g_size; r++) {
    int64_t rids[MLP_B];
    float rrows[MLP_B * MLP_D];
    mlp_grad_rows(r, rids, rrows);
    for (size_t b = 0; b < MLP_B; b++)
      for (size_t d = 0; d < MLP_D; d++) ref[rids[b] * MLP_D + d] += rrows[b * MLP_D + d];
  }
  for (size_t e = 0; e < MLP_V * MLP_D; e++) ref[e] /= g_size;

  gs_handle *hd, *hs, *ha;
  int64_t shape[2] = {MLP_V, MLP_D};
  gs_allreduce_opts ao = {.struct_size = sizeof(gs_allreduce_opts), .shape = shape, .ndim = 2};
  wu_must(gs_allreduce_async(ctx, "mlp/embedding/dense", dense_grad, dense_grad, MLP_V * MLP_D,
                             GS_FLOAT32, GS_AVERAGE, &ao, &hd),
          "gs_allreduce_async", "mlp/embedding/dense");
  wu_must(gs_sparse_allreduce_async(ctx, "mlp/embedding/rows", ids, rows, MLP_B, MLP_D, GS_FLOAT32,
                                    GS_AVERAGE, NULL, &hs),
          "gs_sparse_allreduce_async", "mlp/embedding/rows");
  gs_sparse_opts so = {sizeof(gs_sparse_opts), 1, MLP_V, as_dense};
  wu_must(gs_sparse_allreduce_async(ctx, "mlp/embedding/as_dense", ids, rows, MLP_B, MLP_D,
                                    GS_FLOAT32, GS_AVERAGE, &so, &ha),
          "gs_sparse_allreduce_async", "mlp/embedding/as_dense");
  wait_ok(hd, "mlp/embedding/dense");
  wait_ok(hs, "mlp/embedding/rows");
  wait_ok(ha, "mlp/embedding/as_dense");
  const int64_t *gi;
  const void *gv;
  size_t gn;
  wu_must(gs_sparse_result(hs, &gi, &gv, &gn), "gs_sparse_result", "mlp/embedding/rows");
  if (gn != (size_t)MLP_B * (size_t)g_size)
    wu_die("mlp: %zu gathered rows, expected %d", gn, MLP_B * g_size);
  for (size_t i = 0; i < gn; i++) {
    if (gi[i] < 0 || gi[i] >= MLP_V)
      wu_die("mlp: gathered index %lld out of range", (long long)gi[i]);
    for (size_t d = 0; d < MLP_D; d++)
      from_rows[gi[i] * MLP_D + d] += ((const float *)gv)[i * MLP_D + d];
  }
  size_t checks = 0;
  for (size_t e = 0; e < MLP_V * MLP_D; e++) {
    double tol = 1e-6 + 1e-5 * fabs(ref[e]);
    double got[3] = {dense_grad[e], from_rows[e], as_dense[e]};
    static const char *const path[3] = {"dense allreduce", "sparse rows", "sparse_as_dense"};
    for (int p = 0; p < 3; p++, checks++)
      if (fabs(got[p] - ref[e]) > tol)
        wu_die("mlp: embedding gradient [%zu][%zu] by %s: got %.9g, expected %.9g", e / MLP_D,
               e % MLP_D, path[p], got[p], ref[e]);
  }
  gs_handle_free(hd);
  gs_handle_free(hs);
  gs_handle_free(ha);
  printf("mlp: sparse rows, sparse_as_dense and dense agree (%zu checks, rank %d of %d)\n", checks,
         g_rank, g_size);
  return 0;
}

/* ---- mode: errors -------------------------------------------------------------- */

/* The call must fail with want and a message containing every needle. */
static void expect_error(gs_status got, gs_handle *h, gs_status want, const char *what,
                         const char *const *needles) {
  if (got != want)
    wu_die("%s: returned %s, expected %s (%s)", what, wu_status_name(got), wu_status_name(want),
           gs_last_error(NULL));
  if (h != NULL) wu_die("%s: failed but *out is not NULL", what);
  const char *msg = gs_last_error(NULL);
  for (size_t i = 0; needles[i]; i++)
    if (!strstr(msg, needles[i])) wu_die("%s: message \"%s\" lacks \"%s\"", what, msg, needles[i]);
  printf("errors: %s: %s: %s\n", what, wu_status_name(got), msg);
}

static int mode_errors(gs_ctx *ctx) {
  int64_t idx[3] = {2, 0, 9};
  float vals[3 * 2] = {1, 2, 3, 4, 5, 6};
  float dense[7 * 2];
  gs_handle *h = (gs_handle *)&h; /* must be reset to NULL by a failed call */
  gs_status s;

  s = gs_sparse_allreduce_async(ctx, "err/min", idx, vals, 2, 2, GS_FLOAT32, GS_MIN, NULL, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "invalid op",
               (const char *const[]){"tensor 'err/min'", "reduce op min",
                                     "valid ops are GS_SUM and GS_AVERAGE", NULL});

  gs_sparse_opts so = {sizeof(gs_sparse_opts), 1, 7, dense};
  h = (gs_handle *)&h;
  s = gs_sparse_allreduce_async(ctx, "err/range", idx, vals, 3, 2, GS_FLOAT32, GS_SUM, &so, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "index out of range",
               (const char *const[]){"tensor 'err/range'", "indices[2] = 9 is out of range",
                                     "dense_rows=7", "valid: 0..6", NULL});

  int64_t neg[2] = {1, -3};
  h = (gs_handle *)&h;
  s = gs_sparse_allreduce_async(ctx, "err/negative", neg, vals, 2, 2, GS_FLOAT32, GS_SUM, NULL, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "negative index",
               (const char *const[]){"tensor 'err/negative'", "indices[1] = -3 is negative", NULL});

  gs_sparse_opts bounded = {sizeof(gs_sparse_opts), 0, 7,
                            NULL}; /* rows path: dense_rows given, so checked */
  h = (gs_handle *)&h;
  s = gs_sparse_allreduce_async(ctx, "err/rows-range", idx, vals, 3, 2, GS_FLOAT32, GS_SUM,
                                &bounded, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "index out of range (rows path)",
               (const char *const[]){"indices[2] = 9 is out of range", NULL});

  gs_sparse_opts no_rows = {sizeof(gs_sparse_opts), 1, 0, dense};
  h = (gs_handle *)&h;
  s = gs_sparse_allreduce_async(ctx, "err/no-rows", idx, vals, 2, 2, GS_FLOAT32, GS_SUM, &no_rows,
                                &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "sparse_as_dense without dense_rows",
               (const char *const[]){"tensor 'err/no-rows'", "dense_rows > 0", NULL});

  gs_sparse_opts no_out = {sizeof(gs_sparse_opts), 1, 7, NULL};
  h = (gs_handle *)&h;
  s = gs_sparse_allreduce_async(ctx, "err/no-out", idx, vals, 2, 2, GS_FLOAT32, GS_SUM, &no_out,
                                &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "sparse_as_dense without dense_out",
               (const char *const[]){"tensor 'err/no-out'", "opts->dense_out", NULL});

  /* gs_sparse_result of a sparse_as_dense op (which succeeds). */
  gs_handle *hd;
  wu_must(
      gs_sparse_allreduce_async(ctx, "err/dense-ok", idx, vals, 2, 2, GS_FLOAT32, GS_SUM, &so, &hd),
      "gs_sparse_allreduce_async", "err/dense-ok");
  wait_ok(hd, "err/dense-ok");
  for (size_t e = 0; e < 7 * 2; e++) {
    float want = 0;
    if (e / 2 == 2) want = vals[e % 2];
    if (e / 2 == 0) want = vals[2 + e % 2];
    want *= (float)g_size;
    if (dense[e] != want)
      wu_die("err/dense-ok: element %zu: got %g, expected %g", e, dense[e], want);
  }
  const int64_t *gi;
  const void *gv;
  size_t gn;
  s = gs_sparse_result(hd, &gi, &gv, &gn);
  expect_error(s, NULL, GS_ERR_INVALID_ARG, "gs_sparse_result of a sparse_as_dense op",
               (const char *const[]){"tensor 'err/dense-ok'",
                                     "sparse_as_dense op writes its result to opts->dense_out",
                                     NULL});
  gs_handle_free(hd);

  gs_aggregator *agg;
  wu_must(gs_aggregator_create(ctx, 4, 1, &agg), "gs_aggregator_create", "-");
  h = (gs_handle *)&h;
  s = gs_aggregator_sparse_allreduce_async(agg, "err/agg-sparse", idx, vals, 2, 2, GS_FLOAT32,
                                           GS_AVERAGE, NULL, &h);
  expect_error(
      s, h, GS_ERR_INVALID_ARG, "aggregator sparse without sparse_as_dense",
      (const char *const[]){"tensor 'err/agg-sparse'", "need opts->sparse_as_dense = 1", NULL});

  float grad[12] = {0};
  gs_handle *hp;
  wu_must(
      gs_aggregator_allreduce_async(agg, "err/agg-count", grad, 10, GS_FLOAT32, GS_SUM, NULL, &hp),
      "gs_aggregator_allreduce_async", "err/agg-count");
  gs_handle_free(hp);
  h = (gs_handle *)&h;
  s = gs_aggregator_allreduce_async(agg, "err/agg-count", grad, 12, GS_FLOAT32, GS_SUM, NULL, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "aggregator count changed",
               (const char *const[]){"tensor 'err/agg-count' was aggregated as 10 float32",
                                     "gives 12 float32", NULL});
  h = (gs_handle *)&h;
  s = gs_aggregator_allreduce_async(agg, "err/agg-count", grad, 10, GS_INT32, GS_SUM, NULL, &h);
  expect_error(s, h, GS_ERR_INVALID_ARG, "aggregator dtype changed",
               (const char *const[]){"tensor 'err/agg-count'", "gives 10 int32", NULL});
  h = (gs_handle *)&h;
  s = gs_aggregator_allreduce_async(agg, "err/agg-op", grad, 10, GS_FLOAT32, GS_ADASUM, NULL, &h);
  expect_error(s, h, GS_ERR_UNSUPPORTED, "aggregator adasum",
               (const char *const[]){"tensor 'err/agg-op'", "adasum", NULL});
  gs_aggregator_destroy(agg);
  gs_aggregator_destroy(NULL);

  h = (gs_handle *)&h;
  s = gs_aggregator_create(ctx, 0, 0, &agg);
  expect_error(s, NULL, GS_ERR_INVALID_ARG, "aggregator of 0 passes",
               (const char *const[]){"passes=0", NULL});

  /* The job goes on: a sparse op after the errors works. */
  gs_handle *hr;
  wu_must(
      gs_sparse_allreduce_async(ctx, "err/after", idx, vals, 2, 2, GS_FLOAT32, GS_SUM, NULL, &hr),
      "gs_sparse_allreduce_async", "err/after");
  wait_ok(hr, "err/after");
  wu_must(gs_sparse_result(hr, &gi, &gv, &gn), "gs_sparse_result", "err/after");
  if (gn != 2 * (size_t)g_size) wu_die("err/after: %zu rows, expected %d", gn, 2 * g_size);
  for (size_t i = 0; i < gn; i++)
    if (gi[i] != idx[i % 2] || ((const float *)gv)[i * 2] != vals[(i % 2) * 2])
      wu_die("err/after: row %zu wrong", i);
  gs_handle_free(hr);
  printf("errors: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- mode: aggregate ------------------------------------------------------------ */

#define AG_PASSES 4
#define AG_STEPS 2

static double ag_value(int r, unsigned id, int step, int pass, size_t j) {
  return (double)((int64_t)(wu_hash4((uint64_t)r + 1, id, (uint64_t)(step * 16 + pass), j) % 9) -
                  4);
}

/* A dense name over AG_STEPS steps of AG_PASSES passes: the passes before
 * the last return completed handles and leave grad alone; the last runs
 * exactly `want_collectives` collective and leaves the reduced result. */
static size_t ag_dense(gs_ctx *ctx, gs_aggregator *agg, const char *name, unsigned id, gs_dtype dt,
                       size_t count, gs_reduce_op op, int average_aggregated, int local,
                       uint64_t want_collectives) {
  void *grad = wu_xcalloc(count, 8), *copy = wu_xcalloc(count, 8);
  size_t checks = 0;
  for (int step = 0; step < AG_STEPS; step++) {
    uint64_t before = collectives(ctx);
    for (int p = 0; p < AG_PASSES; p++) {
      for (size_t j = 0; j < count; j++) wu_put(dt, grad, j, ag_value(g_rank, id, step, p, j));
      memcpy(copy, grad, count * 8);
      gs_handle *h;
      wu_must(gs_aggregator_allreduce_async(agg, name, grad, count, dt, op, NULL, &h),
              "gs_aggregator_allreduce_async", name);
      if (p < AG_PASSES - 1) {
        int done = 0;
        wu_must(gs_test(h, &done), "gs_test", name);
        if (!done)
          wu_die("tensor '%s': pass %d of %d is not complete at once", name, p + 1, AG_PASSES);
        wu_must(gs_wait(h, 0), "gs_wait", name);
        if (memcmp(copy, grad, count * 8) != 0)
          wu_die("tensor '%s': pass %d of %d changed grad", name, p + 1, AG_PASSES);
        if (collectives(ctx) != before)
          wu_die("tensor '%s': pass %d of %d ran a collective", name, p + 1, AG_PASSES);
      } else {
        wait_ok(h, name);
      }
      gs_handle_free(h);
    }
    uint64_t ran = collectives(ctx) - before;
    if (ran != want_collectives)
      wu_die("tensor '%s': %d passes ran %llu collectives, expected %llu", name, AG_PASSES,
             (unsigned long long)ran, (unsigned long long)want_collectives);
    for (size_t j = 0; j < count; j++, checks++) {
      double want = 0;
      for (int r = 0; r < g_size; r++) {
        if (local && r != g_rank) continue;
        double sum = 0;
        for (int p = 0; p < AG_PASSES; p++) sum += ag_value(r, id, step, p, j);
        want += average_aggregated ? averaged(dt, sum, AG_PASSES) : sum;
      }
      if (op == GS_AVERAGE) want = averaged(dt, want, g_size);
      double got = wu_get(dt, grad, j), tol = wu_rel_tol(dt) * (fabs(want) + 1);
      if (fabs(got - want) > tol)
        wu_die("tensor '%s' (step %d): element %zu: got %.9g, expected %.9g", name, step, j, got,
               want);
    }
  }
  free(grad);
  free(copy);
  return checks;
}

#define AG_ROWS 9
#define AG_ROW_LEN 3

static size_t ag_nnz(int r, int step, int p) {
  if ((r + p + step) % 3 == 0) return 0;
  return 1 + (size_t)(wu_hash4((uint64_t)r + 1, 71, (uint64_t)step, (uint64_t)p) % 5);
}

static int64_t ag_index(int r, int step, int p, size_t i) {
  if (i == 1) i = 0; /* a repeat */
  return (int64_t)(wu_hash4((uint64_t)r + 1, 72, (uint64_t)(step * 16 + p), i) % AG_ROWS);
}

static size_t ag_sparse(gs_ctx *ctx, gs_aggregator *agg) {
  const char *name = "agg/embedding";
  float dense_out[AG_ROWS * AG_ROW_LEN];
  int64_t idx[8];
  float vals[8 * AG_ROW_LEN];
  size_t checks = 0;
  for (int step = 0; step < AG_STEPS; step++) {
    uint64_t before = collectives(ctx);
    for (int p = 0; p < AG_PASSES; p++) {
      size_t nnz = ag_nnz(g_rank, step, p);
      for (size_t i = 0; i < nnz; i++) {
        idx[i] = ag_index(g_rank, step, p, i);
        for (size_t j = 0; j < AG_ROW_LEN; j++)
          vals[i * AG_ROW_LEN + j] = (float)ag_value(g_rank, 73, step, p, i * AG_ROW_LEN + j);
      }
      for (size_t e = 0; e < AG_ROWS * AG_ROW_LEN; e++) dense_out[e] = 12345.0f;
      gs_sparse_opts so = {sizeof(gs_sparse_opts), 1, AG_ROWS, dense_out};
      gs_handle *h;
      wu_must(gs_aggregator_sparse_allreduce_async(agg, name, idx, vals, nnz, AG_ROW_LEN,
                                                   GS_FLOAT32, GS_AVERAGE, &so, &h),
              "gs_aggregator_sparse_allreduce_async", name);
      if (p < AG_PASSES - 1) {
        int done = 0;
        wu_must(gs_test(h, &done), "gs_test", name);
        if (!done) wu_die("tensor '%s': pass %d is not complete at once", name, p + 1);
        for (size_t e = 0; e < AG_ROWS * AG_ROW_LEN; e++)
          if (dense_out[e] != 12345.0f) wu_die("tensor '%s': pass %d wrote dense_out", name, p + 1);
      } else {
        wait_ok(h, name);
      }
      gs_handle_free(h);
    }
    uint64_t ran = collectives(ctx) - before;
    if (ran != 1)
      wu_die("tensor '%s': %d passes ran %llu collectives, expected 1", name, AG_PASSES,
             (unsigned long long)ran);
    double ref[AG_ROWS * AG_ROW_LEN] = {0};
    for (int r = 0; r < g_size; r++)
      for (int p = 0; p < AG_PASSES; p++)
        for (size_t i = 0; i < ag_nnz(r, step, p); i++)
          for (size_t j = 0; j < AG_ROW_LEN; j++)
            ref[ag_index(r, step, p, i) * AG_ROW_LEN + j] +=
                ag_value(r, 73, step, p, i * AG_ROW_LEN + j);
    for (size_t e = 0; e < AG_ROWS * AG_ROW_LEN; e++, checks++) {
      double want = ref[e] / AG_PASSES / g_size;
      if (fabs(dense_out[e] - want) > 0x1p-21 * (fabs(want) + 1))
        wu_die("tensor '%s' (step %d): dense element %zu: got %.9g, expected %.9g", name, step, e,
               dense_out[e], want);
    }
  }
  return checks;
}

static int mode_aggregate(gs_ctx *ctx) {
  gs_aggregator *avg, *sum, *once;
  wu_must(gs_aggregator_create(ctx, AG_PASSES, 1, &avg), "gs_aggregator_create", "-");
  wu_must(gs_aggregator_create(ctx, AG_PASSES, 0, &sum), "gs_aggregator_create", "-");
  wu_must(gs_aggregator_create(ctx, 1, 0, &once), "gs_aggregator_create", "-");
  wu_must(gs_register_local(ctx, "agg/local"), "gs_register_local", "agg/local");
  size_t checks = 0;
  checks += ag_dense(ctx, avg, "agg/dense/average", 1, GS_FLOAT32, 1000, GS_AVERAGE, 1, 0, 1);
  checks += ag_dense(ctx, sum, "agg/dense/sum", 2, GS_INT32, 77, GS_SUM, 0, 0, 1);
  checks += ag_dense(ctx, avg, "agg/dense/int-average", 3, GS_INT32, 33, GS_AVERAGE, 1, 0, 1);
  checks += ag_dense(ctx, avg, "agg/local", 4, GS_FLOAT32, 10, GS_AVERAGE, 1, 1, 0);
  checks += ag_sparse(ctx, avg);
  /* passes = 1: every call communicates. */
  double v[5];
  for (int k = 0; k < 3; k++) {
    for (size_t j = 0; j < 5; j++) v[j] = g_rank + (double)j + k;
    uint64_t before = collectives(ctx);
    gs_handle *h;
    wu_must(gs_aggregator_allreduce_async(once, "agg/once", v, 5, GS_FLOAT64, GS_SUM, NULL, &h),
            "gs_aggregator_allreduce_async", "agg/once");
    wait_ok(h, "agg/once");
    gs_handle_free(h);
    if (collectives(ctx) - before != 1) wu_die("agg/once: not one collective per call");
    for (size_t j = 0; j < 5; j++, checks++) {
      double want = (double)g_size * (g_size - 1) / 2 + (double)g_size * ((double)j + k);
      if (v[j] != want) wu_die("agg/once: element %zu: got %g, expected %g", j, v[j], want);
    }
  }
  gs_aggregator_destroy(avg);
  gs_aggregator_destroy(sum);
  gs_aggregator_destroy(once);
  printf("aggregate: %zu checks passed (rank %d of %d)\n", checks, g_rank, g_size);
  return 0;
}

/* ---- mode: broadcast -------------------------------------------------------------- */

static int mode_broadcast(gs_ctx *ctx) {
  enum { ROOT = 1, N = 4 };
  static const char *const names[N] = {"param/w1", "param/b1", "param/local", "param/w2"};
  static const gs_dtype dts[N] = {GS_FLOAT32, GS_INT32, GS_FLOAT32, GS_FLOAT16};
  static const size_t counts[N] = {1000, 7, 5, 33};
  void *bufs[N];
  wu_must(gs_register_local(ctx, "param/local"), "gs_register_local", "param/local");
  for (size_t i = 0; i < N; i++) {
    bufs[i] = wu_xcalloc(counts[i], 8);
    for (size_t j = 0; j < counts[i]; j++)
      wu_put(dts[i], bufs[i], j, (double)(g_rank * 100 + (int)j % 50));
  }
  gs_status s = gs_broadcast_parameters(ctx, N, names, bufs, counts, dts, 7);
  if (s != GS_ERR_INVALID_ARG || !strstr(gs_last_error(NULL), "root 7 is not a rank of this job"))
    wu_die("gs_broadcast_parameters with root 7: %s: %s", wu_status_name(s), gs_last_error(NULL));
  printf("broadcast: root 7: %s: %s\n", wu_status_name(s), gs_last_error(NULL));
  uint64_t before = collectives(ctx);
  wu_must(gs_broadcast_parameters(ctx, N, names, bufs, counts, dts, ROOT),
          "gs_broadcast_parameters", "param/*");
  if (collectives(ctx) - before != N - 1)
    wu_die("gs_broadcast_parameters ran %llu collectives for %d non-local parameters",
           (unsigned long long)(collectives(ctx) - before), N - 1);
  size_t checks = 0;
  for (size_t i = 0; i < N; i++) {
    int from = strcmp(names[i], "param/local") == 0 ? g_rank : ROOT;
    for (size_t j = 0; j < counts[i]; j++, checks++) {
      double want = (double)(from * 100 + (int)j % 50), got = wu_get(dts[i], bufs[i], j);
      if (got != want)
        wu_die("parameter '%s' element %zu: got %g, expected %g (from rank %d)", names[i], j, got,
               want, from);
    }
    free(bufs[i]);
  }
  printf("broadcast: %zu checks passed, 'param/local' kept (rank %d of %d)\n", checks, g_rank,
         g_size);
  return 0;
}

/* ---- main -------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2) {
    fprintf(stderr, "usage: gs-sparse-worker sparse | mlp | errors | aggregate | broadcast\n");
    return 2;
  }
  static const struct {
    const char *name;
    int (*run)(gs_ctx *);
  } modes[] = {{"sparse", mode_sparse},
               {"mlp", mode_mlp},
               {"errors", mode_errors},
               {"aggregate", mode_aggregate},
               {"broadcast", mode_broadcast}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    if (strcmp(argv[1], modes[m].name) != 0) continue;
    gs_ctx *ctx = wu_join_or_die();
    int rc = modes[m].run(ctx);
    gs_status s = gs_shutdown(ctx);
    if (s != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(s), gs_last_error(NULL));
    return rc;
  }
  fprintf(stderr, "gs-sparse-worker: unknown mode '%s'\n", argv[1]);
  return 2;
}
