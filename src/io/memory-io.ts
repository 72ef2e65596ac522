// In-memory packet I/O for tests and simulation: frames are pushed in, the engine runs on them
// in place, and the frames it sends are collected. Same PacketIo contract as the real backends.

import { createPacketBatch, FRAME_HAS_VNET_HDR, VERDICT_TX, VNET_HDR_LEN, type PacketBatch, type PacketIo, type PacketIoStats } from './packet-io.js';

export interface SentFrame {
  readonly bytes: Uint8Array;
}

export class MemoryIo implements PacketIo {
  readonly kind = 'memory' as const;
  readonly localMac: Uint8Array;
  readonly mtu: number;
  readonly sent: Uint8Array[] = [];
  private onBatch: ((b: PacketBatch) => void) | null = null;
  private readonly batch: PacketBatch;
  private readonly memory: Uint8Array;
  private readonly slotBytes: number;
  private readonly headroom: number;
  private counts: PacketIoStats = { rxFrames: 0, rxKernelDrops: 0, txFrames: 0, txErrors: 0 };

  constructor(opts: { localMac: Uint8Array; mtu?: number; batchCapacity?: number; headroom?: number; slotBytes?: number }) {
    this.localMac = opts.localMac;
    this.mtu = opts.mtu ?? 1500;
    this.headroom = opts.headroom ?? 128;
    this.slotBytes = opts.slotBytes ?? 2048;
    const cap = opts.batchCapacity ?? 64;
    this.batch = createPacketBatch(cap);
    this.memory = new Uint8Array(cap * (this.headroom + this.slotBytes));
    this.batch.buf = this.memory;
    this.batch.headroom = this.headroom;
  }

  start(onBatch: (batch: PacketBatch) => void): void {
    this.onBatch = onBatch;
  }

  /**
   * Deliver frames as batches (split at the batch capacity); returns the frames sent for them.
   * A frame whose flags include FRAME_HAS_VNET_HDR starts with its 10-byte virtio_net_hdr, which is
   * placed right before the frame (as the afpacket backend does); sent frames never include it.
   */
  inject(frames: readonly Uint8Array[], flags?: readonly number[]): Uint8Array[] {
    if (!this.onBatch) throw new Error('MemoryIo: start() first');
    const out: Uint8Array[] = [];
    const b = this.batch;
    for (let first = 0; first < frames.length; first += b.capacity) {
      const count = Math.min(b.capacity, frames.length - first);
      for (let i = 0; i < count; i++) {
        const f = frames[first + i]!;
        const fl = flags ? flags[first + i]! : 0;
        const vnet = (fl & FRAME_HAS_VNET_HDR) !== 0 ? VNET_HDR_LEN : 0;
        if (f.length - vnet > this.slotBytes) throw new RangeError(`frame of ${f.length} bytes exceeds the slot size`);
        const off = i * (this.headroom + this.slotBytes) + this.headroom;
        this.memory.fill(0, off - this.headroom, off + this.slotBytes);
        this.memory.set(f, off - vnet);
        b.offsets[i] = off;
        b.lengths[i] = f.length - vnet;
        b.flags[i] = fl;
        b.verdicts[i] = 0;
      }
      b.count = count;
      this.counts.rxFrames += count;
      this.onBatch(b);
      for (let i = 0; i < count; i++) {
        if (b.verdicts[i] === VERDICT_TX) {
          const copy = this.memory.slice(b.txOffsets[i]!, b.txOffsets[i]! + b.txLengths[i]!);
          out.push(copy);
          this.sent.push(copy);
          this.counts.txFrames++;
        }
      }
      for (let i = 0; i < b.extraCount; i++) {
        const copy = b.extraBuf.slice(b.extraOffsets[i]!, b.extraOffsets[i]! + b.extraLengths[i]!);
        out.push(copy);
        this.sent.push(copy);
        this.counts.txFrames++;
      }
      b.extraCount = 0;
    }
    return out;
  }

  /** The verdicts of the last injected batch (for tests). */
  lastVerdicts(): Int32Array {
    return this.batch.verdicts.subarray(0, this.batch.count);
  }

  close(): void {
    this.onBatch = null;
  }

  stats(): PacketIoStats {
    return { ...this.counts };
  }
}
