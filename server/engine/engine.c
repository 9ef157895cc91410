/* The coordinator's engine (see engine.h): membership, the table of pending
 * tensors keyed by name, validation of every rank's request against the
 * first one, and the numbered plans that every rank runs in the same order.
 *
 * Owns all coordinator job state; called only from the transport's
 * completion-queue thread. No I/O, no clock: time arrives as now_ms. */
#include "engine.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "dtype.h"
#include "fusion_layout.h"
#include "log.h"
#include "status.h"

/* GONE: connected, then disconnected before the world was ready; the slot
 * may be joined again. */
typedef enum {
  RANK_NONE = 0,
  RANK_JOINED,
  RANK_CONNECTED,
  RANK_LEFT,
  RANK_LOST,
  RANK_GONE
} rank_state;

typedef struct rank_slot {
  rank_state state;
  char host[GS__MAX_HOST + 1];
  int32_t pid;
  uint64_t joined_ms, last_msg_ms;
  uint64_t last_done_seq; /* highest plan it reported executed */
  int joined;             /* called gs_join: counts as ready for everything */
  size_t nblocked;        /* names its application threads are blocked on */
  char (*blocked)[GS__MAX_NAME + 1];
} rank_slot;

/* One tensor name waiting for every rank. Ranks whose requests differ from
 * the first get another variant; variant_of[r] is -1 until rank r submits. */
typedef struct entry {
  char name[GS__MAX_NAME + 1];
  UT_hash_handle hh;
  gs__tensor_request *variants;
  int32_t nvariants;
  int32_t *variant_of;
  int64_t *first_dims; /* allgather: each rank's first dimension */
  int32_t count;
  uint64_t first_ms;
  uint64_t order; /* arrival order, for stable reports */
  uint64_t bytes; /* of the first request */
  int queued;     /* ready, waiting in e->ready for emission */
  int in_group;   /* complete, waiting for the rest of its group */
} entry;

/* A name some ranks registered as local (model-parallel). */
typedef struct local_name {
  char name[GS__MAX_NAME + 1];
  char *ranks; /* world flags: registered it local */
  char *subs;  /* world flags: submitted it for a collective anyway */
  int32_t n;
  UT_hash_handle hh;
} local_name;

/* The members of a group that are complete so far. */
typedef struct group {
  uint64_t id;
  uint32_t size, n;
  entry **members;
  UT_hash_handle hh;
} group;

/* Response cache: a request negotiated once gets an id that ranks send
 * instead of the request. Live items are in both hashes and the LRU list;
 * evicted or invalidated ones stay a while as tombstones (by id only) so an
 * id a rank sent before it heard of the eviction still resolves. */
typedef struct cache_item {
  uint32_t id;
  uint64_t last_seq; /* the plan that last used it */
  gs__tensor_request req;
  UT_hash_handle hh_name, hh_id;
  struct cache_item *prev, *next; /* LRU (live) or FIFO (tombstones) */
} cache_item;

/* Plan templates: a plan whose responses repeat an earlier one's (the same
 * fused groups step after step) is sent as the template's id. LRU, with
 * evictions announced to the ranks in the next plan. */
#define PLAN_TEMPLATES 256
typedef struct plan_template {
  uint32_t id;
  uint64_t hash;
  gs__plan plan; /* responses only */
  UT_hash_handle hh;
  struct plan_template *prev, *next;
} plan_template;

/* The last plans emitted, for naming what a lost rank left unfinished. */
#define RECENT_PLANS 32
typedef struct recent_plan {
  uint64_t seq;
  char names[512]; /* "a, b, c" (cut) */
} recent_plan;

struct gs__engine {
  gs__engine_config cfg;
  int32_t world;    /* 0 until known */
  rank_slot *ranks; /* world entries once known */
  int32_t nconnected;
  int world_ready;
  int aborted;
  int32_t left_rank; /* a rank that left the job (-1: none) */
  int32_t njoined, last_joined;
  group *groups;
  local_name *locals;
  entry *table; /* uthash by name */
  uint64_t next_order;
  uint64_t next_plan_seq;
  uint64_t tensors_planned;
  entry **ready; /* ready entries not yet emitted, in readiness order */
  size_t nready, ready_cap;
  uint64_t ready_bytes;
  uint64_t next_window_ms;   /* window policy: next emission */
  uint64_t ready_ms;         /* when the world became ready */
  uint64_t last_activity_ms; /* last new request or change of a blocked set */
  int deadlock_reported;     /* this quiet episode was already reported */
  uint64_t next_stall_check_ms;
  uint64_t stall_reports, deadlocks;
  char *last_stall, *last_deadlock;
  /* response cache */
  cache_item *cache_by_name, *cache_by_id, *tomb_by_id;
  cache_item *lru_head, *lru_tail, *tomb_head, *tomb_tail;
  size_t ncache, ntomb;
  uint32_t next_cache_id;
  uint32_t *evicted; /* ids to announce in the next plan */
  size_t nevicted, evicted_cap;
  uint64_t cache_hits, full_requests;
  int cache_thrash_warned, thrash_pending;
  plan_template *templates, *tmpl_head, *tmpl_tail; /* by hash; LRU list */
  size_t ntemplates;
  uint32_t next_template_id;
  uint32_t *forget; /* template ids to announce in the next plan */
  size_t nforget, forget_cap;
  uint64_t plans_replayed;
  recent_plan recent[RECENT_PLANS];
};

/* ---- outbox --------------------------------------------------------------- */

static gs__out *out_push(gs__outbox *box, gs__out_kind kind) {
  if (box->n == box->cap) {
    size_t cap = box->cap ? box->cap * 2 : 8;
    gs__out *items = realloc(box->items, cap * sizeof *items);
    if (!items) return NULL;
    box->items = items;
    box->cap = cap;
  }
  gs__out *o = &box->items[box->n++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  return o;
}

static void out_log(gs__outbox *box, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void out_log(gs__outbox *box, int level, const char *fmt, ...) {
  char buf[GS__MAX_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  gs__out *o = out_push(box, GS__OUT_LOG);
  if (!o) return;
  o->level = level;
  o->text = strdup(buf);
}

void gs__outbox_clear(gs__outbox *box) {
  for (size_t i = 0; i < box->n; i++) {
    gs__plan_msg_free(&box->items[i].msg);
    free(box->items[i].text);
  }
  box->n = 0;
}

void gs__outbox_free(gs__outbox *box) {
  gs__outbox_clear(box);
  free(box->items);
  memset(box, 0, sizeof *box);
}

/* ---- small text helpers ------------------------------------------------------ */

/* Appends to buf (bounded, always NUL-terminated). */
static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, cap - used, fmt, ap);
  va_end(ap);
}

/* "[0,2,5-9]": ascending ranks, runs of three or more shortened. */
static void format_ranks(const int32_t *ranks, size_t n, char *buf, size_t cap) {
  buf[0] = 0;
  append(buf, cap, "[");
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
    const char *sep = i ? "," : "";
    if (j - i >= 2) {
      append(buf, cap, "%s%d-%d", sep, ranks[i], ranks[j]);
    } else {
      for (size_t k = i; k <= j; k++) append(buf, cap, "%s%d", k ? "," : "", ranks[k]);
    }
    i = j + 1;
  }
  append(buf, cap, "]");
}

static const char *rank_host(const gs__engine *e, int32_t r) {
  return e->ranks[r].host[0] ? e->ranks[r].host : "?";
}

/* ---- engine lifecycle ---------------------------------------------------------- */

static int set_world(gs__engine *e, int32_t size) {
  e->ranks = calloc((size_t)size, sizeof *e->ranks);
  if (!e->ranks) return GS__ERR_NO_MEMORY;
  e->world = size;
  return GS__OK;
}

int gs__engine_create(const gs__engine_config *cfg, gs__engine **out) {
  *out = NULL;
  if (cfg->world_size < 0 || cfg->world_size > GS__MAX_WORLD) return GS__ERR_INVALID_ARG;
  gs__engine *e = calloc(1, sizeof *e);
  if (!e) return GS__ERR_NO_MEMORY;
  e->cfg = *cfg;
  e->next_plan_seq = 1;
  e->left_rank = -1;
  e->last_joined = -1;
  e->next_cache_id = 1;
  e->next_template_id = 1;
  if (cfg->world_size > 0 && set_world(e, cfg->world_size) != GS__OK) {
    free(e);
    return GS__ERR_NO_MEMORY;
  }
  *out = e;
  return GS__OK;
}

static void entry_free(entry *en) {
  if (!en) return;
  free(en->variants);
  free(en->variant_of);
  free(en->first_dims);
  free(en);
}

