/* gradsyncd: the coordinator service of a gradsync job. Parses flags and
 * environment, starts the transport and runs its event loop on the main
 * thread until SIGINT or SIGTERM, then shuts down gracefully (sessions end
 * with UNAVAILABLE) and exits 0. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "log.h"
#include "status.h"
#include "coordinator.h"
#include "transport.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: gradsyncd [options]\n"
      "  --listen HOST:PORT        address to serve on (default 127.0.0.1:0 = a free port;\n"
      "                            env GRADSYNC_LISTEN)\n"
      "  --world-size N            ranks in the job (default: the size the first rank gives;\n"
      "                            env GRADSYNC_WORLD_SIZE)\n"
      "  --job-id ID               accept only ranks of this job (env GRADSYNC_JOB_ID)\n"
      "  --token TOKEN             require 'authorization: Bearer TOKEN' from ranks\n"
      "                            (env GRADSYNC_JOB_TOKEN)\n"
      "  --cycle-time-ms MS        worker batching period (default 1; env GRADSYNC_CYCLE_TIME,\n"
      "                            HOROVOD_CYCLE_TIME)\n"
      "  --fusion-threshold BYTES  fuse allreduces up to this many bytes (default 1048576;\n"
      "                            0 = off; env GRADSYNC_FUSION_THRESHOLD, "
      "HOROVOD_FUSION_THRESHOLD)\n"
      "  --emit-policy P           adaptive (default: emit at once while fewer than\n"
      "                            --max-plans-in-flight plans are unfinished, else fuse) or\n"
      "                            window (emit every cycle time, like Horovod)\n"
      "                            (env GRADSYNC_EMIT_POLICY)\n"
      "  --max-plans-in-flight N   adaptive policy depth (default 2; env\n"
      "                            GRADSYNC_MAX_PLANS_IN_FLIGHT)\n"
      "  --cache-capacity N        response cache entries (default 1024; 0 = off; env\n"
      "                            GRADSYNC_CACHE_CAPACITY, HOROVOD_CACHE_CAPACITY)\n"
      "  --stall-warning-s S       report tensors waiting on some ranks for S seconds, checked\n"
      "                            every S seconds (default 60; 0 = off; env\n"
      "                            GRADSYNC_STALL_CHECK_TIME_SECONDS, "
      "HOROVOD_STALL_CHECK_TIME_SECONDS)\n"
      "  --stall-shutdown-s S      abort the job when a tensor waits S seconds (default 0 = "
      "never;\n"
      "                            env GRADSYNC_STALL_SHUTDOWN_TIME_SECONDS,\n"
      "                            HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)\n"
      "  --deadlock-time-ms MS     every rank blocked and nothing new for MS = deadlock\n"
      "                            (default 5000; 0 = off; env GRADSYNC_DEADLOCK_TIME_MS)\n"
      "  --deadlock-action A       abort (default) or warn (env GRADSYNC_DEADLOCK_ACTION)\n"
      "  --rank-timeout-ms MS      a rank silent this long is lost (default 10000; 0 = off;\n"
      "                            env GRADSYNC_RANK_TIMEOUT_MS)\n"
      "  --heartbeat-ms MS         rank heartbeat period (default 1000; env "
      "GRADSYNC_HEARTBEAT_MS)\n"
      "  --log-level LEVEL         error, warn, info (default) or debug (env GRADSYNC_LOG_LEVEL)\n"
      "  -h, --help                this text\n"
      "Prints 'gradsyncd listening on HOST:PORT' on stdout once ready.\n");
}

static int should_stop(void *arg) {
  sigset_t *set = arg;
  struct timespec zero = {0, 0};
  int sig = sigtimedwait(set, NULL, &zero);
  if (sig == SIGINT || sig == SIGTERM) {
    GS_LOG_INFO("received %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return 1;
  }
  return 0;
}

static int flag_int(const char *flag, const char *val, int64_t min, int64_t max, int64_t *out) {
  char err[256];
  if (gs__parse_int(val, flag, min, max, out, err, sizeof err) != GS__OK) {
    fprintf(stderr, "gradsyncd: %s\n", err);
    return -1;
  }
  return 0;
}

static int parse_policy(const char *val, int *window) {
  if (!strcmp(val, "adaptive"))
    *window = 0;
  else if (!strcmp(val, "window"))
    *window = 1;
  else {
    fprintf(stderr, "gradsyncd: emit policy '%s': expected adaptive or window\n", val);
    return -1;
  }
  return 0;
}

static int parse_action(const char *val, int *warn_only) {
  if (!strcmp(val, "abort"))
    *warn_only = 0;
  else if (!strcmp(val, "warn"))
    *warn_only = 1;
  else {
    fprintf(stderr, "gradsyncd: deadlock action '%s': expected abort or warn\n", val);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  gs__log_init("gradsyncd");
  gs__coordinator_opts o;
  memset(&o, 0, sizeof o);
  gs__server_opts so;
  memset(&so, 0, sizeof so);
  so.listen = getenv("GRADSYNC_LISTEN") && *getenv("GRADSYNC_LISTEN") ? getenv("GRADSYNC_LISTEN")
                                                                      : "127.0.0.1:0";
  so.token = getenv("GRADSYNC_JOB_TOKEN");
  so.shutdown_grace_ms = 2000;
  o.job_id = getenv("GRADSYNC_JOB_ID");

  char err[GS__MAX_TEXT];
  int64_t v;
  static const char *const world_env[] = {"GRADSYNC_WORLD_SIZE", NULL};
  static const char *const stall_env[] = {"GRADSYNC_STALL_CHECK_TIME_SECONDS",
                                          "HOROVOD_STALL_CHECK_TIME_SECONDS", NULL};
  static const char *const shut_env[] = {"GRADSYNC_STALL_SHUTDOWN_TIME_SECONDS",
                                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", NULL};
  static const char *const dl_env[] = {"GRADSYNC_DEADLOCK_TIME_MS", NULL};
  static const char *const rt_env[] = {"GRADSYNC_RANK_TIMEOUT_MS", NULL};
  static const char *const hb_env[] = {"GRADSYNC_HEARTBEAT_MS", NULL};
  if (gs__env_int(stall_env, 60, 0, 86400, &v, err, sizeof err)) goto bad_env;
  o.job.stall_warning_s = (uint32_t)v;
  if (gs__env_int(shut_env, 0, 0, 86400 * 7, &v, err, sizeof err)) goto bad_env;
  o.job.stall_shutdown_s = (uint32_t)v;
  if (gs__env_int(dl_env, 5000, 0, 86400000, &v, err, sizeof err)) goto bad_env;
  o.job.deadlock_time_ms = (uint32_t)v;
  if (gs__env_int(rt_env, 10000, 0, 86400000, &v, err, sizeof err)) goto bad_env;
  o.job.rank_timeout_ms = (uint32_t)v;
  if (gs__env_int(hb_env, 1000, 10, 60000, &v, err, sizeof err)) goto bad_env;
  o.job.heartbeat_ms = (uint32_t)v;
  static const char *const fusion_env[] = {"GRADSYNC_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD",
                                           NULL};
  static const char *const inflight_env[] = {"GRADSYNC_MAX_PLANS_IN_FLIGHT", NULL};
  static const char *const cache_env[] = {"GRADSYNC_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY",
                                          NULL};
  if (gs__env_int(cache_env, 1024, 0, 1 << 24, &v, err, sizeof err)) goto bad_env;
  o.job.cache_capacity = (uint32_t)v;
  if (gs__env_int(fusion_env, 1 << 20, 0, (int64_t)1 << 40, &v, err, sizeof err)) goto bad_env;
  o.job.fusion_threshold_bytes = (uint64_t)v;
  if (gs__env_int(inflight_env, 2, 1, 1024, &v, err, sizeof err)) goto bad_env;
  o.max_plans_in_flight = (int)v;
  const char *policy = getenv("GRADSYNC_EMIT_POLICY");
  if (policy && *policy && parse_policy(policy, &o.window_policy)) return 2;
  const char *action = getenv("GRADSYNC_DEADLOCK_ACTION");
  if (action && *action && parse_action(action, &o.deadlock_warn_only)) return 2;
  static const char *const cycle_env[] = {"GRADSYNC_CYCLE_TIME", "HOROVOD_CYCLE_TIME", NULL};
  if (gs__env_int(world_env, 0, 0, 65536, &v, err, sizeof err)) goto bad_env;
  o.world_size = (int32_t)v;
  if (gs__env_int(cycle_env, 1, 0, 60000, &v, err, sizeof err)) goto bad_env;
  o.job.cycle_time_us = (uint32_t)v * 1000u;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!val) {
      fprintf(stderr, "gradsyncd: unknown flag or missing value: %s\n", a);
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--listen")) {
      so.listen = val;
    } else if (!strcmp(a, "--world-size")) {
      if (flag_int(a, val, 1, 65536, &v)) return 2;
      o.world_size = (int32_t)v;
    } else if (!strcmp(a, "--job-id")) {
      o.job_id = val;
    } else if (!strcmp(a, "--token")) {
      so.token = val;
    } else if (!strcmp(a, "--cycle-time-ms")) {
      if (flag_int(a, val, 0, 60000, &v)) return 2;
      o.job.cycle_time_us = (uint32_t)v * 1000u;
    } else if (!strcmp(a, "--fusion-threshold")) {
      if (flag_int(a, val, 0, (int64_t)1 << 40, &v)) return 2;
      o.job.fusion_threshold_bytes = (uint64_t)v;
    } else if (!strcmp(a, "--cache-capacity")) {
      if (flag_int(a, val, 0, 1 << 24, &v)) return 2;
      o.job.cache_capacity = (uint32_t)v;
    } else if (!strcmp(a, "--emit-policy")) {
      if (parse_policy(val, &o.window_policy)) return 2;
    } else if (!strcmp(a, "--max-plans-in-flight")) {
      if (flag_int(a, val, 1, 1024, &v)) return 2;
      o.max_plans_in_flight = (int)v;
    } else if (!strcmp(a, "--stall-warning-s")) {
      if (flag_int(a, val, 0, 86400, &v)) return 2;
      o.job.stall_warning_s = (uint32_t)v;
    } else if (!strcmp(a, "--stall-shutdown-s")) {
      if (flag_int(a, val, 0, 86400 * 7, &v)) return 2;
      o.job.stall_shutdown_s = (uint32_t)v;
    } else if (!strcmp(a, "--deadlock-time-ms")) {
      if (flag_int(a, val, 0, 86400000, &v)) return 2;
      o.job.deadlock_time_ms = (uint32_t)v;
    } else if (!strcmp(a, "--deadlock-action")) {
      if (parse_action(val, &o.deadlock_warn_only)) return 2;
    } else if (!strcmp(a, "--rank-timeout-ms")) {
      if (flag_int(a, val, 0, 86400000, &v)) return 2;
      o.job.rank_timeout_ms = (uint32_t)v;
    } else if (!strcmp(a, "--heartbeat-ms")) {
      if (flag_int(a, val, 10, 60000, &v)) return 2;
      o.job.heartbeat_ms = (uint32_t)v;
    } else if (!strcmp(a, "--log-level")) {
      static const char *const lv[] = {"error", "warn", "info", "debug"};
      int found = 0;
      for (int k = 0; k < 4; k++)
        if (!strcmp(val, lv[k])) {
          gs__log_set_level((gs__log_level)k);
          found = 1;
        }
      if (!found) {
        fprintf(stderr, "gradsyncd: --log-level '%s': expected error, warn, info or debug\n", val);
        return 2;
      }
    } else {
      fprintf(stderr, "gradsyncd: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    }
  }

  /* Block the stop signals before gRPC starts threads so they inherit the
   * mask; the event loop collects them with sigtimedwait. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  gs__server *s = NULL;
  gs__coordinator *co = NULL;
  int rc = 1;
  if (gs__server_create(&so, &s, err, sizeof err) != GS__OK) {
    GS_LOG_ERROR("%s", err);
    return 1;
  }
  if (gs__coordinator_create(&o, s, &co, err, sizeof err) != GS__OK ||
      gs__server_add_service(s, gs__coordinator_service(co)) != GS__OK ||
      gs__server_start(s, err, sizeof err) != GS__OK) {
    GS_LOG_ERROR("%s", err);
    goto out_destroy;
  }
  char host[256];
  snprintf(host, sizeof host, "%s", so.listen);
  char *colon = strrchr(host, ':');
  if (colon) *colon = 0;
  printf("gradsyncd listening on %s:%d\n", host, gs__server_port(s));
  fflush(stdout);
  GS_LOG_INFO("serving %s:%d, world size %s%d%s", host, gs__server_port(s),
              o.world_size ? "" : "(from the first rank) ", o.world_size,
              so.token && *so.token ? ", job token required" : "");
  gs__server_run(s, should_stop, &set);
  rc = 0;
out_destroy:
  gs__server_destroy(s);
  gs__coordinator_destroy(co);
  if (rc == 0) GS_LOG_INFO("stopped");
  return rc;

bad_env:
  fprintf(stderr, "gradsyncd: %s\n", err);
  return 2;
}
