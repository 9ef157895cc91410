/* Unit tests of the shared-memory transport (worker/backends/shm.c).
 *
 * Correctness: each rank is a thread of this process with its own mapping
 * of one segment; every dtype x op x odd sizes (0, 1, 7, 33, and sizes
 * across several chunks) for 2, 3 and 4 local ranks, and broadcast from
 * every root, checked element by element against a reference computed here
 * (inputs are small integers, so every summation order gives the same
 * exact result), each plain and with a postscale finished inside the
 * reduction (allreduce_scaled). Hierarchical: 2 "hosts" of ranks
 * (threads), each host its own segment, the leaders joined by a real TCP
 * ring on 127.0.0.1 (also in deterministic mode).
 * Faults (forked ranks, real processes): abort wakes a waiter; a peer that
 * never comes times out naming it; kill -9 of a rank mid-job makes its
 * peer fail within a bounded time naming it; kill -9 of the leader right
 * after it created the segment; and after every one of these the segment's
 * name is gone from /dev/shm.
 *
 * Rank threads never call cmocka asserts: they record failures and the
 * main thread checks them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dtype.h"
#include "messages.h"
#include "status.h"

#define HANG_GUARD_MS 30000
#define TEST_CHUNK (64 * 1024) /* bytes of one slot: every big case crosses chunks */

static const uint8_t k_key[GS__SECRET_BYTES] = "0123456789abcdef0123456789abcde";
static int g_seq;

static void seg_name(char *out, size_t len) {
  snprintf(out, len, "/gradsync-test-%d-%d", (int)getpid(), g_seq++);
}

static int seg_exists(const char *name) {
  char path[256];
  snprintf(path, sizeof path, "/dev/shm%s", name);
  return access(path, F_OK) == 0;
}

/* The segment's size, or -1 when it does not exist. */
static long long seg_bytes_now(const char *name) {
  char path[256];
  struct stat st;
  snprintf(path, sizeof path, "/dev/shm%s", name);
  return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- values ------------------------------------------------------------- */

static int is_signed(gs__dtype dt) {
  return dt != GS__UINT8;
}

/* Rank r's element i: small integers (exact in every dtype, and their
 * sums, products, minima in any order). */
static double input(gs__dtype dt, gs__reduce_op op, int r, size_t i) {
  if (op == GS__PRODUCT) {
    double v = (i + (size_t)r) % 3 == 0 ? 2 : 1;
    return is_signed(dt) && (i * 7 + (size_t)r) % 5 == 0 ? -v : v;
  }
  if (!is_signed(dt)) return (double)((i * 31 + (size_t)r * 17) % 9);
  return (double)((i * 31 + (size_t)r * 17) % 17) - 8;
}

static void set_val(void *buf, gs__dtype dt, size_t i, double v) {
  switch (dt) {
  case GS__FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case GS__FLOAT64:
    ((double *)buf)[i] = v;
    break;
  case GS__FLOAT16:
    ((uint16_t *)buf)[i] = gs__float_to_half((float)v);
    break;
  case GS__BFLOAT16:
    ((uint16_t *)buf)[i] = gs__float_to_bf16((float)v);
    break;
  case GS__INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case GS__INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case GS__INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case GS__UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case GS__INT16:
    ((int16_t *)buf)[i] = (int16_t)v;
    break;
  default:
    break;
  }
}

/* The expected result of element i over n ranks, stored as dt would. */
static void expect_val(void *buf, gs__dtype dt, gs__reduce_op op, int n, size_t i) {
  double acc = input(dt, op, 0, i);
  for (int r = 1; r < n; r++) {
    double v = input(dt, op, r, i);
    switch (op) {
    case GS__SUM:
    case GS__AVERAGE:
      acc += v;
      break;
    case GS__MIN:
      acc = v < acc ? v : acc;
      break;
    case GS__MAX:
      acc = v > acc ? v : acc;
      break;
    case GS__PRODUCT:
      acc *= v;
      break;
    default:
      break;
    }
  }
  if (op != GS__AVERAGE) {
    set_val(buf, dt, i, acc);
    return;
  }
  switch (dt) {
  case GS__FLOAT64:
    set_val(buf, dt, i, acc / n);
    break;
  case GS__FLOAT32:
  case GS__FLOAT16:
  case GS__BFLOAT16:
    set_val(buf, dt, i, (double)((float)acc / (float)n));
    break;
  default:
    set_val(buf, dt, i, (double)((int64_t)acc / n));
    break; /* toward zero */
  }
}

/* ---- ranks as threads ------------------------------------------------------ */

typedef struct tjob {
  int size;
  int nhosts; /* 1, 2 (ranks [0, size/2) and [size/2, size)) or size */
  char seg[4][128];
  int leader_port_key; /* distinct kv prefix per job */
  int deterministic;   /* the leaders' ring reduces in rank order */
  size_t one_shot;     /* gs__shm_opts.one_shot_bytes (0 = the default) */
  int io_ms;           /* io timeout of the segment and the leaders' ring (0: HANG_GUARD_MS) */
  int late_rank;       /* agree_rank: this rank enters its first agrees late_ms late */
  int late_ms;
  atomic_int failures;
  char first_failure[1024];
  pthread_mutex_t mu;
} tjob;

typedef struct trank {
  tjob *j;
  int rank;
  int rc; /* agree_or_leave's result */
  char err[2048];
  int64_t ms;
} trank;

static void record(tjob *j, const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&j->mu);
  if (!atomic_fetch_add(&j->failures, 1)) {
    va_start(ap, fmt);
    vsnprintf(j->first_failure, sizeof j->first_failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&j->mu);
}

/* In-memory kv for the leaders' ring of the hierarchical test. */
typedef struct kv_entry {
  char key[256];
  char val[512];
  size_t len;
} kv_entry;
static kv_entry g_kv[64];
static int g_nkv;
static pthread_mutex_t g_kv_mu = PTHREAD_MUTEX_INITIALIZER;

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen) {
  (void)ctx, (void)err, (void)errlen;
  pthread_mutex_lock(&g_kv_mu);
  if (g_nkv < 64 && len < 512) {
    snprintf(g_kv[g_nkv].key, sizeof g_kv[g_nkv].key, "%s", key);
    memcpy(g_kv[g_nkv].val, val, len);
    g_kv[g_nkv++].len = len;
  }
  pthread_mutex_unlock(&g_kv_mu);
  return GS__OK;
}

