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

#include "job.h"

#define GUARD_MS 120000

static const char worker_path[] = GS_BIN_DIR "/gs-sparse-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("sparse", GUARD_MS);
}

/* Runs gs-sparse-worker MODE on every rank of a new world of `size`: each
 * must exit 0 and print every text of expect (NULL terminated; a first and
 * second "%d" are replaced by the rank and the size). */
static void run_world(int size, const char *mode, const char *const *expect) {
  job j;
  job_start_coordinator(&j, size, NULL);
  char *args[] = {(char *)mode, NULL};
  for (int r = 0; r < size; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, NULL);
  for (int r = 0; r < size; r++) job_expect_exit(j.ranks[r], 0);
  for (int r = 0; r < size; r++) job_expect_lines(j.ranks[r], expect, r, size);
  job_stop_coordinator(&j);
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
      cmocka_unit_test_setup_teardown(test_sparse_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sparse_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sparse_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_mlp_embedding_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_errors_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_parameters_3, setup, job_teardown),
  };
  return cmocka_run_group_tests_name("sparse", tests, NULL, NULL);
}
