/* The protobuf codec: converts between the plain structs of messages.h and
 * the protobuf-c structs generated from proto/gradsync/v1/messages.proto.
 * The only file that includes generated headers. Decoders check every bound
 * a peer could abuse (name and text lengths, dimensions, negative sizes,
 * enum ranges, array lengths) so the rest of the code can trust the structs.
 * Pure; any thread. */
#include "codec.h"
#include "codec_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradsync/v1/messages.pb-c.h"
#include "status.h"

_Static_assert((int)GRADSYNC__V1__OP_TYPE__OP_JOIN == (int)GS__OP_JOIN, "op enum");
_Static_assert((int)GRADSYNC__V1__DATA_TYPE__DT_UINT8 == (int)GS__UINT8, "dtype enum");
_Static_assert((int)GRADSYNC__V1__DATA_TYPE__DT_INT16 == (int)GS__INT16, "dtype enum");
_Static_assert((int)GRADSYNC__V1__REDUCE_OP__REDUCE_ADASUM == (int)GS__ADASUM, "reduce enum");
_Static_assert((int)GRADSYNC__V1__DEVICE_KIND__DEVICE_GPU == (int)GS__DEVICE_GPU, "device enum");

int gs__codec_fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return GS__ERR_INVALID_ARG;
}

int gs__codec_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return GS__ERR_NO_MEMORY;
  protobuf_c_message_pack(m, buf);
  *out = buf;
  *len = n;
  return GS__OK;
}

int gs__codec_copy_str(char *dst, size_t cap, const char *src, const char *field, char *err,
                       size_t errlen) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap)
    return gs__codec_fail(err, errlen, "%s of %zu bytes exceeds the limit of %zu bytes", field, n,
                          cap - 1);
  memcpy(dst, src ? src : "", n + 1);
  return GS__OK;
}

