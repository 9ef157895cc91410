/* NCCL backend: the GPU data plane.
 *
 * One communicator per context, created with NCCL's non-blocking config so
 * that no NCCL call ever blocks this library: init, every collective and
 * the teardown return at once (possibly ncclInProgress) and we poll
 * ncclCommGetAsyncError, the abort flag and the data-plane timeout, calling
 * ncclCommAbort when any of them fires. Nothing waits inside a kernel
 * without a way out.
 *
 * Rendezvous goes through the coordinator's kv store (gs__kv): rank 0 makes
 * the ncclUniqueId and stores it under "<prefix>nccl/id"; the others read
 * it. The store answers only callers holding the job token, so the id (a
 * join credential) stays with the job.
 *
 * Work runs on a dedicated non-blocking stream: begin() records an event on
 * each caller stream and makes our stream wait for it (the caller's stream
 * is never synchronised from the host); copies (cuda_pack.cu) and
 * collectives are enqueued on our stream; finish() records an event and
 * polls it. The fusion staging buffer is device memory owned here.
 *
 * Threads: everything runs on the worker's exec thread except abort (any
 * thread: sets a flag the polls see) and mem_free (any thread). cudaError_t
 * and ncclResult_t are translated to gradsync statuses and text only in
 * cuda_fail and nccl_fail. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cuda_pack.h"
#include "dtype.h"
#include "status.h"

_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");

typedef struct nccl_be {
  gs__backend base;
  int rank, size, device;
  int io_timeout_ms;
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t done;
  cudaEvent_t *ev; /* one per caller stream of the current op */
  size_t nev;
  void *staging;
  size_t staging_cap;
  atomic_int aborted; /* abort() was called */
  int comm_aborted;   /* ncclCommAbort was called */
  int broken;         /* a failure left the communicator unusable */
  char broken_msg[1024];
  int64_t op_deadline; /* ms: the data-plane timeout of the current op */
} nccl_be;

static const gs__backend_vtbl k_vtbl;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap(int *us) {
  struct timespec ts = {0, (long)*us * 1000};
  nanosleep(&ts, NULL);
  if (*us < 1000) *us *= 2;
}

/* ---- the one place where CUDA and NCCL errors become ours --------------- */

