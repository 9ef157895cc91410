/* Declarations shared by the engine's files (see engine.c for which file
 * owns what). Private to server/engine/: nothing outside includes it. Every
 * function here runs on the engine's (the transport's completion-queue)
 * thread only. */
#ifndef GS_SERVER_ENGINE_INTERNAL_H
#define GS_SERVER_ENGINE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

#include "dtype.h"
#include "engine.h"
#include "log.h"
#include "status.h"

/* GONE: connected, then disconnected before the world was ready; the slot
 * may be joined again. */
typedef enum {
  RANK_NONE = 0,
  RANK_JOINED,
  RANK_CONNECTED,
  RANK_LEFT,
  RANK_LOST,
  RANK_GONE
} rank_state;

typedef struct rank_slot {
  rank_state state;
  char host[GS__MAX_HOST + 1];
  int32_t pid;
  uint64_t joined_ms, last_msg_ms;
  uint64_t last_done_seq; /* highest plan it reported executed */
  int joined;             /* called gs_join: counts as ready for everything */
  uint32_t npending;      /* entries in the table it submitted */
  size_t nblocked;        /* names its application threads are blocked on */
  char (*blocked)[GS__MAX_NAME + 1];
  /* fast path (fast.c) */
  int fast_capable;     /* its hello said it runs fast rounds */
  int escalated;        /* in fast mode: it sent escalate_round */
  gs__fast_report fast; /* its latest cumulative report */
  size_t nfast_pending; /* ops it waits on in fast mode (<= GS__MAX_BLOCKED) */
  gs__fast_pending *fast_pending;
  uint64_t fast_pending_ms; /* when it reported them (their ages count from here) */
  /* Its (un)registrations applied (RankMessage.reg_seq), and the value
   * the last marker acknowledged (fast.c). */
  uint64_t reg_seq, reg_seq_told;
} rank_slot;

/* One tensor name waiting for every rank. Ranks whose requests differ from
 * the first get another variant; variant_of[r] is -1 until rank r submits. */
typedef struct entry {
  char name[GS__MAX_NAME + 1];
  UT_hash_handle hh;
  gs__tensor_request *variants;
  int32_t nvariants;
  int32_t *variant_of;
  /* When each variant arrived (e->next_order, as order): which of a group's
   * members a rank submitted first (groups_of in table.c). */
  uint64_t *variant_seq;
  int64_t *first_dims; /* allgather: each rank's first dimension */
  int32_t count;
  uint64_t first_ms;
  uint64_t order; /* arrival order, for stable reports */
  uint64_t bytes; /* of the first request */
  int queued;     /* ready, waiting in e->ready for emission */
  int in_group;   /* complete, waiting for the rest of its group */
} entry;

/* A name some ranks registered as local (model-parallel). */
typedef struct local_name {
  char name[GS__MAX_NAME + 1];
  char *ranks; /* world flags: registered it local */
  char *subs;  /* world flags: submitted it for a collective anyway */
  int32_t n;
  UT_hash_handle hh;
} local_name;

/* The members of a group that are complete so far. */
typedef struct group {
  uint64_t id;
  uint32_t size, n, cap;
  entry **members; /* the n members so far (cap allocated) */
  UT_hash_handle hh;
} group;

/* Response cache: a request negotiated once gets an id that ranks send
 * instead of the request. Live items are in both hashes and the LRU list;
 * evicted or invalidated ones stay a while as tombstones (by id only) so an
 * id a rank sent before it heard of the eviction still resolves. */
typedef struct cache_item {
  uint32_t id;
  uint64_t last_seq; /* the plan that last used it */
  gs__tensor_request req;
  UT_hash_handle hh_name, hh_id;
  struct cache_item *prev, *next; /* LRU (live) or FIFO (tombstones) */
} cache_item;

/* Plan templates: a plan whose responses repeat an earlier one's (the same
 * fused groups step after step) is sent as the template's id. LRU, with
 * evictions announced to the ranks in the next plan. */
#define PLAN_TEMPLATES 256
typedef struct plan_template {
  uint32_t id;
  uint64_t hash;
  gs__plan plan; /* responses only */
  UT_hash_handle hh;
  struct plan_template *prev, *next;
} plan_template;

