/* Integration tests of the negotiation engine: a real gradsyncd and 2-4 real
 * gs-test-worker processes on 127.0.0.1.
 *
 * Covers what the coordinator decides and every rank must agree on: mismatch
 * errors (same text on every rank, the job goes on), fusion (exact results,
 * collectives per step against the threshold, both emission policies), the
 * response cache on the ResNet-50 tensor list, allgather with uneven first
 * dimensions, broadcast from a non-zero root, barriers, grouped allreduce,
 * gs_join with uneven data and duplicate names in flight.
 *
 * The workers check every value against a local reference and print one line
 * per result (error texts, allgather dims, gs_get_stats deltas); the tests
 * here assert those lines. No assertion depends on timing: every wait is
 * bounded by a generous hang guard, and the teardown kills and reaps every
 * process a test started, also when it failed. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "job.h"

#define GUARD_MS 120000
#define WORKLOAD_GUARD_MS 300000 /* 5 steps of 97.5 MiB, also under ASan */

static const char worker_path[] = GS_BIN_DIR "/gs-test-worker";
static const char resnet50_path[] = GS_SOURCE_DIR "/bench/workloads/resnet50.txt";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("neg", GUARD_MS);
}

static int setup_workload(void **state) {
  (void)state;
  return proc_test_begin("neg", WORKLOAD_GUARD_MS);
}

/* gs-test-worker ARGS... as rank `rank` of w, with the worker environment
 * and GS_TEST_DIR (the test's private directory). */
static proc *start_rank(job *w, int rank, char *const args[]) {
  char dir[600];
  snprintf(dir, sizeof dir, "GS_TEST_DIR=%s", proc_test_dir());
  char *env[] = {dir, NULL};
  return job_start_rank(w, rank, worker_path, args, env);
}

/* A world of size running ARGS on every rank; each must exit 0 and print
 * "MODE: passed (rank R of SIZE" where MODE is pass_prefix. */
static void run_world(job *w, int size, char *const coord_args[], char *const args[],
                      const char *pass_prefix) {
  job_start_coordinator(w, size, coord_args);
  for (int r = 0; r < size; r++) w->ranks[r] = start_rank(w, r, args);
  for (int r = 0; r < size; r++) job_expect_exit(w->ranks[r], 0);
  for (int r = 0; r < size; r++) {
    char want[128];
    snprintf(want, sizeof want, "%s: passed (rank %d of %d", pass_prefix, r, size);
    job_expect_output(w->ranks[r], want);
  }
  job_stop_coordinator(w);
}

/* The first line of p's output that starts with prefix, newline stripped,
 * into buf. Returns 0 when found. */
static int find_line(const proc *p, const char *prefix, char *buf, size_t cap) {
  char *out = proc_output(p);
  size_t plen = strlen(prefix);
  int rc = -1;
  for (char *line = out; line && *line;) {
    char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    if (len >= plen && strncmp(line, prefix, plen) == 0) {
      snprintf(buf, cap, "%.*s", (int)len, line);
      rc = 0;
      break;
    }
    line = nl ? nl + 1 : NULL;
  }
  free(out);
  return rc;
}

static void line_or_fail(const proc *p, const char *prefix, char *buf, size_t cap) {
  if (find_line(p, prefix, buf, cap) != 0)
    job_fail("%s: no output line starts with \"%s\"", p->label, prefix);
}

/* Every rank of w printed exactly the line want (found by its prefix). */
static void expect_same_line(const job *w, const char *prefix, const char *want) {
  char first[4096] = "";
  for (int r = 0; r < w->size; r++) {
    char got[4096];
    line_or_fail(w->ranks[r], prefix, got, sizeof got);
    if (r == 0)
      snprintf(first, sizeof first, "%s", got);
    else if (strcmp(got, first) != 0)
      job_fail("ranks disagree on \"%s\":\n  rank 0: %s\n  rank %d: %s", prefix, first, r, got);
    if (strcmp(got, want) != 0) job_fail("rank %d:\n  got:      %s\n  expected: %s", r, got, want);
  }
}

/* The gs_get_stats deltas a worker printed ("... collectives=C tensors=T
 * fused=F requests=R hits=H [messages=M]"; messages 0 when absent). */
typedef struct stats_line {
  unsigned long long collectives, tensors, fused, requests, hits, messages;
} stats_line;

