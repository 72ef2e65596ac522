// Which health-check settings only retime a probe: when nothing else changes, the health monitor
// keeps the reals' health (HealthMonitor.setTargets), and `dsrlb plan` says so (service-diff.ts).
// One list for both, so plan describes what the daemon does.

import type { HealthCheckConfig } from '../config/types.js';

export const HEALTH_TIMING_KEYS: ReadonlySet<keyof HealthCheckConfig> = new Set<keyof HealthCheckConfig>(['intervalMs', 'timeoutMs', 'rise', 'fall']);

/** Equal health-check setting values (expectStatus is a list, compared item by item). */
export function sameCheckValue(a: unknown, b: unknown): boolean {
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => v === b[i]);
  return a === b;
}
