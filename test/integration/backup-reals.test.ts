// Backup reals in network namespaces: r3 is `backup: true`. While r1 or r2 answers its check, new
// connections never reach r3; once both are down, r3 takes every one (status ON_BACKUPS); once r1
// is back, new connections go to r1 again while a keep-alive connection opened on r3 stays there.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab, type LabHost } from '../../src/lab/netns-lab.js';
import { allUp, httpCount, labConfig, LabDaemon, metricValue, RealServers, requireRoot, ROOT, stopProcess, type Status } from '../support/lab-daemon.js';

const PREFIX = `dsrt-bak-${process.pid}-`;
let lab: Lab;
let dir: string;
let daemon: LabDaemon;
const servers = new RealServers(() => lab);

const real = (name: string): LabHost => lab.reals.find((r) => r.name === name)!;
const health = (s: Status, name: string): string => s.services[0]!.reals.find((r) => r.address === real(name).ipv4)!.health.state;

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-bak-'));
  const configPath = join(dir, 'dsrlb.yaml');
  const text = labConfig(lab, {
    service: ['    healthCheck: { type: http, path: /, interval: 300ms, timeout: 200ms, rise: 1, fall: 1 }'],
    reals: [],
  }).replace('    reals:\n', `    reals:\n      - address: ${real('r1').ipv4}\n      - address: ${real('r2').ipv4}\n      - address: ${real('r3').ipv4}\n        backup: true\n`);
  await writeFile(configPath, text);
  daemon = await LabDaemon.start(lab, configPath, allUp);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await servers.stopAll();
  await lab?.destroy();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('backup: true', () => {
  it('takes no new connection while another real is up, every one once they are down, and keeps its own when they come back', async () => {
    expect(metricValue(await daemon.metrics(), 'dsrlb_service_on_backups', 'service="web"')).toBe(0);
    const before = await httpCount(lab, 30);
    expect(before.ok).toBe(30);
    expect(Object.keys(before.byReal).sort()).toEqual(['r1', 'r2']);
    expect((await daemon.cli(['status'])).stdout).toMatch(/-> \S+ +l2 +100 +active backup +up/);

    await servers.stop('r1');
    await servers.stop('r2');
    // Health is the monitor's at once; the snapshot (and onBackups, its report) follows within
    // the 100 ms a rebuild is queued for: traffic waits for the latter.
    await daemon.waitFor('r1 and r2 down, on backups', (s) => health(s, 'r1') === 'down' && health(s, 'r2') === 'down' && s.services[0]!.onBackups, 10_000);
    expect((await daemon.cli(['status'])).stdout).toMatch(/web +ON_BACKUPS/);
    expect(metricValue(await daemon.metrics(), 'dsrlb_service_on_backups', 'service="web"')).toBe(1);
    const onBackup = await httpCount(lab, 20);
    expect([onBackup.ok, onBackup.byReal]).toEqual([20, { r3: 20 }]);

    // A keep-alive connection on the backup, then r1 comes back.
    const client = lab.spawn(lab.client, [process.execPath, join(ROOT, 'dist/lab/http-client.js'), '--host', lab.vip, '--keepalive', '1'], { stdio: ['pipe', 'pipe', 'inherit'] });
    const lines = createInterface({ input: client.stdout! })[Symbol.asyncIterator]();
    try {
      expect(JSON.parse((await lines.next()).value as string)).toMatchObject({ opened: 1 });
      client.stdin!.write('go\n');
      expect(JSON.parse((await lines.next()).value as string).answers[0].real).toBe('r3');
      await servers.start('r1');
      await daemon.waitFor('r1 up, off backups', (s) => health(s, 'r1') === 'up' && !s.services[0]!.onBackups, 10_000);
      const after = await httpCount(lab, 20);
      expect([after.ok, after.byReal]).toEqual([20, { r1: 20 }]);
      expect((await daemon.cli(['status'])).stdout).not.toContain('ON_BACKUPS');
      expect(metricValue(await daemon.metrics(), 'dsrlb_service_on_backups', 'service="web"')).toBe(0);
      client.stdin!.write('go\n');
      expect(JSON.parse((await lines.next()).value as string).answers[0].real).toBe('r3');
    } finally {
      client.stdin!.end('quit\n');
      await stopProcess(client);
    }
  }, 90_000);
});
