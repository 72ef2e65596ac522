// Too-big handling as data: the mtuCheck decision table, ICMP fragmentation-needed and ICMPv6
// Packet Too Big frames (headers and checksums as literals computed with python3 struct, quotes
// as slices of the input), outer fragments that reassemble to the encapsulated packet, and the
// token bucket with an injected clock.

import { describe, expect, it } from 'vitest';
import { addressWords } from '../../src/control/addresses.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { buildTunnelTemplate, encapsulate } from '../../src/encap/ipip.js';
import {
  MTU_FITS,
  MTU_FRAGMENT,
  MTU_SEND_TOO_BIG,
  TooBigRateLimiter,
  buildFragNeeded,
  buildPacketTooBig,
  fragmentOuter,
  mtuCheck,
  tooBigMtu,
} from '../../src/encap/too-big.js';
import { FRAME_HAS_VNET_HDR } from '../../src/io/packet-io.js';
import {
  ETH_IPV4,
  ETH_IPV6,
  TCP_FLAGS,
  concat,
  fromHex,
  hex,
  ipv4,
  ipv6,
  mac,
  onesSum,
  patternBytes,
  tcp,
  udp,
} from '../support/packet-builder.js';
import { CLIENT4, CLIENT6, CLIENT_MAC, LB_MAC, NEXT_HOP_MAC, REAL4, REAL6, SOURCE4, SOURCE6, VIP4, VIP6, toLb } from '../support/test-net.js';

const HEADROOM = 128;
const LOCAL = mac(LB_MAC);
const NEXT_HOP = mac(NEXT_HOP_MAC);
const ack4 = (payloadBytes: number, df: boolean) =>
  ipv4(
    { src: CLIENT4, dst: VIP4, proto: 6, id: 0x3039, df, ttl: 63 },
    tcp({ sport: 40000, dport: 80, seq: 1000, ack: 2000, flags: TCP_FLAGS.ACK }, patternBytes(payloadBytes), { src: CLIENT4, dst: VIP4 }),
  );
const ack6 = (payloadBytes: number) =>
  ipv6(
    { src: CLIENT6, dst: VIP6, nextHeader: 6, hopLimit: 63 },
    tcp({ sport: 40000, dport: 80, seq: 1000, ack: 2000, flags: TCP_FLAGS.ACK }, patternBytes(payloadBytes), { src: CLIENT6, dst: VIP6 }),
  );
/** 1500-byte IPv4 packets (TCP checksum 0x1c1b with DF) and a 1500-byte IPv6 one. */
const BIG4_DF = ack4(1460, true);
const BIG4 = ack4(1460, false);
const BIG6 = ack6(1440);

function place(frame: Uint8Array, headroom = HEADROOM): { buf: Uint8Array; pkt: ParsedPacket } {
  const buf = new Uint8Array(headroom + frame.length + 8);
  buf.set(frame, headroom);
  const pkt = new ParsedPacket();
  expect(parseFrame(buf, headroom, frame.length, pkt)).toBe(PARSE_OK);
  return { buf, pkt };
}

