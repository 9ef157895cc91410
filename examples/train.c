/* gradsync-train: the demo job. Data-parallel training of a small MLP in plain
 * C, using nothing but the public API in gradsync.h.
 *
 *   gradsync-run -np 4 gradsync-train --steps 300
 *
 * Every rank generates the same synthetic data set from --seed (4096 points in
 * 16 dimensions drawn around 8 Gaussian centres, two per class, 4 classes) and
 * keeps its shard (sample i belongs to rank i % size). Every rank initialises
 * the same model 16 -> 64 -> 64 -> 4 (ReLU, softmax cross-entropy) from the
 * seed. Each step a rank runs forward and backward on a minibatch of its shard;
 * as the backward pass produces a layer's gradients, it starts their
 * allreduce (GS_AVERAGE, in place), so communication of fc3 overlaps the
 * computation of fc2 and fc1, as in Horovod or DDP. After waiting for all of
 * them, every rank applies the same averaged gradient with plain SGD, so the
 * parameters stay bit-identical: the end of the run checks that with an
 * allreduce (min and max) of a checksum of the parameters.
 *
 * --towers gives every rank a private first layer, its "tower" (tower/fc0,
 * initialised from seed + rank), under the shared layers: the tower's
 * gradients go through the same gs_allreduce_async calls, but the names are
 * registered local (gs_register_local), so they never leave the rank (an
 * average only scales them by 1/size, as Horovod's scale_local_gradients).
 * --embedding adds a categorical input feature (one of 1000 categories,
 * telling the class for most samples) looked up in a shared 1000 x 8
 * embedding table: its gradient is sparse (the rows the batch used), reduced
 * with gs_sparse_allreduce_async and applied row by row (repeated rows add
 * up). The end of the run then checks that the shared parameters, the table
 * included, are bit-identical on all ranks and that the towers differ.
 *
 * Rank 0 logs the loss and accuracy averaged over all ranks (one more
 * allreduce per log line). Single-threaded; every gradsync error ends the
 * process with status 1 after gs_shutdown, with the library's message.
 *
 * Fault flags make one rank misbehave at a chosen step, so that every
 * failure gradsync detects can be reproduced with this demo (see
 * docs/troubleshooting.md): a crash (_exit in the middle of a step), a hang
 * (an endless sleep before submitting), a desync (the step's gradients
 * submitted under other names) and a straggler (a sleep before every
 * backward pass). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradsync.h"

#define N_SAMPLES 4096
#define N_FEATURES 16
#define N_CLASSES 4
#define CENTRES_PER_CLASS 2
#define CENTRE_SPREAD 1.25f /* std of the centres' coordinates */
#define NOISE 1.0f          /* std of the points around their centre */
#define HIDDEN 64
#define N_LAYERS 3                /* shared layers fc1..fc3 */
#define MAX_LAYERS (N_LAYERS + 1) /* and a tower below them (--towers) */
#define TOWER_WIDTH 32            /* outputs of a tower */
#define EMBED_ROWS 1000           /* categories of the extra feature (--embedding) */
#define EMBED_DIM 8               /* width of an embedding row */
#define EMBED_INIT 0.5f           /* std of the initial embedding values */
#define EMBED_SIGNAL 0.75         /* share of samples whose category tells the class */
#define EMBED_NAME "embed/table"
#define WAIT_MS 120000 /* generous: a hang guard, not a performance bound */

/* Fault injection: which rank misbehaves and when. Ranks and steps are -1
 * when unset; steps count from 1, as in the log lines. */
typedef struct faults {
  int crash_rank, crash_step;   /* _exit(3) in the middle of that step */
  int hang_rank, hang_step;     /* sleep forever before submitting */
  int desync_rank, desync_step; /* submit under other names */
  int slow_rank, slow_ms;       /* sleep before every backward pass */
} faults;

typedef struct options {
  int steps;
  uint64_t seed;
  int batch;
  float lr;
  int log_every; /* 0 = choose */
  int towers;    /* a private first layer per rank, registered local */
  int embedding; /* a categorical feature through a shared embedding table */
  faults fault;
} options;

/* How the demo waits for its ops (--wait): one blocking gs_wait; gs_wait
 * with a 1 s timeout in a loop (as a Python binding that stays responsive
 * to Ctrl-C does); or gs_test polling every 5 ms (a completion thread). */
typedef enum wait_mode { WAIT_BLOCK = 0, WAIT_TIMED = 1, WAIT_POLL = 2 } wait_mode;
static wait_mode g_wait = WAIT_BLOCK;

#define DESYNC_SUFFIX ".desync"

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Waits for h as --wait says, bounded by WAIT_MS in every mode. */
static gs_status wait_op(gs_handle *h) {
  if (g_wait == WAIT_BLOCK) return gs_wait(h, WAIT_MS);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    gs_status st;
    if (g_wait == WAIT_TIMED) {
      st = gs_wait(h, 1000);
      if (st != GS_ERR_TIMEOUT) return st;
    } else {
      int done = 0;
      st = gs_test(h, &done);
      if (st != GS_OK) return st;
      if (done) return gs_wait(h, 0);
      sleep_ms(5);
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > WAIT_MS)
      return gs_wait(h, 0); /* GS_ERR_TIMEOUT with its message */
  }
}

/* ---- deterministic randomness (same stream on every rank) ----------------- */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static rng rng_make(uint64_t seed, uint64_t stream) {
  rng r = {seed * 0x2545f4914f6cdd1dull + stream};
  rng_next(&r);
  return r;
}

