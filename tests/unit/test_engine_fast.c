/* Unit tests of the engine's fast path (issue 14, server/engine/fast.c):
 * the marker Plan.fast_after and each of its conditions, the hold of every
 * plan until every connected rank escalated, a leave in fast mode (FastStop
 * with abort_round to the others, the pending ops failed naming the rank),
 * a timeline start (FastStop without abort_round, no marker while it
 * records, an empty plan with the marker once it stops), no deadlock check
 * in fast mode, the marker on a template replay, fast reports in the
 * status, fast-pending ops in ListPending, ListStalls, the stall inspector
 * and a lost rank's abort, and the bounds on what a rank reports.
 *
 * Driven through the engine's event interface with a fake clock, as
 * test_engine.c; no sockets, no sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "engine.h"
#include "engine_fixture.h"
#include "messages.h"
#include "status.h"

/* ---- fixture ----------------------------------------------------------------- */

/* gradsyncd --fast-path-backoff of the engines start_raw makes (64,
 * gradsyncd's default). */
static uint32_t backoff_max = GS__FAST_BACKOFF_MAX;

/* An engine of n ranks, every rank joined (as host-<r>, pid 1000 + r) and
 * connected, outbox empty. No fusion (one response per tensor), a cache of
 * 1024 unless cache_capacity says otherwise, and the fast path as given.
 * Every rank's hello says it runs fast rounds, but rank `raw`'s. */
static void start_raw(fx *f, int32_t n, int fast_path, uint32_t cache_capacity, int32_t raw) {
  if (f->e) {
    gs__outbox_clear(&f->box);
    gs__engine_destroy(f->e);
  }
  gs__engine_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.world_size = n;
  cfg.job.cycle_time_us = 5000;
  cfg.job.cache_capacity = cache_capacity;
  cfg.job.stall_warning_s = 60;
  cfg.job.deadlock_time_ms = 5000;
  cfg.job.heartbeat_ms = 1000;
  cfg.job.rank_timeout_ms = 300000;
  cfg.policy = GS__POLICY_ADAPTIVE;
  cfg.max_plans_in_flight = 1 << 20;
  cfg.fast_path = fast_path;
  cfg.fast_backoff_max = backoff_max;
  assert_int_equal(gs__engine_create(&cfg, &f->e), GS__OK);
  f->world = n;
  for (int32_t r = 0; r < n; r++) {
    gs__join_request req;
    memset(&req, 0, sizeof req);
    req.rank = r;
    req.size = n;
    snprintf(req.host, sizeof req.host, "host-%d", r);
    req.pid = 1000 + r;
    gs__join_response resp;
    char err[512];
    assert_int_equal(gs__engine_join(f->e, &req, tick(f), &resp, err, sizeof err), GS__OK);
  }
  for (int32_t r = 0; r < n; r++) {
    char err[512];
    assert_int_equal(gs__engine_session_open(f->e, r, tick(f), &f->box, err, sizeof err), GS__OK);
    /* As the coordinator does: the hello message goes to the engine too,
     * saying the rank runs fast rounds (all but `raw`). */
    gs__rank_msg hello;
    memset(&hello, 0, sizeof hello);
    hello.has_hello = 1;
    hello.hello_rank = r;
    hello.hello_fast_path = r != raw;
    gs__engine_rank_message(f->e, r, &hello, tick(f), &f->box);
  }
  gs__outbox_clear(&f->box);
}

static void start_ex(fx *f, int32_t n, int fast_path, uint32_t cache_capacity) {
  start_raw(f, n, fast_path, cache_capacity, -1);
}

static void start(fx *f, int32_t n) {
  start_ex(f, n, 1, 1024);
}

static gs__engine_stats stats(const fx *f) {
  gs__engine_stats st;
  gs__engine_get_stats(f->e, &st);
  return st;
}

static gs__tensor_request ar_shape(const char *name, int64_t n) {
  gs__tensor_request r;
  gs__tensor_request_init(&r);
  snprintf(r.name, sizeof r.name, "%s", name);
  r.op = GS__OP_ALLREDUCE;
  r.ndim = 1;
  r.shape[0] = n;
  return r;
}

/* An allreduce of float32 [4]. */
static gs__tensor_request ar(const char *name) {
  return ar_shape(name, 4);
}

static void send_msg(fx *f, int32_t rank, gs__rank_msg *m) {
  gs__engine_rank_message(f->e, rank, m, tick(f), &f->box);
}

static void send_full(fx *f, int32_t rank, gs__tensor_request r) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.nrequests = 1;
  m.requests = &r;
  send_msg(f, rank, &m);
}

/* Cache ids (any number) and escalate_round (0: none) in one message. */
static void send_ids(fx *f, int32_t rank, const uint32_t *ids, size_t n, uint64_t round) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.ncached = n;
  m.cached = (uint32_t *)ids;
  m.escalate_round = round;
  send_msg(f, rank, &m);
}

static void escalate(fx *f, int32_t rank, uint64_t round) {
  send_ids(f, rank, NULL, 0, round);
}

static void send_leave(fx *f, int32_t rank) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.has_leave = 1;
  send_msg(f, rank, &m);
}

static void send_blocked(fx *f, int32_t rank, const char *name) {
  char names[1][GS__MAX_NAME + 1];
  snprintf(names[0], sizeof names[0], "%s", name);
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.blocked_update = 1;
  m.nblocked = 1;
  m.blocked_on = names;
  send_msg(f, rank, &m);
}

/* Every rank submits ar(name) in full: one plan for it, carrying the
 * marker; returns its cache id. */
static uint32_t first_step(fx *f, const char *name) {
  gs__outbox_clear(&f->box);
  for (int32_t r = 0; r < f->world; r++) send_full(f, r, ar(name));
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->nresponses, 1);
  assert_int_equal(p->responses[0].kind, GS__RESP_COLLECTIVE);
  assert_string_equal(p->responses[0].tensors[0].name, name);
  assert_int_equal(p->fast_after, 1);
  uint32_t id = p->responses[0].tensors[0].cache_id;
  assert_int_not_equal(id, 0);
  assert_int_equal(stats(f).fast_mode, 1);
  gs__outbox_clear(&f->box);
  return id;
}

/* ---- the marker ------------------------------------------------------------- */

/* The plan that empties the table carries fast_after; one that leaves an
 * entry pending does not; with the fast path off, an empty cache or a
 * coordinator draining, none does. */
