/* The coordinator's gRPC transport: one completion queue drained by the
 * thread that calls gs__server_run, which owns the engine, the kv store and
 * every call. It decodes requests, calls the engine and sends what the
 * engine returns; it never blocks on a rank. */
#ifndef GS_SERVER_TRANSPORT_H
#define GS_SERVER_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

typedef struct gs__server gs__server;

typedef struct gs__server_opts {
  const char *listen;     /* "host:port"; port 0 = any free port */
  int32_t world_size;     /* 0 = taken from the first rank */
  const char *job_id;     /* NULL or "" = any */
  const char *token;      /* NULL = no token required */
  gs__job_config job;     /* imposed on every rank; the engine's check times */
  int deadlock_warn_only; /* --deadlock-action warn */
  int window_policy;      /* --emit-policy window */
  int max_plans_in_flight;
  int shutdown_grace_ms;
} gs__server_opts;

/* Binds and starts serving (calls grpc_init). On failure returns an error
 * with a message in err and *out = NULL. */
int gs__server_create(const gs__server_opts *opts, gs__server **out, char *err, size_t errlen);
/* The bound port. */
int gs__server_port(const gs__server *s);
/* Runs the event loop on the calling thread. should_stop is polled at least
 * every 100 ms; once it returns non-zero the server shuts down gracefully
 * (sessions end with UNAVAILABLE) and gs__server_run returns 0. */
int gs__server_run(gs__server *s, int (*should_stop)(void *arg), void *arg);
/* Frees everything (calls grpc_shutdown). NULL is a no-op. */
void gs__server_destroy(gs__server *s);

#endif
