// The record of the state file the last daemon used: a stateFile edited between a stop and a start
// is found again only for the same config file, only when the old file is still there, and the
// flows file moves beside the new path (over an older one). Neither is taken when it is not this
// process's own regular file: a symlink, another user's file or record is refused.

import { chown, lstat, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { moveFlowsFile, movedStateFile, recordStateFile } from '../../src/control/state-file-record.js';

/** nobody: a user other than the test's (root). */
const OTHER_UID = 65534;

function warnings() {
  const seen: { msg: string; fields: Record<string, unknown> | undefined }[] = [];
  return { seen, log: { warn: (msg: string, fields?: Record<string, unknown>) => void seen.push({ msg, fields }) } };
}

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-statefile-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('movedStateFile', () => {
  it('names the file the last daemon with this config used when the config now names another', async () => {
    const old = join(dir, 'old.json');
    await writeFile(old, '{}');
    await recordStateFile(dir, '/etc/dsrlb/dsrlb.yaml', old);
    expect(await movedStateFile(dir, '/etc/dsrlb/dsrlb.yaml', join(dir, 'new.json'))).toBe(old);
    // The same path: nothing moved.
    expect(await movedStateFile(dir, '/etc/dsrlb/dsrlb.yaml', old)).toBeNull();
    // Another config file's daemon (another instance, or a test) is not ours to take from.
    expect(await movedStateFile(dir, '/etc/dsrlb/other.yaml', join(dir, 'new.json'))).toBeNull();
  });

  it('is null without a record, with an unreadable one, or when the old file is gone', async () => {
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'))).toBeNull();
    await recordStateFile(dir, '/c.yaml', join(dir, 'gone.json'));
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'))).toBeNull();
    const [record] = (await readdir(dir)).filter((f) => f.startsWith('state-'));
    await writeFile(join(dir, record!), '{"config": "/c.yaml", "stateFile": 5}');
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'))).toBeNull();
  });

  it('is null, and says why, when the file named is a symlink (to a file of its own too), relative, or not a regular file', async () => {
    const own = join(dir, 'own.json');
    await writeFile(own, '{}');
    const linked = join(dir, 'old.json');
    await symlink('/etc/shadow', linked);
    const w = warnings();
    await recordStateFile(dir, '/c.yaml', linked);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    await rm(linked);
    await symlink(own, linked);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    await recordStateFile(dir, '/c.yaml', 'own.json');
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    await recordStateFile(dir, '/c.yaml', dir);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    expect(w.seen.map((s) => s.fields?.why ?? s.msg)).toEqual([
      'it is a symbolic link',
      'it is a symbolic link',
      'ignored the state file the daemon before used: not an absolute path',
      'it is not a regular file',
    ]);
  });

  it('is null, as root, for a file another user owns, and for a record another user wrote (the service user may write /run/dsrlb)', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const old = join(dir, 'old.json');
    await writeFile(old, '{}');
    await chown(old, OTHER_UID, OTHER_UID);
    const w = warnings();
    await recordStateFile(dir, '/c.yaml', old);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    await chown(old, 0, 0);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBe(old);
    const [record] = (await readdir(dir)).filter((f) => f.startsWith('state-'));
    await chown(join(dir, record!), OTHER_UID, OTHER_UID);
    expect(await movedStateFile(dir, '/c.yaml', join(dir, 'new.json'), w.log)).toBeNull();
    expect(w.seen.map((s) => s.fields?.why)).toEqual([`it belongs to uid ${OTHER_UID}, not to this process (uid 0)`, `it belongs to uid ${OTHER_UID}, not to this process (uid 0)`]);
    expect(w.seen.map((s) => s.msg)).toEqual(['ignored the state file the daemon before used', 'ignored a run-state record this process did not write']);
  });
});

describe('moveFlowsFile', () => {
  it('moves FILE.flows beside the new path, over an older one there, and says whether there was one', async () => {
    const from = join(dir, 'old.json');
    const to = join(dir, 'new.json');
    expect(await moveFlowsFile(from, to)).toBe(false);
    await writeFile(`${from}.flows`, 'newest');
    await writeFile(`${to}.flows`, 'older');
    expect(await moveFlowsFile(from, to)).toBe(true);
    expect(await readFile(`${to}.flows`, 'utf8')).toBe('newest');
    await expect(readFile(`${from}.flows`)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('copies across filesystems (EXDEV) and removes the old one', async () => {
    const other = await mkdtemp('/dev/shm/dsrlb-test-statefile-');
    try {
      const from = join(dir, 'old.json');
      const to = join(other, 'new.json');
      await writeFile(`${from}.flows`, 'flows');
      expect(await moveFlowsFile(from, to)).toBe(true);
      expect(await readFile(`${to}.flows`, 'utf8')).toBe('flows');
      await expect(readFile(`${from}.flows`)).rejects.toMatchObject({ code: 'ENOENT' });
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });

  it('refuses a FILE.flows that is a symlink: neither it nor the file it points to moves, and that file is untouched', async () => {
    const from = join(dir, 'old.json');
    const to = join(dir, 'new.json');
    const victim = join(dir, 'victim');
    await writeFile(victim, 'root:x:0:0\n');
    await symlink(victim, `${from}.flows`);
    await writeFile(`${to}.flows`, 'older');
    await expect(moveFlowsFile(from, to)).rejects.toThrow(`${from}.flows is not moved: it is a symbolic link`);
    expect((await lstat(`${from}.flows`)).isSymbolicLink()).toBe(true);
    expect(await readFile(`${to}.flows`, 'utf8')).toBe('older');
    expect(await readFile(victim, 'utf8')).toBe('root:x:0:0\n');
  });

  it('refuses a FILE.flows that is a symlink across filesystems (EXDEV) as well', async () => {
    const other = await mkdtemp('/dev/shm/dsrlb-test-statefile-');
    try {
      const from = join(dir, 'old.json');
      const to = join(other, 'new.json');
      await writeFile(join(dir, 'victim'), 'secret');
      await symlink(join(dir, 'victim'), `${from}.flows`);
      await expect(moveFlowsFile(from, to)).rejects.toThrow('it is a symbolic link');
      expect(await readdir(other)).toEqual([]);
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });

  it('refuses, as root, a FILE.flows another user owns', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const from = join(dir, 'old.json');
    const to = join(dir, 'new.json');
    await writeFile(`${from}.flows`, 'planted');
    await chown(`${from}.flows`, OTHER_UID, OTHER_UID);
    await expect(moveFlowsFile(from, to)).rejects.toThrow(`it belongs to uid ${OTHER_UID}, not to this process (uid 0)`);
    expect(await readFile(`${from}.flows`, 'utf8')).toBe('planted');
    await expect(lstat(`${to}.flows`)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});