static void test_marker_on_the_plan_that_empties_the_table(void **state) {
  fx *f = *state;
  start(f, 2);
  send_full(f, 0, ar("b")); /* b from rank 0 only */
  send_full(f, 0, ar("a"));
  assert_int_equal(nmsgs(f), 0);
  send_full(f, 1, ar("a"));
  const gs__plan *p = only_plan(f);
  assert_string_equal(p->responses[0].tensors[0].name, "a");
  assert_int_equal(p->fast_after, 0); /* b is still pending */
  assert_int_equal(stats(f).fast_mode, 0);
  gs__outbox_clear(&f->box);
  send_full(f, 1, ar("b"));
  p = only_plan(f);
  assert_string_equal(p->responses[0].tensors[0].name, "b");
  assert_int_equal(p->fast_after, 1);
  gs__engine_stats st = stats(f);
  assert_int_equal(st.fast_mode, 1);
  assert_int_equal(st.fast_entries, 1);

  /* --fast-path off: never. */
  start_ex(f, 2, 0, 1024);
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  assert_int_equal(only_plan(f)->fast_after, 0);
  assert_int_equal(stats(f).fast_mode, 0);
  gs__outbox_clear(&f->box);
  uint32_t id = 1;
  send_ids(f, 0, &id, 1, 0);
  send_ids(f, 1, &id, 1, 0);
  assert_int_equal(only_plan(f)->fast_after, 0); /* planned at once, as always */

  /* No cache (capacity 0): nothing the ranks could agree on. */
  start_ex(f, 2, 1, 0);
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  assert_int_equal(only_plan(f)->fast_after, 0);

  /* The cache empty: an allgather is never cached. */
  start(f, 2);
  gs__tensor_request g = ar("g");
  g.op = GS__OP_ALLGATHER;
  send_full(f, 0, g);
  send_full(f, 1, g);
  assert_int_equal(only_plan(f)->responses[0].tensors[0].cache_id, 0);
  assert_int_equal(only_plan(f)->fast_after, 0);

  /* A rank whose hello did not say it runs fast rounds (a raw-protocol
   * client, an older worker): never, since it would never escalate. */
  start_raw(f, 3, 1, 1024, 1);
  for (int step = 0; step < 2; step++) {
    for (int32_t r = 0; r < 3; r++) send_full(f, r, ar("a"));
    assert_int_equal(only_plan(f)->fast_after, 0);
    gs__outbox_clear(&f->box);
  }
  assert_int_equal(stats(f).fast_entries, 0);

  /* Draining (SIGTERM): no marker. */
  start(f, 2);
  gs__engine_set_draining(f->e);
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  assert_int_equal(only_plan(f)->fast_after, 0);
  assert_int_equal(stats(f).fast_mode, 0);
}

/* Every rank must be there: a rank out of data (gs_join: its join entry
 * stays in the table until every rank joined) or one that left keeps the
 * job on the coordinator's plans. */
static void test_no_marker_with_a_joined_or_departed_rank(void **state) {
  fx *f = *state;
  start(f, 3);
  gs__tensor_request join = ar("gs.join");
  join.op = GS__OP_JOIN;
  join.ndim = 0;
  send_full(f, 2, join); /* rank 2 ran out of data */
  send_full(f, 0, ar("t"));
  send_full(f, 1, ar("t"));
  const gs__plan *p = only_plan(f);
  assert_string_equal(p->responses[0].tensors[0].name, "t");
  assert_int_not_equal(p->responses[0].tensors[0].cache_id, 0);
  assert_int_equal(p->fast_after, 0);
  gs__outbox_clear(&f->box);

  start(f, 3);
  send_leave(f, 2);
  gs__outbox_clear(&f->box);
  send_full(f, 0, ar("t")); /* fails at once: rank 2 left */
  p = only_plan(f);
  assert_int_equal(p->responses[0].kind, GS__RESP_ERROR); /* rank 2 left */
  assert_int_equal(p->fast_after, 0);
  assert_int_equal(stats(f).fast_mode, 0);
}

/* ---- fast mode: the hold and the escalation ----------------------------------- */

/* In fast mode requests are stored and validated but no plan goes out,
 * errors included, until every connected rank escalated; then the ready
 * ones go out at once, and the plan that empties the table carries the
 * marker again. Per-rank errors are not plans: they go out at once. */
static void test_hold_until_every_rank_escalates(void **state) {
  fx *f = *state;
  start(f, 3);
  first_step(f, "a");
  uint64_t plans = stats(f).plans_emitted;
  /* A new tensor b: every rank sends it in full (no escalation yet: sent
   * before the marker reached them). Complete, but held. The first such
   * request asks every rank back, once: that rank's next round cannot be
   * clear, and it may have nothing left to start one with. */
  for (int32_t r = 0; r < 3; r++) send_full(f, r, ar("b"));
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(nmsgs(f), 1);
  assert_int_equal(o->kind, GS__OUT_TO_ALL);
  assert_int_equal(o->msg.kind, GS__MSG_FAST_STOP);
  assert_int_equal(o->msg.abort_round, 0);
  assert_string_equal(o->msg.text, "rank 0 (host-0:1000) sent 'b' to the coordinator before the "
                                   "fast path began on it: every rank leaves the fast path at its "
                                   "next round, so that the coordinator plans it");
  assert_int_equal(stats(f).fast_stops, 1);
  gs__outbox_clear(&f->box);
  escalate(f, 2, 8);
  escalate(f, 0, 8);
  assert_int_equal(nmsgs(f), 0);
  gs__engine_stats st = stats(f);
  assert_int_equal(st.plans_emitted, plans);
  assert_int_equal(st.pending_tensors, 1);
  assert_int_equal(st.fast_mode, 1);
  escalate(f, 1, 8); /* the last connected rank */
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->seq, plans + 1);
  assert_string_equal(p->responses[0].tensors[0].name, "b");
  assert_int_equal(p->fast_after, 1); /* b emptied the table */
  st = stats(f);
  assert_int_equal(st.fast_mode, 1);
  assert_int_equal(st.fast_entries, 2);
}

/* The same, from a job whose first step negotiates two tensors at once. */
static void test_hold_then_emit_with_errors(void **state) {
  fx *f = *state;
  start(f, 3);
  for (int32_t r = 0; r < 3; r++) {
    gs__tensor_request two[2] = {ar("a"), ar("b")};
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.nrequests = 2;
    m.requests = two;
    send_msg(f, r, &m);
  }
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->nresponses, 2);
  assert_int_equal(p->fast_after, 1);
  uint32_t ids[2] = {p->responses[0].tensors[0].cache_id, p->responses[1].tensors[0].cache_id};
  assert_string_equal(p->responses[1].tensors[0].name, "b");
  uint64_t seq = p->seq;
  gs__outbox_clear(&f->box);

  /* Rank 0's ids arrive without an escalation (sent before the marker
   * reached it): stored, not planned; the ranks are asked back. */
  send_ids(f, 0, ids, 2, 0);
  assert_int_equal(nmsgs(f), 1);
  assert_int_equal(msg_at(f, 0)->msg.kind, GS__MSG_FAST_STOP);
  assert_contains(msg_at(f, 0)->msg.text, "rank 0 (host-0:1000) sent 'a' to the coordinator");
  gs__outbox_clear(&f->box);
  /* Validation still runs: a second 'a' from rank 0 fails at once, for it
   * alone. */
  send_full(f, 0, ar("a"));
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(nmsgs(f), 1);
  assert_int_equal(o->kind, GS__OUT_TO_RANK);
  assert_int_equal(o->rank, 0);
  assert_int_equal(o->msg.kind, GS__MSG_RANK_ERROR);
  assert_int_equal(o->msg.status, GS__ERR_DUPLICATE_NAME);
  assert_string_equal(o->msg.text, "tensor 'a': rank 0 submitted it again while its earlier "
                                   "allreduce is still in flight; wait for the first op to "
                                   "complete before reusing the name");
  gs__outbox_clear(&f->box);

  /* Rank 1 escalates with a and a b of another shape; rank 2 with both. */
  gs__tensor_request b8 = ar_shape("b", 8);
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.ncached = 1;
  m.cached = &ids[0];
  m.nrequests = 1;
  m.requests = &b8;
  m.escalate_round = 4;
  send_msg(f, 1, &m);
  assert_int_equal(nmsgs(f), 0);
  send_ids(f, 2, ids, 2, 4);
  assert_int_equal(nmsgs(f), 0); /* a and b are complete, and held */
  gs__engine_stats st = stats(f);
  assert_int_equal(st.fast_mode, 1);
  assert_int_equal(st.pending_tensors, 2);
  assert_int_equal(st.plans_emitted, seq);

  /* Rank 0, the last, escalates: normal mode, both go out in one plan. */
  escalate(f, 0, 4);
  p = only_plan(f);
  assert_int_equal(p->seq, seq + 1);
  assert_int_equal(p->nresponses, 2);
  assert_int_equal(p->responses[0].kind, GS__RESP_COLLECTIVE);
  assert_string_equal(p->responses[0].tensors[0].name, "a");
  assert_int_equal(p->responses[1].kind, GS__RESP_ERROR);
  assert_int_equal(p->responses[1].error_status, GS__ERR_MISMATCH);
  assert_string_equal(p->responses[1].error_message,
                      "tensor 'b': mismatched shapes: ranks [0,2] sent [4], ranks [1] sent [8]");
  /* b's id went stale with the other shape; the table is empty and a is
   * cached: the marker again. */
  assert_int_equal(p->nevicted, 1);
  assert_int_equal(p->evicted[0], ids[1]);
  assert_int_equal(p->fast_after, 1);
  st = stats(f);
  assert_int_equal(st.fast_mode, 1);
  assert_int_equal(st.fast_entries, 2);
  gs__outbox_clear(&f->box);

  /* A partial table after the escalation: no marker until it empties. */
  escalate(f, 0, 9);
  escalate(f, 1, 9);
  send_ids(f, 2, ids, 1, 9); /* a from rank 2 only */
  assert_int_equal(nmsgs(f), 0);
  assert_int_equal(stats(f).fast_mode, 0);
  send_ids(f, 0, ids, 1, 0);
  assert_int_equal(nmsgs(f), 0);
  send_ids(f, 1, ids, 1, 0);
  p = only_plan(f);
  assert_int_equal(p->nresponses, 1);
  assert_string_equal(p->responses[0].tensors[0].name, "a");
  assert_int_equal(p->fast_after, 1);
}

