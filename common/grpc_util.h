/* Small helpers over the gRPC C core shared by the coordinator and the
 * worker client: byte buffers <-> bytes, metadata lookup, deadlines. Any
 * thread. */
#ifndef GS_COMMON_GRPC_UTIL_H
#define GS_COMMON_GRPC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

/* A new byte buffer holding a copy of len bytes (caller destroys). */
grpc_byte_buffer *gs__bb_from_bytes(const uint8_t *data, size_t len);
/* Copies the buffer into one malloc'd array (*out; caller frees).
 * bb may be NULL (then *out = NULL, *len = 0). Returns 0 or -1. */
int gs__bb_to_bytes(grpc_byte_buffer *bb, uint8_t **out, size_t *len);
/* Finds key in md and copies its value (NUL-terminated, truncated) into out.
 * Returns 1 when found. */
int gs__md_get(const grpc_metadata_array *md, const char *key, char *out, size_t outlen);
/* Points *val and *len at metadata key's whole value (borrowed from md); 1 when
 * present. */
int gs__md_view(const grpc_metadata_array *md, const char *key, const char **val, size_t *len);
/* A monotonic deadline ms milliseconds from now (ms < 0: infinite). */
gpr_timespec gs__deadline_ms(int64_t ms);
/* A monotonic deadline us microseconds from now: us < 0 is infinite, and
 * us == 0 is gpr_inf_past, so a wait with it only takes what is ready (a
 * deadline of "now" sleeps about a millisecond: gRPC core keeps deadlines
 * in whole milliseconds, rounded up). */
gpr_timespec gs__deadline_us(int64_t us);
/* An integer channel argument (key is a GRPC_ARG_* constant). */
grpc_arg gs__int_arg(const char *key, int value);
/* Routes gRPC core's own log lines through gs__log (call before
 * grpc_init). */
void gs__grpc_route_logs(void);

#endif