void gs__engine_destroy(gs__engine *e) {
  if (!e) return;
  entry *en, *tmp;
  HASH_ITER(hh, e->table, en, tmp) {
    HASH_DEL(e->table, en);
    entry_free(en);
  }
  free(e->ready);
  local_name *ln, *lntmp;
  HASH_ITER(hh, e->locals, ln, lntmp) {
    HASH_DEL(e->locals, ln);
    free(ln->ranks);
    free(ln->subs);
    free(ln);
  }
  group *g, *gtmp;
  HASH_ITER(hh, e->groups, g, gtmp) {
    HASH_DEL(e->groups, g);
    free(g->members);
    free(g);
  }
  for (int32_t r = 0; r < e->world; r++) free(e->ranks[r].blocked);
  free(e->ranks);
  free(e->last_stall);
  free(e->last_deadlock);
  cache_item *ci, *ctmp;
  HASH_CLEAR(hh_name, e->cache_by_name); /* the items are freed through the id table */
  HASH_ITER(hh_id, e->cache_by_id, ci, ctmp) {
    HASH_DELETE(hh_id, e->cache_by_id, ci);
    free(ci);
  }
  HASH_ITER(hh_id, e->tomb_by_id, ci, ctmp) {
    HASH_DELETE(hh_id, e->tomb_by_id, ci);
    free(ci);
  }
  free(e->evicted);
  plan_template *pt, *pttmp;
  HASH_ITER(hh, e->templates, pt, pttmp) {
    HASH_DEL(e->templates, pt);
    gs__plan_free(&pt->plan);
    free(pt);
  }
  free(e->forget);
  free(e);
}

/* ---- membership -------------------------------------------------------------- */

int gs__engine_join(gs__engine *e, const gs__join_request *req, uint64_t now_ms,
                    gs__join_response *resp, char *err, size_t errlen) {
  const char *host = req->host[0] ? req->host : "?";
  if (e->aborted) {
    snprintf(err, errlen, "rank %d (%s:%d) cannot join: the job was aborted; restart the whole job",
             req->rank, host, req->pid);
    return GS__ERR_ABORTED;
  }
  if (e->cfg.job_id[0] && strcmp(e->cfg.job_id, req->job_id) != 0) {
    snprintf(err, errlen,
             "rank %d (%s:%d) asked to join job '%s' but this coordinator serves job '%s'; check "
             "GRADSYNC_COORDINATOR",
             req->rank, host, req->pid, req->job_id, e->cfg.job_id);
    return GS__ERR_INVALID_ARG;
  }
  if (req->size < 1 || req->size > GS__MAX_WORLD) {
    snprintf(err, errlen,
             "rank %d (%s:%d) gave a job size of %d; the size must be from 1 to %d (check "
             "GRADSYNC_SIZE)",
             req->rank, host, req->pid, req->size, GS__MAX_WORLD);
    return GS__ERR_INVALID_ARG;
  }
  if (e->world && req->size != e->world) {
    snprintf(
        err, errlen,
        "rank %d (%s:%d) says the job has %d ranks, but the job has %d ranks (%s); start every "
        "rank with the same GRADSYNC_SIZE",
        req->rank, host, req->pid, req->size, e->world,
        e->cfg.world_size ? "set by gradsyncd --world-size" : "set by the first rank to join");
    return GS__ERR_INVALID_ARG;
  }
  if (req->rank < 0 || req->rank >= req->size) {
    snprintf(err, errlen,
             "rank %d (%s:%d) is out of range for a job of %d ranks (valid ranks: 0..%d); check "
             "GRADSYNC_RANK",
             req->rank, host, req->pid, req->size, req->size - 1);
    return GS__ERR_INVALID_ARG;
  }
  if (!e->world && set_world(e, req->size) != GS__OK) {
    snprintf(err, errlen, "out of memory for a job of %d ranks", req->size);
    return GS__ERR_NO_MEMORY;
  }
  rank_slot *s = &e->ranks[req->rank];
  if (s->state != RANK_NONE && s->state != RANK_GONE) {
    snprintf(err, errlen,
             "rank %d already joined from %s:%d; a second process (%s:%d) tried to join as rank "
             "%d. Give every process its own GRADSYNC_RANK",
             req->rank, s->host[0] ? s->host : "?", s->pid, host, req->pid, req->rank);
    return GS__ERR_ALREADY_JOINED;
  }
  s->state = RANK_JOINED;
  snprintf(s->host, sizeof s->host, "%s", req->host);
  s->pid = req->pid;
  s->joined_ms = s->last_msg_ms = now_ms;
  memset(resp, 0, sizeof *resp);
  snprintf(resp->job_id, sizeof resp->job_id, "%s", e->cfg.job_id);
  resp->epoch = 1;
  resp->rank = req->rank;
  resp->size = e->world;
  resp->config = e->cfg.job;
  return GS__OK;
}

static int world_status(const gs__engine *e, gs__plan_msg *m) {
  memset(m, 0, sizeof *m);
  m->kind = GS__MSG_WORLD;
  m->world.ready = e->world_ready;
  m->world.size = e->world;
  m->world.epoch = 1;
  m->world.ranks = calloc((size_t)e->world, sizeof *m->world.ranks);
  m->world.missing_ranks = calloc((size_t)e->world, sizeof *m->world.missing_ranks);
  m->world.gone_ranks = calloc((size_t)e->world, sizeof *m->world.gone_ranks);
  if (!m->world.ranks || !m->world.missing_ranks || !m->world.gone_ranks) {
    gs__plan_msg_free(m);
    return GS__ERR_NO_MEMORY;
  }
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (s->state == RANK_CONNECTED) {
      gs__rank_info *ri = &m->world.ranks[m->world.nranks++];
      ri->rank = r;
      snprintf(ri->host, sizeof ri->host, "%s", s->host);
      ri->pid = s->pid;
    } else if (s->state == RANK_NONE || s->state == RANK_JOINED) {
      m->world.missing_ranks[m->world.nmissing++] = r;
    } else if (s->state == RANK_GONE) {
      m->world.gone_ranks[m->world.ngone++] = r;
    }
  }
  return GS__OK;
}

int gs__engine_session_open(gs__engine *e, int32_t rank, uint64_t now_ms, gs__outbox *box,
                            char *err, size_t errlen) {
  if (rank < 0 || rank >= e->world || e->ranks[rank].state == RANK_NONE) {
    snprintf(err, errlen, "rank %d opened a session without joining first (call Join)", rank);
    return GS__ERR_INVALID_ARG;
  }
  rank_slot *s = &e->ranks[rank];
  if (s->state != RANK_JOINED) {
    snprintf(err, errlen, "rank %d (%s:%d) already has a session; one session per rank", rank,
             rank_host(e, rank), s->pid);
    return GS__ERR_ALREADY_JOINED;
  }
  s->state = RANK_CONNECTED;
  s->last_msg_ms = now_ms;
  e->nconnected++;
  if (e->nconnected == e->world) {
    e->world_ready = 1;
    e->ready_ms = e->last_activity_ms = now_ms;
    /* Liveness counts from here: ranks do not heartbeat while they wait. */
    for (int32_t r = 0; r < e->world; r++) e->ranks[r].last_msg_ms = now_ms;
    e->next_stall_check_ms = now_ms + (uint64_t)e->cfg.job.stall_warning_s * 1000u;
  }
  out_log(box, GS__LOG_INFO, "rank %d (%s:%d) connected; %d of %d ranks present", rank,
          rank_host(e, rank), s->pid, e->nconnected, e->world);
  gs__out *o = out_push(box, GS__OUT_TO_ALL);
  if (o && world_status(e, &o->msg) != GS__OK) box->n--;
  if (e->world_ready) out_log(box, GS__LOG_INFO, "all %d ranks connected: world ready", e->world);
  return GS__OK;
}

/* ---- the tensor table ---------------------------------------------------------- */

/* What two requests must agree on, in the order mismatches are reported. */
typedef enum {
  ATTR_OP,
  ATTR_DTYPE,
  ATTR_SHAPE,
  ATTR_REDUCE,
  ATTR_PRESCALE,
  ATTR_POSTSCALE,
  ATTR_ROOT,
  ATTR_DEVICE,
  ATTR_GROUP,
  ATTR_COUNT
} attr;

static const char *const k_attr_names[ATTR_COUNT] = {
    "operations",        "data types",      "shapes",  "reduce ops", "prescale factors",
    "postscale factors", "broadcast roots", "devices", "groups"};

/* Shapes agree fully for allreduce/broadcast/reducescatter; for allgather
 * and alltoall only the rank and every dimension after the first. */
