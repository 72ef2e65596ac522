// explain and plan ask every packet loop and wait for all answers. A loop whose worker ended
// (crash, out of memory) never answers: the admin request that asked must not hang forever on it,
// and a loop that still runs but does not answer (stalled) must turn into an error, not a hang.
// A loop that ends by itself is started again in its place (a few times a minute at most).
// No root: the loops are worker threads that speak the loop protocol without a socket.

import { fstatSync, mkdtempSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { LoopGroup, type LoopBase } from '../../src/control/loop-group.js';
import { createLogger } from '../../src/control/logger.js';
import { Counter } from '../../src/dataplane/counters.js';
import { HANDOFF_GRACE_MS } from '../../src/dataplane/flow-handoff.js';
import type { FlowTimeouts } from '../../src/dataplane/flow-table.js';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import type { LoopEvent, LoopSettings } from '../../src/dataplane/loop-runner.js';

/**
 * slow-ready: says ready after 300 ms, then answers; never-ready: stays silent from the start;
 * enodev-on-kept: fails to open when given a kept socket, else answers; exit-unkept: exits as 'exit',
 * and reports no socket for the group to keep (ring v2). Loops beyond the list answer.
 */
type Behaviour = 'answer' | 'exit' | 'silent' | 'slow-ready' | 'never-ready' | 'fail' | 'enodev-on-kept' | 'exit-unkept';

/** A worker that says ready, then answers 'flows' with one flow, exits, or stays silent. */
const FAKE_LOOP = `
  const { parentPort, workerData } = require('node:worker_threads');
  // Shared, as a loop's per-real flow counts are: 5 active flows on real 0 in every loop.
  const active = new Int32Array(new SharedArrayBuffer(16));
  active[0] = 5;
  // The fanout group its socket is in: one made under the id the test picked, or the one it joined.
  const fanoutGroupId = workerData.fanout.mode === 'make' ? workerData.madeGroupId : workerData.fanout.mode === 'join' ? workerData.fanout.groupId : null;
  // Its flow table's records (flow-table.ts FLOW_RECORD): two slots, one flow on real \`real\`,
  // established, last seen now (CLOCK_MONOTONIC ms, the process's clock).
  const flowRecords = new SharedArrayBuffer(2 * 64);
  const words = new Int32Array(flowRecords);
  words[0] = 6 | (4 << 8);
  words[1] = 0x0a000000 + workerData.real;
  words[10] = workerData.real;
  words[11] = 2;
  new Float64Array(flowRecords)[6] = Number(process.hrtime.bigint()) / 1e6;
  // A descriptor for the group to keep, as a ring socket's (keepSocket): a file the test names;
  // none for a socket taken over (the group holds that one's already).
  const keptSocket = workerData.keepFile && workerData.keptSocket == null && workerData.behaviour !== 'exit-unkept' ? require('node:fs').openSync(workerData.keepFile, 'r') : null;
  // As a takeover whose socket lost its interface (the kernel unbound it): the open fails.
  const failed = workerData.behaviour === 'enodev-on-kept' && workerData.keptSocket != null;
  if (failed) parentPort.postMessage({ type: 'error', code: 'ENODEV', message: 'opening afpacket on none: getsockname(AF_PACKET) on none: No such device (ENODEV)' });
  const ready = () => parentPort.postMessage({ type: 'ready', localMac: new Uint8Array(6), mtu: 1500, activeByReal: active, inactiveByReal: new Int32Array(new SharedArrayBuffer(16)), flowRecords, adoptedFlows: 0, fanoutGroupId, keptSocket });
  if (failed) {
    // Ended by the group.
  } else if (workerData.behaviour === 'slow-ready') setTimeout(ready, 300);
  else if (workerData.behaviour !== 'never-ready') ready();
  // Like the engine: the snapshot it runs, in its counters (slot 8, snapshotGeneration).
  if (workerData.snapshot) workerData.counters[8] = workerData.snapshot.generation;
  parentPort.on('message', (m) => {
    if (m.type === 'stop') { parentPort.postMessage({ type: 'stopped' }); process.exit(0); }
    if (m.type === 'snapshot') workerData.counters[8] = m.snapshot.generation;
    if (m.type === 'adoptFlows') {
      Atomics.add(workerData.adoptPosts, 0, 1);
      // Which loops' flows it was given (a flow of loop i has source 10.0.0.i).
      for (let i = 0; i < m.flows.count; i++) Atomics.or(workerData.adoptPosts, 1, 1 << (m.flows.keys[i * 10 + 1] - 0x0a000000));
    }
    if (m.type !== 'flows') return;
    if (workerData.behaviour === 'exit' || workerData.behaviour === 'exit-unkept') process.exit(3);
    // As a loop whose interface went: an error while it runs, its worker left to the group.
    if (workerData.behaviour === 'fail') { parentPort.postMessage({ type: 'error', code: 'EINTERFACE', message: 'eth0 is gone (ENODEV)' }); return; }
    if (workerData.behaviour !== 'silent') parentPort.postMessage({ type: 'flows', id: m.id, keys: new Uint32Array(10), reals: Int32Array.of(workerData.real), states: Uint8Array.of(2), idleMs: Float64Array.of(0), count: 1 });
  });`;

class FakeLoops extends LoopGroup {
  private next = 0;
  /** The id the kernel would give the next fanout group a loop makes. */
  nextGroupId = 100;
  readonly settings: LoopSettings[] = [];
  /** What each loop was given to adopt at its start (its settings let go of it once it is ready). */
  readonly adopts: LoopSettings['adopt'][] = [];
  readonly workers: Worker[] = [];
  /** adoptFlows messages each loop got after its start. */
  readonly adoptPosts: Int32Array[] = [];
  /** A file each loop opens and reports as its kept socket ('ready' keptSocket); null: none. */
  keepFile: string | null = null;
  constructor(
    private readonly behaviours: Behaviour[],
    opts: ConstructorParameters<typeof LoopGroup>[1] = {},
    readonly logged: string[] = [],
  ) {
    super(
      createLogger((line: string) => void logged.push(line)),
      opts,
    );
  }
  protected override createWorker(settings: LoopSettings): Worker {
    this.settings.push(settings);
    this.adopts.push(settings.adopt ?? null);
    const i = this.next++;
    const madeGroupId = settings.fanout.mode === 'make' ? this.nextGroupId++ : null;
    // [0] adoptFlows messages, [1] a bit per loop whose flows they held.
    const adoptPosts = new Int32Array(new SharedArrayBuffer(8));
    this.adoptPosts.push(adoptPosts);
    // trackUnmanagedFds off: Node closes what a worker opened with fs at its exit, which a ring socket's
    // descriptor (made by the addon) is not.
    const w = new Worker(FAKE_LOOP, { eval: true, trackUnmanagedFds: false, workerData: { behaviour: this.behaviours[i] ?? 'answer', real: i, counters: settings.counters, snapshot: settings.snapshot, fanout: settings.fanout, madeGroupId, keepFile: this.keepFile, keptSocket: settings.keptSocket ?? null, adoptPosts } });
    this.workers.push(w);
    return w;
  }
}

const TIMEOUTS: FlowTimeouts = { synMs: 30_000, establishedMs: 300_000, finMs: 30_000, closeMs: 10_000, udpMs: 60_000 };
const base = { io: 'afpacket', ring: 'v3', interface: 'none', flowCapacity: 16, timeouts: TIMEOUTS, maxRealIds: 4 } as unknown as LoopBase;

async function group(behaviours: Behaviour[], opts: ConstructorParameters<typeof LoopGroup>[1] = {}): Promise<FakeLoops> {
  const g = new FakeLoops(behaviours, opts);
  await g.start(base, behaviours.length);
  return g;
}

/** One loop; behaviours[1..] are the loops that replace it, in turn. */
async function oneLoop(behaviours: Behaviour[], opts: ConstructorParameters<typeof LoopGroup>[1] = {}): Promise<FakeLoops> {
  const g = new FakeLoops(behaviours, opts);
  await g.start(base, 1);
  return g;
}

async function until(what: string, cond: () => boolean): Promise<void> {
  for (let i = 0; i < 150 && !cond(); i++) await new Promise((r) => setTimeout(r, 20));
  if (!cond()) throw new Error(`timed out waiting for ${what}`);
}

/** Makes every loop whose behaviour is 'exit' end (it exits on a 'flows' question). */
const askFlows = (g: LoopGroup): Promise<unknown> => g.ask((id) => ({ type: 'flows', id, limit: 10 })).catch(() => undefined);

const realsOf = (events: LoopEvent[]): number[] => events.flatMap((e) => (e.type === 'flows' ? [...e.reals] : [])).sort();

describe('a packet loop that ends by itself', () => {
  it('is started again in its place, with the last snapshot and timeouts, and its counts kept', async () => {
    const g = await group(['exit', 'answer']);
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      const snapshot = { generation: 7 } as unknown as ForwardingSnapshot;
      const timeouts = { tcpEstablishedMs: 1234 } as unknown as FlowTimeouts;
      g.broadcast({ type: 'snapshot', snapshot });
      g.broadcast({ type: 'timeouts', timeouts });
      const [first, second] = g.settings;
      first!.counters[Counter.rxPackets] = 100;
      first!.counters[Counter.flowTableEntries] = 50;
      second!.counters[Counter.rxPackets] = 1;
      second!.counters[Counter.flowTableEntries] = 20;
      await askFlows(g);
      await until('the loop started again', () => g.settings.length === 3 && g.running);
      expect(lost).toEqual([]);
      expect(g.size).toBe(2);
      const again = g.settings[2]!;
      expect(again.snapshot).toEqual(snapshot);
      expect(again.timeouts).toEqual(timeouts);
      // The same share of the flow table, in the same fanout group, with counters of its own.
      expect([again.flowCapacity, again.fanout, again.interface]).toEqual([first!.flowCapacity, { mode: 'join', groupId: 100 }, first!.interface]);
      expect(first!.fanout).toEqual({ mode: 'make' });
      expect(again.counters).not.toBe(first!.counters);
      // The timeouts broadcast are not real ones: no flows carried, a warning, the loop started all the same.
      expect(g.adopts[2]).toBeNull();
      expect(g.logged.join('\n')).toContain('the flows of the ended packet loop are not carried');
      again.counters[Counter.rxPackets] = 3;
      const c = g.counters();
      // Counts never go down (Prometheus counters); the ended loop's flow entries are gone.
      expect(c[Counter.rxPackets]).toBe(104);
      expect(c[Counter.flowTableEntries]).toBe(20);
      expect(c[Counter.loopRestarts]).toBe(1);
      expect(g.restarts).toBe(1);
      // The new loop answers questions.
      expect(realsOf((await g.ask((id) => ({ type: 'flows', id, limit: 10 }))) as LoopEvent[])).toEqual([1, 2]);
    } finally {
      await g.stop(1000);
    }
  });

  it('is started again with the ended loop\'s flows, read from its records, and the other loop\'s, for a grace', async () => {
    const g = await group(['exit', 'answer']);
    try {
      await askFlows(g);
      await until('the loop started again', () => g.settings.length === 3 && g.running);
      const adopt = g.adopts[2]!;
      expect([...adopt.flows.reals].sort()).toEqual([0, 1]);
      expect(adopt.graceMs).toBe(HANDOFF_GRACE_MS);
      // Without a kept socket the kernel spreads the flows anew: the living loop is given the ended one's.
      await until('the living loop given the flows', () => g.adoptPosts[1]![0] === 1);
      expect(g.settings[2]!.adopt ?? null).toBeNull(); // let go of once it was ready
    } finally {
      await g.stop(1000);
    }
  });

  it('one loop: started again with exactly the ended loop\'s flows, no grace', async () => {
    const g = await oneLoop(['exit', 'answer']);
    try {
      await askFlows(g);
      await until('the loop started again', () => g.settings.length === 2 && g.running);
      expect([...g.adopts[1]!.flows.reals]).toEqual([0]);
      expect(g.adopts[1]!.graceMs).toBeNull();
    } finally {
      await g.stop(1000);
    }
  });

  it('one that reports an error while it runs (its interface gone) is ended and started again, and onRestarted is told the interface changed', async () => {
    const g = await oneLoop(['fail', 'answer']);
    const restarted: boolean[] = [];
    g.onRestarted = (e) => void restarted.push(e.interfaceChanged);
    try {
      void askFlows(g);
      await until('the new loop', () => g.restarts === 1 && g.running);
      await until('onRestarted', () => restarted.length === 1);
      expect(restarted).toEqual([true]);
      expect(g.settings).toHaveLength(2);
      expect(realsOf((await g.ask((id) => ({ type: 'flows', id, limit: 10 }))) as LoopEvent[])).toEqual([1]);
    } finally {
      await g.stop(1000);
    }
  });

  it('4 loops that lose their interface together count once against the restart budget (it was spent, and the daemon stopped)', async () => {
    const g = await group(['fail', 'fail', 'fail', 'fail']);
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      void askFlows(g);
      await until('4 new loops', () => g.restarts === 4 && g.running && g.size === 4);
      expect(lost).toEqual([]);
      // Two more ordinary losses fit the budget of 3 a minute: the interface counted once.
      expect((g as unknown as { restartTimes: number[] }).restartTimes).toHaveLength(1);
    } finally {
      await g.stop(1000);
    }
  });

  it("a single loop's counts carry over too, and the group runs only once the new loop is ready", async () => {
    const g = await oneLoop(['exit', 'slow-ready']);
    g.settings[0]!.counters[Counter.txPackets] = 42;
    try {
      expect(g.running).toBe(true);
      void askFlows(g);
      await until('the loss', () => g.restarts === 1);
      expect(g.running).toBe(false);
      expect(g.counters()[Counter.txPackets]).toBe(42);
      await until('the new loop', () => g.running);
      expect(g.counters()[Counter.txPackets]).toBe(42);
    } finally {
      await g.stop(1000);
    }
  });

  it("keeps counting the ended loop's flows per real until its replacement runs (at 0, a draining real was forgotten and a drain reported finished)", async () => {
    const g = await oneLoop(['exit', 'slow-ready']);
    try {
      expect(g.active(0)).toBe(5);
      void askFlows(g);
      await until('the loss', () => g.restarts === 1);
      expect(g.running).toBe(false);
      expect(g.recovering).toBe(true);
      // The replacement is not ready for 300 ms: the ended loop's 5 flows still count.
      expect(g.active(0)).toBe(5);
      await until('the new loop', () => g.running);
      expect(g.active(0)).toBe(5);
    } finally {
      await g.stop(1000);
    }
  });

  it('is handed to onLost once a loop ended more than 3 times within a minute; older losses do not count', async () => {
    let now = 1_000_000;
    const g = await oneLoop(['exit', 'exit', 'exit', 'exit', 'exit'], { now: () => now });
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      for (let n = 1; n <= 3; n++) {
        await askFlows(g);
        await until(`restart ${n}`, () => g.restarts === n && g.running);
        now += 10_000;
      }
      expect(lost).toEqual([]);
      // 60 s after the first loss it no longer counts: a fourth is started again.
      now += 30_001;
      await askFlows(g);
      await until('restart 4', () => g.restarts === 4 && g.running);
      expect(lost).toEqual([]);
      // Losses at 10, 20 and 60 s: one more before 70 s is the fourth within a minute.
      await askFlows(g);
      await until('onLost', () => lost.length > 0);
      expect(lost).toEqual(['packet loop exited with code 3']);
      expect(g.restarts).toBe(4);
      expect(g.running).toBe(false);
    } finally {
      await g.stop(1000);
    }
    expect(lost).toHaveLength(1);
  });

  it('gets the snapshot broadcast while it was starting (it was not in the group yet)', async () => {
    const g = await oneLoop(['exit', 'slow-ready']);
    try {
      g.broadcast({ type: 'snapshot', snapshot: { generation: 1 } as unknown as ForwardingSnapshot });
      void askFlows(g);
      await until('the loss', () => g.restarts === 1);
      g.broadcast({ type: 'snapshot', snapshot: { generation: 2 } as unknown as ForwardingSnapshot });
      await until('the new loop', () => g.running);
      expect((g.settings[1]!.snapshot as unknown as { generation: number }).generation).toBe(1);
      await until('generation 2 in the new loop', () => g.counters()[Counter.snapshotGeneration] === 2);
    } finally {
      await g.stop(1000);
    }
  });

  it('is given up on (onLost) when its replacement is not ready in time, and no longer counts as recovering', async () => {
    const g = await oneLoop(['exit', 'never-ready'], { restartReadyMs: 300 });
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      void askFlows(g);
      await until('the loss', () => g.restarts === 1);
      expect(g.recovering).toBe(true);
      await until('onLost', () => lost.length > 0);
      expect(lost).toEqual(['packet loop exited with code 3; starting it again failed: not ready within 0.3 s']);
      expect(g.recovering).toBe(false);
      expect(g.running).toBe(false);
      await until('the hung replacement ended', () => g.workers[1]!.threadId === -1);
    } finally {
      await g.stop(1000);
    }
  });

  it('keeps the flows of a loop lost for good (given up, or its replacement failed) for the flows file of the stop that follows', async () => {
    // Given up at once (no restarts allowed): the ended loop's one flow (on real 0) is an orphan.
    const g = await oneLoop(['exit'], { restartsPerWindow: 0 });
    g.onLost = () => undefined;
    try {
      expect(g.orphanFlows()).toBeNull();
      void askFlows(g);
      await until('the loss', () => g.size === 0);
      const kept = g.orphanFlows()!;
      expect(kept.count).toBe(1);
      expect([...kept.reals]).toEqual([0]);
    } finally {
      await g.stop(1000);
    }
    // Its replacement never ready: the flows it was to take are kept too.
    const h = await oneLoop(['exit', 'never-ready'], { restartReadyMs: 300 });
    h.onLost = () => undefined;
    try {
      void askFlows(h);
      await until('the failed replacement', () => !h.recovering && h.restarts === 1);
      expect(h.orphanFlows()?.count).toBe(1);
    } finally {
      await h.stop(1000);
    }
  });

  it('is not started again after stop, and one that becomes ready after stop is stopped', async () => {
    const g = await oneLoop(['exit', 'slow-ready']);
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    void askFlows(g);
    await until('the loss', () => g.restarts === 1);
    await g.stop(1000);
    const replacement = g.workers[1]!;
    const ended = await Promise.race([new Promise((r) => replacement.once('exit', () => r(true))), new Promise((r) => setTimeout(() => r(false), 3000))]);
    expect(ended).toBe(true);
    expect(g.size).toBe(0);
    expect(lost).toEqual([]);
  });

  it.each([
    ['fails to start', 'error', 'opening afpacket on none: no such device'],
    ['exits before it is ready (the start fails, it does not hang)', 'exit', 'packet loop exited with code 5 before it was ready'],
  ] as const)('is handed to onLost when its replacement %s', async (_name, failure, why) => {
    const g = new FailingRestart(['exit']);
    await g.start(base, 1);
    expect(g.size).toBe(1);
    const lost: string[] = [];
    g.onLost = (reason) => void lost.push(reason);
    try {
      g.failNext = failure;
      await askFlows(g);
      await until('onLost', () => lost.length > 0);
      expect(lost).toEqual([`packet loop exited with code 3; starting it again failed: ${why}`]);
      expect(g.running).toBe(false);
      expect(g.recovering).toBe(false);
    } finally {
      await g.stop(1000);
    }
  });
});

