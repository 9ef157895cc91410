/* The public API of libgradsync (gradsync.h): options, gs_init and
 * gs_shutdown, op submission and the waits. Runs on application threads;
 * hands ops to the background thread through ctx->mu's submission queue
 * (see worker.h for who owns what). */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "client.h"
#include "clock.h"
#include "handoff_trace.h"
#include "dtype.h"
#include "gradsync.h"
#include "log.h"
#include "scheduler.h"
#include "secret.h"
#include "settings.h"
#include "status.h"
#include "worker.h"

_Static_assert((int)GS_ERR_ALREADY_JOINED == GS__ERR_ALREADY_JOINED, "status numbering");
_Static_assert((int)GS_ERR_MISMATCH == GS__ERR_MISMATCH, "status numbering");
_Static_assert((int)GS_ERR_FORKED == GS__ERR_FORKED, "status numbering");
_Static_assert((int)GS_UINT8 == (int)GS__UINT8, "dtype numbering");
_Static_assert((int)GS_INT16 == (int)GS__INT16, "dtype numbering");
_Static_assert((int)GS_BFLOAT16 == (int)GS__BFLOAT16, "dtype numbering");
_Static_assert((int)GS_ADASUM == (int)GS__ADASUM, "reduce op numbering");
_Static_assert((int)GS_PRODUCT == (int)GS__PRODUCT, "reduce op numbering");

static __thread char tl_error[4096];

/* Records msg as the calling thread's last error and returns status. */
gs_status gs__set_error(gs_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_error, sizeof tl_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *gs_version(void) {
  return GS_VERSION_STRING;
}

const char *gs_last_error(const gs_ctx *ctx) {
  (void)ctx;
  return tl_error;
}

const char *gs_status_str(gs_status status) {
  static const char *const text[] = {
      "GS_OK: success",
      "GS_ERR_INVALID_ARG: invalid argument",
      "GS_ERR_NO_MEMORY: out of memory",
      "GS_ERR_TIMEOUT: timed out",
      "GS_ERR_MISMATCH: tensor differs across ranks",
      "GS_ERR_DUPLICATE_NAME: tensor name already in flight",
      "GS_ERR_JOIN_REFUSED: coordinator refused to let this rank join",
      "GS_ERR_JOIN_TIMEOUT: not every rank joined in time",
      "GS_ERR_COORDINATOR_LOST: connection to the coordinator lost",
      "GS_ERR_RANK_LOST: a rank of the job was lost",
      "GS_ERR_DATA_PLANE: data-plane (backend) failure",
      "GS_ERR_ABORTED: job aborted",
      "GS_ERR_SHUTDOWN: library is shutting down",
      "GS_ERR_DEADLOCK: deadlock detected",
      "GS_ERR_STALL: stalled past the shutdown time",
      "GS_ERR_UNSUPPORTED: not supported",
      "GS_ERR_INTERNAL: internal error (a gradsync bug)",
      "GS_ERR_UNAUTHENTICATED: not authenticated (job token or TLS)",
      "GS_ERR_ALREADY_JOINED: this rank already joined",
      "GS_ERR_FORKED: this context was made in another process (before a fork)",
  };
  _Static_assert(sizeof text / sizeof *text == GS__STATUS_COUNT, "one text per status");
  if ((int)status < 0 || (int)status >= GS__STATUS_COUNT) return "unknown gradsync status";
  return text[status];
}

size_t gs_dtype_size(gs_dtype dtype) {
  return gs__dtype_size((gs__dtype)dtype);
}

void gs_options_init(gs_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->rank = o->size = o->local_rank = o->local_size = -1;
  o->join_timeout_ms = o->data_timeout_ms = -1;
  o->scale_local = -1;
  o->cuda_device = -1;
}

void gs_allreduce_opts_init(gs_allreduce_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

void gs_op_opts_init(gs_op_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

void gs_sparse_opts_init(gs_sparse_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

void gs_stats_init(gs_stats *s) {
  if (!s) return;
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
}

/* Every public options/stats struct starts with its size (see gradsync.h):
 * the caller's struct may be shorter (an older header: the rest keeps our
 * defaults) but not longer (a newer header: fields we cannot honour). */
gs_status gs__opts_copy(void *dst, const void *src, const char *type) {
  size_t ours, given;
  memcpy(&ours, dst, sizeof ours);
  memcpy(&given, src, sizeof given);
  if (given > ours)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s.struct_size is %zu, larger than this libgradsync %s knows (%zu): the "
                         "program was compiled against a newer gradsync.h; link the matching "
                         "libgradsync",
                         type, given, GS_VERSION_STRING, ours);
  if (given <= sizeof(size_t))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s.struct_size is %zu: initialise the struct with %s_init before "
                         "setting fields",
                         type, given, type);
  memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), given - sizeof(size_t));
  return GS_OK;
}

/* ---- gs_init -------------------------------------------------------------- */

typedef struct resolved {
  gs__settings set; /* owns the strings below */
  const char *coordinator, *token, *advertise, *data_addr, *job_id;
  int port_lo, port_hi; /* GRADSYNC_DATA_PORT_RANGE; 0 = any */
  int rank, size, local_rank, local_size, join_timeout_ms, data_timeout_ms, scale_local,
      cuda_device, deterministic;
  const char *backend;                     /* auto, tcp, nccl or shm */
  const char *tcp_congestion;              /* GRADSYNC_TCP_CONGESTION */
  const char *tls_ca, *tls_cert, *tls_key; /* PEM files; NULL = plaintext */
  /* where rank, size, local rank and local size came from */
  const char *rank_from, *size_from, *local_rank_from, *local_size_from;
} resolved;

static const char *real_getenv(const char *name, void *arg) {
  (void)arg;
  return getenv(name);
}

/* given (from gs_options) >= 0 wins; else the setting when the environment
 * gave it; else the scheduler's value; else *out stays -1. */
static void pick(int given, const char *given_name, const gs__settings *set, gs__setting_id id,
                 int sched, const char *sched_from, int *out, const char **from) {
  if (given >= 0) {
    *out = given;
    *from = given_name;
  } else if (gs__settings_given(set, id)) {
    *out = (int)gs__settings_int(set, id);
    *from = set->v[id].from;
  } else if (sched >= 0) {
    *out = sched;
    *from = sched_from;
  } else {
    *out = -1;
    *from = NULL;
  }
}

static gs_status resolve(const gs_options *given, resolved *r) {
  gs_options dflt;
  gs_options_init(&dflt);
  gs_status st;
  if (given && (st = gs__opts_copy(&dflt, given, "gs_options"))) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", gs_last_error(NULL)); /* not the buffer it rewrites */
    return gs__set_error(st, "gs_init: %s", msg);
  }
  const gs_options *o = &dflt;
  char err[1024];
  if (gs__settings_load(&r->set, GS__FOR_WORKER, err, sizeof err) != GS__OK)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_init: %s", err);
  gs__settings *set = &r->set;
  /* Options given in code go through the same checks as the environment. */
  struct {
    const char *text;
    gs__setting_id id;
    const char *name;
  } texts[] = {{o->coordinator, GS__S_COORDINATOR, "gs_options.coordinator"},
               {o->job_token, GS__S_JOB_TOKEN, "gs_options.job_token"},
               {o->advertise_addr, GS__S_ADVERTISE_ADDR, "gs_options.advertise_addr"},
               {o->tls_ca, GS__S_TLS_CA, "gs_options.tls_ca"},
               {o->tls_cert, GS__S_TLS_CERT, "gs_options.tls_cert"},
               {o->tls_key, GS__S_TLS_KEY, "gs_options.tls_key"}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    if (texts[i].text && gs__settings_set(set, texts[i].id, texts[i].text, GS__SRC_API,
                                          texts[i].name, err, sizeof err) != GS__OK)
      return gs__set_error(GS_ERR_INVALID_ARG, "gs_init: %s", err);
  r->coordinator = gs__settings_str(set, GS__S_COORDINATOR);
  if (!r->coordinator)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: no coordinator address: set GRADSYNC_COORDINATOR=host:port (or "
                         "start the job with gradsync-run, which sets it)");
  if (o->size == 0 || o->size > 65536 || o->rank > 65535 || o->local_size == 0 ||
      o->local_size > 65536 || o->local_rank > 65535)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: gs_options rank %d / size %d / local rank %d / local size %d: "
                         "sizes must be 1..65536 and ranks below them (-1 = from the environment)",
                         o->rank, o->size, o->local_rank, o->local_size);

  gs__sched_info sc;
  if (gs__sched_detect(real_getenv, NULL, &sc, err, sizeof err) != GS__OK)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: %s; fix the launcher's variables or set GRADSYNC_RANK and "
                         "GRADSYNC_SIZE",
                         err);
  pick(o->rank, "gs_options.rank", set, GS__S_RANK, sc.rank, sc.rank_from, &r->rank, &r->rank_from);
  pick(o->size, "gs_options.size", set, GS__S_SIZE, sc.size, sc.size_from, &r->size, &r->size_from);
  pick(o->local_rank, "gs_options.local_rank", set, GS__S_LOCAL_RANK, sc.local_rank,
       sc.local_rank_from, &r->local_rank, &r->local_rank_from);
  pick(o->local_size, "gs_options.local_size", set, GS__S_LOCAL_SIZE, sc.local_size,
       sc.local_size_from, &r->local_size, &r->local_size_from);
  if (r->rank < 0 || r->size < 0) {
    char seen[1024];
    gs__sched_seen(real_getenv, NULL, seen, sizeof seen);
    char got[256] = "";
    if (r->rank >= 0) snprintf(got, sizeof got, "; rank %d came from %s", r->rank, r->rank_from);
    if (r->size >= 0) snprintf(got, sizeof got, "; size %d came from %s", r->size, r->size_from);
    return gs__set_error(
        GS_ERR_INVALID_ARG,
        "gs_init: this process's %s unknown: set GRADSYNC_RANK and GRADSYNC_SIZE (or gs_options), "
        "or start it under a launcher gradsync reads (OpenMPI, MPICH/PMI, torchrun, Slurm, a "
        "Kubernetes Indexed Job with GRADSYNC_SIZE). Scheduler variables found: %s%s",
        r->rank < 0 && r->size < 0 ? "rank and job size are"
        : r->rank < 0              ? "rank is"
                                   : "job size is",
        seen[0] ? seen : "none", got);
  }
  if (r->rank >= r->size)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: rank %d (from %s) is out of range for a job of %d ranks (from "
                         "%s; valid ranks: 0..%d)",
                         r->rank, r->rank_from, r->size, r->size_from, r->size - 1);
  if (r->local_rank < 0) {
    r->local_rank = 0;
    r->local_rank_from = "default";
  }
  if (r->local_size < 0) {
    r->local_size = 1;
    r->local_size_from = "default";
  }
  r->join_timeout_ms =
      o->join_timeout_ms > 0 ? o->join_timeout_ms : (int)gs__settings_int(set, GS__S_JOIN_TIMEOUT);
  r->data_timeout_ms =
      o->data_timeout_ms > 0 ? o->data_timeout_ms : (int)gs__settings_int(set, GS__S_DATA_TIMEOUT);
  r->scale_local =
      o->scale_local >= 0 ? (o->scale_local != 0) : (int)gs__settings_int(set, GS__S_SCALE_LOCAL);
  r->deterministic = (int)gs__settings_int(set, GS__S_DETERMINISTIC);
  r->tcp_congestion = gs__settings_str(set, GS__S_TCP_CONGESTION);
  r->token = gs__settings_str(set, GS__S_JOB_TOKEN);
  r->advertise = gs__settings_str(set, GS__S_ADVERTISE_ADDR);
  r->data_addr = gs__settings_str(set, GS__S_DATA_ADDR);
  r->job_id = gs__settings_str(set, GS__S_JOB_ID);
  if (gs__settings_str(set, GS__S_DATA_PORT_RANGE)) {
    r->port_lo = (int)set->v[GS__S_DATA_PORT_RANGE].i;
    r->port_hi = (int)set->v[GS__S_DATA_PORT_RANGE].i2;
  }
  if (gs__settings_given(set, GS__S_LOG_LEVEL))
    gs__log_set_level((gs__log_level)gs__settings_int(set, GS__S_LOG_LEVEL));
  static const char *const kinds[] = {"auto", "tcp", "nccl", "shm"}; /* the setting's choices */
  int64_t ki = gs__settings_int(set, GS__S_BACKEND);
  r->backend = o->backend ? o->backend : kinds[ki >= 0 && ki < 4 ? ki : 0];
  if (!r->backend || !*r->backend) r->backend = "auto";
  if (strcmp(r->backend, "auto") && gs__backend_kind_parse(r->backend) < 0)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: gs_options.backend '%s' is not one of auto, tcp, nccl, shm",
                         r->backend);
  r->cuda_device = o->cuda_device >= 0 ? o->cuda_device
                   : gs__settings_given(set, GS__S_CUDA_DEVICE)
                       ? (int)gs__settings_int(set, GS__S_CUDA_DEVICE)
                       : r->local_rank;
  r->tls_ca = gs__settings_str(set, GS__S_TLS_CA);
  r->tls_cert = gs__settings_str(set, GS__S_TLS_CERT);
  r->tls_key = gs__settings_str(set, GS__S_TLS_KEY);
  char why[256];
  if (r->token && *r->token && gs__token_check(r->token, why, sizeof why) != 0)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: GRADSYNC_JOB_TOKEN (or gs_options.job_token): %s", why);
  if ((r->tls_cert && *r->tls_cert) != (r->tls_key && *r->tls_key))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: GRADSYNC_TLS_CERT and GRADSYNC_TLS_KEY go together (mTLS); "
                         "only %s is set",
                         r->tls_cert && *r->tls_cert ? "GRADSYNC_TLS_CERT" : "GRADSYNC_TLS_KEY");
  if (r->tls_cert && *r->tls_cert && !(r->tls_ca && *r->tls_ca))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init: GRADSYNC_TLS_CERT is set but GRADSYNC_TLS_CA is not: give the "
                         "CA file of the coordinator's certificate too");
  return GS_OK;
}