static int kv_get(void *ctx, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  (void)ctx;
  int64_t dl = now_ms() + timeout_ms;
  for (;;) {
    pthread_mutex_lock(&g_kv_mu);
    for (int i = 0; i < g_nkv; i++)
      if (!strcmp(g_kv[i].key, key)) {
        *val = malloc(g_kv[i].len);
        memcpy(*val, g_kv[i].val, g_kv[i].len);
        *len = g_kv[i].len;
        pthread_mutex_unlock(&g_kv_mu);
        return GS__OK;
      }
    pthread_mutex_unlock(&g_kv_mu);
    if (now_ms() >= dl) break;
    usleep(2000);
  }
  snprintf(err, errlen, "test kv: no key %s", key);
  return GS__ERR_TIMEOUT;
}

/* Creates rank r's transport in job j (and, for the hierarchical job, the
 * leaders' ring). */
/* Runs rank threads 0..j->size-1 of fn (tr[r]: rank r of j; at most 8),
 * joins them, and fails the test with the first failure one recorded. */
static void run_ranks(tjob *j, trank *tr, void *(*fn)(void *)) {
  pthread_t th[8];
  assert_true(j->size <= 8);
  for (int r = 0; r < j->size; r++) {
    tr[r] = (trank){.j = j, .rank = r};
    assert_int_equal(pthread_create(&th[r], NULL, fn, &tr[r]), 0);
  }
  for (int r = 0; r < j->size; r++) pthread_join(th[r], NULL);
  if (atomic_load(&j->failures)) fail_msg("%s", j->first_failure);
}

static gs__backend *make_rank(tjob *j, int r, char *err, size_t errlen) {
  int per = j->size / j->nhosts, host = r / per, local[8], nlocal = 0, host_of[8];
  for (int q = host * per; q < (host + 1) * per; q++) local[nlocal++] = q;
  for (int q = 0; q < j->size; q++) host_of[q] = q / per;
  gs__shm_opts o = {.rank = r,
                    .size = j->size,
                    .local_ranks = local,
                    .nlocal = nlocal,
                    .host_index = host,
                    .nhosts = j->nhosts,
                    .host_of = host_of,
                    .segment = j->seg[host],
                    .chunk_bytes = TEST_CHUNK,
                    .one_shot_bytes = j->one_shot,
                    .connect_timeout_ms = HANG_GUARD_MS,
                    .io_timeout_ms = j->io_ms ? j->io_ms : HANG_GUARD_MS};
  gs__backend *b = NULL;
  if (gs__backend_create(GS__BACKEND_SHM, &o, &b, err, errlen) != GS__OK) return NULL;
  if (j->nhosts > 1 && r == local[0]) {
    char prefix[64];
    int leader_ranks[8]; /* the leaders' job ranks: what their ring's messages name */
    for (int h = 0; h < j->nhosts; h++) leader_ranks[h] = h * per;
    snprintf(prefix, sizeof prefix, "job%d/", j->leader_port_key);
    gs__tcp_ring_opts ro = {.rank = host,
                            .size = j->nhosts,
                            .coordinator = "127.0.0.1:9",
                            .key_prefix = prefix,
                            .connect_timeout_ms = HANG_GUARD_MS,
                            .io_timeout_ms = j->io_ms ? j->io_ms : HANG_GUARD_MS,
                            .kv = {NULL, kv_set, kv_get},
                            .kv_ranks = leader_ranks,
                            .ring_key = k_key,
                            .deterministic = j->deterministic};
    gs__backend *leaders = NULL;
    if (gs__tcp_ring_create(&ro, &leaders, err, errlen) != GS__OK) {
      gs__backend_destroy(b);
      return NULL;
    }
    gs__shm_adopt(b, NULL, leaders);
  }
  return b;
}

/* Odd sizes, the last across two chunk boundaries (the tests use TEST_CHUNK
 * slots; 16-bit floats travel as float32). */
#define NSIZES 6
static size_t size_of(int k, gs__dtype dt) {
  static const size_t small[] = {0, 1, 7, 33, 1000};
  if (k < NSIZES - 1) return small[k];
  size_t wes = dt == GS__FLOAT16 || dt == GS__BFLOAT16 ? 4 : gs__dtype_size(dt);
  return 2 * (TEST_CHUNK / wes) + 5;
}