static stats_line stats_of(const proc *p, const char *prefix) {
  char line[1024];
  line_or_fail(p, prefix, line, sizeof line);
  stats_line s;
  const char *at = strstr(line, "collectives=");
  if (at == NULL || sscanf(at, "collectives=%llu tensors=%llu fused=%llu requests=%llu hits=%llu",
                           &s.collectives, &s.tensors, &s.fused, &s.requests, &s.hits) != 5)
    job_fail("%s: cannot parse the stats line \"%s\"", p->label, line);
  const char *msgs = strstr(line, "messages=");
  s.messages = 0;
  if (msgs) sscanf(msgs, "messages=%llu", &s.messages);
  return s;
}

/* ---- 1. every mismatch: one text on every rank, the job goes on ----------- */

/* The coordinator's wording (engine.c mismatch_message / attr_format): the
 * first attribute that differs, then each group of ranks, lowest rank first,
 * with the value it sent. */
static const struct {
  const char *mode_case, *text;
} k_mismatches[] = {
    {"shape", "tensor 'mm/shape': mismatched shapes: ranks [0,2] sent [3,2], ranks [1] sent [2,3]"},
    {"shape3", "tensor 'mm/shape3': mismatched shapes: ranks [0] sent [4], ranks [1] sent [5], "
               "ranks [2] sent [6]"},
    {"dtype", "tensor 'mm/dtype': mismatched data types: ranks [0,1] sent float32, ranks [2] sent "
              "float64"},
    {"reduce",
     "tensor 'mm/reduce': mismatched reduce ops: ranks [0,2] sent sum, ranks [1] sent max"},
    {"optype",
     "tensor 'mm/optype': mismatched operations: ranks [0] sent allreduce, ranks [1] sent "
     "allgather, ranks [2] sent broadcast"},
    {"root",
     "tensor 'mm/root': mismatched broadcast roots: ranks [0,1] sent root 0, ranks [2] sent "
     "root 1"},
    {"prescale", "tensor 'mm/prescale': mismatched prescale factors: ranks [0,2] sent 1, ranks [1] "
                 "sent 0.5"},
    {"postscale", "tensor 'mm/postscale': mismatched postscale factors: ranks [0] sent 2, ranks "
                  "[1,2] sent 0.25"},
    {"gather-trailing", "tensor 'mm/gather-trailing': mismatched shapes: ranks [0,2] sent 2 dims, "
                        "trailing [3], ranks [1] sent 2 dims, trailing [4]"},
    {"gather-ndim", "tensor 'mm/gather-ndim': mismatched shapes: ranks [0,1] sent 2 dims, trailing "
                    "[3], ranks [2] sent 3 dims, trailing [3,1]"},
};

static void test_mismatch_every_attribute_3(void **state) {
  (void)state;
  char *args[] = {"mismatch-all", NULL};
  job w;
  run_world(&w, 3, NULL, args, "neg-mismatch");
  size_t n = sizeof k_mismatches / sizeof k_mismatches[0];
  for (size_t i = 0; i < n; i++) {
    char prefix[128], want[1024];
    snprintf(prefix, sizeof prefix, "neg-mismatch: %s: ", k_mismatches[i].mode_case);
    snprintf(want, sizeof want, "%sGS_ERR_MISMATCH: %s", prefix, k_mismatches[i].text);
    expect_same_line(&w, prefix, want);
    /* After the error, a new tensor and the failed name itself completed
     * with the right values (checked by the worker). */
    for (int r = 0; r < 3; r++) {
      char line[256];
      snprintf(prefix, sizeof prefix, "neg-mismatch: rank %d: %s: later tensors ok", r,
               k_mismatches[i].mode_case);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
    }
  }
}

/* ---- 2. fusion -------------------------------------------------------------- */

#define FUSION_TENSORS 200
#define FUSION_COUNT 4096 /* float32: 16 KiB each, 3.125 MiB per step */
#define FUSION_STEPS 2    /* the second through the response cache */

/* 200 tensors submitted at once on 2 ranks; the worker checks every value.
 * Returns nothing; asserts per rank and step: tensors = 200 and
 * min_collectives <= collectives <= max_collectives + the messages both
 * ranks sent to the coordinator in that step (chunks > 0).
 *
 * A worker sends the first request of a burst at once and the rest in as
 * few messages as the coordinator's answers allow (Nagle's rule; the cycle
 * time, raised to 20 ms here, only bounds how long they wait). Tensors
 * become ready at the coordinator in chunks cut where either rank's
 * messages end, and a fused group can end at a chunk's end as well as at
 * the threshold: at most one extra collective per message that carried
 * requests (the count of all messages, plan reports included, bounds that). */
