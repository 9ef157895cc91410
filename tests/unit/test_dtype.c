/* Unit tests of common/dtype.c: the size and name tables, float16 and
 * bfloat16 conversion (exact values, ties to even, overflow, subnormals,
 * infinities and NaN), the reduction kernels on every dtype and op
 * (including integer wrap-around) and gs__divide. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "dtype.h"

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void test_sizes_and_names(void **state) {
  (void)state;
  assert_int_equal(gs__dtype_size(GS__FLOAT32), 4);
  assert_int_equal(gs__dtype_size(GS__FLOAT64), 8);
  assert_int_equal(gs__dtype_size(GS__FLOAT16), 2);
  assert_int_equal(gs__dtype_size(GS__BFLOAT16), 2);
  assert_int_equal(gs__dtype_size(GS__INT32), 4);
  assert_int_equal(gs__dtype_size(GS__INT64), 8);
  assert_int_equal(gs__dtype_size(GS__INT8), 1);
  assert_int_equal(gs__dtype_size(GS__UINT8), 1);
  assert_int_equal(gs__dtype_size(GS__INT16), 2);
  assert_int_equal(gs__dtype_size(GS__DTYPE_COUNT), 0);
  assert_int_equal(gs__dtype_size((gs__dtype)-1), 0);

  assert_string_equal(gs__dtype_name(GS__FLOAT32), "float32");
  assert_string_equal(gs__dtype_name(GS__FLOAT64), "float64");
  assert_string_equal(gs__dtype_name(GS__FLOAT16), "float16");
  assert_string_equal(gs__dtype_name(GS__BFLOAT16), "bfloat16");
  assert_string_equal(gs__dtype_name(GS__INT32), "int32");
  assert_string_equal(gs__dtype_name(GS__INT64), "int64");
  assert_string_equal(gs__dtype_name(GS__INT8), "int8");
  assert_string_equal(gs__dtype_name(GS__UINT8), "uint8");
  assert_string_equal(gs__dtype_name(GS__INT16), "int16");
  assert_string_equal(gs__dtype_name(GS__DTYPE_COUNT), "invalid");

  assert_string_equal(gs__reduce_op_name(GS__SUM), "sum");
  assert_string_equal(gs__reduce_op_name(GS__AVERAGE), "average");
  assert_string_equal(gs__reduce_op_name(GS__MIN), "min");
  assert_string_equal(gs__reduce_op_name(GS__MAX), "max");
  assert_string_equal(gs__reduce_op_name(GS__PRODUCT), "product");
  assert_string_equal(gs__reduce_op_name(GS__ADASUM), "adasum");
  assert_string_equal(gs__reduce_op_name(GS__REDUCE_OP_COUNT), "invalid");

  assert_string_equal(gs__op_type_name(GS__OP_ALLREDUCE), "allreduce");
  assert_string_equal(gs__op_type_name(GS__OP_ALLGATHER), "allgather");
  assert_string_equal(gs__op_type_name(GS__OP_BROADCAST), "broadcast");
  assert_string_equal(gs__op_type_name(GS__OP_ALLTOALL), "alltoall");
  assert_string_equal(gs__op_type_name(GS__OP_REDUCESCATTER), "reducescatter");
  assert_string_equal(gs__op_type_name(GS__OP_BARRIER), "barrier");
  assert_string_equal(gs__op_type_name(GS__OP_JOIN), "join");
  assert_string_equal(gs__op_type_name(GS__OP_TYPE_COUNT), "invalid");

  assert_string_equal(gs__device_name(GS__DEVICE_CPU), "CPU");
  assert_string_equal(gs__device_name(GS__DEVICE_GPU), "GPU");
  assert_string_equal(gs__device_name(GS__DEVICE_COUNT), "invalid");
}

/* ---- float16 ------------------------------------------------------------- */

