// Engine vectors for three data-plane review findings: a partial checksum the engine cannot finish
// (it must not leave a tunnel or an echo reply as if complete), the extra-buffer bytes a GSO frame
// that fails half-way gives back, and later fragments of a datagram no service could have taken.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { Engine } from '../../src/dataplane/engine.js';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { l4Checksum } from '../../src/dataplane/checksum.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { ParsedPacket, PARSE_OK } from '../../src/dataplane/parsed-packet.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { createPacketBatch, FRAME_CSUM_PARTIAL, FRAME_GSO, FRAME_HAS_VNET_HDR, VERDICT_CONSUMED, VERDICT_PASS, VERDICT_TX } from '../../src/io/packet-io.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { parseMac } from '../../src/control/addresses.js';
import { ETH_IPV4, ETH_IPV6, ethernet, hex, icmpEcho, ipBytes, ipv4, ipv6, ipv6Options, ipv6Fragment, onesSum, pseudoHeader, tcp, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const REAL_MAC = '02:00:00:00:00:99';
const VIP = '10.0.0.100';
const VIP6 = 'fd00::100';
const CLIENT = '192.0.2.7';
const CLIENT6 = '2001:db8::7';
/** The final destination of an IPv6 segment routing header whose next segment is the VIP. */
const FINAL6 = '2001:db8:f::1';
const TIMEOUTS = { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 };

/** An engine whose services are given as YAML; every real up with REAL_MAC, `tunnelMtu` by address. */
function engineFor(services: string, opts: { mtu?: number; tunnelMtu?: Record<string, number> } = {}) {
  const r = parseConfigText(`interface: eth0\ntunnel: { sourceV4: 10.0.0.2, sourceV6: "fd00::2" }\nservices:\n${services}`);
  if (!r.ok) throw new Error(r.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  const counters = createCounters();
  const engine = new Engine({ flowCapacity: 1024, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS, counters, localMac: parseMac(LB_MAC), mtu: opts.mtu ?? 1500 });
  let id = 0;
  const views: ServiceView[] = r.config.services.map((s) => ({
    config: s,
    reals: s.reals.map((x) => ({ id: id++, address: x.address, weight: x.weight, intent: x.state, forwarding: x.forwarding, health: 'up', removed: false, mac: parseMac(REAL_MAC), tunnelMtu: opts.tunnelMtu?.[x.address] ?? null })),
  }));
  engine.setSnapshot(new SnapshotBuilder().build(views, 0, MAX_REAL_IDS, { v4: '10.0.0.2', v6: 'fd00::2' }).snapshot);
  return { engine, counters };
}

const service = (name: string, vip: string, port: number, protocol: 'tcp' | 'udp', forwarding: 'l2' | 'ipip', real: string) =>
  `  - name: ${name}\n    vip: "${vip}"\n    port: ${port}\n    protocol: ${protocol}\n    forwarding: ${forwarding}\n    reals:\n      - address: ${real}\n`;

/**
 * One frame with a virtio_net_hdr through the engine, as the afpacket backend lays it out (the
 * header right before the frame); returns the verdict, and for a sent frame its bytes and the
 * virtio_net_hdr before them (what the kernel acts on).
 */
function sendOne(engine: Engine, vnet: Uint8Array, frame: Uint8Array, flags: number): { verdict: number; out: Uint8Array | null; outVnet: Uint8Array | null } {
  const batch = createPacketBatch(1);
  batch.buf = new Uint8Array(4096);
  batch.headroom = 128;
  batch.buf.set(vnet, 128 - 10);
  batch.buf.set(frame, 128);
  batch.offsets[0] = 128;
  batch.lengths[0] = frame.length;
  batch.flags[0] = flags;
  batch.count = 1;
  engine.processBatch(batch, 1_000_000);
  const verdict = batch.verdicts[0]!;
  if (verdict !== VERDICT_TX) return { verdict, out: null, outVnet: null };
  const at = batch.txOffsets[0]!;
  return { verdict, out: batch.buf.slice(at, at + batch.txLengths[0]!), outVnet: batch.buf.slice(at - 10, at) };
}

/** A type 4 routing header (RFC 8754 SRH) with segments left 1: the VIP now, FINAL6 at the end. */
function srhToFinal(): { type: number; bytes: Uint8Array } {
  const b = new Uint8Array(40);
  b[1] = 4; // 4 x 8 bytes after the first 8
  b[2] = 4; // routing type: segment routing
  b[3] = 1; // segments left
  b[4] = 1; // last entry
  b.set(ipBytes(FINAL6), 8); // segment list [0]: the final destination
  b.set(ipBytes(VIP6), 24); // segment list [1]: the VIP, the header's destination now
  return { type: 43, bytes: b };
}

/**
 * A TCP SYN from CLIENT6 to VIP6:80 through the SRH, from a sender with checksum offload: it left
 * in the field the pseudo-header sum over the FINAL destination (RFC 8200 8.1), 0x5ba3, which is
 * not the one over the header's destination (0x2bdb) that the engine completes from.
 */
function partialSynThroughSrh(): { frame: Uint8Array; vnet: Uint8Array } {
  const segment = tcp({ sport: 4000, dport: 80, flags: 0x02, seq: 1 }, [], { src: CLIENT6, dst: FINAL6 });
  const partial = onesSum(pseudoHeader({ src: CLIENT6, dst: FINAL6 }, 6, segment.length));
  segment[16] = partial >> 8;
  segment[17] = partial & 0xff;
  const frame = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6, extensionHeaders: [srhToFinal()] }, segment));
  // NEEDS_CSUM, csum_start 94 (14 + 40 + 40: the TCP header), csum_offset 16.
  return { frame, vnet: Uint8Array.from([1, 0, 0, 0, 0, 0, 94, 0, 16, 0]) };
}

