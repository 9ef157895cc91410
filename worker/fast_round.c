/* The worker's fast path (issue 14): between a plan marked fast_after and
 * an escalation, the ranks agree among themselves, over the data plane, on
 * which of their cached requests to run, instead of asking the
 * coordinator for each step.
 *
 * A fast round, on the exec thread: snapshot the fast queue into a byte
 * vector V (V[0] = "clear": nothing here the coordinator must see; V[1] = a
 * barrier is pending; V[1 + s] = the cached op of slot s is queued), take
 * the MIN over ranks (agree), then run the common set -- the slots set on
 * every rank, in ascending cache id -- as a plan built here with the
 * engine's fusion rule, through the same executor code as the
 * coordinator's plans. Every rank sees the same V, so every rank takes the
 * same branch. A round that is not clear or has nothing in common (an
 * uncached op, a reordering, a desync, a deadlock, a FastStop) escalates:
 * fast mode ends and the whole fast queue goes to the coordinator, in
 * submission order, with escalate_round in the same message.
 *
 * Owns the exec thread's round buffers (fast_state, exec thread only);
 * the fast queue, the live cache ids and the fast flags are ctx's, under
 * ctx->mu (see worker.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "dtype.h"
#include "fusion_layout.h"
#include "handoff_trace.h"
#include "log.h"
#include "status.h"
#include "worker.h"

/* How long a round in progress may still complete after a FastStop with
 * abort_round (a rank left) before it is aborted: long enough for the
 * other ranks to finish a round the leaver had finished (they need no more
 * of it), short against a job that now fails. */
#define FAST_ABORT_GRACE_MS 1000

/* Riding (see ride_layout_locked): a cached float32 allreduce of at most
 * RIDE_OP_BYTES rides in the agreement, as long as the whole float32
 * vector (flags and riding data) stays within RIDE_VECTOR_BYTES: the TCP
 * ring moves an allreduce of up to 8 KiB as one chunk, one token round
 * the ring (ONE_CHUNK_BYTES in tcp_ring.c), and the shm transport one
 * rendezvous. ResNet-50 at --scale 1e9 (161 x 4 B): 1.3 KiB. */
#define RIDE_OP_BYTES 1024u
#define RIDE_VECTOR_BYTES 8192u
#define RIDE_NONE SIZE_MAX

/* A slot's place in the float32 vector's riding data, and its response's
 * reduction and scales (the same on every rank). */
typedef struct ride_slot {
  size_t off; /* first float after the flags; RIDE_NONE: does not ride */
  size_t n;   /* floats */
  gs__reduce_op op;
  double prescale, postscale;
} ride_slot;

/* Where a round an application thread handed to the exec thread stands
 * (gs__fast_round_caller parks it, gs__fast_round_resume finishes it). */
typedef enum park_state {
  PARK_NONE,         /* not parked */
  PARK_IN_BACKEND,   /* the wait's deadline passed: the backend's agree_resume */
  PARK_BEFORE_AGREE, /* the backend cannot park: the whole agree */
  PARK_AGREED,       /* agreed, with a plan: the rest (round_rest) */
} park_state;

/* The exec thread's buffers for one round, kept between rounds (grown,
 * never shrunk) so that a steady-state round allocates nothing. */
typedef struct fast_state {
  uint8_t *v; /* the fast vector: 2 + nlive bytes */
  size_t vcap;
  struct gs_handle **by_slot; /* this rank's queued op of each slot (1..nlive) */
  size_t slotcap;
  size_t *held_at; /* where by_slot[s] is in held */
  size_t heldatcap;
  /* The snapshot's ops, each marked round (the library's reference is the
   * round's to release: see gs_handle.round); NULL: a rider's, whose
   * reference complete_riders releases. */
  struct gs_handle **held;
  size_t nheld, heldcap;
  /* the common set and the plan built from it */
  const gs__tensor_request **reqs;
  struct gs_handle **common, **ops;
  size_t *order, *starts;
  unsigned char *taken;
  gs__plan_tensor *tensors;
  gs__response *resps;
  size_t commoncap;
  /* The plan built last (tensors, resps, order, starts above): the cache
   * ids of its common set in order, its responses and bytes, the fusion
   * threshold it used. A round whose common set is the same ids runs it
   * again with only its ops replaced: a cache id names one request for
   * good (ids are never reused), so the same ids give the same plan. The
   * usual steady state: every step the same tensors. */
  uint32_t *last_ids;
  size_t nlast, nlast_resp, lastcap;
  uint64_t last_bytes, last_threshold;
  int last_valid;
  /* Riding, for the live ids of generation ride_gen (ride_nlive slots):
   * ride[s] for slot s (see ride_slot), ride_floats the riding data's
   * length (0: nothing rides; the round agrees on the byte vector). */
  ride_slot *ride;
  size_t ridecap, ride_nlive, ride_floats;
  uint64_t ride_gen;
  int ride_valid;
  float *fv; /* the float32 vector: 2 + nlive flags, then the riding data */
  size_t fvcap;
  struct gs_handle **riders; /* this round's common riding ops */
  size_t nriders, riderscap;
  /* The round in progress, across its agreement: what the rest of the
   * round needs, kept here so that a round an application thread parked
   * (gs__fast_round_caller) is finished by the exec thread
   * (gs__fast_round_resume): see park_state. */
  uint64_t cur_k;
  size_t cur_n, cur_nlive, cur_nsnap;
  struct gs_handle *cur_barrier;
  void *cur_buf;
  size_t cur_count;
  gs__dtype cur_dt;
  gs__reduce_op cur_op;
  park_state cur_parked;
  char cur_first[GS__MAX_NAME + 1];
} fast_state;

/* Copies a rider's n floats (separate buffers): up to 16 bytes inline,
 * with no call (ResNet-50's control-only step: 4 bytes each, 161 ops,
 * twice per op: into the vector and out of it), else memcpy. */
