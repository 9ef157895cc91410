/* Engine emission: when ready entries go out (adaptive or window policy),
 * how they fuse, and the numbered plans every rank runs in the same order.
 * Owns e->ready's draining, e->next_plan_seq and e->recent. Engine thread
 * only. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_layout.h"

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
           en->name, r, gs__eng_rank_host(e, r), e->ranks[r].pid);
  return msg;
}

/* Bytes every rank's rows of an allgather or alltoall add up to;
 * UINT64_MAX when that overflows 64 bits. */
static uint64_t gathered_bytes(const gs__engine *e, const entry *en) {
  const gs__tensor_request *r = &en->variants[0];
  uint64_t row = r->ndim > 1 ? gs__tensor_bytes(r->dtype, r->shape + 1, r->ndim - 1)
                             : gs__dtype_size(r->dtype);
  uint64_t rows = 0;
  for (int32_t q = 0; q < e->world; q++) rows = gs__add_sat(rows, (uint64_t)en->first_dims[q]);
  return gs__mul_sat(rows, row);
}

/* An allgather or alltoall whose gathered size overflows 64 bits: the
 * ranks' first dimensions are each valid but their sum is not. */
static int gather_overflows(const gs__engine *e, const entry *en) {
  const gs__tensor_request *r = &en->variants[0];
  return (r->op == GS__OP_ALLGATHER || r->op == GS__OP_ALLTOALL) && en->nvariants == 1 &&
         gathered_bytes(e, en) == UINT64_MAX;
}

static char *gather_overflow_message(const gs__engine *e, const entry *en) {
  char *msg = malloc(GS__MAX_TEXT);
  if (!msg) return NULL;
  int32_t big = 0;
  for (int32_t q = 1; q < e->world; q++)
    if (en->first_dims[q] > en->first_dims[big]) big = q;
  snprintf(msg, GS__MAX_TEXT,
           "tensor '%s': the %s of every rank's rows overflows 64 bits of bytes (rank %d (%s:%d) "
           "sent the largest first dimension, %lld); check the shapes each rank passes",
           en->name, gs__op_type_name(en->variants[0].op), big, gs__eng_rank_host(e, big),
           e->ranks[big].pid, (long long)en->first_dims[big]);
  return msg;
}

