/* gs-test-worker: a real worker process for the integration tests.
 *
 * It uses only the public API (gradsync.h) and is configured by the
 * environment exactly as a training process would be (GRADSYNC_COORDINATOR,
 * GRADSYNC_RANK, GRADSYNC_SIZE, ...). Each mode runs one scenario, checks
 * every value or error text against a reference computed locally, prints
 * one summary line on stdout and exits 0 on success, non-zero otherwise.
 *
 * Modes:
 *   ops [ROUNDS]            every reduce op x dtype x in/out-of-place x count
 *   random-order [SEED]     100 tensors submitted in a per-rank random order,
 *                           collected with gs_wait_any
 *   mismatch                'dense/kernel' shape differs on rank 1; every
 *                           rank must get the same GS_ERR_MISMATCH text, and
 *                           the job must go on
 *   hold MS                 join, sleep MS, one allreduce, shut down
 *   join                    gs_init only; prints the status and message
 *                           (exit 3 when gs_init fails)
 *   exit-code RANK CODE     rank RANK exits with CODE before joining; the
 *                           others join and wait on one allreduce
 *
 * Negotiation modes (test_negotiation.c asserts what they print):
 *   mismatch-all            3 ranks: every validated attribute made to differ
 *                           (shapes, dtypes, reduce ops, op types, roots,
 *                           pre/postscale, allgather trailing dims and rank);
 *                           prints each error as "neg-mismatch: CASE: STATUS:
 *                           TEXT", then a new tensor and the failed name
 *                           itself must complete with the right values
 *   fusion N COUNT STEPS    N float32 tensors of COUNT elements submitted at
 *                           once per step; prints the gs_get_stats deltas
 *   workload PATH STEPS     a "name dtype shape" tensor list (float32),
 *                           gradients in reverse order, averaged; stats deltas
 *   allgather ROUNDS        [d_r,2,3] int32 and [d_r'] float64 with per-rank
 *                           first dims (0 on one rank); prints the dims;
 *                           gs_handle_result_copy of each result, and its
 *                           refusals (pending op, allreduce, sizes, NULLs)
 *   bcast-barrier ROOT      float64 and int8 broadcast from ROOT, then three
 *                           barriers checked with marks in $GS_TEST_DIR
 *   grouped ROUNDS          a 3-tensor gs_grouped_allreduce_async; stats deltas
 *   join-steps STEPS        the last rank joins 2 steps early; averages with a
 *                           joined rank, allgather/broadcast refused, gs_join
 *   duplicate               a name in flight submitted again in every way
 *   fork STEPS              rank 0 forks (12 children) with an op completed
 *                           and one in flight, a thread in a wait and one
 *                           taking the lock; each child's calls on the
 *                           context fail with GS_ERR_FORKED (printed by
 *                           the first: "fork-child: CALL: STATUS: TEXT"),
 *                           the parent goes on (marks in $GS_TEST_DIR)
 *   fork-init CASE          gs_init in a forked child, which then sums one
 *                           tensor and leaves: CASE fresh (the parent never
 *                           called gs_init), after-shutdown (the parent left
 *                           its job first; the child joins the next one),
 *                           live (the parent's context is live; the child
 *                           joins its own 1-rank job at $GS_TEST_COORD2)
 *
 * If GS_TEST_WAIT_FILE is set, a successful mode waits (at most 60 s) for
 * that file to exist before gs_shutdown, so a test can inspect the live
 * data-plane connections.
 *
 * Single-threaded: the main thread submits and waits. The conversions
 * between float and float16/bfloat16 are the test's own, independent of the
 * library's. */
#include "gradsync.h"
#include "worker_util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 60000 /* one op never takes this long on a healthy job */

