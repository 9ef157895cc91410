/* gs-models-worker: a real worker process for the tests of model-parallel
 * (local) tensors, compression, scaling, reduce ops by name, alltoall and
 * reducescatter (test_models.c).
 *
 * It uses only the public API (gradsync.h) and is configured by the
 * environment as a training process would be. Each mode runs one scenario,
 * checks every value and error text against a reference computed locally
 * (every rank can generate every other rank's data), prints the errors it
 * saw ("<mode>: <what>: <status>: <message>") and one summary line on
 * stdout, and exits 0 when every check passed, 1 otherwise. A failed check
 * does not stop the scenario (all ranks go on alike, so the other checks
 * still run and say what works); a failure that would leave the ranks out
 * of step ends the process at once.
 *
 * Modes:
 *   towers [scale|noscale-env|noscale-opt]
 *               a model with a tower per rank: tower names registered local
 *               (one name on every rank, one name per rank), shared layers
 *               averaged; local ops complete at once with raw / size
 *               (scale) or raw (noscale-env: GRADSYNC_SCALE_LOCAL=0 set by
 *               the driver; noscale-opt: gs_options.scale_local = 0 while
 *               the environment says 1); the stats count local ops and never
 *               send them; gs_unregister_local makes a name global again
 *   conflict    rank 0 registers 'w' local, the others submit it: they fail
 *               at once with GS_ERR_MISMATCH naming rank 0 (the submitters
 *               accumulate), both when the registration comes first and
 *               when it comes last; registering a name in flight; the job
 *               goes on
 *   compress    fp16/bf16 wire compression: error within the rounding
 *               bound, results representable in the wire type; one rank
 *               compressing and another not is a dtype mismatch; invalid
 *               compression settings
 *   scale       prescale/postscale by powers of two are exact (float32,
 *               float64, int32); gradient_predivide_factor 4 with average
 *               equals the plain average; non-finite and mismatched scales
 *   ops         gs_reduce_op_from_string for all six names and bad input,
 *               each op used in an allreduce, adasum unsupported
 *   alltoall    uneven splits (0 included), equal parts, a rank receiving
 *               nothing, and invalid splits
 *   reducescatter
 *               sum and average over uneven, even and fewer-than-ranks rows
 *               (float32, float64, int32); invalid ops and shapes
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
#include <time.h>
#include <unistd.h>

#define WAIT_MS 60000   /* one op never takes this long on a healthy job */
#define QUICK_MS 10000  /* the longest wait for an error that must come at once */
#define AT_ONCE_MS 5000 /* "at once": the driver sets deadlock detection to 60 s */
#define MAX_RANKS 16

static unsigned g_checks = 0;
static unsigned g_failed = 0;

/* Counts a check; a failed one is printed (and fails the mode at the end)
 * but the scenario goes on. Returns ok. */
static int check(int ok, const char *fmt, ...) {
  g_checks++;
  if (ok) return 1;
  g_failed++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "rank %d: FAIL: %s: ", g_rank, g_mode);
  vfprintf(stdout, fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
  return 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* ---- deterministic data --------------------------------------------------- */

/* An integer in [-64, 64]: sums over ranks are exact in every dtype, in any
 * order. */
static int ival(int r, unsigned id, int step, size_t i) {
  return (int)(wu_hash4((uint64_t)r + 1, id, (uint64_t)step, i) % 129) - 64;
}

/* A float32 in +-[0.01, 4] with a full mantissa: rounding to 16 bits loses
 * something for almost every value. */
static float fval(int r, unsigned id, size_t i) {
  uint64_t h = wu_hash4((uint64_t)r + 1, id, 77, i);
  double u = (double)(h >> 11) / 9007199254740992.0;
  double v = 0.01 + 3.99 * u;
  return (float)((h & 1) ? -v : v);
}

/* ---- common helpers ------------------------------------------------------- */

static void barrier(gs_ctx *ctx) {
  gs_status s = gs_barrier(ctx);
  if (s != GS_OK) wu_die("gs_barrier: %s: %s", wu_status_name(s), gs_last_error(ctx));
}

static gs_stats stats(gs_ctx *ctx) {
  gs_stats st;
  gs_stats_init(&st);
  wu_must(gs_get_stats(ctx, &st), "gs_get_stats", "-");
  return st;
}

/* Waits for h; a failure is a failed check (the text says which tensor). */
static int wait_ok(gs_handle *h, const char *name) {
  gs_status s = gs_wait(h, WAIT_MS);
  return check(s == GS_OK, "tensor '%s': gs_wait: %s: %s", name, wu_status_name(s),
               gs_handle_error(h));
}

/* "[0]", "[1,2]", "[1-3]": the coordinator's way of listing ranks. */
static void format_ranks(int from, int to, char *buf, size_t cap) {
  if (to - from >= 2)
    snprintf(buf, cap, "[%d-%d]", from, to);
  else if (to > from)
    snprintf(buf, cap, "[%d,%d]", from, to);
  else
    snprintf(buf, cap, "[%d]", from);
}

/* A failed call or op: status want and a message containing each of the
 * NULL-terminated texts. Prints "<mode>: <what>: <status>: <message>". */
static void expect_error(const char *what, gs_status got, const char *msg, gs_status want, ...) {
  if (!msg) msg = "";
  printf("%s: %s: %s: %s\n", g_mode, what, wu_status_name(got), msg);
  check(got == want, "%s: got %s (%s), expected %s", what, wu_status_name(got), msg,
        wu_status_name(want));
  va_list ap;
  va_start(ap, want);
  for (const char *t = va_arg(ap, const char *); t; t = va_arg(ap, const char *))
    check(strstr(msg, t) != NULL, "%s: the message \"%s\" lacks \"%s\"", what, msg, t);
  va_end(ap);
}

/* Compares n float32 results bitwise with a reference; reports the first
 * difference. */
static void expect_f32(const char *name, const float *got, const float *want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (wu_f32_bits(got[i]) != wu_f32_bits(want[i]) && !bad++) first = i;
  check(!bad, "tensor '%s': %zu of %zu elements differ, first [%zu] = %.9g, expected %.9g", name,
        bad, n, first, bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0);
}

static void expect_f64(const char *name, const double *got, const double *want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i] && !bad++) first = i;
  check(!bad, "tensor '%s': %zu of %zu elements differ, first [%zu] = %.17g, expected %.17g", name,
        bad, n, first, bad ? got[first] : 0.0, bad ? want[first] : 0.0);
}

static void expect_i32(const char *name, const int32_t *got, const int32_t *want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i] && !bad++) first = i;
  check(!bad, "tensor '%s': %zu of %zu elements differ, first [%zu] = %d, expected %d", name, bad,
        n, first, bad ? got[first] : 0, bad ? want[first] : 0);
}

static void expect_i64(const char *name, const int64_t *got, const int64_t *want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i] && !bad++) first = i;
  check(!bad, "tensor '%s': %zu of %zu elements differ, first [%zu] = %lld, expected %lld", name,
        bad, n, first, bad ? (long long)got[first] : 0, bad ? (long long)want[first] : 0);
}

