// IP-in-IP DSR encapsulation: outer header templates built once per snapshot (control plane) and
// the per-packet encapsulate() that prepends a new Ethernet header and the outer IPv4/IPv6 header
// in the frame's headroom. Covers 4in4 (protocol 4), 6in6 (41), 4in6 (4) and 6in4 (41).
//
// Template slot (TUNNEL_TEMPLATE_BYTES per real, so a snapshot keeps them in one Uint8Array
// indexed by real id * TUNNEL_TEMPLATE_BYTES):
//   [0, 40)   the outer header as sent, with every per-packet field zero (IPv4: TOS, total length,
//             identification, flags, checksum; IPv6: traffic class, flow label, payload length)
//   [40]      outer family (4 | 6); 0 marks an empty slot (no tunnel for this real)
//   [41]      outer header length (20 | 40) = the encapsulation overhead in bytes
//   [42, 44)  IPv4: the folded one's-complement sum of the template's header words (big-endian)
//   [44, 46)  outer ethertype (0x0800 | 0x86dd, big-endian)
//   [46]      inner family the template was built for (4 | 6)
//
// encapsulate(buf, pkt, headroom, frameFlags, templates, templateOffset, nextHopMac,
//             nextHopMacOffset, localMac, ipId, flowLabel, out): 0 | -DropReason
//   Input: the frame parsed into `pkt` (parseFrame: frameOffset, vlanTci, l3Offset, l3End,
//   family, trafficClass, dontFragment). `headroom` = bytes writable before the frame, counted
//   before its virtio_net_hdr when frameFlags has FRAME_HAS_VNET_HDR (the afpacket TX contract).
//   Output frame, written in place so that it ends where the inner IP packet ends (Ethernet
//   padding is dropped): [dst = next hop MAC][src = localMac][802.1Q tag copied from the input
//   when it had one, PCP and VID unchanged][outer ethertype][outer IP header][inner IP packet,
//   untouched]. out[0] = new frame offset, out[1] = new frame length. The input's Ethernet
//   addresses are overwritten; the inner packet's bytes are not moved.
//   With FRAME_HAS_VNET_HDR the 10-byte virtio_net_hdr is moved to sit right before the new frame
//   and its csum_start gains the prepended bytes (NEEDS_CSUM), so a partial checksum stays valid.
//   GSO super-frames are refused (virtio_net_hdr cannot describe GSO inside an IPIP tunnel).
//   Outer fields: source and destination from the template; TTL / hop limit 64; DSCP and ECN
//   copied from the inner header (RFC 2003 3.1, RFC 6040 normal mode); IPv4 outer DF copied from
//   an inner IPv4 packet (RFC 2003 3.1) and clear for inner IPv6 (RFC 4213 3.2: the tunnel is
//   fragmented by its own rules); identification 0 when DF is set (an atomic datagram, RFC 6864,
//   as Linux does) else `ipId`; IPv6 outer flow label = `flowLabel` (RFC 6438: one per inner flow,
//   e.g. the flow hash). The IPv4 checksum is the template's partial sum plus TOS, total length,
//   identification and DF, folded: nothing else is summed per packet.
//   The caller checks the MTU first (too-big.ts mtuCheck): encapsulate() only refuses outer
//   packets whose length field would pass 65535.

import ipaddr from 'ipaddr.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import { ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, IPPROTO_IPIP, IPPROTO_IPV6, type ParsedPacket } from '../dataplane/parsed-packet.js';
import { FRAME_GSO, FRAME_HAS_VNET_HDR, VNET_HDR_LEN } from '../io/packet-io.js';

export const TUNNEL_TEMPLATE_BYTES = 48;
export const TEMPLATE_FAMILY = 40;
export const TEMPLATE_HEADER_LENGTH = 41;
export const TEMPLATE_PARTIAL_SUM = 42;
export const TEMPLATE_ETHERTYPE = 44;
export const TEMPLATE_INNER_FAMILY = 46;

export const OUTER_TTL = 64;
const IPV4_HEADER_BYTES = 20;
const IPV6_HEADER_BYTES = 40;
const ETHERNET_ADDRESSES_BYTES = 12;
const IPV4_DF = 0x4000;
/** virtio_net_hdr: flags byte, VIRTIO_NET_HDR_F_NEEDS_CSUM, little-endian csum_start at byte 6. */
const VNET_FLAGS = 0;
const VNET_NEEDS_CSUM = 1;
const VNET_CSUM_START = 6;

// Negated once here so the per-packet code returns plain constants.
/** The slot holds no template (no tunnel source of the outer family, or a family mismatch). */
const ERR_NO_TEMPLATE = -DropReason.ipipUnsupported;
/** Not enough headroom before the frame for the outer header. No closer reason exists yet: see the report. */
const ERR_NO_HEADROOM = -DropReason.ipipUnsupported;
const ERR_GSO = -DropReason.gsoUnsupported;
const ERR_TOO_BIG = -DropReason.packetTooBig;