static const char *op_name(gs_reduce_op op) {
  switch (op) {
  case GS_SUM:
    return "sum";
  case GS_AVERAGE:
    return "average";
  case GS_MIN:
    return "min";
  case GS_MAX:
    return "max";
  case GS_PRODUCT:
    return "product";
  case GS_ADASUM:
    return "adasum";
  }
  return "?";
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---- element access -------------------------------------------------------- */

static size_t dsize(gs_dtype d) {
  switch (d) {
  case GS_FLOAT32:
    return 4;
  case GS_FLOAT64:
    return 8;
  case GS_FLOAT16:
    return 2;
  case GS_BFLOAT16:
    return 2;
  case GS_INT32:
    return 4;
  case GS_INT64:
    return 8;
  case GS_INT8:
    return 1;
  case GS_UINT8:
    return 1;
  case GS_INT16:
    return 2;
  }
  return 0;
}

/* The largest magnitude every partial result must stay within so that it is
 * exact in d (integers: the type's range; floats: the integers the mantissa
 * holds, halved because floats get half-integer inputs). */
static double exact_limit(gs_dtype d) {
  switch (d) {
  case GS_FLOAT32:
    return 1 << 22;
  case GS_FLOAT64:
    return 1 << 30;
  case GS_FLOAT16:
    return 1 << 10;
  case GS_BFLOAT16:
    return 1 << 8; /* integer inputs only, see value() */
  case GS_INT32:
    return 1 << 30;
  case GS_INT64:
    return 1 << 30;
  case GS_INT8:
    return 127;
  case GS_UINT8:
    return 255;
  case GS_INT16:
    return 32767;
  }
  return 0;
}

/* Input element j of tensor t on rank r in round k. Small values, chosen so
 * that every partial sum or product over `size` ranks, in any order, is
 * exact in the dtype (the ring reduces in steps, rounding each step). */
static double value(gs_reduce_op op, gs_dtype d, int size, int r, unsigned t, size_t j,
                    unsigned k) {
  uint64_t h = wu_hash4((uint64_t)r + 1, t, j, k);
  if (op == GS_PRODUCT) {
    static const double signed_set[] = {-2, -1, 0, 1, 1, 2, 3, 1};
    static const double unsigned_set[] = {1, 2, 3, 1, 0, 2, 1, 3};
    const double *set = d == GS_UINT8 ? unsigned_set : signed_set;
    double v = set[h % 8];
    /* |product| <= 3^size must stay exact; shrink to {-1,0,1,2} then
     * {-1,0,1} for larger worlds. */
    double lim = exact_limit(d);
    if (pow(3, size) > lim) {
      if (fabs(v) > 2) v = 2;
      if (pow(2, size) > lim && fabs(v) > 1) v = 1;
    }
    return v;
  }
  /* Sums: |v| * size must stay exact. */
  double step = (wu_is_float(d) && d != GS_BFLOAT16) ? 0.5 : 1.0;
  double lim = exact_limit(d) / size;
  double m = lim < 8 ? floor(lim) : 8;
  if (m < 1) m = 1;
  int n = (int)(m / step);
  if (d == GS_UINT8) return (double)(h % (uint64_t)(n + 1)) * step; /* 0..m */
  return (double)((int64_t)(h % (uint64_t)(2 * n + 1)) - n) * step; /* -m..m */
}

static double reference(gs_reduce_op op, gs_dtype d, int size, unsigned t, size_t j, unsigned k) {
  double acc = value(op, d, size, 0, t, j, k);
  for (int r = 1; r < size; r++) {
    double v = value(op, d, size, r, t, j, k);
    switch (op) {
    case GS_SUM:
    case GS_AVERAGE:
      acc += v;
      break;
    case GS_MIN:
      acc = v < acc ? v : acc;
      break;
    case GS_MAX:
      acc = v > acc ? v : acc;
      break;
    case GS_PRODUCT:
      acc *= v;
      break;
    case GS_ADASUM:
      break;
    }
  }
  if (op == GS_AVERAGE) {
    if (wu_is_float(d)) {
      acc = acc / size; /* rounded to the dtype by wu_put() */
    } else {
      acc = (double)((int64_t)acc / size); /* truncation toward zero */
    }
  }
  return acc;
}

/* Average of floats: sum / size may be computed as sum * (1/size) and, for
 * 16-bit types, rounded twice; allow a couple of units in the last place.
 * Everything else must be exact. */
static int close_enough(gs_reduce_op op, gs_dtype d, double got, double want) {
  if (got == want) return 1;
  if (op != GS_AVERAGE || !wu_is_float(d)) return 0;
  double tol = wu_rel_tol(d) * (fabs(want) > 0.5 ? fabs(want) : 0.5);
  return fabs(got - want) <= tol;
}

/* ---- common helpers ------------------------------------------------------- */

static gs_ctx *join_or_die(void) {
  gs_ctx *ctx = wu_join_or_die();
  const char *env_rank = getenv("GRADSYNC_RANK");
  const char *env_size = getenv("GRADSYNC_SIZE");
  if (env_rank && atoi(env_rank) != g_rank)
    wu_die("gs_rank() = %d but GRADSYNC_RANK = %s", g_rank, env_rank);
  if (env_size && atoi(env_size) != g_size)
    wu_die("gs_size() = %d but GRADSYNC_SIZE = %s", g_size, env_size);
  fprintf(stderr, "rank %d: joined a world of %d\n", g_rank, g_size);
  return ctx;
}

static void wait_ok(gs_handle *h, const char *name) {
  gs_status s = gs_wait(h, WAIT_MS);
  if (s != GS_OK)
    wu_die("tensor '%s': gs_wait: %s: %s", name, wu_status_name(s), gs_handle_error(h));
  int done = 0;
  if (gs_test(h, &done) != GS_OK || !done) wu_die("tensor '%s': gs_test says not done", name);
  const char *err = gs_handle_error(h);
  if (err == NULL || err[0] != '\0')
    wu_die("tensor '%s': succeeded with error text '%s'", name, err);
}

/* Waits for GS_TEST_WAIT_FILE (if set) so a test can look at the live job. */
static void wait_for_release_file(void) {
  const char *path = getenv("GS_TEST_WAIT_FILE");
  if (path == NULL || path[0] == '\0') return;
  printf("rank %d: waiting for %s\n", g_rank, path);
  fflush(stdout);
  for (int i = 0; i < 6000; i++) {
    if (access(path, F_OK) == 0) return;
    sleep_ms(10);
  }
  wu_die("%s did not appear within 60 s", path);
}

static void shutdown_or_die(gs_ctx *ctx) {
  wait_for_release_file();
  gs_status s = gs_shutdown(ctx);
  if (s != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(s), gs_last_error(NULL));
}

/* ---- mode: ops ------------------------------------------------------------ */

typedef struct tensor {
  char name[96];
  unsigned id; /* tensor index: seeds the data */
  gs_reduce_op op;
  gs_dtype dt;
  int inplace;
  size_t count;
  void *send; /* == recv when in place */
  void *recv;
  gs_handle *h;
} tensor;

static void fill(tensor *t, unsigned round) {
  for (size_t j = 0; j < t->count; j++)
    wu_put(t->dt, t->send, j, value(t->op, t->dt, g_size, g_rank, t->id, j, round));
  if (!t->inplace) memset(t->recv, 0xA5, t->count * dsize(t->dt) + 1);
}

static size_t check(const tensor *t, unsigned round) {
  for (size_t j = 0; j < t->count; j++) {
    double want = wu_as_stored(t->dt, reference(t->op, t->dt, g_size, t->id, j, round));
    double got = wu_get(t->dt, t->recv, j);
    if (!close_enough(t->op, t->dt, got, want))
      wu_die("tensor '%s' (round %u): element %zu: got %.9g, expected %.9g", t->name, round, j, got,
             want);
    if (!t->inplace) {
      double in = wu_as_stored(t->dt, value(t->op, t->dt, g_size, g_rank, t->id, j, round));
      double sent = wu_get(t->dt, t->send, j);
      if (sent != in)
        wu_die("tensor '%s' (round %u): send buffer modified at element %zu: %.9g, was %.9g",
               t->name, round, j, sent, in);
    }
  }
  /* Out of place: nothing may be written past the end of recv. */
  if (!t->inplace && ((unsigned char *)t->recv)[t->count * dsize(t->dt)] != 0xA5)
    wu_die("tensor '%s' (round %u): byte written past the end of recv", t->name, round);
  return t->count;
}

static int mode_ops(gs_ctx *ctx, int rounds) {
  static const gs_reduce_op ops[] = {GS_SUM, GS_AVERAGE, GS_MIN, GS_MAX, GS_PRODUCT};
  static const gs_dtype dts[] = {GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16, GS_INT32,
                                 GS_INT64,   GS_INT8,    GS_UINT8,   GS_INT16};
  static const size_t counts[] = {0, 1, 7, 1000, 65539};
  const size_t max_tensors = 5 * 9 * 2 * 5;
  tensor *ts = calloc(max_tensors, sizeof *ts);
  if (!ts) wu_die("out of memory");
  size_t n = 0;
  for (size_t o = 0; o < 5; o++)
    for (size_t d = 0; d < 9; d++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (size_t c = 0; c < 5; c++) {
          if (counts[c] == 0 && ops[o] != GS_SUM) continue;
          tensor *t = &ts[n];
          t->id = (unsigned)n;
          t->op = ops[o];
          t->dt = dts[d];
          t->inplace = inplace;
          t->count = counts[c];
          snprintf(t->name, sizeof t->name, "ops/%s/%s/%s/n%zu", op_name(t->op),
                   wu_dtype_name(t->dt), inplace ? "inplace" : "outofplace", t->count);
          size_t bytes = t->count * dsize(t->dt) + 1; /* +1: overrun canary */
          t->send = wu_xmalloc(bytes);
          t->recv = inplace ? t->send : wu_xmalloc(bytes);
          n++;
        }

  size_t checks = 0, elements = 0;
  for (int round = 0; round < rounds; round++) {
    /* Submit everything, then wait: the ops overlap, fuse and (from the
     * second round on) hit the response cache. */
    for (size_t i = 0; i < n; i++) {
      tensor *t = &ts[i];
      fill(t, (unsigned)round);
      gs_status s =
          gs_allreduce_async(ctx, t->name, t->send, t->recv, t->count, t->dt, t->op, NULL, &t->h);
      if (s != GS_OK)
        wu_die("tensor '%s': gs_allreduce_async: %s: %s", t->name, wu_status_name(s),
               gs_last_error(ctx));
    }
    for (size_t i = 0; i < n; i++) {
      tensor *t = &ts[i];
      wait_ok(t->h, t->name);
      elements += check(t, (unsigned)round);
      gs_handle_free(t->h);
      t->h = NULL;
      checks++;
    }
  }
  printf("ops: %zu checks passed (%zu tensors x %d rounds, %zu elements, rank %d of %d)\n", checks,
         n, rounds, elements, g_rank, g_size);
  for (size_t i = 0; i < n; i++) {
    if (!ts[i].inplace) free(ts[i].recv);
    free(ts[i].send);
  }
  free(ts);
  return 0;
}

/* ---- mode: random-order ---------------------------------------------------- */

#define RO_TENSORS 100

static size_t ro_count(unsigned i) {
  uint64_t h = wu_hash4(7, i, 0, 0);
  if (i % 10 == 0) return 100003 + i; /* bigger than a fusion group's usual tensor */
  if (i % 3 == 0) return 1 + h % 16;  /* tiny */
  return 1 + h % 4000;
}

static float ro_value(int r, unsigned i, size_t j) {
  return (float)((int64_t)(wu_hash4((uint64_t)r + 100, i, j, 1) % 33) - 16) * 0.5f; /* -8..8 */
}

static int mode_random_order(gs_ctx *ctx, unsigned seed) {
  float *buf[RO_TENSORS];
  char names[RO_TENSORS][48];
  unsigned order[RO_TENSORS];
  gs_handle *hs[RO_TENSORS];
  unsigned which[RO_TENSORS]; /* hs[k] is the op of tensor which[k] */

  for (unsigned i = 0; i < RO_TENSORS; i++) {
    size_t c = ro_count(i);
    buf[i] = wu_xmalloc(c * sizeof(float));
    for (size_t j = 0; j < c; j++) buf[i][j] = ro_value(g_rank, i, j);
    snprintf(names[i], sizeof names[i], "random/t%03u", i);
    order[i] = i;
  }
  /* A different order on every rank (Fisher-Yates seeded by the rank). */
  uint64_t st = wu_hash4(seed, (uint64_t)g_rank, 42, 0);
  for (unsigned i = RO_TENSORS - 1; i > 0; i--) {
    st = wu_mix(st);
    unsigned k = (unsigned)(st % (i + 1));
    unsigned tmp = order[i];
    order[i] = order[k];
    order[k] = tmp;
  }
  fprintf(stderr, "rank %d: order starts %u %u %u %u\n", g_rank, order[0], order[1], order[2],
          order[3]);

  for (unsigned k = 0; k < RO_TENSORS; k++) {
    unsigned i = order[k];
    gs_status s = gs_allreduce_async(ctx, names[i], buf[i], buf[i], ro_count(i), GS_FLOAT32, GS_SUM,
                                     NULL, &hs[k]);
    if (s != GS_OK)
      wu_die("tensor '%s': gs_allreduce_async: %s: %s", names[i], wu_status_name(s),
             gs_last_error(ctx));
    which[k] = i;
    /* Spread the submissions over several batching cycles. */
    if (wu_hash4(seed, (uint64_t)g_rank, k, 3) % 8 == 0) sleep_ms(1 + (long)(wu_mix(st + k) % 3));
  }

  size_t pending = RO_TENSORS, completed = 0;
  while (pending > 0) {
    size_t idx = pending; /* must be overwritten */
    gs_status s = gs_wait_any(hs, pending, WAIT_MS, &idx);
    if (s == GS_ERR_TIMEOUT)
      wu_die("gs_wait_any: no op completed in %d ms (%zu pending)", WAIT_MS, pending);
    if (idx >= pending)
      wu_die("gs_wait_any: %s with index %zu of %zu", wu_status_name(s), idx, pending);
    unsigned i = which[idx];
    if (s != GS_OK)
      wu_die("tensor '%s': gs_wait_any: %s: %s", names[i], wu_status_name(s),
             gs_handle_error(hs[idx]));
    int done = 0;
    if (gs_test(hs[idx], &done) != GS_OK || !done)
      wu_die("tensor '%s': gs_wait_any returned it but gs_test says not done", names[i]);
    size_t c = ro_count(i);
    for (size_t j = 0; j < c; j++) {
      float want = 0;
      for (int r = 0; r < g_size; r++) want += ro_value(r, i, j);
      if (buf[i][j] != want)
        wu_die("tensor '%s': element %zu: got %.9g, expected %.9g", names[i], j, (double)buf[i][j],
               (double)want);
    }
    gs_handle_free(hs[idx]);
    hs[idx] = hs[pending - 1];
    which[idx] = which[pending - 1];
    pending--;
    completed++;
  }
  printf("random-order: %zu tensors checked (rank %d of %d)\n", completed, g_rank, g_size);
  for (unsigned i = 0; i < RO_TENSORS; i++) free(buf[i]);
  return 0;
}

/* ---- mode: mismatch -------------------------------------------------------- */

static int mode_mismatch(gs_ctx *ctx) {
  if (g_size < 2) wu_die("mismatch needs at least 2 ranks");
  /* The text every rank must get, built for this world size. */
  char want[512];
  size_t off =
      (size_t)snprintf(want, sizeof want, "tensor 'dense/kernel': mismatched shapes: ranks [");
  for (int r = 0, first = 1; r < g_size; r++) {
    if (r == 1) continue;
    off += (size_t)snprintf(want + off, sizeof want - off, "%s%d", first ? "" : ",", r);
    first = 0;
  }
  snprintf(want + off, sizeof want - off, "] sent [17,17], ranks [1] sent [18,18]");

  int64_t dim = g_rank == 1 ? 18 : 17;
  int64_t shape[2] = {dim, dim};
  size_t count = (size_t)(dim * dim);
  float *kernel = wu_xmalloc(count * sizeof(float));
  for (size_t j = 0; j < count; j++) kernel[j] = 1.0f;
  gs_allreduce_opts opts = {.struct_size = sizeof(gs_allreduce_opts), .shape = shape, .ndim = 2};
  gs_handle *h = NULL;
  gs_status s =
      gs_allreduce_async(ctx, "dense/kernel", kernel, kernel, count, GS_FLOAT32, GS_SUM, &opts, &h);
  if (s != GS_OK)
    wu_die("dense/kernel: gs_allreduce_async: %s: %s", wu_status_name(s), gs_last_error(ctx));

  /* The job goes on after the error: a following tensor completes. */
  enum { AFTER_N = 1000 };
  float *after = wu_xmalloc(AFTER_N * sizeof(float));
  for (size_t j = 0; j < AFTER_N; j++) after[j] = (float)(g_rank + 1) * (float)(j % 5);
  int64_t after_shape[2] = {AFTER_N / 10, 10};
  gs_allreduce_opts after_opts = {
      .struct_size = sizeof(gs_allreduce_opts), .shape = after_shape, .ndim = 2};
  gs_handle *ha = NULL;
  s = gs_allreduce_async(ctx, "after/mismatch", after, after, AFTER_N, GS_FLOAT32, GS_SUM,
                         &after_opts, &ha);
  if (s != GS_OK)
    wu_die("after/mismatch: gs_allreduce_async: %s: %s", wu_status_name(s), gs_last_error(ctx));

  s = gs_wait(h, WAIT_MS);
  const char *msg = gs_handle_error(h);
  printf("mismatch: rank %d: %s: %s\n", g_rank, wu_status_name(s), msg ? msg : "(null)");
  fflush(stdout);
  if (s != GS_ERR_MISMATCH)
    wu_die("dense/kernel: expected GS_ERR_MISMATCH, got %s", wu_status_name(s));
  if (msg == NULL || strcmp(msg, want) != 0)
    wu_die("dense/kernel: error text\n  got:      %s\n  expected: %s", msg ? msg : "(null)", want);
  gs_handle_free(h);

  wait_ok(ha, "after/mismatch");
  float k = (float)g_size * (float)(g_size + 1) / 2; /* sum of (r + 1) */
  for (size_t j = 0; j < AFTER_N; j++) {
    float want_v = k * (float)(j % 5);
    if (after[j] != want_v)
      wu_die("tensor 'after/mismatch': element %zu: got %.9g, expected %.9g", j, (double)after[j],
             (double)want_v);
  }
  gs_handle_free(ha);
  printf("mismatch: passed (rank %d of %d)\n", g_rank, g_size);
  free(after);
  free(kernel);
  return 0;
}

/* ---- mode: hold ------------------------------------------------------------ */

static int one_allreduce(gs_ctx *ctx, const char *name) {
  enum { N = 64 };
  int32_t v[N];
  for (int j = 0; j < N; j++) v[j] = (g_rank + 1) * j;
  gs_handle *h = NULL;
  gs_status s = gs_allreduce_async(ctx, name, v, v, N, GS_INT32, GS_SUM, NULL, &h);
  if (s != GS_OK)
    wu_die("tensor '%s': gs_allreduce_async: %s: %s", name, wu_status_name(s), gs_last_error(ctx));
  wait_ok(h, name);
  gs_handle_free(h);
  int32_t k = g_size * (g_size + 1) / 2;
  for (int j = 0; j < N; j++)
    if (v[j] != k * j) wu_die("tensor '%s': element %d: got %d, expected %d", name, j, v[j], k * j);
  return 0;
}

static int mode_hold(gs_ctx *ctx, long ms) {
  printf("hold: rank %d of %d joined; sleeping %ld ms\n", g_rank, g_size, ms);
  fflush(stdout);
  sleep_ms(ms);
  one_allreduce(ctx, "hold/tensor");
  printf("hold: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* Like hold, but until the driver creates PATH (at most 300 s): the job
 * stays mid-step for as long as the driver needs, however loaded the
 * machine. */
static int mode_hold_file(gs_ctx *ctx, const char *path) {
  printf("hold-file: rank %d of %d joined; waiting for %s\n", g_rank, g_size, path);
  fflush(stdout);
  for (int waited = 0; access(path, F_OK) != 0; waited += 50) {
    if (waited >= 300000) wu_die("hold-file: %s did not appear within 300 s", path);
    sleep_ms(50);
  }
  one_allreduce(ctx, "hold/tensor");
  printf("hold: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- negotiation modes (driven by test_negotiation.c) ----------------------- */

static void submitted_or_die(gs_ctx *ctx, gs_status s, const char *name, const char *call) {
  if (s != GS_OK)
    wu_die("tensor '%s': %s: %s: %s", name, call, wu_status_name(s), gs_last_error(ctx));
}

static gs_stats stats_now(const gs_ctx *ctx) {
  gs_stats st;
  gs_stats_init(&st);
  gs_status s = gs_get_stats(ctx, &st);
  if (s != GS_OK) wu_die("gs_get_stats: %s: %s", wu_status_name(s), gs_last_error(ctx));
  return st;
}

/* One line of counter deltas b - a, parsed by the driver. */
static void print_stats(const char *prefix, const gs_stats *a, const gs_stats *b) {
  printf("%s: collectives=%llu tensors=%llu fused=%llu requests=%llu hits=%llu messages=%llu\n",
         prefix, (unsigned long long)(b->collectives - a->collectives),
         (unsigned long long)(b->tensors - a->tensors),
         (unsigned long long)(b->fused_collectives - a->fused_collectives),
         (unsigned long long)(b->requests_sent - a->requests_sent),
         (unsigned long long)(b->cache_hits - a->cache_hits),
         (unsigned long long)(b->messages_to_coordinator - a->messages_to_coordinator));
}

static void check_f32(const char *name, const float *got, const float *want, size_t n) {
  for (size_t j = 0; j < n; j++)
    if (got[j] != want[j])
      wu_die("tensor '%s': element %zu: got %.9g, expected %.9g", name, j, (double)got[j],
             (double)want[j]);
}

/* Sum over ranks 0..size-1 of (r + 1). */
static int rank_weight_sum(void) {
  return g_size * (g_size + 1) / 2;
}

/* ---- mode: mismatch-all ------------------------------------------------------ */

/* Every attribute the coordinator validates, each made to differ across the 3
 * ranks in one way; the driver knows the text each must produce. */
static const char *const mm_cases[] = {"shape",           "shape3",     "dtype",    "reduce",
                                       "optype",          "root",       "prescale", "postscale",
                                       "gather-trailing", "gather-ndim"};
enum { MM_NCASES = sizeof mm_cases / sizeof mm_cases[0] };

static gs_handle *mm_submit(gs_ctx *ctx, int c, const char *name, double *buf) {
  const int r = g_rank;
  gs_handle *h = NULL;
  gs_status s = GS_ERR_INTERNAL;
  switch (c) {
  case 0: { /* same element count, another shape on rank 1 */
    int64_t shape[2] = {r == 1 ? 2 : 3, r == 1 ? 3 : 2};
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts), .shape = shape, .ndim = 2};
    s = gs_allreduce_async(ctx, name, buf, buf, 6, GS_FLOAT32, GS_SUM, &o, &h);
    break;
  }
  case 1: /* three different shapes */
    s = gs_allreduce_async(ctx, name, buf, buf, (size_t)(4 + r), GS_FLOAT32, GS_SUM, NULL, &h);
    break;
  case 2:
    s = gs_allreduce_async(ctx, name, buf, buf, 6, r == 2 ? GS_FLOAT64 : GS_FLOAT32, GS_SUM, NULL,
                           &h);
    break;
  case 3:
    s = gs_allreduce_async(ctx, name, buf, buf, 6, GS_FLOAT32, r == 1 ? GS_MAX : GS_SUM, NULL, &h);
    break;
  case 4: /* one name, three collectives */
    if (r == 0) {
      s = gs_allreduce_async(ctx, name, buf, buf, 6, GS_FLOAT32, GS_SUM, NULL, &h);
    } else if (r == 1) {
      int64_t shape[1] = {6};
      s = gs_allgather_async(ctx, name, buf, shape, 1, GS_FLOAT32, NULL, &h);
    } else {
      s = gs_broadcast_async(ctx, name, buf, 6, GS_FLOAT32, 0, NULL, &h);
    }
    break;
  case 5:
    s = gs_broadcast_async(ctx, name, buf, 6, GS_FLOAT32, r == 2 ? 1 : 0, NULL, &h);
    break;
  case 6: {
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts), .prescale = 0.5};
    s = gs_allreduce_async(ctx, name, buf, buf, 6, GS_FLOAT32, GS_SUM, r == 1 ? &o : NULL, &h);
    break;
  }
  case 7: {
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts),
                           .postscale = r == 0 ? 2.0 : 0.25};
    s = gs_allreduce_async(ctx, name, buf, buf, 6, GS_FLOAT32, GS_SUM, &o, &h);
    break;
  }
  case 8: { /* allgather: first dims may differ, the trailing ones not */
    int64_t shape[2] = {r + 1, r == 1 ? 4 : 3};
    s = gs_allgather_async(ctx, name, buf, shape, 2, GS_FLOAT32, NULL, &h);
    break;
  }
  case 9: {
    int64_t shape[3] = {r + 1, 3, 1};
    s = gs_allgather_async(ctx, name, buf, shape, r == 2 ? 3 : 2, GS_FLOAT32, NULL, &h);
    break;
  }
  default:
    wu_die("mismatch-all: no case %d", c);
  }
  submitted_or_die(ctx, s, name, "submit");
  return h;
}