/* Refuses control characters (a peer's text that reaches log lines). */
static int check_printable(const char *s, const char *field, char *err, size_t errlen) {
  for (size_t i = 0; s[i]; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
      return gs__codec_fail(err, errlen, "%s contains a control character (byte %zu is 0x%02x)",
                            field, i, (unsigned char)s[i]);
  return GS__OK;
}

/* Copies a secret that must be absent or exactly GS__SECRET_BYTES long. */
static int copy_secret(uint8_t dst[GS__SECRET_BYTES], const ProtobufCBinaryData *src,
                       const char *field, char *err, size_t errlen) {
  if (src->len == 0) return GS__OK;
  if (src->len != GS__SECRET_BYTES)
    return gs__codec_fail(err, errlen, "%s of %zu bytes: expected %d", field, src->len,
                          GS__SECRET_BYTES);
  memcpy(dst, src->data, GS__SECRET_BYTES);
  return GS__OK;
}

static char *dup_text(const char *src) {
  size_t n = src ? strnlen(src, GS__MAX_TEXT - 1) : 0;
  char *s = malloc(n + 1);
  if (!s) return NULL;
  memcpy(s, src ? src : "", n);
  s[n] = 0;
  return s;
}

static int check_enum(int v, int count, const char *field, char *err, size_t errlen) {
  if (v < 0 || v >= count) return gs__codec_fail(err, errlen, "%s has unknown value %d", field, v);
  return GS__OK;
}

static int copy_shape(int64_t *dst, int *ndim, const int64_t *src, size_t n, const char *name,
                      char *err, size_t errlen) {
  if (n > GS__MAX_DIMS)
    return gs__codec_fail(err, errlen, "tensor '%s': %zu dimensions exceed the limit of %d", name,
                          n, GS__MAX_DIMS);
  for (size_t i = 0; i < n; i++) {
    if (src[i] < 0)
      return gs__codec_fail(err, errlen, "tensor '%s': dimension %zu is negative (%lld)", name, i,
                            (long long)src[i]);
    dst[i] = src[i];
  }
  *ndim = (int)n;
  if (gs__shape_elements(dst, *ndim) < 0)
    return gs__codec_fail(err, errlen, "tensor '%s': element count overflows 64 bits", name);
  return GS__OK;
}

/* ---- join ---------------------------------------------------------------- */

int gs__encode_join_request(const gs__join_request *m, uint8_t **out, size_t *len) {
  Gradsync__V1__JoinRequest pb = GRADSYNC__V1__JOIN_REQUEST__INIT;
  pb.job_id = (char *)m->job_id;
  pb.rank = m->rank;
  pb.size = m->size;
  pb.local_rank = m->local_rank;
  pb.local_size = m->local_size;
  pb.host = (char *)m->host;
  pb.pid = m->pid;
  pb.version = (char *)m->version;
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_join_request(const uint8_t *buf, size_t len, gs__join_request *m, char *err,
                            size_t errlen) {
  memset(m, 0, sizeof *m);
  Gradsync__V1__JoinRequest *pb = gradsync__v1__join_request__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed JoinRequest (%zu bytes)", len);
  int rc = gs__codec_copy_str(m->job_id, sizeof m->job_id, pb->job_id, "job_id", err, errlen);
  if (!rc) rc = gs__codec_copy_str(m->host, sizeof m->host, pb->host, "host", err, errlen);
  if (!rc)
    rc = gs__codec_copy_str(m->version, sizeof m->version, pb->version, "version", err, errlen);
  /* These reach log lines: a newline or escape must not forge one. */
  if (!rc) rc = check_printable(m->host, "host", err, errlen);
  if (!rc) rc = check_printable(m->job_id, "job_id", err, errlen);
  if (!rc) rc = check_printable(m->version, "version", err, errlen);
  m->rank = pb->rank;
  m->size = pb->size;
  m->local_rank = pb->local_rank;
  m->local_size = pb->local_size;
  m->pid = pb->pid;
  gradsync__v1__join_request__free_unpacked(pb, NULL);
  if (rc) memset(m, 0, sizeof *m);
  return rc;
}

int gs__encode_join_response(const gs__join_response *m, uint8_t **out, size_t *len) {
  Gradsync__V1__JobConfig cfg = GRADSYNC__V1__JOB_CONFIG__INIT;
  cfg.cycle_time_us = m->config.cycle_time_us;
  cfg.fusion_threshold_bytes = m->config.fusion_threshold_bytes;
  cfg.cache_capacity = m->config.cache_capacity;
  cfg.stall_warning_s = m->config.stall_warning_s;
  cfg.stall_shutdown_s = m->config.stall_shutdown_s;
  cfg.deadlock_time_ms = m->config.deadlock_time_ms;
  cfg.heartbeat_ms = m->config.heartbeat_ms;
  cfg.rank_timeout_ms = m->config.rank_timeout_ms;
  Gradsync__V1__JoinResponse pb = GRADSYNC__V1__JOIN_RESPONSE__INIT;
  pb.job_id = (char *)m->job_id;
  pb.epoch = m->epoch;
  pb.rank = m->rank;
  pb.size = m->size;
  pb.config = &cfg;
  pb.rank_secret.data = (uint8_t *)m->rank_secret;
  pb.rank_secret.len = sizeof m->rank_secret;
  pb.ring_key.data = (uint8_t *)m->ring_key;
  pb.ring_key.len = sizeof m->ring_key;
  pb.version = (char *)m->version;
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_join_response(const uint8_t *buf, size_t len, gs__join_response *m, char *err,
                             size_t errlen) {
  memset(m, 0, sizeof *m);
  Gradsync__V1__JoinResponse *pb = gradsync__v1__join_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed JoinResponse (%zu bytes)", len);
  int rc = gs__codec_copy_str(m->job_id, sizeof m->job_id, pb->job_id, "job_id", err, errlen);
  if (!rc) rc = copy_secret(m->rank_secret, &pb->rank_secret, "rank_secret", err, errlen);
  if (!rc) rc = copy_secret(m->ring_key, &pb->ring_key, "ring_key", err, errlen);
  if (!rc)
    rc = gs__codec_copy_str(m->version, sizeof m->version, pb->version, "version", err, errlen);
  m->epoch = pb->epoch;
  m->rank = pb->rank;
  m->size = pb->size;
  if (pb->config) {
    m->config.cycle_time_us = pb->config->cycle_time_us;
    m->config.fusion_threshold_bytes = pb->config->fusion_threshold_bytes;
    m->config.cache_capacity = pb->config->cache_capacity;
    m->config.stall_warning_s = pb->config->stall_warning_s;
    m->config.stall_shutdown_s = pb->config->stall_shutdown_s;
    m->config.deadlock_time_ms = pb->config->deadlock_time_ms;
    m->config.heartbeat_ms = pb->config->heartbeat_ms;
    m->config.rank_timeout_ms = pb->config->rank_timeout_ms;
  }
  gradsync__v1__join_response__free_unpacked(pb, NULL);
  if (rc) memset(m, 0, sizeof *m);
  return rc;
}

/* ---- rank message ---------------------------------------------------------- */

/* Pointers to n fixed-size names, for a repeated string field (NULL when
 * n is 0 or memory ran out). */
static char **name_ptrs(char (*names)[GS__MAX_NAME + 1], size_t n) {
  if (!n) return NULL;
  char **p = malloc(n * sizeof *p);
  for (size_t i = 0; p && i < n; i++) p[i] = names[i];
  return p;
}

/* Copies a repeated string field into fixed-size names (at most max). */
static int copy_names(char (**out)[GS__MAX_NAME + 1], size_t *nout, char **in, size_t n, size_t max,
                      const char *field, char *err, size_t errlen) {
  if (!n) return GS__OK;
  if (n > max) return gs__codec_fail(err, errlen, "%zu %s exceed the limit of %zu", n, field, max);
  *out = calloc(n, sizeof **out);
  if (!*out) return GS__ERR_NO_MEMORY;
  *nout = n;
  for (size_t i = 0; i < n; i++) {
    int rc = gs__codec_copy_str((*out)[i], sizeof(*out)[i], in[i], field, err, errlen);
    if (rc) return rc;
  }
  return GS__OK;
}

int gs__encode_rank_msg(const gs__rank_msg *m, uint8_t **out, size_t *len) {
  Gradsync__V1__RankMessage pb = GRADSYNC__V1__RANK_MESSAGE__INIT;
  Gradsync__V1__SessionHello hello = GRADSYNC__V1__SESSION_HELLO__INIT;
  Gradsync__V1__Leave leave = GRADSYNC__V1__LEAVE__INIT;
  Gradsync__V1__TensorRequest *reqs = NULL, **reqp = NULL;
  if (m->has_hello) {
    hello.rank = m->hello_rank;
    hello.epoch = m->hello_epoch;
    hello.secret.data = (uint8_t *)m->hello_secret;
    hello.secret.len = sizeof m->hello_secret;
    hello.fast_path = m->hello_fast_path ? 1 : 0;
    pb.hello = &hello;
  }
  if (m->nrequests) {
    reqs = calloc(m->nrequests, sizeof *reqs);
    reqp = calloc(m->nrequests, sizeof *reqp);
    if (!reqs || !reqp) {
      free(reqs);
      free(reqp);
      return GS__ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < m->nrequests; i++) {
      const gs__tensor_request *r = &m->requests[i];
      gradsync__v1__tensor_request__init(&reqs[i]);
      reqs[i].name = (char *)r->name;
      reqs[i].op = (Gradsync__V1__OpType)r->op;
      reqs[i].dtype = (Gradsync__V1__DataType)r->dtype;
      reqs[i].n_shape = (size_t)r->ndim;
      reqs[i].shape = (int64_t *)r->shape;
      reqs[i].reduce_op = (Gradsync__V1__ReduceOp)r->reduce_op;
      reqs[i].prescale = r->prescale;
      reqs[i].postscale = r->postscale;
      reqs[i].root_rank = r->root_rank;
      reqs[i].device = (Gradsync__V1__DeviceKind)r->device;
      reqs[i].group_id = r->group_id;
      reqs[i].group_size = r->group_size;
      reqp[i] = &reqs[i];
    }
    pb.n_requests = m->nrequests;
    pb.requests = reqp;
  }
  pb.n_done_plans = m->ndone;
  pb.done_plans = m->done_plans;
  pb.heartbeat = m->heartbeat ? 1 : 0;
  if (m->has_leave) {
    leave.reason = (char *)m->leave_reason;
    pb.leave = &leave;
  }
  char **blocked = NULL;
  if (m->nblocked) {
    blocked = malloc(m->nblocked * sizeof *blocked);
    if (!blocked) {
      free(reqs);
      free(reqp);
      return GS__ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < m->nblocked; i++) blocked[i] = m->blocked_on[i];
  }
  pb.n_blocked_on = m->nblocked;
  pb.blocked_on = blocked;
  pb.blocked_update = m->blocked_update ? 1 : 0;
  pb.n_cached = m->ncached;
  pb.cached = m->cached;
  char **reg = name_ptrs(m->reg, m->nreg), **unreg = name_ptrs(m->unreg, m->nunreg);
  if ((m->nreg && !reg) || (m->nunreg && !unreg)) {
    free(reg);
    free(unreg);
    free(blocked);
    free(reqs);
    free(reqp);
    return GS__ERR_NO_MEMORY;
  }
  pb.n_register_local = m->nreg;
  pb.register_local = reg;
  pb.n_unregister_local = m->nunreg;
  pb.unregister_local = unreg;
  pb.escalate_round = m->escalate_round;
  pb.reg_seq = m->reg_seq;
  Gradsync__V1__FastReport report = GRADSYNC__V1__FAST_REPORT__INIT;
  if (m->has_fast_report) {
    report.rounds = m->fast_report.rounds;
    report.tensors = m->fast_report.tensors;
    report.collectives = m->fast_report.collectives;
    report.bytes = m->fast_report.bytes;
    pb.fast_report = &report;
  }
  Gradsync__V1__FastPending *fp = NULL, **fpp = NULL;
  int rc = GS__OK;
  if (m->nfast_pending) {
    fp = calloc(m->nfast_pending, sizeof *fp);
    fpp = calloc(m->nfast_pending, sizeof *fpp);
    if (!fp || !fpp) rc = GS__ERR_NO_MEMORY;
    for (size_t i = 0; !rc && i < m->nfast_pending; i++) {
      gradsync__v1__fast_pending__init(&fp[i]);
      fp[i].name = (char *)m->fast_pending[i].name;
      fp[i].cache_id = m->fast_pending[i].cache_id;
      fp[i].age_ms = m->fast_pending[i].age_ms;
      fpp[i] = &fp[i];
    }
  }
  pb.n_fast_pending = fpp ? m->nfast_pending : 0;
  pb.fast_pending = fpp;
  pb.fast_pending_update = m->fast_pending_update ? 1 : 0;
  if (!rc) rc = gs__codec_pack(&pb.base, out, len);
  free(fp);
  free(fpp);
  free(reg);
  free(unreg);
  free(blocked);
  free(reqs);
  free(reqp);
  return rc;
}

static int decode_request(const Gradsync__V1__TensorRequest *pb, gs__tensor_request *r, char *err,
                          size_t errlen) {
  gs__tensor_request_init(r);
  int rc = gs__codec_copy_str(r->name, sizeof r->name, pb->name, "tensor name", err, errlen);
  if (rc) return rc;
  if (!r->name[0]) return gs__codec_fail(err, errlen, "a tensor request has an empty name");
  if ((rc = check_enum((int)pb->op, GS__OP_TYPE_COUNT, "op", err, errlen)) ||
      (rc = check_enum((int)pb->dtype, GS__DTYPE_COUNT, "dtype", err, errlen)) ||
      (rc = check_enum((int)pb->reduce_op, GS__REDUCE_OP_COUNT, "reduce_op", err, errlen)) ||
      (rc = check_enum((int)pb->device, GS__DEVICE_COUNT, "device", err, errlen)))
    return rc;
  r->op = (gs__op_type)pb->op;
  r->dtype = (gs__dtype)pb->dtype;
  r->reduce_op = (gs__reduce_op)pb->reduce_op;
  r->device = (gs__device)pb->device;
  /* 0 on the wire (the proto3 default) means "no scaling". */
  r->prescale = pb->prescale != 0.0 ? pb->prescale : 1.0;
  r->postscale = pb->postscale != 0.0 ? pb->postscale : 1.0;
  if (!isfinite(r->prescale) || !isfinite(r->postscale))
    return gs__codec_fail(err, errlen,
                          "tensor '%s': prescale %g / postscale %g must be finite numbers", r->name,
                          r->prescale, r->postscale);
  r->root_rank = pb->root_rank;
  r->group_id = pb->group_id;
  r->group_size = pb->group_size;
  if (r->group_size > 1u << 20)
    return gs__codec_fail(err, errlen, "tensor '%s': group size %u exceeds the limit of %u",
                          r->name, r->group_size, 1u << 20);
  return copy_shape(r->shape, &r->ndim, pb->shape, pb->n_shape, r->name, err, errlen);
}

int gs__decode_rank_msg(const uint8_t *buf, size_t len, gs__rank_msg *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  Gradsync__V1__RankMessage *pb = gradsync__v1__rank_message__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed RankMessage (%zu bytes)", len);
  int rc = GS__OK;
  if (pb->hello) {
    m->has_hello = 1;
    m->hello_rank = pb->hello->rank;
    m->hello_epoch = pb->hello->epoch;
    m->hello_fast_path = pb->hello->fast_path;
    rc = copy_secret(m->hello_secret, &pb->hello->secret, "hello secret", err, errlen);
    if (rc) goto out_free_pb;
  }
  if (pb->n_requests) {
    m->requests = calloc(pb->n_requests, sizeof *m->requests);
    if (!m->requests) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free_pb;
    }
    for (size_t i = 0; i < pb->n_requests && !rc; i++)
      rc = decode_request(pb->requests[i], &m->requests[i], err, errlen);
    m->nrequests = pb->n_requests;
  }
  if (!rc && pb->n_done_plans) {
    m->done_plans = malloc(pb->n_done_plans * sizeof *m->done_plans);
    if (!m->done_plans) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free_pb;
    }
    memcpy(m->done_plans, pb->done_plans, pb->n_done_plans * sizeof *m->done_plans);
    m->ndone = pb->n_done_plans;
  }
  m->heartbeat = pb->heartbeat;
  m->blocked_update = pb->blocked_update;
  if (!rc && pb->n_blocked_on > GS__MAX_BLOCKED)
    rc = gs__codec_fail(err, errlen, "%zu blocked-on names exceed the limit of %d",
                        pb->n_blocked_on, GS__MAX_BLOCKED);
  if (!rc && pb->n_blocked_on) {
    m->blocked_on = calloc(pb->n_blocked_on, sizeof *m->blocked_on);
    if (!m->blocked_on) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free_pb;
    }
    m->nblocked = pb->n_blocked_on;
    for (size_t i = 0; i < pb->n_blocked_on && !rc; i++)
      rc = gs__codec_copy_str(m->blocked_on[i], sizeof m->blocked_on[i], pb->blocked_on[i],
                              "blocked-on tensor name", err, errlen);
  }
  if (!rc && pb->n_cached) {
    m->cached = malloc(pb->n_cached * sizeof *m->cached);
    if (!m->cached) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free_pb;
    }
    memcpy(m->cached, pb->cached, pb->n_cached * sizeof *m->cached);
    m->ncached = pb->n_cached;
  }
  if (!rc)
    rc = copy_names(&m->reg, &m->nreg, pb->register_local, pb->n_register_local, 65536,
                    "local registrations", err, errlen);
  if (!rc)
    rc = copy_names(&m->unreg, &m->nunreg, pb->unregister_local, pb->n_unregister_local, 65536,
                    "local unregistrations", err, errlen);
  m->escalate_round = pb->escalate_round;
  m->reg_seq = pb->reg_seq;
  if (pb->fast_report) {
    m->has_fast_report = 1;
    m->fast_report.rounds = pb->fast_report->rounds;
    m->fast_report.tensors = pb->fast_report->tensors;
    m->fast_report.collectives = pb->fast_report->collectives;
    m->fast_report.bytes = pb->fast_report->bytes;
  }
  m->fast_pending_update = pb->fast_pending_update;
  if (!rc && pb->n_fast_pending > GS__MAX_BLOCKED)
    rc = gs__codec_fail(err, errlen, "%zu fast-pending ops exceed the limit of %d",
                        pb->n_fast_pending, GS__MAX_BLOCKED);
  if (!rc && pb->n_fast_pending) {
    m->fast_pending = calloc(pb->n_fast_pending, sizeof *m->fast_pending);
    if (!m->fast_pending) {
      rc = GS__ERR_NO_MEMORY;
      goto out_free_pb;
    }
    m->nfast_pending = pb->n_fast_pending;
    for (size_t i = 0; i < pb->n_fast_pending && !rc; i++) {
      m->fast_pending[i].cache_id = pb->fast_pending[i]->cache_id;
      m->fast_pending[i].age_ms = pb->fast_pending[i]->age_ms;
      rc = gs__codec_copy_str(m->fast_pending[i].name, sizeof m->fast_pending[i].name,
                              pb->fast_pending[i]->name, "fast-pending tensor name", err, errlen);
    }
  }
  if (!rc && pb->leave) {
    m->has_leave = 1;
    snprintf(m->leave_reason, sizeof m->leave_reason, "%s",
             pb->leave->reason ? pb->leave->reason : "");
  }
