import { describe, expect, it } from 'vitest';
import {
  buildMaglevTable,
  countMovedSlots,
  isPrime,
  MAX_MAGLEV_TABLE_SIZE,
  slotCounts,
  type MaglevReal,
} from '../../src/dataplane/maglev-table.js';

const M = 65537;
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

function address(i: number): string {
  return `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
}

function makeReals(n: number, weightOf: (i: number) => number = () => 100, firstId = 0): MaglevReal[] {
  return Array.from({ length: n }, (_, i) => ({ id: firstId + i, key: address(firstId + i), weight: weightOf(i) }));
}

function shuffled<T>(items: readonly T[], next: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = next() % (i + 1);
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

// FNV-1a over the table's int32 words: a checksum that pins the whole algorithm.
function tableChecksum(table: Int32Array): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < table.length; i++) {
    h = Math.imul(h ^ (table[i]! & 0xffff), 0x01000193);
    h = Math.imul(h ^ (table[i]! >>> 16), 0x01000193);
  }
  return h >>> 0;
}

// Slots whose owner changed because of the real that left or arrived (own; each must change) and
// for any other reason (other: the collateral disruption).
function collateralChanges(
  before: Int32Array,
  after: Int32Array,
  movedId: number,
): { own: number; ownUnchanged: number; other: number } {
  let own = 0;
  let ownUnchanged = 0;
  let other = 0;
  for (let i = 0; i < before.length; i++) {
    if (before[i] === movedId || after[i] === movedId) {
      own++;
      if (before[i] === after[i]) ownUnchanged++;
    } else if (before[i] !== after[i]) {
      other++;
    }
  }
  return { own, ownUnchanged, other };
}

// Removes `removals` seeded-random reals one at a time from n equal-weight reals and adds `additions`
// new ones; checks the moving real's slots all change and returns the worst collateral fraction.
function checkDisruption(n: number, size: number, removals: number, additions: number): number {
  const next = xorshift32(n * 7919 + size);
  const reals = makeReals(n);
  const base = buildMaglevTable(reals, size, SEED);
  const baseCounts = slotCounts(base);
  const removed: number[] = [];
  const added: number[] = [];
  for (let trial = 0; trial < removals; trial++) {
    const victim = next() % n;
    const after = buildMaglevTable(reals.filter((r) => r.id !== victim), size, SEED);
    const { own, ownUnchanged, other } = collateralChanges(base, after, victim);
    expect(own).toBe(baseCounts.get(victim));
    expect(ownUnchanged).toBe(0);
    removed.push(other / size);
  }
  for (let trial = 0; trial < additions; trial++) {
    const newcomerId = 100_000 + (next() % 100_000);
    const after = buildMaglevTable([...reals, { id: newcomerId, key: address(newcomerId), weight: 100 }], size, SEED);
    const { own, ownUnchanged, other } = collateralChanges(base, after, newcomerId);
    expect(own).toBe(slotCounts(after).get(newcomerId));
    expect(ownUnchanged).toBe(0);
    added.push(other / size);
  }
  const pct = (xs: number[]): string => xs.map((x) => (x * 100).toFixed(3) + '%').join(' ');
  console.log(`disruption N=${n} M=${size}: collateral on removal ${pct(removed)}; on addition ${pct(added)}`);
  return Math.max(...removed, ...added);
}

describe('isPrime', () => {
  it('tells primes from the rest', () => {
    for (const p of [2, 3, 5, 7, 13, 251, 65537, 655373, 10_000_019, MAX_MAGLEV_TABLE_SIZE]) expect(isPrime(p), `${p}`).toBe(true);
    for (const n of [-7, 0, 1, 4, 9, 15, 65535, 65536, 655371, 1_000_000, 2.5, Number.NaN, Infinity]) {
      expect(isPrime(n), `${n}`).toBe(false);
    }
  });
});

describe('buildMaglevTable input checks', () => {
  it('refuses a table size that is not a prime, or too large', () => {
    expect(() => buildMaglevTable(makeReals(3), 65536, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(makeReals(3), 1, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(makeReals(3), 16_777_259, SEED)).toThrow(RangeError); // prime above 2^24
  });

  it('refuses weights outside 0..65535 or not integers, bad ids and duplicates', () => {
    const one = (real: Partial<MaglevReal>): MaglevReal[] => [{ id: 1, key: '10.0.0.1', weight: 1, ...real }];
    expect(() => buildMaglevTable(one({ weight: -1 }), 13, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(one({ weight: 1.5 }), 13, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(one({ weight: 65536 }), 13, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(one({ weight: Number.NaN }), 13, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(one({ id: -1 }), 13, SEED)).toThrow(RangeError);
    expect(() => buildMaglevTable(one({ id: 2 ** 31 }), 13, SEED)).toThrow(RangeError);
    const a = { id: 1, key: '10.0.0.1', weight: 1 };
    expect(() => buildMaglevTable([a, { ...a, id: 2 }], 13, SEED)).toThrow(/duplicate key/);
    expect(() => buildMaglevTable([a, { ...a, key: '10.0.0.2' }], 13, SEED)).toThrow(/duplicate id/);
  });
});

describe('buildMaglevTable edge cases', () => {
  it('fills the table with -1 when there is no real or every weight is 0', () => {
    expect(buildMaglevTable([], 13, SEED)).toEqual(new Int32Array(13).fill(-1));
    expect(buildMaglevTable(makeReals(4, () => 0), M, SEED).every((v) => v === -1)).toBe(true);
  });

  it('gives weight-0 reals no slots and the rest everything', () => {
    const reals = makeReals(5, (i) => (i % 2 === 0 ? 0 : 7));
    const counts = slotCounts(buildMaglevTable(reals, M, SEED));
    expect([...counts.keys()].sort()).toEqual([1, 3]);
    expect(counts.get(1)! + counts.get(3)!).toBe(M);
  });

  it('gives a single real every slot, also in the smallest table', () => {
    expect(buildMaglevTable(makeReals(1), 2, SEED)).toEqual(Int32Array.from([0, 0]));
    expect(slotCounts(buildMaglevTable(makeReals(1, () => 3), M, SEED))).toEqual(new Map([[0, M]]));
  });

  it('fills every slot even with more reals than slots', () => {
    const table = buildMaglevTable(makeReals(20), 13, SEED);
    expect(table.every((v) => v >= 0 && v < 20)).toBe(true);
    expect(new Set(table).size).toBe(13);
  });
});

describe('buildMaglevTable balance', () => {
  for (const n of [3, 7, 100, 1000]) it(`with ${n} equal-weight reals each holds floor(M/N) or ceil(M/N) slots`, () => {
    const counts = slotCounts(buildMaglevTable(makeReals(n), M, SEED));
    expect(counts.size).toBe(n);
    const low = Math.floor(M / n);
    const high = Math.ceil(M / n);
    let total = 0;
    for (const [id, count] of counts) {
      expect(id).toBeGreaterThanOrEqual(0);
      expect(count === low || count === high, `real ${id} holds ${count}`).toBe(true);
      total += count;
    }
    expect(total).toBe(M);
  });

  const weightMixes: Array<[string, number[]]> = [
    ['1:2:3:4', [1, 2, 3, 4]],
    ['100:200:300:400', [100, 200, 300, 400]],
    ['random 100..1000 (12 reals)', (() => {
      const next = xorshift32(2024);
      return Array.from({ length: 12 }, () => 100 + (next() % 901));
    })()],
    ['random 1..65535 (30 reals, at least 1000)', (() => {
      const next = xorshift32(77);
      return Array.from({ length: 30 }, () => 1000 + (next() % 64536));
    })()],
  ];
  for (const [name, weights] of weightMixes) it(`weights ${name}: each share within 2 percent (relative) of its weight share`, () => {
    const counts = slotCounts(buildMaglevTable(makeReals(weights.length, (i) => weights[i]!), M, SEED));
    const sum = weights.reduce((a, b) => a + b, 0);
    let worstRelative = 0;
    let worstSlots = 0;
    weights.forEach((w, id) => {
      const expected = (M * w) / sum;
      const got = counts.get(id) ?? 0;
      worstRelative = Math.max(worstRelative, Math.abs(got - expected) / expected);
      worstSlots = Math.max(worstSlots, Math.abs(got - expected));
    });
    console.log(`weights ${name}: worst deviation ${(worstRelative * 100).toFixed(3)}% (${worstSlots.toFixed(2)} slots)`);
    expect(worstRelative).toBeLessThanOrEqual(0.02);
    // Each turn claims exactly one slot and turns are spread evenly, so shares are off by about one turn.
    expect(worstSlots).toBeLessThan(3);
  });

  it('depends only on weight ratios: 100:200:300:400 builds the same table as 1:2:3:4', () => {
    const small = buildMaglevTable(makeReals(4, (i) => i + 1), M, SEED);
    const large = buildMaglevTable(makeReals(4, (i) => (i + 1) * 100), M, SEED);
    expect(countMovedSlots(small, large)).toBe(0);
  });

  it('stays balanced and fast enough at 1000 reals for M = 65537 and M = 655373', () => {
    const reals = makeReals(1000);
    for (const size of [M, 655373]) {
      buildMaglevTable(reals, size, SEED); // warm up the JIT
      const startMs = performance.now();
      const table = buildMaglevTable(reals, size, SEED);
      const elapsedMs = performance.now() - startMs;
      console.log(`build: 1000 reals, M=${size}: ${elapsedMs.toFixed(1)} ms`);
      for (const count of slotCounts(table).values()) {
        expect(count === Math.floor(size / 1000) || count === Math.ceil(size / 1000)).toBe(true);
      }
    }
  });
});

describe('buildMaglevTable disruption', () => {
  // Equal weights; for each N, reals chosen by a seeded generator leave and new ones arrive.
  for (const n of [3, 10, 37, 100, 1000]) {
    it(`M = 65537: removing or adding one of ${n} reals moves its slots plus at most 1 percent of the table`, () => {
      expect(checkDisruption(n, M, 3, 2)).toBeLessThanOrEqual(0.01);
    });
  }

  // Finding: plain Maglev's collateral disruption peaks where M/N is about 140..190 and the peak
  // shrinks roughly as 1/sqrt(M). At M = 65537 that band is N = 350..480: 0.92..0.98% on average,
  // up to 1.04% for some reals (30 victims each at N = 400, 430, 450). The standard fix is a larger
  // table: at M = 131071 the worst seen over N = 100..2000 is 0.74%.
  it('M = 65537 in its worst band (N = 430) stays near 1 percent: at most 1.1 percent (known limit)', () => {
    expect(checkDisruption(430, M, 3, 2)).toBeLessThanOrEqual(0.011);
  });
  for (const [n, size] of [[430, 131071], [700, 131071], [1000, 131071], [1000, 655373]] as const) {
    it(`M = ${size}: removing or adding one of ${n} reals moves its slots plus at most 1 percent`, () => {
      expect(checkDisruption(n, size, 2, 1)).toBeLessThanOrEqual(0.01);
    });
  }

  it('removing one real from a random weight mix moves at most 1 percent beyond its slots', () => {
    const next = xorshift32(31337);
    const weights = Array.from({ length: 100 }, () => 1 + (next() % 1000));
    const reals = makeReals(100, (i) => weights[i]!);
    const base = buildMaglevTable(reals, M, SEED);
    const moved: number[] = [];
    for (let trial = 0; trial < 3; trial++) {
      const victim = next() % 100;
      const after = buildMaglevTable(reals.filter((r) => r.id !== victim), M, SEED);
      const { ownUnchanged, other } = collateralChanges(base, after, victim);
      expect(ownUnchanged).toBe(0);
      expect(other).toBeLessThanOrEqual(0.01 * M);
      moved.push(other / M);
    }
    console.log(`disruption weighted N=100 M=${M}: ${moved.map((x) => (x * 100).toFixed(3) + '%').join(' ')}`);
  });
});

describe('buildMaglevTable determinism', () => {
  it('builds the same table on every call and for every input order', () => {
    const next = xorshift32(5);
    const reals = makeReals(50, (i) => 1 + (i % 5));
    const first = buildMaglevTable(reals, M, SEED);
    expect(buildMaglevTable(reals, M, SEED)).toEqual(first);
    for (let trial = 0; trial < 5; trial++) {
      expect(countMovedSlots(buildMaglevTable(shuffled(reals, next), M, SEED), first)).toBe(0);
    }
  });

  it('changes with the seed', () => {
    const reals = makeReals(10);
    expect(countMovedSlots(buildMaglevTable(reals, M, 1), buildMaglevTable(reals, M, 2))).toBeGreaterThan(M / 2);
  });

  it('is pinned: a small literal table and a checksum of a large weighted one', () => {
    const small = [
      { id: 7, key: '192.0.2.1', weight: 1 },
      { id: 3, key: '192.0.2.2', weight: 2 },
      { id: 5, key: '2001:db8::5', weight: 1 },
    ];
    expect(Array.from(buildMaglevTable(small, 13, 42))).toEqual([3, 7, 3, 3, 5, 5, 3, 3, 3, 3, 7, 7, 5]);
    const large = makeReals(40, (i) => [1, 2, 3, 5, 8][i % 5]!);
    expect(tableChecksum(buildMaglevTable(large, M, 42))).toBe(0x732f9133);
    const equal = makeReals(40, () => 1);
    expect(tableChecksum(buildMaglevTable(equal, M, 42))).toBe(0x8147e7e7);
  });
});

describe('countMovedSlots and slotCounts', () => {
  it('count slots that change real (an empty slot filled is no move) and slots per id, refusing tables of different sizes', () => {
    const a = Int32Array.from([1, 1, 2, -1, 3]);
    const b = Int32Array.from([1, 2, 2, 3, -1]);
    expect(countMovedSlots(a, b)).toBe(2);
    expect(countMovedSlots(b, a)).toBe(2);
    expect(countMovedSlots(a, a)).toBe(0);
    expect(countMovedSlots(new Int32Array(5).fill(-1), a)).toBe(0);
    expect(() => countMovedSlots(a, new Int32Array(4))).toThrow(RangeError);
    expect(slotCounts(a)).toEqual(new Map([[1, 2], [2, 1], [-1, 1], [3, 1]]));
  });
});
