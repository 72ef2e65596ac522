// Raw sockets for `dsrlb decap`: one per outer family and inner protocol (4: IPv4 inside, 41: IPv6
// inside), read with recvmsg so that an IPv6 outer header's traffic class comes along
// (IPV6_RECVTCLASS). An IPv6 raw socket hands over the payload only, and recvfrom (the raw-socket
// package) drops the ancillary data, so the outer ECN mark that RFC 6040 asks the decapsulator to
// carry inside was lost. An IPv4 raw socket hands over the whole datagram, header included.
// Syscalls, readiness and lifetimes only; every packet decision is made in TypeScript (src/decap).
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <node_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

// packet_ring.c: an Error whose code is the errno name, errno negative, syscall set; and
// callback(errno) for a readiness wake-up.
void dsrlb_throw_errno(napi_env env, const char* call, int err, const char* ifname);
void dsrlb_poll_notify(napi_env env, uv_poll_t* handle, uv_poll_cb restart, int fd, int status, napi_ref callback_ref,
                       napi_async_context async_context);

typedef struct {
  napi_env env;
  int fd;
  uv_poll_t* poll;
  napi_ref callback;
  napi_async_context async_context;
  int closed;
  // Holders: the JS handle's external, and the poll handle until libuv has closed it.
  int refs;
} tunnel_socket;

static void release_tunnel(tunnel_socket* t) {
  if (--t->refs == 0) free(t);
}

static void on_poll_closed(uv_handle_t* handle) {
  tunnel_socket* t = handle->data;
  free(handle);
  release_tunnel(t);
}

static void on_env_teardown(void* data);

// Stops readiness and closes the socket. Idempotent.
static void close_tunnel(tunnel_socket* t, int in_teardown) {
  if (t->closed) return;
  t->closed = 1;
  if (!in_teardown) napi_remove_env_cleanup_hook(t->env, on_env_teardown, t);
  if (t->callback != NULL) {
    napi_delete_reference(t->env, t->callback);
    t->callback = NULL;
  }
  if (t->async_context != NULL) {
    if (!in_teardown) napi_async_destroy(t->env, t->async_context);
    t->async_context = NULL;
  }
  // The poll handle stops before its fd closes (libuv: never close an fd a poll handle watches).
  if (t->poll != NULL) {
    uv_poll_stop(t->poll);
    uv_close((uv_handle_t*)t->poll, on_poll_closed);
    t->poll = NULL;
  }
  close(t->fd);
  t->fd = -1;
}

static void on_env_teardown(void* data) {
  close_tunnel(data, 1);
}

static void on_poll(uv_poll_t* handle, int status, int events) {
  tunnel_socket* t = handle->data;
  if (t->closed || t->callback == NULL) return;
  dsrlb_poll_notify(t->env, handle, on_poll, t->fd, status, t->callback, t->async_context);
}

// The JS handle was collected without close (or at teardown): close, and let go of the struct.
static void on_external_finalize(napi_env env, void* data, void* hint) {
  tunnel_socket* t = data;
  close_tunnel(t, 0);
  release_tunnel(t);
}

// ---------------------------------------------------------------------------------------------
// openTunnelSocket(family, protocol, ifname, receiveBufferBytes, callback[, options]) -> handle: a
// raw socket (non-blocking, close-on-exec), bound to ifname unless it is null, IPV6_RECVTCLASS on
// for IPv6, and callback(errno) called on the loop thread whenever it is readable (errno 0) or
// after a socket error (errno > 0, cleared; polling goes on). options: { source, peer, dropAll }:
// bound to local address `source` and connected to `peer` when given (the kernel then hands it
// datagrams and ICMP errors between exactly those two), and with `dropAll` a socket filter that
// takes no datagram (for a socket held open only for the ICMP errors the kernel handles for it;
// path MTU discovery "do" as well, so that a too-big error about the peer reaches the callback).
// The handle holds { fd }.

