// The paths of the packet engine that test/unit/engine-no-alloc.test.ts measures for allocation
// (through engine-alloc-harness.ts, in a child process): one engine and one batch of frames per
// path, each made to take one branch (a forwarding mode, a scheduler, a TCP state change, a drop
// reason, a too-big answer, GSO...) and checked after its rounds by the verdict of every frame
// and a counter, so that a path that stopped taking its branch is an error, not a pass.
//
// Values are what production sees, not what is easy: a hash seed, outer fragment ids, IPv6
// fragment ids, addresses and sequence numbers of 2^31 and more (a uint32 that does not fit an
// int32 is a heap number wherever it is boxed), and a clock in fractional milliseconds.

import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { Engine, type EngineOptions } from '../../src/dataplane/engine.js';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import type { FlowTimeouts } from '../../src/dataplane/flow-table.js';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import { createPacketBatch, FRAME_CSUM_PARTIAL, FRAME_GSO, FRAME_HAS_VNET_HDR, VERDICT_CONSUMED, VERDICT_PASS, VERDICT_TX, VNET_HDR_LEN, type PacketBatch } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type RealView, type ServiceView, type TunnelSources } from '../../src/control/snapshot-builder.js';
import { parseMac } from '../../src/control/addresses.js';
import { ETH_ARP, ETH_IPV4, ETH_IPV6, ethernet, icmp, icmpEcho, icmpv6, ipv4, ipv6, ipv6Fragment, ipv6Options, refreshIpv4Checksum, tcp, udp } from './packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const VIP = '10.0.0.100';
const VIP_DROP = '10.0.0.101';
const VIP6 = 'fd00::100';
const CLIENT = '192.0.2.7';
const CLIENT6 = 'fd00:db8::7';
const SYN = 0x02;
const ACK = 0x10;
const FIN = 0x01;
const RST = 0x04;
const PSH = 0x08;
const TIMEOUTS: FlowTimeouts = { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 };
const HEADROOM = 128;
/** A hash seed, an outer fragment id start, an IPv6 fragment id and a TCP sequence number, all >= 2^31. */
const HASH_SEED = 0xdeadbeef;
const FRAGMENT_ID_START = 0x9e3779b9;
const IPV6_FRAGMENT_ID = 0xc0de0000;
const TCP_SEQ = 0xfffff000;

function config(services: string[], top = ''): Config {
  const yaml = `interface: eth0\nhashSeed: ${HASH_SEED}\n${top}services:\n${services.map((s) => `  - { ${s.includes('rendezvous') ? '' : 'tableSize: 1021, '}${s} }`).join('\n')}\n`;
  const r = parseConfigText(yaml);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  return r.config;
}

const reals = (...addresses: string[]) => `reals: [${addresses.map((a) => `{ address: "${a}" }`).join(', ')}]`;

/** L2 services: one per scheduler and protocol, IPv6, one whose reals are all down (drop), one whose real has no MAC. */
const L2_CONFIG = config([
  `name: tcp-maglev, vip: ${VIP}, port: 80, protocol: tcp, ${reals('10.0.0.11', '10.0.0.12', '10.0.0.13')}`,
  `name: udp-maglev, vip: ${VIP}, port: 53, protocol: udp, ${reals('10.0.0.11', '10.0.0.12', '10.0.0.13')}`,
  `name: tcp-wlc, vip: ${VIP}, port: 81, protocol: tcp, scheduler: wlc, reals: [{ address: 10.0.0.11 }, { address: 10.0.0.12 }, { address: 10.0.0.13, weight: 50 }]`,
  `name: udp-wlc, vip: ${VIP}, port: 82, protocol: udp, scheduler: wlc, ${reals('10.0.0.11', '10.0.0.12')}`,
  `name: tcp-rendezvous, vip: ${VIP}, port: 83, protocol: tcp, scheduler: rendezvous, ${reals('10.0.0.11', '10.0.0.12', '10.0.0.13')}`,
  `name: udp-rendezvous, vip: ${VIP}, port: 84, protocol: udp, scheduler: rendezvous, ${reals('10.0.0.11', '10.0.0.12')}`,
  `name: udp-move, vip: ${VIP}, port: 85, protocol: udp, ${reals('10.0.0.21', '10.0.0.22')}`,
  `name: tcp-move, vip: ${VIP}, port: 86, protocol: tcp, ${reals('10.0.0.21', '10.0.0.22')}`,
  `name: udp6-any, vip: "${VIP6}", port: 0, protocol: udp, ${reals('fd00::11', 'fd00::12')}`,
  `name: tcp6, vip: "${VIP6}", port: 80, protocol: tcp, ${reals('fd00::11', 'fd00::12')}`,
  `name: dropping, vip: ${VIP_DROP}, port: 80, protocol: tcp, whenAllDown: drop, ${reals('10.0.0.31')}`,
  `name: unresolved, vip: ${VIP_DROP}, port: 81, protocol: tcp, ${reals('10.0.0.32')}`,
]);

/** IPIP services: 4in4 and 6in6 (a real is of its VIP's family). */
const IPIP_CONFIG = config(
  [
    `name: web, vip: ${VIP}, port: 80, protocol: tcp, forwarding: ipip, ${reals('10.1.0.11')}`,
    `name: dns, vip: ${VIP}, port: 53, protocol: udp, forwarding: ipip, ${reals('10.1.0.12')}`,
    `name: web6, vip: "${VIP6}", port: 80, protocol: tcp, forwarding: ipip, ${reals('fd01::11')}`,
    `name: quic6, vip: "${VIP6}", port: 443, protocol: udp, forwarding: ipip, ${reals('fd01::12')}`,
  ],
  'tunnel: { sourceV4: 10.0.0.2, sourceV6: "fd00::2" }\n',
);
const TUNNEL: TunnelSources = { v4: '10.0.0.2', v6: 'fd00::2' };

type Tweak = (r: RealView, service: string) => RealView;

/** The L2 services' standing: `dropping` all down; every other real up, its MAC known. */
const l2Base: Tweak = (r, s) => (s === 'dropping' ? { ...r, health: 'down' } : r);

/** A snapshot as the daemon builds it: ids in config order, MACs from the ids. */
function snapshotOf(cfg: Config, tweak: Tweak, tunnel?: TunnelSources, builder = new SnapshotBuilder()): ForwardingSnapshot {
  let id = 0;
  const views: ServiceView[] = cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) => {
      const realId = id++;
      const view: RealView = { id: realId, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: Uint8Array.of(2, 0, 0, 1, 0, realId) };
      return tweak(view, s.name);
    }),
  }));
  return builder.build(views, cfg.hashSeed, MAX_REAL_IDS, tunnel).snapshot;
}

