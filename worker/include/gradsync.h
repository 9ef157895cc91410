/* gradsync worker library: keeps the ranks of a distributed training job in
 * lock-step through the gradsyncd coordinator and runs the collectives on a
 * data plane (NCCL on GPUs when built with it, a TCP ring on CPUs).
 *
 * Conventions (as in nccl.h and uv.h):
 * - Every fallible call returns a gs_status and writes results through
 *   out-params. A failed call changes no state and creates nothing.
 * - Objects are opaque. Every create has a destroy; destroy(NULL) is a no-op.
 * - Inputs are borrowed for the duration of the call unless a comment says
 *   otherwise. Buffers passed to an async op must stay valid and untouched
 *   until the op completes.
 * - Error messages name the tensor, the rank(s), the host and what to do;
 *   read them with gs_handle_error (per op) or gs_last_error (per thread and
 *   context).
 *
 * Thread safety: every function may be called from any thread unless said
 * otherwise; a handle may be waited on by several threads at once.
 *
 * Options and stats structs (gs_options, gs_allreduce_opts, gs_op_opts,
 * gs_sparse_opts, gs_stats) begin with struct_size, set by their *_init
 * function to the size this header declares. New fields are only ever
 * appended, so a program compiled against an older gradsync.h keeps
 * working with a newer library: fields beyond its struct_size take their
 * defaults. A struct_size of 0 (a struct not initialised with *_init) or
 * larger than the library knows is refused with GS_ERR_INVALID_ARG. A NULL
 * options pointer always means "all defaults". (NCCL's ncclConfig_t is the
 * model.)
 *
 * GPU buffers: with the nccl backend, device pointers (cudaMalloc'd memory)
 * may be passed to every collective; the op's stream field names the
 * cudaStream_t (as void *; NULL = the legacy default stream) on which the
 * caller produced the input and will read the output. The collective runs
 * on the library's own stream, ordered after the caller's stream with an
 * event, and the handle completes when the result is in place. This header
 * includes nothing from CUDA. */
#ifndef GRADSYNC_H
#define GRADSYNC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GS_API __attribute__((visibility("default")))
#else
#define GS_API
#endif

#define GS_VERSION_STRING "0.1.0"

/* Status codes. Explicit numbers, append only. */
typedef enum gs_status {
  GS_OK = 0,
  GS_ERR_INVALID_ARG = 1, /* a bad argument; the message names it */
  GS_ERR_NO_MEMORY = 2,
  GS_ERR_TIMEOUT = 3,          /* gs_wait timed out; the op is still pending */
  GS_ERR_MISMATCH = 4,         /* ranks submitted the tensor differently */
  GS_ERR_DUPLICATE_NAME = 5,   /* the name is already in flight on this rank */
  GS_ERR_JOIN_REFUSED = 6,     /* coordinator refused the join (rank/size) */
  GS_ERR_JOIN_TIMEOUT = 7,     /* some ranks never joined; they are named */
  GS_ERR_COORDINATOR_LOST = 8, /* the coordinator went away */
  GS_ERR_RANK_LOST = 9,        /* another rank died or disconnected */
  GS_ERR_DATA_PLANE = 10,      /* the backend failed (peer closed, timeout) */
  GS_ERR_ABORTED = 11,         /* the job was aborted; the reason is given */
  GS_ERR_SHUTDOWN = 12,        /* gs_shutdown was called */
  GS_ERR_DEADLOCK = 13,
  GS_ERR_STALL = 14,
  GS_ERR_UNSUPPORTED = 15,
  GS_ERR_INTERNAL = 16,
  GS_ERR_UNAUTHENTICATED = 17, /* wrong or missing GRADSYNC_JOB_TOKEN */
  GS_ERR_ALREADY_JOINED = 18,  /* another process joined as this rank */
  GS_ERR_FORKED = 19,          /* the context was made in the parent of a fork */
} gs_status;

typedef enum gs_dtype {
  GS_FLOAT32 = 0,
  GS_FLOAT64 = 1,
  GS_FLOAT16 = 2,  /* reduced in float32, rounded back */
  GS_BFLOAT16 = 3, /* reduced in float32, rounded back */
  GS_INT32 = 4,
  GS_INT64 = 5,
  GS_INT8 = 6,
  GS_UINT8 = 7,
  GS_INT16 = 8,
} gs_dtype;

