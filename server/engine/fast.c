/* Engine fast path (issue 14): when the job may enter fast mode (the
 * marker Plan.fast_after), the escalations that end it, FastStop on a leave
 * or a timeline start, and what the ranks report from fast mode (counters,
 * the ops they wait on). Owns e->fast, the ranks' escalated flags, fast
 * reports and fast-pending sets. Engine thread only.
 *
 * In fast mode the ranks agree on cached requests among themselves; the
 * engine emits no plan (emit.c holds) until every connected rank escalated,
 * and the deadlock check is off (checks.c): a rank blocked on a fast op
 * looks like no progress. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int may_enter(const gs__engine *e) {
  if (!e->cfg.fast_path || e->fast || e->aborted || e->draining || e->timeline) return 0;
  /* Every rank of the world present: none left, lost or gone, none out of
   * data (gs_join: joined ranks contribute zeros, which only the
   * coordinator's plans know how to do). */
  if (!e->world_ready || e->nconnected != e->world || e->left_rank >= 0 || e->njoined) return 0;
  /* Every rank runs fast rounds: a raw client or an older worker that
   * never escalates would otherwise be held for ever. */
  if (e->ncapable != e->world) return 0;
  /* Nothing pending (a fast round never sees the table), and something the
   * ranks can agree on. */
  return e->ncache > 0 && !e->table && !e->nready;
}

int gs__eng_fast_allowed(const gs__engine *e) {
  /* Backing off, the marker waits for a plan that empties the table (an
   * empty plan on a tick or an idle escalation would end it early). */
  return !e->fast_backoff && may_enter(e);
}

int gs__eng_fast_on_plan(gs__engine *e) {
  if (!may_enter(e)) return 0;
  if (!e->fast_backoff) return 1;
  if (e->fast_backoff_left) {
    e->fast_backoff_left--;
    return 0;
  }
  e->fast_backoff = 0;
  return 1;
}

/* Ops a fast round can run (as the worker's classification): a cached
 * allreduce, broadcast or reducescatter, grouped or not, or a barrier. */
static int runs_fast(const gs__tensor_request *r) {
  return r->op == GS__OP_BARRIER || r->op == GS__OP_ALLREDUCE || r->op == GS__OP_BROADCAST ||
         r->op == GS__OP_REDUCESCATTER;
}

static void note_op(gs__engine *e, const char *name) {
  if (e->fast_op_escalated) return;
  e->fast_op_escalated = 1;
  snprintf(e->fast_op_name, sizeof e->fast_op_name, "%s", name);
}

void gs__eng_fast_note_ops(gs__engine *e, int32_t rank, const gs__rank_msg *msg) {
  if (!e->fast || e->ranks[rank].escalated || e->fast_op_escalated) return;
  /* A request in full: not in the rank's cache copy (new, evicted, or with
   * other parameters: a broadcast from another root), or never cached (an
   * allgather, ...). Barriers are never cached, and run in fast rounds. */
  for (size_t i = 0; i < msg->nrequests; i++)
    if (msg->requests[i].op != GS__OP_BARRIER) {
      note_op(e, msg->requests[i].name);
      return;
    }
  for (size_t i = 0; i < msg->ncached; i++) {
    const gs__tensor_request *r = gs__eng_cache_lookup(e, msg->cached[i]);
    if (r && !runs_fast(r)) {
      note_op(e, r->name);
      return;
    }
  }
}

/* The episode just ended (every connected rank escalated after round
 * `round`). Wasted: it ended at its first round, for an op a fast round
 * cannot run; not a timeline or a departure, which end an episode whatever
 * the job does, nor a reordering, a deadlock, a barrier's wait or a
 * (un)registration, where every op was one the ranks could run. From the
 * second wasted episode in a row the marker backs off: 1, 2, 4 ..
 * cfg.fast_backoff_max plans that empty the table go without it. */
