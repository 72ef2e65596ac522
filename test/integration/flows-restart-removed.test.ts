// A clean restart (same stateFile) while a real or a whole service that a reload removed still
// drains: the next daemon takes them back as removed and draining, so their keep-alive connections
// still reach the real they were on (without it they were placed anew by the hash and reset, or
// sent nowhere), new connections never go to them, and they are forgotten once drained.
// Also: a reload adding a service on an exact port of a port-0 VIP leaves the port-0 service's
// connections on their reals.

import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { KeepAliveClient } from '../support/keepalive-client.js';
import { httpCount, labConfig, LabDaemon, requireRoot, sleep, SNAPSHOT_LAG_MS, type Status } from '../support/lab-daemon.js';

const PREFIX = `dsrt-frr-${process.pid}-`;
/** A second service on a VIP of its own: the daemon keeps running when `web` is removed. */
const OTHER_VIP = '10.77.0.150';
let lab: Lab;
let dir: string;
let configPath: string;
let daemon: LabDaemon | undefined;

/** web with `reals` (omitted: web removed) and `other`; fin timeout 1 s, so closed connections drain at once. */
function configText(reals: readonly string[] | null, stateFile = `${dir}/dsrlb.state.json`): string {
  const top = [`stateFile: ${stateFile}`, 'flowTable: { tcpTimeouts: { syn: 60s, established: 900s, fin: 1s } }'];
  const other = ['  - name: other', `    vip: ${OTHER_VIP}`, '    port: 81', '    protocol: tcp', '    reals:', `      - address: ${lab.reals[0]!.ipv4}`];
  const text = labConfig(lab, { reals: reals ?? [lab.reals[0]!.ipv4], top, after: other });
  // labConfig always writes web first: cut it out for a config without it.
  return reals !== null ? text : text.replace(/ {2}- name: web\n(?: {4}.*\n| {6}.*\n)*/, '');
}

const addresses = () => lab.reals.map((r) => r.ipv4);

type RemovedStatus = Status & { services: { name: string; removed: boolean; reals: { address: string; removed: boolean; activeFlows: number; inactiveFlows: number }[] }[] };
const status = async () => (await daemon!.status()) as RemovedStatus;

const lbHas = async (vip: string) => ({
  onLo: (await lab.exec(lab.lb, ['ip', '-o', 'addr', 'show', 'dev', 'lo'])).stdout.includes(`${vip}/32`),
  inNft: (await lab.exec(lab.lb, ['nft', 'list', 'table', 'inet', 'dsrlb'])).stdout.includes(vip),
});

async function reload(text: string): Promise<void> {
  await writeFile(configPath, text);
  const r = await daemon!.cli(['reload']);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout).toContain('reload taken');
}

/** SIGTERM (the flows go to the flows file), then a new daemon on the same config and stateFile. */
async function restart(): Promise<void> {
  expect(await daemon!.stop('SIGTERM')).toBe(0);
  expect(daemon!.logs.some((l) => l.includes('flows kept for the next start'))).toBe(true);
  daemon = undefined;
  daemon = await LabDaemon.start(lab, configPath);
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-frr-'));
  configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, configText(addresses()));
  daemon = await LabDaemon.start(lab, configPath);
}, 120_000);

afterAll(async () => {
  try {
    if (daemon) expect(await daemon.stop()).toBe(0);
  } finally {
    await lab?.destroy();
  }
}, 60_000);

/**
 * 30 keep-alive connections to web, `round()` the real each is answered by, `first` the first
 * round's, and `removed` a real that holds at least 3 of them (the one a test takes out).
 */
async function keepAliveOnReals() {
  const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, lab.vip, 30);
  try {
    expect(opened).toBe(30);
    const round = async () => (await client.round()).answers.map((a) => ('real' in a ? a.real : a.error));
    const first = await round();
    const removed = lab.reals.find((r) => first.filter((x) => x === r.name).length >= 3)!;
    expect(removed, first.join(',')).toBeDefined();
    return { client, round, first, removed };
  } catch (err) {
    await client.close();
    throw err;
  }
}

