/* Internal state of the worker library, shared by api.c (application
 * threads) and background.c (the background thread).
 *
 * Ownership and threads:
 * - ctx->mu guards the submission queue, the table of ops in flight (by
 *   name), every handle's completion fields and the context's fatal state.
 *   ctx->cv is broadcast whenever a handle completes.
 * - The client session, the backend and the plan queue belong to the
 *   background thread (gs_init's thread before it starts).
 * - A handle is reference-counted (atomically): one reference for the
 *   application, one for the library while the op is in flight. Its done
 *   flag is set with release order after status and error are written, so
 *   a completed handle can be read without the context.
 * - Fast mode (issue 14, worker/fast_round.c): between a plan marked
 *   fast_after and an escalation, submissions go to the fast queue (under
 *   mu) and the exec thread agrees on them with the other ranks over the
 *   data plane instead of asking the coordinator. */
#ifndef GS_WORKER_WORKER_H
#define GS_WORKER_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include <uthash.h>
/* Worker tables hash names 8 bytes at a time and compare them inline,
 * not with uthash's Jenkins hash (12 bytes per round of ~36 dependent
 * operations) and a memcmp call: a submission hashes its name once and
 * looks it up twice (ops in flight, the response cache): the hash went
 * from 60-88 to 42-52 cycles (rdtsc, timer included) of a submission of
 * ~250-400, names of 10-40 bytes. Every worker table uses these (the
 * macros are read where a table is used), so a hash value kept in one
 * table (the hashv of an op in flight) finds the name in another (the
 * response cache). */
static inline uint64_t gs__hash_bytes(uint64_t h, const void *key, size_t len) {
  const unsigned char *p = (const unsigned char *)key;
  for (; len >= 8; p += 8, len -= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  if (len) {
    uint64_t w = 0;
    unsigned s = 0;
    if (len & 4) {
      uint32_t x;
      memcpy(&x, p, 4);
      w = x;
      p += 4;
      s = 32;
    }
    if (len & 2) {
      uint16_t x;
      memcpy(&x, p, 2);
      w |= (uint64_t)x << s;
      p += 2;
      s += 16;
    }
    if (len & 1) w |= (uint64_t)*p << s;
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return h;
}
/* Every bit of h into every bit of the result (a table's low bits pick
 * the bucket). */
static inline uint64_t gs__hash_final(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}
static inline unsigned gs__name_hash(const void *key, size_t len) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)len * 0xff51afd7ed558ccdull);
  return (unsigned)gs__hash_final(gs__hash_bytes(h, key, len));
}
/* 0 when the n bytes of a and b are equal (uthash tests == 0 only). */
static inline int gs__key_differs(const void *a, const void *b, size_t n) {
  const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
  for (; n >= 8; p += 8, q += 8, n -= 8) {
    uint64_t x, y;
    memcpy(&x, p, 8);
    memcpy(&y, q, 8);
    if (x != y) return 1;
  }
  for (; n; n--)
    if (*p++ != *q++) return 1;
  return 0;
}
#undef HASH_FUNCTION
#undef HASH_KEYCMP
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = gs__name_hash((keyptr), (size_t)(keylen)))
#define HASH_KEYCMP(a, b, n) gs__key_differs((a), (b), (size_t)(n))
/* Tables start with 256 buckets, not uthash's 32 (it expands only once a
 * bucket holds 10): a step of a few hundred ops in flight, and the cache
 * of their names, are then found in about one look instead of a walk
 * along a chain of handles (a cache miss each) at every submission. The
 * macros are read where a table is made, so redefining them here holds
 * for every worker table. */
#undef HASH_INITIAL_NUM_BUCKETS
#undef HASH_INITIAL_NUM_BUCKETS_LOG2
#define HASH_INITIAL_NUM_BUCKETS 256U
#define HASH_INITIAL_NUM_BUCKETS_LOG2 8U

#include "backend.h"
#include "client.h"
#include "gradsync.h"
#include "messages.h"

/* How long a start of a persistent op waits for the library to let go of
 * its previous start (a plan or fast round that completed it, still
 * running other ops) before it is refused (api.c, start_wait_released). */
#define GS__START_HELD_MS 30000

/* The fields are ordered by who touches them when (the order is the
 * point; see gs__handle_mem and docs/design-notes.md, "A handle's cache
 * lines"). A step submits a few hundred ops, more handles than the L1
 * cache holds, and each line a submission writes is a line to fetch before
 * the lock's atomics can complete: a submission used to zero and fill all
 * 12 lines of a 744-byte handle. Now it writes the header (GS__HANDLE_HOT
 * bytes, 2 lines: what the submitting thread sets and the library's
 * threads read or change while the op is in flight, packed so that the
 * exec thread's snapshot and completion touch the first) and the request
 * as far as it is used (its name and its scalars plus shape: 2 lines for
 * names under 64 bytes). The cold fields between them (results, the
 * waited-on fields, the in-flight table's hh used only by names without a
 * cache entry, and what only some ops use) are zero whenever a block is
 * handed out:
 * the free of the previous handle, which reads them anyway, leaves them
 * so (gs__handle_mem_free). Blocks are 64-byte aligned. */