typedef enum gs_reduce_op {
  GS_SUM = 0,
  GS_AVERAGE = 1, /* sum / size; integers truncate toward zero */
  GS_MIN = 2,
  GS_MAX = 3,
  GS_PRODUCT = 4,
  GS_ADASUM = 5, /* not supported yet: GS_ERR_UNSUPPORTED */
} gs_reduce_op;

typedef struct gs_ctx gs_ctx;       /* one per process (per job membership) */
typedef struct gs_handle gs_handle; /* one per async op */

/* Options of gs_init. Initialise with gs_options_init, then set fields.
 * Fields left at their "unset" values are read from the environment. */
typedef struct gs_options {
  size_t struct_size;         /* sizeof(gs_options); set by gs_options_init */
  const char *coordinator;    /* "host:port"; NULL = GRADSYNC_COORDINATOR */
  int rank;                   /* -1 = GRADSYNC_RANK */
  int size;                   /* -1 = GRADSYNC_SIZE */
  int local_rank;             /* -1 = GRADSYNC_LOCAL_RANK (default 0) */
  int local_size;             /* -1 = GRADSYNC_LOCAL_SIZE (default 1) */
  const char *job_token;      /* NULL = GRADSYNC_JOB_TOKEN (optional) */
  const char *advertise_addr; /* NULL = GRADSYNC_ADVERTISE_ADDR, else the
                                 local address toward the coordinator */
  int join_timeout_ms;        /* -1 = GRADSYNC_JOIN_TIMEOUT_MS or 60000 */
  int data_timeout_ms;        /* -1 = GRADSYNC_DATA_TIMEOUT_MS or 60000:
                                 longest wait for a peer inside one step
                                 of a collective (a fast round waits for
                                 the peers to enter it without a bound) */
  int scale_local;            /* -1 = GRADSYNC_SCALE_LOCAL or 1: an average
                                 on a local tensor returns input / size
                                 (as Horovod's scale_local_gradients) */
  const char *backend;        /* data plane for GPU buffers: "auto", "tcp" or
                                 "nccl"; NULL = GRADSYNC_BACKEND or "auto".
                                 auto: nccl when the library was built with
                                 it and a CUDA device is usable, else tcp
                                 (each rank logs which and why). nccl: fail
                                 gs_init with GS_ERR_UNSUPPORTED when it
                                 cannot be used. Host buffers always use the
                                 TCP ring. */
  int cuda_device;            /* CUDA device of the nccl backend; -1 =
                                 GRADSYNC_CUDA_DEVICE, else the local rank */
  /* TLS toward the coordinator (gradsyncd --tls-cert/--tls-key). Each NULL =
   * its environment variable; all unset = plaintext. */
  const char *tls_ca;   /* PEM file of the CA that signed the coordinator's
                           certificate: GRADSYNC_TLS_CA. Setting it turns
                           TLS on; the coordinator address must match a
                           name or IP in that certificate. */
  const char *tls_cert; /* mTLS (gradsyncd --tls-client-ca): this rank's PEM
                           certificate and key: GRADSYNC_TLS_CERT, */
  const char *tls_key;  /* GRADSYNC_TLS_KEY */
} gs_options;

/* Sets struct_size and every other field to its "unset" value. */
GS_API void gs_options_init(gs_options *opts);

/* Joins the job and returns a context once every rank has joined and the
 * data plane is connected. A wrong or missing job token fails with
 * GS_ERR_UNAUTHENTICATED; a TLS mismatch (plaintext against a TLS
 * coordinator, an untrusted certificate, no client certificate under mTLS)
 * fails within seconds with GS_ERR_UNAUTHENTICATED or
 * GS_ERR_COORDINATOR_LOST and a message saying which. opts may be NULL (everything from the
 * environment). Fails with GS_ERR_JOIN_TIMEOUT naming the ranks that never
 * joined, GS_ERR_JOIN_REFUSED / GS_ERR_ALREADY_JOINED with the coordinator's
 * reason, GS_ERR_COORDINATOR_LOST when it cannot be reached. On failure
 * *out is NULL and gs_last_error(NULL) explains. Call from one thread. */