/* Settings the coordinator imposes on every rank (cycle time, fusion, cache,
 * stall times) may also sit in a rank's own environment, as Horovod job
 * scripts set HOROVOD_CYCLE_TIME for every process. The coordinator's value
 * wins; say so when the rank's differs instead of ignoring it silently. */
static void warn_imposed(const gs__job_config *c) {
  static const gs__setting_id ids[] = {GS__S_CYCLE_TIME, GS__S_FUSION_THRESHOLD,
                                       GS__S_CACHE_CAPACITY, GS__S_STALL_WARNING,
                                       GS__S_STALL_SHUTDOWN};
  const int64_t theirs[] = {c->cycle_time_us, (int64_t)c->fusion_threshold_bytes, c->cache_capacity,
                            c->stall_warning_s, c->stall_shutdown_s};
  gs__settings s;
  gs__settings_init(&s);
  for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
    const gs__setting *d = gs__setting_get(ids[k]);
    const char *from = d->env, *v = getenv(d->env);
    if ((!v || !*v) && d->alias) v = getenv(from = d->alias);
    if (!v || !*v) continue;
    char err[512], mine[64], coord[64];
    if (gs__settings_set(&s, ids[k], v, GS__SRC_ENV, from, err, sizeof err) != GS__OK) {
      GS_LOG_WARN("%s; ignored here: the coordinator imposes %s on every rank", err, d->key);
      continue;
    }
    if (s.v[ids[k]].i == theirs[k]) continue;
    gs__settings_format(&s, ids[k], mine, sizeof mine);
    s.v[ids[k]].i = theirs[k];
    gs__settings_format(&s, ids[k], coord, sizeof coord);
    GS_LOG_WARN("%s=%s in this rank's environment differs from the coordinator's %s=%s, which "
                "every rank uses: set it where gradsyncd starts (gradsync-run hands its "
                "environment and its horovodrun-style flags to the gradsyncd it starts)",
                from, mine, d->key, coord);
  }
  gs__settings_free(&s);
}

/* Waits for the coordinator's "world ready", naming the missing ranks if it
 * does not come before deadline_ms. */
static gs_status wait_world(gs_ctx *ctx, uint64_t deadline_ms, int timeout_ms) {
  char err[4096];
  gs__world_status last;
  memset(&last, 0, sizeof last);
  gs_status st = GS_OK;
  for (;;) {
    uint64_t now = gs__now_ms();
    gs__plan_msg m;
    int got = 0;
    int rc = gs__client_session_poll(ctx->client,
                                     now < deadline_ms ? (int64_t)(deadline_ms - now) * 1000 : 0,
                                     &m, &got, err, sizeof err);
    if (rc) {
      st = gs__set_error((gs_status)rc, "gs_init (rank %d): %s", ctx->rank, err);
      break;
    }
    if (got == GS__POLL_NOTHING && gs__now_ms() >= deadline_ms) {
      char missing[1024] = "", joined[2048] = "";
      size_t used = 0;
      for (size_t i = 0; i < last.nmissing && used < sizeof missing - 16; i++)
        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", i ? "," : "",
                                 last.missing_ranks[i]);
      used = 0;
      for (size_t i = 0; i < last.nranks && used < sizeof joined - 64; i++)
        used += (size_t)snprintf(joined + used, sizeof joined - used, "%s%d (%s:%d)", i ? ", " : "",
                                 last.ranks[i].rank, last.ranks[i].host, last.ranks[i].pid);
      char gone[1024] = "";
      used = 0;
      for (size_t i = 0; i < last.ngone && used < sizeof gone - 16; i++)
        used += (size_t)snprintf(gone + used, sizeof gone - used, "%s%d", i ? "," : "",
                                 last.gone_ranks[i]);
      char gone_note[1200] = "";
      if (gone[0])
        snprintf(gone_note, sizeof gone_note,
                 "; ranks [%s] connected but disconnected again before the job started (they "
                 "crashed or gave up: see their logs)",
                 gone);
      st = gs__set_error(GS_ERR_JOIN_TIMEOUT,
                         "gs_init (rank %d): timed out after %d ms waiting for ranks [%s] to join "
                         "the job at coordinator %s (present: %s%s). Check that those ranks were "
                         "started with GRADSYNC_SIZE=%d and can reach the coordinator; raise "
                         "GRADSYNC_JOIN_TIMEOUT_MS if they start slowly",
                         ctx->rank, timeout_ms, missing, ctx->coordinator,
                         joined[0] ? joined : "none", gone_note, ctx->size);
      break;
    }
    if (got != GS__POLL_MESSAGE) continue;
    if (m.kind == GS__MSG_WORLD) {
      int ready = m.world.ready;
      gs__world_status_free(&last);
      last = m.world;
      memset(&m.world, 0, sizeof m.world);
      gs__plan_msg_free(&m);
      if (ready) break;
    } else if (m.kind == GS__MSG_ABORT) {
      st = gs__set_error((gs_status)m.status, "gs_init (rank %d): the job was aborted: %s",
                         ctx->rank, m.text ? m.text : "");
      gs__plan_msg_free(&m);
      break;
    } else {
      gs__plan_msg_free(&m);
    }
  }
  gs__world_status_free(&last);
  return st;
}

static int kv_set(void *c, const char *key, const void *val, size_t len, char *err, size_t errlen) {
  return gs__client_kv_set(c, key, val, len, err, errlen);
}

static int kv_get(void *c, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  return gs__client_kv_get(c, key, timeout_ms, val, len, err, errlen);
}

/* What gs_init decided about the data plane before joining. */
typedef struct selection {
  int want;   /* GS__BACKEND_TCP / GS__BACKEND_NCCL, or -1 for auto */
  int gpu_ok; /* nccl can run in this process on r->cuda_device */
  char why[1024];
} selection;

static gs_status select_backend(gs_ctx *ctx, const resolved *r, selection *sel) {
  sel->want = strcmp(r->backend, "auto") ? gs__backend_kind_parse(r->backend) : -1;
  int ndev = 0;
  /* Probed for tcp too: a GPU buffer must then be refused, not read. */
  sel->gpu_ok = gs__backend_usable(GS__BACKEND_NCCL, &ndev, sel->why, sizeof sel->why);
  ctx->cuda_devices = ndev;
  if (sel->gpu_ok && r->cuda_device >= ndev) {
    snprintf(sel->why, sizeof sel->why,
             "CUDA device %d (GRADSYNC_CUDA_DEVICE, else the local rank) does not exist: %d "
             "device(s) visible; set GRADSYNC_CUDA_DEVICE or CUDA_VISIBLE_DEVICES",
             r->cuda_device, ndev);
    sel->gpu_ok = 0;
  }
  if (sel->want == GS__BACKEND_NCCL && !sel->gpu_ok)
    return gs__set_error(GS_ERR_UNSUPPORTED,
                         "gs_init (rank %d on %s): the nccl backend was asked for "
                         "(GRADSYNC_BACKEND=nccl) but cannot run here: %s. Run on a GPU "
                         "machine, or set GRADSYNC_BACKEND=tcp (or auto, which falls back to the "
                         "TCP ring) to use host buffers",
                         r->rank, ctx->host, sel->why);
  return GS_OK;
}

/* Connects the host ring (always: host buffers and metadata use it), then
 * agrees with the other ranks on the GPU backend and starts it. */

/* Deterministic mode changes the ring's algorithm, so every rank must use
 * the same: one tiny allgather (the same on both sides) compares them. */
static gs_status agree_deterministic(const resolved *r, gs__backend *ring) {
  if (r->size == 1) return GS_OK;
  char err[1024];
  uint8_t *flags = malloc((size_t)r->size);
  size_t *bytes = malloc((size_t)r->size * sizeof *bytes);
  if (!flags || !bytes) {
    free(flags);
    free(bytes);
    return gs__set_error(GS_ERR_NO_MEMORY, "gs_init: out of memory");
  }
  for (int q = 0; q < r->size; q++) bytes[q] = 1;
  uint8_t mine = (uint8_t)(r->deterministic != 0);
  int rc = ring->v->allgatherv(ring, &mine, flags, bytes, err, sizeof err);
  gs_status st = GS_OK;
  if (rc) {
    st = gs__set_error(GS_ERR_DATA_PLANE,
                       "gs_init (rank %d): comparing GRADSYNC_DETERMINISTIC across ranks "
                       "failed: %s",
                       r->rank, err);
  } else {
    char on[256] = "", off[256] = "";
    int non = 0, noff = 0;
    for (int q = 0; q < r->size; q++) {
      char *l = flags[q] ? on : off;
      int *k = flags[q] ? &non : &noff;
      size_t len = strlen(l);
      if (len < sizeof on - 16) snprintf(l + len, sizeof on - len, "%s%d", (*k)++ ? "," : "", q);
    }
    if (non && noff)
      st = gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_init (rank %d): GRADSYNC_DETERMINISTIC differs across ranks: ranks "
                         "[%s] set 1, ranks [%s] set 0; set the same value on every rank",
                         r->rank, on, off);
    else if (non)
      GS_LOG_INFO("deterministic mode: every CPU allreduce reduces in rank order 0..%d",
                  r->size - 1);
  }
  free(flags);
  free(bytes);
  return st;
}

