// A real removed by a reload drains, then is forgotten once no loop holds a flow on it. Forgotten,
// it is probed no more (its probes went on until the next reload), and its id is released only once
// every loop runs a snapshot in which it takes no new flows (a SYN placed on it by a loop still on
// the older snapshot would land on whichever real reuses the id). No root, no loop.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { stubbedDaemon } from '../support/stubbed-daemon.js';
import { Counter, REAL_BASE, REAL_STRIDE, RealCounter } from '../../src/dataplane/counters.js';
import { HealthMonitor } from '../../src/health/health-monitor.js';
import { OK, type Prober } from '../../src/health/probe.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-forget-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const service = (name: string, vip: string, reals: string[]): string =>
  `  - { name: ${name}, vip: ${vip}, port: 80, healthCheck: { type: tcp, interval: 100ms, timeout: 50ms }, reals: [${reals.map((a) => `{ address: ${a} }`).join(', ')}] }\n`;
const configText = (services: string): string => `interface: eth0\nstateFile: ${join(dir, 'state.json')}\nservices:\n${services}`;

describe('forgetting a removed real', () => {
  it('waits for every loop to run the snapshot that removed it, then stops probing it', async () => {
    const file = join(dir, 'dsrlb.yaml');
    const text = configText(service('web', '10.99.0.100', ['10.0.0.1', '10.0.0.2']) + service('old', '10.99.0.101', ['10.0.1.1']));
    // The loops: no flow on any real; the generation they run is what the test says.
    let generationSent = 0;
    const { daemon, inside: stubbed, counters } = stubbedDaemon(file, text, {
      activeFlows: 0,
      broadcast: (m) => void (m.type === 'snapshot' && (generationSent = m.snapshot.generation)),
    });
    const inside = stubbed as typeof stubbed & { health: HealthMonitor; reals: Map<string, unknown>; tick(): void };
    const probed = new Set<string>();
    const prober: Prober = { probe: async (t) => (probed.add(t.address), OK) };
    inside.health.stop();
    inside.health = new HealthMonitor({ probers: { tcp: prober } });
    (inside.syncReals as () => void).call(daemon);
    daemon.rebuild('start');
    counters[Counter.snapshotGeneration] = generationSent;
    try {
      writeFileSync(file, configText(service('web', '10.99.0.100', ['10.0.0.1'])));
      expect((await daemon.reload()).ok).toBe(true);
      // The loops still run the snapshot from before the reload: nothing is forgotten yet.
      inside.tick.call(daemon);
      expect(inside.reals.size).toBe(3);
      counters[Counter.snapshotGeneration] = generationSent;
      inside.tick.call(daemon);
      expect([...inside.reals.keys()]).toEqual(['tcp|10.99.0.100|80#10.0.0.1']);
      probed.clear();
      await new Promise((r) => setTimeout(r, 500));
      expect([...probed]).toEqual(['10.0.0.1']);
    } finally {
      inside.health.stop();
    }
  });
});

const rateConfig = (dir: string, reals: string[]) => `interface: eth0
tunnel: { sourceV4: 10.93.255.1, sourceV6: "fd00::1" }
stateFile: ${dir}/state.json
services:
  - { name: web, vip: 10.99.0.100, port: 80, healthCheck: { type: none }, reals: [${reals.map((a) => `{ address: ${a} }`).join(', ')}] }
`;

describe('a real given the id of a forgotten one', () => {
  it('a real given a reused id starts at 0 packets/s, not minus the previous owner\'s total', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rv-'));
    const path = join(dir, 'dsrlb.yaml');
    const { daemon, inside, counters } = stubbedDaemon(path, rateConfig(dir, ['10.93.0.1', '10.93.0.2']), { activeFlows: 0 });
    (inside.syncReals as () => void).call(daemon);
    daemon.rebuild('start');
    Object.assign(inside.loops as object, { localMac: new Uint8Array(6), size: 1 });
    const tick = () => (inside.tick as () => void).call(daemon);
    counters[REAL_BASE + 0 * REAL_STRIDE + RealCounter.forwardedPackets] = 5000; // 10.93.0.1 had id 0
    counters[Counter.snapshotGeneration] = 99;
    tick();
    writeFileSync(path, rateConfig(dir, ['10.93.0.2']));
    expect((await daemon.reload()).ok).toBe(true);
    tick(); // 10.93.0.1 drained: forgotten, id 0 free
    writeFileSync(path, rateConfig(dir, ['10.93.0.2', '10.93.0.3']));
    expect((await daemon.reload()).ok).toBe(true);
    tick();
    const s = daemon.status() as { services: { reals: { address: string; packets: number; pps: number }[] }[] };
    const r3 = s.services[0]!.reals.find((r) => r.address === '10.93.0.3')!;
    daemon.health.stop();
    rmSync(dir, { recursive: true, force: true });
    expect(r3.pps).toBe(0);
  });
});