/* Ranks whose round results differ cannot happen; when they do, the log
 * says which ranks escalated after which round. An escalation outside
 * fast mode changes nothing. */
static void test_escalation_rounds_disagree_logged(void **state) {
  fx *f = *state;
  start(f, 2);
  first_step(f, "a");
  escalate(f, 0, 5);
  assert_null(logged(f, "disagree"));
  escalate(f, 1, 6);
  const char *line = logged(f, "disagree");
  assert_non_null(line);
  assert_string_equal(line, "rank 1 (host-1:1001) left fast mode after fast round 6 but rank 0 "
                            "(host-0:1000) after round 5: the ranks disagree on the fast rounds "
                            "they ran (a gradsync bug: report it with both ranks' logs)");
  /* Nothing was pending: the table is empty, so the marker goes out at
   * once on an empty plan. */
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->nresponses, 0);
  assert_int_equal(p->fast_after, 1);
  assert_int_equal(stats(f).fast_entries, 2);

  /* Outside fast mode an escalation changes nothing. */
  start_ex(f, 2, 0, 1024);
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  gs__outbox_clear(&f->box);
  escalate(f, 0, 7);
  assert_int_equal(nmsgs(f), 0);
  assert_int_equal(stats(f).fast_mode, 0);
}

/* ---- deadlocks ---------------------------------------------------------------- */

/* No deadlock check in fast mode (ranks blocked on fast ops look like no
 * progress); the escalation counts as activity, so the window starts
 * there. */
static void test_no_deadlock_check_in_fast_mode(void **state) {
  fx *f = *state;
  start(f, 2);
  first_step(f, "a");
  send_blocked(f, 0, "x");
  send_blocked(f, 1, "y");
  f->now += 60000;
  gs__engine_tick(f->e, f->now, &f->box);
  gs__engine_stats st = stats(f);
  assert_int_equal(st.deadlocks, 0);
  assert_int_equal(st.aborted, 0);
  assert_int_equal(nmsgs(f), 0);

  /* A desync: rank 0 has x, rank 1 has y; their rounds have nothing in
   * common, so both escalate and the coordinator sees both. */
  gs__tensor_request x = ar("x"), y = ar("y");
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.nrequests = 1;
  m.requests = &x;
  m.escalate_round = 3;
  send_msg(f, 0, &m);
  m.requests = &y;
  send_msg(f, 1, &m);
  assert_int_equal(stats(f).fast_mode, 0);
  assert_int_equal(nmsgs(f), 0);
  uint64_t escalated_at = f->now;
  gs__engine_tick(f->e, escalated_at + 4900, &f->box);
  assert_int_equal(stats(f).deadlocks, 0);
  gs__engine_tick(f->e, escalated_at + 5100, &f->box);
  st = stats(f);
  assert_int_equal(st.deadlocks, 1);
  assert_int_equal(st.aborted, 1);
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(o->msg.kind, GS__MSG_ABORT);
  assert_int_equal(o->msg.status, GS__ERR_DEADLOCK);
  assert_contains(o->msg.text, "rank 0 (host-0:1000) waits on [x] (missing from rank 1); "
                               "rank 1 (host-1:1001) waits on [y] (missing from rank 0)");
}

/* ---- a rank leaves in fast mode ------------------------------------------------ */

/* The leaver counts as escalated; every other connected rank that has not
 * escalated gets FastStop{abort_round}, naming the rank, its host and pid;
 * once they escalated, their ops fail with the usual "rank left" text. */
static void test_leave_in_fast_mode(void **state) {
  fx *f = *state;
  start(f, 4);
  uint32_t id = first_step(f, "a");
  send_ids(f, 0, &id, 1, 2); /* rank 0 already escalated after round 2 */
  assert_int_equal(nmsgs(f), 0);
  send_leave(f, 3);
  assert_int_equal(nmsgs(f), 2);
  static const char k_stop[] =
      "rank 3 (host-3, pid 1003) left the job (gs_shutdown) while the ranks ran fast rounds: a "
      "round that waits for it can never complete. End the round and send its ops to the "
      "coordinator, which fails them naming that rank; every rank must submit the same tensors "
      "before shutting down";
  for (size_t k = 0; k < 2; k++) {
    const gs__out *o = msg_at(f, k);
    assert_int_equal(o->kind, GS__OUT_TO_RANK);
    assert_int_equal(o->rank, (int32_t)k + 1); /* ranks 1 and 2; not 0, not 3 */
    assert_int_equal(o->msg.kind, GS__MSG_FAST_STOP);
    assert_int_equal(o->msg.abort_round, 1);
    assert_string_equal(o->msg.text, k_stop);
  }
  assert_int_equal(stats(f).fast_stops, 1);
  assert_int_equal(stats(f).fast_mode, 1);
  gs__outbox_clear(&f->box);

  send_ids(f, 1, &id, 1, 2);
  assert_int_equal(nmsgs(f), 0);
  send_ids(f, 2, &id, 1, 2);
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->nresponses, 1);
  assert_int_equal(p->responses[0].kind, GS__RESP_ERROR);
  assert_int_equal(p->responses[0].error_status, GS__ERR_SHUTDOWN);
  assert_string_equal(p->responses[0].error_message,
                      "tensor 'a': rank 3 (host-3, pid 1003) has already left the job "
                      "(gs_shutdown), so this collective can never complete; every rank must "
                      "submit the same tensors before shutting down");
  assert_int_equal(p->fast_after, 0); /* a rank left: never again */
  assert_int_equal(stats(f).fast_mode, 0);
}

/* The last rank not escalated leaves: fast mode ends with nothing to
 * stop; the job ends normally when all have left. */
static void test_leave_of_the_last_rank_in_fast_mode(void **state) {
  fx *f = *state;
  start(f, 2);
  first_step(f, "a");
  escalate(f, 0, 1);
  send_leave(f, 1);
  assert_int_equal(nmsgs(f), 0); /* nobody left to stop */
  assert_int_equal(stats(f).fast_mode, 0);
  assert_int_equal(stats(f).fast_stops, 0);
  send_leave(f, 0);
  assert_non_null(logged(f, "every rank left cleanly: the job finished"));
}

