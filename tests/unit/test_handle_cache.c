/* Unit tests of the per-thread handle cache (worker/handle_cache.c): a
 * block given back is handed out again on the same thread, zeroed before
 * its request; other threads keep their own lists; a thread's list is
 * freed when it exits (the leak checkers of the ASan build and
 * tests/valgrind.sh see it); and while a block sits in a list the memory
 * checkers treat it as freed: poisoned under AddressSanitizer, no-access
 * under valgrind memcheck.
 *
 * `test_handle_cache uaf` reads a handle's block after giving it back, as a
 * use of a handle after gs_handle_free would: ctest runs it expecting
 * AddressSanitizer's "use-after-poison" report (the sanitizer build) or
 * valgrind's "Invalid read" (the plain build, under valgrind); the program
 * says so and fails when neither stopped it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif
#ifdef T_ASAN
#include <sanitizer/asan_interface.h>
#endif
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define T_VALGRIND 1
#endif
#endif

#define HSIZE sizeof(struct gs_handle)

/* Whether the memory checker in use sees [p, p + HSIZE) as inaccessible
 * (1), accessible (0), or cannot tell (-1: neither ASan nor valgrind). */
static int block_inaccessible(const void *p) {
#ifdef T_ASAN
  return __asan_region_is_poisoned((void *)p, HSIZE) != NULL;
#elif defined(T_VALGRIND)
  if (!RUNNING_ON_VALGRIND) return -1;
  unsigned char vbits[sizeof(struct gs_handle)];
  /* 3: some byte is not addressable (no error report, unlike CHECK_MEM) */
  return VALGRIND_GET_VBITS(p, vbits, HSIZE) == 3;
#else
  (void)p;
  return -1;
#endif
}

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* Given back and taken again on one thread: the same block (the most
 * recent first), 64-byte aligned, zero up to the request (gs__op_new
 * writes that), and inaccessible only while it is in the list. */
static void test_reused_zeroed_and_poisoned_meanwhile(void **state) {
  (void)state;
  unsigned char *a = gs__handle_mem(), *b = gs__handle_mem();
  assert_non_null(a);
  assert_non_null(b);
  assert_int_not_equal(block_inaccessible(a), 1);
  memset(a, 0xa5, HSIZE);
  memset(b, 0x5a, HSIZE);
  gs__handle_mem_free(a);
  gs__handle_mem_free(b);
  int checker = block_inaccessible(a);
  if (checker >= 0) {
    assert_int_equal(checker, 1);
    assert_int_equal(block_inaccessible(b), 1);
  }
  unsigned char *c = gs__handle_mem(), *d = gs__handle_mem();
  assert_ptr_equal(c, b); /* last in, first out */
  assert_ptr_equal(d, a);
  if (checker >= 0) {
    assert_int_equal(block_inaccessible(c), 0);
    assert_int_equal(block_inaccessible(d), 0);
  }
  assert_true(all_zero(c, GS__HANDLE_HEADER));
  assert_true(all_zero(d, GS__HANDLE_HEADER));
  assert_int_equal((uintptr_t)c % 64, 0);
  assert_int_equal((uintptr_t)d % 64, 0);
  assert_int_equal((uintptr_t)a % 64, 0);
  gs__handle_mem_free(c);
  gs__handle_mem_free(d);
  gs__handle_mem_free(NULL); /* a no-op */
}

/* A thread that allocates keeps its own list: a block it gives back is not
 * handed to another thread, and its list goes when it exits (else the leak
 * checkers report the blocks). */
typedef struct {
  void *mine[8];
  void *again[8];
} thread_blocks;

static void *alloc_free_alloc(void *arg) {
  thread_blocks *t = arg;
  for (int i = 0; i < 8; i++) t->mine[i] = gs__handle_mem();
  for (int i = 0; i < 8; i++) gs__handle_mem_free(t->mine[i]);
  for (int i = 0; i < 8; i++) t->again[i] = gs__handle_mem();
  for (int i = 0; i < 8; i++) gs__handle_mem_free(t->again[i]);
  return NULL; /* its 8 cached blocks are freed at exit */
}

static void test_lists_are_per_thread(void **state) {
  (void)state;
  void *main_block = gs__handle_mem();
  assert_non_null(main_block);
  gs__handle_mem_free(main_block); /* on the main thread's list */
  thread_blocks t;
  memset(&t, 0, sizeof t);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, alloc_free_alloc, &t), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  for (int i = 0; i < 8; i++) {
    assert_non_null(t.mine[i]);
    assert_ptr_not_equal(t.mine[i], main_block);
    assert_ptr_equal(t.again[i], t.mine[7 - i]); /* its own blocks, most recent first */
  }
  void *back = gs__handle_mem();
  assert_ptr_equal(back, main_block);
  gs__handle_mem_free(back);
}

