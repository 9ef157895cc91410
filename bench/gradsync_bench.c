/* gradsync-bench: step-time benchmark of a real gradient set, run as the
 * ranks of a gradsync job.
 *
 *   gradsync-run -np 2 [--coord-arg ...] gradsync-bench --workload FILE
 *       [--steps N] [--warmup W] [--scale F] [--gap-us G] [--jitter-us J] [--tag TEXT]
 *       [--allgather first|last] [--barrier on|off] [--grouped on|off|persistent]
 *       [--call-times on|off]
 *   gradsync-run -np 2 gradsync-bench --raw-allreduce BYTES [...]
 *   gradsync-run -np 2 gradsync-bench --uniform COUNTxBYTES [...]
 *
 * A workload is a tensor list (`name dtype shape` lines, `#` comments, as in
 * bench/workloads/). Every step all ranks meet in a barrier (not timed;
 * --barrier off: none, steps back to back), then submit every gradient in
 * reverse list order (after one allgather with --allgather first, before
 * it with --allgather last: an op the fast path cannot run), as backward produces
 * them, with gs_allreduce_async (GS_AVERAGE, in place), optionally sleeping
 * --gap-us between submissions to stand in for backward compute, and wait
 * for all; --grouped on submits them as one gs_grouped_allreduce_async
 * instead (same order, one call: Horovod's grouped_allreduce; every
 * tensor must have the same dtype, and --gap-us must be 0); --grouped
 * persistent makes them persistent ops once (gs_allreduce_init, in the
 * first step, not timed) and starts them with one gs_startall per step (MPI-4's
 * MPI_Startall; same conditions). --call-times on
 * also reads the clock after the first submission and around the frees
 * (three more clock reads per step, one inside the timed submissions) and
 * reports what one submission and one gs_handle_free cost. --raw-allreduce
 * runs one allreduce of BYTES instead (the "one raw allreduce of the same
 * bytes" baseline); --uniform COUNTxBYTES submits COUNT
 * float32 tensors of BYTES each.
 *
 * Per step and rank it records: step time (first submission to last
 * completion), critical path (from the LAST submission to the completion of
 * that last-submitted op, a proxy for "last gradient -> planned and reduced
 * at every rank"), tail (last submission to last completion), and the
 * gs_get_stats deltas (collectives, tensors, fused collectives, requests,
 * cache hits, plans the coordinator sent as a replay of a plan template it
 * defined before (plans_replayed; replay_rate: replayed / plans over all
 * measured steps, the plans of the steps' barriers included: those are
 * never replays), bytes and messages to the coordinator, and the fast path's
 * rounds, tensors and escalations, issue 14) and the time of the
 * step's barrier (one control-plane round trip). After the run one
 * allreduce (max) gathers the worst rank of every step; rank 0 prints the
 * medians as one line starting with "RESULT ", key=value pairs, for
 * bench/run.sh. Finally every rank checks the averaged values.
 *
 * Each rank's critical path (crit_ms) starts at its OWN last submission, so
 * the worst rank's includes how far the ranks' last submissions drifted
 * apart: a rank that submitted early waits for the late one. Two more
 * figures split it, from absolute CLOCK_MONOTONIC times gathered by the
 * same allreduce: crit_last_ms, from the latest rank's last submission (the
 * job's last gradient) to the latest completion of the last-submitted op,
 * and skew_ms, the latest minus the earliest last submission. Both need one
 * clock for all ranks, so they are printed only when every rank runs on
 * the same host (CLOCK_MONOTONIC is per machine); otherwise "n/a".
 *
 * Single-threaded; any gradsync error ends the process with status 1 after
 * gs_shutdown, with the library's message. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradsync.h"

#define WAIT_MS 300000 /* a hang guard, not a performance bound */
#define NAME_MAX_LEN 256

typedef struct tensor {
  char *name;
  size_t count; /* elements after --scale */
  gs_dtype dtype;
  void *buf;
} tensor;

typedef struct options {
  const char *workload;
  uint64_t raw_bytes;    /* --raw-allreduce, 0 = unset */
  long uniform_count;    /* --uniform, 0 = unset */
  uint64_t uniform_size; /* bytes per tensor of --uniform */
  long steps;
  long warmup;
  double scale;
  long gap_us;
  long jitter_us;
  const char *tag;
  int allgather;  /* --allgather: 0 none, 1 first, 2 last in each step */
  int no_barrier; /* --barrier off: steps back to back */
  int grouped;    /* --grouped on: one gs_grouped_allreduce_async per step */
  int call_times; /* --call-times on: the per-call costs below */
} options;

