/* gs-backend-worker: a rank of the backend-selection and ABI tests.
 *
 *   gs-backend-worker init [BACKEND]   gs_init (gs_options.backend = BACKEND
 *                                      when given, else the environment),
 *                                      then one allreduce checked against
 *                                      its reference; prints "stats: ..."
 *   gs-backend-worker abi              public structs with struct_size 0, too
 *                                      large, and from an "older caller"
 *
 * A failed gs_init prints "init: <STATUS>: <message>" and exits 3; other
 * failures print "rank R: FAIL: ..." and exit 1; success prints "OK". */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradsync.h"
#include "worker_util.h"

static gs_ctx *init_or_exit(const gs_options *o) {
  gs_ctx *ctx = NULL;
  gs_status s = gs_init(o, &ctx);
  if (s != GS_OK) {
    printf("init: %s: %s\n", wu_status_name(s), gs_last_error(NULL));
    fflush(stdout);
    exit(3);
  }
  g_rank = gs_rank(ctx);
  g_size = gs_size(ctx);
  return ctx;
}

/* sum over ranks of (r + 1) * (k + 1), k < 5: exact in float32 */
static void allreduce_check(gs_ctx *ctx, const char *name, const gs_allreduce_opts *o,
                            double factor) {
  float x[5];
  for (int k = 0; k < 5; k++) x[k] = (float)((g_rank + 1) * (k + 1));
  gs_handle *h;
  wu_must(gs_allreduce_async(ctx, name, x, x, 5, GS_FLOAT32, GS_SUM, o, &h), "allreduce", name);
  wu_must(gs_wait(h, 60000), "wait", name);
  gs_handle_free(h);
  double ranks = (double)g_size * (g_size + 1) / 2;
  for (int k = 0; k < 5; k++)
    if (x[k] != (float)(ranks * (k + 1) * factor))
      wu_die("tensor '%s' element %d is %g, expected %g", name, k, x[k], ranks * (k + 1) * factor);
}

static void expect_invalid(gs_status s, const char *what, const char *needle) {
  if (s != GS_ERR_INVALID_ARG || !strstr(gs_last_error(NULL), needle))
    wu_die("%s: expected GS_ERR_INVALID_ARG mentioning '%s', got %s: %s", what, needle,
           wu_status_name(s), gs_last_error(NULL));
  printf("refused %s: %s\n", what, gs_last_error(NULL));
}

