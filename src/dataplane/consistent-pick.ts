// The consistent-hash pick of a service: what a mid-stream packet without a flow entry gets, on
// this LB or any other with the same config. Shared by the engine, plan and simulate.

import { SCHED_RENDEZVOUS, type ForwardingSnapshot } from './forwarding-snapshot.js';
import { rendezvousPick } from './rendezvous.js';

/**
 * Rendezvous for rendezvous services, the Maglev table otherwise (wlc too); -1 when the service drops.
 * `hash` is the flow hash as uint32 or as int32 (the packet path's): the same bits pick the same slot.
 */
export function consistentPick(snap: ForwardingSnapshot, svc: number, hash: number): number {
  if (snap.svcDropAll[svc] === 1) return -1;
  if (snap.svcScheduler[svc] === SCHED_RENDEZVOUS) {
    return rendezvousPick(hash, snap.candIds, snap.candSeeds, snap.candWeights, snap.svcCandStart[svc]!, snap.svcCandCount[svc]!);
  }
  const table = snap.svcTables[svc]!;
  return table[(hash >>> 0) % snap.svcTableSize[svc]!]!;
}
