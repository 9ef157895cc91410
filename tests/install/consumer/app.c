/* A program built against an installed gradsync (tests/install/test_install.sh):
 * the README's example, plus a check of the averaged values so that the
 * test proves the library works, not only that it links. Run it under
 * gradsync-run -np N. */
#include <gradsync.h>
#include <stdio.h>

int main(void) {
  float grad[4];
  size_t n = 4;
  /* --- the README's example --- */
  gs_ctx *ctx;
  if (gs_init(NULL, &ctx) != GS_OK) { /* settings from the environment */
    fprintf(stderr, "%s\n", gs_last_error(NULL));
    return 1;
  }
  for (size_t i = 0; i < n; i++) grad[i] = (float)(gs_rank(ctx) + 1) * (float)(i + 1);
  gs_handle *h;
  gs_allreduce_async(ctx, "fc1/weight", grad, grad, n, GS_FLOAT32, GS_AVERAGE, NULL, &h);
  if (gs_wait(h, -1) != GS_OK) /* errors name tensor, ranks, what to do */
    fprintf(stderr, "%s\n", gs_handle_error(h));
  gs_handle_free(h);
  /* --- end of the example --- */
  int size = gs_size(ctx), rank = gs_rank(ctx), bad = 0;
  float mean_factor = (float)(size + 1) / 2.0f; /* average of 1..size */
  for (size_t i = 0; i < n; i++)
    if (grad[i] != mean_factor * (float)(i + 1)) {
      fprintf(stderr, "rank %d: fc1/weight[%zu] = %g, expected %g\n", rank, i, grad[i],
              mean_factor * (float)(i + 1));
      bad = 1;
    }
  gs_shutdown(ctx);
  if (!bad) printf("rank %d of %d: fc1/weight averaged correctly\n", rank, size);
  return bad;
}