/* A blocking float32 allreduce (in place) that must succeed. */
static int allreduce_f32(gs_ctx *ctx, const char *name, float *buf, size_t n, gs_reduce_op op,
                         const gs_allreduce_opts *opts) {
  gs_handle *h = NULL;
  gs_status s = gs_allreduce_async(ctx, name, buf, buf, n, GS_FLOAT32, op, opts, &h);
  if (!check(s == GS_OK, "tensor '%s': gs_allreduce_async: %s: %s", name, wu_status_name(s),
             gs_last_error(ctx)))
    return 0;
  int ok = wait_ok(h, name);
  gs_handle_free(h);
  return ok;
}

/* The job still works: a sum over every rank of rank + 1. */
static void expect_job_goes_on(gs_ctx *ctx, const char *name) {
  float v[16], want[16];
  for (int i = 0; i < 16; i++) {
    v[i] = (float)(g_rank + 1 + i);
    want[i] = (float)(g_size * (g_size + 1) / 2 + g_size * i);
  }
  if (allreduce_f32(ctx, name, v, 16, GS_SUM, NULL)) expect_f32(name, v, want, 16);
}

/* ---- mode: towers ----------------------------------------------------------- */

/* One tensor of the model: shared (averaged over ranks) or a tower's (local). */
typedef struct tw_tensor {
  char name[48];
  size_t count;
  gs_dtype dtype;
  gs_reduce_op op;
  int local;
  int out_of_place;
} tw_tensor;

#define TW_STEPS 3

/* The model in the order backward produces its gradients: the shared
 * layers' interleaved with the tower's. "tower%d/head" exists on one rank
 * only (a name per rank), "tower/fc0/..." on every rank (one name, a
 * different tensor on each). */
static size_t tw_model(tw_tensor *t) {
  size_t n = 0;
  t[n++] = (tw_tensor){"fc2/weight", 4 * 64, GS_FLOAT32, GS_AVERAGE, 0, 0};
  t[n++] = (tw_tensor){"fc2/bias", 4, GS_FLOAT32, GS_AVERAGE, 0, 0};
  t[n++] = (tw_tensor){"fc1/weight", 64 * 32, GS_FLOAT32, GS_AVERAGE, 0, 1};
  t[n++] = (tw_tensor){"tower/fc0/weight", 32 * 16, GS_FLOAT32, GS_AVERAGE, 1, 0};
  t[n++] = (tw_tensor){"fc1/bias", 64, GS_FLOAT32, GS_AVERAGE, 0, 0};
  t[n++] = (tw_tensor){"tower/fc0/bias", 32, GS_FLOAT32, GS_SUM, 1, 0};
  t[n] = (tw_tensor){"", (size_t)(g_rank + 1) * 5, GS_FLOAT32, GS_AVERAGE, 1, 1};
  snprintf(t[n++].name, sizeof t[0].name, "tower%d/head", g_rank);
  t[n++] = (tw_tensor){"tower/fc0/scale", 8, GS_FLOAT64, GS_AVERAGE, 1, 1};
  t[n++] = (tw_tensor){"tower/fc0/count", 7, GS_INT32, GS_AVERAGE, 1, 0};
  return n;
}

static void tw_fill(const tw_tensor *t, unsigned id, int r, int step, void *buf) {
  for (size_t i = 0; i < t->count; i++) {
    int v = ival(r, id, step, i);
    if (t->dtype == GS_FLOAT32) ((float *)buf)[i] = (float)v;
    if (t->dtype == GS_FLOAT64) ((double *)buf)[i] = (double)v / 8.0; /* exact */
    if (t->dtype == GS_INT32) ((int32_t *)buf)[i] = v;
  }
}

/* The reference result of tensor id on this rank. */
static void tw_expect(const tw_tensor *t, unsigned id, int step, int scale_local, void *want) {
  if (t->local) {
    tw_fill(t, id, g_rank, step, want);
    if (t->op != GS_AVERAGE || !scale_local) return;
    for (size_t i = 0; i < t->count; i++) {
      if (t->dtype == GS_FLOAT32) ((float *)want)[i] /= (float)g_size;
      if (t->dtype == GS_FLOAT64) ((double *)want)[i] /= (double)g_size;
      if (t->dtype == GS_INT32) ((int32_t *)want)[i] /= g_size; /* truncates toward zero */
    }
    return;
  }
  for (size_t i = 0; i < t->count; i++) {
    int sum = 0;
    for (int r = 0; r < g_size; r++) sum += ival(r, id, step, i);
    ((float *)want)[i] = t->op == GS_AVERAGE ? (float)sum / (float)g_size : (float)sum;
  }
}

static void tw_compare(const tw_tensor *t, const void *got, const void *want) {
  if (t->dtype == GS_FLOAT32) expect_f32(t->name, got, want, t->count);
  if (t->dtype == GS_FLOAT64) expect_f64(t->name, got, want, t->count);
  if (t->dtype == GS_INT32) expect_i32(t->name, got, want, t->count);
}

static void tw_registration_checks(gs_ctx *ctx) {
  check(!gs_is_local(ctx, "tower/fc0/weight"), "gs_is_local before gs_register_local says 1");
  gs_status s = gs_register_local(ctx, "");
  expect_error("register an empty name", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "gs_register_local: the tensor name is empty", (const char *)NULL);
  s = gs_register_local(NULL, "x");
  expect_error("register without a context", s, gs_last_error(NULL), GS_ERR_INVALID_ARG,
               "gs_register_local: ctx is NULL", (const char *)NULL);
  wu_must(gs_register_local(ctx, "tmp/local"), "gs_register_local", "tmp/local");
  check(gs_is_local(ctx, "tmp/local"), "'tmp/local' is not local after gs_register_local");
  wu_must(gs_unregister_local(ctx, "tmp/local"), "gs_unregister_local", "tmp/local");
  check(!gs_is_local(ctx, "tmp/local"), "'tmp/local' is still local after gs_unregister_local");
  wu_must(gs_unregister_local(ctx, "never/registered"), "gs_unregister_local", "never/registered");
}

