// The wait for reals to come back after this LB found none able to take new flows (a VIP withdrawn
// for want of reals, a failOpen panic): over once every wanted real is up, or once none has come up
// for a rise time since the first was back, or at the cap.

import { describe, expect, it } from 'vitest';
import { RECOVERY_CAP_MS, RecoveryHold } from '../../src/control/recovery-hold.js';

const VIP = '10.93.0.100';
const riseMs = 7000; // rise 2, interval 2 s, timeout 1 s: (2 + 1) x 2000 + 1000

describe('RecoveryHold (a VIP withdrawn for want of reals, a failOpen panic)', () => {
  it('never holds a VIP that was not withdrawn for its reals', () => {
    const hold = new RecoveryHold();
    expect(hold.decide(VIP, { wanted: 3, up: 1, riseMs }, 0)).toEqual({ over: true, waitedMs: 0, notUp: 0 });
    expect(hold.isHeld(VIP)).toBe(false);
  });

  it('waits while reals come up, and lets the VIP go the moment the last wanted one is', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    expect(hold.isWaiting(VIP)).toBe(false);
    expect(hold.decide(VIP, { wanted: 3, up: 1, riseMs }, 10_000)).toEqual({ over: false, began: true });
    expect(hold.isWaiting(VIP)).toBe(true);
    expect(hold.decide(VIP, { wanted: 3, up: 2, riseMs }, 12_000)).toEqual({ over: false, began: false });
    expect(hold.decide(VIP, { wanted: 3, up: 3, riseMs }, 13_100)).toEqual({ over: true, waitedMs: 3_100, notUp: 0 });
    expect(hold.isHeld(VIP)).toBe(false);
  });

  it('lets the VIP go the rise time after the first real was back, whether more came up meanwhile or not', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    expect(hold.decide(VIP, { wanted: 3, up: 1, riseMs }, 0)).toMatchObject({ over: false });
    // A second up does not start the wait again: in an outage every LB withdrew, the VIP is nowhere
    // meanwhile (8 reals restarted 4 s apart held it 28 s that way).
    expect(hold.decide(VIP, { wanted: 3, up: 2, riseMs }, 6_000)).toMatchObject({ over: false });
    expect(hold.decide(VIP, { wanted: 3, up: 2, riseMs }, 6_999)).toMatchObject({ over: false });
    expect(hold.decide(VIP, { wanted: 3, up: 2, riseMs }, 7_000)).toEqual({ over: true, waitedMs: 7_000, notUp: 1 });
  });

  it('starts again when the VIP loses its reals while held, and waits at most the cap however slow the check', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    expect(hold.decide(VIP, { wanted: 20, up: 1, riseMs }, 0)).toMatchObject({ over: false });
    // Out again before it went back: the wait begins again when a real is back again.
    hold.hold(VIP);
    expect(hold.isWaiting(VIP)).toBe(false);
    expect(hold.decide(VIP, { wanted: 20, up: 1, riseMs: 120_000 }, 5_000)).toEqual({ over: false, began: true });
    expect(hold.decide(VIP, { wanted: 20, up: 1, riseMs: 120_000 }, 34_999)).toMatchObject({ over: false });
    expect(hold.decide(VIP, { wanted: 20, up: 1, riseMs: 120_000 }, 35_000)).toEqual({ over: true, waitedMs: RECOVERY_CAP_MS, notUp: 19 });
  });

  it('forgets a key on request (the operator took the reals out: nothing to wait for)', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    hold.forget(VIP);
    expect(hold.isHeld(VIP)).toBe(false);
    expect(hold.decide(VIP, { wanted: 3, up: 1, riseMs }, 0)).toEqual({ over: true, waitedMs: 0, notUp: 0 });
  });

  it('holds no longer than its reals need where none has a health check (riseMs 0)', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    expect(hold.decide(VIP, { wanted: 2, up: 1, riseMs: 0 }, 100)).toMatchObject({ over: true });
  });

  it('forgets keys a reload removed', () => {
    const hold = new RecoveryHold();
    hold.hold(VIP);
    hold.hold('10.93.0.101');
    hold.keepOnly(new Set(['10.93.0.101']));
    expect(hold.isHeld(VIP)).toBe(false);
    expect(hold.isHeld('10.93.0.101')).toBe(true);
  });
});
