/* Fault tests: the failures gradsync exists to report, reproduced with real
 * processes on 127.0.0.1 (gradsyncd, the demo gradsync-train with its fault
 * flags, gradsync-run, gs-test-worker) and checked from the user's side: the
 * status every rank ends with, the error text, the rank, host, pid and
 * tensors it names, and that nothing is left running.
 *
 * Scenarios (docs/troubleshooting.md shows each one's output): a desync that
 * deadlocks, a rank that crashes or is SIGKILLed, a hung rank (stall warning
 * and stall shutdown), a stopped rank (SIGSTOP), a paused coordinator
 * (SIGSTOP: no rank lost), Ctrl-C of gradsync-run (a clean stop), stragglers
 * (no false deadlock), a SIGKILLed coordinator and a rank that
 * never joins.
 *
 * Timeouts are made short with flags (--deadlock-time-ms, --stall-*-s,
 * --rank-timeout-ms, GRADSYNC_JOIN_TIMEOUT_MS); no assertion depends on
 * timing, every wait is bounded by a generous hang guard (GUARD_MS per
 * test), and the teardown kills and reaps every process a test started,
 * also when it failed. Single-threaded. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cmocka.h>

#include "job.h"

#define GUARD_MS 60000 /* per test: catches hangs, never a timing check */

static const char train_path[] = GS_BIN_DIR "/gradsync-train";
static const char run_path[] = GS_BIN_DIR "/gradsync-run";
static const char worker_path[] = GS_BIN_DIR "/gs-test-worker";

/* What the ranks report as their host (gethostname, as the library does). */
static char g_host[64];

static int setup(void **state) {
  (void)state;
  return proc_test_begin("fault", GUARD_MS);
}

/* ---- starting and checking processes ------------------------------------ */

/* gradsyncd [coord_args] and every rank of gradsync-train [train_args]. */
static void start_train_job(job *j, int size, char *const coord_args[], char *const train_args[]) {
  job_start_coordinator(j, size, coord_args);
  for (int r = 0; r < size; r++) j->ranks[r] = job_start_rank(j, r, train_path, train_args, NULL);
}

/* Waits (bounded by the guard) until p printed needle. */
static void wait_for_output(proc *p, const char *needle) {
  if (proc_wait_for_output(p, needle, GUARD_MS) != 0)
    job_fail("%s never printed \"%s\"", p->label, needle);
}

static void expect_no_strays(void) {
  size_t left = proc_strays(5000);
  if (left != 0) job_fail("%zu process(es) left running", left);
}

/* Ranks of a long run are surely training once rank 0 logged step 20. */
static char *const long_run[] = {"--steps", "1000000", "--log-every", "10", NULL};

static void wait_training(job *j) {
  wait_for_output(j->ranks[0], "step 20/1000000");
}

/* A surviving rank p failed because rank `lost` went away: the coordinator's
 * abort names it with host and pid, or the ring noticed first and names it
 * as the peer it lost. */
static void expect_named_lost(const job *j, const proc *p, int lost) {
  char by_coord[512], by_ring[64];
  snprintf(by_coord, sizeof by_coord, "rank %d (%s, pid %d) was lost", lost, g_host,
           (int)j->ranks[lost]->pid);
  snprintf(by_ring, sizeof by_ring, "connection to rank %d", lost);
  char *out = proc_output(p);
  int coord = strstr(out, "GS_ERR_RANK_LOST") != NULL && strstr(out, by_coord) != NULL;
  int ring = strstr(out, "GS_ERR_DATA_PLANE") != NULL && strstr(out, by_ring) != NULL;
  free(out);
  if (!coord && !ring)
    job_fail("%s: no GS_ERR_RANK_LOST naming \"%s\" nor GS_ERR_DATA_PLANE naming \"%s\"", p->label,
             by_coord, by_ring);
}

/* ---- desync: another tensor name on one rank -> deadlock report ---------- */

/* Rank 1 submits step 3 as fc3/weight.desync, ...; ranks 0 and 2 as
 * fc3/weight, ...: every rank blocks, the detector aborts the job with the
 * wait-for picture, every rank fails with GS_ERR_DEADLOCK. */