static void *correctness_rank(void *arg) {
  trank *t = arg;
  tjob *j = t->j;
  char err[2048];
  gs__backend *b = make_rank(j, t->rank, err, sizeof err);
  if (!b) {
    record(j, "rank %d: create failed: %s", t->rank, err);
    return NULL;
  }
  size_t maxn = 1u << 20; /* > the largest size_of, and the broadcasts' bytes */
  char *buf = malloc(maxn * 8), *want = malloc(maxn * 8);
  /* plain, then with a postscale applied inside the reduction
   * (allreduce_scaled): the reference is the exact reduction, divided for
   * an average, then gs__scale's arithmetic (16-bit floats rounded before
   * the factor, integers truncated) */
  for (int scaled = 0; scaled < 2; scaled++)
    for (int dt = 0; dt < GS__DTYPE_COUNT; dt++)
      for (int op = 0; op < GS__ADASUM; op++)
        for (int k = 0; k < NSIZES; k++) {
          size_t n = size_of(k, (gs__dtype)dt), es = gs__dtype_size((gs__dtype)dt);
          double factor = scaled ? 0.37 : 1.0;
          for (size_t i = 0; i < n; i++) {
            set_val(buf, (gs__dtype)dt, i, input((gs__dtype)dt, (gs__reduce_op)op, t->rank, i));
            expect_val(want, (gs__dtype)dt, (gs__reduce_op)op, j->size, i);
          }
          if (scaled) gs__scale(want, n, (gs__dtype)dt, factor);
          int rc = scaled ? b->v->allreduce_scaled(b, n ? buf : NULL, n, (gs__dtype)dt,
                                                   (gs__reduce_op)op, factor, err, sizeof err)
                          : b->v->allreduce(b, n ? buf : NULL, n, (gs__dtype)dt, (gs__reduce_op)op,
                                            err, sizeof err);
          if (rc) {
            record(j, "rank %d: allreduce%s %s %s n=%zu failed: %s", t->rank,
                   scaled ? "_scaled" : "", gs__dtype_name((gs__dtype)dt),
                   gs__reduce_op_name((gs__reduce_op)op), n, err);
            goto out;
          }
          for (size_t i = 0; i < n; i++)
            if (memcmp(buf + i * es, want + i * es, es)) {
              record(j,
                     "rank %d of %d (%d hosts): allreduce%s %s %s n=%zu: element %zu differs "
                     "from the reference",
                     t->rank, j->size, j->nhosts, scaled ? "_scaled (postscale 0.37)" : "",
                     gs__dtype_name((gs__dtype)dt), gs__reduce_op_name((gs__reduce_op)op), n, i);
              goto out;
            }
        }
  /* allreduce_segs: the members' own buffers, across chunks, with an
   * in-place member, an empty one, padding (NULL source and destination)
   * between and after; on one host and hierarchical */
  for (int scaled = 0; scaled < 2; scaled++)
    for (int dt = 0; dt < GS__DTYPE_COUNT; dt++)
      for (int op = 0; op < GS__ADASUM; op++) {
        gs__dtype d = (gs__dtype)dt;
        size_t n = size_of(NSIZES - 1, d), es = gs__dtype_size(d);
        double factor = scaled ? 0.37 : 1.0;
        char *res = malloc(n * es);
        for (size_t i = 0; i < n; i++) {
          set_val(buf, d, i, input(d, (gs__reduce_op)op, t->rank, i));
          expect_val(want, d, (gs__reduce_op)op, j->size, i);
        }
        if (scaled) gs__scale(want, n, d, factor);
        gs__seg sg[] = {{buf, buf, 7},
                        {buf + 7 * es, res + 7 * es, 0},
                        {NULL, NULL, 3},
                        {buf + 10 * es, res + 10 * es, 1000},
                        {buf + 1010 * es, res + 1010 * es, n - 1015},
                        {NULL, NULL, 5}};
        int rc = b->v->allreduce_segs(b, sg, 6, d, (gs__reduce_op)op, factor, err, sizeof err);
        if (rc) {
          free(res);
          record(j, "rank %d: allreduce_segs %s %s failed: %s", t->rank, gs__dtype_name(d),
                 gs__reduce_op_name((gs__reduce_op)op), err);
          goto out;
        }
        for (size_t i = 0; i < n - 5; i++) {
          if (i >= 7 && i < 10) continue; /* padding */
          const char *got = i < 7 ? buf + i * es : res + i * es;
          if (memcmp(got, want + i * es, es)) {
            record(j,
                   "rank %d of %d (%d hosts): allreduce_segs%s %s %s n=%zu: element %zu "
                   "differs from the reference",
                   t->rank, j->size, j->nhosts, scaled ? " (postscale 0.37)" : "",
                   gs__dtype_name(d), gs__reduce_op_name((gs__reduce_op)op), n, i);
            free(res);
            goto out;
          }
        }
        free(res);
      }
  /* broadcast from every root, odd lengths across chunks */
  size_t lens[] = {1, 4099, (1u << 19) + 17};
  for (int root = 0; root < j->size; root++)
    for (size_t k = 0; k < 3; k++) {
      size_t len = lens[k];
      for (size_t i = 0; i < len; i++)
        buf[i] = (char)(t->rank == root ? (i * 13 + (size_t)root) & 0xff : 0x5a);
      int rc = b->v->broadcast(b, buf, len, root, err, sizeof err);
      if (rc) {
        record(j, "rank %d: broadcast from %d failed: %s", t->rank, root, err);
        goto out;
      }
      for (size_t i = 0; i < len; i++)
        if (buf[i] != (char)((i * 13 + (size_t)root) & 0xff)) {
          record(j, "rank %d: broadcast of %zu bytes from %d: byte %zu differs", t->rank, len, root,
                 i);
          goto out;
        }
    }
out:
  free(buf);
  free(want);
  gs__backend_destroy(b);
  return NULL;
}

static void run_job(int size, int nhosts, int deterministic, size_t one_shot) {
  static int job_no;
  tjob j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.mu, NULL);
  j.size = size;
  j.nhosts = nhosts;
  j.leader_port_key = job_no++;
  j.deterministic = deterministic;
  j.one_shot = one_shot;
  for (int h = 0; h < nhosts; h++) seg_name(j.seg[h], sizeof j.seg[h]);
  trank tr[8];
  run_ranks(&j, tr, correctness_rank);
  for (int h = 0; h < nhosts; h++) assert_false(seg_exists(j.seg[h]));
  pthread_mutex_destroy(&j.mu);
}

/* One rendezvous up to 32 KiB: the small sizes take the one-shot path,
 * the large ones (across chunks) the sliced one. */
#define SMALL_ONE_SHOT (32 * 1024)

static void run_threads(int size, int nhosts) {
  run_job(size, nhosts, 0, SMALL_ONE_SHOT);
}

static void test_every_dtype_op_2(void **state) {
  (void)state;
  run_threads(2, 1);
}

/* The defaults: with 2 local ranks every size (across chunks too) takes
 * one rendezvous; with 3, up to 256 KiB. */
static void test_every_dtype_op_2_defaults(void **state) {
  (void)state;
  run_job(2, 1, 0, 0);
}

static void test_every_dtype_op_3_defaults(void **state) {
  (void)state;
  run_job(3, 1, 0, 0);
}

static void test_hierarchical_2x2_defaults(void **state) {
  (void)state;
  run_job(4, 2, 0, 0);
}

static void test_every_dtype_op_3(void **state) {
  (void)state;
  run_threads(3, 1);
}

static void test_every_dtype_op_4(void **state) {
  (void)state;
  run_threads(4, 1);
}

/* 2 hosts x 2 ranks, and 2 hosts x 1 rank (leaders only) */
static void test_hierarchical_2x2(void **state) {
  (void)state;
  run_threads(4, 2);
}

/* the leaders' ring in deterministic mode (its own finish path, float32
 * workspace into 16-bit results) */
static void test_hierarchical_2x2_deterministic(void **state) {
  (void)state;
  run_job(4, 2, 1, SMALL_ONE_SHOT);
}

static void test_hierarchical_2x1(void **state) {
  (void)state;
  run_threads(2, 2);
}

/* ---- agree ------------------------------------------------------------------ */

/* Rank r's byte i: the full range in pass 0, 0/1 flags in pass 1. */
static uint8_t agree_val(int pass, int r, size_t i) {
  if (pass == 1) return (i + (size_t)r) % 3 != 0;
  return (uint8_t)(i * 37 + (size_t)r * 101 + (i >> 3) * 11) ^ (uint8_t)(r * 29);
}

/* Odd n, n below the rank count, and n across two TEST_CHUNK slots; then an
 * allreduce (the transport must still be in step). j->late_rank enters
 * the first two n late by j->late_ms. */
