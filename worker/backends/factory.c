/* The backend factory: kind -> backend with its own options, whether a
 * kind can run in this process, where a buffer lives, and the host staging
 * and copies that host backends share.
 *
 * Owns nothing; pure functions plus the CUDA probes of nccl.c when the
 * library was built with NCCL. Any thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "status.h"

#include "gradsync.h"

#ifdef GS_HAVE_NCCL
/* nccl.c */
int gs__cuda_usable(int *ndevices, char *why, size_t whylen);
gs__device gs__cuda_pointer_device(const void *p, int *device);
int gs__cuda_result_copy(void *dst, const void *src, size_t bytes, void *stream, char *err,
                         size_t errlen);
int gs__nccl_version(void);
#endif

int gs_nccl_version(void) {
#ifdef GS_HAVE_NCCL
  return gs__nccl_version();
#else
  return 0;
#endif
}

int gs__backend_kind_parse(const char *name) {
  if (!name) return -1;
  if (!strcmp(name, "tcp")) return GS__BACKEND_TCP;
  if (!strcmp(name, "nccl")) return GS__BACKEND_NCCL;
  if (!strcmp(name, "shm")) return GS__BACKEND_SHM;
  return -1;
}

const char *gs__backend_kind_name(gs__backend_kind kind) {
  return kind == GS__BACKEND_NCCL ? "nccl" : kind == GS__BACKEND_SHM ? "shm" : "tcp";
}

int gs__backend_usable(gs__backend_kind kind, int *ndevices, char *why, size_t whylen) {
  if (ndevices) *ndevices = 0;
  if (kind == GS__BACKEND_TCP) {
    snprintf(why, whylen, "host buffers over TCP");
    return 1;
  }
  if (kind == GS__BACKEND_SHM) {
    snprintf(why, whylen, "host buffers over shared memory within a host");
    return 1;
  }
#ifdef GS_HAVE_NCCL
  return gs__cuda_usable(ndevices, why, whylen);
#else
  snprintf(why, whylen,
           "this libgradsync was built without NCCL (configure with -DGRADSYNC_WITH_NCCL=ON "
           "where CUDA and NCCL are installed)");
  return 0;
#endif
}

int gs__backend_create(gs__backend_kind kind, const void *opts, gs__backend **out, char *err,
                       size_t errlen) {
  *out = NULL;
  switch (kind) {
  case GS__BACKEND_TCP:
    return gs__tcp_ring_create(opts, out, err, errlen);
  case GS__BACKEND_SHM:
    return gs__shm_create(opts, out, err, errlen);
  case GS__BACKEND_NCCL:
#ifdef GS_HAVE_NCCL
    return gs__nccl_create(opts, out, err, errlen);
#else
    (void)opts;
    snprintf(err, errlen,
             "the nccl backend is not built into this libgradsync (configure with "
             "-DGRADSYNC_WITH_NCCL=ON where CUDA and NCCL are installed), or set "
             "GRADSYNC_BACKEND=tcp");
    return GS__ERR_UNSUPPORTED;
#endif
  }
  snprintf(err, errlen, "unknown backend kind %d", (int)kind);
  return GS__ERR_INVALID_ARG;
}

gs__device gs__pointer_device(const void *p, int *device) {
  if (device) *device = -1;
#ifdef GS_HAVE_NCCL
  if (p) return gs__cuda_pointer_device(p, device);
#else
  (void)p;
#endif
  return GS__DEVICE_CPU;
}

int gs__device_result_copy(void *dst, const void *src, size_t bytes, void *stream, char *err,
                           size_t errlen) {
#ifdef GS_HAVE_NCCL
  return gs__cuda_result_copy(dst, src, bytes, stream, err, errlen);
#else
  (void)dst, (void)src, (void)bytes, (void)stream;
  snprintf(err, errlen, "this libgradsync was built without CUDA; it holds no device results");
  return GS__ERR_UNSUPPORTED;
#endif
}

