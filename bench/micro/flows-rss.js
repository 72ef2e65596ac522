// Memory with 1M live flows: an Engine with the default flow-table capacity (1,000,000) is fed
// 1,000,000 distinct UDP flows through its normal batch path (one small batch rewritten between
// rounds), then the process's RSS and heap are read after a full GC. Run with --expose-gc.

import { performance } from 'node:perf_hooks';
import { readFileSync } from 'node:fs';
import { createBatches, createEngine, FRAME_BYTES, flags, flowAddress, printResult, writeFrame } from './micro-setup.js';

const opts = flags();
const flows = Number(opts.flows ?? 1_000_000);
if (typeof globalThis.gc !== 'function') throw new Error('run with node --expose-gc');
const gc = globalThis.gc;

function rssBytes() {
  // VmRSS from /proc: the figure `ps` and cgroup limits see.
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) * 1024 : process.memoryUsage().rss;
}

gc();
const before = { rss: rssBytes(), heapUsed: process.memoryUsage().heapUsed };
const { engine } = createEngine({ flowCapacity: 1_000_000 });
const BATCH = 256;
const { buf, batches } = createBatches({ flows: BATCH });
const batch = batches[0];
const afterCreate = rssBytes();

const t0 = performance.now();
for (let first = 0; first < flows; first += BATCH) {
  const n = Math.min(BATCH, flows - first);
  for (let i = 0; i < n; i++) {
    // The frame written again for the next client address and port (with its IPv4 header
    // checksum, which the engine verifies): a new flow each time.
    writeFrame(buf, i * FRAME_BYTES, flowAddress(first + i));
  }
  batch.count = n;
  engine.processBatch(batch, 1_000_000 + performance.now());
}
const fillS = (performance.now() - t0) / 1000;
gc();
gc();
const rss = rssBytes();
const mem = process.memoryUsage();
if (engine.flows.size !== flows) throw new Error(`${engine.flows.size} flows live after ${flows} distinct ones`);
printResult({
  bench: 'flows-rss',
  flows: engine.flows.size,
  flowTableBytes: engine.flows.memoryBytes,
  rssBytes: rss,
  rssBeforeEngineBytes: before.rss,
  rssAfterCreateBytes: afterCreate,
  heapUsedBytes: mem.heapUsed,
  arrayBuffersBytes: mem.arrayBuffers,
  fillSeconds: fillS,
  nsPerNewFlow: (fillS * 1e9) / flows,
});
