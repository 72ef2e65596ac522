import { describe, expect, it } from 'vitest';
import { leastConnectionsPick } from '../../src/dataplane/least-connections.js';

function pick(ids: number[], weights: number[], active: Record<number, number>, start = 0, count = ids.length, inactive: Record<number, number> = {}): number {
  const activeByReal = new Int32Array(64);
  const inactiveByReal = new Int32Array(64);
  for (const [id, n] of Object.entries(active)) activeByReal[Number(id)] = n;
  for (const [id, n] of Object.entries(inactive)) inactiveByReal[Number(id)] = n;
  return leastConnectionsPick(Int32Array.from(ids), Float64Array.from(weights), start, count, activeByReal, inactiveByReal);
}

describe('leastConnectionsPick (weighted least-connections)', () => {
  it('picks the lowest active/weight, not the lowest active count', () => {
    // loads 4/1 = 4, 6/2 = 3, 10/4 = 2.5
    expect(pick([1, 2, 3], [1, 2, 4], { 1: 4, 2: 6, 3: 10 })).toBe(3);
    // loads 1/1 = 1, 3/2 = 1.5, 4/3 = 1.33
    expect(pick([1, 2, 3], [1, 2, 3], { 1: 1, 2: 3, 3: 4 })).toBe(1);
    expect(pick([1, 2], [100, 100], { 1: 0, 2: 0 })).toBe(1);
    expect(pick([7, 2], [100, 100], { 7: 0, 2: 1 })).toBe(7);
  });

  it('breaks equal loads by the lower id, whatever the candidate order', () => {
    expect(pick([5, 2, 9], [1, 2, 3], { 5: 2, 2: 4, 9: 6 })).toBe(2);
    expect(pick([9, 5, 2], [3, 1, 2], { 5: 2, 2: 4, 9: 6 })).toBe(2);
    expect(pick([9, 5], [7, 3], { 9: 7, 5: 3 })).toBe(5);
    // 1/3 and 2/6 are equal as fractions: cross-multiplication sees the tie
    expect(pick([8, 4], [3, 6], { 8: 1, 4: 2 })).toBe(4);
  });

  it('skips weight 0 (and NaN) even when it has no flows', () => {
    expect(pick([1, 2, 3], [0, 5, Number.NaN], { 1: 0, 2: 50, 3: 0 })).toBe(2);
    expect(pick([1, 2], [0, 0], {})).toBe(-1);
  });

  it('looks only at its slice and returns -1 for an empty or out-of-range slice', () => {
    expect(pick([1, 2, 3, 4], [1, 1, 1, 1], { 1: 0, 2: 5, 3: 3, 4: 0 }, 1, 2)).toBe(3);
    expect(pick([1, 2, 3], [1, 1, 1], {}, 1, 0)).toBe(-1);
    expect(pick([1, 2, 3], [1, 1, 1], {}, 2, 2)).toBe(-1);
    expect(pick([1, 2, 3], [1, 1, 1], {}, -1, 2)).toBe(-1);
    expect(pick([1, 2, 3], [1, 1, 1], {}, 0.5, 1)).toBe(-1);
    expect(leastConnectionsPick(Int32Array.from([1, 2]), Float64Array.from([1]), 0, 2, new Int32Array(4), new Int32Array(4))).toBe(-1);
  });

  it('skips a candidate whose id has no active counter', () => {
    expect(pick([1, 64, 2], [1, 1, 1], { 1: 5, 2: 3 })).toBe(2);
    expect(pick([-1, 2], [1, 1], { 2: 3 })).toBe(2);
  });

  it('spreads a stream of new flows in proportion to the weights 1:2:3', () => {
    const ids = Int32Array.from([0, 1, 2]);
    const weights = Float64Array.from([1, 2, 3]);
    const active = new Int32Array(3);
    const inactive = new Int32Array(3);
    for (let flow = 0; flow < 600; flow++) active[leastConnectionsPick(ids, weights, 0, 3, active, inactive)]++;
    expect(Array.from(active)).toEqual([100, 200, 300]);
    // Closing flows on real 2 sends the next new flows there until it catches up.
    active[2] -= 30;
    for (let flow = 0; flow < 30; flow++) {
      expect(leastConnectionsPick(ids, weights, 0, 3, active, inactive)).toBe(2);
      active[2]++;
    }
    expect(Array.from(active)).toEqual([100, 200, 300]);
  });

  it('compares exactly with the largest counts a flow table holds', () => {
    // Loads of 2^28 active flows (the table's largest capacity) and weight 65535: one inactive flow more is seen.
    const activeByReal = Int32Array.from([1 << 28, 1 << 28]);
    expect(leastConnectionsPick(Int32Array.from([0, 1]), Float64Array.from([65535, 65535]), 0, 2, activeByReal, Int32Array.from([1, 0]))).toBe(1);
    expect(leastConnectionsPick(Int32Array.from([0, 1]), Float64Array.from([65534, 65535]), 0, 2, activeByReal, Int32Array.from([0, 0]))).toBe(1);
  });

  it('counts connections still in their handshake, as IPVS (active * 256 + inactive): a burst of SYNs spreads', () => {
    const ids = Int32Array.from([0, 1, 2]);
    const weights = Float64Array.from([1, 1, 1]);
    const active = new Int32Array(3);
    const inactive = new Int32Array(3);
    // 16 new connections, none established yet (each entry is inactive until its ACK).
    for (let flow = 0; flow < 16; flow++) inactive[leastConnectionsPick(ids, weights, 0, 3, active, inactive)]++;
    expect(Array.from(inactive)).toEqual([6, 5, 5]);
    // An established flow weighs 256 handshakes.
    expect(pick([1, 2], [1, 1], { 1: 1, 2: 0 }, 0, 2, { 1: 0, 2: 255 })).toBe(2);
    expect(pick([1, 2], [1, 1], { 1: 1, 2: 0 }, 0, 2, { 1: 0, 2: 257 })).toBe(1);
  });
});