static double rng_uniform(rng *r) { /* in (0, 1) */
  return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static float rng_gauss(rng *r) { /* Box-Muller */
  double u = rng_uniform(r), v = rng_uniform(r);
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- data --------------------------------------------------------------- */

/* The whole set (identical on every rank) and this rank's shard of it. */
typedef struct dataset {
  float x[N_SAMPLES][N_FEATURES];
  int y[N_SAMPLES];
  int cat[N_SAMPLES]; /* the categorical feature (used with --embedding) */
  int *shard;         /* indices i with i % size == rank */
  int shard_len;
} dataset;

static void dataset_generate(dataset *d, uint64_t seed) {
  float centre[N_CLASSES * CENTRES_PER_CLASS][N_FEATURES];
  rng r = rng_make(seed, 1);
  for (int c = 0; c < N_CLASSES * CENTRES_PER_CLASS; c++)
    for (int f = 0; f < N_FEATURES; f++) centre[c][f] = CENTRE_SPREAD * rng_gauss(&r);
  for (int i = 0; i < N_SAMPLES; i++) {
    int c = (int)(rng_next(&r) % (N_CLASSES * CENTRES_PER_CLASS));
    d->y[i] = c % N_CLASSES;
    for (int f = 0; f < N_FEATURES; f++) d->x[i][f] = centre[c][f] + NOISE * rng_gauss(&r);
  }
  /* From a stream of its own, so the points are the same with or without
   * --embedding: most categories fall in the class's quarter of the table,
   * the others anywhere. */
  rng rc = rng_make(seed, 5);
  for (int i = 0; i < N_SAMPLES; i++) {
    int per_class = EMBED_ROWS / N_CLASSES;
    if (rng_uniform(&rc) < EMBED_SIGNAL)
      d->cat[i] = d->y[i] * per_class + (int)(rng_next(&rc) % (uint64_t)per_class);
    else
      d->cat[i] = (int)(rng_next(&rc) % EMBED_ROWS);
  }
}

static int dataset_shard(dataset *d, int rank, int size) {
  d->shard = malloc(sizeof(int) * (N_SAMPLES / size + 1));
  if (!d->shard) return -1;
  d->shard_len = 0;
  for (int i = rank; i < N_SAMPLES; i += size) d->shard[d->shard_len++] = i;
  return 0;
}

/* A new order of the shard for every epoch (it may differ between ranks: only
 * the gradients are shared). */
static void shuffle(int *a, int n, uint64_t seed, int rank, int epoch) {
  rng r = rng_make(seed, 1000003ull * (uint64_t)(epoch + 1) + (uint64_t)rank);
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rng_next(&r) % (uint64_t)(i + 1));
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- model ------------------------------------------------------------------ */

typedef struct layer {
  char wname[32], bname[32]; /* "fc1/weight", "fc1/bias" */
  int in, out;
  int local;      /* a tower's layer: registered local, never leaves this rank */
  float *w, *b;   /* w[out][in] */
  float *gw, *gb; /* gradients, averaged in place by gradsync */
} layer;

/* Layers fc[0..nl): the tower (with --towers), then the shared fc1..fc3.
 * Activations of one batch: act[0] is the input (the features, then the
 * looked-up embedding row with --embedding), act[l+1] the output of layer l
 * (after ReLU for the hidden layers, the logits for the last). */
typedef struct mlp {
  int nl;
  int in; /* width of the input */
  layer fc[MAX_LAYERS];
  float *act[MAX_LAYERS + 1];
  float *delta[MAX_LAYERS + 1]; /* d loss / d pre-activation of each layer's output */
  int batch_cap;
  float *embed;        /* EMBED_ROWS x EMBED_DIM, shared; NULL without --embedding */
  int64_t *embed_rows; /* the table row (category) of each sample of the batch */
  float *embed_grad;   /* batch x EMBED_DIM: d loss / d each looked-up row */
} mlp;

/* Allocates layer L (prefix "fc1" -> "fc1/weight", "fc1/bias") with He
 * initialisation from r and zero biases. */
static int layer_init(layer *L, const char *prefix, int in, int out, int local, rng *r) {
  L->in = in;
  L->out = out;
  L->local = local;
  snprintf(L->wname, sizeof L->wname, "%s/weight", prefix);
  snprintf(L->bname, sizeof L->bname, "%s/bias", prefix);
  size_t nw = (size_t)in * (size_t)out;
  L->w = malloc(nw * sizeof(float));
  L->gw = malloc(nw * sizeof(float));
  L->b = calloc((size_t)out, sizeof(float));
  L->gb = calloc((size_t)out, sizeof(float));
  if (!L->w || !L->gw || !L->b || !L->gb) return -1;
  float scale = sqrtf(2.0f / (float)in); /* He initialisation for ReLU */
  for (size_t i = 0; i < nw; i++) L->w[i] = scale * rng_gauss(r);
  return 0;
}

/* The shared layers and the embedding table come from the seed alone (the
 * same on every rank); a tower from seed + rank (its own on each rank). */
static int mlp_init(mlp *m, const options *o, int rank, int batch_cap) {
  static const int width[N_LAYERS] = {HIDDEN, HIDDEN, N_CLASSES};
  rng shared = rng_make(o->seed, 2);
  memset(m, 0, sizeof *m);
  m->batch_cap = batch_cap;
  m->in = N_FEATURES + (o->embedding ? EMBED_DIM : 0);
  int in = m->in;
  if (o->towers) {
    rng tower = rng_make(o->seed + (uint64_t)rank, 3);
    if (layer_init(&m->fc[m->nl++], "tower/fc0", in, TOWER_WIDTH, 1, &tower) != 0) return -1;
    in = TOWER_WIDTH;
  }
  for (int k = 0; k < N_LAYERS; k++) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "fc%d", k + 1);
    if (layer_init(&m->fc[m->nl++], prefix, in, width[k], 0, &shared) != 0) return -1;
    in = width[k];
  }
  for (int l = 0; l <= m->nl; l++) {
    int w = l == 0 ? m->in : m->fc[l - 1].out;
    m->act[l] = malloc(sizeof(float) * (size_t)batch_cap * (size_t)w);
    m->delta[l] = malloc(sizeof(float) * (size_t)batch_cap * (size_t)w);
    if (!m->act[l] || !m->delta[l]) return -1;
  }
  if (o->embedding) {
    rng r = rng_make(o->seed, 4);
    m->embed = malloc(sizeof(float) * EMBED_ROWS * EMBED_DIM);
    m->embed_rows = malloc(sizeof(int64_t) * (size_t)batch_cap);
    m->embed_grad = malloc(sizeof(float) * (size_t)batch_cap * EMBED_DIM);
    if (!m->embed || !m->embed_rows || !m->embed_grad) return -1;
    for (size_t i = 0; i < (size_t)EMBED_ROWS * EMBED_DIM; i++)
      m->embed[i] = EMBED_INIT * rng_gauss(&r);
  }
  return 0;
}