/* Per-step metrics, one row per measured step. */
enum {
  M_STEP,
  M_SUBMIT,
  M_CRIT,
  M_TAIL,
  M_PLANS,
  M_COLL,
  M_TENSORS,
  M_FUSED,
  M_REQS,
  M_HITS,
  M_REPLAYED,
  M_UPBYTES,
  M_MSGS,
  M_BARRIER,
  M_FAST_ROUNDS, /* issue 14: fast rounds, tensors they completed, escalations */
  M_FAST_TENSORS,
  M_FAST_ESC,
  M_CALL_FIRST, /* --call-times: the first submission (us, the exec thread's wake-up included) */
  M_CALL_NS,    /* each later one (ns: the rest of the submissions / their number) */
  M_FREE_NS,    /* one gs_handle_free (ns) */
  M_T_LAST,     /* absolute CLOCK_MONOTONIC ms of the last submission; MAX: the latest */
  M_T_LAST_NEG, /* -(the same); MAX: -(the earliest) */
  M_T_CRIT,     /* absolute ms of the last-submitted op's completion; MAX: the latest */
  M_HOST,       /* host_id(); MAX == -MAX of M_HOST_NEG iff every rank has the same */
  M_HOST_NEG,
  M_CRIT_LAST, /* after the MAX: latest completion - latest last submission */
  M_SKEW,      /* after the MAX: latest - earliest last submission */
  M_COUNT
};

/* ---- small helpers -------------------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The host name hashed (FNV-1a) to 52 bits, exact in a double, so that an
 * allreduce (max) of it and of its negation tells whether all ranks share
 * one host, hence one CLOCK_MONOTONIC. An unreadable name counts as a
 * distinct host (-1 never equals a hash): no shared-clock figures then. */
static double host_id(void) {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return -1;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return (double)(h >> 12);
}

static void sleep_us(long us) {
  if (us <= 0) return;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-quantile (0..1) of v[0..n), by linear interpolation; sorts v. */
static double quantile(double *v, size_t n, double q) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  double pos = q * (double)(n - 1);
  size_t lo = (size_t)pos;
  size_t hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

static int parse_dtype(const char *s, gs_dtype *out) {
  static const struct {
    const char *name;
    gs_dtype dtype;
  } table[] = {{"float32", GS_FLOAT32},   {"float64", GS_FLOAT64}, {"float16", GS_FLOAT16},
               {"bfloat16", GS_BFLOAT16}, {"int32", GS_INT32},     {"int64", GS_INT64},
               {"int8", GS_INT8},         {"uint8", GS_UINT8}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(s, table[i].name)) {
      *out = table[i].dtype;
      return 0;
    }
  return -1;
}

static void free_tensors(tensor *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(t[i].name);
    free(t[i].buf);
  }
  free(t);
}

/* Appends one tensor; returns 0 or -1 (out of memory). */
static int push_tensor(tensor **t, size_t *n, size_t *cap, const char *name, size_t count,
                       gs_dtype dtype) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 64;
    tensor *nt = realloc(*t, c * sizeof *nt);
    if (!nt) return -1;
    *t = nt;
    *cap = c;
  }
  tensor *x = &(*t)[*n];
  x->name = strdup(name);
  x->count = count;
  x->dtype = dtype;
  x->buf = NULL;
  if (!x->name) return -1;
  (*n)++;
  return 0;
}

/* Reads a workload file. On error prints why (file, line) and returns -1. */
static int read_workload(const char *path, double scale, tensor **out, size_t *nout) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "gradsync-bench: cannot open workload '%s': %s\n", path, strerror(errno));
    return -1;
  }
  tensor *t = NULL;
  size_t n = 0, cap = 0;
  char line[4096];
  int lineno = 0, rc = -1;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char name[NAME_MAX_LEN], dt[32], shape[1024];
    int got = sscanf(line, "%255s %31s %1023s", name, dt, shape);
    if (got <= 0) continue; /* blank or comment */
    gs_dtype dtype;
    if (got != 3 || parse_dtype(dt, &dtype)) {
      fprintf(stderr,
              "gradsync-bench: %s:%d: expected 'name dtype shape' with dtype one of float32, "
              "float64, float16, bfloat16, int32, int64, int8, uint8; got '%s'\n",
              path, lineno, line);
      goto out_close;
    }
    uint64_t elems = 1;
    for (char *p = shape; *p;) {
      char *end;
      errno = 0;
      unsigned long long d = strtoull(p, &end, 10);
      if (end == p || errno || d == 0 || (*end && *end != ',') || elems > UINT64_MAX / d) {
        fprintf(stderr,
                "gradsync-bench: %s:%d: bad shape '%s' of '%s' (positive integers separated "
                "by commas)\n",
                path, lineno, shape, name);
        goto out_close;
      }
      elems *= d;
      p = *end ? end + 1 : end;
    }
    size_t count = (size_t)((double)elems / scale);
    if (count == 0) count = 1;
    if (push_tensor(&t, &n, &cap, name, count, dtype)) {
      fprintf(stderr, "gradsync-bench: out of memory reading '%s'\n", path);
      goto out_close;
    }
  }
  if (!n) {
    fprintf(stderr, "gradsync-bench: workload '%s' lists no tensors\n", path);
    goto out_close;
  }
  rc = 0;
