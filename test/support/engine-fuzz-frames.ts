// Seeded input for the engine fuzz (test/unit/engine-fuzz.test.ts): valid base frames of every kind
// the engine handles (TCP, UDP, ICMP echo and too-big messages, IP fragments, IPv6 extension
// headers, VLAN tags, virtio_net_hdr with partial checksums and GSO) and the mutations made to
// them. Everything is a pure function of the PRNG, so a seed names its frames.

import { FRAME_CSUM_PARTIAL, FRAME_GSO, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_UDP_L4 } from '../../src/io/packet-io.js';
import { mulberry32 } from './prng.js';
import {
  ETH_ARP,
  ETH_IPV4,
  ETH_IPV6,
  type ExtensionHeader,
  concat,
  ethernet,
  icmp,
  icmpEcho,
  icmpv6,
  ipv4,
  ipv6,
  ipv6Fragment,
  ipv6Options,
  onesSum,
  pseudoHeader,
  refreshIpv4Checksum,
  tcp,
  udp,
} from './packet-builder.js';
import { LB_MAC } from './test-net.js';

/** The addressing of the fuzz: VIPs of the services, addresses no service has, clients. */
export const FUZZ_NET = {
  vip4: '203.0.113.10',
  /** The VIP of the two services that drop: every real down, or no real with a known MAC. */
  vip4Drop: '203.0.113.20',
  vip6: '2001:db8:f::10',
  other4: '203.0.113.99',
  other6: '2001:db8:f::99',
  router4: '198.51.100.254',
  router6: '2001:db8:e::1',
} as const;

/** Ports the clients use: few, so that later packets of a flow find the entry an earlier one made. */
const CLIENT_PORTS = 48;
const CLIENT_HOSTS = 24;
const client4 = (i: number): string => `198.51.100.${1 + i}`;
const client6 = (i: number): string => `2001:db8:c::${(1 + i).toString(16)}`;

/** virtio_net_hdr fields (little-endian u16s, as the packet socket hands them on x86 and arm64). */
export const VNET = { flags: 0, gsoType: 1, hdrLen: 2, gsoSize: 4, csumStart: 6, csumOffset: 8 } as const;
export const VNET_NEEDS_CSUM = 1;
export const GSO_TCPV4 = 1;
export const GSO_UDP = 3;
export const GSO_TCPV6 = 4;
export const GSO_UDP_L4 = VIRTIO_NET_HDR_GSO_UDP_L4;
export const GSO_ECN = VIRTIO_NET_HDR_GSO_ECN;

export interface FuzzInput {
  /** The base kind, for failure messages and the path table. */
  kind: string;
  /** The Ethernet frame (what follows the virtio_net_hdr); its source MAC is set by the batch. */
  frame: Uint8Array;
  /** The virtio_net_hdr a vnet batch puts before the frame (zeros: no offload asked). */
  vnet: Uint8Array;
  /** The length the batch announces: shorter than frame.length when truncated. */
  length: number;
  /** FRAME_CSUM_PARTIAL / FRAME_GSO as tp_status says them in a batch without virtio_net_hdr. */
  statusFlags: number;
  /** Mutations made, in order (for failure messages). */
  mutations: string[];
}

