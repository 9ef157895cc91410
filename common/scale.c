/* Scaling of a buffer by a factor (prescale / postscale of collectives).
 * Pure; any thread. */
#include <math.h>
#include <stdint.h>

#include "dtype.h"

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
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)llround((double)p[i] * factor);
    break;
  }
  case GS__INT64: {
    int64_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (int64_t)llround((double)p[i] * factor);
    break;
  }
  case GS__INT8: {
    int8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (int8_t)llround((double)p[i] * factor);
    break;
  }
  case GS__UINT8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)llround((double)p[i] * factor);
    break;
  }
  default:
    break;
  }
}
