// gs-gpu-worker: the GPU checks of tests/gpu (run by test_gpu and run.sh on
// a machine with a CUDA device; never here without one).
//
//   gs-gpu-worker ops          every op x dtype on device buffers through
//                              gradsync (GRADSYNC_BACKEND=nccl, world size
//                              1 through the real coordinator) against host
//                              references; input produced on the caller's
//                              stream behind a delay kernel (ordering);
//                              gathering results copied with
//                              gs_handle_result_copy behind a delay kernel,
//                              the handle freed at once
//   gs-gpu-worker timeout      a collective queued behind a kernel that
//                              never ends fails after the data-plane timeout
//   gs-gpu-worker abort        the same, ended by the coordinator's loss
//                              (the driver kills it after "QUEUED")
//   gs-gpu-worker pack-bench   the batched pack kernel vs one
//                              cudaMemcpyAsync per tensor: equal bytes, and
//                              the median time of each (ratio)
//   gs-gpu-worker ar-bench     allreduce 1 KiB..256 MiB: gradsync end to end
//                              vs ncclAllReduce called directly (ratio)
//
// Prints "FAIL: ..." and exits 1 on any wrong value; "OK" at the end.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <unistd.h>

#include "cuda_pack.h"
#include "gradsync.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  _exit(1);
}

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) die("%s: %s", #x, cudaGetErrorString(e_));                           \
  } while (0)

static void must(gs_status s, const char *what) {
  if (s != GS_OK) die("%s: %s: %s", what, gs_status_str(s), gs_last_error(NULL));
}

// Spins until *flag != 0 or ms milliseconds (clock64 based) have passed.
__global__ void spin(volatile int *flag, long long cycles) {
  long long t0 = clock64();
  while (!*flag && clock64() - t0 < cycles) {
  }
}

static long long cycles_per_ms() {
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  return khz > 0 ? (long long)khz : 1500000LL;
}

static double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- host references --------------------------------------------------------

static const gs_dtype kTypes[] = {GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16,
                                  GS_INT32,   GS_INT64,   GS_INT8,    GS_UINT8};
static const char *tname(gs_dtype t) {
  static const char *n[] = {"float32", "float64", "float16", "bfloat16",
                            "int32",   "int64",   "int8",    "uint8"};
  return n[t];
}

