/* GPU tests (label gpu): the nccl backend on a real CUDA device, with a real
 * gradsyncd on 127.0.0.1 and gs-gpu-worker processes. One GPU cannot host
 * two NCCL ranks, so jobs have world size 1 (still through the coordinator
 * and NCCL). Exits 77 (ctest: skipped, never passed) without a usable CUDA
 * device. tests/gpu/run.sh runs these plus the benchmarks. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime.h>

#include "job.h"

#define GUARD_MS 240000

static const char worker_path[] = GS_BIN_DIR "/gs-gpu-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("gpu", GUARD_MS);
}

static proc *start(job *j, const char *mode, const char *extra_env) {
  job_start_coordinator(j, 1, NULL);
  char *args[] = {(char *)mode, NULL};
  char *env[] = {"GRADSYNC_BACKEND=nccl", (char *)extra_env, NULL};
  return job_start_rank(j, 0, worker_path, args, env);
}

static void test_ops(void **state) {
  (void)state;
  job j;
  proc *p = start(&j, "ops", NULL);
  job_expect_exit(p, 0);
  job_expect_output(p, "backend nccl (GRADSYNC_BACKEND=nccl, CUDA device 0)");
  job_expect_output(p, "fused: 40 tensors in 1 collective(s)");
  job_expect_output(p, "collectives, all through NCCL");
  job_expect_output(p, "result copies: 24 device results copied with gs_handle_result_copy");
  job_expect_output(p, "OK");
  job_stop_coordinator(&j);
}

/* A collective queued behind a kernel that does not end: the data-plane
 * timeout fails it (ncclCommAbort), later ops fail, shutdown returns. */
static void test_timeout(void **state) {
  (void)state;
  job j;
  proc *p = start(&j, "timeout", "GRADSYNC_DATA_TIMEOUT_MS=3000");
  job_expect_exit(p, 0);
  job_expect_output(p, "stuck: GS_ERR_DATA_PLANE");
  job_expect_output(p, "did not complete within 3000 ms");
  job_expect_output(p, "the communicator was aborted");
  job_expect_output(p, "OK");
  job_stop_coordinator(&j);
}

/* The same collective, ended by the loss of the coordinator. */
static void test_abort(void **state) {
  (void)state;
  job j;
  proc *p = start(&j, "abort", NULL);
  if (proc_wait_for_output(p, "QUEUED", 60000)) job_fail("the worker never queued its op");
  proc_signal(j.coord, SIGKILL);
  job_expect_exit(p, 0);
  job_expect_output(p, "stuck: GS_ERR_");
  job_expect_output(p, "OK");
}

int main(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    printf("SKIPPED: no usable CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ops, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_timeout, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_abort, setup, job_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