export class Rng {
  private readonly next: () => number;
  constructor(seed: number) {
    this.next = mulberry32(seed);
  }
  float(): number {
    return this.next();
  }
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  bytes(n: number): Uint8Array {
    const b = new Uint8Array(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }
}

function put16le(b: Uint8Array, at: number, v: number): void {
  b[at] = v & 0xff;
  b[at + 1] = (v >> 8) & 0xff;
}

export function get16le(b: Uint8Array, at: number): number {
  return b[at]! | (b[at + 1]! << 8);
}

function payload(rng: Rng, n: number): Uint8Array {
  const b = new Uint8Array(Math.max(0, n));
  const k = rng.int(256);
  for (let i = 0; i < b.length; i++) b[i] = (i * 7 + k) & 0xff;
  return b;
}

/**
 * IP packet lengths: small ones, and every edge the paths care about: the IPv6 minimum MTU, the
 * route MTUs of the IPIP reals (1300, 1400) less 20 or 40 bytes of outer header, and the
 * interface's 1500 less the same.
 */
const EDGE_LENGTHS = [1259, 1260, 1261, 1265, 1270, 1275, 1279, 1280, 1281, 1299, 1300, 1301, 1359, 1360, 1361, 1379, 1380, 1381, 1399, 1400, 1401, 1459, 1460, 1461, 1479, 1480, 1481, 1499, 1500];

function ipLength(rng: Rng, min: number): number {
  const r = rng.float();
  const len = r < 0.55 ? min + rng.int(200) : r < 0.9 ? rng.pick(EDGE_LENGTHS) : min + rng.int(1500 - min + 1);
  return Math.max(min, len);
}

/** A client of the given family: mostly one of a few hosts, rarely a source that is no single host. */
function clientOf(rng: Rng, family: 4 | 6): string {
  if (rng.chance(0.01)) return family === 4 ? rng.pick(['255.255.255.255', '224.0.0.9', '0.0.0.0']) : rng.pick(['::', 'ff02::1']);
  return family === 4 ? client4(rng.int(CLIENT_HOSTS)) : client6(rng.int(CLIENT_HOSTS));
}

const clientPort = (rng: Rng): number => (rng.chance(0.85) ? 40000 + rng.int(CLIENT_PORTS) : 1024 + rng.int(64000));

const TCP_FLAG_SETS = [0x02, 0x02, 0x10, 0x18, 0x18, 0x11, 0x04, 0x12, 0x14, 0x19, 0xc2, 0x00, 0xff];

function tcpOptions(rng: Rng): Uint8Array {
  return rng.chance(0.3) ? Uint8Array.from([2, 4, 5, 0xb4, 4, 2, 1, 1, 1, 3, 3, 7]) : new Uint8Array(0);
}

function v6Extensions(rng: Rng): ExtensionHeader[] {
  const r = rng.float();
  if (r < 0.75) return [];
  if (r < 0.85) return [ipv6Options(0, [1, 2, 0, 0])];
  if (r < 0.93) return [ipv6Options(60, new Uint8Array(rng.int(14)))];
  // A type 0 routing header with no segments left, then destination options.
  const routing = new Uint8Array(8);
  routing[1] = 0;
  return [ipv6Options(0), { type: 43, bytes: routing }, ipv6Options(60)];
}

function frameOf(type: number, packet: Uint8Array, dst = LB_MAC): Uint8Array {
  return ethernet({ dst, src: '02:cc:00:00:00:00', type }, packet);
}

/** The L4 checksum field of a built IP packet set to the pseudo-header sum, as a CHECKSUM_PARTIAL sender leaves it. */
function makePartial(packet: Uint8Array, l4: number, proto: number, field: number, src: string, dst: string): void {
  const l4Length = proto === 17 ? (packet[l4 + 4]! << 8) | packet[l4 + 5]! : packet.length - l4;
  const sum = onesSum(pseudoHeader({ src, dst }, proto, l4Length));
  packet[l4 + field] = sum >> 8;
  packet[l4 + field + 1] = sum & 0xff;
}

interface L4Packet {
  packet: Uint8Array;
  family: 4 | 6;
  l3Header: number;
  l4Header: number;
  proto: number;
  src: string;
  dst: string;
}

/** A TCP or UDP packet from a client; its IP length drawn (ipLength) unless `payloadBytes` is given. */
function l4Packet(rng: Rng, family: 4 | 6, proto: 6 | 17, dst: string, dport: number, payloadBytes: number | null, opts: { df?: boolean; flags?: number } = {}): L4Packet {
  const src = clientOf(rng, family);
  const ext = family === 6 ? v6Extensions(rng) : [];
  const extBytes = ext.reduce((n, e) => n + (e.bytes as Uint8Array).length, 0);
  const options = proto === 6 ? tcpOptions(rng) : new Uint8Array(0);
  const l3Header = family === 4 ? 20 : 40 + extBytes;
  const l4Header = proto === 6 ? 20 + options.length : 8;
  // IPv6 packets of 1261-1280 bytes are what a tunnel MTU under 1320 carries in outer fragments (RFC 2473 7.1).
  const drawn = family === 6 && rng.chance(0.08) ? 1261 + rng.int(20) : ipLength(rng, l3Header + l4Header);
  const length = payloadBytes === null ? Math.max(drawn, l3Header + l4Header) : l3Header + l4Header + payloadBytes;
  const data = payload(rng, length - l3Header - l4Header);
  const ip = { src, dst };
  const segment =
    proto === 6
      ? tcp({ sport: clientPort(rng), dport, flags: opts.flags ?? rng.pick(TCP_FLAG_SETS), seq: rng.int(2 ** 32), ack: rng.int(2 ** 32), options }, data, ip)
      : udp({ sport: clientPort(rng), dport }, data, ip);
  const packet =
    family === 4
      ? ipv4({ src, dst, proto, df: opts.df ?? rng.chance(0.7), id: rng.int(0x10000), tos: rng.pick([0, 0, 0xb8, 0x02, 0x03]) }, segment)
      : ipv6({ src, dst, nextHeader: proto, extensionHeaders: ext, trafficClass: rng.pick([0, 0, 0xb8, 0x01]), flowLabel: rng.int(0x100000) }, segment);
  return { packet, family, l3Header, l4Header, proto, src, dst };
}

function plainInput(kind: string, frame: Uint8Array, statusFlags = 0, vnet = new Uint8Array(10)): FuzzInput {
  return { kind, frame, vnet, length: frame.length, statusFlags, mutations: [] };
}

/** A TCP or UDP packet to a service (or to a port/address none has), optionally with a partial checksum. */
function servicePacket(rng: Rng): FuzzInput {
  const r = rng.float();
  let family: 4 | 6;
  let proto: 6 | 17;
  let dst: string;
  let dport: number;
  let kind: string;
  if (r < 0.26) [family, proto, dst, dport, kind] = [4, 6, FUZZ_NET.vip4, 80, 'tcp4-web'];
  else if (r < 0.36) [family, proto, dst, dport, kind] = [4, 6, FUZZ_NET.vip4, rng.range(1, 65535), 'tcp4-any'];
  else if (r < 0.5) [family, proto, dst, dport, kind] = [4, 17, FUZZ_NET.vip4, rng.range(0, 65535), 'udp4-any'];
  else if (r < 0.7) [family, proto, dst, dport, kind] = [6, 6, FUZZ_NET.vip6, 443, 'tcp6-web'];
  else if (r < 0.84) [family, proto, dst, dport, kind] = [6, 17, FUZZ_NET.vip6, rng.range(0, 65535), 'udp6-any'];
  else if (r < 0.88) [family, proto, dst, dport, kind] = [4, 17, FUZZ_NET.vip4Drop, 53, 'udp4-all-down'];
  else if (r < 0.92) [family, proto, dst, dport, kind] = [4, 6, FUZZ_NET.vip4Drop, 22, 'tcp4-no-mac'];
  else if (r < 0.94) [family, proto, dst, dport, kind] = [6, 6, FUZZ_NET.vip6, 80, 'tcp6-no-service'];
  else if (r < 0.97) [family, proto, dst, dport, kind] = [4, 6, FUZZ_NET.other4, 80, 'tcp4-other-address'];
  else [family, proto, dst, dport, kind] = [6, 17, FUZZ_NET.other6, 53, 'udp6-other-address'];
  const p = l4Packet(rng, family, proto, dst, dport, null);
  const l2 = 14;
  const vnet = new Uint8Array(10);
  let statusFlags = 0;
  // A local or veth sender with checksum offload: the field holds the pseudo-header sum.
  if (rng.chance(0.3)) {
    const field = proto === 6 ? 16 : 6;
    makePartial(p.packet, p.l3Header, proto, field, p.src, p.dst);
    vnet[VNET.flags] = VNET_NEEDS_CSUM;
    put16le(vnet, VNET.csumStart, l2 + p.l3Header);
    put16le(vnet, VNET.csumOffset, field);
    statusFlags = FRAME_CSUM_PARTIAL;
    kind += '-partial';
  }
  return plainInput(kind, frameOf(family === 4 ? ETH_IPV4 : ETH_IPV6, p.packet), statusFlags, vnet);
}

/**
 * A GSO super-frame (TSO or UDP_SEGMENT) with its virtio_net_hdr: NEEDS_CSUM, the GSO type, hdr_len
 * and gso_size as the kernel fills them. Without a virtio_net_hdr (tp_status) it is just a frame
 * flagged GSO.
 */
function gsoPacket(rng: Rng): FuzzInput {
  const family: 4 | 6 = rng.chance(0.5) ? 4 : 6;
  const proto: 6 | 17 = rng.chance(0.7) ? 6 : 17;
  const dst = family === 4 ? FUZZ_NET.vip4 : FUZZ_NET.vip6;
  const dport = proto === 6 ? (family === 4 ? 80 : 443) : rng.range(1, 65535);
  const gsoSize = rng.pick([536, 1000, 1200, 1220, 1232, 1260, 1360, 1400, 1440, 1448, 1460, 1472]);
  const segments = rng.pick([1, 2, 2, 3, 3, 4, 5, 7, 11]);
  const payloadBytes = segments * gsoSize - (rng.chance(0.5) ? rng.int(gsoSize) : 0);
  const p = l4Packet(rng, family, proto, dst, dport, payloadBytes, { df: rng.chance(0.8), flags: rng.pick([0x10, 0x18, 0x19, 0x98]) });
  const headers = p.l3Header + p.l4Header;
  const field = proto === 6 ? 16 : 6;
  makePartial(p.packet, p.l3Header, proto, field, p.src, p.dst);
  const vnet = new Uint8Array(10);
  vnet[VNET.flags] = VNET_NEEDS_CSUM;
  vnet[VNET.gsoType] = (proto === 17 ? GSO_UDP_L4 : family === 4 ? GSO_TCPV4 : GSO_TCPV6) | (rng.chance(0.1) ? GSO_ECN : 0);
  put16le(vnet, VNET.hdrLen, 14 + headers);
  put16le(vnet, VNET.gsoSize, gsoSize);
  put16le(vnet, VNET.csumStart, 14 + p.l3Header);
  put16le(vnet, VNET.csumOffset, field);
  const kind = `gso-${proto === 6 ? 'tcp' : 'udp'}${family}`;
  return plainInput(kind, frameOf(family === 4 ? ETH_IPV4 : ETH_IPV6, p.packet), FRAME_CSUM_PARTIAL | (proto === 6 ? FRAME_GSO : 0), vnet);
}

/** Echo requests to a VIP (answered in place), to another address, and other ICMP types. */
function icmpPacket(rng: Rng): FuzzInput {
  const family: 4 | 6 = rng.chance(0.5) ? 4 : 6;
  const src = clientOf(rng, family);
  const r = rng.float();
  const dst = r < 0.75 ? (family === 4 ? rng.pick([FUZZ_NET.vip4, FUZZ_NET.vip4Drop]) : FUZZ_NET.vip6) : family === 4 ? FUZZ_NET.other4 : FUZZ_NET.other6;
  const data = payload(rng, rng.chance(0.8) ? rng.int(64) : rng.int(1400));
  // Others: echo replies, timestamps, redirects, parameter problems (no error about a flow), neighbour discovery.
  const type = rng.chance(0.85) ? (family === 4 ? 8 : 128) : rng.pick(family === 4 ? [0, 13, 5, 12] : [129, 4, 135, 136]);
  const rest = rng.int(2 ** 32);
  if (family === 4) {
    const msg = type === 8 ? icmpEcho({ id: rest >>> 16, seq: rest & 0xffff }, data) : icmp({ type, rest }, data);
    const options = rng.chance(0.05) ? [1, 1, 1, 0] : [];
    return plainInput(type === 8 ? 'echo4' : 'icmp4-other', frameOf(ETH_IPV4, ipv4({ src, dst, proto: 1, id: rng.int(0x10000), options }, msg)));
  }
  const ip = { src, dst };
  const ext = rng.chance(0.05) ? [ipv6Options(60)] : [];
  return plainInput(type === 128 ? 'echo6' : 'icmp6-other', frameOf(ETH_IPV6, ipv6({ src, dst, nextHeader: 58, extensionHeaders: ext, hopLimit: type >= 133 ? 255 : 64 }, icmpv6({ type, rest }, data, ip))));
}

/**
 * An ICMP error from a router about a reply a real sent from the VIP (VIP:port -> client:port):
 * fragmentation needed / Packet Too Big mostly, else destination unreachable or time exceeded.
 * The engine hands it to the real of that flow.
 */
function flowErrorMessage(rng: Rng): FuzzInput {
  const family: 4 | 6 = rng.chance(0.5) ? 4 : 6;
  const proto: 6 | 17 = rng.chance(0.6) ? 6 : 17;
  const vip = family === 4 ? rng.pick([FUZZ_NET.vip4, FUZZ_NET.vip4, FUZZ_NET.vip4Drop]) : FUZZ_NET.vip6;
  const client = family === 4 ? client4(rng.int(CLIENT_HOSTS)) : client6(rng.int(CLIENT_HOSTS));
  const vport = proto === 6 ? (family === 4 ? rng.pick([80, 80, 22, 8080]) : 443) : rng.pick([53, 443, 9999]);
  const ip = { src: vip, dst: client };
  const reply =
    proto === 6
      ? tcp({ sport: vport, dport: clientPort(rng), flags: 0x10, seq: 1, ack: 2 }, payload(rng, 1300), ip)
      : udp({ sport: vport, dport: clientPort(rng) }, payload(rng, 1300), ip);
  const quotedPacket =
    family === 4 ? ipv4({ src: vip, dst: client, proto, df: true }, reply) : ipv6({ src: vip, dst: client, nextHeader: proto, extensionHeaders: rng.chance(0.2) ? [ipv6Options(60)] : [] }, reply);
  // Routers quote 28 bytes (old), up to 576 in all (RFC 1812), up to 1280 in all for IPv6 (RFC 4443).
  const quoteBytes = family === 4 ? rng.pick([28, 48, 128, 548, 20 + rng.int(60)]) : rng.pick([48, 64, 128, 1232, 40 + rng.int(80)]);
  const quote = quotedPacket.subarray(0, Math.min(quoteBytes, quotedPacket.length));
  const r = rng.float();
  if (family === 4) {
    const [kind, type, code] = r < 0.65 ? ['frag-needed4', 3, 4] : r < 0.85 ? ['unreachable4', 3, rng.pick([0, 1, 3, 13])] : ['time-exceeded4', 11, rng.int(2)];
    const rest = code === 4 ? rng.pick([1280, 1400, 1450]) : 0;
    return plainInput(kind as string, frameOf(ETH_IPV4, ipv4({ src: FUZZ_NET.router4, dst: vip, proto: 1, df: rng.chance(0.5) }, icmp({ type: type as number, code: code as number, rest }, quote))));
  }
  const [kind, type, code] = r < 0.65 ? ['ptb6', 2, 0] : r < 0.85 ? ['unreachable6', 1, rng.int(5)] : ['time-exceeded6', 3, 0];
  const rest = type === 2 ? rng.pick([1280, 1400]) : 0;
  return plainInput(kind as string, frameOf(ETH_IPV6, ipv6({ src: FUZZ_NET.router6, dst: vip, nextHeader: 58 }, icmpv6({ type: type as number, code: code as number, rest }, quote, { src: FUZZ_NET.router6, dst: vip }))));
}

/** The fragments of one datagram to a VIP, in order, sometimes reordered or with the first missing. */
function fragmentedDatagram(rng: Rng): FuzzInput[] {
  const family: 4 | 6 = rng.chance(0.5) ? 4 : 6;
  const proto: 6 | 17 = rng.chance(0.4) ? 6 : 17;
  const dst = family === 4 ? FUZZ_NET.vip4 : FUZZ_NET.vip6;
  const src = clientOf(rng, family);
  const ip = { src, dst };
  const data = payload(rng, 100 + rng.int(2800));
  const dport = proto === 6 ? (family === 4 ? 80 : 443) : rng.range(1, 65535);
  const segment = proto === 6 ? tcp({ sport: clientPort(rng), dport, flags: 0x18, seq: 7 }, data, ip) : udp({ sport: clientPort(rng), dport }, data, ip);
  // The fragmentable part: for IPv6 sometimes destination options after the fragment header.
  let body = segment;
  let bodyProto: number = proto;
  if (family === 6 && rng.chance(0.25)) {
    const opts = ipv6Options(60).bytes as Uint8Array;
    opts[0] = proto;
    body = concat(opts, segment);
    bodyProto = 60;
  }
  const pieceBytes = rng.pick([8, 16, 64, 256, 512, 1232, 1440, 1480]);
  const id = rng.int(family === 4 ? 0x10000 : 2 ** 32);
  const df = family === 4 && rng.chance(0.2);
  const out: FuzzInput[] = [];
  for (let at = 0; at < body.length; at += pieceBytes) {
    const piece = body.subarray(at, Math.min(body.length, at + pieceBytes));
    const more = at + pieceBytes < body.length;
    const packet =
      family === 4
        ? ipv4({ src, dst, proto, id, mf: more, df, fragOffset: at }, piece)
        : ipv6({ src, dst, nextHeader: bodyProto, extensionHeaders: [ipv6Fragment({ offset: at, more, id })] }, piece);
    out.push(plainInput(`${at === 0 ? 'first' : 'later'}-fragment${family}`, frameOf(family === 4 ? ETH_IPV4 : ETH_IPV6, packet)));
    if (out.length === 6) break;
  }
  const r = rng.float();
  if (r < 0.15) out.shift(); // the first fragment lost: the later ones are unplaceable
  else if (r < 0.25) out.reverse();
  return out;
}

/** Frames that are no concern of the engine: ARP, another ethertype, a group destination MAC. */
function otherFrame(rng: Rng): FuzzInput {
  const r = rng.float();
  if (r < 0.4) return plainInput('arp', ethernet({ dst: 'ff:ff:ff:ff:ff:ff', src: '02:cc:00:00:00:00', type: ETH_ARP }, rng.bytes(28)));
  if (r < 0.6) return plainInput('lldp', ethernet({ dst: LB_MAC, src: '02:cc:00:00:00:00', type: 0x88cc }, rng.bytes(40)));
  const p = l4Packet(rng, 4, 6, FUZZ_NET.vip4, 80, null);
  return plainInput('group-mac', ethernet({ dst: rng.pick(['ff:ff:ff:ff:ff:ff', '01:00:5e:00:00:01', '33:33:00:00:00:01']), src: '02:cc:00:00:00:00', type: ETH_IPV4 }, p.packet));
}

/** An 802.1Q tag inserted after the MAC addresses; csum_start and hdr_len move with it, as the afpacket backend does. */
function withVlan(rng: Rng, input: FuzzInput): FuzzInput {
  const f = input.frame;
  const tci = rng.int(0x10000);
  const tagged = concat(f.subarray(0, 12), [0x81, 0x00, tci >> 8, tci & 0xff], f.subarray(12));
  const vnet = Uint8Array.from(input.vnet);
  if ((vnet[VNET.flags]! & VNET_NEEDS_CSUM) !== 0) put16le(vnet, VNET.csumStart, get16le(vnet, VNET.csumStart) + 4);
  if (vnet[VNET.gsoType] !== 0 && get16le(vnet, VNET.hdrLen) !== 0) put16le(vnet, VNET.hdrLen, get16le(vnet, VNET.hdrLen) + 4);
  return { ...input, kind: `${input.kind}+vlan`, frame: tagged, vnet, length: tagged.length };
}

/** One to six valid frames (a fragmented datagram gives several). */
export function baseFrames(rng: Rng): FuzzInput[] {
  const r = rng.float();
  let frames: FuzzInput[];
  if (r < 0.5) frames = [servicePacket(rng)];
  else if (r < 0.62) frames = [gsoPacket(rng)];
  else if (r < 0.72) frames = [icmpPacket(rng)];
  else if (r < 0.82) frames = [flowErrorMessage(rng)];
  else if (r < 0.95) frames = fragmentedDatagram(rng);
  else frames = [otherFrame(rng)];
  if (rng.chance(0.15)) frames = frames.map((f) => withVlan(rng, f));
  return frames;
}

/** A GSO frame with small segments (many of them): a batch of these uses up the extra frames. */
export function gsoStormFrame(rng: Rng): FuzzInput {
  const family: 4 | 6 = rng.chance(0.5) ? 4 : 6;
  const dst = family === 4 ? FUZZ_NET.vip4 : FUZZ_NET.vip6;
  const src = clientOf(rng, family);
  const gsoSize = rng.pick([96, 128, 200]);
  const seg = tcp({ sport: clientPort(rng), dport: family === 4 ? 80 : 443, flags: 0x18, seq: 1 }, payload(rng, gsoSize * 60), { src, dst });
  const packet = family === 4 ? ipv4({ src, dst, proto: 6, df: true, id: 1 }, seg) : ipv6({ src, dst, nextHeader: 6 }, seg);
  const vnet = new Uint8Array(10);
  vnet[VNET.gsoType] = family === 4 ? GSO_TCPV4 : GSO_TCPV6;
  put16le(vnet, VNET.hdrLen, 14 + (family === 4 ? 40 : 60));
  put16le(vnet, VNET.gsoSize, gsoSize);
  return plainInput(`gso-storm${family}`, frameOf(family === 4 ? ETH_IPV4 : ETH_IPV6, packet), FRAME_GSO, vnet);
}

/** Where the headers are in a frame, read loosely (a VLAN tag, the IPv4 IHL, a first IPv6 extension header). */
function layout(f: Uint8Array): { l2: number; family: number; l3Header: number; l4: number; proto: number; ext: number } {
  const l2 = f[12] === 0x81 && f[13] === 0x00 ? 18 : 14;
  const type = (f[l2 - 2]! << 8) | f[l2 - 1]!;
  if (type === ETH_IPV4 && f.length >= l2 + 20) {
    const ihl = (f[l2]! & 0x0f) * 4;
    return { l2, family: 4, l3Header: ihl, l4: l2 + ihl, proto: f[l2 + 9]!, ext: -1 };
  }
  if (type === ETH_IPV6 && f.length >= l2 + 40) {
    let nh = f[l2 + 6]!;
    let pos = l2 + 40;
    const ext = [0, 43, 44, 51, 60].includes(nh) ? pos : -1;
    for (let n = 0; n < 4 && [0, 43, 44, 51, 60].includes(nh) && pos + 8 <= f.length; n++) {
      const len = nh === 44 ? 8 : nh === 51 ? (f[pos + 1]! + 2) * 4 : (f[pos + 1]! + 1) * 8;
      nh = f[pos]!;
      pos += len;
    }
    return { l2, family: 6, l3Header: pos - l2, l4: pos, proto: nh, ext };
  }
  return { l2, family: 0, l3Header: 0, l4: l2, proto: -1, ext: -1 };
}

/**
 * Applies 1-3 seeded mutations to `input` in place (frame copy, virtio_net_hdr, announced length):
 * bit flips and byte overwrites in the header region, truncation at an interesting offset, length
 * fields set to 0 / small / off by one / huge, IHL, TCP data offset, IPv6 next header and
 * extension header length games, fragment fields, ICMP type and quote bytes, virtio_net_hdr
 * garbage (flags, gso_type, hdr_len, gso_size, csum_start, csum_offset), Ethernet padding. The
 * source MAC (bytes 6-11) is left alone: the batch names each frame's sender by it. The IPv4
 * header checksum is made right again most of the time, so that mutations reach past that check.
 */
export function mutate(rng: Rng, input: FuzzInput): void {
  let f: Uint8Array = Uint8Array.from(input.frame);
  const v = input.vnet;
  const L = layout(f);
  const ops = 1 + rng.int(3);
  for (let k = 0; k < ops; k++) {
    const op = rng.int(15);
    const headerEnd = Math.min(f.length, L.l4 + 24);
    const at = (): number => {
      let p = rng.int(Math.max(1, headerEnd));
      if (p >= 6 && p < 12) p = 12 + rng.int(Math.max(1, headerEnd - 12));
      return Math.min(p, f.length - 1);
    };
    switch (op) {
      case 0: {
        const p = at();
        f[p] ^= 1 << rng.int(8);
        input.mutations.push(`flip@${p}`);
        break;
      }
      case 1: {
        const p = at();
        f[p] = rng.pick([0, 0xff, rng.int(256)]);
        input.mutations.push(`byte@${p}=${f[p]}`);
        break;
      }
      case 2: {
        const l3 = L.l2;
        const cuts = [0, 1, 13, 14, L.l2 - 1, L.l2, l3 + 1, l3 + 19, l3 + 20, l3 + 39, l3 + 40, L.l4 - 1, L.l4, L.l4 + 3, L.l4 + 4, L.l4 + 7, L.l4 + 8, L.l4 + 12, L.l4 + 13, L.l4 + 19, L.l4 + 20, L.l4 + 27, L.l4 + 28, L.l4 + 47, L.l4 + 48, f.length - 1, f.length - 8, rng.int(f.length)];
        const cut = rng.pick(cuts.filter((c) => c >= 0 && c < f.length));
        if (cut !== undefined) {
          input.length = Math.min(input.length, cut);
          input.mutations.push(`truncate@${cut}`);
        }
        break;
      }
      case 3: {
        if (L.family === 4) {
          const actual = (f[L.l2 + 2]! << 8) | f[L.l2 + 3]!;
          const value = rng.pick([0, 1, 19, 20, L.l3Header - 1, L.l3Header, L.l3Header + 7, actual - 1, actual + 1, actual + 8, 0xffff, rng.int(0x10000)]) & 0xffff;
          f[L.l2 + 2] = value >> 8;
          f[L.l2 + 3] = value & 0xff;
          input.mutations.push(`ipv4-total-length=${value}`);
        } else if (L.family === 6) {
          const actual = (f[L.l2 + 4]! << 8) | f[L.l2 + 5]!;
          const value = rng.pick([0, 1, 7, 8, L.l3Header - 40, actual - 1, actual + 1, 0xffff, rng.int(0x10000)]) & 0xffff;
          f[L.l2 + 4] = value >> 8;
          f[L.l2 + 5] = value & 0xff;
          input.mutations.push(`ipv6-payload-length=${value}`);
        }
        break;
      }
      case 4: {
        if (L.family === 4) {
          f[L.l2] = 0x40 | rng.int(16);
          input.mutations.push(`ihl=${f[L.l2]! & 15}`);
        } else if (L.family === 6 && L.ext >= 0) {
          f[L.ext + 1] = rng.pick([0, 1, 2, 31, 255, rng.int(256)]);
          input.mutations.push(`ext-length=${f[L.ext + 1]}`);
        }
        break;
      }
      case 5: {
        if (L.family === 4) {
          const value = rng.pick([0x2000, 0x4000, 0x6000, 0x0001, 0x2001, rng.int(0x10000), 0x1fff]);
          f[L.l2 + 6] = value >> 8;
          f[L.l2 + 7] = value & 0xff;
          input.mutations.push(`ipv4-flags-offset=${value.toString(16)}`);
        } else if (L.family === 6) {
          if (f[L.l2 + 6] === 44) {
            const value = rng.pick([0, 1, 8, 9, 0xfff8, rng.int(0x10000)]);
            f[L.l2 + 42] = value >> 8;
            f[L.l2 + 43] = value & 0xff;
            input.mutations.push(`ipv6-fragment=${value.toString(16)}`);
          } else {
            f[L.l2 + 6] = 44;
            input.mutations.push('ipv6-next-header=44');
          }
        }
        break;
      }
      case 6: {
        const value = rng.pick([0, 1, 4, 6, 17, 41, 43, 44, 51, 58, 59, 60, rng.int(256)]);
        if (L.family === 4) f[L.l2 + 9] = value;
        else if (L.family === 6) f[L.ext >= 0 ? L.ext : L.l2 + 6] = value;
        input.mutations.push(`next-header=${value}`);
        break;
      }
      case 7: {
        if (L.l4 + 14 <= f.length && L.proto === 6) {
          f[L.l4 + 12] = (rng.int(16) << 4) | (f[L.l4 + 12]! & 0x0f);
          input.mutations.push(`tcp-data-offset=${f[L.l4 + 12]! >> 4}`);
        } else if (L.l4 + 8 <= f.length && L.proto === 17) {
          const actual = (f[L.l4 + 4]! << 8) | f[L.l4 + 5]!;
          const value = rng.pick([0, 7, 8, actual - 1, actual + 1, 0xffff, rng.int(0x10000)]) & 0xffff;
          f[L.l4 + 4] = value >> 8;
          f[L.l4 + 5] = value & 0xff;
          input.mutations.push(`udp-length=${value}`);
        }
        break;
      }
      case 8: {
        // ICMP: type and code, or bytes of the quoted header (where the flow key is read).
        if (L.l4 + 8 <= f.length && (L.proto === 1 || L.proto === 58)) {
          if (rng.chance(0.4)) {
            f[L.l4] = rng.pick([0, 2, 3, 8, 128, 129, 135, rng.int(256)]);
            f[L.l4 + 1] = rng.pick([0, 4, rng.int(256)]);
            input.mutations.push(`icmp-type=${f[L.l4]}/${f[L.l4 + 1]}`);
          } else {
            const p = Math.min(f.length - 1, L.l4 + 8 + rng.int(48));
            f[p] = rng.int(256);
            input.mutations.push(`icmp-quote@${p}`);
          }
        }
        break;
      }
      case 9:
      case 10: {
        const field = rng.int(6);
        if (field === 0) v[VNET.flags] = rng.pick([0, 1, 2, 3, rng.int(256)]);
        else if (field === 1) v[VNET.gsoType] = rng.pick([0, 1, 3, 4, 5, 0x80, 0x81, 0x84, 0x85, 6, rng.int(256)]);
        else put16le(v, 2 * field, rng.pick([0, 1, 7, 8, 9, 14, 54, 100, 1400, 65535, rng.int(0x10000)]));
        input.mutations.push(`vnet[${field}]`);
        break;
      }
      case 11: {
        const pad = rng.bytes(1 + rng.int(64));
        f = concat(f, pad);
        input.length = input.length === f.length - pad.length ? f.length : input.length;
        input.mutations.push(`pad+${pad.length}`);
        break;
      }
      case 12: {
        f[0] = rng.chance(0.5) ? f[0]! | 1 : rng.int(256) & 0xfe;
        input.mutations.push(`dst-mac0=${f[0]}`);
        break;
      }
      case 13: {
        const type = rng.pick([0x88a8, 0x8100, 0x0800, 0x86dd, 0x0806, rng.int(0x10000)]);
        f[L.l2 - 2] = type >> 8;
        f[L.l2 - 1] = type & 0xff;
        input.mutations.push(`ethertype=${type.toString(16)}`);
        break;
      }
      default: {
        // A few bytes anywhere in the packet (payload included: the quote of a too-big message).
        const p = 12 + rng.int(Math.max(1, f.length - 12));
        f[Math.min(p, f.length - 1)] = rng.int(256);
        input.mutations.push(`any@${p}`);
      }
    }
  }
  if (rng.chance(0.8)) {
    const l2 = f[12] === 0x81 && f[13] === 0x00 ? 18 : 14;
    if (f[l2 - 2] === 0x08 && f[l2 - 1] === 0x00) refreshIpv4Checksum(f, l2);
  }
  input.frame = f;
  input.length = Math.min(input.length, f.length);
}
