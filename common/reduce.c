/* Element-wise reduction kernels of the data planes (the TCP ring, shared
 * memory), with the finishing step of a collective fused in: the average's
 * division and the postscale factor, and the rounding of a float32
 * accumulation back to float16/bfloat16. Pure functions over caller-owned
 * memory; any thread. The dispatch below is resolved once per process.
 *
 * Speed: the float kernels are counted loops over restrict pointers built
 * for several instruction sets (gcc target_clones: AVX-512F, AVX2, the
 * x86-64 baseline), the loader picks the best one this CPU runs; float16
 * conversion uses F16C when present. Which path ran never changes a bit of
 * the result: every path computes the same IEEE operations in the same
 * order per element (no FMA contraction: this file is built with
 * -ffp-contract=off, and the division by the rank count stays a division,
 * or for a power-of-two count a multiplication by its exact reciprocal:
 * the same bits, see pow2).
 *
 * Work that cannot be one loop (several sources, 16-bit types, integers
 * with their scaling) goes through blocks of BLOCK elements that stay in
 * L1: a block of float32 accumulators, the sources reduced into it in
 * order, finished, converted and stored. One pass over memory either way. */
#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define GS_X86 1
/* AVX-512F is listed for the CPUs that have it; this one runs the AVX2 or
 * baseline clone (the generated code is checked by tests/unit/check_simd.sh). */
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default"), noinline))
#else
#define GS_X86 0
#define CLONES __attribute__((noinline))
#endif

#define BLOCK 1024 /* elements per block: 4 KiB of float32 accumulators */

/* Split tail: gcc -O2's cheap vectoriser cost model only vectorises loops
 * whose trip count is a known multiple of the vector width. */
#define VLOOP(n, body)                                                                             \
  do {                                                                                             \
    size_t m_ = (n) & ~(size_t)15;                                                                 \
    for (size_t i = 0; i < m_; i++) body;                                                          \
    for (size_t i = m_; i < (n); i++) body;                                                        \
  } while (0)

/* MIN and MAX propagate NaN (as torch.minimum/maximum). */
#define FMIN(a, b) ((b) < (a) || (b) != (b) ? (b) : (a))
#define FMAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
#define IMIN(a, b) ((b) < (a) ? (b) : (a))
#define IMAX(a, b) ((b) > (a) ? (b) : (a))

/* ---- two-operand kernels: d = d op s ------------------------------------ */

#define FLOAT_KERNELS(T, name)                                                                     \
  static CLONES void sum_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] += s[i]);                                                                        \
  }                                                                                                \
  static CLONES void prod_##name(T *restrict d, const T *restrict s, size_t n) {                   \
    VLOOP(n, d[i] *= s[i]);                                                                        \
  }                                                                                                \
  static CLONES void min_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] = FMIN(d[i], s[i]));                                                             \
  }                                                                                                \
  static CLONES void max_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] = FMAX(d[i], s[i]));                                                             \
  }                                                                                                \
  /* the last step of an average / postscale: d = ((d + s) / dv) * fv */                           \
  static CLONES void sum_div_##name(T *restrict d, const T *restrict s, size_t n, T dv) {          \
    VLOOP(n, d[i] = (d[i] + s[i]) / dv);                                                           \
  }                                                                                                \
  static CLONES void sum_div_mul_##name(T *restrict d, const T *restrict s, size_t n, T dv,        \
                                        T fv) {                                                    \
    VLOOP(n, d[i] = ((d[i] + s[i]) / dv) * fv);                                                    \
  }                                                                                                \
  static CLONES void sum_mul_##name(T *restrict d, const T *restrict s, size_t n, T fv) {          \
    VLOOP(n, d[i] = (d[i] + s[i]) * fv);                                                           \
  }                                                                                                \
  /* sum_div_mul with an exact reciprocal rv of a power-of-two divisor */                          \
  static CLONES void sum_mul_mul_##name(T *restrict d, const T *restrict s, size_t n, T rv,        \
                                        T fv) {                                                    \
    VLOOP(n, d[i] = ((d[i] + s[i]) * rv) * fv);                                                    \
  }                                                                                                \
  static CLONES void div_##name(T *restrict d, size_t n, T dv) {                                   \
    VLOOP(n, d[i] /= dv);                                                                          \
  }                                                                                                \
  static CLONES void mul_##name(T *restrict d, size_t n, T fv) {                                   \
    VLOOP(n, d[i] *= fv);                                                                          \
  }

