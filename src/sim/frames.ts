// Minimal Ethernet/IPv4|IPv6/TCP|UDP frames for the simulator and the planner, written into a
// caller's buffer so the real engine can parse them; plus the synthetic real MACs the simulator
// gives each real id, so a forwarded frame's destination MAC says which real it went to.

import { addressWords } from '../control/addresses.js';
import { FLOW_KEY_WORDS } from '../dataplane/flow-hash.js';
import { ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_TCP, IPPROTO_UDP } from '../dataplane/parsed-packet.js';

const ETHERNET_BYTES = 14;
const IPV4_BYTES = 20;
const IPV6_BYTES = 40;
const TCP_BYTES = 20;
const UDP_BYTES = 8;
/** Largest frame writeFrame produces: Ethernet + IPv6 + TCP, no payload. */
export const MAX_SIM_FRAME_BYTES = ETHERNET_BYTES + IPV6_BYTES + TCP_BYTES;

/** Locally administered, so they can never collide with a real NIC's MAC in a capture. */
const REAL_MAC_PREFIX = [0x02, 0xd5, 0x1b, 0x00] as const;
export const SIM_LB_MAC = Uint8Array.of(0x02, 0xd5, 0x1b, 0xff, 0xff, 0xfe);
const SIM_CLIENT_MAC = Uint8Array.of(0x02, 0xd5, 0x1b, 0xff, 0xff, 0xfd);

/** The MAC the simulator gives real id `id` (ids are < 65536): 02:d5:1b:00:hi:lo. */
export function simRealMac(id: number): Uint8Array {
  if (!Number.isInteger(id) || id < 0 || id > 0xffff) throw new RangeError(`real id ${id} does not fit a simulated MAC`);
  return Uint8Array.of(REAL_MAC_PREFIX[0], REAL_MAC_PREFIX[1], REAL_MAC_PREFIX[2], REAL_MAC_PREFIX[3], id >> 8, id & 0xff);
}

/** The real id a frame at buf[off] was sent to, from its destination MAC; -1 if not a simulated real's MAC. */
export function simRealIdOfFrame(buf: Uint8Array, off: number): number {
  for (let i = 0; i < 4; i++) if (buf[off + i] !== REAL_MAC_PREFIX[i]) return -1;
  return (buf[off + 4]! << 8) | buf[off + 5]!;
}

/** One direction of a flow as the client sends it. */
export interface SimTuple {
  readonly family: 4 | 6;
  readonly protocol: 'tcp' | 'udp';
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly vip: string;
  readonly vipPort: number;
}

/** Precomputed address words of a tuple, so repeated frames cost no parsing. */
export interface PreparedTuple extends SimTuple {
  readonly srcWords: Uint32Array;
  readonly dstWords: Uint32Array;
}

export function prepareTuple(t: SimTuple): PreparedTuple {
  return { ...t, srcWords: addressWords(t.clientAddress), dstWords: addressWords(t.vip) };
}

/**
 * Writes a client->VIP frame at buf[off] and returns its length. TCP carries `tcpFlags` and no
 * payload; UDP an empty datagram. Checksums are correct (the engine does not verify them, but a
 * frame someone dumps from the simulator should be a valid one).
 */
