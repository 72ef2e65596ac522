// Small packet builders for tests: each returns a fresh Uint8Array with correct lengths and
// checksums, nested as ethernet(..., ipv4(..., tcp(..., payload, {src, dst}))). Addresses are
// strings ("10.0.0.1", "2001:db8::1"), MACs "02:00:00:00:00:01". Checksums are computed here
// independently of src/dataplane/checksum.ts so tests can check one against the other.

import ipaddr from 'ipaddr.js';

export type Bytes = Uint8Array | readonly number[] | string;

/** The addresses an L4 builder needs for its pseudo-header; the family follows from their form. */
export interface PseudoHeaderAddresses {
  src: string;
  dst: string;
}

export const ETH_IPV4 = 0x0800;
export const ETH_IPV6 = 0x86dd;
export const ETH_ARP = 0x0806;
export const ETH_VLAN = 0x8100;

/** Payload from bytes, a number array or a string (its UTF-8 bytes). */
export function bytes(data: Bytes = []): Uint8Array {
  if (typeof data === 'string') return new TextEncoder().encode(data);
  return Uint8Array.from(data);
}

export function concat(...parts: Bytes[]): Uint8Array {
  const arrays = parts.map(bytes);
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let pos = 0;
  for (const a of arrays) {
    out.set(a, pos);
    pos += a.length;
  }
  return out;
}

/** Lower-case hex, no separators. */
export function hex(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('hex');
}

