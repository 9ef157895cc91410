/* Unit tests of common/reduce.c, the data planes' kernels: the fused
 * finish (division, postscale) gives exactly the bits of the separate
 * passes (gs__reduce, gs__divide, gs__scale) for every dtype and op and odd
 * sizes; gs__reduce_many reduces in the order given and rounds 16-bit
 * results once; the bulk conversions equal the scalar ones for every
 * float16 value and a million float32 values, whichever instruction set
 * this CPU dispatches to (printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

static const size_t k_sizes[] = {0, 1, 7, 16, 33, 1023, 1024, 1025, 4099};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])
static const gs__reduce_op k_ops[] = {GS__SUM, GS__AVERAGE, GS__MIN, GS__MAX, GS__PRODUCT};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

/* Values that make rounding and order visible: mixed signs and
 * magnitudes for floats, the full range for integers. */
static void fill(void *p, size_t n, gs__dtype dt) {
  for (size_t i = 0; i < n; i++) {
    float f = (float)((int)(next32() % 20001) - 10000) / 97.0f * (float)(1u << (next32() % 12));
    switch (dt) {
    case GS__FLOAT32:
      ((float *)p)[i] = f;
      break;
    case GS__FLOAT64:
      ((double *)p)[i] = (double)f / 3.0;
      break;
    case GS__FLOAT16:
      ((uint16_t *)p)[i] = gs__float_to_half(f / 64.0f);
      break;
    case GS__BFLOAT16:
      ((uint16_t *)p)[i] = gs__float_to_bf16(f);
      break;
    case GS__INT32:
      ((uint32_t *)p)[i] = next32();
      break;
    case GS__INT64:
      ((uint64_t *)p)[i] = (uint64_t)next32() << 32 | next32();
      break;
    case GS__INT8:
    case GS__UINT8:
      ((uint8_t *)p)[i] = (uint8_t)next32();
      break;
    case GS__INT16:
      ((uint16_t *)p)[i] = (uint16_t)next32();
      break;
    default:
      fail();
    }
  }
}

/* The 16-bit reference: every source converted exactly, reduced in float32
 * in source order, divided, rounded once, postscaled in the 16-bit type. */
static float f16_get(gs__dtype dt, uint16_t h) {
  return dt == GS__FLOAT16 ? gs__half_to_float(h) : gs__bf16_to_float(h);
}
static uint16_t f16_put(gs__dtype dt, float f) {
  return dt == GS__FLOAT16 ? gs__float_to_half(f) : gs__float_to_bf16(f);
}
static float op_ref(float a, float b, gs__reduce_op op) {
  switch (op) {
  case GS__MIN:
    return (b < a || b != b) ? b : a;
  case GS__MAX:
    return (b > a || b != b) ? b : a;
  case GS__PRODUCT:
    return a * b;
  default:
    return a + b;
  }
}

/* The fused kernel equals the separate passes, bit for bit (16-bit floats:
 * rounded once after the division, as the ring computes them). */