static int mode_towers(gs_ctx *ctx, int scale_local) {
  tw_tensor t[16];
  size_t n = tw_model(t), nlocal = 0;
  tw_registration_checks(ctx);
  for (size_t k = 0; k < n; k++) {
    if (!t[k].local) continue;
    nlocal++;
    wu_must(gs_register_local(ctx, t[k].name), "gs_register_local", t[k].name);
    /* Registering twice is harmless. */
    wu_must(gs_register_local(ctx, t[k].name), "gs_register_local (again)", t[k].name);
  }
  for (size_t k = 0; k < n; k++)
    check(gs_is_local(ctx, t[k].name) == t[k].local, "gs_is_local('%s') = %d, expected %d",
          t[k].name, gs_is_local(ctx, t[k].name), t[k].local);
  /* Every rank's registrations have reached the coordinator once the
   * barrier is through (they travel before the barrier's request). */
  barrier(ctx);
  gs_stats s0 = stats(ctx);

  void *send[16], *recv[16], *want[16];
  for (size_t k = 0; k < n; k++) {
    size_t bytes = t[k].count * gs_dtype_size(t[k].dtype);
    send[k] = wu_xcalloc(1, bytes);
    recv[k] = t[k].out_of_place ? wu_xcalloc(1, bytes) : send[k];
    want[k] = wu_xcalloc(1, bytes);
  }
  for (int step = 0; step < TW_STEPS; step++) {
    gs_handle *h[16] = {0};
    for (size_t k = 0; k < n; k++) {
      tw_fill(&t[k], (unsigned)k, g_rank, step, send[k]);
      gs_status s = gs_allreduce_async(ctx, t[k].name, send[k], recv[k], t[k].count, t[k].dtype,
                                       t[k].op, NULL, &h[k]);
      if (s != GS_OK)
        wu_die("tensor '%s': gs_allreduce_async: %s: %s", t[k].name, wu_status_name(s),
               gs_last_error(ctx));
      if (t[k].local) {
        /* A local op never waits for anybody: it is complete on return. */
        int done = 0;
        wu_must(gs_test(h[k], &done), "gs_test", t[k].name);
        if (!done)
          wu_die("tensor '%s' is registered local but its op was not complete on return from "
                 "gs_allreduce_async (was it sent to the coordinator?)",
                 t[k].name);
      }
    }
    for (size_t k = 0; k < n; k++) {
      if (wait_ok(h[k], t[k].name)) {
        tw_expect(&t[k], (unsigned)k, step, scale_local, want[k]);
        tw_compare(&t[k], recv[k], want[k]);
      }
      gs_handle_free(h[k]);
    }
    /* Out of place: the input is left as it was. */
    for (size_t k = 0; k < n; k++) {
      if (!t[k].out_of_place) continue;
      tw_fill(&t[k], (unsigned)k, g_rank, step, want[k]);
      check(memcmp(send[k], want[k], t[k].count * gs_dtype_size(t[k].dtype)) == 0,
            "tensor '%s': the send buffer changed (out of place)", t[k].name);
    }
  }
  gs_stats s1 = stats(ctx);
  uint64_t nshared = n - nlocal;
  /* A shared op reaches the coordinator as a request, or, in fast mode
   * (issue 14), the other ranks in a fast round; a local one neither. */
  uint64_t local_ops = s1.local_ops - s0.local_ops,
           sent = (s1.requests_sent - s0.requests_sent) + (s1.fast_tensors - s0.fast_tensors),
           tensors = s1.tensors - s0.tensors;
  check(local_ops == TW_STEPS * nlocal, "local_ops grew by %llu, expected %llu",
        (unsigned long long)local_ops, (unsigned long long)(TW_STEPS * nlocal));
  check(sent == TW_STEPS * nshared,
        "requests_sent + fast_tensors grew by %llu, expected %llu (the shared tensors only)",
        (unsigned long long)sent, (unsigned long long)(TW_STEPS * nshared));
  check(tensors == TW_STEPS * nshared, "tensors grew by %llu, expected %llu",
        (unsigned long long)tensors, (unsigned long long)(TW_STEPS * nshared));

  /* Unregistered on every rank (and the barrier past it), the name is a
   * global tensor again: averaged over ranks, one more request. */
  const char *unreg = "tower/fc0/weight";
  wu_must(gs_unregister_local(ctx, unreg), "gs_unregister_local", unreg);
  check(!gs_is_local(ctx, unreg), "'%s' is still local after gs_unregister_local", unreg);
  barrier(ctx);
  gs_stats s2 = stats(ctx);
  tw_tensor g = t[3];
  g.local = 0;
  size_t gk = 3;
  tw_fill(&g, (unsigned)gk, g_rank, 99, send[gk]);
  if (allreduce_f32(ctx, unreg, send[gk], g.count, GS_AVERAGE, NULL)) {
    tw_expect(&g, (unsigned)gk, 99, scale_local, want[gk]);
    tw_compare(&g, send[gk], want[gk]);
  }
  gs_stats s3 = stats(ctx);
  check(s3.local_ops == s2.local_ops, "'%s' counted as a local op after gs_unregister_local",
        unreg);
  check(s3.requests_sent - s2.requests_sent == 1,
        "'%s' after gs_unregister_local: requests_sent grew by %llu, expected 1", unreg,
        (unsigned long long)(s3.requests_sent - s2.requests_sent));
  for (size_t k = 0; k < n; k++) {
    if (recv[k] != send[k]) free(recv[k]);
    free(send[k]);
    free(want[k]);
  }
  printf("towers: local ops %llu, requests sent %llu for %d steps of %zu tensors (%zu local), "
         "scale_local %d (rank %d of %d)\n",
         (unsigned long long)local_ops, (unsigned long long)sent, TW_STEPS, n, nlocal, scale_local,
         g_rank, g_size);
  return 0;
}

/* ---- mode: conflict ----------------------------------------------------------- */

/* rank (>= 1) submits name, which rank 0 registered local: the op must fail
 * at once with the coordinator's text naming rank 0 and the submitters
 * [1..last]. t0: when the failure became due. */
static void cf_expect_refused(gs_handle *h, const char *name, int last, double t0) {
  gs_status s = gs_wait(h, QUICK_MS);
  double ms = now_ms() - t0;
  char subs[32], want[512], what[96];
  format_ranks(1, last, subs, sizeof subs);
  snprintf(want, sizeof want,
           "tensor '%s': registered local (gs_register_local) on ranks [0] but submitted for "
           "allreduce by ranks %s; a model-parallel tensor must be registered local on every rank "
           "that holds it and never submitted, or submitted by every rank",
           name, subs);
  snprintf(what, sizeof what, "submit '%s' registered local on rank 0", name);
  expect_error(what, s, gs_handle_error(h), GS_ERR_MISMATCH, want, (const char *)NULL);
  check(ms < AT_ONCE_MS, "'%s' failed after %.0f ms, expected at once (< %d ms)", name, ms,
        AT_ONCE_MS);
  printf("conflict: '%s' refused after %.0f ms (rank %d)\n", name, ms, g_rank);
}

