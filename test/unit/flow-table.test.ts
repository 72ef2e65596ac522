// FlowTable against a Map model (lookups, deletes, exact LRU eviction), per-state expiry with an
// injected clock, the client->server TCP state machine, per-real counts, and a 1M-entry table.

import { describe, expect, it } from 'vitest';
import { FlowState, FlowTable, nextTcpState, tcpNext, type FlowTimeouts } from '../../src/dataplane/flow-table.js';
import { flowHash, flowIndexHash } from '../../src/dataplane/flow-hash.js';
import { IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN } from '../../src/dataplane/parsed-packet.js';
import { mulberry32 } from '../support/prng.js';

const LONG: FlowTimeouts = { synMs: 1e12, establishedMs: 1e12, finMs: 1e12, closeMs: 1e12, udpMs: 1e12 };
const SEED = 0x5eed;

/** Fills key with a distinct IPv4 TCP 5-tuple for id (client 10.x.y.z:port -> 203.0.113.10:80). */
function fillKey(key: Uint32Array, id: number, protocol = IPPROTO_TCP): void {
  key.fill(0);
  key[0] = protocol | (4 << 8);
  key[1] = (0x0a000000 | (id >>> 8)) >>> 0;
  key[5] = 0xcb00710a;
  key[9] = (((1024 + (id & 0xff)) << 16) | 80) >>> 0;
}

type HashFn = (key: Uint32Array) => number;
const strongHash: HashFn = (key) => flowHash(key, SEED);

function put(t: FlowTable, hash: HashFn, id: number, realId: number, state: number, nowMs: number): number {
  fillKey(t.key, id, state === FlowState.udp ? IPPROTO_UDP : IPPROTO_TCP);
  expect(t.lookup(hash(t.key), nowMs)).toBe(-1);
  return t.insert(hash(t.key), realId, state, nowMs);
}

function find(t: FlowTable, hash: HashFn, id: number, nowMs: number, protocol = IPPROTO_TCP): number {
  fillKey(t.key, id, protocol);
  return t.lookup(hash(t.key), nowMs);
}

function liveEntries(t: FlowTable): number[] {
  const out: number[] = [];
  for (let e = t.next(-1); e !== -1; e = t.next(e)) {
    out.push(e);
    if (out.length > t.capacity) throw new Error('LRU list has a cycle');
  }
  return out;
}

/** Recount per-real active/inactive from scratch and compare with the table's running counts. */
function expectCountsExact(t: FlowTable, maxRealIds: number): void {
  const active = new Int32Array(maxRealIds);
  const inactive = new Int32Array(maxRealIds);
  const entries = liveEntries(t);
  for (const e of entries) {
    const s = t.stateOf(e);
    if (s === FlowState.established || s === FlowState.udp) active[t.realOf(e)]!++;
    else inactive[t.realOf(e)]!++;
  }
  expect(entries.length).toBe(t.size);
  expect(Array.from(t.activeByReal)).toEqual(Array.from(active));
  expect(Array.from(t.inactiveByReal)).toEqual(Array.from(inactive));
}

describe('FlowTable keys', () => {
  it('tells apart IPv4 keys that differ in any word it compares (protocol, addresses, ports), and IPv6 keys in any word', () => {
    const t = new FlowTable(64, LONG, 8, 1);
    const base = Uint32Array.from([IPPROTO_TCP | (4 << 8), 0xc000020a, 0, 0, 0, 0xc6336401, 0, 0, 0, 0x9c4001bb]);
    const v6 = Uint32Array.from([IPPROTO_TCP | (6 << 8), 0x20010db8, 0, 0, 1, 0x20010db8, 0, 0, 0x80, 0x9c4001bb]);
    const variants: Uint32Array[] = [base, v6];
    for (const w of [0, 1, 5, 9]) variants.push(Uint32Array.from(base, (v, i) => (i === w ? (v ^ 1) >>> 0 : v)));
    for (let w = 0; w < 10; w++) variants.push(Uint32Array.from(v6, (v, i) => (i === w ? (v ^ (w === 0 ? 1 : 0x80000000)) >>> 0 : v)));
    // One hash for every key (the table takes any function of the key): only the key compare can
    // tell them apart. Each in on its own entry, each found as that entry.
    const HASH = 12345;
    const entries = variants.map((k, i) => {
      t.key.set(k);
      expect(t.lookup(HASH, 0)).toBe(-1);
      return t.insert(HASH, i % 8, FlowState.syn, 0);
    });
    expect(new Set(entries).size).toBe(variants.length);
    variants.forEach((k, i) => {
      t.key.set(k);
      expect(t.lookup(HASH, 1)).toBe(entries[i]);
    });
  });

  it('refuses an IPv4 key with words 2-4 or 6-8 set, which lookup() would not tell from the canonical one', () => {
    const t = new FlowTable(64, LONG, 8, 1);
    for (const w of [2, 3, 4, 6, 7, 8]) {
      fillKey(t.key, 1);
      t.key[w] = 1;
      expect(() => t.insert(t.indexHash(), 0, FlowState.syn, 0)).toThrow(RangeError);
    }
    expect(t.size).toBe(0);
  });
});

