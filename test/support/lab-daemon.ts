// Helpers for namespace tests that run `dsrlb run` in a lab's LB namespace and drive it from
// the client namespace: start/stop the daemon, HTTP load, metrics, status and the CLI.

import type { ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { dsrlbArgv } from '../../src/cli/command-argv.js';
import type { Lab, LabHost } from '../../src/lab/netns-lab.js';

export const ROOT = resolve(import.meta.dirname, '../..');
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function requireRoot(): void {
  if (process.getuid?.() !== 0) throw new Error('namespace tests need root: run as root (CI does)');
}

export interface RealStatus {
  address: string;
  intent: string;
  weight: number;
  mac: string | null;
  health: { state: string; lastError: string | null };
  activeFlows: number;
  inactiveFlows: number;
  drainFinished: boolean;
}
export interface Status {
  services: { name: string; panic: boolean; onBackups: boolean; dropping: boolean; tableFingerprint: string; reals: RealStatus[] }[];
}

/**
 * How long after status shows a health change the packet loops have it: the daemon gathers the
 * changes of 100 ms into one rebuild (QUEUED_REBUILD_MS), then posts the snapshot. A test that
 * sends traffic right after status shows a fact waits this long first.
 */
export const SNAPSHOT_LAG_MS = 300;

export class LabDaemon {
  readonly logs: string[] = [];
  private token: string | null = null;
  private constructor(
    readonly lab: Lab,
    readonly proc: ChildProcess,
    readonly adminUrl: string,
  ) {}

  /** Starts dsrlb in the LB namespace; resolves once it is healthy and `ready(status)` holds. */
  static async start(lab: Lab, configPath: string, ready: (s: Status) => boolean = allMacsKnown): Promise<LabDaemon> {
    return LabDaemon.startWith(lab, configPath, 'http://127.0.0.1:9743', null, ready);
  }

  /** As start(), for a daemon whose admin API is elsewhere and may need a bearer token. */
  static async startWith(lab: Lab, configPath: string, adminUrl: string, tokenFile: string | null, ready: (s: Status) => boolean = allMacsKnown): Promise<LabDaemon> {
    const proc = lab.spawn(lab.lb, [...dsrlbArgv(ROOT), 'run', '-c', configPath], { stdio: ['ignore', 'pipe', 'pipe'] });
    const d = new LabDaemon(lab, proc, adminUrl);
    if (tokenFile) d.token = (await readFile(tokenFile, 'utf8')).trim();
    createInterface({ input: proc.stdout! }).on('line', (l) => d.logs.push(l));
    createInterface({ input: proc.stderr! }).on('line', (l) => d.logs.push(`stderr: ${l}`));
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new Error(`dsrlb exited ${proc.exitCode}:\n${d.logs.join('\n')}`);
      const s = await d.status().catch(() => null);
      if (s && ready(s)) return d;
      await sleep(200);
    }
    throw new Error(`dsrlb did not become ready:\n${d.logs.join('\n')}`);
  }

  async status(): Promise<Status> {
    const auth = this.token ? ['-H', `Authorization: Bearer ${this.token}`] : [];
    const r = await this.lab.exec(this.lab.lb, ['curl', '-sf', ...auth, `${this.adminUrl}/status`]);
    if (r.code !== 0) throw new Error(`status: curl exit ${r.code}`);
    return JSON.parse(r.stdout) as Status;
  }

  async waitFor(what: string, check: (s: Status) => boolean, timeoutMs: number): Promise<number> {
    const start = Date.now();
    while (Date.now() - start < timeoutMs) {
      if (check(await this.status())) return Date.now() - start;
      await sleep(100);
    }
    throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}:\n${JSON.stringify(await this.status(), null, 1)}`);
  }

  async metrics(): Promise<string> {
    return (await this.lab.exec(this.lab.lb, ['curl', '-sf', 'http://127.0.0.1:9742/metrics'])).stdout;
  }

  /** Runs the dsrlb CLI inside the LB namespace. */
  cli(args: readonly string[]): Promise<{ stdout: string; stderr: string; code: number }> {
    return this.lab.exec(this.lab.lb, [...dsrlbArgv(ROOT), ...args, '--admin', this.adminUrl]);
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<number | null> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return this.proc.exitCode;
    const exited = new Promise<number | null>((r) => this.proc.once('exit', (code) => r(code)));
    this.proc.kill(signal);
    return exited;
  }
}

/**
 * A dsrlb config for a lab: interface eth0, metrics and admin on loopback (9742, 9743), `top`
 * lines, then the TCP service `web` on the VIP, port 80: its `service` lines, then its reals;
 * `after` lines (more services) at the end.
 */
export function labConfig(lab: Lab, o: { reals: readonly string[]; top?: readonly string[]; service?: readonly string[]; after?: readonly string[] }): string {
  return [
    'interface: eth0',
    'metrics: { listen: 127.0.0.1:9742 }',
    'admin: { listen: 127.0.0.1:9743 }',
    ...(o.top ?? []),
    'services:',
    '  - name: web',
    `    vip: ${lab.vip}`,
    '    port: 80',
    '    protocol: tcp',
    ...(o.service ?? []),
    '    reals:',
    ...o.reals.map((a) => `      - address: ${a}`),
    ...(o.after ?? []),
    '',
  ].join('\n');
}

export function allMacsKnown(s: Status): boolean {
  return s.services.every((svc) => svc.reals.every((r) => r.mac !== null));
}

export function allUp(s: Status): boolean {
  return allMacsKnown(s) && s.services.every((svc) => svc.reals.every((r) => r.health.state === 'up'));
}

export function metricValue(text: string, name: string, labels: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`) || (labels === '' && l.startsWith(`${name} `)));
  return line ? Number(line.split(' ').pop()) : 0;
}

