/* Integration tests of sparse gradients, gradient aggregation and
 * gs_broadcast_parameters: a real gradsyncd and real gs-sparse-worker
 * processes on 127.0.0.1.
 *
 * Each test starts its own coordinator on port 0 and the ranks with the
 * worker environment; the workers check every value against a reference
 * computed locally and every error text, and print a summary line that the
 * driver asserts along with each rank's exit status. Every wait is bounded
 * by a hang guard; the teardown kills and reaps every process the test
 * started, also when it failed. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proc.h"

#define GUARD_MS 120000
#define MAX_RANKS 4

static const char worker_path[] = GS_BIN_DIR "/gs-sparse-worker";

static void fail_with_dump(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  proc_dump_all();
  fail_msg("%s", msg);
}

static int setup(void **state) {
  (void)state;
  return proc_test_begin("sparse", GUARD_MS);
}

static int teardown(void **state) {
  (void)state;
  proc_test_end();
  return 0;
}

static void expect_exit(proc *p, int code) {
  if (proc_wait(p, GUARD_MS) != 0)
    fail_with_dump("%s (pid %d) hung; killed by the hang guard", p->label, (int)p->pid);
  if (proc_exit_code(p) != code)
    fail_with_dump("%s exited with %d, expected %d", p->label, proc_exit_code(p), code);
}

static void expect_output(const proc *p, const char *needle) {
  char *out = proc_output(p);
  int found = out != NULL && strstr(out, needle) != NULL;
  free(out);
  if (!found) fail_with_dump("%s: output lacks \"%s\"", p->label, needle);
}

/* Runs gs-sparse-worker MODE on every rank of a new world of `size`: each
 * must exit 0 and print every text of expect (NULL terminated; a first and
 * second "%d" are replaced by the rank and the size). */
static void run_world(int size, const char *mode, const char *const *expect) {
  char addr[128];
  proc *coord = proc_start_gradsyncd(GS_BIN_DIR, size, NULL, addr, sizeof addr);
  if (coord == NULL) fail_with_dump("gradsyncd did not start (see its output above)");
  proc *ranks[MAX_RANKS];
  for (int r = 0; r < size; r++) {
    char c[160], rk[32], sz[32], lr[40], ls[40];
    snprintf(c, sizeof c, "GRADSYNC_COORDINATOR=%s", addr);
    snprintf(rk, sizeof rk, "GRADSYNC_RANK=%d", r);
    snprintf(sz, sizeof sz, "GRADSYNC_SIZE=%d", size);
    snprintf(lr, sizeof lr, "GRADSYNC_LOCAL_RANK=%d", r);
    snprintf(ls, sizeof ls, "GRADSYNC_LOCAL_SIZE=%d", size);
    char *env[] = {c, rk, sz, lr, ls, "GRADSYNC_JOIN_TIMEOUT_MS=30000", NULL};
    char *argv[] = {(char *)worker_path, (char *)mode, NULL};
    char label[32];
    snprintf(label, sizeof label, "rank %d", r);
    ranks[r] = proc_spawn(label, argv, env);
    if (ranks[r] == NULL) fail_with_dump("could not start %s as rank %d", worker_path, r);
  }
  for (int r = 0; r < size; r++) expect_exit(ranks[r], 0);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; expect[i]; i++) {
      char want[512];
      snprintf(want, sizeof want, expect[i], r, size);
      expect_output(ranks[r], want);
    }
  proc_signal(coord, SIGTERM);
  expect_exit(coord, 0);
}

/* ---- both paths against a dense reference, every dtype, sum and average ---- */

static void sparse_world(int size) {
  /* The number of checks depends on the random row counts. */
  const char *const lines[] = {"sparse: ", " checks passed (32 tensors x 2 rounds, rank %d of %d)",
                               NULL};
  run_world(size, "sparse", lines);
}

static void test_sparse_2(void **state) {
  (void)state;
  sparse_world(2);
}

static void test_sparse_3(void **state) {
  (void)state;
  sparse_world(3);
}

static void test_sparse_4(void **state) {
  (void)state;
  sparse_world(4);
}

/* ---- an embedding gradient: sparse rows == sparse_as_dense == dense form ---- */

static void test_mlp_embedding_3(void **state) {
  (void)state;
  const char *const lines[] = {
      "mlp: sparse rows, sparse_as_dense and dense agree (360 checks, rank %d of %d)", NULL};
  run_world(3, "mlp", lines);
}

/* ---- errors: the texts a user reads, and the job goes on ------------------- */

static void test_errors_2(void **state) {
  (void)state;
  const char *const lines[] = {
      "errors: invalid op: GS_ERR_INVALID_ARG: gs_sparse_allreduce_async: tensor 'err/min': "
      "reduce op min (2) is not supported for sparse gradients; valid ops are GS_SUM and "
      "GS_AVERAGE\n",
      "errors: index out of range: GS_ERR_INVALID_ARG: gs_sparse_allreduce_async: tensor "
      "'err/range': indices[2] = 9 is out of range for a dense tensor of dense_rows=7 rows "
      "(valid: 0..6)\n",
      "errors: negative index: GS_ERR_INVALID_ARG: gs_sparse_allreduce_async: tensor "
      "'err/negative': indices[1] = -3 is negative",
      "errors: aggregator sparse without sparse_as_dense: GS_ERR_INVALID_ARG: "
      "gs_aggregator_sparse_allreduce_async: tensor 'err/agg-sparse': sparse gradients in an "
      "aggregator need opts->sparse_as_dense = 1",
      "errors: aggregator count changed: GS_ERR_INVALID_ARG: gs_aggregator_allreduce_async: "
      "tensor 'err/agg-count' was aggregated as 10 float32 elements (1 of 4 passes done) but this "
      "pass gives 12 float32 elements",
      "errors: gs_sparse_result of a sparse_as_dense op: GS_ERR_INVALID_ARG: ",
      "errors: passed (rank %d of %d)",
      NULL};
  run_world(2, "errors", lines);
}

/* ---- aggregation: one collective per 4 passes, the reduced sum of passes ---- */

static void test_aggregate_2(void **state) {
  (void)state;
  const char *const lines[] = {"aggregate: 2309 checks passed (rank %d of %d)", NULL};
  run_world(2, "aggregate", lines);
}

static void test_aggregate_3(void **state) {
  (void)state;
  const char *const lines[] = {"aggregate: 2309 checks passed (rank %d of %d)", NULL};
  run_world(3, "aggregate", lines);
}

static void test_aggregate_4(void **state) {
  (void)state;
  const char *const lines[] = {"aggregate: 2309 checks passed (rank %d of %d)", NULL};
  run_world(4, "aggregate", lines);
}

/* ---- gs_broadcast_parameters from root 1, a local name skipped ------------- */

static void test_broadcast_parameters_3(void **state) {
  (void)state;
  const char *const lines[] = {
      "broadcast: root 7: GS_ERR_INVALID_ARG: gs_broadcast_parameters: root 7 is not a rank of "
      "this job (0..2)",
      "broadcast: 1045 checks passed, 'param/local' kept (rank %d of %d)", NULL};
  run_world(3, "broadcast", lines);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sparse_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sparse_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sparse_4, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mlp_embedding_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_4, setup, teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_parameters_3, setup, teardown),
  };
  return cmocka_run_group_tests_name("sparse", tests, NULL, NULL);
}
