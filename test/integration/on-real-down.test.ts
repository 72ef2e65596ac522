// onRealDown in network namespaces: a real whose health check fails while its service still
// answers (the check runs on another port, whose listener is stopped) in the middle of a paced
// download. `keep`: the download finishes byte for byte from that real, which takes no new
// connection meanwhile; `reschedule` (the default, after a reload): the flow moves to the other
// real, which resets it, and the move is counted. And the end of a failOpen panic, when every
// check failed while the reals served: the flows stay where the panic kept them.

import type { ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab, type LabHost } from '../../src/lab/netns-lab.js';
import { patternBytes } from '../../src/lab/real-http-server.js';
import { allUp, httpCount, labConfig, LabDaemon, metricValue, requireRoot, ROOT, sleep, SNAPSHOT_LAG_MS, stopProcess, type Status } from '../support/lab-daemon.js';

const PREFIX = `dsrt-ord-${process.pid}-`;
const CHECK_PORT = 8089;
const SIZE = 1_200_000;
const RATE = 150_000; // bytes/s: 8 s
let lab: Lab;
let dir: string;
let configPath: string;
let daemon: LabDaemon;
/** Each real's check listener (a second HTTP server on CHECK_PORT), by real name. */
const checkServers = new Map<string, ChildProcess>();

function configText(onRealDown: 'keep' | 'reschedule'): string {
  return labConfig(lab, {
    service: [`    onRealDown: ${onRealDown}`, `    healthCheck: { type: tcp, port: ${CHECK_PORT}, interval: 500ms, timeout: 300ms, rise: 1, fall: 2 }`],
    reals: lab.reals.map((r) => r.ipv4),
  });
}

async function startCheckServer(real: LabHost): Promise<void> {
  const p = lab.spawn(real, [process.execPath, join(ROOT, 'dist/lab/real-http-server.js'), '--name', real.name, '--host', real.ipv4, '--port', String(CHECK_PORT)], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: p.stdout! }).on('line', (l) => l.includes('"ready"') && resolve());
    p.once('exit', (c) => reject(new Error(`check server on ${real.name} exited ${c}`)));
  });
  checkServers.set(real.name, p);
}

const healthOf = (s: Status, real: LabHost): string => s.services[0]!.reals.find((r) => r.address === real.ipv4)!.health.state;

/**
 * A paced download through the VIP; once it runs, the check of the real serving it fails (its
 * service on port 80 untouched). Returns curl's outcome, the body and which real served it.
 */
