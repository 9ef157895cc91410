/* Jobs of the integration and fault tests and the checks on their
 * processes (see job.h). Owns nothing beyond the call: the processes belong
 * to proc.c's registry. Runs on the cmocka test thread only. */
#include "job.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

void job_fail(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  proc_dump_all();
  fail_msg("%s", msg);
}

int job_teardown(void **state) {
  (void)state;
  proc_test_end();
  return 0;
}

void job_start_coordinator(job *j, int size, char *const coord_args[]) {
  memset(j, 0, sizeof *j);
  j->size = size;
  j->coord = proc_start_gradsyncd(GS_BIN_DIR, size, coord_args, j->addr, sizeof j->addr);
  if (j->coord == NULL) job_fail("gradsyncd did not start (see its output above)");
}

proc *job_start_rank(const job *j, int rank, const char *path, char *const args[],
                     char *const env_extra[]) {
  char coord[160], r[32], s[32], lr[40], ls[40];
  snprintf(coord, sizeof coord, "GRADSYNC_COORDINATOR=%s", j->addr);
  snprintf(r, sizeof r, "GRADSYNC_RANK=%d", rank);
  snprintf(s, sizeof s, "GRADSYNC_SIZE=%d", j->size);
  snprintf(lr, sizeof lr, "GRADSYNC_LOCAL_RANK=%d", rank);
  snprintf(ls, sizeof ls, "GRADSYNC_LOCAL_SIZE=%d", j->size);
  char *env[16] = {coord, r, s, lr, ls, "GRADSYNC_JOIN_TIMEOUT_MS=30000"};
  size_t n = 6;
  for (size_t i = 0; env_extra && env_extra[i] && n < 15; i++) env[n++] = env_extra[i];
  env[n] = NULL;

  char *argv[32] = {(char *)path};
  size_t argc = 1;
  for (size_t i = 0; args && args[i] && argc < 31; i++) argv[argc++] = args[i];
  argv[argc] = NULL;

  char label[32];
  snprintf(label, sizeof label, "rank %d", rank);
  proc *p = proc_spawn(label, argv, env);
  if (p == NULL) job_fail("could not start %s as rank %d", path, rank);
  return p;
}

void job_expect_exit(proc *p, int code) {
  if (proc_wait(p, proc_guard_left_ms()) != 0)
    job_fail("%s (pid %d) hung; killed by the hang guard", p->label, (int)p->pid);
  if (proc_exit_code(p) != code)
    job_fail("%s exited with %d, expected %d", p->label, proc_exit_code(p), code);
}

void job_expect_output(const proc *p, const char *needle) {
  char *out = proc_output(p);
  int found = out != NULL && strstr(out, needle) != NULL;
  free(out);
  if (!found) job_fail("%s: output lacks \"%s\"", p->label, needle);
}

void job_expect_no_output(const proc *p, const char *needle, int ignore_case) {
  char *out = proc_output(p);
  int found = out != NULL && (ignore_case ? strcasestr(out, needle) : strstr(out, needle)) != NULL;
  free(out);
  if (found) job_fail("%s: output contains \"%s\"", p->label, needle);
}

void job_expect_lines(const proc *p, const char *const *expect, int rank, int size) {
  for (size_t i = 0; expect[i]; i++) {
    char want[1024];
    snprintf(want, sizeof want, expect[i], rank, size);
    job_expect_output(p, want);
  }
}

void job_stop_coordinator(job *j) {
  proc_signal(j->coord, SIGTERM);
  /* Not logged when it had exited by itself already (one job, over). */
  if (proc_wait_for_output(j->coord, "received SIGTERM", proc_guard_left_ms()) == 0)
    proc_signal(j->coord, SIGTERM);
  job_expect_exit(j->coord, 0);
}

void job_expect_coordinator_failed(job *j) {
  job_expect_exit(j->coord, 3);
  job_expect_output(j->coord, "job (epoch 1) failed: every rank was told");
  job_expect_output(j->coord, "stopped: the job failed (exit status 3)");
}