static napi_value open_tunnel_socket(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  int32_t family, protocol, rcvbuf;
  napi_valuetype type;
  char ifname[16] = "";
  char address_text[64] = "";
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 5 || napi_get_value_int32(env, argv[0], &family) != napi_ok || napi_get_value_int32(env, argv[1], &protocol) != napi_ok ||
      napi_get_value_int32(env, argv[3], &rcvbuf) != napi_ok || (family != 4 && family != 6)) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "openTunnelSocket(4 | 6, protocol, ifname | null, receiveBufferBytes, callback)");
    return NULL;
  }
  if (napi_typeof(env, argv[2], &type) != napi_ok) return NULL;
  if (type == napi_string) {
    size_t length = 0;
    napi_get_value_string_utf8(env, argv[2], NULL, 0, &length);
    if (length == 0 || length >= sizeof ifname) {
      napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "ifname must have 1 to 15 bytes");
      return NULL;
    }
    napi_get_value_string_utf8(env, argv[2], ifname, sizeof ifname, &length);
  } else if (type != napi_null && type != napi_undefined) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "ifname must be a string or null");
    return NULL;
  }
  if (napi_typeof(env, argv[4], &type) != napi_ok || type != napi_function) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "callback must be a function");
    return NULL;
  }
  // options: each address parsed before the socket exists, so a bad one leaves nothing behind.
  struct sockaddr_storage addresses[2];  // [0] source, [1] peer
  socklen_t address_lengths[2] = {0, 0};
  bool drop_all = false;
  memset(addresses, 0, sizeof addresses);
  if (argc >= 6 && (napi_typeof(env, argv[5], &type) != napi_ok || (type != napi_object && type != napi_undefined && type != napi_null))) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "options must be an object { source, peer, dropAll }");
    return NULL;
  }
  if (argc >= 6 && type == napi_object) {
    static const char* const keys[2] = {"source", "peer"};
    for (int i = 0; i < 2; i++) {
      napi_value value;
      if (napi_get_named_property(env, argv[5], keys[i], &value) != napi_ok || napi_typeof(env, value, &type) != napi_ok) return NULL;
      if (type == napi_undefined || type == napi_null) continue;
      size_t length = 0;
      if (type != napi_string || napi_get_value_string_utf8(env, value, address_text, sizeof address_text, &length) != napi_ok) {
        napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "options.source and options.peer must be address strings");
        return NULL;
      }
      struct sockaddr_in* in4 = (struct sockaddr_in*)&addresses[i];
      struct sockaddr_in6* in6 = (struct sockaddr_in6*)&addresses[i];
      if (family == 4 && inet_pton(AF_INET, address_text, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        address_lengths[i] = sizeof *in4;
      } else if (family == 6 && inet_pton(AF_INET6, address_text, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        address_lengths[i] = sizeof *in6;
      } else {
        napi_throw_type_error(env, "ERR_INVALID_ARG_VALUE", "options.source and options.peer must be addresses of the socket's family");
        return NULL;
      }
    }
    napi_value value;
    if (napi_get_named_property(env, argv[5], "dropAll", &value) != napi_ok || napi_typeof(env, value, &type) != napi_ok) return NULL;
    if (type == napi_boolean) napi_get_value_bool(env, value, &drop_all);
  }

  int fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
  if (fd < 0) {
    dsrlb_throw_errno(env, "socket(SOCK_RAW)", errno, NULL);
    return NULL;
  }
  // SO_RCVBUFFORCE passes net.core.rmem_max with CAP_NET_ADMIN; SO_RCVBUF is capped by it.
  if (rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  }
  if (ifname[0] != '\0' && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, strlen(ifname) + 1) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "setsockopt(SO_BINDTODEVICE)", err, ifname);
    return NULL;
  }
  int on = 1;
  if (family == 6 && setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof on) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "setsockopt(IPV6_RECVTCLASS)", err, NULL);
    return NULL;
  }
  if (drop_all) {
    // Classic BPF: one instruction, "return 0 bytes": every datagram is dropped before the queue.
    struct sock_filter none[] = {{BPF_RET | BPF_K, 0, 0, 0}};
    struct sock_fprog program = {1, none};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program) < 0) {
      int err = errno;
      close(fd);
      dsrlb_throw_errno(env, "setsockopt(SO_ATTACH_FILTER)", err, NULL);
      return NULL;
    }
    // Path MTU discovery "do" (the socket never sends, so it changes nothing else): a connected
    // raw socket reports a too-big error about its peer as a socket error (EMSGSIZE) only as a
    // hard error, which IPv6 makes it under IPV6_PMTUDISC_DO alone (rawv6_err; IPv4's default
    // already does, raw_err). Without IP(V6)_RECVERR: no error queue to drain.
    int level = family == 4 ? IPPROTO_IP : IPPROTO_IPV6;
    int option = family == 4 ? IP_MTU_DISCOVER : IPV6_MTU_DISCOVER;
    int mode = family == 4 ? IP_PMTUDISC_DO : IPV6_PMTUDISC_DO;
    if (setsockopt(fd, level, option, &mode, sizeof mode) < 0) {
      int err = errno;
      close(fd);
      dsrlb_throw_errno(env, family == 4 ? "setsockopt(IP_MTU_DISCOVER)" : "setsockopt(IPV6_MTU_DISCOVER)", err, NULL);
      return NULL;
    }
  }
  if (address_lengths[0] > 0 && bind(fd, (struct sockaddr*)&addresses[0], address_lengths[0]) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "bind", err, NULL);
    return NULL;
  }
  if (address_lengths[1] > 0 && connect(fd, (struct sockaddr*)&addresses[1], address_lengths[1]) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "connect", err, NULL);
    return NULL;
  }
  if (drop_all) {
    // What arrived before the filter was attached: read it now, or the level-triggered poll below
    // would wake the loop for it again and again (nothing reads a dropAll socket).
    char scrap[1];
    while (recv(fd, scrap, sizeof scrap, MSG_DONTWAIT | MSG_TRUNC) >= 0) {
    }
  }

  tunnel_socket* t = calloc(1, sizeof *t);
  uv_poll_t* poll = malloc(sizeof *poll);
  uv_loop_t* loop = NULL;
  if (t == NULL || poll == NULL) {
    free(t);
    free(poll);
    close(fd);
    dsrlb_throw_errno(env, "malloc", ENOMEM, NULL);
    return NULL;
  }
  t->env = env;
  t->fd = fd;
  t->refs = 1;  // the external, below
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == NULL) {
    free(t);
    free(poll);
    close(fd);
    napi_throw_error(env, "ERR_NO_LOOP", "no libuv loop for this environment");
    return NULL;
  }
  int r = uv_poll_init(loop, poll, fd);
  if (r < 0) {
    free(t);
    free(poll);
    close(fd);
    dsrlb_throw_errno(env, "uv_poll_init", -r, NULL);
    return NULL;
  }
  poll->data = t;
  t->poll = poll;
  t->refs++;  // released in on_poll_closed

  napi_value handle, fd_value, name;
  napi_create_object(env, &handle);
  napi_create_int32(env, fd, &fd_value);
  napi_set_named_property(env, handle, "fd", fd_value);
  napi_value external;
  napi_create_external(env, t, on_external_finalize, NULL, &external);
  napi_set_named_property(env, handle, "native", external);
  napi_create_reference(env, argv[4], 1, &t->callback);
  napi_create_string_utf8(env, "dsrlb:tunnel-socket", NAPI_AUTO_LENGTH, &name);
  napi_async_init(env, handle, name, &t->async_context);
  napi_add_env_cleanup_hook(env, on_env_teardown, t);
  r = uv_poll_start(poll, UV_READABLE, on_poll);
  if (r < 0) {
    close_tunnel(t, 0);
    dsrlb_throw_errno(env, "uv_poll_start", -r, NULL);
    return NULL;
  }
  return handle;
}