static gs_status start_backends(gs_ctx *ctx, const resolved *r, selection *sel, uint64_t deadline) {
  char err[4096], prefix[64];
  snprintf(prefix, sizeof prefix, "epoch/%llu/", (unsigned long long)ctx->join.epoch);
  uint64_t now = gs__now_ms();
  int connect_ms = now < deadline ? (int)(deadline - now) : 1;
  if (connect_ms < 5000) connect_ms = 5000;
  gs__kv kv = {ctx->client, kv_set, kv_get};
  gs__tcp_ring_opts ro = {.rank = r->rank,
                          .size = r->size,
                          .coordinator = r->coordinator,
                          .advertise_addr = r->advertise,
                          .data_addr = r->data_addr,
                          .port_lo = r->port_lo,
                          .port_hi = r->port_hi,
                          .key_prefix = prefix,
                          .connect_timeout_ms = connect_ms,
                          .io_timeout_ms = r->data_timeout_ms,
                          .kv = kv,
                          .ring_key = ctx->join.ring_key,
                          .deterministic = r->deterministic,
                          .congestion = r->tcp_congestion};
  int rc =
      gs__backend_create(GS__BACKEND_TCP, &ro, &ctx->backends[GS__DEVICE_CPU], err, sizeof err);
  if (rc)
    return gs__set_error((gs_status)rc, "gs_init (rank %d): connecting the data plane failed: %s",
                         r->rank, err);
  gs__backend *ring = ctx->backends[GS__DEVICE_CPU];
  if ((rc = agree_deterministic(r, ring)) != GS_OK) return (gs_status)rc;
  ctx->deterministic = r->deterministic != 0;
  int use_nccl = sel->want == GS__BACKEND_NCCL;
  if (sel->want < 0) {
    /* auto: NCCL needs every rank, so the lowest rank without a usable GPU
     * decides for all (one tiny allreduce on the ring). */
    int32_t v = sel->gpu_ok ? INT32_MAX : r->rank;
    rc = ring->v->allreduce(ring, &v, 1, GS__INT32, GS__MIN, err, sizeof err);
    if (rc)
      return gs__set_error(GS_ERR_DATA_PLANE,
                           "gs_init (rank %d): agreeing on the data-plane backend failed: %s",
                           r->rank, err);
    if (v == INT32_MAX) {
      use_nccl = 1;
      GS_LOG_INFO("backend nccl (auto: CUDA device %d on every rank; %s)", r->cuda_device,
                  sel->why);
    } else if (!sel->gpu_ok) {
      GS_LOG_INFO("backend tcp (%s)", sel->why);
    } else {
      GS_LOG_INFO("backend tcp (rank %d has no usable CUDA device, and NCCL needs every rank; "
                  "GPU buffers are refused)",
                  (int)v);
    }
  } else if (sel->want == GS__BACKEND_SHM) {
    GS_LOG_INFO("backend shm (GRADSYNC_BACKEND=shm: host buffers only)");
  } else if (!use_nccl) {
    GS_LOG_INFO("backend tcp (GRADSYNC_BACKEND=tcp)");
  } else {
    GS_LOG_INFO("backend nccl (GRADSYNC_BACKEND=nccl, CUDA device %d)", r->cuda_device);
  }
  /* Host buffers: shared memory among the ranks of a host (hierarchical
   * across hosts) unless GRADSYNC_BACKEND=tcp asked for the plain ring. */
  if (sel->want != GS__BACKEND_TCP) {
    char why[2048];
    gs__host_transport_opts ho = {.rank = r->rank,
                                  .size = r->size,
                                  .host = ctx->host,
                                  .required = sel->want == GS__BACKEND_SHM,
                                  .epoch = ctx->join.epoch,
                                  .ring_key = ctx->join.ring_key,
                                  .ring = &ro,
                                  .connect_timeout_ms = connect_ms,
                                  .io_timeout_ms = r->data_timeout_ms};
    gs__backend *host = NULL;
    rc = gs__host_transport(&ho, ring, &host, why, sizeof why, err, sizeof err);
    if (rc)
      return gs__set_error((gs_status)rc, "gs_init (rank %d on %s): %s", r->rank, ctx->host, err);
    ctx->backends[GS__DEVICE_CPU] = host;
    GS_LOG_INFO("host buffers: %s", why);
  }
  if (!use_nccl) return GS_OK;
  now = gs__now_ms();
  connect_ms = now < deadline ? (int)(deadline - now) : 1;
  if (connect_ms < 5000) connect_ms = 5000;
  gs__nccl_opts no = {.rank = r->rank,
                      .size = r->size,
                      .device = r->cuda_device,
                      .key_prefix = prefix,
                      .connect_timeout_ms = connect_ms,
                      .io_timeout_ms = r->data_timeout_ms,
                      .kv = kv};
  rc = gs__backend_create(GS__BACKEND_NCCL, &no, &ctx->backends[GS__DEVICE_GPU], err, sizeof err);
  if (rc)
    return gs__set_error((gs_status)rc,
                         "gs_init (rank %d on %s): starting the nccl backend failed: %s. Set "
                         "GRADSYNC_BACKEND=tcp to run on the CPU ring instead",
                         r->rank, ctx->host, err);
  return GS_OK;
}

static void ctx_free(gs_ctx *ctx) {
  for (int d = GS__DEVICE_COUNT - 1; d >= 0; d--) gs__backend_destroy(ctx->backends[d]);
  gs__client_destroy(ctx->client);
  while (ctx->plans_head) { /* left by a failed gs_init only */
    plan_node *n = ctx->plans_head;
    ctx->plans_head = n->next;
    gs__plan_node_free(n);
  }
  free(ctx->done_plans);
  gs__cache_clear(ctx);
  gs__fast_state_free(ctx);
  gs__local *l, *ltmp;
  HASH_ITER(hh, ctx->locals, l, ltmp) {
    HASH_DEL(ctx->locals, l);
    free(l);
  }
  free(ctx->reg);
  free(ctx->unreg);
  pthread_mutex_destroy(&ctx->mu);
  pthread_cond_destroy(&ctx->cv);
  pthread_cond_destroy(&ctx->exec_cv);
  free(ctx);
}

gs_status gs_init(const gs_options *opts, gs_ctx **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_init: out is NULL");
  *out = NULL;
  resolved r;
  memset(&r, 0, sizeof r);
  gs_status st = resolve(opts, &r);
  if (st) {
    gs__settings_free(&r.set);
    return st;
  }
  gs_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    gs__settings_free(&r.set);
    return gs__set_error(GS_ERR_NO_MEMORY, "gs_init: out of memory");
  }
  ctx->rank = r.rank;
  ctx->size = r.size;
  ctx->local_rank = r.local_rank;
  ctx->local_size = r.local_size;
  ctx->scale_local = r.scale_local;
  gs__fork_watch(); /* before ctx exists for any other thread (fork.c) */
  ctx->fork_gen = atomic_load_explicit(&gs__fork_gen, memory_order_relaxed);
  ctx->pid = (int)getpid();
  snprintf(ctx->coordinator, sizeof ctx->coordinator, "%s", r.coordinator);
  if (gethostname(ctx->host, sizeof ctx->host) != 0) snprintf(ctx->host, sizeof ctx->host, "?");
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* gs_wait deadlines are monotonic */
  pthread_cond_init(&ctx->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&ctx->exec_cv, NULL);
  char log_name[64];
  snprintf(log_name, sizeof log_name, "gradsync[rank %d]", r.rank);
  gs__log_init(log_name);

  /* An impossible backend fails at once, before this rank joins. */
  selection sel;
  if ((st = select_backend(ctx, &r, &sel))) goto out_free_ctx;

  uint64_t deadline = gs__now_ms() + (uint64_t)r.join_timeout_ms;
  char err[4096];
  gs__client_opts co = {.target = r.coordinator,
                        .token = r.token,
                        .tls_ca = r.tls_ca,
                        .tls_cert = r.tls_cert,
                        .tls_key = r.tls_key};
  int rc = gs__client_create(&co, &ctx->client, err, sizeof err);
  if (rc) {
    st = gs__set_error((gs_status)rc, "gs_init (rank %d): %s", r.rank, err);
    goto out_free_ctx;
  }
  gs__join_request jr;
  memset(&jr, 0, sizeof jr);
  jr.rank = r.rank;
  jr.size = r.size;
  jr.local_rank = r.local_rank;
  jr.local_size = r.local_size;
  snprintf(jr.host, sizeof jr.host, "%s", ctx->host);
  jr.pid = (int32_t)getpid();
  snprintf(jr.version, sizeof jr.version, "%s", GS_VERSION_STRING);
  snprintf(jr.job_id, sizeof jr.job_id, "%s", r.job_id ? r.job_id : "");
  rc = gs__client_join(ctx->client, &jr, r.join_timeout_ms, &ctx->join, err, sizeof err);
  if (rc) {
    st = gs__set_error((gs_status)rc, "gs_init (rank %d): %s", r.rank, err);
    goto out_free_ctx;
  }
  gs__client_set_identity(ctx->client, r.rank, ctx->join.rank_secret);
  rc = gs__client_session_open(ctx->client, r.rank, ctx->join.epoch, err, sizeof err);
  if (rc) {
    st = gs__set_error((gs_status)rc, "gs_init (rank %d): %s", r.rank, err);
    goto out_free_ctx;
  }
  warn_imposed(&ctx->join.config);
  st = wait_world(ctx, deadline, r.join_timeout_ms);
  if (st) goto out_free_ctx;

  st = start_backends(ctx, &r, &sel, deadline);
  if (st) goto out_free_ctx;
  ctx->last_send_ms = gs__now_ms();
  if (pthread_create(&ctx->exec_thread, NULL, gs__executor_main, ctx) != 0) {
    st = gs__set_error(GS_ERR_NO_MEMORY, "gs_init (rank %d): cannot start the exec thread: %s",
                       r.rank, strerror(errno));
    goto out_free_ctx;
  }
  ctx->exec_started = 1;
  ctx->comm_running = 1; /* before any other thread can see ctx */
  if (pthread_create(&ctx->thread, NULL, gs__background_main, ctx) != 0) {
    ctx->comm_running = 0;
    st = gs__set_error(GS_ERR_NO_MEMORY, "gs_init (rank %d): cannot start the comm thread: %s",
                       r.rank, strerror(errno));
    goto out_stop_exec;
  }
  ctx->thread_started = 1;
  GS_TRACE(GS__TR_RANK, ctx->rank, ctx->size);
  char line[4096];
  gs__settings_describe(&r.set, GS__FOR_WORKER, line, sizeof line);
  GS_LOG_INFO("joined the job at %s as rank %d of %d, local rank %d of %d (rank from %s, size "
              "from %s, local rank from %s, local size from %s); settings: %s",
              r.coordinator, r.rank, r.size, r.local_rank, r.local_size, r.rank_from, r.size_from,
              r.local_rank_from, r.local_size_from, line);
  gs__settings_free(&r.set);
  *out = ctx;
  return GS_OK;

out_stop_exec:
  pthread_mutex_lock(&ctx->mu);
  ctx->exec_stop = 1;
  gs__exec_bell_locked(ctx);
  pthread_cond_broadcast(&ctx->exec_cv);
  pthread_mutex_unlock(&ctx->mu);
  pthread_join(ctx->exec_thread, NULL);
out_free_ctx:
  ctx_free(ctx);
  gs__settings_free(&r.set);
  return st;
}

