/* gs-fast-worker: a real worker process for test_fastpath (the fast path of
 * issue 14: ranks agreeing on cached ops among themselves after the
 * coordinator's marker).
 *
 * Every mode runs training-like steps over one tensor set: NT float32
 * allreduces (average) of different sizes, an int32 sum and a float64
 * broadcast from the last rank. The first steps go
 * through the coordinator (nothing is cached yet); the later ones run in
 * fast rounds. Every value is checked against a reference computed here;
 * every step prints its gs_get_stats deltas:
 *   "fast: rank R step S: tensors=T requests=Q fast_tensors=F fast_rounds=N escalations=E
 *    rides=D"
 * and success ends with "fast: passed (rank R of N, S steps)".
 *
 * Usage: gs-fast-worker MODE STEPS [ARG] (environment as gradsync-run sets)
 *   steps N WAIT       N steps; WAIT = block | timed (gs_wait(h, 50) in a
 *                      loop) | poll (gs_test every 1 ms) | paced (block,
 *                      then 40 ms between steps) | short (gs_wait(h, 1) in
 *                      a loop while the last rank submits each step 10 ms
 *                      late: every timed-out wait must have lasted its 1
 *                      ms, with the usual text; prints "fast: rank R short
 *                      timeouts=T") | busy (the rank binds itself to
 *                      one cpu, GRADSYNC_RANK modulo the cpus it may use,
 *                      before gs_init, and looks with gs_test in a loop
 *                      that never sleeps or yields: an application
 *                      computing while its ops run, on the cpu its library
 *                      threads share)
 *   dup N              N steps, then step N+1 with refusals while an op is in
 *                      flight on rank R: fast/t0<R % 2> (a cached name,
 *                      listed in its cache entry) submitted again twice
 *                      (the second found by the name prediction), a group
 *                      naming fast/t02 twice (all or none: t02 and t03 are
 *                      then submitted as usual), gs_register_local of it,
 *                      and on rank 0 'fast/dupnew' (never seen: in the
 *                      table of uncached ops) twice; each refusal prints
 *                      "fast: rank R dup WHAT: STATUS: TEXT" (np 2: mark
 *                      files in $GS_TEST_DIR keep those ops pending
 *                      meanwhile); every value checked; then two steps
 *   vary N             N steps, each also allreducing 'fast/vary' first, as
 *                      float32 average of 5, int32 sum of 9, float64 max of
 *                      shape [3, 2] (postscale 2) in turn: a cached name
 *                      submitted again with another count, dtype, op,
 *                      shape or scale must give that op's exact values
 *   newtensor N K      in step K a tensor never seen before is submitted in
 *                      the middle of the step ('fast/new.K')
 *   reorder N K        in step K rank 1 submits the step in reverse order
 *   ride N K           N steps of float32 allreduces that ride in the
 *                      agreement (sum, average, pre-/postscale) beside ones
 *                      that do not (1600 B, int32); in step K 'ride/late'
 *                      (submitted last) is queued on rank 0 alone until
 *                      the others have finished the rest of the step and
 *                      slept 100 ms
 *   join N             rank 1 calls gs_join while the others allreduce
 *                      'ride/j' 3 times (checked: rank 1 adds zeros), then
 *                      they join too, then N steps as ride (no late op):
 *                      rank 1 never held 'ride/j', whose id is live
 *   barrier N          each step: a mark file, gs_barrier, then every rank's
 *                      mark of the step must exist (in $GS_TEST_DIR); rank r
 *                      sleeps r * 30 ms before the barrier
 *   deadlock K         in step K (after K - 1 normal steps) rank 0 submits
 *                      only fast/t00, rank 1 only fast/t01, the others both,
 *                      and waits: every rank must fail with GS_ERR_DEADLOCK
 *   leave K [timed]    in step K the last rank calls gs_shutdown while the
 *                      others wait on fast/t00: their op must fail naming it
 *                      (timed: they wait in gs_wait(h, 50) slices, as
 *                      Python's synchronize(); so does hang K timed)
 *   shutdown K [timed] in step K rank 0 submits fast/t00 and calls gs_shutdown
 *                      at once (its op waits in a fast round; timed: after
 *                      a gs_wait(h, 100) that must time out first): the op
 *                      must fail with gs_shutdown's text; the others
 *                      submit it 300 ms later and it must fail naming
 *                      rank 0
 *   hang K             in step K the last rank prints "hanging" and sleeps
 *                      (the driver kill -9s it); the others wait on
 *                      fast/t00, which must fail naming it
 *   unregister N       every rank registers 'fast/tower' local before the
 *                      steps (its op completes at once); after N steps
 *                      rank r sleeps r * 100 ms, unregisters it and calls
 *                      gs_barrier, printing "fast: rank R unregister
 *                      barrier: requests=Q escalations=E"; then every rank
 *                      allreduces (sum) 'fast/tower', checked, and runs one
 *                      more step
 *   group N K          N steps of the same ops, some grouped: fast/t00..t05
 *                      as one gs_grouped_allreduce_async, t06 alone,
 *                      t07..t09 as another group, t10, t11, the int32 sum
 *                      and the broadcast alone; in step K (0: none) rank 1
 *                      groups t00..t05 in the reverse order: they must fail
 *                      on every rank, which prints "fast: rank R step K
 *                      group failed: STATUS: TEXT" (t00's), and the rest of
 *                      the step completes right
 *   gather N K         steps 1..K each begin with an allgather 'fast/gather'
 *                      (float32 [1, 3], rank r sends r*10 + 0..2; checked),
 *                      which a fast round cannot run, then the usual ops;
 *                      steps K+1..N are the usual ops only, 20 ms apart
 *   timeout N K        steps K..N: rank 0 submits at once, the others once
 *                      it timed out (a file in $GS_TEST_DIR) and 50 ms later;
 *                      rank 0's gs_wait(t00, 30) must time out with
 *                      the op pending, later waits complete it (right
 *                      value), while a second thread waits on t01 without a
 *                      timeout; prints "fast: rank R timeouts=T" (steps K..N)
 *   threads N          TH application threads per rank, each its own
 *                      TH_OPS float32 averages ('fast/th<t>.<k>'), N steps
 *                      each (submit all, wait all, check, free), with no
 *                      order between the threads: every value must be
 *                      right whatever rounds or escalations that makes
 *                      (handles made and freed on several threads at once)
 *   persist N D        persistent allreduces (gs_allreduce_init, gs_startall):
 *                      the ride ops but 'ride/late', made once; N steps
 *                      each starting them in two gs_startall calls
 *                      (waited on with gs_wait, or gs_wait_any in even
 *                      steps; in
 *                      step N/2+1 a tensor never seen before,
 *                      'persist/new', between them); a local name refused
 *                      at init ("persist: rank R local: STATUS: TEXT"); then
 *                      rank 1 alone starts 'persist/solo' and prints the
 *                      refusals "persist: rank 1 WHAT: STATUS: TEXT" of:
 *                      starting it again (active), a gs_startall listing
 *                      'ride/sum' twice (twice), one with 'persist/solo'
 *                      last (allornone; the others must stay inactive),
 *                      that op and gs_allreduce_async's 'persist/dup'
 *                      (notpersistent), 'persist/dup' while that one is
 *                      in flight (dup); gs_barrier, rank 0 starts its
 *                      'persist/solo' and 'persist/dup', all checked; 20
 *                      steps while a second thread restarts 'persist/th'
 *                      200 times the moment gs_wait returns (checked);
 *                      'persist/free' started and freed while active; one
 *                      more step. D = 1: then rank 0 starts
 *                      'persist/solo', rank 1 'persist/dup': GS_ERR_DEADLOCK,
 *                      and a gs_startall and a gs_allreduce_async after it
 *                      print "persist: rank R failed job start|async:
 *                      STATUS: TEXT". Persistent ops freed inactive after
 *                      gs_shutdown.
 *   bigwait N          N steps of 'fast/big' alone (float32 sum of BIG_COUNT,
 *                      128 MiB); from step 3 (fast rounds) rank 1 submits
 *                      first and waits (its round waits for rank 0 in the
 *                      agreement), rank 0 submits 100 ms after rank 1's
 *                      mark file and calls gs_wait(h, 1): an allreduce of
 *                      128 MiB cannot be done within 1 ms, so it must time
 *                      out (the op pending, the usual text) even when the
 *                      waiting thread runs the round itself; then
 *                      gs_wait(h, -1), every value checked; prints "fast:
 *                      rank 0 bigwait step S: gs_wait(h, 1): STATUS after
 *                      T ms"
 *   twowait N          2 steps of the usual ops, then steps 3..N of fast/t00
 *                      and fast/t01 alone: on rank 0 a second thread
 *                      submits t00 and waits on it (it runs the round,
 *                      which waits for rank 1 in the agreement), then the
 *                      main thread submits t01 50 ms later and waits on it
 *                      (a round is in progress: it sleeps); rank 1
 *                      submits both 50 ms after rank 0's mark file. t01
 *                      was not in the first round: it must still complete
 *                      (the thread that ran the round hands what is left
 *                      to the exec thread); both values checked
 *   fork N             N steps; in step 3 rank 0 forks right after its
 *                      submissions (its ops queued for a fast round that no
 *                      thread has started) and rank 1 submits 200 ms later:
 *                      in the child, gs_wait(fast/t00, 100) must fail with
 *                      GS_ERR_FORKED and the fork text (it must not run the
 *                      round on the parent's segment), and gs_shutdown too;
 *                      the parent's step completes with the right values
 *                      and so do the later steps ("fast: rank 0 fork
 *                      child: STATUS: TEXT")
 * With GS_TEST_BIND_ONE_CPU=1 the process binds itself, before gs_init (so
 * the library's threads too), to one cpu of those it may run on: the
 * (rank mod count)-th. As a rank under --bind-to core: the exec thread
 * shares the cpu with the application, which then runs most fast rounds
 * itself inside its waits (worker/api.c, caller_round_due_locked). Prints
 * "fast: rank R bound to cpu C".
 * Failures: "rank R: FAIL: ..." and exit 1 (worker_util.c). Single-threaded
 * except the threads mode. */