struct gs__wcache;
struct gs_handle {
  /* ---- line 0: the snapshot and completion of a fast round ---- */
  atomic_int refs;
  atomic_int done;
  gs_status status; /* valid once done */
  /* Fast mode (under mu): on the fast queue (ctx->fast_head, linked by
   * next_submit), its position in the fast vector (0 = not a cache hit
   * or not eligible: the round then escalates), its cache id (0 = none),
   * when it was submitted or moved there (fast_pending) and its order
   * among the fast queue's ops (escalation keeps submission order). */
  unsigned char fast;
  unsigned char planned; /* a plan names it (under mu) */
  unsigned char queued;  /* on the submission queue, not yet sent (under mu) */
  /* In the exec thread's fast round in progress, which reads it without
   * mu until the round ends: whoever completes it meanwhile leaves the
   * library's reference to the round, which releases it at its end
   * (fast_round.c, release_held_locked): no reference is taken per op
   * for the round (under mu). */
  unsigned char round;
  uint32_t fast_slot, fast_id;
  struct gs_handle *next_submit; /* submission queue (under mu) */
  size_t count;                  /* elements of send (allgather: of this rank's block) */
  const void *send;
  char *error; /* valid once done; NULL on success */
  /* In flight: the response-cache entry of its name, which lists it as
   * its op in flight (wc->inflight == this), or NULL: then it is in
   * ctx->inflight (see gs__inflight_add_locked). Under mu. */
  struct gs__wcache *wc;
  /* ---- line 1: the rest a submission sets ---- */
  gs_ctx *ctx;
  void *recv;
  uint64_t fast_since_ms, fast_seq;
  void *stream; /* caller's cudaStream_t (GPU buffers; NULL = default) */
  /* The name's length (gs__op_new) and hash (the submission's lookup,
   * submit_find_locked; a persistent op's at gs_allreduce_init): a name's
   * hash is the same in every worker table, so it finds the name in the
   * response cache and in ctx->inflight. */
  unsigned name_len, hashv;
  int compress;   /* float32 buffers, req.dtype on the wire */
  int persistent; /* gs_allreduce_init: started again and again (immutable) */
  /* Optional step run by the exec thread when the collective succeeded,
   * before the handle completes (e.g. unpacking a sparse result); a
   * non-zero return fails the op with that status and err. */
  int (*finish)(struct gs_handle *h, char *err, size_t errlen);
  /* ---- cold: zero in a block handed out (gs__handle_mem_free leaves them
   * so); set only by the ops that use them ---- */
  /* Deadlock detection (under mu). Blocked-since belongs to the op, not to
   * one call: wait_since_ms is when an application thread first waited on
   * or tested it while pending (0 = never), wait_last_ms the last time one
   * did, nwaiting how many threads are inside a wait on it now. Such ops are
   * on ctx->waited (wprev/wnext) until they complete. */
  uint64_t wait_since_ms;
  struct gs_handle *wprev, *wnext;
  uint64_t wait_last_ms;
  int nwaiting;
  int join_last; /* join: the rank that joined last (valid once done) */
  /* allgather result, owned by the handle (valid once done) */
  void *result;
  size_t result_bytes;
  void (*result_free)(void *p); /* frees result (NULL = free()); set with result */
  int64_t *rank_dims;
  size_t nrank_dims;
  int64_t *splits; /* alltoall: rows this rank sends to each rank (size entries) */
  void *data;      /* owned by the handle; freed with free_data */
  void (*free_data)(void *data);
  /* ctx->inflight by name when wc is NULL (under mu; HASH_ADD sets it) */
  UT_hash_handle hh;
  /* ---- the op, immutable after submission; gs__op_new writes the name up
   * to its NUL and the shape up to ndim, nothing reads past them ---- */
  _Alignas(64) gs__tensor_request req;
};
/* The header gs__handle_mem zeroes, and the cold part the free of a block
 * zeroes (gs__handle_mem_free), before the request. */
#define GS__HANDLE_HOT offsetof(struct gs_handle, wait_since_ms)
#define GS__HANDLE_HEADER offsetof(struct gs_handle, req)
_Static_assert(GS__HANDLE_HOT == 128, "the handle's hot fields are its first 2 cache lines");
_Static_assert(GS__HANDLE_HEADER % 64 == 0, "the request starts a cache line");
_Static_assert(offsetof(struct gs_handle, nwaiting) < GS__HANDLE_HOT + 64,
               "the waited-on fields are in the first cold line (handle_cache.c, cold_zero)");

