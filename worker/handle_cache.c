/* Memory for op handles, recycled per thread: a submitting thread takes a
 * handle's block from its own list of blocks that handles freed on it left
 * behind, instead of calloc and free for every op (a step of a few hundred
 * ops allocates and frees them all again; glibc keeps only 7 blocks of a
 * size per thread for itself). A block on a list belongs to that list
 * alone (no handle points to it any more: its last reference is gone);
 * nothing refers to a context, so a handle freed after gs_shutdown
 * recycles like any other. Only threads that allocate handles keep a list
 * (the library's own threads free plainly), at most CACHE_MAX blocks; a
 * thread's list is freed when it exits.
 *
 * Built without the list under AddressSanitizer: a recycled block would
 * hide a use of a freed handle from it. Any thread; no locks. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

/* Blocks a thread keeps: a step's ops of most models (ResNet-50 161,
 * BERT-large ~400), 368 KB at most per submitting thread. */
#define CACHE_MAX 512

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CACHE_ON 0
#endif
#endif
#ifndef CACHE_ON
#define CACHE_ON 1
#endif

typedef struct block {
  struct block *next;
} block;

static __thread block *tl_head;
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
  while (tl_head) {
    block *b = tl_head;
    tl_head = b->next;
    free(b);
  }
  tl_n = 0;
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
  _Static_assert(sizeof(struct gs_handle) >= sizeof(block), "a handle holds a list link");
  if (CACHE_ON) {
    if (!tl_registered) {
      /* A thread without the destructor never keeps blocks. */
      tl_registered = 1;
      pthread_once(&key_once, key_make);
      tl_allocates = key_ok && pthread_setspecific(key, &tl_registered) == 0;
    }
    block *b = tl_head;
    if (b) {
      tl_head = b->next;
      tl_n--;
      memset(b, 0, sizeof(struct gs_handle));
      return b;
    }
  }
  return calloc(1, sizeof(struct gs_handle));
}

void gs__handle_mem_free(void *p) {
  if (CACHE_ON && p && tl_allocates && tl_n < CACHE_MAX) {
    block *b = p;
    b->next = tl_head;
    tl_head = b;
    tl_n++;
    return;
  }
  free(p);
}
