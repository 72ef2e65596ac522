// A second opinion from Wireshark's dissectors: every kind of frame src/encap produces (4in4, 6in6,
// 4in6, 6in4, VLAN, outer fragments, frag-needed, Packet Too Big, echo replies) is written to a
// pcap and read back with tshark, checksum validation on; nothing may be malformed or bad.
// Needs tshark (Debian package "tshark"); the test fails, never skips, without it.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { buildEchoReply } from '../../src/encap/icmp-to-vip.js';
import { buildTunnelTemplate, encapsulate } from '../../src/encap/ipip.js';
import { buildFragNeeded, buildPacketTooBig, fragmentOuter, tooBigMtu } from '../../src/encap/too-big.js';
import { ETH_IPV4, ETH_IPV6, TCP_FLAGS, ethernet, icmpEcho, icmpv6, ipv4, ipv6, mac, patternBytes, tcp, udp } from '../support/packet-builder.js';
import { CLIENT4, CLIENT6, LB_MAC, NEXT_HOP_MAC, REAL4, REAL6, SOURCE4, SOURCE6, VIP4, VIP6 } from '../support/test-net.js';
import { pcapFile, requireTshark, runTshark } from '../support/pcap-writer.js';

const LB = mac(LB_MAC);
const NEXT_HOP = mac(NEXT_HOP_MAC);
const T4: [string, string] = [SOURCE4, REAL4];
const T6: [string, string] = [SOURCE6, REAL6];
const HEADROOM = 128;
/** A port no dissector claims, so the payload stays plain data. */
const PORT = 9;

const toLb = (type: number, packet: Uint8Array, vlan?: number) => ethernet({ dst: '02:00:00:00:00:fe', src: '02:00:00:00:00:01', type, vlan }, packet);
const tcp4 = (payload: Uint8Array, df: boolean, tos = 0) =>
  ipv4({ src: CLIENT4, dst: VIP4, proto: 6, df, tos, id: 0x3039 }, tcp({ sport: 40000, dport: PORT, seq: 1, ack: 1, flags: TCP_FLAGS.ACK }, payload, { src: CLIENT4, dst: VIP4 }));
const udp4 = () => ipv4({ src: CLIENT4, dst: VIP4, proto: 17, df: true }, udp({ sport: 40000, dport: PORT }, 'ping', { src: CLIENT4, dst: VIP4 }));
const tcp6 = (payload: Uint8Array, trafficClass = 0) =>
  ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 6, trafficClass, flowLabel: 0x12345 }, tcp({ sport: 40000, dport: PORT, seq: 1, ack: 1, flags: TCP_FLAGS.ACK }, payload, { src: CLIENT6, dst: VIP6 }));

function parsed(frame: Uint8Array): { buf: Uint8Array; pkt: ParsedPacket } {
  const buf = new Uint8Array(HEADROOM + frame.length);
  buf.set(frame, HEADROOM);
  const pkt = new ParsedPacket();
  expect(parseFrame(buf, HEADROOM, frame.length, pkt)).toBe(PARSE_OK);
  return { buf, pkt };
}

/** Encapsulates and, when `mtu` is given, fragments; returns every frame to send. */
function tunnelled(frame: Uint8Array, tunnel: [string, string], ipId: number, mtu?: number): Uint8Array[] {
  const { buf, pkt } = parsed(frame);
  const template = buildTunnelTemplate(tunnel[0], tunnel[1], pkt.family as 4 | 6);
  const out = new Int32Array(2);
  expect(encapsulate(buf, pkt, HEADROOM, 0, template, 0, NEXT_HOP, 0, LB, ipId, 0xabcde, out)).toBe(0);
  if (mtu === undefined) return [buf.slice(out[0], out[0] + out[1])];
  const overhead = template[41];
  const scratch = new Uint8Array(4096);
  const frags = new Int32Array(9);
  const count = fragmentOuter(buf, out[0], out[1], HEADROOM - overhead, 0, mtu, 0x0c0ffee0, scratch, 0, 0, frags);
  expect(count).toBeGreaterThan(1);
  const frames = [buf.slice(frags[1], frags[1] + frags[2])];
  for (let k = 1; k < count; k++) frames.push(scratch.slice(frags[1 + 2 * k], frags[1 + 2 * k] + frags[2 + 2 * k]));
  return frames;
}

function tooBig(frame: Uint8Array, overhead: number, mtu: number): Uint8Array {
  const { buf, pkt } = parsed(frame);
  const scratch = new Uint8Array(2048);
  const length =
    pkt.family === 4
      ? buildFragNeeded(buf, pkt, tooBigMtu(4, overhead, mtu), LB, scratch, 0)
      : buildPacketTooBig(buf, pkt, tooBigMtu(6, overhead, mtu), LB, scratch, 0);
  expect(length).toBeGreaterThan(0);
  return scratch.slice(0, length);
}

