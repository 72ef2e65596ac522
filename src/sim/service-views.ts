// The simulator's and planner's side of what the daemon's control plane holds per real (intent,
// health, removed-and-draining), turned into the SnapshotBuilder's views the same way the daemon
// does it: stable ids per (service, address) and a removed real kept as a draining weight-0 real.

import { serviceIdentity } from '../control/real-registry.js';
import type { ForwardingMode, RealIntent, ServiceConfig } from '../config/types.js';
import { RealRegistry } from '../control/real-registry.js';
import type { RealView, ServiceView } from '../control/snapshot-builder.js';
import type { HealthFact } from '../health/eligibility.js';

/** What the daemon keeps for one real of one service (src/control/daemon.ts RealRuntime + intent). */
export interface RealState {
  readonly address: string;
  weight: number;
  intent: RealIntent;
  forwarding: ForwardingMode;
  health: HealthFact;
  /** Gone from the config but still draining its flows, as the daemon keeps it until idle. */
  removed: boolean;
  /** RealConfig.backup (absent: false). */
  backup?: boolean;
}

export interface ServiceState {
  readonly config: ServiceConfig;
  readonly identity: string;
  readonly reals: RealState[];
}

export { serviceIdentity };

/** Every configured real up (there are no probes in a simulation or a plan), intent from the config. */
export function initialServiceStates(services: readonly ServiceConfig[]): ServiceState[] {
  return services.map((config) => ({
    config,
    identity: serviceIdentity(config),
    reals: config.reals.map((r) => ({ address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up' as HealthFact, removed: false, backup: r.backup })),
  }));
}

export interface ViewOptions {
  /** The real's MAC for a real id; null leaves it unresolved (the engine then drops: neighbor_unknown). */
  readonly macOf: (id: number) => Uint8Array | null;
  /**
   * Forward every real by MAC rewrite. The simulator models placement, not encapsulation: an ipip
   * real would be dropped by an engine build without ipip, hiding which real it was placed on.
   */
  readonly forceL2: boolean;
}

/** Builder views for the states; ids come from (and are allocated in) the registry. */
export function viewsOf(states: readonly ServiceState[], registry: RealRegistry, opts: ViewOptions): ServiceView[] {
  return states.map((s) => {
    const reals: RealView[] = s.reals.map((r) => {
      const id = registry.idFor(RealRegistry.keyOf(s.identity, r.address));
      // As Daemon.serviceViews(): a removed real drains (weight 0, intent drain) and keeps its health.
      return {
        id,
        address: r.address,
        weight: r.removed ? 0 : r.weight,
        intent: r.removed ? 'drain' : r.intent,
        forwarding: opts.forceL2 || r.removed ? 'l2' : r.forwarding,
        health: r.health,
        removed: r.removed,
        mac: opts.macOf(id),
        backup: r.backup === true,
      };
    });
    return { config: s.config, reals };
  });
}
