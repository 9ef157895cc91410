/* Unit tests of the TCP ring backend (worker/backends/tcp_ring.c) with real
 * sockets on 127.0.0.1. Each rank is a thread of this process; they meet
 * through an in-memory, thread-safe gs__kv defined here (the integration
 * tests use the coordinator's real store). Rank threads never call cmocka
 * asserts: they record what happened and the main thread checks it.
 *
 * Set GS_RING_BENCH=1 to also print 2-rank float32 allreduce timings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "messages.h"
#include "status.h"

#define HANG_GUARD_MS 20000 /* connect/io timeouts where no failure is expected */

static const uint8_t k_key[GS__SECRET_BYTES] = "0123456789abcdef0123456789abcde";

/* ---- in-memory rendezvous store ------------------------------------------- */

typedef struct kv_entry {
  char *key;
  void *val;
  size_t len;
  struct kv_entry *next;
} kv_entry;

static pthread_mutex_t g_kv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_kv_cv;
static kv_entry *g_kv_head;
/* A read of g_gate_key waits (under g_kv_mu) until g_gate_open: holds one
 * rank back in its rendezvous while a test plays a rogue peer. */
static char g_gate_key[128];
static int g_gate_open = 1;

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen) {
  (void)ctx;
  kv_entry *e = calloc(1, sizeof *e);
  if (!e) return GS__ERR_NO_MEMORY;
  e->key = strdup(key);
  e->val = malloc(len ? len : 1);
  memcpy(e->val, val, len);
  e->len = len;
  pthread_mutex_lock(&g_kv_mu);
  for (kv_entry **p = &g_kv_head; *p; p = &(*p)->next) {
    if (strcmp((*p)->key, key) == 0) { /* replace */
      kv_entry *old = *p;
      e->next = old->next;
      *p = e;
      free(old->key), free(old->val), free(old);
      goto out_signal;
    }
  }
  e->next = g_kv_head;
  g_kv_head = e;
out_signal:
  pthread_cond_broadcast(&g_kv_cv);
  pthread_mutex_unlock(&g_kv_mu);
  return GS__OK;
}

static int kv_get(void *ctx, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  (void)ctx;
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += timeout_ms / 1000;
  dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&g_kv_mu);
  while (!g_gate_open && strcmp(key, g_gate_key) == 0)
    if (pthread_cond_timedwait(&g_kv_cv, &g_kv_mu, &dl) == ETIMEDOUT) break;
  for (;;) {
    for (kv_entry *e = g_kv_head; e; e = e->next) {
      if (strcmp(e->key, key) == 0) {
        *val = malloc(e->len ? e->len : 1);
        memcpy(*val, e->val, e->len);
        *len = e->len;
        pthread_mutex_unlock(&g_kv_mu);
        return GS__OK;
      }
    }
    if (pthread_cond_timedwait(&g_kv_cv, &g_kv_mu, &dl) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&g_kv_mu);
  snprintf(err, errlen, "test kv: key \"%s\" did not appear within %d ms", key, timeout_ms);
  return GS__ERR_TIMEOUT;
}

static char *kv_lookup(const char *key) {
  char *out = NULL;
  pthread_mutex_lock(&g_kv_mu);
  for (kv_entry *e = g_kv_head; e; e = e->next)
    if (strcmp(e->key, key) == 0) out = strndup(e->val, e->len);
  pthread_mutex_unlock(&g_kv_mu);
  return out;
}

static void kv_clear(void) {
  pthread_mutex_lock(&g_kv_mu);
  while (g_kv_head) {
    kv_entry *e = g_kv_head;
    g_kv_head = e->next;
    free(e->key), free(e->val), free(e);
  }
  pthread_mutex_unlock(&g_kv_mu);
}

/* ---- running N ranks as threads -------------------------------------------- */

typedef struct rank_ctx rank_ctx;
typedef void (*rank_body)(rank_ctx *rc);

typedef struct job {
  int size;
  int started; /* ranks 0..started-1 are run (default: all) */
  int connect_timeout_ms, io_timeout_ms;
  const char *advertise;   /* NULL: derive from the coordinator address */
  const char *coordinator; /* NULL: 127.0.0.1:9 */
  const char *data_addr;   /* GRADSYNC_DATA_ADDR */
  int port_lo, port_hi;    /* GRADSYNC_DATA_PORT_RANGE */
  rank_body body;
  void *user;
  char prefix[64];
  const uint8_t (*keys)[GS__SECRET_BYTES]; /* per-rank ring keys; NULL = k_key */
  int deterministic;                       /* GRADSYNC_DETERMINISTIC */
  const char *congestion;                  /* GRADSYNC_TCP_CONGESTION */
  const int *kv_ranks;                     /* job ranks of a subset ring; NULL = itself */
  /* for tests where a rank waits for another to finish */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done_count;
} job;

struct rank_ctx {
  job *j;
  int rank;
  gs__backend *b;
  int create_rc;
  char create_err[1024];
  /* results written by the body */
  int rc[16];
  char err[16][1024];
  double secs[16];
  void *out[16];
  size_t out_len[16];
  long bad; /* elements that differed from the reference */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *rank_main(void *arg) {
  rank_ctx *rc = arg;
  job *j = rc->j;
  gs__tcp_ring_opts o = {
      .rank = rc->rank,
      .size = j->size,
      .coordinator = j->coordinator ? j->coordinator : "127.0.0.1:9", /* never contacted */
      .advertise_addr = j->advertise,
      .data_addr = j->data_addr,
      .port_lo = j->port_lo,
      .port_hi = j->port_hi,
      .key_prefix = j->prefix,
      .connect_timeout_ms = j->connect_timeout_ms ? j->connect_timeout_ms : HANG_GUARD_MS,
      .io_timeout_ms = j->io_timeout_ms ? j->io_timeout_ms : HANG_GUARD_MS,
      .kv = {.ctx = NULL, .set = kv_set, .get = kv_get},
      .ring_key = j->keys ? j->keys[rc->rank] : k_key,
      .deterministic = j->deterministic,
      .congestion = j->congestion,
      .kv_ranks = j->kv_ranks,
  };
  /* through the factory, as gs_init creates it */
  rc->create_rc =
      gs__backend_create(GS__BACKEND_TCP, &o, &rc->b, rc->create_err, sizeof rc->create_err);
  if (rc->create_rc == GS__OK && j->body) j->body(rc);
  gs__backend_destroy(rc->b);
  rc->b = NULL;
  pthread_mutex_lock(&j->mu);
  j->done_count++;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

static int g_job_seq;

static rank_ctx *run_job(job *j) {
  snprintf(j->prefix, sizeof j->prefix, "job%d/", ++g_job_seq);
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->done_count = 0;
  int started = j->started ? j->started : j->size;
  rank_ctx *rcs = calloc((size_t)j->size, sizeof *rcs);
  pthread_t *th = calloc((size_t)j->size, sizeof *th);
  assert_non_null(rcs);
  assert_non_null(th);
  for (int r = 0; r < started; r++) {
    rcs[r].j = j;
    rcs[r].rank = r;
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &rcs[r]), 0);
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  free(th);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  return rcs;
}

static void free_job(job *j, rank_ctx *rcs) {
  for (int r = 0; r < j->size; r++)
    for (int k = 0; k < 16; k++) free(rcs[r].out[k]);
  free(rcs);
  kv_clear();
}

static void assert_created(job *j, rank_ctx *rcs) {
  int started = j->started ? j->started : j->size;
  for (int r = 0; r < started; r++)
    if (rcs[r].create_rc != GS__OK)
      fail_msg("rank %d of %d: create failed (%s): %s", r, j->size,
               gs__status_name(rcs[r].create_rc), rcs[r].create_err);
}

/* Blocks rank rc until `count` ranks of its job have finished. */
static void wait_done(rank_ctx *rc, int count) {
  job *j = rc->j;
  pthread_mutex_lock(&j->mu);
  while (j->done_count < count) pthread_cond_wait(&j->cv, &j->mu);
  pthread_mutex_unlock(&j->mu);
}

/* ---- float32 sum over sizes x counts ---------------------------------------- */

static const size_t k_counts[] = {0, 1, 2, 3, 7, 1000, (1u << 20) + 3};
#define NCOUNTS (sizeof k_counts / sizeof k_counts[0])

static float sum_val(int r, size_t i) {
  return (float)((int)((i * 7 + (size_t)r * 13) % 101) - 50);
}

static void body_sum_counts(rank_ctx *rc) {
  int n = rc->j->size;
  for (size_t k = 0; k < NCOUNTS; k++) {
    size_t count = k_counts[k];
    float *buf = malloc((count ? count : 1) * sizeof *buf);
    for (size_t i = 0; i < count; i++) buf[i] = sum_val(rc->rank, i);
    rc->rc[k] = rc->b->v->allreduce(rc->b, count ? buf : NULL, count, GS__FLOAT32, GS__SUM,
                                    rc->err[k], sizeof rc->err[k]);
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int r = 0; r < n; r++) want += sum_val(r, i);
      if (buf[i] != want) rc->bad++;
    }
    rc->out[k] = buf;
    rc->out_len[k] = count * sizeof *buf;
  }
}

static void check_all_ok_and_equal(job *j, rank_ctx *rcs, int nops) {
  for (int r = 0; r < j->size; r++) {
    for (int k = 0; k < nops; k++)
      if (rcs[r].rc[k] != GS__OK)
        fail_msg("size %d rank %d op %d: %s: %s", j->size, r, k, gs__status_name(rcs[r].rc[k]),
                 rcs[r].err[k]);
    if (rcs[r].bad) fail_msg("size %d rank %d: %ld wrong elements", j->size, r, rcs[r].bad);
    for (int k = 0; k < nops; k++) {
      assert_int_equal(rcs[r].out_len[k], rcs[0].out_len[k]);
      if (rcs[r].out_len[k] && memcmp(rcs[r].out[k], rcs[0].out[k], rcs[r].out_len[k]) != 0)
        fail_msg("size %d op %d: rank %d's result is not bitwise equal to rank 0's", j->size, k, r);
    }
  }
}

static void test_sum_sizes_counts(void **state) {
  (void)state;
  static const int sizes[] = {1, 2, 3, 4, 7};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    job j = {.size = sizes[s], .body = body_sum_counts};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    check_all_ok_and_equal(&j, rcs, (int)NCOUNTS);
    free_job(&j, rcs);
  }
}

/* ---- every dtype x op against a locally computed reference ---------------------- */

#define DT_COUNT 1001

/* Inputs chosen so the reference is exact whatever the reduction order:
 * small integers for float sums, powers of two for float products, and the
 * full range for integers (wrap-around is order independent). */
static double float_input(gs__reduce_op op, int r, size_t i) {
  if (op == GS__PRODUCT) {
    static const double k[] = {0.5, 1, 2, -1, -2, 4, -0.5};
    return k[(i * 3 + (size_t)r * 5) % 7];
  }
  if (op == GS__MIN || op == GS__MAX) return ((double)((i * 31 + (size_t)r * 17) % 97) - 48) / 4;
  return (double)((int)((i * 7 + (size_t)r * 13) % 101) - 50);
}

static uint64_t int_input(int r, size_t i) {
  return (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)(r + 1) * 0xc2b2ae3d27d4eb4full;
}

