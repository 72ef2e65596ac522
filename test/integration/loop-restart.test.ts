// A packet loop whose worker ends by itself is started again in place: a real loop worker (the
// built one in dist/, as the daemon runs it) with an AF_PACKET socket on lo is terminated, and a
// new worker opens its socket again and runs the last snapshot from its first packet, its heartbeat
// fresh, with the group's counts carried over. Needs root (a packet socket); sends no traffic.

import type { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { requireRoot, sleep } from '../support/lab-daemon.js';

// From dist/: the group starts its workers from ../dataplane/loop-worker.js beside it (npm test builds dist/ first).
const { LoopGroup } = (await import(new URL('../../dist/control/loop-group.js', import.meta.url).href)) as typeof import('../../src/control/loop-group.js');
const { createLogger } = (await import(new URL('../../dist/control/logger.js', import.meta.url).href)) as typeof import('../../src/control/logger.js');
const { Counter, MAX_REAL_IDS } = (await import(new URL('../../dist/dataplane/counters.js', import.meta.url).href)) as typeof import('../../src/dataplane/counters.js');
const { emptySnapshot } = (await import(new URL('../../dist/dataplane/forwarding-snapshot.js', import.meta.url).href)) as typeof import('../../src/dataplane/forwarding-snapshot.js');
type LoopSettings = import('../../src/dataplane/loop-runner.js').LoopSettings;

class WatchedLoops extends LoopGroup {
  readonly workers: Worker[] = [];
  protected override createWorker(settings: LoopSettings): Worker {
    const w = super.createWorker(settings);
    this.workers.push(w);
    return w;
  }
}

describe('a packet loop worker that ends by itself', () => {
  it('is replaced by a new worker that opens its socket again and runs the last snapshot', async () => {
    requireRoot();
    const logged: string[] = [];
    const g = new WatchedLoops(createLogger((line: string) => void logged.push(line)));
    const lost: string[] = [];
    g.onLost = (reason: string) => void lost.push(reason);
    const timeouts = { synMs: 30_000, establishedMs: 300_000, finMs: 30_000, closeMs: 10_000, udpMs: 60_000 };
    await g.start({ io: 'afpacket', ring: 'v3', interface: 'lo', flowCapacity: 1024, timeouts, maxRealIds: MAX_REAL_IDS }, 1);
    try {
      g.broadcast({ type: 'snapshot', snapshot: { ...emptySnapshot(), generation: 7 } });
      for (let i = 0; i < 100 && g.counters()[Counter.snapshotGeneration] !== 7; i++) await sleep(20);
      expect(g.counters()[Counter.snapshotGeneration]).toBe(7);
      const rx = g.counters()[Counter.rxPackets]!;
      await g.workers[0]!.terminate();
      for (let i = 0; i < 250 && !(g.workers.length === 2 && g.running); i++) await sleep(20);
      expect(lost).toEqual([]);
      expect(g.workers).toHaveLength(2);
      expect(g.running).toBe(true);
      expect(g.restarts).toBe(1);
      const c = g.counters();
      // Set by the new loop's engine from the snapshot it was started with, not by a later message.
      expect(c[Counter.snapshotGeneration]).toBe(7);
      expect(c[Counter.loopRestarts]).toBe(1);
      expect(c[Counter.rxPackets]).toBeGreaterThanOrEqual(rx);
      expect(g.heartbeatAgeMs()).toBeLessThan(1000);
      expect(logged.join('\n')).toContain('starting the packet loop again');
    } finally {
      await g.stop(2000);
    }
    expect(lost).toEqual([]);
  });
});
