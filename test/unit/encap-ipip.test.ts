// IPIP encapsulation as data: builder-made input frames, the exact output bytes as literals
// (checksums computed outside this code with python3 struct), DSCP/ECN/DF propagation, VLAN,
// the virtio_net_hdr move, the template layout and every refusal.

import { describe, expect, it } from 'vitest';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import {
  TEMPLATE_PARTIAL_SUM,
  TUNNEL_TEMPLATE_BYTES,
  buildTunnelTemplate,
  encapsulate,
  tunnelOverheadBytes,
  writeTunnelTemplate,
} from '../../src/encap/ipip.js';
import { FRAME_GSO, FRAME_HAS_VNET_HDR } from '../../src/io/packet-io.js';
import {
  ETH_IPV4,
  ETH_IPV6,
  TCP_FLAGS,
  concat,
  ethernet,
  fromHex,
  hex,
  ipv4,
  ipv6,
  mac,
  tcp,
  udp,
} from '../support/packet-builder.js';
import { CLIENT4, CLIENT6, CLIENT_MAC, LB_MAC, NEXT_HOP_MAC, REAL4, REAL6, SOURCE4, SOURCE6, VIP4, VIP6, toLb } from '../support/test-net.js';

const HEADROOM = 64;

const udpPing4 = ipv4({ src: CLIENT4, dst: VIP4, proto: 17, id: 0x0abc, df: true, ttl: 63 }, udp({ sport: 40000, dport: 53 }, 'ping', { src: CLIENT4, dst: VIP4 }));
const synTos4 = ipv4(
  { src: CLIENT4, dst: VIP4, proto: 6, id: 0x0101, tos: 0xb9, ttl: 63 },
  tcp({ sport: 40000, dport: 80, seq: 1, flags: TCP_FLAGS.SYN }, [], { src: CLIENT4, dst: VIP4 }),
);
const synEcn4 = ipv4(
  { src: CLIENT4, dst: VIP4, proto: 6, id: 0x0202, tos: 0x02, df: true, ttl: 63 },
  tcp({ sport: 40000, dport: 80, seq: 1, flags: TCP_FLAGS.SYN }, [], { src: CLIENT4, dst: VIP4 }),
);
const udpPing6 = ipv6(
  { src: CLIENT6, dst: VIP6, nextHeader: 17, trafficClass: 0xba, flowLabel: 0xabcde, hopLimit: 63 },
  udp({ sport: 40000, dport: 53 }, 'ping', { src: CLIENT6, dst: VIP6 }),
);
const udpPing6Plain = ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, hopLimit: 63 }, udp({ sport: 40000, dport: 53 }, 'ping', { src: CLIENT6, dst: VIP6 }));

interface EncapCase {
  name: string;
  input: Uint8Array;
  tunnel: { source: string; real: string; innerFamily: 4 | 6 };
  ipId: number;
  flowLabel: number;
  /** The whole output frame; "#" comments name the parts. */
  expected: string;
  /** The same frame from the builder: an independent check of the literal. */
  built: () => Uint8Array;
}