/* After each mismatch: a new tensor (scaled on odd cases) and the failed name
 * itself, now submitted alike everywhere, must both complete with the right
 * values. */
static void mm_after(gs_ctx *ctx, int c, const char *failed_name) {
  enum { N = 100 };
  float after[N], want[N], again[6], again_want[6];
  char name[96];
  snprintf(name, sizeof name, "mm/after/%s", mm_cases[c]);
  double pre = c % 2 ? 0.5 : 1.0, post = c % 2 ? 3.0 : 1.0;
  for (int j = 0; j < N; j++) {
    int k = (j + c) % 5;
    after[j] = (float)(2 * (g_rank + 1) * k);
    want[j] = (float)((double)(2 * rank_weight_sum() * k) * pre * post);
  }
  for (int j = 0; j < 6; j++) {
    again[j] = (float)((g_rank + 1) * (j + 1));
    again_want[j] = (float)(rank_weight_sum() * (j + 1));
  }
  gs_allreduce_opts o = {
      .struct_size = sizeof(gs_allreduce_opts), .prescale = pre, .postscale = post};
  gs_handle *ha = NULL, *hb = NULL;
  submitted_or_die(ctx, gs_allreduce_async(ctx, name, after, after, N, GS_FLOAT32, GS_SUM, &o, &ha),
                   name, "gs_allreduce_async");
  submitted_or_die(
      ctx, gs_allreduce_async(ctx, failed_name, again, again, 6, GS_FLOAT32, GS_SUM, NULL, &hb),
      failed_name, "gs_allreduce_async (the name again, after its mismatch)");
  wait_ok(ha, name);
  wait_ok(hb, failed_name);
  check_f32(name, after, want, N);
  check_f32(failed_name, again, again_want, 6);
  gs_handle_free(ha);
  gs_handle_free(hb);
}

/* gs_handle_result_copy(h, dst, bytes) must fail with GS_ERR_INVALID_ARG
 * and exactly the text want. */
static void copy_refused(gs_ctx *ctx, const gs_handle *h, void *dst, size_t bytes, const char *want,
                         const char *what) {
  gs_status s = gs_handle_result_copy(h, dst, bytes);
  const char *msg = gs_last_error(ctx);
  if (s != GS_ERR_INVALID_ARG || strcmp(msg, want) != 0)
    wu_die("gs_handle_result_copy (%s): expected GS_ERR_INVALID_ARG \"%s\", got %s \"%s\"", what,
           want, wu_status_name(s), msg);
}

static int mode_mismatch_all(gs_ctx *ctx) {
  if (g_size != 3) wu_die("mismatch-all needs exactly 3 ranks (got %d)", g_size);
  double buf[64];
  for (int c = 0; c < MM_NCASES; c++) {
    char name[96];
    snprintf(name, sizeof name, "mm/%s", mm_cases[c]);
    for (size_t j = 0; j < 64; j++) buf[j] = 1.0;
    gs_handle *h = mm_submit(ctx, c, name, buf);
    gs_status s = gs_wait(h, WAIT_MS);
    /* No rank in the line: the driver compares the lines across ranks. */
    printf("neg-mismatch: %s: %s: %s\n", mm_cases[c], wu_status_name(s), gs_handle_error(h));
    if (s != GS_ERR_MISMATCH)
      wu_die("tensor '%s': expected GS_ERR_MISMATCH, got %s", name, wu_status_name(s));
    const void *data = NULL;
    size_t bytes = 0;
    if (gs_handle_result(h, &data, &bytes) != GS_ERR_INVALID_ARG)
      wu_die("tensor '%s': gs_handle_result gave a result for a failed op", name);
    char want[1024];
    snprintf(want, sizeof want, "tensor '%s': the op failed, so it has no result (%s)", name,
             gs_handle_error(h));
    copy_refused(ctx, h, buf, sizeof buf, want, "failed op");
    gs_handle_free(h);
    mm_after(ctx, c, name);
    printf("neg-mismatch: rank %d: %s: later tensors ok\n", g_rank, mm_cases[c]);
  }
  printf("neg-mismatch: passed (rank %d of %d, %d cases)\n", g_rank, g_size, MM_NCASES);
  return 0;
}

/* ---- mode: fusion ------------------------------------------------------------ */

static float fu_value(int r, unsigned i, size_t j, unsigned step) {
  return (float)((int)((i * 7u + (unsigned)(j % 1024) * 3u + step * 5u + (unsigned)r * 11u) % 33u) -
                 16);
}

/* N tensors of COUNT float32 each, submitted all at once, then waited on. */
static int mode_fusion(gs_ctx *ctx, unsigned n, size_t count, unsigned steps) {
  float **bufs = wu_xmalloc(n * sizeof *bufs);
  gs_handle **hs = wu_xmalloc(n * sizeof *hs);
  char(*names)[32] = wu_xmalloc(n * sizeof *names);
  for (unsigned i = 0; i < n; i++) {
    bufs[i] = wu_xmalloc(count * sizeof(float));
    snprintf(names[i], sizeof names[i], "fusion/t%03u", i);
  }
  for (unsigned step = 0; step < steps; step++) {
    for (unsigned i = 0; i < n; i++)
      for (size_t j = 0; j < count; j++) bufs[i][j] = fu_value(g_rank, i, j, step);
    gs_stats a = stats_now(ctx);
    for (unsigned i = 0; i < n; i++)
      submitted_or_die(ctx,
                       gs_allreduce_async(ctx, names[i], bufs[i], bufs[i], count, GS_FLOAT32,
                                          GS_SUM, NULL, &hs[i]),
                       names[i], "gs_allreduce_async");
    for (unsigned i = 0; i < n; i++) wait_ok(hs[i], names[i]);
    gs_stats b = stats_now(ctx);
    for (unsigned i = 0; i < n; i++) {
      for (size_t j = 0; j < count; j++) {
        float want = 0;
        for (int r = 0; r < g_size; r++) want += fu_value(r, i, j, step);
        if (bufs[i][j] != want)
          wu_die("tensor '%s' (step %u): element %zu: got %.9g, expected %.9g", names[i], step, j,
                 (double)bufs[i][j], (double)want);
      }
      gs_handle_free(hs[i]);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "fusion: rank %d step %u", g_rank, step);
    print_stats(prefix, &a, &b);
  }
  printf("fusion: passed (rank %d of %d, %u tensors x %u steps)\n", g_rank, g_size, n, steps);
  for (unsigned i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  free(hs);
  free(names);
  return 0;
}

/* ---- mode: workload ------------------------------------------------------------ */

typedef struct wl_tensor {
  char name[128];
  int64_t shape[8];
  int ndim;
  size_t count;
  float *buf;
  gs_handle *h;
} wl_tensor;

/* Element j of tensor t on rank r in step s; sums over ranks stay small
 * integers, so the average sum / size is exact for 2 ranks (x.5 at most). */
static int wl_k(unsigned t, size_t j, unsigned s) {
  return (int)((j + t * 13u + s * 7u) % 64u) - 32;
}

/* Parses "name dtype d0,d1,..." lines (# comments) of a workload file. */
static wl_tensor *wl_load(const char *path, size_t *n_out) {
  FILE *f = fopen(path, "r");
  if (!f) wu_die("cannot open workload %s: %s", path, strerror(errno));
  size_t n = 0, cap = 64;
  wl_tensor *ts = wu_xmalloc(cap * sizeof *ts);
  char line[1024];
  unsigned lineno = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\0') continue;
    char name[128], dtype[16], shape[256];
    if (sscanf(p, "%127s %15s %255s", name, dtype, shape) != 3)
      wu_die("%s:%u: expected 'name dtype shape'", path, lineno);
    if (strcmp(dtype, "float32") != 0)
      wu_die("%s:%u: dtype %s: only float32 is supported", path, lineno, dtype);
    if (n == cap) {
      cap *= 2;
      wl_tensor *g = realloc(ts, cap * sizeof *ts);
      if (!g) wu_die("out of memory");
      ts = g;
    }
    wl_tensor *t = &ts[n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->count = 1;
    for (char *tok = strtok(shape, ","); tok; tok = strtok(NULL, ",")) {
      if (t->ndim == 8) wu_die("%s:%u: more than 8 dimensions", path, lineno);
      t->shape[t->ndim] = strtoll(tok, NULL, 10);
      if (t->shape[t->ndim] <= 0) wu_die("%s:%u: bad dimension '%s'", path, lineno, tok);
      t->count *= (size_t)t->shape[t->ndim++];
    }
    t->buf = wu_xmalloc(t->count * sizeof(float));
    n++;
  }
  fclose(f);
  if (n == 0) wu_die("%s: no tensors", path);
  *n_out = n;
  return ts;
}

/* Every step: the workload's gradients submitted in reverse order (as
 * backward produces them), averaged, checked. */
static int mode_workload(gs_ctx *ctx, const char *path, unsigned steps) {
  size_t n = 0, elements = 0;
  wl_tensor *ts = wl_load(path, &n);
  for (size_t i = 0; i < n; i++) elements += ts[i].count;
  const int w = rank_weight_sum();
  for (unsigned s = 0; s < steps; s++) {
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < ts[i].count; j++)
        ts[i].buf[j] = (float)(wl_k((unsigned)i, j, s) * (g_rank + 1));
    gs_stats a = stats_now(ctx);
    for (size_t k = n; k-- > 0;) {
      wl_tensor *t = &ts[k];
      gs_allreduce_opts o = {
          .struct_size = sizeof(gs_allreduce_opts), .shape = t->shape, .ndim = t->ndim};
      submitted_or_die(ctx,
                       gs_allreduce_async(ctx, t->name, t->buf, t->buf, t->count, GS_FLOAT32,
                                          GS_AVERAGE, &o, &t->h),
                       t->name, "gs_allreduce_async");
    }
    for (size_t k = n; k-- > 0;) wait_ok(ts[k].h, ts[k].name);
    gs_stats b = stats_now(ctx);
    for (size_t i = 0; i < n; i++) {
      wl_tensor *t = &ts[i];
      for (size_t j = 0; j < t->count; j++) {
        float want = (float)(wl_k((unsigned)i, j, s) * w) / (float)g_size;
        if (t->buf[j] != want)
          wu_die("tensor '%s' (step %u): element %zu: got %.9g, expected %.9g", t->name, s + 1, j,
                 (double)t->buf[j], (double)want);
      }
      gs_handle_free(t->h);
      t->h = NULL;
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "workload: rank %d step %u", g_rank, s + 1);
    print_stats(prefix, &a, &b);
  }
  printf("workload: passed (rank %d of %d, %zu tensors, %zu elements x %u steps)\n", g_rank, g_size,
         n, elements, steps);
  for (size_t i = 0; i < n; i++) free(ts[i].buf);
  free(ts);
  return 0;
}

