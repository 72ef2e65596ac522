// The end of a failOpen panic: the first real up must not take the flows the panic kept on the
// others, whose probes may be what failed (probes blocked on this LB, a dependency of every health
// endpoint): they keep their flows until they are up too, or have had the time to rise. A
// walk-through saw 43 of 50 keep-alive connections reset there. Stand-in loops, no root.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import type { LoopRequest } from '../../src/dataplane/loop-runner.js';
import { stubbedDaemon } from '../support/stubbed-daemon.js';

let dir: string;
beforeEach(() => void (dir = mkdtempSync(join(tmpdir(), 'dsrlb-test-panic-ending-'))));
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const REALS = ['10.93.0.11', '10.93.0.12', '10.93.0.13'];

function daemonWith(onRealDown: 'reschedule' | 'keep' = 'reschedule') {
  const text = `interface: eth0
stateFile: ${join(dir, 'state.json')}
services:
  - name: web
    vip: 10.99.0.100
    port: 80
    whenAllDown: failOpen
    onRealDown: ${onRealDown}
    healthCheck: { type: http, interval: 1s, timeout: 500ms, rise: 2, fall: 2 }
    reals: [${REALS.map((a) => `{ address: ${a} }`).join(', ')}]
`;
  const health = new Map(REALS.map((a) => [a, 'up' as 'up' | 'down']));
  const logs: { msg: string }[] = [];
  let snapshot: ForwardingSnapshot | null = null;
  const broadcast = (m: LoopRequest): void => {
    if (m.type === 'snapshot') snapshot = m.snapshot;
  };
  const { daemon, inside } = stubbedDaemon(join(dir, 'dsrlb.yaml'), text, { activeFlows: 1, broadcast, log: (l) => logs.push(JSON.parse(l) as { msg: string }) });
  const monitor = daemon.health as unknown as { fact(key: string): unknown };
  monitor.fact = (key: string) => ({ state: health.get(key.slice(key.indexOf('#') + 1)), settled: true, since: 0, lastError: null, successes: 0, failures: 0, lastDurationMs: 0, probing: false });
  Object.assign(inside.loops as object, { localMac: new Uint8Array(6), size: 1, restarts: 0 });
  inside.queueRebuild = () => daemon.rebuild('queued');
  (inside.syncReals as () => void).call(daemon);
  const status = () => (daemon.status().services as { panic: boolean; panicEnding: boolean; reals: { address: string; health: { state: string } }[] }[])[0]!;
  const idOf = new Map<string, number>();
  const ids = () => {
    const reals = (inside.reals as Map<string, { address: string; id: number }>).values();
    for (const r of reals) idOf.set(r.address, r.id);
  };
  ids();
  /** The reals whose flows the loops keep, by address. */
  const keeping = () => REALS.filter((a) => snapshot!.realKeepExisting[idOf.get(a)!] === 1);
  /** The reals new flows go to. */
  const takingNew = () => (inside.lastReports as { candidates: number[] }[])[0]!.candidates.map((id) => REALS.find((a) => idOf.get(a) === id));
  const tick = () => (inside.tick as () => void).call(daemon);
  /** An operator's intent on a real, as `dsrlb disable` sets it (null: back to the config's). */
  const intent = (address: string, state: 'disabled' | null) => {
    const overrides = inside.overrides as Map<string, unknown>;
    const key = [...(inside.reals as Map<string, { address: string }>).entries()].find(([, r]) => r.address === address)![0];
    if (state === null) overrides.delete(key);
    else overrides.set(key, { state, configState: 'active', configWeight: 100 });
  };
  /** Every real down (a failOpen panic), then `first` up again: the panic ends. */
  const panicThenUp = (first: string) => {
    daemon.rebuild('start');
    for (const a of REALS) health.set(a, 'down');
    daemon.rebuild('health');
    health.set(first, 'up');
    daemon.rebuild('health');
  };
  return { daemon, health, logs, status, keeping, takingNew, tick, intent, panicThenUp };
}

