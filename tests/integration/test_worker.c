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
 * If GS_TEST_WAIT_FILE is set, a successful mode waits (at most 60 s) for
 * that file to exist before gs_shutdown, so a test can inspect the live
 * data-plane connections.
 *
 * Single-threaded: the main thread submits and waits. The conversions
 * between float and float16/bfloat16 are the test's own, independent of the
 * library's. */
#include "gradsync.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 60000 /* one op never takes this long on a healthy job */

static int g_rank = -1;
static int g_size = 0;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "rank %d: FAIL: ", g_rank);
  vfprintf(stdout, fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
  fflush(stderr);
  /* Leave at once: a broken job must not be waited on in gs_shutdown. */
  _exit(1);
}

static const char *status_name(gs_status s) {
  static const char *const names[] = {
      "GS_OK",
      "GS_ERR_INVALID_ARG",
      "GS_ERR_NO_MEMORY",
      "GS_ERR_TIMEOUT",
      "GS_ERR_MISMATCH",
      "GS_ERR_DUPLICATE_NAME",
      "GS_ERR_JOIN_REFUSED",
      "GS_ERR_JOIN_TIMEOUT",
      "GS_ERR_COORDINATOR_LOST",
      "GS_ERR_RANK_LOST",
      "GS_ERR_DATA_PLANE",
      "GS_ERR_ABORTED",
      "GS_ERR_SHUTDOWN",
      "GS_ERR_DEADLOCK",
      "GS_ERR_STALL",
      "GS_ERR_UNSUPPORTED",
      "GS_ERR_INTERNAL",
      "GS_ERR_UNAUTHENTICATED",
      "GS_ERR_ALREADY_JOINED",
  };
  if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
  return "GS_ERR_<unknown>";
}

static const char *dtype_name(gs_dtype d) {
  switch (d) {
  case GS_FLOAT32:
    return "float32";
  case GS_FLOAT64:
    return "float64";
  case GS_FLOAT16:
    return "float16";
  case GS_BFLOAT16:
    return "bfloat16";
  case GS_INT32:
    return "int32";
  case GS_INT64:
    return "int64";
  case GS_INT8:
    return "int8";
  case GS_UINT8:
    return "uint8";
  }
  return "?";
}

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

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) die("out of memory (%zu bytes)", n);
  return p;
}

/* ---- deterministic data --------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

/* ---- float16 / bfloat16, round to nearest even ---------------------------- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* may carry into exp: correct */
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

/* ---- element access -------------------------------------------------------- */

static int is_float(gs_dtype d) {
  return d == GS_FLOAT32 || d == GS_FLOAT64 || d == GS_FLOAT16 || d == GS_BFLOAT16;
}

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
  }
  return 0;
}

/* Stores v, rounded as the library must round a float32 result. */
static void put(gs_dtype d, void *buf, size_t i, double v) {
  switch (d) {
  case GS_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case GS_FLOAT64:
    ((double *)buf)[i] = v;
    break;
  case GS_FLOAT16:
    ((uint16_t *)buf)[i] = f32_to_f16((float)v);
    break;
  case GS_BFLOAT16:
    ((uint16_t *)buf)[i] = f32_to_bf16((float)v);
    break;
  case GS_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case GS_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case GS_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case GS_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  }
}

static double get(gs_dtype d, const void *buf, size_t i) {
  switch (d) {
  case GS_FLOAT32:
    return ((const float *)buf)[i];
  case GS_FLOAT64:
    return ((const double *)buf)[i];
  case GS_FLOAT16:
    return f16_to_f32(((const uint16_t *)buf)[i]);
  case GS_BFLOAT16:
    return bf16_to_f32(((const uint16_t *)buf)[i]);
  case GS_INT32:
    return ((const int32_t *)buf)[i];
  case GS_INT64:
    return (double)((const int64_t *)buf)[i];
  case GS_INT8:
    return ((const int8_t *)buf)[i];
  case GS_UINT8:
    return ((const uint8_t *)buf)[i];
  }
  return NAN;
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
  }
  return 0;
}

/* Input element j of tensor t on rank r in round k. Small values, chosen so
 * that every partial sum or product over `size` ranks, in any order, is
 * exact in the dtype (the ring reduces in steps, rounding each step). */
