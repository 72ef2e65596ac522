// Weighted Maglev lookup table (Maglev paper, section 3.4): a pure builder from the set of reals to
// an Int32Array of real ids, plus control-plane helpers that measure how two tables differ.
// The engine looks a flow up as table[hash % table.length]; an empty or all-zero set gives -1s.

import { stringHash } from './flow-hash.js';
import { sharedArray } from './forwarding-snapshot.js';

export interface MaglevReal {
  /** The value written into the slots this real owns (an int32 >= 0). */
  readonly id: number;
  /** The real's canonical address text: with the seed, the only input to its permutation. */
  readonly key: string;
  /** Relative share of the slots, an integer 0..65535; 0 = no slots. */
  readonly weight: number;
}

/** Largest table accepted; keeps turn arithmetic exact in doubles and the table under 64 MiB. */
export const MAX_MAGLEV_TABLE_SIZE = 16_777_213; // largest prime below 2^24

export const MAX_MAGLEV_WEIGHT = 65535;

// Second hash seed for the skip, so offset and skip are independent.
const SKIP_SEED_XOR = 0x9e3779b9;

export function isPrime(n: number): boolean {
  if (!Number.isSafeInteger(n) || n < 2) return false;
  if (n % 2 === 0) return n === 2;
  for (let d = 3; d * d <= n; d += 2) {
    if (n % d === 0) return false;
  }
  return true;
}

