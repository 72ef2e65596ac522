// The dsrlb command line as users meet it: exit codes (0 ok, 1 user error, 2 refused), one line per
// problem on stderr, help. Runs the built CLI (npm test builds dist/ first); needs no privileges.

import { execFile } from 'node:child_process';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const CLI = resolve(import.meta.dirname, '../../bin/dsrlb.js');
const run = promisify(execFile);

async function dsrlb(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [CLI, ...args]);
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('dsrlb CLI', () => {
  it('validate: exit 0 for a good config, exit 1 with every problem as path: message', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const good = join(dir, 'good.yaml');
    await writeFile(good, 'interface: eth0\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    reals:\n      - address: 10.0.0.11\n');
    const ok = await dsrlb(['validate', '-c', good]);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain('ok (1 services)');
    const bad = join(dir, 'bad.yaml');
    await writeFile(bad, 'interface: eth0\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    schedular: maglev\n    reals:\n      - address: 10.0.1.300\n');
    const r = await dsrlb(['validate', '-c', bad]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n')).toEqual([
      'services[0].schedular: unknown key (did you mean "scheduler"?)',
      'services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address',
    ]);
  });

  it('exits 1 with one line for an unknown command or a missing argument, 0 for --help', async () => {
    const unknown = await dsrlb(['frobnicate']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr.trim().split('\n')).toHaveLength(1);
    const missing = await dsrlb(['drain', 'web']);
    expect(missing.code).toBe(1);
    const help = await dsrlb(['--help']);
    expect(help.code).toBe(0);
    for (const cmd of ['run', 'validate', 'status', 'drain', 'weight', 'reload', 'explain', 'plan', 'simulate', 'demo', 'decap', 'announce', 'withdraw']) {
      expect(help.stdout).toContain(`dsrlb ${cmd}`);
    }
  });

  it('exits 2 when the daemon cannot be reached', async () => {
    const r = await dsrlb(['status', '--admin', 'http://127.0.0.1:9']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/cannot reach the daemon at http:\/\/127\.0\.0\.1:9/);
  });

  it('simulate prints the example trace and refuses an invalid scenario with path: message lines', async () => {
    const ok = await dsrlb(['simulate', resolve(import.meta.dirname, '../../examples/simulate-wlc-vs-maglev.yaml')]);
    expect(ok.code).toBe(0);
    expect(JSON.parse(ok.stdout)).toHaveProperty('summary');
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-cli-'));
    const bad = join(dir, 'bad.yaml');
    await writeFile(bad, 'config: { interface: eth0, services: [ { vip: 10.0.0.1, port: 80, reals: [ { address: 10.0.0.2 } ] } ] }\nevents:\n  - at: 2s\n    flow: { id: a, client: "192.0.2.1:1000", duration: 0s }\n');
    const r = await dsrlb(['simulate', bad]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/events\[0\]\.flow\.duration: /);
  });
});