static inline void copy_floats(void *dst, const void *src, size_t n) {
  size_t b = n * sizeof(float);
  if (b == 4) {
    uint32_t x;
    memcpy(&x, src, 4);
    memcpy(dst, &x, 4);
  } else if (b >= 8 && b <= 16) { /* two words, overlapping when b < 16 */
    uint64_t x, y;
    memcpy(&x, src, 8);
    memcpy(&y, (const char *)src + b - 8, 8);
    memcpy(dst, &x, 8);
    memcpy((char *)dst + b - 8, &y, 8);
  } else if (b) {
    memcpy(dst, src, b);
  }
}

/* ---- the live cache ids (comm thread writes, under mu) ------------------- */

static size_t live_find(const gs_ctx *ctx, uint32_t id) {
  size_t lo = 0, hi = ctx->nlive;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ctx->live[mid].id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Whether a response may ride in the agreement: an allreduce whose result
 * the float32 SUM of every rank's prescaled data gives exactly as the
 * executor would (the average's division and the postscale applied after
 * it, with the ring's finishing arithmetic), on host memory (GPU buffers
 * are never copied into the host vector); its bytes, or UINT32_MAX. */
static gs__live_info live_info_of(const gs__response *r, const gs__plan_tensor *t) {
  gs__live_info li = {0, UINT32_MAX, r->reduce_op, r->prescale, r->postscale};
  if (r->kind != GS__RESP_COLLECTIVE || r->op != GS__OP_ALLREDUCE || r->dtype != GS__FLOAT32 ||
      (r->reduce_op != GS__SUM && r->reduce_op != GS__AVERAGE) || r->device != GS__DEVICE_CPU)
    return li;
  uint64_t bytes = gs__tensor_bytes(r->dtype, t->shape, t->ndim);
  if (bytes <= RIDE_OP_BYTES) li.ride_bytes = (uint32_t)bytes;
  return li;
}

void gs__live_add_locked(gs_ctx *ctx, uint32_t id, const gs__response *r,
                         const gs__plan_tensor *t) {
  size_t at = ctx->nlive && ctx->live[ctx->nlive - 1].id < id ? ctx->nlive : live_find(ctx, id);
  if (at < ctx->nlive && ctx->live[at].id == id) return;
  if (ctx->nlive == ctx->live_cap) {
    size_t cap = ctx->live_cap ? ctx->live_cap * 2 : 256;
    gs__live_info *v = realloc(ctx->live, cap * sizeof *v);
    if (!v) {
      ctx->live_oom = 1;
      return;
    }
    ctx->live = v;
    ctx->live_cap = cap;
  }
  memmove(ctx->live + at + 1, ctx->live + at, (ctx->nlive - at) * sizeof *ctx->live);
  ctx->live[at] = live_info_of(r, t);
  ctx->live[at].id = id;
  ctx->nlive++;
  ctx->live_dirty = 1;
}

void gs__live_del_locked(gs_ctx *ctx, uint32_t id) {
  size_t at = live_find(ctx, id);
  if (at == ctx->nlive || ctx->live[at].id != id) return;
  memmove(ctx->live + at, ctx->live + at + 1, (ctx->nlive - at - 1) * sizeof *ctx->live);
  ctx->nlive--;
  ctx->live_dirty = 1;
}

/* ---- entering fast mode, submissions, FastStop ---------------------------- */

void gs__fast_enter_locked(gs_ctx *ctx) {
  if (ctx->live_dirty) {
    /* The slots follow the live ids, which only plans change: once per
     * fast period at most. */
    gs__wcache *c, *tmp;
    HASH_ITER(hh_id, ctx->cache_by_id, c, tmp) {
      size_t at = live_find(ctx, c->id);
      c->slot = at < ctx->nlive && ctx->live[at].id == c->id ? (uint32_t)at + 1 : 0;
    }
    ctx->live_dirty = 0;
    ctx->live_gen++;
  }
  ctx->fast = 1;
  /* Ops the comm thread has not sent go to the fast queue instead (it
   * takes them only under mu, so each is either sent or moved). */
  uint64_t now = gs__now_ms();
  for (struct gs_handle *h = ctx->sub_head, *next; h; h = next) {
    next = h->next_submit;
    h->next_submit = NULL;
    h->queued = 0;
    ctx->nunplanned--;
    gs__fast_queue_locked(ctx, h, now);
  }
  ctx->sub_head = ctx->sub_tail = NULL;
  /* Requests sent before the marker and not in any plan: the coordinator
   * holds them until every rank escalates, and this rank's application may
   * wait on them only, with nothing to start a round with while the others
   * wait in theirs. A round is due at once, and says "not clear". */
  if (ctx->nunplanned && !ctx->fast_stop) ctx->fast_stop = 1;
  gs__exec_bell_locked(ctx);
  if ((ctx->fast_head || ctx->fast_stop) && ctx->exec_idle) {
    ctx->exec_idle = 0;
    pthread_cond_signal(&ctx->exec_cv);
  }
}

int gs__fast_work_locked(const gs_ctx *ctx) {
  /* A FastStop makes a round due even with nothing queued: the other ranks
   * may be waiting in theirs (for one this rank, with nothing to submit
   * but a request the coordinator holds, would never start), and a round
   * that says "not clear" is how every rank leaves together. */
  return ctx->fast && !ctx->fatal && !ctx->stop && !ctx->exec_stop &&
         (ctx->fast_head || ctx->fast_stop);
}

void gs__fast_stop(gs_ctx *ctx, int abort_round, const char *reason) {
  pthread_mutex_lock(&ctx->mu);
  int applies = ctx->fast && !ctx->fatal;
  /* Worth a line only when a departure ends something this rank waits
   * for; a timeline start or a late request is routine (debug). */
  int affects = applies && abort_round && (ctx->fast_in_round || ctx->fast_head);
  if (applies) {
    int level = abort_round ? 2 : 1;
    if (level > ctx->fast_stop) {
      ctx->fast_stop = level;
      snprintf(ctx->fast_stop_reason, sizeof ctx->fast_stop_reason, "%s", reason);
    }
    if (abort_round) {
      /* A rank left. A round in progress completes if the leaver had
       * finished it (it left after its ops completed, and its part of the
       * collective is sent); if it never joined the round, the round can
       * never complete: the comm thread aborts it after a grace period
       * (gs__fast_abort_check). An idle exec thread escalates at once. */
      if (ctx->fast_in_round && !ctx->fast_abort_due_ms) {
        ctx->fast_abort_round = ctx->fast_round;
        ctx->fast_abort_due_ms = gs__now_ms() + FAST_ABORT_GRACE_MS;
      }
      pthread_cond_broadcast(&ctx->cv); /* an exec thread awaiting a verdict */
    }
    /* Idle: a round is due now (gs__fast_work_locked). */
    gs__exec_bell_locked(ctx);
    if (ctx->exec_idle) {
      ctx->exec_idle = 0;
      pthread_cond_signal(&ctx->exec_cv);
    }
  }
  pthread_mutex_unlock(&ctx->mu);
  if (affects)
    GS_LOG_INFO("the coordinator ends the fast path%s: %s",
                abort_round && ctx->fast_in_round ? " and the round in progress" : "", reason);
  else if (applies)
    GS_LOG_DEBUG("the coordinator ends the fast path: %s", reason);
}

uint64_t gs__fast_abort_check(gs_ctx *ctx, uint64_t now_ms) {
  /* Only the comm thread (this one) writes fast_abort_due_ms. */
  if (!ctx->fast_abort_due_ms) return 0;
  pthread_mutex_lock(&ctx->mu);
  uint64_t due = ctx->fast_abort_due_ms;
  if (due && (!ctx->fast_in_round || ctx->fast_round != ctx->fast_abort_round)) {
    due = ctx->fast_abort_due_ms = 0; /* the round ended by itself */
  } else if (due && now_ms >= due) {
    GS_LOG_INFO("fast round %llu still waits for a rank that left the job: ending it",
                (unsigned long long)ctx->fast_round);
    gs__ctx_abort_backends(ctx);
    due = ctx->fast_abort_due_ms = 0;
  }
  pthread_mutex_unlock(&ctx->mu);
  return due;
}

/* ---- escalation -------------------------------------------------------------- */

/* Leaves fast mode after round k: the fast queue goes, in submission
 * order, to the front of the submission queue, for the comm thread to send
 * with escalate_round = k in one message. Caller holds ctx->mu; returns 1
 * when the caller must kick the comm thread after unlocking. */
static int escalate_locked(gs_ctx *ctx, uint64_t k) {
  ctx->fast = 0;
  ctx->fast_stop = 0;
  size_t n = 0;
  for (struct gs_handle *h = ctx->fast_head; h; h = h->next_submit, n++) {
    h->fast = 0;
    h->queued = 1;
    ctx->nunplanned++;
  }
  if (ctx->fast_head) {
    /* (The submission queue is empty in fast mode; kept behind anyway.) */
    ctx->fast_tail->next_submit = ctx->sub_head;
    if (!ctx->sub_head) ctx->sub_tail = ctx->fast_tail;
    ctx->sub_head = ctx->fast_head;
  }
  ctx->fast_head = ctx->fast_tail = NULL;
  ctx->nfast = 0;
  ctx->escalate_round = k;
  ctx->stats.fast_escalations++;
  GS_LOG_DEBUG("fast round %llu: back to the coordinator with %zu op(s)", (unsigned long long)k, n);
  return gs__comm_wake_locked(ctx, 0);
}

/* Puts the ops of a failed round's common set that are still pending back
 * on the fast queue, in submission order (they are escalated next).
 * Caller holds ctx->mu. */
static void requeue_one_locked(gs_ctx *ctx, struct gs_handle *h) {
  if (!h || atomic_load_explicit(&h->done, memory_order_relaxed)) return;
  h->planned = 0;
  h->fast = 1;
  struct gs_handle **p = &ctx->fast_head;
  while (*p && (*p)->fast_seq < h->fast_seq) p = &(*p)->next_submit;
  h->next_submit = *p;
  *p = h;
  if (!h->next_submit) ctx->fast_tail = h;
  ctx->nfast++;
}

static void requeue_locked(gs_ctx *ctx, struct gs_handle *const *hs, size_t n,
                           struct gs_handle *barrier) {
  for (size_t i = 0; i < n; i++) requeue_one_locked(ctx, hs[i]);
  requeue_one_locked(ctx, barrier);
}

/* ---- a round ------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t want, size_t each) {
  if (want <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < want) c *= 2;
  void *np = realloc(*p, c * each);
  if (!np) return -1;
  *p = np;
  *cap = c;
  return 0;
}

static fast_state *state_of(gs_ctx *ctx) {
  if (!ctx->fast_state) ctx->fast_state = calloc(1, sizeof(fast_state));
  return ctx->fast_state;
}

void gs__fast_state_free(gs_ctx *ctx) {
  fast_state *st = ctx->fast_state;
  if (!st) return;
  free(st->v);
  free(st->by_slot);
  free(st->held_at);
  free(st->held);
  free(st->reqs);
  free(st->common);
  free(st->ops);
  free(st->order);
  free(st->starts);
  free(st->taken);
  free(st->tensors);
  free(st->resps);
  free(st->last_ids);
  free(st->ride);
  free(st->fv);
  free(st->riders);
  free(st);
  ctx->fast_state = NULL;
}

static int common_room(fast_state *st, size_t n) {
  if (n <= st->commoncap) return 0;
  size_t c = st->commoncap ? st->commoncap : 64;
  while (c < n) c *= 2;
  const gs__tensor_request **reqs = realloc(st->reqs, c * sizeof *reqs);
  if (reqs) st->reqs = reqs;
  struct gs_handle **common = realloc(st->common, c * sizeof *common);
  if (common) st->common = common;
  struct gs_handle **ops = realloc(st->ops, c * sizeof *ops);
  if (ops) st->ops = ops;
  size_t *order = realloc(st->order, c * sizeof *order);
  if (order) st->order = order;
  size_t *starts = realloc(st->starts, (c + 1) * sizeof *starts);
  if (starts) st->starts = starts;
  unsigned char *taken = realloc(st->taken, c);
  if (taken) st->taken = taken;
  gs__plan_tensor *tensors = realloc(st->tensors, c * sizeof *tensors);
  if (tensors) st->tensors = tensors;
  gs__response *resps = realloc(st->resps, c * sizeof *resps);
  if (resps) st->resps = resps;
  st->last_valid = 0; /* resps point into tensors, which may have moved */
  if (!reqs || !common || !ops || !order || !starts || !taken || !tensors || !resps) return -1;
  st->commoncap = c;
  return 0;
}

