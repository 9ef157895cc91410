/* Engine checks run from tick: liveness (silent ranks are lost), the stall
 * inspector (Horovod's report, optional shutdown) and the deadlock detector
 * (every live rank blocked, nothing ready, no new request). Owns the ranks'
 * blocked sets, e->last_activity_ms and the stall/deadlock reports. Engine
 * thread only. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new blocked-on set is no activity: a thread that re-enters a timed wait
 * or polls with gs_test is as blocked as before, and counting the change of
 * the set as progress would let such a job hang for ever. Only new requests
 * restart the deadlock window. */
void gs__eng_set_blocked(gs__engine *e, rank_slot *s, const gs__rank_msg *msg, uint64_t now_ms) {
  (void)e;
  (void)now_ms;
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
}

void gs__eng_check_liveness(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
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
    gs__out *o = gs__eng_out_push(box, GS__OUT_CLOSE_RANK);
    if (o) {
      o->rank = r;
      o->text = strdup(detail);
    }
    gs__eng_lose_rank(e, r, detail, box);
  }
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "[a, b, c, d, e, f, ...]": sorted, at most 6 names. */
static void format_names(const char **names, size_t n, char *buf, size_t cap) {
  qsort(names, n, sizeof *names, cmp_str);
  buf[0] = 0;
  gs__eng_append(buf, cap, "[");
  for (size_t i = 0; i < n && i < 6; i++) gs__eng_append(buf, cap, "%s%s", i ? ", " : "", names[i]);
  if (n > 6) gs__eng_append(buf, cap, ", ...");
  gs__eng_append(buf, cap, "]");
}

/* Whether rank r holds up en in a stall report: it has not submitted it;
 * or, for an entry complete but held in fast mode, it has not escalated
 * yet (the entry waits for that, not for a submission). */
static int stall_missing(const gs__engine *e, const entry *en, int32_t r) {
  if (en->queued && e->fast) return e->ranks[r].state == RANK_CONNECTED && !e->ranks[r].escalated;
  return en->variant_of[r] < 0;
}

/* The stall report of every entry older than age_ms, and of every op the
 * ranks in fast mode wait on that long, grouped by missing rank; NULL when
 * nothing is that old. */
static char *stall_report(const gs__engine *e, uint64_t now_ms, uint64_t age_ms) {
  size_t total = HASH_COUNT(e->table), nold = 0, nfold = 0;
  fast_items fi;
  if (gs__eng_fast_items(e, now_ms, &fi) != GS__OK) memset(&fi, 0, sizeof fi);
  if (!total && !fi.n) return NULL;
  const entry **old = malloc((total + 1) * sizeof *old);
  const fast_item **fold = malloc((fi.n + 1) * sizeof *fold);
  const char **names = malloc((total + fi.n + 1) * sizeof *names);
  char *text = malloc(GS__MAX_TEXT * 4);
  if (!old || !fold || !names || !text) goto out_free;
  for (const entry *en = e->table; en; en = en->hh.next)
    if (now_ms - en->first_ms >= age_ms && !en->in_group && (!en->queued || e->fast))
      old[nold++] = en;
  for (size_t i = 0; i < fi.n; i++)
    if (fi.items[i].age_ms >= age_ms) fold[nfold++] = &fi.items[i];
  if (!nold && !nfold) goto out_free;
  text[0] = 0;
  gs__eng_append(
      text, GS__MAX_TEXT * 4,
      "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
      "ranks and are waiting for remainder of ranks for more than %llu seconds. Every rank "
      "must submit every tensor; the ranks below have not.\nMissing ranks:",
      (unsigned long long)(age_ms / 1000u));
  for (int32_t r = 0; r < e->world; r++) {
    size_t n = 0;
    for (size_t i = 0; i < nold; i++)
      if (stall_missing(e, old[i], r)) names[n++] = old[i]->name;
    for (size_t i = 0; i < nfold; i++)
      if (gs__eng_fast_missing(e, fold[i], r)) names[n++] = fold[i]->name;
    if (!n) continue;
    char list[2048];
    format_names(names, n, list, sizeof list);
    gs__eng_append(text, GS__MAX_TEXT * 4, "\n%d (%s:%d): %s", r, gs__eng_rank_host(e, r),
                   e->ranks[r].pid, list);
  }
  free(old);
  free(fold);
  free(names);
  gs__eng_fast_items_free(&fi);
  return text;
out_free:
  free(old);
  free(fold);
  free(names);
  free(text);
  gs__eng_fast_items_free(&fi);
  return NULL;
}

