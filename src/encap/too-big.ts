// What to do when an encapsulated packet would not fit the egress MTU: the decision (mtuCheck),
// ICMP fragmentation-needed and ICMPv6 Packet Too Big back to the client (built in a scratch
// buffer), fragmentation of the outer packet, and a token bucket that bounds the ICMP we send.
//
// Flow for a parsed frame and a tunnel of `overheadBytes` (ipip.ts tunnelOverheadBytes):
//   mtuCheck(pkt, overheadBytes, mtu)
//     MTU_FITS         -> encapsulate()
//     MTU_SEND_TOO_BIG -> limiter.allow(nowMs) ? buildFragNeeded() (IPv4) / buildPacketTooBig()
//                         (IPv6) with tooBigMtu(pkt.family, overheadBytes, mtu), send the scratch
//                         frame; drop the packet (packetTooBig) either way
//     MTU_FRAGMENT     -> complete a partial checksum (checksum.ts completePartialChecksum: a
//                         fragment cannot carry one), encapsulate(), fragmentOuter()
// `mtu` is the egress interface's IP MTU (1500 on plain Ethernet), never counting the Ethernet header.
// Scratch frames start with their Ethernet header (the VLAN tag of the input kept); a caller whose
// backend wants a virtio_net_hdr before each frame reserves it (fragmentOuter's gapBytes).

import { fold16, ipv4HeaderChecksum, ones16 } from '../dataplane/checksum.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import { mix32Int32 } from '../dataplane/flow-hash.js';
import {
  ETHERTYPE_IPV4,
  ETHERTYPE_IPV6,
  ETHERTYPE_VLAN,
  IPPROTO_ICMP,
  IPPROTO_ICMPV6,
  type ParsedPacket,
} from '../dataplane/parsed-packet.js';
import { FRAME_HAS_VNET_HDR, VNET_HDR_LEN } from '../io/packet-io.js';

export const MTU_FITS = 0;
/** Answer the client with ICMP fragmentation-needed (IPv4, DF set) or ICMPv6 Packet Too Big. */
export const MTU_SEND_TOO_BIG = 1;
/** Encapsulate, then split the outer packet with fragmentOuter(). */
export const MTU_FRAGMENT = 2;

export const IPV6_MIN_MTU = 1280;
/** RFC 1812 4.3.2.3 / RFC 1122: an ICMPv4 error quotes as much as keeps it within 576 bytes (Linux does). */
export const ICMP_ERROR_MAX_BYTES = 576;
/** RFC 4443 2.4 (c): an ICMPv6 error must not exceed the minimum IPv6 MTU. */
export const ICMPV6_ERROR_MAX_BYTES = IPV6_MIN_MTU;

const ICMP_DEST_UNREACHABLE = 3;
const ICMP_FRAG_NEEDED = 4;
const ICMPV6_PACKET_TOO_BIG = 2;
/** Linux's IPTOS_PREC_INTERNETCONTROL: ICMP errors are network control traffic. */
const ICMP_ERROR_TOS = 0xc0;
const ICMP_ERROR_TTL = 64;
const IPV4_HEADER_BYTES = 20;
const IPV6_HEADER_BYTES = 40;
const ICMP_HEADER_BYTES = 8;
const IPV6_FRAGMENT_HEADER_BYTES = 8;
const IPV6_NEXT_FRAGMENT = 44;
const IPV4_DF = 0x4000;
const IPV4_MF = 0x2000;

// Negated once here so the per-packet code returns plain constants.
const ERR_TOO_BIG = -DropReason.packetTooBig;
/** Scratch buffer or out array too small, or no headroom for the IPv6 fragment header: the batch's extra room is used up. */
const ERR_NO_ROOM = -DropReason.batchFull;
const ERR_TRUNCATED_ETHERNET = -DropReason.truncatedEthernet;
const ERR_TRUNCATED_IPV4 = -DropReason.truncatedIpv4;
const ERR_TRUNCATED_IPV6 = -DropReason.truncatedIpv6;