out_free_pb:
  gradsync__v1__rank_message__free_unpacked(pb, NULL);
  if (rc) gs__rank_msg_free(m);
  return rc;
}

/* ---- plan message ---------------------------------------------------------- */

typedef struct {
  Gradsync__V1__Response **resp;
  Gradsync__V1__PlanTensor ***tens;
  size_t nresp;
} plan_scratch;

static void scratch_free(plan_scratch *s) {
  for (size_t i = 0; i < s->nresp; i++) {
    if (s->tens && s->tens[i]) {
      Gradsync__V1__PlanTensor **t = s->tens[i];
      if (t) free(t[0]); /* the tensors of one response are one array */
      free(t);
    }
    if (s->resp) free(s->resp[i]);
  }
  free(s->resp);
  free(s->tens);
}

static int build_plan(const gs__plan *p, Gradsync__V1__Plan *pb, plan_scratch *s) {
  gradsync__v1__plan__init(pb);
  pb->seq = p->seq;
  pb->n_evicted = p->nevicted;
  pb->evicted = p->evicted;
  pb->template_id = p->template_id;
  pb->replay_of = p->replay_of;
  pb->n_forget_templates = p->nforget;
  pb->forget_templates = p->forget_templates;
  pb->fast_after = p->fast_after ? 1 : 0;
  pb->n_reg_ack_ranks = pb->n_reg_ack_seqs = p->nreg_acks;
  pb->reg_ack_ranks = p->reg_ack_ranks;
  pb->reg_ack_seqs = p->reg_ack_seqs;
  s->nresp = p->nresponses;
  if (!p->nresponses) return GS__OK;
  s->resp = calloc(p->nresponses, sizeof *s->resp);
  s->tens = calloc(p->nresponses, sizeof *s->tens);
  if (!s->resp || !s->tens) return GS__ERR_NO_MEMORY;
  for (size_t i = 0; i < p->nresponses; i++) {
    const gs__response *r = &p->responses[i];
    Gradsync__V1__Response *pr = s->resp[i] = malloc(sizeof *pr);
    if (!pr) return GS__ERR_NO_MEMORY;
    gradsync__v1__response__init(pr);
    pr->kind = (Gradsync__V1__Response__Kind)r->kind;
    pr->op = (Gradsync__V1__OpType)r->op;
    pr->dtype = (Gradsync__V1__DataType)r->dtype;
    pr->reduce_op = (Gradsync__V1__ReduceOp)r->reduce_op;
    pr->prescale = r->prescale;
    pr->postscale = r->postscale;
    pr->root_rank = r->root_rank;
    pr->device = (Gradsync__V1__DeviceKind)r->device;
    pr->error_status = r->error_status;
    pr->error_message = r->error_message ? r->error_message : (char *)"";
    if (r->ntensors) {
      Gradsync__V1__PlanTensor **tp = s->tens[i] = calloc(r->ntensors, sizeof *tp);
      Gradsync__V1__PlanTensor *t = tp ? calloc(r->ntensors, sizeof *t) : NULL;
      if (!t) return GS__ERR_NO_MEMORY;
      tp[0] = t;
      for (size_t k = 0; k < r->ntensors; k++) {
        gradsync__v1__plan_tensor__init(&t[k]);
        t[k].name = (char *)r->tensors[k].name;
        t[k].n_shape = (size_t)r->tensors[k].ndim;
        t[k].shape = (int64_t *)r->tensors[k].shape;
        t[k].n_rank_dims = r->tensors[k].nrank_dims;
        t[k].rank_dims = r->tensors[k].rank_dims;
        t[k].cache_id = r->tensors[k].cache_id;
        tp[k] = &t[k];
      }
      pr->n_tensors = r->ntensors;
      pr->tensors = tp;
    }
  }
  pb->n_responses = p->nresponses;
  pb->responses = s->resp;
  return GS__OK;
}

