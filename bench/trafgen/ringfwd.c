// ringfwd: the benchmark's C reference forwarder. It does what dsrlb's afpacket data path does
// (native/src/packet_ring.c plus src/io/afpacket-io.ts), minus the JavaScript and the engine: a
// TPACKET_V3 RX ring with dsrlb's geometry, read a block at a time after a blocking poll(); every
// IPv4 frame to the VIP gets the real's destination MAC and the interface's source MAC in place
// in the ring and goes back out in one sendmmsg per block from a second, ringless socket; then the
// block is released. No flow table, no Maglev, no service lookup: a lower bound for "AF_PACKET
// ring + sendmmsg, one core" on this topology, measured in the same run as dsrlb.
// Stops by itself after --duration (or on SIGTERM/SIGINT, after the current block) and prints one
// JSON line of counts and its CPU time.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "trafgen.h"

// TPACKET_V3 frames are variable-sized; the kernel still validates a nominal frame size (as dsrlb).
#define NOMINAL_FRAME_BYTES 2048u
// Messages per sendmmsg call: the kernel caps vlen at UIO_MAXIOV (1024). A 128 KiB block holds
// fewer 60-byte frames than that, so a block is one call.
#define SEND_CHUNK 1024
#define VNET_HDR_LEN ((uint32_t)sizeof(struct virtio_net_hdr))
#define ETH_HDR_LEN 14
#define IPV4_MIN_HDR_LEN 20

static const char *ifname = NULL;

static void usage(void) {
  fprintf(stderr,
          "usage: ringfwd --ifname IF --dst-mac MAC --vip A.B.C.D [--duration S]\n"
          "               [--block-size BYTES (131072)] [--block-count N (128)] [--retire-ms MS (1)]\n"
          "               [--no-vnet-hdr (then frames with partial checksums are dropped)]\n"
          "               [--tx-ring (send through a PACKET_TX_RING instead of sendmmsg)]\n"
          "               [--qdisc-bypass (PACKET_QDISC_BYPASS on the sending socket)]\n"
          "               [--reserve BYTES (PACKET_RESERVE headroom before each frame; dsrlb: 128)]\n");
  exit(2);
}

// A failed setup call: its name, the interface and errno, exit 2.
static void die(const char *call) {
  fprintf(stderr, "ringfwd: %s on %s: %s\n", call, ifname, strerror(errno));
  exit(2);
}

static struct mmsghdr msgs[SEND_CHUNK];
static struct iovec iov[SEND_CHUNK];
static uint64_t forwarded = 0, send_errors = 0;
static int last_send_errno = 0;

// One sendmmsg for the n frames collected in iov (more only after a partial send). What the kernel
// refuses is dropped and counted, as dsrlb does: a forwarder does not wait for a full queue.
static void send_frames(int tx_fd, unsigned n) {
  unsigned done = 0;
  while (done < n) {
    int r = sendmmsg(tx_fd, msgs + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += (unsigned)r;
      forwarded += (uint64_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    last_send_errno = r < 0 ? errno : 0;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
      send_errors += n - done; // refused for the moment: the rest of this send is lost
      return;
    }
    send_errors++; // a hard error on this frame: skip it, send the rest
    done++;
  }
}

// --tx-ring: a TPACKET_V2 TX ring on the TX socket. Frames are copied into free slots
// (TP_STATUS_AVAILABLE), marked TP_STATUS_SEND_REQUEST, and one send() per block hands them all
// over; the kernel sets a slot available again once its skb is freed. A full ring drops (counted
// in sendErrors), as a refused sendmmsg does.
#define TX_SLOT_BYTES 2048u
#define TX_SLOTS 4096u
static uint8_t *tx_ring = NULL;
static uint32_t tx_next = 0, tx_pending = 0, tx_data_at = 0;

static void tx_ring_setup(int tx_fd) {
  int v2 = TPACKET_V2;
  if (setsockopt(tx_fd, SOL_PACKET, PACKET_VERSION, &v2, sizeof v2) < 0) die("setsockopt(PACKET_VERSION) for tx");
  struct tpacket_req req = {.tp_block_size = TX_SLOT_BYTES * 32, .tp_block_nr = TX_SLOTS / 32,
                            .tp_frame_size = TX_SLOT_BYTES, .tp_frame_nr = TX_SLOTS};
  if (setsockopt(tx_fd, SOL_PACKET, PACKET_TX_RING, &req, sizeof req) < 0) die("setsockopt(PACKET_TX_RING)");
  tx_ring = mmap(NULL, (size_t)TX_SLOT_BYTES * TX_SLOTS, PROT_READ | PROT_WRITE, MAP_SHARED, tx_fd, 0);
  if (tx_ring == MAP_FAILED) die("mmap(PACKET_TX_RING)");
  // Without PACKET_TX_HAS_OFF the kernel reads a slot's data right after its tpacket2_hdr (and
  // the vnet header first, when the socket has one).
  tx_data_at = TPACKET_ALIGN(sizeof(struct tpacket2_hdr));
}

static void tx_ring_put(const uint8_t *data, uint32_t len) {
  struct tpacket2_hdr *h = (struct tpacket2_hdr *)(tx_ring + (size_t)tx_next * TX_SLOT_BYTES);
  if (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) != TP_STATUS_AVAILABLE || tx_data_at + len > TX_SLOT_BYTES) {
    send_errors++;
    return;
  }
  memcpy((uint8_t *)h + tx_data_at, data, len);
  h->tp_len = len;
  __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
  tx_next = tx_next + 1 == TX_SLOTS ? 0 : tx_next + 1;
  tx_pending++;
}

