// DecapHost's run-state record: the operator's value of all.rp_filter is written before decap
// changes it, and a decap started after one that was killed takes the operator's value from the
// record the dead one left (not the 0 it finds), as the daemon adopts its crashed run's record.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, chmodSync, chownSync } from 'node:fs';
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

function fakes(sysctls: Map<string, string>, runDir: string) {
  const logged: Logged[] = [];
  const entry = (level: string) => (msg: string, fields?: Record<string, unknown>) => void logged.push({ level, msg, fields });
  const log: Logger = { debug: entry('debug'), info: entry('info'), warn: entry('warn'), error: entry('error') };
  // What the record holds at the moment each sysctl is written: it must come first.
  const recordAtWrite: (string | null)[] = [];
  const recordPath = runRecordPath(runDir, 'decap');
  const sysctl: SysctlAccess = {
    read: (k) => sysctls.get(k),
    write: (k, v) => {
      if (k === ALL) recordAtWrite.push(existsSync(recordPath) ? readFileSync(recordPath, 'utf8') : null);
      sysctls.set(k, v);
    },
  };
  const tun: TunOpener = { open: (name) => ({ fd: 42, name }), close: () => {} };
  const host = new DecapHost(log, async () => ({ stdout: '' }), sysctl, tun, runDir);
  return { host, logged, recordAtWrite, recordPath };
}

