/* mpi-negotiation: a Horovod-style control plane over MPI, the peer that
 * gradsync's control-only step is compared with (bench/run.sh).
 *
 *   mpirun -np 2 mpi-negotiation --workload FILE [--steps N] [--warmup W]
 *       [--cache 0|1] [--fusion-threshold BYTES] [--execute] [--scale F] [--tag TEXT]
 *   mpirun -np 2 mpi-negotiation --allreduce-bytes B [--steps N] [--warmup W]
 *
 * What Horovod's controller does each cycle (horovod/common/controller.cc),
 * rebuilt in plain C over MPI so that it runs here without Horovod:
 * - every rank queues its tensor requests (name, dtype, shape);
 * - cache on: one MPI_Allreduce(BAND) over a bit vector of the response
 *   cache (one bit per cached tensor, plus an inverted "someone has uncached
 *   requests" bit), after which every rank builds the same responses from
 *   the bits it holds alone;
 * - uncached requests: the ranks gather their serialized requests to rank 0
 *   (MPI_Gather of sizes, MPI_Gatherv of bytes); rank 0 counts them, and
 *   the tensors every rank submitted become responses, fused greedily up to
 *   the threshold (same dtype), serialized and sent to all with MPI_Bcast;
 *   they get cache bits in response order, identically on every rank.
 * --execute also runs each fused response as one MPI_Allreduce of its
 * packed bytes (with --scale 1e9: the data plane of 4-byte tensors).
 *
 * One step: MPI_Barrier (not timed), then the step's clock starts, every
 * tensor of the list is queued (reverse list order, as backward produces
 * them; each through a mutex-guarded queue as Horovod's enqueue), and cycles
 * run back to back until every tensor has a response (and ran, with
 * --execute). This is Horovod at its best: one background loop with no
 * cycle-time sleep. The worst rank of each step counts (MPI_Allreduce MAX
 * after the run); rank 0 prints "RESULT key=value ..." with the median and
 * p99 step time in ms, like gradsync-bench.
 *
 * --allreduce-bytes B times one MPI_Allreduce (MPI_SUM over floats) of B
 * bytes per step instead: the data plane's floor for a lone op. */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NAME_LEN 256
#define MAX_DIMS 8

typedef struct tensor {
  char name[NAME_LEN];
  int dtype_size;
  int ndim;
  int64_t dims[MAX_DIMS];
  uint64_t bytes;
  int cache_bit; /* -1 = not cached yet */
  int queued, done;
} tensor;

typedef struct job {
  tensor *t;
  int n;
  int rank, size;
  int cache;
  uint64_t threshold;
  int execute;
  /* the request queue (Horovod's TensorQueue: a mutex and a list) */
  pthread_mutex_t mu;
  int *queue, *taken; /* taken: the queue as one cycle took it */
  int nqueue;
  /* cache bit -> tensor index */
  int *bit_tensor;
  int nbits;
  /* name lookup: open addressing over tensor indices */
  int *slots;
  int nslots;
  char *scratch; /* packed bytes for --execute */
} job;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int find(const job *j, const char *name) {
  for (uint64_t i = hash_name(name) % (uint64_t)j->nslots;; i = (i + 1) % (uint64_t)j->nslots) {
    int k = j->slots[i];
    if (k < 0) return -1;
    if (!strcmp(j->t[k].name, name)) return k;
  }
}

static int dtype_size(const char *s) {
  if (!strcmp(s, "float32") || !strcmp(s, "int32")) return 4;
  if (!strcmp(s, "float64") || !strcmp(s, "int64")) return 8;
  if (!strcmp(s, "float16") || !strcmp(s, "bfloat16")) return 2;
  if (!strcmp(s, "int8") || !strcmp(s, "uint8")) return 1;
  return 0;
}

/* Reads the tensor list; with scale > 1 every tensor holds elems / scale
 * elements (at least one), as gradsync-bench --scale. */
static int read_workload(const char *path, double scale, job *j) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "mpi-negotiation: cannot open workload '%s': %s\n", path, strerror(errno));
    return -1;
  }
  char line[4096];
  int cap = 0;
  while (fgets(line, sizeof line, f)) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char name[NAME_LEN], dt[32], shape[1024];
    int got = sscanf(line, "%255s %31s %1023s", name, dt, shape);
    if (got <= 0) continue;
    int ds = got == 3 ? dtype_size(dt) : 0;
    if (!ds) {
      fprintf(stderr, "mpi-negotiation: %s: bad line '%s'\n", path, line);
      fclose(f);
      return -1;
    }
    if (j->n == cap) {
      cap = cap ? 2 * cap : 256;
      j->t = realloc(j->t, (size_t)cap * sizeof *j->t);
      if (!j->t) abort();
    }
    tensor *x = &j->t[j->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype_size = ds;
    x->cache_bit = -1;
    uint64_t elems = 1;
    for (char *p = shape; *p && x->ndim < MAX_DIMS;) {
      char *end;
      long long d = strtoll(p, &end, 10);
      x->dims[x->ndim++] = d;
      elems *= (uint64_t)d;
      p = *end ? end + 1 : end;
    }
    uint64_t count = (uint64_t)((double)elems / scale);
    x->bytes = (count ? count : 1) * (uint64_t)ds;
  }
  fclose(f);
  if (!j->n) {
    fprintf(stderr, "mpi-negotiation: workload '%s' lists no tensors\n", path);
    return -1;
  }
  return 0;
}

