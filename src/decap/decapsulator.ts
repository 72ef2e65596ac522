// The decapsulator's per-packet step and its counters: a received tunnel packet in, its inner
// packet written to the TUN device (so the kernel delivers it as if it had arrived there) or a
// named drop counted. Independent of sockets and devices, so unit tests drive it with buffers.

import {
  DECAP_DROP_SLOTS,
  DecapDrop,
  INNER_FAMILY,
  INNER_LENGTH,
  INNER_OFFSET,
  innerOfIpv4Outer,
  innerOfIpv6Outer,
  type DecapDropName,
  type VipSet,
} from './inner-packet.js';
import type { SourceFilter } from './source-filter.js';

/** Writes one packet to the TUN device: bytes written, or -errno (native tunWrite). */
export type PacketWriter = (buf: Uint8Array, offset: number, length: number) => number;

export interface DecapCounters {
  /** Tunnel packets received, by outer family (after the kernel's reassembly: one per datagram). */
  receivedIpv4Outer: number;
  receivedIpv6Outer: number;
  /** Inner packets written to the TUN device, by inner family, and their bytes. */
  decapsulatedIpv4: number;
  decapsulatedIpv6: number;
  decapsulatedBytes: number;
  /** Refusals by reason (only reasons seen are listed). */
  dropped: Partial<Record<DecapDropName, number>>;
  /** errno (negative) of the latest TUN write refusal, 0 if none. */
  lastTunWriteErrno: number;
}

const dropNames: readonly (DecapDropName | undefined)[] = (() => {
  const names = new Array<DecapDropName | undefined>(DECAP_DROP_SLOTS);
  for (const [name, slot] of Object.entries(DecapDrop)) names[slot] = name as DecapDropName;
  return names;
})();

// Counter slots in one Float64Array (exact integers up to 2^53).
const RX_V4_OUTER = 0;
const RX_V6_OUTER = 1;
const TX_V4 = 2;
const TX_V6 = 3;
const TX_BYTES = 4;
const LAST_ERRNO = 5;
const DROP_BASE = 8;

export class Decapsulator {
  private readonly counts = new Float64Array(DROP_BASE + DECAP_DROP_SLOTS);
  private readonly inner = new Int32Array(3);

  constructor(
    private readonly vips: VipSet,
    private readonly write: PacketWriter,
    private readonly sources: SourceFilter | null = null,
  ) {}

  /**
   * A packet from an IPv4 raw socket (protocol 4 or 41): outer header included, so its source too.
   * Returns 0 or -DecapDrop.
   */
  receiveIpv4Outer(buf: Uint8Array, length: number): number {
    this.counts[RX_V4_OUTER]!++;
    if (this.sources !== null && length >= 20 && !this.sources.allows(4, buf, 12)) return this.deliver(buf, -DecapDrop.sourceNotAllowed);
    return this.deliver(buf, innerOfIpv4Outer(buf, length, this.vips, this.inner));
  }

  /**
   * A packet from an IPv6 raw socket for next header `protocol`: the outer header already stripped,
   * its traffic class given apart (IPV6_TCLASS ancillary data; -1 when there was none) and its
   * source too (16 bytes at sourceOffset of `source`).
   */
  receiveIpv6Outer(buf: Uint8Array, length: number, protocol: number, outerTrafficClass: number, source?: Uint8Array, sourceOffset = 0): number {
    this.counts[RX_V6_OUTER]!++;
    if (this.sources !== null && (source === undefined || !this.sources.allows(6, source, sourceOffset))) return this.deliver(buf, -DecapDrop.sourceNotAllowed);
    return this.deliver(buf, innerOfIpv6Outer(buf, length, protocol, outerTrafficClass, this.vips, this.inner));
  }

  counters(): DecapCounters {
    const dropped: Partial<Record<DecapDropName, number>> = {};
    for (let slot = 1; slot < DECAP_DROP_SLOTS; slot++) {
      const name = dropNames[slot];
      const count = this.counts[DROP_BASE + slot]!;
      if (name !== undefined && count > 0) dropped[name] = count;
    }
    return {
      receivedIpv4Outer: this.counts[RX_V4_OUTER]!,
      receivedIpv6Outer: this.counts[RX_V6_OUTER]!,
      decapsulatedIpv4: this.counts[TX_V4]!,
      decapsulatedIpv6: this.counts[TX_V6]!,
      decapsulatedBytes: this.counts[TX_BYTES]!,
      dropped,
      lastTunWriteErrno: this.counts[LAST_ERRNO]!,
    };
  }

  private deliver(buf: Uint8Array, verdict: number): number {
    if (verdict < 0) {
      this.counts[DROP_BASE - verdict]!++;
      return verdict;
    }
    const length = this.inner[INNER_LENGTH]!;
    const written = this.write(buf, this.inner[INNER_OFFSET]!, length);
    if (written !== length) {
      this.counts[DROP_BASE + DecapDrop.tunWriteFailed]!++;
      this.counts[LAST_ERRNO] = written < 0 ? written : 0;
      return -DecapDrop.tunWriteFailed;
    }
    this.counts[this.inner[INNER_FAMILY] === 4 ? TX_V4 : TX_V6]!++;
    this.counts[TX_BYTES]! += length;
    return 0;
  }
}
