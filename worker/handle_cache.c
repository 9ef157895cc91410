/* Memory for op handles, recycled per thread: a submitting thread takes a
 * handle's block from its own list of blocks that handles freed on it left
 * behind, instead of calloc and free for every op (a step of a few hundred
 * ops allocates and frees them all again; glibc keeps only 7 blocks of a
 * size per thread for itself). A block on a list belongs to that list
 * alone (no handle points to it any more: its last reference is gone);
 * nothing refers to a context, so a handle freed after gs_shutdown
 * recycles like any other. Only threads that allocate handles keep a list
 * (the library's own threads free plainly), at most CACHE_MAX blocks; a
 * thread's list is freed when it exits (the main thread's stays until the
 * process ends, reachable).
 *
 * The memory checkers see a block on a list as freed: under
 * AddressSanitizer it is poisoned, under valgrind memcheck it is no-access
 * (a client request, a few instructions when not under valgrind), from the
 * moment it goes on the list until it is handed out again, so reading or
 * writing a handle after its last gs_handle_free is a report
 * ("use-after-poison", "Invalid read") although the memory is not free()d.
 * The lists hold pointers to the blocks, never links inside them.
 *
 * A block handed out is 64-byte aligned and zero before its request
 * (GS__HANDLE_HEADER), not whole: the request is written by gs__op_new as
 * far as it is used. The hot header (GS__HANDLE_HOT, 2 cache lines) is
 * zeroed here; the cold fields after it were zeroed when the block came
 * back (the handle's free has just read them: their lines are at hand
 * then, where zeroing them at the next submission meant fetching them
 * again, in the burst of a step's submissions). Zeroing all 744 bytes
 * cost a submission 12 lines; this, 2 (3 until session 25).
 * tests/unit/test_handle_cache.c checks both checkers.
 * Any thread; no locks. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

/* Blocks a thread keeps: a step's ops of most models (ResNet-50 161,
 * BERT-large ~400), 384 KB at most per submitting thread, plus 4 KB of
 * pointers. */
#define CACHE_MAX 512

#if defined(__SANITIZE_ADDRESS__)
#define GS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GS_ASAN 1
#endif
#endif

#ifdef GS_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* valgrind: the header comes with the valgrind package (a build without it
 * only loses the client requests). */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define GS_VALGRIND 1
#endif
#endif
#ifdef GS_VALGRIND
#define VG_NOACCESS(p, n) VALGRIND_MAKE_MEM_NOACCESS((p), (n))
#define VG_DEFINED(p, n) VALGRIND_MAKE_MEM_DEFINED((p), (n))
#else
#define VG_NOACCESS(p, n) ((void)(p), (void)(n))
#define VG_DEFINED(p, n) ((void)(p), (void)(n))
#endif

/* A thread's cached blocks: a stack of pointers outside the blocks, so that
 * a cached block is poisoned whole and the leak checkers still see it
 * (LeakSanitizer skips pointers stored in poisoned memory: a list linked
 * through the blocks read as leaked at exit). Allocated at its first
 * cached block. One struct, whose address each function takes once (the
 * compiler computed it again after every call: three __tls_get_addr
 * calls in gs__handle_mem), reached through a TLS descriptor where the
 * compiler has them (CMakeLists.txt: -mtls-dialect=gnu2 for this file,
 * not a __tls_get_addr call). Not the initial-exec TLS model: Python loads the
 * library with dlopen after libraries that took the static TLS block's
 * spare room, and the load then fails ("cannot allocate memory in static
 * TLS block"). */
typedef struct {
  void **blocks;
  unsigned n;
  int allocates; /* this thread allocated a handle */
  int registered;
} thread_cache;
static __thread thread_cache tl;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static int key_ok;

/* At thread exit: frees the thread's blocks; a handle freed later on it
 * (another destructor) is freed plainly. */
static void thread_exit(void *unused) {
  (void)unused;
  tl.allocates = 0;
  while (tl.n) {
    void *b = tl.blocks[--tl.n];
    UNPOISON(b, sizeof(struct gs_handle));
    VG_DEFINED(b, sizeof(struct gs_handle));
    free(b);
  }
  free(tl.blocks);
  tl.blocks = NULL;
}

static void key_make(void) {
  key_ok = pthread_key_create(&key, thread_exit) == 0;
}

/* Unloading the library (dlclose) must not leave a destructor behind:
 * the lists of threads still running then are leaked instead. */
__attribute__((destructor)) static void unload(void) {
  if (key_ok) pthread_key_delete(key);
  key_ok = 0;
}

typedef uint64_t zero_vec __attribute__((vector_size(32)));

/* Zeroes a block's cold fields. Their first line holds the waited-on
 * fields, which a wait that found the op pending wrote (most ops of a
 * step): zeroed with two vector stores, no test. The rest is mostly zero
 * already (an allreduce sets none of it): storing only when some word is
 * not keeps the free from dirtying more lines per handle (an
 * unconditional memset here cost the free 12 ns). */
static void cold_zero(void *p) {
  const zero_vec z = {0, 0, 0, 0};
  unsigned char *c = (unsigned char *)p + GS__HANDLE_HOT;
  memcpy(c, &z, sizeof z);
  memcpy(c + sizeof z, &z, sizeof z);
  uint64_t any = 0;
  for (size_t i = 64; i < GS__HANDLE_HEADER - GS__HANDLE_HOT; i += 8) {
    uint64_t w;
    memcpy(&w, c + i, 8);
    any |= w;
  }
  if (any) memset(c + 64, 0, GS__HANDLE_HEADER - GS__HANDLE_HOT - 64);
}

/* Zeroes a block's hot header with vector stores written out: a memset
 * of its 192 bytes (then) compiled to "rep stosq", whose start-up was most of
 * this function's time (perf annotate: 55% of its samples on the
 * instruction after it). */
static void hot_zero(void *p) {
  const zero_vec z = {0, 0, 0, 0};
  _Static_assert(GS__HANDLE_HOT % sizeof z == 0, "whole vectors");
  for (size_t i = 0; i < GS__HANDLE_HOT; i += sizeof z) memcpy((char *)p + i, &z, sizeof z);
}

void *gs__handle_mem(void) {
  thread_cache *t = &tl; /* the thread's address once (see thread_cache) */
  if (!t->registered) {
    /* A thread without the destructor never keeps blocks. */
    t->registered = 1;
    pthread_once(&key_once, key_make);
    t->allocates = key_ok && pthread_setspecific(key, t) == 0;
  }
  if (t->n) {
    void *b = t->blocks[--t->n];
    UNPOISON(b, sizeof(struct gs_handle));
    /* defined, as a fresh block's: the cold part is zero, the request's
     * bytes past what gs__op_new writes are the last handle's */
    VG_DEFINED(b, sizeof(struct gs_handle));
    hot_zero(b);
    return b;
  }
  void *b = aligned_alloc(_Alignof(struct gs_handle), sizeof(struct gs_handle));
  if (b) memset(b, 0, sizeof(struct gs_handle)); /* once per block: all of it defined */
  return b;
}

void gs__handle_mem_free(void *p) {
  thread_cache *t = &tl;
  if (p && t->allocates && t->n < CACHE_MAX) {
    if (!t->blocks) t->blocks = malloc(CACHE_MAX * sizeof *t->blocks);
    if (t->blocks) {
      t->blocks[t->n++] = p;
      cold_zero(p);
      POISON(p, sizeof(struct gs_handle));
      VG_NOACCESS(p, sizeof(struct gs_handle));
      return;
    }
  }
  free(p);
}
