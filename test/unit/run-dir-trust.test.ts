// Run-state records in a directory another user may write (/run/dsrlb is the service user's, and
// root runs dsrlb there by hand): a record is written through a new file made by its own open and
// renamed in, never through a symlink planted at any name, and read only when this process wrote
// it (a regular file of its euid, not a symlink, a FIFO or a hard link).

import { execFileSync } from 'node:child_process';
import { chownSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { readRunRecord, writeFileAside, writeRunRecord } from '../../src/control/host-setup.js';

/** nobody: a user other than the test's (root) to own a planted record. */
const OTHER_UID = 65534;

let dir: string;
let victim: string;
beforeEach(() => {
  dir = mkdtempSync('/tmp/dsrlb-test-rundir-');
  victim = join(dir, 'victim');
  writeFileSync(victim, 'not yours\n', { mode: 0o640 });
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function warnings() {
  const seen: { msg: string; fields: Record<string, unknown> | undefined }[] = [];
  return { seen, log: { warn: (msg: string, fields?: Record<string, unknown>) => void seen.push({ msg, fields }) } };
}

describe('writeRunRecord', () => {
  it('does not write through a symlink planted at the old fixed .tmp name or at the record itself; the record is a 0600 file and nothing is left aside', async () => {
    const path = join(dir, 'host-1-eth0.json');
    symlinkSync(victim, `${path}.tmp`);
    symlinkSync(victim, path);
    const old = process.umask(0o022);
    try {
      await writeRunRecord(path, { addedAddresses: ['198.51.100.1/32'] });
    } finally {
      process.umask(old);
    }
    expect(readFileSync(victim, 'utf8')).toBe('not yours\n');
    expect(statSync(victim).mode & 0o777).toBe(0o640);
    // rename replaced the link itself with the record.
    const st = lstatSync(path);
    expect(st.isFile()).toBe(true);
    expect(st.mode & 0o777).toBe(0o600);
    expect(JSON.parse(readFileSync(path, 'utf8'))).toEqual({ addedAddresses: ['198.51.100.1/32'] });
    expect(readdirSync(dir).sort()).toEqual(['host-1-eth0.json', 'host-1-eth0.json.tmp', 'victim']);
  });

  it('removes the file aside when the rename fails, and the error reaches the caller', async () => {
    const path = join(dir, 'record.json');
    mkdirSync(path);
    writeFileSync(join(path, 'inside'), '');
    await expect(writeFileAside(path, '{}', 0o600)).rejects.toMatchObject({ code: expect.stringMatching(/^(EISDIR|ENOTEMPTY|EEXIST)$/) });
    expect(readdirSync(dir).sort()).toEqual(['record.json', 'victim']);
  });

  it('gives the file aside a new name each time, made by its own open (two writes never share one)', async () => {
    const path = join(dir, 'record.json');
    await Promise.all([writeRunRecord(path, { n: 1 }), writeRunRecord(path, { n: 2 })]);
    expect([1, 2]).toContain((JSON.parse(readFileSync(path, 'utf8')) as { n: number }).n);
    expect(readdirSync(dir).sort()).toEqual(['record.json', 'victim']);
  });
});

describe('readRunRecord', () => {
  it('reads a record this process wrote', async () => {
    const path = join(dir, 'record.json');
    await writeRunRecord(path, { sysctls: [] });
    const w = warnings();
    expect(await readRunRecord(path, w.log)).toEqual({ sysctls: [] });
    expect(w.seen).toEqual([]);
  });

  it('is null without a record or with one that is not JSON, and says nothing of either', async () => {
    const w = warnings();
    expect(await readRunRecord(join(dir, 'none.json'), w.log)).toBeNull();
    writeFileSync(join(dir, 'half.json'), '{"sysc');
    expect(await readRunRecord(join(dir, 'half.json'), w.log)).toBeNull();
    expect(w.seen).toEqual([]);
  });

  it('ignores a record another user owns, though root could read it, and says why', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const path = join(dir, 'decap-1.json');
    writeFileSync(path, JSON.stringify({ sysctls: [{ key: 'kernel/core_pattern', previous: '|/tmp/x', setTo: 'core' }] }), { mode: 0o600 });
    chownSync(path, OTHER_UID, OTHER_UID);
    const w = warnings();
    expect(await readRunRecord(path, w.log)).toBeNull();
    expect(w.seen).toEqual([
      { msg: 'ignored a run-state record this process did not write', fields: { path, why: `it belongs to uid ${OTHER_UID}, not to this process (uid 0)` } },
    ]);
  });

  it('does not follow a symlink at the record, even to a record of its own', async () => {
    const own = join(dir, 'own.json');
    await writeRunRecord(own, { addedAddresses: [] });
    const path = join(dir, 'host-1-eth0.json');
    symlinkSync(own, path);
    const w = warnings();
    expect(await readRunRecord(path, w.log)).toBeNull();
    expect(w.seen).toEqual([{ msg: 'ignored a run-state record that is a symbolic link', fields: { path } }]);
  });

  it('ignores a hard link (a second name for a file, maybe another run\'s) and a FIFO, which it does not wait on', async () => {
    const own = join(dir, 'own.json');
    await writeRunRecord(own, { addedAddresses: [] });
    const linked = join(dir, 'host-1-eth0.json');
    linkSync(own, linked);
    const fifo = join(dir, 'host-1-eth1.json');
    execFileSync('mkfifo', [fifo]);
    const w = warnings();
    expect(await readRunRecord(linked, w.log)).toBeNull();
    expect(await readRunRecord(fifo, w.log)).toBeNull();
    expect(w.seen.map((s) => s.fields?.why)).toEqual(['it has 2 names (a hard link)', 'it is not a regular file']);
  });

  it('reads, as root, the record an earlier root run wrote in the service user\'s directory', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    // /run/dsrlb as tmpfiles makes it (0755, the service user's): a record root writes there is root's.
    const runDir = join(dir, 'run');
    mkdirSync(runDir, { mode: 0o755 });
    chownSync(runDir, OTHER_UID, OTHER_UID);
    const path = join(runDir, 'host-1-eth0.json');
    await writeRunRecord(path, { addedAddresses: ['198.51.100.1/32'] });
    expect(statSync(path).uid).toBe(0);
    expect(await readRunRecord(path)).toEqual({ addedAddresses: ['198.51.100.1/32'] });
  });
});

describe('writeFileAside with directoryOwner (the state and flows files)', () => {
  it('gives the file a root run writes to the directory\'s owner, so the service reads the drains made by hand', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const stateDir = join(dir, 'var-lib-dsrlb');
    mkdirSync(stateDir, { mode: 0o755 });
    chownSync(stateDir, 65534, 65534);
    await writeFileAside(join(stateDir, 'dsrlb.state.json'), '{}', 0o640, { directoryOwner: true });
    expect(lstatSync(join(stateDir, 'dsrlb.state.json'))).toMatchObject({ uid: 65534, gid: 65534 });
    // Without it (run records): root's own.
    await writeFileAside(join(stateDir, 'other.json'), '{}', 0o600);
    expect(lstatSync(join(stateDir, 'other.json')).uid).toBe(0);
  });
});

