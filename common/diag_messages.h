/* Plain C forms of the operator-facing messages
 * (proto/gradsync/v1/diagnostics_messages.proto, grpc.health.v1). The engine
 * fills them, common/codec_diag.c converts them, gradsyncctl prints them.
 *
 * Ownership as in messages.h: every pointer inside is owned by the struct
 * and released by its gs__diag_*_free (which zeroes the struct and accepts
 * NULL). */
#ifndef GS_COMMON_DIAG_MESSAGES_H
#define GS_COMMON_DIAG_MESSAGES_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

#define GS__DIAG_MAX_PAGE 1000 /* ListPending page size cap */
#define GS__DIAG_DEFAULT_PAGE 100
#define GS__DIAG_MAX_PATH 4096 /* timeline file path */

typedef struct gs__diag_rank {
  int32_t rank;
  char host[GS__MAX_HOST + 1];
  int32_t pid;
  char state[16]; /* none, joined, connected, left, lost, gone, closed */
  double last_msg_age_s;
  uint64_t last_done_plan;
  int joined_uneven;
  char **blocked_on;
  size_t nblocked;
} gs__diag_rank;

typedef struct gs__diag_setting {
  char *key, *value;
} gs__diag_setting;

typedef struct gs__diag_status {
  char job_id[GS__MAX_JOB_ID + 1];
  int32_t world_size;
  uint64_t epoch;
  double uptime_s;
  char version[32];
  gs__diag_setting *settings;
  size_t nsettings;
  gs__diag_rank *ranks;
  size_t nranks;
  int world_ready, aborted;
  uint64_t plans_emitted, collectives, tensors_planned, bytes_negotiated;
  double cache_hit_rate, mean_tensors_per_op;
  uint64_t pending_tensors;
  char coordinator_state[16];                           /* serving, draining */
  uint64_t fast_rounds, fast_tensors, fast_collectives; /* largest over the ranks */
  int fast_backoff;                                     /* the marker is held back ... */
  uint64_t fast_backoff_plans;                          /* ... for this many more plans */
  uint64_t fast_backoffs;                               /* episodes that started a backoff */
  char fast_backoff_tensor[GS__MAX_NAME + 1];           /* the latest one's op */
} gs__diag_status;
void gs__diag_status_free(gs__diag_status *s);

typedef struct gs__diag_pending {
  char name[GS__MAX_NAME + 1];
  gs__op_type op;
  gs__dtype dtype;
  int ndim;
  int64_t shape[GS__MAX_DIMS];
  double age_s;
  int32_t *submitted;
  size_t nsubmitted;
  int32_t *missing;
  size_t nmissing;
  int complete;
  int fast_path; /* reported by ranks in fast mode, not in the table */
} gs__diag_pending;
void gs__diag_pending_free(gs__diag_pending *p);

typedef struct gs__diag_pending_query {
  int32_t *missing_ranks; /* empty: no filter */
  size_t nmissing_ranks;
  char name_prefix[GS__MAX_NAME + 1];
  uint32_t page_size; /* 0: default; capped */
  uint64_t after;     /* from the page token: entries after this order */
} gs__diag_pending_query;
void gs__diag_pending_query_free(gs__diag_pending_query *q);

typedef struct gs__diag_pending_list {
  gs__diag_pending *items;
  size_t n;
  uint64_t next_after; /* 0: no more pages */
  uint32_t total;
} gs__diag_pending_list;
void gs__diag_pending_list_free(gs__diag_pending_list *l);

typedef struct gs__diag_waited {
  char name[GS__MAX_NAME + 1];
  int32_t *missing;
  size_t nmissing;
  int pending;
} gs__diag_waited;

typedef struct gs__diag_rank_wait {
  int32_t rank;
  gs__diag_waited *waits;
  size_t n;
} gs__diag_rank_wait;

typedef struct gs__diag_stalls {
  gs__diag_pending *stalled;
  size_t nstalled;
  gs__diag_rank_wait *waits;
  size_t nwaits;
  char *last_stall, *last_deadlock; /* NULL or text */
  uint32_t stall_warning_s;
} gs__diag_stalls;
void gs__diag_stalls_free(gs__diag_stalls *s);

typedef struct gs__diag_rank_locals {
  int32_t rank;
  char **names;
  size_t n;
} gs__diag_rank_locals;

typedef struct gs__diag_locals {
  gs__diag_rank_locals *ranks;
  size_t n;
} gs__diag_locals;
void gs__diag_locals_free(gs__diag_locals *l);

/* Event kinds: the values of gradsync.v1.EventKind (append only). */
typedef enum gs__event_kind {
  GS__EV_NONE = 0,
  GS__EV_RANK_JOINED = 1,
  GS__EV_WORLD_READY = 2,
  GS__EV_RANK_LEFT = 3,
  GS__EV_RANK_LOST = 4,
  GS__EV_STALL = 5,
  GS__EV_DEADLOCK = 6,
  GS__EV_MISMATCH = 7,
  GS__EV_JOB_ABORTED = 8,
  GS__EV_JOB_FINISHED = 9,
  GS__EV_COUNT
} gs__event_kind;
/* "rank_joined" ...; never NULL. */
const char *gs__event_name(int kind);

typedef struct gs__diag_event {
  uint64_t seq;
  char time[48];
  int kind;
  int32_t rank;
  char *message;
} gs__diag_event;
void gs__diag_event_free(gs__diag_event *e);

/* grpc.health.v1 serving status values. */
enum {
  GS__HEALTH_UNKNOWN = 0,
  GS__HEALTH_SERVING = 1,
  GS__HEALTH_NOT_SERVING = 2,
  GS__HEALTH_SERVICE_UNKNOWN = 3
};

#endif
