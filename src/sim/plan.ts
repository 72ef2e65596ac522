// `dsrlb plan`: what a config change would do before it is made. Builds the forwarding snapshots of
// the current and the candidate config with the daemon's SnapshotBuilder (every real assumed up,
// intent from the config) and reads off, per service, the hash space that moves and the live flows
// that would change real, plus warnings for edits that are easy to regret.

import { consistentPick } from '../dataplane/consistent-pick.js';
import type { Config, ConfigProblem, ServiceConfig } from '../config/types.js';
import { loadConfigFile } from '../config/load.js';
import { restartOnlyChanges } from '../config/restart-keys.js';
import { serviceAddressName } from '../config/validate.js';
import { RealRegistry } from '../control/real-registry.js';
import { SnapshotBuilder, type BuildResult } from '../control/snapshot-builder.js';
import { MAX_REAL_IDS } from '../dataplane/counters.js';
import { FLOW_KEY_WORDS, flowHash, mix32 } from '../dataplane/flow-hash.js';
import { flowKeyOf, prepareTuple } from './frames.js';
import { initialServiceStates, serviceIdentity, viewsOf, type ServiceState } from './service-views.js';
import type { CommandOutput } from './simulate.js';

/** Live flows of one service, as the packet loop's flow table holds them. */
export interface LiveFlowSet {
  /** FLOW_KEY_WORDS words per flow, in the flow table's key layout (FlowTable.readKey). */
  readonly keys: Uint32Array;
  /** The real each flow is on, by address; realAddresses[i] belongs to the i-th key. */
  readonly realAddresses: readonly string[];
}

/** Live flows by service identity (`tcp|203.0.113.10|80`, see serviceIdentity). */
export type LiveFlows = ReadonlyMap<string, LiveFlowSet>;

export type ServiceChange = 'added' | 'removed' | 'changed' | 'unchanged';

export interface RealChange {
  readonly address: string;
  readonly before: { readonly weight: number; readonly state: string };
  readonly after: { readonly weight: number; readonly state: string };
}

export interface HashSpaceMove {
  /** Fraction (0..1) of the consistent-hash space whose real changes. */
  readonly share: number;
  /**
   * `slots`: exact, changed Maglev slots / table size (same table size and seed before and after).
   * `sampled`: estimated over synthetic flows, where slots cannot be compared (rendezvous, a new
   * table size, a new hashSeed, a scheduler switch between rendezvous and a Maglev-table one).
   */
  readonly method: 'slots' | 'sampled';
  readonly changedSlots: number | null;
  readonly tableSize: number;
  readonly samples: number | null;
}

export interface LiveFlowImpact {
  readonly total: number;
  /**
   * Flows that change real as soon as the change is applied: their real becomes disabled (a drain,
   * a removal or weight 0 keeps flows; only disabled does not), or their service goes away.
   */
  readonly changingRealNow: number;
  /**
   * Flows whose consistent-hash real changes: where they would land if they arrived without their
   * flow entry, as after an LB restart or on another LB of an ECMP group.
   */
  readonly landingElsewhereWithoutEntry: number;
}

export interface ServicePlan {
  readonly name: string;
  /** The CLI's address form, tcp://VIP:PORT. */
  readonly address: string;
  readonly change: ServiceChange;
  readonly scheduler: { readonly before: string | null; readonly after: string | null };
  readonly realsAdded: readonly string[];
  readonly realsRemoved: readonly string[];
  readonly realsChanged: readonly RealChange[];
  /** Reals taking new flows (every real assumed up). */
  readonly eligibleReals: { readonly before: number | null; readonly after: number | null };
  /** Null for an added or removed service. */
  readonly hashSpaceMoved: HashSpaceMove | null;
  /** Null when live flows were not given. */
  readonly liveFlows: LiveFlowImpact | null;
}

export type PlanWarningCode =
  | 'NO_ELIGIBLE_REAL'
  | 'SINGLE_ELIGIBLE_REAL'
  | 'ALL_REALS_REMOVED'
  | 'SERVICE_REMOVED'
  | 'LIVE_FLOWS_BREAK'
  | 'HASH_SEED_CHANGED'
  | 'TABLE_SIZE_CHANGED'
  | 'SCHEDULER_CHANGED'
  | 'RESTART_NEEDED';

