// Whole Ethernet frames sent once from the control plane (the VIP announcements of
// src/control/vip-announcements.ts), apart from the packet loops and their rings: a packet socket
// opened for the call, each frame sent to the interface index with sendto, the socket closed.
// Syscalls only; what the frames hold is decided in TypeScript.
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <node_api.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

// packet_ring.c: an Error whose code is the errno name, errno negative, syscall set.
void dsrlb_throw_errno(napi_env env, const char* call, int err, const char* ifname);

/** Frames an announcement round may hold: far above any VIP count, low enough to bound the work. */
#define MAX_FRAMES 65536
/** An Ethernet header at least; at most a jumbo frame (the kernel refuses more than the MTU anyway). */
#define MIN_FRAME_BYTES ETH_HLEN
#define MAX_FRAME_BYTES 65535
/**
 * Asked for with SO_SNDBUFFORCE (CAP_NET_ADMIN; without it the default, ~200 KiB, stays): a frame
 * waiting in a qdisc counts against it, so a round of thousands of small frames fits without
 * EAGAIN. The kernel doubles the value.
 */
#define SEND_BUFFER_BYTES (2 << 20)

static int get_frame(napi_env env, napi_value frames, uint32_t i, uint8_t** data, size_t* length) {
  napi_value element;
  bool is_typed = false;
  napi_typedarray_type type;
  if (napi_get_element(env, frames, i, &element) != napi_ok ||
      napi_is_typedarray(env, element, &is_typed) != napi_ok || !is_typed ||
      napi_get_typedarray_info(env, element, &type, length, (void**)data, NULL, NULL) != napi_ok ||
      type != napi_uint8_array) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "frames must be an array of Uint8Array");
    return 0;
  }
  if (*length < MIN_FRAME_BYTES || *length > MAX_FRAME_BYTES) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "each frame must have 14 to 65535 bytes");
    return 0;
  }
  return 1;
}

// ---------------------------------------------------------------------------------------------
// sendFrames(ifindex, frames): sends each frame (destination MAC, source MAC, EtherType, payload;
// no FCS) out of interface `ifindex` as it is. The socket is SOCK_RAW with protocol 0, so it never
// receives anything, and non-blocking: a full send buffer or qdisc never stalls the main thread.
// Returns how many frames went, from the first: fewer than given means the kernel had no room
// (EAGAIN/ENOBUFS) for the next one. Any other refusal throws (ENETDOWN: the interface is down;
// ENXIO/ENODEV: no interface has that index any more).

static napi_value send_frames(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2], result;
  int32_t ifindex;
  bool is_array = false;
  uint32_t count = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 2 || napi_get_value_int32(env, argv[0], &ifindex) != napi_ok ||
      napi_is_array(env, argv[1], &is_array) != napi_ok || !is_array) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "sendFrames(ifindex, frames) takes a number and an array");
    return NULL;
  }
  if (ifindex <= 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "ifindex must be positive");
    return NULL;
  }
  napi_get_array_length(env, argv[1], &count);
  if (count > MAX_FRAMES) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "at most 65536 frames a call");
    return NULL;
  }
  // Every frame is checked before the first is sent: a bad argument sends nothing.
  for (uint32_t i = 0; i < count; i++) {
    uint8_t* data;
    size_t length;
    if (!get_frame(env, argv[1], i, &data, &length)) return NULL;
  }
  char where[32];
  snprintf(where, sizeof where, "ifindex %d", ifindex);

  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    dsrlb_throw_errno(env, "socket(AF_PACKET)", errno, where);
    return NULL;
  }
  int sndbuf = SEND_BUFFER_BYTES;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf);

  uint32_t sent = 0;
  for (; sent < count; sent++) {
    uint8_t* data;
    size_t length;
    get_frame(env, argv[1], sent, &data, &length);  // checked above
    struct sockaddr_ll to;
    memset(&to, 0, sizeof to);
    to.sll_family = AF_PACKET;
    to.sll_ifindex = ifindex;
    memcpy(&to.sll_protocol, data + 12, 2);  // the frame's EtherType, network order as sll_protocol wants
    to.sll_halen = ETH_ALEN;
    memcpy(to.sll_addr, data, ETH_ALEN);
    ssize_t r;
    do {
      r = sendto(fd, data, length, MSG_DONTWAIT, (struct sockaddr*)&to, sizeof to);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
      int err = errno;
      if (err == EAGAIN || err == ENOBUFS) break;
      close(fd);
      dsrlb_throw_errno(env, "sendto(AF_PACKET)", err, where);
      return NULL;
    }
  }
  close(fd);
  napi_create_uint32(env, sent, &result);
  return result;
}

// Called from packet_ring.c's module initialiser.
napi_status frame_send_init(napi_env env, napi_value exports) {
  napi_property_descriptor properties[] = {
      {"sendFrames", NULL, send_frames, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof properties / sizeof properties[0], properties);
}
