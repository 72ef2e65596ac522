// Which state file the daemon of this network namespace last used, for its config file. A
// reload that moves `stateFile` copies the intent itself; an edit followed by a restart gives the
// new daemon only the new path, where nothing is yet: without this record it started on the
// config's intent (a drained real took new flows again) and without the flows of the one before.
// The record lives in /run (one boot) beside the host records and is never removed by a stop.

import type { Stats } from 'node:fs';
import { lstat, rename, unlink } from 'node:fs/promises';
import { isAbsolute } from 'node:path';
import { openWithoutFollowing, readRunRecord, runRecordPath, whyNotOwnFile, writeFileAside, writeRunRecord } from './host-setup.js';
import type { Logger } from './logger.js';

interface StateFileRecord {
  /** The config file (absolute) the daemon ran with: another config's daemon is another's business. */
  config: string;
  stateFile: string;
}

function recordPath(runDir: string): string {
  return runRecordPath(runDir, 'state');
}

export async function recordStateFile(runDir: string, config: string, stateFile: string): Promise<void> {
  await writeRunRecord(recordPath(runDir), { config, stateFile } satisfies StateFileRecord);
}

/**
 * The state file the last daemon with this config used, when it is not `stateFile` and still
 * exists: its intent is the newest (a file at `stateFile` is older, left by a reload that moved
 * away from it, or absent). Null otherwise, and when it is not an absolute path to a regular file
 * of this process (not a symlink): the daemon reads that file, may rename it aside as corrupt and
 * moves its flows file, so a path another user could choose (or plant a link at) would have a
 * root run move any file. `log` is told why a file named was not taken.
 */
export async function movedStateFile(runDir: string, config: string, stateFile: string, log?: Pick<Logger, 'warn'>): Promise<string | null> {
  const record = await readRunRecord<Partial<StateFileRecord>>(recordPath(runDir), log);
  if (record === null || record.config !== config || typeof record.stateFile !== 'string' || record.stateFile === stateFile) return null;
  const before = record.stateFile;
  if (!isAbsolute(before)) {
    log?.warn('ignored the state file the daemon before used: not an absolute path', { stateFile: before });
    return null;
  }
  const st = await lstat(before).catch(() => null);
  if (st === null) return null;
  const why = whyNotOwnFile(st);
  if (why !== null) {
    log?.warn('ignored the state file the daemon before used', { stateFile: before, why });
    return null;
  }
  return before;
}

/**
 * Moves the flows file (`FILE.flows`, written by the clean stop before) from beside `from` to
 * beside `to`, over an older one there. False when there was none to move; throws, moving
 * nothing, when it is not a regular file of this process (a symlink is never followed).
 */
export async function moveFlowsFile(from: string, to: string): Promise<boolean> {
  const source = `${from}.flows`;
  const target = `${to}.flows`;
  const st = await lstat(source).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw err;
  });
  if (st === null) return false;
  const why = whyNotOwnFile(st);
  if (why !== null) throw new Error(`${source} is not moved: ${why}`);
  try {
    await rename(source, target);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return false;
    if (code !== 'EXDEV') throw err;
    await copyFlowsFile(source, st, target);
    await unlink(source);
    return true;
  }
  // rename moves whatever has the name by then: another file put there since lstat goes again.
  const moved = await lstat(target);
  if (!sameFile(moved, st)) {
    await unlink(target);
    throw new Error(`${source} was replaced while it was moved: not moved`);
  }
  return true;
}

/** Another filesystem (EXDEV): the file lstat saw, through an fd, written aside beside `target` and renamed in. */
async function copyFlowsFile(source: string, st: Stats, target: string): Promise<void> {
  const fh = await openWithoutFollowing(source);
  try {
    if (!sameFile(await fh.stat(), st)) throw new Error(`${source} was replaced while it was moved: not moved`);
    await writeFileAside(target, await fh.readFile(), st.mode & 0o777);
  } finally {
    await fh.close();
  }
}

function sameFile(a: Stats, b: Stats): boolean {
  return a.dev === b.dev && a.ino === b.ino;
}
