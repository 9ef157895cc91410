/* Helpers shared by the integration tests' worker programs (see
 * worker_util.h). Owns the process-wide g_rank, g_size and g_mode; runs on
 * the worker's main thread only. */
#include "worker_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int g_rank = -1;
int g_size = 0;
const char *g_mode = NULL;

void wu_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "rank %d: FAIL: ", g_rank);
  if (g_mode != NULL) fprintf(stdout, "%s: ", g_mode);
  vfprintf(stdout, fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
  fflush(stderr);
  /* Leave at once: a broken job must not be waited on in gs_shutdown. */
  _exit(1);
}

void *wu_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) wu_die("out of memory (%zu bytes)", n);
  return p;
}

void *wu_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) wu_die("out of memory (%zu x %zu bytes)", n, size);
  return p;
}

gs_ctx *wu_join_or_die(void) {
  gs_ctx *ctx = NULL;
  gs_status s = gs_init(NULL, &ctx);
  if (s != GS_OK) wu_die("gs_init: %s: %s", wu_status_name(s), gs_last_error(NULL));
  if (ctx == NULL) wu_die("gs_init returned GS_OK and a NULL context");
  g_rank = gs_rank(ctx);
  g_size = gs_size(ctx);
  return ctx;
}

void wu_must(gs_status s, const char *what, const char *name) {
  if (s != GS_OK)
    wu_die("tensor '%s': %s: %s: %s", name, what, wu_status_name(s), gs_last_error(NULL));
}

const char *wu_status_name(gs_status s) {
  static const char *const names[] = {
      "GS_OK",
      "GS_ERR_INVALID_ARG",
      "GS_ERR_NO_MEMORY",
      "GS_ERR_TIMEOUT",
      "GS_ERR_MISMATCH",
      "GS_ERR_DUPLICATE_NAME",
      "GS_ERR_JOIN_REFUSED",
      "GS_ERR_JOIN_TIMEOUT",
      "GS_ERR_COORDINATOR_LOST",
      "GS_ERR_RANK_LOST",
      "GS_ERR_DATA_PLANE",
      "GS_ERR_ABORTED",
      "GS_ERR_SHUTDOWN",
      "GS_ERR_DEADLOCK",
      "GS_ERR_STALL",
      "GS_ERR_UNSUPPORTED",
      "GS_ERR_INTERNAL",
      "GS_ERR_UNAUTHENTICATED",
      "GS_ERR_ALREADY_JOINED",
      "GS_ERR_FORKED",
  };
  if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
  return "GS_ERR_<unknown>";
}

const char *wu_dtype_name(gs_dtype d) {
  switch (d) {
  case GS_FLOAT32:
    return "float32";
  case GS_FLOAT64:
    return "float64";
  case GS_FLOAT16:
    return "float16";
  case GS_BFLOAT16:
    return "bfloat16";
  case GS_INT32:
    return "int32";
  case GS_INT64:
    return "int64";
  case GS_INT8:
    return "int8";
  case GS_UINT8:
    return "uint8";
  case GS_INT16:
    return "int16";
  }
  return "?";
}

uint64_t wu_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t wu_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return wu_mix(wu_mix(wu_mix(wu_mix(a) ^ b) ^ c) ^ d);
}

uint32_t wu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

float wu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t wu_f32_to_f16(float f) {
  uint32_t x = wu_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* may carry into exp: correct */
  return (uint16_t)(sign | h);
}

float wu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 0x1f) return wu_bits_f32(sign | 0x7f800000u | (mant << 13));
  return wu_bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t wu_f32_to_bf16(float f) {
  uint32_t x = wu_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float wu_bf16_to_f32(uint16_t h) {
  return wu_bits_f32((uint32_t)h << 16);
}

int wu_is_float(gs_dtype d) {
  return d == GS_FLOAT32 || d == GS_FLOAT64 || d == GS_FLOAT16 || d == GS_BFLOAT16;
}

void wu_put(gs_dtype d, void *buf, size_t i, double v) {
  switch (d) {
  case GS_FLOAT32:
    ((float *)buf)[i] = (float)v;
    break;
  case GS_FLOAT64:
    ((double *)buf)[i] = v;
    break;
  case GS_FLOAT16:
    ((uint16_t *)buf)[i] = wu_f32_to_f16((float)v);
    break;
  case GS_BFLOAT16:
    ((uint16_t *)buf)[i] = wu_f32_to_bf16((float)v);
    break;
  case GS_INT32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case GS_INT64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case GS_INT8:
    ((int8_t *)buf)[i] = (int8_t)v;
    break;
  case GS_UINT8:
    ((uint8_t *)buf)[i] = (uint8_t)v;
    break;
  case GS_INT16:
    ((int16_t *)buf)[i] = (int16_t)v;
    break;
  }
}

double wu_get(gs_dtype d, const void *buf, size_t i) {
  switch (d) {
  case GS_FLOAT32:
    return ((const float *)buf)[i];
  case GS_FLOAT64:
    return ((const double *)buf)[i];
  case GS_FLOAT16:
    return wu_f16_to_f32(((const uint16_t *)buf)[i]);
  case GS_BFLOAT16:
    return wu_bf16_to_f32(((const uint16_t *)buf)[i]);
  case GS_INT32:
    return ((const int32_t *)buf)[i];
  case GS_INT64:
    return (double)((const int64_t *)buf)[i];
  case GS_INT8:
    return ((const int8_t *)buf)[i];
  case GS_UINT8:
    return ((const uint8_t *)buf)[i];
  case GS_INT16:
    return ((const int16_t *)buf)[i];
  }
  return NAN;
}

double wu_as_stored(gs_dtype d, double v) {
  unsigned char tmp[8];
  wu_put(d, tmp, 0, v);
  return wu_get(d, tmp, 0);
}

double wu_rel_tol(gs_dtype d) {
  switch (d) {
  case GS_FLOAT64:
    return 0x1p-50;
  case GS_FLOAT32:
    return 0x1p-21;
  case GS_FLOAT16:
    return 0x1p-9;
  case GS_BFLOAT16:
    return 0x1p-6;
  default:
    return 0;
  }
}
