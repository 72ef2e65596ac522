// Flows handed from one daemon to the next: a loop's flows taken out (collectFlows) and put into a
// new table (adoptFlows) with their reals, states and idle times, expiring when they would have
// (or within the grace that several loops get), and the file that carries them (flows-file.ts).

import { describe, expect, it } from 'vitest';
import { decodeSavedFlows, encodeSavedFlows, type SavedFlows } from '../../src/control/flows-file.js';
import { adoptFlows, collectFlows, collectRecords, concatFlows, dedupeFlows, scanRecords, type FlowBatch } from '../../src/dataplane/flow-handoff.js';
import { mulberry32 } from '../support/prng.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { FLOW_RECORD, FlowState, FlowTable, type FlowTimeouts } from '../../src/dataplane/flow-table.js';

const TIMEOUTS: FlowTimeouts = { synMs: 10_000, establishedMs: 900_000, finMs: 30_000, closeMs: 5_000, udpMs: 300_000 };
const MAX_REALS = 64;

function keyOf(id: number): Uint32Array {
  const k = new Uint32Array(FLOW_KEY_WORDS);
  k[0] = 6 | (4 << 8);
  k[1] = (0x0a000000 | id) >>> 0;
  k[5] = 0xcb00710a;
  k[9] = ((40000 + (id & 0xfff)) << 16) | 80;
  return k;
}

function put(t: FlowTable, id: number, real: number, state: number, nowMs: number): void {
  t.key.set(keyOf(id));
  t.insert(t.indexHash(), real, state, nowMs);
}

/** A batch of flow `id` alone. */
function one(id: number, real: number, state: number, idleMs: number): FlowBatch {
  return { count: 1, keys: keyOf(id), reals: Int32Array.from([real]), states: Uint8Array.from([state]), idleMs: Float64Array.from([idleMs]) };
}

/** The entry of flow `id` in `t`, or -1. */
function find(t: FlowTable, id: number, nowMs: number): number {
  t.key.set(keyOf(id));
  return t.lookup(t.indexHash(), nowMs);
}

