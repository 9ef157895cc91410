/* The data-plane interface the worker's executor calls. A backend runs one
 * collective at a time, from the worker's background thread; only abort may
 * be called from another thread. Backends include nothing from the gRPC
 * client: the rendezvous store reaches them as the gs__kv callbacks.
 *
 * Every function returns a GS__ status (common/status.h) and on failure
 * writes a one-line message into err naming the peer rank(s), their address
 * and what to do. */
#ifndef GS_WORKER_BACKEND_H
#define GS_WORKER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"

/* The rendezvous store (the coordinator's KvSet/KvGet). get waits up to
 * timeout_ms for the key to appear and returns a malloc'd value the caller
 * frees; GS__ERR_TIMEOUT when it did not appear. Thread-safe. */
typedef struct gs__kv {
  void *ctx;
  int (*set)(void *ctx, const char *key, const void *val, size_t len, char *err, size_t errlen);
  int (*get)(void *ctx, const char *key, int timeout_ms, void **val, size_t *len, char *err,
             size_t errlen);
} gs__kv;

typedef struct gs__backend gs__backend;

typedef struct gs__backend_vtbl {
  const char *name;
  /* In place: buf holds count elements; afterwards every rank holds the
   * element-wise reduction over ranks. op: SUM, AVERAGE (sum / size), MIN,
   * MAX, PRODUCT. float16/bfloat16 are reduced in float32 and rounded once. */
  int (*allreduce)(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                   char *err, size_t errlen);
  /* recv receives the concatenation in rank order of every rank's block;
   * rank r's block is bytes[r] bytes long; send is this rank's block
   * (bytes[rank] bytes) and may alias recv at this rank's offset. */
  int (*allgatherv)(gs__backend *b, const void *send, void *recv, const size_t *bytes, char *err,
                    size_t errlen);
  /* buf (len bytes) is copied from root to every rank. */
  int (*broadcast)(gs__backend *b, void *buf, size_t len, int root, char *err, size_t errlen);
  /* buf holds the full tensor (sum of counts[] elements, the same on every
   * rank); afterwards rank r's block (counts[r] elements starting at the
   * sum of counts[0..r-1]) holds the reduction over ranks of that block.
   * Other blocks are scratch. op and dtypes as for allreduce. */
  int (*reducescatter)(gs__backend *b, void *buf, const size_t *counts, gs__dtype dt,
                       gs__reduce_op op, char *err, size_t errlen);
  /* Personalized exchange: send holds this rank's blocks for ranks 0..n-1
   * in order, send_bytes[q] bytes for rank q; recv receives the blocks every
   * rank sent this one, in rank order, recv_bytes[q] bytes from rank q
   * (the caller learned those sizes beforehand). */
  int (*alltoallv)(gs__backend *b, const void *send, const size_t *send_bytes, void *recv,
                   const size_t *recv_bytes, char *err, size_t errlen);
  /* Makes the running and every later collective fail promptly with
   * GS__ERR_ABORTED. Any thread; idempotent. */
  void (*abort)(gs__backend *b);
  /* Closes connections and frees b. NULL-safe via gs__backend_destroy. */
  void (*destroy)(gs__backend *b);
} gs__backend_vtbl;

struct gs__backend {
  const gs__backend_vtbl *v;
};

static inline void gs__backend_destroy(gs__backend *b) {
  if (b) b->v->destroy(b);
}

/* TCP ring backend (CPU). */
typedef struct gs__tcp_ring_opts {
  int rank, size;
  const char *coordinator;    /* "host:port": the advertised address is the
                                 local address of a socket toward it */
  const char *advertise_addr; /* overrides the above when non-NULL/non-empty */
  const char *data_addr;      /* bind the listener here (NULL = every interface);
                                 also advertised unless advertise_addr is set */
  int port_lo, port_hi;       /* listen on the first free port of [lo, hi];
                                 0, 0 = any port */
  const char *key_prefix;     /* kv keys are "<prefix>ring/addr/<rank>" */
  int connect_timeout_ms;     /* rendezvous + connect (e.g. the join timeout) */
  int io_timeout_ms;          /* longest wait for a peer during a collective */
  gs__kv kv;
} gs__tcp_ring_opts;

/* Listens on data_addr or all interfaces (IPv4 and IPv6), publishes "<addr>:<port>" under its
 * key, reads its left and right neighbours' keys and connects the ring.
 * Returns when both neighbours are connected, or fails after
 * connect_timeout_ms naming the rank(s) not reached. size 1 needs no peer. */
int gs__tcp_ring_create(const gs__tcp_ring_opts *opts, gs__backend **out, char *err, size_t errlen);

#endif
