// Engine L3 DSR and ICMP packet tests: IPIP / IPv6-in-IPv6 forwarding, too-big handling (ICMP
// back to the client, outer fragments), software segmentation of GSO frames for IPIP reals,
// ICMP toward a VIP (echo, too-big about a flow) and IP fragments following their first fragment.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { Engine } from '../../src/dataplane/engine.js';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { ParsedPacket, PARSE_OK } from '../../src/dataplane/parsed-packet.js';
import { ipv4HeaderChecksum, l4Checksum } from '../../src/dataplane/checksum.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { FRAME_CSUM_PARTIAL, FRAME_GSO, FRAME_HAS_VNET_HDR, VERDICT_CONSUMED, VERDICT_PASS, VERDICT_TX } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { parseMac } from '../../src/control/addresses.js';
import { ETH_IPV4, ETH_IPV6, ethernet, hex, icmp, icmpEcho, icmpv6, ipv4, ipv6, ipv6Fragment, ipv6Options, onesSum, tcp, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const HOP_MAC = '02:00:00:00:00:99';
const VIP = '10.0.0.100';
const VIP6 = 'fd00::100';
const CLIENT = '192.0.2.7';
const CLIENT6 = '2001:db8::7';

function config(): Config {
  const r = parseConfigText(`
interface: eth0
tunnel: { sourceV4: 10.0.0.2, sourceV6: "fd00::2" }
services:
  - name: web
    vip: ${VIP}
    port: 80
    protocol: tcp
    forwarding: ipip
    reals:
      - address: 10.1.0.11
  - name: dns
    vip: ${VIP}
    port: 53
    protocol: udp
    forwarding: ipip
    reals:
      - address: 10.1.0.12
  - name: web6
    vip: ${VIP6}
    port: 80
    protocol: tcp
    forwarding: ipip
    reals:
      - address: fd01::11
  - name: quic6
    vip: ${VIP6}
    port: 443
    protocol: udp
    forwarding: ipip
    reals:
      - address: fd01::12
`);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  return r.config;
}

function setup(mtu = 1500, batchCapacity = 8, routeMtu: number | null = null, realMac: string | null = HOP_MAC) {
  const cfg = config();
  const counters = createCounters();
  const engine = new Engine({
    flowCapacity: 1024,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters,
    localMac: parseMac(LB_MAC),
    mtu,
  });
  let id = 0;
  const views: ServiceView[] = cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) => ({ id: id++, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: realMac === null ? null : parseMac(realMac), tunnelMtu: routeMtu })),
  }));
  engine.setSnapshot(new SnapshotBuilder().build(views, 0, MAX_REAL_IDS, { v4: '10.0.0.2', v6: 'fd00::2' }).snapshot);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC), slotBytes: 70_000, batchCapacity });
  io.start((b) => engine.processBatch(b, 1_000_000));
  return { engine, counters, io };
}

const tcp4 = (sport: number, flags: number, payload: Uint8Array | number[] = [], df = true) =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 6, df, tos: 0xb9, id: 7 }, tcp({ sport, dport: 80, flags, seq: 1000, ack: 1 }, payload, { src: CLIENT, dst: VIP })));

function parsed(frame: Uint8Array): ParsedPacket {
  const p = new ParsedPacket();
  expect(parseFrame(frame, 0, frame.length, p)).toBe(PARSE_OK);
  return p;
}

/** A virtio-net header asking for TCP segmentation into gsoSize-byte segments (v6: GSO_TCPV6). */
function vnetHeader(gsoSize: number, v6 = false): Uint8Array {
  const vnet = new Uint8Array(10);
  vnet[0] = 1; // NEEDS_CSUM (the checksum field holds the pseudo-header sum; the segmenter recomputes)
  vnet[1] = v6 ? 4 : 1; // GSO_TCPV6 : GSO_TCPV4
  vnet[4] = gsoSize & 0xff;
  vnet[5] = gsoSize >> 8;
  return vnet;
}

const GSO_FLAGS = FRAME_HAS_VNET_HDR | FRAME_GSO | FRAME_CSUM_PARTIAL;