/**
 * MTU_FITS when the packet plus `overheadBytes` fits `mtu`. Otherwise: IPv4 with DF ->
 * MTU_SEND_TOO_BIG; IPv4 without DF -> MTU_FRAGMENT; IPv6 -> MTU_SEND_TOO_BIG when the inner
 * packet exceeds tooBigMtu() (so the client can shrink), else MTU_FRAGMENT (RFC 2473 7.1: inner
 * packets up to 1280 bytes must get through, in outer fragments when the tunnel path is smaller).
 */
export function mtuCheck(pkt: ParsedPacket, overheadBytes: number, mtu: number): number {
  const innerBytes = pkt.l3End - pkt.l3Offset;
  if (innerBytes + overheadBytes <= mtu) return MTU_FITS;
  if (pkt.family === 4) return pkt.dontFragment !== 0 ? MTU_SEND_TOO_BIG : MTU_FRAGMENT;
  return innerBytes > tooBigMtu(6, overheadBytes, mtu) ? MTU_SEND_TOO_BIG : MTU_FRAGMENT;
}

/** The MTU to announce to the client: mtu - overhead, and never below 1280 for IPv6 (RFC 8201). */
export function tooBigMtu(family: number, overheadBytes: number, mtu: number): number {
  const inner = mtu - overheadBytes;
  return family === 6 && inner < IPV6_MIN_MTU ? IPV6_MIN_MTU : inner;
}

/**
 * Writes the Ethernet header of a reply to the frame's sender at scratch[pos..]: dst = the frame's
 * source MAC, src = localMac, the input's VLAN tag, `etherType`. Returns the position after it.
 */
function writeReplyEthernet(
  buf: Uint8Array,
  pkt: ParsedPacket,
  localMac: Uint8Array,
  etherType: number,
  scratch: Uint8Array,
  pos: number,
): number {
  const frame = pkt.frameOffset;
  for (let i = 0; i < 6; i++) {
    scratch[pos + i] = buf[frame + 6 + i];
    scratch[pos + 6 + i] = localMac[i];
  }
  pos += 12;
  const tci = pkt.vlanTci;
  if (tci >= 0) {
    scratch[pos] = ETHERTYPE_VLAN >> 8;
    scratch[pos + 1] = ETHERTYPE_VLAN & 0xff;
    scratch[pos + 2] = (tci >> 8) & 0xff;
    scratch[pos + 3] = tci & 0xff;
    pos += 4;
  }
  scratch[pos] = etherType >> 8;
  scratch[pos + 1] = etherType & 0xff;
  return pos + 2;
}

/**
 * ICMP destination unreachable, fragmentation needed (type 3 code 4, RFC 792 + RFC 1191 next-hop
 * MTU) about the parsed IPv4 packet, written as a whole frame at scratch[scratchOffset..]:
 * from the VIP (the packet's destination: the client's PMTU cache is keyed by it) to the client,
 * Ethernet back to the frame's source MAC from localMac, the input's VLAN tag kept. Quotes the
 * packet from its IP header on, as much as keeps the datagram within 576 bytes (548 bytes, at
 * least header + 8 for any real packet). IP header: TOS 0xc0, TTL 64, DF set and identification 0
 * (atomic, RFC 6864; 576 bytes cross any IPv4 path). Returns the frame length or -DropReason.
 * `scratch` must not overlap the frame.
 */
