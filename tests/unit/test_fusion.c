/* Unit tests of common/fusion_layout.c's grouping (gs__fusion_group): the
 * worker's fast rounds build their own plans with it, and every rank must
 * fuse exactly as the coordinator's engine would. Checked two ways: hand-
 * made cases with the expected responses, and random request lists fed to
 * a real engine (one rank, window policy: one plan with every ready
 * request) whose plan must match gs__fusion_group's grouping tensor for
 * tensor. No sockets, no sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "status.h"
#include "fusion_layout.h"

static gs__tensor_request req(const char *name, gs__op_type op, gs__dtype dt, int64_t elems) {
  gs__tensor_request r;
  gs__tensor_request_init(&r);
  snprintf(r.name, sizeof r.name, "%s", name);
  r.op = op;
  r.dtype = dt;
  r.ndim = 1;
  r.shape[0] = elems;
  return r;
}

/* Groups reqs and checks the responses against want: one string per
 * response, its tensors' names joined by ','. */
static void expect_groups(const gs__tensor_request *reqs, size_t n, uint64_t threshold,
                          const char *const *want, size_t nwant) {
  const gs__tensor_request **p = calloc(n ? n : 1, sizeof *p);
  size_t *order = calloc(n ? n : 1, sizeof *order), *starts = calloc(n + 1, sizeof *starts);
  unsigned char *taken = calloc(n ? n : 1, 1);
  assert_non_null(p);
  assert_non_null(order);
  assert_non_null(starts);
  assert_non_null(taken);
  for (size_t i = 0; i < n; i++) p[i] = &reqs[i];
  size_t nr = gs__fusion_group(p, n, threshold, taken, order, starts);
  assert_int_equal(nr, nwant);
  for (size_t r = 0; r < nr; r++) {
    char got[1024] = "";
    for (size_t k = starts[r]; k < starts[r + 1]; k++) {
      size_t len = strlen(got);
      snprintf(got + len, sizeof got - len, "%s%s", k > starts[r] ? "," : "", reqs[order[k]].name);
    }
    assert_string_equal(got, want[r]);
  }
  assert_int_equal(starts[nr], n);
  free(p);
  free(order);
  free(starts);
  free(taken);
}

static void test_group_by_hand(void **state) {
  (void)state;
  /* 4 B tensors take 64 B each (CPU alignment): 3 fit in 192 B. */
  gs__tensor_request a[] = {
      req("a", GS__OP_ALLREDUCE, GS__FLOAT32, 1), req("b", GS__OP_ALLREDUCE, GS__FLOAT32, 1),
      req("c", GS__OP_ALLREDUCE, GS__FLOAT32, 1), req("d", GS__OP_ALLREDUCE, GS__FLOAT32, 1)};
  expect_groups(a, 4, 192, (const char *[]){"a,b,c", "d"}, 2);
  expect_groups(a, 4, 1 << 20, (const char *[]){"a,b,c,d"}, 1);
  expect_groups(a, 4, 0, (const char *[]){"a", "b", "c", "d"}, 4); /* 0: no fusion */
  expect_groups(a, 0, 1 << 20, NULL, 0);

  /* Broadcasts and reducescatters stand alone; an incompatible allreduce
   * (another dtype, reduce op, scale) is skipped over and starts a later
   * response; the compatible ones after it are looked ahead into the first. */
  gs__tensor_request m[] = {req("p1", GS__OP_ALLREDUCE, GS__FLOAT32, 4),
                            req("bc", GS__OP_BROADCAST, GS__FLOAT32, 4),
                            req("d64", GS__OP_ALLREDUCE, GS__FLOAT64, 4),
                            req("mx", GS__OP_ALLREDUCE, GS__FLOAT32, 4),
                            req("rs", GS__OP_REDUCESCATTER, GS__FLOAT32, 4),
                            req("p2", GS__OP_ALLREDUCE, GS__FLOAT32, 4),
                            req("ps", GS__OP_ALLREDUCE, GS__FLOAT32, 4),
                            req("e64", GS__OP_ALLREDUCE, GS__FLOAT64, 4)};
  m[3].reduce_op = GS__MAX;
  m[6].postscale = 0.5;
  expect_groups(m, 8, 1 << 20, (const char *[]){"p1,p2", "bc", "d64,e64", "mx", "rs", "ps"}, 6);

  /* A tensor larger than the threshold goes alone; the skipped bytes stop
   * the look-ahead once they pass the threshold. */
  gs__tensor_request s[] = {req("x", GS__OP_ALLREDUCE, GS__FLOAT32, 8),
                            req("big", GS__OP_ALLREDUCE, GS__FLOAT64, 1000),
                            req("y", GS__OP_ALLREDUCE, GS__FLOAT32, 8)};
  expect_groups(s, 3, 4096, (const char *[]){"x", "big", "y"}, 3);
  expect_groups(s, 3, 8192, (const char *[]){"x,y", "big"}, 2);
}