typedef struct plan_node {
  gs__plan plan;
  /* This rank's ops the plan names, tensor after tensor over all its
   * responses (ops[base + k] for tensor k of a response, base counting the
   * tensors of the responses before it): looked up by name once, by the
   * comm thread when the plan arrives (ctx->inflight, under mu), so the
   * exec thread walks no table. NULL where the name was not in flight then
   * (a rank that joined contributes zeros). Each entry holds a reference to
   * its handle until the node is freed (gs__plan_node_free): a handle
   * failed with the job meanwhile and freed by the application stays
   * readable to the exec thread; it checks done before using one. */
  struct gs_handle **ops;
  size_t nops;
  struct plan_node *next;
} plan_node;

/* Frees a plan node: its plan and its references to the ops (any thread,
 * without ctx->mu). */
void gs__plan_node_free(plan_node *n);

/* The worker's copy of the coordinator's response cache (changed by the comm
 * thread, read by whichever thread sends requests; under ctx->mu).
 * Entries are made and freed only by cache_put and cache_drop
 * (background.c), 64-byte aligned. The first line is what a submission
 * whose name was predicted reads and writes (the prediction, the op in
 * flight, the id and slot, the name's length and hash); the request, a
 * line apart, gives the name (1 line for names under 64 bytes) and the
 * scalars and shape a fast-mode hit compares (1 line at ndim 1). */
typedef struct gs__wcache {
  /* ---- line 0 ---- */
  /* Sequence prediction (submit_find_locked in api.c; docs/design-notes.md,
   * "A submission predicts its name's cache entry"): the entry whose name
   * was submitted right after this one's the last time (seq_next), and the
   * entry whose seq_next this is (seq_prev): the links are pairs, so that
   * cache_drop unlinks both sides and no entry ever points to a freed one
   * (gs__wcache_link; cache_drop in background.c). */
  struct gs__wcache *seq_next, *seq_prev;
  /* The op of this name in flight on this rank (its wc is this entry), or
   * NULL: an op in flight whose name has an entry is listed here, never
   * in ctx->inflight (see gs__inflight_add_locked). */
  struct gs_handle *inflight;
  uint32_t id;
  uint32_t slot;     /* 1 + its index among the live ids (ctx->live); 0 = none */
  unsigned name_len; /* strlen(req.name), as hh_name.keylen */
  unsigned hashv;    /* the name's hash, as hh_name.hashv */
  UT_hash_handle hh_name;
  UT_hash_handle hh_id;
  _Alignas(64) gs__tensor_request req;
} gs__wcache;

/* Makes b the entry predicted after a (caller holds ctx->mu): each entry
 * is the seq_next of at most one entry, its seq_prev, so both sides of a
 * link are known and cache_drop clears them. */
static inline void gs__wcache_link(gs__wcache *a, gs__wcache *b) {
  if (a->seq_next) a->seq_next->seq_prev = NULL;
  if (b->seq_prev) b->seq_prev->seq_next = NULL;
  a->seq_next = b;
  b->seq_prev = a;
}

/* A live cache id and what its response says about riding in a fast
 * round's agreement (fast_round.c). Taken from the plan that assigned the
 * id, so the same on every rank whichever tensors it held (the worker's
 * cache copy is not: it holds only this rank's requests). */
typedef struct gs__live_info {
  uint32_t id;
  uint32_t ride_bytes; /* a host float32 SUM/AVERAGE allreduce of these bytes;
                          UINT32_MAX: cannot ride */
  gs__reduce_op op;
  double prescale, postscale;
} gs__live_info;

/* A plan template the coordinator defined (comm thread). */
typedef struct gs__wtemplate {
  uint32_t id;
  gs__plan plan; /* responses only */
  UT_hash_handle hh;
} gs__wtemplate;

/* A name registered local on this rank (under mu). */
typedef struct gs__local {
  char name[GS__MAX_NAME + 1];
  UT_hash_handle hh;
} gs__local;

/* An application thread inside gs_wait / gs_wait_any (under mu). */
typedef struct gs__waiter {
  struct gs_handle *const *hs;
  size_t n;
  struct gs__waiter *next;
} gs__waiter;