static void episode_ended(gs__engine *e, uint64_t round, gs__outbox *box) {
  uint64_t rounds = round > e->fast_base_round ? round - e->fast_base_round : 0;
  e->fast_base_round = round;
  if (e->fast_told_stop) return;
  if (rounds >= 2) {
    /* It ran a round (at least one before the one that escalated). */
    e->fast_backoff_level = 0;
    return;
  }
  if (!e->fast_op_escalated || !e->cfg.fast_backoff_max) return;
  /* The first in a row is free: a job meets a new tensor now and then. */
  uint32_t level = e->fast_backoff_level;
  if (level < 32) e->fast_backoff_level++;
  if (!level) return;
  uint64_t max = e->cfg.fast_backoff_max;
  uint64_t skip = level <= 31 ? (uint64_t)1 << (level - 1) : max;
  if (skip > max) skip = max;
  e->fast_backoff = 1;
  e->fast_backoff_left = skip;
  e->fast_backoffs++;
  snprintf(e->fast_backoff_name, sizeof e->fast_backoff_name, "%s", e->fast_op_name);
  /* Worth a line once per run of wasted episodes: when it reaches max. */
  int reached_max = skip == max && (level == 1 || ((uint64_t)1 << (level - 2)) < max);
  gs__eng_out_log(box, reached_max ? GS__LOG_INFO : GS__LOG_DEBUG,
                  "the fast path backs off for %llu plan%s: the ranks came back at their first "
                  "fast round with '%s', an op a fast round cannot run (uncached, or an "
                  "allgather, alltoall, join or sparse op); the marker waits for the "
                  "next plan that empties the table after these (gradsyncd "
                  "--fast-path-backoff: the longest backoff, 0 = none)",
                  (unsigned long long)skip, skip == 1 ? "" : "s", e->fast_op_name);
}

void gs__eng_fast_reg_acks(gs__engine *e, gs__plan *p) {
  size_t n = 0;
  for (int32_t r = 0; r < e->world; r++) n += e->ranks[r].reg_seq != e->ranks[r].reg_seq_told;
  if (!n) return;
  p->reg_ack_ranks = malloc(n * sizeof *p->reg_ack_ranks);
  p->reg_ack_seqs = malloc(n * sizeof *p->reg_ack_seqs);
  if (!p->reg_ack_ranks || !p->reg_ack_seqs) {
    /* Unacknowledged, those ranks' first rounds are not clear: slower,
     * never wrong. */
    free(p->reg_ack_ranks);
    free(p->reg_ack_seqs);
    p->reg_ack_ranks = NULL;
    p->reg_ack_seqs = NULL;
    return;
  }
  for (int32_t r = 0; r < e->world; r++) {
    rank_slot *s = &e->ranks[r];
    if (s->reg_seq == s->reg_seq_told) continue;
    p->reg_ack_ranks[p->nreg_acks] = r;
    p->reg_ack_seqs[p->nreg_acks++] = s->reg_seq;
    s->reg_seq_told = s->reg_seq;
  }
}

void gs__eng_fast_hello(gs__engine *e, rank_slot *s, const gs__rank_msg *msg) {
  if (!msg->hello_fast_path || s->fast_capable) return;
  s->fast_capable = 1;
  e->ncapable++;
}

void gs__eng_fast_rank_gone(gs__engine *e, rank_slot *s) {
  if (!s->fast_capable) return;
  s->fast_capable = 0;
  e->ncapable--;
}

void gs__eng_fast_pending_clear(rank_slot *s) {
  free(s->fast_pending);
  s->fast_pending = NULL;
  s->nfast_pending = 0;
}

static void reset_ranks(gs__engine *e) {
  e->fast_first_rank = -1;
  e->fast_first_round = 0;
  e->fast_cursor = 0;
  for (int32_t r = 0; r < e->world; r++) {
    e->ranks[r].escalated = 0;
    gs__eng_fast_pending_clear(&e->ranks[r]);
  }
}

void gs__eng_fast_enter(gs__engine *e) {
  e->fast = 1;
  e->fast_marker_seq = e->next_plan_seq - 1; /* called once the marker's plan has its number */
  e->fast_recalled = 0;
  e->fast_entries++;
  e->fast_op_escalated = e->fast_told_stop = 0;
  e->fast_op_name[0] = 0;
  reset_ranks(e);
}

void gs__eng_fast_marker(gs__engine *e, gs__outbox *box) {
  if (!gs__eng_fast_allowed(e)) return;
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_PLAN;
  gs__plan *p = &o->msg.plan;
  p->seq = e->next_plan_seq++;
  p->fast_after = 1;
  /* Evictions and forgotten templates not announced yet ride along, as on
   * any plan. */
  p->evicted = e->evicted;
  p->nevicted = e->nevicted;
  e->evicted = NULL;
  e->nevicted = e->evicted_cap = 0;
  p->forget_templates = e->forget;
  p->nforget = e->nforget;
  e->forget = NULL;
  e->nforget = e->forget_cap = 0;
  gs__eng_fast_reg_acks(e, p);
  recent_plan *rp = &e->recent[p->seq % RECENT_PLANS];
  rp->seq = p->seq;
  rp->names[0] = 0;
  rp->nnames = rp->nmore = 0;
  gs__eng_fast_enter(e);
}

/* Every connected rank escalated: back to normal mode. An escalation is
 * activity (the deadlock window starts again). */
