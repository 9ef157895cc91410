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
#define N_LAYERS 3
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
  faults fault;
} options;

#define DESYNC_SUFFIX ".desync"

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
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
  int *shard; /* indices i with i % size == rank */
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
  float *w, *b;   /* w[out][in] */
  float *gw, *gb; /* gradients, averaged in place by gradsync */
} layer;

/* Activations of one batch: act[0] is the input, act[l+1] the output of
 * layer l (after ReLU for the hidden layers, the logits for the last). */
typedef struct mlp {
  layer fc[N_LAYERS];
  float *act[N_LAYERS + 1];
  float *delta[N_LAYERS + 1]; /* d loss / d pre-activation of each layer's output */
  int batch_cap;
} mlp;

static int mlp_init(mlp *m, uint64_t seed, int batch_cap) {
  static const int width[N_LAYERS + 1] = {N_FEATURES, HIDDEN, HIDDEN, N_CLASSES};
  rng r = rng_make(seed, 2);
  memset(m, 0, sizeof *m);
  m->batch_cap = batch_cap;
  for (int l = 0; l < N_LAYERS; l++) {
    layer *L = &m->fc[l];
    L->in = width[l];
    L->out = width[l + 1];
    snprintf(L->wname, sizeof L->wname, "fc%d/weight", l + 1);
    snprintf(L->bname, sizeof L->bname, "fc%d/bias", l + 1);
    size_t nw = (size_t)L->in * (size_t)L->out;
    L->w = malloc(nw * sizeof(float));
    L->gw = malloc(nw * sizeof(float));
    L->b = calloc((size_t)L->out, sizeof(float));
    L->gb = calloc((size_t)L->out, sizeof(float));
    if (!L->w || !L->gw || !L->b || !L->gb) return -1;
    float scale = sqrtf(2.0f / (float)L->in); /* He initialisation for ReLU */
    for (size_t i = 0; i < nw; i++) L->w[i] = scale * rng_gauss(&r);
  }
  for (int l = 0; l <= N_LAYERS; l++) {
    m->act[l] = malloc(sizeof(float) * (size_t)batch_cap * (size_t)width[l]);
    m->delta[l] = malloc(sizeof(float) * (size_t)batch_cap * (size_t)width[l]);
    if (!m->act[l] || !m->delta[l]) return -1;
  }
  return 0;
}

static void mlp_free(mlp *m) {
  for (int l = 0; l < N_LAYERS; l++) {
    free(m->fc[l].w);
    free(m->fc[l].gw);
    free(m->fc[l].b);
    free(m->fc[l].gb);
  }
  for (int l = 0; l <= N_LAYERS; l++) {
    free(m->act[l]);
    free(m->delta[l]);
  }
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

/* Forward pass over samples idx[0..n). Fills act[]; returns the summed loss
 * and adds the number of correct predictions to *correct. When delta_out is
 * set, also writes d(mean loss)/d(logits) into m->delta[N_LAYERS]. */
static double mlp_forward(mlp *m, const dataset *d, const int *idx, int n, int *correct,
                          int delta_out) {
  for (int s = 0; s < n; s++) memcpy(m->act[0] + s * N_FEATURES, d->x[idx[s]], sizeof d->x[0]);
  for (int l = 0; l < N_LAYERS; l++)
    layer_forward(&m->fc[l], m->act[l], m->act[l + 1], n, l < N_LAYERS - 1);
  double loss = 0.0;
  for (int s = 0; s < n; s++) {
    const float *z = m->act[N_LAYERS] + s * N_CLASSES;
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
        m->delta[N_LAYERS][s * N_CLASSES + k] = (float)((p[k] / sum - (k == y)) / n);
  }
  return loss;
}

/* Gradients of layer l from delta[l+1] (its output's error) and act[l] (its
 * input); then, unless l is the first layer, delta[l] for the layer below. */
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
  if (l == 0) return;
  float *dx = m->delta[l];
  for (int s = 0; s < n; s++) {
    for (int i = 0; i < L->in; i++) {
      float g = 0.0f;
      if (x[s * L->in + i] > 0.0f) /* ReLU of the layer below */
        for (int o = 0; o < L->out; o++) g += dy[s * L->out + o] * L->w[(size_t)o * L->in + i];
      dx[s * L->in + i] = g;
    }
  }
}

static void sgd_update(mlp *m, float lr) {
  for (int l = 0; l < N_LAYERS; l++) {
    layer *L = &m->fc[l];
    size_t nw = (size_t)L->in * (size_t)L->out;
    for (size_t i = 0; i < nw; i++) L->w[i] -= lr * L->gw[i];
    for (int o = 0; o < L->out; o++) L->b[o] -= lr * L->gb[o];
  }
}

/* FNV-1a over every parameter byte, masked to 62 bits (a positive int64). */
static int64_t mlp_checksum(const mlp *m) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int l = 0; l < N_LAYERS; l++) {
    const layer *L = &m->fc[l];
    const unsigned char *parts[2] = {(const unsigned char *)L->w, (const unsigned char *)L->b};
    size_t lens[2] = {sizeof(float) * (size_t)L->in * (size_t)L->out,
                      sizeof(float) * (size_t)L->out};
    for (int p = 0; p < 2; p++)
      for (size_t i = 0; i < lens[p]; i++) h = (h ^ parts[p][i]) * 0x100000001b3ull;
  }
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
  gs_allreduce_opts opts = {.shape = shape, .ndim = ndim};
  gs_handle *h = NULL;
  gs_status st =
      gs_allreduce_async(j->ctx, name, buf, buf, count, GS_FLOAT32, GS_AVERAGE, &opts, &h);
  if (st != GS_OK) fail(j, NULL, "allreduce", name, st);
  return h;
}