static void mlp_free(mlp *m) {
  for (int l = 0; l < m->nl; l++) {
    free(m->fc[l].w);
    free(m->fc[l].gw);
    free(m->fc[l].b);
    free(m->fc[l].gb);
  }
  for (int l = 0; l <= m->nl; l++) {
    free(m->act[l]);
    free(m->delta[l]);
  }
  free(m->embed);
  free(m->embed_rows);
  free(m->embed_grad);
}

static void layer_forward(const layer *L, const float *x, float *y, int n, int relu) {
  for (int s = 0; s < n; s++) {
    const float *xs = x + (size_t)s * L->in;
    for (int o = 0; o < L->out; o++) {
      const float *wo = L->w + (size_t)o * L->in;
      float z = L->b[o];
      for (int i = 0; i < L->in; i++) z += wo[i] * xs[i];
      y[(size_t)s * L->out + o] = (relu && z < 0.0f) ? 0.0f : z;
    }
  }
}

/* Forward pass over samples idx[0..n). Fills act[] (and, with an embedding,
 * the rows the batch looks up); returns the summed loss and adds the number
 * of correct predictions to *correct. When delta_out is set, also writes
 * d(mean loss)/d(logits) into m->delta[nl]. */
static double mlp_forward(mlp *m, const dataset *d, const int *idx, int n, int *correct,
                          int delta_out) {
  for (int s = 0; s < n; s++) {
    float *in = m->act[0] + (size_t)s * m->in;
    memcpy(in, d->x[idx[s]], sizeof d->x[0]);
    if (m->embed) {
      m->embed_rows[s] = d->cat[idx[s]];
      memcpy(in + N_FEATURES, m->embed + (size_t)m->embed_rows[s] * EMBED_DIM,
             sizeof(float) * EMBED_DIM);
    }
  }
  for (int l = 0; l < m->nl; l++)
    layer_forward(&m->fc[l], m->act[l], m->act[l + 1], n, l < m->nl - 1);
  double loss = 0.0;
  for (int s = 0; s < n; s++) {
    const float *z = m->act[m->nl] + s * N_CLASSES;
    int y = d->y[idx[s]], best = 0;
    float zmax = z[0];
    for (int k = 1; k < N_CLASSES; k++)
      if (z[k] > zmax) zmax = z[k], best = k;
    double sum = 0.0, p[N_CLASSES];
    for (int k = 0; k < N_CLASSES; k++) sum += (p[k] = exp((double)(z[k] - zmax)));
    loss += -log(p[y] / sum);
    *correct += best == y;
    if (delta_out)
      for (int k = 0; k < N_CLASSES; k++)
        m->delta[m->nl][s * N_CLASSES + k] = (float)((p[k] / sum - (k == y)) / n);
  }
  return loss;
}

/* Gradients of layer l from delta[l+1] (its output's error) and act[l] (its
 * input); then delta[l] for the layer below, or, for the first layer with an
 * embedding, the gradient of each sample's looked-up row (the input's last
 * EMBED_DIM columns, which no ReLU precedes). */
static void layer_backward(mlp *m, int l, int n) {
  layer *L = &m->fc[l];
  const float *dy = m->delta[l + 1], *x = m->act[l];
  memset(L->gw, 0, sizeof(float) * (size_t)L->in * (size_t)L->out);
  memset(L->gb, 0, sizeof(float) * (size_t)L->out);
  for (int s = 0; s < n; s++) {
    for (int o = 0; o < L->out; o++) {
      float g = dy[s * L->out + o];
      if (g == 0.0f) continue;
      L->gb[o] += g;
      float *gwo = L->gw + (size_t)o * L->in;
      for (int i = 0; i < L->in; i++) gwo[i] += g * x[s * L->in + i];
    }
  }
  if (l == 0 && !m->embed) return;
  int first = l == 0 ? N_FEATURES : 0;
  for (int s = 0; s < n; s++) {
    for (int i = first; i < L->in; i++) {
      float g = 0.0f;
      if (l == 0 || x[s * L->in + i] > 0.0f) /* ReLU of the layer below */
        for (int o = 0; o < L->out; o++) g += dy[s * L->out + o] * L->w[(size_t)o * L->in + i];
      if (l == 0)
        m->embed_grad[s * EMBED_DIM + (i - N_FEATURES)] = g;
      else
        m->delta[l][s * L->in + i] = g;
    }
  }
}

static void sgd_update(mlp *m, float lr) {
  for (int l = 0; l < m->nl; l++) {
    layer *L = &m->fc[l];
    size_t nw = (size_t)L->in * (size_t)L->out;
    for (size_t i = 0; i < nw; i++) L->w[i] -= lr * L->gw[i];
    for (int o = 0; o < L->out; o++) L->b[o] -= lr * L->gb[o];
  }
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t len) {
  const unsigned char *b = p;
  for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* FNV-1a over every parameter byte of the shared layers (local = 0: and the
 * embedding table) or of the tower (local = 1), masked to 62 bits (a
 * positive int64). */
static int64_t mlp_checksum(const mlp *m, int local) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int l = 0; l < m->nl; l++) {
    const layer *L = &m->fc[l];
    if (L->local != local) continue;
    h = fnv1a(h, L->w, sizeof(float) * (size_t)L->in * (size_t)L->out);
    h = fnv1a(h, L->b, sizeof(float) * (size_t)L->out);
  }
  if (!local && m->embed) h = fnv1a(h, m->embed, sizeof(float) * EMBED_ROWS * EMBED_DIM);
  return (int64_t)(h & ((1ull << 62) - 1));
}

