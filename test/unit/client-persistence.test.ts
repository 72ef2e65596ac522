// Client persistence (`persistence: client`, `persistencePrefix`): the placement hash leaves the
// ports out and masks the client, so every connection of a client (prefix) lands on one real, on
// every engine (packet loop, LB) alike, while flow entries keep live connections where they are.
// Packet vectors through the real engine, snapshot builder and flow table.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { Engine, Placement } from '../../src/dataplane/engine.js';
import { clientPlacementHash, writeClientMask } from '../../src/dataplane/client-persistence.js';
import { flowHashInt32, FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { VERDICT_TX } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { clientPrefixText, parseMac } from '../../src/control/addresses.js';
import { ETH_IPV4, ETH_IPV6, ethernet, icmp, ipv4, ipv6, tcp, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const VIP = '10.0.0.100';
const VIP6 = 'fd00::100';
const REALS = ['10.0.0.11', '10.0.0.12', '10.0.0.13', '10.0.0.14'];
const REALS6 = ['fd00::11', 'fd00::12', 'fd00::13'];
const SYN = 0x02;
const ACK = 0x10;

function config(persistence: string, reals = REALS.slice(0, 3), scheduler = 'maglev'): Config {
  const r = parseConfigText(`
interface: eth0
services:
  - name: web
    vip: ${VIP}
    port: 80
    scheduler: ${scheduler}
${persistence}
    reals:
${reals.map((a) => `      - address: ${a}`).join('\n')}
  - name: dns6
    vip: ${VIP6}
    port: 0
    protocol: udp
    persistence: client
    persistencePrefix: 64
    reals:
${REALS6.map((a) => `      - address: ${a}`).join('\n')}
`);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  return r.config;
}

/** Real MACs 02:..:01:<n>: the last byte names the real (0x11.. IPv4, 0x21.. IPv6). */
function macOf(address: string): string {
  const i4 = REALS.indexOf(address);
  return `02:00:00:00:01:${(i4 >= 0 ? 0x11 + i4 : 0x21 + REALS6.indexOf(address)).toString(16)}`;
}

function views(cfg: Config): ServiceView[] {
  return cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) => ({
      // Ids by address, as the daemon's registry keeps them across reloads.
      id: REALS.includes(r.address) ? REALS.indexOf(r.address) : 10 + REALS6.indexOf(r.address),
      address: r.address,
      weight: r.weight,
      intent: r.state,
      forwarding: r.forwarding,
      health: 'up' as const,
      removed: false,
      mac: parseMac(macOf(r.address)),
    })),
  }));
}

/** One engine (a packet loop; two of them stand for two LBs of a group) over its own flow table. */
function lb(cfg: Config) {
  const engine = new Engine({
    flowCapacity: 1 << 16,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters: createCounters(),
    localMac: parseMac(LB_MAC),
  });
  const builder = new SnapshotBuilder();
  const apply = (c: Config) => engine.setSnapshot(builder.build(views(c), c.hashSeed, MAX_REAL_IDS).snapshot);
  apply(cfg);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC) });
  io.start((b) => engine.processBatch(b, 1_000_000));
  /** The last byte of the real's MAC a frame was sent to, or -1 when it was not sent. */
  const send = (frame: Uint8Array): number => {
    const [out] = io.inject([frame]);
    return io.lastVerdicts()[0] === VERDICT_TX ? out![5]! : -1;
  };
  return { engine, apply, send };
}

const tcp4 = (client: string, sport: number, flags: number, dport = 80) =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: client, dst: VIP, proto: 6 }, tcp({ sport, dport, flags, seq: 1, ack: flags & ACK ? 1 : 0 }, [], { src: client, dst: VIP })));
const udp6 = (client: string, sport: number, dport: number) =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: client, dst: VIP6, nextHeader: 17 }, udp({ sport, dport }, [1, 2, 3], { src: client, dst: VIP6 })));

const clients = (n: number, net = (i: number) => `192.0.${2 + (i >> 8)}.${i & 255}`) => Array.from({ length: n }, (_, i) => net(i + 1));