gs_status gs_shutdown(gs_ctx *ctx) {
  if (!ctx) return GS_OK;
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_shutdown", NULL); /* leaks the copy */
  pthread_mutex_lock(&ctx->mu);
  ctx->stop = 1;
  pthread_cond_broadcast(&ctx->cv);
  int kick = gs__comm_wake_locked(ctx, 0);
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
  if (ctx->thread_started) pthread_join(ctx->thread, NULL); /* it stops the exec thread */
  if (ctx->exec_started) pthread_join(ctx->exec_thread, NULL);
  /* The threads have ended: fail what is left (the first failure wins). */
  gs__ctx_fail(ctx, GS_ERR_SHUTDOWN,
               "gs_shutdown was called while this op was in flight; wait for ops before "
               "shutting down");
  ctx_free(ctx);
  return GS_OK;
}

int gs_rank(const gs_ctx *ctx) {
  return ctx ? ctx->rank : -1;
}
int gs_size(const gs_ctx *ctx) {
  return ctx ? ctx->size : -1;
}
int gs_local_rank(const gs_ctx *ctx) {
  return ctx ? ctx->local_rank : -1;
}
int gs_local_size(const gs_ctx *ctx) {
  return ctx ? ctx->local_size : -1;
}

/* ---- submission ------------------------------------------------------------ */

/* Hands n ops to the background thread atomically: all are queued, or none
 * (a failed job, shutdown, or a name already in flight). */
/* A persistent op (gs_allreduce_init) at a start, under mu: GS_OK when it
 * may start, else the error set. It may when it is inactive and no one but
 * the application holds it (refs == 1: a plan node or a fast round's
 * snapshot of its previous start has let go; docs/design-notes.md,
 * "Persistent ops"), and its name is not registered local since. */
static gs_status start_check_locked(gs_ctx *ctx, struct gs_handle *h) {
  if (!atomic_load_explicit(&h->done, memory_order_relaxed))
    return gs__set_error(GS_ERR_DUPLICATE_NAME,
                         "tensor '%s': rank %d (host %s) started this persistent op while it is "
                         "still active; wait for it (gs_wait, gs_test) before starting it again",
                         h->req.name, ctx->rank, ctx->host);
  if (atomic_load_explicit(&h->refs, memory_order_acquire) != 1)
    return gs__set_error(GS_ERR_INTERNAL,
                         "tensor '%s': rank %d (host %s): the library still holds this persistent "
                         "op's previous start %d ms after it completed (the plan or fast round "
                         "that ran it has not ended); start it again later",
                         h->req.name, ctx->rank, ctx->host, GS__START_HELD_MS);
  if (atomic_load_explicit(&ctx->nlocals, memory_order_relaxed)) {
    gs__local *l = NULL;
    HASH_FIND_STR(ctx->locals, h->req.name, l);
    if (l)
      return gs__set_error(GS_ERR_UNSUPPORTED,
                           "tensor '%s': rank %d (host %s) registered this name local "
                           "(gs_register_local) after gs_allreduce_init; a persistent op cannot "
                           "be local: free it and use gs_allreduce_async",
                           h->req.name, ctx->rank, ctx->host);
  }
  return GS_OK;
}

/* A persistent op's state back to a fresh handle's (what submission sets
 * and completion leaves), with the library's reference again; caller holds
 * mu, and start_check_locked passed (no one else reads these fields). */
static void start_reset_locked(struct gs_handle *h) {
  free(h->error);
  h->error = NULL;
  h->status = GS_OK;
  h->next_submit = NULL;
  h->queued = h->planned = h->fast = h->round = 0;
  h->fast_slot = h->fast_id = 0;
  h->fast_since_ms = h->fast_seq = 0;
  h->wait_since_ms = h->wait_last_ms = 0;
  h->wprev = h->wnext = NULL;
  atomic_store_explicit(&h->refs, 2, memory_order_relaxed); /* refs was 1: the caller's */
  atomic_store_explicit(&h->done, 0, memory_order_relaxed);
}

/* The op in flight of h's name, or NULL (gs__inflight_find_locked), and
 * its cache entry into *entry; caller holds mu. In a steady state an
 * application submits the same names in the same order every step, so the
 * entry found after ctx->seq_last the last time (seq_last->seq_next) is
 * tried first: when its name is h's (length, then bytes), it is h's name's
 * entry (names are unique in the cache), with no hash computed and no
 * bucket walked. Otherwise the name is hashed (unless hashed, as a
 * persistent op's was at gs_allreduce_init) and looked up, and a name with
 * an entry becomes the prediction after the last one. The prediction is
 * only a hint: an entry leaves every link and seq_last when it is dropped
 * (cache_drop), and whatever it predicts is checked by the name. Either
 * way h->hashv is the name's hash afterwards. */
static struct gs_handle *submit_find_locked(gs_ctx *ctx, struct gs_handle *h, int hashed,
                                            gs__wcache **entry) {
  gs__wcache *last = ctx->seq_last;
  gs__wcache *e = last ? last->seq_next : NULL;
  if (e && e->name_len == h->name_len && !gs__key_differs(e->req.name, h->req.name, e->name_len)) {
    h->hashv = e->hashv;
    *entry = e;
    ctx->seq_last = e;
    return e->inflight;
  }
  if (!hashed) {
    unsigned hv;
    HASH_VALUE(h->req.name, h->name_len, hv);
    h->hashv = hv;
  }
  struct gs_handle *dup = gs__inflight_find_locked(ctx, h->req.name, h->name_len, h->hashv, entry);
  if (*entry) {
    if (last && last->seq_next != *entry) gs__wcache_link(last, *entry);
    ctx->seq_last = *entry;
  }
  return dup;
}

/* Submits n new ops (start == 0), or starts n persistent ones (start == 1:
 * hashed at gs_allreduce_init, checked and reset here under the lock);
 * all or none. */
static gs_status submit_many(gs_ctx *ctx, struct gs_handle **hs, size_t n, int start) {
  /* Each op's name is looked up once, under mu (submit_find_locked): the
   * op in flight is found in the response cache (whose entry of the name
   * lists the op, if there is one) or in ctx->inflight. */
  pthread_mutex_lock(&ctx->mu);
  gs_status st = GS_OK;
  if (ctx->fatal) {
    st = gs__set_error(ctx->fatal, "%s", ctx->fatal_msg);
  } else if (ctx->stop) {
    st =
        gs__set_error(GS_ERR_SHUTDOWN, "tensor '%s': gs_shutdown has been called", hs[0]->req.name);
  }
  /* Each op is listed in flight as it is checked, so a name twice in one
   * call (a group) is found by the same hash lookup, not by comparing
   * every pair (a group of 161 names spent ~75 us so, under mu); on a
   * duplicate the ops listed are taken off again (all or none). */
  for (size_t i = 0; i < n && !st; i++) {
    gs__wcache *entry = NULL;
    if (start && (st = start_check_locked(ctx, hs[i]))) {
      for (size_t k = 0; k < i; k++) gs__inflight_del_locked(ctx, hs[k]);
      break;
    }
    struct gs_handle *dup = submit_find_locked(ctx, hs[i], start, &entry);
    if (dup == hs[i]) { /* a persistent op listed twice in one gs_startall */
      st = gs__set_error(GS_ERR_DUPLICATE_NAME,
                         "tensor '%s': gs_startall lists this persistent op twice (rank %d, host "
                         "%s); list each op once",
                         hs[i]->req.name, ctx->rank, ctx->host);
      for (size_t k = 0; k < i; k++) gs__inflight_del_locked(ctx, hs[k]);
      break;
    }
    if (!dup) {
      gs__inflight_add_locked(ctx, hs[i], entry);
      continue;
    }
    st =
        gs__set_error(GS_ERR_DUPLICATE_NAME,
                      "tensor '%s': rank %d already has an op of this name in flight; wait for it "
                      "to complete (gs_wait) before submitting the name again, or use another name",
                      hs[i]->req.name, ctx->rank);
    for (size_t k = 0; k < i; k++) gs__inflight_del_locked(ctx, hs[k]);
  }
  /* In fast mode the ops go to the fast queue, for the exec thread's next
   * round (fast_round.c); otherwise to the comm thread. */
  int fast = !st && ctx->fast;
  /* fast_since_ms only tells ops pending for over a second (fast_pending):
   * the tick's resolution is plenty, at a fifth of a full clock read. */
  uint64_t now = fast ? gs__now_ms_coarse() : 0;
  for (size_t i = 0; i < n && !st; i++) {
    struct gs_handle *h = hs[i];
    if (start) start_reset_locked(h);
    if (fast) {
      gs__fast_queue_locked(ctx, h, now);
      continue;
    }
    ctx->nunplanned++;
    h->queued = 1;
    if (ctx->sub_tail)
      ctx->sub_tail->next_submit = h;
    else
      ctx->sub_head = h;
    ctx->sub_tail = h;
  }
  /* Nagle's rule for the exec thread: wake it only when it sleeps; while
   * it runs a round, submissions accumulate into the next one (worker.h,
   * exec_idle, says why no wake-up is lost). */
  int wake_exec = fast && ctx->exec_idle;
  if (wake_exec) ctx->exec_idle = 0;
  int kick = !st && !fast && gs__comm_wake_locked(ctx, 1);
  pthread_mutex_unlock(&ctx->mu);
  if (!st) GS_TRACE(GS__TR_SUBMIT, hs[0]->req.op, n);
  if (wake_exec) pthread_cond_signal(&ctx->exec_cv);
  if (kick) gs__comm_kick(ctx);
  return st;
}

static gs_status submit(gs_ctx *ctx, struct gs_handle *h) {
  return submit_many(ctx, &h, 1, 0);
}

/* memcpy as a call to the C library's, which the compiler cannot expand
 * inline (see gs__op_new): it reads the function through a volatile. */
static void *(*volatile const small_copy)(void *, const void *, size_t) = memcpy;

/* Copies a name of n bytes (its NUL included; n >= 2) in overlapping
 * 16-, 8-, 4-byte moves: no call and no string instruction for the
 * names of a model (most under 64 bytes). */