static void store(gs__dtype dt, void *base, size_t i, double f, uint64_t u) {
  switch (dt) {
  case GS__FLOAT32:
    ((float *)base)[i] = (float)f;
    break;
  case GS__FLOAT64:
    ((double *)base)[i] = f;
    break;
  case GS__FLOAT16:
    ((uint16_t *)base)[i] = gs__float_to_half((float)f);
    break;
  case GS__BFLOAT16:
    ((uint16_t *)base)[i] = gs__float_to_bf16((float)f);
    break;
  case GS__INT32:
    ((int32_t *)base)[i] = (int32_t)(uint32_t)u;
    break;
  case GS__INT64:
    ((int64_t *)base)[i] = (int64_t)u;
    break;
  case GS__INT8:
    ((int8_t *)base)[i] = (int8_t)(uint8_t)u;
    break;
  case GS__UINT8:
    ((uint8_t *)base)[i] = (uint8_t)u;
    break;
  case GS__INT16:
    ((int16_t *)base)[i] = (int16_t)(uint16_t)u;
    break;
  default:
    break;
  }
}

static void fill_input(gs__dtype dt, gs__reduce_op op, int r, void *buf, size_t count) {
  for (size_t i = 0; i < count; i++) store(dt, buf, i, float_input(op, r, i), int_input(r, i));
}

static int is_float(gs__dtype dt) {
  return dt == GS__FLOAT32 || dt == GS__FLOAT64 || dt == GS__FLOAT16 || dt == GS__BFLOAT16;
}

/* Reference written independently of the ring and of gs__reduce. */
static void reference(gs__dtype dt, gs__reduce_op op, int n, void *out, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (is_float(dt)) {
      double acc = float_input(op, 0, i);
      for (int r = 1; r < n; r++) {
        double v = float_input(op, r, i);
        if (op == GS__PRODUCT)
          acc *= v;
        else if (op == GS__MIN)
          acc = v < acc ? v : acc;
        else if (op == GS__MAX)
          acc = v > acc ? v : acc;
        else
          acc += v;
      }
      if (op == GS__AVERAGE) {
        /* float32 semantics: float sum (exact here) divided in float */
        if (dt == GS__FLOAT64)
          acc = acc / n;
        else
          acc = (double)((float)acc / (float)n);
      }
      store(dt, out, i, acc, 0);
    } else {
      unsigned bits = (unsigned)gs__dtype_size(dt) * 8;
      uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
      /* sign-extend to int64 for min/max comparisons and division */
      int64_t vals[8] = {0};
      for (int r = 0; r < n; r++) {
        uint64_t u = int_input(r, i) & mask;
        if (dt != GS__UINT8 && bits < 64 && (u >> (bits - 1)) & 1) u |= ~mask;
        vals[r] = (int64_t)u;
      }
      uint64_t acc = (uint64_t)vals[0];
      int64_t mm = vals[0];
      for (int r = 1; r < n; r++) {
        if (op == GS__PRODUCT)
          acc *= (uint64_t)vals[r];
        else
          acc += (uint64_t)vals[r];
        if (op == GS__MIN && vals[r] < mm) mm = vals[r];
        if (op == GS__MAX && vals[r] > mm) mm = vals[r];
      }
      if (op == GS__MIN || op == GS__MAX) acc = (uint64_t)mm;
      if (op == GS__AVERAGE) {
        uint64_t w = acc & mask; /* the wrapped sum, back to the type */
        if (dt != GS__UINT8 && bits < 64 && (w >> (bits - 1)) & 1) w |= ~mask;
        acc = (uint64_t)((int64_t)w / n);
      }
      store(dt, out, i, 0, acc);
    }
  }
}

static void body_dtypes(rank_ctx *rc) {
  int k = 0;
  for (gs__dtype dt = 0; dt < GS__DTYPE_COUNT; dt++) {
    size_t es = gs__dtype_size(dt);
    void *buf = malloc(DT_COUNT * es);
    uint8_t *all = malloc(5 * DT_COUNT * es);
    for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT; op++) {
      fill_input(dt, op, rc->rank, buf, DT_COUNT);
      int st = rc->b->v->allreduce(rc->b, buf, DT_COUNT, dt, op, rc->err[k], sizeof rc->err[k]);
      if (st != GS__OK && rc->rc[k] == GS__OK) rc->rc[k] = st;
      memcpy(all + (size_t)op * DT_COUNT * es, buf, DT_COUNT * es);
    }
    rc->out[k] = all;
    rc->out_len[k] = 5 * DT_COUNT * es;
    free(buf);
    k++;
  }
}

static void test_every_dtype_and_op(void **state) {
  (void)state;
  static const int sizes[] = {3, 4};
  for (size_t s = 0; s < 2; s++) {
    job j = {.size = sizes[s], .body = body_dtypes};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    check_all_ok_and_equal(&j, rcs, GS__DTYPE_COUNT);
    for (gs__dtype dt = 0; dt < GS__DTYPE_COUNT; dt++) {
      size_t es = gs__dtype_size(dt);
      uint8_t *want = malloc(DT_COUNT * es);
      for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT; op++) {
        reference(dt, op, j.size, want, DT_COUNT);
        const uint8_t *got = (const uint8_t *)rcs[0].out[dt] + (size_t)op * DT_COUNT * es;
        for (size_t i = 0; i < DT_COUNT; i++)
          if (memcmp(got + i * es, want + i * es, es) != 0)
            fail_msg("size %d %s %s element %zu differs from the reference", j.size,
                     gs__dtype_name(dt), gs__reduce_op_name(op), i);
      }
      free(want);
    }
    free_job(&j, rcs);
  }
}

/* ---- segmented allreduce (allreduce_segs) ---------------------------------- */

#define SEG_N 250001 /* crosses the ring's chunks and its 512 KiB reduce segments */

/* The members of one fused allreduce over buf (this rank's input) and res
 * (results of the out-of-place members), small ones (packed by the ring
 * into runs) and large ones (reduced in place) of every kind: in place,
 * empty, padding (NULL, NULL), out of place, zeros contributed but the
 * result wanted, a contribution whose result is not wanted, padding. The
 * packed equivalent of this rank's contribution is written to pk. */
static size_t seg_layout(gs__dtype dt, char *buf, char *res, size_t n, gs__seg *sg, char *pk) {
  size_t es = gs__dtype_size(dt);
  gs__seg l[] = {{buf, buf, 7},
                 {buf + 7 * es, res + 7 * es, 0},
                 {NULL, NULL, 3},
                 {buf + 10 * es, res + 10 * es, 1000},
                 {NULL, res + 1010 * es, 20000},
                 {buf + 21010 * es, NULL, 70000},
                 {buf + 91010 * es, buf + 91010 * es, 70000},
                 {buf + 161010 * es, res + 161010 * es, n - 161015},
                 {NULL, NULL, 5}};
  memcpy(sg, l, sizeof l);
  size_t at = 0;
  for (size_t k = 0; k < sizeof l / sizeof l[0]; k++) {
    if (l[k].src)
      memcpy(pk + at * es, l[k].src, l[k].count * es);
    else
      memset(pk + at * es, 0, l[k].count * es);
    at += l[k].count;
  }
  return sizeof l / sizeof l[0];
}

/* Where element i of the segmented result is, or NULL when not wanted. */
static const char *seg_result(gs__dtype dt, const char *buf, const char *res, size_t n, size_t i) {
  size_t es = gs__dtype_size(dt);
  if (i < 7 || (i >= 91010 && i < 161010)) return buf + i * es;
  if ((i >= 7 && i < 10) || (i >= 21010 && i < 91010) || i >= n - 5) return NULL;
  return res + i * es;
}

static void seg_record(rank_ctx *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void seg_record(rank_ctx *rc, const char *fmt, ...) {
  if (rc->bad++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rc->err[0], sizeof rc->err[0], fmt, ap);
  va_end(ap);
}

/* Every dtype and op (postscaled: sum and average): the segmented allreduce gives
 * the bits of the packed one (which test_every_dtype_and_op checks against
 * the reference; checked here too when unscaled), 16-bit floats (reduced in
 * a float32 workspace, allgathered in 16 bits) and deterministic rings
 * included. Then the same collective with rank 1
 * joined (every member NULL: zeros, nothing wanted) and rank 2 on the packed path, side by side
 * with segmented ranks: the bytes on the wire are the same. */
static void body_segments(rank_ctx *rc) {
  int n_ranks = rc->j->size, me = rc->rank;
  size_t n = SEG_N;
  char *buf = malloc(n * 8), *res = malloc(n * 8), *pk = malloc(n * 8), *want = malloc(n * 8);
  gs__seg sg[9];
  char err[1024];
  for (int mixed = 0; mixed < 2 && !rc->bad; mixed++)
    for (int scaled = 0; scaled < 2 && !rc->bad; scaled++)
      for (gs__dtype dt = 0; dt < GS__DTYPE_COUNT && !rc->bad; dt++)
        for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT && !rc->bad; op++) {
          /* kept small for valgrind: every op plain, the postscale with
           * sum and average, the mixed job with sum and max; deterministic
           * rings (whose arithmetic is the packed path's, cut at the
           * members) sum and average plain, average postscaled, sum mixed */
          if (scaled && op != GS__SUM && op != GS__AVERAGE) continue;
          if (mixed && (scaled || (op != GS__SUM && op != GS__MAX))) continue;
          if (rc->j->deterministic && op != GS__AVERAGE && (op != GS__SUM || scaled)) continue;
          size_t es = gs__dtype_size(dt);
          double factor = scaled ? 0.37 : 1.0;
          int joined = mixed && me == 1, packs = mixed && me == 2;
          /* the packed reference collective: every rank's packed layout */
          fill_input(dt, op, me, buf, n);
          size_t nseg = seg_layout(dt, buf, res, n, sg, pk);
          if (joined) memset(pk, 0, n * es);
          int st = rc->b->v->allreduce_scaled(rc->b, pk, n, dt, op, factor, err, sizeof err);
          if (st) {
            seg_record(rc, "rank %d: packed %s %s failed: %s", me, gs__dtype_name(dt),
                       gs__reduce_op_name(op), err);
            break;
          }
          memcpy(want, pk, n * es);
          if (!scaled && !mixed) { /* the packed path against the reference */
            char *ref = malloc(n * es);
            reference(dt, op, n_ranks, ref, n);
            for (size_t i = 0; i < n; i++) {
              int pad = (i >= 7 && i < 10) || (i >= 1010 && i < 21010) || i >= n - 5;
              if (!pad && memcmp(ref + i * es, want + i * es, es))
                seg_record(rc, "rank %d: packed %s %s element %zu differs from the reference", me,
                           gs__dtype_name(dt), gs__reduce_op_name(op), i);
            }
            free(ref);
          }
          /* the segmented collective */
          fill_input(dt, op, me, buf, n);
          memset(res, 0x5a, n * es);
          seg_layout(dt, buf, res, n, sg, pk);
          if (joined) memset(pk, 0, n * es);
          if (packs) {
            st = rc->b->v->allreduce_scaled(rc->b, pk, n, dt, op, factor, err, sizeof err);
            if (st == GS__OK && memcmp(pk, want, n * es))
              seg_record(rc, "rank %d: packed %s %s beside segmented ranks: wrong result", me,
                         gs__dtype_name(dt), gs__reduce_op_name(op));
            continue;
          }
          if (joined)
            for (size_t k = 0; k < nseg; k++) sg[k].src = sg[k].dst = NULL;
          st = rc->b->v->allreduce_segs(rc->b, sg, nseg, dt, op, factor, err, sizeof err);
          if (st) {
            seg_record(rc, "rank %d: allreduce_segs %s %s failed: %s", me, gs__dtype_name(dt),
                       gs__reduce_op_name(op), err);
            break;
          }
          for (size_t i = 0; i < n && !joined; i++) {
            const char *got = seg_result(dt, buf, res, n, i);
            if (got && memcmp(got, want + i * es, es)) {
              seg_record(rc,
                         "rank %d of %d: allreduce_segs%s%s %s %s: element %zu differs from the "
                         "packed allreduce",
                         me, n_ranks, scaled ? " (postscale 0.37)" : "",
                         mixed ? " beside a joined and a packing rank" : "", gs__dtype_name(dt),
                         gs__reduce_op_name(op), i);
              break;
            }
          }
        }
  free(buf);
  free(res);
  free(pk);
  free(want);
}

