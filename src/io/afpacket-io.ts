// PacketIo over the native AF_PACKET addon (the load balancer's default I/O): ring frames (TPACKET_V3
// blocks, or TPACKET_V2 frames handed over one by one) are read in place through typed-array views
// of the mmap'ed ring, the engine rewrites frames there, and VERDICT_TX frames leave with sendmmsg
// straight from ring memory, virtio_net_hdr included.
// perf_hooks' performance, not the global: the global is a lazy accessor, a JS getter call per use.
import { endianness } from 'node:os';
import { performance } from 'node:perf_hooks';
import {
  FRAME_CSUM_PARTIAL,
  FRAME_GSO,
  FRAME_HAS_VNET_HDR,
  EXTRA_BUDGET,
  EXTRA_SEGMENT_OVERHEAD_BYTES,
  gsoSegmentsOf,
  VERDICT_PASS,
  VERDICT_TX,
  VIRTIO_NET_HDR_GSO_ECN,
  VIRTIO_NET_HDR_GSO_UDP_L4,
  VNET_HDR_LEN,
  createPacketBatch,
  type PacketBatch,
  type PacketIo,
  type PacketIoStats,
} from './packet-io.js';
import {
  isNativeSystemError,
  loadNative,
  type DsrlbNative,
  type PacketSocketHandle,
  type RingLayout,
  type FrameLayout,
} from './native-binding.js';

export interface AfPacketIoOptions {
  interface: string;
  /** Frames per PacketBatch (a block with more frames is handed over in several batches). */
  batchCapacity?: number;
  /** Ring block size; must hold the largest frame, 64 KiB GSO super-frames included. */
  blockSizeBytes?: number;
  blockCount?: number;
  /** Longest wait before the kernel hands over a partly filled block (added latency at low rates). */
  retireTimeoutMs?: number;
  /** Headroom the kernel leaves before each frame for encapsulation headers (at most 1024). */
  reserveBytes?: number;
  /**
   * Share the interface's traffic (by flow hash) with the other sockets of the existing
   * PACKET_FANOUT group with this id (0..65535), one that another socket of this program made
   * with fanoutNewGroup.
   */
  fanoutGroupId?: number;
  /** Make a new PACKET_FANOUT group (see fanoutGroupId) under an id the kernel picks; `fanoutGroupId` of the AfPacketIo tells which. */
  fanoutNewGroup?: boolean;
  /**
   * Take over the socket behind this descriptor (from keepSocket() of an earlier AfPacketIo with the
   * same ring options, ring v3 only) instead of opening one: the frames that arrived while nobody
   * read them are the first this one reads. The descriptor stays the caller's (the I/O uses a copy).
   * Excludes the fanout options.
   */
  keptSocket?: { fd: number; fanoutGroupId: number | null };
  /**
   * Receive and send a virtio_net_hdr with every frame (default true). Without it, partial
   * checksums and GSO super-frames cannot be sent back as they are (see FRAME_* flags).
   */
  vnetHdr?: boolean;
  /**
   * 3 (default): TPACKET_V3, frames handed over a block at a time (full, or after retireTimeoutMs:
   * up to about 1 ms added at light load), the fewest wake-ups. 2: TPACKET_V2, every frame handed
   * over as it arrives (a wake-up per burst of frames, no added latency).
   */
  ringVersion?: 2 | 3;
}

export const AFPACKET_DEFAULTS = {
  batchCapacity: 256,
  // Many small blocks: at moderate rates each block is handed over by the 1 ms retire timer with a
  // few frames in it, so the block count (not the bytes) bounds how long a scheduling delay the
  // ring can absorb (bench: 16 x 1 MiB lost 85 ms of a 100 ms pause, 256 x 64 KiB none).
  // 128 KiB still holds a 64 KiB GSO super-frame with its headers.
  blockSizeBytes: 128 << 10,
  blockCount: 128,
  retireTimeoutMs: 1,
  reserveBytes: 128,
  vnetHdr: true,
  ringVersion: 3,
} as const;

export interface AfPacketIoStats extends PacketIoStats {
  /** Ring blocks processed. */
  rxBlocks: number;
  /** Frames the ring cut short (snaplen < wire length): dropped here, never shown to the engine. */
  rxTruncated: number;
  /** Frames with PACKET_OUTGOING (PACKET_IGNORE_OUTGOING should make this 0). */
  rxOutgoingSkipped: number;
  /** Frames for another host's MAC (seen while the interface is promiscuous, e.g. tcpdump): never forwarded. */
  rxOtherHost: number;
  /** Frames whose VLAN tag the kernel had stripped and this backend put back. */
  rxVlanRestored: number;
  /** Frames whose ring header was inconsistent (the rest of that block was skipped). */
  rxMalformed: number;
  /** Part of txErrors: frames refused for the moment (EAGAIN, ENOBUFS) and dropped. */
  txRefused: number;
  /** errno name of the last failed send, '' if none. */
  lastTxError: string;
  /** Socket errors reported by readiness (ENETDOWN when the interface went down or away). */
  pollErrors: number;
  /** errno of the last of them (100: ENETDOWN), 0 if none. */
  lastPollErrno: number;
  /** PACKET_STATISTICS tp_packets, accumulated (includes the kernel drops). */
  kernelPackets: number;
  /** V2: frames too large for a ring frame, read whole from the socket queue. */
  rxCopied: number;
}

