/* The coordinator's gRPC transport: call plumbing and a table of services.
 *
 * One completion queue, drained by the thread that calls gs__server_run.
 * That thread owns every call and runs every service callback, so services
 * (Coordinator, Diagnostics, Health, Reflection ...) keep their state
 * without locks; nothing they do may block.
 *
 * A service registers a table of methods {path, kind, handler}. The
 * transport accepts calls, checks the job token where the method asks for
 * it, reads requests, sends replies and bounded stream queues, and frees a
 * call once it is closed and none of its batches is pending. Unknown
 * methods are answered with UNIMPLEMENTED. */
#ifndef GS_SERVER_TRANSPORT_H
#define GS_SERVER_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

typedef struct gs__server gs__server;
/* One RPC. Owned by the transport; see the lifetimes on gs__method. */
typedef struct gs__call gs__call;

typedef enum gs__rpc_kind {
  GS__RPC_UNARY,         /* one request, one reply */
  GS__RPC_SERVER_STREAM, /* one request, a stream of replies */
  GS__RPC_BIDI,          /* streams both ways */
} gs__rpc_kind;

typedef enum gs__rpc_auth {
  GS__AUTH_TOKEN, /* the job token when the server has one (default) */
  GS__AUTH_OPEN,  /* never a token (health probes, reflection) */
} gs__rpc_auth;

typedef struct gs__method {
  const char *path; /* "/pkg.Service/Method" */
  gs__rpc_kind kind;
  gs__rpc_auth auth;
  /* A call arrived and passed the auth check. Unary and server-streaming:
   * the request is in gs__call_request. A unary call must be answered
   * exactly once with gs__call_reply or gs__call_fail, now or later; the
   * call stays valid until then. A streaming call stays valid until
   * on_close returns. */
  void (*on_call)(void *svc, gs__call *c);
  /* Bidi only: a message from the peer (buf, len; borrowed for the call),
   * or buf == NULL once the peer half-closed. */
  void (*on_message)(void *svc, gs__call *c, const uint8_t *buf, size_t len);
  /* Streaming (and unary calls that used gs__call_watch_close): the call
   * is over (finished, cancelled by the peer or
   * its connection dropped; cancelled says which). Called once; c is
   * invalid afterwards. May be NULL. */
  void (*on_close)(void *svc, gs__call *c, int cancelled);
  /* Streaming: bytes that may wait behind the message in flight before
   * the peer is cut off with RESOURCE_EXHAUSTED (0 = 256 MiB). */
  size_t max_queued_bytes;
  /* Bidi: the first message may be at most this long (0 = no limit beyond
   * the 64 MiB message size); a longer one ends the call with
   * RESOURCE_EXHAUSTED, judged by its length before it is copied or
   * decoded. */
  size_t max_first_message;
  /* Unary and server-streaming: the request may be at most this long (0 =
   * GS__DEFAULT_MAX_REQUEST); bidi: every message after the first (0 = no
   * limit beyond the 64 MiB message size). A longer one is refused with
   * RESOURCE_EXHAUSTED naming the limit, judged by its length before it is
   * copied or decoded. */
  size_t max_request_bytes;
} gs__method;

/* What a unary or server-streaming request may be by default. */
#define GS__DEFAULT_MAX_REQUEST ((size_t)64 << 10)
/* The largest message gRPC accepts on any method (the Session's request
 * batches; every other method has its own, smaller limit). */
#define GS__MAX_MESSAGE ((size_t)64 << 20)

typedef struct gs__service {
  const char *name; /* "gradsync.v1.Coordinator" */
  const gs__method *methods;
  size_t n_methods;
  void *svc; /* handed to every callback */
  /* Periodic work on the queue thread (may be NULL), at least every
   * tick_ms (0 = 50 ms) while the server runs, once more when shutdown
   * begins. */
  void (*tick)(void *svc, uint64_t now_ms);
  uint32_t tick_ms;
  /* Shutdown begins (may be NULL): stop taking work, end the work in
   * progress (sessions, waiting calls). The listener stays open through
   * the drain (see gs__server_run): calls keep arriving and are answered
   * (health: NOT_SERVING). Called once, on the queue thread. */
  void (*shutdown)(void *svc);
  /* The drain is over and the listener closes (may be NULL): end every
   * stream still open (watchers). Called once, after shutdown. */
  void (*close)(void *svc);
} gs__service;

typedef struct gs__server_opts {
  const char *listen;             /* "host:port"; port 0 = any free port */
  const char *token;              /* NULL or "" = no token required */
  const char *tls_cert, *tls_key; /* PEM files: serve TLS (NULL = plaintext) */
  const char *tls_client_ca;      /* PEM file: mTLS, client certificates required */
  int shutdown_grace_ms;
  /* gRPC's memory quota (grpc_resource_quota) for everything the
   * connections hold: past it gRPC closes idle connections and cancels
   * streams (RESOURCE_EXHAUSTED "Buffers full"). 0 = no quota. */
  size_t grpc_memory_max_bytes;
  /* Streams one connection may have open at once (0 = gRPC's default). */
  int max_streams_per_connection;
} gs__server_opts;

