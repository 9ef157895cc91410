/* Writes the seed corpus of the fuzz targets: valid inputs that reach deep
 * into the code, for libFuzzer to mutate. Usage: fuzz_seeds DIR; writes
 * DIR/engine/NN (scripts for fuzz_engine, see fuzz_script.h: whole jobs
 * with fused plans, mismatches, a rank leaving with ops and groups pending,
 * a deadlock, the cache, allgathers, local names, a stall, a lost rank, the
 * fast path with escalations, a leave, reports and a timeline) and
 * DIR/codec/NN (a selector byte and an encoded message for fuzz_codec).
 * Plain C; built with the fuzz targets. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "fuzz_script.h"
#include "messages.h"
#include "status.h"

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) exit(1);
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
}

static void put1(buf *b, int v) {
  uint8_t c = (uint8_t)v;
  put(b, &c, 1);
}

static void ev(buf *b, int op, int rank) {
  put1(b, op);
  put1(b, rank);
}

static void msg(buf *b, int rank, const gs__rank_msg *m) {
  uint8_t *enc = NULL;
  size_t len = 0;
  if (gs__encode_rank_msg(m, &enc, &len) != GS__OK || len > 0xffff) exit(1);
  ev(b, FZ_MESSAGE, rank);
  put1(b, (int)(len & 0xff));
  put1(b, (int)(len >> 8));
  put(b, enc, len);
  free(enc);
}

static gs__tensor_request req(const char *name, gs__op_type op, int64_t d0, int64_t d1) {
  gs__tensor_request r;
  gs__tensor_request_init(&r);
  snprintf(r.name, sizeof r.name, "%s", name);
  r.op = op;
  r.ndim = 2;
  r.shape[0] = d0;
  r.shape[1] = d1;
  if (op == GS__OP_BARRIER || op == GS__OP_JOIN) r.ndim = 0;
  return r;
}

/* A message of n requests "<prefix>i" of shape [d0, 4]. */
static void reqs_msg(buf *b, int rank, const char *prefix, int n, gs__op_type op, int64_t d0,
                     uint64_t group, int leave) {
  gs__tensor_request rs[16];
  for (int i = 0; i < n && i < 16; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s%d", prefix, i);
    rs[i] = req(name, op, d0, 4);
    if (group) {
      rs[i].group_id = group;
      rs[i].group_size = (uint32_t)n;
    }
  }
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.requests = rs;
  m.nrequests = (size_t)(n < 16 ? n : 16);
  m.has_leave = leave;
  msg(b, rank, &m);
}

static void done_msg(buf *b, int rank, uint64_t plan) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.done_plans = &plan;
  m.ndone = 1;
  m.heartbeat = 1;
  msg(b, rank, &m);
}

static void blocked_msg(buf *b, int rank, const char *name) {
  char names[1][GS__MAX_NAME + 1];
  snprintf(names[0], sizeof names[0], "%s", name);
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.blocked_update = 1;
  m.blocked_on = names;
  m.nblocked = 1;
  msg(b, rank, &m);
}

static void write_file(const char *dir, const char *sub, int n, const buf *b) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, sub);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%02d", dir, sub, n);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static int nengine, ncodec;

