/* Scaling of a buffer by a factor (prescale / postscale of collectives),
 * with Horovod's arithmetic so that results match it bit for bit: float32
 * and the 16-bit floats multiply in float32 by the factor rounded to float,
 * float64 in double, and integers multiply in double and truncate toward
 * zero (out-of-range products saturate instead of being undefined).
 * Pure; any thread. */
#include <stdint.h>

#include "dtype.h"

/* double -> int64 truncating toward zero; saturates, NaN -> 0. */
static int64_t trunc_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* Narrow integer types: the truncated product, clamped to [lo, hi]. */
static int64_t trunc_clamp(double v, int64_t lo, int64_t hi) {
  int64_t t = trunc_i64(v);
  return t < lo ? lo : t > hi ? hi : t;
}

void gs__scale(void *buf, size_t n, gs__dtype dt, double factor) {
  if (factor == 1.0) return;
  switch (dt) {
  case GS__FLOAT32: {
    float *p = buf, f = (float)factor;
    for (size_t i = 0; i < n; i++) p[i] *= f;
    break;
  }
  case GS__FLOAT64: {
    double *p = buf;
    for (size_t i = 0; i < n; i++) p[i] *= factor;
    break;
  }
  case GS__FLOAT16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++)
      p[i] = gs__float_to_half(gs__half_to_float(p[i]) * (float)factor);
    break;
  }
  case GS__BFLOAT16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++)
      p[i] = gs__float_to_bf16(gs__bf16_to_float(p[i]) * (float)factor);
    break;
  }
  case GS__INT32: {
    int32_t *p = buf;
    for (size_t i = 0; i < n; i++)
      p[i] = (int32_t)trunc_clamp((double)p[i] * factor, INT32_MIN, INT32_MAX);
    break;
  }
  case GS__INT64: {
    int64_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = trunc_i64((double)p[i] * factor);
    break;
  }
  case GS__INT8: {
    int8_t *p = buf;
    for (size_t i = 0; i < n; i++)
      p[i] = (int8_t)trunc_clamp((double)p[i] * factor, INT8_MIN, INT8_MAX);
    break;
  }
  case GS__UINT8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)trunc_clamp((double)p[i] * factor, 0, UINT8_MAX);
    break;
  }
  case GS__INT16: {
    int16_t *p = buf;
    for (size_t i = 0; i < n; i++)
      p[i] = (int16_t)trunc_clamp((double)p[i] * factor, INT16_MIN, INT16_MAX);
    break;
  }
  default:
    break;
  }
}
