import { describe, expect, it } from 'vitest';
import { flowHash, stringHash } from '../../src/dataplane/flow-hash.js';
import { rendezvousPick } from '../../src/dataplane/rendezvous.js';

const SEED = 0x5eed;

function xorshift32(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>>= 0);
  };
}

interface Real {
  id: number;
  key: string;
  weight: number;
}

// The candidate arrays as the control plane lays them out, with `padding` unrelated candidates
// (heavy, so they would win if the slice leaked) before and after the service's slice.
function candidates(reals: readonly Real[], padding = 2) {
  const all: Real[] = [];
  for (let i = 0; i < padding; i++) all.push({ id: 9000 + i, key: `198.18.0.${i}`, weight: 1e6 });
  all.push(...reals);
  for (let i = 0; i < padding; i++) all.push({ id: 9100 + i, key: `198.18.1.${i}`, weight: 1e6 });
  return {
    ids: Int32Array.from(all, (r) => r.id),
    seeds: Uint32Array.from(all, (r) => stringHash(r.key, SEED)),
    weights: Float64Array.from(all, (r) => r.weight),
    start: padding,
    count: reals.length,
  };
}

function pickAll(reals: readonly Real[], hashes: Uint32Array): Int32Array {
  const c = candidates(reals);
  const picks = new Int32Array(hashes.length);
  for (let i = 0; i < hashes.length; i++) picks[i] = rendezvousPick(hashes[i]!, c.ids, c.seeds, c.weights, c.start, c.count);
  return picks;
}

function randomHashes(count: number, seed: number): Uint32Array {
  const next = xorshift32(seed);
  const hashes = new Uint32Array(count);
  for (let i = 0; i < count; i++) hashes[i] = next();
  return hashes;
}

function makeReals(n: number, weightOf: (i: number) => number = () => 100): Real[] {
  return Array.from({ length: n }, (_, i) => ({ id: 10 + 3 * i, key: `10.1.0.${i + 1}`, weight: weightOf(i) }));
}

