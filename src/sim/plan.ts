// `dsrlb plan`: what a config change would do before it is made. Builds the forwarding snapshots of
// the current and the candidate config with the daemon's SnapshotBuilder (against a running daemon
// with the intent and health in force, else every real up with intent from the config) and reads off, per service, the hash space that moves, the live flows
// that would change real and every other setting the edit changes (service-diff.ts), plus warnings
// for edits that are easy to regret.

import { consistentPick, midStreamPick } from '../dataplane/consistent-pick.js';
import { findService } from '../dataplane/forwarding-snapshot.js';
import type { Config, ConfigProblem, RealIntent, ServiceConfig } from '../config/types.js';
import { formatDurationMs } from '../config/duration.js';
import { loadConfigFile } from '../config/load.js';
import { restartOnlyChanges } from '../config/restart-keys.js';
import { problemLines, serviceAddressName } from '../config/validate.js';
import { RealRegistry } from '../control/real-registry.js';
import { removalBlocker } from '../control/service-removal.js';
import { SnapshotBuilder, type BuildResult, type ServiceBuildReport } from '../control/snapshot-builder.js';
import { MAX_REAL_IDS } from '../dataplane/counters.js';

/** Real ids a plan may hand out: the current side's and the candidate's, MAX_REAL_IDS each at most. */
const PLAN_REAL_IDS = 2 * MAX_REAL_IDS + 1;
import { FLOW_KEY_WORDS, mix32 } from '../dataplane/flow-hash.js';
import { clientKeyScratch, placementHash } from '../dataplane/client-persistence.js';
import { flowKeyOf, prepareTuple } from './frames.js';
import { diffService, isEmptyDiff, probeChanges, type AddedReal, type HealthOnApply, type RealChange, type SettingChange, type SettingValue } from './service-diff.js';
import { initialServiceStates, serviceIdentity, viewsOf, type ServiceState } from './service-views.js';
import type { CommandOutput } from './simulate.js';
import type { HealthFact } from '../health/eligibility.js';

/** Live flows of one service, as the packet loop's flow table holds them. */
export interface LiveFlowSet {
  /** FLOW_KEY_WORDS words per flow, in the flow table's key layout (FlowTable.readKey). */
  readonly keys: Uint32Array;
  /** The real each flow is on, by address; realAddresses[i] belongs to the i-th key. */
  readonly realAddresses: readonly string[];
}

/** Live flows by service identity (`tcp|203.0.113.10|80`, see serviceIdentity). */
export type LiveFlows = ReadonlyMap<string, LiveFlowSet>;

/** One real as the running daemon has it now: the intent in force (config or admin override) and its health. */
export interface LiveReal {
  /** Service identity (`tcp|203.0.113.10|80`). */
  readonly identity: string;
  readonly service: string;
  readonly address: string;
  /** Effective intent: the config's, or the operator's override kept in the state file. */
  readonly state: RealIntent;
  readonly weight: number;
  /** The damped health fact (no health check: up). */
  readonly up: boolean;
  /** The fact itself, 'unknown' for a real whose probes have not decided (it keeps its flows); older daemons send only `up`. */
  readonly health?: HealthFact;
  /** Removed from the config by a reload and still draining its flows. */
  readonly removed: boolean;
}

/** An operator override (admin API) in force that the candidate drops: it changes that real in the config. */
export interface DroppedIntent {
  readonly address: string;
  /** The intent in force now, which gives way to the candidate's. */
  readonly state: RealIntent;
  readonly weight: number;
}

export type ServiceChange = 'added' | 'removed' | 'changed' | 'unchanged';

export type { AddedReal, HealthOnApply, RealChange, SettingChange };

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
  /** The candidate's Maglev table size; null under rendezvous, which has no table. */
  readonly tableSize: number | null;
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
  /**
   * Flows on a port another service takes after the change (an exact port added beside the VIP's
   * port-0 service): the engine keeps them on their reals through their entries, as IPVS looks up
   * connections before services, but without an entry they go to that service (counted in
   * landingElsewhereWithoutEntry; in changingRealNow only when this change disables their real).
   */
  readonly takenByAnotherService: number;
}

export interface ServicePlan {
  readonly name: string;
  /** The CLI's address form, tcp://VIP:PORT. */
  readonly address: string;
  readonly change: ServiceChange;
  readonly scheduler: { readonly before: string | null; readonly after: string | null };
  /** The service's forwarding mode; a real's own setting overrides it (RealSettings.forwarding is resolved). */
  readonly forwarding: { readonly before: string | null; readonly after: string | null };
  /**
   * A VIP, port or protocol change makes another service (identity is the tuple): the removed and
   * the added service with the same name both carry the old and the new address form here.
   */
  readonly addressChange: { readonly before: string; readonly after: string } | null;
  /** Changed settings besides scheduler, forwarding and reals (name, whenAllDown, healthCheck.*, ...); empty for an added or removed service. */
  readonly settingsChanged: readonly SettingChange[];
  readonly realsAdded: readonly AddedReal[];
  readonly realsRemoved: readonly string[];
  readonly realsChanged: readonly RealChange[];
  /** When the service's forwarding changes: the reals that stay as they were by their own forwarding setting. */
  readonly realsKeepingForwarding: readonly string[];
  /** What happens to the health of the reals it keeps (see HealthOnApply); null for an added or removed service. */
  readonly healthOnApply: HealthOnApply | null;
  /** Operator overrides the candidate drops (the daemon drops them on reload); empty without the daemon's view. */
  readonly intentDropped: readonly DroppedIntent[];
  /**
   * Reals that are up and take new flows (a failOpen panic onto down reals counts 0). Against a
   * running daemon: with its intent and health; a real whose probe is new or restarts counts as up.
   * Without it: intent from the config, every real up.
   */
  readonly eligibleReals: { readonly before: number | null; readonly after: number | null };
  /** Null for an added or removed service. */
  readonly hashSpaceMoved: HashSpaceMove | null;
  /** Null when live flows were not given. */
  readonly liveFlows: LiveFlowImpact | null;
  /** A removed service: whether its flows drain on their reals, or why they are cut; else null. */
  readonly removal: { readonly drains: boolean; readonly cutBecause: string | null } | null;
}

