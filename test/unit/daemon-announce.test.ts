// Scale-out: a (re)starting LB announces a VIP only once the health of the service's reals has
// settled, so it never joins the ECMP group with a half-built view (fail-open, or a table of the
// first real up) and resets the connections the router moves to it. No root, no BIRD: the
// daemon's announce decision with its loop and health monitor stood in for.

import { describe, expect, it, vi } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';
import { RealRegistry, serviceIdentity } from '../../src/control/real-registry.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';

const parsed = parseConfigText(`interface: eth0
announce: { enabled: true }
services:
  - name: web
    vip: 10.93.0.100
    port: 80
    healthCheck: { type: http }
    reals: [{ address: 10.93.0.11 }, { address: 10.93.0.12 }]
`);
if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
const config = parsed.config;
const sid = serviceIdentity(config.services[0]!);
/** The health keys of the service's two reals. */
const a = RealRegistry.keyOf(sid, '10.93.0.11');
const b = RealRegistry.keyOf(sid, '10.93.0.12');

function daemonWith(
  facts: Map<string, { state: 'up' | 'down'; settled: boolean }>,
  report: { panic: boolean },
  macs = new Set(['10.93.0.11', '10.93.0.12']),
  loops: { running: boolean; recovering: boolean; heartbeatAgeMs: () => number; active?: () => number; inactive?: () => number } = {
    running: true,
    recovering: false,
    heartbeatAgeMs: () => 0,
  },
) {
  const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
  daemon.config = config;
  const inside = daemon as unknown as Record<string, unknown>;
  inside.loops = loops;
  inside.lastReports = [{ name: 'web', dropping: false, panic: report.panic }];
  inside.health = { fact: (key: string) => facts.get(key) };
  inside.neighbors = { macOf: (ip: string) => (macs.has(ip) ? new Uint8Array(6) : null) };
  return Object.assign(() => (inside.announceWanted as () => Map<string, boolean>).call(daemon), { daemon: inside });
}

describe('announcing after a start', () => {
  it('waits until every real is proven up or confirmed down, then announces and stays announced', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'down' as const, settled: false }],
    ]);
    const report = { panic: false };
    const wanted = daemonWith(facts, report);
    // One real up, the other not yet probed enough: a table of one real would differ from the peers'.
    expect(wanted().get('10.93.0.100')).toBe(false);
    // Fail-open at start (nothing proven yet) is no reason to announce either.
    report.panic = true;
    facts.set(a, { state: 'down', settled: false });
    expect(wanted().get('10.93.0.100')).toBe(false);
    // Both decided (one up, one confirmed down): the view is complete.
    report.panic = false;
    facts.set(a, { state: 'up', settled: true });
    facts.set(b, { state: 'down', settled: true });
    expect(wanted().get('10.93.0.100')).toBe(true);
    // A probe restarted later (a reload on every LB at once) does not withdraw the VIP everywhere.
    facts.set(b, { state: 'down', settled: false });
    expect(wanted().get('10.93.0.100')).toBe(true);
  });

  it('waits its 30 s cap on the monotonic clock: a step of the system time neither announces a half-built view nor holds the VIP back', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'down' as const, settled: false }],
    ]);
    const wanted = daemonWith(facts, { panic: false });
    expect(wanted().get('10.93.0.100')).toBe(false);
    const realNow = Date.now();
    const step = vi.spyOn(Date, 'now').mockReturnValue(realNow + 3_600_000); // `date -s` an hour ahead
    try {
      expect(wanted().get('10.93.0.100')).toBe(false);
    } finally {
      step.mockRestore();
    }
  });

  it('waits for the MAC of a real proven up (its peers send to it), not for a real confirmed down', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'down' as const, settled: true }],
    ]);
    const macs = new Set<string>();
    const wanted = daemonWith(facts, { panic: false }, macs);
    expect(wanted().get('10.93.0.100')).toBe(false);
    // The dead real's MAC may never resolve: only the live one's is needed.
    macs.add('10.93.0.11');
    expect(wanted().get('10.93.0.100')).toBe(true);
  });
});

