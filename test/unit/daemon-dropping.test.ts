// Why a service drops new flows, real by real (status's dropping reason and explain's), and the
// daemon's warning of it: once per episode, and not while a settling service only waits for MACs;
// when its reals then turn out down, the warning comes. Stand-in loops and neighbours, no root.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { stubbedDaemon } from '../support/stubbed-daemon.js';

let dir: string;
beforeEach(() => void (dir = mkdtempSync(join(tmpdir(), 'dsrlb-test-dropping-'))));
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function daemonWith(reals: string, opts: { health: (address: string) => 'up' | 'down' | 'unknown'; mac: (address: string) => boolean }) {
  const text = `interface: eth0
stateFile: ${join(dir, 'state.json')}
services:
  - { name: web, vip: 10.99.0.100, port: 80, whenAllDown: drop, healthCheck: { type: none }, reals: [${reals}] }
`;
  const logs: { level: string; msg: string; reason?: string }[] = [];
  const { daemon, inside } = stubbedDaemon(join(dir, 'dsrlb.yaml'), text, { activeFlows: 0, log: (l) => logs.push(JSON.parse(l) as { level: string; msg: string }) });
  inside.neighbors = { setWanted: () => undefined, macOf: (a: string) => (opts.mac(a) ? new Uint8Array([2, 0, 0, 0, 0, 1]) : null) };
  // The fact as the monitor would hold it: 'unknown' until the first check decides (unsettled).
  inside.healthOf = (key: string) => opts.health(key.slice(key.indexOf('#') + 1));
  const health = daemon.health as unknown as { fact(key: string): unknown };
  health.fact = (key: string) => {
    const state = opts.health(key.slice(key.indexOf('#') + 1));
    return { state, settled: state !== 'unknown', since: 0, lastError: null, successes: 0, failures: 0, lastDurationMs: 0, probing: false };
  };
  Object.assign(inside.loops as object, { localMac: new Uint8Array(6), size: 1, restarts: 0 });
  (inside.syncReals as () => void).call(daemon);
  const reason = () => (daemon.status().services as { droppingReason: string | null }[])[0]!.droppingReason;
  return { daemon, logs, reason };
}

describe('a dropping service', () => {
  it("names each real's cause: health and MAC of the wanted ones, intent of the others", () => {
    const d = daemonWith('{ address: 10.93.0.11 }, { address: 10.93.0.12, state: drain }, { address: 10.93.0.13, state: disabled }, { address: 10.93.0.14, weight: 0 }, { address: 10.93.0.15 }, { address: 10.93.0.16 }, { address: 10.93.0.17, state: drain }', {
      health: (a) => (a === '10.93.0.11' || a === '10.93.0.16' ? 'down' : 'up'),
      mac: (a) => a !== '10.93.0.15' && a !== '10.93.0.16',
    });
    d.daemon.rebuild('health');
    expect(d.reason()).toBe(
      '10.93.0.11: down; 10.93.0.12, 10.93.0.17: draining; 10.93.0.13: disabled; 10.93.0.14: weight 0; 10.93.0.15: no MAC known (ARP/neighbour discovery unanswered); 10.93.0.16: down, no MAC known (ARP/neighbour discovery unanswered)',
    );
    expect(d.logs.filter((l) => l.msg === 'no real can take new flows: dropping').map((l) => l.reason)).toEqual([d.reason()]);
    d.daemon.health.stop();
  });

  it('is no warning while it settles waiting for MACs, is one when its reals turn out down, and once per episode', () => {
    let health: 'up' | 'down' | 'unknown' = 'unknown';
    let mac = false;
    const d = daemonWith('{ address: 10.93.0.11 }, { address: 10.93.0.12 }', { health: () => health, mac: () => mac });
    const warnings = () => d.logs.filter((l) => l.msg === 'no real can take new flows: dropping');
    d.daemon.rebuild('start');
    expect(d.logs.filter((l) => l.msg === "waiting for the reals' first checks and MACs before forwarding")).toHaveLength(1);
    expect(warnings()).toEqual([]);
    expect(d.reason()).toBe('10.93.0.11, 10.93.0.12: health not known yet, no MAC known (ARP/neighbour discovery unanswered)');
    // Dead hosts: their checks fail (and ARP stays unanswered). Before, the start's info line was all.
    health = 'down';
    d.daemon.rebuild('health');
    d.daemon.rebuild('health');
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]!.reason).toBe('10.93.0.11, 10.93.0.12: down, no MAC known (ARP/neighbour discovery unanswered)');
    // Up with their MACs: the episode ends; down again: a new one, a new warning.
    health = 'up';
    mac = true;
    d.daemon.rebuild('health');
    health = 'down';
    d.daemon.rebuild('health');
    expect(warnings()).toHaveLength(2);
    d.daemon.health.stop();
  });

  it('is no warning at start while MACs are known but the first checks have not answered (whenAllDown: drop)', () => {
    let health: 'up' | 'down' | 'unknown' = 'unknown';
    const d = daemonWith('{ address: 10.93.0.11 }, { address: 10.93.0.12 }', { health: () => health, mac: () => true });
    const warnings = () => d.logs.filter((l) => l.msg === 'no real can take new flows: dropping');
    d.daemon.rebuild('start');
    d.daemon.rebuild('neighbour change');
    expect(warnings()).toEqual([]);
    health = 'up';
    d.daemon.rebuild('health');
    expect(warnings()).toEqual([]);
    d.daemon.health.stop();
  });

  it('warns once a service settles still dropping, though nothing else changes (MACs that never come)', async () => {
    const d = daemonWith('{ address: 10.93.0.11 }', { health: () => 'up', mac: () => false });
    const warnings = () => d.logs.filter((l) => l.msg === 'no real can take new flows: dropping');
    d.daemon.rebuild('start');
    expect(warnings()).toEqual([]);
    // The settle wait is capped: past it the service counts as settled, and a rebuild is asked for.
    const inside = d.daemon as unknown as { firstSeenMs: Map<string, number>; settled(s: unknown): boolean; config: { services: unknown[] } };
    for (const k of inside.firstSeenMs.keys()) inside.firstSeenMs.set(k, -1e9);
    expect(inside.settled(inside.config.services[0])).toBe(true);
    await new Promise((r) => setTimeout(r, 250));
    expect(warnings().map((l) => l.reason)).toEqual(['10.93.0.11: no MAC known (ARP/neighbour discovery unanswered)']);
    d.daemon.health.stop();
  });
});