static int shape_equal(const gs__tensor_request *a, const gs__tensor_request *b) {
  if (a->ndim != b->ndim) return 0;
  int from = (a->op == GS__OP_ALLGATHER || a->op == GS__OP_ALLTOALL) ? 1 : 0;
  for (int i = from; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int attr_equal(attr at, const gs__tensor_request *a, const gs__tensor_request *b) {
  switch (at) {
  case ATTR_OP:
    return a->op == b->op;
  case ATTR_DTYPE:
    return a->dtype == b->dtype;
  case ATTR_SHAPE:
    return a->op != b->op || shape_equal(a, b);
  case ATTR_REDUCE:
    return (a->op != GS__OP_ALLREDUCE && a->op != GS__OP_REDUCESCATTER) ||
           a->reduce_op == b->reduce_op;
  case ATTR_PRESCALE:
    return a->prescale == b->prescale;
  case ATTR_POSTSCALE:
    return a->postscale == b->postscale;
  case ATTR_ROOT:
    return a->op != GS__OP_BROADCAST || a->root_rank == b->root_rank;
  case ATTR_DEVICE:
    return a->device == b->device;
  case ATTR_GROUP:
    return a->group_id == b->group_id && a->group_size == b->group_size;
  default:
    return 1;
  }
}

static int request_equal(const gs__tensor_request *a, const gs__tensor_request *b) {
  for (int at = 0; at < ATTR_COUNT; at++)
    if (!attr_equal((attr)at, a, b)) return 0;
  return 1;
}

static void attr_format(attr at, const gs__tensor_request *r, char *buf, size_t cap) {
  switch (at) {
  case ATTR_OP:
    snprintf(buf, cap, "%s", gs__op_type_name(r->op));
    break;
  case ATTR_DTYPE:
    snprintf(buf, cap, "%s", gs__dtype_name(r->dtype));
    break;
  case ATTR_SHAPE:
    if (r->op == GS__OP_ALLGATHER || r->op == GS__OP_ALLTOALL) {
      char s[256];
      gs__shape_format(r->ndim > 1 ? r->shape + 1 : r->shape, r->ndim > 1 ? r->ndim - 1 : 0, s,
                       sizeof s);
      snprintf(buf, cap, "%d dims, trailing %s", r->ndim, s);
    } else {
      gs__shape_format(r->shape, r->ndim, buf, cap);
    }
    break;
  case ATTR_REDUCE:
    snprintf(buf, cap, "%s", gs__reduce_op_name(r->reduce_op));
    break;
  case ATTR_PRESCALE:
    snprintf(buf, cap, "%g", r->prescale);
    break;
  case ATTR_POSTSCALE:
    snprintf(buf, cap, "%g", r->postscale);
    break;
  case ATTR_ROOT:
    snprintf(buf, cap, "root %d", r->root_rank);
    break;
  case ATTR_DEVICE:
    snprintf(buf, cap, "%s", gs__device_name(r->device));
    break;
  case ATTR_GROUP:
    if (r->group_size > 1)
      snprintf(buf, cap, "group %llu of %u tensors", (unsigned long long)r->group_id,
               r->group_size);
    else
      snprintf(buf, cap, "no group");
    break;
  default:
    buf[0] = 0;
  }
}

/* The one-line mismatch error of en: the first attribute on which the
 * variants differ, with the ranks that sent each value. */
static char *mismatch_message(const gs__engine *e, const entry *en) {
  attr at = ATTR_COUNT;
  for (int a = 0; a < ATTR_COUNT && at == ATTR_COUNT; a++)
    for (int32_t v = 1; v < en->nvariants; v++)
      if (!attr_equal((attr)a, &en->variants[0], &en->variants[v])) {
        at = (attr)a;
        break;
      }
  char *msg = malloc(GS__MAX_TEXT);
  int32_t *ranks = malloc((size_t)e->world * sizeof *ranks);
  char *done = calloc((size_t)e->world, 1);
  if (!msg || !ranks || !done) {
    free(ranks);
    free(done);
    return msg ? strcpy(msg, "mismatched requests (out of memory while describing them)") : NULL;
  }
  snprintf(msg, GS__MAX_TEXT, "tensor '%s': mismatched %s: ", en->name,
           at < ATTR_COUNT ? k_attr_names[at] : "requests");
  /* Group ranks by the value of the differing attribute, lowest rank first. */
  int first_group = 1;
  for (int32_t r = 0; r < e->world; r++) {
    if (done[r] || en->variant_of[r] < 0) continue;
    const gs__tensor_request *ref = &en->variants[en->variant_of[r]];
    size_t n = 0;
    for (int32_t q = r; q < e->world; q++) {
      if (done[q] || en->variant_of[q] < 0) continue;
      if (at < ATTR_COUNT && !attr_equal(at, ref, &en->variants[en->variant_of[q]])) continue;
      if (at == ATTR_COUNT && en->variant_of[q] != en->variant_of[r]) continue;
      done[q] = 1;
      ranks[n++] = q;
    }
    char rs[1024], val[512];
    format_ranks(ranks, n, rs, sizeof rs);
    attr_format(at < ATTR_COUNT ? at : ATTR_SHAPE, ref, val, sizeof val);
    append(msg, GS__MAX_TEXT, "%sranks %s sent %s", first_group ? "" : ", ", rs, val);
    first_group = 0;
  }
  free(ranks);
  free(done);
  return msg;
}

/* Rank-local checks of one request; on failure a message for that rank. */
static int check_request(const gs__engine *e, int32_t rank, const gs__tensor_request *r, char *err,
                         size_t errlen) {
  if (!isfinite(r->prescale) || !isfinite(r->postscale)) {
    snprintf(err, errlen,
             "tensor '%s': rank %d sent prescale %g and postscale %g; both must be finite numbers",
             r->name, rank, r->prescale, r->postscale);
    return GS__ERR_INVALID_ARG;
  }
  if (r->op == GS__OP_BROADCAST && (r->root_rank < 0 || r->root_rank >= e->world)) {
    snprintf(err, errlen,
             "tensor '%s': rank %d asked to broadcast from root rank %d, but the job has ranks "
             "0..%d; pass a valid root",
             r->name, rank, r->root_rank, e->world - 1);
    return GS__ERR_INVALID_ARG;
  }
  if ((r->op == GS__OP_ALLGATHER || r->op == GS__OP_ALLTOALL) && r->ndim == 0) {
    snprintf(err, errlen,
             "tensor '%s': rank %d submitted a scalar to %s; it needs at least one dimension "
             "(reshape it to [1])",
             r->name, rank, gs__op_type_name(r->op));
    return GS__ERR_INVALID_ARG;
  }
  return GS__OK;
}

static void rank_error(gs__outbox *box, int32_t rank, const char *name, int status,
                       const char *text) {
  gs__out *o = out_push(box, GS__OUT_TO_RANK);
  if (!o) return;
  o->rank = rank;
  o->msg.kind = GS__MSG_RANK_ERROR;
  o->msg.status = status;
  snprintf(o->msg.name, sizeof o->msg.name, "%s", name);
  o->msg.text = strdup(text);
}

static int mark_ready(gs__engine *e, entry *en) {
  if (en->queued) return GS__OK;
  if (e->nready == e->ready_cap) {
    size_t cap = e->ready_cap ? e->ready_cap * 2 : 16;
    entry **r = realloc(e->ready, cap * sizeof *r);
    if (!r) return GS__ERR_NO_MEMORY;
    e->ready = r;
    e->ready_cap = cap;
  }
  e->ready[e->nready++] = en;
  en->queued = 1;
  e->ready_bytes += en->bytes;
  return GS__OK;
}

/* An entry has every request it will get: every rank submitted it, or the
 * ranks that did not have joined (gs_join: they contribute zeros). */
static int entry_complete(const gs__engine *e, const entry *en) {
  if (en->count == e->world) return 1;
  if (!e->njoined || en->queued || en->in_group) return 0;
  for (int32_t r = 0; r < e->world; r++)
    if (en->variant_of[r] < 0 && !e->ranks[r].joined) return 0;
  return 1;
}

static void group_release(gs__engine *e, group *g) {
  for (uint32_t i = 0; i < g->n; i++) {
    g->members[i]->in_group = 0;
    mark_ready(e, g->members[i]);
  }
  HASH_DEL(e->groups, g);
  free(g->members);
  free(g);
}

/* A complete entry goes to the ready queue, unless it belongs to a group
 * whose other members are not complete yet: a group is emitted whole. A
 * completed join ends the join round. */
static void on_complete(gs__engine *e, entry *en) {
  if (en->queued || en->in_group) return;
  const gs__tensor_request *r = &en->variants[0];
  if (r->op == GS__OP_JOIN && en->count == e->world) {
    for (int32_t q = 0; q < e->world; q++) e->ranks[q].joined = 0;
    e->njoined = 0;
  }
  if (r->group_size <= 1 || en->nvariants > 1) {
    mark_ready(e, en);
    return;
  }
  group *g = NULL;
  HASH_FIND(hh, e->groups, &r->group_id, sizeof r->group_id, g);
  if (!g) {
    g = calloc(1, sizeof *g);
    if (g) g->members = calloc(r->group_size, sizeof *g->members);
    if (!g || !g->members) {
      free(g);
      mark_ready(e, en); /* out of memory: emit it alone rather than lose it */
      return;
    }
    g->id = r->group_id;
    g->size = r->group_size;
    HASH_ADD(hh, e->groups, id, sizeof g->id, g);
  }
  en->in_group = 1;
  if (g->n < g->size) g->members[g->n++] = en;
  if (g->n == g->size) group_release(e, g);
}

/* ---- the response cache ------------------------------------------------------ */

/* Appends id to a growable list of ids to announce in the next plan. When
 * memory runs out the id is dropped: ranks then keep a stale entry that is
 * never used again. */
static void id_list_push(uint32_t **v, size_t *n, size_t *cap, uint32_t id) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    uint32_t *nv = realloc(*v, c * sizeof *nv);
    if (!nv) return;
    *v = nv;
    *cap = c;
  }
  (*v)[(*n)++] = id;
}

