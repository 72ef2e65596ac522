// Packet vectors for parseFrame(): a named input frame, the verdict and the fields the parser must
// fill; then systematic truncations, slot reuse and a seeded mutation fuzz.

import { describe, expect, it } from 'vitest';
import ipaddr from 'ipaddr.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { IPV6_MAX_EXTENSION_HEADERS, parseFrame } from '../../src/dataplane/packet-parser.js';
import { mulberry32 } from '../support/prng.js';
import {
  ETHERTYPE_ARP,
  ETHERTYPE_IPV4,
  ETHERTYPE_IPV6,
  ETHERTYPE_VLAN,
  PARSE_NOT_IP,
  PARSE_OK,
  ParsedPacket,
  TCP_ACK,
  TCP_PSH,
  TCP_SYN,
} from '../../src/dataplane/parsed-packet.js';
import {
  type ExtensionHeader,
  ETH_ARP,
  ETH_IPV4,
  ETH_IPV6,
  concat,
  ethernet,
  fromHex,
  icmp,
  icmpEcho,
  icmpv6,
  ipv4,
  ipv6,
  ipv6Fragment,
  ipv6Options,
  patch,
  refreshIpv4Checksum,
  tcp,
  udp,
} from '../support/packet-builder.js';

const MACS = { dst: '02:00:00:00:00:02', src: '02:00:00:00:00:01' };
const V4 = { src: '10.0.0.1', dst: '10.0.0.100' };
const V6 = { src: '2001:db8::1', dst: '2001:db8::100' };
const SYN_OPTIONS = fromHex('020405b4 0402 080a 00098f2e 00000000 01 030307'); // MSS, SACK-OK, TS, NOP, WS 7

/** A TCP SYN from 192.168.1.10:54321 to 10.0.0.100:80 as Linux sends it; checksums are literals. */
const SYN_V4 = fromHex(`
  020000000002 020000000001 0800                  # Ethernet: dst, src, IPv4
  4500 003c 1c46 4000 4006 5260 c0a8010a 0a000064  # IPv4: DF, TTL 64, TCP, checksum 0x5260
  d431 0050 3a5f1c07 00000000 a002 faf0 c6d9 0000  # TCP: 54321 -> 80, SYN, checksum 0xc6d9
  020405b4 0402 080a 00098f2e 00000000 01 030307   # options: MSS 1460, SACK-OK, TS, NOP, WS 7
`);

/** An ARP who-has 10.0.0.100 from 10.0.0.1. */
const ARP_REQUEST = fromHex(`
  ffffffffffff 020000000001 0806
  0001 0800 06 04 0001 020000000001 0a000001 000000000000 0a000064
`);

// ---- frames used by several tests -------------------------------------------------------------

const tcpV4 = (payload = 'hello', h: Partial<Parameters<typeof tcp>[0]> = {}) =>
  ipv4({ ...V4, proto: 6 }, tcp({ sport: 40000, dport: 80, flags: TCP_ACK | TCP_PSH, seq: 1, ack: 2, ...h }, payload, V4));
const tcpV6 = (payload = 'hello', ext: ExtensionHeader[] = []) =>
  ipv6({ ...V6, nextHeader: 6, extensionHeaders: ext }, tcp({ sport: 40000, dport: 443, flags: TCP_ACK, options: SYN_OPTIONS }, payload, V6));
const frame4 = (ip: Uint8Array, vlan?: number) => ethernet({ ...MACS, type: ETH_IPV4, vlan }, ip);
const frame6 = (ip: Uint8Array, vlan?: number) => ethernet({ ...MACS, type: ETH_IPV6, vlan }, ip);

const hbhDestFrag: ExtensionHeader[] = [
  ipv6Options(0, [0x05, 0x02, 0x00, 0x00]), // router alert, padded to 8 bytes
  ipv6Options(60, new Uint8Array(12)), // 12 bytes of Pad1-like zeros: 16 bytes in all
  ipv6Fragment({ offset: 0, more: true, id: 0xdeadbeef }),
];
const TCP_V6_EXT = frame6(tcpV6('x'.repeat(100), hbhDestFrag));
const TCP_V4_VLAN = frame4(tcpV4('abc'), 0x2064);
const TCP_V6_VLAN = frame6(tcpV6('abc'), 100);

/** An AH header carrying a 96-bit ICV: 24 bytes, length field 24/4 - 2 = 4. */
const AH: ExtensionHeader = { type: 51, bytes: fromHex('00 04 0000 00000100 00000001 000102030405060708090a0b') };
/** A segment-routing header with one segment: 24 bytes, length field 2. */
const ROUTING: ExtensionHeader = { type: 43, bytes: fromHex('00 02 04 00 00 000000 20010db8000000000000000000000100') };

// ---- the vector table -------------------------------------------------------------------------

type Fields = ReturnType<typeof snapshot>;
interface Vector {
  name: string;
  frame: Uint8Array;
  verdict: number;
  /** Expected fields; offsets relative to the frame's first byte. */
  expect?: Partial<Fields>;
}

