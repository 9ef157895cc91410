/* The coordinator's engine: membership, the tensor table, validation and
 * the ordered plans. Pure C: no I/O, no gRPC or protobuf, no clock. Events
 * come in as calls with the current time as an argument; what to send comes
 * out in a gs__outbox, in the order it must be sent. The transport owns the
 * engine and calls it from its one completion-queue thread only.
 *
 * Ranks go NONE -> JOINED (Join RPC) -> CONNECTED (Session hello) -> LEFT
 * (leave message) or LOST (session ended without leaving). The world is
 * ready when every rank is CONNECTED; from then on every CONNECTED rank
 * receives every plan, numbered from 1.
 *
 * Fast path (issue 14): with fast_path on, a plan that leaves the table
 * empty (or an empty plan, when the table empties otherwise) carries
 * fast_after when the response cache holds an entry, every rank is
 * connected (none left, lost or in gs_join) and said in its hello that it
 * runs fast rounds, no timeline records and the coordinator is not
 * draining. The ranks then agree on cached requests
 * among themselves, and the engine emits no plan (requests are still
 * stored and validated) until every connected rank escalated
 * (RankMessage.escalate_round). A leave in fast mode counts the leaver as
 * escalated and sends the others FastStop{abort_round}; a timeline start
 * sends FastStop. No deadlock check runs in fast mode; the ranks' fast
 * reports and fast-pending ops feed GetStatus, ListPending and the stall
 * inspector. An episode that ended at its first fast round because a rank
 * brought an op the fast path cannot run (uncached, or not an allreduce,
 * broadcast, reducescatter or barrier) or a request sent before
 * the marker was a wasted round: from the second in a row the marker skips
 * the next 1, 2, 4 .. cfg.fast_backoff_max plans that empty the table, and
 * the count resets once an episode runs a round. */
#ifndef GS_SERVER_ENGINE_H
#define GS_SERVER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "diag_messages.h"
#include "messages.h"

typedef struct gs__engine gs__engine;

typedef enum gs__emit_policy { GS__POLICY_ADAPTIVE = 0, GS__POLICY_WINDOW = 1 } gs__emit_policy;

typedef struct gs__engine_config {
  int32_t world_size;              /* 0 = taken from the first rank that joins */
  char job_id[GS__MAX_JOB_ID + 1]; /* "" = accept any job id */
  gs__job_config job;              /* handed to every rank in JoinResponse; also
                                      the engine's stall, deadlock and liveness
                                      times (0 turns a check off) */
  int deadlock_warn_only;          /* 1: log a deadlock, do not abort */
  gs__emit_policy policy;          /* when ready tensors are emitted */
  int max_plans_in_flight;         /* adaptive policy (0 = 1) */
  uint32_t max_pending_per_rank;   /* tensors one rank may have pending (0 =
                                      GS__MAX_PENDING_DEFAULT); past it that
                                      rank's request fails, others unaffected.
                                      Also bounds the size of a group. */
  uint32_t epoch;                  /* the job's epoch, handed to every rank
                                      (0 = 1); gs__engine_reset sets the next */
  int fast_path;                   /* 1: send Plan.fast_after when the job may
                                      enter fast mode (gradsyncd --fast-path) */
  uint32_t fast_backoff_max;       /* the longest backoff of the marker, in plans
                                      that empty the table (--fast-path-backoff;
                                      0: never back off) */
} gs__engine_config;

#define GS__MAX_PENDING_DEFAULT 65536
/* A longest backoff of the fast path's marker, in plans that empty the
 * table (see above): --fast-path-backoff's default (common/settings.c). */
#define GS__FAST_BACKOFF_MAX 64

typedef enum gs__out_kind {
  GS__OUT_TO_ALL,     /* msg to every rank whose session is open */
  GS__OUT_TO_RANK,    /* msg to one rank */
  GS__OUT_LOG,        /* text for the coordinator's log at level */
  GS__OUT_CLOSE_RANK, /* end rank's session (it was declared lost); text says why */
} gs__out_kind;

