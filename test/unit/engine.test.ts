// Engine packet tests as data: an input frame, the setup (config + reals), the expected verdict,
// output bytes and counter changes. Runs the real engine, snapshot builder and flow table.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { Engine, Placement } from '../../src/dataplane/engine.js';
import { FlowState } from '../../src/dataplane/flow-table.js';
import { ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { Counter, createCounters, MAX_REAL_IDS, REAL_BASE, REAL_STRIDE, RealCounter } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { flowHash } from '../../src/dataplane/flow-hash.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { VERDICT_PASS, VERDICT_TX } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type RealView, type ServiceView } from '../../src/control/snapshot-builder.js';
import { addressWords, parseMac } from '../../src/control/addresses.js';
import { ETH_ARP, ETH_IPV4, ETH_IPV6, ethernet, fromHex, hex, icmp, icmpEcho, ipv4, ipv6, tcp, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const VIP = '10.0.0.100';
const VIP6 = 'fd00::100';
const REALS = ['10.0.0.11', '10.0.0.12', '10.0.0.13', '10.0.0.14'];
const realMac = (i: number): string => `02:00:00:00:01:${(0x11 + i).toString(16)}`;
const SYN = 0x02;
const ACK = 0x10;

function config(yaml: string): Config {
  const r = parseConfigText(yaml);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  return r.config;
}

const baseConfig = (scheduler = 'maglev', reals = REALS.slice(0, 3), extra = ''): Config =>
  config(`
interface: eth0
services:
  - name: web
    vip: ${VIP}
    port: 80
    protocol: tcp
    scheduler: ${scheduler}
${extra}
    reals:
${reals.map((a) => `      - address: ${a}`).join('\n')}
  - name: web6
    vip: ${VIP6}
    port: 0
    protocol: udp
    reals:
      - address: fd00::11
`);

/** Views as the daemon makes them: ids in config order, every real up, MACs known. */
function views(cfg: Config, tweak: (r: RealView, service: string) => RealView = (r) => r): ServiceView[] {
  let id = 0;
  return cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) =>
      tweak(
        {
          id: id++,
          address: r.address,
          weight: r.weight,
          intent: r.state,
          forwarding: r.forwarding,
          health: 'up',
          removed: false,
          mac: parseMac(realMac(REALS.indexOf(r.address) >= 0 ? REALS.indexOf(r.address) : 9)),
        },
        s.name,
      ),
    ),
  }));
}

function setup(cfg: Config = baseConfig(), tweak?: (r: RealView, service: string) => RealView) {
  const counters = createCounters();
  const engine = new Engine({
    flowCapacity: 1024,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters,
    localMac: parseMac(LB_MAC),
  });
  const builder = new SnapshotBuilder();
  const build = (c: Config, t?: (r: RealView, service: string) => RealView) => {
    const r = builder.build(views(c, t), c.hashSeed, MAX_REAL_IDS);
    engine.setSnapshot(r.snapshot);
    return r;
  };
  build(cfg, tweak);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC) });
  let now = 1_000_000;
  io.start((b) => engine.processBatch(b, now));
  return { engine, counters, io, build, advance: (ms: number) => (now += ms) };
}

const tcpFrame = (sport: number, flags: number, payload: number[] = [], dport = 80, src = '192.0.2.7') =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src, dst: VIP, proto: 6, id: 1 }, tcp({ sport, dport, flags, seq: 1000, ack: flags & ACK ? 5000 : 0 }, payload, { src, dst: VIP })));

const udpFrame = (sport: number, dport = 443, src = '192.0.2.7') =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src, dst: VIP, proto: 17, id: 1 }, udp({ sport, dport }, [1, 2, 3], { src, dst: VIP })));

/** Which real (index into REALS) a forwarded frame went to, read from its destination MAC. */
function realOf(frame: Uint8Array): number {
  return frame[5]! - 0x11;
}