static inline void name_copy(char *dst, const char *src, size_t n) {
  if (n >= 16) {
    for (size_t i = 0; i + 16 < n; i += 16) {
      uint64_t a[2];
      memcpy(a, src + i, 16);
      memcpy(dst + i, a, 16);
      __asm__("" ::: "memory"); /* no loop idiom: not a memcpy call again */
    }
    uint64_t a[2];
    memcpy(a, src + n - 16, 16);
    memcpy(dst + n - 16, a, 16);
  } else if (n >= 8) {
    uint64_t a, b;
    memcpy(&a, src, 8);
    memcpy(&b, src + n - 8, 8);
    memcpy(dst, &a, 8);
    memcpy(dst + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    memcpy(&a, src, 4);
    memcpy(&b, src + n - 4, 4);
    memcpy(dst, &a, 4);
    memcpy(dst + n - 4, &b, 4);
  } else {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
  }
}

/* gs__op_new's body: inlined into an allreduce's submission
 * (build_allreduce), where the chain of calls from gs_allreduce_async to
 * the lock was a good part of a call's cost. */
static inline __attribute__((always_inline)) gs_status op_new(gs_ctx *ctx, const char *name,
                                                              gs__op_type op, gs_dtype dtype,
                                                              const int64_t *shape, int ndim,
                                                              struct gs_handle **out) {
  *out = NULL;
  /* the op's name only for an error: not a call per submission */
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "gs_%s: ctx is NULL", gs__op_type_name(op));
  if (gs__forked(ctx)) return gs__fork_error(ctx, gs__op_type_name(op), name);
  if (!name || !*name)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_%s: the tensor name is empty",
                         gs__op_type_name(op));
  size_t nlen = strlen(name);
  if (nlen > GS__MAX_NAME)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_%s: tensor name '%.40s...' is %zu bytes; the limit is %d",
                         gs__op_type_name(op), name, nlen, GS__MAX_NAME);
  if ((int)dtype < 0 || (int)dtype >= GS__DTYPE_COUNT)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': dtype %d is not a gs_dtype (GS_FLOAT32 .. GS_INT16)", name,
                         (int)dtype);
  if (ndim < 0 || ndim > GS__MAX_DIMS || (ndim > 0 && !shape))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': shape has %d dimensions%s; from 0 to %d are allowed", name,
                         ndim, ndim > 0 && !shape ? " but shape is NULL" : "", GS__MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': dimension %d is negative (%lld)", name,
                           i, (long long)shape[i]);
  struct gs_handle *h = gs__handle_mem(); /* zero up to the request */
  if (!h) return gs__set_error(GS_ERR_NO_MEMORY, "tensor '%s': out of memory", name);
  /* The request is written as far as it is used, every scalar (the
   * defaults of gs__tensor_request_init), the name up to its NUL and the
   * shape up to ndim: not zeroed whole (440 bytes, 7 cache lines of the
   * 12 a submission wrote; worker.h, struct gs_handle). Nothing reads a
   * request's name past its NUL or its shape past ndim.
   * The name goes through name_copy and a shape of more than one
   * dimension through small_copy: copied by memcpy inline here, either
   * became a "rep movsq" string copy, whose start-up alone (12-15 ns here)
   * cost more than the rest of the copy. */
  gs__tensor_request *r = &h->req;
  name_copy(r->name, name, nlen + 1);
  r->op = op;
  r->dtype = (gs__dtype)dtype;
  r->ndim = ndim;
  r->reduce_op = GS__SUM;
  r->root_rank = 0;
  r->device = GS__DEVICE_CPU;
  r->group_size = 0;
  r->prescale = 1.0;
  r->postscale = 1.0;
  r->group_id = 0;
  if (ndim == 1) /* a flat tensor (every gs_allreduce_async without a shape): no call */
    r->shape[0] = shape[0];
  else
    small_copy(r->shape, shape, (size_t)ndim * sizeof *shape);
  int64_t n = 1;
  int overflow = 0;
  for (int i = 0; i < ndim; i++) overflow |= __builtin_mul_overflow(n, shape[i], &n);
  if (overflow || (uint64_t)n > SIZE_MAX / 16) {
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': the element count overflows", name);
  }
  h->count = (size_t)n;
  h->name_len = (unsigned)nlen; /* submit_many hashes the name with it */
  h->ctx = ctx;
  atomic_init(&h->refs, 2); /* the caller's and the library's */
  atomic_init(&h->done, 0);
  *out = h;
  return GS_OK;
}

gs_status gs__op_new(gs_ctx *ctx, const char *name, gs__op_type op, gs_dtype dtype,
                     const int64_t *shape, int ndim, struct gs_handle **out) {
  return op_new(ctx, name, op, dtype, shape, ndim, out);
}

/* op_new_counted's refusal: *out's shape does not hold count elements. */
static __attribute__((noinline, cold)) gs_status count_refused(const char *name, size_t count,
                                                               struct gs_handle **out) {
  char s[256];
  gs__shape_format((*out)->req.shape, (*out)->req.ndim, s, sizeof s);
  size_t holds = (*out)->count;
  free(*out);
  *out = NULL;
  return gs__set_error(GS_ERR_INVALID_ARG,
                       "tensor '%s': shape %s does not hold count=%zu elements (it holds %zu)",
                       name, s, count, holds);
}

/* gs__op_new_counted's body (see op_new). */
static inline __attribute__((always_inline)) gs_status
op_new_counted(gs_ctx *ctx, const char *name, gs__op_type op, gs_dtype dtype, const int64_t *shape,
               int ndim, size_t count, struct gs_handle **out) {
  gs_status st = op_new(ctx, name, op, dtype, shape, ndim, out);
  if (st || (*out)->count == count) return st;
  return count_refused(name, count, out);
}

gs_status gs__op_new_counted(gs_ctx *ctx, const char *name, gs__op_type op, gs_dtype dtype,
                             const int64_t *shape, int ndim, size_t count, struct gs_handle **out) {
  return op_new_counted(ctx, name, op, dtype, shape, ndim, count, out);
}

void gs__op_complete_unsubmitted(struct gs_handle *h) {
  atomic_store_explicit(&h->refs, 1, memory_order_relaxed); /* the caller's only */
  h->status = GS_OK;
  atomic_store_explicit(&h->done, 1, memory_order_release);
}

gs_status gs__op_submit(gs_ctx *ctx, struct gs_handle *h, gs_handle **out) {
  gs_status st = submit(ctx, h);
  if (st) {
    free(h->splits);
    free(h);
    return st;
  }
  *out = h;
  return GS_OK;
}

gs_status gs__op_device(gs_ctx *ctx, struct gs_handle *h, const void *send, const void *recv) {
  h->req.device = GS__DEVICE_CPU;
  if (!ctx->cuda_devices) return GS_OK; /* no CUDA here: every pointer is host memory */
  gs__device ds = send ? gs__pointer_device(send, NULL) : GS__DEVICE_CPU;
  gs__device dr = recv ? gs__pointer_device(recv, NULL) : ds;
  if (!send) ds = dr;
  if (ds != dr)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': the send buffer is in %s memory but the recv buffer in %s "
                         "memory; pass both on the same device",
                         h->req.name, gs__device_name(ds), gs__device_name(dr));
  if (ds == GS__DEVICE_GPU && !ctx->backends[GS__DEVICE_GPU])
    return gs__set_error(GS_ERR_UNSUPPORTED,
                         "tensor '%s' is in GPU memory, but rank %d runs the tcp backend, which "
                         "takes host buffers only; set GRADSYNC_BACKEND=nccl (or auto, on a job "
                         "where every rank has a GPU), or copy the tensor to the host",
                         h->req.name, ctx->rank);
  h->req.device = ds;
  return GS_OK;
}

gs_status gs__host_only(gs_ctx *ctx, const void *p, const char *what, const char *name) {
  if (!ctx || !ctx->cuda_devices || !p || gs__pointer_device(p, NULL) != GS__DEVICE_GPU)
    return GS_OK;
  return gs__set_error(GS_ERR_UNSUPPORTED,
                       "%s: tensor '%s' is in GPU memory, but this op works on host buffers only; "
                       "copy it to the host first",
                       what, name ? name : "?");
}

/* Reads a gs_op_opts (NULL = defaults) into *o. */
static gs_status op_opts(const gs_op_opts *given, gs_op_opts *o) {
  gs_op_opts_init(o);
  return given ? gs__opts_copy(o, given, "gs_op_opts") : GS_OK;
}

/* Checks an allreduce's arguments and builds its handle (not submitted);
 * opts is our own copy of the caller's options, or NULL for defaults. */
static gs_status build_allreduce(gs_ctx *ctx, const char *name, const void *send, void *recv,
                                 size_t count, gs_dtype dtype, gs_reduce_op op,
                                 const gs_allreduce_opts *opts, struct gs_handle **out) {
  *out = NULL;
  if ((int)op < 0 || (int)op >= GS__REDUCE_OP_COUNT)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': reduce op %d is not a gs_reduce_op (GS_SUM .. GS_ADASUM)",
                         name ? name : "?", (int)op);
  if (op == GS_ADASUM)
    return gs__set_error(
        GS_ERR_UNSUPPORTED,
        "tensor '%s': the adasum reduce op is not supported yet; use GS_AVERAGE or "
        "GS_SUM",
        name ? name : "?");
  if (count > (size_t)INT64_MAX / 16)
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': count %zu is too large",
                         name ? name : "?", count);
  int64_t flat = (int64_t)count;
  const int64_t *shape = opts && opts->ndim > 0 ? opts->shape : &flat;
  int ndim = opts && opts->ndim > 0 ? opts->ndim : 1;
  struct gs_handle *h;
  gs_status st = op_new_counted(ctx, name, GS__OP_ALLREDUCE, dtype, shape, ndim, count, &h);
  if (st) return st;
  if (count > 0 && (!send || !recv)) {
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': %s buffer is NULL for %zu elements",
                         name, !send ? "send" : "recv", count);
  }
  h->req.reduce_op = (gs__reduce_op)op;
  if (opts) {
    h->req.prescale = opts->prescale != 0.0 ? opts->prescale : 1.0;
    h->req.postscale = opts->postscale != 0.0 ? opts->postscale : 1.0;
    double f = opts->gradient_predivide_factor;
    if (f != 0.0 && f != 1.0) {
      h->req.prescale /= f;
      h->req.postscale *= f;
    }
    if (opts->compression != GS_COMPRESS_NONE) {
      if ((opts->compression != GS_COMPRESS_FP16 && opts->compression != GS_COMPRESS_BF16) ||
          dtype != GS_FLOAT32) {
        int c = (int)opts->compression;
        free(h);
        return gs__set_error(GS_ERR_INVALID_ARG,
                             "tensor '%s': compression %d needs a float32 tensor and one of "
                             "GS_COMPRESS_NONE, GS_COMPRESS_FP16, GS_COMPRESS_BF16 (dtype is %s)",
                             name, c, gs__dtype_name((gs__dtype)dtype));
      }
      h->req.dtype = opts->compression == GS_COMPRESS_FP16 ? GS__FLOAT16 : GS__BFLOAT16;
      h->compress = 1;
    }
    if (!isfinite(h->req.prescale) || !isfinite(h->req.postscale)) {
      double pre = h->req.prescale, post = h->req.postscale;
      free(h);
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "tensor '%s': prescale %g and postscale %g must be finite numbers", name,
                           pre, post);
    }
  }
  h->send = send;
  h->recv = recv;
  h->stream = opts ? opts->stream : NULL;
  /* op_new set the host device; only a process that saw CUDA devices
   * asks where the buffers are (gs__op_device). */
  gs_status dst =
      ctx->cuda_devices ? gs__op_device(ctx, h, count ? send : NULL, count ? recv : NULL) : GS_OK;
  if (dst) {
    free(h);
    return dst;
  }
  *out = h;
  return GS_OK;
}

/* build_allreduce with the caller's options (NULL = defaults). */
static gs_status make_allreduce(gs_ctx *ctx, const char *name, const void *send, void *recv,
                                size_t count, gs_dtype dtype, gs_reduce_op op,
                                const gs_allreduce_opts *given, struct gs_handle **out) {
  *out = NULL;
  if (!given) return build_allreduce(ctx, name, send, recv, count, dtype, op, NULL, out);
  gs_allreduce_opts copy;
  gs_allreduce_opts_init(&copy);
  gs_status cst = gs__opts_copy(&copy, given, "gs_allreduce_opts");
  if (cst) return cst;
  return build_allreduce(ctx, name, send, recv, count, dtype, op, &copy, out);
}