static int mode_conflict(gs_ctx *ctx) {
  float x[4], w[4];
  for (int i = 0; i < 4; i++) x[i] = w[i] = (float)(8 * (g_rank + 1) + i);

  /* 1. The registration comes first; then rank 1 submits, then the others
   * one after the other: the submitters named accumulate. */
  if (g_rank == 0) wu_must(gs_register_local(ctx, "w"), "gs_register_local", "w");
  barrier(ctx);
  for (int r = 1; r < g_size; r++) {
    if (g_rank == r) {
      gs_handle *h = NULL;
      double t0 = now_ms();
      wu_must(gs_allreduce_async(ctx, "w", x, x, 4, GS_FLOAT32, GS_AVERAGE, NULL, &h),
              "gs_allreduce_async", "w");
      cf_expect_refused(h, "w", r, t0);
      gs_handle_free(h);
    }
    barrier(ctx);
  }
  /* Rank 0's own op on it is local: complete at once, scaled by 1/size. */
  if (g_rank == 0) {
    gs_handle *h = NULL;
    wu_must(gs_allreduce_async(ctx, "w", w, w, 4, GS_FLOAT32, GS_AVERAGE, NULL, &h),
            "gs_allreduce_async", "w");
    int done = 0;
    wu_must(gs_test(h, &done), "gs_test", "w");
    check(done, "rank 0's op on its local 'w' was not complete at once");
    if (wait_ok(h, "w")) {
      float want[4];
      for (int i = 0; i < 4; i++) want[i] = (float)(8 + i) / (float)g_size;
      expect_f32("w", w, want, 4);
    }
    gs_handle_free(h);
  }

  /* 2. The submissions come first (they wait on the coordinator), then rank
   * 0 registers the name: every submitter fails at once. */
  gs_handle *h2 = NULL;
  if (g_rank > 0)
    wu_must(gs_allreduce_async(ctx, "w2", x, x, 4, GS_FLOAT32, GS_SUM, NULL, &h2),
            "gs_allreduce_async", "w2");
  barrier(ctx); /* the submissions reached the coordinator before the barrier's requests */
  double t0 = now_ms();
  if (g_rank == 0) wu_must(gs_register_local(ctx, "w2"), "gs_register_local", "w2");
  if (g_rank > 0) cf_expect_refused(h2, "w2", g_size - 1, t0);
  gs_handle_free(h2);
  barrier(ctx);

  /* 3. A name with an op in flight cannot be registered. Rank 0 submits
   * first; the others only after the barrier, so it is surely in flight. */
  gs_handle *h3 = NULL;
  float y[3] = {1, 2, 3};
  if (g_rank == 0) {
    wu_must(gs_allreduce_async(ctx, "inflight", y, y, 3, GS_FLOAT32, GS_SUM, NULL, &h3),
            "gs_allreduce_async", "inflight");
    gs_status s = gs_register_local(ctx, "inflight");
    expect_error("register a name in flight", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
                 "gs_register_local: tensor 'inflight' has an op in flight on rank 0; register it "
                 "before submitting it",
                 (const char *)NULL);
    check(!gs_is_local(ctx, "inflight"), "'inflight' became local after a refused registration");
  }
  barrier(ctx);
  if (g_rank > 0)
    wu_must(gs_allreduce_async(ctx, "inflight", y, y, 3, GS_FLOAT32, GS_SUM, NULL, &h3),
            "gs_allreduce_async", "inflight");
  if (wait_ok(h3, "inflight")) {
    float want[3] = {(float)g_size, (float)(2 * g_size), (float)(3 * g_size)};
    expect_f32("inflight", y, want, 3);
  }
  gs_handle_free(h3);

  /* 4. The job goes on with other tensors. */
  expect_job_goes_on(ctx, "after/conflict");
  return 0;
}

/* ---- mode: compress -------------------------------------------------------- */

#define CP_COUNT 1000

typedef struct cp_case {
  const char *name;
  gs_compression c;
  gs_reduce_op op;
  int out_of_place;
} cp_case;

/* Relative error of one rounding to the wire type (the figure the brief
 * of the feature gives: twice the unit roundoff). */
static double cp_unit(gs_compression c) {
  return c == GS_COMPRESS_FP16 ? 0x1p-10 : 0x1p-7;
}

/* Checks one compressed result: within (size + 1) roundings of the sum of
 * magnitudes (inputs rounded, partial sums, the average's division), every
 * value representable in the wire type, and something actually lost. */
static void cp_check(const cp_case *c, unsigned id, const float *got) {
  double u = cp_unit(c->c), worst = 0.0;
  size_t bad = 0, first = 0, lossy = 0, unrepresentable = 0;
  uint32_t low = c->c == GS_COMPRESS_FP16 ? 0x1fffu : 0xffffu;
  for (size_t i = 0; i < CP_COUNT; i++) {
    double sum = 0.0, mag = 0.0;
    for (int r = 0; r < g_size; r++) {
      double v = fval(r, id, i);
      sum += v;
      mag += fabs(v);
    }
    double exact = c->op == GS_AVERAGE ? sum / g_size : sum;
    double bound = (g_size + 1) * u * mag / (c->op == GS_AVERAGE ? g_size : 1);
    double err = fabs((double)got[i] - exact);
    if (err > bound && !bad++) first = i;
    if (bound > 0 && err / bound > worst) worst = err / bound;
    if ((float)exact != got[i]) lossy++;
    /* fp16 normals have 10 mantissa bits, bf16 7: the float32's low bits are
     * zero (fp16 subnormals, below 2^-14, have even fewer). */
    if (wu_f32_bits(got[i]) & low) unrepresentable++;
  }
  check(!bad, "tensor '%s': %zu of %d elements outside the rounding bound, first [%zu] = %.9g",
        c->name, bad, CP_COUNT, first, bad ? (double)got[first] : 0.0);
  check(!unrepresentable,
        "tensor '%s': %zu of %d results are not representable in the wire type (was it "
        "compressed?)",
        c->name, unrepresentable, CP_COUNT);
  check(lossy > CP_COUNT / 2,
        "tensor '%s': only %zu of %d results differ from the exact sum rounded to float32 (was "
        "it compressed?)",
        c->name, lossy, CP_COUNT);
  printf("compress: '%s' worst error %.3f of the bound, %zu of %d values rounded (rank %d)\n",
         c->name, worst, lossy, CP_COUNT, g_rank);
}

