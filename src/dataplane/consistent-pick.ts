// The consistent-hash picks of a service: a new flow's (Maglev, rendezvous, wlc's stand-in) and a
// mid-stream packet's without a flow entry, which lands where it would on any LB with the same
// config that has seen the same reals up. Shared by the engine, plan and simulate.

import { SCHED_RENDEZVOUS, type ForwardingSnapshot } from './forwarding-snapshot.js';
import { rendezvousPick } from './rendezvous.js';

/**
 * Rendezvous for rendezvous services, the Maglev table otherwise (wlc too); -1 when the service drops.
 * `hash` is the flow hash as uint32 or as int32 (the packet path's): the same bits pick the same slot.
 */
export function consistentPick(snap: ForwardingSnapshot, svc: number, hash: number): number {
  return pickOver(snap, svc, hash, snap.svcDropAll, snap.svcCandStart, snap.svcCandCount, snap.svcTables);
}

/**
 * Where a mid-stream packet without a flow entry goes: as consistentPick, over the candidates and
 * the wanted reals not proven up or down yet (right after a start or a restart, until their
 * first probe, their connections are alive on them and other LBs still send there); -1 when none.
 */
export function midStreamPick(snap: ForwardingSnapshot, svc: number, hash: number): number {
  return pickOver(snap, svc, hash, snap.svcMidDropAll, snap.svcMidCandStart, snap.svcMidCandCount, snap.svcMidTables);
}

/** The pick over one of the snapshot's two sets of reals (its drop flags, candidate ranges and tables). */
function pickOver(
  snap: ForwardingSnapshot,
  svc: number,
  hash: number,
  dropAll: Uint8Array,
  candStart: Int32Array,
  candCount: Int32Array,
  tables: readonly Int32Array[],
): number {
  if (dropAll[svc] === 1) return -1;
  // Before any table: a rendezvous service has none (NO_TABLE, size 0) to index.
  if (snap.svcScheduler[svc] === SCHED_RENDEZVOUS) {
    return rendezvousPick(hash, snap.candIds, snap.candSeeds, snap.candWeights, candStart[svc]!, candCount[svc]!);
  }
  const table = tables[svc]!;
  return table[(hash >>> 0) % snap.svcTableSize[svc]!]!;
}
