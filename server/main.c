/* gradsyncd: the coordinator service of a gradsync job. Parses flags and
 * environment, starts the transport and runs its event loop on the main
 * thread until the job is over (one job per coordinator, unless
 * --serve-forever) or SIGINT/SIGTERM, then shuts down gracefully.
 *
 * Exit status: 0 the job finished (every rank left cleanly) or a stop
 * signal ended the coordinator; 1 it could not start (address in use, ...);
 * 2 bad flags or environment; 3 the job failed (a rank was lost, a
 * deadlock or stall shutdown aborted it), after every rank was told. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "listen_addr.h"
#include "grpc_util.h"
#include "log.h"
#include "secret.h"
#include "settings.h"
#include "status.h"
#include "coordinator.h"
#include "diagnostics.h"
#include "health.h"
#include "metrics_http.h"
#include "reflection.h"
#include "transport.h"

static void usage(FILE *f) {
  fputs("usage: gradsyncd [options]   (--flag VALUE or --flag=VALUE)\n", f);
  gs__settings_usage(f, GS__FOR_SERVER);
  fputs("  -h, --help                this text\n"
        "  --version                 print the version and exit\n"
        "Prints 'gradsyncd listening on HOST:PORT' on stdout once ready.\n",
        f);
}

enum { EXIT_JOB_FAILED = 3 };

typedef struct stop_state {
  sigset_t set; /* the signals the loop collects */
  gs__coordinator *co;
  gs__server *s;
  const gs__server_opts *so;
  int grace_s;
  int stopping; /* a stop signal came: the server is shutting down */
} stop_state;

/* SIGHUP: the TLS files again; a file that fails the checks changes
 * nothing. */
static void reload_tls(stop_state *st) {
  char about[512], err[1024];
  int rc = gs__server_reload_tls(st->s, about, sizeof about, err, sizeof err);
  if (rc == GS__ERR_UNSUPPORTED)
    GS_LOG_WARN("received SIGHUP: nothing to reload: %s", err);
  else if (rc)
    GS_LOG_ERROR("received SIGHUP: the TLS files were NOT reloaded: %s. Correct the file and "
                 "send SIGHUP again; until then new connections get the previous certificate",
                 err);
  else
    GS_LOG_INFO("received SIGHUP: reloaded the TLS files (--tls-cert %s, --tls-key %s%s%s): %s; "
                "new connections get them, open sessions keep theirs",
                st->so->tls_cert, st->so->tls_key,
                st->so->tls_client_ca ? ", --tls-client-ca " : "",
                st->so->tls_client_ca ? st->so->tls_client_ca : "", about);
}

/* Polled by the event loop, also while shutting down: a stop signal (the
 * first drains, a second ends the drain), or (one job) the job is over. */
static gs__stop should_stop(void *arg) {
  stop_state *st = arg;
  struct timespec zero = {0, 0};
  int sig;
  while ((sig = sigtimedwait(&st->set, NULL, &zero)) > 0) {
    const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if ((sig == SIGINT || sig == SIGTERM) && st->stopping) {
      GS_LOG_INFO("received %s again: closing now", name);
      return GS__STOP_NOW;
    }
    if (sig == SIGINT || sig == SIGTERM) {
      st->stopping = 1;
      if (gs__coordinator_job_over(st->co)) {
        /* Nothing to drain: the job ended and its sessions are closing. */
        GS_LOG_INFO("received %s: the job is already over; exiting", name);
        return GS__STOP_NOW;
      }
      GS_LOG_INFO("received %s: telling every rank the coordinator is going away; exiting "
                  "within %d s",
                  name, st->grace_s);
      return GS__STOP_DRAIN;
    }
    if (sig == SIGHUP) reload_tls(st);
  }
  return gs__coordinator_outcome(st->co) != GS__JOB_RUNNING ? GS__STOP_NOW : GS__RUN_ON;
}

/* The job token, TLS files and listen address together: refuses what
 * would leave a job open to anyone who reaches its port. 0, or -1 with a
 * message in err. */
