// A packet loop whose worker ends by itself is started again in place: a real loop worker (the
// built one in dist/, as the daemon runs it) with an AF_PACKET socket on lo is terminated, and a
// new worker takes its socket over (the group kept a descriptor of it: same ring, same place in the
// fanout group) and runs the last snapshot from its first packet, its heartbeat fresh, with the
// group's counts carried over, and holds the flows of the worker it replaces (read from that
// table's shared records: a terminated worker cannot hand anything over). With ring v2 (no
// takeover) a new socket is opened and, with several loops, every loop is given every flow. Needs
// root (a packet socket); frames are sent only on lo, to a documentation address.

import type { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { requireRoot, sleep } from '../support/lab-daemon.js';
import { ethernet, ipv4, mac, udp } from '../support/packet-builder.js';

// From dist/: the group starts its workers from ../dataplane/loop-worker.js beside it (npm test builds dist/ first).
const { LoopGroup } = (await import(new URL('../../dist/control/loop-group.js', import.meta.url).href)) as typeof import('../../src/control/loop-group.js');
const { createLogger } = (await import(new URL('../../dist/control/logger.js', import.meta.url).href)) as typeof import('../../src/control/logger.js');
const { Counter, MAX_REAL_IDS } = (await import(new URL('../../dist/dataplane/counters.js', import.meta.url).href)) as typeof import('../../src/dataplane/counters.js');
const { emptySnapshot } = (await import(new URL('../../dist/dataplane/forwarding-snapshot.js', import.meta.url).href)) as typeof import('../../src/dataplane/forwarding-snapshot.js');
const { FLOW_KEY_WORDS } = (await import(new URL('../../dist/dataplane/flow-hash.js', import.meta.url).href)) as typeof import('../../src/dataplane/flow-hash.js');
const { FlowState } = (await import(new URL('../../dist/dataplane/flow-table.js', import.meta.url).href)) as typeof import('../../src/dataplane/flow-table.js');
const { AfPacketIo } = (await import(new URL('../../dist/io/afpacket-io.js', import.meta.url).href)) as typeof import('../../src/io/afpacket-io.js');
const { SnapshotBuilder } = (await import(new URL('../../dist/control/snapshot-builder.js', import.meta.url).href)) as typeof import('../../src/control/snapshot-builder.js');
const { parseConfigText } = (await import(new URL('../../dist/config/validate.js', import.meta.url).href)) as typeof import('../../src/config/validate.js');
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
  // Ring v3: the new loop takes the ended one's socket over, and each loop holds what it held.
  // Ring v2 (no takeover): a new socket, the kernel spreads the flows anew, every loop gets all.
  const cases = [
    { workers: 1, ending: 1, ring: 'v3' },
    { workers: 2, ending: 1, ring: 'v3' },
    { workers: 3, ending: 1, ring: 'v3' },
    { workers: 2, ending: 2, ring: 'v3' },
    { workers: 1, ending: 1, ring: 'v2' },
    { workers: 2, ending: 1, ring: 'v2' },
    { workers: 2, ending: 2, ring: 'v2' },
  ] as const;
  for (const { workers, ending, ring } of cases) {
    const kept = ring === 'v3';
    it(`${kept ? 'each loop holds the flows it held' : 'every loop holds every flow'} after ${ending} of ${workers} loop${workers > 1 ? 's' : ''} ended (ring ${ring})`, async () => {
      requireRoot();
      const logged: string[] = [];
      const g = new WatchedLoops(createLogger((line: string) => void logged.push(line)));
      await g.start({ io: 'afpacket', ring, interface: 'lo', flowCapacity: 4096, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS }, workers);
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
        const all = before.flat().sort();
        expect(all).toHaveLength(500);
        expect(after).toHaveLength(workers);
        if (kept || workers === 1) {
          // The new loop holds exactly the old one's flows, on their reals, in their states; the
          // others theirs (a kept socket keeps the fanout group's members: nothing moved).
          expect(after.map((l) => l.join('\n')).sort()).toEqual(before.map((l) => l.join('\n')).sort());
        } else {
          // The kernel's fanout hash spread the flows anew as a member left and joined.
          for (const lines of after) expect(lines).toEqual(all);
        }
        expect(logged.join('\n')).toContain('holds the flows of the loop it replaces');
        expect(logged.join('\n')).toContain(`"socketKept":${kept}`);
      } finally {
        await g.stop(2000);
      }
    }, 30_000);
  }
});

