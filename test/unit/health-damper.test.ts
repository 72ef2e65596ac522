// Rise/fall damping step by step: the damper alone, then through the monitor with a manual clock and
// a scripted prober, so recovery times and outage tolerance are exact numbers, not timings.

import { describe, expect, it } from 'vitest';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { HealthDamper } from '../../src/health/damper.js';
import { HealthMonitor, type HealthFactRecord } from '../../src/health/health-monitor.js';
import { OK, fail, type Clock, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from '../../src/health/probe.js';
import { healthCheck } from '../support/health-check.js';

function check(over: Partial<HealthCheckConfig> = {}): HealthCheckConfig {
  return healthCheck({ port: 80, intervalMs: 1000, timeoutMs: 500, ...over });
}

/** A clock whose time moves only when the test says so; due timers run in order. */
class ManualClock implements Clock {
  private t = 0;
  private seq = 0;
  private readonly timers = new Map<number, { at: number; fn: () => void }>();

  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, delayMs: number): number {
    this.seq++;
    this.timers.set(this.seq, { at: this.t + delayMs, fn });
    return this.seq;
  }
  clearTimeout(handle: unknown): void {
    this.timers.delete(handle as number);
  }
  get pendingTimers(): number {
    return this.timers.size;
  }
  async advanceTo(targetMs: number): Promise<void> {
    for (;;) {
      let id = -1;
      let at = Infinity;
      for (const [k, v] of this.timers) if (v.at <= targetMs && v.at < at) [id, at] = [k, v.at];
      if (id < 0) break;
      const timer = this.timers.get(id)!;
      this.timers.delete(id);
      this.t = timer.at;
      timer.fn();
      await flush();
    }
    this.t = targetMs;
    await flush();
  }
}

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** Answers at once from a switch the test flips; records when it was asked. */
class ScriptedProber implements Prober {
  healthy = false;
  readonly askedAtMs: number[] = [];
  constructor(private readonly clock: ManualClock) {}
  async probe(_target: ProbeTarget, _signal: ProbeSignal): Promise<ProbeOutcome> {
    this.askedAtMs.push(this.clock.now());
    return this.healthy ? OK : fail('refused', 'connection refused (ECONNREFUSED)');
  }
}

function setup(over: Partial<HealthCheckConfig> = {}) {
  const clock = new ManualClock();
  const prober = new ScriptedProber(clock);
  // random 0: the first probe runs at t=0, then every interval, so probe times are k * interval.
  const monitor = new HealthMonitor({ clock, random: () => 0, probers: { tcp: prober } });
  const changes: { atMs: number; fact: HealthFactRecord }[] = [];
  monitor.on('change', (_key, fact) => changes.push({ atMs: clock.now(), fact }));
  monitor.setTargets([{ key: 'web/10.0.0.11', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check(over) }]);
  const fact = (): HealthFactRecord => monitor.fact('web/10.0.0.11')!;
  return { clock, prober, monitor, changes, fact };
}

