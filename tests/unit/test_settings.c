/* The settings table (common/settings.c) and the scheduler environments
 * (worker/scheduler.c): every row is sound, values parse and are refused
 * with the messages users read, flags take both spellings, and rank/size
 * come from the right scheduler in the documented precedence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"
#include "settings.h"
#include "status.h"

static void test_every_row_is_sound(void **state) {
  (void)state;
  gs__settings s;
  char err[512];
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = gs__setting_get((gs__setting_id)id);
    assert_non_null(d->key);
    assert_non_null(d->env);
    assert_non_null(d->help);
    assert_non_null(d->metavar);
    assert_true(d->scope != 0);
    assert_int_equal(strncmp(d->env, "GRADSYNC_", 9), 0);
    if (d->alias) assert_int_equal(strncmp(d->alias, "HOROVOD_", 8), 0);
    if (d->flag) assert_int_equal(strncmp(d->flag, "--", 2), 0);
    if (d->type == GS__T_CHOICE) assert_non_null(d->choices);
    if (d->run_flag) {
      /* gradsync-run passes it to gradsyncd as d->flag */
      assert_non_null(d->flag);
      assert_non_null(d->run_metavar);
      assert_true(d->scope & GS__FOR_SERVER);
      assert_int_equal(strncmp(d->run_flag, "--", 2), 0);
      assert_true(d->run_scale >= 0);
    }
    for (int k = 0; k < id; k++) {
      const gs__setting *o = gs__setting_get((gs__setting_id)k);
      assert_string_not_equal(o->key, d->key);
      assert_string_not_equal(o->env, d->env);
      if (o->flag && d->flag) assert_string_not_equal(o->flag, d->flag);
      if (o->run_flag && d->run_flag) assert_string_not_equal(o->run_flag, d->run_flag);
    }
    gs__settings_init(&s);
    if (d->def) {
      /* the default parses */
      assert_int_equal(
          gs__settings_set(&s, (gs__setting_id)id, d->def, GS__SRC_DEFAULT, "x", err, sizeof err),
          GS__OK);
      assert_int_equal(s.v[id].src, GS__SRC_DEFAULT);
    } else {
      assert_int_equal(s.v[id].src, GS__SRC_UNSET);
    }
    gs__settings_free(&s);
  }
}

static void test_fractions_and_aliases(void **state) {
  (void)state;
  gs__settings s;
  char err[512];
  setenv("HOROVOD_CYCLE_TIME", "0.5", 1);
  unsetenv("GRADSYNC_CYCLE_TIME");
  setenv("HOROVOD_FUSION_THRESHOLD", "67108864", 1);
  assert_int_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_CYCLE_TIME), 500); /* microseconds */
  assert_int_equal(gs__settings_int(&s, GS__S_FUSION_THRESHOLD), 67108864);
  char line[4096];
  gs__settings_describe(&s, GS__FOR_SERVER, line, sizeof line);
  assert_non_null(strstr(line, "cycle_time_ms=0.5 (HOROVOD_CYCLE_TIME)"));
  assert_non_null(strstr(line, "fusion_threshold=67108864 (HOROVOD_FUSION_THRESHOLD)"));
  assert_non_null(strstr(line, "emit_policy=adaptive"));
  gs__settings_free(&s);

  /* GRADSYNC_* wins over the alias */
  setenv("GRADSYNC_CYCLE_TIME", "2.25", 1);
  assert_int_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_CYCLE_TIME), 2250);
  assert_string_equal(s.v[GS__S_CYCLE_TIME].from, "GRADSYNC_CYCLE_TIME");
  gs__settings_free(&s);

  setenv("HOROVOD_CYCLE_TIME", "0.0001", 1);
  unsetenv("GRADSYNC_CYCLE_TIME");
  assert_int_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "HOROVOD_CYCLE_TIME='0.0001' is not valid: expected a number from 0 "
                           "to 60000 (up to 3 decimals, e.g. 0.5)");
  gs__settings_free(&s);
  unsetenv("HOROVOD_CYCLE_TIME");
  unsetenv("HOROVOD_FUSION_THRESHOLD");

  /* worker-side aliases: Horovod's rank variables */
  setenv("HOROVOD_RANK", "3", 1);
  assert_int_equal(gs__settings_load(&s, GS__FOR_WORKER, err, sizeof err), GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_RANK), 3);
  assert_true(gs__settings_given(&s, GS__S_RANK));
  assert_false(gs__settings_given(&s, GS__S_SIZE));
  gs__settings_free(&s);
  unsetenv("HOROVOD_RANK");
}