static void fusion_world(const char *threshold, const char *policy, unsigned long long min_coll,
                         unsigned long long max_coll, int chunks) {
  /* --fast-path off: these pin down the coordinator's fusion and response
   * cache, which the fast path (issue 14) bypasses from the second step
   * on; test_fastpath covers fusion in fast rounds. */
  char *coord_args[] = {"--fusion-threshold",
                        (char *)threshold,
                        "--emit-policy",
                        (char *)policy,
                        "--cycle-time-ms",
                        "20",
                        "--fast-path",
                        "off",
                        NULL};
  char n[16], count[16], steps[16];
  snprintf(n, sizeof n, "%d", FUSION_TENSORS);
  snprintf(count, sizeof count, "%d", FUSION_COUNT);
  snprintf(steps, sizeof steps, "%d", FUSION_STEPS);
  char *args[] = {"fusion", n, count, steps, NULL};
  job w;
  run_world(&w, 2, coord_args, args, "fusion");
  for (int r = 0; r < 2; r++)
    for (int s = 0; s < FUSION_STEPS; s++) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "fusion: rank %d step %d: ", r, s);
      stats_line st = stats_of(w.ranks[r], prefix);
      if (st.tensors != FUSION_TENSORS)
        job_fail("rank %d step %d: %llu tensors completed, expected %d", r, s, st.tensors,
                 FUSION_TENSORS);
      unsigned long long max = max_coll;
      if (chunks) {
        for (int q = 0; q < 2; q++) {
          snprintf(prefix, sizeof prefix, "fusion: rank %d step %d: ", q, s);
          max += stats_of(w.ranks[q], prefix).messages;
        }
        if (max > FUSION_TENSORS) max = FUSION_TENSORS;
      }
      if (st.collectives < min_coll || st.collectives > max)
        job_fail("rank %d step %d (threshold %s, %s): %llu collectives, expected %llu..%llu", r, s,
                 threshold, policy, st.collectives, min_coll, max);
      if (s > 0 && st.hits != FUSION_TENSORS)
        job_fail("rank %d step %d: %llu of %llu requests were cache hits, expected all %d", r, s,
                 st.hits, st.requests, FUSION_TENSORS);
    }
}

static unsigned long long fusion_bound(unsigned long long threshold) {
  unsigned long long total = (unsigned long long)FUSION_TENSORS * FUSION_COUNT * 4;
  return (total + threshold - 1) / threshold; /* ceil(total / threshold) */
}

static void test_fusion_threshold_1mib(void **state) {
  (void)state;
  fusion_world("1048576", "adaptive", 1, fusion_bound(1048576), 1); /* 4 + messages */
}

static void test_fusion_off(void **state) {
  (void)state;
  fusion_world("0", "adaptive", FUSION_TENSORS, FUSION_TENSORS, 0);
}

static void test_fusion_window_policy(void **state) {
  (void)state;
  fusion_world("1048576", "window", 1, fusion_bound(1048576), 1);
}

/* ---- 3. ResNet-50: values every step, the response cache from step 2 ------- */

static void test_resnet50_cache(void **state) {
  (void)state;
  /* In the repository: a clone without it is broken, not a reason to skip. */
  if (access(resnet50_path, R_OK) != 0) job_fail("workload %s is missing", resnet50_path);
  char *args[] = {"workload", (char *)resnet50_path, "5", NULL};
  /* The coordinator's response cache: without the fast path, which would
   * run steps 2-5 with no request at all (test_fastpath). */
  char *coord_args[] = {"--fast-path", "off", NULL};
  job w;
  run_world(&w, 2, coord_args, args, "workload");
  for (int r = 0; r < 2; r++) {
    char line[512];
    line_or_fail(w.ranks[r], "workload: passed", line, sizeof line);
    if (strstr(line, "161 tensors, 25557032 elements x 5 steps") == NULL)
      job_fail("rank %d did not run the whole ResNet-50 list: %s", r, line);
    for (int s = 1; s <= 5; s++) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "workload: rank %d step %d: ", r, s);
      stats_line st = stats_of(w.ranks[r], prefix);
      if (st.tensors != 161 || st.requests != 161)
        job_fail("rank %d step %d: %llu tensors completed from %llu requests, expected 161", r, s,
                 st.tensors, st.requests);
      /* hits / requests >= 99 % */
      if (s >= 2 && st.hits * 100 < st.requests * 99)
        job_fail("rank %d step %d: cache hit rate %llu/%llu is below 99 %%", r, s, st.hits,
                 st.requests);
    }
  }
}