describe('mtuCheck and tooBigMtu', () => {
  const table: { name: string; packet: Uint8Array; overhead: number; mtu: number; decision: number; announced: number }[] = [
    { name: 'IPv4 1480 + 20 fits 1500', packet: ack4(1440, true), overhead: 20, mtu: 1500, decision: MTU_FITS, announced: 1480 },
    { name: 'IPv4 1500 with DF + 20 at 1500: frag-needed announcing 1480', packet: BIG4_DF, overhead: 20, mtu: 1500, decision: MTU_SEND_TOO_BIG, announced: 1480 },
    { name: 'IPv4 1500 with DF in IPv6 (40) at 1500: frag-needed announcing 1460', packet: BIG4_DF, overhead: 40, mtu: 1500, decision: MTU_SEND_TOO_BIG, announced: 1460 },
    { name: 'IPv4 1500 without DF + 20 at 1500: fragment the outer packet', packet: BIG4, overhead: 20, mtu: 1500, decision: MTU_FRAGMENT, announced: 1480 },
    { name: 'IPv6 1460 + 40 fits 1500', packet: ack6(1400), overhead: 40, mtu: 1500, decision: MTU_FITS, announced: 1460 },
    { name: 'IPv6 1500 + 40 at 1500: Packet Too Big announcing 1460', packet: BIG6, overhead: 40, mtu: 1500, decision: MTU_SEND_TOO_BIG, announced: 1460 },
    { name: 'IPv6 1300 + 40 at 1300: Packet Too Big announcing 1280, not 1260', packet: ack6(1240), overhead: 40, mtu: 1300, decision: MTU_SEND_TOO_BIG, announced: 1280 },
    { name: 'IPv6 1280 + 40 at 1300: fragment the outer packet (RFC 2473 7.1)', packet: ack6(1220), overhead: 40, mtu: 1300, decision: MTU_FRAGMENT, announced: 1280 },
    { name: 'IPv6 1281 + 40 at 1300: Packet Too Big announcing 1280', packet: ack6(1221), overhead: 40, mtu: 1300, decision: MTU_SEND_TOO_BIG, announced: 1280 },
    { name: 'IPv6 1300 in IPv4 (20) at 1300: Packet Too Big announcing 1280', packet: ack6(1240), overhead: 20, mtu: 1300, decision: MTU_SEND_TOO_BIG, announced: 1280 },
    { name: 'IPv6 1280 in IPv4 (20) at 1290: fragment, the IPv6 minimum must get through', packet: ack6(1220), overhead: 20, mtu: 1290, decision: MTU_FRAGMENT, announced: 1280 },
  ];
  for (const t of table) {
    it(t.name, () => {
      const family = t.packet[0] >> 4;
      const { pkt } = place(toLb(family === 4 ? ETH_IPV4 : ETH_IPV6, t.packet));
      expect(mtuCheck(pkt, t.overhead, t.mtu)).toBe(t.decision);
      expect(tooBigMtu(family, t.overhead, t.mtu)).toBe(t.announced);
    });
  }
});

describe('buildFragNeeded', () => {
  it('answers a small DF packet with VLAN 100 in full: VIP -> client, TOS c0, DF, next-hop MTU 1480, the whole packet quoted', () => {
    const input = toLb(
      ETH_IPV4,
      ipv4({ src: CLIENT4, dst: VIP4, proto: 17, id: 0x0abc, df: true, ttl: 63 }, udp({ sport: 40000, dport: 53 }, 'ping', { src: CLIENT4, dst: VIP4 })),
      0x2064,
    );
    const { buf, pkt } = place(input);
    const scratch = new Uint8Array(700).fill(0xee);
    const length = buildFragNeeded(buf, pkt, 1480, LOCAL, scratch, 100);
    expect(hex(scratch.subarray(100, 100 + length))).toBe(
      hex(
        fromHex(`
          020000000001 0200000000fe 8100 2064 0800            # back to the client's MAC, same VLAN
          45c0 003c 0000 4000 4001 d3bb cb00710a c6336407     # VIP -> client, ICMP, checksum d3bb
          03 04 5d97 0000 05c8                                # type 3 code 4, checksum 5d97, MTU 1480
          4500 0020 0abc 4000 3f11 cacb c6336407 cb00710a     # the quoted packet
          9c40 0035 000c 1e4a 70696e67
        `),
      ),
    );
    expect(scratch[99]).toBe(0xee);
    expect(scratch[100 + length]).toBe(0xee);
  });

  const big: { name: string; nextHopMtu: number; header: string }[] = [
    { name: '4in4 at MTU 1500: next-hop MTU 1480', nextHopMtu: 1480, header: '45c0 0240 0000 4000 4001 d1b7 cb00710a c6336407  0304 412b 0000 05c8' },
    { name: '4in6 at MTU 1500: next-hop MTU 1460', nextHopMtu: 1460, header: '45c0 0240 0000 4000 4001 d1b7 cb00710a c6336407  0304 413f 0000 05b4' },
  ];
  for (const b of big) {
    it(`quotes 548 bytes of a 1500-byte packet in a 576-byte datagram (${b.name})`, () => {
      const { buf, pkt } = place(toLb(ETH_IPV4, BIG4_DF));
      expect(mtuCheck(pkt, b.nextHopMtu === 1480 ? 20 : 40, 1500)).toBe(MTU_SEND_TOO_BIG);
      const scratch = new Uint8Array(1600);
      const length = buildFragNeeded(buf, pkt, tooBigMtu(4, b.nextHopMtu === 1480 ? 20 : 40, 1500), LOCAL, scratch, 0);
      expect(length).toBe(14 + 576);
      const expected = concat(fromHex('020000000001 0200000000fe 0800'), fromHex(b.header), BIG4_DF.subarray(0, 548));
      expect(hex(scratch.subarray(0, length))).toBe(hex(expected));
      expect(onesSum(scratch.subarray(14, 34))).toBe(0xffff);
      expect(onesSum(scratch.subarray(34, length))).toBe(0xffff);
    });
  }

  it('refuses an IPv6 packet and a scratch buffer one byte short (batch_full), writing nothing', () => {
    const { buf, pkt } = place(toLb(ETH_IPV4, BIG4_DF));
    const scratch = new Uint8Array(14 + 576 - 1);
    expect(buildFragNeeded(buf, pkt, 1480, LOCAL, scratch, 0)).toBe(-DropReason.batchFull);
    expect(scratch.every((b) => b === 0)).toBe(true);
    const v6 = place(toLb(ETH_IPV6, BIG6));
    expect(buildFragNeeded(v6.buf, v6.pkt, 1480, LOCAL, new Uint8Array(2000), 0)).toBe(-DropReason.truncatedIpv4);
  });
});

