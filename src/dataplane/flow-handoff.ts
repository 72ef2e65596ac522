// A loop's flows taken out (for plan, for the next daemon at a stop, for the loop that replaces one
// that ended) and put back: each flow's key, real, state and how long it has been idle. A daemon's
// flows live in its loops' memory; without this hand-over a restart (an upgrade) or a loop started
// again sent every flow to where the consistent hash puts it now, which breaks the connections of
// draining reals and of reals that changed.
// Off the packet path: a loop runs these between batches, on request; collectRecords runs on the
// control thread over the records of a loop that has ended.

import { FLOW_KEY_WORDS } from './flow-hash.js';
import { FLOW_RECORD, FlowState, isCanonicalKey, timeoutsByState, type FlowTable, type FlowTimeouts } from './flow-table.js';

/**
 * With several loops, how long the copies of a flow handed to every loop live without a packet: the
 * kernel's fanout hash (a per-boot secret) decides which loop sees a flow, so each is given all of
 * them, and the copies no packet touches go after this.
 */
export const HANDOFF_GRACE_MS = 60_000;

export interface FlowBatch {
  readonly count: number;
  /** count x FLOW_KEY_WORDS words. */
  readonly keys: Uint32Array;
  /** The real id of each flow (the daemon's ids of its own run). */
  readonly reals: Int32Array;
  /** FlowState of each flow. */
  readonly states: Uint8Array;
  /** Milliseconds since each flow's last packet. */
  readonly idleMs: Float64Array;
}

/** Up to `limit` live flows of `table` at `nowMs`: entries idle past their timeout or closed carry no connection. */
export function collectFlows(table: FlowTable, nowMs: number, limit: number): FlowBatch {
  const most = Math.min(limit, table.size);
  const keys = new Uint32Array(most * FLOW_KEY_WORDS);
  const reals = new Int32Array(most);
  const states = new Uint8Array(most);
  const idleMs = new Float64Array(most);
  const key = new Uint32Array(FLOW_KEY_WORDS);
  let count = 0;
  for (let e = table.next(-1); e >= 0 && count < most; e = table.next(e)) {
    if (table.isExpired(e, nowMs) || table.stateOf(e) === FlowState.closed) continue;
    table.readKey(e, key);
    keys.set(key, count * FLOW_KEY_WORDS);
    reals[count] = table.realOf(e);
    states[count] = table.stateOf(e);
    idleMs[count] = Math.max(0, nowMs - table.lastSeenOf(e));
    count++;
  }
  return { count, keys: keys.subarray(0, count * FLOW_KEY_WORDS), reals: reals.subarray(0, count), states: states.subarray(0, count), idleMs: idleMs.subarray(0, count) };
}

/**
 * The live flows in the records of a flow table whose loop has ended (FlowTable.records), read
 * from the records alone: a free record has state 0, and records past the ones ever used are zero.
 * A loop that crashed may have left one record half written: a state or real out of range is
 * left out here or by adoptFlows.
 */
export function collectRecords(records: SharedArrayBuffer, timeouts: FlowTimeouts, nowMs: number): FlowBatch {
  return scanRecords(records, timeouts, nowMs, null, Number.POSITIVE_INFINITY).batch;
}

/**
 * collectRecords of the live flows `keep` takes (given the records as int32 words and a record's
 * first word; null: every one): `matched` counts them all, the batch holds the first `limit`.
 * Each record's state and last-seen time are read once, so a flow freed meanwhile is either left
 * out or listed whole with the state it was read with. `withClosed`: also the entries a RST
 * closed, until their close timeout (dsrlb flows lists them as ipvsadm -Lnc does CLOSE, and the
 * flow counts of status include them); a hand-over leaves them out (no connection to keep).
 */