const OK = PARSE_OK;
const bad = (reason: keyof typeof DropReason) => -DropReason[reason];

const vectors: Vector[] = [
  {
    name: 'A TCP SYN over IPv4 (a literal frame as Linux sends it) yields its ports, flags, DF and 40-byte TCP header',
    frame: SYN_V4,
    verdict: OK,
    expect: {
      vlanTci: -1, etherType: ETHERTYPE_IPV4, family: 4, l3Offset: 14, l3HeaderLength: 20, l3End: 74, l4Offset: 34,
      ipProtocol: 6, trafficClass: 0, ttl: 64, dontFragment: 1, isFragment: 0, fragmentOffset: 0, moreFragments: 0,
      fragmentId: 0, src: '192.168.1.10', dst: '10.0.0.100', srcPort: 54321, dstPort: 80, tcpFlags: TCP_SYN,
      icmpType: -1, icmpCode: -1, payloadOffset: 74,
    },
  },
  {
    name: 'IPv4 with a router-alert option (IHL 6) puts the UDP header 24 bytes after the IP header start',
    frame: frame4(ipv4({ ...V4, proto: 17, tos: 0xb8, ttl: 3, options: [0x94, 0x04, 0x00, 0x00] }, udp({ sport: 5000, dport: 53 }, 'q', V4))),
    verdict: OK,
    expect: { l3HeaderLength: 24, l4Offset: 38, l3End: 14 + 24 + 9, trafficClass: 0xb8, ttl: 3, dontFragment: 0, srcPort: 5000, dstPort: 53, payloadOffset: 46 },
  },
  {
    name: 'IPv4 with the largest header (IHL 15, 40 bytes of options) still finds TCP at offset 14 + 60',
    frame: frame4(ipv4({ ...V4, proto: 6, options: new Uint8Array(40).fill(1) }, tcp({ sport: 1, dport: 2, flags: TCP_SYN }, '', V4))),
    verdict: OK,
    expect: { l3HeaderLength: 60, l4Offset: 74, payloadOffset: 94, l3End: 94, srcPort: 1, dstPort: 2 },
  },
  {
    name: 'A VLAN-tagged (PCP 1, VID 100) IPv4 UDP frame reports the TCI and shifts every offset by 4',
    frame: frame4(ipv4({ ...V4, proto: 17 }, udp({ sport: 5000, dport: 6000 }, 'ping', V4)), 0x2064),
    verdict: OK,
    expect: { vlanTci: 0x2064, etherType: ETHERTYPE_IPV4, l3Offset: 18, l4Offset: 38, l3End: 50, payloadOffset: 46, srcPort: 5000, dstPort: 6000, tcpFlags: 0 },
  },
  {
    name: 'IPv6 TCP with traffic class EF and hop limit 63 fills all eight address words',
    frame: frame6(ipv6({ ...V6, nextHeader: 6, trafficClass: 0xb8, hopLimit: 63, flowLabel: 0x12345 }, tcp({ sport: 40000, dport: 443, flags: TCP_SYN }, '', V6))),
    verdict: OK,
    expect: {
      etherType: ETHERTYPE_IPV6, family: 6, l3Offset: 14, l3HeaderLength: 40, l4Offset: 54, l3End: 74, ipProtocol: 6,
      trafficClass: 0xb8, ttl: 63, dontFragment: 1, isFragment: 0, src: '2001:db8::1', dst: '2001:db8::100',
      srcPort: 40000, dstPort: 443, tcpFlags: TCP_SYN, payloadOffset: 74,
    },
  },
  {
    name: 'IPv6 with hop-by-hop, destination options and a first-fragment header walks 32 bytes of extensions to TCP',
    frame: TCP_V6_EXT,
    verdict: OK,
    expect: {
      l3HeaderLength: 40 + 8 + 16 + 8, l4Offset: 14 + 72, ipProtocol: 6, isFragment: 1, moreFragments: 1, fragmentOffset: 0,
      fragmentId: 0xdeadbeef, srcPort: 40000, dstPort: 443, tcpFlags: TCP_ACK, payloadOffset: 14 + 72 + 40,
    },
  },
  {
    name: 'An IPv6 UDP first fragment is parsed to its ports although its UDP length covers the whole datagram',
    frame: frame6(ipv6({ ...V6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 0, more: true, id: 7 })] },
      patch(udp({ sport: 4500, dport: 4500 }, new Uint8Array(1000), V6), 4, 0x0b, 0xb8))), // UDP length 3000
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 1, fragmentOffset: 0, fragmentId: 7, ipProtocol: 17, l3HeaderLength: 48, l4Offset: 62, srcPort: 4500, dstPort: 4500, payloadOffset: 70 },
  },
  {
    name: 'An IPv6 UDP non-first fragment has no L4 header: ports 0, l4Offset -1, protocol from the fragment header',
    frame: frame6(ipv6({ ...V6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 1448, more: false, id: 7 })] }, new Uint8Array(600).fill(0xab))),
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 0, fragmentOffset: 1448, fragmentId: 7, ipProtocol: 17, l3HeaderLength: 48, l4Offset: -1, srcPort: 0, dstPort: 0, payloadOffset: -1 },
  },
  {
    name: 'An IPv6 atomic fragment (offset 0, no more fragments) is a fragment whose L4 header is parsed',
    frame: frame6(ipv6({ ...V6, nextHeader: 6, extensionHeaders: [ipv6Fragment({ offset: 0, more: false, id: 9 })] }, tcp({ sport: 7, dport: 8, flags: TCP_ACK }, '', V6))),
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 0, fragmentOffset: 0, fragmentId: 9, l4Offset: 62, srcPort: 7, dstPort: 8 },
  },
  {
    name: 'An IPv4 non-first fragment reports offset in bytes, MF and the id, and no ports',
    frame: frame4(ipv4({ ...V4, proto: 17, id: 0x4242, mf: true, fragOffset: 1480 }, new Uint8Array(200).fill(0x55))),
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 1, fragmentOffset: 1480, fragmentId: 0x4242, ipProtocol: 17, l4Offset: -1, srcPort: 0, dstPort: 0, payloadOffset: -1, l3End: 234 },
  },
  {
    name: 'An IPv4 last fragment (MF clear, offset set) is still a fragment',
    frame: frame4(ipv4({ ...V4, proto: 6, id: 1, fragOffset: 8 }, new Uint8Array(16))),
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 0, fragmentOffset: 8, fragmentId: 1, l4Offset: -1 },
  },
  {
    name: 'An IPv4 UDP first fragment is parsed to its ports although its UDP length exceeds the fragment',
    frame: frame4(ipv4({ ...V4, proto: 17, id: 3, mf: true }, patch(udp({ sport: 1, dport: 2 }, new Uint8Array(64), V4), 4, 0x0f, 0xa0))),
    verdict: OK,
    expect: { isFragment: 1, moreFragments: 1, fragmentOffset: 0, fragmentId: 3, l4Offset: 34, srcPort: 1, dstPort: 2 },
  },
  {
    name: 'An ICMP echo request yields type 8, code 0, no ports and the payload after the 4-byte header',
    frame: frame4(ipv4({ ...V4, proto: 1 }, icmpEcho({ id: 0x1234, seq: 1 }, 'abcd'))),
    verdict: OK,
    expect: { ipProtocol: 1, icmpType: 8, icmpCode: 0, srcPort: 0, dstPort: 0, tcpFlags: 0, l4Offset: 34, payloadOffset: 38 },
  },
  {
    name: 'An ICMP destination unreachable / fragmentation needed yields type 3 code 4',
    frame: frame4(ipv4({ ...V4, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, tcpV4().subarray(0, 28)))),
    verdict: OK,
    expect: { icmpType: 3, icmpCode: 4, payloadOffset: 38 },
  },
  {
    name: 'An ICMPv6 packet too big carrying the start of a TCP packet yields type 2 code 0',
    frame: frame6(ipv6({ ...V6, nextHeader: 58 }, icmpv6({ type: 2, code: 0, rest: 1280 }, tcpV6().subarray(0, 80), V6))),
    verdict: OK,
    expect: { ipProtocol: 58, icmpType: 2, icmpCode: 0, l4Offset: 54, payloadOffset: 58, srcPort: 0 },
  },
  {
    name: 'ICMP protocol 1 inside IPv6 is not ICMPv6: an unknown protocol with no type',
    frame: frame6(ipv6({ ...V6, nextHeader: 1 }, icmpEcho({ id: 1, seq: 1 }))),
    verdict: OK,
    expect: { ipProtocol: 1, icmpType: -1, l4Offset: 54, payloadOffset: -1 },
  },
  {
    name: 'GRE over IPv4 parses with the L4 offset set and ports 0',
    frame: frame4(ipv4({ ...V4, proto: 47 }, new Uint8Array(4))),
    verdict: OK,
    expect: { ipProtocol: 47, l4Offset: 34, srcPort: 0, dstPort: 0, payloadOffset: -1, icmpType: -1 },
  },
  {
    name: 'IPIP (an inner IPv4 packet) parses as protocol 4 with l4Offset at the inner header',
    frame: frame4(ipv4({ src: '192.0.2.1', dst: '192.0.2.2', proto: 4 }, tcpV4())),
    verdict: OK,
    expect: { ipProtocol: 4, l4Offset: 34, src: '192.0.2.1', dst: '192.0.2.2', srcPort: 0 },
  },
  {
    name: 'IPv6 with No Next Header (59) after destination options stops with protocol 59 and no L4 header',
    frame: frame6(ipv6({ ...V6, nextHeader: 59, extensionHeaders: [ipv6Options(60)] }, new Uint8Array(10))),
    verdict: OK,
    expect: { ipProtocol: 59, l3HeaderLength: 48, l4Offset: -1, payloadOffset: -1 },
  },
  {
    name: 'IPv6 with an AH header (length in 4-byte units plus 2) reaches TCP 24 bytes later',
    frame: frame6(tcpV6('', [AH])),
    verdict: OK,
    expect: { l3HeaderLength: 64, l4Offset: 78, ipProtocol: 6, dstPort: 443 },
  },
  {
    name: 'IPv6 with a routing header reaches TCP after it',
    frame: frame6(tcpV6('', [ROUTING])),
    verdict: OK,
    expect: { l3HeaderLength: 64, l4Offset: 78, ipProtocol: 6 },
  },
  {
    name: `IPv6 with exactly ${IPV6_MAX_EXTENSION_HEADERS} extension headers is still parsed`,
    frame: frame6(tcpV6('', Array.from({ length: IPV6_MAX_EXTENSION_HEADERS }, () => ipv6Options(60)))),
    verdict: OK,
    expect: { l3HeaderLength: 40 + 8 * IPV6_MAX_EXTENSION_HEADERS, ipProtocol: 6, dstPort: 443 },
  },
  {
    name: 'ESP over IPv6 stops at protocol 50 with ports 0',
    frame: frame6(ipv6({ ...V6, nextHeader: 50 }, new Uint8Array(32))),
    verdict: OK,
    expect: { ipProtocol: 50, l4Offset: 54, srcPort: 0 },
  },
  {
    name: 'A minimum-size frame keeps its Ethernet padding out of the IP packet (l3End from the total length)',
    frame: concat(frame4(ipv4({ ...V4, proto: 17 }, udp({ sport: 9, dport: 9 }, 'ab', V4))), new Uint8Array(16)),
    verdict: OK,
    expect: { l3End: 14 + 30, l4Offset: 34, payloadOffset: 42 },
  },
  {
    name: 'A padded IPv6 frame ends its packet at the payload length',
    frame: concat(frame6(ipv6({ ...V6, nextHeader: 59 }, new Uint8Array(2))), new Uint8Array(6)),
    verdict: OK,
    expect: { l3End: 14 + 42 },
  },
  {
    name: 'A UDP length shorter than the IP payload (trailing bytes) is accepted',
    frame: frame4(ipv4({ ...V4, proto: 17 }, concat(udp({ sport: 1, dport: 2 }, 'ab', V4), [0, 0, 0, 0]))),
    verdict: OK,
    expect: { srcPort: 1, dstPort: 2, l3End: 14 + 34 },
  },
  // ---- not IP: leave it alone
  { name: 'An ARP request is well-formed and not IP', frame: ARP_REQUEST, verdict: PARSE_NOT_IP, expect: { etherType: ETHERTYPE_ARP, family: 0, vlanTci: -1 } },
  {
    name: 'A double-tagged (QinQ 0x8100 inside 0x8100) frame is left alone as not IP, with the outer TCI',
    frame: ethernet({ ...MACS, type: ETHERTYPE_VLAN, vlan: 10 }, concat([0x00, 0x14, 0x08, 0x00], tcpV4())),
    verdict: PARSE_NOT_IP,
    expect: { vlanTci: 10, etherType: ETHERTYPE_VLAN, family: 0 },
  },
  {
    name: 'An 802.1ad (0x88a8) outer tag is not parsed: not IP',
    frame: ethernet({ ...MACS, type: 0x88a8 }, concat([0x00, 0x0a, 0x08, 0x00], tcpV4())),
    verdict: PARSE_NOT_IP,
    expect: { vlanTci: -1, etherType: 0x88a8 },
  },
  { name: 'An IEEE 802.3 length field (LLC frame) is not IP', frame: ethernet({ ...MACS, type: 46 }, new Uint8Array(46)), verdict: PARSE_NOT_IP },
  {
    name: 'An IPv6 ethertype carrying a version-4 header is left to the kernel as not IP',
    frame: ethernet({ ...MACS, type: ETH_IPV6 }, concat(tcpV4(), new Uint8Array(20))),
    verdict: PARSE_NOT_IP,
    expect: { etherType: ETHERTYPE_IPV6, family: 0 },
  },
  // ---- malformed
  { name: 'A 13-byte frame cannot hold an Ethernet header', frame: SYN_V4.slice(0, 13), verdict: bad('truncatedEthernet') },
  { name: 'A frame that ends inside its VLAN tag', frame: TCP_V4_VLAN.slice(0, 16), verdict: bad('truncatedVlan') },
  { name: 'An IPv4 ethertype with version 6 in the header', frame: patch(SYN_V4, 14, 0x65), verdict: bad('badIpv4Version') },
  { name: 'An IPv4 header length of 4 words (IHL < 5)', frame: patch(SYN_V4, 14, 0x44), verdict: bad('badIpv4HeaderLength') },
  { name: 'An IPv4 header length of 0', frame: patch(SYN_V4, 14, 0x40), verdict: bad('badIpv4HeaderLength') },
  { name: 'An IPv4 header length of 15 words, more than the 60-byte packet has after the header (IHL > available)', frame: patch(patch(SYN_V4, 14, 0x4f), 16, 0x00, 0x28), verdict: bad('badIpv4HeaderLength') },
  { name: 'An IPv4 total length past the end of the frame', frame: patch(SYN_V4, 16, 0x00, 0x3d), verdict: bad('badIpv4TotalLength') },
  { name: 'An IPv4 total length of 0', frame: patch(SYN_V4, 16, 0x00, 0x00), verdict: bad('badIpv4TotalLength') },
  { name: 'An IPv4 total length of 19, below the minimum header', frame: patch(SYN_V4, 16, 0x00, 0x13), verdict: bad('badIpv4TotalLength') },
  { name: 'An IPv4 header checksum with one bit flipped', frame: patch(SYN_V4, 24, SYN_V4[24] ^ 0x01), verdict: bad('badIpv4Checksum') },
  { name: 'An IPv4 source address changed after the checksum was made', frame: patch(SYN_V4, 29, SYN_V4[29] + 1), verdict: bad('badIpv4Checksum') },
  { name: 'An IPv4 header checksum of 0 (the field is not optional in IPv4)', frame: patch(SYN_V4, 24, 0, 0), verdict: bad('badIpv4Checksum') },
  {
    name: 'An IPv4 option changed after the checksum was made (the check covers the options)',
    frame: patch(frame4(ipv4({ ...V4, proto: 17, options: [0x94, 0x04, 0, 0] }, udp({ sport: 1, dport: 2 }, 'ab', V4))), 14 + 22, 1),
    verdict: bad('badIpv4Checksum'),
  },
  { name: 'An IPv6 payload length of 0 (a jumbogram)', frame: patch(TCP_V6_EXT, 18, 0, 0), verdict: bad('badIpv6PayloadLength') },
  { name: 'An IPv6 payload length one byte past the frame', frame: patch(TCP_V6_EXT, 18, 0, TCP_V6_EXT[19] + 1), verdict: bad('badIpv6PayloadLength') },
  {
    name: 'A destination-options header whose length runs past the IPv6 payload',
    frame: frame6(ipv6({ ...V6, nextHeader: 59, extensionHeaders: [{ type: 60, bytes: patch(ipv6Options(60).bytes as Uint8Array, 1, 5) }] }, new Uint8Array(20))),
    verdict: bad('truncatedIpv6ExtensionHeader'),
  },
  {
    name: `IPv6 with ${IPV6_MAX_EXTENSION_HEADERS + 1} extension headers exceeds the walk limit`,
    frame: frame6(tcpV6('', Array.from({ length: IPV6_MAX_EXTENSION_HEADERS + 1 }, () => ipv6Options(60)))),
    verdict: bad('ipv6ExtensionHeaderLimit'),
  },
  {
    name: 'A chain of 100 hop-by-hop headers (a crafted loop) stops at the limit without walking it all',
    frame: frame6(ipv6({ ...V6, nextHeader: 0, extensionHeaders: Array.from({ length: 100 }, () => ipv6Options(0)) }, new Uint8Array(8))),
    verdict: bad('ipv6ExtensionHeaderLimit'),
  },
  ...[0, 1, 2, 3, 4].map((words) => ({
    name: `A TCP data offset of ${words} words (< 5)`,
    frame: patch(SYN_V4, 46, words << 4),
    verdict: bad('badTcpDataOffset'),
  })),
  { name: 'A TCP data offset of 15 words in a 40-byte segment', frame: patch(SYN_V4, 46, 0xf0), verdict: bad('truncatedTcp') },
  { name: 'A TCP data offset of 11 words in an IPv6 segment of 40 bytes', frame: patch(frame6(tcpV6('')), 66, 0xb0), verdict: bad('truncatedTcp') },
  { name: 'A UDP length of 7', frame: patch(frame4(ipv4({ ...V4, proto: 17 }, udp({ sport: 1, dport: 2 }, 'ab', V4))), 38, 0, 7), verdict: bad('badUdpLength') },
  { name: 'A UDP length of 0 in IPv6 (no jumbograms)', frame: patch(frame6(ipv6({ ...V6, nextHeader: 17 }, udp({ sport: 1, dport: 2 }, 'ab', V6))), 58, 0, 0), verdict: bad('badUdpLength') },
  { name: 'A UDP length one byte past the IP payload', frame: patch(frame4(ipv4({ ...V4, proto: 17 }, udp({ sport: 1, dport: 2 }, 'ab', V4))), 38, 0, 11), verdict: bad('badUdpLength') },
  { name: 'An ICMP message of 3 bytes', frame: frame4(ipv4({ ...V4, proto: 1 }, [8, 0, 0])), verdict: bad('truncatedIcmp') },
];

