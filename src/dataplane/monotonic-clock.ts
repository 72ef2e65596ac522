// The one clock every thread of the process shares: CLOCK_MONOTONIC in milliseconds. A loop's
// heartbeat is compared with the control plane's "now" across threads, so neither side may use the
// wall clock (an NTP step or `date -s` would make every loop look stalled, or never stalled), and
// performance.now() alone will not do: it counts from each thread's own start.

import { performance } from 'node:perf_hooks';

/** CLOCK_MONOTONIC now, in ms (allocates a BigInt: for the control plane, not per packet). */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/**
 * What to add to this thread's performance.now() to read monotonicMs(): both count on the same
 * clock, performance.now() from this thread's start. Read once per thread; the hot path then
 * pays one performance.now() and one addition.
 */
export function performanceNowToMonotonicMs(): number {
  return monotonicMs() - performance.now();
}
