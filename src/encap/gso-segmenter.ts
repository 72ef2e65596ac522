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
 * Cuts the GSO frame parsed into `pkt` into its segments of at most `segmentBytes` payload bytes:
 * TCP segments (sequence numbers advanced, FIN/PSH on the last only, CWR on the first only), or
 * the datagrams of a UDP train (each its own UDP length; the sender's own datagrams, never re-cut
 * to another size). Segment i is written at scratch[pos_i] with `headroomBytes` free bytes before
 * it, frames packed one after another from scratchOffset; out[2i] = offset, out[2i+1] = length.
 * IPv4 ids count up from the frame's. `seg` is a second ParsedPacket the segments are parsed into
 * (to compute their checksums). Returns the number of segments, or -DropReason (nothing useful
 * written then).
 */
export function segmentGso(
  buf: Uint8Array,
  pkt: ParsedPacket,
  segmentBytes: number,
  scratch: Uint8Array,
  scratchOffset: number,
  headroomBytes: number,
  seg: ParsedPacket,
  out: Int32Array,
): number {
  const tcp = pkt.ipProtocol === IPPROTO_TCP;
  if ((!tcp && pkt.ipProtocol !== IPPROTO_UDP) || pkt.l4Offset < 0 || pkt.payloadOffset < 0 || segmentBytes <= 0) return -DropReason.gsoUnsupported;
  const frame = pkt.frameOffset;
  const headerBytes = pkt.payloadOffset - frame;
  const payloadBytes = pkt.l3End - pkt.payloadOffset;
  if (tcp && payloadBytes <= segmentBytes) return -DropReason.gsoUnsupported; // not a super-frame
  const count = Math.ceil(payloadBytes / segmentBytes);
  if (count < 1 || count * 2 > out.length) return -DropReason.gsoUnsupported;
  const l4HeaderBytes = pkt.payloadOffset - pkt.l4Offset;
  const l3HeaderBytes = pkt.l4Offset - pkt.l3Offset;
  const l3Rel = pkt.l3Offset - frame;
  const l4Rel = pkt.l4Offset - frame;
  const seq0 = tcp ? ((buf[pkt.l4Offset + 4]! << 24) | (buf[pkt.l4Offset + 5]! << 16) | (buf[pkt.l4Offset + 6]! << 8) | buf[pkt.l4Offset + 7]!) >>> 0 : 0;
  const id0 = pkt.family === 4 ? (buf[pkt.l3Offset + 4]! << 8) | buf[pkt.l3Offset + 5]! : 0;
  const checksumAt = tcp ? 16 : 6;
  let pos = scratchOffset;
  for (let i = 0; i < count; i++) {
    const chunk = i === count - 1 ? payloadBytes - i * segmentBytes : segmentBytes;
    const start = pos + headroomBytes;
    const length = headerBytes + chunk;
    if (start + length > scratch.length) return -DropReason.batchFull; // the batch's extra bytes are used up
    copyBytes(buf, frame, pkt.payloadOffset, scratch, start);
    copyBytes(buf, pkt.payloadOffset + i * segmentBytes, pkt.payloadOffset + i * segmentBytes + chunk, scratch, start + headerBytes);
    const ip = start + l3Rel;
    const l4 = start + l4Rel;
    const l4Bytes = l4HeaderBytes + chunk;
    if (pkt.family === 4) {
      const total = l3HeaderBytes + l4Bytes;
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
      const payloadLength = l3HeaderBytes - 40 + l4Bytes;
      scratch[ip + 4] = payloadLength >> 8;
      scratch[ip + 5] = payloadLength & 0xff;
    }
    if (tcp) {
      const seq = (seq0 + i * segmentBytes) >>> 0;
      scratch[l4 + 4] = seq >>> 24;
      scratch[l4 + 5] = (seq >>> 16) & 0xff;
      scratch[l4 + 6] = (seq >>> 8) & 0xff;
      scratch[l4 + 7] = seq & 0xff;
      let flags = scratch[l4 + 13]!;
      if (i !== count - 1) flags &= ~(TCP_FIN | TCP_PSH);
      if (i !== 0) flags &= ~TCP_CWR;
      scratch[l4 + 13] = flags;
    } else {
      scratch[l4 + 4] = l4Bytes >> 8;
      scratch[l4 + 5] = l4Bytes & 0xff;
    }
    scratch[l4 + checksumAt] = 0;
    scratch[l4 + checksumAt + 1] = 0;
    if (parseFrame(scratch, start, length, seg) !== PARSE_OK) return -DropReason.gsoUnsupported;
    const sum = l4Checksum(scratch, seg); // UDP: a computed zero goes as 0xffff (RFC 768)
    if (sum < 0) return -DropReason.gsoUnsupported;
    scratch[l4 + checksumAt] = sum >> 8;
    scratch[l4 + checksumAt + 1] = sum & 0xff;
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