/** A group whose next loop reports a start error, as a loop that cannot open its socket does, or exits before it is ready. */
class FailingRestart extends FakeLoops {
  failNext: false | 'error' | 'exit' = false;
  protected override createWorker(settings: LoopSettings): Worker {
    if (!this.failNext) return super.createWorker(settings);
    if (this.failNext === 'exit') return new Worker(`process.exit(5)`, { eval: true });
    return new Worker(
      `require('node:worker_threads').parentPort.postMessage({ type: 'error', code: 'ENODEV', message: 'opening afpacket on none: no such device' }); setTimeout(() => {}, 60000);`,
      { eval: true },
    );
  }
}

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
    // Not started again here, so that the count after the loss is the living loops'.
    const g = await group(['answer', 'exit', 'answer'], { restartsPerWindow: 0 });
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

describe("the packet loops' fanout group", () => {
  it('is made by the first loop, under the id the kernel picks; the others open their sockets to join it once it is ready', async () => {
    const g = new FakeLoops(['slow-ready', 'answer', 'answer']);
    const started = g.start(base, 3);
    try {
      await new Promise((r) => setTimeout(r, 150));
      // The first loop is not ready yet: no other loop has been started with a group to join.
      expect(g.settings.map((s) => s.fanout)).toEqual([{ mode: 'make' }]);
      expect(g.fanoutGroupId).toBeNull();
      await started;
      expect(g.settings.map((s) => s.fanout)).toEqual([{ mode: 'make' }, { mode: 'join', groupId: 100 }, { mode: 'join', groupId: 100 }]);
      expect(g.fanoutGroupId).toBe(100);
    } finally {
      await started.catch(() => undefined);
      await g.stop(1000);
    }
  });

  it('is not made for a single loop', async () => {
    const g = await oneLoop(['answer']);
    try {
      expect(g.settings[0]!.fanout).toEqual({ mode: 'none' });
      expect(g.fanoutGroupId).toBeNull();
    } finally {
      await g.stop(1000);
    }
  });

  it('is made again when every loop lost its interface: the first loop started again makes a new group, the others join that', async () => {
    const g = await group(['fail', 'fail', 'fail']);
    try {
      expect(g.fanoutGroupId).toBe(100);
      void askFlows(g);
      await until('3 new loops', () => g.restarts === 3 && g.running && g.size === 3);
      expect(g.settings.slice(3).map((s) => s.fanout)).toEqual([{ mode: 'make' }, { mode: 'join', groupId: 101 }, { mode: 'join', groupId: 101 }]);
      expect(g.fanoutGroupId).toBe(101);
    } finally {
      await g.stop(1000);
    }
  });

  it('fails the start with the error of the loop that was to make it, and the other loops never open a socket', async () => {
    const g = new FailingRestart([]);
    g.failNext = 'error';
    await expect(g.start(base, 3)).rejects.toMatchObject({ code: 'ENODEV', message: 'opening afpacket on none: no such device' });
    try {
      await new Promise((r) => setTimeout(r, 300));
      // Only the failing worker was made (FailingRestart does not record it).
      expect(g.settings).toEqual([]);
      expect(g.fanoutGroupId).toBeNull();
    } finally {
      await g.stop(1000);
    }
  });
});

