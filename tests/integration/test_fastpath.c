/* The fast path (issue 14) end to end: a real gradsyncd and real worker
 * processes (gs-fast-worker) on 127.0.0.1. After the coordinator's marker
 * the ranks agree on their cached ops among themselves, over the data
 * plane; these tests check what a user relies on there:
 * - values stay right in fast mode at np 2, 3 and 4, with blocking waits,
 *   gs_wait(h, 50) in a loop and gs_test polling, and later steps run with
 *   no request to the coordinator at all (gs_get_stats);
 * - a tensor never seen before in the middle of a step, and a step that
 *   rank 1 submits in the reverse order, go back to the coordinator and
 *   complete with the right values; later steps are fast again;
 * - small float32 allreduces riding in the round's agreement: exact sums,
 *   averages, pre- and postscale beside ops that do not ride, an op queued
 *   on one rank only (it stays queued and completes right), shm and tcp,
 *   np 2 to 4, and after a rank was in gs_join while a riding tensor was
 *   first negotiated; nothing rides in deterministic mode;
 * - grouped allreduces (gs_grouped_allreduce_async) beside single ops, np 2
 *   and 3: values exact, every step fast after the first ones; a group
 *   that rank 1 orders otherwise fails on every rank with the same text as
 *   with --fast-path off;
 * - a response cache smaller than the step's tensors;
 * - a name submitted again while its op is in flight in fast mode (cached
 *   or not, alone or twice in a group), or registered local then: refused
 *   with the tensor and rank named, nothing left in flight;
 * - gs_barrier in fast mode still waits for every rank;
 * - gs_unregister_local in fast mode, gs_barrier, then the name submitted:
 *   a global op again (the barrier goes through the coordinator);
 * - a timeline started in fast mode brings the job back to the
 *   coordinator, which records the steps; fast again after it stops;
 * - a deadlock between cached tensors is still reported with the ranks
 *   and the tensor names; a rank that leaves, and a rank SIGKILLed, while
 *   the others wait in a fast round: their ops fail naming it, no hang; a
 *   rank that shuts down with its own op in a round: no hang either;
 * - gradsyncd --fast-path off: every step through the coordinator, as
 *   before the fast path;
 * - persistent allreduces (gs_allreduce_init, gs_startall), fast path on
 *   and off: values over steps, an escalation between two gs_startall
 *   calls, a cache too small for a step (evictions, escalations),
 *   restarts on a second thread the moment gs_wait returns, an op freed
 *   while active, and the refusals' texts (active, listed twice, all or
 *   none, not persistent, a name in flight, a local name, a failed job).
 * - the same with every rank bound to one cpu (GS_TEST_BIND_ONE_CPU, as
 *   under --bind-to core: the exec thread shares the cpu with the
 *   application, which then runs most rounds itself inside its waits; at
 *   np 3 and 4 on 2 cpus two ranks share one): values and riders at np 2
 *   and 4, blocking, timed and short waits, polling with gs_test only (ops still
 *   complete through the exec thread), four waiting threads, barriers, a
 *   wait that times out while its round waits for a late rank (the round
 *   is parked and finished by the exec thread), a deadlock, a rank that
 *   leaves, one SIGKILLed and one that shuts down while the others' own
 *   threads are in the round's agreement (also after its own timed wait
 *   parked the round it ran: the op fails with gs_shutdown's text; and
 *   while the others wait in 50 ms slices, their rounds parked); riders, persistent ops, groups,
 *   a new tensor and a reordered step (escalations from a round that an
 *   application thread runs), unregister + barrier, a timeline, a small
 *   cache, names submitted twice;
 * - two threads of a rank waiting on two ops of a step, the second
 *   submitted while the first one's round waits in the agreement: it
 *   completes in a later round (bound and not);
 * - a child forked right after rank 0 submitted a step (its ops queued for
 *   a round no thread has started): the child's gs_wait fails with
 *   GS_ERR_FORKED instead of running the round on the parent's segment;
 *   the parent goes on (bound and not);
 * - gs_wait(h, 1) on a 128 MiB allreduce whose peer already waits must
 *   still time out (the round's collective is not the wait's to run past
 *   its timeout), bound and not.
 * No timing assertion: every wait is bounded by the hang guard only (but
 * for the 128 MiB op, which no machine reduces within 1 ms). */
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

static const char worker_path[] = GS_BIN_DIR "/gs-fast-worker";
static char g_host[64];

/* Extra environment for every rank that start_world starts: NULL, or
 * BIND_ENV for the tests registered with setup_bound. */
#define BIND_ENV "GS_TEST_BIND_ONE_CPU=1"
static const char *g_env;

static int setup(void **state) {
  (void)state;
  g_env = NULL;
  return proc_test_begin("fastpath", GUARD_MS);
}

/* The same test with every rank bound to one cpu (gs-fast-worker). */
static int setup_bound(void **state) {
  (void)state;
  g_env = BIND_ENV;
  return proc_test_begin("fastpath", GUARD_MS);
}

static proc *start_rank(job *w, int rank, char *const args[], const char *extra_env) {
  char dir[600];
  snprintf(dir, sizeof dir, "GS_TEST_DIR=%s", proc_test_dir());
  char *env[] = {dir, (char *)extra_env, NULL};
  return job_start_rank(w, rank, worker_path, args, env);
}

/* extra_env: one more "NAME=value" for every rank, or NULL. */
static void start_world_env(job *w, int size, char *const coord_args[], char *const args[],
                            const char *extra_env) {
  job_start_coordinator(w, size, coord_args);
  for (int r = 0; r < size; r++) w->ranks[r] = start_rank(w, r, args, extra_env);
}

static void start_world(job *w, int size, char *const coord_args[], char *const args[]) {
  start_world_env(w, size, coord_args, args, g_env);
}

/* Every rank exits 0 after "fast: passed (rank R of SIZE". */
static void expect_passed(job *w) {
  for (int r = 0; r < w->size; r++) job_expect_exit(w->ranks[r], 0);
  for (int r = 0; r < w->size; r++) {
    char want[128];
    snprintf(want, sizeof want, "fast: passed (rank %d of %d", r, w->size);
    job_expect_output(w->ranks[r], want);
  }
}

/* The stats line of rank r's step s. */
typedef struct step_stats {
  unsigned long long tensors, requests, fast_tensors, fast_rounds, escalations, rides;
} step_stats;