int gs__host_reduce_args(const char *who, const char *what, gs__dtype dt, gs__reduce_op op,
                         char *err, size_t errlen) {
  if ((unsigned)dt >= GS__DTYPE_COUNT) {
    snprintf(err, errlen, "%s: %s: dtype %d is not a valid dtype (0..%d)", who, what, (int)dt,
             GS__DTYPE_COUNT - 1);
    return GS__ERR_INVALID_ARG;
  }
  if (op == GS__ADASUM) {
    snprintf(err, errlen,
             "%s: %s: op \"adasum\" is not supported on CPU buffers (%s); use sum or average", who,
             what, who);
    return GS__ERR_UNSUPPORTED;
  }
  if ((unsigned)op >= GS__REDUCE_OP_COUNT) {
    snprintf(err, errlen,
             "%s: %s: op %d is not a valid reduce op (sum, average, min, max, product)", who, what,
             (int)op);
    return GS__ERR_INVALID_ARG;
  }
  return GS__OK;
}

int gs__agree_args(const char *who, gs__dtype dt, gs__reduce_op op, char *err, size_t errlen) {
  if ((dt == GS__UINT8 && op == GS__MIN) || (dt == GS__FLOAT32 && op == GS__SUM)) return GS__OK;
  snprintf(err, errlen,
           "%s: agree: %s with %s is not an agreement (uint8 with min, or float32 with sum; a "
           "gradsync bug)",
           who, (unsigned)dt < GS__DTYPE_COUNT ? gs__dtype_name(dt) : "an invalid dtype",
           (unsigned)op < GS__REDUCE_OP_COUNT ? gs__reduce_op_name(op) : "an invalid op");
  return GS__ERR_INVALID_ARG;
}

/* ---- host staging ------------------------------------------------------- */

void *gs__host_staging(void **buf, size_t *cap, size_t bytes, char *err, size_t errlen) {
  if (bytes > *cap || !*buf) {
    size_t c = *cap ? *cap : 1 << 20;
    while (c < bytes) c *= 2;
    void *b = realloc(*buf, c);
    if (!b) {
      snprintf(err, errlen, "out of memory for a host fusion buffer of %zu bytes", c);
      return NULL;
    }
    *buf = b;
    *cap = c;
  }
  return *buf;
}

void *gs__host_alloc(gs__backend *b, size_t bytes) {
  (void)b;
  return malloc(bytes ? bytes : 1);
}

void gs__host_free(void *p) {
  free(p);
}

static int is16(gs__dtype dt) {
  return dt == GS__FLOAT16 || dt == GS__BFLOAT16;
}

static float from16(gs__dtype dt, uint16_t v) {
  return dt == GS__FLOAT16 ? gs__half_to_float(v) : gs__bf16_to_float(v);
}

static uint16_t to16(gs__dtype dt, float v) {
  return dt == GS__FLOAT16 ? gs__float_to_half(v) : gs__float_to_bf16(v);
}

int gs__host_copy(const gs__copy *c, size_t n, char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    const gs__copy *x = &c[i];
    if (!x->count) continue;
    size_t dsize = gs__dtype_size(x->dst_dt);
    if (!x->src) {
      memset(x->dst, 0, x->count * dsize);
    } else if (x->src_dt == x->dst_dt) {
      memcpy(x->dst, x->src, x->count * dsize);
      gs__scale(x->dst, x->count, x->dst_dt, x->scale);
    } else if (x->src_dt == GS__FLOAT32 && is16(x->dst_dt)) { /* pack, compressed */
      gs__convert(x->dst, x->dst_dt, x->src, GS__FLOAT32, x->count);
      gs__scale(x->dst, x->count, x->dst_dt, x->scale);
    } else if (is16(x->src_dt) && x->dst_dt == GS__FLOAT32) { /* unpack, compressed */
      const uint16_t *s = x->src;
      float *d = x->dst;
      float f = (float)x->scale;
      if (x->scale == 1.0)
        gs__convert(d, GS__FLOAT32, s, x->src_dt, x->count);
      else /* scaled in the wire dtype, as the ring's result was */
        for (size_t k = 0; k < x->count; k++)
          d[k] = from16(x->src_dt, to16(x->src_dt, from16(x->src_dt, s[k]) * f));
    } else {
      snprintf(err, errlen, "internal: no conversion from %s to %s", gs__dtype_name(x->src_dt),
               gs__dtype_name(x->dst_dt));
      return GS__ERR_INTERNAL;
    }
  }
  return GS__OK;
}
