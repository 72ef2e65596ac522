// Checksum helpers against literal checksums (RFC examples, frames computed outside this code),
// against the test builder's independent implementation, and CHECKSUM_PARTIAL completion.

import { describe, expect, it } from 'vitest';
import {
  completePartialChecksum,
  fold16,
  incrementalUpdate16,
  ipv4HeaderChecksum,
  l4Checksum,
  l4ChecksumOffset,
  ones16,
  pseudoHeaderSum,
} from '../../src/dataplane/checksum.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket, TCP_ACK, TCP_SYN } from '../../src/dataplane/parsed-packet.js';
import {
  ETH_IPV4,
  ETH_IPV6,
  concat,
  ethernet,
  fromHex,
  hex,
  icmpEcho,
  icmpv6,
  ipv4,
  ipv6,
  ipv6Fragment,
  ipv6Options,
  tcp,
  udp,
} from '../support/packet-builder.js';

const MACS = { dst: '02:00:00:00:00:02', src: '02:00:00:00:00:01' };

/** A TCP SYN 192.168.1.10:54321 -> 10.0.0.100:80; IPv4 checksum 0x5260 and TCP checksum 0xc6d9 computed outside this code. */
const SYN_V4 = fromHex(`
  020000000002 020000000001 0800
  4500 003c 1c46 4000 4006 5260 c0a8010a 0a000064
  d431 0050 3a5f1c07 00000000 a002 faf0 c6d9 0000
  020405b4 0402 080a 00098f2e 00000000 01 030307
`);
const SYN_PSEUDO_HEADER_SUM = 0xcc44; // folded: c0a8 + 010a + 0a00 + 0064 + 0006 + 0028

function parsed(frame: Uint8Array, offset = 0): ParsedPacket {
  const pkt = new ParsedPacket();
  expect(parseFrame(frame, offset, frame.length - offset, pkt)).toBe(PARSE_OK);
  return pkt;
}

function read16(buf: Uint8Array, at: number): number {
  return (buf[at] << 8) | buf[at + 1];
}

const v4 = (src: string, dst: string, proto: number, l4: Uint8Array, vlan?: number) =>
  ethernet({ ...MACS, type: ETH_IPV4, vlan }, ipv4({ src, dst, proto }, l4));
const v6 = (src: string, dst: string, nextHeader: number, l4: Uint8Array, ext = [] as ReturnType<typeof ipv6Options>[]) =>
  ethernet({ ...MACS, type: ETH_IPV6 }, ipv6({ src, dst, nextHeader, extensionHeaders: ext }, l4));

describe('ones16 and fold16', () => {
  it('sum the RFC 1071 section 3 example to 0x2ddf0 unfolded and 0xddf2 folded', () => {
    const data = fromHex('0001 f203 f4f5 f6f7');
    expect(ones16(data, 0, data.length, 0)).toBe(0x2ddf0);
    expect(fold16(ones16(data, 0, data.length, 0))).toBe(0xddf2);
  });

  it('pad an odd last byte with zero as the high half of a word', () => {
    expect(ones16(Uint8Array.of(0x01, 0x02, 0x03), 0, 3, 0)).toBe(0x0402);
    expect(ones16(Uint8Array.of(0xff), 0, 1, 7)).toBe(0xff07);
  });

  it('chain over even-length ranges to the same sum as one range, and clamp reads to the buffer', () => {
    const data = Uint8Array.from({ length: 101 }, (_, i) => (i * 37) & 0xff);
    const whole = ones16(data, 0, 101, 0);
    expect(ones16(data, 40, 101, ones16(data, 10, 40, ones16(data, 0, 10, 0)))).toBe(whole);
    expect(ones16(data, -4, 500, 0)).toBe(whole);
    expect(ones16(data, 50, 40, 9)).toBe(9);
  });

  it('fold carries beyond 32 bits correctly (0x3_0000_0005 folds to 8) and keep 0 and 0xffff apart', () => {
    expect(fold16(0x3_0000_0005)).toBe(8);
    expect(fold16(0x1fffe)).toBe(0xffff);
    expect(fold16(0xffff)).toBe(0xffff);
    expect(fold16(0)).toBe(0);
  });
});