const CASES: EncapCase[] = [
  {
    name: '4in4: a UDP packet with DF gets an outer header with DF, identification 0 (ipId ignored), TTL 64, protocol 4',
    input: toLb(ETH_IPV4, udpPing4),
    tunnel: { source: SOURCE4, real: REAL4, innerFamily: 4 },
    ipId: 0x7777,
    flowLabel: 0,
    expected: `
      020000000011 0200000000fe 0800                      # next hop <- LB, IPv4
      4500 0034 0000 4000 4004 6db6 c0000205 0a00010b     # outer: len 52, DF, ttl 64, proto 4, checksum 6db6
      4500 0020 0abc 4000 3f11 cacb c6336407 cb00710a     # inner IPv4, untouched
      9c40 0035 000c 1e4a 70696e67                        # UDP "ping"
    `,
    built: () => ethernet({ dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV4 }, ipv4({ src: SOURCE4, dst: REAL4, proto: 4, df: true }, udpPing4)),
  },
  {
    name: '4in4: DSCP 46 and ECN CE are copied to the outer TOS, DF clear stays clear and the identification is ipId',
    input: toLb(ETH_IPV4, synTos4),
    tunnel: { source: SOURCE4, real: REAL4, innerFamily: 4 },
    ipId: 0x1234,
    flowLabel: 0,
    expected: `
      020000000011 0200000000fe 0800
      45b9 003c 1234 0000 4004 9ac1 c0000205 0a00010b     # outer: tos b9, len 60, id 1234, no DF, checksum 9ac1
      45b9 0028 0101 0000 3f06 13d1 c6336407 cb00710a
      9c40 0050 00000001 00000000 5002 ffff ad0b 0000     # TCP SYN
    `,
    built: () =>
      ethernet({ dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV4 }, ipv4({ src: SOURCE4, dst: REAL4, proto: 4, tos: 0xb9, id: 0x1234 }, synTos4)),
  },
  {
    name: '6in6: traffic class 0xba is copied, the flow label is the caller\'s, next header 41, hop limit 64',
    input: toLb(ETH_IPV6, udpPing6),
    tunnel: { source: SOURCE6, real: REAL6, innerFamily: 6 },
    ipId: 0,
    flowLabel: 0x12345,
    expected: `
      020000000011 0200000000fe 86dd
      6ba12345 0034 29 40                                 # outer: tc ba, flow 12345, payload 52, nh 41, hop 64
      20010db8000000000000000000000005 20010db8000100000000000000000011
      6baabcde 000c 11 3f                                 # inner IPv6, untouched
      20010db8000c00000000000000000007 20010db8000f00000000000000000010
      9c40 0035 000c 28ec 70696e67
    `,
    built: () =>
      ethernet(
        { dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV6 },
        ipv6({ src: SOURCE6, dst: REAL6, nextHeader: 41, trafficClass: 0xba, flowLabel: 0x12345 }, udpPing6),
      ),
  },
  {
    name: '4in6: an IPv4 VIP with an IPv6 real gets an IPv6 outer header with next header 4 and ECN ECT(0) copied',
    input: toLb(ETH_IPV4, synEcn4),
    tunnel: { source: SOURCE6, real: REAL6, innerFamily: 4 },
    ipId: 0x5555,
    flowLabel: 0,
    expected: `
      020000000011 0200000000fe 86dd
      60200000 0028 04 40                                 # outer: tc 02, payload 40, nh 4, hop 64
      20010db8000000000000000000000005 20010db8000100000000000000000011
      4502 0028 0202 4000 3f06 d386 c6336407 cb00710a
      9c40 0050 00000001 00000000 5002 ffff ad0b 0000
    `,
    built: () =>
      ethernet({ dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV6 }, ipv6({ src: SOURCE6, dst: REAL6, nextHeader: 4, trafficClass: 0x02 }, synEcn4)),
  },
  {
    name: '4in4 with an 802.1Q tag: the output carries the same tag (PCP 1, VID 100) before the outer ethertype',
    input: toLb(ETH_IPV4, udpPing4, 0x2064),
    tunnel: { source: SOURCE4, real: REAL4, innerFamily: 4 },
    ipId: 0,
    flowLabel: 0,
    expected: `
      020000000011 0200000000fe 8100 2064 0800
      4500 0034 0000 4000 4004 6db6 c0000205 0a00010b
      4500 0020 0abc 4000 3f11 cacb c6336407 cb00710a
      9c40 0035 000c 1e4a 70696e67
    `,
    built: () =>
      ethernet({ dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV4, vlan: 0x2064 }, ipv4({ src: SOURCE4, dst: REAL4, proto: 4, df: true }, udpPing4)),
  },
  {
    name: '6in4: an IPv6 packet in IPv4 gets protocol 41, DF clear (RFC 4213) and identification ipId',
    input: toLb(ETH_IPV6, udpPing6Plain),
    tunnel: { source: SOURCE4, real: REAL4, innerFamily: 6 },
    ipId: 0x4321,
    flowLabel: 0x12345,
    expected: `
      020000000011 0200000000fe 0800
      4500 0048 4321 0000 4029 6a5c c0000205 0a00010b     # outer: len 72, id 4321, proto 41, checksum 6a5c
      60000000 000c 11 3f
      20010db8000c00000000000000000007 20010db8000f00000000000000000010
      9c40 0035 000c 28ec 70696e67
    `,
    built: () => ethernet({ dst: NEXT_HOP_MAC, src: LB_MAC, type: ETH_IPV4 }, ipv4({ src: SOURCE4, dst: REAL4, proto: 41, id: 0x4321 }, udpPing6Plain)),
  },
];