static tunnel_socket* get_tunnel(napi_env env, napi_value handle) {
  napi_value external;
  void* data = NULL;
  if (napi_get_named_property(env, handle, "native", &external) != napi_ok || napi_get_value_external(env, external, &data) != napi_ok ||
      data == NULL) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "not a tunnel socket handle");
    return NULL;
  }
  return data;
}

// ---------------------------------------------------------------------------------------------
// recvTunnel(handle, buf, meta) -> length, or -errno (-EAGAIN once drained): one datagram into buf
// with recvmsg. meta[0] = the IPv6 outer traffic class, or -1 (IPv4: it is in the header read);
// meta[1] = 1 when the datagram did not fit buf (MSG_TRUNC), else 0; with 6 slots, meta[2..5]
// hold the outer source address as bytes (IPv4: 4, the rest 0; an IPv6 raw socket hands over no
// outer header, so msg_name is the only place it is). Called per datagram, so a refusal is a
// number, not an exception.

static napi_value recv_tunnel(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3], result;
  bool is_typed = false;
  napi_typedarray_type type;
  size_t buf_length, meta_length;
  uint8_t* buf;
  int32_t* meta;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 3) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "recvTunnel(handle, buf, meta)");
    return NULL;
  }
  tunnel_socket* t = get_tunnel(env, argv[0]);
  if (t == NULL) return NULL;
  if (napi_is_typedarray(env, argv[1], &is_typed) != napi_ok || !is_typed ||
      napi_get_typedarray_info(env, argv[1], &type, &buf_length, (void**)&buf, NULL, NULL) != napi_ok || type != napi_uint8_array) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "buf must be a Uint8Array");
    return NULL;
  }
  if (napi_is_typedarray(env, argv[2], &is_typed) != napi_ok || !is_typed ||
      napi_get_typedarray_info(env, argv[2], &type, &meta_length, (void**)&meta, NULL, NULL) != napi_ok || type != napi_int32_array ||
      meta_length < 2) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "meta must be an Int32Array of 2");
    return NULL;
  }
  if (t->closed) {
    napi_create_int32(env, -EBADF, &result);
    return result;
  }
  struct iovec iov = {.iov_base = buf, .iov_len = buf_length};
  union {
    char bytes[CMSG_SPACE(sizeof(int)) * 2];
    struct cmsghdr align;
  } control;
  struct sockaddr_storage from;
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  memset(&from, 0, sizeof from);
  msg.msg_name = &from;
  msg.msg_namelen = sizeof from;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.bytes;
  msg.msg_controllen = sizeof control.bytes;
  ssize_t n;
  do {
    n = recvmsg(t->fd, &msg, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    napi_create_int32(env, -errno, &result);
    return result;
  }
  meta[0] = -1;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int tclass;
      memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
      meta[0] = tclass;
    }
  }
  meta[1] = (msg.msg_flags & MSG_TRUNC) != 0;
  if (meta_length >= 6) {
    uint8_t* source = (uint8_t*)&meta[2];
    memset(source, 0, 16);
    if (from.ss_family == AF_INET) memcpy(source, &((struct sockaddr_in*)&from)->sin_addr, 4);
    else if (from.ss_family == AF_INET6) memcpy(source, &((struct sockaddr_in6*)&from)->sin6_addr, 16);
  }
  napi_create_int32(env, (int32_t)n, &result);
  return result;
}

// closeTunnelSocket(handle): stops readiness and closes the socket. Idempotent.
static napi_value close_tunnel_socket(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1) return NULL;
  tunnel_socket* t = get_tunnel(env, argv[0]);
  if (t != NULL) close_tunnel(t, 0);
  return NULL;
}

// Called from packet_ring.c's module initialiser.
napi_status raw_tunnel_init(napi_env env, napi_value exports) {
  napi_property_descriptor properties[] = {
      {"openTunnelSocket", NULL, open_tunnel_socket, NULL, NULL, NULL, napi_enumerable, NULL},
      {"recvTunnel", NULL, recv_tunnel, NULL, NULL, NULL, napi_enumerable, NULL},
      {"closeTunnelSocket", NULL, close_tunnel_socket, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof properties / sizeof properties[0], properties);
}