static int cuda_fail(nccl_be *nb, cudaError_t e, const char *what, char *err, size_t errlen) {
  if (nb)
    snprintf(err, errlen, "nccl backend (rank %d, CUDA device %d): %s failed: %s (%s)", nb->rank,
             nb->device, what, cudaGetErrorString(e), cudaGetErrorName(e));
  else /* outside a backend (gs__cuda_result_copy): what names the device */
    snprintf(err, errlen, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  if (nb) {
    nb->broken = 1;
    snprintf(nb->broken_msg, sizeof nb->broken_msg, "%s", err);
  }
  (void)cudaGetLastError(); /* clear a sticky launch error we reported */
  return e == cudaErrorMemoryAllocation ? GS__ERR_NO_MEMORY : GS__ERR_DATA_PLANE;
}

static void comm_abort(nccl_be *nb) {
  if (nb->comm && !nb->comm_aborted) {
    ncclCommAbort(nb->comm);
    nb->comm_aborted = 1;
  }
  nb->broken = 1;
}

static int nccl_fail(nccl_be *nb, ncclResult_t r, const char *what, char *err, size_t errlen) {
  const char *last = nb->comm ? ncclGetLastError(nb->comm) : ncclGetLastError(NULL);
  snprintf(err, errlen, "nccl backend (rank %d of %d, CUDA device %d): %s failed: %s%s%s", nb->rank,
           nb->size, nb->device, what, ncclGetErrorString(r), last && *last ? ": " : "",
           last ? last : "");
  snprintf(nb->broken_msg, sizeof nb->broken_msg, "%s", err);
  comm_abort(nb);
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? GS__ERR_INTERNAL : GS__ERR_DATA_PLANE;
}

static int aborted_error(nccl_be *nb, const char *what, char *err, size_t errlen) {
  comm_abort(nb);
  snprintf(err, errlen, "nccl backend (rank %d): %s interrupted: the job was aborted", nb->rank,
           what);
  snprintf(nb->broken_msg, sizeof nb->broken_msg, "%s", err);
  return GS__ERR_ABORTED;
}

static int timeout_error(nccl_be *nb, const char *what, int ms, char *err, size_t errlen) {
  comm_abort(nb);
  snprintf(err, errlen,
           "nccl backend (rank %d of %d, CUDA device %d): %s did not complete within %d ms (a "
           "peer rank is stuck, dead or much slower; raise GRADSYNC_DATA_TIMEOUT_MS if "
           "collectives are legitimately that long); the communicator was aborted",
           nb->rank, nb->size, nb->device, what, ms);
  snprintf(nb->broken_msg, sizeof nb->broken_msg, "%s", err);
  return GS__ERR_DATA_PLANE;
}

/* Polls a non-blocking communicator until its last call finished. */
static int wait_comm(nccl_be *nb, ncclResult_t r, const char *what, int64_t deadline, int ms,
                     char *err, size_t errlen) {
  int us = 20;
  for (;;) {
    if (r == ncclSuccess) return GS__OK;
    if (r != ncclInProgress) return nccl_fail(nb, r, what, err, errlen);
    if (atomic_load(&nb->aborted)) return aborted_error(nb, what, err, errlen);
    if (now_ms() >= deadline) return timeout_error(nb, what, ms, err, errlen);
    nap(&us);
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(nb->comm, &st);
    r = q != ncclSuccess ? q : st;
  }
}

static int check_usable(nccl_be *nb, char *err, size_t errlen) {
  if (atomic_load(&nb->aborted)) return aborted_error(nb, "the collective", err, errlen);
  if (nb->broken) {
    snprintf(err, errlen, "%s", nb->broken_msg);
    return GS__ERR_DATA_PLANE;
  }
  cudaError_t e = cudaSetDevice(nb->device); /* per thread: the exec thread's first call */
  if (e != cudaSuccess) return cuda_fail(nb, e, "cudaSetDevice", err, errlen);
  return GS__OK;
}

/* After enqueueing a collective: in non-blocking mode it may still be in
 * progress on the host side. */
static int enqueued(nccl_be *nb, ncclResult_t r, const char *what, char *err, size_t errlen) {
  return wait_comm(nb, r, what, nb->op_deadline, nb->io_timeout_ms, err, errlen);
}

/* ---- CUDA probes used by the factory ------------------------------------ */

int gs__cuda_usable(int *ndevices, char *why, size_t whylen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, whylen, "no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return 0;
  }
  if (n <= 0) {
    snprintf(why, whylen, "no CUDA device: cudaGetDeviceCount found none");
    return 0;
  }
  *ndevices = n;
  int drv = 0, rt = 0, nv = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  ncclGetVersion(&nv);
  snprintf(why, whylen, "%d CUDA device(s), driver %d, runtime %d, NCCL %d", n, drv, rt, nv);
  return 1;
}

/* NCCL's version code (no GPU needed). */
int gs__nccl_version(void) {
  int nv = 0;
  if (ncclGetVersion(&nv) != ncclSuccess) return 0;
  return nv;
}

gs__device gs__cuda_pointer_device(const void *p, int *device) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return GS__DEVICE_CPU;
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    if (device) *device = a.device;
    return GS__DEVICE_GPU;
  }
  return GS__DEVICE_CPU;
}

/* gs_handle_result_copy of a device result (see backend.h). The result was
 * allocated by mem_alloc_vt and is released by mem_free_vt with
 * cudaFreeAsync on the legacy default stream: when the copy runs on another
 * stream, that stream records an event the legacy stream waits for, so
 * neither the free nor whatever the pool hands the memory to next can
 * overtake the copy. No host wait. The copy is made with the result's
 * device current (the op's stream is that device's); the caller's current
 * device is kept. */
