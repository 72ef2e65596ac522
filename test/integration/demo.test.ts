// `dsrlb demo`, the README's first line, as a user runs it (root, the built CLI): it answers every
// request with no reply crossing the LB; a second demo started meanwhile is refused; Ctrl-C during
// the build, and a failure (a curl that cannot reach the daemon), leave no namespace, daemon or
// run directory behind and return; `--down` removes the lab. Uses the demo's own fixed names
// (dsrlb-demo-*, /run/dsrlb-demo): a demo lab a person left up on this host is replaced.

import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { dsrlbArgv } from '../../src/cli/command-argv.js';
import { requireRoot, sleep } from '../support/lab-daemon.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

interface Run {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

function demo(args: string[], opts: { env?: NodeJS.ProcessEnv; interruptAfterMs?: number; timeoutMs?: number } = {}): Promise<Run> {
  const [node, ...rest] = dsrlbArgv(repoRoot);
  const child = spawn(node!, [...rest, 'demo', ...args], { env: opts.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  if (opts.interruptAfterMs !== undefined) setTimeout(() => child.kill('SIGINT'), opts.interruptAfterMs);
  const killer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 90_000);
  return new Promise((done) =>
    child.once('exit', (code, signal) => {
      clearTimeout(killer);
      done({ code, signal, stdout, stderr });
    }),
  );
}

function leftovers(): { namespaces: number; runDir: boolean; daemons: number } {
  const namespaces = spawnSyncText('ip', ['netns', 'list']).split('\n').filter((l) => l.startsWith('dsrlb-demo-')).length;
  const daemons = spawnSyncText('pgrep', ['-f', '/run/dsrlb-demo/dsrlb.yaml']).split('\n').filter((l) => l.trim() !== '').length;
  return { namespaces, runDir: existsSync('/run/dsrlb-demo'), daemons };
}

function spawnSyncText(cmd: string, args: string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8' });
  } catch (err) {
    return ((err as { stdout?: string }).stdout ?? '').toString();
  }
}

const none = { namespaces: 0, runDir: false, daemons: 0 };

describe('dsrlb demo', () => {
  afterAll(async () => {
    await demo(['--down']);
  });

  it('answers every request through the LB with no reply crossing it, refuses a second demo meanwhile, and --down removes the lab', async () => {
    requireRoot();
    const first = demo(['--requests', '20']);
    await sleep(700);
    const second = await demo(['--requests', '5']);
    expect(second.code).toBe(2);
    expect(second.stderr).toContain('another dsrlb demo is running on this host');
    const r = await first;
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('requests answered: 20/20, failed: 0');
    expect(r.stdout).toMatch(/on the LB's interface: [1-9]\d* TCP frames to 10\.77\.0\.100 \(requests, in and forwarded\), 0 from it \(replies\), 0 reply bytes/);
    expect(r.stdout).toContain('-> zero response bytes crossed the LB');
    // The demo waits for the reals' MACs: no frame dropped (before: 10 neighbor_unknown, unsaid).
    expect(r.stdout).not.toContain('dropped by the LB');
    // The numbers add up: every frame in from the client went out to a real, each seen on the
    // interface twice (tcpdump's own misses, if any, said and added back).
    const frames = /on the LB's interface: (\d+) TCP frames.*?(?:\(tcpdump missed (\d+) frames\))?$/m.exec(r.stdout)!;
    const forwarded = [...r.stdout.matchAll(/^ {2}r\d\s+\S+\s+\d+ \(\d+%\)\s+(\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
    expect(forwarded).toBeGreaterThan(0);
    expect(Number(frames[1]) + Number(frames[2] ?? 0)).toBe(2 * forwarded);
    // The lab stays up for poking.
    expect(leftovers()).toMatchObject({ namespaces: 6, runDir: true, daemons: 1 });
    const down = await demo(['--down']);
    expect([down.code, down.stdout]).toEqual([0, 'dsrlb demo: removed\n']);
    expect(leftovers()).toEqual(none);
    // Again: nothing is left, and it says so (it said "removed" as well).
    const again = await demo(['--down']);
    expect([again.code, again.stdout]).toEqual([0, 'dsrlb demo: nothing to remove (no demo lab)\n']);
  }, 120_000);

  it('removes a half-built lab on Ctrl-C and exits 130', async () => {
    requireRoot();
    // Early enough to land while the lab is built on a fast host (a whole demo can take 2 s), late
    // enough for the handler to be there (node and the CLI load first).
    const r = await demo([], { interruptAfterMs: 1000 });
    expect(r.code).toBe(130);
    expect(r.stderr).toContain('SIGINT: stopping, the lab is removed');
    // An interrupt is no failure: no daemon log dumped as if one.
    expect(r.stderr).not.toContain("the daemon's last log lines");
    expect(leftovers()).toEqual(none);
  }, 120_000);

  it('removes the lab, shows the daemon log and exits 2 when the daemon cannot be reached, instead of hanging', async () => {
    requireRoot();
    const bin = mkdtempSync(join(tmpdir(), 'dsrt-demo-bin-'));
    try {
      writeFileSync(join(bin, 'curl'), '#!/bin/sh\nexit 7\n');
      chmodSync(join(bin, 'curl'), 0o755);
      const r = await demo([], { env: { ...process.env, PATH: `${bin}:${process.env.PATH}` } });
      expect(r.code).toBe(2);
      expect(r.stderr).toContain('dsrlb demo: timed out waiting for the daemon to start');
      expect(r.stderr).toContain("the daemon's last log lines");
      expect(r.stderr).toContain('dsrlb demo: removing the lab');
      expect(leftovers()).toEqual(none);
    } finally {
      rmSync(bin, { recursive: true, force: true });
    }
  }, 120_000);
});