/* ---- mode: allgather ---------------------------------------------------------- */

/* First dimension of rank r in round k: 1..3, and 0 on one rank (another
 * one each round). The driver has the same formula. */
static int64_t ag_dim(int r, int k, int size) {
  if (r == (size - 1 + k) % size) return 0;
  return 1 + (r * 2 + k) % 3;
}

static int32_t ag_val3(int r, int k, int64_t row, int e) {
  return r * 1000000 + k * 100000 + (int32_t)row * 100 + e;
}

static double ag_val1(int r, int k, int64_t i) {
  return r * 100 + k * 10 + (double)i + 0.25;
}

static void ag_dims_line(char *buf, size_t cap, const gs_handle *h, const char *name, int k,
                         int shift, int64_t *total) {
  int64_t dims[64];
  if (g_size > 64) wu_die("too many ranks");
  for (int r = 0; r < g_size; r++) dims[r] = -1;
  gs_status s = gs_allgather_dims(h, dims, (size_t)g_size, total);
  if (s != GS_OK)
    wu_die("tensor '%s': gs_allgather_dims: %s: %s", name, wu_status_name(s), gs_last_error(NULL));
  size_t off = (size_t)snprintf(buf, cap, "[");
  for (int r = 0; r < g_size; r++) {
    if (dims[r] != ag_dim(r, k + shift, g_size))
      wu_die("tensor '%s' (round %d): gs_allgather_dims says rank %d sent %lld rows, it sent %lld",
             name, k, r, (long long)dims[r], (long long)ag_dim(r, k + shift, g_size));
    off += (size_t)snprintf(buf + off, cap - off, "%s%lld", r ? "," : "", (long long)dims[r]);
  }
  snprintf(buf + off, cap - off, "]");
  int64_t only_total = -1, first = -1;
  if (gs_allgather_dims(h, NULL, 0, &only_total) != GS_OK || only_total != *total)
    wu_die("tensor '%s': gs_allgather_dims(NULL, 0) gave total %lld, not %lld", name,
           (long long)only_total, (long long)*total);
  if (gs_allgather_dims(h, &first, 1, NULL) != GS_OK || first != dims[0])
    wu_die("tensor '%s': gs_allgather_dims(n=1) gave %lld, not %lld", name, (long long)first,
           (long long)dims[0]);
}

/* The copies of a completed op's result (data, bytes: gs_handle_result's):
 * into a buffer of exactly its size they equal the result, twice (the
 * handle is not changed); a size off by one either way and a NULL dst are
 * refused with their texts and write nothing. */
static void result_copy_checks(gs_ctx *ctx, const gs_handle *h, const char *name, const void *data,
                               size_t bytes) {
  unsigned char *dst = wu_xmalloc(bytes + 1);
  for (int pass = 0; pass < 2; pass++) {
    memset(dst, 0xa5, bytes + 1);
    gs_status s = gs_handle_result_copy(h, bytes ? dst : NULL, bytes);
    if (s != GS_OK)
      wu_die("tensor '%s': gs_handle_result_copy of %zu bytes: %s: %s", name, bytes,
             wu_status_name(s), gs_last_error(ctx));
    if (bytes && memcmp(dst, data, bytes) != 0)
      wu_die("tensor '%s': gs_handle_result_copy's %zu bytes differ from gs_handle_result's", name,
             bytes);
    if (dst[bytes] != 0xa5) wu_die("tensor '%s': gs_handle_result_copy wrote past dst", name);
  }
  memset(dst, 0xa5, bytes + 1);
  char want[512];
  snprintf(want, sizeof want,
           "tensor '%s': gs_handle_result_copy was given %zu bytes for a result of %zu bytes; "
           "pass a buffer of exactly the result's size (gs_handle_result's bytes)",
           name, bytes + 1, bytes);
  copy_refused(ctx, h, dst, bytes + 1, want, "one byte too many");
  if (bytes) {
    snprintf(want, sizeof want,
             "tensor '%s': gs_handle_result_copy was given %zu bytes for a result of %zu bytes; "
             "pass a buffer of exactly the result's size (gs_handle_result's bytes)",
             name, bytes - 1, bytes);
    copy_refused(ctx, h, dst, bytes - 1, want, "one byte short");
    snprintf(want, sizeof want,
             "tensor '%s': gs_handle_result_copy: dst is NULL for a result of %zu bytes", name,
             bytes);
    copy_refused(ctx, h, NULL, bytes, want, "NULL dst");
  }
  for (size_t i = 0; i <= bytes; i++)
    if (dst[i] != 0xa5) wu_die("tensor '%s': a refused gs_handle_result_copy wrote to dst", name);
  free(dst);
}

/* gs_handle_result_copy on what has no result: a NULL handle, an op still
 * pending (rank 0 tries before the other ranks submit it: they wait for its
 * kv key), an allreduce; then the pending op's copy once it completed. */
static void result_copy_refusals(gs_ctx *ctx) {
  int32_t mine = 100 + g_rank, got[64];
  float one = 1.0f;
  if (g_size > 64) wu_die("allgather mode takes at most 64 ranks");
  copy_refused(ctx, NULL, got, sizeof got, "gs_handle_result_copy: the handle is NULL",
               "NULL handle");
  int64_t shape[1] = {1};
  gs_handle *h = NULL, *ha = NULL;
  if (g_rank != 0) {
    void *v = NULL;
    size_t n = 0;
    gs_status s = gs_kv_get(ctx, "gather/pending-checked", 30000, &v, &n);
    if (s != GS_OK) wu_die("gs_kv_get gather/pending-checked: %s", wu_status_name(s));
    gs_free(v);
  }
  submitted_or_die(ctx,
                   gs_allgather_async(ctx, "gather/pending", &mine, shape, 1, GS_INT32, NULL, &h),
                   "gather/pending", "gs_allgather_async");
  if (g_rank == 0) {
    copy_refused(ctx, h, got, sizeof(int32_t) * (size_t)g_size,
                 "tensor 'gather/pending': the op is still pending, so it has no result yet; wait "
                 "for it first (gs_wait, gs_test)",
                 "pending op");
    if (gs_kv_set(ctx, "gather/pending-checked", "1", 1) != GS_OK)
      wu_die("gs_kv_set gather/pending-checked: %s", gs_last_error(ctx));
  }
  wait_ok(h, "gather/pending");
  memset(got, 0, sizeof got);
  gs_status s = gs_handle_result_copy(h, got, sizeof(int32_t) * (size_t)g_size);
  if (s != GS_OK) wu_die("gather/pending: gs_handle_result_copy: %s", gs_last_error(ctx));
  for (int r = 0; r < g_size; r++)
    if (got[r] != 100 + r)
      wu_die("gather/pending: element %d copied as %d, expected %d", r, got[r], 100 + r);
  gs_handle_free(h);
  submitted_or_die(
      ctx,
      gs_allreduce_async(ctx, "gather/allreduce", &one, &one, 1, GS_FLOAT32, GS_SUM, NULL, &ha),
      "gather/allreduce", "gs_allreduce_async");
  wait_ok(ha, "gather/allreduce");
  copy_refused(ctx, ha, got, 4,
               "tensor 'gather/allreduce': allreduce writes into your buffer; only allgather, "
               "alltoall, reducescatter and sparse results live in the handle",
               "allreduce");
  gs_handle_free(ha);
}

static int mode_allgather(gs_ctx *ctx, int rounds) {
  result_copy_refusals(ctx);
  for (int k = 0; k < rounds; k++) {
    /* [d, 2, 3] int32 and [d'] float64, both in flight at once. */
    int64_t d3 = ag_dim(g_rank, k, g_size), d1 = ag_dim(g_rank, k + 1, g_size);
    int64_t shape3[3] = {d3, 2, 3}, shape1[1] = {d1};
    int32_t *in3 = wu_xmalloc((size_t)d3 * 6 * sizeof *in3);
    double *in1 = wu_xmalloc((size_t)d1 * sizeof *in1);
    for (int64_t row = 0; row < d3; row++)
      for (int e = 0; e < 6; e++) in3[row * 6 + e] = ag_val3(g_rank, k, row, e);
    for (int64_t i = 0; i < d1; i++) in1[i] = ag_val1(g_rank, k, i);
    gs_handle *h3 = NULL, *h1 = NULL;
    submitted_or_die(ctx, gs_allgather_async(ctx, "gather/3d", in3, shape3, 3, GS_INT32, NULL, &h3),
                     "gather/3d", "gs_allgather_async");
    submitted_or_die(ctx,
                     gs_allgather_async(ctx, "gather/1d", in1, shape1, 1, GS_FLOAT64, NULL, &h1),
                     "gather/1d", "gs_allgather_async");
    wait_ok(h3, "gather/3d");
    wait_ok(h1, "gather/1d");

    char line3[512], line1[512];
    int64_t total3 = 0, total1 = 0;
    ag_dims_line(line3, sizeof line3, h3, "gather/3d", k, 0, &total3);
    ag_dims_line(line1, sizeof line1, h1, "gather/1d", k, 1, &total1);
    const void *data = NULL;
    size_t bytes = 0;
    gs_status s = gs_handle_result(h3, &data, &bytes);
    if (s != GS_OK)
      wu_die("gather/3d: gs_handle_result: %s: %s", wu_status_name(s), gs_last_error(ctx));
    if (bytes != (size_t)total3 * 6 * sizeof(int32_t))
      wu_die("gather/3d (round %d): result has %zu bytes, expected %lld rows of 24", k, bytes,
             (long long)total3);
    const int32_t *out3 = data;
    size_t at = 0;
    for (int r = 0; r < g_size; r++)
      for (int64_t row = 0; row < ag_dim(r, k, g_size); row++, at++)
        for (int e = 0; e < 6; e++)
          if (out3[at * 6 + (size_t)e] != ag_val3(r, k, row, e))
            wu_die(
                "gather/3d (round %d): row %zu element %d: got %d, expected %d (rank %d row %lld)",
                k, at, e, out3[at * 6 + (size_t)e], ag_val3(r, k, row, e), r, (long long)row);
    s = gs_handle_result(h1, &data, &bytes);
    if (s != GS_OK)
      wu_die("gather/1d: gs_handle_result: %s: %s", wu_status_name(s), gs_last_error(ctx));
    if (bytes != (size_t)total1 * sizeof(double))
      wu_die("gather/1d (round %d): result has %zu bytes, expected %lld doubles", k, bytes,
             (long long)total1);
    const double *out1 = data;
    at = 0;
    for (int r = 0; r < g_size; r++)
      for (int64_t i = 0; i < ag_dim(r, k + 1, g_size); i++, at++)
        if (out1[at] != ag_val1(r, k, i))
          wu_die(
              "gather/1d (round %d): element %zu: got %.9g, expected %.9g (rank %d element %lld)",
              k, at, out1[at], ag_val1(r, k, i), r, (long long)i);
    result_copy_checks(ctx, h1, "gather/1d", data, bytes);
    gs_handle_result(h3, &data, &bytes);
    result_copy_checks(ctx, h3, "gather/3d", data, bytes);
    printf("allgather: round %d: 3d dims %s total %lld; 1d dims %s total %lld\n", k, line3,
           (long long)total3, line1, (long long)total1);
    gs_handle_free(h3);
    gs_handle_free(h1);
    free(in3);
    free(in1);
  }
  printf("allgather: gs_handle_result_copy: results copied whole; pending op, allreduce, NULL "
         "handle, wrong sizes and NULL dst refused\n");
  printf("allgather: passed (rank %d of %d, %d rounds)\n", g_rank, g_size, rounds);
  return 0;
}

