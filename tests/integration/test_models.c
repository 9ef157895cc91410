/* Integration tests of what models need beyond plain data parallelism:
 * model-parallel (local) tensors and the local/global conflict check, wire
 * compression, prescale/postscale and gradient_predivide_factor, reduce ops
 * by name, alltoall, reducescatter, and the demo with --towers and
 * --embedding. A real gradsyncd and real gs-models-worker processes on
 * 127.0.0.1.
 *
 * Each test starts its own coordinator on port 0 and the ranks with the
 * worker environment; the workers check every value and error text against
 * a reference computed locally and print a summary line, which the driver
 * asserts along with each rank's exit status and the key error texts.
 * Every wait is bounded by a hang guard; the teardown kills and reaps every
 * process the test started, also when it failed. */
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
#define MAX_RANKS 4 /* at most JOB_MAX_RANKS */

static const char worker_path[] = GS_BIN_DIR "/gs-models-worker";

static int setup(void **state) {
  (void)state;
  return proc_test_begin("models", GUARD_MS);
}

/* How a world is started: the worker's arguments, extra environment for
 * every rank, and extra gradsyncd arguments (NULL-terminated lists). */
typedef struct world_spec {
  const char *mode, *variant;
  const char *env[4];
  const char *coord_args[8];
} world_spec;

/* Runs gs-models-worker on every rank of a new world of `size`: each must
 * exit 0 and print every text of expect (NULL terminated; a first and
 * second "%d" are replaced by the rank and the size). Returns the
 * coordinator, stopped and reaped, for more checks of its output, and the
 * ranks in ranks_out (may be NULL; MAX_RANKS entries). */
static proc *run_world(int size, const world_spec *w, const char *const *expect, proc **ranks_out) {
  job j;
  job_start_coordinator(&j, size, (char *const *)w->coord_args);
  char *args[] = {(char *)w->mode, (char *)w->variant, NULL};
  for (int r = 0; r < size; r++)
    j.ranks[r] = job_start_rank(&j, r, worker_path, args, (char *const *)w->env);
  for (int r = 0; r < size; r++) job_expect_exit(j.ranks[r], 0);
  for (int r = 0; r < size; r++) job_expect_lines(j.ranks[r], expect, r, size);
  job_stop_coordinator(&j);
  if (ranks_out)
    for (int r = 0; r < size; r++) ranks_out[r] = j.ranks[r];
  return j.coord;
}

/* ---- model parallelism: a tower per rank under shared layers ------------- */

/* The coordinator runs at debug level: it must never name a tower tensor
 * (only their registrations reach it, and it does not log those), while the
 * workers' stats count every tower op as local and none as a request. */
static void towers_world(int size, const char *variant, const char *env) {
  const world_spec w = {"towers",
                        variant,
                        {env, NULL},
                        {"--log-level", "debug", "--deadlock-time-ms", "60000", NULL}};
  char summary[160];
  snprintf(summary, sizeof summary,
           "towers: local ops 15, requests sent 12 for 3 steps of 9 tensors (5 local), "
           "scale_local %d (rank %%d of %%d)",
           strcmp(variant, "scale") == 0);
  const char *const lines[] = {
      summary,
      "towers: register an empty name: GS_ERR_INVALID_ARG: gs_register_local: the tensor name is "
      "empty",
      " checks passed (rank %d of %d)", NULL};
  proc *coord = run_world(size, &w, lines, NULL);
  job_expect_output(coord, "world ready");
  job_expect_no_output(coord, "tower", 0);
}

static void test_towers_2(void **state) {
  (void)state;
  towers_world(2, "scale", NULL);
}

static void test_towers_3(void **state) {
  (void)state;
  towers_world(3, "scale", NULL);
}

static void test_towers_4(void **state) {
  (void)state;
  towers_world(4, "scale", NULL);
}

/* GRADSYNC_SCALE_LOCAL=0: local averages return the input unchanged. */
static void test_towers_noscale_env_3(void **state) {
  (void)state;
  towers_world(3, "noscale-env", "GRADSYNC_SCALE_LOCAL=0");
}

/* gs_options.scale_local = 0 wins over GRADSYNC_SCALE_LOCAL=1. */
static void test_towers_noscale_opt_2(void **state) {
  (void)state;
  towers_world(2, "noscale-opt", "GRADSYNC_SCALE_LOCAL=1");
}

/* ---- a name local on rank 0 but submitted by the others ------------------- */

/* Deadlock detection is set to 60 s: the refusal must come from the
 * conflict check, at once, not from a stall or deadlock report. */
