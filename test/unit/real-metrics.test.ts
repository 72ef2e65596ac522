// The per-real metric families written by hand (real-metrics.ts) against the same families as
// prom-client objects (what metrics.ts registered before): byte-identical text for random reals,
// counters, probe results (bucket bounds, past the last bucket, forgotten and re-observed reals)
// and label values that need escaping.

import client from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createCounters, REAL_BASE, REAL_STRIDE, RealCounter } from '../../src/dataplane/counters.js';
import { DaemonMetrics, type MetricsRealView, type MetricsSource } from '../../src/control/metrics.js';
import { PROBE_DURATION_BUCKETS, RealMetrics } from '../../src/control/real-metrics.js';
import { PROBE_REASONS } from '../../src/health/probe.js';
import { mulberry32 } from '../support/prng.js';

const INTENTS = ['active', 'drain', 'disabled'] as const;

function randomSource(seed: number, count: number): { src: MetricsSource; reals: MetricsRealView[] } {
  const rand = mulberry32(seed);
  const counters = createCounters();
  const services = ['web', 'dns', 'we"ird\\name', 'two\nlines'];
  const reals: MetricsRealView[] = [];
  for (let id = 0; id < count; id++) {
    reals.push({
      service: services[id % services.length]!,
      real: id % 7 === 0 ? `2001:db8::${id.toString(16)}` : `10.0.${id >> 8}.${id & 255}`,
      id,
      weight: Math.floor(rand() * 65536),
      intent: INTENTS[Math.floor(rand() * 3)]!,
      up: rand() < 0.7,
      drainFinished: rand() < 0.2,
    });
    for (const which of [RealCounter.forwardedPackets, RealCounter.forwardedBytes, RealCounter.flowsCreated]) {
      counters[REAL_BASE + id * REAL_STRIDE + which] = rand() < 0.1 ? 0 : Math.floor(rand() * 2 ** 40);
    }
  }
  const active = reals.map(() => Math.floor(rand() * 1000));
  const inactive = reals.map(() => Math.floor(rand() * 100));
  const src: MetricsSource = {
    counters: () => counters,
    realCount: (c, id, which) => c[REAL_BASE + id * REAL_STRIDE + which]!,
    reals: () => reals,
    activeFlows: (id) => active[id]!,
    inactiveFlows: (id) => inactive[id]!,
    flowTableCapacity: () => 1000,
    panic: () => [],
    services: () => [],
  };
  return { src, reals };
}

/** The per-real families as prom-client objects, registered in real-metrics.ts's output order. */
function promClientOracle(src: MetricsSource): {
  registry: client.Registry;
  observe: (service: string, real: string, seconds: number, reason: string | null) => void;
  forget: (service: string, real: string) => void;
} {
  const registry = new client.Registry();
  const labelNames = ['service', 'real'] as const;
  const scraped = (kind: 'counter' | 'gauge', name: string, help: string, value: (r: MetricsRealView) => number): void => {
    const collect = function (this: client.Counter<'service' | 'real'> | client.Gauge<'service' | 'real'>): void {
      this.reset();
      for (const r of src.reals()) {
        if (this instanceof client.Counter) this.inc({ service: r.service, real: r.real }, value(r));
        else (this as client.Gauge<'service' | 'real'>).set({ service: r.service, real: r.real }, value(r));
      }
    };
    if (kind === 'counter') new client.Counter({ name, help, labelNames, registers: [registry], collect });
    else new client.Gauge({ name, help, labelNames, registers: [registry], collect });
  };
  const count = (which: number) => (r: MetricsRealView) => src.realCount(src.counters(), r.id, which);
  scraped('counter', 'dsrlb_forwarded_packets_total', 'Frames forwarded to a real.', count(RealCounter.forwardedPackets));
  scraped('counter', 'dsrlb_forwarded_bytes_total', 'Bytes forwarded to a real.', count(RealCounter.forwardedBytes));
  scraped('counter', 'dsrlb_flows_created_total', 'Flow entries created for a real.', count(RealCounter.flowsCreated));
  scraped('gauge', 'dsrlb_flows_active', 'Flow entries per real: established TCP (IPVS ActiveConn) and live UDP (which IPVS counts in InActConn).', (r) => src.activeFlows(r.id));
  scraped('gauge', 'dsrlb_flows_inactive', 'Flow entries per real in TCP SYN, FIN or closed state (IPVS InActConn, less UDP).', (r) => src.inactiveFlows(r.id));
  scraped('gauge', 'dsrlb_real_up', 'Observed health of a real: 1 up, 0 down (fact, from probes).', (r) => (r.up ? 1 : 0));
  scraped('gauge', 'dsrlb_real_weight', 'Weight of a real in force.', (r) => r.weight);
  new client.Gauge({
    name: 'dsrlb_real_state',
    help: 'Operator intent for a real: 1 for the state in force (active, drain, disabled).',
    labelNames: ['service', 'real', 'state'],
    registers: [registry],
    collect() {
      this.reset();
      for (const r of src.reals()) for (const s of INTENTS) this.set({ service: r.service, real: r.real, state: s }, r.intent === s ? 1 : 0);
    },
  });
  scraped(
    'gauge',
    'dsrlb_drain_finished',
    '1 when a draining (or removed, or weight 0) real has no established flow left (half-open and closing entries may remain, as ActiveConn 0 in ipvsadm).',
    (r) => (r.drainFinished ? 1 : 0),
  );
  const duration = new client.Histogram({
    name: 'dsrlb_healthcheck_duration_seconds',
    help: 'Health probe durations.',
    labelNames,
    buckets: [...PROBE_DURATION_BUCKETS],
    registers: [registry],
  });
  const failures = new client.Counter({
    name: 'dsrlb_healthcheck_failures_total',
    help: `Failed health probes, by reason (${PROBE_REASONS.join(', ')}).`,
    labelNames: ['service', 'real', 'reason'],
    registers: [registry],
  });
  return {
    registry,
    observe: (service, real, seconds, reason) => {
      duration.observe({ service, real }, seconds);
      if (reason) failures.inc({ service, real, reason });
    },
    forget: (service, real) => {
      duration.remove({ service, real });
      for (const reason of PROBE_REASONS) failures.remove({ service, real, reason });
    },
  };
}