describe('buildPacketTooBig', () => {
  it('answers a small IPv6 packet with VLAN 100 in full: VIP -> client, hop limit 64, MTU 1460, pseudo-header checksum', () => {
    const input = toLb(
      ETH_IPV6,
      ipv6(
        { src: CLIENT6, dst: VIP6, nextHeader: 17, trafficClass: 0xba, flowLabel: 0xabcde, hopLimit: 63 },
        udp({ sport: 40000, dport: 53 }, 'ping', { src: CLIENT6, dst: VIP6 }),
      ),
      0x2064,
    );
    const { buf, pkt } = place(input);
    const scratch = new Uint8Array(200);
    const length = buildPacketTooBig(buf, pkt, 1460, LOCAL, scratch, 0);
    expect(hex(scratch.subarray(0, length))).toBe(
      hex(
        fromHex(`
          020000000001 0200000000fe 8100 2064 86dd
          60000000 003c 3a 40                                 # payload 60, ICMPv6, hop limit 64
          20010db8000f00000000000000000010 20010db8000c00000000000000000007   # VIP -> client
          02 00 627a 000005b4                                 # type 2, checksum 627a, MTU 1460
          6baabcde 000c 11 3f                                 # the quoted packet
          20010db8000c00000000000000000007 20010db8000f00000000000000000010
          9c40 0035 000c 28ec 70696e67
        `),
      ),
    );
  });

  const big: { name: string; packet: Uint8Array; mtu: number; header: string }[] = [
    {
      name: 'a 1500-byte packet at MTU 1500 announces 1460',
      packet: BIG6,
      mtu: 1500,
      header: '02 00 9e73 000005b4',
    },
    {
      name: 'a 1300-byte packet at MTU 1300 announces 1280 (the IPv6 minimum, not 1260)',
      packet: ack6(1240),
      mtu: 1300,
      header: '02 00 eeba 00000500',
    },
  ];
  for (const b of big) {
    it(`quotes 1232 bytes so the message is exactly 1280 bytes: ${b.name}`, () => {
      const { buf, pkt } = place(toLb(ETH_IPV6, b.packet));
      expect(mtuCheck(pkt, 40, b.mtu)).toBe(MTU_SEND_TOO_BIG);
      const scratch = new Uint8Array(1400);
      const length = buildPacketTooBig(buf, pkt, tooBigMtu(6, 40, b.mtu), LOCAL, scratch, 0);
      expect(length).toBe(14 + 1280);
      const expected = concat(
        fromHex('020000000001 0200000000fe 86dd  60000000 04d8 3a 40'),
        fromHex('20010db8000f00000000000000000010 20010db8000c00000000000000000007'),
        fromHex(b.header),
        b.packet.subarray(0, 1232),
      );
      expect(hex(scratch.subarray(0, length))).toBe(hex(expected));
    });
  }
});

/** An encapsulated frame ready for fragmentOuter, and a copy of its outer IP packet. */
function encapsulated(packet: Uint8Array, tunnel: [string, string, 4 | 6], ipId: number, vlan?: number) {
  const innerFamily = (packet[0] >> 4) as 4 | 6;
  const { buf, pkt } = place(toLb(innerFamily === 4 ? ETH_IPV4 : ETH_IPV6, packet, vlan));
  const out = new Int32Array(2);
  expect(encapsulate(buf, pkt, HEADROOM, 0, buildTunnelTemplate(tunnel[0], tunnel[1], tunnel[2]), 0, NEXT_HOP, 0, LOCAL, ipId, 0, out)).toBe(0);
  const l2Bytes = vlan === undefined ? 14 : 18;
  return { buf, offset: out[0], length: out[1], l2Bytes, outer: Uint8Array.from(buf.subarray(out[0] + l2Bytes, out[0] + out[1])) };
}

interface Fragment {
  frame: Uint8Array;
}

function collect(buf: Uint8Array, scratch: Uint8Array, out: Int32Array, count: number): Fragment[] {
  const frags: Fragment[] = [{ frame: Uint8Array.from(buf.subarray(out[1], out[1] + out[2])) }];
  for (let k = 1; k < count; k++) frags.push({ frame: Uint8Array.from(scratch.subarray(out[1 + 2 * k], out[1 + 2 * k] + out[2 + 2 * k])) });
  return frags;
}

/** RFC 791 reassembly, checking every fragment on the way; returns the original datagram. */
function reassemble4(frags: Fragment[], l2Bytes: number, mtu: number): Uint8Array {
  const ips = frags.map((f) => f.frame.subarray(l2Bytes));
  const id = (ips[0][4] << 8) | ips[0][5];
  const pieces: { offset: number; data: Uint8Array; more: boolean }[] = [];
  for (const ip of ips) {
    expect(ip.length).toBeLessThanOrEqual(mtu);
    expect((ip[2] << 8) | ip[3]).toBe(ip.length);
    expect(onesSum(ip.subarray(0, 20))).toBe(0xffff); // header checksum verifies
    expect((ip[4] << 8) | ip[5]).toBe(id);
    const flags = (ip[6] << 8) | ip[7];
    expect(flags & 0x4000).toBe(0);
    pieces.push({ offset: (flags & 0x1fff) * 8, data: ip.subarray(20), more: (flags & 0x2000) !== 0 });
  }
  pieces.sort((a, b) => a.offset - b.offset);
  let next = 0;
  pieces.forEach((p, i) => {
    expect(p.offset).toBe(next);
    expect(p.more).toBe(i < pieces.length - 1);
    if (p.more) expect(p.data.length % 8).toBe(0);
    next += p.data.length;
  });
  const header = Uint8Array.from(ips[0].subarray(0, 20));
  const total = 20 + next;
  header[2] = total >> 8;
  header[3] = total & 0xff;
  header[6] = 0;
  header[7] = 0;
  header[10] = 0;
  header[11] = 0;
  const sum = ~onesSum(header) & 0xffff;
  header[10] = sum >> 8;
  header[11] = sum & 0xff;
  return concat(header, ...pieces.map((p) => p.data));
}

/** RFC 8200 4.5 reassembly; returns the original packet (unfragmentable part = the 40-byte header). */
function reassemble6(frags: Fragment[], l2Bytes: number, mtu: number, fragmentId: number): Uint8Array {
  const ips = frags.map((f) => f.frame.subarray(l2Bytes));
  const pieces: { offset: number; data: Uint8Array; more: boolean; nextHeader: number }[] = [];
  for (const ip of ips) {
    expect(ip.length).toBeLessThanOrEqual(mtu);
    expect(((ip[4] << 8) | ip[5]) + 40).toBe(ip.length);
    expect(ip[6]).toBe(44);
    const f = ip.subarray(40, 48);
    expect(((f[4] << 24) | (f[5] << 16) | (f[6] << 8) | f[7]) >>> 0).toBe(fragmentId);
    const offsetFlags = (f[2] << 8) | f[3];
    pieces.push({ offset: offsetFlags & 0xfff8, data: ip.subarray(48), more: (offsetFlags & 1) === 1, nextHeader: f[0] });
  }
  pieces.sort((a, b) => a.offset - b.offset);
  let next = 0;
  pieces.forEach((p, i) => {
    expect(p.offset).toBe(next);
    expect(p.more).toBe(i < pieces.length - 1);
    if (p.more) expect(p.data.length % 8).toBe(0);
    next += p.data.length;
  });
  const header = Uint8Array.from(ips[0].subarray(0, 40));
  header[4] = next >> 8;
  header[5] = next & 0xff;
  header[6] = pieces[0].nextHeader;
  return concat(header, ...pieces.map((p) => p.data));
}

describe('fragmentOuter', () => {
  it('4in4, 1500-byte inner without DF at MTU 1500: two fragments, headers as literals, reassembling to the outer packet', () => {
    const e = encapsulated(BIG4, [SOURCE4, REAL4, 4], 0x1234);
    expect(hex(e.outer.subarray(0, 20))).toBe('450005f012340000400495c6c00002050a00010b');
    const scratch = new Uint8Array(256).fill(0xee);
    const out = new Int32Array(16);
    const count = fragmentOuter(e.buf, e.offset, e.length, HEADROOM - 20, 0, 1500, 0, scratch, 0, 0, out);
    expect(count).toBe(2);
    expect([out[0], out[1], out[2], out[3], out[4]]).toEqual([2, e.offset, 14 + 1500, 0, 14 + 40]);
    const frags = collect(e.buf, scratch, out, count);
    const eth = '0200000000110200000000fe0800';
    expect(hex(frags[0].frame.subarray(0, 34))).toBe(eth + '450005dc12342000400475dac00002050a00010b'); // MF, 1480 data bytes
    expect(hex(frags[1].frame.subarray(0, 34))).toBe(eth + '45000028123400b940049ad5c00002050a00010b'); // offset 185 * 8 = 1480
    expect(hex(reassemble4(frags, 14, 1500))).toBe(hex(e.outer));
    expect(scratch[54]).toBe(0xee);
  });

  it('4in4 at MTU 576 with VLAN 100, a 10-byte gap and a virtio_net_hdr: three fragments, the tag on each, zeroed headers', () => {
    const e = encapsulated(BIG4, [SOURCE4, REAL4, 4], 0x1234, 0x2064);
    e.buf.fill(0x5a, e.offset - 10, e.offset); // a virtio_net_hdr that must not survive (NEEDS_CSUM and all)
    const scratch = new Uint8Array(2048).fill(0xee);
    const out = new Int32Array(7);
    const count = fragmentOuter(e.buf, e.offset, e.length, HEADROOM - 20 - 10, FRAME_HAS_VNET_HDR, 576, 0, scratch, 4, 10, out);
    expect(count).toBe(3);
    expect(Array.from(out)).toEqual([3, e.offset, 18 + 572, 14, 18 + 572, 14 + 590 + 10, 18 + 416]);
    expect(hex(e.buf.subarray(e.offset - 10, e.offset))).toBe('00'.repeat(10));
    expect(hex(scratch.subarray(4, 14))).toBe('00'.repeat(10));
    expect(hex(scratch.subarray(604, 614))).toBe('00'.repeat(10));
    const frags = collect(e.buf, scratch, out, count);
    const eth = '0200000000110200000000fe810020640800';
    expect(frags.map((f) => hex(f.frame.subarray(0, 38)))).toEqual([
      eth + '4500023c123420004004797ac00002050a00010b',
      eth + '4500023c1234204540047935c00002050a00010b',
      eth + '450001a01234008a4004998cc00002050a00010b',
    ]);
    expect(hex(reassemble4(frags, 18, 576))).toBe(hex(e.outer));
  });

  it('6in6, a 1280-byte inner at MTU 1300: fragment headers with id 0xdeadbeef, the first fragment moved 8 bytes back', () => {
    const inner = ack6(1220);
    const { pkt } = place(toLb(ETH_IPV6, inner));
    expect(mtuCheck(pkt, 40, 1300)).toBe(MTU_FRAGMENT);
    const e = encapsulated(inner, [SOURCE6, REAL6, 6], 0);
    const scratch = new Uint8Array(256);
    const out = new Int32Array(5);
    const count = fragmentOuter(e.buf, e.offset, e.length, HEADROOM - 40, 0, 1300, 0xdeadbeef, scratch, 0, 0, out);
    expect(count).toBe(2);
    expect([out[1], out[2], out[3], out[4]]).toEqual([e.offset - 8, 14 + 1296, 0, 14 + 80]);
    const frags = collect(e.buf, scratch, out, count);
    const eth = '0200000000110200000000fe86dd';
    expect(hex(frags[0].frame.subarray(0, 62))).toBe(
      eth + '6000000004e82c4020010db800000000000000000000000520010db800010000000000000000001129000001deadbeef',
    );
    expect(hex(frags[1].frame.subarray(0, 62))).toBe(
      eth + '6000000000282c4020010db800000000000000000000000520010db8000100000000000000000011290004e0deadbeef',
    );
    expect(hex(reassemble6(frags, 14, 1300, 0xdeadbeef))).toBe(hex(e.outer));
  });

  it('4in6, a 1500-byte inner without DF at MTU 1500: next header 4 in the fragment headers, 1448 + 52 data bytes', () => {
    const e = encapsulated(BIG4, [SOURCE6, REAL6, 4], 0);
    const scratch = new Uint8Array(256);
    const out = new Int32Array(5);
    expect(fragmentOuter(e.buf, e.offset, e.length, HEADROOM - 40, 0, 1500, 0x01020304, scratch, 0, 0, out)).toBe(2);
    const frags = collect(e.buf, scratch, out, 2);
    const eth = '0200000000110200000000fe86dd';
    expect(frags.map((f) => hex(f.frame.subarray(0, 62)))).toEqual([
      eth + '6000000005b02c4020010db800000000000000000000000520010db80001000000000000000000110400000101020304',
      eth + '60000000003c2c4020010db800000000000000000000000520010db8000100000000000000000011040005a801020304',
    ]);
    expect(hex(reassemble6(frags, 14, 1500, 0x01020304))).toBe(hex(e.outer));
  });

  it('leaves a frame that fits alone and reports it as one fragment', () => {
    const e = encapsulated(ack4(1000, false), [SOURCE4, REAL4, 4], 7);
    const before = Uint8Array.from(e.buf);
    const out = new Int32Array(3);
    expect(fragmentOuter(e.buf, e.offset, e.length, 0, 0, 1500, 0, new Uint8Array(0), 0, 0, out)).toBe(1);
    expect(Array.from(out)).toEqual([1, e.offset, e.length]);
    expect(hex(e.buf)).toBe(hex(before));
  });

  // Too big for the path, or no room left in the batch's extra buffer (batch_full).
  const refusals: { name: string; reason: 'packetTooBig' | 'batchFull'; call: () => { result: number; changed: boolean } }[] = [
    {
      name: 'an outer IPv4 header with DF (an inner packet that had DF)',
      reason: 'packetTooBig',
      call: () => tryFragment(encapsulated(BIG4_DF, [SOURCE4, REAL4, 4], 0), 1500, 256, 5, HEADROOM),
    },
    {
      name: 'a scratch buffer one byte short of the second fragment',
      reason: 'batchFull',
      call: () => tryFragment(encapsulated(BIG4, [SOURCE4, REAL4, 4], 1), 1500, 14 + 40 - 1, 5, HEADROOM),
    },
    {
      name: 'an out array without room for every fragment',
      reason: 'batchFull',
      call: () => tryFragment(encapsulated(BIG4, [SOURCE4, REAL4, 4], 1), 576, 4096, 5, HEADROOM),
    },
    {
      name: 'IPv6 with 7 bytes of headroom for the 8-byte fragment header',
      reason: 'batchFull',
      call: () => tryFragment(encapsulated(BIG4, [SOURCE6, REAL6, 4], 1), 1500, 256, 5, 7),
    },
    {
      name: 'IPv6 at an MTU below 1280',
      reason: 'packetTooBig',
      call: () => tryFragment(encapsulated(BIG4, [SOURCE6, REAL6, 4], 1), 1279, 4096, 9, HEADROOM),
    },
  ];
  for (const r of refusals) {
    it(`refuses ${r.name} with ${r.reason} and changes nothing`, () => {
      const { result, changed } = r.call();
      expect(result).toBe(-DropReason[r.reason]);
      expect(changed).toBe(false);
    });
  }
});

function tryFragment(e: ReturnType<typeof encapsulated>, mtu: number, scratchBytes: number, outWords: number, headroom: number) {
  const before = Uint8Array.from(e.buf);
  const scratch = new Uint8Array(scratchBytes);
  const result = fragmentOuter(e.buf, e.offset, e.length, headroom, 0, mtu, 9, scratch, 0, 0, new Int32Array(outWords));
  return { result, changed: hex(e.buf) !== hex(before) || scratch.some((b) => b !== 0) };
}

describe('TooBigRateLimiter', () => {
  const client = (text: string): Uint32Array => {
    const a = new Uint32Array(8);
    a.set(addressWords(text));
    return a;
  };
  const A = client('192.0.2.1');

  it('allows a burst of 3, then refills at 2 per second, never above the burst', () => {
    const limiter = new TooBigRateLimiter(2, 3);
    const steps: [number, boolean][] = [
      [1000, true],
      [1000, true],
      [1000, true],
      [1000, false], // burst spent
      [1499, false], // 0.998 tokens
      [1500, true], // 1 token after 500 ms
      [1500, false],
      [11_000, true], // 19 tokens' worth of time, capped at 3
      [11_000, true],
      [11_000, true],
      [11_000, false],
      [10_000, false], // the clock stepped back: no refill
      [11_250, false], // 0.5 token since 11000 (the step back did not move the reference)
      [11_500, true],
    ];
    steps.forEach(([nowMs, allowed], i) => expect(limiter.allow(nowMs, 4, A), `step ${i} at ${nowMs} ms`).toBe(allowed));
  });

  it("gives each client its own bucket inside the loop's: one client cannot use up the others' share", () => {
    // Loop: 100 at once; per client: 5 at once, 1 a second.
    const limiter = new TooBigRateLimiter(100, 100, 1, 5);
    let a = 0;
    for (let i = 0; i < 1000; i++) if (limiter.allow(1000, 4, A)) a++;
    expect(a).toBe(5);
    // Other clients get theirs: IPv4, and IPv6 /64s (one with 192.0.2.1's first word).
    const others = [client('192.0.2.2'), client('2001:db8:0:1::1'), client('2001:db8:0:2::1'), client('c000:201::')];
    const families = [4, 6, 6, 6];
    others.forEach((addr, i) => {
      let n = 0;
      for (let k = 0; k < 10; k++) if (limiter.allow(1000, families[i]!, addr)) n++;
      expect(n, `client ${i}`).toBe(5);
    });
    // A second later the first client has one more token (the loop's bucket is full again).
    expect(limiter.allow(2000, 4, A)).toBe(true);
    expect(limiter.allow(2000, 4, A)).toBe(false);
    // The loop's bucket bounds them all: its 100 less the one just sent.
    let total = 0;
    for (let c = 0; c < 200; c++) for (let k = 0; k < 5; k++) if (limiter.allow(2000, 4, client(`198.51.100.${c}`))) total++;
    expect(total).toBe(99);
  });

  it('counts an IPv6 /64 as one client: a fresh address per packet gets no fresh bucket', () => {
    const limiter = new TooBigRateLimiter(1000, 1000, 1, 3);
    let n = 0;
    for (let host = 1; host <= 50; host++) if (limiter.allow(0, 6, client(`2001:db8:0:7::${host.toString(16)}`))) n++;
    expect(n).toBe(3);
  });

  it('charges neither bucket when the other is empty', () => {
    // The loop: 2 at once, 1 a second. The client: 5 at once, never refilled.
    const limiter = new TooBigRateLimiter(1, 2, 0, 5);
    expect([limiter.allow(0, 4, A), limiter.allow(0, 4, A)]).toEqual([true, true]);
    // The loop's bucket is empty: these are refused without spending the client's last three.
    for (let i = 0; i < 10; i++) expect(limiter.allow(0, 4, A)).toBe(false);
    expect([1000, 2000, 3000, 4000].map((t) => limiter.allow(t, 4, A))).toEqual([true, true, true, false]);
  });

  it('with rate 0 allows only the burst, ever', () => {
    const limiter = new TooBigRateLimiter(0, 2);
    expect([limiter.allow(0, 4, A), limiter.allow(1e9, 4, A), limiter.allow(2e9, 4, A)]).toEqual([true, true, false]);
  });

  it('refuses a negative or non-finite rate and a burst below 1', () => {
    expect(() => new TooBigRateLimiter(-1, 1)).toThrow(RangeError);
    expect(() => new TooBigRateLimiter(Number.POSITIVE_INFINITY, 1)).toThrow(RangeError);
    expect(() => new TooBigRateLimiter(10, 0.5)).toThrow(RangeError);
    expect(() => new TooBigRateLimiter(Number.NaN, 1)).toThrow(RangeError);
    expect(() => new TooBigRateLimiter(10, 5, -1, 1)).toThrow(RangeError);
    expect(() => new TooBigRateLimiter(10, 5, 1, 0)).toThrow(RangeError);
  });
});
