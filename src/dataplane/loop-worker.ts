// The packet loop's worker thread: a LoopRunner wired to the parent through postMessage.
// Nothing here blocks: no config parsing, no health checks, no HTTP.

import { parentPort, workerData } from 'node:worker_threads';
import { LoopRunner, type LoopRequest, type LoopSettings } from './loop-runner.js';

const runner = new LoopRunner(
  workerData as LoopSettings,
  (e) => {
    parentPort!.postMessage(e);
    if (e.type === 'stopped') parentPort!.close();
  },
  undefined,
  // This thread can end (a crash) while the group lives on: the group keeps its socket.
  true,
);
parentPort!.on('message', (m: LoopRequest) => runner.handle(m));
void runner.start();