/* Small fused allreduces (up to ONE_CHUNK_BYTES, moved as one chunk):
 * the segmented path gives the same bits as the packed one, for float32
 * sums whose value depends on the order, and for float16 (reduced in a
 * float32 workspace), with padding and an in-place member. */
static void body_small_segments(rank_ctx *rc) {
  enum { N = 105 };
  for (int half = 0; half < 2; half++) {
    gs__dtype dt = half ? GS__FLOAT16 : GS__FLOAT32;
    size_t es = gs__dtype_size(dt);
    char pk[N * 4], buf[N * 4], res[N * 4];
    for (size_t i = 0; i < N; i++) {
      float v = 0.1f * (float)(rc->rank + 1) + 1e-3f * (float)i;
      if (half)
        ((uint16_t *)buf)[i] = gs__float_to_half(v);
      else
        ((float *)buf)[i] = v;
    }
    memcpy(pk, buf, sizeof pk);
    memset(pk + 3 * es, 0, 2 * es); /* the padding, packed */
    int st = rc->b->v->allreduce_scaled(rc->b, pk, N, dt, GS__AVERAGE, 0.5, rc->err[0], 1024);
    gs__seg sg[3] = {{buf, buf, 3}, {NULL, NULL, 2}, {buf + 5 * es, res + 5 * es, N - 5}};
    if (st == GS__OK)
      st = rc->b->v->allreduce_segs(rc->b, sg, 3, dt, GS__AVERAGE, 0.5, rc->err[0], 1024);
    if (st != GS__OK) {
      rc->bad++;
      return;
    }
    if (memcmp(buf, pk, 3 * es) || memcmp(res + 5 * es, pk + 5 * es, (N - 5) * es)) {
      snprintf(rc->err[0], 1024, "rank %d: %s: segmented result differs from the packed one",
               rc->rank, gs__dtype_name(dt));
      rc->bad++;
      return;
    }
  }
}

static void test_small_segments(void **state) {
  (void)state;
  for (int np = 2; np <= 4; np++) {
    job j = {.size = np, .body = body_small_segments};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    for (int r = 0; r < np; r++)
      if (rcs[r].bad) fail_msg("np %d: %s", np, rcs[r].err[0]);
    free_job(&j, rcs);
  }
}

static void test_segments(void **state) {
  (void)state;
  /* plain rings, then a deterministic one (rank-order exchange and gather
   * over the members; with relays at 3 ranks) */
  static const int sizes[] = {1, 2, 3, 3}, dets[] = {0, 0, 0, 1};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    job j = {.size = sizes[s], .body = body_segments, .deterministic = dets[s]};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    for (int r = 0; r < j.size; r++)
      if (rcs[r].bad)
        fail_msg("size %d%s: %s", j.size, dets[s] ? " (deterministic)" : "", rcs[r].err[0]);
    free_job(&j, rcs);
  }
}

/* Real-valued data whose sum depends on the order of additions: every rank
 * must still end with the same bits (each chunk reduced once, then copied). */
static void body_bitwise(rank_ctx *rc) {
  static const gs__dtype dts[] = {GS__FLOAT32, GS__FLOAT16, GS__BFLOAT16, GS__FLOAT64};
  size_t count = 100003;
  for (int k = 0; k < 4; k++) {
    size_t es = gs__dtype_size(dts[k]);
    uint8_t *buf = malloc(count * es);
    uint32_t x = 2463534242u + (uint32_t)rc->rank * 7919u;
    for (size_t i = 0; i < count; i++) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      store(dts[k], buf, i, (double)x / 4294967296.0 * 2e3 - 1e3, 0);
    }
    rc->rc[k] = rc->b->v->allreduce(rc->b, buf, count, dts[k], k % 2 ? GS__AVERAGE : GS__SUM,
                                    rc->err[k], sizeof rc->err[k]);
    rc->out[k] = buf;
    rc->out_len[k] = count * es;
  }
}

static void test_bitwise_identical(void **state) {
  (void)state;
  static const int sizes[] = {3, 4};
  for (size_t s = 0; s < 2; s++) {
    job j = {.size = sizes[s], .body = body_bitwise};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    check_all_ok_and_equal(&j, rcs, 4);
    free_job(&j, rcs);
  }
}

/* ---- deterministic mode ------------------------------------------------------ */

#define DET_COUNT 100003
static const gs__dtype k_det_dts[] = {GS__FLOAT32, GS__FLOAT16, GS__BFLOAT16, GS__FLOAT64};

/* Rank r's input: real values of mixed magnitudes, so that the order of
 * the additions shows in the last bits. */
static void det_input(gs__dtype dt, int r, void *buf, size_t count) {
  uint32_t x = 2463534242u + (uint32_t)r * 7919u;
  for (size_t i = 0; i < count; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    double v = (double)x / 4294967296.0 * 2e3 - 1e3;
    store(dt, buf, i, (i % 3) ? v : v * 1e-4, 0);
  }
}

/* The rank-order reference: ((x0 + x1) + x2) + ..., divided, scaled. */
static void det_reference(gs__dtype dt, int n, int divisor, double factor, void *out,
                          size_t count) {
  size_t es = gs__dtype_size(dt);
  if (n < 1) return;
  void **in = calloc((size_t)n, sizeof *in);
  for (int r = 0; r < n; r++) {
    in[r] = malloc(count * es);
    det_input(dt, r, in[r], count);
  }
  for (size_t i = 0; i < count; i++) {
    if (dt == GS__FLOAT32) {
      volatile float acc = ((float *)in[0])[i];
      for (int r = 1; r < n; r++) acc = acc + ((float *)in[r])[i];
      acc = acc / (float)divisor;
      acc = acc * (float)factor;
      ((float *)out)[i] = acc;
    } else if (dt == GS__FLOAT64) {
      volatile double acc = ((double *)in[0])[i];
      for (int r = 1; r < n; r++) acc = acc + ((double *)in[r])[i];
      acc = acc / (double)divisor;
      acc = acc * factor;
      ((double *)out)[i] = acc;
    } else { /* 16-bit: float32 accumulation, rounded once, then scaled */
      volatile float acc = 0;
      for (int r = 0; r < n; r++) {
        uint16_t h = ((uint16_t *)in[r])[i];
        float f = dt == GS__FLOAT16 ? gs__half_to_float(h) : gs__bf16_to_float(h);
        acc = r ? acc + f : f;
      }
      acc = acc / (float)divisor;
      uint16_t h = dt == GS__FLOAT16 ? gs__float_to_half(acc) : gs__float_to_bf16(acc);
      if (factor != 1.0) {
        float f = dt == GS__FLOAT16 ? gs__half_to_float(h) : gs__bf16_to_float(h);
        f *= (float)factor;
        h = dt == GS__FLOAT16 ? gs__float_to_half(f) : gs__float_to_bf16(f);
      }
      ((uint16_t *)out)[i] = h;
    }
  }
  for (int r = 0; r < n; r++) free(in[r]);
  free(in);
}

/* Per dtype: the whole buffer as one sum, then (as if fused differently)
 * a slice of it at another offset as an average with a postscale; both
 * must be the rank-order reference, bit for bit. */
static void body_deterministic(rank_ctx *rc) {
  for (int k = 0; k < 4; k++) {
    gs__dtype dt = k_det_dts[k];
    size_t es = gs__dtype_size(dt), lo = 4999, m = 50001;
    uint8_t *buf = malloc(DET_COUNT * es), *slice = malloc(m * es);
    det_input(dt, rc->rank, buf, DET_COUNT);
    memcpy(slice, buf + lo * es, m * es);
    rc->rc[2 * k] = rc->b->v->allreduce(rc->b, buf, DET_COUNT, dt, GS__SUM, rc->err[2 * k],
                                        sizeof rc->err[2 * k]);
    rc->rc[2 * k + 1] = rc->b->v->allreduce_scaled(rc->b, slice, m, dt, GS__AVERAGE, 0.37,
                                                   rc->err[2 * k + 1], sizeof rc->err[2 * k + 1]);
    rc->out[2 * k] = buf;
    rc->out_len[2 * k] = DET_COUNT * es;
    rc->out[2 * k + 1] = slice;
    rc->out_len[2 * k + 1] = m * es;
  }
}

static void test_deterministic_rank_order(void **state) {
  (void)state;
  static const int sizes[] = {2, 3, 4};
  for (size_t s = 0; s < 3; s++) {
    job j = {.size = sizes[s], .body = body_deterministic, .deterministic = 1};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    check_all_ok_and_equal(&j, rcs, 8);
    for (int k = 0; k < 4; k++) {
      gs__dtype dt = k_det_dts[k];
      size_t es = gs__dtype_size(dt), lo = 4999, m = 50001;
      uint8_t *want = malloc(DET_COUNT * es);
      det_reference(dt, j.size, 1, 1.0, want, DET_COUNT);
      if (memcmp(rcs[0].out[2 * k], want, DET_COUNT * es) != 0)
        fail_msg("size %d %s sum: not the rank-order sum", j.size, gs__dtype_name(dt));
      det_reference(dt, j.size, j.size, 0.37, want, DET_COUNT);
      if (memcmp(rcs[0].out[2 * k + 1], want + lo * es, m * es) != 0)
        fail_msg("size %d %s average of a slice: not the rank-order average", j.size,
                 gs__dtype_name(dt));
      free(want);
    }
    free_job(&j, rcs);
  }
}

static void body_det_reducescatter(rank_ctx *rc) {
  int n = rc->j->size;
  size_t counts[8] = {0};
  if (n < 1 || n > 8) {
    rc->bad++;
    return;
  }
  for (int q = 0; q < n; q++) counts[q] = q == 1 ? 0 : 1000 + (size_t)q * 37;
  size_t total = 0, start = 0;
  for (int q = 0; q < n; q++) {
    if (q < rc->rank) start += counts[q];
    total += counts[q];
  }
  float *buf = malloc(total * sizeof *buf);
  det_input(GS__FLOAT32, rc->rank, buf, total);
  rc->rc[0] = rc->b->v->reducescatter(rc->b, buf, counts, GS__FLOAT32, GS__AVERAGE, rc->err[0],
                                      sizeof rc->err[0]);
  float *want = malloc(total * sizeof *want);
  det_reference(GS__FLOAT32, n, n, 1.0, want, total);
  if (memcmp(buf + start, want + start, counts[rc->rank] * sizeof *buf) != 0) rc->bad++;
  free(want);
  free(buf);
}

static void test_deterministic_reducescatter(void **state) {
  (void)state;
  for (int n = 3; n <= 4; n++) {
    job j = {.size = n, .body = body_det_reducescatter, .deterministic = 1};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    for (int r = 0; r < n; r++) {
      if (rcs[r].rc[0] != GS__OK) fail_msg("rank %d: %s", r, rcs[r].err[0]);
      if (rcs[r].bad) fail_msg("size %d rank %d: its block is not the rank-order average", n, r);
    }
    free_job(&j, rcs);
  }
}

