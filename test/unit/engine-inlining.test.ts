// The packet path compiles as one unit: V8 inlines the parser, the service lookup, the flow table's
// hash, lookup and touch, and the L2 rewrite into processFrame (or into processBatch, should that
// inline processFrame). Past V8's default inlining budgets most of them stayed calls, and a packet
// cost about a quarter more (src/dataplane/inlining-budget.ts raises them). This guards the budgets and the code's
// size: a hot function grown past them shows up here, not as a slower bench months later.
// V8 reports its decisions with --trace-turbo-inlining in a child process (the harness).

import { spawn } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const repoRoot = fileURLToPath(new URL('../..', import.meta.url));

/** What the packet path must have inlined: every function a flow-table hit runs per packet. */
const HOT = [
  // parser
  'parseFrame', 'clearSlot', 'reset', 'parseIpv4', 'readWord32', 'ipv4HeaderSum', 'parseL4',
  'findService',
  // flow table: key, bucket hash, lookup, touch (a hit that is not its list's tail moves)
  'place', 'keyFromPacket', 'indexHash', 'flowIndexHash', 'isIpv4Key', 'ipv4IndexHash', 'lane', 'finishIndexHash',
  'lookup', 'realOf', 'touch', 'checkLive', 'tcpNext', 'unlink', 'linkTail',
  'forward',
];

interface Compile {
  fn: string;
  inlined: Set<string>;
}

/**
 * The harness's stdout, V8's trace included, written to a file: node makes a pipe non-blocking, and
 * V8 prints with stdio, whose writes into a full pipe fail (EAGAIN) and lose lines.
 */
function runHarness(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'engine-inlining-'));
  const file = join(dir, 'trace.txt');
  const fd = openSync(file, 'w');
  return new Promise<string>((resolve, reject) => {
    const args = ['--no-concurrent-recompilation', '--trace-opt', '--trace-turbo-inlining', '--import', './test/support/ts-loader.mjs', 'test/support/engine-inlining-harness.ts'];
    const child = spawn(process.execPath, args, { cwd: repoRoot, env: { ...process.env, NODE_OPTIONS: '' }, stdio: ['ignore', fd, 'pipe'] });
    let err = '';
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (err += d));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(readFileSync(file, 'utf8')) : reject(new Error(`engine-inlining-harness exited with ${code}:\n${err}`))));
  }).finally(() => {
    closeSync(fd);
    rmSync(dir, { recursive: true, force: true });
  });
}

/** The TurboFan compiles in the trace, in order, each with the functions inlined into it. */
function compiles(trace: string): Compile[] {
  const list: Compile[] = [];
  let current: Compile | null = null;
  for (const line of trace.split('\n')) {
    const start = /^\[compiling method .*<JSFunction (\S+) .*\(target TURBOFAN\)/.exec(line);
    if (start) {
      current = { fn: start[1]!, inlined: new Set() };
      list.push(current);
      continue;
    }
    const inl = /^Inlining .*<SharedFunctionInfo (\S+)>\} into /.exec(line);
    if (inl && current) current.inlined.add(inl[1]!);
    if (line.startsWith('[completed compiling')) current = null;
  }
  return list;
}

describe('engine: the packet path compiles as one unit', () => {
  it('inlines every function of a flow-table hit into the code that runs processFrame', async () => {
    const trace = await runHarness();
    expect(trace.trimEnd().endsWith('done')).toBe(true);
    const all = compiles(trace);
    // The last compile that holds processFrame: processFrame's own, or processBatch's with it inlined.
    const unit = all.filter((c) => c.fn === 'processFrame' || (c.fn === 'processBatch' && c.inlined.has('processFrame'))).at(-1);
    if (unit === undefined) throw new Error(`processFrame was never optimized; compiles: ${all.map((c) => c.fn).join(', ')}`);
    const missing = HOT.filter((f) => !unit.inlined.has(f));
    expect(missing, `left as calls in ${unit.fn}: ${missing.join(', ')}`).toEqual([]);
  }, 120_000);
});
