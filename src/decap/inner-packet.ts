// What `dsrlb decap` accepts: the checks that turn a received tunnel packet into the inner packet
// to hand to the local stack, the VIP set inner destinations must be in, and the named reasons
// for every refusal. Pure functions over (buffer, length): no allocation per packet.

import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { incrementalUpdate16 } from '../dataplane/checksum.js';

/** IP protocol numbers of the two tunnel payloads (RFC 2003, RFC 2473 / RFC 4213). */
export const IPPROTO_IPIP = 4;
export const IPPROTO_IPV6 = 41;

const IPV4_HEADER_BYTES = 20;
const IPV6_HEADER_BYTES = 40;

/** Why a tunnel packet was not handed to the stack: a stable counter slot each. */
export const DecapDrop = {
  truncatedOuter: 1, // shorter than an IPv4 header, or its IHL runs past the bytes received
  badOuterHeader: 2, // outer IPv4: not version 4, IHL < 5, or a protocol other than 4/41
  badOuterLength: 3, // outer IPv4 total length differs from the bytes the socket delivered
  truncatedInner: 4, // fewer bytes than the inner IP header
  innerVersionMismatch: 5, // protocol 4 not carrying IPv4, or 41 not carrying IPv6
  badInnerHeader: 6, // inner IPv4 IHL < 5 or past its total length
  badInnerLength: 7, // inner total / payload length differs from the bytes carried
  notVip: 8, // inner destination is none of the VIPs: refused so decap cannot inject traffic
  tunWriteFailed: 9, // the TUN device refused the inner packet
  ceOnNotEct: 10, // outer ECN CE over an inner packet that is not ECN-capable (RFC 6040: drop)
  sourceNotAllowed: 11, // the outer source is in none of --allow-source's prefixes
} as const;

export type DecapDropName = keyof typeof DecapDrop;

/** Highest drop slot + 1. */
export const DECAP_DROP_SLOTS = 12;

/** out[] slots filled by innerPacket(). */
export const INNER_OFFSET = 0;
export const INNER_LENGTH = 1;
export const INNER_FAMILY = 2;

/** The VIPs inner packets may be addressed to, as bytes (IPv4 words, IPv6 16-byte rows). */
export class VipSet {
  readonly v4: Uint32Array;
  readonly v6: Uint8Array;
  readonly v6Count: number;
  /** Canonical text forms, for logs. */
  readonly addresses: readonly string[];

  constructor(vips: readonly string[]) {
    const v4: number[] = [];
    const v6: number[][] = [];
    const addresses: string[] = [];
    for (const vip of vips) {
      const family = isIP(vip);
      if (family === 0) throw new RangeError(`${JSON.stringify(vip)} is not an IPv4 or IPv6 address`);
      const bytes = ipaddr.parse(vip).toByteArray();
      const text = ipaddr.fromByteArray(bytes).toString();
      if (addresses.includes(text)) continue;
      addresses.push(text);
      if (family === 4) v4.push(((bytes[0]! << 24) | (bytes[1]! << 16) | (bytes[2]! << 8) | bytes[3]!) >>> 0);
      else v6.push(bytes);
    }
    this.v4 = Uint32Array.from(v4);
    this.v6 = new Uint8Array(v6.length * 16);
    v6.forEach((bytes, i) => this.v6.set(bytes, i * 16));
    this.v6Count = v6.length;
    this.addresses = addresses;
  }

  get hasV4(): boolean {
    return this.v4.length > 0;
  }

  get hasV6(): boolean {
    return this.v6Count > 0;
  }

  /** True when buf[offset, offset + 4) is an IPv4 VIP. The caller checked the bounds. */
  containsV4(buf: Uint8Array, offset: number): boolean {
    const address = ((buf[offset]! << 24) | (buf[offset + 1]! << 16) | (buf[offset + 2]! << 8) | buf[offset + 3]!) >>> 0;
    for (let i = 0; i < this.v4.length; i++) if (this.v4[i] === address) return true;
    return false;
  }

  /** True when buf[offset, offset + 16) is an IPv6 VIP. The caller checked the bounds. */
  containsV6(buf: Uint8Array, offset: number): boolean {
    for (let row = 0; row < this.v6Count; row++) {
      const base = row * 16;
      let i = 0;
      while (i < 16 && this.v6[base + i] === buf[offset + i]) i++;
      if (i === 16) return true;
    }
    return false;
  }
}

/**
 * The inner packet of what an IPv4 raw socket for protocol 4 or 41 delivered: buf[0, length) is the
 * whole outer packet, IPv4 header included, fragments already reassembled by the kernel.
 * Returns 0 and fills out[INNER_OFFSET, INNER_LENGTH, INNER_FAMILY], or -DecapDrop.
 */
export function innerOfIpv4Outer(buf: Uint8Array, length: number, vips: VipSet, out: Int32Array): number {
  if (length < IPV4_HEADER_BYTES || length > buf.length) return -DecapDrop.truncatedOuter;
  const versionIhl = buf[0]!;
  const headerBytes = (versionIhl & 0x0f) * 4;
  if (versionIhl >> 4 !== 4 || headerBytes < IPV4_HEADER_BYTES) return -DecapDrop.badOuterHeader;
  if (headerBytes > length) return -DecapDrop.truncatedOuter;
  if (((buf[2]! << 8) | buf[3]!) !== length) return -DecapDrop.badOuterLength;
  const protocol = buf[9]!;
  if (protocol !== IPPROTO_IPIP && protocol !== IPPROTO_IPV6) return -DecapDrop.badOuterHeader;
  const rc = innerPacket(buf, headerBytes, length - headerBytes, protocol, vips, out);
  return rc < 0 ? rc : combineEcn(buf[1]! & ECN_MASK, buf, out[INNER_OFFSET]!, out[INNER_FAMILY]!);
}