static void lru_unlink(cache_item **head, cache_item **tail, cache_item *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    *head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    *tail = c->prev;
  c->prev = c->next = NULL;
}

static void lru_push_front(cache_item **head, cache_item **tail, cache_item *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
  if (!*tail) *tail = c;
}

/* Moves a live item to the tombstones and announces its id as gone. */
static void cache_retire(gs__engine *e, cache_item *c) {
  HASH_DELETE(hh_name, e->cache_by_name, c);
  HASH_DELETE(hh_id, e->cache_by_id, c);
  lru_unlink(&e->lru_head, &e->lru_tail, c);
  e->ncache--;
  id_list_push(&e->evicted, &e->nevicted, &e->evicted_cap, c->id);
  HASH_ADD(hh_id, e->tomb_by_id, id, sizeof c->id, c);
  lru_push_front(&e->tomb_head, &e->tomb_tail, c);
  size_t keep = e->cfg.job.cache_capacity > 4096 ? e->cfg.job.cache_capacity : 4096;
  if (++e->ntomb > keep) {
    cache_item *old = e->tomb_tail;
    lru_unlink(&e->tomb_head, &e->tomb_tail, old);
    HASH_DELETE(hh_id, e->tomb_by_id, old);
    free(old);
    e->ntomb--;
  }
}

static void lru_unlink_t(gs__engine *e, plan_template *t) {
  if (t->prev)
    t->prev->next = t->next;
  else
    e->tmpl_head = t->next;
  if (t->next)
    t->next->prev = t->prev;
  else
    e->tmpl_tail = t->prev;
  t->prev = t->next = NULL;
}

static void lru_push_t(gs__engine *e, plan_template *t) {
  t->prev = NULL;
  t->next = e->tmpl_head;
  if (e->tmpl_head) e->tmpl_head->prev = t;
  e->tmpl_head = t;
  if (!e->tmpl_tail) e->tmpl_tail = t;
}

static int cacheable(const gs__tensor_request *r) {
  /* allgather and alltoall first dimensions vary by rank and step */
  return r->op == GS__OP_ALLREDUCE || r->op == GS__OP_BROADCAST || r->op == GS__OP_REDUCESCATTER;
}

/* The cache id for a request just negotiated (0 when not cached). */
static uint32_t cache_assign(gs__engine *e, const gs__tensor_request *r) {
  if (!e->cfg.job.cache_capacity || !cacheable(r)) return 0;
  cache_item *c = NULL;
  HASH_FIND(hh_name, e->cache_by_name, r->name, strlen(r->name), c);
  if (c && gs__tensor_request_equal(&c->req, r)) {
    lru_unlink(&e->lru_head, &e->lru_tail, c);
    lru_push_front(&e->lru_head, &e->lru_tail, c);
    c->last_seq = e->next_plan_seq - 1;
    return c->id;
  }
  if (c) cache_retire(e, c);
  if (e->ncache >= e->cfg.job.cache_capacity) {
    /* Evicting what the last plans used means the cache is smaller than a
     * step's tensors: it will miss every time. */
    if (e->lru_tail->last_seq + 2 >= e->next_plan_seq && !e->cache_thrash_warned) {
      e->cache_thrash_warned = 1;
      e->thrash_pending = 1;
    }
    cache_retire(e, e->lru_tail);
  }
  c = calloc(1, sizeof *c);
  if (!c) return 0;
  c->id = e->next_cache_id++;
  if (!e->next_cache_id) e->next_cache_id = 1; /* 0 means "none" */
  c->last_seq = e->next_plan_seq - 1;
  c->req = *r;
  HASH_ADD(hh_name, e->cache_by_name, req.name, strlen(c->req.name), c);
  HASH_ADD(hh_id, e->cache_by_id, id, sizeof c->id, c);
  lru_push_front(&e->lru_head, &e->lru_tail, c);
  e->ncache++;
  return c->id;
}

/* A full request for a cached name with other parameters makes the cached
 * entry stale. */
static void cache_check_full(gs__engine *e, const gs__tensor_request *r) {
  cache_item *c = NULL;
  HASH_FIND(hh_name, e->cache_by_name, r->name, strlen(r->name), c);
  if (c && !gs__tensor_request_equal(&c->req, r)) cache_retire(e, c);
}

static const gs__tensor_request *cache_lookup(const gs__engine *e, uint32_t id) {
  cache_item *c = NULL;
  HASH_FIND(hh_id, e->cache_by_id, &id, sizeof id, c);
  if (!c) HASH_FIND(hh_id, e->tomb_by_id, &id, sizeof id, c);
  return c ? &c->req : NULL;
}

/* ---- local (model-parallel) names ------------------------------------------- */

/* "tensor 'w': registered local ... on ranks [..] but submitted ... by
 * ranks [..]": the ranks that registered it and the submitters. */
static void local_conflict_text(const gs__engine *e, const local_name *ln, const int32_t *subs,
                                size_t nsubs, gs__op_type op, char *buf, size_t cap) {
  int32_t *locs = malloc((size_t)e->world * sizeof *locs);
  size_t nl = 0;
  char ls[1024] = "[]", ss[1024];
  if (locs) {
    for (int32_t r = 0; r < e->world; r++)
      if (ln->ranks[r]) locs[nl++] = r;
    format_ranks(locs, nl, ls, sizeof ls);
    free(locs);
  }
  format_ranks(subs, nsubs, ss, sizeof ss);
  snprintf(buf, cap,
           "tensor '%s': registered local (gs_register_local) on ranks %s but submitted for %s by "
           "ranks %s; a model-parallel tensor must be registered local on every rank that holds "
           "it and never submitted, or submitted by every rank",
           ln->name, ls, gs__op_type_name(op), ss);
}

static local_name *find_local(const gs__engine *e, const char *name) {
  local_name *ln = NULL;
  HASH_FIND_STR(e->locals, name, ln);
  return ln && ln->n > 0 ? ln : NULL;
}

/* A rank registered name local: ranks that already submitted it for a
 * collective fail at once (it could never complete). */
static void register_local(gs__engine *e, int32_t rank, const char *name, gs__outbox *box) {
  local_name *ln = NULL;
  HASH_FIND_STR(e->locals, name, ln);
  if (!ln) {
    ln = calloc(1, sizeof *ln);
    if (ln) {
      ln->ranks = calloc((size_t)e->world, 1);
      ln->subs = calloc((size_t)e->world, 1);
    }
    if (!ln || !ln->ranks || !ln->subs) {
      if (ln) {
        free(ln->ranks);
        free(ln->subs);
      }
      free(ln);
      out_log(box, GS__LOG_ERROR, "out of memory registering local tensor '%s'", name);
      return;
    }
    snprintf(ln->name, sizeof ln->name, "%s", name);
    HASH_ADD_STR(e->locals, name, ln);
  }
  if (!ln->ranks[rank]) {
    ln->ranks[rank] = 1;
    ln->n++;
  }
  entry *en = NULL;
  HASH_FIND_STR(e->table, name, en);
  if (!en || en->queued || en->in_group) return;
  int32_t *subs = calloc((size_t)e->world, sizeof *subs);
  size_t n = 0;
  for (int32_t q = 0; subs && q < e->world; q++)
    if (en->variant_of[q] >= 0) {
      ln->subs[q] = 1;
      subs[n++] = q;
    }
  char text[GS__MAX_TEXT];
  local_conflict_text(e, ln, subs, n, en->variants[0].op, text, sizeof text);
  for (size_t i = 0; i < n; i++) rank_error(box, subs[i], name, GS__ERR_MISMATCH, text);
  out_log(box, GS__LOG_WARN, "%s", text);
  free(subs);
  HASH_DEL(e->table, en);
  entry_free(en);
}

