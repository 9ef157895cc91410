/* gradsync-dataplane: allreduce latency and bus bandwidth of gradsync, for
 * bench/run.sh --dataplane, next to OpenMPI (bench/mpi_allreduce.c).
 *
 *   gradsync-run -np N gradsync-dataplane [--mode e2e|direct] [--op sum|average]
 *       [--sizes "4096 65536 ..."] [--iters I] [--kv-dir DIR]
 *
 * float32, in place. Per size: 3 warm-up calls, then I timed calls, each
 * started after a barrier; a call's time is the slowest rank's, and rank 0
 * prints the median over the calls:
 *   RESULT impl=gradsync mode=e2e np=N op=sum det=0 bytes=B us=MEDIAN busbw_gbs=... cpu_us=...
 * (cpu_us: the median CPU time rank 0's process spent per call, all its
 * threads: the work, which a machine shared with other jobs hides in the
 * wall time)
 *
 * e2e: through the coordinator, as an application calls it
 *   (gs_allreduce_async + gs_wait; the barrier is gs_barrier).
 * direct: the data plane alone: the CPU backend (the TCP ring) created
 *   directly, with a rendezvous store of files in --kv-dir (one directory per
 *   run, shared by the ranks) and a fixed ring key -- a benchmark on
 *   loopback, not a deployment. GRADSYNC_DETERMINISTIC is honoured in both
 *   modes. Rank and size come from GRADSYNC_RANK / GRADSYNC_SIZE. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "gradsync.h"
#include "status.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this process (all its threads): on a machine shared with
 * other jobs it shows the work a call costs, which wall time cannot. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- a rendezvous store of files (direct mode) ---------------------------- */

static const char *g_kv_dir;

static void kv_path(char *out, size_t len, const char *key) {
  int n = snprintf(out, len, "%s/", g_kv_dir);
  for (const char *k = key; *k && (size_t)n + 1 < len; k++) out[n++] = *k == '/' ? '_' : *k;
  out[n] = 0;
}

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen) {
  (void)ctx;
  char path[1024], tmp[1100];
  kv_path(path, sizeof path, key);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(val, 1, len, f) != len || fclose(f) != 0 || rename(tmp, path) != 0) {
    snprintf(err, errlen, "kv file %s: %s", path, strerror(errno));
    return GS__ERR_INTERNAL;
  }
  return GS__OK;
}

static int kv_get(void *ctx, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  (void)ctx;
  char path[1024];
  kv_path(path, sizeof path, key);
  double until = now_s() + timeout_ms / 1000.0;
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      char *buf = malloc(4096);
      size_t k = fread(buf, 1, 4096, f);
      fclose(f);
      *val = buf, *len = k;
      return GS__OK;
    }
    if (now_s() > until) {
      snprintf(err, errlen, "kv key %s did not appear", key);
      return GS__ERR_TIMEOUT;
    }
    usleep(2000);
  }
}