/* Turns one ready entry into a response (collective or error). */
static int entry_response(const gs__engine *e, const entry *en, gs__response *resp,
                          gs__eng_groups **groups) {
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
             en->name, gs__op_type_name(r->op), j, gs__eng_rank_host(e, j), e->ranks[j].pid,
             gs__op_type_name(r->op));
    return GS__OK;
  }
  if (en->nvariants > 1) {
    resp->kind = GS__RESP_ERROR;
    resp->error_status = GS__ERR_MISMATCH;
    resp->error_message = gs__eng_mismatch_message(e, en, groups);
    return resp->error_message ? GS__OK : GS__ERR_NO_MEMORY;
  }
  if (gather_overflows(e, en)) {
    resp->kind = GS__RESP_ERROR;
    resp->error_status = GS__ERR_INVALID_ARG;
    resp->error_message = gather_overflow_message(e, en);
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
         (en->count < e->world && en->variants[0].op != GS__OP_ALLREDUCE) ||
         gather_overflows(e, en);
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
  return gathered_bytes(e, en);
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

/* Emits one plan with every queued entry, in readiness order, fusing
 * compatible allreduces (and allgathers with allgathers) greedily up to the
 * fusion threshold. An entry that
 * cannot join the current response is skipped over (look-ahead) while the
 * skipped bytes stay within the threshold; it then starts a later response.
 * Errors, broadcasts, barriers and the rest are never fused. */
static void emit_ready(gs__engine *e, gs__outbox *box) {
  if (!e->nready) return;
  /* The plan is built in msg and put into its reserved slot at the end:
   * the log lines pushed meanwhile may move the outbox's items. */
  size_t slot = box->n;
  gs__out *o = gs__eng_out_push(box, GS__OUT_TO_ALL);
  gs__response *resps = calloc(e->nready, sizeof *resps);
  char *taken = calloc(e->nready, 1);
  if (!o || !resps || !taken) {
    free(resps);
    free(taken);
    if (o) box->n--;
    gs__eng_out_log(box, GS__LOG_ERROR, "out of memory building a plan of %zu tensors", e->nready);
    return;
  }
  uint64_t threshold = e->cfg.job.fusion_threshold_bytes;
  gs__plan_msg msg;
  memset(&msg, 0, sizeof msg);
  msg.kind = GS__MSG_PLAN;
  msg.plan.seq = e->next_plan_seq++;
  msg.plan.responses = resps;
  gs__eng_groups *groups = NULL; /* built by the first mismatched group's error */
  for (size_t i = 0; i < e->nready; i++) {
    if (taken[i]) continue;
    taken[i] = 1;
    entry *en = e->ready[i];
    gs__response *rp = &resps[msg.plan.nresponses];
    if (entry_response(e, en, rp, &groups) != GS__OK) {
      gs__response_free(rp);
      continue;
    }
    msg.plan.nresponses++;
    if (rp->kind == GS__RESP_ERROR) {
      e->mismatches++;
      gs__eng_out_event(box, GS__LOG_WARN, GS__EV_MISMATCH, -1, "%s", rp->error_message);
      continue;
    }
    e->tensors_planned++;
    if (!threshold || (rp->op != GS__OP_ALLREDUCE && rp->op != GS__OP_ALLGATHER)) continue;
    size_t align = gs__fusion_align(rp->device);
    uint64_t end = fused_bytes(e, en), skipped = 0;
    for (size_t j = i + 1; j < e->nready; j++) {
      if (taken[j]) continue;
      entry *c = e->ready[j];
      uint64_t cb = fused_bytes(e, c), c_end = gs__add_sat(gs__align_up(end, align), cb);
      if (fusable(e, en, c) && c_end <= threshold && append_tensor(e, rp, c) == GS__OK) {
        taken[j] = 1;
        end = c_end;
        e->tensors_planned++;
        continue;
      }
      skipped = gs__add_sat(skipped, cb);
      if (skipped > threshold) break;
    }
  }
  gs__eng_groups_free(groups);
  for (size_t i = 0; i < msg.plan.nresponses; i++) {
    gs__response *rp = &resps[i];
    if (rp->kind != GS__RESP_COLLECTIVE) continue;
    e->collectives++;
    for (size_t k = 0; k < rp->ntensors; k++) {
      entry *en = NULL;
      HASH_FIND_STR(e->table, rp->tensors[k].name, en);
      if (en) e->bytes_planned += en->bytes;
      if (en) rp->tensors[k].cache_id = gs__eng_cache_assign(e, &en->variants[0]);
    }
  }
  recent_plan *rp_rec = &e->recent[msg.plan.seq % RECENT_PLANS];
  rp_rec->seq = msg.plan.seq;
  rp_rec->names[0] = 0;
  rp_rec->nnames = rp_rec->nmore = 0;
  for (size_t i = 0; i < msg.plan.nresponses; i++)
    for (size_t k = 0; k < resps[i].ntensors; k++, rp_rec->nnames++)
      gs__eng_append_name(rp_rec->names, sizeof rp_rec->names, resps[i].tensors[k].name,
                          &rp_rec->nmore);
  if (e->thrash_pending) {
    e->thrash_pending = 0;
    gs__eng_out_log(
        box, GS__LOG_WARN,
        "the response cache (--cache-capacity %u) is smaller than the tensors of one step: "
        "it evicts entries the last plans used and will keep missing; raise "
        "--cache-capacity above the number of tensors per step",
        e->cfg.job.cache_capacity);
  }
  if (e->nevicted) {
    msg.plan.evicted = e->evicted;
    msg.plan.nevicted = e->nevicted;
    e->evicted = NULL;
    e->nevicted = e->evicted_cap = 0;
  }
  gs__eng_template_apply(e, &msg.plan);
  if (e->nforget) {
    msg.plan.forget_templates = e->forget;
    msg.plan.nforget = e->nforget;
    e->forget = NULL;
    e->nforget = e->forget_cap = 0;
  }
  for (size_t i = 0; i < e->nready; i++) {
    gs__eng_entry_drop(e, e->ready[i]);
  }
  free(taken);
  e->nready = 0;
  e->ready_bytes = 0;
  /* The plan that empties the table carries the fast path's marker (not
   * part of the template: a replay of it later need not). */
  if (gs__eng_fast_on_plan(e)) {
    msg.plan.fast_after = 1;
    gs__eng_fast_reg_acks(e, &msg.plan);
    gs__eng_fast_enter(e);
  }
  box->items[slot].msg = msg;
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
 * from tick. Errors and departures (force) go out at once, except in fast
 * mode, which holds everything. */
void gs__eng_maybe_emit(gs__engine *e, gs__outbox *box, int force) {
  /* Fast mode: the ranks may be running fast rounds; nothing goes out
   * until every connected rank escalated, errors included (all ranks must
   * see them at the same point). */
  if (!e->nready || e->fast) return;
  if (!force) {
    if (e->cfg.policy == GS__POLICY_WINDOW) return;
    uint64_t threshold = e->cfg.job.fusion_threshold_bytes;
    int room = plans_unfinished(e) <
               (uint64_t)(e->cfg.max_plans_in_flight > 0 ? e->cfg.max_plans_in_flight : 1);
    if (!room && threshold && e->ready_bytes < threshold) return;
  }
  emit_ready(e, box);
}
