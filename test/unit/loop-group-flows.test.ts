// LoopGroup.flowsNow (dsrlb flows): a flow two loops hold (a hand-over's grace copy, a UDP flow whose
// fragments the fanout hash gave to the other loop) is listed once and counted once; a walk-through
// saw "50 of 81 flows shown (--limit 0 lists them all)" for 50 flows under --limit 0.

import { describe, expect, it } from 'vitest';
import { LoopGroup } from '../../src/control/loop-group.js';
import { formatFlows } from '../../src/cli/flows-table.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { FlowState, FlowTable, type FlowTimeouts } from '../../src/dataplane/flow-table.js';
import { monotonicMs } from '../../src/dataplane/monotonic-clock.js';

const TIMEOUTS: FlowTimeouts = { synMs: 10_000, establishedMs: 900_000, finMs: 30_000, closeMs: 5_000, udpMs: 300_000 };

function put(t: FlowTable, id: number): void {
  const k = new Uint32Array(FLOW_KEY_WORDS);
  k[0] = 17 | (4 << 8);
  k[1] = (0x0a000000 | id) >>> 0;
  k[5] = 0xcb00710a;
  k[9] = ((40000 + id) << 16) | 53;
  t.key.set(k);
  t.insert(t.indexHash(), 1, FlowState.udp, monotonicMs());
}

describe('LoopGroup.flowsNow', () => {
  const a = new FlowTable(1_000, TIMEOUTS, 8, 1);
  const b = new FlowTable(1_000, TIMEOUTS, 8, 2);
  for (let id = 0; id < 50; id++) put(a, id);
  // The other loop holds 31 of them too (their fragments), and 5 of its own.
  for (let id = 0; id < 31; id++) put(b, id);
  for (let id = 100; id < 105; id++) put(b, id);
  const group = { loops: [a, b].map((t) => ({ running: true, flowRecords: t.records, settings: { timeouts: TIMEOUTS } })), lastTimeouts: TIMEOUTS };
  const flowsNow = (limit: number) => LoopGroup.prototype.flowsNow.call(group as unknown as LoopGroup, null, limit);

  it('counts a flow two loops hold once when every match was read', () => {
    const all = flowsNow(1_000_000);
    expect(all.batch.count).toBe(55);
    expect(all.matched).toBe(55);
  });

  it("gives the loops' sum when a limit cut the reading (all there is then), and the footer says how to see all", () => {
    const cut = flowsNow(10);
    expect(cut.matched).toBe(86);
    expect(cut.batch.count).toBeLessThanOrEqual(20);
    const row = { protocol: 'udp', client: '10.0.0.1:40000', vip: '203.0.113.10:53', service: 'dns', real: '10.1.0.1', state: 'udp', idleMs: 0, expiresInMs: 1000 };
    expect(formatFlows({ total: 55, flows: [row] }, true).trim().split('\n').pop()).toBe('1 of 55 flows shown (--limit 0 lists them all)');
    // With --limit 0 the hint would tell to pass what was passed: the cap is said instead.
    expect(formatFlows({ total: 1_200_000, flows: [row] }, false).trim().split('\n').pop()).toBe('1 of 1200000 flows shown (1,000,000 at most: narrow by --real or --client)');
  });
});
