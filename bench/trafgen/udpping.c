// udpping: round-trip times of single UDP datagrams through the forwarder and back (the far end is
// `udpsink --echo`), one in flight at a time, paced; prints one JSON line with min/p50/p90/p99 in
// microseconds. Shows what a forwarder adds to one packet's latency when traffic is light.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "trafgen.h"

static void usage(void) {
  fprintf(stderr, "usage: udpping --dst ADDR --port N [--count N] [--interval-us US]\n");
  exit(2);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *dst = NULL;
  long port = -1, count = 500, interval_us = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--dst")) dst = argv[i + 1];
    else if (!strcmp(argv[i], "--port")) port = strtol(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--count")) count = strtol(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--interval-us")) interval_us = strtol(argv[i + 1], NULL, 10);
    else usage();
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  if (!dst || port < 1 || port > 65535 || count < 1 || count > 1000000 || interval_us < 0 ||
      inet_pton(AF_INET, dst, &addr.sin_addr) != 1)
    usage();
  addr.sin_port = htons((uint16_t)port);
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) {
    perror("socket");
    return 1;
  }
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint64_t *rtt = calloc((size_t)count, sizeof *rtt);
  long got = 0, lost = 0;
  for (long i = 0; i < count; i++) {
    uint8_t msg[32], reply[64];
    memset(msg, 0, sizeof msg);
    memcpy(msg, &i, sizeof i);
    uint64_t t0 = now_ns();
    if (sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&addr, sizeof addr) != (ssize_t)sizeof msg) {
      lost++;
      continue;
    }
    for (;;) {
      ssize_t n = recv(fd, reply, sizeof reply, 0);
      if (n < 0) {
        lost++;
        break;
      }
      if (n == (ssize_t)sizeof msg && memcmp(reply, &i, sizeof i) == 0) {
        rtt[got++] = now_ns() - t0;
        break;
      }
      // a late reply to an earlier probe: keep waiting for ours
    }
    if (interval_us > 0) usleep((useconds_t)interval_us);
  }
  qsort(rtt, (size_t)got, sizeof *rtt, cmp_u64);
#define PCT(p) (got ? (double)rtt[(size_t)((got - 1) * (p))] / 1e3 : -1.0)
  printf("{\"sent\":%ld,\"answered\":%ld,\"lost\":%ld,\"minUs\":%.1f,\"p50Us\":%.1f,\"p90Us\":%.1f,\"p99Us\":%.1f}\n",
         count, got, lost, PCT(0.0), PCT(0.5), PCT(0.9), PCT(0.99));
  free(rtt);
  close(fd);
  return 0;
}
