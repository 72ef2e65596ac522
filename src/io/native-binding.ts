// The whole surface of the native addon (native/src/*.c) as one TypeScript interface,
// and its loader. Nothing past this file sees an untyped value from the addon.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ADDON_RELATIVE_PATH = join('native', 'build', 'Release', 'dsrlb_native.node');
/** How many directories up from this module to look for native/build (src/io, dist/io, test builds). */
const ADDON_SEARCH_DEPTH = 8;

export interface OpenPacketSocketOptions {
  ifname: string;
  /** Multiple of the page size; one block holds many frames and must fit the largest (GSO) frame. */
  blockSizeBytes: number;
  blockCount: number;
  /** The kernel hands over a partly filled block after this long (0: the kernel's own default). */
  retireTimeoutMs: number;
  /** PACKET_RESERVE: writable headroom before each frame (before its virtio_net_hdr). At most 1024. */
  reserveBytes: number;
  /** PACKET_VNET_HDR: a 10-byte virtio_net_hdr precedes every received and every sent frame. */
  vnetHdr: boolean;
  /**
   * Join the existing PACKET_FANOUT group with this id (0..65535; HASH, no DEFRAG: fragments go
   * through as they are). Ids are shared by every program in the network namespace: join only a
   * group this program made (see fanoutNewGroup), or the kernel makes one under this id if none has it.
   */
  fanoutGroupId?: number;
  /**
   * Make a new PACKET_FANOUT group (as fanoutGroupId describes) under an id the kernel picks among
   * those no group uses (PACKET_FANOUT_FLAG_UNIQUEID, Linux >= 4.12); the handle's fanoutGroupId
   * tells which. Excludes fanoutGroupId.
   */
  fanoutNewGroup?: boolean;
  /** 3 (default): TPACKET_V3 blocks; 2: TPACKET_V2 fixed frames, each handed over at once. */
  ringVersion?: 2 | 3;
  /** V2: bytes per ring frame, a power of two >= 2048 dividing blockSizeBytes (default 2048). */
  frameSizeBytes?: number;
  /**
   * Take over this descriptor of a socket opened before (keepSocket) instead of opening one: its
   * ring, binding and fanout group as they are, with the frames queued in it. The ring options
   * must be those it was opened with; it must still be bound to `ifname` (else ENODEV). Excludes
   * the fanout options. The descriptor stays the caller's: the handle uses a copy of its own.
   */
  keptFd?: number;
}

export interface InterfaceInfo {
  ifindex: number;
  /** 6 bytes (SIOCGIFHWADDR). */
  mac: Uint8Array;
  mtu: number;
  /** ARPHRD_* (1: Ethernet, 772: loopback, 65534: none/tun). */
  hardwareType: number;
}

/** An open AF_PACKET ring socket. Only the addon creates these; pass them back unchanged. */
export interface PacketSocketHandle extends InterfaceInfo {
  readonly fd: number;
  readonly ifname: string;
  /** The whole mmap'ed RX ring (blockCount * blockSizeBytes), detached (empty) after close(). */
  readonly ring: ArrayBuffer;
  readonly blockSizeBytes: number;
  readonly blockCount: number;
  readonly ringVersion: 2 | 3;
  /** V2: bytes per frame slot (frames are contiguous: frame i at i * frameSizeBytes). */
  readonly frameSizeBytes: number;
  readonly frameCount: number;
  readonly vnetHdr: boolean;
  /** SO_SNDBUF of the sending socket (the kernel doubles what was asked: 16 MiB with privileges). */
  readonly sendBufferBytes: number;
  /** The PACKET_FANOUT group the socket is in (getsockopt), null when it was opened without one, or taken over (keptFd). */
  readonly fanoutGroupId: number | null;
}

/** PACKET_STATISTICS since the previous call: the kernel resets them on each read. */
export interface PacketSocketStats {
  /** Frames the socket accepted, including the dropped ones. */
  packets: number;
  /** Frames dropped because no block was free (the ring was full). */
  drops: number;
  freezeQueueCount: number;
}

/**
 * Byte offsets inside a ring frame that both ring versions have (tpacket2_hdr or tpacket3_hdr, then
 * sockaddr_ll), taken from the kernel headers at build time. The TPACKET_V2 layout is just this.
 */
