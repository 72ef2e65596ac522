// One-packet scheduling (`ops: true`, ipvsadm -o, Katran's LRU bypass) for UDP services: no flow
// entry is made, every datagram is placed as one without an entry (the consistent hash of its
// 5-tuple, or of the client with persistence), so a DNS service's millions of one-query flows never
// fill the table. Packet vectors through the real engine, snapshot builder and flow table.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { Engine } from '../../src/dataplane/engine.js';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { VERDICT_TX } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { parseMac } from '../../src/control/addresses.js';
import { ETH_IPV4, ethernet, icmp, ipv4, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const VIP = '10.0.0.100';
const REALS = ['10.0.0.11', '10.0.0.12', '10.0.0.13'];

function config(service: string): Config {
  const r = parseConfigText(`
interface: eth0
services:
  - name: dns
    vip: ${VIP}
    port: 53
    protocol: udp
${service}
    reals:
${REALS.map((a) => `      - address: ${a}`).join('\n')}
`);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  return r.config;
}

function lb(cfg: Config) {
  const counters = createCounters();
  const engine = new Engine({
    flowCapacity: 1 << 16,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters,
    localMac: parseMac(LB_MAC),
  });
  const builder = new SnapshotBuilder();
  const apply = (c: Config, intent: (address: string) => 'active' | 'drain' | 'disabled' = () => 'active') => {
    const views: ServiceView[] = c.services.map((s) => ({
      config: s,
      reals: s.reals.map((r, i) => ({ id: i, address: r.address, weight: r.weight, intent: intent(r.address), forwarding: r.forwarding, health: 'up' as const, removed: false, mac: parseMac(`02:00:00:00:01:${(0x11 + i).toString(16)}`) })),
    }));
    engine.setSnapshot(builder.build(views, c.hashSeed, MAX_REAL_IDS).snapshot);
  };
  apply(cfg);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC) });
  io.start((b) => engine.processBatch(b, 1_000_000));
  /** Index into REALS of the real a frame was sent to, or -1. */
  const send = (frame: Uint8Array): number => {
    const [out] = io.inject([frame]);
    return io.lastVerdicts()[0] === VERDICT_TX ? out![5]! - 0x11 : -1;
  };
  return { engine, counters, apply, send };
}

const dgram = (client: string, sport: number, payload: number[] = [1, 2, 3]) =>
  ethernet({ dst: LB_MAC, src: '02:00:00:00:00:0c', type: ETH_IPV4 }, ipv4({ src: client, dst: VIP, proto: 17 }, udp({ sport, dport: 53 }, payload, { src: client, dst: VIP })));

describe('one-packet scheduling (ops)', () => {
  it('makes no flow entry, sends each 5-tuple to one real every time, and spreads 5-tuples over the reals', () => {
    const e = lb(config('    ops: true'));
    const first = new Map<number, number>();
    for (let round = 0; round < 3; round++) {
      for (let port = 20000; port < 20300; port++) {
        const real = e.send(dgram('198.51.100.7', port));
        expect(real).toBeGreaterThanOrEqual(0);
        if (round === 0) first.set(port, real);
        else expect(real).toBe(first.get(port));
      }
    }
    expect(e.engine.flows.size).toBe(0);
    expect(e.counters[Counter.txPackets]).toBe(900);
    for (let r = 0; r < 3; r++) expect([...first.values()].filter((x) => x === r).length).toBeGreaterThan(60);
    // The default makes an entry per 5-tuple.
    const tracked = lb(config(''));
    for (let port = 20000; port < 20300; port++) expect(tracked.send(dgram('198.51.100.7', port))).toBe(first.get(port));
    expect(tracked.engine.flows.size).toBe(300);
  });

  it('moves a drained real\'s datagrams at once, as IPVS does for OPS (there is no flow to keep on it)', () => {
    const ops = lb(config('    ops: true'));
    const tracked = lb(config(''));
    const onTwelve: number[] = [];
    for (let port = 20000; port < 20300; port++) {
      if (ops.send(dgram('198.51.100.7', port)) === 1) onTwelve.push(port);
      tracked.send(dgram('198.51.100.7', port));
    }
    expect(onTwelve.length).toBeGreaterThan(0);
    const drain12 = (a: string) => (a === '10.0.0.12' ? 'drain' : 'active');
    ops.apply(config('    ops: true'), drain12);
    tracked.apply(config(''), drain12);
    for (const port of onTwelve) {
      expect(ops.send(dgram('198.51.100.7', port))).not.toBe(1);
      expect(tracked.send(dgram('198.51.100.7', port))).toBe(1); // its entry keeps it there
    }
  });

  it('turned on with entries left from before: ignores them for datagrams, explain and ICMP errors alike', () => {
    const e = lb(config(''));
    const onTwelve: number[] = [];
    for (let port = 20000; port < 20300; port++) if (e.send(dgram('198.51.100.7', port)) === 1) onTwelve.push(port);
    expect(e.engine.flows.size).toBe(300);
    e.apply(config('    ops: true'), (a) => (a === '10.0.0.12' ? 'drain' : 'active'));
    for (const port of onTwelve.slice(0, 20)) {
      expect(e.send(dgram('198.51.100.7', port))).not.toBe(1);
      const pkt = { family: 4, ipProtocol: 17, srcPort: port, dstPort: 53, addr: Uint32Array.of(0xc6336407, 0, 0, 0, 0x0a000064, 0, 0, 0) };
      expect(e.engine.explain(pkt as never, 1_000_000)).not.toBe(1);
      const quoted = ipv4({ src: VIP, dst: '198.51.100.7', proto: 17 }, udp({ sport: 53, dport: port }, [9, 9], { src: VIP, dst: '198.51.100.7' }));
      const msg = ethernet({ dst: LB_MAC, src: '02:00:00:00:00:0c', type: ETH_IPV4 }, ipv4({ src: '198.51.100.9', dst: VIP, proto: 1 }, icmp({ type: 3, code: 3 }, quoted.subarray(0, 28))));
      expect(e.send(msg)).not.toBe(1);
    }
  });

  it('with client persistence, every datagram of a client goes to one real', () => {
    const e = lb(config('    ops: true\n    persistence: client'));
    const reals = new Set<number>();
    for (let port = 1024; port < 1124; port++) reals.add(e.send(dgram('203.0.113.50', port)));
    expect(reals.size).toBe(1);
    expect(e.engine.flows.size).toBe(0);
  });

  it('sends an ICMP error about a reply where that 5-tuple\'s datagrams go, without an entry', () => {
    const e = lb(config('    ops: true'));
    const real = e.send(dgram('198.51.100.9', 33333));
    // A port unreachable from the client's side about the real's reply (VIP:53 -> client:33333).
    const quoted = ipv4({ src: VIP, dst: '198.51.100.9', proto: 17 }, udp({ sport: 53, dport: 33333 }, [9, 9], { src: VIP, dst: '198.51.100.9' }));
    const msg = ethernet({ dst: LB_MAC, src: '02:00:00:00:00:0c', type: ETH_IPV4 }, ipv4({ src: '198.51.100.9', dst: VIP, proto: 1 }, icmp({ type: 3, code: 3 }, quoted.subarray(0, 28))));
    expect(e.send(msg)).toBe(real);
    expect(e.engine.flows.size).toBe(0);
  });
});
