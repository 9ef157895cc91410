/* The rendezvous key/value store of one job (ring peers' addresses, the
 * NCCL unique id). A plain table owned by the coordinator's
 * completion-queue thread, bounded in keys and bytes; waiting readers and
 * who may write what are the transport's business (see gs__kv_key_owner). */
#ifndef GS_SERVER_KV_H
#define GS_SERVER_KV_H

#include <stddef.h>
#include <stdint.h>

#define GS__KV_DEFAULT_MAX_BYTES ((size_t)64 << 20) /* keys + values */
#define GS__KV_DEFAULT_MAX_KEYS ((size_t)65536)

typedef struct gs__kv_store gs__kv_store;

/* max_bytes bounds the keys' and values' bytes held together, max_keys the
 * number of keys (0 = the defaults above). NULL when out of memory. */
gs__kv_store *gs__kv_store_create(size_t max_bytes, size_t max_keys);
void gs__kv_store_destroy(gs__kv_store *s);
/* Stores a copy of value under key (replacing). GS__OK, or
 * GS__ERR_NO_MEMORY with a message in err when a limit would be passed
 * (the store is unchanged then) or memory ran out. */
int gs__kv_store_set(gs__kv_store *s, const char *key, const uint8_t *value, size_t len, char *err,
                     size_t errlen);
/* The value stored under key (owned by the store, valid until the next
 * set/delete of that key), or NULL. */
const uint8_t *gs__kv_store_get(const gs__kv_store *s, const char *key, size_t *len);
/* 1 if key existed and was removed, else 0. */
int gs__kv_store_delete(gs__kv_store *s, const char *key);
size_t gs__kv_store_count(const gs__kv_store *s);
size_t gs__kv_store_bytes(const gs__kv_store *s);

/* The rank that owns key, or -1 for keys any rank of the job may write.
 * A rank owns the keys that end in "addr/<rank>" (its ring address under
 * "epoch/<e>/ring/addr/<rank>"): only that rank's identity may set or
 * delete them. Rank 0 owns "<prefix>nccl/id" (the NCCL unique id, a join
 * credential no other rank may replace). */
int gs__kv_key_owner(const char *key);

#endif
