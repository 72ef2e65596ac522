// The raw sockets `dsrlb decap` reads tunnel packets from (native/src/raw_tunnel.c): IPv4 and IPv6
// sockets for protocol 4 (IPv4 inner) and 41 (IPv6 inner). A raw socket gets each datagram after
// the kernel reassembled its fragments, and while one is open the kernel no longer answers these
// protocols with ICMP protocol-unreachable / parameter-problem (it counts them as delivered). They
// are read with recvmsg, not with the raw-socket package's recvfrom: an IPv6 raw socket hands over
// the payload only, and the outer traffic class (its ECN mark, which RFC 6040 carries inside)
// comes as ancillary data that recvfrom drops.

import { constants as osConstants } from 'node:os';
import { IPPROTO_IPIP, IPPROTO_IPV6 } from './inner-packet.js';
import { loadNative, type TunnelSocketHandle } from '../io/native-binding.js';

/** An IPv4 datagram (and an IPv6 payload) is at most 65535 bytes: a larger buffer never truncates. */
const RECEIVE_BUFFER_BYTES = 65536;
/** SO_RCVBUF asked for (SO_RCVBUFFORCE past net.core.rmem_max): bursts wait here, not dropped. */
const SOCKET_RCVBUF_BYTES = 4 << 20;
/** Datagrams read per readiness event before the loop gets a turn (level-triggered: the rest wait). */
const RECEIVE_BATCH = 64;
/** recvTunnel's answer once the socket is drained (-EAGAIN, the platform's value). */
const DRAINED = -osConstants.errno.EAGAIN;

export interface TunnelSocketSpec {
  outerFamily: 4 | 6;
  /** 4 (IPv4 inner) or 41 (IPv6 inner). */
  protocol: number;
}

/** Which sockets a VIP set needs: inner IPv4 VIPs need protocol 4, IPv6 VIPs 41, each over both outer families. */
export function tunnelSocketSpecs(hasV4Vip: boolean, hasV6Vip: boolean, outerIpv6: boolean): TunnelSocketSpec[] {
  const specs: TunnelSocketSpec[] = [];
  const protocols = [...(hasV4Vip ? [IPPROTO_IPIP] : []), ...(hasV6Vip ? [IPPROTO_IPV6] : [])];
  for (const protocol of protocols) {
    specs.push({ outerFamily: 4, protocol });
    if (outerIpv6) specs.push({ outerFamily: 6, protocol });
  }
  return specs;
}

export interface TunnelSocket {
  readonly spec: TunnelSocketSpec;
  close(): void;
}

/**
 * Opens one raw socket, bound to `ifname` when given (SO_BINDTODEVICE: tunnel packets arriving
 * elsewhere are not read, and the kernel refuses them as before). `onPacket(buf, length, spec,
 * outerTrafficClass, source)` runs synchronously per datagram (the traffic class is -1 over IPv4,
 * whose header is in buf; source holds the outer source's bytes); buf and source are reused for
 * the next one. Throws when the socket cannot be opened
 * (EPERM without CAP_NET_RAW, EAFNOSUPPORT without IPv6).
 */
export function openTunnelSocket(
  spec: TunnelSocketSpec,
  ifname: string | undefined,
  onPacket: (buf: Buffer, length: number, spec: TunnelSocketSpec, outerTrafficClass: number, source: Uint8Array) => void,
  onError: (error: Error, spec: TunnelSocketSpec) => void,
): TunnelSocket {
  const native = loadNative();
  const what = `raw IPv${spec.outerFamily} socket for protocol ${spec.protocol}`;
  const buffer = Buffer.alloc(RECEIVE_BUFFER_BYTES);
  // [0] traffic class, [1] truncated, [2..5] the outer source address's bytes (`source`).
  const meta = new Int32Array(6);
  const source = new Uint8Array(meta.buffer, 8, 16);
  let handle: TunnelSocketHandle | null = null;
  let closed = false;
  const close = (): void => {
    if (closed) return;
    closed = true;
    if (handle !== null) native.closeTunnelSocket(handle);
  };
  const onReadable = (errno: number): void => {
    if (closed || handle === null) return;
    if (errno !== 0) {
      // A pending socket error (cleared): a datagram may have been lost, the socket goes on.
      return;
    }
    for (let i = 0; i < RECEIVE_BATCH; i++) {
      const length = native.recvTunnel(handle, buffer, meta);
      if (length === DRAINED) return;
      if (length < 0) {
        close();
        onError(new Error(`${what}: recvmsg failed (errno ${-length})`), spec);
        return;
      }
      // A datagram is at most 65535 bytes: one that did not fit is not a tunnel packet of ours.
      if (meta[1] === 1) continue;
      onPacket(buffer, length, spec, meta[0]!, source);
    }
  };
  try {
    handle = native.openTunnelSocket(spec.outerFamily, spec.protocol, ifname ?? null, SOCKET_RCVBUF_BYTES, onReadable);
  } catch (err) {
    throw new Error(`${what}: ${(err as Error).message}`);
  }
  return { spec, close };
}