gs_status gs_allreduce_async(gs_ctx *ctx, const char *name, const void *send, void *recv,
                             size_t count, gs_dtype dtype, gs_reduce_op op,
                             const gs_allreduce_opts *opts, gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_allreduce_async: out is NULL");
  *out = NULL;
  struct gs_handle *h;
  gs_status st = opts ? make_allreduce(ctx, name, send, recv, count, dtype, op, opts, &h)
                      : build_allreduce(ctx, name, send, recv, count, dtype, op, NULL, &h);
  if (st) return st;
  /* gs_is_local's first test inline: no call (through the PLT: it is
   * exported) per submission while no name is local. */
  if (atomic_load_explicit(&ctx->nlocals, memory_order_acquire) && gs_is_local(ctx, name)) {
    /* Model-parallel: never leaves this rank. */
    if (h->req.device == GS__DEVICE_GPU) {
      free(h);
      return gs__set_error(GS_ERR_UNSUPPORTED,
                           "tensor '%s': local (model-parallel) tensors in GPU memory are not "
                           "supported yet; keep local tensors on the host",
                           name);
    }
    size_t bytes = count * gs__dtype_size((gs__dtype)dtype);
    if (send != recv && bytes) memcpy(recv, send, bytes);
    if (op == GS_AVERAGE && ctx->scale_local) gs__divide(recv, count, (gs__dtype)dtype, ctx->size);
    gs__op_complete_unsubmitted(h);
    pthread_mutex_lock(&ctx->mu);
    ctx->stats.local_ops++;
    pthread_mutex_unlock(&ctx->mu);
    *out = h;
    return GS_OK;
  }
  return gs__op_submit(ctx, h, out);
}

gs_status gs_allreduce_init(gs_ctx *ctx, const char *name, const void *send, void *recv,
                            size_t count, gs_dtype dtype, gs_reduce_op op,
                            const gs_allreduce_opts *opts, gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_allreduce_init: out is NULL");
  *out = NULL;
  struct gs_handle *h;
  gs_status st = make_allreduce(ctx, name, send, recv, count, dtype, op, opts, &h);
  if (st) return st;
  if (gs_is_local(ctx, name)) {
    free(h);
    return gs__set_error(GS_ERR_UNSUPPORTED,
                         "tensor '%s': rank %d (host %s) registered this name local "
                         "(gs_register_local); a persistent op cannot be local: use "
                         "gs_allreduce_async for it",
                         name, ctx->rank, ctx->host);
  }
  /* Hashed once here: each start looks the name up with its hashv. */
  unsigned hv;
  HASH_VALUE(h->req.name, h->name_len, hv);
  h->hashv = hv;
  h->persistent = 1;
  atomic_store_explicit(&h->refs, 1, memory_order_relaxed); /* the caller's: inactive */
  atomic_store_explicit(&h->done, 1, memory_order_release);
  *out = h;
  return GS_OK;
}

/* Waits (bounded) until the library has let go of each op's previous start:
 * a plan node or a fast round's snapshot that named it keeps its reference
 * until that plan or round ends, a little after the op completed. Only
 * done ops are waited for (an active one is refused under the lock), and
 * no new reference can be taken on a done op (references are taken only
 * from the tables of ops in flight, which it has left), so once refs is 1
 * it stays 1 until the start. */
static void start_wait_released(gs_handle *const *hs, size_t n) {
  uint64_t deadline = 0;
  unsigned yields = 0;
  for (size_t i = 0; i < n; i++) {
    while (atomic_load_explicit(&hs[i]->done, memory_order_acquire) &&
           atomic_load_explicit(&hs[i]->refs, memory_order_acquire) > 1) {
      /* The holder is a thread finishing its plan or round, microseconds
       * away: give it the cpu first (a 50 us sleep would be most of a
       * step), then sleep between looks. */
      if (yields < 64) {
        yields++;
        sched_yield();
        continue;
      }
      uint64_t now = gs__now_ms();
      if (!deadline) deadline = now + GS__START_HELD_MS;
      if (now >= deadline) return; /* start_check_locked refuses it */
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
}

gs_status gs_startall(gs_ctx *ctx, size_t n, gs_handle *const *hs) {
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "gs_startall: ctx is NULL");
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_startall", NULL);
  if (!n) return GS_OK;
  if (!hs) return gs__set_error(GS_ERR_INVALID_ARG, "gs_startall: hs is NULL for %zu ops", n);
  for (size_t i = 0; i < n; i++) {
    const struct gs_handle *h = hs[i];
    if (!h)
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "gs_startall: hs[%zu] is NULL (rank %d); none started", i, ctx->rank);
    if (!h->persistent || h->ctx != ctx)
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "gs_startall: hs[%zu] (tensor '%s') is not a persistent op of this "
                           "context (rank %d); make it with gs_allreduce_init on this context; "
                           "none started",
                           i, h->req.name, ctx->rank);
  }
  start_wait_released(hs, n);
  return submit_many(ctx, (struct gs_handle **)hs, n, 1);
}

gs_status gs_start(gs_handle *h) {
  if (!h) return gs__set_error(GS_ERR_INVALID_ARG, "gs_start: h is NULL");
  if (!h->persistent)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_start: tensor '%s' is not a persistent op (rank %d); make it with "
                         "gs_allreduce_init",
                         h->req.name, h->ctx->rank);
  return gs_startall(h->ctx, 1, &h);
}

gs_status gs_reduce_op_from_string(const char *name, gs_reduce_op *out) {
  static const char *const names[] = {"sum", "average", "min", "max", "product", "adasum"};
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_reduce_op_from_string: out is NULL");
  for (int i = 0; name && i < 6; i++)
    if (!strcmp(name, names[i])) {
      *out = (gs_reduce_op)i;
      return GS_OK;
    }
  return gs__set_error(GS_ERR_INVALID_ARG,
                       "unknown reduce op '%s': valid names are sum, average, min, max, product, "
                       "adasum",
                       name ? name : "(null)");
}

int gs_is_local(gs_ctx *ctx, const char *name) {
  if (!ctx || !name) return 0;
  if (gs__forked(ctx)) { /* no lock, whoever held it in the parent */
    gs__fork_error(ctx, "gs_is_local", name);
    return 0;
  }
  /* A registration made before this call (in this thread, or published to
   * it) is seen: its count is stored with release order. */
  if (!atomic_load_explicit(&ctx->nlocals, memory_order_acquire)) return 0;
  gs__local *l = NULL;
  pthread_mutex_lock(&ctx->mu);
  HASH_FIND_STR(ctx->locals, name, l);
  pthread_mutex_unlock(&ctx->mu);
  return l != NULL;
}

/* Appends name to a pending registration list (caller holds mu). */
static int push_name(char (**list)[GS__MAX_NAME + 1], size_t *n, size_t *cap, const char *name) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 8;
    char(*l)[GS__MAX_NAME + 1] = realloc(*list, c * sizeof *l);
    if (!l) return -1;
    *list = l;
    *cap = c;
  }
  snprintf((*list)[(*n)++], GS__MAX_NAME + 1, "%s", name);
  return 0;
}

static gs_status check_local_name(gs_ctx *ctx, const char *name, const char *what) {
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "%s: ctx is NULL", what);
  if (gs__forked(ctx)) return gs__fork_error(ctx, what, name);
  if (!name || !*name || strlen(name) > GS__MAX_NAME)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: the tensor name is empty or over %d bytes", what,
                         GS__MAX_NAME);
  return GS_OK;
}

gs_status gs_register_local(gs_ctx *ctx, const char *name) {
  gs_status st = check_local_name(ctx, name, "gs_register_local");
  if (st) return st;
  pthread_mutex_lock(&ctx->mu);
  gs__local *l = NULL;
  HASH_FIND_STR(ctx->locals, name, l);
  struct gs_handle *busy = gs__inflight_find_str_locked(ctx, name);
  if (busy) {
    st = gs__set_error(GS_ERR_INVALID_ARG,
                       "gs_register_local: tensor '%s' has an op in flight on rank %d; register "
                       "it before submitting it",
                       name, ctx->rank);
  } else if (!l) {
    l = calloc(1, sizeof *l);
    if (!l || push_name(&ctx->reg, &ctx->nreg, &ctx->reg_cap, name)) {
      free(l);
      st = gs__set_error(GS_ERR_NO_MEMORY, "gs_register_local: out of memory");
    } else {
      snprintf(l->name, sizeof l->name, "%s", name);
      HASH_ADD_STR(ctx->locals, name, l);
      atomic_store_explicit(&ctx->nlocals, HASH_COUNT(ctx->locals), memory_order_release);
    }
  }
  int kick = !st && gs__regs_due_locked(ctx) && gs__comm_wake_locked(ctx, 0);
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
  return st;
}

gs_status gs_unregister_local(gs_ctx *ctx, const char *name) {
  gs_status st = check_local_name(ctx, name, "gs_unregister_local");
  if (st) return st;
  pthread_mutex_lock(&ctx->mu);
  gs__local *l = NULL;
  HASH_FIND_STR(ctx->locals, name, l);
  if (l) {
    if (push_name(&ctx->unreg, &ctx->nunreg, &ctx->unreg_cap, name)) {
      st = gs__set_error(GS_ERR_NO_MEMORY, "gs_unregister_local: out of memory");
    } else {
      HASH_DEL(ctx->locals, l);
      free(l);
      atomic_store_explicit(&ctx->nlocals, HASH_COUNT(ctx->locals), memory_order_release);
    }
  }
  int kick = !st && gs__regs_due_locked(ctx) && gs__comm_wake_locked(ctx, 0);
  pthread_mutex_unlock(&ctx->mu);
  if (kick) gs__comm_kick(ctx);
  return st;
}

gs_status gs_grouped_allreduce_async(gs_ctx *ctx, size_t n, const char *const *names,
                                     const void *const *sends, void *const *recvs,
                                     const size_t *counts, gs_dtype dtype, gs_reduce_op op,
                                     const gs_allreduce_opts *opts, gs_handle **handles) {
  if (!ctx || !handles || (n && (!names || !sends || !recvs || !counts)))
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_grouped_allreduce_async: NULL argument");
  if (n == 0) return GS_OK;
  if (n > (1u << 20))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_grouped_allreduce_async: %zu tensors exceed the limit of %u per group",
                         n, 1u << 20);
  gs_allreduce_opts o;
  gs_allreduce_opts_init(&o);
  if (opts) {
    gs_status cst = gs__opts_copy(&o, opts, "gs_allreduce_opts");
    if (cst) return cst;
  }
  o.shape = NULL; /* a group call has no per-tensor shapes */
  o.ndim = 0;
  struct gs_handle **hs = calloc(n, sizeof *hs);
  if (!hs) return gs__set_error(GS_ERR_NO_MEMORY, "gs_grouped_allreduce_async: out of memory");
  /* The id follows from the members' names: the same on every rank, and
   * the same for every call of a repeated group (so it hits the response
   * cache); the names cannot be in flight twice, so neither can the id.
   * Hashed 8 bytes at a time, each name's length first (so that "ab","c"
   * and "a","bc" differ): FNV-1a byte by byte, as before, spent 6 us on
   * ResNet-50's 161 names (a multiply per byte, each waiting for the
   * last). */
  uint64_t gid = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
  for (size_t i = 0; i < n; i++) {
    const char *name = names[i] ? names[i] : "";
    size_t len = strlen(name);
    gid = gs__hash_bytes((gid ^ len) * 0xff51afd7ed558ccdull, name, len);
  }
  gid = gs__hash_final(gid);
  if (!gid) gid = 1;
  gs_status st = GS_OK;
  /* the options are copied once for all members (NULL: defaults) */
  const gs_allreduce_opts *mo = opts ? &o : NULL;
  for (size_t i = 0; i < n && !st; i++) {
    st = build_allreduce(ctx, names[i], sends[i], recvs[i], counts[i], dtype, op, mo, &hs[i]);
    if (!st) {
      hs[i]->req.group_id = gid;
      hs[i]->req.group_size = (uint32_t)n;
    }
  }
  /* All or none: a group that misses a member could never complete. */
  if (!st) st = submit_many(ctx, hs, n, 0);
  if (st) {
    for (size_t i = 0; i < n; i++) free(hs[i]);
  } else {
    for (size_t i = 0; i < n; i++) handles[i] = hs[i];
  }
  free(hs);
  return st;
}