/* The round ends for its snapshot's ops (caller holds ctx->mu): those
 * completed meanwhile (by the round or another thread) left the library's
 * reference to it; the others (queued still) are the library's again. */
static void release_held_locked(fast_state *st) {
  for (size_t i = 0; i < st->nheld; i++) {
    struct gs_handle *h = st->held[i];
    if (!h) continue;
    if (atomic_load_explicit(&h->done, memory_order_relaxed))
      gs__handle_unref(h);
    else
      h->round = 0;
  }
  st->nheld = 0;
}

/* "tensor 'a' and 3 other op(s) of fast round k (rank r on host): ..." for a
 * round that failed; keeps an abort an abort. */
static int round_error(gs_ctx *ctx, uint64_t k, const char *name, size_t others, int rc, char *err,
                       size_t errlen) {
  if (rc == GS__ERR_NO_MEMORY || rc == GS__ERR_INTERNAL) return rc;
  char *detail = strdup(err);
  char more[64] = "";
  if (others) snprintf(more, sizeof more, " and %zu other op(s)", others);
  snprintf(err, errlen,
           "tensor '%s'%s of fast round %llu (rank %d on %s, agreeing with the other ranks over "
           "the data plane): %s",
           name, more, (unsigned long long)k, ctx->rank, ctx->host,
           detail ? detail : "data-plane failure");
  free(detail);
  return rc == GS__ERR_ABORTED ? GS__ERR_ABORTED : GS__ERR_DATA_PLANE;
}