GS_API gs_status gs_init(const gs_options *opts, gs_ctx **out);

/* Leaves the job and frees the context. Ops still pending fail with
 * GS_ERR_SHUTDOWN; every handle is complete when this returns, so gs_wait,
 * gs_test and gs_handle_error on it still work and return at once, and the
 * caller frees it with gs_handle_free as usual. Other ranks' later ops fail
 * with GS_ERR_SHUTDOWN naming this rank. No other call may use ctx
 * concurrently or afterwards. gs_shutdown(NULL) is a no-op.
 *
 * fork: a context belongs to the process that called gs_init. A child
 * forked after gs_init (a data-loader worker, os.fork(), fork without exec)
 * has a copy of it without the library's threads and with the parent's
 * connections, so in the child every call that takes the context, or a
 * handle of it that is still pending, fails at once with GS_ERR_FORKED and
 * a message naming the rank, the host, both processes and what to do:
 * submissions, gs_startall/gs_start, gs_barrier, gs_join, gs_wait,
 * gs_wait_any(_passive) and gs_test on a pending op, gs_register_local,
 * gs_unregister_local, gs_broadcast_parameters, the aggregator calls,
 * gs_get_stats, gs_kv_set/get (gs_is_local answers 0), and gs_shutdown,
 * which locks nothing, joins nothing, sends nothing and frees nothing: the
 * child's copy of the context (and of its pending handles) is leaked on
 * purpose, since the parent's threads own the originals. Nothing the child
 * does reaches the parent's job. Handles that completed before the fork
 * stay readable in the child as after gs_shutdown (gs_wait, gs_test,
 * gs_handle_error, gs_handle_result and the like return what they hold:
 * plain memory), and gs_handle_free works; gs_rank, gs_size and friends
 * still answer. Detection is a pthread_atfork child handler installed at
 * the first gs_init (a child made without fork(), by a raw clone or vfork
 * without exec, is not detected). The parent is unaffected and goes on.
 * gs_init in a forked child makes a context of the child's own when the
 * parent had no live context at the fork (it never called gs_init, or
 * shut down every context first); otherwise it fails at once with
 * GS_ERR_FORKED (gRPC cannot start again in that child). */
GS_API gs_status gs_shutdown(gs_ctx *ctx);

GS_API int gs_rank(const gs_ctx *ctx);
GS_API int gs_size(const gs_ctx *ctx);
GS_API int gs_local_rank(const gs_ctx *ctx);
GS_API int gs_local_size(const gs_ctx *ctx);

/* Compression of float32 tensors on the wire: cast before the collective,
 * back after. */
typedef enum gs_compression {
  GS_COMPRESS_NONE = 0,
  GS_COMPRESS_FP16 = 1,
  GS_COMPRESS_BF16 = 2,
} gs_compression;

/* Optional settings of one allreduce; NULL = defaults. Initialise with
 * gs_allreduce_opts_init, then set fields. */
typedef struct gs_allreduce_opts {
  size_t struct_size;               /* sizeof(gs_allreduce_opts); set by gs_allreduce_opts_init */
  const int64_t *shape;             /* optional logical shape (product must equal count);
                                       used in checks and error messages */
  int ndim;                         /* entries of shape; 0 = the 1-D shape [count] */
  double prescale;                  /* multiply the input by this before reducing (0 = 1) */
  double postscale;                 /* multiply the result by this (0 = 1) */
  gs_compression compression;       /* float32 only */
  double gradient_predivide_factor; /* f: prescale 1/f, postscale f (0 = off);
                                       combines with prescale/postscale */
  void *stream;                     /* cudaStream_t of GPU buffers (NULL = default stream);
                                       ignored for host buffers */
} gs_allreduce_opts;

/* Sets struct_size and every other field to its default (0/NULL). */
GS_API void gs_allreduce_opts_init(gs_allreduce_opts *opts);

/* Optional settings of allgather, broadcast, alltoall and reducescatter;
 * NULL = defaults. Initialise with gs_op_opts_init. */
typedef struct gs_op_opts {
  size_t struct_size; /* sizeof(gs_op_opts); set by gs_op_opts_init */
  void *stream;       /* cudaStream_t of GPU buffers (NULL = default stream) */
} gs_op_opts;