let l2Snapshot: ForwardingSnapshot | null = null;
let ipipSnapshot: ForwardingSnapshot | null = null;
/** Snapshots are immutable: one of each is shared by the engines of the paths. */
const l2Snap = () => (l2Snapshot ??= snapshotOf(L2_CONFIG, l2Base));
const ipipSnap = () => (ipipSnapshot ??= snapshotOf(IPIP_CONFIG, (r) => r, TUNNEL));

interface Frame {
  bytes: Uint8Array;
  /** FRAME_* flags; with FRAME_HAS_VNET_HDR `bytes` starts with the 10-byte virtio_net_hdr. */
  flags?: number;
}

/** A batch of `frames` laid out as the backends lay them out: headroom, the virtio_net_hdr right before the frame. */
function layOut(frames: readonly Frame[]): PacketBatch {
  let largest = 64;
  for (const f of frames) largest = Math.max(largest, f.bytes.length);
  const slotBytes = HEADROOM + ((largest + 63) & ~63);
  const batch = createPacketBatch(frames.length);
  batch.buf = new Uint8Array(frames.length * slotBytes);
  batch.headroom = HEADROOM;
  batch.count = frames.length;
  frames.forEach((f, i) => {
    const flags = f.flags ?? 0;
    const vnet = (flags & FRAME_HAS_VNET_HDR) !== 0 ? VNET_HDR_LEN : 0;
    const off = i * slotBytes + HEADROOM;
    batch.buf.set(f.bytes, off - vnet);
    batch.offsets[i] = off;
    batch.lengths[i] = f.bytes.length - vnet;
    batch.flags[i] = flags;
  });
  return batch;
}

/**
 * One engine and one batch of frames laid out as the backends lay them out (headroom, the
 * virtio_net_hdr right before the frame), with a pristine copy of the batch memory that is put
 * back before each round: many paths rewrite their frames in place (encapsulation, echo replies,
 * fragments).
 */
class Rig {
  readonly engine: Engine;
  readonly counters: Float64Array;
  readonly batch: PacketBatch;
  readonly buf: Uint8Array;
  readonly pristine: Uint8Array;
  /** The loop's clock: [last time handed out, ms per round]; fractional, as LoopRunner's. */
  readonly clock = new Float64Array(2);
  /**
   * The times of the rounds to come, made before they run (prepare()): a double passed to a call
   * is a new heap number each time, which here would be the harness's allocation, not the
   * engine's. An array that also holds a string keeps them as the boxed numbers they are, and
   * hands each to processBatch as it is. (LoopRunner boxes its clock once per batch.)
   */
  private times: unknown[] = [];
  private next = 0;
  /** Run housekeeping after every batch (as the loop's timer does, between batches). */
  housekeeping = false;

  constructor(frames: readonly Frame[], snap: ForwardingSnapshot, opts: Partial<EngineOptions> = {}, extraVnetHdr = false) {
    this.counters = createCounters();
    this.engine = new Engine({ flowCapacity: 65_536, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS, counters: this.counters, localMac: parseMac(LB_MAC), fragmentIdStart: FRAGMENT_ID_START, ...opts });
    this.engine.setSnapshot(snap);
    this.batch = layOut(frames);
    this.batch.extraVnetHdr = extraVnetHdr;
    this.buf = this.batch.buf;
    this.pristine = Uint8Array.from(this.buf);
    this.clock[0] = 3_600_000.123; // an hour after boot
    this.clock[1] = 0.731; // per round
  }

  /** Runs `frames` through the engine once, before the rounds (flows that the path's frames then find). */
  prime(frames: readonly Frame[]): this {
    this.engine.processBatch(layOut(frames), this.clock[0]!);
    return this;
  }

  /** Times for `rounds` more rounds. */
  prepare(rounds: number): void {
    const times: unknown[] = ['clock'];
    const clock = this.clock;
    for (let r = 0; r < rounds; r++) times.push((clock[0] += clock[1]!));
    this.times = times;
    this.next = 1;
  }

  /** Put the frames back, run the batch at the next time (and housekeeping when asked). */
  round(): void {
    this.buf.set(this.pristine);
    const now = this.times[this.next++] as number;
    this.engine.processBatch(this.batch, now);
    if (this.housekeeping) this.engine.housekeeping(now, 50_000);
  }

  /** A new source port in every frame (a new flow; the engine checks no L4 checksum): `value + i` at byte `at`. */
  setPorts(at: number, value: number): void {
    const p = this.pristine;
    const b = this.batch;
    for (let i = 0; i < b.count; i++) {
      const o = b.offsets[i]! + at;
      const v = (value + i) & 0xffff;
      p[o] = v >> 8;
      p[o + 1] = v & 0xff;
    }
  }
}

/** What the harness prints for a path, one JSON line each. */
export interface Result {
  name: string;
  /** A control path that allocates on purpose. */
  allocates: boolean;
  /** Bytes per packet a known allocation may take (0: none is known). */
  knownBytesPerPacket: number;
  packets: number;
  rounds: number;
  /** Heap growth over the measured rounds (meaningful when scavenges is 0). */
  bytes: number;
  /** Collections during the measured rounds (a 1 MiB semi-space fills after ~1 MiB). */
  scavenges: number;
  /** Runs measured (up to five, the best kept), and each one's bytes and scavenges. */
  attempts: number;
  runs: { bytes: number; scavenges: number }[];
  ms: number;
  error?: string;
}

/** What a path is known to allocate until a fix elsewhere lands, and that fix. */
export interface KnownAllocation {
  readonly bytesPerPacket: number;
  readonly why: string;
}

export interface Path {
  readonly name: string;
  readonly packetsPerRound: number;
  readonly round: () => void;
  /** Throws when the last round did not take the path's branch. */
  readonly verify: () => void;
  /** Packets to measure (default MEASURE_PACKETS): fewer for the paths that do a lot per packet. */
  readonly measurePackets?: number;
  /** A control path that allocates on purpose: the measurement must see it. */
  readonly allocates?: boolean;
  /** An allocation known and not fixed yet, in a file outside this audit's: at most this much passes. */
  readonly known?: KnownAllocation;
  /** Rounds before measuring (default: WARMUP_PACKETS' worth, at least MIN_WARMUP_ROUNDS). */
  readonly warmupRounds?: number;
  /** Called with the number of rounds about to run, before they are measured. */
  readonly prepare: (rounds: number) => void;
}

function verdictName(v: number): string {
  if (v === VERDICT_PASS) return 'pass';
  if (v === VERDICT_TX) return 'tx';
  if (v === VERDICT_CONSUMED) return 'consumed';
  const name = Object.entries(DropReason).find(([, n]) => n === -v)?.[0];
  return name ? `drop:${name}` : `verdict ${v}`;
}