// ---- helpers ------------------------------------------------------------------------------------

function addressText(words: Uint32Array, first: number, family: number): string {
  const out: number[] = [];
  for (let i = 0; i < (family === 4 ? 1 : 4); i++) {
    const w = words[first + i];
    out.push(w >>> 24, (w >>> 16) & 0xff, (w >>> 8) & 0xff, w & 0xff);
  }
  return family === 0 ? '' : ipaddr.fromByteArray(out).toString();
}

/** Every field of the slot, offsets made relative to `base` (-1 stays -1). */
function snapshot(p: ParsedPacket, base: number) {
  const rel = (v: number) => (v < 0 ? v : v - base);
  return {
    frameOffset: p.frameOffset, frameLength: p.frameLength, vlanTci: p.vlanTci, etherType: p.etherType,
    family: p.family, l3Offset: p.l3Offset === 0 ? 0 : rel(p.l3Offset), l4Offset: rel(p.l4Offset), l3End: p.l3End === 0 ? 0 : rel(p.l3End),
    l3HeaderLength: p.l3HeaderLength, ipProtocol: p.ipProtocol, trafficClass: p.trafficClass, ttl: p.ttl,
    dontFragment: p.dontFragment, isFragment: p.isFragment, fragmentOffset: p.fragmentOffset,
    moreFragments: p.moreFragments, fragmentId: p.fragmentId,
    addrWords: Array.from(p.addr), src: addressText(p.addr, 0, p.family), dst: addressText(p.addr, 4, p.family),
    srcPort: p.srcPort, dstPort: p.dstPort, tcpFlags: p.tcpFlags, icmpType: p.icmpType, icmpCode: p.icmpCode,
    payloadOffset: rel(p.payloadOffset),
  };
}