#include "gradsync.h"
#include "worker_util.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NT 12         /* float32 tensors per step */
#define WAIT_MS 60000 /* one op never takes this long on a healthy job */
#define ERR_MS 30000  /* an op that must fail does so within this */

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

typedef enum wait_style {
  WAIT_BLOCK,
  WAIT_TIMED,
  WAIT_POLL,
  WAIT_PACED,
  WAIT_SHORT,
  WAIT_BUSY
} wait_style;

static int g_short_timeouts; /* WAIT_SHORT: gs_wait(h, 1) calls that timed out */

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One op of a step. */
typedef struct op {
  char name[64];
  int kind; /* 0 float32 average, 1 int32 sum, 2 float64 broadcast */
  size_t count;
  void *buf;
  gs_handle *h;
} op;

static int base(size_t i, size_t j, int s) {
  return (int)((i * 7 + j + (size_t)s * 3) % 17) - 8;
}

static void fill(op *o, size_t i, int s) {
  for (size_t j = 0; j < o->count; j++) {
    if (o->kind == 0) ((float *)o->buf)[j] = (float)(base(i, j, s) * (g_rank + 1));
    if (o->kind == 1) ((int32_t *)o->buf)[j] = base(i, j, s) * (g_rank + 1);
    if (o->kind == 2) ((double *)o->buf)[j] = (double)(g_rank + 1) * 1000 + s + (double)j;
  }
}

static void check(const op *o, size_t i, int s) {
  int w = g_size * (g_size + 1) / 2; /* sum over ranks of (r + 1) */
  int root = g_size - 1;
  for (size_t j = 0; j < o->count; j++) {
    double got = 0, want = 0;
    if (o->kind == 0) {
      got = ((float *)o->buf)[j];
      want = (double)((float)(base(i, j, s) * w) / (float)g_size);
    } else if (o->kind == 1) {
      got = ((int32_t *)o->buf)[j];
      want = base(i, j, s) * w;
    } else {
      got = ((double *)o->buf)[j];
      want = (double)(root + 1) * 1000 + s + (double)j;
    }
    if (got != want)
      wu_die("tensor '%s' (step %d): element %zu: got %.9g, expected %.9g", o->name, s, j, got,
             want);
  }
}

static void submit(gs_ctx *ctx, op *o) {
  gs_status st;
  if (o->kind == 0)
    st = gs_allreduce_async(ctx, o->name, o->buf, o->buf, o->count, GS_FLOAT32, GS_AVERAGE, NULL,
                            &o->h);
  else if (o->kind == 1)
    st = gs_allreduce_async(ctx, o->name, o->buf, o->buf, o->count, GS_INT32, GS_SUM, NULL, &o->h);
  else
    st = gs_broadcast_async(ctx, o->name, o->buf, o->count, GS_FLOAT64, g_size - 1, NULL, &o->h);
  if (st != GS_OK)
    wu_die("tensor '%s': submitting: %s: %s", o->name, wu_status_name(st), gs_last_error(ctx));
}

/* Waits for o in the given style; returns its status. */
static gs_status wait_op(op *o, wait_style style, int timeout_ms) {
  if (style == WAIT_BLOCK || style == WAIT_PACED) return gs_wait(o->h, timeout_ms);
  if (style == WAIT_SHORT) {
    /* gs_wait's timeout is a promise both ways: not GS_ERR_TIMEOUT before
     * it has passed (a wait may spin first: it must still honour it). */
    for (double start = mono_ms();;) {
      double t0 = mono_ms();
      gs_status st = gs_wait(o->h, 1);
      double took = mono_ms() - t0;
      if (st != GS_ERR_TIMEOUT) return st;
      if (took < 1.0)
        wu_die("tensor '%s': gs_wait(h, 1) returned GS_ERR_TIMEOUT after %.3f ms, before its "
               "timeout",
               o->name, took);
      const char *e = gs_last_error(NULL);
      if (!e || !strstr(e, "gs_wait: timed out after 1 ms; the op is still pending"))
        wu_die("tensor '%s': timeout text: %s", o->name, e ? e : "(none)");
      g_short_timeouts++;
      if (mono_ms() - start > timeout_ms) return GS_ERR_TIMEOUT;
    }
  }
  if (style == WAIT_BUSY) {
    for (double start = mono_ms(); mono_ms() - start < timeout_ms;) {
      int done = 0;
      if (gs_test(o->h, &done) != GS_OK) wu_die("tensor '%s': gs_test failed", o->name);
      if (done) return gs_wait(o->h, 0);
    }
    return GS_ERR_TIMEOUT;
  }
  for (int waited = 0; waited < timeout_ms;) {
    if (style == WAIT_TIMED) {
      gs_status st = gs_wait(o->h, 50);
      if (st != GS_ERR_TIMEOUT) return st;
      waited += 50;
    } else {
      int done = 0;
      if (gs_test(o->h, &done) != GS_OK) wu_die("tensor '%s': gs_test failed", o->name);
      if (done) return gs_wait(o->h, 0);
      sleep_ms(1);
      waited += 1;
    }
  }
  return GS_ERR_TIMEOUT;
}

static gs_stats stats_now(const gs_ctx *ctx) {
  gs_stats st;
  gs_stats_init(&st);
  if (gs_get_stats(ctx, &st) != GS_OK) wu_die("gs_get_stats: %s", gs_last_error(ctx));
  return st;
}

static void print_step(int s, const gs_stats *a, const gs_stats *b) {
  printf("fast: rank %d step %d: tensors=%llu requests=%llu fast_tensors=%llu fast_rounds=%llu "
         "escalations=%llu rides=%llu\n",
         g_rank, s, (unsigned long long)(b->tensors - a->tensors),
         (unsigned long long)(b->requests_sent - a->requests_sent),
         (unsigned long long)(b->fast_tensors - a->fast_tensors),
         (unsigned long long)(b->fast_rounds - a->fast_rounds),
         (unsigned long long)(b->fast_escalations - a->fast_escalations),
         (unsigned long long)(b->fast_ride_tensors - a->fast_ride_tensors));
}

/* ---- ride: small float32 allreduces that ride in the agreement ---------- */

/* One op of the ride mode: float32 host tensors; reduce op, pre- and
 * postscale as given; `late` is submitted by every rank but rank 0 only
 * after the rest of step K completed (rank 0 queues it first). */
typedef struct rop {
  const char *name;
  gs_dtype dt;
  gs_reduce_op red;
  double pre, post;
  size_t count;
  void *buf;
  gs_handle *h;
} rop;

#define NRIDE 7
static rop g_rops[NRIDE] = {
    {"ride/sum", GS_FLOAT32, GS_SUM, 0, 0, 3, NULL, NULL},
    {"ride/avg", GS_FLOAT32, GS_AVERAGE, 0, 0, 5, NULL, NULL},
    {"ride/prepost", GS_FLOAT32, GS_SUM, 0.5, 4.0, 4, NULL, NULL},
    {"ride/avgpost", GS_FLOAT32, GS_AVERAGE, 0, 0.25, 2, NULL, NULL},
    {"ride/big", GS_FLOAT32, GS_SUM, 0, 0, 400, NULL, NULL}, /* 1600 B: too big to ride */
    {"ride/i32", GS_INT32, GS_SUM, 0, 0, 6, NULL, NULL},     /* not a float: the plan */
    {"ride/late", GS_FLOAT32, GS_AVERAGE, 0, 2.0, 3, NULL, NULL},
};
#define RIDE_LATE (NRIDE - 1)

static int rbase(size_t i, size_t j, int s) {
  return (int)((i * 5 + j * 3 + (size_t)s * 7) % 23) - 11;
}

static void rfill(rop *o, size_t i, int s) {
  for (size_t j = 0; j < o->count; j++) {
    int v = rbase(i, j, s) * (g_rank + 1);
    if (o->dt == GS_FLOAT32)
      ((float *)o->buf)[j] = (float)v;
    else
      ((int32_t *)o->buf)[j] = v;
  }
}

/* Every expected value is exact in float32: sums of small integers; the
 * average of b * (r + 1) over the ranks is b * (size + 1) / 2 (a multiple
 * of 0.5); the scales are powers of two. */
static void rcheck(const rop *o, size_t i, int s) {
  double w = (double)g_size * (g_size + 1) / 2; /* sum over ranks of (r + 1) */
  for (size_t j = 0; j < o->count; j++) {
    double b = rbase(i, j, s), want = b * w;
    if (o->pre != 0) want *= o->pre;
    if (o->red == GS_AVERAGE) want /= g_size;
    if (o->post != 0) want *= o->post;
    double got = o->dt == GS_FLOAT32 ? ((float *)o->buf)[j] : ((int32_t *)o->buf)[j];
    if (got != want)
      wu_die("tensor '%s' (step %d): element %zu: got %.9g, expected %.9g", o->name, s, j, got,
             want);
  }
}

static void rsubmit(gs_ctx *ctx, rop *o) {
  gs_allreduce_opts opts;
  gs_allreduce_opts_init(&opts);
  opts.prescale = o->pre;
  opts.postscale = o->post;
  gs_status st =
      gs_allreduce_async(ctx, o->name, o->buf, o->buf, o->count, o->dt, o->red, &opts, &o->h);
  if (st != GS_OK)
    wu_die("tensor '%s': submitting: %s: %s", o->name, wu_status_name(st), gs_last_error(ctx));
}

static void rwait(rop *o, int s) {
  gs_status st = gs_wait(o->h, WAIT_MS);
  if (st != GS_OK)
    wu_die("tensor '%s' (step %d): %s: %s", o->name, s, wu_status_name(st), gs_handle_error(o->h));
}

/* Step s of the ride mode; in step `lag` 'ride/late' (submitted last) is
 * queued on rank 0 alone while the others run the rest of the step (it
 * stays queued there through those rounds), and they submit it 100 ms
 * after. (Submitted first on rank 0 it could make a round of its own that
 * shares nothing with the others': a reordering, which escalates.) */
