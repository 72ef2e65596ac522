// dsrlb_native: a thin Node-API layer over an AF_PACKET socket with an RX ring mapped into
// JavaScript (TPACKET_V3 blocks, or TPACKET_V2 frames handed over one by one), batched sendmmsg from
// ring memory (through a second, ringless socket), and libuv readiness. Syscalls and lifetimes
// only; every packet decision is made in TypeScript (src/io/afpacket-io.ts).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // sched_setaffinity, CPU_SET
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <sched.h>
#include <node_api.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

// The TypeScript side walks blocks and frames with these offsets (src/io/afpacket-io.ts checks
// them against `layout` at load): a kernel header change must fail the build, not corrupt reads.
_Static_assert(offsetof(struct tpacket_block_desc, hdr.bh1.block_status) == 8, "block_status");
_Static_assert(offsetof(struct tpacket_block_desc, hdr.bh1.num_pkts) == 12, "num_pkts");
_Static_assert(offsetof(struct tpacket_block_desc, hdr.bh1.offset_to_first_pkt) == 16, "first_pkt");
_Static_assert(offsetof(struct tpacket_block_desc, hdr.bh1.seq_num) == 24, "seq_num");
_Static_assert(offsetof(struct tpacket3_hdr, tp_next_offset) == 0, "tp_next_offset");
_Static_assert(offsetof(struct tpacket3_hdr, tp_snaplen) == 12, "tp_snaplen");
_Static_assert(offsetof(struct tpacket3_hdr, tp_len) == 16, "tp_len");
_Static_assert(offsetof(struct tpacket3_hdr, tp_status) == 20, "tp_status");
_Static_assert(offsetof(struct tpacket3_hdr, tp_mac) == 24, "tp_mac");
_Static_assert(offsetof(struct tpacket3_hdr, tp_net) == 26, "tp_net");
_Static_assert(offsetof(struct tpacket3_hdr, hv1.tp_vlan_tci) == 32, "tp_vlan_tci");
_Static_assert(offsetof(struct tpacket3_hdr, hv1.tp_vlan_tpid) == 36, "tp_vlan_tpid");
_Static_assert(TPACKET_ALIGN(sizeof(struct tpacket3_hdr)) == 48, "sockaddr_ll position");
_Static_assert(TPACKET_ALIGN(sizeof(struct tpacket3_hdr)) + offsetof(struct sockaddr_ll, sll_pkttype) == 58,
               "sll_pkttype");
_Static_assert(TPACKET3_HDRLEN == 68, "TPACKET3_HDRLEN");
_Static_assert(offsetof(struct tpacket2_hdr, tp_status) == 0, "v2 tp_status");
_Static_assert(offsetof(struct tpacket2_hdr, tp_len) == 4, "v2 tp_len");
_Static_assert(offsetof(struct tpacket2_hdr, tp_snaplen) == 8, "v2 tp_snaplen");
_Static_assert(offsetof(struct tpacket2_hdr, tp_mac) == 12, "v2 tp_mac");
_Static_assert(offsetof(struct tpacket2_hdr, tp_vlan_tci) == 24, "v2 tp_vlan_tci");
_Static_assert(offsetof(struct tpacket2_hdr, tp_vlan_tpid) == 26, "v2 tp_vlan_tpid");
_Static_assert(TPACKET_ALIGN(sizeof(struct tpacket2_hdr)) + offsetof(struct sockaddr_ll, sll_pkttype) == 42,
               "v2 sll_pkttype");
_Static_assert(TPACKET2_HDRLEN == 52, "TPACKET2_HDRLEN");

#ifndef PACKET_FANOUT_FLAG_IGNORE_OUTGOING
#define PACKET_FANOUT_FLAG_IGNORE_OUTGOING 0x4000
#endif
#ifndef PACKET_FANOUT_FLAG_UNIQUEID
#define PACKET_FANOUT_FLAG_UNIQUEID 0x2000
#endif

// TPACKET_V3 frames are variable-sized; the kernel still validates a nominal frame size.
#define NOMINAL_FRAME_BYTES 2048u
// Messages per sendmmsg call (the kernel caps vlen at UIO_MAXIOV = 1024).
#define SEND_CHUNK 256
#define MAX_RING_BYTES (1ull << 30)
// V2 frames too large for a ring frame (GSO super-frames) come whole through the socket queue
// (PACKET_COPY_THRESH); this much receive buffer holds a few of them.
#define COPY_QUEUE_BYTES (4 << 20)
// Send buffer of the TX socket. A sent skb is charged to it until the driver frees it: at once on
// veth, but only at TX completion on a NIC, where one batch (up to a block's worth of frames, a
// few KiB of truesize each) would overflow the 208 KiB default and be refused with EAGAIN.
#define SEND_BUFFER_BYTES (8 << 20)


typedef struct packet_socket {
  int fd;     // RX: the ring, polled
  int tx_fd;  // TX: sendmmsg, never polled
  int send_buffer_bytes;  // SO_SNDBUF of tx_fd as the kernel reports it
  int version;  // TPACKET_V2 or TPACKET_V3
  uint32_t frame_size;  // V2
  uint32_t frame_count;  // V2
  int ifindex;
  int vnet_hdr;
  int closed;
  int unmapped;
  // Holders of this struct: the JS handle, the ring ArrayBuffer, an open uv_poll_t.
  int refs;
  uint8_t* ring;
  size_t ring_bytes;
  uint32_t block_size;
  uint32_t block_count;
  napi_env env;
  napi_ref ring_ref;  // strong until close(): close() detaches the ArrayBuffer before munmap
  napi_ref callback_ref;
  napi_async_context async_context;
  uv_poll_t* poll;
  napi_async_cleanup_hook_handle cleanup_handle;
  int cleanup_running;
  char ifname[IFNAMSIZ];
  struct mmsghdr msgs[SEND_CHUNK];
  struct iovec iov[SEND_CHUNK];
} packet_socket;

static const napi_type_tag socket_type_tag = {0x6473726c62414650ull, 0x7061636b65747633ull};

// ---------------------------------------------------------------------------------------------
// Errors: Error objects whose code is the errno name, like Node's own system errors.

static const char* errno_name(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  const char* name = strerrorname_np(err);
  if (name != NULL) return name;
#endif
  switch (err) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOENT: return "ENOENT";
    case ENODEV: return "ENODEV";
    case ENXIO: return "ENXIO";
    case EINVAL: return "EINVAL";
    case ENOMEM: return "ENOMEM";
    case EBUSY: return "EBUSY";
    case EBADF: return "EBADF";
    case ENETDOWN: return "ENETDOWN";
    case EMSGSIZE: return "EMSGSIZE";
    case ENOBUFS: return "ENOBUFS";
    case EAGAIN: return "EAGAIN";
    default: return "EUNKNOWN";
  }
}