describe('a removed service that drains', () => {
  it('has no dsrlb_service_panic series, so the all-reals-down alert does not fire for a removal', async () => {
    const file = join(dir, 'dsrlb.yaml');
    const text = configText(service('web', '10.99.0.100', ['10.0.0.1']) + service('old', '10.99.0.101', ['10.0.1.1']));
    // Every real holds flows: the removed service drains instead of being forgotten.
    const { daemon, inside } = stubbedDaemon(file, text, { activeFlows: 3 });
    const health = inside.health as HealthMonitor;
    try {
      (inside.syncReals as () => void).call(daemon);
      daemon.rebuild('start');
      expect(await daemon.metrics.text()).toMatch(/^dsrlb_service_panic\{service="old"\} [01]$/m);
      writeFileSync(file, configText(service('web', '10.99.0.100', ['10.0.0.1'])));
      expect((await daemon.reload()).ok).toBe(true);
      const views = (inside.serviceViews as () => { config: { name: string }; removed?: boolean }[]).call(daemon);
      expect(views.map((v) => [v.config.name, v.removed === true])).toEqual([['web', false], ['old', true]]);
      const text2 = await daemon.metrics.text();
      expect(text2).not.toMatch(/dsrlb_service_panic\{service="old"\}/);
      expect(text2).toMatch(/^dsrlb_service_panic\{service="web"\} [01]$/m);
      // Named by an operator: its reals' intent is refused with what it is, not as an unknown service...
      for (const ref of ['old', 'tcp://10.99.0.101:80', '10.99.0.101:80']) {
        await expect(daemon.setIntent(ref, '10.0.1.1', { state: 'disabled' })).rejects.toMatchObject({
          code: 'UNKNOWN_SERVICE_REMOVED',
          message: 'service "old" was removed from the config by a reload: its flows drain on their reals (dsrlb status and dsrlb flows list them) and it takes no new ones; it cannot be changed (put it back in the config to manage it)',
        });
      }
      // ... and explain asks the loops about it (its flows are in their tables, the service in their snapshot).
      const explainTarget = inside.explainTarget as (ref: string) => { s: { name: string }; dstPort: number };
      expect(explainTarget.call(daemon, 'old')).toMatchObject({ s: { name: 'old' }, dstPort: 80 });
      await expect(daemon.setIntent('nosuch', '10.0.1.1', { state: 'disabled' })).rejects.toMatchObject({ code: 'UNKNOWN_SERVICE' });
      // status SERVICE (ipvsadm -Ln -t): that service alone, a removed one that drains too.
      Object.assign(inside.loops as object, { localMac: new Uint8Array(6), size: 1 });
      const only = (ref: string) => (daemon.status(ref) as { services: { name: string; removed: boolean }[] }).services.map((x) => [x.name, x.removed]);
      expect(only('web')).toEqual([['web', false]]);
      expect(only('10.99.0.100:80')).toEqual([['web', false]]);
      expect(only('tcp://10.99.0.101:80')).toEqual([['old', true]]);
      expect((daemon.status() as { services: unknown[] }).services).toHaveLength(2);
      expect(() => daemon.status('nosuch')).toThrow(expect.objectContaining({ code: 'UNKNOWN_SERVICE' }));
    } finally {
      health.stop();
    }
  });
});

describe('a removed real that drains', () => {
  it('is named as removed, not unknown, when an operator changes its intent', async () => {
    const file = join(dir, 'dsrlb.yaml');
    // Every real holds flows: the removed real drains instead of being forgotten.
    const { daemon, inside } = stubbedDaemon(file, configText(service('web', '10.99.0.100', ['10.0.0.1', '10.0.0.2'])), { activeFlows: 3 });
    const health = inside.health as HealthMonitor;
    try {
      (inside.syncReals as () => void).call(daemon);
      daemon.rebuild('start');
      writeFileSync(file, configText(service('web', '10.99.0.100', ['10.0.0.1'])));
      expect((await daemon.reload()).ok).toBe(true);
      await expect(daemon.setIntent('web', '10.0.0.2', { state: 'drain' })).rejects.toMatchObject({
        code: 'UNKNOWN_REAL_REMOVED',
        message: 'real 10.0.0.2 was removed from service "web" by a reload: its flows drain on it (dsrlb status and dsrlb flows list them) and it takes no new ones; it cannot be changed (put it back in the config to manage it)',
      });
      await expect(daemon.setIntent('web', '10.0.0.9', { state: 'drain' })).rejects.toMatchObject({ code: 'UNKNOWN_REAL' });
    } finally {
      health.stop();
    }
  });
});
