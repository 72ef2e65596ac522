// Data-plane counters: one Float64Array over a SharedArrayBuffer per packet loop. The loop only
// increments slots; the control plane reads them at scrape time (prom-client collect()).
// Float64 keeps counts exact up to 2^53 and aligned 8-byte stores are never torn on x86-64/arm64.

import { DROP_REASON_SLOTS } from './drop-reasons.js';

/** Real ids are small integers handed out by the control plane; counters have a slot block for each. */
export const MAX_REAL_IDS = 8192;

export const Counter = {
  rxPackets: 0,
  rxBytes: 1,
  passedPackets: 2, // not for a service: left to the kernel
  txPackets: 3,
  txBytes: 4,
  flowsRescheduled: 5, // existing flow moved because its real may no longer keep flows
  loopHeartbeatMs: 6, // last time the loop ran, on the process's monotonic clock (monotonic-clock.ts), for stall detection
  batches: 7,
  snapshotGeneration: 8,
  flowTableEntries: 9,
  flowTableEvictions: 10,
  flowTableExpirations: 11,
  icmpTooBigSent: 12, // ICMP fragmentation-needed / ICMPv6 packet-too-big sent to clients
  icmpEchoReplied: 13, // echo requests to a VIP answered by the LB
  gsoSegmented: 14, // GSO super-frames cut into segments in software (IPIP reals)
  extraFrames: 15, // frames made by the engine (ICMP errors, outer fragments, segments)
  rxKernelDrops: 16, // frames the kernel dropped before the loop read them (ring full)
  rxOtherHost: 17, // frames for another host's MAC, ignored
  loopBusySeconds: 18, // time spent handling wake-ups: reading the ring, the engine, sending
  loopEngineSeconds: 19, // of that, time in Engine.processBatch
  loopRestarts: 20, // loops started again after they ended by themselves: set by the control plane (LoopGroup) in its sum, never by a loop
  dropBase: 24, // dropBase + DropReason
} as const;

export const GLOBAL_SLOTS = Counter.dropBase + DROP_REASON_SLOTS;

/** Per real: slot = REAL_BASE + realId * REAL_STRIDE + RealCounter.x */
export const RealCounter = {
  forwardedPackets: 0,
  forwardedBytes: 1,
  flowsCreated: 2,
  flowsRescheduledAway: 3,
} as const;
export const REAL_STRIDE = 4;
export const REAL_BASE = GLOBAL_SLOTS;
export const COUNTER_SLOTS = REAL_BASE + MAX_REAL_IDS * REAL_STRIDE;

export function createCounters(): Float64Array {
  return new Float64Array(new SharedArrayBuffer(COUNTER_SLOTS * Float64Array.BYTES_PER_ELEMENT));
}
