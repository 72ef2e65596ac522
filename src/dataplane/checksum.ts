// Internet checksum helpers (RFC 1071, RFC 1624) for the hot path: IPv4 header, TCP/UDP/ICMP
// checksums with the IPv4/IPv6 pseudo-header, and finishing CHECKSUM_PARTIAL frames that veth
// senders with TX offload hand us (lab-facts.md). Allocation-free; reads are clamped to the buffer.

import {
  IPPROTO_ICMP,
  IPPROTO_ICMPV6,
  IPPROTO_TCP,
  IPPROTO_UDP,
  type ParsedPacket,
} from './parsed-packet.js';

const TCP_CHECKSUM_OFFSET = 16;
const UDP_CHECKSUM_OFFSET = 6;
const ICMP_CHECKSUM_OFFSET = 2;
const IPV4_CHECKSUM_OFFSET = 10;

/**
 * Adds the bytes buf[start, end) to `initial` as big-endian 16-bit words; an odd last byte is the
 * high half of a word padded with zero. The result is UNFOLDED (a plain sum, exact in a double far
 * beyond any 64 KB packet), so sums over several ranges chain cheaply; fold16() it at the end.
 * Only an even-length range may be followed by another range (the word alignment carries over).
 */
export function ones16(buf: Uint8Array, start: number, end: number, initial: number): number {
  if (start < 0) start = 0;
  if (end > buf.length) end = buf.length;
  let sum = initial;
  let i = start;
  const evenEnd = end - ((end - start) & 1);
  for (; i < evenEnd; i += 2) sum += (buf[i] << 8) | buf[i + 1];
  if (i < end) sum += buf[i] << 8;
  return sum;
}

/** Folds carries back in (end-around carry) until the sum fits 16 bits. 0 stays 0. */
export function fold16(sum: number): number {
  // Division by 2^16 is exact on doubles, so this stays correct above 2^32 where >>> would not.
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 0x10000);
  return sum;
}

/** The IPv4 header checksum to store at l3Offset + 10 (the field's current value is ignored). */
export function ipv4HeaderChecksum(buf: Uint8Array, l3Offset: number, headerLength: number): number {
  let sum = ones16(buf, l3Offset, l3Offset + IPV4_CHECKSUM_OFFSET, 0);
  sum = ones16(buf, l3Offset + IPV4_CHECKSUM_OFFSET + 2, l3Offset + headerLength, sum);
  return ~fold16(sum) & 0xffff;
}

/**
 * Where the L4 checksum field sits (absolute offset), or -1 when the packet has none we handle:
 * no L4 header (non-first fragment, protocol 59) or a protocol other than TCP, UDP, ICMP (IPv4)
 * and ICMPv6 (IPv6).
 */
export function l4ChecksumOffset(pkt: ParsedPacket): number {
  const l4 = pkt.l4Offset;
  if (l4 < 0) return -1;
  const protocol = pkt.ipProtocol;
  if (protocol === IPPROTO_TCP) return l4 + TCP_CHECKSUM_OFFSET;
  if (protocol === IPPROTO_UDP) return l4 + UDP_CHECKSUM_OFFSET;
  if (protocol === (pkt.family === 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6)) return l4 + ICMP_CHECKSUM_OFFSET;
  return -1;
}

/** End of the bytes the L4 checksum covers: the UDP length field for UDP (it may be shorter than the IP payload), else l3End. */
function l4ChecksumEnd(buf: Uint8Array, pkt: ParsedPacket): number {
  if (pkt.ipProtocol === IPPROTO_UDP) {
    const l4 = pkt.l4Offset;
    return l4 + ((buf[l4 + 4] << 8) | buf[l4 + 5]);
  }
  return pkt.l3End;
}