static void ride_step(gs_ctx *ctx, int s, int lag) {
  gs_stats a = stats_now(ctx);
  int held = s == lag && g_rank != 0;
  for (size_t i = 0; i < NRIDE; i++) {
    if (i == RIDE_LATE && held) continue;
    rfill(&g_rops[i], i, s);
    rsubmit(ctx, &g_rops[i]);
  }
  for (size_t i = 0; i < NRIDE; i++)
    if (i != RIDE_LATE || s != lag) rwait(&g_rops[i], s);
  if (held) {
    sleep_ms(100);
    rfill(&g_rops[RIDE_LATE], RIDE_LATE, s);
    rsubmit(ctx, &g_rops[RIDE_LATE]);
  }
  if (s == lag) rwait(&g_rops[RIDE_LATE], s);
  gs_stats b = stats_now(ctx);
  for (size_t i = 0; i < NRIDE; i++) {
    rcheck(&g_rops[i], i, s);
    gs_handle_free(g_rops[i].h);
    g_rops[i].h = NULL;
  }
  print_step(s, &a, &b);
}

static op g_ops[NT + 3];
static size_t g_nops;

static void make_ops(void) {
  for (size_t i = 0; i < NT; i++) {
    op *o = &g_ops[g_nops++];
    snprintf(o->name, sizeof o->name, "fast/t%02zu", i);
    o->kind = 0;
    o->count = 1 + (i * 37) % 300;
  }
  op *o = &g_ops[g_nops++];
  snprintf(o->name, sizeof o->name, "fast/i32");
  o->kind = 1;
  o->count = 33;
  o = &g_ops[g_nops++];
  snprintf(o->name, sizeof o->name, "fast/bcast");
  o->kind = 2;
  o->count = 9;
  for (size_t i = 0; i < g_nops; i++) g_ops[i].buf = wu_xcalloc(g_ops[i].count, 8);
}

/* The end of a step over every op of g_ops: waits for each (WAIT_MS; a
 * failure names the tensor, the step and `when`), then checks, frees and
 * prints the step against the stats `a` taken before it. */
static void wait_check_free_ops(gs_ctx *ctx, int s, const char *when, const gs_stats *a) {
  for (size_t i = 0; i < g_nops; i++) {
    gs_status st = gs_wait(g_ops[i].h, WAIT_MS);
    if (st != GS_OK)
      wu_die("tensor '%s' (step %d%s): %s: %s", g_ops[i].name, s, when, wu_status_name(st),
             gs_handle_error(g_ops[i].h));
  }
  gs_stats b = stats_now(ctx);
  for (size_t i = 0; i < g_nops; i++) {
    check(&g_ops[i], i, s);
    gs_handle_free(g_ops[i].h);
    g_ops[i].h = NULL;
  }
  print_step(s, a, &b);
}

/* One step: every op (plus `extra` in the middle when not NULL) submitted
 * in order (reversed when reverse), waited on in submission order, checked. */
static void step(gs_ctx *ctx, int s, wait_style style, int reverse, op *extra) {
  op *list[NT + 4];
  size_t n = 0;
  for (size_t i = 0; i < g_nops; i++) {
    if (extra && i == g_nops / 2) list[n++] = extra;
    list[n++] = &g_ops[i];
  }
  if (reverse)
    for (size_t i = 0; i < n / 2; i++) {
      op *t = list[i];
      list[i] = list[n - 1 - i];
      list[n - 1 - i] = t;
    }
  if (style == WAIT_SHORT && g_rank == g_size - 1) sleep_ms(10); /* the others' rounds wait */
  gs_stats a = stats_now(ctx);
  for (size_t k = 0; k < n; k++) {
    size_t i = list[k] == extra ? 100 : (size_t)(list[k] - g_ops);
    fill(list[k], i, s);
    submit(ctx, list[k]);
  }
  for (size_t k = 0; k < n; k++) {
    gs_status st = wait_op(list[k], style, WAIT_MS);
    if (st != GS_OK)
      wu_die("tensor '%s' (step %d): %s: %s", list[k]->name, s, wu_status_name(st),
             gs_handle_error(list[k]->h));
  }
  gs_stats b = stats_now(ctx);
  for (size_t k = 0; k < n; k++) {
    size_t i = list[k] == extra ? 100 : (size_t)(list[k] - g_ops);
    check(list[k], i, s);
    gs_handle_free(list[k]->h);
    list[k]->h = NULL;
  }
  print_step(s, &a, &b);
}

/* group mode: fast/t00..t05 as one gs_grouped_allreduce_async (average:
 * all small enough to ride in the agreement), t06 alone, t07..t09 as a
 * second group (t09 rides, t07 and t08 do not), t10 and t11 alone, then
 * the int32 sum and the broadcast. In step `bad` rank 1 groups t00..t05 in the reverse order
 * (another group id): every rank's t00..t05 must fail, and each prints
 * "fast: rank R step S group failed: STATUS: TEXT" (t00's); the rest of
 * the step completes with the right values. */
static void group_submit(gs_ctx *ctx, op *const *m, size_t n) {
  const char *names[NT];
  const void *sends[NT];
  void *recvs[NT];
  size_t counts[NT];
  gs_handle *hs[NT];
  for (size_t i = 0; i < n; i++) {
    names[i] = m[i]->name;
    sends[i] = m[i]->buf;
    recvs[i] = m[i]->buf;
    counts[i] = m[i]->count;
  }
  gs_status st = gs_grouped_allreduce_async(ctx, n, names, sends, recvs, counts, GS_FLOAT32,
                                            GS_AVERAGE, NULL, hs);
  if (st != GS_OK)
    wu_die("group of '%s': submitting: %s: %s", names[0], wu_status_name(st), gs_last_error(ctx));
  for (size_t i = 0; i < n; i++) m[i]->h = hs[i];
}

static void group_step(gs_ctx *ctx, int s, int bad) {
  gs_stats a = stats_now(ctx);
  for (size_t i = 0; i < g_nops; i++) fill(&g_ops[i], i, s);
  op *ga[6], *gb[3];
  for (size_t i = 0; i < 6; i++) ga[i] = &g_ops[bad && g_rank == 1 ? 5 - i : i];
  for (size_t i = 0; i < 3; i++) gb[i] = &g_ops[7 + i];
  group_submit(ctx, ga, 6);
  submit(ctx, &g_ops[6]);
  group_submit(ctx, gb, 3);
  submit(ctx, &g_ops[10]);
  submit(ctx, &g_ops[11]);
  submit(ctx, &g_ops[NT]);
  submit(ctx, &g_ops[NT + 1]);
  for (size_t i = 0; i < g_nops; i++) {
    gs_status st = gs_wait(g_ops[i].h, WAIT_MS);
    if (bad && i < 6) {
      if (st == GS_OK)
        wu_die("tensor '%s' (step %d): completed, though rank 1 grouped it otherwise",
               g_ops[i].name, s);
      if (i == 0)
        printf("fast: rank %d step %d group failed: %s: %s\n", g_rank, s, wu_status_name(st),
               gs_handle_error(g_ops[i].h));
    } else if (st != GS_OK) {
      wu_die("tensor '%s' (step %d): %s: %s", g_ops[i].name, s, wu_status_name(st),
             gs_handle_error(g_ops[i].h));
    }
  }
  gs_stats b = stats_now(ctx);
  for (size_t i = 0; i < g_nops; i++) {
    if (!bad || i >= 6) check(&g_ops[i], i, s);
    gs_handle_free(g_ops[i].h);
    g_ops[i].h = NULL;
  }
  print_step(s, &a, &b);
}

/* gather mode: submits the step's allgather (before the step's ops). */
static gs_handle *gather_submit(gs_ctx *ctx, float *send) {
  for (int j = 0; j < 3; j++) send[j] = (float)(g_rank * 10 + j);
  int64_t shape[2] = {1, 3};
  gs_handle *h = NULL;
  gs_status st = gs_allgather_async(ctx, "fast/gather", send, shape, 2, GS_FLOAT32, NULL, &h);
  if (st != GS_OK)
    wu_die("gs_allgather_async 'fast/gather': %s: %s", wu_status_name(st), gs_last_error(ctx));
  return h;
}

/* Waits for the allgather and checks every rank's block. */
static void gather_check(gs_handle *h, int s) {
  gs_status st = gs_wait(h, WAIT_MS);
  if (st != GS_OK)
    wu_die("allgather 'fast/gather' (step %d): %s: %s", s, wu_status_name(st), gs_handle_error(h));
  const void *data = NULL;
  size_t bytes = 0;
  if (gs_handle_result(h, &data, &bytes) != GS_OK || bytes != (size_t)g_size * 3 * sizeof(float))
    wu_die("allgather 'fast/gather' (step %d): %zu bytes, expected %zu", s, bytes,
           (size_t)g_size * 3 * sizeof(float));
  for (int r = 0; r < g_size; r++)
    for (int j = 0; j < 3; j++)
      if (((const float *)data)[r * 3 + j] != (float)(r * 10 + j))
        wu_die("allgather 'fast/gather' (step %d): rank %d's element %d is %g, expected %d", s, r,
               j, ((const float *)data)[r * 3 + j], r * 10 + j);
  gs_handle_free(h);
}

static void mark(int s, int r, char *path, size_t cap) {
  const char *dir = getenv("GS_TEST_DIR");
  if (!dir) wu_die("GS_TEST_DIR is not set");
  snprintf(path, cap, "%s/mark.%d.%d", dir, s, r);
}

/* Waits on op o, which must fail; prints "fast: rank R: 'NAME': STATUS: TEXT". */
static int g_sliced; /* expect_failure waits in 50 ms slices (leave|hang K timed) */