struct gs_ctx {
  int rank, size, local_rank, local_size;
  /* gs__fork_gen and getpid() at gs_init (fork.c): a child of a fork has
   * a copy of this struct but none of its threads. Set before any other
   * thread can see ctx, never written again. */
  unsigned fork_gen;
  int pid;
  char coordinator[512];
  char host[256];
  gs__join_response join;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct gs_handle *sub_head, *sub_tail; /* submitted, not yet sent */
  /* Ops submitted, not completed, by name, whose name has no entry in the
   * response-cache copy (those are listed in their entry: see
   * gs__inflight_add_locked). */
  struct gs_handle *inflight;
  size_t nunplanned; /* of those, how many no plan has named yet */
  int stop;          /* gs_shutdown asked the loop to end */
  gs_status fatal;   /* set once: every op fails with it */
  char fatal_msg[4096];
  gs__waiter *waiters;      /* threads blocked in a wait */
  struct gs_handle *waited; /* pending ops waited on or tested (see gs_handle) */
  /* plans handed from the comm thread to the exec thread */
  pthread_cond_t exec_cv;
  plan_node *plans_head, *plans_tail;
  int exec_stop;
  int exec_busy;        /* the exec thread is running a plan or a fast round */
  int exec_plan;        /* the exec thread is running a plan */
  uint64_t *done_plans; /* executed, not yet reported */
  size_t ndone, done_cap;
  gs_stats stats;           /* under mu */
  atomic_ulong barrier_seq; /* names the n-th barrier */
  int joined;               /* in gs_join: contribute zeros (under mu) */
  int scale_local;
  gs__local *locals; /* under mu */
  /* HASH_COUNT(locals), written under mu (release): gs_is_local skips the
   * lock and the name's hash while no name is local, on every submission. */
  atomic_size_t nlocals;
  /* Registrations not yet told to the coordinator (under mu). In fast
   * mode they are held for the escalation they force: see
   * gs__regs_due_locked. */
  char (*reg)[GS__MAX_NAME + 1], (*unreg)[GS__MAX_NAME + 1];
  size_t nreg, nunreg, reg_cap, unreg_cap;
  /* (Un)registrations sent so far (RankMessage.reg_seq), and how many of
   * them the coordinator acknowledged on a marker (Plan.reg_ack_*): fast
   * mode entered with some unacknowledged starts not clear (under mu). */
  uint64_t reg_sent, reg_acked;

  /* Waking the comm thread (under mu). It sleeps on the session's queue
   * until a message, a finished send, a kick or its own next due time
   * (comm_next_ms: a heartbeat or a change of the blocked-on set). Work for
   * it (a submission, a finished plan, a registration, stop, a failure)
   * kicks it only when it is idle: comm_running, no kick outstanding
   * (kicked) and no message in flight (comm_send_busy); while one is in
   * flight, work accumulates and goes out in one message when it completes
   * (Nagle's rule, not a clock). Submissions also need no kick while the
   * comm thread holds requests back for the coordinator's answer to the
   * last request message (comm_req_held; see send_cycle).
   *
   * Why no wake-up is lost: work is queued and the flags are read under mu,
   * and the comm thread reads the queues under mu after it last cleared a
   * flag, so work queued after that read always finds one of: kicked = 1
   * (one kick is outstanding: set only by the thread that then kicks,
   * cleared only after the comm thread consumed a kick and before it reads
   * the queues again; at most one is ever outstanding), comm_send_busy = 1
   * (the send's completion wakes it; cleared only when it saw the send
   * complete, again before reading the queues), comm_req_held = 1 (only
   * requests; it sleeps at most until the hold ends), or comm_running = 0
   * (the thread is ending: stop or failure). Besides, no sleep outlasts
   * the next heartbeat (or one second while a send is in flight).
   *
   * Where the comm thread would send at once (the stream idle, no request
   * message unanswered), a thread that starts waiting for an op the comm
   * thread has not taken yet writes the queued requests itself
   * (gs__requests_claim_locked): it sets comm_send_busy and app_sending
   * under mu, so the send's completion wakes the comm thread like one of
   * its own (which, kicked at submission, then finds the queue empty). */
  int comm_running, kicked, comm_send_busy, comm_req_held;
  /* An application thread claimed the idle stream for its submissions
   * (gs__requests_claim_locked) and is writing them; comm_send_busy is set
   * with it, so neither the comm thread nor another thread sends. */
  int app_sending;
  uint64_t comm_next_ms;
  /* comm thread (background.c): the session */
  pthread_t thread;
  int thread_started;
  gs__client *client;
  uint64_t last_send_ms;
  int req_unanswered;         /* a request message went out, nothing came back since (mu) */
  uint64_t req_hold_until_us; /* held requests go out by then at the latest (mu) */
  uint64_t blocked_sig;       /* the blocked-on set last reported */
  gs__wcache *cache_by_name, *cache_by_id;
  /* The cache entry the last submission of a cached name found (NULL:
   * none, or dropped since): its seq_next is the prediction for the next
   * submission (api.c, submit_find_locked). Under mu. */
  gs__wcache *seq_last;
  gs__wtemplate *templates;
  /* exec thread (executor.c): the backend */
  pthread_t exec_thread;
  int exec_started;
  /* One backend per device kind (from the factory): the TCP ring for host
   * buffers, always; NCCL for GPU buffers when selected. Each owns its
   * fusion staging. abort() may be called from the comm thread. */
  gs__backend *backends[GS__DEVICE_COUNT];
  int cuda_devices; /* CUDA devices seen at gs_init (0 = every buffer is host) */
  /* GRADSYNC_DETERMINISTIC, set at gs_init: no allreduce rides in a fast
   * round's agreement (fast_round.c). */
  int deterministic;

