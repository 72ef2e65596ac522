// Software segmentation of a GSO super-frame: a local or veth client with TSO hands the LB one TCP
// frame of up to 64 KiB plus gso_size in its virtio_net_hdr, and one with UDP GSO (UDP_SEGMENT:
// QUIC stacks send so) a train of datagrams of gso_size bytes each behind one UDP header. L2
// forwarding hands such frames back to the kernel with their GSO metadata; an IPIP tunnel cannot
// be described by virtio_net_hdr, so for IPIP reals the engine cuts the frame here into its
// segments with complete checksums, each written into caller scratch with headroom before it for
// the outer header. Allocation-free.

import { ipv4HeaderChecksum, l4Checksum } from '../dataplane/checksum.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import { parseFrame } from '../dataplane/packet-parser.js';
import { IPPROTO_TCP, IPPROTO_UDP, PARSE_OK, type ParsedPacket } from '../dataplane/parsed-packet.js';

const TCP_FIN = 0x01;
const TCP_PSH = 0x08;
const TCP_CWR = 0x80;

/**
 * Cuts the TCP frame parsed into `pkt` into segments of at most `segmentBytes` payload bytes.
 * Segment i is written at scratch[pos_i] with `headroomBytes` free bytes before it, frames
 * packed one after another from scratchOffset; out[2i] = offset, out[2i+1] = length.
 * `seg` is a second ParsedPacket the segments are parsed into (to compute their checksums).
 * Returns the number of segments, or -DropReason (nothing useful written then).
 */
export function segmentTcp(
  buf: Uint8Array,
  pkt: ParsedPacket,
  segmentBytes: number,
  scratch: Uint8Array,
  scratchOffset: number,
  headroomBytes: number,
  seg: ParsedPacket,
  out: Int32Array,
): number {
  if (pkt.ipProtocol !== IPPROTO_TCP || pkt.l4Offset < 0 || pkt.payloadOffset < 0 || segmentBytes <= 0) return -DropReason.gsoUnsupported;
  const frame = pkt.frameOffset;
  const headerBytes = pkt.payloadOffset - frame;
  const payloadBytes = pkt.l3End - pkt.payloadOffset;
  if (payloadBytes <= segmentBytes) return -DropReason.gsoUnsupported; // not a super-frame
  const count = Math.ceil(payloadBytes / segmentBytes);
  if (count * 2 > out.length) return -DropReason.gsoUnsupported;
  const tcpHeaderBytes = pkt.payloadOffset - pkt.l4Offset;
  const l3HeaderBytes = pkt.l4Offset - pkt.l3Offset;
  const l3Rel = pkt.l3Offset - frame;
  const l4Rel = pkt.l4Offset - frame;
  const seq0 = ((buf[pkt.l4Offset + 4]! << 24) | (buf[pkt.l4Offset + 5]! << 16) | (buf[pkt.l4Offset + 6]! << 8) | buf[pkt.l4Offset + 7]!) >>> 0;
  const id0 = pkt.family === 4 ? (buf[pkt.l3Offset + 4]! << 8) | buf[pkt.l3Offset + 5]! : 0;
  let pos = scratchOffset;
  for (let i = 0; i < count; i++) {
    const chunk = i === count - 1 ? payloadBytes - i * segmentBytes : segmentBytes;
    const start = pos + headroomBytes;
    const length = headerBytes + chunk;
    if (start + length > scratch.length) return -DropReason.batchFull; // the batch's extra bytes are used up
    copyBytes(buf, frame, pkt.payloadOffset, scratch, start);
    copyBytes(buf, pkt.payloadOffset + i * segmentBytes, pkt.payloadOffset + i * segmentBytes + chunk, scratch, start + headerBytes);
    const ip = start + l3Rel;
    const tcp = start + l4Rel;
    if (pkt.family === 4) {
      const total = l3HeaderBytes + tcpHeaderBytes + chunk;
      scratch[ip + 2] = total >> 8;
      scratch[ip + 3] = total & 0xff;
      const id = (id0 + i) & 0xffff;
      scratch[ip + 4] = id >> 8;
      scratch[ip + 5] = id & 0xff;
      scratch[ip + 10] = 0;
      scratch[ip + 11] = 0;
      const c = ipv4HeaderChecksum(scratch, ip, l3HeaderBytes);
      scratch[ip + 10] = c >> 8;
      scratch[ip + 11] = c & 0xff;
    } else {
      const payloadLength = l3HeaderBytes - 40 + tcpHeaderBytes + chunk;
      scratch[ip + 4] = payloadLength >> 8;
      scratch[ip + 5] = payloadLength & 0xff;
    }
    const seq = (seq0 + i * segmentBytes) >>> 0;
    scratch[tcp + 4] = seq >>> 24;
    scratch[tcp + 5] = (seq >>> 16) & 0xff;
    scratch[tcp + 6] = (seq >>> 8) & 0xff;
    scratch[tcp + 7] = seq & 0xff;
    let flags = scratch[tcp + 13]!;
    if (i !== count - 1) flags &= ~(TCP_FIN | TCP_PSH);
    if (i !== 0) flags &= ~TCP_CWR;
    scratch[tcp + 13] = flags;
    scratch[tcp + 16] = 0;
    scratch[tcp + 17] = 0;
    if (parseFrame(scratch, start, length, seg) !== PARSE_OK) return -DropReason.gsoUnsupported;
    const sum = l4Checksum(scratch, seg);
    scratch[tcp + 16] = sum >> 8;
    scratch[tcp + 17] = sum & 0xff;
    out[2 * i] = start;
    out[2 * i + 1] = length;
    pos = start + length;
  }
  return count;
}