describe('DecapHost run-state record', () => {
  let runDir: string;
  beforeEach(() => {
    runDir = join(mkdtempSync(join(tmpdir(), 'dsrlb-test-decap-record-')), 'run');
  });
  afterEach(() => {
    chmodSync(join(runDir, '..'), 0o700);
    rmSync(join(runDir, '..'), { recursive: true, force: true });
  });

  /** The sysctls after a decap set up over all.rp_filter `all` and was killed (no tearDown: its record stays). */
  async function killedDecap(all: string): Promise<Map<string, string>> {
    const sysctls = new Map([
      [ALL, all],
      [DEV, '1'],
    ]);
    const dead = fakes(sysctls, runDir);
    await dead.host.adopt();
    await dead.host.setUp('dc0', false);
    return sysctls;
  }

  it("records the operator's all.rp_filter before setting it, and removes the record when it has put it back", async () => {
    const sysctls = new Map([
      [ALL, '1'],
      [DEV, '1'],
    ]);
    const f = fakes(sysctls, runDir);
    await f.host.adopt();
    await f.host.setUp('dc0', false);
    expect(sysctls.get(ALL)).toBe('0');
    // Written (aside and renamed) before the change, in the daemon's directory and naming scheme.
    expect(f.recordAtWrite).toHaveLength(1);
    expect(JSON.parse(f.recordAtWrite[0]!)).toEqual({ sysctls: [{ key: ALL, previous: '1', setTo: '0' }] });
    expect(f.recordPath).toMatch(/\/run\/decap-\d+\.json$/);
    expect(readdirSync(runDir)).toEqual([f.recordPath.slice(runDir.length + 1)]);
    f.host.tearDown();
    expect(sysctls.get(ALL)).toBe('1');
    expect(readdirSync(runDir)).toEqual([]);
  });

  it("after a decap killed without undoing (the record left, all.rp_filter at its 0), the next takes the operator's value from the record and puts it back at stop", async () => {
    const sysctls = await killedDecap('2');
    // SIGKILL: no tearDown. The device went with the process; all.rp_filter stays 0.
    expect(sysctls.get(ALL)).toBe('0');
    sysctls.set(DEV, '1');

    const next = fakes(sysctls, runDir);
    await next.host.adopt();
    expect(next.logged.find((l) => l.msg.startsWith('adopted the record of a decap that did not stop'))?.fields).toEqual({
      sysctls: ['net.ipv4.conf.all.rp_filter=0 (was 2)'],
    });
    await next.host.setUp('dc0', false);
    expect(sysctls.get(ALL)).toBe('0');
    // Killed again before it stops: the record still holds the operator's value.
    expect(JSON.parse(readFileSync(next.recordPath, 'utf8'))).toEqual({ sysctls: [{ key: ALL, previous: '2', setTo: '0' }] });
    next.host.tearDown();
    expect(sysctls.get(ALL)).toBe('2');
    expect(existsSync(next.recordPath)).toBe(false);
  });

  it('leaves what the operator changed after the dead decap, and records that as the value to put back', async () => {
    const sysctls = await killedDecap('1');
    sysctls.set(ALL, '2'); // the operator, after the crash

    const next = fakes(sysctls, runDir);
    await next.host.adopt();
    expect(next.logged.find((l) => l.msg.startsWith('adopted the record'))?.fields).toEqual({ sysctls: [], changedSince: ['net.ipv4.conf.all.rp_filter'] });
    await next.host.setUp('dc0', false);
    expect(JSON.parse(readFileSync(next.recordPath, 'utf8'))).toEqual({ sysctls: [{ key: ALL, previous: '2', setTo: '0' }] });
    next.host.tearDown();
    expect(sysctls.get(ALL)).toBe('2');
  });

  it('a start that fails after adopting puts the dead decap\'s changes back and drops its record', async () => {
    const sysctls = await killedDecap('1');
    const next = fakes(sysctls, runDir);
    await next.host.adopt();
    next.host.tearDown(); // as runDecap's finally does when setUp throws
    expect(sysctls.get(ALL)).toBe('1');
    expect(existsSync(next.recordPath)).toBe(false);
  });

  it('a sysctl it cannot write is not put back, and the record goes at tearDown', async () => {
    const sysctls = new Map([
      [ALL, '1'],
      [DEV, '1'],
    ]);
    const f = fakes(sysctls, runDir);
    const host = new DecapHost(
      { debug: () => {}, info: () => {}, warn: (msg) => void f.logged.push({ level: 'warn', msg, fields: undefined }), error: () => {} },
      async () => ({ stdout: '' }),
      {
        read: (k) => sysctls.get(k),
        write: (k, v) => {
          if (k === ALL) throw new Error('EACCES');
          sysctls.set(k, v);
        },
      },
      { open: (name) => ({ fd: 42, name }), close: () => {} },
      runDir,
    );
    await host.adopt();
    await expect(host.setUp('dc0', false)).rejects.toThrow('EACCES');
    host.tearDown();
    expect(sysctls.get(ALL)).toBe('1');
    expect(f.logged).toEqual([]);
    expect(existsSync(f.recordPath)).toBe(false);
  });

  it('without a record it can write (a read-only /run), it warns and still works and undoes', async () => {
    if (process.getuid?.() === 0) {
      // root writes through a mode; a path below a regular file cannot be created by anyone.
      writeFileSync(runDir, '');
    } else {
      chmodSync(join(runDir, '..'), 0o500);
    }
    const sysctls = new Map([
      [ALL, '1'],
      [DEV, '1'],
    ]);
    const f = fakes(sysctls, join(runDir, 'dsrlb'));
    await f.host.adopt();
    await f.host.setUp('dc0', false);
    expect(sysctls.get(ALL)).toBe('0');
    expect(f.logged.filter((l) => l.level === 'warn').map((l) => l.msg)).toEqual([
      'cannot write the record of the sysctls decap changes: if decap is killed (not stopped), the values before it are lost',
    ]);
    f.host.tearDown();
    expect(sysctls.get(ALL)).toBe('1');
    expect(f.logged.filter((l) => l.level === 'warn')).toHaveLength(1);
  });

  it('takes from a record only all.rp_filter with a value rp_filter can hold: kernel/core_pattern, a ../ path or another value is not written at stop, and each is named in a warning', async () => {
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
    mkdirSync(runDir);
    const f = fakes(sysctls, runDir);
    writeFileSync(f.recordPath, JSON.stringify({ sysctls: planted }), { mode: 0o600 });
    await f.host.adopt();
    expect(f.logged.filter((l) => l.level === 'warn').map((l) => JSON.parse(l.fields!.entry as string))).toEqual(planted.slice(0, 4));
    expect(f.logged.find((l) => l.msg.startsWith('adopted the record'))?.fields).toEqual({ sysctls: ['net.ipv4.conf.all.rp_filter=0 (was 2)'] });
    f.host.tearDown();
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
    mkdirSync(runDir);
    const sysctls = new Map([
      [ALL, '0'],
      [DEV, '1'],
    ]);
    const f = fakes(sysctls, runDir);
    writeFileSync(f.recordPath, JSON.stringify({ sysctls: [{ key: ALL, previous: '2', setTo: '0' }] }), { mode: 0o600 });
    chownSync(f.recordPath, 65534, 65534);
    await f.host.adopt();
    expect(f.logged.map((l) => l.msg)).toEqual(['ignored a run-state record this process did not write']);
    f.host.tearDown();
    expect(sysctls.get(ALL)).toBe('0');
    expect(existsSync(f.recordPath)).toBe(true);
  });
});
