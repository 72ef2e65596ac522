// A loop's flows taken out (for plan, and for the next daemon at a stop) and put back (at a start):
// each flow's key, real, state and how long it has been idle. A daemon's flows live in its loops'
// memory; without this hand-over a restart (an upgrade) sent every flow to where the consistent
// hash puts it now, which breaks the connections of draining reals and of reals that changed.
// Off the packet path: a loop runs these between batches, on request.

import { FLOW_KEY_WORDS } from './flow-hash.js';
import { FlowState, type FlowTable } from './flow-table.js';

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
 * Puts `batch`'s flows into `table` as if their last packet had come `idleMs` before `nowMs`, so
 * they expire when they would have; with `graceMs`, no later than that from now unless a packet
 * comes (with several loops the kernel's fanout hash, which user space cannot compute, decides
 * which loop sees a flow, so every loop is given every flow and the copies no packet touches go
 * soon). Flows past their timeout, closed, or with a real id or state out of range are left out.
 * A flow the batch holds twice (a restart within the grace: every loop handed over its copy)
 * keeps its most recent copy. The batch goes in oldest first, so that the table's last-seen lists
 * stay in order (the daemon hands flows over before the first snapshot: no packet has made an
 * entry yet) and, when the table cannot hold them all, the longest idle make room for the newer
 * ones; that is no eviction of a live flow, and is not counted as one. Returns the batch's flows
 * the table holds at the end.
 */
export function adoptFlows(table: FlowTable, batch: FlowBatch, nowMs: number, graceMs: number | null, maxRealIds: number): number {
  const order = Array.from({ length: batch.count }, (_, i) => i).sort((a, b) => batch.idleMs[b]! - batch.idleMs[a]!);
  const sizeBefore = table.size;
  const evictionsBefore = table.evictions;
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
    const older = table.lookup(hash, nowMs);
    if (older >= 0) table.remove(older); // an older copy (or a stale one, grace-clamped)
    table.insert(hash, real, state, lastSeen);
  }
  table.evictions = evictionsBefore;
  return table.size - sizeBefore;
}
