/* Checks gradsyncd's --listen address before gRPC sees it (gRPC would take
 * port 70000 modulo 65536) and tells whether it is loopback-only, which
 * decides whether a job token or TLS is required. Pure; any thread. */
#ifndef GS_SERVER_LISTEN_ADDR_H
#define GS_SERVER_LISTEN_ADDR_H

#include <stddef.h>

/* listen is "HOST:PORT" or "[V6]:PORT" with PORT 0 (a free port) or
 * 1..65535. GS__OK with *loopback = 1 when HOST is 127.0.0.0/8, ::1 or
 * localhost; else GS__ERR_INVALID_ARG with a message in err. */
int gs__listen_check(const char *listen, int *loopback, char *err, size_t errlen);

#endif