describe('rendezvousPick', () => {
  it('removing a real moves exactly the flows that were on it (100k flow hashes)', () => {
    const hashes = randomHashes(100_000, 1);
    const reals = makeReals(10);
    const before = pickAll(reals, hashes);
    for (const victim of [reals[0]!, reals[4]!, reals[9]!]) {
      const after = pickAll(reals.filter((r) => r !== victim), hashes);
      let onVictim = 0;
      let moved = 0;
      for (let i = 0; i < hashes.length; i++) {
        if (before[i] === victim.id) onVictim++;
        if (before[i] !== after[i]) {
          moved++;
          expect(before[i]).toBe(victim.id);
        }
        expect(after[i]).not.toBe(-1);
        expect(after[i]).not.toBe(victim.id);
      }
      expect(moved).toBe(onVictim);
      expect(onVictim).toBeGreaterThan(8000); // about a tenth
    }
  });

  it('adding a real moves flows only onto the new real, about its share', () => {
    const hashes = randomHashes(100_000, 2);
    const reals = makeReals(9);
    const before = pickAll(reals, hashes);
    const newcomer = { id: 4, key: '10.1.0.200', weight: 100 };
    const after = pickAll([...reals, newcomer], hashes);
    let moved = 0;
    for (let i = 0; i < hashes.length; i++) {
      if (before[i] !== after[i]) {
        moved++;
        expect(after[i]).toBe(newcomer.id);
      }
    }
    expect(Math.abs(moved / hashes.length - 0.1)).toBeLessThan(0.005);
  });

  it('raising one weight moves flows only onto that real', () => {
    const hashes = randomHashes(50_000, 3);
    const reals = makeReals(5);
    const before = pickAll(reals, hashes);
    const heavier = reals.map((r, i) => (i === 2 ? { ...r, weight: 300 } : r));
    const after = pickAll(heavier, hashes);
    for (let i = 0; i < hashes.length; i++) {
      if (before[i] !== after[i]) expect(after[i]).toBe(reals[2]!.id);
    }
  });

  it('weights 1:2:3 give shares within 2 percent (relative) over 300k flow keys', () => {
    const reals = makeReals(3, (i) => i + 1);
    const c = candidates(reals);
    const next = xorshift32(4);
    const key = new Uint32Array(10);
    const counts = new Map<number, number>();
    for (let i = 0; i < 300_000; i++) {
      key[0] = 6 | (4 << 8);
      key[1] = next();
      key[5] = 0xc6336401;
      key[9] = ((next() << 16) | 443) >>> 0;
      const id = rendezvousPick(flowHash(key, SEED), c.ids, c.seeds, c.weights, c.start, c.count);
      counts.set(id, (counts.get(id) ?? 0) + 1);
    }
    const shares = reals.map((r) => (counts.get(r.id) ?? 0) / 300_000);
    console.log(`rendezvous 1:2:3 shares ${shares.map((s) => s.toFixed(4)).join(' ')} (expected 0.1667 0.3333 0.5000)`);
    reals.forEach((r, i) => {
      const expected = r.weight / 6;
      expect(Math.abs(shares[i]! - expected) / expected).toBeLessThan(0.02);
    });
    expect(counts.size).toBe(3);
  });

  it('balances equal weights over many reals', () => {
    const reals = makeReals(50);
    const picks = pickAll(reals, randomHashes(200_000, 5));
    const counts = new Map<number, number>();
    for (const id of picks) counts.set(id, (counts.get(id) ?? 0) + 1);
    expect(counts.size).toBe(50);
    for (const count of counts.values()) expect(Math.abs(count - 4000)).toBeLessThan(4000 * 0.08);
  });

  it('breaks equal scores by candidate order (by address, as every LB lists them), not by the local ids that differ between LBs', () => {
    const seeds = Uint32Array.from([123, 123, 123]);
    const weights = Float64Array.from([5, 5, 5]);
    // The same three reals in address order on two LBs that gave them different local ids.
    const lbA = Int32Array.from([8, 3, 6]);
    const lbB = Int32Array.from([0, 1, 2]);
    for (const hash of [0, 1, 0xffffffff, 0x12345678]) {
      expect(rendezvousPick(hash, lbA, seeds, weights, 0, 3)).toBe(8);
      expect(rendezvousPick(hash, lbB, seeds, weights, 0, 3)).toBe(0);
    }
  });

  it('skips weight 0 (and NaN) and returns -1 when nothing is eligible or the slice is out of range', () => {
    const ids = Int32Array.from([1, 2, 3]);
    const seeds = Uint32Array.from([11, 22, 33]);
    for (let hash = 0; hash < 1000; hash++) {
      expect(rendezvousPick(hash * 7919, ids, seeds, Float64Array.from([0, 1, Number.NaN]), 0, 3)).toBe(2);
    }
    expect(rendezvousPick(5, ids, seeds, Float64Array.from([0, 0, 0]), 0, 3)).toBe(-1);
    const weights = Float64Array.from([1, 1, 1]);
    expect(rendezvousPick(5, ids, seeds, weights, 1, 0)).toBe(-1);
    expect(rendezvousPick(5, ids, seeds, weights, 2, 2)).toBe(-1);
    expect(rendezvousPick(5, ids, seeds, weights, -1, 2)).toBe(-1);
    expect(rendezvousPick(5, ids, seeds, weights, 0.5, 1)).toBe(-1);
    expect(rendezvousPick(5, ids, seeds.subarray(0, 2), weights, 0, 3)).toBe(-1);
  });

  it('is pinned: the same flow hash picks the same real on every host', () => {
    const reals = makeReals(5, (i) => [100, 50, 100, 200, 1][i]!);
    const picks = pickAll(reals, Uint32Array.from([0, 1, 0xdeadbeef, 0x80000000, 0xffffffff, 42, 4242, 424242]));
    expect(Array.from(picks)).toEqual([19, 13, 19, 19, 10, 19, 16, 16]);
  });
});
