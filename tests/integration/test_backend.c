/* Backend selection through the factory, and the ABI rules of the public
 * option and stats structs, with a real gradsyncd and real gs-backend-worker
 * processes on 127.0.0.1.
 *
 * What a user relies on: GRADSYNC_BACKEND=nccl where NCCL cannot run fails
 * gs_init at once (before joining) with GS_ERR_UNSUPPORTED, the reason and
 * the way back (GRADSYNC_BACKEND=tcp or auto); auto falls back to the TCP
 * ring and each rank logs which backend and why; a bad value is named; a
 * struct_size of 0 or too large is refused naming the *_init function; an
 * older caller's shorter struct works. The nccl case is skipped where a GPU
 * exists (tests/gpu covers it there). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "job.h"

#define GUARD_MS 90000

static const char worker_path[] = GS_BIN_DIR "/gs-backend-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("backend", GUARD_MS);
}

static int gpu_present(void) {
  return access("/dev/nvidia0", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0;
}

static void test_nccl_unavailable(void **state) {
  (void)state;
  if (gpu_present()) skip(); /* tests/gpu/run.sh runs nccl there */
  job j;
  job_start_coordinator(&j, 1, NULL);
  char *args[] = {"init", NULL};
  char *env[] = {"GRADSYNC_BACKEND=nccl", NULL};
  proc *p = job_start_rank(&j, 0, worker_path, args, env);
  job_expect_exit(p, 3);
  job_expect_output(p, "init: GS_ERR_UNSUPPORTED: gs_init (rank 0 on ");
  job_expect_output(p, "the nccl backend was asked for (GRADSYNC_BACKEND=nccl) but cannot run");
#ifdef GS_HAVE_NCCL
  job_expect_output(p, "no CUDA device: cudaGetDeviceCount: ");
#else
  job_expect_output(p, "this libgradsync was built without NCCL");
#endif
  job_expect_output(p, "set GRADSYNC_BACKEND=tcp (or auto, which falls back to the TCP ring)");
  job_stop_coordinator(&j);
  /* at once: the rank never joined */
  job_expect_no_output(j.coord, "joined", 1);

  /* the same through gs_options.backend */
  job_start_coordinator(&j, 1, NULL);
  char *args2[] = {"init", "nccl", NULL};
  p = job_start_rank(&j, 0, worker_path, args2, NULL);
  job_expect_exit(p, 3);
  job_expect_output(p, "init: GS_ERR_UNSUPPORTED: ");
  job_stop_coordinator(&j);
}

static void test_bad_backend(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 1, NULL);
  char *args[] = {"init", NULL};
  char *env[] = {"GRADSYNC_BACKEND=gpu", NULL};
  proc *p = job_start_rank(&j, 0, worker_path, args, env);
  job_expect_exit(p, 3);
  job_expect_output(p, "init: GS_ERR_INVALID_ARG: ");
  job_expect_output(p, "GRADSYNC_BACKEND");
  job_expect_output(p, "gpu");
  char *args2[] = {"init", "nccl2", NULL};
  p = job_start_rank(&j, 0, worker_path, args2, NULL);
  job_expect_exit(p, 3);
  job_expect_output(p, "init: GS_ERR_INVALID_ARG: gs_init: gs_options.backend 'nccl2' is not "
                       "one of auto, tcp, nccl");
  job_stop_coordinator(&j);
}

/* auto (the default) on ranks without a usable GPU: the TCP ring, said in
 * each rank's log with the reason, and the collectives run there. */
static void run_auto(int size) {
  job j;
  job_start_coordinator(&j, size, NULL);
  char *args[] = {"init", NULL};
  for (int r = 0; r < size; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, NULL);
  for (int r = 0; r < size; r++) {
    job_expect_exit(j.ranks[r], 0);
    job_expect_output(j.ranks[r], "backend tcp (");
    job_expect_output(j.ranks[r], "gpu_collectives=0");
    if (!gpu_present()) {
#ifdef GS_HAVE_NCCL
      job_expect_output(j.ranks[r], "backend tcp (no CUDA device: cudaGetDeviceCount: ");
#else
      job_expect_output(j.ranks[r], "backend tcp (this libgradsync was built without NCCL");
#endif
    }
    job_expect_output(j.ranks[r], "OK");
  }
  job_stop_coordinator(&j);
}

static void test_auto_1(void **state) {
  (void)state;
  run_auto(1);
}

static void test_auto_3(void **state) {
  (void)state;
  run_auto(3);
}

static void test_tcp_explicit(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  char *args[] = {"init", NULL};
  char *env[] = {"GRADSYNC_BACKEND=tcp", NULL};
  for (int r = 0; r < 2; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, env);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 0);
    job_expect_output(j.ranks[r], "backend tcp (GRADSYNC_BACKEND=tcp)");
    job_expect_output(j.ranks[r], "collectives=1 gpu_collectives=0");
  }
  job_stop_coordinator(&j);
}

static void test_abi_2(void **state) {
  (void)state;
  job j;
  job_start_coordinator(&j, 2, NULL);
  char *args[] = {"abi", NULL};
  for (int r = 0; r < 2; r++) j.ranks[r] = job_start_rank(&j, r, worker_path, args, NULL);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 0);
    job_expect_output(j.ranks[r],
                      "refused gs_options.struct_size=0: gs_init: gs_options.struct_size "
                      "is 0: initialise the struct with gs_options_init before "
                      "setting fields");
    job_expect_output(j.ranks[r], "refused gs_options.struct_size too large");
    job_expect_output(j.ranks[r], "refused gs_allreduce_opts.struct_size=0");
    job_expect_output(j.ranks[r], "refused gs_op_opts.struct_size=0");
    job_expect_output(j.ranks[r], "refused gs_sparse_opts.struct_size=0");
    job_expect_output(j.ranks[r], "refused gs_stats.struct_size=0");
    job_expect_output(j.ranks[r], "(older gs_stats filled up to its size)");
    job_expect_output(j.ranks[r], "OK");
  }
  job_stop_coordinator(&j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_nccl_unavailable, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_bad_backend, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_auto_1, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_auto_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_tcp_explicit, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_abi_2, setup, job_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
