// udpgen: paced UDP traffic generator for dsrlb's benchmark. Sends prebuilt Ethernet/IPv4/UDP frames
// through an AF_PACKET socket (sendmmsg, qdisc bypass) at a fixed rate for a fixed time, N flows by
// source port (and source address past 50,000 flows), then prints one JSON line of counts.
//
// Pacing sleeps between ticks instead of spinning, so the generator's CPU time stays proportional
// to what it sends: the benchmark subtracts it from the machine's busy time.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
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

#define MAX_BATCH 256
#define PORTS_PER_SOURCE 50000
#define FIRST_SOURCE_PORT 10000

static void usage(void) {
  fprintf(stderr,
          "usage: udpgen --ifname IF --src-mac MAC --dst-mac MAC --src-ip IP --dst-ip IP --dst-port N\n"
          "              [--flows N] [--rate PPS (0 = as fast as possible)] [--duration S]\n"
          "              [--frame-bytes 60] [--batch 64] [--tick-us 500] [--magic N] [--cpu N]\n"
          "              [--vnet-hdr-len N (send with PACKET_VNET_HDR, hdr_len N; -1 = no header)]\n");
  exit(2);
}

// One's-complement sum of 16-bit big-endian words (RFC 1071), not yet folded.
static uint32_t sum16(const uint8_t *p, size_t len, uint32_t acc) {
  for (size_t i = 0; i + 1 < len; i += 2) acc += (uint32_t)((p[i] << 8) | p[i + 1]);
  if (len & 1) acc += (uint32_t)(p[len - 1] << 8);
  return acc;
}

static uint16_t fold(uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
  return (uint16_t)~acc;
}

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void build_frame(uint8_t *f, size_t len, const uint8_t *dmac, const uint8_t *smac, uint32_t sip,
                        uint32_t dip, uint16_t sport, uint16_t dport, uint32_t magic, uint32_t flow) {
  memset(f, 0, len);
  memcpy(f, dmac, 6);
  memcpy(f + 6, smac, 6);
  put16(f + 12, ETHERTYPE_IP);
  uint8_t *ip = f + 14;
  size_t ip_len = len - 14;
  ip[0] = 0x45;
  put16(ip + 2, (uint16_t)ip_len);
  put16(ip + 4, (uint16_t)flow);
  put16(ip + 6, 0x4000); // DF
  ip[8] = 64;
  ip[9] = IPPROTO_UDP;
  memcpy(ip + 12, &sip, 4); // already network order
  memcpy(ip + 16, &dip, 4);
  put16(ip + 10, fold(sum16(ip, 20, 0)));
  uint8_t *udp = ip + 20;
  size_t udp_len = ip_len - 20;
  put16(udp, sport);
  put16(udp + 2, dport);
  put16(udp + 4, (uint16_t)udp_len);
  uint8_t *payload = udp + 8;
  payload[0] = (uint8_t)(magic >> 24);
  payload[1] = (uint8_t)(magic >> 16);
  payload[2] = (uint8_t)(magic >> 8);
  payload[3] = (uint8_t)magic;
  payload[4] = (uint8_t)(flow >> 24);
  payload[5] = (uint8_t)(flow >> 16);
  payload[6] = (uint8_t)(flow >> 8);
  payload[7] = (uint8_t)flow;
  // UDP checksum over the pseudo header (RFC 768); 0 would also be legal for IPv4.
  uint8_t pseudo[12];
  memcpy(pseudo, ip + 12, 8);
  pseudo[8] = 0;
  pseudo[9] = IPPROTO_UDP;
  put16(pseudo + 10, (uint16_t)udp_len);
  uint16_t c = fold(sum16(udp, udp_len, sum16(pseudo, 12, 0)));
  put16(udp + 6, c == 0 ? 0xffff : c);
}

