// The record an earlier dsrlb decap (before 2026-12, when decap set all.rp_filter to 0) left in
// /run/dsrlb when it was killed: the next decap puts the operator's value back at start and removes
// the record, taking from it only all.rp_filter with a value rp_filter can hold, and only from a
// file this user wrote. A decap now changes no host-wide sysctl and writes no record.
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runRecordPath } from '../../src/control/host-setup.js';
import type { Logger } from '../../src/control/logger.js';
import { DecapHost, type SysctlAccess, type TunOpener } from '../../src/decap/decap-host.js';

const ALL = 'net/ipv4/conf/all/rp_filter';
const DEV = 'net/ipv4/conf/dc0/rp_filter';

interface Logged {
  level: string;
  msg: string;
  fields: Record<string, unknown> | undefined;
}

function fakes(sysctls: Map<string, string>, runDir: string, failWrite?: string) {
  const logged: Logged[] = [];
  const entry = (level: string) => (msg: string, fields?: Record<string, unknown>) => void logged.push({ level, msg, fields });
  const log: Logger = { debug: entry('debug'), info: entry('info'), warn: entry('warn'), error: entry('error') };
  const sysctl: SysctlAccess = {
    read: (k) => sysctls.get(k),
    write: (k, v) => {
      if (k === failWrite) throw new Error('EACCES');
      sysctls.set(k, v);
    },
  };
  const tun: TunOpener = { open: (name) => ({ fd: 42, name }), close: () => {} };
  const host = new DecapHost(log, async () => ({ stdout: '' }), sysctl, tun, runDir);
  return { host, logged, recordPath: runRecordPath(runDir, 'decap') };
}

describe("an earlier decap's run-state record", () => {
  let runDir: string;
  beforeEach(() => {
    runDir = join(mkdtempSync(join(tmpdir(), 'dsrlb-test-decap-record-')), 'run');
    mkdirSync(runDir);
  });
  afterEach(() => {
    chmodSync(join(runDir, '..'), 0o700);
    rmSync(join(runDir, '..'), { recursive: true, force: true });
  });

  /** The record an earlier decap wrote (0600, this user's) before it set all.rp_filter from `previous` to 0. */
  function leftRecord(recordPath: string, sysctls: unknown[] = [{ key: ALL, previous: '2', setTo: '0' }]): void {
    writeFileSync(recordPath, JSON.stringify({ sysctls }), { mode: 0o600 });
  }

  it('writes no record and changes no host-wide sysctl', async () => {
    const sysctls = new Map([
      [ALL, '1'],
      [DEV, '0'],
    ]);
    const f = fakes(sysctls, runDir);
    await f.host.restoreDeadDecapRecord();
    await f.host.setUp('dc0', false, true);
    expect(Object.fromEntries(sysctls)).toEqual({ [ALL]: '1', [DEV]: '2' });
    expect(readdirSync(runDir)).toEqual([]);
    expect(f.logged).toEqual([{ level: 'info', msg: 'decap tun device up', fields: { tun: 'dc0', addedAddresses: ['192.0.0.8/32'], changedSysctls: ['net.ipv4.conf.dc0.rp_filter=2 (was 0)'] } }]);
  });

  it("puts the operator's all.rp_filter back at start (the 0 the killed one left) and removes the record", async () => {
    const sysctls = new Map([
      [ALL, '0'],
      [DEV, '1'],
    ]);
    const f = fakes(sysctls, runDir);
    expect(f.recordPath).toMatch(/\/run\/decap-\d+\.json$/);
    leftRecord(f.recordPath);
    await f.host.restoreDeadDecapRecord();
    expect(sysctls.get(ALL)).toBe('2');
    expect(existsSync(f.recordPath)).toBe(false);
    expect(f.logged).toEqual([
      {
        level: 'info',
        msg: 'put back what an earlier decap that did not stop changed (this one changes no host-wide sysctl)',
        fields: { sysctls: ['net.ipv4.conf.all.rp_filter=2 (was 0)'] },
      },
    ]);
    // And setUp does not take it away again.
    await f.host.setUp('dc0', false, true);
    expect(sysctls.get(ALL)).toBe('2');
  });

  it('leaves what the operator changed after the dead decap, and removes the record', async () => {
    const sysctls = new Map([[ALL, '1']]); // the operator, after the crash
    const f = fakes(sysctls, runDir);
    leftRecord(f.recordPath);
    await f.host.restoreDeadDecapRecord();
    expect(sysctls.get(ALL)).toBe('1');
    expect(f.logged.at(-1)?.fields).toEqual({ sysctls: [], changedSince: ['net.ipv4.conf.all.rp_filter'] });
    expect(existsSync(f.recordPath)).toBe(false);
  });

  it('keeps the record when it cannot write the value back, for a later start', async () => {
    const sysctls = new Map([[ALL, '0']]);
    const f = fakes(sysctls, runDir, ALL);
    leftRecord(f.recordPath);
    await f.host.restoreDeadDecapRecord();
    expect(sysctls.get(ALL)).toBe('0');
    expect(f.logged.filter((l) => l.level === 'error').map((l) => l.fields)).toEqual([{ key: 'net.ipv4.conf.all.rp_filter', value: '2', error: 'EACCES' }]);
    expect(existsSync(f.recordPath)).toBe(true);
  });

  it('takes from a record only all.rp_filter with a value rp_filter can hold: kernel/core_pattern, a ../ path or another value is not written, and each is named in a warning', async () => {
    const planted = [
      { key: 'kernel/core_pattern', previous: '|/tmp/own-root', setTo: 'core' },
      { key: 'net/ipv4/conf/../../../../etc/cron.d/x', previous: '* * * * * root sh', setTo: '0' },
      { key: 'net/ipv4/conf/dc0/rp_filter', previous: '1', setTo: '0' },
      { key: ALL, previous: '1\nkernel.x=1', setTo: '0' },
      { key: ALL, previous: '2', setTo: '0' },
    ];
    const sysctls = new Map([
      [ALL, '0'],
      [DEV, '0'],
      ['kernel/core_pattern', 'core'],
      ['net/ipv4/conf/../../../../etc/cron.d/x', '0'],
    ]);
    const f = fakes(sysctls, runDir);
    leftRecord(f.recordPath, planted);
    await f.host.restoreDeadDecapRecord();
    expect(f.logged.filter((l) => l.level === 'warn').map((l) => JSON.parse(l.fields!.entry as string))).toEqual(planted.slice(0, 4));
    expect(f.logged.at(-1)?.fields).toEqual({ sysctls: ['net.ipv4.conf.all.rp_filter=2 (was 0)'] });
    expect(Object.fromEntries(sysctls)).toEqual({
      [ALL]: '2',
      [DEV]: '0',
      'kernel/core_pattern': 'core',
      'net/ipv4/conf/../../../../etc/cron.d/x': '0',
    });
    expect(existsSync(f.recordPath)).toBe(false);
  });

  it('ignores, as root, a record another user owns (the service user may write /run/dsrlb): nothing of it is put back, and it stays', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const sysctls = new Map([[ALL, '0']]);
    const f = fakes(sysctls, runDir);
    leftRecord(f.recordPath);
    chownSync(f.recordPath, 65534, 65534);
    await f.host.restoreDeadDecapRecord();
    expect(f.logged.map((l) => l.msg)).toEqual(['ignored a run-state record this process did not write']);
    expect(sysctls.get(ALL)).toBe('0');
    expect(existsSync(f.recordPath)).toBe(true);
  });
});
