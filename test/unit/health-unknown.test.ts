// A real whose probes have not decided yet (at start, or added by a reload) is 'unknown' until its
// first probe (within a second): it takes no new flows, but keeps the flows it has. As 'down', the
// first real to prove up took every other real's established connections (rescheduled: broken),
// and with whenAllDown: drop their packets were dropped until then. A reload that changes the
// probe keeps what the old one decided. No root, no loop: the daemon with a manual clock, a fake
// prober and the loops stood in for.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { stubbedDaemon } from '../support/stubbed-daemon.js';
import { parseConfigText } from '../../src/config/validate.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import { eligibility } from '../../src/health/eligibility.js';
import { HealthMonitor } from '../../src/health/health-monitor.js';
import { OK, type Prober } from '../../src/health/probe.js';
import { ManualClock } from '../support/manual-clock.js';

describe('eligibility', () => {
  it('keeps the flows of a real not proven up yet, gives it no new ones, and moves a confirmed-down real\'s', () => {
    const active = { intent: 'active', weight: 1, removed: false } as const;
    expect(eligibility({ ...active, health: 'up' })).toBe('new');
    expect(eligibility({ ...active, health: 'unknown' })).toBe('existing');
    expect(eligibility({ ...active, health: 'down' })).toBe('none');
    expect(eligibility({ ...active, intent: 'drain', health: 'unknown' })).toBe('existing');
    expect(eligibility({ ...active, intent: 'disabled', health: 'unknown' })).toBe('none');
  });

  it('with onRealDown keep, a down real keeps its flows and takes no new ones; a disabled one still loses them', () => {
    const active = { intent: 'active', weight: 1, removed: false } as const;
    expect(eligibility({ ...active, health: 'down' }, 'keep')).toBe('existing');
    expect(eligibility({ ...active, health: 'down' }, 'reschedule')).toBe('none');
    expect(eligibility({ ...active, health: 'up' }, 'keep')).toBe('new');
    expect(eligibility({ ...active, intent: 'disabled', health: 'down' }, 'keep')).toBe('none');
  });
});

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-unknown-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function configText(path: string, whenAllDown: string): string {
  return `interface: eth0
stateFile: ${join(dir, 'state.json')}
services:
  - name: web
    vip: 10.99.0.100
    port: 80
    whenAllDown: ${whenAllDown}
    healthCheck: { type: http, path: ${path}, interval: 1s, timeout: 500ms, rise: 2, fall: 3 }
    reals: [{ address: 10.0.0.1 }, { address: 10.0.0.2 }, { address: 10.0.0.3 }]
`;
}

/** A daemon whose three reals all answer their probes, first probes at 0, 0.5 and 0.9 of the interval. */
function daemonWithHealthyReals(whenAllDown: string, dead: readonly string[] = []) {
  const file = join(dir, 'dsrlb.yaml');
  const snapshots: ForwardingSnapshot[] = [];
  const { daemon, inside: stubbed } = stubbedDaemon(file, configText('/healthz', whenAllDown), {
    activeFlows: 1,
    broadcast: (m) => void (m.type === 'snapshot' && snapshots.push(m.snapshot)),
  });
  const inside = stubbed as typeof stubbed & { health: HealthMonitor; reals: Map<string, { id: number }> };
  const clock = new ManualClock(1_000_000);
  const offsets = [0, 0.5, 0.9];
  let k = 0;
  const prober: Prober = { probe: async (t) => (dead.includes(t.address) ? { ok: false, reason: 'refused', detail: 'connection refused' } : OK) };
  inside.health.stop();
  inside.health = new HealthMonitor({ clock, random: () => offsets[k++ % 3]!, probers: { http: prober } });
  inside.health.on('change', () => daemon.rebuild('health'));
  (inside.syncReals as () => void).call(daemon);
  daemon.rebuild('start');
  const ids = [...inside.reals.values()].map((r) => r.id);
  /** realKeepExisting of the three reals in the last snapshot, e.g. "111", and the service's new-flow candidates and drop flag. */
  const view = () => {
    const s = snapshots.at(-1)!;
    return { keep: ids.map((i) => s.realKeepExisting[i]).join(''), candidates: s.svcCandCount[0], dropAll: s.svcDropAll[0] };
  };
  /** Every distinct view over `ms`, in 100 ms steps. */
  const watch = async (ms: number) => {
    const seen: string[] = [];
    for (let t = 0; t < ms; t += 100) {
      await clock.advance(100);
      const v = JSON.stringify(view());
      if (seen.at(-1) !== v) seen.push(v);
    }
    return seen.map((v) => JSON.parse(v) as ReturnType<typeof view>);
  };
  const reloadWithPath = async (path: string) => {
    writeFileSync(file, configText(path, whenAllDown));
    k = 0;
    return daemon.reload();
  };
  return { daemon, inside, view, watch, reloadWithPath };
}