static void wait_and_free(job *j, gs_handle *h, const char *name) {
  gs_status st = gs_wait(h, WAIT_MS);
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
 * backward produces them. The fault flags act here. */
static double train_step(job *j, const options *o, int step, mlp *m, const dataset *d,
                         const int *idx, int n, int *correct) {
  const faults *f = &o->fault;
  gs_handle *pending[2 * N_LAYERS];
  char names[2 * N_LAYERS][sizeof m->fc[0].wname + sizeof DESYNC_SUFFIX];
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
  for (int l = N_LAYERS - 1; l >= 0; l--) {
    layer *L = &m->fc[l];
    layer_backward(m, l, n);
    int64_t wshape[2] = {L->out, L->in}, bshape[1] = {L->out};
    const char *sfx = desync ? DESYNC_SUFFIX : "";
    snprintf(names[np], sizeof names[np], "%s%s", L->wname, sfx);
    pending[np] = start_average(j, names[np], L->gw, wshape, 2);
    np++;
    snprintf(names[np], sizeof names[np], "%s%s", L->bname, sfx);
    pending[np] = start_average(j, names[np], L->gb, bshape, 1);
    np++;
    if (l == N_LAYERS - 2 && j->rank == f->crash_rank && step == f->crash_step)
      crash_now(j, step, pending[0]);
  }
  for (int i = 0; i < np; i++) wait_and_free(j, pending[i], names[i]);
  sgd_update(m, o->lr);
  return loss;
}

/* ---- command line --------------------------------------------------------- */

static void usage(FILE *f) {
  fputs("usage: gradsync-train [--steps N] [--seed S] [--batch B] [--lr X] [--log-every K]\n"
        "\n"
        "The gradsync demo job: data-parallel SGD of an MLP 16-64-64-4 on a synthetic\n"
        "4-class data set of 4096 points, sharded over the ranks. Run it under\n"
        "gradsync-run, e.g.  gradsync-run -np 4 gradsync-train\n"
        "\n"
        "  --steps N      training steps (default 300)\n"
        "  --seed S       seed of the data set and of the initial parameters (default 1)\n"
        "  --batch B      minibatch per rank (default 32)\n"
        "  --lr X         SGD learning rate (default 0.1)\n"
        "  --log-every K  log every K steps (default: every epoch, at most 10 lines)\n"
        "  -h, --help     show this help\n"
        "\n"
        "Fault injection, to reproduce failures (see docs/troubleshooting.md); steps count\n"
        "from 1, as in the log lines:\n"
        "  --crash-rank R --crash-step S    rank R exits with status 3 in the middle of step\n"
        "                                   S, after submitting some of its gradients\n"
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
    const char *eq = strchr(a, '=');
    size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    const char *key = NULL;
    const int_flag *iflag = NULL;
    static const char *const other[] = {"--seed", "--lr"};
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

/* Returns 0 if the parameters are bit-identical on every rank. If not, the
 * ranks that differ from the majority say so: min and max of the checksums
 * tell whether they differ, a count of the ranks holding each tells who. */
static int check_identical(job *j, const mlp *m) {
  int64_t mine = mlp_checksum(m), lo = mine, hi = mine;
  allreduce_now(j, "checksum/min", &lo, 1, GS_INT64, GS_MIN);
  allreduce_now(j, "checksum/max", &hi, 1, GS_INT64, GS_MAX);
  if (lo == hi) {
    if (j->rank == 0)
      printf("parameters identical on all %d ranks (checksum 0x%" PRIx64 ")\n", j->size,
             (uint64_t)mine);
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

static void train(job *j, const options *o, mlp *m, dataset *d) {
  int steps_per_epoch = (N_SAMPLES / j->size) / o->batch;
  if (steps_per_epoch < 1) steps_per_epoch = 1;
  int log_every = o->log_every;
  if (log_every == 0) { /* every epoch, but at least ~10 lines per run */
    log_every = (o->steps + 9) / 10;
    if (log_every > steps_per_epoch) log_every = steps_per_epoch;
  }
  if (j->rank == 0)
    printf("gradsync-train: %d ranks, %d samples (%d per rank), MLP %d-%d-%d-%d, batch %d per "
           "rank, lr %g, %d steps (%d per epoch)\n",
           j->size, N_SAMPLES, N_SAMPLES / j->size, N_FEATURES, HIDDEN, HIDDEN, N_CLASSES, o->batch,
           (double)o->lr, o->steps, steps_per_epoch);
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
  if (dataset_shard(&d, j.rank, j.size) != 0 || mlp_init(&m, o.seed, o.batch) != 0) {
    fprintf(stderr, "rank %d: out of memory\n", j.rank);
    gs_shutdown(j.ctx);
    return 1;
  }
  train(&j, &o, &m, &d);
  evaluate(&j, &m, &d);
  rc = check_identical(&j, &m) == 0 ? 0 : 1;

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