export function buildFragNeeded(
  buf: Uint8Array,
  pkt: ParsedPacket,
  nextHopMtu: number,
  localMac: Uint8Array,
  scratch: Uint8Array,
  scratchOffset: number,
): number {
  const l3 = pkt.l3Offset;
  if (pkt.family !== 4 || l3 + IPV4_HEADER_BYTES > pkt.l3End || pkt.l3End > buf.length) return ERR_TRUNCATED_IPV4;
  let quoteBytes = pkt.l3End - l3;
  const maxQuote = ICMP_ERROR_MAX_BYTES - IPV4_HEADER_BYTES - ICMP_HEADER_BYTES;
  if (quoteBytes > maxQuote) quoteBytes = maxQuote;
  const l2Bytes = l3 - pkt.frameOffset;
  const totalLength = IPV4_HEADER_BYTES + ICMP_HEADER_BYTES + quoteBytes;
  if (scratchOffset < 0 || scratchOffset + l2Bytes + totalLength > scratch.length || localMac.length < 6) return ERR_NO_ROOM;

  const ip = writeReplyEthernet(buf, pkt, localMac, ETHERTYPE_IPV4, scratch, scratchOffset);
  scratch[ip] = 0x45;
  scratch[ip + 1] = ICMP_ERROR_TOS;
  scratch[ip + 2] = totalLength >> 8;
  scratch[ip + 3] = totalLength & 0xff;
  scratch[ip + 4] = 0;
  scratch[ip + 5] = 0;
  scratch[ip + 6] = IPV4_DF >> 8;
  scratch[ip + 7] = 0;
  scratch[ip + 8] = ICMP_ERROR_TTL;
  scratch[ip + 9] = IPPROTO_ICMP;
  for (let i = 0; i < 4; i++) {
    scratch[ip + 12 + i] = buf[l3 + 16 + i]; // VIP
    scratch[ip + 16 + i] = buf[l3 + 12 + i]; // client
  }
  const ipChecksum = ipv4HeaderChecksum(scratch, ip, IPV4_HEADER_BYTES);
  scratch[ip + 10] = ipChecksum >> 8;
  scratch[ip + 11] = ipChecksum & 0xff;

  const icmp = ip + IPV4_HEADER_BYTES;
  scratch[icmp] = ICMP_DEST_UNREACHABLE;
  scratch[icmp + 1] = ICMP_FRAG_NEEDED;
  scratch[icmp + 2] = 0;
  scratch[icmp + 3] = 0;
  scratch[icmp + 4] = 0;
  scratch[icmp + 5] = 0;
  scratch[icmp + 6] = (nextHopMtu >> 8) & 0xff;
  scratch[icmp + 7] = nextHopMtu & 0xff;
  const quote = icmp + ICMP_HEADER_BYTES;
  for (let i = 0; i < quoteBytes; i++) scratch[quote + i] = buf[l3 + i];
  const icmpChecksum = ~fold16(ones16(scratch, icmp, quote + quoteBytes, 0)) & 0xffff;
  scratch[icmp + 2] = icmpChecksum >> 8;
  scratch[icmp + 3] = icmpChecksum & 0xff;
  return l2Bytes + totalLength;
}

/**
 * ICMPv6 Packet Too Big (type 2 code 0, RFC 4443 3.2) with `mtu` (use tooBigMtu) about the parsed
 * IPv6 packet, written as a whole frame at scratch[scratchOffset..]: from the VIP to the client,
 * Ethernet back to the frame's source MAC from localMac, the VLAN tag kept, traffic class and
 * flow label 0, hop limit 64. Quotes as much of the packet as keeps the message within 1280 bytes
 * (1232). The checksum covers the IPv6 pseudo-header. Returns the frame length or -DropReason.
 */