/* ---- timeline ------------------------------------------------------------------ */

/* No marker while a timeline records; a start in fast mode sends FastStop
 * without abort_round to every rank; after a stop the marker goes out on
 * an empty plan at the next tick. */
static void test_timeline_and_fast_mode(void **state) {
  fx *f = *state;
  start(f, 2);
  gs__engine_set_timeline(f->e, 1, f->now, &f->box);
  assert_int_equal(nmsgs(f), 0); /* not in fast mode: nothing to stop */
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->fast_after, 0);
  uint32_t id = p->responses[0].tensors[0].cache_id;
  uint64_t seq = p->seq;
  gs__outbox_clear(&f->box);

  gs__engine_set_timeline(f->e, 0, f->now, &f->box);
  assert_int_equal(nmsgs(f), 0);
  f->now += 100;
  gs__engine_tick(f->e, f->now, &f->box);
  p = only_plan(f);
  assert_int_equal(p->seq, seq + 1);
  assert_int_equal(p->nresponses, 0);
  assert_int_equal(p->replay_of, 0);
  assert_int_equal(p->template_id, 0);
  assert_int_equal(p->fast_after, 1);
  assert_int_equal(stats(f).fast_mode, 1);
  gs__outbox_clear(&f->box);
  gs__engine_tick(f->e, f->now + 100, &f->box);
  assert_int_equal(nmsgs(f), 0); /* once */

  gs__engine_set_timeline(f->e, 1, f->now, &f->box);
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(nmsgs(f), 1);
  assert_int_equal(o->kind, GS__OUT_TO_ALL);
  assert_int_equal(o->msg.kind, GS__MSG_FAST_STOP);
  assert_int_equal(o->msg.abort_round, 0);
  assert_string_equal(o->msg.text,
                      "a timeline started recording (gradsyncd StartTimeline or --timeline): the "
                      "coordinator must see every request while it records, so every rank leaves "
                      "the fast path at its next round");
  assert_int_equal(stats(f).fast_stops, 1);
  gs__outbox_clear(&f->box);
  send_ids(f, 0, &id, 1, 3);
  send_ids(f, 1, &id, 1, 3);
  p = only_plan(f);
  assert_int_equal(p->seq, seq + 2);
  assert_int_equal(p->fast_after, 0); /* it records */
  assert_int_equal(stats(f).fast_mode, 0);
}

/* ---- templates ----------------------------------------------------------------- */

/* A plan sent as a replay of a template carries the marker too, through
 * the codec as the transport sends it; the template itself does not. */
static void test_replay_keeps_the_marker(void **state) {
  fx *f = *state;
  start(f, 2);
  send_full(f, 0, ar("a"));
  send_full(f, 1, ar("a"));
  const gs__plan *p = only_plan(f);
  uint32_t tmpl = p->template_id, id = p->responses[0].tensors[0].cache_id;
  assert_int_not_equal(tmpl, 0);
  assert_int_equal(p->fast_after, 1);
  gs__outbox_clear(&f->box);
  send_ids(f, 0, &id, 1, 1);
  send_ids(f, 1, &id, 1, 1);
  const gs__out *o = msg_at(f, 0);
  p = only_plan(f);
  assert_int_equal(p->replay_of, tmpl);
  assert_int_equal(p->nresponses, 0);
  assert_int_equal(p->fast_after, 1);
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(gs__encode_plan_msg(&o->msg, &buf, &len), GS__OK);
  gs__plan_msg back;
  char err[256];
  assert_int_equal(gs__decode_plan_msg(buf, len, &back, err, sizeof err), GS__OK);
  assert_int_equal(back.kind, GS__MSG_PLAN);
  assert_int_equal(back.plan.replay_of, tmpl);
  assert_int_equal(back.plan.fast_after, 1);
  gs__plan_msg_free(&back);
  free(buf);
  gs__outbox_clear(&f->box);

  /* With a timeline recording the same replay goes out without it. */
  gs__engine_set_timeline(f->e, 1, f->now, &f->box);
  gs__outbox_clear(&f->box);
  escalate(f, 0, 1);
  escalate(f, 1, 1);
  assert_int_equal(nmsgs(f), 0);
  send_ids(f, 0, &id, 1, 0);
  send_ids(f, 1, &id, 1, 0);
  p = only_plan(f);
  assert_int_equal(p->replay_of, tmpl);
  assert_int_equal(p->fast_after, 0);
}

/* ---- reports ------------------------------------------------------------------- */

static void send_report(fx *f, int32_t rank, uint64_t rounds, uint64_t tensors,
                        uint64_t collectives, uint64_t bytes) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.heartbeat = 1;
  m.has_fast_report = 1;
  m.fast_report = (gs__fast_report){rounds, tensors, collectives, bytes};
  send_msg(f, rank, &m);
}

/* The ranks' cumulative fast reports: the largest of each counter in the
 * stats and GetStatus; fast tensors count as cache hits. */
static void test_fast_reports_in_status(void **state) {
  fx *f = *state;
  start(f, 2);
  first_step(f, "a"); /* 2 full requests */
  send_report(f, 0, 10, 50, 20, 1000);
  send_report(f, 1, 12, 48, 19, 900);
  gs__engine_stats st = stats(f);
  assert_int_equal(st.fast_rounds, 12);
  assert_int_equal(st.fast_tensors, 50);
  assert_int_equal(st.fast_collectives, 20);
  assert_int_equal(st.fast_bytes, 1000);
  gs__diag_status ds;
  assert_int_equal(gs__engine_status(f->e, f->now, &ds), GS__OK);
  assert_int_equal(ds.fast_rounds, 12);
  assert_int_equal(ds.fast_tensors, 50);
  assert_int_equal(ds.fast_collectives, 20);
  /* 98 fast tensors over the ranks, 2 full requests. */
  assert_true(ds.cache_hit_rate > 0.9799 && ds.cache_hit_rate < 0.9801);
  gs__diag_status_free(&ds);
  /* A report with the next counters replaces the last. */
  send_report(f, 0, 30, 150, 60, 3000);
  assert_int_equal(stats(f).fast_rounds, 30);
  assert_int_equal(stats(f).fast_tensors, 150);
  assert_int_equal(stats(f).plans_emitted, 1); /* reports are no activity for plans */
}

/* ---- fast-pending ops ---------------------------------------------------------- */

static void send_fast_pending(fx *f, int32_t rank, const gs__fast_pending *fp, size_t n) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.fast_pending_update = 1;
  m.nfast_pending = n;
  m.fast_pending = (gs__fast_pending *)fp;
  send_msg(f, rank, &m);
}

static gs__fast_pending fp_of(const char *name, uint32_t id, uint32_t age_ms) {
  gs__fast_pending p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "%s", name);
  p.cache_id = id;
  p.age_ms = age_ms;
  return p;
}

static gs__diag_pending_list list_pending(fx *f, uint32_t page, uint64_t after, int32_t missing) {
  gs__diag_pending_query q;
  memset(&q, 0, sizeof q);
  q.page_size = page;
  q.after = after;
  if (missing >= 0) {
    q.missing_ranks = &missing;
    q.nmissing_ranks = 1;
  }
  gs__diag_pending_list l;
  assert_int_equal(gs__engine_list_pending(f->e, &q, f->now, &l), GS__OK);
  return l;
}

