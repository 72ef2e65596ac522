// One daemon per network namespace: the second acquire is refused while the first holds the lock,
// and the lock is free again once released or once its process is gone (even SIGKILLed). No
// other user can take it, block it or plant its file; the old abstract socket name blocks nothing.
// Needs root (it runs children as nobody), as the namespace tests do.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, lstatSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runLockPath } from '../../src/control/host-setup.js';
import { InstanceLock, InstanceLockError } from '../../src/control/instance-lock.js';

const ADDON = fileURLToPath(new URL('../../native/build/Release/dsrlb_native.node', import.meta.url));
const NOBODY = 65534;
const AS_NOBODY = ['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups'];
const run = promisify(execFile);

/** What acquire threw, or null (the lock it took is released). */
async function acquireError(runDir: string): Promise<Error | null> {
  try {
    (await InstanceLock.acquire(undefined, undefined, runDir)).release();
    return null;
  } catch (err) {
    return err as Error;
  }
}

/** A node child (as nobody with AS_NOBODY) that runs `script` and stays; resolves at its first stdout line. */
async function startChild(prefix: readonly string[], script: string, args: readonly string[]): Promise<{ child: ChildProcess; line: string }> {
  const argv = [...prefix, process.execPath, '-e', script, ...args];
  const child = spawn(argv[0]!, argv.slice(1), { cwd: '/', stdio: ['ignore', 'pipe', 'inherit'] });
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (b: Buffer) => {
      out += b.toString();
      if (out.includes('\n')) resolve(out.split('\n')[0]!);
    });
    child.once('exit', (code) => reject(new Error(`child exited (${code}) before a line: ${out}`)));
  });
  return { child, line };
}