static void *agree_rank(void *arg) {
  static const size_t lens[] = {1, 2, 3, 7, 33, 4099, 2 * TEST_CHUNK + 3};
  trank *t = arg;
  tjob *j = t->j;
  char err[2048];
  gs__backend *b = make_rank(j, t->rank, err, sizeof err);
  if (!b) {
    record(j, "rank %d: create failed: %s", t->rank, err);
    return NULL;
  }
  uint8_t *buf = malloc(2 * TEST_CHUNK + 3);
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (int pass = 0; pass < 2; pass++) {
      size_t n = lens[k];
      for (size_t i = 0; i < n; i++) buf[i] = agree_val(pass, t->rank, i);
      if (t->rank == j->late_rank && k < 2) usleep((useconds_t)j->late_ms * 1000);
      int64_t t0 = now_ms();
      if (b->v->agree(b, buf, n, GS__UINT8, GS__MIN, err, sizeof err)) {
        record(j, "rank %d of %d (%d hosts): agree n=%zu failed: %s", t->rank, j->size, j->nhosts,
               n, err);
        goto out;
      }
      if (j->late_ms && t->rank != j->late_rank && k < 2 && now_ms() - t0 < j->late_ms / 2)
        record(j, "rank %d: agree n=%zu returned after %lld ms, before the late rank %d came",
               t->rank, n, (long long)(now_ms() - t0), j->late_rank);
      for (size_t i = 0; i < n; i++) {
        uint8_t want = 255;
        for (int q = 0; q < j->size; q++)
          if (agree_val(pass, q, i) < want) want = agree_val(pass, q, i);
        if (buf[i] != want) {
          record(j, "rank %d of %d (%d hosts): agree n=%zu pass %d: byte %zu is %u, want %u",
                 t->rank, j->size, j->nhosts, n, pass, i, buf[i], want);
          goto out;
        }
      }
    }
  /* The float32 SUM form (fast rounds with data riding along): exact sums
   * of small integers, across a chunk boundary too; a form that is not an
   * agreement is refused on every rank before anything moves. */
  static const size_t flens[] = {1, 5, TEST_CHUNK / 4 + 3};
  float *fv = malloc((TEST_CHUNK / 4 + 3) * sizeof *fv);
  for (size_t k = 0; k < sizeof flens / sizeof flens[0]; k++) {
    size_t n = flens[k];
    for (size_t i = 0; i < n; i++) fv[i] = (float)((i % 7) * 3 + (size_t)t->rank * 5);
    if (b->v->agree(b, fv, n, GS__FLOAT32, GS__SUM, err, sizeof err)) {
      record(j, "rank %d of %d (%d hosts): float32 agree n=%zu failed: %s", t->rank, j->size,
             j->nhosts, n, err);
      free(fv);
      goto out;
    }
    for (size_t i = 0; i < n; i++) {
      float want =
          (float)((i % 7) * 3 * (size_t)j->size + 5 * (size_t)(j->size * (j->size - 1) / 2));
      if (fv[i] != want) {
        record(j, "rank %d of %d (%d hosts): float32 agree n=%zu: element %zu is %g, want %g",
               t->rank, j->size, j->nhosts, n, i, (double)fv[i], (double)want);
        free(fv);
        goto out;
      }
    }
  }
  if (b->v->agree(b, fv, 4, GS__FLOAT32, GS__MIN, err, sizeof err) != GS__ERR_INVALID_ARG ||
      !strstr(err, "float32 with min is not an agreement"))
    record(j, "rank %d: agree with float32 min was not refused: %s", t->rank, err);
  free(fv);
  float f[3] = {(float)t->rank, 1, 2};
  if (b->v->allreduce(b, f, 3, GS__FLOAT32, GS__SUM, err, sizeof err) ||
      f[0] != (float)(j->size * (j->size - 1) / 2) || f[1] != (float)j->size)
    record(j, "rank %d: the allreduce after the agrees failed or is wrong: %s", t->rank, err);
out:
  free(buf);
  gs__backend_destroy(b);
  return NULL;
}

static void run_agree(int size, int nhosts, int io_ms, int late_rank, int late_ms) {
  static int job_no = 1000;
  tjob j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.mu, NULL);
  j.size = size;
  j.nhosts = nhosts;
  j.leader_port_key = job_no++;
  j.io_ms = io_ms;
  j.late_rank = late_rank;
  j.late_ms = late_ms;
  for (int h = 0; h < nhosts; h++) seg_name(j.seg[h], sizeof j.seg[h]);
  trank tr[8];
  run_ranks(&j, tr, agree_rank);
  for (int h = 0; h < nhosts; h++) assert_false(seg_exists(j.seg[h]));
  pthread_mutex_destroy(&j.mu);
}

/* The minimum over 2, 3, 4 ranks of one host, and hierarchical: 2 hosts x
 * 2 ranks, 2 x 1 (leaders only), 4 x 1. */
static void test_agree_values(void **state) {
  (void)state;
  for (int np = 2; np <= 4; np++) run_agree(np, 1, 0, -1, 0);
  run_agree(4, 2, 0, -1, 0);
  run_agree(2, 2, 0, -1, 0);
  run_agree(4, 4, 0, -1, 0);
}

/* A rank that enters 3x the io timeout late: the others wait for it
 * without a timeout, and all get the right values. On one host; and across
 * 2 hosts, late a non-leader (its leader waits on shared memory, the other
 * host's ranks in the leaders' ring and the host broadcast), then a leader. */
static void test_agree_late_peer(void **state) {
  (void)state;
  run_agree(3, 1, 300, 2, 900);
  run_agree(4, 2, 300, 3, 900);
  run_agree(4, 2, 300, 2, 900);
}

/* Hierarchical: host 1's ranks (2 and 3) leave without entering agree --
 * its leader's connections to the leaders' ring close -- while host 0's
 * wait in it long past their 100 ms io timeout: rank 0 (host 0's leader)
 * fails naming rank 2 and its address, and tells rank 1, which waits for
 * its broadcast without a deadline. */
static void *agree_or_leave(void *arg) {
  trank *t = arg;
  tjob *j = t->j;
  char err[2048];
  gs__backend *b = make_rank(j, t->rank, err, sizeof err);
  if (!b) {
    record(j, "rank %d: create failed: %s", t->rank, err);
    return NULL;
  }
  if (t->rank >= 2) {
    usleep(500000);
    gs__backend_destroy(b);
    return NULL;
  }
  uint8_t v[16] = {0};
  int64_t t0 = now_ms();
  t->rc = b->v->agree(b, v, sizeof v, GS__UINT8, GS__MIN, t->err, sizeof t->err);
  t->ms = now_ms() - t0;
  gs__backend_destroy(b);
  return NULL;
}

