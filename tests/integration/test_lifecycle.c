/* The coordinator's lifecycle with real processes on 127.0.0.1: one job per
 * coordinator (exit 0 when every rank left, 3 when the job failed: see
 * test_fault), --serve-forever (a fresh job, next epoch, after each),
 * SIGTERM in the middle of a job (every rank fails with
 * GS_ERR_COORDINATOR_LOST saying the coordinator was shut down, gradsyncd
 * drains with its port open, refusing new ranks, and exits 0), and the refusal of a next job's rank
 * that comes too early; a rank that forks after gs_init (the child's calls
 * fail with GS_ERR_FORKED, the parent's job goes on). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "job.h"

#define GUARD_MS 90000 /* per test: catches hangs, never a timing check */

static const char train_path[] = GS_BIN_DIR "/gradsync-train";
static const char worker_path[] = GS_BIN_DIR "/gs-test-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("lifecycle", GUARD_MS);
}

static void wait_for_output(proc *p, const char *needle) {
  if (proc_wait_for_output(p, needle, proc_guard_left_ms()) != 0)
    job_fail("%s: never printed \"%s\"", p->label, needle);
}

/* A 2-rank demo job of `steps` against j's coordinator; both ranks exit 0. */
static void run_train_job(job *j, const char *steps) {
  char *args[] = {"--steps", (char *)steps, NULL};
  for (int r = 0; r < 2; r++) j->ranks[r] = job_start_rank(j, r, train_path, args, NULL);
  for (int r = 0; r < 2; r++) job_expect_exit(j->ranks[r], 0);
  job_expect_output(j->ranks[0], "parameters identical on all 2 ranks");
}

/* One job: gradsyncd exits 0 by itself once both ranks left. */
static void test_one_job_then_exit(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  job_expect_output(j.coord, "one job, then exit (0: finished, 3: failed)");
  run_train_job(&j, "20");
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "job (epoch 1) finished: all 2 ranks left cleanly");
  job_expect_no_output(j.coord, "received SIGTERM", 0);
}

/* --serve-forever: two jobs one after the other on one coordinator, the
 * second in epoch 2 with fresh state; it stays up until SIGTERM. */
static void test_serve_forever(void **state) {
  (void)state;
  char *args[] = {"--serve-forever", NULL};
  job j;
  job_start_coordinator(&j, 2, args);
  wait_for_output(j.coord, "job after job (--serve-forever)"); /* printed after "listening" */
  run_train_job(&j, "20");
  wait_for_output(j.coord, "ready for the next job (epoch 2)");
  job_expect_output(j.coord, "job (epoch 1) finished: all 2 ranks left cleanly");
  run_train_job(&j, "20");
  wait_for_output(j.coord, "job (epoch 2) finished: all 2 ranks left cleanly");
  wait_for_output(j.coord, "ready for the next job (epoch 3)");
  job_expect_no_output(j.coord, "already joined", 0);
  job_stop_coordinator(&j);
}

/* SIGTERM while the job trains: every rank fails with
 * GS_ERR_COORDINATOR_LOST saying it was shut down; gradsyncd exits 0. */
static void test_sigterm_mid_job(void **state) {
  (void)state;
  char *cargs[] = {"--shutdown-grace-s", "5", NULL};
  char *args[] = {"--steps", "1000000", "--log-every", "10", NULL};
  job j;
  job_start_coordinator(&j, 2, cargs);
  for (int r = 0; r < 2; r++) j.ranks[r] = job_start_rank(&j, r, train_path, args, NULL);
  wait_for_output(j.ranks[0], "step 20/1000000");
  proc_signal(j.coord, SIGTERM);
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "received SIGTERM: telling every rank the coordinator is going "
                             "away; exiting within 5 s");
  /* The listener stayed open for the grace less 2 s, then closed by itself. */
  job_expect_output(j.coord, "draining for 3.0 s: health NOT_SERVING, new ranks refused");
  job_expect_no_output(j.coord, "ending the drain now", 0);
  job_expect_output(j.coord, "level=info prog=\"gradsyncd\" msg=\"stopped\"");
  char want[512];
  snprintf(want, sizeof want,
           "lost the coordinator at %s: it was shut down while the job ran (UNAVAILABLE: "
           "gradsyncd is shutting down",
           j.addr);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 1);
    job_expect_output(j.ranks[r], "' failed: GS_ERR_COORDINATOR_LOST: ");
    job_expect_output(j.ranks[r], want);
  }
}

/* The drain after SIGTERM (a long grace, so that it lasts): the ranks of
 * the job fail at once, gradsyncd keeps its port open, and a rank that
 * comes now is refused with the reason (the coordinator is shutting
 * down), not a closed port; a second SIGTERM ends the drain at once. The
 * health probes of the drain: test_ops (a python3-grpcio client). */