export interface PlanWarning {
  readonly code: PlanWarningCode;
  /** The service's name, or null for a config-wide warning. */
  readonly service: string | null;
  readonly message: string;
}

export interface PlanReport {
  readonly liveFlowsKnown: boolean;
  readonly services: readonly ServicePlan[];
  readonly warnings: readonly PlanWarning[];
}

/** Synthetic flows per service when the hash space cannot be compared slot by slot. */
export const PLAN_SAMPLES = 65536;

/**
 * The plan for going from `current` to `candidate`. `liveFlows` (from the running daemon) adds the
 * live-flow counts; without it they are null. Deterministic and free of I/O.
 */
export function planChange(current: Config, candidate: Config, liveFlows?: LiveFlows): PlanReport {
  const registry = new RealRegistry(MAX_REAL_IDS);
  const builder = new SnapshotBuilder();
  const before = initialServiceStates(current.services);
  const after = initialServiceStates(candidate.services);
  // Reals that hold live flows but are in neither config were removed earlier and still drain in
  // the daemon; in the new config so are the reals this change removes. Both are views with
  // removed: true, exactly as the daemon keeps them.
  for (const state of before) addRemoved(state, liveFlows?.get(state.identity)?.realAddresses ?? []);
  for (const state of after) {
    const old = before.find((s) => s.identity === state.identity);
    addRemoved(state, old === undefined ? [] : old.reals.map((r) => r.address));
    addRemoved(state, liveFlows?.get(state.identity)?.realAddresses ?? []);
  }
  // Every real counts as resolved: a plan asks where flows would go, not whether ARP has run yet.
  const resolvedMac = Uint8Array.of(2, 0, 0, 0, 0, 1);
  const viewOpts = { macOf: () => resolvedMac, forceL2: false };
  const built0 = builder.build(viewsOf(before, registry, viewOpts), current.hashSeed, MAX_REAL_IDS);
  const built1 = builder.build(viewsOf(after, registry, viewOpts), candidate.hashSeed, MAX_REAL_IDS);

  const services: ServicePlan[] = [];
  const warnings: PlanWarning[] = [];
  const warn = (code: PlanWarningCode, service: string | null, message: string): void => {
    warnings.push({ code, service, message });
  };

  if (current.hashSeed !== candidate.hashSeed) {
    warn('HASH_SEED_CHANGED', null, `hashSeed ${current.hashSeed} -> ${candidate.hashSeed} moves almost every consistent-hash pick; every LB of a group must change it together, and the daemon takes it only on a restart`);
  }
  // hashSeed has its own warning above.
  const restart = restartOnlyChanges(current, candidate)
    .filter((c) => c.path !== 'hashSeed')
    .map((c) => `${c.path} (${c.before} -> ${c.after})`);
  if (restart.length > 0) warn('RESTART_NEEDED', null, `a reload refuses this change; it needs a restart, which empties the flow table: ${restart.join(', ')}`);

  // Candidate order first (what the operator is writing), then the services it removes.
  const identities = [...after.map((s) => s.identity), ...before.map((s) => s.identity).filter((id) => !after.some((s) => s.identity === id))];
  for (const identity of identities) {
    const i0 = before.findIndex((s) => s.identity === identity);
    const i1 = after.findIndex((s) => s.identity === identity);
    const s0 = i0 < 0 ? null : before[i0]!;
    const s1 = i1 < 0 ? null : after[i1]!;
    const cfg0 = s0?.config ?? null;
    const cfg1 = s1?.config ?? null;
    const cfg = (cfg1 ?? cfg0) as ServiceConfig;
    const name = cfg.name;
    const live = liveFlows?.get(identity);
    const reals0 = new Map((cfg0?.reals ?? []).map((r) => [r.address, r]));
    const reals1 = new Map((cfg1?.reals ?? []).map((r) => [r.address, r]));
    const realsAdded = [...reals1.keys()].filter((a) => !reals0.has(a));
    const realsRemoved = [...reals0.keys()].filter((a) => !reals1.has(a));
    const realsChanged: RealChange[] = [];
    for (const [address, r1] of reals1) {
      const r0 = reals0.get(address);
      if (r0 !== undefined && (r0.weight !== r1.weight || r0.state !== r1.state)) {
        realsChanged.push({ address, before: { weight: r0.weight, state: r0.state }, after: { weight: r1.weight, state: r1.state } });
      }
    }
    const report0 = i0 < 0 ? null : built0.services[i0]!;
    const report1 = i1 < 0 ? null : built1.services[i1]!;
    const change: ServiceChange =
      cfg0 === null ? 'added' : cfg1 === null ? 'removed' : serviceDiffers(cfg0, cfg1) || current.hashSeed !== candidate.hashSeed ? 'changed' : 'unchanged';

    let hashSpaceMoved: HashSpaceMove | null = null;
    if (cfg0 !== null && cfg1 !== null) {
      // Slots compare only between two Maglev tables (maglev and wlc both use one) of one size and seed.
      const comparable =
        cfg0.tableSize === cfg1.tableSize && current.hashSeed === candidate.hashSeed && cfg0.scheduler !== 'rendezvous' && cfg1.scheduler !== 'rendezvous';
      if (comparable) {
        const changed = report1!.movedSlots;
        hashSpaceMoved = { share: changed / cfg1.tableSize, method: 'slots', changedSlots: changed, tableSize: cfg1.tableSize, samples: null };
      } else {
        const share = sampledShare(cfg1, built0, i0, built1, i1);
        hashSpaceMoved = { share, method: 'sampled', changedSlots: null, tableSize: cfg1.tableSize, samples: PLAN_SAMPLES };
      }
    }

    let liveFlowImpact: LiveFlowImpact | null = null;
    if (liveFlows !== undefined) {
      liveFlowImpact = liveImpact(live, identity, registry, built0, i0, current.hashSeed, built1, i1, candidate.hashSeed);
    }

    services.push({
      name,
      address: serviceAddressName(cfg.protocol, cfg.vip, cfg.port),
      change,
      scheduler: { before: cfg0?.scheduler ?? null, after: cfg1?.scheduler ?? null },
      realsAdded,
      realsRemoved,
      realsChanged,
      eligibleReals: { before: report0?.candidates.length ?? null, after: report1?.candidates.length ?? null },
      hashSpaceMoved,
      liveFlows: liveFlowImpact,
    });

    // Warnings, in the order an operator would want to read them.
    if (cfg1 === null) {
      const n = live === undefined ? null : live.realAddresses.length;
      if (n === null && liveFlows === undefined) {
        warn('SERVICE_REMOVED', name, `service ${name} (${serviceAddressName(cfg.protocol, cfg.vip, cfg.port)}) is removed; its live flows (not known here) stop being balanced`);
      } else if (n !== null && n > 0) {
        warn('SERVICE_REMOVED', name, `service ${name} (${serviceAddressName(cfg.protocol, cfg.vip, cfg.port)}) is removed with ${n} live flow${n === 1 ? '' : 's'}; they stop being balanced and break`);
      }
      continue;
    }
    if (cfg0 !== null && cfg0.reals.length > 0 && realsRemoved.length === cfg0.reals.length) {
      warn('ALL_REALS_REMOVED', name, `every real of ${name} is removed (${realsRemoved.join(', ')}); they drain their flows and ${cfg1.reals.length === 0 ? 'no real is left' : `new flows go only to ${realsAdded.join(', ')}`}`);
    }
    const eligibleAfter = report1!.candidates.length;
    const eligibleBefore = report0?.candidates.length ?? null;
    if (eligibleAfter === 0) {
      // With every real assumed up, no candidate means no wanted real either, so failOpen has nothing to fall back to.
      warn('NO_ELIGIBLE_REAL', name, `${name} is left with no real that takes new flows (every real is removed, drained, disabled or at weight 0): new flows are dropped`);
    } else if (eligibleAfter === 1 && eligibleBefore !== 1) {
      const only = registryAddress(report1!.candidates[0]!, after[i1]!, registry);
      warn('SINGLE_ELIGIBLE_REAL', name, `${name} is left with one real taking new flows (${only}); no peer takes over if it fails`);
    }
    if (liveFlowImpact !== null && liveFlowImpact.changingRealNow > 0) {
      const n = liveFlowImpact.changingRealNow;
      warn('LIVE_FLOWS_BREAK', name, `${n} live flow${n === 1 ? '' : 's'} of ${name} ${n === 1 ? 'is' : 'are'} on reals this change disables; they move to other reals and their connections break (drain instead to keep them)`);
    }
    if (cfg0 !== null && cfg0.tableSize !== cfg1.tableSize && (cfg0.scheduler !== 'rendezvous' || cfg1.scheduler !== 'rendezvous')) {
      warn('TABLE_SIZE_CHANGED', name, `tableSize of ${name} ${cfg0.tableSize} -> ${cfg1.tableSize} moves almost every consistent-hash pick; every LB of a group must change it together`);
    }
    if (cfg0 !== null && cfg0.scheduler !== cfg1.scheduler) {
      warn('SCHEDULER_CHANGED', name, `scheduler of ${name} ${cfg0.scheduler} -> ${cfg1.scheduler}: new flows are placed differently, and flows without an entry land by ${cfg1.scheduler === 'rendezvous' ? 'rendezvous' : 'the Maglev table'}`);
    }
  }
  return { liveFlowsKnown: liveFlows !== undefined, services, warnings };
}

