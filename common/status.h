/* Status codes shared by the coordinator and the worker library.
 *
 * The numbers are the wire values carried in Abort and error responses and
 * are identical to the public gs_status enum in worker/include/gradsync.h
 * (worker/api.c checks this at compile time). Append only: never renumber
 * or reuse a value. */
#ifndef GS_COMMON_STATUS_H
#define GS_COMMON_STATUS_H

enum {
  GS__OK = 0,
  GS__ERR_INVALID_ARG = 1,
  GS__ERR_NO_MEMORY = 2,
  GS__ERR_TIMEOUT = 3,
  GS__ERR_MISMATCH = 4,
  GS__ERR_DUPLICATE_NAME = 5,
  GS__ERR_JOIN_REFUSED = 6,
  GS__ERR_JOIN_TIMEOUT = 7,
  GS__ERR_COORDINATOR_LOST = 8,
  GS__ERR_RANK_LOST = 9,
  GS__ERR_DATA_PLANE = 10,
  GS__ERR_ABORTED = 11,
  GS__ERR_SHUTDOWN = 12,
  GS__ERR_DEADLOCK = 13,
  GS__ERR_STALL = 14,
  GS__ERR_UNSUPPORTED = 15,
  GS__ERR_INTERNAL = 16,
  GS__ERR_UNAUTHENTICATED = 17,
  GS__ERR_ALREADY_JOINED = 18,
  GS__ERR_FORKED = 19,
  GS__STATUS_COUNT
};

/* Short constant name of a status ("GS_ERR_MISMATCH"); never NULL. */
const char *gs__status_name(int status);
/* One-line description of a status; never NULL. */
const char *gs__status_str(int status);

#endif