const PARTIAL = FRAME_HAS_VNET_HDR | FRAME_CSUM_PARTIAL;

describe('engine: a partial checksum (NEEDS_CSUM) that the engine cannot finish', () => {
  it('is dropped as bad_partial_checksum toward an IPIP real, not tunnelled with the pseudo-header sum where the checksum belongs', () => {
    const { engine, counters } = engineFor(service('web6', VIP6, 80, 'tcp', 'ipip', 'fd01::11'));
    const { frame, vnet } = partialSynThroughSrh();
    expect(hex(frame.subarray(94 + 16, 94 + 18))).toBe('5ba3');
    // Before: sent with the vnet flags byte cleared and 5ba3 in the inner TCP checksum field.
    const sent = sendOne(engine, vnet, frame, PARTIAL);
    expect(sent.verdict).toBe(-DropReason.badPartialChecksum);
    expect(counters[Counter.dropBase + DropReason.badPartialChecksum]).toBe(1);
  });

  it('still tunnels a partial checksum it can finish, completed and the flag cleared', () => {
    const { engine, counters } = engineFor(service('web6', VIP6, 80, 'tcp', 'ipip', 'fd01::11'));
    const segment = tcp({ sport: 4001, dport: 80, flags: 0x02, seq: 1 }, [], { src: CLIENT6, dst: VIP6 });
    const complete = hex(segment.subarray(16, 18));
    const partial = onesSum(pseudoHeader({ src: CLIENT6, dst: VIP6 }, 6, segment.length));
    segment[16] = partial >> 8;
    segment[17] = partial & 0xff;
    const frame = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, segment));
    const sent = sendOne(engine, Uint8Array.from([1, 0, 0, 0, 0, 0, 54, 0, 16, 0]), frame, PARTIAL);
    expect(sent.verdict).toBe(VERDICT_TX);
    expect(sent.outVnet![0]).toBe(0);
    // Outer IPv6 (40 bytes) after Ethernet: the inner TCP checksum at 14 + 40 + 40 + 16.
    expect(hex(sent.out!.subarray(110, 112))).toBe(complete);
    expect(counters[Counter.dropBase + DropReason.badPartialChecksum]).toBe(0);
  });

  it('leaves the flag and the field as they are toward an L2 real: the kernel finishes it on the way out, over the final destination', () => {
    const { engine } = engineFor(service('web6', VIP6, 80, 'tcp', 'l2', 'fd00::11'));
    const { frame, vnet } = partialSynThroughSrh();
    const sent = sendOne(engine, vnet, frame, PARTIAL);
    expect(sent.verdict).toBe(VERDICT_TX);
    expect(hex(sent.outVnet!)).toBe('0100000000005e001000'); // NEEDS_CSUM, csum_start 94, csum_offset 16
    expect(hex(sent.out!.subarray(110, 112))).toBe('5ba3');
    // What skb_checksum_help stores: the sum from csum_start to the end, the field included.
    const wire = Uint8Array.from(sent.out!);
    const finished = ~onesSum(wire.subarray(94)) & 0xffff;
    expect(finished).toBe(0x4469);
    wire[110] = finished >> 8;
    wire[111] = finished & 0xff;
    // It verifies over the final destination's pseudo-header, as the receiver at FINAL6 checks it.
    expect(onesSum(pseudoHeader({ src: CLIENT6, dst: FINAL6 }, 6, wire.length - 94), wire.subarray(94))).toBe(0xffff);
  });

  it('drops an echo request whose partial checksum it cannot finish, rather than answer with a checksum that does not verify', () => {
    // ICMP over IPv4 has no pseudo-header: a partial checksum would hold 0 (the sum's seed), and
    // completePartialChecksum never finishes one. Before: the flag was cleared and the reply's
    // checksum updated from that 0 (RFC 1624): 0x0800 where 0xe9c4 belongs.
    const { engine, counters } = engineFor(service('web', VIP, 80, 'tcp', 'ipip', '10.1.0.11'));
    const request = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmpEcho({ id: 0x1234, seq: 1 }, [1, 2, 3, 4])));
    expect(hex(request.subarray(36, 38))).toBe('e1c4'); // the request's complete checksum
    request[36] = 0;
    request[37] = 0;
    const sent = sendOne(engine, Uint8Array.from([1, 0, 0, 0, 0, 0, 34, 0, 2, 0]), request, PARTIAL); // csum_start 34, csum_offset 2
    expect(sent.verdict).toBe(-DropReason.badPartialChecksum);
    expect(counters[Counter.icmpEchoReplied]).toBe(0);
    expect(counters[Counter.dropBase + DropReason.badPartialChecksum]).toBe(1);
  });
});