/**
 * The ring's status words are the only handshake with the kernel: read with acquire, written with
 * release order. On weakly ordered CPUs (arm64) a plain read could see TP_STATUS_USER before the
 * frame bytes, and a plain write hand a slot back before our last reads of it, so there they go
 * through Atomics. x86 orders loads and stores so already (TSO), and V8 keeps typed-array accesses
 * in program order: plain accesses there, for Node 20 does not inline Atomics on a non-shared
 * buffer (about 20 ns a call here; V2 makes two per frame).
 */
const ORDERED_CPU = process.arch === 'x64' || process.arch === 'ia32';

function loadStatus(u32: Uint32Array, index: number): number {
  return ORDERED_CPU ? u32[index]! : Atomics.load(u32, index);
}

function storeStatus(u32: Uint32Array, index: number, value: number): void {
  if (ORDERED_CPU) u32[index] = value;
  else Atomics.store(u32, index, value);
}

// tp_status bits of a received frame (linux/if_packet.h).
const TP_STATUS_KERNEL = 0;
const TP_STATUS_USER = 1;
const TP_STATUS_COPY = 1 << 1;
const TP_STATUS_CSUMNOTREADY = 1 << 3;
const TP_STATUS_VLAN_VALID = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID = 1 << 6;
const TP_STATUS_GSO_TCP = 1 << 8; // Linux >= 6.3
const PACKET_OUTGOING = 4; // sll_pkttype
const PACKET_OTHERHOST = 3;
// Interface types whose frames start with an Ethernet header (loopback has one too).
const ARPHRD_ETHER = 1;
const ARPHRD_LOOPBACK = 772;
// virtio_net_hdr (linux/virtio_net.h), little-endian on the packet socket of a little-endian host.
const VNET_FLAGS = 0;
const VNET_GSO_TYPE = 1;
const VNET_HDR_LEN_FIELD = 2;
const VNET_CSUM_START = 6;
const VNET_GSO_SIZE = 4;
/** admit(): the frame is in the batch; it is in and the batch is full; it is not in: send the batch first. */
const ADMITTED = 0;
const ADMITTED_FULL = 1;
const FLUSH_FIRST = 2;
const VIRTIO_NET_HDR_F_NEEDS_CSUM = 1;
const ETHERTYPE_VLAN = 0x8100;
const VLAN_TAG_BYTES = 4;
const MAC_ADDRESSES_BYTES = 12;
const ETHERNET_VLAN_HEADER_BYTES = 18;

// Offsets this module reads the ring with; open() checks them against the addon's (the kernel's).
const LAYOUT: RingLayout = {
  blockStatus: 8,
  blockNumPackets: 12,
  blockFirstPacket: 16,
  blockSeqNum: 24,
  frameNextOffset: 0,
  frameSnaplen: 12,
  frameLen: 16,
  frameStatus: 20,
  frameMac: 24,
  frameNet: 26,
  frameVlanTci: 32,
  frameVlanTpid: 36,
  framePacketType: 58,
  frameHeaderBytes: 68,
};
const LAYOUT_V2: FrameLayout = {
  frameStatus: 0,
  frameLen: 4,
  frameSnaplen: 8,
  frameMac: 12,
  frameVlanTci: 24,
  frameVlanTpid: 26,
  framePacketType: 42,
  frameHeaderBytes: 52,
};
/** V3 packs frames on 8 bytes (V3_ALIGNMENT, not TPACKET_ALIGNMENT): u32/u16 views still index them exactly. */
const FRAME_ALIGNMENT_MASK = 7;
/** Where a V2 frame read whole from the socket queue goes: headroom, then virtio_net_hdr and frame. */
const COPY_BUFFER_BYTES = 128 << 10;

function checkLayout(name: string, ours: object, theirs: object): void {
  for (const [key, value] of Object.entries(ours)) {
    const native = (theirs as Record<string, unknown>)[key];
    if (native !== value) {
      const error = new Error(
        `ring layout mismatch: ${name}.${key} is ${String(native)} in the addon, ${value} in afpacket-io.ts`,
      ) as Error & { code: string };
      error.code = 'ERR_DSRLB_NATIVE_LAYOUT';
      throw error;
    }
  }
}

function positiveInteger(name: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`AfPacketIo: ${name} must be an integer in [${min}, ${max}], got ${value}`);
  }
  return value;
}

/**
 * The kernel's refusal of the fanout group, in words that say which group and what may be wrong
 * (the errno name stays the code), or null for any other failure to open.
 */
function fanoutRefused(err: unknown, options: AfPacketIoOptions): Error | null {
  if (!isNativeSystemError(err) || err.syscall !== 'setsockopt(PACKET_FANOUT)') return null;
  const ifname = options.interface;
  let message: string;
  if (options.fanoutNewGroup) {
    message = `the kernel refused to make a PACKET_FANOUT group on ${ifname} under an id of its choosing (${err.message})`;
    if (err.code === 'EOPNOTSUPP') message += ': PACKET_FANOUT_FLAG_UNIQUEID needs Linux 4.12 or later (workers: 1 needs no group)';
    else if (err.code === 'EINVAL') message += `: is ${ifname} up?`;
  } else {
    message = `the kernel refused to let the socket on ${ifname} join PACKET_FANOUT group ${options.fanoutGroupId}, which another packet loop of this daemon made (${err.message})`;
    if (err.code === 'EINVAL') message += `: a group of another type, flags or interface has that id now, or ${ifname} is down`;
  }
  return Object.assign(new Error(message), { code: err.code, errno: err.errno, syscall: err.syscall });
}