static void expect_failure(op *o, gs_status want) {
  gs_status st = GS_ERR_TIMEOUT;
  if (g_sliced) /* as Python's synchronize(): bounded waits in a loop */
    for (int waited = 0; st == GS_ERR_TIMEOUT && waited < ERR_MS; waited += 50)
      st = gs_wait(o->h, 50);
  else
    st = gs_wait(o->h, ERR_MS);
  printf("fast: rank %d: '%s': %s: %s\n", g_rank, o->name, wu_status_name(st),
         gs_handle_error(o->h));
  if (st == GS_OK || st == GS_ERR_TIMEOUT || (want != GS_OK && st != want))
    wu_die("tensor '%s': expected %s, got %s", o->name,
           want != GS_OK ? wu_status_name(want) : "an error", wu_status_name(st));
  gs_handle_free(o->h);
  o->h = NULL;
}

/* ---- threads mode ---- */

#define TH 4
#define TH_OPS 6

typedef struct th_arg {
  gs_ctx *ctx;
  int t, steps;
} th_arg;

static void *th_main(void *p) {
  th_arg *a = p;
  op ops[TH_OPS];
  memset(ops, 0, sizeof ops);
  for (size_t k = 0; k < TH_OPS; k++) {
    snprintf(ops[k].name, sizeof ops[k].name, "fast/th%d.%zu", a->t, k);
    ops[k].kind = 0;
    ops[k].count = 1 + (size_t)(a->t * 5 + (int)k * 3);
    ops[k].buf = wu_xcalloc(ops[k].count, sizeof(float));
  }
  for (int s = 1; s <= a->steps; s++) {
    for (size_t k = 0; k < TH_OPS; k++) {
      fill(&ops[k], 100 + (size_t)a->t * 10 + k, s);
      submit(a->ctx, &ops[k]);
    }
    for (size_t k = 0; k < TH_OPS; k++) {
      gs_status st = gs_wait(ops[k].h, WAIT_MS);
      if (st != GS_OK)
        wu_die("tensor '%s' (thread %d, step %d): %s: %s", ops[k].name, a->t, s, wu_status_name(st),
               gs_handle_error(ops[k].h));
      check(&ops[k], 100 + (size_t)a->t * 10 + k, s);
      gs_handle_free(ops[k].h);
      ops[k].h = NULL;
    }
  }
  for (size_t k = 0; k < TH_OPS; k++) free(ops[k].buf);
  return NULL;
}

static void run_threads(gs_ctx *ctx, int steps) {
  pthread_t th[TH];
  th_arg args[TH];
  for (int t = 0; t < TH; t++) {
    args[t] = (th_arg){ctx, t, steps};
    if (pthread_create(&th[t], NULL, th_main, &args[t]) != 0)
      wu_die("pthread_create: %s", strerror(errno));
  }
  for (int t = 0; t < TH; t++) pthread_join(th[t], NULL);
  gs_stats st = stats_now(ctx);
  printf("fast: rank %d threads: tensors=%llu fast_tensors=%llu escalations=%llu\n", g_rank,
         (unsigned long long)st.tensors, (unsigned long long)st.fast_tensors,
         (unsigned long long)st.fast_escalations);
}

/* ---- timeout mode: timed waits while the round waits for other ranks ---- */

typedef struct waiter_arg {
  op *o;
  int timeout_ms;
  gs_status st;
  char err[512];
} waiter_arg;

/* Another application thread waiting on one op (a different handle from
 * the main thread's). */
static void *waiter_main(void *p) {
  waiter_arg *a = p;
  a->st = gs_wait(a->o->h, a->timeout_ms);
  snprintf(a->err, sizeof a->err, "%s", gs_handle_error(a->o->h) ? gs_handle_error(a->o->h) : "");
  return NULL;
}

/* dup mode: a call that must be refused; prints "fast: rank R dup WHAT:
 * STATUS: TEXT" (the refusal's gs_last_error). */
static void expect_refused(gs_ctx *ctx, const char *what, gs_status st, gs_status want) {
  if (st != want)
    wu_die("dup %s: got %s, expected %s", what, wu_status_name(st), wu_status_name(want));
  printf("fast: rank %d dup %s: %s: %s\n", g_rank, what, wu_status_name(st), gs_last_error(ctx));
}

/* dup mode, step s. Rank r first submits only X = fast/t0<r % 2> (cached:
 * listed in its cache entry), rank 0 also 'fast/dupnew' (never seen: in
 * the table of uncached ops); neither can complete before every rank has
 * submitted it, which the others do only after every rank made its
 * refusals (a mark file each): X again, a group naming fast/t02 twice,
 * gs_register_local of X, and on rank 0 'fast/dupnew' again. Then the
 * rest of the step, every value checked (a refused group leaves nothing
 * in flight: its members are submitted as usual). */
static void dup_step(gs_ctx *ctx, int s) {
  op extra = {.name = "fast/dupnew", .kind = 0, .count = 5};
  extra.buf = wu_xcalloc(extra.count, sizeof(float));
  for (size_t i = 0; i < g_nops; i++) fill(&g_ops[i], i, s);
  fill(&extra, 100, s);
  op *x = &g_ops[g_rank % 2], *t2 = &g_ops[2], *t3 = &g_ops[3];
  submit(ctx, x);
  gs_handle *h = NULL;
  gs_status st =
      gs_allreduce_async(ctx, x->name, x->buf, x->buf, x->count, GS_FLOAT32, GS_AVERAGE, NULL, &h);
  expect_refused(ctx, "again", st, GS_ERR_DUPLICATE_NAME);
  if (h) wu_die("dup again: a refused call set its handle");
  /* Once more: now X's entry is found by the library's prediction of the
   * next name (the call above found X after X), not by its hash table;
   * the same refusal. */
  st = gs_allreduce_async(ctx, x->name, x->buf, x->buf, x->count, GS_FLOAT32, GS_AVERAGE, NULL, &h);
  expect_refused(ctx, "again2", st, GS_ERR_DUPLICATE_NAME);
  if (h) wu_die("dup again2: a refused call set its handle");
  const char *names[3] = {t2->name, t3->name, t2->name};
  const void *sends[3] = {t2->buf, t3->buf, t2->buf};
  void *recvs[3] = {t2->buf, t3->buf, t2->buf};
  size_t counts[3] = {t2->count, t3->count, t2->count};
  gs_handle *hs[3] = {NULL, NULL, NULL};
  st = gs_grouped_allreduce_async(ctx, 3, names, sends, recvs, counts, GS_FLOAT32, GS_AVERAGE, NULL,
                                  hs);
  expect_refused(ctx, "group", st, GS_ERR_DUPLICATE_NAME);
  expect_refused(ctx, "register", gs_register_local(ctx, x->name), GS_ERR_INVALID_ARG);
  if (g_rank == 0) {
    submit(ctx, &extra);
    st = gs_allreduce_async(ctx, extra.name, extra.buf, extra.buf, extra.count, GS_FLOAT32,
                            GS_AVERAGE, NULL, &h);
    expect_refused(ctx, "new", st, GS_ERR_DUPLICATE_NAME);
  }
  char path[600];
  mark(1000 + s, g_rank, path, sizeof path);
  FILE *f = fopen(path, "w");
  if (!f) wu_die("cannot create %s: %s", path, strerror(errno));
  fclose(f);
  for (int r = 0; r < g_size; r++) {
    mark(1000 + s, r, path, sizeof path);
    for (int waited = 0; access(path, F_OK) != 0; waited++) {
      if (waited > ERR_MS) wu_die("dup: rank %d never made its refusals (%s)", r, path);
      sleep_ms(1);
    }
  }
  for (size_t i = 0; i < g_nops; i++)
    if (&g_ops[i] != x) submit(ctx, &g_ops[i]);
  if (g_rank != 0) submit(ctx, &extra);
  for (size_t i = 0; i <= g_nops; i++) {
    op *o = i < g_nops ? &g_ops[i] : &extra;
    st = gs_wait(o->h, WAIT_MS);
    if (st != GS_OK)
      wu_die("tensor '%s' (step %d): %s: %s", o->name, s, wu_status_name(st),
             gs_handle_error(o->h));
  }
  for (size_t i = 0; i < g_nops; i++) {
    check(&g_ops[i], i, s);
    gs_handle_free(g_ops[i].h);
    g_ops[i].h = NULL;
  }
  check(&extra, 100, s);
  gs_handle_free(extra.h);
  free(extra.buf);
}

/* $GS_TEST_DIR/timedout.S: rank 0's first wait of step S timed out. */
static void timedout_path(int s, char *path, size_t cap) {
  const char *dir = getenv("GS_TEST_DIR");
  if (!dir) wu_die("GS_TEST_DIR is not set");
  snprintf(path, cap, "%s/timedout.%d", dir, s);
}

/* One step in which rank 0 submits at once and the others 50 ms after its
 * gs_wait(t00, 30) timed out (its round waits for them; they see a file it
 * writes then): a later wait completes t00 with the right value;
 * meanwhile a second thread waits on t01 without a timeout. Then every op
 * completes with the right value. */
static void timeout_step(gs_ctx *ctx, int s, int *timeouts) {
  char path[600];
  timedout_path(s, path, sizeof path);
  if (g_rank != 0) {
    for (int waited = 0; access(path, F_OK) != 0; waited++) {
      if (waited > ERR_MS) wu_die("step %d: rank 0 never timed out (%s missing)", s, path);
      sleep_ms(1);
    }
    sleep_ms(50);
  }
  gs_stats a = stats_now(ctx);
  for (size_t i = 0; i < g_nops; i++) {
    fill(&g_ops[i], i, s);
    submit(ctx, &g_ops[i]);
  }
  if (g_rank == 0) {
    waiter_arg w = {&g_ops[1], WAIT_MS, GS_OK, ""};
    pthread_t th;
    if (pthread_create(&th, NULL, waiter_main, &w) != 0)
      wu_die("pthread_create: %s", strerror(errno));
    gs_status st = gs_wait(g_ops[0].h, 30);
    if (st != GS_ERR_TIMEOUT)
      wu_die("tensor 'fast/t00' (step %d): gs_wait(h, 30) before the other ranks submitted "
             "returned %s, expected GS_ERR_TIMEOUT",
             s, wu_status_name(st));
    const char *e = gs_last_error(ctx);
    if (!e || !strstr(e, "gs_wait: timed out after 30 ms; the op is still pending"))
      wu_die("tensor 'fast/t00' (step %d): timeout text: %s", s, e ? e : "(none)");
    (*timeouts)++;
    FILE *f = fopen(path, "w");
    if (!f) wu_die("cannot create %s: %s", path, strerror(errno));
    fclose(f);
    for (int waited = 0; (st = gs_wait(g_ops[0].h, 30)) == GS_ERR_TIMEOUT; waited += 30) {
      (*timeouts)++;
      if (waited > WAIT_MS) wu_die("tensor 'fast/t00' (step %d): still pending", s);
    }
    if (st != GS_OK)
      wu_die("tensor 'fast/t00' (step %d): %s: %s", s, wu_status_name(st),
             gs_handle_error(g_ops[0].h));
    check(&g_ops[0], 0, s);
    pthread_join(th, NULL);
    if (w.st != GS_OK)
      wu_die("tensor 'fast/t01' (step %d, second thread): %s: %s", s, wu_status_name(w.st), w.err);
  }
  wait_check_free_ops(ctx, s, "", &a);
}