/* A round failed with rc (message in err): after a FastStop with
 * abort_round it escalates (the coordinator then fails the ops with its
 * "rank r left" text); at shutdown the ops fail with gs_shutdown's text;
 * otherwise the job fails, as when a plan fails. Releases the snapshot. */
static void round_failed(gs_ctx *ctx, fast_state *st, uint64_t k, int rc, char *err,
                         struct gs_handle *const *common, size_t ncommon,
                         struct gs_handle *barrier) {
  if (rc == GS__ERR_DATA_PLANE || rc == GS__ERR_ABORTED) gs__await_verdict(ctx);
  pthread_mutex_lock(&ctx->mu);
  ctx->fast_in_round = 0;
  int kick = 0, fail = 0;
  if (ctx->fatal || ctx->stop) {
    /* the job's failure or gs_shutdown fails the ops */
  } else if (ctx->fast_stop == 2) {
    requeue_locked(ctx, common, ncommon, barrier);
    kick = escalate_locked(ctx, k);
  } else {
    fail = 1;
  }
  release_held_locked(st);
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
  if (fail) {
    GS_LOG_ERROR("%s", err);
    gs__ctx_fail(ctx, (gs_status)rc, err);
  }
}

/* Counts a finished round (caller holds ctx->mu). */
static void count_round_locked(gs_ctx *ctx, size_t ncoll, size_t ntensors, uint64_t bytes) {
  ctx->fast_report.rounds++;
  ctx->fast_report.collectives += ncoll;
  ctx->fast_report.tensors += ntensors;
  ctx->fast_report.bytes += bytes;
  ctx->stats.fast_rounds++;
  ctx->stats.fast_tensors += ntensors;
}

/* Builds the plan of the common set (st->common, ncommon ops, ascending
 * cache id) into st->tensors / resps / order / starts / ops with the
 * engine's fusion rule, and remembers it for the next round (see
 * fast_state). Returns the number of responses; *bytes the set's bytes. */
static size_t build_plan(fast_state *st, size_t ncommon, uint64_t threshold, uint64_t *bytes) {
  size_t nresp = gs__fusion_group(st->reqs, ncommon, threshold, st->taken, st->order, st->starts);
  *bytes = 0;
  for (size_t i = 0; i < ncommon; i++) {
    const struct gs_handle *h = st->common[st->order[i]];
    gs__plan_tensor *t = &st->tensors[i];
    size_t len = strlen(h->req.name);
    memcpy(t->name, h->req.name, len + 1);
    t->ndim = h->req.ndim;
    memcpy(t->shape, h->req.shape, (size_t)h->req.ndim * sizeof *t->shape);
    t->nrank_dims = 0;
    t->rank_dims = NULL;
    t->cache_id = h->fast_id;
    st->ops[i] = st->common[st->order[i]];
    *bytes += gs__tensor_bytes(h->req.dtype, h->req.shape, h->req.ndim);
  }
  for (size_t r = 0; r < nresp; r++) {
    const gs__tensor_request *q = &st->ops[st->starts[r]]->req;
    gs__response *rp = &st->resps[r];
    memset(rp, 0, sizeof *rp);
    rp->kind = GS__RESP_COLLECTIVE;
    rp->op = q->op;
    rp->dtype = q->dtype;
    rp->reduce_op = q->reduce_op;
    rp->prescale = q->prescale;
    rp->postscale = q->postscale;
    rp->root_rank = q->root_rank;
    rp->device = q->device;
    rp->ntensors = st->starts[r + 1] - st->starts[r];
    rp->tensors = &st->tensors[st->starts[r]];
  }
  st->last_valid = 0;
  if (!grow((void **)&st->last_ids, &st->lastcap, ncommon ? ncommon : 1, sizeof *st->last_ids)) {
    for (size_t i = 0; i < ncommon; i++) st->last_ids[i] = st->common[i]->fast_id;
    st->nlast = ncommon;
    st->nlast_resp = nresp;
    st->last_bytes = *bytes;
    st->last_threshold = threshold;
    st->last_valid = 1;
  }
  return nresp;
}