/* ---- reducescatter ------------------------------------------------------------- */

/* Uneven blocks summing to DT_COUNT, some empty. */
static void rs_counts(int n, size_t *counts) {
  static const size_t c4[] = {300, 0, 501, 200}, c3[] = {0, 1000, 1}, c2[] = {500, 501};
  for (int q = 0; q < n; q++)
    counts[q] = n == 4 ? c4[q] : n == 3 ? c3[q] : n == 2 ? c2[q] : DT_COUNT;
}

static size_t rs_start(const size_t *counts, int rank) {
  size_t s = 0;
  for (int q = 0; q < rank; q++) s += counts[q];
  return s;
}

static void body_reducescatter(rank_ctx *rc) {
  int n = rc->j->size;
  size_t counts[8];
  rs_counts(n, counts);
  size_t start = rs_start(counts, rc->rank), mine = counts[rc->rank];
  for (gs__dtype dt = 0; dt < GS__DTYPE_COUNT; dt++) {
    size_t es = gs__dtype_size(dt);
    uint8_t *buf = malloc(DT_COUNT * es), *all = malloc(5 * DT_COUNT * es + 1);
    for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT; op++) {
      fill_input(dt, op, rc->rank, buf, DT_COUNT);
      int st = rc->b->v->reducescatter(rc->b, buf, counts, dt, op, rc->err[dt], 1024);
      if (st != GS__OK && rc->rc[dt] == GS__OK) rc->rc[dt] = st;
      memcpy(all + (size_t)op * mine * es, buf + start * es, mine * es);
    }
    rc->out[dt] = all;
    rc->out_len[dt] = 5 * mine * es;
    free(buf);
  }
  /* a large float32 sum: several segments per block */
  size_t big[8], total = 0;
  for (int q = 0; q < n; q++) total += big[q] = (size_t)(q + 1) * 300007;
  float *f = malloc(total * sizeof *f);
  for (size_t i = 0; i < total; i++) f[i] = sum_val(rc->rank, i);
  rc->rc[8] = rc->b->v->reducescatter(rc->b, f, big, GS__FLOAT32, GS__SUM, rc->err[8], 1024);
  size_t s0 = rs_start(big, rc->rank);
  for (size_t i = s0; i < s0 + big[rc->rank]; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += sum_val(r, i);
    if (f[i] != want) rc->bad++;
  }
  free(f);
}

static void test_reducescatter(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n++) {
    job j = {.size = n, .body = body_reducescatter};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    size_t counts[8];
    rs_counts(n, counts);
    for (int r = 0; r < n; r++) {
      for (int k = 0; k <= 8; k++)
        if (rcs[r].rc[k] != GS__OK)
          fail_msg("size %d rank %d: %s: %s", n, r, gs__status_name(rcs[r].rc[k]), rcs[r].err[k]);
      if (rcs[r].bad) fail_msg("size %d rank %d: %ld wrong elements", n, r, rcs[r].bad);
      size_t start = rs_start(counts, r), mine = counts[r];
      for (gs__dtype dt = 0; dt < GS__DTYPE_COUNT; dt++) {
        size_t es = gs__dtype_size(dt);
        uint8_t *want = malloc(DT_COUNT * es);
        for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT; op++) {
          reference(dt, op, n, want, DT_COUNT);
          const uint8_t *got = (const uint8_t *)rcs[r].out[dt] + (size_t)op * mine * es;
          if (mine && memcmp(got, want + start * es, mine * es) != 0)
            fail_msg("size %d rank %d: %s %s block differs from the reference", n, r,
                     gs__dtype_name(dt), gs__reduce_op_name(op));
        }
        free(want);
      }
    }
    free_job(&j, rcs);
  }
}

/* ---- alltoallv -------------------------------------------------------------------- */

static size_t a2a_bytes(int big, int o, int d) {
  if (big) return (size_t)(o + d + 1) * 300007;
  return (size_t)((o * 7 + d * 3) % 5) * 997; /* some blocks empty */
}

static uint8_t a2a_byte(int o, int d, size_t i) {
  return (uint8_t)(o * 31 + d * 17 + i * 13 + (i >> 8));
}

static void body_alltoallv(rank_ctx *rc) {
  int n = rc->j->size, me = rc->rank;
  for (int big = 0; big < 2; big++) {
    size_t sb[8], rb[8], st = 0, rt = 0;
    for (int q = 0; q < n; q++) {
      st += sb[q] = a2a_bytes(big, me, q);
      rt += rb[q] = a2a_bytes(big, q, me);
    }
    uint8_t *send = malloc(st + 1), *recv = malloc(rt + 1);
    memset(recv, 0xee, rt + 1);
    size_t pos = 0;
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < sb[q]; i++) send[pos++] = a2a_byte(me, q, i);
    rc->rc[big] = rc->b->v->alltoallv(rc->b, send, sb, recv, rb, rc->err[big], 1024);
    pos = 0;
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < rb[q]; i++)
        if (recv[pos++] != a2a_byte(q, me, i)) rc->bad++;
    if (recv[rt] != 0xee) rc->bad++;
    free(send);
    free(recv);
  }
}

static void test_alltoallv(void **state) {
  (void)state;
  for (int n = 1; n <= 5; n++) {
    job j = {.size = n, .body = body_alltoallv};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    for (int r = 0; r < n; r++) {
      for (int k = 0; k < 2; k++)
        if (rcs[r].rc[k] != GS__OK)
          fail_msg("size %d rank %d: %s: %s", n, r, gs__status_name(rcs[r].rc[k]), rcs[r].err[k]);
      if (rcs[r].bad) fail_msg("size %d rank %d: %ld wrong bytes", n, r, rcs[r].bad);
    }
    free_job(&j, rcs);
  }
}

/* ---- allgatherv ----------------------------------------------------------------- */

typedef struct gather_case {
  size_t bytes[8];
  int in_place;
} gather_case;

static uint8_t gather_byte(int r, size_t i) {
  return (uint8_t)(r * 41 + i * 7 + (i >> 9));
}

static void body_allgatherv(rank_ctx *rc) {
  const gather_case *cases = rc->j->user;
  int n = rc->j->size;
  for (int k = 0; cases[k].bytes[0] != (size_t)-1; k++) {
    const size_t *bytes = cases[k].bytes;
    size_t total = 0, off = 0;
    for (int r = 0; r < n; r++) {
      if (r == rc->rank) off = total;
      total += bytes[r];
    }
    uint8_t *recv = malloc(total + 1);
    uint8_t *mine = malloc(bytes[rc->rank] + 1);
    memset(recv, 0xee, total + 1);
    uint8_t *send = cases[k].in_place ? recv + off : mine;
    for (size_t i = 0; i < bytes[rc->rank]; i++) send[i] = gather_byte(rc->rank, i);
    rc->rc[k] = rc->b->v->allgatherv(rc->b, send, recv, bytes, rc->err[k], sizeof rc->err[k]);
    size_t pos = 0;
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < bytes[r]; i++, pos++)
        if (recv[pos] != gather_byte(r, i)) rc->bad++;
    if (recv[total] != 0xee) rc->bad++; /* nothing written past the end */
    free(mine);
    rc->out[k] = recv;
    rc->out_len[k] = total;
  }
}

static void test_allgatherv(void **state) {
  (void)state;
  const size_t E = (size_t)-1;
  gather_case four[] = {
      {{5, 0, 1000003, 17}, 0},
      {{5, 0, 1000003, 17}, 1},
      {{0, 0, 0, 0}, 0},
      {{0, 3, 0, 0}, 1},
      {{1 << 20, 1 << 20, 1 << 20, 1 << 20}, 1},
      {{E}, 0},
  };
  job j = {.size = 4, .body = body_allgatherv, .user = four};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  check_all_ok_and_equal(&j, rcs, 5);
  free_job(&j, rcs);

  gather_case three[] = {{{0, 7, 0}, 0}, {{300000, 1, 0}, 0}, {{E}, 0}};
  job j3 = {.size = 3, .body = body_allgatherv, .user = three};
  rcs = run_job(&j3);
  assert_created(&j3, rcs);
  check_all_ok_and_equal(&j3, rcs, 2);
  free_job(&j3, rcs);

  gather_case one[] = {{{12}, 0}, {{12}, 1}, {{0}, 0}, {{E}, 0}};
  job j1 = {.size = 1, .body = body_allgatherv, .user = one};
  rcs = run_job(&j1);
  assert_created(&j1, rcs);
  check_all_ok_and_equal(&j1, rcs, 3);
  free_job(&j1, rcs);
}

/* ---- broadcast -------------------------------------------------------------------- */

typedef struct bcast_case {
  size_t len;
  int root;
} bcast_case;

static void body_broadcast(rank_ctx *rc) {
  const bcast_case *cases = rc->j->user;
  for (int k = 0; cases[k].root >= 0; k++) {
    size_t len = cases[k].len;
    uint8_t *buf = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
      buf[i] = rc->rank == cases[k].root ? (uint8_t)(i * 13 + (i >> 8) + 1) : 0;
    rc->rc[k] = rc->b->v->broadcast(rc->b, buf, len, cases[k].root, rc->err[k], sizeof rc->err[k]);
    for (size_t i = 0; i < len; i++)
      if (buf[i] != (uint8_t)(i * 13 + (i >> 8) + 1)) rc->bad++;
    rc->out[k] = buf;
    rc->out_len[k] = len;
  }
}

static void test_broadcast(void **state) {
  (void)state;
  bcast_case c4[] = {{(3u << 20) + 5, 2}, {1, 3}, {0, 1}, {100, 0}, {0, -1}};
  job j = {.size = 4, .body = body_broadcast, .user = c4};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  check_all_ok_and_equal(&j, rcs, 4);
  free_job(&j, rcs);

  bcast_case c2[] = {{1 << 20, 1}, {7, 0}, {0, -1}};
  job j2 = {.size = 2, .body = body_broadcast, .user = c2};
  rcs = run_job(&j2);
  assert_created(&j2, rcs);
  check_all_ok_and_equal(&j2, rcs, 2);
  free_job(&j2, rcs);

  bcast_case c1[] = {{9, 0}, {0, -1}};
  job j1 = {.size = 1, .body = body_broadcast, .user = c1};
  rcs = run_job(&j1);
  assert_created(&j1, rcs);
  check_all_ok_and_equal(&j1, rcs, 1);
  free_job(&j1, rcs);
}

/* ---- a mix of collectives back to back on one ring -------------------------------- */