/* What ranks in fast mode wait on shows in ListPending (after the table's
 * entries, by name: submitted = the ranks reporting it, missing = the
 * other connected ranks), in ListStalls, in the stall inspector's report
 * and in a lost rank's abort. */
static void test_fast_pending_in_views_and_stalls(void **state) {
  fx *f = *state;
  start(f, 3);
  uint32_t id = first_step(f, "a");
  gs__fast_pending p0[2] = {fp_of("a", id, 1500), fp_of("barrier.1", 0, 1200)};
  gs__fast_pending p1[1] = {fp_of("a", id, 1100)};
  send_fast_pending(f, 0, p0, 2);
  send_fast_pending(f, 1, p1, 1);
  send_full(f, 0, ar("t"));      /* in the table, from rank 0 only */
  assert_int_equal(nmsgs(f), 1); /* FastStop: t came without an escalation */
  assert_int_equal(msg_at(f, 0)->msg.kind, GS__MSG_FAST_STOP);
  gs__outbox_clear(&f->box);

  gs__engine_stats st = stats(f);
  assert_int_equal(st.pending_tensors, 1); /* the table: t */
  assert_int_equal(st.fast_pending, 2);    /* a, barrier.1 */
  gs__diag_status ds;
  assert_int_equal(gs__engine_status(f->e, f->now, &ds), GS__OK);
  assert_int_equal(ds.pending_tensors, 3);
  gs__diag_status_free(&ds);
  gs__diag_pending_list l = list_pending(f, 0, 0, -1);
  assert_int_equal(l.total, 3);
  assert_int_equal(l.n, 3);
  assert_string_equal(l.items[0].name, "t");
  assert_int_equal(l.items[0].fast_path, 0);
  const gs__diag_pending *a = &l.items[1], *b = &l.items[2];
  assert_string_equal(a->name, "a");
  assert_int_equal(a->fast_path, 1);
  assert_int_equal(a->op, GS__OP_ALLREDUCE);
  assert_int_equal(a->dtype, GS__FLOAT32);
  assert_int_equal(a->ndim, 1);
  assert_int_equal(a->shape[0], 4);
  assert_int_equal(a->complete, 0);
  assert_int_equal(a->nsubmitted, 2);
  assert_int_equal(a->submitted[0], 0);
  assert_int_equal(a->submitted[1], 1);
  assert_int_equal(a->nmissing, 1);
  assert_int_equal(a->missing[0], 2);
  assert_true(a->age_s >= 1.5); /* rank 0's age, grown since its report */
  assert_string_equal(b->name, "barrier.1");
  assert_int_equal(b->op, GS__OP_BARRIER);
  assert_int_equal(b->nsubmitted, 1);
  assert_int_equal(b->submitted[0], 0);
  assert_int_equal(b->nmissing, 2);
  assert_int_equal(b->missing[0], 1);
  assert_int_equal(b->missing[1], 2);
  gs__diag_pending_list_free(&l);

  /* Filtered by a missing rank, and paged. */
  l = list_pending(f, 0, 0, 1);
  assert_int_equal(l.n, 2);
  assert_string_equal(l.items[0].name, "t");
  assert_string_equal(l.items[1].name, "barrier.1");
  gs__diag_pending_list_free(&l);
  l = list_pending(f, 2, 0, -1);
  assert_int_equal(l.n, 2);
  assert_int_equal(l.total, 3);
  uint64_t next = l.next_after;
  assert_int_not_equal(next, 0);
  gs__diag_pending_list_free(&l);
  l = list_pending(f, 2, next, -1);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.items[0].name, "barrier.1");
  assert_int_equal(l.next_after, 0);
  gs__diag_pending_list_free(&l);

  /* The stall inspector: the usual text, fast ops among the names. */
  send_blocked(f, 2, "a");
  f->now += 61000;
  gs__engine_tick(f->e, f->now, &f->box);
  const char *report = logged(f, "Missing ranks:");
  assert_non_null(report);
  assert_contains(report, "One or more tensors were submitted to be reduced, gathered or "
                          "broadcasted by subset of ranks and are waiting for remainder of ranks "
                          "for more than 60 seconds.");
  assert_contains(report, "Missing ranks:\n1 (host-1:1001): [barrier.1, t]\n2 (host-2:1002): [a, "
                          "barrier.1, t]");
  assert_int_equal(stats(f).stall_reports, 1);
  gs__diag_stalls s;
  assert_int_equal(gs__engine_stalls(f->e, f->now, &s), GS__OK);
  assert_int_equal(s.nstalled, 3);
  assert_string_equal(s.stalled[1].name, "a");
  assert_int_equal(s.stalled[1].fast_path, 1);
  assert_int_equal(s.nwaits, 1);
  assert_int_equal(s.waits[0].rank, 2);
  assert_string_equal(s.waits[0].waits[0].name, "a");
  assert_int_equal(s.waits[0].waits[0].pending, 1);
  assert_int_equal(s.waits[0].waits[0].nmissing, 1);
  assert_int_equal(s.waits[0].waits[0].missing[0], 2);
  gs__diag_stalls_free(&s);
  gs__outbox_clear(&f->box);

  /* A rank lost: the abort names the fast ops in flight too. */
  gs__engine_session_closed(f->e, 2, "its connection dropped", f->now, &f->box);
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(o->msg.kind, GS__MSG_ABORT);
  assert_contains(o->msg.text, "Tensors in flight: [t, a, barrier.1]");
}

static void send_done(fx *f, int32_t rank, uint64_t seq) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.ndone = 1;
  m.done_plans = &seq;
  send_msg(f, rank, &m);
}

/* The abort's text when rank `rank` is lost now (its session ended). */
static const char *lose(fx *f, int32_t rank) {
  gs__outbox_clear(&f->box);
  gs__engine_session_closed(f->e, rank, "its connection dropped", f->now, &f->box);
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(o->msg.kind, GS__MSG_ABORT);
  return o->msg.text;
}

/* Regression: a rank lost in fast mode used to be reported with the plans
 * before the marker as "scheduled but not finished by it", although it had
 * most likely run them (finished plans ride with a rank's next message, in
 * fast mode its next heartbeat): after gradsync-train --crash-rank 2
 * --crash-step 5 the report named fc1's tensors, which rank 2 never
 * submitted in step 5. Now it says the rank was in fast mode, what it
 * reported waiting on there, and that those plans were only not reported. */