describe('engine: a GSO frame that fails half-way gives back the extra-buffer bytes of what it had queued', () => {
  it('leaves room for a later GSO frame of the batch once a UDP train in outer fragments ran out of room (it was dropped as batch_full)', () => {
    // MTU 9000; the UDP real's route MTU 4000: each 9000-byte datagram of the train goes as three
    // outer fragments. 15 TCP GSO frames of 64 KB (8 segments each, to the other real) fill
    // most of the 1 MiB extra buffer: the train's 7 datagrams fit, their fragments do not all.
    const { engine, counters } = engineFor(service('web', VIP, 80, 'tcp', 'ipip', '10.1.0.11') + service('dns', VIP, 53, 'udp', 'ipip', '10.1.0.12'), {
      mtu: 9000,
      tunnelMtu: { '10.1.0.12': 4000 },
    });
    const io = new MemoryIo({ localMac: parseMac(LB_MAC), slotBytes: 70_000, batchCapacity: 32 });
    io.start((b) => engine.processBatch(b, 1_000_000));
    const vnet = (gsoSize: number, gsoType: number) => [1, gsoType, 0, 0, gsoSize & 0xff, gsoSize >> 8, 0, 0, 0, 0];
    const tcpGso = (sport: number, bytes: number, gsoSize: number) =>
      Uint8Array.from([...vnet(gsoSize, 1), ...ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 6, df: true }, tcp({ sport, dport: 80, flags: 0x10, seq: 1 }, new Uint8Array(bytes), { src: CLIENT, dst: VIP })))]);
    // UDP_SEGMENT (gso type 5), DF clear: 7 datagrams of 8972 bytes.
    const train = Uint8Array.from([...vnet(8972, 5), ...ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, df: false }, udp({ sport: 5000, dport: 53 }, new Uint8Array(7 * 8972), { src: CLIENT, dst: VIP })))]);
    const later = tcpGso(6000, 20_000, 1400);
    const frames = [...Array.from({ length: 15 }, (_, i) => tcpGso(3000 + i, 64_000, 8940)), train, later];
    const out = io.inject(frames, frames.map(() => FRAME_HAS_VNET_HDR | FRAME_GSO | FRAME_CSUM_PARTIAL));
    // Before: the train's queued fragments kept their bytes and the later frame was batch_full too.
    expect([...io.lastVerdicts()]).toEqual([...Array(15).fill(VERDICT_CONSUMED), -DropReason.batchFull, VERDICT_CONSUMED]);
    expect(counters[Counter.dropBase + DropReason.batchFull]).toBe(1);
    // 15 x 8 segments, then the later frame's 15 (14 x 1400 + 400), whole and unbroken.
    expect(out).toHaveLength(135);
    const got: number[] = [];
    for (const f of out.slice(120)) {
      const plain = Uint8Array.from([...f.subarray(0, 12), 0x08, 0x00, ...f.subarray(34)]);
      const p = new ParsedPacket();
      expect(parseFrame(plain, 0, plain.length, p)).toBe(PARSE_OK);
      expect(p.srcPort).toBe(6000);
      expect(l4Checksum(plain, p)).toBe((plain[p.l4Offset + 16]! << 8) | plain[p.l4Offset + 17]!);
      got.push(plain.length - p.payloadOffset);
    }
    expect(got.reduce((a, b) => a + b, 0)).toBe(20_000);
  });
});

