// Parses one Ethernet frame (one optional 802.1Q tag, IPv4 or IPv6 with extension headers, then
// TCP/UDP/ICMP) into a preallocated ParsedPacket. Never throws, never allocates, and never reads
// outside [offset, offset + length) nor past the end of the buffer.

import { DropReason } from './drop-reasons.js';
import {
  ETHERTYPE_IPV4,
  ETHERTYPE_IPV6,
  ETHERTYPE_VLAN,
  IPPROTO_ICMP,
  IPPROTO_ICMPV6,
  IPPROTO_TCP,
  IPPROTO_UDP,
  PARSE_NOT_IP,
  PARSE_OK,
  type ParsedPacket,
} from './parsed-packet.js';

const ETHERNET_HEADER_BYTES = 14;
const VLAN_TAG_BYTES = 4;
const IPV4_MIN_HEADER_BYTES = 20;
const IPV6_HEADER_BYTES = 40;
const TCP_MIN_HEADER_BYTES = 20;
const UDP_HEADER_BYTES = 8;
/** Type, code and checksum: all a load balancer reads before the message body. */
const ICMP_HEADER_BYTES = 4;
/** Every header in the chain has at least 8 bytes (RFC 8200 section 4). */
const IPV6_EXTENSION_MIN_BYTES = 8;
/** Bounds the walk so a crafted chain costs a fixed amount of work per frame. */
export const IPV6_MAX_EXTENSION_HEADERS = 8;

const IPV6_HOP_BY_HOP = 0;
const IPV6_ROUTING = 43;
const IPV6_FRAGMENT = 44;
const IPV6_AH = 51;
const IPV6_NO_NEXT_HEADER = 59;
const IPV6_DESTINATION_OPTIONS = 60;

// Negated once here so the per-frame code returns plain constants.
const ERR_TRUNCATED_ETHERNET = -DropReason.truncatedEthernet;
const ERR_TRUNCATED_VLAN = -DropReason.truncatedVlan;
const ERR_TRUNCATED_IPV4 = -DropReason.truncatedIpv4;
const ERR_BAD_IPV4_VERSION = -DropReason.badIpv4Version;
const ERR_BAD_IPV4_HEADER_LENGTH = -DropReason.badIpv4HeaderLength;
const ERR_BAD_IPV4_TOTAL_LENGTH = -DropReason.badIpv4TotalLength;
const ERR_BAD_IPV4_CHECKSUM = -DropReason.badIpv4Checksum;
const ERR_TRUNCATED_IPV6 = -DropReason.truncatedIpv6;
const ERR_BAD_IPV6_PAYLOAD_LENGTH = -DropReason.badIpv6PayloadLength;
const ERR_IPV6_EXTENSION_HEADER_LIMIT = -DropReason.ipv6ExtensionHeaderLimit;
const ERR_TRUNCATED_IPV6_EXTENSION_HEADER = -DropReason.truncatedIpv6ExtensionHeader;
const ERR_TRUNCATED_TCP = -DropReason.truncatedTcp;
const ERR_BAD_TCP_DATA_OFFSET = -DropReason.badTcpDataOffset;
const ERR_TRUNCATED_UDP = -DropReason.truncatedUdp;
const ERR_BAD_UDP_LENGTH = -DropReason.badUdpLength;
const ERR_TRUNCATED_ICMP = -DropReason.truncatedIcmp;

/**
 * Fills `out` from the frame at buf[offset, offset + length) and returns PARSE_OK (IPv4/IPv6),
 * PARSE_NOT_IP (a well-formed non-IP frame: ARP, LLDP, 802.3/LLC, an 802.1ad or double-tagged
 * frame) or -DropReason for a malformed one. Every field of `out` is written for every frame, so
 * nothing from the previous frame survives; after a negative verdict the fields are meaningful
 * only up to the header that failed.
 *
 * Decisions worth knowing:
 * - Only one 802.1Q tag is parsed; an inner 0x8100 (or an outer 0x88a8) is PARSE_NOT_IP, so the
 *   kernel keeps those frames.
 * - An IPv6 ethertype whose version nibble is not 6 is PARSE_NOT_IP (there is no drop reason for
 *   it; the kernel still gets its copy and drops it).
 * - An IPv4 header whose checksum does not verify is badIpv4Checksum (checked after the length
 *   fields, so a frame with a lying length keeps that more telling reason).
 * - IP length fields bound the packet: bytes after l3End are Ethernet padding, and the L4 header
 *   must fit before l3End, not merely before the end of the frame.
 * - The L4 header is read only for first fragments; for IPv6 non-first fragments ipProtocol is the
 *   fragment header's next header and the walk stops there. A first fragment's UDP length may
 *   exceed the fragment (it counts the whole datagram).
 * - A negative offset/length, non-integer ones, or a frame shorter than 14 bytes is truncatedEthernet;
 *   a length past the end of the buffer is clamped to the buffer.
 */
