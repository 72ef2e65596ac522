// /plan-input's live flows: keys and reals as base64 words, the reals once each. As one JSON object
// per flow the answer took 270 bytes a flow and outgrew V8's largest string near 2M flows.

import { describe, expect, it } from 'vitest';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { decodeLiveFlows, encodeLiveFlows } from '../../src/sim/live-flows-wire.js';

describe('live flows on the wire', () => {
  it('round-trips keys and reals, and costs under 60 bytes of JSON a flow', () => {
    const count = 100_000;
    const keys = new Uint32Array(count * FLOW_KEY_WORDS);
    for (let i = 0; i < keys.length; i++) keys[i] = (Math.imul(i, 2654435761) ^ (i >>> 3)) >>> 0;
    const realIndex = new Int32Array(count).map((_, i) => i % 3);
    const reals = [
      { identity: 'tcp|10.0.0.100|80', address: '10.0.1.1' },
      { identity: 'tcp|10.0.0.100|80', address: '10.0.1.2' },
      { identity: 'udp|[fd00::100]|53', address: 'fd00::1:3' },
    ];
    const text = JSON.stringify(encodeLiveFlows(keys, realIndex, reals));
    expect(text.length / count).toBeLessThan(60);
    const back = decodeLiveFlows(JSON.parse(text));
    expect(back.keys).toEqual(keys);
    expect(back.realIndex).toEqual(realIndex);
    expect(back.reals).toEqual(reals);
    // Views into a larger buffer (what the daemon sends) encode only their part.
    const part = encodeLiveFlows(keys.subarray(FLOW_KEY_WORDS, 3 * FLOW_KEY_WORDS), realIndex.subarray(1, 3), reals);
    expect(decodeLiveFlows(part).keys).toEqual(keys.subarray(FLOW_KEY_WORDS, 3 * FLOW_KEY_WORDS));
    expect(decodeLiveFlows(part).realIndex).toEqual(Int32Array.from([1, 2]));
  });

  it('reads what a daemon before this format sent (not yet restarted after an upgrade), says when the answer was cut, refuses other shapes', () => {
    const old = { keys: Array.from({ length: 20 }, (_, i) => i), reals: [{ identity: 'a', address: '10.0.0.1' }, { identity: 'a', address: '10.0.0.2' }] };
    const back = decodeLiveFlows(old);
    expect(back.keys).toEqual(Uint32Array.from(old.keys));
    expect(back.realIndex).toEqual(Int32Array.from([0, 1]));
    expect(back.cut).toBe(false);
    expect(decodeLiveFlows(encodeLiveFlows(new Uint32Array(FLOW_KEY_WORDS), new Int32Array(1), [], true)).cut).toBe(true);
    expect(() => decodeLiveFlows({ keys: [1, 2], reals: [] } as never)).toThrow(/not the format this dsrlb reads/);
    const wire = encodeLiveFlows(new Uint32Array(2 * FLOW_KEY_WORDS), new Int32Array(2), []);
    expect(() => decodeLiveFlows({ ...wire, count: 3 })).toThrow(/keys holds 80 bytes, not 120/);
  });
});
