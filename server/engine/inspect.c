/* Read-only views of the engine for the Diagnostics service: status, the
 * pending table (filtered, paged), stalls with who waits on what, local
 * names per rank; and the operator's abort. Engine thread only; results
 * belong to the caller (diag_messages.h). */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_layout.h"

static const char *state_name(rank_state s) {
  switch (s) {
  case RANK_JOINED:
    return "joined";
  case RANK_CONNECTED:
    return "connected";
  case RANK_LEFT:
    return "left";
  case RANK_LOST:
    return "lost";
  case RANK_GONE:
    return "gone";
  default:
    return "none";
  }
}

static double age_s(uint64_t now_ms, uint64_t then_ms) {
  return then_ms && now_ms > then_ms ? (double)(now_ms - then_ms) / 1000.0 : 0.0;
}

int gs__engine_status(const gs__engine *e, uint64_t now_ms, gs__diag_status *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->job_id, sizeof out->job_id, "%s", e->cfg.job_id);
  out->world_size = e->world;
  out->epoch = 1;
  out->world_ready = e->world_ready;
  out->aborted = e->aborted;
  out->plans_emitted = e->next_plan_seq - 1;
  out->collectives = e->collectives;
  out->tensors_planned = e->tensors_planned;
  out->bytes_negotiated = e->bytes_planned;
  /* A tensor a rank ran on the fast path is a cache hit the coordinator
   * never saw (cache_hits counts one per rank and tensor too). */
  uint64_t fast = 0;
  for (int32_t r = 0; r < e->world; r++) {
    const gs__fast_report *f = &e->ranks[r].fast;
    fast = gs__add_sat(fast, f->tensors);
    if (f->rounds > out->fast_rounds) out->fast_rounds = f->rounds;
    if (f->tensors > out->fast_tensors) out->fast_tensors = f->tensors;
    if (f->collectives > out->fast_collectives) out->fast_collectives = f->collectives;
  }
  out->fast_backoff = e->fast_backoff;
  out->fast_backoff_plans = e->fast_backoff_left;
  out->fast_backoffs = e->fast_backoffs;
  snprintf(out->fast_backoff_tensor, sizeof out->fast_backoff_tensor, "%s", e->fast_backoff_name);
  uint64_t hits = gs__add_sat(e->cache_hits, fast);
  uint64_t reqs = gs__add_sat(hits, e->full_requests);
  out->cache_hit_rate = reqs ? (double)hits / (double)reqs : 0.0;
  out->mean_tensors_per_op =
      e->collectives ? (double)e->tensors_planned / (double)e->collectives : 0.0;
  out->pending_tensors = HASH_COUNT(e->table);
  if (!e->world) return GS__OK;
  gs__engine_stats st;
  gs__engine_get_stats(e, &st);
  out->pending_tensors += st.fast_pending; /* as ListPending shows them */
  out->ranks = calloc((size_t)e->world, sizeof *out->ranks);
  if (!out->ranks) return GS__ERR_NO_MEMORY;
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    gs__diag_rank *d = &out->ranks[out->nranks++];
    d->rank = r;
    snprintf(d->host, sizeof d->host, "%s", s->host);
    d->pid = s->pid;
    snprintf(d->state, sizeof d->state, "%s", state_name(s->state));
    d->last_msg_age_s = s->state == RANK_NONE ? 0.0 : age_s(now_ms, s->last_msg_ms);
    d->last_done_plan = s->last_done_seq;
    d->joined_uneven = s->joined;
    d->blocked_on = calloc(s->nblocked + 1, sizeof *d->blocked_on);
    if (!d->blocked_on) goto out_oom;
    for (size_t i = 0; i < s->nblocked; i++) {
      if (!(d->blocked_on[i] = strdup(s->blocked[i]))) goto out_oom;
      d->nblocked++;
    }
  }
  return GS__OK;
out_oom:
  gs__diag_status_free(out);
  return GS__ERR_NO_MEMORY;
}

/* A rank counts as missing from en when it has not submitted it and has
 * not joined (joined ranks are ready for everything). */
static int is_missing(const gs__engine *e, const entry *en, int32_t r) {
  return en->variant_of[r] < 0 && !e->ranks[r].joined;
}

static int fill_pending(const gs__engine *e, const entry *en, uint64_t now_ms,
                        gs__diag_pending *p) {
  memset(p, 0, sizeof *p);
  const gs__tensor_request *v = &en->variants[0];
  snprintf(p->name, sizeof p->name, "%s", en->name);
  p->op = v->op;
  p->dtype = v->dtype;
  p->ndim = v->ndim;
  memcpy(p->shape, v->shape, sizeof p->shape);
  p->age_s = age_s(now_ms, en->first_ms);
  p->complete = en->queued || en->in_group;
  p->submitted = malloc(((size_t)e->world + 1) * sizeof *p->submitted);
  p->missing = malloc(((size_t)e->world + 1) * sizeof *p->missing);
  if (!p->submitted || !p->missing) {
    gs__diag_pending_free(p);
    return GS__ERR_NO_MEMORY;
  }
  for (int32_t r = 0; r < e->world; r++) {
    if (en->variant_of[r] >= 0)
      p->submitted[p->nsubmitted++] = r;
    else if (is_missing(e, en, r))
      p->missing[p->nmissing++] = r;
  }
  return GS__OK;
}