describe('ipv4HeaderChecksum', () => {
  it('gives 0xb861 for the classic 192.168.0.1 -> 192.168.0.199 UDP header, ignoring the stored value', () => {
    const header = fromHex('4500 0073 0000 4000 4011 0000 c0a8 0001 c0a8 00c7');
    expect(ipv4HeaderChecksum(header, 0, 20)).toBe(0xb861);
    header[10] = 0x12;
    expect(ipv4HeaderChecksum(header, 0, 20)).toBe(0xb861);
  });

  it('gives the literal 0x5260 for the SYN frame at offset 14, and the builder value for a header with options', () => {
    expect(ipv4HeaderChecksum(SYN_V4, 14, 20)).toBe(0x5260);
    const ip = ipv4({ src: '10.1.2.3', dst: '10.3.2.1', proto: 17, ttl: 9, id: 77, options: [0x94, 0x04, 0, 0, 1, 1, 1, 0] }, 'x');
    expect(ipv4HeaderChecksum(ip, 0, 28)).toBe(read16(ip, 10));
  });
});

describe('l4Checksum', () => {
  const literals = [
    { name: 'the TCP SYN over IPv4', frame: SYN_V4, checksum: 0xc6d9 },
    { name: 'UDP 10.0.0.1:5000 -> 10.0.0.2:6000 "ping"', frame: v4('10.0.0.1', '10.0.0.2', 17, udp({ sport: 5000, dport: 6000 }, 'ping', { src: '10.0.0.1', dst: '10.0.0.2' })), checksum: 0xe20a },
    { name: 'UDP [2001:db8::1]:40000 -> [2001:db8::2]:53 "hello"', frame: v6('2001:db8::1', '2001:db8::2', 17, udp({ sport: 40000, dport: 53 }, 'hello', { src: '2001:db8::1', dst: '2001:db8::2' })), checksum: 0xc417 },
    { name: 'ICMP echo id 0x1234 seq 1 "abcd" (no pseudo-header)', frame: v4('10.0.0.1', '10.0.0.2', 1, icmpEcho({ id: 0x1234, seq: 1 }, 'abcd')), checksum: 0x2104 },
  ];
  it.each(literals.map((l) => [l.name, l] as const))('computes the literal checksum of %s, as stored by the builder', (_n, l) => {
    const pkt = parsed(l.frame);
    expect(l4Checksum(l.frame, pkt)).toBe(l.checksum);
    expect(read16(l.frame, l4ChecksumOffset(pkt))).toBe(l.checksum);
  });

  const A4 = { src: '198.51.100.7', dst: '203.0.113.9' };
  const A6 = { src: 'fd00:1::7', dst: 'fd00:2::9' };
  const agreeing = [
    { name: 'TCP over IPv4 with a VLAN tag and payload', frame: v4(A4.src, A4.dst, 6, tcp({ sport: 1234, dport: 80, flags: TCP_ACK, seq: 99 }, 'GET / HTTP/1.1\r\n\r\n', A4), 7) },
    { name: 'TCP over IPv6 with hop-by-hop and destination options (not in the upper-layer length)', frame: v6(A6.src, A6.dst, 6, tcp({ sport: 1, dport: 443, flags: TCP_SYN }, 'odd', A6), [ipv6Options(0, [5, 2, 0, 0]), ipv6Options(60, new Uint8Array(10))]) },
    { name: 'ICMPv6 echo with the pseudo-header', frame: v6(A6.src, A6.dst, 58, icmpv6({ type: 128, rest: 0x00010002 }, 'ping6', A6)) },
    { name: 'ICMPv6 packet too big', frame: v6(A6.src, A6.dst, 58, icmpv6({ type: 2, rest: 1280 }, new Uint8Array(77).fill(3), A6)) },
    { name: 'UDP over IPv6 through an atomic fragment header', frame: v6(A6.src, A6.dst, 17, udp({ sport: 5, dport: 6 }, 'abc', A6), [ipv6Fragment({ offset: 0, more: false, id: 1 })]) },
  ];
  it.each(agreeing.map((a) => [a.name, a] as const))('agrees with the builder for %s', (_n, a) => {
    const pkt = parsed(a.frame);
    expect(l4Checksum(a.frame, pkt)).toBe(read16(a.frame, l4ChecksumOffset(pkt)));
  });

  it('covers only the UDP length when the IP payload has trailing bytes', () => {
    const ip = { src: '10.0.0.1', dst: '10.0.0.2' };
    const frame = ethernet({ ...MACS, type: ETH_IPV4 }, ipv4({ ...ip, proto: 17 }, concat(udp({ sport: 1, dport: 2 }, 'ab', ip), [9, 8, 7, 6])));
    const pkt = parsed(frame);
    expect(pkt.l3End - pkt.l4Offset).toBe(14);
    expect(l4Checksum(frame, pkt)).toBe(read16(frame, pkt.l4Offset + 6));
  });

  it('returns 0xffff, never 0, for a UDP datagram whose checksum computes to zero', () => {
    const ip = { src: '10.0.0.1', dst: '10.0.0.2' };
    const base = v4(ip.src, ip.dst, 17, udp({ sport: 1, dport: 2 }, [0, 0], ip));
    const pkt = parsed(base);
    // Choose the last payload word so the one's-complement sum is 0xffff, i.e. the checksum is 0.
    const partial = fold16(ones16(base, pkt.l4Offset, pkt.l4Offset + 6, pseudoHeaderSum(base, pkt)) + ones16(base, pkt.l4Offset + 8, pkt.l3End, 0));
    const word = ~partial & 0xffff;
    const frame = v4(ip.src, ip.dst, 17, udp({ sport: 1, dport: 2 }, [word >> 8, word & 0xff], ip));
    expect(l4Checksum(frame, parsed(frame))).toBe(0xffff);
    expect(read16(frame, pkt.l4Offset + 6)).toBe(0xffff);
  });

  it('returns -1 for fragments of a larger datagram and for protocols without a checksum we handle', () => {
    const ip = { src: '10.0.0.1', dst: '10.0.0.2' };
    const first = ethernet({ ...MACS, type: ETH_IPV4 }, ipv4({ ...ip, proto: 17, mf: true, id: 1 }, udp({ sport: 1, dport: 2 }, 'ab', ip)));
    const later = ethernet({ ...MACS, type: ETH_IPV4 }, ipv4({ ...ip, proto: 17, fragOffset: 16, id: 1 }, 'abcdefgh'));
    const gre = ethernet({ ...MACS, type: ETH_IPV4 }, ipv4({ ...ip, proto: 47 }, new Uint8Array(8)));
    for (const frame of [first, later, gre]) expect(l4Checksum(frame, parsed(frame))).toBe(-1);
  });
});