/* ---- persist mode: persistent allreduces (gs_allreduce_init) ---------------- */

/* The ride mode's ops but 'ride/late' made once with gs_allreduce_init and
 * started every step with gs_startall: riders (sum, average, pre- and
 * postscale), 'ride/big' (1600 B) and 'ride/i32' (the plan). */
#define NPERS (NRIDE - 1)
static gs_handle *g_pers[NPERS];

static void pinit(gs_ctx *ctx, const char *name, void *buf, size_t count, gs_dtype dt,
                  gs_reduce_op red, double pre, double post, gs_handle **h) {
  gs_allreduce_opts opts;
  gs_allreduce_opts_init(&opts);
  opts.prescale = pre;
  opts.postscale = post;
  gs_status st = gs_allreduce_init(ctx, name, buf, buf, count, dt, red, &opts, h);
  if (st != GS_OK)
    wu_die("tensor '%s': gs_allreduce_init: %s: %s", name, wu_status_name(st), gs_last_error(ctx));
}

static void pstart(gs_ctx *ctx, gs_handle *const *hs, size_t n, const char *what) {
  gs_status st = gs_startall(ctx, n, hs);
  if (st != GS_OK) wu_die("%s: gs_startall: %s: %s", what, wu_status_name(st), gs_last_error(ctx));
}

static void pwait(gs_handle *h, const char *name, int s) {
  gs_status st = gs_wait(h, WAIT_MS);
  if (st != GS_OK)
    wu_die("tensor '%s' (step %d): %s: %s", name, s, wu_status_name(st), gs_handle_error(h));
}

/* A persistent op must read as done (inactive): what gs_startall's all or
 * none promises after a refusal. */
static void expect_inactive(gs_handle *h, const char *name, const char *after) {
  int done = 0;
  if (gs_test(h, &done) != GS_OK || !done)
    wu_die("tensor '%s' is active after %s: a refused gs_startall started it", name, after);
}

/* Step s: the persistent ops started in two gs_startall calls, with a
 * tensor never seen before ('persist/new.S', gs_allreduce_async) between
 * them when s == newstep; every value checked. */
static void persist_step(gs_ctx *ctx, int s, int newstep) {
  gs_stats a = stats_now(ctx);
  for (size_t i = 0; i < NPERS; i++) rfill(&g_rops[i], i, s);
  pstart(ctx, g_pers, 3, "step");
  rop extra = {"persist/new", GS_FLOAT32, GS_SUM, 0, 0, 5, NULL, NULL};
  float ebuf[5];
  if (s == newstep) {
    extra.buf = ebuf;
    rfill(&extra, 50, s);
    rsubmit(ctx, &extra);
  }
  pstart(ctx, g_pers + 3, NPERS - 3, "step");
  if (s % 2) {
    for (size_t i = 0; i < NPERS; i++) pwait(g_pers[i], g_rops[i].name, s);
  } else { /* gs_wait_any over the ops still pending */
    gs_handle *left[NPERS];
    size_t n = NPERS;
    for (size_t i = 0; i < NPERS; i++) left[i] = g_pers[i];
    while (n) {
      size_t k = n;
      gs_status st = gs_wait_any(left, n, WAIT_MS, &k);
      if (st != GS_OK || k >= n)
        wu_die("gs_wait_any (step %d, %zu ops pending): %s: %s", s, n, wu_status_name(st),
               k < n ? gs_handle_error(left[k]) : "no op completed");
      left[k] = left[--n]; /* done: an inactive op would read as done again */
    }
  }
  if (extra.h) {
    rwait(&extra, s);
    rcheck(&extra, 50, s);
    gs_handle_free(extra.h);
  }
  gs_stats b = stats_now(ctx);
  for (size_t i = 0; i < NPERS; i++) rcheck(&g_rops[i], i, s);
  print_step(s, &a, &b);
}

/* The restarting thread: its own persistent op, started again the moment
 * gs_wait returns, while the main thread's steps run rounds. */
typedef struct pth_arg {
  gs_ctx *ctx;
  int n;
} pth_arg;

static void *persist_thread(void *p) {
  pth_arg *a = p;
  float buf[3];
  rop o = {"persist/th", GS_FLOAT32, GS_SUM, 0, 0, 3, buf, NULL};
  pinit(a->ctx, o.name, buf, 3, GS_FLOAT32, GS_SUM, 0, 0, &o.h);
  for (int s = 1; s <= a->n; s++) {
    rfill(&o, 60, s);
    pstart(a->ctx, &o.h, 1, "persist/th");
    pwait(o.h, o.name, s);
    rcheck(&o, 60, s);
  }
  gs_handle_free(o.h); /* inactive */
  return NULL;
}

/* Rank 1, alone (rank 0 waits in gs_barrier): the refusals, each printed
 * "persist: rank 1 WHAT: STATUS: TEXT" for the driver. */
static void persist_refusals(gs_ctx *ctx, gs_handle *solo, gs_handle *dup, gs_handle **dup_async,
                             float *dbuf) {
  gs_status st = gs_start(solo);
  if (st != GS_OK) wu_die("persist/solo: gs_start: %s: %s", wu_status_name(st), gs_last_error(ctx));
  /* It cannot complete: rank 0 starts it after the barrier. */
  st = gs_start(solo);
  printf("persist: rank %d active: %s: %s\n", g_rank, wu_status_name(st), gs_last_error(ctx));
  if (st == GS_OK) wu_die("persist/solo: started again while active");
  gs_handle *twice[3] = {g_pers[0], g_pers[1], g_pers[0]};
  st = gs_startall(ctx, 3, twice);
  printf("persist: rank %d twice: %s: %s\n", g_rank, wu_status_name(st), gs_last_error(ctx));
  if (st == GS_OK) wu_die("gs_startall listing '%s' twice succeeded", g_rops[0].name);
  expect_inactive(g_pers[0], g_rops[0].name, "gs_startall listing it twice");
  expect_inactive(g_pers[1], g_rops[1].name, "gs_startall listing another op twice");
  gs_handle *bad[3] = {g_pers[0], g_pers[1], solo};
  st = gs_startall(ctx, 3, bad);
  printf("persist: rank %d allornone: %s: %s\n", g_rank, wu_status_name(st), gs_last_error(ctx));
  if (st == GS_OK) wu_die("gs_startall with an active op succeeded");
  expect_inactive(g_pers[0], g_rops[0].name, "gs_startall with an active op");
  expect_inactive(g_pers[1], g_rops[1].name, "gs_startall with an active op");
  dbuf[0] = dbuf[1] = (float)(g_rank + 1);
  st = gs_allreduce_async(ctx, "persist/dup", dbuf, dbuf, 2, GS_FLOAT32, GS_SUM, NULL, dup_async);
  if (st != GS_OK) wu_die("persist/dup: submitting: %s", gs_last_error(ctx));
  gs_handle *notp[2] = {g_pers[0], *dup_async};
  st = gs_startall(ctx, 2, notp);
  printf("persist: rank %d notpersistent: %s: %s\n", g_rank, wu_status_name(st),
         gs_last_error(ctx));
  if (st == GS_OK) wu_die("gs_startall started a gs_allreduce_async handle");
  expect_inactive(g_pers[0], g_rops[0].name, "gs_startall with a handle not persistent");
  st = gs_start(dup);
  printf("persist: rank %d dup: %s: %s\n", g_rank, wu_status_name(st), gs_last_error(ctx));
  if (st == GS_OK) wu_die("persist/dup: started while an op of its name was in flight");
  expect_inactive(dup, "persist/dup", "a refused gs_start");
}