/** Copies `frame` into a larger buffer at `base` with junk around it, so reads outside it would show. */
function embed(frame: Uint8Array, base: number, trailing = 64): Uint8Array {
  const buf = new Uint8Array(base + frame.length + trailing).fill(0x45);
  buf.set(frame, base);
  return buf;
}

/** Cuts an IP packet to `keep` bytes and rewrites its length field, so the packet itself is consistent. */
function shortenIp(ip: Uint8Array, keep: number): Uint8Array {
  const out = ip.slice(0, keep);
  if (ip[0] >> 4 === 4) {
    out[2] = keep >> 8;
    out[3] = keep & 0xff;
    refreshIpv4Checksum(out, 0);
  } else {
    out[4] = (keep - 40) >> 8;
    out[5] = (keep - 40) & 0xff;
  }
  return out;
}


// ---- tests --------------------------------------------------------------------------------------

describe('parseFrame vectors', () => {
  it.each(vectors.map((v) => [v.name, v] as const))('%s', (_name, v) => {
    for (const base of [0, 13]) {
      const buf = base === 0 ? v.frame : embed(v.frame, base);
      const pkt = new ParsedPacket();
      const verdict = parseFrame(buf, base, v.frame.length, pkt);
      expect(verdict).toBe(v.verdict);
      const fields = snapshot(pkt, base);
      expect(fields.frameOffset).toBe(base);
      expect(fields.frameLength).toBe(v.frame.length);
      if (v.expect) expect(fields).toMatchObject(v.expect);
    }
  });

  it('the builder reproduces the literal TCP SYN byte for byte (both checksums included)', () => {
    const built = ethernet(
      { ...MACS, type: ETH_IPV4 },
      ipv4(
        { src: '192.168.1.10', dst: '10.0.0.100', proto: 6, id: 0x1c46, df: true },
        tcp({ sport: 54321, dport: 80, seq: 0x3a5f1c07, flags: TCP_SYN, window: 0xfaf0, options: SYN_OPTIONS }, '', {
          src: '192.168.1.10',
          dst: '10.0.0.100',
        }),
      ),
    );
    expect(Buffer.from(built).toString('hex')).toBe(Buffer.from(SYN_V4).toString('hex'));
  });
});