export function parseFrame(buf: Uint8Array, offset: number, length: number, out: ParsedPacket): number {
  clearSlot(out, offset, length);
  if ((offset | 0) !== offset || (length | 0) !== length || offset < 0 || length < 0) {
    return ERR_TRUNCATED_ETHERNET;
  }
  let end = offset + length;
  if (end > buf.length) end = buf.length;
  if (end - offset < ETHERNET_HEADER_BYTES) return ERR_TRUNCATED_ETHERNET;

  let pos = offset + 12;
  let etherType = (buf[pos] << 8) | buf[pos + 1];
  pos += 2;
  if (etherType === ETHERTYPE_VLAN) {
    if (end - pos < VLAN_TAG_BYTES) return ERR_TRUNCATED_VLAN;
    out.vlanTci = (buf[pos] << 8) | buf[pos + 1];
    etherType = (buf[pos + 2] << 8) | buf[pos + 3];
    pos += VLAN_TAG_BYTES;
  }
  out.etherType = etherType;
  if (etherType === ETHERTYPE_IPV4) return parseIpv4(buf, pos, end, out);
  if (etherType === ETHERTYPE_IPV6) return parseIpv6(buf, pos, end, out);
  return PARSE_NOT_IP;
}

function parseIpv4(buf: Uint8Array, l3: number, end: number, out: ParsedPacket): number {
  const available = end - l3;
  if (available < IPV4_MIN_HEADER_BYTES) return ERR_TRUNCATED_IPV4;
  const versionIhl = buf[l3];
  if (versionIhl >> 4 !== 4) return ERR_BAD_IPV4_VERSION;
  const headerBytes = (versionIhl & 0x0f) << 2;
  if (headerBytes < IPV4_MIN_HEADER_BYTES) return ERR_BAD_IPV4_HEADER_LENGTH;
  const totalLength = (buf[l3 + 2] << 8) | buf[l3 + 3];
  if (totalLength < IPV4_MIN_HEADER_BYTES) return ERR_BAD_IPV4_TOTAL_LENGTH;
  // The header claims bytes the packet does not have: the IHL is the field that lies.
  if (totalLength < headerBytes) return ERR_BAD_IPV4_HEADER_LENGTH;
  if (totalLength > available) return ERR_BAD_IPV4_TOTAL_LENGTH;

  const trafficClass = buf[l3 + 1];
  const fragmentId = (buf[l3 + 4] << 8) | buf[l3 + 5];
  const flagsFragment = (buf[l3 + 6] << 8) | buf[l3 + 7];
  const ttlProtocol = (buf[l3 + 8] << 8) | buf[l3 + 9];
  const source = readWord32(buf, l3 + 12);
  const destination = readWord32(buf, l3 + 16);
  // AF_PACKET sees frames before ip_rcv verifies the header checksum: a damaged header must not
  // make a flow entry.
  if (ipv4HeaderSum(buf, l3, headerBytes) !== 0xffff) return ERR_BAD_IPV4_CHECKSUM;

  out.family = 4;
  out.l3Offset = l3;
  out.l3End = l3 + totalLength;
  out.l3HeaderLength = headerBytes;
  out.trafficClass = trafficClass;
  out.ttl = ttlProtocol >> 8;
  const protocol = ttlProtocol & 0xff;
  out.ipProtocol = protocol;
  out.dontFragment = (flagsFragment >> 14) & 1;
  // MF or a fragment offset: apart, to keep parseIpv4 small enough to inline (see ipv4HeaderSum).
  if ((flagsFragment & 0x3fff) !== 0) recordIpv4Fragment(out, flagsFragment, fragmentId, protocol);
  out.addr[0] = source;
  out.addr[4] = destination;
  if (out.fragmentOffset !== 0) return PARSE_OK;
  return parseL4(buf, l3 + headerBytes, out.l3End, protocol, IPPROTO_ICMP, out);
}

