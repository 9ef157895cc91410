/* The rendezvous key/value store of one job (ring peers' addresses, the
 * NCCL unique id). A plain table owned by the coordinator's
 * completion-queue thread; waiting readers are the transport's business. */
#ifndef GS_SERVER_KV_H
#define GS_SERVER_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct gs__kv_store gs__kv_store;

gs__kv_store *gs__kv_store_create(void);
void gs__kv_store_destroy(gs__kv_store *s);
/* Stores a copy of value under key (replacing). GS__OK or GS__ERR_NO_MEMORY. */
int gs__kv_store_set(gs__kv_store *s, const char *key, const uint8_t *value, size_t len);
/* The value stored under key (owned by the store, valid until the next
 * set/delete of that key), or NULL. */
const uint8_t *gs__kv_store_get(const gs__kv_store *s, const char *key, size_t *len);
/* 1 if key existed and was removed, else 0. */
int gs__kv_store_delete(gs__kv_store *s, const char *key);
size_t gs__kv_store_count(const gs__kv_store *s);

#endif