static void test_flags(void **state) {
  (void)state;
  gs__settings s;
  char err[512];
  gs__settings_init(&s);
  char *argv[] = {"gradsyncd",
                  "--cycle-time-ms=0.25",
                  "--cache-capacity",
                  "7",
                  "--listen",
                  "[::1]:0",
                  "--deadlock-action=warn",
                  "--nope",
                  "--heartbeat-ms"};
  int argc = (int)(sizeof argv / sizeof argv[0]);
  int i = 1;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(i, 1);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(i, 3);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 0);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), -1);
  assert_string_equal(err, "--heartbeat-ms needs a value (MS)");
  assert_int_equal(gs__settings_int(&s, GS__S_CYCLE_TIME), 250);
  assert_int_equal(gs__settings_int(&s, GS__S_CACHE_CAPACITY), 7);
  assert_string_equal(gs__settings_str(&s, GS__S_LISTEN), "[::1]:0");
  assert_int_equal(gs__settings_int(&s, GS__S_DEADLOCK_ACTION), 1);
  char buf[64];
  assert_string_equal(gs__settings_format(&s, GS__S_DEADLOCK_ACTION, buf, sizeof buf), "warn");
  /* worker-only settings are not gradsyncd flags */
  char *wargv[] = {"x", "--coordinator", "h:1"};
  i = 1;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, 3, wargv, &i, err, sizeof err), 0);
  gs__settings_free(&s);
}

/* --fast-path: on by default; "--fast-path off", "--fast-path=off" and
 * GRADSYNC_FAST_PATH=off turn it off, "--fast-path" alone or with "on"
 * turns it on; a boolean flag takes the next argument only when it is a
 * boolean word. */
static void test_fast_path_flag(void **state) {
  (void)state;
  gs__settings s;
  char err[512];
  unsetenv("GRADSYNC_FAST_PATH");
  assert_int_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 1);
  char *argv[] = {"gradsyncd",   "--fast-path",      "off", "--fast-path=on",
                  "--fast-path", "--cache-capacity", "3",   "--fast-path",
                  "OFF"};
  int argc = (int)(sizeof argv / sizeof argv[0]);
  int i = 1;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(i, 2); /* took "off" */
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 0);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 1);
  gs__settings_set(&s, GS__S_FAST_PATH, "0", GS__SRC_FLAG, "--fast-path", err, sizeof err);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(i, 4); /* alone: "--cache-capacity" is not a boolean word */
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 1);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(gs__settings_int(&s, GS__S_CACHE_CAPACITY), 3);
  i++;
  assert_int_equal(gs__settings_take_flag(&s, GS__FOR_SERVER, argc, argv, &i, err, sizeof err), 1);
  assert_int_equal(i, 8);
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 0);
  gs__settings_free(&s);

  setenv("GRADSYNC_FAST_PATH", "off", 1);
  assert_int_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_FAST_PATH), 0);
  gs__settings_free(&s);
  setenv("GRADSYNC_FAST_PATH", "sometimes", 1);
  assert_int_not_equal(gs__settings_load(&s, GS__FOR_SERVER, err, sizeof err), GS__OK);
  assert_string_equal(err, "GRADSYNC_FAST_PATH='sometimes' is not valid: expected 1 or 0 "
                           "(true/false, yes/no, on/off)");
  gs__settings_free(&s); /* a failed load leaves the defaults to free, as gradsyncd does */
  unsetenv("GRADSYNC_FAST_PATH");
}