  /* ---- fast mode (issue 14; fast_round.c). Under mu unless noted. ----
   * The live cache ids, ascending: every id a plan assigned and no plan
   * evicted since, whether or not this rank held the tensor (so the list
   * is the same on every rank: it changes only through plans, which every
   * rank receives alike). A tensor's place in the fast vector is 1 + its
   * index here; live_dirty says the wcache slots need recomputing. Written
   * by the comm thread. */
  gs__live_info *live; /* nlive entries */
  size_t nlive, live_cap;
  int live_dirty;
  uint64_t live_gen; /* bumped each time the slots are recomputed */
  int live_oom;      /* the list missed an id (out of memory): the job fails */
  /* In fast mode: set by the comm thread when it queues a fast_after plan
   * (the exec thread still runs every plan before any round), cleared by
   * the exec thread when it escalates, or when the job fails. */
  int fast;
  /* Submissions in fast mode, in submission order (next_submit);
   * fast_seq numbers them. */
  struct gs_handle *fast_head, *fast_tail;
  size_t nfast;
  uint64_t fast_seq;
  /* Waking the exec thread for the fast queue (Nagle's rule, no timer).
   * exec_idle is set by the exec thread, under mu, only after it found no
   * work (no plan, no fast work) and right before it sleeps on exec_cv;
   * a submission that finds it set clears it and signals exec_cv. While
   * a round runs (exec_idle 0), submissions only accumulate and form the
   * next round.
   *
   * Why no wake-up is lost: the fast queue and exec_idle change only
   * under mu. The exec thread reads the queue under mu after its last
   * round and sets exec_idle in the same critical section in which it
   * starts to wait (pthread_cond_wait releases mu atomically), so a
   * submission made after that read finds exec_idle = 1 and signals a
   * thread already waiting; one made before it is seen by that read.
   * A submitter that finds exec_idle = 0 is either before that read or
   * after another submitter's signal, which wakes the thread to read the
   * queue again. FastStop, failure and stop wake it by broadcast.
   *
   * exec_bell counts work handed to the exec thread (bumped, only under mu,
   * with every fast-queue op, FastStop, plan, stop and failure: see
   * gs__exec_bell_locked): right after a fast round the thread looks at
   * it without mu for a moment, yielding, before it sleeps (executor.c,
   * EXEC_SPIN_US). Only a hint: the thread always takes mu and reads the
   * queues before it runs or sleeps, so the rule above still holds. */
  int exec_idle;
  atomic_uint exec_bell;
  /* A fast round is in progress (from its snapshot to the end of the
   * common set's collectives), on the exec thread or on an application
   * thread in a wait (gs__fast_round_caller), or parked: a FastStop with
   * abort_round aborts the backends only then, and no other round starts.
   * fast_parked: an application thread's round waits for the exec thread
   * to finish it (gs__fast_round_resume), before anything else. */
  int fast_in_round;
  int fast_parked;
  /* FastStop received for the current or a queued fast period: 1 = the
   * next round says "not clear", 2 = abort_round (a rank left: end the
   * round in progress, escalate at once). Reset by the escalation. */
  int fast_stop;
  char fast_stop_reason[256];
  /* FastStop with abort_round arrived during round fast_abort_round: the
   * comm thread aborts the backends at fast_abort_due_ms (0 = nothing
   * due) if that round is still running then. A round the leaver had
   * finished completes meanwhile; one it never joined cannot. */
  uint64_t fast_abort_round, fast_abort_due_ms;
  uint64_t fast_round;     /* fast rounds run since gs_init (the k of escalate_round) */
  uint64_t escalate_round; /* to send with the escalated requests (0 = none) */
  gs__fast_report fast_report, fast_report_sent; /* cumulative; the last sent */
  uint64_t fast_pending_sig; /* the fast_pending set last reported (comm thread) */
  void *fast_state;          /* the exec thread's round buffers (fast_round.c) */
};

/* Whether (un)registrations wait to be sent (caller holds ctx->mu). Not in
 * fast mode: users rely on "(un)register, barrier, then submit", and the
 * coordinator checks a request against the registrations it has at the
 * time. So in fast mode they go with the escalation, before its requests,
 * and a rank holding some is not clear in its next round: the barrier
 * after them goes through the coordinator, which plans it only once every
 * rank's message, registrations first, has arrived. */
static inline int gs__regs_due_locked(const gs_ctx *ctx) {
  return !ctx->fast && (ctx->nreg || ctx->nunreg);
}

/* Aborts every backend (any thread). */
void gs__ctx_abort_backends(gs_ctx *ctx);

/* background.c: an application thread waits on or tests pending op h at
 * now (caller holds ctx->mu): starts its blocked-since on the first time.
 * Returns 1 when the caller must call gs__comm_kick after unlocking (the
 * comm thread would not look at the blocked-on set in time otherwise). */