const VIP = '203.0.113.10';
const REAL_MAC = '02:00:00:00:0a:01';
const CONFIG = `
interface: lo
services:
  - name: dns
    vip: ${VIP}
    port: 9000
    protocol: udp
    reals:
      - address: 192.0.2.1
`;

/** UDP datagram i to the VIP, from 10.9.x.y, addressed to lo's MAC (all zeros): PACKET_HOST there. */
function datagram(i: number): Uint8Array {
  const src = `10.9.${i >> 8}.${i & 255}`;
  return ethernet({ dst: '00:00:00:00:00:00', src: '02:00:00:00:0a:99', type: 0x0800 }, ipv4({ src, dst: VIP, proto: 17 }, udp({ sport: 40000 + i, dport: 9000 }, [1, 2, 3], { src, dst: VIP })));
}

/** Sends frames out of lo (each comes back in as received, to every packet socket on lo). */
function sendOnLo(frames: readonly Uint8Array[]): number {
  const io = AfPacketIo.open({ interface: 'lo', blockCount: 2 });
  try {
    // vnetHdr is on: each frame starts with a 10-byte virtio_net_hdr, all zero (nothing to offload).
    const buf = new Uint8Array(frames.reduce((n, f) => n + 10 + f.length, 0));
    const offsets = new Int32Array(frames.length);
    const lengths = new Int32Array(frames.length);
    let at = 0;
    frames.forEach((f, k) => {
      buf.set(f, at + 10);
      offsets[k] = at;
      lengths[k] = f.length + 10;
      at += f.length + 10;
    });
    return io.sendFrames(buf, offsets, lengths, frames.length);
  } finally {
    io.close();
  }
}

describe('frames that arrive while a packet loop is being started again', () => {
  for (const workers of [1, 2]) {
    it(`wait in the kept socket's ring for the new loop (${workers} loop${workers > 1 ? 's' : ''}): every flow is placed once, none lost`, async () => {
      requireRoot();
      const parsed = parseConfigText(CONFIG);
      if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
      const views = parsed.config.services.map((svc) => ({
        config: svc,
        reals: svc.reals.map((r, k) => ({ id: k, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up' as const, removed: false, mac: mac(REAL_MAC) })),
      }));
      const snapshot = new SnapshotBuilder().build(views, parsed.config.hashSeed, MAX_REAL_IDS, { v4: null, v6: null }).snapshot;
      const g = new WatchedLoops(createLogger(() => undefined));
      await g.start({ io: 'afpacket', ring: 'v3', interface: 'lo', flowCapacity: 4096, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS, snapshot }, workers);
      try {
        g.broadcast({ type: 'snapshot', snapshot });
        await g.workers[0]!.terminate();
        // The new worker takes a few hundred ms to start: these arrive while no loop reads that socket.
        const n = 300;
        expect(sendOnLo(Array.from({ length: n }, (_, i) => datagram(i)))).toBe(n);
        expect(g.running).toBe(false);
        for (let i = 0; i < 250 && !g.running; i++) await sleep(20);
        expect(g.running).toBe(true);
        let perLoop: string[][] = [];
        for (let i = 0; i < 100 && perLoop.flat().length < n; i++) {
          await sleep(20);
          perLoop = flowLines(await g.ask((id) => ({ type: 'flows', id, limit: 10_000 }))).map((lines) => lines.filter((line) => Number(line.split(',')[1]) >>> 16 === 0x0a09));
        }
        const ours = perLoop.flat();
        // Each datagram's flow once, in one loop (none lost in the gap, none placed twice).
        expect(ours).toHaveLength(n);
        expect(new Set(ours).size).toBe(n);
        // The kernel kept sending the ended loop's share to its socket (a new socket would have
        // left the living loop all of them): every loop, the new one too, placed some.
        expect(perLoop).toHaveLength(workers);
        for (const lines of perLoop) expect(lines.length).toBeGreaterThan(0);
      } finally {
        await g.stop(2000);
      }
    }, 30_000);
  }
});