export function buildPacketTooBig(
  buf: Uint8Array,
  pkt: ParsedPacket,
  mtu: number,
  localMac: Uint8Array,
  scratch: Uint8Array,
  scratchOffset: number,
): number {
  const l3 = pkt.l3Offset;
  if (pkt.family !== 6 || l3 + IPV6_HEADER_BYTES > pkt.l3End || pkt.l3End > buf.length) return ERR_TRUNCATED_IPV6;
  let quoteBytes = pkt.l3End - l3;
  const maxQuote = ICMPV6_ERROR_MAX_BYTES - IPV6_HEADER_BYTES - ICMP_HEADER_BYTES;
  if (quoteBytes > maxQuote) quoteBytes = maxQuote;
  const l2Bytes = l3 - pkt.frameOffset;
  const payloadLength = ICMP_HEADER_BYTES + quoteBytes;
  if (scratchOffset < 0 || scratchOffset + l2Bytes + IPV6_HEADER_BYTES + payloadLength > scratch.length || localMac.length < 6) {
    return ERR_NO_ROOM;
  }

  const ip = writeReplyEthernet(buf, pkt, localMac, ETHERTYPE_IPV6, scratch, scratchOffset);
  scratch[ip] = 0x60;
  scratch[ip + 1] = 0;
  scratch[ip + 2] = 0;
  scratch[ip + 3] = 0;
  scratch[ip + 4] = payloadLength >> 8;
  scratch[ip + 5] = payloadLength & 0xff;
  scratch[ip + 6] = IPPROTO_ICMPV6;
  scratch[ip + 7] = ICMP_ERROR_TTL;
  for (let i = 0; i < 16; i++) {
    scratch[ip + 8 + i] = buf[l3 + 24 + i]; // VIP
    scratch[ip + 24 + i] = buf[l3 + 8 + i]; // client
  }
  const icmp = ip + IPV6_HEADER_BYTES;
  scratch[icmp] = ICMPV6_PACKET_TOO_BIG;
  scratch[icmp + 1] = 0;
  scratch[icmp + 2] = 0;
  scratch[icmp + 3] = 0;
  scratch[icmp + 4] = (mtu >>> 24) & 0xff;
  scratch[icmp + 5] = (mtu >> 16) & 0xff;
  scratch[icmp + 6] = (mtu >> 8) & 0xff;
  scratch[icmp + 7] = mtu & 0xff;
  const quote = icmp + ICMP_HEADER_BYTES;
  for (let i = 0; i < quoteBytes; i++) scratch[quote + i] = buf[l3 + i];
  // Pseudo-header (RFC 8200 8.1): addresses, 32-bit upper-layer length, next header 58.
  let sum = ones16(scratch, ip + 8, ip + 40, payloadLength + IPPROTO_ICMPV6);
  sum = ones16(scratch, icmp, quote + quoteBytes, sum);
  const checksum = ~fold16(sum) & 0xffff;
  scratch[icmp + 2] = checksum >> 8;
  scratch[icmp + 3] = checksum & 0xff;
  return l2Bytes + IPV6_HEADER_BYTES + payloadLength;
}

/**
 * Splits an encapsulated frame (encapsulate()'s output at buf[frameOffset, +frameLength)) whose
 * outer packet exceeds `mtu` into outer fragments (RFC 791 for an IPv4 outer header, RFC 8200 4.5
 * with a fragment header for IPv6), each carrying the frame's Ethernet header and VLAN tag.
 *
 * The first fragment stays in buf: for IPv4 at frameOffset (the header rewritten, the frame cut
 * short); for IPv6 at frameOffset - 8, the Ethernet and IPv6 headers moved back to make room for
 * the fragment header, so `headroom` (bytes writable before the frame, before its
 * virtio_net_hdr; after encapsulate() that is the batch headroom minus the overhead) must be >= 8.
 * The others go to scratch from scratchOffset on, each preceded by `gapBytes` zero bytes (10 for
 * a backend that wants a virtio_net_hdr before every frame, else 0).
 * With FRAME_HAS_VNET_HDR the first fragment's virtio_net_hdr is zeroed: the caller has completed
 * any partial checksum before encapsulating (a checksum cannot be finished across fragments).
 *
 * IPv4: the identification is the one in the outer header (encapsulate's ipId); DF must be clear.
 * IPv6: `fragmentId` (32 bits) goes in every fragment header. Fragment data is a multiple of 8
 * bytes except in the last fragment; the first fragment is the largest.
 *
 * out: [count, firstOffset (in buf), firstLength, then offset and length (in scratch) of each
 * further fragment]. Returns the fragment count (1 when the frame already fits; nothing changes)
 * or -DropReason: packetTooBig for DF set, an MTU below 68 / 1280, or out/scratch/headroom too
 * small (nothing changes on a negative return).
 */