static void test_agree_hierarchical_host_leaves(void **state) {
  (void)state;
  tjob j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.mu, NULL);
  j.size = 4;
  j.nhosts = 2;
  j.leader_port_key = 2000;
  j.io_ms = 100;
  for (int h = 0; h < 2; h++) seg_name(j.seg[h], sizeof j.seg[h]);
  trank tr[4];
  run_ranks(&j, tr, agree_or_leave);
  for (int r = 0; r < 2; r++) {
    print_message("rank %d: %s (%lld ms)\n", r, tr[r].err, (long long)tr[r].ms);
    assert_int_equal(tr[r].rc, GS__ERR_DATA_PLANE);
    assert_true(tr[r].ms >= 400 && tr[r].ms < HANG_GUARD_MS / 2);
    assert_non_null(strstr(tr[r].err, "lost its connection to rank 2 (127.0.0.1:"));
  }
  assert_non_null(strstr(tr[0].err, "shm: rank 0 (leader of host 0): agree between the hosts:"));
  assert_non_null(
      strstr(tr[1].err, "shm: rank 1: agree stopped because rank 0 on this host gave up"));
  pthread_mutex_destroy(&j.mu);
}

/* agree_until / agree_resume (a fast round that an application thread
 * runs inside a wait with a deadline, worker/fast_round.c): 3 ranks on one
 * host, rank 2 enters 300 ms late. Ranks 0 and 1 give up at a 50 ms
 * deadline (GS__ERR_TIMEOUT, parked, no earlier than the deadline) and a
 * second thread resumes each agreement: the minimum is right on every
 * rank. Then with every rank in, agree_until with a far deadline is an
 * agree. Where it cannot park (more than one chunk) it refuses with
 * GS__ERR_UNSUPPORTED and posts nothing: a plain agree of every rank is
 * still in step. Last, rank 0 parks while nobody comes and its backend
 * is aborted: agree_resume returns GS__ERR_ABORTED. */
typedef struct resume_arg {
  gs__backend *b;
  int rc;
  char err[2048];
} resume_arg;

static void *resume_thread(void *p) {
  resume_arg *a = p;
  a->rc = a->b->v->agree_resume(a->b, a->err, sizeof a->err);
  return NULL;
}

static int64_t now_ns_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *agree_until_rank(void *arg) {
  trank *t = arg;
  tjob *j = t->j;
  char err[2048];
  gs__backend *b = make_rank(j, t->rank, err, sizeof err);
  if (!b) {
    record(j, "rank %d: create failed: %s", t->rank, err);
    return NULL;
  }
  uint8_t buf[40];
  size_t n = sizeof buf;
  for (size_t i = 0; i < n; i++) buf[i] = agree_val(0, t->rank, i);
  if (t->rank == 2) {
    usleep(300000);
    if (b->v->agree(b, buf, n, GS__UINT8, GS__MIN, err, sizeof err))
      record(j, "rank 2: the late agree failed: %s", err);
  } else {
    int64_t t0 = now_ms();
    int rc =
        b->v->agree_until(b, buf, n, GS__UINT8, GS__MIN, now_ns_mono() + 50000000, err, sizeof err);
    int64_t ms = now_ms() - t0;
    if (rc != GS__ERR_TIMEOUT || ms < 50 || ms >= 300)
      record(j,
             "rank %d: agree_until before the late rank came: rc %d after %lld ms (want %d "
             "at its 50 ms deadline): %s",
             t->rank, rc, (long long)ms, GS__ERR_TIMEOUT, err);
    resume_arg ra = {.b = b};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, resume_thread, &ra), 0);
    pthread_join(th, NULL);
    if (ra.rc) record(j, "rank %d: agree_resume failed: %s", t->rank, ra.err);
  }
  for (size_t i = 0; i < n; i++) {
    uint8_t want = 255;
    for (int q = 0; q < j->size; q++)
      if (agree_val(0, q, i) < want) want = agree_val(0, q, i);
    if (buf[i] != want) {
      record(j, "rank %d: parked agree: byte %zu is %u, want %u", t->rank, i, buf[i], want);
      break;
    }
  }
  float fv[5];
  for (size_t i = 0; i < 5; i++) fv[i] = (float)(i + (size_t)t->rank);
  int rc = b->v->agree_until(b, fv, 5, GS__FLOAT32, GS__SUM, now_ns_mono() + 60000000000LL, err,
                             sizeof err);
  if (rc || fv[0] != 3 || fv[4] != 15)
    record(j, "rank %d: agree_until with every rank in: rc %d, %g %g: %s", t->rank, rc,
           (double)fv[0], (double)fv[4], err);
  static uint8_t big[TEST_CHUNK + 1];
  rc = b->v->agree_until(b, big, sizeof big, GS__UINT8, GS__MIN, now_ns_mono() + 60000000000LL, err,
                         sizeof err);
  if (rc != GS__ERR_UNSUPPORTED)
    record(j, "rank %d: agree_until across two chunks: rc %d, want %d", t->rank, rc,
           GS__ERR_UNSUPPORTED);
  uint8_t one = (uint8_t)(t->rank + 1);
  if (b->v->agree(b, &one, 1, GS__UINT8, GS__MIN, err, sizeof err) || one != 1)
    record(j, "rank %d: agree after a refused agree_until: %u: %s", t->rank, one, err);
  gs__backend_destroy(b);
  return NULL;
}

static void test_agree_until_park(void **state) {
  (void)state;
  tjob j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.mu, NULL);
  j.size = 3;
  j.nhosts = 1;
  j.leader_port_key = 2100;
  j.io_ms = 100; /* the wait for a late peer is not bounded by it, parked or not */
  seg_name(j.seg[0], sizeof j.seg[0]);
  trank tr[3];
  run_ranks(&j, tr, agree_until_rank);
  assert_false(seg_exists(j.seg[0]));
  pthread_mutex_destroy(&j.mu);
}