async function killed(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

/** Opens argv[1] read-write and flocks it with the addon (argv[2]); prints true/false, or the errno name. */
const TRY_LOCK = `
  const fs = require('node:fs');
  try {
    const fd = fs.openSync(process.argv[1], 'r+');
    console.log(String(require(process.argv[2]).lockFile(fd)));
  } catch (e) { console.log(e.code); }
  setInterval(() => {}, 1000);
`;

describe('InstanceLock', () => {
  let runDir: string;
  let children: ChildProcess[];
  beforeEach(() => {
    runDir = mkdtempSync(join(tmpdir(), 'dsrlb-test-lock-'));
    children = [];
  });
  afterEach(async () => {
    for (const child of children) await killed(child);
    rmSync(runDir, { recursive: true, force: true });
  });

  it('refuses a second holder with ALREADY_RUNNING until the first releases it, and leaves its 0600 file', async () => {
    // flock belongs to the open file description: a second open in this same process conflicts.
    const first = await InstanceLock.acquire(undefined, undefined, runDir);
    const second = await acquireError(runDir);
    expect(second).toBeInstanceOf(InstanceLockError);
    expect((second as InstanceLockError).code).toBe('ALREADY_RUNNING');
    expect(second!.message).toMatch(/^another dsrlb daemon is running in this network namespace/);
    first.release();
    first.release(); // idempotent
    expect(await acquireError(runDir)).toBeNull();
    const file = lstatSync(runLockPath(runDir, 'instance'));
    expect([file.isFile(), file.uid, file.mode & 0o777]).toEqual([true, 0, 0o600]);
  });

  it('keeps each kind apart, and says its own busy message', async () => {
    const daemon = await InstanceLock.acquire(undefined, undefined, runDir);
    const decap = await InstanceLock.acquire('decap', 'decap busy', runDir);
    const again = await InstanceLock.acquire('decap', 'decap busy', runDir).then(
      () => null,
      (e: unknown) => e as Error,
    );
    expect([again instanceof InstanceLockError, again?.message]).toEqual([true, 'decap busy']);
    daemon.release();
    decap.release();
  });

  it('makes a missing run directory, 0755 at most', async () => {
    const dir = join(runDir, 'run', 'dsrlb');
    expect(await acquireError(dir)).toBeNull();
    const st = statSync(dir);
    expect([st.isDirectory(), st.uid, st.mode & 0o022]).toEqual([true, 0, 0]);
  });

  it('is free again once its holder is SIGKILLed', async () => {
    const path = runLockPath(runDir, 'instance');
    (await InstanceLock.acquire(undefined, undefined, runDir)).release();
    const holder = await startChild([], TRY_LOCK, [path, ADDON]);
    children.push(holder.child);
    expect(holder.line).toBe('true');
    expect(await acquireError(runDir)).toBeInstanceOf(InstanceLockError);
    await killed(holder.child);
    expect(await acquireError(runDir)).toBeNull();
  });

  it('cannot be taken, blocked or made by an unprivileged user; root takes it after', async () => {
    chmodSync(runDir, 0o755); // as /run/dsrlb: others may look in, not write
    const path = runLockPath(runDir, 'instance');
    const held = await InstanceLock.acquire(undefined, undefined, runDir);
    // Whether root holds it or not, nobody can open the file (to flock it) or make another kind's.
    const attempt = `
      const fs = require('node:fs');
      const codes = [];
      try { fs.openSync(process.argv[1], 'r'); codes.push('opened'); } catch (e) { codes.push(e.code); }
      try { fs.openSync(process.argv[2], 'wx', 0o600); codes.push('made'); } catch (e) { codes.push(e.code); }
      console.log(codes.join(' '));
    `;
    const args = ['-e', attempt, path, runLockPath(runDir, 'decap')];
    const whileHeld = await run(AS_NOBODY[0]!, [...AS_NOBODY.slice(1), process.execPath, ...args], { cwd: '/' });
    expect(whileHeld.stdout.trim()).toBe('EACCES EACCES');
    held.release();
    const whileFree = await run(AS_NOBODY[0]!, [...AS_NOBODY.slice(1), process.execPath, ...args], { cwd: '/' });
    expect(whileFree.stdout.trim()).toBe('EACCES EACCES');
    // flock(1) as nobody, the way a shell user would try it.
    const flock = await run(AS_NOBODY[0]!, [...AS_NOBODY.slice(1), 'flock', '-n', path, 'true'], { cwd: '/' }).then(
      () => 'taken',
      (e: { stderr: string }) => e.stderr,
    );
    expect(flock).toMatch(/Permission denied/);
    expect(await acquireError(runDir)).toBeNull();
  });

  it('is not blocked by a process holding the old abstract socket name \\0dsrlb-instance', async () => {
    // Any user could bind it first; that made every `dsrlb run` refuse as "already running".
    const bind = `
      require('node:net').createServer().on('error', (e) => console.log(e.code)).listen('\\0dsrlb-instance', () => console.log('bound'));
    `;
    const squatter = await startChild(AS_NOBODY, bind, []);
    children.push(squatter.child);
    // EADDRINUSE: something else holds the name already, which serves as well.
    expect(['bound', 'EADDRINUSE']).toContain(squatter.line);
    expect(await acquireError(runDir)).toBeNull();
  });

  it('in a run directory of the service user (systemd RuntimeDirectory=), root hands its file to that user, who takes it after', async () => {
    chownSync(runDir, NOBODY, NOBODY);
    chmodSync(runDir, 0o755);
    const path = runLockPath(runDir, 'instance');
    const held = await InstanceLock.acquire(undefined, undefined, runDir);
    expect([statSync(path).uid, statSync(path).mode & 0o777]).toEqual([NOBODY, 0o600]);
    const blocked = await startChild(AS_NOBODY, TRY_LOCK, [path, ADDON]);
    children.push(blocked.child);
    expect(blocked.line).toBe('false');
    held.release();
    const service = await startChild(AS_NOBODY, TRY_LOCK, [path, ADDON]);
    children.push(service.child);
    expect(service.line).toBe('true');
    expect(await acquireError(runDir)).toBeInstanceOf(InstanceLockError);
    // And root, by hand again, takes the file the service user holds no more.
    await killed(service.child);
    expect(await acquireError(runDir)).toBeNull();
    expect(statSync(path).uid).toBe(NOBODY);
  });

  it.each([
    ['a symbolic link', (path: string, dir: string) => symlinkSync(join(dir, 'target'), path), /is a symbolic link: refusing to follow it/],
    [
      'a file of another uid',
      (path: string) => {
        writeFileSync(path, '', { mode: 0o600 });
        chownSync(path, NOBODY, NOBODY);
      },
      /\(uid 65534, mode 0600\) must be a regular file of uid 0 with mode 0600: another user may have planted it/,
    ],
    ['a file others may read (and so flock)', (path: string) => writeFileSync(path, '', { mode: 0o644 }), /\(uid 0, mode 0644\) must be a regular file of uid 0 with mode 0600/],
  ])('refuses a lock file that is %s with a clear error, not as busy', async (_what, plant, message) => {
    writeFileSync(join(runDir, 'target'), 'keep');
    const path = runLockPath(runDir, 'instance');
    plant(path, runDir);
    const error = await acquireError(runDir);
    expect(error).not.toBeInstanceOf(InstanceLockError);
    expect(error?.message).toContain(`lock file ${path}`);
    expect(error?.message).toMatch(message);
    expect(readFileSync(join(runDir, 'target'), 'utf8')).toBe('keep');
  });

  it('refuses a run directory others may write (they could plant the file)', async () => {
    chmodSync(runDir, 0o777);
    const error = await acquireError(runDir);
    expect(error).not.toBeInstanceOf(InstanceLockError);
    expect(error?.message).toMatch(/\(uid 0, mode 0777\) must be a directory that no one but its owner may write: refusing to keep the lock/);
  });
});
