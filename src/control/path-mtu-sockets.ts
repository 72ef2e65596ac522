// Raw sockets that let the LB's kernel learn the path MTU toward IPIP reals. The packet loops write
// tunnel packets to a packet socket, so an ICMP fragmentation-needed (ICMPv6 packet-too-big) that a
// router between the LB and a real sends about one reaches the LB's kernel with nothing to take it,
// and is dropped: the tunnel went on sending what the path cannot carry, and TCP through it stalled
// on full-size segments (IPVS handles these itself in ip_vs_in_icmp). With a raw socket open for
// the outer packet's protocol, the kernel hands the error to it (raw_err, rawv6_err), which records
// the smaller MTU as a route exception toward the real (for net.ipv4.route.mtu_expires or
// net.ipv6.route.mtu_expires, 10 minutes). `ip route get REAL` reports it, and the daemon's route
// refresh makes it the real's tunnel MTU: from then on clients get fragmentation-needed
// (packet-too-big) from the LB for what does not fit. The kernel also reports the error on the
// socket (EMSGSIZE; for IPv6 because the socket is set to path MTU discovery "do"), which wakes
// the daemon to ask that route again at once instead of at its next 10 s refresh.
//
// One socket per real and protocol (4 inside IPv4; 41 and 4 inside IPv6, for IPv6 and IPv4 VIPs),
// bound to the tunnel's outer source and connected to the real: the kernel then hands it only
// errors quoting a packet from that source to that real (an unconnected one took errors about any
// destination, so that anyone could shrink the LB's path MTU toward its BGP peer or anything else
// for 10 minutes), and IPv6 takes errors only on a connected socket at all (rawv6_err). A socket
// filter drops every datagram: these sockets are held for the errors, never read.

import { constants } from 'node:os';
import { IPPROTO_IPIP, IPPROTO_IPV6 } from '../decap/inner-packet.js';
import { loadNative } from '../io/native-binding.js';
import type { Logger } from './logger.js';

/** One socket: outer family and protocol, the real it is connected to and the source it is bound to. */
export interface PathMtuSocketSpec {
  readonly outerFamily: 4 | 6;
  readonly protocol: number;
  readonly peer: string;
  /** The tunnel's outer source toward that real; null: the kernel's choice at connect. */
  readonly source: string | null;
}

/** An IPIP real and the outer source its tunnel packets leave from. */
export interface TunnelPeer {
  readonly address: string;
  readonly source: string | null;
}

export interface OpenSocket {
  close(): void;
}

/**
 * Opens one socket (the native raw socket in production; a fake in unit tests). Throws when it
 * cannot. `tooBig` is called when the kernel reports a too-big error about the socket's peer.
 */
export type PathMtuSocketOpener = (spec: PathMtuSocketSpec, tooBig: () => void) => OpenSocket;

/**
 * The native socket's callback: it sees only socket errors (each ICMP error about the real, as an
 * errno, cleared), of which only a too-big one (EMSGSIZE) changes the route's MTU; unreachable and
 * the like are the health checks' business.
 */
export function onTooBigOnly(tooBig: () => void): (errno: number) => void {
  return (errno) => {
    if (errno === constants.errno.EMSGSIZE) tooBig();
  };
}

const openNative: PathMtuSocketOpener = (spec, tooBig) => {
  const native = loadNative();
  const handle = native.openTunnelSocket(spec.outerFamily, spec.protocol, null, 0, onTooBigOnly(tooBig), { source: spec.source, peer: spec.peer, dropAll: true });
  return { close: () => native.closeTunnelSocket(handle) };
};

/** The sockets these tunnels need (see the top of this file). */
export function pathMtuSpecs(peers: Iterable<TunnelPeer>): PathMtuSocketSpec[] {
  const specs = new Map<string, PathMtuSocketSpec>();
  for (const { address, source } of peers) {
    const outerFamily = address.includes(':') ? 6 : 4;
    for (const protocol of outerFamily === 4 ? [IPPROTO_IPIP] : [IPPROTO_IPV6, IPPROTO_IPIP]) {
      const spec = { outerFamily, protocol, peer: address, source } as const;
      specs.set(keyOf(spec), spec);
    }
  }
  return [...specs.values()];
}

function keyOf(spec: PathMtuSocketSpec): string {
  return `${spec.outerFamily}/${spec.protocol} ${spec.source ?? '*'} > ${spec.peer}`;
}

export class PathMtuSockets {
  private readonly open = new Map<string, OpenSocket>();
  /** Sockets that could not be opened, warned about once until they open (or are no longer needed). */
  private readonly refused = new Set<string>();

  /**
   * @param onTooBig called with the real (peer) a router said a tunnel packet toward was too big
   *   for its path: the kernel has recorded the smaller MTU, for the daemon to ask the route again.
   */
  constructor(
    private readonly log: Pick<Logger, 'warn'>,
    private readonly opener: PathMtuSocketOpener = openNative,
    private readonly onTooBig: (peer: string) => void = () => {},
  ) {}

  /**
   * Opens the sockets these tunnels need and closes the others (a tunnel whose source changed gets
   * a new one). Never throws: what cannot be opened (no CAP_NET_RAW; ENETUNREACH, no route to the
   * real yet) is logged once, and tried again at the next sync.
   */
  sync(peers: Iterable<TunnelPeer>): void {
    const wanted = new Map(pathMtuSpecs(peers).map((s) => [keyOf(s), s]));
    for (const [key, socket] of this.open) {
      if (wanted.has(key)) continue;
      socket.close();
      this.open.delete(key);
    }
    for (const key of [...this.refused]) if (!wanted.has(key)) this.refused.delete(key);
    const failed: string[] = [];
    let error = '';
    for (const [key, spec] of wanted) {
      if (this.open.has(key)) continue;
      try {
        this.open.set(key, this.opener(spec, () => this.onTooBig(spec.peer)));
        this.refused.delete(key);
      } catch (err) {
        if (this.refused.has(key)) continue;
        this.refused.add(key);
        failed.push(key);
        error = (err as Error).message;
      }
    }
    if (failed.length > 0) {
      // One line for all (without CAP_NET_RAW every socket fails alike).
      this.log.warn("cannot open the raw sockets that let the kernel learn the path MTU toward IPIP reals: a router's fragmentation-needed about their tunnels is ignored", {
        sockets: failed.slice(0, 5),
        count: failed.length,
        error,
      });
    }
  }

  /** The sockets open now, as "outer family/protocol source > peer". */
  get openSockets(): string[] {
    return [...this.open.keys()];
  }

  close(): void {
    for (const socket of this.open.values()) socket.close();
    this.open.clear();
    this.refused.clear();
  }
}
