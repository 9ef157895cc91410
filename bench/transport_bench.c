/* gs-transport-bench: a host data-plane backend called directly, without
 * the coordinator (the "data plane alone" rows of bench/transport.sh).
 *
 *   gs-transport-bench --transport shm|tcp --np N [--sizes B,B,...] [--reps R]
 *                      [--chunk B] [--one-shot B] [--op sum|average|agree|agree-f32] [--tag T]
 *
 * Forks N ranks on this host. shm: the shared-memory transport of one host
 * (gs__shm_create). tcp: the TCP ring on 127.0.0.1, its rendezvous through
 * files in a private temporary directory. Each rank runs, per size, warm-up
 * calls then R in-place float32 SUM (or AVERAGE) allreduces, each after a
 * barrier (a 4-byte allreduce), timing each; the parent prints, per size,
 * the median over calls of the slowest rank's time as
 *   RESULT impl=gs-<transport>-direct np=N bytes=B median_us=T busbw_gbs=G
 * --op agree times the fast round's agreement (backend agree: a MIN over
 * B bytes) instead, as impl=gs-<transport>-agree; --op agree-f32 its
 * float32 SUM form (B / 4 floats: flags and riding data), as
 * impl=gs-<transport>-agree-f32.
 * --chunk and --one-shot set the shm transport's slot size and one-
 * rendezvous limit (gs__shm_opts; 0 = the library's defaults); --tag T
 * appends "-T" to impl.
 * Not a test: timings are never pass/fail. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "messages.h"
#include "status.h"

#define MAX_REPS 200
#define MAX_SIZES 16

static char g_dir[256];

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A rendezvous store of files: key "a/b" is the file g_dir/a_b. */
static void key_path(const char *key, char *out, size_t len) {
  snprintf(out, len, "%s/", g_dir);
  size_t n = strlen(out);
  for (const char *k = key; *k && n + 1 < len; k++) out[n++] = *k == '/' ? '_' : *k;
  out[n] = 0;
}

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen) {
  (void)ctx;
  char path[512], tmp[600];
  key_path(key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(val, 1, len, f) != len) {
    if (f) fclose(f);
    snprintf(err, errlen, "bench kv: cannot write %s", tmp);
    return GS__ERR_INTERNAL;
  }
  fclose(f);
  return rename(tmp, path) == 0 ? GS__OK : GS__ERR_INTERNAL;
}