// Shared with tun_device.c (declared there): one way to turn an errno into a JS Error.
void dsrlb_throw_errno(napi_env env, const char* call, int err, const char* ifname) {
  char message[256];
  const char* name = errno_name(err);
  if (ifname != NULL && ifname[0] != '\0') {
    snprintf(message, sizeof message, "%s on %s: %s (%s)", call, ifname, strerror(err), name);
  } else {
    snprintf(message, sizeof message, "%s: %s (%s)", call, strerror(err), name);
  }
  napi_value code, msg, error, errno_value, syscall;
  if (napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &code) != napi_ok) return;
  if (napi_create_string_utf8(env, message, NAPI_AUTO_LENGTH, &msg) != napi_ok) return;
  if (napi_create_error(env, code, msg, &error) != napi_ok) return;
  if (napi_create_int32(env, -err, &errno_value) == napi_ok) {
    napi_set_named_property(env, error, "errno", errno_value);
  }
  if (napi_create_string_utf8(env, call, NAPI_AUTO_LENGTH, &syscall) == napi_ok) {
    napi_set_named_property(env, error, "syscall", syscall);
  }
  napi_throw(env, error);
}

static void throw_type(napi_env env, const char* message) {
  napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", message);
}

static void throw_range(napi_env env, const char* message) {
  napi_throw_range_error(env, "ERR_OUT_OF_RANGE", message);
}

// ---------------------------------------------------------------------------------------------
// Argument helpers: each returns 0 and has thrown on failure.

static int get_args(napi_env env, napi_callback_info info, size_t want, napi_value* argv) {
  size_t argc = want;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return 0;
  for (size_t i = argc; i < want; i++) napi_get_undefined(env, &argv[i]);
  return 1;
}

// A number that is an integer in [min, max]; `range` ends the error message ("<name> must be ...").
static int get_integer(napi_env env, napi_value value, const char* name, double min, double max, const char* range,
                       double* out) {
  napi_valuetype type;
  char message[128];
  if (napi_typeof(env, value, &type) != napi_ok || type != napi_number) {
    snprintf(message, sizeof message, "%s must be a number", name);
    throw_type(env, message);
    return 0;
  }
  napi_get_value_double(env, value, out);
  // The range test comes first: it also rejects NaN, and it keeps the int64_t conversion defined.
  if (!(*out >= min && *out <= max) || *out != (double)(int64_t)*out) {
    snprintf(message, sizeof message, "%s must be %s", name, range);
    throw_range(env, message);
    return 0;
  }
  return 1;
}

static int get_uint32(napi_env env, napi_value value, const char* name, uint32_t* out) {
  double number;
  if (!get_integer(env, value, name, 0, 4294967295.0, "an integer in [0, 2^32)", &number)) return 0;
  *out = (uint32_t)number;
  return 1;
}

static int get_property(napi_env env, napi_value object, const char* name, napi_value* out) {
  if (napi_get_named_property(env, object, name, out) != napi_ok) {
    throw_type(env, "options must be an object");
    return 0;
  }
  return 1;
}

static int get_uint32_property(napi_env env, napi_value object, const char* name, uint32_t* out) {
  napi_value value;
  return get_property(env, object, name, &value) && get_uint32(env, value, name, out);
}

static int get_string(napi_env env, napi_value value, const char* name, char* out, size_t size) {
  napi_valuetype type;
  size_t length = 0;
  char message[128];
  if (napi_typeof(env, value, &type) != napi_ok || type != napi_string) {
    snprintf(message, sizeof message, "%s must be a string", name);
    throw_type(env, message);
    return 0;
  }
  napi_get_value_string_utf8(env, value, NULL, 0, &length);
  if (length == 0 || length >= size) {
    snprintf(message, sizeof message, "%s must have 1 to %zu bytes", name, size - 1);
    throw_range(env, message);
    return 0;
  }
  napi_get_value_string_utf8(env, value, out, size, &length);
  return 1;
}

static int get_int32_array(napi_env env, napi_value value, const char* name, int32_t** data, size_t* length) {
  bool is_typed = false;
  napi_typedarray_type type;
  char message[128];
  if (napi_is_typedarray(env, value, &is_typed) != napi_ok || !is_typed) {
    snprintf(message, sizeof message, "%s must be an Int32Array", name);
    throw_type(env, message);
    return 0;
  }
  napi_get_typedarray_info(env, value, &type, length, (void**)data, NULL, NULL);
  if (type != napi_int32_array) {
    snprintf(message, sizeof message, "%s must be an Int32Array", name);
    throw_type(env, message);
    return 0;
  }
  return 1;
}

static int get_uint8_array(napi_env env, napi_value value, const char* name, uint8_t** data, size_t* length) {
  bool is_typed = false;
  napi_typedarray_type type;
  char message[128];
  snprintf(message, sizeof message, "%s must be a Uint8Array", name);
  if (napi_is_typedarray(env, value, &is_typed) != napi_ok || !is_typed) {
    throw_type(env, message);
    return 0;
  }
  napi_get_typedarray_info(env, value, &type, length, (void**)data, NULL, NULL);
  if (type != napi_uint8_array) {
    throw_type(env, message);
    return 0;
  }
  return 1;
}

static packet_socket* get_socket(napi_env env, napi_value value, int require_open) {
  bool tagged = false;
  napi_valuetype type;
  void* data = NULL;
  if (napi_typeof(env, value, &type) != napi_ok || type != napi_object ||
      napi_check_object_type_tag(env, value, &socket_type_tag, &tagged) != napi_ok || !tagged ||
      napi_unwrap(env, value, &data) != napi_ok || data == NULL) {
    throw_type(env, "handle must be an object returned by openPacketSocket()");
    return NULL;
  }
  packet_socket* s = data;
  if (require_open && s->closed) {
    dsrlb_throw_errno(env, "packet socket (closed)", EBADF, s->ifname);
    return NULL;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Lifetime. The mapping must outlive every JS view of it: close() detaches the ArrayBuffer and
// unmaps at once; without close(), the last of {handle, ArrayBuffer} to be collected unmaps.

static void release_socket(packet_socket* s) {
  if (--s->refs > 0) return;
  if (!s->unmapped && s->ring != NULL) munmap(s->ring, s->ring_bytes);
  free(s);
}

static void on_poll_closed(uv_handle_t* handle) {
  packet_socket* s = handle->data;
  free(handle);
  if (s->cleanup_running && s->cleanup_handle != NULL) {
    napi_async_cleanup_hook_handle cleanup = s->cleanup_handle;
    s->cleanup_handle = NULL;
    napi_remove_async_cleanup_hook(cleanup);
  }
  release_socket(s);
}

// Stops readiness. `in_teardown` skips the JS-facing async-hooks bookkeeping.
static void stop_polling(packet_socket* s, int in_teardown) {
  if (s->poll != NULL) {
    uv_poll_stop(s->poll);
    uv_close((uv_handle_t*)s->poll, on_poll_closed);
    s->poll = NULL;
  }
  if (s->callback_ref != NULL) {
    napi_delete_reference(s->env, s->callback_ref);
    s->callback_ref = NULL;
  }
  if (s->async_context != NULL) {
    if (!in_teardown) napi_async_destroy(s->env, s->async_context);
    s->async_context = NULL;
  }
}

static void close_fd_and_poll(packet_socket* s, int in_teardown) {
  if (s->closed) return;
  s->closed = 1;
  stop_polling(s, in_teardown);
  close(s->tx_fd);
  close(s->fd);
  s->fd = -1;
  s->tx_fd = -1;
}

static void unregister_cleanup(packet_socket* s) {
  if (s->cleanup_handle != NULL && !s->cleanup_running) {
    napi_remove_async_cleanup_hook(s->cleanup_handle);
    s->cleanup_handle = NULL;
  }
}

// Environment teardown (process exit, worker termination): the uv handle must be closed before
// the loop is, hence the async hook that completes in the close callback.
static void on_env_cleanup(napi_async_cleanup_hook_handle handle, void* arg) {
  packet_socket* s = arg;
  s->cleanup_running = 1;
  int had_poll = s->poll != NULL;
  close_fd_and_poll(s, 1);
  if (!had_poll && s->cleanup_handle != NULL) {
    s->cleanup_handle = NULL;
    napi_remove_async_cleanup_hook(handle);
  }
}

static void on_handle_finalized(napi_env env, void* data, void* hint) {
  packet_socket* s = data;
  unregister_cleanup(s);
  close_fd_and_poll(s, 1);
  if (s->ring_ref != NULL) {
    napi_delete_reference(env, s->ring_ref);
    s->ring_ref = NULL;
  }
  release_socket(s);
}

static void on_ring_finalized(napi_env env, void* data, void* hint) {
  release_socket(hint);
}

// ---------------------------------------------------------------------------------------------
// Interface queries.

typedef struct interface_facts {
  int ifindex;
  int mtu;
  int hardware_type;
  uint8_t mac[6];
} interface_facts;

static int query_interface(int fd, const char* ifname, interface_facts* out, const char** failed_call) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0) { *failed_call = "ioctl(SIOCGIFINDEX)"; return errno; }
  out->ifindex = ifr.ifr_ifindex;
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0) { *failed_call = "ioctl(SIOCGIFHWADDR)"; return errno; }
  out->hardware_type = ifr.ifr_hwaddr.sa_family;
  memcpy(out->mac, ifr.ifr_hwaddr.sa_data, 6);
  if (ioctl(fd, SIOCGIFMTU, &ifr) < 0) { *failed_call = "ioctl(SIOCGIFMTU)"; return errno; }
  out->mtu = ifr.ifr_mtu;
  return 0;
}