/* A block that held another op's handle, given out again: gs__op_new
 * writes only what the new request uses (its name to the NUL, its shape to
 * ndim, every scalar), so every field must read as the new op's, equal to
 * a request built from scratch, and every header field as a fresh
 * handle's, whatever the old one left (a longer name, more dimensions, a
 * broadcast's root, scales, a group, results). */
static void test_reused_block_holds_only_the_new_op(void **state) {
  (void)state;
  gs_ctx *ctx = calloc(1, sizeof *ctx); /* gs__op_new only keeps the pointer */
  assert_non_null(ctx);
  const char *long_name = "model/encoder/layer.11/attention/output/dense/weight.grad";
  const int64_t old_shape[4] = {2, 3, 4, 5};
  struct gs_handle *a = NULL;
  assert_int_equal(gs__op_new(ctx, long_name, GS__OP_BROADCAST, GS_FLOAT64, old_shape, 4, &a),
                   GS_OK);
  a->req.root_rank = 3;
  a->req.reduce_op = GS__MAX;
  a->req.prescale = 0.5;
  a->req.postscale = 4.0;
  a->req.group_id = 77;
  a->req.group_size = 2;
  a->req.device = GS__DEVICE_GPU;
  a->result = malloc(16);
  a->result_bytes = 16;
  a->rank_dims = malloc(2 * sizeof *a->rank_dims);
  a->nrank_dims = 2;
  a->splits = malloc(8);
  a->error = strdup("old error");
  a->join_last = 1;
  a->wait_last_ms = 5;
  a->fast_id = 9;
  a->compress = 1;
  atomic_store(&a->done, 1);
  gs__handle_unref_n(a, 2); /* the caller's and the library's: back to the cache */

  const int64_t shape[1] = {7};
  struct gs_handle *b = NULL;
  assert_int_equal(gs__op_new(ctx, "b", GS__OP_ALLREDUCE, GS_INT32, shape, 1, &b), GS_OK);
  assert_ptr_equal(b, a); /* the same block: the test is about its leftovers */
  gs__tensor_request want;
  gs__tensor_request_init(&want);
  snprintf(want.name, sizeof want.name, "b");
  want.op = GS__OP_ALLREDUCE;
  want.dtype = GS__INT32;
  want.ndim = 1;
  want.shape[0] = 7;
  assert_string_equal(b->req.name, "b");
  assert_true(gs__tensor_request_equal(&b->req, &want));
  assert_int_equal(b->req.root_rank, 0);
  assert_int_equal(b->req.group_id, 0);
  assert_int_equal(b->req.group_size, 0);
  assert_true(b->req.prescale == 1.0 && b->req.postscale == 1.0);
  assert_int_equal(b->count, 7);
  assert_int_equal(atomic_load(&b->refs), 2);
  assert_int_equal(atomic_load(&b->done), 0);
  assert_null(b->error);
  assert_null(b->result);
  assert_int_equal(b->result_bytes, 0);
  assert_null(b->rank_dims);
  assert_int_equal(b->nrank_dims, 0);
  assert_null(b->splits);
  assert_int_equal(b->join_last, 0);
  assert_int_equal(b->wait_last_ms, 0);
  assert_int_equal(b->fast_id, 0);
  assert_int_equal(b->compress, 0);
  gs__handle_unref_n(b, 2);
  free(ctx);
}

/* A handle used after it went back to the cache: must be a report. */
static int use_after_free(void) {
  volatile unsigned char *h = gs__handle_mem();
  if (!h) return 2;
  h[sizeof(void *) + 1] = 7;
  gs__handle_mem_free((void *)h);
  unsigned char seen = h[sizeof(void *) + 1]; /* the deliberate use after free */
#ifdef T_VALGRIND
  if (RUNNING_ON_VALGRIND) {
    /* valgrind reports and goes on: its "Invalid read" above, if any, is
     * what ctest looks for */
    fprintf(stderr,
            "test_handle_cache uaf: read byte %u of a handle after it went back to the "
            "cache\n",
            seen);
    return 1;
  }
#endif
  fprintf(stderr,
          "test_handle_cache uaf: read byte %u of a handle after it went back to the cache and "
          "no memory checker stopped it: the cache does not poison its blocks (or this runs "
          "without ASan and outside valgrind)\n",
          seen);
  return 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "uaf")) return use_after_free();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reused_zeroed_and_poisoned_meanwhile),
      cmocka_unit_test(test_lists_are_per_thread),
      cmocka_unit_test(test_reused_block_holds_only_the_new_op),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
