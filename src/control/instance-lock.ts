// One daemon per network namespace: the nftables table `inet dsrlb`, the VIPs and the run-state
// file are the namespace's, so a second `dsrlb run` must refuse before it touches any of them.
// The lock is an exclusive flock(2) on a file in the run directory, named by the namespace's inode
// (runLockPath): the kernel drops it when its process dies (even on SIGKILL), and only root or the
// directory's owner (the service user) can open the file. Not an abstract Unix socket: any local
// user may bind an abstract name first, and every start would then refuse as "already running".

import { closeSync, constants, fchownSync, fstatSync, lstatSync, mkdirSync, openSync, statSync, type Stats } from 'node:fs';
import { loadNative } from '../io/native-binding.js';
import { RUN_DIR, runLockPath } from './host-setup.js';

/** The daemon's lock: `${RUN_DIR}/instance-<netns inode>.lock`. */
export const INSTANCE_LOCK_KIND = 'instance';

const DAEMON_BUSY = 'another dsrlb daemon is running in this network namespace (it owns the VIPs and the nftables table inet dsrlb): stop it first';

export class InstanceLockError extends Error {
  readonly code = 'ALREADY_RUNNING';
}

export class InstanceLock {
  private constructor(private fd: number | null) {}

  /**
   * Takes lock `kind` of this network namespace, a file in runDir (both made if missing), or throws
   * InstanceLockError (with `busy` as its message) if another process holds it. A directory or file
   * another user could have planted is refused with a plain Error naming it, never as busy.
   */
  static async acquire(kind: string = INSTANCE_LOCK_KIND, busy: string = DAEMON_BUSY, runDir: string = RUN_DIR): Promise<InstanceLock> {
    const path = runLockPath(runDir, kind);
    const euid = process.geteuid!();
    const dir = trustedRunDir(runDir, euid, path);
    const { fd, made } = openLockFile(path);
    try {
      // systemd makes /run/dsrlb the service user's: root, run by hand, gives that user the file it
      // made there, or the service could not open it later. Only a file this open made: one found
      // there may be a hard link to any other file.
      if (euid === 0 && made && dir.uid !== 0) fchownSync(fd, dir.uid, dir.gid);
      const file = fstatSync(fd);
      // Mode 0600: flock needs only a read-only fd, so a file others can read is one they can block.
      if (!file.isFile() || (file.uid !== euid && file.uid !== dir.uid) || (file.mode & 0o077) !== 0) {
        const owners = dir.uid === euid ? `uid ${euid}` : `uid ${euid} or ${dir.uid}`;
        throw new Error(`lock file ${path} (uid ${file.uid}, mode ${octal(file)}) must be a regular file of ${owners} with mode 0600: another user may have planted it (remove it while no dsrlb runs)`);
      }
      if (!loadNative().lockFile(fd)) throw new InstanceLockError(busy);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
    return new InstanceLock(fd);
  }

  /** Closing the fd drops the lock. The file stays: unlinking it would race with a new locker. */
  release(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/**
 * runDir, made 0755 if missing; refused when anyone but its owner may write it (they could plant
 * the file) or, for a user other than root, when its owner is neither root nor that user.
 */
function trustedRunDir(runDir: string, euid: number, path: string): Stats {
  let dir: Stats;
  try {
    mkdirSync(runDir, { recursive: true, mode: 0o755 });
    dir = statSync(runDir);
  } catch (err) {
    throw new Error(`cannot make ${runDir} for the lock ${path}: ${(err as Error).message}`);
  }
  const owner = euid === 0 || dir.uid === 0 || dir.uid === euid;
  if (!dir.isDirectory() || !owner || (dir.mode & 0o022) !== 0) {
    const owners = euid === 0 ? '' : ` of root or uid ${euid}`;
    throw new Error(`${runDir} (uid ${dir.uid}, mode ${octal(dir)}) must be a directory${owners} that no one but its owner may write: refusing to keep the lock ${path} in it`);
  }
  return dir;
}

/**
 * Opens (made: creates, 0600) the lock file read-write. O_NOFOLLOW: a symlink planted at the path
 * is refused (ELOOP), never followed. libuv opens every file O_CLOEXEC (fs.constants has no such
 * flag), so no command we spawn inherits the lock.
 */
function openLockFile(path: string): { fd: number; made: boolean } {
  const flags = constants.O_RDWR | constants.O_NOFOLLOW;
  try {
    try {
      return { fd: openSync(path, flags | constants.O_CREAT | constants.O_EXCL, 0o600), made: true };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      return { fd: openSync(path, flags), made: false };
    }
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    if (e.code === 'ELOOP') throw new Error(`lock file ${path} is a symbolic link: refusing to follow it (remove it while no dsrlb runs)`);
    // A file another user made (root by hand, before the service): say whose, and what to do.
    const owner = e.code === 'EACCES' ? ownerOf(path) : null;
    if (owner !== null) throw new Error(`cannot open lock file ${path} of uid ${owner}: ${e.message} (remove it while no dsrlb runs)`);
    throw new Error(`cannot open lock file ${path}: ${e.message}`);
  }
}

function ownerOf(path: string): number | null {
  try {
    return lstatSync(path).uid;
  } catch {
    return null;
  }
}

function octal(st: Stats): string {
  return (st.mode & 0o7777).toString(8).padStart(4, '0');
}
