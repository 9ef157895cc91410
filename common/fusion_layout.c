/* Fusion buffer layout (see fusion_layout.h). */
#include "fusion_layout.h"

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
