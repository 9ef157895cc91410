/* Fork detection: a process that forks after gs_init gives the child a copy
 * of every gs_ctx without the comm and exec threads, with ctx->mu possibly
 * held by a thread that does not exist there, and with the parent's
 * sockets (the coordinator's gRPC stream, the data plane). The child must
 * not use such a context, and must not harm the parent's by trying.
 *
 * A pthread_atfork child handler, installed once at the first gs_init,
 * bumps gs__fork_gen; each context remembers the value it was made with
 * (gs_init), so "made in another process" is one relaxed atomic load per
 * call (gs__forked), no getpid() on the submission path. The handler runs
 * in the child right after fork, in the forking thread: it only stores to
 * atomics and calls getppid (async-signal-safe). Nothing here runs in the
 * parent.
 *
 * gRPC cannot start again in a child forked while the parent's gRPC client
 * was live (gs__grpc_users > 0: a context, or a gs_init under way): its
 * threads are missing there and the child shares the parent's epoll set, so
 * a new gs_init in the child hung in gRPC's poller (the join's deadline
 * never fires) and could take events of the parent's connections. The
 * handler remembers that parent; gs__client_create refuses to start gRPC in
 * such a process (GS_ERR_FORKED). A child of a process that never called
 * gs_init, or whose every context was shut down, may call gs_init. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "gradsync.h"
#include "worker.h"

atomic_uint gs__fork_gen;
atomic_int gs__grpc_users;

/* The parent that forked this process (or an ancestor of it) while gRPC was
 * live there; 0 when none. Inherited by further children. */
static atomic_int grpc_forked_from;

static pthread_once_t watch_once = PTHREAD_ONCE_INIT;

static void in_child(void) {
  atomic_fetch_add_explicit(&gs__fork_gen, 1, memory_order_relaxed);
  if (atomic_load_explicit(&gs__grpc_users, memory_order_relaxed) > 0)
    atomic_store_explicit(&grpc_forked_from, (int)getppid(), memory_order_relaxed);
}

int gs__grpc_forked_from(void) {
  return atomic_load_explicit(&grpc_forked_from, memory_order_relaxed);
}

static void watch(void) {
  /* Fails only without memory for the handler (ENOMEM); then a forked
   * child is not detected, as before this existed. */
  (void)pthread_atfork(NULL, NULL, in_child);
}

void gs__fork_watch(void) {
  pthread_once(&watch_once, watch);
}

gs_status gs__fork_error(const gs_ctx *ctx, const char *fn, const char *tensor) {
  return gs__set_error(
      GS_ERR_FORKED,
      "%s%s%s%s%s: rank %d (host %s): this gradsync context was made by process %d "
      "before a fork; process %d (a forked child) cannot use it: call gradsync "
      "only from the process that called gs_init (fork before gs_init, or start "
      "child processes with exec, e.g. multiprocessing's 'spawn' start method); "
      "the parent's job is not affected",
      strncmp(fn, "gs_", 3) ? "gs_" : "", fn, tensor ? " (tensor '" : "", tensor ? tensor : "",
      tensor ? "')" : "", ctx->rank, ctx->host, ctx->pid, (int)getpid());
}