describe('engine: L2 DSR packet vectors', () => {
  it('forwards a TCP SYN to the VIP with only the Ethernet addresses changed (exact bytes)', () => {
    const { io, counters } = setup();
    const input = tcpFrame(40000, SYN);
    expect(hex(input)).toBe(
      '020000000001' + '02000000000c' + '0800' +
        '45000028000100004006ae64c00002070a000064' + // IPv4: 192.0.2.7 -> 10.0.0.100, checksum 0xae64
        '9c400050000003e8000000005002ffff' + '42ff0000', // TCP SYN 40000 -> 80, window 65535, checksum 0x42ff
    );
    const [out] = io.inject([input]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    const r = realOf(out!);
    expect(hex(out!)).toBe(realMac(r).replaceAll(':', '') + '020000000001' + hex(input).slice(24));
    expect(counters[Counter.rxPackets]).toBe(1);
    expect(counters[Counter.txPackets]).toBe(1);
  });

  it('forwards an IPv6 UDP datagram to a port-0 service (every port of the VIP)', () => {
    const { io } = setup();
    const frame = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: 'fd00::7', dst: VIP6, nextHeader: 17 }, udp({ sport: 5353, dport: 9999 }, [1, 2, 3], { src: 'fd00::7', dst: VIP6 })));
    const [out] = io.inject([frame]);
    expect(out).toBeDefined();
    expect(hex(out!.subarray(0, 12))).toBe(realMac(9).replaceAll(':', '') + '020000000001');
    expect(hex(out!.subarray(12))).toBe(hex(frame.subarray(12)));
  });

  it('leaves ARP, other ports and other addresses to the kernel', () => {
    const { io, counters } = setup();
    const arp = ethernet({ dst: 'ff:ff:ff:ff:ff:ff', src: CLIENT_MAC, type: ETH_ARP }, new Uint8Array(28));
    const otherPort = tcpFrame(40001, SYN, [], 81);
    const otherAddr = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '192.0.2.7', dst: '10.0.0.2', proto: 6 }, tcp({ sport: 1, dport: 80, flags: SYN }, [], { src: '192.0.2.7', dst: '10.0.0.2' })));
    expect(io.inject([arp, otherPort, otherAddr])).toHaveLength(0);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_PASS, VERDICT_PASS, VERDICT_PASS]);
    expect(counters[Counter.passedPackets]).toBe(3);
  });

  it('leaves frames to a broadcast or multicast MAC to the kernel: a SYN to the VIP and an echo request to it', () => {
    const { io, counters } = setup();
    const to = (dst: string, l3: Uint8Array) => ethernet({ dst, src: CLIENT_MAC, type: ETH_IPV4 }, l3);
    const syn = ipv4({ src: '192.0.2.7', dst: VIP, proto: 6, id: 1 }, tcp({ sport: 40002, dport: 80, flags: SYN }, [], { src: '192.0.2.7', dst: VIP }));
    const echo = ipv4({ src: '192.0.2.7', dst: VIP, proto: 1, id: 2 }, icmpEcho({ id: 1, seq: 1 }));
    const frames = [to('ff:ff:ff:ff:ff:ff', syn), to('01:00:5e:00:00:01', syn), to('ff:ff:ff:ff:ff:ff', echo), to('33:33:00:00:00:01', echo)];
    expect(io.inject(frames)).toHaveLength(0);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_PASS, VERDICT_PASS, VERDICT_PASS, VERDICT_PASS]);
    expect(counters[Counter.passedPackets]).toBe(4);
    expect(counters[Counter.icmpEchoReplied]).toBe(0);
    // The same SYN and echo to the LB's own MAC are forwarded and answered.
    expect(io.inject([to(LB_MAC, syn), to(LB_MAC, echo)])).toHaveLength(2);
  });

  it('drops malformed frames and counts them per reason, forwarding the good ones of the same batch', () => {
    const { engine, io, counters } = setup();
    const good = tcpFrame(40002, SYN);
    const truncated = good.subarray(0, 30);
    const badIhl = Uint8Array.from(good);
    badIhl[14] = 0x44;
    const badOffset = Uint8Array.from(good);
    badOffset[14 + 20 + 12] = 0x40; // data offset 4
    const damagedSource = Uint8Array.from(good);
    damagedSource[14 + 12] ^= 0x10; // the IPv4 header checksum no longer verifies
    const out = io.inject([truncated, good, badIhl, badOffset, damagedSource]);
    expect(out).toHaveLength(1);
    expect([...io.lastVerdicts()]).toEqual([
      -DropReason.truncatedIpv4,
      VERDICT_TX,
      -DropReason.badIpv4HeaderLength,
      -DropReason.badTcpDataOffset,
      -DropReason.badIpv4Checksum,
    ]);
    expect(counters[Counter.dropBase + DropReason.badIpv4Checksum]).toBe(1);
    engine.housekeeping(1_000_000, 0);
    expect(counters[Counter.flowTableEntries]).toBe(1); // the damaged header made no entry
    expect(counters[Counter.dropBase + DropReason.truncatedIpv4]).toBe(1);
    expect(counters[Counter.dropBase + DropReason.badIpv4HeaderLength]).toBe(1);
    expect(counters[Counter.dropBase + DropReason.badTcpDataOffset]).toBe(1);
  });

  it('keeps every packet of a connection on the real its SYN got', () => {
    const { io } = setup();
    for (let port = 41000; port < 41100; port++) {
      const [syn] = io.inject([tcpFrame(port, SYN)]);
      const [ack] = io.inject([tcpFrame(port, ACK)]);
      const [data] = io.inject([tcpFrame(port, ACK, [1, 2, 3, 4])]);
      expect(realOf(ack!)).toBe(realOf(syn!));
      expect(realOf(data!)).toBe(realOf(syn!));
    }
  });

  it('spreads new connections over all reals', () => {
    const { io } = setup();
    const seen = new Map<number, number>();
    for (let port = 20000; port < 23000; port++) {
      const r = realOf(io.inject([tcpFrame(port, SYN)])[0]!);
      seen.set(r, (seen.get(r) ?? 0) + 1);
    }
    expect([...seen.keys()].sort()).toEqual([0, 1, 2]);
    for (const n of seen.values()) expect(n).toBeGreaterThan(800);
  });

  it('keeps established flows on their real when a real is added, while new flows reach the new one', () => {
    const { io, build } = setup();
    const before = new Map<number, number>();
    for (let port = 30000; port < 31000; port++) {
      io.inject([tcpFrame(port, SYN)]);
      before.set(port, realOf(io.inject([tcpFrame(port, ACK)])[0]!));
    }
    build(baseConfig('maglev', REALS));
    for (const [port, r] of before) expect(realOf(io.inject([tcpFrame(port, ACK, [9])])[0]!)).toBe(r);
    let toNew = 0;
    for (let port = 50000; port < 51000; port++) if (realOf(io.inject([tcpFrame(port, SYN)])[0]!) === 3) toNew++;
    expect(toNew).toBeGreaterThan(150);
  });

  it('places a mid-stream packet without an entry where the Maglev table says (LB restart, other LB)', () => {
    const a = setup();
    const b = setup(); // a second LB (or a restarted one) with the same config
    for (let port = 33000; port < 33300; port++) {
      const viaSyn = realOf(a.io.inject([tcpFrame(port, SYN)])[0]!);
      const midStream = realOf(b.io.inject([tcpFrame(port, ACK, [1])])[0]!);
      expect(midStream).toBe(viaSyn);
    }
  });

  it.each(['maglev', 'rendezvous', 'wlc'])(
    '%s: while reals are unproven (just started), mid-stream packets land where an LB that saw all reals up puts them; new flows only on proven reals',
    (scheduler) => {
      const allUp = setup(baseConfig(scheduler)); // another LB, long running
      // This LB just restarted: 10.0.0.11 proved up, the other two not yet.
      const unproven = (r: RealView): RealView => (r.address === '10.0.0.11' ? r : { ...r, health: 'unknown' });
      const restarted = setup(baseConfig(scheduler), unproven);
      let onUnproven = 0;
      for (let port = 34000; port < 34300; port++) {
        const there = realOf(allUp.io.inject([tcpFrame(port, SYN)])[0]!);
        const here = realOf(restarted.io.inject([tcpFrame(port, ACK, [1])])[0]!);
        if (scheduler !== 'wlc') expect(here).toBe(there);
        if (here !== 0) onUnproven++;
      }
      // wlc's new flows follow load, not the hash; its strays still reach the unproven reals.
      expect(onUnproven).toBeGreaterThan(150);
      for (let port = 35000; port < 35100; port++) expect(realOf(restarted.io.inject([tcpFrame(port, SYN)])[0]!)).toBe(0);
    },
  );

  it.each(['maglev', 'rendezvous'])(
    '%s: a UDP datagram without an entry while reals are unproven goes where an LB that saw all reals up sends it (a UDP flow may be mid-stream)',
    (scheduler) => {
      const udpConfig = (): Config =>
        config(`
interface: eth0
services:
  - name: quic
    vip: ${VIP}
    port: 443
    protocol: udp
    scheduler: ${scheduler}
    reals:
${REALS.slice(0, 3).map((a) => `      - address: ${a}`).join('\n')}
`);
      const allUp = setup(udpConfig());
      const restarted = setup(udpConfig(), (r) => (r.address === '10.0.0.11' ? r : { ...r, health: 'unknown' }));
      let onUnproven = 0;
      for (let port = 37000; port < 37300; port++) {
        const there = realOf(allUp.io.inject([udpFrame(port)])[0]!);
        const here = realOf(restarted.io.inject([udpFrame(port)])[0]!);
        expect(here).toBe(there);
        if (here !== 0) onUnproven++;
      }
      expect(onUnproven).toBeGreaterThan(150);
      // Once all are proven, the same flows stay where they are (their entries agree with the table).
      restarted.build(udpConfig());
      for (let port = 37000; port < 37300; port++) expect(realOf(restarted.io.inject([udpFrame(port)])[0]!)).toBe(realOf(allUp.io.inject([udpFrame(port)])[0]!));
    },
  );

  it('with whenAllDown: drop and no real proven yet, drops new flows but forwards mid-stream packets to their consistent-hash real', () => {
    const drop = baseConfig('maglev', REALS.slice(0, 3), '    whenAllDown: drop');
    const allUp = setup(drop);
    const { io, counters } = setup(drop, (r) => ({ ...r, health: 'unknown' }));
    expect(io.inject([tcpFrame(36000, SYN)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.noRealAvailable]).toBe(1);
    for (let port = 36001; port < 36100; port++) {
      expect(realOf(io.inject([tcpFrame(port, ACK, [1])])[0]!)).toBe(realOf(allUp.io.inject([tcpFrame(port, SYN)])[0]!));
    }
  });

  it('leaves the mid-stream table alone when every real is proven: the same table, no second build', () => {
    const { build } = setup();
    const { snapshot } = build(baseConfig());
    expect(snapshot.svcMidTables[0]).toBe(snapshot.svcTables[0]);
    expect(snapshot.svcMidCandStart[0]).toBe(snapshot.svcCandStart[0]);
    const down = build(baseConfig(), (r) => (r.address === '10.0.0.12' ? { ...r, health: 'down' } : r)).snapshot;
    expect(down.svcMidTables[0]).toBe(down.svcTables[0]); // a real proven down is no candidate for either
  });

  it('starts the entry of a mid-stream packet unproven (syn, inactive) until a second packet, a FIN in fin, never established for one ACK', () => {
    const { io, engine } = setup();
    io.inject([tcpFrame(41000, ACK | 0x01)]); // FIN|ACK, no entry: another LB's closing flow
    io.inject([tcpFrame(41001, ACK, [1])]);
    io.inject([tcpFrame(41002, ACK, [1])]); // one stray (or spoofed) ACK, nothing after it
    const state = (port: number): number => {
      const p = new ParsedPacket();
      p.family = 4;
      p.ipProtocol = 6;
      p.addr.set([addressWords('192.0.2.7')[0]!, 0, 0, 0, addressWords(VIP)[0]!, 0, 0, 0]);
      p.srcPort = port;
      p.dstPort = 80;
      engine.explain(p, 1_000_000);
      return engine.explainFlowState;
    };
    expect(state(41000)).toBe(FlowState.fin);
    expect(state(41001)).toBe(FlowState.syn);
    expect(state(41002)).toBe(FlowState.syn);
    expect(engine.flows.activeByReal.reduce((a, b) => a + b, 0)).toBe(0);
    // The connection's next packet: established (and active) from then on.
    io.inject([tcpFrame(41001, ACK, [2])]);
    expect(state(41001)).toBe(FlowState.established);
    expect(engine.flows.activeByReal.reduce((a, b) => a + b, 0)).toBe(1);
    expect(engine.flows.inactiveByReal.reduce((a, b) => a + b, 0)).toBe(2);
  });

  it('wlc sends new flows to the least loaded real and mid-stream strays to the consistent hash', () => {
    const { io, engine } = setup(baseConfig('wlc'));
    // Establish 5 connections: least-connections with ties by id spreads them 2/2/1 in id order.
    const got: number[] = [];
    for (let port = 1000; port < 1005; port++) {
      got.push(realOf(io.inject([tcpFrame(port, SYN)])[0]!));
      io.inject([tcpFrame(port, ACK)]);
    }
    expect(got).toEqual([0, 1, 2, 0, 1]);
    expect(engine.flows.activeByReal[0]).toBe(2);
    // A stray ACK lands on the Maglev table's real, as on any other LB.
    const m = setup();
    const stray = realOf(io.inject([tcpFrame(7777, ACK, [1])])[0]!);
    expect(stray).toBe(realOf(m.io.inject([tcpFrame(7777, SYN)])[0]!));
  });

  it('never sends to a real whose MAC is unknown: no new flows for it, its existing flows dropped and counted', () => {
    const { io, counters, build } = setup(baseConfig('maglev', REALS.slice(0, 2)));
    const onFirst: number[] = [];
    for (let port = 45000; port < 45200 && onFirst.length < 20; port++) if (realOf(io.inject([tcpFrame(port, SYN)])[0]!) === 0) onFirst.push(port);
    build(baseConfig('maglev', REALS.slice(0, 2)), (r) => (r.address === REALS[0] ? { ...r, mac: null } : r));
    for (let port = 46000; port < 46100; port++) expect(realOf(io.inject([tcpFrame(port, SYN)])[0]!)).toBe(1);
    for (const port of onFirst) expect(io.inject([tcpFrame(port, ACK, [1])])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.neighborUnknown]).toBe(onFirst.length);
    // With no resolved real at all the service has no candidate: new flows are dropped, not
    // misdirected, and counted as neighbor_unknown (the alert for a MAC that does not resolve),
    // not as no_real_available.
    build(baseConfig('maglev', REALS.slice(0, 2)), (r) => ({ ...r, mac: null }));
    expect(io.inject([tcpFrame(47000, SYN)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.neighborUnknown]).toBe(onFirst.length + 1);
    expect(counters[Counter.dropBase + DropReason.noRealAvailable]).toBe(0);
    // Reals that are down (and whenAllDown: drop) are no_real_available, whatever their MACs.
    build(baseConfig('maglev', REALS.slice(0, 2), '    whenAllDown: drop'), (r) => ({ ...r, health: 'down', mac: r.address === REALS[0] ? null : r.mac }));
    expect(io.inject([tcpFrame(47001, SYN)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.noRealAvailable]).toBe(1);
  });

  it('moves flows of a disabled real and keeps flows of a draining real', () => {
    const { io, build, counters } = setup();
    const onReal = new Map<number, number>();
    for (let port = 60000; port < 60300; port++) {
      io.inject([tcpFrame(port, SYN)]);
      onReal.set(port, realOf(io.inject([tcpFrame(port, ACK)])[0]!));
    }
    build(baseConfig(), (r) => (r.address === REALS[0] ? { ...r, intent: 'drain' } : r));
    for (const [port, r] of onReal) expect(realOf(io.inject([tcpFrame(port, ACK, [1])])[0]!)).toBe(r);
    for (let port = 61000; port < 61300; port++) expect(realOf(io.inject([tcpFrame(port, SYN)])[0]!)).not.toBe(0);

    build(baseConfig(), (r) => (r.address === REALS[0] ? { ...r, intent: 'disabled' } : r));
    const moved = [...onReal].filter(([, r]) => r === 0);
    expect(moved.length).toBeGreaterThan(50);
    for (const [port] of moved) expect(realOf(io.inject([tcpFrame(port, ACK, [2])])[0]!)).not.toBe(0);
    expect(counters[Counter.flowsRescheduled]).toBe(moved.length);
  });

  it('starts a TCP flow moved off a failed real again in syn on its new real: not counted active there until its next packet', () => {
    const { io, engine, build } = setup();
    const onFirst: number[] = [];
    for (let port = 62000; port < 62300; port++) {
      io.inject([tcpFrame(port, SYN)]);
      if (realOf(io.inject([tcpFrame(port, ACK)])[0]!) === 0) onFirst.push(port);
    }
    const active = () => [...engine.flows.activeByReal.subarray(0, 3)];
    const inactive = () => [...engine.flows.inactiveByReal.subarray(0, 3)];
    expect(active().reduce((a, b) => a + b, 0)).toBe(300);
    build(baseConfig(), (r) => (r.address === REALS[0] ? { ...r, health: 'down' } : r));
    const movedTo = new Map<number, number>();
    for (const port of onFirst) {
      movedTo.set(port, realOf(io.inject([tcpFrame(port, ACK, [1])])[0]!));
      expect(movedTo.get(port)).not.toBe(0);
    }
    // The new reals never saw these connections (they answer with a reset): inactive, not active.
    expect(active()[0]).toBe(0);
    expect(active().reduce((a, b) => a + b, 0)).toBe(300 - onFirst.length);
    expect(inactive().reduce((a, b) => a + b, 0)).toBe(onFirst.length);
    // A client that goes on (its second packet after the move) is established again.
    io.inject([tcpFrame(onFirst[0]!, ACK, [2])]);
    expect(active().reduce((a, b) => a + b, 0)).toBe(300 - onFirst.length + 1);
    // A reset moved along is closed there (10 s), not started in syn (60 s).
    const p = new ParsedPacket();
    p.family = 4;
    p.ipProtocol = 6;
    p.addr.set([addressWords('192.0.2.7')[0]!, 0, 0, 0, addressWords(VIP)[0]!, 0, 0, 0]);
    const onSecond = onFirst.find((port) => port !== onFirst[0] && movedTo.get(port) === 1)!;
    p.srcPort = onSecond;
    p.dstPort = 80;
    engine.explain(p, 1_000_000);
    expect(engine.explainFlowState).toBe(FlowState.syn);
    expect(engine.explainEntryReal).toBe(-1); // a live entry: no closing connection to name
    // Its new real fails too; the client's next segment is a reset, moved on to the last real.
    build(baseConfig(), (r) => (r.address === REALS[0] || r.address === REALS[1] ? { ...r, health: 'down' } : r));
    expect(realOf(io.inject([tcpFrame(onSecond, 0x04 | ACK)])[0]!)).toBe(2);
    engine.explain(p, 1_000_000);
    expect(engine.explainFlowState).toBe(FlowState.closed);
    // A new SYN replaces the closed entry; until then its packets go to the entry's real.
    expect(engine.explainEntryReal).toBe(2);
    // That real disabled: a packet of the closing connection is moved by the consistent hash, and
    // explain names where it goes, not the entry's real.
    build(baseConfig(), (r) => (r.address === REALS[2] ? { ...r, intent: 'disabled' } : r));
    engine.explain(p, 1_000_000);
    const named = engine.explainEntryReal;
    expect(named === 0 || named === 1).toBe(true);
    expect(realOf(io.inject([tcpFrame(onSecond, ACK)])[0]!)).toBe(named);
  });

  it('drops new flows when no real can take them and the service says whenAllDown: drop', () => {
    const cfg = baseConfig('maglev', REALS.slice(0, 2), '    whenAllDown: drop');
    const { io, counters } = setup(cfg, (r) => ({ ...r, health: 'down' }));
    expect(io.inject([tcpFrame(40004, SYN)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.noRealAvailable]).toBe(1);
  });

  it('keeps forwarding to wanted reals when all are down and the service says failOpen', () => {
    const { io } = setup(baseConfig(), (r) => ({ ...r, health: 'down' }));
    expect(io.inject([tcpFrame(40005, SYN)])).toHaveLength(1);
  });

  it('counts forwarded packets and bytes per real and flows created', () => {
    const { io, counters } = setup();
    const frame = tcpFrame(40006, SYN);
    const r = realOf(io.inject([frame])[0]!);
    const base = REAL_BASE + r * REAL_STRIDE;
    expect(counters[base + RealCounter.forwardedPackets]).toBe(1);
    expect(counters[base + RealCounter.forwardedBytes]).toBe(frame.length);
    expect(counters[base + RealCounter.flowsCreated]).toBe(1);
  });

  it('hashes the flow key the way the snapshot expects (Maglev slot of the 5-tuple)', () => {
    const { io, engine } = setup();
    const key = new Uint32Array(10);
    key[0] = 6 | (4 << 8);
    key[1] = addressWords('192.0.2.7')[0]!;
    key[5] = addressWords(VIP)[0]!;
    const snap = engine.snapshot();
    // Both halves of the uint32 range: the engine carries the hash as an int32 internally.
    let highHashes = 0;
    for (let port = 42424; port < 42488; port++) {
      key[9] = ((port << 16) | 80) >>> 0;
      const hash = flowHash(key, 0);
      if (hash >= 2 ** 31) highHashes++;
      const expected = snap.svcTables[0]![hash % snap.svcTableSize[0]!]!;
      // A SYN is scheduled, an ACK without an entry placed by the consistent hash: both the same slot.
      expect(realOf(io.inject([tcpFrame(port, SYN)])[0]!)).toBe(expected);
      key[9] = (((port + 1000) << 16) | 80) >>> 0;
      const midStream = snap.svcTables[0]![flowHash(key, 0) % snap.svcTableSize[0]!]!;
      expect(realOf(io.inject([tcpFrame(port + 1000, ACK)])[0]!)).toBe(midStream);
    }
    expect(highHashes).toBeGreaterThan(10);
  });

  it('keys its flow table by its own seeded hash: flows crafted to share flowHash bits do not pile up', () => {
    // Anyone can compute flowHash with the default hashSeed 0. These 400 SYNs all share the low 11
    // bits of it, the bucket bits of this table's index (capacity 1024: 2048 buckets); keyed by
    // flowHash they would make one probe run of 400 buckets, walked by every packet of them.
    const { io, engine } = setup();
    const key = new Uint32Array(10);
    key[0] = 6 | (4 << 8);
    key[1] = addressWords('192.0.2.7')[0]!;
    key[5] = addressWords(VIP)[0]!;
    const flows: { src: string; port: number; hash: number }[] = [];
    for (let host = 1; host < 255 && flows.length < 400; host++) {
      const src = `192.0.2.${host}`;
      key[1] = addressWords(src)[0]!;
      for (let port = 1024; port < 65536 && flows.length < 400; port++) {
        key[9] = ((port << 16) | 80) >>> 0;
        const hash = flowHash(key, 0);
        if ((hash & 2047) === 0x2a5) flows.push({ src, port, hash });
      }
    }
    expect(flows.length).toBe(400);
    const out = io.inject(flows.map((f) => tcpFrame(f.port, SYN, [], 80, f.src)));
    expect(out.length).toBe(400);
    expect(engine.flows.size).toBe(400);
    // 400 entries in 2048 buckets: a few buckets from home at worst (399 for the one run).
    expect(engine.flows.longestProbe()).toBeLessThan(24);
    // Placement still follows flowHash: the Maglev slot of each 5-tuple, as every LB computes it.
    const snap = engine.snapshot();
    flows.forEach((f, i) => expect(realOf(out[i]!)).toBe(snap.svcTables[0]![f.hash % snap.svcTableSize[0]!]!));
  });

  it('builds frames from literal bytes too', () => {
    const { io } = setup();
    const literal = fromHex('020000000001' + '02000000000c' + '0806' + '00'.repeat(28));
    expect(io.inject([literal])).toHaveLength(0);
  });
});

describe('engine: a service added on an exact port of a port-0 VIP', () => {
  // IPVS looks up connections before services: a connection the port-0 service placed keeps its
  // real when a reload adds a service on its port; only new connections go to the new service.
  const anyPort = (state = 'active') => `
interface: eth0
services:
  - name: any
    vip: ${VIP}
    port: 0
    protocol: tcp
    reals:
      - { address: ${REALS[0]}, state: ${state} }
`;
  const alt = `  - name: alt
    vip: ${VIP}
    port: 8080
    protocol: tcp
    reals:
      - address: ${REALS[3]}
`;
  const explainAt = (engine: Engine, sport: number, dport: number) => {
    const p = new ParsedPacket();
    p.reset();
    p.family = 4;
    p.ipProtocol = 6;
    p.addr.set(addressWords('192.0.2.7'), 0);
    p.addr.set(addressWords(VIP), 4);
    p.srcPort = sport;
    p.dstPort = dport;
    return { real: engine.explain(p, 1_000_000), placement: engine.lastPlacement };
  };

  it('keeps the port-0 service\'s live connections on their real; new ones go to the new service; a disabled real\'s move there', () => {
    const { engine, io, build, counters } = setup(config(anyPort()));
    const [syn] = io.inject([tcpFrame(40000, SYN, [], 8080)]);
    expect(realOf(syn!)).toBe(0);
    io.inject([tcpFrame(40000, ACK, [], 8080)]);
    build(config(anyPort() + alt));
    const [ack] = io.inject([tcpFrame(40000, ACK, [1], 8080)]);
    expect([realOf(ack!), engine.lastPlacement]).toEqual([0, Placement.flowTable]);
    expect(explainAt(engine, 40000, 8080)).toEqual({ real: 0, placement: Placement.flowTable });
    expect(counters[Counter.flowsRescheduled]).toBe(0);
    const [fresh] = io.inject([tcpFrame(40001, SYN, [], 8080)]);
    expect(realOf(fresh!)).toBe(3);
    // Another port of the VIP is still the port-0 service's alone.
    const [other] = io.inject([tcpFrame(40002, SYN, [], 9090)]);
    expect(realOf(other!)).toBe(0);
    // Its real disabled: the connection cannot stay, and the packet's service (alt) takes it.
    build(config(anyPort('disabled') + alt));
    const [moved] = io.inject([tcpFrame(40000, ACK, [2], 8080)]);
    expect([realOf(moved!), engine.lastPlacement]).toEqual([3, Placement.rescheduled]);
    expect(counters[Counter.flowsRescheduled]).toBe(1);
  });

  it('sends a router\'s ICMP error about such a connection to its real, and explain of its closing entry names that real', () => {
    const { engine, io, build } = setup(config(anyPort()));
    io.inject([tcpFrame(40010, SYN, [], 8080), tcpFrame(40010, ACK, [], 8080)]);
    build(config(anyPort() + alt));
    // Fragmentation needed about the real's reply (VIP:8080 -> client:40010), from a router.
    const reply = ipv4({ src: VIP, dst: '192.0.2.7', proto: 6, df: true }, tcp({ sport: 8080, dport: 40010, flags: ACK, seq: 5, ack: 6 }, [], { src: VIP, dst: '192.0.2.7' }));
    const error = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '192.0.2.254', dst: VIP, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, reply.subarray(0, 28))));
    const [toReal] = io.inject([error]);
    expect(realOf(toReal!)).toBe(0);
    // Its FIN: a new SYN would reuse the port (alt schedules it); the closing connection's own
    // packets still go to its real.
    io.inject([tcpFrame(40010, 0x11, [], 8080)]);
    // Real ids in config order: any's real is id 0, alt's id 1.
    expect(explainAt(engine, 40010, 8080)).toEqual({ real: 1, placement: Placement.scheduled });
    expect(engine.explainEntryReal).toBe(0);
  });

  it('moves a UDP flow of the port-0 service to the exact-port service once one-packet scheduling comes on (its entry goes)', () => {
    const udpAny = (ops: boolean) => `
interface: eth0
services:
  - { name: any, vip: ${VIP}, port: 0, protocol: udp, ops: ${ops}, reals: [ { address: ${REALS[0]} } ] }
`;
    const dns = `  - { name: dns, vip: ${VIP}, port: 443, protocol: udp, reals: [ { address: ${REALS[3]} } ] }
`;
    const { io, build } = setup(config(udpAny(false)));
    expect(realOf(io.inject([udpFrame(41000)])[0]!)).toBe(0);
    build(config(udpAny(false) + dns));
    expect(realOf(io.inject([udpFrame(41000)])[0]!)).toBe(0);
    build(config(udpAny(true) + dns));
    expect(realOf(io.inject([udpFrame(41000)])[0]!)).toBe(3);
  });
});

