/* Unit tests of common/codec.c and the shape helpers of common/messages.c:
 * round trips of every message of the coordinator protocol (join, rank
 * message, each kind of plan message, every key/value message) with every
 * field compared, and the decoders' refusals of what a peer could abuse
 * (garbage and truncated bytes, over-long names, too many or negative
 * dimensions, element counts that overflow, unknown enum values, empty
 * names, key/value limits), each checked for GS__ERR_INVALID_ARG and a
 * message naming the field and the value.
 *
 * The generated protobuf-c header is private to gs_common, so the hostile
 * inputs are written here with a small protobuf wire encoder (pbw_*). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "assert_contains.h"
#include "codec.h"
#include "codec_diag.h"
#include "diag_messages.h"
#include "messages.h"
#include "status.h"

/* ---- helpers -------------------------------------------------------------- */

/* Doubles compared bit for bit (cmocka 1.1 has no float assertion). */
#define assert_double_same(a, b)                                                                   \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    assert_memory_equal(&a_, &b_, sizeof a_);                                                      \
  } while (0)

/* A growing buffer of protobuf wire bytes. */
typedef struct pbw {
  uint8_t *b;
  size_t n, cap;
} pbw;

static void pbw_raw(pbw *w, const void *data, size_t n) {
  if (w->n + n > w->cap) {
    size_t cap = w->cap ? w->cap : 64;
    while (cap < w->n + n) cap *= 2;
    w->b = realloc(w->b, cap);
    assert_non_null(w->b);
    w->cap = cap;
  }
  if (n) memcpy(w->b + w->n, data, n);
  w->n += n;
}

static void pbw_varint(pbw *w, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  do {
    tmp[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) tmp[n] |= 0x80;
    n++;
  } while (v);
  pbw_raw(w, tmp, n);
}

static void pbw_tag(pbw *w, unsigned field, unsigned wire_type) {
  pbw_varint(w, ((uint64_t)field << 3) | wire_type);
}

/* int32, int64, enum and bool fields: negative values take ten bytes. */
static void pbw_int(pbw *w, unsigned field, int64_t v) {
  pbw_tag(w, field, 0);
  pbw_varint(w, (uint64_t)v);
}

static void pbw_bytes(pbw *w, unsigned field, const void *data, size_t n) {
  pbw_tag(w, field, 2);
  pbw_varint(w, n);
  pbw_raw(w, data, n);
}

static void pbw_str(pbw *w, unsigned field, const char *s) {
  pbw_bytes(w, field, s, strlen(s));
}

static void pbw_double(pbw *w, unsigned field, double d) {
  uint8_t le[8];
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(u >> (8 * i));
  pbw_tag(w, field, 1);
  pbw_raw(w, le, sizeof le);
}

static void pbw_sub(pbw *w, unsigned field, const pbw *sub) {
  pbw_bytes(w, field, sub->b, sub->n);
}

/* A packed repeated int64/int32 field. */
static void pbw_packed(pbw *w, unsigned field, const int64_t *v, size_t n) {
  pbw body = {0};
  for (size_t i = 0; i < n; i++) pbw_varint(&body, (uint64_t)v[i]);
  pbw_sub(w, field, &body);
  free(body.b);
}

static void pbw_free(pbw *w) {
  free(w->b);
  memset(w, 0, sizeof *w);
}

/* A string of n copies of c. */
static char *repeat(char c, size_t n) {
  char *s = malloc(n + 1);
  assert_non_null(s);
  memset(s, c, n);
  s[n] = 0;
  return s;
}

/* A wire TensorRequest: name, op, dtype, shape. */
static void pbw_request(pbw *w, const char *name, int64_t op, int64_t dtype, const int64_t *shape,
                        size_t ndim) {
  if (name) pbw_str(w, 1, name);
  if (op) pbw_int(w, 2, op);
  if (dtype) pbw_int(w, 3, dtype);
  if (ndim) pbw_packed(w, 4, shape, ndim);
  pbw_double(w, 6, 1.0);
  pbw_double(w, 7, 1.0);
}

/* Decodes a RankMessage holding the single TensorRequest req. */
static int decode_one_request(const pbw *req, gs__rank_msg *m, char *err, size_t errlen) {
  pbw msg = {0};
  pbw_sub(&msg, 2, req);
  int rc = gs__decode_rank_msg(msg.b, msg.n, m, err, errlen);
  pbw_free(&msg);
  return rc;
}