static void unregister_local(gs__engine *e, int32_t rank, const char *name) {
  local_name *ln = NULL;
  HASH_FIND_STR(e->locals, name, ln);
  if (ln && ln->ranks[rank]) {
    ln->ranks[rank] = 0;
    ln->n--;
  }
}

static void add_request(gs__engine *e, int32_t rank, const gs__tensor_request *r, uint64_t now_ms,
                        gs__outbox *box) {
  char err[GS__MAX_TEXT];
  int rc = check_request(e, rank, r, err, sizeof err);
  if (rc) {
    rank_error(box, rank, r->name, rc, err);
    return;
  }
  local_name *ln = find_local(e, r->name);
  if (ln) {
    /* Every rank that submitted it so far is named. */
    int32_t *subs = calloc((size_t)e->world, sizeof *subs);
    size_t n = 0;
    ln->subs[rank] = 1;
    for (int32_t q = 0; subs && q < e->world; q++)
      if (ln->subs[q]) subs[n++] = q;
    local_conflict_text(e, ln, subs, n, r->op, err, sizeof err);
    rank_error(box, rank, r->name, GS__ERR_MISMATCH, err);
    free(subs);
    return;
  }
  entry *en = NULL;
  HASH_FIND_STR(e->table, r->name, en);
  if (!en) {
    en = calloc(1, sizeof *en);
    if (en) {
      en->variants = malloc(sizeof *en->variants);
      en->variant_of = malloc((size_t)e->world * sizeof *en->variant_of);
      en->first_dims = calloc((size_t)e->world, sizeof *en->first_dims);
    }
    if (!en || !en->variants || !en->variant_of || !en->first_dims) {
      entry_free(en);
      rank_error(box, rank, r->name, GS__ERR_NO_MEMORY, "coordinator out of memory");
      return;
    }
    memcpy(en->name, r->name, sizeof en->name);
    for (int32_t q = 0; q < e->world; q++) en->variant_of[q] = -1;
    en->variants[0] = *r;
    en->nvariants = 1;
    en->first_ms = now_ms;
    en->order = e->next_order++;
    en->bytes = gs__tensor_bytes(r->dtype, r->shape, r->ndim);
    HASH_ADD_STR(e->table, name, en);
  } else if (en->variant_of[rank] >= 0) {
    snprintf(err, sizeof err,
             "tensor '%s': rank %d submitted it again while its earlier %s is still in flight; "
             "wait for the first op to complete before reusing the name",
             r->name, rank, gs__op_type_name(en->variants[en->variant_of[rank]].op));
    rank_error(box, rank, r->name, GS__ERR_DUPLICATE_NAME, err);
    return;
  }
  int32_t v = 0;
  while (v < en->nvariants && !request_equal(&en->variants[v], r)) v++;
  if (v == en->nvariants) {
    gs__tensor_request *vs = realloc(en->variants, (size_t)(v + 1) * sizeof *vs);
    if (!vs) {
      rank_error(box, rank, r->name, GS__ERR_NO_MEMORY, "coordinator out of memory");
      return;
    }
    en->variants = vs;
    en->variants[v] = *r;
    en->nvariants++;
  }
  en->variant_of[rank] = v;
  en->first_dims[rank] = r->ndim > 0 ? r->shape[0] : 0;
  en->count++;
  if (r->op == GS__OP_JOIN && !e->ranks[rank].joined) {
    e->ranks[rank].joined = 1;
    e->njoined++;
    e->last_joined = rank;
    /* Entries waiting only for joined ranks are complete now. */
    entry *c, *tmp;
    HASH_ITER(hh, e->table, c, tmp) {
      if (c != en && entry_complete(e, c)) on_complete(e, c);
    }
  }
  if (entry_complete(e, en) || (e->left_rank >= 0 && en->count == 1)) on_complete(e, en);
}

/* Once a rank has left, no entry can ever become complete: every pending
 * one is failed (same plan position on every rank). */
static char *left_message(const gs__engine *e, const entry *en) {
  char *msg = malloc(GS__MAX_TEXT);
  if (!msg) return NULL;
  int32_t r = e->left_rank;
  snprintf(msg, GS__MAX_TEXT,
           "tensor '%s': rank %d (%s, pid %d) has already left the job (gs_shutdown), so this "
           "collective can never complete; every rank must submit the same tensors before "
           "shutting down",
           en->name, r, rank_host(e, r), e->ranks[r].pid);
  return msg;
}

/* Turns one ready entry into a response (collective or error). */
static int entry_response(const gs__engine *e, const entry *en, gs__response *resp) {
  const gs__tensor_request *r = &en->variants[0];
  memset(resp, 0, sizeof *resp);
  resp->op = r->op;
  resp->dtype = r->dtype;
  resp->reduce_op = r->reduce_op;
  resp->prescale = r->prescale;
  resp->postscale = r->postscale;
  resp->root_rank = r->root_rank;
  resp->device = r->device;
  resp->tensors = calloc(1, sizeof *resp->tensors);
  if (!resp->tensors) return GS__ERR_NO_MEMORY;
  resp->ntensors = 1;
  gs__plan_tensor *t = &resp->tensors[0];
  memcpy(t->name, en->name, sizeof t->name);
  t->ndim = r->ndim;
  memcpy(t->shape, r->shape, sizeof t->shape);
  if (e->left_rank >= 0) {
    /* The rank that left runs no more plans: nothing emitted from now on
     * can complete. */
    resp->kind = GS__RESP_ERROR;
    resp->error_status = GS__ERR_SHUTDOWN;
    resp->error_message = left_message(e, en);
    return resp->error_message ? GS__OK : GS__ERR_NO_MEMORY;
  }
  if (en->count < e->world && r->op != GS__OP_ALLREDUCE && r->op != GS__OP_BARRIER &&
      en->nvariants == 1) {
    /* Only allreduce can do without the joined ranks (they add zeros). */
    resp->kind = GS__RESP_ERROR;
    resp->error_status = GS__ERR_INVALID_ARG;
    resp->error_message = malloc(GS__MAX_TEXT);
    if (!resp->error_message) return GS__ERR_NO_MEMORY;
    int32_t j = 0;
    while (j < e->world && en->variant_of[j] >= 0) j++;
    snprintf(resp->error_message, GS__MAX_TEXT,
             "tensor '%s': %s while rank %d (%s:%d) has joined (gs_join, out of data): only "
             "allreduce can run with joined ranks; stop submitting %ss before any rank joins",
             en->name, gs__op_type_name(r->op), j, rank_host(e, j), e->ranks[j].pid,
             gs__op_type_name(r->op));
    return GS__OK;
  }
  if (en->nvariants > 1) {
    resp->kind = GS__RESP_ERROR;
    resp->error_status = GS__ERR_MISMATCH;
    resp->error_message = mismatch_message(e, en);
    return resp->error_message ? GS__OK : GS__ERR_NO_MEMORY;
  }
  resp->kind = GS__RESP_COLLECTIVE;
  if (r->op == GS__OP_JOIN) resp->root_rank = e->last_joined; /* the last rank to join */
  if (r->op == GS__OP_ALLGATHER || r->op == GS__OP_ALLTOALL) {
    t->rank_dims = malloc((size_t)e->world * sizeof *t->rank_dims);
    if (!t->rank_dims) return GS__ERR_NO_MEMORY;
    memcpy(t->rank_dims, en->first_dims, (size_t)e->world * sizeof *t->rank_dims);
    t->nrank_dims = (size_t)e->world;
  }
  return GS__OK;
}

static int entry_is_error(const gs__engine *e, const entry *en) {
  return e->left_rank >= 0 || en->nvariants > 1 ||
         (en->count < e->world && en->variants[0].op != GS__OP_ALLREDUCE);
}

/* Whether c may join a fused response that starts with first. */
static int fusable(const gs__engine *e, const entry *first, const entry *c) {
  const gs__tensor_request *a = &first->variants[0], *b = &c->variants[0];
  if (entry_is_error(e, c) || a->op != b->op || a->dtype != b->dtype || a->device != b->device)
    return 0;
  if (a->op == GS__OP_ALLGATHER) return 1; /* allgathers fuse with allgathers */
  return a->op == GS__OP_ALLREDUCE && a->reduce_op == b->reduce_op && a->prescale == b->prescale &&
         a->postscale == b->postscale;
}

/* Bytes an entry adds to a fused buffer: its own for an allreduce, what
 * every rank contributes for an allgather. */
