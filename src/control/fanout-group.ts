// The PACKET_FANOUT group of the daemon's packet loops, as the control plane keeps track of it:
// whether a loop about to open its socket joins the group, which id that is, or makes a new one.
// The kernel keeps a group while any socket is in it and picks a new group's id (no group of the
// network namespace has it, so no other program's group is joined by mistake); a socket that
// names an id joins the group that has it, and the kernel makes one under it when none does.

import type { FanoutMembership } from '../dataplane/loop-runner.js';

/** A promise with its settle functions, for the loops that wait for the id of a group being made. */
interface Pending {
  readonly promise: Promise<number>;
  readonly resolve: (groupId: number) => void;
  readonly reject: (err: Error) => void;
}

export class FanoutGroupError extends Error {
  readonly code = 'LOOP_FANOUT';
}

export class FanoutGroup {
  /** The group's id once the loop that made it is ready; null before, and when no loop holds it. */
  private groupId: number | null = null;
  /** The loop that makes the group, and its id for the loops that start meanwhile. */
  private maker: object | null = null;
  private making: Pending | null = null;
  /**
   * Loops whose socket is in the group or is to join it, from the moment they are told to until
   * their socket is closed (their worker exited). While one is here the group exists, or is made
   * again under the same id by the first of them to join; when none is, it is gone.
   */
  private holders = new Set<object>();

  /** The group's id, null while none is known (not made yet, or gone). */
  get id(): number | null {
    return this.groupId;
  }

  /**
   * What `loop`, about to open its socket, does: join the group while a loop holds it, or make a
   * new one. A loop that starts while another makes it waits for that loop's id, and fails when
   * that loop does. The loop holds the group until leave().
   */
  async enter(loop: object): Promise<FanoutMembership> {
    if (this.making !== null) {
      this.holders.add(loop);
      return { mode: 'join', groupId: await this.making.promise };
    }
    if (this.groupId !== null && this.holders.size > 0) {
      this.holders.add(loop);
      return { mode: 'join', groupId: this.groupId };
    }
    this.groupId = null;
    this.holders.add(loop);
    this.maker = loop;
    let resolve!: (groupId: number) => void;
    let reject!: (err: Error) => void;
    const promise = new Promise<number>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // A group made with nobody waiting must not turn a failure into an unhandled rejection.
    promise.catch(() => undefined);
    this.making = { promise, resolve, reject };
    return { mode: 'make' };
  }

  /** `loop` is ready, its socket in group `groupId`: for the loop that made it, the id the others join. */
  ready(loop: object, groupId: number): void {
    if (loop !== this.maker || this.making === null) return;
    this.groupId = groupId;
    this.making.resolve(groupId);
    this.making = null;
    this.maker = null;
  }

  /**
   * `loop`'s socket is closed, or was never opened. When it was to make the group, the loops
   * waiting for its id fail (the next loop to start makes one); when it was the last to hold the
   * group, the group is gone and the next loop makes a new one. A loop that ended because its
   * interface was deleted (`interfaceGone`) takes the group with it: its other members are bound
   * to that interface too and receive nothing any more, and the loops started again on the
   * interface as it is now make a new group (a socket on the new interface cannot join the old
   * group: EINVAL).
   */
  leave(loop: object, interfaceGone = false): void {
    if (!this.holders.has(loop)) return;
    if (loop === this.maker && this.making !== null) {
      this.making.reject(new FanoutGroupError('the packet loop that was to make the fanout group for the others failed to start'));
      this.making = null;
      this.maker = null;
    }
    if (interfaceGone && this.making === null) {
      // The loops still in it leave later and find themselves in no set: they count for nothing.
      this.holders = new Set();
      this.groupId = null;
      return;
    }
    this.holders.delete(loop);
    if (this.holders.size === 0) this.groupId = null;
  }
}
