/* grpc.health.v1.Health (Check and Watch) for gradsyncd: SERVING once
 * listening, NOT_SERVING once shutdown begins (or gs__health_set_serving(0)),
 * NOT_FOUND / SERVICE_UNKNOWN for names the server does not offer. Open
 * without a token (probes). Queue thread only. */
#ifndef GS_SERVER_HEALTH_H
#define GS_SERVER_HEALTH_H

#include <stddef.h>

#include "transport.h"

typedef struct gs__health gs__health;

/* names: the services the server offers (copied); "" (the server as a
 * whole) is always known. */
int gs__health_create(const char *const *names, size_t n, gs__health **out);
const gs__service *gs__health_service(gs__health *h);
/* Flips every name's status and tells the watchers. */
void gs__health_set_serving(gs__health *h, int serving);
void gs__health_destroy(gs__health *h);

#endif
