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
  if (n > UINT64_MAX - (align - 1)) return UINT64_MAX; /* saturates */
  return (n + align - 1) & ~(uint64_t)(align - 1);
}
/* Bytes of one tensor of shape in dtype; UINT64_MAX when that overflows 64
 * bits or a dimension is negative (check with gs__tensor_bytes_checked
 * where a peer chose the shape). */
uint64_t gs__tensor_bytes(gs__dtype dt, const int64_t *shape, int ndim);
/* Bytes of one tensor into *out: GS__OK, or GS__ERR_INVALID_ARG when a
 * dimension is negative or the size overflows 64 bits. */
int gs__tensor_bytes_checked(gs__dtype dt, const int64_t *shape, int ndim, uint64_t *out);
/* a * b and a + b, clamped to UINT64_MAX (sizes past any real buffer). */
static inline uint64_t gs__mul_sat(uint64_t a, uint64_t b) {
  uint64_t p;
  return __builtin_mul_overflow(a, b, &p) ? UINT64_MAX : p;
}
static inline uint64_t gs__add_sat(uint64_t a, uint64_t b) {
  uint64_t s;
  return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}
/* Offsets (bytes) of the tensors of r in its fusion buffer; offsets may be
 * NULL. Returns the buffer size: the end of the last tensor, rounded up to
 * the alignment and to a whole number of elements; UINT64_MAX when the
 * sizes overflow 64 bits (no buffer can hold that: callers fail the op). */
uint64_t gs__fusion_offsets(const gs__response *r, uint64_t *offsets);

/* Whether allreduce b may be fused into a response that starts with
 * allreduce a (the engine's rule): same dtype, reduce op, device and
 * scale factors. */
int gs__fusion_compatible(const gs__tensor_request *a, const gs__tensor_request *b);

/* Groups n requests, in order, into responses by the engine's rule
 * (server/engine/emit.c): a response starts with the first request not yet
 * taken; when it is an allreduce and threshold > 0, the later compatible
 * allreduces join it while the fused buffer (aligned offsets, as
 * gs__fusion_offsets lays them out) stays within threshold bytes; a
 * request that cannot join is skipped over (look-ahead) while the skipped
 * bytes stay within the threshold, and starts a later response. Other ops
 * stand alone. Writes the requests' indexes in response order into order
 * (n entries) and where each response starts in order into starts
 * (responses + 1 entries, the last = n); taken is n bytes of scratch.
 * Returns the number of responses. Pure: every rank that groups the same
 * requests gets the same responses. */
size_t gs__fusion_group(const gs__tensor_request *const *reqs, size_t n, uint64_t threshold,
                        unsigned char *taken, size_t *order, size_t *starts);

#endif