/** The frame at HEADROOM in a buffer with `tail` spare bytes, parsed. */
function place(frame: Uint8Array, headroom = HEADROOM, tail = 16): { buf: Uint8Array; pkt: ParsedPacket } {
  const buf = new Uint8Array(headroom + frame.length + tail).fill(0xee);
  buf.set(frame, headroom);
  const pkt = new ParsedPacket();
  expect(parseFrame(buf, headroom, frame.length, pkt)).toBe(PARSE_OK);
  return { buf, pkt };
}

const NEXT_HOP = mac(NEXT_HOP_MAC);
const LOCAL = mac(LB_MAC);

function run(c: Pick<EncapCase, 'input' | 'tunnel' | 'ipId' | 'flowLabel'>, opts: { flags?: number; headroom?: number } = {}) {
  const template = buildTunnelTemplate(c.tunnel.source, c.tunnel.real, c.tunnel.innerFamily);
  const headroom = opts.headroom ?? HEADROOM;
  const { buf, pkt } = place(c.input, headroom);
  const before = Uint8Array.from(buf);
  const out = new Int32Array(2);
  const result = encapsulate(buf, pkt, headroom, opts.flags ?? 0, template, 0, NEXT_HOP, 0, LOCAL, c.ipId, c.flowLabel, out);
  return { result, buf, before, out, frame: buf.subarray(out[0], out[0] + out[1]) };
}

describe('encapsulate: exact output frames', () => {
  for (const c of CASES) {
    it(c.name, () => {
      const { result, out, frame } = run(c);
      expect(result).toBe(0);
      const expected = fromHex(c.expected);
      expect(hex(frame)).toBe(hex(expected));
      expect(hex(c.built())).toBe(hex(expected));
      // The inner IP packet was not moved: the new frame ends where the input's IP packet ended.
      expect(out[0] + out[1]).toBe(HEADROOM + c.input.length);
    });
  }

  it('drops Ethernet padding: a 60-byte minimum frame with a 32-byte IPv4 packet becomes a 66-byte frame', () => {
    const padded = concat(toLb(ETH_IPV4, udpPing4), new Uint8Array(14));
    expect(padded.length).toBe(60);
    const { result, frame } = run({ ...CASES[0], input: padded });
    expect(result).toBe(0);
    expect(frame.length).toBe(66);
    expect(hex(frame)).toBe(hex(fromHex(CASES[0].expected)));
  });

  it('writes only the headroom and the old Ethernet header: bytes before the new frame and the inner packet stay', () => {
    const { buf, before, out } = run(CASES[0]);
    expect(hex(buf.subarray(0, out[0]))).toBe(hex(before.subarray(0, out[0])));
    expect(hex(buf.subarray(HEADROOM + 14))).toBe(hex(before.subarray(HEADROOM + 14)));
  });
});

