// Backup reals (`backup: true`, HAProxy's backup servers, keepalived's sorry_server): they take new
// flows only while no other real of the service can, and in a failOpen panic only when no other
// real is wanted; their flows stay when the others come back. The real snapshot builder and
// consistent picks, with views as the daemon makes them.

import { describe, expect, it } from 'vitest';
import type { ServiceConfig } from '../../src/config/types.js';
import { formatProblems, parseConfigText } from '../../src/config/validate.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { consistentPick, midStreamPick } from '../../src/dataplane/consistent-pick.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { formatStatus } from '../../src/cli/status-table.js';
import { formatPlanText, planChange } from '../../src/sim/plan.js';
import type { HealthFact } from '../../src/health/eligibility.js';

const A = '10.0.0.1';
const B = '10.0.0.2';
const SORRY = '10.0.0.9';

function config(extra = '', sorry = `{ address: ${SORRY}, backup: true }`) {
  const parsed = parseConfigText(`interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80${extra}, reals: [{ address: ${A} }, { address: ${B} }, ${sorry}] }\n`);
  if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
  return parsed.config;
}

const ID: Record<string, number> = { [A]: 0, [B]: 1, [SORRY]: 2, '10.0.0.8': 3 };

function build(cfg: ServiceConfig, health: (a: string) => HealthFact, intent: (a: string) => 'active' | 'drain' | 'disabled' = () => 'active') {
  const views: ServiceView[] = [
    { config: cfg, reals: cfg.reals.map((r) => ({ id: ID[r.address]!, address: r.address, weight: r.weight, intent: intent(r.address), forwarding: r.forwarding, health: health(r.address), removed: false, mac: new Uint8Array(6), backup: r.backup })) },
  ];
  const r = new SnapshotBuilder().build(views, 0, MAX_REAL_IDS);
  const picks = new Set<number>();
  const mid = new Set<number>();
  for (let h = 0; h < 2000; h++) {
    picks.add(consistentPick(r.snapshot, 0, Math.imul(h, 0x9e3779b1)));
    mid.add(midStreamPick(r.snapshot, 0, Math.imul(h, 0x9e3779b1)));
  }
  return { report: r.services[0]!, picks: [...picks].sort(), mid: [...mid].sort(), keeps: (a: string) => r.snapshot.realKeepExisting[ID[a]!] === 1 };
}