static step_stats stats_of(const proc *p, int r, int s) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "fast: rank %d step %d: ", r, s);
  char *out = proc_output(p);
  char *at = strstr(out, prefix);
  step_stats st;
  memset(&st, 0, sizeof st);
  if (!at || sscanf(at + strlen(prefix),
                    "tensors=%llu requests=%llu fast_tensors=%llu fast_rounds=%llu "
                    "escalations=%llu rides=%llu",
                    &st.tensors, &st.requests, &st.fast_tensors, &st.fast_rounds, &st.escalations,
                    &st.rides) != 6) {
    free(out);
    job_fail("%s: no stats line \"%s...\"", p->label, prefix);
  }
  free(out);
  return st;
}

#define STEP_OPS 14 /* gs-fast-worker: 12 float32 averages, an int32 sum, a broadcast */

/* Step s of every rank ran entirely in fast rounds: every op completed by
 * a fast round, no request sent, and (unless it is the last step, during
 * which the first ranks to finish may already have left, which ends fast
 * mode on the others) no escalation. */
static void expect_fast_step_ex(const job *w, int s, unsigned long long ops, int last) {
  for (int r = 0; r < w->size; r++) {
    step_stats st = stats_of(w->ranks[r], r, s);
    if (st.tensors != ops || st.fast_tensors != ops || st.requests != 0 ||
        (!last && st.escalations != 0) || st.fast_rounds == 0)
      job_fail("rank %d step %d: %llu tensors, %llu by fast rounds (%llu rounds), %llu requests, "
               "%llu escalations; expected all %llu in fast rounds, no request, no escalation",
               r, s, st.tensors, st.fast_tensors, st.fast_rounds, st.requests, st.escalations, ops);
  }
}

static void expect_fast_step(const job *w, int s, unsigned long long ops) {
  expect_fast_step_ex(w, s, ops, 0);
}

/* ---- values in fast mode ----------------------------------------------------- */

static void steps_world(int size, const char *wait) {
  char *args[] = {"steps", "6", (char *)wait, NULL};
  job w;
  start_world(&w, size, NULL, args);
  expect_passed(&w);
  /* Step 1 teaches the coordinator's cache; from step 3 on (step 2 may
   * still start before the marker) every step runs in fast rounds. */
  for (int s = 3; s <= 6; s++) expect_fast_step_ex(&w, s, STEP_OPS, s == 6);
  job_stop_coordinator(&w);
}

static void test_values_np2(void **state) {
  (void)state;
  steps_world(2, "block");
}

static void test_values_np3(void **state) {
  (void)state;
  steps_world(3, "block");
}

static void test_values_np4(void **state) {
  (void)state;
  steps_world(4, "block");
}

/* Wait loops as Python bindings and completion threads use them. */
static void test_timed_waits_np2(void **state) {
  (void)state;
  steps_world(2, "timed");
}

/* The number rank r printed right after prefix ("fast: rank 0 timeouts="),
 * or -1 when it printed no such line. */
static int output_count(job *w, int r, const char *prefix) {
  char *out = proc_output(w->ranks[r]);
  char *line = strstr(out, prefix);
  int n = -1;
  if (line && sscanf(line + strlen(prefix), "%d", &n) != 1) n = -1;
  free(out);
  return n;
}

/* gs_wait(h, 1) in a loop while the rounds wait for the last rank (it
 * submits each step 10 ms late, while the others' exec threads yield-spin
 * after their rounds, executor.c): each wait must time out no earlier than
 * its 1 ms, with the usual text (the worker checks), and the steps complete
 * with the right values in fast rounds. */
static void test_short_timed_waits_np3(void **state) {
  (void)state;
  char *args[] = {"steps", "6", "short", NULL};
  job w;
  start_world(&w, 3, NULL, args);
  expect_passed(&w);
  for (int s = 3; s <= 6; s++) expect_fast_step_ex(&w, s, STEP_OPS, s == 6);
  int timeouts = output_count(&w, 0, "fast: rank 0 short timeouts=");
  if (timeouts < 6)
    job_fail("rank 0: %d timed-out gs_wait(h, 1) over 6 steps; expected at least 6 (the last "
             "rank submits each step 10 ms late)",
             timeouts);
  job_stop_coordinator(&w);
}

static void test_polling_np3(void **state) {
  (void)state;
  steps_world(3, "poll");
}

/* Each rank bound to one cpu (its library threads with it: the exec
 * thread is SCHED_BATCH there, and no wait runs a round) and looking at
 * its ops with gs_test in a loop that never sleeps: the ops still
 * complete, in fast rounds, with the right values. */
static void test_busy_bound_np2(void **state) {
  (void)state;
  steps_world(2, "busy");
}

/* Four application threads per rank submit and wait on their own tensors
 * concurrently, in no order between threads (so rounds may differ per
 * rank and escalate): every value is right, on every rank (handles are
 * made and freed on several threads at once; their memory is recycled per
 * thread, worker/handle_cache.c). */
static void test_threads_np2(void **state) {
  (void)state;
  char *args[] = {"threads", "40", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "fast: rank %d threads: tensors=960 ", r); /* 4 x 6 x 40 */
    job_expect_output(w.ranks[r], want);
  }
  job_stop_coordinator(&w);
}

/* gradsyncd --fast-path off: no marker, so every op of every step is a
 * request to the coordinator (cached ids from step 2), none a fast round. */
static void test_fast_path_off(void **state) {
  (void)state;
  char *coord_args[] = {"--fast-path", "off", NULL};
  char *args[] = {"steps", "4", "block", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  for (int r = 0; r < 2; r++)
    for (int s = 1; s <= 4; s++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.tensors != STEP_OPS || st.requests != STEP_OPS || st.fast_tensors || st.fast_rounds ||
          st.escalations)
        job_fail("--fast-path off: rank %d step %d: %llu tensors, %llu requests, %llu fast "
                 "tensors, %llu fast rounds, %llu escalations; expected %d requests, nothing fast",
                 r, s, st.tensors, st.requests, st.fast_tensors, st.fast_rounds, st.escalations,
                 STEP_OPS);
    }
  job_stop_coordinator(&w);
}

/* ---- small allreduces riding in the agreement ----------------------------------- */

#define RIDE_OPS 7    /* gs-fast-worker ride: 7 ops per step */
#define RIDE_RIDERS 5 /* of them, float32 sum/average up to 1 KiB: all but ride/big, ride/i32 */