export function fragmentOuter(
  buf: Uint8Array,
  frameOffset: number,
  frameLength: number,
  headroom: number,
  frameFlags: number,
  mtu: number,
  fragmentId: number,
  scratch: Uint8Array,
  scratchOffset: number,
  gapBytes: number,
  out: Int32Array,
): number {
  const frameEnd = frameOffset + frameLength;
  if (frameOffset < 0 || frameEnd > buf.length || frameLength < 14) return ERR_TRUNCATED_ETHERNET;
  let l2Bytes = 14;
  let etherType = (buf[frameOffset + 12] << 8) | buf[frameOffset + 13];
  if (etherType === ETHERTYPE_VLAN) {
    if (frameLength < 18) return ERR_TRUNCATED_ETHERNET;
    l2Bytes = 18;
    etherType = (buf[frameOffset + 16] << 8) | buf[frameOffset + 17];
  }
  const ip = frameOffset + l2Bytes;
  const vnetBytes = (frameFlags & FRAME_HAS_VNET_HDR) !== 0 ? VNET_HDR_LEN : 0;
  if (etherType === ETHERTYPE_IPV4) {
    return fragmentIpv4(buf, frameOffset, frameEnd, l2Bytes, ip, vnetBytes, mtu, scratch, scratchOffset, gapBytes, out);
  }
  if (etherType === ETHERTYPE_IPV6) {
    return fragmentIpv6(buf, frameOffset, frameEnd, l2Bytes, ip, headroom, vnetBytes, mtu, fragmentId, scratch, scratchOffset, gapBytes, out);
  }
  return ERR_TRUNCATED_ETHERNET;
}

function fragmentIpv4(
  buf: Uint8Array,
  frameOffset: number,
  frameEnd: number,
  l2Bytes: number,
  ip: number,
  vnetBytes: number,
  mtu: number,
  scratch: Uint8Array,
  scratchOffset: number,
  gapBytes: number,
  out: Int32Array,
): number {
  if (ip + IPV4_HEADER_BYTES > frameEnd) return ERR_TRUNCATED_IPV4;
  // Only a plain 20-byte header (ours): options would need per-option copy rules (RFC 791).
  if (buf[ip] !== 0x45) return ERR_TRUNCATED_IPV4;
  const totalLength = (buf[ip + 2] << 8) | buf[ip + 3];
  if (totalLength < IPV4_HEADER_BYTES || ip + totalLength > frameEnd) return ERR_TRUNCATED_IPV4;
  if (totalLength <= mtu) {
    if (out.length < 3) return ERR_NO_ROOM;
    out[0] = 1;
    out[1] = frameOffset;
    out[2] = l2Bytes + totalLength;
    return 1;
  }
  const flagsOffset = (buf[ip + 6] << 8) | buf[ip + 7];
  if ((flagsOffset & IPV4_DF) !== 0) return ERR_TOO_BIG;
  const maxData = ((mtu - IPV4_HEADER_BYTES) >> 3) << 3;
  if (maxData < 8) return ERR_TOO_BIG;
  const dataBytes = totalLength - IPV4_HEADER_BYTES;
  const count = Math.ceil(dataBytes / maxData);
  if (out.length < 1 + 2 * count) return ERR_NO_ROOM;
  const restBytes = dataBytes - maxData;
  const needed = (count - 1) * (gapBytes + l2Bytes + IPV4_HEADER_BYTES) + restBytes;
  if (scratchOffset < 0 || gapBytes < 0 || scratchOffset + needed > scratch.length) return ERR_NO_ROOM;

  // A packet that is itself a fragment keeps its place: offsets add to its own, and its MF carries to the last piece.
  const baseUnits = flagsOffset & 0x1fff;
  const lastMoreFragments = flagsOffset & IPV4_MF;
  let pos = scratchOffset;
  for (let k = 1; k < count; k++) {
    for (let i = 0; i < gapBytes; i++) scratch[pos + i] = 0;
    pos += gapBytes;
    const start = pos;
    const dataStart = k * maxData;
    const pieceBytes = k === count - 1 ? dataBytes - dataStart : maxData;
    for (let i = 0; i < l2Bytes + IPV4_HEADER_BYTES; i++) scratch[pos + i] = buf[frameOffset + i];
    const fip = pos + l2Bytes;
    writeIpv4FragmentFields(scratch, fip, IPV4_HEADER_BYTES + pieceBytes, baseUnits + (dataStart >> 3), k === count - 1 ? lastMoreFragments : IPV4_MF);
    const from = ip + IPV4_HEADER_BYTES + dataStart;
    const to = fip + IPV4_HEADER_BYTES;
    for (let i = 0; i < pieceBytes; i++) scratch[to + i] = buf[from + i];
    pos = to + pieceBytes;
    out[1 + 2 * k] = start;
    out[2 + 2 * k] = pos - start;
  }
  writeIpv4FragmentFields(buf, ip, IPV4_HEADER_BYTES + maxData, baseUnits, IPV4_MF);
  if (vnetBytes !== 0) for (let i = frameOffset - VNET_HDR_LEN; i < frameOffset; i++) buf[i] = 0;
  out[0] = count;
  out[1] = frameOffset;
  out[2] = l2Bytes + IPV4_HEADER_BYTES + maxData;
  return count;
}

