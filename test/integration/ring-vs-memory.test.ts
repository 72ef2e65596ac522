// The native RX ring path and the in-memory path produce byte-identical output for the same input
// frames: the same engine, config and real MACs run once behind AfPacketIo on a veth in a
// namespace (frames sent by a raw socket, output captured by tcpdump) and once behind MemoryIo.

import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { promisify } from 'node:util';
import { parseConfigText } from '../../src/config/validate.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { parseMac } from '../../src/control/addresses.js';
import { Engine } from '../../src/dataplane/engine.js';
import { createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { ROOT, requireRoot, sleep } from '../support/lab-daemon.js';
import { ETH_IPV4, ethernet, hex, ipv4, tcp, udp } from '../support/packet-builder.js';

const run = promisify(execFile);
const P = `dsrt-rm-${process.pid}-`;
const A = `${P}a`;
const F = `${P}f`;
const VIP = '10.88.0.100';
const CLIENT = '10.88.0.10';
const MACS: Record<string, string> = { '10.88.0.11': '02:00:00:00:aa:11', '10.88.0.12': '02:00:00:00:aa:12', '10.88.0.13': '02:00:00:00:aa:13' };
const CONFIG = `
interface: f0
tunnel: { sourceV4: 10.88.0.2 }
services:
  - name: web
    vip: ${VIP}
    port: 80
    protocol: tcp
    reals:
      - address: 10.88.0.11
      - address: 10.88.0.12
  - name: dns
    vip: ${VIP}
    port: 53
    protocol: udp
    forwarding: ipip
    reals:
      - address: 10.88.0.13
`;

let forwarder: ChildProcess | null = null;
let dir: string;
let fMac: string;
let aMac: string;

async function sh(...argv: string[]): Promise<string> {
  return (await run(argv[0]!, argv.slice(1))).stdout;
}

/** The frames as the engine sees them: TCP and UDP from many ports, one VLAN-tagged, one not for us. */
function inputFrames(): Uint8Array[] {
  const frames: Uint8Array[] = [];
  for (let i = 0; i < 40; i++) {
    const sport = 20000 + i * 7;
    const flags = i % 3 === 0 ? 0x02 : 0x10;
    frames.push(ethernet({ dst: fMac, src: aMac, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 6, id: i, df: true }, tcp({ sport, dport: 80, flags, seq: i * 1000 }, new Uint8Array(i * 13).fill(i), { src: CLIENT, dst: VIP }))));
  }
  for (let i = 0; i < 10; i++) {
    frames.push(ethernet({ dst: fMac, src: aMac, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 100 + i }, udp({ sport: 5000 + i, dport: 53 }, new Uint8Array(30 + i).fill(0x5a), { src: CLIENT, dst: VIP }))));
  }
  frames.push(ethernet({ dst: fMac, src: aMac, type: ETH_IPV4, vlan: 0x0064 }, ipv4({ src: CLIENT, dst: VIP, proto: 6 }, tcp({ sport: 31000, dport: 80, flags: 0x02 }, [], { src: CLIENT, dst: VIP }))));
  return frames;
}

function memoryOutput(frames: readonly Uint8Array[]): Uint8Array[] {
  const parsed = parseConfigText(CONFIG);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  const engine = new Engine({
    flowCapacity: 4096,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters: createCounters(),
    localMac: parseMac(fMac),
    mtu: 1500,
    fragmentIdStart: 1, // as the forwarder process: the same outer ids on both paths
  });
  let id = 0;
  const views: ServiceView[] = parsed.config.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) => ({ id: id++, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: parseMac(MACS[r.address]!) })),
  }));
  engine.setSnapshot(new SnapshotBuilder().build(views, parsed.config.hashSeed, MAX_REAL_IDS, { v4: '10.88.0.2', v6: null }).snapshot);
  const io = new MemoryIo({ localMac: parseMac(fMac) });
  io.start((b) => engine.processBatch(b, 1_000_000));
  const out: Uint8Array[] = [];
  for (const f of frames) out.push(...io.inject([f]));
  return out;
}

/** Records of a classic little-endian pcap file. */
function pcapRecords(file: Buffer): Uint8Array[] {
  const out: Uint8Array[] = [];
  let off = 24;
  while (off + 16 <= file.length) {
    const caplen = file.readUInt32LE(off + 8);
    out.push(Uint8Array.from(file.subarray(off + 16, off + 16 + caplen)));
    off += 16 + caplen;
  }
  return out;
}

