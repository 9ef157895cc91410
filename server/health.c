/* grpc.health.v1.Health: Check (unary) and Watch (server stream). One status
 * for every service the server offers: they live and die together in one
 * process. Watchers get the current status at once and every change after:
 * NOT_SERVING when shutdown begins; their streams stay open through the
 * drain and end (UNAVAILABLE) when the listener closes. Queue thread only. */
#include "health.h"

#include <stdlib.h>
#include <string.h>

#include "codec_diag.h"
#include "log.h"
#include "status.h"

#define MAX_SERVICE_NAME 256

typedef struct watcher {
  gs__call *call;
  int known;
  struct watcher *prev, *next;
} watcher;

struct gs__health {
  char **names;
  size_t n;
  int serving;
  int closed; /* the listener is closing: watches end at once */
  watcher *watchers;
  gs__method methods[2];
  gs__service service;
};

static int known(const gs__health *h, const char *name) {
  if (!name[0]) return 1;
  for (size_t i = 0; i < h->n; i++)
    if (!strcmp(h->names[i], name)) return 1;
  return 0;
}

static int status_of(const gs__health *h, int is_known) {
  if (!is_known) return GS__HEALTH_SERVICE_UNKNOWN;
  return h->serving ? GS__HEALTH_SERVING : GS__HEALTH_NOT_SERVING;
}

static int send_status(gs__call *c, int status) {
  uint8_t *buf;
  size_t len;
  if (gs__encode_health_response(status, &buf, &len) != GS__OK) return -1;
  int rc = gs__call_send(c, buf, len);
  free(buf);
  return rc;
}

static int read_name(gs__call *c, char *name, size_t cap, char *err, size_t errlen) {
  const uint8_t *buf;
  size_t len;
  gs__call_request(c, &buf, &len);
  return gs__decode_health_request(buf, len, name, cap, err, errlen);
}

static void on_check(void *arg, gs__call *c) {
  gs__health *h = arg;
  char name[MAX_SERVICE_NAME], err[512];
  if (read_name(c, name, sizeof name, err, sizeof err)) {
    gs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  if (!known(h, name)) {
    gs__call_fail(c, GRPC_STATUS_NOT_FOUND, "unknown service: gradsyncd does not offer it");
    return;
  }
  uint8_t *buf;
  size_t len;
  if (gs__encode_health_response(status_of(h, 1), &buf, &len) != GS__OK) {
    gs__call_fail(c, GRPC_STATUS_INTERNAL, "could not encode the reply");
    return;
  }
  gs__call_reply(c, buf, len);
  free(buf);
}

static void on_watch(void *arg, gs__call *c) {
  gs__health *h = arg;
  char name[MAX_SERVICE_NAME], err[512];
  if (read_name(c, name, sizeof name, err, sizeof err)) {
    gs__call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, err);
    return;
  }
  watcher *w = calloc(1, sizeof *w);
  if (!w) {
    gs__call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->call = c;
  w->known = known(h, name);
  w->next = h->watchers;
  if (h->watchers) h->watchers->prev = w;
  h->watchers = w;
  gs__call_set_data(c, w);
  send_status(c, status_of(h, w->known));
  if (h->closed) gs__call_finish(c, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
}

static void on_watch_close(void *arg, gs__call *c, int cancelled) {
  gs__health *h = arg;
  watcher *w = gs__call_data(c);
  if (!w) return;
  if (w->prev)
    w->prev->next = w->next;
  else
    h->watchers = w->next;
  if (w->next) w->next->prev = w->prev;
  free(w);
}

void gs__health_set_serving(gs__health *h, int serving) {
  if (h->serving == serving) return;
  h->serving = serving;
  for (watcher *w = h->watchers; w; w = w->next)
    if (w->known) send_status(w->call, status_of(h, 1));
}

/* Shutdown begins: NOT_SERVING for every name, told to every watcher;
 * the listener stays open for the drain, so probes see it too. */
static void health_shutdown(void *arg) {
  gs__health_set_serving(arg, 0);
}

static void health_close(void *arg) {
  gs__health *h = arg;
  h->closed = 1;
  for (watcher *w = h->watchers; w; w = w->next)
    gs__call_finish(w->call, GRPC_STATUS_UNAVAILABLE, "gradsyncd is shutting down");
}

int gs__health_create(const char *const *names, size_t n, gs__health **out) {
  *out = NULL;
  gs__health *h = calloc(1, sizeof *h);
  if (!h) return GS__ERR_NO_MEMORY;
  h->names = calloc(n + 1, sizeof *h->names);
  if (!h->names) goto out_oom;
  for (size_t i = 0; i < n; i++) {
    if (!(h->names[i] = strdup(names[i]))) goto out_oom;
    h->n++;
  }
  h->serving = 1;
  h->methods[0] = (gs__method){
      "/grpc.health.v1.Health/Check", GS__RPC_UNARY, GS__AUTH_OPEN, on_check, NULL, NULL, 0, 0, 0};
  h->methods[1] = (gs__method){"/grpc.health.v1.Health/Watch",
                               GS__RPC_SERVER_STREAM,
                               GS__AUTH_OPEN,
                               on_watch,
                               NULL,
                               on_watch_close,
                               64 << 10,
                               0,
                               0};
  h->service = (gs__service){.name = "grpc.health.v1.Health",
                             .methods = h->methods,
                             .n_methods = 2,
                             .svc = h,
                             .shutdown = health_shutdown,
                             .close = health_close};
  *out = h;
  return GS__OK;
out_oom:
  gs__health_destroy(h);
  return GS__ERR_NO_MEMORY;
}

const gs__service *gs__health_service(gs__health *h) {
  return &h->service;
}

void gs__health_destroy(gs__health *h) {
  if (!h) return;
  for (size_t i = 0; i < h->n; i++) free(h->names[i]);
  free(h->names);
  while (h->watchers) { /* only when the server never ran */
    watcher *w = h->watchers;
    h->watchers = w->next;
    free(w);
  }
  free(h);
}
