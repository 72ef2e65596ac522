// `dsrlb plan`: the hash-space share against an independent Maglev computation, the live-flow
// counts against what an engine holding those flows actually does when the change is applied,
// and the warnings for risky edits.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Config, RealIntent } from '../../src/config/types.js';
import { formatProblems, parseConfigText } from '../../src/config/validate.js';
import { parseMac } from '../../src/control/addresses.js';
import { SnapshotBuilder, type RealView } from '../../src/control/snapshot-builder.js';
import { createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { Engine } from '../../src/dataplane/engine.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import { buildMaglevTable, countMovedSlots } from '../../src/dataplane/maglev-table.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { formatPlanJson, formatPlanText, planChange, runPlanCommand, type LiveFlows, type LiveReal, type PlanReport } from '../../src/sim/plan.js';
import { flowKeyOf, prepareTuple } from '../../src/sim/frames.js';
import { ETH_IPV4, ethernet, ipv4, tcp } from '../support/packet-builder.js';

const VIP = '203.0.113.10';
const WEB = `tcp|${VIP}|80`;
const ADDRS = ['10.0.0.11', '10.0.0.12', '10.0.0.13', '10.0.0.14', '10.0.0.15'];
const LB_MAC = '02:00:00:00:00:01';
const SYN = 0x02;
const ACK = 0x10;

interface RealSpec {
  address: string;
  weight?: number;
  state?: RealIntent;
}

function config(opts: { reals: RealSpec[]; scheduler?: string; tableSize?: number; hashSeed?: number; more?: string }): Config {
  const reals = opts.reals.map((r) => `      - { address: ${r.address}${r.weight === undefined ? '' : `, weight: ${r.weight}`}${r.state === undefined ? '' : `, state: ${r.state}`} }`);
  const text = `
interface: eth0
hashSeed: ${opts.hashSeed ?? 0}
services:
  - name: web
    vip: ${VIP}
    port: 80
    scheduler: ${opts.scheduler ?? 'maglev'}
${opts.tableSize === undefined ? '' : `    tableSize: ${opts.tableSize}\n`}    reals:
${reals.length === 0 ? '      []' : reals.join('\n')}
${opts.more ?? ''}`;
  const parsed = parseConfigText(text);
  if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
  return parsed.config;
}

const four = (): RealSpec[] => ADDRS.slice(0, 4).map((address) => ({ address }));
const web = (report: PlanReport) => report.services.find((s) => s.name === 'web')!;
const codes = (report: PlanReport) => report.warnings.map((w) => w.code);

// ---------------------------------------------------------------------------------------------
// An engine as the daemon runs it, with the test's own views: real id = index in ADDRS.

const realMac = (id: number): string => `02:00:00:00:01:${(0x10 + id).toString(16)}`;

function snapshotOf(cfg: Config, removed: readonly string[] = []): ForwardingSnapshot {
  const view = (address: string, weight: number, intent: RealIntent, isRemoved: boolean): RealView => ({
    id: ADDRS.indexOf(address),
    address,
    weight,
    intent,
    forwarding: 'l2',
    health: 'up',
    removed: isRemoved,
    mac: parseMac(realMac(ADDRS.indexOf(address))),
  });
  const views = cfg.services.map((s) => ({
    config: s,
    reals: [...s.reals.map((r) => view(r.address, r.weight, r.state, false)), ...removed.map((a) => view(a, 0, 'drain', true))],
  }));
  return new SnapshotBuilder().build(views, cfg.hashSeed, MAX_REAL_IDS).snapshot;
}

function lb(snapshot: ForwardingSnapshot) {
  const engine = new Engine({
    flowCapacity: 4096,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters: createCounters(),
    localMac: parseMac(LB_MAC),
  });
  engine.setSnapshot(snapshot);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC) });
  io.start((b) => engine.processBatch(b, 1_000_000));
  /** The real (address) a client's packet goes to. */
  const send = (flow: number, flags: number): string => {
    const src = `192.0.2.${1 + (flow % 200)}`;
    const sport = 20000 + flow;
    const frame = ethernet({ dst: LB_MAC, src: '02:00:00:00:00:0c', type: ETH_IPV4 }, ipv4({ src, dst: VIP, proto: 6, id: 1 }, tcp({ sport, dport: 80, flags, seq: 1, ack: flags & ACK ? 1 : 0 }, flags === ACK ? [1, 2, 3] : [], { src, dst: VIP })));
    const [out] = io.inject([frame]);
    if (out === undefined) throw new Error(`flow ${flow}: not forwarded`);
    return ADDRS[out[5]! - 0x10]!;
  };
  /** The flow table's contents in the shape plan takes (what the daemon's flow dump gives). */
  const liveFlows = (): LiveFlows => {
    const keys: number[] = [];
    const realAddresses: string[] = [];
    const key = new Uint32Array(FLOW_KEY_WORDS);
    for (let e = engine.flows.next(-1); e >= 0; e = engine.flows.next(e)) {
      engine.flows.readKey(e, key);
      keys.push(...key);
      realAddresses.push(ADDRS[engine.flows.realOf(e)]!);
    }
    return new Map([[WEB, { keys: Uint32Array.from(keys), realAddresses }]]);
  };
  return { engine, send, liveFlows };
}

// ---------------------------------------------------------------------------------------------

describe('plan: hash space that moves', () => {
  it('adding one real to four moves about a fifth of the Maglev space, as an independent table computation says', () => {
    const report = planChange(config({ reals: four() }), config({ reals: [...four(), { address: ADDRS[4]! }] }));
    const moved = web(report).hashSpaceMoved!;
    const toMaglev = (n: number) => ADDRS.slice(0, n).map((key, id) => ({ id, key, weight: 100 }));
    const exact = countMovedSlots(buildMaglevTable(toMaglev(4), 65537, 0), buildMaglevTable(toMaglev(5), 65537, 0)) / 65537;
    expect(moved.method).toBe('slots');
    expect(moved.tableSize).toBe(65537);
    expect(Math.abs(moved.share - exact)).toBeLessThan(0.01);
    expect(Math.abs(moved.share - 0.2)).toBeLessThan(0.01);
    expect(web(report)).toMatchObject({ change: 'changed', realsAdded: [{ address: '10.0.0.15', weight: 100, state: 'active', forwarding: 'l2' }], realsRemoved: [], eligibleReals: { before: 4, after: 5 }, liveFlows: null });
    expect(report.warnings).toEqual([]);
    expect(formatPlanText(report)).toContain(`  hash space moving: ${(moved.share * 100).toFixed(1)}% (${moved.changedSlots} of 65537 Maglev slots)\n`);
  });

  it('reports nothing moving for an unchanged config, and estimates by sampling where slots cannot be compared', () => {
    const same = planChange(config({ reals: four() }), config({ reals: four() }));
    expect(web(same)).toMatchObject({ change: 'unchanged', hashSpaceMoved: { share: 0, method: 'slots', changedSlots: 0 } });
    expect(same.warnings).toEqual([]);

    // A new seed re-hashes every flow: with four equal reals about three in four land elsewhere.
    const seeded = planChange(config({ reals: four() }), config({ reals: four(), hashSeed: 7 }));
    expect(web(seeded).hashSpaceMoved!.method).toBe('sampled');
    expect(Math.abs(web(seeded).hashSpaceMoved!.share - 0.75)).toBeLessThan(0.02);

    // Rendezvous: removing one of four moves only its quarter.
    const rendezvous = planChange(config({ reals: four(), scheduler: 'rendezvous' }), config({ reals: four().slice(1), scheduler: 'rendezvous' }));
    expect(web(rendezvous).hashSpaceMoved!.method).toBe('sampled');
    expect(Math.abs(web(rendezvous).hashSpaceMoved!.share - 0.25)).toBeLessThan(0.02);
    // No Maglev table to name a size of (the config's default tableSize used to show).
    expect(web(rendezvous).hashSpaceMoved!.tableSize).toBeNull();
    expect(web(seeded).hashSpaceMoved!.tableSize).toBe(65537);
  });
});