static void body_mixed(rank_ctx *rc) {
  int n = rc->j->size, k = 0;
  for (int round = 0; round < 3; round++) {
    size_t count = 4099 + (size_t)round * 77777;
    int32_t *a = malloc(count * sizeof *a);
    for (size_t i = 0; i < count; i++) a[i] = (int32_t)(i + (size_t)rc->rank);
    rc->rc[k] = rc->b->v->allreduce(rc->b, a, count, GS__INT32, GS__MAX, rc->err[k], 1024);
    for (size_t i = 0; i < count; i++)
      if (a[i] != (int32_t)(i + (size_t)n - 1)) rc->bad++;
    free(a);
    k++;

    size_t bytes[8];
    for (int r = 0; r < n; r++) bytes[r] = (size_t)(r * 1000 + round);
    size_t total = 0;
    for (int r = 0; r < n; r++) total += bytes[r];
    uint8_t *g = malloc(total + 1), *mine = malloc(bytes[rc->rank] + 1);
    memset(mine, rc->rank + 1, bytes[rc->rank]);
    rc->rc[k] = rc->b->v->allgatherv(rc->b, mine, g, bytes, rc->err[k], 1024);
    size_t pos = 0;
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < bytes[r]; i++)
        if (g[pos++] != r + 1) rc->bad++;
    free(g), free(mine);
    k++;

    int root = (round + 1) % n;
    size_t len = 50000 + (size_t)round;
    uint8_t *bb = malloc(len);
    memset(bb, rc->rank == root ? 0x5a : 0, len);
    rc->rc[k] = rc->b->v->broadcast(rc->b, bb, len, root, rc->err[k], 1024);
    for (size_t i = 0; i < len; i++)
      if (bb[i] != 0x5a) rc->bad++;
    free(bb);
    k++;
  }
}

static void test_mixed_sequence(void **state) {
  (void)state;
  job j = {.size = 3, .body = body_mixed, .advertise = "127.0.0.1"};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  check_all_ok_and_equal(&j, rcs, 9);
  free_job(&j, rcs);
}

/* ---- rendezvous --------------------------------------------------------------------- */

static void body_read_keys(rank_ctx *rc) {
  char key[128];
  snprintf(key, sizeof key, "%sring/addr/%d", rc->j->prefix, rc->rank);
  rc->out[0] = kv_lookup(key);
  rc->out_len[0] = 0;
}

static void test_published_address(void **state) {
  (void)state;
  job j = {.size = 2, .body = body_read_keys};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  for (int r = 0; r < 2; r++) {
    const char *v = rcs[r].out[0];
    assert_non_null(v);
    /* the local address toward the coordinator (127.0.0.1:9) is loopback */
    assert_true(strncmp(v, "127.0.0.1:", 10) == 0);
    assert_true(atoi(v + 10) > 0);
  }
  assert_string_not_equal((char *)rcs[0].out[0], (char *)rcs[1].out[0]);
  free_job(&j, rcs);
}

/* ---- membership proof (HMAC challenge-response) ---------------------------- */

typedef struct rogue_result {
  char prefix[64];
  int refused_old_hello; /* the old public hello got no answer, only a close */
  int challenged;        /* a well-formed hello got a 52-byte challenge */
  int dropped_bad_mac;   /* a wrong response was answered with a close */
  int dropped_silent;    /* a silent connection was closed */
} rogue_result;

static void put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Connects to host:port (blocking, 5 s receive timeout). */
static int rogue_connect(const char *addr) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &sin.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Reads until n bytes, EOF or the timeout. Returns what it got, or -1
 * when the peer neither sent that much nor closed (timeout). */
static int rogue_read(int fd, unsigned char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = recv(fd, buf + got, n - got, 0);
    if (k == 0) break;
    if (k < 0) return -1;
    got += (size_t)k;
  }
  return (int)got;
}

/* Plays a process that read rank 1's ring address and connects to it
 * claiming to be rank 0, while the real rank 0 is held back; then lets
 * rank 0 go on. */
static void *rogue_main(void *arg) {
  rogue_result *res = arg;
  char key[128], *addr = NULL;
  snprintf(key, sizeof key, "%sring/addr/1", res->prefix);
  for (int i = 0; i < 1000 && !(addr = kv_lookup(key)); i++) poll(NULL, 0, 10);
  if (addr) {
    unsigned char buf[64];
    int fd = rogue_connect(addr); /* 1: the old hello, a hash of a public string */
    put32(buf, 0x47535247u), put32(buf + 4, 1), put32(buf + 8, 0), put32(buf + 12, 2);
    put32(buf + 16, 0);
    if (fd >= 0 && send(fd, buf, 20, 0) == 20) res->refused_old_hello = rogue_read(fd, buf, 8) == 0;
    if (fd >= 0) close(fd);
    fd = rogue_connect(addr); /* 2: a well-formed hello, then a wrong MAC */
    put32(buf, 0x47535248u), put32(buf + 4, 2), put32(buf + 8, 0), put32(buf + 12, 2);
    memset(buf + 16, 7, 16);
    if (fd >= 0 && send(fd, buf, 32, 0) == 32) {
      res->challenged = rogue_read(fd, buf, 52) == 52 && memcmp(buf, "GSRC", 4) == 0;
      put32(buf, 0x47535250u);
      memset(buf + 4, 0x5a, 32);
      if (send(fd, buf, 36, 0) == 36) res->dropped_bad_mac = rogue_read(fd, buf, 8) == 0;
    }
    if (fd >= 0) close(fd);
    fd = rogue_connect(addr); /* 3: silent */
    if (fd >= 0) res->dropped_silent = rogue_read(fd, buf, 8) == 0;
    if (fd >= 0) close(fd);
  }
  free(addr);
  pthread_mutex_lock(&g_kv_mu);
  g_gate_open = 1;
  pthread_cond_broadcast(&g_kv_cv);
  pthread_mutex_unlock(&g_kv_mu);
  return NULL;
}

static void body_sum_ranks(rank_ctx *rc) {
  float v[3] = {(float)rc->rank + 1, 10.0f * (rc->rank + 1), -1.0f};
  rc->rc[0] = rc->b->v->allreduce(rc->b, v, 3, GS__FLOAT32, GS__SUM, rc->err[0], 1024);
  rc->out[0] = malloc(sizeof v);
  memcpy(rc->out[0], v, sizeof v);
}

static void test_rogue_connection_dropped(void **state) {
  (void)state;
  /* rank 0 is held back before it reads rank 1's address, so rank 1 waits
   * for its left neighbour while a rogue connects to its ring port */
  rogue_result res;
  memset(&res, 0, sizeof res);
  snprintf(res.prefix, sizeof res.prefix, "job%d/", g_job_seq + 1);
  pthread_mutex_lock(&g_kv_mu);
  snprintf(g_gate_key, sizeof g_gate_key, "%sring/addr/1", res.prefix);
  g_gate_open = 0;
  pthread_mutex_unlock(&g_kv_mu);
  pthread_t rogue;
  assert_int_equal(pthread_create(&rogue, NULL, rogue_main, &res), 0);
  job j = {.size = 2, .body = body_sum_ranks};
  rank_ctx *rcs = run_job(&j);
  pthread_join(rogue, NULL);
  assert_true(res.refused_old_hello);
  assert_true(res.challenged);
  assert_true(res.dropped_bad_mac);
  assert_true(res.dropped_silent);
  assert_created(&j, rcs);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(rcs[r].rc[0], GS__OK);
    const float *v = rcs[r].out[0];
    assert_true(v[0] == 3.0f && v[1] == 30.0f && v[2] == -2.0f);
  }
  free_job(&j, rcs);
}

static void test_wrong_ring_key(void **state) {
  (void)state;
  /* rank 1 holds another job's key: neither side accepts the other */
  static const uint8_t keys[2][GS__SECRET_BYTES] = {"key of the job ................",
                                                    "key of another job ............."};
  job j = {.size = 2, .connect_timeout_ms = 3000, .keys = keys};
  rank_ctx *rcs = run_job(&j);
  int proof = 0;
  for (int r = 0; r < 2; r++) {
    print_message("rank %d: %s\n", r, rcs[r].create_err);
    assert_int_equal(rcs[r].create_rc, GS__ERR_DATA_PLANE);
    proof += strstr(rcs[r].create_err, "did not prove membership") != NULL;
  }
  assert_true(proof >= 1);
  free_job(&j, rcs);
}

/* n consecutive ports of 127.0.0.1 that nothing holds now (each binds
 * without SO_REUSEADDR, so a listener, a connection or a TIME_WAIT on it
 * counts as taken), below the kernel's ephemeral ports, from a pid-derived
 * start so that two test runs on one machine rarely look at the same ones.
 * Returns the first port. */
static int free_range(int n) {
  static int next;
  if (!next) next = 20000 + (int)(getpid() % 600) * 20;
  for (int tries = 0; tries < 600; tries++) {
    int base = next, ok = 1;
    next += n;
    if (next + n > 32000) next = 20000;
    for (int k = 0; k < n && ok; k++) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      struct sockaddr_in sin = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)(base + k)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
      assert_true(fd >= 0);
      ok = bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0;
      close(fd);
    }
    if (ok) return base;
  }
  fail_msg("no %d free consecutive ports of 127.0.0.1 in 20000-31999", n);
  return -1;
}

/* Every rank of j published "<host>:<port>" with port in [lo, hi]. */
static void expect_published(const job *j, const char *host, int lo, int hi) {
  for (int r = 0; r < j->size; r++) {
    char key[128], want[64];
    snprintf(key, sizeof key, "%sring/addr/%d", j->prefix, r);
    snprintf(want, sizeof want, "%s:", host);
    char *v = kv_lookup(key);
    assert_non_null(v);
    assert_true(strncmp(v, want, strlen(want)) == 0);
    int port = atoi(v + strlen(want));
    assert_true(port >= lo && port <= hi);
    free(v);
  }
}

static void test_data_addr_and_port_range(void **state) {
  (void)state;
  /* a range exactly as wide as the job: every rank starts at its bottom at
   * once, and each must still end on a port of its own (two sockets may bind
   * one port before either listens); a few jobs, to give that race a chance */
  for (int round = 0; round < 4; round++) {
    int lo = free_range(3), hi = lo + 2;
    job j = {.size = 3, .body = body_mixed, .data_addr = "127.0.0.1", .port_lo = lo, .port_hi = hi};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    check_all_ok_and_equal(&j, rcs, 9);
    /* bound to and advertised as GRADSYNC_DATA_ADDR, on a port of the range */
    expect_published(&j, "127.0.0.1", lo, hi);
    free_job(&j, rcs);
  }
}

static void test_port_range_in_use(void **state) {
  (void)state;
  /* a listener holds the only port of the range: the ring says so at once */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sin;
  assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof sin), 0);
  assert_int_equal(listen(fd, 4), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
  int port = ntohs(sin.sin_port);
  job j = {.size = 2, .data_addr = "127.0.0.1", .port_lo = port, .port_hi = port};
  rank_ctx *rcs = run_job(&j);
  char want[160];
  snprintf(want, sizeof want, "every port of GRADSYNC_DATA_PORT_RANGE=%d-%d is in use", port, port);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(rcs[r].create_rc, GS__ERR_DATA_PLANE);
    assert_non_null(strstr(rcs[r].create_err, want));
  }
  free_job(&j, rcs);
  close(fd);
}

static void test_ipv6_ring(void **state) {
  (void)state;
  int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in6 s6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  if (probe < 0 || bind(probe, (struct sockaddr *)&s6, sizeof s6) != 0) {
    if (probe >= 0) close(probe);
    skip(); /* no IPv6 loopback here */
  }
  close(probe);
  /* the coordinator is an IPv6 address: ranks advertise [::1]:PORT */
  job j = {.size = 3, .body = body_mixed, .coordinator = "[::1]:9"};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  check_all_ok_and_equal(&j, rcs, 9);
  expect_published(&j, "[::1]", 1, 65535);
  free_job(&j, rcs);
}