int gs__handle_waited_locked(gs_ctx *ctx, struct gs_handle *h, uint64_t now);
/* background.c: there is new work for the comm thread (caller holds
 * ctx->mu): requests (1) or anything else (0). Returns 1 when the caller
 * must call gs__comm_kick after unlocking: the comm thread is idle, no kick
 * is outstanding and it does not hold requests anyway. */
int gs__comm_wake_locked(gs_ctx *ctx, int requests);
/* Kicks the comm thread awake (any thread, without ctx->mu; only after
 * gs__comm_wake_locked or gs__handle_waited_locked returned 1). */
void gs__comm_kick(gs_ctx *ctx);
/* background.c: an application thread about to wait for an op still on the
 * submission queue (caller holds ctx->mu) takes the whole queue into *m and
 * claims the stream when the comm thread would send it at once anyway
 * (idle stream, no request message unanswered; a kick may be outstanding),
 * saving the hand-off to the comm thread. Returns 1 when it did: the caller
 * must then call gs__requests_send(ctx, m) after unlocking; 0 leaves
 * everything to the comm thread. */
int gs__requests_claim_locked(gs_ctx *ctx, gs__rank_msg *m);
/* Writes the claimed message (without ctx->mu), frees m's contents, and
 * releases the claim; a failure fails the job. */
void gs__requests_send(gs_ctx *ctx, gs__rank_msg *m);

/* fast_round.c (caller holds ctx->mu). A plan with fast_after was queued:
 * fast mode begins, the ops the comm thread has not taken move to the fast
 * queue. Comm thread. */
void gs__fast_enter_locked(gs_ctx *ctx);
/* Whether the exec thread has fast work: a round to run, or an escalation
 * to make at once (FastStop with abort_round). */
int gs__fast_work_locked(const gs_ctx *ctx);
/* Tells an exec thread that spins after a round that work came (see
 * exec_bell). Caller holds ctx->mu. */
