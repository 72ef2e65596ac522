// Raw sockets that let the LB's kernel learn the path MTU toward IPIP reals. The packet loops write
// tunnel packets to a packet socket, so an ICMP fragmentation-needed (ICMPv6 packet-too-big) that a
// router between the LB and a real sends about one reaches the LB's kernel with nothing to take it,
// and is dropped: the tunnel went on sending what the path cannot carry, and TCP through it stalled
// on full-size segments (IPVS handles these itself in ip_vs_in_icmp). With a raw socket open for
// the outer packet's protocol, the kernel hands the error to it (raw_err, rawv6_err), which records
// the smaller MTU as a route exception toward the real (for net.ipv4.route.mtu_expires, 10 minutes;
// IPv6 likewise). `ip route get REAL` reports it, and the daemon's route refresh (every 10 s) makes
// it the real's tunnel MTU: from then on clients get fragmentation-needed (packet-too-big) from the
// LB for what does not fit.
//
// IPv4 needs one socket for protocol 4, whatever the real. IPv6 takes the error only on a socket
// that is connected (rawv6_err returns before the MTU update unless the socket is connected or has
// IPV6_RECVERR, whose error queue would then have to be read): one socket per IPv6 real and
// protocol, 41 (IPv6 inside) and 4 (an IPv4 VIP's packets to an IPv6 real). The sockets are not for
// reading: what arrives on them (tunnel packets addressed to the LB itself) is drained and dropped.

import { IPPROTO_IPIP, IPPROTO_IPV6 } from '../decap/inner-packet.js';
import { openTunnelSocket, type TunnelSocket, type TunnelSocketSpec } from '../decap/tunnel-sockets.js';
import type { Logger } from './logger.js';

/** Enough for the odd datagram addressed to the LB itself; the kernel drops past it. */
const SOCKET_BUFFER_BYTES = 64 << 10;

/** One socket: its outer family and protocol, and the IPv6 real it is connected to (IPv4: none). */
export interface PathMtuSocketSpec extends TunnelSocketSpec {
  readonly peer: string | null;
}

/** Opens one socket (the native raw socket in production; a fake in unit tests). */
export type PathMtuSocketOpener = (spec: PathMtuSocketSpec, onError: (error: Error) => void) => TunnelSocket;

const openDrained: PathMtuSocketOpener = (spec, onError) =>
  openTunnelSocket(spec, undefined, () => {}, onError, { socketBufferBytes: SOCKET_BUFFER_BYTES, ...(spec.peer !== null ? { peer: spec.peer } : {}) });

/** The sockets IPIP reals at these addresses need (see the top of this file). */
export function pathMtuSpecs(realAddresses: Iterable<string>): PathMtuSocketSpec[] {
  const specs: PathMtuSocketSpec[] = [];
  let ipv4 = false;
  for (const address of new Set(realAddresses)) {
    if (!address.includes(':')) ipv4 = true;
    else specs.push({ outerFamily: 6, protocol: IPPROTO_IPV6, peer: address }, { outerFamily: 6, protocol: IPPROTO_IPIP, peer: address });
  }
  return ipv4 ? [{ outerFamily: 4, protocol: IPPROTO_IPIP, peer: null }, ...specs] : specs;
}

const keyOf = (spec: PathMtuSocketSpec): string => `${spec.outerFamily}/${spec.protocol}${spec.peer !== null ? ` ${spec.peer}` : ''}`;

export class PathMtuSockets {
  private readonly open = new Map<string, TunnelSocket>();
  /** Sockets that could not be opened, warned about once until they open (or are no longer needed). */
  private readonly refused = new Set<string>();

  constructor(
    private readonly log: Pick<Logger, 'warn'>,
    private readonly opener: PathMtuSocketOpener = openDrained,
  ) {}

  /** Opens the sockets the IPIP reals at these addresses need and closes the others. Never throws. */
  sync(ipipRealAddresses: Iterable<string>): void {
    const wanted = new Map(pathMtuSpecs(ipipRealAddresses).map((s) => [keyOf(s), s]));
    for (const [key, socket] of this.open) {
      if (wanted.has(key)) continue;
      socket.close();
      this.open.delete(key);
    }
    for (const key of [...this.refused]) if (!wanted.has(key)) this.refused.delete(key);
    for (const [key, spec] of wanted) {
      if (this.open.has(key)) continue;
      try {
        this.open.set(key, this.opener(spec, (error) => this.failed(key, error)));
        this.refused.delete(key);
      } catch (err) {
        if (this.refused.has(key)) continue;
        this.refused.add(key);
        this.log.warn("cannot open a raw socket that lets the kernel learn the path MTU toward IPIP reals: a router's fragmentation-needed about the tunnel is ignored", {
          socket: key,
          error: (err as Error).message,
        });
      }
    }
  }

  /** The sockets open now, as "outer family/protocol[ peer]". */
  get openSockets(): string[] {
    return [...this.open.keys()];
  }

  close(): void {
    for (const socket of this.open.values()) socket.close();
    this.open.clear();
    this.refused.clear();
  }

  /** A socket that failed reading (it closed itself): the next sync opens it again. */
  private failed(key: string, error: Error): void {
    this.open.delete(key);
    this.log.warn('a path-MTU raw socket failed; opened again at the next route refresh', { socket: key, error: error.message });
  }
}
