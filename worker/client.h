/* The worker's gRPC client of the coordinator: Join, the Session stream and
 * the Kv store. The only worker code that touches gRPC, and the one place
 * where gRPC status codes become gradsync statuses.
 *
 * Threads: the unary calls (join, kv) may be called from any thread at any
 * time, each on its own completion queue. gs__client_session_send and
 * gs__client_session_kick may be called from any thread while the session
 * is open; the other session functions are for one thread at a time:
 * gs_init's thread, then the background thread. */
#ifndef GS_WORKER_CLIENT_H
#define GS_WORKER_CLIENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "messages.h"

typedef struct gs__client gs__client;

typedef struct gs__client_opts {
  const char *target;   /* "host:port" */
  const char *token;    /* NULL or "" = none */
  const char *tls_ca;   /* PEM file; NULL or "" = plaintext */
  const char *tls_cert; /* mTLS: PEM certificate and key files, or NULL */
  const char *tls_key;
} gs__client_opts;

/* Creates the channel (TLS when o->tls_ca is set). Fails with
 * GS__ERR_INVALID_ARG naming a PEM file that cannot be read, and with
 * GS__ERR_FORKED, before touching gRPC, in a process forked while gRPC was
 * live in its parent (fork.c). */
int gs__client_create(const gs__client_opts *o, gs__client **out, char *err, size_t errlen);
/* Cancels the session if still open and frees everything. NULL-safe. */
void gs__client_destroy(gs__client *c);

/* Clients created and not destroyed in this process (each holds a
 * grpc_init); read by fork.c's child handler. */
extern atomic_int gs__grpc_users;
/* The pid of the process that forked this one (or an ancestor) while it had
 * gRPC clients, or 0 (fork.c). */
int gs__grpc_forked_from(void);

/* Join, retrying while the coordinator is not reachable yet, until
 * timeout_ms. Refusals come back as GS__ERR_JOIN_REFUSED,
 * GS__ERR_ALREADY_JOINED or GS__ERR_UNAUTHENTICATED with the coordinator's
 * message; an unreachable coordinator as GS__ERR_COORDINATOR_LOST. */
int gs__client_join(gs__client *c, const gs__join_request *req, int timeout_ms,
                    gs__join_response *resp, char *err, size_t errlen);

/* Rendezvous store. kv_get waits up to wait_ms for the key; GS__ERR_TIMEOUT
 * if it did not appear. *val is malloc'd (caller frees). */
int gs__client_kv_set(gs__client *c, const char *key, const void *val, size_t len, char *err,
                      size_t errlen);
int gs__client_kv_get(gs__client *c, const char *key, int wait_ms, void **val, size_t *len,
                      char *err, size_t errlen);

/* Records this rank's identity (its JoinResponse secret): the Session
 * hello presents it, and every later unary call carries it as metadata
 * (gradsync-rank, gradsync-rank-secret). Call once after the join, before
 * other threads make calls. */
void gs__client_set_identity(gs__client *c, int32_t rank, const uint8_t *secret);
/* Opens the Session stream and queues the hello (with the identity). */
int gs__client_session_open(gs__client *c, int32_t rank, uint64_t epoch, char *err, size_t errlen);
/* Queues one message (sent in order, one in flight at a time); *bytes (may
 * be NULL) receives its encoded size. Any thread (see above); the message
 * is borrowed for the call. */
int gs__client_session_send(gs__client *c, const gs__rank_msg *m, size_t *bytes, char *err,
                            size_t errlen);
/* What gs__client_session_poll saw. */
enum {
  GS__POLL_NOTHING = 0, /* the timeout passed with nothing to report */
  GS__POLL_MESSAGE = 1, /* *msg holds a message from the coordinator */
  GS__POLL_EVENT = 2    /* a send completed or a kick arrived: look for work */
};
/* Runs the stream's events for up to timeout_us microseconds (0 = only what
 * is ready, without sleeping; < 0 = no limit), returning at the first thing
 * the caller may act on: a message (*got = GS__POLL_MESSAGE, *msg filled:
 * free it with gs__plan_msg_free), a completed send or a kick
 * (GS__POLL_EVENT). GS__ERR_COORDINATOR_LOST with a message once the
 * stream has ended. Session thread only. */
int gs__client_session_poll(gs__client *c, int64_t timeout_us, gs__plan_msg *msg, int *got,
                            char *err, size_t errlen);
/* 1 while no message is in flight or queued. Session thread only. */
int gs__client_session_idle(gs__client *c);
/* Makes the session thread's poll return (GS__POLL_EVENT) soon: an
 * operation that completes at once is tagged on the session's queue. Any
 * thread, while the session is open (after gs__client_session_open, before
 * gs__client_destroy). Each kick completes exactly once; the caller bounds
 * how many are outstanding. */
void gs__client_session_kick(gs__client *c);
/* How many kicks the polls consumed since the last call (and resets the
 * count). Session thread only. */
unsigned gs__client_session_kicks_taken(gs__client *c);
/* Half-closes the stream and waits up to timeout_ms for its end, then
 * cancels it. */
void gs__client_session_close(gs__client *c, int timeout_ms);

#endif