int main(int argc, char **argv) {
  const char *mode = "e2e", *opname = "sum", *sizes = "4096 65536 1048576 16777216 67108864";
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--mode"))
      mode = argv[i + 1];
    else if (!strcmp(argv[i], "--op"))
      opname = argv[i + 1];
    else if (!strcmp(argv[i], "--sizes"))
      sizes = argv[i + 1];
    else if (!strcmp(argv[i], "--iters"))
      iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--kv-dir"))
      g_kv_dir = argv[i + 1];
    else {
      fprintf(stderr, "gradsync-dataplane: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  int direct = !strcmp(mode, "direct"), average = !strcmp(opname, "average");
  const char *det_env = getenv("GRADSYNC_DETERMINISTIC");
  int det = det_env && (!strcmp(det_env, "1") || !strcmp(det_env, "true"));
  int me = atoi(getenv("GRADSYNC_RANK") ? getenv("GRADSYNC_RANK") : "0");
  int n = atoi(getenv("GRADSYNC_SIZE") ? getenv("GRADSYNC_SIZE") : "1");
  gs_ctx *ctx = NULL;
  gs__backend *b = NULL;
  char err[2048];
  if (direct) {
    if (!g_kv_dir) {
      fprintf(stderr, "gradsync-dataplane: --mode direct needs --kv-dir\n");
      return 2;
    }
    static const uint8_t key[32] = "gradsync-dataplane benchmark key";
    gs__tcp_ring_opts o = {.rank = me,
                           .size = n,
                           .coordinator = NULL,
                           .key_prefix = "",
                           .connect_timeout_ms = 60000,
                           .io_timeout_ms = 60000,
                           .kv = {NULL, kv_set, kv_get},
                           .ring_key = key,
                           .deterministic = det};
    if (gs__backend_create(GS__BACKEND_TCP, &o, &b, err, sizeof err) != GS__OK) {
      fprintf(stderr, "rank %d: %s\n", me, err);
      return 1;
    }
  } else if (gs_init(NULL, &ctx) != GS_OK) {
    fprintf(stderr, "gs_init: %s\n", gs_last_error(NULL));
    return 1;
  }
  char *list = strdup(sizes), *save = NULL;
  int status = 0;
  for (char *tok = strtok_r(list, " ,", &save); tok && !status; tok = strtok_r(NULL, " ,", &save)) {
    size_t bytes = strtoull(tok, NULL, 10), count = bytes / sizeof(float);
    float *buf = malloc(count ? bytes : 4);
    double *t = malloc((size_t)iters * sizeof *t), *cpu = malloc((size_t)iters * sizeof *cpu);
    for (size_t i = 0; i < count; i++) buf[i] = (float)(i % 7) + (float)me;
    for (int k = 0; k < 3 + iters && !status; k++) {
      double dt = 0, worst = 0, c0 = 0;
      if (direct) {
        float one = 1;
        if (b->v->allreduce(b, &one, 1, GS__FLOAT32, GS__SUM, err, sizeof err)) status = 1;
        c0 = cpu_s();
        double t0 = now_s();
        if (!status && b->v->allreduce(b, buf, count, GS__FLOAT32, average ? GS__AVERAGE : GS__SUM,
                                       err, sizeof err))
          status = 1;
        dt = now_s() - t0;
        c0 = cpu_s() - c0;
        worst = dt;
        if (!status && b->v->allreduce(b, &worst, 1, GS__FLOAT64, GS__MAX, err, sizeof err))
          status = 1;
      } else {
        gs_handle *h = NULL;
        if (gs_barrier(ctx) != GS_OK) status = 1;
        c0 = cpu_s();
        double t0 = now_s();
        if (!status && (gs_allreduce_async(ctx, "dataplane", buf, buf, count, GS_FLOAT32,
                                           average ? GS_AVERAGE : GS_SUM, NULL, &h) != GS_OK ||
                        gs_wait(h, 300000) != GS_OK))
          status = 1;
        dt = now_s() - t0;
        c0 = cpu_s() - c0;
        gs_handle_free(h);
        worst = dt;
        if (!status && (gs_allreduce_async(ctx, "dataplane/time", &worst, &worst, 1, GS_FLOAT64,
                                           GS_MAX, NULL, &h) != GS_OK ||
                        gs_wait(h, 300000) != GS_OK))
          status = 1;
        gs_handle_free(h);
        if (status) snprintf(err, sizeof err, "%s", gs_last_error(ctx));
      }
      if (k >= 3) t[k - 3] = worst, cpu[k - 3] = c0;
    }
    if (!status) {
      qsort(t, (size_t)iters, sizeof *t, cmp);
      double med = t[iters / 2] * 1e6;
      qsort(cpu, (size_t)iters, sizeof *cpu, cmp);
      if (me == 0)
        printf("RESULT impl=gradsync mode=%s np=%d op=%s det=%d bytes=%zu us=%.1f "
               "busbw_gbs=%.2f cpu_us=%.1f\n",
               mode, n, opname, det, bytes, med,
               (double)bytes * 2.0 * (n - 1) / n / (med * 1e-6) / 1e9, cpu[iters / 2] * 1e6);
      fflush(stdout);
    }
    free(buf);
    free(t);
    free(cpu);
  }
  free(list);
  if (status) fprintf(stderr, "rank %d: %s\n", me, err);
  gs__backend_destroy(b);
  gs_shutdown(ctx);
  return status;
}