export type PlanWarningCode =
  | 'NO_ELIGIBLE_REAL'
  | 'SINGLE_ELIGIBLE_REAL'
  | 'ALL_REALS_REMOVED'
  | 'SERVICE_REMOVED'
  | 'LIVE_FLOWS_BREAK'
  | 'LIVE_FLOWS_TAKEN'
  | 'HASH_SEED_CHANGED'
  | 'TABLE_SIZE_CHANGED'
  | 'SCHEDULER_CHANGED'
  | 'FORWARDING_CHANGED'
  | 'HEALTH_CHECK_ENABLED'
  | 'HEALTH_CHECK_RESTARTS'
  | 'WLC_ANNOUNCED'
  | 'RESTART_NEEDED'
  | 'REAL_IDS_SHORT';

export interface PlanWarning {
  readonly code: PlanWarningCode;
  /** The service's name, or null for a config-wide warning. */
  readonly service: string | null;
  readonly message: string;
}

export interface PlanReport {
  readonly liveFlowsKnown: boolean;
  /** The daemon's intent and health were given (else: config intent, every real up). */
  readonly liveRealsKnown: boolean;
  readonly services: readonly ServicePlan[];
  readonly warnings: readonly PlanWarning[];
}

/** Synthetic flows per service when the hash space cannot be compared slot by slot. */
export const PLAN_SAMPLES = 65536;

/** A wlc service whose VIP goes to BIRD: several LBs, each placing new flows its own way. */
function wlcAnnounced(config: Config, service: ServiceConfig | null): boolean {
  return service !== null && service.scheduler === 'wlc' && service.announce && config.announce.enabled;
}

/**
 * The plan for going from `current` to `candidate`. `liveFlows` (from the running daemon) adds the
 * live-flow counts; without it they are null. `liveReals` (from the running daemon) replaces
 * config intent and "every real up" with what the daemon has in force, carried over to the
 * candidate as a reload would (see applyLiveReals). Deterministic and free of I/O.
 */