static inline void gs__exec_bell_locked(gs_ctx *ctx) {
  /* Every writer holds mu, so a plain load and store, not a locked add:
   * this runs at every fast-mode submission, and a locked instruction
   * waits there for the handle's stores to drain (perf: 30 % of
   * gs__fast_queue_locked's samples were that add). */
  atomic_store_explicit(&ctx->exec_bell,
                        atomic_load_explicit(&ctx->exec_bell, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}
/* Runs one fast round, or escalates (exec thread, without ctx->mu); none
 * while another thread's round is in progress. */
void gs__fast_round(gs_ctx *ctx);
/* The same on an application thread inside a wait whose deadline is
 * deadline_ns (CLOCK_MONOTONIC; <= 0: none), where the host backend has
 * agree_until: returns 1 when the round is parked for the exec thread:
 * the deadline passed before every rank entered the agreement, or the
 * agreed round runs a plan (its collectives are the exec thread's: no
 * wait's deadline bounds them, and nccl's set the thread's device). */
int gs__fast_round_caller(gs_ctx *ctx, int64_t deadline_ns);
/* Finishes the parked round (exec thread, without ctx->mu). */
void gs__fast_round_resume(gs_ctx *ctx);
/* h's slot and cache id in a fast round, or 0 (caller holds ctx->mu). */
static inline void gs__fast_classify_locked(struct gs_handle *h) {
  const gs__tensor_request *r = &h->req;
  h->fast_slot = h->fast_id = 0;
  /* Only these run in a round; anything else (allgather, alltoall, join,
   * sparse as allgather) is for the coordinator. A barrier has its own
   * place in the vector (V[1]). A group member runs too: its cache entry
   * holds the group's id and size (a hash of the members' names in order,
   * the same every step), so it is a hit only when this call grouped the
   * same names in the same order; and a group is submitted in one call
   * (submit_many, under mu), so every snapshot holds all of a group or
   * none of it, and the MIN over ranks keeps it whole: all of its members
   * are in a round's common set or none. */
  if (r->op != GS__OP_ALLREDUCE && r->op != GS__OP_BROADCAST && r->op != GS__OP_REDUCESCATTER)
    return;
  /* Its name's cache entry, which lists it in flight (found at submission,
   * which compared the names): gs__inflight_find_locked. */
  const gs__wcache *c = h->wc;
  if (!c || !gs__tensor_request_equal_but_name_inline(&c->req, r)) return;
  h->fast_id = c->id;
  h->fast_slot = c->slot;
}

/* Puts h at the end of the fast queue, stamped now_ms, with its slot and
 * cache id (caller holds ctx->mu; h is in flight, so h->wc is its name's
 * cache entry, if any). Inline: every fast-mode submission. */
static inline void gs__fast_queue_locked(gs_ctx *ctx, struct gs_handle *h, uint64_t now_ms) {
  h->fast = 1;
  h->fast_seq = ++ctx->fast_seq;
  h->fast_since_ms = now_ms;
  gs__fast_classify_locked(h);
  if (ctx->fast_tail)
    ctx->fast_tail->next_submit = h;
  else
    ctx->fast_head = h;
  ctx->fast_tail = h;
  ctx->nfast++;
  gs__exec_bell_locked(ctx);
}

/* fast_round.c: a plan assigned / evicted cache id id (comm thread, caller
 * holds ctx->mu). Out of memory sets live_oom. */
void gs__live_add_locked(gs_ctx *ctx, uint32_t id, const gs__response *r, const gs__plan_tensor *t);
void gs__live_del_locked(gs_ctx *ctx, uint32_t id);
/* Frees the exec thread's round buffers (after the exec thread ended). */
void gs__fast_state_free(gs_ctx *ctx);
/* fast_round.c: a FastStop arrived (comm thread). */
void gs__fast_stop(gs_ctx *ctx, int abort_round, const char *reason);
/* fast_round.c: aborts the round a FastStop gave a grace period when that
 * passed by now (comm thread); returns when to check again (0 = never). */
uint64_t gs__fast_abort_check(gs_ctx *ctx, uint64_t now_ms);
/* executor.c: runs plan node n's responses in order (exec thread). */
int gs__run_plan(gs_ctx *ctx, const plan_node *n, char *err, size_t errlen);
/* executor.c: a data-plane failure: waits (bounded) for the coordinator's
 * verdict, a FastStop with abort_round, or stop. */
void gs__await_verdict(gs_ctx *ctx);

/* background.c: the comm thread */
void *gs__background_main(void *arg);
/* executor.c: the exec thread */
void *gs__executor_main(void *arg);
/* executor.c: plan seq was executed: counts it and keeps its number for the
 * next message to the coordinator (caller holds ctx->mu). */
void gs__plan_done_locked(gs_ctx *ctx, uint64_t seq);
/* Completes h with status and message (NULL = success); takes ctx->mu. */
void gs__handle_complete(gs_ctx *ctx, struct gs_handle *h, gs_status status, const char *msg);
/* Caller holds ctx->mu: h completes with GS_OK, and the caller wakes the
 * waiting threads (pthread_cond_broadcast of ctx->cv) after unlocking. */
void gs__handle_complete_ok_locked(gs_ctx *ctx, struct gs_handle *h);
/* Completes the n handles of hs with success (NULL entries skipped) under
 * one lock and one wake-up of the waiting threads; takes ctx->mu. The
 * handles may be freed by the time it returns. */
void gs__handles_complete_ok(gs_ctx *ctx, struct gs_handle *const *hs, size_t n);
/* The same, and releases `extra` references of the caller's to each
 * handle (also to one already complete) in the atomic that releases the
 * library's (unless it is in a fast round: see gs_handle.round): a fast
 * round hands the library's references of its riders over this way. */
void gs__handles_complete_ok_unref(gs_ctx *ctx, struct gs_handle *const *hs, size_t n, int extra);
/* The same without the lock (caller holds ctx->mu) and without the
 * wake-up (the caller broadcasts ctx->cv after unlocking). */
void gs__handles_complete_ok_unref_locked(gs_ctx *ctx, struct gs_handle *const *hs, size_t n,
                                          int extra);
/* Completes every op in flight and every later submission with status and
 * msg (the first call wins); takes ctx->mu. */
void gs__ctx_fail(gs_ctx *ctx, gs_status status, const char *msg);
/* Records a failed call's message for gs_last_error; returns status. */
gs_status gs__set_error(gs_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- fork (fork.c) ----
 * How many times this process's ancestry forked since the library was
 * loaded, as seen by this process: bumped by the pthread_atfork child
 * handler that gs__fork_watch installs (once per process, at the first
 * gs_init). A context whose fork_gen differs was made before a fork, in
 * another process: its threads, its lock's owner and its connections are
 * the parent's. */
extern atomic_uint gs__fork_gen;
/* Installs the atfork child handler (once; any thread; idempotent). */
void gs__fork_watch(void);
/* 1 when ctx was made in another process (the parent of a fork). One
 * relaxed load: cheap enough for every submission, and no syscall. Every
 * public entry that would lock ctx->mu, wait, or use its connections
 * checks this first. */
static inline int gs__forked(const gs_ctx *ctx) {
  return atomic_load_explicit(&gs__fork_gen, memory_order_relaxed) != ctx->fork_gen;
}
/* Records GS_ERR_FORKED's message for fn (tensor may be NULL) and returns
 * it. Touches nothing of ctx but its plain fields (rank, host, pid). */
gs_status gs__fork_error(const gs_ctx *ctx, const char *fn, const char *tensor);
/* Checks what every op shares (ctx, name, dtype, shape) and builds its
 * handle, not yet submitted (free it with free() if you do not submit). */
gs_status gs__op_new(gs_ctx *ctx, const char *name, gs__op_type op, gs_dtype dtype,
                     const int64_t *shape, int ndim, struct gs_handle **out);
/* gs__op_new, and the shape must hold exactly count elements. */
gs_status gs__op_new_counted(gs_ctx *ctx, const char *name, gs__op_type op, gs_dtype dtype,
                             const int64_t *shape, int ndim, size_t count, struct gs_handle **out);
/* Completes a handle that is never submitted (a local tensor, a pass that
 * does not communicate) with GS_OK; the caller holds its only reference. */
void gs__op_complete_unsubmitted(struct gs_handle *h);
/* Hands h to the background thread. On failure frees h (and its splits)
 * but not h->data: the caller still owns that. */
gs_status gs__op_submit(gs_ctx *ctx, struct gs_handle *h, gs_handle **out);

/* Frees the worker's response-cache copy (comm thread, or after it ended). */
void gs__cache_clear(gs_ctx *ctx);

/* The ops in flight, one per name (caller holds ctx->mu). An op whose
 * name has an entry in the response-cache copy (ctx->cache_by_name) is
 * listed in that entry (entry->inflight, h->wc), every other one in
 * ctx->inflight; entries come and go only under mu, and an op moves along
 * (background.c: cache_put lists the op in flight in a new entry of its
 * name, cache_drop puts it back in ctx->inflight). So a submission of a
 * cached name looks its name up once, in the cache, and that lookup is
 * both the duplicate check and, in fast mode, the cache hit; its
 * completion deletes nothing from a table; and ctx->inflight, empty in a
 * steady state, is not made and freed again every step.
 *
 * gs__inflight_find_locked: the op of the name in flight (NULL: none);
 * len and hashv are the name's length and hash (HASH_VALUE); *entry (entry
 * may be NULL) gets the name's cache entry (NULL: none). */
static inline struct gs_handle *gs__inflight_find_locked(gs_ctx *ctx, const char *name, size_t len,
                                                         unsigned hashv, gs__wcache **entry) {
  gs__wcache *c = NULL;
  struct gs_handle *h = NULL;
  HASH_FIND_BYHASHVALUE(hh_name, ctx->cache_by_name, name, len, hashv, c);
  if (entry) *entry = c;
  if (c) return c->inflight; /* a cached name's op is never in ctx->inflight */
  HASH_FIND_BYHASHVALUE(hh, ctx->inflight, name, len, hashv, h);
  return h;
}
/* The same for a NUL-terminated name, hashed here (the comm thread's plan
 * and error lookups, gs_register_local). */
static inline struct gs_handle *gs__inflight_find_str_locked(gs_ctx *ctx, const char *name) {
  size_t len = strlen(name);
  unsigned hv;
  HASH_VALUE(name, len, hv);
  return gs__inflight_find_locked(ctx, name, len, hv, NULL);
}
/* Lists h (hashv and name_len set; no op of its name in flight) in
 * entry, its name's cache entry as gs__inflight_find_locked gave it, or in
 * ctx->inflight when entry is NULL. */
static inline void gs__inflight_add_locked(gs_ctx *ctx, struct gs_handle *h, gs__wcache *entry) {
  if (entry) {
    entry->inflight = h;
    h->wc = entry;
    return;
  }
  HASH_ADD_KEYPTR_BYHASHVALUE(hh, ctx->inflight, h->req.name, h->name_len, h->hashv, h);
}
/* Takes h, listed by gs__inflight_add_locked, off the list. */
static inline void gs__inflight_del_locked(gs_ctx *ctx, struct gs_handle *h) {
  if (h->wc) {
    h->wc->inflight = NULL;
    h->wc = NULL;
    return;
  }
  HASH_DELETE(hh, ctx->inflight, h);
}
/* Checks where a buffer pair lives and that this rank has a backend for it
 * (recv may be NULL); sets h->req.device. */
gs_status gs__op_device(gs_ctx *ctx, struct gs_handle *h, const void *send, const void *recv);

/* GS_ERR_UNSUPPORTED naming what and the tensor when p is GPU memory (for
 * ops that read their buffers on the host). */
gs_status gs__host_only(gs_ctx *ctx, const void *p, const char *what, const char *name);

/* Copies a caller's options struct (src, of the type name) into dst, which
 * holds the defaults and whose struct_size is ours, honouring the
 * caller's struct_size. */
gs_status gs__opts_copy(void *dst, const void *src, const char *type);

/* Releases one reference of h; _n: n of them at once. */
void gs__handle_unref(struct gs_handle *h);
void gs__handle_unref_n(struct gs_handle *h, int n);
/* handle_cache.c: a block for a handle (NULL when out of memory), 64-byte
 * aligned, zero before its request (GS__HANDLE_HEADER bytes; the request
 * is gs__op_new's to write), and giving one back when its handle is freed
 * (NULL is a no-op); a block may also be given back with free(). Any
 * thread. */
void *gs__handle_mem(void);
void gs__handle_mem_free(void *p);

#endif
