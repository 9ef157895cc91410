/* The gradsync.v1.Coordinator service (worker-facing): Join, the Session
 * streams, and the Kv* rendezvous store. It owns the engine and the kv
 * store; everything runs on the transport's completion-queue thread. */
#ifndef GS_SERVER_COORDINATOR_H
#define GS_SERVER_COORDINATOR_H

#include <stdint.h>

#include "engine.h"
#include "messages.h"
#include "transport.h"

typedef struct gs__coordinator gs__coordinator;

typedef struct gs__coordinator_opts {
  int32_t world_size;     /* 0 = taken from the first rank */
  const char *job_id;     /* NULL or "" = any */
  gs__job_config job;     /* imposed on every rank; the engine's check times */
  int deadlock_warn_only; /* --deadlock-action warn */
  int window_policy;      /* --emit-policy window */
  int max_plans_in_flight;
  uint32_t max_pending_per_rank;    /* --max-pending-per-rank (0 = the engine's default) */
  size_t kv_max_bytes, kv_max_keys; /* 0 = the defaults of kv.h */
  size_t session_queue_max_bytes;   /* per session; 0 = the transport's default */
  int join_timeout_ms;        /* a joined rank without a Session is released after it (0 = 60 s) */
  int serve_forever;          /* 1: a fresh job (next epoch) after each one */
  uint32_t drain_ms;          /* after a failed job: how long the ranks get to close
                                 their sessions before the job is over anyway */
  int fast_path;              /* --fast-path: the engine may send Plan.fast_after */
  uint32_t fast_path_backoff; /* --fast-path-backoff: the longest backoff (plans; 0: none) */
} gs__coordinator_opts;

/* How the current job ended (see gs__coordinator_outcome). */
typedef enum gs__job_outcome {
  GS__JOB_RUNNING = 0,  /* not over, or over and its sessions still closing */
  GS__JOB_FINISHED = 1, /* every rank left cleanly and closed its session */
  GS__JOB_FAILED = 2,   /* aborted (a rank lost, deadlock, stall shutdown); every
                           rank was told, and closed its session or drain_ms passed */
} gs__job_outcome;

/* Creates the coordinator with its engine for server s (borrowed: it must
 * outlive the coordinator). GS__OK, or an error with a message in err. */
int gs__coordinator_create(const gs__coordinator_opts *opts, gs__server *s, gs__coordinator **out,
                           char *err, size_t errlen);
/* The service to add to the server (owned by the coordinator). */
const gs__service *gs__coordinator_service(gs__coordinator *c);
/* The engine, for read-only views (diagnostics); queue thread only. */
gs__engine *gs__coordinator_engine(gs__coordinator *c);
/* Events of the engine (rank joined/lost, stall, ...) go to fn as they
 * happen (queue thread; text borrowed for the call). One sink. */
typedef void (*gs__event_sink)(void *arg, int kind, int32_t rank, const char *text);
void gs__coordinator_set_event_sink(gs__coordinator *c, gs__event_sink fn, void *arg);
/* An operator aborts the job: every rank is told reason. */
void gs__coordinator_abort(gs__coordinator *c, const char *reason);
/* Starts writing a timeline to path (replacing a running one, which is
 * stopped first). GS__OK or an error with a message in err. */
int gs__coordinator_timeline_start(gs__coordinator *c, const char *path, char *err, size_t errlen);
/* Stops the timeline: the file is complete JSON. Returns 0 and the path
 * (copied into path) and events, or -1 when none was running. */
int gs__coordinator_timeline_stop(gs__coordinator *c, char *path, size_t cap, uint64_t *events);
/* Open sessions (ranks connected now). */
int gs__coordinator_sessions(const gs__coordinator *c);
/* One-job mode: the outcome of the job once it is over and drained, else
 * GS__JOB_RUNNING. With serve_forever always GS__JOB_RUNNING (each job that
 * ends is followed by a fresh one). Queue thread, or after the server ran. */
gs__job_outcome gs__coordinator_outcome(const gs__coordinator *c);
/* 1 when the current job is over (every rank left, or it was aborted),
 * also while its sessions are still closing; 0 while it runs or before
 * it started. Queue thread. */
int gs__coordinator_job_over(const gs__coordinator *c);
/* 1 during the drain after SIGTERM/SIGINT (and while closing): the
 * sessions are ended and rank-facing calls refused. Queue thread. */
int gs__coordinator_draining(const gs__coordinator *c);
/* 1 when the shutdown ended the sessions of a job that ran (its ranks'
 * state is "closed" now, not what the engine last saw). Queue thread. */
int gs__coordinator_sessions_closed_by_shutdown(const gs__coordinator *c);
/* Frees it, after the server is destroyed. NULL is a no-op. */
void gs__coordinator_destroy(gs__coordinator *c);

#endif