describe('engine: IPIP forwarding', () => {
  it('wraps a TCP SYN in IPv4-in-IPv4 to the real, next hop MAC from the snapshot, DSCP/ECN and DF copied', () => {
    const { io } = setup();
    const inner = tcp4(40000, 0x02);
    const [out] = io.inject([inner]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(hex(out!.subarray(0, 14))).toBe('020000000099' + '020000000001' + '0800');
    const outer = parsed(out!);
    expect(outer.ipProtocol).toBe(4);
    expect(outer.ttl).toBe(64);
    expect(outer.trafficClass).toBe(0xb9);
    expect(outer.dontFragment).toBe(1);
    expect(hex(out!.subarray(14 + 12, 14 + 20))).toBe('0a000002' + '0a01000b'); // 10.0.0.2 -> 10.1.0.11
    expect(hex(out!.subarray(34))).toBe(hex(inner.subarray(14)));
    // The outer header checksum verifies (sum of the header words folds to 0xffff).
    let sum = 0;
    for (let k = 14; k < 34; k += 2) sum += (out![k]! << 8) | out![k + 1]!;
    while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
    expect(sum).toBe(0xffff);
  });

  it('wraps IPv6 in IPv6 (next header 41)', () => {
    const { io } = setup();
    const inner = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport: 1234, dport: 80, flags: 0x02 }, [], { src: CLIENT6, dst: VIP6 })));
    const [out] = io.inject([inner]);
    expect(hex(out!.subarray(12, 14))).toBe('86dd');
    const outer = parsed(out!);
    expect(outer.ipProtocol).toBe(41);
    expect(hex(out!.subarray(14 + 40))).toBe(hex(inner.subarray(14)));
  });

  it('answers a too-big IPv4 packet with DF by ICMP fragmentation-needed, MTU 1480, and drops it', () => {
    const { io, counters } = setup();
    const big = tcp4(40001, 0x10, new Uint8Array(1460));
    expect(big.length).toBe(1514);
    const out = io.inject([big]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(out).toHaveLength(1);
    const icmpMsg = parsed(out[0]!);
    expect(hex(out[0]!.subarray(0, 12))).toBe('02000000000c' + '020000000001'); // back to the client
    expect(icmpMsg.icmpType).toBe(3);
    expect(icmpMsg.icmpCode).toBe(4);
    expect((out[0]![icmpMsg.l4Offset + 6]! << 8) | out[0]![icmpMsg.l4Offset + 7]!).toBe(1480);
    expect(counters[Counter.icmpTooBigSent]).toBe(1);
  });

  it('sends no fragmentation-needed to a source that is no single host, and still drops the packet', () => {
    const { io, counters } = setup();
    for (const src of ['255.255.255.255', '224.0.0.9', '0.0.0.0']) {
      const big = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src, dst: VIP, proto: 6, df: true, id: 7 }, tcp({ sport: 40001, dport: 80, flags: 0x10, seq: 1000, ack: 1 }, new Uint8Array(1460), { src, dst: VIP })));
      expect(io.inject([big])).toHaveLength(0);
      expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    }
    expect(counters[Counter.icmpTooBigSent]).toBe(0);
  });

  it('limits too-big messages per client too: one client sending big packets leaves the others theirs', () => {
    const { io, counters } = setup();
    let toFirst = 0;
    for (let i = 0; i < 80; i++) toFirst += io.inject([tcp4(41000 + i, 0x10, new Uint8Array(1460))]).length;
    expect(toFirst).toBe(50); // a client's burst (50 a second after it), of the loop's 100
    const other = '192.0.2.8';
    const big = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: other, dst: VIP, proto: 6, df: true, id: 8 }, tcp({ sport: 42000, dport: 80, flags: 0x10, seq: 1, ack: 1 }, new Uint8Array(1460), { src: other, dst: VIP })));
    const out = io.inject([big]);
    expect(out).toHaveLength(1);
    expect(parsed(out[0]!).icmpType).toBe(3);
    expect(counters[Counter.icmpTooBigSent]).toBe(51);
  });

  it('takes the route\'s MTU toward the real when it is below the interface\'s (ip route ... mtu 1400): ICMP says 1380', () => {
    const { io } = setup(1500, 8, 1400);
    const out = io.inject([tcp4(40011, 0x10, new Uint8Array(1400))]); // 1440 bytes of IP: fits 1500, not 1400 - 20
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    const m = parsed(out[0]!);
    expect([m.icmpType, m.icmpCode]).toEqual([3, 4]);
    expect((out[0]![m.l4Offset + 6]! << 8) | out[0]![m.l4Offset + 7]!).toBe(1380);
    // A route MTU above the interface's changes nothing: the interface's holds.
    const big = setup(1500, 8, 9000);
    big.io.inject([tcp4(40012, 0x10, new Uint8Array(1400))]);
    expect(big.io.lastVerdicts()[0]).toBe(VERDICT_TX);
    // Without DF the outer fragments fit the route's MTU.
    const frag = setup(1500, 8, 1400);
    const pieces = frag.io.inject([tcp4(40013, 0x10, new Uint8Array(1400), false)]);
    expect(pieces).toHaveLength(2);
    for (const f of pieces) expect(f.length - 14).toBeLessThanOrEqual(1400);
  });

  it('sends an IPv4 packet without DF as outer fragments that fit the MTU, each counted as sent', () => {
    const { io, counters } = setup();
    const big = tcp4(40002, 0x10, new Uint8Array(1460), false);
    const out = io.inject([big]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(out).toHaveLength(2);
    // Every frame handed to the kernel: both fragments and their bytes.
    expect(counters[Counter.txPackets]).toBe(2);
    expect(counters[Counter.txBytes]).toBe(out[0]!.length + out[1]!.length);
    for (const f of out) expect(f.length - 14).toBeLessThanOrEqual(1500);
    const first = parsed(out[0]!);
    const second = parsed(out[1]!);
    expect(first.moreFragments).toBe(1);
    expect(second.fragmentOffset).toBeGreaterThan(0);
    expect(first.fragmentId).toBe(second.fragmentId);
  });

  it('answers a too-big IPv6 packet with ICMPv6 packet too big (MTU 1460)', () => {
    const { io } = setup();
    const big = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport: 999, dport: 80, flags: 0x10 }, new Uint8Array(1440), { src: CLIENT6, dst: VIP6 })));
    const out = io.inject([big]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    const m = parsed(out[0]!);
    expect(m.icmpType).toBe(2);
    const mtu = (out[0]![m.l4Offset + 4]! << 24) | (out[0]![m.l4Offset + 5]! << 16) | (out[0]![m.l4Offset + 6]! << 8) | out[0]![m.l4Offset + 7]!;
    expect(mtu).toBe(1460);
  });

  it('cuts a GSO super-frame into MSS-sized encapsulated segments with valid checksums', () => {
    const { io, counters } = setup();
    const payload = Uint8Array.from({ length: 4000 }, (_, k) => k & 0xff);
    const frame = tcp4(40003, 0x18, payload);
    const out = io.inject([Uint8Array.from([...vnetHeader(1400), ...frame])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(out).toHaveLength(3);
    expect(counters[Counter.gsoSegmented]).toBe(1);
    let seq = 1000;
    const got: number[] = [];
    for (const f of out) {
      expect(f[14 + 9]).toBe(4); // outer IPv4, protocol 4
      expect(f.length - 14).toBeLessThanOrEqual(1500);
      // Rebuild a plain frame of the inner packet to check its TCP checksum.
      const plain = Uint8Array.from([...f.subarray(0, 12), 0x08, 0x00, ...f.subarray(34)]);
      const p = parsed(plain);
      expect(l4Checksum(plain, p)).toBe((plain[p.l4Offset + 16]! << 8) | plain[p.l4Offset + 17]!);
      const s = (plain[p.l4Offset + 4]! << 24) | (plain[p.l4Offset + 5]! << 16) | (plain[p.l4Offset + 6]! << 8) | plain[p.l4Offset + 7]!;
      expect(s >>> 0).toBe(seq);
      seq += plain.length - p.payloadOffset;
      got.push(...plain.subarray(p.payloadOffset));
    }
    expect(Uint8Array.from(got)).toEqual(payload);
  });
});

