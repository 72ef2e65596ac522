// Helpers shared by the bench's C tools (udpgen, udpsink, udpping, ringfwd): each is one .c file
// compiled on its own, so these are static inline.
#ifndef DSRLB_TRAFGEN_H
#define DSRLB_TRAFGEN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

// Set by SIGINT/SIGTERM; the tools finish their current step and print their counts.
static volatile sig_atomic_t stop_requested = 0;
static inline void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

// "aa:bb:cc:dd:ee:ff" -> 6 bytes; -1 if malformed (also with anything after the sixth byte).
static inline int parse_mac(const char *s, uint8_t *out) {
  unsigned v[6];
  char extra;
  if (sscanf(s, "%x:%x:%x:%x:%x:%x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &extra) != 6) return -1;
  for (int i = 0; i < 6; i++) {
    if (v[i] > 255) return -1;
    out[i] = (uint8_t)v[i];
  }
  return 0;
}

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// This process's CPU time so far (user + system), in seconds.
static inline double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

#endif