static void test_rendezvous_missing_rank(void **state) {
  (void)state;
  /* rank 2 of 3 never starts: both others fail in bounded time naming it */
  job j = {.size = 3, .started = 2, .connect_timeout_ms = 300};
  double t0 = now_s();
  rank_ctx *rcs = run_job(&j);
  double dt = now_s() - t0;
  for (int r = 0; r < 2; r++) {
    print_message("rank %d: %s\n", r, rcs[r].create_err);
    assert_int_equal(rcs[r].create_rc, GS__ERR_DATA_PLANE);
    assert_non_null(strstr(rcs[r].create_err, "rank 2"));
    assert_non_null(strstr(rcs[r].create_err, "300 ms"));
  }
  assert_true(dt < 10);
  free_job(&j, rcs);
}

/* ---- failures ------------------------------------------------------------------------ */

#define BIG_COUNT (4u << 20)

static void body_peer_dies(rank_ctx *rc) {
  if (rc->rank == 2) {
    /* let the others start their allreduce, then vanish (destroy closes) */
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    return;
  }
  float *buf = calloc(BIG_COUNT, sizeof *buf);
  double t0 = now_s();
  rc->rc[0] = rc->b->v->allreduce(rc->b, buf, BIG_COUNT, GS__FLOAT32, GS__SUM, rc->err[0], 1024);
  rc->secs[0] = now_s() - t0;
  /* the ring is out of step now: later calls fail at once */
  rc->rc[1] = rc->b->v->allreduce(rc->b, buf, 1, GS__FLOAT32, GS__SUM, rc->err[1], 1024);
  free(buf);
}

static void test_peer_dies(void **state) {
  (void)state;
  job j = {.size = 3, .body = body_peer_dies};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  for (int r = 0; r < 2; r++) {
    if (rcs[r].rc[0] != GS__ERR_DATA_PLANE)
      fail_msg("rank %d: want GS_ERR_DATA_PLANE, got %s: %s", r, gs__status_name(rcs[r].rc[0]),
               rcs[r].err[0]);
    print_message("rank %d: %s\n", r, rcs[r].err[0]);
    /* rank 1 sees rank 2's reset; rank 0 sees either rank 2's close or
     * rank 1's notice that it lost rank 2, whichever comes first */
    assert_non_null(strstr(rcs[r].err[0], "lost its connection to rank 2"));
    assert_non_null(strstr(rcs[r].err[0], "(127.0.0.1:"));
    assert_non_null(strstr(rcs[r].err[0], "allreduce"));
    assert_non_null(strstr(rcs[r].err[0], "check its log"));
    if (r == 1) assert_non_null(strstr(rcs[r].err[0], "to rank 2 (127.0.0.1:"));
    /* failed because of the close, not the 20 s io timeout */
    assert_true(rcs[r].secs[0] < 10);
    assert_int_equal(rcs[r].rc[1], GS__ERR_DATA_PLANE);
    assert_non_null(strstr(rcs[r].err[1], "earlier collective failed"));
  }
  free_job(&j, rcs);
}

/* A rank that gives up tells its neighbours at once: the left one gets a
 * notice naming the culprit, the right one reads a close. */
static void body_one_aborts(rank_ctx *rc) {
  float buf[1000] = {0};
  if (rc->rank == 2) {
    rc->b->v->abort(rc->b);
    rc->rc[0] = rc->b->v->allreduce(rc->b, buf, 1000, GS__FLOAT32, GS__SUM, rc->err[0], 1024);
    wait_done(rc, 2); /* keep the sockets open: the others must not see a close */
    return;
  }
  double t0 = now_s();
  rc->rc[0] = rc->b->v->allreduce(rc->b, buf, 1000, GS__FLOAT32, GS__SUM, rc->err[0], 1024);
  rc->secs[0] = now_s() - t0;
}

static void test_failure_reaches_neighbours(void **state) {
  (void)state;
  job j = {.size = 3, .body = body_one_aborts};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  assert_int_equal(rcs[2].rc[0], GS__ERR_ABORTED);
  for (int r = 0; r < 2; r++) {
    print_message("rank %d: %s\n", r, rcs[r].err[0]);
    assert_int_equal(rcs[r].rc[0], GS__ERR_DATA_PLANE);
    assert_true(rcs[r].secs[0] < 10); /* not the 20 s io timeout */
  }
  /* rank 1 hears it from rank 2 itself */
  assert_non_null(strstr(rcs[1].err[0], "stopped allreduce on news from rank 2 (127.0.0.1:"));
  assert_non_null(strstr(rcs[1].err[0], "rank 2 aborted"));
  /* rank 0 reads rank 2's close, or rank 1 passing the news on */
  const char *e0 = rcs[0].err[0];
  if (!strstr(e0, "lost its connection to rank 2 (127.0.0.1:") &&
      !(strstr(e0, "on news from rank 1 (127.0.0.1:") && strstr(e0, "rank 2 aborted")))
    fail_msg("rank 0 does not name rank 2: %s", e0);
  free_job(&j, rcs);
}

typedef struct abort_arg {
  gs__backend *b;
  int delay_ms;
} abort_arg;

static void *abort_later(void *p) {
  abort_arg *a = p;
  struct timespec ts = {0, a->delay_ms * 1000000L};
  nanosleep(&ts, NULL);
  a->b->v->abort(a->b);
  return NULL;
}

/* Rank 1 stays silent (connected, never calls a collective) until rank 0
 * is done; rank 0 blocks waiting for it. */
static void body_silent_peer(rank_ctx *rc) {
  if (rc->rank == 1) {
    wait_done(rc, 1);
    return;
  }
  int do_abort = rc->j->user != NULL;
  pthread_t th;
  abort_arg a = {rc->b, 100};
  if (do_abort) pthread_create(&th, NULL, abort_later, &a);
  float *buf = calloc(BIG_COUNT, sizeof *buf);
  double t0 = now_s();
  if (do_abort && strcmp(rc->j->user, "abort-segs") == 0) { /* a fused allreduce, unpacked */
    gs__seg sg[3] = {{buf, buf, BIG_COUNT / 2},
                     {NULL, NULL, 16},
                     {buf + BIG_COUNT / 2, buf + BIG_COUNT / 2, BIG_COUNT / 2 - 16}};
    rc->rc[0] =
        rc->b->v->allreduce_segs(rc->b, sg, 3, GS__FLOAT32, GS__AVERAGE, 1.0, rc->err[0], 1024);
  } else {
    rc->rc[0] = rc->b->v->allreduce(rc->b, buf, BIG_COUNT, GS__FLOAT32, GS__SUM, rc->err[0], 1024);
  }
  rc->secs[0] = now_s() - t0;
  if (do_abort) {
    pthread_join(th, NULL);
    t0 = now_s();
    rc->rc[1] = rc->b->v->allreduce(rc->b, buf, 8, GS__FLOAT32, GS__SUM, rc->err[1], 1024);
    rc->rc[2] = rc->b->v->broadcast(rc->b, buf, 8, 0, rc->err[2], 1024);
    size_t bytes[2] = {4, 4};
    rc->rc[3] = rc->b->v->allgatherv(rc->b, buf, buf, bytes, rc->err[3], 1024);
    rc->secs[1] = now_s() - t0;
    rc->b->v->abort(rc->b); /* idempotent */
  }
  free(buf);
}

static void test_abort_unblocks(void **state) {
  (void)state;
  /* a plain allreduce, then a segmented one (allreduce_segs) */
  static const char *const kinds[] = {"abort", "abort-segs"};
  for (int k0 = 0; k0 < 2; k0++) {
    job j = {
        .size = 2, .body = body_silent_peer, .user = (void *)kinds[k0], .io_timeout_ms = 30000};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    if (rcs[0].rc[0] != GS__ERR_ABORTED)
      fail_msg("%s: want GS_ERR_ABORTED, got %s: %s", kinds[k0], gs__status_name(rcs[0].rc[0]),
               rcs[0].err[0]);
    print_message("%s\n", rcs[0].err[0]);
    assert_non_null(strstr(rcs[0].err[0], "aborted"));
    assert_true(rcs[0].secs[0] < 10); /* promptly, not the 30 s timeout */
    for (int k = 1; k <= 3; k++) assert_int_equal(rcs[0].rc[k], GS__ERR_ABORTED);
    assert_true(rcs[0].secs[1] < 5);
    free_job(&j, rcs);
  }
}

static void test_io_timeout(void **state) {
  (void)state;
  job j = {.size = 2, .body = body_silent_peer, .io_timeout_ms = 200};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  if (rcs[0].rc[0] != GS__ERR_DATA_PLANE)
    fail_msg("want GS_ERR_DATA_PLANE, got %s: %s", gs__status_name(rcs[0].rc[0]), rcs[0].err[0]);
  const char *e = rcs[0].err[0];
  print_message("%s\n", e);
  assert_non_null(strstr(e, "rank 1 (127.0.0.1:"));
  assert_non_null(strstr(e, "200 ms"));
  assert_non_null(strstr(e, "GRADSYNC_DATA_TIMEOUT_MS"));
  assert_true(rcs[0].secs[0] >= 0.19);
  assert_true(rcs[0].secs[0] < 10);
  free_job(&j, rcs);
}

/* ---- agree: the fast round's MIN with no deadline until every rank entered ---------------- */

/* Rank r's byte i: the full range in pass 0, the 0/1 flags of a fast
 * round's vector in pass 1. */
static uint8_t agree_val(int pass, int r, size_t i) {
  if (pass == 1) return (i + (size_t)r) % 3 != 0;
  return (uint8_t)(i * 37 + (size_t)r * 101 + (i >> 3) * 11) ^ (uint8_t)(r * 29);
}

static const size_t k_agree_n[] = {1, 2, 3, 5, 7, 33, 1000, 4099, 9001};
#define NAGREE (sizeof k_agree_n / sizeof k_agree_n[0])

/* Every n of k_agree_n in both passes (rc[k] and err[k] for the first
 * failure of n k), then an allreduce: the ring must still be in step.
 * With user set, the last rank enters each agree late by that many ms. */
