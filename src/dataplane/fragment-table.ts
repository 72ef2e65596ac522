// Where later IP fragments go: the first fragment of a datagram is placed by its 5-tuple like any
// packet, and its real is remembered here under (source, destination, protocol, IP id) so the
// fragments that follow (no ports) reach the same real. Small, direct-mapped and bounded: a newer
// datagram that lands in the same slot replaces the older one; entries live FRAGMENT_TTL_MS.

import { randomBytes } from 'node:crypto';
import { flowIndexHash } from './flow-hash.js';

export const FRAGMENT_SLOTS = 4096;
export const FRAGMENT_TTL_MS = 30_000;
const KEY_WORDS = 10;

export class FragmentTable {
  /** Scratch key the caller fills: [protocol | family << 8, src0..3, dst0..3, fragment id]. */
  readonly key = new Uint32Array(KEY_WORDS);
  /** A random slot seed per table, as the flow table's: crafted datagrams cannot aim at one slot. */
  private readonly slotSeed = randomBytes(4).readInt32LE(0);
  private readonly keys = new Uint32Array(FRAGMENT_SLOTS * KEY_WORDS);
  private readonly reals = new Int32Array(FRAGMENT_SLOTS).fill(-1);
  private readonly seenMs = new Float64Array(FRAGMENT_SLOTS);

  /** Fill the scratch key from a parsed packet's addresses. */
  setKey(protocol: number, family: number, addr: Uint32Array, fragmentId: number): void {
    const k = this.key;
    k[0] = protocol | (family << 8);
    for (let i = 0; i < 8; i++) k[1 + i] = addr[i]!;
    k[9] = fragmentId >>> 0;
  }

  private slotOfKey(): number {
    return flowIndexHash(this.key, this.slotSeed) & (FRAGMENT_SLOTS - 1);
  }

  record(real: number, nowMs: number): void {
    const slot = this.slotOfKey();
    this.keys.set(this.key, slot * KEY_WORDS);
    this.reals[slot] = real;
    this.seenMs[slot] = nowMs;
  }

  /** The real of the datagram in the scratch key, or -1. */
  lookup(nowMs: number): number {
    const slot = this.slotOfKey();
    if (this.reals[slot] === -1 || nowMs - this.seenMs[slot]! > FRAGMENT_TTL_MS) return -1;
    const base = slot * KEY_WORDS;
    const k = this.key;
    for (let i = 0; i < KEY_WORDS; i++) if (this.keys[base + i] !== k[i]) return -1;
    return this.reals[slot]!;
  }
}
