// Which state file the daemon of this network namespace last used, for its config file. A
// reload that moves `stateFile` copies the intent itself; an edit followed by a restart gives the
// new daemon only the new path, where nothing is yet: without this record it started on the
// config's intent (a drained real took new flows again) and without the flows of the one before.
// The record lives in /run (one boot) beside the host records and is never removed by a stop.

import { copyFile, rename, stat, unlink } from 'node:fs/promises';
import { readRunRecord, runRecordPath, writeRunRecord } from './host-setup.js';

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
 * away from it, or absent). Null otherwise.
 */
export async function movedStateFile(runDir: string, config: string, stateFile: string): Promise<string | null> {
  const record = await readRunRecord<Partial<StateFileRecord>>(recordPath(runDir));
  if (record === null || record.config !== config || typeof record.stateFile !== 'string' || record.stateFile === stateFile) return null;
  const exists = await stat(record.stateFile).then((s) => s.isFile(), () => false);
  return exists ? record.stateFile : null;
}

/**
 * Moves the flows file (`FILE.flows`, written by the clean stop before) from beside `from` to
 * beside `to`, over an older one there. False when there was none to move.
 */
export async function moveFlowsFile(from: string, to: string): Promise<boolean> {
  const source = `${from}.flows`;
  const target = `${to}.flows`;
  try {
    await rename(source, target);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return false;
    if (code !== 'EXDEV') throw err;
    // Another filesystem: copied whole aside, renamed in, then the old one goes.
    await copyFile(source, `${target}.tmp`);
    await rename(`${target}.tmp`, target);
    await unlink(source);
  }
  return true;
}