export interface CountResult {
  ok: number;
  failed: number;
  byReal: Record<string, number>;
  distinctPorts: number;
  errors: Record<string, number>;
}

export async function httpCount(lab: Lab, n: number, opts: { timeoutMs?: number; host?: string; source?: string } = {}): Promise<CountResult> {
  const args = [process.execPath, join(ROOT, 'dist/lab/http-client.js'), '--host', opts.host ?? lab.vip, '--count', String(n)];
  if (opts.timeoutMs) args.push('--timeout', String(opts.timeoutMs));
  if (opts.source) args.push('--source', opts.source);
  const r = await lab.exec(lab.client, args, { timeoutMs: 180_000 });
  if (r.code !== 0) throw new Error(`http-client: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as CountResult;
}

/** Counts frames with source address VIP on the LB's interface (replies that crossed the LB). */
export function captureVipSourced(lab: Lab): { stop: () => Promise<number> } {
  const p = lab.spawn(lab.lb, ['tcpdump', '-i', 'eth0', '-nn', '-l', '-q', '--immediate-mode', 'src', 'host', lab.vip], { stdio: ['ignore', 'pipe', 'pipe'] });
  let frames = 0;
  createInterface({ input: p.stdout! }).on('line', (l) => {
    if (l.includes(' IP')) frames++;
  });
  return {
    stop: async () => {
      await sleep(300);
      p.kill('SIGTERM');
      await new Promise((r) => p.once('exit', r));
      return frames;
    },
  };
}

/** Starts (again) the lab HTTP server of one real; resolves when it listens. */
export async function startRealServer(lab: Lab, real: LabHost): Promise<ChildProcess> {
  const p = lab.spawn(real, [process.execPath, join(ROOT, 'dist/lab/real-http-server.js'), '--name', real.name, '--host', `${lab.vip},${real.ipv4}`, '--port', '80'], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    const rl = createInterface({ input: p.stdout! });
    rl.on('line', (l) => {
      if (l.includes('"ready"')) resolve();
    });
    p.once('exit', (c) => reject(new Error(`real server ${real.name} exited ${c}`)));
  });
  return p;
}

/**
 * The lab HTTP servers a test stops and starts again (a real's check fails while its server is
 * down): the lab's own until a test starts one itself. stopAll in afterAll (the lab stops its own).
 */
export class RealServers {
  private readonly started = new Map<string, ChildProcess>();

  constructor(private readonly lab: () => Lab) {}

  async stop(name: string): Promise<void> {
    const p = this.started.get(name) ?? this.lab().httpServers.get(name);
    if (p) await stopProcess(p);
    this.started.delete(name);
  }

  async start(name: string): Promise<void> {
    const lab = this.lab();
    this.started.set(name, await startRealServer(lab, lab.reals.find((r) => r.name === name)!));
  }

  async stopAll(): Promise<void> {
    for (const p of this.started.values()) await stopProcess(p);
    this.started.clear();
  }
}

export async function stopProcess(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise((r) => p.once('exit', r));
  p.kill('SIGTERM');
  await exited;
}
