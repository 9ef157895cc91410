/* Fork detection (worker/fork.c) where it matters most and no real job can
 * show it deterministically: a context whose lock is held, at the fork, by
 * a thread of the parent (that thread does not exist in the child, so a
 * child that took the lock would hang for ever). Every call in the child
 * must fail at once with GS_ERR_FORKED naming rank, host and both pids,
 * without locking; the parent's context is unaffected. The context is
 * built by hand (no coordinator): only what the checked calls read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker.h"

typedef struct holder {
  gs_ctx *ctx;
  pthread_mutex_t mu; /* guards locked and release */
  pthread_cond_t cv;
  int locked, release;
} holder;

/* Takes ctx->mu and keeps it until told to let go. */
static void *hold_main(void *arg) {
  holder *x = arg;
  pthread_mutex_lock(&x->ctx->mu);
  pthread_mutex_lock(&x->mu);
  x->locked = 1;
  pthread_cond_broadcast(&x->cv);
  while (!x->release) pthread_cond_wait(&x->cv, &x->mu);
  pthread_mutex_unlock(&x->mu);
  pthread_mutex_unlock(&x->ctx->mu);
  return NULL;
}

/* In the child: 0 when st and the message are the fork error of call. */
static int child_check(gs_status st, const char *call, pid_t parent) {
  char want[512];
  snprintf(want, sizeof want,
           "%s: rank 3 (host node-7): this gradsync context was made by process %d before a "
           "fork; process %d (a forked child) cannot use it",
           call, (int)parent, (int)getpid());
  const char *msg = gs_last_error(NULL);
  if (st == GS_ERR_FORKED && strstr(msg, want)) return 0;
  printf("child: %s: status %d, message '%s'; wanted GS_ERR_FORKED and '%s'\n", call, (int)st, msg,
         want);
  fflush(stdout);
  return 1;
}

static void child_main(gs_ctx *ctx, gs_handle *pending, pid_t parent) {
  alarm(20); /* a call that locks hangs: SIGALRM ends the child, the parent sees it */
  int bad = 0;
  float x[4] = {0};
  gs_handle *h = NULL;
  bad |= child_check(gs_allreduce_async(ctx, "t2", x, x, 4, GS_FLOAT32, GS_SUM, NULL, &h),
                     "gs_allreduce (tensor 't2')", parent);
  bad |= h != NULL;
  bad |= child_check(gs_wait(pending, -1), "gs_wait (tensor 't1')", parent);
  int done = 1;
  bad |= child_check(gs_test(pending, &done), "gs_test (tensor 't1')", parent);
  bad |= done != 0;
  bad |= child_check(gs_barrier(ctx), "gs_barrier", parent);
  bad |= child_check(gs_register_local(ctx, "t3"), "gs_register_local (tensor 't3')", parent);
  gs_stats s;
  gs_stats_init(&s);
  bad |= child_check(gs_get_stats(ctx, &s), "gs_get_stats", parent);
  bad |= gs_is_local(ctx, "t3") != 0; /* nlocals is set: it would lock */
  bad |= child_check(gs_shutdown(ctx), "gs_shutdown", parent);
  _exit(bad ? 1 : 0);
}

static void test_child_never_locks(void **state) {
  (void)state;
  gs_ctx *ctx = calloc(1, sizeof *ctx);
  assert_non_null(ctx);
  ctx->rank = 3;
  ctx->size = 4;
  snprintf(ctx->host, sizeof ctx->host, "node-7");
  gs__fork_watch(); /* as gs_init */
  ctx->fork_gen = atomic_load(&gs__fork_gen);
  ctx->pid = (int)getpid();
  atomic_init(&ctx->nlocals, 1);
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->cv, NULL);
  int64_t n = 4;
  struct gs_handle *pending = NULL;
  assert_int_equal(gs__op_new(ctx, "t1", GS__OP_ALLREDUCE, GS_FLOAT32, &n, 1, &pending), GS_OK);
  assert_int_equal(gs__forked(ctx), 0);

  holder x = {.ctx = ctx};
  pthread_mutex_init(&x.mu, NULL);
  pthread_cond_init(&x.cv, NULL);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_main, &x), 0);
  pthread_mutex_lock(&x.mu);
  while (!x.locked) pthread_cond_wait(&x.cv, &x.mu);
  pthread_mutex_unlock(&x.mu);

  fflush(stdout);
  pid_t parent = getpid();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) child_main(ctx, pending, parent);
  int status = 0;
  pid_t got = 0;
  for (int i = 0; (got = waitpid(pid, &status, WNOHANG)) == 0 && i < 3000; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (got == 0) { /* the child's alarm is at 20 s: not expected */
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  if (WIFSIGNALED(status)) fail_msg("the child hung or crashed (signal %d)", WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  /* the parent: not forked, its lock still held by its thread, then freed */
  assert_int_equal(gs__forked(ctx), 0);
  pthread_mutex_lock(&x.mu);
  x.release = 1;
  pthread_cond_broadcast(&x.cv);
  pthread_mutex_unlock(&x.mu);
  pthread_join(t, NULL);
  pthread_mutex_lock(&ctx->mu); /* free again */
  pthread_mutex_unlock(&ctx->mu);
  free(pending);
  pthread_mutex_destroy(&x.mu);
  pthread_cond_destroy(&x.cv);
  pthread_mutex_destroy(&ctx->mu);
  pthread_cond_destroy(&ctx->cv);
  free(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_child_never_locks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