describe('announcing again after a withdrawal for want of reals', () => {
  it('waits for the reals still coming back in this view, as long as they may still rise, and not for a dead one forever', () => {
    const facts = new Map<string, { state: 'up' | 'down'; settled: boolean }>([
      [a, { state: 'up', settled: true }],
      [b, { state: 'up', settled: true }],
    ]);
    const wanted = daemonWith(facts, { panic: false });
    let nowNs = process.hrtime.bigint();
    const clock = vi.spyOn(process.hrtime, 'bigint').mockImplementation(() => nowNs);
    const after = (ms: number): void => {
      nowNs += BigInt(ms) * 1_000_000n;
    };
    const dropping = (d: boolean): void => {
      wanted.daemon.lastReports = [{ name: 'web', dropping: d, panic: false }];
    };
    try {
      expect(wanted().get('10.93.0.100')).toBe(true);
      // This LB's probes fail (blocked here only): both reals down, the service drops, the VIP goes.
      facts.set(a, { state: 'down', settled: true });
      facts.set(b, { state: 'down', settled: true });
      dropping(true);
      expect(wanted().get('10.93.0.100')).toBe(false);
      // Unblocked: .11 rises first. Before, the VIP came back now and the peers' flows for .12 were reset here.
      after(5_000);
      facts.set(a, { state: 'up', settled: true });
      dropping(false);
      expect(wanted().get('10.93.0.100')).toBe(false);
      expect((wanted.daemon.reannounceHold as { isWaiting(v: string): boolean }).isWaiting('10.93.0.100')).toBe(true);
      after(1_500);
      expect(wanted().get('10.93.0.100')).toBe(false);
      // .12 up a probe phase later: every wanted real is up, the VIP goes back as soon as the
      // loops run a table with it (not while its rebuild is queued).
      facts.set(b, { state: 'up', settled: true });
      wanted.daemon.rebuildQueued = true;
      expect(wanted().get('10.93.0.100')).toBe(false);
      wanted.daemon.rebuildQueued = false;
      expect(wanted().get('10.93.0.100')).toBe(true);

      // Again, but .12 is really dead: the VIP waits the rise time of the default check
      // ((rise 2 + 1) x 2 s + 1 s = 7 s after the last real came up), then goes back without it.
      facts.set(a, { state: 'down', settled: true });
      facts.set(b, { state: 'down', settled: true });
      dropping(true);
      expect(wanted().get('10.93.0.100')).toBe(false);
      after(3_000);
      facts.set(a, { state: 'up', settled: true });
      dropping(false);
      expect(wanted().get('10.93.0.100')).toBe(false);
      after(6_900);
      expect(wanted().get('10.93.0.100')).toBe(false);
      after(200);
      expect(wanted().get('10.93.0.100')).toBe(true);
    } finally {
      clock.mockRestore();
    }
  });

  it('does not hold a VIP back when the operator took every real out (disabled): its view was whole', () => {
    const facts = new Map<string, { state: 'up' | 'down'; settled: boolean }>([
      [a, { state: 'up', settled: true }],
      [b, { state: 'down', settled: true }],
    ]);
    const wanted = daemonWith(facts, { panic: false });
    expect(wanted().get('10.93.0.100')).toBe(true);
    const overrides = wanted.daemon.overrides as Map<string, unknown>;
    for (const k of [a, b]) overrides.set(k, { state: 'disabled', configState: 'active', configWeight: 100 });
    wanted.daemon.lastReports = [{ name: 'web', dropping: true, panic: false }];
    expect(wanted().get('10.93.0.100')).toBe(false);
    // Enabled again, .12 still dead: back at once (before: 7 s later, waiting for .12).
    overrides.clear();
    wanted.daemon.lastReports = [{ name: 'web', dropping: false, panic: false }];
    expect(wanted().get('10.93.0.100')).toBe(true);
  });

  it('does not hold a VIP back for a withdrawal that was not for its reals: an operator withdraw, a stalled loop', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'down' as const, settled: true }],
    ]);
    const loops = { running: true, recovering: false, heartbeatAgeMs: () => 0 };
    const wanted = daemonWith(facts, { panic: false }, undefined, loops);
    expect(wanted().get('10.93.0.100')).toBe(true);
    wanted.daemon.withdrawn = new Set([sid]);
    expect(wanted().get('10.93.0.100')).toBe(false);
    wanted.daemon.withdrawn = new Set();
    expect(wanted().get('10.93.0.100')).toBe(true);
    loops.heartbeatAgeMs = () => 2000;
    expect(wanted().get('10.93.0.100')).toBe(false);
    loops.heartbeatAgeMs = () => 0;
    expect(wanted().get('10.93.0.100')).toBe(true);
  });
});

