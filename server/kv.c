/* Rendezvous key/value table (uthash) with a bound on its keys and bytes,
 * and the rule of which rank owns which key. Owned by the coordinator's
 * completion-queue thread. */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "status.h"

typedef struct kv_item {
  char *key;
  uint8_t *value;
  size_t len;
  UT_hash_handle hh;
} kv_item;

struct gs__kv_store {
  kv_item *items;
  size_t bytes; /* keys + values held */
  size_t max_bytes, max_keys;
};

gs__kv_store *gs__kv_store_create(size_t max_bytes, size_t max_keys) {
  gs__kv_store *s = calloc(1, sizeof(gs__kv_store));
  if (!s) return NULL;
  s->max_bytes = max_bytes ? max_bytes : GS__KV_DEFAULT_MAX_BYTES;
  s->max_keys = max_keys ? max_keys : GS__KV_DEFAULT_MAX_KEYS;
  return s;
}

static void item_free(kv_item *it) {
  free(it->key);
  free(it->value);
  free(it);
}

void gs__kv_store_destroy(gs__kv_store *s) {
  if (!s) return;
  kv_item *it, *tmp;
  HASH_ITER(hh, s->items, it, tmp) {
    HASH_DEL(s->items, it);
    item_free(it);
  }
  free(s);
}

int gs__kv_store_set(gs__kv_store *s, const char *key, const uint8_t *value, size_t len, char *err,
                     size_t errlen) {
  kv_item *it = NULL;
  HASH_FIND_STR(s->items, key, it);
  size_t klen = strlen(key);
  /* values are bounded by the message size, so no sum here can wrap */
  size_t after = it ? s->bytes - it->len + len : s->bytes + klen + len;
  if (after > s->max_bytes) {
    snprintf(err, errlen,
             "kv store full: storing %zu bytes under '%.200s' would hold %zu bytes, over the "
             "limit of %zu (gradsyncd --kv-max-bytes)",
             len, key, after, s->max_bytes);
    return GS__ERR_NO_MEMORY;
  }
  if (!it && HASH_COUNT(s->items) >= s->max_keys) {
    snprintf(err, errlen,
             "kv store full: it holds %zu keys, the limit (gradsyncd --kv-max-keys); "
             "'%.200s' was not stored",
             s->max_keys, key);
    return GS__ERR_NO_MEMORY;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) goto out_nomem;
  if (len) memcpy(copy, value, len);
  if (it) {
    free(it->value);
    it->value = copy;
    it->len = len;
    s->bytes = after;
    return GS__OK;
  }
  it = calloc(1, sizeof *it);
  if (!it || !(it->key = strdup(key))) {
    free(it);
    free(copy);
    goto out_nomem;
  }
  it->value = copy;
  it->len = len;
  HASH_ADD_KEYPTR(hh, s->items, it->key, klen, it);
  s->bytes = after;
  return GS__OK;
out_nomem:
  snprintf(err, errlen, "coordinator out of memory storing '%.200s'", key);
  return GS__ERR_NO_MEMORY;
}

const uint8_t *gs__kv_store_get(const gs__kv_store *s, const char *key, size_t *len) {
  kv_item *it = NULL;
  HASH_FIND_STR(s->items, key, it);
  if (!it) return NULL;
  *len = it->len;
  return it->value;
}

int gs__kv_store_delete(gs__kv_store *s, const char *key) {
  kv_item *it = NULL;
  HASH_FIND_STR(s->items, key, it);
  if (!it) return 0;
  HASH_DEL(s->items, it);
  s->bytes -= strlen(it->key) + it->len;
  item_free(it);
  return 1;
}

size_t gs__kv_store_count(const gs__kv_store *s) {
  return HASH_COUNT(s->items);
}

size_t gs__kv_store_bytes(const gs__kv_store *s) {
  return s->bytes;
}

int gs__kv_key_owner(const char *key) {
  /* "<anything>/nccl/id" or "nccl/id": the NCCL unique id, made by rank 0 */
  size_t klen = strlen(key);
  if (!strcmp(key, "nccl/id") || (klen > 8 && !strcmp(key + klen - 8, "/nccl/id"))) return 0;
  /* "<anything>/addr/<rank>" or "addr/<rank>" with <rank> plain decimal */
  const char *slash = strrchr(key, '/');
  if (!slash || slash - key < 4 || memcmp(slash - 4, "addr", 4) != 0) return -1;
  if (slash - key > 4 && slash[-5] != '/') return -1;
  const char *d = slash + 1;
  size_t n = strlen(d);
  if (n == 0 || n > 5 || (n > 1 && d[0] == '0')) return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (d[i] < '0' || d[i] > '9') return -1;
    v = v * 10 + (d[i] - '0');
  }
  return v < 65536 ? (int)v : -1;
}
