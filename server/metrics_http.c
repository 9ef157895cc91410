/* /metrics over HTTP with libmicrohttpd in external-select mode: the
 * completion-queue thread calls MHD_run every tick, the request handler
 * renders the Diagnostics metrics there. Bounded: 16 connections, 10 s
 * idle timeout, 32 KiB per connection; GET /metrics only. */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "log.h"
#include "settings.h"
#include "status.h"

#define HTTP_TICK_MS 20

struct gs__metrics_http {
  struct MHD_Daemon *daemon;
  gs__diagnostics *diag;
  int port;
  gs__service service;
};

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *type,
                               char *body, int owned) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(body), body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!r) {
    if (owned) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **state) {
  gs__metrics_http *m = cls;
  static int first;
  if (!*state) { /* headers only so far: answer on the next call */
    *state = &first;
    return MHD_YES;
  }
  if (*upload_size) { /* no bodies: drop them */
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                   "only GET /metrics is served here\n", 0);
  if (strcmp(url, "/metrics") != 0)
    return respond(conn, MHD_HTTP_NOT_FOUND, "text/plain",
                   "not found: gradsyncd serves only /metrics here\n", 0);
  char *text = gs__diagnostics_metrics(m->diag);
  if (!text) return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "out of memory\n", 0);
  return respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, 1);
}

static void http_tick(void *arg, uint64_t now_ms) {
  gs__metrics_http *m = arg;
  (void)now_ms;
  MHD_run(m->daemon);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char line[512];
  (void)cls;
  vsnprintf(line, sizeof line, fmt, ap);
  line[strcspn(line, "\n")] = 0;
  GS_LOG_WARN("metrics http: %s", line);
}

int gs__metrics_http_create(const char *listen, gs__diagnostics *d, gs__metrics_http **out,
                            char *err, size_t errlen) {
  *out = NULL;
  char host[256];
  int port = -1;
  if (gs__split_host_port(listen, host, sizeof host, &port) != GS__OK || port < 0 || port > 65535) {
    snprintf(err, errlen, "--metrics-listen '%s': expected HOST:PORT or [IPv6]:PORT", listen);
    return GS__ERR_INVALID_ARG;
  }
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  unsigned flags = MHD_USE_ERROR_LOG;
  if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
    ((struct sockaddr_in *)&ss)->sin_family = AF_INET;
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
  } else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
    ((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
    ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    flags |= MHD_USE_IPv6;
  } else {
    snprintf(err, errlen, "--metrics-listen '%s': '%s' is not an IP address of this host", listen,
             host);
    return GS__ERR_INVALID_ARG;
  }
  gs__metrics_http *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return GS__ERR_NO_MEMORY;
  }
  m->diag = d;
  m->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)(32 << 10), MHD_OPTION_END);
  if (!m->daemon) {
    snprintf(err, errlen,
             "cannot serve metrics on %s (address in use or not an address of this host); pick "
             "another --metrics-listen",
             listen);
    free(m);
    return GS__ERR_INVALID_ARG;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_BIND_PORT);
  m->port = info ? info->port : port;
  m->service = (gs__service){.name = "metrics-http",
                             .methods = NULL,
                             .n_methods = 0,
                             .svc = m,
                             .tick = http_tick,
                             .tick_ms = HTTP_TICK_MS};
  *out = m;
  return GS__OK;
}

int gs__metrics_http_port(const gs__metrics_http *m) {
  return m->port;
}

const gs__service *gs__metrics_http_service(gs__metrics_http *m) {
  return &m->service;
}

void gs__metrics_http_destroy(gs__metrics_http *m) {
  if (!m) return;
  MHD_stop_daemon(m->daemon);
  free(m);
}