export function planChange(current: Config, candidate: Config, liveFlows?: LiveFlows, liveReals?: readonly LiveReal[]): PlanReport {
  // Room for both sides: each config holds at most MAX_REAL_IDS pairs, the daemon's view no more.
  // Whether the daemon could take them together is REAL_IDS_SHORT's question, not a crash here.
  const registry = new RealRegistry(PLAN_REAL_IDS);
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
  const dropped = liveReals === undefined ? new Map<string, DroppedIntent[]>() : applyLiveReals(before, after, liveReals);
  // Every real counts as resolved: a plan asks where flows would go, not whether ARP has run yet.
  const resolvedMac = Uint8Array.of(2, 0, 0, 0, 0, 1);
  const viewOpts = { macOf: () => resolvedMac, forceL2: false };
  const built0 = builder.build(viewsOf(before, registry, viewOpts), current.hashSeed, PLAN_REAL_IDS);
  const heldBefore = registry.size;
  const built1 = builder.build(viewsOf(after, registry, viewOpts), candidate.hashSeed, PLAN_REAL_IDS);
  // The daemon gives each new (service, real) pair an id, while the pairs it has keep theirs
  // (removed ones until their flows end): past MAX_REAL_IDS in all, it refuses the reload.
  const newPairs = registry.size - heldBefore;
  const seedChanged = current.hashSeed !== candidate.hashSeed;

  const services: ServicePlan[] = [];
  const warnings: PlanWarning[] = [];
  const warn = (code: PlanWarningCode, service: string | null, message: string): void => {
    warnings.push({ code, service, message });
  };

  // Candidate order first (what the operator is writing), then the services it removes.
  const identities = [...after.map((s) => s.identity), ...before.map((s) => s.identity).filter((id) => !after.some((s) => s.identity === id))];
  for (const identity of identities) {
    const i0 = before.findIndex((s) => s.identity === identity);
    const i1 = after.findIndex((s) => s.identity === identity);
    const cfg0 = i0 < 0 ? null : before[i0]!.config;
    const cfg1 = i1 < 0 ? null : after[i1]!.config;
    const cfg = (cfg1 ?? cfg0) as ServiceConfig;
    const name = cfg.name;
    const address = serviceAddressName(cfg.protocol, cfg.vip, cfg.port);
    const live = liveFlows?.get(identity);
    const report0 = i0 < 0 ? null : built0.services[i0]!;
    const report1 = i1 < 0 ? null : built1.services[i1]!;
    // An added or removed service: its reals are all added or all removed, its settings are new or gone.
    const diff = diffService(cfg0 ?? { ...cfg, reals: [] }, cfg1 ?? { ...cfg, reals: [] });
    const change: ServiceChange =
      cfg0 === null
        ? 'added'
        : cfg1 === null
          ? 'removed'
          : !isEmptyDiff(diff) || cfg0.scheduler !== cfg1.scheduler || cfg0.forwarding !== cfg1.forwarding || seedChanged
            ? 'changed'
            : 'unchanged';
    // Names are unique within a config, so a name on the other side only is this service at another address.
    const twin = cfg1 === null ? candidate.services.find((s) => s.name === name) : cfg0 === null ? current.services.find((s) => s.name === name) : undefined;
    const twinAddress = twin === undefined ? null : serviceAddressName(twin.protocol, twin.vip, twin.port);
    const addressChange = twinAddress === null ? null : cfg1 === null ? { before: address, after: twinAddress } : { before: twinAddress, after: address };

    let hashSpaceMoved: HashSpaceMove | null = null;
    if (cfg0 !== null && cfg1 !== null) {
      // Slots compare only between two Maglev tables (maglev and wlc both use one) of one size and seed.
      // A persistence change keeps the table but changes the hash that indexes it: sampled too.
      const sameHash = !seedChanged && cfg0.persistence === cfg1.persistence && cfg0.persistencePrefix === cfg1.persistencePrefix;
      const comparable = cfg0.tableSize === cfg1.tableSize && sameHash && cfg0.scheduler !== 'rendezvous' && cfg1.scheduler !== 'rendezvous';
      if (comparable) {
        const changed = report1!.movedSlots;
        hashSpaceMoved = { share: changed / cfg1.tableSize, method: 'slots', changedSlots: changed, tableSize: cfg1.tableSize, samples: null };
      } else {
        const share = sampledShare(cfg1, built0, i0, built1, i1);
        const tableSize = cfg1.scheduler === 'rendezvous' ? null : cfg1.tableSize;
        hashSpaceMoved = { share, method: 'sampled', changedSlots: null, tableSize, samples: PLAN_SAMPLES };
      }
    }

    // A removed service drains its flows unless the candidate makes that wrong (the daemon's rule).
    const cutBecause = cfg1 === null ? removalBlocker(candidate.services, cfg0!) : null;
    let liveFlowImpact: LiveFlowImpact | null = null;
    if (liveFlows !== undefined) {
      liveFlowImpact = liveImpact(live, identity, registry, built0, i0, built1, i1, candidate.hashSeed, cfg1 === null && cutBecause === null);
    }

    const both = cfg0 !== null && cfg1 !== null;
    services.push({
      name,
      address,
      change,
      scheduler: { before: cfg0?.scheduler ?? null, after: cfg1?.scheduler ?? null },
      forwarding: { before: cfg0?.forwarding ?? null, after: cfg1?.forwarding ?? null },
      addressChange,
      settingsChanged: both ? diff.settingsChanged : [],
      realsAdded: diff.realsAdded,
      realsRemoved: diff.realsRemoved,
      realsChanged: diff.realsChanged,
      realsKeepingForwarding: diff.realsKeepingForwarding,
      healthOnApply: both ? diff.healthOnApply : null,
      intentDropped: dropped.get(identity) ?? [],
      eligibleReals: { before: report0 === null ? null : takingNew(report0), after: report1 === null ? null : takingNew(report1) },
      hashSpaceMoved,
      liveFlows: liveFlowImpact,
      removal: cfg1 === null ? { drains: cutBecause === null, cutBecause } : null,
    });

    // Warnings, in the order an operator would want to read them.
    const label = serviceLabel(name, address);
    if (cfg1 === null) {
      const n = live === undefined ? null : live.realAddresses.length;
      const flows = n === null ? 'its live flows (not known here)' : `${n} live flow${n === 1 ? '' : 's'}`;
      if (n === null && liveFlows !== undefined) continue;
      if (n !== null && n === 0) continue;
      if (cutBecause === null) {
        warn('SERVICE_REMOVED', name, `service ${label} is removed; ${flows} drain on their reals, new connections to it are dropped`);
      } else {
        warn('SERVICE_REMOVED', name, `service ${label} is removed; ${flows} are cut at once (${cutBecause}) and break`);
      }
      continue;
    }
    const { realsAdded, realsRemoved } = diff;
    if (cfg0 !== null && cfg0.reals.length > 0 && realsRemoved.length === cfg0.reals.length) {
      const left = cfg1.reals.length === 0 ? 'no real is left' : `new flows go only to ${realsAdded.map((r) => r.address).join(', ')}`;
      warn('ALL_REALS_REMOVED', name, `every real of ${name} is removed (${realsRemoved.join(', ')}); they drain their flows and ${left}`);
    }
    const eligibleAfter = takingNew(report1!);
    const eligibleBefore = report0 === null ? null : takingNew(report0);
    if (eligibleAfter === 0) {
      const already = eligibleBefore === 0 ? '; it has none now either' : '';
      // With every real assumed up (no daemon view) there is no panic: no candidate means no wanted real either.
      const what = liveReals === undefined ? 'removed, drained, disabled or at weight 0' : 'removed, drained, disabled, at weight 0 or down, by the intent and health in force';
      const then = report1!.onBackups
        ? `new flows go to its backup${report1!.candidates.length === 1 ? '' : 's'} (${report1!.candidates.map((id) => registryAddress(id, after[i1]!, registry)).join(', ')})`
        : report1!.panic
          ? 'whenAllDown failOpen sends new flows to the active reals that are down (panic)'
          : 'new flows are dropped';
      const which = report1!.onBackups ? 'no real but its backups' : 'no real';
      warn('NO_ELIGIBLE_REAL', name, `${name} is left with ${which} that takes new flows (every ${report1!.onBackups ? 'other ' : ''}real is ${what}${already}): ${then}`);
    } else if (eligibleAfter === 1 && eligibleBefore !== 1) {
      const only = registryAddress(report1!.candidates[0]!, after[i1]!, registry);
      const takesOver = cfg1.reals.some((r) => r.backup) ? 'only its backups take over if it fails' : 'no peer takes over if it fails';
      warn('SINGLE_ELIGIBLE_REAL', name, `${name} is left with one real taking new flows (${only}); ${takesOver}`);
    }
    if (liveFlowImpact !== null && liveFlowImpact.takenByAnotherService > 0) {
      const n = liveFlowImpact.takenByAnotherService;
      warn('LIVE_FLOWS_TAKEN', name, `${n} live flow${n === 1 ? '' : 's'} of ${name} ${n === 1 ? 'is' : 'are'} on a port that another service of ${cfg1!.vip} takes after this change (a service on the exact port takes precedence over the port-0 one): ${n === 1 ? 'it keeps its real' : 'they keep their reals'} through the flow table, but new connections to that port go to that service, and an LB without the flow entries (another LB after an ECMP change, this one after a crash) sends ${n === 1 ? 'it' : 'them'} there and ${n === 1 ? 'its connection breaks' : 'their connections break'}`);
    }
    const disabledNow = liveFlowImpact === null ? 0 : liveFlowImpact.changingRealNow;
    // With no real taking new flows, the engine finds none to move them to either (failOpen's
    // down reals aside): their packets are dropped.
    const fate =
      eligibleAfter > 0
        ? 'they move to other reals and their connections break'
        : report1!.panic
          ? 'they move to active reals that are down (failOpen) and their connections break'
          : 'no real is left to take them: their packets are dropped and their connections break';
    if (liveFlowImpact !== null && disabledNow > 0) {
      const n = disabledNow;
      // keep -> reschedule: the flows of reals that are down move too, which no drain keeps.
      const downMoves = cfg0?.onRealDown === 'keep' && cfg1?.onRealDown === 'reschedule';
      const opsOn = cfg0?.ops === false && cfg1?.ops === true;
      const where = opsOn
        ? 'on reals their hash no longer picks, and ops false -> true looks up no flow entry'
        : downMoves
          ? 'on reals that are down (onRealDown keep -> reschedule moves their flows) or that this change disables'
          : 'on reals this change disables';
      const hint = opsOn ? ' (their next datagrams go where the consistent hash puts them)' : downMoves ? '' : ' (drain instead to keep them)';
      warn('LIVE_FLOWS_BREAK', name, `${n} live flow${n === 1 ? '' : 's'} of ${name} ${n === 1 ? 'is' : 'are'} ${where}; ${fate}${hint}`);
    } else if (liveFlows === undefined && cfg0 !== null) {
      // --against two files: the flows are not known, the reals this change disables are.
      const disabled = diff.realsChanged.filter((r) => r.before.state !== 'disabled' && r.after.state === 'disabled').map((r) => r.address);
      if (disabled.length > 0) {
        warn('LIVE_FLOWS_BREAK', name, `${name}: ${disabled.join(', ')} ${disabled.length === 1 ? 'is' : 'are'} disabled by this change; for the live flows on ${disabled.length === 1 ? 'it' : 'them'} (not known here), ${fate} (drain instead to keep them)`);
      }
    }
    // A service at a new address is the same service by name: already wlc and announced, nothing new.
    if (wlcAnnounced(candidate, cfg1) && !wlcAnnounced(current, cfg0 ?? twin ?? null)) {
      warn('WLC_ANNOUNCED', name, `${name} uses wlc and its VIP is announced: each LB picks new flows by its own connection counts, so a flow that ECMP moves to another LB (one failing, a route change) lands on that LB's Maglev pick and its connection breaks; use maglev or rendezvous behind several LBs`);
    }
    if (cfg0 === null) continue;
    // Only a Maglev table after the change (maglev, wlc) is built anew; to rendezvous, SCHEDULER_CHANGED says it.
    if (cfg0.tableSize !== cfg1.tableSize && cfg1.scheduler !== 'rendezvous') {
      warn('TABLE_SIZE_CHANGED', name, `tableSize of ${name} ${cfg0.tableSize} -> ${cfg1.tableSize} builds a new Maglev table: ${percent(hashSpaceMoved!.share)} of its consistent-hash picks move (about (N-1)/N with N equal reals); every LB of a group must change it together`);
    }
    if (cfg0.scheduler !== cfg1.scheduler) {
      warn('SCHEDULER_CHANGED', name, `scheduler of ${name} ${cfg0.scheduler} -> ${cfg1.scheduler}: new flows are placed differently, and flows without an entry land by ${cfg1.scheduler === 'rendezvous' ? 'rendezvous' : 'the Maglev table'}`);
    }
    for (const [from, to] of [['l2', 'ipip'], ['ipip', 'l2']] as const) {
      const switching = diff.realsChanged.filter((r) => r.before.forwarding === from && r.after.forwarding === to).map((r) => r.address);
      if (switching.length > 0) warn('FORWARDING_CHANGED', name, forwardingWarning(name, cfg1.vip, switching, to));
    }
    const kept = cfg1.reals.some((r) => cfg0.reals.some((o) => o.address === r.address));
    const hc1 = cfg1.healthCheck;
    const allDown = cfg1.whenAllDown === 'failOpen' ? 'new flows go to every wanted real (panic)' : 'new flows are dropped (whenAllDown: drop)';
    if (diff.healthOnApply === 'firstProbeDecides' && kept) {
      warn('HEALTH_CHECK_ENABLED', name, `healthCheck of ${name} none -> ${hc1.type}: every real stays up until its first probe, within a second, and one that fails it goes down at once (${cfg1.onRealDown === 'keep' ? 'keeping its flows: onRealDown keep' : 'its flows move'}); if the probe fails everywhere (a wrong path or port), ${allDown}`);
    } else if (diff.healthOnApply === 'newProbe' && kept) {
      const causes = healthCheckParts(probeChanges(diff.settingsChanged));
      const fallTime = `${hc1.fall} failed probe${hc1.fall === 1 ? '' : 's'}${hc1.fall === 1 ? '' : ` ${formatDurationMs(hc1.intervalMs)} apart`}`;
      warn('HEALTH_CHECK_RESTARTS', name, `the probe of ${name} changes (${causes.join(', ')}): each real keeps its state until the new probe decides otherwise; if the new probe fails everywhere (a wrong path or port), every real goes down after ${fallTime} and ${allDown}`);
    }
  }

  // Config-wide warnings first: they concern every service, and the seed's cost is measured per service above.
  const global: PlanWarning[] = [];
  if (seedChanged) {
    const shares = services.flatMap((s) => (s.hashSpaceMoved === null ? [] : [s.hashSpaceMoved.share]));
    const [least, most] = [percent(Math.min(...shares)), percent(Math.max(...shares))];
    const measured = shares.length === 0 ? '' : ` (measured here: ${least === most ? least : `${least} to ${most}`} of picks move)`;
    global.push({
      code: 'HASH_SEED_CHANGED',
      service: null,
      message: `hashSeed ${current.hashSeed} -> ${candidate.hashSeed} re-hashes every flow: a consistent-hash pick stays on its real only by chance, so about (N-1)/N of them move with N equal reals${measured}; every LB of a group must change it together, and the daemon takes it only on a restart`,
    });
  }
  if (heldBefore + newPairs > MAX_REAL_IDS) {
    global.push({
      code: 'REAL_IDS_SHORT',
      service: null,
      message: `this change adds ${newPairs} (service, real) pairs to the ${heldBefore} the daemon holds (the reals it removes keep their ids while their flows drain): past ${MAX_REAL_IDS} in all the daemon refuses the reload; make it in two steps, the second once the removed reals' flows have ended, or restart`,
    });
  }
  // hashSeed has its own warning above.
  const restart = restartOnlyChanges(current, candidate)
    .filter((c) => c.path !== 'hashSeed')
    .map((c) => `${c.path} (${c.before} -> ${c.after})`);
  if (restart.length > 0) {
    // A clean stop leaves its flows in <stateFile>.flows for the next start, which reads its own stateFile's.
    const handedOver = current.stateFile !== null && current.stateFile === candidate.stateFile;
    const flows = handedOver ? 'a clean restart hands the flows over to the next daemon' : 'the flow table starts empty (no stateFile kept across it for the flow hand-over)';
    global.push({ code: 'RESTART_NEEDED', service: null, message: `a reload refuses this change; it needs a restart, and ${flows}: ${restart.join(', ')}` });
  }
  return { liveFlowsKnown: liveFlows !== undefined, liveRealsKnown: liveReals !== undefined, services, warnings: [...global, ...warnings] };
}