out_close:
  fclose(f);
  if (rc)
    free_tensors(t, n);
  else {
    *out = t;
    *nout = n;
  }
  return rc;
}

/* Fills a float buffer with rank + 1 so that the average is (size + 1) / 2
 * on every rank, in every step (averages of equal values stay equal). */
static void fill(tensor *t, int rank) {
  if (t->dtype == GS_FLOAT32) {
    float *p = t->buf;
    for (size_t i = 0; i < t->count; i++) p[i] = (float)(rank + 1);
  } else if (t->dtype == GS_FLOAT64) {
    double *p = t->buf;
    for (size_t i = 0; i < t->count; i++) p[i] = (double)(rank + 1);
  } else {
    memset(t->buf, 0, t->count * gs_dtype_size(t->dtype));
  }
}

/* Checks the first and last element of a float tensor; -1 with a message if
 * they are not the expected average. */
static int check(const tensor *t, int rank, int size) {
  double want = (size + 1) / 2.0, got[2];
  if (t->dtype == GS_FLOAT32) {
    got[0] = ((const float *)t->buf)[0];
    got[1] = ((const float *)t->buf)[t->count - 1];
  } else if (t->dtype == GS_FLOAT64) {
    got[0] = ((const double *)t->buf)[0];
    got[1] = ((const double *)t->buf)[t->count - 1];
  } else {
    return 0;
  }
  for (int i = 0; i < 2; i++)
    if (fabs(got[i] - want) > 1e-6 * want) {
      fprintf(stderr, "rank %d: tensor '%s' holds %g after the run, expected the average %g\n",
              rank, t->name, got[i], want);
      return -1;
    }
  return 0;
}

/* ---- the job ------------------------------------------------------------ */

typedef struct job {
  gs_ctx *ctx;
  int rank, size;
  tensor *t;
  size_t n;
  gs_handle **h;
  /* --grouped on: the call's arrays, in submission (reverse list) order */
  const char **g_names;
  const void **g_sends;
  void **g_recvs;
  size_t *g_counts;
  gs_handle **g_h;
  float ag_send[4]; /* --allgather: this rank's block (rank + 1) */
  gs_handle *ag;
} job;

static int fail(job *j, gs_handle *h, const char *what, const char *name, gs_status st) {
  const char *msg = h ? gs_handle_error(h) : gs_last_error(j->ctx);
  fprintf(stderr, "rank %d: %s of '%s' failed: %s: %s\n", j->rank, what, name, gs_status_str(st),
          msg && *msg ? msg : "(no message)");
  return -1;
}

static void stats_delta(const gs_stats *a, const gs_stats *b, double *row) {
  row[M_PLANS] = (double)(b->plans_executed - a->plans_executed);
  row[M_COLL] = (double)(b->collectives - a->collectives);
  row[M_TENSORS] = (double)(b->tensors - a->tensors);
  row[M_FUSED] = (double)(b->fused_collectives - a->fused_collectives);
  row[M_REQS] = (double)(b->requests_sent - a->requests_sent);
  row[M_HITS] = (double)(b->cache_hits - a->cache_hits);
  row[M_REPLAYED] = (double)(b->plans_replayed - a->plans_replayed);
  row[M_UPBYTES] = (double)(b->bytes_to_coordinator - a->bytes_to_coordinator);
  row[M_MSGS] = (double)(b->messages_to_coordinator - a->messages_to_coordinator);
  row[M_FAST_ROUNDS] = (double)(b->fast_rounds - a->fast_rounds);
  row[M_FAST_TENSORS] = (double)(b->fast_tensors - a->fast_tensors);
  row[M_FAST_ESC] = (double)(b->fast_escalations - a->fast_escalations);
}

/* The same pseudo-random delay in [0, max_us) on every rank for a step. */
static long step_jitter(long step, long max_us) {
  if (max_us <= 0) return 0;
  uint64_t z = (uint64_t)step * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (long)((z ^ (z >> 31)) % (uint64_t)max_us);
}

/* --allgather: one allgather of float32 [1, 4] per step, which the fast
 * path cannot run (issue 14: every such step goes back to gradsyncd). */
static int submit_allgather(job *j) {
  int64_t shape[2] = {1, 4};
  gs_status st =
      gs_allgather_async(j->ctx, "bench/allgather", j->ag_send, shape, 2, GS_FLOAT32, NULL, &j->ag);
  if (st != GS_OK) return fail(j, NULL, "allgather submission", "bench/allgather", st);
  return 0;
}