describe('engine: UDP GSO (UDP_SEGMENT, as QUIC stacks send) to an IPIP real', () => {
  const udpGso = (payloadBytes: number, gsoSize: number) => {
    const vnet = new Uint8Array(10);
    vnet[0] = 1; // NEEDS_CSUM
    vnet[1] = 5; // GSO_UDP_L4
    vnet[4] = gsoSize & 0xff;
    vnet[5] = gsoSize >> 8;
    const payload = Uint8Array.from({ length: payloadBytes }, (_, k) => (k * 7) & 0xff);
    const frame = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, df: true, id: 70 }, udp({ sport: 4433, dport: 53 }, payload, { src: CLIENT, dst: VIP })));
    return { payload, frame: Uint8Array.from([...vnet, ...frame]) };
  };

  it('cuts the train into the sender\'s datagrams (never re-cut), each encapsulated with its UDP length and a valid checksum', () => {
    const { io, counters } = setup();
    const { payload, frame } = udpGso(3400, 1200);
    const out = io.inject([frame], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(counters[Counter.gsoSegmented]).toBe(1);
    expect(out.map((f) => f.length - 14 - 20 - 20 - 8)).toEqual([1200, 1200, 1000]);
    const got: number[] = [];
    out.forEach((f, i) => {
      expect(f[14 + 9]).toBe(4); // outer IPv4, protocol 4 (IPIP)
      const plain = Uint8Array.from([...f.subarray(0, 12), 0x08, 0x00, ...f.subarray(34)]);
      const p = parsed(plain);
      expect(p.ipProtocol).toBe(17);
      expect((plain[p.l4Offset + 4]! << 8) | plain[p.l4Offset + 5]!).toBe(8 + plain.length - p.payloadOffset);
      expect((plain[p.l3Offset + 4]! << 8) | plain[p.l3Offset + 5]!).toBe(70 + i); // IPv4 ID per datagram
      expect(l4Checksum(plain, p)).toBe((plain[p.l4Offset + 6]! << 8) | plain[p.l4Offset + 7]!);
      got.push(...plain.subarray(p.payloadOffset));
    });
    expect(Uint8Array.from(got)).toEqual(payload);
  });

  it('sends datagrams without DF that are too big for the tunnel as outer fragments, as each sent alone goes', () => {
    const { io, counters } = setup();
    const vnet = Uint8Array.from([1, 5, 0, 0, 1472 & 0xff, 1472 >> 8, 0, 0, 0, 0]);
    const train = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, df: false, id: 70 }, udp({ sport: 4433, dport: 53 }, new Uint8Array(2 * 1472), { src: CLIENT, dst: VIP })));
    const out = io.inject([Uint8Array.from([...vnet, ...train])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(counters[Counter.gsoSegmented]).toBe(1);
    // Two datagrams of 1500 bytes, each 1520 with the outer header: two outer fragments each.
    expect(out).toHaveLength(4);
    const frags = out.map((f) => parsed(f));
    for (const f of out) expect(f.length - 14).toBeLessThanOrEqual(1500);
    expect(frags.map((f) => [f.moreFragments, f.fragmentOffset > 0 ? 1 : 0])).toEqual([[1, 0], [0, 1], [1, 0], [0, 1]]);
    expect(frags[0]!.fragmentId).toBe(frags[1]!.fragmentId);
    expect(frags[2]!.fragmentId).toBe(frags[3]!.fragmentId);
    expect(frags[0]!.fragmentId).not.toBe(frags[2]!.fragmentId);
  });

  it('sends IPv6 datagrams at the 1280 floor over a tunnel MTU under 1320 as outer fragments (a packet too big of 1280 would change nothing)', () => {
    const { io } = setup(1500, 8, 1300);
    const vnet = Uint8Array.from([1, 5, 0, 0, 1232 & 0xff, 1232 >> 8, 0, 0, 0, 0]);
    const train = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport: 4433, dport: 443 }, new Uint8Array(2 * 1232), { src: CLIENT6, dst: VIP6 })));
    const out = io.inject([Uint8Array.from([...vnet, ...train])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(out).toHaveLength(4);
    for (const f of out) expect(f.length - 14).toBeLessThanOrEqual(1300);
    // Each outer packet carries a fragment header (next header 44).
    for (const f of out) expect(f[14 + 6]).toBe(44);
  });

  it('answers datagrams too big for the tunnel with fragmentation-needed, MTU 1480, instead of cutting them', () => {
    const { io, counters } = setup();
    const out = io.inject([udpGso(2 * 1460, 1460).frame], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(out).toHaveLength(1);
    const m = parsed(out[0]!);
    expect([m.icmpType, m.icmpCode]).toEqual([3, 4]);
    expect((out[0]![m.l4Offset + 6]! << 8) | out[0]![m.l4Offset + 7]!).toBe(1480);
    expect(counters[Counter.gsoSegmented]).toBe(0);
    // It quotes the first datagram as the client sent it (20 + 8 + 1460), not the merged train
    // (2,948), with its header checksum made again.
    const quote = m.l4Offset + 8;
    expect((out[0]![quote + 2]! << 8) | out[0]![quote + 3]!).toBe(1488);
    expect(ipv4HeaderChecksum(out[0]!, quote, 20)).toBe((out[0]![quote + 10]! << 8) | out[0]![quote + 11]!);
  });

  it('drops a GSO type that does not match the packet (TCP segmentation asked of a UDP datagram) as gsoUnsupported', () => {
    const { io } = setup();
    const { frame } = udpGso(3400, 1200);
    frame[1] = 1; // GSO_TCPV4
    io.inject([frame], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.gsoUnsupported);
  });
});

