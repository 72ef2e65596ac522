// Rise/fall damping for one real: turns a stream of probe successes and failures into an up/down
// fact that a single lost probe cannot flip. Pure: the caller passes the time of each result.

export type DampedState = 'up' | 'down';

export interface DamperSettings {
  /** Consecutive successes that bring a down real up. */
  readonly rise: number;
  /** Consecutive failures that take an up real down. */
  readonly fall: number;
}

export class HealthDamper {
  private stateValue: DampedState;
  private sinceMs: number;
  private successCount = 0;
  private failureCount = 0;
  private lastErrorText: string | null = null;
  private settledValue: boolean;
  /** Up by assumption, never probed (a check switched on where there was none): the first failure decides. */
  private assumedUp = false;

  /**
   * A probed real starts 'down' and unsettled (its health is unknown, and unknown takes no new
   * flows) until its first result; only an unprobed service (check type none) starts 'up'.
   */
  constructor(
    private settings: DamperSettings,
    nowMs: number,
    initial: DampedState = 'down',
  ) {
    this.stateValue = initial;
    this.sinceMs = nowMs;
    this.settledValue = initial === 'up';
  }

  /**
   * A damper for a new probe of the same real (a reload changed the check): it goes on from what
   * `from` decided, so an up real stays up until the new probe fails `fall` times and a down one
   * stays down until `rise` successes; the counts start again, the new probe has proven nothing.
   */
  static continuing(settings: DamperSettings, from: HealthDamper): HealthDamper {
    const d = new HealthDamper(settings, from.sinceMs, from.stateValue);
    d.settledValue = from.settledValue;
    d.assumedUp = from.assumedUp;
    d.lastErrorText = from.lastErrorText;
    return d;
  }

  /**
   * A damper for the first probe of a real that had none (a reload switched a check on): it stays
   * up, as it was, and keeps its flows and new ones, but nothing has seen it alive, so the first
   * result decides as for a real at start: one failure takes it down (HAProxy's servers start "up,
   * going down"). Making it unproven instead took every real of the service out of new flows until
   * its first probe: dropped, or a fail-open panic.
   */
  static firstProbeAfterNone(settings: DamperSettings, from: HealthDamper): HealthDamper {
    const d = new HealthDamper(settings, from.sinceMs, 'up');
    d.assumedUp = true;
    return d;
  }

  /**
   * Whether the probes have decided since the start. The first result decides (up, or down
   * confirmed): `rise` and `fall` damp changes of a real seen up or down, and a real nobody has
   * seen yet is neither. Until then 'down' only means "not proven up" (scale-out waits for it).
   */
  get settled(): boolean {
    return this.settledValue;
  }

  get state(): DampedState {
    return this.stateValue;
  }
  /** When the state last changed (or the damper was created), in the caller's clock. */
  get since(): number {
    return this.sinceMs;
  }
  /** Consecutive successes, reset by any failure. */
  get successes(): number {
    return this.successCount;
  }
  /** Consecutive failures, reset by any success. */
  get failures(): number {
    return this.failureCount;
  }
  /** The last failure's text; cleared by the next success. */
  get lastError(): string | null {
    return this.lastErrorText;
  }

  /** New rise/fall counts (a reload that changed only them); takes effect at the next result. */
  retune(settings: DamperSettings): void {
    this.settings = settings;
  }

  /**
   * Records one probe result; returns true when it changed the fact: the state flipped, or a real
   * not seen yet was decided (unknown -> up, or unknown -> down: its kept flows must move now).
   * The first result decides, as HAProxy's default start state and keepalived's do: waiting for
   * `rise` kept every real out of a fail-open service's panic set for rise x interval after a start
   * (then the first real up took every new flow), and `fall` x interval of new flows went to dead
   * reals in it.
   */
  record(ok: boolean, nowMs: number, error: string | null = null): boolean {
    if (ok) {
      this.successCount++;
      this.failureCount = 0;
      this.lastErrorText = null;
      this.assumedUp = false;
      if (!this.settledValue || (this.stateValue === 'down' && this.successCount >= this.settings.rise)) return this.flip('up', nowMs);
    } else {
      this.failureCount++;
      this.successCount = 0;
      this.lastErrorText = error ?? 'failed';
      if (!this.settledValue || this.assumedUp || (this.stateValue === 'up' && this.failureCount >= this.settings.fall)) return this.flip('down', nowMs);
    }
    return false;
  }

  private flip(to: DampedState, nowMs: number): true {
    this.settledValue = true;
    this.assumedUp = false;
    this.stateValue = to;
    this.sinceMs = nowMs;
    return true;
  }
}