static void test_half_exact_values(void **state) {
  (void)state;
  static const struct {
    float f;
    uint16_t h;
  } k[] = {
      {0.0f, 0x0000},       {1.0f, 0x3c00},
      {-2.0f, 0xc000},      {0.5f, 0x3800},
      {65504.0f, 0x7bff},   {-65504.0f, 0xfbff},
      {0x1p-14f, 0x0400},   /* smallest normal */ {0x1p-24f, 0x0001}, /* smallest subnormal */
      {0x3ffp-24f, 0x03ff}, /* largest subnormal */ {1.0f + 0x1p-10f, 0x3c01},
      {3.140625f, 0x4248},  {-0.333251953125f, 0xb555},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    assert_int_equal(gs__float_to_half(k[i].f), k[i].h);
    assert_true(gs__half_to_float(k[i].h) == k[i].f);
  }
  /* negative zero keeps its sign both ways */
  assert_int_equal(gs__float_to_half(-0.0f), 0x8000);
  assert_int_equal(fbits(gs__half_to_float(0x8000)), 0x80000000u);
  assert_int_equal(fbits(gs__half_to_float(0x8001)), fbits(-0x1p-24f));
}

static void test_half_round_trip_all(void **state) {
  (void)state;
  for (uint32_t h = 0; h <= 0xffff; h++) {
    float f = gs__half_to_float((uint16_t)h);
    int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (is_nan) {
      assert_true(isnan(f));
      uint16_t back = gs__float_to_half(f);
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff)); /* still NaN */
      assert_int_equal(back & 0x8000, h & 0x8000);              /* same sign */
    } else {
      assert_int_equal(gs__float_to_half(f), h);
    }
  }
}

