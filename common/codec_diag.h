/* The codec of the operator-facing services: gradsync.v1.Diagnostics,
 * grpc.health.v1.Health and server reflection (grpc.reflection.v1alpha and
 * v1, which are wire-identical). Like codec.h: encoders return a malloc'd
 * buffer the caller frees; decoders fill plain structs (free with their
 * gs__diag_*_free) and reject malformed or out-of-bounds input with
 * GS__ERR_INVALID_ARG and a message in err. Any thread. */
#ifndef GS_COMMON_CODEC_DIAG_H
#define GS_COMMON_CODEC_DIAG_H

#include <stddef.h>
#include <stdint.h>

#include "diag_messages.h"

/* ---- health ---- */
int gs__encode_health_request(const char *service, uint8_t **out, size_t *len);
/* service: at most cap-1 bytes. */
int gs__decode_health_request(const uint8_t *buf, size_t len, char *service, size_t cap, char *err,
                              size_t errlen);
int gs__encode_health_response(int status, uint8_t **out, size_t *len);
int gs__decode_health_response(const uint8_t *buf, size_t len, int *status, char *err,
                               size_t errlen);

/* ---- diagnostics ---- */
int gs__encode_diag_status(const gs__diag_status *m, uint8_t **out, size_t *len);
int gs__decode_diag_status(const uint8_t *buf, size_t len, gs__diag_status *m, char *err,
                           size_t errlen);
int gs__encode_pending_query(const gs__diag_pending_query *q, uint8_t **out, size_t *len);
int gs__decode_pending_query(const uint8_t *buf, size_t len, gs__diag_pending_query *q, char *err,
                             size_t errlen);
int gs__encode_pending_list(const gs__diag_pending_list *l, uint8_t **out, size_t *len);
int gs__decode_pending_list(const uint8_t *buf, size_t len, gs__diag_pending_list *l, char *err,
                            size_t errlen);
int gs__encode_diag_stalls(const gs__diag_stalls *s, uint8_t **out, size_t *len);
int gs__decode_diag_stalls(const uint8_t *buf, size_t len, gs__diag_stalls *s, char *err,
                           size_t errlen);
int gs__encode_diag_locals(const gs__diag_locals *l, uint8_t **out, size_t *len);
int gs__decode_diag_locals(const uint8_t *buf, size_t len, gs__diag_locals *l, char *err,
                           size_t errlen);
int gs__encode_diag_event(const gs__diag_event *e, uint8_t **out, size_t *len);
int gs__decode_diag_event(const uint8_t *buf, size_t len, gs__diag_event *e, char *err,
                          size_t errlen);

/* Messages with one string field (the Diagnostics requests and replies
 * that carry a text: metrics, timeline path, abort reason) and the empty
 * ones (len 0). */
typedef enum gs__diag_text_kind {
  GS__TXT_METRICS_RESP,     /* GetMetricsResponse.text */
  GS__TXT_TIMELINE_START,   /* StartTimelineRequest.path */
  GS__TXT_TIMELINE_STARTED, /* StartTimelineResponse.path */
  GS__TXT_ABORT_REQ,        /* AbortJobRequest.reason */
} gs__diag_text_kind;
int gs__encode_diag_text(gs__diag_text_kind kind, const char *text, uint8_t **out, size_t *len);
/* *text is malloc'd (caller frees); at most max bytes accepted. */
int gs__decode_diag_text(gs__diag_text_kind kind, const uint8_t *buf, size_t len, size_t max,
                         char **text, char *err, size_t errlen);
/* StopTimelineResponse. */
int gs__encode_timeline_stopped(const char *path, uint64_t events, uint8_t **out, size_t *len);
int gs__decode_timeline_stopped(const uint8_t *buf, size_t len, char **path, uint64_t *events,
                                char *err, size_t errlen);
/* Any empty request of the Diagnostics (and reply of AbortJob): checks that
 * buf parses as a message with no unknown trouble. */
int gs__decode_diag_empty(const uint8_t *buf, size_t len, char *err, size_t errlen);

/* ---- reflection ---- */
typedef struct gs__refl_index gs__refl_index;
/* Indexes a serialized FileDescriptorSet (borrowed: it must outlive the
 * index) for the services named (copied). */
int gs__refl_index_create(const uint8_t *set, size_t len, const char *const *services,
                          size_t nservices, gs__refl_index **out);
void gs__refl_index_destroy(gs__refl_index *ix);
/* Answers one ServerReflectionRequest with a ServerReflectionResponse
 * (never fails on bad input: that gets an error_response). */
int gs__refl_answer(const gs__refl_index *ix, const uint8_t *req, size_t len, uint8_t **out,
                    size_t *olen);
/* The file defining symbol, or NULL (tests). */
const char *gs__refl_file_of(const gs__refl_index *ix, const char *symbol);

#endif