describe('collectFlows and adoptFlows', () => {
  // Flows 1..5, one per state, last seen at different times before 1,000,000 ms.
  const old = new FlowTable(100, TIMEOUTS, MAX_REALS, 1);
  put(old, 1, 7, FlowState.established, 100_000); // idle 900 s at 1,000,000: past its timeout
  put(old, 2, 8, FlowState.syn, 995_000); // idle 5 s
  put(old, 3, 9, FlowState.closed, 999_000); // closed: no connection
  put(old, 4, 10, FlowState.udp, 990_000); // idle 10 s
  put(old, 5, 11, FlowState.established, 400_000); // idle 600 s
  put(old, 6, 12, FlowState.fin, 998_000); // idle 2 s
  const batch = collectFlows(old, 1_000_000, 1000);

  it('takes the live flows with real, state and idle time, not the expired or closed ones', () => {
    expect(batch.count).toBe(4);
    const got = Array.from({ length: batch.count }, (_, i) => ({ src: batch.keys[i * FLOW_KEY_WORDS + 1]! & 0xff, real: batch.reals[i], state: batch.states[i], idle: batch.idleMs[i] }));
    expect(got.sort((a, b) => a.src - b.src)).toEqual([
      { src: 2, real: 8, state: FlowState.syn, idle: 5_000 },
      { src: 4, real: 10, state: FlowState.udp, idle: 10_000 },
      { src: 5, real: 11, state: FlowState.established, idle: 600_000 },
      { src: 6, real: 12, state: FlowState.fin, idle: 2_000 },
    ]);
    expect(collectFlows(old, 1_000_000, 2).count).toBe(2);
  });

  it('puts them into a new table on their reals, expiring when they would have', () => {
    // The new daemon's clock starts elsewhere: idle times, not clock values, carry over.
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 2);
    expect(adoptFlows(t, batch, 50_000, null, MAX_REALS)).toBe(4);
    expect(adoptFlows(t, batch, 50_000, null, MAX_REALS)).toBe(4); // given again: held, not put in twice
    expect(t.size).toBe(4);
    const e5 = find(t, 5, 50_000);
    expect(t.realOf(e5)).toBe(11);
    expect(t.stateOf(e5)).toBe(FlowState.established);
    expect(t.lastSeenOf(e5)).toBe(50_000 - 600_000);
    expect(t.activeByReal[11]).toBe(1);
    expect(t.inactiveByReal[8]).toBe(1);
    // The syn entry (idle 5 s of 10) goes 5 s later, the established one 300 s later.
    expect(t.expire(50_000 + 5_001, 100)).toBeGreaterThanOrEqual(1);
    expect(find(t, 2, 50_000 + 5_001)).toBe(-1);
    expect(find(t, 5, 50_000 + 299_000)).toBeGreaterThanOrEqual(0);
    expect(find(t, 5, 50_000 + 300_000)).toBe(-1);
  });

  it('with a grace, keeps an untouched flow no longer than that, and a touched one as usual', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 3);
    expect(adoptFlows(t, batch, 0, 60_000, MAX_REALS)).toBe(4);
    const e5 = find(t, 5, 59_000);
    expect(e5).toBeGreaterThanOrEqual(0);
    t.touch(e5, 0x10, 59_000);
    expect(find(t, 2, 5_001)).toBe(-1); // its own 5 s left are less than the grace
    expect(find(t, 4, 60_000)).toBe(-1);
    expect(find(t, 6, 60_000)).toBe(-1);
    expect(find(t, 5, 900_000)).toBeGreaterThanOrEqual(0);
  });

  it('leaves out an IPv4 flow whose key has words 2-4 or 6-8 set (a damaged flows file; no packet makes one)', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 4);
    const odd = keyOf(7);
    odd[3] = 1;
    const given: FlowBatch = { count: 2, keys: Uint32Array.from([...odd, ...keyOf(8)]), reals: Int32Array.from([1, 1]), states: Uint8Array.from([FlowState.udp, FlowState.udp]), idleMs: Float64Array.from([0, 0]) };
    expect(adoptFlows(t, given, 1_000, null, MAX_REALS)).toBe(1);
    expect(t.size).toBe(1);
    expect(find(t, 8, 1_000)).toBeGreaterThanOrEqual(0);
  });

  it('leaves out flows with a real id or state out of range', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 4);
    const bad = { ...batch, reals: Int32Array.from([MAX_REALS, -1, 3, 3]), states: Uint8Array.from([FlowState.syn, FlowState.syn, 0, 9]) };
    expect(adoptFlows(t, bad, 0, null, MAX_REALS)).toBe(0);
    expect(t.size).toBe(0);
  });

  it('keeps the most recently active flows when the table cannot hold them all, and counts no eviction', () => {
    // Each of several loops holds capacity / workers entries and is given every flow.
    const t = new FlowTable(2, TIMEOUTS, MAX_REALS, 5);
    expect(adoptFlows(t, batch, 0, null, MAX_REALS)).toBe(2);
    expect(t.size).toBe(2);
    expect(find(t, 6, 0)).toBeGreaterThanOrEqual(0); // idle 2 s
    expect(find(t, 2, 0)).toBeGreaterThanOrEqual(0); // idle 5 s
    expect(t.evictions).toBe(0); // no live flow was evicted: dsrlb_flow_table_evictions_total stays
  });

  it('keeps the most recent copy of a flow handed over twice (a restart within the grace: each loop had a copy)', () => {
    // Loop A saw the flow's packets (idle 50 ms); loop B held the untouched, grace-clamped copy.
    const twice = {
      count: 2,
      keys: Uint32Array.from([...keyOf(9), ...keyOf(9)]),
      reals: Int32Array.from([3, 3]),
      states: Uint8Array.from([FlowState.established, FlowState.syn]),
      idleMs: Float64Array.from([50, 850_000]),
    };
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 6);
    expect(adoptFlows(t, twice, 1_000_000, null, MAX_REALS)).toBe(1);
    const e = find(t, 9, 1_000_000);
    expect(t.stateOf(e)).toBe(FlowState.established);
    expect(t.lastSeenOf(e)).toBe(1_000_000 - 50);
    expect(t.activeByReal[3]).toBe(1);
    expect(t.inactiveByReal[3]).toBe(0);
  });
});

