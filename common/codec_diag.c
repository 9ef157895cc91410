/* The codec of the operator-facing services (see codec_diag.h): converts
 * between diag_messages.h and the protobuf-c structs of
 * diagnostics_messages.proto, grpc.health.v1 and grpc.reflection.v1alpha,
 * and answers reflection requests from an embedded FileDescriptorSet
 * (indexed with the descriptor.proto codec; each file's raw bytes are
 * served as stored). Pure; any thread. */
#include "codec_diag.h"
#include "codec_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "gradsync/v1/diagnostics_messages.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "status.h"

_Static_assert((int)GRADSYNC__V1__EVENT_KIND__EVENT_JOB_FINISHED == (int)GS__EV_JOB_FINISHED,
               "event kinds");
_Static_assert((int)GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN ==
                   GS__HEALTH_SERVICE_UNKNOWN,
               "health status");

static char *dup_or_empty(const char *s) {
  return strdup(s ? s : "");
}

static int32_t *dup_ranks(const int32_t *src, size_t n) {
  int32_t *d = malloc((n ? n : 1) * sizeof *d);
  if (d && n) memcpy(d, src, n * sizeof *d);
  return d;
}

static void free_strv(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

static char **dup_strv(char *const *src, size_t n) {
  char **v = calloc(n ? n : 1, sizeof *v);
  if (!v) return NULL;
  for (size_t i = 0; i < n; i++)
    if (!(v[i] = dup_or_empty(src[i]))) {
      free_strv(v, i);
      return NULL;
    }
  return v;
}

/* ---- frees --------------------------------------------------------------- */

void gs__diag_status_free(gs__diag_status *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nsettings; i++) {
    free(s->settings[i].key);
    free(s->settings[i].value);
  }
  free(s->settings);
  for (size_t i = 0; i < s->nranks; i++) free_strv(s->ranks[i].blocked_on, s->ranks[i].nblocked);
  free(s->ranks);
  memset(s, 0, sizeof *s);
}

void gs__diag_pending_free(gs__diag_pending *p) {
  if (!p) return;
  free(p->submitted);
  free(p->missing);
  memset(p, 0, sizeof *p);
}

void gs__diag_pending_query_free(gs__diag_pending_query *q) {
  if (!q) return;
  free(q->missing_ranks);
  memset(q, 0, sizeof *q);
}

void gs__diag_pending_list_free(gs__diag_pending_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) gs__diag_pending_free(&l->items[i]);
  free(l->items);
  memset(l, 0, sizeof *l);
}

void gs__diag_stalls_free(gs__diag_stalls *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nstalled; i++) gs__diag_pending_free(&s->stalled[i]);
  free(s->stalled);
  for (size_t i = 0; i < s->nwaits; i++) {
    for (size_t k = 0; k < s->waits[i].n; k++) free(s->waits[i].waits[k].missing);
    free(s->waits[i].waits);
  }
  free(s->waits);
  free(s->last_stall);
  free(s->last_deadlock);
  memset(s, 0, sizeof *s);
}

void gs__diag_locals_free(gs__diag_locals *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) free_strv(l->ranks[i].names, l->ranks[i].n);
  free(l->ranks);
  memset(l, 0, sizeof *l);
}

void gs__diag_event_free(gs__diag_event *e) {
  if (!e) return;
  free(e->message);
  memset(e, 0, sizeof *e);
}

const char *gs__event_name(int kind) {
  static const char *const names[GS__EV_COUNT] = {
      "unspecified", "rank_joined", "world_ready", "rank_left",   "rank_lost",
      "stall",       "deadlock",    "mismatch",    "job_aborted", "job_finished"};
  return kind >= 0 && kind < GS__EV_COUNT ? names[kind] : "unknown";
}

/* ---- health -------------------------------------------------------------- */

