// explain and plan ask every packet loop and wait for all answers. A loop whose worker ended
// (crash, out of memory) never answers: the admin request that asked must not hang forever on it,
// and a loop that still runs but does not answer (stalled) must turn into an error, not a hang.
// No root: the loops are worker threads that speak the loop protocol without a socket.

import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { LoopGroup, type LoopBase } from '../../src/control/loop-group.js';
import { createLogger } from '../../src/control/logger.js';
import type { LoopEvent, LoopSettings } from '../../src/dataplane/loop-runner.js';

type Behaviour = 'answer' | 'exit' | 'silent';

/** A worker that says ready, then answers 'flows' with one flow, exits, or stays silent. */
const FAKE_LOOP = `
  const { parentPort, workerData } = require('node:worker_threads');
  // Shared, as a loop's per-real flow counts are: 5 active flows on real 0 in every loop.
  const active = new Int32Array(new SharedArrayBuffer(16));
  active[0] = 5;
  parentPort.postMessage({ type: 'ready', localMac: new Uint8Array(6), mtu: 1500, activeByReal: active, inactiveByReal: new Int32Array(new SharedArrayBuffer(16)) });
  parentPort.on('message', (m) => {
    if (m.type === 'stop') { parentPort.postMessage({ type: 'stopped' }); process.exit(0); }
    if (m.type !== 'flows') return;
    if (workerData.behaviour === 'exit') process.exit(3);
    if (workerData.behaviour === 'answer') parentPort.postMessage({ type: 'flows', id: m.id, keys: new Uint32Array(10), reals: Int32Array.of(workerData.real), count: 1 });
  });`;

class FakeLoops extends LoopGroup {
  private next = 0;
  readonly settings: LoopSettings[] = [];
  constructor(private readonly behaviours: Behaviour[]) {
    super(createLogger(() => undefined));
  }
  protected override createWorker(settings: LoopSettings): Worker {
    this.settings.push(settings);
    const i = this.next++;
    return new Worker(FAKE_LOOP, { eval: true, workerData: { behaviour: this.behaviours[i], real: i } });
  }
}

const base = { io: 'afpacket', ring: 'v3', interface: 'none', flowCapacity: 16, timeouts: {}, maxRealIds: 4 } as unknown as LoopBase;

async function group(behaviours: Behaviour[]): Promise<FakeLoops> {
  const g = new FakeLoops(behaviours);
  await g.start(base, behaviours.length);
  return g;
}

const realsOf = (events: LoopEvent[]): number[] => events.flatMap((e) => (e.type === 'flows' ? [...e.reals] : [])).sort();

describe('LoopGroup.onLost', () => {
  it('is told once for a loop that exits by itself after start, and never for loops told to stop', async () => {
    const g = await group(['exit', 'answer']);
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      await g.ask((id) => ({ type: 'flows', id, limit: 10 })).catch(() => undefined); // makes the first loop exit 3
      for (let i = 0; i < 50 && lost.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(lost).toEqual(['packet loop exited with code 3']);
      expect(g.running).toBe(false);
    } finally {
      await g.stop(1000);
    }
    expect(lost).toHaveLength(1);
  });
});

describe('LoopGroup.ask', () => {
  it('resolves with every loop answer', async () => {
    const g = await group(['answer', 'answer', 'answer']);
    try {
      expect(realsOf(await g.ask((id) => ({ type: 'flows', id, limit: 10 })))).toEqual([0, 1, 2]);
    } finally {
      await g.stop(1000);
    }
  });

  it('does not wait for a loop whose worker ended: the living loops answer (its flows ended with it)', async () => {
    const g = await group(['answer', 'exit', 'answer']);
    try {
      const started = Date.now();
      const answers = await g.ask((id) => ({ type: 'flows', id, limit: 10 }), 30_000);
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(realsOf(answers)).toEqual([0, 2]);
      expect(g.running).toBe(false);
      // Its flows ended with it: only the living loops' count.
      expect(g.active(0)).toBe(10);
      // The next question goes to the living loops only and is answered at once.
      expect(realsOf(await g.ask((id) => ({ type: 'flows', id, limit: 10 }), 30_000))).toEqual([0, 2]);
    } finally {
      await g.stop(1000);
    }
  });

  it('turns a loop that runs but does not answer into LOOP_UNANSWERED after the timeout', async () => {
    const g = await group(['answer', 'silent']);
    try {
      const started = Date.now();
      await expect(g.ask((id) => ({ type: 'flows', id, limit: 10 }), 300)).rejects.toMatchObject({
        code: 'LOOP_UNANSWERED',
        message: '1 of 2 packet loops did not answer within 0.3 s',
      });
      expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    } finally {
      await g.stop(1000);
    }
  });

  it('settles a question still open when the group stops', async () => {
    const g = await group(['silent']);
    const asked = g.ask((id) => ({ type: 'flows', id, limit: 10 }), 30_000);
    await g.stop(1000);
    expect(await asked).toEqual([]);
  });
});

describe('LoopGroup.start', () => {
  it('shares flowTable.capacity out over the loops (the memory bound is the daemon\'s) and reports the total', async () => {
    const g = new FakeLoops(['answer', 'answer', 'answer']);
    await g.start({ ...base, flowCapacity: 100 }, 3);
    try {
      expect(g.settings.map((s) => s.flowCapacity)).toEqual([34, 34, 34]);
      expect(g.flowCapacity).toBe(102);
    } finally {
      await g.stop(1000);
    }
  });
});