describe('RealMetrics', () => {
  it('writes what prom-client writes for the same reals, counters and probe results, byte for byte', async () => {
    for (const seed of [1, 2, 3]) {
      const { src, reals } = randomSource(seed, 300);
      const oracle = promClientOracle(src);
      const ours = new RealMetrics(src);
      const rand = mulberry32(seed + 100);
      // Durations on bucket bounds, between them, and past the last one (+Inf only).
      const durations = [...PROBE_DURATION_BUCKETS, 0, 0.0004, 0.003, 0.7, 4.999, 5.0001, 30];
      for (let i = 0; i < 5000; i++) {
        const r = reals[Math.floor(rand() * reals.length)]!;
        const u = rand();
        if (u < 0.02) {
          oracle.forget(r.service, r.real);
          ours.forgetReal(r.service, r.real);
          continue;
        }
        const seconds = u < 0.5 ? durations[Math.floor(rand() * durations.length)]! : rand() * 6;
        const reason = rand() < 0.3 ? PROBE_REASONS[Math.floor(rand() * PROBE_REASONS.length)]! : null;
        oracle.observe(r.service, r.real, seconds, reason);
        ours.observeProbe(r.service, r.real, seconds, reason);
      }
      const expected = await oracle.registry.metrics();
      expect(`${ours.text()}\n`).toBe(expected);
    }
  });

  it('writes each family with its HELP and TYPE lines when there are no reals and no probes yet', async () => {
    const { src } = randomSource(4, 0);
    expect(`${new RealMetrics(src).text()}\n`).toBe(await promClientOracle(src).registry.metrics());
  });

  it('refuses a probe duration that is not a finite number, as prom-client does', () => {
    const { src } = randomSource(5, 1);
    const m = new RealMetrics(src);
    expect(() => m.observeProbe('web', '10.0.0.0', Number.NaN, null)).toThrow(TypeError);
    expect(m.text()).not.toContain('dsrlb_healthcheck_duration_seconds_count');
  });
});

describe('DaemonMetrics.text', () => {
  it('is prom-client\'s families, then the per-real ones, each family once', async () => {
    const { src } = randomSource(6, 20);
    const m = new DaemonMetrics(src);
    m.observeProbe('web', '10.0.0.0', 0.002, 'timeout');
    const text = await m.text();
    expect(text.endsWith('\n')).toBe(true);
    expect(text).not.toContain('\n\n\n');
    const families = [...text.matchAll(/^# TYPE (\S+) /gm)].map((x) => x[1]!);
    expect(new Set(families).size).toBe(families.length);
    const registered = m.registry.getMetricsAsArray().map((x) => x.name);
    const perReal = [...new RealMetrics(src).text().matchAll(/^# TYPE (\S+) /gm)].map((x) => x[1]!);
    expect(families).toEqual([...registered, ...perReal]);
    for (const name of ['dsrlb_rx_packets_total', 'process_cpu_seconds_total', 'dsrlb_forwarded_packets_total', 'dsrlb_healthcheck_duration_seconds', 'dsrlb_healthcheck_failures_total']) {
      expect(families).toContain(name);
    }
    expect(text).toContain('dsrlb_healthcheck_failures_total{service="web",real="10.0.0.0",reason="timeout"} 1');
    expect(m.contentType).toBe(m.registry.contentType);
  });
});

describe('DaemonMetrics: event-loop delay', () => {
  it('reports the delay less the 200 ms sampling interval (an idle loop read 0.200 s)', async () => {
    const { src } = randomSource(7, 1);
    const m = new DaemonMetrics(src);
    await m.text(); // the histogram starts afresh with each scrape
    await new Promise((r) => setTimeout(r, 1100));
    const text = await m.text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
    for (const stat of ['min', 'mean', 'p50', 'p99', 'max']) {
      const v = value(`nodejs_eventloop_lag_${stat}_seconds`);
      // An idle loop: a few ms at most; before, 0.2 and more.
      expect(v, stat).toBeGreaterThanOrEqual(0);
      expect(v, stat).toBeLessThan(0.1);
    }
    expect(text).toMatch(/^# HELP nodejs_eventloop_lag_p99_seconds The 99th percentile of the recorded event loop delays, less the 200 ms sampling interval\.$/m);
    expect(text.match(/^# TYPE nodejs_eventloop_lag_p99_seconds /gm)).toHaveLength(1);
  });
});