function expectVerdicts(rig: Rig, expected: number | readonly number[]): void {
  const b = rig.batch;
  for (let i = 0; i < b.count; i++) {
    const want = typeof expected === 'number' ? expected : expected[i]!;
    if (b.verdicts[i] !== want) throw new Error(`frame ${i}: ${verdictName(b.verdicts[i]!)}, expected ${verdictName(want)}`);
  }
}

/** A check that a counter of the rig (or any number read from it) passes `test`. */
const expectThat = (what: string, read: (rig: Rig) => number, test: (v: number) => boolean) => (rig: Rig) => {
  const v = read(rig);
  if (!test(v)) throw new Error(`${what} is ${v}`);
};
const counter = (slot: number, name: string, test: (v: number) => boolean) => expectThat(`counter ${name}`, (rig) => rig.counters[slot]!, test);

interface RigPathOptions {
  /** Checked after the last round besides the verdicts. */
  check?: (rig: Rig) => void;
  measurePackets?: number;
  known?: KnownAllocation;
  /** Runs before each round (e.g. new source ports). */
  before?: (rig: Rig) => void;
}

/** A path over one rig: every frame's verdict checked after the last round, and `check`. */
function rigPath(name: string, rig: Rig, expected: number | readonly number[], o: RigPathOptions = {}): Path {
  const before = o.before;
  return {
    name,
    packetsPerRound: rig.batch.count,
    round: before
      ? () => {
          before(rig);
          rig.round();
        }
      : () => rig.round(),
    verify: () => {
      expectVerdicts(rig, expected);
      o.check?.(rig);
    },
    // A known allocation is measured below 1 MiB (no collection), where the bytes are exact.
    measurePackets: o.known ? KNOWN_MEASURE_PACKETS : o.measurePackets,
    known: o.known,
    prepare: (rounds) => rig.prepare(rounds),
  };
}

/** New source ports every round from byte `at` of each frame: every packet is a new flow. */
function newPortsAt(at: number): (rig: Rig) => void {
  const port = new Int32Array(1);
  return (rig) => {
    port[0] = (port[0]! + rig.batch.count) & 0xffff;
    rig.setPorts(at, port[0]!);
  };
}

// ---- frames ------------------------------------------------------------------------------------

const eth4 = (payload: Uint8Array) => ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, payload);
const eth6 = (payload: Uint8Array) => ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, payload);

function tcp4(sport: number, flags: number, o: { dport?: number; dst?: string; payload?: Uint8Array; df?: boolean; vlan?: number; ipOptions?: number[]; tcpOptions?: number[] } = {}): Uint8Array {
  const dst = o.dst ?? VIP;
  const segment = tcp({ sport, dport: o.dport ?? 80, flags, seq: TCP_SEQ, ack: 0x87654321, options: o.tcpOptions }, o.payload ?? [], { src: CLIENT, dst });
  return ethernet({ dst: LB_MAC, src: CLIENT_MAC, vlan: o.vlan, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst, proto: 6, id: 0xbeef, df: o.df ?? true, options: o.ipOptions }, segment));
}

function udp4(sport: number, o: { dport?: number; payload?: Uint8Array; df?: boolean; vlan?: number } = {}): Uint8Array {
  const ip = ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 0xbeef, df: o.df ?? true }, udp({ sport, dport: o.dport ?? 53 }, o.payload ?? [1, 2, 3], { src: CLIENT, dst: VIP }));
  return ethernet({ dst: LB_MAC, src: CLIENT_MAC, vlan: o.vlan, type: ETH_IPV4 }, ip);
}

function tcp6(sport: number, flags: number, o: { dport?: number; payload?: Uint8Array } = {}): Uint8Array {
  return eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport, dport: o.dport ?? 80, flags, seq: TCP_SEQ, ack: 0x87654321 }, o.payload ?? [], { src: CLIENT6, dst: VIP6 })));
}

function udp6(sport: number, o: { dport?: number; payload?: Uint8Array } = {}): Uint8Array {
  return eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport, dport: o.dport ?? 443 }, o.payload ?? [1, 2, 3], { src: CLIENT6, dst: VIP6 })));
}

/** A virtio_net_hdr: NEEDS_CSUM, a GSO type (0 none, 1 TCPv4, 4 TCPv6, 5 UDP_L4) and gso_size. */
function vnet(gsoType = 0, gsoSize = 0): Uint8Array {
  const v = new Uint8Array(VNET_HDR_LEN);
  v[0] = 1;
  v[1] = gsoType;
  v[4] = gsoSize & 0xff;
  v[5] = gsoSize >> 8;
  return v;
}

const withVnet = (v: Uint8Array, frame: Uint8Array) => Uint8Array.from([...v, ...frame]);
const payload = (n: number) => Uint8Array.from({ length: n }, (_, k) => (k * 7 + 3) & 0xff);
const times = <T>(n: number, f: (i: number) => T): T[] => Array.from({ length: n }, (_, i) => f(i));

/** An IPv4 TCP frame with the pseudo-header sum in its checksum field, as a CHECKSUM_PARTIAL sender leaves it. */
function partial4(frame: Uint8Array): Uint8Array {
  const out = Uint8Array.from(frame);
  const ip = 14;
  let sum = 6 + ((out[ip + 2]! << 8) | out[ip + 3]!) - 20;
  for (let i = ip + 12; i < ip + 20; i += 2) sum += (out[i]! << 8) | out[i + 1]!;
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  out[ip + 20 + 16] = sum >> 8;
  out[ip + 20 + 17] = sum & 0xff;
  return out;
}

// ---- paths -------------------------------------------------------------------------------------

const FLOWS = 256;
const L4_AFTER_IPV4 = 14 + 20;
const L4_AFTER_IPV6 = 14 + 40;
const drop = (reason: number) => Counter.dropBase + reason;

/** Every path by name, made when it runs (and dropped after): 90 engines at once would be 100 MiB of batches. */
export const paths: { name: string; make: () => Path }[] = [];
const def = (name: string, make: (name: string) => Path) => paths.push({ name, make: () => make(name) });

// An empty batch: processBatch's own work per batch.
def('processBatch: empty batches (its work per batch)', (name) => {
  const rig = new Rig([{ bytes: udp4(1) }], l2Snap());
  const p = rigPath(name, rig, VERDICT_TX);
  rig.batch.count = 0;
  // Rounds that do so little take many to be optimised.
  return { ...p, packetsPerRound: 256, verify: () => {}, warmupRounds: 20_000 };
});

