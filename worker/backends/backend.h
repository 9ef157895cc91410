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

/* One tensor of a batched pack or unpack: dst[k] = convert(src[k]) scaled
 * by scale, for k < count. src_dt == dst_dt, or one is float32 and the
 * other float16/bfloat16 (compression); scaling is done in the 16-bit
 * dtype when one side is 16-bit (as on the wire), else in the common
 * dtype (integers round to nearest). src NULL writes count zeros of
 * dst_dt. src and dst live on the backend's device and do not overlap. */
typedef struct gs__copy {
  const void *src;
  void *dst;
  size_t count;
  gs__dtype src_dt, dst_dt;
  double scale; /* 1.0 = none */
} gs__copy;

/* One member of a segmented allreduce (allreduce_segs). */
typedef struct gs__seg {
  const void *src; /* count elements, or NULL for zeros */
  void *dst;       /* count elements of the result, or NULL */
  size_t count;
} gs__seg;

/* Collectives are enqueued in order: a host backend (tcp) runs each one
 * before it returns; a device backend (nccl) enqueues it on its own stream
 * and only finish() tells that everything enqueued since begin() is done.
 * Buffers passed to a collective or a copy must live on the backend's
 * device and stay valid until finish() returned. */
typedef struct gs__backend_vtbl {
  const char *name;
  gs__device device; /* where its buffers live: CPU (host) or GPU */
  /* The persistent fusion buffer of the backend's device, grown to at
   * least bytes (contents not kept). Owned by the backend; valid until the
   * next staging call or destroy. NULL with a message when out of memory. */
  void *(*staging)(gs__backend *b, size_t bytes, char *err, size_t errlen);
  /* Packs or unpacks n tensors (see gs__copy), as one batch. */
  int (*copy)(gs__backend *b, const gs__copy *c, size_t n, char *err, size_t errlen);
  /* Result buffers of allgather, alltoall, reducescatter on the backend's
   * device; mem_free (NULL-safe, any thread, even after destroy) releases
   * one. mem_alloc returns NULL when out of memory. */
  void *(*mem_alloc)(gs__backend *b, size_t bytes);
  void (*mem_free)(void *p);
  /* Optional (NULL on host backends). begin orders what follows after the
   * work already queued on the callers' streams (n entries; NULL = the
   * default stream); finish waits until everything enqueued since begin
   * is done, polling for asynchronous errors, abort and the data-plane
   * timeout. */
  int (*begin)(gs__backend *b, void *const *streams, size_t n, char *err, size_t errlen);
  int (*finish)(gs__backend *b, char *err, size_t errlen);
  /* In place: buf holds count elements; afterwards every rank holds the
   * element-wise reduction over ranks. op: SUM, AVERAGE (sum / size), MIN,
   * MAX, PRODUCT. float16/bfloat16 are reduced in float32 and rounded once
   * on the ring, natively by NCCL. */
  int (*allreduce)(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                   char *err, size_t errlen);
  /* Optional: allreduce whose result is also multiplied by postscale (with
   * gs__scale's arithmetic, after the average's division), applied where
   * the backend finishes the reduction -- the tcp ring: on each owned block
   * in its last reduce-scatter step -- instead of a pass over the result.
   * NULL: the executor scales while it unpacks. */
  int (*allreduce_scaled)(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                          double postscale, char *err, size_t errlen);
  /* Optional: allreduce_scaled over the tensors' own buffers instead of a
   * packed one. The collective's count elements (the sum of the segments'
   * counts, the same segment counts on every rank) are read from each
   * segment's src (NULL: zeros, for padding or a rank that joined) and the
   * result written to its dst (NULL: not wanted), so no pack or unpack
   * pass is needed. GS__ERR_UNSUPPORTED, before anything happened and on
   * every rank alike, when this backend instance cannot (the caller then
   * packs). Segment buffers must not overlap each other, except a
   * segment's src may equal its own dst. */
  int (*allreduce_segs)(gs__backend *b, const struct gs__seg *segs, size_t nseg, gs__dtype dt,
                        gs__reduce_op op, double postscale, char *err, size_t errlen);
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
  /* The agreement of a fast round: in place, buf (count elements of dt,
   * the same count on every rank; meant for a few KiB) becomes the
   * element-wise reduction over ranks, as an allreduce. Two forms only:
   * UINT8 with MIN (the fast vector of flags) and FLOAT32 with SUM (flags
   * as 1.0/0.0 followed by the data of small allreduces that ride along;
   * every rank ends with the same bits, summed in the backend's own order,
   * not deterministic mode's rank order); anything else is
   * GS__ERR_INVALID_ARG. Unlike the other collectives, a rank may enter
   * long before its peers (they may still be computing, for minutes):
   * until every rank has entered there is no data-plane timeout, and only
   * abort() (GS__ERR_ABORTED) or a peer's closed connection or death
   * (GS__ERR_DATA_PLANE, naming the rank, its address or host, and what to
   * do) ends the wait; a rank that never comes and never dies is the
   * caller's to abort (the coordinator's FastStop). Once every rank has
   * entered, the io timeout applies as in any collective. Tuned for
   * latency: a brief bounded spin before the wait blocks, which then costs
   * no CPU. count == 0 or a job of one rank: returns at once. A failure
   * leaves the backend broken like a failed collective. NULL on the nccl
   * backend: fast rounds always run on the host backend (tcp or shm,
   * hierarchical included), whatever the tensors' device. */
  int (*agree)(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op, char *err,
               size_t errlen);
  /* agree in two calls, for an application thread that runs a fast round
   * inside a wait with a deadline (worker/fast_round.c): as agree, except
   * that when deadline_ns (CLOCK_MONOTONIC) passes before every rank has
   * entered it returns GS__ERR_TIMEOUT with this rank's part posted and
   * the agreement parked: buf must stay valid and untouched, and the next
   * call on b must be agree_resume (any thread), which waits on as agree
   * does (no deadline) and finishes the agreement into buf; abort() ends a
   * parked agreement as a running one. GS__ERR_UNSUPPORTED, with nothing
   * posted, where it cannot park (then use agree). NULL on backends that
   * never park (tcp ring, nccl): fast rounds run on the exec thread. */
  int (*agree_until)(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                     int64_t deadline_ns, char *err, size_t errlen);
  int (*agree_resume)(gs__backend *b, char *err, size_t errlen);
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

/* ---- the factory ---------------------------------------------------------- */

typedef enum gs__backend_kind {
  GS__BACKEND_TCP = 0,  /* TCP ring, host buffers */
  GS__BACKEND_NCCL = 1, /* NCCL, CUDA device buffers */
  GS__BACKEND_SHM = 2   /* shared memory in a host, hierarchical across hosts */
} gs__backend_kind;

/* Options of the TCP ring backend (CPU). */
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
  const int *kv_ranks;        /* size entries: the <rank> of ring rank r's key, for a
                                 ring of a subset of the job's ranks (the coordinator
                                 lets only that job rank write it), and the rank the
                                 ring's messages name for r; NULL = r */
  int connect_timeout_ms;     /* rendezvous + connect (e.g. the join timeout) */
  int io_timeout_ms;          /* longest wait for a peer during a collective
                                 (agree: once every rank has entered) */
  gs__kv kv;
  /* The job's ring key (GS__SECRET_BYTES, from the JoinResponse; required
   * when size > 1): connections prove membership with HMAC-SHA256 under it. */
  const uint8_t *ring_key;
  /* GRADSYNC_DETERMINISTIC: reduce every element in rank order 0..n-1, so
   * results do not depend on fusion or timing (costs bandwidth at n > 2).
   * Every rank must agree (gs_init checks). */
  int deterministic;
  /* GRADSYNC_TCP_CONGESTION: the congestion control the ring's sockets ask
   * for. NULL or "auto": cubic (else reno) only where the system's is bbr;
   * "system": the kernel's choice; else an algorithm name (at most 15
   * characters) asked for on every socket, with one warning per ring where
   * the kernel refuses it. */
  const char *congestion;
} gs__tcp_ring_opts;