static void check_exit(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  if (!e->fast) return;
  while (e->fast_cursor < e->world &&
         (e->ranks[e->fast_cursor].state != RANK_CONNECTED || e->ranks[e->fast_cursor].escalated))
    e->fast_cursor++;
  if (e->fast_cursor < e->world) return;
  e->fast = 0;
  if (e->fast_first_rank >= 0) episode_ended(e, e->fast_first_round, box);
  reset_ranks(e);
  e->last_activity_ms = now_ms;
  e->deadlock_reported = 0;
}

void gs__eng_fast_escalate(gs__engine *e, int32_t rank, uint64_t round, uint64_t now_ms,
                           gs__outbox *box) {
  e->last_activity_ms = now_ms;
  e->deadlock_reported = 0;
  rank_slot *s = &e->ranks[rank];
  if (!e->fast || s->escalated) return; /* not in fast mode (any more): nothing to end */
  int32_t q = e->fast_first_rank;
  if (q < 0) {
    e->fast_first_rank = rank;
    e->fast_first_round = round;
  } else if (round != e->fast_first_round) {
    /* Every rank sees the same round results; different rounds mean they
     * did not, and ops may have run on some ranks only. */
    gs__eng_out_log(box, GS__LOG_ERROR,
                    "rank %d (%s:%d) left fast mode after fast round %llu but rank %d (%s:%d) "
                    "after round %llu: the ranks disagree on the fast rounds they ran (a gradsync "
                    "bug: report it with both ranks' logs)",
                    rank, gs__eng_rank_host(e, rank), s->pid, (unsigned long long)round, q,
                    gs__eng_rank_host(e, q), e->ranks[q].pid,
                    (unsigned long long)e->fast_first_round);
  }
  s->escalated = 1;
  gs__eng_fast_pending_clear(s); /* its ops come to the coordinator now */
  check_exit(e, now_ms, box);
}

void gs__eng_fast_left(gs__engine *e, int32_t rank, uint64_t now_ms, gs__outbox *box) {
  if (!e->fast) return;
  e->fast_told_stop = 1;
  rank_slot *s = &e->ranks[rank];
  s->escalated = 1;
  gs__eng_fast_pending_clear(s);
  char text[GS__MAX_TEXT];
  snprintf(text, sizeof text,
           "rank %d (%s, pid %d) left the job (gs_shutdown) while the ranks ran fast rounds: a "
           "round that waits for it can never complete. End the round and send its ops to the "
           "coordinator, which fails them naming that rank; every rank must submit the same "
           "tensors before shutting down",
           rank, gs__eng_rank_host(e, rank), s->pid);
  size_t told = 0;
  for (int32_t q = 0; q < e->world; q++) {
    if (e->ranks[q].state != RANK_CONNECTED || e->ranks[q].escalated) continue;
    gs__out *o = gs__eng_out_push(box, GS__OUT_TO_RANK);
    if (!o) break;
    o->rank = q;
    o->msg.kind = GS__MSG_FAST_STOP;
    o->msg.abort_round = 1;
    o->msg.text = strdup(text);
    told++;
  }
  if (told) {
    e->fast_stops++;
    gs__eng_out_log(box, GS__LOG_INFO, "fast mode ends: %s", text);
  }
  check_exit(e, now_ms, box);
}

void gs__eng_fast_late_request(gs__engine *e, int32_t rank, const char *name, gs__outbox *box) {
  const rank_slot *s = &e->ranks[rank];
  if (!e->fast || s->escalated || e->fast_recalled) return;
  e->fast_recalled = 1;
  note_op(e, name); /* every rank's next round escalates for it */
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  char text[GS__MAX_TEXT];
  snprintf(text, sizeof text,
           "rank %d (%s:%d) sent '%s' to the coordinator before the fast path began on it: every "
           "rank leaves the fast path at its next round, so that the coordinator plans it",
           rank, gs__eng_rank_host(e, rank), s->pid, name);
  o->msg.kind = GS__MSG_FAST_STOP;
  o->msg.abort_round = 0;
  o->msg.text = strdup(text);
  e->fast_stops++;
  gs__eng_out_log(box, GS__LOG_DEBUG, "fast mode ends: %s", text);
}

void gs__engine_set_timeline(gs__engine *e, int recording, uint64_t now_ms, gs__outbox *box) {
  (void)now_ms;
  e->timeline = recording ? 1 : 0;
  if (!recording || !e->fast || e->aborted) return;
  e->fast_told_stop = 1;
  const char *text =
      "a timeline started recording (gradsyncd StartTimeline or --timeline): the coordinator "
      "must see every request while it records, so every rank leaves the fast path at its next "
      "round";
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_FAST_STOP;
  o->msg.abort_round = 0;
  o->msg.text = strdup(text);
  e->fast_stops++;
  gs__eng_out_log(box, GS__LOG_INFO, "fast mode ends: %s", text);
}