/**
 * Frames as on the wire: a VLAN tag the kernel stripped into the ring header is put back, and
 * flags come from the virtio_net_hdr (or tp_status without one). A frame cut short by the ring
 * (snaplen < wire length) is dropped here and counted in rxTruncated, never shown to the engine.
 *
 * TX contract for the engine: when FRAME_HAS_VNET_HDR is set, the 10 bytes right before
 * txOffsets[i] must hold the frame's virtio_net_hdr (an engine that prepends headers moves it and
 * adds the prepended length to csum_start when NEEDS_CSUM); `headroom` counts the bytes before it.
 */
export class AfPacketIo implements PacketIo {
  readonly kind = 'afpacket' as const;
  readonly localMac: Uint8Array;
  readonly mtu: number;
  readonly ifname: string;
  readonly vnetHdr: boolean;
  /** The PACKET_FANOUT group the socket is in, null without one. */
  readonly fanoutGroupId: number | null;

  private readonly native: DsrlbNative;
  private readonly handle: PacketSocketHandle;
  readonly ringVersion: 2 | 3;
  private readonly blockSizeBytes: number;
  private readonly blockCount: number;
  private readonly frameSizeBytes: number;
  private readonly frameCount: number;
  private readonly vnetLen: number;
  // Where the ring header's fields are (tpacket3_hdr or tpacket2_hdr).
  private readonly fieldStatus: number;
  private readonly fieldLen: number;
  private readonly fieldSnaplen: number;
  private readonly fieldMac: number;
  private readonly fieldVlanTci: number;
  private readonly fieldVlanTpid: number;
  private readonly fieldPacketType: number;
  private readonly frameHeaderBytes: number;
  /** V2: the next frame slot to look at. V3: the oldest block not yet given back to the kernel. */
  private cursor = 0;
  /** V3: blocks from the cursor on whose frames are in the batch being built (not yet released). */
  private heldBlocks = 0;
  /** Headroom common to the frames of the batch being filled. */
  private batchHeadroom = 0;
  private readonly copyBuf: Uint8Array;
  private readonly ringBytes: Uint8Array;
  private readonly ringWords: Uint32Array;
  private readonly ringHalves: Uint16Array;
  private readonly batch: PacketBatch;
  private readonly txOffsets: Int32Array;
  private readonly txLengths: Int32Array;
  private onBatch: ((batch: PacketBatch) => void) | undefined;
  private closed = false;

  private rxFrames = 0;
  private rxBlocks = 0;
  private rxTruncated = 0;
  /** What the GSO frames of the batch being filled might need of its extra area (EXTRA_BUDGET). */
  private extraFramesNeeded = 0;
  private extraBytesNeeded = 0;
  private rxOutgoingSkipped = 0;
  private rxOtherHost = 0;
  private rxVlanRestored = 0;
  private rxMalformed = 0;
  private txFrames = 0;
  private txErrors = 0;
  private txRefused = 0;
  private lastTxError = '';
  private pollErrors = 0;
  private busyMs = 0;
  private lastPollErrno = 0;
  private kernelPackets = 0;
  private kernelDrops = 0;
  private rxCopied = 0;

  static open(options: AfPacketIoOptions): AfPacketIo {
    // The kernel writes virtio_net_hdr fields in host order on a big-endian host; they are read
    // here (and in the engine) as little-endian. Refused rather than misread.
    if (endianness() !== 'LE') throw new Error('io: afpacket reads the virtio-net header as little-endian: big-endian hosts are not supported (use io: pcap)');
    const native = loadNative();
    checkLayout('layout', LAYOUT, native.layout);
    checkLayout('layoutV2', LAYOUT_V2, native.layoutV2);
    const batchCapacity = positiveInteger('batchCapacity', options.batchCapacity ?? AFPACKET_DEFAULTS.batchCapacity, 1, 65536);
    const reserveBytes = options.reserveBytes ?? AFPACKET_DEFAULTS.reserveBytes;
    const ringVersion = options.ringVersion ?? AFPACKET_DEFAULTS.ringVersion;
    const kept = options.keptSocket;
    if (kept && ringVersion !== 3) throw new RangeError('AfPacketIo: only a v3 ring can be taken over (keptSocket)');
    let handle: PacketSocketHandle;
    try {
      handle = native.openPacketSocket({
        ifname: options.interface,
        frameSizeBytes: ringVersion === 2 ? frameSizeFor(native.interfaceInfo(options.interface).mtu, reserveBytes) : undefined,
        blockSizeBytes: options.blockSizeBytes ?? AFPACKET_DEFAULTS.blockSizeBytes,
        blockCount: options.blockCount ?? AFPACKET_DEFAULTS.blockCount,
        retireTimeoutMs: options.retireTimeoutMs ?? AFPACKET_DEFAULTS.retireTimeoutMs,
        reserveBytes,
        vnetHdr: options.vnetHdr ?? AFPACKET_DEFAULTS.vnetHdr,
        fanoutGroupId: options.fanoutGroupId,
        fanoutNewGroup: options.fanoutNewGroup,
        ringVersion,
        keptFd: kept?.fd,
      });
    } catch (err) {
      throw fanoutRefused(err, options) ?? err;
    }
    if (handle.hardwareType !== ARPHRD_ETHER && handle.hardwareType !== ARPHRD_LOOPBACK) {
      native.close(handle);
      const error = new Error(
        `AfPacketIo: ${options.interface} has no Ethernet header (ARPHRD ${handle.hardwareType})`,
      ) as Error & { code: string };
      error.code = 'ERR_DSRLB_NOT_ETHERNET';
      throw error;
    }
    return new AfPacketIo(native, handle, batchCapacity, kept ?? null);
  }

