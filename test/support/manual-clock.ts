// A health-check clock for tests: time moves only when the test advances it, and the timers due by
// then run in time order (ties in the order they were set), each followed by a few microtask turns
// so that the probes they start can settle. Monotonic time is the same as wall time here.
import type { Clock } from '../../src/health/probe.js';

export class ManualClock implements Clock {
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private nextId = 1;

  constructor(public nowMs = 0) {}

  now(): number {
    return this.nowMs;
  }
  monotonicMs(): number {
    return this.nowMs;
  }
  setTimeout(fn: () => void, delayMs: number): number {
    const id = this.nextId++;
    this.timers.push({ at: this.nowMs + Math.max(0, delayMs), fn, id });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.timers = this.timers.filter((t) => t.id !== handle);
  }
  /** Runs every timer due up to now + ms, letting the probes' promises settle after each. */
  async advance(ms: number): Promise<void> {
    const end = this.nowMs + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const t = this.timers[0];
      if (t === undefined || t.at > end) break;
      this.timers.shift();
      this.nowMs = t.at;
      t.fn();
      for (let i = 0; i < 10; i++) await Promise.resolve();
    }
    this.nowMs = end;
  }
}