/* ---- mode: bcast-barrier ------------------------------------------------------- */

static double bc_f64(int root, int k, size_t j) {
  return (double)j * 0.25 - 100.0 + root * 1000 + k * 0.125;
}

static int8_t bc_i8(int root, int k, size_t j) {
  return (int8_t)((int)((j * 7 + (size_t)root * 3 + (size_t)k) % 251) - 125);
}

static int mode_bcast_barrier(gs_ctx *ctx, int root) {
  enum { NF = 1000, NI = 37 };
  double f[NF];
  int8_t b[NI];
  for (int k = 0; k < 2; k++) { /* the second round goes through the response cache */
    for (size_t j = 0; j < NF; j++) f[j] = g_rank == root ? bc_f64(root, k, j) : -1e300;
    for (size_t j = 0; j < NI; j++) b[j] = g_rank == root ? bc_i8(root, k, j) : (int8_t)0x5a;
    gs_handle *hf = NULL, *hb = NULL;
    submitted_or_die(ctx, gs_broadcast_async(ctx, "bcast/f64", f, NF, GS_FLOAT64, root, NULL, &hf),
                     "bcast/f64", "gs_broadcast_async");
    submitted_or_die(ctx, gs_broadcast_async(ctx, "bcast/i8", b, NI, GS_INT8, root, NULL, &hb),
                     "bcast/i8", "gs_broadcast_async");
    wait_ok(hf, "bcast/f64");
    wait_ok(hb, "bcast/i8");
    for (size_t j = 0; j < NF; j++)
      if (f[j] != bc_f64(root, k, j))
        wu_die("bcast/f64 (round %d, root %d): element %zu: got %.9g, expected %.9g", k, root, j,
               f[j], bc_f64(root, k, j));
    for (size_t j = 0; j < NI; j++)
      if (b[j] != bc_i8(root, k, j))
        wu_die("bcast/i8 (round %d, root %d): element %zu: got %d, expected %d", k, root, j, b[j],
               bc_i8(root, k, j));
    gs_handle_free(hf);
    gs_handle_free(hb);
  }
  printf("bcast: rank %d: float64 and int8 from root %d ok\n", g_rank, root);

  /* Barrier k: every rank leaves a mark before entering; whoever comes out
   * must find every rank's mark (causality, not timing). */
  const char *dir = getenv("GS_TEST_DIR");
  if (!dir || !*dir) wu_die("GS_TEST_DIR is not set");
  for (int k = 1; k <= 3; k++) {
    char path[600];
    snprintf(path, sizeof path, "%s/barrier-%d-rank-%d", dir, k, g_rank);
    FILE *m = fopen(path, "w");
    if (!m) wu_die("cannot create %s: %s", path, strerror(errno));
    fclose(m);
    gs_status s = gs_barrier(ctx);
    if (s != GS_OK) wu_die("gs_barrier #%d: %s: %s", k, wu_status_name(s), gs_last_error(ctx));
    for (int r = 0; r < g_size; r++) {
      snprintf(path, sizeof path, "%s/barrier-%d-rank-%d", dir, k, r);
      if (access(path, F_OK) != 0)
        wu_die("gs_barrier #%d returned before rank %d reached it (%s missing)", k, r, path);
    }
    printf("bcast: rank %d: barrier %d ok\n", g_rank, k);
  }
  printf("bcast: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- mode: grouped --------------------------------------------------------------- */

static int mode_grouped(gs_ctx *ctx, int rounds) {
  static const size_t counts[3] = {5, 1000, 70000};
  const char *names[3] = {"group/a", "group/b", "group/c"};
  float *send[3], *recv[3], *want[3];
  for (int i = 0; i < 3; i++) {
    send[i] = wu_xmalloc(counts[i] * sizeof(float));
    recv[i] = i == 1 ? wu_xmalloc(counts[i] * sizeof(float)) : send[i]; /* b out of place */
    want[i] = wu_xmalloc(counts[i] * sizeof(float));
  }
  for (int k = 0; k < rounds; k++) {
    /* Odd rounds scale: x 0.5 before, x 4 after (exact on even integers). */
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts),
                           .prescale = k % 2 ? 0.5 : 0,
                           .postscale = k % 2 ? 4 : 0};
    double factor = k % 2 ? 2.0 : 1.0;
    for (int i = 0; i < 3; i++)
      for (size_t j = 0; j < counts[i]; j++) {
        int v = (int)((j * 5 + (size_t)i * 17 + (size_t)k) % 23) - 11;
        send[i][j] = (float)(2 * v * (g_rank + 1));
        want[i][j] = (float)(2 * v * rank_weight_sum() * factor);
      }
    gs_handle *hs[3] = {NULL, NULL, NULL};
    gs_stats a = stats_now(ctx);
    gs_status s =
        gs_grouped_allreduce_async(ctx, 3, names, (const void *const *)send, (void *const *)recv,
                                   counts, GS_FLOAT32, GS_SUM, &o, hs);
    submitted_or_die(ctx, s, "group/a", "gs_grouped_allreduce_async");
    for (int i = 0; i < 3; i++) wait_ok(hs[i], names[i]);
    gs_stats b = stats_now(ctx);
    for (int i = 0; i < 3; i++) {
      check_f32(names[i], recv[i], want[i], counts[i]);
      gs_handle_free(hs[i]);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "grouped: rank %d round %d", g_rank, k);
    print_stats(prefix, &a, &b);
  }
  printf("grouped: passed (rank %d of %d, %d rounds)\n", g_rank, g_size, rounds);
  for (int i = 0; i < 3; i++) {
    if (recv[i] != send[i]) free(recv[i]);
    free(send[i]);
    free(want[i]);
  }
  return 0;
}

/* ---- mode: join-steps -------------------------------------------------------------- */

static int js_k(size_t j, int step) {
  return (int)((j * 3 + (size_t)step * 5) % 17) - 8;
}

/* The last rank runs out of data two steps early and joins; the others run
 * every step of an average of the same tensor (size * k: every partial sum
 * and the quotient are small integers, so the result is exact). */
static int mode_join_steps(gs_ctx *ctx, int steps) {
  enum { N = 1000 };
  const int early = g_size - 1;
  const int my_steps = g_rank == early ? steps - 2 : steps;
  float in[N], out[N], want[N];
  for (int s = 0; s < my_steps; s++) {
    int joined = s >= steps - 2; /* only the ranks that go on get here */
    for (size_t j = 0; j < N; j++) {
      in[j] = (float)(g_size * js_k(j, s));
      want[j] = (float)((joined ? g_size - 1 : g_size) * js_k(j, s));
      out[j] = -12345.0f;
    }
    gs_handle *h = NULL;
    submitted_or_die(
        ctx, gs_allreduce_async(ctx, "join/grad", in, out, N, GS_FLOAT32, GS_AVERAGE, NULL, &h),
        "join/grad", "gs_allreduce_async");
    wait_ok(h, "join/grad");
    gs_handle_free(h);
    for (size_t j = 0; j < N; j++)
      if (out[j] != want[j])
        wu_die("tensor 'join/grad' (step %d, %s): element %zu: got %.9g, expected %.9g", s,
               joined ? "rank joined" : "all ranks", j, (double)out[j], (double)want[j]);
    if (s == steps - 2 || s == steps - 1) {
      /* Only allreduce runs with a joined rank. */
      int32_t v[2] = {g_rank, g_rank};
      int64_t shape[1] = {2};
      const char *what = s == steps - 2 ? "allgather" : "broadcast";
      gs_status st = s == steps - 2
                         ? gs_allgather_async(ctx, "join/gather", v, shape, 1, GS_INT32, NULL, &h)
                         : gs_broadcast_async(ctx, "join/bcast", v, 2, GS_INT32, 0, NULL, &h);
      submitted_or_die(ctx, st, what, "submit");
      st = gs_wait(h, WAIT_MS);
      printf("join: rank %d: %s: %s: %s\n", g_rank, what, wu_status_name(st), gs_handle_error(h));
      if (st != GS_ERR_INVALID_ARG)
        wu_die("%s while rank %d has joined: expected GS_ERR_INVALID_ARG, got %s", what, early,
               wu_status_name(st));
      if (!strstr(gs_handle_error(h), "has joined"))
        wu_die("%s while rank %d has joined: the message lacks 'has joined'", what, early);
      gs_handle_free(h);
    }
    printf("join: rank %d: step %d ok (%s)\n", g_rank, s, joined ? "one rank joined" : "all ranks");
  }
  int last = -1;
  gs_status st = gs_join(ctx, &last);
  if (st != GS_OK) wu_die("gs_join: %s: %s", wu_status_name(st), gs_last_error(ctx));
  printf("join: rank %d: last joined rank %d\n", g_rank, last);
  /* The join round is over: every rank takes part again. */
  for (size_t j = 0; j < N; j++) {
    in[j] = (float)((g_rank + 1) * js_k(j, 99));
    want[j] = (float)(rank_weight_sum() * js_k(j, 99));
  }
  gs_handle *h = NULL;
  submitted_or_die(ctx,
                   gs_allreduce_async(ctx, "join/after", in, out, N, GS_FLOAT32, GS_SUM, NULL, &h),
                   "join/after", "gs_allreduce_async");
  wait_ok(h, "join/after");
  gs_handle_free(h);
  check_f32("join/after", out, want, N);
  printf("join: passed (rank %d of %d, %d steps)\n", g_rank, g_size, my_steps);
  return 0;
}

/* ---- mode: duplicate ----------------------------------------------------------------- */

/* Every way of submitting name again while it is in flight on this rank must
 * fail at once with GS_ERR_DUPLICATE_NAME, create no handle and change
 * nothing. */
static void dup_expect(gs_ctx *ctx, const char *name, const char *how, gs_status s, gs_handle *h) {
  const char *msg = gs_last_error(ctx);
  printf("duplicate: rank %d: %s: %s: %s\n", g_rank, how, wu_status_name(s), msg);
  if (s != GS_ERR_DUPLICATE_NAME)
    wu_die("%s of '%s': expected GS_ERR_DUPLICATE_NAME, got %s", how, name, wu_status_name(s));
  if (h != NULL) wu_die("%s of '%s' failed but returned a handle", how, name);
  char want[160];
  snprintf(want, sizeof want, "tensor '%s'", name);
  if (!strstr(msg, want)) wu_die("%s of '%s': the message does not name the tensor", how, name);
  snprintf(want, sizeof want, "rank %d", g_rank);
  if (!strstr(msg, want))
    wu_die("%s of '%s': the message does not name rank %d", how, name, g_rank);
}