/* persist N D: see the usage at the top. */
static int run_persist(gs_ctx *ctx, int n, int deadlock) {
  for (size_t i = 0; i < NPERS; i++) {
    rop *o = &g_rops[i];
    o->buf = wu_xcalloc(o->count, 4);
    pinit(ctx, o->name, o->buf, o->count, o->dt, o->red, o->pre, o->post, &g_pers[i]);
    g_rops[i].h = g_pers[i];
    expect_inactive(g_pers[i], o->name, "gs_allreduce_init");
    if (gs_wait(g_pers[i], 0) != GS_OK || gs_handle_error(g_pers[i])[0])
      wu_die("tensor '%s': an op never started does not read as done with GS_OK", o->name);
  }
  /* A local name is refused at init. */
  if (gs_register_local(ctx, "persist/local") != GS_OK)
    wu_die("gs_register_local: %s", gs_last_error(ctx));
  float lbuf[2] = {0, 0}, sbuf[4], dbuf[2], pdbuf[2];
  gs_handle *lh = NULL, *solo = NULL, *dup = NULL, *dup_async = NULL;
  gs_status st =
      gs_allreduce_init(ctx, "persist/local", lbuf, lbuf, 2, GS_FLOAT32, GS_SUM, NULL, &lh);
  printf("persist: rank %d local: %s: %s\n", g_rank, wu_status_name(st), gs_last_error(ctx));
  if (st == GS_OK || lh) wu_die("persist/local: a local name made a persistent op");
  pinit(ctx, "persist/solo", sbuf, 4, GS_FLOAT32, GS_SUM, 0, 0, &solo);
  pinit(ctx, "persist/dup", pdbuf, 2, GS_FLOAT32, GS_SUM, 0, 0, &dup);

  int s = 1;
  for (; s <= n; s++) persist_step(ctx, s, n / 2 + 1);

  for (int j = 0; j < 4; j++) sbuf[j] = (float)((j + 1) * (g_rank + 1));
  if (g_rank == 1) persist_refusals(ctx, solo, dup, &dup_async, dbuf);
  st = gs_barrier(ctx);
  if (st != GS_OK) wu_die("gs_barrier: %s: %s", wu_status_name(st), gs_last_error(ctx));
  if (g_rank != 1) {
    pstart(ctx, &solo, 1, "persist/solo");
    dbuf[0] = dbuf[1] = (float)(g_rank + 1);
    st =
        gs_allreduce_async(ctx, "persist/dup", dbuf, dbuf, 2, GS_FLOAT32, GS_SUM, NULL, &dup_async);
    if (st != GS_OK) wu_die("persist/dup: submitting: %s", gs_last_error(ctx));
  }
  float w = (float)(g_size * (g_size + 1) / 2);
  pwait(solo, "persist/solo", s);
  pwait(dup_async, "persist/dup", s);
  for (int j = 0; j < 4; j++)
    if (sbuf[j] != (float)(j + 1) * w)
      wu_die("persist/solo: element %d: got %g, expected %g", j, (double)sbuf[j],
             (double)((float)(j + 1) * w));
  if (dbuf[0] != w || dbuf[1] != w)
    wu_die("persist/dup (gs_allreduce_async): got %g, expected %g", (double)dbuf[0], (double)w);
  gs_handle_free(dup_async);
  printf("persist: rank %d refusals done\n", g_rank);

  /* Restarts on a second thread while this one runs steps. */
  pthread_t th;
  pth_arg pa = {ctx, 200};
  if (pthread_create(&th, NULL, persist_thread, &pa) != 0)
    wu_die("pthread_create: %s", strerror(errno));
  for (int e = s + 20; s < e; s++) persist_step(ctx, s, 0);
  pthread_join(th, NULL);
  printf("persist: rank %d restart thread done\n", g_rank);

  /* gs_handle_free of an active persistent op: it completes detached. */
  float fbuf[3] = {1, 2, 3};
  gs_handle *fh = NULL;
  pinit(ctx, "persist/free", fbuf, 3, GS_FLOAT32, GS_SUM, 0, 0, &fh);
  pstart(ctx, &fh, 1, "persist/free");
  gs_handle_free(fh);
  persist_step(ctx, s++, 0);

  if (deadlock) {
    /* Rank 0 starts only 'persist/solo', rank 1 only 'persist/dup': the
     * job fails with GS_ERR_DEADLOCK; a start then gets the job's error,
     * as gs_allreduce_async does. */
    gs_handle *mine = g_rank == 0 ? solo : dup;
    pstart(ctx, &mine, 1, "deadlock");
    st = gs_wait(mine, ERR_MS);
    if (st != GS_ERR_DEADLOCK)
      wu_die("deadlock: expected GS_ERR_DEADLOCK, got %s: %s", wu_status_name(st),
             gs_handle_error(mine));
    st = gs_startall(ctx, NPERS, g_pers);
    printf("persist: rank %d failed job start: %s: %s\n", g_rank, wu_status_name(st),
           gs_last_error(ctx));
    if (st == GS_OK) wu_die("gs_startall succeeded on a failed job");
    for (size_t i = 0; i < NPERS; i++) expect_inactive(g_pers[i], g_rops[i].name, "a failed job");
    gs_handle *ah = NULL;
    st = gs_allreduce_async(ctx, "persist/after", dbuf, dbuf, 2, GS_FLOAT32, GS_SUM, NULL, &ah);
    printf("persist: rank %d failed job async: %s: %s\n", g_rank, wu_status_name(st),
           gs_last_error(ctx));
    if (st == GS_OK) wu_die("gs_allreduce_async succeeded on a failed job");
  }
  printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, s - 1);
  st = gs_shutdown(ctx);
  if (st != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(st), gs_last_error(NULL));
  /* Inactive: freed at once (after gs_shutdown too). */
  for (size_t i = 0; i < NPERS; i++) {
    gs_handle_free(g_pers[i]);
    free(g_rops[i].buf);
  }
  gs_handle_free(solo);
  gs_handle_free(dup);
  for (size_t i = 0; i < g_nops; i++) free(g_ops[i].buf);
  return 0;
}

/* vary mode: 'fast/vary' in its variant for step s (s % 3), submitted
 * before the step's ops, waited on and checked after them. */
static void vary_step(gs_ctx *ctx, int s) {
  static union {
    float f[5];
    int32_t i[9];
    double d[6];
  } buf;
  int v = s % 3, w = g_size * (g_size + 1) / 2;
  gs_handle *h = NULL;
  gs_status st;
  if (v == 0) {
    for (int j = 0; j < 5; j++) buf.f[j] = (float)((j + 1) * (g_rank + 1));
    st = gs_allreduce_async(ctx, "fast/vary", buf.f, buf.f, 5, GS_FLOAT32, GS_AVERAGE, NULL, &h);
  } else if (v == 1) {
    for (int j = 0; j < 9; j++) buf.i[j] = (j + s) * (g_rank + 1);
    st = gs_allreduce_async(ctx, "fast/vary", buf.i, buf.i, 9, GS_INT32, GS_SUM, NULL, &h);
  } else {
    for (int j = 0; j < 6; j++) buf.d[j] = (g_rank + 1) * 10.0 + j;
    gs_allreduce_opts o;
    gs_allreduce_opts_init(&o);
    int64_t shape[2] = {3, 2};
    o.shape = shape;
    o.ndim = 2;
    o.postscale = 2.0;
    st = gs_allreduce_async(ctx, "fast/vary", buf.d, buf.d, 6, GS_FLOAT64, GS_MAX, &o, &h);
  }
  if (st != GS_OK)
    wu_die("tensor 'fast/vary' (step %d): submitting: %s: %s", s, wu_status_name(st),
           gs_last_error(ctx));
  step(ctx, s, WAIT_BLOCK, 0, NULL);
  st = gs_wait(h, WAIT_MS);
  if (st != GS_OK)
    wu_die("tensor 'fast/vary' (step %d): %s: %s", s, wu_status_name(st), gs_handle_error(h));
  gs_handle_free(h);
  for (int j = 0; j < (v == 0 ? 5 : v == 1 ? 9 : 6); j++) {
    double got = v == 0 ? buf.f[j] : v == 1 ? buf.i[j] : buf.d[j];
    double want = v == 0   ? (double)((float)((j + 1) * w) / (float)g_size)
                  : v == 1 ? (double)((j + s) * w)
                           : (g_size * 10.0 + j) * 2.0;
    if (got != want)
      wu_die("tensor 'fast/vary' (step %d, variant %d): element %d: got %.9g, expected %.9g", s, v,
             j, got, want);
  }
}

/* ---- bigwait mode: a timed wait on an op whose round runs a long collective ---- */

#define BIG_COUNT (32u << 20) /* float32: 128 MiB */

static void bigwait_step(gs_ctx *ctx, int s, float *buf) {
  for (size_t j = 0; j < BIG_COUNT; j += 4096) buf[j] = (float)((g_rank + 1) * (s + (int)(j % 7)));
  char path[600];
  mark(s, 1, path, sizeof path);
  int timed = s >= 3 && g_size == 2;
  if (timed && g_rank == 0) {
    for (int waited = 0; access(path, F_OK) != 0; waited++) {
      if (waited > ERR_MS) wu_die("bigwait step %d: rank 1 never submitted (%s missing)", s, path);
      sleep_ms(1);
    }
    sleep_ms(100); /* rank 1's round waits for this rank in the agreement */
  }
  gs_handle *h = NULL;
  if (gs_allreduce_async(ctx, "fast/big", buf, buf, BIG_COUNT, GS_FLOAT32, GS_SUM, NULL, &h) !=
      GS_OK)
    wu_die("tensor 'fast/big' (step %d): submitting: %s", s, gs_last_error(ctx));
  if (timed && g_rank == 1) {
    FILE *f = fopen(path, "w");
    if (!f) wu_die("cannot create %s: %s", path, strerror(errno));
    fclose(f);
  }
  if (timed && g_rank == 0) {
    double t0 = mono_ms();
    gs_status st = gs_wait(h, 1);
    double took = mono_ms() - t0;
    printf("fast: rank 0 bigwait step %d: gs_wait(h, 1): %s after %.1f ms\n", s, wu_status_name(st),
           took);
    if (st != GS_ERR_TIMEOUT)
      wu_die("tensor 'fast/big' (step %d): gs_wait(h, 1) on a 128 MiB allreduce returned %s "
             "after %.1f ms; expected GS_ERR_TIMEOUT once its 1 ms passed (the wait ran the "
             "round's collective on the calling thread past its timeout?)",
             s, wu_status_name(st), took);
    const char *e = gs_last_error(ctx);
    if (!e || !strstr(e, "gs_wait: timed out after 1 ms; the op is still pending"))
      wu_die("tensor 'fast/big' (step %d): timeout text: %s", s, e ? e : "(none)");
  }
  gs_status st = gs_wait(h, WAIT_MS);
  if (st != GS_OK)
    wu_die("tensor 'fast/big' (step %d): %s: %s", s, wu_status_name(st), gs_handle_error(h));
  int w = g_size * (g_size + 1) / 2;
  for (size_t j = 0; j < BIG_COUNT; j += 4096) {
    float want = (float)(w * (s + (int)(j % 7)));
    if (buf[j] != want)
      wu_die("tensor 'fast/big' (step %d): element %zu: got %g, expected %g", s, j, (double)buf[j],
             (double)want);
  }
  gs_handle_free(h);
}

/* ---- twowait mode: a waiter whose op missed another waiter's round ---- */