static int mode_compress(gs_ctx *ctx) {
  static const cp_case cases[] = {
      {"c/fp16/sum", GS_COMPRESS_FP16, GS_SUM, 1},
      {"c/fp16/avg", GS_COMPRESS_FP16, GS_AVERAGE, 0},
      {"c/bf16/sum", GS_COMPRESS_BF16, GS_SUM, 0},
      {"c/bf16/avg", GS_COMPRESS_BF16, GS_AVERAGE, 1},
  };
  enum { NC = sizeof cases / sizeof cases[0] };
  float *send[NC], *recv[NC];
  gs_handle *h[NC];
  /* All submitted before any wait, so they may travel fused. */
  for (size_t k = 0; k < NC; k++) {
    send[k] = wu_xcalloc(CP_COUNT, sizeof(float));
    recv[k] = cases[k].out_of_place ? wu_xcalloc(CP_COUNT, sizeof(float)) : send[k];
    for (size_t i = 0; i < CP_COUNT; i++) send[k][i] = fval(g_rank, (unsigned)k, i);
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts), .compression = cases[k].c};
    wu_must(gs_allreduce_async(ctx, cases[k].name, send[k], recv[k], CP_COUNT, GS_FLOAT32,
                               cases[k].op, &o, &h[k]),
            "gs_allreduce_async", cases[k].name);
  }
  for (size_t k = 0; k < NC; k++) {
    if (wait_ok(h[k], cases[k].name)) cp_check(&cases[k], (unsigned)k, recv[k]);
    gs_handle_free(h[k]);
    if (cases[k].out_of_place) {
      size_t changed = 0;
      for (size_t i = 0; i < CP_COUNT; i++) changed += send[k][i] != fval(g_rank, (unsigned)k, i);
      check(!changed, "tensor '%s': %zu send elements changed (out of place)", cases[k].name,
            changed);
      free(recv[k]);
    }
    free(send[k]);
  }

  /* The wire dtype is part of the request: one rank compressing and the
   * others not (or differently) is a mismatch every rank is told about. */
  char others[32], want[256];
  format_ranks(1, g_size - 1, others, sizeof others);
  static const struct {
    const char *name;
    gs_compression others;
    const char *wire;
  } mixes[] = {{"mix/fp16-vs-none", GS_COMPRESS_NONE, "float32"},
               {"mix/fp16-vs-bf16", GS_COMPRESS_BF16, "bfloat16"}};
  for (size_t k = 0; k < sizeof mixes / sizeof mixes[0]; k++) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    gs_allreduce_opts o = {.struct_size = sizeof(gs_allreduce_opts),
                           .compression = g_rank == 0 ? GS_COMPRESS_FP16 : mixes[k].others};
    gs_handle *hm = NULL;
    wu_must(gs_allreduce_async(ctx, mixes[k].name, v, v, 6, GS_FLOAT32, GS_SUM, &o, &hm),
            "gs_allreduce_async", mixes[k].name);
    gs_status s = gs_wait(hm, QUICK_MS);
    snprintf(want, sizeof want,
             "tensor '%s': mismatched data types: ranks [0] sent float16, ranks %s sent %s",
             mixes[k].name, others, mixes[k].wire);
    expect_error(mixes[k].name, s, gs_handle_error(hm), GS_ERR_MISMATCH, want, (const char *)NULL);
    gs_handle_free(hm);
  }

  /* Invalid settings, refused at the call. */
  double d[2] = {1, 2};
  gs_allreduce_opts o16 = {.struct_size = sizeof(gs_allreduce_opts),
                           .compression = GS_COMPRESS_FP16};
  gs_handle *hx = NULL;
  gs_status s = gs_allreduce_async(ctx, "c/float64", d, d, 2, GS_FLOAT64, GS_SUM, &o16, &hx);
  expect_error("compress float64", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'c/float64': compression 1 needs a float32 tensor and one of "
               "GS_COMPRESS_NONE, GS_COMPRESS_FP16, GS_COMPRESS_BF16 (dtype is float64)",
               (const char *)NULL);
  check(hx == NULL, "a refused call returned a handle");
  float f[2] = {1, 2};
  gs_allreduce_opts o9 = {.struct_size = sizeof(gs_allreduce_opts),
                          .compression = (gs_compression)9};
  s = gs_allreduce_async(ctx, "c/unknown", f, f, 2, GS_FLOAT32, GS_SUM, &o9, &hx);
  expect_error("compression 9", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'c/unknown': compression 9 needs a float32 tensor and one of "
               "GS_COMPRESS_NONE, GS_COMPRESS_FP16, GS_COMPRESS_BF16",
               (const char *)NULL);

  expect_job_goes_on(ctx, "after/compress");
  return 0;
}

/* ---- mode: scale ---------------------------------------------------------- */

#define SC_COUNT 257

static int mode_scale(gs_ctx *ctx) {
  float a[SC_COUNT], b[SC_COUNT], c[SC_COUNT], want[SC_COUNT];
  double d[SC_COUNT], dwant[SC_COUNT];
  int32_t n[SC_COUNT], nwant[SC_COUNT];
  int sum[SC_COUNT];
  for (size_t i = 0; i < SC_COUNT; i++) {
    sum[i] = 0;
    for (int r = 0; r < g_size; r++) sum[i] += ival(r, 1, 0, i);
  }
  /* Powers of two scale exactly: the result is the exact sum, scaled. */
  for (size_t i = 0; i < SC_COUNT; i++) a[i] = (float)ival(g_rank, 1, 0, i);
  gs_allreduce_opts o1 = {
      .struct_size = sizeof(gs_allreduce_opts), .prescale = 0.25, .postscale = 8};
  if (allreduce_f32(ctx, "s/pre-post/sum", a, SC_COUNT, GS_SUM, &o1)) {
    for (size_t i = 0; i < SC_COUNT; i++) want[i] = (float)(2 * sum[i]);
    expect_f32("s/pre-post/sum", a, want, SC_COUNT);
  }
  /* With an average: the exact (prescaled) sum divided by size in float32,
   * then postscaled. */
  for (size_t i = 0; i < SC_COUNT; i++) a[i] = (float)ival(g_rank, 1, 0, i);
  gs_allreduce_opts o2 = {
      .struct_size = sizeof(gs_allreduce_opts), .prescale = 0.5, .postscale = 4};
  if (allreduce_f32(ctx, "s/pre-post/avg", a, SC_COUNT, GS_AVERAGE, &o2)) {
    for (size_t i = 0; i < SC_COUNT; i++) want[i] = (0.5f * (float)sum[i]) / (float)g_size * 4.0f;
    expect_f32("s/pre-post/avg", a, want, SC_COUNT);
  }
  {
    gs_handle *h = NULL;
    for (size_t i = 0; i < SC_COUNT; i++) d[i] = ival(g_rank, 1, 0, i) / 16.0;
    gs_allreduce_opts o = {
        .struct_size = sizeof(gs_allreduce_opts), .prescale = 2, .postscale = 0.125};
    wu_must(gs_allreduce_async(ctx, "s/float64", d, d, SC_COUNT, GS_FLOAT64, GS_SUM, &o, &h),
            "gs_allreduce_async", "s/float64");
    if (wait_ok(h, "s/float64")) {
      for (size_t i = 0; i < SC_COUNT; i++) dwant[i] = sum[i] / 64.0;
      expect_f64("s/float64", d, dwant, SC_COUNT);
    }
    gs_handle_free(h);
  }
  {
    gs_handle *h = NULL;
    for (size_t i = 0; i < SC_COUNT; i++) n[i] = ival(g_rank, 1, 0, i);
    gs_allreduce_opts o = {
        .struct_size = sizeof(gs_allreduce_opts), .prescale = 4, .postscale = 0.25};
    wu_must(gs_allreduce_async(ctx, "s/int32", n, n, SC_COUNT, GS_INT32, GS_SUM, &o, &h),
            "gs_allreduce_async", "s/int32");
    if (wait_ok(h, "s/int32")) {
      for (size_t i = 0; i < SC_COUNT; i++) nwant[i] = sum[i];
      expect_i32("s/int32", n, nwant, SC_COUNT);
    }
    gs_handle_free(h);
  }

  /* gradient_predivide_factor: prescale 1/f, postscale f; with an average
   * the same as the plain average, bit for bit (scaling by powers of two
   * commutes with rounding). With prescale 2 on top: twice it. */
  for (size_t i = 0; i < SC_COUNT; i++) a[i] = b[i] = c[i] = (float)ival(g_rank, 2, 0, i);
  gs_allreduce_opts op = {.struct_size = sizeof(gs_allreduce_opts), .gradient_predivide_factor = 4};
  gs_allreduce_opts op2 = {
      .struct_size = sizeof(gs_allreduce_opts), .gradient_predivide_factor = 4, .prescale = 2};
  int ok = allreduce_f32(ctx, "p/plain", a, SC_COUNT, GS_AVERAGE, NULL);
  ok &= allreduce_f32(ctx, "p/predivide", b, SC_COUNT, GS_AVERAGE, &op);
  ok &= allreduce_f32(ctx, "p/predivide+prescale", c, SC_COUNT, GS_AVERAGE, &op2);
  if (ok) {
    for (size_t i = 0; i < SC_COUNT; i++) {
      int s = 0;
      for (int r = 0; r < g_size; r++) s += ival(r, 2, 0, i);
      want[i] = (float)s / (float)g_size;
    }
    expect_f32("p/plain", a, want, SC_COUNT);
    expect_f32("p/predivide", b, a, SC_COUNT);
    for (size_t i = 0; i < SC_COUNT; i++) want[i] = 2.0f * a[i];
    expect_f32("p/predivide+prescale", c, want, SC_COUNT);
  }

  /* Non-finite scales are refused at the call. */
  gs_handle *hx = NULL;
  gs_allreduce_opts inf = {.struct_size = sizeof(gs_allreduce_opts), .prescale = INFINITY};
  gs_status s = gs_allreduce_async(ctx, "s/bad", a, a, 4, GS_FLOAT32, GS_SUM, &inf, &hx);
  expect_error("prescale inf", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 's/bad': prescale inf and postscale 1 must be finite numbers",
               (const char *)NULL);
  /* Different scales on different ranks: a mismatch every rank is told. */
  char others[32], want_text[256];
  format_ranks(1, g_size - 1, others, sizeof others);
  snprintf(want_text, sizeof want_text,
           "tensor 's/mismatch': mismatched prescale factors: ranks [0] sent 0.5, ranks %s sent 1",
           others);
  gs_allreduce_opts half = {.struct_size = sizeof(gs_allreduce_opts),
                            .prescale = g_rank == 0 ? 0.5 : 0};
  wu_must(gs_allreduce_async(ctx, "s/mismatch", a, a, 4, GS_FLOAT32, GS_SUM, &half, &hx),
          "gs_allreduce_async", "s/mismatch");
  s = gs_wait(hx, QUICK_MS);
  expect_error("prescale differs", s, gs_handle_error(hx), GS_ERR_MISMATCH, want_text,
               (const char *)NULL);
  gs_handle_free(hx);

  expect_job_goes_on(ctx, "after/scale");
  return 0;
}