describe('client persistence: the mask and the hash', () => {
  it('writes a prefix as four address words, most significant bit first', () => {
    const m = new Int32Array(8);
    writeClientMask(4, 24, m, 0);
    writeClientMask(6, 56, m, 4);
    expect([...m].map((w) => (w >>> 0).toString(16))).toEqual(['ffffff00', '0', '0', '0', 'ffffffff', 'ffffff00', '0', '0']);
    writeClientMask(4, 32, m, 0);
    writeClientMask(6, 1, m, 4);
    expect([...m].map((w) => (w >>> 0).toString(16))).toEqual(['ffffffff', '0', '0', '0', '80000000', '0', '0', '0']);
    writeClientMask(6, 128, m, 4);
    expect([...m.subarray(4)]).toEqual([-1, -1, -1, -1]);
    expect(() => writeClientMask(4, 33, m, 0)).toThrow(/1\.\.32/);
    expect(() => writeClientMask(6, 0, m, 0)).toThrow(/1\.\.128/);
  });

  it('hashes the masked client and the VIP, never the ports', () => {
    const mask = new Int32Array(4);
    writeClientMask(4, 24, mask, 0);
    const scratch = new Uint32Array(FLOW_KEY_WORDS);
    const key = (client: number, vip: number, ports: number) => Uint32Array.of(6 | (4 << 8), client, 0, 0, 0, vip, 0, 0, 0, ports);
    const h = (k: Uint32Array) => clientPlacementHash(k, mask, 0, scratch, 7);
    const base = h(key(0xc0000207, 0x0a000064, (40000 << 16) | 80));
    expect(h(key(0xc0000207, 0x0a000064, (51234 << 16) | 443))).toBe(base);
    expect(h(key(0xc00002fe, 0x0a000064, (40000 << 16) | 80))).toBe(base); // same /24
    expect(h(key(0xc0000307, 0x0a000064, (40000 << 16) | 80))).not.toBe(base); // next /24
    expect(h(key(0xc0000207, 0x0a000065, (40000 << 16) | 80))).not.toBe(base); // another VIP
    // Exactly the flow hash of the key cut down so, on every LB with the same seed.
    expect(base).toBe(flowHashInt32(key(0xc0000200, 0x0a000064, 0), 7));
  });

  it('names the prefix explain reports', () => {
    expect(clientPrefixText('192.0.2.77', 24)).toBe('192.0.2.0/24');
    expect(clientPrefixText('192.0.2.77', 32)).toBe('192.0.2.77/32');
    expect(clientPrefixText('2001:db8:1:2:3::9', 48)).toBe('2001:db8:1::/48');
  });
});

