/* gradsync.v1.Diagnostics (operator-facing): status, pending tensors,
 * stalls, local variables, a stream of events, metrics, and AbortJob.
 * Token rules: when the job has a token every method needs it, except the
 * read-only ones with open_reads (--diagnostics-open); AbortJob always
 * needs it. A job without a token has no authentication at all (gradsyncd
 * refuses that off loopback). Queue thread only. */
#ifndef GS_SERVER_DIAGNOSTICS_H
#define GS_SERVER_DIAGNOSTICS_H

#include <stddef.h>

#include "coordinator.h"
#include "diag_messages.h"
#include "transport.h"

typedef struct gs__diagnostics gs__diagnostics;

typedef struct gs__diagnostics_opts {
  int open_reads;                   /* --diagnostics-open */
  const gs__diag_setting *settings; /* effective settings (copied) */
  size_t nsettings;
  const char *version;
} gs__diagnostics_opts;

/* co is borrowed and must outlive the diagnostics; registers itself as the
 * coordinator's event sink. */
int gs__diagnostics_create(const gs__diagnostics_opts *o, gs__coordinator *co,
                           gs__diagnostics **out);
const gs__service *gs__diagnostics_service(gs__diagnostics *d);
/* The metrics in Prometheus text format (malloc'd; NULL when out of
 * memory). */
char *gs__diagnostics_metrics(gs__diagnostics *d);
void gs__diagnostics_destroy(gs__diagnostics *d);

#endif
