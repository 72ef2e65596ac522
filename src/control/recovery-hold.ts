// Waiting for a set of reals to come back after this LB found none of them able to take new flows
// (every probe failed: the reals died, or only this LB's probes did, or a dependency of every
// health endpoint blipped). They do not come back in this LB's view at once: each rises after
// `rise` probes at its own phase. Two things must not follow the first real up:
// - a VIP withdrawn for want of reals, announced again: its peers may have seen the reals up all
//   along, and the flows the router moved to it for the others were placed elsewhere and reset
//   (9 of 15 in a walk-through);
// - the end of a failOpen panic: the flows the panic kept on the reals still down moved and were
//   reset (43 of 50 in a walk-through), and mid-stream packets met another table.
// So the wait ends once every wanted real is up, or none has come up for a while: a real that
// started answering up to one interval after the last one rose has risen by then (rise + 1
// intervals and a timeout), or at the cap.

/** The longest a wait lasts once a real is back, however the others trickle in. */
export const RECOVERY_CAP_MS = 30_000;

/** The reals waited for, as this LB sees them now. */
export interface RealsRecovery {
  /** Reals the operator wants taking new flows (active, weight > 0). */
  readonly wanted: number;
  /** Of them, up with their MAC known: taking new flows now. */
  readonly up: number;
  /** The longest a real of these services takes to rise once it answers: (rise + 1) x interval + timeout. */
  readonly riseMs: number;
}

interface Held {
  /** When a real was back (the VIP could take new flows, the panic ended); null while none is. */
  backSinceMs: number | null;
  /** The last time a real came up. */
  lastRiseMs: number;
  up: number;
}

export type HoldDecision =
  | { readonly over: true; readonly waitedMs: number; readonly notUp: number }
  /** `began`: the first time this wait holds something back once a real is back (worth a log line). */
  | { readonly over: false; readonly began: boolean };

/** Waits by key: a VIP (its announcement), a service identity (its panic's end). */
export class RecoveryHold {
  private readonly held = new Map<string, Held>();

  /** None of the reals can take new flows here: what follows their return waits (again). */
  hold(key: string): void {
    const h = this.held.get(key);
    if (h === undefined) this.held.set(key, { backSinceMs: null, lastRiseMs: 0, up: 0 });
    else h.backSinceMs = null;
  }

  isHeld(key: string): boolean {
    return this.held.has(key);
  }

  /** Held with a real back: waiting for the others (status says so). */
  isWaiting(key: string): boolean {
    return (this.held.get(key)?.backSinceMs ?? null) !== null;
  }

  /**
   * A real is back: whether the wait is over. It is once every wanted real is up, or no real came
   * up for `riseMs`, or RECOVERY_CAP_MS passed; the hold ends then. Nothing held never waits.
   */
  decide(key: string, now: RealsRecovery, nowMs: number): HoldDecision {
    const h = this.held.get(key);
    if (h === undefined) return { over: true, waitedMs: 0, notUp: 0 };
    const began = h.backSinceMs === null;
    if (h.backSinceMs === null) {
      h.backSinceMs = nowMs;
      h.lastRiseMs = nowMs;
    } else if (now.up > h.up) {
      h.lastRiseMs = nowMs;
    }
    h.up = now.up;
    const waitedMs = nowMs - h.backSinceMs;
    if (now.up < now.wanted && nowMs - h.lastRiseMs < now.riseMs && waitedMs < RECOVERY_CAP_MS) return { over: false, began };
    this.held.delete(key);
    return { over: true, waitedMs, notUp: Math.max(0, now.wanted - now.up) };
  }

  /** Forgets the keys not in `keys` (a reload removed them). */
  keepOnly(keys: ReadonlySet<string>): void {
    for (const key of this.held.keys()) if (!keys.has(key)) this.held.delete(key);
  }
}