static void set_int_property(napi_env env, napi_value object, const char* name, int64_t value) {
  napi_value v;
  napi_create_int64(env, value, &v);
  napi_set_named_property(env, object, name, v);
}

static void set_interface_properties(napi_env env, napi_value object, const interface_facts* facts) {
  napi_value mac;
  void* mac_data = NULL;
  set_int_property(env, object, "ifindex", facts->ifindex);
  set_int_property(env, object, "mtu", facts->mtu);
  set_int_property(env, object, "hardwareType", facts->hardware_type);
  napi_create_buffer_copy(env, 6, facts->mac, &mac_data, &mac);
  napi_set_named_property(env, object, "mac", mac);
}

static napi_value interface_info(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char ifname[IFNAMSIZ];
  if (!get_args(env, info, 1, argv) || !get_string(env, argv[0], "ifname", ifname, sizeof ifname)) return NULL;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    dsrlb_throw_errno(env, "socket(AF_INET)", errno, ifname);
    return NULL;
  }
  interface_facts facts;
  const char* failed_call = NULL;
  int err = query_interface(fd, ifname, &facts, &failed_call);
  close(fd);
  if (err != 0) {
    dsrlb_throw_errno(env, failed_call, err, ifname);
    return NULL;
  }
  napi_value result;
  napi_create_object(env, &result);
  set_interface_properties(env, result, &facts);
  return result;
}

// A bound socket takes every frame of the interface until it joins its fanout group; the sockets
// already in the group take the same frames, so each would be forwarded twice. The socket drops
// everything (a one-instruction filter: return 0 bytes) from before bind until it has joined.
static int set_drop_all_filter(int fd, int on) {
  int unused = 0; // SOL_SOCKET options take at least an int, even those that read none
  if (!on) return setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &unused, sizeof unused);
  struct sock_filter drop_all = BPF_STMT(BPF_RET | BPF_K, 0);
  struct sock_fprog program = { .len = 1, .filter = &drop_all };
  return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program);
}

static int join_fanout(int fd, uint32_t group_id, uint32_t type_flags) {
  int fanout = (int)(group_id | (type_flags << 16));
  return setsockopt(fd, SOL_PACKET, PACKET_FANOUT, &fanout, sizeof fanout);
}