/* ---- 4. allgather with uneven first dimensions ------------------------------- */

/* Same formula as the worker's ag_dim: 1..3 rows, 0 on one rank per round. */
static long long ag_dim(int r, int k, int size) {
  if (r == (size - 1 + k) % size) return 0;
  return 1 + (r * 2 + k) % 3;
}

static void dims_text(char *buf, size_t cap, int k, int size, long long *total) {
  size_t off = (size_t)snprintf(buf, cap, "[");
  *total = 0;
  for (int r = 0; r < size; r++) {
    off += (size_t)snprintf(buf + off, cap - off, "%s%lld", r ? "," : "", ag_dim(r, k, size));
    *total += ag_dim(r, k, size);
  }
  snprintf(buf + off, cap - off, "]");
}

static void allgather_world(int size) {
  enum { ROUNDS = 3 };
  char *args[] = {"allgather", "3", NULL};
  job w;
  run_world(&w, size, NULL, args, "allgather");
  for (int k = 0; k < ROUNDS; k++) {
    char d3[128], d1[128], prefix[64], want[512];
    long long t3, t1;
    dims_text(d3, sizeof d3, k, size, &t3);
    dims_text(d1, sizeof d1, k + 1, size, &t1);
    snprintf(prefix, sizeof prefix, "allgather: round %d: ", k);
    snprintf(want, sizeof want, "%s3d dims %s total %lld; 1d dims %s total %lld", prefix, d3, t3,
             d1, t1);
    expect_same_line(&w, prefix, want);
  }
  expect_same_line(&w, "allgather: gs_handle_result_copy: ",
                   "allgather: gs_handle_result_copy: results copied whole; pending op, "
                   "allreduce, NULL handle, wrong sizes and NULL dst refused");
}

static void test_allgather_uneven_2(void **state) {
  (void)state;
  allgather_world(2);
}

static void test_allgather_uneven_4(void **state) {
  (void)state;
  allgather_world(4);
}

/* ---- 5. broadcast from root 2 of 3, three barriers ---------------------------- */

static void test_broadcast_root2_and_barriers_3(void **state) {
  (void)state;
  char *args[] = {"bcast-barrier", "2", NULL};
  job w;
  run_world(&w, 3, NULL, args, "bcast");
  for (int r = 0; r < 3; r++) {
    char prefix[64], line[256];
    snprintf(prefix, sizeof prefix, "bcast: rank %d: float64 and int8 from root 2 ok", r);
    line_or_fail(w.ranks[r], prefix, line, sizeof line);
    for (int k = 1; k <= 3; k++) {
      snprintf(prefix, sizeof prefix, "bcast: rank %d: barrier %d ok", r, k);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
    }
  }
  for (int k = 1; k <= 3; k++)
    for (int r = 0; r < 3; r++) {
      char path[700];
      snprintf(path, sizeof path, "%s/barrier-%d-rank-%d", proc_test_dir(), k, r);
      unlink(path);
    }
}

/* ---- 6. grouped allreduce --------------------------------------------------- */

/* group/a (5 floats), group/b (1000), group/c (70000), 2 rounds (the second
 * pre- and postscaled); values checked by the worker. */
static void grouped_world(char *const coord_args[], unsigned long long want_collectives) {
  char *args[] = {"grouped", "2", NULL};
  job w;
  run_world(&w, 2, coord_args, args, "grouped");
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < 2; k++) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "grouped: rank %d round %d: ", r, k);
      stats_line st = stats_of(w.ranks[r], prefix);
      if (st.tensors != 3 || st.collectives != want_collectives)
        job_fail("rank %d round %d: the group ran as %llu collectives of %llu tensors, "
                 "expected %llu of 3",
                 r, k, st.collectives, st.tensors, want_collectives);
    }
}

/* Default threshold (64 MiB): the group is emitted whole and fused into one. */
static void test_grouped_allreduce(void **state) {
  (void)state;
  grouped_world(NULL, 1);
}

/* 4 KiB: a (20 B) and b (4000 B at offset 64) fit together, c (280000 B)
 * cannot join them: two collectives, still exact. */
static void test_grouped_allreduce_low_threshold(void **state) {
  (void)state;
  char *coord_args[] = {"--fusion-threshold", "4096", NULL};
  grouped_world(coord_args, 2);
}

/* ---- 7. gs_join with uneven data ---------------------------------------------- */