/* Waits for the step's allgather and checks it: block r holds r + 1. */
static int check_allgather(job *j) {
  gs_status st = gs_wait(j->ag, WAIT_MS);
  if (st != GS_OK) return fail(j, j->ag, "allgather", "bench/allgather", st);
  const void *data = NULL;
  size_t bytes = 0;
  st = gs_handle_result(j->ag, &data, &bytes);
  if (st != GS_OK) return fail(j, j->ag, "allgather result", "bench/allgather", st);
  int rc = 0;
  if (bytes != (size_t)j->size * 4 * sizeof(float)) {
    fprintf(stderr, "rank %d: allgather 'bench/allgather' returned %zu bytes, expected %zu\n",
            j->rank, bytes, (size_t)j->size * 4 * sizeof(float));
    rc = -1;
  }
  for (size_t i = 0; !rc && i < (size_t)j->size * 4; i++)
    if (((const float *)data)[i] != (float)(i / 4 + 1)) {
      fprintf(stderr, "rank %d: allgather 'bench/allgather' holds %g at %zu, expected %g\n",
              j->rank, ((const float *)data)[i], i, (double)(i / 4 + 1));
      rc = -1;
    }
  gs_handle_free(j->ag);
  j->ag = NULL;
  return rc;
}

/* One step: meet in a barrier, optionally sleep a jitter (so that the first
 * submission does not always fall right after the comm thread's wake-up
 * for the barrier's plan), submit in reverse order, wait for the
 * last-submitted op first (its completion time is the critical path), then
 * for the rest. Writes the metrics into row. */
static int run_step(job *j, long step, const options *o, double *row) {
  double tb = now_ms();
  gs_status st = o->no_barrier ? GS_OK : gs_barrier(j->ctx);
  if (st != GS_OK) return fail(j, NULL, "barrier", "step barrier", st);
  row[M_BARRIER] = now_ms() - tb;
  sleep_us(step_jitter(step, o->jitter_us));
  long gap_us = o->gap_us;
  gs_stats before, after;
  gs_stats_init(&before);
  gs_stats_init(&after);
  gs_get_stats(j->ctx, &before);
  double t0 = now_ms(), t_last = t0, t_first = t0;
  if (o->allgather == 1 && submit_allgather(j)) return -1;
  if (o->grouped == 2) {
    if (!j->g_h[0])
      for (size_t i = 0; i < j->n; i++) {
        st = gs_allreduce_init(j->ctx, j->g_names[i], j->g_sends[i], j->g_recvs[i], j->g_counts[i],
                               j->t[0].dtype, GS_AVERAGE, NULL, &j->g_h[i]);
        if (st != GS_OK) return fail(j, NULL, "persistent init", j->g_names[i], st);
      }
    t0 = now_ms();
    t_last = t0;
    st = gs_startall(j->ctx, j->n, j->g_h);
    if (st != GS_OK) return fail(j, NULL, "startall", j->g_names[0], st);
    for (size_t i = 0; i < j->n; i++) j->h[j->n - 1 - i] = j->g_h[i];
  } else if (o->grouped) {
    t_last = now_ms();
    st = gs_grouped_allreduce_async(j->ctx, j->n, j->g_names, j->g_sends, j->g_recvs, j->g_counts,
                                    j->t[0].dtype, GS_AVERAGE, NULL, j->g_h);
    if (st != GS_OK) return fail(j, NULL, "grouped allreduce submission", j->g_names[0], st);
    for (size_t i = 0; i < j->n; i++) j->h[j->n - 1 - i] = j->g_h[i];
  }
  for (size_t k = o->grouped ? 0 : j->n; k-- > 0;) {
    tensor *x = &j->t[k];
    if (k + 1 < j->n) sleep_us(gap_us);
    /* Only the last submission's time is kept: no clock read before the
     * others (34 ns each here), which would count toward the step as
     * the MPI peer's loop counts none. */
    if (k == 0) t_last = now_ms();
    st = gs_allreduce_async(j->ctx, x->name, x->buf, x->buf, x->count, x->dtype, GS_AVERAGE, NULL,
                            &j->h[k]);
    if (st != GS_OK) return fail(j, NULL, "allreduce submission", x->name, st);
    if (o->call_times && k + 1 == j->n) t_first = now_ms();
  }
  if (o->allgather == 2) {
    t_last = now_ms();
    if (submit_allgather(j)) return -1;
  }
  double t_sub = now_ms();
  st = gs_wait(j->h[0], WAIT_MS);
  if (st != GS_OK) return fail(j, j->h[0], "allreduce", j->t[0].name, st);
  double t_crit = now_ms();
  for (size_t k = 1; k < j->n; k++) {
    st = gs_wait(j->h[k], WAIT_MS);
    if (st != GS_OK) return fail(j, j->h[k], "allreduce", j->t[k].name, st);
  }
  if (j->ag && check_allgather(j)) return -1;
  double t_end = now_ms();
  gs_get_stats(j->ctx, &after);
  double t_free = o->call_times ? now_ms() : 0;
  for (size_t k = 0; o->grouped != 2 && k < j->n; k++) {
    gs_handle_free(j->h[k]);
    j->h[k] = NULL;
  }
  if (o->call_times) {
    size_t later = !o->grouped && j->n > 1 ? j->n - 1 : 0;
    row[M_CALL_FIRST] = o->grouped ? 0 : (t_first - t0) * 1e3;
    row[M_CALL_NS] = later ? (t_sub - t_first) * 1e6 / (double)later : 0;
    row[M_FREE_NS] = (now_ms() - t_free) * 1e6 / (double)j->n;
  }
  row[M_STEP] = t_end - t0;
  row[M_SUBMIT] = t_sub - t0;
  row[M_CRIT] = t_crit - t_last;
  row[M_TAIL] = t_end - t_last;
  row[M_T_LAST] = t_last;
  row[M_T_LAST_NEG] = -t_last;
  row[M_T_CRIT] = t_crit;
  stats_delta(&before, &after, row);
  return 0;
}

