/* gradsync.v1.Diagnostics: answers from the engine's read-only views
 * (engine.h) and keeps the event watchers. Events come from the
 * coordinator's sink; every watcher gets the recent ones at once and the
 * rest as they happen. A watcher whose stream queue exceeds its bound is
 * cut off by the transport (RESOURCE_EXHAUSTED), never buffered without
 * bound. Queue thread only. */
#include "diagnostics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "codec_diag.h"
#include "log.h"
#include "status.h"

#define RECENT_EVENTS 64
#define WATCHER_QUEUE_BYTES (1u << 20)
#define MAX_REASON 1024

typedef struct watcher {
  gs__call *call;
  struct watcher *prev, *next;
} watcher;

enum {
  M_STATUS,
  M_PENDING,
  M_STALLS,
  M_LOCALS,
  M_EVENTS,
  M_METRICS,
  M_TL_START,
  M_TL_STOP,
  M_ABORT,
  M_COUNT
};

struct gs__diagnostics {
  gs__coordinator *co;
  gs__diag_setting *settings;
  size_t nsettings;
  char version[32];
  uint64_t start_ms;
  uint64_t next_seq;
  gs__diag_event recent[RECENT_EVENTS]; /* ring, by seq */
  watcher *watchers;
  int closed; /* the listener is closing: new watches end after the history */
  uint64_t watchers_dropped;
  gs__method methods[M_COUNT];
  gs__service service;
};

static void reply_or_fail(gs__call *c, int rc, uint8_t *buf, size_t len) {
  if (rc == GS__OK) {
    gs__call_reply(c, buf, len);
    free(buf);
  } else {
    gs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gradsyncd is out of memory");
  }
}

static int check_empty(gs__call *c) {
  const uint8_t *buf;
  size_t len;
  char err[256];
  gs__call_request(c, &buf, &len);
  if (gs__decode_diag_empty(buf, len, err, sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return -1;
  }
  return 0;
}

static void on_status(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  if (check_empty(c)) return;
  uint64_t now = gs__now_ms();
  gs__diag_status st;
  int rc = gs__engine_status(gs__coordinator_engine(d->co), now, &st);
  if (rc) {
    reply_or_fail(c, rc, NULL, 0);
    return;
  }
  snprintf(st.version, sizeof st.version, "%s", d->version);
  int draining = gs__coordinator_draining(d->co);
  snprintf(st.coordinator_state, sizeof st.coordinator_state, "%s",
           draining ? "draining" : "serving");
  if (draining && gs__coordinator_sessions_closed_by_shutdown(d->co)) {
    /* The engine was not told (the ranks are not lost): what it last saw
     * of a rank in the job is over, its session was ended. */
    for (size_t i = 0; i < st.nranks; i++)
      if (!strcmp(st.ranks[i].state, "connected") || !strcmp(st.ranks[i].state, "joined"))
        snprintf(st.ranks[i].state, sizeof st.ranks[i].state, "closed");
  }
  st.uptime_s = (double)(now - d->start_ms) / 1000.0;
  /* Borrowed for the encoding only. */
  st.settings = d->settings;
  st.nsettings = d->nsettings;
  uint8_t *buf = NULL;
  size_t len = 0;
  rc = gs__encode_diag_status(&st, &buf, &len);
  st.settings = NULL;
  st.nsettings = 0;
  gs__diag_status_free(&st);
  reply_or_fail(c, rc, buf, len);
}

static void on_pending(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  const uint8_t *req;
  size_t rlen;
  char err[512];
  gs__call_request(c, &req, &rlen);
  gs__diag_pending_query q;
  if (gs__decode_pending_query(req, rlen, &q, err, sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  gs__diag_pending_list l;
  int rc = gs__engine_list_pending(gs__coordinator_engine(d->co), &q, gs__now_ms(), &l);
  gs__diag_pending_query_free(&q);
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!rc) rc = gs__encode_pending_list(&l, &buf, &len);
  gs__diag_pending_list_free(&l);
  reply_or_fail(c, rc, buf, len);
}

static void on_stalls(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  if (check_empty(c)) return;
  gs__diag_stalls s;
  int rc = gs__engine_stalls(gs__coordinator_engine(d->co), gs__now_ms(), &s);
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!rc) rc = gs__encode_diag_stalls(&s, &buf, &len);
  gs__diag_stalls_free(&s);
  reply_or_fail(c, rc, buf, len);
}

static void on_locals(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  if (check_empty(c)) return;
  gs__diag_locals l;
  int rc = gs__engine_locals(gs__coordinator_engine(d->co), &l);
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!rc) rc = gs__encode_diag_locals(&l, &buf, &len);
  gs__diag_locals_free(&l);
  reply_or_fail(c, rc, buf, len);
}

