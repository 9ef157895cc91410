/* The protobuf codec: the only code that touches generated protobuf-c
 * structs. Encoders return a malloc'd buffer the caller frees; decoders fill
 * a caller-provided plain struct (free it with its gs__*_free) and reject
 * malformed or out-of-bounds input with GS__ERR_INVALID_ARG and a one-line
 * message in err naming the field and the value. Any thread. */
#ifndef GS_COMMON_CODEC_H
#define GS_COMMON_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

int gs__encode_join_request(const gs__join_request *m, uint8_t **out, size_t *len);
int gs__decode_join_request(const uint8_t *buf, size_t len, gs__join_request *m, char *err,
                            size_t errlen);
int gs__encode_join_response(const gs__join_response *m, uint8_t **out, size_t *len);
int gs__decode_join_response(const uint8_t *buf, size_t len, gs__join_response *m, char *err,
                             size_t errlen);
int gs__encode_rank_msg(const gs__rank_msg *m, uint8_t **out, size_t *len);
int gs__decode_rank_msg(const uint8_t *buf, size_t len, gs__rank_msg *m, char *err, size_t errlen);
int gs__encode_plan_msg(const gs__plan_msg *m, uint8_t **out, size_t *len);
int gs__decode_plan_msg(const uint8_t *buf, size_t len, gs__plan_msg *m, char *err, size_t errlen);

/* Key/value rendezvous messages. Strings and values are malloc'd. */
typedef struct gs__kv_msg {
  char *key;
  uint8_t *value;
  size_t value_len;
  uint32_t wait_ms;
  int found;   /* KvGetResponse */
  int deleted; /* KvDeleteResponse */
} gs__kv_msg;
void gs__kv_msg_free(gs__kv_msg *m);

typedef enum gs__kv_kind {
  GS__KV_SET_REQ,
  GS__KV_SET_RESP,
  GS__KV_GET_REQ,
  GS__KV_GET_RESP,
  GS__KV_DELETE_REQ,
  GS__KV_DELETE_RESP
} gs__kv_kind;
int gs__encode_kv(gs__kv_kind kind, const gs__kv_msg *m, uint8_t **out, size_t *len);
int gs__decode_kv(gs__kv_kind kind, const uint8_t *buf, size_t len, gs__kv_msg *m, char *err,
                  size_t errlen);

#define GS__MAX_KV_KEY 512
#define GS__MAX_KV_VALUE (1 << 20)

#endif