/* gs-fast-worker ride 6 4 on size ranks (extra_env for each): the worker
 * checks every value exactly (sum, average, prescale and postscale, an op
 * that rides beside ones that do not, 'ride/late' queued on rank 0 alone
 * in step 4 until the others submit it: it stays queued and completes
 * right). From step 3 on every op completes in fast rounds with no request
 * and no escalation, and `rides` of them by the agreement itself. */
static void ride_world(int size, const char *extra_env, unsigned long long rides) {
  char *args[] = {"ride", "6", "4", NULL};
  job w;
  start_world_env(&w, size, NULL, args, extra_env);
  expect_passed(&w);
  for (int s = 3; s <= 6; s++)
    for (int r = 0; r < size; r++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.tensors != RIDE_OPS || st.fast_tensors != RIDE_OPS || st.requests != 0 ||
          (s < 6 && st.escalations != 0) || st.rides != rides)
        job_fail("%s np %d rank %d step %d: %llu tensors, %llu by fast rounds, %llu of them "
                 "riding in the agreement, %llu requests, %llu escalations; expected %d, all "
                 "fast, %llu riding, no request, no escalation",
                 extra_env ? extra_env : "default backend", size, r, s, st.tensors, st.fast_tensors,
                 st.rides, st.requests, st.escalations, RIDE_OPS, rides);
    }
  job_stop_coordinator(&w);
}

static void test_ride_np2(void **state) { /* shm (one host) */
  (void)state;
  ride_world(2, NULL, RIDE_RIDERS);
}

static void test_ride_np4(void **state) {
  (void)state;
  ride_world(4, NULL, RIDE_RIDERS);
}

static void test_ride_tcp_np3(void **state) {
  (void)state;
  ride_world(3, "GRADSYNC_BACKEND=tcp", RIDE_RIDERS);
}

static void test_ride_tcp_np2(void **state) {
  (void)state;
  ride_world(2, "GRADSYNC_BACKEND=tcp", RIDE_RIDERS);
}

/* Rank 1 was in gs_join when 'ride/j' was negotiated: its own cache copy
 * lacks the entry, but the id is live on every rank, and the riding
 * layout (from the plans' responses, not the cache copy) is the same on
 * every rank: the ride steps are fast with the right values. */
static void test_ride_after_join_np3(void **state) {
  (void)state;
  char *args[] = {"join", "5", NULL};
  job w;
  start_world(&w, 3, NULL, args);
  expect_passed(&w);
  for (int r = 0; r < 3; r++) job_expect_output(w.ranks[r], "joined (last ");
  for (int s = 3; s <= 5; s++)
    for (int r = 0; r < 3; r++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.tensors != RIDE_OPS || st.fast_tensors != RIDE_OPS || st.requests != 0 ||
          (s < 5 && st.escalations != 0) || st.rides != RIDE_RIDERS)
        job_fail("after gs_join: rank %d step %d: %llu tensors, %llu by fast rounds, %llu riding, "
                 "%llu requests, %llu escalations; expected %d, all fast, %d riding, no request",
                 r, s, st.tensors, st.fast_tensors, st.rides, st.requests, st.escalations, RIDE_OPS,
                 RIDE_RIDERS);
    }
  job_stop_coordinator(&w);
}

/* Deterministic mode: nothing rides (every CPU allreduce reduces in rank
 * order there, which the agreement does not promise); values exact. */
static void test_ride_deterministic_np3(void **state) {
  (void)state;
  ride_world(3, "GRADSYNC_DETERMINISTIC=1", 0);
}

/* ---- grouped allreduces ------------------------------------------------------- */

#define GROUP_RIDERS 10 /* gs-fast-worker group: t00..t06, t09..t11 (float32, <= 1 KiB) */

/* gs-fast-worker group 8 0: two groups (6 and 3 members) among single ops
 * every step. Values exact (the worker checks); from step 3 on every op,
 * grouped or not, completes in fast rounds, with no request and no
 * escalation, the small ones riding: the first group whole, one member of
 * the second (its other two run in the round's plan). */
static void group_world(int size) {
  char *args[] = {"group", "8", "0", NULL};
  job w;
  start_world(&w, size, NULL, args);
  expect_passed(&w);
  for (int s = 3; s <= 8; s++) {
    expect_fast_step_ex(&w, s, STEP_OPS, s == 8);
    for (int r = 0; r < size; r++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.rides != GROUP_RIDERS)
        job_fail("grouped np %d rank %d step %d: %llu ops rode in the agreement, expected %d", size,
                 r, s, st.rides, GROUP_RIDERS);
    }
  }
  job_stop_coordinator(&w);
}

static void test_group_values_np2(void **state) {
  (void)state;
  group_world(2);
}

static void test_group_values_np3(void **state) {
  (void)state;
  group_world(3);
}

/* The rest of the line of p's output that follows prefix (malloc'd). */
static char *line_after(const proc *p, const char *prefix) {
  char *out = proc_output(p);
  char *at = strstr(out, prefix);
  if (!at) {
    free(out);
    job_fail("%s: no line \"%s...\"", p->label, prefix);
  }
  at += strlen(prefix);
  size_t n = strcspn(at, "\n");
  char *line = malloc(n + 1);
  if (!line) job_fail("out of memory");
  memcpy(line, at, n);
  line[n] = '\0';
  free(out);
  return line;
}

/* ---- persistent allreduces (gs_allreduce_init, gs_startall) ------------------- */

/* Rank 1's refusals and both ranks' refused local name, word for word. */
static void expect_persist_refusals(const job *w) {
  char want[1024];
  for (int r = 0; r < 2; r++) {
    snprintf(want, sizeof want,
             "persist: rank %d local: GS_ERR_UNSUPPORTED: tensor 'persist/local': rank %d (host "
             "%s) registered this name local (gs_register_local); a persistent op cannot be "
             "local: use gs_allreduce_async for it\n",
             r, r, g_host);
    job_expect_output(w->ranks[r], want);
  }
  const char *active = "GS_ERR_DUPLICATE_NAME: tensor 'persist/solo': rank 1 (host %s) started "
                       "this persistent op while it is still active; wait for it (gs_wait, "
                       "gs_test) before starting it again\n";
  char text[512];
  snprintf(text, sizeof text, active, g_host);
  snprintf(want, sizeof want, "persist: rank 1 active: %s", text);
  job_expect_output(w->ranks[1], want);
  snprintf(want, sizeof want, "persist: rank 1 allornone: %s", text);
  job_expect_output(w->ranks[1], want);
  snprintf(want, sizeof want,
           "persist: rank 1 twice: GS_ERR_DUPLICATE_NAME: tensor 'ride/sum': gs_startall lists "
           "this persistent op twice (rank 1, host %s); list each op once\n",
           g_host);
  job_expect_output(w->ranks[1], want);
  job_expect_output(w->ranks[1],
                    "persist: rank 1 notpersistent: GS_ERR_INVALID_ARG: gs_startall: hs[1] "
                    "(tensor 'persist/dup') is not a persistent op of this context (rank 1); make "
                    "it with gs_allreduce_init on this context; none started\n");
  job_expect_output(w->ranks[1],
                    "persist: rank 1 dup: GS_ERR_DUPLICATE_NAME: tensor 'persist/dup': rank 1 "
                    "already has an op of this name in flight; wait for it to complete (gs_wait) "
                    "before submitting the name again, or use another name\n");
}

