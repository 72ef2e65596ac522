// ICMP to a VIP as data: the flow key recovered from frag-needed / Packet Too Big quotes (equal to
// the key of the client's own packets), every refusal, and echo replies as exact bytes (literals
// computed with python3 struct, cross-checked against the builder).

import { describe, expect, it } from 'vitest';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { fold16, ones16 } from '../../src/dataplane/checksum.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { FLOW_KEY_WORDS, buildEchoReply, parseEmbeddedFlow } from '../../src/encap/icmp-to-vip.js';
import {
  ETH_IPV4,
  ETH_IPV6,
  TCP_FLAGS,
  concat,
  ethernet,
  fromHex,
  hex,
  icmp,
  icmpEcho,
  icmpv6,
  ipv4,
  ipv6,
  ipv6Fragment,
  ipv6Options,
  onesSum,
  tcp,
  udp,
} from '../support/packet-builder.js';
import { CLIENT4, CLIENT6, CLIENT_MAC, LB_MAC, VIP4, VIP6, toLb } from '../support/test-net.js';

const ROUTER4 = '198.51.100.1';
const ROUTER6 = '2001:db8:c::1';

function parsed(frame: Uint8Array, headroom = 8): { buf: Uint8Array; pkt: ParsedPacket } {
  const buf = new Uint8Array(headroom + frame.length);
  buf.set(frame, headroom);
  const pkt = new ParsedPacket();
  expect(parseFrame(buf, headroom, frame.length, pkt)).toBe(PARSE_OK);
  return { buf, pkt };
}

/** The key the engine builds for a packet (same layout as Engine.keyFromPacket). */
function keyOf(pkt: ParsedPacket): number[] {
  const a = pkt.addr;
  return [pkt.ipProtocol | (pkt.family << 8), a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], ((pkt.srcPort << 16) | pkt.dstPort) >>> 0];
}

// The real's replies (VIP -> client) that routers quote back to the VIP.
const reply4Tcp = ipv4(
  { src: VIP4, dst: CLIENT4, proto: 6, df: true },
  tcp({ sport: 80, dport: 40000, seq: 5, ack: 6, flags: TCP_FLAGS.ACK }, new Uint8Array(1400), { src: VIP4, dst: CLIENT4 }),
);
const reply6Udp = (ext: ReturnType<typeof ipv6Options>[] = []) =>
  ipv6({ src: VIP6, dst: CLIENT6, nextHeader: 17, extensionHeaders: ext }, udp({ sport: 53, dport: 40000 }, new Uint8Array(1400), { src: VIP6, dst: CLIENT6 }));

const fragNeeded = (quote: Uint8Array, code = 4) =>
  toLb(ETH_IPV4, ipv4({ src: ROUTER4, dst: VIP4, proto: 1 }, icmp({ type: 3, code, rest: 1400 }, quote)));
const packetTooBig = (quote: Uint8Array, type = 2) =>
  toLb(ETH_IPV6, ipv6({ src: ROUTER6, dst: VIP6, nextHeader: 58 }, icmpv6({ type, rest: 1400 }, quote, { src: ROUTER6, dst: VIP6 })));