/* ---- mode: ops ------------------------------------------------------------ */

static int mode_ops(gs_ctx *ctx) {
  static const char *const names[] = {"sum", "average", "min", "max", "product", "adasum"};
  static const gs_reduce_op ops[] = {GS_SUM, GS_AVERAGE, GS_MIN, GS_MAX, GS_PRODUCT, GS_ADASUM};
  for (size_t k = 0; k < 6; k++) {
    gs_reduce_op op = (gs_reduce_op)-1;
    gs_status s = gs_reduce_op_from_string(names[k], &op);
    check(s == GS_OK && op == ops[k], "gs_reduce_op_from_string(\"%s\") = %s, %d; expected %d",
          names[k], wu_status_name(s), (int)op, (int)ops[k]);
  }
  static const char *const bad[] = {"mean", "Sum", "", "sum "};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    gs_reduce_op op = GS_MAX;
    gs_status s = gs_reduce_op_from_string(bad[k], &op);
    char what[64], want[128];
    snprintf(what, sizeof what, "reduce op \"%s\"", bad[k]);
    snprintf(want, sizeof want, "unknown reduce op '%s'", bad[k]);
    expect_error(what, s, gs_last_error(ctx), GS_ERR_INVALID_ARG, want,
                 "valid names are sum, average, min, max, product, adasum", (const char *)NULL);
    check(op == GS_MAX, "a refused gs_reduce_op_from_string(\"%s\") changed *out", bad[k]);
  }
  gs_reduce_op op = GS_SUM;
  gs_status s = gs_reduce_op_from_string(NULL, &op);
  expect_error("reduce op NULL", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "valid names are sum, average, min, max, product, adasum", (const char *)NULL);
  s = gs_reduce_op_from_string("sum", NULL);
  expect_error("reduce op, out NULL", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "gs_reduce_op_from_string: out is NULL", (const char *)NULL);

  /* Each op by name, used: values 1..4, so products stay exact. */
  for (size_t k = 0; k < 5; k++) {
    wu_must(gs_reduce_op_from_string(names[k], &op), "gs_reduce_op_from_string", names[k]);
    float v[5], want[5];
    for (int i = 0; i < 5; i++) {
      v[i] = (float)((g_rank + i) % 4 + 1);
      double acc = op == GS_PRODUCT ? 1.0 : op == GS_MIN ? 1e9 : op == GS_MAX ? -1e9 : 0.0;
      for (int r = 0; r < g_size; r++) {
        double x = (double)((r + i) % 4 + 1);
        if (op == GS_SUM || op == GS_AVERAGE) acc += x;
        if (op == GS_MIN) acc = x < acc ? x : acc;
        if (op == GS_MAX) acc = x > acc ? x : acc;
        if (op == GS_PRODUCT) acc *= x;
      }
      want[i] = op == GS_AVERAGE ? (float)acc / (float)g_size : (float)acc;
    }
    char name[32];
    snprintf(name, sizeof name, "op/%s", names[k]);
    if (allreduce_f32(ctx, name, v, 5, op, NULL)) expect_f32(name, v, want, 5);
  }
  wu_must(gs_reduce_op_from_string("adasum", &op), "gs_reduce_op_from_string", "adasum");
  float v[2] = {1, 2};
  gs_handle *h = NULL;
  s = gs_allreduce_async(ctx, "op/adasum", v, v, 2, GS_FLOAT32, op, NULL, &h);
  expect_error("allreduce with adasum", s, gs_last_error(ctx), GS_ERR_UNSUPPORTED,
               "tensor 'op/adasum': the adasum reduce op is not supported yet", (const char *)NULL);
  if (h) gs_handle_free(h);
  expect_job_goes_on(ctx, "after/ops");
  return 0;
}

/* ---- mode: alltoall ------------------------------------------------------- */

#define A2A_COLS 3

/* What rank `from` sends to rank `to`, row `row`, column `col`: all four
 * can be read back from the value. */
static float a2a_value(int from, int to, int64_t row, int col) {
  return (float)(from * 100000 + to * 1000 + (int)row * 10 + col);
}

/* Runs one alltoall of float32 rows [*, A2A_COLS] where rank r sends
 * split(r, q) rows to rank q (split NULL: equal parts of `equal` rows), and
 * checks what this rank receives. */