describe('the end of a failOpen panic', () => {
  it('leaves the flows of the reals still down where the panic kept them until they rise, and sends new flows to the reals up', () => {
    let nowNs = process.hrtime.bigint();
    const clock = vi.spyOn(process.hrtime, 'bigint').mockImplementation(() => nowNs);
    const after = (ms: number): void => void (nowNs += BigInt(ms) * 1_000_000n);
    const d = daemonWith();
    try {
      d.daemon.rebuild('start');
      expect(d.keeping()).toEqual(REALS);
      for (const a of REALS) d.health.set(a, 'down');
      d.daemon.rebuild('health');
      expect(d.status().panic).toBe(true);
      expect(d.keeping()).toEqual(REALS);
      // The probes work again: .11 rises first. Before, .12 and .13 lost their flows here.
      after(10_000);
      d.health.set('10.93.0.11', 'up');
      d.daemon.rebuild('health');
      expect(d.status()).toMatchObject({ panic: false, panicEnding: true });
      expect(d.takingNew()).toEqual(['10.93.0.11']);
      expect(d.keeping()).toEqual(REALS);
      // Status tells the facts as they are: the two are down.
      expect(d.status().reals.map((r) => r.health.state)).toEqual(['up', 'down', 'down']);
      expect(d.logs.filter((l) => l.msg === 'failOpen panic over: the reals still down keep their flows while they may still come up')).toHaveLength(1);
      after(1_000);
      d.tick();
      expect(d.keeping()).toEqual(REALS);
      // .12 up: new flows go to both, .13 still waited for (a rise later than .12's).
      d.health.set('10.93.0.12', 'up');
      d.daemon.rebuild('health');
      expect(d.takingNew()).toEqual(['10.93.0.11', '10.93.0.12']);
      expect(d.keeping()).toEqual(REALS);
      // .13 is really dead: (rise 2 + 1) x 1 s + 500 ms after .11 was back, its flows move.
      after(2_300);
      d.tick();
      expect(d.keeping()).toEqual(REALS);
      after(300);
      d.tick();
      expect(d.keeping()).toEqual(['10.93.0.11', '10.93.0.12']);
      expect(d.status().panicEnding).toBe(false);
      expect(d.logs.filter((l) => l.msg === 'reals not back after the failOpen panic: their flows move')).toHaveLength(1);
    } finally {
      clock.mockRestore();
      d.daemon.health.stop();
    }
  });

  it('keeps no flows for a real that was up after the panic and then fell: it falls as any real does', () => {
    const d = daemonWith();
    try {
      d.panicThenUp('10.93.0.11');
      d.health.set('10.93.0.12', 'up');
      d.daemon.rebuild('health');
      expect(d.status().panicEnding).toBe(true);
      // .12 crashes during the wait: before, it was shown 'unknown' again and kept its (now dead) flows.
      d.health.set('10.93.0.12', 'down');
      d.daemon.rebuild('health');
      expect(d.keeping()).toEqual(['10.93.0.11', '10.93.0.13']);
    } finally {
      d.daemon.health.stop();
    }
  });

  it('waits for nothing once the service drops (every real disabled) or with onRealDown keep', () => {
    const d = daemonWith();
    try {
      d.panicThenUp('10.93.0.11');
      expect(d.status().panicEnding).toBe(true);
      // An hour of maintenance with every real disabled, then enabled: no "panic over" an hour late,
      // and the reals still down are no longer kept (they kept nothing across the drop).
      for (const a of REALS) d.intent(a, 'disabled');
      d.daemon.rebuild('intent');
      expect(d.status().panicEnding).toBe(false);
      for (const a of REALS) d.intent(a, null);
      d.daemon.rebuild('intent');
      expect(d.status().panicEnding).toBe(false);
      expect(d.keeping()).toEqual(['10.93.0.11']);
      expect(d.logs.filter((l) => l.msg === 'failOpen panic over: the reals still down keep their flows while they may still come up')).toHaveLength(1);
    } finally {
      d.daemon.health.stop();
    }
    const k = daemonWith('keep');
    try {
      k.panicThenUp('10.93.0.11');
      // A down real keeps its flows with keep anyway: no wait, no log that would say they move.
      expect(k.status().panicEnding).toBe(false);
      expect(k.keeping()).toEqual(REALS);
      expect(k.logs.filter((l) => l.msg.includes('failOpen panic over') || l.msg.includes('their flows move'))).toEqual([]);
    } finally {
      k.daemon.health.stop();
    }
  });

  it('ends the wait the moment every real is up, and starts it again with a new panic', () => {
    const d = daemonWith();
    try {
      d.panicThenUp('10.93.0.13');
      expect(d.status().panicEnding).toBe(true);
      // Down again before the others rose: a panic again, as before.
      d.health.set('10.93.0.13', 'down');
      d.daemon.rebuild('health');
      expect(d.status()).toMatchObject({ panic: true, panicEnding: false });
      for (const a of REALS) d.health.set(a, 'up');
      d.daemon.rebuild('health');
      expect(d.status()).toMatchObject({ panic: false, panicEnding: false });
      expect(d.takingNew()).toEqual(REALS);
      // No panic, no wait: a real going down now loses its flows at once (onRealDown: reschedule).
      d.health.set('10.93.0.12', 'down');
      d.daemon.rebuild('health');
      expect(d.keeping()).toEqual(['10.93.0.11', '10.93.0.13']);
    } finally {
      d.daemon.health.stop();
    }
  });
});
