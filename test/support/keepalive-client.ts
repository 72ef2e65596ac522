// N keep-alive HTTP connections from a lab's client namespace (dist/lab/http-client.js --keepalive):
// each round sends one request on every connection, so a test sees which real each connection
// reaches before and after an event (a restart, a drain, a loop started again) and which were reset.

import type { ChildProcess, SpawnOptions } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ROOT } from './lab-daemon.js';

interface Spawner {
  spawn(ns: string, argv: readonly string[], opts?: SpawnOptions): ChildProcess;
}

export interface KeepAliveRound {
  round: number;
  answers: ({ port: number; real: string } | { port: number; error: string })[];
}

/** N keep-alive connections from the client (http-client --keepalive); each round() sends one request on each. */
export class KeepAliveClient {
  private readonly lines: string[] = [];
  private waiters: (() => void)[] = [];
  private constructor(private readonly proc: ChildProcess) {
    createInterface({ input: proc.stdout! }).on('line', (l) => {
      this.lines.push(l);
      for (const w of this.waiters.splice(0)) w();
    });
  }

  /** From namespace `ns` of `lab` (a netns lab or a scale-out lab) to `vip`, port 80. */
  static async open(lab: Spawner, ns: string, vip: string, n: number, timeoutMs = 10_000): Promise<{ client: KeepAliveClient; opened: number; ports: number[] }> {
    const proc = lab.spawn(ns, [process.execPath, join(ROOT, 'dist/lab/http-client.js'), '--host', vip, '--keepalive', String(n), '--timeout', String(timeoutMs)], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const c = new KeepAliveClient(proc);
    const first = JSON.parse(await c.nextLine(timeoutMs * 2)) as { opened: number; ports: number[] };
    return { client: c, ...first };
  }

  private async nextLine(timeoutMs: number): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    while (this.lines.length === 0) {
      if (this.proc.exitCode !== null) throw new Error(`keep-alive client exited ${this.proc.exitCode}`);
      if (Date.now() > deadline) throw new Error('keep-alive client: no output');
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 100);
      });
    }
    return this.lines.shift()!;
  }

  /** One request on every connection; resolves with the answers and how long the round took. */
  async round(timeoutMs = 30_000): Promise<KeepAliveRound & { durationMs: number }> {
    const start = Date.now();
    this.proc.stdin!.write('go\n');
    const r = JSON.parse(await this.nextLine(timeoutMs)) as KeepAliveRound;
    return { ...r, durationMs: Date.now() - start };
  }

  async close(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    this.proc.stdin!.end('quit\n');
    await exited;
  }
}
