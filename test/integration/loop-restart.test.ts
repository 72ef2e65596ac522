// A packet loop whose worker ends by itself is started again in place: a real loop worker (the
// built one in dist/, as the daemon runs it) with an AF_PACKET socket on lo is terminated, and a
// new worker opens its socket again and runs the last snapshot from its first packet, its heartbeat
// fresh, with the group's counts carried over, and holds the flows of the worker it replaces (read
// from that table's shared records: a terminated worker cannot hand anything over). Needs root (a
// packet socket); sends no traffic.

import type { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { requireRoot, sleep } from '../support/lab-daemon.js';

// From dist/: the group starts its workers from ../dataplane/loop-worker.js beside it (npm test builds dist/ first).
const { LoopGroup } = (await import(new URL('../../dist/control/loop-group.js', import.meta.url).href)) as typeof import('../../src/control/loop-group.js');
const { createLogger } = (await import(new URL('../../dist/control/logger.js', import.meta.url).href)) as typeof import('../../src/control/logger.js');
const { Counter, MAX_REAL_IDS } = (await import(new URL('../../dist/dataplane/counters.js', import.meta.url).href)) as typeof import('../../src/dataplane/counters.js');
const { emptySnapshot } = (await import(new URL('../../dist/dataplane/forwarding-snapshot.js', import.meta.url).href)) as typeof import('../../src/dataplane/forwarding-snapshot.js');
const { FLOW_KEY_WORDS } = (await import(new URL('../../dist/dataplane/flow-hash.js', import.meta.url).href)) as typeof import('../../src/dataplane/flow-hash.js');
const { FlowState } = (await import(new URL('../../dist/dataplane/flow-table.js', import.meta.url).href)) as typeof import('../../src/dataplane/flow-table.js');
type LoopSettings = import('../../src/dataplane/loop-runner.js').LoopSettings;
type LoopEvent = import('../../src/dataplane/loop-runner.js').LoopEvent;
type FlowBatch = import('../../src/dataplane/flow-handoff.js').FlowBatch;

const TIMEOUTS = { synMs: 30_000, establishedMs: 300_000, finMs: 30_000, closeMs: 10_000, udpMs: 60_000 };

/** `n` TCP flows from 10.1.x.y to 203.0.113.10:80, flow i on real 1 + i % 7, established, idle i ms. */
function flowsOf(n: number): FlowBatch {
  const keys = new Uint32Array(n * FLOW_KEY_WORDS);
  for (let i = 0; i < n; i++) {
    keys[i * FLOW_KEY_WORDS] = 6 | (4 << 8);
    keys[i * FLOW_KEY_WORDS + 1] = (0x0a010000 | i) >>> 0;
    keys[i * FLOW_KEY_WORDS + 5] = 0xcb00710a;
    keys[i * FLOW_KEY_WORDS + 9] = ((30000 + i) << 16) | 80;
  }
  return {
    count: n,
    keys,
    reals: Int32Array.from({ length: n }, (_, i) => 1 + (i % 7)),
    states: new Uint8Array(n).fill(FlowState.established),
    idleMs: Float64Array.from({ length: n }, (_, i) => i),
  };
}

/** Each loop's flows as sorted "key words -> real/state" lines. */
function flowLines(answers: LoopEvent[]): string[][] {
  return answers.map((e) => {
    if (e.type !== 'flows') throw new Error(`not a flows answer: ${e.type}`);
    return Array.from({ length: e.count }, (_, i) => `${[...e.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS)].join(',')} -> ${e.reals[i]}/${e.states[i]}`).sort();
  });
}

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
    await g.start({ io: 'afpacket', ring: 'v3', interface: 'lo', flowCapacity: 1024, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS }, 1);
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

  // Each loop holds its own part of 500 flows; `ending` of them end at once (terminated: a crash).
  const cases = [
    { workers: 1, ending: 1 },
    { workers: 2, ending: 1 },
    { workers: 3, ending: 1 },
    { workers: 2, ending: 2 },
  ];
  for (const { workers, ending } of cases) {
    it(`every loop holds every flow after ${ending} of ${workers} loop${workers > 1 ? 's' : ''} ended`, async () => {
      requireRoot();
      const logged: string[] = [];
      const g = new WatchedLoops(createLogger((line: string) => void logged.push(line)));
      await g.start({ io: 'afpacket', ring: 'v3', interface: 'lo', flowCapacity: 4096, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS }, workers);
      try {
        const flows = flowsOf(500);
        const part = (from: number, to: number): FlowBatch => ({
          count: to - from,
          keys: flows.keys.subarray(from * FLOW_KEY_WORDS, to * FLOW_KEY_WORDS),
          reals: flows.reals.subarray(from, to),
          states: flows.states.subarray(from, to),
          idleMs: flows.idleMs.subarray(from, to),
        });
        // Straight to each worker (the group's ask would give every loop the same).
        const edges = Array.from({ length: workers + 1 }, (_, k) => Math.round((k * 500) / workers));
        g.workers.forEach((w, k) => w.postMessage({ type: 'adoptFlows', id: -1, flows: part(edges[k]!, edges[k + 1]!), graceMs: null }));
        let before: string[][] = [];
        for (let i = 0; i < 100 && before.flat().length < 500; i++) {
          await sleep(20);
          before = flowLines(await g.ask((id) => ({ type: 'flows', id, limit: 10_000 })));
        }
        expect(before.map((l) => l.length).sort()).toEqual(edges.slice(1).map((e, k) => e - edges[k]!).sort());
        await Promise.all(g.workers.slice(0, ending).map((w) => w.terminate()));
        for (let i = 0; i < 250 && !(g.workers.length === workers + ending && g.running); i++) await sleep(20);
        expect(g.running).toBe(true);
        expect(g.restarts).toBe(ending);
        await sleep(200); // the posts to loops already running, or started meanwhile
        const after = flowLines(await g.ask((id) => ({ type: 'flows', id, limit: 10_000 })));
        // One loop: the new one holds exactly the old one's flows, on their reals, in their states.
        // Several: every loop holds every flow (the kernel's fanout hash decides which loop sees one).
        const all = before.flat().sort();
        expect(all).toHaveLength(500);
        expect(after).toHaveLength(workers);
        for (const lines of after) expect(lines).toEqual(all);
        expect(logged.join('\n')).toContain('holds the flows of the loop it replaces');
      } finally {
        await g.stop(2000);
      }
    }, 30_000);
  }
});