describe('encapsulate: virtio_net_hdr', () => {
  const VNET = 10;

  function withVnet(vnet: Uint8Array) {
    const c = CASES[1]; // 4in4 TCP SYN: csum_start 34 = 14 + 20 before encapsulation
    const template = buildTunnelTemplate(c.tunnel.source, c.tunnel.real, 4);
    const { buf, pkt } = place(c.input);
    buf.set(vnet, HEADROOM - VNET);
    const out = new Int32Array(2);
    // headroom counts the bytes before the virtio_net_hdr.
    const result = encapsulate(buf, pkt, HEADROOM - VNET, FRAME_HAS_VNET_HDR, template, 0, NEXT_HOP, 0, LOCAL, c.ipId, 0, out);
    return { result, buf, out, c };
  }

  it('moves the header to sit before the new frame and adds the 20 prepended bytes to csum_start when NEEDS_CSUM', () => {
    const { result, buf, out, c } = withVnet(fromHex('01 00 0000 0000 2200 1000')); // NEEDS_CSUM, csum_start 34, csum_offset 16 (LE)
    expect(result).toBe(0);
    expect(hex(buf.subarray(out[0] - VNET, out[0]))).toBe(hex(fromHex('01 00 0000 0000 3600 1000'))); // csum_start 54
    expect(hex(buf.subarray(out[0], out[0] + out[1]))).toBe(hex(fromHex(c.expected)));
  });

  it('moves the header unchanged when the checksum is complete (flags 0, DATA_VALID)', () => {
    for (const vnet of ['00 00 0000 0000 2200 1000', '02 00 0000 0000 0000 0000']) {
      const { result, buf, out } = withVnet(fromHex(vnet));
      expect(result).toBe(0);
      expect(hex(buf.subarray(out[0] - VNET, out[0]))).toBe(hex(fromHex(vnet)));
    }
  });
});

describe('encapsulate: refusals leave the frame unchanged', () => {
  const refusals: { name: string; reason: number; setup: () => ReturnType<typeof run> }[] = [
    {
      name: 'headroom of 19 bytes for a 20-byte outer IPv4 header: ipipUnsupported (no headroom reason yet)',
      reason: DropReason.ipipUnsupported,
      setup: () => run(CASES[0], { headroom: 19 }),
    },
    {
      name: 'headroom of 39 bytes for a 40-byte outer IPv6 header',
      reason: DropReason.ipipUnsupported,
      setup: () => run(CASES[2], { headroom: 39 }),
    },
    {
      name: 'a virtio_net_hdr that would not fit before the new frame',
      reason: DropReason.ipipUnsupported,
      setup: () => run(CASES[0], { headroom: 25, flags: FRAME_HAS_VNET_HDR }),
    },
    {
      name: 'a GSO super-frame',
      reason: DropReason.gsoUnsupported,
      setup: () => run(CASES[0], { flags: FRAME_GSO }),
    },
    {
      name: 'a template built for IPv6 inner packets given an IPv4 packet',
      reason: DropReason.ipipUnsupported,
      setup: () => run({ ...CASES[0], tunnel: { source: SOURCE4, real: REAL4, innerFamily: 6 } }),
    },
  ];
  for (const r of refusals) {
    it(r.name, () => {
      const { result, buf, before } = r.setup();
      expect(result).toBe(-r.reason);
      expect(hex(buf)).toBe(hex(before));
    });
  }

  it('an empty slot (family 0) and a slot past the end of the template array', () => {
    const templates = new Uint8Array(2 * TUNNEL_TEMPLATE_BYTES);
    writeTunnelTemplate(SOURCE4, REAL4, 4, templates, TUNNEL_TEMPLATE_BYTES);
    const { buf, pkt } = place(CASES[0].input);
    const out = new Int32Array(2);
    const call = (slot: number) => encapsulate(buf, pkt, HEADROOM, 0, templates, slot, NEXT_HOP, 0, LOCAL, 0, 0, out);
    expect(call(0)).toBe(-DropReason.ipipUnsupported);
    expect(call(2 * TUNNEL_TEMPLATE_BYTES)).toBe(-DropReason.ipipUnsupported);
    expect(call(TUNNEL_TEMPLATE_BYTES)).toBe(0);
    expect(hex(buf.subarray(out[0], out[0] + out[1]))).toBe(hex(fromHex(CASES[0].expected)));
  });
});

