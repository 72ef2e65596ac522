// The packet loop's housekeeping around its I/O, with an in-memory I/O standing in for the ring:
// frames the kernel refused to send are counted as dropped (tx_failed), frames the capture cut
// short as capture_truncated, and an interface that is
// gone or made again ends the loop with an error (a packet socket stays bound to the old index and
// receives nothing for good) instead of leaving it running deaf.

import { afterEach, describe, expect, it } from 'vitest';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { LoopRunner, type LoopEvent, type LoopSettings } from '../../src/dataplane/loop-runner.js';
import { MemoryIo } from '../../src/io/memory-io.js';

class FakeIo extends MemoryIo {
  txErrors = 0;
  rxTruncated = 0;
  lost: string | null = null;
  closed = false;
  constructor() {
    super({ localMac: Uint8Array.from([2, 0, 0, 0, 0, 1]) });
  }
  override stats() {
    return { ...super.stats(), txErrors: this.txErrors, rxTruncated: this.rxTruncated };
  }
  interfaceLost(): string | null {
    return this.lost;
  }
  override close(): void {
    this.closed = true;
    super.close();
  }
}

const runners: LoopRunner[] = [];
afterEach(() => {
  for (const r of runners.splice(0)) r.handle({ type: 'stop' });
});

async function started(): Promise<{ io: FakeIo; counters: Float64Array; events: LoopEvent[] }> {
  const io = new FakeIo();
  const counters = createCounters();
  const settings: LoopSettings = {
    io: 'afpacket',
    ring: 'v3',
    interface: 'eth0',
    flowCapacity: 1024,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters,
    fanout: { mode: 'none' },
    cpu: null,
  };
  const events: LoopEvent[] = [];
  const runner = new LoopRunner(settings, (e) => events.push(e), async () => io);
  runners.push(runner);
  expect(await runner.start()).toBe(true);
  expect(events.map((e) => e.type)).toEqual(['ready']);
  return { io, counters, events };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('LoopRunner housekeeping', () => {
  it('counts frames the kernel refused to send as dropped with reason tx_failed', async () => {
    const { io, counters } = await started();
    io.txErrors = 7;
    await sleep(250);
    expect(counters[Counter.dropBase + DropReason.txFailed]).toBe(7);
  });

  it('counts frames the capture cut short (never shown to the engine) as dropped with reason capture_truncated', async () => {
    const { io, counters } = await started();
    await sleep(150);
    expect(counters[Counter.dropBase + DropReason.captureTruncated]).toBe(0);
    io.rxTruncated = 3;
    await sleep(250);
    expect(counters[Counter.dropBase + DropReason.captureTruncated]).toBe(3);
  });

  it('ends the loop with an error, its socket closed, once its interface is gone or made again', async () => {
    const { io, events } = await started();
    await sleep(300);
    expect(events.map((e) => e.type)).toEqual(['ready']);
    io.lost = 'eth0 was made again (index 2 -> 7): the socket still listens on the old one';
    await sleep(1200); // checked once a second
    expect(events.at(-1)).toEqual({ type: 'error', code: 'EINTERFACE', message: 'eth0 was made again (index 2 -> 7): the socket still listens on the old one' });
    expect(io.closed).toBe(true);
    // It stopped: no second error a second later.
    await sleep(1100);
    expect(events.filter((e) => e.type === 'error')).toHaveLength(1);
  });
});