static uint64_t fused_bytes(const gs__engine *e, const entry *en) {
  const gs__tensor_request *r = &en->variants[0];
  if (r->op != GS__OP_ALLGATHER) return en->bytes;
  uint64_t row = r->ndim > 1 ? gs__tensor_bytes(r->dtype, r->shape + 1, r->ndim - 1)
                             : gs__dtype_size(r->dtype);
  uint64_t rows = 0;
  for (int32_t q = 0; q < e->world; q++) rows += (uint64_t)en->first_dims[q];
  return rows * row;
}

static int append_tensor(const gs__engine *e, gs__response *resp, const entry *en) {
  gs__plan_tensor *t = realloc(resp->tensors, (resp->ntensors + 1) * sizeof *t);
  if (!t) return GS__ERR_NO_MEMORY;
  resp->tensors = t;
  t = &resp->tensors[resp->ntensors];
  memset(t, 0, sizeof *t);
  memcpy(t->name, en->name, sizeof t->name);
  t->ndim = en->variants[0].ndim;
  memcpy(t->shape, en->variants[0].shape, sizeof t->shape);
  if (en->variants[0].op == GS__OP_ALLGATHER) {
    t->rank_dims = malloc((size_t)e->world * sizeof *t->rank_dims);
    if (!t->rank_dims) return GS__ERR_NO_MEMORY;
    memcpy(t->rank_dims, en->first_dims, (size_t)e->world * sizeof *t->rank_dims);
    t->nrank_dims = (size_t)e->world;
  }
  resp->ntensors++;
  return GS__OK;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

/* A hash of what makes two plans' responses equal (see
 * gs__plan_responses_equal, which decides). */
static uint64_t plan_hash(const gs__plan *p) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < p->nresponses; i++) {
    const gs__response *r = &p->responses[i];
    int f[6] = {(int)r->kind,      (int)r->op,   (int)r->dtype,
                (int)r->reduce_op, r->root_rank, (int)r->device};
    h = fnv(h, f, sizeof f);
    for (size_t k = 0; k < r->ntensors; k++) {
      const gs__plan_tensor *t = &r->tensors[k];
      h = fnv(h, t->name, strlen(t->name) + 1);
      h = fnv(h, t->shape, (size_t)t->ndim * sizeof *t->shape);
      h = fnv(h, &t->cache_id, sizeof t->cache_id);
      if (t->nrank_dims) h = fnv(h, t->rank_dims, t->nrank_dims * sizeof *t->rank_dims);
    }
  }
  return h;
}

static void template_retire(gs__engine *e, plan_template *t) {
  HASH_DEL(e->templates, t);
  lru_unlink_t(e, t);
  e->ntemplates--;
  /* Without room to announce it the ranks keep a stale template they are
   * never sent again: harmless. */
  id_list_push(&e->forget, &e->nforget, &e->forget_cap, t->id);
  gs__plan_free(&t->plan);
  free(t);
}

/* Sends plan as a replay of a template when its responses repeat one, or
 * defines a new template from it. Only plans without errors. */
static void template_apply(gs__engine *e, gs__plan *plan) {
  if (!e->cfg.job.cache_capacity || !plan->nresponses) return;
  /* Only plans of cached tensors repeat (barriers, allgathers and errors
   * change from plan to plan). */
  for (size_t i = 0; i < plan->nresponses; i++) {
    const gs__response *r = &plan->responses[i];
    if (r->kind != GS__RESP_COLLECTIVE) return;
    for (size_t k = 0; k < r->ntensors; k++)
      if (!r->tensors[k].cache_id) return;
  }
  uint64_t h = plan_hash(plan);
  plan_template *t = NULL;
  HASH_FIND(hh, e->templates, &h, sizeof h, t);
  if (t && gs__plan_responses_equal(&t->plan, plan)) {
    lru_unlink_t(e, t);
    lru_push_t(e, t);
    for (size_t i = 0; i < plan->nresponses; i++) gs__response_free(&plan->responses[i]);
    free(plan->responses);
    plan->responses = NULL;
    plan->nresponses = 0;
    plan->replay_of = t->id;
    e->plans_replayed++;
    return;
  }
  if (t) template_retire(e, t);
  if (e->ntemplates >= PLAN_TEMPLATES) template_retire(e, e->tmpl_tail);
  t = calloc(1, sizeof *t);
  if (!t || gs__plan_copy_responses(plan, &t->plan) != 0) {
    free(t);
    return; /* out of memory: send it in full, no template */
  }
  t->id = e->next_template_id++;
  if (!e->next_template_id) e->next_template_id = 1;
  t->hash = h;
  HASH_ADD(hh, e->templates, hash, sizeof t->hash, t);
  lru_push_t(e, t);
  e->ntemplates++;
  plan->template_id = t->id;
}

/* Emits one plan with every queued entry, in readiness order, fusing
 * compatible allreduces (and allgathers with allgathers) greedily up to the
 * fusion threshold. An entry that
 * cannot join the current response is skipped over (look-ahead) while the
 * skipped bytes stay within the threshold; it then starts a later response.
 * Errors, broadcasts, barriers and the rest are never fused. */
static void emit_ready(gs__engine *e, gs__outbox *box) {
  if (!e->nready) return;
  gs__out *o = out_push(box, GS__OUT_TO_ALL);
  gs__response *resps = calloc(e->nready, sizeof *resps);
  char *taken = calloc(e->nready, 1);
  if (!o || !resps || !taken) {
    free(resps);
    free(taken);
    if (o) box->n--;
    out_log(box, GS__LOG_ERROR, "out of memory building a plan of %zu tensors", e->nready);
    return;
  }
  uint64_t threshold = e->cfg.job.fusion_threshold_bytes;
  o->msg.kind = GS__MSG_PLAN;
  o->msg.plan.seq = e->next_plan_seq++;
  o->msg.plan.responses = resps;
  for (size_t i = 0; i < e->nready; i++) {
    if (taken[i]) continue;
    taken[i] = 1;
    entry *en = e->ready[i];
    gs__response *rp = &resps[o->msg.plan.nresponses];
    if (entry_response(e, en, rp) != GS__OK) {
      gs__response_free(rp);
      continue;
    }
    o->msg.plan.nresponses++;
    if (rp->kind == GS__RESP_ERROR) {
      out_log(box, GS__LOG_WARN, "%s", rp->error_message);
      continue;
    }
    e->tensors_planned++;
    if (!threshold || (rp->op != GS__OP_ALLREDUCE && rp->op != GS__OP_ALLGATHER)) continue;
    size_t align = gs__fusion_align(rp->device);
    uint64_t end = fused_bytes(e, en), skipped = 0;
    for (size_t j = i + 1; j < e->nready; j++) {
      if (taken[j]) continue;
      entry *c = e->ready[j];
      uint64_t cb = fused_bytes(e, c), c_end = gs__align_up(end, align) + cb;
      if (fusable(e, en, c) && c_end <= threshold && append_tensor(e, rp, c) == GS__OK) {
        taken[j] = 1;
        end = c_end;
        e->tensors_planned++;
        continue;
      }
      skipped += cb;
      if (skipped > threshold) break;
    }
  }
  for (size_t i = 0; i < o->msg.plan.nresponses; i++) {
    gs__response *rp = &resps[i];
    if (rp->kind != GS__RESP_COLLECTIVE) continue;
    for (size_t k = 0; k < rp->ntensors; k++) {
      entry *en = NULL;
      HASH_FIND_STR(e->table, rp->tensors[k].name, en);
      if (en) rp->tensors[k].cache_id = cache_assign(e, &en->variants[0]);
    }
  }
  recent_plan *rp_rec = &e->recent[o->msg.plan.seq % RECENT_PLANS];
  rp_rec->seq = o->msg.plan.seq;
  rp_rec->names[0] = 0;
  for (size_t i = 0; i < o->msg.plan.nresponses; i++)
    for (size_t k = 0; k < resps[i].ntensors; k++)
      append(rp_rec->names, sizeof rp_rec->names, "%s%s", rp_rec->names[0] ? ", " : "",
             resps[i].tensors[k].name);
  if (e->thrash_pending) {
    e->thrash_pending = 0;
    out_log(box, GS__LOG_WARN,
            "the response cache (--cache-capacity %u) is smaller than the tensors of one step: "
            "it evicts entries the last plans used and will keep missing; raise "
            "--cache-capacity above the number of tensors per step",
            e->cfg.job.cache_capacity);
  }
  if (e->nevicted) {
    o->msg.plan.evicted = e->evicted;
    o->msg.plan.nevicted = e->nevicted;
    e->evicted = NULL;
    e->nevicted = e->evicted_cap = 0;
  }
  template_apply(e, &o->msg.plan);
  if (e->nforget) {
    o->msg.plan.forget_templates = e->forget;
    o->msg.plan.nforget = e->nforget;
    e->forget = NULL;
    e->nforget = e->forget_cap = 0;
  }
  for (size_t i = 0; i < e->nready; i++) {
    HASH_DEL(e->table, e->ready[i]);
    entry_free(e->ready[i]);
  }
  free(taken);
  e->nready = 0;
  e->ready_bytes = 0;
}