describe("a loop's socket kept by the group (LoopEvent 'ready' keptSocket)", () => {
  /** Whether `fd` still is the descriptor of `file` (a closed number may be reused by another file). */
  const holds = (fd: number, file: string): boolean => {
    try {
      return fstatSync(fd).ino === statSync(file).ino;
    } catch {
      return false;
    }
  };
  const withFile = async (body: (file: string) => Promise<void>): Promise<void> => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-kept-'));
    const file = join(dir, 'socket');
    writeFileSync(file, '');
    try {
      await body(file);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };

  it('is taken over by the loop that replaces a crashed one: the same fanout place, its own flows exactly, the other loops untouched', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['exit', 'answer']);
      g.keepFile = file;
      await g.start(base, 2);
      try {
        await askFlows(g);
        await until('the loop started again', () => g.settings.length === 3 && g.running);
        const again = g.settings[2]!;
        expect(again.fanout).toEqual({ mode: 'kept', groupId: 100 });
        expect(again.keptSocket).toEqual(expect.any(Number));
        // The group's descriptor of the ended loop's socket, now the new loop's.
        expect(holds(again.keptSocket!, file)).toBe(true);
        expect([...g.adopts[2]!.flows.reals]).toEqual([0]);
        expect(g.adopts[2]!.graceMs).toBeNull();
        await new Promise((r) => setTimeout(r, 200));
        expect(g.adoptPosts[1]![0]).toBe(0);
        expect(g.logged.join('\n')).toContain('"socketKept":true');
      } finally {
        await g.stop(1000);
      }
    });
  });

  it('one loop: taken over too, no fanout group', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['exit', 'answer']);
      g.keepFile = file;
      const restarted: boolean[] = [];
      g.onRestarted = (e) => void restarted.push(e.interfaceChanged);
      await g.start(base, 1);
      try {
        await askFlows(g);
        await until('the loop started again', () => g.settings.length === 2 && g.running);
        // A crash: the same interface, nothing for the daemon to announce.
        await until('onRestarted', () => restarted.length === 1);
        expect(restarted).toEqual([false]);
        expect(g.settings[1]!.fanout).toEqual({ mode: 'none' });
        expect(holds(g.settings[1]!.keptSocket!, file)).toBe(true);
        expect([...g.adopts[1]!.flows.reals]).toEqual([0]);
      } finally {
        await g.stop(1000);
      }
    });
  });

  it('is closed, not handed on, when the loop ended because its interface went: the new loops make a new group', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['fail', 'fail']);
      g.keepFile = file;
      await g.start(base, 2);
      try {
        void askFlows(g);
        await until('2 new loops', () => g.restarts === 2 && g.running && g.size === 2);
        expect(g.settings.slice(2).map((s) => s.keptSocket ?? null)).toEqual([null, null]);
        expect(g.settings.slice(2).map((s) => s.fanout)).toEqual([{ mode: 'make' }, { mode: 'join', groupId: 101 }]);
        // Each ended loop's descriptor was closed: only the two new loops' are open.
        expect(countOpen(file)).toBe(2);
      } finally {
        await g.stop(1000);
      }
      expect(countOpen(file)).toBe(0);
    });
  });

  /** The loops (by start order) whose flows `adopt` holds (a flow of loop i has source 10.0.0.i). */
  const loopsIn = (adopt: LoopSettings['adopt']): number[] =>
    adopt ? [...new Set(Array.from({ length: adopt.flows.count }, (_, k) => adopt.flows.keys[k * 10 + 1]! - 0x0a000000))].sort() : [];
  const postedLoops = (bits: number): number[] => Array.from({ length: 31 }, (_, k) => k).filter((k) => (bits & (1 << k)) !== 0);

  it('a loss without takeover while a takeover starts: each new loop gets the other\'s flows, the living one both', async () => {
    await withFile(async (file) => {
      // Loop 0 crashes (takeover) and loop 1 crashes with no socket kept (ring v2), in either order;
      // the first replacement is slow.
      const g = new FakeLoops(['exit', 'exit-unkept', 'answer', 'slow-ready', 'answer']);
      g.keepFile = file;
      await g.start(base, 3);
      try {
        void askFlows(g);
        await until('both started again', () => g.settings.length === 5 && g.running);
        // The two losses come in either order: which new loop took the socket over says which is which.
        const taker = g.settings[3]!.keptSocket != null ? 3 : 4;
        const fresh = 7 - taker;
        expect(g.settings[taker]!.keptSocket).toEqual(expect.any(Number));
        expect(g.settings[fresh]!.keptSocket ?? null).toBeNull();
        // The takeover: exactly loop 0's flows, no grace; when ready, loop 1's (carried) and the living loops' with one.
        expect(loopsIn(g.adopts[taker]!)).toEqual([0]);
        expect(g.adopts[taker]!.graceMs).toBeNull();
        await until('the takeover given the rest', () => postedLoops(g.adoptPosts[taker]![1]!).includes(1));
        expect(postedLoops(g.adoptPosts[taker]![1]!)).toEqual(expect.arrayContaining([1, 2]));
        // The new socket: every flow, loop 0's among them (held by the loop taking over, or by loop 0 itself).
        expect(loopsIn(g.adopts[fresh]!)).toEqual([0, 1, 2]);
        // The living loop: loop 1's and loop 0's.
        expect(postedLoops(g.adoptPosts[2]![1]!)).toEqual(expect.arrayContaining([0, 1]));
      } finally {
        await g.stop(1000);
      }
    });
  });

  it('a takeover and a loss without one together: the takeover holds its own flows without grace, and is given the carried ones', async () => {
    await withFile(async (file) => {
      // Loop 1 crashes with no socket kept (ring v2) and loop 0 with one (takeover), in either order;
      // the first replacement is slow.
      const g = new FakeLoops(['exit', 'exit-unkept', 'slow-ready', 'answer']);
      g.keepFile = file;
      await g.start(base, 2);
      try {
        void askFlows(g);
        await until('both started again', () => g.settings.length === 4 && g.running);
        const takeover = g.settings.findIndex((st, k) => k >= 2 && st.keptSocket != null);
        expect(takeover).toBeGreaterThanOrEqual(2);
        expect(loopsIn(g.adopts[takeover]!)).toEqual([0]);
        expect(g.adopts[takeover]!.graceMs).toBeNull();
        await until('the takeover given the carried flows', () => postedLoops(g.adoptPosts[takeover]![1]!).includes(1));
      } finally {
        await g.stop(1000);
      }
    });
  });

  it('opens a new socket when the kept one lost its interface (ENODEV), with every flow carried', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['exit', 'answer', 'enodev-on-kept', 'answer']);
      g.keepFile = file;
      const lost: string[] = [];
      g.onLost = (reason) => void lost.push(reason);
      const restarted: boolean[] = [];
      g.onRestarted = (e) => void restarted.push(e.interfaceChanged);
      await g.start(base, 2);
      try {
        await askFlows(g);
        await until('started again', () => g.settings.length === 4 && g.running);
        expect(lost).toEqual([]);
        await until('onRestarted', () => restarted.length === 1);
        expect(restarted).toEqual([true]);
        // The same settings, without the socket: it joins the group, given every flow for a grace.
        expect(g.settings[3]!.keptSocket ?? null).toBeNull();
        expect(g.settings[3]!.fanout).toEqual({ mode: 'join', groupId: 100 });
        expect(loopsIn(g.adopts[3]!)).toEqual([0, 1]);
        expect(g.adopts[3]!.graceMs).toBe(HANDOFF_GRACE_MS);
        expect(g.restarts).toBe(1);
        expect(g.logged.join('\n')).toContain('socket lost its interface: opening a new one');
      } finally {
        await g.stop(1000);
      }
      // The kept descriptor was closed with the failed loop; only the living loops' are left, then none.
      expect(countOpen(file)).toBe(0);
    });
  });

  it('stays the group\'s while a loop takes it over: closed when that loop is given up on before it opened anything', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['exit', 'answer', 'never-ready'], { restartReadyMs: 300 });
      g.keepFile = file;
      const lost: string[] = [];
      g.onLost = (reason) => void lost.push(reason);
      await g.start(base, 2);
      try {
        expect(countOpen(file)).toBe(2);
        await askFlows(g);
        await until('given up', () => lost.length === 1);
        // Loop 0's socket, handed to a loop that never opened it, is closed; loop 1's is still held.
        await until('the taken-over descriptor closed', () => countOpen(file) === 1);
      } finally {
        await g.stop(1000);
      }
      expect(countOpen(file)).toBe(0);
    });
  });

  it('is closed when the group stops, and when a loss is given up on', async () => {
    await withFile(async (file) => {
      const g = new FakeLoops(['exit', 'exit'], { restartsPerWindow: 0 });
      g.keepFile = file;
      const lost: string[] = [];
      g.onLost = (reason) => void lost.push(reason);
      await g.start(base, 2);
      expect(countOpen(file)).toBe(2);
      await askFlows(g);
      await until('given up', () => lost.length === 1);
      await until('the descriptors closed', () => countOpen(file) === 0);
      await g.stop(1000);
    });
    await withFile(async (file) => {
      const g = new FakeLoops(['answer', 'answer']);
      g.keepFile = file;
      await g.start(base, 2);
      expect(countOpen(file)).toBe(2);
      await g.stop(1000);
      expect(countOpen(file)).toBe(0);
    });
  });
});

/** Descriptors of this process open on `file` (/proc/self/fd). */
function countOpen(file: string): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`) === file) n++;
    } catch {
      // Gone while listed (the listing's own descriptor).
    }
  }
  return n;
}
