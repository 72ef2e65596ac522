// ICMP addressed to a VIP: the flow an error message is about (so the engine can hand it to the
// real that serves that flow), and echo replies built in place.
// Allocation-free; every read is bounded by the packet's l3End.

import { incrementalUpdate16 } from '../dataplane/checksum.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import {
  IPPROTO_ICMP,
  IPPROTO_ICMPV6,
  IPPROTO_TCP,
  IPPROTO_UDP,
  type ParsedPacket,
} from '../dataplane/parsed-packet.js';

/** Words in a flow key: [protocol | family << 8, src0..3, dst0..3, srcPort << 16 | dstPort]. */
export const FLOW_KEY_WORDS = 10;

const ICMP_ECHO_REPLY = 0;
const ICMP_DEST_UNREACHABLE = 3;
const ICMP_ECHO_REQUEST = 8;
const ICMP_TIME_EXCEEDED = 11;
/** Timestamp (13) to address mask reply (18): queries and answers, no errors. */
const ICMP_TIMESTAMP = 13;
const ICMP_ADDRESS_MASK_REPLY = 18;
const ICMPV6_DEST_UNREACHABLE = 1;
const ICMPV6_PACKET_TOO_BIG = 2;
const ICMPV6_TIME_EXCEEDED = 3;
const ICMPV6_ECHO_REQUEST = 128;
const ICMPV6_ECHO_REPLY = 129;
/** Type, code, checksum and the 4-byte rest of header (unused + MTU, id + sequence). */
const ICMP_HEADER_BYTES = 8;
const IPV4_HEADER_BYTES = 20;
const IPV6_HEADER_BYTES = 40;
const PORT_BYTES = 4;
const REPLY_TTL = 64;
const MAX_QUOTED_EXTENSION_HEADERS = 8;

// Negated once here so the per-packet code returns plain constants.
const ERR_NOT_HANDLED = -DropReason.icmpToVip;
const ERR_TRUNCATED_ICMP = -DropReason.truncatedIcmp;

/**
 * An ICMP error that quotes the packet it is about, which for a message to a VIP is a reply a real
 * sent from it: destination unreachable (fragmentation needed among its codes; Packet Too Big in
 * ICMPv6) and time exceeded. The real that serves the quoted flow gets it, as IPVS
 * (ip_vs_in_icmp) and Katran hand them on: its path MTU, and its sockets learn of the error (a
 * connected UDP socket's ECONNREFUSED). Redirects and parameter problems are not about a flow.
 */
export function isErrorAboutFlow(pkt: ParsedPacket): boolean {
  const type = pkt.icmpType;
  if (pkt.family === 4) return pkt.ipProtocol === IPPROTO_ICMP && (type === ICMP_DEST_UNREACHABLE || type === ICMP_TIME_EXCEEDED);
  return pkt.ipProtocol === IPPROTO_ICMPV6 && (type === ICMPV6_DEST_UNREACHABLE || type === ICMPV6_PACKET_TOO_BIG || type === ICMPV6_TIME_EXCEEDED);
}

/**
 * An ICMP error message of any kind (RFC 1122 3.2.2: no error is sent about one): IPv4 types other
 * than the echo, timestamp, information and address-mask queries and answers; ICMPv6 types
 * below 128 (RFC 4443 2.1).
 */
export function isIcmpError(pkt: ParsedPacket): boolean {
  if (pkt.l4Offset < 0) return false;
  const type = pkt.icmpType;
  if (pkt.family === 4) return pkt.ipProtocol === IPPROTO_ICMP && type !== ICMP_ECHO_REPLY && type !== ICMP_ECHO_REQUEST && (type < ICMP_TIMESTAMP || type > ICMP_ADDRESS_MASK_REPLY);
  return pkt.ipProtocol === IPPROTO_ICMPV6 && type < 128;
}

