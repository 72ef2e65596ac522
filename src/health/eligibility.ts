// The one function that turns operator intent and observed health into what a real may do.
// Intent (config and admin API) and fact (probes) are kept apart everywhere else; they meet here.

import type { OnRealDown, RealIntent } from '../config/types.js';

/** What a real may do: take new flows, keep only the flows it has, or nothing at all. */
export type Eligibility = 'new' | 'existing' | 'none';

/**
 * Observed health: 'unknown' until the probes decide (at start, and when a reload changes the
 * probe): no new flows, as down, but the flows it has stay, as a real never seen failing.
 */
export type HealthFact = 'up' | 'down' | 'unknown';

export interface RealStanding {
  readonly intent: RealIntent;
  readonly weight: number;
  readonly health: HealthFact;
  /** Removed from the config by a reload: drained, like IPVS keeps a deleted real's connections. */
  readonly removed: boolean;
}

/**
 * `onDown`: the service's onRealDown. A real marked down loses its flows by default (reschedule: a
 * dead real's connections are broken, so move them rather than black-hole them); with `keep` they
 * stay on it, as HAProxy keeps a down server's sessions and keepalived's inhibit_on_failure its
 * connections: a check that fails while the service still answers breaks nothing.
 */
export function eligibility(r: RealStanding, onDown: OnRealDown = 'reschedule'): Eligibility {
  if (r.intent === 'disabled') return 'none';
  if (r.health === 'down') return onDown === 'keep' ? 'existing' : 'none';
  // Not proven up yet: moving its flows would break them for certain (the first real to prove up
  // took every other real's connections); if it is dead, `fall` failures confirm it and they move.
  if (r.health === 'unknown' || r.removed || r.intent === 'drain' || r.weight === 0) return 'existing';
  return 'new';
}

/** Wanted by the operator regardless of health: what failOpen falls back to when none is up. */
export function isWanted(r: RealStanding): boolean {
  return !r.removed && r.intent === 'active' && r.weight > 0;
}
