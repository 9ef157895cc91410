/* Rank identities of one job: the secret each rank got in its
 * JoinResponse, and whether its Session is open yet. The Session hello and
 * every KvSet/KvDelete must present the secret of the rank they claim, so
 * a process that can reach the port (even with the job token) cannot speak
 * for a rank another process joined as. Owned by the coordinator's
 * completion-queue thread. */
#ifndef GS_SERVER_IDENTITY_H
#define GS_SERVER_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

typedef struct gs__identities gs__identities;

gs__identities *gs__identities_create(void);
void gs__identities_destroy(gs__identities *t);
/* A fresh random secret for rank (replacing any earlier one), written to
 * secret. GS__OK, GS__ERR_NO_MEMORY or GS__ERR_INTERNAL (no randomness). */
int gs__identities_issue(gs__identities *t, int32_t rank, uint64_t now_ms,
                         uint8_t secret[GS__SECRET_BYTES]);
/* 1 when secret is rank's (constant-time comparison), else 0. */
int gs__identities_check(const gs__identities *t, int32_t rank,
                         const uint8_t secret[GS__SECRET_BYTES]);
/* The same with the secret as 64 hex digits (kv metadata); rank as text. */
int gs__identities_check_text(const gs__identities *t, const char *rank, const char *secret_hex,
                              int32_t *rank_out);
/* rank's Session opened: it no longer counts against the join timeout. */
void gs__identities_session_opened(gs__identities *t, int32_t rank);
/* Forgets rank (it left, was lost or released). */
void gs__identities_forget(gs__identities *t, int32_t rank);
/* A rank that joined before now_ms - timeout_ms and never opened its
 * Session, or -1. */
int32_t gs__identities_overdue(const gs__identities *t, uint64_t now_ms, uint64_t timeout_ms);

#endif