describe('plan: live flows, checked against an engine holding them', () => {
  // Current: four equal reals. Candidate: .12 disabled (its flows must move), .13 removed (drains,
  // keeps its flows), .14 at half weight, .15 added.
  const current = config({ reals: four() });
  const candidate = config({
    reals: [{ address: '10.0.0.11' }, { address: '10.0.0.12', state: 'disabled' }, { address: '10.0.0.14', weight: 50 }, { address: '10.0.0.15' }],
  });
  const FLOWS = 600;

  it('counts the flows that change real when the change is applied, as the engine moves them', () => {
    const a = lb(snapshotOf(current));
    const placed: string[] = [];
    for (let f = 0; f < FLOWS; f++) {
      a.send(f, SYN);
      placed.push(a.send(f, ACK));
    }
    const report = planChange(current, candidate, a.liveFlows());
    const impact = web(report).liveFlows!;

    a.engine.setSnapshot(snapshotOf(candidate, ['10.0.0.13']));
    let changed = 0;
    for (let f = 0; f < FLOWS; f++) {
      const now = a.send(f, ACK);
      if (now !== placed[f]) changed++;
      if (placed[f] === '10.0.0.13') expect(now).toBe('10.0.0.13'); // drained, not moved
    }
    expect(impact.total).toBe(FLOWS);
    expect(changed).toBe(placed.filter((r) => r === '10.0.0.12').length);
    expect(changed).toBeGreaterThan(100);
    expect(impact.changingRealNow).toBe(changed);
    expect(report.warnings.map((w) => w.message)).toContain(
      `${changed} live flows of web are on reals this change disables; they move to other reals and their connections break (drain instead to keep them)`,
    );
  });

  it('says the flows of disabled reals are dropped, not moved, when no real is left to take them', () => {
    const a = lb(snapshotOf(current));
    for (let f = 0; f < 50; f++) a.send(f, SYN);
    const allDisabled = config({ reals: four().map((r) => ({ ...r, state: 'disabled' as RealIntent })) });
    const report = planChange(current, allDisabled, a.liveFlows());
    expect(report.warnings.find((w) => w.code === 'LIVE_FLOWS_BREAK')!.message).toBe(
      '50 live flows of web are on reals this change disables; no real is left to take them: their packets are dropped and their connections break (drain instead to keep them)',
    );
  });

  it('counts the flows that would land elsewhere without their entry, as two fresh engines place them', () => {
    const a = lb(snapshotOf(current));
    for (let f = 0; f < FLOWS; f++) {
      a.send(f, SYN);
      a.send(f, ACK);
    }
    const impact = web(planChange(current, candidate, a.liveFlows())).liveFlows!;
    // A restarted LB (or an ECMP peer) has no entries: mid-stream packets go by the consistent hash.
    const before = lb(snapshotOf(current));
    const after = lb(snapshotOf(candidate, ['10.0.0.13']));
    let elsewhere = 0;
    for (let f = 0; f < FLOWS; f++) if (before.send(f, ACK) !== after.send(f, ACK)) elsewhere++;
    expect(impact.landingElsewhereWithoutEntry).toBe(elsewhere);
    expect(elsewhere).toBeGreaterThan(impact.changingRealNow);
  });

  it('counts as landing elsewhere the wlc flows whose real is not the consistent hash\'s pick, though the change moves no slot', () => {
    const cfg = config({ reals: four(), scheduler: 'wlc' });
    const a = lb(snapshotOf(cfg));
    const fresh = lb(snapshotOf(cfg)); // a restarted LB: no entries, mid-stream packets by the consistent hash
    let elsewhere = 0;
    for (let f = 0; f < 200; f++) {
      const onWlc = a.send(f, SYN);
      a.send(f, ACK);
      if (fresh.send(f, ACK) !== onWlc) elsewhere++;
    }
    const impact = web(planChange(cfg, cfg, a.liveFlows())).liveFlows!;
    expect(elsewhere).toBeGreaterThan(0);
    expect(impact).toEqual({ total: 200, changingRealNow: 0, landingElsewhereWithoutEntry: elsewhere, takenByAnotherService: 0 });
  });

  it('counts the live flows of a port-0 service on a port an exact-port service added beside it takes: they keep their reals through their entries, as in the engine', () => {
    const any = '  - { name: any, vip: 203.0.113.50, port: 0, reals: [ { address: 10.0.0.31 } ] }';
    const exact = '  - { name: alt, vip: 203.0.113.50, port: 8080, reals: [ { address: 10.0.0.32 } ] }';
    // Two live flows of the port-0 service: one to port 8080, one to port 9090.
    const keys = new Uint32Array(FLOW_KEY_WORDS * 2);
    for (const [i, vipPort] of [8080, 9090].entries()) {
      flowKeyOf(prepareTuple({ family: 4, protocol: 'tcp', clientAddress: '192.0.2.9', clientPort: 40000 + i, vip: '203.0.113.50', vipPort }), keys, i * FLOW_KEY_WORDS);
    }
    const live: LiveFlows = new Map([['tcp|203.0.113.50|0', { keys, realAddresses: ['10.0.0.31', '10.0.0.31'] }]]);
    const report = planChange(config({ reals: four(), more: any }), config({ reals: four(), more: `${any}\n${exact}` }), live);
    expect(report.services.find((s) => s.name === 'any')!.liveFlows).toEqual({ total: 2, changingRealNow: 0, landingElsewhereWithoutEntry: 1, takenByAnotherService: 1 });
    expect(report.warnings.filter((w) => w.code.startsWith('LIVE_FLOWS'))).toEqual([
      {
        code: 'LIVE_FLOWS_TAKEN',
        service: 'any',
        message:
          '1 live flow of any is on a port that another service of 203.0.113.50 takes after this change (a service on the exact port takes precedence over the port-0 one): it keeps its real through the flow table, but new connections to that port go to that service, and an LB without the flow entries (another LB after an ECMP change, this one after a crash) sends it there and its connection breaks',
      },
    ]);
    // The same change disabling the real: that flow moves (to the new service's real) and breaks.
    const anyDisabled = '  - { name: any, vip: 203.0.113.50, port: 0, reals: [ { address: 10.0.0.31, state: disabled } ] }';
    const moved = planChange(config({ reals: four(), more: any }), config({ reals: four(), more: `${anyDisabled}\n${exact}` }), live);
    expect(moved.services.find((s) => s.name === 'any')!.liveFlows).toEqual({ total: 2, changingRealNow: 2, landingElsewhereWithoutEntry: 2, takenByAnotherService: 1 });
    // A later change that leaves both services as they are: the flow an earlier change took stays
    // put and is no news (a deploy gate on warnings is not held up by old connections).
    const both = config({ reals: four(), more: `${any}\n${exact}` });
    const later = planChange(both, config({ reals: four(), more: `${any}\n${exact.replace('10.0.0.32 }', '10.0.0.32, weight: 50 }')}` }), live);
    expect(later.services.find((s) => s.name === 'any')!.liveFlows).toEqual({ total: 2, changingRealNow: 0, landingElsewhereWithoutEntry: 1, takenByAnotherService: 0 });
    expect(later.warnings.filter((w) => w.code.startsWith('LIVE_FLOWS'))).toEqual([]);
  });

  it('counts a UDP flow on a port an exact-port service took as moving when one-packet scheduling comes on for the port-0 service (its entry goes), as the engine does', () => {
    const any = (ops: boolean) => `  - { name: any, vip: 203.0.113.50, port: 0, protocol: udp, ops: ${ops}, reals: [ { address: 10.0.0.31 } ] }`;
    const exact = '  - { name: alt, vip: 203.0.113.50, port: 53, protocol: udp, reals: [ { address: 10.0.0.32 } ] }';
    const keys = new Uint32Array(FLOW_KEY_WORDS);
    flowKeyOf(prepareTuple({ family: 4, protocol: 'udp', clientAddress: '192.0.2.9', clientPort: 40000, vip: '203.0.113.50', vipPort: 53 }), keys, 0);
    const live: LiveFlows = new Map([['udp|203.0.113.50|0', { keys, realAddresses: ['10.0.0.31'] }]]);
    const before = config({ reals: four(), more: `${any(false)}\n${exact}` });
    const report = planChange(before, config({ reals: four(), more: `${any(true)}\n${exact}` }), live);
    // What the engine does is in engine.test.ts ('a service added on an exact port of a port-0 VIP').
    expect(report.services.find((s) => s.name === 'any')!.liveFlows).toEqual({ total: 1, changingRealNow: 1, landingElsewhereWithoutEntry: 1, takenByAnotherService: 0 });
  });

  it('lets the live flows of a removed service drain, as the daemon does, unless a port-0 service of its VIP takes them', () => {
    const withOld = config({ reals: four(), more: '  - { name: old, vip: 203.0.113.99, port: 80, reals: [ { address: 10.0.0.31 } ] }' });
    const key = new Uint32Array(FLOW_KEY_WORDS * 2).fill(7);
    const live: LiveFlows = new Map([['tcp|203.0.113.99|80', { keys: key, realAddresses: ['10.0.0.31', '10.0.0.31'] }]]);
    const report = planChange(withOld, config({ reals: four() }), live);
    const old = report.services.find((s) => s.name === 'old')!;
    expect(old).toMatchObject({ change: 'removed', hashSpaceMoved: null, liveFlows: { total: 2, changingRealNow: 0, landingElsewhereWithoutEntry: 2 }, removal: { drains: true, cutBecause: null } });
    expect(report.warnings).toEqual([
      { code: 'SERVICE_REMOVED', service: 'old', message: 'service old (tcp://203.0.113.99:80) is removed; 2 live flows drain on their reals, new connections to it are dropped' },
    ]);
    expect(web(report).liveFlows).toEqual({ total: 0, changingRealNow: 0, landingElsewhereWithoutEntry: 0, takenByAnotherService: 0 });
    // A port-0 service of the VIP in the candidate would lose port 80's new flows to a draining one: cut.
    const cut = planChange(withOld, config({ reals: four(), more: '  - { name: any, vip: 203.0.113.99, port: 0, reals: [ { address: 10.0.0.32 } ] }' }), live);
    expect(cut.services.find((s) => s.name === 'old')).toMatchObject({ liveFlows: { total: 2, changingRealNow: 2 }, removal: { drains: false, cutBecause: 'the port-0 service of 203.0.113.99 takes its port\'s new flows' } });
    expect(cut.warnings.find((w) => w.code === 'SERVICE_REMOVED')!.message).toBe(
      "service old (tcp://203.0.113.99:80) is removed; 2 live flows are cut at once (the port-0 service of 203.0.113.99 takes its port's new flows) and break",
    );
  });
});