describe('engine: GSO frames beyond a batch\'s extra frames, and the IPv6 flow label', () => {
  const gso = (sport: number, payloadBytes: number, gsoSize: number) =>
    Uint8Array.from([...vnetHeader(gsoSize), ...tcp4(sport, 0x18, Uint8Array.from({ length: payloadBytes }, (_, k) => (k + sport) & 0xff))]);

  it('segments a frame all or nothing: one that no longer fits the extra frames is dropped whole, nothing queued is overwritten', () => {
    const { io, counters } = setup(1500, 16);
    // 10 frames of 60 segments against 512 extra frames: 8 fit (480), the 9th and 10th do not.
    const frames = Array.from({ length: 10 }, (_, i) => gso(5000 + i, 6000, 100));
    const out = io.inject(frames, frames.map(() => GSO_FLAGS));
    expect(Array.from(io.lastVerdicts().slice(0, 10))).toEqual([...Array(8).fill(VERDICT_CONSUMED), -DropReason.batchFull, -DropReason.batchFull]);
    expect(out).toHaveLength(480);
    expect(counters[Counter.gsoSegmented]).toBe(8);
    const segmentsBySport = new Map<number, number>();
    for (const f of out) {
      expect(f[14 + 9]).toBe(4);
      expect(hex(f.subarray(14 + 16, 14 + 20))).toBe('0a01000b'); // outer destination: the real
      const plain = Uint8Array.from([...f.subarray(0, 12), 0x08, 0x00, ...f.subarray(34)]);
      const p = parsed(plain);
      expect(l4Checksum(plain, p)).toBe((plain[p.l4Offset + 16]! << 8) | plain[p.l4Offset + 17]!);
      segmentsBySport.set(p.srcPort, (segmentsBySport.get(p.srcPort) ?? 0) + 1);
    }
    expect([...segmentsBySport.entries()].sort((a, b) => a[0] - b[0])).toEqual(Array.from({ length: 8 }, (_, i) => [5000 + i, 60]));
  });

  it('sends a DF-clear packet as all its outer fragments or drops it whole (batch_full) when the extra frames are used up', () => {
    const { io, counters } = setup(1500, 64);
    // 8 GSO frames take 480 of the 512 extra frames; each DF-clear 1500-byte packet needs one more
    // (its second fragment): 32 fit, the rest are dropped whole, never sent as a first fragment alone.
    const frames = [...Array.from({ length: 8 }, (_, i) => gso(5000 + i, 6000, 100)), ...Array.from({ length: 40 }, (_, i) => tcp4(7000 + i, 0x10, new Uint8Array(1460), false))];
    const out = io.inject(frames, frames.map((_, i) => (i < 8 ? GSO_FLAGS : 0)));
    const verdicts = Array.from(io.lastVerdicts().slice(8, 48));
    expect(verdicts).toEqual([...Array(32).fill(VERDICT_TX), ...Array(8).fill(-DropReason.batchFull)]);
    const firsts = out.map((f) => parsed(f)).filter((p) => p.moreFragments === 1).length;
    const tails = out.map((f) => parsed(f)).filter((p) => p.fragmentOffset > 0).length;
    expect([firsts, tails]).toEqual([32, 32]);
    expect(counters[Counter.dropBase + DropReason.batchFull]).toBe(8);
  });

  it('cuts a frame of more than 64 segments (a client MSS of 536), and a DF-clear frame too big for the tunnel into segments that fit', () => {
    const { io } = setup(1500, 16);
    const small = io.inject([gso(6000, 40_000, 536)], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(small).toHaveLength(75);
    // DF clear, segments of 1460 bytes: with 20 bytes of outer header they would be 1520; cut at 1440.
    const payload = Uint8Array.from({ length: 5840 }, (_, k) => (k * 7) & 0xff);
    const out = io.inject([Uint8Array.from([...vnetHeader(1460), ...tcp4(6001, 0x18, payload, false)])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    const got: number[] = [];
    for (const f of out) {
      expect(f.length - 14).toBeLessThanOrEqual(1500);
      const plain = Uint8Array.from([...f.subarray(0, 12), 0x08, 0x00, ...f.subarray(34)]);
      const p = parsed(plain);
      expect(l4Checksum(plain, p)).toBe((plain[p.l4Offset + 16]! << 8) | plain[p.l4Offset + 17]!);
      got.push(...plain.subarray(p.payloadOffset));
    }
    expect(out).toHaveLength(5); // 4 x 1440 + 80
    expect(Uint8Array.from(got)).toEqual(payload);
  });

  it('gives every packet of an IPv6 flow one outer flow label, derived from the flow', () => {
    const { io } = setup();
    const pkt6 = (sport: number, flags: number, payload: number[] = []) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport, dport: 80, flags }, payload, { src: CLIENT6, dst: VIP6 })));
    const label = (f: Uint8Array) => (((f[15]! & 0x0f) << 16) | (f[16]! << 8) | f[17]!) >>> 0;
    const flow = io.inject([pkt6(1000, 0x02), pkt6(1000, 0x10), pkt6(1000, 0x18, [1, 2, 3])]).map(label);
    expect(new Set(flow).size).toBe(1);
    const others = io.inject([pkt6(1001, 0x02), pkt6(1002, 0x02), pkt6(1003, 0x02)]).map(label);
    expect(new Set([...others, flow[0]]).size).toBe(4);
  });
});