/* The age of the oldest op the ranks in fast mode wait on (0: none). */
static uint64_t oldest_fast(const gs__engine *e, uint64_t now_ms) {
  uint64_t oldest = 0;
  if (!e->fast) return 0;
  for (int32_t r = 0; r < e->world; r++) {
    const rank_slot *s = &e->ranks[r];
    if (s->state != RANK_CONNECTED) continue;
    uint64_t since = now_ms > s->fast_pending_ms ? now_ms - s->fast_pending_ms : 0;
    for (size_t i = 0; i < s->nfast_pending; i++)
      if ((uint64_t)s->fast_pending[i].age_ms + since > oldest)
        oldest = (uint64_t)s->fast_pending[i].age_ms + since;
  }
  return oldest;
}

void gs__eng_check_stalls(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  uint64_t warn_ms = (uint64_t)e->cfg.job.stall_warning_s * 1000u;
  uint64_t shut_ms = (uint64_t)e->cfg.job.stall_shutdown_s * 1000u;
  if (!e->world_ready || e->aborted) return;
  /* The table keeps arrival order, so its head is the oldest entry: a cheap
   * test before building any report on every tick. */
  uint64_t oldest = e->table ? now_ms - e->table->first_ms : 0;
  uint64_t oldest_f = oldest_fast(e, now_ms);
  if (oldest_f > oldest) oldest = oldest_f;
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
        gs__eng_out_event(box, -1, GS__EV_STALL, -1, "%s", report);
        gs__eng_abort_job(e, GS__ERR_STALL, text, box);
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
  gs__eng_out_event(box, GS__LOG_WARN, GS__EV_STALL, -1, "%s", report);
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
    gs__eng_format_ranks(ranks, n, list, sizeof list);
    snprintf(buf, cap, "ranks %s", list);
  }
  free(ranks);
}

void gs__eng_check_deadlock(gs__engine *e, uint64_t now_ms, gs__outbox *box) {
  uint32_t quiet = e->cfg.job.deadlock_time_ms;
  /* Not in fast mode: ranks blocked on fast ops report blocked-on sets
   * while their rounds progress, which would look like no progress. Their
   * escalation counts as activity and starts the window again. */
  if (!quiet || !e->world_ready || e->aborted || e->deadlock_reported || e->nready || e->fast)
    return;
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
      gs__eng_append(text, cap, "; ... (%d more ranks)", live - shown);
      break;
    }
    gs__eng_append(text, cap, "%srank %d (%s:%d) waits on ", shown ? "; " : "", r,
                   gs__eng_rank_host(e, r), s->pid);
    for (size_t i = 0; i < s->nblocked && i < 6; i++) {
      entry *en = NULL;
      char why[1100];
      HASH_FIND_STR(e->table, s->blocked[i], en);
      if (en) missing_ranks(e, en, why, sizeof why);
      gs__eng_append(text, cap, "%s[%s] (%s%s)", i ? ", " : "", s->blocked[i],
                     en ? "missing from " : "not pending at the coordinator", en ? why : "");
    }
    if (s->nblocked > 6) gs__eng_append(text, cap, ", ... %zu more", s->nblocked - 6);
    shown++;
  }
  gs__eng_append(text, cap,
                 ". The ranks submit different tensor names (look for rank-dependent code paths or "
                 "names); make every rank submit the same tensors, then restart the job");
  e->deadlock_reported = 1;
  e->deadlocks++;
  free(e->last_deadlock);
  e->last_deadlock = strdup(text);
  gs__eng_out_event(box, e->cfg.deadlock_warn_only ? GS__LOG_WARN : -1, GS__EV_DEADLOCK, -1, "%s",
                    text);
  if (!e->cfg.deadlock_warn_only) gs__eng_abort_job(e, GS__ERR_DEADLOCK, text, box);
  free(text);
}