describe('HealthDamper alone', () => {
  it('starts down (unknown); the first result decides, then a down real comes up at exactly the rise-th consecutive success', () => {
    const seen = new HealthDamper({ rise: 3, fall: 2 }, 0);
    expect([seen.state, seen.since, seen.settled]).toEqual(['down', 0, false]);
    expect(seen.record(true, 500)).toBe(true);
    expect([seen.state, seen.since, seen.settled]).toEqual(['up', 500, true]);

    const d = new HealthDamper({ rise: 3, fall: 2 }, 0);
    expect(d.record(false, 500, 'refused: x')).toBe(true);
    expect([d.state, d.since, d.settled]).toEqual(['down', 500, true]);
    expect(d.record(true, 1000)).toBe(false);
    expect(d.record(true, 2000)).toBe(false);
    expect([d.state, d.successes, d.failures]).toEqual(['down', 2, 0]);
    expect(d.record(true, 3000)).toBe(true);
    expect([d.state, d.since, d.successes]).toEqual(['up', 3000, 3]);
  });

  it('a failure among the successes restarts the rise count', () => {
    const d = new HealthDamper({ rise: 2, fall: 3 }, 0);
    d.record(false, 0, 'refused: first');
    d.record(true, 1000);
    d.record(false, 2000, 'refused: connection refused');
    expect([d.state, d.successes, d.failures, d.lastError]).toEqual(['down', 0, 1, 'refused: connection refused']);
    d.record(true, 3000);
    expect(d.state).toBe('down');
    expect(d.lastError).toBeNull();
    d.record(true, 4000);
    expect([d.state, d.since]).toEqual(['up', 4000]);
  });

  it('continuing (a reload changed the probe): goes on from the old decision with fresh counts', () => {
    const up = new HealthDamper({ rise: 2, fall: 3 }, 0);
    up.record(true, 100);
    up.record(false, 200, 'timeout: old probe');
    const next = HealthDamper.continuing({ rise: 2, fall: 2 }, up);
    expect([next.state, next.since, next.settled, next.successes, next.failures]).toEqual(['up', 100, true, 0, 0]);
    expect(next.record(false, 300)).toBe(false); // one failure of the new probe: still up
    expect(next.record(false, 400)).toBe(true); // its fall (2): down
    const down = new HealthDamper({ rise: 2, fall: 3 }, 0);
    down.record(false, 100);
    const again = HealthDamper.continuing({ rise: 2, fall: 3 }, down);
    expect(again.record(true, 200)).toBe(false); // a known-down real needs rise successes
    expect(again.record(true, 300)).toBe(true);
    const unknown = HealthDamper.continuing({ rise: 2, fall: 3 }, new HealthDamper({ rise: 2, fall: 3 }, 50));
    expect([unknown.state, unknown.settled, unknown.since]).toEqual(['down', false, 50]);
    expect(unknown.record(true, 60)).toBe(true); // still unknown: the first result decides
  });

  it('with fall=3 single failures among successes never take an up real down', () => {
    const d = new HealthDamper({ rise: 1, fall: 3 }, 0);
    d.record(true, 0);
    expect(d.state).toBe('up');
    const pattern = [false, true, false, false, true, false, true, false, false, true];
    pattern.forEach((ok, i) => expect(d.record(ok, 1000 * (i + 1), ok ? null : 'timeout: x')).toBe(false));
    expect([d.state, d.since]).toEqual(['up', 0]);
  });

  it('goes down at exactly the fall-th consecutive failure', () => {
    const d = new HealthDamper({ rise: 1, fall: 3 }, 0);
    d.record(true, 0);
    expect(d.record(false, 1000, 'timeout: a')).toBe(false);
    expect(d.record(false, 2000, 'timeout: b')).toBe(false);
    expect([d.state, d.failures]).toEqual(['up', 2]);
    expect(d.record(false, 3000, 'timeout: c')).toBe(true);
    expect([d.state, d.since, d.failures, d.lastError]).toEqual(['down', 3000, 3, 'timeout: c']);
    // Further failures do not move `since`.
    expect(d.record(false, 4000, 'timeout: d')).toBe(false);
    expect(d.since).toBe(3000);
  });

  it('first probe after none (a check switched on): up and settled, the first failure takes it down, a first success keeps it up with fall damping after it', () => {
    const none = new HealthDamper({ rise: 2, fall: 3 }, 100, 'up');
    const failing = HealthDamper.firstProbeAfterNone({ rise: 2, fall: 3 }, none);
    expect([failing.state, failing.settled, failing.since]).toEqual(['up', true, 100]);
    expect(failing.record(false, 300, 'refused: x')).toBe(true); // nothing ever saw it alive: one failure decides
    expect([failing.state, failing.since]).toEqual(['down', 300]);
    const passing = HealthDamper.firstProbeAfterNone({ rise: 2, fall: 3 }, none);
    expect(passing.record(true, 300)).toBe(false); // up it was, up it stays: no change of fact
    expect(passing.record(false, 400)).toBe(false);
    expect(passing.record(false, 500)).toBe(false);
    expect(passing.record(false, 600)).toBe(true); // seen alive once: fall (3) damps from here
    // Changed again before its first probe (none -> http -> tcp): still decided by the first result.
    const again = HealthDamper.continuing({ rise: 2, fall: 3 }, HealthDamper.firstProbeAfterNone({ rise: 2, fall: 3 }, none));
    expect(again.record(false, 700)).toBe(true);
  });

  it('an unprobed real (type none) is up from the start', () => {
    const d = new HealthDamper({ rise: 2, fall: 3 }, 500, 'up');
    expect([d.state, d.since]).toEqual(['up', 500]);
  });
});