describe('adoptFlows into a table that holds flows (a loop given the flows of one that ended)', () => {
  it("gives the batch's real to a flow the table placed anew, keeping the later last-seen time", () => {
    // The loop that knew flow 9 (real 3, drained since) ended; its next packet came to this loop,
    // which found no entry and placed it on real 5 two seconds ago.
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 7);
    put(t, 9, 5, FlowState.established, 998_000);
    expect(adoptFlows(t, one(9, 3, FlowState.established, 10_000), 1_000_000, null, MAX_REALS)).toBe(1);
    const e = find(t, 9, 1_000_000);
    expect(t.realOf(e)).toBe(3);
    expect(t.lastSeenOf(e)).toBe(998_000);
    expect(t.activeByReal[5]).toBe(0);
    expect(t.activeByReal[3]).toBe(1);
    expect(t.size).toBe(1);
  });

  it('leaves alone an entry on the same real that is more recent (its own flow given back)', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 8);
    put(t, 9, 3, FlowState.fin, 999_000);
    expect(adoptFlows(t, one(9, 3, FlowState.established, 5_000), 1_000_000, 60_000, MAX_REALS)).toBe(1);
    const e = find(t, 9, 1_000_000);
    expect(t.stateOf(e)).toBe(FlowState.fin);
    expect(t.lastSeenOf(e)).toBe(999_000);
    expect(t.inactiveByReal[3]).toBe(1);
    expect(t.activeByReal[3]).toBe(0);
  });
});

describe('adoptFlows with a grace, into a table that holds flows (with several loops)', () => {
  const NOW = 10_000_000;

  it('keeps a flow given the batch\'s real to the grace when no packet comes, however recent the entry it replaced', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 11);
    put(t, 9, 5, FlowState.established, NOW - 10_000);
    expect(adoptFlows(t, one(9, 3, FlowState.established, 5_000), NOW, 60_000, MAX_REALS)).toBe(1);
    const e = find(t, 9, NOW);
    expect(t.realOf(e)).toBe(3);
    // Gone 60 s from now unless a packet comes (it lived 890 s: the entry's time, unclamped).
    expect(find(t, 9, NOW + 59_000)).toBeGreaterThanOrEqual(0);
    expect(find(t, 9, NOW + 60_000)).toBe(-1);
  });

  it('does not let an old grace copy on another real replace a more recent entry', () => {
    // The batch's copy was itself handed over earlier (idle 850 s of 900, a grace copy); the
    // table's entry saw a packet 1 s ago on real 5.
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 12);
    put(t, 9, 5, FlowState.established, NOW - 1_000);
    expect(adoptFlows(t, one(9, 3, FlowState.established, 850_000), NOW, 60_000, MAX_REALS)).toBe(0);
    expect(t.realOf(find(t, 9, NOW))).toBe(5);
  });

  it('takes the most recently active of a flow\'s copies, whatever their states', () => {
    // The loop that saw the flow's packets has it established 50 ms ago; another loop's copy, a
    // grace copy from an earlier restart, still says syn.
    const twice = {
      count: 2,
      keys: Uint32Array.from([...keyOf(9), ...keyOf(9)]),
      reals: Int32Array.from([3, 3]),
      states: Uint8Array.from([FlowState.syn, FlowState.established]),
      idleMs: Float64Array.from([9_000, 50]),
    };
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 13);
    expect(adoptFlows(t, twice, NOW, 60_000, MAX_REALS)).toBe(1);
    expect(t.stateOf(find(t, 9, NOW))).toBe(FlowState.established);
  });

  it('never evicts the table\'s own flows: what does not fit is left out, the longest idle first', () => {
    const t = new FlowTable(4, TIMEOUTS, MAX_REALS, 14);
    put(t, 1, 1, FlowState.established, NOW - 800_000); // idle 800 s: the oldest in the table
    put(t, 2, 1, FlowState.established, NOW - 1_000);
    const three = {
      count: 3,
      keys: Uint32Array.from([...keyOf(3), ...keyOf(4), ...keyOf(5)]),
      reals: Int32Array.from([2, 2, 2]),
      states: Uint8Array.from([FlowState.udp, FlowState.udp, FlowState.udp]),
      idleMs: Float64Array.from([30_000, 10_000, 20_000]),
    };
    expect(adoptFlows(t, three, NOW, null, MAX_REALS)).toBe(2);
    expect(find(t, 1, NOW)).toBeGreaterThanOrEqual(0);
    expect(find(t, 3, NOW)).toBe(-1); // the longest idle of the three
    expect(find(t, 4, NOW)).toBeGreaterThanOrEqual(0);
    expect(find(t, 5, NOW)).toBeGreaterThanOrEqual(0);
    expect(t.evictions).toBe(0);
  });
});

