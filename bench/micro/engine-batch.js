// Micro-benchmark: nanoseconds per packet of the engine's TypeScript work alone (parse, service,
// flow lookup, pick, L2 rewrite, counters), over prebuilt in-memory batches reused every round, so
// no I/O and no copying is measured. Cases: 10,000 UDP flows, 1 UDP flow, 10,000 TCP flows (ACKs),
// and 10,000 UDP flows with cold caches: 100-frame batches (what the ring hands over per wake-up at
// 100,000 pps) with 2 MiB of other memory written between them, as the kernel's work between two
// wake-ups does. Only the engine's calls are timed (a clock read around each batch, under 1 ns per
// packet), so the writing is not counted: subtracting it measured alone over-subtracted, because
// back-to-back it is bound by memory bandwidth and between batches it drains behind the engine's
// work (the cold case came out negative, -220 ns). Last, 1,000,000 UDP flows
// in a fixed random order (100-frame batches): every packet's frame, index bucket, flow record and
// LRU neighbours are cache misses, as with many flows of real traffic (the other cases, like the
// namespace bench, send flows round-robin, so LRU neighbours sit next to each other in memory).
// And 2,000 flows whose public flow hash (hashSeed 0) shares its low 12 bits: keyed by that hash,
// the table's index would hold them in one probe run (1,270 ns a packet when it was).

import { performance } from 'node:perf_hooks';
import { Counter } from '../../dist/dataplane/counters.js';
import { craftedFlowAddresses, createBatches, createEngine, flags, printResult } from './micro-setup.js';

const opts = flags();
const quick = opts.quick === true;
const measureMs = Number(opts['measure-ms'] ?? (quick ? 1500 : 4000));
const warmupMs = Number(opts['warmup-ms'] ?? (quick ? 500 : 1500));

const EVICT_BYTES = 2 << 20;
const evictBuf = new Uint8Array(EVICT_BYTES);
let evictRound = 0;
function evict() {
  evictRound = (evictRound + 1) & 0xff;
  for (let i = 0; i < EVICT_BYTES; i += 64) evictBuf[i] = evictRound;
}

/** Spreads the frames of all batches over the batches in a fixed random order. */
function shuffleFrames(batches) {
  let seed = 12345;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296;
  const offsets = batches.flatMap((b) => Array.from(b.offsets.subarray(0, b.count)));
  for (let i = offsets.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [offsets[i], offsets[j]] = [offsets[j], offsets[i]];
  }
  let k = 0;
  for (const b of batches) for (let i = 0; i < b.count; i++) b.offsets[i] = offsets[k++];
}

function runCase(name, { flows, tcp, cold = false, random = false, addresses = undefined }) {
  const { engine, counters } = createEngine();
  const { batches, packetsPerRound } = createBatches({ flows, tcp, addresses, batchSize: cold || random ? 100 : 256 });
  if (random) shuffleFrames(batches);
  const origin = performance.timeOrigin;
  let engineMs = 0;
  const round = () => {
    for (let b = 0; b < batches.length; b++) {
      if (cold) evict();
      const t = performance.now();
      engine.processBatch(batches[b], origin + t);
      engineMs += performance.now() - t;
    }
  };
  const until = (ms) => {
    const end = performance.now() + ms;
    let rounds = 0;
    while (performance.now() < end) {
      round();
      rounds++;
    }
    return rounds;
  };
  until(warmupMs);
  const tx0 = counters[Counter.txPackets];
  const rx0 = counters[Counter.rxPackets];
  engineMs = 0;
  const rounds = until(measureMs);
  const packets = rounds * packetsPerRound;
  const rx = counters[Counter.rxPackets] - rx0;
  const tx = counters[Counter.txPackets] - tx0;
  if (rx !== packets || tx !== packets) throw new Error(`${name}: ${packets} packets in, rx ${rx}, tx ${tx}: not every frame was forwarded`);
  const ns = (engineMs * 1e6) / packets;
  return {
    name,
    flows,
    packets,
    nsPerPacket: ns,
    mpps: 1e3 / ns,
    flowTableEntries: engine.flows.size,
  };
}

const cases = [
  runCase('udp, 10,000 flows', { flows: 10_000, tcp: false }),
  runCase('udp, 1 flow', { flows: 1, tcp: false }),
  runCase('tcp ACKs, 10,000 flows', { flows: 10_000, tcp: true }),
  runCase('udp, 10,000 flows, cold caches', { flows: 10_000, tcp: false, cold: true }),
  runCase(`udp, ${quick ? '100,000' : '1,000,000'} flows, random order`, { flows: quick ? 100_000 : 1_000_000, tcp: false, random: true }),
  // 2,000 flows fill the table's first index (4,096 buckets): all in one bucket's run under flowHash.
  runCase('udp, 2,000 flows aimed at one bucket', { flows: 2000, tcp: false, addresses: craftedFlowAddresses(2000, 12) }),
];
printResult({ bench: 'engine-batch', measureMs, cases });