static void test_reduce_scaled_equals_passes(void **state) {
  (void)state;
  const int divisors[] = {1, 2, 3, 4, 7, 8};
  const double factors[] = {1.0, 0.37, 2.0};
  for (int dt = 0; dt < GS__DTYPE_COUNT; dt++) {
    size_t es = gs__dtype_size((gs__dtype)dt);
    for (size_t si = 0; si < NSIZES; si++) {
      size_t n = k_sizes[si];
      char *a = malloc(n * es + 1), *b = malloc(n * es + 1), *want = malloc(n * es + 1),
           *got = malloc(n * es + 1);
      assert_non_null(a), assert_non_null(b), assert_non_null(want), assert_non_null(got);
      fill(a, n, (gs__dtype)dt);
      fill(b, n, (gs__dtype)dt);
      for (size_t oi = 0; oi < 5; oi++)
        for (size_t di = 0; di < 6; di++)
          for (size_t fi = 0; fi < 3; fi++) {
            if (es == 2 && dt != GS__INT16) {
              /* 16-bit floats: reduced and divided in float32, rounded once */
              for (size_t i = 0; i < n; i++) {
                gs__dtype d = (gs__dtype)dt;
                volatile float v = op_ref(f16_get(d, ((uint16_t *)(void *)a)[i]),
                                          f16_get(d, ((uint16_t *)(void *)b)[i]), k_ops[oi]);
                v = v / (float)divisors[di];
                ((uint16_t *)(void *)want)[i] = f16_put(d, v);
              }
            } else {
              memcpy(want, a, n * es);
              gs__reduce(want, b, n, (gs__dtype)dt, k_ops[oi]);
              gs__divide(want, n, (gs__dtype)dt, divisors[di]);
            }
            gs__scale(want, n, (gs__dtype)dt, factors[fi]);
            memcpy(got, a, n * es);
            gs__reduce_scaled(got, b, n, (gs__dtype)dt, k_ops[oi], divisors[di], factors[fi]);
            if (memcmp(want, got, n * es) != 0) {
              print_error("%s %s n=%zu divisor=%d factor=%g: fused kernel differs\n",
                          gs__dtype_name((gs__dtype)dt), gs__reduce_op_name(k_ops[oi]), n,
                          divisors[di], factors[fi]);
              fail();
            }
          }
      free(a), free(b), free(want), free(got);
    }
  }
}

/* A power-of-two divisor is applied as a multiplication by its exact
 * reciprocal: the bits of the division, subnormals, infinities, NaN and
 * values at the ends of the range included. */
static void test_pow2_divisor_is_division(void **state) {
  (void)state;
  enum { N = 4099 };
  float *x = malloc(N * sizeof *x), *zero = calloc(N, sizeof *zero), *got = malloc(N * sizeof *got);
  double *xd = malloc(N * sizeof *xd), *zd = calloc(N, sizeof *zd), *gd = malloc(N * sizeof *gd);
  assert_non_null(x), assert_non_null(zero), assert_non_null(got);
  assert_non_null(xd), assert_non_null(zd), assert_non_null(gd);
  uint32_t u = 12345;
  for (size_t i = 0; i < N; i++) { /* every bit pattern class: raw random bits */
    u = u * 1664525u + 1013904223u;
    uint32_t bits = i < 64 ? (uint32_t)i : u; /* the smallest subnormals first */
    memcpy(&x[i], &bits, sizeof bits);
    uint64_t b64 = i < 64 ? (uint64_t)i : (uint64_t)u << 32 | (u * 2654435761u);
    memcpy(&xd[i], &b64, sizeof b64);
  }
  const int divisors[] = {2, 4, 8, 64, 1024, 1 << 20};
  for (size_t di = 0; di < sizeof divisors / sizeof divisors[0]; di++) {
    int d = divisors[di];
    memcpy(got, x, N * sizeof *x);
    gs__reduce_scaled(got, zero, N, GS__FLOAT32, GS__SUM, d, 1.0);
    for (size_t i = 0; i < N; i++) {
      volatile float want = (x[i] + 0.0f) / (float)d;
      if (memcmp(&got[i], (const void *)&want, sizeof want) && !(got[i] != got[i] && want != want))
        fail_msg("float32 element %zu (%a) / %d: got %a, want %a", i, (double)x[i], d,
                 (double)got[i], (double)want);
    }
    const void *srcs[3] = {zero, x, zero}; /* gs__reduce_many: the same bits */
    gs__reduce_many(got, GS__FLOAT32, srcs, 3, GS__FLOAT32, N, GS__SUM, d, 1.0);
    for (size_t i = 0; i < N; i++) {
      volatile float want = ((0.0f + x[i]) + 0.0f) / (float)d;
      if (memcmp(&got[i], (const void *)&want, sizeof want) && !(got[i] != got[i] && want != want))
        fail_msg("reduce_many float32 element %zu (%a) / %d: got %a, want %a", i, (double)x[i], d,
                 (double)got[i], (double)want);
    }
    memcpy(gd, xd, N * sizeof *xd);
    gs__reduce_scaled(gd, zd, N, GS__FLOAT64, GS__SUM, d, 1.0);
    for (size_t i = 0; i < N; i++) {
      volatile double want = (xd[i] + 0.0) / (double)d;
      if (memcmp(&gd[i], (const void *)&want, sizeof want) && !(gd[i] != gd[i] && want != want))
        fail_msg("float64 element %zu (%a) / %d: got %a, want %a", i, xd[i], d, gd[i], want);
    }
  }
  free(x), free(zero), free(got), free(xd), free(zd), free(gd);
}