describe('FlowTable against a Map model', () => {
  // The Map's insertion order is the model LRU order: touch = delete + set, eviction = first key.
  function runModel(capacity: number, poolSize: number, ops: number, hash: HashFn, seed: number): void {
    const maxRealIds = 8;
    const t = new FlowTable(capacity, LONG, maxRealIds);
    const model = new Map<number, { entry: number; real: number }>();
    const rand = mulberry32(seed);
    let evictions = 0;
    let removes = 0;
    // Plain comparisons in the loops: one expect() per key would dominate the run time.
    const checkAll = (): void => {
      expect(t.size).toBe(model.size);
      let wrong = 0;
      for (const [id, m] of model) {
        if (find(t, hash, id, 0) !== m.entry || t.realOf(m.entry) !== m.real) wrong++;
      }
      expect(wrong).toBe(0);
      expect(liveEntries(t)).toEqual(Array.from(model.values(), (m) => m.entry));
    };
    for (let op = 0; op < ops; op++) {
      const id = Math.floor(rand() * poolSize);
      const r = rand();
      const e = find(t, hash, id, 0);
      const m = model.get(id);
      if (e !== (m === undefined ? -1 : m.entry)) {
        throw new Error(`op ${op}: lookup of ${id} gave ${e}, model has ${m === undefined ? -1 : m.entry}`);
      }
      if (r < 0.4) {
        if (m !== undefined) {
          t.touch(e, TCP_ACK, 0);
          model.delete(id);
          model.set(id, m);
        }
      } else if (r < 0.75) {
        if (m === undefined) {
          const real = Math.floor(rand() * maxRealIds);
          if (model.size === capacity) {
            const oldestId = model.keys().next().value as number;
            model.delete(oldestId);
            evictions++;
          }
          const entry = t.insert(hash(t.key), real, FlowState.established, 0);
          model.set(id, { entry, real });
        }
      } else if (m !== undefined) {
        t.remove(e);
        model.delete(id);
        removes++;
      }
      if (op % 2000 === 0) checkAll();
    }
    checkAll();
    expect(t.evictions).toBe(evictions);
    expect(t.expirations).toBe(0);
    expectCountsExact(t, maxRealIds);
    // Both paths must have been exercised for the comparison to mean anything.
    expect(evictions).toBeGreaterThan(1000);
    expect(removes).toBeGreaterThan(1000);
  }

  it('matches the model over 200k random lookups, touches, inserts (with evictions) and removes', () => {
    runModel(4096, 10_000, 200_000, strongHash, 1);
  });

  it('matches the model with a 6-bit hash that forces long probe runs and wrap-around', () => {
    // 64 distinct hash values: every probe run is long, and runs cross the index end.
    runModel(512, 1500, 30_000, (key) => flowHash(key, SEED) & 0x3f | 0xffffffc0, 2);
  });

  it('matches the model while the index doubles from 4096 to 65536 buckets', () => {
    runModel(20_000, 40_000, 200_000, strongHash, 7);
  });

  it('matches the model while the index doubles under a 6-bit hash (one cluster wrapping the index end)', () => {
    runModel(3000, 6000, 50_000, (key) => flowHash(key, SEED) & 0x3f | 0xffffffc0, 8);
  });

  it('keeps every remaining key findable after each backward-shift deletion in a wrapping cluster', () => {
    const capacity = 64; // index of 128 buckets; hash 127 starts every key in the last bucket
    const t = new FlowTable(capacity, LONG, 1);
    const sameHash: HashFn = () => 127;
    const ids = Array.from({ length: 60 }, (_, i) => i);
    for (const id of ids) put(t, sameHash, id, 0, FlowState.syn, 0);
    // Mixed-home keys too: some home at 0..3, inside the wrapped run.
    const mixed: HashFn = (key) => (key[9]! & 3) === 0 ? 127 : key[9]! & 3;
    const t2 = new FlowTable(capacity, LONG, 1);
    for (const id of ids) put(t2, mixed, id, 0, FlowState.syn, 0);
    const rand = mulberry32(3);
    for (const [table, hash] of [[t, sameHash], [t2, mixed]] as const) {
      const left = ids.slice();
      while (left.length > 0) {
        const victim = left.splice(Math.floor(rand() * left.length), 1)[0]!;
        table.remove(find(table, hash, victim, 0));
        expect(find(table, hash, victim, 0)).toBe(-1);
        for (const id of left) expect(find(table, hash, id, 0)).toBeGreaterThanOrEqual(0);
        expect(table.size).toBe(left.length);
      }
    }
  });

  it('tells keys apart that share a hash, comparing all ten words', () => {
    const t = new FlowTable(16, LONG, 1);
    const constant: HashFn = () => 7;
    const a = put(t, constant, 1, 0, FlowState.syn, 0);
    // Same tuple, but UDP: differs only in word 0.
    fillKey(t.key, 1, IPPROTO_UDP);
    expect(t.lookup(7, 0)).toBe(-1);
    const b = t.insert(7, 0, FlowState.udp, 0);
    expect(b).not.toBe(a);
    expect(find(t, constant, 1, 0, IPPROTO_TCP)).toBe(a);
    expect(find(t, constant, 1, 0, IPPROTO_UDP)).toBe(b);
    const out = new Uint32Array(10);
    t.readKey(b, out);
    fillKey(t.key, 1, IPPROTO_UDP);
    expect(Array.from(out)).toEqual(Array.from(t.key));
  });
});

