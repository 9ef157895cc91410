/* --listen checks (see listen_addr.h). */
#include "listen_addr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "status.h"

int gs__listen_check(const char *listen, int *loopback, char *err, size_t errlen) {
  *loopback = 0;
  const char *colon = listen ? strrchr(listen, ':') : NULL;
  if (!colon || colon == listen) {
    snprintf(err, errlen, "--listen '%.300s': expected HOST:PORT (e.g. 0.0.0.0:50051)",
             listen ? listen : "");
    return GS__ERR_INVALID_ARG;
  }
  const char *p = colon + 1;
  size_t n = strlen(p);
  long port = 0;
  int digits = n > 0 && n <= 5;
  for (size_t i = 0; digits && i < n; i++) {
    if (p[i] < '0' || p[i] > '9') digits = 0;
    port = port * 10 + (p[i] - '0');
  }
  if (!digits || port > 65535) {
    snprintf(err, errlen,
             "--listen '%.300s': port '%.32s' is not a port number (expected 1..65535, or 0 for "
             "a free port)",
             listen, p);
    return GS__ERR_INVALID_ARG;
  }
  char host[256];
  size_t hl = (size_t)(colon - listen);
  const char *h = listen;
  if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') h++, hl -= 2;
  if (hl == 0 || hl >= sizeof host) {
    snprintf(err, errlen, "--listen '%.300s': the host part is %s", listen,
             hl ? "too long" : "empty (use 0.0.0.0 for every interface)");
    return GS__ERR_INVALID_ARG;
  }
  memcpy(host, h, hl);
  host[hl] = 0;
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, host, &a4) == 1)
    *loopback = (ntohl(a4.s_addr) >> 24) == 127;
  else if (inet_pton(AF_INET6, host, &a6) == 1)
    *loopback = IN6_IS_ADDR_LOOPBACK(&a6);
  else
    *loopback = strcmp(host, "localhost") == 0;
  return GS__OK;
}