/**
 * For an ICMP error about a flow (isErrorAboutFlow) parsed into `pkt`, reads the quoted
 * packet (the real's reply, VIP -> client: IP header, IPv6 extension headers, then the first
 * bytes of TCP/UDP) and writes the key of the ORIGINAL client -> VIP flow into out[0..9]:
 * [0] = protocol | family << 8; [1..4] = source words (the quoted destination, the client);
 * [5..8] = destination words (the quoted source, the VIP); [9] = (srcPort << 16 | dstPort) >>> 0
 * with srcPort = the quoted destination port. IPv4 uses words 1 and 5 and zeroes 2..4 and 6..8,
 * as ParsedPacket.addr does.
 *
 * Returns 0, or -DropReason: icmpToVip for another ICMP type, a fragment of the message, a quote
 * of another family, a quoted source that is not the message's destination (the VIP), a quoted
 * non-first fragment or a protocol other than TCP/UDP; truncatedIcmp when the quote stops before
 * the ports. `out` is written only on success.
 */
export function parseEmbeddedFlow(buf: Uint8Array, pkt: ParsedPacket, out: Uint32Array): number {
  const l4 = pkt.l4Offset;
  if (l4 < 0 || out.length < FLOW_KEY_WORDS) return ERR_NOT_HANDLED;
  let end = pkt.l3End;
  if (end > buf.length) end = buf.length;
  const q = l4 + ICMP_HEADER_BYTES;
  if (!isErrorAboutFlow(pkt)) return ERR_NOT_HANDLED;
  if (pkt.family === 4) {
    if (pkt.isFragment !== 0) return ERR_NOT_HANDLED;
    if (q + IPV4_HEADER_BYTES > end) return ERR_TRUNCATED_ICMP;
    if (buf[q] >> 4 !== 4) return ERR_NOT_HANDLED;
    const headerBytes = (buf[q] & 0x0f) << 2;
    if (headerBytes < IPV4_HEADER_BYTES) return ERR_NOT_HANDLED;
    if ((((buf[q + 6] << 8) | buf[q + 7]) & 0x1fff) !== 0) return ERR_NOT_HANDLED;
    const protocol = buf[q + 9];
    if (protocol !== IPPROTO_TCP && protocol !== IPPROTO_UDP) return ERR_NOT_HANDLED;
    const quotedSrc = readWord32(buf, q + 12);
    if (quotedSrc !== (pkt.addr[4]! | 0)) return ERR_NOT_HANDLED;
    const ports = q + headerBytes;
    if (ports + PORT_BYTES > end) return ERR_TRUNCATED_ICMP;
    out[0] = protocol | (4 << 8);
    out[1] = readWord32(buf, q + 16);
    out[2] = 0;
    out[3] = 0;
    out[4] = 0;
    out[5] = quotedSrc;
    out[6] = 0;
    out[7] = 0;
    out[8] = 0;
    out[9] = swappedPorts(buf, ports);
    return 0;
  }
  if (pkt.isFragment !== 0) return ERR_NOT_HANDLED;
  if (q + IPV6_HEADER_BYTES > end) return ERR_TRUNCATED_ICMP;
  if (buf[q] >> 4 !== 6) return ERR_NOT_HANDLED;
  const addr = pkt.addr;
  for (let i = 0; i < 4; i++) if (readWord32(buf, q + 8 + (i << 2)) !== (addr[4 + i]! | 0)) return ERR_NOT_HANDLED;
  let nextHeader = buf[q + 6];
  let pos = q + IPV6_HEADER_BYTES;
  for (let walked = 0; ; walked++) {
    if (nextHeader === IPPROTO_TCP || nextHeader === IPPROTO_UDP) break;
    const fragment = nextHeader === 44;
    if (walked === MAX_QUOTED_EXTENSION_HEADERS || !(nextHeader === 0 || nextHeader === 43 || nextHeader === 60 || nextHeader === 51 || fragment)) {
      return ERR_NOT_HANDLED;
    }
    if (pos + 8 > end) return ERR_TRUNCATED_ICMP;
    if (fragment && (((buf[pos + 2] << 8) | buf[pos + 3]) & 0xfff8) !== 0) return ERR_NOT_HANDLED;
    const headerBytes = fragment ? 8 : nextHeader === 51 ? (buf[pos + 1] + 2) << 2 : (buf[pos + 1] + 1) << 3;
    nextHeader = buf[pos];
    pos += headerBytes;
  }
  if (pos + PORT_BYTES > end) return ERR_TRUNCATED_ICMP;
  out[0] = nextHeader | (6 << 8);
  for (let i = 0; i < 4; i++) {
    out[1 + i] = readWord32(buf, q + 24 + (i << 2));
    out[5 + i] = addr[4 + i];
  }
  out[9] = swappedPorts(buf, pos);
  return 0;
}