/** Total length, flags (DF clear) and offset of one IPv4 fragment, then its header checksum. */
function writeIpv4FragmentFields(b: Uint8Array, ip: number, totalLength: number, offsetUnits: number, moreFragments: number): void {
  b[ip + 2] = totalLength >> 8;
  b[ip + 3] = totalLength & 0xff;
  const flagsOffset = moreFragments | offsetUnits;
  b[ip + 6] = flagsOffset >> 8;
  b[ip + 7] = flagsOffset & 0xff;
  const checksum = ipv4HeaderChecksum(b, ip, IPV4_HEADER_BYTES);
  b[ip + 10] = checksum >> 8;
  b[ip + 11] = checksum & 0xff;
}

function fragmentIpv6(
  buf: Uint8Array,
  frameOffset: number,
  frameEnd: number,
  l2Bytes: number,
  ip: number,
  headroom: number,
  vnetBytes: number,
  mtu: number,
  fragmentId: number,
  scratch: Uint8Array,
  scratchOffset: number,
  gapBytes: number,
  out: Int32Array,
): number {
  if (ip + IPV6_HEADER_BYTES > frameEnd) return ERR_TRUNCATED_IPV6;
  const payloadLength = (buf[ip + 4] << 8) | buf[ip + 5];
  if (payloadLength === 0 || ip + IPV6_HEADER_BYTES + payloadLength > frameEnd) return ERR_TRUNCATED_IPV6;
  if (IPV6_HEADER_BYTES + payloadLength <= mtu) {
    if (out.length < 3) return ERR_NO_ROOM;
    out[0] = 1;
    out[1] = frameOffset;
    out[2] = l2Bytes + IPV6_HEADER_BYTES + payloadLength;
    return 1;
  }
  if (mtu < IPV6_MIN_MTU) return ERR_TOO_BIG;
  const nextHeader = buf[ip + 6];
  // Hop-by-hop and routing headers belong to the unfragmentable part; our outer header has neither.
  if (nextHeader === 0 || nextHeader === 43 || nextHeader === IPV6_NEXT_FRAGMENT) return ERR_TOO_BIG;
  const maxData = ((mtu - IPV6_HEADER_BYTES - IPV6_FRAGMENT_HEADER_BYTES) >> 3) << 3;
  const count = Math.ceil(payloadLength / maxData);
  if (out.length < 1 + 2 * count) return ERR_NO_ROOM;
  const perFragment = l2Bytes + IPV6_HEADER_BYTES + IPV6_FRAGMENT_HEADER_BYTES;
  const needed = (count - 1) * (gapBytes + perFragment) + payloadLength - maxData;
  if (scratchOffset < 0 || gapBytes < 0 || scratchOffset + needed > scratch.length) return ERR_NO_ROOM;
  const start0 = frameOffset - IPV6_FRAGMENT_HEADER_BYTES;
  if (headroom < IPV6_FRAGMENT_HEADER_BYTES || start0 - vnetBytes < 0) return ERR_NO_ROOM;

  // Further fragments first: they copy the headers before the first fragment moves them.
  let pos = scratchOffset;
  for (let k = 1; k < count; k++) {
    for (let i = 0; i < gapBytes; i++) scratch[pos + i] = 0;
    pos += gapBytes;
    const start = pos;
    const dataStart = k * maxData;
    const last = k === count - 1;
    const pieceBytes = last ? payloadLength - dataStart : maxData;
    for (let i = 0; i < l2Bytes + IPV6_HEADER_BYTES; i++) scratch[pos + i] = buf[frameOffset + i];
    writeIpv6FragmentHeaders(scratch, pos + l2Bytes, nextHeader, pieceBytes, dataStart, last ? 0 : 1, fragmentId);
    const from = ip + IPV6_HEADER_BYTES + dataStart;
    const to = start + perFragment;
    for (let i = 0; i < pieceBytes; i++) scratch[to + i] = buf[from + i];
    pos = to + pieceBytes;
    out[1 + 2 * k] = start;
    out[2 + 2 * k] = pos - start;
  }
  // Destination 8 bytes before the source: a forward copy reads every byte before overwriting it.
  for (let i = 0; i < l2Bytes + IPV6_HEADER_BYTES; i++) buf[start0 + i] = buf[frameOffset + i];
  writeIpv6FragmentHeaders(buf, start0 + l2Bytes, nextHeader, maxData, 0, 1, fragmentId);
  if (vnetBytes !== 0) for (let i = start0 - VNET_HDR_LEN; i < start0; i++) buf[i] = 0;
  out[0] = count;
  out[1] = start0;
  out[2] = perFragment + maxData;
  return count;
}