/* Sets struct_size and every other field to its default (0/NULL). */
GS_API void gs_op_opts_init(gs_op_opts *opts);

/* "sum", "average", "min", "max", "product", "adasum" -> *out.
 * GS_ERR_INVALID_ARG for anything else, listing the valid names. */
GS_API gs_status gs_reduce_op_from_string(const char *name, gs_reduce_op *out);

/* ---- model-parallel (local) tensors ----
 * A tensor registered local on this rank never reaches the coordinator or
 * the data plane: an allreduce on it completes at once, with input / size
 * for GS_AVERAGE when scale_local is on (the default) and the input
 * unchanged otherwise. The registration is told to the coordinator, which
 * fails at once (naming both rank sets) any rank that submits for a
 * collective a name another rank registered local. */
GS_API gs_status gs_register_local(gs_ctx *ctx, const char *name);
GS_API gs_status gs_unregister_local(gs_ctx *ctx, const char *name);
/* 1 if name is registered local on this rank. */
GS_API int gs_is_local(gs_ctx *ctx, const char *name);

/* Broadcasts n named buffers from root (as at the start of training),
 * skipping the names registered local on this rank; blocks until done. */
GS_API gs_status gs_broadcast_parameters(gs_ctx *ctx, size_t n, const char *const *names,
                                         void *const *bufs, const size_t *counts,
                                         const gs_dtype *dtypes, int root);

/* ---- sparse gradients (IndexedSlices) ---- */
/* Initialise with gs_sparse_opts_init; NULL = defaults. Sparse ops take
 * host buffers only. */
typedef struct gs_sparse_opts {
  size_t struct_size;  /* sizeof(gs_sparse_opts); set by gs_sparse_opts_init */
  int sparse_as_dense; /* scatter-add into a zeroed dense buffer and allreduce it */
  int64_t dense_rows;  /* rows of the dense tensor (needed for sparse_as_dense) */
  void *dense_out;     /* sparse_as_dense: receives dense_rows x row_len values */
} gs_sparse_opts;

/* Sets struct_size and every other field to its default (0/NULL). */
GS_API void gs_sparse_opts_init(gs_sparse_opts *opts);

/* Reduces a sparse gradient given as nnz rows (indices[i], values row i of
 * row_len elements; any rank may have nnz = 0; indices may repeat) by
 * gathering every rank's rows: the result is the concatenation in rank
 * order, read with gs_sparse_result. op is GS_SUM or GS_AVERAGE (values /
 * size). With sparse_as_dense the rows are scatter-added into a dense
 * buffer that is allreduced into opts->dense_out instead. indices and
 * values must stay valid until the op completes. */
GS_API gs_status gs_sparse_allreduce_async(gs_ctx *ctx, const char *name, const int64_t *indices,
                                           const void *values, size_t nnz, size_t row_len,
                                           gs_dtype dtype, gs_reduce_op op,
                                           const gs_sparse_opts *opts, gs_handle **out);
/* The gathered rows of a completed sparse op, borrowed from the handle. */
GS_API gs_status gs_sparse_result(const gs_handle *h, const int64_t **indices, const void **values,
                                  size_t *nnz);

/* ---- gradient aggregation (backward_passes_per_step) ---- */
typedef struct gs_aggregator gs_aggregator;
/* Accumulates each named gradient locally over passes and communicates
 * every passes-th call for that name (optionally averaging over passes). */
GS_API gs_status gs_aggregator_create(gs_ctx *ctx, int passes, int average_aggregated,
                                      gs_aggregator **out);
GS_API void gs_aggregator_destroy(gs_aggregator *agg);
/* In place on grad. On a communication pass *out is the allreduce's handle
 * and grad receives the reduced sum of the accumulated passes (divided by
 * passes when average_aggregated); on other passes *out is an already
 * completed handle and grad is left as given. Local names are accumulated
 * and scaled on the communication pass too. */
GS_API gs_status gs_aggregator_allreduce_async(gs_aggregator *agg, const char *name, void *grad,
                                               size_t count, gs_dtype dtype, gs_reduce_op op,
                                               const gs_allreduce_opts *opts, gs_handle **out);
