// Waiting for a set of reals to come back after this LB found none of them able to take new flows
// (every probe failed: the reals died, or only this LB's probes did, or a dependency of every
// health endpoint blipped). They do not come back in this LB's view at once: each rises after
// `rise` probes at its own phase. Two things must not follow the first real up:
// - a VIP withdrawn for want of reals, announced again: its peers may have seen the reals up all
//   along, and the flows the router moved to it for the others were placed elsewhere and reset
//   (9 of 15 in a walk-through);
// - the end of a failOpen panic: the flows the panic kept on the reals still down moved and were
//   reset (43 of 50 in a walk-through), and mid-stream packets met another table.
// So the wait ends once every wanted real is up, or once the others have had the time to rise
// since the first was back: a real that began answering with it, at another probe phase, has risen
// within (rise + 1) intervals and a timeout. It does not start again with each real up: in an
// outage every LB withdrew, the VIP is nowhere meanwhile, and a rolling restart of 8 reals 4 s
// apart held it 28 s that way. A real that comes back later than that is placed as any real up.

/** The longest a wait lasts once a real is back, whatever the check's timing. */
export const RECOVERY_CAP_MS = 30_000;

/** The reals waited for, as this LB sees them now. */
export interface RealsRecovery {
  /** Reals the operator wants taking new flows (active, weight > 0). */
  readonly wanted: number;
  /** Of them, up with their MAC known: taking new flows now. */
  readonly up: number;
  /** How long the others may take to rise once one is back: (rise + 1) x interval + timeout. */
  readonly riseMs: number;
}

export type HoldDecision =
  | { readonly over: true; readonly waitedMs: number; readonly notUp: number }
  /** `began`: the first time this wait holds something back once a real is back (worth a log line). */
  | { readonly over: false; readonly began: boolean };

/** Waits by key: a VIP (its announcement), a service identity (its panic's end). */
export class RecoveryHold {
  /** When a real was back (the VIP could take new flows, the panic ended); null while none is. */
  private readonly held = new Map<string, number | null>();

  /** None of the reals can take new flows here: what follows their return waits (again). */
  hold(key: string): void {
    this.held.set(key, null);
  }

  /** No wait for this key (nothing to protect: the operator took the reals out, say). */
  forget(key: string): void {
    this.held.delete(key);
  }

  isHeld(key: string): boolean {
    return this.held.has(key);
  }

  /** Held with a real back: waiting for the others. */
  isWaiting(key: string): boolean {
    return (this.held.get(key) ?? null) !== null;
  }

  /**
   * A real is back: whether the wait is over. It is once every wanted real is up, or `riseMs`
   * (at most RECOVERY_CAP_MS) after the first was back; the hold ends then. Nothing held never waits.
   */
  decide(key: string, now: RealsRecovery, nowMs: number): HoldDecision {
    if (!this.held.has(key)) return { over: true, waitedMs: 0, notUp: 0 };
    let backSinceMs = this.held.get(key) ?? null;
    const began = backSinceMs === null;
    if (backSinceMs === null) this.held.set(key, (backSinceMs = nowMs));
    const waitedMs = nowMs - backSinceMs;
    if (now.up < now.wanted && waitedMs < Math.min(now.riseMs, RECOVERY_CAP_MS)) return { over: false, began };
    this.held.delete(key);
    return { over: true, waitedMs, notUp: Math.max(0, now.wanted - now.up) };
  }

  /** Forgets the keys not in `keys` (a reload removed them). */
  keepOnly(keys: ReadonlySet<string>): void {
    for (const key of this.held.keys()) if (!keys.has(key)) this.held.delete(key);
  }
}
