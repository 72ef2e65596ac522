// One daemon per network namespace: the second acquire is refused while the first holds the lock,
// and the lock is free again once released (or once its process is gone).

import { describe, expect, it } from 'vitest';
import { InstanceLock, InstanceLockError } from '../../src/control/instance-lock.js';

describe('InstanceLock', () => {
  it('refuses a second holder with ALREADY_RUNNING until the first releases it', async () => {
    const name = `\0dsrlb-test-lock-${process.pid}`;
    const first = await InstanceLock.acquire(name);
    const second = await InstanceLock.acquire(name).then(
      () => null,
      (e: unknown) => e,
    );
    expect(second).toBeInstanceOf(InstanceLockError);
    expect((second as InstanceLockError).code).toBe('ALREADY_RUNNING');
    expect((second as Error).message).toMatch(/another dsrlb daemon is running/);
    first.release();
    const again = await InstanceLock.acquire(name);
    again.release();
  });
});