static void test_rank_lost_in_fast_mode(void **state) {
  fx *f = *state;
  /* Lost right after the marker (plan 1): it may not have run plan 1. */
  start(f, 3);
  first_step(f, "a");
  assert_string_equal(lose(f, 2),
                      "rank 2 (host-2, pid 1002) was lost: its connection dropped. Tensors in "
                      "flight: []; it was in fast mode after plan 1, where the ranks agree on "
                      "cached tensors among themselves: gradsyncd does not know which of them it "
                      "was reducing; plans up to 1 it had not reported finished, which it may "
                      "well have run (ranks report finished plans with their next message): [a]. "
                      "The job cannot continue without it: look at rank 2's log for why it "
                      "stopped, then restart the job");

  /* Its heartbeat said plan 1 ran and that it waits on a in a fast round. */
  start(f, 3);
  uint32_t id = first_step(f, "a");
  send_done(f, 2, 1);
  gs__fast_pending p2[2] = {fp_of("a", id, 1500), fp_of("b", id + 1, 1500)};
  send_fast_pending(f, 2, p2, 2);
  assert_string_equal(lose(f, 2),
                      "rank 2 (host-2, pid 1002) was lost: its connection dropped. Tensors in "
                      "flight: []; it was in fast mode after plan 1, where the ranks agree on "
                      "cached tensors among themselves: gradsyncd does not know which of them it "
                      "was reducing (it last reported waiting on [a, b]). The job cannot "
                      "continue without it: look at rank 2's log for why it stopped, then "
                      "restart the job");

  /* It had escalated (its ops came to the coordinator with its finished
   * plans): the usual report. */
  start(f, 3);
  first_step(f, "a");
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  uint64_t done = 1;
  gs__tensor_request c = ar("c");
  m.ndone = 1;
  m.done_plans = &done;
  m.nrequests = 1;
  m.requests = &c;
  m.escalate_round = 3;
  send_msg(f, 2, &m);
  assert_string_equal(lose(f, 2),
                      "rank 2 (host-2, pid 1002) was lost: its connection dropped. Tensors in "
                      "flight: [c]. The job cannot continue without it: look at rank 2's log for "
                      "why it stopped, then restart the job");

  /* The fast path off: plans it has not reported are "scheduled but not
   * finished", as before. */
  start_ex(f, 3, 0, 1024);
  for (int32_t r = 0; r < 3; r++) send_full(f, r, ar("a"));
  assert_int_equal(only_plan(f)->fast_after, 0);
  send_done(f, 0, 1);
  assert_string_equal(lose(f, 2),
                      "rank 2 (host-2, pid 1002) was lost: its connection dropped. Tensors in "
                      "flight: []; scheduled but not finished by it: [a]. The job cannot continue "
                      "without it: look at rank 2's log for why it stopped, then restart the job");
}

/* Stall shutdown counts the age of fast ops as the table's. */
static void test_fast_pending_stall_shutdown(void **state) {
  fx *f = *state;
  gs__engine_config cfg;
  start(f, 2);
  gs__engine_destroy(f->e);
  f->e = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.world_size = 2;
  cfg.job.cache_capacity = 16;
  cfg.job.stall_warning_s = 60;
  cfg.job.stall_shutdown_s = 120;
  cfg.max_plans_in_flight = 1 << 20;
  cfg.fast_path = 1;
  assert_int_equal(gs__engine_create(&cfg, &f->e), GS__OK);
  for (int32_t r = 0; r < 2; r++) {
    gs__join_request req;
    memset(&req, 0, sizeof req);
    req.rank = r;
    req.size = 2;
    snprintf(req.host, sizeof req.host, "host-%d", r);
    req.pid = 1000 + r;
    gs__join_response resp;
    char err[256];
    assert_int_equal(gs__engine_join(f->e, &req, tick(f), &resp, err, sizeof err), GS__OK);
  }
  for (int32_t r = 0; r < 2; r++) {
    char err[256];
    assert_int_equal(gs__engine_session_open(f->e, r, tick(f), &f->box, err, sizeof err), GS__OK);
    gs__rank_msg hello;
    memset(&hello, 0, sizeof hello);
    hello.has_hello = 1;
    hello.hello_rank = r;
    hello.hello_fast_path = 1;
    send_msg(f, r, &hello);
  }
  uint32_t id = first_step(f, "w");
  gs__fast_pending p = fp_of("w", id, 119000);
  send_fast_pending(f, 1, &p, 1);
  f->now += 500;
  gs__engine_tick(f->e, f->now, &f->box);
  assert_int_equal(stats(f).aborted, 0);
  f->now += 600;
  gs__engine_tick(f->e, f->now, &f->box);
  assert_int_equal(stats(f).aborted, 1);
  const gs__out *o = msg_at(f, 0);
  assert_int_equal(o->msg.kind, GS__MSG_ABORT);
  assert_int_equal(o->msg.status, GS__ERR_STALL);
  assert_contains(o->msg.text, "Missing ranks:\n0 (host-0:1000): [w]");
  assert_contains(o->msg.text, "Stall shutdown time of 120 s exceeded (--stall-shutdown-s)");
}

/* What a rank reports is bounded before it is stored: at most
 * GS__MAX_BLOCKED ops, names cut at GS__MAX_NAME bytes. An escalation
 * drops the rank's report (its ops come to the coordinator now), and
 * reports outside fast mode are not kept. */
static void test_fast_pending_bounded_and_dropped(void **state) {
  fx *f = *state;
  start(f, 2);
  uint32_t id = first_step(f, "a");
  gs__fast_pending *many = calloc(100, sizeof *many);
  assert_non_null(many);
  for (int i = 0; i < 100; i++) many[i] = fp_of("", id, 2000);
  for (int i = 0; i < 100; i++) snprintf(many[i].name, sizeof many[i].name, "n%03d", i);
  memset(many[0].name, 'x', sizeof many[0].name); /* no terminating NUL */
  send_fast_pending(f, 0, many, 100);
  gs__diag_pending_list l = list_pending(f, 1000, 0, -1);
  assert_int_equal(l.total, GS__MAX_BLOCKED);
  assert_int_equal(l.n, GS__MAX_BLOCKED);
  assert_int_equal(strlen(l.items[GS__MAX_BLOCKED - 1].name), GS__MAX_NAME); /* x...x sorts last */
  assert_string_equal(l.items[GS__MAX_BLOCKED - 2].name, "n063");
  gs__diag_pending_list_free(&l);

  /* Rank 0 escalates: its ops leave the fast view. */
  escalate(f, 0, 1);
  l = list_pending(f, 0, 0, -1);
  assert_int_equal(l.total, 0);
  gs__diag_pending_list_free(&l);
  gs__engine_set_timeline(f->e, 1, f->now, &f->box); /* keeps the job out of fast mode */
  escalate(f, 1, 1);
  assert_int_equal(stats(f).fast_mode, 0);
  /* Not in fast mode: a report is not kept. */
  send_fast_pending(f, 1, many, 3);
  l = list_pending(f, 0, 0, -1);
  assert_int_equal(l.total, 0);
  gs__diag_pending_list_free(&l);
  free(many);
}

/* A client that never escalates (a raw-protocol client, or a rank stuck
 * after its round) shows in the stall report: entries held in fast mode
 * name the ranks that have not escalated. */
static void test_held_entries_name_ranks_not_escalated(void **state) {
  fx *f = *state;
  start(f, 2);
  uint32_t id = first_step(f, "a");
  send_ids(f, 0, &id, 1, 0);
  send_ids(f, 1, &id, 1, 0);
  assert_int_equal(nmsgs(f), 1); /* complete, held; one FastStop for both */
  assert_int_equal(msg_at(f, 0)->msg.kind, GS__MSG_FAST_STOP);
  gs__outbox_clear(&f->box);
  f->now += 61000;
  gs__engine_tick(f->e, f->now, &f->box);
  const char *report = logged(f, "Missing ranks:");
  assert_contains(report, "Missing ranks:\n0 (host-0:1000): [a]\n1 (host-1:1001): [a]");
  gs__outbox_clear(&f->box);
  escalate(f, 0, 2);
  f->now += 61000;
  gs__engine_tick(f->e, f->now, &f->box);
  report = logged(f, "Missing ranks:");
  assert_non_null(report);
  assert_null(strstr(report, "\n0 (host-0:1000)"));
  assert_contains(report, "Missing ranks:\n1 (host-1:1001): [a]");
}

/* ---- registrations acknowledged on the marker ------------------------------------ */

static void send_reg(fx *f, int32_t rank, const char *name, int unreg, uint64_t reg_seq) {
  char names[1][GS__MAX_NAME + 1];
  snprintf(names[0], sizeof names[0], "%s", name);
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  if (unreg) {
    m.nunreg = 1;
    m.unreg = names;
  } else {
    m.nreg = 1;
    m.reg = names;
  }
  m.reg_seq = reg_seq;
  send_msg(f, rank, &m);
}