static void conflict_world(int size) {
  const world_spec w = {"conflict", NULL, {NULL}, {"--deadlock-time-ms", "60000", NULL}};
  const char *const lines[] = {" checks passed (rank %d of %d)", NULL};
  proc *ranks[MAX_RANKS];
  proc *coord = run_world(size, &w, lines, ranks);
  /* Rank r (>= 1) submitted 'w' after ranks 1..r-1 had: the submitters
   * named accumulate. All of them had submitted 'w2' before rank 0
   * registered it. */
  static const char *const subs[] = {"", "[1]", "[1,2]", "[1-3]"};
  for (int r = 1; r < size; r++) {
    char want[512];
    const char *names[2] = {"w", "w2"};
    const char *who[2] = {subs[r], subs[size - 1]};
    for (int k = 0; k < 2; k++) {
      snprintf(want, sizeof want,
               "conflict: submit '%s' registered local on rank 0: GS_ERR_MISMATCH: tensor '%s': "
               "registered local (gs_register_local) on ranks [0] but submitted for allreduce by "
               "ranks %s; a model-parallel tensor must be registered local on every rank that "
               "holds it and never submitted, or submitted by every rank\n",
               names[k], names[k], who[k]);
      job_expect_output(ranks[r], want);
    }
  }
  job_expect_output(ranks[0], "conflict: register a name in flight: GS_ERR_INVALID_ARG: "
                              "gs_register_local: tensor 'inflight' has an op in flight on rank 0");
  job_expect_no_output(coord, "deadlock: ", 0);
  job_expect_no_output(coord, "One or more tensors were submitted", 0); /* stall report */
}

static void test_conflict_2(void **state) {
  (void)state;
  conflict_world(2);
}

static void test_conflict_3(void **state) {
  (void)state;
  conflict_world(3);
}

/* ---- compression, scaling, reduce ops ------------------------------------- */

static void test_compress_2(void **state) {
  (void)state;
  const world_spec w = {"compress", NULL, {NULL}, {NULL}};
  const char *const lines[] = {
      "compress: mix/fp16-vs-none: GS_ERR_MISMATCH: tensor 'mix/fp16-vs-none': mismatched data "
      "types: ranks [0] sent float16, ranks [1] sent float32",
      " checks passed (rank %d of %d)", NULL};
  run_world(2, &w, lines, NULL);
}

static void test_compress_3(void **state) {
  (void)state;
  const world_spec w = {"compress", NULL, {NULL}, {NULL}};
  const char *const lines[] = {
      "compress: mix/fp16-vs-bf16: GS_ERR_MISMATCH: tensor 'mix/fp16-vs-bf16': mismatched data "
      "types: ranks [0] sent float16, ranks [1,2] sent bfloat16",
      " checks passed (rank %d of %d)", NULL};
  run_world(3, &w, lines, NULL);
}

static void test_compress_4(void **state) {
  (void)state;
  const world_spec w = {"compress", NULL, {NULL}, {NULL}};
  const char *const lines[] = {" checks passed (rank %d of %d)", NULL};
  run_world(4, &w, lines, NULL);
}

static void test_scale_3(void **state) {
  (void)state;
  const world_spec w = {"scale", NULL, {NULL}, {NULL}};
  const char *const lines[] = {
      "scale: prescale differs: GS_ERR_MISMATCH: tensor 's/mismatch': mismatched prescale "
      "factors: ranks [0] sent 0.5, ranks [1,2] sent 1",
      " checks passed (rank %d of %d)", NULL};
  run_world(3, &w, lines, NULL);
}

static void test_scale_4(void **state) {
  (void)state;
  const world_spec w = {"scale", NULL, {NULL}, {NULL}};
  const char *const lines[] = {" checks passed (rank %d of %d)", NULL};
  run_world(4, &w, lines, NULL);
}

static void test_reduce_ops_3(void **state) {
  (void)state;
  const world_spec w = {"ops", NULL, {NULL}, {NULL}};
  const char *const lines[] = {
      "ops: reduce op \"mean\": GS_ERR_INVALID_ARG: unknown reduce op 'mean': valid names are "
      "sum, average, min, max, product, adasum",
      " checks passed (rank %d of %d)", NULL};
  run_world(3, &w, lines, NULL);
}

/* ---- alltoall and reducescatter ------------------------------------------- */