/* Sparse gradients in an aggregator need opts->sparse_as_dense. */
GS_API gs_status gs_aggregator_sparse_allreduce_async(gs_aggregator *agg, const char *name,
                                                      const int64_t *indices, const void *values,
                                                      size_t nnz, size_t row_len, gs_dtype dtype,
                                                      gs_reduce_op op, const gs_sparse_opts *opts,
                                                      gs_handle **out);

/* ---- alltoall and reducescatter ---- */
/* Rank r sends splits[q] rows (first dimension) of send to rank q, in
 * order, and receives the rows every rank sent it, concatenated in rank
 * order, in a buffer owned by the handle (gs_handle_result). splits NULL =
 * equal parts (the first dimension must divide by size). */
GS_API gs_status gs_alltoall_async(gs_ctx *ctx, const char *name, const void *send,
                                   const int64_t *shape, int ndim, gs_dtype dtype,
                                   const int64_t *splits, const gs_op_opts *opts, gs_handle **out);
/* The rows received from each rank by a completed alltoall. */
GS_API gs_status gs_alltoall_recv_splits(const gs_handle *h, int64_t *splits, size_t n);
/* Reduces send (same shape on every rank) over ranks and leaves rank r its
 * share of the first dimension (as even as possible, lower ranks get the
 * extra rows) in a buffer owned by the handle. op: GS_SUM or GS_AVERAGE. */
GS_API gs_status gs_reducescatter_async(gs_ctx *ctx, const char *name, const void *send,
                                        const int64_t *shape, int ndim, gs_dtype dtype,
                                        gs_reduce_op op, const gs_op_opts *opts, gs_handle **out);

/* Starts an allreduce of count elements named name (unique among this
 * rank's ops in flight; every rank must submit the same name). send may equal
 * recv (in place). send and recv must stay valid until the op completes.
 * On success *out is a new handle the caller frees with gs_handle_free. */
GS_API gs_status gs_allreduce_async(gs_ctx *ctx, const char *name, const void *send, void *recv,
                                    size_t count, gs_dtype dtype, gs_reduce_op op,
                                    const gs_allreduce_opts *opts, gs_handle **out);

/* Starts n allreduces as one group: the coordinator negotiates them
 * together and emits them in one plan (and fuses them when compatible), so
 * either none or all of them are in flight on the data plane. Arrays hold
 * one entry per tensor; every rank must group the same names in the same
 * order of calls. handles receives n new handles (all or none). A group
 * repeated with the same names in the same order is cached like single
 * allreduces and runs on the fast path (docs/design-notes.md), whole: all
 * members in the same fast round; grouped otherwise on any rank, the step
 * goes to the coordinator, which reports the mismatch. */
GS_API gs_status gs_grouped_allreduce_async(gs_ctx *ctx, size_t n, const char *const *names,
                                            const void *const *sends, void *const *recvs,
                                            const size_t *counts, gs_dtype dtype, gs_reduce_op op,
                                            const gs_allreduce_opts *opts, gs_handle **handles);

/* Persistent allreduces (as MPI-4's MPI_Allreduce_init + MPI_Startall):
 * for ops repeated every step with the same arguments, the checks, the
 * handle and the name's hash are done once, and each step only starts
 * them (gs_startall starts n under one lock, a few tens of ns each).
 *
 * gs_allreduce_init checks its arguments as gs_allreduce_async does and
 * makes an inactive op in *out; it submits nothing. send and recv must stay
 * valid, and opts is copied, for the handle's whole life (until
 * gs_handle_free). A name registered local (gs_register_local) is refused
 * with GS_ERR_UNSUPPORTED, at init and at a start if registered since:
 * local ops never leave the rank; use gs_allreduce_async for them.
 *
 * An inactive op reads as done: gs_wait and gs_test return at once with
 * the last start's status (GS_OK before the first), gs_handle_error its
 * text (valid until the op is started again or freed). A started op is
 * active until it completes, exactly as one gs_allreduce_async submitted
 * (fast path or not, every rank must start the same names); gs_wait,
 * gs_wait_any, gs_test and gs_handle_error work on it as on any handle.
 * Once complete it is inactive again and may be started again. Do not
 * start an op while another thread waits on it.
 *
 * gs_startall starts all n or none: on an error nothing is started and
 * the error (gs_last_error) names the op and why: one still active
 * (GS_ERR_DUPLICATE_NAME, "started this persistent op while it is still
 * active"), listed twice, another op of the same name in flight
 * (GS_ERR_DUPLICATE_NAME, as gs_allreduce_async), a failed job (its error)
 * or gs_shutdown called (GS_ERR_SHUTDOWN), with gs_allreduce_async's
 * texts, or a handle that is not a persistent op of ctx
 * (GS_ERR_INVALID_ARG). Right after an op completes the library may still
 * hold it for a moment (the plan or fast round that ran it ending): a start
 * then waits for that, at most 30 s (then GS_ERR_INTERNAL, nothing
 * started). gs_start(h) is gs_startall of one.
 *
 * gs_handle_free frees an inactive op at once; an active one is detached
 * as any pending op (it still completes and writes recv, which must stay
 * valid until then). As every call on ctx, gs_start and gs_startall may
 * not be called during or after gs_shutdown (every op is inactive once it
 * returns; free them with gs_handle_free then). */