/** For each state, whether next() (each state's last-seen list, head first) gives non-decreasing last-seen times. */
function listsInSeenOrder(t: FlowTable): boolean {
  let prev = -1;
  for (let e = t.next(-1); e >= 0; e = t.next(e)) {
    if (prev >= 0 && t.stateOf(prev) === t.stateOf(e) && t.lastSeenOf(e) < t.lastSeenOf(prev)) return false;
    prev = e;
  }
  return true;
}

describe('adoptFlows keeps the table\'s last-seen lists in order (expire() reads each list only up to its first entry not due)', () => {
  const NOW = 10_000_000;

  it('lets the sweep remove grace copies adopted behind the loop\'s own fresher flows 60 s from now, not after the established timeout', () => {
    // A running loop's own flows: established 10 s and 2 s ago on real 1, udp 1 s ago on real 1.
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 21);
    put(t, 1, 1, FlowState.established, NOW - 10_000);
    put(t, 2, 1, FlowState.established, NOW - 2_000);
    put(t, 3, 1, FlowState.udp, NOW - 1_000);
    // An ended loop's flows on real 2, handed to it with the 60 s grace (LoopGroup, workers > 1).
    const given = {
      count: 3,
      keys: Uint32Array.from([...keyOf(11), ...keyOf(12), ...keyOf(13)]),
      reals: Int32Array.from([2, 2, 2]),
      states: Uint8Array.from([FlowState.established, FlowState.established, FlowState.udp]),
      idleMs: Float64Array.from([5_000, 400_000, 20_000]),
    };
    expect(adoptFlows(t, given, NOW, 60_000, MAX_REALS)).toBe(3);
    expect(listsInSeenOrder(t)).toBe(true);
    expect([t.size, t.activeByReal[1], t.activeByReal[2]]).toEqual([6, 3, 3]);
    // Only the sweep, no packet: the copies stay until their grace is over, then go together.
    expect(t.expire(NOW + 59_999, 1000)).toBe(0);
    expect(t.expire(NOW + 60_000, 1000)).toBe(3);
    expect([t.size, t.activeByReal[1], t.activeByReal[2]]).toEqual([3, 3, 0]);
    // The loop's own flows still live out their timeouts.
    expect(t.expire(NOW + 298_999, 1000)).toBe(0);
    expect(t.expire(NOW + 299_000, 1000)).toBe(1); // udp, seen 1 s before NOW
    expect(t.expire(NOW + 890_000, 1000)).toBe(1); // established, seen 10 s before NOW
    expect(t.expire(NOW + 898_000, 1000)).toBe(1);
    expect(t.size).toBe(0);
  });

  it('keeps the order when a flow takes the later last-seen time of the entry it replaces (no grace: a start)', () => {
    // Flow 9 was placed anew on real 5 a second ago; the batch says real 3, idle 100 s, and flow 10
    // idle 50 s: flow 9 goes in first (the older) but with the entry's time, after flow 10's.
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 22);
    put(t, 9, 5, FlowState.established, NOW - 1_000);
    const given = {
      count: 2,
      keys: Uint32Array.from([...keyOf(9), ...keyOf(10)]),
      reals: Int32Array.from([3, 3]),
      states: Uint8Array.from([FlowState.established, FlowState.established]),
      idleMs: Float64Array.from([100_000, 50_000]),
    };
    expect(adoptFlows(t, given, NOW, null, MAX_REALS)).toBe(2);
    expect(listsInSeenOrder(t)).toBe(true);
    expect(t.expire(NOW + 850_000, 1000)).toBe(1); // flow 10, seen 50 s before NOW
    expect(t.activeByReal[3]).toBe(1);
    expect(t.expire(NOW + 899_000, 1000)).toBe(1); // flow 9
    expect(t.size).toBe(0);
  });

  it('puts 2,000 random flows adopted into a table of 2,000 fresher ones in order: the sweep removes each when it is due', () => {
    const rand = mulberry32(23);
    const t = new FlowTable(5000, TIMEOUTS, MAX_REALS, 24);
    const states = [FlowState.syn, FlowState.established, FlowState.fin, FlowState.udp];
    // The table's own flows, seen within the last 5 s, inserted in time order as packets make them.
    const ownSeen = Array.from({ length: 2000 }, () => NOW - Math.floor(rand() * 5_000));
    const order = ownSeen.map((_, id) => id).sort((a, b) => ownSeen[a]! - ownSeen[b]!);
    for (const id of order) put(t, id, 1, states[id % 4]!, ownSeen[id]!);
    const n = 2000;
    const given = { count: n, keys: new Uint32Array(n * FLOW_KEY_WORDS), reals: new Int32Array(n).fill(2), states: new Uint8Array(n), idleMs: new Float64Array(n) };
    for (let i = 0; i < n; i++) {
      given.keys.set(keyOf(10_000 + i), i * FLOW_KEY_WORDS);
      given.states[i] = states[i % 4]!;
      given.idleMs[i] = Math.floor(rand() * 400_000);
    }
    adoptFlows(t, given, NOW, 60_000, MAX_REALS);
    expect(listsInSeenOrder(t)).toBe(true);
    // Each live entry's due time; the sweep alone (no packet) must remove exactly those due by each step.
    const due: number[] = [];
    for (let e = t.next(-1); e >= 0; e = t.next(e)) due.push(t.lastSeenOf(e) + t.timeoutOf(t.stateOf(e)));
    expect(due.length).toBe(t.size);
    expect(t.size).toBeGreaterThan(2000);
    for (let at = NOW; at <= NOW + 1_000_000; at += 7_000) {
      t.expire(at, 1e9);
      expect(t.size).toBe(due.filter((d) => d > at).length);
    }
    expect(t.size).toBe(0);
  });
});

