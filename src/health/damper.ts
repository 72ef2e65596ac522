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

  /**
   * A probed real starts 'down' (its health is unknown, and unknown counts as down) until `rise`
   * consecutive successes; only an unprobed service (check type none) starts 'up'.
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
   * Whether the probes have decided since the start: up after `rise` successes, or down confirmed
   * by `fall` failures. Until then 'down' only means "not proven up" (scale-out waits for it).
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
   * not proven up yet was confirmed down (unknown -> down: its kept flows must move now).
   */
  record(ok: boolean, nowMs: number, error: string | null = null): boolean {
    if (ok) {
      this.successCount++;
      this.failureCount = 0;
      this.lastErrorText = null;
      if (this.stateValue === 'down' && this.successCount >= this.settings.rise) return this.flip('up', nowMs);
    } else {
      this.failureCount++;
      this.successCount = 0;
      this.lastErrorText = error ?? 'failed';
      if (this.stateValue === 'up' && this.failureCount >= this.settings.fall) return this.flip('down', nowMs);
      if (!this.settledValue && this.failureCount >= this.settings.fall) {
        this.settledValue = true;
        this.sinceMs = nowMs;
        return true;
      }
    }
    return false;
  }

  private flip(to: DampedState, nowMs: number): true {
    this.settledValue = true;
    this.stateValue = to;
    this.sinceMs = nowMs;
    return true;
  }
}