/* ---- gradsync --------------------------------------------------------------- */

typedef struct job {
  gs_ctx *ctx;
  int rank, size;
} job;

/* Prints the failure with the library's message and ends the process. */
static void fail(job *j, gs_handle *h, const char *what, const char *name, gs_status st) {
  const char *msg = h ? gs_handle_error(h) : gs_last_error(j->ctx);
  fprintf(stderr, "rank %d: %s of '%s' failed: %s: %s\n", j->rank, what, name, gs_status_str(st),
          (msg && *msg) ? msg : "(no message)");
  gs_shutdown(j->ctx); /* completes whatever is still pending */
  gs_handle_free(h);
  exit(1);
}

/* Starts an in-place average of a float tensor of the given shape. */
static gs_handle *start_average(job *j, const char *name, float *buf, const int64_t *shape,
                                int ndim) {
  size_t count = 1;
  for (int i = 0; i < ndim; i++) count *= (size_t)shape[i];
  gs_allreduce_opts opts = {.struct_size = sizeof(gs_allreduce_opts), .shape = shape, .ndim = ndim};
  gs_handle *h = NULL;
  gs_status st =
      gs_allreduce_async(j->ctx, name, buf, buf, count, GS_FLOAT32, GS_AVERAGE, &opts, &h);
  if (st != GS_OK) fail(j, NULL, "allreduce", name, st);
  return h;
}

static void wait_and_free(job *j, gs_handle *h, const char *name) {
  gs_status st = wait_op(h);
  if (st != GS_OK) fail(j, h, "allreduce", name, st);
  gs_handle_free(h);
}

/* A blocking allreduce of a few scalars. */
static void allreduce_now(job *j, const char *name, void *buf, size_t count, gs_dtype dtype,
                          gs_reduce_op op) {
  gs_handle *h = NULL;
  gs_status st = gs_allreduce_async(j->ctx, name, buf, buf, count, dtype, op, NULL, &h);
  if (st != GS_OK) fail(j, NULL, "allreduce", name, st);
  wait_and_free(j, h, name);
}

/* Starts the average of the embedding table's sparse gradient: the n rows
 * the batch looked up (rows[s], grad row s; repeats allowed). */
static gs_handle *start_sparse_average(job *j, const char *name, const int64_t *rows,
                                       const float *grad, int n) {
  gs_handle *h = NULL;
  gs_status st = gs_sparse_allreduce_async(j->ctx, name, rows, grad, (size_t)n, EMBED_DIM,
                                           GS_FLOAT32, GS_AVERAGE, NULL, &h);
  if (st != GS_OK) fail(j, NULL, "sparse allreduce", name, st);
  return h;
}

/* Waits for the sparse average and applies every gathered row (already
 * divided by size) to the table with SGD; a row gathered several times gets
 * each contribution. The rows come in rank order on every rank, so the
 * table stays bit-identical. */
static void embed_update(job *j, mlp *m, gs_handle *h, const char *name, float lr) {
  gs_status st = wait_op(h);
  if (st != GS_OK) fail(j, h, "sparse allreduce", name, st);
  const int64_t *rows;
  const void *values;
  size_t nnz;
  st = gs_sparse_result(h, &rows, &values, &nnz);
  if (st != GS_OK) {
    gs_handle_free(h);
    fail(j, NULL, "gs_sparse_result", name, st);
  }
  const float *v = values;
  for (size_t i = 0; i < nnz; i++) {
    if (rows[i] < 0 || rows[i] >= EMBED_ROWS) {
      fprintf(stderr,
              "rank %d: sparse allreduce of '%s' returned row index %" PRId64
              " (gathered row %zu of %zu), outside the table's %d rows; this is a gradsync bug\n",
              j->rank, name, rows[i], i, nnz, EMBED_ROWS);
      gs_handle_free(h);
      gs_shutdown(j->ctx);
      exit(1);
    }
    float *e = m->embed + (size_t)rows[i] * EMBED_DIM;
    for (int k = 0; k < EMBED_DIM; k++) e[k] -= lr * v[i * EMBED_DIM + (size_t)k];
  }
  gs_handle_free(h);
}

/* --hang-rank: like a process stuck in I/O, in a driver or on a lock of its
 * own, this one never comes back; gradsync-run (or the operator) has to
 * kill it. */
static void hang_forever(const job *j, int step) {
  fprintf(stderr,
          "rank %d: --hang-rank %d --hang-step %d: hanging forever before submitting the "
          "gradients of step %d (simulated hang; kill this process to end it)\n",
          j->rank, j->rank, step, step);
  fflush(NULL);
  for (;;) sleep(3600);
}

/* --crash-rank: called in the middle of a step, once fc3's gradients are
 * reduced and fc2's submitted, so the job dies with collectives in flight. */
static void crash_now(const job *j, int step, gs_handle *reduced) {
  gs_wait(reduced, WAIT_MS); /* our fc3 request surely reached the coordinator */
  fprintf(stderr,
          "rank %d: --crash-rank %d --crash-step %d: exiting with status 3 in the middle of "
          "step %d (fc3's gradients reduced, fc2's submitted, fc1's never will be)\n",
          j->rank, j->rank, step, step);
  fflush(NULL);
  _exit(3);
}

/* One training step (step counts from 1) on this rank's minibatch
 * idx[0..n); the gradients are averaged over all ranks, layer by layer as
 * backward produces them (a tower's are local: gradsync only scales them),
 * then the embedding's sparse gradient. The fault flags act here. */
