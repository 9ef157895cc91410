/* gRPC server reflection (grpc.reflection.v1alpha and grpc.reflection.v1)
 * answered from the FileDescriptorSet embedded at build time, so grpcurl
 * list/describe/call work with no .proto files. Open without a token: it
 * reveals only the schema. Queue thread only. */
#ifndef GS_SERVER_REFLECTION_H
#define GS_SERVER_REFLECTION_H

#include <stddef.h>

#include "transport.h"

typedef struct gs__reflection gs__reflection;

/* names: the services to list (copied); the reflection services are added. */
int gs__reflection_create(const char *const *names, size_t n, gs__reflection **out, char *err,
                          size_t errlen);
/* The v1alpha and v1 services. */
const gs__service *gs__reflection_service_v1alpha(gs__reflection *r);
const gs__service *gs__reflection_service_v1(gs__reflection *r);
void gs__reflection_destroy(gs__reflection *r);

#endif
