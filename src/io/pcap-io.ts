// `io: pcap`: libpcap through the cap package, one frame per callback and one send per frame.
// Kept for comparison and for hosts where the native addon cannot be built. libpcap gives no
// checksum or GSO metadata, so partial checksums are recognised by their value and completed
// here, and frames larger than the MTU (GSO super-frames) are dropped and counted.

import { createRequire } from 'node:module';
import { completePartialChecksum } from '../dataplane/checksum.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import { parseFrame } from '../dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../dataplane/parsed-packet.js';
import { createPacketBatch, VERDICT_TX, type PacketBatch, type PacketIo, type PacketIoStats } from './packet-io.js';
import { readFileSync } from 'node:fs';

interface CapSession {
  open(device: string, filter: string, bufSize: number, buffer: Buffer): string;
  on(event: 'packet', cb: (nbytes: number, truncated: boolean) => void): void;
  send(buffer: Buffer, nbytes: number): void;
  close(): void;
}
interface CapModule {
  Cap: new () => CapSession;
}

const HEADROOM = 128;
const SNAP_BYTES = 65536 + 64;

export class PcapIo implements PacketIo {
  readonly kind = 'pcap' as const;
  readonly localMac: Uint8Array;
  readonly mtu: number;
  private readonly cap: CapSession;
  private readonly capBuf = Buffer.alloc(SNAP_BYTES);
  private readonly work = Buffer.alloc(HEADROOM + SNAP_BYTES);
  private readonly txBuf = Buffer.alloc(SNAP_BYTES);
  private readonly batch: PacketBatch = createPacketBatch(1);
  private readonly pkt = new ParsedPacket();
  private readonly counts: PacketIoStats = { rxFrames: 0, rxKernelDrops: 0, txFrames: 0, txErrors: 0 };
  private closed = false;
  private readonly ifname: string;

  private constructor(ifname: string, localMac: Uint8Array, mtu: number) {
    this.ifname = ifname;
    this.localMac = localMac;
    this.mtu = mtu;
    const require = createRequire(import.meta.url);
    const capModule = require('cap') as CapModule;
    this.cap = new capModule.Cap();
    this.batch.buf = this.work;
    this.batch.headroom = HEADROOM;
  }

  static open(opts: { interface: string }): PcapIo {
    // From sysfs, so this backend does not need the native addon.
    const sys = `/sys/class/net/${opts.interface}`;
    const mac = readFileSync(`${sys}/address`, 'utf8').trim().split(':').map((h) => parseInt(h, 16));
    const mtu = Number(readFileSync(`${sys}/mtu`, 'utf8').trim());
    return new PcapIo(opts.interface, Uint8Array.from(mac), mtu);
  }

  start(onBatch: (batch: PacketBatch) => void): void {
    // "inbound": never see our own transmitted frames (libpcap maps it to PACKET_OUTGOING checks).
    // "ether dst": frames for another host's MAC (promiscuous mode, a flooding switch) are not ours.
    const mac = Array.from(this.localMac, (b) => b.toString(16).padStart(2, '0')).join(':');
    this.cap.open(this.ifname, `inbound and ether dst ${mac} and (ip or ip6 or vlan)`, 16 * 1024 * 1024, this.capBuf);
    const b = this.batch;
    const maxFrame = this.mtu + 18;
    this.cap.on('packet', (nbytes: number, truncated: boolean) => {
      if (this.closed) return;
      this.counts.rxFrames++;
      this.capBuf.copy(this.work, HEADROOM, 0, nbytes);
      b.count = 1;
      b.offsets[0] = HEADROOM;
      b.lengths[0] = nbytes;
      b.flags[0] = 0;
      b.verdicts[0] = 0;
      onBatch(b);
      for (let i = 0; i < b.extraCount; i++) this.sendCopy(b.extraBuf, b.extraOffsets[i]!, b.extraLengths[i]!);
      b.extraCount = 0;
      if (b.verdicts[0] !== VERDICT_TX) return;
      const off = b.txOffsets[0]!;
      const len = b.txLengths[0]!;
      if (truncated || len > maxFrame) {
        b.verdicts[0] = -DropReason.gsoUnsupported;
        this.counts.txErrors++;
        return;
      }
      if (parseFrame(this.work, off, len, this.pkt) === PARSE_OK && this.pkt.l4Offset >= 0) {
        completePartialChecksum(this.work, this.pkt);
      }
      this.work.copy(this.txBuf, 0, off, off + len);
      try {
        this.cap.send(this.txBuf, len);
        this.counts.txFrames++;
      } catch {
        this.counts.txErrors++;
      }
    });
  }

  private sendCopy(buf: Uint8Array, off: number, len: number): void {
    this.txBuf.set(buf.subarray(off, off + len), 0);
    try {
      this.cap.send(this.txBuf, len);
      this.counts.txFrames++;
    } catch {
      this.counts.txErrors++;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.cap.close();
  }

  stats(): PacketIoStats {
    return { ...this.counts };
  }
}