export function writeFrame(buf: Uint8Array, off: number, t: PreparedTuple, tcpFlags: number, seq: number): number {
  const isTcp = t.protocol === 'tcp';
  const l4Bytes = isTcp ? TCP_BYTES : UDP_BYTES;
  const l3Bytes = t.family === 4 ? IPV4_BYTES : IPV6_BYTES;
  const length = ETHERNET_BYTES + l3Bytes + l4Bytes;
  if (off < 0 || off + length > buf.length) throw new RangeError('frame does not fit the buffer');
  buf.fill(0, off, off + length);
  buf.set(SIM_LB_MAC, off);
  buf.set(SIM_CLIENT_MAC, off + 6);
  put16(buf, off + 12, t.family === 4 ? ETHERTYPE_IPV4 : ETHERTYPE_IPV6);
  const l3 = off + ETHERNET_BYTES;
  const protocol = isTcp ? IPPROTO_TCP : IPPROTO_UDP;
  if (t.family === 4) {
    buf[l3] = 0x45;
    put16(buf, l3 + 2, IPV4_BYTES + l4Bytes);
    put16(buf, l3 + 6, 0x4000); // DF
    buf[l3 + 8] = 64;
    buf[l3 + 9] = protocol;
    put32(buf, l3 + 12, t.srcWords[0]!);
    put32(buf, l3 + 16, t.dstWords[0]!);
    put16(buf, l3 + 10, ~fold(sum16(buf, l3, l3 + IPV4_BYTES, 0)) & 0xffff);
  } else {
    buf[l3] = 0x60;
    put16(buf, l3 + 4, l4Bytes);
    buf[l3 + 6] = protocol;
    buf[l3 + 7] = 64;
    for (let i = 0; i < 4; i++) {
      put32(buf, l3 + 8 + i * 4, t.srcWords[i]!);
      put32(buf, l3 + 24 + i * 4, t.dstWords[i]!);
    }
  }
  const l4 = l3 + l3Bytes;
  put16(buf, l4, t.clientPort);
  put16(buf, l4 + 2, t.vipPort);
  let checksumAt: number;
  if (isTcp) {
    put32(buf, l4 + 4, seq >>> 0);
    buf[l4 + 12] = (TCP_BYTES / 4) << 4;
    buf[l4 + 13] = tcpFlags;
    put16(buf, l4 + 14, 65535);
    checksumAt = l4 + 16;
  } else {
    put16(buf, l4 + 4, UDP_BYTES);
    checksumAt = l4 + 6;
  }
  // Pseudo-header (RFC 793 / RFC 768 / RFC 8200 section 8.1), then the L4 header itself.
  let sum = protocol + l4Bytes;
  sum = t.family === 4 ? sum16(buf, l3 + 12, l3 + 20, sum) : sum16(buf, l3 + 8, l3 + 40, sum);
  sum = sum16(buf, l4, l4 + l4Bytes, sum);
  let checksum = ~fold(sum) & 0xffff;
  if (checksum === 0 && !isTcp) checksum = 0xffff;
  put16(buf, checksumAt, checksum);
  return length;
}

/**
 * The engine's flow key for a tuple (the layout of FlowTable.key: protocol | family << 8, source
 * words, destination words, ports), so the control plane can name a flow the way the table does.
 */
export function flowKeyOf(t: PreparedTuple, out: Uint32Array, offset = 0): void {
  if (offset < 0 || offset + FLOW_KEY_WORDS > out.length) throw new RangeError('flow key does not fit');
  out[offset] = (t.protocol === 'tcp' ? IPPROTO_TCP : IPPROTO_UDP) | (t.family << 8);
  for (let i = 0; i < 4; i++) {
    out[offset + 1 + i] = t.srcWords[i]!;
    out[offset + 5 + i] = t.dstWords[i]!;
  }
  out[offset + 9] = ((t.clientPort << 16) | t.vipPort) >>> 0;
}

function put16(buf: Uint8Array, pos: number, value: number): void {
  buf[pos] = (value >>> 8) & 0xff;
  buf[pos + 1] = value & 0xff;
}

function put32(buf: Uint8Array, pos: number, value: number): void {
  buf[pos] = (value >>> 24) & 0xff;
  buf[pos + 1] = (value >>> 16) & 0xff;
  buf[pos + 2] = (value >>> 8) & 0xff;
  buf[pos + 3] = value & 0xff;
}

function sum16(buf: Uint8Array, start: number, end: number, initial: number): number {
  let sum = initial;
  for (let i = start; i < end; i += 2) sum += (buf[i]! << 8) | (buf[i + 1] ?? 0);
  return sum;
}

function fold(sum: number): number {
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 0x10000);
  return sum;
}