describe('engine: ICMP toward a VIP', () => {
  it('answers an echo request itself', () => {
    const { io, counters } = setup();
    const req = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmpEcho({ id: 5, seq: 1 }, [1, 2, 3])));
    const [reply] = io.inject([req]);
    const p = parsed(reply!);
    expect(p.icmpType).toBe(0);
    expect(hex(reply!.subarray(0, 12))).toBe('02000000000c' + '020000000001');
    expect(counters[Counter.icmpEchoReplied]).toBe(1);
  });

  it('forwards a fragmentation-needed about a reply from the VIP to the real of that flow', () => {
    const { io } = setup();
    io.inject([tcp4(41000, 0x02)]); // the flow exists, on 10.1.0.11
    // A router on the way back to the client says the real's reply (VIP:80 -> client:41000) was too big.
    const quoted = ipv4({ src: VIP, dst: CLIENT, proto: 6 }, tcp({ sport: 80, dport: 41000, flags: 0x10 }, [], { src: VIP, dst: CLIENT }));
    const msg = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '198.51.100.1', dst: VIP, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, quoted.subarray(0, 28))));
    const [out] = io.inject([msg]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(hex(out!.subarray(14 + 16, 14 + 20))).toBe('0a01000b'); // outer destination: the real
  });

  it('forwards a port unreachable and a time exceeded about a reply to the real of that flow, as IPVS and Katran do', () => {
    const { io, counters } = setup();
    io.inject([tcp4(41000, 0x02)]); // the flow exists, on 10.1.0.11
    const quoted = ipv4({ src: VIP, dst: CLIENT, proto: 6 }, tcp({ sport: 80, dport: 41000, flags: 0x10 }, [], { src: VIP, dst: CLIENT }));
    for (const [type, code] of [[3, 3], [3, 1], [11, 0]] as const) {
      const msg = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '198.51.100.1', dst: VIP, proto: 1 }, icmp({ type, code, rest: 0 }, quoted.subarray(0, 28))));
      const [out] = io.inject([msg]);
      expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
      expect(hex(out!.subarray(14 + 16, 14 + 20))).toBe('0a01000b');
    }
    expect(counters[Counter.dropBase + DropReason.icmpToVip]).toBe(0);
  });

  it('drops a fragmentation-needed for a service whose reals have no MAC yet as neighbor_unknown, as the flow\'s own packets', () => {
    const { io, counters } = setup(1500, 8, null, null);
    const quoted = ipv4({ src: VIP, dst: CLIENT, proto: 6 }, tcp({ sport: 80, dport: 41000, flags: 0x10 }, [], { src: VIP, dst: CLIENT }));
    const msg = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: '198.51.100.1', dst: VIP, proto: 1 }, icmp({ type: 3, code: 4, rest: 1400 }, quoted.subarray(0, 28))));
    expect(io.inject([msg])).toHaveLength(0);
    expect(io.inject([tcp4(41000, 0x10)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.neighborUnknown]).toBe(2);
    expect(counters[Counter.dropBase + DropReason.noRealAvailable]).toBe(0);
  });

  it('drops other ICMP to a VIP and counts it', () => {
    const { io, counters } = setup();
    const other = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmp({ type: 13 })));
    expect(io.inject([other])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.icmpToVip]).toBe(1);
  });

  it('answers ICMPv6 echo to an IPv6 VIP', () => {
    const { io } = setup();
    const req = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58 }, icmpv6({ type: 128, rest: 0x00050001 }, [9], { src: CLIENT6, dst: VIP6 })));
    const [reply] = io.inject([req]);
    expect(parsed(reply!).icmpType).toBe(129);
  });

  it('leaves the fragments of a large ping to a VIP to the kernel, over IPv4 and IPv6 (they were counted as icmp_to_vip drops over IPv6)', () => {
    const { io, counters } = setup();
    const echo4 = icmpEcho({ id: 1, seq: 1 }, new Uint8Array(2000));
    const echo6 = icmpv6({ type: 128, rest: 0x10001 }, new Uint8Array(2000), { src: CLIENT6, dst: VIP6 });
    const frames = [
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1, id: 5, mf: true }, echo4.subarray(0, 1480))),
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1, id: 5, fragOffset: 1480 }, echo4.subarray(1480))),
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58, extensionHeaders: [ipv6Fragment({ offset: 0, more: true, id: 9 })] }, echo6.subarray(0, 1448))),
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58, extensionHeaders: [ipv6Fragment({ offset: 1448, more: false, id: 9 })] }, echo6.subarray(1448))),
    ];
    expect(io.inject(frames)).toHaveLength(0);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_PASS, VERDICT_PASS, VERDICT_PASS, VERDICT_PASS]);
    expect(counters[Counter.dropBase + DropReason.icmpToVip]).toBe(0);
  });

  it('leaves neighbour discovery to an IPv6 VIP (types 133-137, e.g. a unicast NUD probe) to the kernel', () => {
    const { io, counters } = setup();
    for (const type of [133, 134, 135, 136, 137]) {
      const nd = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: 'fe80::1', dst: VIP6, nextHeader: 58, hopLimit: 255 }, icmpv6({ type, rest: 0 }, Array.from({ length: 16 }, () => 0), { src: 'fe80::1', dst: VIP6 })));
      expect(io.inject([nd]), String(type)).toHaveLength(0);
      expect(io.lastVerdicts()[0], String(type)).toBe(VERDICT_PASS);
    }
    expect(counters[Counter.dropBase + DropReason.icmpToVip]).toBe(0);
  });
});