/* Options of the NCCL backend (GPU). */
typedef struct gs__nccl_opts {
  int rank, size;
  int device;             /* CUDA device ordinal */
  const char *key_prefix; /* the unique id is stored under "<prefix>nccl/id" */
  int connect_timeout_ms; /* rendezvous + ncclCommInitRank */
  int io_timeout_ms;      /* longest a collective may take (data-plane timeout) */
  gs__kv kv;
} gs__nccl_opts;

/* Options of the host transport (shm.c): shared memory among the ranks of
 * one host, hierarchical across hosts. */
typedef struct gs__shm_opts {
  int rank, size;
  /* The ranks on this host, ascending (this rank among them), and the
   * host's position among the job's hosts, which are ordered by their
   * lowest rank; the host's leader is local_ranks[0]. */
  const int *local_ranks;
  int nlocal;
  int host_index, nhosts;
  const int *host_of; /* size entries: every rank's host index (NULL = one host) */
  /* POSIX shm name of this host's segment ("/...", unique per job, epoch
   * and host; see gs__shm_segment_name). */
  const char *segment;
  size_t chunk_bytes;     /* one rank's slot: 0 = 1 MiB; else 4 KiB..64 MiB, a
                             multiple of 64 (the same on every local rank) */
  size_t one_shot_bytes;  /* collectives of up to this many bytes (wire dtype)
                             take one rendezvous, every rank reducing each
                             whole chunk itself; 0 = the default; the same
                             on every local rank */
  int connect_timeout_ms; /* every local rank mapped the segment */
  int io_timeout_ms;      /* longest wait for a local peer in a collective */
  /* The leader's pid when it is in this rank's pid namespace, else 0: a
   * non-leader waiting for the segment fails as soon as that process is
   * gone rather than after connect_timeout_ms. */
  int leader_pid;
  const char *host; /* this host's name, for messages (NULL: "this host") */
} gs__shm_opts;