gs_status gs_allgather_async(gs_ctx *ctx, const char *name, const void *send, const int64_t *shape,
                             int ndim, gs_dtype dtype, const gs_op_opts *opts, gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_allgather_async: out is NULL");
  *out = NULL;
  gs_op_opts o;
  gs_status ost = op_opts(opts, &o);
  if (ost) return ost;
  if (ndim < 1)
    return gs__set_error(
        GS_ERR_INVALID_ARG,
        "tensor '%s': allgather needs at least one dimension (got ndim=%d); reshape "
        "a scalar to [1]",
        name ? name : "?", ndim);
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, name, GS__OP_ALLGATHER, dtype, shape, ndim, &h);
  if (st) return st;
  if (h->count > 0 && !send) {
    size_t n = h->count;
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': send buffer is NULL for %zu elements",
                         name, n);
  }
  if ((st = gs__op_device(ctx, h, h->count ? send : NULL, NULL))) {
    free(h);
    return st;
  }
  h->send = send;
  h->stream = o.stream;
  return gs__op_submit(ctx, h, out);
}

gs_status gs_broadcast_async(gs_ctx *ctx, const char *name, void *buf, size_t count, gs_dtype dtype,
                             int root, const gs_op_opts *opts, gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_broadcast_async: out is NULL");
  *out = NULL;
  gs_op_opts o;
  gs_status ost = op_opts(opts, &o);
  if (ost) return ost;
  if (ctx && (root < 0 || root >= ctx->size))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': broadcast root %d is not a rank of this job (0..%d)",
                         name ? name : "?", root, ctx->size - 1);
  int64_t flat = (int64_t)count;
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, name, GS__OP_BROADCAST, dtype, &flat, 1, &h);
  if (st) return st;
  if (count > 0 && !buf) {
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': buffer is NULL for %zu elements", name,
                         count);
  }
  if ((st = gs__op_device(ctx, h, count ? buf : NULL, NULL))) {
    free(h);
    return st;
  }
  h->req.root_rank = root;
  h->send = h->recv = buf;
  h->stream = o.stream;
  return gs__op_submit(ctx, h, out);
}

gs_status gs_barrier(gs_ctx *ctx) {
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "gs_barrier: ctx is NULL");
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_barrier", NULL);
  char name[64];
  snprintf(name, sizeof name, "gs.barrier.%lu",
           (unsigned long)atomic_fetch_add(&ctx->barrier_seq, 1));
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, name, GS__OP_BARRIER, GS_UINT8, NULL, 0, &h);
  if (st) return st;
  gs_handle *hh;
  if ((st = gs__op_submit(ctx, h, &hh))) return st;
  st = gs_wait(hh, -1);
  gs_handle_free(hh);
  return st;
}

gs_status gs_alltoall_async(gs_ctx *ctx, const char *name, const void *send, const int64_t *shape,
                            int ndim, gs_dtype dtype, const int64_t *splits, const gs_op_opts *opts,
                            gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_alltoall_async: out is NULL");
  *out = NULL;
  gs_op_opts o;
  gs_status ost = op_opts(opts, &o);
  if (ost) return ost;
  if (ndim < 1 || !shape)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': alltoall needs at least one dimension (got ndim=%d)",
                         name ? name : "?", ndim);
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, name, GS__OP_ALLTOALL, dtype, shape, ndim, &h);
  if (st) return st;
  int n = ctx->size;
  h->splits = calloc((size_t)n, sizeof *h->splits);
  if (!h->splits) {
    free(h);
    return gs__set_error(GS_ERR_NO_MEMORY, "tensor '%s': out of memory", name);
  }
  if (!splits) {
    /* Equal parts, as Horovod: the first dimension must divide evenly. */
    if (shape[0] % n) {
      free(h->splits);
      free(h);
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "tensor '%s': alltoall without splits needs a first dimension "
                           "divisible by the %d ranks, but it is %lld; pass splits",
                           name, n, (long long)shape[0]);
    }
    for (int q = 0; q < n; q++) h->splits[q] = shape[0] / n;
  } else {
    int64_t sum = 0;
    for (int q = 0; q < n; q++) {
      if (splits[q] < 0) {
        int64_t bad = splits[q];
        free(h->splits);
        free(h);
        return gs__set_error(GS_ERR_INVALID_ARG,
                             "tensor '%s': alltoall split %d is negative (%lld)", name, q,
                             (long long)bad);
      }
      h->splits[q] = splits[q];
      sum += splits[q];
    }
    if (sum != shape[0]) {
      free(h->splits);
      free(h);
      return gs__set_error(GS_ERR_INVALID_ARG,
                           "tensor '%s': alltoall splits add up to %lld rows but the first "
                           "dimension is %lld; the %d splits must sum to it",
                           name, (long long)sum, (long long)shape[0], n);
    }
  }
  if (h->count > 0 && !send) {
    free(h->splits);
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': send buffer is NULL", name);
  }
  if ((st = gs__op_device(ctx, h, h->count ? send : NULL, NULL))) {
    free(h->splits);
    free(h);
    return st;
  }
  h->send = send;
  h->stream = o.stream;
  return gs__op_submit(ctx, h, out);
}

gs_status gs_alltoall_recv_splits(const gs_handle *h, int64_t *splits, size_t n) {
  const void *d;
  size_t b;
  gs_status st = gs_handle_result(h, &d, &b);
  if (st) return st;
  if (h->req.op != GS__OP_ALLTOALL)
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': not an alltoall", h->req.name);
  for (size_t i = 0; i < h->nrank_dims && i < n; i++) splits[i] = h->rank_dims[i];
  return GS_OK;
}

gs_status gs_reducescatter_async(gs_ctx *ctx, const char *name, const void *send,
                                 const int64_t *shape, int ndim, gs_dtype dtype, gs_reduce_op op,
                                 const gs_op_opts *opts, gs_handle **out) {
  if (!out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_reducescatter_async: out is NULL");
  *out = NULL;
  gs_op_opts o;
  gs_status ost = op_opts(opts, &o);
  if (ost) return ost;
  if (op != GS_SUM && op != GS_AVERAGE)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': reducescatter supports only GS_SUM and GS_AVERAGE",
                         name ? name : "?");
  if (ndim < 1 || !shape)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': reducescatter needs at least one dimension (got ndim=%d)",
                         name ? name : "?", ndim);
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, name, GS__OP_REDUCESCATTER, dtype, shape, ndim, &h);
  if (st) return st;
  if (h->count > 0 && !send) {
    free(h);
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': send buffer is NULL", name);
  }
  if ((st = gs__op_device(ctx, h, h->count ? send : NULL, NULL))) {
    free(h);
    return st;
  }
  h->req.reduce_op = (gs__reduce_op)op;
  h->send = send;
  h->stream = o.stream;
  return gs__op_submit(ctx, h, out);
}

gs_status gs_join(gs_ctx *ctx, int *last_joined_rank) {
  if (!ctx) return gs__set_error(GS_ERR_INVALID_ARG, "gs_join: ctx is NULL");
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_join", NULL);
  struct gs_handle *h;
  gs_status st = gs__op_new(ctx, "gs.join", GS__OP_JOIN, GS_UINT8, NULL, 0, &h);
  if (st) return st;
  /* From now on the exec thread fills in zeros for tensors this rank does
   * not submit; the join's completion ends that. */
  pthread_mutex_lock(&ctx->mu);
  ctx->joined = 1;
  pthread_mutex_unlock(&ctx->mu);
  gs_handle *hh;
  if ((st = gs__op_submit(ctx, h, &hh))) {
    pthread_mutex_lock(&ctx->mu);
    ctx->joined = 0;
    pthread_mutex_unlock(&ctx->mu);
    return st;
  }
  st = gs_wait(hh, -1);
  if (!st && last_joined_rank) *last_joined_rank = hh->join_last;
  gs_handle_free(hh);
  return st;
}

gs_status gs_handle_result(const gs_handle *h, const void **data, size_t *bytes) {
  if (!h || !data || !bytes)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_handle_result: NULL argument");
  if (!atomic_load_explicit(&((gs_handle *)h)->done, memory_order_acquire))
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': the op is still pending, so it has no result yet; wait "
                         "for it first (gs_wait, gs_test)",
                         h->req.name);
  if (h->status != GS_OK)
    return gs__set_error(GS_ERR_INVALID_ARG, "tensor '%s': the op failed, so it has no result (%s)",
                         h->req.name, h->error ? h->error : gs_status_str(h->status));
  if (!h->result && h->req.op != GS__OP_ALLGATHER)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': %s writes into your buffer; only allgather, alltoall, "
                         "reducescatter and sparse results live in the handle",
                         h->req.name, gs__op_type_name(h->req.op));
  *data = h->result;
  *bytes = h->result_bytes;
  return GS_OK;
}

/* The result lives in the memory of the op's device (the executor allocates
 * it with that device's backend); the device copy is nccl.c's, through the
 * factory, so this file includes nothing from CUDA. */
gs_status gs_handle_result_copy(const gs_handle *h, void *dst, size_t bytes) {
  if (!h) return gs__set_error(GS_ERR_INVALID_ARG, "gs_handle_result_copy: the handle is NULL");
  const void *src;
  size_t have;
  gs_status st = gs_handle_result(h, &src, &have);
  if (st) return st;
  if (bytes != have)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': gs_handle_result_copy was given %zu bytes for a result of "
                         "%zu bytes; pass a buffer of exactly the result's size "
                         "(gs_handle_result's bytes)",
                         h->req.name, bytes, have);
  if (!bytes) return GS_OK;
  if (!dst)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': gs_handle_result_copy: dst is NULL for a result of %zu "
                         "bytes",
                         h->req.name, bytes);
  gs__device where = h->req.device, to = gs__pointer_device(dst, NULL);
  if (to != where)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "tensor '%s': the result is in %s memory (where the op ran) but "
                         "gs_handle_result_copy's dst is in %s memory; allocate dst on the "
                         "input's device",
                         h->req.name, gs__device_name(where), gs__device_name(to));
  if (where == GS__DEVICE_CPU) {
    memcpy(dst, src, bytes);
    return GS_OK;
  }
  char err[512];
  int rc = gs__device_result_copy(dst, src, bytes, h->stream, err, sizeof err);
  if (rc)
    return gs__set_error((gs_status)rc, "tensor '%s': gs_handle_result_copy: %s", h->req.name, err);
  return GS_OK;
}

gs_status gs_allgather_dims(const gs_handle *h, int64_t *rank_dims, size_t n, int64_t *total) {
  const void *d;
  size_t b;
  gs_status st = gs_handle_result(h, &d, &b);
  if (st) return st;
  int64_t sum = 0;
  for (size_t i = 0; i < h->nrank_dims; i++) {
    if (i < n && rank_dims) rank_dims[i] = h->rank_dims[i];
    sum += h->rank_dims[i];
  }
  if (total) *total = sum;
  return GS_OK;
}

/* ---- waiting --------------------------------------------------------------- */