// -- L2 forwarding of flows that have entries
def('l2: udp4 flow-table hits', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: udp4(10_000 + i) })), l2Snap()), VERDICT_TX));
def('l2: udp4 flow-table hits, 802.1Q tagged', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: udp4(10_000 + i, { vlan: 0x2064 }) })), l2Snap()), VERDICT_TX));
def('l2: udp6 flow-table hits (port-0 service)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: udp6(40_000 + i, { dport: 9000 + (i & 7) }) })), l2Snap()), VERDICT_TX));
def('l2: tcp4 established hits', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK) })), l2Snap()), VERDICT_TX));
def('l2: tcp6 established hits', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp6(40_000 + i, ACK) })), l2Snap()), VERDICT_TX));
def('l2: tcp4 hits with IPv4 options (router alert) and TCP options (timestamps)', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { ipOptions: [0x94, 4, 0, 0], tcpOptions: [1, 1, 8, 10, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1] }) })), l2Snap()), VERDICT_TX),
);
def('l2: udp6 hits through hop-by-hop and destination options headers', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: [ipv6Options(0), ipv6Options(60, [0xc9, 2, 1, 2])] }, udp({ sport: 40_000 + i, dport: 9000 }, [1, 2, 3], { src: CLIENT6, dst: VIP6 }))) })), l2Snap()), VERDICT_TX),
);
def('l2: tcp4 hits under wlc', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { dport: 81 }) })), l2Snap()), VERDICT_TX));
def('l2: GSO super-frame with CHECKSUM_PARTIAL to an l2 real (MAC rewrite only)', (name) =>
  rigPath(
    name,
    new Rig(times(64, (i) => ({ bytes: withVnet(vnet(1, 1400), tcp4(40_000 + i, ACK, { payload: payload(4000) })), flags: FRAME_HAS_VNET_HDR | FRAME_GSO | FRAME_CSUM_PARTIAL })), l2Snap()),
    VERDICT_TX,
  ),
);

// -- TCP state changes: per connection SYN, ACK, FIN, RST every round; the next round's SYN finds
// the closed entry (port reuse) and schedules it afresh.
def('tcp: SYN -> ACK -> FIN -> RST, then a SYN reusing the closed port', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(20_000 + (i >> 2), [SYN, ACK, FIN | ACK, RST][i & 3]!) })), l2Snap()), VERDICT_TX, {
    check: counter(Counter.flowTableEntries, 'flowTableEntries', (v) => v === FLOWS / 4),
  }),
);

// -- New flows every round (new source ports), in a full table: each insert evicts the oldest entry.
const evicting = counter(Counter.flowTableEvictions, 'flowTableEvictions', (v) => v > 0);
const newFlows = (name: string, frame: (i: number) => Uint8Array, portAt: number, check: (rig: Rig) => void = evicting) =>
  def(name, () => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: frame(i) })), l2Snap(), { flowCapacity: 1024 }), VERDICT_TX, { before: newPortsAt(portAt), check }));
newFlows('tcp: new connections (SYN), maglev, full table evicting', (i) => tcp4(i, SYN), L4_AFTER_IPV4);
newFlows('tcp: new connections (SYN), wlc, full table evicting', (i) => tcp4(i, SYN, { dport: 81 }), L4_AFTER_IPV4);
newFlows('tcp: new connections (SYN), rendezvous, full table evicting', (i) => tcp4(i, SYN, { dport: 83 }), L4_AFTER_IPV4);
newFlows('tcp6: new connections (SYN), full table evicting', (i) => tcp6(i, SYN), L4_AFTER_IPV6);
newFlows('tcp: mid-stream ACK without entry (consistent hash)', (i) => tcp4(i, ACK), L4_AFTER_IPV4);
newFlows('tcp: mid-stream FIN without entry (entry made in fin)', (i) => tcp4(i, FIN | ACK), L4_AFTER_IPV4);
newFlows('tcp: RST without entry (no state made)', (i) => tcp4(i, RST), L4_AFTER_IPV4, counter(Counter.flowTableEntries, 'flowTableEntries', (v) => v === 0));
newFlows('udp: new flows, maglev (mid-stream pick), full table evicting', (i) => udp4(i), L4_AFTER_IPV4);
newFlows('udp: new flows, wlc, full table evicting', (i) => udp4(i, { dport: 82 }), L4_AFTER_IPV4);
newFlows('udp: new flows, rendezvous, full table evicting', (i) => udp4(i, { dport: 84 }), L4_AFTER_IPV4);
newFlows('udp6: new flows, full table evicting', (i) => udp6(i, { dport: 9000 }), L4_AFTER_IPV6);

// -- Flow table expiry
const udp20ms = { timeouts: { ...TIMEOUTS, udpMs: 20 } };
const withStep = (rig: Rig, ms: number) => {
  rig.clock[1] = ms;
  return rig;
};
def("flow table: a full table's oldest entry, idle past its timeout, makes room", (name) =>
  rigPath(name, withStep(new Rig(times(FLOWS, (i) => ({ bytes: udp4(i) })), l2Snap(), { flowCapacity: 1024, ...udp20ms }), 10), VERDICT_TX, {
    before: newPortsAt(L4_AFTER_IPV4),
    check: expectThat('flows.expirations', (r) => r.engine.flows.expirations, (v) => v > 1000),
  }),
);
def('flow table: lookup finds the entry expired and makes a new one', (name) => {
  // The same flows every round, each idle past its 1 ms timeout by then: lookup removes it, a new entry replaces it.
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: udp4(30_000 + i) })), l2Snap(), { timeouts: { ...TIMEOUTS, udpMs: 1 } });
  rig.clock[1] = 1.5;
  return rigPath(name, rig, VERDICT_TX, { check: expectThat('flows.expirations', (r) => r.engine.flows.expirations, (v) => v > 1000) });
});
def('flow table: housekeeping between batches expires idle flows', (name) => {
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: udp4(i) })), l2Snap(), udp20ms);
  rig.housekeeping = true;
  const path = rigPath(name, rig, VERDICT_TX, {
    before: newPortsAt(L4_AFTER_IPV4),
    check: (rig) => {
      counter(Counter.flowTableExpirations, 'flowTableExpirations', (v) => v > 1000)(rig);
      counter(Counter.flowTableEvictions, 'flowTableEvictions', (v) => v === 0)(rig);
    },
  });
  // Called once a batch here (every 100 ms in a loop), the sweep takes more rounds to be optimised.
  return { ...path, warmupRounds: 600 };
});

// -- Snapshot swaps. Two snapshots, each with one of a service's two reals down, swapped every
// round: every flow finds that its real may not keep it and moves to the other.

