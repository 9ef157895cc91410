/* Engine table: the pending tensors keyed by name, validation of every
 * rank's request against the first one (one-line mismatch texts), groups
 * emitted whole, joined ranks, and names registered local. Owns e->table,
 * e->groups, e->locals and what enters e->ready. Engine thread only. */
#include "engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_layout.h"

void gs__eng_entry_free(entry *en) {
  if (!en) return;
  free(en->variants);
  free(en->variant_of);
  free(en->variant_seq);
  free(en->first_dims);
  free(en);
}

void gs__eng_entry_drop(gs__engine *e, entry *en) {
  HASH_DEL(e->table, en);
  for (int32_t r = 0; r < e->world; r++)
    if (en->variant_of[r] >= 0 && e->ranks[r].npending) e->ranks[r].npending--;
  gs__eng_entry_free(en);
}

uint32_t gs__eng_max_pending(const gs__engine *e) {
  return e->cfg.max_pending_per_rank ? e->cfg.max_pending_per_rank : GS__MAX_PENDING_DEFAULT;
}

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
  default:
    buf[0] = 0;
  }
}

/* ---- naming a group's tensors ------------------------------------------------ */

/* A group id is a hash of its members' names in call order, which tells a
 * user nothing: a mismatched group is described by its tensors instead,
 * those still in the table, in the order its ranks submitted them. Each
 * rank's requests arrive in its call order, and a member's stamp is the
 * earliest arrival among the ranks that sent it in that group (the
 * earliest variant carrying the group: variant_seq); for two members a
 * and b, every such rank sent a before b, so stamp(a) < stamp(b). */
typedef struct group_member {
  uint64_t seq;
  const entry *en;
} group_member;

typedef struct group_list {
  uint64_t key[2]; /* group id, group size */
  group_member *m;
  size_t n, cap;
  /* the common prefix with another list, computed once per pair */
  const struct group_list *prefix_of;
  size_t prefix;
  UT_hash_handle hh;
} group_list;

struct gs__eng_groups {
  group_list *lists;
};

void gs__eng_groups_free(gs__eng_groups *groups) {
  if (!groups) return;
  group_list *l, *tmp;
  HASH_ITER(hh, groups->lists, l, tmp) {
    HASH_DEL(groups->lists, l);
    free(l->m);
    free(l);
  }
  free(groups);
}

static int member_cmp(const void *a, const void *b) {
  uint64_t x = ((const group_member *)a)->seq, y = ((const group_member *)b)->seq;
  return x < y ? -1 : x > y;
}

/* Every group's members in the table, in call order; NULL when out of
 * memory. One pass over the table per emission that needs it. */
static gs__eng_groups *groups_build(const gs__engine *e) {
  gs__eng_groups *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  const entry *c, *tmp;
  HASH_ITER(hh, e->table, c, tmp) {
    for (int32_t v = 0; v < c->nvariants; v++) {
      const gs__tensor_request *r = &c->variants[v];
      if (r->group_size <= 1) continue;
      uint64_t key[2] = {r->group_id, r->group_size};
      group_list *l = NULL;
      HASH_FIND(hh, g->lists, key, sizeof key, l);
      if (!l) {
        l = calloc(1, sizeof *l);
        if (!l) goto oom;
        memcpy(l->key, key, sizeof key);
        HASH_ADD(hh, g->lists, key, sizeof l->key, l);
      }
      if (l->n && l->m[l->n - 1].en == c) continue; /* an earlier variant of c: earlier too */
      if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        group_member *m = realloc(l->m, cap * sizeof *m);
        if (!m) goto oom;
        l->m = m;
        l->cap = cap;
      }
      l->m[l->n].seq = c->variant_seq[v];
      l->m[l->n].en = c;
      l->n++;
    }
  }
  group_list *l, *ltmp;
  HASH_ITER(hh, g->lists, l, ltmp) qsort(l->m, l->n, sizeof *l->m, member_cmp);
  return g;
oom:
  gs__eng_groups_free(g);
  return NULL;
}

static group_list *group_find(gs__eng_groups *g, const gs__tensor_request *r) {
  if (!g || r->group_size <= 1) return NULL;
  uint64_t key[2] = {r->group_id, r->group_size};
  group_list *l = NULL;
  HASH_FIND(hh, g->lists, key, sizeof key, l);
  return l;
}