GS_API gs_status gs_allreduce_init(gs_ctx *ctx, const char *name, const void *send, void *recv,
                                   size_t count, gs_dtype dtype, gs_reduce_op op,
                                   const gs_allreduce_opts *opts, gs_handle **out);
GS_API gs_status gs_startall(gs_ctx *ctx, size_t n, gs_handle *const *hs);
GS_API gs_status gs_start(gs_handle *h);

/* For uneven data: this rank has run out of data. Blocks until every rank
 * has joined; meanwhile this rank takes part in the other ranks' allreduces
 * with zeros (averages still divide by the full size, as in Horovod).
 * Allgather and broadcast while a rank has joined fail with
 * GS_ERR_INVALID_ARG. *last_joined_rank (may be NULL) receives the rank
 * that joined last. */
GS_API gs_status gs_join(gs_ctx *ctx, int *last_joined_rank);

/* Starts an allgather: every rank contributes a tensor of shape
 * [d_r, rest...] (the first dimension d_r may differ per rank, and may be
 * 0; ndim >= 1 and rest must agree) and receives the concatenation along
 * the first dimension in rank order. Since no rank knows the total size up
 * front, the result lives in a buffer owned by the handle: read it with
 * gs_handle_result and gs_allgather_dims once the op completed. send must
 * stay valid until then. */
GS_API gs_status gs_allgather_async(gs_ctx *ctx, const char *name, const void *send,
                                    const int64_t *shape, int ndim, gs_dtype dtype,
                                    const gs_op_opts *opts, gs_handle **out);

/* The result buffer of a completed allgather (alltoall, reducescatter,
 * sparse op): *data is borrowed from the handle (valid until
 * gs_handle_free), *bytes its size. It lives where the op ran: CUDA device
 * memory for an op on device buffers (nccl), host memory otherwise;
 * gs_handle_result_copy copies it into a buffer of either kind.
 * GS_ERR_INVALID_ARG for ops without a result or not completed
 * successfully. */
GS_API gs_status gs_handle_result(const gs_handle *h, const void **data, size_t *bytes);

/* Copies the result of a completed allgather, alltoall, reducescatter or
 * sparse op (the buffer gs_handle_result names) into dst, which receives
 * exactly bytes bytes: the result's size, gs_handle_result's *bytes (0:
 * nothing is copied and dst may be NULL). The result lives where the op
 * ran, and dst must be memory of the same kind:
 * - an op on host buffers (tcp, shm): dst is host memory; a memcpy, done
 *   when the call returns.
 * - an op on device buffers (nccl): dst is CUDA device memory (usually
 *   on the op's device; another device's is copied to as a peer). The
 *   copy is enqueued on the op's stream (its options' stream; NULL = the
 *   legacy default stream), after the work the caller queued there, and
 *   the call returns without waiting for it: dst is ready for work
 *   enqueued on that stream afterwards (host code synchronizes the stream
 *   before reading). The handle may be freed at once: the library releases
 *   the result buffer only after the copy (on another stream than the
 *   legacy default one, by making the legacy default stream wait for the
 *   copy: work enqueued there later starts after it). The calling thread's
 *   current CUDA device is left as it was.
 * Unlike reading gs_handle_result's pointer, this works the same for both
 * kinds, so a binding can fill a tensor allocated on the input's device.
 * GS_ERR_INVALID_ARG, with a message naming the tensor, for: a NULL h; an
 * op still pending, failed, or without a result buffer (allreduce and
 * broadcast write into the caller's buffer); bytes not the result's size;
 * a NULL dst with bytes > 0; dst in host memory for a result in GPU memory
 * or the reverse. GS_ERR_DATA_PLANE (GS_ERR_NO_MEMORY) when CUDA refuses
 * the copy; the message names the CUDA call and its error. Any thread; the
 * handle is not changed, so a result may be copied any number of times. */