typedef struct gs__out {
  gs__out_kind kind;
  int32_t rank;       /* TO_RANK */
  gs__plan_msg msg;   /* TO_ALL, TO_RANK: owned by the outbox */
  int level;          /* LOG: a gs__log_level; -1: an event only, not logged */
  char *text;         /* LOG: owned by the outbox */
  int event;          /* LOG: a gs__event_kind for watchers (GS__EV_NONE: none) */
  int32_t event_rank; /* LOG with event: the rank concerned, -1 when none */
} gs__out;

typedef struct gs__outbox {
  gs__out *items;
  size_t n, cap;
} gs__outbox;

/* Frees every item (and its message) and empties the box; keeps capacity. */
void gs__outbox_clear(gs__outbox *box);
/* Frees the box's storage too. */
void gs__outbox_free(gs__outbox *box);

/* Returns GS__OK and a new engine in *out, or GS__ERR_INVALID_ARG. */
int gs__engine_create(const gs__engine_config *cfg, gs__engine **out);
void gs__engine_destroy(gs__engine *e);

/* Forgets the job (ranks, tensors, cache, reports) and starts an empty one
 * with the same configuration and the given epoch; e stays valid. Returns
 * GS__OK, or GS__ERR_NO_MEMORY (then e is an empty job that knows no world
 * size yet, if the configuration fixed one). */
int gs__engine_reset(gs__engine *e, uint32_t epoch);

/* A rank asks to join. On GS__OK fills resp. Refusals:
 * GS__ERR_INVALID_ARG (size or rank out of range, size disagreeing with the
 * world) and GS__ERR_ALREADY_JOINED, each with a message in err. */
int gs__engine_join(gs__engine *e, const gs__join_request *req, uint64_t now_ms,
                    gs__join_response *resp, char *err, size_t errlen);

/* The Session stream of a joined rank said hello. GS__ERR_INVALID_ARG when
 * the rank did not join, GS__ERR_ALREADY_JOINED when it already has a
 * session (message in err). Emits the
 * world status (to all, ready once every rank is connected). */
int gs__engine_session_open(gs__engine *e, int32_t rank, uint64_t now_ms, gs__outbox *box,
                            char *err, size_t errlen);

/* A message on rank's session (the hello message too, after
 * gs__engine_session_open: its hello_fast_path says whether the rank runs
 * fast rounds; the marker goes out only when every rank's did). Emits
 * plans, errors and aborts. */
void gs__engine_rank_message(gs__engine *e, int32_t rank, const gs__rank_msg *msg, uint64_t now_ms,
                             gs__outbox *box);

/* rank's session ended (after a leave: a clean exit; otherwise the rank is
 * lost and every other rank is told). detail describes how it ended. For
 * a rank that joined but has no session yet this releases its slot (it
 * counts as gone and may join again). */
void gs__engine_session_closed(gs__engine *e, int32_t rank, const char *detail, uint64_t now_ms,
                               gs__outbox *box);

/* Periodic work; call at least every 100 ms:
 * - liveness: a connected rank silent for rank_timeout_ms is lost (its
 *   session is closed and every rank gets an abort naming it);
 * - stall inspector: every stall_warning_s, tensors waiting longer than
 *   that are logged grouped by missing rank; past stall_shutdown_s (if set)
 *   the job is aborted with that report;
 * - deadlock detector: every live rank blocked, nothing ready and no new
 *   request for deadlock_time_ms -> the wait-for report, as an abort
 *   (GS__ERR_DEADLOCK) or only a log line (deadlock_warn_only). */
void gs__engine_tick(gs__engine *e, uint64_t now_ms, gs__outbox *box);

/* A timeline started (recording = 1) or stopped (0). While one records no
 * fast_after is sent (the timeline must see every request); a start in
 * fast mode sends every rank FastStop{abort_round = false}. After a stop the
 * marker may go out with the next event or tick. */