/** Payload length and next header of an IPv6 fragment's header, then its fragment header (RFC 8200 4.5). */
function writeIpv6FragmentHeaders(
  b: Uint8Array,
  ip: number,
  nextHeader: number,
  pieceBytes: number,
  offsetBytes: number,
  more: number,
  fragmentId: number,
): void {
  const payloadLength = IPV6_FRAGMENT_HEADER_BYTES + pieceBytes;
  b[ip + 4] = payloadLength >> 8;
  b[ip + 5] = payloadLength & 0xff;
  b[ip + 6] = IPV6_NEXT_FRAGMENT;
  const f = ip + IPV6_HEADER_BYTES;
  b[f] = nextHeader;
  b[f + 1] = 0;
  const offsetFlags = offsetBytes | more; // offset in 8-byte units in the top 13 bits = bytes, 8-aligned
  b[f + 2] = (offsetFlags >> 8) & 0xff;
  b[f + 3] = offsetFlags & 0xff;
  b[f + 4] = (fragmentId >>> 24) & 0xff;
  b[f + 5] = (fragmentId >> 16) & 0xff;
  b[f + 6] = (fragmentId >> 8) & 0xff;
  b[f + 7] = fragmentId & 0xff;
}

/** Per-client buckets kept: direct-mapped by address, a new client takes over its slot afresh. */
export const TOO_BIG_PEER_SLOTS = 1024;
const BUCKET_WORDS = 3; // [tokens, lastMs, started]

/**
 * Token buckets for the ICMP too-big messages a packet loop sends: one for the loop, `burst`
 * messages at once refilled at `ratePerSecond`, since RFC 4443 2.4 (f) requires a limit on ICMPv6
 * errors; and one per client (`peerBurst`, `peerRatePerSecond`), so that one client sending big
 * packets as fast as it can does not use up the loop's budget that other clients need to learn the
 * tunnel's MTU. A client is an IPv4 address or an IPv6 /64: anyone holding a /64 could otherwise
 * take a fresh bucket per address. (Linux exempts these messages from its ICMP limits altogether,
 * icmp_ratemask, as PMTU discovery depends on them; hence the generous per-client share.) nowMs
 * comes from the packet loop's clock; a clock that steps back refills nothing.
 */