describe('FlowTable bucket hash', () => {
  it('hashes its scratch key under its own seed: random per table unless given', () => {
    const a = new FlowTable(64, LONG, 1);
    const b = new FlowTable(64, LONG, 1);
    const c = new FlowTable(64, LONG, 1, 42);
    expect(c.indexSeed).toBe(42);
    expect(a.indexSeed).not.toBe(b.indexSeed); // 1 in 2^32 to fail
    fillKey(c.key, 5);
    expect(c.indexHash()).toBe(flowIndexHash(c.key, 42));
  });

  it('keeps probe runs short for keys crafted to share flowHash bucket bits, which would make one long run', () => {
    // 1000 tuples whose public flow hash (seed 0) has the same low 12 bits: the index of a table
    // with 1000 entries has 4096 buckets. Keyed by flowHash they fill one run; keyed by the
    // table's seeded hash they scatter.
    const key = new Uint32Array(10);
    const crafted: number[] = [];
    for (let id = 0; crafted.length < 1000; id++) {
      fillKey(key, id, IPPROTO_UDP);
      if ((flowHash(key, 0) & 4095) === 0xabc) crafted.push(id);
    }
    const publicHash = new FlowTable(2048, LONG, 1);
    const seeded = new FlowTable(2048, LONG, 1);
    for (const id of crafted) {
      fillKey(publicHash.key, id, IPPROTO_UDP);
      publicHash.insert(flowHash(publicHash.key, 0), 0, FlowState.udp, 0);
      fillKey(seeded.key, id, IPPROTO_UDP);
      seeded.insert(seeded.indexHash(), 0, FlowState.udp, 0);
    }
    expect(publicHash.longestProbe()).toBe(999);
    expect(seeded.longestProbe()).toBeLessThan(24);
    for (const id of crafted) {
      fillKey(seeded.key, id, IPPROTO_UDP);
      expect(seeded.lookup(seeded.indexHash(), 0)).toBeGreaterThanOrEqual(0);
    }
  });
});

