// A loop's flows taken out (for plan, for the next daemon at a stop, for the loop that replaces one
// that ended) and put back: each flow's key, real, state and how long it has been idle. A daemon's
// flows live in its loops' memory; without this hand-over a restart (an upgrade) or a loop started
// again sent every flow to where the consistent hash puts it now, which breaks the connections of
// draining reals and of reals that changed.
// Off the packet path: a loop runs these between batches, on request; collectRecords runs on the
// control thread over the records of a loop that has ended.

import { FLOW_KEY_WORDS } from './flow-hash.js';
import { FLOW_RECORD, FlowState, timeoutsByState, type FlowTable, type FlowTimeouts } from './flow-table.js';

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
  const rec = new Int32Array(records);
  const seen = new Float64Array(records);
  const timeoutOf = timeoutsByState(timeouts);
  const n = Math.floor(rec.length / FLOW_RECORD.words);
  const live: number[] = [];
  for (let e = 0; e < n; e++) {
    const state = rec[e * FLOW_RECORD.words + FLOW_RECORD.state]!;
    if (state < FlowState.syn || state > FlowState.udp || state === FlowState.closed) continue;
    const idle = nowMs - seen[(e * FLOW_RECORD.words + FLOW_RECORD.seenWord) / 2]!;
    if (!(idle < timeoutOf[state]!)) continue;
    live.push(e);
  }
  const keys = new Uint32Array(live.length * FLOW_KEY_WORDS);
  const reals = new Int32Array(live.length);
  const states = new Uint8Array(live.length);
  const idleMs = new Float64Array(live.length);
  live.forEach((e, i) => {
    const base = e * FLOW_RECORD.words;
    keys.set(rec.subarray(base, base + FLOW_KEY_WORDS), i * FLOW_KEY_WORDS);
    reals[i] = rec[base + FLOW_RECORD.real]!;
    states[i] = rec[base + FLOW_RECORD.state]!;
    idleMs[i] = Math.max(0, nowMs - seen[(base + FLOW_RECORD.seenWord) / 2]!);
  });
  return { count: live.length, keys, reals, states, idleMs };
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

/**
 * Puts `batch`'s flows into `table` as if their last packet had come `idleMs` before `nowMs`, so
 * they expire when they would have; with `graceMs`, no later than that from now unless a packet
 * comes (with several loops the kernel's fanout hash, which user space cannot compute, decides
 * which loop sees a flow, so every loop is given every flow and the copies no packet touches go
 * soon). Flows past their timeout, closed, or with a real id or state out of range are left out.
 * A flow the batch holds twice (a restart within the grace: every loop handed over its copy)
 * keeps its most recent copy. A flow the table holds already keeps the batch's real: the table's
 * entry may have been placed anew after the loop that knew the flow ended (the packet found no
 * entry), the batch's copy says where the connection is. Only when both name the same real and
 * the table's entry is more recent, the entry stays as it is (a loop given its own flows back).
 * The batch goes in oldest first, so that the table's last-seen lists stay in order and, when
 * the table cannot hold them all, the longest idle make room for the newer ones; that is no
 * eviction of a live flow, and is not counted as one. Returns the batch's flows the table holds
 * at the end.
 */
export function adoptFlows(table: FlowTable, batch: FlowBatch, nowMs: number, graceMs: number | null, maxRealIds: number): number {
  const order = Array.from({ length: batch.count }, (_, i) => i).sort((a, b) => batch.idleMs[b]! - batch.idleMs[a]!);
  const evictionsBefore = table.evictions;
  // Entries this call put in or found, so that a flow the batch holds twice counts once.
  const ours = new Uint8Array(table.capacity);
  let held = 0;
  for (const i of order) {
    const state = batch.states[i]!;
    const real = batch.reals[i]!;
    if (state < FlowState.syn || state > FlowState.udp || state === FlowState.closed || real < 0 || real >= maxRealIds) continue;
    const timeout = table.timeoutOf(state);
    let lastSeen = nowMs - batch.idleMs[i]!;
    if (graceMs !== null) lastSeen = Math.min(lastSeen, nowMs + graceMs - timeout);
    if (nowMs - lastSeen >= timeout) continue;
    table.key.set(batch.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS));
    const hash = table.indexHash();
    const entry = table.lookup(hash, nowMs);
    if (entry >= 0) {
      if (ours[entry] === 0) held++;
      const entrySeen = table.lastSeenOf(entry);
      if (table.realOf(entry) === real && entrySeen > lastSeen) {
        ours[entry] = 1;
        continue;
      }
      lastSeen = Math.max(lastSeen, entrySeen);
      table.remove(entry);
    } else {
      held++;
    }
    ours[table.insert(hash, real, state, lastSeen)] = 1;
  }
  // A full table made room for the batch's newer flows: the older ones it dropped are not held.
  const dropped = table.evictions - evictionsBefore;
  table.evictions = evictionsBefore;
  return Math.max(0, held - dropped);
}