describe('plan: warnings for risky edits', () => {
  it('warns when every real of a service is removed', () => {
    const report = planChange(config({ reals: four().slice(0, 2) }), config({ reals: [{ address: '10.0.0.14' }, { address: '10.0.0.15' }] }));
    expect(report.warnings).toEqual([
      { code: 'ALL_REALS_REMOVED', service: 'web', message: 'every real of web is removed (10.0.0.11, 10.0.0.12); they drain their flows and new flows go only to 10.0.0.14, 10.0.0.15' },
    ]);
    expect(web(report).hashSpaceMoved!.share).toBe(1);
  });

  it('warns when a service is left with no real for new flows, or with only one', () => {
    const none = planChange(config({ reals: four() }), config({ reals: four().map((r) => ({ ...r, state: 'disabled' as RealIntent })) }));
    expect(none.warnings).toEqual([
      {
        code: 'NO_ELIGIBLE_REAL',
        service: 'web',
        message: 'web is left with no real that takes new flows (every real is removed, drained, disabled or at weight 0): new flows are dropped',
      },
      {
        // Two files (--against): the flows are not known, the reals this change disables are.
        code: 'LIVE_FLOWS_BREAK',
        service: 'web',
        message:
          'web: 10.0.0.11, 10.0.0.12, 10.0.0.13, 10.0.0.14 are disabled by this change; for the live flows on them (not known here), no real is left to take them: their packets are dropped and their connections break (drain instead to keep them)',
      },
    ]);
    expect(web(none).eligibleReals).toEqual({ before: 4, after: 0 });
    const oneDisabled = planChange(config({ reals: four() }), config({ reals: four().map((r, i) => (i === 1 ? { ...r, state: 'disabled' as RealIntent } : r)) }));
    expect(oneDisabled.warnings.map((w) => w.message)).toEqual([
      'web: 10.0.0.12 is disabled by this change; for the live flows on it (not known here), they move to other reals and their connections break (drain instead to keep them)',
    ]);
    const one = planChange(config({ reals: four() }), config({ reals: [{ address: '10.0.0.11' }, { address: '10.0.0.12', weight: 0 }, { address: '10.0.0.13', state: 'drain' }] }));
    expect(one.warnings).toEqual([
      { code: 'SINGLE_ELIGIBLE_REAL', service: 'web', message: 'web is left with one real taking new flows (10.0.0.11); no peer takes over if it fails' },
    ]);
    const removedService = planChange(config({ reals: four(), more: '  - { name: old, vip: 203.0.113.99, port: 80, reals: [] }' }), config({ reals: four() }));
    expect(codes(removedService)).toEqual(['SERVICE_REMOVED']);
    expect(removedService.warnings[0]!.message).toBe('service old (tcp://203.0.113.99:80) is removed; its live flows (not known here) drain on their reals, new connections to it are dropped');
  });

  it('plans two configs that hold more than 8192 (service, real) pairs together, and says the daemon would refuse that reload', () => {
    const many = (second: number) => Array.from({ length: 4100 }, (_, i) => ({ address: `10.${second}.${Math.floor(i / 250)}.${(i % 250) + 1}` }));
    const report = planChange(config({ reals: many(1) }), config({ reals: many(2) }));
    expect(web(report).realsAdded).toHaveLength(4100);
    expect(report.warnings[0]).toEqual({
      code: 'REAL_IDS_SHORT',
      service: null,
      message:
        "this change adds 4100 (service, real) pairs to the 4100 the daemon holds (the reals it removes keep their ids while their flows drain): past 8192 in all the daemon refuses the reload; make it in two steps, the second once the removed reals' flows have ended, or restart",
    });
    // Within the ids: no such warning.
    expect(codes(planChange(config({ reals: many(1) }), config({ reals: many(1).slice(0, 4000) })))).not.toContain('REAL_IDS_SHORT');
  });

  it('says no TABLE_SIZE_CHANGED for a move to rendezvous (no Maglev table after it), and counts no move out of an empty table', () => {
    const toRendezvous = planChange(config({ reals: four(), tableSize: 251 }), config({ reals: four(), scheduler: 'rendezvous' }));
    expect(codes(toRendezvous)).toContain('SCHEDULER_CHANGED');
    expect(codes(toRendezvous)).not.toContain('TABLE_SIZE_CHANGED');
    // No real eligible before: nothing moves, by slots (maglev) and by samples (rendezvous) alike.
    const drained = four().map((r) => ({ ...r, state: 'drain' as RealIntent }));
    for (const scheduler of ['maglev', 'rendezvous']) {
      expect(web(planChange(config({ reals: drained, scheduler }), config({ reals: four(), scheduler }))).hashSpaceMoved!.share, scheduler).toBe(0);
    }
  });

  it('plans rendezvous -> maglev by sampling the picks (rendezvous has no table to compare slots with)', () => {
    const report = planChange(config({ reals: four(), scheduler: 'rendezvous' }), config({ reals: four() }));
    const moved = web(report).hashSpaceMoved!;
    expect(moved).toMatchObject({ method: 'sampled', changedSlots: null, samples: 65536 });
    // Two independent placements over four equal reals agree on about a quarter of the flows.
    expect(Math.abs(moved.share - 0.75)).toBeLessThan(0.02);
    expect(codes(report)).toEqual(['SCHEDULER_CHANGED']);
    expect(formatPlanText(report)).toContain(`  hash space moving: ${(moved.share * 100).toFixed(1)}% (estimated over 65536 synthetic flows)\n`);
  });

  it('warns on a new hashSeed, a new table size and a new scheduler', () => {
    expect(codes(planChange(config({ reals: four() }), config({ reals: four(), hashSeed: 1 })))).toEqual(['HASH_SEED_CHANGED']);
    const resized = planChange(config({ reals: four() }), config({ reals: four(), tableSize: 251 }));
    expect(resized.warnings).toEqual([
      {
        code: 'TABLE_SIZE_CHANGED',
        service: 'web',
        message: 'tableSize of web 65537 -> 251 builds a new Maglev table: 75.2% of its consistent-hash picks move (about (N-1)/N with N equal reals); every LB of a group must change it together',
      },
    ]);
    expect(web(resized).hashSpaceMoved!.share).toBeGreaterThan(0.6);
    const toWlc = planChange(config({ reals: four() }), config({ reals: four(), scheduler: 'wlc' }));
    expect(codes(toWlc)).toEqual(['SCHEDULER_CHANGED']);
    // wlc falls back to the same Maglev table for flows without an entry: that space does not move.
    expect(web(toWlc).hashSpaceMoved).toMatchObject({ method: 'slots', share: 0 });
    // Behind announce (several LBs, ECMP) wlc breaks the flows that move between LBs: said once,
    // when the change brings the two together.
    const announce = 'announce:\n  enabled: true\n';
    const toWlcAnnounced = planChange(config({ reals: four(), more: announce }), config({ reals: four(), scheduler: 'wlc', more: announce }));
    expect(codes(toWlcAnnounced)).toEqual(['WLC_ANNOUNCED', 'SCHEDULER_CHANGED']);
    expect(toWlcAnnounced.warnings[0]!.message).toBe(
      "web uses wlc and its VIP is announced: each LB picks new flows by its own connection counts, so a flow that ECMP moves to another LB (one failing, a route change) lands on that LB's Maglev pick and its connection breaks; use maglev or rendezvous behind several LBs",
    );
    expect(codes(planChange(config({ reals: four(), scheduler: 'wlc' }), config({ reals: four(), scheduler: 'wlc', more: announce })))).toContain('WLC_ANNOUNCED');
    expect(codes(planChange(config({ reals: four(), scheduler: 'wlc', more: announce }), config({ reals: four().slice(1), scheduler: 'wlc', more: announce })))).not.toContain('WLC_ANNOUNCED');
    // The same service (by name) at another port was wlc and announced already: nothing new to say.
    const wlcAnnounced = config({ reals: four(), scheduler: 'wlc', more: announce });
    const moved = { ...wlcAnnounced, services: wlcAnnounced.services.map((svc) => ({ ...svc, port: 8080 })) };
    const move = planChange(wlcAnnounced, moved);
    expect(web(move).addressChange).toEqual({ before: `tcp://${VIP}:80`, after: `tcp://${VIP}:8080` });
    expect(codes(move)).not.toContain('WLC_ANNOUNCED');
    // A service that keeps its VIP out of BIRD (announce: false) is not spread by ECMP; turning it on is.
    const unannounced = { ...wlcAnnounced, services: wlcAnnounced.services.map((svc) => ({ ...svc, announce: false })) };
    expect(codes(planChange(config({ reals: four(), more: announce }), unannounced))).toEqual(['SCHEDULER_CHANGED']);
    expect(codes(planChange(unannounced, wlcAnnounced))).toEqual(['WLC_ANNOUNCED']);
    const restart = planChange(config({ reals: four() }), { ...config({ reals: four() }), interface: 'eth1' });
    expect(restart.warnings).toEqual([
      { code: 'RESTART_NEEDED', service: null, message: 'a reload refuses this change; it needs a restart, and the flow table starts empty (no stateFile kept across it for the flow hand-over): interface (eth0 -> eth1)' },
    ]);
    // With a stateFile on both sides a clean stop hands the flows to the next daemon.
    const kept = { ...config({ reals: four() }), stateFile: '/var/lib/dsrlb/state.json' };
    expect(planChange(kept, { ...kept, interface: 'eth1' }).warnings).toEqual([
      { code: 'RESTART_NEEDED', service: null, message: 'a reload refuses this change; it needs a restart, and a clean restart hands the flows over to the next daemon: interface (eth0 -> eth1)' },
    ]);
    expect(planChange(kept, { ...kept, interface: 'eth1', stateFile: '/var/lib/dsrlb/other.json' }).warnings[0]!.message).toContain('the flow table starts empty');
    const loops = planChange(config({ reals: four() }), { ...config({ reals: four() }), ring: 'v2', workers: 2, cpus: [0, 1] });
    expect(loops.warnings).toEqual([
      { code: 'RESTART_NEEDED', service: null, message: 'a reload refuses this change; it needs a restart, and the flow table starts empty (no stateFile kept across it for the flow hand-over): ring (v3 -> v2), workers (1 -> 2), cpus ([] -> [0, 1])' },
    ]);
  });
});

