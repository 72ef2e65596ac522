// udpsink: the receiving end of dsrlb's benchmark. A UDP socket on ADDR:PORT drained on a fixed
// timer (recvmmsg, non-blocking) rather than woken per datagram, so its CPU cost depends on the
// rate alone and not on how the forwarder batches; counts datagrams carrying the run's magic.
// Stops by itself (fixed duration, or once traffic has stopped) and prints one JSON line.
// With --echo it is instead the far end of udpping: it blocks on the socket and sends every
// datagram back to its sender (from the address it was sent to: the VIP, as a DSR real does).

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "trafgen.h"

#define BATCH 256
#define SNAP_BYTES 64

static void usage(void) {
  fprintf(stderr,
          "usage: udpsink --bind ADDR --port N [--duration S] [--idle-stop-ms MS] [--poll-us US]\n"
          "               [--magic N] [--rcvbuf BYTES] [--cpu N] [--echo]\n");
  exit(2);
}

// Udp counters of this network namespace (/proc/net/snmp): [0] InErrors, [1] RcvbufErrors.
static void udp_errors(unsigned long long out[2]) {
  out[0] = out[1] = 0;
  FILE *f = fopen("/proc/net/snmp", "r");
  if (!f) return;
  char head[1024], vals[1024];
  while (fgets(head, sizeof head, f)) {
    if (strncmp(head, "Udp:", 4) != 0) continue;
    if (!fgets(vals, sizeof vals, f)) break;
    // Header and value lines have the same column order; find InErrors and RcvbufErrors by name.
    char *hs, *vs;
    char *h = strtok_r(head, " \n", &hs);
    char *v = strtok_r(vals, " \n", &vs);
    while (h && v) {
      if (!strcmp(h, "InErrors")) out[0] = strtoull(v, NULL, 10);
      if (!strcmp(h, "RcvbufErrors")) out[1] = strtoull(v, NULL, 10);
      h = strtok_r(NULL, " \n", &hs);
      v = strtok_r(NULL, " \n", &vs);
    }
    break;
  }
  fclose(f);
}

int main(int argc, char **argv) {
  const char *bind_s = NULL;
  long port = -1, idle_stop_ms = 0, poll_us = 1000, rcvbuf = 64 << 20, cpu = -1;
  double duration = 10;
  unsigned long magic = 0x64737262;
  int echo = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--echo")) {
      echo = 1;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--bind")) bind_s = v;
    else if (!strcmp(a, "--port")) port = strtol(v, NULL, 10);
    else if (!strcmp(a, "--duration")) duration = strtod(v, NULL);
    else if (!strcmp(a, "--idle-stop-ms")) idle_stop_ms = strtol(v, NULL, 10);
    else if (!strcmp(a, "--poll-us")) poll_us = strtol(v, NULL, 10);
    else if (!strcmp(a, "--magic")) magic = strtoul(v, NULL, 0);
    else if (!strcmp(a, "--rcvbuf")) rcvbuf = strtol(v, NULL, 10);
    else if (!strcmp(a, "--cpu")) cpu = strtol(v, NULL, 10);
    else usage();
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  if (!bind_s || port < 1 || port > 65535 || inet_pton(AF_INET, bind_s, &addr.sin_addr) != 1 || poll_us < 50 ||
      duration <= 0)
    usage();
  addr.sin_port = htons((uint16_t)port);
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
  }
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) {
    perror("socket");
    return 1;
  }
  int size = (int)rcvbuf;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    perror("bind");
    return 1;
  }
  if (echo) {
    struct timeval tv = {0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint64_t echoed = 0;
    const uint64_t stop_at = now_ns() + (uint64_t)(duration * 1e9);
    printf("{\"ready\":true}\n");
    fflush(stdout);
    while (!stop_requested && now_ns() < stop_at) {
      uint8_t buf[2048];
      struct sockaddr_in from;
      socklen_t fromlen = sizeof from;
      ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fromlen);
      if (n < 0) continue;
      if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fromlen) == n) echoed++;
    }
    printf("{\"echoed\":%llu}\n", (unsigned long long)echoed);
    close(fd);
    return 0;
  }
  static uint8_t bufs[BATCH][SNAP_BYTES];
  struct iovec iovs[BATCH];
  struct mmsghdr msgs[BATCH];
  memset(msgs, 0, sizeof msgs);
  for (int i = 0; i < BATCH; i++) {
    iovs[i].iov_base = bufs[i];
    iovs[i].iov_len = SNAP_BYTES;
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  unsigned long long err0[2], err1[2];
  udp_errors(err0);
  const uint8_t m0 = (uint8_t)(magic >> 24), m1 = (uint8_t)(magic >> 16), m2 = (uint8_t)(magic >> 8),
                m3 = (uint8_t)magic;
  uint64_t received = 0, foreign = 0, polls = 0;
  const uint64_t start = now_ns();
  const uint64_t end = start + (uint64_t)(duration * 1e9);
  uint64_t first = 0, last = 0;
  printf("{\"ready\":true}\n");
  fflush(stdout);
  uint64_t next_wake = start;
  for (;;) {
    uint64_t t = now_ns();
    if (t >= end || stop_requested) break;
    if (idle_stop_ms > 0 && last != 0 && t - last > (uint64_t)idle_stop_ms * 1000000ull) break;
    next_wake += (uint64_t)poll_us * 1000ull;
    if (next_wake < t) next_wake = t;
    struct timespec ts = {(time_t)(next_wake / 1000000000ull), (long)(next_wake % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    polls++;
    for (;;) {
      int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
      if (n <= 0) break;
      uint64_t got = now_ns();
      if (first == 0) first = got;
      last = got;
      for (int i = 0; i < n; i++) {
        const uint8_t *b = bufs[i];
        if (msgs[i].msg_len >= 4 && b[0] == m0 && b[1] == m1 && b[2] == m2 && b[3] == m3) received++;
        else foreign++;
      }
      if (n < BATCH) break;
    }
  }
  udp_errors(err1);
  double cpu_s = cpu_seconds();
  double span = first != 0 && last > first ? (double)(last - first) / 1e9 : 0;
  printf("{\"received\":%llu,\"foreign\":%llu,\"polls\":%llu,\"firstS\":%.6f,\"spanS\":%.6f,"
         "\"udpInErrors\":%llu,\"udpRcvbufErrors\":%llu,\"cpuS\":%.4f}\n",
         (unsigned long long)received, (unsigned long long)foreign, (unsigned long long)polls,
         first != 0 ? (double)(first - start) / 1e9 : -1.0, span, err1[0] - err0[0], err1[1] - err0[1], cpu_s);
  close(fd);
  return 0;
}