/* Plans emitted that some live rank has not finished yet. */
static uint64_t plans_unfinished(const gs__engine *e) {
  uint64_t emitted = e->next_plan_seq - 1, min_done = emitted;
  for (int32_t r = 0; r < e->world; r++)
    if (e->ranks[r].state == RANK_CONNECTED && e->ranks[r].last_done_seq < min_done)
      min_done = e->ranks[r].last_done_seq;
  return emitted - min_done;
}

/* The emission policy. adaptive: emit at once while fewer than
 * max_plans_in_flight plans are unfinished, otherwise let ready entries
 * accumulate (and fuse) until a plan finishes or they fill the fusion
 * threshold; no timer on the critical path. window: emit every cycle time
 * from tick. Errors and departures (force) go out at once. */
static void maybe_emit(gs__engine *e, gs__outbox *box, int force) {
  if (!e->nready) return;
  if (!force) {
    if (e->cfg.policy == GS__POLICY_WINDOW) return;
    uint64_t threshold = e->cfg.job.fusion_threshold_bytes;
    int room = plans_unfinished(e) <
               (uint64_t)(e->cfg.max_plans_in_flight > 0 ? e->cfg.max_plans_in_flight : 1);
    if (!room && threshold && e->ready_bytes < threshold) return;
  }
  emit_ready(e, box);
}

static void set_blocked(gs__engine *e, rank_slot *s, const gs__rank_msg *msg, uint64_t now_ms) {
  free(s->blocked);
  s->blocked = NULL;
  s->nblocked = 0;
  if (msg->nblocked) {
    s->blocked = malloc(msg->nblocked * sizeof *s->blocked);
    if (s->blocked) {
      memcpy(s->blocked, msg->blocked_on, msg->nblocked * sizeof *s->blocked);
      s->nblocked = msg->nblocked;
    }
  }
  e->last_activity_ms = now_ms;
  e->deadlock_reported = 0;
}

void gs__engine_rank_message(gs__engine *e, int32_t rank, const gs__rank_msg *msg, uint64_t now_ms,
                             gs__outbox *box) {
  if (rank < 0 || rank >= e->world || e->ranks[rank].state != RANK_CONNECTED) return;
  rank_slot *s = &e->ranks[rank];
  s->last_msg_ms = now_ms;
  if (e->aborted) return;
  if (msg->nrequests && !e->world_ready) {
    for (size_t i = 0; i < msg->nrequests; i++)
      rank_error(box, rank, msg->requests[i].name, GS__ERR_INVALID_ARG,
                 "request sent before every rank joined (wait for gs_init to return)");
    return;
  }
  if (msg->nrequests) {
    e->last_activity_ms = now_ms;
    e->deadlock_reported = 0;
  }
  if (msg->ncached) {
    e->last_activity_ms = now_ms;
    e->deadlock_reported = 0;
  }
  for (size_t i = 0; i < msg->nreg; i++) register_local(e, rank, msg->reg[i], box);
  for (size_t i = 0; i < msg->nunreg; i++) unregister_local(e, rank, msg->unreg[i]);
  /* A leave goes first: whatever arrives with it can no longer complete. */
  if (msg->has_leave) {
    s->state = RANK_LEFT;
    e->nconnected--;
    if (e->left_rank < 0) e->left_rank = rank;
    out_log(box, GS__LOG_INFO, "rank %d (%s:%d) left the job%s%s", rank, rank_host(e, rank), s->pid,
            msg->leave_reason[0] ? ": " : "", msg->leave_reason);
  }
  if (e->left_rank >= 0) {
    entry *en, *tmp;
    HASH_ITER(hh, e->table, en, tmp) mark_ready(e, en);
  }
  for (size_t i = 0; i < msg->nrequests; i++) {
    cache_check_full(e, &msg->requests[i]);
    add_request(e, rank, &msg->requests[i], now_ms, box);
  }
  e->full_requests += msg->nrequests;
  for (size_t i = 0; i < msg->ncached; i++) {
    const gs__tensor_request *r = cache_lookup(e, msg->cached[i]);
    if (!r) {
      out_log(box, GS__LOG_ERROR,
              "rank %d sent cache id %u, which this coordinator never assigned or forgot; its op "
              "cannot be matched (a gradsync bug: report it with this log)",
              rank, msg->cached[i]);
      continue;
    }
    e->cache_hits++;
    add_request(e, rank, r, now_ms, box);
  }
  for (size_t i = 0; i < msg->ndone; i++)
    if (msg->done_plans[i] > s->last_done_seq) s->last_done_seq = msg->done_plans[i];
  maybe_emit(e, box, e->left_rank >= 0); /* after a departure, errors go out at once */
  if (msg->blocked_update) set_blocked(e, s, msg, now_ms);
}

/* "[a, b, c]" of the names pending (at most 20), oldest first. */
static void pending_names(const gs__engine *e, char *buf, size_t cap) {
  buf[0] = 0;
  append(buf, cap, "[");
  size_t n = 0, total = HASH_COUNT(e->table);
  const entry *en;
  for (en = e->table; en && n < 20; en = en->hh.next, n++)
    append(buf, cap, "%s%s", n ? ", " : "", en->name);
  if (total > n) append(buf, cap, ", ... %zu more", total - n);
  append(buf, cap, "]");
}

static void abort_job(gs__engine *e, int status, const char *text, gs__outbox *box) {
  e->aborted = 1;
  out_log(box, GS__LOG_ERROR, "aborting the job: %s", text);
  gs__out *o = out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_ABORT;
  o->msg.status = status;
  o->msg.text = strdup(text);
}

/* Marks a connected rank lost and tells everyone (see session_closed). */
static void lose_rank(gs__engine *e, int32_t rank, const char *detail, gs__outbox *box) {
  rank_slot *s = &e->ranks[rank];
  s->state = RANK_LOST;
  e->nconnected--;
  if (e->aborted) return;
  if (!e->world_ready) {
    /* Still gathering: the slot is free again (a restarted process may take
     * it) and the rank is reported as gone, apart from the ranks that never
     * came, so the others' join timeout names both for what they are. */
    out_log(box, GS__LOG_WARN, "rank %d (%s:%d) disconnected before the job started: %s", rank,
            rank_host(e, rank), s->pid, detail && *detail ? detail : "session ended");
    s->state = RANK_GONE;
    gs__out *o = out_push(box, GS__OUT_TO_ALL);
    if (o && world_status(e, &o->msg) != GS__OK) box->n--;
    return;
  }
  char names[2048], running[1024] = "", text[GS__MAX_TEXT];
  pending_names(e, names, sizeof names);
  /* Plans emitted that the lost rank had not reported finished. */
  for (uint64_t seq = s->last_done_seq + 1; seq < e->next_plan_seq; seq++) {
    const recent_plan *rp = &e->recent[seq % RECENT_PLANS];
    if (rp->seq != seq || !rp->names[0]) continue;
    append(running, sizeof running, "%s%s", running[0] ? ", " : "", rp->names);
  }
  snprintf(text, sizeof text,
           "rank %d (%s, pid %d) was lost: %s. Tensors in flight: %s%s%s%s. The job cannot "
           "continue without it: look at rank %d's log for why it stopped, then restart the job",
           rank, rank_host(e, rank), s->pid, detail && *detail ? detail : "its session ended",
           names, running[0] ? "; scheduled but not finished by it: [" : "", running,
           running[0] ? "]" : "", rank);
  e->aborted = 1;
  out_log(box, GS__LOG_ERROR, "%s", text);
  gs__out *o = out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_ABORT;
  o->msg.status = GS__ERR_RANK_LOST;
  o->msg.text = strdup(text);
}

void gs__engine_session_closed(gs__engine *e, int32_t rank, const char *detail, uint64_t now_ms,
                               gs__outbox *box) {
  (void)now_ms;
  if (rank < 0 || rank >= e->world || e->ranks[rank].state != RANK_CONNECTED) return;
  lose_rank(e, rank, detail, box);
}

/* ---- periodic checks ------------------------------------------------------------ */

