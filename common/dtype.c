/* Data types: the size and name tables, IEEE binary16 / bfloat16 <->
 * float32 conversion and gs__divide. The reduction kernels are in reduce.c.
 * Pure functions over caller-owned memory, no state; any thread. */
#include "dtype.h"

#include <assert.h>
#include <string.h>

static const size_t k_dtype_size[GS__DTYPE_COUNT] = {
    [GS__FLOAT32] = 4, [GS__FLOAT64] = 8, [GS__FLOAT16] = 2, [GS__BFLOAT16] = 2, [GS__INT32] = 4,
    [GS__INT64] = 8,   [GS__INT8] = 1,    [GS__UINT8] = 1,   [GS__INT16] = 2,
};

static const char *const k_dtype_name[GS__DTYPE_COUNT] = {
    [GS__FLOAT32] = "float32",   [GS__FLOAT64] = "float64", [GS__FLOAT16] = "float16",
    [GS__BFLOAT16] = "bfloat16", [GS__INT32] = "int32",     [GS__INT64] = "int64",
    [GS__INT8] = "int8",         [GS__UINT8] = "uint8",     [GS__INT16] = "int16",
};

static const char *const k_reduce_op_name[GS__REDUCE_OP_COUNT] = {
    [GS__SUM] = "sum", [GS__AVERAGE] = "average", [GS__MIN] = "min",
    [GS__MAX] = "max", [GS__PRODUCT] = "product", [GS__ADASUM] = "adasum",
};

static const char *const k_op_type_name[GS__OP_TYPE_COUNT] = {
    [GS__OP_ALLREDUCE] = "allreduce",
    [GS__OP_ALLGATHER] = "allgather",
    [GS__OP_BROADCAST] = "broadcast",
    [GS__OP_ALLTOALL] = "alltoall",
    [GS__OP_REDUCESCATTER] = "reducescatter",
    [GS__OP_BARRIER] = "barrier",
    [GS__OP_JOIN] = "join",
};

static const char *const k_device_name[GS__DEVICE_COUNT] = {
    [GS__DEVICE_CPU] = "CPU",
    [GS__DEVICE_GPU] = "GPU",
};

size_t gs__dtype_size(gs__dtype dt) {
  if ((unsigned)dt >= GS__DTYPE_COUNT) return 0;
  return k_dtype_size[dt];
}

const char *gs__dtype_name(gs__dtype dt) {
  if ((unsigned)dt >= GS__DTYPE_COUNT) return "invalid";
  return k_dtype_name[dt];
}

const char *gs__reduce_op_name(gs__reduce_op op) {
  if ((unsigned)op >= GS__REDUCE_OP_COUNT) return "invalid";
  return k_reduce_op_name[op];
}

const char *gs__op_type_name(gs__op_type op) {
  if ((unsigned)op >= GS__OP_TYPE_COUNT) return "invalid";
  return k_op_type_name[op];
}

const char *gs__device_name(gs__device dev) {
  if ((unsigned)dev >= GS__DEVICE_COUNT) return "invalid";
  return k_device_name[dev];
}

/* ---- half / bfloat16 ---------------------------------------------------- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float gs__half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24, exact in float32 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t gs__float_to_half(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  uint32_t e = ax >> 23;
  if (e == 0xff) {
    if (ax == 0x7f800000u) return sign | 0x7c00u;
    /* NaN: keep the top payload bits, force quiet so it stays a NaN */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (e > 142) return sign | 0x7c00u; /* >= 2^16: beyond the largest half */
  if (e < 113) {
    /* Result is subnormal (or rounds up to the smallest normal, which the
     * carry out of the mantissa encodes correctly). value = m * 2^(e-150),
     * in half-subnormal units of 2^-24 that is m >> (126 - e). */
    if (e < 102) return sign; /* below 2^-25: rounds to zero */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ffu);
  uint32_t rem = ax & 0x1fffu;
  /* a carry out of the mantissa bumps the exponent, up to infinity */
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

float gs__bf16_to_float(uint16_t b) {
  return bits_f32((uint32_t)b << 16);
}

uint16_t gs__float_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  /* round to nearest even; overflow carries into infinity */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

void gs__divide(void *buf, size_t n, gs__dtype dt, int divisor) {
  /* the divisor is the job size: only our own bug passes anything else */
  assert(divisor > 0);
  if (divisor <= 1) return;
  switch (dt) {
  case GS__FLOAT32: {
    float *p = buf, d = (float)divisor;
    for (size_t i = 0; i < n; i++) p[i] /= d;
    return;
  }
  case GS__FLOAT64: {
    double *p = buf, d = (double)divisor;
    for (size_t i = 0; i < n; i++) p[i] /= d;
    return;
  }
  case GS__FLOAT16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = gs__float_to_half(gs__half_to_float(p[i]) / divisor);
    return;
  }
  case GS__BFLOAT16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = gs__float_to_bf16(gs__bf16_to_float(p[i]) / divisor);
    return;
  }
  /* C's integer division truncates toward zero; divisor > 1 rules out the
   * INT_MIN / -1 overflow */
  case GS__INT32: {
    int32_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = p[i] / divisor;
    return;
  }
  case GS__INT64: {
    int64_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = p[i] / (int64_t)divisor;
    return;
  }
  case GS__INT8: {
    int8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (int8_t)(p[i] / divisor);
    return;
  }
  case GS__UINT8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(p[i] / divisor);
    return;
  }
  case GS__INT16: {
    int16_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (int16_t)(p[i] / divisor);
    return;
  }
  default:
    assert(!"gs__divide: invalid dtype");
    return;
  }
}