/** A service as sentences name it: `web (tcp://203.0.113.10:80)`, or only the address form when that is its name. */
function serviceLabel(name: string, address: string): string {
  return name === address ? address : `${name} (${address})`;
}

function forwardingWarning(name: string, vip: string, reals: readonly string[], to: 'l2' | 'ipip'): string {
  const one = reals.length === 1;
  const head = `forwarding in ${name} ${to === 'ipip' ? 'l2 -> ipip' : 'ipip -> l2'} for ${reals.join(', ')}: ${one ? 'its' : 'their'} new and existing flows arrive`;
  const check = `dsrlb-realserver check --vip ${vip} --mode ${to} shows what is missing`;
  if (to === 'ipip') return `${head} IPIP-encapsulated, so ${one ? 'it' : 'each'} must decapsulate them (kernel tunnel or dsrlb decap; ${check}), or those connections break`;
  return `${head} by MAC rewrite, so ${one ? 'it' : 'each'} must be on the LB's segment with the VIP on lo (${check}), or those connections break`;
}

/** Reals that are up and take new flows; a failOpen panic (new flows onto down reals) is none, and so are backups taking them. */
function takingNew(report: ServiceBuildReport): number {
  return report.panic || report.onBackups ? 0 : report.candidates.length;
}

/** The engine's test for an entry it finds (Engine.place): may the real keep flows, and is it still this service's? */
function keepsFlows(b: BuildResult, serviceIndex: number, id: number): boolean {
  const snap = b.snapshot;
  return serviceIndex >= 0 && id < snap.realIdLimit && snap.realKeepExisting[id] === 1 && snap.realService[id] === serviceIndex;
}