function recordIpv4Fragment(out: ParsedPacket, flagsFragment: number, fragmentId: number, protocol: number): void {
  out.isFragment = 1;
  out.moreFragments = (flagsFragment >> 13) & 1;
  out.fragmentOffset = (flagsFragment & 0x1fff) << 3;
  out.fragmentId = fragmentId;
  out.fragmentProtocol = protocol;
}

function parseIpv6(buf: Uint8Array, l3: number, end: number, out: ParsedPacket): number {
  if (end - l3 < IPV6_HEADER_BYTES) return ERR_TRUNCATED_IPV6;
  const b0 = buf[l3];
  if (b0 >> 4 !== 6) return PARSE_NOT_IP;
  const payloadLength = (buf[l3 + 4] << 8) | buf[l3 + 5];
  // 0 announces a jumbogram (RFC 2675), which no Ethernet frame can carry.
  if (payloadLength === 0 || payloadLength > end - l3 - IPV6_HEADER_BYTES) return ERR_BAD_IPV6_PAYLOAD_LENGTH;
  const l3End = l3 + IPV6_HEADER_BYTES + payloadLength;

  out.family = 6;
  out.l3Offset = l3;
  out.l3End = l3End;
  out.trafficClass = ((b0 & 0x0f) << 4) | (buf[l3 + 1] >> 4);
  out.ttl = buf[l3 + 7];
  out.dontFragment = 1;
  const addr = out.addr;
  for (let i = 0; i < 8; i++) addr[i] = readWord32(buf, l3 + 8 + (i << 2));

  let nextHeader = buf[l3 + 6];
  let pos = l3 + IPV6_HEADER_BYTES;
  let walked = 0;
  while (
    nextHeader === IPV6_HOP_BY_HOP ||
    nextHeader === IPV6_ROUTING ||
    nextHeader === IPV6_FRAGMENT ||
    nextHeader === IPV6_DESTINATION_OPTIONS ||
    nextHeader === IPV6_AH
  ) {
    if (walked === IPV6_MAX_EXTENSION_HEADERS) return ERR_IPV6_EXTENSION_HEADER_LIMIT;
    walked++;
    if (l3End - pos < IPV6_EXTENSION_MIN_BYTES) return ERR_TRUNCATED_IPV6_EXTENSION_HEADER;
    let headerBytes: number;
    if (nextHeader === IPV6_FRAGMENT) {
      headerBytes = 8;
      const offsetFlags = (buf[pos + 2] << 8) | buf[pos + 3];
      out.isFragment = 1;
      // The offset counts 8-byte units in the top 13 bits: masking keeps it in bytes.
      out.fragmentOffset = offsetFlags & 0xfff8;
      out.moreFragments = offsetFlags & 1;
      out.fragmentId = readWord32(buf, pos + 4) >>> 0;
      out.fragmentProtocol = buf[pos];
    } else if (nextHeader === IPV6_AH) {
      headerBytes = (buf[pos + 1] + 2) << 2; // RFC 4302: length in 4-byte units, minus 2
    } else {
      headerBytes = (buf[pos + 1] + 1) << 3; // RFC 8200: length in 8-byte units, not counting the first 8
    }
    if (headerBytes > l3End - pos) return ERR_TRUNCATED_IPV6_EXTENSION_HEADER;
    nextHeader = buf[pos];
    pos += headerBytes;
    // In a non-first fragment the bytes after the fragment header are the middle of the payload.
    if (out.fragmentOffset !== 0) break;
  }
  out.ipProtocol = nextHeader;
  out.l3HeaderLength = pos - l3;
  if (out.fragmentOffset !== 0 || nextHeader === IPV6_NO_NEXT_HEADER) return PARSE_OK;
  return parseL4(buf, pos, l3End, nextHeader, IPPROTO_ICMPV6, out);
}