static void test_refusals(void **state) {
  (void)state;
  gs__settings s;
  char err[512];
  gs__settings_init(&s);
  assert_int_equal(
      gs__settings_set(&s, GS__S_COORDINATOR, "h:0", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_string_equal(err, "GRADSYNC_COORDINATOR='h:0' is not valid: expected HOST:PORT with a "
                           "port from 1 to 65535 (IPv6 as [ADDR]:PORT)");
  assert_int_equal(
      gs__settings_set(&s, GS__S_COORDINATOR, "h:65536", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_int_equal(
      gs__settings_set(&s, GS__S_COORDINATOR, "host", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_int_equal(
      gs__settings_set(&s, GS__S_LISTEN, "0.0.0.0:-1", GS__SRC_FLAG, "--listen", err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_string_equal(err, "--listen='0.0.0.0:-1' is not valid: expected HOST:PORT with a port "
                           "from 0 to 65535 (IPv6 as [ADDR]:PORT)");
  assert_int_equal(gs__settings_set(&s, GS__S_COORDINATOR, "[fd00::1]:50051", GS__SRC_ENV, NULL,
                                    err, sizeof err),
                   GS__OK);
  assert_int_equal(gs__settings_int(&s, GS__S_COORDINATOR), 50051);
  assert_int_equal(gs__settings_set(&s, GS__S_DATA_PORT_RANGE, "29600-29500", GS__SRC_ENV, NULL,
                                    err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_string_equal(err, "GRADSYNC_DATA_PORT_RANGE='29600-29500' is not valid: expected LOW-HIGH "
                           "with 1 <= LOW <= HIGH <= 65535 (e.g. 29500-29599)");
  assert_int_equal(gs__settings_set(&s, GS__S_DATA_PORT_RANGE, "29500-29599", GS__SRC_ENV, NULL,
                                    err, sizeof err),
                   GS__OK);
  assert_int_equal(s.v[GS__S_DATA_PORT_RANGE].i, 29500);
  assert_int_equal(s.v[GS__S_DATA_PORT_RANGE].i2, 29599);
  /* GRADSYNC_TCP_CONGESTION: auto by default; a name the kernel could take */
  assert_string_equal(gs__settings_str(&s, GS__S_TCP_CONGESTION), "auto");
  assert_int_equal(
      gs__settings_set(&s, GS__S_TCP_CONGESTION, "Cubic;", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_string_equal(err, "GRADSYNC_TCP_CONGESTION='Cubic;' is not valid: expected auto, system "
                           "or an algorithm name of 1 to 15 lower-case letters, digits, _ or - "
                           "(e.g. cubic)");
  assert_int_equal(gs__settings_set(&s, GS__S_TCP_CONGESTION, "sixteen_letters_", GS__SRC_ENV, NULL,
                                    err, sizeof err),
                   GS__ERR_INVALID_ARG);
  assert_int_equal(
      gs__settings_set(&s, GS__S_TCP_CONGESTION, "reno", GS__SRC_ENV, NULL, err, sizeof err),
      GS__OK);
  assert_string_equal(gs__settings_str(&s, GS__S_TCP_CONGESTION), "reno");
  assert_int_equal(
      gs__settings_set(&s, GS__S_CACHE_CAPACITY, "12abc", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_string_equal(err, "GRADSYNC_CACHE_CAPACITY='12abc' is not valid: expected an integer "
                           "from 0 to 16777216");
  /* a failed set leaves the old value */
  assert_int_equal(gs__settings_int(&s, GS__S_CACHE_CAPACITY), 1024);
  assert_int_equal(
      gs__settings_set(&s, GS__S_EMIT_POLICY, "often", GS__SRC_ENV, NULL, err, sizeof err),
      GS__ERR_INVALID_ARG);
  assert_string_equal(err,
                      "GRADSYNC_EMIT_POLICY='often' is not valid: expected one of adaptive|window");
  /* secrets are never printed */
  assert_int_equal(
      gs__settings_set(&s, GS__S_JOB_TOKEN, "hunter2", GS__SRC_ENV, NULL, err, sizeof err), GS__OK);
  char line[4096];
  gs__settings_describe(&s, GS__FOR_WORKER | GS__FOR_SERVER, line, sizeof line);
  assert_null(strstr(line, "hunter2"));
  assert_non_null(strstr(line, "job_token=(set) (GRADSYNC_JOB_TOKEN)"));
  gs__settings_free(&s);
}

static void test_split_host_port(void **state) {
  (void)state;
  char h[64];
  int port;
  assert_int_equal(gs__split_host_port("a.example:80", h, sizeof h, &port), 0);
  assert_string_equal(h, "a.example");
  assert_int_equal(port, 80);
  assert_int_equal(gs__split_host_port("[::1]:5", h, sizeof h, &port), 0);
  assert_string_equal(h, "::1");
  assert_int_equal(port, 5);
  assert_int_equal(gs__split_host_port("fd00::2", h, sizeof h, &port), 0);
  assert_string_equal(h, "fd00::2");
  assert_int_equal(port, -1);
  assert_int_equal(gs__split_host_port("[::1", h, sizeof h, &port), -1);
}

/* ---- scheduler environments -------------------------------------------------- */

typedef struct fake_env {
  const char *kv[32];
} fake_env;

static const char *fake_get(const char *name, void *arg) {
  fake_env *e = arg;
  size_t n = strlen(name);
  for (int i = 0; e->kv[i]; i++)
    if (!strncmp(e->kv[i], name, n) && e->kv[i][n] == '=') return e->kv[i] + n + 1;
  return NULL;
}

static void test_sched_each(void **state) {
  (void)state;
  gs__sched_info si;
  char err[512];
  fake_env ompi = {{"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3",
                    "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &ompi, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "OpenMPI");
  assert_int_equal(si.rank, 2);
  assert_int_equal(si.size, 3);
  assert_int_equal(si.local_rank, 0);
  assert_int_equal(si.local_size, 1);
  assert_string_equal(si.rank_from, "OMPI_COMM_WORLD_RANK");

  fake_env pmi = {{"PMI_RANK=5", "PMI_SIZE=8", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=4", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &pmi, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "MPICH/PMI");
  assert_int_equal(si.rank, 5);
  assert_int_equal(si.local_size, 4);

  fake_env torch = {{"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &torch, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "torchrun");
  assert_string_equal(si.size_from, "WORLD_SIZE");

  /* Slurm: 7 tasks as 2,2,2,1 on four nodes; task 6 is on node 3 */
  fake_env slurm = {{"SLURM_PROCID=6", "SLURM_NTASKS=7", "SLURM_LOCALID=0", "SLURM_NODEID=3",
                     "SLURM_TASKS_PER_NODE=2(x3),1", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &slurm, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "Slurm");
  assert_int_equal(si.rank, 6);
  assert_int_equal(si.size, 7);
  assert_int_equal(si.local_rank, 0);
  assert_int_equal(si.local_size, 1);
  assert_string_equal(si.local_size_from, "SLURM_TASKS_PER_NODE");
  fake_env slurm2 = {{"SLURM_PROCID=1", "SLURM_NPROCS=4", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                      "SLURM_NTASKS_PER_NODE=2", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &slurm2, &si, err, sizeof err), GS__OK);
  assert_int_equal(si.size, 4);
  assert_int_equal(si.local_size, 2);
  assert_string_equal(si.size_from, "SLURM_NPROCS");

  fake_env k8s = {{"JOB_COMPLETION_INDEX=3", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &k8s, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "Kubernetes Indexed Job");
  assert_int_equal(si.rank, 3);
  assert_int_equal(si.size, -1);

  fake_env none = {{"PATH=/bin", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &none, &si, err, sizeof err), GS__OK);
  assert_null(si.scheduler);
  assert_int_equal(si.rank, -1);
}

static void test_sched_precedence_and_errors(void **state) {
  (void)state;
  gs__sched_info si;
  char err[512];
  /* mpirun inside a Slurm allocation: OpenMPI's numbering wins */
  fake_env both = {{"SLURM_PROCID=0", "SLURM_NTASKS=1", "OMPI_COMM_WORLD_RANK=2",
                    "OMPI_COMM_WORLD_SIZE=4", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &both, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "OpenMPI");
  assert_int_equal(si.rank, 2);
  /* torchrun inside Slurm: torchrun wins */
  fake_env tr = {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "RANK=3", "WORLD_SIZE=4", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &tr, &si, err, sizeof err), GS__OK);
  assert_string_equal(si.scheduler, "torchrun");

  fake_env bad = {{"RANK=4", "WORLD_SIZE=4", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &bad, &si, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "RANK=4 is out of range for WORLD_SIZE=4 (set by torchrun)");
  fake_env junk = {{"PMI_RANK=x1", NULL}};
  assert_int_equal(gs__sched_detect(fake_get, &junk, &si, err, sizeof err), GS__ERR_INVALID_ARG);
  assert_string_equal(err, "PMI_RANK=x1 (set by MPICH/PMI) is not a number from 0 to 65536");

  char seen[256];
  fake_env part = {{"RANK=1", "SLURM_NODEID=2", "HOME=/root", NULL}};
  gs__sched_seen(fake_get, &part, seen, sizeof seen);
  assert_string_equal(seen, "RANK=1, SLURM_NODEID=2");

  assert_int_equal(gs__slurm_tasks_on_node("4", 0), 4);
  assert_int_equal(gs__slurm_tasks_on_node("3(x2),1,2(x2)", 4), 2);
  assert_int_equal(gs__slurm_tasks_on_node("3(x2),1", 2), 1);
  assert_int_equal(gs__slurm_tasks_on_node("3(x2),1", 3), -1);
  assert_int_equal(gs__slurm_tasks_on_node("3(2)", 0), -1);
}

/* gradsyncd --help shows every flag's whole help text and its bracket
 * (accepted values, default, variables), however long, in lines of at most
 * 80 columns: a fixed buffer once cut the two longest texts mid-word. */
static void test_usage_is_whole(void **state) {
  (void)state;
  char *out = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&out, &len);
  assert_non_null(f);
  gs__settings_usage(f, GS__FOR_SERVER);
  assert_int_equal(fclose(f), 0);
  /* Each line fits 80 columns; then join the lines, runs of spaces as one. */
  char *flat = malloc(len + 1);
  assert_non_null(flat);
  size_t n = 0, line = 0;
  for (size_t i = 0; i < len; i++) {
    if (out[i] == '\n') {
      assert_true(line <= 80);
      line = 0;
    } else {
      line++;
    }
    char c = out[i] == '\n' ? ' ' : out[i];
    if (c == ' ' && n > 0 && flat[n - 1] == ' ') continue;
    flat[n++] = c;
  }
  flat[n] = '\0';
  int flags = 0;
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = gs__setting_get((gs__setting_id)id);
    if (!d->flag || !(d->scope & GS__FOR_SERVER)) continue;
    flags++;
    char want[2048];
    snprintf(want, sizeof want, "%s %s %s [", d->flag, d->metavar, d->help);
    if (!strstr(flat, want)) fail_msg("--help lacks the whole text of %s", d->flag);
    snprintf(want, sizeof want, "env %s%s%s]", d->env, d->alias ? ", " : "",
             d->alias ? d->alias : "");
    if (!strstr(flat, want)) fail_msg("--help lacks %s's variables (%s)", d->flag, want);
  }
  assert_true(flags > 30);
  free(flat);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_row_is_sound),
      cmocka_unit_test(test_fractions_and_aliases),
      cmocka_unit_test(test_flags),
      cmocka_unit_test(test_fast_path_flag),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_split_host_port),
      cmocka_unit_test(test_sched_each),
      cmocka_unit_test(test_sched_precedence_and_errors),
      cmocka_unit_test(test_usage_is_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
