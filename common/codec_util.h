/* Helpers shared by the codec's files (codec.c, codec_diag.c) and nothing
 * else: the only header besides them that touches protobuf-c types. Any
 * thread. */
#ifndef GS_COMMON_CODEC_UTIL_H
#define GS_COMMON_CODEC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Writes the message into err and returns GS__ERR_INVALID_ARG. */
int gs__codec_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Packs m into a malloc'd buffer (*out, *len). GS__OK or GS__ERR_NO_MEMORY. */
int gs__codec_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len);
/* Copies a peer's string into a fixed buffer, refusing over-long ones. */
int gs__codec_copy_str(char *dst, size_t cap, const char *src, const char *field, char *err,
                       size_t errlen);

#endif