export function scanRecords(
  records: SharedArrayBuffer,
  timeouts: FlowTimeouts,
  nowMs: number,
  keep: ((rec: Int32Array, base: number) => boolean) | null,
  limit: number,
  withClosed = false,
): { batch: FlowBatch; matched: number } {
  const rec = new Int32Array(records);
  const seen = new Float64Array(records);
  const timeoutOf = timeoutsByState(timeouts);
  const n = Math.floor(rec.length / FLOW_RECORD.words);
  const live: number[] = [];
  const liveState: number[] = [];
  const liveIdle: number[] = [];
  let matched = 0;
  for (let e = 0; e < n; e++) {
    const base = e * FLOW_RECORD.words;
    const state = rec[base + FLOW_RECORD.state]!;
    if (state < FlowState.syn || state > FlowState.udp || (state === FlowState.closed && !withClosed)) continue;
    const idle = nowMs - seen[(base + FLOW_RECORD.seenWord) / 2]!;
    if (!(idle < timeoutOf[state]!)) continue;
    if (keep !== null && !keep(rec, base)) continue;
    matched++;
    if (live.length >= limit) continue;
    live.push(e);
    liveState.push(state);
    liveIdle.push(Math.max(0, idle));
  }
  const keys = new Uint32Array(live.length * FLOW_KEY_WORDS);
  const reals = new Int32Array(live.length);
  const states = new Uint8Array(live.length);
  const idleMs = new Float64Array(live.length);
  live.forEach((e, i) => {
    const base = e * FLOW_RECORD.words;
    keys.set(rec.subarray(base, base + FLOW_KEY_WORDS), i * FLOW_KEY_WORDS);
    reals[i] = rec[base + FLOW_RECORD.real]!;
    states[i] = liveState[i]!;
    idleMs[i] = liveIdle[i]!;
  });
  return { batch: { count: live.length, keys, reals, states, idleMs }, matched };
}

/** Batches taken at different times as one, as if all were taken at `atMs` (each flow's idle time grows by the difference). */
export function concatFlows(parts: readonly { batch: FlowBatch; atMs: number }[], atMs: number): FlowBatch {
  const count = parts.reduce((n, p) => n + p.batch.count, 0);
  const keys = new Uint32Array(count * FLOW_KEY_WORDS);
  const reals = new Int32Array(count);
  const states = new Uint8Array(count);
  const idleMs = new Float64Array(count);
  let n = 0;
  for (const { batch, atMs: at } of parts) {
    keys.set(batch.keys.subarray(0, batch.count * FLOW_KEY_WORDS), n * FLOW_KEY_WORDS);
    reals.set(batch.reals.subarray(0, batch.count), n);
    states.set(batch.states.subarray(0, batch.count), n);
    for (let i = 0; i < batch.count; i++) idleMs[n + i] = batch.idleMs[i]! + Math.max(0, atMs - at);
    n += batch.count;
  }
  return { count, keys, reals, states, idleMs };
}

/** `batch` with one row per flow key: the most recently active copy (the smallest idle time) of each. */
export function dedupeFlows(batch: FlowBatch): FlowBatch {
  const W = FLOW_KEY_WORDS;
  const keys = batch.keys;
  // Open addressing over the rows kept (linear probing, -1 empty): 1M rows in about 0.2 s, where
  // a Map of arrays took 1.3 s.
  let size = 1;
  while (size < 2 * batch.count) size *= 2;
  const slots = new Int32Array(size).fill(-1);
  const keep = new Int32Array(batch.count);
  let kept = 0;
  for (let i = 0; i < batch.count; i++) {
    let h = 0x811c9dc5;
    for (let w = 0; w < W; w++) h = Math.imul(h ^ keys[i * W + w]!, 0x01000193);
    h ^= h >>> 15;
    let b = h & (size - 1);
    for (;;) {
      const k = slots[b]!;
      if (k === -1) {
        slots[b] = kept;
        keep[kept++] = i;
        break;
      }
      const j = keep[k]!;
      let w = 0;
      while (w < W && keys[j * W + w] === keys[i * W + w]) w++;
      if (w === W) {
        if (batch.idleMs[i]! < batch.idleMs[j]!) keep[k] = i;
        break;
      }
      b = (b + 1) & (size - 1);
    }
  }
  if (kept === batch.count) return batch;
  const out: FlowBatch = { count: kept, keys: new Uint32Array(kept * W), reals: new Int32Array(kept), states: new Uint8Array(kept), idleMs: new Float64Array(kept) };
  for (let n = 0; n < kept; n++) {
    const i = keep[n]!;
    for (let w = 0; w < W; w++) out.keys[n * W + w] = keys[i * W + w]!;
    out.reals[n] = batch.reals[i]!;
    out.states[n] = batch.states[i]!;
    out.idleMs[n] = batch.idleMs[i]!;
  }
  return out;
}

