// New TCP connections to HOST:PORT from inside a namespace, one every few ms, each closed once
// open: how a restart or reload looks to clients arriving meanwhile. A connection refused or reset
// is a RST someone sent (the LB's kernel, holding a VIP without its drop rule); a timeout is a
// packet dropped, which TCP retransmits.

import { createInterface } from 'node:readline';
import type { Lab, LabHost } from '../../src/lab/netns-lab.js';

export interface ConnectCounts {
  opened: number;
  refused: number;
  reset: number;
  other: number;
}

const SCRIPT = `
const net = require('node:net');
const [host, port, everyMs] = process.argv.slice(1);
const counts = { opened: 0, refused: 0, reset: 0, other: 0 };
let pending = 0;
let stopping = false;
const one = () => {
  pending++;
  const s = net.connect(Number(port), host);
  s.setTimeout(4000, () => s.destroy(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })));
  s.on('connect', () => { counts.opened++; s.end(); });
  s.on('error', (e) => { if (e.code === 'ECONNREFUSED') counts.refused++; else if (e.code === 'ECONNRESET') counts.reset++; else counts.other++; });
  s.on('close', () => { pending--; if (stopping && pending === 0) done(); });
};
const done = () => { process.stdout.write(JSON.stringify(counts) + '\\n'); process.exit(0); };
const timer = setInterval(one, Number(everyMs));
process.stdout.write('started\\n');
process.stdin.on('data', () => { stopping = true; clearInterval(timer); if (pending === 0) done(); });
`;

export async function startConnectStream(
  lab: Pick<Lab, 'spawn'>,
  ns: string | LabHost,
  host: string,
  port: number,
  everyMs = 4,
): Promise<{ stop: () => Promise<ConnectCounts>; kill: () => void }> {
  const p = lab.spawn(ns, [process.execPath, '-e', SCRIPT, host, String(port), String(everyMs)], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: p.stdout! })[Symbol.asyncIterator]();
  const first = await lines.next();
  if (first.value !== 'started') throw new Error(`connect stream did not start: ${String(first.value)}`);
  return {
    stop: async () => {
      p.stdin!.write('stop\n');
      const last = await lines.next();
      return JSON.parse(String(last.value)) as ConnectCounts;
    },
    /** For a test's finally: ends the stream at once if it still runs (stop() was not reached). */
    kill: () => {
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    },
  };
}