  private constructor(native: DsrlbNative, handle: PacketSocketHandle, batchCapacity: number, kept: { fanoutGroupId: number | null } | null) {
    this.native = native;
    this.handle = handle;
    this.ifname = handle.ifname;
    this.localMac = Uint8Array.from(handle.mac);
    this.mtu = handle.mtu;
    this.vnetHdr = handle.vnetHdr;
    this.fanoutGroupId = kept === null ? handle.fanoutGroupId : kept.fanoutGroupId;
    this.ringVersion = handle.ringVersion;
    this.vnetLen = handle.vnetHdr ? VNET_HDR_LEN : 0;
    this.blockSizeBytes = handle.blockSizeBytes;
    this.blockCount = handle.blockCount;
    this.frameSizeBytes = handle.frameSizeBytes;
    this.frameCount = handle.frameCount;
    const layout = handle.ringVersion === 2 ? LAYOUT_V2 : LAYOUT;
    this.fieldStatus = layout.frameStatus;
    this.fieldLen = layout.frameLen;
    this.fieldSnaplen = layout.frameSnaplen;
    this.fieldMac = layout.frameMac;
    this.fieldVlanTci = layout.frameVlanTci;
    this.fieldVlanTpid = layout.frameVlanTpid;
    this.fieldPacketType = layout.framePacketType;
    this.frameHeaderBytes = layout.frameHeaderBytes;
    this.ringBytes = new Uint8Array(handle.ring);
    this.ringWords = new Uint32Array(handle.ring);
    this.ringHalves = new Uint16Array(handle.ring);
    this.batch = createPacketBatch(batchCapacity);
    this.batch.extraVnetHdr = handle.vnetHdr;
    this.batch.buf = this.ringBytes;
    this.txOffsets = new Int32Array(batchCapacity);
    this.txLengths = new Int32Array(batchCapacity);
    this.copyBuf = handle.ringVersion === 2 ? new Uint8Array(COPY_BUFFER_BYTES) : new Uint8Array(0);
    if (kept !== null) this.cursor = takeoverCursor(this.ringWords, this.blockCount, this.blockSizeBytes);
  }

  /**
   * A second descriptor of this socket for the control thread to hold (native keepSocket): with
   * it, a loop started again takes this socket over (keptSocket) with the frames that arrived
   * meanwhile, and the fanout group keeps its members, so no other loop's flows move.
   */
  keepSocket(): number {
    return this.native.keepSocket(this.handle);
  }

  start(onBatch: (batch: PacketBatch) => void): void {
    if (this.closed) throw new Error(`AfPacketIo on ${this.ifname} is closed`);
    this.onBatch = onBatch;
    this.native.startPolling(this.handle, this.onReadable);
  }

  close(): void {
    if (this.closed) return;
    this.collectKernelStats();
    this.closed = true;
    this.onBatch = undefined;
    this.batch.buf = new Uint8Array(0);
    this.batch.count = 0;
    this.native.close(this.handle);
  }

  interfaceLost(): string | null {
    let now: number;
    try {
      now = this.native.interfaceInfo(this.ifname).ifindex;
    } catch (err) {
      return `${this.ifname} is gone (${isNativeSystemError(err) ? err.code : (err as Error).message})`;
    }
    return now === this.handle.ifindex ? null : `${this.ifname} was made again (index ${this.handle.ifindex} -> ${now}): the socket still listens on the old one`;
  }

  stats(): AfPacketIoStats {
    this.collectKernelStats();
    return {
      rxFrames: this.rxFrames,
      rxKernelDrops: this.kernelDrops,
      txFrames: this.txFrames,
      txErrors: this.txErrors,
      rxBlocks: this.rxBlocks,
      rxTruncated: this.rxTruncated,
      rxOutgoingSkipped: this.rxOutgoingSkipped,
      rxOtherHost: this.rxOtherHost,
      rxVlanRestored: this.rxVlanRestored,
      rxMalformed: this.rxMalformed,
      txRefused: this.txRefused,
      lastTxError: this.lastTxError,
      pollErrors: this.pollErrors,
      lastPollErrno: this.lastPollErrno,
      kernelPackets: this.kernelPackets,
      rxCopied: this.rxCopied,
      busyMs: this.busyMs,
    };
  }

  /**
   * Sends frames that live outside the ring (ICMP replies, tests), each starting with its
   * virtio_net_hdr when vnetHdr is on. Returns how many were sent; failures count in txErrors.
   */
  sendFrames(buf: Uint8Array, offsets: Int32Array, lengths: Int32Array, count: number): number {
    let first = 0;
    let total = 0;
    while (first < count && !this.closed) {
      let sent: number;
      try {
        sent = this.native.sendCopy(this.handle, buf, offsets, lengths, count, first);
      } catch (error) {
        this.noteTxError(error);
        first++;
        continue;
      }
      total += sent;
      first += sent;
      if (sent === 0) {
        this.refuse(count - first);
        break;
      }
    }
    this.txFrames += total;
    return total;
  }