static int kv_get(void *ctx, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  (void)ctx;
  char path[512];
  key_path(key, path, sizeof path);
  double end = now_us() + timeout_ms * 1e3;
  while (now_us() < end) {
    FILE *f = fopen(path, "rb");
    if (f) {
      char *b = malloc(4096);
      size_t n = fread(b, 1, 4096, f);
      fclose(f);
      *val = b;
      *len = n;
      return GS__OK;
    }
    usleep(2000);
  }
  snprintf(err, errlen, "bench kv: no key %s", key);
  return GS__ERR_TIMEOUT;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *transport = "shm", *tag = NULL;
  int np = 2, reps = 20, nsizes = 0;
  size_t chunk = 0, one_shot = 0;
  gs__reduce_op op = GS__SUM;
  int agree = 0;
  size_t sizes[MAX_SIZES];
  const char *size_list = "4096,65536,1048576,16777216,67108864";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--transport") && i + 1 < argc)
      transport = argv[++i];
    else if (!strcmp(argv[i], "--np") && i + 1 < argc)
      np = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
      size_list = argv[++i];
    else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
      chunk = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--one-shot") && i + 1 < argc)
      one_shot = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--tag") && i + 1 < argc)
      tag = argv[++i];
    else if (!strcmp(argv[i], "--op") && i + 1 < argc && !strcmp(argv[i + 1], "agree"))
      agree = 1, i++;
    else if (!strcmp(argv[i], "--op") && i + 1 < argc && !strcmp(argv[i + 1], "agree-f32"))
      agree = 2, i++;
    else if (!strcmp(argv[i], "--op") && i + 1 < argc)
      op = !strcmp(argv[++i], "average") ? GS__AVERAGE : GS__SUM;
    else {
      fprintf(
          stderr,
          "usage: gs-transport-bench --transport shm|tcp --np N [--sizes B,B,...] "
          "[--reps R] [--chunk B] [--one-shot B] [--op sum|average|agree|agree-f32] [--tag T]\n");
      return 2;
    }
  }
  for (const char *p = size_list; *p && nsizes < MAX_SIZES;) {
    sizes[nsizes++] = strtoull(p, NULL, 10);
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  int tcp = !strcmp(transport, "tcp");
  if ((!tcp && strcmp(transport, "shm")) || np < 2 || np > 64 || reps < 1 || reps > MAX_REPS) {
    fprintf(stderr, "gs-transport-bench: bad --transport, --np (2..64) or --reps (1..%d)\n",
            MAX_REPS);
    return 2;
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/gs-transport-bench-XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  /* times[size][rep][rank] in microseconds, shared with the children */
  size_t nt = (size_t)nsizes * MAX_REPS * (size_t)np;
  double *times =
      mmap(NULL, nt * sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (times == MAP_FAILED) return 1;
  char seg[128];
  snprintf(seg, sizeof seg, "/gradsync-bench-%d", (int)getpid());
  uint8_t key[GS__SECRET_BYTES] = {1, 2, 3};
  pid_t pids[64];
  for (int r = 0; r < np; r++) {
    if ((pids[r] = fork()) != 0) continue;
    char err[2048];
    gs__backend *b = NULL;
    int rc;
    if (tcp) {
      gs__tcp_ring_opts o = {.rank = r,
                             .size = np,
                             .coordinator = "127.0.0.1:9",
                             .key_prefix = "bench/",
                             .connect_timeout_ms = 30000,
                             .io_timeout_ms = 60000,
                             .kv = {NULL, kv_set, kv_get},
                             .ring_key = key};
      rc = gs__backend_create(GS__BACKEND_TCP, &o, &b, err, sizeof err);
    } else {
      int local[64];
      for (int q = 0; q < np; q++) local[q] = q;
      gs__shm_opts o = {.rank = r,
                        .size = np,
                        .local_ranks = local,
                        .nlocal = np,
                        .host_index = 0,
                        .nhosts = 1,
                        .segment = seg,
                        .chunk_bytes = chunk,
                        .one_shot_bytes = one_shot,
                        .connect_timeout_ms = 30000,
                        .io_timeout_ms = 60000};
      rc = gs__backend_create(GS__BACKEND_SHM, &o, &b, err, sizeof err);
    }
    if (rc) {
      fprintf(stderr, "rank %d: %s\n", r, err);
      _exit(1);
    }
    size_t maxb = 0;
    for (int k = 0; k < nsizes; k++)
      if (sizes[k] > maxb) maxb = sizes[k];
    float *buf = malloc(maxb ? maxb : 4), bar = 0;
    for (size_t i = 0; i < maxb / 4; i++) buf[i] = (float)(i % 7);
    for (int k = 0; k < nsizes; k++) {
      size_t n = sizes[k] / 4;
      for (int it = -3; it < reps; it++) {
        double t0 = 0;
        if (b->v->allreduce(b, &bar, 1, GS__FLOAT32, GS__SUM, err, sizeof err) ||
            (t0 = now_us(), agree
                                ? b->v->agree(b, buf, sizes[k], GS__UINT8, GS__MIN, err, sizeof err)
                                : b->v->allreduce(b, buf, n, GS__FLOAT32, op, err, sizeof err))) {
          fprintf(stderr, "rank %d: %s\n", r, err);
          _exit(1);
        }
        double t = now_us() - t0;
        if (it >= 0) times[((size_t)k * MAX_REPS + (size_t)it) * (size_t)np + (size_t)r] = t;
        /* keep values bounded: the sum grows by np each call */
        if (it % 8 == 7)
          for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
      }
    }
    gs__backend_destroy(b);
    free(buf);
    _exit(0);
  }
  int failed = 0;
  for (int r = 0; r < np; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) failed = 1;
  }
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "gs-transport-bench: could not remove %s\n", g_dir);
  if (failed) return 1;
  for (int k = 0; k < nsizes; k++) {
    double med[MAX_REPS];
    for (int it = 0; it < reps; it++) {
      double m = 0;
      for (int r = 0; r < np; r++) {
        double t = times[((size_t)k * MAX_REPS + (size_t)it) * (size_t)np + (size_t)r];
        if (t > m) m = t;
      }
      med[it] = m;
    }
    qsort(med, (size_t)reps, sizeof med[0], cmp_double);
    double m = reps % 2 ? med[reps / 2] : (med[reps / 2 - 1] + med[reps / 2]) / 2;
    printf("RESULT impl=gs-%s-%s%s%s np=%d bytes=%zu median_us=%.1f busbw_gbs=%.2f\n", transport,
           agree == 2 ? "agree-f32"
           : agree    ? "agree"
                      : "direct",
           tag ? "-" : "", tag ? tag : "", np, sizes[k], m,
           m > 0 ? 2.0 * (np - 1) / np * (double)sizes[k] / m / 1e3 : 0);
  }
  return 0;
}
