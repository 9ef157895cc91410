/* Engine membership: the rank slots (join, session hello, leave, loss),
 * the world status message, and aborting the job. Owns e->ranks' states,
 * e->nconnected, e->world_ready and e->aborted. Engine thread only. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gs__eng_set_world(gs__engine *e, int32_t size) {
  e->ranks = calloc((size_t)size, sizeof *e->ranks);
  if (!e->ranks) return GS__ERR_NO_MEMORY;
  e->world = size;
  return GS__OK;
}

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
        "rank with the same GRADSYNC_SIZE (for several hosts, one gradsync-run -np %d -H "
        "host1:n1,host2:n2 numbers every rank of the job, not one gradsync-run per host)",
        req->rank, host, req->pid, req->size, e->world,
        e->cfg.world_size ? "set by gradsyncd --world-size" : "set by the first rank to join",
        e->world);
    return GS__ERR_INVALID_ARG;
  }
  if (req->rank < 0 || req->rank >= req->size) {
    snprintf(err, errlen,
             "rank %d (%s:%d) is out of range for a job of %d ranks (valid ranks: 0..%d); check "
             "GRADSYNC_RANK",
             req->rank, host, req->pid, req->size, req->size - 1);
    return GS__ERR_INVALID_ARG;
  }
  if (!e->world && gs__eng_set_world(e, req->size) != GS__OK) {
    snprintf(err, errlen, "out of memory for a job of %d ranks", req->size);
    return GS__ERR_NO_MEMORY;
  }
  rank_slot *s = &e->ranks[req->rank];
  if (s->state == RANK_LEFT) {
    /* Most likely the next job's rank, started before this job ended. */
    int32_t running[64]; /* the first 64 are enough to name */
    size_t n = 0;
    for (int32_t r = 0; r < e->world && n < sizeof running / sizeof running[0]; r++)
      if (e->ranks[r].state != RANK_LEFT) running[n++] = r;
    char list[256];
    gs__eng_format_ranks(running, n, list, sizeof list);
    snprintf(err, errlen,
             "rank %d (%s:%d) cannot join: this coordinator is still serving a job (epoch %u) "
             "whose rank %d (%s:%d) has already finished, while ranks %s have not left yet. A "
             "coordinator serves one job at a time: start the next job once this one ended "
             "(gradsyncd exits after a job unless --serve-forever), or give it its own coordinator",
             req->rank, host, req->pid, e->cfg.epoch, req->rank, s->host[0] ? s->host : "?", s->pid,
             list);
    return GS__ERR_ALREADY_JOINED;
  }
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
  resp->epoch = e->cfg.epoch;
  resp->rank = req->rank;
  resp->size = e->world;
  resp->config = e->cfg.job;
  return GS__OK;
}

int gs__eng_world_status(const gs__engine *e, gs__plan_msg *m) {
  memset(m, 0, sizeof *m);
  m->kind = GS__MSG_WORLD;
  m->world.ready = e->world_ready;
  m->world.size = e->world;
  m->world.epoch = e->cfg.epoch;
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
             gs__eng_rank_host(e, rank), s->pid);
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
  gs__eng_out_event(box, GS__LOG_INFO, GS__EV_RANK_JOINED, rank,
                    "rank %d (%s:%d) connected; %d of %d ranks present", rank,
                    gs__eng_rank_host(e, rank), s->pid, e->nconnected, e->world);
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (o && gs__eng_world_status(e, &o->msg) != GS__OK) box->n--;
  if (e->world_ready)
    gs__eng_out_event(box, GS__LOG_INFO, GS__EV_WORLD_READY, -1,
                      "all %d ranks connected: world ready", e->world);
  return GS__OK;
}

/* "[a, b, c]" of the names pending (at most 20), oldest first, then the
 * ops ranks in fast mode reported waiting on. */
static void pending_names(const gs__engine *e, char *buf, size_t cap) {
  buf[0] = 0;
  gs__eng_append(buf, cap, "[");
  fast_items fi;
  if (gs__eng_fast_items(e, 0, &fi) != GS__OK) memset(&fi, 0, sizeof fi);
  size_t n = 0, total = HASH_COUNT(e->table) + fi.n;
  const entry *en;
  for (en = e->table; en && n < 20; en = en->hh.next, n++)
    gs__eng_append(buf, cap, "%s%s", n ? ", " : "", en->name);
  for (size_t i = 0; i < fi.n && n < 20; i++, n++)
    gs__eng_append(buf, cap, "%s%s", n ? ", " : "", fi.items[i].name);
  if (total > n) gs__eng_append(buf, cap, ", ... %zu more", total - n);
  gs__eng_append(buf, cap, "]");
  gs__eng_fast_items_free(&fi);
}

void gs__eng_abort_job(gs__engine *e, int status, const char *text, gs__outbox *box) {
  e->aborted = 1;
  gs__eng_out_event(box, GS__LOG_ERROR, GS__EV_JOB_ABORTED, -1, "aborting the job: %s", text);
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_ABORT;
  o->msg.status = status;
  o->msg.text = strdup(text);
}

