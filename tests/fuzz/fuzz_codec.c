/* libFuzzer target over the protobuf codec: the first byte picks a message
 * type, the rest is decoded as that type, as gradsyncd and the worker decode
 * what a peer sends. A decoded message is encoded again and decoded once
 * more, which must succeed (what we decode we can represent), and every
 * decoded struct is freed (ASan/LSan catch leaks and overruns).
 *
 * Built with clang -fsanitize=fuzzer,address,undefined when GRADSYNC_FUZZ is
 * on; run by scripts/fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "messages.h"
#include "status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_codec: check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);        \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#include <stdio.h>

static void rank_msg(const uint8_t *buf, size_t len) {
  char err[512];
  gs__rank_msg m;
  if (gs__decode_rank_msg(buf, len, &m, err, sizeof err) != GS__OK) {
    CHECK(err[0] != 0); /* every refusal says why */
    return;
  }
  uint8_t *out = NULL;
  size_t olen = 0;
  CHECK(gs__encode_rank_msg(&m, &out, &olen) == GS__OK);
  gs__rank_msg again;
  CHECK(gs__decode_rank_msg(out, olen, &again, err, sizeof err) == GS__OK);
  CHECK(again.nrequests == m.nrequests && again.ncached == m.ncached &&
        again.nblocked == m.nblocked && again.has_leave == m.has_leave);
  for (size_t i = 0; i < m.nrequests; i++)
    CHECK(gs__tensor_request_equal(&m.requests[i], &again.requests[i]));
  gs__rank_msg_free(&again);
  free(out);
  gs__rank_msg_free(&m);
}

static void plan_msg(const uint8_t *buf, size_t len) {
  char err[512];
  gs__plan_msg m;
  if (gs__decode_plan_msg(buf, len, &m, err, sizeof err) != GS__OK) {
    CHECK(err[0] != 0);
    return;
  }
  uint8_t *out = NULL;
  size_t olen = 0;
  CHECK(gs__encode_plan_msg(&m, &out, &olen) == GS__OK);
  gs__plan_msg again;
  CHECK(gs__decode_plan_msg(out, olen, &again, err, sizeof err) == GS__OK);
  CHECK(again.kind == m.kind);
  if (m.kind == GS__MSG_PLAN) {
    CHECK(again.plan.seq == m.plan.seq && again.plan.nresponses == m.plan.nresponses);
    CHECK(gs__plan_responses_equal(&again.plan, &m.plan));
  }
  gs__plan_msg_free(&again);
  free(out);
  gs__plan_msg_free(&m);
}

static void join_request(const uint8_t *buf, size_t len) {
  char err[512];
  gs__join_request m;
  if (gs__decode_join_request(buf, len, &m, err, sizeof err) != GS__OK) return;
  uint8_t *out = NULL;
  size_t olen = 0;
  CHECK(gs__encode_join_request(&m, &out, &olen) == GS__OK);
  gs__join_request again;
  CHECK(gs__decode_join_request(out, olen, &again, err, sizeof err) == GS__OK);
  CHECK(again.rank == m.rank && again.size == m.size && !strcmp(again.host, m.host));
  free(out);
}

static void join_response(const uint8_t *buf, size_t len) {
  char err[512];
  gs__join_response m;
  if (gs__decode_join_response(buf, len, &m, err, sizeof err) != GS__OK) return;
  uint8_t *out = NULL;
  size_t olen = 0;
  CHECK(gs__encode_join_response(&m, &out, &olen) == GS__OK);
  gs__join_response again;
  CHECK(gs__decode_join_response(out, olen, &again, err, sizeof err) == GS__OK);
  CHECK(again.rank == m.rank && again.size == m.size && again.epoch == m.epoch);
  free(out);
}

static void kv(gs__kv_kind kind, const uint8_t *buf, size_t len) {
  char err[512];
  gs__kv_msg m;
  memset(&m, 0, sizeof m);
  if (gs__decode_kv(kind, buf, len, &m, err, sizeof err) != GS__OK) {
    gs__kv_msg_free(&m);
    return;
  }
  uint8_t *out = NULL;
  size_t olen = 0;
  CHECK(gs__encode_kv(kind, &m, &out, &olen) == GS__OK);
  gs__kv_msg again;
  memset(&again, 0, sizeof again);
  CHECK(gs__decode_kv(kind, out, olen, &again, err, sizeof err) == GS__OK);
  CHECK(again.value_len == m.value_len);
  CHECK(!m.value_len || !memcmp(again.value, m.value, m.value_len));
  gs__kv_msg_free(&again);
  free(out);
  gs__kv_msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t *buf = data + 1;
  size_t len = size - 1;
  switch (data[0] % 10) {
  case 0:
    rank_msg(buf, len);
    break;
  case 1:
    plan_msg(buf, len);
    break;
  case 2:
    join_request(buf, len);
    break;
  case 3:
    join_response(buf, len);
    break;
  default:
    kv((gs__kv_kind)(data[0] % 10 - 4), buf, len);
    break;
  }
  return 0;
}