void gs__engine_set_timeline(gs__engine *e, int recording, uint64_t now_ms, gs__outbox *box);
/* The coordinator is draining (SIGTERM): no fast_after from now on. */
void gs__engine_set_draining(gs__engine *e);

/* Read-only views for diagnostics and tests. */
typedef struct gs__engine_stats {
  int32_t world_size;
  int32_t joined, connected, left, lost;
  int world_ready;
  int aborted;
  uint64_t plans_emitted;
  uint64_t tensors_planned;
  size_t pending_tensors;
  uint64_t stall_reports, deadlocks;
  uint64_t cache_hits;    /* requests received as cache ids */
  uint64_t full_requests; /* requests received in full */
  size_t cache_entries;
  size_t local_names;      /* names registered local on some rank */
  uint64_t plans_replayed; /* plans sent as a template id */
  uint64_t collectives;    /* collective responses planned (a fused op counts once) */
  uint64_t bytes_planned;  /* bytes of the tensors planned (first request's size) */
  uint64_t mismatches;     /* error responses planned (mismatches, local conflicts) */
  uint64_t ranks_lost;     /* ranks declared lost */
  uint32_t epoch;
  int fast_mode;         /* a fast_after plan went out; not every rank escalated */
  uint64_t fast_entries; /* plans sent with fast_after */
  uint64_t fast_stops;   /* FastStop messages sent (one per event) */
  int fast_backoff;      /* backing off: no marker until fast_backoff_left more plans
                            that empty the table went out (see fast.c) */
  uint64_t fast_backoff_left;
  uint64_t fast_backoffs;    /* episodes wasted (escalated at their first round for an
                                op the fast path cannot run): each started a backoff */
  uint64_t fast_rounds;      /* the ranks' fast reports: the largest of each */
  uint64_t fast_tensors;     /*   counter over the ranks */
  uint64_t fast_collectives; /*   ... */
  uint64_t fast_bytes;       /*   ... */
  size_t fast_pending;       /* ops ranks in fast mode reported waiting on (distinct
                                names, none of them in pending_tensors) */
} gs__engine_stats;
void gs__engine_get_stats(const gs__engine *e, gs__engine_stats *out);

/* The latest stall and deadlock reports ("" if none); owned by the engine,
 * valid until its next event. */
const char *gs__engine_last_stall(const gs__engine *e);
const char *gs__engine_last_deadlock(const gs__engine *e);

/* ---- views for diagnostics (queue thread; results owned by the caller,
 * freed with their gs__diag_*_free) ------------------------------------- */

/* World, ranks and counters; leaves version, settings, uptime to the
 * caller. GS__OK or GS__ERR_NO_MEMORY. */
int gs__engine_status(const gs__engine *e, uint64_t now_ms, gs__diag_status *out);
/* Pending entries in arrival order, filtered and paged by q. */
int gs__engine_list_pending(const gs__engine *e, const gs__diag_pending_query *q, uint64_t now_ms,
                            gs__diag_pending_list *out);
/* Entries older than the stall warning time, and what every blocked rank
 * waits on (missing from whom), with the latest reports. */
int gs__engine_stalls(const gs__engine *e, uint64_t now_ms, gs__diag_stalls *out);
/* Local (model-parallel) names per rank, ranks without any left out. */
int gs__engine_locals(const gs__engine *e, gs__diag_locals *out);
/* The request behind a response-cache id a rank sent (NULL when unknown):
 * its name and op, for the timeline. Valid until the next event. */
const gs__tensor_request *gs__engine_cached_request(const gs__engine *e, uint32_t id);
/* An operator aborts the job: every rank gets GS__ERR_ABORTED with reason.
 * No-op when the job already ended. */
void gs__engine_abort(gs__engine *e, const char *reason, gs__outbox *box);

#endif