/* A plan with fast_after acknowledges the registrations the coordinator
 * applied since the last one (Plan.reg_ack_*), so that a rank whose own
 * are still on the way starts fast mode not clear; ranks with nothing new
 * are left out. */
static void test_marker_acknowledges_registrations(void **state) {
  fx *f = *state;
  start(f, 3);
  send_reg(f, 1, "tower", 0, 1);
  send_reg(f, 2, "tower", 0, 1);
  send_reg(f, 2, "head", 0, 2);
  for (int32_t r = 0; r < 3; r++) send_full(f, r, ar("a"));
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->fast_after, 1);
  assert_int_equal(p->nreg_acks, 2);
  assert_int_equal(p->reg_ack_ranks[0], 1);
  assert_int_equal(p->reg_ack_seqs[0], 1);
  assert_int_equal(p->reg_ack_ranks[1], 2);
  assert_int_equal(p->reg_ack_seqs[1], 2);
  uint32_t id = p->responses[0].tensors[0].cache_id;
  gs__outbox_clear(&f->box);

  /* Rank 0's unregistration was sent before the marker reached it: the
   * coordinator applies it in fast mode, and the next marker (an empty
   * plan once every rank escalated) acknowledges it, and only it. */
  send_reg(f, 0, "x", 0, 1);
  assert_int_equal(nmsgs(f), 0);
  for (int32_t r = 0; r < 3; r++) escalate(f, r, 1);
  p = only_plan(f);
  assert_int_equal(p->nresponses, 0);
  assert_int_equal(p->fast_after, 1);
  assert_int_equal(p->nreg_acks, 1);
  assert_int_equal(p->reg_ack_ranks[0], 0);
  assert_int_equal(p->reg_ack_seqs[0], 1);
  gs__outbox_clear(&f->box);

  /* Nothing new: no acknowledgement. Then rank 2's unregistration rides
   * with its escalation (held in fast mode): the plan after it
   * acknowledges it. */
  for (int32_t r = 0; r < 3; r++) escalate(f, r, 2);
  p = only_plan(f);
  assert_int_equal(p->nreg_acks, 0);
  assert_null(p->reg_ack_ranks);
  gs__outbox_clear(&f->box);
  for (int32_t r = 0; r < 2; r++) send_ids(f, r, &id, 1, 3);
  send_reg(f, 2, "head", 1, 3);
  send_ids(f, 2, &id, 1, 3);
  p = only_plan(f);
  assert_int_equal(p->fast_after, 1);
  assert_int_equal(p->nreg_acks, 1);
  assert_int_equal(p->reg_ack_ranks[0], 2);
  assert_int_equal(p->reg_ack_seqs[0], 3);
}

/* ---- the backoff ---------------------------------------------------------------- */

/* An allgather of float32 [1, 4]: never cached, never run in a fast round. */
static gs__tensor_request ag(const char *name) {
  gs__tensor_request r = ar_shape(name, 1);
  r.op = GS__OP_ALLGATHER;
  r.ndim = 2;
  r.shape[1] = 4;
  return r;
}

/* One step of a job whose steps each hold a cached allreduce (id) and an
 * allgather 'g'. In fast mode every rank escalates after fast round
 * `round` with both (in normal mode round is 0). Returns the fast_after of
 * the one plan that comes out. */
static int mixed_step(fx *f, uint32_t id, uint64_t round) {
  gs__outbox_clear(&f->box);
  for (int32_t r = 0; r < f->world; r++) {
    gs__tensor_request g = ag("g");
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.ncached = 1;
    m.cached = &id;
    m.nrequests = 1;
    m.requests = &g;
    m.escalate_round = round;
    send_msg(f, r, &m);
  }
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->nresponses, 2);
  assert_int_equal(p->responses[0].kind, GS__RESP_COLLECTIVE);
  assert_int_equal(p->responses[1].kind, GS__RESP_COLLECTIVE);
  return p->fast_after; /* (the outbox keeps the plan and the log lines) */
}

/* A job whose every step escalates at the first fast round (an allgather
 * each step): from the second such episode in a row the marker skips 1,
 * 2, 4 .. 64 plans that empty the table, then stays at 64; GetStatus and
 * the stats say so, naming the op. Once an episode runs a round the next
 * plan carries the marker again, and backing off starts over. */
static void test_backoff_when_every_step_escalates(void **state) {
  fx *f = *state;
  start(f, 2);
  /* Step 1 negotiates a and g in full; a is cached; the marker. */
  uint32_t id = first_step(f, "a");
  uint64_t round = 0;
  /* The first wasted episode is free (a job meets a new tensor now and
   * then): the marker at once. */
  assert_int_equal(mixed_step(f, id, ++round), 1);
  assert_int_equal(stats(f).fast_backoffs, 0);
  uint64_t want[] = {1, 2, 4, 8, 16, 32, 64, 64, 64};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    /* Fast mode: each rank's first round is not clear (g), so every rank
     * escalates after it with a and g. Their plan goes without the marker. */
    assert_int_equal(stats(f).fast_mode, 1);
    assert_int_equal(mixed_step(f, id, ++round), 0);
    if (k == 0)
      assert_string_equal(logged(f, "backs off"),
                          "the fast path backs off for 1 plan: the ranks came back at their "
                          "first fast round with 'g', an op a fast round cannot run (uncached, "
                          "or an allgather, alltoall, join or sparse op); the marker "
                          "waits for the next plan that empties the table after these "
                          "(gradsyncd --fast-path-backoff: the longest backoff, 0 = none)");
    gs__engine_stats st = stats(f);
    assert_int_equal(st.fast_mode, 0);
    assert_int_equal(st.fast_backoffs, k + 1);
    assert_int_equal(st.fast_backoff, 1);
    assert_int_equal(st.fast_backoff_left, want[k] - 1); /* that plan was the first */
    gs__diag_status ds;
    assert_int_equal(gs__engine_status(f->e, f->now, &ds), GS__OK);
    assert_int_equal(ds.fast_backoff, 1);
    assert_int_equal(ds.fast_backoff_plans, want[k] - 1);
    assert_int_equal(ds.fast_backoffs, k + 1);
    assert_string_equal(ds.fast_backoff_tensor, "g");
    gs__diag_status_free(&ds);
    /* Normal steps: the rest of the backoff, then the marker on the next
     * plan that empties the table (none on a tick meanwhile). */
    for (uint64_t n = 1; n < want[k]; n++) {
      gs__outbox_clear(&f->box);
      gs__engine_tick(f->e, f->now += 1000, &f->box);
      assert_int_equal(nmsgs(f), 0);
      assert_int_equal(mixed_step(f, id, 0), 0);
    }
    assert_int_equal(mixed_step(f, id, 0), 1);
    assert_int_equal(stats(f).fast_backoff, 0);
  }

  /* The job becomes steady: an episode runs 5 rounds before g comes back. */
  round += 5;
  assert_int_equal(mixed_step(f, id, round), 1); /* no backoff: the marker at once */
  gs__engine_stats st = stats(f);
  assert_int_equal(st.fast_backoffs, 9);
  assert_int_equal(st.fast_backoff, 0);
  assert_int_equal(st.fast_mode, 1);
  /* The count was reset: the next wasted episode is free again, the one
   * after skips one plan. */
  assert_int_equal(mixed_step(f, id, ++round), 1);
  assert_int_equal(mixed_step(f, id, ++round), 0);
  assert_int_equal(stats(f).fast_backoff_left, 0);
  assert_int_equal(mixed_step(f, id, 0), 1);
}

