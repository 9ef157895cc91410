/* Process helpers for the integration tests: start programs with extra
 * environment and their output captured to a file, start gradsyncd and read
 * its address, wait with a hang guard, and kill and reap everything a test
 * started (also when the test fails: proc_cleanup_all from the teardown).
 *
 * Every process is started in its own process group, so killing it also
 * kills what it started (gradsync-run's ranks and coordinator). Children also
 * get SIGKILL if the test driver itself dies.
 *
 * Not thread-safe: one test thread owns the registry. */
#ifndef GS_TEST_PROC_H
#define GS_TEST_PROC_H

#include <stddef.h>
#include <sys/types.h>

typedef struct proc {
  char label[64];     /* for messages: "rank 1", "gradsyncd" */
  pid_t pid;          /* also the process group id */
  int exited;         /* reaped */
  int status;         /* waitpid status once reaped */
  char out_path[512]; /* stdout and stderr, interleaved */
} proc;

/* Starts a test: creates a private directory for the output files and arms
 * the hang guard: no wait of this test goes past now + guard_ms. Returns 0,
 * or -1 with a message on stderr. */
int proc_test_begin(const char *test_name, int guard_ms);

/* Ends a test: SIGKILLs every process still running (the whole process
 * group), reaps them all, and removes the output files (kept when
 * GS_TEST_KEEP is set). Safe to call twice. */
void proc_test_end(void);

/* Milliseconds left before the hang guard of the current test expires. */
int proc_guard_left_ms(void);

/* Starts argv[0] (a path) with the environment of the test minus any
 * GRADSYNC_* variable, plus env_extra ("NAME=value" strings, NULL
 * terminated; may be NULL; of two extras with the same NAME the later
 * wins). Returns a registered proc or NULL. */
proc *proc_spawn(const char *label, char *const argv[], char *const env_extra[]);

/* Waits until p exits, at most timeout_ms (and never past the hang guard).
 * Returns 0 once it is reaped (status in p->status); on expiry SIGKILLs its
 * process group, reaps it and returns -1. */
int proc_wait(proc *p, int timeout_ms);

/* Waits until one of ps[0..n) exits; *idx receives it. Same return and
 * expiry behaviour as proc_wait (on expiry all n are killed). */
int proc_wait_any(proc *const *ps, size_t n, int timeout_ms, size_t *idx);

/* The exit code of a reaped process, or 128 + signal when it was killed by
 * a signal, or -1 while it runs. */
int proc_exit_code(const proc *p);

/* Sends sig to the process group of p (no-op once reaped). */
void proc_signal(proc *p, int sig);

/* The output captured so far, NUL-terminated; the caller frees it. Never
 * NULL (an empty string when nothing could be read). */
char *proc_output(const proc *p);

/* Prints p's captured output on stderr, each line prefixed with its label. */
void proc_dump(const proc *p);

/* proc_dump of every process the current test started. */
void proc_dump_all(void);

/* Polls p's output until it contains needle, p exits, or timeout_ms passes.
 * Returns 0 when found, -1 otherwise. */
int proc_wait_for_output(proc *p, const char *needle, int timeout_ms);

/* Starts bindir/gradsyncd --listen 127.0.0.1:0 --world-size world [extra
 * args, NULL terminated; may be NULL] and waits (bounded) for its line
 * "gradsyncd listening on HOST:PORT". On success returns the proc and
 * writes "HOST:PORT" to addr; else NULL (its output dumped on stderr). */
proc *proc_start_gradsyncd(const char *bindir, int world, char *const extra_args[], char *addr,
                           size_t addr_len);

/* How many processes left behind by what this test started (orphans
 * reparented to the driver, not in the registry) are still alive after
 * grace_ms; exited ones are reaped. proc_test_end kills the live ones. */
size_t proc_strays(int grace_ms);

/* The current test's private directory ("" before begin). */
const char *proc_test_dir(void);

#endif