/**
 * Swaps `a` and `b` in before every round. setSnapshot is made hot first: it runs once a snapshot
 * in a loop, in the interpreter, which boxes the snapshot's uint32 hash seed as it reads it (16
 * bytes a swap, not a packet); swapped every round here, it would be that until optimised.
 */
function swapping(rig: Rig, a: ForwardingSnapshot, b: ForwardingSnapshot): (rig: Rig) => void {
  for (let i = 0; i < 20_000; i++) rig.engine.setSnapshot(i & 1 ? b : a);
  rig.engine.setSnapshot(a);
  const flip = new Int32Array(1);
  return (r) => r.engine.setSnapshot((flip[0] ^= 1) === 1 ? b : a);
}
const moving = (name: string, frame: (i: number) => Uint8Array) =>
  def(name, () => {
    const builder = new SnapshotBuilder();
    const down = (address: string): Tweak => (r, s) => (r.address === address ? { ...r, health: 'down' } : l2Base(r, s));
    const a = snapshotOf(L2_CONFIG, down('10.0.0.21'), undefined, builder);
    const b = snapshotOf(L2_CONFIG, down('10.0.0.22'), undefined, builder);
    const rig = new Rig(times(FLOWS, (i) => ({ bytes: frame(i) })), a);
    return rigPath(name, rig, VERDICT_TX, {
      before: swapping(rig, a, b),
      check: counter(Counter.flowsRescheduled, 'flowsRescheduled', (v) => v > 1000),
    });
  });
moving('snapshot swap: udp flows rescheduled off a real that went down', (i) => udp4(40_000 + i, { dport: 85 }));
moving('snapshot swap: tcp flows rescheduled off a real that went down (restart in syn)', (i) => tcp4(40_000 + i, ACK, { dport: 86 }));
def('snapshot swap: a new snapshot every batch, flows kept', (name) => {
  const builder = new SnapshotBuilder();
  const a = snapshotOf(L2_CONFIG, l2Base, undefined, builder);
  const b = snapshotOf(L2_CONFIG, l2Base, undefined, builder);
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: udp4(10_000 + i) })), a);
  return rigPath(name, rig, VERDICT_TX, {
    before: swapping(rig, a, b),
    check: counter(Counter.snapshotGeneration, 'snapshotGeneration', (v) => v === a.generation || v === b.generation),
  });
});

// -- IP fragments: a first fragment (placed by its 5-tuple, recorded) and later ones (followed).
const datagram4 = (sport: number) => udp({ sport, dport: 53 }, payload(64), { src: CLIENT, dst: VIP });
const fragment4 = (id: number, offset: number, more: boolean, data: Uint8Array) => eth4(ipv4({ src: CLIENT, dst: VIP, proto: 17, id, mf: more, fragOffset: offset }, data));
const fragments4 = (i: number) => {
  const d = datagram4(5000 + (i >> 2));
  const id = 0xf000 + (i >> 2);
  const pieces = [fragment4(id, 0, true, d.subarray(0, 24)), fragment4(id, 24, true, d.subarray(24, 48)), fragment4(id, 48, false, d.subarray(48))];
  return pieces[Math.min(i & 3, 2)]!;
};
def('fragments: IPv4 first fragment recorded, later fragments follow it', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragments4(i) })), l2Snap()), VERDICT_TX));
const fragments6 = (i: number, dport = 9000) => {
  const d = udp({ sport: 5000 + (i >> 1), dport }, payload(64), { src: CLIENT6, dst: VIP6 });
  const id = IPV6_FRAGMENT_ID + (i >> 1);
  const later = (i & 1) === 1;
  return eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: later ? 40 : 0, more: !later, id })] }, later ? d.subarray(40) : d.subarray(0, 40)));
};
def('fragments: IPv6 first fragment recorded, later fragments follow it (fragment ids >= 2^31)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragments6(i) })), l2Snap()), VERDICT_TX));
def('drop: fragmentUnplaceable (IPv4, a later fragment without its first)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragment4(i, 24, false, datagram4(1).subarray(24)) })), l2Snap()), -DropReason.fragmentUnplaceable));
def('drop: fragmentUnplaceable (IPv6, a later fragment without its first)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragments6(2 * i + 1) })), l2Snap()), -DropReason.fragmentUnplaceable));
def('pass: a later fragment to an address that is no VIP', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: '10.9.9.9', proto: 17, id: 4, fragOffset: 24 }, payload(40))) })), l2Snap()), VERDICT_PASS));

