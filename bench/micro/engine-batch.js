// Micro-benchmark: nanoseconds per packet of the engine's TypeScript work alone (parse, service,
// flow lookup, pick, L2 rewrite, counters), over prebuilt in-memory batches reused every round, so
// no I/O and no copying is measured. Cases: 10,000 UDP flows, 1 UDP flow, 10,000 TCP flows (ACKs).

import { performance } from 'node:perf_hooks';
import { Counter } from '../../dist/dataplane/counters.js';
import { createBatches, createEngine, flags, printResult } from './micro-setup.js';

const opts = flags();
const quick = opts.quick === true;
const measureMs = Number(opts['measure-ms'] ?? (quick ? 1500 : 4000));
const warmupMs = Number(opts['warmup-ms'] ?? (quick ? 500 : 1500));

function runCase(name, { flows, tcp }) {
  const { engine, counters } = createEngine();
  const { batches, packetsPerRound } = createBatches({ flows, tcp });
  const origin = performance.timeOrigin;
  const round = () => {
    for (let b = 0; b < batches.length; b++) engine.processBatch(batches[b], origin + performance.now());
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
  const t0 = performance.now();
  const rounds = until(measureMs);
  const elapsedMs = performance.now() - t0;
  const packets = rounds * packetsPerRound;
  const rx = counters[Counter.rxPackets] - rx0;
  const tx = counters[Counter.txPackets] - tx0;
  if (rx !== packets || tx !== packets) throw new Error(`${name}: ${packets} packets in, rx ${rx}, tx ${tx}: not every frame was forwarded`);
  return {
    name,
    flows,
    packets,
    nsPerPacket: (elapsedMs * 1e6) / packets,
    mpps: packets / elapsedMs / 1e3,
    flowTableEntries: engine.flows.size,
  };
}

const cases = [
  runCase('udp, 10,000 flows', { flows: 10_000, tcp: false }),
  runCase('udp, 1 flow', { flows: 1, tcp: false }),
  runCase('tcp ACKs, 10,000 flows', { flows: 10_000, tcp: true }),
];
printResult({ bench: 'engine-batch', measureMs, cases });