function echoReply(frame: Uint8Array): Uint8Array {
  const { buf, pkt } = parsed(frame);
  const length = buildEchoReply(buf, pkt);
  expect(length).toBeGreaterThan(0);
  return buf.slice(HEADROOM, HEADROOM + length);
}

/**
 * Frames in pcap order with the protocol stack tshark must report for each (frame.protocols).
 * `quoteCut`: an ICMP error quoting only the start of a TCP segment, whose TCP checksum tshark
 * cannot verify (it reports the cut segment's sum as bad): checked with TCP validation off.
 */
const FRAMES: { name: string; frames: () => Uint8Array[]; protocols: string[]; quoteCut?: boolean }[] = [
  { name: '4in4 UDP', frames: () => tunnelled(toLb(ETH_IPV4, udp4()), T4, 0), protocols: ['eth:ethertype:ip:ip:udp:data'] },
  { name: '4in4 TCP, DSCP/ECN', frames: () => tunnelled(toLb(ETH_IPV4, tcp4(patternBytes(10), false, 0xb9)), T4, 7), protocols: ['eth:ethertype:ip:ip:tcp:data'] },
  { name: '6in6 TCP', frames: () => tunnelled(toLb(ETH_IPV6, tcp6(patternBytes(10), 0xba)), T6, 0), protocols: ['eth:ethertype:ipv6:ipv6:tcp:data'] },
  { name: '4in6 TCP', frames: () => tunnelled(toLb(ETH_IPV4, tcp4(patternBytes(10), true)), T6, 0), protocols: ['eth:ethertype:ipv6:ip:tcp:data'] },
  { name: '6in4 TCP', frames: () => tunnelled(toLb(ETH_IPV6, tcp6(patternBytes(10))), T4, 9), protocols: ['eth:ethertype:ip:ipv6:tcp:data'] },
  { name: '4in4 with VLAN 100', frames: () => tunnelled(toLb(ETH_IPV4, udp4(), 0x2064), T4, 0), protocols: ['eth:ethertype:vlan:ethertype:ip:ip:udp:data'] },
  {
    name: '4in4 outer fragments at MTU 1500',
    frames: () => tunnelled(toLb(ETH_IPV4, tcp4(patternBytes(1460), false)), T4, 0x1234, 1500),
    protocols: ['eth:ethertype:ip:data', 'eth:ethertype:ip:ip:tcp:data'],
  },
  {
    name: '4in4 outer fragments at MTU 576',
    frames: () => tunnelled(toLb(ETH_IPV4, tcp4(patternBytes(1460), false)), T4, 0x1235, 576),
    protocols: ['eth:ethertype:ip:data', 'eth:ethertype:ip:data', 'eth:ethertype:ip:ip:tcp:data'],
  },
  {
    name: '6in6 outer fragments at MTU 1300',
    frames: () => tunnelled(toLb(ETH_IPV6, tcp6(patternBytes(1220))), T6, 0, 1300),
    protocols: ['eth:ethertype:ipv6:ipv6.fraghdr:data', 'eth:ethertype:ipv6:ipv6.fraghdr:ipv6:tcp:data'],
  },
  {
    name: '4in6 outer fragments at MTU 1500',
    frames: () => tunnelled(toLb(ETH_IPV4, tcp4(patternBytes(1460), false)), T6, 0, 1500),
    protocols: ['eth:ethertype:ipv6:ipv6.fraghdr:data', 'eth:ethertype:ipv6:ipv6.fraghdr:ip:tcp:data'],
  },
  {
    name: 'frag-needed quoting a whole 440-byte packet',
    frames: () => [tooBig(toLb(ETH_IPV4, tcp4(patternBytes(400), true)), 20, 420)],
    protocols: ['eth:ethertype:ip:icmp:ip:tcp:data'],
  },
  {
    name: 'Packet Too Big quoting a whole 1060-byte packet',
    frames: () => [tooBig(toLb(ETH_IPV6, tcp6(patternBytes(1000))), 40, 1060)],
    protocols: ['eth:ethertype:ipv6:icmpv6:ipv6:tcp:data'],
  },
  {
    name: 'ICMP echo reply',
    frames: () => [echoReply(toLb(ETH_IPV4, ipv4({ src: CLIENT4, dst: VIP4, proto: 1, ttl: 3 }, icmpEcho({ id: 7, seq: 9 }, patternBytes(56)))))],
    protocols: ['eth:ethertype:ip:icmp:data'],
  },
  {
    name: 'ICMPv6 echo reply',
    frames: () => [echoReply(toLb(ETH_IPV6, ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 58 }, icmpv6({ type: 128, rest: (7 << 16) | 9 }, patternBytes(56), { src: CLIENT6, dst: VIP6 }))))],
    protocols: ['eth:ethertype:ipv6:icmpv6:data'],
  },
  {
    name: 'frag-needed about a 1500-byte packet (548 bytes quoted)',
    frames: () => [tooBig(toLb(ETH_IPV4, tcp4(patternBytes(1460), true)), 20, 1500)],
    protocols: ['eth:ethertype:ip:icmp:ip:tcp:data'],
    quoteCut: true,
  },
  {
    name: 'Packet Too Big about a 1500-byte packet (1232 bytes quoted)',
    frames: () => [tooBig(toLb(ETH_IPV6, tcp6(patternBytes(1440))), 40, 1500)],
    protocols: ['eth:ethertype:ipv6:icmpv6:ipv6:tcp:data'],
    quoteCut: true,
  },
];