static void test_sigterm_drain(void **state) {
  (void)state;
  char *cargs[] = {"--shutdown-grace-s", "120", NULL};
  char *hold[] = {"hold", "600000", NULL};
  job j;
  job_start_coordinator(&j, 2, cargs);
  for (int r = 0; r < 2; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, hold, NULL);
  wait_for_output(j.coord, "all 2 ranks connected: world ready");
  proc_signal(j.coord, SIGTERM);
  wait_for_output(j.coord, "draining for 118.0 s: health NOT_SERVING, new ranks refused; the "
                           "listener closes after that (or at once on a second SIGTERM/SIGINT)");
  char *join[] = {"join", NULL};
  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=2000", NULL};
  proc *late = job_start_rank(&j, 0, worker_path, join, env);
  snprintf(late->label, sizeof late->label, "rank 0 (during the drain)");
  job_expect_exit(late, 3);
  char want[512];
  snprintf(want, sizeof want,
           "the coordinator at %s is shutting down and took no new ranks within 2000 ms "
           "(GRADSYNC_JOIN_TIMEOUT_MS): gradsyncd is shutting down (SIGTERM/SIGINT) and takes no "
           "new ranks; the job it served has ended: start the job again with a new coordinator",
           j.addr);
  job_expect_output(late, want);
  /* Still draining: the second SIGTERM is answered (logged) below. */
  job_expect_no_output(j.coord, "msg=\"stopped\"", 0);
  proc_signal(j.coord, SIGTERM);
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "received SIGTERM again: closing now");
  job_expect_output(j.coord, "ending the drain now");
  /* The ranks sleep before their op: killed by the teardown. */
}

/* Rank 0 of the job left; a process that wants to be rank 0 of the next job
 * comes while rank 1 still runs: refused with the reason (not "rank 0
 * already joined"). Rank 1's collective then fails (rank 0 is gone) and it
 * exits without leaving, so the job failed: gradsyncd exits 3. */
static void test_next_job_too_early(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  char *join[] = {"join", NULL};
  char *hold[] = {"hold", "4000", NULL};
  j.ranks[1] = job_start_rank(&j, 1, worker_path, hold, NULL);
  j.ranks[0] = job_start_rank(&j, 0, worker_path, join, NULL);
  job_expect_exit(j.ranks[0], 0);
  wait_for_output(j.coord, "left the job");

  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=3000", NULL};
  proc *next = job_start_rank(&j, 0, worker_path, join, env);
  snprintf(next->label, sizeof next->label, "rank 0 (next job)");
  job_expect_exit(next, 3);
  job_expect_output(next, "join: gs_init failed: GS_ERR_");
  job_expect_output(next, "cannot join: this coordinator is still serving a job (epoch 1) whose "
                          "rank 0 (");
  job_expect_output(next, "has already finished, while ranks [1] have not left yet");
  job_expect_no_output(next, "already joined", 0);

  proc_wait(j.ranks[1], proc_guard_left_ms());
  job_expect_output(j.ranks[1], "has already left the job");
  job_expect_coordinator_failed(&j);
}

/* fork after gs_init (a data-loader worker, os.fork()): rank 0 forks with
 * an op completed and one in flight, a thread in a wait and one taking the
 * context's lock. In every child each call on the parent's context fails
 * at once with GS_ERR_FORKED naming the rank, the host and both processes
 * (gs-test-worker checks the child's pid; the first child prints its
 * errors), the completed op still reads, gs_shutdown returns without
 * touching the parent's job, and the child exits 0. The parent's job goes
 * on with the right values, and every rank leaves cleanly. */
static void test_fork_child(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  char dir[600];
  snprintf(dir, sizeof dir, "GS_TEST_DIR=%s", proc_test_dir());
  char *env[] = {dir, NULL};
  char *args[] = {"fork", "3", NULL};
  for (int r = 0; r < 2; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, env);
  for (int r = 0; r < 2; r++) job_expect_exit(j.ranks[r], 0);
  proc *p = j.ranks[0];
  char made[128];
  snprintf(made, sizeof made,
           "this gradsync context was made by process %d before a fork; process ", (int)p->pid);
  static const char *const calls[] = {
      "fork-child: gs_allreduce: GS_ERR_FORKED: gs_allreduce (tensor 'fork/child'): rank 0 (host ",
      "fork-child: gs_wait: GS_ERR_FORKED: gs_wait (tensor 'fork/inflight'): rank 0 (host ",
      "fork-child: gs_test: GS_ERR_FORKED: gs_test (tensor 'fork/inflight'): rank 0 (host ",
      "fork-child: gs_wait_any: GS_ERR_FORKED: gs_wait_any (tensor 'fork/inflight'): rank 0 ",
      "fork-child: gs_barrier: GS_ERR_FORKED: gs_barrier: rank 0 (host ",
      "fork-child: gs_join: GS_ERR_FORKED: gs_join: rank 0 (host ",
      "fork-child: gs_register_local: GS_ERR_FORKED: gs_register_local (tensor 'fork/local'): ",
      "fork-child: gs_kv_set: GS_ERR_FORKED: gs_kv_set: rank 0 (host ",
      "fork-child: gs_get_stats: GS_ERR_FORKED: gs_get_stats: rank 0 (host ",
      "fork-child: gs_shutdown: GS_ERR_FORKED: gs_shutdown: rank 0 (host ",
  };
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) job_expect_output(p, calls[i]);
  job_expect_output(p, made);
  job_expect_output(p, " (a forked child) cannot use it: call gradsync only from the process "
                       "that called gs_init (fork before gs_init, or start child processes with "
                       "exec");
  job_expect_output(p, "fork-child: gs_wait on the op completed before the fork: GS_OK, values ok");
  job_expect_no_output(p, "FAIL", 0);
  job_expect_output(p, "fork: rank 0: 12 children got GS_ERR_FORKED from every call and exited 0");
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "fork: rank %d: 3 steps after the fork ok", r);
    job_expect_output(j.ranks[r], want);
  }
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "job (epoch 1) finished: all 2 ranks left cleanly");
}

