/* Integration tests: a real gradsyncd and real worker processes
 * (gs-test-worker, gradsync-train through gradsync-run) on 127.0.0.1.
 *
 * Each test starts its own coordinator on port 0, starts the ranks with the
 * worker environment, and asserts what a user relies on: every rank's exit
 * status, the values (checked inside gs-test-worker against a local
 * reference) and the exact error texts. Every wait is bounded by a hang guard
 * (GUARD_MS per test); the teardown kills and reaps every process the test
 * started, also when it failed. No assertion depends on timing. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "job.h"

/* A hang bound, not a timing assertion: under ASan on 2 shared vCPUs
 * (load average 14-22) test_ops_4 took 114-120 s of honest work, so the
 * former 120 s killed healthy runs. */
#define GUARD_MS 300000

static const char worker_path[] = GS_BIN_DIR "/gs-test-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("case", GUARD_MS);
}

/* p's join timeout message ("waiting for ranks [a,b,...] to join") lists
 * rank. */
static void expect_missing(const proc *p, int rank) {
  static const char key[] = "waiting for ranks [";
  char *out = proc_output(p);
  const char *at = strstr(out, key);
  int found = 0;
  if (at != NULL) {
    at += sizeof key - 1;
    while (*at && *at != ']') {
      char *end;
      long r = strtol(at, &end, 10);
      if (end == at) break;
      if (r == rank) found = 1;
      at = *end == ',' ? end + 1 : end;
    }
  }
  free(out);
  if (!found) job_fail("%s: the join timeout does not name rank %d as missing", p->label, rank);
}

/* Runs gs-test-worker ARGS... on every rank of a new world of `size`; each
 * must exit 0 and print expect (with "%d" replaced by its rank if present). */
static void run_world(int size, char *const args[], const char *expect) {
  job w;
  job_start_coordinator(&w, size, NULL);
  for (int r = 0; r < size; r++) w.ranks[r] = job_start_rank(&w, r, worker_path, args, NULL);
  for (int r = 0; r < size; r++) job_expect_exit(w.ranks[r], 0);
  for (int r = 0; r < size; r++) {
    char want[256];
    snprintf(want, sizeof want, expect, r, size);
    job_expect_output(w.ranks[r], want);
  }
  job_stop_coordinator(&w);
}

/* ---- every op x dtype x placement x count against a local reference ------ */

/* 378 tensors (5 ops x 9 dtypes x 2 placements x 4 counts, plus count 0 for
 * sum) x 2 rounds (the second through the response cache). */

static void ops_world(int size) {
  char *args[] = {"ops", NULL};
  job w;
  job_start_coordinator(&w, size, NULL);
  for (int r = 0; r < size; r++) w.ranks[r] = job_start_rank(&w, r, worker_path, args, NULL);
  for (int r = 0; r < size; r++) job_expect_exit(w.ranks[r], 0);
  for (int r = 0; r < size; r++) {
    char want[128];
    job_expect_output(w.ranks[r], "ops: 756 checks passed (378 tensors x 2 rounds");
    snprintf(want, sizeof want, "rank %d of %d)", r, size);
    job_expect_output(w.ranks[r], want);
  }
  job_stop_coordinator(&w);
}

static void test_ops_1(void **state) {
  (void)state;
  ops_world(1);
}

static void test_ops_2(void **state) {
  (void)state;
  ops_world(2);
}

static void test_ops_3(void **state) {
  (void)state;
  ops_world(3);
}

static void test_ops_4(void **state) {
  (void)state;
  ops_world(4);
}

/* ---- submission order differs per rank; results collected by wait_any ---- */

static void test_random_order_2(void **state) {
  (void)state;
  char *args[] = {"random-order", NULL};
  run_world(2, args, "random-order: 100 tensors checked (rank %d of %d)");
}

static void test_random_order_4(void **state) {
  (void)state;
  char *args[] = {"random-order", NULL};
  run_world(4, args, "random-order: 100 tensors checked (rank %d of %d)");
}

/* ---- the application's kv store through the C API ------------------------ */

static void test_kv_3(void **state) {
  (void)state;
  char *args[] = {"kv", NULL};
  run_world(3, args, "kv: passed (rank %d of %d)");
}

/* ---- a shape mismatch fails the op on every rank, the job goes on ----- */

static void test_mismatch_3(void **state) {
  (void)state;
  char *args[] = {"mismatch", NULL};
  job w;
  job_start_coordinator(&w, 3, NULL);
  for (int r = 0; r < 3; r++) w.ranks[r] = job_start_rank(&w, r, worker_path, args, NULL);
  for (int r = 0; r < 3; r++) job_expect_exit(w.ranks[r], 0);
  for (int r = 0; r < 3; r++) {
    char want[256];
    snprintf(want, sizeof want,
             "mismatch: rank %d: GS_ERR_MISMATCH: tensor 'dense/kernel': mismatched shapes: "
             "ranks [0,2] sent [17,17], ranks [1] sent [18,18]\n",
             r);
    job_expect_output(w.ranks[r], want);
    snprintf(want, sizeof want, "mismatch: passed (rank %d of 3)", r);
    job_expect_output(w.ranks[r], want);
  }
  job_stop_coordinator(&w);
}