/* The host-transport decision of one rank, made by gs__host_transport. */
typedef struct gs__host_transport_opts {
  int rank, size;
  const char *host; /* this rank's host name (as reported at join) */
  int required;     /* 1: GRADSYNC_BACKEND=shm (failure fails); 0: auto
                       (failure falls back to the TCP ring on every rank) */
  uint64_t epoch;
  const uint8_t *ring_key;       /* the job's key: names the segments */
  const gs__tcp_ring_opts *ring; /* the world ring's options: template of the
                                    leaders' ring ("<prefix>leaders/") */
  int connect_timeout_ms, io_timeout_ms;
} gs__host_transport_opts;

/* Picks and builds the host data plane over the connected world ring
 * (every rank calls it; it runs collectives on world):
 * - every rank alone on its host: *out = world (the TCP ring);
 * - else the shm transport (one host) or the hierarchical one (shm inside
 *   each host, a TCP ring between the hosts' leaders), which owns world
 *   from then on (it runs allgatherv, reducescatter and alltoallv there).
 * Ranks share a host when host name, boot id and network, IPC and
 * /dev/shm identity agree (see shm.c). why receives a one-line account
 * for the log. In auto mode a failure on any rank makes every rank keep
 * world (why says so and why); required mode fails instead, naming the
 * rank. On failure world still belongs to the caller. */
int gs__host_transport(const gs__host_transport_opts *o, gs__backend *world, gs__backend **out,
                       char *why, size_t whylen, char *err, size_t errlen);

/* "/gradsync-<16 hex of HMAC(key, "shm")>-<epoch>-<leader rank>". */
void gs__shm_segment_name(const uint8_t *ring_key, uint64_t epoch, int leader, char *out,
                          size_t outlen);

/* Creates the shm transport of one host: the leader (local_ranks[0])
 * creates the segment, the others map it; once all have mapped it the name
 * is unlinked, so nothing stays in /dev/shm whatever happens later (a
 * failed or timed-out attach unlinks it too). world (all ranks) and leaders
 * (the hosts' leaders; NULL with one host or on a non-leader) are adopted
 * only by gs__shm_adopt. */
int gs__shm_create(const gs__shm_opts *opts, gs__backend **out, char *err, size_t errlen);
/* Hands the TCP rings to the shm backend, which owns them from then on. */
void gs__shm_adopt(gs__backend *shm, gs__backend *world, gs__backend *leaders);

/* Creates a backend of kind from its options (a gs__tcp_ring_opts, a
 * gs__nccl_opts or a gs__shm_opts). GS__ERR_UNSUPPORTED with the reason when the kind was
 * not built in or cannot run here. */
int gs__backend_create(gs__backend_kind kind, const void *opts, gs__backend **out, char *err,
                       size_t errlen);

/* "tcp"/"nccl"/"shm" -> kind; -1 for anything else ("auto" is resolved by the
 * caller with gs__backend_usable). */
