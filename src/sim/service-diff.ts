// What an edit changes in one service's config besides the hash space: its settings (name,
// forwarding, health check, whenAllDown, ...) and its reals, value by value, and what the daemon's
// health monitor does to the reals' health (HealthOnApply). `dsrlb plan` lists and warns on these.

import type { ForwardingMode, HealthCheckConfig, RealConfig, RealIntent, ServiceConfig } from '../config/types.js';
import { HEALTH_TIMING_KEYS, sameCheckValue } from '../health/check-timing.js';

export type SettingValue = string | number | boolean | null | readonly number[];

export interface SettingChange {
  /** Its path in the normalised service config, e.g. 'forwarding' or 'healthCheck.intervalMs'. */
  readonly setting: string;
  readonly before: SettingValue;
  readonly after: SettingValue;
}

export interface RealSettings {
  readonly weight: number;
  readonly state: RealIntent;
  /** Resolved: the real's own forwarding, or else the service's. */
  readonly forwarding: ForwardingMode;
  readonly backup: boolean;
}

export interface AddedReal extends RealSettings {
  readonly address: string;
}

export interface RealChange {
  readonly address: string;
  readonly before: RealSettings;
  readonly after: RealSettings;
}

/**
 * What the daemon's health monitor does to the reals a service keeps when the change is applied:
 * `kept`: same probe (or only its timing, or the service's name, changed), they keep their health;
 * `newProbe`: a setting other than timing changed: they keep their state until the new probe
 * decides otherwise (`fall` failures take an up real down); `firstProbeDecides`: a check switched on,
 * they stay up until its first probe, within a second, and one failure takes a real down;
 * `upAtOnce`: the check is switched off.
 */
export type HealthOnApply = 'kept' | 'newProbe' | 'firstProbeDecides' | 'upAtOnce';

export interface ServiceDiff {
  /** Changed service settings other than scheduler and forwarding (plan carries those apart) and reals. */
  readonly settingsChanged: readonly SettingChange[];
  readonly realsAdded: readonly AddedReal[];
  readonly realsRemoved: readonly string[];
  readonly realsChanged: readonly RealChange[];
  /** When the service's forwarding changes: the reals it keeps whose own forwarding setting keeps them as they were. */
  readonly realsKeepingForwarding: readonly string[];
  readonly healthOnApply: HealthOnApply;
}

/** Service settings compared one by one, in the order plan prints them. */
const SERVICE_SETTINGS = ['name', 'whenAllDown', 'onRealDown', 'persistence', 'persistencePrefix', 'ops', 'tableSize', 'announce'] as const;

export function diffService(a: ServiceConfig, b: ServiceConfig): ServiceDiff {
  const settingsChanged: SettingChange[] = [];
  for (const key of SERVICE_SETTINGS) {
    if (a[key] !== b[key]) settingsChanged.push({ setting: key, before: a[key], after: b[key] });
  }
  let probeChanged = false;
  for (const key of Object.keys(b.healthCheck) as (keyof HealthCheckConfig)[]) {
    const before = a.healthCheck[key];
    const after = b.healthCheck[key];
    if (sameCheckValue(before, after)) continue;
    settingsChanged.push({ setting: `healthCheck.${key}`, before, after });
    if (!HEALTH_TIMING_KEYS.has(key)) probeChanged = true;
  }

  const reals0 = new Map(a.reals.map((r) => [r.address, r]));
  const reals1 = new Map(b.reals.map((r) => [r.address, r]));
  const realsAdded = b.reals.filter((r) => !reals0.has(r.address)).map((r) => ({ address: r.address, ...settingsOf(r) }));
  const realsRemoved = a.reals.filter((r) => !reals1.has(r.address)).map((r) => r.address);
  const realsChanged: RealChange[] = [];
  for (const r1 of b.reals) {
    const r0 = reals0.get(r1.address);
    if (r0 !== undefined && (r0.weight !== r1.weight || r0.state !== r1.state || r0.forwarding !== r1.forwarding || r0.backup !== r1.backup)) {
      realsChanged.push({ address: r1.address, before: settingsOf(r0), after: settingsOf(r1) });
    }
  }
  const realsKeepingForwarding =
    a.forwarding === b.forwarding ? [] : b.reals.filter((r) => r.forwarding !== b.forwarding && reals0.get(r.address)?.forwarding === r.forwarding).map((r) => r.address);
  let healthOnApply: HealthOnApply = 'kept';
  if (b.healthCheck.type === 'none') healthOnApply = a.healthCheck.type === 'none' ? 'kept' : 'upAtOnce';
  else if (a.healthCheck.type === 'none') healthOnApply = 'firstProbeDecides';
  else if (probeChanged) healthOnApply = 'newProbe';
  return { settingsChanged, realsAdded, realsRemoved, realsChanged, realsKeepingForwarding, healthOnApply };
}

/** The changed health-check settings that make a new probe: all but its timing. */
export function probeChanges(changes: readonly SettingChange[]): SettingChange[] {
  return changes.filter((c) => c.setting.startsWith('healthCheck.') && !HEALTH_TIMING_KEYS.has(c.setting.slice('healthCheck.'.length) as keyof HealthCheckConfig));
}

/** True when the diff holds no change at all. */
export function isEmptyDiff(d: ServiceDiff): boolean {
  return d.settingsChanged.length === 0 && d.realsAdded.length === 0 && d.realsRemoved.length === 0 && d.realsChanged.length === 0;
}

function settingsOf(r: RealConfig): RealSettings {
  return { weight: r.weight, state: r.state, forwarding: r.forwarding, backup: r.backup };
}
