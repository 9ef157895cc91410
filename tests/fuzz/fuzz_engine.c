/* libFuzzer target over codec + engine: arbitrary bytes drive a whole
 * coordinator engine through its event interface with a fake clock, as the
 * transport drives it. The input is a script (see fuzz_script.h): a header
 * picks the world size and the engine's settings, then each event joins a
 * rank, opens or closes its session, advances the clock and ticks, or hands
 * the engine a Session message decoded from the input's bytes by the real
 * codec (a hello opens the session, as in server/coordinator.c).
 *
 * After every event the outbox is checked (plans numbered 1, 2, 3, ... with
 * no gap; every rank-addressed item names a rank of the world; every
 * response names its tensors; a plan with the fast path's marker is the
 * last of its event, and none follows while the engine holds in fast mode)
 * and each message is encoded with the codec
 * and decoded back, as the transport sends it. ASan/UBSan catch the rest.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined when GRADSYNC_FUZZ is
 * on; run by scripts/fuzz.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "engine.h"
#include "fuzz_script.h"
#include "messages.h"
#include "status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_engine: check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);       \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static int take(reader *r, uint8_t *b) {
  if (!r->n) return 0;
  *b = *r->p++;
  r->n--;
  return 1;
}

/* The fast path: a plan with fast_after is the last plan of its event (the
 * engine then holds every plan); and the engine left in fast mode sent no
 * plan in this event but, last, the one with the marker. */
static void check_fast(const gs__outbox *box, int fast_mode) {
  const gs__plan *last = NULL;
  for (size_t i = 0; i < box->n; i++) {
    const gs__out *o = &box->items[i];
    if (o->kind == GS__OUT_LOG || o->kind == GS__OUT_CLOSE_RANK) continue;
    if (o->msg.kind == GS__MSG_FAST_STOP) CHECK(o->msg.text && o->msg.text[0]);
    if (o->msg.kind != GS__MSG_PLAN) continue;
    CHECK(!last || !last->fast_after);
    last = &o->msg.plan;
  }
  if (fast_mode && last) CHECK(last->fast_after);
}

static void check_outbox(gs__outbox *box, int32_t world, uint64_t *last_seq) {
  for (size_t i = 0; i < box->n; i++) {
    const gs__out *o = &box->items[i];
    switch (o->kind) {
    case GS__OUT_LOG:
      CHECK(o->text != NULL);
      continue;
    case GS__OUT_CLOSE_RANK:
      CHECK(o->rank >= 0 && o->rank < world);
      continue;
    case GS__OUT_TO_RANK:
      CHECK(o->rank >= 0 && o->rank < world);
      break;
    case GS__OUT_TO_ALL:
      break;
    }
    const gs__plan_msg *m = &o->msg;
    if (m->kind == GS__MSG_PLAN) {
      CHECK(m->plan.seq == *last_seq + 1);
      *last_seq = m->plan.seq;
      for (size_t k = 0; k < m->plan.nresponses; k++) {
        const gs__response *r = &m->plan.responses[k];
        CHECK(r->ntensors >= 1);
        for (size_t t = 0; t < r->ntensors; t++) CHECK(r->tensors[t].name[0] != 0);
        if (r->kind == GS__RESP_ERROR) CHECK(r->error_message && r->error_message[0]);
      }
    }
    /* What the transport sends must encode, and decode back the same. */
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK(gs__encode_plan_msg(m, &buf, &len) == GS__OK);
    gs__plan_msg back;
    char err[512];
    CHECK(gs__decode_plan_msg(buf, len, &back, err, sizeof err) == GS__OK);
    CHECK(back.kind == m->kind);
    if (m->kind == GS__MSG_PLAN) CHECK(gs__plan_responses_equal(&back.plan, &m->plan));
    if (m->kind == GS__MSG_PLAN) CHECK(!back.plan.fast_after == !m->plan.fast_after);
    if (m->kind == GS__MSG_FAST_STOP) CHECK(!back.abort_round == !m->abort_round);
    gs__plan_msg_free(&back);
    free(buf);
  }
  gs__outbox_clear(box);
}