describe('damping through the monitor, manual clock', () => {
  it('a new real is unknown (down, unsettled) until its first probe, which proves it up', async () => {
    const { clock, prober, changes, fact } = setup({ rise: 2, fall: 3 });
    prober.healthy = true;
    expect([fact().state, fact().settled]).toEqual(['down', false]);
    await clock.advanceTo(0);
    expect(prober.askedAtMs).toEqual([0]);
    expect(fact()).toMatchObject({ state: 'up', since: 0, successes: 1, failures: 0, lastError: null, lastDurationMs: 0, probing: false, settled: true });
    expect(changes.map((c) => [c.atMs, c.fact.state])).toEqual([[0, 'up']]);
  });

  it('first probes come within 1 s of the start even with a 60 s interval, and later ones keep the spread over the interval', async () => {
    const clock = new ManualClock();
    const prober = new ScriptedProber(clock);
    const monitor = new HealthMonitor({ clock, random: () => 0.5, probers: { tcp: prober } });
    monitor.setTargets([{ key: 'k', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check({ intervalMs: 60_000, timeoutMs: 1000 }) }]);
    await clock.advanceTo(200_000);
    // random 0.5: first at 0.5 x 1 s, then on the phase 0.5 x 60 s, every 60 s.
    expect(prober.askedAtMs).toEqual([500, 30_000, 90_000, 150_000]);
  });

  it('a reload of the interval before the first probe leaves the first probe where it was (it was pushed out by up to the new interval)', async () => {
    const clock = new ManualClock();
    const prober = new ScriptedProber(clock);
    const monitor = new HealthMonitor({ clock, random: () => 0.5, probers: { tcp: prober } });
    const target = (intervalMs: number) => ({ key: 'k', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check({ intervalMs, timeoutMs: 1000 }) });
    monitor.setTargets([target(2000)]);
    await clock.advanceTo(100);
    monitor.setTargets([target(60_000)]);
    await clock.advanceTo(62_000);
    // First at 0.5 x 1 s as planned (before: at 57 s); then on the phase it had (0.5 x 2 s), every 60 s.
    expect(prober.askedAtMs).toEqual([500, 1000, 61_000]);
  });

  it('interval 1 s, rise 2: a real that recovers just after a failed probe is up 2 s later', async () => {
    const { clock, prober, changes, fact } = setup({ intervalMs: 1000, rise: 2, fall: 3 });
    await clock.advanceTo(2000); // probes at 0, 1000, 2000 all fail
    expect(prober.askedAtMs).toEqual([0, 1000, 2000]);
    expect([fact().state, fact().failures, fact().lastError]).toEqual(['down', 3, 'refused: connection refused (ECONNREFUSED)']);
    prober.healthy = true; // recovers at t = 2000, right after that probe
    await clock.advanceTo(3999);
    expect(fact().state).toBe('down');
    await clock.advanceTo(4000);
    expect(fact().state).toBe('up');
    // Confirmed down at the first failure (a change: its kept flows move), then up: rise x interval after the recovery.
    expect(changes.map((c) => [c.atMs, c.fact.state])).toEqual([[0, 'down'], [4000, 'up']]);
  });

  it('fall 3, interval 1 s: a 2 s outage never takes the real out; a 3 s one does, at the 3rd failure', async () => {
    const { clock, prober, changes, fact } = setup({ intervalMs: 1000, rise: 2, fall: 3 });
    prober.healthy = true;
    await clock.advanceTo(1000);
    expect([fact().state, fact().since]).toEqual(['up', 0]);
    // Outage from just after the probe at 5000 to just after the probe at 7000: exactly 2 s,
    // the worst placement, covering the probes at 6000 and 7000.
    await clock.advanceTo(5000);
    prober.healthy = false;
    await clock.advanceTo(7000);
    expect([fact().state, fact().failures]).toEqual(['up', 2]);
    prober.healthy = true;
    await clock.advanceTo(12_000);
    expect(changes.map((c) => c.fact.state)).toEqual(['up']);
    expect([fact().state, fact().since, fact().failures]).toEqual(['up', 0, 0]);
    // A 3 s outage (probes at 13000, 14000, 15000 fail) takes it down at 15000, not before.
    prober.healthy = false;
    await clock.advanceTo(14_999);
    expect(fact().state).toBe('up');
    await clock.advanceTo(15_000);
    expect(changes.map((c) => [c.atMs, c.fact.state])).toEqual([
      [0, 'up'],
      [15_000, 'down'],
    ]);
  });

  it('a reload switching a check on keeps the real up until its first probe (within 1 s), which takes it down if it fails', async () => {
    const clock = new ManualClock();
    const prober = new ScriptedProber(clock);
    const monitor = new HealthMonitor({ clock, random: () => 0.5, probers: { tcp: prober } });
    const changes: { atMs: number; state: string }[] = [];
    monitor.on('change', (_key, fact) => changes.push({ atMs: clock.now(), state: fact.state }));
    const target = (over: Partial<HealthCheckConfig>) => [{ key: 'k', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check(over) }];
    monitor.setTargets(target({ type: 'none' }));
    await clock.advanceTo(5_000);
    monitor.setTargets(target({ type: 'tcp', intervalMs: 60_000, fall: 3 }));
    // Up and settled as before (before: unproven, so every real of the service lost new flows).
    expect(monitor.fact('k')).toMatchObject({ state: 'up', settled: true, since: 0 });
    await clock.advanceTo(5_499);
    expect([prober.askedAtMs, monitor.fact('k')!.state]).toEqual([[], 'up']);
    await clock.advanceTo(5_500); // random 0.5 of the first second
    expect(prober.askedAtMs).toEqual([5_500]);
    expect(changes).toEqual([{ atMs: 5_500, state: 'down' }]); // one failure, not fall (3)
    // Switched off again: up at once, and said so (the daemon logs "real up" from this).
    monitor.setTargets(target({ type: 'none' }));
    expect(changes).toEqual([
      { atMs: 5_500, state: 'down' },
      { atMs: 5_500, state: 'up' },
    ]);
    expect(monitor.fact('k')).toMatchObject({ state: 'up', settled: true });
    monitor.stop();
  });

  it('a reload switching a check on: a real that passes its first probe stays up with no change said', async () => {
    const clock = new ManualClock();
    const prober = new ScriptedProber(clock);
    prober.healthy = true;
    const monitor = new HealthMonitor({ clock, random: () => 0, probers: { tcp: prober } });
    let changes = 0;
    monitor.on('change', () => changes++);
    const target = (over: Partial<HealthCheckConfig>) => [{ key: 'k', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check(over) }];
    monitor.setTargets(target({ type: 'none' }));
    monitor.setTargets(target({ type: 'tcp', fall: 2 }));
    await clock.advanceTo(0);
    expect([prober.askedAtMs, changes, monitor.fact('k')!.state]).toEqual([[0], 0, 'up']);
    prober.healthy = false;
    await clock.advanceTo(1_000);
    expect(monitor.fact('k')!.state).toBe('up'); // fall 2 damps now
    await clock.advanceTo(2_000);
    expect([monitor.fact('k')!.state, changes]).toEqual(['down', 1]);
    monitor.stop();
  });

  it('type none is up from the start and never probed', async () => {
    const clock = new ManualClock();
    const prober = new ScriptedProber(clock);
    const monitor = new HealthMonitor({ clock, random: () => 0, probers: { tcp: prober } });
    monitor.setTargets([{ key: 'k', service: 'web', address: '10.0.0.11', vip: '10.0.0.100', check: check({ type: 'none' }) }]);
    expect(monitor.fact('k')).toEqual({ state: 'up', since: 0, lastError: null, successes: 0, failures: 0, lastDurationMs: null, probing: false, settled: true });
    expect(clock.pendingTimers).toBe(0);
    await clock.advanceTo(10_000);
    expect(prober.askedAtMs).toEqual([]);
    expect(monitor.fact('k')!.state).toBe('up');
  });
});

describe('HealthDamper: settled', () => {
  it('is unsettled until the first result: a success proves up, a failure confirms down', () => {
    const up = new HealthDamper({ rise: 2, fall: 3 }, 0);
    expect(up.settled).toBe(false);
    expect(up.record(true, 1)).toBe(true);
    expect([up.state, up.settled, up.since]).toEqual(['up', true, 1]);

    const down = new HealthDamper({ rise: 2, fall: 3 }, 0);
    // Confirmed down: a change of fact (unknown -> down), reported as one, since then.
    expect(down.record(false, 5)).toBe(true);
    expect([down.state, down.settled, down.since]).toEqual(['down', true, 5]);
    expect(down.record(false, 6)).toBe(false);
    // Settled stays settled: later results change the state, not this.
    down.record(true, 6);
    expect(down.settled).toBe(true);
  });

  it('is settled at once for an unprobed real (check type none starts up)', () => {
    expect(new HealthDamper({ rise: 2, fall: 3 }, 0, 'up').settled).toBe(true);
  });
});

