// Runs the engine's common paths (UDP and TCP flow-table hits, L2) long enough for V8 to optimize
// them, in a child node process that test/unit/engine-inlining.test.ts starts with the flags that
// make V8 print its inlining decisions:
//   node --no-concurrent-recompilation --trace-opt --trace-turbo-inlining \
//     --import ./test/support/ts-loader.mjs test/support/engine-inlining-harness.ts
// (synchronous compiles, so that each compile's lines come together). Ends with one line: done.

import { paths } from './engine-alloc-paths.js';

const NAMES = ['l2: udp4 flow-table hits', 'l2: tcp4 established hits'];
const ROUNDS = 20_000;

const made = NAMES.map((name) => {
  const p = paths.find((q) => q.name === name);
  if (p === undefined) throw new Error(`engine-inlining-harness: no path "${name}"`);
  return p.make();
});
for (const p of made) p.prepare(ROUNDS);
for (let r = 0; r < ROUNDS; r++) for (const p of made) p.round();
for (const p of made) p.verify();
console.log('done');