int gs__cuda_result_copy(void *dst, const void *src, size_t bytes, void *stream, char *err,
                         size_t errlen) {
  char what[160] = "";
  int prev = -1, dev = -1;
  if (gs__cuda_pointer_device(src, &dev) != GS__DEVICE_GPU || dev < 0) {
    snprintf(err, errlen, "internal: the result (%p) is not in CUDA device memory", src);
    return GS__ERR_INTERNAL;
  }
  cudaError_t e = cudaGetDevice(&prev);
  if (e != cudaSuccess) return cuda_fail(NULL, e, "cudaGetDevice", err, errlen);
  if (prev != dev && (e = cudaSetDevice(dev)) != cudaSuccess) {
    snprintf(what, sizeof what, "cudaSetDevice(%d) for the copy of the result", dev);
    return cuda_fail(NULL, e, what, err, errlen);
  }
  cudaStream_t s = (cudaStream_t)stream;
  e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
  if (e != cudaSuccess) {
    snprintf(what, sizeof what,
             "cudaMemcpyAsync of the %zu-byte result (CUDA device %d) into dst on stream %p", bytes,
             dev, stream);
    goto out_restore_device;
  }
  if (s != NULL && s != cudaStreamLegacy) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(ev, s);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(cudaStreamLegacy, ev, 0);
      cudaEventDestroy(ev); /* released once it completed */
    }
    if (e != cudaSuccess) {
      /* The copy stays enqueued but may read a released buffer: dst may
       * hold garbage, which the failure tells the caller. No host wait. */
      snprintf(what, sizeof what,
               "ordering the release of the result after its copy on stream %p (CUDA device %d)",
               stream, dev);
      goto out_restore_device;
    }
  }
out_restore_device:
  if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
  if (e != cudaSuccess) return cuda_fail(NULL, e, what, err, errlen);
  return GS__OK;
}

/* ---- rendezvous ---------------------------------------------------------- */

int gs__nccl_rendezvous(const gs__kv *kv, const char *prefix, int rank, int timeout_ms,
                        unsigned char id[128], char *err, size_t errlen) {
  char key[256];
  snprintf(key, sizeof key, "%snccl/id", prefix ? prefix : "");
  if (rank == 0) {
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
      snprintf(err, errlen, "nccl rendezvous (rank 0): ncclGetUniqueId failed: %s%s%s",
               ncclGetErrorString(r), ncclGetLastError(NULL) ? ": " : "",
               ncclGetLastError(NULL) ? ncclGetLastError(NULL) : "");
      return GS__ERR_DATA_PLANE;
    }
    memcpy(id, uid.internal, 128);
    char kerr[1024];
    int rc = kv->set(kv->ctx, key, id, 128, kerr, sizeof kerr);
    if (rc) snprintf(err, errlen, "nccl rendezvous (rank 0): storing '%s': %s", key, kerr);
    return rc;
  }
  void *val = NULL;
  size_t len = 0;
  char kerr[1024];
  int rc = kv->get(kv->ctx, key, timeout_ms, &val, &len, kerr, sizeof kerr);
  if (rc == GS__ERR_TIMEOUT) {
    snprintf(err, errlen,
             "nccl rendezvous (rank %d): rank 0 did not publish the NCCL unique id ('%s') within "
             "%d ms; is rank 0 running with GRADSYNC_BACKEND=nccl on a GPU?",
             rank, key, timeout_ms);
    return rc;
  }
  if (rc) {
    snprintf(err, errlen, "nccl rendezvous (rank %d): reading '%s': %s", rank, key, kerr);
    return rc;
  }
  if (len != 128) {
    free(val);
    snprintf(err, errlen,
             "nccl rendezvous (rank %d): '%s' holds %zu bytes, not a 128-byte ncclUniqueId", rank,
             key, len);
    return GS__ERR_DATA_PLANE;
  }
  memcpy(id, val, 128);
  free(val);
  return GS__OK;
}

/* ---- staging, copies, ordering ------------------------------------------- */