static void desync_deadlock(const char *wait) {
  char *coord_args[] = {"--deadlock-time-ms", "1500", NULL};
  char *train_args[] = {"--steps", "20",     "--desync-rank", "1", "--desync-step",
                        "3",       "--wait", (char *)wait,    NULL};
  job j;
  start_train_job(&j, 3, coord_args, train_args);
  for (int r = 0; r < 3; r++) job_expect_exit(j.ranks[r], 1);

  char waits[3][512];
  snprintf(waits[0], sizeof waits[0], "rank 0 (%s:%d) waits on [fc3/weight] (missing from rank 1)",
           g_host, (int)j.ranks[0]->pid);
  snprintf(waits[1], sizeof waits[1],
           "rank 1 (%s:%d) waits on [fc3/weight.desync] (missing from ranks [0,2])", g_host,
           (int)j.ranks[1]->pid);
  snprintf(waits[2], sizeof waits[2], "rank 2 (%s:%d) waits on [fc3/weight] (missing from rank 1)",
           g_host, (int)j.ranks[2]->pid);
  for (int r = 0; r < 3; r++) {
    char want[128];
    snprintf(want, sizeof want, "rank %d: allreduce of '%s' failed: GS_ERR_DEADLOCK", r,
             r == 1 ? "fc3/weight.desync" : "fc3/weight");
    job_expect_output(j.ranks[r], want);
    for (int k = 0; k < 3; k++) job_expect_output(j.ranks[r], waits[k]);
  }
  job_expect_output(j.ranks[1],
                    "rank 1: --desync-rank 1 --desync-step 3: submitting the gradients");
  job_expect_output(j.coord, "aborting the job: deadlock: ");
  for (int k = 0; k < 3; k++) job_expect_output(j.coord, waits[k]);
  job_expect_coordinator_failed(&j);
  expect_no_strays();
}

static void test_desync_deadlock(void **state) {
  (void)state;
  desync_deadlock("block");
}

/* Regression (issue 8): ranks that wait with gs_wait(h, 1000) in a loop, as
 * a Python binding staying responsive to Ctrl-C does, re-entered the wait
 * every second; each re-entry reset "blocked" and the coordinator took that
 * as activity, so the desync was never reported and the job hung for ever.
 * Blocked-since now belongs to the op: the same report as a blocking wait. */
static void test_desync_deadlock_timed_waits(void **state) {
  (void)state;
  desync_deadlock("timed");
}

/* Regression (issue 8): the same with ranks polling gs_test every 5 ms
 * (never inside gs_wait): polling a pending op counts as waiting on it. */
static void test_desync_deadlock_polling(void **state) {
  (void)state;
  desync_deadlock("poll");
}

/* The same through the launcher, as a user types it: it exits with the
 * first failing rank's status and shows the report. */
