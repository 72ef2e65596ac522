// Micro-benchmark: milliseconds of the main thread to build one /metrics scrape (DaemonMetrics.text())
// of a daemon with many reals (default 8 services x 1,000 reals), each with a probe-duration
// histogram and some failures, and the text's size. Median and best of a few scrapes after a
// warm-up one. Not part of `npm run bench` (the control plane at scale, README.md).
// `--reals N` (default 8000), `--runs N` (default 7, quick 3).

import { performance } from 'node:perf_hooks';
import { DaemonMetrics } from '../../dist/control/metrics.js';
import { createCounters, MAX_REAL_IDS, REAL_BASE, REAL_STRIDE } from '../../dist/dataplane/counters.js';
import { flags, printResult } from './micro-setup.js';

const opts = flags();
const quick = opts.quick === true;
const realCount = Math.min(Number(opts.reals ?? 8000), MAX_REAL_IDS);
const runs = Number(opts.runs ?? (quick ? 3 : 7));

const counters = createCounters();
const reals = [];
for (let id = 0; id < realCount; id++) {
  reals.push({ service: `svc${id % 8}`, real: `10.0.${id >> 8}.${id & 255}`, id, weight: 100, intent: 'active', up: true, drainFinished: false });
  counters[REAL_BASE + id * REAL_STRIDE] = id * 1000;
}
const metrics = new DaemonMetrics({
  counters: () => counters,
  realCount: (c, id, which) => c[REAL_BASE + id * REAL_STRIDE + which],
  reals: () => reals,
  activeFlows: (id) => id % 100,
  inactiveFlows: () => 3,
  flowTableCapacity: () => 1_000_000,
  panic: () => [],
  services: () => Array.from({ length: 8 }, (_, i) => ({ service: `svc${i}`, fingerprint: '0a1b2c3d', announced: null })),
});
// Three probes a real (two passed, one timed out): every real has its histogram and one failure series.
for (const r of reals) for (let k = 0; k < 3; k++) metrics.observeProbe(r.service, r.real, 0.002 * (k + 1), k === 2 ? 'timeout' : null);

let bytes = 0;
let lines = 0;
const times = [];
for (let i = 0; i <= runs; i++) {
  const t0 = performance.now();
  const text = await metrics.text();
  const ms = performance.now() - t0;
  if (i > 0) times.push(ms);
  bytes = Buffer.byteLength(text);
  lines = text.split('\n').length - 1;
}
times.sort((a, b) => a - b);
const round1 = (v) => Math.round(v * 10) / 10;
printResult({ bench: 'metrics-scrape', reals: realCount, runs, bytes, lines, medianMs: round1(times[Math.floor((times.length - 1) / 2)]), bestMs: round1(times[0]) });