static void *staging_vt(gs__backend *b, size_t bytes, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  if (check_usable(nb, err, errlen)) return NULL;
  if (bytes <= nb->staging_cap && nb->staging) return nb->staging;
  size_t cap = nb->staging_cap ? nb->staging_cap : 4 << 20;
  while (cap < bytes) cap *= 2;
  void *p = NULL;
  /* stream-ordered: no device-wide synchronisation while growing */
  if (nb->staging) cudaFreeAsync(nb->staging, nb->stream);
  nb->staging = NULL;
  nb->staging_cap = 0;
  cudaError_t e = cudaMallocAsync(&p, cap, nb->stream);
  if (e != cudaSuccess) {
    cuda_fail(nb, e, "cudaMallocAsync of the fusion buffer", err, errlen);
    nb->broken = 0; /* out of memory leaves the communicator usable */
    return NULL;
  }
  nb->staging = p;
  nb->staging_cap = cap;
  return p;
}

static int nccl_copy_vt(gs__backend *b, const gs__copy *c, size_t n, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  int rc = check_usable(nb, err, errlen);
  if (rc) return rc;
  gs__cuda_copy_desc d[64];
  size_t nd = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i < n && c[i].count) {
      if (gs__dtype_size(c[i].src_dt) == 0 || gs__dtype_size(c[i].dst_dt) == 0 ||
          (int)c[i].src_dt > GS__UINT8 || (int)c[i].dst_dt > GS__UINT8) {
        snprintf(err, errlen, "nccl backend: the copy kernel has no dtype %d", (int)c[i].dst_dt);
        return GS__ERR_UNSUPPORTED;
      }
      d[nd++] = (gs__cuda_copy_desc){c[i].src,   c[i].dst,         c[i].count,
                                     c[i].scale, (int)c[i].src_dt, (int)c[i].dst_dt};
    }
    /* flush in launches of up to 64 here; the kernel takes 512, but the
     * descriptors are built on this thread's stack */
    if (nd && (nd == sizeof d / sizeof *d || i == n)) {
      int e = gs__cuda_batched_copy(d, (int)nd, nb->stream);
      if (e) return cuda_fail(nb, (cudaError_t)e, "the batched copy kernel", err, errlen);
      nd = 0;
    }
  }
  return GS__OK;
}