/* Members in the same places at the start of l and of other. */
static size_t group_prefix(group_list *l, const group_list *other) {
  if (l->prefix_of != other) {
    size_t n = 0;
    while (n < l->n && n < other->n && l->m[n].en == other->m[n].en) n++;
    l->prefix_of = other;
    l->prefix = n;
  }
  return l->prefix;
}

/* Names shown per group: enough to see a reordering or an extra tensor at
 * the place where the groups part, bounded whatever the group's size. */
#define GROUP_NAMES 4

/* "a group of 6 tensors: a, b, c, d and 2 more"; from > 0: "a group of
 * 600 tensors: the same first 496 tensors as the other ranks (x to y), then
 * a, b, c, d and 100 more". */
static void group_describe(const group_list *l, const gs__tensor_request *r, size_t from, char *buf,
                           size_t cap) {
  snprintf(buf, cap, "a group of %u tensors", r->group_size);
  if (!l || !l->n) return; /* out of memory while listing them */
  size_t total = l->n > r->group_size ? l->n : r->group_size, more = 0;
  if (from > l->n) from = l->n;
  if (from)
    gs__eng_append(buf, cap, ": the same first %zu tensors as the other ranks (%s to %s), then ",
                   from, l->m[0].en->name, l->m[from - 1].en->name);
  else
    gs__eng_append(buf, cap, ": ");
  char names[GS__MAX_TEXT / 4];
  names[0] = 0;
  size_t shown = 0;
  for (size_t i = from; i < l->n && shown < GROUP_NAMES; i++, shown++)
    gs__eng_append_name(names, sizeof names, l->m[i].en->name, &more);
  more += total - from - shown;
  if (!shown && !more) {
    gs__eng_append(buf, cap, "no more");
    return;
  }
  gs__eng_append_more(names, sizeof names, more);
  gs__eng_append(buf, cap, "%s", names);
}

/* What every rank must do about mismatched groups. */
static const char k_group_advice[] =
    "; every rank must submit the same tensors in the same order in one "
    "gs_grouped_allreduce_async call (grouped_allreduce in Python), or all submit it alone";

/* The one-line mismatch error of en: the first attribute on which the
 * variants differ, with the ranks that sent each value. Groups are named
 * by their tensors (group_describe), the rest by value. */
char *gs__eng_mismatch_message(const gs__engine *e, const entry *en, gs__eng_groups **groups) {
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
  /* Groups: the lists of their tensors, and how far they all agree. */
  size_t prefix = 0;
  if (at == ATTR_GROUP) {
    if (!*groups) *groups = groups_build(e);
    /* Compared with the group of the lowest rank that grouped it: the
     * same for every member, so each pair's prefix is computed once. */
    group_list *first = NULL;
    int ngrouped = 0;
    prefix = SIZE_MAX;
    for (int32_t r = 0; r < e->world; r++) {
      if (en->variant_of[r] < 0) continue;
      group_list *l = group_find(*groups, &en->variants[en->variant_of[r]]);
      if (!l || l == first) continue;
      if (!first) {
        first = l;
        ngrouped = 1;
        continue;
      }
      ngrouped = 2;
      size_t p = group_prefix(l, first);
      if (p < prefix) prefix = p;
    }
    /* Named from where they part, unless that is among the first names. */
    if (ngrouped < 2 || prefix < GROUP_NAMES) prefix = 0;
  }
  /* The group texts stop short of the advice, which always fits. */
  size_t body_cap = at == ATTR_GROUP ? GS__MAX_TEXT - sizeof k_group_advice + 1 : GS__MAX_TEXT;
  snprintf(msg, body_cap, "tensor '%s': mismatched %s: ", en->name,
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
    char rs[1024], val[GS__MAX_TEXT / 2];
    gs__eng_format_ranks(ranks, n, rs, sizeof rs);
    if (at == ATTR_GROUP) {
      if (ref->group_size > 1)
        group_describe(group_find(*groups, ref), ref, prefix, val, sizeof val);
      else
        snprintf(val, sizeof val, "alone (in no group)");
      gs__eng_append(msg, body_cap, "%sranks %s sent it %s%s", first_group ? "" : "; ", rs,
                     ref->group_size > 1 ? "in " : "", val);
    } else {
      attr_format(at < ATTR_COUNT ? at : ATTR_SHAPE, ref, val, sizeof val);
      gs__eng_append(msg, body_cap, "%sranks %s sent %s", first_group ? "" : ", ", rs, val);
    }
    first_group = 0;
  }
  if (at == ATTR_GROUP) gs__eng_append(msg, GS__MAX_TEXT, "%s", k_group_advice);
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
  uint32_t limit = gs__eng_max_pending(e);
  if (r->group_size > limit) {
    snprintf(err, errlen,
             "tensor '%s': rank %d submitted it in a group of %u tensors, more than the %u "
             "tensors a rank may have pending (gradsyncd --max-pending-per-rank %u); use "
             "smaller groups",
             r->name, rank, r->group_size, limit, limit);
    return GS__ERR_INVALID_ARG;
  }
  uint64_t bytes;
  if (gs__tensor_bytes_checked(r->dtype, r->shape, r->ndim, &bytes) != GS__OK) {
    char shape[256];
    gs__shape_format(r->shape, r->ndim, shape, sizeof shape);
    snprintf(err, errlen,
             "tensor '%s': rank %d submitted shape %s of %s, whose size in bytes overflows 64 "
             "bits; check the shape passed to gradsync",
             r->name, rank, shape, gs__dtype_name(r->dtype));
    return GS__ERR_INVALID_ARG;
  }
  return GS__OK;
}