static gs_ctx *g_twowait_ctx;

static void *twowait_thread(void *p) {
  waiter_arg *a = p;
  submit(g_twowait_ctx, a->o);
  a->st = gs_wait(a->o->h, a->timeout_ms);
  snprintf(a->err, sizeof a->err, "%s", gs_handle_error(a->o->h) ? gs_handle_error(a->o->h) : "");
  return NULL;
}

static void twowait_step(gs_ctx *ctx, int s) {
  op *t0 = &g_ops[0], *t1 = &g_ops[1];
  fill(t0, 0, s);
  fill(t1, 1, s);
  char path[600];
  mark(s, 0, path, sizeof path);
  gs_stats a = stats_now(ctx);
  if (g_rank == 0) {
    waiter_arg w = {t0, ERR_MS, GS_OK, ""};
    g_twowait_ctx = ctx;
    pthread_t th;
    if (pthread_create(&th, NULL, twowait_thread, &w) != 0)
      wu_die("pthread_create: %s", strerror(errno));
    sleep_ms(50); /* the thread's round waits for rank 1 in the agreement */
    submit(ctx, t1);
    FILE *f = fopen(path, "w");
    if (!f) wu_die("cannot create %s: %s", path, strerror(errno));
    fclose(f);
    gs_status st = gs_wait(t1->h, ERR_MS);
    if (st != GS_OK)
      wu_die("tensor 'fast/t01' (step %d): submitted while another thread's round waited for "
             "rank 1: %s: %s",
             s, wu_status_name(st), gs_handle_error(t1->h));
    pthread_join(th, NULL);
    if (w.st != GS_OK)
      wu_die("tensor 'fast/t00' (step %d, second thread): %s: %s", s, wu_status_name(w.st), w.err);
  } else {
    for (int waited = 0; access(path, F_OK) != 0; waited++) {
      if (waited > ERR_MS) wu_die("twowait step %d: rank 0 never submitted (%s missing)", s, path);
      sleep_ms(1);
    }
    sleep_ms(50);
    submit(ctx, t0);
    submit(ctx, t1);
    for (int i = 0; i < 2; i++) {
      op *o = i ? t1 : t0;
      gs_status st = gs_wait(o->h, ERR_MS);
      if (st != GS_OK)
        wu_die("tensor '%s' (step %d): %s: %s", o->name, s, wu_status_name(st),
               gs_handle_error(o->h));
    }
  }
  gs_stats b = stats_now(ctx);
  check(t0, 0, s);
  check(t1, 1, s);
  gs_handle_free(t0->h);
  gs_handle_free(t1->h);
  t0->h = t1->h = NULL;
  print_step(s, &a, &b);
}

/* ---- fork mode: a child forked while the parent's ops wait for a round ---- */

static void fork_child(gs_ctx *ctx) {
  gs_status st = gs_wait(g_ops[0].h, 100);
  const char *e = gs_last_error(NULL);
  printf("fast: rank 0 fork child: %s: %s\n", wu_status_name(st), e ? e : "");
  int ok = st == GS_ERR_FORKED && e && strstr(e, "(a forked child) cannot use it");
  st = gs_shutdown(ctx);
  ok = ok && st == GS_ERR_FORKED;
  fflush(stdout);
  _exit(ok ? 0 : 1);
}

static void fork_step(gs_ctx *ctx, int s) {
  if (g_rank != 0) {
    sleep_ms(200); /* rank 0's child tries its wait meanwhile */
    step(ctx, s, WAIT_BLOCK, 0, NULL);
    return;
  }
  gs_stats a = stats_now(ctx);
  for (size_t i = 0; i < g_nops; i++) {
    fill(&g_ops[i], i, s);
    submit(ctx, &g_ops[i]);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) wu_die("fork: %s", strerror(errno));
  if (pid == 0) fork_child(ctx);
  int status = 0;
  for (int waited = 0; waitpid(pid, &status, WNOHANG) == 0; waited++) {
    if (waited > ERR_MS) {
      kill(pid, SIGKILL);
      wu_die("step %d: the forked child (pid %d) did not exit within %d ms", s, (int)pid, ERR_MS);
    }
    sleep_ms(1);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    wu_die("step %d: the forked child (pid %d) failed (status 0x%x): see its line above", s,
           (int)pid, status);
  wait_check_free_ops(ctx, s, ", after the fork", &a);
}

/* GS_TEST_BIND_ONE_CPU (see the top), or force (steps N busy): before
 * gs_init, from the launcher's GRADSYNC_RANK. */
static void bind_one_cpu(int force) {
  const char *on = getenv("GS_TEST_BIND_ONE_CPU");
  if (!force && (!on || strcmp(on, "1"))) return;
  const char *r = getenv("GRADSYNC_RANK");
  int rank = r ? atoi(r) : 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) wu_die("sched_getaffinity: %s", strerror(errno));
  int n = CPU_COUNT(&set), want = rank % n, cpu = -1;
  for (int c = 0, i = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) && i++ == want) {
      cpu = c;
      break;
    }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (cpu < 0 || sched_setaffinity(0, sizeof one, &one) != 0)
    wu_die("binding rank %d to cpu %d: %s", rank, cpu, strerror(errno));
  printf("fast: rank %d bound to cpu %d\n", rank, cpu);
}