describe('FlowTable eviction when full', () => {
  it('gives up the longest-idle established entry when none is being set up, ending or udp, and touch changes the order', () => {
    const t = new FlowTable(4, LONG, 2);
    const e0 = put(t, strongHash, 0, 0, FlowState.established, 10);
    const e1 = put(t, strongHash, 1, 0, FlowState.established, 11);
    const e2 = put(t, strongHash, 2, 1, FlowState.established, 12);
    const e3 = put(t, strongHash, 3, 1, FlowState.established, 13);
    expect(liveEntries(t)).toEqual([e0, e1, e2, e3]);
    t.touch(e0, TCP_ACK, 14); // 0 is now the newest; 1 the oldest
    expect(liveEntries(t)).toEqual([e1, e2, e3, e0]);
    expect(t.lastSeenOf(e0)).toBe(14);

    put(t, strongHash, 4, 1, FlowState.established, 15);
    expect(t.evictions).toBe(1);
    expect(t.size).toBe(4);
    expect(find(t, strongHash, 1, 15)).toBe(-1);
    for (const id of [0, 2, 3, 4]) expect(find(t, strongHash, id, 15)).toBeGreaterThanOrEqual(0);
    expectCountsExact(t, 2);

    t.touch(e2, 0, 16); // a bare segment still refreshes last-seen
    put(t, strongHash, 5, 0, FlowState.established, 17); // evicts 3 (the oldest now)
    expect(find(t, strongHash, 3, 17)).toBe(-1);
    expect(find(t, strongHash, 2, 17)).toBe(e2);
    expect(t.evictions).toBe(2);
    expectCountsExact(t, 2);
  });

  it('gives up udp flows before established connections: a datagram flood replaces udp entries only', () => {
    const t = new FlowTable(4, LONG, 2);
    put(t, strongHash, 0, 0, FlowState.established, 0);
    put(t, strongHash, 1, 1, FlowState.established, 1);
    put(t, strongHash, 2, 0, FlowState.udp, 5);
    put(t, strongHash, 3, 1, FlowState.udp, 6);
    for (let id = 4; id < 1004; id++) put(t, strongHash, id, id & 1, FlowState.udp, id);
    expect(t.evictions).toBe(1000);
    for (const id of [0, 1]) expect(find(t, strongHash, id, 1004)).toBeGreaterThanOrEqual(0);
    for (const id of [1002, 1003]) expect(find(t, strongHash, id, 1004, IPPROTO_UDP)).toBeGreaterThanOrEqual(0);
    // A syn entry still goes before a udp one.
    put(t, strongHash, 2000, 0, FlowState.syn, 2000);
    put(t, strongHash, 2001, 0, FlowState.udp, 2001);
    expect(find(t, strongHash, 2000, 2001)).toBe(-1);
    expect(find(t, strongHash, 1003, 2001, IPPROTO_UDP)).toBeGreaterThanOrEqual(0);
    expectCountsExact(t, 2);
  });

  it('gives up a syn, fin or closed entry before any established one: a SYN flood replaces its own entries', () => {
    const t = new FlowTable(4, LONG, 2);
    put(t, strongHash, 0, 0, FlowState.established, 0);
    put(t, strongHash, 1, 1, FlowState.established, 1);
    put(t, strongHash, 2, 0, FlowState.fin, 5);
    put(t, strongHash, 3, 1, FlowState.syn, 6);
    put(t, strongHash, 4, 0, FlowState.syn, 7); // the fin entry (5) goes, not the established ones idle longer
    expect(find(t, strongHash, 2, 7)).toBe(-1);
    for (let id = 5; id < 1005; id++) put(t, strongHash, id, id & 1, FlowState.syn, id);
    expect(t.evictions).toBe(1001);
    expect(t.size).toBe(4);
    // The established flows idle longest of all are still there; the flood kept the newest two of its own.
    for (const id of [0, 1, 1003, 1004]) expect(find(t, strongHash, id, 1005)).toBeGreaterThanOrEqual(0);
    expectCountsExact(t, 2);
  });

  it('takes an entry already idle past its timeout first, counted as an expiration', () => {
    const t = new FlowTable(2, { ...LONG, synMs: 100 }, 1);
    put(t, strongHash, 0, 0, FlowState.established, 0);
    put(t, strongHash, 1, 0, FlowState.syn, 0);
    put(t, strongHash, 2, 0, FlowState.syn, 100); // id 1 idle 100 ms >= synMs: expired, though 0 is as old
    expect(t.evictions).toBe(0);
    expect(t.expirations).toBe(1);
    expect(find(t, strongHash, 0, 100)).toBeGreaterThanOrEqual(0);
    put(t, strongHash, 3, 0, FlowState.syn, 101); // id 2 syn, not timed out: the syn goes before the established one
    expect(t.evictions).toBe(1);
    expect(find(t, strongHash, 2, 101)).toBe(-1);
    expect(find(t, strongHash, 0, 101)).toBeGreaterThanOrEqual(0);
  });

  it('works at capacity 1', () => {
    const t = new FlowTable(1, LONG, 1);
    for (let id = 0; id < 5; id++) put(t, strongHash, id, 0, FlowState.udp, id);
    expect(t.size).toBe(1);
    expect(t.evictions).toBe(4);
    expect(find(t, strongHash, 4, 5, IPPROTO_UDP)).toBeGreaterThanOrEqual(0);
    expectCountsExact(t, 1);
  });
});