beforeAll(async () => {
  requireRoot();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-rm-'));
  for (const ns of [A, F]) await run('ip', ['netns', 'del', ns]).catch(() => undefined);
  await sh('ip', 'netns', 'add', A);
  await sh('ip', 'netns', 'add', F);
  await sh('ip', '-n', A, 'link', 'add', 'a0', 'type', 'veth', 'peer', 'name', 'f0', 'netns', F);
  await sh('ip', '-n', A, 'link', 'set', 'a0', 'up');
  await sh('ip', '-n', F, 'link', 'set', 'f0', 'up');
  await sh('ip', '-n', F, 'addr', 'add', '10.88.0.2/24', 'dev', 'f0');
  aMac = (await sh('ip', 'netns', 'exec', A, 'cat', '/sys/class/net/a0/address')).trim();
  fMac = (await sh('ip', 'netns', 'exec', F, 'cat', '/sys/class/net/f0/address')).trim();
}, 60_000);

afterAll(async () => {
  forwarder?.kill('SIGTERM');
  for (const ns of [A, F]) await run('ip', ['netns', 'del', ns]).catch(() => undefined);
});

interface RingCase {
  ringVersion: 2 | 3;
  /** Seconds between two sent frames (0: one burst). */
  gapS: number;
  blockSizeBytes?: number;
  batchCapacity?: number;
}

// One frame at a time, so the ring sees them in order in one or more blocks; and for V3 a burst into
// 4 KiB blocks read in batches of 3, so that a wake-up finds several blocks whose frames share
// batches, and a full batch is sent (and the blocks before it released) in the middle of a block.
describe.each<[string, RingCase]>([
  ['TPACKET_V2', { ringVersion: 2, gapS: 0.002 }],
  ['TPACKET_V3', { ringVersion: 3, gapS: 0.002 }],
  ['TPACKET_V3, a burst over 4 KiB blocks, batches of 3', { ringVersion: 3, gapS: 0, blockSizeBytes: 4096, batchCapacity: 3 }],
])('ring path (%s) vs in-memory path', (_name, ringCase) => {
  it('produce byte-identical output frames for the same input frames', async () => {
    const { ringVersion, gapS, blockSizeBytes, batchCapacity } = ringCase;
    const frames = inputFrames();
    forwarder = spawn('ip', ['netns', 'exec', F, process.execPath, join(ROOT, 'test/support/ring-forwarder.mjs'), JSON.stringify({ ifname: 'f0', config: CONFIG, macs: MACS, tunnelV4: '10.88.0.2', ringVersion, blockSizeBytes, batchCapacity })], { stdio: ['ignore', 'pipe', 'inherit'] });
    const lines: string[] = [];
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: forwarder!.stdout! }).on('line', (l) => {
        lines.push(l);
        if (l.includes('"ready"')) resolve();
      });
      forwarder!.once('exit', (c) => reject(new Error(`ring forwarder exited ${c}`)));
    });
    const pcap = join(dir, `out-v${ringVersion}.pcap`);
    // A burst of 51 frames overran tcpdump's default buffer in immediate mode ("8 packets dropped by
    // kernel", the forwarder having sent all 51): 8 MiB holds any of these runs.
    const capture = spawn('ip', ['netns', 'exec', A, 'tcpdump', '-i', 'a0', '-nn', '-U', '--immediate-mode', '-B', '8192', '-w', pcap, 'ether', 'src', fMac], { stdio: 'ignore' });
    await sleep(1000);
    const send = spawn('ip', ['netns', 'exec', A, 'python3', '-c', `import socket,sys,time\ns=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('a0',0))\nfor l in sys.stdin.read().split():\n  s.send(bytes.fromhex(l))\n  if ${gapS} > 0: time.sleep(${gapS})\n`], { stdio: ['pipe', 'inherit', 'inherit'] });
    send.stdin!.end(frames.map((f) => hex(f)).join('\n') + '\n');
    await new Promise((r) => send.once('exit', r));
    await sleep(1000);
    capture.kill('SIGTERM');
    await new Promise((r) => capture.once('exit', r));
    // ARP or IPv6 housekeeping from F's kernel is not the engine's output.
    const ring = pcapRecords(await readFile(pcap)).filter((f) => f[12] === 0x08 && f[13] === 0x00 || f[12] === 0x81);
    const memory = memoryOutput(frames);
    expect(memory.length).toBe(frames.length);
    forwarder.kill('SIGTERM');
    await new Promise((r) => forwarder!.once('exit', r));
    forwarder = null;
    // What the forwarder sent, apart from what the capture saw: all of it, nothing refused.
    const stats = JSON.parse(lines.find((l) => l.includes('"stats"')) ?? '{}').stats;
    expect(stats).toMatchObject({ txFrames: memory.length, txRefused: 0, txErrors: 0, rxKernelDrops: 0 });
    expect(ring.map(hex)).toEqual(memory.map(hex));
  }, 60_000);
});
