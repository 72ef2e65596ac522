// Stall detection compares each packet loop's heartbeat (written in its worker thread) with the
// control plane's clock. Both must be the process's monotonic clock: with the wall clock, a step
// of the system time (NTP, `date -s`) made every loop look stalled (VIPs withdrawn, healthz 503)
// or hid a real stall. No root: the loop group is given one loop's counters.

import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { LoopGroup } from '../../src/control/loop-group.js';
import { createLogger } from '../../src/control/logger.js';
import { Counter, createCounters } from '../../src/dataplane/counters.js';
import { monotonicMs, performanceNowToMonotonicMs } from '../../src/dataplane/monotonic-clock.js';

const distClock = new URL('../../dist/dataplane/monotonic-clock.js', import.meta.url).href;

/** The heartbeat a loop in a worker started now would write (npm test builds dist/ first). */
function heartbeatFromAWorker(): Promise<number> {
  const code = `
    const { parentPort } = require('node:worker_threads');
    const { performance } = require('node:perf_hooks');
    import(${JSON.stringify(distClock)}).then((m) => {
      const origin = m.performanceNowToMonotonicMs();
      setTimeout(() => parentPort.postMessage(origin + performance.now()), 50);
    });`;
  return new Promise((resolve, reject) => {
    const w = new Worker(code, { eval: true });
    w.once('message', (v: number) => {
      resolve(v);
      void w.terminate();
    });
    w.once('error', reject);
  });
}

function groupWithOneLoop(heartbeatMs: number): LoopGroup {
  const group = new LoopGroup(createLogger(() => undefined));
  const counters = createCounters();
  counters[Counter.loopHeartbeatMs] = heartbeatMs;
  (group as unknown as { loops: unknown[] }).loops = [{ counters, running: true, active: new Int32Array(1), inactive: new Int32Array(1) }];
  return group;
}

afterEach(() => vi.restoreAllMocks());

describe('loop heartbeat clock', () => {
  it('reads the same in a worker thread started later as in this thread', async () => {
    const before = monotonicMs();
    const beat = await heartbeatFromAWorker();
    const after = monotonicMs();
    // The worker's performance.now() counts from its own start; with the offset it is this clock.
    expect(beat).toBeGreaterThanOrEqual(before);
    expect(beat).toBeLessThanOrEqual(after);
    expect(Math.abs(performanceNowToMonotonicMs() + performance.now() - monotonicMs())).toBeLessThan(5);
  });

  it('does not see a stall when the wall clock steps forward or back', () => {
    const group = groupWithOneLoop(performanceNowToMonotonicMs() + performance.now());
    expect(group.heartbeatAgeMs()).toBeLessThan(1000);
    vi.spyOn(Date, 'now').mockReturnValue(Date.now() + 3_600_000);
    expect(group.heartbeatAgeMs()).toBeLessThan(1000);
    vi.spyOn(Date, 'now').mockReturnValue(Date.now() - 3_600_000);
    expect(group.heartbeatAgeMs()).toBeGreaterThanOrEqual(0);
    expect(group.heartbeatAgeMs()).toBeLessThan(1000);
  });

  it('sees a loop whose heartbeat stopped as stalled, by how long', () => {
    const group = groupWithOneLoop(monotonicMs() - 5000);
    expect(group.heartbeatAgeMs()).toBeGreaterThanOrEqual(5000);
    expect(group.heartbeatAgeMs()).toBeLessThan(6000);
    expect(group.counters()[Counter.loopHeartbeatMs]).toBeLessThan(monotonicMs() - 5000 + 1);
  });
});