describe('announcing and the packet loops', () => {
  it('withdraws for a stalled or lost loop, and keeps the VIP while a loop that ended is started again', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'up' as const, settled: true }],
    ]);
    const loops = { running: true, recovering: false, heartbeatAgeMs: () => 0 };
    const wanted = daemonWith(facts, { panic: false }, undefined, loops);
    expect(wanted().get('10.93.0.100')).toBe(true);
    // Stalled: runs, but no heartbeat for 2 s.
    loops.heartbeatAgeMs = () => 2000;
    expect(wanted().get('10.93.0.100')).toBe(false);
    // Its replacement starting (a few hundred ms): a withdrawal would flap the route on every router.
    loops.running = false;
    loops.recovering = true;
    loops.heartbeatAgeMs = () => Infinity;
    expect(wanted().get('10.93.0.100')).toBe(true);
    // Given up (lost too often, or the new loop failed): the daemon is stopping.
    loops.recovering = false;
    expect(wanted().get('10.93.0.100')).toBe(false);
  });
});

describe('announcing a service removed by a reload', () => {
  it('keeps its VIP announced while its flows drain here, and withdraws it with the last one', () => {
    const removedText = parseConfigText(`interface: eth0
announce: { enabled: true }
services:
  - { name: old, vip: 10.93.0.200, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.21 }] }
`);
    if (!removedText.ok) throw new Error(JSON.stringify(removedText.problems));
    const old = removedText.config.services[0]!;
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'up' as const, settled: true }],
    ]);
    let flows = 3;
    const loops = { running: true, recovering: false, heartbeatAgeMs: () => 0, active: () => flows, inactive: () => 0 };
    const wanted = daemonWith(facts, { panic: false }, undefined, loops);
    const inside = wanted.daemon;
    inside.removedServices = new Map([[serviceIdentity(old), old]]);
    inside.reals = new Map([['k', { id: 9, service: serviceIdentity(old) }]]);
    // Not announced when it was removed (withdrawn by the operator, or never settled): it stays off the air.
    inside.drainAnnounced = new Set();
    expect(wanted().has('10.93.0.200')).toBe(false);
    // Announced when it was removed: announced while its flows drain.
    inside.drainAnnounced = new Set([serviceIdentity(old)]);
    expect(wanted().get('10.93.0.200')).toBe(true);
    expect(wanted().get('10.93.0.100')).toBe(true);
    flows = 0;
    expect(wanted().has('10.93.0.200')).toBe(false);
  });
});

/** Two services on one VIP (web80, web443), each with one real. */
const two = parseConfigText(`interface: eth0
announce: { enabled: true }
services:
  - { name: web80, vip: 10.93.0.100, port: 80, healthCheck: { type: http }, reals: [{ address: 10.93.0.11 }] }
  - { name: web443, vip: 10.93.0.100, port: 443, healthCheck: { type: tcp }, reals: [{ address: 10.93.0.12 }] }
`);
if (!two.ok) throw new Error(JSON.stringify(two.problems));
const twoConfig = two.config;
const [s80, s443] = twoConfig.services as [typeof config.services[0], typeof config.services[0]];
const k80 = RealRegistry.keyOf(serviceIdentity(s80), '10.93.0.11');
const k443 = RealRegistry.keyOf(serviceIdentity(s443), '10.93.0.12');

/** A daemon of the two services with these health facts and build reports; `wanted()` is its decision for their VIP. */
function twoServiceDaemon(facts: Map<string, { state: 'up' | 'down'; settled: boolean }>, reports: { name: string; dropping: boolean; panic: boolean }[]) {
  const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
  daemon.config = twoConfig;
  const inside = daemon as unknown as Record<string, unknown>;
  inside.loops = { running: true, recovering: false, heartbeatAgeMs: () => 0 };
  inside.lastReports = reports;
  inside.health = { fact: (key: string) => facts.get(key) };
  inside.neighbors = { macOf: () => new Uint8Array(6) };
  return { inside, wanted: () => (inside.announceWanted as () => Map<string, boolean>).call(daemon).get('10.93.0.100') };
}

