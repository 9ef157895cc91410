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

#include "proc.h"

#define GUARD_MS 120000
#define MAX_RANKS 8

static const char worker_path[] = GS_BIN_DIR "/gs-test-worker";

typedef struct world {
  proc *coord;
  char addr[128];
  int size;
  proc *ranks[MAX_RANKS];
} world;

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
  return proc_test_begin("case", GUARD_MS);
}

static int teardown(void **state) {
  (void)state;
  proc_test_end();
  return 0;
}

static void start_coordinator(world *w, int size) {
  memset(w, 0, sizeof *w);
  w->size = size;
  w->coord = proc_start_gradsyncd(GS_BIN_DIR, size, NULL, w->addr, sizeof w->addr);
  if (w->coord == NULL) fail_with_dump("gradsyncd did not start (see its output above)");
}

/* Starts gs-test-worker ARGS... as rank `rank` of w, with the worker
 * environment plus env_extra (NULL-terminated "NAME=value", may be NULL). */
static proc *start_rank(world *w, int rank, char *const args[], char *const env_extra[]) {
  char coord[160], r[32], s[32], lr[40], ls[40];
  snprintf(coord, sizeof coord, "GRADSYNC_COORDINATOR=%s", w->addr);
  snprintf(r, sizeof r, "GRADSYNC_RANK=%d", rank);
  snprintf(s, sizeof s, "GRADSYNC_SIZE=%d", w->size);
  snprintf(lr, sizeof lr, "GRADSYNC_LOCAL_RANK=%d", rank);
  snprintf(ls, sizeof ls, "GRADSYNC_LOCAL_SIZE=%d", w->size);
  /* Fail well inside the hang guard if a join goes wrong; an extra of the
   * same name overrides this default (proc_spawn keeps the last). */
  char *env[16] = {coord, r, s, lr, ls, "GRADSYNC_JOIN_TIMEOUT_MS=30000"};
  size_t n = 6;
  for (size_t i = 0; env_extra && env_extra[i] && n < 15; i++) env[n++] = env_extra[i];
  env[n] = NULL;

  char *argv[16] = {(char *)worker_path};
  size_t argc = 1;
  for (size_t i = 0; args[i] && argc < 15; i++) argv[argc++] = args[i];
  argv[argc] = NULL;

  char label[32];
  snprintf(label, sizeof label, "rank %d", rank);
  proc *p = proc_spawn(label, argv, env);
  if (p == NULL) fail_with_dump("could not start %s as rank %d", worker_path, rank);
  return p;
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
  if (!found)
    fail_with_dump("%s: the join timeout does not name rank %d as missing", p->label, rank);
}

/* SIGTERM: gradsyncd must exit 0. */
static void stop_coordinator(world *w) {
  proc_signal(w->coord, SIGTERM);
  expect_exit(w->coord, 0);
}

/* Runs gs-test-worker ARGS... on every rank of a new world of `size`; each
 * must exit 0 and print expect (with "%d" replaced by its rank if present). */
static void run_world(int size, char *const args[], const char *expect) {
  world w;
  start_coordinator(&w, size);
  for (int r = 0; r < size; r++) w.ranks[r] = start_rank(&w, r, args, NULL);
  for (int r = 0; r < size; r++) expect_exit(w.ranks[r], 0);
  for (int r = 0; r < size; r++) {
    char want[256];
    snprintf(want, sizeof want, expect, r, size);
    expect_output(w.ranks[r], want);
  }
  stop_coordinator(&w);
}

/* ---- every op x dtype x placement x count against a local reference ------ */

/* 336 tensors (5 ops x 8 dtypes x 2 placements x 4 counts, plus count 0 for
 * sum) x 2 rounds (the second through the response cache). */