/* gradsyncd --fast-path-backoff N caps the backoff at N plans; 0 never
 * backs off. */
static void test_backoff_setting(void **state) {
  fx *f = *state;
  for (uint32_t max = 0; max <= 3; max += 3) {
    backoff_max = max;
    start(f, 2);
    backoff_max = GS__FAST_BACKOFF_MAX;
    uint32_t id = first_step(f, "a");
    uint64_t round = 0;
    assert_int_equal(mixed_step(f, id, ++round), 1); /* the first is free */
    uint64_t want[] = {1, 2, 3, 3};
    for (size_t k = 0; k < 4; k++) {
      if (!max) {
        assert_int_equal(mixed_step(f, id, ++round), 1); /* never held back */
        continue;
      }
      assert_int_equal(mixed_step(f, id, ++round), 0);
      for (uint64_t n = 1; n < want[k]; n++) assert_int_equal(mixed_step(f, id, 0), 0);
      assert_int_equal(mixed_step(f, id, 0), 1);
    }
    assert_int_equal(stats(f).fast_backoffs, max ? 4 : 0);
  }
}

/* What counts: an op a fast round cannot run at the first round. A
 * reordering (only cached allreduces, nothing in common), a barrier and an
 * unregistration, an episode a timeline ended, or a cached grouped allreduce
 * (fast rounds run it) do not back off; a new tensor and a request sent
 * before the marker do. */
static void test_backoff_counts_only_ops_the_fast_path_cannot_run(void **state) {
  fx *f = *state;
  start(f, 2);
  uint32_t id = first_step(f, "a");
  /* Reordering at the first round: cached ids only. */
  send_ids(f, 0, &id, 1, 1);
  send_ids(f, 1, &id, 1, 1);
  assert_int_equal(only_plan(f)->fast_after, 1);
  assert_int_equal(stats(f).fast_backoffs, 0);
  gs__outbox_clear(&f->box);

  /* A barrier (never cached; sent in full) and an unregistration at the
   * first round: no backoff either. */
  gs__tensor_request bar;
  gs__tensor_request_init(&bar);
  snprintf(bar.name, sizeof bar.name, "barrier.1");
  bar.op = GS__OP_BARRIER;
  char unreg[1][GS__MAX_NAME + 1] = {"tower"};
  for (int32_t r = 0; r < 2; r++) {
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.nrequests = 1;
    m.requests = &bar;
    m.nunreg = 1;
    m.unreg = unreg;
    m.escalate_round = 2;
    send_msg(f, r, &m);
  }
  assert_int_equal(only_plan(f)->fast_after, 1);
  assert_int_equal(stats(f).fast_backoffs, 0);
  gs__outbox_clear(&f->box);

  /* A timeline ends the episode at its first round, with g: no backoff
   * (the marker waits for the timeline only). */
  gs__engine_set_timeline(f->e, 1, f->now, &f->box);
  gs__outbox_clear(&f->box);
  assert_int_equal(mixed_step(f, id, 3), 0);
  gs__outbox_clear(&f->box);
  gs__engine_set_timeline(f->e, 0, f->now, &f->box);
  gs__engine_tick(f->e, f->now += 100, &f->box);
  assert_int_equal(only_plan(f)->fast_after, 1);
  assert_int_equal(stats(f).fast_backoffs, 0);
  gs__outbox_clear(&f->box);

  /* A grouped allreduce, new (in full) at the first round: wasted, the
   * first in a row free. Then cached, sent by id at the first round (a
   * reordering: fast rounds run cached groups): not wasted. */
  gs__tensor_request gr = ar("grp");
  gr.group_id = 7;
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.nrequests = 1;
  m.requests = &gr;
  m.escalate_round = 4;
  send_msg(f, 0, &m);
  send_msg(f, 1, &m);
  const gs__plan *p = only_plan(f);
  assert_int_equal(p->fast_after, 1); /* the first wasted episode in a row is free */
  uint32_t gid = p->responses[0].tensors[0].cache_id;
  assert_int_not_equal(gid, 0);
  assert_int_equal(stats(f).fast_backoffs, 0);
  gs__outbox_clear(&f->box);
  send_ids(f, 0, &gid, 1, 5);
  send_ids(f, 1, &gid, 1, 5);
  assert_int_equal(only_plan(f)->fast_after, 1);
  assert_int_equal(stats(f).fast_backoffs, 0);
  gs__outbox_clear(&f->box);
  /* A new tensor at the next first round: the second wasted in a row. */
  gs__tensor_request u = ar("new.6");
  m.requests = &u;
  m.escalate_round = 6;
  send_msg(f, 0, &m);
  send_msg(f, 1, &m);
  assert_int_equal(only_plan(f)->fast_after, 0); /* backed off */
  assert_int_equal(stats(f).fast_backoffs, 1);
  gs__outbox_clear(&f->box);
  send_ids(f, 0, &gid, 1, 0);
  send_ids(f, 1, &gid, 1, 0);
  assert_int_equal(only_plan(f)->fast_after, 1);
  gs__outbox_clear(&f->box);
  u = ar("new.7");
  m.escalate_round = 7;
  send_msg(f, 0, &m);
  send_msg(f, 1, &m);
  assert_int_equal(only_plan(f)->fast_after, 0);
  gs__engine_stats st = stats(f);
  assert_int_equal(st.fast_backoffs, 2);
  assert_int_equal(st.fast_backoff_left, 1);
  gs__diag_status ds;
  assert_int_equal(gs__engine_status(f->e, f->now, &ds), GS__OK);
  assert_string_equal(ds.fast_backoff_tensor, "new.7");
  gs__diag_status_free(&ds);
  gs__outbox_clear(&f->box);
  for (int i = 0; i < 2; i++) {
    send_ids(f, 0, &id, 1, 0);
    send_ids(f, 1, &id, 1, 0);
    assert_int_equal(only_plan(f)->fast_after, i == 1);
    gs__outbox_clear(&f->box);
  }

  /* A request sent before the marker: every rank is asked back and
   * escalates at its next (first) round; that backs off too. */
  send_ids(f, 0, &id, 1, 0);
  assert_int_equal(msg_at(f, 0)->msg.kind, GS__MSG_FAST_STOP);
  gs__outbox_clear(&f->box);
  escalate(f, 0, 8);
  send_ids(f, 1, &id, 1, 8);
  assert_int_equal(only_plan(f)->fast_after, 0);
  st = stats(f);
  assert_int_equal(st.fast_backoffs, 3);
  assert_int_equal(st.fast_backoff_left, 3); /* 4 plans, this one the first */
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_marker_on_the_plan_that_empties_the_table),
      T(test_no_marker_with_a_joined_or_departed_rank),
      T(test_hold_until_every_rank_escalates),
      T(test_hold_then_emit_with_errors),
      T(test_escalation_rounds_disagree_logged),
      T(test_no_deadlock_check_in_fast_mode),
      T(test_leave_in_fast_mode),
      T(test_leave_of_the_last_rank_in_fast_mode),
      T(test_timeline_and_fast_mode),
      T(test_replay_keeps_the_marker),
      T(test_fast_reports_in_status),
      T(test_fast_pending_in_views_and_stalls),
      T(test_fast_pending_stall_shutdown),
      T(test_rank_lost_in_fast_mode),
      T(test_fast_pending_bounded_and_dropped),
      T(test_held_entries_name_ranks_not_escalated),
      T(test_backoff_when_every_step_escalates),
      T(test_backoff_counts_only_ops_the_fast_path_cannot_run),
      T(test_backoff_setting),
      T(test_marker_acknowledges_registrations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