describe('engine: a later fragment to a VIP with no record of its first fragment', () => {
  const { engine, counters } = engineFor(service('web', VIP, 80, 'tcp', 'l2', '10.0.0.11') + service('web6', VIP6, 80, 'tcp', 'l2', 'fd00::11') + service('dns6', VIP6, 53, 'udp', 'l2', 'fd00::12'));
  const io = new MemoryIo({ localMac: parseMac(LB_MAC), slotBytes: 4000, batchCapacity: 8 });
  io.start((b) => engine.processBatch(b, 1_000_000));
  const v4Fragments = (proto: number, dport: number, id: number) => {
    const body = proto === 17 ? udp({ sport: 5000, dport }, new Uint8Array(2000), { src: CLIENT, dst: VIP }) : new Uint8Array(2008).fill(0x47);
    return [
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto, id, mf: true }, body.subarray(0, 1480))),
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto, id, fragOffset: 1480 }, body.subarray(1480))),
    ];
  };
  const counts = () => [counters[Counter.passedPackets], counters[Counter.dropBase + DropReason.fragmentUnplaceable]];

  it('passes it, as its first fragment was, when no service of the VIP serves its protocol (UDP to a TCP-only VIP, GRE)', () => {
    const before = counts();
    io.inject([...v4Fragments(17, 9999, 71), ...v4Fragments(47, 0, 72)]);
    // Before: [PASS, fragment_unplaceable, PASS, fragment_unplaceable].
    expect([...io.lastVerdicts()]).toEqual([VERDICT_PASS, VERDICT_PASS, VERDICT_PASS, VERDICT_PASS]);
    expect(counts()).toEqual([before[0]! + 4, before[1]]);
  });

  it('still drops it as fragment_unplaceable when a service of the VIP might have taken its first fragment (same protocol, or an IPv6 header hiding it)', () => {
    const before = counts();
    const [, tcpLater] = v4Fragments(6, 0, 73); // the VIP serves TCP on port 80: its first fragment may be lost
    const data = udp({ sport: 5000, dport: 53 }, new Uint8Array(200), { src: CLIENT6, dst: VIP6 });
    const udp6Later = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 64, more: false, id: 74 })] }, data.subarray(64)));
    // Destination options after the fragment header (60): the upper layer shows in the first fragment only.
    const options = ipv6Options(60).bytes as Uint8Array;
    const hidden = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 60, extensionHeaders: [ipv6Fragment({ offset: 64, more: false, id: 75 })] }, Uint8Array.from([...options, ...data]).subarray(64)));
    io.inject([tcpLater!, udp6Later, hidden]);
    expect([...io.lastVerdicts()]).toEqual([-DropReason.fragmentUnplaceable, -DropReason.fragmentUnplaceable, -DropReason.fragmentUnplaceable]);
    expect(counts()).toEqual([before[0], before[1]! + 3]);
  });

  it('passes an IPv6 later fragment of a UDP datagram to a VIP that serves TCP only', () => {
    const { engine: e4, counters: c4 } = engineFor(service('web6', VIP6, 80, 'tcp', 'l2', 'fd00::11'));
    const io4 = new MemoryIo({ localMac: parseMac(LB_MAC), slotBytes: 4000, batchCapacity: 8 });
    io4.start((b) => e4.processBatch(b, 1_000_000));
    const data = udp({ sport: 5000, dport: 53 }, new Uint8Array(200), { src: CLIENT6, dst: VIP6 });
    const first = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 0, more: true, id: 76 })] }, data.subarray(0, 64)));
    const later = ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 64, more: false, id: 76 })] }, data.subarray(64)));
    io4.inject([first, later]);
    expect([...io4.lastVerdicts()]).toEqual([VERDICT_PASS, VERDICT_PASS]);
    expect(c4[Counter.dropBase + DropReason.fragmentUnplaceable]).toBe(0);
  });
});