describe('engine: IP fragments', () => {
  it('sends later fragments where the first one went, and drops orphans', () => {
    const { io, counters } = setup();
    const data = udp({ sport: 5000, dport: 53 }, new Uint8Array(64), { src: CLIENT, dst: VIP });
    const first = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 77, mf: true }, data.subarray(0, 40)));
    const second = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 77, fragOffset: 40 }, data.subarray(40)));
    const orphan = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 78, fragOffset: 40 }, data.subarray(40)));
    const out = io.inject([first, second, orphan]);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_TX, VERDICT_TX, -DropReason.fragmentUnplaceable]);
    expect(hex(out[0]!.subarray(30, 34))).toBe('0a01000c');
    expect(hex(out[1]!.subarray(30, 34))).toBe('0a01000c');
    expect(counters[Counter.dropBase + DropReason.fragmentUnplaceable]).toBe(1);
  });

  it('sends a later fragment after its first across a reload that reorders the services, and never to a reused id of another VIP', () => {
    const { engine, io, counters } = setup();
    const data = udp({ sport: 5000, dport: 53 }, new Uint8Array(64), { src: CLIENT, dst: VIP });
    const fragment = (id: number, offset: number) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id, mf: offset === 0, fragOffset: offset }, offset === 0 ? data.subarray(0, 40) : data.subarray(40)));
    io.inject([fragment(90, 0), fragment(91, 0)]);
    // The reload: the same reals with the same ids, services in the opposite order.
    const cfg = config();
    const idOf: Record<string, number> = { '10.1.0.11': 0, '10.1.0.12': 1, 'fd01::11': 2, 'fd01::12': 3 };
    const view = (s: Config['services'][number], address: (a: string) => number): ServiceView => ({
      config: s,
      reals: s.reals.map((r) => ({ id: address(r.address), address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: parseMac(HOP_MAC) })),
    });
    const builder = new SnapshotBuilder();
    engine.setSnapshot(builder.build([...cfg.services].reverse().map((s) => view(s, (a) => idOf[a]!)), 0, MAX_REAL_IDS, { v4: '10.0.0.2', v6: 'fd00::2' }).snapshot);
    const [out] = io.inject([fragment(90, 40)]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(hex(out!.subarray(30, 34))).toBe('0a01000c'); // outer destination 10.1.0.12, as the first fragment's
    // dns's real removed and its id 1 reused by web6's real: the other VIP's real never gets the fragment.
    const swapped: Record<string, number> = { '10.1.0.11': 0, 'fd01::11': 1, 'fd01::12': 2 };
    const withoutDns = cfg.services.filter((s) => s.name !== 'dns');
    engine.setSnapshot(builder.build(withoutDns.map((s) => view(s, (a) => swapped[a]!)), 0, MAX_REAL_IDS, { v4: '10.0.0.2', v6: 'fd00::2' }).snapshot);
    expect(io.inject([fragment(91, 40)])).toHaveLength(0);
    expect(counters[Counter.dropBase + DropReason.fragmentUnplaceable]).toBe(1);
  });

  it('handles IPv6 fragments with a fragment header the same way', () => {
    const { io } = setup();
    const seg = tcp({ sport: 7, dport: 80, flags: 0x10 }, new Uint8Array(40), { src: CLIENT6, dst: VIP6 });
    const f1 = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6, extensionHeaders: [ipv6Fragment({ offset: 0, more: true, id: 9 })] }, seg.subarray(0, 32)));
    const f2 = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6, extensionHeaders: [ipv6Fragment({ offset: 32, more: false, id: 9 })] }, seg.subarray(32)));
    io.inject([f1, f2]);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_TX, VERDICT_TX]);
  });

  it('follows IPv6 later fragments whose first fragment has destination options after the fragment header', () => {
    const { io, counters } = setup();
    const segment = tcp({ sport: 5000, dport: 80, flags: 0x10 }, new Uint8Array(100), { src: CLIENT6, dst: VIP6 });
    // The fragmentable part: destination options (next header TCP), then the TCP segment. Every
    // fragment's Fragment header names destination options (60); only the first shows TCP.
    const fragmentable = Uint8Array.from([...(ipv6Options(60).bytes as Uint8Array), ...segment]);
    fragmentable[0] = 6;
    const frame = (offset: number, more: boolean, bytes: Uint8Array) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 60, extensionHeaders: [ipv6Fragment({ offset, more, id: 77 })] }, bytes));
    const out = io.inject([frame(0, true, fragmentable.subarray(0, 64)), frame(64, false, fragmentable.subarray(64))]);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_TX, VERDICT_TX]);
    expect(out).toHaveLength(2);
    expect(counters[Counter.dropBase + DropReason.fragmentUnplaceable]).toBe(0);
    // One outer flow label for the datagram (RFC 6437): the first fragment shows TCP, a later one 60.
    const label = (f: Uint8Array) => (((f[15]! & 0x0f) << 16) | (f[16]! << 8) | f[17]!) >>> 0;
    expect(label(out[0]!)).not.toBe(0);
    expect(label(out[1]!)).toBe(label(out[0]!));
  });
});