/** `icmpProtocol` is the ICMP of the packet's family: 1 inside IPv4, 58 inside IPv6. */
function parseL4(
  buf: Uint8Array,
  l4: number,
  l3End: number,
  protocol: number,
  icmpProtocol: number,
  out: ParsedPacket,
): number {
  out.l4Offset = l4;
  const available = l3End - l4;
  if (protocol === IPPROTO_TCP) {
    if (available < TCP_MIN_HEADER_BYTES) return ERR_TRUNCATED_TCP;
    const headerBytes = (buf[l4 + 12] >> 4) << 2;
    if (headerBytes < TCP_MIN_HEADER_BYTES) return ERR_BAD_TCP_DATA_OFFSET;
    if (headerBytes > available) return ERR_TRUNCATED_TCP;
    out.srcPort = (buf[l4] << 8) | buf[l4 + 1];
    out.dstPort = (buf[l4 + 2] << 8) | buf[l4 + 3];
    out.tcpFlags = buf[l4 + 13];
    out.payloadOffset = l4 + headerBytes;
    return PARSE_OK;
  }
  if (protocol === IPPROTO_UDP) {
    if (available < UDP_HEADER_BYTES) return ERR_TRUNCATED_UDP;
    const udpLength = (buf[l4 + 4] << 8) | buf[l4 + 5];
    if (udpLength < UDP_HEADER_BYTES) return ERR_BAD_UDP_LENGTH;
    // A first fragment carries the length of the whole datagram, most of which is still to come.
    if (udpLength > available && out.moreFragments === 0) return ERR_BAD_UDP_LENGTH;
    out.srcPort = (buf[l4] << 8) | buf[l4 + 1];
    out.dstPort = (buf[l4 + 2] << 8) | buf[l4 + 3];
    out.payloadOffset = l4 + UDP_HEADER_BYTES;
    return PARSE_OK;
  }
  if (protocol === icmpProtocol) {
    if (available < ICMP_HEADER_BYTES) return ERR_TRUNCATED_ICMP;
    out.icmpType = buf[l4];
    out.icmpCode = buf[l4 + 1];
    out.payloadOffset = l4 + ICMP_HEADER_BYTES;
    return PARSE_OK;
  }
  return PARSE_OK;
}

/**
 * The ones'-complement sum (RFC 1071) of an IPv4 header, checksum field included: 0xffff when the
 * checksum is right. Apart from parseIpv4 to keep that under V8's size limit for inlining (460
 * bytes of bytecode), so that both are inlined into the packet path (inlining-budget.ts).
 */
function ipv4HeaderSum(buf: Uint8Array, l3: number, headerBytes: number): number {
  // The 20 fixed bytes written out (a loop over them cost 10-15 ns a packet), then any options.
  // Not checksum.ts's ones16/fold16: they clamp to the buffer and fold by division, 5-6 ns more a
  // packet here; the lengths are checked already and 30 words need two folds.
  let sum =
    ((buf[l3]! << 8) | buf[l3 + 1]!) + ((buf[l3 + 2]! << 8) | buf[l3 + 3]!) + ((buf[l3 + 4]! << 8) | buf[l3 + 5]!) +
    ((buf[l3 + 6]! << 8) | buf[l3 + 7]!) + ((buf[l3 + 8]! << 8) | buf[l3 + 9]!) + ((buf[l3 + 10]! << 8) | buf[l3 + 11]!) +
    ((buf[l3 + 12]! << 8) | buf[l3 + 13]!) + ((buf[l3 + 14]! << 8) | buf[l3 + 15]!) + ((buf[l3 + 16]! << 8) | buf[l3 + 17]!) +
    ((buf[l3 + 18]! << 8) | buf[l3 + 19]!);
  for (let i = l3 + IPV4_MIN_HEADER_BYTES; i < l3 + headerBytes; i += 2) sum += (buf[i]! << 8) | buf[i + 1]!;
  sum = (sum & 0xffff) + (sum >>> 16);
  return (sum & 0xffff) + (sum >>> 16);
}

/**
 * 32 bits big-endian as an int32, for the Uint32Array slots that read them back unsigned. Not made
 * unsigned here: a value of 2^31 or more (any address from 128.0.0.0, every IPv6 word fd00::)
 * would be a heap number, and optimized code that had not seen one deoptimized on the first.
 */
function readWord32(buf: Uint8Array, pos: number): number {
  return (buf[pos]! << 24) | (buf[pos + 1]! << 16) | (buf[pos + 2]! << 8) | buf[pos + 3]!;
}

/** A fresh slot for the frame at offset/length: every field the parser may set, reset. */
function clearSlot(out: ParsedPacket, offset: number, length: number): void {
  out.reset();
  out.frameOffset = offset;
  out.frameLength = length;
}