describe('dedupeFlows', () => {
  it('keeps one row per key, the most recently active', () => {
    const b = {
      count: 4,
      keys: Uint32Array.from([...keyOf(1), ...keyOf(2), ...keyOf(1), ...keyOf(1)]),
      reals: Int32Array.from([1, 2, 3, 4]),
      states: Uint8Array.from([FlowState.syn, FlowState.udp, FlowState.established, FlowState.fin]),
      idleMs: Float64Array.from([500, 7, 20, 900]),
    };
    const d = dedupeFlows(b);
    expect(d.count).toBe(2);
    expect([...d.reals]).toEqual([3, 2]);
    expect([...d.states]).toEqual([FlowState.established, FlowState.udp]);
    expect([...d.idleMs]).toEqual([20, 7]);
    expect([...d.keys.subarray(0, FLOW_KEY_WORDS)]).toEqual([...keyOf(1)]);
    const single = { ...b, count: 1 };
    expect(dedupeFlows(single)).toBe(single);
  });
});

describe('collectRecords: the flows of a table whose loop has ended, from its shared records', () => {
  it('finds what collectFlows finds, after inserts, state changes, removals and expiry', () => {
    const rand = mulberry32(42);
    const t = new FlowTable(2_000, TIMEOUTS, MAX_REALS, 9);
    const states = [FlowState.syn, FlowState.established, FlowState.fin, FlowState.closed, FlowState.udp];
    for (let i = 0; i < 5_000; i++) {
      const id = Math.floor(rand() * 3_000);
      const now = 1_000_000 + i * 100;
      const e = find(t, id, now);
      if (e >= 0 && rand() < 0.3) t.remove(e);
      else if (e >= 0) t.touch(e, rand() < 0.5 ? 0x10 : 0x01, now);
      else put(t, id, Math.floor(rand() * MAX_REALS), states[Math.floor(rand() * states.length)]!, now - rand() * 400_000);
    }
    const now = 1_000_000 + 5_000 * 100;
    const rows = (b: FlowBatch) =>
      Array.from({ length: b.count }, (_, i) => `${[...b.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS)].join(',')} ${b.reals[i]} ${b.states[i]} ${b.idleMs[i]}`).sort();
    const fromRecords = collectRecords(t.records, TIMEOUTS, now);
    expect(fromRecords.count).toBeGreaterThan(500);
    expect(rows(fromRecords)).toEqual(rows(collectFlows(t, now, t.capacity)));
    // scanRecords (dsrlb flows): the same flows through a filter on the record's words, all counted, the first `limit` kept.
    const onReal7 = (rec: Int32Array, base: number) => rec[base + FLOW_RECORD.real] === 7;
    const all7 = rows(fromRecords).filter((r) => r.split(' ')[1] === '7');
    const scanned = scanRecords(t.records, TIMEOUTS, now, onReal7, 3);
    expect(all7.length).toBeGreaterThan(3);
    expect(scanned.matched).toBe(all7.length);
    expect(scanned.batch.count).toBe(3);
    for (const r of rows(scanned.batch)) expect(all7).toContain(r);
    expect(rows(scanRecords(t.records, TIMEOUTS, now, onReal7, Infinity).batch)).toEqual(all7);
    // With the closed entries (dsrlb flows, as ipvsadm -Lnc lists CLOSE): those within their close
    // timeout besides, which collectRecords leaves out.
    put(t, 4_000, 7, FlowState.closed, now - 1_000);
    put(t, 4_001, 7, FlowState.closed, now - TIMEOUTS.closeMs - 1);
    const withClosed = scanRecords(t.records, TIMEOUTS, now, null, Infinity, true).batch;
    const closed = rows(withClosed).filter((r) => r.split(' ')[2] === String(FlowState.closed));
    expect(closed).toEqual([`${[...keyOf(4_000)].join(',')} 7 ${FlowState.closed} 1000`]);
    expect(rows(withClosed).filter((r) => r.split(' ')[2] !== String(FlowState.closed))).toEqual(rows(fromRecords));
    expect(rows(collectRecords(t.records, TIMEOUTS, now))).toEqual(rows(fromRecords));
  });

  it('reads nothing from a new or cleared table', () => {
    const t = new FlowTable(100, TIMEOUTS, MAX_REALS, 10);
    expect(collectRecords(t.records, TIMEOUTS, 0).count).toBe(0);
    put(t, 1, 3, FlowState.established, 0);
    t.clear();
    expect(collectRecords(t.records, TIMEOUTS, 0).count).toBe(0);
  });
});