GS_API gs_status gs_handle_result_copy(const gs_handle *h, void *dst, size_t bytes);

/* The first dimension each rank contributed to a completed allgather:
 * writes min(n, size) entries to rank_dims (may be NULL when n is 0) and
 * the sum of all to *total (may be NULL). */
GS_API gs_status gs_allgather_dims(const gs_handle *h, int64_t *rank_dims, size_t n,
                                   int64_t *total);

/* Starts a broadcast of count elements of buf from rank root to every rank
 * (in place). buf must stay valid until the op completes. */
GS_API gs_status gs_broadcast_async(gs_ctx *ctx, const char *name, void *buf, size_t count,
                                    gs_dtype dtype, int root, const gs_op_opts *opts,
                                    gs_handle **out);

/* Blocks until every rank called gs_barrier (the n-th call on each rank
 * meets the n-th on the others). Returns early with the job's error if it
 * fails. */
GS_API gs_status gs_barrier(gs_ctx *ctx);

/* Waits until the op completes or timeout_ms passes (-1 = no timeout; the
 * wait still ends when the job fails). Returns the op's status, or
 * GS_ERR_TIMEOUT if it is still pending. */
GS_API gs_status gs_wait(gs_handle *h, int timeout_ms);

/* Waits until one of n handles completes; *index receives the position of
 * a completed one (the lowest if several are). Returns that op's status, or
 * GS_ERR_TIMEOUT with *index unchanged. All handles must belong to the same
 * context. */
GS_API gs_status gs_wait_any(gs_handle *const *hs, size_t n, int timeout_ms, size_t *index);

/* As gs_wait_any (timeout 0: a test that never blocks), for a thread that
 * only collects completions on the application's behalf (a binding's
 * completer thread, an event loop): the wait does not count as this rank
 * waiting on the ops for deadlock detection. A rank whose application
 * threads compute while such a thread waits on its ops is not blocked; the
 * application's own gs_wait, gs_wait_any and gs_test still count. With
 * several handles, *index tells a completed one (set *index to n before the
 * call to tell "still pending" from an op that failed with GS_ERR_TIMEOUT). */
GS_API gs_status gs_wait_any_passive(gs_handle *const *hs, size_t n, int timeout_ms, size_t *index);

/* *done = 1 if the op completed (successfully or not), else 0. Returns
 * GS_OK, or GS_ERR_INVALID_ARG for NULL arguments. For deadlock detection,
 * testing a pending op again and again counts as waiting on it, as does
 * gs_wait with a timeout called in a loop: the op counts as blocked from
 * the first wait or test (while it was waited on or tested in the last 2
 * seconds), and only new submissions count as progress. */
GS_API gs_status gs_test(gs_handle *h, int *done);

/* The error message of a failed op ("" while pending or on success). Valid
 * until the handle is freed. */
GS_API const char *gs_handle_error(const gs_handle *h);

/* Releases the caller's reference. Freeing a pending op detaches it: the op
 * still completes and writes its recv buffer, which must stay valid until
 * then (or until gs_shutdown). gs_handle_free(NULL) is a no-op. */
GS_API void gs_handle_free(gs_handle *h);

/* Message of the last failed call made by the calling thread (ctx may be
 * NULL, e.g. after gs_init failed). Valid until the thread's next call. */
GS_API const char *gs_last_error(const gs_ctx *ctx);

/* The library's version at run time ("0.1.0"); GS_VERSION_STRING is the
 * header's. Static string; any thread. */
GS_API const char *gs_version(void);

