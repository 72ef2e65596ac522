#!/usr/bin/env -S node --no-memory-reducer
// Entry point of the `dsrlb` command: the compiled CLI lives in dist/ (npm run build).
// --no-memory-reducer: V8's memory reducer would run full collections on the daemon's main thread
// some 8-25 s after every start, to hand back start-up memory (40-50 ms of CPU over its threads,
// in the first minute of traffic); the packet loops' workers never get it (loop-group.ts), however
// node is started. The flag is read when the main isolate is made, so it has to be given here.
import { main, hideBin } from '../dist/cli/main.js';

const code = await main(hideBin(process.argv));
// `run` never resolves; every other command exits with its code.
process.exitCode = code;