static void test_desync_gradsync_run(void **state) {
  (void)state;
  char *argv[] = {(char *)run_path,
                  "-np",
                  "3",
                  "--coord-arg",
                  "--deadlock-time-ms",
                  "--coord-arg",
                  "1500",
                  (char *)train_path,
                  "--desync-rank",
                  "1",
                  "--desync-step",
                  "3",
                  NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  job_expect_exit(p, 1);
  job_expect_output(p, ": allreduce of 'fc3/weight");
  job_expect_output(p, "' failed: GS_ERR_DEADLOCK: ");
  job_expect_output(p, "waits on [fc3/weight] (missing from rank 1)");
  job_expect_output(p, "waits on [fc3/weight.desync] (missing from ranks [0,2])");
  expect_no_strays();
}

/* Ctrl-C (SIGINT to gradsync-run's process group, as a terminal sends it)
 * while the job trains: the launcher says so, stops its gradsyncd first (a
 * shutdown, not lost ranks: no error in its log, exit 0), then the ranks,
 * and exits 128 + SIGINT with nothing left running. */
static void test_ctrl_c_gradsync_run(void **state) {
  (void)state;
  char *argv[] = {(char *)run_path, "-np", "2", (char *)train_path, "--steps", "1000000",
                  "--log-every",    "10",  NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  wait_for_output(p, "[0] step 20/1000000");
  proc_signal(p, SIGINT);
  job_expect_exit(p, 128 + SIGINT);
  job_expect_output(p, "gradsync-run: received SIGINT (Ctrl-C): stopping the job (gradsyncd "
                       "first, then the ranks)");
  job_expect_output(p, "msg=\"shutting down: closing open sessions\"");
  job_expect_output(p, "[coord] time=");
  job_expect_output(p, "msg=\"stopped\"");
  job_expect_no_output(p, "was lost", 0);
  job_expect_no_output(p, "level=error", 0);
  job_expect_no_output(p, "the job failed", 0);
  expect_no_strays();
}

/* ---- a rank dies ---------------------------------------------------------- */

/* Rank 2 _exits in the middle of step 5: the others fail naming it, nothing
 * is left running, and the coordinator (one job per coordinator) exits 3
 * once every rank was told. A rank restarted afterwards fails to join with
 * a clear reason instead of waiting. */
static void test_crash_rank(void **state) {
  (void)state;
  char *train_args[] = {"--steps", "20", "--crash-rank", "2", "--crash-step", "5", NULL};
  job j;
  start_train_job(&j, 3, NULL, train_args);
  job_expect_exit(j.ranks[2], 3);
  job_expect_output(j.ranks[2], "rank 2: --crash-rank 2 --crash-step 5: exiting with status 3 in "
                                "the middle of step 5");
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 1);
    expect_named_lost(&j, j.ranks[r], 2);
  }
  job_expect_coordinator_failed(&j);
  char *join[] = {(char *)worker_path, "join", NULL};
  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=3000", NULL};
  proc *late = job_start_rank(&j, 2, join[0], join + 1, env);
  snprintf(late->label, sizeof late->label, "rank 2 (restarted)");
  job_expect_exit(late, 3);
  char want[256];
  snprintf(want, sizeof want,
           "join: gs_init failed: GS_ERR_COORDINATOR_LOST: gs_init (rank 2): cannot reach the "
           "coordinator at %s",
           j.addr);
  job_expect_output(late, want);
  expect_no_strays();
}

/* Regression: the docs' crash demo (troubleshooting.md: --steps 100
 * --crash-rank 2 --crash-step 5, the fast path on by default). Rank 2 dies
 * in step 5 before it submits fc1's gradients, in fast mode (entered after
 * step 1's last plan); finished plans ride with a rank's next message, so
 * the coordinator had no report of step 1's plans from it and used to call
 * them "scheduled but not finished by it: [..., fc1/weight, fc1/bias]".
 * The report must say it was in fast mode (and, if rank 2 had not sent a
 * heartbeat since, that those plans were only not reported: not asserted,
 * as that depends on timing); the survivors get the same text. */
static void test_crash_rank_report_in_fast_mode(void **state) {
  (void)state;
  char *train_args[] = {"--steps", "100", "--crash-rank", "2", "--crash-step", "5", NULL};
  job j;
  start_train_job(&j, 3, NULL, train_args);
  job_expect_exit(j.ranks[2], 3);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 1);
    expect_named_lost(&j, j.ranks[r], 2);
  }
  job_expect_coordinator_failed(&j);
  char want[256];
  snprintf(want, sizeof want,
           "rank 2 (%s, pid %d) was lost: its session stream ended without a leave message (the "
           "process exited or crashed). Tensors in flight: []; it was in fast mode after plan ",
           g_host, (int)j.ranks[2]->pid);
  job_expect_output(j.coord, want);
  job_expect_output(j.coord, ", where the ranks agree on cached tensors among themselves: "
                             "gradsyncd does not know which of them it was reducing");
  job_expect_no_output(j.coord, "scheduled but not finished", 0);
  for (int r = 0; r < 2; r++) job_expect_no_output(j.ranks[r], "scheduled but not finished", 0);
  expect_no_strays();
}

/* The state letter of every child of pid ('Z' = exited, not yet reaped),
 * from /proc/PID/stat; returns how many, at most cap. */
static size_t children_states(pid_t parent, char *states, size_t cap) {
  size_t n = 0;
  DIR *d = opendir("/proc");
  if (!d) return 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL && n < cap) {
    if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *close_paren = strrchr(buf, ')'); /* the name may hold anything */
    char state;
    int ppid;
    if (close_paren && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      states[n++] = state;
  }
  closedir(d);
  return n;
}