#define PERSIST_OPS 6    /* gs-fast-worker persist: the ride ops but ride/late */
#define PERSIST_RIDERS 4 /* all but ride/big and ride/i32 */

/* gs-fast-worker persist 8 1 at np 2: persistent ops started with
 * gs_startall every step and waited on with gs_wait, or with gs_wait_any
 * every other step; the worker checks every value (sum, average,
 * pre- and postscale, riders and not, a 1600 B tensor), also while a
 * second thread restarts its own op the moment gs_wait returns, and an op
 * freed while active. Steps 3, 4 and 7 run in fast rounds (4 ops riding
 * in the agreement); step 5 has a tensor never seen before between the
 * two gs_startall calls: it escalates and completes right. The refusals
 * have their texts, none starts anything; after the deadlock a start gets
 * the job's error, the same as gs_allreduce_async's. */
static void test_persistent_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--deadlock-time-ms", "1500", NULL};
  char *args[] = {"persist", "8", "1", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  int fast_steps[] = {3, 4, 7};
  for (size_t i = 0; i < 3; i++)
    for (int r = 0; r < 2; r++) {
      int s = fast_steps[i];
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.tensors != PERSIST_OPS || st.fast_tensors != PERSIST_OPS || st.requests != 0 ||
          st.escalations != 0 || st.rides != PERSIST_RIDERS)
        job_fail("persistent ops: rank %d step %d: %llu tensors, %llu by fast rounds, %llu "
                 "riding, %llu requests, %llu escalations; expected %d, all fast, %d riding, no "
                 "request, no escalation",
                 r, s, st.tensors, st.fast_tensors, st.rides, st.requests, st.escalations,
                 PERSIST_OPS, PERSIST_RIDERS);
    }
  for (int r = 0; r < 2; r++) {
    step_stats st = stats_of(w.ranks[r], r, 5);
    if (st.tensors != PERSIST_OPS + 1 || st.escalations < 1 || st.requests < 1)
      job_fail("persistent ops: rank %d step 5 (a new tensor): %llu tensors, %llu escalations, "
               "%llu requests; expected %d tensors and an escalation with requests",
               r, st.tensors, st.escalations, st.requests, PERSIST_OPS + 1);
  }
  expect_persist_refusals(&w);
  for (int r = 0; r < 2; r++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "persist: rank %d failed job start: ", r);
    char *start = line_after(w.ranks[r], prefix);
    snprintf(prefix, sizeof prefix, "persist: rank %d failed job async: ", r);
    char *async = line_after(w.ranks[r], prefix);
    const char *want = "GS_ERR_DEADLOCK: the coordinator aborted the job: deadlock: ";
    int ok = !strncmp(start, want, strlen(want)) && !strcmp(start, async);
    if (!ok)
      job_fail("rank %d: a start on the failed job said \"%s\", gs_allreduce_async \"%s\"; "
               "expected the same, beginning \"%s\"",
               r, start, async, want);
    free(start);
    free(async);
  }
  job_expect_coordinator_failed(&w);
}

/* The same with gradsyncd --fast-path off: every start is a request to
 * the coordinator, the values and the refusals are the same. */
static void test_persistent_fast_path_off_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--fast-path", "off", NULL};
  char *args[] = {"persist", "6", "0", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  for (int r = 0; r < 2; r++)
    for (int s = 1; s <= 6; s++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      unsigned long long want = PERSIST_OPS + (s == 4);
      if (st.tensors != want || st.requests != want || st.fast_tensors || st.fast_rounds)
        job_fail("--fast-path off: rank %d step %d: %llu tensors, %llu requests, %llu fast "
                 "tensors, %llu fast rounds; expected %llu requests, nothing fast",
                 r, s, st.tensors, st.requests, st.fast_tensors, st.fast_rounds, want);
    }
  expect_persist_refusals(&w);
  job_stop_coordinator(&w);
}

/* gradsyncd --cache-capacity 4, smaller than a step's 6 persistent ops:
 * entries are evicted every step, fast rounds keep escalating back to the
 * coordinator mid-step; every value is still right (the worker checks),
 * and the refusals are the same. */
static void test_persistent_small_cache_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--cache-capacity", "4", NULL};
  char *args[] = {"persist", "6", "0", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  for (int r = 0; r < 2; r++) {
    unsigned long long esc = 0;
    for (int s = 2; s <= 6; s++) esc += stats_of(w.ranks[r], r, s).escalations;
    if (esc == 0)
      job_fail("--cache-capacity 4: rank %d: no escalation in steps 2-6; expected evictions to "
               "send fast rounds back to the coordinator",
               r);
  }
  expect_persist_refusals(&w);
  job_stop_coordinator(&w);
}

/* In step 4 rank 1 groups fast/t00..t05 in the reverse order (another
 * group): with the fast path on, the ranks go back to the coordinator,
 * which fails the group on every rank with the same text as with
 * --fast-path off; the rest of that step completes right (the worker
 * checks), and the job is fast again afterwards. */