/**
 * Puts `batch`'s flows into `table` as if their last packet had come `idleMs` before `nowMs`, so
 * they expire when they would have; with `graceMs`, no later than that from now unless a packet
 * comes (with several loops the kernel's fanout hash, which user space cannot compute, decides
 * which loop sees a flow, so every loop is given every flow and the copies no packet touches go
 * soon). Flows past their timeout, closed, with a real id or state out of range, or with an IPv4
 * key that is not canonical (isCanonicalKey) are left out;
 * of a flow the batch holds twice, its most recently active copy is taken.
 *
 * A flow the table holds already: on the same real, the table's entry stays when it is at least as
 * recent (a loop given its own flows back). On another real the batch's real wins (the table's
 * entry may have been placed anew by the consistent hash after the loop that knew the flow ended,
 * and the batch's copy says where the connection is), keeping the later of the two last-seen
 * times (within the grace), unless the batch's copy is itself an old grace copy (idle for at
 * least its timeout less the grace) and the entry more recent: that copy knows less.
 *
 * Adopting never evicts: when the table cannot hold every new flow, the longest idle are left
 * out. The adopted flows were last seen before the table's own (a running loop's) or were given
 * the later of two times: the table's last-seen lists are put back in order at the end, or a
 * sweep that stops at the first entry not yet due would never reach them (a grace copy behind a
 * fresher entry lived for the established timeout, counted active on its real). Returns the
 * batch's flows the table holds, on the batch's real, at the end.
 */
export function adoptFlows(table: FlowTable, given: FlowBatch, nowMs: number, graceMs: number | null, maxRealIds: number): number {
  const batch = dedupeFlows(given);
  // The rows to take, oldest first, and the last-seen time each would get.
  const lastSeen = new Float64Array(batch.count);
  const rows: number[] = [];
  for (let i = 0; i < batch.count; i++) {
    const state = batch.states[i]!;
    const real = batch.reals[i]!;
    if (state < FlowState.syn || state > FlowState.udp || state === FlowState.closed || real < 0 || real >= maxRealIds) continue;
    if (!isCanonicalKey(batch.keys, i * FLOW_KEY_WORDS)) continue; // no packet makes it (a damaged flows file)
    const timeout = table.timeoutOf(state);
    let seen = nowMs - batch.idleMs[i]!;
    if (graceMs !== null) seen = Math.min(seen, nowMs + graceMs - timeout);
    if (!(nowMs - seen < timeout)) continue;
    lastSeen[i] = seen;
    rows.push(i);
  }
  rows.sort((a, b) => batch.idleMs[b]! - batch.idleMs[a]!);
  const setKey = (i: number): number => {
    table.key.set(batch.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS));
    return table.indexHash();
  };
  // Room: rows whose key the table does not hold need a free entry; the oldest of them go without.
  const skip = new Uint8Array(batch.count);
  const fresh = rows.filter((i) => table.lookup(setKey(i), nowMs) < 0);
  for (let k = 0; k < fresh.length - (table.capacity - table.size); k++) skip[fresh[k]!] = 1;
  let held = 0;
  for (const i of rows) {
    if (skip[i] === 1) continue;
    const state = batch.states[i]!;
    const real = batch.reals[i]!;
    const timeout = table.timeoutOf(state);
    const observed = nowMs - batch.idleMs[i]!;
    let seen = lastSeen[i]!;
    const hash = setKey(i);
    const entry = table.lookup(hash, nowMs);
    if (entry >= 0) {
      const entrySeen = table.lastSeenOf(entry);
      if (table.realOf(entry) === real) {
        if (entrySeen >= observed) {
          held++;
          continue;
        }
      } else if (graceMs !== null && batch.idleMs[i]! >= timeout - graceMs && entrySeen > observed) {
        continue;
      }
      seen = Math.max(seen, entrySeen);
      if (graceMs !== null) seen = Math.min(seen, nowMs + graceMs - timeout);
      table.remove(entry);
    }
    table.insert(hash, real, state, seen);
    held++;
  }
  table.relinkInSeenOrder();
  return held;
}