static int mode_duplicate(gs_ctx *ctx) {
  enum { N = 16 };
  /* 'dup/a' is submitted first by ranks 1.., 'dup/b' first by rank 0; each
   * rank submits the other one only after the barrier, so neither can
   * complete while any rank is still testing its duplicates. */
  const char *mine = g_rank == 0 ? "dup/b" : "dup/a";
  const char *other = g_rank == 0 ? "dup/a" : "dup/b";
  float x[N], y[N], z[N], g2[N], again[N];
  for (int j = 0; j < N; j++) x[j] = y[j] = z[j] = g2[j] = again[j] = (float)(g_rank + 1);
  gs_handle *hm = NULL, *ho = NULL, *h = NULL;
  submitted_or_die(ctx, gs_allreduce_async(ctx, mine, x, x, N, GS_FLOAT32, GS_SUM, NULL, &hm), mine,
                   "gs_allreduce_async");

  h = NULL;
  gs_status s = gs_allreduce_async(ctx, mine, z, z, N, GS_FLOAT32, GS_SUM, NULL, &h);
  dup_expect(ctx, mine, "allreduce", s, h);
  int64_t shape[1] = {N};
  h = NULL;
  s = gs_allgather_async(ctx, mine, z, shape, 1, GS_FLOAT32, NULL, &h);
  dup_expect(ctx, mine, "allgather", s, h);
  h = NULL;
  s = gs_broadcast_async(ctx, mine, z, N, GS_FLOAT32, 0, NULL, &h);
  dup_expect(ctx, mine, "broadcast", s, h);
  /* A group with one new and one busy name: all or none, so 'dup/new' must
   * still be free afterwards. */
  const char *gnames[2] = {"dup/new", mine};
  const void *gsend[2] = {g2, z};
  void *grecv[2] = {g2, z};
  size_t gcount[2] = {N, N};
  gs_handle *gh[2] = {NULL, NULL};
  s = gs_grouped_allreduce_async(ctx, 2, gnames, gsend, grecv, gcount, GS_FLOAT32, GS_SUM, NULL,
                                 gh);
  dup_expect(ctx, mine, "grouped allreduce", s, gh[1]);
  if (gh[0] != NULL) wu_die("the failed group returned a handle for 'dup/new'");
  /* Two equal names inside one group. */
  const char *same[2] = {"dup/twice", "dup/twice"};
  s = gs_grouped_allreduce_async(ctx, 2, same, gsend, grecv, gcount, GS_FLOAT32, GS_SUM, NULL, gh);
  dup_expect(ctx, "dup/twice", "group naming it twice", s, gh[0]);

  s = gs_barrier(ctx);
  if (s != GS_OK) wu_die("gs_barrier: %s: %s", wu_status_name(s), gs_last_error(ctx));
  submitted_or_die(ctx, gs_allreduce_async(ctx, other, y, y, N, GS_FLOAT32, GS_SUM, NULL, &ho),
                   other, "gs_allreduce_async");
  h = NULL;
  submitted_or_die(ctx, gs_allreduce_async(ctx, "dup/new", g2, g2, N, GS_FLOAT32, GS_SUM, NULL, &h),
                   "dup/new", "gs_allreduce_async (its group was refused)");
  wait_ok(hm, mine);
  wait_ok(ho, other);
  wait_ok(h, "dup/new");
  gs_handle_free(hm);
  gs_handle_free(ho);
  gs_handle_free(h);
  /* Completed: both names are free again on every rank. */
  submitted_or_die(ctx,
                   gs_allreduce_async(ctx, "dup/a", again, again, N, GS_FLOAT32, GS_SUM, NULL, &h),
                   "dup/a", "gs_allreduce_async (after the first op completed)");
  submitted_or_die(ctx, gs_allreduce_async(ctx, "dup/b", z, z, N, GS_FLOAT32, GS_SUM, NULL, &ho),
                   "dup/b", "gs_allreduce_async (after the first op completed)");
  wait_ok(h, "dup/a");
  wait_ok(ho, "dup/b");
  gs_handle_free(h);
  gs_handle_free(ho);
  float want[N];
  for (int j = 0; j < N; j++) want[j] = (float)rank_weight_sum();
  check_f32(mine, x, want, N);
  check_f32(other, y, want, N);
  check_f32("dup/new", g2, want, N);
  check_f32("dup/a", again, want, N);
  check_f32("dup/b", z, want, N);
  printf("duplicate: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- hardening modes (driven by test_negotiation.c) ---------------------------- */

/* N layers submitted at once whose sizes differ between rank 0 (4
 * elements) and the others (5), as two ranks running different models:
 * every layer fails with GS_ERR_MISMATCH on every rank and the job goes on. */
static int mode_model_diff(gs_ctx *ctx, int n) {
  float(*bufs)[5] = wu_xcalloc((size_t)n, sizeof *bufs);
  gs_handle **hs = wu_xcalloc((size_t)n, sizeof *hs);
  size_t count = g_rank == 0 ? 4 : 5;
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "model/layer%02d/kernel", i);
    submitted_or_die(
        ctx,
        gs_allreduce_async(ctx, name, bufs[i], bufs[i], count, GS_FLOAT32, GS_SUM, NULL, &hs[i]),
        name, "gs_allreduce_async");
  }
  for (int i = 0; i < n; i++) {
    gs_status s = gs_wait(hs[i], WAIT_MS);
    /* No rank in the line: the driver compares the lines across ranks. */
    printf("model-diff: layer%02d: %s: %s\n", i, wu_status_name(s), gs_handle_error(hs[i]));
    if (s != GS_ERR_MISMATCH)
      wu_die("tensor 'model/layer%02d/kernel': expected GS_ERR_MISMATCH, got %s", i,
             wu_status_name(s));
    gs_handle_free(hs[i]);
  }
  free(hs);
  free(bufs);
  one_allreduce(ctx, "model-diff/after"); /* the coordinator is still there */
  printf("model-diff: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* Rank 0 shuts down early while the other ranks have N ops pending: every
 * one of those fails with GS_ERR_SHUTDOWN naming rank 0, long before any
 * deadlock detector (the driver turns it off). */
static int mode_early_leave(gs_ctx *ctx, int n) {
  one_allreduce(ctx, "early-leave/first");
  if (g_rank == 0) {
    sleep_ms(1000); /* the others' ops reach the coordinator first (either order must pass) */
    printf("early-leave: rank 0 shuts down with the others' ops pending\n");
    printf("early-leave: passed (rank %d of %d)\n", g_rank, g_size);
    return 0;
  }
  int32_t(*bufs)[8] = wu_xcalloc((size_t)n, sizeof *bufs);
  gs_handle **hs = wu_xcalloc((size_t)n, sizeof *hs);
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "early-leave/op%02d", i);
    submitted_or_die(
        ctx, gs_allreduce_async(ctx, name, bufs[i], bufs[i], 8, GS_INT32, GS_SUM, NULL, &hs[i]),
        name, "gs_allreduce_async");
  }
  for (int i = 0; i < n; i++) {
    gs_status s = gs_wait(hs[i], WAIT_MS);
    printf("early-leave: rank %d: op%02d: %s: %s\n", g_rank, i, wu_status_name(s),
           gs_handle_error(hs[i]));
    if (s != GS_ERR_SHUTDOWN)
      wu_die("tensor 'early-leave/op%02d': expected GS_ERR_SHUTDOWN, got %s: %s", i,
             wu_status_name(s), gs_handle_error(hs[i]));
    gs_handle_free(hs[i]);
  }
  free(hs);
  free(bufs);
  printf("early-leave: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* gradsyncd --max-pending-per-rank L: rank 0 submits L + 1 ops at once and
 * the last fails with an error naming the limit; the others submit the
 * first L once rank 0 has that error (a kv key says so: submitted earlier,
 * their ops could complete some of rank 0's before its last one reaches the
 * coordinator, which then is within the limit). Those L complete with the
 * right sums on every rank, and the job goes on. */
static int mode_pending_limit(gs_ctx *ctx, int limit) {
  enum { N = 16 };
  static const char refused_key[] = "pending-limit/refused";
  int n = g_rank == 0 ? limit + 1 : limit;
  float(*bufs)[N] = wu_xcalloc((size_t)n, sizeof *bufs);
  gs_handle **hs = wu_xcalloc((size_t)n, sizeof *hs);
  if (g_rank != 0) {
    void *v = NULL;
    size_t vlen = 0;
    gs_status s = gs_kv_get(ctx, refused_key, 60000, &v, &vlen);
    if (s != GS_OK || !v)
      wu_die("kv '%s' (rank 0 refused past the limit) not set within 60 s: %s", refused_key,
             wu_status_name(s));
    gs_free(v);
  }
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "pending/t%03d", i);
    for (int j = 0; j < N; j++) bufs[i][j] = (float)((g_rank + 1) * (i + j));
    submitted_or_die(
        ctx, gs_allreduce_async(ctx, name, bufs[i], bufs[i], N, GS_FLOAT32, GS_SUM, NULL, &hs[i]),
        name, "gs_allreduce_async");
  }
  if (g_rank == 0) {
    char name[64];
    snprintf(name, sizeof name, "pending/t%03d", limit);
    gs_status s = gs_wait(hs[limit], WAIT_MS);
    printf("pending-limit: rank %d: %s: %s: %s\n", g_rank, name, wu_status_name(s),
           gs_handle_error(hs[limit]));
    if (s != GS_ERR_INVALID_ARG)
      wu_die("tensor '%s': expected GS_ERR_INVALID_ARG past the limit, got %s", name,
             wu_status_name(s));
    gs_handle_free(hs[limit]);
    if (gs_kv_set(ctx, refused_key, "1", 1) != GS_OK) wu_die("gs_kv_set '%s' failed", refused_key);
  }
  for (int i = 0; i < limit; i++) {
    char name[64];
    snprintf(name, sizeof name, "pending/t%03d", i);
    gs_status s = gs_wait(hs[i], WAIT_MS);
    if (s != GS_OK)
      wu_die("tensor '%s': gs_wait: %s: %s", name, wu_status_name(s), gs_handle_error(hs[i]));
    float want[N];
    for (int j = 0; j < N; j++) want[j] = (float)(rank_weight_sum() * (i + j));
    check_f32(name, bufs[i], want, N);
    gs_handle_free(hs[i]);
  }
  free(hs);
  free(bufs);
  one_allreduce(ctx, "pending/after");
  printf("pending-limit: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* Each rank allgathers 2^60 - 1 - rank rows of float64: each rank's part is a
 * valid size (the library takes up to 2^60 - 1 elements; the buffer is never
 * read, the op fails before any data moves) but the sum over 3 ranks
 * overflows 64 bits of bytes. Every rank gets
 * GS_ERR_INVALID_ARG naming the tensor and the rank with the largest part,
 * and the job goes on. */
static int mode_allgather_overflow(gs_ctx *ctx) {
  static double never_read[1];
  int64_t shape[1] = {(INT64_C(1) << 60) - 1 - g_rank};
  gs_handle *h = NULL;
  submitted_or_die(
      ctx, gs_allgather_async(ctx, "huge/gather", never_read, shape, 1, GS_FLOAT64, NULL, &h),
      "huge/gather", "gs_allgather_async");
  gs_status s = gs_wait(h, WAIT_MS);
  printf("allgather-overflow: %s: %s\n", wu_status_name(s), gs_handle_error(h));
  if (s != GS_ERR_INVALID_ARG)
    wu_die("tensor 'huge/gather': expected GS_ERR_INVALID_ARG, got %s", wu_status_name(s));
  gs_handle_free(h);
  one_allreduce(ctx, "allgather-overflow/after");
  printf("allgather-overflow: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- main ------------------------------------------------------------------ */

/* The application's kv store (gs_kv_set / gs_kv_get / gs_free): every rank
 * writes its own key and reads every other rank's, waiting for it; binary
 * values with NULs, an empty value (non-NULL buffer, length 0), a value of
 * exactly GS_KV_VALUE_MAX, a replaced value; the refusals (empty and
 * over-long key, over-large value, a wait past GS_KV_WAIT_MAX_MS, NULL
 * out-params) and GS_ERR_TIMEOUT for a key nobody sets, *value NULL. */
static void kv_expect(gs_status got, gs_status want, const char *what) {
  if (got != want)
    wu_die("%s: expected %s, got %s: %s", what, wu_status_name(want), wu_status_name(got),
           gs_last_error(NULL));
}

static void kv_get_expect(gs_ctx *ctx, const char *key, const void *want, size_t wlen) {
  void *v = NULL;
  size_t n = 99;
  kv_expect(gs_kv_get(ctx, key, 30000, &v, &n), GS_OK, key);
  if (!v) wu_die("gs_kv_get '%s': GS_OK with a NULL value", key);
  if (n != wlen || memcmp(v, want, wlen) != 0)
    wu_die("gs_kv_get '%s': %zu bytes, want %zu (or the bytes differ)", key, n, wlen);
  gs_free(v);
}

static int mode_kv(gs_ctx *ctx) {
  char key[64], val[64];
  int len = snprintf(val, sizeof val, "rank%c%d value", 0, g_rank) + 1; /* NULs inside */
  snprintf(key, sizeof key, "kv/rank%d", g_rank);
  kv_expect(gs_kv_set(ctx, key, val, (size_t)len), GS_OK, key);
  for (int r = 0; r < g_size; r++) {
    char k[64], want[64];
    int wl = snprintf(want, sizeof want, "rank%c%d value", 0, r) + 1;
    snprintf(k, sizeof k, "kv/rank%d", r);
    kv_get_expect(ctx, k, want, (size_t)wl);
  }
  size_t big = GS_KV_VALUE_MAX;
  uint8_t *buf = wu_xcalloc(big + 1, 1);
  for (size_t i = 0; i < big + 1; i++) buf[i] = (uint8_t)(i * 7 + 3);
  if (g_rank == 0) {
    kv_expect(gs_kv_set(ctx, "kv/empty", "", 0), GS_OK, "empty value");
    kv_expect(gs_kv_set(ctx, "kv/empty2", NULL, 0), GS_OK, "NULL value of length 0");
    kv_expect(gs_kv_set(ctx, "kv/big", buf, big), GS_OK, "a value of GS_KV_VALUE_MAX bytes");
    kv_expect(gs_kv_set(ctx, "kv/over", "first", 5), GS_OK, "kv/over first");
    kv_expect(gs_kv_set(ctx, "kv/over", "second!", 7), GS_OK, "kv/over replaced");
  }
  kv_expect(gs_barrier(ctx), GS_OK, "barrier after the writes");
  kv_get_expect(ctx, "kv/empty", "", 0);
  kv_get_expect(ctx, "kv/empty2", "", 0);
  kv_get_expect(ctx, "kv/big", buf, big);
  kv_get_expect(ctx, "kv/over", "second!", 7);

  char longkey[GS_KV_KEY_MAX + 2];
  memset(longkey, 'k', sizeof longkey - 1);
  longkey[sizeof longkey - 1] = 0;
  kv_expect(gs_kv_set(ctx, "", "x", 1), GS_ERR_INVALID_ARG, "empty key");
  if (!strstr(gs_last_error(NULL), "key is NULL or empty"))
    wu_die("empty key: message %s", gs_last_error(NULL));
  kv_expect(gs_kv_set(ctx, longkey, "x", 1), GS_ERR_INVALID_ARG, "a key over GS_KV_KEY_MAX");
  if (!strstr(gs_last_error(NULL), "longer than GS_KV_KEY_MAX (448)"))
    wu_die("long key: message %s", gs_last_error(NULL));
  longkey[GS_KV_KEY_MAX] = 0; /* exactly GS_KV_KEY_MAX: accepted */
  kv_expect(gs_kv_set(ctx, longkey, "x", 1), GS_OK, "a key of GS_KV_KEY_MAX bytes");
  kv_expect(gs_kv_set(ctx, "kv/x", buf, big + 1), GS_ERR_INVALID_ARG, "a value over the max");
  if (!strstr(gs_last_error(NULL), "larger than GS_KV_VALUE_MAX"))
    wu_die("big value: message %s", gs_last_error(NULL));
  kv_expect(gs_kv_set(ctx, "kv/x", NULL, 1), GS_ERR_INVALID_ARG, "NULL value of length 1");
  void *v = (void *)1;
  size_t n = 1;
  kv_expect(gs_kv_get(ctx, "kv/empty", GS_KV_WAIT_MAX_MS + 1, &v, &n), GS_ERR_INVALID_ARG,
            "a wait over GS_KV_WAIT_MAX_MS");
  if (v != NULL || n != 0) wu_die("refused gs_kv_get left *value/*len set");
  kv_expect(gs_kv_get(ctx, "kv/empty", 0, NULL, &n), GS_ERR_INVALID_ARG, "NULL value out-param");
  v = (void *)1;
  kv_expect(gs_kv_get(ctx, "kv/nobody-sets-this", 200, &v, &n), GS_ERR_TIMEOUT, "unset key");
  if (v != NULL) wu_die("gs_kv_get timed out but *value is not NULL");
  kv_expect(gs_kv_get(ctx, "kv/nobody-sets-this", 0, &v, &n), GS_ERR_TIMEOUT, "unset key, no wait");
  gs_free(NULL);
  free(buf);
  kv_expect(gs_barrier(ctx), GS_OK, "final barrier");
  printf("kv: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

static void usage(void) {
  fprintf(
      stderr,
      "usage: gs-test-worker ops [ROUNDS] | random-order [SEED] | mismatch |\n"
      "                      hold MS | hold-file PATH | join | exit-code RANK CODE | "
      "mismatch-all |\n"
      "                      fusion N COUNT STEPS | workload PATH STEPS |\n"
      "                      allgather ROUNDS | bcast-barrier ROOT | grouped ROUNDS |\n"
      "                      join-steps STEPS | duplicate | model-diff N |\n"
      "                      early-leave N | pending-limit L | allgather-overflow | fork STEPS |\n"
      "                      fork-init fresh|after-shutdown|live | kv\n");
  exit(2);
}

/* ---- mode: fork ----------------------------------------------------------------- */

/* Rank 0 forks after some steps, with one op completed and one in flight
 * (rank 1 submits it only once the children are done: a mark in
 * GS_TEST_DIR), while one of its threads waits on that op and another
 * keeps taking the context's lock (gs_test, gs_get_stats). In each child
 * every call on the parent's context must fail at once with GS_ERR_FORKED
 * naming the rank, the host and both processes, the completed op must
 * still read, and the child exits 0; the parent's job must go on with the
 * right values and shut down cleanly. */

#define FORK_N 64
#define FORK_CHILDREN 12 /* the first prints its errors; the rest race the lock */

static float fork_expect(int step, size_t j) {
  float want = 0;
  for (int r = 0; r < g_size; r++) want += (float)((r + 1) * (step + 1)) + (float)j;
  return want;
}

static void fork_step(gs_ctx *ctx, const char *name, int step, float *buf, gs_handle **keep) {
  float send[FORK_N];
  for (size_t j = 0; j < FORK_N; j++) send[j] = (float)((g_rank + 1) * (step + 1)) + (float)j;
  gs_handle *h = NULL;
  submitted_or_die(ctx,
                   gs_allreduce_async(ctx, name, send, buf, FORK_N, GS_FLOAT32, GS_SUM, NULL, &h),
                   name, "gs_allreduce_async");
  wait_ok(h, name);
  for (size_t j = 0; j < FORK_N; j++)
    if (buf[j] != fork_expect(step, j))
      wu_die("tensor '%s' (step %d): element %zu: got %g, expected %g", name, step, j, buf[j],
             fork_expect(step, j));
  if (keep)
    *keep = h;
  else
    gs_handle_free(h);
}

/* Waits for a forked child (the fork and fork-init modes) and returns its
 * wait status; what names it in the error. Bounded: the child's own alarm
 * is at 60 s, and after 90 s it is killed and this rank fails. */
static int wait_child_bounded(pid_t pid, const char *what) {
  int status = 0;
  pid_t got = 0;
  for (int i = 0; (got = waitpid(pid, &status, WNOHANG)) == 0; i++) {
    if (i == 9000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      wu_die("%s (pid %d) did not exit within 90 s", what, (int)pid);
    }
    sleep_ms(10);
  }
  if (got != pid) wu_die("%s: waitpid %d: %s", what, (int)pid, strerror(errno));
  return status;
}

/* In the child: s and the thread's last error must be the fork error of
 * call (and tensor). Returns 1 when not. */
static int fork_check(gs_ctx *ctx, gs_status s, const char *call, const char *tname, pid_t parent,
                      int verbose) {
  const char *msg = gs_last_error(ctx);
  char host[256], want[512];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  snprintf(want, sizeof want,
           "rank %d (host %s): this gradsync context was made by process %d before a fork; "
           "process %d (a forked child) cannot use it: call gradsync only from the process that "
           "called gs_init",
           g_rank, host, (int)parent, (int)getpid());
  int bad = s != GS_ERR_FORKED || !strstr(msg, want) || strncmp(msg, call, strlen(call)) != 0;
  if (tname) {
    char t[200];
    snprintf(t, sizeof t, "(tensor '%s')", tname);
    bad |= !strstr(msg, t);
  }
  if (verbose || bad)
    printf("fork-child: %s%s: %s: %s\n", bad ? "FAIL: " : "", call, wu_status_name(s), msg);
  return bad;
}

static void fork_child(gs_ctx *ctx, gs_handle *pending, gs_handle *done, const float *done_buf,
                       pid_t parent, int verbose) {
  alarm(60); /* hang guard: a call that hangs kills the child, the parent sees it */
  int bad = 0;
  float x[4] = {1, 2, 3, 4};
  gs_handle *h = NULL;
  bad |=
      fork_check(ctx, gs_allreduce_async(ctx, "fork/child", x, x, 4, GS_FLOAT32, GS_SUM, NULL, &h),
                 "gs_allreduce", "fork/child", parent, verbose);
  bad |= h != NULL;
  bad |= fork_check(ctx, gs_wait(pending, -1), "gs_wait", "fork/inflight", parent, verbose);
  int d = 1;
  bad |= fork_check(ctx, gs_test(pending, &d), "gs_test", "fork/inflight", parent, verbose);
  bad |= d != 0;
  size_t idx = 7;
  bad |= fork_check(ctx, gs_wait_any(&pending, 1, 1000, &idx), "gs_wait_any", "fork/inflight",
                    parent, verbose);
  bad |= idx != 7;
  bad |= fork_check(ctx, gs_barrier(ctx), "gs_barrier", NULL, parent, verbose);
  bad |= fork_check(ctx, gs_join(ctx, NULL), "gs_join", NULL, parent, verbose);
  bad |= fork_check(ctx, gs_register_local(ctx, "fork/local"), "gs_register_local", "fork/local",
                    parent, verbose);
  bad |= fork_check(ctx, gs_kv_set(ctx, "fork/key", "v", 1), "gs_kv_set", NULL, parent, verbose);
  gs_stats st;
  gs_stats_init(&st);
  bad |= fork_check(ctx, gs_get_stats(ctx, &st), "gs_get_stats", NULL, parent, verbose);
  /* completed before the fork: readable, as after gs_shutdown */
  gs_status s = gs_wait(done, -1);
  if (s != GS_OK || done_buf[0] != fork_expect(99, 0)) {
    printf("fork-child: FAIL: gs_wait on the op completed before the fork: %s, value %g\n",
           wu_status_name(s), done_buf[0]);
    bad = 1;
  } else if (verbose) {
    printf("fork-child: gs_wait on the op completed before the fork: GS_OK, values ok\n");
  }
  bad |= fork_check(ctx, gs_shutdown(ctx), "gs_shutdown", NULL, parent, verbose);
  fflush(stdout);
  _exit(bad ? 1 : 0); /* the parent's atexit handlers are not the child's */
}

typedef struct fork_hammer {
  gs_ctx *ctx;
  gs_handle *h;
  atomic_int stop;
  gs_status wait_status;
} fork_hammer;

static void *fork_waiter_main(void *arg) {
  fork_hammer *f = arg;
  f->wait_status = gs_wait(f->h, -1); /* inside a wait when rank 0 forks */
  return NULL;
}

static void *fork_locker_main(void *arg) {
  fork_hammer *f = arg;
  while (!atomic_load(&f->stop)) { /* takes ctx->mu over and over */
    int d;
    gs_test(f->h, &d);
    gs_stats st;
    gs_stats_init(&st);
    gs_get_stats(f->ctx, &st);
  }
  return NULL;
}

static int mode_fork(gs_ctx *ctx, int steps) {
  const char *dir = getenv("GS_TEST_DIR");
  if (!dir || !*dir) wu_die("GS_TEST_DIR is not set");
  char mark[600];
  snprintf(mark, sizeof mark, "%s/fork-children-done", dir);
  float buf[FORK_N], done_buf[FORK_N], inflight[FORK_N];
  for (int s = 0; s < steps; s++) fork_step(ctx, "fork/step", s, buf, NULL);
  gs_handle *done = NULL;
  fork_step(ctx, "fork/done", 99, done_buf, &done);

  float send[FORK_N];
  for (size_t j = 0; j < FORK_N; j++) send[j] = (float)((g_rank + 1) * 101) + (float)j;
  gs_handle *pending = NULL;
  if (g_rank != 0) { /* the op stays pending on rank 0 until its children are done */
    for (int i = 0; access(mark, F_OK) != 0; i++) {
      if (i == 6000) wu_die("%s did not appear within 60 s", mark);
      sleep_ms(10);
    }
    submitted_or_die(ctx,
                     gs_allreduce_async(ctx, "fork/inflight", send, inflight, FORK_N, GS_FLOAT32,
                                        GS_SUM, NULL, &pending),
                     "fork/inflight", "gs_allreduce_async");
  } else {
    submitted_or_die(ctx,
                     gs_allreduce_async(ctx, "fork/inflight", send, inflight, FORK_N, GS_FLOAT32,
                                        GS_SUM, NULL, &pending),
                     "fork/inflight", "gs_allreduce_async");
    fork_hammer f = {.ctx = ctx, .h = pending};
    atomic_init(&f.stop, 0);
    pthread_t waiter, locker;
    if (pthread_create(&waiter, NULL, fork_waiter_main, &f) != 0) wu_die("pthread_create");
    sleep_ms(50); /* into its wait (not needed for the checks: the children's calls
                     must fail however the parent's threads stand) */
    if (pthread_create(&locker, NULL, fork_locker_main, &f) != 0) wu_die("pthread_create");
    pid_t parent = getpid();
    for (int c = 0; c < FORK_CHILDREN; c++) {
      pid_t pid = fork();
      if (pid < 0) wu_die("fork: %s", strerror(errno));
      if (pid == 0) fork_child(ctx, pending, done, done_buf, parent, c == 0);
      char what[32];
      snprintf(what, sizeof what, "fork child %d", c);
      int status = wait_child_bounded(pid, what);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        wu_die("fork child %d (pid %d) failed: %s %d", c, (int)pid,
               WIFSIGNALED(status) ? "signal" : "exit status",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    atomic_store(&f.stop, 1);
    pthread_join(locker, NULL);
    printf("fork: rank 0: %d children got GS_ERR_FORKED from every call and exited 0\n",
           FORK_CHILDREN);
    FILE *m = fopen(mark, "w");
    if (!m) wu_die("cannot create %s: %s", mark, strerror(errno));
    fclose(m);
    pthread_join(waiter, NULL);
    if (f.wait_status != GS_OK)
      wu_die("tensor 'fork/inflight': the parent's gs_wait: %s: %s", wu_status_name(f.wait_status),
             gs_handle_error(pending));
  }
  wait_ok(pending, "fork/inflight");
  for (size_t j = 0; j < FORK_N; j++) {
    float want = 0;
    for (int r = 0; r < g_size; r++) want += (float)((r + 1) * 101) + (float)j;
    if (inflight[j] != want)
      wu_die("tensor 'fork/inflight': element %zu: got %g, expected %g", j, inflight[j], want);
  }
  gs_handle_free(pending);
  gs_handle_free(done);
  /* rank 1 submitted the op after it saw the mark: no one reads it again */
  if (g_rank == 0) unlink(mark);
  for (int s = 0; s < steps; s++) fork_step(ctx, "fork/step", steps + s, buf, NULL);
  printf("fork: rank %d: %d steps after the fork ok\n", g_rank, steps);
  printf("fork: passed (rank %d of %d)\n", g_rank, g_size);
  return 0;
}

/* ---- mode: fork-init -------------------------------------------------------------- */

/* gs_init in a forked child, as a user would: a process that never called
 * gs_init forks and the child joins (fresh); a process that left its job
 * (gs_shutdown) forks and the child joins the next one (after-shutdown);
 * a process with a live context forks and the child calls gs_init for a
 * job of its own at $GS_TEST_COORD2 as rank 0 of 1 (live). */

/* In the child: gs_init, one allreduce checked against its sum, gs_shutdown.
 * Exit 0, or 3 when gs_init failed (its status and text printed). */
static int fork_init_child(const char *tag) {
  alarm(60); /* a hang ends the child: the parent reports the signal */
  pid_t me = getpid();
  gs_ctx *ctx = NULL;
  gs_status s = gs_init(NULL, &ctx);
  if (s != GS_OK) {
    printf("fork-init-child: pid %d: gs_init: %s: %s\n", (int)me, wu_status_name(s),
           gs_last_error(NULL));
    if (ctx != NULL) printf("fork-init-child: FAIL: context not NULL after a failed gs_init\n");
    return 3;
  }
  int r = gs_rank(ctx), n = gs_size(ctx);
  float x[FORK_N], y[FORK_N];
  for (size_t j = 0; j < FORK_N; j++) x[j] = (float)(r + 1) * 10.0f + (float)j;
  char name[64];
  snprintf(name, sizeof name, "fork-init/%s", tag);
  gs_handle *h = NULL;
  s = gs_allreduce_async(ctx, name, x, y, FORK_N, GS_FLOAT32, GS_SUM, NULL, &h);
  if (s != GS_OK) {
    printf("fork-init-child: FAIL: gs_allreduce_async: %s: %s\n", wu_status_name(s),
           gs_last_error(ctx));
    return 1;
  }
  s = gs_wait(h, WAIT_MS);
  if (s != GS_OK) {
    printf("fork-init-child: FAIL: gs_wait: %s: %s\n", wu_status_name(s), gs_handle_error(h));
    return 1;
  }
  for (size_t j = 0; j < FORK_N; j++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += (float)(q + 1) * 10.0f + (float)j;
    if (y[j] != want) {
      printf("fork-init-child: FAIL: tensor '%s' element %zu: got %g, expected %g\n", name, j, y[j],
             want);
      return 1;
    }
  }
  gs_handle_free(h);
  s = gs_shutdown(ctx);
  if (s != GS_OK) {
    printf("fork-init-child: FAIL: gs_shutdown: %s: %s\n", wu_status_name(s), gs_last_error(NULL));
    return 1;
  }
  printf("fork-init-child: pid %d: rank %d of %d: joined, tensor '%s' summed right, left\n",
         (int)me, r, n, name);
  return 0;
}

/* Forks a child that runs fork_init_child(tag) after setting the
 * environment entries of env ("NAME=value", NULL-terminated, may be NULL);
 * returns its exit code, or dies when it was killed or did not end. */
static int fork_init_run_child(const char *tag, char *const env[]) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) wu_die("fork: %s", strerror(errno));
  if (pid == 0) {
    for (size_t i = 0; env && env[i]; i++) putenv(env[i]);
    int code = fork_init_child(tag);
    fflush(stdout);
    _exit(code);
  }
  char what[64];
  snprintf(what, sizeof what, "fork-init: child (%s)", tag);
  int status = wait_child_bounded(pid, what);
  if (WIFSIGNALED(status))
    wu_die("fork-init: child %d (%s) was killed by signal %d (a hang ends it with SIGALRM)",
           (int)pid, tag, WTERMSIG(status));
  printf("fork-init: rank %d: child %d (%s) exited %d\n", g_rank, (int)pid, tag,
         WEXITSTATUS(status));
  return WEXITSTATUS(status);
}

static int mode_fork_init(const char *which) {
  if (strcmp(which, "fresh") == 0) {
    if (fork_init_run_child("fresh", NULL) != 0) wu_die("fork-init: the child failed");
  } else if (strcmp(which, "after-shutdown") == 0) {
    gs_ctx *ctx = join_or_die();
    one_allreduce(ctx, "fork-init/parent");
    shutdown_or_die(ctx);
    if (fork_init_run_child("after-shutdown", NULL) != 0) wu_die("fork-init: the child failed");
  } else if (strcmp(which, "live") == 0) {
    const char *coord2 = getenv("GS_TEST_COORD2");
    if (!coord2 || !*coord2) wu_die("GS_TEST_COORD2 is not set");
    gs_ctx *ctx = join_or_die();
    one_allreduce(ctx, "fork-init/parent-before");
    static char coord[300];
    snprintf(coord, sizeof coord, "GRADSYNC_COORDINATOR=%s", coord2);
    char *env[] = {coord,
                   "GRADSYNC_RANK=0",
                   "GRADSYNC_SIZE=1",
                   "GRADSYNC_LOCAL_RANK=0",
                   "GRADSYNC_LOCAL_SIZE=1",
                   NULL};
    int code = fork_init_run_child("live", env); /* the driver checks the child's text */
    printf("fork-init: rank %d: the child of a live context: exit %d\n", g_rank, code);
    one_allreduce(ctx, "fork-init/parent-after"); /* the parent's job goes on */
    shutdown_or_die(ctx);
  } else {
    usage();
  }
  printf("fork-init: passed (rank %d, %s)\n", g_rank, which);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) usage();
  const char *mode = argv[1];
  const char *env_rank = getenv("GRADSYNC_RANK");
  g_rank = env_rank ? atoi(env_rank) : -1;

  if (strcmp(mode, "join") == 0) {
    gs_ctx *ctx = NULL;
    gs_status s = gs_init(NULL, &ctx);
    if (s != GS_OK) {
      printf("join: gs_init failed: %s: %s\n", wu_status_name(s), gs_last_error(NULL));
      if (ctx != NULL) printf("join: FAIL: context not NULL after a failed gs_init\n");
      return 3;
    }
    g_rank = gs_rank(ctx);
    g_size = gs_size(ctx);
    printf("join: ok (rank %d of %d)\n", g_rank, g_size);
    shutdown_or_die(ctx);
    return 0;
  }

  if (strcmp(mode, "fork-init") == 0) {
    if (argc != 3) usage();
    return mode_fork_init(argv[2]);
  }

  if (strcmp(mode, "exit-code") == 0) {
    if (argc != 4) usage();
    if (g_rank == atoi(argv[2])) {
      printf("exit-code: rank %d exits with %d before joining\n", g_rank, atoi(argv[3]));
      return atoi(argv[3]);
    }
    gs_ctx *ctx = join_or_die();
    one_allreduce(ctx, "exit-code/tensor"); /* fails once the launcher stops the job */
    shutdown_or_die(ctx);
    return 0;
  }

  int rc;
  if (strcmp(mode, "ops") == 0) {
    int rounds = argc > 2 ? atoi(argv[2]) : 2;
    if (rounds < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_ops(ctx, rounds);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "random-order") == 0) {
    unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 1;
    gs_ctx *ctx = join_or_die();
    rc = mode_random_order(ctx, seed);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "mismatch") == 0) {
    gs_ctx *ctx = join_or_die();
    rc = mode_mismatch(ctx);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "hold") == 0) {
    if (argc != 3) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_hold(ctx, atol(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "hold-file") == 0) {
    if (argc != 3) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_hold_file(ctx, argv[2]);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "mismatch-all") == 0) {
    gs_ctx *ctx = join_or_die();
    rc = mode_mismatch_all(ctx);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "fusion") == 0) {
    if (argc != 5 || atoi(argv[2]) < 1 || atol(argv[3]) < 1 || atoi(argv[4]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_fusion(ctx, (unsigned)atoi(argv[2]), (size_t)atol(argv[3]), (unsigned)atoi(argv[4]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "workload") == 0) {
    if (argc != 4 || atoi(argv[3]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_workload(ctx, argv[2], (unsigned)atoi(argv[3]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "allgather") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_allgather(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "bcast-barrier") == 0) {
    if (argc != 3) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_bcast_barrier(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "grouped") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_grouped(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "join-steps") == 0) {
    if (argc != 3 || atoi(argv[2]) < 3) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_join_steps(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "duplicate") == 0) {
    gs_ctx *ctx = join_or_die();
    rc = mode_duplicate(ctx);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "model-diff") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_model_diff(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "early-leave") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_early_leave(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "allgather-overflow") == 0) {
    gs_ctx *ctx = join_or_die();
    rc = mode_allgather_overflow(ctx);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "kv") == 0) {
    gs_ctx *ctx = join_or_die();
    rc = mode_kv(ctx);
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "fork") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_fork(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else if (strcmp(mode, "pending-limit") == 0) {
    if (argc != 3 || atoi(argv[2]) < 1) usage();
    gs_ctx *ctx = join_or_die();
    rc = mode_pending_limit(ctx, atoi(argv[2]));
    shutdown_or_die(ctx);
  } else {
    usage();
    rc = 2;
  }
  return rc;
}