/**
 * Cuts the UDP GSO frame parsed into `pkt` into datagrams of `segmentBytes` payload bytes (the
 * last may be shorter): the sender's own datagrams (QUIC packets), never re-cut to another size.
 * Same placement and result as segmentTcp.
 */
export function segmentUdp(
  buf: Uint8Array,
  pkt: ParsedPacket,
  segmentBytes: number,
  scratch: Uint8Array,
  scratchOffset: number,
  headroomBytes: number,
  seg: ParsedPacket,
  out: Int32Array,
): number {
  if (pkt.ipProtocol !== IPPROTO_UDP || pkt.l4Offset < 0 || pkt.payloadOffset < 0 || segmentBytes <= 0) return -DropReason.gsoUnsupported;
  const frame = pkt.frameOffset;
  const headerBytes = pkt.payloadOffset - frame;
  const payloadBytes = pkt.l3End - pkt.payloadOffset;
  const count = Math.ceil(payloadBytes / segmentBytes);
  if (count < 1 || count * 2 > out.length) return -DropReason.gsoUnsupported;
  const l3HeaderBytes = pkt.l4Offset - pkt.l3Offset;
  const l3Rel = pkt.l3Offset - frame;
  const l4Rel = pkt.l4Offset - frame;
  const id0 = pkt.family === 4 ? (buf[pkt.l3Offset + 4]! << 8) | buf[pkt.l3Offset + 5]! : 0;
  let pos = scratchOffset;
  for (let i = 0; i < count; i++) {
    const chunk = i === count - 1 ? payloadBytes - i * segmentBytes : segmentBytes;
    const start = pos + headroomBytes;
    const length = headerBytes + chunk;
    if (start + length > scratch.length) return -DropReason.batchFull;
    copyBytes(buf, frame, pkt.payloadOffset, scratch, start);
    copyBytes(buf, pkt.payloadOffset + i * segmentBytes, pkt.payloadOffset + i * segmentBytes + chunk, scratch, start + headerBytes);
    const ip = start + l3Rel;
    const udp = start + l4Rel;
    const udpLength = 8 + chunk;
    if (pkt.family === 4) {
      const total = l3HeaderBytes + udpLength;
      scratch[ip + 2] = total >> 8;
      scratch[ip + 3] = total & 0xff;
      const id = (id0 + i) & 0xffff;
      scratch[ip + 4] = id >> 8;
      scratch[ip + 5] = id & 0xff;
      scratch[ip + 10] = 0;
      scratch[ip + 11] = 0;
      const c = ipv4HeaderChecksum(scratch, ip, l3HeaderBytes);
      scratch[ip + 10] = c >> 8;
      scratch[ip + 11] = c & 0xff;
    } else {
      const payloadLength = l3HeaderBytes - 40 + udpLength;
      scratch[ip + 4] = payloadLength >> 8;
      scratch[ip + 5] = payloadLength & 0xff;
    }
    scratch[udp + 4] = udpLength >> 8;
    scratch[udp + 5] = udpLength & 0xff;
    scratch[udp + 6] = 0;
    scratch[udp + 7] = 0;
    if (parseFrame(scratch, start, length, seg) !== PARSE_OK) return -DropReason.gsoUnsupported;
    const sum = l4Checksum(scratch, seg); // a computed zero goes as 0xffff (RFC 768)
    if (sum < 0) return -DropReason.gsoUnsupported;
    scratch[udp + 6] = sum >> 8;
    scratch[udp + 7] = sum & 0xff;
    out[2 * i] = start;
    out[2 * i + 1] = length;
    pos = start + length;
  }
  return count;
}

/** Byte copy between two arrays without creating views (subarray would allocate per call). */
function copyBytes(src: Uint8Array, from: number, to: number, dst: Uint8Array, at: number): void {
  for (let i = from; i < to; i++) dst[at + i - from] = src[i]!;
}