describe('plan: what else an edit changes, one line each', () => {
  const services = (yaml: string): Config => {
    const parsed = parseConfigText(`interface: eth0\nservices:\n${yaml}`);
    if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
    return parsed.config;
  };

  it('lists an onRealDown change and says what a down real then does with its flows', () => {
    const before = services(`  - { name: web, vip: ${VIP}, port: 80, reals: [ { address: 10.0.1.1 } ] }\n`);
    const after = services(`  - { name: web, vip: ${VIP}, port: 80, onRealDown: keep, reals: [ { address: 10.0.1.1 } ] }\n`);
    expect(formatPlanText(planChange(before, after))).toContain('  onRealDown: reschedule -> keep (a real marked down keeps its flows)\n');
    expect(formatPlanText(planChange(after, before))).toContain('  onRealDown: keep -> reschedule (a real marked down loses its flows to the others)\n');
  });

  it('lists a persistence change, and estimates the new connections it moves by sampling (the table stays, the hash changes)', () => {
    const reals = '[ { address: 10.0.1.1 }, { address: 10.0.1.2 }, { address: 10.0.1.3 } ]';
    const before = services(`  - { name: web, vip: ${VIP}, port: 80, reals: ${reals} }\n`);
    const client = services(`  - { name: web, vip: ${VIP}, port: 80, persistence: client, reals: ${reals} }\n`);
    const slash24 = services(`  - { name: web, vip: ${VIP}, port: 80, persistence: client, persistencePrefix: 24, reals: ${reals} }\n`);
    const on = planChange(before, client);
    expect(formatPlanText(on)).toContain("  persistence: none -> client (a client's new connections all go to one real; live flows stay on their reals)\n");
    // A new hash over the same three reals: about two thirds of new connections land elsewhere.
    expect(web(on).hashSpaceMoved!.method).toBe('sampled');
    expect(Math.abs(web(on).hashSpaceMoved!.share - 2 / 3)).toBeLessThan(0.02);
    const narrower = planChange(client, slash24);
    expect(formatPlanText(narrower)).toContain('  persistencePrefix: 32 -> 24 (clients that share the first 24 bits share a real)\n');
    expect(Math.abs(web(narrower).hashSpaceMoved!.share - 2 / 3)).toBeLessThan(0.02);
    expect(formatPlanText(planChange(client, before))).toContain('  persistence: client -> none (each new connection is placed on its own; live flows stay on their reals)\n');
    // Off again from /24: no line about a prefix that no longer means anything.
    expect(formatPlanText(planChange(slash24, before))).not.toContain('persistencePrefix');
    const udp = (ops: string) => services(`  - { name: web, vip: ${VIP}, port: 53, protocol: udp${ops}, reals: ${reals} }\n`);
    expect(formatPlanText(planChange(udp(''), udp(', ops: true')))).toContain('  ops: false -> true (no flow entries: every datagram is placed alone, by the consistent hash of its 5-tuple)\n');
    expect(formatPlanText(planChange(udp(', ops: true'), udp('')))).toContain('  ops: true -> false (datagrams make flow entries again)\n');
    // Unchanged persistence: the slots compare as before.
    expect(web(planChange(client, client)).hashSpaceMoved).toMatchObject({ method: 'slots', share: 0 });
  });

  it('lists a forwarding switch with the reals that keep their own, a health check switched on and whenAllDown, and warns on the first two', () => {
    const report = planChange(
      services(`  - { name: web, vip: ${VIP}, port: 80, reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2 }, { address: 10.0.1.3 } ] }\n`),
      services(`  - name: web
    vip: ${VIP}
    port: 80
    forwarding: ipip
    whenAllDown: drop
    healthCheck: { type: http, path: /healthz }
    reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2 }, { address: 10.0.1.3, forwarding: l2 } ]
`),
    );
    expect(formatPlanText(report)).toBe(`web (tcp://203.0.113.10:80, maglev): changed
  forwarding: l2 -> ipip (except 10.0.1.3, which keeps l2 by its own setting)
  whenAllDown: failOpen -> drop (with no real up, flows are dropped)
  healthCheck: type none -> http, path "/" -> "/healthz" (every real stays up until its first probe decides)
  hash space moving: 0.0% (0 of 65537 Maglev slots)
live flows: not known (no running daemon asked)
warnings:
  FORWARDING_CHANGED: forwarding in web l2 -> ipip for 10.0.1.1, 10.0.1.2: their new and existing flows arrive IPIP-encapsulated, so each must decapsulate them (kernel tunnel or dsrlb decap; dsrlb-realserver check --vip 203.0.113.10 --mode ipip shows what is missing), or those connections break
  HEALTH_CHECK_ENABLED: healthCheck of web none -> http: every real stays up until its first probe, within a second, and one that fails it goes down at once (its flows move); if the probe fails everywhere (a wrong path or port), new flows are dropped (whenAllDown: drop)
`);
    // The JSON carries the same, structured.
    const active = { weight: 100, state: 'active' };
    expect(JSON.parse(formatPlanJson(report)).services[0]).toMatchObject({
      forwarding: { before: 'l2', after: 'ipip' },
      settingsChanged: [
        { setting: 'whenAllDown', before: 'failOpen', after: 'drop' },
        { setting: 'healthCheck.type', before: 'none', after: 'http' },
        { setting: 'healthCheck.path', before: '/', after: '/healthz' },
      ],
      realsChanged: [
        { address: '10.0.1.1', before: { ...active, forwarding: 'l2' }, after: { ...active, forwarding: 'ipip' } },
        { address: '10.0.1.2', before: { ...active, forwarding: 'l2' }, after: { ...active, forwarding: 'ipip' } },
      ],
      realsKeepingForwarding: ['10.0.1.3'],
      healthOnApply: 'firstProbeDecides',
    });
  });

  it('names a rename, shows added reals with their state and weight, and warns what a changed probe that fails everywhere would do', () => {
    const report = planChange(
      services(`  - { name: web, vip: ${VIP}, port: 80, healthCheck: { type: http, interval: 2s }, reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2 } ] }\n`),
      services(`  - name: www
    vip: ${VIP}
    port: 80
    healthCheck: { type: http, interval: 5s, path: /healthz }
    reals: [ { address: 10.0.1.1, weight: 50 }, { address: 10.0.1.2 }, { address: 10.0.1.3, state: drain }, { address: 10.0.1.4, weight: 0, forwarding: ipip }, { address: 10.0.1.5, state: disabled } ]
`),
    );
    expect(formatPlanText(report)).toBe(`www (tcp://203.0.113.10:80, maglev): changed
  name: web -> www (metric labels and the name CLI commands take change)
  healthCheck: path "/" -> "/healthz", interval 2s -> 5s (reals keep their state until the new probe decides otherwise)
  real +10.0.1.3: drain, weight 100 (takes no new flows)
  real +10.0.1.4: active, weight 0, forwarding ipip (takes no new flows)
  real +10.0.1.5: disabled, weight 100 (takes no flows)
  real 10.0.1.1: weight 100 -> 50
  hash space moving: 16.7% (10924 of 65537 Maglev slots)
live flows: not known (no running daemon asked)
warnings:
  HEALTH_CHECK_RESTARTS: the probe of www changes (path "/" -> "/healthz"): each real keeps its state until the new probe decides otherwise; if the new probe fails everywhere (a wrong path or port), every real goes down after 3 failed probes 5s apart and new flows go to every wanted real (panic)
`);
    expect(report.services[0]).toMatchObject({
      settingsChanged: [
        { setting: 'name', before: 'web', after: 'www' },
        { setting: 'healthCheck.path', before: '/', after: '/healthz' },
        { setting: 'healthCheck.intervalMs', before: 2000, after: 5000 },
      ],
      realsAdded: [
        { address: '10.0.1.3', weight: 100, state: 'drain', forwarding: 'l2' },
        { address: '10.0.1.4', weight: 0, state: 'active', forwarding: 'ipip' },
        { address: '10.0.1.5', weight: 100, state: 'disabled', forwarding: 'l2' },
      ],
    });
    // A rename alone keeps the probe: the daemon's health monitor keeps the reals' health.
    const renamed = planChange(
      services(`  - { name: web, vip: ${VIP}, port: 80, healthCheck: { type: tcp }, reals: [ { address: 10.0.1.1 } ] }\n`),
      services(`  - { name: www, vip: ${VIP}, port: 80, healthCheck: { type: tcp }, reals: [ { address: 10.0.1.1 } ] }\n`),
    );
    expect(renamed.services[0]!.healthOnApply).toBe('kept');
    expect(renamed.warnings).toEqual([]);
  });

  it('says reals keep their health on a timing change and are up at once when the check is switched off; lists announce and a switch back to l2', () => {
    const report = planChange(
      services(`  - { name: web, vip: ${VIP}, port: 80, forwarding: ipip, healthCheck: { type: tcp }, reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2 }, { address: 10.0.1.3, forwarding: l2 } ] }
  - { name: api, vip: 203.0.113.11, port: 443, healthCheck: { type: tcp }, reals: [ { address: 10.0.2.1 }, { address: 10.0.2.2 } ] }
`),
      services(`  - { name: web, vip: ${VIP}, port: 80, healthCheck: { type: tcp, interval: 3s, rise: 3 }, reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2, forwarding: ipip }, { address: 10.0.1.3 } ] }
  - { name: api, vip: 203.0.113.11, port: 443, announce: false, healthCheck: { type: none }, reals: [ { address: 10.0.2.1 }, { address: 10.0.2.2 } ] }
`),
    );
    expect(formatPlanText(report)).toBe(`web (tcp://203.0.113.10:80, maglev): changed
  forwarding: ipip -> l2 (except 10.0.1.2, which keeps ipip by its own setting)
  healthCheck: interval 2s -> 3s, rise 2 -> 3 (reals keep their health)
  hash space moving: 0.0% (0 of 65537 Maglev slots)
api (tcp://203.0.113.11:443, maglev): changed
  announce: true -> false
  healthCheck: type tcp -> none (every real counts as up at once)
  hash space moving: 0.0% (0 of 65537 Maglev slots)
live flows: not known (no running daemon asked)
warnings:
  FORWARDING_CHANGED: forwarding in web ipip -> l2 for 10.0.1.1: its new and existing flows arrive by MAC rewrite, so it must be on the LB's segment with the VIP on lo (dsrlb-realserver check --vip 203.0.113.10 --mode l2 shows what is missing), or those connections break
`);
    expect(report.services.map((s) => s.healthOnApply)).toEqual(['kept', 'upAtOnce']);
  });

  it('pairs a service whose port changed with its old address: to the daemon it is another service', () => {
    const report = planChange(
      services('  - { name: api, vip: 203.0.113.11, port: 443, reals: [ { address: 10.0.2.1 }, { address: 10.0.2.2 } ] }\n'),
      services('  - { name: api, vip: 203.0.113.11, port: 8443, reals: [ { address: 10.0.2.1 }, { address: 10.0.2.2 } ] }\n'),
    );
    expect(formatPlanText(report)).toBe(`api (tcp://203.0.113.11:8443, maglev): added
  address: tcp://203.0.113.11:443 -> tcp://203.0.113.11:8443 (a new service to the daemon: flows to the old address are not carried over)
  real +10.0.2.1: active, weight 100
  real +10.0.2.2: active, weight 100
  reals taking new flows: 2
api (tcp://203.0.113.11:443, maglev): removed
  address: tcp://203.0.113.11:443 -> tcp://203.0.113.11:8443 (api is added at the new address)
live flows: not known (no running daemon asked)
warnings:
  SERVICE_REMOVED: service api (tcp://203.0.113.11:443) is removed; its live flows (not known here) are cut at once (its name "api" is now another service's) and break
`);
    const change = { before: 'tcp://203.0.113.11:443', after: 'tcp://203.0.113.11:8443' };
    expect(report.services.map((s) => [s.change, s.addressChange])).toEqual([
      ['added', change],
      ['removed', change],
    ]);
  });

  it('shows a service without a name by its address form once', () => {
    const report = planChange(
      services(`  - { vip: "2001:db8::10", port: 53, protocol: udp, scheduler: rendezvous, reals: [ { address: "2001:db8::1" }, { address: "2001:db8::2" } ] }
  - { vip: "2001:db8::11", port: 53, protocol: udp, reals: [ { address: "2001:db8::1" } ] }
`),
      services('  - { vip: "2001:db8::10", port: 53, protocol: udp, scheduler: rendezvous, reals: [ { address: "2001:db8::1" }, { address: "2001:db8::2" }, { address: "2001:db8::3" } ] }\n'),
    );
    expect(formatPlanText(report)).toBe(`udp://[2001:db8::10]:53 (rendezvous): changed
  real +2001:db8::3: active, weight 100
  reals taking new flows: 2 -> 3
  hash space moving: 33.3% (estimated over 65536 synthetic flows)
udp://[2001:db8::11]:53 (maglev): removed
live flows: not known (no running daemon asked)
warnings:
  SERVICE_REMOVED: service udp://[2001:db8::11]:53 is removed; its live flows (not known here) drain on their reals, new connections to it are dropped
`);
  });

  it('words the hashSeed warning with the share it measures: about half with two reals, not almost every pick', () => {
    const two = services(`  - { name: web, vip: ${VIP}, port: 80, reals: [ { address: 10.0.1.1 }, { address: 10.0.1.2 } ] }\n`);
    const report = planChange(two, { ...two, hashSeed: 9 });
    expect(report.warnings).toEqual([
      {
        code: 'HASH_SEED_CHANGED',
        service: null,
        message:
          'hashSeed 0 -> 9 re-hashes every flow: a consistent-hash pick stays on its real only by chance, so about (N-1)/N of them move with N equal reals (measured here: 50.3% of picks move); every LB of a group must change it together, and the daemon takes it only on a restart',
      },
    ]);
    expect(formatPlanText(report)).toBe(`web (tcp://203.0.113.10:80, maglev): changed
  hash space moving: 50.3% (estimated over 65536 synthetic flows)
live flows: not known (no running daemon asked)
warnings:
  HASH_SEED_CHANGED: ${report.warnings[0]!.message}
`);
  });
});