describe('parseEmbeddedFlow', () => {
  const good: { name: string; message: Uint8Array; client: Uint8Array; key: number[] }[] = [
    {
      name: 'frag-needed quoting IP header + 8 bytes of a TCP reply VIP:80 -> client:40000 gives client:40000 -> VIP:80',
      message: fragNeeded(reply4Tcp.subarray(0, 28)),
      client: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 6 }, tcp({ sport: 40000, dport: 80, flags: TCP_FLAGS.ACK }, [], { src: CLIENT4, dst: VIP4 }))),
      key: [0x0406, 0xc6336407, 0, 0, 0, 0xcb00710a, 0, 0, 0, 0x9c400050],
    },
    {
      name: 'frag-needed quoting 548 bytes (as Linux does) of the same reply',
      message: fragNeeded(reply4Tcp.subarray(0, 548)),
      client: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 6 }, tcp({ sport: 40000, dport: 80, flags: TCP_FLAGS.ACK }, [], { src: CLIENT4, dst: VIP4 }))),
      key: [0x0406, 0xc6336407, 0, 0, 0, 0xcb00710a, 0, 0, 0, 0x9c400050],
    },
    {
      name: 'Packet Too Big quoting 1232 bytes of a UDP reply [VIP]:53 -> [client]:40000',
      message: packetTooBig(reply6Udp().subarray(0, 1232)),
      client: toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport: 40000, dport: 53 }, 'q', { src: CLIENT6, dst: VIP6 }))),
      key: [0x0611, 0x20010db8, 0x000c0000, 0, 7, 0x20010db8, 0x000f0000, 0, 0x10, 0x9c400035],
    },
    {
      name: 'port unreachable (type 3 code 3) about the same TCP reply',
      message: fragNeeded(reply4Tcp.subarray(0, 28), 3),
      client: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 6 }, tcp({ sport: 40000, dport: 80, flags: TCP_FLAGS.ACK }, [], { src: CLIENT4, dst: VIP4 }))),
      key: [0x0406, 0xc6336407, 0, 0, 0, 0xcb00710a, 0, 0, 0, 0x9c400050],
    },
    {
      name: 'time exceeded (type 11) about the same TCP reply',
      message: toLb(ETH_IPV4, ipv4({ src: ROUTER4, dst: VIP4, proto: 1 }, icmp({ type: 11, code: 0, rest: 0 }, reply4Tcp.subarray(0, 28)))),
      client: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 6 }, tcp({ sport: 40000, dport: 80, flags: TCP_FLAGS.ACK }, [], { src: CLIENT4, dst: VIP4 }))),
      key: [0x0406, 0xc6336407, 0, 0, 0, 0xcb00710a, 0, 0, 0, 0x9c400050],
    },
    {
      name: 'ICMPv6 destination unreachable (type 1) about the UDP reply',
      message: packetTooBig(reply6Udp().subarray(0, 48), 1),
      client: toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport: 40000, dport: 53 }, 'q', { src: CLIENT6, dst: VIP6 }))),
      key: [0x0611, 0x20010db8, 0x000c0000, 0, 7, 0x20010db8, 0x000f0000, 0, 0x10, 0x9c400035],
    },
    {
      name: 'ICMPv6 time exceeded (type 3) about the UDP reply',
      message: packetTooBig(reply6Udp().subarray(0, 48), 3),
      client: toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport: 40000, dport: 53 }, 'q', { src: CLIENT6, dst: VIP6 }))),
      key: [0x0611, 0x20010db8, 0x000c0000, 0, 7, 0x20010db8, 0x000f0000, 0, 0x10, 0x9c400035],
    },
    {
      name: 'Packet Too Big whose quote carries a destination-options header before UDP',
      message: packetTooBig(reply6Udp([ipv6Options(60, [1, 2, 0, 0])]).subarray(0, 60)),
      client: toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17 }, udp({ sport: 40000, dport: 53 }, 'q', { src: CLIENT6, dst: VIP6 }))),
      key: [0x0611, 0x20010db8, 0x000c0000, 0, 7, 0x20010db8, 0x000f0000, 0, 0x10, 0x9c400035],
    },
  ];
  for (const g of good) {
    it(g.name, () => {
      const { buf, pkt } = parsed(g.message);
      const out = new Uint32Array(FLOW_KEY_WORDS);
      expect(parseEmbeddedFlow(buf, pkt, out)).toBe(0);
      expect(Array.from(out)).toEqual(g.key);
      expect(Array.from(out)).toEqual(keyOf(parsed(g.client).pkt));
    });
  }

  const bad: { name: string; message: Uint8Array; reason: number }[] = [
    { name: 'a redirect (type 5)', message: toLb(ETH_IPV4, ipv4({ src: ROUTER4, dst: VIP4, proto: 1 }, icmp({ type: 5, code: 1, rest: 0 }, reply4Tcp.subarray(0, 28)))), reason: DropReason.icmpToVip },
    { name: 'a parameter problem (type 12)', message: toLb(ETH_IPV4, ipv4({ src: ROUTER4, dst: VIP4, proto: 1 }, icmp({ type: 12, rest: 0 }, reply4Tcp.subarray(0, 28)))), reason: DropReason.icmpToVip },
    { name: 'an echo request', message: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 1 }))), reason: DropReason.icmpToVip },
    { name: 'a quote cut after 2 bytes of TCP', message: fragNeeded(reply4Tcp.subarray(0, 22)), reason: DropReason.truncatedIcmp },
    { name: 'a quote of 19 bytes of IP header', message: fragNeeded(reply4Tcp.subarray(0, 19)), reason: DropReason.truncatedIcmp },
    {
      name: 'a quote whose source is not the VIP the message was sent to',
      message: fragNeeded(ipv4({ src: '203.0.113.99', dst: CLIENT4, proto: 6 }, tcp({ sport: 80, dport: 40000, flags: 0 }, [], { src: '203.0.113.99', dst: CLIENT4 }))),
      reason: DropReason.icmpToVip,
    },
    {
      name: 'a quoted ICMP packet (no ports)',
      message: fragNeeded(ipv4({ src: VIP4, dst: CLIENT4, proto: 1 }, icmpEcho({ id: 1, seq: 1, reply: true }))),
      reason: DropReason.icmpToVip,
    },
    {
      name: 'a quoted non-first fragment',
      message: fragNeeded(ipv4({ src: VIP4, dst: CLIENT4, proto: 6, fragOffset: 1480 }, new Uint8Array(8))),
      reason: DropReason.icmpToVip,
    },
    { name: 'an ICMPv6 parameter problem (type 4)', message: packetTooBig(reply6Udp().subarray(0, 48), 4), reason: DropReason.icmpToVip },
    { name: 'a Packet Too Big quote cut inside the IPv6 header', message: packetTooBig(reply6Udp().subarray(0, 39)), reason: DropReason.truncatedIcmp },
    {
      name: 'a Packet Too Big quote cut inside an extension header',
      message: packetTooBig(reply6Udp([ipv6Options(60, new Uint8Array(12))]).subarray(0, 44)),
      reason: DropReason.truncatedIcmp,
    },
    {
      name: 'a Packet Too Big quoting a non-first fragment',
      message: packetTooBig(
        ipv6({ src: VIP6, dst: CLIENT6, nextHeader: 17, extensionHeaders: [ipv6Fragment({ offset: 1448, more: false, id: 7 })] }, new Uint8Array(16)),
      ),
      reason: DropReason.icmpToVip,
    },
  ];
  for (const b of bad) {
    it(`refuses ${b.name} and leaves the key alone`, () => {
      const { buf, pkt } = parsed(b.message);
      const out = new Uint32Array(FLOW_KEY_WORDS).fill(0xdeadbeef);
      expect(parseEmbeddedFlow(buf, pkt, out)).toBe(-b.reason);
      expect(out.every((w) => w === 0xdeadbeef)).toBe(true);
    });
  }
});