describe('tunnel templates', () => {
  it('lay out an IPv4 template: header with per-packet fields zero, family, overhead, partial sum 0x5215, ethertype', () => {
    expect(hex(buildTunnelTemplate(SOURCE4, REAL4, 4))).toBe(
      hex(
        fromHex(`
          4500 0000 0000 0000 4004 0000 c0000205 0a00010b   # header, per-packet fields zero
          00000000000000000000000000000000 00000000         # rest of the 40 header bytes
          04 14 5215 0800 04 00                             # family 4, 20 bytes, partial sum, ethertype, inner 4
        `),
      ),
    );
    // 4500 + 4004 + c000 + 0205 + 0a00 + 010b = 0x15214 -> folded 0x5215.
    expect(buildTunnelTemplate(SOURCE4, REAL4, 6)[TEMPLATE_PARTIAL_SUM + 1]).toBe(0x3a); // protocol 41: 0x523a
  });

  it('lay out an IPv6 template with next header 4 for IPv4 inner packets', () => {
    expect(hex(buildTunnelTemplate(SOURCE6, REAL6, 4))).toBe(
      hex(
        fromHex(`
          60000000 0000 04 40 20010db8000000000000000000000005 20010db8000100000000000000000011
          06 28 0000 86dd 04 00                            # family 6, 40 bytes, no sum, ethertype, inner 4
        `),
      ),
    );
  });

  it('report the overhead per slot and -1 for empty or out-of-range slots', () => {
    const templates = new Uint8Array(3 * TUNNEL_TEMPLATE_BYTES);
    writeTunnelTemplate(SOURCE4, REAL4, 4, templates, 0);
    writeTunnelTemplate(SOURCE6, REAL6, 6, templates, 2 * TUNNEL_TEMPLATE_BYTES);
    expect(tunnelOverheadBytes(templates, 0)).toBe(20);
    expect(tunnelOverheadBytes(templates, TUNNEL_TEMPLATE_BYTES)).toBe(-1);
    expect(tunnelOverheadBytes(templates, 2 * TUNNEL_TEMPLATE_BYTES)).toBe(40);
    expect(tunnelOverheadBytes(templates, 3 * TUNNEL_TEMPLATE_BYTES)).toBe(-1);
    expect(tunnelOverheadBytes(templates, -1)).toBe(-1);
  });

  it('refuse a source and a real of different families, bad addresses and slots that do not fit', () => {
    expect(() => buildTunnelTemplate(SOURCE4, REAL6, 4)).toThrow(/same family/);
    expect(() => buildTunnelTemplate('192.0.2', REAL4, 4)).toThrow();
    expect(() => writeTunnelTemplate(SOURCE4, REAL4, 4, new Uint8Array(TUNNEL_TEMPLATE_BYTES), 1)).toThrow(/does not fit/);
  });

  it('give the same checksum per packet as a full computation for every TOS, length, DF and identification tried', () => {
    const template = buildTunnelTemplate('255.255.255.254', '255.255.255.253', 4);
    const out = new Int32Array(2);
    for (const tos of [0, 0x03, 0xfc, 0xff]) {
      for (const payloadBytes of [0, 1, 1400, 65_000]) {
        for (const df of [false, true]) {
          const inner = ipv4({ src: CLIENT4, dst: VIP4, proto: 253, tos, df }, new Uint8Array(payloadBytes));
          const { buf, pkt } = place(toLb(ETH_IPV4, inner));
          expect(encapsulate(buf, pkt, HEADROOM, 0, template, 0, NEXT_HOP, 0, LOCAL, 0xffff, 0, out)).toBe(0);
          const outer = buf.subarray(out[0] + 14, out[0] + 34);
          const expected = ipv4({ src: '255.255.255.254', dst: '255.255.255.253', proto: 4, tos, df, id: df ? 0 : 0xffff }, inner).subarray(0, 20);
          expect(hex(outer)).toBe(hex(expected));
        }
      }
    }
  });
});