int gs__encode_plan_msg(const gs__plan_msg *m, uint8_t **out, size_t *len) {
  Gradsync__V1__PlanMessage pb = GRADSYNC__V1__PLAN_MESSAGE__INIT;
  Gradsync__V1__WorldStatus ws = GRADSYNC__V1__WORLD_STATUS__INIT;
  Gradsync__V1__RankInfo *ri = NULL, **rip = NULL;
  Gradsync__V1__Plan plan;
  plan_scratch scratch = {0};
  Gradsync__V1__Abort ab = GRADSYNC__V1__ABORT__INIT;
  Gradsync__V1__TensorError te = GRADSYNC__V1__TENSOR_ERROR__INIT;
  Gradsync__V1__FastStop fs = GRADSYNC__V1__FAST_STOP__INIT;
  int rc = GS__OK;
  switch (m->kind) {
  case GS__MSG_WORLD:
    ws.ready = m->world.ready;
    ws.size = m->world.size;
    ws.epoch = m->world.epoch;
    if (m->world.nranks) {
      ri = calloc(m->world.nranks, sizeof *ri);
      rip = calloc(m->world.nranks, sizeof *rip);
      if (!ri || !rip) {
        rc = GS__ERR_NO_MEMORY;
        goto out_free;
      }
      for (size_t i = 0; i < m->world.nranks; i++) {
        gradsync__v1__rank_info__init(&ri[i]);
        ri[i].rank = m->world.ranks[i].rank;
        ri[i].host = (char *)m->world.ranks[i].host;
        ri[i].pid = m->world.ranks[i].pid;
        rip[i] = &ri[i];
      }
    }
    ws.n_ranks = m->world.nranks;
    ws.ranks = rip;
    ws.n_missing_ranks = m->world.nmissing;
    ws.missing_ranks = m->world.missing_ranks;
    ws.n_gone_ranks = m->world.ngone;
    ws.gone_ranks = m->world.gone_ranks;
    pb.kind_case = GRADSYNC__V1__PLAN_MESSAGE__KIND_WORLD;
    pb.world = &ws;
    break;
  case GS__MSG_PLAN:
    rc = build_plan(&m->plan, &plan, &scratch);
    if (rc) goto out_free;
    pb.kind_case = GRADSYNC__V1__PLAN_MESSAGE__KIND_PLAN;
    pb.plan = &plan;
    break;
  case GS__MSG_ABORT:
    ab.status = m->status;
    ab.reason = m->text ? m->text : (char *)"";
    pb.kind_case = GRADSYNC__V1__PLAN_MESSAGE__KIND_ABORT;
    pb.abort = &ab;
    break;
  case GS__MSG_RANK_ERROR:
    te.name = (char *)m->name;
    te.status = m->status;
    te.message = m->text ? m->text : (char *)"";
    pb.kind_case = GRADSYNC__V1__PLAN_MESSAGE__KIND_RANK_ERROR;
    pb.rank_error = &te;
    break;
  case GS__MSG_FAST_STOP:
    fs.reason = m->text ? m->text : (char *)"";
    fs.abort_round = m->abort_round ? 1 : 0;
    pb.kind_case = GRADSYNC__V1__PLAN_MESSAGE__KIND_FAST_STOP;
    pb.fast_stop = &fs;
    break;
  default:
    return GS__ERR_INVALID_ARG;
  }
  rc = gs__codec_pack(&pb.base, out, len);
out_free:
  free(ri);
  free(rip);
  scratch_free(&scratch);
  return rc;
}