// Puts the bound socket `fd` into a PACKET_FANOUT hash group: a new one (`make`), whose id the
// kernel picks among those no group of the namespace uses (PACKET_FANOUT_FLAG_UNIQUEID, Linux >=
// 4.12), or the existing group `group_id`. Group ids are shared by every program of the network
// namespace: a group made under an id of our own choosing would have been joined silently when
// another program had one under it. Returns 0 and the group's id in *joined, or an errno.
static int enter_fanout(int fd, int make, uint32_t group_id, uint32_t* joined) {
  // A fanout group delivers through its own hook, which ignores the socket's
  // PACKET_IGNORE_OUTGOING: the group needs the flag too (Linux >= 6.2). Older kernels refuse
  // it with EINVAL; there the TypeScript side still skips PACKET_OUTGOING frames. The group keeps
  // the flags it was made with, and a member must give the same ones: the fallback is the same
  // for the loop that makes it and those that join.
  // No PACKET_FANOUT_FLAG_DEFRAG: it reassembles IPv4 datagrams before fanout, and a reassembled
  // datagram larger than the MTU cannot be sent on to an L2 real (EMSGSIZE). The skb hash of
  // every fragment, first or later, covers addresses and protocol only, so the fragments of a
  // datagram reach one loop, whose fragment table sends them after their first fragment.
  uint32_t type_flags = PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
  // UNIQUEID wants id 0 and is not kept: the members that join later name the id without it.
  if (make) {
    type_flags |= PACKET_FANOUT_FLAG_UNIQUEID;
    group_id = 0;
  }
  int r = join_fanout(fd, group_id, type_flags);
  if (r < 0 && errno == EINVAL) r = join_fanout(fd, group_id, type_flags & ~PACKET_FANOUT_FLAG_IGNORE_OUTGOING);
  if (r < 0) return errno;
  // id | type << 16 | flags << 24 of the group the socket is in now.
  uint32_t fanout = 0;
  socklen_t length = sizeof fanout;
  if (getsockopt(fd, SOL_PACKET, PACKET_FANOUT, &fanout, &length) < 0) return errno;
  // A kernel before 4.12 takes UNIQUEID for an unknown flag, keeps it, and puts the socket in
  // group 0, which may be another program's.
  if (make && ((fanout >> 24) & (PACKET_FANOUT_FLAG_UNIQUEID >> 8)) != 0) return EOPNOTSUPP;
  *joined = fanout & 0xffff;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// openPacketSocket({ ifname, blockSizeBytes, blockCount, retireTimeoutMs, reserveBytes, vnetHdr,
//                    fanoutGroupId | fanoutNewGroup, ringVersion = 3, frameSizeBytes (V2) })

static int get_optional_uint32(napi_env env, napi_value object, const char* name, uint32_t fallback, uint32_t* out) {
  napi_value value;
  napi_valuetype type;
  if (!get_property(env, object, name, &value)) return 0;
  if (napi_typeof(env, value, &type) == napi_ok && type == napi_undefined) {
    *out = fallback;
    return 1;
  }
  return get_uint32(env, value, name, out);
}

// A socket kept open across a packet loop's restart (keptFd): its ring must be what this open
// asks for, and it must still be bound to the interface `ifindex` names now (one deleted and made
// again has a new index, and the kept socket would receive nothing). Its PACKET_FANOUT group is
// not read back: the kernel reports group 0 of type hash as 0, as it does no group at all.
static int check_kept_socket(packet_socket* s, bool vnet, uint32_t reserve, int ifindex, const char** call) {
  int value = 0;
  socklen_t length = sizeof value;
  *call = "getsockopt(SO_DOMAIN)";
  if (getsockopt(s->fd, SOL_SOCKET, SO_DOMAIN, &value, &length) < 0) return errno;
  if (value != AF_PACKET) return ENOTSOCK;
  *call = "getsockopt(PACKET_VERSION)";
  length = sizeof value;
  if (getsockopt(s->fd, SOL_PACKET, PACKET_VERSION, &value, &length) < 0) return errno;
  if (value != s->version) return EINVAL;
  *call = "getsockopt(PACKET_VNET_HDR)";
  length = sizeof value;
  if (getsockopt(s->fd, SOL_PACKET, PACKET_VNET_HDR, &value, &length) < 0) return errno;
  if ((value != 0) != vnet) return EINVAL;
  *call = "getsockopt(PACKET_RESERVE)";
  length = sizeof value;
  if (getsockopt(s->fd, SOL_PACKET, PACKET_RESERVE, &value, &length) < 0) return errno;
  if ((uint32_t)value != reserve) return EINVAL;
  struct sockaddr_ll bound;
  socklen_t bound_length = sizeof bound;
  *call = "getsockname(AF_PACKET)";
  if (getsockname(s->fd, (struct sockaddr*)&bound, &bound_length) < 0) return errno;
  if (bound.sll_ifindex != ifindex) return ENODEV;
  return 0;
}

static napi_value open_packet_socket(napi_env env, napi_callback_info info) {
  napi_value argv[1], value;
  char ifname[IFNAMSIZ];
  uint32_t block_size, block_count, retire_ms, reserve, fanout_id = 0;
  uint32_t version, frame_size;
  bool vnet = false;
  // A fanout group to join (fanoutGroupId) or to make (fanoutNewGroup), or neither.
  bool fanout_join = false, fanout_make = false;
  // A socket with its ring already set up, kept open by another thread (keptFd), to take over.
  int kept_fd = -1;
  napi_valuetype type;

  if (!get_args(env, info, 1, argv)) return NULL;
  if (napi_typeof(env, argv[0], &type) != napi_ok || type != napi_object) {
    throw_type(env, "options must be an object");
    return NULL;
  }
  if (!get_property(env, argv[0], "ifname", &value) || !get_string(env, value, "ifname", ifname, sizeof ifname) ||
      !get_uint32_property(env, argv[0], "blockSizeBytes", &block_size) ||
      !get_uint32_property(env, argv[0], "blockCount", &block_count) ||
      !get_uint32_property(env, argv[0], "retireTimeoutMs", &retire_ms) ||
      !get_uint32_property(env, argv[0], "reserveBytes", &reserve) ||
      !get_optional_uint32(env, argv[0], "ringVersion", 3, &version) ||
      !get_optional_uint32(env, argv[0], "frameSizeBytes", NOMINAL_FRAME_BYTES, &frame_size)) {
    return NULL;
  }
  if (version != 2 && version != 3) {
    throw_range(env, "ringVersion must be 2 or 3");
    return NULL;
  }
  if (version == 2 && (frame_size < NOMINAL_FRAME_BYTES || (frame_size & (frame_size - 1)) != 0 ||
                       block_size % frame_size != 0)) {
    throw_range(env, "frameSizeBytes must be a power of two >= 2048 that divides blockSizeBytes");
    return NULL;
  }
  if (!get_property(env, argv[0], "vnetHdr", &value)) return NULL;
  if (napi_get_value_bool(env, value, &vnet) != napi_ok) {
    throw_type(env, "vnetHdr must be a boolean");
    return NULL;
  }
  if (!get_property(env, argv[0], "fanoutGroupId", &value)) return NULL;
  if (napi_typeof(env, value, &type) == napi_ok && type != napi_undefined) {
    if (!get_uint32(env, value, "fanoutGroupId", &fanout_id)) return NULL;
    fanout_join = true;
  }
  if (!get_property(env, argv[0], "fanoutNewGroup", &value)) return NULL;
  if (napi_typeof(env, value, &type) == napi_ok && type != napi_undefined &&
      napi_get_value_bool(env, value, &fanout_make) != napi_ok) {
    throw_type(env, "fanoutNewGroup must be a boolean");
    return NULL;
  }
  if (fanout_join && fanout_make) {
    throw_type(env, "fanoutGroupId (join a group) and fanoutNewGroup (make one) exclude each other");
    return NULL;
  }

  long page = sysconf(_SC_PAGESIZE);
  if (block_size < NOMINAL_FRAME_BYTES || block_size % (uint32_t)page != 0) {
    throw_range(env, "blockSizeBytes must be a multiple of the page size and at least 2048");
    return NULL;
  }
  if (block_count == 0 || (uint64_t)block_size * block_count > MAX_RING_BYTES) {
    throw_range(env, "blockCount must be at least 1 and the ring at most 1 GiB");
    return NULL;
  }
  if (reserve > 1024) {
    throw_range(env, "reserveBytes must be at most 1024");
    return NULL;
  }
  if (fanout_id > 0xffff) {
    throw_range(env, "fanoutGroupId must be in [0, 65535]");
    return NULL;
  }

  if (!get_property(env, argv[0], "keptFd", &value)) return NULL;
  if (napi_typeof(env, value, &type) == napi_ok && type != napi_undefined) {
    uint32_t fd_value;
    if (!get_uint32(env, value, "keptFd", &fd_value)) return NULL;
    if (fd_value > INT32_MAX) {
      throw_range(env, "keptFd must be a file descriptor");
      return NULL;
    }
    if (fanout_join || fanout_make) {
      throw_type(env, "keptFd excludes fanoutGroupId and fanoutNewGroup (the kept socket is in its group already)");
      return NULL;
    }
    kept_fd = (int)fd_value;
  }
  packet_socket* s = calloc(1, sizeof *s);
  if (s == NULL) {
    dsrlb_throw_errno(env, "calloc", ENOMEM, ifname);
    return NULL;
  }
  s->fd = -1;
  s->tx_fd = -1;
  s->env = env;
  s->vnet_hdr = vnet;
  s->version = version == 2 ? TPACKET_V2 : TPACKET_V3;
  s->frame_size = version == 2 ? frame_size : NOMINAL_FRAME_BYTES;
  s->frame_count = (block_size / s->frame_size) * block_count;
  s->block_size = block_size;
  s->block_count = block_count;
  s->ring_bytes = (size_t)block_size * block_count;
  memcpy(s->ifname, ifname, sizeof ifname);

  const char* call = NULL;
  int err = 0;
  interface_facts facts;
  int one = 1;
  bool fanout = fanout_join || fanout_make;
  uint32_t fanout_group = 0;
  struct sockaddr_ll sll;
  memset(&sll, 0, sizeof sll);
  if (kept_fd >= 0) {
    // A copy of our own: the caller's descriptor stays the caller's (it closes it when it is done
    // with the socket, whatever becomes of this handle), so no number is ever closed twice.
    s->fd = fcntl(kept_fd, F_DUPFD_CLOEXEC, 3);
    if (s->fd < 0) { call = "fcntl(F_DUPFD_CLOEXEC)"; err = errno; goto fail; }
    err = query_interface(s->fd, ifname, &facts, &call);
    if (err != 0) goto fail;
    err = check_kept_socket(s, vnet, reserve, facts.ifindex, &call);
    if (err != 0) goto fail;
    s->ifindex = facts.ifindex;
    void* kept_ring = mmap(NULL, s->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (kept_ring == MAP_FAILED) { call = "mmap(PACKET_RX_RING)"; err = errno; goto fail; }
    s->ring = kept_ring;
    sll.sll_family = AF_PACKET;
    sll.sll_ifindex = facts.ifindex;
    goto tx_socket;
  }
  // Protocol 0: the socket receives nothing until bind() names the interface and ETH_P_ALL, so
  // frames from other interfaces never land in the ring between socket() and bind().
  s->fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->fd < 0) { call = "socket(AF_PACKET)"; err = errno; goto fail; }
  err = query_interface(s->fd, ifname, &facts, &call);
  if (err != 0) goto fail;
  s->ifindex = facts.ifindex;

  if (vnet && setsockopt(s->fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) {
    call = "setsockopt(PACKET_VNET_HDR)"; err = errno; goto fail;
  }
  int ring_version = s->version;
  if (setsockopt(s->fd, SOL_PACKET, PACKET_VERSION, &ring_version, sizeof ring_version) < 0) {
    call = "setsockopt(PACKET_VERSION)"; err = errno; goto fail;
  }
  if (setsockopt(s->fd, SOL_PACKET, PACKET_RESERVE, &reserve, sizeof reserve) < 0) {
    call = "setsockopt(PACKET_RESERVE)"; err = errno; goto fail;
  }
  // The engine must never re-capture the frames it transmits itself.
  if (setsockopt(s->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0) {
    call = "setsockopt(PACKET_IGNORE_OUTGOING)"; err = errno; goto fail;
  }
  struct tpacket_req3 req;
  memset(&req, 0, sizeof req);
  req.tp_block_size = block_size;
  req.tp_block_nr = block_count;
  req.tp_frame_size = s->frame_size;
  req.tp_frame_nr = s->frame_count;
  req.tp_retire_blk_tov = retire_ms;
  // V2 takes the shorter struct tpacket_req (the first four fields of tpacket_req3).
  socklen_t req_len = s->version == TPACKET_V2 ? sizeof(struct tpacket_req) : sizeof req;
  if (setsockopt(s->fd, SOL_PACKET, PACKET_RX_RING, &req, req_len) < 0) {
    call = "setsockopt(PACKET_RX_RING)"; err = errno; goto fail;
  }
  if (s->version == TPACKET_V2) {
    // A frame larger than a ring frame arrives cut short with TP_STATUS_COPY, and whole in the
    // socket queue (read with recvCopy()).
    int queue = COPY_QUEUE_BYTES;
    if (setsockopt(s->fd, SOL_PACKET, PACKET_COPY_THRESH, &one, sizeof one) < 0) {
      call = "setsockopt(PACKET_COPY_THRESH)"; err = errno; goto fail;
    }
    if (setsockopt(s->fd, SOL_SOCKET, SO_RCVBUFFORCE, &queue, sizeof queue) < 0 &&
        setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &queue, sizeof queue) < 0) {
      call = "setsockopt(SO_RCVBUF)"; err = errno; goto fail;
    }
  }
  void* ring = mmap(NULL, s->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (ring == MAP_FAILED) { call = "mmap(PACKET_RX_RING)"; err = errno; goto fail; }
  s->ring = ring;

  if (fanout && set_drop_all_filter(s->fd, 1) < 0) {
    call = "setsockopt(SO_ATTACH_FILTER)"; err = errno; goto fail;
  }
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = facts.ifindex;
  if (bind(s->fd, (struct sockaddr*)&sll, sizeof sll) < 0) { call = "bind(AF_PACKET)"; err = errno; goto fail; }
tx_socket:
  // Frames go out through a second, ringless socket that is in no epoll set. Every sent skb
  // freed downstream calls its socket's write-space callback; on the polled RX socket that
  // took the wait-queue lock with interrupts off for each packet (a paravirtual irq-enable each
  // on these VMs, about 2% of the loop's core in a profile). Protocol 0: it receives nothing.
  s->tx_fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->tx_fd < 0) { call = "socket(AF_PACKET)"; err = errno; goto fail; }
  if (vnet && setsockopt(s->tx_fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) {
    call = "setsockopt(PACKET_VNET_HDR)"; err = errno; goto fail;
  }
  sll.sll_protocol = 0;
  if (bind(s->tx_fd, (struct sockaddr*)&sll, sizeof sll) < 0) { call = "bind(AF_PACKET)"; err = errno; goto fail; }
  int sndbuf = SEND_BUFFER_BYTES;
  socklen_t sndbuf_len = sizeof sndbuf;
  // Without CAP_NET_ADMIN only SO_SNDBUF (capped by net.core.wmem_max) is allowed; that is no error.
  if (setsockopt(s->tx_fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf) < 0) {
    setsockopt(s->tx_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  }
  if (getsockopt(s->tx_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sndbuf_len) < 0) sndbuf = 0;
  s->send_buffer_bytes = sndbuf;
  if (fanout && kept_fd < 0) {
    err = enter_fanout(s->fd, fanout_make, fanout_id, &fanout_group);
    if (err != 0) { call = "setsockopt(PACKET_FANOUT)"; goto fail; }
    // From here the group's hash decides which frames are ours.
    if (set_drop_all_filter(s->fd, 0) < 0) { call = "setsockopt(SO_DETACH_FILTER)"; err = errno; goto fail; }
  }

  napi_value handle, ring_buffer;
  if (napi_create_object(env, &handle) != napi_ok) goto fail_js;
  if (napi_create_external_arraybuffer(env, s->ring, s->ring_bytes, on_ring_finalized, s, &ring_buffer) != napi_ok) {
    goto fail_js;
  }
  // From here the ArrayBuffer holds a reference; the handle takes the other one below.
  s->refs = 1;
  napi_create_reference(env, ring_buffer, 1, &s->ring_ref);
  if (napi_wrap(env, handle, s, on_handle_finalized, NULL, NULL) != napi_ok) {
    // The ArrayBuffer's finalizer will free `s`; only the socket is ours to close now.
    close(s->tx_fd);
    close(s->fd);
    s->fd = -1;
    s->tx_fd = -1;
    s->closed = 1;
    napi_delete_reference(env, s->ring_ref);
    s->ring_ref = NULL;
    return NULL;
  }
  s->refs++;
  napi_type_tag_object(env, handle, &socket_type_tag);
  napi_add_async_cleanup_hook(env, on_env_cleanup, s, &s->cleanup_handle);

  napi_value v;
  set_int_property(env, handle, "fd", s->fd);
  set_interface_properties(env, handle, &facts);
  napi_set_named_property(env, handle, "ring", ring_buffer);
  set_int_property(env, handle, "blockSizeBytes", block_size);
  set_int_property(env, handle, "blockCount", block_count);
  set_int_property(env, handle, "ringVersion", s->version == TPACKET_V2 ? 2 : 3);
  set_int_property(env, handle, "frameSizeBytes", s->frame_size);
  set_int_property(env, handle, "frameCount", s->frame_count);
  set_int_property(env, handle, "sendBufferBytes", s->send_buffer_bytes);
  if (fanout) {
    set_int_property(env, handle, "fanoutGroupId", fanout_group);
  } else {
    napi_get_null(env, &v);
    napi_set_named_property(env, handle, "fanoutGroupId", v);
  }
  napi_get_boolean(env, vnet, &v);
  napi_set_named_property(env, handle, "vnetHdr", v);
  napi_create_string_utf8(env, ifname, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, handle, "ifname", v);
  napi_object_freeze(env, handle);
  return handle;

fail:
  if (s->ring != NULL) munmap(s->ring, s->ring_bytes);
  if (s->fd >= 0) close(s->fd);
  if (s->tx_fd >= 0) close(s->tx_fd);
  free(s);
  dsrlb_throw_errno(env, call, err, ifname);
  return NULL;

fail_js:
  munmap(s->ring, s->ring_bytes);
  close(s->tx_fd);
  close(s->fd);
  free(s);
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// send(handle, offsets, lengths, count, first = 0) and sendCopy(handle, buf, offsets, lengths,
// count, first = 0): sendmmsg frames [first, count) out of the bound interface, in order.
// Returns how many were sent from `first`. Fewer than count - first means either a transient
// refusal (EAGAIN, ENOBUFS: the frame at first + result was not sent) or a hard error at that
// frame, which the next call starting there throws. Nothing sent and a hard error: throws.

static napi_value send_frames(napi_env env, packet_socket* s, const uint8_t* base, size_t base_bytes,
                              const int32_t* offsets, const int32_t* lengths, uint32_t first, uint32_t count) {
  uint32_t sent = 0;
  uint32_t index = first;
  napi_value result;
  while (index < count) {
    uint32_t n = count - index;
    if (n > SEND_CHUNK) n = SEND_CHUNK;
    uint32_t valid = 0;
    for (; valid < n; valid++) {
      int32_t offset = offsets[index + valid];
      int32_t length = lengths[index + valid];
      if (offset < 0 || length <= 0 || (size_t)offset + (size_t)length > base_bytes) break;
      s->iov[valid].iov_base = (void*)(base + offset);
      s->iov[valid].iov_len = (size_t)length;
      memset(&s->msgs[valid].msg_hdr, 0, sizeof s->msgs[valid].msg_hdr);
      s->msgs[valid].msg_hdr.msg_iov = &s->iov[valid];
      s->msgs[valid].msg_hdr.msg_iovlen = 1;
    }
    if (valid == 0) {
      if (sent > 0) break;
      throw_range(env, "frame offset/length outside the buffer");
      return NULL;
    }
    int r = sendmmsg(s->tx_fd, s->msgs, valid, MSG_DONTWAIT);
    if (r < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || sent > 0) break;
      dsrlb_throw_errno(env, "sendmmsg", err, s->ifname);
      return NULL;
    }
    sent += (uint32_t)r;
    index += (uint32_t)r;
  }
  napi_create_uint32(env, sent, &result);
  return result;
}

static int get_send_range(napi_env env, napi_value count_value, napi_value first_value, size_t offsets_length,
                          size_t lengths_length, uint32_t* first, uint32_t* count) {
  napi_valuetype type;
  *first = 0;
  if (!get_uint32(env, count_value, "count", count)) return 0;
  if (napi_typeof(env, first_value, &type) == napi_ok && type != napi_undefined &&
      !get_uint32(env, first_value, "first", first)) {
    return 0;
  }
  if (*count > offsets_length || *count > lengths_length || *first > *count) {
    throw_range(env, "count exceeds the offsets/lengths arrays, or first exceeds count");
    return 0;
  }
  return 1;
}

static napi_value send_ring(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  int32_t *offsets, *lengths;
  size_t offsets_length, lengths_length;
  uint32_t first, count;
  if (!get_args(env, info, 5, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL || !get_int32_array(env, argv[1], "offsets", &offsets, &offsets_length) ||
      !get_int32_array(env, argv[2], "lengths", &lengths, &lengths_length) ||
      !get_send_range(env, argv[3], argv[4], offsets_length, lengths_length, &first, &count)) {
    return NULL;
  }
  return send_frames(env, s, s->ring, s->ring_bytes, offsets, lengths, first, count);
}

static napi_value send_copy(napi_env env, napi_callback_info info) {
  napi_value argv[6];
  int32_t *offsets, *lengths;
  size_t offsets_length, lengths_length, buf_length;
  uint32_t first, count;
  uint8_t* buf;
  if (!get_args(env, info, 6, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL || !get_uint8_array(env, argv[1], "buf", &buf, &buf_length)) return NULL;
  if (!get_int32_array(env, argv[2], "offsets", &offsets, &offsets_length) ||
      !get_int32_array(env, argv[3], "lengths", &lengths, &lengths_length) ||
      !get_send_range(env, argv[4], argv[5], offsets_length, lengths_length, &first, &count)) {
    return NULL;
  }
  return send_frames(env, s, buf, buf_length, offsets, lengths, first, count);
}

// ---------------------------------------------------------------------------------------------
// recvCopy(handle, buf, offset): the next frame of the socket queue (a V2 ring frame marked
// TP_STATUS_COPY, virtio_net_hdr first when vnetHdr) into buf[offset..]. Returns its length, -1 when
// the queue is empty, or -(full length) when it did not fit (the frame is consumed either way).

static napi_value recv_copy(napi_env env, napi_callback_info info) {
  napi_value argv[3], result;
  size_t buf_length;
  uint8_t* buf;
  uint32_t offset;
  if (!get_args(env, info, 3, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL || !get_uint8_array(env, argv[1], "buf", &buf, &buf_length) ||
      !get_uint32(env, argv[2], "offset", &offset)) {
    return NULL;
  }
  if (offset >= buf_length) {
    throw_range(env, "offset must lie inside buf");
    return NULL;
  }
  ssize_t n;
  do {
    n = recv(s->fd, buf + offset, buf_length - offset, MSG_DONTWAIT | MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      napi_create_int32(env, -1, &result);
      return result;
    }
    dsrlb_throw_errno(env, "recv", errno, s->ifname);
    return NULL;
  }
  napi_create_int64(env, (size_t)n > buf_length - offset ? -(int64_t)n : (int64_t)n, &result);
  return result;
}

// ---------------------------------------------------------------------------------------------
// startPolling(handle, callback) / stopPolling(handle): callback(errno) runs on the loop thread
// when the ring has a block for user space (errno 0), or after a socket error (errno > 0, e.g.
// ENETDOWN; the error is cleared and polling goes on).

// Shared with raw_tunnel.c: one readiness wake-up of `handle` on `fd` turned into callback(errno)
// on the loop thread. After POLLERR (status < 0; libuv stops the handle) SO_ERROR is read, which
// clears it, and polling starts again with `restart`.
void dsrlb_poll_notify(napi_env env, uv_poll_t* handle, uv_poll_cb restart, int fd, int status, napi_ref callback_ref,
                       napi_async_context async_context) {
  int err = 0;
  if (status < 0) {
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err == 0) err = -status;
    uv_poll_start(handle, UV_READABLE, restart);
  }
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return;
  napi_value callback, recv, argv[1], exception;
  if (napi_get_reference_value(env, callback_ref, &callback) == napi_ok && callback != NULL) {
    napi_get_global(env, &recv);  // napi_make_callback needs an object receiver
    napi_create_int32(env, err, &argv[0]);
    if (napi_make_callback(env, async_context, recv, callback, 1, argv, NULL) == napi_pending_exception &&
        napi_get_and_clear_last_exception(env, &exception) == napi_ok) {
      napi_fatal_exception(env, exception);
    }
  }
  napi_close_handle_scope(env, scope);
}

static void on_poll(uv_poll_t* handle, int status, int events) {
  packet_socket* s = handle->data;
  if (s->closed || s->callback_ref == NULL) return;
  dsrlb_poll_notify(s->env, handle, on_poll, s->fd, status, s->callback_ref, s->async_context);
}

static napi_value start_polling(napi_env env, napi_callback_info info) {
  napi_value argv[2], name;
  napi_valuetype type;
  if (!get_args(env, info, 2, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL) return NULL;
  if (napi_typeof(env, argv[1], &type) != napi_ok || type != napi_function) {
    throw_type(env, "callback must be a function");
    return NULL;
  }
  stop_polling(s, 0);
  uv_loop_t* loop = NULL;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == NULL) {
    napi_throw_error(env, "ERR_NO_LOOP", "no libuv loop for this environment");
    return NULL;
  }
  uv_poll_t* poll = malloc(sizeof *poll);
  if (poll == NULL) {
    dsrlb_throw_errno(env, "malloc", ENOMEM, s->ifname);
    return NULL;
  }
  int r = uv_poll_init(loop, poll, s->fd);
  if (r < 0) {
    free(poll);
    dsrlb_throw_errno(env, "uv_poll_init", -r, s->ifname);
    return NULL;
  }
  poll->data = s;
  s->refs++;  // released in on_poll_closed
  s->poll = poll;
  napi_create_reference(env, argv[1], 1, &s->callback_ref);
  napi_create_string_utf8(env, "dsrlb:packet-ring", NAPI_AUTO_LENGTH, &name);
  napi_async_init(env, argv[0], name, &s->async_context);
  r = uv_poll_start(poll, UV_READABLE, on_poll);
  if (r < 0) {
    stop_polling(s, 0);
    dsrlb_throw_errno(env, "uv_poll_start", -r, s->ifname);
    return NULL;
  }
  return NULL;
}

static napi_value stop_polling_js(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (!get_args(env, info, 1, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 0);
  if (s != NULL) stop_polling(s, 0);
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// stats(handle) -> { packets, drops, freezeQueueCount } since the previous call (the kernel
// resets the counters on read). packets includes drops.

static napi_value stats(napi_env env, napi_callback_info info) {
  napi_value argv[1], result;
  if (!get_args(env, info, 1, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL) return NULL;
  struct tpacket_stats_v3 st;
  socklen_t len = sizeof st;
  memset(&st, 0, sizeof st);
  if (getsockopt(s->fd, SOL_PACKET, PACKET_STATISTICS, &st, &len) < 0) {
    dsrlb_throw_errno(env, "getsockopt(PACKET_STATISTICS)", errno, s->ifname);
    return NULL;
  }
  napi_create_object(env, &result);
  set_int_property(env, result, "packets", st.tp_packets);
  set_int_property(env, result, "drops", st.tp_drops);
  set_int_property(env, result, "freezeQueueCount", s->version == TPACKET_V3 ? st.tp_freeze_q_cnt : 0);
  return result;
}

// close(handle): stop polling, detach the ring ArrayBuffer (every view becomes empty), unmap,
// close the socket. Idempotent.
static napi_value close_socket(napi_env env, napi_callback_info info) {
  napi_value argv[1], ring;
  if (!get_args(env, info, 1, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 0);
  if (s == NULL || s->closed) return NULL;
  unregister_cleanup(s);
  close_fd_and_poll(s, 0);
  if (s->ring_ref != NULL) {
    if (napi_get_reference_value(env, s->ring_ref, &ring) == napi_ok && ring != NULL &&
        napi_detach_arraybuffer(env, ring) == napi_ok) {
      munmap(s->ring, s->ring_bytes);
      s->unmapped = 1;
    }
    napi_delete_reference(env, s->ring_ref);
    s->ring_ref = NULL;
  }
  return NULL;
}

// keepSocket(handle): a second descriptor (close-on-exec) of the handle's RX socket, for the
// control thread to hold: while it is open the socket, its ring and its place in the fanout group
// outlive the thread that opened it, and a loop started again takes it over (openPacketSocket
// keptFd) with whatever arrived meanwhile. The caller closes it (fs.closeSync).
static napi_value keep_socket(napi_env env, napi_callback_info info) {
  napi_value argv[1], result;
  if (!get_args(env, info, 1, argv)) return NULL;
  packet_socket* s = get_socket(env, argv[0], 1);
  if (s == NULL) return NULL;
  int fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) {
    dsrlb_throw_errno(env, "fcntl(F_DUPFD_CLOEXEC)", errno, s->ifname);
    return NULL;
  }
  napi_create_int32(env, fd, &result);
  return result;
}

// ---------------------------------------------------------------------------------------------

static napi_value make_layout(napi_env env) {
  napi_value layout;
  napi_create_object(env, &layout);
  set_int_property(env, layout, "blockStatus", offsetof(struct tpacket_block_desc, hdr.bh1.block_status));
  set_int_property(env, layout, "blockNumPackets", offsetof(struct tpacket_block_desc, hdr.bh1.num_pkts));
  set_int_property(env, layout, "blockFirstPacket", offsetof(struct tpacket_block_desc, hdr.bh1.offset_to_first_pkt));
  set_int_property(env, layout, "blockSeqNum", offsetof(struct tpacket_block_desc, hdr.bh1.seq_num));
  set_int_property(env, layout, "frameNextOffset", offsetof(struct tpacket3_hdr, tp_next_offset));
  set_int_property(env, layout, "frameSnaplen", offsetof(struct tpacket3_hdr, tp_snaplen));
  set_int_property(env, layout, "frameLen", offsetof(struct tpacket3_hdr, tp_len));
  set_int_property(env, layout, "frameStatus", offsetof(struct tpacket3_hdr, tp_status));
  set_int_property(env, layout, "frameMac", offsetof(struct tpacket3_hdr, tp_mac));
  set_int_property(env, layout, "frameNet", offsetof(struct tpacket3_hdr, tp_net));
  set_int_property(env, layout, "frameVlanTci", offsetof(struct tpacket3_hdr, hv1.tp_vlan_tci));
  set_int_property(env, layout, "frameVlanTpid", offsetof(struct tpacket3_hdr, hv1.tp_vlan_tpid));
  set_int_property(env, layout, "framePacketType",
                   TPACKET_ALIGN(sizeof(struct tpacket3_hdr)) + offsetof(struct sockaddr_ll, sll_pkttype));
  set_int_property(env, layout, "frameHeaderBytes", TPACKET3_HDRLEN);
  return layout;
}

static napi_value make_layout_v2(napi_env env) {
  napi_value layout;
  napi_create_object(env, &layout);
  set_int_property(env, layout, "frameStatus", offsetof(struct tpacket2_hdr, tp_status));
  set_int_property(env, layout, "frameLen", offsetof(struct tpacket2_hdr, tp_len));
  set_int_property(env, layout, "frameSnaplen", offsetof(struct tpacket2_hdr, tp_snaplen));
  set_int_property(env, layout, "frameMac", offsetof(struct tpacket2_hdr, tp_mac));
  set_int_property(env, layout, "frameVlanTci", offsetof(struct tpacket2_hdr, tp_vlan_tci));
  set_int_property(env, layout, "frameVlanTpid", offsetof(struct tpacket2_hdr, tp_vlan_tpid));
  set_int_property(env, layout, "framePacketType",
                   TPACKET_ALIGN(sizeof(struct tpacket2_hdr)) + offsetof(struct sockaddr_ll, sll_pkttype));
  set_int_property(env, layout, "frameHeaderBytes", TPACKET2_HDRLEN);
  return layout;
}

// pinThread(cpu): runs the calling thread (a packet loop's worker thread) on that CPU only.
static napi_value pin_thread(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  uint32_t cpu;
  if (!get_args(env, info, 1, argv) || !get_uint32(env, argv[0], "cpu", &cpu)) return NULL;
  if (cpu >= CPU_SETSIZE) {
    throw_range(env, "cpu must be below CPU_SETSIZE (1024)");
    return NULL;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  // pid 0: this thread, not the whole process (the main thread and other loops keep theirs).
  if (sched_setaffinity(0, sizeof set, &set) < 0) {
    dsrlb_throw_errno(env, "sched_setaffinity", errno, NULL);
    return NULL;
  }
  return NULL;
}

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// closeOnExecAll(): sets FD_CLOEXEC on every descriptor above 2 of the process. Packages that open
// sockets without SOCK_CLOEXEC (raw-socket's ICMP probe socket, cap's packet socket) would hand
// them to every command the daemon runs (exec health checks), which kept receiving on them. libuv
// passes a child's stdio by dup2, so nothing a spawn means to give is lost.
static napi_value close_on_exec_all(napi_env env, napi_callback_info info) {
  (void)info;
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return NULL;
#endif
  // Before Linux 5.11: one fcntl per descriptor listed in /proc/self/fd.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == NULL) {
    dsrlb_throw_errno(env, "opendir(/proc/self/fd)", errno, NULL);
    return NULL;
  }
  int own = dirfd(dir);
  struct dirent* entry;
  while ((entry = readdir(dir)) != NULL) {
    char* end;
    long fd = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || end == entry->d_name || fd < 3 || fd == own) continue;
    int flags = fcntl((int)fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) fcntl((int)fd, F_SETFD, flags | FD_CLOEXEC);
  }
  closedir(dir);
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// sdNotify(socketPath, state): one sd_notify(3) datagram, e.g. "READY=1" or "WATCHDOG=1", to
// $NOTIFY_SOCKET (a path, or an abstract name written with a leading '@'). Node has no datagram
// Unix sockets. Returns 0 or -errno (the caller decides whether a lost notification matters).

static napi_value sd_notify_js(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2], result;
  napi_valuetype type0, type1;
  char path[sizeof(((struct sockaddr_un*)0)->sun_path) + 1];
  char state[1024];
  size_t path_length = 0, state_length = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 2 || napi_typeof(env, argv[0], &type0) != napi_ok || type0 != napi_string || napi_typeof(env, argv[1], &type1) != napi_ok ||
      type1 != napi_string) {
    throw_type(env, "sdNotify(socketPath, state) takes two strings");
    return NULL;
  }
  // Measured first (a NULL buffer gives the length): copied into a fixed buffer, a longer string
  // was cut short without a word.
  size_t path_needed = 0, state_needed = 0;
  napi_get_value_string_utf8(env, argv[0], NULL, 0, &path_needed);
  napi_get_value_string_utf8(env, argv[1], NULL, 0, &state_needed);
  if (state_needed >= sizeof state) {
    throw_range(env, "the notification is longer than 1023 bytes");
    return NULL;
  }
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path_needed >= sizeof path) {
    throw_range(env, "the notify socket must be an absolute path or an @abstract name that fits sun_path");
    return NULL;
  }
  napi_get_value_string_utf8(env, argv[0], path, sizeof path, &path_length);
  napi_get_value_string_utf8(env, argv[1], state, sizeof state, &state_length);
  // A path needs its NUL inside sun_path (the kernel refused 108 bytes with EINVAL); an abstract name does not.
  if (path_length < 2 || (path[0] != '/' && path[0] != '@') || path_length + (path[0] == '/' ? 1 : 0) > sizeof addr.sun_path) {
    throw_range(env, "the notify socket must be an absolute path or an @abstract name that fits sun_path");
    return NULL;
  }
  memcpy(addr.sun_path, path, path_length);
  if (path[0] == '@') addr.sun_path[0] = '\0';
  socklen_t addr_length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_length + (path[0] == '@' ? 0 : 1));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int rc = 0;
  if (fd < 0) {
    rc = -errno;
  } else {
    if (sendto(fd, state, state_length, MSG_NOSIGNAL, (struct sockaddr*)&addr, addr_length) < 0) rc = -errno;
    close(fd);
  }
  napi_create_int32(env, rc, &result);
  return result;
}

napi_status tun_device_init(napi_env env, napi_value exports);  // tun_device.c
napi_status raw_tunnel_init(napi_env env, napi_value exports);  // raw_tunnel.c
napi_status frame_send_init(napi_env env, napi_value exports);  // frame_send.c
napi_status file_lock_init(napi_env env, napi_value exports);   // file_lock.c

NAPI_MODULE_INIT() {
  napi_property_descriptor properties[] = {
      {"openPacketSocket", NULL, open_packet_socket, NULL, NULL, NULL, napi_enumerable, NULL},
      {"send", NULL, send_ring, NULL, NULL, NULL, napi_enumerable, NULL},
      {"sendCopy", NULL, send_copy, NULL, NULL, NULL, napi_enumerable, NULL},
      {"startPolling", NULL, start_polling, NULL, NULL, NULL, napi_enumerable, NULL},
      {"stopPolling", NULL, stop_polling_js, NULL, NULL, NULL, napi_enumerable, NULL},
      {"stats", NULL, stats, NULL, NULL, NULL, napi_enumerable, NULL},
      {"recvCopy", NULL, recv_copy, NULL, NULL, NULL, napi_enumerable, NULL},
      {"close", NULL, close_socket, NULL, NULL, NULL, napi_enumerable, NULL},
      {"keepSocket", NULL, keep_socket, NULL, NULL, NULL, napi_enumerable, NULL},
      {"interfaceInfo", NULL, interface_info, NULL, NULL, NULL, napi_enumerable, NULL},
      {"pinThread", NULL, pin_thread, NULL, NULL, NULL, napi_enumerable, NULL},
      {"closeOnExecAll", NULL, close_on_exec_all, NULL, NULL, NULL, napi_enumerable, NULL},
      {"sdNotify", NULL, sd_notify_js, NULL, NULL, NULL, napi_enumerable, NULL},
      {"layout", NULL, NULL, NULL, NULL, make_layout(env), napi_enumerable, NULL},
      {"layoutV2", NULL, NULL, NULL, NULL, make_layout_v2(env), napi_enumerable, NULL},
  };
  if (napi_define_properties(env, exports, sizeof properties / sizeof properties[0], properties) != napi_ok) {
    return NULL;
  }
  if (tun_device_init(env, exports) != napi_ok) return NULL;
  if (raw_tunnel_init(env, exports) != napi_ok) return NULL;
  if (frame_send_init(env, exports) != napi_ok) return NULL;
  if (file_lock_init(env, exports) != napi_ok) return NULL;
  return exports;
}