/* Sources reduced in the order given; float32 accumulation rounded once. */
static void test_reduce_many_order_and_rounding(void **state) {
  (void)state;
  enum { NSRC = 5 };
  const size_t n = 2051;
  float *f[NSRC];
  uint16_t *h[NSRC];
  const void *fs[NSRC], *hs[NSRC];
  for (int q = 0; q < NSRC; q++) {
    f[q] = malloc(n * sizeof(float));
    h[q] = malloc(n * sizeof(uint16_t));
    assert_non_null(f[q]), assert_non_null(h[q]);
    fill(f[q], n, GS__FLOAT32);
    fs[q] = f[q], hs[q] = h[q];
  }
  float *got = malloc(n * sizeof *got);
  uint16_t *got16 = malloc(n * sizeof *got16);
  assert_non_null(got), assert_non_null(got16);
  for (size_t oi = 0; oi < 5; oi++) {
    gs__reduce_op op = k_ops[oi];
    /* float32, sum in source order then /3 then * 0.37f */
    gs__reduce_many(got, GS__FLOAT32, fs, NSRC, GS__FLOAT32, n, op, 3, 0.37);
    for (size_t i = 0; i < n; i++) {
      volatile float acc = f[0][i];
      for (int q = 1; q < NSRC; q++) acc = op_ref(acc, f[q][i], op);
      volatile float want = acc / 3.0f;
      want = want * (float)0.37;
      assert_memory_equal(&got[i], (const void *)&want, sizeof want);
    }
    for (int t = 0; t < 2; t++) {
      gs__dtype dt = t ? GS__BFLOAT16 : GS__FLOAT16;
      for (int q = 0; q < NSRC; q++)
        for (size_t i = 0; i < n; i++) h[q][i] = f16_put(dt, f[q][i] / 256.0f);
      /* 16-bit sources, and float32 sources into a 16-bit result */
      gs__reduce_many(got16, dt, hs, NSRC, dt, n, op, 2, 0.5);
      for (size_t i = 0; i < n; i++) {
        volatile float acc = f16_get(dt, h[0][i]);
        for (int q = 1; q < NSRC; q++) acc = op_ref(acc, f16_get(dt, h[q][i]), op);
        uint16_t want = f16_put(dt, acc / 2.0f);
        want = f16_put(dt, f16_get(dt, want) * 0.5f);
        assert_int_equal(got16[i], want);
      }
      gs__reduce_many(got16, dt, fs, NSRC, GS__FLOAT32, n, op, 1, 1.0);
      for (size_t i = 0; i < n; i++) {
        volatile float acc = f[0][i];
        for (int q = 1; q < NSRC; q++) acc = op_ref(acc, f[q][i], op);
        assert_int_equal(got16[i], f16_put(dt, acc));
      }
    }
  }
  /* order matters and is kept: (big + -big) + small != big + (-big + small) */
  float x[1] = {1e8f}, y[1] = {-1e8f}, z[1] = {1.0f}, r[1];
  const void *xyz[3] = {x, y, z}, *zxy[3] = {z, x, y};
  gs__reduce_many(r, GS__FLOAT32, xyz, 3, GS__FLOAT32, 1, GS__SUM, 1, 1.0);
  assert_true(r[0] == 1.0f);
  gs__reduce_many(r, GS__FLOAT32, zxy, 3, GS__FLOAT32, 1, GS__SUM, 1, 1.0);
  assert_true(r[0] == 0.0f);
  /* the result may overwrite a source other than the first */
  memcpy(got, f[2], n * sizeof *got);
  const void *alias[3] = {f[0], f[1], got};
  gs__reduce_many(got, GS__FLOAT32, alias, 3, GS__FLOAT32, n, GS__SUM, 1, 1.0);
  for (size_t i = 0; i < n; i++) {
    volatile float acc = f[0][i];
    acc = acc + f[1][i];
    acc = acc + f[2][i];
    assert_memory_equal(&got[i], (const void *)&acc, sizeof acc);
  }
  /* integers: wrapping, in order, divided and scaled as the passes do */
  int32_t a[3] = {INT32_MAX, 5, -9}, b[3] = {1, 5, 2}, c[3] = {0, 5, 0}, out[3];
  const void *abc[3] = {a, b, c};
  gs__reduce_many(out, GS__INT32, abc, 3, GS__INT32, 3, GS__SUM, 2, 1.0);
  assert_int_equal(out[0], INT32_MIN / 2);
  assert_int_equal(out[1], 7);
  assert_int_equal(out[2], -3);
  for (int q = 0; q < NSRC; q++) free(f[q]), free(h[q]);
  free(got), free(got16);
}