describe('a clean restart while what a reload removed still drains', () => {
  it('keeps a removed real draining: its keep-alive connections are still answered by it, new connections never go to it, and it is forgotten once drained', async () => {
    const { client, round, first, removed } = await keepAliveOnReals();
    try {
      await reload(configText(addresses().filter((a) => a !== removed.ipv4)));
      expect(await round()).toEqual(first);
      await restart();
      expect(daemon!.logs.some((l) => l.includes('removed before the restart: draining again') && l.includes(removed.ipv4))).toBe(true);
      const web = (await status()).services.find((s) => s.name === 'web')!;
      expect(web.reals.find((r) => r.address === removed.ipv4)).toMatchObject({ removed: true });
      // Without the removed real carried over, its connections went to the others by the hash and were reset.
      expect(await round()).toEqual(first);
      const fresh = await httpCount(lab, 60);
      expect(fresh.ok).toBe(60);
      expect(fresh.byReal[removed.name] ?? 0).toBe(0);
      expect(await round()).toEqual(first);
      await client.close();
      await daemon!.waitFor(`${removed.ipv4} forgotten`, (s) => !s.services.find((x) => x.name === 'web')!.reals.some((r) => r.address === removed.ipv4), 15_000);
      expect(daemon!.logs.some((l) => l.includes('removed real drained: forgotten') && l.includes(removed.ipv4))).toBe(true);
    } finally {
      await client.close();
    }
  }, 120_000);

  it('drains a real that an edit of the file removed before the restart (no reload), as a reload of that edit would: its connections are still answered by it', async () => {
    await reload(configText(addresses()));
    const { client, round, first, removed } = await keepAliveOnReals();
    try {
      // The file edited, then a restart (as a restart-only key makes operators do): before, the
      // real's flows were left out at the start and its connections placed anew by the hash, reset.
      await writeFile(configPath, configText(addresses().filter((a) => a !== removed.ipv4)));
      await restart();
      expect(daemon!.logs.some((l) => l.includes('removed before the restart: draining again') && l.includes(removed.ipv4))).toBe(true);
      expect(await round()).toEqual(first);
      const fresh = await httpCount(lab, 60);
      expect(fresh.byReal[removed.name] ?? 0).toBe(0);
    } finally {
      await client.close();
    }
  }, 120_000);

  it('keeps a removed service draining: its VIP stays on the host, its connections are answered, new ones get nothing, and it and its VIP go once drained', async () => {
    await reload(configText(addresses()));
    await daemon!.waitFor('every real of web known', (s) => s.services.find((x) => x.name === 'web')!.reals.every((r) => r.mac !== null && r.health.state === 'up'), 10_000);
    const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, lab.vip, 20);
    try {
      expect(opened).toBe(20);
      const round = async () => (await client.round()).answers.map((a) => ('real' in a ? a.real : a.error));
      const first = await round();
      expect(first.every((x) => lab.reals.some((r) => r.name === x)), first.join(',')).toBe(true);
      await reload(configText(null));
      expect((await status()).services.find((s) => s.name === 'web')).toMatchObject({ removed: true });
      expect(await round()).toEqual(first);
      await restart();
      expect(daemon!.logs.some((l) => l.includes('removed before the restart: draining again') && l.includes('"web"'))).toBe(true);
      const web = (await status()).services.find((s) => s.name === 'web');
      expect(web).toMatchObject({ removed: true });
      expect(await lbHas(lab.vip)).toEqual({ onLo: true, inNft: true });
      expect((await daemon!.cli(['status'])).stdout).toMatch(/ web +REMOVED\(draining\)/);
      // Without the removed service carried over, its connections went nowhere (no service for the VIP).
      expect(await round()).toEqual(first);
      const fresh = await httpCount(lab, 5, { timeoutMs: 1000 });
      expect(fresh.ok).toBe(0);
      await client.close();
      await daemon!.waitFor('web forgotten', (s) => !s.services.some((x) => x.name === 'web'), 15_000);
      const deadline = Date.now() + 5000;
      while ((await lbHas(lab.vip)).onLo && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
      expect(await lbHas(lab.vip)).toEqual({ onLo: false, inNft: false });
    } finally {
      await client.close();
    }
  }, 120_000);
});