void gs__engine_set_draining(gs__engine *e) {
  e->draining = 1;
}

void gs__eng_fast_update(gs__engine *e, rank_slot *s, const gs__rank_msg *msg, uint64_t now_ms) {
  if (msg->has_fast_report) s->fast = msg->fast_report;
  if (!msg->fast_pending_update) return;
  gs__eng_fast_pending_clear(s);
  /* Only a rank in fast mode waits on fast ops; a late report after its
   * escalation is stale. */
  if (!e->fast || s->escalated || !msg->nfast_pending || !msg->fast_pending) return;
  /* Bounded before it is stored (the codec refuses more; this engine is
   * also driven without it). */
  size_t n = msg->nfast_pending < GS__MAX_BLOCKED ? msg->nfast_pending : GS__MAX_BLOCKED;
  s->fast_pending = malloc(n * sizeof *s->fast_pending);
  if (!s->fast_pending) return;
  memcpy(s->fast_pending, msg->fast_pending, n * sizeof *s->fast_pending);
  for (size_t i = 0; i < n; i++) s->fast_pending[i].name[GS__MAX_NAME] = 0;
  s->nfast_pending = n;
  s->fast_pending_ms = now_ms;
}

/* ---- what the ranks in fast mode wait on -------------------------------- */

typedef struct fast_ref {
  const char *name;
  uint32_t cache_id;
  uint64_t age_ms;
  int32_t rank;
} fast_ref;

static int cmp_ref(const void *a, const void *b) {
  const fast_ref *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

int gs__eng_fast_items(const gs__engine *e, uint64_t now_ms, fast_items *out) {
  memset(out, 0, sizeof *out);
  if (!e->fast) return GS__OK;
  size_t total = 0;
  for (int32_t r = 0; r < e->world; r++)
    if (e->ranks[r].state == RANK_CONNECTED) total += e->ranks[r].nfast_pending;
  if (!total) return GS__OK;
  fast_ref *refs = malloc(total * sizeof *refs);
  out->items = malloc(total * sizeof *out->items);
  out->rank_store = malloc(total * sizeof *out->rank_store);
  if (!refs || !out->items || !out->rank_store) {
    free(refs);
    gs__eng_fast_items_free(out);
    return GS__ERR_NO_MEMORY;
  }
  size_t n = 0;
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (s->state != RANK_CONNECTED) continue;
    uint64_t since = now_ms > s->fast_pending_ms ? now_ms - s->fast_pending_ms : 0;
    for (size_t i = 0; i < s->nfast_pending; i++)
      refs[n++] = (fast_ref){s->fast_pending[i].name, s->fast_pending[i].cache_id,
                             (uint64_t)s->fast_pending[i].age_ms + since, r};
  }
  qsort(refs, n, sizeof *refs, cmp_ref);
  size_t used = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && !strcmp(refs[j].name, refs[i].name)) j++;
    entry *en = NULL;
    HASH_FIND_STR(e->table, refs[i].name, en);
    if (!en) {
      fast_item *it = &out->items[out->n++];
      it->name = refs[i].name;
      it->cache_id = 0;
      it->age_ms = 0;
      it->ranks = out->rank_store + used;
      it->nranks = 0;
      for (size_t k = i; k < j; k++) {
        if (!it->cache_id) it->cache_id = refs[k].cache_id;
        if (refs[k].age_ms > it->age_ms) it->age_ms = refs[k].age_ms;
        /* A rank that names an op twice is one rank. */
        if (!it->nranks || it->ranks[it->nranks - 1] != refs[k].rank)
          it->ranks[it->nranks++] = refs[k].rank;
      }
      used += it->nranks;
    }
    i = j;
  }
  free(refs);
  return GS__OK;
}

void gs__eng_fast_items_free(fast_items *fi) {
  free(fi->items);
  free(fi->rank_store);
  memset(fi, 0, sizeof *fi);
}

static int cmp_rank(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int gs__eng_fast_missing(const gs__engine *e, const fast_item *it, int32_t r) {
  if (e->ranks[r].state != RANK_CONNECTED) return 0;
  return !bsearch(&r, it->ranks, it->nranks, sizeof r, cmp_rank);
}

static int cmp_item_name(const void *key, const void *elem) {
  return strcmp((const char *)key, ((const fast_item *)elem)->name);
}

const fast_item *gs__eng_fast_find(const fast_items *fi, const char *name) {
  if (!fi->n) return NULL;
  return bsearch(name, fi->items, fi->n, sizeof *fi->items, cmp_item_name);
}