/* The riding slots of the live ids (caller holds ctx->mu): in slot order
 * (ascending cache id), each whose response may ride (live_info_of: at
 * most RIDE_OP_BYTES), while the vector stays within RIDE_VECTOR_BYTES.
 * Computed from the live ids and their responses alone, so identical on
 * every rank; copied here (the exec thread reads it without the mutex);
 * again only when the live ids changed. None in deterministic mode:
 * there every CPU allreduce reduces in rank order 0..n-1 wherever it
 * runs, which the agreement does not promise (the hierarchical transport
 * sums by host first), and a riding tensor's result must not depend on
 * whether it rode (an op that arrives before fast mode or after an
 * escalation runs in a plan). */
static int ride_layout_locked(gs_ctx *ctx, fast_state *st, size_t nlive) {
  if (st->ride_valid && st->ride_gen == ctx->live_gen && st->ride_nlive == nlive) return 0;
  if (grow((void **)&st->ride, &st->ridecap, nlive + 1, sizeof *st->ride)) return -1;
  size_t flags = 2 + nlive, total = 0;
  for (size_t s = 1; s <= nlive; s++) {
    const gs__live_info *li = &ctx->live[s - 1];
    ride_slot *rs = &st->ride[s];
    rs->off = RIDE_NONE;
    if (ctx->deterministic || li->ride_bytes == UINT32_MAX ||
        (flags + total) * sizeof(float) + li->ride_bytes > RIDE_VECTOR_BYTES)
      continue;
    rs->off = total;
    rs->n = li->ride_bytes / sizeof(float);
    rs->op = li->op;
    rs->prescale = li->prescale;
    rs->postscale = li->postscale;
    total += rs->n;
  }
  st->ride_floats = total;
  st->ride_nlive = nlive;
  st->ride_gen = ctx->live_gen;
  st->ride_valid = 1;
  return 0;
}

/* Finishes the round's common riding ops' (st->riders) sums in the
 * vector d (the data after the flags): the average's division and the
 * postscale as the ring finishes a reduction (gs__divide, then gs__scale). */
static void finish_vector(const gs_ctx *ctx, const fast_state *st, float *d) {
  /* The finish over runs of riders that lie back to back in the vector
   * with the same op and postscale (the usual step: every tensor alike),
   * one call per run rather than per tensor; element-wise, so the same
   * bits. Riders are in slot order, so their data in vector order. */
  for (size_t i = 0, j; i < st->nriders; i = j) {
    const ride_slot *a = &st->ride[st->riders[i]->fast_slot];
    size_t end = a->off + a->n;
    for (j = i + 1; j < st->nriders; j++) {
      const ride_slot *b = &st->ride[st->riders[j]->fast_slot];
      if (b->off != end || b->op != a->op || b->postscale != a->postscale) break;
      end += b->n;
    }
    float *res = d + a->off;
    if (a->op == GS__AVERAGE) gs__divide(res, end - a->off, GS__FLOAT32, ctx->size);
    if (a->postscale != 1.0) gs__scale(res, end - a->off, GS__FLOAT32, a->postscale);
  }
}

/* Completes the round's common riding ops (st->riders) from the summed
 * vector d, finished here (finish_vector), outside mu (a rider's finish
 * step). Releases each rider's library reference, which its completion
 * leaves to the round (it is taken off st->held). */
static void complete_riders(gs_ctx *ctx, fast_state *st, float *d, int wake) {
  finish_vector(ctx, st, d);
  for (size_t i = 0; i < st->nriders; i++) {
    struct gs_handle *h = st->riders[i];
    if (atomic_load_explicit(&h->done, memory_order_acquire)) { /* failed with the job */
      gs__handle_unref(h); /* the library's, left to the round */
      st->riders[i] = NULL;
      continue;
    }
    copy_floats(h->recv, d + st->ride[h->fast_slot].off, h->count);
    if (h->finish) {
      char err[1024];
      int rc = h->finish(h, err, sizeof err);
      gs__handle_complete(ctx, h, (gs_status)rc, rc ? err : NULL);
      gs__handle_unref(h);
      st->riders[i] = NULL;
    }
  }
  if (wake) {
    gs__handles_complete_ok_unref(ctx, st->riders, st->nriders, 1);
    return;
  }
  pthread_mutex_lock(&ctx->mu);
  gs__handles_complete_ok_unref_locked(ctx, st->riders, st->nriders, 1);
  pthread_mutex_unlock(&ctx->mu);
}

static void round_rest(gs_ctx *ctx, fast_state *st, int rc, char *err, size_t errlen);

/* Whether the agreed round (its vector as the agreement left it) has a
 * common op that does not ride: the round then runs a plan, collectives
 * of any size, which may wait on a peer up to the data-plane timeout. */
static int agreed_plan(const gs_ctx *ctx, const fast_state *st) {
  size_t nlive = st->cur_nlive;
  if (st->ride_floats) {
    const float *fv = st->fv, all = (float)ctx->size;
    if (fv[0] != all) return 0;
    for (size_t sl = 1; sl <= nlive; sl++)
      if (fv[1 + sl] == all && st->ride[sl].off == RIDE_NONE) return 1;
    return 0;
  }
  if (!st->v[0]) return 0;
  for (size_t sl = 1; sl <= nlive; sl++)
    if (st->v[1 + sl]) return 1;
  return 0;
}

/* A round: its snapshot and agreement, then round_rest. deadline_ns 0: on
 * the exec thread (no deadline); else an application thread's wait's
 * deadline (gs__fast_round_caller): returns 1 when the round is parked
 * for the exec thread, 0 when it ran (or none was due). */