static void tx_ring_flush(int tx_fd) {
  if (tx_pending == 0) return;
  if (send(tx_fd, NULL, 0, MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != ENOBUFS) {
    last_send_errno = errno;
    send_errors += tx_pending;
  } else {
    forwarded += tx_pending;
  }
  tx_pending = 0;
}

int main(int argc, char **argv) {
  const char *dmac_s = NULL, *vip_s = NULL;
  long block_size = 128 << 10, block_count = 128, retire_ms = 1;
  double duration = 10;
  int vnet = 1, use_tx_ring = 0, qdisc_bypass = 0;
  long reserve = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--tx-ring")) {
      use_tx_ring = 1;
      continue;
    }
    if (!strcmp(a, "--qdisc-bypass")) {
      qdisc_bypass = 1;
      continue;
    }
    if (!strcmp(a, "--no-vnet-hdr")) {
      vnet = 0;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--ifname")) ifname = v;
    else if (!strcmp(a, "--dst-mac")) dmac_s = v;
    else if (!strcmp(a, "--vip")) vip_s = v;
    else if (!strcmp(a, "--duration")) duration = strtod(v, NULL);
    else if (!strcmp(a, "--block-size")) block_size = strtol(v, NULL, 10);
    else if (!strcmp(a, "--block-count")) block_count = strtol(v, NULL, 10);
    else if (!strcmp(a, "--retire-ms")) retire_ms = strtol(v, NULL, 10);
    else if (!strcmp(a, "--reserve")) reserve = strtol(v, NULL, 10);
    else usage();
  }
  uint8_t dmac[6], smac[6];
  struct in_addr vip;
  long page = sysconf(_SC_PAGESIZE);
  if (!ifname || strlen(ifname) >= IFNAMSIZ || !dmac_s || !vip_s || parse_mac(dmac_s, dmac) ||
      inet_pton(AF_INET, vip_s, &vip) != 1 || !(duration > 0))
    usage();
  if (block_size < (long)NOMINAL_FRAME_BYTES || block_size % page != 0 || block_count < 1 ||
      (uint64_t)block_size * (uint64_t)block_count > (1ull << 30) || retire_ms < 0 || reserve < 0 || reserve > 1024)
    usage();

  // sigaction without SA_RESTART; poll() is never restarted anyway, so a signal ends the wait.
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  // RX. Protocol 0: nothing is queued until bind() names the interface and ETH_P_ALL (as dsrlb).
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket(AF_PACKET)");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0) die("ioctl(SIOCGIFINDEX)");
  int ifindex = ifr.ifr_ifindex;
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0) die("ioctl(SIOCGIFHWADDR)");
  memcpy(smac, ifr.ifr_hwaddr.sa_data, 6);
  if (ioctl(fd, SIOCGIFMTU, &ifr) < 0) die("ioctl(SIOCGIFMTU)");
  const uint32_t max_frame = (uint32_t)ifr.ifr_mtu + 18; // Ethernet header and one VLAN tag

  int one = 1;
  if (vnet && setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) die("setsockopt(PACKET_VNET_HDR)");
  // dsrlb reserves headroom for in-place IPIP headers and VLAN tags; the bench measures without it
  // (5 alternating pairs with 128 bytes showed no difference in the forwarder's CPU).
  if (reserve > 0) {
    unsigned r = (unsigned)reserve;
    if (setsockopt(fd, SOL_PACKET, PACKET_RESERVE, &r, sizeof r) < 0) die("setsockopt(PACKET_RESERVE)");
  }
  int version = TPACKET_V3;
  if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version) < 0) die("setsockopt(PACKET_VERSION)");
  // Never re-capture the frames this process transmits.
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0)
    die("setsockopt(PACKET_IGNORE_OUTGOING)");
  struct tpacket_req3 req;
  memset(&req, 0, sizeof req);
  req.tp_block_size = (unsigned)block_size;
  req.tp_block_nr = (unsigned)block_count;
  req.tp_frame_size = NOMINAL_FRAME_BYTES;
  req.tp_frame_nr = (unsigned)(block_size / NOMINAL_FRAME_BYTES * block_count);
  req.tp_retire_blk_tov = (unsigned)retire_ms;
  if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) < 0) die("setsockopt(PACKET_RX_RING)");
  const size_t ring_bytes = (size_t)block_size * (size_t)block_count;
  uint8_t *ring = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ring == MAP_FAILED) die("mmap(PACKET_RX_RING)");
  struct sockaddr_ll sll;
  memset(&sll, 0, sizeof sll);
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = ifindex;
  if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) die("bind(AF_PACKET, ETH_P_ALL)");

  // TX: a ringless socket bound with protocol 0, so it receives nothing (dsrlb's tx_fd). With the
  // vnet header on both, each frame goes out with the header the kernel wrote before it.
  int tx_fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (tx_fd < 0) die("socket(AF_PACKET) for tx");
  if (vnet && setsockopt(tx_fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0)
    die("setsockopt(PACKET_VNET_HDR) for tx");
  sll.sll_protocol = 0;
  if (qdisc_bypass && setsockopt(tx_fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one) < 0)
    die("setsockopt(PACKET_QDISC_BYPASS)");
  if (use_tx_ring) tx_ring_setup(tx_fd);
  if (bind(tx_fd, (struct sockaddr *)&sll, sizeof sll) < 0) die("bind(AF_PACKET) for tx");

  memset(msgs, 0, sizeof msgs);
  for (int i = 0; i < SEND_CHUNK; i++) {
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  const uint32_t vnet_len = vnet ? VNET_HDR_LEN : 0;
  // Where the kernel puts sockaddr_ll after each frame header (sll_pkttype: PACKET_OTHERHOST etc.).
  const uint32_t sll_at = TPACKET_ALIGN(sizeof(struct tpacket3_hdr));
  const uint32_t frames_from = sll_at + (uint32_t)sizeof(struct sockaddr_ll);

  uint64_t ignored = 0, gso_dropped = 0, csum_dropped = 0, blocks = 0, polls = 0;
  uint32_t cur = 0;
  const uint64_t end = now_ns() + (uint64_t)(duration * 1e9);
  struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLERR, .revents = 0};
  printf("{\"ready\":true}\n");
  fflush(stdout);

  while (!stop_requested) {
    // Checked per block too: under overload a block is always ready and poll() never waits.
    const uint64_t t = now_ns();
    if (t >= end) break;
    uint8_t *blk_base = ring + (size_t)cur * (size_t)block_size;
    struct tpacket_block_desc *blk = (struct tpacket_block_desc *)blk_base;
    // Acquire: the frames of a block handed to user space are read after its status says so.
    uint32_t status = __atomic_load_n(&blk->hdr.bh1.block_status, __ATOMIC_ACQUIRE);
    if ((status & TP_STATUS_USER) == 0) {
      // Blocking wait (as dsrlb's libuv poll): the ring's retire timer or a full block wakes it.
      uint64_t left_ms = (end - t + 999999) / 1000000;
      int r = poll(&pfd, 1, left_ms > 1000000 ? 1000000 : (int)left_ms);
      polls++;
      if (r > 0 && (pfd.revents & POLLERR)) {
        // A socket error (ENETDOWN...) keeps poll() ready until read; clear it and go on.
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      continue;
    }
    const uint8_t *blk_end = blk_base + block_size;
    uint32_t count = blk->hdr.bh1.num_pkts;
    uint8_t *frame = blk_base + blk->hdr.bh1.offset_to_first_pkt;
    unsigned n = 0;
    for (uint32_t i = 0; i < count; i++) {
      if (frame + frames_from > blk_end) break; // inconsistent block: skip the rest
      const struct tpacket3_hdr *h = (const struct tpacket3_hdr *)frame;
      uint32_t next = h->tp_next_offset;
      uint8_t *mac = frame + h->tp_mac;
      uint32_t snaplen = h->tp_snaplen;
      const struct sockaddr_ll *from = (const struct sockaddr_ll *)(frame + sll_at);
      if (mac - vnet_len < frame + frames_from || mac + snaplen > blk_end) {
        ignored++;
      } else if (snaplen < h->tp_len || from->sll_pkttype == PACKET_OTHERHOST ||
                 (h->tp_status & TP_STATUS_VLAN_VALID)) {
        // Cut short, another host's frame (promiscuous mode), or a VLAN tag the kernel stripped
        // (dsrlb puts it back; the bench has no VLANs): never forwarded as is.
        ignored++;
      } else if (snaplen < ETH_HDR_LEN + IPV4_MIN_HDR_LEN || mac[12] != 0x08 || mac[13] != 0x00 ||
                 memcmp(mac + ETH_HDR_LEN + 16, &vip.s_addr, 4) != 0) {
        ignored++; // not IPv4 to the VIP (ARP, the LB's own traffic): the kernel has its copy
      } else if (vnet ? (((const struct virtio_net_hdr *)(mac - VNET_HDR_LEN))->gso_type & ~VIRTIO_NET_HDR_GSO_ECN) != 0
                      : snaplen > max_frame) {
        // A GSO super-frame (GRO on the LB's interface). dsrlb segments these; the bench's 60-byte
        // frames never are one, so the reference only counts and drops them.
        gso_dropped++;
      } else if (!vnet && (h->tp_status & TP_STATUS_CSUMNOTREADY)) {
        // A partial checksum (a kernel socket's frame, e.g. udpping's, on a veth with tx checksum
        // offload): only the vnet header's csum_start/csum_offset let the kernel complete it on
        // send, so without it the frame would leave with a wrong checksum. dsrlb completes these;
        // udpgen's frames carry full checksums, so the reference counts and drops them.
        csum_dropped++;
      } else {
        memcpy(mac, dmac, 6);
        memcpy(mac + 6, smac, 6);
        if (use_tx_ring) {
          tx_ring_put(mac - vnet_len, snaplen + vnet_len);
          goto next_frame;
        }
        iov[n].iov_base = mac - vnet_len;
        iov[n].iov_len = snaplen + vnet_len;
        n++;
      }
      if (n == SEND_CHUNK) {
        send_frames(tx_fd, n);
        n = 0;
      }
    next_frame:
      if (next == 0) break;
      frame += next;
    }
    if (n > 0) send_frames(tx_fd, n);
    if (use_tx_ring) tx_ring_flush(tx_fd);
    // Release: every rewrite and sendmmsg of the block happens before the kernel may refill it.
    __atomic_store_n(&blk->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    cur = cur + 1 == (uint32_t)block_count ? 0 : cur + 1;
    blocks++;
  }

  double cpu_s = cpu_seconds();
  printf("{\"forwarded\":%llu,\"ignored\":%llu,\"gsoDropped\":%llu,\"csumDropped\":%llu,\"sendErrors\":%llu,"
         "\"lastSendErrno\":%d,\"blocks\":%llu,\"polls\":%llu,\"cpuS\":%.4f}\n",
         (unsigned long long)forwarded, (unsigned long long)ignored, (unsigned long long)gso_dropped,
         (unsigned long long)csum_dropped, (unsigned long long)send_errors, last_send_errno,
         (unsigned long long)blocks, (unsigned long long)polls, cpu_s);
  fflush(stdout);
  munmap(ring, ring_bytes);
  close(tx_fd);
  close(fd);
  return 0;
}