  private collectKernelStats(): void {
    if (this.closed) return;
    // PACKET_STATISTICS resets on every read: accumulate here.
    const kernel = this.native.stats(this.handle);
    this.kernelPackets += kernel.packets;
    this.kernelDrops += kernel.drops;
  }

  // Two clock reads per wake-up (not per frame): what the loop costs, for dsrlb_loop_busy_seconds_total.
  private readonly onReadable = (errno: number): void => {
    const t0 = performance.now();
    try {
      this.readReady(errno);
    } finally {
      this.busyMs += performance.now() - t0;
    }
  };

  // Level-triggered: a callback that leaves frames behind (budget spent) is simply called again.
  private readReady(errno: number): void {
    if (errno !== 0) {
      this.pollErrors++;
      this.lastPollErrno = errno;
    }
    if (this.closed || this.onBatch === undefined) return;
    if (this.ringVersion === 2) {
      this.processFrames();
    } else {
      this.processBlocks();
    }
  }

  /**
   * V3: every block the kernel has handed over, in ring order, their frames in shared batches: one
   * engine call and one sendmmsg per batch, not per block (a download's ACKs come a few per 1 ms
   * block, and a wake-up finds two or three blocks). As for V2's frames, the cursor and the status
   * words are handled here, without a native call: a block is ours while its status has
   * TP_STATUS_USER, and goes back to the kernel (status 0) once every frame of it was processed and
   * sent, for the engine rewrites frames in place and sendmmsg reads them there.
   */
  // The status words are the only handshake with the kernel: see loadStatus/storeStatus.
  private processBlocks(): void {
    const u32 = this.ringWords;
    const batch = this.batch;
    const blockCount = this.blockCount;
    const blockSize = this.blockSizeBytes;
    this.heldBlocks = 0;
    batch.count = 0;
    this.batchHeadroom = blockSize;
    try {
      for (let budget = blockCount; budget > 0; budget--) {
        let block = this.cursor + this.heldBlocks;
        if (block >= blockCount) block -= blockCount;
        if ((loadStatus(u32, (block * blockSize + LAYOUT.blockStatus) >>> 2) & TP_STATUS_USER) === 0) break;
        this.heldBlocks++;
        this.admitBlock(block);
        if (this.closed) return;
      }
      if (batch.count > 0) this.flush(this.batchHeadroom);
    } finally {
      // A block never released stalls the whole ring, even when the engine throws.
      this.releaseBlocks(this.heldBlocks);
    }
  }

  /** V3: the frames of one block into the batch; a full batch is flushed at once. */
  private admitBlock(block: number): void {
    const u32 = this.ringWords;
    const batch = this.batch;
    const blockStart = block * this.blockSizeBytes;
    const blockEnd = blockStart + this.blockSizeBytes;
    const packetCount = u32[(blockStart + LAYOUT.blockNumPackets) >>> 2]!;
    let frame = blockStart + u32[(blockStart + LAYOUT.blockFirstPacket) >>> 2]!;
    this.rxBlocks++;
    for (let i = 0; i < packetCount; i++) {
      if ((frame & FRAME_ALIGNMENT_MASK) !== 0 || frame + LAYOUT.frameHeaderBytes > blockEnd) {
        this.rxMalformed++;
        break;
      }
      const nextOffset = u32[(frame + LAYOUT.frameNextOffset) >>> 2]!;
      let admitted = this.admit(frame, blockEnd);
      for (let pass = 0; pass < 2 && admitted !== ADMITTED; pass++) {
        this.flush(this.batchHeadroom);
        if (this.closed) return;
        // Every frame of the blocks before this one is sent: they can go back now.
        this.releaseBlocks(this.heldBlocks - 1);
        batch.count = 0;
        this.batchHeadroom = this.blockSizeBytes;
        // Not in yet (its segments would not have fitted beside the others'): in a batch of its own now.
        admitted = admitted === FLUSH_FIRST ? this.admit(frame, blockEnd) : ADMITTED;
      }
      if (nextOffset === 0) break;
      frame += nextOffset;
    }
  }

  /** V3: gives the first n held blocks back to the kernel, in ring order. */
  private releaseBlocks(n: number): void {
    if (this.closed) return;
    const u32 = this.ringWords;
    const blockCount = this.blockCount;
    for (let k = 0; k < n; k++) {
      const block = this.cursor;
      storeStatus(u32, (block * this.blockSizeBytes + LAYOUT.blockStatus) >>> 2, TP_STATUS_KERNEL);
      this.cursor = block + 1 === blockCount ? 0 : block + 1;
    }
    this.heldBlocks -= n;
  }