describe('buildEchoReply', () => {
  it('turns an IPv4 echo request with VLAN 100 and TOS 0x10 into the reply in place: MACs and IPs swapped, TTL 64, DF off (as Linux answers), type 0', () => {
    const request = toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, id: 0x5555, df: true, ttl: 63, tos: 0x10 }, icmpEcho({ id: 0x1234, seq: 1 }, 'abcdefgh')), 0x2064);
    expect(hex(request)).toBe(
      hex(fromHex('0200000000fe 020000000001 8100 2064 0800  4510 0024 5555 4000 3f01 802e c6336407 cb00710a  0800 5435 1234 0001 6162636465666768')),
    );
    const { buf, pkt } = parsed(request);
    const length = buildEchoReply(buf, pkt);
    expect(length).toBe(request.length);
    const expected = `
      020000000001 0200000000fe 8100 2064 0800
      4510 0024 5555 0000 4001 bf2e cb00710a c6336407      # VIP -> client, TTL 64, no DF, checksum bf2e
      0000 5c35 1234 0001 6162636465666768                 # echo reply, checksum 5c35
    `;
    expect(hex(buf.subarray(8, 8 + length))).toBe(hex(fromHex(expected)));
    const built = ethernet(
      { dst: CLIENT_MAC, src: LB_MAC, type: ETH_IPV4, vlan: 0x2064 },
      ipv4({ src: VIP4, dst: CLIENT4, proto: 1, id: 0x5555, df: false, ttl: 64, tos: 0x10 }, icmpEcho({ id: 0x1234, seq: 1, reply: true }, 'abcdefgh')),
    );
    expect(hex(built)).toBe(hex(fromHex(expected)));
  });

  it('gives a reply to a request with IP id 0 (a Linux ping socket with DF) an id of its own, from the echo id and sequence', () => {
    const ids = [1, 2, 3].map((seq) => {
      const { buf, pkt } = parsed(toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, id: 0, df: true }, icmpEcho({ id: 0x1234, seq }, 'abcdefgh'))));
      buildEchoReply(buf, pkt);
      const l3 = pkt.l3Offset;
      expect(fold16(ones16(buf, l3, l3 + 20, 0))).toBe(0xffff);
      return (buf[l3 + 4]! << 8) | buf[l3 + 5]!;
    });
    expect(ids).toEqual([0x1235, 0x1236, 0x1237]);
  });

  it('turns an ICMPv6 echo request into the reply: type 129, hop limit 64, traffic class and flow label kept', () => {
    const request = toLb(
      ETH_IPV6,
      ipv6(
        { src: CLIENT6, dst: VIP6, nextHeader: 58, trafficClass: 0x20, flowLabel: 0x54321, hopLimit: 63 },
        icmpv6({ type: 128, rest: (0x1234 << 16) | 1 }, 'abcdefgh', { src: CLIENT6, dst: VIP6 }),
      ),
    );
    const { buf, pkt } = parsed(request);
    const length = buildEchoReply(buf, pkt);
    const expected = `
      020000000001 0200000000fe 86dd
      62054321 0010 3a 40                                  # hop limit 64
      20010db8000f00000000000000000010 20010db8000c00000000000000000007
      81 00 7f46 1234 0001 6162636465666768                # type 129, checksum 7f46 (request: 8046)
    `;
    expect(hex(buf.subarray(8, 8 + length))).toBe(hex(fromHex(expected)));
    const built = ethernet(
      { dst: CLIENT_MAC, src: LB_MAC, type: ETH_IPV6 },
      ipv6(
        { src: VIP6, dst: CLIENT6, nextHeader: 58, trafficClass: 0x20, flowLabel: 0x54321, hopLimit: 64 },
        icmpv6({ type: 129, rest: (0x1234 << 16) | 1 }, 'abcdefgh', { src: VIP6, dst: CLIENT6 }),
      ),
    );
    expect(hex(built)).toBe(hex(fromHex(expected)));
  });

  it('answers no echo request from a source that is no single host (broadcast, multicast, 0/8, 240/4; IPv6 :: and multicast), leaving the frame as it was', () => {
    const v4 = ['255.255.255.255', '224.0.0.1', '239.1.2.3', '0.0.0.0', '240.0.0.1'].map((src) => toLb(ETH_IPV4, ipv4({ src, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 1 }))));
    const v6 = ['::', 'ff02::1', 'ff0e::5'].map((src) =>
      toLb(ETH_IPV6, ipv6({ src, dst: VIP6, nextHeader: 58 }, icmpv6({ type: 128, rest: (1 << 16) | 1 }, 'ab', { src, dst: VIP6 }))),
    );
    for (const request of [...v4, ...v6]) {
      const { buf, pkt } = parsed(request);
      const before = hex(buf);
      expect(buildEchoReply(buf, pkt)).toBe(-DropReason.icmpToVip);
      expect(hex(buf)).toBe(before);
    }
    // The edges that are single hosts: 1.0.0.0 and 223.255.255.255, ::1.
    for (const src of ['1.0.0.0', '223.255.255.255']) {
      const { buf, pkt } = parsed(toLb(ETH_IPV4, ipv4({ src, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 1 }))));
      expect(buildEchoReply(buf, pkt)).toBeGreaterThan(0);
    }
    const { buf, pkt } = parsed(toLb(ETH_IPV6, ipv6({ src: '::1', dst: VIP6, nextHeader: 58 }, icmpv6({ type: 128, rest: 1 }, 'ab', { src: '::1', dst: VIP6 }))));
    expect(buildEchoReply(buf, pkt)).toBeGreaterThan(0);
  });

  it('returns the length without Ethernet padding for a padded minimum frame', () => {
    const request = concat(toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 2 }))), new Uint8Array(18));
    expect(request.length).toBe(60);
    const { buf, pkt } = parsed(request);
    expect(buildEchoReply(buf, pkt)).toBe(42);
  });

  it('keeps checksums right for identifiers and data that push the sums to the 0x0000 / 0xffff edges', () => {
    for (let id = 0; id < 0x10000; id += 257) {
      const request = toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, ttl: (id & 0xff) || 1 }, icmpEcho({ id, seq: 0xffff - id }, [id & 0xff, 0xf7])));
      const { buf, pkt } = parsed(request);
      const length = buildEchoReply(buf, pkt);
      const built = ethernet(
        { dst: CLIENT_MAC, src: LB_MAC, type: ETH_IPV4 },
        // The request's IP id is 0: the reply's is made from the echo id and sequence (here 0xffff).
        ipv4({ src: VIP4, dst: CLIENT4, proto: 1, ttl: 64, id: 0xffff }, icmpEcho({ id, seq: 0xffff - id, reply: true }, [id & 0xff, 0xf7])),
      );
      expect(hex(buf.subarray(8, 8 + length)), `id ${id}`).toBe(hex(built));
    }
  });

  it('verify for 20,000 requests of both families (ids, sequence numbers, lengths 0-36), the all-zero one included', () => {
    const p = new ParsedPacket();
    const bad: string[] = [];
    for (let i = 0; i < 20_000; i++) {
      const payload = Array.from({ length: i % 37 }, (_, k) => (k * 31 + i * 7) & 0xff);
      const v6 = i % 2 === 1;
      const client6 = `2001:db8::${(i % 65535).toString(16)}`;
      const f = v6
        ? toLb(ETH_IPV6, ipv6({ src: client6, dst: VIP6, nextHeader: 58, hopLimit: i & 0xff }, icmpv6({ type: 128, rest: (i * 2654435761) >>> 0 }, payload, { src: client6, dst: VIP6 })))
        : toLb(ETH_IPV4, ipv4({ src: `192.0.${(i >> 8) & 255}.${i & 255}`, dst: VIP4, proto: 1, ttl: i & 0xff, id: i }, icmpEcho({ id: (i * 7) & 0xffff, seq: (i * 13) & 0xffff }, payload)));
      if (parseFrame(f, 0, f.length, p) !== PARSE_OK || buildEchoReply(f, p) !== f.length || parseFrame(f, 0, f.length, p) !== PARSE_OK) {
        bad.push(`${i}: not answered`);
      } else if (!v6 && onesSum(f.subarray(p.l4Offset, p.l3End)) !== 0xffff) {
        bad.push(`${i}: checksum`);
      }
    }
    expect(bad).toEqual([]);
  });

  const refused: { name: string; frame: Uint8Array; reason: number }[] = [
    { name: 'an echo reply', frame: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 1, reply: true }))), reason: DropReason.icmpToVip },
    { name: 'a TCP packet', frame: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 6 }, tcp({ sport: 1, dport: 80, flags: TCP_FLAGS.SYN }, [], { src: CLIENT4, dst: VIP4 }))), reason: DropReason.icmpToVip },
    { name: 'a fragmented echo request', frame: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, mf: true }, icmpEcho({ id: 1, seq: 1 }, new Uint8Array(8)))), reason: DropReason.icmpToVip },
    { name: 'an echo request with IPv4 options', frame: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, options: [1, 1, 1, 1] }, icmpEcho({ id: 1, seq: 1 }))), reason: DropReason.icmpToVip },
    { name: 'an echo request cut to 6 bytes of ICMP', frame: toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1 }, icmpEcho({ id: 1, seq: 1 }).subarray(0, 6))), reason: DropReason.truncatedIcmp },
    {
      name: 'an ICMPv6 echo request behind a destination-options header',
      frame: toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58, extensionHeaders: [ipv6Options(60)] }, icmpv6({ type: 128 }, 'x', { src: CLIENT6, dst: VIP6 }))),
      reason: DropReason.icmpToVip,
    },
  ];
  for (const r of refused) {
    it(`refuses ${r.name} and leaves the frame alone`, () => {
      const { buf, pkt } = parsed(r.frame);
      const before = hex(buf);
      expect(buildEchoReply(buf, pkt)).toBe(-r.reason);
      expect(hex(buf)).toBe(before);
    });
  }
});