/* Marks a connected rank lost and tells everyone (see session_closed). */
void gs__eng_lose_rank(gs__engine *e, int32_t rank, const char *detail, gs__outbox *box) {
  rank_slot *s = &e->ranks[rank];
  s->state = RANK_LOST;
  e->nconnected--;
  gs__eng_fast_rank_gone(e, s);
  if (e->aborted) return;
  if (!e->world_ready) {
    /* Still gathering: the slot is free again (a restarted process may take
     * it) and the rank is reported as gone, apart from the ranks that never
     * came, so the others' join timeout names both for what they are. */
    gs__eng_out_event(box, GS__LOG_WARN, GS__EV_RANK_LOST, rank,
                      "rank %d (%s:%d) disconnected before the job started: %s", rank,
                      gs__eng_rank_host(e, rank), s->pid,
                      detail && *detail ? detail : "session ended");
    s->state = RANK_GONE;
    gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
    if (o && gs__eng_world_status(e, &o->msg) != GS__OK) box->n--;
    return;
  }
  char names[2048], running[1024] = "", text[GS__MAX_TEXT];
  pending_names(e, names, sizeof names);
  /* Plans emitted that the lost rank had not reported finished: whole
   * lists while they fit, then how many names more. */
  size_t more = 0;
  for (uint64_t seq = s->last_done_seq + 1; seq < e->next_plan_seq; seq++) {
    const recent_plan *rp = &e->recent[seq % RECENT_PLANS];
    if (rp->seq != seq || !rp->nnames) continue;
    size_t more_before = more;
    if (rp->names[0]) gs__eng_append_name(running, sizeof running, rp->names, &more);
    more = more > more_before ? more_before + rp->nnames : more + rp->nmore;
  }
  gs__eng_append_more(running, sizeof running, more);
  /* In fast mode (it had not escalated) the ranks agree on cached tensors
   * among themselves: gradsyncd does not see which it was reducing, only
   * what it reported waiting on for over a second, and no plan went out
   * after the marker. A rank reports finished plans with its next message,
   * in fast mode its next heartbeat, so one that died early in the episode
   * has most likely run the plans up to the marker, the last step's
   * tensors, without saying so: calling them "not finished" would name
   * tensors it never submitted in the step it died in. */
  char fast[512] = "", plans[1280] = "";
  if (e->fast && !s->escalated) {
    char waited[256] = "";
    size_t wmore = 0;
    for (size_t i = 0; i < s->nfast_pending; i++)
      gs__eng_append_name(waited, sizeof waited, s->fast_pending[i].name, &wmore);
    gs__eng_append_more(waited, sizeof waited, wmore);
    snprintf(fast, sizeof fast,
             "; it was in fast mode after plan %llu, where the ranks agree on cached tensors "
             "among themselves: gradsyncd does not know which of them it was reducing%s%s%s",
             (unsigned long long)e->fast_marker_seq,
             waited[0] ? " (it last reported waiting on [" : "", waited, waited[0] ? "])" : "");
    if (running[0])
      snprintf(plans, sizeof plans,
               "; plans up to %llu it had not reported finished, which it may well have run "
               "(ranks report finished plans with their next message): [%s]",
               (unsigned long long)e->fast_marker_seq, running);
  } else if (running[0]) {
    snprintf(plans, sizeof plans, "; scheduled but not finished by it: [%s]", running);
  }
  text[0] = 0;
  gs__eng_append(text, sizeof text, "rank %d (%s, pid %d) was lost: %s. Tensors in flight: %s",
                 rank, gs__eng_rank_host(e, rank), s->pid,
                 detail && *detail ? detail : "its session ended", names);
  gs__eng_append(text, sizeof text, "%s%s", fast, plans);
  gs__eng_append(text, sizeof text,
                 ". The job cannot continue without it: look at rank %d's log for why it "
                 "stopped, then restart the job",
                 rank);
  e->aborted = 1;
  e->ranks_lost++;
  gs__eng_out_event(box, GS__LOG_ERROR, GS__EV_RANK_LOST, rank, "%s", text);
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  if (!o) return;
  o->msg.kind = GS__MSG_ABORT;
  o->msg.status = GS__ERR_RANK_LOST;
  o->msg.text = strdup(text);
}

void gs__engine_session_closed(gs__engine *e, int32_t rank, const char *detail, uint64_t now_ms,
                               gs__outbox *box) {
  (void)now_ms;
  if (rank < 0 || rank >= e->world) return;
  rank_slot *s = &e->ranks[rank];
  if (s->state == RANK_JOINED) {
    /* Joined but never opened its session (the transport gave up waiting
     * for it): free the slot so that a restarted process may take it. */
    s->state = RANK_GONE;
    gs__eng_out_log(box, GS__LOG_WARN, "rank %d (%s:%d) was released: %s", rank,
                    gs__eng_rank_host(e, rank), s->pid,
                    detail && *detail ? detail : "it opened no session");
    gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
    if (o && gs__eng_world_status(e, &o->msg) != GS__OK) box->n--;
    return;
  }
  if (s->state != RANK_CONNECTED) return;
  gs__eng_lose_rank(e, rank, detail, box);
}