/* Regression: gradsync-run names the rank that failed first even when it
 * reaps the ranks late. Rank 2 crashes (status 3) and the others fail
 * because of it (status 1) while the launcher is stopped (SIGSTOP, as a
 * loaded machine delays it), so all of them have exited when it reaps:
 * waitpid(-1) returns rank 0 first, and the launcher used to say "rank 0
 * exited with status 1" and exit 1. Rank 2 sleeps 3 s before each backward
 * pass so that the launcher is stopped before it crashes in step 2. */
static void test_crash_rank_gradsync_run_late_reap(void **state) {
  (void)state;
  char *argv[] = {(char *)run_path,
                  "-np",
                  "3",
                  (char *)train_path,
                  "--steps",
                  "20",
                  "--crash-rank",
                  "2",
                  "--crash-step",
                  "2",
                  "--slow-rank",
                  "2",
                  "--slow-ms",
                  "3000",
                  NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  wait_for_output(p, "[2] rank 2: --slow-rank 2 --slow-ms 3000: sleeping");
  proc_signal(p, SIGSTOP); /* its own process group: the ranks run on */
  char st[16];
  size_t n = children_states(p->pid, st, sizeof st);
  if (n != 4 || memchr(st, 'Z', n))
    job_fail("expected gradsyncd and 3 ranks running under the stopped launcher, found %zu "
             "children (%.*s)",
             n, (int)n, st);
  /* Every child gone (the ranks, then gradsyncd once every rank was told),
   * none reaped: the hang guard bounds this. */
  while (!((n = children_states(p->pid, st, sizeof st)) == 4 && !memchr(st, 'R', n) &&
           !memchr(st, 'S', n) && !memchr(st, 'D', n))) {
    if (proc_guard_left_ms() <= 0) {
      proc_signal(p, SIGCONT);
      job_fail("the ranks under the stopped launcher did not all exit");
    }
    usleep(20000);
  }
  proc_signal(p, SIGCONT);
  job_expect_exit(p, 3);
  job_expect_output(p, "[2] rank 2: --crash-rank 2 --crash-step 2: exiting with status 3");
  job_expect_output(p, "gradsync-run: rank 2 exited with status 3; stopping the other ranks");
  job_expect_no_output(p, "gradsync-run: rank 0 exited", 0);
  job_expect_no_output(p, "gradsync-run: rank 1 exited", 0);
  expect_no_strays();
}

/* SIGKILL of rank 2 while the job trains. */
static void test_sigkill_rank(void **state) {
  (void)state;
  job j;
  start_train_job(&j, 3, NULL, long_run);
  wait_training(&j);
  proc_signal(j.ranks[2], SIGKILL);
  job_expect_exit(j.ranks[2], 128 + SIGKILL);
  for (int r = 0; r < 2; r++) {
    job_expect_exit(j.ranks[r], 1);
    expect_named_lost(&j, j.ranks[r], 2);
  }
  job_expect_coordinator_failed(&j);
  expect_no_strays();
}

/* kill -9 of rank `victim` while 3 ranks train over the shared-memory
 * transport (GRADSYNC_BACKEND=shm): the survivors fail naming it, and the
 * job's segment is not in /dev/shm, neither while training nor after. */
static void sigkill_shm(int victim) {
  job j;
  char *env[] = {"GRADSYNC_BACKEND=shm", "GRADSYNC_LOG_LEVEL=info", NULL};
  job_start_coordinator(&j, 3, NULL);
  for (int r = 0; r < 3; r++) j.ranks[r] = job_start_rank(&j, r, train_path, long_run, env);
  wait_training(&j);
  char *out = proc_output(j.ranks[0]), seg[160] = "", path[200];
  const char *at = strstr(out, "segment /gradsync-");
  if (at) sscanf(at + strlen("segment "), "%127[^,) ]", seg);
  free(out);
  if (!seg[0]) job_fail("rank 0 did not log its shared-memory segment (host buffers: shm ...)");
  snprintf(path, sizeof path, "/dev/shm%s", seg);
  if (access(path, F_OK) == 0) job_fail("%s exists while the job trains", path);
  proc_signal(j.ranks[victim], SIGKILL);
  job_expect_exit(j.ranks[victim], 128 + SIGKILL);
  for (int r = 0; r < 3; r++) {
    if (r == victim) continue;
    job_expect_exit(j.ranks[r], 1);
    expect_named_lost(&j, j.ranks[r], victim);
  }
  if (access(path, F_OK) == 0)
    job_fail("%s was left behind after kill -9 of rank %d", path, victim);
  job_expect_coordinator_failed(&j);
  expect_no_strays();
}

static void test_sigkill_shm_leader(void **state) {
  (void)state;
  sigkill_shm(0);
}

static void test_sigkill_shm_member(void **state) {
  (void)state;
  sigkill_shm(2);
}

/* ---- a hung rank: stall inspector ---------------------------------------- */

/* Rank 1 sleeps forever before step 3: the coordinator warns in Horovod's
 * format, naming rank 1 and the six tensors it never submitted. The hung
 * rank is not blocked in gs_wait, so a short deadlock time must not fire. */
static void test_hang_stall_warning(void **state) {
  (void)state;
  char *coord_args[] = {"--stall-warning-s", "2", "--deadlock-time-ms", "1000", NULL};
  char *train_args[] = {"--steps", "20", "--hang-rank", "1", "--hang-step", "3", NULL};
  job j;
  start_train_job(&j, 3, coord_args, train_args);
  /* gradsyncd logs in logfmt: the report is one line, its newlines escaped. */
  char missing[512];
  snprintf(missing, sizeof missing,
           "Missing ranks:\\n1 (%s:%d): [fc1/bias, fc1/weight, fc2/bias, fc2/weight, fc3/bias, "
           "fc3/weight]\"\n",
           g_host, (int)j.ranks[1]->pid);
  wait_for_output(j.coord, missing);
  job_expect_output(j.coord,
                    "One or more tensors were submitted to be reduced, gathered or "
                    "broadcasted by subset of ranks and are waiting for remainder of ranks "
                    "for more than 2 seconds.");
  job_expect_no_output(j.coord, "Missing ranks:\\n0 (", 0);
  job_expect_no_output(j.coord, "]\\n2 (", 0);
  job_expect_no_output(j.coord, "deadlock: ", 1);
  job_expect_output(j.ranks[1], "rank 1: --hang-rank 1 --hang-step 3: hanging forever");
  /* The teardown kills the hung job. */
}

/* With --stall-shutdown-s 3 the coordinator aborts the job with that
 * report: the waiting ranks fail with GS_ERR_STALL, the hung one logs it
 * (it cannot act on it: it is hung) and is killed. */
static void test_hang_stall_shutdown(void **state) {
  (void)state;
  char *coord_args[] = {"--stall-shutdown-s", "3", NULL};
  char *train_args[] = {"--steps", "20", "--hang-rank", "1", "--hang-step", "3", NULL};
  job j;
  start_train_job(&j, 3, coord_args, train_args);
  static const char stall[] = "One or more tensors were submitted to be reduced, gathered or "
                              "broadcasted by subset of ranks and are waiting for remainder of "
                              "ranks for more than 3 seconds.";
  /* Rank 1 hangs before step 3's backward: the report names it with its
   * host and pid and lists, sorted, the tensors waiting past 3 s. fc3's two
   * gradients are submitted first (backward order), so they are always
   * listed; fc2's and fc1's go out one batching cycle later and may not yet
   * be 3 s old at the tick that aborts. */
  char missing[128];
  snprintf(missing, sizeof missing, "Missing ranks:\n1 (%s:%d): [", g_host, (int)j.ranks[1]->pid);
  static const char listed[] = "fc3/bias, fc3/weight]\nStall shutdown time of 3 s exceeded";
  for (int r = 0; r < 3; r += 2) {
    char want[128];
    job_expect_exit(j.ranks[r], 1);
    snprintf(want, sizeof want, "rank %d: allreduce of 'fc3/weight' failed: GS_ERR_STALL: ", r);
    job_expect_output(j.ranks[r], want);
    job_expect_output(j.ranks[r], stall);
    job_expect_output(j.ranks[r], missing);
    job_expect_output(j.ranks[r], listed);
  }
  wait_for_output(j.ranks[1], "gradsync[rank 1] ERROR the coordinator aborted the job: One or "
                              "more tensors were submitted");
  job_expect_output(j.ranks[1], missing);
  job_expect_output(j.ranks[1], listed);
  proc_signal(j.ranks[1], SIGKILL);
  job_expect_exit(j.ranks[1], 128 + SIGKILL);
  job_expect_output(j.coord, "aborting the job: One or more tensors were submitted");
  /* gradsyncd logs in logfmt: the report is one line, its newlines escaped. */
  char folded[128];
  snprintf(folded, sizeof folded, "Missing ranks:\\n1 (%s:%d): [", g_host, (int)j.ranks[1]->pid);
  job_expect_output(j.coord, folded);
  job_expect_output(j.coord, "fc3/bias, fc3/weight]\\nStall shutdown time of 3 s exceeded");
  job_expect_coordinator_failed(&j);
  expect_no_strays();
}

/* ---- a stopped rank: liveness ---------------------------------------------- */

/* SIGSTOP of rank 1 with --rank-timeout-ms 2000: the others fail with
 * GS_ERR_RANK_LOST naming it, also when they were inside a ring collective
 * with it. Resumed, rank 1 learns it was declared lost and fails too. */
static void test_stopped_rank(void **state) {
  (void)state;
  char *coord_args[] = {"--rank-timeout-ms", "2000", NULL};
  job j;
  start_train_job(&j, 3, coord_args, long_run);
  wait_training(&j);
  proc_signal(j.ranks[1], SIGSTOP);
  char lost[512];
  snprintf(lost, sizeof lost, "rank 1 (%s, pid %d) was lost: it was silent for ", g_host,
           (int)j.ranks[1]->pid);
  for (int r = 0; r < 3; r += 2) {
    char want[64];
    job_expect_exit(j.ranks[r], 1);
    snprintf(want, sizeof want, "rank %d: allreduce of '", r);
    job_expect_output(j.ranks[r], want);
    job_expect_output(j.ranks[r], "' failed: GS_ERR_RANK_LOST: ");
    job_expect_output(j.ranks[r], lost);
  }
  proc_signal(j.ranks[1], SIGCONT);
  job_expect_exit(j.ranks[1], 1);
  job_expect_output(j.ranks[1], "rank 1: allreduce of '");
  job_expect_output(j.ranks[1], "the coordinator declared this rank lost: it was silent for ");
  job_expect_coordinator_failed(&j);
  expect_no_strays();
}

/* SIGSTOP of the coordinator for longer than the rank timeout and the
 * deadlock time, then SIGCONT: the ranks were alive all along (their
 * heartbeats wait in the sockets), so none is declared lost and no deadlock
 * is reported; the job finishes with identical parameters on every rank. */
static void test_coordinator_paused(void **state) {
  (void)state;
  char *coord_args[] = {"--rank-timeout-ms", "2000", "--deadlock-time-ms", "1500", NULL};
  char *train_args[] = {"--steps", "40",        "--log-every", "5", "--slow-rank",
                        "0",       "--slow-ms", "100",         NULL};
  job j;
  start_train_job(&j, 3, coord_args, train_args);
  wait_for_output(j.ranks[0], "step 5/40");
  proc_signal(j.coord, SIGSTOP);
  sleep(4);
  proc_signal(j.coord, SIGCONT);
  for (int r = 0; r < 3; r++) job_expect_exit(j.ranks[r], 0);
  job_expect_output(j.ranks[0], "parameters identical on all 3 ranks");
  job_expect_output(j.coord, "the event loop did not run for ");
  job_expect_no_output(j.coord, "was lost", 0);
  job_expect_no_output(j.coord, "deadlock: ", 1);
  job_stop_coordinator(&j);
  expect_no_strays();
}

/* ---- stragglers are not deadlocks ------------------------------------------ */

static void straggler(const char *slow_ms, const char *steps) {
  char *argv[] = {(char *)run_path,
                  "-np",
                  "3",
                  "--coord-arg",
                  "--deadlock-time-ms",
                  "--coord-arg",
                  "1000",
                  (char *)train_path,
                  "--slow-rank",
                  "1",
                  "--slow-ms",
                  (char *)slow_ms,
                  "--steps",
                  (char *)steps,
                  NULL};
  proc *p = proc_spawn("gradsync-run", argv, NULL);
  if (p == NULL) job_fail("could not start gradsync-run");
  job_expect_exit(p, 0);
  char want[128];
  snprintf(want, sizeof want, "[1] rank 1: --slow-rank 1 --slow-ms %s: sleeping", slow_ms);
  job_expect_output(p, want);
  job_expect_output(p, "[0] parameters identical on all 3 ranks");
  job_expect_no_output(p, "deadlock: ", 1);
  job_expect_no_output(p, "ERROR", 0);
  expect_no_strays();
}

/* Rank 1 sleeps 60 ms before every backward pass, 36 steps. */
static void test_straggler(void **state) {
  (void)state;
  straggler("60", "36");
}

/* Rank 1 computes longer (1.5 s) than the deadlock time (1 s) while the
 * others wait on it: it is not blocked, so this is no deadlock. */
static void test_straggler_slower_than_deadlock_time(void **state) {
  (void)state;
  straggler("1500", "2");
}

/* ---- the coordinator dies ----------------------------------------------- */

static void test_coordinator_killed(void **state) {
  (void)state;
  job j;
  start_train_job(&j, 3, NULL, long_run);
  wait_training(&j);
  proc_signal(j.coord, SIGKILL);
  job_expect_exit(j.coord, 128 + SIGKILL);
  char lost[512];
  snprintf(lost, sizeof lost, "lost the coordinator at %s: ", j.addr);
  for (int r = 0; r < 3; r++) {
    char want[64];
    job_expect_exit(j.ranks[r], 1);
    snprintf(want, sizeof want, "rank %d: allreduce of '", r);
    job_expect_output(j.ranks[r], want);
    job_expect_output(j.ranks[r], "' failed: GS_ERR_COORDINATOR_LOST: ");
    job_expect_output(j.ranks[r], lost);
  }
  expect_no_strays();
}

/* ---- a rank never joins --------------------------------------------------- */

/* World 3, only ranks 0 and 1 started: both give up after 2 s naming rank 2
 * alone, the one that never came. Ranks 0 and 1 time out a few ms apart;
 * the one that gives up first must not be named by the other as a rank
 * that never joined (it was present, and left for the same reason). */

static void test_never_joined(void **state) {
  (void)state;
  char *argv[] = {(char *)train_path, NULL};
  char *env[] = {"GRADSYNC_JOIN_TIMEOUT_MS=2000", NULL};
  job j;
  job_start_coordinator(&j, 3, NULL);
  j.ranks[0] = job_start_rank(&j, 0, argv[0], argv + 1, env);
  j.ranks[1] = job_start_rank(&j, 1, argv[0], argv + 1, env);
  for (int r = 0; r < 2; r++) {
    char want[512];
    job_expect_exit(j.ranks[r], 1);
    job_expect_output(j.ranks[r], "gradsync-train: cannot join the job: GS_ERR_JOIN_TIMEOUT: ");
    snprintf(want, sizeof want,
             "gs_init (rank %d): timed out after 2000 ms waiting for ranks [2] to join the job "
             "at coordinator %s",
             r, j.addr);
    job_expect_output(j.ranks[r], want);
  }
  job_stop_coordinator(&j);
  expect_no_strays();
}

int main(void) {
  if (gethostname(g_host, sizeof g_host) != 0) snprintf(g_host, sizeof g_host, "?");
  g_host[sizeof g_host - 1] = '\0';
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_desync_deadlock, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_desync_deadlock_timed_waits, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_desync_deadlock_polling, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_desync_gradsync_run, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_ctrl_c_gradsync_run, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_crash_rank, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_crash_rank_report_in_fast_mode, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_crash_rank_gradsync_run_late_reap, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sigkill_rank, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sigkill_shm_leader, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_sigkill_shm_member, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_hang_stall_warning, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_hang_stall_shutdown, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_rank, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_coordinator_paused, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_straggler, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_straggler_slower_than_deadlock_time, setup,
                                      job_teardown),
      cmocka_unit_test_setup_teardown(test_coordinator_killed, setup, job_teardown),
      cmocka_unit_test_setup_teardown(test_never_joined, setup, job_teardown),
  };
  /* GS_TEST_FILTER=test_name (a glob) runs only the tests it matches */
  if (getenv("GS_TEST_FILTER")) cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
  return cmocka_run_group_tests_name("fault", tests, NULL, NULL);
}
