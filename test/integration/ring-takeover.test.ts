// A ring socket taken over (AfPacketIo keepSocket / keptSocket), as a packet loop started again
// after a crash takes over the socket of the loop it replaces: the frames that arrived while no one
// read the ring are the first the new AfPacketIo reads, in order, after a first reader that went
// round the ring many times, and none of the frames the first one read come again. A socket whose
// interface was deleted and made again is refused (ENODEV), the kept descriptor left to its holder. Needs root
// (packet sockets; a network namespace for the second); frames go only to lo, to a documentation
// address nothing listens on.
import { execFileSync } from 'node:child_process';
import { closeSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { requireRoot, sleep } from '../support/lab-daemon.js';
import { ethernet, ipv4, udp } from '../support/packet-builder.js';

const { AfPacketIo } = (await import(new URL('../../dist/io/afpacket-io.js', import.meta.url).href)) as typeof import('../../src/io/afpacket-io.js');
type PacketBatch = import('../../src/io/packet-io.js').PacketBatch;
type AfPacketIo = import('../../src/io/afpacket-io.js').AfPacketIo;

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const TARGET = '203.0.113.77';
const PORT = 9999;
const BLOCKS = 16;

/** Marker datagram `seq` (its number in the payload) to TARGET:PORT, addressed to lo's MAC. */
function marker(seq: number): Uint8Array {
  const payload = [seq >>> 24, (seq >>> 16) & 255, (seq >>> 8) & 255, seq & 255];
  return ethernet({ dst: '00:00:00:00:00:00', src: '02:00:00:00:0b:99', type: 0x0800 }, ipv4({ src: '10.9.200.1', dst: TARGET, proto: 17 }, udp({ sport: 40000, dport: PORT }, payload, { src: '10.9.200.1', dst: TARGET })));
}

/** The marker numbers of a batch's frames, in order. */
function markersOf(batch: PacketBatch, out: number[]): void {
  const b = batch.buf;
  for (let i = 0; i < batch.count; i++) {
    const at = batch.offsets[i]!;
    if (batch.lengths[i]! < 46 || b[at + 12] !== 0x08 || b[at + 13] !== 0x00) continue;
    if (b[at + 30] !== 203 || b[at + 31] !== 0 || b[at + 32] !== 113 || b[at + 33] !== 77) continue;
    if (((b[at + 36]! << 8) | b[at + 37]!) !== PORT) continue;
    out.push(((b[at + 42]! << 24) | (b[at + 43]! << 16) | (b[at + 44]! << 8) | b[at + 45]!) >>> 0);
  }
}

/** Sends marker `seq` out of lo through `io` (its frames start with a zero virtio_net_hdr). */
function send(io: AfPacketIo, seq: number): void {
  const f = marker(seq);
  const buf = new Uint8Array(10 + f.length);
  buf.set(f, 10);
  expect(io.sendFrames(buf, Int32Array.of(0), Int32Array.of(buf.length), 1)).toBe(1);
}

describe('a ring socket taken over', () => {
  it('gives the new reader the frames that arrived meanwhile, in order, none the first one read', async () => {
    requireRoot();
    const sender = AfPacketIo.open({ interface: 'lo', blockCount: 2 });
    const first = AfPacketIo.open({ interface: 'lo', blockCount: BLOCKS });
    let second: AfPacketIo | null = null;
    try {
      const seenFirst: number[] = [];
      first.start((batch) => markersOf(batch, seenFirst));
      // One marker per retired block (1 ms): the first reader goes round its ring several times.
      const before = 4 * BLOCKS + 5;
      for (let seq = 0; seq < before; seq++) {
        send(sender, seq);
        await sleep(3);
      }
      for (let i = 0; i < 100 && seenFirst.length < before; i++) await sleep(10);
      expect(seenFirst).toEqual(Array.from({ length: before }, (_, k) => k));
      expect(first.stats().rxBlocks).toBeGreaterThan(BLOCKS);
      const fd = first.keepSocket();
      first.close();
      // Nobody reads the ring now: these wait in it (fewer blocks than the ring has).
      const gap = Array.from({ length: BLOCKS / 2 }, (_, k) => before + k);
      for (const seq of gap) {
        send(sender, seq);
        await sleep(3);
      }
      second = AfPacketIo.open({ interface: 'lo', blockCount: BLOCKS, keptSocket: { fd, fanoutGroupId: null } });
      // The second reader has a copy of its own: the kept descriptor can go.
      closeSync(fd);
      const seenSecond: number[] = [];
      second.start((batch) => markersOf(batch, seenSecond));
      const after = before + gap.length;
      send(sender, after);
      for (let i = 0; i < 100 && seenSecond.length < gap.length + 1; i++) await sleep(10);
      expect(seenSecond).toEqual([...gap, after]);
      expect(second.stats().rxKernelDrops).toBe(0);
    } finally {
      second?.close();
      first.close();
      sender.close();
    }
  });

  it('is refused (ENODEV) once its interface was deleted and made again; the kept descriptor stays its holder\'s', () => {
    requireRoot();
    const ns = `dsrt-take-${process.pid}`;
    execFileSync('ip', ['netns', 'add', ns]);
    try {
      execFileSync('ip', ['-n', ns, 'link', 'add', 'k0', 'type', 'veth', 'peer', 'name', 'k0-p']);
      execFileSync('ip', ['-n', ns, 'link', 'set', 'k0', 'up']);
      execFileSync('ip', ['-n', ns, 'link', 'set', 'k0-p', 'up']);
      const out = execFileSync('ip', ['netns', 'exec', ns, process.execPath, join(ROOT, 'test/support/ring-takeover-remade.mjs'), 'k0'], { encoding: 'utf8' });
      expect(JSON.parse(out.trim().split('\n').pop()!)).toEqual({ code: 'ENODEV', keptOpen: true });
    } finally {
      execFileSync('ip', ['netns', 'del', ns]);
    }
  });
});