static void body_agree(rank_ctx *rc) {
  int n = rc->j->size, late_ms = rc->j->user ? *(int *)rc->j->user : 0;
  uint8_t *buf = malloc(9001);
  for (size_t k = 0; k < NAGREE; k++)
    for (int pass = 0; pass < 2; pass++) {
      size_t len = k_agree_n[k];
      for (size_t i = 0; i < len; i++) buf[i] = agree_val(pass, rc->rank, i);
      if (late_ms && rc->rank == n - 1 && k < 2) {
        struct timespec ts = {late_ms / 1000, (late_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
      }
      double t0 = now_s();
      int r = rc->b->v->agree(rc->b, buf, len, GS__UINT8, GS__MIN, rc->err[k], sizeof rc->err[k]);
      if (k < 2 && pass == 0) rc->secs[k] = now_s() - t0;
      if (r != GS__OK) {
        rc->rc[k] = r;
        goto out;
      }
      for (size_t i = 0; i < len; i++) {
        uint8_t want = 255;
        for (int q = 0; q < n; q++)
          if (agree_val(pass, q, i) < want) want = agree_val(pass, q, i);
        if (buf[i] != want) rc->bad++;
      }
    }
  /* The float32 SUM form (fast rounds with data riding along): exact sums
   * of small integers, one chunk and (3001 floats) several; the late rank
   * is late here too. A form that is not an agreement is refused before
   * anything moves, on every rank. */
  static const size_t flens[] = {1, 2, 3, 161, 3001};
  float *fv = malloc(3001 * sizeof *fv);
  for (size_t k = 0; k < sizeof flens / sizeof flens[0]; k++) {
    size_t len = flens[k];
    for (size_t i = 0; i < len; i++) fv[i] = (float)((i % 7) * 3 + (size_t)rc->rank * 5);
    if (late_ms && rc->rank == n - 1 && k == 0) {
      struct timespec ts = {late_ms / 1000, (late_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    int r = rc->b->v->agree(rc->b, fv, len, GS__FLOAT32, GS__SUM, rc->err[NAGREE], 1024);
    if (r != GS__OK) {
      rc->rc[NAGREE] = r;
      free(fv);
      goto out;
    }
    for (size_t i = 0; i < len; i++)
      if (fv[i] != (float)((i % 7) * 3 * (size_t)n + 5 * (size_t)(n * (n - 1) / 2))) rc->bad++;
  }
  if (rc->b->v->agree(rc->b, fv, 4, GS__INT32, GS__SUM, rc->err[NAGREE], 1024) !=
          GS__ERR_INVALID_ARG ||
      !strstr(rc->err[NAGREE], "tcp ring: agree: int32 with sum is not an agreement"))
    rc->bad++;
  free(fv);
  float f[3] = {(float)rc->rank, 1, 2};
  rc->rc[NAGREE] = rc->b->v->allreduce(rc->b, f, 3, GS__FLOAT32, GS__SUM, rc->err[NAGREE], 1024);
  if (f[0] != (float)(n * (n - 1) / 2) || f[1] != (float)n || f[2] != (float)(2 * n)) rc->bad++;
out:
  free(buf);
}

static void check_agree_job(job *j, rank_ctx *rcs) {
  assert_created(j, rcs);
  for (int r = 0; r < j->size; r++) {
    for (size_t k = 0; k <= NAGREE; k++)
      if (rcs[r].rc[k] != GS__OK)
        fail_msg("np %d rank %d step %zu: %s: %s", j->size, r, k, gs__status_name(rcs[r].rc[k]),
                 rcs[r].err[k]);
    if (rcs[r].bad) fail_msg("np %d rank %d: %ld wrong bytes", j->size, r, rcs[r].bad);
  }
}

/* The minimum over ranks at np 2, 3, 4 (and 1: a no-op), for odd n,
 * n < np included (some ranks own no byte), one chunk and (9001 bytes)
 * several; the float32 sums too; the ring stays in step. And on a deterministic ring (agree runs
 * the plain ring there; the allreduce after it the rank-order one). */
static void test_agree_values(void **state) {
  (void)state;
  for (int np = 1; np <= 5; np++) {
    job j = {.size = np == 5 ? 3 : np, .body = body_agree, .deterministic = np == 5};
    rank_ctx *rcs = run_job(&j);
    check_agree_job(&j, rcs);
    free_job(&j, rcs);
  }
}

/* The last rank enters the first two agrees 3x the io timeout late: the
 * others wait for it (no data-plane timeout before every rank entered),
 * and everyone gets the right values; later collectives are bounded as
 * usual (the allreduce at the end runs with the same short timeout). */
static void test_agree_late_peer(void **state) {
  (void)state;
  static int late_ms = 900;
  for (int np = 2; np <= 3; np++) {
    job j = {.size = np, .body = body_agree, .io_timeout_ms = 300, .user = &late_ms};
    rank_ctx *rcs = run_job(&j);
    check_agree_job(&j, rcs);
    for (int r = 0; r < np - 1; r++) /* they did wait, longer than the io timeout */
      assert_true(rcs[r].secs[0] > 0.3 && rcs[r].secs[1] > 0.3);
    free_job(&j, rcs);
  }
}

/* Rank 1 is connected but never enters; rank 0 waits in agree past its
 * 100 ms io timeout until another thread aborts it: GS__ERR_ABORTED. */
static void body_agree_abort(rank_ctx *rc) {
  if (rc->rank == 1) {
    wait_done(rc, 1);
    return;
  }
  pthread_t th;
  abort_arg a = {rc->b, 600};
  pthread_create(&th, NULL, abort_later, &a);
  uint8_t v[40] = {1};
  double t0 = now_s();
  rc->rc[0] = rc->b->v->agree(rc->b, v, sizeof v, GS__UINT8, GS__MIN, rc->err[0], 1024);
  rc->secs[0] = now_s() - t0;
  pthread_join(th, NULL);
  rc->rc[1] = rc->b->v->agree(rc->b, v, sizeof v, GS__UINT8, GS__MIN, rc->err[1], 1024);
}

static void test_agree_abort(void **state) {
  (void)state;
  job j = {.size = 2, .body = body_agree_abort, .io_timeout_ms = 100};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  print_message("%s (%.3f s)\n", rcs[0].err[0], rcs[0].secs[0]);
  if (rcs[0].rc[0] != GS__ERR_ABORTED)
    fail_msg("want GS_ERR_ABORTED, got %s: %s", gs__status_name(rcs[0].rc[0]), rcs[0].err[0]);
  assert_non_null(strstr(rcs[0].err[0], "rank 0: agree aborted"));
  assert_true(rcs[0].secs[0] >= 0.55); /* the abort ended it, not the 100 ms timeout */
  assert_true(rcs[0].secs[0] < 10);    /* promptly (a hang guard) */
  assert_int_equal(rcs[0].rc[1], GS__ERR_ABORTED);
  free_job(&j, rcs);
}

/* Rank 2 vanishes (its sockets close, as when it is killed) while the
 * others wait for it in agree, long after their 100 ms io timeout: both
 * its neighbours fail at once naming it and its address. */
static void body_agree_peer_dies(rank_ctx *rc) {
  if (rc->rank == 2) {
    struct timespec ts = {0, 500 * 1000000L};
    nanosleep(&ts, NULL);
    return; /* rank_main destroys the backend: its connections close */
  }
  uint8_t v[64];
  memset(v, 1, sizeof v);
  double t0 = now_s();
  rc->rc[0] = rc->b->v->agree(rc->b, v, sizeof v, GS__UINT8, GS__MIN, rc->err[0], 1024);
  rc->secs[0] = now_s() - t0;
  rc->rc[1] = rc->b->v->agree(rc->b, v, sizeof v, GS__UINT8, GS__MIN, rc->err[1], 1024);
}

static void test_agree_peer_dies(void **state) {
  (void)state;
  job j = {.size = 3, .body = body_agree_peer_dies, .io_timeout_ms = 100};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  for (int r = 0; r < 2; r++) {
    print_message("rank %d: %s (%.3f s)\n", r, rcs[r].err[0], rcs[r].secs[0]);
    if (rcs[r].rc[0] != GS__ERR_DATA_PLANE)
      fail_msg("rank %d: want GS_ERR_DATA_PLANE, got %s: %s", r, gs__status_name(rcs[r].rc[0]),
               rcs[r].err[0]);
    assert_non_null(strstr(rcs[r].err[0], "lost its connection to rank 2"));
    assert_non_null(strstr(rcs[r].err[0], " agree"));
    assert_non_null(strstr(rcs[r].err[0], "check its log"));
    assert_true(rcs[r].secs[0] >= 0.4); /* waited past the io timeout for rank 2 */
    assert_true(rcs[r].secs[0] < 10);
    assert_int_equal(rcs[r].rc[1], GS__ERR_DATA_PLANE);
    assert_non_null(strstr(rcs[r].err[1], "earlier collective failed"));
  }
  /* rank 1 sees its reset; rank 0 its close, or rank 1's notice naming it */
  assert_non_null(strstr(rcs[1].err[0], "to rank 2 (127.0.0.1:"));
  assert_non_null(strstr(rcs[0].err[0], "(127.0.0.1:"));
  free_job(&j, rcs);
}

/* A ring of a subset of the job's ranks (the hosts' leaders) names job
 * ranks, not its own positions: job ranks 0, 4, 8 as ring ranks 0, 1, 2. */
static void test_subset_ring_names_job_ranks(void **state) {
  (void)state;
  static const int job_ranks[3] = {0, 4, 8};
  job j = {.size = 3, .body = body_agree_peer_dies, .io_timeout_ms = 100, .kv_ranks = job_ranks};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  print_message("ring rank 1: %s\n", rcs[1].err[0]);
  assert_int_equal(rcs[1].rc[0], GS__ERR_DATA_PLANE);
  assert_non_null(
      strstr(rcs[1].err[0], "tcp ring: rank 4 lost its connection to rank 8 (127.0.0.1:"));
  assert_int_equal(rcs[0].rc[0], GS__ERR_DATA_PLANE);
  assert_non_null(strstr(rcs[0].err[0], "tcp ring: rank 0 "));
  assert_non_null(strstr(rcs[0].err[0], "rank 8"));
  assert_null(strstr(rcs[0].err[0], "rank 2"));
  free_job(&j, rcs);
}

/* ---- argument checks ------------------------------------------------------------------- */

static void body_bad_args(rank_ctx *rc) {
  float buf[4] = {0};
  rc->rc[0] = rc->b->v->allreduce(rc->b, buf, 4, GS__FLOAT32, GS__ADASUM, rc->err[0], 1024);
  rc->rc[1] = rc->b->v->allreduce(rc->b, buf, 4, (gs__dtype)42, GS__SUM, rc->err[1], 1024);
  rc->rc[2] = rc->b->v->broadcast(rc->b, buf, 4, 5, rc->err[2], 1024);
  rc->rc[3] = rc->b->v->allreduce(rc->b, buf, 4, GS__FLOAT32, (gs__reduce_op)9, rc->err[3], 1024);
  size_t counts[2] = {2, 2};
  rc->rc[5] =
      rc->b->v->reducescatter(rc->b, buf, counts, GS__FLOAT32, GS__ADASUM, rc->err[5], 1024);
  /* a refused call leaves the ring usable */
  buf[0] = (float)rc->rank;
  rc->rc[4] = rc->b->v->allreduce(rc->b, buf, 4, GS__FLOAT32, GS__SUM, rc->err[4], 1024);
  if (buf[0] != 1.0f) rc->bad++;
}

/* ---- GRADSYNC_TCP_CONGESTION --------------------------------------------------- */

/* The congestion control of every connected TCP socket of this process (the
 * ring's, while its ranks are parked at the barrier): the count, the names
 * joined by spaces. */
static pthread_barrier_t g_cc_barrier;
static int g_cc_count;
static char g_cc_names[512];

static void scan_tcp_congestion(void) {
  g_cc_count = 0;
  g_cc_names[0] = 0;
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    int fd = atoi(e->d_name), proto = 0, listening = 0;
    socklen_t l = sizeof proto;
    if (e->d_name[0] == '.' || getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) != 0 ||
        proto != IPPROTO_TCP)
      continue;
    l = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) != 0 || listening) continue;
    char name[16] = {0};
    l = sizeof name - 1;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &l) != 0) continue;
    size_t n = strlen(g_cc_names);
    snprintf(g_cc_names + n, sizeof g_cc_names - n, "%s%s", n ? " " : "", name);
    g_cc_count++;
  }
  closedir(d);
}

static void body_congestion(rank_ctx *rc) {
  pthread_barrier_wait(&g_cc_barrier); /* every rank's ring is connected */
  if (rc->rank == 0) scan_tcp_congestion();
  pthread_barrier_wait(&g_cc_barrier); /* none is destroyed before the scan */
}

/* Runs an np=2 ring with GRADSYNC_TCP_CONGESTION=cc and returns the
 * algorithms of its 4 sockets (each rank's send and receive sockets). */