static void *park_alone_rank(void *arg) {
  trank *t = arg;
  tjob *j = t->j;
  char err[2048];
  gs__backend *b = make_rank(j, t->rank, err, sizeof err);
  if (!b) {
    record(j, "rank %d: create failed: %s", t->rank, err);
    return NULL;
  }
  if (t->rank == 0) {
    uint8_t v[8] = {0};
    int rc = b->v->agree_until(b, v, sizeof v, GS__UINT8, GS__MIN, now_ns_mono() + 20000000, err,
                               sizeof err);
    if (rc != GS__ERR_TIMEOUT) record(j, "rank 0: agree_until alone: rc %d: %s", rc, err);
    b->v->abort(b);
    t->rc = b->v->agree_resume(b, t->err, sizeof t->err);
  } else {
    usleep(200000); /* never enters: rank 0's backend is aborted meanwhile */
  }
  gs__backend_destroy(b);
  return NULL;
}

static void test_agree_until_abort_parked(void **state) {
  (void)state;
  tjob j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.mu, NULL);
  j.size = 2;
  j.nhosts = 1;
  j.leader_port_key = 2200;
  j.io_ms = 100;
  seg_name(j.seg[0], sizeof j.seg[0]);
  trank tr[2];
  run_ranks(&j, tr, park_alone_rank);
  print_message("rank 0: %s\n", tr[0].err);
  assert_int_equal(tr[0].rc, GS__ERR_ABORTED);
  pthread_mutex_destroy(&j.mu);
}

/* ---- faults, with forked ranks ---------------------------------------------- */

static gs__backend *make_local(int rank, int size, const char *seg, int connect_ms, int io_ms,
                               char *err, size_t errlen) {
  int local[8];
  for (int q = 0; q < size; q++) local[q] = q;
  gs__shm_opts o = {.rank = rank,
                    .size = size,
                    .local_ranks = local,
                    .nlocal = size,
                    .host_index = 0,
                    .nhosts = 1,
                    .segment = seg,
                    .connect_timeout_ms = connect_ms,
                    .io_timeout_ms = io_ms};
  gs__backend *b = NULL;
  return gs__shm_create(&o, &b, err, errlen) == GS__OK ? b : NULL;
}

/* A child rank: creates, runs steps allreduces, then sleeps until killed. */
static pid_t fork_rank(int rank, int size, const char *seg, int steps) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  char err[1024];
  alarm(60); /* never outlive a broken test */
  gs__backend *b = make_local(rank, size, seg, HANG_GUARD_MS, HANG_GUARD_MS, err, sizeof err);
  if (!b) _exit(2);
  float v[1000];
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < 1000; i++) v[i] = 1;
    if (b->v->allreduce(b, v, 1000, GS__FLOAT32, GS__SUM, err, sizeof err)) _exit(3);
  }
  for (;;) pause();
}

static void kill_wait(pid_t pid) {
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
}

/* kill -9 of a rank between collectives: the next one fails on the
 * survivor within a bounded time, naming the dead rank; nothing left in
 * /dev/shm. */
static void test_kill9_peer(void **state) {
  (void)state;
  char seg[128], err[2048];
  seg_name(seg, sizeof seg);
  pid_t child = fork_rank(1, 2, seg, 1);
  gs__backend *b = make_local(0, 2, seg, HANG_GUARD_MS, HANG_GUARD_MS, err, sizeof err);
  if (!b) fail_msg("create: %s", err);
  assert_false(seg_exists(seg)); /* unlinked as soon as both mapped it */
  float v[1000];
  for (int i = 0; i < 1000; i++) v[i] = 2;
  assert_int_equal(b->v->allreduce(b, v, 1000, GS__FLOAT32, GS__SUM, err, sizeof err), GS__OK);
  assert_true(v[0] == 3.0f && v[999] == 3.0f);
  kill_wait(child);
  int64_t t0 = now_ms();
  int rc = b->v->allreduce(b, v, 1000, GS__FLOAT32, GS__SUM, err, sizeof err);
  assert_int_equal(rc, GS__ERR_DATA_PLANE);
  assert_true(now_ms() - t0 < HANG_GUARD_MS);
  if (!strstr(err, "the shared-memory connection to rank 1 is lost") ||
      !strstr(err, "exited while rank 0 waited for it in allreduce"))
    fail_msg("unexpected error: %s", err);
  /* later calls repeat the failure */
  rc = b->v->allreduce(b, v, 1000, GS__FLOAT32, GS__SUM, err, sizeof err);
  assert_int_equal(rc, GS__ERR_DATA_PLANE);
  assert_non_null(strstr(err, "out of step"));
  gs__backend_destroy(b);
  assert_false(seg_exists(seg));
}

/* kill -9 of the leader right after it created the segment, before the
 * other rank mapped it: the survivor still gets in, unlinks the name, and
 * its first collective fails naming the leader. */
static void test_kill9_leader_before_attach(void **state) {
  (void)state;
  char seg[128], err[2048];
  seg_name(seg, sizeof seg);
  pid_t leader = fork_rank(0, 2, seg, 0);
  int64_t t0 = now_ms();
  /* created and sized (posix_fallocate sets the size once the pages are
   * reserved: slow under load), then a moment to initialise the header */
  while (seg_bytes_now(seg) <= 0 && now_ms() - t0 < HANG_GUARD_MS) usleep(1000);
  assert_true(seg_bytes_now(seg) > 0);
  usleep(50000);
  kill_wait(leader);
  assert_true(seg_exists(seg)); /* what kill -9 alone would leave behind */
  gs__backend *b = make_local(1, 2, seg, HANG_GUARD_MS, HANG_GUARD_MS, err, sizeof err);
  if (!b) fail_msg("create: %s", err);
  assert_false(seg_exists(seg));
  float v[10] = {0};
  int rc = b->v->allreduce(b, v, 10, GS__FLOAT32, GS__SUM, err, sizeof err);
  assert_int_equal(rc, GS__ERR_DATA_PLANE);
  if (!strstr(err, "connection to rank 0 is lost")) fail_msg("unexpected error: %s", err);
  gs__backend_destroy(b);
}

/* The host's leader dies after creating the segment but before sizing it
 * (or before creating it at all): the waiting rank fails as soon as the
 * leader's process is gone, naming the leader's rank, pid and host and
 * itself, long before its connect timeout; the name is removed. The
 * leader's steps cannot be paused inside gs__shm_create, so a child makes
 * the state such a leader leaves: the name created by shm_open with
 * O_CREAT | O_EXCL (size 0), then kill -9. */
