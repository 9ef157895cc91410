/* gs-det-worker: a training-like loop for the deterministic-mode test.
 *
 *   gs-det-worker TIMING_SEED
 *
 * Every rank holds the same 40 "parameter" tensors of odd sizes (1 to
 * 30011 float32 elements, 0.6 M in all). Each of 4 steps it makes a
 * gradient per tensor from its parameters and a rank-specific noise of
 * mixed magnitudes, submits the 40 averages in an order and with pauses
 * drawn from TIMING_SEED (so fusion groups differ between runs), waits for
 * all, and applies plain SGD. In the first step it also checks every
 * averaged element against ((g0 + g1) + g2 + ...) / size computed locally
 * in rank order (every rank can make every rank's gradient). At the end it
 * prints the FNV-1a hash of all parameters' bytes:
 *   "rank-order: ok" and "checksum: 0123456789abcdef"
 * Exit 0, or 1 with the library's message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradsync.h"

#define NT 40
#define STEPS 4

static uint32_t xs(uint32_t *s) {
  *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
  return *s;
}

static size_t tensor_len(int t) {
  return t % 5 == 0 ? 1 + (size_t)t : 30011 - (size_t)t * 613;
}

/* Rank r's noise for element i of tensor t at step s: mixed magnitudes so
 * that the order of the additions shows in the last bits. */
static float noise(int r, int s, int t, size_t i) {
  uint32_t x =
      0x9e3779b9u ^ (uint32_t)(r * 1000003 + s * 7919 + t * 104729) ^ (uint32_t)i * 2654435761u;
  x = x ? x : 1;
  xs(&x), xs(&x);
  float v = (float)(x % 200001) / 100000.0f - 1.0f;
  return (x >> 20) % 3 ? v : v * 3e-5f;
}

static float grad(const float *p, int r, int s, int t, size_t i) {
  return 0.5f * p[i] + noise(r, s, t, i);
}

static void pause_us(uint32_t *seed, int max_us) {
  struct timespec ts = {0, (long)(xs(seed) % (uint32_t)max_us) * 1000L};
  nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
  uint32_t seed = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) * 2654435761u + 1 : 1;
  gs_ctx *ctx = NULL;
  if (gs_init(NULL, &ctx) != GS_OK) {
    fprintf(stderr, "gs_init: %s\n", gs_last_error(NULL));
    return 1;
  }
  int me = gs_rank(ctx), n = gs_size(ctx);
  float *param[NT], *g[NT];
  for (int t = 0; t < NT; t++) {
    size_t len = tensor_len(t);
    param[t] = malloc(len * sizeof(float));
    g[t] = malloc(len * sizeof(float));
    for (size_t i = 0; i < len; i++) param[t][i] = noise(999, 0, t, i);
  }
  long bad = 0;
  int status = 0;
  for (int s = 0; s < STEPS && !status; s++) {
    int order[NT];
    for (int t = 0; t < NT; t++) order[t] = t;
    for (int t = NT - 1; t > 0; t--) { /* the same order on every rank, new per run */
      uint32_t k = xs(&seed) % (uint32_t)(t + 1);
      int tmp = order[t];
      order[t] = order[k], order[k] = tmp;
    }
    gs_handle *h[NT];
    int nsub = 0;
    for (int k = 0; k < NT; k++) {
      int t = order[k];
      size_t len = tensor_len(t);
      for (size_t i = 0; i < len; i++) g[t][i] = grad(param[t], me, s, t, i);
      char name[32];
      snprintf(name, sizeof name, "grad/%d", t);
      if (gs_allreduce_async(ctx, name, g[t], g[t], len, GS_FLOAT32, GS_AVERAGE, NULL, &h[k]) !=
          GS_OK) {
        fprintf(stderr, "rank %d: allreduce %s: %s\n", me, name, gs_last_error(ctx));
        status = 1;
        break;
      }
      nsub++;
      if (xs(&seed) % 4 == 0) pause_us(&seed, 3000);
    }
    for (int k = 0; k < nsub; k++) { /* every handle waited for and freed, also after an error */
      if (gs_wait(h[k], 60000) != GS_OK && !status) {
        fprintf(stderr, "rank %d: %s\n", me, gs_handle_error(h[k]));
        status = 1;
      }
      gs_handle_free(h[k]);
    }
    if (status) break;
    for (int t = 0; t < NT; t++) {
      size_t len = tensor_len(t);
      for (size_t i = 0; i < len; i++) {
        if (s == 0) {
          volatile float acc = grad(param[t], 0, s, t, i);
          for (int r = 1; r < n; r++) acc = acc + grad(param[t], r, s, t, i);
          acc = acc / (float)n;
          if (memcmp((const void *)&acc, &g[t][i], sizeof acc) != 0) bad++;
        }
        param[t][i] -= 0.1f * g[t][i];
      }
    }
  }
  if (!status) {
    uint64_t hsh = 1469598103934665603ull;
    for (int t = 0; t < NT; t++) {
      const unsigned char *b = (const unsigned char *)param[t];
      for (size_t i = 0; i < tensor_len(t) * sizeof(float); i++)
        hsh = (hsh ^ b[i]) * 1099511628211ull;
    }
    if (bad)
      printf("rank-order: %ld elements differ from the rank-order average\n", bad);
    else
      printf("rank-order: ok\n");
    printf("checksum: %016llx\n", (unsigned long long)hsh);
    fflush(stdout);
  }
  for (int t = 0; t < NT; t++) free(param[t]), free(g[t]);
  gs_shutdown(ctx);
  return status;
}