static int decode_plan(const Gradsync__V1__Plan *pb, gs__plan *p, char *err, size_t errlen) {
  p->seq = pb->seq;
  p->fast_after = pb->fast_after;
  p->template_id = pb->template_id;
  p->replay_of = pb->replay_of;
  if (pb->n_forget_templates) {
    p->forget_templates = malloc(pb->n_forget_templates * sizeof *p->forget_templates);
    if (!p->forget_templates) return GS__ERR_NO_MEMORY;
    memcpy(p->forget_templates, pb->forget_templates,
           pb->n_forget_templates * sizeof *p->forget_templates);
    p->nforget = pb->n_forget_templates;
  }
  if (pb->n_reg_ack_ranks != pb->n_reg_ack_seqs)
    return gs__codec_fail(err, errlen,
                          "plan %llu acknowledges registrations of %zu ranks with %zu counts",
                          (unsigned long long)pb->seq, pb->n_reg_ack_ranks, pb->n_reg_ack_seqs);
  if (pb->n_reg_ack_ranks > GS__MAX_WORLD)
    return gs__codec_fail(err, errlen,
                          "plan %llu acknowledges registrations of %zu ranks; the limit is %d",
                          (unsigned long long)pb->seq, pb->n_reg_ack_ranks, GS__MAX_WORLD);
  if (pb->n_reg_ack_ranks) {
    p->reg_ack_ranks = malloc(pb->n_reg_ack_ranks * sizeof *p->reg_ack_ranks);
    p->reg_ack_seqs = malloc(pb->n_reg_ack_ranks * sizeof *p->reg_ack_seqs);
    if (!p->reg_ack_ranks || !p->reg_ack_seqs) return GS__ERR_NO_MEMORY;
    memcpy(p->reg_ack_ranks, pb->reg_ack_ranks, pb->n_reg_ack_ranks * sizeof *p->reg_ack_ranks);
    memcpy(p->reg_ack_seqs, pb->reg_ack_seqs, pb->n_reg_ack_ranks * sizeof *p->reg_ack_seqs);
    p->nreg_acks = pb->n_reg_ack_ranks;
  }
  if (pb->n_evicted) {
    p->evicted = malloc(pb->n_evicted * sizeof *p->evicted);
    if (!p->evicted) return GS__ERR_NO_MEMORY;
    memcpy(p->evicted, pb->evicted, pb->n_evicted * sizeof *p->evicted);
    p->nevicted = pb->n_evicted;
  }
  if (!pb->n_responses) return GS__OK;
  p->responses = calloc(pb->n_responses, sizeof *p->responses);
  if (!p->responses) return GS__ERR_NO_MEMORY;
  p->nresponses = pb->n_responses;
  for (size_t i = 0; i < pb->n_responses; i++) {
    const Gradsync__V1__Response *pr = pb->responses[i];
    gs__response *r = &p->responses[i];
    int rc;
    if ((rc = check_enum((int)pr->kind, 2, "response kind", err, errlen)) ||
        (rc = check_enum((int)pr->op, GS__OP_TYPE_COUNT, "op", err, errlen)) ||
        (rc = check_enum((int)pr->dtype, GS__DTYPE_COUNT, "dtype", err, errlen)) ||
        (rc = check_enum((int)pr->reduce_op, GS__REDUCE_OP_COUNT, "reduce_op", err, errlen)) ||
        (rc = check_enum((int)pr->device, GS__DEVICE_COUNT, "device", err, errlen)))
      return rc;
    r->kind = (gs__response_kind)pr->kind;
    r->op = (gs__op_type)pr->op;
    r->dtype = (gs__dtype)pr->dtype;
    r->reduce_op = (gs__reduce_op)pr->reduce_op;
    r->prescale = pr->prescale;
    r->postscale = pr->postscale;
    if (!isfinite(r->prescale) || !isfinite(r->postscale))
      return gs__codec_fail(err, errlen,
                            "plan response %zu: prescale %g / postscale %g must be finite numbers",
                            i, r->prescale, r->postscale);
    r->root_rank = pr->root_rank;
    r->device = (gs__device)pr->device;
    r->error_status = pr->error_status;
    if (r->kind == GS__RESP_ERROR && !(r->error_message = dup_text(pr->error_message)))
      return GS__ERR_NO_MEMORY;
    if (pr->n_tensors) {
      r->tensors = calloc(pr->n_tensors, sizeof *r->tensors);
      if (!r->tensors) return GS__ERR_NO_MEMORY;
      r->ntensors = pr->n_tensors;
      for (size_t k = 0; k < pr->n_tensors; k++) {
        const Gradsync__V1__PlanTensor *pt = pr->tensors[k];
        gs__plan_tensor *t = &r->tensors[k];
        t->cache_id = pt->cache_id;
        if ((rc = gs__codec_copy_str(t->name, sizeof t->name, pt->name, "tensor name", err,
                                     errlen)) ||
            (rc = copy_shape(t->shape, &t->ndim, pt->shape, pt->n_shape, t->name, err, errlen)))
          return rc;
        if (pt->n_rank_dims > GS__MAX_WORLD)
          return gs__codec_fail(err, errlen,
                                "tensor '%s': %zu per-rank sizes exceed the world limit", t->name,
                                pt->n_rank_dims);
        if (pt->n_rank_dims) {
          t->rank_dims = malloc(pt->n_rank_dims * sizeof *t->rank_dims);
          if (!t->rank_dims) return GS__ERR_NO_MEMORY;
          memcpy(t->rank_dims, pt->rank_dims, pt->n_rank_dims * sizeof *t->rank_dims);
          t->nrank_dims = pt->n_rank_dims;
          for (size_t q = 0; q < t->nrank_dims; q++)
            if (t->rank_dims[q] < 0)
              return gs__codec_fail(err, errlen,
                                    "tensor '%s': rank %zu's first dimension is negative (%lld)",
                                    t->name, q, (long long)t->rank_dims[q]);
        }
      }
    }
  }
  return GS__OK;
}