static void test_leader_dies_before_sizing(void **state) {
  (void)state;
  for (int created = 1; created >= 0; created--) {
    char seg[128], err[2048];
    seg_name(seg, sizeof seg);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t leader = fork();
    if (leader == 0) {
      alarm(60);
      if (created && shm_open(seg, O_CREAT | O_EXCL | O_RDWR, 0600) < 0) _exit(2);
      if (write(pfd[1], "x", 1) != 1) _exit(3);
      for (;;) pause();
    }
    char c;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    close(pfd[0]);
    close(pfd[1]);
    kill_wait(leader);
    assert_int_equal(seg_bytes_now(seg), created ? 0 : -1);
    int local[2] = {0, 1};
    gs__shm_opts o = {.rank = 1,
                      .size = 2,
                      .local_ranks = local,
                      .nlocal = 2,
                      .nhosts = 1,
                      .segment = seg,
                      .connect_timeout_ms = 200000, /* what the test must not wait for */
                      .io_timeout_ms = HANG_GUARD_MS,
                      .leader_pid = (int)leader,
                      .host = "testhost"};
    gs__backend *b = NULL;
    int64_t t0 = now_ms();
    int rc = gs__shm_create(&o, &b, err, sizeof err);
    int64_t took = now_ms() - t0;
    assert_null(b);
    if (rc != GS__ERR_DATA_PLANE) fail_msg("want a data-plane error, got %d: %s", rc, err);
    print_message("%s (%lld ms)\n", err, (long long)took);
    assert_true(took < 60000); /* a hang guard: the connect timeout is 200 s */
    char want[256];
    snprintf(want, sizeof want,
             "rank 0 (this host's leader, pid %d on testhost) exited before it %s", (int)leader,
             created ? "sized" : "created");
    if (!strstr(err, "shm: rank 1 on testhost:") || !strstr(err, want) || !strstr(err, seg))
      fail_msg("unexpected error: %s", err);
    assert_false(seg_exists(seg));
  }
}

/* A local rank that never comes: the leader gives up after the connect
 * timeout naming it, and removes the name. */
static void test_peer_never_attaches(void **state) {
  (void)state;
  char seg[128], err[2048];
  seg_name(seg, sizeof seg);
  int64_t t0 = now_ms();
  gs__backend *b = make_local(0, 3, seg, 400, 400, err, sizeof err);
  assert_null(b);
  assert_true(now_ms() - t0 < HANG_GUARD_MS);
  if (!strstr(err, "ranks [1,2] on this host did not map the shared-memory segment"))
    fail_msg("unexpected error: %s", err);
  assert_false(seg_exists(seg));
  /* and a non-leader whose leader never creates the segment */
  seg_name(seg, sizeof seg);
  b = make_local(1, 2, seg, 400, 400, err, sizeof err);
  assert_null(b);
  if (!strstr(err, "rank 0 (this host's leader) did not create the shared-memory segment"))
    fail_msg("unexpected error: %s", err);
  assert_false(seg_exists(seg));
}

typedef struct abort_arg {
  gs__backend *b;
  int rc;
  char err[1024];
  int64_t ms;
} abort_arg;

static void *lone_allreduce(void *p) {
  abort_arg *a = p;
  float v[4096] = {0};
  int64_t t0 = now_ms();
  a->rc = a->b->v->allreduce(a->b, v, 4096, GS__FLOAT32, GS__SUM, a->err, sizeof a->err);
  a->ms = now_ms() - t0;
  return NULL;
}

/* abort() from another thread wakes a rank waiting for a peer that is
 * alive but never calls: GS__ERR_ABORTED at once, not after the timeout. */
static void test_abort_wakes_waiter(void **state) {
  (void)state;
  char seg[128], err[1024];
  seg_name(seg, sizeof seg);
  pid_t child = fork_rank(1, 2, seg, 0); /* maps, then only sleeps */
  abort_arg a = {0};
  a.b = make_local(0, 2, seg, HANG_GUARD_MS, HANG_GUARD_MS, err, sizeof err);
  if (!a.b) fail_msg("create: %s", err);
  pthread_t th;
  pthread_create(&th, NULL, lone_allreduce, &a);
  usleep(300000);
  a.b->v->abort(a.b);
  pthread_join(th, NULL);
  assert_int_equal(a.rc, GS__ERR_ABORTED);
  assert_true(a.ms < HANG_GUARD_MS / 2);
  assert_non_null(strstr(a.err, "allreduce aborted"));
  gs__backend_destroy(a.b);
  kill_wait(child);
  assert_false(seg_exists(seg));
}

/* A peer that is alive but stuck: the wait ends at the io timeout naming
 * it, and the peer, when it comes, learns who gave up. */
static void test_stuck_peer_times_out(void **state) {
  (void)state;
  char seg[128], err[1024];
  seg_name(seg, sizeof seg);
  pid_t child = fork_rank(1, 2, seg, 0);
  gs__backend *b = make_local(0, 2, seg, HANG_GUARD_MS, 300, err, sizeof err);
  if (!b) fail_msg("create: %s", err);
  float v[16] = {0};
  int rc = b->v->allreduce(b, v, 16, GS__FLOAT32, GS__SUM, err, sizeof err);
  assert_int_equal(rc, GS__ERR_DATA_PLANE);
  if (!strstr(err, "rank 0 waited 300 ms (GRADSYNC_DATA_TIMEOUT_MS) for rank 1 in allreduce"))
    fail_msg("unexpected error: %s", err);
  gs__backend_destroy(b);
  kill_wait(child);
}

static void *lone_agree(void *p) {
  abort_arg *a = p;
  uint8_t v[100];
  memset(v, 1, sizeof v);
  int64_t t0 = now_ms();
  a->rc = a->b->v->agree(a->b, v, sizeof v, GS__UINT8, GS__MIN, a->err, sizeof a->err);
  a->ms = now_ms() - t0;
  return NULL;
}

/* agree waits for a peer that is alive but has not entered, past the
 * 100 ms io timeout, until abort() from another thread: GS__ERR_ABORTED. */
static void test_agree_abort(void **state) {
  (void)state;
  char seg[128], err[1024];
  seg_name(seg, sizeof seg);
  pid_t child = fork_rank(1, 2, seg, 0); /* maps, then only sleeps */
  abort_arg a = {0};
  a.b = make_local(0, 2, seg, HANG_GUARD_MS, 100, err, sizeof err);
  if (!a.b) fail_msg("create: %s", err);
  pthread_t th;
  pthread_create(&th, NULL, lone_agree, &a);
  usleep(600000);
  a.b->v->abort(a.b);
  pthread_join(th, NULL);
  print_message("%s (%lld ms)\n", a.err, (long long)a.ms);
  assert_int_equal(a.rc, GS__ERR_ABORTED);
  assert_non_null(strstr(a.err, "shm: rank 0: agree aborted"));
  assert_true(a.ms >= 500);              /* not ended by the io timeout */
  assert_true(a.ms < HANG_GUARD_MS / 2); /* promptly */
  gs__backend_destroy(a.b);
  kill_wait(child);
  assert_false(seg_exists(seg));
}