int gs__backend_kind_parse(const char *name);
const char *gs__backend_kind_name(gs__backend_kind kind);

/* 1 if kind can run in this process; else 0 and why (e.g. "not built with
 * NCCL", "no CUDA device: cudaGetDeviceCount: no CUDA-capable device is
 * detected"). *ndevices receives the CUDA devices seen (may be NULL). */
int gs__backend_usable(gs__backend_kind kind, int *ndevices, char *why, size_t whylen);

/* Where p points: GS__DEVICE_GPU for CUDA device or managed memory (only
 * when built with CUDA and a device exists), else GS__DEVICE_CPU. *device
 * receives the CUDA device ordinal of GPU memory (may be NULL). */
gs__device gs__pointer_device(const void *p, int *device);

/* Copies a result buffer of a GPU backend (its mem_alloc's: allgather,
 * alltoall, reducescatter) to dst, device memory of any CUDA device:
 * enqueued on stream (a cudaStream_t of the result's device; NULL = the
 * legacy default stream) after the work queued there, without waiting for
 * it; the buffer's mem_free, whenever it comes, is ordered after the copy.
 * For gs_handle_result_copy; any thread. GS__ERR_DATA_PLANE or
 * GS__ERR_NO_MEMORY with the CUDA call and its error in err;
 * GS__ERR_UNSUPPORTED when built without CUDA. */
int gs__device_result_copy(void *dst, const void *src, size_t bytes, void *stream, char *err,
                           size_t errlen);

/* dtype and reduce op checks of the host backends' allreduce and
 * reducescatter; who ("tcp ring", "shm") and what name them in err. */
int gs__host_reduce_args(const char *who, const char *what, gs__dtype dt, gs__reduce_op op,
                         char *err, size_t errlen);
/* The two forms agree takes (UINT8 with MIN, FLOAT32 with SUM), checked
 * for backend who; else GS__ERR_INVALID_ARG naming them. */
int gs__agree_args(const char *who, gs__dtype dt, gs__reduce_op op, char *err, size_t errlen);
/* Host staging and copies, shared by host backends. */
void *gs__host_staging(void **buf, size_t *cap, size_t bytes, char *err, size_t errlen);
int gs__host_copy(const gs__copy *c, size_t n, char *err, size_t errlen);
void *gs__host_alloc(gs__backend *b, size_t bytes);
void gs__host_free(void *p);

/* The kinds themselves, called by the factory only. */
/* Listens on data_addr or all interfaces (IPv4 and IPv6), publishes "<addr>:<port>" under its
 * key, reads its left and right neighbours' keys and connects the ring;
 * every connection proves job membership (see tcp_ring.c) and connections
 * that do not are dropped without failing the rendezvous.
 * Returns when both neighbours are connected, or fails after
 * connect_timeout_ms naming the rank(s) not reached. size 1 needs no peer. */
int gs__tcp_ring_create(const gs__tcp_ring_opts *opts, gs__backend **out, char *err, size_t errlen);
/* The ring's allreduce with its finish given explicitly, for the leaders'
 * step of the hierarchical transport (whose average divides by the job's
 * size, not the ring's): work (count elements of work_dt) is reduced with
 * op (SUM, MIN, MAX, PRODUCT: not AVERAGE), each owned block divided by
 * divisor (>= 1) and multiplied by factor in the last reduce-scatter step
 * and written to out (out_dt), where the allgather runs. out_dt ==
 * work_dt (out may be work), or work_dt float32 and out_dt float16/
 * bfloat16 (rounded once there; out distinct from work). Deterministic
 * rings reduce in rank order as always. b must be a tcp ring backend. */
int gs__tcp_ring_allreduce_into(gs__backend *b, void *work, gs__dtype work_dt, void *out,
                                gs__dtype out_dt, size_t count, gs__reduce_op op, int divisor,
                                double factor, char *err, size_t errlen);
int gs__nccl_create(const gs__nccl_opts *opts, gs__backend **out, char *err, size_t errlen);
/* NCCL rendezvous (nccl.c): rank 0 makes a unique id and stores it under
 * "<prefix>nccl/id"; the others wait for it up to timeout_ms. id receives
 * the 128-byte ncclUniqueId. */
int gs__nccl_rendezvous(const gs__kv *kv, const char *prefix, int rank, int timeout_ms,
                        unsigned char id[128], char *err, size_t errlen);

#endif