/* The last plans emitted, for naming what a lost rank left unfinished. */
#define RECENT_PLANS 32
typedef struct recent_plan {
  uint64_t seq;
  char names[512]; /* "a, b, c": whole names, as many as fit */
  size_t nnames;   /* names in the plan */
  size_t nmore;    /* of them not in names */
} recent_plan;

struct gs__engine {
  gs__engine_config cfg;
  int32_t world;    /* 0 until known */
  rank_slot *ranks; /* world entries once known */
  int32_t nconnected;
  int world_ready;
  int aborted;
  int32_t left_rank; /* a rank that left the job (-1: none) */
  int32_t njoined, last_joined;
  group *groups;
  local_name *locals;
  entry *table; /* uthash by name */
  uint64_t next_order;
  uint64_t next_plan_seq;
  uint64_t tensors_planned;
  entry **ready; /* ready entries not yet emitted, in readiness order */
  size_t nready, ready_cap;
  uint64_t ready_bytes;
  uint64_t next_window_ms;   /* window policy: next emission */
  uint64_t ready_ms;         /* when the world became ready */
  uint64_t last_activity_ms; /* last new request (full or cache id) */
  int deadlock_reported;     /* this quiet episode was already reported */
  uint64_t next_stall_check_ms;
  uint64_t stall_reports, deadlocks;
  char *last_stall, *last_deadlock;
  /* response cache */
  cache_item *cache_by_name, *cache_by_id, *tomb_by_id;
  cache_item *lru_head, *lru_tail, *tomb_head, *tomb_tail;
  size_t ncache, ntomb;
  uint32_t next_cache_id;
  uint32_t *evicted; /* ids to announce in the next plan */
  size_t nevicted, evicted_cap;
  uint64_t cache_hits, full_requests;
  int cache_thrash_warned, thrash_pending;
  plan_template *templates, *tmpl_head, *tmpl_tail; /* by hash; LRU list */
  size_t ntemplates;
  uint32_t next_template_id;
  uint32_t *forget; /* template ids to announce in the next plan */
  size_t nforget, forget_cap;
  uint64_t plans_replayed;
  uint64_t collectives, bytes_planned, mismatches, ranks_lost;
  recent_plan recent[RECENT_PLANS];
  /* fast path (fast.c) */
  int fast;          /* a fast_after plan went out; not every connected rank escalated */
  int timeline;      /* a timeline records: no fast_after */
  int fast_recalled; /* this episode's FastStop for a late request went out */
  /* This episode's first escalation (rank -1: none yet), which every later
   * one must match, and the lowest rank that may still hold fast mode
   * open: ranks below it escalated or are gone, which within an episode
   * never reverts, so the exit check walks the world once per episode,
   * not once per escalation. */
  int32_t fast_first_rank, fast_cursor;
  uint64_t fast_first_round;
  /* The plan that carried this episode's marker: the last plan any rank
   * gets before it escalates (a lost rank's report, membership.c). */
  uint64_t fast_marker_seq;
  /* The backoff (fast.c): an episode that escalated at its first round
   * for an op the fast path cannot run was a wasted round; from the second
   * in a row (fast_backoff_level counts them) the marker waits for the next
   * 1, 2, 4 .. cfg.fast_backoff_max plans that empty the table
   * (fast_backoff_left of them still), and the count resets once an
   * episode runs a round. fast_base_round: the ranks' fast-round count
   * when this episode began (rounds count from the job's start, alike on
   * every rank). fast_op_*: this episode brought such an op (its name);
   * fast_told_stop: a timeline or a departure ended it (never counted). */
  uint64_t fast_base_round;
  int fast_op_escalated, fast_told_stop;
  char fast_op_name[GS__MAX_NAME + 1];
  int fast_backoff; /* backing off: the marker goes on a plan that empties the table only */
  uint32_t fast_backoff_level;
  uint64_t fast_backoff_left, fast_backoffs;
  char fast_backoff_name[GS__MAX_NAME + 1]; /* the op of the episode that started it */
  int draining;                             /* the coordinator is shutting down: no fast_after */
  int32_t ncapable; /* connected ranks whose hello said they run fast rounds */
  uint64_t fast_entries, fast_stops;
};