describe('client persistence: the engine', () => {
  it('sends every connection of a client to one real, and spreads clients over all reals', () => {
    const { send } = lb(config('    persistence: client'));
    const byClient = new Map<string, number>();
    for (const c of clients(300)) {
      const reals = new Set<number>();
      for (let port = 40000; port < 40020; port++) reals.add(send(tcp4(c, port, SYN)));
      expect([...reals]).toHaveLength(1);
      expect([...reals][0]).toBeGreaterThan(0);
      byClient.set(c, [...reals][0]!);
    }
    const shares = [0x11, 0x12, 0x13].map((m) => [...byClient.values()].filter((v) => v === m).length / byClient.size);
    for (const s of shares) expect(s).toBeGreaterThan(0.22); // 1/3 each, 300 clients
  });

  it('without it, one client\'s connections spread over the reals (the default: each connection by its 5-tuple)', () => {
    const { send } = lb(config(''));
    const reals = new Set<number>();
    for (let port = 40000; port < 40060; port++) reals.add(send(tcp4('192.0.2.7', port, SYN)));
    expect(reals.size).toBe(3);
  });

  it('with a prefix, clients of one /24 share a real; a port-0 UDP service keeps a client on one real for every VIP port', () => {
    const { send } = lb(config('    persistence: client\n    persistencePrefix: 24'));
    const first = send(tcp4('198.51.100.1', 40000, SYN));
    for (let host = 2; host < 255; host += 7) expect(send(tcp4(`198.51.100.${host}`, 40000 + host, SYN))).toBe(first);
    // The IPv6 service (/64): addresses of one /64 and every destination port go to one real.
    const six = send(udp6('2001:db8:1:2::1', 5000, 53));
    expect(six).toBeGreaterThanOrEqual(0x21);
    for (let i = 0; i < 40; i++) expect(send(udp6(`2001:db8:1:2::${(i * 977).toString(16)}`, 10000 + i, 1000 + i * 13))).toBe(six);
    const other = new Set<number>();
    for (let n = 0; n < 64; n++) other.add(send(udp6(`2001:db8:1:${(n + 3).toString(16)}::1`, 5000, 53)));
    expect(other.size).toBe(3);
  });

  it('every engine picks the same real for a client: another LB (or packet loop) takes its mid-stream packets without an entry there', () => {
    const cfg = config('    persistence: client');
    const a = lb(cfg);
    const b = lb(cfg);
    for (const c of clients(100)) {
      const real = a.send(tcp4(c, 40000, SYN));
      // Another connection of the client opened on b, and a's connection's ACK arriving at b (ECMP moved it).
      expect(b.send(tcp4(c, 41000, SYN))).toBe(real);
      expect(b.send(tcp4(c, 40000, ACK))).toBe(real);
      expect(b.engine.lastPlacement).toBe(Placement.consistentHash);
    }
  });

  it('keeps live connections where they are when a real is added; a client\'s new connections all go to its new real', () => {
    const e = lb(config('    persistence: client'));
    const before = new Map<string, number>();
    for (const c of clients(200)) before.set(c, e.send(tcp4(c, 40000, SYN)));
    e.apply(config('    persistence: client', REALS));
    let moved = 0;
    for (const [c, real] of before) {
      expect(e.send(tcp4(c, 40000, ACK))).toBe(real); // the live connection: its flow entry
      const now = new Set<number>();
      for (let port = 42000; port < 42010; port++) now.add(e.send(tcp4(c, port, SYN)));
      expect(now.size).toBe(1);
      if ([...now][0] !== real) {
        moved++;
        expect([...now][0]).toBe(0x14); // Maglev moves clients only to the new real
      }
    }
    // About a quarter of the clients now start on the fourth real.
    expect(moved / before.size).toBeGreaterThan(0.12);
    expect(moved / before.size).toBeLessThan(0.4);
  });

  it('sends a fragmentation-needed about a client without entry where that client\'s connections go', () => {
    const e = lb(config('    persistence: client'));
    const client = '203.0.113.9';
    const real = e.send(tcp4(client, 40000, SYN));
    // About a reply of a connection this engine never saw (another LB's): the client's real all the same.
    const quoted = ipv4({ src: VIP, dst: client, proto: 6 }, tcp({ sport: 80, dport: 47777, flags: ACK }, [], { src: VIP, dst: client }));
    const msg = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '198.51.100.1', dst: VIP, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, quoted.subarray(0, 28))));
    expect(e.send(msg)).toBe(real);
  });

  it('explain reports where a client\'s new connection goes by the same hash', () => {
    const e = lb(config('    persistence: client\n    persistencePrefix: 16'));
    const real = e.send(tcp4('198.18.1.1', 40000, SYN));
    // ParsedPacket as the daemon fills it for explain: clients of the /16 and ports never seen.
    for (let i = 0; i < 10; i++) {
      const pkt = { family: 4, ipProtocol: 6, srcPort: 12345 + i, dstPort: 80, addr: Uint32Array.of(0xc6120000 + i * 4099, 0, 0, 0, 0x0a000064, 0, 0, 0) };
      expect(0x11 + e.engine.explain(pkt as never, 1_000_000)).toBe(real);
      expect(e.engine.lastPlacement).toBe(Placement.scheduled);
    }
  });
});