// Edges of the IPIP path and of the engine's own replies, each found by a review with a vector.
describe('engine: 6in6 on a link of MTU 1300 (tunnel MTU 1260, under IPv6\'s 1280)', () => {
  const segment6 = (payload: number) =>
    ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport: 4000, dport: 80, flags: 0x10, seq: 1 }, new Uint8Array(payload), { src: CLIENT6, dst: VIP6 })));

  it('sends a plain 1280-byte packet in outer fragments (RFC 2473 7.1)', () => {
    const { io } = setup(1300);
    const out = io.inject([segment6(1220)]); // 40 + 20 + 1220 = 1280
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(out).toHaveLength(2);
  });

  it('cuts a GSO frame of 1280-byte segments smaller instead of telling a client already at 1280 to go lower', () => {
    const { io, counters } = setup(1300);
    const out = io.inject([Uint8Array.from([...vnetHeader(1220, true), ...segment6(3 * 1220)])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(counters[Counter.icmpTooBigSent]).toBe(0);
    // 3660 bytes in segments of 1300 - 40 - 60 = 1200: four, each exactly within the link MTU.
    expect(out.map((f) => f.length - 14)).toEqual([1300, 1300, 1300, 40 + 60 + 60]);
  });

  it('still tells a client whose segments exceed 1280 to go down to 1280, quoting its first segment', () => {
    const { io, counters } = setup(1300);
    const out = io.inject([Uint8Array.from([...vnetHeader(1400, true), ...segment6(3 * 1400)])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(counters[Counter.icmpTooBigSent]).toBe(1);
    // The quoted IPv6 header's payload length: 20 (TCP) + 1400, the merged frame's 4,220 before.
    const quote = parsed(out[0]!).l4Offset + 8;
    expect((out[0]![quote + 4]! << 8) | out[0]![quote + 5]!).toBe(1420);
  });
});

describe('engine: a DF-set UDP datagram in two 1500-byte fragments to an IPIP real (DF on every fragment)', () => {
  it('gets one fragmentation-needed, about its first fragment, none about the later one (RFC 1122 3.2.2)', () => {
    const { io, counters } = setup();
    const datagram = udp({ sport: 5000, dport: 53 }, new Uint8Array(2952), { src: CLIENT, dst: VIP }); // 2960 bytes = 2 x 1480
    const fragment = (offset: number) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 42, df: true, mf: offset === 0, fragOffset: offset }, datagram.subarray(offset, offset + 1480)));
    expect(io.inject([fragment(0)])).toHaveLength(1); // the fragmentation-needed
    expect(io.inject([fragment(1480)])).toHaveLength(0);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(counters[Counter.icmpTooBigSent]).toBe(1);
  });
});