static const char *ring_congestion(const char *cc) {
  assert_int_equal(pthread_barrier_init(&g_cc_barrier, NULL, 2), 0);
  job j = {.size = 2, .body = body_congestion, .congestion = cc};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  free_job(&j, rcs);
  pthread_barrier_destroy(&g_cc_barrier);
  if (g_cc_count != 4)
    fail_msg("GRADSYNC_TCP_CONGESTION=%s: %d TCP sockets (%s), want 4", cc ? cc : "(unset)",
             g_cc_count, g_cc_names);
  return g_cc_names;
}

static void test_tcp_congestion(void **state) {
  (void)state;
  /* the kernel's default, as a new socket gets it */
  char sys[16] = {0}, want[128];
  int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t l = sizeof sys - 1;
  assert_true(probe >= 0);
  assert_int_equal(getsockopt(probe, IPPROTO_TCP, TCP_CONGESTION, sys, &l), 0);
  close(probe);
  snprintf(want, sizeof want, "%s %s %s %s", sys, sys, sys, sys);

  /* system: the kernel's choice, whatever it is (bbr included) */
  assert_string_equal(ring_congestion("system"), want);
  /* a name an unprivileged process may always choose: on every socket */
  assert_string_equal(ring_congestion("reno"), "reno reno reno reno");
  /* a name the kernel refuses: a warning, and the ring runs on the system's */
  assert_string_equal(ring_congestion("nosuchcc"), want);
  /* auto (the default): never bbr; any other system choice is left alone */
  const char *got = ring_congestion(NULL);
  if (strcmp(sys, "bbr") == 0)
    assert_null(strstr(got, "bbr"));
  else
    assert_string_equal(got, want);
  assert_string_equal(ring_congestion("auto"), got);

  /* a name the kernel could never take is refused up front */
  static const char *const bad[] = {"", "sixteen_letters_"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gs__tcp_ring_opts o = {.rank = 0, .size = 1, .congestion = bad[i]};
    gs__backend *b = NULL;
    char err[512];
    assert_int_equal(gs__tcp_ring_create(&o, &b, err, sizeof err), GS__ERR_INVALID_ARG);
    assert_non_null(strstr(err, "is not valid: give auto, system or an algorithm name"));
    assert_null(b);
  }
}

static void test_bad_arguments(void **state) {
  (void)state;
  job j = {.size = 2, .body = body_bad_args};
  rank_ctx *rcs = run_job(&j);
  assert_created(&j, rcs);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(rcs[r].rc[0], GS__ERR_UNSUPPORTED);
    assert_non_null(strstr(rcs[r].err[0], "adasum"));
    assert_int_equal(rcs[r].rc[1], GS__ERR_INVALID_ARG);
    assert_non_null(strstr(rcs[r].err[1], "dtype 42"));
    assert_int_equal(rcs[r].rc[2], GS__ERR_INVALID_ARG);
    assert_non_null(strstr(rcs[r].err[2], "root 5"));
    assert_int_equal(rcs[r].rc[3], GS__ERR_INVALID_ARG);
    assert_int_equal(rcs[r].rc[5], GS__ERR_UNSUPPORTED);
    assert_non_null(strstr(rcs[r].err[5], "reducescatter"));
    assert_int_equal(rcs[r].rc[4], GS__OK);
    assert_int_equal(rcs[r].bad, 0);
  }
  free_job(&j, rcs);

  char err[256];
  gs__backend *b = (gs__backend *)1;
  gs__tcp_ring_opts o = {.rank = 3, .size = 2};
  assert_int_equal(gs__tcp_ring_create(&o, &b, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_null(b);
  assert_non_null(strstr(err, "rank 3 / size 2"));
  o = (gs__tcp_ring_opts){.rank = 0, .size = 2, .connect_timeout_ms = 1, .io_timeout_ms = 1};
  assert_int_equal(gs__tcp_ring_create(&o, &b, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_non_null(strstr(err, "kv"));
  o = (gs__tcp_ring_opts){.rank = 0, .size = 1, .advertise_addr = "10.0.0.1:5000"};
  assert_int_equal(gs__tcp_ring_create(&o, &b, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_non_null(strstr(err, "advertise_addr \"10.0.0.1:5000\""));
  gs__backend_destroy(NULL);
}

static void test_size_one(void **state) {
  (void)state;
  /* size 1 needs no store and no sockets; AVERAGE divides by 1 */
  char err[256];
  gs__backend *b = NULL;
  gs__tcp_ring_opts o = {.rank = 0, .size = 1};
  assert_int_equal(gs__tcp_ring_create(&o, &b, err, sizeof err), GS__OK);
  uint16_t h[3] = {gs__float_to_half(1.5f), 0x7e00, gs__float_to_half(-3)};
  uint16_t h0[3];
  memcpy(h0, h, sizeof h);
  assert_int_equal(b->v->allreduce(b, h, 3, GS__FLOAT16, GS__AVERAGE, err, sizeof err), GS__OK);
  assert_memory_equal(h, h0, sizeof h);
  int8_t i8[2] = {-7, 7};
  assert_int_equal(b->v->allreduce(b, i8, 2, GS__INT8, GS__AVERAGE, err, sizeof err), GS__OK);
  assert_int_equal(i8[0], -7);
  assert_int_equal(b->v->allreduce(b, i8, 2, GS__INT8, GS__ADASUM, err, sizeof err),
                   GS__ERR_UNSUPPORTED);
  b->v->abort(b);
  assert_int_equal(b->v->allreduce(b, i8, 2, GS__INT8, GS__SUM, err, sizeof err), GS__ERR_ABORTED);
  gs__backend_destroy(b);
}

/* ---- optional timing --------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void body_bench(rank_ctx *rc) {
  static const size_t sizes[] = {1u << 18, 1u << 22, 1u << 24}; /* 1, 16, 64 MiB */
  for (int s = 0; s < 3; s++) {
    size_t count = sizes[s];
    float *buf = malloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++) buf[i] = 1;
    int iters = s == 2 ? 8 : 20;
    double t[32];
    for (int it = 0; it < iters + 2; it++) {
      double t0 = now_s();
      rc->rc[s] |= rc->b->v->allreduce(rc->b, buf, count, GS__FLOAT32, GS__SUM, rc->err[s], 1024);
      if (it >= 2) t[it - 2] = now_s() - t0;
    }
    qsort(t, (size_t)iters, sizeof t[0], cmp_double);
    rc->secs[s] = t[iters / 2];
    free(buf);
  }
}

static void test_bench(void **state) {
  (void)state;
  if (!getenv("GS_RING_BENCH")) skip();
  for (int n = 2; n <= 4; n++) {
    job j = {.size = n, .body = body_bench};
    rank_ctx *rcs = run_job(&j);
    assert_created(&j, rcs);
    static const char *names[] = {"1 MiB", "16 MiB", "64 MiB"};
    static const double mib[] = {1, 16, 64};
    for (int s = 0; s < 3; s++) {
      double worst = 0;
      for (int r = 0; r < n; r++) {
        assert_int_equal(rcs[r].rc[s], GS__OK);
        if (rcs[r].secs[s] > worst) worst = rcs[r].secs[s];
      }
      double busbw = mib[s] * 1048576.0 * 2 * (n - 1) / n / worst / 1e9;
      printf("# np=%d float32 sum %-6s: %8.1f us  busbw %.2f GB/s\n", n, names[s], worst * 1e6,
             busbw);
    }
    free_job(&j, rcs);
  }
}

static int setup_kv(void **state) {
  (void)state;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g_kv_cv, &ca);
  pthread_condattr_destroy(&ca);
  return 0;
}

static int teardown_kv(void **state) {
  (void)state;
  kv_clear();
  pthread_cond_destroy(&g_kv_cv);
  return 0;
}

/* The host backends' batched pack/unpack (gs__host_copy): conversion and
 * scaling in the wire dtype, zero fill, a staging buffer that keeps growing. */
static void test_host_copy(void **state) {
  (void)state;
  char err[256];
  float src[5] = {1.0f, -2.5f, 3.25f, 1000.0f, 0.1f}, back[5];
  uint16_t wire[5];
  int32_t ints[4] = {1, -3, 5, 7}, iout[4];
  uint8_t zeros[8];
  memset(zeros, 0xff, sizeof zeros);
  gs__copy c[3] = {{src, wire, 5, GS__FLOAT32, GS__FLOAT16, 0.5},
                   {ints, iout, 4, GS__INT32, GS__INT32, 2.0},
                   {NULL, zeros, 2, GS__INT32, GS__INT32, 1.0}};
  assert_int_equal(gs__host_copy(c, 3, err, sizeof err), GS__OK);
  for (int k = 0; k < 5; k++)
    assert_int_equal(wire[k],
                     gs__float_to_half(gs__half_to_float(gs__float_to_half(src[k])) * 0.5f));
  for (int k = 0; k < 4; k++) assert_int_equal(iout[k], ints[k] * 2);
  for (int k = 0; k < 8; k++) assert_int_equal(zeros[k], 0);
  gs__copy u = {wire, back, 5, GS__FLOAT16, GS__FLOAT32, 4.0};
  assert_int_equal(gs__host_copy(&u, 1, err, sizeof err), GS__OK);
  for (int k = 0; k < 5; k++)
    assert_true(back[k] == gs__half_to_float(gs__float_to_half(gs__half_to_float(wire[k]) * 4.0f)));
  gs__copy bad = {src, wire, 5, GS__FLOAT64, GS__FLOAT16, 1.0};
  assert_int_equal(gs__host_copy(&bad, 1, err, sizeof err), GS__ERR_INTERNAL);
  assert_string_equal(err, "internal: no conversion from float64 to float16");
  void *buf = NULL;
  size_t cap = 0;
  assert_non_null(gs__host_staging(&buf, &cap, 10, err, sizeof err));
  assert_true(cap >= 10);
  assert_non_null(gs__host_staging(&buf, &cap, (size_t)5 << 20, err, sizeof err));
  assert_true(cap >= (size_t)5 << 20);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_size_one),
      cmocka_unit_test(test_host_copy),
      cmocka_unit_test(test_sum_sizes_counts),
      cmocka_unit_test(test_every_dtype_and_op),
      cmocka_unit_test(test_segments),
      cmocka_unit_test(test_small_segments),
      cmocka_unit_test(test_bitwise_identical),
      cmocka_unit_test(test_deterministic_rank_order),
      cmocka_unit_test(test_deterministic_reducescatter),
      cmocka_unit_test(test_reducescatter),
      cmocka_unit_test(test_alltoallv),
      cmocka_unit_test(test_allgatherv),
      cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_mixed_sequence),
      cmocka_unit_test(test_published_address),
      cmocka_unit_test(test_data_addr_and_port_range),
      cmocka_unit_test(test_tcp_congestion),
      cmocka_unit_test(test_port_range_in_use),
      cmocka_unit_test(test_ipv6_ring),
      cmocka_unit_test(test_rendezvous_missing_rank),
      cmocka_unit_test(test_peer_dies),
      cmocka_unit_test(test_failure_reaches_neighbours),
      cmocka_unit_test(test_abort_unblocks),
      cmocka_unit_test(test_io_timeout),
      cmocka_unit_test(test_agree_values),
      cmocka_unit_test(test_agree_late_peer),
      cmocka_unit_test(test_agree_abort),
      cmocka_unit_test(test_agree_peer_dies),
      cmocka_unit_test(test_subset_ring_names_job_ranks),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_bench),
      cmocka_unit_test(test_rogue_connection_dropped),
      cmocka_unit_test(test_wrong_ring_key),
  };
  /* GS_TEST_FILTER=test_name (a glob) runs only the tests it matches */
  if (getenv("GS_TEST_FILTER")) cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup_kv, teardown_kv);
}