describe('pseudoHeaderSum', () => {
  it('gives the folded literal 0xcc44 for the SYN (addresses, protocol 6, length 40)', () => {
    expect(pseudoHeaderSum(SYN_V4, parsed(SYN_V4))).toBe(SYN_PSEUDO_HEADER_SUM);
  });
});

describe('completePartialChecksum', () => {
  const A4 = { src: '10.0.0.1', dst: '10.0.0.100' };
  const A6 = { src: '2001:db8::1', dst: '2001:db8::100' };
  const frames = [
    { name: 'the literal TCP SYN over IPv4', frame: SYN_V4, offset: 0 },
    { name: 'TCP over IPv4 with a VLAN tag, 5 bytes into a buffer', frame: concat(new Uint8Array(5).fill(0xee), v4(A4.src, A4.dst, 6, tcp({ sport: 2, dport: 80, flags: TCP_ACK }, 'data!', A4), 3)), offset: 5 },
    { name: 'UDP over IPv4', frame: v4(A4.src, A4.dst, 17, udp({ sport: 53, dport: 3333 }, 'answer', A4)), offset: 0 },
    { name: 'TCP over IPv6 with extension headers', frame: v6(A6.src, A6.dst, 6, tcp({ sport: 9, dport: 443, flags: TCP_SYN }, '', A6), [ipv6Options(0), ipv6Options(60)]), offset: 0 },
    { name: 'UDP over IPv6', frame: v6(A6.src, A6.dst, 17, udp({ sport: 53, dport: 3333 }, 'answer6', A6)), offset: 0 },
    { name: 'ICMPv6 echo', frame: v6(A6.src, A6.dst, 58, icmpv6({ type: 129, rest: 7 }, 'pong', A6)), offset: 0 },
  ];

  it.each(frames.map((f) => [f.name, f] as const))(
    'restores %s after its checksum is replaced by the pseudo-header sum, and leaves a complete frame alone',
    (_n, f) => {
      const pkt = parsed(f.frame, f.offset);
      const field = l4ChecksumOffset(pkt);
      const sum = pseudoHeaderSum(f.frame, pkt);
      const partial = Uint8Array.from(f.frame);
      partial[field] = sum >> 8;
      partial[field + 1] = sum & 0xff;
      expect(hex(partial)).not.toBe(hex(f.frame));

      expect(completePartialChecksum(partial, pkt)).toBe(true);
      expect(hex(partial)).toBe(hex(f.frame));
      expect(completePartialChecksum(partial, pkt)).toBe(false);
      expect(hex(partial)).toBe(hex(f.frame));
    },
  );

  it('completes the SYN from the literal partial value 0xcc44 a Linux sender would leave', () => {
    const partial = Uint8Array.from(SYN_V4);
    partial[50] = 0xcc;
    partial[51] = 0x44;
    expect(completePartialChecksum(partial, parsed(partial))).toBe(true);
    expect(hex(partial)).toBe(hex(SYN_V4));
  });

  it('never touches ICMP over IPv4 (no pseudo-header) or a frame with a wrong but non-partial checksum', () => {
    const ip = { src: '10.0.0.1', dst: '10.0.0.2' };
    const echo = v4(ip.src, ip.dst, 1, icmpEcho({ id: 1, seq: 1 }));
    const before = hex(echo);
    expect(completePartialChecksum(echo, parsed(echo))).toBe(false);
    expect(hex(echo)).toBe(before);

    const wrong = Uint8Array.from(SYN_V4);
    wrong[50] = 0x12;
    wrong[51] = 0x34;
    expect(completePartialChecksum(wrong, parsed(wrong))).toBe(false);
    expect(read16(wrong, 50)).toBe(0x1234);
  });
});