static void test_group_order_differs_np2(void **state) {
  (void)state;
  char *args[] = {"group", "8", "4", NULL};
  char *off[] = {"--fast-path", "off", NULL};
  char *texts[2][2];
  for (int pass = 0; pass < 2; pass++) {
    job w;
    start_world(&w, 2, pass ? off : NULL, args);
    expect_passed(&w);
    for (int r = 0; r < 2; r++) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "fast: rank %d step 4 group failed: ", r);
      texts[pass][r] = line_after(w.ranks[r], prefix);
    }
    if (!pass) {
      for (int r = 0; r < 2; r++) {
        step_stats st = stats_of(w.ranks[r], r, 4);
        if (st.escalations < 1 || st.requests < 1)
          job_fail("rank %d step 4 (a group ordered otherwise on rank 1): %llu escalations, %llu "
                   "requests; expected the step to go back to the coordinator",
                   r, st.escalations, st.requests);
      }
      expect_fast_step(&w, 7, STEP_OPS);
      expect_fast_step_ex(&w, 8, STEP_OPS, 1);
    }
    job_stop_coordinator(&w);
  }
  for (int r = 0; r < 2; r++) {
    if (strcmp(texts[0][r], texts[1][r]) != 0)
      job_fail("rank %d: a group ordered otherwise failed with\n  \"%s\" (fast path on), but\n  "
               "\"%s\" with --fast-path off",
               r, texts[0][r], texts[1][r]);
    /* Each rank's group by its tensors, in its call order (rank 1's is
     * reversed), not by the groups' ids. */
    const char *want =
        "GS_ERR_MISMATCH: tensor 'fast/t00': mismatched groups: ranks [0] sent it in a group of 6 "
        "tensors: fast/t00, fast/t01, fast/t02, fast/t03 and 2 more; ranks [1] sent it in a group "
        "of 6 tensors: fast/t05, fast/t04, fast/t03, fast/t02 and 2 more; every rank must submit "
        "the same tensors in the same order in one gs_grouped_allreduce_async call "
        "(grouped_allreduce in Python), or all submit it alone";
    if (strcmp(texts[0][r], want) != 0)
      job_fail("rank %d: a group ordered otherwise failed with\n  \"%s\", expected\n  \"%s\"", r,
               texts[0][r], want);
    printf("rank %d: %s\n", r, texts[0][r]);
  }
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < 2; r++) free(texts[pass][r]);
}

/* A cached name submitted again with another count, dtype, reduce op,
 * shape or postscale (a float32 average of 5, an int32 sum of 9, a
 * float64 max of [3, 2] scaled by 2, in turn, over 9 steps): each time the
 * new op's exact values (the worker checks every element), the other
 * ops' too. Handles' blocks are recycled between these ops and the
 * step's others (a block keeps what the last op wrote past its request's
 * name and shape). */
