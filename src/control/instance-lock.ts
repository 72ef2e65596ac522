// One daemon per network namespace: the nftables table `inet dsrlb`, the VIPs and the run-state
// file are the namespace's, so a second `dsrlb run` must refuse before it touches any of them.
// The lock is an abstract Unix socket bound for the daemon's life: abstract names are scoped to
// the network namespace, the kernel releases one when its process dies (even on SIGKILL), so no
// stale lock file can outlive a crash, and binding needs no privilege or writable directory.

import { createServer, type Server } from 'node:net';

/** The abstract socket name (the leading NUL makes it abstract on Linux). */
export const INSTANCE_LOCK_NAME = '\0dsrlb-instance';

const DAEMON_BUSY = 'another dsrlb daemon is running in this network namespace (it owns the VIPs and the nftables table inet dsrlb): stop it first';

export class InstanceLockError extends Error {
  readonly code = 'ALREADY_RUNNING';
}

export class InstanceLock {
  private constructor(private server: Server | null) {}

  /**
   * Takes the lock of this network namespace, or throws InstanceLockError (with `busy` as its
   * message) if another process holds it.
   */
  static async acquire(name: string = INSTANCE_LOCK_NAME, busy: string = DAEMON_BUSY): Promise<InstanceLock> {
    const server = createServer((socket) => socket.destroy());
    await new Promise<void>((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => {
        if (err.code === 'EADDRINUSE') {
          reject(new InstanceLockError(busy));
        } else {
          reject(new Error(`taking the instance lock: ${err.message}`));
        }
      });
      server.listen(name, () => resolve());
    });
    // The lock alone must not keep a stopping process alive.
    server.unref();
    return new InstanceLock(server);
  }

  release(): void {
    this.server?.close();
    this.server = null;
  }
}
