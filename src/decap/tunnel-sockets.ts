// The raw sockets `dsrlb decap` reads tunnel packets from (the `raw-socket` package): IPv4 and IPv6
// sockets for protocol 4 (IPv4 inner) and 41 (IPv6 inner). A raw socket gets each datagram after
// the kernel reassembled its fragments, and while one is open the kernel no longer answers these
// protocols with ICMP protocol-unreachable / parameter-problem (it counts them as delivered).

import { createRequire } from 'node:module';
import { IPPROTO_IPIP, IPPROTO_IPV6 } from './inner-packet.js';

/** The part of `raw-socket` used here; the package ships no types. */
interface RawSocket {
  on(event: 'error', listener: (error: Error) => void): this;
  setOption(level: number, option: number, value: number): void;
  setOption(level: number, option: number, value: Buffer, length: number): void;
  close(): this;
  /**
   * The native socket under the package's Socket (raw-socket 1.8 src/raw.cc): it emits
   * 'recvReady' when readable, and recv() reads one datagram with recvfrom into `buffer`, calls
   * back synchronously with its length, or throws Error(strerror(errno)).
   */
  readonly wrap: {
    on(event: 'recvReady', listener: () => void): void;
    removeAllListeners(event: 'recvReady'): void;
    recv(buffer: Buffer, callback: (buffer: Buffer, bytes: number, source: string) => void): void;
  };
}
interface RawSocketModule {
  createSocket(options: { protocol: number; addressFamily?: number; bufferSize?: number }): RawSocket;
  readonly AddressFamily: { readonly IPv4: number; readonly IPv6: number };
  readonly SocketLevel: { readonly SOL_SOCKET: number };
  readonly SocketOption: { readonly SO_RCVBUF: number; readonly SO_BINDTODEVICE: number };
}

const raw = createRequire(import.meta.url)('raw-socket') as RawSocketModule;

/** An IPv4 datagram (and an IPv6 payload) is at most 65535 bytes: a larger buffer never truncates. */
const RECEIVE_BUFFER_BYTES = 65536;
/** SO_RCVBUF asked for (the kernel caps it at net.core.rmem_max): bursts wait here, not dropped. */
const SOCKET_RCVBUF_BYTES = 4 << 20;
/** Datagrams read per readiness event before the loop gets a turn (level-triggered: the rest wait). */
const RECEIVE_BATCH = 64;
/** strerror(EAGAIN): how raw-socket reports that the socket has been drained. */
const DRAINED_MESSAGE = 'Resource temporarily unavailable';

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
 * elsewhere are not read, and the kernel refuses them as before). `onPacket(buf, length, spec)`
 * runs synchronously per datagram; buf is reused for the next one. Throws when the socket cannot
 * be opened (EPERM without CAP_NET_RAW, EAFNOSUPPORT without IPv6).
 */
export function openTunnelSocket(
  spec: TunnelSocketSpec,
  ifname: string | undefined,
  onPacket: (buf: Buffer, length: number, spec: TunnelSocketSpec) => void,
  onError: (error: Error, spec: TunnelSocketSpec) => void,
): TunnelSocket {
  // raw-socket's errors are bare strerror() texts: say which socket and which step.
  const what = `raw IPv${spec.outerFamily} socket for protocol ${spec.protocol}`;
  let socket: RawSocket;
  try {
    socket = raw.createSocket({
      protocol: spec.protocol,
      addressFamily: spec.outerFamily === 4 ? raw.AddressFamily.IPv4 : raw.AddressFamily.IPv6,
      // Unused: datagrams are read into `buffer` below.
      bufferSize: 1,
    });
  } catch (err) {
    throw new Error(`${what}: ${(err as Error).message}`);
  }
  try {
    socket.setOption(raw.SocketLevel.SOL_SOCKET, raw.SocketOption.SO_RCVBUF, SOCKET_RCVBUF_BYTES);
    if (ifname !== undefined) {
      const name = Buffer.from(`${ifname}\0`, 'latin1');
      try {
        socket.setOption(raw.SocketLevel.SOL_SOCKET, raw.SocketOption.SO_BINDTODEVICE, name, name.length);
      } catch (err) {
        throw new Error(`${what}: SO_BINDTODEVICE ${ifname}: ${(err as Error).message}`);
      }
    }
  } catch (err) {
    socket.close();
    throw err;
  }
  // The package reads one datagram per poll wake-up and slices a Buffer for each: draining up to
  // RECEIVE_BATCH per wake-up halved the CPU per packet and stopped receive-buffer drops at 70k pps.
  const buffer = Buffer.alloc(RECEIVE_BUFFER_BYTES);
  const onBytes = (_buffer: Buffer, length: number): void => onPacket(buffer, length, spec);
  socket.wrap.removeAllListeners('recvReady');
  socket.wrap.on('recvReady', () => {
    try {
      for (let i = 0; i < RECEIVE_BATCH; i++) socket.wrap.recv(buffer, onBytes);
    } catch (err) {
      if ((err as Error).message !== DRAINED_MESSAGE) onError(err as Error, spec);
    }
  });
  // raw-socket closes the socket after an error: the caller decides whether to go on without it.
  socket.on('error', (error) => onError(error, spec));
  let closed = false;
  return {
    spec,
    close: () => {
      if (closed) return;
      closed = true;
      socket.close();
    },
  };
}