static int fast_round(gs_ctx *ctx, int64_t deadline_ns) {
  char err[4096];
  pthread_mutex_lock(&ctx->mu);
  /* One round at a time: another thread's round runs or is parked. */
  if (!ctx->fast || ctx->fatal || ctx->fast_in_round) {
    pthread_mutex_unlock(&ctx->mu);
    return 0;
  }
  fast_state *st = state_of(ctx); /* under mu: two threads run rounds */
  if (ctx->fast_stop == 2) {
    /* A rank left: no round can complete any more. Back at once, as the
     * round this rank would have run next. */
    int kick = escalate_locked(ctx, ctx->fast_round + 1);
    pthread_mutex_unlock(&ctx->mu);
    if (kick) gs__comm_kick(ctx);
    return 0;
  }
  size_t nlive = ctx->nlive, n = 2 + nlive;
  if (!st || grow((void **)&st->v, &st->vcap, n, 1) ||
      grow((void **)&st->by_slot, &st->slotcap, nlive + 1, sizeof *st->by_slot) ||
      grow((void **)&st->held_at, &st->heldatcap, nlive + 1, sizeof *st->held_at) ||
      grow((void **)&st->held, &st->heldcap, ctx->nfast, sizeof *st->held) ||
      ride_layout_locked(ctx, st, nlive) ||
      grow((void **)&st->fv, &st->fvcap, st->ride_floats ? n + st->ride_floats : 1,
           sizeof *st->fv)) {
    pthread_mutex_unlock(&ctx->mu);
    gs__ctx_fail(ctx, GS_ERR_NO_MEMORY, "out of memory starting a fast round");
    return 0;
  }
  uint64_t k = ++ctx->fast_round;
  uint8_t *v = st->v;
  memset(v, 0, n);
  /* Clear unless the coordinator must see something of this rank: an op
   * that is not a cache hit or not eligible, a request it has not planned
   * yet, a FastStop, a cache changed by a plan in fast mode, or
   * (un)registrations it has not been told (held for the escalation: see
   * gs__regs_due_locked). */
  int clear = !ctx->nunplanned && !ctx->fast_stop && !ctx->live_dirty && !ctx->nreg && !ctx->nunreg;
  struct gs_handle *barrier = NULL;
  st->nheld = 0;
  /* With riding slots the vector is filled in this pass too (flags as
   * 1.0/0.0, see below, and each riding op's data), but for a prescaled
   * op (its copy may fail: after the unlock). */
  size_t nride = st->ride_floats, nf = n + nride;
  float *fv = st->fv, *data = fv + n;
  int scaled = 0;
  if (nride) memset(fv, 0, nf * sizeof *fv);
  for (struct gs_handle *h = ctx->fast_head; h; h = h->next_submit) {
    /* No reference per op (a locked add, 30 % of this function's samples):
     * the library's stays until the round ends (gs_handle.round). */
    h->round = 1;
    st->held[st->nheld++] = h;
    /* The slot first: a barrier has none (gs__fast_classify_locked), and the
     * request's line is read only for ops without one. */
    if (!h->fast_slot || h->fast_slot > nlive) {
      if (h->req.op == GS__OP_BARRIER) {
        if (!barrier) barrier = h; /* the oldest; later ones wait for later rounds */
        continue;
      }
      clear = 0;
      continue;
    }
    if (st->ride_floats && st->ride[h->fast_slot].off != RIDE_NONE &&
        (h->count != st->ride[h->fast_slot].n || h->compress)) {
      clear = 0; /* not what its response says (cannot happen): the coordinator decides */
      continue;
    }
    v[1 + h->fast_slot] = 1;
    st->by_slot[h->fast_slot] = h;
    st->held_at[h->fast_slot] = st->nheld - 1;
    if (nride) {
      const ride_slot *rs = &st->ride[h->fast_slot];
      fv[1 + h->fast_slot] = 1.0f;
      if (rs->off == RIDE_NONE) continue;
      if (rs->prescale == 1.0)
        copy_floats(data + rs->off, h->send, rs->n);
      else
        scaled = 1;
    }
  }
  v[0] = (uint8_t)clear;
  v[1] = barrier != NULL;
  if (nride) {
    fv[0] = v[0] ? 1.0f : 0.0f;
    fv[1] = v[1] ? 1.0f : 0.0f;
  }
  const char *first = ctx->fast_head ? ctx->fast_head->req.name : "(none)";
  snprintf(st->cur_first, sizeof st->cur_first, "%s", first);
  size_t nsnap = st->nheld;
  st->cur_k = k;
  st->cur_n = n;
  st->cur_nlive = nlive;
  st->cur_nsnap = nsnap;
  st->cur_barrier = barrier;
  st->cur_parked = PARK_NONE;
  ctx->fast_in_round = 1;
  pthread_mutex_unlock(&ctx->mu);
  GS_TRACE(GS__TR_FAST_START, k, nsnap);

  /* One exchange: with riding slots, the flags go as 1.0/0.0 in a float32
   * SUM (set on every rank iff the sum is the job's size: exact, far below
   * 2^24) followed by each riding slot's data, this rank's op's prescaled
   * (as the executor packs it) or zeros. A common riding op's result is
   * then complete; the sums of the others are dropped (they stay queued). */
  int rc;
  if (nride) {
    for (size_t sl = 1; scaled && sl <= nlive; sl++) {
      const ride_slot *rs = &st->ride[sl];
      if (!v[1 + sl] || rs->off == RIDE_NONE || rs->prescale == 1.0) continue;
      const struct gs_handle *h = st->by_slot[sl];
      gs__copy cp = {h->send, data + rs->off, rs->n, GS__FLOAT32, GS__FLOAT32, rs->prescale};
      if ((rc = gs__host_copy(&cp, 1, err, sizeof err))) {
        rc = round_error(ctx, k, h->req.name, 0, rc, err, sizeof err);
        round_failed(ctx, st, k, rc, err, NULL, 0, NULL);
        return 0;
      }
    }
    st->cur_buf = fv;
    st->cur_count = nf;
    st->cur_dt = GS__FLOAT32;
    st->cur_op = GS__SUM;
  } else {
    st->cur_buf = v;
    st->cur_count = n;
    st->cur_dt = GS__UINT8;
    st->cur_op = GS__MIN;
  }
  gs__backend *b = ctx->backends[GS__DEVICE_CPU];
  if (deadline_ns) {
    rc = b->v->agree_until(b, st->cur_buf, st->cur_count, st->cur_dt, st->cur_op, deadline_ns, err,
                           sizeof err);
    /* Agreed, with a plan to run: the plan's collectives are not bounded
     * by a wait's deadline (gs_wait(h, 1) on a 128 MiB op returned GS_OK
     * after 166 ms; a peer stalled inside one held it up to the data-plane
     * timeout, and Python's synchronize() slices with it), and on the
     * nccl backend they would set the application thread's CUDA device:
     * the exec thread runs the rest, for every wait. Riders and the
     * barrier alone (the agreement finished them) stay on this thread. */
    int hand_rest = rc == GS__OK && agreed_plan(ctx, st);
    if (rc == GS__ERR_TIMEOUT || rc == GS__ERR_UNSUPPORTED || hand_rest) {
      /* The wait's deadline passed while a peer had not entered, or the
       * backend cannot park, or the rest is not this wait's to run: the
       * exec thread finishes the round (it still counts as in progress:
       * fast_in_round, for aborts). */
      pthread_mutex_lock(&ctx->mu);
      st->cur_parked = hand_rest               ? PARK_AGREED
                       : rc == GS__ERR_TIMEOUT ? PARK_IN_BACKEND
                                               : PARK_BEFORE_AGREE;
      ctx->fast_parked = 1;
      gs__exec_bell_locked(ctx);
      int wake = ctx->exec_idle;
      ctx->exec_idle = 0;
      pthread_mutex_unlock(&ctx->mu);
      if (wake) pthread_cond_signal(&ctx->exec_cv);
      GS_LOG_DEBUG("fast round %llu parked for the exec thread (%s)", (unsigned long long)k,
                   hand_rest               ? "agreed; its plan is not the timed wait's to run"
                   : rc == GS__ERR_TIMEOUT ? "the wait's deadline passed"
                                           : "no agree_until");
      return 1;
    }
  } else {
    rc = b->v->agree(b, st->cur_buf, st->cur_count, st->cur_dt, st->cur_op, err, sizeof err);
  }
  round_rest(ctx, st, rc, err, sizeof err);
  return 0;
}