static int mode_abi(void) {
  gs_ctx *ctx = NULL;
  /* gs_options not initialised (struct_size 0) and from a newer header */
  gs_options bad;
  memset(&bad, 0, sizeof bad);
  expect_invalid(gs_init(&bad, &ctx), "gs_options.struct_size=0", "gs_options_init");
  gs_options_init(&bad);
  bad.struct_size = sizeof bad + 8;
  expect_invalid(gs_init(&bad, &ctx), "gs_options.struct_size too large", "newer");
  /* An older caller: its gs_options ends before backend and cuda_device,
   * so those keep their defaults (the environment). The bytes after its
   * struct_size are garbage the library must not read. */
  struct {
    gs_options o;
    char tail[64];
  } old;
  memset(&old, 0x5a, sizeof old);
  gs_options_init(&old.o);
  old.o.struct_size = offsetof(gs_options, backend);
  memset((char *)&old.o + offsetof(gs_options, backend), 0x5a,
         sizeof old.o - offsetof(gs_options, backend));
  ctx = init_or_exit(&old.o);

  gs_allreduce_opts o;
  memset(&o, 0, sizeof o);
  gs_handle *h = NULL;
  float x[5] = {0};
  expect_invalid(gs_allreduce_async(ctx, "abi/zero", x, x, 5, GS_FLOAT32, GS_SUM, &o, &h),
                 "gs_allreduce_opts.struct_size=0", "gs_allreduce_opts_init");
  /* an older gs_allreduce_opts without stream: garbage beyond its size */
  gs_allreduce_opts_init(&o);
  o.prescale = 2.0;
  o.struct_size = offsetof(gs_allreduce_opts, stream);
  memset((char *)&o + offsetof(gs_allreduce_opts, stream), 0x5a, sizeof(void *));
  allreduce_check(ctx, "abi/old-opts", &o, 2.0);
  gs_allreduce_opts_init(&o);
  o.postscale = 0.5;
  allreduce_check(ctx, "abi/new-opts", &o, 0.5);
  allreduce_check(ctx, "abi/null-opts", NULL, 1.0);

  gs_op_opts oo;
  memset(&oo, 0, sizeof oo);
  expect_invalid(gs_broadcast_async(ctx, "abi/bcast", x, 5, GS_FLOAT32, 0, &oo, &h),
                 "gs_op_opts.struct_size=0", "gs_op_opts_init");
  gs_op_opts_init(&oo);
  float b[3] = {(float)g_rank, 7, 8};
  wu_must(gs_broadcast_async(ctx, "abi/bcast", b, 3, GS_FLOAT32, 0, &oo, &h), "broadcast",
          "abi/bcast");
  wu_must(gs_wait(h, 60000), "wait", "abi/bcast");
  gs_handle_free(h);
  if (b[0] != 0 || b[1] != 7 || b[2] != 8) wu_die("abi/bcast: got %g %g %g", b[0], b[1], b[2]);

  gs_sparse_opts so;
  memset(&so, 0, sizeof so);
  int64_t idx[1] = {0};
  expect_invalid(
      gs_sparse_allreduce_async(ctx, "abi/sparse", idx, x, 1, 1, GS_FLOAT32, GS_SUM, &so, &h),
      "gs_sparse_opts.struct_size=0", "gs_sparse_opts_init");

  /* gs_stats: an older caller's shorter struct is filled up to its size */
  struct {
    gs_stats s;
    unsigned char canary[16];
  } st;
  memset(&st, 0xcc, sizeof st);
  st.s.struct_size = 0;
  expect_invalid(gs_get_stats(ctx, &st.s), "gs_stats.struct_size=0", "gs_stats_init");
  gs_stats_init(&st.s);
  st.s.struct_size = offsetof(gs_stats, gpu_collectives);
  memset((char *)&st.s + offsetof(gs_stats, gpu_collectives), 0xcc, sizeof(uint64_t));
  wu_must(gs_get_stats(ctx, &st.s), "gs_get_stats", "-");
  const unsigned char *tail = (const unsigned char *)&st.s + offsetof(gs_stats, gpu_collectives);
  for (size_t i = 0; i < sizeof(uint64_t); i++)
    if (tail[i] != 0xcc) wu_die("gs_get_stats wrote beyond the caller's struct_size");
  if (st.s.collectives < 4)
    wu_die("stats: %llu collectives, expected >= 4", (unsigned long long)st.s.collectives);
  printf("stats: collectives=%llu (older gs_stats filled up to its size)\n",
         (unsigned long long)st.s.collectives);
  wu_must(gs_shutdown(ctx), "gs_shutdown", "-");
  printf("OK\n");
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: gs-backend-worker init [BACKEND] | abi\n");
    return 2;
  }
  g_mode = argv[1];
  if (!strcmp(argv[1], "abi")) return mode_abi();
  gs_options o;
  gs_options_init(&o);
  if (argc > 2) o.backend = argv[2];
  gs_ctx *ctx = init_or_exit(&o);
  allreduce_check(ctx, "backend/sum", NULL, 1.0);
  gs_stats st;
  gs_stats_init(&st);
  wu_must(gs_get_stats(ctx, &st), "gs_get_stats", "-");
  printf("stats: collectives=%llu gpu_collectives=%llu\n", (unsigned long long)st.collectives,
         (unsigned long long)st.gpu_collectives);
  wu_must(gs_shutdown(ctx), "gs_shutdown", "-");
  printf("OK\n");
  return 0;
}