/* An op the ranks in fast mode wait on, as a pending entry: what the
 * cache knows of it, the ranks that report it, the other connected ranks
 * as missing. */
static int fill_fast_pending(const gs__engine *e, const fast_item *it, gs__diag_pending *p) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", it->name);
  const gs__tensor_request *v = it->cache_id ? gs__eng_cache_lookup(e, it->cache_id) : NULL;
  if (v) {
    p->op = v->op;
    p->dtype = v->dtype;
    p->ndim = v->ndim;
    memcpy(p->shape, v->shape, sizeof p->shape);
  } else if (!it->cache_id) {
    p->op = GS__OP_BARRIER;
  }
  p->age_s = (double)it->age_ms / 1000.0;
  p->fast_path = 1;
  p->submitted = malloc(((size_t)e->world + 1) * sizeof *p->submitted);
  p->missing = malloc(((size_t)e->world + 1) * sizeof *p->missing);
  if (!p->submitted || !p->missing) {
    gs__diag_pending_free(p);
    return GS__ERR_NO_MEMORY;
  }
  memcpy(p->submitted, it->ranks, it->nranks * sizeof *p->submitted);
  p->nsubmitted = it->nranks;
  for (int32_t r = 0; r < e->world; r++)
    if (gs__eng_fast_missing(e, it, r)) p->missing[p->nmissing++] = r;
  return GS__OK;
}

static int fast_matches(const gs__engine *e, const fast_item *it, const gs__diag_pending_query *q) {
  if (q->name_prefix[0] && strncmp(it->name, q->name_prefix, strlen(q->name_prefix)) != 0) return 0;
  if (!q->nmissing_ranks) return 1;
  for (size_t i = 0; i < q->nmissing_ranks; i++) {
    int32_t r = q->missing_ranks[i];
    if (r >= 0 && r < e->world && gs__eng_fast_missing(e, it, r)) return 1;
  }
  return 0;
}

/* Page tokens of the fast path's items: after every table entry's. */
#define FAST_TOKEN_BASE ((uint64_t)1 << 62)

static int matches(const gs__engine *e, const entry *en, const gs__diag_pending_query *q) {
  if (q->name_prefix[0] && strncmp(en->name, q->name_prefix, strlen(q->name_prefix)) != 0) return 0;
  if (!q->nmissing_ranks) return 1;
  for (size_t i = 0; i < q->nmissing_ranks; i++) {
    int32_t r = q->missing_ranks[i];
    if (r >= 0 && r < e->world && is_missing(e, en, r)) return 1;
  }
  return 0;
}

/* The table keeps arrival order (uthash appends), and order only grows:
 * the page token is the order of the last entry shown. The fast path's
 * items follow, by name, with tokens from FAST_TOKEN_BASE. */
int gs__engine_list_pending(const gs__engine *e, const gs__diag_pending_query *q, uint64_t now_ms,
                            gs__diag_pending_list *out) {
  memset(out, 0, sizeof *out);
  uint32_t page = q->page_size ? q->page_size : GS__DIAG_DEFAULT_PAGE;
  if (page > GS__DIAG_MAX_PAGE) page = GS__DIAG_MAX_PAGE;
  out->items = calloc(page, sizeof *out->items);
  if (!out->items) return GS__ERR_NO_MEMORY;
  uint64_t last = 0;
  for (const entry *en = e->table; en; en = en->hh.next) {
    if (!matches(e, en, q)) continue;
    out->total++;
    if (en->order + 1 <= q->after) continue; /* token = order + 1, never 0 */
    if (out->n == page) {
      out->next_after = last;
      continue;
    }
    if (fill_pending(e, en, now_ms, &out->items[out->n]) != GS__OK) {
      gs__diag_pending_list_free(out);
      return GS__ERR_NO_MEMORY;
    }
    out->n++;
    last = en->order + 1;
  }
  fast_items fi;
  if (gs__eng_fast_items(e, now_ms, &fi) != GS__OK) {
    gs__diag_pending_list_free(out);
    return GS__ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < fi.n; i++) {
    if (!fast_matches(e, &fi.items[i], q)) continue;
    out->total++;
    uint64_t token = FAST_TOKEN_BASE + i + 1;
    if (token <= q->after) continue;
    if (out->n == page) {
      out->next_after = last;
      continue;
    }
    if (fill_fast_pending(e, &fi.items[i], &out->items[out->n]) != GS__OK) {
      gs__eng_fast_items_free(&fi);
      gs__diag_pending_list_free(out);
      return GS__ERR_NO_MEMORY;
    }
    out->n++;
    last = token;
  }
  gs__eng_fast_items_free(&fi);
  return GS__OK;
}