// -- ICMP to a VIP
def('icmp: echo request to an IPv4 VIP answered in place', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: eth4(ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmpEcho({ id: 0xfeed, seq: 0xff00 + i }, payload(56)))) })), l2Snap()), VERDICT_TX, {
    check: counter(Counter.icmpEchoReplied, 'icmpEchoReplied', (v) => v > 1000),
  }),
);
def('icmp: echo request to an IPv6 VIP answered in place', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58 }, icmpv6({ type: 128, rest: (0xfeed << 16) | (0xff00 + i) }, payload(56), { src: CLIENT6, dst: VIP6 }))) })), l2Snap()), VERDICT_TX));
// A too-big message from a client's router about a reply the real sent (VIP -> client), to the
// real of that flow: found in the flow table, or by the mid-stream pick. Services whose lookup
// hash is 2^31 or more (udp 85; the IPv6 VIP's port 9000 and port 0), as many are.
const ROUTER = '198.51.100.1';
const ROUTER6 = 'fd00:5100::1';
const quote4 = (sport: number, port = 85) => ipv4({ src: VIP, dst: CLIENT, proto: 17, df: true }, udp({ sport: port, dport: sport }, payload(32), { src: VIP, dst: CLIENT })).subarray(0, 28);
const fragNeeded = (quote: Uint8Array) => eth4(ipv4({ src: ROUTER, dst: VIP, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, quote)));
const quote6 = (sport: number) => ipv6({ src: VIP6, dst: CLIENT6, nextHeader: 17 }, udp({ sport: 9000, dport: sport }, payload(32), { src: VIP6, dst: CLIENT6 })).subarray(0, 48);
const packetTooBig = (quote: Uint8Array) => eth6(ipv6({ src: ROUTER6, dst: VIP6, nextHeader: 58 }, icmpv6({ type: 2, rest: 1400 }, quote, { src: ROUTER6, dst: VIP6 })));
def('icmp: fragmentation-needed from a client about a flow goes to the real of its entry', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragNeeded(quote4(50_000 + i)) })), l2Snap()).prime(times(FLOWS, (i) => ({ bytes: udp4(50_000 + i, { dport: 85 }) }))), VERDICT_TX, {
    check: expectThat('flow entries', (r) => r.engine.flows.size, (v) => v === FLOWS),
  }),
);
def('icmp: fragmentation-needed about a flow without entry (mid-stream pick)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragNeeded(quote4(60_000 + i)) })), l2Snap()), VERDICT_TX));
def('icmp: ICMPv6 packet too big from a client about a flow goes to the real of its entry', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: packetTooBig(quote6(50_000 + i)) })), l2Snap()).prime(times(FLOWS, (i) => ({ bytes: udp6(50_000 + i, { dport: 9000 }) }))), VERDICT_TX, {
    check: expectThat('flow entries', (r) => r.engine.flows.size, (v) => v === FLOWS),
  }),
);
def('icmp: ICMPv6 packet too big about a flow without entry (mid-stream pick)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: packetTooBig(quote6(60_000 + i)) })), l2Snap()), VERDICT_TX));
def('drop: icmpToVip (ICMP to a VIP that is neither echo nor too-big)', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmp({ type: 13 }, payload(12)))) })), l2Snap()), -DropReason.icmpToVip));
def('drop: icmpToVip (a too-big message quoting no service)', (name) =>
  rigPath(name, new Rig(times(FLOWS, () => ({ bytes: fragNeeded(ipv4({ src: VIP, dst: CLIENT, proto: 17 }, udp({ sport: 7777, dport: 1 }, [], { src: VIP, dst: CLIENT }))) })), l2Snap()), -DropReason.icmpToVip),
);
def('drop: truncatedIcmp (a too-big message whose quote stops before the ports)', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: fragNeeded(quote4(1).subarray(0, 20)) })), l2Snap()), -DropReason.truncatedIcmp));
def('drop: truncatedIcmp (ICMP header cut short)', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: VIP, proto: 1 }, [8, 0])) })), l2Snap()), -DropReason.truncatedIcmp));
def('pass: ICMPv6 neighbour discovery to an IPv6 VIP', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58, hopLimit: 255 }, icmpv6({ type: 135 }, payload(16), { src: CLIENT6, dst: VIP6 }))) })), l2Snap()), VERDICT_PASS));
def('pass: a fragment of a large ping to a VIP', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: VIP, proto: 1, id: 3, mf: true }, icmpEcho({ id: 1, seq: 1 }, payload(64)))) })), l2Snap()), VERDICT_PASS));
def('pass: ICMP to an address that is no VIP', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: '10.9.9.9', proto: 1 }, icmpEcho({ id: 1, seq: 1 }))) })), l2Snap()), VERDICT_PASS));

// -- Frames left to the kernel
def('pass: not IP (ARP)', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: ethernet({ dst: 'ff:ff:ff:ff:ff:ff', src: CLIENT_MAC, type: ETH_ARP }, payload(28)) })), l2Snap()), VERDICT_PASS));
def('pass: TCP to a VIP port without a service', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(10_000 + i, SYN, { dport: 22 }) })), l2Snap()), VERDICT_PASS));
def('pass: another IP protocol (GRE) to a VIP', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth4(ipv4({ src: CLIENT, dst: VIP, proto: 47 }, payload(24))) })), l2Snap()), VERDICT_PASS));
def('pass: IPv6 with no next header', (name) => rigPath(name, new Rig(times(FLOWS, () => ({ bytes: eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 59 }, payload(8))) })), l2Snap()), VERDICT_PASS));

// -- Forwarding decisions that drop
def('drop: noRealAvailable (whenAllDown: drop, every real down)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(10_000 + i, SYN, { dst: VIP_DROP }) })), l2Snap()), -DropReason.noRealAvailable));
def("drop: neighborUnknown (the flow's real has no MAC now)", (name) => {
  // Flows placed while the real's MAC was known; then a snapshot without it: the real (up) keeps its flows, which nothing can reach.
  const builder = new SnapshotBuilder();
  const known = snapshotOf(L2_CONFIG, l2Base, undefined, builder);
  const unknown = snapshotOf(L2_CONFIG, (r, s) => (s === 'unresolved' ? { ...r, mac: null } : l2Base(r, s)), undefined, builder);
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: tcp4(10_000 + i, ACK, { dst: VIP_DROP, dport: 81 }) })), known);
  rig.prepare(1);
  rig.round();
  rig.engine.setSnapshot(unknown);
  return rigPath(name, rig, -DropReason.neighborUnknown);
});

// -- Malformed frames: one path per parser drop reason
{
  const good4 = udp4(1234);
  const good6 = udp6(1234);
  const patched = (frame: Uint8Array, at: number, ...values: number[]) => {
    const out = Uint8Array.from(frame);
    values.forEach((v, k) => (out[at + k] = v));
    return out;
  };
  const malformed: [string, () => Uint8Array, number][] = [
    ['truncatedEthernet', () => good4.subarray(0, 10), DropReason.truncatedEthernet],
    ['truncatedVlan', () => Uint8Array.from([...good4.subarray(0, 12), 0x81, 0x00, 0x00]), DropReason.truncatedVlan],
    ['truncatedIpv4', () => good4.subarray(0, 30), DropReason.truncatedIpv4],
    ['badIpv4Version', () => refreshIpv4Checksum(patched(good4, 14, 0x55), 14), DropReason.badIpv4Version],
    ['badIpv4HeaderLength', () => patched(good4, 14, 0x44), DropReason.badIpv4HeaderLength],
    ['badIpv4TotalLength', () => patched(good4, 16, 0x0f, 0xff), DropReason.badIpv4TotalLength],
    ['badIpv4Checksum', () => patched(good4, 24, 0x00, 0x00), DropReason.badIpv4Checksum],
    ['truncatedIpv6', () => good6.subarray(0, 40), DropReason.truncatedIpv6],
    ['badIpv6PayloadLength', () => patched(good6, 18, 0x0f, 0xff), DropReason.badIpv6PayloadLength],
    ['ipv6ExtensionHeaderLimit', () => eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: times(9, () => ipv6Options(60)) }, udp({ sport: 1, dport: 9000 }, [], { src: CLIENT6, dst: VIP6 }))), DropReason.ipv6ExtensionHeaderLimit],
    ['truncatedIpv6ExtensionHeader', () => eth6(ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 60 }, [17, 0, 0, 0])), DropReason.truncatedIpv6ExtensionHeader],
    ['truncatedTcp', () => eth4(ipv4({ src: CLIENT, dst: VIP, proto: 6 }, payload(10))), DropReason.truncatedTcp],
    ['badTcpDataOffset', () => patched(tcp4(1, ACK), L4_AFTER_IPV4 + 12, 0x20), DropReason.badTcpDataOffset],
    ['truncatedUdp', () => eth4(ipv4({ src: CLIENT, dst: VIP, proto: 17 }, payload(6))), DropReason.truncatedUdp],
    ['badUdpLength', () => patched(good4, L4_AFTER_IPV4 + 4, 0x00, 0x04), DropReason.badUdpLength],
  ];
  for (const [name, frame, reason] of malformed) {
    def(`drop: ${name}`, (path) => rigPath(path, new Rig(times(FLOWS, () => ({ bytes: frame() })), l2Snap()), -reason, { check: counter(drop(reason), name, (v) => v > 1000) }));
  }
}

