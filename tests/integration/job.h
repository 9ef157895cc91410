/* A job of the integration and fault tests, started by hand: one gradsyncd
 * on 127.0.0.1 port 0 and ranks started with the environment gradsync-run
 * gives a rank; and the cmocka checks the test drivers make on any process
 * (exit code, output), each failing the test with every output dumped.
 *
 * Built on proc.h: every process is registered there and killed and reaped
 * by proc_test_end (job_teardown), also when a check failed. Every wait is
 * bounded by the current test's hang guard.
 *
 * Not thread-safe: the cmocka test thread calls these. */
#ifndef GS_TEST_JOB_H
#define GS_TEST_JOB_H

#include "proc.h"

#define JOB_MAX_RANKS 8

typedef struct job {
  proc *coord;    /* gradsyncd */
  char addr[128]; /* its "HOST:PORT" */
  int size;       /* the world size */
  proc *ranks[JOB_MAX_RANKS];
} job;

/* Dumps the output of every process of the current test on stderr, then
 * fails the test with the formatted message (does not return). */
void job_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* cmocka teardown: proc_test_end. Always returns 0. */
int job_teardown(void **state);

/* Clears j and starts gradsyncd for a job of `size` ranks with extra flags
 * (NULL-terminated, may be NULL); fails the test if it does not start. */
void job_start_coordinator(job *j, int size, char *const coord_args[]);

/* Starts `path ARGS...` (args NULL-terminated, may be NULL) as rank `rank`
 * of j, labelled "rank R", with GRADSYNC_COORDINATOR, _RANK, _SIZE,
 * _LOCAL_RANK, _LOCAL_SIZE, GRADSYNC_JOIN_TIMEOUT_MS=30000 (a join that goes
 * wrong fails well inside the hang guard), then env_extra ("NAME=value",
 * NULL-terminated, may be NULL; an extra of the same name wins). Fails the
 * test if it cannot start; the proc stays owned by the proc registry. */
proc *job_start_rank(const job *j, int rank, const char *path, char *const args[],
                     char *const env_extra[]);

/* Waits for p (bounded by the hang guard) and fails the test unless it
 * exited with code. */
void job_expect_exit(proc *p, int code);

/* Fails the test unless p's output contains needle. */
void job_expect_output(const proc *p, const char *needle);

/* Fails the test if p's output contains needle (any case if ignore_case). */
void job_expect_no_output(const proc *p, const char *needle, int ignore_case);

/* For each text of expect (NULL-terminated), with a first and second "%d"
 * replaced by rank and size: job_expect_output(p, text). */
void job_expect_lines(const proc *p, const char *const *expect, int rank, int size);

/* SIGTERM to j's gradsyncd and, once it logged it, a second SIGTERM,
 * which ends the shutdown's drain at once (test_lifecycle covers the
 * drain itself); gradsyncd must then exit 0 (also when it had exited by
 * itself before). */
void job_stop_coordinator(job *j);

/* One job per coordinator: j's gradsyncd, whose job failed, must exit by
 * itself with status 3 after logging that the job (epoch 1) failed. */
void job_expect_coordinator_failed(job *j);

#endif
