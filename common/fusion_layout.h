/* The layout of a fused buffer, shared by the coordinator (to respect the
 * fusion threshold) and the worker (to pack and unpack): tensors in plan
 * order, each starting at an offset aligned to 64 bytes on CPU and 256 on
 * GPU. Pure; any thread. */
#ifndef GS_COMMON_FUSION_LAYOUT_H
#define GS_COMMON_FUSION_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

/* Alignment of tensor offsets inside a fusion buffer on device. */
size_t gs__fusion_align(gs__device device);
/* Rounds n up to a multiple of align (a power of two). */
static inline uint64_t gs__align_up(uint64_t n, size_t align) {
  return (n + align - 1) & ~(uint64_t)(align - 1);
}
/* Bytes of one tensor of shape in dtype. */
uint64_t gs__tensor_bytes(gs__dtype dt, const int64_t *shape, int ndim);
/* Offsets (bytes) of the tensors of r in its fusion buffer; offsets may be
 * NULL. Returns the buffer size: the end of the last tensor, rounded up to
 * the alignment and to a whole number of elements. */
uint64_t gs__fusion_offsets(const gs__response *r, uint64_t *offsets);

#endif