void gs__eng_rank_error(gs__outbox *box, int32_t rank, const char *name, int status,
                        const char *text) {
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_RANK);
  if (!o) return;
  o->rank = rank;
  o->msg.kind = GS__MSG_RANK_ERROR;
  o->msg.status = status;
  snprintf(o->msg.name, sizeof o->msg.name, "%s", name);
  o->msg.text = strdup(text);
}

int gs__eng_mark_ready(gs__engine *e, entry *en) {
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
  e->ready_bytes = gs__add_sat(e->ready_bytes, en->bytes);
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
    gs__eng_mark_ready(e, g->members[i]);
  }
  HASH_DEL(e->groups, g);
  free(g->members);
  free(g);
}

/* A complete entry goes to the ready queue, unless it belongs to a group
 * whose other members are not complete yet: a group is emitted whole. A
 * completed join ends the join round. After a rank left nothing waits for a
 * group: every entry goes out (as an error) at once. */
static void on_complete(gs__engine *e, entry *en) {
  if (en->queued || en->in_group) return;
  const gs__tensor_request *r = &en->variants[0];
  if (r->op == GS__OP_JOIN && en->count == e->world) {
    for (int32_t q = 0; q < e->world; q++) e->ranks[q].joined = 0;
    e->njoined = 0;
  }
  if (r->group_size <= 1 || en->nvariants > 1 || e->left_rank >= 0) {
    gs__eng_mark_ready(e, en);
    return;
  }
  group *g = NULL;
  HASH_FIND(hh, e->groups, &r->group_id, sizeof r->group_id, g);
  if (!g) {
    g = calloc(1, sizeof *g);
    if (!g) {
      gs__eng_mark_ready(e, en); /* out of memory: emit it alone rather than lose it */
      return;
    }
    g->id = r->group_id;
    g->size = r->group_size;
    HASH_ADD(hh, e->groups, id, sizeof g->id, g);
  }
  /* The members array grows with the members that arrived, never to the
   * size a request claims (a peer controls that number). */
  if (g->n == g->cap) {
    uint32_t cap = g->cap ? g->cap * 2 : 8;
    entry **m = realloc(g->members, cap * sizeof *m);
    if (!m) {
      gs__eng_mark_ready(e, en);
      return;
    }
    g->members = m;
    g->cap = cap;
  }
  en->in_group = 1;
  g->members[g->n++] = en;
  if (g->n >= g->size) group_release(e, g);
}

void gs__eng_fail_pending(gs__engine *e) {
  /* Groups first: their members must leave the group before they can be
   * emitted and freed. */
  group *g, *gtmp;
  HASH_ITER(hh, e->groups, g, gtmp) group_release(e, g);
  entry *en, *tmp;
  HASH_ITER(hh, e->table, en, tmp) gs__eng_mark_ready(e, en);
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
    gs__eng_format_ranks(locs, nl, ls, sizeof ls);
    free(locs);
  }
  gs__eng_format_ranks(subs, nsubs, ss, sizeof ss);
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
void gs__eng_register_local(gs__engine *e, int32_t rank, const char *name, gs__outbox *box) {
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
      gs__eng_out_log(box, GS__LOG_ERROR, "out of memory registering local tensor '%s'", name);
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
  for (size_t i = 0; i < n; i++) gs__eng_rank_error(box, subs[i], name, GS__ERR_MISMATCH, text);
  e->mismatches++;
  gs__eng_out_event(box, GS__LOG_WARN, GS__EV_MISMATCH, -1, "%s", text);
  free(subs);
  gs__eng_entry_drop(e, en);
}