/* ---- a second process joining as rank 0 is refused ------------------- */

static void test_duplicate_join(void **state) {
  (void)state;
  char *hold[] = {"hold", "3000", NULL};
  job w;
  job_start_coordinator(&w, 2, NULL);
  proc *first = job_start_rank(&w, 0, worker_path, hold, NULL);
  /* Give the first a head start; whichever of the two joins second must be
   * refused, so the outcome does not depend on this pause. */
  usleep(1000 * 1000);
  proc *second = job_start_rank(&w, 0, worker_path, hold, NULL);
  snprintf(second->label, sizeof second->label, "rank 0 (second)");

  proc *both[2] = {first, second};
  size_t idx = 0;
  if (proc_wait_any(both, 2, 60000, &idx) != 0)
    job_fail("neither rank-0 process was refused: both hung");
  proc *loser = both[idx], *winner = both[1 - idx];
  if (proc_exit_code(loser) == 0)
    job_fail("%s exited 0 although another process holds rank 0", loser->label);
  job_expect_output(loser, "GS_ERR_ALREADY_JOINED");
  job_expect_output(loser, "rank 0 already joined");
  if (winner->exited)
    job_fail("%s was also refused (exit %d)", winner->label, proc_exit_code(winner));

  /* The refusal did not disturb the rank 0 that holds the slot. */
  proc *r1 = job_start_rank(&w, 1, worker_path, hold, NULL);
  job_expect_exit(winner, 0);
  job_expect_exit(r1, 0);
  job_expect_output(winner, "hold: passed (rank 0 of 2)");
  job_expect_output(r1, "hold: passed (rank 1 of 2)");
  job_stop_coordinator(&w);
}

/* ---- a rank that never joins is named by the join timeout ------------- */

static void test_never_joined(void **state) {
  (void)state;
  char *join[] = {"join", NULL};
  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=2000", NULL};
  job w;
  job_start_coordinator(&w, 3, NULL);
  proc *r0 = job_start_rank(&w, 0, worker_path, join, env);
  proc *r1 = job_start_rank(&w, 1, worker_path, join, env);
  /* A hang bound, not a timing check: with GRADSYNC_JOIN_TIMEOUT_MS=2000
   * both must give up long before the 60 s default would end the wait. */
  if (proc_wait(r0, 30000) != 0 || proc_wait(r1, 30000) != 0)
    job_fail("gs_init ignored GRADSYNC_JOIN_TIMEOUT_MS=2000: still waiting after 30 s");
  job_expect_exit(r0, 3);
  job_expect_exit(r1, 3);
  job_expect_output(r0, "join: gs_init failed: GS_ERR_JOIN_TIMEOUT: ");
  job_expect_output(r1, "join: gs_init failed: GS_ERR_JOIN_TIMEOUT: ");
  /* Both name rank 2. The one that gives up second may also name the
   * first (its slot is free again once it left), so rank 2 must be in the
   * list, not the whole list. */
  expect_missing(r0, 2);
  expect_missing(r1, 2);
  job_stop_coordinator(&w);
}

/* ---- the launcher and the demo --------------------------------------- */

static void test_gradsync_run_train(void **state) {
  (void)state;
  char *argv[] = {
      GS_BIN_DIR "/gradsync-run", "-np", "3", GS_BIN_DIR "/gradsync-train", "--steps", "50", NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  job_expect_exit(p, 0);
  job_expect_output(p, "parameters identical on all 3 ranks");
  size_t left = proc_strays(5000);
  if (left != 0) job_fail("gradsync-run left %zu process(es) running", left);
}

/* The launcher exits with the failing rank's status and stops the others. */
static void test_gradsync_run_exit_status(void **state) {
  (void)state;
  char *argv[] = {GS_BIN_DIR "/gradsync-run",
                  "-np",
                  "2",
                  "--",
                  (char *)worker_path,
                  "exit-code",
                  "1",
                  "7",
                  NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  job_expect_exit(p, 7);
  job_expect_output(p, "exit-code: rank 1 exits with 7 before joining");
  size_t left = proc_strays(5000);
  if (left != 0) job_fail("gradsync-run left %zu process(es) running", left);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ops_1, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ops_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ops_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ops_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_random_order_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_random_order_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_kv_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_mismatch_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_join, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_never_joined, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_gradsync_run_train, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_gradsync_run_exit_status, setup, job_teardown),
  };
  return cmocka_run_group_tests_name("integration", tests, NULL, NULL);
}
