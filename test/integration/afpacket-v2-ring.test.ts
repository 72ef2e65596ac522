// The `ring: v2` RX ring handed back whole: a walk over every slot ends where it began, and the
// ring must still be given back (it stalled for good, and every wake-up replayed the same frames to
// the engine). And a frame too large for its slot, read whole from the socket queue, keeps its VLAN
// tag. A veth pair in a namespace of our own; needs root, fails loudly otherwise.

import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { requireRoot } from '../support/lab-daemon.js';

const run = promisify(execFile);
const NS = `dsrt-v2r-${process.pid}`;
const SCRIPT = join(import.meta.dirname, '..', 'support', 'v2-ring-walk.mjs');
const VLAN_COPY_SCRIPT = join(import.meta.dirname, '..', 'support', 'v2-ring-vlan-copy.mjs');

interface Phase {
  phase: string;
  batches: number;
  frames: number;
  rxOtherHost: number;
}

async function walk(mode: 'full' | 'otherhost'): Promise<Phase[]> {
  const { stdout } = await run('ip', ['netns', 'exec', NS, process.execPath, SCRIPT, mode], { timeout: 30_000 });
  return stdout.trim().split('\n').map((l) => JSON.parse(l) as Phase);
}

beforeAll(async () => {
  requireRoot();
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
  await run('ip', ['netns', 'add', NS]);
  await run('ip', ['-n', NS, 'link', 'add', 'veth0', 'type', 'veth', 'peer', 'name', 'veth1']);
  // No IPv6 on the pair: no router solicitations in the ring while the test counts.
  await run('ip', ['netns', 'exec', NS, 'sysctl', '-q', '-w', 'net.ipv6.conf.all.disable_ipv6=1']);
  for (const dev of ['lo', 'veth0', 'veth1']) await run('ip', ['-n', NS, 'link', 'set', dev, 'up']);
});

afterAll(async () => {
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
});

describe('ring: v2, a wake-up that walks the whole ring', () => {
  it('gives a full ring back: the frames it held are seen once, and later frames arrive', async () => {
    const [filled, after] = await walk('full');
    // 4 slots, 8 frames sent: the ring holds what fits (the kernel drops the rest), seen once.
    expect(filled!.frames).toBeGreaterThan(0);
    expect(filled!.frames).toBeLessThanOrEqual(8);
    expect(filled!.batches).toBeLessThan(20);
    expect(after!.frames - filled!.frames).toBe(4);
  });

  it('gives back a ring full of frames for other hosts: each is counted once, and later frames arrive', async () => {
    const [filled, after] = await walk('otherhost');
    expect(filled!.rxOtherHost).toBeGreaterThan(0);
    expect(filled!.rxOtherHost).toBeLessThanOrEqual(9000);
    expect(after!.rxOtherHost).toBe(filled!.rxOtherHost);
    expect(after!.frames - filled!.frames).toBe(4);
  });

  it('puts back the VLAN tag of a frame too large for its slot (read whole from the socket queue)', async () => {
    const { stdout } = await run('ip', ['netns', 'exec', NS, process.execPath, VLAN_COPY_SCRIPT], { timeout: 30_000 });
    const report = JSON.parse(stdout.trim()) as { seen: { length: number; tpid: number; tci: number; ethertype: number }[]; copied: number };
    expect(report.copied).toBe(1);
    expect(report.seen).toEqual([{ length: 4000, tpid: 0x8100, tci: 100, ethertype: 0x88b5 }]);
  });
});
