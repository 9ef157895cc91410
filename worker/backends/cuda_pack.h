/* The batched pack/unpack kernel of the nccl backend (cuda_pack.cu): one
 * launch copies up to GS__CUDA_PACK_MAX tensors into or out of the fusion
 * buffer, converting float32 <-> float16/bfloat16 and scaling on the way
 * (the semantics of gs__copy in backend.h). C interface; no CUDA types. */
#ifndef GS_WORKER_CUDA_PACK_H
#define GS_WORKER_CUDA_PACK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Descriptors travel as the kernel's parameter (up to 32 KiB on CUDA >= 12.1
 * and sm_70+), so a launch needs no device-side descriptor buffer. */
#define GS__CUDA_PACK_MAX 512

typedef struct gs__cuda_copy_desc {
  const void *src; /* NULL: write zeros */
  void *dst;
  unsigned long long count; /* elements */
  double scale;             /* 1.0 = none */
  int src_dt, dst_dt;       /* gs__dtype values */
} gs__cuda_copy_desc;

/* Enqueues one kernel on stream (a cudaStream_t) copying the n descriptors
 * (1 <= n <= GS__CUDA_PACK_MAX). Returns the launch's cudaError_t (0 = ok). */
int gs__cuda_batched_copy(const gs__cuda_copy_desc *d, int n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