/* ---- events -------------------------------------------------------------- */

static int send_event(gs__diagnostics *d, watcher *w, const gs__diag_event *ev) {
  uint8_t *buf;
  size_t len;
  if (gs__encode_diag_event(ev, &buf, &len) != GS__OK) return 0;
  int rc = gs__call_send(w->call, buf, len);
  free(buf);
  if (rc == -2) {
    d->watchers_dropped++;
    GS_LOG_WARN("an event watcher (%s) did not keep up; its WatchEvents stream was cut off",
                gs__call_peer(w->call));
  }
  return rc;
}

static void on_event(void *arg, int kind, int32_t rank, const char *text) {
  gs__diagnostics *d = arg;
  gs__diag_event *ev = &d->recent[d->next_seq % RECENT_EVENTS];
  gs__diag_event_free(ev);
  ev->seq = ++d->next_seq;
  ev->kind = kind;
  ev->rank = rank;
  ev->message = strdup(text);
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ev->time, sizeof ev->time, "%s.%03dZ", day, (int)(ts.tv_nsec / 1000000L));
  for (watcher *w = d->watchers; w; w = w->next) send_event(d, w, ev);
}

static void on_watch(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  const uint8_t *buf;
  size_t len;
  char err[256];
  gs__call_request(c, &buf, &len);
  if (gs__decode_diag_empty(buf, len, err, sizeof err)) {
    gs__call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  watcher *w = calloc(1, sizeof *w);
  if (!w) {
    gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "gradsyncd is out of memory");
    return;
  }
  w->call = c;
  w->next = d->watchers;
  if (d->watchers) d->watchers->prev = w;
  d->watchers = w;
  gs__call_set_data(c, w);
  /* The recent events first, oldest first. */
  uint64_t first = d->next_seq > RECENT_EVENTS ? d->next_seq - RECENT_EVENTS + 1 : 1;
  for (uint64_t s = first; s <= d->next_seq; s++)
    if (send_event(d, w, &d->recent[(s - 1) % RECENT_EVENTS])) break;
  if (d->closed) gs__call_finish(c, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
}

static void on_watch_close(void *arg, gs__call *c, int cancelled) {
  gs__diagnostics *d = arg;
  watcher *w = gs__call_data(c);
  if (!w) return;
  if (w->prev)
    w->prev->next = w->next;
  else
    d->watchers = w->next;
  if (w->next) w->next->prev = w->prev;
  free(w);
}

/* The listener closes (after the shutdown's drain, during which event
 * watchers keep their streams and see the job's last events). */
static void diagnostics_close(void *arg) {
  gs__diagnostics *d = arg;
  d->closed = 1;
  for (watcher *w = d->watchers; w; w = w->next)
    gs__call_finish(w->call, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
}

/* ---- metrics ------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", name, help, name, type, name, v);
}

char *gs__diagnostics_metrics(gs__diagnostics *d) {
  gs__engine_stats st;
  gs__engine_get_stats(gs__coordinator_engine(d->co), &st);
  sbuf b = {0};
  sb_printf(&b,
            "# HELP gradsync_build_info gradsyncd's version.\n# TYPE gradsync_build_info gauge\n"
            "gradsync_build_info{version=\"%s\"} 1\n",
            d->version);
  metric(&b, "gradsync_uptime_seconds", "gauge", "Seconds since gradsyncd started.",
         (double)(gs__now_ms() - d->start_ms) / 1000.0);
  metric(&b, "gradsync_world_size", "gauge", "Ranks in the job (0 until the first joins).",
         st.world_size);
  metric(&b, "gradsync_live_ranks", "gauge", "Ranks with an open session.", st.connected);
  metric(&b, "gradsync_pending_tensors", "gauge",
         "Tensors submitted by some ranks and not yet planned.",
         (double)(st.pending_tensors + st.fast_pending));
  metric(&b, "gradsync_plans_total", "counter", "Plans sent to the ranks.",
         (double)st.plans_emitted);
  metric(&b, "gradsync_collectives_total", "counter",
         "Collective operations planned (a fused operation counts once).", (double)st.collectives);
  metric(&b, "gradsync_tensors_planned_total", "counter", "Tensors planned into collectives.",
         (double)st.tensors_planned);
  metric(&b, "gradsync_bytes_total", "counter", "Bytes of the tensors planned.",
         (double)st.bytes_planned);
  metric(&b, "gradsync_cache_hits_total", "counter",
         "Tensor requests received as response-cache ids.", (double)st.cache_hits);
  metric(&b, "gradsync_cache_misses_total", "counter", "Tensor requests received in full.",
         (double)st.full_requests);
  metric(&b, "gradsync_stalls_total", "counter", "Stall reports.", (double)st.stall_reports);
  metric(&b, "gradsync_deadlocks_total", "counter", "Deadlocks detected.", (double)st.deadlocks);
  metric(&b, "gradsync_mismatches_total", "counter",
         "Tensors failed because ranks submitted them differently.", (double)st.mismatches);
  metric(&b, "gradsync_ranks_lost_total", "counter", "Ranks declared lost.", (double)st.ranks_lost);
  metric(&b, "gradsync_event_watchers_dropped_total", "counter",
         "WatchEvents streams cut off for not keeping up.", (double)d->watchers_dropped);
  metric(&b, "gradsync_fast_mode", "gauge",
         "1 while the ranks agree on cached requests among themselves (fast path).",
         (double)st.fast_mode);
  metric(&b, "gradsync_fast_entries_total", "counter", "Plans that sent the ranks into fast mode.",
         (double)st.fast_entries);
  metric(&b, "gradsync_fast_rounds_total", "counter",
         "Fast rounds that ran a common set (the largest rank's count).", (double)st.fast_rounds);
  metric(&b, "gradsync_fast_backoffs_total", "counter",
         "Fast-path episodes that ended at their first round for an op a fast round cannot run "
         "(each held the marker back).",
         (double)st.fast_backoffs);
  metric(&b, "gradsync_fast_backoff_plans", "gauge",
         "Plans that empty the table still to go without the fast path's marker (0: not backed "
         "off, or the next such plan carries it).",
         (double)st.fast_backoff_left);
  metric(&b, "gradsync_fast_tensors_total", "counter",
         "Tensors completed in fast rounds (the largest rank's count).", (double)st.fast_tensors);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

static void on_metrics(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  if (check_empty(c)) return;
  char *text = gs__diagnostics_metrics(d);
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = text ? gs__encode_diag_text(GS__TXT_METRICS_RESP, text, &buf, &len) : GS__ERR_NO_MEMORY;
  free(text);
  reply_or_fail(c, rc, buf, len);
}

/* ---- timeline ------------------------------------------------------------ */

static void on_timeline_start(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  const uint8_t *req;
  size_t rlen;
  char err[GS__MAX_TEXT], *path = NULL;
  gs__call_request(c, &req, &rlen);
  if (gs__decode_diag_text(GS__TXT_TIMELINE_START, req, rlen, GS__DIAG_MAX_PATH - 1, &path, err,
                           sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  if (!path[0] || strchr(path, '\n')) {
    free(path);
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                  "StartTimeline needs a path: a file on gradsyncd's host to write the trace to");
    return;
  }
  if (gs__coordinator_timeline_start(d->co, path, err, sizeof err) != GS__OK) {
    free(path);
    gs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION, err);
    return;
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = gs__encode_diag_text(GS__TXT_TIMELINE_STARTED, path, &buf, &len);
  free(path);
  reply_or_fail(c, rc, buf, len);
}

static void on_timeline_stop(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  if (check_empty(c)) return;
  char path[GS__DIAG_MAX_PATH];
  uint64_t events = 0;
  if (gs__coordinator_timeline_stop(d->co, path, sizeof path, &events) != 0) {
    gs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                  "no timeline is running: start one with StartTimeline (gradsyncctl timeline "
                  "start FILE) or gradsyncd --timeline FILE");
    return;
  }
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = gs__encode_timeline_stopped(path, events, &buf, &len);
  reply_or_fail(c, rc, buf, len);
}

/* ---- abort --------------------------------------------------------------- */

static void on_abort(void *arg, gs__call *c) {
  gs__diagnostics *d = arg;
  const uint8_t *req;
  size_t rlen;
  char err[256], *reason = NULL;
  gs__call_request(c, &req, &rlen);
  if (gs__decode_diag_text(GS__TXT_ABORT_REQ, req, rlen, MAX_REASON, &reason, err, sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  if (!reason[0]) {
    free(reason);
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                  "AbortJob needs a reason: the ranks print it; say why the job is stopped");
    return;
  }
  for (char *p = reason; *p; p++) /* one line in every log */
    if (*p == '\n' || *p == '\r') *p = ' ';
  GS_LOG_WARN("AbortJob from %s: %s", gs__call_peer(c), reason);
  gs__coordinator_abort(d->co, reason);
  free(reason);
  gs__call_reply(c, NULL, 0); /* AbortJobResponse is empty */
}

/* ---- service ------------------------------------------------------------- */

#define DIAG(m) "/gradsync.v1.Diagnostics/" m

int gs__diagnostics_create(const gs__diagnostics_opts *o, gs__coordinator *co,
                           gs__diagnostics **out) {
  *out = NULL;
  gs__diagnostics *d = calloc(1, sizeof *d);
  if (!d) return GS__ERR_NO_MEMORY;
  d->co = co;
  d->start_ms = gs__now_ms();
  snprintf(d->version, sizeof d->version, "%s", o->version ? o->version : "");
  d->settings = calloc(o->nsettings + 1, sizeof *d->settings);
  if (!d->settings) goto out_oom;
  for (size_t i = 0; i < o->nsettings; i++) {
    d->settings[i].key = strdup(o->settings[i].key);
    d->settings[i].value = strdup(o->settings[i].value);
    d->nsettings++;
    if (!d->settings[i].key || !d->settings[i].value) goto out_oom;
  }
  gs__rpc_auth rd = o->open_reads ? GS__AUTH_OPEN : GS__AUTH_TOKEN;
  d->methods[M_STATUS] =
      (gs__method){DIAG("GetStatus"), GS__RPC_UNARY, rd, on_status, NULL, NULL, 0, 0, 0};
  d->methods[M_PENDING] =
      (gs__method){DIAG("ListPending"), GS__RPC_UNARY, rd, on_pending, NULL, NULL, 0, 0,
                   /* missing_ranks may name every rank (5 bytes each as varints) */
                   (size_t)GS__MAX_WORLD * 6 + GS__DEFAULT_MAX_REQUEST};
  d->methods[M_STALLS] =
      (gs__method){DIAG("ListStalls"), GS__RPC_UNARY, rd, on_stalls, NULL, NULL, 0, 0, 0};
  d->methods[M_LOCALS] =
      (gs__method){DIAG("ListLocalVars"), GS__RPC_UNARY, rd, on_locals, NULL, NULL, 0, 0, 0};
  d->methods[M_EVENTS] =
      (gs__method){DIAG("WatchEvents"), GS__RPC_SERVER_STREAM, rd, on_watch, NULL,
                   on_watch_close,      WATCHER_QUEUE_BYTES,   0,  0};
  d->methods[M_METRICS] =
      (gs__method){DIAG("GetMetrics"), GS__RPC_UNARY, rd, on_metrics, NULL, NULL, 0, 0, 0};
  d->methods[M_TL_START] = (gs__method){
      DIAG("StartTimeline"), GS__RPC_UNARY, GS__AUTH_TOKEN, on_timeline_start, NULL, NULL, 0, 0, 0};
  d->methods[M_TL_STOP] = (gs__method){
      DIAG("StopTimeline"), GS__RPC_UNARY, GS__AUTH_TOKEN, on_timeline_stop, NULL, NULL, 0, 0, 0};
  d->methods[M_ABORT] =
      (gs__method){DIAG("AbortJob"), GS__RPC_UNARY, GS__AUTH_TOKEN, on_abort, NULL, NULL, 0, 0, 0};
  d->service = (gs__service){.name = "gradsync.v1.Diagnostics",
                             .methods = d->methods,
                             .n_methods = M_COUNT,
                             .svc = d,
                             .close = diagnostics_close};
  gs__coordinator_set_event_sink(co, on_event, d);
  *out = d;
  return GS__OK;
out_oom:
  gs__diagnostics_destroy(d);
  return GS__ERR_NO_MEMORY;
}

const gs__service *gs__diagnostics_service(gs__diagnostics *d) {
  return &d->service;
}

void gs__diagnostics_destroy(gs__diagnostics *d) {
  if (!d) return;
  gs__coordinator_set_event_sink(d->co, NULL, NULL);
  for (size_t i = 0; i < d->nsettings; i++) {
    free(d->settings[i].key);
    free(d->settings[i].value);
  }
  free(d->settings);
  for (size_t i = 0; i < RECENT_EVENTS; i++) gs__diag_event_free(&d->recent[i]);
  while (d->watchers) {
    watcher *w = d->watchers;
    d->watchers = w->next;
    free(w);
  }
  free(d);
}