describe('parseFrame writes every field for every frame', () => {
  it('parsing frame B into a slot that held frame A gives the same fields as a fresh slot, for all pairs', () => {
    const fresh = vectors.map((v) => {
      const pkt = new ParsedPacket();
      parseFrame(v.frame, 0, v.frame.length, pkt);
      return snapshot(pkt, 0);
    });
    const slot = new ParsedPacket();
    let pairs = 0;
    for (const a of vectors) {
      for (let j = 0; j < vectors.length; j++) {
        parseFrame(a.frame, 0, a.frame.length, slot);
        parseFrame(vectors[j].frame, 0, vectors[j].frame.length, slot);
        expect(snapshot(slot, 0), `${a.name} -> ${vectors[j].name}`).toEqual(fresh[j]);
        pairs++;
      }
    }
    expect(pairs).toBe(vectors.length ** 2);
  });

  it('a frame that fails early leaves the later fields at their reset values', () => {
    const slot = new ParsedPacket();
    parseFrame(TCP_V6_EXT, 0, TCP_V6_EXT.length, slot);
    expect(parseFrame(SYN_V4, 0, 20, slot)).toBe(bad('truncatedIpv4'));
    const cleared = new ParsedPacket();
    cleared.reset();
    expect(snapshot(slot, 0)).toEqual({ ...snapshot(cleared, 0), frameLength: 20, etherType: ETHERTYPE_IPV4 });
  });
});