/* engine.c: outbox and text helpers */
/* Appends an item of kind (zeroed) and returns it; NULL when out of memory.
 * The pointer is valid only until the next push (the box may grow). */
gs__out *gs__eng_out_push(gs__outbox *box, gs__out_kind kind);
void gs__eng_out_log(gs__outbox *box, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A log line that is also an event for watchers (level -1: event only). */
void gs__eng_out_event(gs__outbox *box, int level, int event, int32_t rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Appends to buf (bounded, always NUL-terminated). */
void gs__eng_append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Name lists that end "x, y and 3 more" rather than in a cut name: appends
 * name to the ", "-separated list in buf when it fits whole with room left
 * for the ending, else (and after the first name that did not fit) counts it
 * in *more; gs__eng_append_more writes the ending. */
void gs__eng_append_name(char *buf, size_t cap, const char *name, size_t *more);
void gs__eng_append_more(char *buf, size_t cap, size_t more);
/* "[0,2,5-9]": ascending ranks, runs of three or more shortened. */
void gs__eng_format_ranks(const int32_t *ranks, size_t n, char *buf, size_t cap);
const char *gs__eng_rank_host(const gs__engine *e, int32_t r);

/* membership.c */
int gs__eng_set_world(gs__engine *e, int32_t size);
int gs__eng_world_status(const gs__engine *e, gs__plan_msg *m);
void gs__eng_abort_job(gs__engine *e, int status, const char *text, gs__outbox *box);
/* Marks a connected rank lost and tells everyone (see session_closed). */
void gs__eng_lose_rank(gs__engine *e, int32_t rank, const char *detail, gs__outbox *box);

/* table.c */
void gs__eng_entry_free(entry *en);
/* Removes en from the table, uncounts it from its submitters' pending
 * counts and frees it. */
void gs__eng_entry_drop(gs__engine *e, entry *en);
/* The per-rank pending limit in force. */
uint32_t gs__eng_max_pending(const gs__engine *e);
void gs__eng_rank_error(gs__outbox *box, int32_t rank, const char *name, int status,
                        const char *text);
/* The pending tensors of each group, built (into *groups, once per
 * emission: gs__eng_groups_free after it) when a mismatch error needs to
 * name a group's tensors. */
typedef struct gs__eng_groups gs__eng_groups;
void gs__eng_groups_free(gs__eng_groups *groups);
/* The one-line mismatch error of en (malloc'd; NULL when out of memory). */
char *gs__eng_mismatch_message(const gs__engine *e, const entry *en, gs__eng_groups **groups);
int gs__eng_mark_ready(gs__engine *e, entry *en);
/* Once a rank left nothing can complete: releases every group and queues
 * every pending entry (emitted as errors). */
void gs__eng_fail_pending(gs__engine *e);
void gs__eng_add_request(gs__engine *e, int32_t rank, const gs__tensor_request *r, uint64_t now_ms,
                         gs__outbox *box);
void gs__eng_register_local(gs__engine *e, int32_t rank, const char *name, gs__outbox *box);
void gs__eng_unregister_local(gs__engine *e, int32_t rank, const char *name);

/* cache.c */
/* The cache id for a request just negotiated (0 when not cached). */
uint32_t gs__eng_cache_assign(gs__engine *e, const gs__tensor_request *r);
/* A full request for a cached name with other parameters makes the cached
 * entry stale. */
void gs__eng_cache_check_full(gs__engine *e, const gs__tensor_request *r);
const gs__tensor_request *gs__eng_cache_lookup(const gs__engine *e, uint32_t id);
/* Sends plan as a replay of a template when its responses repeat one, or
 * defines a new template from it. Only plans without errors. */
void gs__eng_template_apply(gs__engine *e, gs__plan *plan);

/* emit.c */
/* The emission policy; force: errors and departures go out at once. */
void gs__eng_maybe_emit(gs__engine *e, gs__outbox *box, int force);

/* fast.c */
/* 1 when the job may enter fast mode now on an empty plan (see
 * engine.h); never while backing off. */
int gs__eng_fast_allowed(const gs__engine *e);
/* A plan that empties the table goes out: 1 when it carries the marker
 * (counts the plan against a backoff). */
int gs__eng_fast_on_plan(gs__engine *e);
/* A plan with fast_after: acknowledges the ranks' registrations applied
 * since the last one (Plan.reg_ack_*). */
void gs__eng_fast_reg_acks(gs__engine *e, gs__plan *p);
/* An escalation message (msg->escalate_round) of rank in fast mode: notes
 * an op in it the fast path cannot run (before gs__eng_fast_escalate). */
void gs__eng_fast_note_ops(gs__engine *e, int32_t rank, const gs__rank_msg *msg);
/* A fast_after plan goes out: fast mode from now on. */
void gs__eng_fast_enter(gs__engine *e);
/* When the job may enter fast mode and no plan is due: an empty plan
 * with fast_after. */
void gs__eng_fast_marker(gs__engine *e, gs__outbox *box);
/* rank escalated after fast round `round` (RankMessage.escalate_round). */
void gs__eng_fast_escalate(gs__engine *e, int32_t rank, uint64_t round, uint64_t now_ms,
                           gs__outbox *box);
/* In fast mode, requests from a rank that has not escalated were sent
 * before the marker reached it: every rank is asked back (FastStop without
 * abort_round, once per episode), since that rank's next round cannot be
 * clear anyway and it may have nothing left to start one with. */
void gs__eng_fast_late_request(gs__engine *e, int32_t rank, const char *name, gs__outbox *box);
/* rank left: in fast mode it counts as escalated and every other connected
 * rank still in fast mode gets FastStop{abort_round = true}. */
void gs__eng_fast_left(gs__engine *e, int32_t rank, uint64_t now_ms, gs__outbox *box);
/* The rank's fast report and fast-pending set from msg. */
void gs__eng_fast_update(gs__engine *e, rank_slot *s, const gs__rank_msg *msg, uint64_t now_ms);
/* A rank's hello (msg->has_hello): whether it runs fast rounds. */
void gs__eng_fast_hello(gs__engine *e, rank_slot *s, const gs__rank_msg *msg);
/* The rank is no longer connected (left, lost, gone). */
void gs__eng_fast_rank_gone(gs__engine *e, rank_slot *s);
/* Frees a rank's fast-pending set. */
void gs__eng_fast_pending_clear(rank_slot *s);

/* What the ranks in fast mode wait on, one item per name, sorted by name:
 * the ranks that report it, the largest age now, the cache id. Names also
 * in the table are left out (the table's entry says more). */
typedef struct fast_item {
  const char *name; /* owned by the rank's report */
  uint32_t cache_id;
  uint64_t age_ms;
  int32_t *ranks; /* the reporting ranks, ascending */
  size_t nranks;
} fast_item;
typedef struct fast_items {
  fast_item *items;
  size_t n;
  int32_t *rank_store;
} fast_items;
/* GS__OK or GS__ERR_NO_MEMORY; free with gs__eng_fast_items_free. */
int gs__eng_fast_items(const gs__engine *e, uint64_t now_ms, fast_items *out);
void gs__eng_fast_items_free(fast_items *fi);
/* 1 when rank r is connected and does not report item it (it is missing). */
int gs__eng_fast_missing(const gs__engine *e, const fast_item *it, int32_t r);
/* The item of name, or NULL. */
const fast_item *gs__eng_fast_find(const fast_items *fi, const char *name);

/* checks.c */
void gs__eng_set_blocked(gs__engine *e, rank_slot *s, const gs__rank_msg *msg, uint64_t now_ms);
void gs__eng_check_liveness(gs__engine *e, uint64_t now_ms, gs__outbox *box);
void gs__eng_check_stalls(gs__engine *e, uint64_t now_ms, gs__outbox *box);
void gs__eng_check_deadlock(gs__engine *e, uint64_t now_ms, gs__outbox *box);

#endif