async function downloadWhileItsRealGoesDown(): Promise<{ code: number; status: string; body: Buffer; real: LabHost; newWhileDown: Record<string, number> }> {
  const headers = join(dir, 'headers');
  const body = join(dir, 'body');
  await rm(headers, { force: true });
  const download = lab.exec(lab.client, ['curl', '-s', '-D', headers, '-o', body, '-w', '%{http_code}', `http://${lab.vip}/bytes/${SIZE}?rate=${RATE}`], { timeoutMs: 30_000 });
  let name: string | undefined;
  for (let i = 0; i < 50 && name === undefined; i++) {
    await sleep(100);
    name = /^x-real: (\S+)/im.exec(await readFile(headers, 'utf8').catch(() => ''))?.[1];
  }
  const real = lab.reals.find((r) => r.name === name);
  if (real === undefined) throw new Error(`no X-Real header in time (${name})`);
  await stopProcess(checkServers.get(real.name)!);
  await daemon.waitFor(`${real.name} down`, (s) => healthOf(s, real) === 'down', 5000);
  await sleep(SNAPSHOT_LAG_MS);
  // New connections go to the other real only, whatever onRealDown says.
  const newWhileDown = (await httpCount(lab, 20)).byReal;
  const r = await download;
  await startCheckServer(real);
  await daemon.waitFor(`${real.name} up`, (s) => healthOf(s, real) === 'up', 5000);
  return { code: r.code, status: r.stdout.trim(), body: await readFile(body).catch(() => Buffer.alloc(0)), real, newWhileDown };
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 2 });
  await lab.startHttpServers();
  for (const r of lab.reals) await startCheckServer(r);
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-ord-'));
  configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, configText('keep'));
  daemon = await LabDaemon.start(lab, configPath, allUp);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await lab?.destroy();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('onRealDown', () => {
  it('keep: a download from a real its check marks down finishes byte for byte there; new connections go to the other real', async () => {
    const moved = metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '');
    const d = await downloadWhileItsRealGoesDown();
    expect([d.code, d.status]).toEqual([0, '200']);
    expect(d.body.equals(patternBytes(SIZE))).toBe(true);
    expect(d.newWhileDown[d.real.name] ?? 0).toBe(0);
    expect(metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '')).toBe(moved);
  }, 60_000);

  it('reschedule (the default): the download is moved to the other real, which resets it, and the move is counted', async () => {
    await writeFile(configPath, configText('keep').replace('    onRealDown: keep\n', ''));
    const r = await daemon.cli(['reload']);
    expect(r.stdout + r.stderr).toContain('reload taken');
    const moved = metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '');
    const d = await downloadWhileItsRealGoesDown();
    // curl: 56, a reset while receiving; whatever arrived before is a short body.
    expect(d.code).not.toBe(0);
    expect(d.body.length).toBeLessThan(SIZE);
    expect(d.newWhileDown[d.real.name] ?? 0).toBe(0);
    expect(metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '')).toBeGreaterThan(moved);
  }, 60_000);

  it('reschedule, every check failing (a failOpen panic, the reals serving all along): the downloads on both reals finish byte for byte while the checks come back one after the other', async () => {
    // onRealDown reschedule, whenAllDown failOpen: the defaults (the test before took them already).
    await writeFile(configPath, configText('keep').replace('    onRealDown: keep\n', ''));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    // Every check fails (a dependency of every health endpoint, a firewall): a panic, in which new
    // connections go to both reals. (The connections of the real that fails first, while the other
    // is still up, move as onRealDown says: they are not what this test is about.) The check port
    // is dropped on each real, so that it comes back at an instant the test chooses.
    const checks = (r: LabHost, on: boolean) =>
      lab.exec(r, ['nft', on ? 'delete table inet dsrt_check' : `add table inet dsrt_check; add chain inet dsrt_check in { type filter hook input priority 0; }; add rule inet dsrt_check in tcp dport ${CHECK_PORT} drop`]);
    for (const r of lab.reals) expect((await checks(r, false)).code).toBe(0);
    await daemon.waitFor('failOpen panic', (s) => s.services[0]!.panic, 5000);
    const moved = metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '');
    // Paced downloads until each real serves one (Maglev spreads them by source port).
    const downloads: { done: Promise<{ code: number; stdout: string }>; body: string; real: string }[] = [];
    for (let i = 0; i < 12 && new Set(downloads.map((d) => d.real)).size < lab.reals.length; i++) {
      const headers = join(dir, `panic-headers-${i}`);
      const body = join(dir, `panic-body-${i}`);
      const done = lab.exec(lab.client, ['curl', '-s', '-D', headers, '-o', body, '-w', '%{http_code}', `http://${lab.vip}/bytes/${SIZE}?rate=${RATE}`], { timeoutMs: 30_000 });
      let real: string | undefined;
      for (let t = 0; t < 50 && real === undefined; t++) {
        await sleep(50);
        real = /^x-real: (\S+)/im.exec(await readFile(headers, 'utf8').catch(() => ''))?.[1];
      }
      if (real === undefined) throw new Error('no X-Real header in time');
      downloads.push({ done, body, real });
    }
    expect(new Set(downloads.map((d) => d.real)).size).toBe(lab.reals.length);
    // The checks come back one real at a time, the second as soon as the panic is seen over (well
    // within the wait: (rise 1 + 1) x 500 ms + 300 ms after the first). Before, the first real up
    // took the other's flows.
    const [first, second] = lab.reals;
    expect((await checks(first!, true)).code).toBe(0);
    await daemon.waitFor('the panic ending', (s) => (s.services[0] as unknown as { panicEnding: boolean }).panicEnding, 5000);
    expect(healthOf(await daemon.status(), second!)).toBe('down');
    expect((await checks(second!, true)).code).toBe(0);
    await daemon.waitFor(`${second!.name} up`, (s) => healthOf(s, second!) === 'up', 5000);
    for (const d of downloads) {
      const r = await d.done;
      expect([r.code, r.stdout.trim(), d.real]).toEqual([0, '200', d.real]);
      expect((await readFile(d.body)).equals(patternBytes(SIZE))).toBe(true);
    }
    expect(metricValue(await daemon.metrics(), 'dsrlb_flows_rescheduled_total', '')).toBe(moved);
    expect(daemon.logs.join('\n')).toContain('failOpen panic over: the reals still down keep their flows while they may still come up');
  }, 60_000);
});