/**
 * The quoted (sport, dport) read as the original flow's (dport, sport): dport << 16 | sport, as an
 * int32 (the Uint32Array key word takes the same bits). Not made unsigned here: a client port of
 * 32768 or more would make it a heap number wherever this is not inlined.
 */
function swappedPorts(buf: Uint8Array, ports: number): number {
  const quotedSrcPort = (buf[ports] << 8) | buf[ports + 1];
  const quotedDstPort = (buf[ports + 2] << 8) | buf[ports + 3];
  return (quotedDstPort << 16) | quotedSrcPort;
}

/**
 * 32 bits big-endian as an int32, compared with a Uint32Array word as `word | 0` and stored in one
 * as it is. Not made unsigned (as packet-parser's readWord32): an address word of 2^31 or more (any
 * IPv4 address from 128.0.0.0, fd00::/8) would be a heap number, one allocation per call that V8
 * does not inline (an ICMPv6 too-big message about an fd00:: client made two).
 */
function readWord32(buf: Uint8Array, pos: number): number {
  return (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3];
}

/**
 * Whether the source address of the IP packet whose header starts at `l3` names one host, so that
 * an ICMP answer or error may go to it (RFC 1122 3.2.1.3 and 3.2.2, RFC 4443 2.4): not IPv4
 * 0.0.0.0/8, multicast or 240.0.0.0/4 (the limited broadcast among them), not IPv6 :: or multicast.
 * A directed broadcast (a subnet's last address) cannot be told from here.
 */
export function isSingleHostSource(buf: Uint8Array, family: number, l3: number): boolean {
  if (family === 4) {
    const first = buf[l3 + 12]!;
    return first !== 0 && first < 224;
  }
  const src = l3 + 8;
  if (buf[src] === 0xff) return false;
  for (let i = 0; i < 16; i++) if (buf[src + i] !== 0) return true;
  return false;
}

/** The IPv4 don't-fragment bit in the flags/fragment-offset word. */
const IPV4_DF_FLAG = 0x4000;

/**
 * Turns the ICMP echo request (type 8) / ICMPv6 echo request (128) parsed into `pkt` into its
 * reply in place: Ethernet addresses swapped, IP addresses swapped (the reply comes from the VIP),
 * TTL / hop limit 64, type 0 / 129; the IPv4 header checksum and the ICMP/ICMPv6 checksum are
 * updated incrementally (RFC 1624; swapping the addresses leaves both the IPv4 header sum and the
 * ICMPv6 pseudo-header sum as they are). The VLAN tag, DSCP/ECN, identifier, sequence and data
 * stay. Returns the reply frame's length (it starts at pkt.frameOffset and ends with the IP
 * packet: Ethernet padding is left out), or -DropReason: icmpToVip for anything else, including
 * fragments, IPv4 options, IPv6 extension headers and a source that is no single host (never
 * answered); truncatedIcmp when the
 * echo header is cut. A partial checksum must be completed before (checksum.ts).
 */