int main(int argc, char **argv) {
  const char *ifname = NULL, *smac_s = NULL, *dmac_s = NULL, *sip_s = NULL, *dip_s = NULL;
  long dport = -1, flows = 1, frame_bytes = 60, batch = 64, tick_us = 500, cpu = -1, vnet_hdr_len = -1;
  double rate = 0, duration = 1;
  unsigned long magic = 0x64737262; // "dsrb"
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--ifname")) ifname = v;
    else if (!strcmp(a, "--src-mac")) smac_s = v;
    else if (!strcmp(a, "--dst-mac")) dmac_s = v;
    else if (!strcmp(a, "--src-ip")) sip_s = v;
    else if (!strcmp(a, "--dst-ip")) dip_s = v;
    else if (!strcmp(a, "--dst-port")) dport = strtol(v, NULL, 10);
    else if (!strcmp(a, "--flows")) flows = strtol(v, NULL, 10);
    else if (!strcmp(a, "--rate")) rate = strtod(v, NULL);
    else if (!strcmp(a, "--duration")) duration = strtod(v, NULL);
    else if (!strcmp(a, "--frame-bytes")) frame_bytes = strtol(v, NULL, 10);
    else if (!strcmp(a, "--batch")) batch = strtol(v, NULL, 10);
    else if (!strcmp(a, "--tick-us")) tick_us = strtol(v, NULL, 10);
    else if (!strcmp(a, "--magic")) magic = strtoul(v, NULL, 0);
    else if (!strcmp(a, "--cpu")) cpu = strtol(v, NULL, 10);
    else if (!strcmp(a, "--vnet-hdr-len")) vnet_hdr_len = strtol(v, NULL, 10);
    else usage();
  }
  uint8_t smac[6], dmac[6];
  struct in_addr sip, dip;
  if (!ifname || !smac_s || !dmac_s || !sip_s || !dip_s || dport < 1 || dport > 65535) usage();
  if (parse_mac(smac_s, smac) || parse_mac(dmac_s, dmac)) usage();
  if (inet_pton(AF_INET, sip_s, &sip) != 1 || inet_pton(AF_INET, dip_s, &dip) != 1) usage();
  if (flows < 1 || flows > 10000000 || frame_bytes < 60 || frame_bytes > 1514 || batch < 1 || batch > MAX_BATCH ||
      tick_us < 10 || rate < 0 || duration <= 0)
    usage();

  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
  }
  // Wake close to the tick: the default 50 us slack would make bursts uneven.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  int fd = socket(AF_PACKET, SOCK_RAW, 0); // protocol 0: this socket never receives
  if (fd < 0) {
    perror("socket(AF_PACKET)");
    return 1;
  }
  struct sockaddr_ll sll;
  memset(&sll, 0, sizeof sll);
  sll.sll_family = AF_PACKET;
  sll.sll_ifindex = (int)if_nametoindex(ifname);
  if (sll.sll_ifindex == 0) {
    fprintf(stderr, "udpgen: no interface %s\n", ifname);
    return 1;
  }
  if (bind(fd, (struct sockaddr *)&sll, sizeof sll) != 0) {
    perror("bind");
    return 1;
  }
  int one = 1;
  setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
  // Optional: send as a forwarder with PACKET_VNET_HDR does, to measure what the header costs.
  struct virtio_net_hdr vnet;
  memset(&vnet, 0, sizeof vnet);
  if (vnet_hdr_len >= 0) {
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0) {
      perror("PACKET_VNET_HDR");
      return 1;
    }
    vnet.hdr_len = (uint16_t)vnet_hdr_len; // little-endian host: virtio16 is native
  }
  int sndbuf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf);

  size_t flen = (size_t)frame_bytes;
  uint8_t *frames = malloc(flen * (size_t)flows);
  if (!frames) {
    fprintf(stderr, "udpgen: out of memory\n");
    return 1;
  }
  uint32_t sip_host = ntohl(sip.s_addr);
  for (long i = 0; i < flows; i++) {
    uint32_t src = htonl(sip_host + (uint32_t)(i / PORTS_PER_SOURCE));
    uint16_t sport = (uint16_t)(FIRST_SOURCE_PORT + i % PORTS_PER_SOURCE);
    build_frame(frames + (size_t)i * flen, flen, dmac, smac, src, dip.s_addr, sport, (uint16_t)dport,
                (uint32_t)magic, (uint32_t)i);
  }

  struct mmsghdr msgs[MAX_BATCH];
  struct iovec iovs[MAX_BATCH][2];
  memset(msgs, 0, sizeof msgs);
  const int frame_iov = vnet_hdr_len >= 0 ? 1 : 0;
  for (int i = 0; i < MAX_BATCH; i++) {
    iovs[i][0].iov_base = &vnet;
    iovs[i][0].iov_len = sizeof vnet;
    iovs[i][frame_iov].iov_len = flen;
    msgs[i].msg_hdr.msg_iov = iovs[i];
    msgs[i].msg_hdr.msg_iovlen = (size_t)frame_iov + 1;
  }

  uint64_t attempted = 0, sent = 0, errors = 0, sleeps = 0;
  int last_errno = 0;
  long next_flow = 0;
  const uint64_t start = now_ns();
  const uint64_t end = start + (uint64_t)(duration * 1e9);
  const uint64_t tick_ns = (uint64_t)tick_us * 1000ull;
  // At most this many packets owed at once: after a stall, catch up by 20 ms worth, not in one burst.
  const uint64_t max_owed = rate > 0 ? (uint64_t)(rate * 0.02) + (uint64_t)batch : 0;
  uint64_t next_wake = start;
  uint64_t skipped = 0;
  for (;;) {
    uint64_t t = now_ns();
    if (t >= end || stop_requested) break;
    uint64_t want;
    if (rate > 0) {
      uint64_t due = (uint64_t)((double)(t - start) * rate / 1e9);
      if (due > attempted + max_owed) {
        skipped += due - attempted - max_owed;
        attempted = due - max_owed;
      }
      want = due > attempted ? due - attempted : 0;
      if (want == 0) {
        next_wake += tick_ns;
        if (next_wake < t) next_wake = t + tick_ns;
        if (next_wake > end) next_wake = end;
        struct timespec ts = {(time_t)(next_wake / 1000000000ull), (long)(next_wake % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        sleeps++;
        continue;
      }
      if (want > (uint64_t)batch) want = (uint64_t)batch;
    } else {
      want = (uint64_t)batch;
    }
    long flow = next_flow;
    for (uint64_t i = 0; i < want; i++) {
      iovs[i][frame_iov].iov_base = frames + (size_t)flow * flen;
      if (++flow == flows) flow = 0;
    }
    int n = sendmmsg(fd, msgs, (unsigned)want, 0);
    // Frames consumed: those sent, or on an error of the very first frame that one frame (counted
    // as lost, as a lossy NIC would); frames after a partial send go again in the next round.
    uint64_t used = n > 0 ? (uint64_t)n : 1;
    if (n <= 0) {
      last_errno = n < 0 ? errno : 0;
      errors++;
    } else {
      sent += (uint64_t)n;
    }
    attempted += used;
    next_flow = (long)(((uint64_t)next_flow + used) % (uint64_t)flows);
    if (n <= 0 && rate <= 0) sched_yield();
  }
  double elapsed = (double)(now_ns() - start) / 1e9;
  double cpu_s = cpu_seconds();
  printf("{\"sent\":%llu,\"sendErrors\":%llu,\"lastErrno\":%d,\"skipped\":%llu,\"sleeps\":%llu,"
         "\"durationS\":%.6f,\"targetPps\":%.0f,\"sentPps\":%.1f,\"flows\":%ld,\"frameBytes\":%ld,\"cpuS\":%.4f}\n",
         (unsigned long long)sent, (unsigned long long)errors, last_errno, (unsigned long long)skipped,
         (unsigned long long)sleeps, elapsed, rate, (double)sent / elapsed, flows, frame_bytes, cpu_s);
  free(frames);
  close(fd);
  return 0;
}