int gs__encode_health_request(const char *service, uint8_t **out, size_t *len) {
  Grpc__Health__V1__HealthCheckRequest pb = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  pb.service = (char *)(service ? service : "");
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_health_request(const uint8_t *buf, size_t len, char *service, size_t cap, char *err,
                              size_t errlen) {
  Grpc__Health__V1__HealthCheckRequest *pb =
      grpc__health__v1__health_check_request__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed HealthCheckRequest (%zu bytes)", len);
  int rc = gs__codec_copy_str(service, cap, pb->service, "service", err, errlen);
  grpc__health__v1__health_check_request__free_unpacked(pb, NULL);
  return rc;
}

int gs__encode_health_response(int status, uint8_t **out, size_t *len) {
  Grpc__Health__V1__HealthCheckResponse pb = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  pb.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_health_response(const uint8_t *buf, size_t len, int *status, char *err,
                               size_t errlen) {
  Grpc__Health__V1__HealthCheckResponse *pb =
      grpc__health__v1__health_check_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed HealthCheckResponse (%zu bytes)", len);
  *status = (int)pb->status;
  grpc__health__v1__health_check_response__free_unpacked(pb, NULL);
  return GS__OK;
}

/* ---- status -------------------------------------------------------------- */

int gs__encode_diag_status(const gs__diag_status *m, uint8_t **out, size_t *len) {
  int rc = GS__ERR_NO_MEMORY;
  Gradsync__V1__GetStatusResponse pb = GRADSYNC__V1__GET_STATUS_RESPONSE__INIT;
  Gradsync__V1__GetStatusResponse__SettingsEntry *set = calloc(m->nsettings + 1, sizeof *set);
  Gradsync__V1__GetStatusResponse__SettingsEntry **setp = calloc(m->nsettings + 1, sizeof *setp);
  Gradsync__V1__RankStatus *rs = calloc(m->nranks + 1, sizeof *rs);
  Gradsync__V1__RankStatus **rsp = calloc(m->nranks + 1, sizeof *rsp);
  if (!set || !setp || !rs || !rsp) goto out_free;
  pb.job_id = (char *)m->job_id;
  pb.world_size = m->world_size;
  pb.epoch = m->epoch;
  pb.uptime_s = m->uptime_s;
  pb.version = (char *)m->version;
  for (size_t i = 0; i < m->nsettings; i++) {
    gradsync__v1__get_status_response__settings_entry__init(&set[i]);
    set[i].key = m->settings[i].key;
    set[i].value = m->settings[i].value;
    setp[i] = &set[i];
  }
  pb.n_settings = m->nsettings;
  pb.settings = setp;
  for (size_t i = 0; i < m->nranks; i++) {
    const gs__diag_rank *r = &m->ranks[i];
    gradsync__v1__rank_status__init(&rs[i]);
    rs[i].rank = r->rank;
    rs[i].host = (char *)r->host;
    rs[i].pid = r->pid;
    rs[i].state = (char *)r->state;
    rs[i].last_message_age_s = r->last_msg_age_s;
    rs[i].last_done_plan = r->last_done_plan;
    rs[i].joined_uneven = r->joined_uneven;
    rs[i].n_blocked_on = r->nblocked;
    rs[i].blocked_on = r->blocked_on;
    rsp[i] = &rs[i];
  }
  pb.n_ranks = m->nranks;
  pb.ranks = rsp;
  pb.world_ready = m->world_ready;
  pb.aborted = m->aborted;
  pb.plans_emitted = m->plans_emitted;
  pb.collectives = m->collectives;
  pb.tensors_planned = m->tensors_planned;
  pb.bytes_negotiated = m->bytes_negotiated;
  pb.cache_hit_rate = m->cache_hit_rate;
  pb.mean_tensors_per_op = m->mean_tensors_per_op;
  pb.pending_tensors = m->pending_tensors;
  pb.coordinator_state = (char *)m->coordinator_state;
  pb.fast_rounds = m->fast_rounds;
  pb.fast_tensors = m->fast_tensors;
  pb.fast_collectives = m->fast_collectives;
  pb.fast_backoff = m->fast_backoff;
  pb.fast_backoff_plans = m->fast_backoff_plans;
  pb.fast_backoffs = m->fast_backoffs;
  pb.fast_backoff_tensor = (char *)m->fast_backoff_tensor;
  rc = gs__codec_pack(&pb.base, out, len);
out_free:
  free(set);
  free(setp);
  free(rs);
  free(rsp);
  return rc;
}

int gs__decode_diag_status(const uint8_t *buf, size_t len, gs__diag_status *m, char *err,
                           size_t errlen) {
  memset(m, 0, sizeof *m);
  Gradsync__V1__GetStatusResponse *pb = gradsync__v1__get_status_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed GetStatusResponse (%zu bytes)", len);
  int rc = gs__codec_copy_str(m->job_id, sizeof m->job_id, pb->job_id, "job_id", err, errlen);
  if (!rc)
    rc = gs__codec_copy_str(m->version, sizeof m->version, pb->version, "version", err, errlen);
  m->world_size = pb->world_size;
  m->epoch = pb->epoch;
  m->uptime_s = pb->uptime_s;
  m->world_ready = pb->world_ready;
  m->aborted = pb->aborted;
  m->plans_emitted = pb->plans_emitted;
  m->collectives = pb->collectives;
  m->tensors_planned = pb->tensors_planned;
  m->bytes_negotiated = pb->bytes_negotiated;
  m->cache_hit_rate = pb->cache_hit_rate;
  m->mean_tensors_per_op = pb->mean_tensors_per_op;
  m->pending_tensors = pb->pending_tensors;
  m->fast_rounds = pb->fast_rounds;
  m->fast_tensors = pb->fast_tensors;
  m->fast_collectives = pb->fast_collectives;
  m->fast_backoff = pb->fast_backoff;
  m->fast_backoff_plans = pb->fast_backoff_plans;
  m->fast_backoffs = pb->fast_backoffs;
  if (!rc)
    rc = gs__codec_copy_str(m->fast_backoff_tensor, sizeof m->fast_backoff_tensor,
                            pb->fast_backoff_tensor, "fast_backoff_tensor", err, errlen);
  if (!rc)
    rc = gs__codec_copy_str(m->coordinator_state, sizeof m->coordinator_state,
                            pb->coordinator_state, "coordinator_state", err, errlen);
  if (!rc && pb->n_settings) {
    m->settings = calloc(pb->n_settings, sizeof *m->settings);
    if (!m->settings) rc = GS__ERR_NO_MEMORY;
    for (size_t i = 0; !rc && i < pb->n_settings; i++) {
      m->settings[i].key = dup_or_empty(pb->settings[i]->key);
      m->settings[i].value = dup_or_empty(pb->settings[i]->value);
      m->nsettings++;
    }
  }
  if (!rc && pb->n_ranks) {
    m->ranks = calloc(pb->n_ranks, sizeof *m->ranks);
    if (!m->ranks) rc = GS__ERR_NO_MEMORY;
    for (size_t i = 0; !rc && i < pb->n_ranks; i++) {
      const Gradsync__V1__RankStatus *p = pb->ranks[i];
      gs__diag_rank *r = &m->ranks[i];
      r->rank = p->rank;
      rc = gs__codec_copy_str(r->host, sizeof r->host, p->host, "host", err, errlen);
      if (!rc) rc = gs__codec_copy_str(r->state, sizeof r->state, p->state, "state", err, errlen);
      r->pid = p->pid;
      r->last_msg_age_s = p->last_message_age_s;
      r->last_done_plan = p->last_done_plan;
      r->joined_uneven = p->joined_uneven;
      if (!rc && !(r->blocked_on = dup_strv(p->blocked_on, p->n_blocked_on)))
        rc = GS__ERR_NO_MEMORY;
      if (!rc) r->nblocked = p->n_blocked_on;
      m->nranks++;
    }
  }
  gradsync__v1__get_status_response__free_unpacked(pb, NULL);
  if (rc) gs__diag_status_free(m);
  return rc;
}

/* ---- pending ------------------------------------------------------------- */

int gs__encode_pending_query(const gs__diag_pending_query *q, uint8_t **out, size_t *len) {
  Gradsync__V1__ListPendingRequest pb = GRADSYNC__V1__LIST_PENDING_REQUEST__INIT;
  char token[32] = "";
  pb.n_missing_ranks = q->nmissing_ranks;
  pb.missing_ranks = (int32_t *)q->missing_ranks;
  pb.name_prefix = (char *)q->name_prefix;
  pb.page_size = q->page_size;
  if (q->after) snprintf(token, sizeof token, "%llu", (unsigned long long)q->after);
  pb.page_token = token;
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_pending_query(const uint8_t *buf, size_t len, gs__diag_pending_query *q, char *err,
                             size_t errlen) {
  memset(q, 0, sizeof *q);
  Gradsync__V1__ListPendingRequest *pb = gradsync__v1__list_pending_request__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed ListPendingRequest (%zu bytes)", len);
  int rc = gs__codec_copy_str(q->name_prefix, sizeof q->name_prefix, pb->name_prefix, "name_prefix",
                              err, errlen);
  if (!rc && pb->n_missing_ranks > GS__MAX_WORLD)
    rc = gs__codec_fail(err, errlen, "missing_ranks has %zu entries; at most %d",
                        pb->n_missing_ranks, GS__MAX_WORLD);
  if (!rc && pb->n_missing_ranks) {
    q->missing_ranks = dup_ranks(pb->missing_ranks, pb->n_missing_ranks);
    if (!q->missing_ranks)
      rc = GS__ERR_NO_MEMORY;
    else
      q->nmissing_ranks = pb->n_missing_ranks;
  }
  q->page_size = pb->page_size;
  if (!rc && pb->page_token && pb->page_token[0]) {
    char *end = NULL;
    unsigned long long v = strtoull(pb->page_token, &end, 10);
    if (strlen(pb->page_token) > 20 || !end || *end || v == 0)
      rc = gs__codec_fail(err, errlen,
                          "page_token '%.40s' is not one this coordinator issued: pass the "
                          "next_page_token of the previous page",
                          pb->page_token);
    q->after = v;
  }
  gradsync__v1__list_pending_request__free_unpacked(pb, NULL);
  if (rc) gs__diag_pending_query_free(q);
  return rc;
}

static void pending_to_pb(const gs__diag_pending *p, Gradsync__V1__PendingTensor *t) {
  gradsync__v1__pending_tensor__init(t);
  t->name = (char *)p->name;
  t->op = (Gradsync__V1__OpType)p->op;
  t->dtype = (Gradsync__V1__DataType)p->dtype;
  t->n_shape = (size_t)p->ndim;
  t->shape = (int64_t *)p->shape;
  t->age_s = p->age_s;
  t->n_submitted_ranks = p->nsubmitted;
  t->submitted_ranks = p->submitted;
  t->n_missing_ranks = p->nmissing;
  t->missing_ranks = p->missing;
  t->complete = p->complete;
  t->fast_path = p->fast_path;
}

static int pending_from_pb(const Gradsync__V1__PendingTensor *t, gs__diag_pending *p, char *err,
                           size_t errlen) {
  memset(p, 0, sizeof *p);
  int rc = gs__codec_copy_str(p->name, sizeof p->name, t->name, "name", err, errlen);
  if (rc) return rc;
  if (t->n_shape > GS__MAX_DIMS)
    return gs__codec_fail(err, errlen, "tensor '%s': too many dims", p->name);
  p->op = (gs__op_type)t->op;
  p->dtype = (gs__dtype)t->dtype;
  p->ndim = (int)t->n_shape;
  if (t->n_shape) memcpy(p->shape, t->shape, t->n_shape * sizeof *p->shape);
  p->age_s = t->age_s;
  p->complete = t->complete;
  p->fast_path = t->fast_path;
  p->submitted = dup_ranks(t->submitted_ranks, t->n_submitted_ranks);
  p->missing = dup_ranks(t->missing_ranks, t->n_missing_ranks);
  if (!p->submitted || !p->missing) {
    gs__diag_pending_free(p);
    return GS__ERR_NO_MEMORY;
  }
  p->nsubmitted = t->n_submitted_ranks;
  p->nmissing = t->n_missing_ranks;
  return GS__OK;
}

/* Arrays of PendingTensor and pointers to them (freed by the caller). */
static int pending_array(const gs__diag_pending *items, size_t n, Gradsync__V1__PendingTensor **arr,
                         Gradsync__V1__PendingTensor ***ptrs) {
  *arr = calloc(n + 1, sizeof **arr);
  *ptrs = calloc(n + 1, sizeof **ptrs);
  if (!*arr || !*ptrs) return GS__ERR_NO_MEMORY;
  for (size_t i = 0; i < n; i++) {
    pending_to_pb(&items[i], &(*arr)[i]);
    (*ptrs)[i] = &(*arr)[i];
  }
  return GS__OK;
}

int gs__encode_pending_list(const gs__diag_pending_list *l, uint8_t **out, size_t *len) {
  Gradsync__V1__ListPendingResponse pb = GRADSYNC__V1__LIST_PENDING_RESPONSE__INIT;
  Gradsync__V1__PendingTensor *arr = NULL, **ptrs = NULL;
  char token[32] = "";
  int rc = pending_array(l->items, l->n, &arr, &ptrs);
  if (!rc) {
    pb.n_tensors = l->n;
    pb.tensors = ptrs;
    if (l->next_after) snprintf(token, sizeof token, "%llu", (unsigned long long)l->next_after);
    pb.next_page_token = token;
    pb.total = l->total;
    rc = gs__codec_pack(&pb.base, out, len);
  }
  free(arr);
  free(ptrs);
  return rc;
}

int gs__decode_pending_list(const uint8_t *buf, size_t len, gs__diag_pending_list *l, char *err,
                            size_t errlen) {
  memset(l, 0, sizeof *l);
  Gradsync__V1__ListPendingResponse *pb =
      gradsync__v1__list_pending_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed ListPendingResponse (%zu bytes)", len);
  int rc = GS__OK;
  l->items = calloc(pb->n_tensors + 1, sizeof *l->items);
  if (!l->items) rc = GS__ERR_NO_MEMORY;
  for (size_t i = 0; !rc && i < pb->n_tensors; i++) {
    rc = pending_from_pb(pb->tensors[i], &l->items[i], err, errlen);
    if (!rc) l->n++;
  }
  l->total = pb->total;
  if (pb->next_page_token && pb->next_page_token[0])
    l->next_after = strtoull(pb->next_page_token, NULL, 10);
  gradsync__v1__list_pending_response__free_unpacked(pb, NULL);
  if (rc) gs__diag_pending_list_free(l);
  return rc;
}

/* ---- stalls -------------------------------------------------------------- */

int gs__encode_diag_stalls(const gs__diag_stalls *s, uint8_t **out, size_t *len) {
  Gradsync__V1__ListStallsResponse pb = GRADSYNC__V1__LIST_STALLS_RESPONSE__INIT;
  Gradsync__V1__PendingTensor *arr = NULL, **ptrs = NULL;
  size_t nw = 0;
  for (size_t i = 0; i < s->nwaits; i++) nw += s->waits[i].n;
  Gradsync__V1__RankWait *rw = calloc(s->nwaits + 1, sizeof *rw);
  Gradsync__V1__RankWait **rwp = calloc(s->nwaits + 1, sizeof *rwp);
  Gradsync__V1__WaitedTensor *wt = calloc(nw + 1, sizeof *wt);
  Gradsync__V1__WaitedTensor **wtp = calloc(nw + 1, sizeof *wtp);
  int rc = pending_array(s->stalled, s->nstalled, &arr, &ptrs);
  if (!rc && (!rw || !rwp || !wt || !wtp)) rc = GS__ERR_NO_MEMORY;
  if (!rc) {
    size_t k = 0;
    for (size_t i = 0; i < s->nwaits; i++) {
      gradsync__v1__rank_wait__init(&rw[i]);
      rw[i].rank = s->waits[i].rank;
      rw[i].waits_on = &wtp[k];
      rw[i].n_waits_on = s->waits[i].n;
      for (size_t j = 0; j < s->waits[i].n; j++, k++) {
        const gs__diag_waited *w = &s->waits[i].waits[j];
        gradsync__v1__waited_tensor__init(&wt[k]);
        wt[k].name = (char *)w->name;
        wt[k].n_missing_ranks = w->nmissing;
        wt[k].missing_ranks = w->missing;
        wt[k].pending = w->pending;
        wtp[k] = &wt[k];
      }
      rwp[i] = &rw[i];
    }
    pb.n_stalled = s->nstalled;
    pb.stalled = ptrs;
    pb.n_waits = s->nwaits;
    pb.waits = rwp;
    pb.last_stall_report = s->last_stall ? s->last_stall : "";
    pb.last_deadlock_report = s->last_deadlock ? s->last_deadlock : "";
    pb.stall_warning_s = s->stall_warning_s;
    rc = gs__codec_pack(&pb.base, out, len);
  }
  free(arr);
  free(ptrs);
  free(rw);
  free(rwp);
  free(wt);
  free(wtp);
  return rc;
}

int gs__decode_diag_stalls(const uint8_t *buf, size_t len, gs__diag_stalls *s, char *err,
                           size_t errlen) {
  memset(s, 0, sizeof *s);
  Gradsync__V1__ListStallsResponse *pb = gradsync__v1__list_stalls_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed ListStallsResponse (%zu bytes)", len);
  int rc = GS__OK;
  s->stalled = calloc(pb->n_stalled + 1, sizeof *s->stalled);
  s->waits = calloc(pb->n_waits + 1, sizeof *s->waits);
  if (!s->stalled || !s->waits) rc = GS__ERR_NO_MEMORY;
  for (size_t i = 0; !rc && i < pb->n_stalled; i++) {
    rc = pending_from_pb(pb->stalled[i], &s->stalled[i], err, errlen);
    if (!rc) s->nstalled++;
  }
  for (size_t i = 0; !rc && i < pb->n_waits; i++) {
    const Gradsync__V1__RankWait *p = pb->waits[i];
    gs__diag_rank_wait *w = &s->waits[i];
    w->rank = p->rank;
    s->nwaits++;
    w->waits = calloc(p->n_waits_on + 1, sizeof *w->waits);
    if (!w->waits) {
      rc = GS__ERR_NO_MEMORY;
      break;
    }
    for (size_t j = 0; !rc && j < p->n_waits_on; j++) {
      gs__diag_waited *t = &w->waits[j];
      rc = gs__codec_copy_str(t->name, sizeof t->name, p->waits_on[j]->name, "name", err, errlen);
      if (rc) break;
      t->pending = p->waits_on[j]->pending;
      t->missing = dup_ranks(p->waits_on[j]->missing_ranks, p->waits_on[j]->n_missing_ranks);
      if (!t->missing) {
        rc = GS__ERR_NO_MEMORY;
        break;
      }
      t->nmissing = p->waits_on[j]->n_missing_ranks;
      w->n++;
    }
  }
  s->stall_warning_s = pb->stall_warning_s;
  if (!rc && pb->last_stall_report && pb->last_stall_report[0])
    s->last_stall = strdup(pb->last_stall_report);
  if (!rc && pb->last_deadlock_report && pb->last_deadlock_report[0])
    s->last_deadlock = strdup(pb->last_deadlock_report);
  gradsync__v1__list_stalls_response__free_unpacked(pb, NULL);
  if (rc) gs__diag_stalls_free(s);
  return rc;
}

/* ---- locals -------------------------------------------------------------- */

int gs__encode_diag_locals(const gs__diag_locals *l, uint8_t **out, size_t *len) {
  Gradsync__V1__ListLocalVarsResponse pb = GRADSYNC__V1__LIST_LOCAL_VARS_RESPONSE__INIT;
  Gradsync__V1__RankLocals *rl = calloc(l->n + 1, sizeof *rl);
  Gradsync__V1__RankLocals **rlp = calloc(l->n + 1, sizeof *rlp);
  int rc = GS__ERR_NO_MEMORY;
  if (rl && rlp) {
    for (size_t i = 0; i < l->n; i++) {
      gradsync__v1__rank_locals__init(&rl[i]);
      rl[i].rank = l->ranks[i].rank;
      rl[i].n_names = l->ranks[i].n;
      rl[i].names = l->ranks[i].names;
      rlp[i] = &rl[i];
    }
    pb.n_ranks = l->n;
    pb.ranks = rlp;
    rc = gs__codec_pack(&pb.base, out, len);
  }
  free(rl);
  free(rlp);
  return rc;
}

int gs__decode_diag_locals(const uint8_t *buf, size_t len, gs__diag_locals *l, char *err,
                           size_t errlen) {
  memset(l, 0, sizeof *l);
  Gradsync__V1__ListLocalVarsResponse *pb =
      gradsync__v1__list_local_vars_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed ListLocalVarsResponse (%zu bytes)", len);
  int rc = GS__OK;
  l->ranks = calloc(pb->n_ranks + 1, sizeof *l->ranks);
  if (!l->ranks) rc = GS__ERR_NO_MEMORY;
  for (size_t i = 0; !rc && i < pb->n_ranks; i++) {
    l->ranks[i].rank = pb->ranks[i]->rank;
    l->ranks[i].names = dup_strv(pb->ranks[i]->names, pb->ranks[i]->n_names);
    if (!l->ranks[i].names) {
      rc = GS__ERR_NO_MEMORY;
      break;
    }
    l->ranks[i].n = pb->ranks[i]->n_names;
    l->n++;
  }
  gradsync__v1__list_local_vars_response__free_unpacked(pb, NULL);
  if (rc) gs__diag_locals_free(l);
  return rc;
}

/* ---- events -------------------------------------------------------------- */

int gs__encode_diag_event(const gs__diag_event *e, uint8_t **out, size_t *len) {
  Gradsync__V1__Event pb = GRADSYNC__V1__EVENT__INIT;
  pb.seq = e->seq;
  pb.time = (char *)e->time;
  pb.kind = (Gradsync__V1__EventKind)e->kind;
  pb.rank = e->rank;
  pb.message = e->message ? e->message : "";
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_diag_event(const uint8_t *buf, size_t len, gs__diag_event *e, char *err,
                          size_t errlen) {
  memset(e, 0, sizeof *e);
  Gradsync__V1__Event *pb = gradsync__v1__event__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed Event (%zu bytes)", len);
  int rc = gs__codec_copy_str(e->time, sizeof e->time, pb->time, "time", err, errlen);
  e->seq = pb->seq;
  e->kind = (int)pb->kind;
  e->rank = pb->rank;
  if (!rc && !(e->message = dup_or_empty(pb->message))) rc = GS__ERR_NO_MEMORY;
  gradsync__v1__event__free_unpacked(pb, NULL);
  if (rc) gs__diag_event_free(e);
  return rc;
}

/* ---- one-string messages ------------------------------------------------- */

int gs__encode_diag_text(gs__diag_text_kind kind, const char *text, uint8_t **out, size_t *len) {
  char *t = (char *)(text ? text : "");
  switch (kind) {
  case GS__TXT_METRICS_RESP: {
    Gradsync__V1__GetMetricsResponse pb = GRADSYNC__V1__GET_METRICS_RESPONSE__INIT;
    pb.text = t;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__TXT_TIMELINE_START: {
    Gradsync__V1__StartTimelineRequest pb = GRADSYNC__V1__START_TIMELINE_REQUEST__INIT;
    pb.path = t;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__TXT_TIMELINE_STARTED: {
    Gradsync__V1__StartTimelineResponse pb = GRADSYNC__V1__START_TIMELINE_RESPONSE__INIT;
    pb.path = t;
    return gs__codec_pack(&pb.base, out, len);
  }
  case GS__TXT_ABORT_REQ: {
    Gradsync__V1__AbortJobRequest pb = GRADSYNC__V1__ABORT_JOB_REQUEST__INIT;
    pb.reason = t;
    return gs__codec_pack(&pb.base, out, len);
  }
  }
  return GS__ERR_INVALID_ARG;
}

int gs__decode_diag_text(gs__diag_text_kind kind, const uint8_t *buf, size_t len, size_t max,
                         char **text, char *err, size_t errlen) {
  *text = NULL;
  ProtobufCMessage *m = NULL;
  const char *s = NULL, *what = "";
  switch (kind) {
  case GS__TXT_METRICS_RESP: {
    Gradsync__V1__GetMetricsResponse *pb =
        gradsync__v1__get_metrics_response__unpack(NULL, len, buf);
    if (pb) s = pb->text, m = &pb->base;
    what = "GetMetricsResponse";
    break;
  }
  case GS__TXT_TIMELINE_START: {
    Gradsync__V1__StartTimelineRequest *pb =
        gradsync__v1__start_timeline_request__unpack(NULL, len, buf);
    if (pb) s = pb->path, m = &pb->base;
    what = "StartTimelineRequest";
    break;
  }
  case GS__TXT_TIMELINE_STARTED: {
    Gradsync__V1__StartTimelineResponse *pb =
        gradsync__v1__start_timeline_response__unpack(NULL, len, buf);
    if (pb) s = pb->path, m = &pb->base;
    what = "StartTimelineResponse";
    break;
  }
  case GS__TXT_ABORT_REQ: {
    Gradsync__V1__AbortJobRequest *pb = gradsync__v1__abort_job_request__unpack(NULL, len, buf);
    if (pb) s = pb->reason, m = &pb->base;
    what = "AbortJobRequest";
    break;
  }
  }
  if (!m) return gs__codec_fail(err, errlen, "malformed %s (%zu bytes)", what, len);
  int rc = GS__OK;
  size_t n = s ? strlen(s) : 0;
  if (n > max)
    rc =
        gs__codec_fail(err, errlen, "%s: text of %zu bytes exceeds the limit of %zu", what, n, max);
  else if (!(*text = dup_or_empty(s)))
    rc = GS__ERR_NO_MEMORY;
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}

int gs__encode_timeline_stopped(const char *path, uint64_t events, uint8_t **out, size_t *len) {
  Gradsync__V1__StopTimelineResponse pb = GRADSYNC__V1__STOP_TIMELINE_RESPONSE__INIT;
  pb.path = (char *)(path ? path : "");
  pb.events = events;
  return gs__codec_pack(&pb.base, out, len);
}

int gs__decode_timeline_stopped(const uint8_t *buf, size_t len, char **path, uint64_t *events,
                                char *err, size_t errlen) {
  Gradsync__V1__StopTimelineResponse *pb =
      gradsync__v1__stop_timeline_response__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed StopTimelineResponse (%zu bytes)", len);
  *path = dup_or_empty(pb->path);
  *events = pb->events;
  gradsync__v1__stop_timeline_response__free_unpacked(pb, NULL);
  return *path ? GS__OK : GS__ERR_NO_MEMORY;
}

int gs__decode_diag_empty(const uint8_t *buf, size_t len, char *err, size_t errlen) {
  /* Every empty request has the same (empty) schema. */
  Gradsync__V1__GetStatusRequest *pb = gradsync__v1__get_status_request__unpack(NULL, len, buf);
  if (!pb) return gs__codec_fail(err, errlen, "malformed request (%zu bytes)", len);
  gradsync__v1__get_status_request__free_unpacked(pb, NULL);
  return GS__OK;
}

/* ---- reflection ---------------------------------------------------------- */

typedef struct refl_file {
  char *name;
  const uint8_t *raw; /* serialized FileDescriptorProto inside the set */
  size_t rawlen;
  size_t ndeps;
  int *deps; /* indexes into files; -1 when not in the set */
} refl_file;

typedef struct refl_sym {
  char *name; /* fully qualified, no leading dot */
  int file;
} refl_sym;

struct gs__refl_index {
  refl_file *files;
  size_t nfiles;
  refl_sym *syms;
  size_t nsyms, capsyms;
  char **services;
  size_t nservices;
  int oom;
};

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 1;
    }
  }
  return 0;
}

/* Adds scope.name; returns the stored name (NULL when out of memory). */
static const char *add_sym(gs__refl_index *ix, const char *scope, const char *name, int file) {
  if (!name || ix->oom) return NULL;
  if (ix->nsyms == ix->capsyms) {
    size_t cap = ix->capsyms ? ix->capsyms * 2 : 128;
    refl_sym *s = realloc(ix->syms, cap * sizeof *s);
    if (!s) {
      ix->oom = 1;
      return NULL;
    }
    ix->syms = s;
    ix->capsyms = cap;
  }
  size_t n = strlen(scope) + strlen(name) + 2;
  char *fq = malloc(n);
  if (!fq) {
    ix->oom = 1;
    return NULL;
  }
  if (scope[0])
    snprintf(fq, n, "%s.%s", scope, name);
  else
    snprintf(fq, n, "%s", name);
  ix->syms[ix->nsyms].name = fq;
  ix->syms[ix->nsyms].file = file;
  return ix->syms[ix->nsyms++].name;
}

static void index_message(gs__refl_index *ix, const char *scope,
                          const Google__Protobuf__DescriptorProto *m, int file) {
  const char *fq0 = add_sym(ix, scope, m->name, file);
  if (!fq0) return;
  char *fq = strdup(fq0); /* the table may move */
  if (!fq) {
    ix->oom = 1;
    return;
  }
  for (size_t i = 0; i < m->n_field; i++) add_sym(ix, fq, m->field[i]->name, file);
  for (size_t i = 0; i < m->n_oneof_decl; i++) add_sym(ix, fq, m->oneof_decl[i]->name, file);
  for (size_t i = 0; i < m->n_enum_type; i++) add_sym(ix, fq, m->enum_type[i]->name, file);
  for (size_t i = 0; i < m->n_nested_type; i++) index_message(ix, fq, m->nested_type[i], file);
  free(fq);
}

static int index_file(gs__refl_index *ix, refl_file *f, int fi, char ***dep_names) {
  Google__Protobuf__FileDescriptorProto *fd =
      google__protobuf__file_descriptor_proto__unpack(NULL, f->rawlen, f->raw);
  if (!fd) return GS__ERR_INVALID_ARG;
  int rc = GS__OK;
  f->name = dup_or_empty(fd->name);
  f->ndeps = fd->n_dependency;
  f->deps = calloc(f->ndeps + 1, sizeof *f->deps);
  *dep_names = dup_strv(fd->dependency, fd->n_dependency);
  if (!f->name || !f->deps || !*dep_names) rc = GS__ERR_NO_MEMORY;
  const char *pkg = fd->package ? fd->package : "";
  for (size_t i = 0; !rc && i < fd->n_message_type; i++)
    index_message(ix, pkg, fd->message_type[i], fi);
  for (size_t i = 0; !rc && i < fd->n_enum_type; i++) add_sym(ix, pkg, fd->enum_type[i]->name, fi);
  for (size_t i = 0; !rc && i < fd->n_service; i++) {
    const Google__Protobuf__ServiceDescriptorProto *s = fd->service[i];
    const char *sfq0 = add_sym(ix, pkg, s->name, fi);
    char *sfq = sfq0 ? strdup(sfq0) : NULL;
    for (size_t j = 0; sfq && j < s->n_method; j++) add_sym(ix, sfq, s->method[j]->name, fi);
    free(sfq);
  }
  if (ix->oom) rc = GS__ERR_NO_MEMORY;
  google__protobuf__file_descriptor_proto__free_unpacked(fd, NULL);
  return rc;
}

int gs__refl_index_create(const uint8_t *set, size_t len, const char *const *services,
                          size_t nservices, gs__refl_index **out) {
  *out = NULL;
  gs__refl_index *ix = calloc(1, sizeof *ix);
  if (!ix) return GS__ERR_NO_MEMORY;
  int rc = GS__OK;
  char ***dep_names = NULL;
  size_t cap = 0;
  const uint8_t *p = set, *end = set + len;
  /* A FileDescriptorSet is `repeated FileDescriptorProto file = 1`: walk
   * the wire format to keep each file's bytes as stored. */
  while (!rc && p < end) {
    uint64_t key, l;
    if (!read_varint(&p, end, &key) || (key & 7) != 2 || !read_varint(&p, end, &l) ||
        l > (uint64_t)(end - p)) {
      rc = GS__ERR_INVALID_ARG;
      break;
    }
    if ((key >> 3) == 1) {
      if (ix->nfiles == cap) {
        cap = cap ? cap * 2 : 16;
        refl_file *nf = realloc(ix->files, cap * sizeof *nf);
        char ***nd = realloc(dep_names, cap * sizeof *nd);
        if (nf) ix->files = nf;
        if (nd) dep_names = nd;
        if (!nf || !nd) {
          rc = GS__ERR_NO_MEMORY;
          break;
        }
      }
      refl_file *f = &ix->files[ix->nfiles];
      memset(f, 0, sizeof *f);
      dep_names[ix->nfiles] = NULL;
      f->raw = p;
      f->rawlen = (size_t)l;
      int fi = (int)ix->nfiles++;
      rc = index_file(ix, f, fi, &dep_names[fi]);
    }
    p += l;
  }
  for (size_t i = 0; !rc && i < ix->nfiles; i++) {
    refl_file *f = &ix->files[i];
    for (size_t d = 0; d < f->ndeps; d++) {
      f->deps[d] = -1;
      for (size_t j = 0; j < ix->nfiles; j++)
        if (!strcmp(ix->files[j].name, dep_names[i][d])) f->deps[d] = (int)j;
    }
  }
  for (size_t i = 0; i < ix->nfiles; i++)
    if (dep_names && dep_names[i]) free_strv(dep_names[i], ix->files[i].ndeps);
  free(dep_names);
  if (!rc) {
    ix->services = dup_strv((char *const *)services, nservices);
    if (!ix->services)
      rc = GS__ERR_NO_MEMORY;
    else
      ix->nservices = nservices;
  }
  if (rc) {
    gs__refl_index_destroy(ix);
    return rc;
  }
  *out = ix;
  return GS__OK;
}

void gs__refl_index_destroy(gs__refl_index *ix) {
  if (!ix) return;
  for (size_t i = 0; i < ix->nfiles; i++) {
    free(ix->files[i].name);
    free(ix->files[i].deps);
  }
  free(ix->files);
  for (size_t i = 0; i < ix->nsyms; i++) free(ix->syms[i].name);
  free(ix->syms);
  free_strv(ix->services, ix->nservices);
  free(ix);
}

static int find_symbol(const gs__refl_index *ix, const char *sym) {
  if (sym[0] == '.') sym++;
  for (size_t i = 0; i < ix->nsyms; i++)
    if (!strcmp(ix->syms[i].name, sym)) return ix->syms[i].file;
  return -1;
}

const char *gs__refl_file_of(const gs__refl_index *ix, const char *symbol) {
  int fi = find_symbol(ix, symbol);
  return fi >= 0 ? ix->files[fi].name : NULL;
}

static int find_file(const gs__refl_index *ix, const char *name) {
  for (size_t i = 0; i < ix->nfiles; i++)
    if (!strcmp(ix->files[i].name, name)) return (int)i;
  return -1;
}

/* The requested file first, then its transitive dependencies. */
static void collect(const gs__refl_index *ix, int fi, char *seen, ProtobufCBinaryData *out,
                    size_t *n) {
  if (fi < 0 || seen[fi]) return;
  seen[fi] = 1;
  out[*n].data = (uint8_t *)ix->files[fi].raw;
  out[*n].len = ix->files[fi].rawlen;
  (*n)++;
  for (size_t d = 0; d < ix->files[fi].ndeps; d++) collect(ix, ix->files[fi].deps[d], seen, out, n);
}

int gs__refl_answer(const gs__refl_index *ix, const uint8_t *buf, size_t len, uint8_t **out,
                    size_t *olen) {
  Grpc__Reflection__V1alpha__ServerReflectionRequest *req =
      grpc__reflection__v1alpha__server_reflection_request__unpack(NULL, len, buf);
  Grpc__Reflection__V1alpha__ServerReflectionResponse resp =
      GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
  Grpc__Reflection__V1alpha__FileDescriptorResponse fdr =
      GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT;
  Grpc__Reflection__V1alpha__ListServiceResponse lsr =
      GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT;
  Grpc__Reflection__V1alpha__ExtensionNumberResponse enr =
      GRPC__REFLECTION__V1ALPHA__EXTENSION_NUMBER_RESPONSE__INIT;
  Grpc__Reflection__V1alpha__ErrorResponse er = GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT;
  Grpc__Reflection__V1alpha__ServiceResponse *svc = NULL, **svcp = NULL;
  ProtobufCBinaryData *files = NULL;
  char *seen = NULL;
  char msg[GS__MAX_NAME + 128];
  int fi = -1, rc;
  enum { NOT_FOUND = 5, INVALID_ARGUMENT = 3, UNIMPLEMENTED = 12, RESOURCE_EXHAUSTED = 8 };

#define REFL_ERROR(code, ...)                                                                      \
  do {                                                                                             \
    snprintf(msg, sizeof msg, __VA_ARGS__);                                                        \
    er.error_code = (code);                                                                        \
    er.error_message = msg;                                                                        \
    resp.message_response_case =                                                                   \
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;    \
    resp.error_response = &er;                                                                     \
  } while (0)

  if (!req) {
    REFL_ERROR(INVALID_ARGUMENT, "malformed ServerReflectionRequest (%zu bytes)", len);
    return gs__codec_pack(&resp.base, out, olen);
  }
  resp.valid_host = req->host;
  resp.original_request = req;
  switch (req->message_request_case) {
  case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
    svc = calloc(ix->nservices + 1, sizeof *svc);
    svcp = calloc(ix->nservices + 1, sizeof *svcp);
    if (!svc || !svcp) {
      REFL_ERROR(RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    for (size_t i = 0; i < ix->nservices; i++) {
      grpc__reflection__v1alpha__service_response__init(&svc[i]);
      svc[i].name = ix->services[i];
      svcp[i] = &svc[i];
    }
    lsr.n_service = ix->nservices;
    lsr.service = svcp;
    resp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
    resp.list_services_response = &lsr;
    break;
  case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
  case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
    if (req->message_request_case ==
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME) {
      fi = find_file(ix, req->file_by_filename);
      if (fi < 0) REFL_ERROR(NOT_FOUND, "file not found: %.255s", req->file_by_filename);
    } else {
      fi = find_symbol(ix, req->file_containing_symbol);
      if (fi < 0) REFL_ERROR(NOT_FOUND, "symbol not found: %.255s", req->file_containing_symbol);
    }
    if (fi < 0) break;
    files = calloc(ix->nfiles, sizeof *files);
    seen = calloc(ix->nfiles, 1);
    if (!files || !seen) {
      REFL_ERROR(RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    collect(ix, fi, seen, files, &fdr.n_file_descriptor_proto);
    fdr.file_descriptor_proto = files;
    resp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    resp.file_descriptor_response = &fdr;
    break;
  case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE: {
    const char *t = req->all_extension_numbers_of_type;
    if (find_symbol(ix, t) < 0) {
      REFL_ERROR(NOT_FOUND, "type not found: %.255s", t);
      break;
    }
    /* None of the served types has extensions. */
    enr.base_type_name = (char *)(t[0] == '.' ? t + 1 : t);
    resp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
    resp.all_extension_numbers_response = &enr;
    break;
  }
  case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
    REFL_ERROR(NOT_FOUND, "no extensions are defined in gradsyncd's descriptors");
    break;
  default:
    REFL_ERROR(UNIMPLEMENTED, "unknown reflection request");
    break;
  }
#undef REFL_ERROR
  rc = gs__codec_pack(&resp.base, out, olen);
  free(files);
  free(seen);
  free(svc);
  free(svcp);
  grpc__reflection__v1alpha__server_reflection_request__free_unpacked(req, NULL);
  return rc;
}