/* T: the element type, U: the unsigned type arithmetic is done in (at
 * least int for the 8-bit types so the product cannot overflow after
 * promotion): overflow wraps without undefined behaviour. */
#define INT_KERNELS(T, U, name)                                                                    \
  static CLONES void sum_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] = (T)((U)d[i] + (U)s[i]));                                                       \
  }                                                                                                \
  static CLONES void prod_##name(T *restrict d, const T *restrict s, size_t n) {                   \
    VLOOP(n, d[i] = (T)((U)d[i] * (U)s[i]));                                                       \
  }                                                                                                \
  static CLONES void min_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] = IMIN(d[i], s[i]));                                                             \
  }                                                                                                \
  static CLONES void max_##name(T *restrict d, const T *restrict s, size_t n) {                    \
    VLOOP(n, d[i] = IMAX(d[i], s[i]));                                                             \
  }

FLOAT_KERNELS(float, f32)
FLOAT_KERNELS(double, f64)
INT_KERNELS(int32_t, uint32_t, i32)
INT_KERNELS(int64_t, uint64_t, i64)
INT_KERNELS(int8_t, uint32_t, i8)
INT_KERNELS(uint8_t, uint32_t, u8)
INT_KERNELS(int16_t, uint32_t, i16)

#define DISPATCH(name, T, d, s, n)                                                                 \
  do {                                                                                             \
    switch (op) {                                                                                  \
    case GS__MIN:                                                                                  \
      min_##name((T *)(d), (const T *)(s), n);                                                     \
      break;                                                                                       \
    case GS__MAX:                                                                                  \
      max_##name((T *)(d), (const T *)(s), n);                                                     \
      break;                                                                                       \
    case GS__PRODUCT:                                                                              \
      prod_##name((T *)(d), (const T *)(s), n);                                                    \
      break;                                                                                       \
    default:                                                                                       \
      sum_##name((T *)(d), (const T *)(s), n);                                                     \
      break;                                                                                       \
    }                                                                                              \
  } while (0)

/* d = d op s for the natively reduced dtypes (every dtype but the 16-bit
 * floats); 0 if dt is one of those. */
static int reduce_native(void *d, const void *s, size_t n, gs__dtype dt, gs__reduce_op op) {
  switch (dt) {
  case GS__FLOAT32:
    DISPATCH(f32, float, d, s, n);
    return 1;
  case GS__FLOAT64:
    DISPATCH(f64, double, d, s, n);
    return 1;
  case GS__INT32:
    DISPATCH(i32, int32_t, d, s, n);
    return 1;
  case GS__INT64:
    DISPATCH(i64, int64_t, d, s, n);
    return 1;
  case GS__INT8:
    DISPATCH(i8, int8_t, d, s, n);
    return 1;
  case GS__UINT8:
    DISPATCH(u8, uint8_t, d, s, n);
    return 1;
  case GS__INT16:
    DISPATCH(i16, int16_t, d, s, n);
    return 1;
  default:
    return 0;
  }
}

/* ---- 16-bit conversion --------------------------------------------------- */

static int is16(gs__dtype dt) {
  return dt == GS__FLOAT16 || dt == GS__BFLOAT16;
}

static inline uint16_t bf16_of(uint32_t x) {
  /* gs__float_to_bf16, branch-free so that it vectorises */
  uint32_t nan = (x & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)(nan ? (x >> 16) | 0x40u : rounded);
}

static CLONES void bf16_to_f32(float *restrict d, const uint16_t *restrict s, size_t n) {
  uint32_t *u = (uint32_t *)(void *)d;
  VLOOP(n, u[i] = (uint32_t)s[i] << 16);
}