describe('FlowTable expiry with an injected clock', () => {
  const timeouts: FlowTimeouts = { synMs: 1000, establishedMs: 5000, finMs: 2000, closeMs: 500, udpMs: 3000 };
  const cases: Array<[string, number, number]> = [
    ['syn', FlowState.syn, 1000],
    ['established', FlowState.established, 5000],
    ['fin', FlowState.fin, 2000],
    ['closed', FlowState.closed, 500],
    ['udp', FlowState.udp, 3000],
  ];

  for (const [name, state, timeoutMs] of cases) {
    it(`a ${name} entry lives ${timeoutMs} ms after it was last seen, then lookup removes it`, () => {
      const t = new FlowTable(8, timeouts, 1);
      const protocol = state === FlowState.udp ? IPPROTO_UDP : IPPROTO_TCP;
      const e = put(t, strongHash, 1, 0, state, 1000);
      t.touch(e, 0, 2000); // refresh: the timeout counts from here
      // isExpired (the flow dump's filter) agrees with lookup, and changes nothing.
      expect([t.isExpired(e, 2000 + timeoutMs - 1), t.isExpired(e, 2000 + timeoutMs)]).toEqual([false, true]);
      expect(find(t, strongHash, 1, 2000 + timeoutMs - 1, protocol)).toBe(e);
      expect(t.expirations).toBe(0);
      expect(find(t, strongHash, 1, 2000 + timeoutMs, protocol)).toBe(-1);
      expect(t.expirations).toBe(1);
      expect(t.size).toBe(0);
      expectCountsExact(t, 1);
    });
  }

  it('uses the timeout of the state the entry is in now', () => {
    const t = new FlowTable(8, timeouts, 1);
    const e = put(t, strongHash, 1, 0, FlowState.syn, 0);
    t.touch(e, TCP_ACK, 900); // established: 5000 ms from 900
    expect(find(t, strongHash, 1, 5899)).toBe(e);
    t.touch(e, TCP_FIN | TCP_ACK, 5899); // fin: 2000 ms
    expect(find(t, strongHash, 1, 7898)).toBe(e);
    expect(find(t, strongHash, 1, 7899)).toBe(-1);
  });

  it('expire() removes only timed-out entries, oldest first, within the work budget', () => {
    const t = new FlowTable(64, timeouts, 2);
    for (let id = 0; id < 10; id++) put(t, strongHash, id, id & 1, FlowState.closed, id); // expire at id+500
    for (let id = 10; id < 20; id++) put(t, strongHash, id, id & 1, FlowState.syn, 100); // at 1100
    expect(t.expire(504, 100)).toBe(5); // ids 0..4
    expect(t.size).toBe(15);
    expect(t.expire(600, 2)).toBe(2);
    expect(t.expire(600, 2)).toBe(2);
    expect(t.expire(600, 2)).toBe(1); // id 9 then syn id 10, which is not yet due
    expect(t.expire(600, 100)).toBe(0);
    expect(t.size).toBe(10);
    expect(t.expire(1100, 100)).toBe(10);
    expect(t.size).toBe(0);
    expect(t.expirations).toBe(20);
    expectCountsExact(t, 2);
  });

  it('expire() reaches timed-out entries however many older long-lived ones wait', () => {
    const t = new FlowTable(256, timeouts, 1);
    for (let id = 0; id < 100; id++) put(t, strongHash, id, 0, FlowState.established, 0);
    for (let id = 100; id < 110; id++) put(t, strongHash, id, 0, FlowState.closed, 10);
    // At 1000 ms the established entries are older than the smallest timeout but not due: one call
    // with a budget of 10 finds the 10 closed entries behind them (it reads no established entry
    // but the oldest; a single last-seen list made each call walk them first).
    expect(t.expire(1000, 10)).toBe(10);
    expect(t.size).toBe(100);
    expect(find(t, strongHash, 105, 1000)).toBe(-1);
    expect(find(t, strongHash, 5, 1000)).toBeGreaterThanOrEqual(0);
  });

  it('expire() stops at the first entry younger than the smallest timeout', () => {
    const t = new FlowTable(16, timeouts, 1);
    put(t, strongHash, 0, 0, FlowState.closed, 0);
    put(t, strongHash, 1, 0, FlowState.closed, 1000);
    expect(t.expire(600, 100)).toBe(1);
    expect(t.expire(600, 100)).toBe(0);
    expect(t.size).toBe(1);
  });

  it('expire() gives its budget to entries that are due, oldest first', () => {
    const t = new FlowTable(16, timeouts, 1);
    put(t, strongHash, 0, 0, FlowState.closed, 0); // due at 500
    for (let id = 1; id <= 10; id++) put(t, strongHash, id, 0, FlowState.closed, 400);
    expect(t.expire(450, 3)).toBe(0); // nothing is older than the smallest timeout yet
    expect(t.expire(500, 1)).toBe(1); // the one-entry budget goes to the oldest, which is now due
    expect(find(t, strongHash, 0, 500)).toBe(-1);
  });

  it('expire() is right after entries were removed or touched between calls', () => {
    const t = new FlowTable(16, timeouts, 1);
    const entries: number[] = [];
    for (let id = 0; id < 6; id++) entries.push(put(t, strongHash, id, 0, FlowState.closed, id));
    expect(t.expire(600, 1)).toBe(1); // removes id 0; the next pass resumes at id 1
    t.remove(entries[1]!);
    t.touch(entries[2]!, TCP_ACK, 600); // id 2 moves to the tail, young again
    expect(t.expire(600, 100)).toBe(3); // ids 3, 4, 5
    expect(t.size).toBe(1);
    expect(t.expirations).toBe(4);
    expect(find(t, strongHash, 2, 600)).toBe(entries[2]);
    expectCountsExact(t, 1);
  });

  it('setTimeouts() applies to entries already in the table', () => {
    const t = new FlowTable(8, timeouts, 1);
    const e = put(t, strongHash, 1, 0, FlowState.established, 0);
    expect(find(t, strongHash, 1, 4000)).toBe(e);
    t.setTimeouts({ ...timeouts, establishedMs: 3000 });
    expect(find(t, strongHash, 1, 4000)).toBe(-1);
    expect(() => t.setTimeouts({ ...timeouts, finMs: -1 })).toThrow(RangeError);
    expect(() => t.setTimeouts({ ...timeouts, udpMs: Number.NaN })).toThrow(RangeError);
  });
});