describe('a stateFile edited before a restart (no reload)', () => {
  it('takes the drain in force and the flows from the file the daemon before used: the drained real keeps its connections and gets no new one', async () => {
    await reload(configText(addresses()));
    const { client, round, first, removed } = await keepAliveOnReals();
    try {
      const drained = await daemon!.cli(['drain', 'web', removed.ipv4]);
      expect(drained.code, drained.stderr).toBe(0);
      const moved = `${dir}/moved.state.json`;
      await writeFile(configPath, configText(addresses(), moved));
      await restart();
      // Before, the new path was empty: the real came back active and the flows file was not found.
      const web = (await status()).services.find((s) => s.name === 'web')! as unknown as { reals: { address: string; intent: string }[] };
      expect(web.reals.find((r) => r.address === removed.ipv4)).toMatchObject({ intent: 'drain' });
      expect(await round()).toEqual(first);
      const fresh = await httpCount(lab, 60);
      expect(fresh.ok).toBe(60);
      expect(fresh.byReal[removed.name] ?? 0).toBe(0);
      expect(daemon!.logs.some((l) => l.includes('stateFile changed since the daemon before') && l.includes(moved))).toBe(true);
      expect(JSON.parse(await readFile(moved, 'utf8'))).toMatchObject({ intent: { [`tcp|${lab.vip}|80#${removed.ipv4}`]: { state: 'drain' } } });
    } finally {
      await client.close();
    }
  }, 120_000);
});

describe('a reload that adds a service on an exact port of a port-0 VIP', () => {
  it('leaves the port-0 service\'s keep-alive connections on their reals (as IPVS, connections before services); new connections go to the new service', async () => {
    // The VIP's port-0 service on reals 0 and 1; then `web` on port 80 of the same VIP, on real 2.
    const [r0, r1, r2] = lab.reals;
    const anyPort = ['  - name: anyport', `    vip: ${lab.vip}`, '    port: 0', '    protocol: tcp', '    reals:', `      - address: ${r0!.ipv4}`, `      - address: ${r1!.ipv4}`];
    const withoutWeb = (text: string) => text.replace(/ {2}- name: web\n(?: {4}.*\n| {6}.*\n)*/, '');
    await reload(withoutWeb(labConfig(lab, { reals: [r2!.ipv4], top: [`stateFile: ${dir}/dsrlb.state.json`], after: anyPort })));
    const { client, opened, ports } = await KeepAliveClient.open(lab, lab.client.ns, lab.vip, 20);
    try {
      expect(opened).toBe(20);
      const round = async () => (await client.round()).answers.map((a) => ('real' in a ? a.real : a.error));
      const first = await round();
      expect(new Set(first)).toEqual(new Set([r0!.name, r1!.name]));
      await reload(labConfig(lab, { reals: [r2!.ipv4], top: [`stateFile: ${dir}/dsrlb.state.json`], after: anyPort }));
      await sleep(SNAPSHOT_LAG_MS);
      // Before, the exact port took their packets: sent to real 2, which reset every connection.
      expect(await round()).toEqual(first);
      const explained = await daemon!.cli(['explain', 'web', `${lab.client.ipv4}:${ports[0]}`]);
      expect(explained.stdout).toContain('flow-table hit, established, a connection of service anyport (it keeps its real; new connections go to web)');
      const fresh = await httpCount(lab, 20);
      expect([fresh.ok, fresh.byReal[r2!.name]]).toEqual([20, 20]);
      expect(await round()).toEqual(first);
    } finally {
      await client.close();
    }
  }, 120_000);
});