/* Medians (and quartiles of the times) over the per-step worst rank. */
static void report(const options *o, const char *label, int size, uint64_t total_bytes,
                   size_t ntensors, const double *rows, long steps) {
  double *col = malloc((size_t)steps * sizeof *col);
  double med[M_COUNT], q1[M_COUNT], q3[M_COUNT], replayed = 0, plans = 0;
  int one_host = 1; /* every step's rows: all ranks had the same host_id() */
  if (!col) {
    fprintf(stderr, "gradsync-bench: out of memory for the report\n");
    return;
  }
  for (int m = 0; m < M_COUNT; m++) {
    for (long s = 0; s < steps; s++) col[s] = rows[s * M_COUNT + m];
    q1[m] = quantile(col, (size_t)steps, 0.25);
    med[m] = quantile(col, (size_t)steps, 0.5);
    q3[m] = quantile(col, (size_t)steps, 0.75);
  }
  free(col);
  for (long s = 0; s < steps; s++) {
    if (rows[s * M_COUNT + M_HOST] != -rows[s * M_COUNT + M_HOST_NEG]) one_host = 0;
    replayed += rows[s * M_COUNT + M_REPLAYED];
    plans += rows[s * M_COUNT + M_PLANS];
  }
  double per_op = med[M_COLL] > 0 ? med[M_TENSORS] / med[M_COLL] : 0;
  double hit_rate = med[M_REQS] > 0 ? med[M_HITS] / med[M_REQS] : 0;
  double busbw = med[M_STEP] > 0
                     ? (double)total_bytes * 2.0 * (size - 1) / size / (med[M_STEP] / 1e3) / 1e9
                     : 0;
  char crit_last[192] = "crit_last_ms=n/a crit_last_q1=n/a crit_last_q3=n/a skew_ms=n/a";
  char calls[128] = "";
  if (o->call_times)
    snprintf(calls, sizeof calls, " submit_first_us=%.3f submit_call_ns=%.1f free_call_ns=%.1f",
             med[M_CALL_FIRST], med[M_CALL_NS], med[M_FREE_NS]);
  if (one_host)
    snprintf(crit_last, sizeof crit_last,
             "crit_last_ms=%.3f crit_last_q1=%.3f crit_last_q3=%.3f skew_ms=%.3f", med[M_CRIT_LAST],
             q1[M_CRIT_LAST], q3[M_CRIT_LAST], med[M_SKEW]);
  printf("RESULT workload=%s np=%d%s%s%s%s%s tensors=%zu bytes=%" PRIu64
         " steps=%ld gap_us=%ld step_ms=%.3f step_q1=%.3f step_q3=%.3f submit_ms=%.3f "
         "crit_ms=%.3f crit_q1=%.3f crit_q3=%.3f tail_ms=%.3f plans=%.0f collectives=%.0f "
         "fused=%.0f tensors_per_op=%.2f requests=%.0f cache_hits=%.0f hit_rate=%.3f "
         "plans_replayed=%.0f replay_rate=%.3f up_bytes=%.0f up_msgs=%.0f barrier_ms=%.3f "
         "busbw_gbs=%.3f fast_rounds=%.0f fast_tensors=%.0f fast_escalations=%.0f %s%s\n",
         label, size,
         o->allgather == 1   ? " allgather=first"
         : o->allgather == 2 ? " allgather=last"
                             : "",
         o->no_barrier ? " barrier=off" : "",
         o->grouped == 2 ? " grouped=persistent"
         : o->grouped    ? " grouped=on"
                         : "",
         o->tag ? " " : "", o->tag ? o->tag : "", ntensors, total_bytes, steps, o->gap_us,
         med[M_STEP], q1[M_STEP], q3[M_STEP], med[M_SUBMIT], med[M_CRIT], q1[M_CRIT], q3[M_CRIT],
         med[M_TAIL], med[M_PLANS], med[M_COLL], med[M_FUSED], per_op, med[M_REQS], med[M_HITS],
         hit_rate, med[M_REPLAYED], plans > 0 ? replayed / plans : 0, med[M_UPBYTES], med[M_MSGS],
         med[M_BARRIER], busbw, med[M_FAST_ROUNDS], med[M_FAST_TENSORS], med[M_FAST_ESC], crit_last,
         calls);
  fflush(stdout);
}

