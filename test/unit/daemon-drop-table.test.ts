// The nftables drop table removed from outside (an nftables or firewalld reload flushes the whole
// ruleset) is found by the daemon's housekeeping and put back, with an error logged and counted:
// without it the kernel answered every client of the VIPs with a RST until the next reload.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { HostSetup, type CommandRunner } from '../../src/control/host-setup.js';
import { createLogger } from '../../src/control/logger.js';
import { stubbedDaemon } from '../support/stubbed-daemon.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-droptable-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const text = 'interface: eth0\nservices:\n  - { name: web, vip: 10.99.0.100, port: 80, reals: [ { address: 10.0.0.1 } ] }\n';
const settle = () => new Promise((r) => setTimeout(r, 20));

describe('the nftables drop table', () => {
  it('is looked for every 5 s and put back when it is gone, once, with an error logged and counted', async () => {
    let present: boolean | null = true;
    const applied: string[][] = [];
    const host = {
      apply: async (vips: string[]) => {
        applied.push(vips);
        present = true;
      },
      interfaceAddressesAmong: async () => new Map(),
      dropTablePresent: async () => present,
    };
    const lines: string[] = [];
    const { daemon, inside } = stubbedDaemon(join(dir, 'dsrlb.yaml'), text, { activeFlows: 0, host, log: (l) => lines.push(l) });
    (inside.syncReals as () => void).call(daemon);
    daemon.rebuild('start');
    inside.started = true;
    const tick = async (n: number) => {
      for (let i = 0; i < n; i++) (inside.tick as () => void).call(daemon);
      await settle();
    };
    try {
      await tick(5);
      expect(applied).toEqual([]);
      present = false;
      await tick(4);
      expect(applied).toEqual([]); // not looked at between checks
      await tick(1);
      expect(applied).toEqual([['10.99.0.100']]);
      expect(await daemon.metrics.text()).toMatch(/^dsrlb_drop_table_restored_total 1$/m);
      expect(lines.filter((l) => l.includes('was removed from outside'))).toHaveLength(1);
      // nft could not tell (not run, timed out): nothing is changed.
      present = null;
      await tick(5);
      expect(applied).toHaveLength(1);
      // Stopping: never put back.
      present = false;
      inside.stopping = true;
      await tick(5);
      expect(applied).toHaveLength(1);
    } finally {
      (daemon as unknown as { health: { stop(): void } }).health.stop();
    }
  });

  it('HostSetup.dropTablePresent: whether nft list tables names it; null when nft fails', async () => {
    const answer = (stdout: string | null): CommandRunner => async (argv) => {
      expect(argv).toEqual(['nft', 'list', 'tables']);
      if (stdout === null) throw new Error('nft list tables: no answer within 10 s (killed)');
      return { stdout };
    };
    const quiet = createLogger(() => undefined);
    const present = (stdout: string | null) => new HostSetup('eth0', quiet, answer(stdout), dir).dropTablePresent();
    expect(await present('table inet filter\ntable inet dsrlb\n')).toBe(true);
    expect(await present('table inet filter\ntable ip dsrlb\ntable inet dsrlb2\n')).toBe(false);
    expect(await present('')).toBe(false);
    expect(await present(null)).toBe(null);
  });
});