/* Bulk conversions equal the scalar ones (the dispatched path: F16C here
 * when the CPU has it), NaN payloads included. */
static void test_convert_matches_scalar(void **state) {
  (void)state;
  print_message("kernels dispatch to: %s\n", gs__reduce_isa());
  enum { NH = 65536 };
  uint16_t *h = malloc(NH * sizeof *h), *back = malloc(NH * sizeof *back);
  float *f = malloc(NH * sizeof *f);
  assert_non_null(h), assert_non_null(back), assert_non_null(f);
  for (int t = 0; t < 2; t++) {
    gs__dtype dt = t ? GS__BFLOAT16 : GS__FLOAT16;
    for (uint32_t i = 0; i < NH; i++) h[i] = (uint16_t)i;
    gs__convert(f, GS__FLOAT32, h, dt, NH);
    for (uint32_t i = 0; i < NH; i++) {
      float want = f16_get(dt, (uint16_t)i);
      if (memcmp(&f[i], &want, sizeof want) != 0) {
        print_error("%s 0x%04x: bulk conversion differs\n", gs__dtype_name(dt), i);
        fail();
      }
    }
    /* and back: every value a 16-bit value converts to comes back */
    gs__convert(back, dt, f, GS__FLOAT32, NH);
    for (uint32_t i = 0; i < NH; i++) assert_int_equal(back[i], f16_put(dt, f[i]));
    /* arbitrary float32 bit patterns: rounding, overflow, subnormals, NaN */
    for (int round = 0; round < 16; round++) {
      uint32_t *u = (uint32_t *)(void *)f;
      for (uint32_t i = 0; i < NH; i++) u[i] = next32() << 16 ^ next32();
      u[0] = 0x7f800000u, u[1] = 0xff800001u, u[2] = 0x477fe000u, u[3] = 0x477ff000u;
      u[4] = 0x33000000u, u[5] = 0x33000001u, u[6] = 0x80000001u, u[7] = 0x7fc00001u;
      gs__convert(back, dt, f, GS__FLOAT32, NH);
      for (uint32_t i = 0; i < NH; i++) {
        if (back[i] != f16_put(dt, f[i])) {
          print_error("%s from float32 0x%08x: bulk 0x%04x, scalar 0x%04x\n", gs__dtype_name(dt),
                      u[i], back[i], f16_put(dt, f[i]));
          fail();
        }
      }
    }
  }
  free(h), free(back), free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_scaled_equals_passes),
      cmocka_unit_test(test_pow2_divisor_is_division),
      cmocka_unit_test(test_reduce_many_order_and_rounding),
      cmocka_unit_test(test_convert_matches_scalar),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