describe('parseFrame on truncated frames', () => {
  // Expected verdict for a frame cut at `len` bytes, by the header the cut falls in.
  const cases = [
    { name: 'TCP SYN over IPv4', frame: SYN_V4, l3: 14, family: 4, vlan: false },
    { name: 'VLAN-tagged TCP over IPv4', frame: TCP_V4_VLAN, l3: 18, family: 4, vlan: true },
    { name: 'TCP over IPv6 with hop-by-hop, destination options and fragment headers', frame: TCP_V6_EXT, l3: 14, family: 6, vlan: false },
    { name: 'VLAN-tagged TCP over IPv6', frame: TCP_V6_VLAN, l3: 18, family: 6, vlan: true },
  ];
  const expectedAt = (c: (typeof cases)[number], len: number): number => {
    if (len < 14) return bad('truncatedEthernet');
    if (c.vlan && len < 18) return bad('truncatedVlan');
    if (c.family === 4) return len < c.l3 + 20 ? bad('truncatedIpv4') : bad('badIpv4TotalLength');
    return len < c.l3 + 40 ? bad('truncatedIpv6') : bad('badIpv6PayloadLength');
  };

  it.each(cases.map((c) => [c.name, c] as const))(
    '%s: every length from 0 to full-1 is refused with the reason of the header it cuts, inside a larger buffer and at its end',
    (_name, c) => {
      const pkt = new ParsedPacket();
      const big = embed(c.frame, 5);
      let checked = 0;
      for (let len = 0; len < c.frame.length; len++) {
        const want = expectedAt(c, len);
        expect(parseFrame(big, 5, len, pkt), `length ${len} in a larger buffer`).toBe(want);
        expect(parseFrame(c.frame.slice(0, len), 0, len, pkt), `length ${len} alone`).toBe(want);
        // A length past the buffer's end is clamped to it, never read beyond.
        expect(parseFrame(c.frame.slice(0, len), 0, len + 100, pkt), `length ${len} + 100 claimed`).toBe(want);
        checked++;
      }
      expect(checked).toBe(c.frame.length);
      expect(parseFrame(c.frame, 0, c.frame.length, pkt)).toBe(PARSE_OK);
    },
  );

  // A consistent IP packet whose payload ends inside a header: the length fields agree, the header does not fit.
  const l4Cases = [
    { name: 'TCP with options in IPv4', ip: tcpV4('', { options: SYN_OPTIONS }), headerBytes: 40, reason: 'truncatedTcp' as const },
    { name: 'TCP with options in IPv6', ip: tcpV6(''), headerBytes: 40, reason: 'truncatedTcp' as const },
    { name: 'UDP in IPv4', ip: ipv4({ ...V4, proto: 17 }, udp({ sport: 1, dport: 2 }, '', V4)), headerBytes: 8, reason: 'truncatedUdp' as const },
    { name: 'UDP in IPv6', ip: ipv6({ ...V6, nextHeader: 17 }, udp({ sport: 1, dport: 2 }, '', V6)), headerBytes: 8, reason: 'truncatedUdp' as const },
    { name: 'ICMP echo in IPv4', ip: ipv4({ ...V4, proto: 1 }, icmpEcho({ id: 1, seq: 2 })), headerBytes: 4, reason: 'truncatedIcmp' as const },
    { name: 'ICMPv6 in IPv6', ip: ipv6({ ...V6, nextHeader: 58 }, icmpv6({ type: 128, rest: 0x10002 }, '', V6)), headerBytes: 4, reason: 'truncatedIcmp' as const },
    {
      name: 'destination options (16 bytes) in IPv6',
      ip: tcpV6('', [ipv6Options(60, new Uint8Array(14))]),
      headerBytes: 16,
      reason: 'truncatedIpv6ExtensionHeader' as const,
    },
    {
      name: 'a fragment header in IPv6',
      ip: tcpV6('', [ipv6Fragment({ offset: 0, more: false, id: 1 })]),
      headerBytes: 8,
      reason: 'truncatedIpv6ExtensionHeader' as const,
    },
  ];

  it.each(l4Cases.map((c) => [c.name, c] as const))(
    '%s: a packet whose length fields end inside the header is refused for every cut',
    (_name, c) => {
      const family = c.ip[0] >> 4;
      const l3HeaderBytes = family === 4 ? 20 : 40;
      const pkt = new ParsedPacket();
      for (let keep = 0; keep < c.headerBytes; keep++) {
        const frame = family === 4 ? frame4(shortenIp(c.ip, l3HeaderBytes + keep)) : frame6(shortenIp(c.ip, l3HeaderBytes + keep));
        // An empty IPv6 payload reads as a jumbogram's 0 payload length.
        const want = family === 6 && keep === 0 ? bad('badIpv6PayloadLength') : bad(c.reason);
        expect(parseFrame(frame, 0, frame.length, pkt), `${keep} header bytes`).toBe(want);
      }
      const whole = family === 4 ? frame4(c.ip) : frame6(c.ip);
      expect(parseFrame(whole, 0, whole.length, pkt)).toBe(PARSE_OK);
    },
  );

  it('nonsense offsets and lengths are refused as truncated Ethernet and never throw', () => {
    const pkt = new ParsedPacket();
    const t = bad('truncatedEthernet');
    expect(parseFrame(SYN_V4, -1, 74, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, 0, -5, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, 0.5, 74, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, Number.NaN, 74, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, 0, Number.POSITIVE_INFINITY, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, 74, 74, pkt)).toBe(t);
    expect(parseFrame(SYN_V4, 1000, 74, pkt)).toBe(t);
    expect(parseFrame(new Uint8Array(0), 0, 0, pkt)).toBe(t);
  });
});