/* Expects the request to be refused with a message holding want. */
static void expect_request_refused(const pbw *req, const char *want) {
  gs__rank_msg m;
  char err[512] = "";
  assert_int_equal(decode_one_request(req, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_contains(err, want);
  /* A refused decode leaves nothing to free. */
  assert_null(m.requests);
  assert_int_equal(m.nrequests, 0);
}

/* Decodes a PlanMessage holding the Plan plan (field 2). */
static int decode_plan_bytes(const pbw *plan, gs__plan_msg *m, char *err, size_t errlen) {
  pbw msg = {0};
  pbw_sub(&msg, 2, plan);
  int rc = gs__decode_plan_msg(msg.b, msg.n, m, err, errlen);
  pbw_free(&msg);
  return rc;
}

/* A Plan with one Response; resp_fields holds the response's extra fields. */
static void expect_plan_refused(const pbw *resp, const char *want) {
  pbw plan = {0};
  pbw_int(&plan, 1, 9);
  pbw_sub(&plan, 2, resp);
  gs__plan_msg m;
  char err[512] = "";
  assert_int_equal(decode_plan_bytes(&plan, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_contains(err, want);
  assert_int_equal(m.kind, GS__MSG_NONE);
  assert_null(m.plan.responses);
  pbw_free(&plan);
}

/* A copy of the first n bytes in a block of exactly n bytes, so that the
 * sanitizers see any read past the end. */
static uint8_t *prefix_copy(const uint8_t *buf, size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  if (n) memcpy(p, buf, n);
  return p;
}

/* ---- join ------------------------------------------------------------------ */

static void fill_join_request(gs__join_request *r) {
  memset(r, 0, sizeof *r);
  snprintf(r->job_id, sizeof r->job_id, "job-42");
  r->rank = 3;
  r->size = 8;
  r->local_rank = 1;
  r->local_size = 4;
  snprintf(r->host, sizeof r->host, "node-7.cluster.example");
  r->pid = 123456;
  snprintf(r->version, sizeof r->version, "0.1.0");
}

static void test_join_request_round_trip(void **state) {
  (void)state;
  gs__join_request in, out;
  fill_join_request(&in);
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_join_request(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_join_request(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_string_equal(out.job_id, "job-42");
  assert_int_equal(out.rank, 3);
  assert_int_equal(out.size, 8);
  assert_int_equal(out.local_rank, 1);
  assert_int_equal(out.local_size, 4);
  assert_string_equal(out.host, "node-7.cluster.example");
  assert_int_equal(out.pid, 123456);
  assert_string_equal(out.version, "0.1.0");
  assert_memory_equal(&in, &out, sizeof in);

  /* Negative and extreme int32 values and strings at their limits. */
  memset(&in, 0, sizeof in);
  memset(in.job_id, 'j', GS__MAX_JOB_ID);
  memset(in.host, 'h', GS__MAX_HOST);
  memset(in.version, 'v', sizeof in.version - 1);
  in.rank = -1;
  in.size = INT32_MAX;
  in.local_rank = INT32_MIN;
  in.local_size = 0;
  in.pid = -7;
  assert_int_equal(gs__encode_join_request(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_join_request(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_memory_equal(&in, &out, sizeof in);

  /* All defaults: an empty message. */
  memset(&in, 0, sizeof in);
  assert_int_equal(gs__encode_join_request(&in, &buf, &len), GS__OK);
  assert_int_equal(len, 0);
  assert_int_equal(gs__decode_join_request(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_memory_equal(&in, &out, sizeof in);
}

static void test_join_request_string_limits(void **state) {
  (void)state;
  struct {
    unsigned field;
    size_t n;
    const char *want;
  } cases[] = {
      {1, GS__MAX_JOB_ID + 1, "job_id of 128 bytes exceeds the limit of 127 bytes"},
      {6, GS__MAX_HOST + 1, "host of 256 bytes exceeds the limit of 255 bytes"},
      {8, 32, "version of 32 bytes exceeds the limit of 31 bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *s = repeat('x', cases[i].n);
    pbw w = {0};
    pbw_int(&w, 2, 1);
    pbw_str(&w, cases[i].field, s);
    gs__join_request out;
    char err[256] = "";
    assert_int_equal(gs__decode_join_request(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
    assert_string_equal(err, cases[i].want);
    /* A refused decode leaves the struct zeroed. */
    assert_int_equal(out.rank, 0);
    assert_string_equal(out.job_id, "");
    pbw_free(&w);
    free(s);
  }
}

static void test_join_response_round_trip(void **state) {
  (void)state;
  gs__join_response in, out;
  memset(&in, 0, sizeof in);
  snprintf(in.job_id, sizeof in.job_id, "job-42");
  in.epoch = UINT64_MAX - 1;
  in.rank = 5;
  in.size = 6;
  in.config.cycle_time_us = 3500;
  in.config.fusion_threshold_bytes = 64ull << 20;
  in.config.cache_capacity = 1024;
  in.config.stall_warning_s = 60;
  in.config.stall_shutdown_s = 600;
  in.config.deadlock_time_ms = 5000;
  in.config.heartbeat_ms = 1000;
  in.config.rank_timeout_ms = 30000;
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_join_response(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_join_response(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_string_equal(out.job_id, "job-42");
  assert_true(out.epoch == UINT64_MAX - 1);
  assert_int_equal(out.rank, 5);
  assert_int_equal(out.size, 6);
  assert_int_equal(out.config.cycle_time_us, 3500);
  assert_int_equal(out.config.fusion_threshold_bytes, 64ull << 20);
  assert_int_equal(out.config.cache_capacity, 1024);
  assert_int_equal(out.config.stall_warning_s, 60);
  assert_int_equal(out.config.stall_shutdown_s, 600);
  assert_int_equal(out.config.deadlock_time_ms, 5000);
  assert_int_equal(out.config.heartbeat_ms, 1000);
  assert_int_equal(out.config.rank_timeout_ms, 30000);
  assert_memory_equal(&in, &out, sizeof in);

  /* Over-long job id. */
  char *id = repeat('j', GS__MAX_JOB_ID + 1);
  pbw w = {0};
  pbw_str(&w, 1, id);
  assert_int_equal(gs__decode_join_response(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "job_id of 128 bytes exceeds the limit of 127 bytes");
  pbw_free(&w);
  free(id);
}

/* ---- rank message ------------------------------------------------------------ */

static void assert_request_equal(const gs__tensor_request *a, const gs__tensor_request *b) {
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->op, b->op);
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->ndim, b->ndim);
  for (int d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
  assert_int_equal(a->reduce_op, b->reduce_op);
  assert_double_same(a->prescale, b->prescale);
  assert_double_same(a->postscale, b->postscale);
  assert_int_equal(a->root_rank, b->root_rank);
  assert_int_equal(a->device, b->device);
}

static void test_rank_msg_round_trip(void **state) {
  (void)state;
  gs__tensor_request reqs[5];
  for (int i = 0; i < 5; i++) gs__tensor_request_init(&reqs[i]);
  snprintf(reqs[0].name, sizeof reqs[0].name, "dense/kernel");
  reqs[0].ndim = 2;
  reqs[0].shape[0] = 17;
  reqs[0].shape[1] = 17;
  snprintf(reqs[1].name, sizeof reqs[1].name, "embeddings");
  reqs[1].op = GS__OP_ALLGATHER;
  reqs[1].dtype = GS__BFLOAT16;
  reqs[1].ndim = 3;
  reqs[1].shape[0] = 0; /* an empty shard */
  reqs[1].shape[1] = 1 << 20;
  reqs[1].shape[2] = 3;
  reqs[1].device = GS__DEVICE_GPU;
  snprintf(reqs[2].name, sizeof reqs[2].name, "step");
  reqs[2].op = GS__OP_BROADCAST;
  reqs[2].dtype = GS__INT64;
  reqs[2].ndim = 0; /* a scalar */
  reqs[2].root_rank = 3;
  snprintf(reqs[3].name, sizeof reqs[3].name, "loss");
  reqs[3].dtype = GS__FLOAT64;
  reqs[3].reduce_op = GS__AVERAGE;
  reqs[3].prescale = 0.25;
  reqs[3].postscale = -3.5e10;
  reqs[3].ndim = GS__MAX_DIMS;
  for (int d = 0; d < GS__MAX_DIMS; d++) reqs[3].shape[d] = d % 3 + 1;
  /* The longest name accepted, and the last value of every enum. */
  memset(reqs[4].name, 'n', GS__MAX_NAME);
  reqs[4].name[GS__MAX_NAME] = 0;
  reqs[4].op = GS__OP_JOIN;
  reqs[4].dtype = GS__UINT8;
  reqs[4].reduce_op = GS__ADASUM;
  reqs[4].device = GS__DEVICE_GPU;
  reqs[4].ndim = 1;
  reqs[4].shape[0] = INT64_MAX;
  reqs[4].root_rank = -2;

  uint64_t done[] = {1, 2, 1000000, UINT64_MAX};
  gs__rank_msg in;
  memset(&in, 0, sizeof in);
  in.has_hello = 1;
  in.hello_rank = 2;
  in.hello_epoch = 77;
  in.hello_fast_path = 1;
  in.nrequests = 5;
  in.requests = reqs;
  in.ndone = 4;
  in.done_plans = done;
  in.heartbeat = 1;
  in.has_leave = 1;
  snprintf(in.leave_reason, sizeof in.leave_reason, "training finished");
  char blocked[3][GS__MAX_NAME + 1];
  memset(blocked, 0, sizeof blocked);
  snprintf(blocked[0], sizeof blocked[0], "grads/A");
  memset(blocked[1], 'b', GS__MAX_NAME);
  snprintf(blocked[2], sizeof blocked[2], "grads/B");
  in.blocked_update = 1;
  in.nblocked = 3;
  in.blocked_on = blocked;
  uint32_t cached[] = {1, 7, UINT32_MAX};
  in.ncached = 3;
  in.cached = cached;

  uint8_t *buf;
  size_t len;
  char err[256] = "";
  gs__rank_msg out;
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.has_hello, 1);
  assert_int_equal(out.hello_rank, 2);
  assert_int_equal(out.hello_epoch, 77);
  assert_int_equal(out.hello_fast_path, 1);
  assert_int_equal(out.nrequests, 5);
  for (int i = 0; i < 5; i++) assert_request_equal(&out.requests[i], &reqs[i]);
  assert_int_equal(out.ndone, 4);
  assert_memory_equal(out.done_plans, done, sizeof done);
  assert_int_equal(out.heartbeat, 1);
  assert_int_equal(out.has_leave, 1);
  assert_string_equal(out.leave_reason, "training finished");
  assert_int_equal(out.blocked_update, 1);
  assert_int_equal(out.nblocked, 3);
  for (int i = 0; i < 3; i++) assert_string_equal(out.blocked_on[i], blocked[i]);
  assert_int_equal(out.ncached, 3);
  assert_memory_equal(out.cached, cached, sizeof cached);
  gs__rank_msg_free(&out);
  assert_null(out.requests);
  assert_null(out.done_plans);
  assert_null(out.blocked_on);
  assert_null(out.cached);
  gs__rank_msg_free(NULL);
}

static void test_rank_msg_parts_alone(void **state) {
  (void)state;
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  gs__rank_msg in, out;

  /* Empty message: nothing set. */
  memset(&in, 0, sizeof in);
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(len, 0);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.has_hello, 0);
  assert_int_equal(out.nrequests, 0);
  assert_null(out.requests);
  assert_int_equal(out.ndone, 0);
  assert_null(out.done_plans);
  assert_int_equal(out.heartbeat, 0);
  assert_int_equal(out.has_leave, 0);
  assert_int_equal(out.blocked_update, 0);
  assert_int_equal(out.nblocked, 0);
  assert_null(out.blocked_on);
  assert_int_equal(out.ncached, 0);
  assert_null(out.cached);
  gs__rank_msg_free(&out);

  /* "No longer blocked": an update with an empty list. */
  in.blocked_update = 1;
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.blocked_update, 1);
  assert_int_equal(out.nblocked, 0);
  assert_null(out.blocked_on);
  gs__rank_msg_free(&out);
  in.blocked_update = 0;

  /* Hello for rank 0 epoch 0 is still a hello; a leave without a reason is
   * still a leave. */
  in.has_hello = 1;
  in.has_leave = 1;
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.has_hello, 1);
  assert_int_equal(out.hello_rank, 0);
  assert_int_equal(out.hello_epoch, 0);
  assert_int_equal(out.hello_fast_path, 0);
  assert_int_equal(out.has_leave, 1);
  assert_string_equal(out.leave_reason, "");
  assert_int_equal(out.heartbeat, 0);
  gs__rank_msg_free(&out);

  /* A heartbeat alone. */
  memset(&in, 0, sizeof in);
  in.heartbeat = 1;
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.heartbeat, 1);
  assert_int_equal(out.has_hello, 0);
  assert_int_equal(out.has_leave, 0);
  gs__rank_msg_free(&out);

  /* A leave reason at the text limit survives whole. */
  memset(&in, 0, sizeof in);
  in.has_leave = 1;
  memset(in.leave_reason, 'r', GS__MAX_TEXT - 1);
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(strlen(out.leave_reason), GS__MAX_TEXT - 1);
  assert_memory_equal(out.leave_reason, in.leave_reason, GS__MAX_TEXT);
  gs__rank_msg_free(&out);
}

static void test_rank_msg_rejects_bad_requests(void **state) {
  (void)state;
  const int64_t shape2[] = {4, 4};

  /* A valid hand-made request is accepted (the encoder below is right). */
  pbw ok = {0};
  pbw_request(&ok, "dense/bias", 1, 4, shape2, 2);
  gs__rank_msg m;
  char err[256] = "";
  assert_int_equal(decode_one_request(&ok, &m, err, sizeof err), GS__OK);
  assert_int_equal(m.nrequests, 1);
  assert_string_equal(m.requests[0].name, "dense/bias");
  assert_int_equal(m.requests[0].op, GS__OP_ALLGATHER);
  assert_int_equal(m.requests[0].dtype, GS__INT32);
  assert_int_equal(m.requests[0].ndim, 2);
  gs__rank_msg_free(&m);
  pbw_free(&ok);

  /* Name over GS__MAX_NAME. */
  char *longname = repeat('a', GS__MAX_NAME + 1);
  pbw w = {0};
  pbw_request(&w, longname, 0, 0, shape2, 2);
  expect_request_refused(&w, "tensor name of 256 bytes exceeds the limit of 255 bytes");
  pbw_free(&w);
  free(longname);

  /* Empty name, given as "" and left out. */
  pbw_request(&w, "", 0, 0, shape2, 2);
  expect_request_refused(&w, "a tensor request has an empty name");
  pbw_free(&w);
  pbw_request(&w, NULL, 0, 0, shape2, 2);
  expect_request_refused(&w, "a tensor request has an empty name");
  pbw_free(&w);

  /* More than GS__MAX_DIMS dimensions. */
  int64_t many[GS__MAX_DIMS + 1];
  for (size_t i = 0; i < GS__MAX_DIMS + 1; i++) many[i] = 1;
  pbw_request(&w, "deep", 0, 0, many, GS__MAX_DIMS + 1);
  expect_request_refused(&w, "tensor 'deep': 17 dimensions exceed the limit of 16");
  pbw_free(&w);

  /* A negative dimension. */
  const int64_t neg[] = {4, -3, 2};
  pbw_request(&w, "w", 0, 0, neg, 3);
  expect_request_refused(&w, "tensor 'w': dimension 1 is negative (-3)");
  pbw_free(&w);
  const int64_t most_neg[] = {INT64_MIN};
  pbw_request(&w, "w", 0, 0, most_neg, 1);
  expect_request_refused(&w, "tensor 'w': dimension 0 is negative (-9223372036854775808)");
  pbw_free(&w);

  /* Element counts that overflow int64. */
  const int64_t big[] = {INT64_C(1) << 32, INT64_C(1) << 32};
  pbw_request(&w, "big", 0, 0, big, 2);
  expect_request_refused(&w, "tensor 'big': element count overflows 64 bits");
  pbw_free(&w);
  const int64_t big2[] = {INT64_MAX, 2};
  pbw_request(&w, "big2", 0, 0, big2, 2);
  expect_request_refused(&w, "tensor 'big2': element count overflows 64 bits");
  pbw_free(&w);
  /* ... but a zero dimension makes any product zero. */
  const int64_t zero[] = {0, INT64_MAX, INT64_MAX};
  pbw_request(&w, "empty", 0, 0, zero, 3);
  assert_int_equal(decode_one_request(&w, &m, err, sizeof err), GS__OK);
  assert_int_equal(m.requests[0].ndim, 3);
  assert_int_equal(m.requests[0].shape[2], INT64_MAX);
  gs__rank_msg_free(&m);
  pbw_free(&w);

  /* Unknown enum values: op, dtype, reduce_op, device; past the end and
   * negative. */
  pbw_request(&w, "e", 99, 0, shape2, 2);
  expect_request_refused(&w, "op has unknown value 99");
  pbw_free(&w);
  pbw_request(&w, "e", GS__OP_TYPE_COUNT, 0, shape2, 2);
  expect_request_refused(&w, "op has unknown value 7");
  pbw_free(&w);
  pbw_request(&w, "e", -1, 0, shape2, 2);
  expect_request_refused(&w, "op has unknown value -1");
  pbw_free(&w);
  pbw_request(&w, "e", 0, GS__DTYPE_COUNT, shape2, 2);
  expect_request_refused(&w, "dtype has unknown value 9");
  pbw_free(&w);
  pbw_request(&w, "e", 0, 0, shape2, 2);
  pbw_int(&w, 5, GS__REDUCE_OP_COUNT);
  expect_request_refused(&w, "reduce_op has unknown value 6");
  pbw_free(&w);
  pbw_request(&w, "e", 0, 0, shape2, 2);
  pbw_int(&w, 9, 2);
  expect_request_refused(&w, "device has unknown value 2");
  pbw_free(&w);
  pbw_request(&w, "e", 0, 0, shape2, 2);
  pbw_int(&w, 9, -5);
  expect_request_refused(&w, "device has unknown value -5");
  pbw_free(&w);

  /* A bad request after good ones fails the whole message, freeing the
   * good ones (valgrind/ASan check the freeing). */
  pbw msg = {0}, good = {0}, bad = {0};
  pbw_request(&good, "fine", 0, 0, shape2, 2);
  pbw_request(&bad, "worse", 0, 0, neg, 3);
  pbw_sub(&msg, 2, &good);
  pbw_sub(&msg, 2, &good);
  pbw_sub(&msg, 2, &bad);
  pbw_int(&msg, 4, 1);
  assert_int_equal(gs__decode_rank_msg(msg.b, msg.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "tensor 'worse': dimension 1 is negative (-3)");
  assert_null(m.requests);
  assert_int_equal(m.nrequests, 0);
  assert_int_equal(m.heartbeat, 0);
  pbw_free(&msg);
  pbw_free(&good);
  pbw_free(&bad);
}

static void test_rank_msg_rejects_bad_blocked_on(void **state) {
  (void)state;
  gs__rank_msg m;
  char err[256] = "";

  /* GS__MAX_BLOCKED names pass, one more is refused. */
  pbw w = {0};
  for (int i = 0; i < GS__MAX_BLOCKED; i++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    pbw_str(&w, 6, name);
  }
  pbw_int(&w, 7, 1);
  assert_int_equal(gs__decode_rank_msg(w.b, w.n, &m, err, sizeof err), GS__OK);
  assert_int_equal(m.nblocked, GS__MAX_BLOCKED);
  assert_string_equal(m.blocked_on[GS__MAX_BLOCKED - 1], "t63");
  gs__rank_msg_free(&m);
  pbw_str(&w, 6, "one-too-many");
  assert_int_equal(gs__decode_rank_msg(w.b, w.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "65 blocked-on names exceed the limit of 64");
  assert_null(m.blocked_on);
  assert_int_equal(m.nblocked, 0);
  pbw_free(&w);

  /* A blocked-on name over GS__MAX_NAME, after a good one. */
  char *longname = repeat('z', GS__MAX_NAME + 1);
  pbw_str(&w, 6, "fine");
  pbw_str(&w, 6, longname);
  pbw_int(&w, 7, 1);
  assert_int_equal(gs__decode_rank_msg(w.b, w.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "blocked-on tensor name of 256 bytes exceeds the limit of 255 bytes");
  assert_null(m.blocked_on);
  assert_int_equal(m.blocked_update, 0);
  pbw_free(&w);
  free(longname);
}

/* The fast path's parts of a RankMessage: the escalation, the cumulative
 * report and the ops waited on, each bounded like blocked_on. */
static void test_rank_msg_fast_path_round_trip(void **state) {
  (void)state;
  gs__rank_msg in, out;
  memset(&in, 0, sizeof in);
  in.escalate_round = 1ull << 40;
  in.has_fast_report = 1;
  in.fast_report =
      (gs__fast_report){.rounds = 7, .tensors = 1127, .collectives = 9, .bytes = 1ull << 33};
  gs__fast_pending fp[2] = {{.name = "grads/a", .cache_id = 12, .age_ms = 1500},
                            {.name = "gs.barrier.3", .cache_id = 0, .age_ms = 4294967295u}};
  in.fast_pending = fp;
  in.nfast_pending = 2;
  in.fast_pending_update = 1;
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.escalate_round, 1ull << 40);
  assert_int_equal(out.has_fast_report, 1);
  assert_int_equal(out.fast_report.rounds, 7);
  assert_int_equal(out.fast_report.tensors, 1127);
  assert_int_equal(out.fast_report.collectives, 9);
  assert_int_equal(out.fast_report.bytes, 1ull << 33);
  assert_int_equal(out.fast_pending_update, 1);
  assert_int_equal(out.nfast_pending, 2);
  assert_string_equal(out.fast_pending[0].name, "grads/a");
  assert_int_equal(out.fast_pending[0].cache_id, 12);
  assert_int_equal(out.fast_pending[0].age_ms, 1500);
  assert_string_equal(out.fast_pending[1].name, "gs.barrier.3");
  assert_int_equal(out.fast_pending[1].cache_id, 0);
  assert_int_equal(out.fast_pending[1].age_ms, 4294967295u);
  gs__rank_msg_free(&out);

  /* An update to "none": no entries, the flag set; no report sent. */
  memset(&in, 0, sizeof in);
  in.fast_pending_update = 1;
  assert_int_equal(gs__encode_rank_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.fast_pending_update, 1);
  assert_int_equal(out.nfast_pending, 0);
  assert_null(out.fast_pending);
  assert_int_equal(out.has_fast_report, 0);
  assert_int_equal(out.escalate_round, 0);
  gs__rank_msg_free(&out);

  /* GS__MAX_BLOCKED entries pass, one more is refused; a long name is
   * refused after a good entry, and nothing is kept. */
  pbw w = {0};
  for (int i = 0; i <= GS__MAX_BLOCKED; i++) {
    pbw sub = {0};
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    pbw_str(&sub, 1, name);
    pbw_int(&sub, 2, (uint64_t)i + 1);
    if (i == GS__MAX_BLOCKED) {
      assert_int_equal(gs__decode_rank_msg(w.b, w.n, &out, err, sizeof err), GS__OK);
      assert_int_equal(out.nfast_pending, GS__MAX_BLOCKED);
      assert_string_equal(out.fast_pending[GS__MAX_BLOCKED - 1].name, "t63");
      assert_int_equal(out.fast_pending[GS__MAX_BLOCKED - 1].cache_id, 64);
      gs__rank_msg_free(&out);
    }
    pbw_bytes(&w, 13, sub.b, sub.n);
    pbw_free(&sub);
  }
  assert_int_equal(gs__decode_rank_msg(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "65 fast-pending ops exceed the limit of 64");
  assert_null(out.fast_pending);
  assert_int_equal(out.nfast_pending, 0);
  pbw_free(&w);

  char *longname = repeat('z', GS__MAX_NAME + 1);
  pbw good = {0}, bad = {0};
  pbw_str(&good, 1, "fine");
  pbw_str(&bad, 1, longname);
  pbw_bytes(&w, 13, good.b, good.n);
  pbw_bytes(&w, 13, bad.b, bad.n);
  assert_int_equal(gs__decode_rank_msg(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "fast-pending tensor name of 256 bytes exceeds the limit of 255 bytes");
  assert_null(out.fast_pending);
  pbw_free(&good);
  pbw_free(&bad);
  pbw_free(&w);
  free(longname);
}

/* ---- plan message ------------------------------------------------------------ */

static void test_plan_msg_world_round_trip(void **state) {
  (void)state;
  gs__rank_info ranks[2] = {{0, "node-a", 1001}, {2, "node-c.example.org", 1003}};
  int32_t missing[] = {1, 3};
  gs__plan_msg in;
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_WORLD;
  in.world.ready = 0;
  in.world.size = 4;
  in.world.epoch = 9;
  in.world.nranks = 2;
  in.world.ranks = ranks;
  in.world.nmissing = 2;
  in.world.missing_ranks = missing;

  uint8_t *buf;
  size_t len;
  char err[256] = "";
  gs__plan_msg out;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_WORLD);
  assert_int_equal(out.world.ready, 0);
  assert_int_equal(out.world.size, 4);
  assert_int_equal(out.world.epoch, 9);
  assert_int_equal(out.world.nranks, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(out.world.ranks[i].rank, ranks[i].rank);
    assert_string_equal(out.world.ranks[i].host, ranks[i].host);
    assert_int_equal(out.world.ranks[i].pid, ranks[i].pid);
  }
  assert_int_equal(out.world.nmissing, 2);
  assert_int_equal(out.world.missing_ranks[0], 1);
  assert_int_equal(out.world.missing_ranks[1], 3);
  assert_null(out.text);
  gs__plan_msg_free(&out);

  /* Ready, nobody missing. */
  gs__rank_info all[3] = {{0, "a", 1}, {1, "b", 2}, {2, "c", 3}};
  in.world.ready = 1;
  in.world.size = 3;
  in.world.nranks = 3;
  in.world.ranks = all;
  in.world.nmissing = 0;
  in.world.missing_ranks = NULL;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_WORLD);
  assert_int_equal(out.world.ready, 1);
  assert_int_equal(out.world.size, 3);
  assert_int_equal(out.world.nranks, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(out.world.ranks[i].rank, i);
    assert_string_equal(out.world.ranks[i].host, all[i].host);
    assert_int_equal(out.world.ranks[i].pid, i + 1);
  }
  assert_int_equal(out.world.nmissing, 0);
  assert_null(out.world.missing_ranks);
  gs__plan_msg_free(&out);

  /* Nobody yet: an empty world status. */
  memset(&in.world, 0, sizeof in.world);
  in.world.size = 2;
  int32_t both[] = {0, 1};
  in.world.nmissing = 2;
  in.world.missing_ranks = both;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_WORLD);
  assert_int_equal(out.world.nranks, 0);
  assert_int_equal(out.world.nmissing, 2);
  assert_int_equal(out.world.missing_ranks[1], 1);
  gs__plan_msg_free(&out);
}

static void assert_response_equal(const gs__response *a, const gs__response *b) {
  assert_int_equal(a->kind, b->kind);
  assert_int_equal(a->op, b->op);
  assert_int_equal(a->dtype, b->dtype);
  assert_int_equal(a->reduce_op, b->reduce_op);
  assert_double_same(a->prescale, b->prescale);
  assert_double_same(a->postscale, b->postscale);
  assert_int_equal(a->root_rank, b->root_rank);
  assert_int_equal(a->device, b->device);
  assert_int_equal(a->error_status, b->error_status);
  if (a->error_message)
    assert_string_equal(a->error_message, b->error_message);
  else
    assert_null(b->error_message);
  assert_int_equal(a->ntensors, b->ntensors);
  for (size_t k = 0; k < a->ntensors; k++) {
    const gs__plan_tensor *x = &a->tensors[k], *y = &b->tensors[k];
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->ndim, y->ndim);
    for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
    assert_int_equal(x->nrank_dims, y->nrank_dims);
    for (size_t r = 0; r < x->nrank_dims; r++) assert_int_equal(x->rank_dims[r], y->rank_dims[r]);
    if (!x->nrank_dims) assert_null(y->rank_dims);
    assert_int_equal(x->cache_id, y->cache_id);
  }
}

static void test_plan_msg_plan_round_trip(void **state) {
  (void)state;
  gs__plan_tensor fused[3] = {
      {.name = "layer1/kernel", .ndim = 2, .shape = {128, 64}, .cache_id = 3},
      {.name = "layer1/bias", .ndim = 1, .shape = {64}, .cache_id = UINT32_MAX},
      {.name = "scalar", .ndim = 0},
  };
  int64_t rank_dims[4] = {3, 0, 5, 1};
  gs__plan_tensor gathered[1] = {
      {.name = "tokens", .ndim = 2, .shape = {3, 8}, .nrank_dims = 4, .rank_dims = rank_dims}};
  gs__plan_tensor bcast[1] = {{.name = "init/weights", .ndim = 1, .shape = {10}}};
  gs__plan_tensor failed[1] = {{.name = "dense/kernel", .ndim = 2, .shape = {17, 17}}};
  char mismatch[] = "tensor 'dense/kernel': mismatched shapes: ranks [0,2] sent [17,17], ranks "
                    "[1] sent [18,18]";
  gs__response resps[4] = {
      {.kind = GS__RESP_COLLECTIVE,
       .op = GS__OP_ALLREDUCE,
       .dtype = GS__FLOAT16,
       .reduce_op = GS__AVERAGE,
       .prescale = 0.5,
       .postscale = 0.125,
       .device = GS__DEVICE_GPU,
       .ntensors = 3,
       .tensors = fused},
      {.kind = GS__RESP_COLLECTIVE,
       .op = GS__OP_ALLGATHER,
       .dtype = GS__INT8,
       .prescale = 1.0,
       .postscale = 1.0,
       .ntensors = 1,
       .tensors = gathered},
      {.kind = GS__RESP_COLLECTIVE,
       .op = GS__OP_BROADCAST,
       .dtype = GS__FLOAT64,
       .root_rank = 3,
       .prescale = 1.0,
       .postscale = 1.0,
       .ntensors = 1,
       .tensors = bcast},
      {.kind = GS__RESP_ERROR,
       .op = GS__OP_ALLREDUCE,
       .dtype = GS__FLOAT32,
       .reduce_op = GS__MAX,
       .prescale = 1.0,
       .postscale = 1.0,
       .ntensors = 1,
       .tensors = failed,
       .error_status = GS__ERR_MISMATCH,
       .error_message = mismatch},
  };
  gs__plan_msg in;
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_PLAN;
  in.plan.seq = 12345678901ull;
  in.plan.nresponses = 4;
  in.plan.responses = resps;
  uint32_t evicted[] = {2, 9};
  in.plan.nevicted = 2;
  in.plan.evicted = evicted;

  uint8_t *buf;
  size_t len;
  char err[256] = "";
  gs__plan_msg out;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_PLAN);
  assert_int_equal(out.plan.seq, 12345678901ull);
  assert_int_equal(out.plan.fast_after, 0);
  assert_int_equal(out.plan.nresponses, 4);
  for (int i = 0; i < 4; i++) assert_response_equal(&resps[i], &out.plan.responses[i]);
  assert_string_equal(out.plan.responses[3].error_message, mismatch);
  assert_int_equal(out.plan.responses[1].tensors[0].rank_dims[2], 5);
  assert_int_equal(out.plan.responses[0].tensors[0].cache_id, 3);
  assert_int_equal(out.plan.responses[0].tensors[2].cache_id, 0);
  assert_int_equal(out.plan.nevicted, 2);
  assert_memory_equal(out.plan.evicted, evicted, sizeof evicted);
  gs__plan_msg_free(&out);
  assert_null(out.plan.responses);
  gs__plan_msg_free(NULL);

  /* A plan with no responses; an error response with no tensors and an
   * empty message. */
  gs__response bare = {.kind = GS__RESP_ERROR, .error_status = GS__ERR_SHUTDOWN};
  in.plan.seq = 1;
  in.plan.nresponses = 0;
  in.plan.responses = NULL;
  in.plan.nevicted = 0;
  in.plan.evicted = NULL;
  in.plan.fast_after = 1; /* an empty plan that only turns the fast path on */
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_PLAN);
  assert_int_equal(out.plan.seq, 1);
  assert_int_equal(out.plan.nresponses, 0);
  assert_int_equal(out.plan.fast_after, 1);
  assert_null(out.plan.responses);
  assert_int_equal(out.plan.nevicted, 0);
  assert_null(out.plan.evicted);
  gs__plan_msg_free(&out);
  in.plan.nresponses = 1;
  in.plan.responses = &bare;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.plan.nresponses, 1);
  assert_int_equal(out.plan.responses[0].kind, GS__RESP_ERROR);
  assert_int_equal(out.plan.responses[0].error_status, GS__ERR_SHUTDOWN);
  assert_string_equal(out.plan.responses[0].error_message, "");
  assert_int_equal(out.plan.responses[0].ntensors, 0);
  gs__plan_msg_free(&out);
}

static void test_plan_msg_abort_and_rank_error_round_trip(void **state) {
  (void)state;
  char reason[] = "rank 1 (node-b, pid 4242) was lost: connection reset";
  gs__plan_msg in, out;
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_ABORT;
  in.status = GS__ERR_RANK_LOST;
  in.text = reason;
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_ABORT);
  assert_int_equal(out.status, GS__ERR_RANK_LOST);
  assert_string_equal(out.text, reason);
  gs__plan_msg_free(&out);

  /* An abort with no reason decodes to an empty string, not NULL. */
  in.text = NULL;
  in.status = GS__ERR_ABORTED;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_ABORT);
  assert_int_equal(out.status, GS__ERR_ABORTED);
  assert_non_null(out.text);
  assert_string_equal(out.text, "");
  gs__plan_msg_free(&out);

  char stop[] = "rank 2 (node-c:77) left the job while the ranks agreed on cached tensors";
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_FAST_STOP;
  in.text = stop;
  in.abort_round = 1;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_FAST_STOP);
  assert_int_equal(out.abort_round, 1);
  assert_string_equal(out.text, stop);
  gs__plan_msg_free(&out);
  in.text = NULL;
  in.abort_round = 0;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_FAST_STOP);
  assert_int_equal(out.abort_round, 0);
  assert_string_equal(out.text, "");
  gs__plan_msg_free(&out);

  char text[] = "tensor 'grads/a': rank 0 submitted it again while its earlier allreduce is "
                "still in flight";
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_RANK_ERROR;
  in.status = GS__ERR_DUPLICATE_NAME;
  in.text = text;
  snprintf(in.name, sizeof in.name, "grads/a");
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.kind, GS__MSG_RANK_ERROR);
  assert_int_equal(out.status, GS__ERR_DUPLICATE_NAME);
  assert_string_equal(out.name, "grads/a");
  assert_string_equal(out.text, text);
  gs__plan_msg_free(&out);

  /* Nothing to encode. */
  memset(&in, 0, sizeof in);
  buf = NULL;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__ERR_INVALID_ARG);
  assert_null(buf);
}

static void test_plan_msg_rejections(void **state) {
  (void)state;
  gs__plan_msg m;
  char err[512] = "";

  /* No kind at all. */
  assert_int_equal(gs__decode_plan_msg((const uint8_t *)"", 0, &m, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "PlanMessage carries no known kind");

  /* Unknown enum values in a response. */
  struct {
    unsigned field;
    int64_t value;
    const char *want;
  } enums[] = {
      {1, 2, "response kind has unknown value 2"}, {2, 7, "op has unknown value 7"},
      {2, -1, "op has unknown value -1"},          {3, 9, "dtype has unknown value 9"},
      {4, 6, "reduce_op has unknown value 6"},     {8, 2, "device has unknown value 2"},
  };
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++) {
    pbw resp = {0};
    pbw_int(&resp, enums[i].field, enums[i].value);
    expect_plan_refused(&resp, enums[i].want);
    pbw_free(&resp);
  }

  /* Plan tensors: an over-long name, too many and negative dims, an
   * overflowing shape, too many per-rank sizes. */
  char *longname = repeat('p', GS__MAX_NAME + 1);
  int64_t many[GS__MAX_DIMS + 1];
  for (size_t i = 0; i < GS__MAX_DIMS + 1; i++) many[i] = 2;
  const int64_t neg[] = {-8};
  const int64_t big[] = {INT64_C(1) << 40, INT64_C(1) << 40};
  struct {
    const char *name;
    const int64_t *shape;
    size_t ndim;
    const char *want;
  } tensors[] = {
      {longname, NULL, 0, "tensor name of 256 bytes exceeds the limit of 255 bytes"},
      {"t", many, GS__MAX_DIMS + 1, "tensor 't': 17 dimensions exceed the limit of 16"},
      {"t", neg, 1, "tensor 't': dimension 0 is negative (-8)"},
      {"t", big, 2, "tensor 't': element count overflows 64 bits"},
  };
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
    pbw resp = {0}, t = {0};
    pbw_str(&t, 1, tensors[i].name);
    if (tensors[i].ndim) pbw_packed(&t, 2, tensors[i].shape, tensors[i].ndim);
    pbw_sub(&resp, 9, &t);
    expect_plan_refused(&resp, tensors[i].want);
    pbw_free(&t);
    pbw_free(&resp);
  }
  free(longname);

  int64_t *dims = calloc(GS__MAX_WORLD + 1, sizeof *dims);
  assert_non_null(dims);
  pbw resp = {0}, t = {0};
  pbw_str(&t, 1, "gathered");
  pbw_packed(&t, 3, dims, GS__MAX_WORLD + 1);
  pbw_sub(&resp, 9, &t);
  expect_plan_refused(&resp, "tensor 'gathered': 65537 per-rank sizes exceed the world limit");
  pbw_free(&t);
  pbw_free(&resp);

  /* A world status listing more ranks than a job can have. */
  pbw world = {0}, msg = {0};
  pbw_packed(&world, 5, dims, GS__MAX_WORLD + 1);
  pbw_sub(&msg, 1, &world);
  assert_int_equal(gs__decode_plan_msg(msg.b, msg.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_contains(err, "WorldStatus lists more ranks than the limit of 65536");
  assert_null(m.world.missing_ranks);
  pbw_free(&world);
  pbw_free(&msg);
  free(dims);

  /* A world status with an over-long host. */
  char *longhost = repeat('h', GS__MAX_HOST + 1);
  pbw ri = {0};
  pbw_int(&ri, 1, 0);
  pbw_str(&ri, 2, longhost);
  pbw_sub(&world, 4, &ri);
  pbw_sub(&world, 4, &ri);
  pbw_sub(&msg, 1, &world);
  assert_int_equal(gs__decode_plan_msg(msg.b, msg.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "host of 256 bytes exceeds the limit of 255 bytes");
  assert_null(m.world.ranks);
  pbw_free(&ri);
  pbw_free(&world);
  pbw_free(&msg);
  free(longhost);

  /* A rank error for an over-long tensor name. */
  char *longname2 = repeat('q', GS__MAX_NAME + 1);
  pbw te = {0};
  pbw_str(&te, 1, longname2);
  pbw_int(&te, 2, GS__ERR_DUPLICATE_NAME);
  pbw_str(&te, 3, "duplicate");
  pbw_sub(&msg, 4, &te);
  assert_int_equal(gs__decode_plan_msg(msg.b, msg.n, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "tensor name of 256 bytes exceeds the limit of 255 bytes");
  assert_null(m.text);
  pbw_free(&te);
  pbw_free(&msg);
  free(longname2);

  /* Over-long texts are cut to the text limit rather than refused. */
  char *longtext = repeat('t', GS__MAX_TEXT + 100);
  pbw ab = {0};
  pbw_int(&ab, 1, GS__ERR_STALL);
  pbw_str(&ab, 2, longtext);
  pbw_sub(&msg, 3, &ab);
  assert_int_equal(gs__decode_plan_msg(msg.b, msg.n, &m, err, sizeof err), GS__OK);
  assert_int_equal(m.kind, GS__MSG_ABORT);
  assert_int_equal(m.status, GS__ERR_STALL);
  assert_int_equal(strlen(m.text), GS__MAX_TEXT - 1);
  gs__plan_msg_free(&m);
  pbw_free(&ab);
  pbw_free(&msg);
  free(longtext);
}

/* ---- malformed bytes ---------------------------------------------------------- */

/* Every decoder on one buffer: each either accepts it or refuses it with
 * GS__ERR_INVALID_ARG and a message; returns how many refused. */
static int decode_all(const uint8_t *buf, size_t len) {
  int refused = 0;
  char err[512];
  int rc;
  gs__join_request jq;
  err[0] = 0;
  rc = gs__decode_join_request(buf, len, &jq, err, sizeof err);
  if (rc) {
    assert_int_equal(rc, GS__ERR_INVALID_ARG);
    assert_true(err[0] != 0);
    refused++;
  }
  gs__join_response jr;
  err[0] = 0;
  rc = gs__decode_join_response(buf, len, &jr, err, sizeof err);
  if (rc) {
    assert_int_equal(rc, GS__ERR_INVALID_ARG);
    assert_true(err[0] != 0);
    refused++;
  }
  gs__rank_msg rm;
  err[0] = 0;
  rc = gs__decode_rank_msg(buf, len, &rm, err, sizeof err);
  if (rc) {
    assert_int_equal(rc, GS__ERR_INVALID_ARG);
    assert_true(err[0] != 0);
    refused++;
  } else {
    gs__rank_msg_free(&rm);
  }
  gs__plan_msg pm;
  err[0] = 0;
  rc = gs__decode_plan_msg(buf, len, &pm, err, sizeof err);
  if (rc) {
    assert_int_equal(rc, GS__ERR_INVALID_ARG);
    assert_true(err[0] != 0);
    refused++;
  } else {
    gs__plan_msg_free(&pm);
  }
  for (int k = GS__KV_SET_REQ; k <= GS__KV_DELETE_RESP; k++) {
    gs__kv_msg kv;
    err[0] = 0;
    rc = gs__decode_kv((gs__kv_kind)k, buf, len, &kv, err, sizeof err);
    if (rc) {
      assert_int_equal(rc, GS__ERR_INVALID_ARG);
      assert_true(err[0] != 0);
      refused++;
    } else {
      gs__kv_msg_free(&kv);
    }
  }
  return refused;
}

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static void test_random_garbage(void **state) {
  (void)state;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  int refused = 0;
  for (int iter = 0; iter < 3000; iter++) {
    size_t len = (size_t)(xorshift(&seed) % 200);
    uint8_t *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)xorshift(&seed);
    refused += decode_all(buf, len);
    free(buf);
  }
  /* Random bytes are nearly always malformed. */
  assert_true(refused > 3000 * 5);
}

static void test_known_malformed_bytes(void **state) {
  (void)state;
  char err[256];
  gs__rank_msg rm;
  gs__plan_msg pm;
  gs__join_request jq;
  gs__kv_msg kv;

  /* A varint that never ends. */
  const uint8_t endless[] = {0x10, 0xff, 0xff, 0xff, 0xff, 0xff,
                             0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  assert_int_equal(gs__decode_join_request(endless, sizeof endless, &jq, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "malformed JoinRequest (12 bytes)");
  /* A length running past the end. */
  const uint8_t overrun[] = {0x12, 0x40, 0x0a, 0x01};
  assert_int_equal(gs__decode_rank_msg(overrun, sizeof overrun, &rm, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "malformed RankMessage (4 bytes)");
  assert_null(rm.requests);
  /* Wire type 7 does not exist. */
  const uint8_t badwire[] = {0x0f, 0x00};
  assert_int_equal(gs__decode_plan_msg(badwire, sizeof badwire, &pm, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "malformed PlanMessage (2 bytes)");
  /* A string field given as a varint. */
  const uint8_t wrongtype[] = {0x08, 0x05};
  assert_int_equal(gs__decode_kv(GS__KV_SET_REQ, wrongtype, sizeof wrongtype, &kv, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "malformed KvSetRequest (2 bytes)");
  assert_null(kv.key);

  /* A tiny or missing error buffer is respected. */
  char small[10];
  memset(small, 'z', sizeof small);
  assert_int_equal(gs__decode_rank_msg(overrun, sizeof overrun, &rm, small, sizeof small),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(small, "malformed");
  assert_int_equal(gs__decode_rank_msg(overrun, sizeof overrun, &rm, NULL, 0), GS__ERR_INVALID_ARG);
}

/* Every prefix of a valid message: decoded or refused, never read past its
 * end; cuts inside the last field are always refused. */
static void check_truncations(const uint8_t *buf, size_t len,
                              int (*decode)(const uint8_t *, size_t), size_t must_refuse_from) {
  for (size_t n = 0; n < len; n++) {
    uint8_t *p = prefix_copy(buf, n);
    int rc = decode(p, n);
    free(p);
    if (n >= must_refuse_from)
      assert_int_equal(rc, GS__ERR_INVALID_ARG);
    else
      assert_true(rc == GS__OK || rc == GS__ERR_INVALID_ARG);
  }
}

static int decode_rank_prefix(const uint8_t *buf, size_t len) {
  gs__rank_msg m;
  char err[256] = "";
  int rc = gs__decode_rank_msg(buf, len, &m, err, sizeof err);
  if (rc == GS__OK)
    gs__rank_msg_free(&m);
  else if (len)
    assert_contains(err, "malformed RankMessage");
  return rc;
}

static int decode_plan_prefix(const uint8_t *buf, size_t len) {
  gs__plan_msg m;
  char err[256] = "";
  int rc = gs__decode_plan_msg(buf, len, &m, err, sizeof err);
  if (rc == GS__OK)
    gs__plan_msg_free(&m);
  else if (len)
    assert_contains(err, "malformed PlanMessage");
  return rc;
}

static int decode_join_prefix(const uint8_t *buf, size_t len) {
  gs__join_request m;
  char err[256] = "";
  int rc = gs__decode_join_request(buf, len, &m, err, sizeof err);
  if (rc) assert_contains(err, "malformed JoinRequest");
  return rc;
}

static int decode_kv_prefix(const uint8_t *buf, size_t len) {
  gs__kv_msg m;
  char err[256] = "";
  int rc = gs__decode_kv(GS__KV_SET_REQ, buf, len, &m, err, sizeof err);
  if (rc == GS__OK) gs__kv_msg_free(&m);
  return rc;
}

static void test_truncated_messages(void **state) {
  (void)state;
  uint8_t *buf;
  size_t len;

  gs__join_request jq;
  fill_join_request(&jq);
  assert_int_equal(gs__encode_join_request(&jq, &buf, &len), GS__OK);
  /* The version ("0.1.0", 7 bytes with tag and length) comes last. */
  check_truncations(buf, len, decode_join_prefix, len - 6);
  free(buf);

  gs__tensor_request req;
  gs__tensor_request_init(&req);
  snprintf(req.name, sizeof req.name, "grads/layer3");
  req.ndim = 2;
  req.shape[0] = 300;
  req.shape[1] = 70000;
  uint64_t done[] = {5, 6};
  gs__rank_msg rm = {.has_hello = 1,
                     .hello_rank = 1,
                     .nrequests = 1,
                     .requests = &req,
                     .ndone = 2,
                     .done_plans = done,
                     .has_leave = 1};
  snprintf(rm.leave_reason, sizeof rm.leave_reason, "bye");
  assert_int_equal(gs__encode_rank_msg(&rm, &buf, &len), GS__OK);
  /* The leave (tag, length, reason "bye" with its own tag and length)
   * comes last: 7 bytes. */
  check_truncations(buf, len, decode_rank_prefix, len - 6);
  free(buf);

  /* A plan message is one field (the kind), so every cut is inside it. */
  gs__plan_tensor t = {.name = "x", .ndim = 1, .shape = {1000}};
  gs__response r = {
      .kind = GS__RESP_COLLECTIVE, .prescale = 1, .postscale = 1, .ntensors = 1, .tensors = &t};
  gs__plan_msg pm = {.kind = GS__MSG_PLAN, .plan = {.seq = 300, .nresponses = 1, .responses = &r}};
  assert_int_equal(gs__encode_plan_msg(&pm, &buf, &len), GS__OK);
  check_truncations(buf, len, decode_plan_prefix, 0);
  free(buf);

  int32_t missing[] = {2, 3};
  gs__rank_info ri[] = {{0, "node-a", 10}, {1, "node-b", 11}};
  gs__plan_msg wm = {
      .kind = GS__MSG_WORLD,
      .world = {.size = 4, .nranks = 2, .ranks = ri, .nmissing = 2, .missing_ranks = missing}};
  assert_int_equal(gs__encode_plan_msg(&wm, &buf, &len), GS__OK);
  check_truncations(buf, len, decode_plan_prefix, 0);
  free(buf);

  uint8_t value[40];
  for (size_t i = 0; i < sizeof value; i++) value[i] = (uint8_t)i;
  gs__kv_msg kv = {.key = "ring/0", .value = value, .value_len = sizeof value};
  assert_int_equal(gs__encode_kv(GS__KV_SET_REQ, &kv, &buf, &len), GS__OK);
  /* The value (tag, length, 40 bytes) comes last. */
  check_truncations(buf, len, decode_kv_prefix, len - 41);
  free(buf);
}

/* ---- key/value ------------------------------------------------------------------ */

static void kv_round_trip(gs__kv_kind kind, const gs__kv_msg *in, gs__kv_msg *out) {
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_kv(kind, in, &buf, &len), GS__OK);
  int rc = gs__decode_kv(kind, buf, len, out, err, sizeof err);
  free(buf);
  if (rc) print_error("kv kind %d: %s\n", (int)kind, err);
  assert_int_equal(rc, GS__OK);
}

static void test_kv_round_trip(void **state) {
  (void)state;
  /* A value with NUL bytes and every byte value. */
  uint8_t value[256];
  for (int i = 0; i < 256; i++) value[i] = (uint8_t)(255 - i);
  gs__kv_msg in = {.key = "job-42/epoch-1/nccl_unique_id",
                   .value = value,
                   .value_len = 256,
                   .wait_ms = 2500,
                   .found = 1,
                   .deleted = 1};
  gs__kv_msg out;

  kv_round_trip(GS__KV_SET_REQ, &in, &out);
  assert_string_equal(out.key, in.key);
  assert_int_equal(out.value_len, 256);
  assert_memory_equal(out.value, value, 256);
  assert_int_equal(out.wait_ms, 0);
  gs__kv_msg_free(&out);
  assert_null(out.key);
  assert_null(out.value);
  gs__kv_msg_free(NULL);

  kv_round_trip(GS__KV_SET_RESP, &in, &out);
  assert_null(out.key);
  assert_int_equal(out.value_len, 0);
  gs__kv_msg_free(&out);

  kv_round_trip(GS__KV_GET_REQ, &in, &out);
  assert_string_equal(out.key, in.key);
  assert_int_equal(out.wait_ms, 2500);
  assert_int_equal(out.value_len, 0);
  gs__kv_msg_free(&out);

  kv_round_trip(GS__KV_GET_RESP, &in, &out);
  assert_int_equal(out.found, 1);
  assert_int_equal(out.value_len, 256);
  assert_memory_equal(out.value, value, 256);
  assert_null(out.key);
  gs__kv_msg_free(&out);

  gs__kv_msg missing = {0};
  kv_round_trip(GS__KV_GET_RESP, &missing, &out);
  assert_int_equal(out.found, 0);
  assert_int_equal(out.value_len, 0);
  gs__kv_msg_free(&out);

  /* Found with an empty value. */
  gs__kv_msg empty_found = {.found = 1};
  kv_round_trip(GS__KV_GET_RESP, &empty_found, &out);
  assert_int_equal(out.found, 1);
  assert_int_equal(out.value_len, 0);
  gs__kv_msg_free(&out);

  kv_round_trip(GS__KV_DELETE_REQ, &in, &out);
  assert_string_equal(out.key, in.key);
  gs__kv_msg_free(&out);

  kv_round_trip(GS__KV_DELETE_RESP, &in, &out);
  assert_int_equal(out.deleted, 1);
  gs__kv_msg_free(&out);
  kv_round_trip(GS__KV_DELETE_RESP, &missing, &out);
  assert_int_equal(out.deleted, 0);
  gs__kv_msg_free(&out);

  /* Keys and values at their limits pass. */
  char *key = repeat('k', GS__MAX_KV_KEY);
  uint8_t *big = calloc(GS__MAX_KV_VALUE, 1);
  assert_non_null(big);
  big[GS__MAX_KV_VALUE - 1] = 0x5a;
  gs__kv_msg edge = {.key = key, .value = big, .value_len = GS__MAX_KV_VALUE};
  kv_round_trip(GS__KV_SET_REQ, &edge, &out);
  assert_int_equal(strlen(out.key), GS__MAX_KV_KEY);
  assert_int_equal(out.value_len, GS__MAX_KV_VALUE);
  assert_int_equal(out.value[GS__MAX_KV_VALUE - 1], 0x5a);
  gs__kv_msg_free(&out);
  free(big);
  free(key);
}

static void test_kv_limits(void **state) {
  (void)state;
  uint8_t *buf;
  size_t len;
  char err[256];
  gs__kv_msg out;

  /* Empty or missing keys, in each request that carries one. */
  gs__kv_kind keyed[] = {GS__KV_SET_REQ, GS__KV_GET_REQ, GS__KV_DELETE_REQ};
  for (size_t i = 0; i < 3; i++) {
    gs__kv_msg in = {.key = NULL, .wait_ms = 10};
    assert_int_equal(gs__encode_kv(keyed[i], &in, &buf, &len), GS__OK);
    err[0] = 0;
    assert_int_equal(gs__decode_kv(keyed[i], buf, len, &out, err, sizeof err), GS__ERR_INVALID_ARG);
    assert_string_equal(err, "kv key is empty");
    assert_null(out.key);
    free(buf);

    char *key = repeat('k', GS__MAX_KV_KEY + 1);
    in.key = key;
    assert_int_equal(gs__encode_kv(keyed[i], &in, &buf, &len), GS__OK);
    err[0] = 0;
    assert_int_equal(gs__decode_kv(keyed[i], buf, len, &out, err, sizeof err), GS__ERR_INVALID_ARG);
    assert_string_equal(err, "kv key of 513 bytes exceeds the limit of 512 bytes");
    assert_null(out.key);
    assert_int_equal(out.wait_ms, 0);
    free(buf);
    free(key);
  }

  /* Values over the limit, in a set request and a get response. */
  uint8_t *big = calloc(GS__MAX_KV_VALUE + 1, 1);
  assert_non_null(big);
  gs__kv_msg in = {.key = "k", .value = big, .value_len = GS__MAX_KV_VALUE + 1, .found = 1};
  gs__kv_kind valued[] = {GS__KV_SET_REQ, GS__KV_GET_RESP};
  for (size_t i = 0; i < 2; i++) {
    assert_int_equal(gs__encode_kv(valued[i], &in, &buf, &len), GS__OK);
    err[0] = 0;
    assert_int_equal(gs__decode_kv(valued[i], buf, len, &out, err, sizeof err),
                     GS__ERR_INVALID_ARG);
    assert_string_equal(err, "kv value of 1048577 bytes exceeds the limit of 1048576 bytes");
    assert_null(out.key);
    assert_null(out.value);
    assert_int_equal(out.found, 0);
    free(buf);
  }
  free(big);

  /* An unknown kind. */
  err[0] = 0;
  assert_int_equal(gs__decode_kv((gs__kv_kind)42, (const uint8_t *)"", 0, &out, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  gs__kv_msg none = {0};
  buf = NULL;
  assert_int_equal(gs__encode_kv((gs__kv_kind)42, &none, &buf, &len), GS__ERR_INVALID_ARG);
  assert_null(buf);
}

/* ---- requests ----------------------------------------------------------------------- */

/* The worker's fast path classifies a submission as a cache hit with
 * gs__tensor_request_equal_but_name after finding the cached request by
 * name: every other field must still tell a changed request apart, or a
 * round would reduce a tensor with another's settings. */
static void test_request_equal_but_name(void **state) {
  (void)state;
  gs__tensor_request a, b;
  gs__tensor_request_init(&a);
  snprintf(a.name, sizeof a.name, "layer1/weight_grad");
  a.ndim = 2;
  a.shape[0] = 3;
  a.shape[1] = 4;
  b = a;
  assert_true(gs__tensor_request_equal(&a, &b));
  assert_true(gs__tensor_request_equal_but_name(&a, &b));
  snprintf(b.name, sizeof b.name, "layer2/weight_grad");
  assert_false(gs__tensor_request_equal(&a, &b));
  assert_true(gs__tensor_request_equal_but_name(&a, &b)); /* names are the caller's */
  for (int field = 0; field < 12; field++) {
    b = a;
    switch (field) {
    case 0:
      b.op = GS__OP_BROADCAST;
      break;
    case 1:
      b.dtype = GS__FLOAT64;
      break;
    case 2:
      b.ndim = 1;
      break;
    case 3:
      b.reduce_op = GS__MAX;
      break;
    case 4:
      b.prescale = 0.5;
      break;
    case 5:
      b.postscale = 2.0;
      break;
    case 6:
      b.root_rank = 1;
      break;
    case 7:
      b.device = GS__DEVICE_GPU;
      break;
    case 8:
      b.group_id = 7;
      break;
    case 9:
      b.group_size = 2;
      break;
    case 10:
      b.shape[0] = 4;
      break;
    default:
      b.shape[1] = 5;
      break;
    }
    assert_false(gs__tensor_request_equal_but_name(&a, &b));
    assert_false(gs__tensor_request_equal(&a, &b));
  }
  /* a dimension past ndim is not part of the request */
  b = a;
  b.shape[2] = 99;
  assert_true(gs__tensor_request_equal_but_name(&a, &b));
}

/* gs__tensor_request_defaults on zeros (the worker's calloc'd handles) is
 * gs__tensor_request_init. */
static void test_request_defaults(void **state) {
  (void)state;
  gs__tensor_request a, b;
  gs__tensor_request_init(&a);
  memset(&b, 0, sizeof b);
  gs__tensor_request_defaults(&b);
  assert_memory_equal(&a, &b, sizeof a);
  assert_int_equal(b.op, GS__OP_ALLREDUCE);
  assert_int_equal(b.dtype, GS__FLOAT32);
  assert_int_equal(b.reduce_op, GS__SUM);
  assert_true(b.prescale == 1.0 && b.postscale == 1.0);
  assert_int_equal(b.device, GS__DEVICE_CPU);
}

/* ---- shapes ----------------------------------------------------------------------- */

static void test_shape_elements(void **state) {
  (void)state;
  const int64_t s234[] = {2, 3, 4};
  assert_int_equal(gs__shape_elements(NULL, 0), 1);
  assert_int_equal(gs__shape_elements(s234, 3), 24);
  assert_int_equal(gs__shape_elements(s234, 1), 2);
  const int64_t zero[] = {5, 0, 7};
  assert_int_equal(gs__shape_elements(zero, 3), 0);
  const int64_t zero_then_huge[] = {0, INT64_MAX, INT64_MAX};
  assert_int_equal(gs__shape_elements(zero_then_huge, 3), 0);
  const int64_t max1[] = {INT64_MAX, 1};
  assert_int_equal(gs__shape_elements(max1, 2), INT64_MAX);
  const int64_t max2[] = {INT64_MAX, 2};
  assert_int_equal(gs__shape_elements(max2, 2), -1);
  const int64_t edge[] = {INT64_C(1) << 31, INT64_C(1) << 31, 2};
  assert_int_equal(gs__shape_elements(edge, 2), INT64_C(1) << 62);
  assert_int_equal(gs__shape_elements(edge, 3), -1);
  const int64_t just_under[] = {3037000499, 3037000499}; /* floor(sqrt(INT64_MAX)) */
  assert_int_equal(gs__shape_elements(just_under, 2), INT64_C(9223372030926249001));
  const int64_t just_over[] = {3037000500, 3037000500};
  assert_int_equal(gs__shape_elements(just_over, 2), -1);
  const int64_t neg[] = {3, -1};
  assert_int_equal(gs__shape_elements(neg, 2), -1);
  const int64_t neg_after_zero[] = {0, -1};
  assert_int_equal(gs__shape_elements(neg_after_zero, 2), -1);
  int64_t ones[GS__MAX_DIMS];
  for (int i = 0; i < GS__MAX_DIMS; i++) ones[i] = 2;
  assert_int_equal(gs__shape_elements(ones, GS__MAX_DIMS), 65536);
}

static void test_shape_format(void **state) {
  (void)state;
  char buf[128];
  const int64_t s[] = {17, 17};
  gs__shape_format(s, 2, buf, sizeof buf);
  assert_string_equal(buf, "[17,17]");
  gs__shape_format(s, 1, buf, sizeof buf);
  assert_string_equal(buf, "[17]");
  gs__shape_format(NULL, 0, buf, sizeof buf);
  assert_string_equal(buf, "[]");
  const int64_t ext[] = {INT64_MAX, 0, -5, INT64_MIN};
  gs__shape_format(ext, 4, buf, sizeof buf);
  assert_string_equal(buf, "[9223372036854775807,0,-5,-9223372036854775808]");
  int64_t deep[GS__MAX_DIMS];
  for (int i = 0; i < GS__MAX_DIMS; i++) deep[i] = i;
  gs__shape_format(deep, GS__MAX_DIMS, buf, sizeof buf);
  assert_string_equal(buf, "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]");

  /* Short buffers: cut, always NUL-terminated, never written past. */
  char small[16];
  for (size_t cap = 1; cap <= 8; cap++) {
    memset(small, '#', sizeof small);
    gs__shape_format(s, 2, small, cap);
    assert_int_equal(strlen(small), cap - 1);
    assert_memory_equal(small, "[17,17]", cap - 1);
    for (size_t i = cap; i < sizeof small; i++) assert_int_equal(small[i], '#');
  }
  memset(small, '#', sizeof small);
  gs__shape_format(s, 2, small, 0);
  assert_int_equal(small[0], '#');
}

/* Regression (found by tests/fuzz/fuzz_codec): a PlanMessage whose
 * response carries a NaN postscale decoded fine, so a worker would have
 * scaled a result by NaN; and per-rank first dimensions could be negative.
 * Both are refused when decoding, naming the value. The bytes are the
 * fuzzer's input (after its selector byte). */
static void test_plan_msg_rejects_non_finite_scale_and_negative_dims(void **state) {
  (void)state;
  static const uint8_t nan_postscale[] = {
      0x12, 0x66, 0x18, 0x07, 0x12, 0x1c, 0x29, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x3f,
      0x31, 0x00, 0xfe, 0xf9, 0xff, 0xff, 0xff, 0xf0, 0x3f, 0x4a, 0x08, 0x0a, 0x01, 0x61, 0x1a,
      0x01, 0x04, 0x20, 0x02, 0x12, 0x44, 0x08, 0x01, 0x10, 0x01, 0x29, 0x3a, 0x00, 0x00, 0x00,
      0x00, 0x00, 0xf0, 0x3f, 0x31, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0xf0, 0x7f, 0x4a, 0x0b,
      0x0a, 0x01, 0x3f, 0x1a, 0x02, 0x01, 0x02, 0x1a, 0x02, 0xfe, 0x03, 0x50, 0x00, 0x5a, 0x1d,
      0x25, 0x65, 0x6e, 0x73, 0x6f, 0x72, 0x20, 0x27, 0x67, 0x27, 0x3a, 0x20, 0x6d, 0x69, 0x73,
      0x6d, 0x61, 0x74, 0x63, 0xe8, 0x65, 0x64, 0x20, 0x73, 0x68, 0x61, 0x70, 0x65, 0x73};
  gs__plan_msg m;
  char err[512] = "";
  assert_int_equal(gs__decode_plan_msg(nan_postscale, sizeof nan_postscale, &m, err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_contains(err, "plan response 1: prescale 1 / postscale nan must be finite numbers");

  /* A valid allgather plan with rank 1's first dimension made negative. */
  gs__plan_tensor t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "g");
  t.ndim = 2;
  t.shape[0] = 1;
  t.shape[1] = 3;
  int64_t dims[2] = {1, -5};
  t.rank_dims = dims;
  t.nrank_dims = 2;
  gs__response r;
  memset(&r, 0, sizeof r);
  r.kind = GS__RESP_COLLECTIVE;
  r.op = GS__OP_ALLGATHER;
  r.prescale = r.postscale = 1.0;
  r.tensors = &t;
  r.ntensors = 1;
  gs__plan_msg in;
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_PLAN;
  in.plan.seq = 3;
  in.plan.responses = &r;
  in.plan.nresponses = 1;
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &m, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_contains(err, "tensor 'g': rank 1's first dimension is negative (-5)");
  free(buf);
}

/* Registrations acknowledged on the fast path's marker: RankMessage.reg_seq
 * and Plan.reg_ack_ranks/seqs survive a round trip; acks whose two lists
 * differ in length, or that name more ranks than a job holds, are refused
 * (a coordinator never sends them), and nothing is kept. */
static void test_registration_acks(void **state) {
  (void)state;
  gs__rank_msg rin, rout;
  memset(&rin, 0, sizeof rin);
  rin.reg_seq = 1ull << 35;
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_rank_msg(&rin, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_rank_msg(buf, len, &rout, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(rout.reg_seq, 1ull << 35);
  gs__rank_msg_free(&rout);

  gs__plan_msg in, out;
  memset(&in, 0, sizeof in);
  in.kind = GS__MSG_PLAN;
  in.plan.seq = 9;
  in.plan.fast_after = 1;
  int32_t ranks[3] = {0, 5, 65535};
  uint64_t seqs[3] = {1, 2, 1ull << 40};
  in.plan.nreg_acks = 3;
  in.plan.reg_ack_ranks = ranks;
  in.plan.reg_ack_seqs = seqs;
  assert_int_equal(gs__encode_plan_msg(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_plan_msg(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.plan.nreg_acks, 3);
  assert_memory_equal(out.plan.reg_ack_ranks, ranks, sizeof ranks);
  assert_memory_equal(out.plan.reg_ack_seqs, seqs, sizeof seqs);
  gs__plan_msg_free(&out);

  /* Two ranks, one count. */
  pbw plan = {0}, w = {0};
  int64_t r2[2] = {1, 2}, s1[1] = {4};
  pbw_int(&plan, 1, 9);
  pbw_packed(&plan, 8, r2, 2);
  pbw_packed(&plan, 9, s1, 1);
  pbw_sub(&w, 2, &plan);
  assert_int_equal(gs__decode_plan_msg(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "plan 9 acknowledges registrations of 2 ranks with 1 counts");
  assert_null(out.plan.reg_ack_ranks);
  assert_int_equal(out.plan.nreg_acks, 0);
  pbw_free(&plan);
  pbw_free(&w);

  /* More entries than ranks in a job. */
  size_t n = GS__MAX_WORLD + 1;
  int64_t *many = calloc(n, sizeof *many);
  assert_non_null(many);
  memset(&plan, 0, sizeof plan);
  memset(&w, 0, sizeof w);
  pbw_int(&plan, 1, 9);
  pbw_packed(&plan, 8, many, n);
  pbw_packed(&plan, 9, many, n);
  pbw_sub(&w, 2, &plan);
  assert_int_equal(gs__decode_plan_msg(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "plan 9 acknowledges registrations of 65537 ranks; the limit is 65536");
  assert_null(out.plan.reg_ack_seqs);
  pbw_free(&plan);
  pbw_free(&w);
  free(many);
}

/* GetStatus's fast-path backoff (issue 14) survives a round trip; a
 * tensor name over the limit is refused, naming the field. */
static void test_diag_status_fast_backoff(void **state) {
  (void)state;
  gs__diag_status in, out;
  memset(&in, 0, sizeof in);
  snprintf(in.job_id, sizeof in.job_id, "job");
  snprintf(in.coordinator_state, sizeof in.coordinator_state, "serving");
  in.fast_rounds = 7;
  in.fast_backoff = 1;
  in.fast_backoff_plans = 63;
  in.fast_backoffs = 9;
  snprintf(in.fast_backoff_tensor, sizeof in.fast_backoff_tensor, "emb/grad");
  uint8_t *buf;
  size_t len;
  char err[256] = "";
  assert_int_equal(gs__encode_diag_status(&in, &buf, &len), GS__OK);
  assert_int_equal(gs__decode_diag_status(buf, len, &out, err, sizeof err), GS__OK);
  free(buf);
  assert_int_equal(out.fast_rounds, 7);
  assert_int_equal(out.fast_backoff, 1);
  assert_int_equal(out.fast_backoff_plans, 63);
  assert_int_equal(out.fast_backoffs, 9);
  assert_string_equal(out.fast_backoff_tensor, "emb/grad");
  assert_string_equal(out.coordinator_state, "serving");
  gs__diag_status_free(&out);

  /* A reply whose name is over the limit (a coordinator never sends one):
   * the buffer is not overrun; the decoder says which field. */
  pbw w = {0};
  char *name = repeat('n', GS__MAX_NAME + 1);
  pbw_int(&w, 21, 1);
  pbw_str(&w, 24, name); /* GetStatusResponse.fast_backoff_tensor */
  assert_int_equal(gs__decode_diag_status(w.b, w.n, &out, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "fast_backoff_tensor of 256 bytes exceeds the limit of 255 bytes");
  gs__diag_status_free(&out);
  pbw_free(&w);
  free(name);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_join_request_round_trip),
      cmocka_unit_test(test_join_request_string_limits),
      cmocka_unit_test(test_join_response_round_trip),
      cmocka_unit_test(test_rank_msg_round_trip),
      cmocka_unit_test(test_rank_msg_parts_alone),
      cmocka_unit_test(test_rank_msg_rejects_bad_requests),
      cmocka_unit_test(test_rank_msg_rejects_bad_blocked_on),
      cmocka_unit_test(test_rank_msg_fast_path_round_trip),
      cmocka_unit_test(test_plan_msg_world_round_trip),
      cmocka_unit_test(test_plan_msg_plan_round_trip),
      cmocka_unit_test(test_plan_msg_abort_and_rank_error_round_trip),
      cmocka_unit_test(test_plan_msg_rejections),
      cmocka_unit_test(test_plan_msg_rejects_non_finite_scale_and_negative_dims),
      cmocka_unit_test(test_random_garbage),
      cmocka_unit_test(test_known_malformed_bytes),
      cmocka_unit_test(test_truncated_messages),
      cmocka_unit_test(test_kv_round_trip),
      cmocka_unit_test(test_kv_limits),
      cmocka_unit_test(test_request_equal_but_name),
      cmocka_unit_test(test_request_defaults),
      cmocka_unit_test(test_shape_elements),
      cmocka_unit_test(test_shape_format),
      cmocka_unit_test(test_diag_status_fast_backoff),
      cmocka_unit_test(test_registration_acks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