/* Starts the 2 ranks of j in gs-test-worker's fork-init mode `which` and
 * checks that each exits 0 after its child joined, summed the tensor
 * 'fork-init/<which>' right and left. */
static void fork_init_ranks(job *j, const char *which) {
  char *args[] = {"fork-init", (char *)which, NULL};
  for (int r = 0; r < 2; r++) j->ranks[r] = job_start_rank(j, r, worker_path, args, NULL);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j->ranks[r], 0);
    char want[128];
    snprintf(want, sizeof want, ": rank %d of 2: joined, tensor 'fork-init/%s' summed right, left",
             r, which);
    job_expect_output(j->ranks[r], want);
    job_expect_no_output(j->ranks[r], "FAIL", 0);
  }
}

/* gs_init in a forked child, as a user would (every child's wait is
 * bounded: its alarm, then its parent's kill). fresh: each rank process of
 * a 2-rank job never calls gs_init and forks; the children join as ranks 0
 * and 1 and sum a tensor right. */
static void test_fork_init_fresh(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  fork_init_ranks(&j, "fresh");
  for (int r = 0; r < 2; r++) { /* the children joined, not their parents */
    char want[64];
    snprintf(want, sizeof want, "(pid %d, ", (int)j.ranks[r]->pid);
    job_expect_no_output(j.coord, want, 0);
  }
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "job (epoch 1) finished: all 2 ranks left cleanly");
}

/* after-shutdown: both ranks join, sum, leave (epoch 1), then fork; the
 * children join the next job (epoch 2) of the --serve-forever coordinator
 * and sum right. */
static void test_fork_init_after_shutdown(void **state) {
  (void)state;
  char *cargs[] = {"--serve-forever", NULL};
  job j;
  job_start_coordinator(&j, 2, cargs);
  fork_init_ranks(&j, "after-shutdown");
  wait_for_output(j.coord, "job (epoch 2) finished: all 2 ranks left cleanly");
  job_expect_output(j.coord, "job (epoch 1) finished: all 2 ranks left cleanly");
  job_stop_coordinator(&j);
}

/* live: the parent (rank 0 of a 1-rank job) keeps its context and forks;
 * the child calls gs_init for a 1-rank job of its own at a second
 * coordinator. gRPC cannot start again in that child (it hung in gRPC's
 * poller until the child's alarm, sharing the parent's epoll set): gs_init
 * fails at once with GS_ERR_FORKED naming both processes and what to do,
 * and never reaches the second coordinator. The parent's job goes on and
 * ends cleanly. */
static void test_fork_init_live(void **state) {
  (void)state;
  job j, j2;
  job_start_coordinator(&j, 1, NULL);
  job_start_coordinator(&j2, 1, NULL);
  char coord2[200];
  snprintf(coord2, sizeof coord2, "GS_TEST_COORD2=%s", j2.addr);
  char *env[] = {coord2, NULL};
  char *args[] = {"fork-init", "live", NULL};
  proc *p = j.ranks[0] = job_start_rank(&j, 0, worker_path, args, env);
  job_expect_exit(p, 0);
  char want[256];
  snprintf(want, sizeof want,
           " was forked by process %d while gradsync's gRPC client was live "
           "there (a gradsync context that had not been shut down); ",
           (int)p->pid);
  job_expect_output(p, want);
  job_expect_output(p, ": gs_init: GS_ERR_FORKED: gs_init (rank 0): process ");
  job_expect_output(p, "gRPC cannot start again in such a child (it would hang, and could take "
                       "events of the parent's connections): call gs_init in a process started "
                       "with exec (e.g. multiprocessing's 'spawn' start method), or fork before "
                       "the parent's gs_init or after its gs_shutdown");
  job_expect_output(p, "fork-init: rank 0: the child of a live context: exit 3");
  job_expect_no_output(p, "FAIL", 0);
  job_expect_output(p, "fork-init: passed (rank 0, live)");
  job_expect_exit(j.coord, 0);
  job_expect_output(j.coord, "job (epoch 1) finished: all 1 ranks left cleanly");
  job_expect_no_output(j2.coord, "joined", 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_job_then_exit, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_serve_forever, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_mid_job, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_drain, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_next_job_too_early, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fork_child, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fork_init_fresh, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fork_init_after_shutdown, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_fork_init_live, setup, job_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