static void a2a_run(gs_ctx *ctx, const char *name, int64_t (*split)(int r, int q), int64_t equal) {
  int64_t splits[MAX_RANKS], rows = 0;
  for (int q = 0; q < g_size; q++) rows += splits[q] = split ? split(g_rank, q) : equal;
  float *send = wu_xcalloc((size_t)rows * A2A_COLS, sizeof(float));
  for (int q = 0, at = 0; q < g_size; q++)
    for (int64_t k = 0; k < splits[q]; k++, at++)
      for (int c = 0; c < A2A_COLS; c++) send[at * A2A_COLS + c] = a2a_value(g_rank, q, k, c);
  int64_t shape[2] = {rows, A2A_COLS};
  gs_handle *h = NULL;
  gs_status s =
      gs_alltoall_async(ctx, name, send, shape, 2, GS_FLOAT32, split ? splits : NULL, NULL, &h);
  if (!check(s == GS_OK, "tensor '%s': gs_alltoall_async: %s: %s", name, wu_status_name(s),
             gs_last_error(ctx))) {
    free(send);
    return;
  }
  if (wait_ok(h, name)) {
    int64_t want_rows[MAX_RANKS], got_rows[MAX_RANKS], total = 0;
    for (int r = 0; r < g_size; r++) total += want_rows[r] = split ? split(r, g_rank) : equal;
    for (int r = 0; r < g_size; r++) got_rows[r] = -1;
    s = gs_alltoall_recv_splits(h, got_rows, (size_t)g_size);
    if (check(s == GS_OK, "tensor '%s': gs_alltoall_recv_splits: %s: %s", name, wu_status_name(s),
              gs_last_error(ctx)))
      expect_i64(name, got_rows, want_rows, (size_t)g_size);
    const void *data = NULL;
    size_t bytes = 0;
    s = gs_handle_result(h, &data, &bytes);
    if (check(s == GS_OK, "tensor '%s': gs_handle_result: %s: %s", name, wu_status_name(s),
              gs_last_error(ctx)) &&
        check(bytes == (size_t)total * A2A_COLS * sizeof(float),
              "tensor '%s': %zu result bytes, expected %lld rows of %d float32 (%zu bytes)", name,
              bytes, (long long)total, A2A_COLS, (size_t)total * A2A_COLS * sizeof(float))) {
      float *want = wu_xcalloc((size_t)total * A2A_COLS, sizeof(float));
      for (int r = 0, at = 0; r < g_size; r++)
        for (int64_t k = 0; k < want_rows[r]; k++, at++)
          for (int c = 0; c < A2A_COLS; c++) want[at * A2A_COLS + c] = a2a_value(r, g_rank, k, c);
      expect_f32(name, data, want, (size_t)total * A2A_COLS);
      free(want);
    }
  }
  gs_handle_free(h);
  free(send);
  printf("alltoall: '%s' done (rank %d)\n", name, g_rank);
}

/* 0, 1 or 2 rows, zeros included on most ranks. */
static int64_t a2a_uneven(int r, int q) {
  return (r + 2 * q) % 3;
}

/* Nobody sends anything to the last rank. */
static int64_t a2a_none_to_last(int r, int q) {
  return q == g_size - 1 ? 0 : 1 + (r + q) % 2;
}