describe('engine: a batch whose extra buffer (1 MiB) runs out before its 512 extra frames (MTU 9000, 64 KiB GSO frames)', () => {
  it('drops the frames that no longer fit as batch_full, as when the extra frames run out', () => {
    const { io, counters } = setup(9000, 20);
    const frames = Array.from({ length: 20 }, (_, i) =>
      Uint8Array.from([
        ...vnetHeader(8940),
        ...ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 6, df: true }, tcp({ sport: 3000 + i, dport: 80, flags: 0x10, seq: 1 }, new Uint8Array(64_000), { src: CLIENT, dst: VIP }))),
      ]),
    );
    const out = io.inject(frames, frames.map(() => GSO_FLAGS));
    const verdicts = [...io.lastVerdicts()];
    const consumed = verdicts.filter((v) => v === VERDICT_CONSUMED).length;
    expect(consumed).toBeGreaterThan(0);
    expect(out.length).toBeLessThan(512); // the extra frames are not what ran out
    expect(verdicts.slice(consumed)).toEqual(Array(20 - consumed).fill(-DropReason.batchFull));
    expect(counters[Counter.dropBase + DropReason.gsoUnsupported]).toBe(0);
  });
});

describe('engine: echo replies', () => {
  it('carry a checksum that verifies when the ICMPv4 reply is all zeros (id 0, seq 0, no data): 0xffff, not 0', () => {
    const { io } = setup();
    const [reply] = io.inject([ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmpEcho({ id: 0, seq: 0 })))]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(hex(reply!.subarray(34, 42))).toBe('0000ffff00000000');
    expect(onesSum(reply!.subarray(34, 42))).toBe(0xffff);
  });
});
