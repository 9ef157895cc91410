/* The coordinator's engine (see engine.h): the engine object, its outbox
 * and text helpers, and the event entry points that hand each event to the
 * part that owns it:
 *   membership.c  joins, sessions, departures, lost ranks, aborts
 *   table.c       the table of pending tensors, validation, groups, local names
 *   cache.c       the response cache and plan templates
 *   emit.c        the emission policy, fusion and the numbered plans
 *   checks.c      liveness, stall inspector, deadlock detector
 *   fast.c        the fast path: marker, escalation, FastStop, fast reports
 * Shared declarations are in engine_internal.h.
 *
 * Owns all coordinator job state; called only from the transport's
 * completion-queue thread. No I/O, no clock: time arrives as now_ms. */
#include "engine_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- outbox --------------------------------------------------------------- */

gs__out *gs__eng_out_push(gs__outbox *box, gs__out_kind kind) {
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

void gs__eng_out_log(gs__outbox *box, int level, const char *fmt, ...) {
  char buf[GS__MAX_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  gs__out *o = gs__eng_out_push(box, GS__OUT_LOG);
  if (!o) return;
  o->level = level;
  o->text = strdup(buf);
}

void gs__eng_out_event(gs__outbox *box, int level, int event, int32_t rank, const char *fmt, ...) {
  char buf[GS__MAX_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  gs__out *o = gs__eng_out_push(box, GS__OUT_LOG);
  if (!o) return;
  o->level = level;
  o->text = strdup(buf);
  o->event = event;
  o->event_rank = rank;
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
void gs__eng_append(char *buf, size_t cap, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, cap - used, fmt, ap);
  va_end(ap);
}

#define NAME_LIST_ENDING 32 /* " and 18446744073709551615 more" */

void gs__eng_append_name(char *buf, size_t cap, const char *name, size_t *more) {
  if (*more) { /* the list is closed: count the rest (no strlen per name) */
    (*more)++;
    return;
  }
  size_t used = strlen(buf), need = strlen(name) + (used ? 2 : 0);
  if (used + need + NAME_LIST_ENDING >= cap) {
    (*more)++;
    return;
  }
  gs__eng_append(buf, cap, "%s%s", used ? ", " : "", name);
}

void gs__eng_append_more(char *buf, size_t cap, size_t more) {
  if (more) gs__eng_append(buf, cap, "%s%zu more", buf[0] ? " and " : "", more);
}

/* "[0,2,5-9]": ascending ranks, runs of three or more shortened. */
void gs__eng_format_ranks(const int32_t *ranks, size_t n, char *buf, size_t cap) {
  buf[0] = 0;
  gs__eng_append(buf, cap, "[");
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
    const char *sep = i ? "," : "";
    if (j - i >= 2) {
      gs__eng_append(buf, cap, "%s%d-%d", sep, ranks[i], ranks[j]);
    } else {
      for (size_t k = i; k <= j; k++) gs__eng_append(buf, cap, "%s%d", k ? "," : "", ranks[k]);
    }
    i = j + 1;
  }
  gs__eng_append(buf, cap, "]");
}

const char *gs__eng_rank_host(const gs__engine *e, int32_t r) {
  return e->ranks[r].host[0] ? e->ranks[r].host : "?";
}

/* Sets up an empty job in the zeroed e. */
static int engine_init(gs__engine *e, const gs__engine_config *cfg) {
  e->cfg = *cfg;
  if (e->cfg.epoch == 0) e->cfg.epoch = 1;
  e->next_plan_seq = 1;
  e->left_rank = -1;
  e->last_joined = -1;
  e->next_cache_id = 1;
  e->next_template_id = 1;
  if (cfg->world_size > 0 && gs__eng_set_world(e, cfg->world_size) != GS__OK)
    return GS__ERR_NO_MEMORY;
  return GS__OK;
}

int gs__engine_create(const gs__engine_config *cfg, gs__engine **out) {
  *out = NULL;
  if (cfg->world_size < 0 || cfg->world_size > GS__MAX_WORLD) return GS__ERR_INVALID_ARG;
  gs__engine *e = calloc(1, sizeof *e);
  if (!e) return GS__ERR_NO_MEMORY;
  if (engine_init(e, cfg) != GS__OK) {
    free(e);
    return GS__ERR_NO_MEMORY;
  }
  *out = e;
  return GS__OK;
}

/* Frees everything e holds (not e itself). */
static void engine_free_state(gs__engine *e) {
  entry *en, *tmp;
  HASH_ITER(hh, e->table, en, tmp) {
    HASH_DEL(e->table, en);
    gs__eng_entry_free(en);
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
  for (int32_t r = 0; r < e->world; r++) {
    free(e->ranks[r].blocked);
    free(e->ranks[r].fast_pending);
  }
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
}

void gs__engine_destroy(gs__engine *e) {
  if (!e) return;
  engine_free_state(e);
  free(e);
}

int gs__engine_reset(gs__engine *e, uint32_t epoch) {
  gs__engine_config cfg = e->cfg;
  cfg.epoch = epoch;
  engine_free_state(e);
  memset(e, 0, sizeof *e);
  return engine_init(e, &cfg);
}

void gs__engine_rank_message(gs__engine *e, int32_t rank, const gs__rank_msg *msg, uint64_t now_ms,
                             gs__outbox *box) {
  if (rank < 0 || rank >= e->world || e->ranks[rank].state != RANK_CONNECTED) return;
  rank_slot *s = &e->ranks[rank];
  s->last_msg_ms = now_ms;
  if (msg->has_hello) gs__eng_fast_hello(e, s, msg);
  if (e->aborted) return;
  if (msg->nrequests && !e->world_ready) {
    for (size_t i = 0; i < msg->nrequests; i++)
      gs__eng_rank_error(box, rank, msg->requests[i].name, GS__ERR_INVALID_ARG,
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
  for (size_t i = 0; i < msg->nreg; i++) gs__eng_register_local(e, rank, msg->reg[i], box);
  for (size_t i = 0; i < msg->nunreg; i++) gs__eng_unregister_local(e, rank, msg->unreg[i]);
  if (msg->reg_seq > s->reg_seq) s->reg_seq = msg->reg_seq; /* applied: acknowledged on a marker */
  /* A leave goes first: whatever arrives with it can no longer complete. */
  if (msg->has_leave) {
    s->state = RANK_LEFT;
    e->nconnected--;
    gs__eng_fast_rank_gone(e, s);
    if (e->left_rank < 0) e->left_rank = rank;
    gs__eng_out_event(box, GS__LOG_INFO, GS__EV_RANK_LEFT, rank, "rank %d (%s:%d) left the job%s%s",
                      rank, gs__eng_rank_host(e, rank), s->pid, msg->leave_reason[0] ? ": " : "",
                      msg->leave_reason);
    int32_t nleft = 0;
    for (int32_t q = 0; q < e->world; q++) nleft += e->ranks[q].state == RANK_LEFT;
    if (nleft == e->world)
      gs__eng_out_event(box, GS__LOG_INFO, GS__EV_JOB_FINISHED, -1,
                        "every rank left cleanly: the job finished");
    gs__eng_fast_left(e, rank, now_ms, box);
  }
  if (e->left_rank >= 0) gs__eng_fail_pending(e);
  if (e->fast && !msg->escalate_round && (msg->nrequests || msg->ncached)) {
    const gs__tensor_request *c = msg->nrequests ? NULL : gs__eng_cache_lookup(e, msg->cached[0]);
    gs__eng_fast_late_request(e, rank,
                              msg->nrequests ? msg->requests[0].name
                              : c            ? c->name
                                             : "?",
                              box);
  }
  for (size_t i = 0; i < msg->nrequests; i++) {
    gs__eng_cache_check_full(e, &msg->requests[i]);
    gs__eng_add_request(e, rank, &msg->requests[i], now_ms, box);
  }
  e->full_requests += msg->nrequests;
  for (size_t i = 0; i < msg->ncached; i++) {
    const gs__tensor_request *r = gs__eng_cache_lookup(e, msg->cached[i]);
    if (!r) {
      gs__eng_out_log(
          box, GS__LOG_ERROR,
          "rank %d sent cache id %u, which this coordinator never assigned or forgot; its op "
          "cannot be matched (a gradsync bug: report it with this log)",
          rank, msg->cached[i]);
      continue;
    }
    e->cache_hits++;
    gs__eng_add_request(e, rank, r, now_ms, box);
  }
  for (size_t i = 0; i < msg->ndone; i++)
    if (msg->done_plans[i] > s->last_done_seq) s->last_done_seq = msg->done_plans[i];
  /* Fast path: the rank's report and waits, then its escalation (which
   * drops its waits: its ops come here now, with this message). */
  gs__eng_fast_update(e, s, msg, now_ms);
  if (msg->escalate_round && s->state == RANK_CONNECTED) {
    gs__eng_fast_note_ops(e, rank, msg);
    gs__eng_fast_escalate(e, rank, msg->escalate_round, now_ms, box);
  }
  gs__eng_maybe_emit(e, box, e->left_rank >= 0); /* after a departure, errors go out at once */
  /* The table may have emptied without a plan (a local conflict, an
   * escalation with nothing to send). */
  gs__eng_fast_marker(e, box);
  if (msg->blocked_update) gs__eng_set_blocked(e, s, msg, now_ms);
}

void gs__engine_tick(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  if (e->cfg.policy == GS__POLICY_WINDOW && now_ms >= e->next_window_ms) {
    uint64_t cycle = e->cfg.job.cycle_time_us / 1000u;
    e->next_window_ms = now_ms + (cycle ? cycle : 1);
    gs__eng_maybe_emit(e, box, 1);
  }
  gs__eng_check_liveness(e, now_ms, box);
  gs__eng_check_stalls(e, now_ms, box);
  gs__eng_check_deadlock(e, now_ms, box);
  gs__eng_fast_marker(e, box); /* e.g. a timeline stopped */
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
  out->epoch = e->cfg.epoch;
  out->plans_emitted = e->next_plan_seq - 1;
  out->tensors_planned = e->tensors_planned;
  out->pending_tensors = HASH_COUNT(e->table);
  out->stall_reports = e->stall_reports;
  out->deadlocks = e->deadlocks;
  out->collectives = e->collectives;
  out->bytes_planned = e->bytes_planned;
  out->mismatches = e->mismatches;
  out->ranks_lost = e->ranks_lost;
  out->cache_hits = e->cache_hits;
  out->full_requests = e->full_requests;
  out->cache_entries = e->ncache;
  out->plans_replayed = e->plans_replayed;
  for (const local_name *ln = e->locals; ln; ln = ln->hh.next)
    if (ln->n > 0) out->local_names++;
  out->fast_mode = e->fast;
  out->fast_entries = e->fast_entries;
  out->fast_stops = e->fast_stops;
  out->fast_backoff = e->fast_backoff;
  out->fast_backoff_left = e->fast_backoff_left;
  out->fast_backoffs = e->fast_backoffs;
  for (int32_t r = 0; r < e->world; r++) {
    const gs__fast_report *f = &e->ranks[r].fast;
    if (f->rounds > out->fast_rounds) out->fast_rounds = f->rounds;
    if (f->tensors > out->fast_tensors) out->fast_tensors = f->tensors;
    if (f->collectives > out->fast_collectives) out->fast_collectives = f->collectives;
    if (f->bytes > out->fast_bytes) out->fast_bytes = f->bytes;
    if (e->ranks[r].nfast_pending) out->fast_pending = 1; /* counted below */
  }
  if (out->fast_pending) {
    fast_items fi;
    out->fast_pending = gs__eng_fast_items(e, 0, &fi) == GS__OK ? fi.n : 0;
    gs__eng_fast_items_free(&fi);
  }
}