static void usage(void) {
  fprintf(stderr,
          "usage: gs-fast-worker steps N block|timed|poll|paced|short|busy | vary N | dup N |\n"
          "                      newtensor N K |\n"
          "                      reorder N K | group N K | gather N K | ride N K | join N |\n"
          "                      barrier N | deadlock K | leave K [timed] |\n"
          "                      shutdown K [timed] | hang K [timed] |\n"
          "                      threads N | timeout N K | persist N D | bigwait N |\n"
          "                      twowait N | fork N\n");
  exit(2);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) usage();
  const char *mode = argv[1];
  g_mode = mode;
  int n = atoi(argv[2]), k = argc > 3 ? atoi(argv[3]) : 0;
  if (n < 1) usage();
  /* Before gs_init: the library's threads share this one cpu. */
  bind_one_cpu(!strcmp(mode, "steps") && argc == 4 && !strcmp(argv[3], "busy"));
  gs_ctx *ctx = wu_join_or_die();
  make_ops();
  int steps = n;
  if (!strcmp(mode, "steps")) {
    if (argc != 4) usage();
    wait_style style = !strcmp(argv[3], "timed")   ? WAIT_TIMED
                       : !strcmp(argv[3], "poll")  ? WAIT_POLL
                       : !strcmp(argv[3], "paced") ? WAIT_PACED
                       : !strcmp(argv[3], "short") ? WAIT_SHORT
                       : !strcmp(argv[3], "busy")  ? WAIT_BUSY
                                                   : WAIT_BLOCK;
    for (int s = 1; s <= n; s++) {
      step(ctx, s, style, 0, NULL);
      if (style == WAIT_PACED) sleep_ms(40);
    }
    if (style == WAIT_SHORT) printf("fast: rank %d short timeouts=%d\n", g_rank, g_short_timeouts);
  } else if (!strcmp(mode, "ride")) {
    if (argc != 4 || k < 1 || k > n) usage();
    for (size_t i = 0; i < NRIDE; i++) g_rops[i].buf = wu_xcalloc(g_rops[i].count, 4);
    for (int s = 1; s <= n; s++) ride_step(ctx, s, k);
    for (size_t i = 0; i < NRIDE; i++) free(g_rops[i].buf);
  } else if (!strcmp(mode, "join")) {
    /* Rank 1 is in gs_join while the others negotiate 'ride/j' (it
     * contributes zeros): its cache copy never holds that entry, though
     * the id is live on every rank. Then the ride steps: every rank must
     * lay out the same riding vector all the same. */
    if (argc != 3) usage();
    for (size_t i = 0; i < NRIDE; i++) g_rops[i].buf = wu_xcalloc(g_rops[i].count, 4);
    int last = -1;
    if (g_rank != 1) {
      rop j = {"ride/j", GS_FLOAT32, GS_SUM, 0, 0, 3, wu_xcalloc(3, 4), NULL};
      for (int s = 1; s <= 3; s++) {
        for (size_t e = 0; e < j.count; e++) ((float *)j.buf)[e] = (float)((e + 1) * (g_rank + 1));
        rsubmit(ctx, &j);
        rwait(&j, s);
        for (size_t e = 0; e < j.count; e++) {
          float want = (float)((e + 1) * (size_t)(g_size * (g_size + 1) / 2 - 2));
          if (((float *)j.buf)[e] != want)
            wu_die("tensor 'ride/j' (step %d, rank 1 in gs_join): element %zu: got %g, expected "
                   "%g",
                   s, e, (double)((float *)j.buf)[e], (double)want);
        }
        gs_handle_free(j.h);
      }
      free(j.buf);
    }
    gs_status st = gs_join(ctx, &last);
    if (st != GS_OK) wu_die("gs_join: %s: %s", wu_status_name(st), gs_last_error(ctx));
    printf("fast: rank %d joined (last %d)\n", g_rank, last);
    for (int s = 1; s <= n; s++) ride_step(ctx, s, 0);
    for (size_t i = 0; i < NRIDE; i++) free(g_rops[i].buf);
  } else if (!strcmp(mode, "dup")) {
    if (argc != 3) usage();
    steps = n + 3;
    for (int s = 1; s <= n; s++) step(ctx, s, WAIT_BLOCK, 0, NULL);
    dup_step(ctx, n + 1);
    step(ctx, n + 2, WAIT_BLOCK, 0, NULL);
    step(ctx, n + 3, WAIT_BLOCK, 0, NULL);
  } else if (!strcmp(mode, "vary")) {
    if (argc != 3) usage();
    for (int s = 1; s <= n; s++) vary_step(ctx, s);
  } else if (!strcmp(mode, "newtensor") || !strcmp(mode, "reorder")) {
    if (argc != 4 || k < 1 || k > n) usage();
    op extra = {.kind = 0, .count = 5};
    snprintf(extra.name, sizeof extra.name, "fast/new.%d", k);
    extra.buf = wu_xcalloc(extra.count, sizeof(float));
    int reorder = !strcmp(mode, "reorder");
    for (int s = 1; s <= n; s++)
      step(ctx, s, WAIT_BLOCK, reorder && s == k && g_rank == 1,
           !reorder && s == k ? &extra : NULL);
    free(extra.buf);
  } else if (!strcmp(mode, "group")) {
    if (argc != 4 || k < 0 || k > n) usage();
    for (int s = 1; s <= n; s++) group_step(ctx, s, s == k);
  } else if (!strcmp(mode, "gather")) {
    if (argc != 4 || k < 1 || k > n) usage();
    for (int s = 1; s <= n; s++) {
      float send[3];
      gs_handle *h = s <= k ? gather_submit(ctx, send) : NULL;
      step(ctx, s, WAIT_BLOCK, 0, NULL);
      if (h) gather_check(h, s);
      if (s > k) sleep_ms(20); /* time for the driver's gradsyncctl */
    }
  } else if (!strcmp(mode, "barrier")) {
    for (int s = 1; s <= n; s++) {
      step(ctx, s, WAIT_BLOCK, 0, NULL);
      char path[600];
      mark(s, g_rank, path, sizeof path);
      FILE *f = fopen(path, "w");
      if (!f) wu_die("cannot create %s: %s", path, strerror(errno));
      fclose(f);
      sleep_ms(30L * g_rank);
      gs_stats a = stats_now(ctx);
      gs_status st = gs_barrier(ctx);
      if (st != GS_OK)
        wu_die("gs_barrier (step %d): %s: %s", s, wu_status_name(st), gs_last_error(ctx));
      gs_stats b = stats_now(ctx);
      for (int r = 0; r < g_size; r++) {
        mark(s, r, path, sizeof path);
        if (access(path, F_OK) != 0)
          wu_die("step %d: gs_barrier returned before rank %d arrived (%s missing)", s, r, path);
      }
      printf("fast: rank %d barrier %d: requests=%llu\n", g_rank, s,
             (unsigned long long)(b.requests_sent - a.requests_sent));
    }
  } else if (!strcmp(mode, "unregister")) {
    /* What users rely on: (un)register, barrier, then submit. The barrier
     * is through only once every rank's (un)registration reached the
     * coordinator, in fast mode too: it decides local or global when the
     * requests come. */
    if (argc != 3) usage();
    steps = n + 1;
    const char *tower = "fast/tower";
    int32_t tv[6];
    if (gs_register_local(ctx, tower) != GS_OK) wu_die("gs_register_local: %s", gs_last_error(ctx));
    for (int j = 0; j < 6; j++) tv[j] = j + 10 * g_rank;
    gs_handle *h = NULL;
    if (gs_allreduce_async(ctx, tower, tv, tv, 6, GS_INT32, GS_SUM, NULL, &h) != GS_OK)
      wu_die("tensor '%s': submitting: %s", tower, gs_last_error(ctx));
    int done = 0;
    if (gs_test(h, &done) != GS_OK || !done)
      wu_die("tensor '%s' is registered local but its op was not complete on return", tower);
    if (gs_wait(h, 0) != GS_OK || tv[5] != 5 + 10 * g_rank)
      wu_die("tensor '%s' (local): got %d, expected %d", tower, tv[5], 5 + 10 * g_rank);
    gs_handle_free(h);
    for (int s = 1; s <= n; s++) step(ctx, s, WAIT_BLOCK, 0, NULL);
    sleep_ms(100L * g_rank);
    if (gs_unregister_local(ctx, tower) != GS_OK)
      wu_die("gs_unregister_local: %s", gs_last_error(ctx));
    gs_stats a = stats_now(ctx);
    gs_status st = gs_barrier(ctx);
    if (st != GS_OK) wu_die("gs_barrier: %s: %s", wu_status_name(st), gs_last_error(ctx));
    gs_stats b = stats_now(ctx);
    printf("fast: rank %d unregister barrier: requests=%llu escalations=%llu\n", g_rank,
           (unsigned long long)(b.requests_sent - a.requests_sent),
           (unsigned long long)(b.fast_escalations - a.fast_escalations));
    for (int j = 0; j < 6; j++) tv[j] = j + 10 * g_rank;
    if (gs_allreduce_async(ctx, tower, tv, tv, 6, GS_INT32, GS_SUM, NULL, &h) != GS_OK)
      wu_die("tensor '%s': submitting: %s", tower, gs_last_error(ctx));
    st = gs_wait(h, WAIT_MS);
    if (st != GS_OK)
      wu_die("tensor '%s' after gs_unregister_local: %s: %s", tower, wu_status_name(st),
             gs_handle_error(h));
    for (int j = 0; j < 6; j++) {
      int32_t want = j * g_size + 10 * (g_size * (g_size - 1) / 2);
      if (tv[j] != want)
        wu_die("tensor '%s' after gs_unregister_local: element %d: got %d, expected %d (the sum "
               "over ranks)",
               tower, j, tv[j], want);
    }
    gs_handle_free(h);
    step(ctx, n + 1, WAIT_BLOCK, 0, NULL);
  } else if (!strcmp(mode, "persist")) {
    if (argc != 4 || n < 4) usage();
    return run_persist(ctx, n, k);
  } else if (!strcmp(mode, "threads")) {
    if (argc != 3) usage();
    run_threads(ctx, n);
  } else if (!strcmp(mode, "timeout")) {
    if (argc != 4 || k < 1 || k > n) usage();
    int timeouts = 0;
    for (int s = 1; s <= n; s++) {
      if (s < k)
        step(ctx, s, WAIT_BLOCK, 0, NULL);
      else
        timeout_step(ctx, s, &timeouts);
    }
    printf("fast: rank %d timeouts=%d\n", g_rank, timeouts);
  } else if (!strcmp(mode, "fork")) {
    if (argc != 3 || n < 3) usage();
    for (int s = 1; s <= n; s++) {
      if (s == 3)
        fork_step(ctx, s);
      else
        step(ctx, s, WAIT_BLOCK, 0, NULL);
    }
  } else if (!strcmp(mode, "twowait")) {
    if (argc != 3 || n < 3) usage();
    for (int s = 1; s <= n; s++) {
      if (s < 3)
        step(ctx, s, WAIT_BLOCK, 0, NULL);
      else
        twowait_step(ctx, s);
    }
  } else if (!strcmp(mode, "bigwait")) {
    if (argc != 3) usage();
    float *big = wu_xcalloc(BIG_COUNT, sizeof(float));
    for (int s = 1; s <= n; s++) bigwait_step(ctx, s, big);
    free(big);
  } else if (!strcmp(mode, "shutdown")) {
    int timed = argc == 4 && !strcmp(argv[3], "timed");
    if (argc != 3 && !timed) usage();
    steps = n - 1;
    for (int s = 1; s < n; s++) step(ctx, s, WAIT_BLOCK, 0, NULL);
    op *t0 = &g_ops[0];
    fill(t0, 0, n);
    if (g_rank == 0) {
      submit(ctx, t0);
      if (timed) {
        /* The round waits for the others: the wait times out (a round this
         * thread ran is parked for the exec thread), then gs_shutdown. */
        gs_status st = gs_wait(t0->h, 100);
        if (st != GS_ERR_TIMEOUT)
          wu_die("tensor 'fast/t00': gs_wait(h, 100) before the others submitted returned %s, "
                 "expected GS_ERR_TIMEOUT",
                 wu_status_name(st));
      } else {
        sleep_ms(100); /* its exec thread is inside the round, waiting for the others */
      }
      gs_status st = gs_shutdown(ctx);
      if (st != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(st), gs_last_error(NULL));
      expect_failure(t0, GS_ERR_SHUTDOWN);
      printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, steps);
      return 0;
    }
    sleep_ms(300);
    submit(ctx, t0);
    expect_failure(t0, GS_OK);
    printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, steps);
    gs_status st = gs_shutdown(ctx);
    if (st != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(st), gs_last_error(NULL));
    return 0;
  } else if (!strcmp(mode, "deadlock") || !strcmp(mode, "leave") || !strcmp(mode, "hang")) {
    g_sliced = argc == 4 && !strcmp(argv[3], "timed");
    if (argc != 3 && !g_sliced) usage();
    int last = g_size - 1;
    steps = n - 1;
    for (int s = 1; s < n; s++) step(ctx, s, WAIT_BLOCK, 0, NULL);
    op *t0 = &g_ops[0], *t1 = &g_ops[1];
    fill(t0, 0, n);
    fill(t1, 1, n);
    if (!strcmp(mode, "deadlock")) {
      if (g_rank != 1) submit(ctx, t0);
      if (g_rank != 0) submit(ctx, t1);
      expect_failure(g_rank == 1 ? t1 : t0, GS_ERR_DEADLOCK);
    } else if (g_rank == last) {
      printf("fast: rank %d %s\n", g_rank, !strcmp(mode, "leave") ? "leaving" : "hanging");
      /* The others are inside their round, waiting for this rank, by the
       * time it leaves (either order must pass). */
      sleep_ms(!strcmp(mode, "hang") ? 120000 : 500);
      printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, steps);
      gs_shutdown(ctx);
      return 0;
    } else {
      submit(ctx, t0);
      expect_failure(t0, GS_OK);
    }
    printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, steps);
    /* A rank that left fails only the ops that needed it: shut down
     * cleanly. A deadlock or a lost rank failed the job: leave at once. */
    if (!strcmp(mode, "leave")) {
      gs_status st = gs_shutdown(ctx);
      if (st != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(st), gs_last_error(NULL));
    }
    _exit(0);
  } else {
    usage();
  }
  printf("fast: passed (rank %d of %d, %d steps)\n", g_rank, g_size, steps);
  gs_status s = gs_shutdown(ctx);
  if (s != GS_OK) wu_die("gs_shutdown: %s: %s", wu_status_name(s), gs_last_error(NULL));
  for (size_t i = 0; i < g_nops; i++) free(g_ops[i].buf);
  return 0;
}