static uint16_t f2h(float f) {  // round to nearest even, finite values only
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (exp <= 0) return (uint16_t)sign;
  uint32_t h = sign | (uint32_t)(exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}
static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t x = exp ? sign | ((exp - 15 + 127) << 23) | (man << 13) : sign;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f2b(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}
static float b2f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static double get(const void *p, gs_dtype t, size_t i) {
  switch (t) {
  case GS_FLOAT32: return ((const float *)p)[i];
  case GS_FLOAT64: return ((const double *)p)[i];
  case GS_FLOAT16: return h2f(((const uint16_t *)p)[i]);
  case GS_BFLOAT16: return b2f(((const uint16_t *)p)[i]);
  case GS_INT32: return ((const int32_t *)p)[i];
  case GS_INT64: return (double)((const int64_t *)p)[i];
  case GS_INT8: return ((const int8_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}
static void put(void *p, gs_dtype t, size_t i, double v) {
  switch (t) {
  case GS_FLOAT32: ((float *)p)[i] = (float)v; break;
  case GS_FLOAT64: ((double *)p)[i] = v; break;
  case GS_FLOAT16: ((uint16_t *)p)[i] = f2h((float)v); break;
  case GS_BFLOAT16: ((uint16_t *)p)[i] = f2b((float)v); break;
  case GS_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
  case GS_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
  case GS_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
  default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

static void check_equal(const char *name, const void *got, const void *want, gs_dtype t, size_t n,
                        double tol) {
  for (size_t i = 0; i < n; i++) {
    double g = get(got, t, i), w = get(want, t, i);
    if (fabs(g - w) > tol * (1 + fabs(w)))
      die("tensor '%s' (%s) element %zu is %g, expected %g", name, tname(t), i, g, w);
  }
}

static gs_ctx *init_nccl() {
  gs_options o;
  gs_options_init(&o);
  o.backend = "nccl";
  gs_ctx *ctx = NULL;
  must(gs_init(&o, &ctx), "gs_init(backend=nccl)");
  return ctx;
}

// ---- ops ----------------------------------------------------------------------

struct dev_tensor {
  void *d = nullptr;
  std::vector<unsigned char> host;
  size_t n = 0;
  gs_dtype t = GS_FLOAT32;
};

// Device buffer of n elements of t holding small integers (exact in every
// dtype), written on stream s behind a delay kernel, after the buffer was
// filled with garbage: an op not ordered after s would read the garbage.
static dev_tensor make_input(gs_dtype t, size_t n, cudaStream_t s, int *flag, int seed) {
  dev_tensor x;
  x.t = t;
  x.n = n;
  size_t es = gs_dtype_size(t);
  x.host.resize(n * es);
  for (size_t i = 0; i < n; i++) put(x.host.data(), t, i, (double)((i * 7 + seed) % 13 + 1));
  CK(cudaMalloc(&x.d, n * es + 1));
  CK(cudaMemset(x.d, 0x7b, n * es + 1));
  spin<<<1, 1, 0, s>>>(flag, cycles_per_ms() * 20);
  CK(cudaMemcpyAsync(x.d, x.host.data(), n * es, cudaMemcpyHostToDevice, s));
  return x;
}

static std::vector<unsigned char> to_host(const void *d, size_t bytes) {
  std::vector<unsigned char> h(bytes + 1);
  CK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// gs_handle_result_copy of the device result of h (res, bytes: from
// gs_handle_result) into a new device buffer, on stream s (the op's) behind
// a 20 ms spin kernel; h is freed right after the call and the same op runs
// again at once on another stream (not ordered after s), so a result
// released before its copy ran would be overwritten (the pool hands the
// memory out again) and the copy would read the new op's bytes. Also the
// refusals: a host dst, a size off by one.
static int check_result_copy(gs_ctx *ctx, gs_handle *h, const char *name, const void *res,
                             size_t bytes, const dev_tensor &x, cudaStream_t s, int *flag) {
  static cudaStream_t other;
  if (!other) CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  gs_op_opts oo;
  gs_op_opts_init(&oo);
  oo.stream = other;
  std::vector<unsigned char> want = to_host(res, bytes);
  std::vector<unsigned char> host(bytes + 1);
  char text[256];
  snprintf(text, sizeof text,
           "tensor '%s': the result is in GPU memory (where the op ran) but "
           "gs_handle_result_copy's dst is in CPU memory; allocate dst on the input's device",
           name);
  if (gs_handle_result_copy(h, host.data(), bytes) != GS_ERR_INVALID_ARG ||
      strcmp(gs_last_error(ctx), text) != 0)
    die("%s: gs_handle_result_copy into host memory: \"%s\"", name, gs_last_error(ctx));
  unsigned char *d;
  CK(cudaMalloc(&d, bytes + 1));
  CK(cudaMemset(d, 0x5c, bytes + 1));
  CK(cudaDeviceSynchronize());
  if (gs_handle_result_copy(h, d, bytes + 1) != GS_ERR_INVALID_ARG ||
      !strstr(gs_last_error(ctx), "pass a buffer of exactly the result's size"))
    die("%s: gs_handle_result_copy of one byte too many: \"%s\"", name, gs_last_error(ctx));
  spin<<<1, 1, 0, s>>>(flag, cycles_per_ms() * 20);
  must(gs_handle_result_copy(h, d, bytes), name);
  gs_handle_free(h);
  // the same op again, other data, at once: its result may take the memory
  char again[80];
  snprintf(again, sizeof again, "%s/again", name);
  std::vector<unsigned char> garbage(x.n * gs_dtype_size(x.t), 0x33);
  // (not on the legacy stream: it waits for the copy, which is the point)
  CK(cudaMemcpyAsync(x.d, garbage.data(), garbage.size(), cudaMemcpyHostToDevice, other));
  CK(cudaStreamSynchronize(other));
  int64_t shape[2] = {(int64_t)x.n / 10, 10};
  gs_handle *h2;
  if (!strncmp(name, "ag/", 3))
    must(gs_allgather_async(ctx, again, x.d, shape, 2, x.t, &oo, &h2), again);
  else if (!strncmp(name, "rs/", 3))
    must(gs_reducescatter_async(ctx, again, x.d, shape, 2, x.t, GS_SUM, &oo, &h2), again);
  else
    must(gs_alltoall_async(ctx, again, x.d, shape, 2, x.t, NULL, &oo, &h2), again);
  must(gs_wait(h2, 60000), again);
  gs_handle_free(h2);
  CK(cudaStreamSynchronize(s));
  std::vector<unsigned char> got = to_host(d, bytes + 1);
  if (memcmp(got.data(), want.data(), bytes) != 0)
    die("%s: gs_handle_result_copy's bytes differ from the result (released before the copy?)",
        name);
  if (got[bytes] != 0x5c) die("%s: gs_handle_result_copy wrote past dst", name);
  CK(cudaMemcpy(x.d, x.host.data(), x.host.size(), cudaMemcpyHostToDevice));
  cudaFree(d);
  return 1;
}

static int mode_ops() {
  gs_ctx *ctx = init_nccl();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *flag;
  CK(cudaMalloc(&flag, sizeof(int)));
  CK(cudaMemset(flag, 0, sizeof(int)));
  int checks = 0, copies = 0;
  const size_t N = 1000;
  static const gs_reduce_op ops[] = {GS_SUM, GS_AVERAGE, GS_MIN, GS_MAX, GS_PRODUCT};
  static const char *opn[] = {"sum", "average", "min", "max", "product"};
  for (gs_dtype t : kTypes) {
    double tol = (t == GS_FLOAT16 || t == GS_BFLOAT16) ? 1e-2 : 0;
    for (int k = 0; k < 5; k++) {
      // world size 1: every reduction is the input; prescale 2 x postscale 0.5
      // on floats checks the fused scaling of the copy kernel too
      char name[64];
      snprintf(name, sizeof name, "ar/%s/%s", tname(t), opn[k]);
      dev_tensor x = make_input(t, N, s, flag, k);
      gs_allreduce_opts o;
      gs_allreduce_opts_init(&o);
      o.stream = s;
      int floaty = t <= GS_BFLOAT16;
      if (floaty && k == 0) {
        o.prescale = 2.0;
        o.postscale = 0.25;
      }
      gs_handle *h;
      must(gs_allreduce_async(ctx, name, x.d, x.d, N, t, ops[k], &o, &h), name);
      must(gs_wait(h, 60000), name);
      gs_handle_free(h);
      std::vector<unsigned char> want = x.host;
      if (floaty && k == 0)
        for (size_t i = 0; i < N; i++) put(want.data(), t, i, get(x.host.data(), t, i) * 0.5);
      check_equal(name, to_host(x.d, N * gs_dtype_size(t)).data(), want.data(), t, N, tol);
      cudaFree(x.d);
      checks++;
    }
    // allgather (rows of 10), broadcast, reducescatter, alltoall
    char name[64];
    int64_t shape[2] = {(int64_t)N / 10, 10};
    gs_op_opts oo;
    gs_op_opts_init(&oo);
    oo.stream = s;
    const void *res;
    size_t bytes;
    gs_handle *h;
    dev_tensor x = make_input(t, N, s, flag, 3);
    snprintf(name, sizeof name, "ag/%s", tname(t));
    must(gs_allgather_async(ctx, name, x.d, shape, 2, t, &oo, &h), name);
    must(gs_wait(h, 60000), name);
    must(gs_handle_result(h, &res, &bytes), name);
    if (bytes != N * gs_dtype_size(t)) die("%s: result of %zu bytes", name, bytes);
    check_equal(name, to_host(res, bytes).data(), x.host.data(), t, N, 0);
    copies += check_result_copy(ctx, h, name, res, bytes, x, s, flag);
    checks++;
    snprintf(name, sizeof name, "bc/%s", tname(t));
    must(gs_broadcast_async(ctx, name, x.d, N, t, 0, &oo, &h), name);
    must(gs_wait(h, 60000), name);
    gs_handle_free(h);
    check_equal(name, to_host(x.d, N * gs_dtype_size(t)).data(), x.host.data(), t, N, 0);
    checks++;
    snprintf(name, sizeof name, "rs/%s", tname(t));
    must(gs_reducescatter_async(ctx, name, x.d, shape, 2, t, GS_SUM, &oo, &h), name);
    must(gs_wait(h, 60000), name);
    must(gs_handle_result(h, &res, &bytes), name);
    check_equal(name, to_host(res, bytes).data(), x.host.data(), t, N, 0);
    copies += check_result_copy(ctx, h, name, res, bytes, x, s, flag);
    checks++;
    snprintf(name, sizeof name, "a2a/%s", tname(t));
    must(gs_alltoall_async(ctx, name, x.d, shape, 2, t, NULL, &oo, &h), name);
    must(gs_wait(h, 60000), name);
    must(gs_handle_result(h, &res, &bytes), name);
    check_equal(name, to_host(res, bytes).data(), x.host.data(), t, N, 0);
    copies += check_result_copy(ctx, h, name, res, bytes, x, s, flag);
    checks++;
    cudaFree(x.d);
  }
  // fused: 40 float32 tensors of odd sizes, compressed to fp16 on the wire,
  // postscale 0.5: one NCCL allreduce, one pack and one unpack launch
  {
    const int T = 40;
    std::vector<dev_tensor> xs;
    std::vector<const char *> names;
    std::vector<const void *> sends;
    std::vector<void *> recvs;
    std::vector<size_t> counts;
    static char nm[T][32];
    for (int i = 0; i < T; i++) {
      xs.push_back(make_input(GS_FLOAT32, 17 + 31 * i, s, flag, i));
      snprintf(nm[i], sizeof nm[i], "fused/%d", i);
      names.push_back(nm[i]);
      sends.push_back(xs[i].d);
      recvs.push_back(xs[i].d);
      counts.push_back(xs[i].n);
    }
    gs_allreduce_opts o;
    gs_allreduce_opts_init(&o);
    o.stream = s;
    o.postscale = 0.5;
    o.compression = GS_COMPRESS_FP16;
    std::vector<gs_handle *> hs(T);
    gs_stats before;
    gs_stats_init(&before);
    must(gs_get_stats(ctx, &before), "stats");
    must(gs_grouped_allreduce_async(ctx, T, names.data(), sends.data(), recvs.data(),
                                    counts.data(), GS_FLOAT32, GS_SUM, &o, hs.data()),
         "grouped");
    for (int i = 0; i < T; i++) {
      must(gs_wait(hs[i], 60000), names[i]);
      gs_handle_free(hs[i]);
      std::vector<unsigned char> want = xs[i].host;
      for (size_t k = 0; k < xs[i].n; k++) put(want.data(), GS_FLOAT32, k, get(want.data(), GS_FLOAT32, k) * 0.5);
      check_equal(names[i], to_host(xs[i].d, xs[i].n * 4).data(), want.data(), GS_FLOAT32, xs[i].n,
                  1e-3);
      cudaFree(xs[i].d);
    }
    gs_stats after;
    gs_stats_init(&after);
    must(gs_get_stats(ctx, &after), "stats");
    printf("fused: %d tensors in %llu collective(s)\n", T,
           (unsigned long long)(after.collectives - before.collectives));
    checks += T;
  }
  gs_stats st;
  gs_stats_init(&st);
  must(gs_get_stats(ctx, &st), "stats");
  if (st.gpu_collectives == 0 || st.gpu_collectives != st.collectives)
    die("only %llu of %llu collectives ran through NCCL", (unsigned long long)st.gpu_collectives,
        (unsigned long long)st.collectives);
  printf("ops: %d checks passed; %llu collectives, all through NCCL\n", checks,
         (unsigned long long)st.gpu_collectives);
  printf("result copies: %d device results copied with gs_handle_result_copy, freed at once\n",
         copies);
  must(gs_shutdown(ctx), "gs_shutdown");
  printf("OK\n");
  return 0;
}

// ---- abort and timeout --------------------------------------------------------

static int mode_stuck(int by_timeout) {
  gs_ctx *ctx = init_nccl();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *flag;  // host-mapped: the kernel spins on it until we release it
  CK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
  *flag = 0;
  int *dflag;
  CK(cudaHostGetDevicePointer(&dflag, flag, 0));
  float *x;
  CK(cudaMalloc(&x, 4096 * sizeof(float)));
  spin<<<1, 1, 0, s>>>(dflag, cycles_per_ms() * 120000);  // "forever" (2 min cap)
  gs_allreduce_opts o;
  gs_allreduce_opts_init(&o);
  o.stream = s;
  gs_handle *h;
  must(gs_allreduce_async(ctx, "stuck", x, x, 4096, GS_FLOAT32, GS_SUM, &o, &h), "submit");
  double t0 = now_ms();
  printf("QUEUED\n");
  fflush(stdout);
  gs_status st = gs_wait(h, 90000);
  double ms = now_ms() - t0;
  printf("stuck: %s after %.0f ms: %s\n", gs_status_str(st), ms, gs_handle_error(h));
  gs_handle_free(h);
  *flag = 1;  // let the spin kernel end so the process can exit
  if (by_timeout && st != GS_ERR_DATA_PLANE) die("expected GS_ERR_DATA_PLANE");
  if (!by_timeout && st != GS_ERR_COORDINATOR_LOST && st != GS_ERR_ABORTED)
    die("expected GS_ERR_COORDINATOR_LOST or GS_ERR_ABORTED");
  if (st == GS_ERR_TIMEOUT) die("gs_wait itself timed out: the op hung");
  // later ops fail at once
  gs_handle *h2;
  gs_status s2 = gs_allreduce_async(ctx, "after", x, x, 16, GS_FLOAT32, GS_SUM, &o, &h2);
  if (s2 == GS_OK) {
    s2 = gs_wait(h2, 30000);
    gs_handle_free(h2);
  }
  printf("after: %s\n", gs_status_str(s2));
  if (s2 == GS_OK || s2 == GS_ERR_TIMEOUT) die("an op after the failure did not fail");
  double t1 = now_ms();
  gs_shutdown(ctx);
  printf("shutdown in %.0f ms\nOK\n", now_ms() - t1);
  return 0;
}

// ---- benchmarks ------------------------------------------------------------------

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static int mode_pack_bench() {
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  struct cfg {
    const char *what;
    int n;
    size_t bytes;
  } cfgs[] = {{"200 x 16 KiB", 200, 16384}, {"500 x 4 KiB", 500, 4096},
              {"64 x 1 MiB", 64, 1 << 20}};
  for (auto &c : cfgs) {
    std::vector<void *> src(c.n);
    size_t total = (size_t)c.n * ((c.bytes + 255) / 256 * 256);
    void *fused, *ref;
    CK(cudaMalloc(&fused, total));
    CK(cudaMalloc(&ref, total));
    std::vector<gs__cuda_copy_desc> d(c.n);
    std::vector<unsigned char> h(c.bytes);
    size_t at = 0;
    for (int i = 0; i < c.n; i++) {
      CK(cudaMalloc(&src[i], c.bytes));
      for (size_t k = 0; k < c.bytes; k++) h[k] = (unsigned char)(k * 13 + i);
      CK(cudaMemcpy(src[i], h.data(), c.bytes, cudaMemcpyHostToDevice));
      d[i] = {src[i], (char *)fused + at, c.bytes / 4, 1.0, 0, 0};
      at += (c.bytes + 255) / 256 * 256;
    }
    CK(cudaMemset(fused, 0, total));
    CK(cudaMemset(ref, 0, total));
    std::vector<double> tk, tm;
    for (int rep = 0; rep < 21; rep++) {
      CK(cudaEventRecord(a, s));
      for (int i = 0; i < c.n; i += GS__CUDA_PACK_MAX) {
        int m = std::min(c.n - i, GS__CUDA_PACK_MAX);
        CK((cudaError_t)gs__cuda_batched_copy(&d[i], m, s));
      }
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      tk.push_back(ms);
      CK(cudaEventRecord(a, s));
      size_t o = 0;
      for (int i = 0; i < c.n; i++) {
        CK(cudaMemcpyAsync((char *)ref + o, src[i], c.bytes, cudaMemcpyDeviceToDevice, s));
        o += (c.bytes + 255) / 256 * 256;
      }
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      CK(cudaEventElapsedTime(&ms, a, b));
      tm.push_back(ms);
    }
    std::vector<unsigned char> hf(total), hr(total);
    CK(cudaMemcpy(hf.data(), fused, total, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hr.data(), ref, total, cudaMemcpyDeviceToHost));
    if (memcmp(hf.data(), hr.data(), total)) die("pack %s: batched kernel differs from memcpy", c.what);
    double mk = median(tk), mm = median(tm);
    printf("pack %-14s batched kernel %8.1f us  per-tensor memcpy %8.1f us  ratio %.2fx\n",
           c.what, mk * 1000, mm * 1000, mm / mk);
    for (void *p : src) cudaFree(p);
    cudaFree(fused);
    cudaFree(ref);
  }
  // scaled + converted pack against the host reference
  {
    const size_t n = 100003;
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = (float)((i % 1000) * 0.25 - 100);
    float *src;
    uint16_t *dst;
    CK(cudaMalloc(&src, n * 4));
    CK(cudaMalloc(&dst, n * 2));
    CK(cudaMemcpy(src, h.data(), n * 4, cudaMemcpyHostToDevice));
    gs__cuda_copy_desc d = {src, dst, n, 0.5, 0 /*f32*/, 2 /*f16*/};
    CK((cudaError_t)gs__cuda_batched_copy(&d, 1, s));
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> got(n);
    CK(cudaMemcpy(got.data(), dst, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
      uint16_t want = f2h(h2f(f2h(h[i])) * 0.5f);
      if (got[i] != want) die("pack f32->f16 x0.5 element %zu: 0x%04x, want 0x%04x", i, got[i], want);
    }
    printf("pack float32 -> float16 with prescale 0.5: %zu elements match the host reference\n", n);
  }
  printf("OK\n");
  return 0;
}

static int mode_ar_bench() {
  gs_ctx *ctx = init_nccl();
  CK(cudaSetDevice(0));
  ncclComm_t comm;
  int dev = 0;
  if (ncclCommInitAll(&comm, 1, &dev) != ncclSuccess) die("ncclCommInitAll");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t maxb = 256u << 20;
  float *buf;
  CK(cudaMalloc(&buf, maxb));
  CK(cudaMemset(buf, 0, maxb));
  printf("%-10s %12s %12s %8s   (world size 1: bus bandwidth factor 2(n-1)/n is 0; "
         "algorithm bandwidth bytes/time shown)\n",
         "bytes", "gradsync GB/s", "nccl GB/s", "ratio");
  int seq = 0;
  for (size_t bytes = 1024; bytes <= maxb; bytes *= 4) {
    size_t n = bytes / 4;
    int reps = bytes >= (64u << 20) ? 5 : 20;
    std::vector<double> tg, tn;
    for (int r = 0; r < reps + 1; r++) {
      char name[64];
      snprintf(name, sizeof name, "bench/%d", seq++);
      gs_allreduce_opts o;
      gs_allreduce_opts_init(&o);
      o.stream = s;
      CK(cudaStreamSynchronize(s));
      double t0 = now_ms();
      gs_handle *h;
      must(gs_allreduce_async(ctx, name, buf, buf, n, GS_FLOAT32, GS_SUM, &o, &h), name);
      must(gs_wait(h, 60000), name);
      gs_handle_free(h);
      double t1 = now_ms();
      if (ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s) != ncclSuccess)
        die("ncclAllReduce");
      CK(cudaStreamSynchronize(s));
      double t2 = now_ms();
      if (r) {  // the first round warms up
        tg.push_back(t1 - t0);
        tn.push_back(t2 - t1);
      }
    }
    double g = median(tg), nn = median(tn);
    printf("%-10zu %12.2f %12.2f %8.2f\n", bytes, bytes / g / 1e6, bytes / nn / 1e6, g / nn);
  }
  ncclCommDestroy(comm);
  must(gs_shutdown(ctx), "gs_shutdown");
  printf("OK\n");
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *m = argc > 1 ? argv[1] : "";
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev < 1) {
    printf("SKIPPED: no usable CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  if (!strcmp(m, "ops")) return mode_ops();
  if (!strcmp(m, "timeout")) return mode_stuck(1);
  if (!strcmp(m, "abort")) return mode_stuck(0);
  if (!strcmp(m, "pack-bench")) return mode_pack_bench();
  if (!strcmp(m, "ar-bench")) return mode_ar_bench();
  fprintf(stderr, "usage: gs-gpu-worker ops|timeout|abort|pack-bench|ar-bench\n");
  return 2;
}