  /**
   * V2: every frame the kernel has handed over, in ring order, in batches. A frame goes back to the
   * kernel (tp_status = 0) only after its batch was processed and sent: until then the engine's
   * rewrites and sendmmsg read it in place.
   */
  private processFrames(): void {
    const u32 = this.ringWords;
    const batch = this.batch;
    const frameSize = this.frameSizeBytes;
    const frameCount = this.frameCount;
    let cursor = this.cursor;
    let released = cursor;
    // Frames taken and not given back yet, counted: a walk over the whole ring ends where it began,
    // so a [from, to) range could not tell all frames from none (the ring stalled for good, and
    // every wake-up replayed the same frames).
    let held = 0;
    batch.count = 0;
    this.batchHeadroom = frameSize;
    try {
      for (let budget = frameCount; budget > 0; budget--) {
        const frame = cursor * frameSize;
        const status = loadStatus(u32, frame >>> 2);
        if ((status & TP_STATUS_USER) === 0) break;
        cursor = cursor + 1 === frameCount ? 0 : cursor + 1;
        held++;
        if ((status & TP_STATUS_COPY) !== 0) {
          // Cut short in the ring, whole in the socket queue: keep the order of what came before.
          if (batch.count > 0) this.flush(this.batchHeadroom);
          if (this.closed) return;
          this.receiveCopy(frame, status);
          released = this.release(released, held);
          held = 0;
          batch.count = 0;
          this.batchHeadroom = frameSize;
          continue;
        }
        let admitted = this.admit(frame, frame + frameSize);
        for (let pass = 0; pass < 2 && admitted !== ADMITTED; pass++) {
          this.flush(this.batchHeadroom);
          if (this.closed) return;
          // The frame not in yet stays held until its own batch is sent.
          const waiting = admitted === FLUSH_FIRST ? 1 : 0;
          released = this.release(released, held - waiting);
          held = waiting;
          batch.count = 0;
          this.batchHeadroom = frameSize;
          admitted = waiting === 1 ? this.admit(frame, frame + frameSize) : ADMITTED;
        }
      }
      if (batch.count > 0) this.flush(this.batchHeadroom);
    } finally {
      // Frames never released stall the ring, even when the engine throws.
      if (!this.closed) this.release(released, held);
      this.cursor = cursor;
    }
  }

  /** Gives `count` V2 frames from slot `from` on back to the kernel; returns the slot after them. */
  private release(from: number, count: number): number {
    const u32 = this.ringWords;
    const frameSize = this.frameSizeBytes;
    const frameCount = this.frameCount;
    let i = from;
    for (let k = 0; k < count; k++) {
      storeStatus(u32, (i * frameSize) >>> 2, 0);
      i = i + 1 === frameCount ? 0 : i + 1;
    }
    return i;
  }

  /**
   * V2: the frame at ring slot `frame` was too large for it: read it whole and process it alone.
   * A VLAN tag the kernel had moved out of the frame is in the slot's header only, not in the
   * bytes the socket queue gives: it is put back as for a frame in the ring.
   */
  private receiveCopy(frame: number, status: number): void {
    const pktType = this.ringBytes[frame + this.fieldPacketType];
    const buf = this.copyBuf;
    const at = AFPACKET_DEFAULTS.reserveBytes;
    const n = this.native.recvCopy(this.handle, buf, at);
    if (n < 0 || n <= this.vnetLen + MAC_ADDRESSES_BYTES) {
      // Empty queue (-1: the copy could not be queued) or larger than 128 KiB.
      this.rxTruncated++;
      return;
    }
    if (pktType === PACKET_OUTGOING) {
      this.rxOutgoingSkipped++;
      return;
    }
    if (pktType === PACKET_OTHERHOST) {
      this.rxOtherHost++;
      return;
    }
    this.rxCopied++;
    const batch = this.batch;
    let mac = at + this.vnetLen;
    let length = n - this.vnetLen;
    batch.buf = buf;
    if ((status & TP_STATUS_VLAN_VALID) !== 0) {
      mac = this.restoreVlanTag(buf, frame, mac, status);
      length += VLAN_TAG_BYTES;
    }
    batch.count = 1;
    batch.offsets[0] = mac;
    batch.lengths[0] = length;
    batch.flags[0] = this.frameFlags(mac, 0, length);
    try {
      this.flush(mac - this.vnetLen);
    } finally {
      batch.buf = this.ringBytes;
    }
  }

