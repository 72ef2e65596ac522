// When a reload changes a real's probe interval, the probes follow the new interval at once: before
// the first probe (a start, an added real) and together with a change of the probe itself. On a
// simulated clock, so the figures are exact.

import { describe, expect, it } from 'vitest';
import { HealthMonitor, type HealthTarget, type Prober } from '../../src/health/health-monitor.js';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { healthCheck } from '../support/health-check.js';
import { ManualClock } from '../support/manual-clock.js';

function setup(random: number): { clock: ManualClock; monitor: HealthMonitor; starts: number[]; target: (over: Partial<HealthCheckConfig>) => HealthTarget } {
  const clock = new ManualClock();
  const starts: number[] = [];
  const prober: Prober = { probe: async () => (starts.push(clock.nowMs), { ok: true }) };
  const monitor = new HealthMonitor({ clock, random: () => random, probers: { tcp: prober } });
  const target = (over: Partial<HealthCheckConfig>): HealthTarget => ({
    key: 'k',
    service: 'web',
    address: '10.0.0.1',
    vip: '10.0.0.100',
    check: healthCheck({ timeoutMs: 500, rise: 1, fall: 2, ...over }),
  });
  return { clock, monitor, starts, target };
}

function gaps(times: number[]): number[] {
  return times.slice(1).map((t, i) => t - times[i]!);
}

describe('probe interval changed by a reload', () => {
  it('before the first probe: the second comes within one new interval of the first, on the old phase modulo the new interval', async () => {
    const { clock, monitor, starts, target } = setup(0.9);
    monitor.setTargets([target({ intervalMs: 60_000 })]);
    await clock.advance(100);
    monitor.setTargets([target({ intervalMs: 2000 })]);
    await clock.advance(12_000);
    monitor.stop();
    // The first probe keeps its time (0.9 of the first second); the old phase was 54 s, 0 mod 2 s.
    expect(starts[0]).toBe(900);
    expect(starts.slice(1)).toEqual([2000, 4000, 6000, 8000, 10_000, 12_000]);
  });

  it('before the first probe, lengthened: the probes after the first keep the spread over the new interval', async () => {
    const { clock, monitor, starts, target } = setup(0.5);
    monitor.setTargets([target({ intervalMs: 2000 })]);
    await clock.advance(100);
    monitor.setTargets([target({ intervalMs: 10_000 })]);
    await clock.advance(40_000);
    monitor.stop();
    expect(starts[0]).toBe(500);
    expect(gaps(starts.slice(1))).toEqual(Array(starts.length - 2).fill(10_000));
    expect(starts[1]! - starts[0]!).toBeLessThanOrEqual(10_000);
  });

  it('together with a change of the probe: the new probe at the last slot plus the new interval, not at the old next slot', async () => {
    const { clock, monitor, starts, target } = setup(0.9);
    monitor.setTargets([target({ intervalMs: 60_000, port: 80 })]);
    await clock.advance(40_000);
    expect(starts).toEqual([900]);
    // Another port (a new probe) and a 2 s interval: the last slot was 900 - 900 + 54,000 - 60,000,
    // so the new probe is due at once, then every 2 s (before: next at 54,000).
    monitor.setTargets([target({ intervalMs: 2000, port: 81 })]);
    await clock.advance(6000);
    monitor.stop();
    expect(starts.slice(1)).toEqual([40_000, 42_000, 44_000, 46_000]);
  });

  it('together with a change of the probe, interval unchanged: the new probe keeps the old one\'s slots', async () => {
    const { clock, monitor, starts, target } = setup(0.9);
    monitor.setTargets([target({ intervalMs: 2000, port: 80 })]);
    await clock.advance(5000);
    expect(starts).toEqual([900, 1800, 3800]);
    monitor.setTargets([target({ intervalMs: 2000, port: 81 })]);
    await clock.advance(4000);
    monitor.stop();
    expect(starts.slice(3)).toEqual([5800, 7800]);
  });
});
