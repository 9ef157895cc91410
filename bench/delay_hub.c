/* bench/delay_hub.c — an Ethernet hub in user space with a fixed delay per
 * link, for bench/netns_hosts.sh --delay-us: this machine's kernel has no
 * netem qdisc (tc: "Specified qdisc kind is unknown"), so the delay of a
 * "distant host" is made here instead.
 *
 *   delay-hub IFACE=US [IFACE=US ...]
 *
 * Runs in the hub namespace, on the hub's ends of the hosts' veth pairs
 * (not on a bridge). Every frame received on IFACE waits US microseconds
 * (its link, inbound), is switched by its destination MAC (learnt from the
 * source MACs; unknown or multicast: every other port), then waits the
 * output port's US (its link, outbound) and is sent there. So a frame from
 * host A to host B takes US(A) + US(B), one from a host to a port with 0
 * takes US(host), and each direction alike. Each link is a FIFO (a constant
 * delay keeps it ordered); at most QCAP frames wait per queue, more are
 * dropped (counted). Offloaded frames (checksum, GSO) pass whole with their
 * virtio-net header (PACKET_VNET_HDR). Stops on SIGTERM/SIGINT and prints
 * its counts to stderr. Needs CAP_NET_RAW; not a test.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXP 16
#define QCAP 4096
#define FRAME_MAX (65536 + 128)
#define MACS 256

struct frame {
  uint64_t due;
  int len;
  int src;
  unsigned char *buf; /* virtio_net_hdr, then the Ethernet frame */
};
struct queue {
  struct frame f[QCAP];
  unsigned head, n;
};

static struct queue inq[MAXP], outq[MAXP];
static int fds[MAXP], nport;
static uint64_t delay_ns[MAXP];
static const char *names[MAXP];
static unsigned char macs[MACS][ETH_ALEN];
static int macport[MACS], nmac;
static unsigned long long fwd, dropped, sendfail;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int push(struct queue *q, struct frame f) {
  if (q->n == QCAP) {
    free(f.buf);
    dropped++;
    return -1;
  }
  q->f[(q->head + q->n) % QCAP] = f;
  q->n++;
  return 0;
}

static struct frame pop(struct queue *q) {
  struct frame f = q->f[q->head];
  q->head = (q->head + 1) % QCAP;
  q->n--;
  return f;
}

static int port_of(const unsigned char *mac) {
  for (int i = 0; i < nmac; i++)
    if (memcmp(macs[i], mac, ETH_ALEN) == 0) return macport[i];
  return -1;
}

static void learn(const unsigned char *mac, int port) {
  if (mac[0] & 1) return;
  for (int i = 0; i < nmac; i++)
    if (memcmp(macs[i], mac, ETH_ALEN) == 0) {
      macport[i] = port;
      return;
    }
  if (nmac < MACS) {
    memcpy(macs[nmac], mac, ETH_ALEN);
    macport[nmac++] = port;
  }
}

/* the frame leaves its inbound link: to its output link(s) */
static void switch_frame(struct frame f) {
  const unsigned char *eth = f.buf + sizeof(struct virtio_net_hdr);
  learn(eth + ETH_ALEN, f.src);
  int dst = (eth[0] & 1) ? -1 : port_of(eth);
  if (dst == f.src) {
    free(f.buf);
    return;
  }
  for (int o = 0; o < nport; o++) {
    if (o == f.src || (dst >= 0 && o != dst)) continue;
    struct frame c = {f.due + delay_ns[o], f.len, f.src, malloc((size_t)f.len)};
    if (!c.buf) {
      dropped++;
      continue;
    }
    memcpy(c.buf, f.buf, (size_t)f.len);
    push(&outq[o], c);
  }
  free(f.buf);
}

static int open_port(const char *name) {
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (fd < 0) {
    perror("delay-hub: socket(AF_PACKET)");
    return -1;
  }
  int one = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0 ||
      setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0) {
    perror("delay-hub: setsockopt(PACKET_VNET_HDR/PACKET_IGNORE_OUTGOING)");
    close(fd);
    return -1;
  }
  struct sockaddr_ll sll = {0};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = (int)if_nametoindex(name);
  if (sll.sll_ifindex == 0 || bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) {
    fprintf(stderr, "delay-hub: interface %s: %s\n", name, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: delay-hub IFACE=US IFACE=US [...] (2 to %d ports)\n", MAXP);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    char *end = NULL;
    long us = eq ? strtol(eq + 1, &end, 10) : -1;
    if (nport == MAXP || !eq || eq == argv[i] || end == eq + 1 || *end || us < 0 || us > 10000000) {
      fprintf(stderr, "delay-hub: '%s' is not IFACE=US (a delay of 0 to 10000000 us; at most %d)\n",
              argv[i], MAXP);
      return 2;
    }
    *eq = 0;
    names[nport] = argv[i];
    delay_ns[nport] = (uint64_t)us * 1000u;
    if ((fds[nport] = open_port(argv[i])) < 0) return 1;
    nport++;
  }
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  struct pollfd pfd[MAXP];
  for (int i = 0; i < nport; i++) pfd[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
  fprintf(stderr, "delay-hub: %d ports up\n", nport);
  while (!stop) {
    uint64_t now = now_ns(), next = UINT64_MAX;
    for (int i = 0; i < nport; i++) {
      while (inq[i].n && inq[i].f[inq[i].head].due <= now) switch_frame(pop(&inq[i]));
    }
    for (int o = 0; o < nport; o++) {
      while (outq[o].n && outq[o].f[outq[o].head].due <= now) {
        struct frame f = pop(&outq[o]);
        if (send(fds[o], f.buf, (size_t)f.len, 0) < 0)
          sendfail++;
        else
          fwd++;
        free(f.buf);
      }
      if (outq[o].n && outq[o].f[outq[o].head].due < next) next = outq[o].f[outq[o].head].due;
    }
    for (int i = 0; i < nport; i++)
      if (inq[i].n && inq[i].f[inq[i].head].due < next) next = inq[i].f[inq[i].head].due;
    struct timespec ts, *tp = NULL;
    if (next != UINT64_MAX) {
      uint64_t w = next > now ? next - now : 0;
      ts.tv_sec = (time_t)(w / 1000000000u);
      ts.tv_nsec = (long)(w % 1000000000u);
      tp = &ts;
    }
    if (ppoll(pfd, (nfds_t)nport, tp, NULL) < 0) {
      if (errno == EINTR) continue;
      perror("delay-hub: ppoll");
      return 1;
    }
    for (int i = 0; i < nport; i++) {
      if (!(pfd[i].revents & POLLIN)) continue;
      for (;;) {
        unsigned char *buf = malloc(FRAME_MAX);
        if (!buf) break;
        ssize_t n = recv(fds[i], buf, FRAME_MAX, 0);
        if (n < (ssize_t)(sizeof(struct virtio_net_hdr) + ETH_HLEN)) {
          free(buf);
          if (n < 0 && errno != EAGAIN && errno != EINTR) perror("delay-hub: recv");
          break;
        }
        unsigned char *fit = realloc(buf, (size_t)n); /* shrink to the frame */
        push(&inq[i], (struct frame){now_ns() + delay_ns[i], (int)n, i, fit ? fit : buf});
      }
    }
  }
  fprintf(stderr, "delay-hub: %llu frames sent, %llu dropped (queue full), %llu send errors\n", fwd,
          dropped, sendfail);
  for (int i = 0; i < nport; i++) close(fds[i]);
  return 0;
}