// -- IPIP (L3 DSR)
const generous = { tooBigPerSecond: 1e12, tooBigPerClientPerSecond: 1e12 };
const refusing = { tooBigPerSecond: 0, tooBigPerClientPerSecond: 0 };
const sentTooBig = counter(Counter.icmpTooBigSent, 'icmpTooBigSent', (v) => v > 1000);
const noTooBig = counter(Counter.icmpTooBigSent, 'icmpTooBigSent', (v) => v <= 1);
const extras = counter(Counter.extraFrames, 'extraFrames', (v) => v > 1000);
def('ipip: 4in4, fits the MTU', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { payload: payload(100) }) })), ipipSnap()), VERDICT_TX));
def('ipip: 4in4, 802.1Q tagged (the tag kept on the outer frame)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { payload: payload(100), vlan: 0x2064 }) })), ipipSnap()), VERDICT_TX));
def('ipip: 6in6, fits the MTU (outer flow label)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp6(40_000 + i, ACK, { payload: payload(100) }) })), ipipSnap()), VERDICT_TX));
def('ipip: udp 6in6, fits the MTU', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: udp6(40_000 + i, { payload: payload(100) }) })), ipipSnap()), VERDICT_TX));
def('ipip: CHECKSUM_PARTIAL completed, virtio_net_hdr moved', (name) =>
  rigPath(
    name,
    new Rig(times(FLOWS, (i) => ({ bytes: withVnet(vnet(), partial4(tcp4(40_000 + i, ACK | PSH, { payload: payload(200) }))), flags: FRAME_HAS_VNET_HDR | FRAME_CSUM_PARTIAL })), ipipSnap(), {}, true),
    VERDICT_TX,
  ),
);
def('ipip: IPv4 fragments to an ipip real, the later ones follow the first', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragments4(i) })), ipipSnap()), VERDICT_TX));
def('ipip: IPv6 fragments to an ipip real, the later one follows the first', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: fragments6(i, 443) })), ipipSnap()), VERDICT_TX));

// Too big for the MTU (1500): too-big messages, or outer fragments.
const big4 = (i: number, df: boolean) => tcp4(40_000 + i, ACK, { payload: payload(1460), df });
const big6 = (i: number, n = 1440) => tcp6(40_000 + i, ACK, { payload: payload(n) });
const routeMtu = (mtu: number) => snapshotOf(IPIP_CONFIG, (r) => ({ ...r, tunnelMtu: mtu }), TUNNEL);
def('MTU_SEND_TOO_BIG: IPv4 with DF, fragmentation-needed sent (limiter allows)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big4(i, true) })), ipipSnap(), generous), -DropReason.packetTooBig, { check: sentTooBig, measurePackets: 30_000 }));
def('MTU_SEND_TOO_BIG: IPv6, packet too big sent (limiter allows)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big6(i) })), ipipSnap(), generous), -DropReason.packetTooBig, { check: sentTooBig, measurePackets: 30_000 }));
def('MTU_SEND_TOO_BIG: IPv4 with DF, 802.1Q tagged, fragmentation-needed sent with the tag', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { payload: payload(1460), vlan: 0x2064 }) })), ipipSnap(), generous), -DropReason.packetTooBig, { check: sentTooBig, measurePackets: 30_000 }),
);
def('MTU_FRAGMENT: IPv4 without DF, 802.1Q tagged, as outer fragments with the tag', (name) =>
  rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { payload: payload(1460), df: false, vlan: 0x2064 }) })), ipipSnap()), VERDICT_TX, { check: extras, measurePackets: 50_000 }),
);
def('MTU_SEND_TOO_BIG: IPv4 with DF, refused by the limiter', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big4(i, true) })), ipipSnap(), refusing), -DropReason.packetTooBig, { check: noTooBig }));
def('MTU_SEND_TOO_BIG: IPv6, refused by the limiter', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big6(i) })), ipipSnap(), refusing), -DropReason.packetTooBig, { check: noTooBig }));
def('MTU_FRAGMENT: IPv4 without DF as outer IPv4 fragments', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big4(i, false) })), ipipSnap()), VERDICT_TX, { check: extras, measurePackets: 50_000 }));
def('MTU_FRAGMENT: IPv6 at the 1280 floor as outer IPv6 fragments (route MTU 1300)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: big6(i, 1280 - 60) })), routeMtu(1300)), VERDICT_TX, { check: extras, measurePackets: 50_000 }));
def("drop: batchFull (outer fragments beyond the batch's extra frames)", (name) =>
  rigPath(name, new Rig(times(600, (i) => ({ bytes: big4(i, false) })), ipipSnap()), times(600, (i) => (i < 512 ? VERDICT_TX : -DropReason.batchFull)), {
    measurePackets: 60_000,
  }),
);

// GSO super-frames to IPIP reals: cut into segments, each encapsulated.
const GSO_FLAGS = FRAME_HAS_VNET_HDR | FRAME_GSO | FRAME_CSUM_PARTIAL;
const GSO_PACKETS = 4_000;
const segmented = counter(Counter.gsoSegmented, 'gsoSegmented', (v) => v > 1000);
const gso = (name: string, frame: (i: number) => Uint8Array, expected: number, o: { opts?: Partial<EngineOptions>; check?: (rig: Rig) => void; extraVnetHdr?: boolean; snap?: () => ForwardingSnapshot } = {}) =>
  def(name, () =>
    rigPath(name, new Rig(times(32, (i) => ({ bytes: frame(i), flags: GSO_FLAGS })), (o.snap ?? ipipSnap)(), o.opts ?? {}, o.extraVnetHdr ?? false), expected, {
      check: o.check ?? segmented,
      measurePackets: GSO_PACKETS,
    }),
  );
const udpTrain4 = (i: number, segment: number, count: number, df = true) => eth4(ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 0xbeef, df }, udp({ sport: 40_000 + i, dport: 53 }, payload(segment * count), { src: CLIENT, dst: VIP })));
gso('GSO: TCPv4 super-frame segmented (4 x 1400)', (i) => withVnet(vnet(1, 1400), tcp4(40_000 + i, ACK | PSH, { payload: payload(5600) })), VERDICT_CONSUMED, { extraVnetHdr: true });
gso('GSO: TCPv6 super-frame segmented (4 x 1400)', (i) => withVnet(vnet(4, 1400), tcp6(40_000 + i, ACK | PSH, { payload: payload(5600) })), VERDICT_CONSUMED);
gso('GSO: TCPv4 DF-clear super-frame too big for the tunnel, cut into smaller segments', (i) => withVnet(vnet(1, 1460), tcp4(40_000 + i, ACK, { payload: payload(4 * 1460), df: false })), VERDICT_CONSUMED);
gso('GSO: TCPv6 super-frame at the 1280 floor over a smaller tunnel, cut smaller (route MTU 1300)', (i) => withVnet(vnet(4, 1220), tcp6(40_000 + i, ACK, { payload: payload(4 * 1220) })), VERDICT_CONSUMED, { snap: () => routeMtu(1300) });
gso('GSO: TCPv4 DF super-frame too big for the tunnel, fragmentation-needed sent', (i) => withVnet(vnet(1, 1460), tcp4(40_000 + i, ACK, { payload: payload(4 * 1460) })), -DropReason.packetTooBig, { opts: generous, check: sentTooBig });
gso('GSO: UDPv4 train cut into its datagrams (4 x 1200)', (i) => withVnet(vnet(5, 1200), udpTrain4(i, 1200, 4)), VERDICT_CONSUMED);
gso('GSO: UDPv6 train cut into its datagrams (4 x 1200)', (i) => withVnet(vnet(5, 1200), udp6(40_000 + i, { payload: payload(4800) })), VERDICT_CONSUMED);
gso('GSO: UDPv4 train without DF too big for the tunnel, each datagram as outer fragments', (i) => withVnet(vnet(5, 1472), udpTrain4(i, 1472, 3, false)), VERDICT_CONSUMED, { extraVnetHdr: true });
gso('GSO: UDPv6 train at the 1280 floor, each datagram as outer fragments (route MTU 1300)', (i) => withVnet(vnet(5, 1232), udp6(40_000 + i, { payload: payload(3 * 1232) })), VERDICT_CONSUMED, { snap: () => routeMtu(1300) });
gso('GSO: UDPv4 train with DF too big for the tunnel, fragmentation-needed sent', (i) => withVnet(vnet(5, 1472), udpTrain4(i, 1472, 3)), -DropReason.packetTooBig, { opts: generous, check: sentTooBig });
gso('GSO: UDPv6 train too big for the tunnel, packet too big sent', (i) => withVnet(vnet(5, 1472), udp6(40_000 + i, { payload: payload(3 * 1472) })), -DropReason.packetTooBig, { opts: generous, check: sentTooBig });
def("drop: batchFull (GSO segments beyond the batch's extra frames)", (name) =>
  rigPath(
    name,
    new Rig(times(10, (i) => ({ bytes: withVnet(vnet(1, 100), tcp4(40_000 + i, ACK, { payload: payload(6000) })), flags: GSO_FLAGS })), ipipSnap()),
    times(10, (i) => (i < 8 ? VERDICT_CONSUMED : -DropReason.batchFull)),
    { measurePackets: 2_000 },
  ),
);
def('drop: gsoUnsupported (a GSO frame without its virtio_net_hdr)', (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp4(40_000 + i, ACK, { payload: payload(100) }), flags: FRAME_GSO })), ipipSnap()), -DropReason.gsoUnsupported));
def('drop: gsoUnsupported (TCP segmentation asked of a UDP datagram)', (name) => rigPath(name, new Rig(times(64, (i) => ({ bytes: withVnet(vnet(1, 1200), udpTrain4(i, 1200, 2)), flags: GSO_FLAGS })), ipipSnap()), -DropReason.gsoUnsupported));
def("drop: ipipUnsupported (no outer source of the real's family)", (name) => rigPath(name, new Rig(times(FLOWS, (i) => ({ bytes: tcp6(40_000 + i, ACK) })), snapshotOf(IPIP_CONFIG, (r) => r, { v4: TUNNEL.v4, v6: null })), -DropReason.ipipUnsupported));

