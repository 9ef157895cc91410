/* Rendezvous key/value table (uthash). Owned by the coordinator's
 * completion-queue thread. */
#include "kv.h"

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
};

gs__kv_store *gs__kv_store_create(void) {
  return calloc(1, sizeof(gs__kv_store));
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

int gs__kv_store_set(gs__kv_store *s, const char *key, const uint8_t *value, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return GS__ERR_NO_MEMORY;
  if (len) memcpy(copy, value, len);
  kv_item *it = NULL;
  HASH_FIND_STR(s->items, key, it);
  if (it) {
    free(it->value);
    it->value = copy;
    it->len = len;
    return GS__OK;
  }
  it = calloc(1, sizeof *it);
  if (!it || !(it->key = strdup(key))) {
    free(it);
    free(copy);
    return GS__ERR_NO_MEMORY;
  }
  it->value = copy;
  it->len = len;
  HASH_ADD_KEYPTR(hh, s->items, it->key, strlen(it->key), it);
  return GS__OK;
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
  item_free(it);
  return 1;
}

size_t gs__kv_store_count(const gs__kv_store *s) {
  return HASH_COUNT(s->items);
}