static void join_rank(gs__engine *e, int32_t rank, int32_t size, uint64_t now) {
  gs__join_request req;
  memset(&req, 0, sizeof req);
  req.rank = rank;
  req.size = size;
  req.pid = 100 + rank;
  snprintf(req.host, sizeof req.host, "host-%d", rank);
  gs__join_response resp;
  char err[GS__MAX_TEXT];
  if (gs__engine_join(e, &req, now, &resp, err, sizeof err) != GS__OK) CHECK(err[0] != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  uint8_t b0, b1;
  if (!take(&r, &b0) || !take(&r, &b1)) return 0;
  gs__engine_config cfg;
  memset(&cfg, 0, sizeof cfg);
  int32_t world = 1 + b0 % FZ_MAX_WORLD;
  cfg.world_size = (b0 & 0x80) ? 0 : world; /* 0: from the first joiner */
  cfg.job.cycle_time_us = 1000;
  cfg.job.fusion_threshold_bytes = (b1 & 1) ? 64 : (b1 & 2) ? 0 : 1 << 20;
  cfg.job.cache_capacity = (b1 & 4) ? 2 : (b1 & 8) ? 0 : 1024;
  cfg.job.stall_warning_s = 1;
  cfg.job.stall_shutdown_s = (b1 & 16) ? 3 : 0;
  cfg.job.deadlock_time_ms = 500;
  cfg.job.heartbeat_ms = 100;
  cfg.job.rank_timeout_ms = (b1 & 32) ? 2000 : 0;
  cfg.policy = (b1 & 64) ? GS__POLICY_WINDOW : GS__POLICY_ADAPTIVE;
  cfg.max_plans_in_flight = 1 + (b1 >> 6);
  cfg.max_pending_per_rank = (b1 & 128) ? 4 : 0;
  cfg.deadlock_warn_only = (b0 >> 4) & 1;
  cfg.fast_path = (b0 >> 6) & 1;
  cfg.fast_backoff_max = ((b0 >> 5) & 1) ? 2 : 0; /* --fast-path-backoff: short, to reach its cap */
  gs__engine *e = NULL;
  CHECK(gs__engine_create(&cfg, &e) == GS__OK);
  gs__outbox box;
  memset(&box, 0, sizeof box);
  uint64_t now = 1000000, last_seq = 0;
  uint8_t op, rb;
  while (take(&r, &op) && take(&r, &rb)) {
    int32_t rank = (int32_t)(rb % (FZ_MAX_WORLD + 1)) - ((rb & 0x80) ? 1 : 0);
    switch (op % FZ_OP_COUNT) {
    case FZ_JOIN:
      join_rank(e, rank, (rb & 0x40) ? world + 1 : world, now);
      break;
    case FZ_OPEN: {
      char err[GS__MAX_TEXT];
      if (gs__engine_session_open(e, rank, now, &box, err, sizeof err) != GS__OK)
        CHECK(err[0] != 0);
      break;
    }
    case FZ_MESSAGE: {
      uint8_t lo, hi;
      if (!take(&r, &lo) || !take(&r, &hi)) break;
      size_t len = (size_t)lo | (size_t)hi << 8;
      if (len > r.n) len = r.n;
      gs__rank_msg m;
      char err[512];
      if (gs__decode_rank_msg(r.p, len, &m, err, sizeof err) == GS__OK) {
        if (m.has_hello) {
          /* As the coordinator: the session opens, then the engine gets
           * the hello message too (its fast-path capability). */
          char why[GS__MAX_TEXT];
          if (gs__engine_session_open(e, m.hello_rank, now, &box, why, sizeof why) != GS__OK)
            CHECK(why[0] != 0);
          else
            gs__engine_rank_message(e, m.hello_rank, &m, now, &box);
        } else {
          gs__engine_rank_message(e, rank, &m, now, &box);
        }
        gs__rank_msg_free(&m);
      }
      r.p += len;
      r.n -= len;
      break;
    }
    case FZ_CLOSE:
      gs__engine_session_closed(e, rank, (rb & 1) ? "stream ended" : NULL, now, &box);
      break;
    case FZ_TICK:
      now += (uint64_t)rb * 50u;
      gs__engine_tick(e, now, &box);
      break;
    case FZ_CONNECT_ALL:
      for (int32_t q = 0; q < world; q++) join_rank(e, q, world, now);
      for (int32_t q = 0; q < world; q++) {
        char err[GS__MAX_TEXT];
        if (gs__engine_session_open(e, q, now, &box, err, sizeof err) != GS__OK) continue;
        gs__rank_msg hello;
        memset(&hello, 0, sizeof hello);
        hello.has_hello = 1;
        hello.hello_rank = q;
        hello.hello_fast_path = cfg.fast_path;
        gs__engine_rank_message(e, q, &hello, now, &box);
      }
      break;
    case FZ_TIMELINE:
      if (rb & 2) gs__engine_set_draining(e);
      gs__engine_set_timeline(e, rb & 1, now, &box);
      break;
    }
    /* With world_size 0 the first joiner sets the world (it may claim
     * world + 1): addressed ranks are bounded by the engine's world. */
    gs__engine_stats st;
    gs__engine_get_stats(e, &st);
    check_fast(&box, st.fast_mode);
    check_outbox(&box, st.world_size > 0 ? st.world_size : world, &last_seq);
    CHECK(st.plans_emitted == last_seq);
    CHECK(strlen(gs__engine_last_stall(e)) < 1 << 20);
    CHECK(strlen(gs__engine_last_deadlock(e)) < 1 << 20);
  }
  gs__outbox_free(&box);
  gs__engine_destroy(e);
  return 0;
}