export class TooBigRateLimiter {
  readonly ratePerSecond: number;
  readonly burst: number;
  readonly peerRatePerSecond: number;
  readonly peerBurst: number;
  /**
   * Buckets as [tokens, lastMs, started] triples, the loop's at 0 and the clients' after it:
   * fractional numbers kept in a Float64Array because V8 boxes a fractional number stored in an
   * object field, one allocation per update.
   */
  private readonly buckets = new Float64Array(BUCKET_WORDS * (1 + TOO_BIG_PEER_SLOTS));
  /** The client of each slot: family, then two words (an IPv4 address, or an IPv6 /64). */
  private readonly peerFamily = new Uint8Array(TOO_BIG_PEER_SLOTS);
  private readonly peerWords = new Uint32Array(2 * TOO_BIG_PEER_SLOTS);

  constructor(ratePerSecond: number, burst: number, peerRatePerSecond = ratePerSecond, peerBurst = burst) {
    checkRate('ratePerSecond', ratePerSecond);
    checkBurst('burst', burst);
    checkRate('peerRatePerSecond', peerRatePerSecond);
    checkBurst('peerBurst', peerBurst);
    this.ratePerSecond = ratePerSecond;
    this.burst = burst;
    this.peerRatePerSecond = peerRatePerSecond;
    this.peerBurst = peerBurst;
  }

  /**
   * True when a message to the client at `addr` (ParsedPacket.addr's source words; an IPv4 address
   * in word 0) may be sent now; then it takes a token from the client's bucket and from the loop's.
   * Neither is charged unless both have one.
   */
  allow(nowMs: number, family: number, addr: Uint32Array): boolean {
    const w0 = addr[0]!;
    const w1 = family === 4 ? 0 : addr[1]!;
    const slot = mix32Int32(mix32Int32(family ^ w0) ^ w1) & (TOO_BIG_PEER_SLOTS - 1);
    const words = this.peerWords;
    const b = this.buckets;
    const at = BUCKET_WORDS * (1 + slot);
    if (this.peerFamily[slot] !== family || words[2 * slot] !== w0 || words[2 * slot + 1] !== w1) {
      this.peerFamily[slot] = family;
      words[2 * slot] = w0;
      words[2 * slot + 1] = w1;
      b[at + 2] = 0; // a fresh bucket for the slot's new client
    }
    refill(b, at, nowMs, this.peerRatePerSecond, this.peerBurst);
    refill(b, 0, nowMs, this.ratePerSecond, this.burst);
    if (b[at]! < 1 || b[0]! < 1) return false;
    b[at] = b[at]! - 1;
    b[0] = b[0]! - 1;
    return true;
  }
}

/** Brings the bucket at `at` up to date: full on first use, then refilled for the time since. */
function refill(b: Float64Array, at: number, nowMs: number, ratePerSecond: number, burst: number): void {
  if (b[at + 2] === 0) {
    b[at + 2] = 1;
    b[at] = burst;
    b[at + 1] = nowMs;
  } else if (nowMs > b[at + 1]!) {
    const refilled = b[at]! + ((nowMs - b[at + 1]!) * ratePerSecond) / 1000;
    b[at] = refilled > burst ? burst : refilled;
    b[at + 1] = nowMs;
  }
}

function checkRate(name: string, value: number): void {
  if (!(value >= 0) || !Number.isFinite(value)) throw new RangeError(`TooBigRateLimiter: ${name} must be a finite number >= 0, got ${value}`);
}

function checkBurst(name: string, value: number): void {
  if (!(value >= 1) || !Number.isFinite(value)) throw new RangeError(`TooBigRateLimiter: ${name} must be a finite number >= 1, got ${value}`);
}