export interface FrameLayout {
  frameStatus: number;
  frameLen: number;
  frameSnaplen: number;
  frameMac: number;
  frameVlanTci: number;
  frameVlanTpid: number;
  framePacketType: number;
  frameHeaderBytes: number;
}

/** The TPACKET_V3 layout: a block's header, and its frames' (which also chain and point at L3). */
export interface RingLayout extends FrameLayout {
  blockStatus: number;
  blockNumPackets: number;
  blockFirstPacket: number;
  /** The block's sequence number (a u64; the kernel numbers blocks as it opens them). */
  blockSeqNum: number;
  frameNextOffset: number;
  frameNet: number;
}

/** Errors thrown by the addon for a failed syscall: code is the errno name ('EPERM', 'ENODEV'). */
export interface NativeSystemError extends Error {
  code: string;
  /** Negative errno, as in Node's own system errors. */
  errno: number;
  syscall: string;
}

export interface DsrlbNative {
  /**
   * Throws a NativeSystemError; one whose syscall is 'setsockopt(PACKET_FANOUT)' when the kernel
   * refused the fanout group (EOPNOTSUPP: a kernel before 4.12 ignored PACKET_FANOUT_FLAG_UNIQUEID).
   */
  openPacketSocket(options: OpenPacketSocketOptions): PacketSocketHandle;
  /**
   * sendmmsg of frames [first, count) whose bytes lie in the ring at offsets[i], lengths[i]
   * (including the virtio_net_hdr when the socket has vnetHdr). Returns how many were sent from
   * `first`; fewer means a transient refusal (EAGAIN/ENOBUFS) at the next frame, or a hard error
   * there that the next call starting at it throws. Throws when nothing could be sent.
   */
  send(handle: PacketSocketHandle, offsets: Int32Array, lengths: Int32Array, count: number, first?: number): number;
  /** Like send(), for frames that live in `buf`. */
  sendCopy(
    handle: PacketSocketHandle,
    buf: Uint8Array,
    offsets: Int32Array,
    lengths: Int32Array,
    count: number,
    first?: number,
  ): number;
  /**
   * Calls `callback(0)` on the loop thread whenever the ring has frames for user space (a V3 block,
   * V2 frames), and `callback(errno)` after a socket error (which is cleared; polling goes on).
   * Replaces an earlier callback.
   */
  startPolling(handle: PacketSocketHandle, callback: (errno: number) => void): void;
  /**
   * V2: reads the next frame of the socket queue (a ring frame marked TP_STATUS_COPY, whole) into
   * buf at offset, virtio_net_hdr first. Returns its length, -1 if the queue is empty, or minus its
   * length if it did not fit (consumed anyway).
   */
  recvCopy(handle: PacketSocketHandle, buf: Uint8Array, offset: number): number;
  stopPolling(handle: PacketSocketHandle): void;
  stats(handle: PacketSocketHandle): PacketSocketStats;
  /** Stops polling, detaches handle.ring, unmaps and closes. Idempotent. */
  close(handle: PacketSocketHandle): void;
  /**
   * A second descriptor (close-on-exec) of the RX socket, for another thread to hold: the socket,
   * its ring and its fanout membership live while it is open, and openPacketSocket's keptFd takes
   * it over. Closed by whoever holds it (fs.closeSync).
   */
  keepSocket(handle: PacketSocketHandle): number;
  interfaceInfo(ifname: string): InterfaceInfo;
  /** Runs the calling thread on `cpu` only (sched_setaffinity of this thread). */
  pinThread(cpu: number): void;
  /** FD_CLOEXEC on every descriptor above 2 (close_range, else /proc/self/fd): none leaks into a spawned command. */
  closeOnExecAll(): void;
  /** One sd_notify(3) datagram (`state`, e.g. "READY=1") to $NOTIFY_SOCKET (a path or "@abstract"): 0 or -errno. */
  sdNotify(socketPath: string, state: string): number;
  readonly layout: RingLayout;
  readonly layoutV2: FrameLayout;
  /**
   * Opens /dev/net/tun as IFF_TUN | IFF_NO_PI device `name` ("%d" is numbered by the kernel): each
   * read or write is one bare IP packet. The device (unless persistent) goes when the fd is closed
   * (fs.closeSync). The fd is blocking and close-on-exec. Throws a NativeSystemError.
   */
  openTun(name: string): TunDevice;
  /** One write(2) of buf[offset, offset + length) to a TUN fd. Returns the bytes written or -errno. */
  tunWrite(fd: number, buf: Uint8Array, offset: number, length: number): number;
  /** IFF_UP on or off for device `name` (SIOCSIFFLAGS, as `ip link set up|down`). Throws a NativeSystemError. */
  linkSetUp(name: string, up: boolean): void;
  /**
   * A raw socket for tunnel protocol `protocol` over outer IPv4 or IPv6 (native/src/raw_tunnel.c):
   * non-blocking, close-on-exec, SO_RCVBUF(FORCE) `receiveBufferBytes` (0: the default), bound to `ifname` unless
   * null, IPV6_RECVTCLASS on for IPv6. `callback(0)` runs on the loop thread whenever it is
   * readable, `callback(errno)` after a socket error (cleared; polling goes on). `options.source` /
   * `options.peer`: bound to that local address and connected to that one (datagrams and ICMP errors
   * between exactly those two); `options.dropAll`: a socket filter that queues no datagram. Throws a
   * NativeSystemError.
   */
  openTunnelSocket(
    family: 4 | 6,
    protocol: number,
    ifname: string | null,
    receiveBufferBytes: number,
    callback: (errno: number) => void,
    options?: { source?: string | null; peer?: string | null; dropAll?: boolean },
  ): TunnelSocketHandle;
  /**
   * One datagram into buf (recvmsg): its length, or -errno (-EAGAIN once drained). meta[0] = the
   * IPv6 outer traffic class, or -1; meta[1] = 1 when it did not fit buf.
   */
  recvTunnel(handle: TunnelSocketHandle, buf: Uint8Array, meta: Int32Array): number;
  /** Stops readiness and closes the socket. Idempotent. */
  closeTunnelSocket(handle: TunnelSocketHandle): void;
  /**
   * Sends whole Ethernet frames (14 to 65535 bytes each, no FCS) out of interface `ifindex`, as
   * they are, from a packet socket opened for the call and closed after it (native/src/frame_send.c):
   * for the control plane's occasional frames, never the packet loops'. Non-blocking: returns how
   * many went, from the first; fewer means the kernel had no room (EAGAIN/ENOBUFS) for the next.
   * Throws a NativeSystemError for any other refusal (ENETDOWN: interface down; ENXIO: no
   * interface has that index now); frames before it went out.
   */
  sendFrames(ifindex: number, frames: readonly Uint8Array[]): number;
  /**
   * An exclusive, non-blocking flock(2) on `fd` (native/src/file_lock.c): true when taken, false
   * when another open file description holds it (EWOULDBLOCK), even one of this process. Held until
   * the last fd of this open file description closes (fs.closeSync, or the process dying). Throws a
   * NativeSystemError for any other refusal (EBADF, ENOLCK).
   */
  lockFile(fd: number): boolean;
}