describe('plan: the command', () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsrlb-plan-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, reals: string[]): string => {
    const path = join(dir, name);
    writeFileSync(path, `interface: eth0\nservices:\n  - name: web\n    vip: ${VIP}\n    port: 80\n    reals:\n${reals.map((a) => `      - address: ${a}`).join('\n')}\n`);
    return path;
  };

  it('prints the plan as text or JSON, and refuses invalid configs with FILE: path: message lines', async () => {
    const old = file('old.yaml', ADDRS.slice(0, 4));
    const next = file('new.yaml', ADDRS);
    const text = await runPlanCommand({ config: next, against: old });
    expect(text.exitCode).toBe(0);
    expect(text.stderr).toBe('');
    expect(text.stdout.split('\n').slice(0, 4)).toEqual([
      'web (tcp://203.0.113.10:80, maglev): changed',
      '  real +10.0.0.15: active, weight 100',
      '  reals taking new flows: 4 -> 5',
      expect.stringMatching(/^ {2}hash space moving: 20\.\d% \(\d+ of 65537 Maglev slots\)$/),
    ]);
    expect(text.stdout).toContain('live flows: not known (no running daemon asked)\nwarnings: none\n');

    const json = await runPlanCommand({ config: next, against: old, json: true });
    expect(JSON.parse(json.stdout)).toMatchObject({ liveFlowsKnown: false, services: [{ name: 'web', change: 'changed' }], warnings: [] });

    const bad = file('bad.yaml', ['10.0.0.300']);
    expect(await runPlanCommand({ config: bad, against: old })).toEqual({
      exitCode: 1,
      stdout: '',
      stderr: `${bad}: services[0].reals[0].address: "10.0.0.300" is not an IPv4 or IPv6 address (line 7, column 9)\n`,
    });
    const alone = await runPlanCommand({ config: next });
    expect(alone.exitCode).toBe(1);
    expect(alone.stderr).toBe('--against: missing; give the current config with --against OLD, or run plan where the daemon runs\n');
    // With the running daemon's config (and flows) handed in by the CLI, no --against is needed.
    const live = await runPlanCommand({ config: next, live: async () => ({ current: config({ reals: four() }), liveFlows: new Map() }) });
    expect(live.exitCode).toBe(0);
    expect(live.stdout).toContain('  live flows: 0; changing real now: 0; landing elsewhere without their entry (LB restart, ECMP peer): 0\n');
  });
});

