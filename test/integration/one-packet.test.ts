// One-packet scheduling (`ops: true`) end to end in network namespaces: a UDP service on three
// real servers that echo their name; a client sends from 60 sockets (60 source ports), twice. Every
// datagram is answered, each socket always by the same real, the reals share the sockets, and the
// LB holds no flow entry for them (dsrlb flows, dsrlb_flow_table_entries). A drained real gets no
// datagram at all after the drain (there is no flow to keep on it).

import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { allUp, labConfig, LabDaemon, metricValue, requireRoot, stopProcess } from '../support/lab-daemon.js';

const PREFIX = `dsrt-ops-${process.pid}-`;
const PORT = 5353;
const SOCKETS = 60;
let lab: Lab;
let dir: string;
let daemon: LabDaemon;
const servers: ChildProcess[] = [];

/** Sends one datagram from each of SOCKETS sockets, `rounds` times; the answering real's name per socket and round. */
async function ask(rounds: number): Promise<string[][]> {
  const script = `
const dgram = require('dgram');
const socks = Array.from({ length: ${SOCKETS} }, () => dgram.createSocket('udp4'));
const got = socks.map(() => []);
socks.forEach((s, i) => s.on('message', (m) => got[i].push(String(m))));
let round = 0;
const send = () => { socks.forEach((s) => s.send('who', ${PORT}, '${lab.vip}')); };
Promise.all(socks.map((s) => new Promise((r) => s.bind(0, r)))).then(() => {
  send();
  const t = setInterval(() => {
    if (++round < ${rounds}) send();
    else { clearInterval(t); setTimeout(() => { console.log(JSON.stringify(got)); socks.forEach((s) => s.close()); }, 500); }
  }, 300);
});`;
  const r = await lab.exec(lab.client, [process.execPath, '-e', script], { timeoutMs: 20_000 });
  if (r.code !== 0) throw new Error(`client: ${r.stderr}`);
  return JSON.parse(r.stdout.trim()) as string[][];
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  for (const real of lab.reals) {
    const p = lab.spawn(real, [process.execPath, '-e', `const s = require('dgram').createSocket('udp4'); s.on('message', (m, r) => s.send('${real.name}', r.port, r.address)); s.bind(${PORT}, '${lab.vip}', () => console.log('ready'));`], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: p.stdout! }).on('line', (l) => l === 'ready' && resolve());
      p.once('exit', (c) => reject(new Error(`UDP server on ${real.name} exited ${c}`)));
    });
    servers.push(p);
  }
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-ops-'));
  const configPath = join(dir, 'dsrlb.yaml');
  const reals = lab.reals.map((r) => `      - address: ${r.ipv4}`);
  await writeFile(configPath, labConfig(lab, { reals: [lab.reals[0]!.ipv4], after: ['  - name: dns', `    vip: ${lab.vip}`, `    port: ${PORT}`, '    protocol: udp', '    ops: true', '    reals:', ...reals] }));
  daemon = await LabDaemon.start(lab, configPath, allUp);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  for (const p of servers) await stopProcess(p);
  await lab?.destroy();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('ops: true', () => {
  it('answers every datagram, each socket always from one real, over all reals, with no flow entry on the LB', async () => {
    expect((await daemon.cli(['status'])).stdout).toMatch(/UDP {2}\S+:5353 +maglev ops +l2 +dns/);
    const got = await ask(2);
    for (const [i, answers] of got.entries()) {
      expect(answers, `socket ${i}`).toHaveLength(2);
      expect(answers[1], `socket ${i}`).toBe(answers[0]);
    }
    const byReal = new Map<string, number>();
    for (const a of got) byReal.set(a[0]!, (byReal.get(a[0]!) ?? 0) + 1);
    expect([...byReal.keys()].sort()).toEqual(lab.reals.map((r) => r.name).sort());
    const listed = JSON.parse((await daemon.cli(['flows', 'dns', '--json'])).stdout) as { total: number };
    expect(listed.total).toBe(0);
    expect(metricValue(await daemon.metrics(), 'dsrlb_flow_table_entries', '')).toBe(0);
  }, 60_000);

  it('sends a drained real no datagram after the drain', async () => {
    const drained = lab.reals[1]!;
    const r = await daemon.cli(['drain', 'dns', drained.ipv4]);
    expect(r.stdout).toContain('drain');
    const got = await ask(2);
    for (const answers of got) {
      expect(answers).toHaveLength(2);
      expect(answers).not.toContain(drained.name);
    }
  }, 60_000);
});