void gs__fast_round(gs_ctx *ctx) {
  (void)fast_round(ctx, 0);
}

int gs__fast_round_caller(gs_ctx *ctx, int64_t deadline_ns) {
  return fast_round(ctx, deadline_ns > 0 ? deadline_ns : INT64_MAX);
}

void gs__fast_round_resume(gs_ctx *ctx) {
  char err[4096];
  fast_state *st = ctx->fast_state;
  gs__backend *b = ctx->backends[GS__DEVICE_CPU];
  int rc =
      st->cur_parked == PARK_AGREED ? GS__OK
      : st->cur_parked == PARK_IN_BACKEND
          ? b->v->agree_resume(b, err, sizeof err)
          : b->v->agree(b, st->cur_buf, st->cur_count, st->cur_dt, st->cur_op, err, sizeof err);
  st->cur_parked = PARK_NONE;
  round_rest(ctx, st, rc, err, sizeof err);
}

/* The rest of a round from its agreement's return (rc): the common set,
 * the riders' results, the plan, the completions, the round's end. */
static void round_rest(gs_ctx *ctx, fast_state *st, int rc, char *err, size_t errlen) {
  uint64_t k = st->cur_k;
  size_t n = st->cur_n, nlive = st->cur_nlive, nsnap = st->cur_nsnap;
  struct gs_handle *barrier = st->cur_barrier;
  uint8_t *v = st->v;
  size_t nride = st->ride_floats;
  float *fv = st->fv, *data = fv + n;
  if (!rc && nride)
    for (size_t i = 0; i < n; i++) v[i] = fv[i] == (float)ctx->size;
  if (rc) {
    rc = round_error(ctx, k, st->cur_first, nsnap ? nsnap - 1 : 0, rc, err, errlen);
    round_failed(ctx, st, k, rc, err, NULL, 0, NULL);
    return;
  }
  /* The common set, ascending cache id (the slots' order). */
  size_t nall = 0;
  if (v[0])
    for (size_t sl = 1; sl <= nlive; sl++) nall += v[1 + sl];
  GS_TRACE(GS__TR_FAST_AGREED, k, nall + v[1]);
  if (!v[0] || (!nall && !v[1])) {
    pthread_mutex_lock(&ctx->mu);
    ctx->fast_in_round = 0;
    int kick = 0;
    if (!ctx->fatal && ctx->fast) kick = escalate_locked(ctx, k);
    release_held_locked(st);
    pthread_mutex_unlock(&ctx->mu);
    if (kick) gs__comm_kick(ctx);
    return;
  }
  if (common_room(st, nall ? nall : 1) ||
      grow((void **)&st->riders, &st->riderscap, nall ? nall : 1, sizeof *st->riders)) {
    snprintf(err, errlen, "out of memory running fast round %llu of %zu ops", (unsigned long long)k,
             nall);
    round_failed(ctx, st, k, GS__ERR_NO_MEMORY, err, NULL, 0, NULL);
    return;
  }
  pthread_mutex_lock(&ctx->mu);
  if (ctx->fatal) { /* the ops were failed with the job */
    ctx->fast_in_round = 0;
    release_held_locked(st);
    pthread_mutex_unlock(&ctx->mu);
    return;
  }
  size_t c = 0, taken = 0, nfinish = 0; /* taken: of the ops still queued */
  uint64_t ride_bytes = 0;
  st->nriders = 0;
  for (size_t sl = 1; sl <= nlive; sl++) {
    if (!v[1 + sl]) continue;
    struct gs_handle *h = st->by_slot[sl]; /* set here: common only if it was */
    taken += h->fast;
    if (nride && st->ride[sl].off != RIDE_NONE) {
      st->riders[st->nriders++] = h;
      st->held[st->held_at[sl]] = NULL; /* its completion releases it */
      ride_bytes += h->count * sizeof(float);
    } else {
      st->common[c] = h;
      st->reqs[c++] = &h->req;
    }
    h->fast = 0; /* leaves the queue below */
    h->planned = 1;
    nfinish += h->finish != NULL;
  }
  size_t ncommon = c, nriders = st->nriders;
  /* Riders (and a barrier) alone, the usual control-only step: their
   * results, completions and the round's end in this critical section,
   * in two passes over them (results, completions) rather than four, and
   * one lock rather than four; the waiters are woken after it (a woken
   * waiter finds no round in progress). Not with a rider that has a
   * finish step (it runs without mu) or a plan to run. */
  int fused = !ncommon && !nfinish;
  if (v[1]) {
    taken += barrier->fast;
    barrier->fast = 0;
    barrier->planned = 1;
  }
  /* Unlink the ops taken: all of the queue, the usual step (no walk along
   * it again under mu), or in one pass that keeps the rest in submission
   * order. */
  struct gs_handle **p = &ctx->fast_head;
  if (taken == ctx->nfast) {
    if (!fused) /* else in the results' pass below */
      for (size_t i = 0; i < st->nriders; i++) st->riders[i]->next_submit = NULL;
    for (size_t i = 0; i < c; i++) st->common[i]->next_submit = NULL;
    if (v[1]) barrier->next_submit = NULL;
    ctx->fast_head = NULL;
    ctx->nfast = 0;
  }
  ctx->fast_tail = NULL;
  while (*p) {
    struct gs_handle *h = *p;
    if (!h->fast) {
      *p = h->next_submit;
      h->next_submit = NULL;
      ctx->nfast--;
      continue;
    }
    ctx->fast_tail = h;
    p = &h->next_submit;
  }
  if (fused) {
    count_round_locked(ctx, nriders ? 1 : 0, nriders, ride_bytes);
    if (nriders) {
      ctx->stats.fast_ride_tensors += nriders;
      ctx->stats.collectives++;
      ctx->stats.tensors += nriders;
      if (nriders > 1) ctx->stats.fused_collectives++;
      finish_vector(ctx, st, data);
    }
    /* Off the queue now (a partial take's walk above unlinked them too);
     * a rider failed with the job keeps its buffers unread. */
    for (size_t i = 0; i < nriders; i++) {
      struct gs_handle *h = st->riders[i];
      h->next_submit = NULL;
      if (!atomic_load_explicit(&h->done, memory_order_acquire))
        copy_floats(h->recv, data + st->ride[h->fast_slot].off, h->count);
    }
    /* A completed rider's library reference, left to the round, goes with
     * its completion (or, failed meanwhile, alone): see complete_quiet. */
    gs__handles_complete_ok_unref_locked(ctx, st->riders, nriders, 1);
    GS_TRACE(GS__TR_FAST_END, k, 0);
    if (v[1]) gs__handle_complete_ok_locked(ctx, barrier);
    ctx->fast_in_round = 0;
    release_held_locked(st);
    pthread_mutex_unlock(&ctx->mu);
    pthread_cond_broadcast(&ctx->cv);
    return;
  }
  uint64_t threshold = ctx->join.config.fusion_threshold_bytes;
  pthread_mutex_unlock(&ctx->mu);

  /* The plan every rank builds alike from the same common set and cache,
   * or the last one again when the common set is the same ids. */
  int same = st->last_valid && st->nlast == ncommon && st->last_threshold == threshold;
  for (size_t i = 0; same && i < ncommon; i++) same = st->last_ids[i] == st->common[i]->fast_id;
  size_t nresp = 0;
  uint64_t bytes = 0;
  if (!ncommon) {
    /* riders or a barrier alone: no plan (and the last one stays) */
  } else if (same) {
    nresp = st->nlast_resp;
    bytes = st->last_bytes;
    for (size_t i = 0; i < ncommon; i++) st->ops[i] = st->common[st->order[i]];
  } else {
    nresp = build_plan(st, ncommon, threshold, &bytes);
  }
  /* Counted before the ops complete, so that a thread that waited for
   * them sees the round in gs_get_stats. The agreement that carried riders
   * counts as one collective (of them all) in both the fast report and the
   * stats, as a fused allreduce of them would. */
  pthread_mutex_lock(&ctx->mu);
  count_round_locked(ctx, nresp + (nriders ? 1 : 0), ncommon + nriders, bytes + ride_bytes);
  if (nriders) {
    ctx->stats.fast_ride_tensors += nriders;
    ctx->stats.collectives++;
    ctx->stats.tensors += nriders;
    if (nriders > 1) ctx->stats.fused_collectives++;
  }
  pthread_mutex_unlock(&ctx->mu);
  /* Riders alone (here: one with a finish step; the usual control-only
   * step ends above): their waiters are woken after the round's end,
   * below, so that a woken waiter finds no round in progress and may run
   * the next one itself (gs__fast_round_caller) rather than wait for this
   * thread to finish this one. */
  if (nriders) complete_riders(ctx, st, data, ncommon != 0);
  plan_node node;
  memset(&node, 0, sizeof node);
  node.plan.nresponses = nresp;
  node.plan.responses = st->resps;
  node.ops = st->ops;
  node.nops = ncommon;
  rc = ncommon ? gs__run_plan(ctx, &node, err, errlen) : GS__OK;
  if (rc) {
    round_failed(ctx, st, k, rc, err, st->common, ncommon, v[1] ? barrier : NULL);
    return;
  }
  GS_TRACE(GS__TR_FAST_END, k, 0);
  /* The oldest barrier (every rank had one pending) completes with the
   * round's end in one critical section, and its waiter is woken last,
   * after unlocking: on a cpu shared with the exec thread the woken
   * thread runs at once, and would otherwise find mu held (one more
   * sleep and wake-up each way) or the round still owing its end. */
  /* (Nothing of st is read after the unlock: another thread's round may
   * start at once.) */
  int wake = v[1] || (nriders && !ncommon);
  pthread_mutex_lock(&ctx->mu);
  if (v[1]) gs__handle_complete_ok_locked(ctx, barrier);
  ctx->fast_in_round = 0;
  release_held_locked(st);
  pthread_mutex_unlock(&ctx->mu);
  if (wake) pthread_cond_broadcast(&ctx->cv);
}