static void abs_deadline(struct timespec *ts, int timeout_ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += timeout_ms / 1000;
  ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static gs_status finished(gs_handle *h) {
  if (h->status != GS_OK) gs__set_error(h->status, "%s", h->error ? h->error : "");
  return h->status;
}

/* Whether a thread about to wait for hs runs the fast round itself
 * (caller holds ctx->mu; not for a passive wait, a background completer
 * such as Python's, which would start a round at each step's first op):
 * one of its ops is on the fast queue, no round
 * runs or is parked and no plan is queued (the exec thread, woken by the
 * first submission, has not started: on a cpu it shares with this thread
 * it runs only once this one sleeps, and both ranks' step would pay two
 * thread hand-offs), and the host backend can park an agreement, which
 * keeps the wait's deadline: when it passes before every rank entered,
 * the exec thread finishes the round and the wait times out as before. */
static int caller_round_due_locked(const gs_ctx *ctx, gs_handle *const *hs, size_t n) {
  if (!ctx->fast || ctx->fast_in_round || ctx->fast_parked || ctx->plans_head || ctx->exec_plan ||
      !gs__fast_work_locked(ctx))
    return 0;
  const gs__backend *b = ctx->backends[GS__DEVICE_CPU];
  if (!b || !b->v->agree_until) return 0;
  for (size_t i = 0; i < n; i++)
    if (hs[i]->fast && !hs[i]->round) return 1;
  return 0;
}

/* gs_wait_any, and gs_wait_any_passive when passive: a passive wait is not
 * registered as this rank waiting on the ops (deadlock detection). */
static gs_status wait_any(const char *fn, gs_handle *const *hs, size_t n, int timeout_ms,
                          size_t *index, int passive) {
  if (!hs || n == 0 || !index)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: no handles given (hs=%p, n=%zu)", fn,
                         (const void *)hs, n);
  for (size_t i = 0; i < n; i++) {
    if (!hs[i]) return gs__set_error(GS_ERR_INVALID_ARG, "%s: handle %zu is NULL", fn, i);
    if (hs[i]->ctx != hs[0]->ctx)
      return gs__set_error(GS_ERR_INVALID_ARG, "%s: handles belong to different contexts", fn);
  }
  /* Completed handles are readable without the context (it may be gone). */
  for (size_t i = 0; i < n; i++)
    if (atomic_load_explicit(&hs[i]->done, memory_order_acquire)) {
      *index = i;
      return finished(hs[i]);
    }
  if (gs__forked(hs[0]->ctx)) return gs__fork_error(hs[0]->ctx, fn, hs[0]->req.name);
  if (timeout_ms == 0) return gs__set_error(GS_ERR_TIMEOUT, "%s: the op is still pending", fn);
  gs_ctx *ctx = hs[0]->ctx;
  struct timespec ts;
  if (timeout_ms > 0) abs_deadline(&ts, timeout_ms);
  /* Registered so the comm thread can report what this thread is blocked
   * on (deadlock detection); blocked-since is the ops' first wait, so a
   * timed wait re-entered in a loop stays blocked from the first. */
  gs__waiter self = {hs, n, NULL};
  gs_status st = GS_ERR_TIMEOUT;
  pthread_mutex_lock(&ctx->mu);
  uint64_t now = gs__now_ms();
  int kick = 0;
  if (!passive) {
    for (size_t i = 0; i < n; i++) {
      kick |= gs__handle_waited_locked(ctx, hs[i], now);
      hs[i]->nwaiting++;
    }
    self.next = ctx->waiters;
    ctx->waiters = &self;
  }
  /* An op this thread now waits for that the comm thread has not taken
   * yet: write the queued submissions from here when the stream is free
   * (everything submitted before the wait goes in one message, and the
   * comm thread's wake-up is off the critical path). */
  gs__rank_msg m;
  int send = 0;
  for (size_t i = 0; i < n && !send; i++)
    if (hs[i]->queued && !atomic_load_explicit(&hs[i]->done, memory_order_relaxed))
      send = gs__requests_claim_locked(ctx, &m);
  if (kick || send) { /* no thread other than this one ends the context meanwhile */
    pthread_mutex_unlock(&ctx->mu);
    if (send) gs__requests_send(ctx, &m);
    if (kick) gs__comm_kick(ctx);
    pthread_mutex_lock(&ctx->mu);
  }
  if (!passive && caller_round_due_locked(ctx, hs, n)) {
    pthread_mutex_unlock(&ctx->mu);
    int64_t deadline_ns =
        timeout_ms < 0 ? 0 : (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
    int parked = gs__fast_round_caller(ctx, deadline_ns);
    pthread_mutex_lock(&ctx->mu);
    /* What the round did not take (ops a peer had not submitted, later
     * submissions from other threads), a plan or a stop is the exec
     * thread's again: it slept through the round. */
    if (!parked && ctx->exec_idle &&
        (gs__fast_work_locked(ctx) || ctx->plans_head || ctx->exec_stop)) {
      ctx->exec_idle = 0;
      pthread_cond_signal(&ctx->exec_cv);
    }
  }
  for (;;) {
    size_t i = 0;
    while (i < n && !atomic_load_explicit(&hs[i]->done, memory_order_acquire)) i++;
    if (i < n) {
      *index = i;
      st = GS_OK;
      break;
    }
    int rc = timeout_ms < 0 ? pthread_cond_wait(&ctx->cv, &ctx->mu)
                            : pthread_cond_timedwait(&ctx->cv, &ctx->mu, &ts);
    if (rc == ETIMEDOUT) break;
  }
  if (!passive) {
    for (gs__waiter **w = &ctx->waiters; *w; w = &(*w)->next)
      if (*w == &self) {
        *w = self.next;
        break;
      }
    now = gs__now_ms();
    for (size_t i = 0; i < n; i++) {
      hs[i]->nwaiting--;
      if (hs[i]->wait_last_ms < now) hs[i]->wait_last_ms = now;
    }
  }
  pthread_mutex_unlock(&ctx->mu);
  GS_TRACE(GS__TR_APP_WAKE, st, 0);
  if (st == GS_OK) return finished(hs[*index]);
  return gs__set_error(GS_ERR_TIMEOUT, "%s: timed out after %d ms; the op is still pending", fn,
                       timeout_ms);
}

gs_status gs_wait(gs_handle *h, int timeout_ms) {
  size_t idx;
  if (!h) return gs__set_error(GS_ERR_INVALID_ARG, "gs_wait: handle is NULL");
  /* Done already (a step's later waits, once its round completed them
   * all): what wait_any's first look would find, without its checks. */
  if (atomic_load_explicit(&h->done, memory_order_acquire)) return finished(h);
  return wait_any("gs_wait", &h, 1, timeout_ms, &idx, 0);
}

gs_status gs_wait_any(gs_handle *const *hs, size_t n, int timeout_ms, size_t *index) {
  return wait_any("gs_wait_any", hs, n, timeout_ms, index, 0);
}

gs_status gs_wait_any_passive(gs_handle *const *hs, size_t n, int timeout_ms, size_t *index) {
  return wait_any("gs_wait_any_passive", hs, n, timeout_ms, index, 1);
}

gs_status gs_test(gs_handle *h, int *done) {
  if (!h || !done) return gs__set_error(GS_ERR_INVALID_ARG, "gs_test: NULL argument");
  *done = atomic_load_explicit(&h->done, memory_order_acquire);
  if (!*done) {
    /* Polling a pending op is waiting on it (deadlock detection). While it
     * is pending its context is alive. */
    gs_ctx *ctx = h->ctx;
    if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_test", h->req.name);
    pthread_mutex_lock(&ctx->mu);
    int kick = gs__handle_waited_locked(ctx, h, gs__now_ms());
    pthread_mutex_unlock(&ctx->mu);
    if (kick) gs__comm_kick(ctx);
  }
  return GS_OK;
}

const char *gs_handle_error(const gs_handle *h) {
  if (!h || !atomic_load_explicit(&((gs_handle *)h)->done, memory_order_acquire)) return "";
  return h->error ? h->error : "";
}

void gs_handle_free(gs_handle *h) {
  if (h) gs__handle_unref(h);
}

gs_status gs_get_stats(const gs_ctx *ctx, gs_stats *out) {
  if (!ctx || !out) return gs__set_error(GS_ERR_INVALID_ARG, "gs_get_stats: NULL argument");
  if (gs__forked(ctx)) return gs__fork_error(ctx, "gs_get_stats", NULL);
  gs_stats s;
  gs_stats_init(&s);
  size_t given = out->struct_size;
  if (given <= sizeof(size_t) || given > sizeof s)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_get_stats: out->struct_size is %zu; initialise it with gs_stats_init "
                         "(this library accepts %zu..%zu)",
                         given, sizeof(size_t) + 1, sizeof s);
  pthread_mutex_lock((pthread_mutex_t *)&ctx->mu);
  s = ctx->stats;
  pthread_mutex_unlock((pthread_mutex_t *)&ctx->mu);
  s.struct_size = given;
  memcpy(out, &s, given); /* an older caller gets the fields it knows */
  return GS_OK;
}

/* ---- the application's key-value namespace ---------------------------------- */

/* "epoch/<epoch>/app/<key>": scoped to this job's epoch and apart from the
 * library's own keys (ring addresses live under "epoch/<epoch>/ring/"). */
static gs_status app_key(const gs_ctx *ctx, const char *fn, const char *key, char **out) {
  if (!ctx || !key || !*key)
    return gs__set_error(GS_ERR_INVALID_ARG, "%s: %s", fn,
                         !ctx ? "ctx is NULL" : "key is NULL or empty; give a non-empty name");
  if (gs__forked(ctx)) return gs__fork_error(ctx, fn, NULL);
  size_t klen = strlen(key);
  if (klen > GS_KV_KEY_MAX)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "%s: key of %zu bytes is longer than GS_KV_KEY_MAX (%d); use a shorter "
                         "name",
                         fn, klen, GS_KV_KEY_MAX);
  if (asprintf(out, "epoch/%llu/app/%s", (unsigned long long)ctx->join.epoch, key) < 0) {
    *out = NULL;
    return gs__set_error(GS_ERR_NO_MEMORY, "%s: out of memory", fn);
  }
  return GS_OK;
}

gs_status gs_kv_set(gs_ctx *ctx, const char *key, const void *value, size_t len) {
  if (!value && len)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_kv_set: value is NULL but len is %zu", len);
  if (len > GS_KV_VALUE_MAX)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_kv_set: key '%s': value of %zu bytes is larger than GS_KV_VALUE_MAX "
                         "(%d)",
                         key ? key : "(null)", len, GS_KV_VALUE_MAX);
  char *k;
  gs_status st = app_key(ctx, "gs_kv_set", key, &k);
  if (st) return st;
  char err[GS__MAX_TEXT];
  int rc = gs__client_kv_set(ctx->client, k, value ? value : "", len, err, sizeof err);
  free(k);
  if (rc) return gs__set_error((gs_status)rc, "gs_kv_set (rank %d): %s", ctx->rank, err);
  return GS_OK;
}

gs_status gs_kv_get(gs_ctx *ctx, const char *key, int timeout_ms, void **value, size_t *len) {
  if (!value || !len)
    return gs__set_error(GS_ERR_INVALID_ARG, "gs_kv_get: value and len must not be NULL");
  *value = NULL;
  *len = 0;
  if (timeout_ms < 0 || timeout_ms > GS_KV_WAIT_MAX_MS)
    return gs__set_error(GS_ERR_INVALID_ARG,
                         "gs_kv_get: timeout_ms %d is outside 0..%d; wait in a loop for longer",
                         timeout_ms, GS_KV_WAIT_MAX_MS);
  char *k;
  gs_status st = app_key(ctx, "gs_kv_get", key, &k);
  if (st) return st;
  char err[GS__MAX_TEXT];
  void *v = NULL;
  size_t n = 0;
  int rc = gs__client_kv_get(ctx->client, k, timeout_ms, &v, &n, err, sizeof err);
  free(k);
  if (rc) return gs__set_error((gs_status)rc, "gs_kv_get (rank %d): %s", ctx->rank, err);
  /* never NULL on success, so that an empty value differs from none */
  if (!v && !(v = malloc(1))) return gs__set_error(GS_ERR_NO_MEMORY, "gs_kv_get: out of memory");
  *value = v;
  *len = n;
  return GS_OK;
}

void gs_free(void *p) {
  free(p);
}
