// Micro-benchmark: milliseconds to build a Maglev table (buildMaglevTable) for 10, 100 and 1000
// equal-weight reals at table sizes 65537 (the default) and 655373; median and best of a few builds.

import { performance } from 'node:perf_hooks';
import { buildMaglevTable } from '../../dist/dataplane/maglev-table.js';
import { flags, printResult } from './micro-setup.js';

const quick = flags().quick === true;

function reals(n) {
  return Array.from({ length: n }, (_, i) => ({ id: i, key: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`, weight: 100 }));
}

const cases = [];
for (const tableSize of [65537, 655373]) {
  for (const realCount of [10, 100, 1000]) {
    const input = reals(realCount);
    buildMaglevTable(input, tableSize, 0); // warm-up: JIT and first-touch of the allocator
    const runs = quick ? 3 : tableSize > 100_000 ? 5 : 9;
    const times = [];
    for (let r = 0; r < runs; r++) {
      const t0 = performance.now();
      const table = buildMaglevTable(input, tableSize, r + 1);
      times.push(performance.now() - t0);
      if (table[0] < 0) throw new Error('empty slot in a full table');
    }
    times.sort((a, b) => a - b);
    cases.push({ realCount, tableSize, medianMs: times[Math.floor(times.length / 2)], bestMs: times[0], runs });
  }
}
printResult({ bench: 'maglev-build', cases });
