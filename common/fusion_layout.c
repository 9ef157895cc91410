/* Fusion buffer layout (see fusion_layout.h). */
#include "fusion_layout.h"

#include <string.h>

#include "dtype.h"

size_t gs__fusion_align(gs__device device) {
  return device == GS__DEVICE_GPU ? 256 : 64;
}

#include "status.h"

int gs__tensor_bytes_checked(gs__dtype dt, const int64_t *shape, int ndim, uint64_t *out) {
  int64_t n = gs__shape_elements(shape, ndim);
  if (n < 0 || __builtin_mul_overflow((uint64_t)n, (uint64_t)gs__dtype_size(dt), out)) {
    *out = UINT64_MAX;
    return GS__ERR_INVALID_ARG;
  }
  return GS__OK;
}

uint64_t gs__tensor_bytes(gs__dtype dt, const int64_t *shape, int ndim) {
  uint64_t b;
  gs__tensor_bytes_checked(dt, shape, ndim, &b);
  return b;
}

uint64_t gs__fusion_offsets(const gs__response *r, uint64_t *offsets) {
  size_t align = gs__fusion_align(r->device);
  uint64_t at = 0;
  for (size_t i = 0; i < r->ntensors; i++) {
    at = gs__align_up(at, align);
    if (offsets) offsets[i] = at;
    at = gs__add_sat(at, gs__tensor_bytes(r->dtype, r->tensors[i].shape, r->tensors[i].ndim));
  }
  /* align is a multiple of every element size, so this is whole elements */
  return gs__align_up(at, align);
}

int gs__fusion_compatible(const gs__tensor_request *a, const gs__tensor_request *b) {
  return a->op == GS__OP_ALLREDUCE && b->op == GS__OP_ALLREDUCE && a->dtype == b->dtype &&
         a->device == b->device && a->reduce_op == b->reduce_op && a->prescale == b->prescale &&
         a->postscale == b->postscale;
}

size_t gs__fusion_group(const gs__tensor_request *const *reqs, size_t n, uint64_t threshold,
                        unsigned char *taken, size_t *order, size_t *starts) {
  size_t nresp = 0, at = 0;
  if (n) memset(taken, 0, n);
  for (size_t i = 0; i < n; i++) {
    if (taken[i]) continue;
    taken[i] = 1;
    starts[nresp++] = at;
    order[at++] = i;
    const gs__tensor_request *a = reqs[i];
    if (!threshold || a->op != GS__OP_ALLREDUCE) continue;
    size_t align = gs__fusion_align(a->device);
    uint64_t end = gs__tensor_bytes(a->dtype, a->shape, a->ndim), skipped = 0;
    for (size_t j = i + 1; j < n; j++) {
      if (taken[j]) continue;
      const gs__tensor_request *c = reqs[j];
      uint64_t cb = gs__tensor_bytes(c->dtype, c->shape, c->ndim);
      uint64_t c_end = gs__add_sat(gs__align_up(end, align), cb);
      if (gs__fusion_compatible(a, c) && c_end <= threshold) {
        taken[j] = 1;
        order[at++] = j;
        end = c_end;
        continue;
      }
      skipped = gs__add_sat(skipped, cb);
      if (skipped > threshold) break;
    }
  }
  starts[nresp] = at;
  return nresp;
}