static double train_step(job *j, const options *o, int step, mlp *m, const dataset *d,
                         const int *idx, int n, int *correct) {
  const faults *f = &o->fault;
  gs_handle *pending[2 * MAX_LAYERS];
  char names[2 * MAX_LAYERS][sizeof m->fc[0].wname + sizeof DESYNC_SUFFIX];
  char embed_name[sizeof EMBED_NAME + sizeof DESYNC_SUFFIX];
  int np = 0;
  if (j->rank == f->hang_rank && step == f->hang_step) hang_forever(j, step);
  int desync = j->rank == f->desync_rank && step == f->desync_step;
  if (desync)
    fprintf(stderr,
            "rank %d: --desync-rank %d --desync-step %d: submitting the gradients of step %d "
            "under other names (fc3/weight%s, ...), as if this rank ran another model\n",
            j->rank, j->rank, step, step, DESYNC_SUFFIX);
  double loss = mlp_forward(m, d, idx, n, correct, 1);
  if (j->rank == f->slow_rank) sleep_ms(f->slow_ms);
  for (int l = m->nl - 1; l >= 0; l--) {
    layer *L = &m->fc[l];
    layer_backward(m, l, n);
    int64_t wshape[2] = {L->out, L->in}, bshape[1] = {L->out};
    const char *sfx = desync && !L->local ? DESYNC_SUFFIX : "";
    snprintf(names[np], sizeof names[np], "%s%s", L->wname, sfx);
    pending[np] = start_average(j, names[np], L->gw, wshape, 2);
    np++;
    snprintf(names[np], sizeof names[np], "%s%s", L->bname, sfx);
    pending[np] = start_average(j, names[np], L->gb, bshape, 1);
    np++;
    if (l == m->nl - 2 && j->rank == f->crash_rank && step == f->crash_step)
      crash_now(j, step, pending[0]);
  }
  gs_handle *embed = NULL;
  if (m->embed) {
    snprintf(embed_name, sizeof embed_name, "%s%s", EMBED_NAME, desync ? DESYNC_SUFFIX : "");
    embed = start_sparse_average(j, embed_name, m->embed_rows, m->embed_grad, n);
  }
  for (int i = 0; i < np; i++) wait_and_free(j, pending[i], names[i]);
  sgd_update(m, o->lr);
  if (embed) embed_update(j, m, embed, embed_name, o->lr);
  return loss;
}

/* ---- command line --------------------------------------------------------- */

static void usage(FILE *f) {
  fputs("usage: gradsync-train [--steps N] [--seed S] [--batch B] [--lr X]\n"
        "                      [--log-every K] [--towers] [--embedding] [--wait MODE]\n"
        "                      [--crash-rank R --crash-step S]\n"
        "                      [--hang-rank R --hang-step S]\n"
        "                      [--desync-rank R --desync-step S]\n"
        "                      [--slow-rank R --slow-ms M]\n"
        "\n"
        "The gradsync demo job: data-parallel SGD of an MLP 16-64-64-4 on a synthetic\n"
        "4-class data set of 4096 points, sharded over the ranks. Run it under\n"
        "gradsync-run, e.g.  gradsync-run -np 4 gradsync-train\n"
        "Options take '--opt VALUE' or '--opt=VALUE'.\n"
        "\n"
        "  --steps N      training steps (default 300)\n"
        "  --seed S       seed of the data set and of the initial parameters (default 1)\n"
        "  --batch B      minibatch per rank (default 32)\n"
        "  --lr X         SGD learning rate (default 0.1)\n"
        "  --log-every K  log every K steps (default: every epoch, at most 10 lines)\n"
        "  --towers       give every rank a private first layer (tower/fc0, 32\n"
        "                 outputs, initialised from seed + rank) under the shared\n"
        "                 layers; its names are registered local (gs_register_local):\n"
        "                 never reduced, the average only scales them by 1/size\n"
        "                 (GRADSYNC_SCALE_LOCAL=0: not)\n"
        "  --embedding    add a categorical feature (one of 1000) looked up in a shared\n"
        "                 1000 x 8 embedding table (embed/table) whose sparse gradient is\n"
        "                 averaged with gs_sparse_allreduce_async\n"
        "  --wait MODE    how ops are waited for: block (default: one gs_wait),\n"
        "                 timed (gs_wait with a 1 s timeout in a loop) or poll\n"
        "                 (gs_test every 5 ms)\n"
        "  --version      print the version\n"
        "  -h, --help     show this help\n"
        "\n"
        "The run ends by checking that the shared parameters (the embedding table\n"
        "included) are bit-identical on all ranks and, with --towers, that the towers\n"
        "differ; it exits 1 otherwise.\n"
        "\n"
        "Fault injection, to reproduce failures (see docs/troubleshooting.md); steps\n"
        "count from 1, as in the log lines; each pair goes together:\n"
        "  --crash-rank R --crash-step S    rank R exits with status 3 in the middle of\n"
        "                                   step S, after submitting some of its\n"
        "                                   gradients\n"
        "  --hang-rank R --hang-step S      rank R sleeps forever before submitting the\n"
        "                                   gradients of step S (kill it to end it)\n"
        "  --desync-rank R --desync-step S  rank R submits the gradients of step S under\n"
        "                                   other names (fc3/weight.desync, ...)\n"
        "  --slow-rank R --slow-ms M        rank R sleeps M ms before every backward pass\n"
        "                                   (a straggler; the job still completes)\n",
        f);
}

static int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gradsync-train: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\n\n", stderr);
  va_end(ap);
  usage(stderr);
  return 2;
}

/* A flag with an integer value (counts, ranks, steps, milliseconds). */
typedef struct int_flag {
  const char *key;
  size_t offset; /* of the int field in options */
  long min, max;
  const char *what; /* for the error message */
} int_flag;