  /**
   * Decodes the ring frame at `frame` (its slot or block ending at `limit`) into the batch, or
   * counts why not. Returns ADMITTED, ADMITTED_FULL (send the batch now), or FLUSH_FIRST: a GSO
   * frame whose segments might not fit the batch's extra area beside the others' (send the batch,
   * then admit it again).
   */
  private admit(frame: number, limit: number): number {
    const u8 = this.ringBytes;
    const u32 = this.ringWords;
    const vnetLen = this.vnetLen;
    const batch = this.batch;
    const snaplen = u32[(frame + this.fieldSnaplen) >>> 2]!;
    const wireLength = u32[(frame + this.fieldLen) >>> 2]!;
    const status = u32[(frame + this.fieldStatus) >>> 2]!;
    let mac = frame + this.ringHalves[(frame + this.fieldMac) >>> 1]!;
    const headerEnd = frame + this.frameHeaderBytes;

    if (mac - vnetLen < headerEnd || mac + snaplen > limit || snaplen < MAC_ADDRESSES_BYTES) {
      this.rxMalformed++;
      return ADMITTED;
    }
    const pktType = u8[frame + this.fieldPacketType];
    if (pktType === PACKET_OUTGOING) {
      this.rxOutgoingSkipped++;
      return ADMITTED;
    }
    if (pktType === PACKET_OTHERHOST) {
      // A frame a switch flooded to us (or one seen in promiscuous mode) belongs to another host.
      this.rxOtherHost++;
      return ADMITTED;
    }
    if (snaplen < wireLength) {
      this.rxTruncated++;
      return ADMITTED;
    }
    const vlan = (status & TP_STATUS_VLAN_VALID) !== 0;
    if (vlan && mac - vnetLen - VLAN_TAG_BYTES < headerEnd) {
      this.rxMalformed++;
      return ADMITTED;
    }
    const length = vlan ? snaplen + VLAN_TAG_BYTES : snaplen;
    // The flags and the GSO budget from the frame as the kernel left it, before its tag is put
    // back: a frame sent back for a batch of its own (FLUSH_FIRST) is admitted again, and putting
    // its tag back twice scrambled its virtio_net_hdr and MACs.
    const flags = this.frameFlags(mac, status, length);
    if ((flags & FRAME_GSO) !== 0) {
      const vnet = mac - VNET_HDR_LEN;
      const gsoSize = vnetLen !== 0 ? u8[vnet + VNET_GSO_SIZE]! | (u8[vnet + VNET_GSO_SIZE + 1]! << 8) : 0;
      // A UDP train's datagrams are never cut smaller: too big for a tunnel, each goes as two
      // outer fragments (or more, which the engine then refuses as batch_full: rare).
      const perSegment = vnetLen !== 0 && (u8[vnet + VNET_GSO_TYPE]! & ~VIRTIO_NET_HDR_GSO_ECN) === VIRTIO_NET_HDR_GSO_UDP_L4 ? 2 : 1;
      const segments = gsoSegmentsOf(length, gsoSize, this.mtu) * perSegment;
      const frames = this.extraFramesNeeded + segments;
      const bytes = this.extraBytesNeeded + length + segments * EXTRA_SEGMENT_OVERHEAD_BYTES;
      if (batch.count > 0 && (frames > EXTRA_BUDGET.frames || bytes > EXTRA_BUDGET.bytes)) return FLUSH_FIRST;
      this.extraFramesNeeded = frames;
      this.extraBytesNeeded = bytes;
    }
    if (vlan) mac = this.restoreVlanTag(this.ringBytes, frame, mac, status);
    const slot = batch.count++;
    batch.offsets[slot] = mac;
    batch.lengths[slot] = length;
    batch.flags[slot] = flags;
    const room = mac - vnetLen - headerEnd;
    if (room < this.batchHeadroom) this.batchHeadroom = room;
    return batch.count === batch.capacity ? ADMITTED_FULL : ADMITTED;
  }

  /** FRAME_* flags from the virtio_net_hdr before `mac` (or from tp_status without one). */
  private frameFlags(mac: number, status: number, length: number): number {
    if (this.vnetLen !== 0) {
      const u8 = this.batch.buf;
      const vnet = mac - VNET_HDR_LEN;
      let flags = FRAME_HAS_VNET_HDR;
      if ((u8[vnet + VNET_FLAGS]! & VIRTIO_NET_HDR_F_NEEDS_CSUM) !== 0) flags |= FRAME_CSUM_PARTIAL;
      if ((u8[vnet + VNET_GSO_TYPE]! & ~VIRTIO_NET_HDR_GSO_ECN) !== 0) flags |= FRAME_GSO;
      return flags;
    }
    let flags = 0;
    if ((status & TP_STATUS_CSUMNOTREADY) !== 0) flags |= FRAME_CSUM_PARTIAL;
    if ((status & TP_STATUS_GSO_TCP) !== 0 || length > this.mtu + ETHERNET_VLAN_HEADER_BYTES) flags |= FRAME_GSO;
    return flags;
  }

  /**
   * Moves the virtio_net_hdr and both MAC addresses in `u8` (the ring, or the copy buffer) 4 bytes
   * back into the headroom and writes the tag (TPID, TCI) the kernel had moved into the header of
   * ring slot `frame`. Returns the new frame start.
   */
  private restoreVlanTag(u8: Uint8Array, frame: number, mac: number, status: number): number {
    const vnetLen = this.vnetLen;
    const from = mac - vnetLen;
    const end = mac + MAC_ADDRESSES_BYTES;
    for (let p = from; p < end; p++) u8[p - VLAN_TAG_BYTES] = u8[p]!;
    const tagged = mac - VLAN_TAG_BYTES;
    const tpid =
      (status & TP_STATUS_VLAN_TPID_VALID) !== 0 ? this.ringHalves[(frame + this.fieldVlanTpid) >>> 1]! : ETHERTYPE_VLAN;
    const tci = this.ringHalves[(frame + this.fieldVlanTci) >>> 1]!;
    const tag = tagged + MAC_ADDRESSES_BYTES;
    u8[tag] = tpid >>> 8;
    u8[tag + 1] = tpid & 0xff;
    u8[tag + 2] = tci >>> 8;
    u8[tag + 3] = tci & 0xff;
    if (vnetLen !== 0) {
      // csum_start and hdr_len count from the frame start, which now has 4 more bytes of header.
      const vnet = tagged - VNET_HDR_LEN;
      if ((u8[vnet + VNET_FLAGS]! & VIRTIO_NET_HDR_F_NEEDS_CSUM) !== 0) addLe16(u8, vnet + VNET_CSUM_START, VLAN_TAG_BYTES);
      if (u8[vnet + VNET_GSO_TYPE] !== 0 && (u8[vnet + VNET_HDR_LEN_FIELD]! | u8[vnet + VNET_HDR_LEN_FIELD + 1]!) !== 0) {
        addLe16(u8, vnet + VNET_HDR_LEN_FIELD, VLAN_TAG_BYTES);
      }
    }
    this.rxVlanRestored++;
    return tagged;
  }

