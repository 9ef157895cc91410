/* The batched pack/unpack kernel of the nccl backend: instead of one
 * cudaMemcpyAsync per tensor (and one scaling kernel per tensor), one launch
 * moves every tensor of a fused collective. blockIdx.y picks the tensor,
 * the blocks along x stride over its elements; a plain copy moves 16, 4 or
 * 1 bytes per step depending on alignment.
 *
 * Conversions and scaling follow the host path (gs__host_copy): float16 and
 * bfloat16 round to nearest even; scaling happens in the 16-bit dtype when
 * one side is 16-bit; integers are scaled in double and rounded to nearest.
 * Stateless; the caller picks the stream. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_pack.h"

/* gs__dtype values (common/types.h) */
enum { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I32 = 4, I64 = 5, I8 = 6, U8 = 7 };

struct batch {
  gs__cuda_copy_desc d[GS__CUDA_PACK_MAX];
};

static_assert(sizeof(batch) <= 32000, "kernel parameter limit (32764 bytes)");

__device__ __forceinline__ float from16(uint16_t raw, int dt) {
  return dt == F16 ? __half2float(__ushort_as_half(raw)) : __bfloat162float(__ushort_as_bfloat16(raw));
}

__device__ __forceinline__ uint16_t to16(float v, int dt) {
  return dt == F16 ? __half_as_ushort(__float2half_rn(v))
                   : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ int dsize(int dt) {
  switch (dt) {
  case F64:
  case I64:
    return 8;
  case F32:
  case I32:
    return 4;
  case F16:
  case BF16:
    return 2;
  default:
    return 1;
  }
}

/* One element, same dtype, scaled. */
__device__ __forceinline__ void scale_one(const void *s, void *d, size_t k, int dt, double f) {
  switch (dt) {
  case F32:
    ((float *)d)[k] = ((const float *)s)[k] * (float)f;
    break;
  case F64:
    ((double *)d)[k] = ((const double *)s)[k] * f;
    break;
  case F16:
  case BF16:
    ((uint16_t *)d)[k] = to16(from16(((const uint16_t *)s)[k], dt) * (float)f, dt);
    break;
  case I32:
    ((int32_t *)d)[k] = (int32_t)llround((double)((const int32_t *)s)[k] * f);
    break;
  case I64:
    ((int64_t *)d)[k] = (int64_t)llround((double)((const int64_t *)s)[k] * f);
    break;
  case I8:
    ((int8_t *)d)[k] = (int8_t)llround((double)((const int8_t *)s)[k] * f);
    break;
  default:
    ((uint8_t *)d)[k] = (uint8_t)llround((double)((const uint8_t *)s)[k] * f);
    break;
  }
}

template <typename T>
__device__ void copy_units(const T *s, T *d, size_t n, size_t start, size_t stride) {
  for (size_t i = start; i < n; i += stride) d[i] = s[i];
}

template <typename T>
__device__ void zero_units(T *d, size_t n, size_t start, size_t stride) {
  for (size_t i = start; i < n; i += stride) d[i] = T();
}

__global__ void batched_copy(const batch b) {
  const gs__cuda_copy_desc &x = b.d[blockIdx.y];
  size_t start = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  int sd = x.src_dt, dd = x.dst_dt;
  size_t n = (size_t)x.count;
  if (!x.src || (sd == dd && x.scale == 1.0)) {
    size_t bytes = n * (size_t)dsize(dd);
    uintptr_t al = (uintptr_t)x.dst | (uintptr_t)bytes | (x.src ? (uintptr_t)x.src : 0);
    if (!x.src) {
      if (!(al & 15))
        zero_units((uint4 *)x.dst, bytes / 16, start, stride);
      else if (!(al & 3))
        zero_units((uint32_t *)x.dst, bytes / 4, start, stride);
      else
        zero_units((uint8_t *)x.dst, bytes, start, stride);
    } else if (!(al & 15)) {
      copy_units((const uint4 *)x.src, (uint4 *)x.dst, bytes / 16, start, stride);
    } else if (!(al & 3)) {
      copy_units((const uint32_t *)x.src, (uint32_t *)x.dst, bytes / 4, start, stride);
    } else {
      copy_units((const uint8_t *)x.src, (uint8_t *)x.dst, bytes, start, stride);
    }
    return;
  }
  float f = (float)x.scale;
  if (sd == dd) {
    for (size_t k = start; k < n; k += stride) scale_one(x.src, x.dst, k, sd, x.scale);
  } else if (sd == F32) { /* pack, compressed: round, then scale in 16 bits */
    const float *s = (const float *)x.src;
    uint16_t *d = (uint16_t *)x.dst;
    for (size_t k = start; k < n; k += stride) {
      uint16_t h = to16(s[k], dd);
      d[k] = x.scale == 1.0 ? h : to16(from16(h, dd) * f, dd);
    }
  } else { /* unpack, compressed: scale in 16 bits, then widen */
    const uint16_t *s = (const uint16_t *)x.src;
    float *d = (float *)x.dst;
    for (size_t k = start; k < n; k += stride) {
      float v = from16(s[k], sd);
      d[k] = x.scale == 1.0 ? v : from16(to16(v * f, sd), sd);
    }
  }
}

extern "C" int gs__cuda_batched_copy(const gs__cuda_copy_desc *d, int n, void *stream) {
  if (n < 1 || n > GS__CUDA_PACK_MAX) return (int)cudaErrorInvalidValue;
  batch b;
  unsigned long long most = 1;
  for (int i = 0; i < n; i++) {
    b.d[i] = d[i];
    if (d[i].count > most) most = d[i].count;
  }
  const unsigned threads = 256;
  unsigned long long blocks = (most + threads * 4 - 1) / (threads * 4);
  if (blocks > 1024) blocks = 1024;
  if (blocks < 1) blocks = 1;
  dim3 grid((unsigned)blocks, (unsigned)n);
  batched_copy<<<grid, threads, 0, (cudaStream_t)stream>>>(b);
  return (int)cudaGetLastError();
}