/* Creates the server (calls grpc_init); nothing listens yet. Returns GS__OK
 * or an error with a message in err. */
int gs__server_create(const gs__server_opts *opts, gs__server **out, char *err, size_t errlen);
/* Adds a service before gs__server_start. The table and svc are borrowed
 * and must outlive the server. Returns GS__OK or GS__ERR_INVALID_ARG (too
 * many methods, or called after start). */
int gs__server_add_service(gs__server *s, const gs__service *svc);
/* Binds the listen address and starts serving. */
int gs__server_start(gs__server *s, char *err, size_t errlen);
/* Re-reads the TLS files (--tls-cert, --tls-key, --tls-client-ca): GS__OK
 * and new connections get them (about describes the certificate), or an
 * error in err and the previous files stay in use (GS__ERR_UNSUPPORTED: the
 * server has no TLS). Open connections keep their certificate. Queue
 * thread; reads three small local files. */
int gs__server_reload_tls(gs__server *s, char *about, size_t aboutlen, char *err, size_t errlen);
/* The bound port (0 before start). */
int gs__server_port(const gs__server *s);
/* What should_stop (gs__server_run) answers. */
typedef enum gs__stop {
  GS__RUN_ON = 0,     /* keep serving */
  GS__STOP_DRAIN = 1, /* shut down gracefully: drain, then close */
  GS__STOP_NOW = 2,   /* shut down without a drain (or end the drain now) */
} gs__stop;
/* Runs the event loop on the calling thread. should_stop is polled at least
 * every 50 ms, also while shutting down.
 *
 * Shutdown, on GS__STOP_DRAIN: the services' shutdown hooks run (the
 * coordinator ends the sessions, health turns NOT_SERVING), and for the
 * drain the listener stays open: new calls are accepted and answered
 * (health probes see NOT_SERVING, Join is refused as shutting down). The
 * drain lasts the grace period (shutdown_grace_ms) less the time kept for
 * closing, 2 s (half the grace when it is under 4 s), and ends early when
 * should_stop answers GS__STOP_NOW. Then the services' close hooks run,
 * the listener closes, calls still open at the end of the grace are
 * cancelled, and gs__server_run returns 0 once every call is gone. On
 * GS__STOP_NOW there is no drain. */
int gs__server_run(gs__server *s, gs__stop (*should_stop)(void *arg), void *arg);
/* 1 once shutdown began (also during the drain). */
int gs__server_shutting_down(const gs__server *s);
/* Frees everything (calls grpc_shutdown). NULL is a no-op. */
void gs__server_destroy(gs__server *s);

/* ---- calls (queue thread only) ------------------------------------------ */

/* The request of a unary or server-streaming call (NULL, 0 when the client
 * sent none). Borrowed until the call is answered / closed. */
void gs__call_request(const gs__call *c, const uint8_t **buf, size_t *len);
/* Copies metadata key's value into out; 1 when present. */
int gs__call_metadata(const gs__call *c, const char *key, char *out, size_t outlen);
/* The peer's address ("ipv4:127.0.0.1:4711"), or "" */
const char *gs__call_peer(gs__call *c);
/* The method the call is for. */
const gs__method *gs__call_method(const gs__call *c);
/* A pointer the service keeps with the call. */
void gs__call_set_data(gs__call *c, void *data);
void *gs__call_data(const gs__call *c);

/* Unary: the reply (bytes copied) with status OK. */
void gs__call_reply(gs__call *c, const uint8_t *buf, size_t len);
/* Unary: an error status with a message (copied; NULL = none). */
void gs__call_fail(gs__call *c, grpc_status_code code, const char *msg);
/* Unary, for a call answered later: from now on, if the client gives up
 * (deadline, cancel, connection gone) before the answer, the method's
 * on_close runs (cancelled = 1) and the call is invalid afterwards. */
void gs__call_watch_close(gs__call *c);
/* Streaming: queues a message (bytes copied). Returns 0; -1 when the call
 * is finishing or closed (message dropped); -2 when its queue overflowed
 * (the call is ended with RESOURCE_EXHAUSTED, the message dropped). */
int gs__call_send(gs__call *c, const uint8_t *buf, size_t len);
/* One message for many streams (a plan for every rank): the bytes are
 * encoded once and every stream's send shares them, uncopied. Queue thread
 * only. gs__msg_bytes_wrap takes ownership of buf (malloc'd; freed when the
 * last send that shares it is done); NULL when out of memory (buf freed). */
typedef struct gs__msg_bytes gs__msg_bytes;
gs__msg_bytes *gs__msg_bytes_wrap(uint8_t *buf, size_t len);
/* Drops the caller's reference (sends still queued keep theirs). NULL-safe. */
void gs__msg_bytes_release(gs__msg_bytes *m);
/* gs__call_send of a shared message: the same results, no copy. */
int gs__call_send_shared(gs__call *c, const gs__msg_bytes *m);
/* Streaming: ends the call with code once the queued messages are sent.
 * Later calls are no-ops. */
void gs__call_finish(gs__call *c, grpc_status_code code, const char *msg);
/* Streaming: bytes waiting behind the message in flight. */
size_t gs__call_queued_bytes(const gs__call *c);

#endif
