/* Integration test of deterministic mode (GRADSYNC_DETERMINISTIC=1): a real
 * gradsyncd and 3 real gs-det-worker processes on 127.0.0.1, five runs
 * with different fusion thresholds, cycle times, emission policies and
 * submission orders and pauses, on the TCP ring and on the default host
 * backend (shared memory). Every rank of every run must report that
 * its averages equal the rank-order reference bit for bit, and all runs
 * must end with the same parameter checksum. A rank whose setting differs
 * from the others' fails gs_init, naming the ranks on each side.
 *
 * np = 3: at two ranks the ring's sums are already order-free (a + b ==
 * b + a); from three on the ring's order depends on the block boundaries,
 * so on fusion. Every wait is bounded by the hang guard; the teardown
 * kills and reaps every process the test started. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "job.h"

#define GUARD_MS 240000
#define NP 3

static const char worker_path[] = GS_BIN_DIR "/gs-det-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("deterministic", GUARD_MS);
}

/* The "checksum: ..." value in p's output, into out (17 bytes). */
static void checksum_of(const proc *p, char *out) {
  char *text = proc_output(p);
  const char *c = text ? strstr(text, "checksum: ") : NULL;
  if (!c) {
    free(text);
    job_fail("no checksum line in a rank's output");
  }
  snprintf(out, 17, "%s", c + strlen("checksum: "));
  free(text);
}

static void test_five_runs_same_checksum(void **state) {
  (void)state;
  /* fusion threshold, cycle time, policy, timing seed */
  static const char *const runs[5][7] = {
      {"--fusion-threshold", "0", "--cycle-time-ms", "1", NULL},
      {"--fusion-threshold", "65536", "--cycle-time-ms", "3", NULL},
      {"--fusion-threshold", "1048576", "--emit-policy", "window", "--cycle-time-ms", "2", NULL},
      {"--fusion-threshold", "4194304", "--max-plans-in-flight", "1", NULL},
      {NULL}, /* the defaults */
  };
  char first[17] = "";
  for (int k = 0; k < 5; k++) {
    job j;
    job_start_coordinator(&j, NP, (char *const *)runs[k]);
    char seed[16];
    snprintf(seed, sizeof seed, "%d", 17 * k + 3);
    char *args[] = {seed, NULL};
    /* odd runs on the TCP ring, even ones on the default backend (shared
     * memory on one host): both reduce in rank order, so one checksum */
    char *env[] = {"GRADSYNC_DETERMINISTIC=1", k % 2 ? "GRADSYNC_BACKEND=tcp" : NULL, NULL};
    for (int r = 0; r < NP; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, env);
    for (int r = 0; r < NP; r++) job_expect_exit(j.ranks[r], 0);
    for (int r = 0; r < NP; r++) {
      job_expect_output(j.ranks[r], "rank-order: ok");
      job_expect_output(j.ranks[r],
                        "deterministic mode: every CPU allreduce reduces in rank order");
      char sum[17];
      checksum_of(j.ranks[r], sum);
      if (!first[0]) snprintf(first, sizeof first, "%s", sum);
      if (strcmp(sum, first) != 0)
        job_fail("run %d rank %d: parameter checksum %s differs from run 0 rank 0's %s", k, r, sum,
                 first);
    }
    job_stop_coordinator(&j);
    print_message("run %d (%s%s %s ...): checksum %s on every rank\n", k,
                  k % 2 ? "GRADSYNC_BACKEND=tcp " : "", runs[k][0] ? runs[k][0] : "defaults",
                  runs[k][1] ? runs[k][1] : "", first);
  }
}

/* Rank 1 alone without deterministic mode: every rank's gs_init fails
 * with the ranks on each side named. */
static void test_setting_must_agree(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, NP, NULL);
  char *args[] = {"1", NULL};
  char *on[] = {"GRADSYNC_DETERMINISTIC=1", NULL}, *off[] = {"GRADSYNC_DETERMINISTIC=0", NULL};
  for (int r = 0; r < NP; r++)
    j.ranks[r] = job_start_rank(&j, r, worker_path, args, r == 1 ? off : on);
  for (int r = 0; r < NP; r++) job_expect_exit(j.ranks[r], 1);
  for (int r = 0; r < NP; r++)
    job_expect_output(j.ranks[r], "GRADSYNC_DETERMINISTIC differs across ranks: ranks [0,2] set "
                                  "1, ranks [1] set 0; set the same value on every rank");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_five_runs_same_checksum, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_setting_must_agree, setup, job_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