/** The outer header length of a template slot (20 | 40), or -1 for an empty or out-of-range slot. */
export function tunnelOverheadBytes(templates: Uint8Array, templateOffset: number): number {
  if (templateOffset < 0 || templateOffset + TUNNEL_TEMPLATE_BYTES > templates.length) return -1;
  if (templates[templateOffset + TEMPLATE_FAMILY] === 0) return -1;
  return templates[templateOffset + TEMPLATE_HEADER_LENGTH];
}

/**
 * Control plane: writes the template slot for tunnelling packets of `innerFamily` from
 * `outerSrc` to `realAddr` (both of the outer family) at templates[templateOffset..]. Throws on
 * unparsable addresses, mismatched families or a slot that does not fit.
 */
export function writeTunnelTemplate(
  outerSrc: string,
  realAddr: string,
  innerFamily: 4 | 6,
  templates: Uint8Array,
  templateOffset: number,
): void {
  const src = addressBytes(outerSrc);
  const dst = addressBytes(realAddr);
  if (src.length !== dst.length) {
    throw new RangeError(`tunnel source ${outerSrc} and real ${realAddr} are not of the same family`);
  }
  if (innerFamily !== 4 && innerFamily !== 6) throw new RangeError(`inner family must be 4 or 6, got ${String(innerFamily)}`);
  if (templateOffset < 0 || templateOffset + TUNNEL_TEMPLATE_BYTES > templates.length) {
    throw new RangeError(`template slot at ${templateOffset} does not fit ${templates.length} bytes`);
  }
  const t = templates.subarray(templateOffset, templateOffset + TUNNEL_TEMPLATE_BYTES);
  t.fill(0);
  const protocol = innerFamily === 4 ? IPPROTO_IPIP : IPPROTO_IPV6;
  if (src.length === 4) {
    t[0] = 0x45;
    t[8] = OUTER_TTL;
    t[9] = protocol;
    t.set(src, 12);
    t.set(dst, 16);
    let sum = 0;
    for (let i = 0; i < IPV4_HEADER_BYTES; i += 2) sum += (t[i] << 8) | t[i + 1];
    while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
    t[TEMPLATE_FAMILY] = 4;
    t[TEMPLATE_HEADER_LENGTH] = IPV4_HEADER_BYTES;
    t[TEMPLATE_PARTIAL_SUM] = sum >> 8;
    t[TEMPLATE_PARTIAL_SUM + 1] = sum & 0xff;
    t[TEMPLATE_ETHERTYPE] = ETHERTYPE_IPV4 >> 8;
    t[TEMPLATE_ETHERTYPE + 1] = ETHERTYPE_IPV4 & 0xff;
  } else {
    t[0] = 0x60;
    t[6] = protocol;
    t[7] = OUTER_TTL;
    t.set(src, 8);
    t.set(dst, 24);
    t[TEMPLATE_FAMILY] = 6;
    t[TEMPLATE_HEADER_LENGTH] = IPV6_HEADER_BYTES;
    t[TEMPLATE_ETHERTYPE] = ETHERTYPE_IPV6 >> 8;
    t[TEMPLATE_ETHERTYPE + 1] = ETHERTYPE_IPV6 & 0xff;
  }
  t[TEMPLATE_INNER_FAMILY] = innerFamily;
}

/** Dotted-quad IPv4 or IPv6 text to bytes; refuses the classful short forms ipaddr.js accepts ("192.0.2"). */
function addressBytes(text: string): number[] {
  if (!text.includes(':') && !ipaddr.IPv4.isValidFourPartDecimal(text)) throw new RangeError(`not an IPv4 or IPv6 address: ${text}`);
  return ipaddr.parse(text).toByteArray();
}

/** Control plane: one template slot in a fresh array (see writeTunnelTemplate). */
export function buildTunnelTemplate(outerSrc: string, realAddr: string, innerFamily: 4 | 6): Uint8Array {
  const t = new Uint8Array(TUNNEL_TEMPLATE_BYTES);
  writeTunnelTemplate(outerSrc, realAddr, innerFamily, t, 0);
  return t;
}

/**
 * Hot path: encapsulates the parsed frame in place (see the module header for every field).
 * Returns 0 with out[0] = new frame offset and out[1] = new frame length, or -DropReason:
 * ipipUnsupported (empty or out-of-range slot, a slot built for the other inner family, headroom
 * below the overhead, a MAC offset out of range), gsoUnsupported (FRAME_GSO), packetTooBig (a
 * length field would pass 65535).
 * On a negative return the frame is unchanged.
 */