static void *mem_alloc_vt(gs__backend *b, size_t bytes) {
  nccl_be *nb = (nccl_be *)b;
  if (cudaSetDevice(nb->device) != cudaSuccess) return NULL;
  void *p = NULL;
  if (cudaMallocAsync(&p, bytes ? bytes : 1, nb->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

static void mem_free_vt(void *p) {
  /* Stream-ordered on the default stream: the host does not wait, and a
   * hung kernel elsewhere cannot block the caller (gs_handle_free). */
  if (p && cudaFreeAsync(p, 0) != cudaSuccess) (void)cudaGetLastError();
}

static int begin_vt(gs__backend *b, void *const *streams, size_t n, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  int rc = check_usable(nb, err, errlen);
  if (rc) return rc;
  nb->op_deadline = now_ms() + nb->io_timeout_ms;
  if (n > nb->nev) {
    cudaEvent_t *ev = realloc(nb->ev, n * sizeof *ev);
    if (!ev) {
      snprintf(err, errlen, "nccl backend: out of memory for %zu events", n);
      return GS__ERR_NO_MEMORY;
    }
    nb->ev = ev;
    for (size_t i = nb->nev; i < n; i++) {
      cudaError_t e = cudaEventCreateWithFlags(&nb->ev[i], cudaEventDisableTiming);
      if (e != cudaSuccess) return cuda_fail(nb, e, "cudaEventCreate", err, errlen);
      nb->nev = i + 1;
    }
  }
  for (size_t i = 0; i < n; i++) {
    cudaError_t e = cudaEventRecord(nb->ev[i], (cudaStream_t)streams[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(nb->stream, nb->ev[i], 0);
    if (e != cudaSuccess)
      return cuda_fail(nb, e, "ordering after the caller's stream (cudaEventRecord)", err, errlen);
  }
  return GS__OK;
}

static int finish_vt(gs__backend *b, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  cudaError_t e = cudaEventRecord(nb->done, nb->stream);
  if (e != cudaSuccess) return cuda_fail(nb, e, "cudaEventRecord", err, errlen);
  int us = 20;
  for (;;) {
    e = cudaEventQuery(nb->done);
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(nb->comm, &st);
    if (q != ncclSuccess) st = q;
    if (st != ncclSuccess && st != ncclInProgress)
      return nccl_fail(nb, st, "the collective (asynchronous error)", err, errlen);
    if (e == cudaSuccess) return GS__OK;
    if (e != cudaErrorNotReady) return cuda_fail(nb, e, "the collective's stream", err, errlen);
    if (atomic_load(&nb->aborted)) return aborted_error(nb, "the collective", err, errlen);
    if (now_ms() >= nb->op_deadline)
      return timeout_error(nb, "the collective", nb->io_timeout_ms, err, errlen);
    nap(&us);
  }
}

/* ---- collectives ------------------------------------------------------------ */

static int nccl_dtype(gs__dtype dt, ncclDataType_t *out) {
  switch (dt) {
  case GS__FLOAT32:
    *out = ncclFloat32;
    return 1;
  case GS__FLOAT64:
    *out = ncclFloat64;
    return 1;
  case GS__FLOAT16:
    *out = ncclFloat16;
    return 1;
  case GS__BFLOAT16:
    *out = ncclBfloat16;
    return 1;
  case GS__INT32:
    *out = ncclInt32;
    return 1;
  case GS__INT64:
    *out = ncclInt64;
    return 1;
  case GS__INT8:
    *out = ncclInt8;
    return 1;
  case GS__UINT8:
    *out = ncclUint8;
    return 1;
  default:
    return 0;
  }
}

static int nccl_op(gs__reduce_op op, ncclRedOp_t *out) {
  switch (op) {
  case GS__SUM:
    *out = ncclSum;
    return 1;
  case GS__AVERAGE:
    *out = ncclAvg;
    return 1;
  case GS__MIN:
    *out = ncclMin;
    return 1;
  case GS__MAX:
    *out = ncclMax;
    return 1;
  case GS__PRODUCT:
    *out = ncclProd;
    return 1;
  default:
    return 0;
  }
}

static int types(gs__dtype dt, gs__reduce_op op, ncclDataType_t *t, ncclRedOp_t *o, char *err,
                 size_t errlen) {
  if (!nccl_dtype(dt, t)) {
    snprintf(err, errlen, "NCCL has no %s type; use a host buffer for it", gs__dtype_name(dt));
    return GS__ERR_UNSUPPORTED;
  }
  if (!nccl_op(op, o)) {
    snprintf(err, errlen, "NCCL has no reduce op %d", (int)op);
    return GS__ERR_UNSUPPORTED;
  }
  return GS__OK;
}

static int allreduce_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                        char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  ncclDataType_t t;
  ncclRedOp_t o;
  int rc = check_usable(nb, err, errlen);
  if (rc || (rc = types(dt, op, &t, &o, err, errlen))) return rc;
  return enqueued(nb, ncclAllReduce(buf, buf, count, t, o, nb->comm, nb->stream), "ncclAllReduce",
                  err, errlen);
}

static int allgatherv_vt(gs__backend *b, const void *send, void *recv, const size_t *bytes,
                         char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  int rc = check_usable(nb, err, errlen);
  if (rc) return rc;
  int even = 1;
  for (int q = 0; q < nb->size; q++)
    if (bytes[q] != bytes[0]) even = 0;
  if (even) /* send aliases recv at this rank's block, or not: both are fine */
    return enqueued(nb, ncclAllGather(send, recv, bytes[0], ncclUint8, nb->comm, nb->stream),
                    "ncclAllGather", err, errlen);
  /* Uneven first dimensions: one broadcast per rank, in one group. */
  ncclResult_t r = ncclGroupStart();
  size_t at = 0;
  for (int q = 0; q < nb->size && r == ncclSuccess; q++) {
    uint8_t *dst = (uint8_t *)recv + at;
    if (bytes[q])
      r = ncclBroadcast(q == nb->rank ? send : dst, dst, bytes[q], ncclUint8, q, nb->comm,
                        nb->stream);
    at += bytes[q];
  }
  ncclResult_t g = ncclGroupEnd();
  return enqueued(nb, r != ncclSuccess ? r : g, "ncclBroadcast group (allgatherv)", err, errlen);
}

static int broadcast_vt(gs__backend *b, void *buf, size_t len, int root, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  int rc = check_usable(nb, err, errlen);
  if (rc) return rc;
  return enqueued(nb, ncclBroadcast(buf, buf, len, ncclUint8, root, nb->comm, nb->stream),
                  "ncclBroadcast", err, errlen);
}

static int reducescatter_vt(gs__backend *b, void *buf, const size_t *counts, gs__dtype dt,
                            gs__reduce_op op, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  ncclDataType_t t;
  ncclRedOp_t o;
  int rc = check_usable(nb, err, errlen);
  if (rc || (rc = types(dt, op, &t, &o, err, errlen))) return rc;
  size_t es = gs__dtype_size(dt), start = 0;
  int even = 1;
  for (int q = 0; q < nb->size; q++) {
    if (counts[q] != counts[0]) even = 0;
    if (q < nb->rank) start += counts[q];
  }
  if (even) /* in place: recvbuff = sendbuff + rank * recvcount */
    return enqueued(
        nb,
        ncclReduceScatter(buf, (uint8_t *)buf + start * es, counts[0], t, o, nb->comm, nb->stream),
        "ncclReduceScatter", err, errlen);
  /* Uneven blocks: one reduce per block to its owner, in one group. */
  ncclResult_t r = ncclGroupStart();
  size_t at = 0;
  for (int q = 0; q < nb->size && r == ncclSuccess; q++) {
    uint8_t *p = (uint8_t *)buf + at * es;
    if (counts[q]) r = ncclReduce(p, p, counts[q], t, o, q, nb->comm, nb->stream);
    at += counts[q];
  }
  ncclResult_t g = ncclGroupEnd();
  return enqueued(nb, r != ncclSuccess ? r : g, "ncclReduce group (reducescatter)", err, errlen);
}

static int alltoallv_vt(gs__backend *b, const void *send, const size_t *send_bytes, void *recv,
                        const size_t *recv_bytes, char *err, size_t errlen) {
  nccl_be *nb = (nccl_be *)b;
  int rc = check_usable(nb, err, errlen);
  if (rc) return rc;
  size_t so = 0, ro = 0, self_so = 0, self_ro = 0;
  ncclResult_t r = ncclGroupStart();
  for (int q = 0; q < nb->size && r == ncclSuccess; q++) {
    if (q == nb->rank) {
      self_so = so;
      self_ro = ro;
    } else {
      if (send_bytes[q])
        r = ncclSend((const uint8_t *)send + so, send_bytes[q], ncclUint8, q, nb->comm, nb->stream);
      if (r == ncclSuccess && recv_bytes[q])
        r = ncclRecv((uint8_t *)recv + ro, recv_bytes[q], ncclUint8, q, nb->comm, nb->stream);
    }
    so += send_bytes[q];
    ro += recv_bytes[q];
  }
  ncclResult_t g = ncclGroupEnd();
  if ((rc = enqueued(nb, r != ncclSuccess ? r : g, "ncclSend/ncclRecv group (alltoall)", err,
                     errlen)))
    return rc;
  size_t mine = send_bytes[nb->rank];
  if (mine) {
    cudaError_t e = cudaMemcpyAsync((uint8_t *)recv + self_ro, (const uint8_t *)send + self_so,
                                    mine, cudaMemcpyDeviceToDevice, nb->stream);
    if (e != cudaSuccess)
      return cuda_fail(nb, e, "cudaMemcpyAsync (alltoall, own block)", err, errlen);
  }
  return GS__OK;
}

static void abort_vt(gs__backend *b) {
  atomic_store(&((nccl_be *)b)->aborted, 1);
}

static void destroy_vt(gs__backend *b) {
  nccl_be *nb = (nccl_be *)b;
  cudaSetDevice(nb->device);
  if (nb->comm) {
    if (!nb->broken && !atomic_load(&nb->aborted)) {
      /* Flush and tear down without blocking on a peer: bounded. */
      char err[1024];
      int64_t deadline = now_ms() + (nb->io_timeout_ms < 10000 ? nb->io_timeout_ms : 10000);
      if (wait_comm(nb, ncclCommFinalize(nb->comm), "ncclCommFinalize", deadline, 10000, err,
                    sizeof err) == GS__OK)
        ncclCommDestroy(nb->comm);
      else
        comm_abort(nb);
    } else {
      comm_abort(nb);
    }
  }
  /* Nothing here waits for the stream: a caller's stream that never
   * finishes (our stream waits on its events) must not hang gs_shutdown.
   * The frees are stream-ordered; destroying a stream or an event with
   * work pending releases it once that work is done. */
  if (nb->staging) cudaFreeAsync(nb->staging, nb->stream);
  for (size_t i = 0; i < nb->nev; i++) cudaEventDestroy(nb->ev[i]);
  free(nb->ev);
  if (nb->done) cudaEventDestroy(nb->done);
  if (nb->stream) cudaStreamDestroy(nb->stream);
  (void)cudaGetLastError();
  free(nb);
}

static const gs__backend_vtbl k_vtbl = {
    .name = "nccl",
    .device = GS__DEVICE_GPU,
    .staging = staging_vt,
    .copy = nccl_copy_vt,
    .mem_alloc = mem_alloc_vt,
    .mem_free = mem_free_vt,
    .begin = begin_vt,
    .finish = finish_vt,
    .allreduce = allreduce_vt,
    .allgatherv = allgatherv_vt,
    .broadcast = broadcast_vt,
    .reducescatter = reducescatter_vt,
    .alltoallv = alltoallv_vt,
    /* .agree stays NULL: fast rounds agree on the host backend (backend.h) */
    .abort = abort_vt,
    .destroy = destroy_vt,
};

int gs__nccl_create(const gs__nccl_opts *o, gs__backend **out, char *err, size_t errlen) {
  *out = NULL;
  if (!o || o->size < 1 || o->rank < 0 || o->rank >= o->size || o->device < 0 || !o->kv.get ||
      !o->kv.set) {
    snprintf(err, errlen, "nccl backend: invalid options (rank %d, size %d, device %d)",
             o ? o->rank : -1, o ? o->size : -1, o ? o->device : -1);
    return GS__ERR_INVALID_ARG;
  }
  char why[512];
  int ndev = 0;
  if (!gs__cuda_usable(&ndev, why, sizeof why)) {
    snprintf(err, errlen, "%s", why);
    return GS__ERR_UNSUPPORTED;
  }
  if (o->device >= ndev) {
    snprintf(err, errlen, "CUDA device %d does not exist (%d visible)", o->device, ndev);
    return GS__ERR_UNSUPPORTED;
  }
  nccl_be *nb = calloc(1, sizeof *nb);
  if (!nb) {
    snprintf(err, errlen, "nccl backend: out of memory");
    return GS__ERR_NO_MEMORY;
  }
  nb->base.v = &k_vtbl;
  nb->rank = o->rank;
  nb->size = o->size;
  nb->device = o->device;
  nb->io_timeout_ms = o->io_timeout_ms > 0 ? o->io_timeout_ms : 60000;
  atomic_init(&nb->aborted, 0);
  int rc;
  cudaError_t e = cudaSetDevice(o->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&nb->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&nb->done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cuda_fail(nb, e, "setting up the CUDA device", err, errlen);
    rc = GS__ERR_UNSUPPORTED;
    goto out_destroy;
  }
  ncclUniqueId id;
  rc = gs__nccl_rendezvous(&o->kv, o->key_prefix, o->rank, o->connect_timeout_ms,
                           (unsigned char *)id.internal, err, errlen);
  if (rc) goto out_destroy;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* every call returns at once; we poll with a deadline */
  ncclResult_t r = ncclCommInitRankConfig(&nb->comm, o->size, id, o->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) nb->comm = NULL;
  rc = wait_comm(nb, r, "ncclCommInitRank", now_ms() + o->connect_timeout_ms, o->connect_timeout_ms,
                 err, errlen);
  if (rc) goto out_destroy;
  *out = &nb->base;
  return GS__OK;
out_destroy:
  nb->broken = 1;
  destroy_vt(&nb->base);
  return rc;
}