/* ---- parity with the engine -------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The engine's plan for reqs (one rank, window policy): every request is
 * ready at once and the tick emits them all in one plan. */
static gs__plan *engine_plan(gs__engine **e, gs__outbox *box, const gs__tensor_request *reqs,
                             size_t n, uint64_t threshold) {
  gs__engine_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.world_size = 1;
  cfg.job.cycle_time_us = 1000;
  cfg.job.fusion_threshold_bytes = threshold;
  cfg.job.cache_capacity = 0;
  cfg.job.stall_warning_s = 60;
  cfg.job.deadlock_time_ms = 5000;
  cfg.job.heartbeat_ms = 1000;
  cfg.job.rank_timeout_ms = 30000;
  cfg.policy = GS__POLICY_WINDOW;
  cfg.max_plans_in_flight = 1;
  assert_int_equal(gs__engine_create(&cfg, e), GS__OK);
  gs__join_request jr;
  memset(&jr, 0, sizeof jr);
  jr.size = 1;
  jr.local_size = 1;
  snprintf(jr.host, sizeof jr.host, "h");
  snprintf(jr.version, sizeof jr.version, "0.1.0");
  gs__join_response resp;
  char err[256];
  uint64_t now = 1000000;
  assert_int_equal(gs__engine_join(*e, &jr, now, &resp, err, sizeof err), GS__OK);
  assert_int_equal(gs__engine_session_open(*e, 0, now, box, err, sizeof err), GS__OK);
  gs__outbox_clear(box);
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.nrequests = n;
  m.requests = (gs__tensor_request *)reqs;
  gs__engine_rank_message(*e, 0, &m, now + 1, box);
  gs__engine_tick(*e, now + 100, box);
  for (size_t i = 0; i < box->n; i++)
    if (box->items[i].kind != GS__OUT_LOG && box->items[i].msg.kind == GS__MSG_PLAN)
      return &box->items[i].msg.plan;
  fail_msg("the engine emitted no plan for %zu requests", n);
  return NULL;
}

static void test_group_matches_engine(void **state) {
  (void)state;
  enum { N = 60 };
  static const gs__op_type ops[] = {GS__OP_ALLREDUCE, GS__OP_ALLREDUCE, GS__OP_ALLREDUCE,
                                    GS__OP_ALLREDUCE, GS__OP_BROADCAST, GS__OP_REDUCESCATTER};
  static const gs__dtype dts[] = {GS__FLOAT32, GS__FLOAT32, GS__FLOAT64, GS__FLOAT16, GS__INT8};
  static const uint64_t thresholds[] = {0, 64, 1000, 4096, 65536, 1 << 20};
  for (uint64_t seed = 1; seed <= 40; seed++) {
    gs__tensor_request reqs[N];
    const gs__tensor_request *p[N];
    for (size_t i = 0; i < N; i++) {
      uint64_t x = mix(seed * 1000 + i);
      char name[32];
      snprintf(name, sizeof name, "t%zu", i);
      reqs[i] = req(name, ops[x % 6], dts[(x >> 8) % 5], (int64_t)(1 + (x >> 16) % 700));
      if ((x >> 32) % 7 == 0) reqs[i].reduce_op = GS__MAX;
      if ((x >> 36) % 9 == 0) reqs[i].postscale = 0.25;
      p[i] = &reqs[i];
    }
    uint64_t threshold = thresholds[seed % 6];
    gs__engine *e = NULL;
    gs__outbox box;
    memset(&box, 0, sizeof box);
    const gs__plan *plan = engine_plan(&e, &box, reqs, N, threshold);
    size_t order[N], starts[N + 1];
    unsigned char taken[N];
    size_t nr = gs__fusion_group(p, N, threshold, taken, order, starts);
    if (nr != plan->nresponses)
      fail_msg("seed %llu threshold %llu: %zu responses, the engine made %zu",
               (unsigned long long)seed, (unsigned long long)threshold, nr, plan->nresponses);
    for (size_t r = 0; r < nr; r++) {
      const gs__response *rp = &plan->responses[r];
      assert_int_equal(rp->ntensors, starts[r + 1] - starts[r]);
      for (size_t k = 0; k < rp->ntensors; k++)
        assert_string_equal(rp->tensors[k].name, reqs[order[starts[r] + k]].name);
    }
    gs__outbox_free(&box);
    gs__engine_destroy(e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_group_by_hand),
      cmocka_unit_test(test_group_matches_engine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