static void check_liveness(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  uint32_t timeout = e->cfg.job.rank_timeout_ms;
  if (!timeout || !e->world_ready) return;
  for (int32_t r = 0; r < e->world; r++) {
    rank_slot *s = &e->ranks[r];
    if (s->state != RANK_CONNECTED || now_ms - s->last_msg_ms <= timeout) continue;
    char detail[256];
    snprintf(detail, sizeof detail,
             "it was silent for %.1f s (no heartbeat within the rank timeout of %.1f s): the "
             "process is stopped or hung, or the network to its host is down",
             (double)(now_ms - s->last_msg_ms) / 1000.0, timeout / 1000.0);
    gs__out *o = out_push(box, GS__OUT_CLOSE_RANK);
    if (o) {
      o->rank = r;
      o->text = strdup(detail);
    }
    lose_rank(e, r, detail, box);
  }
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "[a, b, c, d, e, f, ...]": sorted, at most 6 names. */
static void format_names(const char **names, size_t n, char *buf, size_t cap) {
  qsort(names, n, sizeof *names, cmp_str);
  buf[0] = 0;
  append(buf, cap, "[");
  for (size_t i = 0; i < n && i < 6; i++) append(buf, cap, "%s%s", i ? ", " : "", names[i]);
  if (n > 6) append(buf, cap, ", ...");
  append(buf, cap, "]");
}

/* The stall report of every entry older than age_ms, grouped by missing
 * rank; NULL when nothing is that old. */
static char *stall_report(const gs__engine *e, uint64_t now_ms, uint64_t age_ms) {
  size_t total = HASH_COUNT(e->table), nold = 0;
  if (!total) return NULL;
  const entry **old = malloc(total * sizeof *old);
  const char **names = malloc(total * sizeof *names);
  char *text = malloc(GS__MAX_TEXT * 4);
  if (!old || !names || !text) goto out_free;
  for (const entry *en = e->table; en; en = en->hh.next)
    if (now_ms - en->first_ms >= age_ms && !en->queued && !en->in_group) old[nold++] = en;
  if (!nold) goto out_free;
  text[0] = 0;
  append(text, GS__MAX_TEXT * 4,
         "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
         "ranks and are waiting for remainder of ranks for more than %llu seconds. Every rank "
         "must submit every tensor; the ranks below have not.\nMissing ranks:",
         (unsigned long long)(age_ms / 1000u));
  for (int32_t r = 0; r < e->world; r++) {
    size_t n = 0;
    for (size_t i = 0; i < nold; i++)
      if (old[i]->variant_of[r] < 0) names[n++] = old[i]->name;
    if (!n) continue;
    char list[2048];
    format_names(names, n, list, sizeof list);
    append(text, GS__MAX_TEXT * 4, "\n%d (%s:%d): %s", r, rank_host(e, r), e->ranks[r].pid, list);
  }
  free(old);
  free(names);
  return text;
out_free:
  free(old);
  free(names);
  free(text);
  return NULL;
}

static void check_stalls(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  uint64_t warn_ms = (uint64_t)e->cfg.job.stall_warning_s * 1000u;
  uint64_t shut_ms = (uint64_t)e->cfg.job.stall_shutdown_s * 1000u;
  if (!e->world_ready || e->aborted) return;
  /* The table keeps arrival order, so its head is the oldest entry: a cheap
   * test before building any report on every tick. */
  uint64_t oldest = e->table ? now_ms - e->table->first_ms : 0;
  if (shut_ms && oldest >= shut_ms) {
    char *report = stall_report(e, now_ms, shut_ms);
    if (report) {
      char *text = malloc(strlen(report) + 256);
      if (text) {
        sprintf(text, "%s\nStall shutdown time of %llu s exceeded (--stall-shutdown-s): aborting",
                report, (unsigned long long)(shut_ms / 1000u));
        free(e->last_stall);
        e->last_stall = report;
        e->stall_reports++;
        abort_job(e, GS__ERR_STALL, text, box);
        free(text);
        return;
      }
      free(report);
    }
  }
  if (!warn_ms || now_ms < e->next_stall_check_ms) return;
  e->next_stall_check_ms = now_ms + warn_ms;
  if (oldest < warn_ms) return;
  char *report = stall_report(e, now_ms, warn_ms);
  if (!report) return;
  out_log(box, GS__LOG_WARN, "%s", report);
  free(e->last_stall);
  e->last_stall = report;
  e->stall_reports++;
}

/* Ranks that have not submitted en, as "rank 1" or "ranks [1,2]". */
static void missing_ranks(const gs__engine *e, const entry *en, char *buf, size_t cap) {
  int32_t *ranks = malloc((size_t)e->world * sizeof *ranks);
  size_t n = 0;
  if (!ranks) {
    snprintf(buf, cap, "some ranks");
    return;
  }
  for (int32_t r = 0; r < e->world; r++)
    if (en->variant_of[r] < 0) ranks[n++] = r;
  if (n == 1) {
    snprintf(buf, cap, "rank %d", ranks[0]);
  } else {
    char list[1024];
    format_ranks(ranks, n, list, sizeof list);
    snprintf(buf, cap, "ranks %s", list);
  }
  free(ranks);
}

static void check_deadlock(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  uint32_t quiet = e->cfg.job.deadlock_time_ms;
  if (!quiet || !e->world_ready || e->aborted || e->deadlock_reported || e->nready) return;
  if (now_ms - e->last_activity_ms < quiet) return;
  int32_t live = 0;
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (s->state != RANK_CONNECTED) continue;
    if (!s->nblocked) return; /* a rank still computing: no deadlock */
    live++;
  }
  if (!live) return;
  size_t cap = GS__MAX_TEXT * 4;
  char *text = malloc(cap);
  if (!text) return;
  snprintf(text, cap,
           "deadlock: every rank is blocked waiting for tensors that other ranks have not "
           "submitted, and no rank submitted anything for %.1f s: ",
           (double)(now_ms - e->last_activity_ms) / 1000.0);
  int32_t shown = 0;
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (s->state != RANK_CONNECTED) continue;
    if (shown == 32) {
      append(text, cap, "; ... (%d more ranks)", live - shown);
      break;
    }
    append(text, cap, "%srank %d (%s:%d) waits on ", shown ? "; " : "", r, rank_host(e, r), s->pid);
    for (size_t i = 0; i < s->nblocked && i < 6; i++) {
      entry *en = NULL;
      char why[1100];
      HASH_FIND_STR(e->table, s->blocked[i], en);
      if (en) missing_ranks(e, en, why, sizeof why);
      append(text, cap, "%s[%s] (%s%s)", i ? ", " : "", s->blocked[i],
             en ? "missing from " : "not pending at the coordinator", en ? why : "");
    }
    if (s->nblocked > 6) append(text, cap, ", ... %zu more", s->nblocked - 6);
    shown++;
  }
  append(text, cap,
         ". The ranks submit different tensor names (look for rank-dependent code paths or "
         "names); make every rank submit the same tensors, then restart the job");
  e->deadlock_reported = 1;
  e->deadlocks++;
  free(e->last_deadlock);
  e->last_deadlock = strdup(text);
  if (e->cfg.deadlock_warn_only)
    out_log(box, GS__LOG_WARN, "%s", text);
  else
    abort_job(e, GS__ERR_DEADLOCK, text, box);
  free(text);
}

void gs__engine_tick(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  if (e->cfg.policy == GS__POLICY_WINDOW && now_ms >= e->next_window_ms) {
    uint64_t cycle = e->cfg.job.cycle_time_us / 1000u;
    e->next_window_ms = now_ms + (cycle ? cycle : 1);
    maybe_emit(e, box, 1);
  }
  check_liveness(e, now_ms, box);
  check_stalls(e, now_ms, box);
  check_deadlock(e, now_ms, box);
}

const char *gs__engine_last_stall(const gs__engine *e) {
  return e->last_stall ? e->last_stall : "";
}

const char *gs__engine_last_deadlock(const gs__engine *e) {
  return e->last_deadlock ? e->last_deadlock : "";
}

void gs__engine_get_stats(const gs__engine *e, gs__engine_stats *out) {
  memset(out, 0, sizeof *out);
  out->world_size = e->world;
  for (int32_t r = 0; r < e->world; r++) {
    switch (e->ranks[r].state) {
    case RANK_JOINED:
      out->joined++;
      break;
    case RANK_CONNECTED:
      out->joined++;
      out->connected++;
      break;
    case RANK_LEFT:
      out->joined++;
      out->left++;
      break;
    case RANK_LOST:
      out->joined++;
      out->lost++;
      break;
    default:
      break;
    }
  }
  out->world_ready = e->world_ready;
  out->aborted = e->aborted;
  out->plans_emitted = e->next_plan_seq - 1;
  out->tensors_planned = e->tensors_planned;
  out->pending_tensors = HASH_COUNT(e->table);
  out->stall_reports = e->stall_reports;
  out->deadlocks = e->deadlocks;
  out->cache_hits = e->cache_hits;
  out->full_requests = e->full_requests;
  out->cache_entries = e->ncache;
  out->plans_replayed = e->plans_replayed;
  for (const local_name *ln = e->locals; ln; ln = ln->hh.next)
    if (ln->n > 0) out->local_names++;
}