/* ---- command line ----------------------------------------------------- */

static void usage(FILE *f) {
  fputs("usage: gradsync-bench (--workload FILE | --raw-allreduce BYTES | --uniform COUNTxBYTES)\n"
        "                      [--steps N] [--warmup W] [--scale F] [--gap-us G]\n"
        "                      [--jitter-us J] [--tag TEXT]\n"
        "Run under gradsync-run. Each step submits every tensor (reverse list order,\n"
        "GS_AVERAGE in place) and waits for all; rank 0 prints medians over the steps of\n"
        "the slowest rank as one 'RESULT key=value ...' line.\n"
        "  --workload FILE        tensor list: 'name dtype shape' lines, '#' comments\n"
        "  --raw-allreduce BYTES  one float32 allreduce of BYTES per step (baseline)\n"
        "  --uniform COUNTxBYTES  COUNT float32 tensors of BYTES each (e.g. 200x16384)\n"
        "  --steps N              measured steps (default 20)\n"
        "  --warmup W             unmeasured steps first (default 3)\n"
        "  --scale F              divide every tensor's element count by F (default 1)\n"
        "  --gap-us G             sleep G microseconds between submissions, standing in\n"
        "                         for backward compute (default 0)\n"
        "  --jitter-us J          after each step's barrier sleep a pseudo-random time in\n"
        "                         [0, J) microseconds, the same on every rank (default 0)\n"
        "  --allgather first|last also submit one allgather (float32 [1,4]) per step,\n"
        "                         before or after the allreduces (an op the fast path\n"
        "                         cannot run: every step goes back to gradsyncd)\n"
        "  --barrier on|off       off: no gs_barrier before each step; steps run back to\n"
        "                         back (default on)\n"
        "  --grouped on|off|persistent\n"
        "                         on: submit the step's tensors as one grouped allreduce\n"
        "                         (gs_grouped_allreduce_async; one dtype, no --gap-us);\n"
        "                         persistent: as persistent ops (gs_allreduce_init once),\n"
        "                         one gs_startall per step (same conditions) (default off)\n"
        "  --call-times on|off    on: also report the first submission (submit_first_us),\n"
        "                         each later one (submit_call_ns) and one gs_handle_free\n"
        "                         (free_call_ns), from 3 more clock reads per step\n"
        "                         (the submission figures are 0 with --grouped on)\n"
        "                         (default off)\n"
        "  --tag TEXT             copied into the RESULT line (e.g. 'fusion=0 policy=window')\n",
        f);
}

static int parse_long(const char *key, const char *v, long min, long *out) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || end == v || *end || n < min) {
    fprintf(stderr, "gradsync-bench: %s needs an integer >= %ld, got '%s'\n", key, min, v);
    return -1;
  }
  *out = n;
  return 0;
}

