// Micro-benchmark: the flow table at 1M entries (capacity 1M, the default): nanoseconds per insert,
// per lookup that hits and per lookup that misses, each including filling the key and the table's
// own bucket hash (indexHash) as the engine does; the housekeeping sweep the packet loop runs every
// 100 ms (expire with a budget of 50,000) over the 1M flows idle 20 s, none due; plus the bytes its
// typed arrays hold.

import { performance } from 'node:perf_hooks';
import { FlowState, FlowTable } from '../../dist/dataplane/flow-table.js';
import { MAX_REAL_IDS } from '../../dist/dataplane/counters.js';
import { flags, printResult } from './micro-setup.js';

const quick = flags().quick === true;
const N = 1_000_000;
const TIMEOUTS = { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 };
const VIP = 0x0a000064;

const table = new FlowTable(N, TIMEOUTS, MAX_REAL_IDS);
const key = table.key;
// UDP flow i from 192.0.2.0/24 and up, 50,000 ports per source address, to VIP:9000.
function fill(i) {
  key[0] = 17 | (4 << 8);
  key[1] = (0xc0000200 + Math.floor(i / 50_000)) >>> 0;
  key[2] = 0;
  key[3] = 0;
  key[4] = 0;
  key[5] = VIP;
  key[6] = 0;
  key[7] = 0;
  key[8] = 0;
  key[9] = (((10_000 + (i % 50_000)) << 16) | 9000) >>> 0;
  return table.indexHash();
}

const now = 1_000_000;
// Warm-up on a table of its own: the timed inserts below run compiled code, not the interpreter.
const warmTable = new FlowTable(100_000, TIMEOUTS, MAX_REAL_IDS);
for (let i = 0; i < 100_000; i++) {
  fill(i);
  warmTable.key.set(key);
  warmTable.insert(warmTable.indexHash(), i & 1023, FlowState.udp, now);
}
let t0 = performance.now();
for (let i = 0; i < N; i++) table.insert(fill(i), i & 1023, FlowState.udp, now);
const insertNs = ((performance.now() - t0) * 1e6) / N;
if (table.size !== N) throw new Error(`size ${table.size} after ${N} inserts`);

const rounds = quick ? 1 : 3;
let hits = 0;
t0 = performance.now();
for (let r = 0; r < rounds; r++) for (let i = 0; i < N; i++) if (table.lookup(fill(i), now) >= 0) hits++;
const lookupHitNs = ((performance.now() - t0) * 1e6) / (N * rounds);
if (hits !== N * rounds) throw new Error(`${hits} hits of ${N * rounds}`);

// Random order: lookups of live flows in arrival order are kinder to the caches than real traffic.
const order = new Int32Array(N);
for (let i = 0; i < N; i++) order[i] = i;
let seed = 12345;
for (let i = N - 1; i > 0; i--) {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
  const j = seed % (i + 1);
  const t = order[i];
  order[i] = order[j];
  order[j] = t;
}
t0 = performance.now();
for (let r = 0; r < rounds; r++) for (let i = 0; i < N; i++) table.lookup(fill(order[i]), now);
const lookupRandomNs = ((performance.now() - t0) * 1e6) / (N * rounds);

let misses = 0;
t0 = performance.now();
for (let r = 0; r < rounds; r++) for (let i = N; i < 2 * N; i++) if (table.lookup(fill(i), now) < 0) misses++;
const lookupMissNs = ((performance.now() - t0) * 1e6) / (N * rounds);
if (misses !== N * rounds) throw new Error('a lookup of an absent key hit');

// The packet loop's housekeeping: every flow idle 20 s (past the 10 s close timeout, far from the
// 300 s UDP one), nothing due. The loop calls it every 100 ms.
const sweeps = [];
for (let k = 0; k < 21; k++) {
  t0 = performance.now();
  table.expire(now + 20_000 + k * 100, 50_000);
  sweeps.push(performance.now() - t0);
}
sweeps.sort((a, b) => a - b);
if (table.size !== N) throw new Error('the sweep removed flows that were not due');

printResult({
  bench: 'flow-table',
  entries: N,
  insertNs,
  lookupHitSequentialNs: lookupHitNs,
  lookupHitRandomNs: lookupRandomNs,
  lookupMissNs,
  housekeepingSweepMedianMs: sweeps[10],
  tableBytes: table.memoryBytes,
});