describe('drop reason labels', () => {
  it('are snake_case names of the reasons', async () => {
    const { dropReasonLabels } = await import('../../src/dataplane/drop-reasons.js');
    expect(dropReasonLabels[DropReason.truncatedIpv4]).toBe('truncated_ipv4');
    expect(dropReasonLabels[DropReason.badIpv4HeaderLength]).toBe('bad_ipv4_header_length');
    expect(dropReasonLabels[DropReason.ipv6ExtensionHeaderLimit]).toBe('ipv6_extension_header_limit');
    expect(dropReasonLabels[DropReason.neighborUnknown]).toBe('neighbor_unknown');
    expect(dropReasonLabels[DropReason.badIpv4Checksum]).toBe('bad_ipv4_checksum');
    expect(dropReasonLabels[DropReason.badPartialChecksum]).toBe('bad_partial_checksum');
    // One slot per reason, each label unique and in Prometheus label style.
    const names = Object.values(DropReason).map((slot) => dropReasonLabels[slot]!);
    expect(new Set(names).size).toBe(names.length);
    for (const name of names) expect(name).toMatch(/^[a-z][a-z0-9_]*$/);
  });
});

// explain() follows what the engine does with a new connection: a live entry is a flow-table hit,
// a fin/closed entry (a reused port) is scheduled afresh, and a hash pick names its Maglev slot.
describe('engine explain', () => {
  const FIN = 0x01;
  const CLIENT = '192.0.2.7';
  function explainer(scheduler: string) {
    const { engine, io } = setup(baseConfig(scheduler));
    const now = 1_000_000;
    const send = (sport: number, flags: number) => io.inject([tcpFrame(sport, flags)]);
    const explain = (sport: number) => {
      const p = new ParsedPacket();
      p.reset();
      p.family = 4;
      p.ipProtocol = 6;
      p.addr.set(addressWords(CLIENT), 0);
      p.addr.set(addressWords(VIP), 4);
      p.srcPort = sport;
      p.dstPort = 80;
      const real = engine.explain(p, now);
      return { real, placement: engine.lastPlacement, slot: engine.explainSlot, flowState: engine.explainFlowState };
    };
    return { engine, send, explain };
  }

  it('names the Maglev slot of a scheduler pick, and the real in that slot is the one a SYN gets', () => {
    const { engine, send, explain } = explainer('maglev');
    const e = explain(40000);
    expect(e.placement).toBe(Placement.scheduled);
    expect(e.flowState).toBe(0);
    expect(e.slot).toBeGreaterThanOrEqual(0);
    expect(e.slot).toBeLessThan(engine.snapshot().svcTableSize[0]!);
    expect(engine.snapshot().svcTables[0]![e.slot]).toBe(e.real);
    const [out] = send(40000, SYN);
    expect(realOf(out!)).toBe(e.real);
  });

  it('calls a live entry a flow-table hit, but a fin entry (a SYN would reuse the port) a fresh scheduler pick', () => {
    const { send, explain } = explainer('maglev');
    send(40001, SYN);
    send(40001, ACK);
    const hit = explain(40001);
    expect(hit.placement).toBe(Placement.flowTable);
    expect(hit.flowState).toBe(FlowState.established);
    expect(hit.slot).toBe(-1);
    send(40001, FIN | ACK);
    const fresh = explain(40001);
    expect(fresh.flowState).toBe(FlowState.fin);
    expect(fresh.placement).toBe(Placement.scheduled);
    expect(fresh.slot).toBeGreaterThanOrEqual(0);
  });

  it('gives no slot for wlc and rendezvous picks (they have no table)', () => {
    expect(explainer('wlc').explain(40002).slot).toBe(-1);
    expect(explainer('rendezvous').explain(40002).slot).toBe(-1);
  });
});