/* NCCL's version code as ncclGetVersion gives it (e.g. 22809 for 2.28.9)
 * when this library was built with the nccl backend, else 0 (built without
 * it). Says nothing about GPUs being present. Any thread; no gs_init
 * needed. */
GS_API int gs_nccl_version(void);

/* "GS_ERR_MISMATCH: tensor differs across ranks"-style text; never NULL. */
GS_API const char *gs_status_str(gs_status status);

/* ---- the job's key-value store, for the application ----
 * A rendezvous for frameworks that need one (e.g. a torch.distributed
 * Store, so that a PyTorch process group needs no MASTER_ADDR and no port of
 * its own). Keys live in an application namespace of this job and epoch at
 * the coordinator, apart from the library's own keys; every rank of the job
 * can read and write every key of it, over the job's authenticated channel.
 * Any thread, concurrently with collectives; each call is one round trip to
 * the coordinator. */
#define GS_KV_KEY_MAX 448         /* bytes of a key, without the NUL */
#define GS_KV_VALUE_MAX (1 << 20) /* bytes of a value */
#define GS_KV_WAIT_MAX_MS 60000   /* longest single gs_kv_get wait */

/* Stores len bytes of value under key (replacing any value). value is
 * borrowed for the call. GS_ERR_INVALID_ARG for an empty or over-long key or
 * value; GS_ERR_COORDINATOR_LOST / GS_ERR_UNAUTHENTICATED from the
 * coordinator. */
GS_API gs_status gs_kv_set(gs_ctx *ctx, const char *key, const void *value, size_t len);

/* Reads key, waiting up to timeout_ms (0 = answer at once, at most
 * GS_KV_WAIT_MAX_MS) for it to be set. On success *value is a new buffer of
 * *len bytes (never NULL, even for an empty value) that the caller frees
 * with gs_free. GS_ERR_TIMEOUT if the key was not set in time (*value NULL). */
GS_API gs_status gs_kv_get(gs_ctx *ctx, const char *key, int timeout_ms, void **value, size_t *len);

/* Frees memory the library handed to the caller (gs_kv_get). NULL is a no-op. */
GS_API void gs_free(void *p);

/* Counters of one context since gs_init, for tests, benchmarks and
 * monitoring. */
typedef struct gs_stats {
  size_t struct_size;            /* sizeof(gs_stats); set by gs_stats_init */
  uint64_t plans_executed;       /* numbered plans run */
  uint64_t collectives;          /* collectives run on the data plane */
  uint64_t tensors;              /* tensors completed by those collectives */
  uint64_t fused_collectives;    /* collectives that carried more than one tensor */
  uint64_t requests_sent;        /* tensor requests sent to the coordinator (full or cached) */
  uint64_t cache_hits;           /* of those, sent as a response-cache id */
  uint64_t bytes_to_coordinator; /* encoded bytes of every message sent to it */
  uint64_t messages_to_coordinator;
  uint64_t local_ops;       /* ops on local tensors (never sent) */
  uint64_t plans_replayed;  /* plans the coordinator sent as a template id */
  uint64_t gpu_collectives; /* of collectives, those run by the nccl backend */
  /* The fast path (issue 14): rounds in which the ranks agreed among
   * themselves, over the data plane, on which cached ops to run, without
   * asking the coordinator; the tensors those rounds completed (also
   * counted in tensors); and how often the ranks went back to the
   * coordinator (an uncached op, a reordering, a barrier missing on a rank,
   * the coordinator's FastStop). */
  uint64_t fast_rounds;
  uint64_t fast_tensors;
  uint64_t fast_escalations;
  /* Of fast_tensors, the small float32 allreduces that rode in the
   * round's agreement (completed by that one exchange; see
   * docs/design-notes.md). */
  uint64_t fast_ride_tensors;
} gs_stats;

/* Sets struct_size and zeroes the counters. */
GS_API void gs_stats_init(gs_stats *stats);

/* Fills *out with ctx's counters, as many as out->struct_size (set by
 * gs_stats_init) holds. Any thread. */
GS_API gs_status gs_get_stats(const gs_ctx *ctx, gs_stats *out);

/* Size in bytes of one element of dtype; 0 if invalid. */
GS_API size_t gs_dtype_size(gs_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif
