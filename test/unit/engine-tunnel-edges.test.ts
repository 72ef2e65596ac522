// Edges of the IPIP path and of the engine's own replies, each found by a review with a vector:
// GSO to an IPv6 tunnel under 1280 + 40, no ICMP about a non-initial fragment, one outer flow
// label per fragmented datagram, a batch whose extra bytes run out (batch_full), and echo replies
// whose checksum verifies for every message, the all-zero one included.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { parseMac } from '../../src/control/addresses.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { Counter, createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { Engine } from '../../src/dataplane/engine.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { buildEchoReply } from '../../src/encap/icmp-to-vip.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { FRAME_CSUM_PARTIAL, FRAME_GSO, FRAME_HAS_VNET_HDR, VERDICT_CONSUMED, VERDICT_TX } from '../../src/io/packet-io.js';
import { ETH_IPV4, ETH_IPV6, ethernet, hex, icmpEcho, icmpv6, ipv4, ipv6, ipv6Fragment, ipv6Options, onesSum, tcp, udp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const CLIENT_MAC = '02:00:00:00:00:0c';
const VIP = '10.0.0.100';
const VIP6 = 'fd00::100';
const CLIENT = '192.0.2.7';
const CLIENT6 = '2001:db8::7';

/** One service (a YAML flow mapping) behind an engine on memory I/O. */
function setup(service: string, opts: { mtu?: number; slotBytes?: number; batchCapacity?: number } = {}) {
  const r = parseConfigText(`interface: eth0\ntunnel: { sourceV4: 10.0.0.2, sourceV6: "fd00::2" }\nservices:\n  - ${service}\n`);
  if (!r.ok) throw new Error(JSON.stringify(r.problems));
  const counters = createCounters();
  const engine = new Engine({
    flowCapacity: 64,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters,
    localMac: parseMac(LB_MAC),
    mtu: opts.mtu ?? 1500,
  });
  const views: ServiceView[] = r.config.services.map((s) => ({
    config: s,
    reals: s.reals.map((x, i) => ({ id: i, address: x.address, weight: x.weight, intent: x.state, forwarding: x.forwarding, health: 'up', removed: false, mac: parseMac('02:00:00:00:00:99') })),
  }));
  engine.setSnapshot(new SnapshotBuilder().build(views, 0, MAX_REAL_IDS, { v4: '10.0.0.2', v6: 'fd00::2' }).snapshot);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC), slotBytes: opts.slotBytes ?? 4000, batchCapacity: opts.batchCapacity ?? 4 });
  io.start((b) => engine.processBatch(b, 1_000_000));
  return { io, counters };
}

/** A virtio-net header asking for TCP segmentation into gsoSize-byte segments (v6: GSO_TCPV6). */
function vnetHeader(gsoSize: number, v6: boolean): Uint8Array {
  const vnet = new Uint8Array(10);
  vnet[0] = 1; // NEEDS_CSUM
  vnet[1] = v6 ? 4 : 1;
  vnet[4] = gsoSize & 0xff;
  vnet[5] = gsoSize >> 8;
  return vnet;
}

const GSO_FLAGS = FRAME_HAS_VNET_HDR | FRAME_GSO | FRAME_CSUM_PARTIAL;

describe('6in6 on a link of MTU 1300 (tunnel MTU 1260, under IPv6\'s 1280)', () => {
  const web6 = `{ name: web6, vip: "${VIP6}", port: 80, protocol: tcp, forwarding: ipip, reals: [ { address: "fd01::11" } ] }`;
  const segment6 = (payload: number) =>
    ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6 }, tcp({ sport: 4000, dport: 80, flags: 0x10, seq: 1 }, new Uint8Array(payload), { src: CLIENT6, dst: VIP6 })));

  it('sends a plain 1280-byte packet in outer fragments (RFC 2473 7.1)', () => {
    const { io } = setup(web6, { mtu: 1300, slotBytes: 70_000 });
    const out = io.inject([segment6(1220)]); // 40 + 20 + 1220 = 1280
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(out).toHaveLength(2);
  });

  it('cuts a GSO frame of 1280-byte segments smaller instead of telling a client already at 1280 to go lower', () => {
    const { io, counters } = setup(web6, { mtu: 1300, slotBytes: 70_000 });
    const out = io.inject([Uint8Array.from([...vnetHeader(1220, true), ...segment6(3 * 1220)])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_CONSUMED);
    expect(counters[Counter.icmpTooBigSent]).toBe(0);
    // 3660 bytes in segments of 1300 - 40 - 60 = 1200: four, each exactly within the link MTU.
    expect(out.map((f) => f.length - 14)).toEqual([1300, 1300, 1300, 40 + 60 + 60]);
  });

  it('still tells a client whose segments exceed 1280 to go down to 1280', () => {
    const { io, counters } = setup(web6, { mtu: 1300, slotBytes: 70_000 });
    io.inject([Uint8Array.from([...vnetHeader(1400, true), ...segment6(3 * 1400)])], [GSO_FLAGS]);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(counters[Counter.icmpTooBigSent]).toBe(1);
  });
});

describe('a DF-set UDP datagram in two 1500-byte fragments to an IPIP real (DF on every fragment)', () => {
  it('gets one fragmentation-needed, about its first fragment, none about the later one (RFC 1122 3.2.2)', () => {
    const { io, counters } = setup(`{ name: dns, vip: ${VIP}, port: 53, protocol: udp, forwarding: ipip, reals: [ { address: 10.1.0.12 } ] }`);
    const datagram = udp({ sport: 5000, dport: 53 }, new Uint8Array(2952), { src: CLIENT, dst: VIP }); // 2960 bytes = 2 x 1480
    const fragment = (offset: number) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 17, id: 42, df: true, mf: offset === 0, fragOffset: offset }, datagram.subarray(offset, offset + 1480)));
    expect(io.inject([fragment(0)])).toHaveLength(1); // the fragmentation-needed
    expect(io.inject([fragment(1480)])).toHaveLength(0);
    expect(io.lastVerdicts()[0]).toBe(-DropReason.packetTooBig);
    expect(counters[Counter.icmpTooBigSent]).toBe(1);
  });
});

describe('the outer flow label of one fragmented IPv6 datagram', () => {
  it('is the same for its first and later fragments when destination options follow the Fragment header', () => {
    const { io } = setup(`{ name: dns6, vip: "${VIP6}", port: 53, protocol: udp, forwarding: ipip, reals: [ { address: "fd01::11" } ] }`);
    const datagram = udp({ sport: 5000, dport: 53 }, new Uint8Array(100), { src: CLIENT6, dst: VIP6 });
    const fragmentable = Uint8Array.from([...(ipv6Options(60).bytes as Uint8Array), ...datagram]);
    fragmentable[0] = 17;
    const frame = (offset: number, more: boolean, bytes: Uint8Array) =>
      ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 60, extensionHeaders: [ipv6Fragment({ offset, more, id: 77 })] }, bytes));
    const out = io.inject([frame(0, true, fragmentable.subarray(0, 64)), frame(64, false, fragmentable.subarray(64))]);
    expect([...io.lastVerdicts()]).toEqual([VERDICT_TX, VERDICT_TX]);
    const label = (f: Uint8Array) => (((f[15]! & 0x0f) << 16) | (f[16]! << 8) | f[17]!) >>> 0;
    expect(label(out[0]!)).not.toBe(0);
    expect(label(out[1]!)).toBe(label(out[0]!));
  });
});

describe('a batch whose extra buffer (1 MiB) runs out before its 512 extra frames (MTU 9000, 64 KiB GSO frames)', () => {
  it('drops the frames that no longer fit as batch_full, as when the extra frames run out', () => {
    const { io, counters } = setup(`{ name: web, vip: ${VIP}, port: 80, protocol: tcp, forwarding: ipip, reals: [ { address: 10.1.0.11 } ] }`, {
      mtu: 9000,
      slotBytes: 66_000,
      batchCapacity: 20,
    });
    const frames = Array.from({ length: 20 }, (_, i) =>
      Uint8Array.from([
        ...vnetHeader(8940, false),
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

describe('echo replies', () => {
  it('carry a checksum that verifies when the ICMPv4 reply is all zeros (id 0, seq 0, no data): 0xffff, not 0', () => {
    const { io } = setup(`{ name: web, vip: ${VIP}, port: 80, protocol: tcp, reals: [ { address: 10.0.0.11 } ] }`);
    const [reply] = io.inject([ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 1 }, icmpEcho({ id: 0, seq: 0 })))]);
    expect(io.lastVerdicts()[0]).toBe(VERDICT_TX);
    expect(hex(reply!.subarray(34, 42))).toBe('0000ffff00000000');
    expect(onesSum(reply!.subarray(34, 42))).toBe(0xffff);
  });

  it('verify for 20,000 requests of both families (ids, sequence numbers, lengths 0-36)', () => {
    const p = new ParsedPacket();
    const bad: string[] = [];
    for (let i = 0; i < 20_000; i++) {
      const payload = Array.from({ length: i % 37 }, (_, k) => (k * 31 + i * 7) & 0xff);
      const v6 = i % 2 === 1;
      const client6 = `2001:db8::${(i % 65535).toString(16)}`;
      const f = v6
        ? ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV6 }, ipv6({ src: client6, dst: VIP6, nextHeader: 58, hopLimit: i & 0xff }, icmpv6({ type: 128, rest: (i * 2654435761) >>> 0 }, payload, { src: client6, dst: VIP6 })))
        : ethernet({ dst: LB_MAC, src: CLIENT_MAC, type: ETH_IPV4 }, ipv4({ src: `192.0.${(i >> 8) & 255}.${i & 255}`, dst: VIP, proto: 1, ttl: i & 0xff, id: i }, icmpEcho({ id: (i * 7) & 0xffff, seq: (i * 13) & 0xffff }, payload)));
      if (parseFrame(f, 0, f.length, p) !== 0 || buildEchoReply(f, p) !== f.length || parseFrame(f, 0, f.length, p) !== 0) {
        bad.push(`${i}: not answered`);
      } else if (!v6 && onesSum(f.subarray(p.l4Offset, p.l3End)) !== 0xffff) {
        bad.push(`${i}: checksum`);
      }
    }
    expect(bad).toEqual([]);
  });
});