describe('a VIP shared by two services', () => {
  it('is announced only once every service of it has settled, and withdrawn when either is withdrawn', () => {
    const facts = new Map([
      [k80, { state: 'up' as const, settled: true }],
      [k443, { state: 'down' as const, settled: false }],
    ]);
    const { inside, wanted } = twoServiceDaemon(facts, [
      { name: 'web80', dropping: false, panic: false },
      { name: 'web443', dropping: false, panic: true },
    ]);
    // web80 is ready, but :443's table is still fail-open at start: flows moved here would reset.
    expect(wanted()).toBe(false);
    facts.set(k443, { state: 'up', settled: true });
    inside.lastReports = [
      { name: 'web80', dropping: false, panic: false },
      { name: 'web443', dropping: false, panic: false },
    ];
    expect(wanted()).toBe(true);
    // The route is the VIP's: withdrawing one of its services takes the VIP off this LB.
    inside.withdrawn = new Set([serviceIdentity(s443)]);
    expect(wanted()).toBe(false);
    inside.withdrawn = new Set();
    // One of them dropping (no real for new flows) still leaves the other's flows to take.
    inside.lastReports = [
      { name: 'web80', dropping: true, panic: false },
      { name: 'web443', dropping: false, panic: false },
    ];
    expect(wanted()).toBe(true);
  });
});

describe('dsrlb_vip_announced', () => {
  it('has a series only where an announcement is meant: not for a service with announce: false, nor with announce off', async () => {
    const parse = (enabled: boolean) => {
      const r = parseConfigText(`interface: eth0
announce: { enabled: ${enabled} }
services:
  - { name: web, vip: 10.93.0.100, port: 80, reals: [{ address: 10.93.0.11 }] }
  - { name: internal, vip: 10.93.0.101, port: 80, announce: false, reals: [{ address: 10.93.0.12 }] }
`);
      if (!r.ok) throw new Error(JSON.stringify(r.problems));
      return r.config;
    };
    const scrape = async (enabled: boolean) => {
      const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
      daemon.config = parse(enabled);
      const inside = daemon as unknown as Record<string, unknown>;
      inside.lastReports = [
        { name: 'web', tableFingerprint: 'aaaa', panic: false },
        { name: 'internal', tableFingerprint: 'bbbb', panic: false },
      ];
      inside.announcer = { isAnnounced: (vip: string) => vip === '10.93.0.100' };
      const text = await daemon.metrics.registry.getSingleMetricAsString('dsrlb_vip_announced');
      daemon.health.stop();
      return text.split('\n').filter((l) => l.startsWith('dsrlb_vip_announced{'));
    };
    expect(await scrape(true)).toEqual(['dsrlb_vip_announced{service="web"} 1']);
    expect(await scrape(false)).toEqual([]);
  });
});