void gs__eng_unregister_local(gs__engine *e, int32_t rank, const char *name) {
  local_name *ln = NULL;
  HASH_FIND_STR(e->locals, name, ln);
  if (ln && ln->ranks[rank]) {
    ln->ranks[rank] = 0;
    ln->n--;
  }
}

void gs__eng_add_request(gs__engine *e, int32_t rank, const gs__tensor_request *r, uint64_t now_ms,
                         gs__outbox *box) {
  char err[GS__MAX_TEXT];
  int rc = check_request(e, rank, r, err, sizeof err);
  if (rc) {
    gs__eng_rank_error(box, rank, r->name, rc, err);
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
    gs__eng_rank_error(box, rank, r->name, GS__ERR_MISMATCH, err);
    free(subs);
    return;
  }
  /* Checked before anything is stored: past the limit only this rank's op
   * fails, and the table does not grow. */
  uint32_t limit = gs__eng_max_pending(e);
  if (e->ranks[rank].npending >= limit) {
    snprintf(err, sizeof err,
             "tensor '%s': rank %d (%s:%d) already has %u tensors pending at the coordinator, "
             "the limit (gradsyncd --max-pending-per-rank %u); wait for earlier ops to complete "
             "before submitting more, or raise the limit",
             r->name, rank, gs__eng_rank_host(e, rank), e->ranks[rank].pid, e->ranks[rank].npending,
             limit);
    gs__eng_rank_error(box, rank, r->name, GS__ERR_INVALID_ARG, err);
    return;
  }
  entry *en = NULL;
  HASH_FIND_STR(e->table, r->name, en);
  if (!en) {
    en = calloc(1, sizeof *en);
    if (en) {
      en->variants = malloc(sizeof *en->variants);
      en->variant_of = malloc((size_t)e->world * sizeof *en->variant_of);
      en->variant_seq = malloc(sizeof *en->variant_seq);
      en->first_dims = calloc((size_t)e->world, sizeof *en->first_dims);
    }
    if (!en || !en->variants || !en->variant_of || !en->variant_seq || !en->first_dims) {
      gs__eng_entry_free(en);
      gs__eng_rank_error(box, rank, r->name, GS__ERR_NO_MEMORY, "coordinator out of memory");
      return;
    }
    memcpy(en->name, r->name, sizeof en->name);
    for (int32_t q = 0; q < e->world; q++) en->variant_of[q] = -1;
    en->variants[0] = *r;
    en->nvariants = 1;
    en->first_ms = now_ms;
    en->order = e->next_order++;
    en->variant_seq[0] = en->order;
    en->bytes = gs__tensor_bytes(r->dtype, r->shape, r->ndim);
    HASH_ADD_STR(e->table, name, en);
  } else if (en->variant_of[rank] >= 0) {
    snprintf(err, sizeof err,
             "tensor '%s': rank %d submitted it again while its earlier %s is still in flight; "
             "wait for the first op to complete before reusing the name",
             r->name, rank, gs__op_type_name(en->variants[en->variant_of[rank]].op));
    gs__eng_rank_error(box, rank, r->name, GS__ERR_DUPLICATE_NAME, err);
    return;
  }
  int32_t v = 0;
  while (v < en->nvariants && !request_equal(&en->variants[v], r)) v++;
  if (v == en->nvariants) {
    gs__tensor_request *vs = realloc(en->variants, (size_t)(v + 1) * sizeof *vs);
    if (vs) en->variants = vs;
    uint64_t *seq = vs ? realloc(en->variant_seq, (size_t)(v + 1) * sizeof *seq) : NULL;
    if (!seq) {
      gs__eng_rank_error(box, rank, r->name, GS__ERR_NO_MEMORY, "coordinator out of memory");
      return;
    }
    en->variant_seq = seq;
    en->variants[v] = *r;
    en->variant_seq[v] = e->next_order++;
    en->nvariants++;
  }
  en->variant_of[rank] = v;
  en->first_dims[rank] = r->ndim > 0 ? r->shape[0] : 0;
  en->count++;
  e->ranks[rank].npending++;
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