/* ---- serialization (requests and responses) ------------------------------- */

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

static void put(buf *b, const void *data, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2 + 256;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

static void put_request(buf *b, const tensor *x) {
  uint16_t nl = (uint16_t)strlen(x->name);
  put(b, &nl, sizeof nl);
  put(b, x->name, nl);
  int32_t meta[2] = {x->dtype_size, x->ndim};
  put(b, meta, sizeof meta);
  put(b, x->dims, (size_t)x->ndim * sizeof(int64_t));
}

/* Reads one request at *at; returns the name (into name) or -1 on garbage. */
static int get_request(const char *p, size_t len, size_t *at, char *name) {
  uint16_t nl;
  if (*at + sizeof nl > len) return -1;
  memcpy(&nl, p + *at, sizeof nl);
  *at += sizeof nl;
  if (nl >= NAME_LEN || *at + nl + 2 * sizeof(int32_t) > len) return -1;
  memcpy(name, p + *at, nl);
  name[nl] = 0;
  *at += nl;
  int32_t meta[2];
  memcpy(meta, p + *at, sizeof meta);
  *at += sizeof meta + (size_t)meta[1] * sizeof(int64_t);
  return *at <= len ? 0 : -1;
}

/* ---- one step ------------------------------------------------------------- */

/* Marks response group [k0, k1) of tensor indices done (running it as one
 * allreduce with --execute). */
static void run_group(job *j, const int *idx, int n) {
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    tensor *x = &j->t[idx[i]];
    bytes += x->bytes;
    x->done = 1;
  }
  if (j->execute && bytes)
    MPI_Allreduce(MPI_IN_PLACE, j->scratch, (int)(bytes / 4 ? bytes / 4 : 1), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
}

/* Fuses the ready tensors idx[0..n) greedily (same dtype, up to the
 * threshold) and runs every group. */
static void fuse_and_run(job *j, const int *idx, int n) {
  int start = 0;
  uint64_t acc = 0;
  for (int i = 0; i <= n; i++) {
    int cut = i == n;
    if (!cut && i > start) {
      const tensor *x = &j->t[idx[i]], *first = &j->t[idx[start]];
      cut = x->dtype_size != first->dtype_size || acc + x->bytes > j->threshold;
    }
    if (cut && i > start) {
      run_group(j, idx + start, i - start);
      start = i;
      acc = 0;
    }
    if (i < n) acc += j->t[idx[i]].bytes;
  }
}

/* Puts the first nq entries of the cycle's queue that got no response back
 * in front of what was queued meanwhile (Horovod retries them next cycle;
 * rank 0 counts again from the resent requests). */
static void requeue(job *j, int nq) {
  int keep = 0;
  for (int i = 0; i < nq; i++)
    if (!j->t[j->taken[i]].done) j->taken[keep++] = j->taken[i];
  if (!keep) return;
  pthread_mutex_lock(&j->mu);
  memmove(j->queue + keep, j->queue, (size_t)j->nqueue * sizeof *j->queue);
  memcpy(j->queue, j->taken, (size_t)keep * sizeof *j->queue);
  j->nqueue += keep;
  pthread_mutex_unlock(&j->mu);
}

/* One cycle of the controller. Returns the number of tensors that got a
 * response this cycle. */
static int cycle(job *j, int *ready, uint64_t *bits, int nwords, buf *req, buf *resp) {
  pthread_mutex_lock(&j->mu);
  int nq = j->nqueue;
  memcpy(j->taken, j->queue, (size_t)nq * sizeof *j->queue);
  j->nqueue = 0;
  pthread_mutex_unlock(&j->mu);
  int nready = 0, uncached = 0;
  req->len = 0;
  /* 1. The cache: one allreduce over the bits (+ the inverted "uncached"
   * flag in the last word's top bit: BAND of inverted flags = NOR). */
  if (j->cache) {
    memset(bits, 0, (size_t)nwords * sizeof *bits);
    for (int i = 0; i < nq; i++) {
      const tensor *x = &j->t[j->taken[i]];
      if (x->cache_bit >= 0)
        bits[x->cache_bit / 64] |= 1ull << (x->cache_bit % 64);
      else
        uncached = 1;
    }
    if (!uncached) bits[nwords - 1] |= 1ull << 63;
    MPI_Allreduce(MPI_IN_PLACE, bits, nwords, MPI_UINT64_T, MPI_BAND, MPI_COMM_WORLD);
    uncached = !(bits[nwords - 1] >> 63 & 1);
    for (int b = 0; b < j->nbits; b++)
      if (bits[b / 64] >> (b % 64) & 1) ready[nready++] = j->bit_tensor[b];
    fuse_and_run(j, ready, nready);
    for (int i = 0; i < nq; i++)
      if (j->t[j->taken[i]].cache_bit < 0) put_request(req, &j->t[j->taken[i]]);
  } else {
    uncached = 1;
    for (int i = 0; i < nq; i++) put_request(req, &j->t[j->taken[i]]);
  }
  if (!uncached) {
    requeue(j, nq);
    return nready;
  }
  /* 2. Gather the uncached requests at rank 0, which answers everyone. */
  int mylen = (int)req->len;
  int *lens = NULL, *offs = NULL;
  char *all = NULL;
  if (j->rank == 0) {
    lens = malloc((size_t)j->size * sizeof *lens);
    offs = malloc((size_t)j->size * sizeof *offs);
  }
  MPI_Gather(&mylen, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  if (j->rank == 0) {
    for (int r = 0; r < j->size; r++) {
      offs[r] = total;
      total += lens[r];
    }
    all = malloc(total ? (size_t)total : 1);
  }
  MPI_Gatherv(req->p, mylen, MPI_CHAR, all, lens, offs, MPI_CHAR, 0, MPI_COMM_WORLD);
  resp->len = 0;
  if (j->rank == 0) {
    /* Count submissions per tensor (rank 0's message table); a tensor
     * every rank sent becomes a response, in the order rank 0 saw it. */
    static int *count;
    static int ncount;
    if (ncount < j->n) {
      count = realloc(count, (size_t)j->n * sizeof *count);
      ncount = j->n;
    }
    memset(count, 0, (size_t)j->n * sizeof *count);
    int nresp = 0;
    for (int r = 0; r < j->size; r++) {
      size_t at = (size_t)offs[r], end = at + (size_t)lens[r];
      char name[NAME_LEN];
      while (at < end) {
        size_t rel = at - (size_t)offs[r];
        if (get_request(all + offs[r], (size_t)lens[r], &rel, name)) break;
        at = (size_t)offs[r] + rel;
        int k = find(j, name);
        if (k >= 0 && ++count[k] == j->size) ready[nresp++] = k;
      }
    }
    int32_t nr = nresp;
    put(resp, &nr, sizeof nr);
    for (int i = 0; i < nresp; i++) {
      uint16_t nl = (uint16_t)strlen(j->t[ready[i]].name);
      put(resp, &nl, sizeof nl);
      put(resp, j->t[ready[i]].name, nl);
    }
    free(lens);
    free(offs);
    free(all);
  }
  int rlen = (int)resp->len;
  MPI_Bcast(&rlen, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (j->rank != 0) {
    resp->len = 0;
    if ((size_t)rlen > resp->cap) {
      resp->cap = (size_t)rlen;
      resp->p = realloc(resp->p, resp->cap);
    }
  }
  MPI_Bcast(resp->p, rlen, MPI_CHAR, 0, MPI_COMM_WORLD);
  /* 3. Every rank parses the same responses, caches them in order, runs
   * them. */
  int32_t nr;
  memcpy(&nr, resp->p, sizeof nr);
  size_t at = sizeof nr;
  int got = 0;
  for (int i = 0; i < nr; i++) {
    uint16_t nl;
    memcpy(&nl, resp->p + at, sizeof nl);
    at += sizeof nl;
    char name[NAME_LEN];
    memcpy(name, resp->p + at, nl);
    name[nl] = 0;
    at += nl;
    int k = find(j, name);
    if (k < 0) continue;
    ready[got++] = k;
    if (j->cache && j->t[k].cache_bit < 0) {
      j->t[k].cache_bit = j->nbits;
      j->bit_tensor[j->nbits++] = k;
    }
  }
  fuse_and_run(j, ready, got);
  requeue(j, nq);
  return nready + got;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int i = (int)(q * (n - 1) + 0.5);
  return v[i];
}

static void usage(void) {
  fprintf(stderr, "usage: mpi-negotiation --workload FILE [--steps N] [--warmup W] [--cache 0|1]\n"
                  "           [--fusion-threshold BYTES] [--execute] [--scale F] [--tag TEXT]\n"
                  "       mpi-negotiation --allreduce-bytes B [--steps N] [--warmup W]\n");
}

int main(int argc, char **argv) {
  const char *workload = NULL, *tag = "";
  long steps = 200, warmup = 10, ar_bytes = -1;
  double scale = 1;
  job j;
  memset(&j, 0, sizeof j);
  j.cache = 1;
  j.threshold = 64ull << 20;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--execute")) {
      j.execute = 1;
      continue;
    }
    if (!v) {
      usage();
      return 2;
    }
    if (!strcmp(a, "--workload"))
      workload = v;
    else if (!strcmp(a, "--steps"))
      steps = atol(v);
    else if (!strcmp(a, "--warmup"))
      warmup = atol(v);
    else if (!strcmp(a, "--cache"))
      j.cache = atoi(v);
    else if (!strcmp(a, "--fusion-threshold"))
      j.threshold = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--allreduce-bytes"))
      ar_bytes = atol(v);
    else if (!strcmp(a, "--scale"))
      scale = atof(v);
    else if (!strcmp(a, "--tag"))
      tag = v;
    else {
      usage();
      return 2;
    }
    i++;
  }
  if ((!workload && ar_bytes < 0) || steps < 1 || warmup < 0 || !(scale >= 1)) {
    usage();
    return 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.size);
  double *t = calloc((size_t)steps, sizeof *t);
  if (ar_bytes >= 0) {
    int count = (int)(ar_bytes / 4 ? ar_bytes / 4 : 1);
    float *x = calloc((size_t)count, sizeof *x);
    for (long s = -warmup; s < steps; s++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_ms();
      MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (s >= 0) t[s] = now_ms() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, t, (int)steps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (j.rank == 0)
      printf("RESULT case=mpi.allreduce np=%d bytes=%ld steps=%ld step_ms=%.4f step_p99=%.4f "
             "tag=%s\n",
             j.size, ar_bytes, steps, quantile(t, (int)steps, 0.5), quantile(t, (int)steps, 0.99),
             tag);
    free(x);
    free(t);
    MPI_Finalize();
    return 0;
  }
  if (read_workload(workload, scale, &j)) MPI_Abort(MPI_COMM_WORLD, 1);
  j.nslots = 4 * j.n;
  j.slots = malloc((size_t)j.nslots * sizeof *j.slots);
  for (int i = 0; i < j.nslots; i++) j.slots[i] = -1;
  uint64_t total = 0;
  for (int k = 0; k < j.n; k++) {
    uint64_t i = hash_name(j.t[k].name) % (uint64_t)j.nslots;
    while (j.slots[i] >= 0) i = (i + 1) % (uint64_t)j.nslots;
    j.slots[i] = k;
    total += j.t[k].bytes;
  }
  j.scratch = calloc(j.execute ? total + 8 : 8, 1);
  j.queue = malloc((size_t)j.n * sizeof *j.queue);
  j.taken = malloc((size_t)j.n * sizeof *j.taken);
  j.bit_tensor = malloc((size_t)j.n * sizeof *j.bit_tensor);
  int *ready = malloc((size_t)j.n * sizeof *ready);
  int nwords = j.n / 64 + 2;
  uint64_t *bits = malloc((size_t)nwords * sizeof *bits);
  pthread_mutex_init(&j.mu, NULL);
  buf req = {0}, resp = {0};
  long cycles = 0;
  for (long s = -warmup; s < steps; s++) {
    for (int k = 0; k < j.n; k++) j.t[k].done = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_ms();
    for (int k = j.n - 1; k >= 0; k--) { /* backward order, one enqueue each */
      pthread_mutex_lock(&j.mu);
      j.queue[j.nqueue++] = k;
      pthread_mutex_unlock(&j.mu);
    }
    int left = j.n;
    while (left > 0) {
      left -= cycle(&j, ready, bits, nwords, &req, &resp);
      if (s >= 0) cycles++;
    }
    if (s >= 0) t[s] = now_ms() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t, (int)steps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (j.rank == 0)
    printf("RESULT case=mpi.negotiation np=%d tensors=%d cache=%d execute=%d steps=%ld "
           "cycles_per_step=%.2f step_ms=%.4f step_p99=%.4f tag=%s\n",
           j.size, j.n, j.cache, j.execute, steps, (double)cycles / (double)steps,
           quantile(t, (int)steps, 0.5), quantile(t, (int)steps, 0.99), tag);
  free(req.p);
  free(resp.p);
  free(bits);
  free(ready);
  free(j.bit_tensor);
  free(j.queue);
  free(j.taken);
  free(j.scratch);
  free(j.slots);
  free(j.t);
  free(t);
  MPI_Finalize();
  return 0;
}