  /** Hands the batch to the engine, then sends its VERDICT_TX frames in one sendmmsg. */
  private flush(headroom: number): void {
    const batch = this.batch;
    const count = batch.count;
    const vnetLen = this.vnetLen;
    const bufLength = batch.buf.length;
    batch.headroom = headroom;
    this.extraFramesNeeded = 0;
    this.extraBytesNeeded = 0;
    // A stale VERDICT_TX from the previous batch must never resend old bytes. A loop, not
    // fill(): TypedArray fill is a C++ builtin (a call out of the optimized code per batch).
    const verdicts = batch.verdicts;
    for (let i = 0; i < count; i++) verdicts[i] = VERDICT_PASS;
    this.onBatch!(batch);
    if (this.closed) return;
    this.rxFrames += count;
    const txOffsets = this.txOffsets;
    const txLengths = this.txLengths;
    let n = 0;
    for (let i = 0; i < count; i++) {
      if (verdicts[i] !== VERDICT_TX) continue;
      const offset = batch.txOffsets[i]! - vnetLen;
      const length = batch.txLengths[i]! + vnetLen;
      if (offset < 0 || length <= vnetLen || offset + length > bufLength) {
        this.txErrors++;
        this.lastTxError = 'ERR_FRAME_OUT_OF_RING';
        continue;
      }
      txOffsets[n] = offset;
      txLengths[n] = length;
      n++;
    }
    if (n > 0) this.transmit(n, batch.buf);
    if (batch.extraCount > 0) this.transmitExtras(batch);
  }

  /** Frames the engine built outside the ring (ICMP errors, fragments, GSO segments). */
  private transmitExtras(batch: PacketBatch): void {
    const n = batch.extraCount;
    const offsets = batch.extraOffsets;
    const lengths = batch.extraLengths;
    const vnetLen = this.vnetLen;
    for (let i = 0; i < n; i++) {
      offsets[i] -= vnetLen;
      lengths[i] += vnetLen;
    }
    this.sendFrames(batch.extraBuf, offsets, lengths, n);
    batch.extraCount = 0;
  }

  private transmit(count: number, buf: Uint8Array): void {
    const fromRing = buf === this.ringBytes;
    let first = 0;
    while (first < count) {
      let sent: number;
      try {
        sent = fromRing
          ? this.native.send(this.handle, this.txOffsets, this.txLengths, count, first)
          : this.native.sendCopy(this.handle, buf, this.txOffsets, this.txLengths, count, first);
      } catch (error) {
        // A hard error belongs to the frame at `first` alone (EMSGSIZE, EINVAL for a bad header).
        this.noteTxError(error);
        if (this.closed) return;
        first++;
        continue;
      }
      this.txFrames += sent;
      first += sent;
      if (sent === 0) {
        this.refuse(count - first);
        return;
      }
    }
  }

  private noteTxError(error: unknown): void {
    this.txErrors++;
    this.lastTxError = isNativeSystemError(error) ? error.code : 'EUNKNOWN';
  }

  private refuse(frames: number): void {
    this.txErrors += frames;
    this.txRefused += frames;
    this.lastTxError = 'ENOBUFS/EAGAIN';
  }
}

/**
 * Where a V3 ring taken over is read from: its oldest block that is ours (a block the ended loop
 * had not given back, or one retired since), or, when none is, the block the kernel fills now (it
 * numbers blocks as it opens them: the highest number). Blocks that are ours are consecutive in
 * ring order, and the kernel retires the one it fills next after them, so the walk goes on from
 * there as if nothing had happened.
 */
export function takeoverCursor(u32: Uint32Array, blockCount: number, blockSize: number): number {
  let oldestOurs = -1;
  let oldestSeq = Infinity;
  let newest = 0;
  let newestSeq = -1;
  for (let b = 0; b < blockCount; b++) {
    const at = (b * blockSize) >>> 2;
    const seq = u32[at + (LAYOUT.blockSeqNum >>> 2)]! + u32[at + (LAYOUT.blockSeqNum >>> 2) + 1]! * 2 ** 32;
    if ((loadStatus(u32, at + (LAYOUT.blockStatus >>> 2)) & TP_STATUS_USER) !== 0 && seq < oldestSeq) {
      oldestSeq = seq;
      oldestOurs = b;
    }
    if (seq > newestSeq) {
      newestSeq = seq;
      newest = b;
    }
  }
  return oldestOurs >= 0 ? oldestOurs : newest;
}

/** V2 frame slot: a power of two holding the largest frame of this MTU (VLAN tag, virtio_net_hdr, headroom, ring header). */
function frameSizeFor(mtu: number, reserveBytes: number): number {
  const needed = mtu + ETHERNET_VLAN_HEADER_BYTES + VNET_HDR_LEN + reserveBytes + 96;
  let size = 2048;
  while (size < needed) size *= 2;
  return size;
}

function addLe16(u8: Uint8Array, at: number, delta: number): void {
  const value = (u8[at]! | (u8[at + 1]! << 8)) + delta;
  u8[at] = value & 0xff;
  u8[at + 1] = (value >>> 8) & 0xff;
}
