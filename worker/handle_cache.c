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
 * tests/unit/test_handle_cache.c checks both checkers.
 * Any thread; no locks. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

/* Blocks a thread keeps: a step's ops of most models (ResNet-50 161,
 * BERT-large ~400), 368 KB at most per submitting thread, plus 4 KB of
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
 * cached block. */
static __thread void **tl_blocks;
static __thread unsigned tl_n;
static __thread int tl_allocates; /* this thread allocated a handle */
static __thread int tl_registered;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static int key_ok;

/* At thread exit: frees the thread's blocks; a handle freed later on it
 * (another destructor) is freed plainly. */
static void thread_exit(void *unused) {
  (void)unused;
  tl_allocates = 0;
  while (tl_n) {
    void *b = tl_blocks[--tl_n];
    UNPOISON(b, sizeof(struct gs_handle));
    VG_DEFINED(b, sizeof(struct gs_handle));
    free(b);
  }
  free(tl_blocks);
  tl_blocks = NULL;
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

void *gs__handle_mem(void) {
  if (!tl_registered) {
    /* A thread without the destructor never keeps blocks. */
    tl_registered = 1;
    pthread_once(&key_once, key_make);
    tl_allocates = key_ok && pthread_setspecific(key, &tl_registered) == 0;
  }
  if (tl_n) {
    void *b = tl_blocks[--tl_n];
    UNPOISON(b, sizeof(struct gs_handle));
    VG_DEFINED(b, sizeof(struct gs_handle)); /* zeroed next: defined, as calloc's */
    memset(b, 0, sizeof(struct gs_handle));
    return b;
  }
  return calloc(1, sizeof(struct gs_handle));
}

void gs__handle_mem_free(void *p) {
  if (p && tl_allocates && tl_n < CACHE_MAX) {
    if (!tl_blocks) tl_blocks = malloc(CACHE_MAX * sizeof *tl_blocks);
    if (tl_blocks) {
      tl_blocks[tl_n++] = p;
      POISON(p, sizeof(struct gs_handle));
      VG_NOACCESS(p, sizeof(struct gs_handle));
      return;
    }
  }
  free(p);
}
