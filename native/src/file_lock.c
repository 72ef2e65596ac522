// flock(2) for src/control/instance-lock.ts, which Node's fs has no call for. Syscalls only: the
// lock file is opened, checked and closed in TypeScript; closing its fd drops the lock.
#include <errno.h>
#include <node_api.h>
#include <sys/file.h>

// packet_ring.c: an Error whose code is the errno name, errno negative, syscall set.
void dsrlb_throw_errno(napi_env env, const char* call, int err, const char* ifname);

// ---------------------------------------------------------------------------------------------
// lockFile(fd): an exclusive, non-blocking flock on fd. Returns true when taken, false when
// another open file description holds it (EWOULDBLOCK); throws for any other errno (EBADF, ENOLCK).
// The lock belongs to the open file description: a second open of the same file, even in this
// process, is refused, and the kernel drops it when the last fd of that description closes.

static napi_value lock_file(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], result;
  int32_t fd;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  if (argc < 1 || napi_get_value_int32(env, argv[0], &fd) != napi_ok) {
    napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", "lockFile(fd) takes a number");
    return NULL;
  }
  int r;
  do {
    r = flock(fd, LOCK_EX | LOCK_NB);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && errno != EWOULDBLOCK) {
    dsrlb_throw_errno(env, "flock", errno, NULL);
    return NULL;
  }
  napi_get_boolean(env, r == 0, &result);
  return result;
}

// Called from packet_ring.c's module initialiser.
napi_status file_lock_init(napi_env env, napi_value exports) {
  napi_property_descriptor properties[] = {
      {"lockFile", NULL, lock_file, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof properties / sizeof properties[0], properties);
}