describe('a start after a run that died while writing the state or flows file', () => {
  it('removes the halves it left beside the state file (its own only), nothing else', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const { Daemon } = await import('../../src/control/daemon.js');
    const { createLogger } = await import('../../src/control/logger.js');
    const { parseConfigText } = await import('../../src/config/validate.js');
    const stateFile = join(dir, 'dsrlb.state.json');
    const parsed = parseConfigText(`interface: eth0\nstateFile: ${stateFile}\nservices:\n  - { name: web, vip: 10.93.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }] }\n`);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    for (const name of ['dsrlb.state.json.0123456789abcdef.tmp', 'dsrlb.state.json.flows.fedcba9876543210.tmp', 'dsrlb.state.json.flows.0000000000000000.tmp', 'dsrlb.state.json', 'other.0123456789abcdef.tmp', 'dsrlb.state.json.tmp']) {
      writeFileSync(join(dir, name), 'x');
    }
    chownSync(join(dir, 'dsrlb.state.json.flows.0000000000000000.tmp'), 65534, 65534);
    const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
    daemon.config = parsed.config;
    await (daemon as unknown as { removeStaleTempFiles(): Promise<void> }).removeStaleTempFiles();
    expect(readdirSync(dir).sort()).toEqual(['dsrlb.state.json', 'dsrlb.state.json.flows.0000000000000000.tmp', 'dsrlb.state.json.tmp', 'other.0123456789abcdef.tmp', 'victim']);
    daemon.health.stop();
  });
});
