/* See netaddr.h. */
#include "netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

int gs__local_addr_toward(const char *host, const char *port, char *out, size_t cap, int *gai_rc,
                          int *sys_errno) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
  *gai_rc = getaddrinfo(host, port, &hints, &ai);
  *sys_errno = 0;
  if (*gai_rc != 0) return -1;
  for (struct addrinfo *p = ai; p; p = p->ai_next) {
    int fd = socket(p->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (fd < 0 || connect(fd, p->ai_addr, p->ai_addrlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
      *sys_errno = errno;
      if (fd >= 0) close(fd);
      continue;
    }
    close(fd);
    const void *a = ss.ss_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                        : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (inet_ntop(ss.ss_family, a, out, (socklen_t)cap)) {
      freeaddrinfo(ai);
      return 0;
    }
    *sys_errno = errno;
  }
  freeaddrinfo(ai);
  return -1;
}