/**
 * The folded, uncomplemented pseudo-header sum (RFC 793 / RFC 768 for IPv4, RFC 8200 section 8.1
 * for IPv6) over the addresses in the buffer, ipProtocol and the upper-layer length. This is what a
 * CHECKSUM_PARTIAL sender leaves in the checksum field. Assumes a parsed packet with l4Offset >= 0.
 * An IPv6 routing header would change the destination used here; this helper uses the header's.
 */
export function pseudoHeaderSum(buf: Uint8Array, pkt: ParsedPacket): number {
  const l3 = pkt.l3Offset;
  let sum = pkt.ipProtocol + (l4ChecksumEnd(buf, pkt) - pkt.l4Offset);
  if (pkt.family === 4) sum = ones16(buf, l3 + 12, l3 + 20, sum);
  else sum = ones16(buf, l3 + 8, l3 + 40, sum);
  return fold16(sum);
}

/**
 * The L4 checksum to store for a parsed packet: TCP, UDP and ICMPv6 with the pseudo-header, ICMP
 * (IPv4) without one. UDP's computed 0 is returned as 0xffff (RFC 768: 0 means "no checksum").
 * Returns -1 when there is nothing to compute: no checksum field we handle (see l4ChecksumOffset),
 * a fragment of a larger datagram (its checksum covers bytes we do not have), or a header too short
 * to hold the field.
 */
export function l4Checksum(buf: Uint8Array, pkt: ParsedPacket): number {
  const field = l4ChecksumOffset(pkt);
  if (field < 0 || pkt.moreFragments !== 0 || pkt.fragmentOffset !== 0) return -1;
  const end = l4ChecksumEnd(buf, pkt);
  if (field + 2 > end) return -1;
  const protocol = pkt.ipProtocol;
  let sum = protocol === IPPROTO_ICMP ? 0 : pseudoHeaderSum(buf, pkt);
  sum = ones16(buf, pkt.l4Offset, field, sum);
  sum = ones16(buf, field + 2, end, sum);
  const checksum = ~fold16(sum) & 0xffff;
  return checksum === 0 && protocol === IPPROTO_UDP ? 0xffff : checksum;
}

/**
 * Finishes a CHECKSUM_PARTIAL frame in place: if the L4 checksum field holds exactly the folded
 * pseudo-header sum, computes the full checksum, stores it and returns true; otherwise leaves the
 * frame alone and returns false. ICMP over IPv4 has no pseudo-header and is never partial.
 *
 * A complete frame whose checksum happens to equal its pseudo-header sum (about 1 in 65536) is
 * harmless: the checksum is computed with the field itself excluded, so recomputing a correct
 * checksum writes back the same value. Only a frame that was already corrupt AND matches would be
 * "repaired", and the Ethernet FCS has already dropped nearly all of those.
 */
export function completePartialChecksum(buf: Uint8Array, pkt: ParsedPacket): boolean {
  const field = l4ChecksumOffset(pkt);
  if (field < 0 || pkt.ipProtocol === IPPROTO_ICMP) return false;
  if (field + 2 > pkt.l3End || field + 2 > buf.length) return false;
  const stored = (buf[field] << 8) | buf[field + 1];
  if (stored !== pseudoHeaderSum(buf, pkt)) return false;
  const checksum = l4Checksum(buf, pkt);
  if (checksum < 0) return false;
  buf[field] = checksum >> 8;
  buf[field + 1] = checksum & 0xff;
  return true;
}

/**
 * RFC 1624 equation 3: the new checksum after one 16-bit word of the covered data changes from
 * oldWord to newWord, HC' = ~(~HC + ~m + m'). A UDP checksum of 0 (none) must not be updated, and
 * a UDP result of 0 must be stored as 0xffff; both are the caller's to handle.
 */
export function incrementalUpdate16(oldCsum: number, oldWord: number, newWord: number): number {
  const sum = (~oldCsum & 0xffff) + (~oldWord & 0xffff) + (newWord & 0xffff);
  return ~fold16(sum) & 0xffff;
}