static const int_flag int_flags[] = {
    {"--steps", offsetof(options, steps), 1, 100000000, "a positive integer"},
    {"--batch", offsetof(options, batch), 1, N_SAMPLES, "an integer from 1 to 4096"},
    {"--log-every", offsetof(options, log_every), 1, 100000000, "a positive integer"},
    {"--crash-rank", offsetof(options, fault.crash_rank), 0, 65535, "a rank (an integer from 0)"},
    {"--crash-step", offsetof(options, fault.crash_step), 1, 100000000,
     "a step number (an integer from 1)"},
    {"--hang-rank", offsetof(options, fault.hang_rank), 0, 65535, "a rank (an integer from 0)"},
    {"--hang-step", offsetof(options, fault.hang_step), 1, 100000000,
     "a step number (an integer from 1)"},
    {"--desync-rank", offsetof(options, fault.desync_rank), 0, 65535, "a rank (an integer from 0)"},
    {"--desync-step", offsetof(options, fault.desync_step), 1, 100000000,
     "a step number (an integer from 1)"},
    {"--slow-rank", offsetof(options, fault.slow_rank), 0, 65535, "a rank (an integer from 0)"},
    {"--slow-ms", offsetof(options, fault.slow_ms), 1, 3600000,
     "milliseconds (an integer from 1 to 3600000)"},
};

/* Each fault needs both of its flags, and a step the run reaches. */
static int check_faults(const options *o) {
  const faults *f = &o->fault;
  const struct {
    const char *rflag, *vflag;
    int rank, value, is_step;
  } pairs[] = {
      {"--crash-rank", "--crash-step", f->crash_rank, f->crash_step, 1},
      {"--hang-rank", "--hang-step", f->hang_rank, f->hang_step, 1},
      {"--desync-rank", "--desync-step", f->desync_rank, f->desync_step, 1},
      {"--slow-rank", "--slow-ms", f->slow_rank, f->slow_ms, 0},
  };
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    if ((pairs[k].rank < 0) != (pairs[k].value < 0))
      return bad_usage("%s and %s go together; give both or neither", pairs[k].rflag,
                       pairs[k].vflag);
    if (pairs[k].is_step && pairs[k].value > o->steps)
      return bad_usage("%s %d is past the last step (--steps %d): the fault would never happen",
                       pairs[k].vflag, pairs[k].value, o->steps);
  }
  return -1;
}

/* Returns -1 when parsed, else the exit code (0 after --help, 2 on error). */
static int parse_args(int argc, char **argv, options *o) {
  *o = (options){.steps = 300,
                 .seed = 1,
                 .batch = 32,
                 .lr = 0.1f,
                 .log_every = 0,
                 .fault = {-1, -1, -1, -1, -1, -1, -1, -1}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      printf("gradsync-train %s (libgradsync %s)\n", GS_VERSION_STRING, gs_version());
      return 0;
    }
    const char *eq = strchr(a, '=');
    size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    static const struct {
      const char *key;
      size_t offset; /* of the int field in options set to 1 */
    } switches[] = {{"--towers", offsetof(options, towers)},
                    {"--embedding", offsetof(options, embedding)}};
    int is_switch = 0;
    for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++) {
      if (strlen(switches[k].key) != klen || strncmp(a, switches[k].key, klen) != 0) continue;
      if (eq) return bad_usage("%s takes no value, got '%s'", switches[k].key, a);
      *(int *)((char *)o + switches[k].offset) = 1;
      is_switch = 1;
    }
    if (is_switch) continue;
    const char *key = NULL;
    const int_flag *iflag = NULL;
    static const char *const other[] = {"--seed", "--lr", "--wait"};
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++)
      if (strlen(other[k]) == klen && strncmp(a, other[k], klen) == 0) key = other[k];
    for (size_t k = 0; k < sizeof int_flags / sizeof int_flags[0]; k++)
      if (strlen(int_flags[k].key) == klen && strncmp(a, int_flags[k].key, klen) == 0)
        iflag = &int_flags[k], key = iflag->key;
    if (!key) return bad_usage("unknown option '%s'", a);
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v) return bad_usage("%s needs a value", key);
    char *end;
    errno = 0;
    if (iflag) {
      long n = strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || errno || n < iflag->min || n > iflag->max)
        return bad_usage("%s needs %s, got '%s'", key, iflag->what, v);
      *(int *)((char *)o + iflag->offset) = (int)n;
    } else if (strcmp(key, "--seed") == 0) {
      unsigned long long s = strtoull(v, &end, 0);
      if (*v == '\0' || *v == '-' || *end != '\0' || errno)
        return bad_usage("--seed needs a non-negative integer, got '%s'", v);
      o->seed = s;
    } else if (strcmp(key, "--lr") == 0) {
      double lr = strtod(v, &end);
      if (*v == '\0' || *end != '\0' || errno || !(lr > 0.0) || lr > 1e6)
        return bad_usage("--lr needs a positive number, got '%s'", v);
      o->lr = (float)lr;
    } else if (strcmp(key, "--wait") == 0) {
      if (strcmp(v, "block") == 0)
        g_wait = WAIT_BLOCK;
      else if (strcmp(v, "timed") == 0)
        g_wait = WAIT_TIMED;
      else if (strcmp(v, "poll") == 0)
        g_wait = WAIT_POLL;
      else
        return bad_usage("--wait needs block, timed or poll, got '%s'", v);
    }
  }
  return check_faults(o);
}

/* ---- the job ---------------------------------------------------------------- */

static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* Loss and accuracy since the last log line, averaged over all ranks. */
static void log_metrics(job *j, int step, int steps, double loss_sum, int correct, int seen) {
  double m[2] = {seen ? loss_sum / seen : 0.0, seen ? (double)correct / seen : 0.0};
  char name[48];
  snprintf(name, sizeof name, "metrics/step%d", step);
  allreduce_now(j, name, m, 2, GS_FLOAT64, GS_AVERAGE);
  if (j->rank == 0) printf("step %d/%d  loss %.4f  accuracy %.4f\n", step, steps, m[0], m[1]);
  fflush(stdout);
}

/* Loss and accuracy of the final model over the whole data set: each rank
 * evaluates its shard, the sums are added up. */