static void test_half_ties_to_even(void **state) {
  (void)state;
  /* halfway between 1 (even) and 1+2^-10 (odd): down to 1 */
  assert_int_equal(gs__float_to_half(1.0f + 0x1p-11f), 0x3c00);
  /* halfway between 1+2^-10 (odd) and 1+2^-9 (even): up */
  assert_int_equal(gs__float_to_half(1.0f + 0x3p-11f), 0x3c02);
  /* just above / below a tie goes to the nearer value */
  assert_int_equal(gs__float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  assert_int_equal(gs__float_to_half(1.0f + 0x3p-11f - 0x1p-20f), 0x3c01);
  assert_int_equal(gs__float_to_half(-(1.0f + 0x1p-11f)), 0xbc00);
  /* 2049 is a tie between 2048 and 2050 (spacing 2): even mantissa */
  assert_int_equal(gs__float_to_half(2049.0f), gs__float_to_half(2048.0f));
  assert_int_equal(gs__float_to_half(2051.0f), gs__float_to_half(2052.0f));
}

static void test_half_overflow_inf_nan(void **state) {
  (void)state;
  assert_int_equal(gs__float_to_half(65519.0f), 0x7bff); /* below the tie: max */
  assert_int_equal(gs__float_to_half(65520.0f), 0x7c00); /* the tie: to inf (max is odd) */
  assert_int_equal(gs__float_to_half(1e10f), 0x7c00);
  assert_int_equal(gs__float_to_half(-1e10f), 0xfc00);
  assert_int_equal(gs__float_to_half(INFINITY), 0x7c00);
  assert_int_equal(gs__float_to_half(-INFINITY), 0xfc00);
  assert_true(isinf(gs__half_to_float(0x7c00)) && gs__half_to_float(0x7c00) > 0);
  assert_true(isinf(gs__half_to_float(0xfc00)) && gs__half_to_float(0xfc00) < 0);

  uint16_t qn = gs__float_to_half(NAN);
  assert_true((qn & 0x7c00) == 0x7c00 && (qn & 0x3ff) != 0);
  uint16_t nn = gs__float_to_half(-NAN);
  assert_true((nn & 0xfc00) == 0xfc00 && (nn & 0x3ff) != 0);
  /* a NaN whose payload sits only in bits float16 drops must not turn into inf */
  uint16_t low = gs__float_to_half(bitsf(0x7f800001u));
  assert_true((low & 0x7c00) == 0x7c00 && (low & 0x3ff) != 0);
  assert_true(isnan(gs__half_to_float(0x7e00)));
  assert_true(isnan(gs__half_to_float(0x7c01)));
}

static void test_half_subnormals(void **state) {
  (void)state;
  assert_int_equal(gs__float_to_half(0x1p-25f), 0x0000); /* tie between 0 and 2^-24: even */
  assert_int_equal(gs__float_to_half(0x3p-25f), 0x0002); /* tie between 1 and 2 units: 2 */
  assert_int_equal(gs__float_to_half(0x5p-25f), 0x0002); /* tie between 2 and 3 units: 2 */
  assert_int_equal(gs__float_to_half(0x1p-25f + 0x1p-40f), 0x0001);
  assert_int_equal(gs__float_to_half(0x1p-26f), 0x0000);
  assert_int_equal(gs__float_to_half(-0x1p-26f), 0x8000);
  assert_int_equal(gs__float_to_half(1e-30f), 0x0000);
  assert_int_equal(gs__float_to_half(bitsf(1)), 0x0000); /* float32 subnormal */
  /* tie between the largest subnormal (odd) and the smallest normal */
  assert_int_equal(gs__float_to_half(0x7ffp-25f), 0x0400);
  assert_int_equal(gs__float_to_half(1022.375f * 0x1p-24f), 0x03fe);
  assert_int_equal(gs__float_to_half(1022.5f * 0x1p-24f), 0x03fe); /* tie: even */
  assert_int_equal(gs__float_to_half(1022.75f * 0x1p-24f), 0x03ff);
  /* every subnormal step is exact */
  for (uint16_t m = 1; m < 0x400; m++) assert_true(gs__half_to_float(m) == (float)m * 0x1p-24f);
}

#ifdef __FLT16_MAX__
/* gcc's _Float16 conversion (libgcc, correctly rounded) as an independent
 * reference over a spread of float32 bit patterns. */
static void test_half_matches_compiler(void **state) {
  (void)state;
  uint32_t x = 12345;
  for (int i = 0; i < 2000000; i++) {
    x = x * 1664525u + 1013904223u;
    uint32_t u = (x & 0x80000000u) | ((x >> 1) & 0x7fffffffu);
    if (i % 2) u = (u & 0x807fffffu) | ((100u + (x % 50u)) << 23); /* near half range */
    float f = bitsf(u);
    if (isnan(f)) continue;
    _Float16 ref = (_Float16)f;
    uint16_t rb;
    memcpy(&rb, &ref, sizeof rb);
    if (gs__float_to_half(f) != rb)
      fail_msg("float %a (0x%08x): got 0x%04x want 0x%04x", f, u, gs__float_to_half(f), rb);
    if (gs__half_to_float(rb) != (float)ref) fail_msg("half 0x%04x back to float", rb);
  }
}
#endif

/* ---- bfloat16 ------------------------------------------------------------ */

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(gs__float_to_bf16(1.0f), 0x3f80);
  assert_int_equal(gs__float_to_bf16(-2.0f), 0xc000);
  assert_int_equal(gs__float_to_bf16(0.0f), 0x0000);
  assert_int_equal(gs__float_to_bf16(-0.0f), 0x8000);
  assert_true(gs__bf16_to_float(0x3f80) == 1.0f);
  assert_true(gs__bf16_to_float(0x4049) == 3.140625f);
  /* ties to even */
  assert_int_equal(gs__float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(gs__float_to_bf16(1.0f + 0x3p-8f), 0x3f82);
  assert_int_equal(gs__float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  /* overflow of the rounding carries into infinity */
  assert_int_equal(gs__float_to_bf16(3.4028235e38f), 0x7f80);
  assert_int_equal(gs__float_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(gs__float_to_bf16(-INFINITY), 0xff80);
  assert_true(isinf(gs__bf16_to_float(0x7f80)));
  /* NaN stays NaN, also when its payload is only in the dropped bits */
  uint16_t n = gs__float_to_bf16(bitsf(0x7f800001u));
  assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
  assert_true((gs__float_to_bf16(-NAN) & 0x8000) != 0);
  assert_true(isnan(gs__bf16_to_float(gs__float_to_bf16(NAN))));
  /* subnormals are plain truncations of float32 subnormals */
  assert_int_equal(gs__float_to_bf16(bitsf(0x00010000u)), 0x0001);
  assert_int_equal(gs__float_to_bf16(bitsf(0x00018000u)), 0x0002); /* tie, odd -> up */
  assert_int_equal(gs__float_to_bf16(bitsf(0x00008000u)), 0x0000); /* tie, even -> down */

  for (uint32_t b = 0; b <= 0xffff; b++) {
    float f = gs__bf16_to_float((uint16_t)b);
    if (isnan(f))
      assert_true(isnan(gs__bf16_to_float(gs__float_to_bf16(f))));
    else
      assert_int_equal(gs__float_to_bf16(f), b);
  }
}

/* ---- reduce kernels -------------------------------------------------------- */

#define N 37 /* more than one vector block plus a tail */

static void test_reduce_float32(void **state) {
  (void)state;
  float d[N], s[N];
  for (gs__reduce_op op = GS__SUM; op <= GS__PRODUCT; op++) {
    for (int i = 0; i < N; i++) d[i] = (float)(i - 18) * 0.5f, s[i] = (float)(i % 5) - 2.0f;
    gs__reduce(d, s, N, GS__FLOAT32, op);
    for (int i = 0; i < N; i++) {
      float a = (float)(i - 18) * 0.5f, b = (float)(i % 5) - 2.0f, want;
      switch (op) {
      case GS__MIN:
        want = a < b ? a : b;
        break;
      case GS__MAX:
        want = a > b ? a : b;
        break;
      case GS__PRODUCT:
        want = a * b;
        break;
      default:
        want = a + b;
      }
      assert_true(d[i] == want);
    }
  }
}

static void test_reduce_float64(void **state) {
  (void)state;
  double d[4] = {1.5, -2, 1e308, 0}, s[4] = {2.25, 3, 1e308, -0.0};
  gs__reduce(d, s, 4, GS__FLOAT64, GS__SUM);
  assert_true(d[0] == 3.75 && d[1] == 1 && isinf(d[2]) && d[3] == 0);
  double p[3] = {1.5, -2, 3}, q[3] = {2, 3, 0.5};
  gs__reduce(p, q, 3, GS__FLOAT64, GS__PRODUCT);
  assert_true(p[0] == 3 && p[1] == -6 && p[2] == 1.5);
  double mn[2] = {1, -5}, o[2] = {-1, 5};
  gs__reduce(mn, o, 2, GS__FLOAT64, GS__MIN);
  assert_true(mn[0] == -1 && mn[1] == -5);
  gs__reduce(mn, o, 2, GS__FLOAT64, GS__MAX);
  assert_true(mn[0] == -1 && mn[1] == 5);
}

static void test_reduce_min_max_nan(void **state) {
  (void)state;
  /* NaN on either side wins (torch.minimum semantics) */
  float d[4] = {NAN, 1, NAN, 2}, s[4] = {1, NAN, NAN, 3};
  gs__reduce(d, s, 4, GS__FLOAT32, GS__MIN);
  assert_true(isnan(d[0]) && isnan(d[1]) && isnan(d[2]) && d[3] == 2);
  float e[4] = {NAN, 1, NAN, 2};
  gs__reduce(e, s, 4, GS__FLOAT32, GS__MAX);
  assert_true(isnan(e[0]) && isnan(e[1]) && isnan(e[2]) && e[3] == 3);
}

static void test_reduce_average_is_sum(void **state) {
  (void)state;
  int32_t d[3] = {1, 2, 3}, s[3] = {10, 20, 30};
  gs__reduce(d, s, 3, GS__INT32, GS__AVERAGE);
  assert_int_equal(d[0], 11);
  assert_int_equal(d[2], 33);
  float f[2] = {1, 2}, g[2] = {3, 4};
  gs__reduce(f, g, 2, GS__FLOAT32, GS__AVERAGE);
  assert_true(f[0] == 4 && f[1] == 6);
}

static void test_reduce_int_wrap(void **state) {
  (void)state;
  int8_t a[4] = {100, -128, 127, -5}, b[4] = {100, -1, 1, 3};
  gs__reduce(a, b, 4, GS__INT8, GS__SUM);
  assert_int_equal(a[0], -56);
  assert_int_equal(a[1], 127);
  assert_int_equal(a[2], -128);
  assert_int_equal(a[3], -2);
  int8_t pa[3] = {16, 100, -128}, pb[3] = {16, 3, -1};
  gs__reduce(pa, pb, 3, GS__INT8, GS__PRODUCT);
  assert_int_equal(pa[0], 0);
  assert_int_equal(pa[1], 44);
  assert_int_equal(pa[2], -128);

  uint8_t u[3] = {200, 255, 16}, v[3] = {100, 1, 17};
  gs__reduce(u, v, 3, GS__UINT8, GS__SUM);
  assert_int_equal(u[0], 44);
  assert_int_equal(u[1], 0);
  assert_int_equal(u[2], 33);
  uint8_t pu[2] = {16, 255}, pv[2] = {17, 255};
  gs__reduce(pu, pv, 2, GS__UINT8, GS__PRODUCT);
  assert_int_equal(pu[0], 16);
  assert_int_equal(pu[1], 1);

  int32_t i[3] = {INT32_MAX, INT32_MIN, 65536}, j[3] = {1, -1, 65536};
  gs__reduce(i, j, 2, GS__INT32, GS__SUM);
  assert_int_equal(i[0], INT32_MIN);
  assert_int_equal(i[1], INT32_MAX);
  int32_t pi[2] = {65536, INT32_MIN}, pj[2] = {65536, -1};
  gs__reduce(pi, pj, 2, GS__INT32, GS__PRODUCT);
  assert_int_equal(pi[0], 0);
  assert_int_equal(pi[1], INT32_MIN);

  int64_t l[2] = {INT64_MAX, INT64_MIN}, m[2] = {1, -1};
  gs__reduce(l, m, 2, GS__INT64, GS__SUM);
  assert_true(l[0] == INT64_MIN && l[1] == INT64_MAX);
  int64_t pl[2] = {(int64_t)1 << 32, INT64_MIN}, pm[2] = {(int64_t)1 << 32, -1};
  gs__reduce(pl, pm, 2, GS__INT64, GS__PRODUCT);
  assert_true(pl[0] == 0 && pl[1] == INT64_MIN);
}

static void test_reduce_int_min_max(void **state) {
  (void)state;
  int8_t a[N], b[N];
  uint8_t ua[N], ub[N];
  int32_t ia[N], ib[N];
  int64_t la[N], lb[N];
  for (gs__reduce_op op = GS__MIN; op <= GS__MAX; op++) {
    for (int i = 0; i < N; i++) {
      a[i] = (int8_t)(i * 37), b[i] = (int8_t)(i * 91 + 5);
      ua[i] = (uint8_t)a[i], ub[i] = (uint8_t)b[i];
      ia[i] = a[i] * 1000003, ib[i] = b[i] * 1000003;
      la[i] = (int64_t)ia[i] * 1048576, lb[i] = (int64_t)ib[i] * 1048576;
    }
    gs__reduce(a, b, N, GS__INT8, op);
    gs__reduce(ua, ub, N, GS__UINT8, op);
    gs__reduce(ia, ib, N, GS__INT32, op);
    gs__reduce(la, lb, N, GS__INT64, op);
    for (int i = 0; i < N; i++) {
      int8_t x = (int8_t)(i * 37), y = (int8_t)(i * 91 + 5);
      uint8_t ux = (uint8_t)x, uy = (uint8_t)y;
      int8_t w = op == GS__MIN ? (x < y ? x : y) : (x > y ? x : y);
      uint8_t uw = op == GS__MIN ? (ux < uy ? ux : uy) : (ux > uy ? ux : uy);
      assert_int_equal(a[i], w);
      assert_int_equal(ua[i], uw);
      assert_int_equal(ia[i], w * 1000003);
      assert_true(la[i] == (int64_t)(w * 1000003) * 1048576);
    }
  }
}

static void test_reduce_half_types(void **state) {
  (void)state;
  uint16_t h[4], g[4];
  const float a[4] = {1, -2.5f, 65504, 0.1f}, b[4] = {2, 0.5f, 65504, 0.2f};
  for (int i = 0; i < 4; i++) h[i] = gs__float_to_half(a[i]), g[i] = gs__float_to_half(b[i]);
  gs__reduce(h, g, 4, GS__FLOAT16, GS__SUM);
  assert_int_equal(h[0], gs__float_to_half(3));
  assert_int_equal(h[1], gs__float_to_half(-2));
  assert_int_equal(h[2], 0x7c00); /* overflow to inf */
  assert_int_equal(h[3], gs__float_to_half(gs__half_to_float(gs__float_to_half(0.1f)) +
                                           gs__half_to_float(gs__float_to_half(0.2f))));
  for (int i = 0; i < 4; i++) h[i] = gs__float_to_half(a[i]);
  gs__reduce(h, g, 4, GS__FLOAT16, GS__PRODUCT);
  assert_int_equal(h[0], gs__float_to_half(2));
  assert_int_equal(h[1], gs__float_to_half(-1.25f));
  for (int i = 0; i < 4; i++) h[i] = gs__float_to_half(a[i]);
  gs__reduce(h, g, 4, GS__FLOAT16, GS__MIN);
  assert_int_equal(h[0], gs__float_to_half(1));
  assert_int_equal(h[1], gs__float_to_half(-2.5f));
  for (int i = 0; i < 4; i++) h[i] = gs__float_to_half(a[i]);
  gs__reduce(h, g, 4, GS__FLOAT16, GS__MAX);
  assert_int_equal(h[0], gs__float_to_half(2));
  assert_int_equal(h[1], gs__float_to_half(0.5f));

  uint16_t x[3], y[3];
  const float c[3] = {1, 256, -3}, d[3] = {2, 1, 4};
  for (int i = 0; i < 3; i++) x[i] = gs__float_to_bf16(c[i]), y[i] = gs__float_to_bf16(d[i]);
  gs__reduce(x, y, 3, GS__BFLOAT16, GS__SUM);
  assert_int_equal(x[0], gs__float_to_bf16(3));
  assert_int_equal(x[1], gs__float_to_bf16(256)); /* 257 rounds to even 256 */
  assert_int_equal(x[2], gs__float_to_bf16(1));
  for (int i = 0; i < 3; i++) x[i] = gs__float_to_bf16(c[i]);
  gs__reduce(x, y, 3, GS__BFLOAT16, GS__PRODUCT);
  assert_int_equal(x[2], gs__float_to_bf16(-12));
  for (int i = 0; i < 3; i++) x[i] = gs__float_to_bf16(c[i]);
  gs__reduce(x, y, 3, GS__BFLOAT16, GS__MAX);
  assert_int_equal(x[1], gs__float_to_bf16(256));
  assert_int_equal(x[2], gs__float_to_bf16(4));
  for (int i = 0; i < 3; i++) x[i] = gs__float_to_bf16(c[i]);
  gs__reduce(x, y, 3, GS__BFLOAT16, GS__MIN);
  assert_int_equal(x[0], gs__float_to_bf16(1));
  assert_int_equal(x[2], gs__float_to_bf16(-3));
}

static void test_reduce_zero_count(void **state) {
  (void)state;
  float d[1] = {7};
  gs__reduce(d, d, 0, GS__FLOAT32, GS__SUM);
  assert_true(d[0] == 7);
}

/* ---- divide ---------------------------------------------------------------- */

static void test_divide(void **state) {
  (void)state;
  int32_t i[4] = {7, -7, INT32_MIN, 1};
  gs__divide(i, 4, GS__INT32, 2);
  assert_int_equal(i[0], 3);
  assert_int_equal(i[1], -3); /* toward zero, not floor */
  assert_int_equal(i[2], INT32_MIN / 2);
  assert_int_equal(i[3], 0);
  int64_t l[2] = {-9, INT64_MAX};
  gs__divide(l, 2, GS__INT64, 4);
  assert_true(l[0] == -2 && l[1] == INT64_MAX / 4);
  int8_t b[3] = {-128, 127, -1};
  gs__divide(b, 3, GS__INT8, 3);
  assert_int_equal(b[0], -42);
  assert_int_equal(b[1], 42);
  assert_int_equal(b[2], 0);
  uint8_t u[2] = {255, 3};
  gs__divide(u, 2, GS__UINT8, 4);
  assert_int_equal(u[0], 63);
  assert_int_equal(u[1], 0);

  float f[2] = {1, -6};
  gs__divide(f, 2, GS__FLOAT32, 3);
  assert_true(f[0] == 1.0f / 3.0f && f[1] == -2);
  double d[1] = {1};
  gs__divide(d, 1, GS__FLOAT64, 3);
  assert_true(d[0] == 1.0 / 3.0);

  /* 16-bit: divided in float32, rounded once */
  uint16_t h[2] = {gs__float_to_half(3), gs__float_to_half(1)};
  gs__divide(h, 2, GS__FLOAT16, 2);
  assert_int_equal(h[0], 0x3e00); /* 1.5 */
  assert_int_equal(h[1], 0x3800); /* 0.5 */
  uint16_t h3[1] = {gs__float_to_half(1)};
  gs__divide(h3, 1, GS__FLOAT16, 3);
  assert_int_equal(h3[0], gs__float_to_half(1.0f / 3.0f));
  uint16_t bf[1] = {gs__float_to_bf16(1)};
  gs__divide(bf, 1, GS__BFLOAT16, 3);
  assert_int_equal(bf[0], gs__float_to_bf16(1.0f / 3.0f));

  /* dividing by 1 is the identity, also for NaN payloads */
  uint16_t nan16[1] = {0x7e01};
  gs__divide(nan16, 1, GS__FLOAT16, 1);
  assert_int_equal(nan16[0], 0x7e01);
}

/* int16 (GS_INT16, numbered 8): wrapping sums and products, min/max,
 * truncating division. */
static void test_int16(void **state) {
  (void)state;
  int16_t a[4] = {32767, -32768, -5, 100}, b[4] = {1, -1, 3, -300};
  gs__reduce(a, b, 4, GS__INT16, GS__SUM);
  assert_int_equal(a[0], -32768); /* wraps */
  assert_int_equal(a[1], 32767);
  assert_int_equal(a[2], -2);
  assert_int_equal(a[3], -200);
  int16_t p[2] = {300, -7}, q[2] = {300, 5};
  gs__reduce(p, q, 2, GS__INT16, GS__PRODUCT);
  assert_int_equal(p[0], (int16_t)(uint16_t)(90000u & 0xffffu));
  assert_int_equal(p[1], -35);
  int16_t mn[2] = {-4, 9}, mx[2] = {-4, 9}, o[2] = {-5, 10};
  gs__reduce(mn, o, 2, GS__INT16, GS__MIN);
  gs__reduce(mx, o, 2, GS__INT16, GS__MAX);
  assert_int_equal(mn[0], -5);
  assert_int_equal(mn[1], 9);
  assert_int_equal(mx[0], -4);
  assert_int_equal(mx[1], 10);
  int16_t d[3] = {-7, 7, 32767};
  gs__divide(d, 3, GS__INT16, 2);
  assert_int_equal(d[0], -3);
  assert_int_equal(d[1], 3);
  assert_int_equal(d[2], 16383);
}

/* Prescale/postscale as Horovod computes them: float32 in float32 with the
 * factor rounded to float; integers in double, truncated toward zero. */
static void test_scale_like_horovod(void **state) {
  (void)state;
  const double third = 1.0 / 3.0;
  float f[3] = {1.0f, 10.0f, -7.0f};
  gs__scale(f, 3, GS__FLOAT32, third);
  for (int i = 0; i < 3; i++) {
    float in[3] = {1.0f, 10.0f, -7.0f};
    float want = in[i] * (float)third;
    assert_memory_equal(&f[i], &want, sizeof want);
  }
  double g[2] = {1.0, 10.0};
  gs__scale(g, 2, GS__FLOAT64, third);
  assert_true(g[0] == 1.0 * third && g[1] == 10.0 * third);
  /* integers truncate toward zero (7 * 0.5 = 3.5 -> 3, -3.5 -> -3) */
  int32_t i32[4] = {7, -7, 5, 2000000000};
  gs__scale(i32, 4, GS__INT32, 0.5);
  assert_int_equal(i32[0], 3);
  assert_int_equal(i32[1], -3);
  assert_int_equal(i32[2], 2);
  assert_int_equal(i32[3], 1000000000);
  int64_t i64[2] = {-9, 9};
  gs__scale(i64, 2, GS__INT64, 0.25);
  assert_int_equal(i64[0], -2);
  assert_int_equal(i64[1], 2);
  int16_t i16[3] = {5, -5, 30000};
  gs__scale(i16, 3, GS__INT16, 2.5);
  assert_int_equal(i16[0], 12);
  assert_int_equal(i16[1], -12);
  assert_int_equal(i16[2], 32767); /* saturates instead of undefined behaviour */
  int8_t i8[2] = {3, -3};
  gs__scale(i8, 2, GS__INT8, 0.9);
  assert_int_equal(i8[0], 2);
  assert_int_equal(i8[1], -2);
  uint8_t u8[2] = {200, 3};
  gs__scale(u8, 2, GS__UINT8, 2.0);
  assert_int_equal(u8[0], 255);
  assert_int_equal(u8[1], 6);
  uint16_t h[1] = {gs__float_to_half(3.0f)};
  gs__scale(h, 1, GS__FLOAT16, third);
  assert_int_equal(h[0], gs__float_to_half(3.0f * (float)third));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_and_names),
      cmocka_unit_test(test_half_exact_values),
      cmocka_unit_test(test_half_round_trip_all),
      cmocka_unit_test(test_half_ties_to_even),
      cmocka_unit_test(test_half_overflow_inf_nan),
      cmocka_unit_test(test_half_subnormals),
#ifdef __FLT16_MAX__
      cmocka_unit_test(test_half_matches_compiler),
#endif
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_reduce_float32),
      cmocka_unit_test(test_reduce_float64),
      cmocka_unit_test(test_reduce_min_max_nan),
      cmocka_unit_test(test_reduce_average_is_sum),
      cmocka_unit_test(test_reduce_int_wrap),
      cmocka_unit_test(test_reduce_int_min_max),
      cmocka_unit_test(test_reduce_half_types),
      cmocka_unit_test(test_reduce_zero_count),
      cmocka_unit_test(test_divide),
      cmocka_unit_test(test_int16),
      cmocka_unit_test(test_scale_like_horovod),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
