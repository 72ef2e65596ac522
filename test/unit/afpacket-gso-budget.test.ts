// The afpacket backend's batches of GSO frames, on a ring built in memory (a stand-in for the native
// socket): a batch ends before its GSO frames could need more than the batch's extra area (a fast
// upload through an IPIP real lost one 64 KiB frame in 50 as batch_full), every frame is handed to
// the engine exactly once, and a VLAN tag the kernel moved out of a frame is put back once, also
// for the frame that starts a batch of its own (it was put back twice: its virtio_net_hdr and MACs
// scrambled, the frame lost).

import { describe, expect, it } from 'vitest';
import { AfPacketIo } from '../../src/io/afpacket-io.js';
import { FRAME_GSO, type PacketBatch } from '../../src/io/packet-io.js';

const BLOCK = 128 << 10;
const BLOCKS = 8;
const RESERVE = 128;
const FRAME_HEADER = 68; // tpacket3_hdr + sockaddr_ll, as LAYOUT.frameHeaderBytes
const PAYLOAD = 60_000;
const GSO_SIZE = 1448;

/** A V3 ring whose blocks each hold two VLAN-tagged TCP GSO frames of frame number n, n + 1. */
function ring(frames: number, gsoType = 1): ArrayBuffer {
  const buf = new ArrayBuffer(BLOCK * BLOCKS);
  const u8 = new Uint8Array(buf);
  const dv = new DataView(buf);
  let n = 0;
  for (let b = 0; b < BLOCKS && n < frames; b++) {
    const base = b * BLOCK;
    const inBlock = Math.min(2, frames - n);
    dv.setUint32(base + 8, 1, true); // TP_STATUS_USER: ours
    dv.setUint32(base + 12, inBlock, true);
    let frame = base + 64;
    dv.setUint32(base + 16, frame - base, true);
    for (let k = 0; k < inBlock; k++, n++) {
      const mac = RESERVE + FRAME_HEADER + 16; // offset of the frame from its tpacket3_hdr
      const length = 14 + 20 + 20 + PAYLOAD;
      const next = k + 1 < inBlock ? (mac + length + 64 + 7) & ~7 : 0;
      dv.setUint32(frame, next, true);
      dv.setUint32(frame + 12, length, true); // snaplen
      dv.setUint32(frame + 16, length, true); // len
      dv.setUint32(frame + 20, 1 | (1 << 4), true); // TP_STATUS_USER | TP_STATUS_VLAN_VALID
      dv.setUint16(frame + 24, mac, true);
      dv.setUint32(frame + 32, 0x0064, true); // VLAN 100
      u8[frame + 58] = 0; // PACKET_HOST
      const m = frame + mac;
      const vnet = m - 10;
      u8[vnet] = 1; // NEEDS_CSUM
      u8[vnet + 1] = gsoType; // 1 GSO_TCPV4, 5 GSO_UDP_L4
      dv.setUint16(vnet + 2, 54, true); // hdr_len
      dv.setUint16(vnet + 4, GSO_SIZE, true);
      dv.setUint16(vnet + 6, 34, true); // csum_start
      dv.setUint16(vnet + 8, 16, true); // csum_offset
      u8.set([2, 0, 0, 0, 0, 0xfe, 2, 0, 0, 0, 0, n], m); // dst, src (the frame's number in its last byte)
      u8.set([0x08, 0x00, 0x45, 0x00], m + 12);
      frame += next;
    }
  }
  return buf;
}

function ioOver(buf: ArrayBuffer): { io: AfPacketIo; wake: () => void } {
  let readable: ((errno: number) => void) | null = null;
  const native = {
    startPolling: (_h: unknown, cb: (errno: number) => void) => void (readable = cb),
    stats: () => ({ packets: 0, drops: 0, freezes: 0 }),
    close: () => undefined,
  };
  const handle = {
    fd: -1, ifname: 'eth0', ifindex: 2, mac: [2, 0, 0, 0, 0, 0xfe], mtu: 1500, hardwareType: 1, ring: buf,
    blockSizeBytes: BLOCK, blockCount: BLOCKS, ringVersion: 3, frameSizeBytes: 0, frameCount: 0, vnetHdr: true, sendBufferBytes: 0, fanoutGroupId: null,
  };
  const Ctor = AfPacketIo as unknown as new (native: unknown, handle: unknown, capacity: number, kept: null) => AfPacketIo;
  const io = new Ctor(native, handle, 256, null);
  return { io, wake: () => readable!(0) };
}

describe('afpacket batches of GSO frames', () => {
  it('end before the extra area could overrun, hand every frame over once, and put each VLAN tag back once', () => {
    const FRAMES = 14;
    const buf = ring(FRAMES);
    const { io, wake } = ioOver(buf);
    const batches: { frame: number; vlan: number; vnet: number[]; src: number[] }[][] = [];
    io.start((batch: PacketBatch) => {
      const seen = [];
      for (let i = 0; i < batch.count; i++) {
        const m = batch.offsets[i]!;
        const b = batch.buf;
        expect(batch.flags[i]! & FRAME_GSO).toBe(FRAME_GSO);
        expect(batch.lengths[i]).toBe(14 + 20 + 20 + PAYLOAD + 4);
        seen.push({ frame: b[m + 11]!, vlan: (b[m + 12]! << 24) | (b[m + 13]! << 16) | (b[m + 14]! << 8) | b[m + 15]!, vnet: [...b.subarray(m - 10, m)], src: [...b.subarray(m + 6, m + 11)] });
      }
      batches.push(seen);
    });
    wake();
    // 43 segments a frame at most (60,000 / 1,448, and one more): 10 frames' segments fit 448.
    expect(batches.map((b) => b.length)).toEqual([10, 4]);
    const all = batches.flat();
    expect(all.map((f) => f.frame)).toEqual([...Array(FRAMES).keys()]);
    for (const f of all) {
      expect(f.vlan >>> 0).toBe(0x81000064);
      // csum_start and hdr_len 4 more (the tag is in the frame now), the rest as the kernel wrote it.
      expect(f.vnet).toEqual([1, 1, 58, 0, GSO_SIZE & 0xff, GSO_SIZE >> 8, 38, 0, 16, 0]);
      expect(f.src).toEqual([2, 0, 0, 0, 0]);
    }
    // Every block back to the kernel.
    const dv = new DataView(buf);
    for (let b = 0; b < BLOCKS; b++) expect(dv.getUint32(b * BLOCK + 8, true)).toBe(0);
  });

  it('count two extra frames a segment for a UDP train (each datagram too big for a tunnel goes as two fragments)', () => {
    const { io, wake } = ioOver(ring(14, 5));
    const sizes: number[] = [];
    io.start((batch: PacketBatch) => void sizes.push(batch.count));
    wake();
    expect(sizes).toEqual([5, 5, 4]);
  });
});