static CLONES void f32_to_bf16(uint16_t *restrict d, const float *restrict s, size_t n) {
  const uint32_t *u = (const uint32_t *)(const void *)s;
  VLOOP(n, d[i] = bf16_of(u[i]));
}

static void h2f_generic(float *restrict d, const uint16_t *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = gs__half_to_float(s[i]);
}

static void f2h_generic(uint16_t *restrict d, const float *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = gs__float_to_half(s[i]);
}

#if GS_X86
/* F16C converts exactly as gs__half_to_float / gs__float_to_half (round
 * to nearest even, subnormals kept) except that a signalling NaN comes
 * out quiet; the fix-up keeps the software path's bits there too. */
__attribute__((target("avx2,f16c"))) static void h2f_f16c(float *restrict d,
                                                          const uint16_t *restrict s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    __m256 f = _mm256_cvtph_ps(h);
    /* signalling NaN halves (exponent all ones, mantissa != 0, top
     * mantissa bit 0): rare; redo those lanes in software */
    __m128i ex = _mm_and_si128(h, _mm_set1_epi16(0x7e00));
    __m128i snan = _mm_and_si128(
        _mm_cmpeq_epi16(ex, _mm_set1_epi16(0x7c00)),
        _mm_xor_si128(_mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x3ff)), _mm_setzero_si128()),
                      _mm_set1_epi16(-1)));
    _mm256_storeu_ps(d + i, f);
    if (!_mm_testz_si128(snan, snan))
      for (size_t k = i; k < i + 8; k++) d[k] = gs__half_to_float(s[k]);
  }
  for (; i < n; i++) d[i] = gs__half_to_float(s[i]);
}