static int parse_u64(const char *key, const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || end == v || *end || n == 0 || v[0] == '-') {
    fprintf(stderr, "gradsync-bench: %s needs a positive integer, got '%s'\n", key, v);
    return -1;
  }
  *out = n;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->steps = 20;
  o->warmup = 3;
  o->scale = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--version")) {
      printf("gradsync-bench %s (libgradsync %s)\n", GS_VERSION_STRING, gs_version());
      exit(0);
    }
    static const char *const keys[] = {"--workload",  "--raw-allreduce", "--uniform", "--steps",
                                       "--warmup",    "--scale",         "--gap-us",  "--jitter-us",
                                       "--tag",       "--allgather",     "--barrier", "--grouped",
                                       "--call-times"};
    int known = 0;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) known |= !strcmp(a, keys[k]);
    if (!known) {
      fprintf(stderr, "gradsync-bench: unknown option '%s'\n", a);
      usage(stderr);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "gradsync-bench: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--workload"))
      o->workload = v;
    else if (!strcmp(a, "--tag"))
      o->tag = v;
    else if (!strcmp(a, "--barrier")) {
      if (strcmp(v, "on") && strcmp(v, "off")) {
        fprintf(stderr, "gradsync-bench: --barrier needs 'on' or 'off', got '%s'\n", v);
        return -1;
      }
      o->no_barrier = !strcmp(v, "off");
    } else if (!strcmp(a, "--grouped")) {
      if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "persistent")) {
        fprintf(stderr, "gradsync-bench: --grouped needs 'on', 'off' or 'persistent', got '%s'\n",
                v);
        return -1;
      }
      o->grouped = !strcmp(v, "on") ? 1 : !strcmp(v, "persistent") ? 2 : 0;
    } else if (!strcmp(a, "--call-times")) {
      if (strcmp(v, "on") && strcmp(v, "off")) {
        fprintf(stderr, "gradsync-bench: --call-times needs 'on' or 'off', got '%s'\n", v);
        return -1;
      }
      o->call_times = !strcmp(v, "on");
    } else if (!strcmp(a, "--allgather")) {
      if (strcmp(v, "first") && strcmp(v, "last")) {
        fprintf(stderr, "gradsync-bench: --allgather needs 'first' or 'last', got '%s'\n", v);
        return -1;
      }
      o->allgather = !strcmp(v, "first") ? 1 : 2;
    } else if (!strcmp(a, "--raw-allreduce")) {
      if (parse_u64(a, v, &o->raw_bytes)) return -1;
    } else if (!strcmp(a, "--uniform")) {
      char *x = strchr(v, 'x');
      char num[32];
      if (!x || (size_t)(x - v) >= sizeof num) goto bad_uniform;
      memcpy(num, v, (size_t)(x - v));
      num[x - v] = '\0';
      if (parse_long(a, num, 1, &o->uniform_count) || parse_u64(a, x + 1, &o->uniform_size))
        goto bad_uniform;
      continue;
    bad_uniform:
      fprintf(stderr, "gradsync-bench: --uniform needs COUNTxBYTES (e.g. 200x16384), got '%s'\n",
              v);
      return -1;
    } else if (!strcmp(a, "--steps")) {
      if (parse_long(a, v, 1, &o->steps)) return -1;
    } else if (!strcmp(a, "--warmup")) {
      if (parse_long(a, v, 0, &o->warmup)) return -1;
    } else if (!strcmp(a, "--gap-us")) {
      if (parse_long(a, v, 0, &o->gap_us)) return -1;
    } else if (!strcmp(a, "--jitter-us")) {
      if (parse_long(a, v, 0, &o->jitter_us)) return -1;
    } else if (!strcmp(a, "--scale")) {
      char *end;
      o->scale = strtod(v, &end);
      if (end == v || *end || !(o->scale >= 1)) {
        fprintf(stderr, "gradsync-bench: --scale needs a number >= 1, got '%s'\n", v);
        return -1;
      }
    }
  }
  int modes = !!o->workload + !!o->raw_bytes + !!o->uniform_count;
  if (modes != 1) {
    fprintf(stderr, "gradsync-bench: give exactly one of --workload, --raw-allreduce, "
                    "--uniform\n");
    usage(stderr);
    return -1;
  }
  if (o->grouped && o->gap_us) {
    fprintf(stderr, "gradsync-bench: --grouped on submits every tensor in one call: it takes no "
                    "--gap-us\n");
    return -1;
  }
  return 0;
}

/* The RESULT label: the workload file's base name without extension. */
static void workload_label(const options *o, char *out, size_t cap) {
  if (o->raw_bytes) {
    snprintf(out, cap, "raw%" PRIu64, o->raw_bytes);
    return;
  }
  if (o->uniform_count) {
    snprintf(out, cap, "uniform%ldx%" PRIu64, o->uniform_count, o->uniform_size);
    return;
  }
  const char *base = strrchr(o->workload, '/');
  base = base ? base + 1 : o->workload;
  snprintf(out, cap, "%s", base);
  char *dot = strrchr(out, '.');
  if (dot && dot != out) *dot = '\0';
}

static int build_tensors(const options *o, tensor **t, size_t *n) {
  size_t cap = 0;
  *t = NULL;
  *n = 0;
  if (o->workload) return read_workload(o->workload, o->scale, t, n);
  if (o->raw_bytes) {
    size_t count = (size_t)(o->raw_bytes / 4) ? (size_t)(o->raw_bytes / 4) : 1;
    if (push_tensor(t, n, &cap, "bench/raw", count, GS_FLOAT32)) goto out_nomem;
    return 0;
  }
  for (long i = 0; i < o->uniform_count; i++) {
    char name[64];
    snprintf(name, sizeof name, "bench/uniform.%ld", i);
    size_t count = (size_t)(o->uniform_size / 4) ? (size_t)(o->uniform_size / 4) : 1;
    if (push_tensor(t, n, &cap, name, count, GS_FLOAT32)) goto out_nomem;
  }
  return 0;
out_nomem:
  fprintf(stderr, "gradsync-bench: out of memory building tensors\n");
  free_tensors(*t, *n);
  *t = NULL;
  *n = 0;
  return -1;
}