describe('TCP state machine, client->server only', () => {
  it('follows SYN, retransmitted SYN, ACK, data, FIN, ACK, and a SYN reusing the port', () => {
    const t = new FlowTable(8, LONG, 2);
    const e = put(t, strongHash, 1, 0, FlowState.syn, 0);
    const steps: Array<[number, number, number, number]> = [
      // flags, expected state, active, inactive (for real 0)
      [TCP_SYN, FlowState.syn, 0, 1], // retransmitted SYN
      [TCP_ACK, FlowState.established, 1, 0], // third packet of the handshake
      [TCP_PSH | TCP_ACK, FlowState.established, 1, 0],
      [TCP_SYN, FlowState.established, 1, 0], // stray SYN does not reset a live connection
      [TCP_FIN | TCP_ACK, FlowState.fin, 0, 1],
      [TCP_ACK, FlowState.fin, 0, 1],
      [TCP_FIN | TCP_ACK, FlowState.fin, 0, 1],
    ];
    for (const [flags, state, active, inactive] of steps) {
      t.touch(e, flags, 1);
      expect(t.stateOf(e)).toBe(state);
      expect(t.activeByReal[0]).toBe(active);
      expect(t.inactiveByReal[0]).toBe(inactive);
    }
    expect(t.isReusable(e)).toBe(true);
    // Port reuse: the engine reschedules, then the SYN starts a new connection.
    t.setReal(e, 1);
    t.touch(e, TCP_SYN, 2);
    expect(t.stateOf(e)).toBe(FlowState.syn);
    expect(t.isReusable(e)).toBe(false);
    expect([t.inactiveByReal[0], t.inactiveByReal[1], t.activeByReal[1]]).toEqual([0, 1, 0]);
    expectCountsExact(t, 2);
  });

  it('RST closes from every tcp state, and closed stays closed on ACK and FIN', () => {
    for (const from of [FlowState.syn, FlowState.established, FlowState.fin, FlowState.closed]) {
      expect(nextTcpState(from, TCP_RST)).toBe(FlowState.closed);
      expect(nextTcpState(from, TCP_RST | TCP_ACK)).toBe(FlowState.closed);
      expect(nextTcpState(from, TCP_RST | TCP_SYN)).toBe(FlowState.closed);
    }
    expect(nextTcpState(FlowState.closed, TCP_ACK)).toBe(FlowState.closed);
    expect(nextTcpState(FlowState.closed, TCP_FIN | TCP_ACK)).toBe(FlowState.closed);
    expect(nextTcpState(FlowState.closed, TCP_SYN)).toBe(FlowState.syn);

    const t = new FlowTable(8, LONG, 1);
    const e = put(t, strongHash, 1, 0, FlowState.established, 0);
    expect(t.activeByReal[0]).toBe(1);
    t.touch(e, TCP_RST, 1);
    expect(t.stateOf(e)).toBe(FlowState.closed);
    expect(t.isReusable(e)).toBe(true);
    expect([t.activeByReal[0], t.inactiveByReal[0]]).toEqual([0, 1]);
  });

  it('the packet path\'s table (tcpNext) agrees with nextTcpState for every tcp state and all 256 flag bytes', () => {
    for (const s of [FlowState.syn, FlowState.established, FlowState.fin, FlowState.closed]) {
      for (let flags = 0; flags < 256; flags++) expect(tcpNext(s, flags), `state ${s} flags ${flags}`).toBe(nextTcpState(s, flags));
    }
  });

  it('FIN from syn goes to fin; bare segments change nothing; SYN wins over FIN as in IPVS', () => {
    expect(nextTcpState(FlowState.syn, TCP_FIN)).toBe(FlowState.fin);
    expect(nextTcpState(FlowState.syn, TCP_SYN | TCP_ACK)).toBe(FlowState.syn);
    expect(nextTcpState(FlowState.syn, TCP_SYN | TCP_FIN)).toBe(FlowState.syn);
    for (const s of [FlowState.syn, FlowState.established, FlowState.fin, FlowState.closed]) {
      expect(nextTcpState(s, 0)).toBe(s);
      expect(nextTcpState(s, TCP_PSH)).toBe(s);
    }
  });

  it('leaves udp entries in udp whatever the flags', () => {
    const t = new FlowTable(8, LONG, 1);
    const e = put(t, strongHash, 1, 0, FlowState.udp, 0);
    t.touch(e, TCP_RST | TCP_FIN, 5);
    expect(t.stateOf(e)).toBe(FlowState.udp);
    expect(t.lastSeenOf(e)).toBe(5);
    expect(t.isReusable(e)).toBe(false);
    expect(t.activeByReal[0]).toBe(1);
  });
});