describe('incrementalUpdate16', () => {
  it('gives 0x0000 for the RFC 1624 section 4 example (HC 0xdd2f, m 0x5555 -> 0x3285)', () => {
    expect(incrementalUpdate16(0xdd2f, 0x5555, 0x3285)).toBe(0x0000);
  });

  it('matches a full recomputation for 2,000 seeded random IPv4 headers with one word changed', () => {
    let seed = 12345;
    const rand16 = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed >>> 16;
    };
    for (let i = 0; i < 2000; i++) {
      const header = new Uint8Array(20);
      for (let w = 0; w < 10; w++) {
        const v = rand16();
        header[2 * w] = v >> 8;
        header[2 * w + 1] = v & 0xff;
      }
      header[0] = 0x45;
      const csum = ipv4HeaderChecksum(header, 0, 20);
      let word = rand16() % 10;
      if (word === 5) word = 4; // not the checksum field itself
      const oldWord = read16(header, 2 * word);
      const newWord = rand16();
      header[2 * word] = newWord >> 8;
      header[2 * word + 1] = newWord & 0xff;
      expect(incrementalUpdate16(csum, oldWord, newWord), `header ${i}`).toBe(ipv4HeaderChecksum(header, 0, 20));
    }
  });

  it('updates the SYN TCP checksum for a new destination port as a full recomputation does', () => {
    const frame = Uint8Array.from(SYN_V4);
    const pkt = parsed(frame);
    frame[36] = 0x1f; // port 80 -> 8080
    frame[37] = 0x90;
    expect(incrementalUpdate16(0xc6d9, 80, 8080)).toBe(l4Checksum(frame, pkt));
  });
});
