/* Rank identities (see identity.h): a uthash table by rank. */
#include "identity.h"

#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "secret.h"
#include "status.h"

typedef struct ident {
  int32_t rank;
  uint8_t secret[GS__SECRET_BYTES];
  uint64_t joined_ms;
  int session;
  UT_hash_handle hh;
} ident;

struct gs__identities {
  ident *by_rank;
};

gs__identities *gs__identities_create(void) {
  return calloc(1, sizeof(gs__identities));
}

static void ident_free(ident *id) {
  memset(id->secret, 0, sizeof id->secret);
  free(id);
}

void gs__identities_destroy(gs__identities *t) {
  if (!t) return;
  ident *id, *tmp;
  HASH_ITER(hh, t->by_rank, id, tmp) {
    HASH_DEL(t->by_rank, id);
    ident_free(id);
  }
  free(t);
}

int gs__identities_issue(gs__identities *t, int32_t rank, uint64_t now_ms,
                         uint8_t secret[GS__SECRET_BYTES]) {
  ident *id = NULL;
  HASH_FIND_INT(t->by_rank, &rank, id);
  if (!id) {
    id = calloc(1, sizeof *id);
    if (!id) return GS__ERR_NO_MEMORY;
    id->rank = rank;
    HASH_ADD_INT(t->by_rank, rank, id);
  }
  if (gs__random_bytes(id->secret, sizeof id->secret) != GS__OK) {
    HASH_DEL(t->by_rank, id);
    ident_free(id);
    return GS__ERR_INTERNAL;
  }
  id->joined_ms = now_ms;
  id->session = 0;
  memcpy(secret, id->secret, sizeof id->secret);
  return GS__OK;
}

int gs__identities_check(const gs__identities *t, int32_t rank,
                         const uint8_t secret[GS__SECRET_BYTES]) {
  ident *id = NULL;
  HASH_FIND_INT(t->by_rank, &rank, id);
  return id && gs__bytes_equal(id->secret, secret, sizeof id->secret);
}

int gs__identities_check_text(const gs__identities *t, const char *rank, const char *secret_hex,
                              int32_t *rank_out) {
  char *end;
  long r = strtol(rank, &end, 10);
  uint8_t secret[GS__SECRET_BYTES];
  if (!*rank || *end || r < 0 || r >= GS__MAX_WORLD ||
      gs__unhex(secret_hex, strlen(secret_hex), secret, sizeof secret) != 0)
    return 0;
  *rank_out = (int32_t)r;
  return gs__identities_check(t, (int32_t)r, secret);
}

void gs__identities_session_opened(gs__identities *t, int32_t rank) {
  ident *id = NULL;
  HASH_FIND_INT(t->by_rank, &rank, id);
  if (id) id->session = 1;
}

void gs__identities_forget(gs__identities *t, int32_t rank) {
  ident *id = NULL;
  HASH_FIND_INT(t->by_rank, &rank, id);
  if (!id) return;
  HASH_DEL(t->by_rank, id);
  ident_free(id);
}

int32_t gs__identities_overdue(const gs__identities *t, uint64_t now_ms, uint64_t timeout_ms) {
  for (const ident *id = t->by_rank; id; id = id->hh.next)
    if (!id->session && now_ms - id->joined_ms > timeout_ms) return id->rank;
  return -1;
}