/**
 * Puts the daemon's view into both sides, as a reload of the candidate would carry it over: the
 * current side takes the intent and health in force; on the candidate side a real of the same
 * service keeps its override unless the candidate changes its state or weight (Daemon.pruneOverrides
 * drops the override then), and keeps its health unless a check is switched on or off
 * (HealthOnApply). A real the daemon has no health for yet (new, or its check switched on) counts as
 * up: HEALTH_CHECK_* warnings tell the wait. Returns the overrides dropped, by service identity.
 */
function healthOfLive(l: LiveReal): HealthFact {
  return l.health ?? (l.up ? 'up' : 'down');
}

function applyLiveReals(before: readonly ServiceState[], after: readonly ServiceState[], live: readonly LiveReal[]): Map<string, DroppedIntent[]> {
  const byKey = new Map(live.map((r) => [RealRegistry.keyOf(r.identity, r.address), r]));
  for (const s of before) {
    for (const r of s.reals) {
      const l = byKey.get(RealRegistry.keyOf(s.identity, r.address));
      if (l === undefined) continue;
      if (!r.removed) {
        r.intent = l.state;
        r.weight = l.weight;
      }
      r.health = healthOfLive(l);
    }
  }
  const dropped = new Map<string, DroppedIntent[]>();
  for (const s of after) {
    const old = before.find((o) => o.identity === s.identity);
    if (old === undefined) continue;
    const onApply = diffService(old.config, s.config).healthOnApply;
    // A check switched on keeps the reals up until its first probe: as live (up, unless drained).
    const healthKept = onApply !== 'upAtOnce';
    for (const r of s.reals) {
      const l = byKey.get(RealRegistry.keyOf(s.identity, r.address));
      if (l === undefined) continue;
      if (healthKept) r.health = healthOfLive(l);
      const was = old.config.reals.find((o) => o.address === r.address);
      if (r.removed || was === undefined || (l.state === was.state && l.weight === was.weight)) continue;
      if (r.intent === was.state && r.weight === was.weight) {
        r.intent = l.state;
        r.weight = l.weight;
      } else {
        dropped.set(s.identity, [...(dropped.get(s.identity) ?? []), { address: r.address, state: l.state, weight: l.weight }]);
      }
    }
  }
  return dropped;
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

export { consistentPick };

/**
 * Share of synthetic flows to the service whose consistent-hash real differs between the two
 * snapshots. Clients are spread over the whole address space (every prefix a client persistence
 * may keep) and all source ports by a fixed generator, so the estimate is the same on every run;
 * its standard error is below 0.2 points at 65536 samples.
 */
function sampledShare(cfg: ServiceConfig, b0: BuildResult, i0: number, b1: BuildResult, i1: number): number {
  // The first key is built the way the table builds keys; the loop then varies only the client.
  const key = new Uint32Array(FLOW_KEY_WORDS);
  const vipPort = cfg.port === 0 ? 80 : cfg.port;
  flowKeyOf(prepareTuple({ family: cfg.family, protocol: cfg.protocol, clientAddress: cfg.family === 4 ? '198.18.0.0' : '2001:db8:5a::', clientPort: 1024, vip: cfg.vip, vipPort }), key);
  const scratch = clientKeyScratch();
  let moved = 0;
  for (let i = 0; i < PLAN_SAMPLES; i++) {
    const r = mix32(i ^ 0x5a17_c0de);
    key[1] = r;
    if (cfg.family === 6) {
      key[2] = mix32(r ^ 1);
      key[3] = mix32(r ^ 2);
      key[4] = mix32(r ^ 3);
    }
    key[9] = (((1024 + (mix32(r) % 64512)) << 16) | vipPort) >>> 0;
    const before = consistentPick(b0.snapshot, i0, placementHash(b0.snapshot, i0, key, scratch, b0.snapshot.hashSeed | 0));
    const after = consistentPick(b1.snapshot, i1, placementHash(b1.snapshot, i1, key, scratch, b1.snapshot.hashSeed | 0));
    // As the slot count: a flow with no real before (no eligible real) has nothing to move from.
    if (before !== -1 && before !== after) moved++;
  }
  return moved / PLAN_SAMPLES;
}

function liveImpact(
  live: LiveFlowSet | undefined,
  identity: string,
  registry: RealRegistry,
  b0: BuildResult,
  i0: number,
  b1: BuildResult,
  i1: number,
  seed1: number,
  drains = false,
): LiveFlowImpact {
  if (live === undefined || live.realAddresses.length === 0) return { total: 0, changingRealNow: 0, landingElsewhereWithoutEntry: 0, takenByAnotherService: 0 };
  const total = live.realAddresses.length;
  if (live.keys.length < total * FLOW_KEY_WORDS) throw new RangeError(`live flows of ${identity}: ${total} reals but ${live.keys.length / FLOW_KEY_WORDS} keys`);
  // A removed service: flows with an entry stay on their reals while it drains, else all change;
  // a flow without an entry (another LB's) is dropped either way.
  if (i1 < 0) return { total, changingRealNow: drains ? 0 : total, landingElsewhereWithoutEntry: total, takenByAnotherService: 0 };
  const snap1 = b1.snapshot;
  let changingRealNow = 0;
  let landingElsewhere = 0;
  let taken = 0;
  const addr = new Uint32Array(8);
  const scratch = clientKeyScratch();
  const opsNow = snap1.svcOps[i1] === 1 && (i0 < 0 || b0.snapshot.svcOps[i0] !== 1);
  for (let f = 0; f < total; f++) {
    const key = live.keys.subarray(f * FLOW_KEY_WORDS, (f + 1) * FLOW_KEY_WORDS);
    const id = registry.idFor(RealRegistry.keyOf(identity, live.realAddresses[f]!));
    // The service the engine matches after the change: an exact port added beside a port-0
    // service takes that port's packets without an entry; with one, the flow stays on its real
    // while the real keeps flows (the engine's keepsEntry). Key: family << 8 | protocol, source
    // and destination words, client port << 16 | VIP port.
    addr.set(key.subarray(1, 9));
    const family = key[0]! >>> 8;
    const protocol = key[0]! & 0xff;
    const vipPort = key[9]! & 0xffff;
    if (findService(snap1, family, protocol, addr, vipPort) !== i1) {
      // Taken by this change only when it brings the exact port in: one an earlier change took
      // stays on its real all the same (the engine keeps it), and is no news here.
      if (i0 < 0 || findService(b0.snapshot, family, protocol, addr, vipPort) === i0) taken++;
      landingElsewhere++;
      // It moves (to that service's reals) when its real stops keeping flows, or when one-packet
      // scheduling comes on and its entry goes.
      if (keepsFlows(b0, i0, id) && (!keepsFlows(b1, i1, id) || opsNow)) changingRealNow++;
      continue;
    }
    // Only what this change does: flows the daemon already moves (a real down or disabled now) do not count.
    if (keepsFlows(b0, i0, id) && !keepsFlows(b1, i1, id)) changingRealNow++;
    // One-packet scheduling turned on: no entry is looked up any more, every datagram goes by the hash.
    else if (opsNow && keepsFlows(b0, i0, id) && midStreamPick(snap1, i1, placementHash(snap1, i1, key, scratch, seed1 | 0)) !== id) changingRealNow++;
    // Against the real the flow is on, not the old table's pick: a wlc flow, or one placed under an
    // older table, lands elsewhere without its entry even when this change moves no slot.
    if (midStreamPick(snap1, i1, placementHash(snap1, i1, key, scratch, seed1 | 0)) !== id) landingElsewhere++;
  }
  return { total, changingRealNow, landingElsewhereWithoutEntry: landingElsewhere, takenByAnotherService: taken };
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

/** The plan for people: one block per service, one line per change, then the warnings. */
export function formatPlanText(report: PlanReport): string {
  const lines: string[] = [];
  for (const s of report.services) {
    const sched = fromTo(s.scheduler.before, s.scheduler.after);
    lines.push(`${s.name === s.address ? `${s.address} (${sched})` : `${s.name} (${s.address}, ${sched})`}: ${s.change}`);
    if (s.addressChange !== null) {
      const note = s.change === 'added' ? 'a new service to the daemon: flows to the old address are not carried over' : `${s.name} is added at the new address`;
      lines.push(`  address: ${s.addressChange.before} -> ${s.addressChange.after} (${note})`);
    }
    if ((s.change === 'unchanged' && s.liveFlows === null) || s.change === 'removed') {
      if (s.liveFlows !== null && s.change === 'removed') {
        lines.push(`  live flows: ${s.liveFlows.total}, ${s.removal?.drains === true ? 'they drain on their reals' : 'all of them stop being balanced'}`);
      }
      continue;
    }
    lines.push(...settingLines(s));
    for (const r of s.realsAdded) {
      const own = r.forwarding === s.forwarding.after ? '' : `, forwarding ${r.forwarding}`;
      const idle = r.state === 'disabled' ? ' (takes no flows)' : r.state === 'drain' || r.weight === 0 ? ' (takes no new flows)' : '';
      lines.push(`  real +${r.address}: ${r.state}, weight ${r.weight}${own}${r.backup ? ', backup' : ''}${idle}`);
    }
    for (const a of s.realsRemoved) lines.push(`  real -${a} (drains its flows)`);
    for (const d of s.intentDropped) lines.push(`  real ${d.address}: operator intent in force (${d.state}, weight ${d.weight}) is dropped: this change sets the real in the config`);
    for (const c of s.realsChanged) {
      const parts: string[] = [];
      if (c.before.state !== c.after.state) parts.push(`${c.before.state} -> ${c.after.state}`);
      if (c.before.weight !== c.after.weight) parts.push(`weight ${c.before.weight} -> ${c.after.weight}`);
      // A real that only follows the service's new forwarding is told by the forwarding line.
      const followsService = c.before.forwarding === s.forwarding.before && c.after.forwarding === s.forwarding.after;
      if (c.before.forwarding !== c.after.forwarding && !followsService) parts.push(`forwarding ${c.before.forwarding} -> ${c.after.forwarding}`);
      if (c.before.backup !== c.after.backup) parts.push(c.after.backup ? 'now a backup (new flows only while no other real can take them)' : 'no longer a backup');
      if (parts.length > 0) lines.push(`  real ${c.address}: ${parts.join(', ')}`);
    }
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

/** One line per changed service setting; the health-check settings share one. */
function settingLines(s: ServicePlan): string[] {
  const lines: string[] = [];
  if (s.forwarding.before !== null && s.forwarding.after !== null && s.forwarding.before !== s.forwarding.after) {
    const kept = s.realsKeepingForwarding;
    const except = kept.length === 0 ? '' : ` (except ${kept.join(', ')}, which ${kept.length === 1 ? 'keeps' : 'keep'} ${s.forwarding.before} by ${kept.length === 1 ? 'its' : 'their'} own setting)`;
    lines.push(`  forwarding: ${s.forwarding.before} -> ${s.forwarding.after}${except}`);
  }
  const health = s.settingsChanged.filter((c) => c.setting.startsWith('healthCheck.'));
  for (const c of s.settingsChanged) {
    if (c.setting === 'name') lines.push(`  name: ${c.before} -> ${c.after} (metric labels and the name CLI commands take change)`);
    else if (c.setting === 'whenAllDown') lines.push(`  whenAllDown: ${c.before} -> ${c.after} (with no real up, ${c.after === 'drop' ? 'flows are dropped' : 'every active real with weight > 0 takes flows'})`);
    else if (c.setting === 'onRealDown') lines.push(`  onRealDown: ${c.before} -> ${c.after} (a real marked down ${c.after === 'keep' ? 'keeps its flows' : 'loses its flows to the others'})`);
    else if (c.setting === 'persistence') lines.push(`  persistence: ${c.before} -> ${c.after} (${c.after === 'client' ? "a client's new connections all go to one real" : 'each new connection is placed on its own'}; live flows stay on their reals)`);
    else if (c.setting === 'ops') lines.push(`  ops: ${c.before} -> ${c.after} (${c.after === true ? 'no flow entries: every datagram is placed alone, by the consistent hash of its 5-tuple' : 'datagrams make flow entries again'})`);
    // A prefix going with persistence itself (client /24 -> none: back to the default) says nothing more.
    else if (c.setting === 'persistencePrefix' && s.settingsChanged.some((x) => x.setting === 'persistence')) continue;
    else if (c.setting === 'persistencePrefix') lines.push(`  persistencePrefix: ${c.before} -> ${c.after} (clients that share the first ${c.after} bits share a real)`);
    else if (!c.setting.startsWith('healthCheck.')) lines.push(`  ${c.setting}: ${settingText(c.setting, c.before)} -> ${settingText(c.setting, c.after)}`);
    else if (c === health[0]) lines.push(`  healthCheck: ${healthCheckParts(health).join(', ')} (${HEALTH_ON_APPLY_TEXT[s.healthOnApply ?? 'kept']})`);
  }
  return lines;
}

const HEALTH_ON_APPLY_TEXT: Readonly<Record<HealthOnApply, string>> = {
  kept: 'reals keep their health',
  newProbe: 'reals keep their state until the new probe decides otherwise',
  firstProbeDecides: 'every real stays up until its first probe decides',
  upAtOnce: 'every real counts as up at once',
};

/** Health-check changes as `type none -> http`, `interval 2s -> 5s`, `path "/" -> "/healthz"`. */
function healthCheckParts(changes: readonly SettingChange[]): string[] {
  return changes.map((c) => {
    const key = c.setting.slice('healthCheck.'.length);
    const shown = key.endsWith('Ms') ? key.slice(0, -2) : key;
    return `${shown} ${settingText(key, c.before)} -> ${settingText(key, c.after)}`;
  });
}

function settingText(key: string, value: SettingValue): string {
  if (value === null) return 'unset';
  if (Array.isArray(value)) return `[${value.join(', ')}]`;
  if (typeof value === 'number' && key.endsWith('Ms')) return formatDurationMs(value);
  // Free text (a path, a command, a payload) in quotes, so spaces and empty strings show. (name,
  // whenAllDown, onRealDown, persistence and ops have lines of their own in settingLines and never come here.)
  if (typeof value === 'string' && key !== 'type') return JSON.stringify(value);
  return String(value);
}

function fromTo(before: string | null, after: string | null): string {
  return before !== null && after !== null && before !== after ? `${before} -> ${after}` : (after ?? before ?? '');
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
  /** The config to compare against (`--against OLD`); else `live` must be given. */
  readonly against?: string;
  /**
   * Fetches the running daemon's view (no --against): its config, live flows and per-real intent
   * and health. Called only once the candidate is valid, so its problems come first.
   */
  readonly live?: () => Promise<LiveView>;
  readonly json?: boolean;
}

/** What the CLI fetches from the running daemon for plan. */
export interface LiveView {
  readonly current: Config;
  readonly liveFlows?: LiveFlows;
  readonly liveReals?: readonly LiveReal[];
}

/**
 * `dsrlb plan -c NEW [--against OLD]`: exit 0 with the plan (text, or JSON with --json) on stdout
 * and warnings inside it; exit 1 with `FILE: path: message` lines when a config is invalid or there
 * is nothing to compare against.
 */
export async function runPlanCommand(args: PlanCommandArgs): Promise<CommandOutput> {
  const problems: string[] = [];
  const prefixed = (file: string, list: readonly ConfigProblem[]): void => {
    problems.push(...problemLines(list, file));
  };
  const next = await loadConfigFile(args.config);
  if (!next.ok) prefixed(args.config, next.problems);
  let view: LiveView | null = null;
  if (args.against !== undefined) {
    const old = await loadConfigFile(args.against);
    if (!old.ok) prefixed(args.against, old.problems);
    else view = { current: old.config };
  } else if (args.live === undefined) {
    problems.push('--against: missing; give the current config with --against OLD, or run plan where the daemon runs');
  }
  if (problems.length > 0 || !next.ok) return { exitCode: 1, stdout: '', stderr: `${problems.join('\n')}\n` };
  view ??= await args.live!();
  const report = planChange(view.current, next.config, view.liveFlows, view.liveReals);
  return { exitCode: 0, stdout: args.json === true ? formatPlanJson(report) : formatPlanText(report), stderr: '' };
}