/* kill -9 of a peer that has not entered agree, long after the io
 * timeout: the waiter fails within a bounded time, naming it. */
static void test_agree_peer_killed(void **state) {
  (void)state;
  char seg[128], err[1024];
  seg_name(seg, sizeof seg);
  pid_t child = fork_rank(2, 3, seg, 0), child1 = fork_rank(1, 3, seg, 0);
  abort_arg a = {0};
  a.b = make_local(0, 3, seg, HANG_GUARD_MS, 100, err, sizeof err);
  if (!a.b) fail_msg("create: %s", err);
  pthread_t th;
  pthread_create(&th, NULL, lone_agree, &a);
  usleep(600000);
  kill_wait(child);
  pthread_join(th, NULL);
  print_message("%s (%lld ms)\n", a.err, (long long)a.ms);
  assert_int_equal(a.rc, GS__ERR_DATA_PLANE);
  char want[128];
  snprintf(want, sizeof want, "rank 2 (pid %d) exited while rank 0 waited for it in agree",
           (int)child);
  if (!strstr(a.err, "the shared-memory connection to rank 2 is lost") || !strstr(a.err, want))
    fail_msg("unexpected error: %s", a.err);
  assert_true(a.ms >= 500 && a.ms < HANG_GUARD_MS / 2);
  gs__backend_destroy(a.b);
  kill_wait(child1);
  assert_false(seg_exists(seg));
}

typedef struct agree_arg {
  const char *seg;
  int rank, delay_ms, abort_first, rc;
  char err[1024];
  int64_t ms;
} agree_arg;

static void *agree_thread(void *p) {
  agree_arg *a = p;
  gs__backend *b = make_local(a->rank, 2, a->seg, HANG_GUARD_MS, 100, a->err, sizeof a->err);
  if (!b) {
    a->rc = -1;
    return NULL;
  }
  usleep((useconds_t)a->delay_ms * 1000);
  if (a->abort_first) b->v->abort(b);
  uint8_t v[10] = {0};
  int64_t t0 = now_ms();
  a->rc = b->v->agree(b, v, sizeof v, GS__UINT8, GS__MIN, a->err, sizeof a->err);
  a->ms = now_ms() - t0;
  gs__backend_destroy(b);
  return NULL;
}

/* A rank aborted before it enters (the abort came while it was not in a
 * collective) tells its peers when it does: rank 0, waiting in agree with
 * no timeout, fails then, naming it, instead of waiting for ever. */
static void test_agree_peer_aborted(void **state) {
  (void)state;
  char seg[128];
  seg_name(seg, sizeof seg);
  agree_arg a[2] = {{.seg = seg, .rank = 0},
                    {.seg = seg, .rank = 1, .delay_ms = 500, .abort_first = 1}};
  pthread_t th[2];
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, agree_thread, &a[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  print_message("rank 0: %s (%lld ms)\n", a[0].err, (long long)a[0].ms);
  assert_int_equal(a[1].rc, GS__ERR_ABORTED);
  assert_int_equal(a[0].rc, GS__ERR_DATA_PLANE);
  if (!strstr(a[0].err, "agree stopped because rank 1 on this host gave up: rank 1 aborted"))
    fail_msg("unexpected error: %s", a[0].err);
  assert_true(a[0].ms >= 400 && a[0].ms < HANG_GUARD_MS / 2);
  assert_false(seg_exists(seg));
}

/* Bad arguments are refused with a message, and change nothing. */
static void test_bad_args(void **state) {
  (void)state;
  char seg[128], err[1024];
  seg_name(seg, sizeof seg);
  gs__backend *b = make_local(0, 1, seg, 100, 100, err, sizeof err);
  assert_non_null(b);
  float v[4] = {1, 2, 3, 4};
  assert_int_equal(b->v->allreduce(b, v, 4, GS__FLOAT32, GS__ADASUM, err, sizeof err),
                   GS__ERR_UNSUPPORTED);
  assert_non_null(strstr(err, "adasum"));
  assert_int_equal(b->v->allreduce(b, v, 4, (gs__dtype)99, GS__SUM, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_int_equal(b->v->broadcast(b, v, 16, 3, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_non_null(strstr(err, "root 3 is not a rank of this job (0..0)"));
  assert_true(v[0] == 1 && v[3] == 4);
  gs__backend_destroy(b);
  int local[2] = {0, 1};
  gs__shm_opts o = {.rank = 2,
                    .size = 2,
                    .local_ranks = local,
                    .nlocal = 2,
                    .nhosts = 1,
                    .segment = seg,
                    .connect_timeout_ms = 1,
                    .io_timeout_ms = 1};
  assert_int_equal(gs__shm_create(&o, &b, err, sizeof err), GS__ERR_INVALID_ARG);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_dtype_op_2),
      cmocka_unit_test(test_every_dtype_op_2_defaults),
      cmocka_unit_test(test_every_dtype_op_3),
      cmocka_unit_test(test_every_dtype_op_3_defaults),
      cmocka_unit_test(test_every_dtype_op_4),
      cmocka_unit_test(test_hierarchical_2x2),
      cmocka_unit_test(test_hierarchical_2x1),
      cmocka_unit_test(test_hierarchical_2x2_deterministic),
      cmocka_unit_test(test_hierarchical_2x2_defaults),
      cmocka_unit_test(test_agree_values),
      cmocka_unit_test(test_agree_late_peer),
      cmocka_unit_test(test_agree_hierarchical_host_leaves),
      cmocka_unit_test(test_agree_until_park),
      cmocka_unit_test(test_agree_until_abort_parked),
      cmocka_unit_test(test_kill9_peer),
      cmocka_unit_test(test_kill9_leader_before_attach),
      cmocka_unit_test(test_leader_dies_before_sizing),
      cmocka_unit_test(test_peer_never_attaches),
      cmocka_unit_test(test_abort_wakes_waiter),
      cmocka_unit_test(test_stuck_peer_times_out),
      cmocka_unit_test(test_agree_abort),
      cmocka_unit_test(test_agree_peer_killed),
      cmocka_unit_test(test_agree_peer_aborted),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