static int check_security(gs__server_opts *o, const char *token_file, char *file_token,
                          int insecure, char *err, size_t errlen) {
  int loopback = 0;
  if (gs__listen_check(o->listen, &loopback, err, errlen) != GS__OK) return -1;
  if (token_file) {
    char why[1024];
    if (gs__token_read_file(token_file, file_token, why, sizeof why) != GS__OK) {
      snprintf(err, errlen, "--token-file: %s", why);
      return -1;
    }
    o->token = file_token;
  }
  if (o->token && !*o->token) o->token = NULL;
  if (o->token && gs__token_check(o->token, err, errlen) != 0) return -1;
  if (!o->tls_cert != !o->tls_key) {
    snprintf(err, errlen, "--tls-cert and --tls-key go together; only %s was given",
             o->tls_cert ? "--tls-cert" : "--tls-key");
    return -1;
  }
  if (o->tls_client_ca && !o->tls_cert) {
    snprintf(err, errlen, "--tls-client-ca (mTLS) needs --tls-cert and --tls-key");
    return -1;
  }
  if (!loopback && !o->token && !o->tls_cert && !insecure) {
    snprintf(err, errlen,
             "refusing to serve %s without authentication: anyone who can reach this port could "
             "join the job, write its rendezvous keys and read its data-plane addresses. Give a "
             "job token with --token-file FILE (or GRADSYNC_JOB_TOKEN) and/or TLS with "
             "--tls-cert/--tls-key, or pass --insecure if the network is trusted.",
             o->listen);
    return -1;
  }
  if (!loopback && !o->token && insecure)
    GS_LOG_WARN("serving %s with --insecure and no job token: anyone who can reach the port "
                "can join this job",
                o->listen);
  return 0;
}

/* The effective settings of gradsyncd by key, for GetStatus (values
 * malloc'd; secrets as "(set)"). Returns how many. */
static size_t effective_settings(const gs__settings *cfg, gs__diag_setting *out, size_t cap) {
  size_t n = 0;
  char buf[1024];
  for (int id = 0; id < GS__S_COUNT && n < cap; id++) {
    const gs__setting *row = gs__setting_get((gs__setting_id)id);
    if (!(row->scope & GS__FOR_SERVER)) continue;
    out[n].key = (char *)row->key;
    out[n].value = strdup(gs__settings_format(cfg, (gs__setting_id)id, buf, sizeof buf));
    if (out[n].value) n++;
  }
  return n;
}