export function buildEchoReply(buf: Uint8Array, pkt: ParsedPacket): number {
  const l3 = pkt.l3Offset;
  const l4 = pkt.l4Offset;
  const family = pkt.family;
  if (l4 < 0 || pkt.isFragment !== 0 || pkt.icmpCode !== 0) return ERR_NOT_HANDLED;
  if (family === 4) {
    if (pkt.ipProtocol !== IPPROTO_ICMP || pkt.icmpType !== ICMP_ECHO_REQUEST || pkt.l3HeaderLength !== IPV4_HEADER_BYTES) {
      return ERR_NOT_HANDLED;
    }
  } else if (family === 6) {
    if (pkt.ipProtocol !== IPPROTO_ICMPV6 || pkt.icmpType !== ICMPV6_ECHO_REQUEST || pkt.l3HeaderLength !== IPV6_HEADER_BYTES) {
      return ERR_NOT_HANDLED;
    }
  } else {
    return ERR_NOT_HANDLED;
  }
  if (!isSingleHostSource(buf, family, l3)) return ERR_NOT_HANDLED;
  if (l4 + ICMP_HEADER_BYTES > pkt.l3End || pkt.l3End > buf.length) return ERR_TRUNCATED_ICMP;

  const frame = pkt.frameOffset;
  for (let i = 0; i < 6; i++) {
    const b = buf[frame + i];
    buf[frame + i] = buf[frame + 6 + i];
    buf[frame + 6 + i] = b;
  }
  const addrBytes = family === 4 ? 4 : 16;
  const src = family === 4 ? l3 + 12 : l3 + 8;
  for (let i = 0; i < addrBytes; i++) {
    const b = buf[src + i];
    buf[src + i] = buf[src + addrBytes + i];
    buf[src + addrBytes + i] = b;
  }
  if (family === 4) {
    const oldTtlWord = (buf[l3 + 8] << 8) | buf[l3 + 9];
    buf[l3 + 8] = REPLY_TTL;
    let ipChecksum = incrementalUpdate16((buf[l3 + 10] << 8) | buf[l3 + 11], oldTtlWord, (REPLY_TTL << 8) | IPPROTO_ICMP);
    // DF off, as Linux sends echo replies (its ICMP socket does no PMTU discovery): a router on a
    // smaller MTU back to the client fragments the reply, where with the request's DF it sent
    // fragmentation-needed to the VIP and the ping was lost for good (a large-ping MTU check).
    const oldFlagsWord = (buf[l3 + 6] << 8) | buf[l3 + 7];
    const flagsWord = oldFlagsWord & ~IPV4_DF_FLAG;
    buf[l3 + 6] = flagsWord >> 8;
    ipChecksum = incrementalUpdate16(ipChecksum, oldFlagsWord, flagsWord);
    // A request with DF from a Linux ping socket has IP id 0: the replies, which a router may now
    // fragment, must not all share it (their fragments would meet in the client's reassembly). The
    // echo identifier and sequence give each reply of a ping run its own.
    if (buf[l3 + 4] === 0 && buf[l3 + 5] === 0 && l4 + 8 <= pkt.l3End) {
      const id = (((buf[l4 + 4] << 8) | buf[l4 + 5]) ^ ((buf[l4 + 6] << 8) | buf[l4 + 7])) || 1;
      buf[l3 + 4] = id >> 8;
      buf[l3 + 5] = id & 0xff;
      ipChecksum = incrementalUpdate16(ipChecksum, 0, id);
    }
    buf[l3 + 10] = ipChecksum >> 8;
    buf[l3 + 11] = ipChecksum & 0xff;
  } else {
    buf[l3 + 7] = REPLY_TTL;
  }
  const requestType = buf[l4];
  const replyType = family === 4 ? ICMP_ECHO_REPLY : ICMPV6_ECHO_REPLY;
  buf[l4] = replyType;
  // The code byte is 0 in both: the type/code word changes from requestType << 8 to replyType << 8.
  let checksum = incrementalUpdate16((buf[l4 + 2] << 8) | buf[l4 + 3], requestType << 8, replyType << 8);
  // An all-zero ICMPv4 reply (id 0, seq 0, no data) sums to 0: only 0xffff verifies then (RFC 1071),
  // and 0xffff verifies whatever the sum, so a 0 result is always stored as 0xffff. (ICMPv6's
  // pseudo-header never sums to 0.)
  if (checksum === 0) checksum = 0xffff;
  buf[l4 + 2] = checksum >> 8;
  buf[l4 + 3] = checksum & 0xff;
  return pkt.l3End - frame;
}
