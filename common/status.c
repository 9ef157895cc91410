/* Names and descriptions of status codes. Pure data; any thread. */
#include "status.h"

static const struct {
  const char *name, *text;
} k_status[GS__STATUS_COUNT] = {
    [GS__OK] = {"GS_OK", "success"},
    [GS__ERR_INVALID_ARG] = {"GS_ERR_INVALID_ARG", "invalid argument"},
    [GS__ERR_NO_MEMORY] = {"GS_ERR_NO_MEMORY", "out of memory"},
    [GS__ERR_TIMEOUT] = {"GS_ERR_TIMEOUT", "timed out"},
    [GS__ERR_MISMATCH] = {"GS_ERR_MISMATCH", "tensor differs across ranks"},
    [GS__ERR_DUPLICATE_NAME] = {"GS_ERR_DUPLICATE_NAME", "tensor name already in flight"},
    [GS__ERR_JOIN_REFUSED] = {"GS_ERR_JOIN_REFUSED", "coordinator refused to let this rank join"},
    [GS__ERR_JOIN_TIMEOUT] = {"GS_ERR_JOIN_TIMEOUT", "not every rank joined in time"},
    [GS__ERR_COORDINATOR_LOST] = {"GS_ERR_COORDINATOR_LOST", "connection to the coordinator lost"},
    [GS__ERR_RANK_LOST] = {"GS_ERR_RANK_LOST", "a rank of the job was lost"},
    [GS__ERR_DATA_PLANE] = {"GS_ERR_DATA_PLANE", "data-plane (backend) failure"},
    [GS__ERR_ABORTED] = {"GS_ERR_ABORTED", "job aborted"},
    [GS__ERR_SHUTDOWN] = {"GS_ERR_SHUTDOWN", "library is shutting down"},
    [GS__ERR_DEADLOCK] = {"GS_ERR_DEADLOCK", "deadlock detected"},
    [GS__ERR_STALL] = {"GS_ERR_STALL", "stalled past the shutdown time"},
    [GS__ERR_UNSUPPORTED] = {"GS_ERR_UNSUPPORTED", "not supported"},
    [GS__ERR_INTERNAL] = {"GS_ERR_INTERNAL", "internal error (a gradsync bug)"},
    [GS__ERR_UNAUTHENTICATED] = {"GS_ERR_UNAUTHENTICATED", "not authenticated (job token or TLS)"},
    [GS__ERR_ALREADY_JOINED] = {"GS_ERR_ALREADY_JOINED", "this rank already joined"},
    [GS__ERR_FORKED] = {"GS_ERR_FORKED", "context used in a forked child process"},
};

const char *gs__status_name(int status) {
  if (status < 0 || status >= GS__STATUS_COUNT || !k_status[status].name) return "GS_ERR_UNKNOWN";
  return k_status[status].name;
}

const char *gs__status_str(int status) {
  if (status < 0 || status >= GS__STATUS_COUNT || !k_status[status].text) return "unknown status";
  return k_status[status].text;
}