function addRemoved(state: ServiceState, addresses: readonly string[]): void {
  for (const address of addresses) {
    if (state.reals.some((r) => r.address === address)) continue;
    state.reals.push({ address, weight: 0, intent: 'drain', forwarding: 'l2', health: 'up', removed: true });
  }
}

function registryAddress(id: number, state: ServiceState, registry: RealRegistry): string {
  for (const r of state.reals) if (registry.idFor(RealRegistry.keyOf(state.identity, r.address)) === id) return r.address;
  return `#${id}`;
}

/** Anything in the service that changes how flows are placed or named. */
function serviceDiffers(a: ServiceConfig, b: ServiceConfig): boolean {
  if (a.name !== b.name || a.scheduler !== b.scheduler || a.tableSize !== b.tableSize || a.whenAllDown !== b.whenAllDown || a.forwarding !== b.forwarding) return true;
  if (a.reals.length !== b.reals.length) return true;
  return a.reals.some((r) => {
    const o = b.reals.find((x) => x.address === r.address);
    return o === undefined || o.weight !== r.weight || o.state !== r.state || o.forwarding !== r.forwarding;
  });
}

export { consistentPick };

/**
 * Share of synthetic flows to the service whose consistent-hash real differs between the two
 * snapshots. Clients are spread over a /16 and all source ports by a fixed generator, so the
 * estimate is the same on every run; its standard error is below 0.2 points at 65536 samples.
 */