static void evaluate(job *j, mlp *m, const dataset *d) {
  double sums[2] = {0.0, 0.0}; /* loss, correct */
  for (int s = 0; s < d->shard_len; s += m->batch_cap) {
    int n = d->shard_len - s < m->batch_cap ? d->shard_len - s : m->batch_cap, correct = 0;
    sums[0] += mlp_forward(m, d, d->shard + s, n, &correct, 0);
    sums[1] += correct;
  }
  allreduce_now(j, "eval/sums", sums, 2, GS_FLOAT64, GS_SUM);
  if (j->rank == 0)
    printf("final accuracy %.4f  loss %.4f  on all %d samples\n", sums[1] / N_SAMPLES,
           sums[0] / N_SAMPLES, N_SAMPLES);
}

/* Returns 0 if the shared parameters (the embedding table included) are
 * bit-identical on every rank. If not, the ranks that differ from the
 * majority say so: min and max of the checksums tell whether they differ, a
 * count of the ranks holding each tells who. */
static int check_identical(job *j, const mlp *m) {
  int64_t mine = mlp_checksum(m, 0), lo = mine, hi = mine;
  allreduce_now(j, "checksum/min", &lo, 1, GS_INT64, GS_MIN);
  allreduce_now(j, "checksum/max", &hi, 1, GS_INT64, GS_MAX);
  if (lo == hi) {
    const char *what = m->embed
                           ? (m->fc[0].local ? ": shared layers and embedding table; the "
                                               "towers are per rank"
                                             : ": layers and embedding table")
                           : (m->fc[0].local ? ": shared layers; the towers are per rank" : "");
    if (j->rank == 0)
      printf("parameters identical on all %d ranks (checksum 0x%" PRIx64 "%s)\n", j->size,
             (uint64_t)mine, what);
    return 0;
  }
  int64_t votes[2] = {mine == lo, mine == hi};
  allreduce_now(j, "checksum/votes", votes, 2, GS_INT64, GS_SUM);
  int64_t majority = votes[1] > votes[0] ? hi : lo;
  if (mine != majority)
    fprintf(stderr,
            "rank %d: parameters differ from other ranks (checksum 0x%" PRIx64 " vs min 0x%" PRIx64
            " max 0x%" PRIx64 "; %" PRId64 " of %d ranks hold 0x%" PRIx64 ")\n",
            j->rank, (uint64_t)mine, (uint64_t)lo, (uint64_t)hi, votes[majority == hi], j->size,
            (uint64_t)majority);
  else if (j->rank == 0)
    fprintf(stderr,
            "rank 0: parameters are not identical on all %d ranks (%" PRId64
            " ranks hold 0x%" PRIx64 " like this one; the others say so)\n",
            j->size, votes[majority == hi], (uint64_t)majority);
  /* Nobody exits (and gets its peers stopped by gradsync-run) before every
   * rank has said its piece. */
  int64_t done = 1;
  allreduce_now(j, "checksum/reported", &done, 1, GS_INT64, GS_SUM);
  return -1;
}

/* With towers: returns 0 if every rank's tower differs from every other's
 * and each rank kept its tower's gradients local (2 local ops per step).
 * Every rank gathers every rank's tower checksum and local op count, so all
 * of them reach the same verdict; rank 0 tells it. */
static int check_towers(job *j, const mlp *m, int steps) {
  if (!m->fc[0].local) return 0;
  gs_stats stats;
  gs_stats_init(&stats);
  gs_status st = gs_get_stats(j->ctx, &stats);
  if (st != GS_OK) fail(j, NULL, "gs_get_stats", "tower", st);
  int64_t mine[2] = {mlp_checksum(m, 1), (int64_t)stats.local_ops}, shape[2] = {1, 2};
  const char *name = "checksum/towers";
  gs_handle *h = NULL;
  st = gs_allgather_async(j->ctx, name, mine, shape, 2, GS_INT64, NULL, &h);
  if (st != GS_OK) fail(j, NULL, "allgather", name, st);
  st = wait_op(h);
  if (st != GS_OK) fail(j, h, "allgather", name, st);
  const void *data;
  size_t bytes;
  st = gs_handle_result(h, &data, &bytes);
  if (st != GS_OK || bytes != sizeof(int64_t) * 2 * (size_t)j->size) {
    gs_handle_free(h);
    if (st == GS_OK) {
      fprintf(stderr, "rank %d: the allgather of '%s' returned %zu bytes, expected %zu\n", j->rank,
              name, bytes, sizeof(int64_t) * 2 * (size_t)j->size);
      gs_shutdown(j->ctx);
      exit(1);
    }
    fail(j, NULL, "gs_handle_result", name, st);
  }
  const int64_t *all = data;
  int64_t want_local = 2 * (int64_t)steps; /* tower/fc0/weight and tower/fc0/bias */
  int bad = 0;
  for (int r = 0; r < j->size; r++) {
    if (all[2 * r + 1] != want_local) {
      bad = 1;
      if (j->rank == 0)
        fprintf(stderr,
                "rank 0: rank %d ran %" PRId64 " ops on local tensors, expected %" PRId64
                " (the tower's weight and bias, every step): its tower was not kept local\n",
                r, all[2 * r + 1], want_local);
    }
    for (int q = 0; q < r; q++)
      if (all[2 * q] == all[2 * r]) {
        bad = 1;
        if (j->rank == 0)
          fprintf(stderr,
                  "rank 0: ranks %d and %d hold the same tower (checksum 0x%" PRIx64
                  "): towers must stay private to each rank\n",
                  q, r, (uint64_t)all[2 * r]);
      }
  }
  if (!bad && j->rank == 0) {
    if (j->size > 1)
      printf("towers differ on all %d ranks (%d distinct checksums; %" PRId64
             " local ops per rank, never sent)\n",
             j->size, j->size, want_local);
    else
      printf("towers: only 1 rank, nothing to compare (checksum 0x%" PRIx64 "; %" PRId64
             " local ops, never sent)\n",
             (uint64_t)all[0], want_local);
  }
  gs_handle_free(h);
  return bad ? -1 : 0;
}