static double value(gs_reduce_op op, gs_dtype d, int size, int r, unsigned t, size_t j,
                    unsigned k) {
  uint64_t h = hash4((uint64_t)r + 1, t, j, k);
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
  double step = (is_float(d) && d != GS_BFLOAT16) ? 0.5 : 1.0;
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
    if (is_float(d)) {
      acc = acc / size; /* rounded to the dtype by put() */
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
  if (op != GS_AVERAGE || !is_float(d)) return 0;
  double rel;
  switch (d) {
  case GS_FLOAT64:
    rel = 0x1p-50;
    break;
  case GS_FLOAT32:
    rel = 0x1p-21;
    break;
  case GS_FLOAT16:
    rel = 0x1p-9;
    break;
  default:
    rel = 0x1p-6;
    break;
  }
  double tol = rel * (fabs(want) > 0.5 ? fabs(want) : 0.5);
  return fabs(got - want) <= tol;
}

/* Rounds v to what the dtype stores (to compare like with like). */
static double as_stored(gs_dtype d, double v) {
  unsigned char tmp[8];
  put(d, tmp, 0, v);
  return get(d, tmp, 0);
}

/* ---- common helpers ------------------------------------------------------- */

static gs_ctx *join_or_die(void) {
  gs_ctx *ctx = NULL;
  gs_status s = gs_init(NULL, &ctx);
  if (s != GS_OK) die("gs_init: %s: %s", status_name(s), gs_last_error(NULL));
  if (ctx == NULL) die("gs_init returned GS_OK and a NULL context");
  g_rank = gs_rank(ctx);
  g_size = gs_size(ctx);
  const char *env_rank = getenv("GRADSYNC_RANK");
  const char *env_size = getenv("GRADSYNC_SIZE");
  if (env_rank && atoi(env_rank) != g_rank)
    die("gs_rank() = %d but GRADSYNC_RANK = %s", g_rank, env_rank);
  if (env_size && atoi(env_size) != g_size)
    die("gs_size() = %d but GRADSYNC_SIZE = %s", g_size, env_size);
  fprintf(stderr, "rank %d: joined a world of %d\n", g_rank, g_size);
  return ctx;
}

static void wait_ok(gs_handle *h, const char *name) {
  gs_status s = gs_wait(h, WAIT_MS);
  if (s != GS_OK) die("tensor '%s': gs_wait: %s: %s", name, status_name(s), gs_handle_error(h));
  int done = 0;
  if (gs_test(h, &done) != GS_OK || !done) die("tensor '%s': gs_test says not done", name);
  const char *err = gs_handle_error(h);
  if (err == NULL || err[0] != '\0') die("tensor '%s': succeeded with error text '%s'", name, err);
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
  die("%s did not appear within 60 s", path);
}

static void shutdown_or_die(gs_ctx *ctx) {
  wait_for_release_file();
  gs_status s = gs_shutdown(ctx);
  if (s != GS_OK) die("gs_shutdown: %s: %s", status_name(s), gs_last_error(NULL));
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
    put(t->dt, t->send, j, value(t->op, t->dt, g_size, g_rank, t->id, j, round));
  if (!t->inplace) memset(t->recv, 0xA5, t->count * dsize(t->dt) + 1);
}

static size_t check(const tensor *t, unsigned round) {
  for (size_t j = 0; j < t->count; j++) {
    double want = as_stored(t->dt, reference(t->op, t->dt, g_size, t->id, j, round));
    double got = get(t->dt, t->recv, j);
    if (!close_enough(t->op, t->dt, got, want))
      die("tensor '%s' (round %u): element %zu: got %.9g, expected %.9g", t->name, round, j, got,
          want);
    if (!t->inplace) {
      double in = as_stored(t->dt, value(t->op, t->dt, g_size, g_rank, t->id, j, round));
      double sent = get(t->dt, t->send, j);
      if (sent != in)
        die("tensor '%s' (round %u): send buffer modified at element %zu: %.9g, was %.9g", t->name,
            round, j, sent, in);
    }
  }
  /* Out of place: nothing may be written past the end of recv. */
  if (!t->inplace && ((unsigned char *)t->recv)[t->count * dsize(t->dt)] != 0xA5)
    die("tensor '%s' (round %u): byte written past the end of recv", t->name, round);
  return t->count;
}

static int mode_ops(gs_ctx *ctx, int rounds) {
  static const gs_reduce_op ops[] = {GS_SUM, GS_AVERAGE, GS_MIN, GS_MAX, GS_PRODUCT};
  static const gs_dtype dts[] = {GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16,
                                 GS_INT32,   GS_INT64,   GS_INT8,    GS_UINT8};
  static const size_t counts[] = {0, 1, 7, 1000, 65539};
  const size_t max_tensors = 5 * 8 * 2 * 5;
  tensor *ts = calloc(max_tensors, sizeof *ts);
  if (!ts) die("out of memory");
  size_t n = 0;
  for (size_t o = 0; o < 5; o++)
    for (size_t d = 0; d < 8; d++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (size_t c = 0; c < 5; c++) {
          if (counts[c] == 0 && ops[o] != GS_SUM) continue;
          tensor *t = &ts[n];
          t->id = (unsigned)n;
          t->op = ops[o];
          t->dt = dts[d];
          t->inplace = inplace;
          t->count = counts[c];
          snprintf(t->name, sizeof t->name, "ops/%s/%s/%s/n%zu", op_name(t->op), dtype_name(t->dt),
                   inplace ? "inplace" : "outofplace", t->count);
          size_t bytes = t->count * dsize(t->dt) + 1; /* +1: overrun canary */
          t->send = xmalloc(bytes);
          t->recv = inplace ? t->send : xmalloc(bytes);
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
        die("tensor '%s': gs_allreduce_async: %s: %s", t->name, status_name(s), gs_last_error(ctx));
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
  uint64_t h = hash4(7, i, 0, 0);
  if (i % 10 == 0) return 100003 + i; /* bigger than a fusion group's usual tensor */
  if (i % 3 == 0) return 1 + h % 16;  /* tiny */
  return 1 + h % 4000;
}

static float ro_value(int r, unsigned i, size_t j) {
  return (float)((int64_t)(hash4((uint64_t)r + 100, i, j, 1) % 33) - 16) * 0.5f; /* -8..8 */
}

static int mode_random_order(gs_ctx *ctx, unsigned seed) {
  float *buf[RO_TENSORS];
  char names[RO_TENSORS][48];
  unsigned order[RO_TENSORS];
  gs_handle *hs[RO_TENSORS];
  unsigned which[RO_TENSORS]; /* hs[k] is the op of tensor which[k] */

  for (unsigned i = 0; i < RO_TENSORS; i++) {
    size_t c = ro_count(i);
    buf[i] = xmalloc(c * sizeof(float));
    for (size_t j = 0; j < c; j++) buf[i][j] = ro_value(g_rank, i, j);
    snprintf(names[i], sizeof names[i], "random/t%03u", i);
    order[i] = i;
  }
  /* A different order on every rank (Fisher-Yates seeded by the rank). */
  uint64_t st = hash4(seed, (uint64_t)g_rank, 42, 0);
  for (unsigned i = RO_TENSORS - 1; i > 0; i--) {
    st = mix(st);
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
      die("tensor '%s': gs_allreduce_async: %s: %s", names[i], status_name(s), gs_last_error(ctx));
    which[k] = i;
    /* Spread the submissions over several batching cycles. */
    if (hash4(seed, (uint64_t)g_rank, k, 3) % 8 == 0) sleep_ms(1 + (long)(mix(st + k) % 3));
  }

  size_t pending = RO_TENSORS, completed = 0;
  while (pending > 0) {
    size_t idx = pending; /* must be overwritten */
    gs_status s = gs_wait_any(hs, pending, WAIT_MS, &idx);
    if (s == GS_ERR_TIMEOUT)
      die("gs_wait_any: no op completed in %d ms (%zu pending)", WAIT_MS, pending);
    if (idx >= pending) die("gs_wait_any: %s with index %zu of %zu", status_name(s), idx, pending);
    unsigned i = which[idx];
    if (s != GS_OK)
      die("tensor '%s': gs_wait_any: %s: %s", names[i], status_name(s), gs_handle_error(hs[idx]));
    int done = 0;
    if (gs_test(hs[idx], &done) != GS_OK || !done)
      die("tensor '%s': gs_wait_any returned it but gs_test says not done", names[i]);
    size_t c = ro_count(i);
    for (size_t j = 0; j < c; j++) {
      float want = 0;
      for (int r = 0; r < g_size; r++) want += ro_value(r, i, j);
      if (buf[i][j] != want)
        die("tensor '%s': element %zu: got %.9g, expected %.9g", names[i], j, (double)buf[i][j],
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
  if (g_size < 2) die("mismatch needs at least 2 ranks");
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
  float *kernel = xmalloc(count * sizeof(float));
  for (size_t j = 0; j < count; j++) kernel[j] = 1.0f;
  gs_allreduce_opts opts = {.shape = shape, .ndim = 2};
  gs_handle *h = NULL;
  gs_status s =
      gs_allreduce_async(ctx, "dense/kernel", kernel, kernel, count, GS_FLOAT32, GS_SUM, &opts, &h);
  if (s != GS_OK)
    die("dense/kernel: gs_allreduce_async: %s: %s", status_name(s), gs_last_error(ctx));

  /* The job goes on after the error: a following tensor completes. */
  enum { AFTER_N = 1000 };
  float *after = xmalloc(AFTER_N * sizeof(float));
  for (size_t j = 0; j < AFTER_N; j++) after[j] = (float)(g_rank + 1) * (float)(j % 5);
  int64_t after_shape[2] = {AFTER_N / 10, 10};
  gs_allreduce_opts after_opts = {.shape = after_shape, .ndim = 2};
  gs_handle *ha = NULL;
  s = gs_allreduce_async(ctx, "after/mismatch", after, after, AFTER_N, GS_FLOAT32, GS_SUM,
                         &after_opts, &ha);
  if (s != GS_OK)
    die("after/mismatch: gs_allreduce_async: %s: %s", status_name(s), gs_last_error(ctx));

  s = gs_wait(h, WAIT_MS);
  const char *msg = gs_handle_error(h);
  printf("mismatch: rank %d: %s: %s\n", g_rank, status_name(s), msg ? msg : "(null)");
  fflush(stdout);
  if (s != GS_ERR_MISMATCH) die("dense/kernel: expected GS_ERR_MISMATCH, got %s", status_name(s));
  if (msg == NULL || strcmp(msg, want) != 0)
    die("dense/kernel: error text\n  got:      %s\n  expected: %s", msg ? msg : "(null)", want);
  gs_handle_free(h);

  wait_ok(ha, "after/mismatch");
  float k = (float)g_size * (float)(g_size + 1) / 2; /* sum of (r + 1) */
  for (size_t j = 0; j < AFTER_N; j++) {
    float want_v = k * (float)(j % 5);
    if (after[j] != want_v)
      die("tensor 'after/mismatch': element %zu: got %.9g, expected %.9g", j, (double)after[j],
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
    die("tensor '%s': gs_allreduce_async: %s: %s", name, status_name(s), gs_last_error(ctx));
  wait_ok(h, name);
  gs_handle_free(h);
  int32_t k = g_size * (g_size + 1) / 2;
  for (int j = 0; j < N; j++)
    if (v[j] != k * j) die("tensor '%s': element %d: got %d, expected %d", name, j, v[j], k * j);
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

/* ---- main ------------------------------------------------------------------ */

static void usage(void) {
  fprintf(stderr, "usage: gs-test-worker ops [ROUNDS] | random-order [SEED] | mismatch |\n"
                  "                      hold MS | join | exit-code RANK CODE\n");
  exit(2);
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
      printf("join: gs_init failed: %s: %s\n", status_name(s), gs_last_error(NULL));
      if (ctx != NULL) printf("join: FAIL: context not NULL after a failed gs_init\n");
      return 3;
    }
    g_rank = gs_rank(ctx);
    g_size = gs_size(ctx);
    printf("join: ok (rank %d of %d)\n", g_rank, g_size);
    shutdown_or_die(ctx);
    return 0;
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
  } else {
    usage();
    rc = 2;
  }
  return rc;
}
