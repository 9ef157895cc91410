/* /metrics over HTTP (libmicrohttpd) for Prometheus scrapers. The HTTP
 * daemon has no thread of its own: the completion-queue thread runs it
 * from its tick (MHD_run, non-blocking), so the metrics are rendered on
 * the thread that owns the state. */
#ifndef GS_SERVER_METRICS_HTTP_H
#define GS_SERVER_METRICS_HTTP_H

#include <stddef.h>

#include "diagnostics.h"
#include "transport.h"

typedef struct gs__metrics_http gs__metrics_http;

/* Binds listen ("HOST:PORT", "[V6]:PORT"; port 0 = any). d is borrowed.
 * GS__OK or an error with a message in err. */
int gs__metrics_http_create(const char *listen, gs__diagnostics *d, gs__metrics_http **out,
                            char *err, size_t errlen);
int gs__metrics_http_port(const gs__metrics_http *m);
/* A service with no methods whose tick serves HTTP. */
const gs__service *gs__metrics_http_service(gs__metrics_http *m);
void gs__metrics_http_destroy(gs__metrics_http *m);

#endif