/** Hex to bytes; whitespace is ignored and "#" starts a comment to the end of the line. */
export function fromHex(text: string): Uint8Array {
  const digits = text.replace(/#.*$/gm, '').replace(/\s+/g, '');
  if (!/^([0-9a-fA-F]{2})*$/.test(digits)) throw new Error(`fromHex: not an even run of hex digits: ${digits}`);
  return Uint8Array.from(Buffer.from(digits, 'hex'));
}

/** A copy of `frame` with bytes written from `offset` on (for malformed-packet vectors). */
export function patch(frame: Uint8Array, offset: number, ...values: number[]): Uint8Array {
  const out = Uint8Array.from(frame);
  values.forEach((v, i) => (out[offset + i] = v));
  return out;
}

export function mac(text: string): Uint8Array {
  const parts = text.split(':');
  if (parts.length !== 6) throw new Error(`bad MAC ${text}`);
  return Uint8Array.from(parts.map((p) => parseInt(p, 16)));
}

export function ipBytes(text: string): Uint8Array {
  return Uint8Array.from(ipaddr.parse(text).toByteArray());
}

/** Folded one's-complement sum of the concatenated parts (each part even-length except the last). */
export function onesSum(...parts: Uint8Array[]): number {
  const all = concat(...parts);
  let sum = 0;
  for (let i = 0; i < all.length; i += 2) sum += (all[i] << 8) | (all[i + 1] ?? 0);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return sum;
}

/**
 * Rewrites the IPv4 header checksum of the header at buf[l3] in place (for tests that change header
 * fields after building); does nothing when the bytes there are not an IPv4 header that fits.
 */
export function refreshIpv4Checksum(buf: Uint8Array, l3: number): Uint8Array {
  const headerBytes = (buf[l3] & 0x0f) << 2;
  if (buf[l3] >> 4 !== 4 || headerBytes < 20 || l3 + headerBytes > buf.length) return buf;
  put16(buf, l3 + 10, 0);
  put16(buf, l3 + 10, ~onesSum(buf.subarray(l3, l3 + headerBytes)) & 0xffff);
  return buf;
}

function put16(buf: Uint8Array, pos: number, value: number): void {
  buf[pos] = (value >> 8) & 0xff;
  buf[pos + 1] = value & 0xff;
}

function put32(buf: Uint8Array, pos: number, value: number): void {
  put16(buf, pos, value >>> 16);
  put16(buf, pos + 2, value & 0xffff);
}

export function ethernet(
  h: { dst: string; src: string; vlan?: number; type: number },
  payload: Bytes = [],
): Uint8Array {
  const tag = new Uint8Array(h.vlan === undefined ? 0 : 4);
  if (h.vlan !== undefined) {
    put16(tag, 0, ETH_VLAN);
    put16(tag, 2, h.vlan);
  }
  const type = new Uint8Array(2);
  put16(type, 0, h.type);
  return concat(mac(h.dst), mac(h.src), tag, type, payload);
}

/** IPv4 with a correct header checksum. fragOffset is in bytes (a multiple of 8); options are zero-padded to 4 bytes. */
export function ipv4(
  h: {
    src: string;
    dst: string;
    proto: number;
    ttl?: number;
    tos?: number;
    id?: number;
    df?: boolean;
    mf?: boolean;
    fragOffset?: number;
    options?: Bytes;
  },
  payload: Bytes = [],
): Uint8Array {
  const options = bytes(h.options);
  const headerBytes = 20 + Math.ceil(options.length / 4) * 4;
  const body = bytes(payload);
  const header = new Uint8Array(headerBytes);
  header[0] = 0x40 | (headerBytes >> 2);
  header[1] = h.tos ?? 0;
  put16(header, 2, headerBytes + body.length);
  put16(header, 4, h.id ?? 0);
  put16(header, 6, (h.df ? 0x4000 : 0) | (h.mf ? 0x2000 : 0) | ((h.fragOffset ?? 0) >> 3));
  header[8] = h.ttl ?? 64;
  header[9] = h.proto;
  header.set(ipBytes(h.src), 12);
  header.set(ipBytes(h.dst), 16);
  header.set(options, 20);
  put16(header, 10, ~onesSum(header) & 0xffff);
  return concat(header, body);
}

/** One IPv6 extension header: `bytes` is the whole header; its first byte (next header) is filled in by ipv6(). */
export interface ExtensionHeader {
  type: number;
  bytes: Bytes;
}

/**
 * IPv6 with the extension headers chained in order: each header's next-header byte names the
 * following one, the last names `nextHeader`.
 */
export function ipv6(
  h: {
    src: string;
    dst: string;
    nextHeader: number;
    hopLimit?: number;
    trafficClass?: number;
    flowLabel?: number;
    extensionHeaders?: ExtensionHeader[];
  },
  payload: Bytes = [],
): Uint8Array {
  const ext = h.extensionHeaders ?? [];
  const chain = ext.map((e, i) => {
    const b = bytes(e.bytes);
    b[0] = i + 1 < ext.length ? ext[i + 1].type : h.nextHeader;
    return b;
  });
  const rest = concat(...chain, payload);
  const header = new Uint8Array(40);
  const tc = h.trafficClass ?? 0;
  put32(header, 0, ((6 << 28) | (tc << 20) | ((h.flowLabel ?? 0) & 0xfffff)) >>> 0);
  put16(header, 4, rest.length);
  header[6] = ext.length > 0 ? ext[0].type : h.nextHeader;
  header[7] = h.hopLimit ?? 64;
  header.set(ipBytes(h.src), 8);
  header.set(ipBytes(h.dst), 24);
  return concat(header, rest);
}

/** A hop-by-hop (0) or destination-options (60) header, padded with PadN to a multiple of 8 bytes. */
export function ipv6Options(type: 0 | 60, options: Bytes = []): ExtensionHeader {
  const opts = bytes(options);
  const total = Math.ceil((2 + opts.length) / 8) * 8;
  const b = new Uint8Array(total);
  b[1] = total / 8 - 1;
  b.set(opts, 2);
  const pad = total - 2 - opts.length;
  if (pad === 1) b[2 + opts.length] = 0; // Pad1
  else if (pad > 1) b[2 + opts.length + 1] = pad - 2; // PadN: type 1, length
  if (pad > 1) b[2 + opts.length] = 1;
  return { type, bytes: b };
}

/** A fragment header (44); offset in bytes (a multiple of 8). */
export function ipv6Fragment(f: { offset: number; more: boolean; id: number }): ExtensionHeader {
  const b = new Uint8Array(8);
  put16(b, 2, (f.offset & 0xfff8) | (f.more ? 1 : 0));
  put32(b, 4, f.id);
  return { type: 44, bytes: b };
}

/** The pseudo-header (RFC 768/793 for IPv4, RFC 8200 section 8.1 for IPv6). */
export function pseudoHeader(ip: PseudoHeaderAddresses, protocol: number, upperLength: number): Uint8Array {
  const src = ipBytes(ip.src);
  const dst = ipBytes(ip.dst);
  const tail = new Uint8Array(src.length === 4 ? 4 : 8);
  if (src.length === 4) {
    tail[1] = protocol;
    put16(tail, 2, upperLength);
  } else {
    put32(tail, 0, upperLength);
    tail[7] = protocol;
  }
  return concat(src, dst, tail);
}

function withChecksum(segment: Uint8Array, field: number, pseudo: Uint8Array | null, zeroAs: number): Uint8Array {
  const sum = pseudo ? onesSum(pseudo, segment) : onesSum(segment);
  const checksum = ~sum & 0xffff;
  put16(segment, field, checksum === 0 ? zeroAs : checksum);
  return segment;
}

export const TCP_FLAGS = { FIN: 0x01, SYN: 0x02, RST: 0x04, PSH: 0x08, ACK: 0x10, URG: 0x20 } as const;

/** TCP with options (zero-padded to 4 bytes) and a checksum over the pseudo-header of `ip`. */
export function tcp(
  h: {
    sport: number;
    dport: number;
    seq?: number;
    ack?: number;
    flags: number;
    window?: number;
    urgent?: number;
    options?: Bytes;
  },
  payload: Bytes = [],
  ip: PseudoHeaderAddresses,
): Uint8Array {
  const options = bytes(h.options);
  const headerBytes = 20 + Math.ceil(options.length / 4) * 4;
  const header = new Uint8Array(headerBytes);
  put16(header, 0, h.sport);
  put16(header, 2, h.dport);
  put32(header, 4, h.seq ?? 0);
  put32(header, 8, h.ack ?? 0);
  header[12] = (headerBytes >> 2) << 4;
  header[13] = h.flags;
  put16(header, 14, h.window ?? 65535);
  put16(header, 18, h.urgent ?? 0);
  header.set(options, 20);
  const segment = concat(header, payload);
  return withChecksum(segment, 16, pseudoHeader(ip, 6, segment.length), 0);
}

/** UDP with a checksum over the pseudo-header of `ip` (a computed 0 is sent as 0xffff). */
export function udp(h: { sport: number; dport: number }, payload: Bytes = [], ip: PseudoHeaderAddresses): Uint8Array {
  const datagram = concat(new Uint8Array(8), payload);
  put16(datagram, 0, h.sport);
  put16(datagram, 2, h.dport);
  put16(datagram, 4, datagram.length);
  return withChecksum(datagram, 6, pseudoHeader(ip, 17, datagram.length), 0xffff);
}

/** ICMP (IPv4): type, code, the 4-byte "rest of header" as one number, then the body. No pseudo-header. */
export function icmp(h: { type: number; code?: number; rest?: number }, payload: Bytes = []): Uint8Array {
  const message = concat(new Uint8Array(8), payload);
  message[0] = h.type;
  message[1] = h.code ?? 0;
  put32(message, 4, h.rest ?? 0);
  return withChecksum(message, 2, null, 0);
}

/** ICMP echo request (type 8) or reply (type 0). */
export function icmpEcho(h: { id: number; seq: number; reply?: boolean }, payload: Bytes = []): Uint8Array {
  return icmp({ type: h.reply ? 0 : 8, code: 0, rest: ((h.id << 16) | h.seq) >>> 0 }, payload);
}

/**
 * ICMPv6 with the pseudo-header checksum. `rest` is the 4-byte field after the checksum: the MTU for
 * Packet Too Big (type 2), id << 16 | seq for echo (128/129).
 */
export function icmpv6(
  h: { type: number; code?: number; rest?: number },
  payload: Bytes = [],
  ip: PseudoHeaderAddresses,
): Uint8Array {
  const message = concat(new Uint8Array(8), payload);
  message[0] = h.type;
  message[1] = h.code ?? 0;
  put32(message, 4, h.rest ?? 0);
  return withChecksum(message, 2, pseudoHeader(ip, 58, message.length), 0);
}

/** `length` deterministic payload bytes, (i * 7 + 3) & 0xff: easy to rebuild outside this code (python, tshark). */
export function patternBytes(length: number): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (i * 7 + 3) & 0xff);
}