static int mode_alltoall(gs_ctx *ctx) {
  /* Invalid arguments: refused at the call, with the reason. */
  float x[64] = {0};
  int64_t splits[MAX_RANKS];
  char want[256];
  gs_handle *h = NULL;
  int64_t shape[2] = {g_size + 1, 2};
  for (int q = 0; q < g_size; q++) splits[q] = 1;
  gs_status s = gs_alltoall_async(ctx, "a2a/badsum", x, shape, 2, GS_FLOAT32, splits, NULL, &h);
  snprintf(want, sizeof want,
           "tensor 'a2a/badsum': alltoall splits add up to %d rows but the first dimension is "
           "%d; the %d splits must sum to it",
           g_size, g_size + 1, g_size);
  expect_error("splits with the wrong sum", s, gs_last_error(ctx), GS_ERR_INVALID_ARG, want,
               (const char *)NULL);
  splits[0] = 3;
  splits[1] = -1;
  shape[0] = g_size;
  s = gs_alltoall_async(ctx, "a2a/negative", x, shape, 2, GS_FLOAT32, splits, NULL, &h);
  expect_error("a negative split", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'a2a/negative': alltoall split 1 is negative (-1)", (const char *)NULL);
  shape[0] = g_size + 1;
  s = gs_alltoall_async(ctx, "a2a/indivisible", x, shape, 2, GS_FLOAT32, NULL, NULL, &h);
  snprintf(want, sizeof want,
           "tensor 'a2a/indivisible': alltoall without splits needs a first dimension divisible "
           "by the %d ranks, but it is %d; pass splits",
           g_size, g_size + 1);
  expect_error("equal parts of an indivisible first dimension", s, gs_last_error(ctx),
               GS_ERR_INVALID_ARG, want, (const char *)NULL);
  s = gs_alltoall_async(ctx, "a2a/scalar", x, shape, 0, GS_FLOAT32, NULL, NULL, &h);
  expect_error("no dimension", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'a2a/scalar': alltoall needs at least one dimension (got ndim=0)",
               (const char *)NULL);
  check(h == NULL, "a refused alltoall returned a handle");

  /* Valid exchanges. */
  a2a_run(ctx, "a2a/uneven", a2a_uneven, 0);
  a2a_run(ctx, "a2a/equal", NULL, 2);
  a2a_run(ctx, "a2a/none-to-last", a2a_none_to_last, 0);

  /* Equal parts of a 1-D int64 tensor: rank r's element k goes to rank
   * k / 2. */
  int64_t v[2 * MAX_RANKS], shape1[1] = {2 * g_size};
  for (int k = 0; k < 2 * g_size; k++) v[k] = g_rank * 100 + k;
  s = gs_alltoall_async(ctx, "a2a/int64", v, shape1, 1, GS_INT64, NULL, NULL, &h);
  if (check(s == GS_OK, "tensor 'a2a/int64': gs_alltoall_async: %s: %s", wu_status_name(s),
            gs_last_error(ctx))) {
    const void *data = NULL;
    size_t bytes = 0;
    if (wait_ok(h, "a2a/int64") && check(gs_handle_result(h, &data, &bytes) == GS_OK &&
                                             bytes == 2 * (size_t)g_size * sizeof(int64_t),
                                         "tensor 'a2a/int64': result of %zu bytes", bytes)) {
      int64_t wantv[2 * MAX_RANKS];
      for (int r = 0; r < g_size; r++)
        for (int k = 0; k < 2; k++) wantv[2 * r + k] = r * 100 + 2 * g_rank + k;
      expect_i64("a2a/int64", data, wantv, 2 * (size_t)g_size);
    }
    gs_handle_free(h);
  }
  expect_job_goes_on(ctx, "after/alltoall");
  return 0;
}

/* ---- mode: reducescatter -------------------------------------------------- */

#define RS_COLS 3

/* Rows of rank r when `rows` are split over the ranks: as even as possible,
 * the lower ranks taking the extra rows (Horovod). */
static int64_t rs_rows(int64_t rows, int r) {
  return rows / g_size + (r < rows % g_size ? 1 : 0);
}

static void rs_run(gs_ctx *ctx, const char *name, int64_t rows, gs_dtype dt, gs_reduce_op op) {
  size_t count = (size_t)rows * RS_COLS, es = gs_dtype_size(dt);
  unsigned id = (unsigned)(rows * 16 + (int64_t)dt * 2 + (op == GS_AVERAGE));
  void *send = wu_xcalloc(count, es);
  for (size_t i = 0; i < count; i++) {
    int v = ival(g_rank, id, 0, i);
    if (dt == GS_FLOAT32) ((float *)send)[i] = (float)v;
    if (dt == GS_FLOAT64) ((double *)send)[i] = v / 4.0;
    if (dt == GS_INT32) ((int32_t *)send)[i] = v;
  }
  int64_t shape[2] = {rows, RS_COLS};
  gs_handle *h = NULL;
  gs_status s = gs_reducescatter_async(ctx, name, send, shape, 2, dt, op, NULL, &h);
  if (!check(s == GS_OK, "tensor '%s': gs_reducescatter_async: %s: %s", name, wu_status_name(s),
             gs_last_error(ctx))) {
    free(send);
    return;
  }
  int64_t mine = rs_rows(rows, g_rank), start = 0;
  for (int r = 0; r < g_rank; r++) start += rs_rows(rows, r);
  if (wait_ok(h, name)) {
    const void *data = NULL;
    size_t bytes = 0;
    s = gs_handle_result(h, &data, &bytes);
    size_t n = (size_t)mine * RS_COLS;
    if (check(s == GS_OK, "tensor '%s': gs_handle_result: %s: %s", name, wu_status_name(s),
              gs_last_error(ctx)) &&
        check(bytes == n * es,
              "tensor '%s': %zu result bytes on rank %d, expected its %lld of %lld rows (%zu "
              "bytes)",
              name, bytes, g_rank, (long long)mine, (long long)rows, n * es)) {
      void *want = wu_xcalloc(n, es);
      for (size_t i = 0; i < n; i++) {
        size_t at = (size_t)start * RS_COLS + i;
        int sum = 0;
        for (int r = 0; r < g_size; r++) sum += ival(r, id, 0, at);
        if (dt == GS_FLOAT32)
          ((float *)want)[i] = op == GS_AVERAGE ? (float)sum / (float)g_size : (float)sum;
        if (dt == GS_FLOAT64)
          ((double *)want)[i] = op == GS_AVERAGE ? (sum / 4.0) / g_size : sum / 4.0;
        if (dt == GS_INT32) ((int32_t *)want)[i] = op == GS_AVERAGE ? sum / g_size : sum;
      }
      if (dt == GS_FLOAT32) expect_f32(name, data, want, n);
      if (dt == GS_FLOAT64) expect_f64(name, data, want, n);
      if (dt == GS_INT32) expect_i32(name, data, want, n);
      free(want);
    }
  }
  gs_handle_free(h);
  free(send);
  printf("reducescatter: '%s' %lld rows, %lld here (rank %d)\n", name, (long long)rows,
         (long long)mine, g_rank);
}

static int mode_reducescatter(gs_ctx *ctx) {
  float x[8] = {0};
  int64_t shape[2] = {4, 2};
  gs_handle *h = NULL;
  gs_status s = gs_reducescatter_async(ctx, "rs/min", x, shape, 2, GS_FLOAT32, GS_MIN, NULL, &h);
  expect_error("reducescatter with min", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'rs/min': reducescatter supports only GS_SUM and GS_AVERAGE",
               (const char *)NULL);
  s = gs_reducescatter_async(ctx, "rs/scalar", x, shape, 0, GS_FLOAT32, GS_SUM, NULL, &h);
  expect_error("reducescatter without a dimension", s, gs_last_error(ctx), GS_ERR_INVALID_ARG,
               "tensor 'rs/scalar': reducescatter needs at least one dimension (got ndim=0)",
               (const char *)NULL);
  check(h == NULL, "a refused reducescatter returned a handle");

  int64_t uneven = 2 * g_size + 1, even = 2 * g_size, fewer = g_size - 1;
  rs_run(ctx, "rs/uneven/sum", uneven, GS_FLOAT32, GS_SUM);
  rs_run(ctx, "rs/uneven/avg", uneven, GS_FLOAT32, GS_AVERAGE);
  rs_run(ctx, "rs/even/sum", even, GS_FLOAT32, GS_SUM);
  rs_run(ctx, "rs/even/avg", even, GS_FLOAT32, GS_AVERAGE);
  rs_run(ctx, "rs/fewer-rows-than-ranks/sum", fewer, GS_FLOAT32, GS_SUM);
  rs_run(ctx, "rs/float64/avg", uneven, GS_FLOAT64, GS_AVERAGE);
  rs_run(ctx, "rs/int32/sum", uneven, GS_INT32, GS_SUM);
  expect_job_goes_on(ctx, "after/reducescatter");
  return 0;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  static const char usage[] =
      "usage: gs-models-worker towers [scale|noscale-env|noscale-opt] | conflict | compress | "
      "scale | ops | alltoall | reducescatter\n";
  if (argc < 2 || argc > 3) {
    fputs(usage, stderr);
    return 2;
  }
  g_mode = argv[1];
  const char *variant = argc == 3 ? argv[2] : "scale";
  gs_options opts;
  gs_options_init(&opts);
  int scale_local = 1;
  if (strcmp(g_mode, "towers") == 0) {
    if (strcmp(variant, "noscale-opt") == 0) {
      opts.scale_local = 0; /* wins over GRADSYNC_SCALE_LOCAL=1 */
      scale_local = 0;
    } else if (strcmp(variant, "noscale-env") == 0) {
      scale_local = 0; /* GRADSYNC_SCALE_LOCAL=0 from the driver */
    } else if (strcmp(variant, "scale") != 0) {
      fputs(usage, stderr);
      return 2;
    }
  } else if (argc == 3) {
    fputs(usage, stderr);
    return 2;
  }
  static const struct {
    const char *name;
    int (*run)(gs_ctx *);
  } modes[] = {{"conflict", mode_conflict},
               {"compress", mode_compress},
               {"scale", mode_scale},
               {"ops", mode_ops},
               {"alltoall", mode_alltoall},
               {"reducescatter", mode_reducescatter},
               {"towers", NULL}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    if (strcmp(g_mode, modes[m].name) != 0) continue;
    gs_ctx *ctx = NULL;
    gs_status s = gs_init(&opts, &ctx);
    if (s != GS_OK) wu_die("gs_init: %s: %s", wu_status_name(s), gs_last_error(NULL));
    g_rank = gs_rank(ctx);
    g_size = gs_size(ctx);
    if (g_size > MAX_RANKS) wu_die("this worker handles at most %d ranks", MAX_RANKS);
    if (modes[m].run)
      modes[m].run(ctx);
    else
      mode_towers(ctx, scale_local);
    s = gs_shutdown(ctx);
    if (s != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(s), gs_last_error(NULL));
    if (g_failed) {
      printf("%s: %u of %u checks FAILED (rank %d of %d)\n", g_mode, g_failed, g_checks, g_rank,
             g_size);
      return 1;
    }
    printf("%s: %u checks passed (rank %d of %d)\n", g_mode, g_checks, g_rank, g_size);
    return 0;
  }
  fprintf(stderr, "gs-models-worker: unknown mode '%s'\n%s", g_mode, usage);
  return 2;
}
