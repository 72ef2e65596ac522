// The record of the state file the last daemon used: a stateFile edited between a stop and a start
// is found again only for the same config file, only when the old file is still there, and the
// flows file moves beside the new path (over an older one).

import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { moveFlowsFile, movedStateFile, recordStateFile } from '../../src/control/state-file-record.js';

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
});