/** Sequence analysis off: the test flows reuse sequence numbers, which tshark would flag as retransmissions. */
const COMMON = ['-n', '-o', 'ip.check_checksum:TRUE', '-o', 'udp.check_checksum:TRUE', '-o', 'tcp.analyze_sequence_numbers:FALSE'];

interface TsharkView {
  verbose: string;
  protocols: string[];
}

describe('tshark reads every frame src/encap builds as well-formed, with good checksums', () => {
  let dir = '';
  let whole: TsharkView = { verbose: '', protocols: [] };
  let cut: TsharkView = { verbose: '', protocols: [] };

  function tshark(name: string, frames: Uint8Array[], tcpChecksum: boolean): TsharkView {
    const file = join(dir, name);
    writeFileSync(file, pcapFile(frames));
    const args = [...COMMON, '-o', `tcp.check_checksum:${tcpChecksum ? 'TRUE' : 'FALSE'}`];
    const verbose = runTshark(file, [...args, '-V'], dir);
    const protocols = runTshark(file, [...args, '-T', 'fields', '-e', 'frame.protocols'], dir).trim().split('\n');
    return { verbose, protocols };
  }

  beforeAll(() => {
    expect(requireTshark()).toMatch(/TShark/);
    dir = mkdtempSync(join(tmpdir(), 'dsrlb-encap-tshark-'));
    whole = tshark('whole.pcap', FRAMES.filter((f) => !f.quoteCut).flatMap((f) => f.frames()), true);
    cut = tshark('quote-cut.pcap', FRAMES.filter((f) => f.quoteCut).flatMap((f) => f.frames()), false);
  });

  afterAll(() => {
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });

  const complaints = (v: TsharkView) => v.verbose.split('\n').filter((line) => /malformed|bad|incorrect|exception|Expert Info \((Error|Warning)/i.test(line));

  it('reports no malformed packet, no warning and no bad checksum or length anywhere', () => {
    expect(complaints(whole)).toEqual([]);
    expect(complaints(cut)).toEqual([]);
  });

  it('verifies checksums as "Good": IPv4 headers, TCP and UDP (after reassembly), ICMP, ICMPv6', () => {
    const lines = (v: TsharkView, what: RegExp) => v.verbose.split('\n').filter((line) => what.test(line)).length;
    // IPv4 headers: 4in4 UDP and TCP 2 + 2, 4in6 1, 6in4 1, VLAN 2, outer fragments 2 + 3 and the
    // reassembled inner 1 + 1, 4in6 fragments' inner 1, frag-needed and its quote 2, echo reply 1.
    expect(lines(whole, /\[Header checksum status: Good\]/)).toBe(19);
    // TCP/UDP/ICMP/ICMPv6: six tunnelled packets, four reassembled ones, frag-needed and PTB with
    // their quoted TCP segments (2 + 2), two echo replies.
    expect(lines(whole, /\[Checksum Status: Good\]/)).toBe(16);
    expect(lines(whole, /status: (Bad|Unverified)/i)).toBe(0);
    // The outer fragments come back together: two 1500-byte IPIP payloads, a 1280-byte 6in6 and a 1500-byte 4in6 one.
    expect(lines(whole, /\[Reassembled IPv4 length: 1500\]/)).toBe(2);
    expect(lines(whole, /\[Reassembled IPv6 length: 1280\]/)).toBe(1);
    expect(lines(whole, /\[Reassembled IPv6 length: 1500\]/)).toBe(1);
    expect(lines(cut, /\[Checksum Status: Good\]/)).toBe(2); // the ICMP and ICMPv6 checksums over the cut quotes
    expect(lines(cut, /\[Header checksum status: Good\]/)).toBe(2); // the frag-needed's header and its quote's
    expect(cut.verbose).toMatch(/MTU of next hop: 1480/);
    expect(cut.verbose).toMatch(/MTU: 1460/);
  });

  it('decodes each frame to the expected protocol stack', () => {
    expect(whole.protocols).toEqual(FRAMES.filter((f) => !f.quoteCut).flatMap((f) => f.protocols));
    expect(cut.protocols).toEqual(FRAMES.filter((f) => f.quoteCut).flatMap((f) => f.protocols));
  });
});