function sampledShare(cfg: ServiceConfig, b0: BuildResult, i0: number, b1: BuildResult, i1: number): number {
  // The first key is built the way the table builds keys; the loop then varies only the client.
  const key = new Uint32Array(FLOW_KEY_WORDS);
  const vipPort = cfg.port === 0 ? 80 : cfg.port;
  flowKeyOf(prepareTuple({ family: cfg.family, protocol: cfg.protocol, clientAddress: cfg.family === 4 ? '198.18.0.0' : '2001:db8:5a::', clientPort: 1024, vip: cfg.vip, vipPort }), key);
  const firstWord = key[1]!;
  let moved = 0;
  for (let i = 0; i < PLAN_SAMPLES; i++) {
    const r = mix32(i ^ 0x5a17_c0de);
    // IPv4: 198.18.0.0/16 (RFC 2544 benchmarking space); IPv6: 2001:db8:5a::/48, varied in the last word.
    if (cfg.family === 4) key[1] = (firstWord | (r & 0xffff)) >>> 0;
    else key[4] = r;
    key[9] = (((1024 + (mix32(r) % 64512)) << 16) | vipPort) >>> 0;
    const before = consistentPick(b0.snapshot, i0, flowHash(key, b0.snapshot.hashSeed));
    const after = consistentPick(b1.snapshot, i1, flowHash(key, b1.snapshot.hashSeed));
    if (before !== after) moved++;
  }
  return moved / PLAN_SAMPLES;
}