/** Greatest common divisor of two integers >= 0 (gcd(0, n) = n). */
export function gcd(a: number, b: number): number {
  while (b !== 0) {
    const t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// Code-unit order, not localeCompare: the order (and so the table) must not depend on the host's locale.
function compareKeys(a: MaglevReal, b: MaglevReal): number {
  return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
}

function validate(reals: readonly MaglevReal[], tableSize: number): void {
  if (!isPrime(tableSize) || tableSize > MAX_MAGLEV_TABLE_SIZE) {
    throw new RangeError(
      `Maglev table size must be a prime between 2 and ${MAX_MAGLEV_TABLE_SIZE}, got ${tableSize}`,
    );
  }
  const keys = new Set<string>();
  const ids = new Set<number>();
  for (const real of reals) {
    if (!Number.isInteger(real.id) || real.id < 0 || real.id > 0x7fffffff) {
      throw new RangeError(`real ${real.key}: id must be an int32 >= 0, got ${real.id}`);
    }
    if (!Number.isInteger(real.weight) || real.weight < 0 || real.weight > MAX_MAGLEV_WEIGHT) {
      throw new RangeError(
        `real ${real.key}: weight must be an integer 0..${MAX_MAGLEV_WEIGHT}, got ${real.weight}`,
      );
    }
    if (keys.has(real.key)) throw new RangeError(`real ${real.key}: duplicate key`);
    if (ids.has(real.id)) throw new RangeError(`real ${real.key}: duplicate id ${real.id}`);
    keys.add(real.key);
    ids.add(real.id);
  }
}

/**
 * Builds the Maglev table for the reals. Depends only on the set of (key, weight, id), the seed and
 * tableSize (a prime): input order is irrelevant because reals are sorted first.
 *
 * Each real walks its own permutation of the slots (offset + j * skip mod M) and, on each of its
 * turns, claims its next still-empty slot. Weights (reduced by their GCD to w_i, largest W) set how
 * often a real gets a turn: real i takes its t-th turn in pass ceil(t * W / w_i), so every W passes
 * it takes exactly w_i turns, spread evenly, and a cut-off last round stays proportional. Within a
 * pass heavier reals go first, then key order. With equal weights this is the paper's round-robin.
 */
export function buildMaglevTable(
  reals: readonly MaglevReal[],
  tableSize: number,
  seed: number,
): Int32Array {
  validate(reals, tableSize);
  const table = sharedArray(Int32Array, tableSize).fill(-1); // a snapshot's: shared with the loops
  let divisor = 0;
  for (const real of reals) divisor = gcd(real.weight, divisor);
  if (divisor === 0) return table; // no real, or all weight 0
  const eligible = reals
    .filter((r) => r.weight > 0)
    .sort((a, b) => b.weight - a.weight || compareKeys(a, b));
  const count = eligible.length;

  const ids = new Int32Array(count);
  const skips = new Int32Array(count);
  const positions = new Int32Array(count); // next permutation position to try, per real
  const skipSeed = (seed ^ SKIP_SEED_XOR) >>> 0;
  for (let i = 0; i < count; i++) {
    const real = eligible[i]!;
    ids[i] = real.id;
    positions[i] = stringHash(real.key, seed) % tableSize;
    skips[i] = tableSize === 2 ? 1 : (stringHash(real.key, skipSeed) % (tableSize - 1)) + 1;
  }

  // Reals of equal weight take their turns in the same passes, so the schedule runs over weight
  // classes (runs of the sorted list): O(log classes) per class turn instead of per real turn.
  const classStart: number[] = [];
  for (let i = 0; i < count; i++) {
    if (i === 0 || eligible[i]!.weight !== eligible[i - 1]!.weight) classStart.push(i);
  }
  const classCount = classStart.length;
  classStart.push(count);
  const maxWeight = eligible[0]!.weight / divisor;
  const classWeight = new Float64Array(classCount);
  const classTurns = new Float64Array(classCount);
  const nextPass = new Float64Array(classCount);
  const heap = new Int32Array(classCount); // min-heap of classes by (nextPass, class index)
  for (let c = 0; c < classCount; c++) {
    classWeight[c] = eligible[classStart[c]!]!.weight / divisor;
    nextPass[c] = Math.ceil(maxWeight / classWeight[c]!);
    heap[c] = c; // already ordered: nextPass grows as the weight falls
  }

  let filled = 0;
  while (filled < tableSize) {
    const c = heap[0]!;
    const end = classStart[c + 1]!;
    for (let i = classStart[c]!; i < end && filled < tableSize; i++) {
      // skip < tableSize (a prime) makes the walk a full cycle, so an empty slot is always reached.
      const skip = skips[i]!;
      let slot = positions[i]!;
      while (table[slot] !== -1) {
        slot += skip;
        if (slot >= tableSize) slot -= tableSize;
      }
      table[slot] = ids[i]!;
      filled++;
      slot += skip;
      positions[i] = slot >= tableSize ? slot - tableSize : slot;
    }
    // Integers below 2^53 and w <= W keep this ceil exact.
    const turns = ++classTurns[c]!;
    const pass = Math.ceil(((turns + 1) * maxWeight) / classWeight[c]!);
    nextPass[c] = pass;
    let at = 0;
    for (;;) {
      const left = 2 * at + 1;
      if (left >= classCount) break;
      let child = left;
      const right = left + 1;
      if (right < classCount) {
        const l = heap[left]!;
        const r = heap[right]!;
        if (nextPass[r]! < nextPass[l]! || (nextPass[r] === nextPass[l] && r < l)) child = right;
      }
      const other = heap[child]!;
      if (pass < nextPass[other]! || (pass === nextPass[other] && c < other)) break;
      heap[at] = other;
      at = child;
    }
    heap[at] = c;
  }
  return table;
}

/**
 * Slots that had a real in `before` and another one (or none) in `after`, tables of one size: the
 * flows that would move. An empty slot (-1) that gets a real is not a move: no flow was there
 * (a first build, or reals whose MACs just became known, moves nothing).
 */
export function countMovedSlots(before: Int32Array, after: Int32Array): number {
  if (before.length !== after.length) {
    throw new RangeError(`tables differ in size (${before.length} vs ${after.length}); slots are not comparable`);
  }
  let moved = 0;
  for (let i = 0; i < before.length; i++) if (before[i] !== -1 && before[i] !== after[i]) moved++;
  return moved;
}

/** Slots held per value (real id; -1 counts empty slots when there are any). */
export function slotCounts(table: Int32Array): Map<number, number> {
  const counts = new Map<number, number>();
  for (let i = 0; i < table.length; i++) {
    const id = table[i]!;
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  return counts;
}
