// Client persistence end to end in network namespaces: a client namespace holding eight addresses
// in different /24s of the lab's /16 opens many connections from each (each from its own source
// port) through `dsrlb run` to three real HTTP servers. With `persistence: client` every
// connection of an address lands on one real, the one `dsrlb explain` names; with
// `persistencePrefix: 16` all eight addresses share one; without persistence one address's
// connections spread. Replies never cross the LB.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { allUp, captureVipSourced, httpCount, labConfig, LabDaemon, requireRoot } from '../support/lab-daemon.js';

const PREFIX = `dsrt-per-${process.pid}-`;
/** The client's extra addresses: one in each of eight /24s of the lab's 10.78.0.0/16. */
const SOURCES = Array.from({ length: 8 }, (_, i) => `10.78.${i + 1}.7`);
const PER_SOURCE = 12;
let lab: Lab;
let dir: string;
let configPath: string;
let daemon: LabDaemon;

function configText(persistence: readonly string[]): string {
  return labConfig(lab, { service: persistence, reals: lab.reals.map((r) => r.ipv4) });
}

async function reload(persistence: readonly string[]): Promise<void> {
  await writeFile(configPath, configText(persistence));
  const r = await daemon.cli(['reload']);
  expect(r.stdout + r.stderr).toContain('reload taken');
}

/** Which reals served PER_SOURCE connections from each source address. */
async function realsBySource(): Promise<Map<string, Record<string, number>>> {
  const out = new Map<string, Record<string, number>>();
  for (const source of SOURCES) {
    const r = await httpCount(lab, PER_SOURCE, { source });
    expect([r.ok, r.distinctPorts], `${source}: ${JSON.stringify(r.errors)}`).toEqual([PER_SOURCE, PER_SOURCE]);
    out.set(source, r.byReal);
  }
  return out;
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3, subnet: '10.78.0.0/16' });
  await lab.startHttpServers();
  for (const a of SOURCES) {
    const r = await lab.exec(lab.client, ['ip', 'addr', 'add', `${a}/16`, 'dev', 'eth0']);
    if (r.code !== 0) throw new Error(`ip addr add ${a}: ${r.stderr}`);
  }
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-per-'));
  configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, configText(['    persistence: client']));
  daemon = await LabDaemon.start(lab, configPath, allUp);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await lab?.destroy();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('persistence: client', () => {
  it('sends every connection of a client address to one real, the one explain names, and replies bypass the LB', async () => {
    const status = await daemon.cli(['status']);
    expect(status.stdout).toMatch(/TCP {2}10\.78\.0\.100:80 +maglev persistent +l2 +web/);
    const capture = captureVipSourced(lab);
    const served = await realsBySource();
    expect(await capture.stop()).toBe(0);
    const used = new Set<string>();
    for (const [source, byReal] of served) {
      expect(Object.keys(byReal), `${source}: ${JSON.stringify(byReal)}`).toHaveLength(1);
      const name = Object.keys(byReal)[0]!;
      used.add(name);
      // explain, for a port never used, names the same real and why.
      const e = await daemon.cli(['explain', 'web', `${source}:61000`]);
      const real = lab.reals.find((r) => r.name === name)!;
      expect(e.stdout.trim()).toMatch(new RegExp(`-> ${real.ipv4.replaceAll('.', '\\.')} \\(scheduler: maglev slot \\d+ by client ${source.replaceAll('.', '\\.')}/32 \\(persistence\\)\\)$`));
    }
    // Eight clients are not all on one real of three.
    expect(used.size).toBeGreaterThan(1);
    // The connection table (dsrlb flows, as ipvsadm -Lnc) holds that client's connections, closing, all on its real.
    const listed = JSON.parse((await daemon.cli(['flows', 'web', '--client', SOURCES[0]!, '--limit', '0', '--json'])).stdout) as { total: number; flows: { client: string; real: string; state: string }[] };
    const servedBy = lab.reals.find((r) => r.name === Object.keys(served.get(SOURCES[0]!)!)[0])!.ipv4;
    expect(listed.total).toBeGreaterThan(0);
    expect(listed.total).toBeLessThanOrEqual(PER_SOURCE);
    for (const f of listed.flows) expect([f.client.split(':')[0], f.real]).toEqual([SOURCES[0], servedBy]);
    const table = (await daemon.cli(['flows', '--client', SOURCES[0]!])).stdout;
    expect(table.split('\n')[0]).toMatch(/^pro +expire +state +source +virtual +destination +service$/);
    expect(table).toContain(`${listed.total} of ${listed.total} flow`);
    const json = JSON.parse((await daemon.cli(['explain', 'web', `${SOURCES[0]}:61001`, '--json'])).stdout) as Record<string, unknown>;
    expect(json).toMatchObject({ service: 'web', port: 80, reason: 'scheduler', scheduler: 'maglev', persistentClient: `${SOURCES[0]}/32` });
    expect(lab.reals.find((r) => r.ipv4 === json.real)?.name).toBe(Object.keys(served.get(SOURCES[0]!)!)[0]);
  }, 120_000);

  it('with persistencePrefix 16, the eight addresses of one /16 share a real', async () => {
    await reload(['    persistence: client', '    persistencePrefix: 16']);
    const served = await realsBySource();
    const all = new Set([...served.values()].flatMap((b) => Object.keys(b)));
    expect([...all], JSON.stringify(Object.fromEntries(served))).toHaveLength(1);
    expect((await daemon.cli(['status'])).stdout).toMatch(/maglev persistent \/16/);
  }, 120_000);

  it('without persistence (the default), one address\'s connections spread over the reals', async () => {
    await reload([]);
    const r = await httpCount(lab, 30, { source: SOURCES[0] });
    expect(r.ok).toBe(30);
    expect(Object.keys(r.byReal).length, JSON.stringify(r.byReal)).toBeGreaterThan(1);
  }, 120_000);
});