describe('plan against the daemon view: the intent and health in force', () => {
  // web with a tcp check; `reals` as config text, e.g. '{ address: 10.0.0.11, state: drain }'.
  const checked = (reals: string[], check = '{ type: tcp }', whenAllDown = 'failOpen'): Config => {
    const parsed = parseConfigText(`interface: eth0\nservices:\n  - { name: web, vip: ${VIP}, port: 80, whenAllDown: ${whenAllDown}, healthCheck: ${check}, reals: [ ${reals.join(', ')} ] }\n`);
    if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
    return parsed.config;
  };
  const addr = (address: string, more = ''): string => `{ address: ${address}${more} }`;
  const live = (address: string, state: RealIntent = 'active', weight = 100, up = true): LiveReal => ({ identity: WEB, service: 'web', address, state, weight, up, removed: false });
  const fourUp = (): LiveReal[] => ADDRS.slice(0, 4).map((a) => live(a));

  it('keeps operator overrides the candidate does not touch: the review case (11 drained, 12 disabled, then 13 set to drain) leaves no real', () => {
    const current = checked(ADDRS.slice(0, 3).map((a) => addr(a)));
    const candidate = checked([addr(ADDRS[0]!), addr(ADDRS[1]!), addr(ADDRS[2]!, ', state: drain')]);
    const view = [live(ADDRS[0]!, 'drain'), live(ADDRS[1]!, 'disabled'), live(ADDRS[2]!)];
    const report = planChange(current, candidate, undefined, view);
    expect(web(report).eligibleReals).toEqual({ before: 1, after: 0 });
    expect(web(report).intentDropped).toEqual([]);
    expect(report.liveRealsKnown).toBe(true);
    expect(report.warnings).toEqual([
      {
        code: 'NO_ELIGIBLE_REAL',
        service: 'web',
        message: 'web is left with no real that takes new flows (every real is removed, drained, disabled, at weight 0 or down, by the intent and health in force): new flows are dropped',
      },
    ]);
    // From the config text alone the same edit looks harmless: 3 -> 2 reals, no warning.
    const fromText = planChange(current, candidate);
    expect(web(fromText).eligibleReals).toEqual({ before: 3, after: 2 });
    expect(fromText.liveRealsKnown).toBe(false);
    expect(codes(fromText)).toEqual([]);
  });

  it('warns when the candidate removes every real but the one the operator drained', () => {
    const report = planChange(checked(ADDRS.slice(0, 4).map((a) => addr(a))), checked([addr(ADDRS[0]!)]), undefined, [live(ADDRS[0]!, 'drain'), ...fourUp().slice(1)]);
    expect(web(report).eligibleReals).toEqual({ before: 3, after: 0 });
    expect(codes(report)).toEqual(['NO_ELIGIBLE_REAL']);
  });

  it('drops an override when the candidate changes that real, as a reload does, and lists it', () => {
    const current = checked(ADDRS.slice(0, 2).map((a) => addr(a)));
    const candidate = checked([addr(ADDRS[0]!, ', weight: 50'), addr(ADDRS[1]!)]);
    const report = planChange(current, candidate, undefined, [live(ADDRS[0]!, 'drain'), live(ADDRS[1]!, 'disabled', 0)]);
    // 10.0.0.11 is set in the candidate: its drain goes and it takes flows; 10.0.0.12 stays disabled.
    expect(web(report).intentDropped).toEqual([{ address: ADDRS[0], state: 'drain', weight: 100 }]);
    expect(web(report).eligibleReals).toEqual({ before: 0, after: 1 });
    expect(codes(report)).toEqual(['SINGLE_ELIGIBLE_REAL']);
    expect(formatPlanText(report)).toContain('  real 10.0.0.11: operator intent in force (drain, weight 100) is dropped: this change sets the real in the config\n');
  });

  it('counts down reals as out: removing the only real that is up leaves none (failOpen panics onto down reals, drop drops)', () => {
    const view = [live(ADDRS[0]!), live(ADDRS[1]!, 'active', 100, false), live(ADDRS[2]!, 'active', 100, false)];
    const reals = ADDRS.slice(0, 3).map((a) => addr(a));
    const failOpen = planChange(checked(reals), checked(reals.slice(1)), undefined, view);
    expect(web(failOpen).eligibleReals).toEqual({ before: 1, after: 0 });
    expect(failOpen.warnings.map((w) => w.message)).toEqual([
      'web is left with no real that takes new flows (every real is removed, drained, disabled, at weight 0 or down, by the intent and health in force): whenAllDown failOpen sends new flows to the active reals that are down (panic)',
    ]);
    const drop = planChange(checked(reals, undefined, 'drop'), checked(reals.slice(1), undefined, 'drop'), undefined, view);
    expect(drop.warnings.map((w) => w.message)).toEqual([
      'web is left with no real that takes new flows (every real is removed, drained, disabled, at weight 0 or down, by the intent and health in force): new flows are dropped',
    ]);
    // Nothing changes, but nothing is up now either: said so.
    const down = view.map((r) => ({ ...r, up: false }));
    expect(planChange(checked(reals), checked(reals), undefined, down).warnings.map((w) => w.message)).toEqual([
      'web is left with no real that takes new flows (every real is removed, drained, disabled, at weight 0 or down, by the intent and health in force; it has none now either): whenAllDown failOpen sends new flows to the active reals that are down (panic)',
    ]);
  });

  it('keeps health over a changed probe, forgets it when the check is switched off: those reals count as up', () => {
    const reals = ADDRS.slice(0, 2).map((a) => addr(a));
    const view = [live(ADDRS[0]!, 'active', 100, false), live(ADDRS[1]!, 'active', 100, false)];
    const retimed = planChange(checked(reals), checked(reals, '{ type: tcp, interval: 5s }'), undefined, view);
    expect(web(retimed).healthOnApply).toBe('kept');
    expect(web(retimed).eligibleReals).toEqual({ before: 0, after: 0 });
    const restarted = planChange(checked(reals), checked(reals, '{ type: tcp, port: 8080 }'), undefined, view);
    expect(web(restarted).healthOnApply).toBe('newProbe');
    expect(web(restarted).eligibleReals).toEqual({ before: 0, after: 0 });
    // Both reals were down and stay so under the new probe until it passes rise times.
    expect(codes(restarted).sort()).toEqual(['HEALTH_CHECK_RESTARTS', 'NO_ELIGIBLE_REAL']);
    const off = planChange(checked(reals), checked(reals, '{ type: none }'), undefined, view);
    expect(web(off).eligibleReals).toEqual({ before: 0, after: 2 });
    expect(codes(off)).toEqual([]);
  });

  it('onRealDown keep -> reschedule: the flows kept on a down real change real now, and the warning says why (no drain keeps them)', () => {
    const keep = config({ reals: four() }).services[0]!;
    const cfg: Config = { ...config({ reals: four() }), services: [{ ...keep, onRealDown: 'keep' }] };
    const a = lb(snapshotOf(cfg));
    for (let f = 0; f < 200; f++) a.send(f, SYN);
    const flows = a.liveFlows();
    const onFirst = flows.get(WEB)!.realAddresses.filter((x) => x === ADDRS[0]).length;
    const view = [live(ADDRS[0]!, 'active', 100, false), ...fourUp().slice(1)];
    const report = planChange(cfg, config({ reals: four() }), flows, view);
    expect(web(report).liveFlows!.changingRealNow).toBe(onFirst);
    expect(report.warnings.find((w) => w.code === 'LIVE_FLOWS_BREAK')!.message).toBe(
      `${onFirst} live flows of web are on reals that are down (onRealDown keep -> reschedule moves their flows) or that this change disables; they move to other reals and their connections break`,
    );
  });

  it('ops false -> true: live flows whose hash picks another real change real now (no entry is looked up), and the warning says why', () => {
    const udp = (ops: boolean): Config => {
      const parsed = parseConfigText(`interface: eth0\nservices:\n  - { name: dns, vip: ${VIP}, port: 53, protocol: udp, ops: ${ops}, reals: [${ADDRS.slice(0, 3).map((a) => `{ address: ${a} }`).join(', ')}] }\n`);
      if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
      return parsed.config;
    };
    // 300 live UDP flows, all on the first real (as placed before a reload that moved the others).
    const keys = new Uint32Array(300 * FLOW_KEY_WORDS);
    for (let f = 0; f < 300; f++) {
      const k = f * FLOW_KEY_WORDS;
      keys[k] = 17 | (4 << 8);
      keys[k + 1] = (0xc6336400 + f) >>> 0;
      keys[k + 5] = 0xcb00710a;
      keys[k + 9] = ((20000 + f) << 16 | 53) >>> 0;
    }
    const flows: LiveFlows = new Map([[`udp|${VIP}|53`, { keys, realAddresses: Array.from({ length: 300 }, () => ADDRS[0]!) }]]);
    const on = planChange(udp(false), udp(true), flows);
    const moved = on.services[0]!.liveFlows!.changingRealNow;
    expect(moved).toBeGreaterThan(100);
    expect(moved).toBeLessThan(300);
    expect(on.warnings.find((w) => w.code === 'LIVE_FLOWS_BREAK')!.message).toBe(
      `${moved} live flows of dns are on reals their hash no longer picks, and ops false -> true looks up no flow entry; they move to other reals and their connections break (their next datagrams go where the consistent hash puts them)`,
    );
    // Without the switch their entries keep them: nothing changes real.
    expect(planChange(udp(false), udp(false), flows).services[0]!.liveFlows!.changingRealNow).toBe(0);
  });

  it('counts as changing real now only the flows this change moves, not those on a real already down', () => {
    const cfg = config({ reals: four() });
    const a = lb(snapshotOf(cfg));
    for (let f = 0; f < 200; f++) a.send(f, SYN);
    const flows = a.liveFlows();
    const onFirst = flows.get(WEB)!.realAddresses.filter((x) => x === ADDRS[0]).length;
    const onSecond = flows.get(WEB)!.realAddresses.filter((x) => x === ADDRS[1]).length;
    // 10.0.0.11 is down now; the candidate disables 10.0.0.12.
    const view = [live(ADDRS[0]!, 'active', 100, false), ...fourUp().slice(1)];
    const candidate = config({ reals: [four()[0]!, { address: ADDRS[1]!, state: 'disabled' }, ...four().slice(2)] });
    expect(web(planChange(cfg, candidate, flows, view)).liveFlows!.changingRealNow).toBe(onSecond);
    expect(web(planChange(cfg, candidate, flows)).liveFlows!.changingRealNow).toBe(onSecond);
    expect(onFirst).toBeGreaterThan(0);
    // 10.0.0.12 not proven up yet (health unknown): it keeps its flows, so disabling it moves them.
    const unproven = [live(ADDRS[0]!, 'active', 100, false), { ...live(ADDRS[1]!, 'active', 100, false), health: 'unknown' as const }, ...fourUp().slice(2)];
    expect(web(planChange(cfg, candidate, flows, unproven)).liveFlows!.changingRealNow).toBe(onSecond);
    // Without the fact (a daemon that sends only `up`), it counts as down: already moving, none.
    const upOnly = [live(ADDRS[0]!, 'active', 100, false), live(ADDRS[1]!, 'active', 100, false), ...fourUp().slice(2)];
    expect(web(planChange(cfg, candidate, flows, upOnly)).liveFlows!.changingRealNow).toBe(0);
  });
});