static void alltoall_world(int size) {
  const world_spec w = {"alltoall", NULL, {NULL}, {NULL}};
  const char *const lines[] = {"alltoall: 'a2a/uneven' done", " checks passed (rank %d of %d)",
                               NULL};
  run_world(size, &w, lines, NULL);
}

static void test_alltoall_2(void **state) {
  (void)state;
  alltoall_world(2);
}

static void test_alltoall_3(void **state) {
  (void)state;
  alltoall_world(3);
}

static void test_alltoall_4(void **state) {
  (void)state;
  alltoall_world(4);
}

static void reducescatter_world(int size) {
  const world_spec w = {"reducescatter", NULL, {NULL}, {NULL}};
  const char *const lines[] = {" checks passed (rank %d of %d)", NULL};
  run_world(size, &w, lines, NULL);
}

static void test_reducescatter_2(void **state) {
  (void)state;
  reducescatter_world(2);
}

static void test_reducescatter_3(void **state) {
  (void)state;
  reducescatter_world(3);
}

static void test_reducescatter_4(void **state) {
  (void)state;
  reducescatter_world(4);
}

/* ---- the demo: towers and an embedding, through gradsync-run -------------- */

/* The loss of each "[0] step K/N  loss X" line, in order; returns how many. */
static size_t read_losses(const char *out, double *loss, size_t cap) {
  size_t n = 0;
  for (const char *p = strstr(out, "[0] step "); p && n < cap; p = strstr(p + 1, "[0] step ")) {
    const char *l = strstr(p, "  loss ");
    const char *eol = strchr(p, '\n');
    if (!l || (eol && l > eol)) continue;
    loss[n++] = strtod(l + 7, NULL);
  }
  return n;
}

/* gradsync-run -np np gradsync-train args... with env: exits 0, says what
 * is identical (shared_what) and that the towers differ (towers_line), and
 * the loss falls. */
static void train_run(int np, const char *const *args, char *const *env, const char *shared_what,
                      const char *towers_line) {
  char npbuf[16];
  snprintf(npbuf, sizeof npbuf, "%d", np);
  char *argv[16] = {GS_BIN_DIR "/gradsync-run", "-np", npbuf, GS_BIN_DIR "/gradsync-train"};
  size_t a = 4;
  for (size_t i = 0; args[i] && a < 15; i++) argv[a++] = (char *)args[i];
  argv[a] = NULL;
  proc *p = proc_spawn("gradsync-run", argv, env);
  if (p == NULL) job_fail("could not start gradsync-run");
  job_expect_exit(p, 0);
  char want[128];
  snprintf(want, sizeof want, "[0] parameters identical on all %d ranks (checksum 0x", np);
  job_expect_output(p, want);
  job_expect_output(p, shared_what);
  job_expect_output(p, towers_line);
  char *out = proc_output(p);
  double loss[64];
  size_t n = read_losses(out, loss, 64);
  free(out);
  if (n < 5) job_fail("gradsync-train logged %zu loss lines, expected at least 5", n);
  if (!(loss[n - 1] < 0.75 * loss[0]))
    job_fail("the loss did not fall: first %.4f, last %.4f", loss[0], loss[n - 1]);
  size_t left = proc_strays(5000);
  if (left != 0) job_fail("gradsync-run left %zu process(es) running", left);
}

static void test_train_towers_embedding_3(void **state) {
  (void)state;
  const char *const args[] = {"--towers", "--embedding", "--steps", "60", NULL};
  train_run(3, args, NULL, ": shared layers and embedding table; the towers are per rank)",
            "[0] towers differ on all 3 ranks (3 distinct checksums; 120 local ops per rank, never "
            "sent)");
}

/* Without local scaling the towers still train (and still differ). */
static void test_train_towers_noscale_2(void **state) {
  (void)state;
  const char *const args[] = {"--towers", "--steps", "40", NULL};
  char *env[] = {"GRADSYNC_SCALE_LOCAL=0", NULL};
  train_run(2, args, env, ": shared layers; the towers are per rank)",
            "[0] towers differ on all 2 ranks (2 distinct checksums; 80 local ops per rank, never "
            "sent)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_towers_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_towers_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_towers_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_towers_noscale_env_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_towers_noscale_opt_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_conflict_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_conflict_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_compress_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_compress_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_compress_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_scale_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_scale_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_reduce_ops_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_alltoall_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_alltoall_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_alltoall_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_reducescatter_2, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_reducescatter_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_reducescatter_4, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_train_towers_embedding_3, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_train_towers_noscale_2, setup, job_teardown),
  };
  return cmocka_run_group_tests_name("models", tests, NULL, NULL);
}
