/* gRPC C core helpers (see grpc_util.h). */
#include "grpc_util.h"

#include <grpc/support/log.h>

#include "log.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

grpc_byte_buffer *gs__bb_from_bytes(const uint8_t *data, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)data, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

int gs__bb_to_bytes(grpc_byte_buffer *bb, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (!bb) return 0;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return -1;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  size_t n = GRPC_SLICE_LENGTH(s);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    grpc_slice_unref(s);
    return -1;
  }
  memcpy(buf, GRPC_SLICE_START_PTR(s), n);
  grpc_slice_unref(s);
  *out = buf;
  *len = n;
  return 0;
}

int gs__md_get(const grpc_metadata_array *md, const char *key, char *out, size_t outlen) {
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, key) == 0) {
      size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
      if (n >= outlen) n = outlen - 1;
      memcpy(out, GRPC_SLICE_START_PTR(md->metadata[i].value), n);
      out[n] = 0;
      return 1;
    }
  }
  return 0;
}

int gs__md_view(const grpc_metadata_array *md, const char *key, const char **val, size_t *len) {
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, key) == 0) {
      *val = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
      *len = GRPC_SLICE_LENGTH(md->metadata[i].value);
      return 1;
    }
  }
  return 0;
}

gpr_timespec gs__deadline_ms(int64_t ms) {
  if (ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

gpr_timespec gs__deadline_us(int64_t us) {
  if (us < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  if (us == 0) return gpr_inf_past(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros(us, GPR_TIMESPAN));
}

grpc_arg gs__int_arg(const char *key, int value) {
  grpc_arg a;
  memset(&a, 0, sizeof a);
  a.type = GRPC_ARG_INTEGER;
  a.key = (char *)key;
  a.value.integer = value;
  return a;
}

static void grpc_log_to_gs(gpr_log_func_args *a) {
  gs__log_level level = a->severity == GPR_LOG_SEVERITY_ERROR  ? GS__LOG_ERROR
                        : a->severity == GPR_LOG_SEVERITY_INFO ? GS__LOG_INFO
                                                               : GS__LOG_DEBUG;
  gs__log(level, "grpc: %s (%s:%d)", a->message, a->file, a->line);
}

void gs__grpc_route_logs(void) {
  gpr_set_log_function(grpc_log_to_gs);
}
