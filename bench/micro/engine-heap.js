// Heap-flat check: the engine runs at full speed over in-memory batches (10,000 UDP flows) for a
// fixed time; heap used after a full GC at the start and at the end should match within 5%, and the
// number of garbage collections during the run shows whether the hot path allocates at all.
// Run with --expose-gc.

import { PerformanceObserver, performance } from 'node:perf_hooks';
import { createBatches, createEngine, flags, printResult } from './micro-setup.js';

const opts = flags();
const seconds = Number(opts.seconds ?? (opts.quick === true ? 10 : 60));
if (typeof globalThis.gc !== 'function') throw new Error('run with node --expose-gc');
const gc = globalThis.gc;

const { engine } = createEngine();
const { batches, packetsPerRound } = createBatches({ flows: 10_000 });
const origin = performance.timeOrigin;
const round = () => {
  for (let b = 0; b < batches.length; b++) engine.processBatch(batches[b], origin + performance.now());
};
// Warm-up: JIT, first flow inserts; then a clean heap to start from.
for (let i = 0; i < 200; i++) round();
gc();
gc();
const start = process.memoryUsage();

const gcs = { minor: 0, major: 0, other: 0, pauseMs: 0 };
const observer = new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    const kind = e.detail?.kind;
    // NODE_PERFORMANCE_GC_MINOR = 1, MAJOR = 4 (perf_hooks constants)
    if (kind === 1) gcs.minor++;
    else if (kind === 4) gcs.major++;
    else gcs.other++;
    gcs.pauseMs += e.duration;
  }
});
observer.observe({ entryTypes: ['gc'] });

let maxHeapUsed = start.heapUsed;
let rounds = 0;
const t0 = performance.now();
const end = t0 + seconds * 1000;
let nextProbe = t0 + 1000;
while (performance.now() < end) {
  round();
  rounds++;
  const t = performance.now();
  if (t >= nextProbe) {
    maxHeapUsed = Math.max(maxHeapUsed, process.memoryUsage().heapUsed);
    nextProbe = t + 1000;
  }
}
const elapsedS = (performance.now() - t0) / 1000;
// Let the observer deliver the last entries, then compare heaps after a full GC.
await new Promise((r) => setTimeout(r, 50));
observer.disconnect();
const endNoGc = process.memoryUsage();
gc();
gc();
const endMem = process.memoryUsage();
const packets = rounds * packetsPerRound;
printResult({
  bench: 'engine-heap',
  seconds: elapsedS,
  packets,
  nsPerPacket: (elapsedS * 1e9) / packets,
  heapUsedStart: start.heapUsed,
  heapUsedEnd: endMem.heapUsed,
  heapUsedEndBeforeGc: endNoGc.heapUsed,
  heapChangePct: ((endMem.heapUsed - start.heapUsed) / start.heapUsed) * 100,
  maxHeapUsedSampled: maxHeapUsed,
  gcDuringRun: gcs,
});