int gs__engine_stalls(const gs__engine *e, uint64_t now_ms, gs__diag_stalls *out) {
  memset(out, 0, sizeof *out);
  out->stall_warning_s = e->cfg.job.stall_warning_s;
  uint64_t warn_ms = (uint64_t)e->cfg.job.stall_warning_s * 1000u;
  size_t total = HASH_COUNT(e->table);
  fast_items fi;
  if (gs__eng_fast_items(e, now_ms, &fi) != GS__OK) return GS__ERR_NO_MEMORY;
  out->stalled = calloc(total + fi.n + 1, sizeof *out->stalled);
  out->waits = calloc((size_t)e->world + 1, sizeof *out->waits);
  if (!out->stalled || !out->waits) goto out_oom;
  for (const entry *en = e->table; en; en = en->hh.next) {
    if (!warn_ms || now_ms - en->first_ms < warn_ms || en->queued || en->in_group) continue;
    if (fill_pending(e, en, now_ms, &out->stalled[out->nstalled]) != GS__OK) goto out_oom;
    out->nstalled++;
  }
  for (size_t i = 0; i < fi.n; i++) {
    if (!warn_ms || fi.items[i].age_ms < warn_ms) continue;
    if (fill_fast_pending(e, &fi.items[i], &out->stalled[out->nstalled]) != GS__OK) goto out_oom;
    out->nstalled++;
  }
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (!s->nblocked || s->state != RANK_CONNECTED) continue;
    gs__diag_rank_wait *w = &out->waits[out->nwaits++];
    w->rank = r;
    w->waits = calloc(s->nblocked, sizeof *w->waits);
    if (!w->waits) goto out_oom;
    for (size_t i = 0; i < s->nblocked; i++) {
      gs__diag_waited *t = &w->waits[w->n++];
      snprintf(t->name, sizeof t->name, "%s", s->blocked[i]);
      entry *en = NULL;
      HASH_FIND_STR(e->table, s->blocked[i], en);
      t->missing = malloc(((size_t)e->world + 1) * sizeof *t->missing);
      if (!t->missing) goto out_oom;
      /* Not in the table: maybe an op of the fast path that others have
       * not submitted. */
      const fast_item *it = en ? NULL : gs__eng_fast_find(&fi, s->blocked[i]);
      t->pending = en != NULL || it != NULL;
      for (int32_t q = 0; en && q < e->world; q++)
        if (is_missing(e, en, q)) t->missing[t->nmissing++] = q;
      for (int32_t q = 0; it && q < e->world; q++)
        if (gs__eng_fast_missing(e, it, q)) t->missing[t->nmissing++] = q;
    }
  }
  if (e->last_stall && !(out->last_stall = strdup(e->last_stall))) goto out_oom;
  if (e->last_deadlock && !(out->last_deadlock = strdup(e->last_deadlock))) goto out_oom;
  gs__eng_fast_items_free(&fi);
  return GS__OK;
out_oom:
  gs__eng_fast_items_free(&fi);
  gs__diag_stalls_free(out);
  return GS__ERR_NO_MEMORY;
}

int gs__engine_locals(const gs__engine *e, gs__diag_locals *out) {
  memset(out, 0, sizeof *out);
  if (!e->world) return GS__OK;
  size_t nnames = HASH_COUNT(e->locals);
  out->ranks = calloc((size_t)e->world, sizeof *out->ranks);
  if (!out->ranks) return GS__ERR_NO_MEMORY;
  for (int32_t r = 0; r < e->world; r++) {
    gs__diag_rank_locals *rl = &out->ranks[out->n];
    rl->rank = r;
    for (const local_name *ln = e->locals; ln; ln = ln->hh.next) {
      if (!ln->ranks[r]) continue;
      if (!rl->names && !(rl->names = calloc(nnames, sizeof *rl->names))) goto out_oom;
      if (!(rl->names[rl->n] = strdup(ln->name))) goto out_oom;
      rl->n++;
    }
    if (rl->n) out->n++;
  }
  return GS__OK;
out_oom:
  out->n++; /* free the partly filled one too */
  gs__diag_locals_free(out);
  return GS__ERR_NO_MEMORY;
}

const gs__tensor_request *gs__engine_cached_request(const gs__engine *e, uint32_t id) {
  return gs__eng_cache_lookup(e, id);
}

void gs__engine_abort(gs__engine *e, const char *reason, gs__outbox *box) {
  if (e->aborted) return;
  char text[GS__MAX_TEXT];
  snprintf(text, sizeof text,
           "an operator aborted the job through gradsyncd's Diagnostics.AbortJob: %s. No rank "
           "failed by itself; ask whoever runs the job why, then restart it",
           reason && *reason ? reason : "(no reason given)");
  gs__eng_abort_job(e, GS__ERR_ABORTED, text, box);
}