function liveImpact(
  live: LiveFlowSet | undefined,
  identity: string,
  registry: RealRegistry,
  b0: BuildResult,
  i0: number,
  seed0: number,
  b1: BuildResult,
  i1: number,
  seed1: number,
): LiveFlowImpact {
  if (live === undefined || live.realAddresses.length === 0) return { total: 0, changingRealNow: 0, landingElsewhereWithoutEntry: 0 };
  const total = live.realAddresses.length;
  if (live.keys.length < total * FLOW_KEY_WORDS) throw new RangeError(`live flows of ${identity}: ${total} reals but ${live.keys.length / FLOW_KEY_WORDS} keys`);
  // A removed service balances none of its flows any more: all of them change.
  if (i1 < 0) return { total, changingRealNow: total, landingElsewhereWithoutEntry: total };
  const snap1 = b1.snapshot;
  let changingRealNow = 0;
  let landingElsewhere = 0;
  for (let f = 0; f < total; f++) {
    const id = registry.idFor(RealRegistry.keyOf(identity, live.realAddresses[f]!));
    // The engine's test for an entry it finds (Engine.place): may the real keep flows, and is it still this service's?
    const keeps = id < snap1.realIdLimit && snap1.realKeepExisting[id] === 1 && snap1.realService[id] === i1;
    if (!keeps) changingRealNow++;
    const key = live.keys.subarray(f * FLOW_KEY_WORDS, (f + 1) * FLOW_KEY_WORDS);
    const before = i0 < 0 ? -1 : consistentPick(b0.snapshot, i0, flowHash(key, seed0));
    const after = consistentPick(snap1, i1, flowHash(key, seed1));
    if (before !== after) landingElsewhere++;
  }
  return { total, changingRealNow, landingElsewhereWithoutEntry: landingElsewhere };
}

/**
 * Groups the packet loop's flow dump (keys, real ids) by service identity, naming reals by
 * address through `realOf` (id -> service identity and address, null for an id no longer known).
 */
export function groupLiveFlows(keys: Uint32Array, realIds: Int32Array, count: number, realOf: (id: number) => { identity: string; address: string } | null): LiveFlows {
  const groups = new Map<string, { keys: number[]; reals: string[] }>();
  for (let f = 0; f < count; f++) {
    const real = realOf(realIds[f]!);
    if (real === null) continue;
    let g = groups.get(real.identity);
    if (g === undefined) {
      g = { keys: [], reals: [] };
      groups.set(real.identity, g);
    }
    for (let w = 0; w < FLOW_KEY_WORDS; w++) g.keys.push(keys[f * FLOW_KEY_WORDS + w]!);
    g.reals.push(real.address);
  }
  const out = new Map<string, LiveFlowSet>();
  for (const [identity, g] of groups) out.set(identity, { keys: Uint32Array.from(g.keys), realAddresses: g.reals });
  return out;
}

export { serviceIdentity };

// ---------------------------------------------------------------------------------------------