static void test_cached_name_resubmitted_otherwise_np2(void **state) {
  (void)state;
  char *args[] = {"vary", "9", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  job_stop_coordinator(&w);
}

/* A name submitted again while its op is in flight, once the fast path
 * runs: a cached name (listed in its cache entry, not in the table of
 * uncached ops; twice, the second time found by the name prediction), a group naming one twice,
 * gs_register_local of it, and a name never seen (in that table) twice: each refused with its text
 * naming the tensor and the rank, nothing of a refused group left in
 * flight (its members are then submitted as usual), every value right;
 * the steps after it run entirely in fast rounds again. */
static void test_duplicate_names_in_fast_mode_np2(void **state) {
  (void)state;
  char *args[] = {"dup", "4", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  expect_fast_step(&w, 4, STEP_OPS);
  expect_fast_step_ex(&w, 7, STEP_OPS, 1);
  for (int r = 0; r < 2; r++) {
    char want[5][256];
    snprintf(want[0], sizeof want[0],
             "fast: rank %d dup again: GS_ERR_DUPLICATE_NAME: tensor 'fast/t0%d': rank %d already "
             "has an op of this name in flight; wait for it to complete (gs_wait)",
             r, r, r);
    snprintf(want[4], sizeof want[4],
             "fast: rank %d dup again2: GS_ERR_DUPLICATE_NAME: tensor 'fast/t0%d': rank %d already "
             "has an op of this name in flight; wait for it to complete (gs_wait)",
             r, r, r);
    snprintf(want[1], sizeof want[1],
             "fast: rank %d dup group: GS_ERR_DUPLICATE_NAME: tensor 'fast/t02': rank %d already "
             "has an op of this name in flight",
             r, r);
    snprintf(want[2], sizeof want[2],
             "fast: rank %d dup register: GS_ERR_INVALID_ARG: gs_register_local: tensor "
             "'fast/t0%d' has an op in flight on rank %d; register it before submitting it",
             r, r, r);
    snprintf(want[3], sizeof want[3],
             "fast: rank 0 dup new: GS_ERR_DUPLICATE_NAME: tensor 'fast/dupnew': rank 0 already "
             "has an op of this name in flight");
    for (int i = 0; i < 5; i++)
      if (r == 0 || i != 3) job_expect_output(w.ranks[r], want[i]);
  }
  job_stop_coordinator(&w);
}

/* ---- back to the coordinator and fast again ----------------------------------- */

/* Step 4 carries a tensor never negotiated: it cannot be agreed on among
 * the ranks, so that step escalates (its requests reach the coordinator)
 * and completes right; step 6 is fast again. */
static void test_new_tensor_mid_step_np3(void **state) {
  (void)state;
  char *args[] = {"newtensor", "7", "4", NULL};
  job w;
  start_world(&w, 3, NULL, args);
  expect_passed(&w);
  for (int r = 0; r < 3; r++) {
    step_stats st = stats_of(w.ranks[r], r, 4);
    if (st.tensors != STEP_OPS + 1 || st.escalations < 1 || st.requests < 1)
      job_fail("rank %d step 4 (a new tensor): %llu tensors, %llu escalations, %llu requests; "
               "expected %d tensors and an escalation with requests",
               r, st.tensors, st.escalations, st.requests, STEP_OPS + 1);
  }
  expect_fast_step(&w, 6, STEP_OPS);
  expect_fast_step_ex(&w, 7, STEP_OPS, 1);
  job_stop_coordinator(&w);
}

/* Steps 1-10 each begin with an allgather, which a fast round cannot run:
 * each time the marker reaches the ranks, their next round escalates, and
 * gradsyncd --fast-path-backoff 64 backs off (holds the marker back for
 * more and more plans).
 * Every value is right (the worker checks the allgather and every op), and
 * once the job is steady the marker comes back: steps 39 and 40 run in fast
 * rounds. gradsyncctl status shows the backoff's state meanwhile. */
static void test_steps_that_always_escalate_back_off_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--fast-path-backoff", "64", NULL};
  char *args[] = {"gather", "40", "10", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  /* While the steady steps run: what gradsyncctl status says. */
  if (proc_wait_for_output(w.ranks[0], "fast: rank 0 step 12:", GUARD_MS) != 0)
    job_fail("rank 0 never reached step 12");
  const char *ctl = GS_BIN_DIR "/gradsyncctl";
  char *argv[] = {(char *)ctl, "--addr", w.addr, "status", NULL};
  proc *p = proc_spawn("gradsyncctl status", argv, NULL);
  if (!p) job_fail("could not start gradsyncctl");
  job_expect_exit(p, 0);
  char *out = proc_output(p);
  printf("%s", out);
  if (!strstr(out, "fast path:") || (strstr(out, "backed off") && !strstr(out, "'fast/gather'")))
    job_fail("gradsyncctl status does not show the fast path's backoff naming 'fast/gather':\n%s",
             out);
  free(out);
  expect_passed(&w);
  unsigned long long esc = 0;
  for (int s = 2; s <= 10; s++) esc += stats_of(w.ranks[0], 0, s).escalations;
  printf("escalations of rank 0 in steps 2-10 (one allgather each): %llu\n", esc);
  expect_fast_step(&w, 39, STEP_OPS);
  expect_fast_step_ex(&w, 40, STEP_OPS, 1);
  job_stop_coordinator(&w);
}

/* Rank 1 submits step 4 in the reverse order: whatever the rounds agree on,
 * every value is right (the worker checks) and step 6 is fast again. */
static void test_reordered_submissions_np2(void **state) {
  (void)state;
  char *args[] = {"reorder", "7", "4", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  expect_fast_step(&w, 6, STEP_OPS);
  expect_fast_step_ex(&w, 7, STEP_OPS, 1);
  job_stop_coordinator(&w);
}

/* A response cache of 4 entries for 14 ops per step: most ops are never
 * cached when the step comes, so steps keep going back to the
 * coordinator; every value is right and nothing hangs. */
static void test_cache_smaller_than_step_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--cache-capacity", "4", NULL};
  char *args[] = {"steps", "6", "block", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  for (int r = 0; r < 2; r++)
    for (int s = 2; s <= 6; s++) {
      step_stats st = stats_of(w.ranks[r], r, s);
      if (st.tensors != STEP_OPS || st.requests == 0)
        job_fail("rank %d step %d with a 4-entry cache: %llu tensors, %llu requests; expected %d "
                 "tensors, some through the coordinator",
                 r, s, st.tensors, st.requests, STEP_OPS);
    }
  job_stop_coordinator(&w);
}

/* gs_barrier in fast mode: each rank returns only once every rank's mark
 * of the step exists (the worker checks), without a request to the
 * coordinator once the job runs in fast mode. */
static void test_barrier_np3(void **state) {
  (void)state;
  char *args[] = {"barrier", "5", NULL};
  job w;
  start_world(&w, 3, NULL, args);
  expect_passed(&w);
  for (int r = 0; r < 3; r++)
    for (int s = 3; s <= 5; s++) {
      char want[96];
      snprintf(want, sizeof want, "fast: rank %d barrier %d: requests=0\n", r, s);
      job_expect_output(w.ranks[r], want);
    }
  job_stop_coordinator(&w);
}

/* gs_unregister_local in fast mode, then gs_barrier, then every rank
 * submits the name: the barrier goes through the coordinator (one request,
 * one escalation on every rank), so every rank's unregistration has reached
 * it before anybody's request; the op is a global sum again. The ranks
 * unregister 100 ms apart (a rank clear in its round while its
 * unregistration was still on its way let the barrier pass in a fast round,
 * and the coordinator refused the next request as registered local on it:
 * test_models' towers, about 1 run in 7). */
static void test_unregister_then_barrier_np3(void **state) {
  (void)state;
  char *args[] = {"unregister", "4", NULL};
  job w;
  start_world(&w, 3, NULL, args);
  expect_passed(&w);
  for (int r = 0; r < 3; r++) {
    char want[96];
    snprintf(want, sizeof want, "fast: rank %d unregister barrier: requests=1 escalations=1\n", r);
    job_expect_output(w.ranks[r], want);
  }
  /* fast mode before it (what the test is about) and again after */
  expect_fast_step(&w, 4, STEP_OPS);
  expect_fast_step_ex(&w, 5, STEP_OPS, 1);
  job_stop_coordinator(&w);
}

/* An operator starts a timeline while the job runs in fast mode: the
 * coordinator's FastStop brings every rank back (the timeline must see
 * every request), the steps it records name the tensors, and once it
 * stops the job goes fast again. */
static void test_timeline_in_fast_mode_np2(void **state) {
  (void)state;
  char *args[] = {"steps", "60", "paced", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  if (proc_wait_for_output(w.ranks[0], "fast: rank 0 step 5:", GUARD_MS) != 0)
    job_fail("rank 0 never reached step 5");
  char path[600];
  snprintf(path, sizeof path, "%s/timeline.json", proc_test_dir());
  const char *ctl = GS_BIN_DIR "/gradsyncctl";
  char *start[] = {(char *)ctl, "--addr", w.addr, "timeline", "start", path, NULL};
  proc *p = proc_spawn("gradsyncctl start", start, NULL);
  if (!p) job_fail("could not start gradsyncctl");
  job_expect_exit(p, 0);
  if (proc_wait_for_output(w.ranks[0], "fast: rank 0 step 30:", GUARD_MS) != 0)
    job_fail("rank 0 never reached step 30");
  char *stop[] = {(char *)ctl, "--addr", w.addr, "timeline", "stop", NULL};
  p = proc_spawn("gradsyncctl stop", stop, NULL);
  if (!p) job_fail("could not start gradsyncctl");
  job_expect_exit(p, 0);
  expect_passed(&w);
  /* While it recorded, the steps went through the coordinator ... */
  int seen = 0;
  for (int s = 20; s <= 30; s++) {
    step_stats st = stats_of(w.ranks[0], 0, s);
    if (st.requests == STEP_OPS && st.fast_tensors == 0) seen++;
  }
  if (!seen) job_fail("no step from 20 to 30 went through the coordinator while a timeline ran");
  /* ... and it holds their negotiations. */
  FILE *f = fopen(path, "r");
  if (!f) job_fail("the timeline %s was not written", path);
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  if (!strstr(buf, "fast/t05") || !strstr(buf, "fast/bcast"))
    job_fail("the timeline does not name fast/t05 and fast/bcast");
  /* After the stop the job runs in fast rounds again. */
  expect_fast_step_ex(&w, 60, STEP_OPS, 1);
  job_stop_coordinator(&w);
}

/* ---- failures -------------------------------------------------------------------- */

/* After 3 fast steps rank 0 waits on fast/t00 and rank 1 on fast/t01, both
 * cached: the rounds have nothing in common and escalate, and the
 * coordinator's deadlock report names both ranks and both tensors. */
static void test_deadlock_reported_np2(void **state) {
  (void)state;
  char *coord_args[] = {"--deadlock-time-ms", "1500", NULL};
  char *args[] = {"deadlock", "4", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  expect_fast_step(&w, 3, STEP_OPS);
  char waits[2][256];
  snprintf(waits[0], sizeof waits[0], "rank 0 (%s:%d) waits on [fast/t00] (missing from rank 1)",
           g_host, (int)w.ranks[0]->pid);
  snprintf(waits[1], sizeof waits[1], "rank 1 (%s:%d) waits on [fast/t01] (missing from rank 0)",
           g_host, (int)w.ranks[1]->pid);
  for (int r = 0; r < 2; r++) {
    char want[128];
    snprintf(want, sizeof want, "fast: rank %d: 'fast/t0%d': GS_ERR_DEADLOCK: ", r, r);
    job_expect_output(w.ranks[r], want);
    for (int k = 0; k < 2; k++) job_expect_output(w.ranks[r], waits[k]);
  }
  job_expect_output(w.coord, "aborting the job: deadlock: ");
  job_expect_coordinator_failed(&w);
}

/* The last of 3 ranks calls gs_shutdown while the others wait in a fast
 * round on fast/t00: the coordinator ends the round (FastStop), the op
 * goes to it and fails with its "has already left" text naming rank 2. */
static void leave_world(char *const args[]) {
  char *coord_args[] = {"--deadlock-time-ms", "0", NULL};
  job w;
  start_world(&w, 3, coord_args, args);
  expect_passed(&w);
  expect_fast_step_ex(&w, 3, STEP_OPS, 1); /* rank 2 leaves right after it */
  for (int r = 0; r < 2; r++) {
    char *out = proc_output(w.ranks[r]);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "fast: rank %d: 'fast/t00': ", r);
    char *line = strstr(out, prefix);
    int ok = line && strstr(line, "rank 2 ") && strstr(line, "left");
    free(out);
    if (!ok) job_fail("rank %d: fast/t00 did not fail naming rank 2 as gone", r);
  }
  job_stop_coordinator(&w);
}

static void test_rank_leaves_during_round_np3(void **state) {
  (void)state;
  char *args[] = {"leave", "4", NULL};
  leave_world(args);
}

/* The same while the others wait in gs_wait(h, 50) slices (as Python's
 * synchronize()): bound to one cpu, the first slice runs the round and
 * parks it for the exec thread; the coordinator's FastStop must still end
 * it and the op fail naming rank 2. */
static void test_rank_leaves_during_timed_waits_np3(void **state) {
  (void)state;
  char *args[] = {"leave", "4", "timed", NULL};
  leave_world(args);
}

/* Rank 0 calls gs_shutdown while its own op waits in a fast round for
 * rank 1: its op fails with gs_shutdown's text (its round is ended, no
 * hang), and rank 1's same op, submitted later, fails naming rank 0. */
static void shutdown_world(char *const args[]) {
  char *coord_args[] = {"--deadlock-time-ms", "0", NULL};
  job w;
  start_world(&w, 2, coord_args, args);
  expect_passed(&w);
  job_expect_output(w.ranks[0], "fast: rank 0: 'fast/t00': GS_ERR_SHUTDOWN: gs_shutdown was called "
                                "while this op was in flight");
  char *out = proc_output(w.ranks[1]);
  char *line = strstr(out, "fast: rank 1: 'fast/t00': ");
  int ok = line && strstr(line, "rank 0 ") && strstr(line, "left");
  free(out);
  if (!ok) job_fail("rank 1: fast/t00 did not fail naming rank 0 as gone");
  job_stop_coordinator(&w);
}

static void test_shutdown_with_op_in_round_np2(void **state) {
  (void)state;
  char *args[] = {"shutdown", "4", NULL};
  shutdown_world(args);
}

/* The same after rank 0's gs_wait(h, 100) on its op timed out (bound to
 * one cpu, the round that wait ran is parked for the exec thread, which
 * gs_shutdown must end): the same texts, no hang. */
static void test_shutdown_after_timed_wait_np2(void **state) {
  (void)state;
  char *args[] = {"shutdown", "4", "timed", NULL};
  shutdown_world(args);
}

/* gs_wait with a timeout on an op whose fast round waits for the other
 * rank (it has not submitted yet): the wait times out with the op
 * pending and the usual text, a later wait completes it with the right
 * value, a second thread waiting on another op of the round is served,
 * and the steps stay in fast rounds (no escalation). */
static void test_wait_timeout_mid_round_np2(void **state) {
  (void)state;
  char *args[] = {"timeout", "8", "3", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  for (int s = 3; s <= 8; s++) expect_fast_step_ex(&w, s, STEP_OPS, s == 8);
  int timeouts = output_count(&w, 0, "fast: rank 0 timeouts=");
  if (timeouts < 6)
    job_fail("rank 0: %d timed-out waits over 6 steps; expected at least 6", timeouts);
  job_stop_coordinator(&w);
}

/* The last of 3 ranks is SIGKILLed while the others wait in a fast round:
 * their op fails naming it (the coordinator's "was lost", or the data
 * plane's lost connection), and nothing is left running. */
static void kill9_world(char *const args[]) {
  job w;
  start_world(&w, 3, NULL, args);
  if (proc_wait_for_output(w.ranks[2], "fast: rank 2 hanging", GUARD_MS) != 0)
    job_fail("rank 2 never reached step 4");
  sleep(1); /* the others are inside their round by now (either order must pass) */
  proc_signal(w.ranks[2], SIGKILL);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(w.ranks[r], 0);
    char *out = proc_output(w.ranks[r]);
    char prefix[64], by_coord[256];
    snprintf(prefix, sizeof prefix, "fast: rank %d: 'fast/t00': ", r);
    snprintf(by_coord, sizeof by_coord, "rank 2 (%s, pid %d) was lost", g_host,
             (int)w.ranks[2]->pid);
    char *line = strstr(out, prefix);
    int ok = line && ((strstr(line, "GS_ERR_RANK_LOST") && strstr(line, by_coord)) ||
                      (strstr(line, "GS_ERR_DATA_PLANE") && strstr(line, "rank 2")));
    free(out);
    if (!ok) job_fail("rank %d: fast/t00 did not fail naming rank 2 as lost", r);
  }
  expect_fast_step(&w, 3, STEP_OPS);
  job_expect_coordinator_failed(&w);
  if (proc_strays(5000) != 0) job_fail("processes left running");
}

static void test_kill9_during_round_np3(void **state) {
  (void)state;
  char *args[] = {"hang", "4", NULL};
  kill9_world(args);
}

/* The same while the others wait in gs_wait(h, 50) slices (a parked round
 * when bound to one cpu). */
static void test_kill9_during_timed_waits_np3(void **state) {
  (void)state;
  char *args[] = {"hang", "4", "timed", NULL};
  kill9_world(args);
}

/* ---- a timed wait on an op whose round runs a long collective ---- */

/* gs_wait(h, 1) on a cached 128 MiB allreduce, while rank 1 already waits
 * in the round's agreement: the wait must time out with the op pending
 * and the usual text (gs_wait's contract, and the bounded slices Python's
 * synchronize() relies on for Ctrl-C), whichever thread runs the round;
 * then the op completes with the right values (gs-fast-worker bigwait).
 * Bound to one cpu, the waiting thread is the one that runs the round. */
static void test_big_timed_wait_np2(void **state) {
  (void)state;
  char *args[] = {"bigwait", "5", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  for (int s = 3; s <= 5; s++) {
    char want[128];
    snprintf(want, sizeof want, "fast: rank 0 bigwait step %d: gs_wait(h, 1): GS_ERR_TIMEOUT ", s);
    job_expect_output(w.ranks[0], want);
  }
  job_stop_coordinator(&w);
}

/* Two threads of rank 0 wait on two ops of a step: the first runs the
 * round, which waits for rank 1 in the agreement; the second submits its
 * op meanwhile (not in that round) and sleeps. Its op must complete in a
 * later round (the first thread hands what is left to the exec thread),
 * with the right values, and the steps stay fast (gs-fast-worker
 * twowait). */
static void test_two_waiting_threads_np2(void **state) {
  (void)state;
  char *args[] = {"twowait", "6", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  for (int s = 3; s <= 6; s++) expect_fast_step_ex(&w, s, 2, s == 6);
  job_stop_coordinator(&w);
}

/* Rank 0 forks right after submitting a step in fast mode (its ops queued
 * for a round no thread has started; bound to one cpu the exec thread has
 * not run): the child's gs_wait on one of them fails with GS_ERR_FORKED
 * and the fork text instead of running the round on the parent's shared
 * segment, its gs_shutdown too, and the parent's job goes on with the
 * right values in fast rounds (gs-fast-worker fork). */
static void test_fork_with_ops_queued_np2(void **state) {
  (void)state;
  char *args[] = {"fork", "5", NULL};
  job w;
  start_world(&w, 2, NULL, args);
  expect_passed(&w);
  job_expect_output(w.ranks[0], "fast: rank 0 fork child: GS_ERR_FORKED: gs_wait (tensor "
                                "'fast/t00'): rank 0 (host ");
  for (int s = 3; s <= 5; s++) expect_fast_step_ex(&w, s, STEP_OPS, s == 5);
  job_stop_coordinator(&w);
}

/* Registered again with setup_bound, under the name + "_bound". */
#define BOUND(fn)                                                                                  \
  { #fn "_bound", fn, setup_bound, job_teardown, NULL }

int main(void) {
  if (gethostname(g_host, sizeof g_host) != 0) snprintf(g_host, sizeof g_host, "?");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_values_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_values_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_values_np4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_timed_waits_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_polling_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_busy_bound_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_short_timed_waits_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_np4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_tcp_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_tcp_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_deterministic_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ride_after_join_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_group_values_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_group_values_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_group_order_differs_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_threads_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_persistent_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_persistent_fast_path_off_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_persistent_small_cache_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fast_path_off, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_cached_name_resubmitted_otherwise_np2, setup,
                                      job_teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_names_in_fast_mode_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_new_tensor_mid_step_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_reordered_submissions_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_steps_that_always_escalate_back_off_np2, setup,
                                      job_teardown),
      cmocka_unit_test_setup_teardown(test_cache_smaller_than_step_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_barrier_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_unregister_then_barrier_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_timeline_in_fast_mode_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_deadlock_reported_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_rank_leaves_during_round_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_shutdown_with_op_in_round_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_kill9_during_round_np3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_wait_timeout_mid_round_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_big_timed_wait_np2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_two_waiting_threads_np2, setup, job_teardown),
      BOUND(test_two_waiting_threads_np2),
      cmocka_unit_test_setup_teardown(test_fork_with_ops_queued_np2, setup, job_teardown),
      BOUND(test_fork_with_ops_queued_np2),
      BOUND(test_values_np2),
      BOUND(test_values_np4),
      BOUND(test_ride_np4),
      BOUND(test_timed_waits_np2),
      BOUND(test_short_timed_waits_np3),
      BOUND(test_polling_np3),
      BOUND(test_threads_np2),
      BOUND(test_barrier_np3),
      BOUND(test_wait_timeout_mid_round_np2),
      BOUND(test_deadlock_reported_np2),
      BOUND(test_rank_leaves_during_round_np3),
      BOUND(test_shutdown_with_op_in_round_np2),
      cmocka_unit_test_setup_teardown(test_shutdown_after_timed_wait_np2, setup, job_teardown),
      BOUND(test_shutdown_after_timed_wait_np2),
      BOUND(test_kill9_during_round_np3),
      BOUND(test_rank_leaves_during_timed_waits_np3),
      BOUND(test_kill9_during_timed_waits_np3),
      BOUND(test_big_timed_wait_np2),
      BOUND(test_ride_np2),
      BOUND(test_persistent_np2),
      BOUND(test_new_tensor_mid_step_np3),
      BOUND(test_reordered_submissions_np2),
      BOUND(test_unregister_then_barrier_np3),
      BOUND(test_timeline_in_fast_mode_np2),
      BOUND(test_cache_smaller_than_step_np2),
      BOUND(test_group_values_np2),
      BOUND(test_duplicate_names_in_fast_mode_np2),
  };
  /* GS_TEST_FILTER=test_name (a glob) runs only the tests it matches */
  if (getenv("GS_TEST_FILTER")) cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
  return cmocka_run_group_tests_name("fastpath", tests, NULL, NULL);
}