export function encapsulate(
  buf: Uint8Array,
  pkt: ParsedPacket,
  headroom: number,
  frameFlags: number,
  templates: Uint8Array,
  templateOffset: number,
  nextHopMac: Uint8Array,
  nextHopMacOffset: number,
  localMac: Uint8Array,
  ipId: number,
  flowLabel: number,
  out: Int32Array,
): number {
  if (templateOffset < 0 || templateOffset + TUNNEL_TEMPLATE_BYTES > templates.length) return ERR_NO_TEMPLATE;
  const outerFamily = templates[templateOffset + TEMPLATE_FAMILY];
  if (outerFamily === 0 || templates[templateOffset + TEMPLATE_INNER_FAMILY] !== pkt.family) return ERR_NO_TEMPLATE;
  if ((frameFlags & FRAME_GSO) !== 0) return ERR_GSO;
  const overhead = templates[templateOffset + TEMPLATE_HEADER_LENGTH];
  const frameOffset = pkt.frameOffset;
  const l3 = pkt.l3Offset;
  const innerLength = pkt.l3End - l3;
  const vnetLength = (frameFlags & FRAME_HAS_VNET_HDR) !== 0 ? VNET_HDR_LEN : 0;
  if (headroom < overhead || frameOffset - vnetLength - overhead < 0) return ERR_NO_HEADROOM;
  if (pkt.l3End > buf.length || innerLength <= 0) return ERR_NO_TEMPLATE;
  if (nextHopMacOffset < 0 || nextHopMacOffset + 6 > nextHopMac.length || localMac.length < 6) return ERR_NO_TEMPLATE;
  const outerLength = overhead + innerLength;
  // The IPv4 total length counts the outer header; the IPv6 payload length does not.
  if ((outerFamily === 4 ? outerLength : innerLength) > 0xffff) return ERR_TOO_BIG;

  const start = frameOffset - overhead;
  if (vnetLength !== 0) {
    // The new Ethernet and outer headers cover the old virtio_net_hdr: move it out first.
    const from = frameOffset - VNET_HDR_LEN;
    const to = start - VNET_HDR_LEN;
    for (let i = 0; i < VNET_HDR_LEN; i++) buf[to + i] = buf[from + i];
    if ((buf[to + VNET_FLAGS] & VNET_NEEDS_CSUM) !== 0) {
      const csumStart = (buf[to + VNET_CSUM_START] | (buf[to + VNET_CSUM_START + 1] << 8)) + overhead;
      buf[to + VNET_CSUM_START] = csumStart & 0xff;
      buf[to + VNET_CSUM_START + 1] = (csumStart >> 8) & 0xff;
    }
  }

  for (let i = 0; i < 6; i++) {
    buf[start + i] = nextHopMac[nextHopMacOffset + i];
    buf[start + 6 + i] = localMac[i];
  }
  let pos = start + ETHERNET_ADDRESSES_BYTES;
  const tci = pkt.vlanTci;
  if (tci >= 0) {
    buf[pos] = ETHERTYPE_VLAN >> 8;
    buf[pos + 1] = ETHERTYPE_VLAN & 0xff;
    buf[pos + 2] = (tci >> 8) & 0xff;
    buf[pos + 3] = tci & 0xff;
    pos += 4;
  }
  buf[pos] = templates[templateOffset + TEMPLATE_ETHERTYPE];
  buf[pos + 1] = templates[templateOffset + TEMPLATE_ETHERTYPE + 1];
  pos += 2;
  // pos is now l3 - overhead: the outer header ends exactly where the inner packet begins.
  for (let i = 0; i < overhead; i++) buf[pos + i] = templates[templateOffset + i];

  const tos = pkt.trafficClass & 0xff;
  if (outerFamily === 4) {
    const df = pkt.family === 4 && pkt.dontFragment !== 0 ? IPV4_DF : 0;
    const id = df !== 0 ? 0 : ipId & 0xffff;
    buf[pos + 1] = tos;
    buf[pos + 2] = outerLength >> 8;
    buf[pos + 3] = outerLength & 0xff;
    buf[pos + 4] = id >> 8;
    buf[pos + 5] = id & 0xff;
    buf[pos + 6] = df >> 8;
    let sum =
      ((templates[templateOffset + TEMPLATE_PARTIAL_SUM] << 8) | templates[templateOffset + TEMPLATE_PARTIAL_SUM + 1]) +
      tos +
      outerLength +
      id +
      df;
    sum = (sum & 0xffff) + (sum >>> 16);
    sum = (sum & 0xffff) + (sum >>> 16);
    const checksum = ~sum & 0xffff;
    buf[pos + 10] = checksum >> 8;
    buf[pos + 11] = checksum & 0xff;
  } else {
    const label = flowLabel & 0xfffff;
    buf[pos] = 0x60 | (tos >> 4);
    buf[pos + 1] = ((tos & 0x0f) << 4) | (label >> 16);
    buf[pos + 2] = (label >> 8) & 0xff;
    buf[pos + 3] = label & 0xff;
    buf[pos + 4] = innerLength >> 8;
    buf[pos + 5] = innerLength & 0xff;
  }
  out[0] = start;
  out[1] = pkt.l3End - start;
  return 0;
}