describe('reals whose probes have not decided yet', () => {
  for (const whenAllDown of ['failOpen', 'drop']) {
    it(`keep their flows at start, each is decided by its first probe, and a reload that changes the probe keeps what was decided (whenAllDown: ${whenAllDown})`, async () => {
      const d = daemonWithHealthyReals(whenAllDown);
      try {
        const start = await d.watch(1000);
        // Every real keeps its flows throughout; new flows go to the reals proven up as they prove
        // up, each at its first probe (0, 0.5 and 0.9 s): all three within the first second.
        expect(start.every((v) => v.keep === '111'), JSON.stringify(start)).toBe(true);
        expect(start.map((v) => v.candidates)).toEqual([1, 2, 3]);
        expect(start.at(-1)).toEqual({ keep: '111', candidates: 3, dropAll: 0 });
        expect((await d.reloadWithPath('/health')).ok).toBe(true);
        const after = await d.watch(3000);
        // Before: the new probe restarted every real as unknown: no candidates (drop: every new flow
        // dropped and the VIP withdrawn on every LB; failOpen: panic, dead reals included), then
        // the first real up took every new flow.
        expect(after, JSON.stringify(after)).toEqual([{ keep: '111', candidates: 3, dropAll: 0 }]);
      } finally {
        d.inside.health.stop();
      }
    });
  }

  it('lose them once their first probe fails (unknown -> down is a change, the snapshot follows)', async () => {
    const d = daemonWithHealthyReals('failOpen', ['10.0.0.3']);
    try {
      const views = await d.watch(1000);
      expect(views.at(-1)).toEqual({ keep: '110', candidates: 2, dropAll: 0 });
      // Kept while unproven, moved once confirmed down: at its first probe (0.9 s), not after fall
      // failures (3 s, with new flows going to the dead real in a fail-open panic until the first real proved up).
      expect(views[0]!.keep).toBe('111');
      expect(views).toEqual([
        { keep: '111', candidates: 1, dropAll: 0 },
        { keep: '111', candidates: 2, dropAll: 0 },
        { keep: '110', candidates: 2, dropAll: 0 },
      ]);
    } finally {
      d.inside.health.stop();
    }
  });
});

describe('a failOpen service none of whose reals has been probed yet (at start)', () => {
  const viewOf = (health: readonly ('up' | 'down' | 'unknown')[]): ServiceView => {
    const parsed = parseConfigText(`interface: eth0
services:
  - { name: web, vip: 10.93.0.100, port: 80, whenAllDown: failOpen, reals: [{ address: 10.93.0.11 }, { address: 10.93.0.12 }] }
`);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    const s = parsed.config.services[0]!;
    return { config: s, reals: s.reals.map((r, i) => ({ id: i, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: health[i]!, removed: false, mac: new Uint8Array(6) })) };
  };
  const reportOf = (health: readonly ('up' | 'down' | 'unknown')[]) => new SnapshotBuilder().build([viewOf(health)], 0, MAX_REAL_IDS).services[0]!;

  it('sends new flows to every wanted real, as HAProxy and keepalived start servers up, without reporting a panic (nothing failed)', () => {
    // Before: reported as a panic at every start until the first probe (the metric, and the log's "no real is up").
    expect(reportOf(['unknown', 'unknown'])).toMatchObject({ panic: true, unproven: true, dropping: false, candidates: [0, 1] });
  });

  it('is in a reported panic once a real was seen down and none is up', () => {
    expect(reportOf(['unknown', 'down'])).toMatchObject({ panic: true, unproven: false, dropping: false, candidates: [0, 1] });
    expect(reportOf(['down', 'down'])).toMatchObject({ panic: true, unproven: false, dropping: false, candidates: [0, 1] });
    expect(reportOf(['unknown', 'up'])).toMatchObject({ panic: false, unproven: false, candidates: [1] });
  });

  it('is no panic for the daemon: no "no real is up" log line, dsrlb_service_panic 0', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-test-unproven-'));
    const lines: string[] = [];
    try {
      const d = stubbedDaemon(join(dir, 'dsrlb.yaml'), `interface: eth0
tunnel: { sourceV4: 10.93.255.1 }
announce: { enabled: false }
services:
  - { name: web, vip: 10.93.0.100, port: 80, whenAllDown: failOpen, healthCheck: { type: tcp, interval: 10s }, reals: [{ address: 10.93.0.11 }, { address: 10.93.0.12 }] }
`, { activeFlows: 0, log: (l) => lines.push(l) });
      const inside = d.inside as { syncReals(): void; rebuild(why: string): void; lastReports: { panic: boolean; unproven: boolean }[] };
      inside.syncReals();
      inside.rebuild('start');
      expect(inside.lastReports[0]).toMatchObject({ panic: true, unproven: true });
      expect(lines.filter((l) => l.includes('no real is up'))).toEqual([]);
      expect(await d.daemon.metrics.text()).toMatch(/^dsrlb_service_panic\{service="web"\} 0$/m);
      d.daemon.health.stop();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