describe('a service whose every real the operator drained', () => {
  const viewOf = (over: (i: number) => { intent?: 'active' | 'drain' | 'disabled'; weight?: number; health?: 'up' | 'down' | 'unknown' }, whenAllDown = 'drop'): ServiceView => {
    const parsedDrain = parseConfigText(`interface: eth0
services:
  - { name: web, vip: 10.93.0.100, port: 80, whenAllDown: ${whenAllDown}, reals: [{ address: 10.93.0.11 }, { address: 10.93.0.12 }] }
`);
    if (!parsedDrain.ok) throw new Error(JSON.stringify(parsedDrain.problems));
    const s = parsedDrain.config.services[0]!;
    return { config: s, reals: s.reals.map((r, i) => ({ id: i, address: r.address, weight: over(i).weight ?? r.weight, intent: over(i).intent ?? r.state, forwarding: r.forwarding, health: over(i).health ?? 'up', removed: false, mac: new Uint8Array(6) })) };
  };
  const reportOf = (view: ServiceView) => new SnapshotBuilder().build([view], 0, MAX_REAL_IDS).services[0]!;

  it('is reported drained (dropping new flows, its reals keeping theirs) only when intent, not health, took every real out', () => {
    expect(reportOf(viewOf(() => ({ intent: 'drain' })))).toMatchObject({ dropping: true, drained: true });
    expect(reportOf(viewOf((i) => (i === 0 ? { intent: 'drain' } : { weight: 0 })))).toMatchObject({ dropping: true, drained: true });
    // failOpen does not take drained reals (they are not wanted): the same.
    expect(reportOf(viewOf(() => ({ intent: 'drain' }), 'failOpen'))).toMatchObject({ dropping: true, panic: false, drained: true });
    // Health took them out: nothing is kept that the VIP should carry.
    expect(reportOf(viewOf(() => ({ health: 'down' })))).toMatchObject({ dropping: true, drained: false });
    expect(reportOf(viewOf((i) => (i === 0 ? { intent: 'drain', health: 'down' } : { health: 'down' })))).toMatchObject({ dropping: true, drained: false });
    expect(reportOf(viewOf(() => ({ intent: 'disabled' })))).toMatchObject({ dropping: true, drained: false });
    expect(reportOf(viewOf((i) => (i === 0 ? { intent: 'drain' } : {})))).toMatchObject({ dropping: false, drained: false });
    // One drained, the only active one down: health took the service out, so the VIP goes (a
    // single LB that sees it down must not keep its ECMP share and drop it).
    expect(reportOf(viewOf((i) => (i === 0 ? { intent: 'drain' } : { health: 'down' })))).toMatchObject({ dropping: true, drained: false });
  });

  it('keeps its VIP announced, so that the connections drain keeps are not cut by a withdraw on every LB', () => {
    const facts = new Map([
      [a, { state: 'up' as const, settled: true }],
      [b, { state: 'up' as const, settled: true }],
    ]);
    const wanted = daemonWith(facts, { panic: false });
    expect(wanted().get('10.93.0.100')).toBe(true);
    wanted.daemon.lastReports = [{ name: 'web', dropping: true, drained: true, panic: false }];
    expect(wanted().get('10.93.0.100')).toBe(true);
    // Every real down (whenAllDown: drop): withdrawn, the peers or nobody take the VIP.
    wanted.daemon.lastReports = [{ name: 'web', dropping: true, drained: false, panic: false }];
    expect(wanted().get('10.93.0.100')).toBe(false);
  });
});

describe('a reload that adds a service to a VIP', () => {
  it('does not withdraw the VIP while the new service settles when the VIP is announced already; it still waits when it is not', () => {
    const facts = new Map([
      [k80, { state: 'up' as const, settled: true }],
      [k443, { state: 'down' as const, settled: false }],
    ]);
    const { inside, wanted } = twoServiceDaemon(facts, [
      { name: 'web80', dropping: false, panic: false },
      { name: 'web443', dropping: false, panic: true },
    ]);
    // web80 settled before the reload (it was the VIP's only service).
    inside.settledServices = new Set([serviceIdentity(s80)]);
    let announced = true;
    inside.announcer = { isAnnounced: () => announced };
    // Before: :443 unsettled blocked the whole VIP, so a reload on every LB took :80 off the air.
    expect(wanted()).toBe(true);
    // A VIP not on the air yet (an LB starting) waits for every service of it, as before.
    announced = false;
    expect(wanted()).toBe(false);
  });

  it('decides settling against the table the loops run: not while a rebuild is queued', () => {
    const facts = new Map([
      [k80, { state: 'up' as const, settled: true }],
      [k443, { state: 'up' as const, settled: true }],
    ]);
    // The last table is the fail-open one of the start; the facts that end it came 50 ms ago.
    const { inside, wanted } = twoServiceDaemon(facts, [
      { name: 'web80', dropping: false, panic: true },
      { name: 'web443', dropping: false, panic: true },
    ]);
    inside.rebuildQueued = true;
    // Before: settled from the live facts, announced on the fail-open report (onFailOpen: true).
    expect(wanted()).toBe(false);
    inside.rebuildQueued = false;
    inside.lastReports = [
      { name: 'web80', dropping: false, panic: false },
      { name: 'web443', dropping: false, panic: false },
    ];
    expect(wanted()).toBe(true);
  });
});
