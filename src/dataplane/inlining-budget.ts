// V8 compiles the packet path as one unit: processFrame with the parser, the service lookup, the
// flow table's hash, lookup and touch, and the L2 rewrite inlined into it. With V8's default
// budget for the bytecode inlined into one function (920 bytes) it ran out after the rewrite and
// place(), and the rest stayed calls; the whole path is about 3,300 bytes (V8 11.3, Node 20).
// Raised here for every thread of the process: V8 flags are per process, and TurboFan reads these
// each time it compiles, so setting them from a running process takes effect for what it compiles
// later. Imported by the engine, so that the daemon's loops, the simulator, the tests and the
// micro-benchmarks all run the same code. The limit on one function's size (460 bytes) stays:
// parseIpv4 and flowIndexHash are split to fit it, and processFrame (576) is not inlined into
// processBatch, so a deopt on new traffic (a first IPv6 packet) costs processFrame alone its code.
// test/unit/engine-inlining.test.ts checks that the path still compiles as one unit.

import { setFlagsFromString } from 'node:v8';

/**
 * Bytecode bytes V8 may inline into one optimized function (the path with room to grow), as both
 * of its limits: the cumulative budget (default 920) and the absolute cap (default 4600). An
 * inlined function that has optimized code of its own counts with what that code inlined (placeNew
 * about 1,500 bytes), which can reach the default cap before touch.
 */
export const INLINED_BYTECODE_BUDGET = 12000;

setFlagsFromString(`--max-inlined-bytecode-size-cumulative=${INLINED_BYTECODE_BUDGET}`);
setFlagsFromString(`--max-inlined-bytecode-size-absolute=${INLINED_BYTECODE_BUDGET}`);