/* The last rank runs 4 of 6 steps and joins. The worker checks each step's
 * average exactly: the tensor itself while all ranks take part, and
 * tensor * (size - 1) / size for the two steps after the join (the data are
 * multiples of size, so every partial sum and the quotient are small
 * integers, exact in float32: no tolerance needed). */
static void join_world(int size) {
  char *args[] = {"join-steps", "6", NULL};
  job w;
  run_world(&w, size, NULL, args, "join");
  const int early = size - 1;
  int last = -1;
  for (int r = 0; r < size; r++) {
    char prefix[64], line[1024];
    if (r != early) {
      snprintf(prefix, sizeof prefix, "join: rank %d: step 4 ok (one rank joined)", r);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
      snprintf(prefix, sizeof prefix, "join: rank %d: step 5 ok (one rank joined)", r);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
      static const char *const ops[] = {"allgather", "broadcast"};
      static const char *const names[] = {"join/gather", "join/bcast"};
      for (int i = 0; i < 2; i++) {
        char want[256];
        snprintf(prefix, sizeof prefix, "join: rank %d: %s: ", r, ops[i]);
        line_or_fail(w.ranks[r], prefix, line, sizeof line);
        snprintf(want, sizeof want, "%sGS_ERR_INVALID_ARG: tensor '%s': %s while rank %d ", prefix,
                 names[i], ops[i], early);
        if (strncmp(line, want, strlen(want)) != 0 || strstr(line, "has joined") == NULL)
          job_fail("rank %d: %s with a joined rank:\n  got:      %s\n  expected: %s... "
                   "has joined ...",
                   r, ops[i], line, want);
      }
    }
    snprintf(prefix, sizeof prefix, "join: rank %d: last joined rank ", r);
    line_or_fail(w.ranks[r], prefix, line, sizeof line);
    int l = atoi(line + strlen(prefix));
    if (r == 0) last = l;
    if (l != last)
      job_fail("gs_join: rank 0 says rank %d joined last, rank %d says %d", last, r, l);
  }
  /* The early rank joined first; the last one is one of the others. */
  if (last < 0 || last >= early)
    job_fail("gs_join named rank %d as the last to join; rank %d joined first, so it must "
             "be one of 0..%d",
             last, early, early - 1);
}

static void test_join_2(void **state) {
  (void)state;
  join_world(2);
}

static void test_join_3(void **state) {
  (void)state;
  join_world(3);
}

static void test_join_4(void **state) {
  (void)state;
  join_world(4);
}

/* ---- 8. a name already in flight on a rank ------------------------------------ */

static void test_duplicate_name_3(void **state) {
  (void)state;
  char *args[] = {"duplicate", NULL};
  job w;
  run_world(&w, 3, NULL, args, "duplicate");
  static const char *const hows[] = {"allreduce", "allgather", "broadcast", "grouped allreduce"};
  for (int r = 0; r < 3; r++) {
    const char *mine = r == 0 ? "dup/b" : "dup/a";
    for (int i = 0; i < 5; i++) {
      const char *how = i < 4 ? hows[i] : "group naming it twice";
      const char *name = i < 4 ? mine : "dup/twice";
      char prefix[128], want[256], line[1024];
      snprintf(prefix, sizeof prefix, "duplicate: rank %d: %s: ", r, how);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
      snprintf(want, sizeof want, "%sGS_ERR_DUPLICATE_NAME: tensor '%s': rank %d ", prefix, name,
               r);
      if (strncmp(line, want, strlen(want)) != 0 || strstr(line, "in flight") == NULL)
        job_fail("rank %d, %s of a name in flight:\n  got:      %s\n  expected: %s... in "
                 "flight ...",
                 r, how, line, want);
    }
  }
}

/* ---- 9. hardening: ordinary mistakes never crash the coordinator ----------------- */

/* Regression (issue 8): two models that differ in the size of 12 layers
 * submitted together killed gradsyncd (SIGSEGV in emit_ready) and every
 * rank got GS_ERR_COORDINATOR_LOST. Now every rank gets GS_ERR_MISMATCH for
 * every layer, naming both shapes and the ranks, and the job goes on. */
static void test_models_differ_in_many_layers_3(void **state) {
  (void)state;
  char *args[] = {"model-diff", "12", NULL};
  job w;
  run_world(&w, 3, NULL, args, "model-diff");
  for (int i = 0; i < 12; i++) {
    char prefix[64], want[256];
    snprintf(prefix, sizeof prefix, "model-diff: layer%02d: ", i);
    snprintf(want, sizeof want,
             "%sGS_ERR_MISMATCH: tensor 'model/layer%02d/kernel': mismatched shapes: ranks [0] "
             "sent [4], ranks [1,2] sent [5]",
             prefix, i);
    for (int r = 0; r < 3; r++) {
      char line[4096];
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
      if (strncmp(line, want, strlen(want)) != 0)
        job_fail("rank %d, layer %d:\n  got:      %s\n  expected: %s...", r, i, line, want);
    }
  }
  job_expect_no_output(w.coord, "GS_ERR_COORDINATOR_LOST", 0);
}