describe('backup reals', () => {
  const cfg = config().services[0]!;

  it('take no new flow while another real can take one', () => {
    const b = build(cfg, () => 'up');
    expect(b.picks).toEqual([0, 1]);
    expect(b.report).toMatchObject({ onBackups: false, dropping: false, panic: false });
    // The backup is up and keeps flows it has (placed while it was the only one).
    expect(b.keeps(SORRY)).toBe(true);
    // One other real is enough.
    expect(build(cfg, (a) => (a === A ? 'down' : 'up')).picks).toEqual([1]);
  });

  it('take every new flow once the other reals are down, drained or disabled, and say so', () => {
    const down = build(cfg, (a) => (a === SORRY ? 'up' : 'down'));
    expect(down.picks).toEqual([2]);
    expect(down.report).toMatchObject({ onBackups: true, panic: false, dropping: false });
    const drained = build(cfg, () => 'up', (a) => (a === A ? 'drain' : a === B ? 'disabled' : 'active'));
    expect(drained.picks).toEqual([2]);
    expect(drained.keeps(A)).toBe(true); // a drained real keeps its flows, as ever
    expect(drained.keeps(B)).toBe(false);
  });

  it('not proven yet, take no packet without an entry (a UDP flow, a mid-stream TCP packet) while the others take new flows', () => {
    // A backup added by a reload, or one that answers its first probe after the others at start.
    const late = build(cfg, (a) => (a === SORRY ? 'unknown' : 'up'));
    expect([late.picks, late.mid]).toEqual([[0, 1], [0, 1]]);
    // While the backups are what takes new flows, an unproven one is among them, as any real.
    const onBackups = build(config('', `{ address: ${SORRY}, backup: true }, { address: 10.0.0.8, backup: true }`).services[0]!, (a) => (a === SORRY ? 'unknown' : a === '10.0.0.8' ? 'up' : 'down'));
    expect(onBackups.mid).toContain(2);
  });

  it('in a failOpen panic (no real up, or none proven yet at start) are left out while another real is wanted', () => {
    const start = build(cfg, () => 'unknown');
    expect(start.picks).toEqual([0, 1]);
    expect(start.report.panic).toBe(true);
    const allDown = build(cfg, () => 'down');
    expect(allDown.picks).toEqual([0, 1]);
    // As every wanted real in a panic, the backup keeps the flows it has (the checks may be what is wrong).
    expect(allDown.keeps(SORRY)).toBe(true);
    // Only the backup wanted: it is the panic's only real.
    expect(build(cfg, () => 'down', (a) => (a === SORRY ? 'active' : 'disabled')).picks).toEqual([2]);
    // whenAllDown: drop and the backup down too: nothing takes new flows.
    const drop = build(config(', whenAllDown: drop').services[0]!, () => 'down');
    expect(drop.report).toMatchObject({ dropping: true, onBackups: false });
  });

  it('are a config flag, shown in status and plan', () => {
    expect(config().services[0]!.reals.map((r) => r.backup)).toEqual([false, false, true]);
    const bad = parseConfigText(`interface: eth0\nservices:\n  - { vip: 203.0.113.10, port: 80, reals: [{ address: ${A}, backup: yes please }] }\n`);
    expect(bad.ok ? [] : bad.problems.map((p) => `${p.path}: ${p.message}`)).toEqual(['services[0].reals[0].backup: "yes please" is not true or false']);
    const real = (address: string, backup: boolean) => ({ address, forwarding: 'l2', weight: 100, intent: 'active', backup, removed: false, health: { state: 'up', since: '2026-12-03T12:00:00Z', lastError: null }, activeFlows: 0, inactiveFlows: 0, pps: 0, bytesPerSecond: 0 });
    const text = formatStatus({ services: [{ name: 'web', protocol: 'tcp', vip: '203.0.113.10', port: 80, scheduler: 'maglev', forwarding: 'l2', panic: false, onBackups: true, dropping: false, reals: [real(A, false), real(SORRY, true)] }] }, Date.parse('2026-12-03T12:00:30Z'));
    expect(text).toMatch(/web +ON_BACKUPS/);
    expect(text).toMatch(/-> 10\.0\.0\.9:80 +l2 +100 +active backup +up 30s/);
    const without = config('', `{ address: ${SORRY} }`);
    expect(formatPlanText(planChange(without, config()))).toContain(`  real ${SORRY}: now a backup (new flows only while no other real can take them)\n`);
    const noSorry = parseConfigText(`interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, reals: [{ address: ${A} }, { address: ${B} }] }\n`);
    if (!noSorry.ok) throw new Error('config');
    expect(formatPlanText(planChange(noSorry.config, config()))).toContain(`  real +${SORRY}: active, weight 100, backup\n`);
    // plan counts backups apart: every other real disabled, or one left.
    const disabled = config('', `{ address: ${SORRY}, backup: true }`);
    const bothOff = parseConfigText(`interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, reals: [{ address: ${A}, state: disabled }, { address: ${B}, state: disabled }, { address: ${SORRY}, backup: true }] }\n`);
    const oneLeft = parseConfigText(`interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, reals: [{ address: ${A} }, { address: ${B}, state: disabled }, { address: ${SORRY}, backup: true }] }\n`);
    if (!bothOff.ok || !oneLeft.ok) throw new Error('config');
    expect(planChange(disabled, bothOff.config).warnings.map((w) => w.message)).toContainEqual(expect.stringMatching(/^web is left with no real but its backups that takes new flows \(every other real is .*\): new flows go to its backup \(10\.0\.0\.9\)$/));
    expect(planChange(disabled, oneLeft.config).warnings.map((w) => w.message)).toContain('web is left with one real taking new flows (10.0.0.1); only its backups take over if it fails');
  });
});
