// TUN devices for `dsrlb decap`: open /dev/net/tun as a layer-3 device without packet information
// (IFF_TUN | IFF_NO_PI), so every read and write is one bare IPv4 or IPv6 packet. Syscalls only;
// bringing the device up and its sysctls are done in TypeScript (src/decap/decap-host.ts).
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <node_api.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

// packet_ring.c: an Error whose code is the errno name, errno negative, syscall set.
void dsrlb_throw_errno(napi_env env, const char* call, int err, const char* ifname);

// ---------------------------------------------------------------------------------------------
// openTun(name): creates (or attaches to a persistent) TUN device called `name` ("%d" lets the
// kernel number it). Returns { fd, name } with the kernel's final name. The device lives until
// the fd is closed (unless made persistent elsewhere). The fd is blocking and close-on-exec.

static napi_value open_tun(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_valuetype type;
  char name[IFNAMSIZ];
  size_t length = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 1 || napi_typeof(env, argv[0], &type) != napi_ok || type != napi_string) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "name must be a string");
    return NULL;
  }
  napi_get_value_string_utf8(env, argv[0], NULL, 0, &length);
  if (length == 0 || length >= IFNAMSIZ) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "name must have 1 to 15 bytes");
    return NULL;
  }
  napi_get_value_string_utf8(env, argv[0], name, sizeof name, &length);

  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    dsrlb_throw_errno(env, "open(/dev/net/tun)", errno, name);
    return NULL;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  memcpy(ifr.ifr_name, name, length);
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "ioctl(TUNSETIFF)", err, name);
    return NULL;
  }
  ifr.ifr_name[IFNAMSIZ - 1] = '\0';

  napi_value result, fd_value, name_value;
  napi_create_object(env, &result);
  napi_create_int32(env, fd, &fd_value);
  napi_create_string_utf8(env, ifr.ifr_name, NAPI_AUTO_LENGTH, &name_value);
  napi_set_named_property(env, result, "fd", fd_value);
  napi_set_named_property(env, result, "name", name_value);
  return result;
}

// ---------------------------------------------------------------------------------------------
// tunWrite(fd, buf, offset, length): one write(2) of buf[offset, offset + length), i.e. one packet
// handed to the kernel as if received on the device. Returns the bytes written or -errno: it is
// called per packet, so a refusal is a number to count, not an exception to catch.

static napi_value tun_write(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4], result;
  int32_t fd;
  uint32_t offset, length;
  bool is_typed = false;
  napi_typedarray_type type;
  size_t buf_length;
  uint8_t* buf;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 4 || napi_get_value_int32(env, argv[0], &fd) != napi_ok ||
      napi_get_value_uint32(env, argv[2], &offset) != napi_ok ||
      napi_get_value_uint32(env, argv[3], &length) != napi_ok) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "tunWrite(fd, buf, offset, length) takes numbers");
    return NULL;
  }
  if (napi_is_typedarray(env, argv[1], &is_typed) != napi_ok || !is_typed) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "buf must be a Uint8Array");
    return NULL;
  }
  napi_get_typedarray_info(env, argv[1], &type, &buf_length, (void**)&buf, NULL, NULL);
  if (type != napi_uint8_array) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "buf must be a Uint8Array");
    return NULL;
  }
  // Not offset + length: with a 32-bit size_t two uint32 values could wrap past the check.
  if ((size_t)offset > buf_length || (size_t)length > buf_length - (size_t)offset) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "offset + length is past the end of buf");
    return NULL;
  }
  ssize_t written;
  do {
    written = write(fd, buf + offset, length);
  } while (written < 0 && errno == EINTR);
  napi_create_int32(env, written < 0 ? -errno : (int32_t)written, &result);
  return result;
}

// ---------------------------------------------------------------------------------------------
// linkSetUp(name, up): IFF_UP on or off (SIOCGIFFLAGS / SIOCSIFFLAGS), as `ip link set up|down`
// without a process. The VIP announcer's gates: BIRD hears of an administrative change at once,
// where a carrier change waits for the kernel's link watch (up to a second when any link of the
// host changed in the last one), long enough for a withdrawal to lose connections.

static napi_value link_set_up(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_valuetype type;
  bool up;
  char name[IFNAMSIZ];
  size_t length = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 2 || napi_typeof(env, argv[0], &type) != napi_ok || type != napi_string || napi_get_value_bool(env, argv[1], &up) != napi_ok) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "linkSetUp(name, up) takes a string and a boolean");
    return NULL;
  }
  napi_get_value_string_utf8(env, argv[0], NULL, 0, &length);
  if (length == 0 || length >= IFNAMSIZ) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "name must have 1 to 15 bytes");
    return NULL;
  }
  napi_get_value_string_utf8(env, argv[0], name, sizeof name, &length);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    dsrlb_throw_errno(env, "socket(AF_INET)", errno, name);
    return NULL;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, name, length);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
    int err = errno;
    close(fd);
    dsrlb_throw_errno(env, "ioctl(SIOCGIFFLAGS)", err, name);
    return NULL;
  }
  short flags = up ? (short)(ifr.ifr_flags | IFF_UP) : (short)(ifr.ifr_flags & ~IFF_UP);
  if (flags != ifr.ifr_flags) {
    ifr.ifr_flags = flags;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) {
      int err = errno;
      close(fd);
      dsrlb_throw_errno(env, "ioctl(SIOCSIFFLAGS)", err, name);
      return NULL;
    }
  }
  close(fd);
  return NULL;
}

// Called from packet_ring.c's module initialiser.
napi_status tun_device_init(napi_env env, napi_value exports) {
  napi_property_descriptor properties[] = {
      {"openTun", NULL, open_tun, NULL, NULL, NULL, napi_enumerable, NULL},
      {"tunWrite", NULL, tun_write, NULL, NULL, NULL, napi_enumerable, NULL},
      {"linkSetUp", NULL, link_set_up, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof properties / sizeof properties[0], properties);
}