/* Regression (issue 8): rank 0 calls gs_shutdown while the others have 10
 * ops pending; the plan the leave produced was cut to 8 responses and the
 * rest waited for the deadlock detector (off here: they would hang). Every
 * op fails with GS_ERR_SHUTDOWN naming rank 0. */
static void test_early_leave_fails_every_pending_op_3(void **state) {
  (void)state;
  char *coord_args[] = {"--deadlock-time-ms", "0", NULL};
  char *args[] = {"early-leave", "10", NULL};
  job w;
  run_world(&w, 3, coord_args, args, "early-leave");
  for (int r = 1; r < 3; r++)
    for (int i = 0; i < 10; i++) {
      char prefix[96], line[4096];
      snprintf(prefix, sizeof prefix, "early-leave: rank %d: op%02d: ", r, i);
      line_or_fail(w.ranks[r], prefix, line, sizeof line);
      if (!strstr(line, "GS_ERR_SHUTDOWN") || !strstr(line, "rank 0 ") ||
          !strstr(line, "has already left the job"))
        job_fail("rank %d, op %d: %s", r, i, line);
    }
}

/* --max-pending-per-rank: past the limit only the offender's op fails, with
 * an error naming the limit, the tensor and the rank; the ops within it
 * complete with the right values on every rank. */
static void test_max_pending_per_rank_2(void **state) {
  (void)state;
  char *coord_args[] = {"--max-pending-per-rank", "20", NULL};
  char *args[] = {"pending-limit", "20", NULL};
  job w;
  run_world(&w, 2, coord_args, args, "pending-limit");
  char line[4096];
  line_or_fail(w.ranks[0], "pending-limit: rank 0: pending/t020: ", line, sizeof line);
  const char *want = "pending-limit: rank 0: pending/t020: GS_ERR_INVALID_ARG: tensor "
                     "'pending/t020': rank 0 (";
  if (strncmp(line, want, strlen(want)) != 0 ||
      !strstr(line, ") already has 20 tensors pending at the coordinator, the limit (gradsyncd "
                    "--max-pending-per-rank 20)"))
    job_fail("rank 0 past the limit:\n  got: %s", line);
  job_expect_no_output(w.ranks[1], "GS_ERR_INVALID_ARG", 0);
}

/* Allgather sizes that overflow: each rank's part is valid, their sum is
 * not; every rank fails the op with the same error naming the tensor and
 * the rank with the largest part, and the job goes on. */
static void test_allgather_size_overflow_3(void **state) {
  (void)state;
  char *args[] = {"allgather-overflow", NULL};
  job w;
  run_world(&w, 3, NULL, args, "allgather-overflow");
  char want[512];
  snprintf(want, sizeof want,
           "allgather-overflow: GS_ERR_INVALID_ARG: tensor 'huge/gather': the allgather of every "
           "rank's rows overflows 64 bits of bytes (rank 0 (");
  for (int r = 0; r < 3; r++) {
    char line[4096];
    line_or_fail(w.ranks[r], "allgather-overflow: GS_", line, sizeof line);
    if (strncmp(line, want, strlen(want)) != 0 ||
        !strstr(line, "sent the largest first dimension, 1152921504606846975)"))
      job_fail("rank %d:\n  got:      %s\n  expected: %s...", r, line, want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_mismatch_every_attribute_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fusion_threshold_1mib, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fusion_off, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fusion_window_policy, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_resnet50_cache, setup_workload, job_teardown),
      cmocka_unit_test_setup_teardown(test_allgather_uneven_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_allgather_uneven_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_root2_and_barriers_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_grouped_allreduce, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_grouped_allreduce_low_threshold, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_join_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_join_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_join_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_name_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_models_differ_in_many_layers_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_early_leave_fails_every_pending_op_3, setup,
                                      job_teardown),
      cmocka_unit_test_setup_teardown(test_max_pending_per_rank_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_allgather_size_overflow_3, setup, job_teardown),
  };
  return cmocka_run_group_tests_name("negotiation", tests, NULL, NULL);
}