static void engine_seed(const char *dir, buf *b) {
  write_file(dir, "engine", nengine++, b);
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* The codec seed: selector then the encoded rank message. */
static void codec_rank_seed(const char *dir, const gs__rank_msg *m) {
  buf b = {0};
  put1(&b, 0);
  uint8_t *enc = NULL;
  size_t len = 0;
  if (gs__encode_rank_msg(m, &enc, &len) != GS__OK) exit(1);
  put(&b, enc, len);
  free(enc);
  write_file(dir, "codec", ncodec++, &b);
  free(b.p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    perror(dir);
    return 1;
  }
  buf b = {0};

  /* 0: two ranks, fused allreduces, plan completions, cache hits after. */
  put1(&b, 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "grad/", 6, GS__OP_ALLREDUCE, 8, 0, 0);
  reqs_msg(&b, 1, "grad/", 6, GS__OP_ALLREDUCE, 8, 0, 0);
  done_msg(&b, 0, 1), done_msg(&b, 1, 1);
  {
    uint32_t ids[3] = {1, 2, 3};
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.cached = ids;
    m.ncached = 3;
    msg(&b, 0, &m);
    msg(&b, 1, &m);
  }
  ev(&b, FZ_TICK, 4);
  engine_seed(dir, &b);

  /* 1: models that differ in 10 layers. */
  put1(&b, 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "layer/", 10, GS__OP_ALLREDUCE, 4, 0, 0);
  reqs_msg(&b, 1, "layer/", 10, GS__OP_ALLREDUCE, 5, 0, 0);
  engine_seed(dir, &b);

  /* 2: rank 0 leaves while rank 1 has 10 ops pending, then more arrive. */
  put1(&b, 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 1, "op/", 10, GS__OP_ALLREDUCE, 2, 0, 0);
  reqs_msg(&b, 0, "late/", 2, GS__OP_ALLREDUCE, 2, 0, 1);
  reqs_msg(&b, 1, "after/", 3, GS__OP_ALLREDUCE, 2, 0, 0);
  ev(&b, FZ_CLOSE, 0);
  engine_seed(dir, &b);

  /* 3: three ranks, a group complete on all, one rank leaves, the group's
   * last member comes after. */
  put1(&b, 2), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "g/", 3, GS__OP_ALLREDUCE, 2, 7, 0);
  reqs_msg(&b, 1, "g/", 2, GS__OP_ALLREDUCE, 2, 7, 0);
  reqs_msg(&b, 2, "g/", 2, GS__OP_ALLREDUCE, 2, 7, 1);
  reqs_msg(&b, 1, "g/", 3, GS__OP_ALLREDUCE, 2, 7, 0);
  engine_seed(dir, &b);

  /* 4: a desync that deadlocks (blocked reports, quiet ticks). */
  put1(&b, 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "A", 1, GS__OP_ALLREDUCE, 2, 0, 0);
  reqs_msg(&b, 1, "B", 1, GS__OP_ALLREDUCE, 2, 0, 0);
  blocked_msg(&b, 0, "A0");
  blocked_msg(&b, 1, "B0");
  for (int i = 0; i < 4; i++) ev(&b, FZ_TICK, 5);
  engine_seed(dir, &b);

  /* 5: allgathers of uneven first dimensions, a broadcast, a barrier and a
   * join round (adaptive, small fusion threshold). */
  put1(&b, 2), put1(&b, 1);
  ev(&b, FZ_CONNECT_ALL, 0);
  for (int r = 0; r < 3; r++) {
    gs__tensor_request rs[4] = {
        req("gather/x", GS__OP_ALLGATHER, 1 + r, 3), req("gather/y", GS__OP_ALLGATHER, 2 * r, 3),
        req("bcast", GS__OP_BROADCAST, 2, 2), req("barrier", GS__OP_BARRIER, 0, 0)};
    rs[2].root_rank = 1;
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.requests = rs;
    m.nrequests = 4;
    msg(&b, r, &m);
  }
  {
    gs__tensor_request j = req("gs.join", GS__OP_JOIN, 0, 0);
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.requests = &j;
    m.nrequests = 1;
    msg(&b, 2, &m);
  }
  reqs_msg(&b, 0, "after-join/", 2, GS__OP_ALLREDUCE, 2, 0, 0);
  reqs_msg(&b, 1, "after-join/", 2, GS__OP_ALLREDUCE, 2, 0, 0);
  engine_seed(dir, &b);

  /* 6: a name registered local on one rank and submitted by the other. */
  put1(&b, 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 1, "tower/w", 1, GS__OP_ALLREDUCE, 2, 0, 0);
  {
    char reg[1][GS__MAX_NAME + 1] = {"tower/w0"};
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.reg = reg;
    m.nreg = 1;
    msg(&b, 0, &m);
  }
  engine_seed(dir, &b);

  /* 7: a stall, then a lost rank (stall shutdown and rank timeout on). */
  put1(&b, 2), put1(&b, 16 | 32);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "stalled/", 3, GS__OP_ALLREDUCE, 2, 0, 0);
  ev(&b, FZ_TICK, 30);
  ev(&b, FZ_TICK, 40);
  ev(&b, FZ_CLOSE, 2 | 1);
  engine_seed(dir, &b);

  /* 8: joins and hellos by hand, out of order, with a wrong size and a
   * hello inside a Session message. */
  put1(&b, 0x80 | 1), put1(&b, 128);
  ev(&b, FZ_JOIN, 1);
  ev(&b, FZ_JOIN, 0x40 | 0);
  ev(&b, FZ_OPEN, 1);
  ev(&b, FZ_JOIN, 0);
  {
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.has_hello = 1;
    m.hello_rank = 0;
    m.hello_epoch = 1;
    msg(&b, 0, &m);
  }
  reqs_msg(&b, 0, "p/", 6, GS__OP_ALLREDUCE, 2, 0, 0);
  engine_seed(dir, &b);

  /* 9: the fast path: the first step's plan carries the marker; in fast
   * mode cached ids are held, ranks report counters and fast-pending ops,
   * one escalates, the other leaves (FastStop), then the held op fails. */
  put1(&b, 0x40 | 2), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  for (int r = 0; r < 3; r++) reqs_msg(&b, r, "grad/", 3, GS__OP_ALLREDUCE, 4, 0, 0);
  for (int r = 0; r < 3; r++) done_msg(&b, r, 1);
  {
    uint32_t ids[2] = {1, 2};
    gs__fast_pending fp[2];
    memset(fp, 0, sizeof fp);
    snprintf(fp[0].name, sizeof fp[0].name, "grad/0");
    fp[0].cache_id = 1;
    fp[0].age_ms = 1500;
    snprintf(fp[1].name, sizeof fp[1].name, "barrier");
    fp[1].age_ms = 1200;
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.has_fast_report = 1;
    m.fast_report = (gs__fast_report){3, 9, 3, 144};
    m.fast_pending_update = 1;
    m.fast_pending = fp;
    m.nfast_pending = 2;
    msg(&b, 0, &m);
    msg(&b, 1, &m);
    memset(&m, 0, sizeof m);
    m.cached = ids;
    m.ncached = 2;
    m.escalate_round = 4;
    msg(&b, 0, &m);
    blocked_msg(&b, 1, "grad/1");
    ev(&b, FZ_TICK, 200);
    reqs_msg(&b, 2, "x", 0, GS__OP_ALLREDUCE, 2, 0, 1);
    msg(&b, 1, &m);
  }
  engine_seed(dir, &b);

  /* 10: the fast path and a timeline: FastStop, escalations, no marker
   * while it records, the marker on an empty plan after it stops; then
   * the drain. */
  put1(&b, 0x40 | 1), put1(&b, 0);
  ev(&b, FZ_CONNECT_ALL, 0);
  reqs_msg(&b, 0, "w/", 2, GS__OP_ALLREDUCE, 4, 0, 0);
  reqs_msg(&b, 1, "w/", 2, GS__OP_ALLREDUCE, 4, 0, 0);
  done_msg(&b, 0, 1), done_msg(&b, 1, 1);
  ev(&b, FZ_TIMELINE, 1);
  {
    uint32_t ids[2] = {1, 2};
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.cached = ids;
    m.ncached = 2;
    m.escalate_round = 1;
    msg(&b, 0, &m);
    msg(&b, 1, &m);
  }
  ev(&b, FZ_TIMELINE, 0);
  ev(&b, FZ_TICK, 1);
  ev(&b, FZ_TIMELINE, 2);
  engine_seed(dir, &b);

  /* Codec seeds: every message type. */
  {
    gs__tensor_request rs[2] = {req("w", GS__OP_ALLREDUCE, 3, 4), req("g", GS__OP_ALLGATHER, 2, 4)};
    rs[0].group_id = 9;
    rs[0].group_size = 2;
    uint32_t ids[2] = {4, 5};
    uint64_t done[1] = {3};
    char names[1][GS__MAX_NAME + 1] = {"blocked/x"};
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.requests = rs;
    m.nrequests = 2;
    m.cached = ids;
    m.ncached = 2;
    m.done_plans = done;
    m.ndone = 1;
    m.blocked_update = 1;
    m.blocked_on = names;
    m.nblocked = 1;
    m.reg = names;
    m.nreg = 1;
    m.heartbeat = 1;
    codec_rank_seed(dir, &m);
    memset(&m, 0, sizeof m);
    m.has_hello = 1;
    m.hello_rank = 3;
    m.has_leave = 1;
    snprintf(m.leave_reason, sizeof m.leave_reason, "gs_shutdown");
    codec_rank_seed(dir, &m);
    gs__fast_pending fp[1];
    memset(fp, 0, sizeof fp);
    snprintf(fp[0].name, sizeof fp[0].name, "fast/x");
    fp[0].cache_id = 7;
    fp[0].age_ms = 2000;
    memset(&m, 0, sizeof m);
    m.escalate_round = 12;
    m.has_fast_report = 1;
    m.fast_report = (gs__fast_report){12, 40, 12, 4096};
    m.fast_pending_update = 1;
    m.fast_pending = fp;
    m.nfast_pending = 1;
    codec_rank_seed(dir, &m);
  }
  {
    gs__plan_tensor ts[2];
    memset(ts, 0, sizeof ts);
    snprintf(ts[0].name, sizeof ts[0].name, "a");
    ts[0].ndim = 1;
    ts[0].shape[0] = 4;
    ts[0].cache_id = 2;
    int64_t dims[2] = {1, 3};
    snprintf(ts[1].name, sizeof ts[1].name, "g");
    ts[1].ndim = 2;
    ts[1].shape[0] = 1;
    ts[1].shape[1] = 2;
    ts[1].rank_dims = dims;
    ts[1].nrank_dims = 2;
    gs__response resp[2];
    memset(resp, 0, sizeof resp);
    resp[0].kind = GS__RESP_COLLECTIVE;
    resp[0].op = GS__OP_ALLREDUCE;
    resp[0].prescale = resp[0].postscale = 1.0;
    resp[0].tensors = &ts[0];
    resp[0].ntensors = 1;
    resp[1].kind = GS__RESP_ERROR;
    resp[1].error_status = GS__ERR_MISMATCH;
    resp[1].error_message = (char *)"tensor 'g': mismatched shapes";
    resp[1].op = GS__OP_ALLGATHER;
    resp[1].prescale = resp[1].postscale = 1.0;
    resp[1].tensors = &ts[1];
    resp[1].ntensors = 1;
    gs__plan_msg pm;
    memset(&pm, 0, sizeof pm);
    pm.kind = GS__MSG_PLAN;
    pm.plan.seq = 7;
    pm.plan.responses = resp;
    pm.plan.nresponses = 2;
    pm.plan.fast_after = 1;
    uint8_t *enc = NULL;
    size_t len = 0;
    if (gs__encode_plan_msg(&pm, &enc, &len) != GS__OK) return 1;
    put1(&b, 1);
    put(&b, enc, len);
    free(enc);
    write_file(dir, "codec", ncodec++, &b);
    free(b.p);
    memset(&b, 0, sizeof b);
    memset(&pm, 0, sizeof pm);
    pm.kind = GS__MSG_FAST_STOP;
    pm.text = (char *)"rank 1 (node-b, pid 42) left the job";
    pm.abort_round = 1;
    if (gs__encode_plan_msg(&pm, &enc, &len) != GS__OK) return 1;
    put1(&b, 1);
    put(&b, enc, len);
    free(enc);
    write_file(dir, "codec", ncodec++, &b);
    free(b.p);
    memset(&b, 0, sizeof b);
  }
  {
    gs__join_request jr;
    memset(&jr, 0, sizeof jr);
    snprintf(jr.job_id, sizeof jr.job_id, "job");
    jr.rank = 1;
    jr.size = 4;
    snprintf(jr.host, sizeof jr.host, "node-a");
    jr.pid = 42;
    uint8_t *enc = NULL;
    size_t len = 0;
    if (gs__encode_join_request(&jr, &enc, &len) != GS__OK) return 1;
    put1(&b, 2);
    put(&b, enc, len);
    free(enc);
    write_file(dir, "codec", ncodec++, &b);
    free(b.p);
    memset(&b, 0, sizeof b);
    gs__join_response js;
    memset(&js, 0, sizeof js);
    js.rank = 1;
    js.size = 4;
    js.epoch = 1;
    js.config.cycle_time_us = 1000;
    if (gs__encode_join_response(&js, &enc, &len) != GS__OK) return 1;
    put1(&b, 3);
    put(&b, enc, len);
    free(enc);
    write_file(dir, "codec", ncodec++, &b);
    free(b.p);
    memset(&b, 0, sizeof b);
  }
  for (int k = GS__KV_SET_REQ; k <= GS__KV_DELETE_RESP; k++) {
    gs__kv_msg kv;
    memset(&kv, 0, sizeof kv);
    kv.key = (char *)"ring/addr/1";
    kv.value = (uint8_t *)"127.0.0.1:4242";
    kv.value_len = 14;
    kv.wait_ms = 100;
    kv.found = 1;
    uint8_t *enc = NULL;
    size_t len = 0;
    if (gs__encode_kv((gs__kv_kind)k, &kv, &enc, &len) != GS__OK) return 1;
    put1(&b, 4 + k);
    put(&b, enc, len);
    free(enc);
    write_file(dir, "codec", ncodec++, &b);
    free(b.p);
    memset(&b, 0, sizeof b);
  }
  printf("fuzz_seeds: %d engine scripts, %d codec messages in %s\n", nengine, ncodec, dir);
  return 0;
}