int gs__decode_plan_msg(const uint8_t *buf, size_t len, gs__plan_msg *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  Gradsync__V1__PlanMessage *pb = gradsync__v1__plan_message__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed PlanMessage (%zu bytes)", len);
  int rc = GS__OK;
  switch (pb->kind_case) {
  case GRADSYNC__V1__PLAN_MESSAGE__KIND_WORLD: {
    const Gradsync__V1__WorldStatus *w = pb->world;
    m->kind = GS__MSG_WORLD;
    m->world.ready = w->ready;
    m->world.size = w->size;
    m->world.epoch = w->epoch;
    if (w->n_ranks > GS__MAX_WORLD || w->n_missing_ranks > GS__MAX_WORLD) {
      rc = gs__codec_fail(err, errlen, "WorldStatus lists more ranks than the limit of %d",
                          GS__MAX_WORLD);
      break;
    }
    if (w->n_ranks) {
      m->world.ranks = calloc(w->n_ranks, sizeof *m->world.ranks);
      if (!m->world.ranks) {
        rc = GS__ERR_NO_MEMORY;
        break;
      }
      m->world.nranks = w->n_ranks;
      for (size_t i = 0; i < w->n_ranks && !rc; i++) {
        m->world.ranks[i].rank = w->ranks[i]->rank;
        m->world.ranks[i].pid = w->ranks[i]->pid;
        rc = gs__codec_copy_str(m->world.ranks[i].host, sizeof m->world.ranks[i].host,
                                w->ranks[i]->host, "host", err, errlen);
      }
    }
    if (!rc && w->n_missing_ranks) {
      m->world.missing_ranks = malloc(w->n_missing_ranks * sizeof(int32_t));
      if (!m->world.missing_ranks) {
        rc = GS__ERR_NO_MEMORY;
        break;
      }
      memcpy(m->world.missing_ranks, w->missing_ranks, w->n_missing_ranks * sizeof(int32_t));
      m->world.nmissing = w->n_missing_ranks;
    }
    if (!rc && w->n_gone_ranks > GS__MAX_WORLD) {
      rc = gs__codec_fail(err, errlen, "WorldStatus lists more ranks than the limit of %d",
                          GS__MAX_WORLD);
      break;
    }
    if (!rc && w->n_gone_ranks) {
      m->world.gone_ranks = malloc(w->n_gone_ranks * sizeof(int32_t));
      if (!m->world.gone_ranks) {
        rc = GS__ERR_NO_MEMORY;
        break;
      }
      memcpy(m->world.gone_ranks, w->gone_ranks, w->n_gone_ranks * sizeof(int32_t));
      m->world.ngone = w->n_gone_ranks;
    }
    break;
  }
  case GRADSYNC__V1__PLAN_MESSAGE__KIND_PLAN:
    m->kind = GS__MSG_PLAN;
    rc = decode_plan(pb->plan, &m->plan, err, errlen);
    break;
  case GRADSYNC__V1__PLAN_MESSAGE__KIND_ABORT:
    m->kind = GS__MSG_ABORT;
    m->status = pb->abort->status;
    if (!(m->text = dup_text(pb->abort->reason))) rc = GS__ERR_NO_MEMORY;
    break;
  case GRADSYNC__V1__PLAN_MESSAGE__KIND_RANK_ERROR:
    m->kind = GS__MSG_RANK_ERROR;
    m->status = pb->rank_error->status;
    rc = gs__codec_copy_str(m->name, sizeof m->name, pb->rank_error->name, "tensor name", err,
                            errlen);
    if (!rc && !(m->text = dup_text(pb->rank_error->message))) rc = GS__ERR_NO_MEMORY;
    break;
  case GRADSYNC__V1__PLAN_MESSAGE__KIND_FAST_STOP:
    m->kind = GS__MSG_FAST_STOP;
    m->abort_round = pb->fast_stop->abort_round;
    if (!(m->text = dup_text(pb->fast_stop->reason))) rc = GS__ERR_NO_MEMORY;
    break;
  default:
    rc = gs__codec_fail(err, errlen, "PlanMessage carries no known kind");
  }
  gradsync__v1__plan_message__free_unpacked(pb, NULL);
  if (rc) gs__plan_msg_free(m);
  return rc;
}