/** Enough for either control to fail every run (they fail all five): 1.6 MiB and 100 KiB. */
const CONTROL_PACKETS = 50_000;

// -- Controls: paths that allocate on purpose (an object per packet, a heap number per 8 packets),
// so the test can show that the measurement sees such a path (a check of the check).
def('control: one object per packet (must be caught)', (name) => {
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: udp4(10_000 + i) })), l2Snap());
  const sink: unknown[] = [null];
  const count = new Int32Array(1);
  const p = rigPath(name, rig, VERDICT_TX, { measurePackets: CONTROL_PACKETS });
  return {
    ...p,
    allocates: true,
    round: () => {
      rig.round();
      // Objects that escape (the sink holds the last one): no optimiser can drop them.
      for (let i = 0; i < rig.batch.count; i++) sink[0] = { n: count[0]++ };
    },
  };
});
def('control: one heap number per 8 packets (must be caught)', (name) => {
  // One heap number per 8 packets: 2 bytes a packet, still caught.
  const rig = new Rig(times(FLOWS, (i) => ({ bytes: udp4(10_000 + i) })), l2Snap());
  const sink: unknown[] = [null];
  const p = rigPath(name, rig, VERDICT_TX, { measurePackets: CONTROL_PACKETS });
  return {
    ...p,
    allocates: true,
    round: () => {
      rig.round();
      for (let i = 0; i < rig.batch.count; i += 8) sink[0] = rig.clock[0]! + i;
    },
  };
});

// ---- the criterion ---------------------------------------------------------------------------

/** What a measurement itself leaves on the heap (the heap statistics objects): some 600 bytes. */
export const MEASUREMENT_BYTES = 4096;
/** Bytes per round (per batch) allowed beyond MEASUREMENT_BYTES: none, short of a rounding. */
export const PASS_BYTES_PER_ROUND = 1;

/**
 * Allocates nothing: no collection during the measured rounds (a 1 MiB semi-space fills after
 * 1 MiB, so a path allocating 16 bytes a packet over 200,000 packets has three), and the heap grew
 * by no more than the measurement's own bytes. One heap number per batch fails this (782 rounds of
 * 256 packets: 12 KiB), and one per packet by far.
 */
export function passes(m: { bytes: number; scavenges: number }, rounds: number, packets: number, knownBytesPerPacket = 0): boolean {
  return m.scavenges === 0 && m.bytes - MEASUREMENT_BYTES < PASS_BYTES_PER_ROUND * rounds + knownBytesPerPacket * packets;
}

/** Packets measured on a path with a known allocation: 32 bytes a packet stays below the 1 MiB semi-space. */
export const KNOWN_MEASURE_PACKETS = 20_000;