const ECN_MASK = 3;
const ECN_NOT_ECT = 0;
const ECN_ECT1 = 1;
const ECN_ECT0 = 2;
const ECN_CE = 3;

/**
 * RFC 6040 decapsulation (normal mode, which dsrlb's encapsulation matches by copying the inner
 * ECN outward): congestion marked on the way from the LB (outer CE) reaches the inner packet, or
 * the packet is dropped when the inner is not ECN-capable; outer ECT(1) over inner ECT(0) becomes
 * ECT(1). The inner IPv4 header checksum is updated. Returns 0 or -DecapDrop.ceOnNotEct.
 */
export function combineEcn(outerEcn: number, buf: Uint8Array, inner: number, family: number): number {
  if (outerEcn !== ECN_CE && outerEcn !== ECN_ECT1) return 0;
  const innerEcn = family === 4 ? buf[inner + 1]! & ECN_MASK : (buf[inner + 1]! >> 4) & ECN_MASK;
  if (innerEcn === ECN_NOT_ECT) return outerEcn === ECN_CE ? -DecapDrop.ceOnNotEct : 0;
  if (innerEcn === ECN_CE || (outerEcn === ECN_ECT1 && innerEcn !== ECN_ECT0)) return 0;
  if (family === 6) {
    buf[inner + 1] = (buf[inner + 1]! & 0xcf) | (outerEcn << 4);
    return 0;
  }
  // IPv4: the TOS byte is the low half of header word 0; the checksum follows it (RFC 1624).
  const oldWord = (buf[inner]! << 8) | buf[inner + 1]!;
  buf[inner + 1] = (buf[inner + 1]! & ~ECN_MASK & 0xff) | outerEcn;
  const newWord = (buf[inner]! << 8) | buf[inner + 1]!;
  const check = incrementalUpdate16((buf[inner + 10]! << 8) | buf[inner + 11]!, oldWord, newWord);
  buf[inner + 10] = check >> 8;
  buf[inner + 11] = check & 0xff;
  return 0;
}

/**
 * The inner packet of what an IPv6 raw socket for next header `protocol` (4 or 41) delivered: Linux
 * strips the IPv6 header (and extension headers), so buf[0, length) is the inner packet itself.
 * `outerTrafficClass` is the stripped header's (from IPV6_TCLASS), -1 if unknown: its ECN field
 * is combined into the inner header as over IPv4.
 */
export function innerOfIpv6Outer(buf: Uint8Array, length: number, protocol: number, outerTrafficClass: number, vips: VipSet, out: Int32Array): number {
  if (length > buf.length) return -DecapDrop.truncatedInner;
  const rc = innerPacket(buf, 0, length, protocol, vips, out);
  if (rc < 0 || outerTrafficClass < 0) return rc;
  return combineEcn(outerTrafficClass & ECN_MASK, buf, out[INNER_OFFSET]!, out[INNER_FAMILY]!);
}

/**
 * Checks buf[offset, offset + length) as the inner packet of tunnel protocol `protocol`: the version
 * the protocol promises, a header that fits, a length field equal to the bytes carried, and a VIP
 * as destination. Returns 0 (out filled) or -DecapDrop.
 */
export function innerPacket(buf: Uint8Array, offset: number, length: number, protocol: number, vips: VipSet, out: Int32Array): number {
  if (length < 1) return -DecapDrop.truncatedInner;
  const version = buf[offset]! >> 4;
  if (protocol === IPPROTO_IPIP) {
    if (version !== 4) return -DecapDrop.innerVersionMismatch;
    if (length < IPV4_HEADER_BYTES) return -DecapDrop.truncatedInner;
    const headerBytes = (buf[offset]! & 0x0f) * 4;
    const totalBytes = (buf[offset + 2]! << 8) | buf[offset + 3]!;
    if (headerBytes < IPV4_HEADER_BYTES || headerBytes > totalBytes) return -DecapDrop.badInnerHeader;
    if (totalBytes !== length) return -DecapDrop.badInnerLength;
    if (!vips.containsV4(buf, offset + 16)) return -DecapDrop.notVip;
    out[INNER_FAMILY] = 4;
  } else if (protocol === IPPROTO_IPV6) {
    if (version !== 6) return -DecapDrop.innerVersionMismatch;
    if (length < IPV6_HEADER_BYTES) return -DecapDrop.truncatedInner;
    // A zero payload length with more bytes is a jumbogram (RFC 2675), which no 1500-byte path carries.
    if (IPV6_HEADER_BYTES + ((buf[offset + 4]! << 8) | buf[offset + 5]!) !== length) return -DecapDrop.badInnerLength;
    if (!vips.containsV6(buf, offset + 24)) return -DecapDrop.notVip;
    out[INNER_FAMILY] = 6;
  } else {
    return -DecapDrop.badOuterHeader;
  }
  out[INNER_OFFSET] = offset;
  out[INNER_LENGTH] = length;
  return 0;
}