/* ---- key/value -------------------------------------------------------------- */

void gs__kv_msg_free(gs__kv_msg *m) {
  if (!m) return;
  free(m->key);
  free(m->value);
  memset(m, 0, sizeof *m);
}

int gs__encode_kv(gs__kv_kind kind, const gs__kv_msg *m, uint8_t **out, size_t *len) {
  ProtobufCBinaryData v = {m->value_len, m->value};
  char *key = m->key ? m->key : (char *)"";
  switch (kind) {
  case GS__KV_SET_REQ: {
    Gradsync__V1__KvSetRequest pb = GRADSYNC__V1__KV_SET_REQUEST__INIT;
    pb.key = key;
    pb.value = v;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__KV_SET_RESP: {
    Gradsync__V1__KvSetResponse pb = GRADSYNC__V1__KV_SET_RESPONSE__INIT;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__KV_GET_REQ: {
    Gradsync__V1__KvGetRequest pb = GRADSYNC__V1__KV_GET_REQUEST__INIT;
    pb.key = key;
    pb.wait_ms = m->wait_ms;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__KV_GET_RESP: {
    Gradsync__V1__KvGetResponse pb = GRADSYNC__V1__KV_GET_RESPONSE__INIT;
    pb.found = m->found ? 1 : 0;
    pb.value = v;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__KV_DELETE_REQ: {
    Gradsync__V1__KvDeleteRequest pb = GRADSYNC__V1__KV_DELETE_REQUEST__INIT;
    pb.key = key;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__KV_DELETE_RESP: {
    Gradsync__V1__KvDeleteResponse pb = GRADSYNC__V1__KV_DELETE_RESPONSE__INIT;
    pb.deleted = m->deleted ? 1 : 0;
    return gs__codec_pack(&pb.base, out, len);
  }
  }
  return GS__ERR_INVALID_ARG;
}

static int take_key(gs__kv_msg *m, const char *key, char *err, size_t errlen) {
  size_t n = key ? strlen(key) : 0;
  if (n == 0) return gs__codec_fail(err, errlen, "kv key is empty");
  if (n > GS__MAX_KV_KEY)
    return gs__codec_fail(err, errlen, "kv key of %zu bytes exceeds the limit of %d bytes", n,
                          GS__MAX_KV_KEY);
  if (!(m->key = strdup(key))) return GS__ERR_NO_MEMORY;
  return GS__OK;
}

static int take_value(gs__kv_msg *m, ProtobufCBinaryData v, char *err, size_t errlen) {
  if (v.len > GS__MAX_KV_VALUE)
    return gs__codec_fail(err, errlen, "kv value of %zu bytes exceeds the limit of %d bytes", v.len,
                          GS__MAX_KV_VALUE);
  m->value = malloc(v.len ? v.len : 1);
  if (!m->value) return GS__ERR_NO_MEMORY;
  if (v.len) memcpy(m->value, v.data, v.len);
  m->value_len = v.len;
  return GS__OK;
}

int gs__decode_kv(gs__kv_kind kind, const uint8_t *buf, size_t len, gs__kv_msg *m, char *err,
                  size_t errlen) {
  memset(m, 0, sizeof *m);
  int rc = GS__OK;
  switch (kind) {
  case GS__KV_SET_REQ: {
    Gradsync__V1__KvSetRequest *pb = gradsync__v1__kv_set_request__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvSetRequest (%zu bytes)", len);
    rc = take_key(m, pb->key, err, errlen);
    if (!rc) rc = take_value(m, pb->value, err, errlen);
    gradsync__v1__kv_set_request__free_unpacked(pb, NULL);
    break;
  }
  case GS__KV_SET_RESP: {
    Gradsync__V1__KvSetResponse *pb = gradsync__v1__kv_set_response__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvSetResponse (%zu bytes)", len);
    gradsync__v1__kv_set_response__free_unpacked(pb, NULL);
    break;
  }
  case GS__KV_GET_REQ: {
    Gradsync__V1__KvGetRequest *pb = gradsync__v1__kv_get_request__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvGetRequest (%zu bytes)", len);
    rc = take_key(m, pb->key, err, errlen);
    m->wait_ms = pb->wait_ms;
    gradsync__v1__kv_get_request__free_unpacked(pb, NULL);
    break;
  }
  case GS__KV_GET_RESP: {
    Gradsync__V1__KvGetResponse *pb = gradsync__v1__kv_get_response__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvGetResponse (%zu bytes)", len);
    m->found = pb->found;
    rc = take_value(m, pb->value, err, errlen);
    gradsync__v1__kv_get_response__free_unpacked(pb, NULL);
    break;
  }
  case GS__KV_DELETE_REQ: {
    Gradsync__V1__KvDeleteRequest *pb = gradsync__v1__kv_delete_request__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvDeleteRequest (%zu bytes)", len);
    rc = take_key(m, pb->key, err, errlen);
    gradsync__v1__kv_delete_request__free_unpacked(pb, NULL);
    break;
  }
  case GS__KV_DELETE_RESP: {
    Gradsync__V1__KvDeleteResponse *pb = gradsync__v1__kv_delete_response__unpack(NULL, len, buf);
    if (!pb) return gs__codec_fail(err, errlen, "malformed KvDeleteResponse (%zu bytes)", len);
    m->deleted = pb->deleted;
    gradsync__v1__kv_delete_response__free_unpacked(pb, NULL);
    break;
  }
  default:
    return GS__ERR_INVALID_ARG;
  }
  if (rc) gs__kv_msg_free(m);
  return rc;
}
