/* The local address the kernel would use toward a host: the address by
 * which that host reaches this machine. A UDP socket connect()ed there
 * (nothing is sent) is bound to it. Used by the ring (what to advertise)
 * and by gradsync-run (where the coordinator listens). Any thread. */
#ifndef GS_COMMON_NETADDR_H
#define GS_COMMON_NETADDR_H

#include <stddef.h>

/* Writes the IPv4 or IPv6 address (no brackets) toward host:port into out,
 * trying each address host resolves to. 0 on success; else -1 with
 * *gai_rc (a getaddrinfo error, 0 if resolution worked) or *sys_errno set. */
int gs__local_addr_toward(const char *host, const char *port, char *out, size_t cap, int *gai_rc,
                          int *sys_errno);

#endif