static void ops_world(int size) {
  char *args[] = {"ops", NULL};
  world w;
  start_coordinator(&w, size);
  for (int r = 0; r < size; r++) w.ranks[r] = start_rank(&w, r, args, NULL);
  for (int r = 0; r < size; r++) expect_exit(w.ranks[r], 0);
  for (int r = 0; r < size; r++) {
    char want[128];
    expect_output(w.ranks[r], "ops: 672 checks passed (336 tensors x 2 rounds");
    snprintf(want, sizeof want, "rank %d of %d)", r, size);
    expect_output(w.ranks[r], want);
  }
  stop_coordinator(&w);
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

/* ---- a shape mismatch fails the op on every rank, the job goes on ----- */

static void test_mismatch_3(void **state) {
  (void)state;
  char *args[] = {"mismatch", NULL};
  world w;
  start_coordinator(&w, 3);
  for (int r = 0; r < 3; r++) w.ranks[r] = start_rank(&w, r, args, NULL);
  for (int r = 0; r < 3; r++) expect_exit(w.ranks[r], 0);
  for (int r = 0; r < 3; r++) {
    char want[256];
    snprintf(want, sizeof want,
             "mismatch: rank %d: GS_ERR_MISMATCH: tensor 'dense/kernel': mismatched shapes: "
             "ranks [0,2] sent [17,17], ranks [1] sent [18,18]\n",
             r);
    expect_output(w.ranks[r], want);
    snprintf(want, sizeof want, "mismatch: passed (rank %d of 3)", r);
    expect_output(w.ranks[r], want);
  }
  stop_coordinator(&w);
}

/* ---- a second process joining as rank 0 is refused ------------------- */

static void test_duplicate_join(void **state) {
  (void)state;
  char *hold[] = {"hold", "3000", NULL};
  world w;
  start_coordinator(&w, 2);
  proc *first = start_rank(&w, 0, hold, NULL);
  /* Give the first a head start; whichever of the two joins second must be
   * refused, so the outcome does not depend on this pause. */
  usleep(1000 * 1000);
  proc *second = start_rank(&w, 0, hold, NULL);
  snprintf(second->label, sizeof second->label, "rank 0 (second)");

  proc *both[2] = {first, second};
  size_t idx = 0;
  if (proc_wait_any(both, 2, 60000, &idx) != 0)
    fail_with_dump("neither rank-0 process was refused: both hung");
  proc *loser = both[idx], *winner = both[1 - idx];
  if (proc_exit_code(loser) == 0)
    fail_with_dump("%s exited 0 although another process holds rank 0", loser->label);
  expect_output(loser, "GS_ERR_ALREADY_JOINED");
  expect_output(loser, "rank 0 already joined");
  if (winner->exited)
    fail_with_dump("%s was also refused (exit %d)", winner->label, proc_exit_code(winner));

  /* The refusal did not disturb the rank 0 that holds the slot. */
  proc *r1 = start_rank(&w, 1, hold, NULL);
  expect_exit(winner, 0);
  expect_exit(r1, 0);
  expect_output(winner, "hold: passed (rank 0 of 2)");
  expect_output(r1, "hold: passed (rank 1 of 2)");
  stop_coordinator(&w);
}

/* ---- a rank that never joins is named by the join timeout ------------- */

static void test_never_joined(void **state) {
  (void)state;
  char *join[] = {"join", NULL};
  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=2000", NULL};
  world w;
  start_coordinator(&w, 3);
  proc *r0 = start_rank(&w, 0, join, env);
  proc *r1 = start_rank(&w, 1, join, env);
  /* A hang bound, not a timing check: with GRADSYNC_JOIN_TIMEOUT_MS=2000
   * both must give up long before the 60 s default would end the wait. */
  if (proc_wait(r0, 30000) != 0 || proc_wait(r1, 30000) != 0)
    fail_with_dump("gs_init ignored GRADSYNC_JOIN_TIMEOUT_MS=2000: still waiting after 30 s");
  expect_exit(r0, 3);
  expect_exit(r1, 3);
  expect_output(r0, "join: gs_init failed: GS_ERR_JOIN_TIMEOUT: ");
  expect_output(r1, "join: gs_init failed: GS_ERR_JOIN_TIMEOUT: ");
  /* Both name rank 2. The one that gives up second may also name the
   * first (its slot is free again once it left), so rank 2 must be in the
   * list, not the whole list. */
  expect_missing(r0, 2);
  expect_missing(r1, 2);
  stop_coordinator(&w);
}

/* ---- the launcher and the demo --------------------------------------- */

static void test_gradsync_run_train(void **state) {
  (void)state;
  char *argv[] = {
      GS_BIN_DIR "/gradsync-run", "-np", "3", GS_BIN_DIR "/gradsync-train", "--steps", "50", NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) fail_with_dump("could not start gradsync-run");
  expect_exit(p, 0);
  expect_output(p, "parameters identical on all 3 ranks");
  size_t left = proc_strays(5000);
  if (left != 0) fail_with_dump("gradsync-run left %zu process(es) running", left);
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
  if (p == NULL) fail_with_dump("could not start gradsync-run");
  expect_exit(p, 7);
  expect_output(p, "exit-code: rank 1 exits with 7 before joining");
  size_t left = proc_strays(5000);
  if (left != 0) fail_with_dump("gradsync-run left %zu process(es) running", left);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ops_1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ops_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ops_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ops_4, setup, teardown),
      cmocka_unit_test_setup_teardown(test_random_order_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_random_order_4, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mismatch_3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_join, setup, teardown),
      cmocka_unit_test_setup_teardown(test_never_joined, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gradsync_run_train, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gradsync_run_exit_status, setup, teardown),
  };
  return cmocka_run_group_tests_name("integration", tests, NULL, NULL);
}