describe('parseFrame fuzz', () => {
  const PARSE_REASONS = new Set(
    (['truncatedEthernet', 'truncatedVlan', 'truncatedIpv4', 'badIpv4Version', 'badIpv4HeaderLength', 'badIpv4TotalLength',
      'truncatedIpv6', 'badIpv6PayloadLength', 'ipv6ExtensionHeaderLimit', 'truncatedIpv6ExtensionHeader', 'truncatedTcp',
      'badTcpDataOffset', 'truncatedUdp', 'badUdpLength', 'truncatedIcmp', 'badIpv4Checksum'] as const).map((r) => -DropReason[r]),
  );

  it('20,000 seeded random mutations of valid frames never throw, return a known verdict and keep offsets in bounds', () => {
    const rand = mulberry32(0x5eed);
    const pick = (n: number) => Math.floor(rand() * n);
    const bases = vectors.filter((v) => v.verdict === PARSE_OK).map((v) => v.frame);
    const pkt = new ParsedPacket();
    const seen = new Map<number, number>();
    const failures: string[] = [];
    const ITERATIONS = 20_000;
    for (let i = 0; i < ITERATIONS; i++) {
      const base = bases[pick(bases.length)];
      const headroom = pick(4) === 0 ? pick(9) : 0;
      const buf = new Uint8Array(headroom + base.length + pick(3) * pick(40));
      for (let j = 0; j < buf.length; j++) buf[j] = pick(256);
      buf.set(base.subarray(0, buf.length - headroom), headroom);
      // Mutate 1-6 bytes, mostly within the headers where the parser looks.
      const flips = 1 + pick(6);
      for (let f = 0; f < flips; f++) {
        const at = headroom + (pick(3) === 0 ? pick(base.length) : pick(Math.min(base.length, 110)));
        if (pick(2) === 0) buf[at] = pick(256);
        else buf[at] ^= 1 << pick(8);
      }
      // Mostly with the IPv4 checksum made right again, so the mutations reach past that check.
      if (pick(4) !== 0) {
        const vlan = buf[headroom + 12] === 0x81 && buf[headroom + 13] === 0x00 ? 4 : 0;
        if (buf[headroom + 12 + vlan] === 0x08 && buf[headroom + 13 + vlan] === 0x00) refreshIpv4Checksum(buf, headroom + 14 + vlan);
      }
      const length = pick(5) === 0 ? pick(buf.length + 20) : buf.length - headroom;
      const verdict = parseFrame(buf, headroom, length, pkt);

      // Plain checks collected as messages: 20k expect() calls would dominate the run time.
      if (!Number.isInteger(verdict) || !(verdict === PARSE_OK || verdict === PARSE_NOT_IP || PARSE_REASONS.has(verdict))) {
        failures.push(`iteration ${i}: verdict ${verdict}`);
      }
      seen.set(verdict, (seen.get(verdict) ?? 0) + 1);
      if (verdict === PARSE_OK) {
        const end = Math.min(headroom + length, buf.length);
        const l3 = pkt.l3Offset;
        const broken =
          (pkt.family !== 4 && pkt.family !== 6) ||
          (l3 - headroom !== 14 && l3 - headroom !== 18) ||
          pkt.l3End > end ||
          l3 + pkt.l3HeaderLength > pkt.l3End ||
          (pkt.l4Offset >= 0 && pkt.l4Offset !== l3 + pkt.l3HeaderLength) ||
          (pkt.payloadOffset >= 0 && (pkt.payloadOffset <= pkt.l4Offset || pkt.payloadOffset > pkt.l3End)) ||
          (pkt.fragmentOffset !== 0 && pkt.l4Offset !== -1);
        if (broken) failures.push(`iteration ${i}: offsets out of bounds ${JSON.stringify(snapshot(pkt, headroom))}`);
      }
    }
    expect(failures).toEqual([]);
    const total = [...seen.values()].reduce((a, b) => a + b, 0);
    expect(total).toBe(ITERATIONS);
    // The mutations reach deep into the parser, not just the first check.
    expect(seen.get(PARSE_OK) ?? 0).toBeGreaterThan(1000);
    expect([...seen.keys()].filter((v) => v < 0).length).toBeGreaterThanOrEqual(12);
  });
});
