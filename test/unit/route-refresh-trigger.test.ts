// RouteRefreshTrigger: a router's too-big errors about IPIP tunnels have the daemon ask the routes
// again soon, at most once a second, never while a refresh runs or before start, never after stop;
// and only a too-big error (EMSGSIZE) of a path-MTU socket counts.
import { constants } from 'node:os';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { onTooBigOnly } from '../../src/control/path-mtu-sockets.js';
import { RouteRefreshTrigger } from '../../src/control/route-refresh-trigger.js';

beforeEach(() => void vi.useFakeTimers());
afterEach(() => void vi.useRealTimers());

function trigger() {
  const refreshes: { atMs: number; reals: readonly string[] }[] = [];
  const state = { ready: true };
  const t = new RouteRefreshTrigger({ ready: () => state.ready, refresh: (reals) => void refreshes.push({ atMs: Date.now(), reals }), now: () => Date.now() });
  return { t, refreshes, state, start: Date.now() };
}

describe('RouteRefreshTrigger', () => {
  it('asks once 50 ms after a burst, naming every real of it once', () => {
    const f = trigger();
    f.t.tooBig('192.0.2.1');
    f.t.tooBig('192.0.2.2');
    f.t.tooBig('192.0.2.1');
    vi.advanceTimersByTime(49);
    expect(f.refreshes).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(f.refreshes).toEqual([{ atMs: f.start + 50, reals: ['192.0.2.1', '192.0.2.2'] }]);
    vi.advanceTimersByTime(5000);
    expect(f.refreshes).toHaveLength(1);
  });

  it('asks at most once a second under a flood of errors', () => {
    const f = trigger();
    for (let ms = 0; ms < 3000; ms += 10) {
      f.t.tooBig('192.0.2.1');
      vi.advanceTimersByTime(10);
    }
    vi.advanceTimersByTime(2000);
    expect(f.refreshes.map((r) => r.atMs - f.start)).toEqual([50, 1050, 2050, 3050]);
  });

  it('waits while a refresh runs or the daemon starts, then asks once', () => {
    const f = trigger();
    f.state.ready = false;
    f.t.tooBig('192.0.2.1');
    vi.advanceTimersByTime(2000);
    expect(f.refreshes).toEqual([]);
    f.t.tooBig('192.0.2.3');
    f.state.ready = true;
    vi.advanceTimersByTime(50);
    expect(f.refreshes).toEqual([{ atMs: expect.any(Number), reals: ['192.0.2.1', '192.0.2.3'] }]);
    expect(f.refreshes[0]!.atMs - f.start).toBeLessThanOrEqual(2050);
  });

  it('asks nothing after stop, for errors before it or after', () => {
    const f = trigger();
    f.t.tooBig('192.0.2.1');
    f.t.stop();
    f.t.tooBig('192.0.2.2');
    vi.advanceTimersByTime(5000);
    expect(f.refreshes).toEqual([]);
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe("a path-MTU socket's errors", () => {
  it('count only when the kernel reports a too-big error (EMSGSIZE), not unreachable and the like', () => {
    let told = 0;
    const onError = onTooBigOnly(() => void told++);
    for (const errno of [constants.errno.EHOSTUNREACH, constants.errno.ENETUNREACH, constants.errno.ECONNREFUSED, constants.errno.EPROTO, 0]) onError(errno);
    expect(told).toBe(0);
    onError(constants.errno.EMSGSIZE);
    expect(told).toBe(1);
  });
});