/* "MLP 16-64-64-4", or with --towers / --embedding the whole picture. */
static void describe_model(const mlp *m, char *buf, size_t cap) {
  int towers = m->fc[0].local;
  char input[96] = "", tower[64] = "";
  if (m->embed)
    snprintf(input, sizeof input, "input %d + embedding %d (table %dx%d, sparse) -> ", N_FEATURES,
             EMBED_DIM, EMBED_ROWS, EMBED_DIM);
  else if (towers)
    snprintf(input, sizeof input, "input %d -> ", N_FEATURES);
  if (towers)
    snprintf(tower, sizeof tower, "tower %d (local to each rank) -> shared ", m->fc[0].out);
  snprintf(buf, cap, "%s%sMLP %d-%d-%d-%d", input, tower, m->fc[towers].in, HIDDEN, HIDDEN,
           N_CLASSES);
}

static void train(job *j, const options *o, mlp *m, dataset *d) {
  int steps_per_epoch = (N_SAMPLES / j->size) / o->batch;
  if (steps_per_epoch < 1) steps_per_epoch = 1;
  int log_every = o->log_every;
  if (log_every == 0) { /* every epoch, but at least ~10 lines per run */
    log_every = (o->steps + 9) / 10;
    if (log_every > steps_per_epoch) log_every = steps_per_epoch;
  }
  char model[160];
  describe_model(m, model, sizeof model);
  if (j->rank == 0)
    printf("gradsync-train: %d ranks, %d samples (%d per rank), %s, batch %d per rank, lr %g, %d "
           "steps (%d per epoch)\n",
           j->size, N_SAMPLES, N_SAMPLES / j->size, model, o->batch, (double)o->lr, o->steps,
           steps_per_epoch);
  int *batch = malloc(sizeof(int) * (size_t)o->batch);
  if (!batch) {
    fprintf(stderr, "rank %d: out of memory\n", j->rank);
    gs_shutdown(j->ctx);
    exit(1);
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  double loss_sum = 0.0;
  int correct = 0, seen = 0;
  for (int step = 0; step < o->steps; step++) {
    int epoch = step / steps_per_epoch, pos = (step % steps_per_epoch) * o->batch;
    if (pos == 0) shuffle(d->shard, d->shard_len, o->seed, j->rank, epoch);
    for (int b = 0; b < o->batch; b++) batch[b] = d->shard[(pos + b) % d->shard_len];
    loss_sum += train_step(j, o, step + 1, m, d, batch, o->batch, &correct);
    seen += o->batch;
    if ((step + 1) % log_every == 0 || step + 1 == o->steps) {
      log_metrics(j, step + 1, o->steps, loss_sum, correct, seen);
      loss_sum = 0.0;
      correct = seen = 0;
    }
  }
  if (j->rank == 0) {
    double s = seconds_since(&t0);
    printf("trained %d steps in %.2f s (%.0f steps/s)\n", o->steps, s, o->steps / s);
  }
  free(batch);
}

/* Every rank sees the same flags and size, so all of them agree here. */
static int check_fault_ranks(const job *j, const options *o) {
  const faults *f = &o->fault;
  const struct {
    const char *flag;
    int rank;
  } ranks[] = {{"--crash-rank", f->crash_rank},
               {"--hang-rank", f->hang_rank},
               {"--desync-rank", f->desync_rank},
               {"--slow-rank", f->slow_rank}};
  for (size_t k = 0; k < sizeof ranks / sizeof ranks[0]; k++)
    if (ranks[k].rank >= j->size) {
      fprintf(stderr,
              "rank %d: %s %d is not a rank of this job of %d ranks (valid: 0..%d); the fault "
              "would never happen\n",
              j->rank, ranks[k].flag, ranks[k].rank, j->size, j->size - 1);
      return -1;
    }
  if (j->rank == f->slow_rank)
    fprintf(stderr,
            "rank %d: --slow-rank %d --slow-ms %d: sleeping %d ms before every backward pass "
            "(a straggler)\n",
            j->rank, j->rank, f->slow_ms, f->slow_ms);
  return 0;
}

int main(int argc, char **argv) {
  options o;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) return rc;

  job j = {0};
  gs_status st = gs_init(NULL, &j.ctx);
  if (st != GS_OK) {
    fprintf(stderr, "gradsync-train: cannot join the job: %s: %s\n", gs_status_str(st),
            gs_last_error(NULL));
    return 1;
  }
  j.rank = gs_rank(j.ctx);
  j.size = gs_size(j.ctx);
  if (check_fault_ranks(&j, &o) != 0) {
    gs_shutdown(j.ctx);
    return 2;
  }

  static dataset d;
  mlp m;
  dataset_generate(&d, o.seed);
  if (dataset_shard(&d, j.rank, j.size) != 0 || mlp_init(&m, &o, j.rank, o.batch) != 0) {
    fprintf(stderr, "rank %d: out of memory\n", j.rank);
    gs_shutdown(j.ctx);
    return 1;
  }
  /* Model parallelism: the tower's gradients stay on this rank. */
  for (int l = 0; l < m.nl; l++) {
    const char *names[2] = {m.fc[l].wname, m.fc[l].bname};
    for (int k = 0; k < 2 && m.fc[l].local; k++) {
      st = gs_register_local(j.ctx, names[k]);
      if (st != GS_OK) fail(&j, NULL, "gs_register_local", names[k], st);
    }
  }
  train(&j, &o, &m, &d);
  evaluate(&j, &m, &d);
  int same = check_identical(&j, &m);
  int towers = check_towers(&j, &m, o.steps); /* collective: every rank runs both */
  rc = same == 0 && towers == 0 ? 0 : 1;

  st = gs_shutdown(j.ctx);
  if (st != GS_OK && rc == 0) {
    fprintf(stderr, "rank %d: gs_shutdown failed: %s: %s\n", j.rank, gs_status_str(st),
            gs_last_error(NULL));
    rc = 1;
  }
  mlp_free(&m);
  free(d.shard);
  return rc;
}