int main(int argc, char **argv) {
  options o;
  if (parse_args(argc, argv, &o)) return 2;
  char label[128];
  workload_label(&o, label, sizeof label);

  job j = {0};
  if (build_tensors(&o, &j.t, &j.n)) return 1;
  int rc = 1;
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < j.n; i++) total_bytes += j.t[i].count * gs_dtype_size(j.t[i].dtype);

  gs_status st = gs_init(NULL, &j.ctx);
  if (st != GS_OK) {
    fprintf(stderr, "gradsync-bench: gs_init failed: %s: %s\n", gs_status_str(st),
            gs_last_error(NULL));
    goto out_free_tensors;
  }
  j.rank = gs_rank(j.ctx);
  j.size = gs_size(j.ctx);
  for (int i = 0; i < 4; i++) j.ag_send[i] = (float)(j.rank + 1);

  long total_steps = o.warmup + o.steps;
  j.h = calloc(j.n, sizeof *j.h);
  double *rows = calloc((size_t)o.steps * M_COUNT, sizeof *rows);
  if (!j.h || !rows) {
    fprintf(stderr, "rank %d: out of memory\n", j.rank);
    goto out_free_rows;
  }
  if (o.grouped) {
    for (size_t i = 1; i < j.n; i++)
      if (j.t[i].dtype != j.t[0].dtype) {
        fprintf(stderr,
                "gradsync-bench: --grouped on: '%s' and '%s' have different dtypes; a "
                "grouped allreduce takes one\n",
                j.t[0].name, j.t[i].name);
        goto out_free_rows;
      }
    j.g_names = calloc(j.n, sizeof *j.g_names);
    j.g_sends = calloc(j.n, sizeof *j.g_sends);
    j.g_recvs = calloc(j.n, sizeof *j.g_recvs);
    j.g_counts = calloc(j.n, sizeof *j.g_counts);
    j.g_h = calloc(j.n, sizeof *j.g_h);
    if (!j.g_names || !j.g_sends || !j.g_recvs || !j.g_counts || !j.g_h) {
      fprintf(stderr, "rank %d: out of memory\n", j.rank);
      goto out_free_rows;
    }
  }
  for (size_t i = 0; i < j.n; i++) {
    j.t[i].buf = malloc(j.t[i].count * gs_dtype_size(j.t[i].dtype));
    if (!j.t[i].buf) {
      fprintf(stderr, "rank %d: out of memory for '%s' (%zu elements); try --scale\n", j.rank,
              j.t[i].name, j.t[i].count);
      goto out_free_rows;
    }
    fill(&j.t[i], j.rank);
  }
  for (size_t i = 0; o.grouped && i < j.n; i++) {
    tensor *x = &j.t[j.n - 1 - i]; /* reverse list order, as the single calls */
    j.g_names[i] = x->name;
    j.g_sends[i] = x->buf;
    j.g_recvs[i] = x->buf;
    j.g_counts[i] = x->count;
  }

  for (long s = 0; s < total_steps; s++) {
    double scratch[M_COUNT] = {0};
    double *row = s >= o.warmup ? &rows[(s - o.warmup) * M_COUNT] : scratch;
    if (run_step(&j, s, &o, row)) goto out_free_rows;
    row[M_HOST] = host_id();
    row[M_HOST_NEG] = -row[M_HOST];
  }

  /* The worst rank of every step: one allreduce (max) of all the rows. */
  gs_handle *h = NULL;
  st = gs_allreduce_async(j.ctx, "bench/metrics", rows, rows, (size_t)o.steps * M_COUNT, GS_FLOAT64,
                          GS_MAX, NULL, &h);
  if (st != GS_OK) {
    fail(&j, NULL, "allreduce submission", "bench/metrics", st);
    goto out_free_rows;
  }
  st = gs_wait(h, WAIT_MS);
  if (st != GS_OK) {
    fail(&j, h, "allreduce", "bench/metrics", st);
    gs_handle_free(h);
    goto out_free_rows;
  }
  gs_handle_free(h);
  for (long s = 0; s < o.steps; s++) {
    double *r = &rows[s * M_COUNT];
    r[M_CRIT_LAST] = r[M_T_CRIT] - r[M_T_LAST];
    r[M_SKEW] = r[M_T_LAST] + r[M_T_LAST_NEG];
  }
  if (j.rank == 0) report(&o, label, j.size, total_bytes, j.n, rows, o.steps);

  rc = 0;
  for (size_t i = 0; i < j.n; i++)
    if (check(&j.t[i], j.rank, j.size)) rc = 1;

out_free_rows:
  gs_shutdown(j.ctx); /* completes whatever is still pending */
  for (size_t i = 0; o.grouped != 2 && j.h && i < j.n; i++) gs_handle_free(j.h[i]);
  for (size_t i = 0; o.grouped == 2 && j.g_h && i < j.n; i++) gs_handle_free(j.g_h[i]);
  gs_handle_free(j.ag);
  free(rows);
  free(j.h);
  free(j.g_names);
  free(j.g_sends);
  free(j.g_recvs);
  free(j.g_counts);
  free(j.g_h);
out_free_tensors:
  free_tensors(j.t, j.n);
  return rc;
}