__attribute__((target("avx2,f16c"))) static void f2h_f16c(uint16_t *restrict d,
                                                          const float *restrict s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(s + i);
    _mm_storeu_si128((__m128i *)(void *)(d + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    /* NaN inputs: the software path keeps the top payload bits and sets
     * the quiet bit; F16C does the same, so nothing to fix. */
  }
  for (; i < n; i++) d[i] = gs__float_to_half(s[i]);
}
#endif

typedef void (*h2f_fn)(float *restrict, const uint16_t *restrict, size_t);
typedef void (*f2h_fn)(uint16_t *restrict, const float *restrict, size_t);
static h2f_fn g_h2f = h2f_generic;
static f2h_fn g_f2h = f2h_generic;
static const char *g_isa = "generic";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void resolve(void) {
#if GS_X86
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2"), f16c = __builtin_cpu_supports("f16c");
  if (avx2 && f16c) {
    g_h2f = h2f_f16c;
    g_f2h = f2h_f16c;
  }
  if (__builtin_cpu_supports("avx512f"))
    g_isa = f16c ? "avx512f+f16c" : "avx512f";
  else if (avx2)
    g_isa = f16c ? "avx2+f16c" : "avx2";
  else
    g_isa = "sse2";
#endif
}

const char *gs__reduce_isa(void) {
  pthread_once(&g_once, resolve);
  return g_isa;
}

/* 16-bit <-> float32 for n elements. */
static void to_f32(float *d, const void *s, size_t n, gs__dtype dt) {
  if (dt == GS__FLOAT16)
    g_h2f(d, s, n);
  else
    bf16_to_f32(d, s, n);
}

static void from_f32(void *d, const float *s, size_t n, gs__dtype dt) {
  if (dt == GS__FLOAT16)
    g_f2h(d, s, n);
  else
    f32_to_bf16(d, s, n);
}

void gs__convert(void *dst, gs__dtype dst_dt, const void *src, gs__dtype src_dt, size_t n) {
  pthread_once(&g_once, resolve);
  if (dst_dt == src_dt) {
    if (dst != src && n) memcpy(dst, src, n * gs__dtype_size(dst_dt));
    return;
  }
  if (src_dt == GS__FLOAT32 && is16(dst_dt))
    from_f32(dst, src, n, dst_dt);
  else if (is16(src_dt) && dst_dt == GS__FLOAT32)
    to_f32(dst, src, n, src_dt);
  else
    assert(!"gs__convert: no conversion between these dtypes");
}

/* ---- finishing: the average's division, then the postscale ---------------- */

/* A divisor whose reciprocal is exact in float32 and float64: x / d and
 * x * (1 / d) are then the same real number, rounded once, so the same
 * bits -- and a multiplication costs a fraction of a division (at 64 MiB
 * the division was ~20 % of an average's CPU time over shared memory). */
static int pow2(int divisor) {
  return divisor > 1 && (divisor & (divisor - 1)) == 0;
}

/* In place over n elements of a natively reduced dtype: v / divisor then
 * v * factor, with gs__divide's and gs__scale's arithmetic. */
static void finish_native(void *p, size_t n, gs__dtype dt, int divisor, double factor) {
  switch (dt) {
  case GS__FLOAT32:
    if (pow2(divisor))
      mul_f32(p, n, 1.0f / (float)divisor);
    else if (divisor > 1)
      div_f32(p, n, (float)divisor);
    if (factor != 1.0) mul_f32(p, n, (float)factor);
    return;
  case GS__FLOAT64:
    if (pow2(divisor))
      mul_f64(p, n, 1.0 / (double)divisor);
    else if (divisor > 1)
      div_f64(p, n, (double)divisor);
    if (factor != 1.0) mul_f64(p, n, factor);
    return;
  default:
    if (divisor > 1) gs__divide(p, n, dt, divisor);
    gs__scale(p, n, dt, factor);
    return;
  }
}

/* Stores n float32 accumulators into a 16-bit dtype, finished: divided in
 * float32 and rounded, then (postscale) multiplied in float32 and rounded
 * again -- the bits of gs__divide in float32, conversion, gs__scale. acc is
 * clobbered. */
static void store16(void *dst, gs__dtype dt, float *acc, size_t n, int divisor, double factor) {
  if (pow2(divisor))
    mul_f32(acc, n, 1.0f / (float)divisor);
  else if (divisor > 1)
    div_f32(acc, n, (float)divisor);
  from_f32(dst, acc, n, dt);
  if (factor != 1.0) {
    to_f32(acc, dst, n, dt);
    mul_f32(acc, n, (float)factor);
    from_f32(dst, acc, n, dt);
  }
}

/* float32 acc op= s */
static void op_f32(float *acc, const float *s, size_t n, gs__reduce_op op) {
  DISPATCH(f32, float, acc, s, n);
}

/* ---- public kernels -------------------------------------------------------- */

static void check_op(gs__reduce_op op) {
  (void)op;
  assert(op == GS__SUM || op == GS__AVERAGE || op == GS__MIN || op == GS__MAX || op == GS__PRODUCT);
}

void gs__reduce(void *dst, const void *src, size_t n, gs__dtype dt, gs__reduce_op op) {
  check_op(op);
  if (reduce_native(dst, src, n, dt, op)) return;
  assert(is16(dt) && "gs__reduce: invalid dtype");
  pthread_once(&g_once, resolve);
  /* 16-bit: each element converted exactly, reduced in float32, rounded */
  float a[BLOCK], b[BLOCK];
  for (size_t at = 0; at < n; at += BLOCK) {
    size_t k = n - at < BLOCK ? n - at : BLOCK;
    uint16_t *d = (uint16_t *)dst + at;
    to_f32(a, d, k, dt);
    to_f32(b, (const uint16_t *)src + at, k, dt);
    op_f32(a, b, k, op);
    from_f32(d, a, k, dt);
  }
}

void gs__reduce_scaled(void *dst, const void *src, size_t n, gs__dtype dt, gs__reduce_op op,
                       int divisor, double factor) {
  check_op(op);
  assert(divisor >= 1);
  if (divisor <= 1 && factor == 1.0) {
    gs__reduce(dst, src, n, dt, op);
    return;
  }
  if (dt == GS__FLOAT32 && (op == GS__SUM || op == GS__AVERAGE)) {
    /* the hot case: the last reduce-scatter step of an average */
    if (divisor <= 1)
      sum_mul_f32(dst, src, n, (float)factor);
    else if (pow2(divisor) && factor == 1.0)
      sum_mul_f32(dst, src, n, 1.0f / (float)divisor);
    else if (pow2(divisor))
      sum_mul_mul_f32(dst, src, n, 1.0f / (float)divisor, (float)factor);
    else if (factor == 1.0)
      sum_div_f32(dst, src, n, (float)divisor);
    else
      sum_div_mul_f32(dst, src, n, (float)divisor, (float)factor);
    return;
  }
  if (dt == GS__FLOAT64 && (op == GS__SUM || op == GS__AVERAGE)) {
    if (divisor <= 1)
      sum_mul_f64(dst, src, n, factor);
    else if (pow2(divisor) && factor == 1.0)
      sum_mul_f64(dst, src, n, 1.0 / (double)divisor);
    else if (pow2(divisor))
      sum_mul_mul_f64(dst, src, n, 1.0 / (double)divisor, factor);
    else if (factor == 1.0)
      sum_div_f64(dst, src, n, (double)divisor);
    else
      sum_div_mul_f64(dst, src, n, (double)divisor, factor);
    return;
  }
  const void *srcs[2] = {dst, src};
  gs__reduce_many(dst, dt, srcs, 2, dt, n, op, divisor, factor);
}

void gs__reduce_many(void *dst, gs__dtype dst_dt, const void *const *src, size_t nsrc,
                     gs__dtype src_dt, size_t n, gs__reduce_op op, int divisor, double factor) {
  check_op(op);
  assert(nsrc >= 1 && divisor >= 1);
  assert(dst_dt == src_dt || (src_dt == GS__FLOAT32 && is16(dst_dt)));
  pthread_once(&g_once, resolve);
  size_t ss = gs__dtype_size(src_dt), ds = gs__dtype_size(dst_dt);
  if (src_dt == GS__FLOAT32 || is16(src_dt)) {
    float acc[BLOCK], tmp[BLOCK];
    /* the average over a power-of-two rank count of float32: the last
     * addition and the exact reciprocal's multiplication in one loop (the
     * bits of the two passes), so an average costs what a sum does */
    int fused = dst_dt == GS__FLOAT32 && src_dt == GS__FLOAT32 && nsrc >= 2 &&
                (op == GS__SUM || op == GS__AVERAGE) && pow2(divisor) && factor == 1.0;
    float rv = fused ? 1.0f / (float)divisor : 1.0f;
    for (size_t at = 0; at < n; at += BLOCK) {
      size_t k = n - at < BLOCK ? n - at : BLOCK;
      for (size_t q = 0; q < nsrc; q++) {
        const char *s = (const char *)src[q] + at * ss;
        if (q == 0) {
          if (is16(src_dt))
            to_f32(acc, s, k, src_dt);
          else
            memcpy(acc, s, k * sizeof *acc);
        } else if (is16(src_dt)) {
          to_f32(tmp, s, k, src_dt);
          op_f32(acc, tmp, k, op);
        } else if (fused && q == nsrc - 1) {
          sum_mul_f32(acc, (const float *)(const void *)s, k, rv);
        } else {
          op_f32(acc, (const float *)(const void *)s, k, op);
        }
      }
      char *d = (char *)dst + at * ds;
      if (is16(dst_dt)) {
        store16(d, dst_dt, acc, k, divisor, factor);
      } else {
        if (!fused) finish_native(acc, k, GS__FLOAT32, divisor, factor);
        memcpy(d, acc, k * sizeof *acc);
      }
    }
    return;
  }
  /* float64 and the integers: accumulate in their own type */
  _Alignas(64) unsigned char acc[BLOCK * 8];
  for (size_t at = 0; at < n; at += BLOCK) {
    size_t k = n - at < BLOCK ? n - at : BLOCK;
    memcpy(acc, (const char *)src[0] + at * ss, k * ss);
    for (size_t q = 1; q < nsrc; q++)
      reduce_native(acc, (const char *)src[q] + at * ss, k, src_dt, op);
    finish_native(acc, k, src_dt, divisor, factor);
    memcpy((char *)dst + at * ds, acc, k * ds);
  }
}
