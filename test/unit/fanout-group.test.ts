// FanoutGroup decides, for each packet loop about to open its socket, whether it joins the loops'
// PACKET_FANOUT group or makes a new one: it joins while any loop holds the group (the kernel keeps
// a group while a socket is in it), makes one when none does, and waits for the id while another
// loop makes it. A loop whose interface was deleted takes the group with it.

import { describe, expect, it } from 'vitest';
import { FanoutGroup } from '../../src/control/fanout-group.js';

describe('FanoutGroup', () => {
  it('has the first loop make the group, and a loop that starts meanwhile join it with the id the first reports', async () => {
    const f = new FanoutGroup();
    const [a, b] = [{}, {}];
    expect(await f.enter(a)).toEqual({ mode: 'make' });
    const joining = f.enter(b);
    expect(f.id).toBeNull();
    f.ready(a, 7);
    expect(await joining).toEqual({ mode: 'join', groupId: 7 });
    expect(f.id).toBe(7);
  });

  it('has a loop started later join the group while any loop holds it, and make a new one once none does', async () => {
    const f = new FanoutGroup();
    const [a, b, c, d] = [{}, {}, {}, {}];
    await f.enter(a);
    f.ready(a, 7);
    expect(await f.enter(b)).toEqual({ mode: 'join', groupId: 7 });
    f.leave(a);
    // b still holds it (its socket may be joining it right now).
    expect(await f.enter(c)).toEqual({ mode: 'join', groupId: 7 });
    f.leave(b);
    f.leave(c);
    expect(f.id).toBeNull();
    expect(await f.enter(d)).toEqual({ mode: 'make' });
  });

  it('fails the loops waiting for the id when the loop that was to make the group failed; the next loop makes it', async () => {
    const f = new FanoutGroup();
    const [a, b, c] = [{}, {}, {}];
    await f.enter(a);
    const waiting = f.enter(b);
    f.leave(a);
    await expect(waiting).rejects.toMatchObject({ code: 'LOOP_FANOUT' });
    f.leave(b);
    expect(await f.enter(c)).toEqual({ mode: 'make' });
  });

  it('is given up when a loop in it lost its interface, once: the loops that leave it after that change nothing', async () => {
    const f = new FanoutGroup();
    const [a, b, a2, b2] = [{}, {}, {}, {}];
    await f.enter(a);
    f.ready(a, 7);
    await f.enter(b);
    f.leave(a, true);
    // b is still in the old group, on the deleted interface: a's replacement makes a new one.
    expect(await f.enter(a2)).toEqual({ mode: 'make' });
    f.leave(b, true);
    const joining = f.enter(b2);
    f.ready(a2, 8);
    expect(await joining).toEqual({ mode: 'join', groupId: 8 });
    expect(f.id).toBe(8);
  });
});
