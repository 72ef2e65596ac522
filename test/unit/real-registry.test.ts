// Real ids: stable while a pair exists or holds flows, freed after, and reused lowest first.

import { describe, expect, it } from 'vitest';
import { RealRegistry } from '../../src/control/real-registry.js';

describe('RealRegistry', () => {
  it('reuses freed ids lowest first, however many were freed in a row, and refuses past its size', () => {
    const r = new RealRegistry(10_000);
    for (let i = 0; i < 8000; i++) expect(r.idFor(`s#${i}`)).toBe(i);
    // A reload that forgets 7,999 reals at once (it sorted the free list on every release).
    for (let i = 7999; i >= 1; i--) r.release(`s#${i}`);
    expect(r.size).toBe(1);
    expect(r.available()).toBe(10_000 - 1);
    expect([r.idFor('t#a'), r.idFor('t#b'), r.idFor('t#c')]).toEqual([1, 2, 3]);
    r.release('t#b');
    r.release('s#0');
    expect([r.idFor('t#d'), r.idFor('t#e'), r.idFor('t#a')]).toEqual([0, 2, 1]);
    const small = new RealRegistry(2);
    small.idFor('a');
    small.idFor('b');
    expect(() => small.idFor('c')).toThrow(/more than 2 reals/);
  });
});
