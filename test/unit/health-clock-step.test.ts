// Probes are scheduled on the monotonic clock: a step of the system time (NTP, `date -s`) must
// neither stop them (a backward step stopped every probe for its size, so a real that died stayed
// up) nor fire a burst (forward). The real clock, a real monitor, Date.now stepped.

import { afterEach, describe, expect, it, vi } from 'vitest';
import { HealthMonitor } from '../../src/health/health-monitor.js';
import type { Prober } from '../../src/health/probe.js';
import { healthCheck } from '../support/health-check.js';

afterEach(() => vi.restoreAllMocks());

describe('health probes and the wall clock', () => {
  for (const [name, stepMs] of [['back', -3_600_000], ['forward', 3_600_000]] as const) {
    it(`keep their rate when the wall clock steps ${name} an hour, and a real that dies then goes down`, async () => {
      let started = 0;
      let ok = true;
      const prober: Prober = { probe: async () => (started++, ok ? { ok: true } : { ok: false, reason: 'refused', detail: 'connection refused' }) };
      const monitor = new HealthMonitor({ probers: { tcp: prober } });
      try {
        monitor.setTargets([{ key: 'k', service: 's', address: '10.0.0.1', vip: '10.0.0.100', check: healthCheck({ intervalMs: 100, timeoutMs: 50, rise: 1, fall: 2 }) }]);
        await new Promise((r) => setTimeout(r, 400));
        expect(monitor.fact('k')!.state).toBe('up');
        const wall = Date.now.bind(Date);
        vi.spyOn(Date, 'now').mockImplementation(() => wall() + stepMs);
        started = 0;
        ok = false;
        await new Promise((r) => setTimeout(r, 1000));
        // About 10 slots in a second at 100 ms: neither none (back) nor a burst (forward).
        expect(started).toBeGreaterThanOrEqual(3);
        expect(started).toBeLessThanOrEqual(15);
        expect(monitor.fact('k')!.state).toBe('down');
      } finally {
        monitor.stop();
      }
    });
  }
});
