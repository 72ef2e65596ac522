// singleFlight: calls while a run is in flight share it (its answer or its error); nothing is kept
// after it settles, so the next call runs again.

import { describe, expect, it } from 'vitest';
import { singleFlight } from '../../src/control/http-single-flight.js';

/** A run the test settles by hand, and the runs started so far. */
function manualRuns<T>(): { run: () => Promise<T>; settle: { resolve: (v: T) => void; reject: (e: Error) => void }[] } {
  const settle: { resolve: (v: T) => void; reject: (e: Error) => void }[] = [];
  const run = (): Promise<T> => new Promise<T>((resolve, reject) => settle.push({ resolve, reject }));
  return { run, settle };
}

describe('singleFlight', () => {
  it('gives calls while a run is in flight that run\'s answer, and a call after it settled a new run', async () => {
    const { run, settle } = manualRuns<string>();
    const ask = singleFlight(run);
    const a = ask();
    const b = ask();
    expect(b).toBe(a);
    expect(settle).toHaveLength(1);
    settle[0]!.resolve('first');
    expect(await Promise.all([a, b])).toEqual(['first', 'first']);
    const c = ask();
    expect(settle).toHaveLength(2);
    settle[1]!.resolve('second');
    expect(await c).toBe('second');
  });

  it('gives every caller of a failed run its error, and runs again on the next call', async () => {
    const { run, settle } = manualRuns<string>();
    const ask = singleFlight(run);
    const a = ask();
    const b = ask();
    settle[0]!.reject(new Error('render failed'));
    await expect(a).rejects.toThrow('render failed');
    await expect(b).rejects.toThrow('render failed');
    const c = ask();
    expect(settle).toHaveLength(2);
    settle[1]!.resolve('ok');
    expect(await c).toBe('ok');
  });

  it('starts a new run for a caller that asks again as soon as the answer arrives (nothing is kept)', async () => {
    const { run, settle } = manualRuns<number>();
    const ask = singleFlight(run);
    const again = ask().then(() => ask());
    settle[0]!.resolve(1);
    await new Promise((r) => setImmediate(r));
    expect(settle).toHaveLength(2);
    settle[1]!.resolve(2);
    expect(await again).toBe(2);
  });

  it('turns a run that throws before its promise into a rejection, and keeps nothing in flight', async () => {
    let calls = 0;
    const ask = singleFlight((): Promise<number> => {
      calls++;
      if (calls === 1) throw new Error('thrown at once');
      return Promise.resolve(calls);
    });
    await expect(ask()).rejects.toThrow('thrown at once');
    expect(await ask()).toBe(2);
  });
});
