// The one interface between the packet engine and whatever moves frames: the native AF_PACKET
// addon (afpacket-io.ts), libpcap through the cap package (pcap-io.ts) and memory (memory-io.ts).
// A backend hands the engine whole batches that point into its own memory; the engine decides
// per frame in place, then the backend sends the frames marked VERDICT_TX in one call.

/** Leave the frame alone: not for us (the kernel still gets its own copy). */
export const VERDICT_PASS = 0;
/** Send the frame at txOffsets[i], txLengths[i] (the engine may have moved its start into the headroom). */
export const VERDICT_TX = 1;
/** The engine handled the frame by other frames (software GSO segments): send nothing of it. */
export const VERDICT_CONSUMED = 2;
// A negative verdict is -DropReason: dropped and counted.

/** Per-frame flag: the frame carries a virtio_net_hdr (10 bytes) right before frameOffset. */
export const FRAME_HAS_VNET_HDR = 1;
/** Per-frame flag: the L4 checksum is partial (CHECKSUM_PARTIAL from a local or veth sender). */
export const FRAME_CSUM_PARTIAL = 2;
/** Per-frame flag: the frame is a GSO super-frame larger than the MTU (segmented on output). */
export const FRAME_GSO = 4;

export const VNET_HDR_LEN = 10;
/** virtio_net_hdr.gso_type (byte 1): the ECN bit, and UDP_L4 (UDP GSO: a train of datagrams behind one header). */
export const VIRTIO_NET_HDR_GSO_ECN = 0x80;
export const VIRTIO_NET_HDR_GSO_UDP_L4 = 5;

/**
 * A batch of received frames. Arrays are preallocated by the backend with `capacity` slots and
 * reused for every batch; only the first `count` slots are valid.
 */
export interface PacketBatch {
  /** The memory that holds the frames (a ring block, a capture buffer, a test buffer). */
  buf: Uint8Array;
  count: number;
  readonly capacity: number;
  /** Input: where each frame starts (its Ethernet header) and how long it is. */
  readonly offsets: Int32Array;
  readonly lengths: Int32Array;
  /** Input: FRAME_* flags. */
  readonly flags: Uint8Array;
  /** Output: VERDICT_PASS, VERDICT_TX or -DropReason. */
  readonly verdicts: Int32Array;
  /** Output for VERDICT_TX: the frame to send (may start before offsets[i] when a header was prepended). */
  readonly txOffsets: Int32Array;
  readonly txLengths: Int32Array;
  /** Bytes writable before each frame's offset (for encapsulation headers), same for all frames. */
  headroom: number;
  /**
   * Frames the engine made besides the received ones (ICMP errors, outer fragments, software GSO
   * segments), written into extraBuf and sent after the batch's TX frames. When extraVnetHdr is
   * set (by the backend), the 10 bytes before each extra frame hold its virtio_net_hdr (zeroed:
   * no offload asked). The engine resets extraCount at the start of every batch.
   */
  readonly extraBuf: Uint8Array;
  readonly extraOffsets: Int32Array;
  readonly extraLengths: Int32Array;
  extraCount: number;
  extraVnetHdr: boolean;
}

export const EXTRA_FRAMES = 512;
export const EXTRA_BUFFER_BYTES = 1 << 20;

/**
 * What cutting one GSO frame may take of a batch's extra area (the engine cuts those for IPIP
 * reals): a frame per segment, and per segment its headers again, the outer header, a
 * virtio_net_hdr and the engine's headroom, besides the payload. A backend ends a batch before the
 * GSO frames in it could need more than EXTRA_BUDGET leaves; the rest of the area stays for the
 * ICMP errors and fragments of the other frames. (The engine drops a frame that does not fit as
 * batch_full: a fast upload through an IPIP real lost one 64 KiB frame in 50 that way.)
 */
export const EXTRA_SEGMENT_OVERHEAD_BYTES = 224;
export const EXTRA_BUDGET = { frames: EXTRA_FRAMES - 64, bytes: EXTRA_BUFFER_BYTES - (128 << 10) } as const;

/** The segments a GSO frame of `length` bytes is cut into: by its gso_size, else by `mtu`. */
export function gsoSegmentsOf(length: number, gsoSize: number, mtu: number): number {
  const unit = gsoSize > 0 ? gsoSize : mtu > 100 ? mtu - 60 : 1400;
  return Math.ceil(length / unit) + 1;
}

export function createPacketBatch(capacity: number): PacketBatch {
  return {
    buf: new Uint8Array(0),
    count: 0,
    capacity,
    offsets: new Int32Array(capacity),
    lengths: new Int32Array(capacity),
    flags: new Uint8Array(capacity),
    verdicts: new Int32Array(capacity),
    txOffsets: new Int32Array(capacity),
    txLengths: new Int32Array(capacity),
    headroom: 0,
    extraBuf: new Uint8Array(EXTRA_BUFFER_BYTES),
    extraOffsets: new Int32Array(EXTRA_FRAMES),
    extraLengths: new Int32Array(EXTRA_FRAMES),
    extraCount: 0,
    extraVnetHdr: false,
  };
}

export interface PacketIoStats {
  /** Frames received and handed to the engine. */
  rxFrames: number;
  /** Frames the kernel dropped before we read them (ring full), when the backend can tell. */
  rxKernelDrops: number;
  /** Frames sent. */
  txFrames: number;
  /** Frames whose send failed. */
  txErrors: number;
  /** Frames addressed to another host's MAC (promiscuous interface, flooding switch), ignored. */
  rxOtherHost?: number;
  /** Frames the capture cut short (dsrlb_dropped_packets_total{reason="capture_truncated"}), when the backend can tell. */
  rxTruncated?: number;
  /** Milliseconds spent handling wake-ups (ring, engine, send), when the backend measures it. */
  busyMs?: number;
}

export interface PacketIo {
  readonly kind: 'afpacket' | 'pcap' | 'memory';
  /** The interface's MAC address (6 bytes) and MTU, read when the backend opened it. */
  readonly localMac: Uint8Array;
  readonly mtu: number;
  /** The PACKET_FANOUT group its socket is in, null for none; backends without fanout leave it out. */
  readonly fanoutGroupId?: number | null;
  /**
   * Start delivering batches. `onBatch` runs synchronously for each batch and fills the verdicts;
   * when it returns, the backend sends the VERDICT_TX frames and recycles the batch memory.
   */
  start(onBatch: (batch: PacketBatch) => void): void;
  /** Stop delivering and close the socket; idempotent. */
  close(): void;
  stats(): PacketIoStats;
  /**
   * Why the socket no longer sees the interface it was opened on (deleted, or deleted and made
   * again under the same name: a packet socket stays bound to the old index and receives nothing
   * for good), or null while it does. Backends that cannot tell leave it out.
   */
  interfaceLost?(): string | null;
  /**
   * A descriptor of its socket for the control thread to keep (the socket outlives this I/O while
   * it is open, and a loop started again takes it over); backends that cannot leave it out.
   */
  keepSocket?(): number;
}