describe('FlowTable per-real counts', () => {
  it('stay exact through random inserts, touches, setReal, removes, lookups, expiry and evictions', () => {
    const maxRealIds = 5;
    const timeouts: FlowTimeouts = { synMs: 300, establishedMs: 2000, finMs: 600, closeMs: 100, udpMs: 900 };
    const t = new FlowTable(300, timeouts, maxRealIds);
    const rand = mulberry32(4);
    const flagChoices = [TCP_SYN, TCP_ACK, TCP_ACK | TCP_PSH, TCP_FIN | TCP_ACK, TCP_RST, TCP_SYN | TCP_ACK, 0];
    const stateChoices = [FlowState.syn, FlowState.established, FlowState.udp];
    let nowMs = 0;
    for (let op = 0; op < 40_000; op++) {
      nowMs += Math.floor(rand() * 3);
      const id = Math.floor(rand() * 500);
      const protocol = id % 3 === 0 ? IPPROTO_UDP : IPPROTO_TCP;
      fillKey(t.key, id, protocol);
      const hash = strongHash(t.key);
      const e = t.lookup(hash, nowMs);
      const r = rand();
      if (e === -1) {
        const state = protocol === IPPROTO_UDP ? FlowState.udp : stateChoices[Math.floor(rand() * 2)]!;
        t.insert(hash, Math.floor(rand() * maxRealIds), state, nowMs);
      } else if (r < 0.6) {
        t.touch(e, flagChoices[Math.floor(rand() * flagChoices.length)]!, nowMs);
      } else if (r < 0.75) {
        t.setReal(e, Math.floor(rand() * maxRealIds));
      } else if (r < 0.85) {
        t.remove(e);
      } else {
        t.expire(nowMs, 20);
      }
      if (op % 500 === 0) expectCountsExact(t, maxRealIds);
    }
    expectCountsExact(t, maxRealIds);
    expect(t.evictions).toBeGreaterThan(0);
    expect(t.expirations).toBeGreaterThan(0);
    t.clear();
    expect(t.size).toBe(0);
    expectCountsExact(t, maxRealIds);
    expect(t.next(-1)).toBe(-1);
  });

  it('setReal moves the count to the new real in the right column', () => {
    const t = new FlowTable(8, LONG, 3);
    const a = put(t, strongHash, 1, 0, FlowState.established, 0);
    const b = put(t, strongHash, 2, 0, FlowState.syn, 0);
    t.setReal(a, 2);
    t.setReal(b, 1);
    expect(Array.from(t.activeByReal)).toEqual([0, 0, 1]);
    expect(Array.from(t.inactiveByReal)).toEqual([0, 1, 0]);
    expect(t.realOf(a)).toBe(2);
    t.setReal(a, 2); // no-op
    expect(Array.from(t.activeByReal)).toEqual([0, 0, 1]);
    expect(() => t.setReal(a, 3)).toThrow(RangeError);
    expect(() => t.setReal(a, -1)).toThrow(RangeError);
    t.remove(a);
    expect(() => t.setReal(a, 1)).toThrow(RangeError);
    expect(t.realOf(a)).toBe(-1);
    expect(t.stateOf(a)).toBe(0);
    expect(t.activeByReal.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(t.inactiveByReal.buffer).toBeInstanceOf(SharedArrayBuffer);
  });

  it('rejects bad constructor arguments and insert arguments', () => {
    expect(() => new FlowTable(0, LONG, 1)).toThrow(RangeError);
    expect(() => new FlowTable(1.5, LONG, 1)).toThrow(RangeError);
    expect(() => new FlowTable(8, LONG, 0)).toThrow(RangeError);
    const t = new FlowTable(8, LONG, 1);
    fillKey(t.key, 1);
    expect(() => t.insert(strongHash(t.key), 1, FlowState.syn, 0)).toThrow(RangeError);
    expect(() => t.insert(strongHash(t.key), 0, 0, 0)).toThrow(RangeError);
    expect(() => t.insert(strongHash(t.key), 0, 6, 0)).toThrow(RangeError);
    expect(t.size).toBe(0);
  });
});

describe('FlowTable index growth', () => {
  it('shrinks the index on clear() and grows it again over the stale memory of the last use', () => {
    const t = new FlowTable(10_000, LONG, 1);
    for (let round = 0; round < 3; round++) {
      const first = round * 10_000;
      for (let id = first; id < first + 10_000; id++) put(t, strongHash, id, 0, FlowState.syn, 0);
      expect(t.size).toBe(10_000);
      let missing = 0;
      for (let id = first; id < first + 10_000; id++) if (find(t, strongHash, id, 0) === -1) missing++;
      expect(missing).toBe(0);
      // The keys of the previous round are gone, though the index memory they used is reused.
      let stale = 0;
      for (let id = first - 10_000; id < first; id++) if (id >= 0 && find(t, strongHash, id, 0) !== -1) stale++;
      expect(stale).toBe(0);
      expect(liveEntries(t).length).toBe(10_000);
      expectCountsExact(t, 1);
      t.clear();
      expect(t.size).toBe(0);
      expect(find(t, strongHash, first, 0)).toBe(-1);
    }
  });
});

describe('FlowTable iteration', () => {
  it('next() visits each live entry once, oldest first', () => {
    const t = new FlowTable(1000, LONG, 1);
    const rand = mulberry32(5);
    const live = new Set<number>();
    for (let id = 0; id < 800; id++) live.add(put(t, strongHash, id, 0, FlowState.syn, id));
    for (let id = 0; id < 800; id += 3) {
      const e = find(t, strongHash, id, 1000);
      t.remove(e);
      live.delete(e);
    }
    for (let i = 0; i < 200; i++) {
      const e = find(t, strongHash, Math.floor(rand() * 800), 1000);
      if (e !== -1) t.touch(e, TCP_ACK, 1000 + i);
    }
    const seen = liveEntries(t);
    expect(seen.length).toBe(live.size);
    expect(new Set(seen)).toEqual(live);
    for (let i = 1; i < seen.length; i++) {
      expect(t.lastSeenOf(seen[i]!)).toBeGreaterThanOrEqual(t.lastSeenOf(seen[i - 1]!));
    }
  });
});

describe('FlowTable.relinkInSeenOrder (after inserts given past last-seen times, as adoptFlows does)', () => {
  const timeouts: FlowTimeouts = { synMs: 1000, establishedMs: 5000, finMs: 2000, closeMs: 500, udpMs: 3000 };

  it('orders every state\'s list by last-seen, equal times in insertion order, keeping every entry and count', () => {
    const t = new FlowTable(3000, timeouts, 4);
    const rand = mulberry32(31);
    const states = [FlowState.syn, FlowState.established, FlowState.fin, FlowState.closed, FlowState.udp];
    // Random times (many runs), a tenth of them equal (1000 ms).
    const inserted: number[] = [];
    for (let id = 0; id < 2500; id++) inserted.push(put(t, strongHash, id, id & 3, states[id % 5]!, rand() < 0.1 ? 1000 : Math.floor(rand() * 2000)));
    t.relinkInSeenOrder();
    const order = liveEntries(t);
    expect(new Set(order)).toEqual(new Set(inserted));
    const rank = new Map(inserted.map((e, i) => [e, i]));
    for (let i = 1; i < order.length; i++) {
      const [a, b] = [order[i - 1]!, order[i]!];
      if (t.stateOf(a) !== t.stateOf(b)) continue;
      expect(t.lastSeenOf(b)).toBeGreaterThanOrEqual(t.lastSeenOf(a));
      if (t.lastSeenOf(b) === t.lastSeenOf(a)) expect(rank.get(b)!).toBeGreaterThan(rank.get(a)!);
    }
    expectCountsExact(t, 4);
    // Removing, touching and expiring keep working on the relinked lists.
    t.remove(order[0]!);
    t.touch(order[1]!, TCP_ACK, 2500);
    expect(liveEntries(t).length).toBe(2499);
    expectCountsExact(t, 4);
  });

  it('lets expire() and a full table find the longest-idle entries once an old entry was inserted behind a fresh one', () => {
    const t = new FlowTable(3, timeouts, 2);
    put(t, strongHash, 1, 0, FlowState.established, 4000);
    put(t, strongHash, 2, 1, FlowState.established, 100); // inserted later, seen earlier: due at 5100
    t.relinkInSeenOrder();
    expect(t.expire(5100, 100)).toBe(1); // without the relink the sweep stops at id 1 (due at 9000)
    expect(find(t, strongHash, 2, 5100)).toBe(-1);
    put(t, strongHash, 3, 0, FlowState.established, 5200);
    put(t, strongHash, 4, 0, FlowState.established, 1000); // idle 4300 ms at 5300: not expired
    t.relinkInSeenOrder();
    // Full: a new flow evicts the longest idle established entry, id 4, not id 1.
    put(t, strongHash, 5, 0, FlowState.established, 5300);
    expect(t.evictions).toBe(1);
    expect(find(t, strongHash, 4, 5300)).toBe(-1);
    expect(find(t, strongHash, 1, 5300)).toBeGreaterThanOrEqual(0);
    expectCountsExact(t, 2);
  });
});

describe('FlowTable at capacity 1e6', () => {
  it('inserts and finds 1e6 keys within 128 MB of typed arrays', () => {
    const capacity = 1_000_000;
    const t = new FlowTable(capacity, LONG, 256);
    // Each buffer once: the entry records are seen through two views (int32 and float64).
    const buffers = new Set<ArrayBufferLike>();
    for (const value of Object.values(t)) {
      if (ArrayBuffer.isView(value)) buffers.add(value.buffer);
    }
    let arrayBytes = 0;
    for (const buffer of buffers) arrayBytes += buffer.byteLength;
    expect(arrayBytes).toBe(t.memoryBytes);
    expect(arrayBytes).toBeLessThanOrEqual(128 * 1024 * 1024);
    const key = t.key;
    const insertStart = performance.now();
    for (let id = 0; id < capacity; id++) {
      fillKey(key, id);
      t.insert(flowHash(key, SEED), id & 255, FlowState.established, 0);
    }
    const insertMs = performance.now() - insertStart;
    const lookupStart = performance.now();
    let found = 0;
    for (let id = 0; id < capacity; id++) {
      fillKey(key, id);
      if (t.lookup(flowHash(key, SEED), 1) !== -1) found++;
    }
    const lookupMs = performance.now() - lookupStart;
    console.log(
      `flow table capacity ${capacity}: ${(arrayBytes / 1048576).toFixed(1)} MiB of typed arrays, ` +
        `${(arrayBytes / capacity).toFixed(1)} bytes/entry; ` +
        `insert 1e6: ${insertMs.toFixed(0)} ms, lookup 1e6: ${lookupMs.toFixed(0)} ms (incl. key fill + hash)`,
    );
    expect(found).toBe(capacity);
    expect(t.size).toBe(capacity);
    expect(t.evictions).toBe(0);
    expect(t.activeByReal.reduce((sum, n) => sum + n, 0)).toBe(capacity);
    expect(t.activeByReal[0]).toBe(Math.ceil(capacity / 256));
    // One more evicts exactly the first key inserted.
    fillKey(key, capacity);
    t.insert(flowHash(key, SEED), 0, FlowState.syn, 2);
    expect(t.evictions).toBe(1);
    expect(find(t, strongHash, 0, 2)).toBe(-1);
    expect(find(t, strongHash, 1, 2)).toBeGreaterThanOrEqual(0);
  });
});