/** An open tunnel raw socket. Only the addon creates these; pass them back unchanged. */
export interface TunnelSocketHandle {
  readonly fd: number;
}

/** An open TUN device (native/src/tun_device.c). */
export interface TunDevice {
  readonly fd: number;
  /** The kernel's name for it (differs from the requested one only when that held "%d"). */
  readonly name: string;
}

let loaded: DsrlbNative | undefined;

function findAddon(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < ADDON_SEARCH_DEPTH; i++) {
    const candidate = join(dir, ADDON_RELATIVE_PATH);
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  const error = new Error(
    `dsrlb native addon not found (${ADDON_RELATIVE_PATH} above ${fileURLToPath(import.meta.url)}): run npm run build:native`,
  ) as Error & { code: string };
  error.code = 'ERR_DSRLB_NATIVE_MISSING';
  throw error;
}

/** Loads the addon once per thread (it is context-aware, so worker threads load their own). */
export function loadNative(): DsrlbNative {
  if (loaded === undefined) {
    const require = createRequire(import.meta.url);
    loaded = require(findAddon()) as DsrlbNative;
  }
  return loaded;
}

/** True for an error thrown by the addon for a failed syscall. */
export function isNativeSystemError(error: unknown): error is NativeSystemError {
  return (
    error instanceof Error &&
    typeof (error as Partial<NativeSystemError>).code === 'string' &&
    typeof (error as Partial<NativeSystemError>).syscall === 'string'
  );
}