int main(int argc, char **argv) {
  gs__log_init("gradsyncd");
  char err[GS__MAX_TEXT];
  gs__settings cfg;
  if (gs__settings_load(&cfg, GS__FOR_SERVER, err, sizeof err) != GS__OK) goto bad_usage;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      gs__settings_free(&cfg);
      return 0;
    }
    if (!strcmp(a, "--version")) {
      printf("gradsyncd %s\n", GS__VERSION);
      gs__settings_free(&cfg);
      return 0;
    }
    int took = gs__settings_take_flag(&cfg, GS__FOR_SERVER, argc, argv, &i, err, sizeof err);
    if (took < 0) goto bad_usage;
    if (took == 0) {
      snprintf(err, sizeof err, "unknown flag %s (see --help)", a);
      goto bad_usage;
    }
  }
  gs__log_set_level((gs__log_level)gs__settings_int(&cfg, GS__S_LOG_LEVEL));
  static const gs__log_format formats[] = {GS__LOG_LOGFMT, GS__LOG_JSON, GS__LOG_TEXT};
  gs__log_set_format(formats[gs__settings_int(&cfg, GS__S_LOG_FORMAT)]);
  gs__grpc_route_logs();

  gs__coordinator_opts o;
  memset(&o, 0, sizeof o);
  gs__server_opts so;
  memset(&so, 0, sizeof so);
  so.listen = gs__settings_str(&cfg, GS__S_LISTEN);
  so.token = gs__settings_str(&cfg, GS__S_JOB_TOKEN);
  so.shutdown_grace_ms = (int)gs__settings_int(&cfg, GS__S_SHUTDOWN_GRACE) * 1000;
  so.grpc_memory_max_bytes = (size_t)gs__settings_int(&cfg, GS__S_GRPC_MEMORY_MAX_BYTES);
  so.max_streams_per_connection = (int)gs__settings_int(&cfg, GS__S_MAX_STREAMS_PER_CONNECTION);
  o.job_id = gs__settings_str(&cfg, GS__S_JOB_ID);
  o.world_size = (int32_t)gs__settings_int(&cfg, GS__S_WORLD_SIZE);
  o.job.cycle_time_us = (uint32_t)gs__settings_int(&cfg, GS__S_CYCLE_TIME);
  o.job.fusion_threshold_bytes = (uint64_t)gs__settings_int(&cfg, GS__S_FUSION_THRESHOLD);
  o.job.cache_capacity = (uint32_t)gs__settings_int(&cfg, GS__S_CACHE_CAPACITY);
  o.window_policy = gs__settings_int(&cfg, GS__S_EMIT_POLICY) == 1;
  o.max_plans_in_flight = (int)gs__settings_int(&cfg, GS__S_MAX_PLANS_IN_FLIGHT);
  o.max_pending_per_rank = (uint32_t)gs__settings_int(&cfg, GS__S_MAX_PENDING_PER_RANK);
  o.job.stall_warning_s = (uint32_t)gs__settings_int(&cfg, GS__S_STALL_WARNING);
  o.job.stall_shutdown_s = (uint32_t)gs__settings_int(&cfg, GS__S_STALL_SHUTDOWN);
  o.job.deadlock_time_ms = (uint32_t)gs__settings_int(&cfg, GS__S_DEADLOCK_TIME);
  o.deadlock_warn_only = gs__settings_int(&cfg, GS__S_DEADLOCK_ACTION) == 1;
  o.job.rank_timeout_ms = (uint32_t)gs__settings_int(&cfg, GS__S_RANK_TIMEOUT);
  o.job.heartbeat_ms = (uint32_t)gs__settings_int(&cfg, GS__S_HEARTBEAT);
  o.kv_max_bytes = (size_t)gs__settings_int(&cfg, GS__S_KV_MAX_BYTES);
  o.kv_max_keys = (size_t)gs__settings_int(&cfg, GS__S_KV_MAX_KEYS);
  o.session_queue_max_bytes = (size_t)gs__settings_int(&cfg, GS__S_SESSION_QUEUE_MAX_BYTES);
  o.join_timeout_ms = (int)gs__settings_int(&cfg, GS__S_JOIN_TIMEOUT);
  so.tls_cert = gs__settings_str(&cfg, GS__S_SERVER_TLS_CERT);
  so.tls_key = gs__settings_str(&cfg, GS__S_SERVER_TLS_KEY);
  so.tls_client_ca = gs__settings_str(&cfg, GS__S_TLS_CLIENT_CA);
  static char file_token[GS__MAX_TOKEN + 1];
  if (check_security(&so, gs__settings_str(&cfg, GS__S_JOB_TOKEN_FILE), file_token,
                     (int)gs__settings_int(&cfg, GS__S_INSECURE), err, sizeof err) != 0)
    goto bad_usage;
  o.serve_forever = (int)gs__settings_int(&cfg, GS__S_SERVE_FOREVER);
  o.fast_path = (int)gs__settings_int(&cfg, GS__S_FAST_PATH);
  o.fast_path_backoff = (uint32_t)gs__settings_int(&cfg, GS__S_FAST_PATH_BACKOFF);
  o.drain_ms = (uint32_t)so.shutdown_grace_ms;
  char line[4096];
  gs__settings_describe(&cfg, GS__FOR_SERVER, line, sizeof line);
  GS_LOG_INFO("settings: %s", line);

  /* Block the stop signals (and SIGHUP, TLS reload) before gRPC starts threads
   * so they inherit the mask; the event loop collects them with
   * sigtimedwait. */
  stop_state stop = {.grace_s = (int)gs__settings_int(&cfg, GS__S_SHUTDOWN_GRACE)};
  sigemptyset(&stop.set);
  sigaddset(&stop.set, SIGINT);
  sigaddset(&stop.set, SIGTERM);
  sigaddset(&stop.set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop.set, NULL);
  signal(SIGPIPE, SIG_IGN);

  gs__server *s = NULL;
  gs__coordinator *co = NULL;
  gs__diagnostics *diag = NULL;
  gs__health *health = NULL;
  gs__reflection *refl = NULL;
  gs__metrics_http *http = NULL;
  int rc = 1;
  gs__diag_setting settings[GS__S_COUNT];
  size_t nset = effective_settings(&cfg, settings, GS__S_COUNT);
  for (size_t i = 0; i < nset; i++) /* a token read from --token-file counts as set */
    if (!strcmp(settings[i].key, "job_token") && so.token && *so.token) {
      char *v = strdup("(set)");
      if (v) {
        free(settings[i].value);
        settings[i].value = v;
      }
    }
  gs__diagnostics_opts dopts = {(int)gs__settings_int(&cfg, GS__S_DIAGNOSTICS_OPEN), settings, nset,
                                GS__VERSION};
  /* What health and reflection name (reflection adds itself). */
  static const char *const served[] = {"gradsync.v1.Coordinator", "gradsync.v1.Diagnostics",
                                       "grpc.health.v1.Health"};
  if (gs__server_create(&so, &s, err, sizeof err) != GS__OK) {
    GS_LOG_ERROR("%s", err);
    goto out_destroy;
  }
  if (gs__coordinator_create(&o, s, &co, err, sizeof err) != GS__OK) goto out_err;
  const char *timeline = gs__settings_str(&cfg, GS__S_TIMELINE);
  if (timeline && *timeline &&
      gs__coordinator_timeline_start(co, timeline, err, sizeof err) != GS__OK)
    goto out_err;
  snprintf(err, sizeof err, "out of memory");
  if (gs__diagnostics_create(&dopts, co, &diag) != GS__OK ||
      gs__health_create(served, 3, &health) != GS__OK ||
      gs__reflection_create(served, 3, &refl, err, sizeof err) != GS__OK)
    goto out_err;
  if (gs__server_add_service(s, gs__coordinator_service(co)) != GS__OK ||
      gs__server_add_service(s, gs__diagnostics_service(diag)) != GS__OK ||
      gs__server_add_service(s, gs__health_service(health)) != GS__OK ||
      gs__server_add_service(s, gs__reflection_service_v1alpha(refl)) != GS__OK ||
      gs__server_add_service(s, gs__reflection_service_v1(refl)) != GS__OK) {
    snprintf(err, sizeof err, "internal: could not register the services");
    goto out_err;
  }
  const char *metrics_listen = gs__settings_str(&cfg, GS__S_METRICS_LISTEN);
  if (metrics_listen && *metrics_listen &&
      (gs__metrics_http_create(metrics_listen, diag, &http, err, sizeof err) != GS__OK ||
       gs__server_add_service(s, gs__metrics_http_service(http)) != GS__OK))
    goto out_err;
  if (gs__server_start(s, err, sizeof err) != GS__OK) goto out_err;
  char host[256];
  snprintf(host, sizeof host, "%s", so.listen);
  char *colon = strrchr(host, ':');
  if (colon) *colon = 0;
  printf("gradsyncd listening on %s:%d\n", host, gs__server_port(s));
  if (http) {
    char mhost[256];
    int mport;
    gs__split_host_port(metrics_listen, mhost, sizeof mhost, &mport);
    printf("gradsyncd metrics on http://%s%s%s:%d/metrics\n", strchr(mhost, ':') ? "[" : "", mhost,
           strchr(mhost, ':') ? "]" : "", gs__metrics_http_port(http));
  }
  fflush(stdout);
  GS_LOG_INFO("serving %s:%d, world size %s%d%s; %s", host, gs__server_port(s),
              o.world_size ? "" : "(from the first rank) ", o.world_size,
              so.token && *so.token ? ", job token required" : "",
              o.serve_forever ? "job after job (--serve-forever)"
                              : "one job, then exit (0: finished, 3: failed)");
  if (so.tls_cert)
    GS_LOG_INFO("TLS on (%s)", so.tls_client_ca ? "mTLS: client certificates required"
                                                : "server certificate only");
  stop.co = co;
  stop.s = s;
  stop.so = &so;
  gs__server_run(s, should_stop, &stop);
  rc = gs__coordinator_outcome(co) == GS__JOB_FAILED ? EXIT_JOB_FAILED : 0;
  goto out_destroy;
out_err:
  GS_LOG_ERROR("%s", err);
out_destroy:
  gs__server_destroy(s);
  gs__metrics_http_destroy(http);
  gs__diagnostics_destroy(diag);
  gs__health_destroy(health);
  gs__reflection_destroy(refl);
  gs__coordinator_destroy(co);
  for (size_t i = 0; i < nset; i++) free(settings[i].value);
  if (rc == 0) GS_LOG_INFO("stopped");
  if (rc == EXIT_JOB_FAILED) GS_LOG_ERROR("stopped: the job failed (exit status %d)", rc);
  gs__settings_free(&cfg);
  return rc;

bad_usage:
  fprintf(stderr, "gradsyncd: %s\n", err);
  gs__settings_free(&cfg);
  return 2;
}