/** The plan for people: one block per service, then the warnings. */
export function formatPlanText(report: PlanReport): string {
  const lines: string[] = [];
  for (const s of report.services) {
    const sched = s.scheduler.before !== null && s.scheduler.after !== null && s.scheduler.before !== s.scheduler.after ? `${s.scheduler.before} -> ${s.scheduler.after}` : (s.scheduler.after ?? s.scheduler.before);
    lines.push(`${s.name} (${s.address}, ${sched}): ${s.change}`);
    if ((s.change === 'unchanged' && s.liveFlows === null) || s.change === 'removed') {
      if (s.liveFlows !== null && s.change === 'removed') lines.push(`  live flows: ${s.liveFlows.total}, all of them stop being balanced`);
      continue;
    }
    const realParts: string[] = [];
    for (const a of s.realsAdded) realParts.push(`+${a}`);
    for (const a of s.realsRemoved) realParts.push(`-${a} (drains)`);
    for (const c of s.realsChanged) {
      const parts: string[] = [];
      if (c.before.state !== c.after.state) parts.push(`${c.before.state} -> ${c.after.state}`);
      if (c.before.weight !== c.after.weight) parts.push(`weight ${c.before.weight} -> ${c.after.weight}`);
      realParts.push(`${c.address} ${parts.join(', ')}`);
    }
    if (realParts.length > 0) lines.push(`  reals: ${realParts.join('; ')}`);
    if (s.eligibleReals.before !== null && s.eligibleReals.after !== null && s.eligibleReals.before !== s.eligibleReals.after) {
      lines.push(`  reals taking new flows: ${s.eligibleReals.before} -> ${s.eligibleReals.after}`);
    } else if (s.eligibleReals.after !== null && s.change === 'added') {
      lines.push(`  reals taking new flows: ${s.eligibleReals.after}`);
    }
    const m = s.hashSpaceMoved;
    if (m !== null) {
      const detail = m.method === 'slots' ? `${m.changedSlots} of ${m.tableSize} Maglev slots` : `estimated over ${m.samples} synthetic flows`;
      const note = s.scheduler.after === 'wlc' ? '; wlc places new flows by load, this is where flows without an entry go' : '';
      lines.push(`  hash space moving: ${percent(m.share)} (${detail}${note})`);
    }
    const f = s.liveFlows;
    if (f !== null) {
      lines.push(`  live flows: ${f.total}; changing real now: ${f.changingRealNow}; landing elsewhere without their entry (LB restart, ECMP peer): ${f.landingElsewhereWithoutEntry}`);
    }
  }
  if (!report.liveFlowsKnown) lines.push('live flows: not known (no running daemon asked)');
  if (report.warnings.length > 0) {
    lines.push('warnings:');
    for (const w of report.warnings) lines.push(`  ${w.code}: ${w.message}`);
  } else {
    lines.push('warnings: none');
  }
  return `${lines.join('\n')}\n`;
}

export function formatPlanJson(report: PlanReport): string {
  return `${JSON.stringify(report, null, 2)}\n`;
}

function percent(share: number): string {
  return `${(share * 100).toFixed(1)}%`;
}

export interface PlanCommandArgs {
  /** The candidate config (`-c NEW`). */
  readonly config: string;
  /** The config to compare against (`--against OLD`); else `current` must be given. */
  readonly against?: string;
  /** The running daemon's config, when the CLI fetched it (and no --against was given). */
  readonly current?: Config;
  /** The running daemon's live flows, when the CLI fetched them. */
  readonly liveFlows?: LiveFlows;
  readonly json?: boolean;
}

/**
 * `dsrlb plan -c NEW [--against OLD]`: exit 0 with the plan (text, or JSON with --json) on stdout
 * and warnings inside it; exit 1 with `FILE: path: message` lines when a config is invalid or there
 * is nothing to compare against.
 */
export async function runPlanCommand(args: PlanCommandArgs): Promise<CommandOutput> {
  const problems: string[] = [];
  const prefixed = (file: string, list: readonly ConfigProblem[]): void => {
    for (const p of list) problems.push(`${file}: ${p.path}: ${p.message}`);
  };
  const next = await loadConfigFile(args.config);
  if (!next.ok) prefixed(args.config, next.problems);
  let current: Config | null = args.current ?? null;
  if (args.against !== undefined) {
    const old = await loadConfigFile(args.against);
    if (!old.ok) prefixed(args.against, old.problems);
    else current = old.config;
  } else if (current === null) {
    problems.push('--against: missing; give the current config with --against OLD, or run plan where the daemon runs');
  }
  if (problems.length > 0 || !next.ok || current === null) return { exitCode: 1, stdout: '', stderr: `${problems.join('\n')}\n` };
  const report = planChange(current, next.config, args.liveFlows);
  return { exitCode: 0, stdout: args.json === true ? formatPlanJson(report) : formatPlanText(report), stderr: '' };
}