describe('concatFlows', () => {
  it('joins batches taken at different times, each idle time as of the latest', () => {
    const a = { count: 1, keys: keyOf(1), reals: Int32Array.from([1]), states: Uint8Array.from([FlowState.udp]), idleMs: Float64Array.from([100]) };
    const b = { count: 1, keys: keyOf(2), reals: Int32Array.from([2]), states: Uint8Array.from([FlowState.syn]), idleMs: Float64Array.from([7]) };
    const j = concatFlows([{ batch: a, atMs: 1_000 }, { batch: b, atMs: 1_500 }], 1_500);
    expect(j.count).toBe(2);
    expect([...j.reals]).toEqual([1, 2]);
    expect([...j.states]).toEqual([FlowState.udp, FlowState.syn]);
    expect([...j.idleMs]).toEqual([600, 7]);
    expect([...j.keys.subarray(FLOW_KEY_WORDS)]).toEqual([...keyOf(2)]);
  });
});

describe('flows file', () => {
  const flows: SavedFlows = {
    writtenAtMs: 1_764_000_000_000,
    count: 2,
    keys: Uint32Array.from([...keyOf(1), ...keyOf(0xffffff)]),
    realIndex: Int32Array.from([1, 0]),
    idleMs: Uint32Array.from([5, 4_000_000_000]),
    states: Uint8Array.from([FlowState.established, FlowState.udp]),
    reals: [
      { identity: 'tcp|203.0.113.10|80', address: '10.0.0.11' },
      { identity: 'udp|2001:db8::10|53', address: '2001:db8::11' },
    ],
  };

  it('reads back what it wrote', () => {
    const back = decodeSavedFlows(encodeSavedFlows(flows));
    expect({ ...back, keys: [...back.keys], realIndex: [...back.realIndex], idleMs: [...back.idleMs], states: [...back.states] }).toEqual({
      ...flows,
      keys: [...flows.keys],
      realIndex: [...flows.realIndex],
      idleMs: [...flows.idleMs],
      states: [...flows.states],
    });
  });

  it('refuses what is not such a file, saying why', () => {
    const good = encodeSavedFlows(flows);
    expect(() => decodeSavedFlows(Buffer.from('{"flows": []}'))).toThrow(/no DSRLBFLW mark/);
    const v3 = Buffer.from(good);
    v3.writeUInt32LE(3, 8);
    expect(() => decodeSavedFlows(v3)).toThrow(/it is version 3/);
    expect(() => decodeSavedFlows(good.subarray(0, good.length - 1))).toThrow(/bytes for 2 flows/);
    const wrongReal = encodeSavedFlows({ ...flows, realIndex: Int32Array.from([0, 2]) });
    expect(() => decodeSavedFlows(wrongReal)).toThrow(/flow 1 names real 2 of 2/);
    const nullHeader = Buffer.concat([Buffer.from('DSRLBFLW'), Buffer.from([1, 0, 0, 0, 4, 0, 0, 0]), Buffer.from('null')]);
    expect(() => decodeSavedFlows(nullHeader)).toThrow(/its header is not a JSON object/);
  });
});
