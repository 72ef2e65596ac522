// `dsrlb decap` without root: which tunnel packets become inner packets (as data: builder-made
// packets, the expected inner bytes or drop reason), the counters, which raw sockets a VIP set
// needs, and the host changes with their undo (fake runner, sysctls and TUN opener).

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Logger } from '../../src/control/logger.js';
import { DecapHost, type SysctlAccess, type TunOpener } from '../../src/decap/decap-host.js';
import ipaddr from 'ipaddr.js';
import { Decapsulator } from '../../src/decap/decapsulator.js';
import { SourceFilter } from '../../src/decap/source-filter.js';
import {
  DecapDrop,
  INNER_FAMILY,
  INNER_LENGTH,
  INNER_OFFSET,
  VipSet,
  innerOfIpv4Outer,
  innerOfIpv6Outer,
} from '../../src/decap/inner-packet.js';
import { tunnelSocketSpecs } from '../../src/decap/tunnel-sockets.js';
import { DEFAULT_TUN_NAME, parseDecapOptions } from '../../src/decap/decap-command.js';
import { concat, ipv4, ipv6, patch, udp } from '../support/packet-builder.js';
import { CLIENT4, CLIENT6, REAL4, REAL6, VIP4, VIP6 } from '../support/test-net.js';

const LB4 = '192.0.2.5';
const LB6 = '2001:db8:1::5';
const vips = new VipSet([VIP4, VIP6]);

const inner4 = (dst = VIP4): Uint8Array =>
  ipv4({ src: CLIENT4, dst, proto: 17 }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT4, dst }));
const inner6 = (dst = VIP6): Uint8Array =>
  ipv6({ src: CLIENT6, dst, nextHeader: 17 }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT6, dst }));
const outer4 = (proto: number, inner: Uint8Array): Uint8Array => ipv4({ src: LB4, dst: REAL4, proto }, inner);

/** Runs innerOfIpv4Outer; the inner bytes, or the drop reason's name. */
function fromIpv4Outer(packet: Uint8Array): Uint8Array | string {
  const out = new Int32Array(3);
  const verdict = innerOfIpv4Outer(packet, packet.length, vips, out);
  if (verdict < 0) return Object.entries(DecapDrop).find(([, v]) => v === -verdict)![0];
  return packet.subarray(out[INNER_OFFSET]!, out[INNER_OFFSET]! + out[INNER_LENGTH]!);
}

function fromIpv6Outer(payload: Uint8Array, protocol: number, outerTrafficClass = -1): Uint8Array | string {
  const out = new Int32Array(3);
  const verdict = innerOfIpv6Outer(payload, payload.length, protocol, outerTrafficClass, vips, out);
  if (verdict < 0) return Object.entries(DecapDrop).find(([, v]) => v === -verdict)![0];
  expect(out[INNER_FAMILY]).toBe(payload[0]! >> 4);
  return payload.subarray(out[INNER_OFFSET]!, out[INNER_OFFSET]! + out[INNER_LENGTH]!);
}

describe('inner packets of an IPv4 raw socket (outer header included)', () => {
  it('an IPv4 packet to a VIP inside protocol 4 is the 20 bytes after the outer header', () => {
    expect(fromIpv4Outer(outer4(4, inner4()))).toEqual(inner4());
  });

  it('an IPv6 packet to a VIP inside protocol 41 (6in4) is delivered as well', () => {
    expect(fromIpv4Outer(outer4(41, inner6()))).toEqual(inner6());
  });

  it('carries congestion marked between the LB and the real into the inner packet (RFC 6040)', () => {
    const withEcn = (tos: number) => ipv4({ src: CLIENT4, dst: VIP4, proto: 17, tos }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT4, dst: VIP4 }));
    const outer = (tos: number, inner: Uint8Array) => ipv4({ src: LB4, dst: REAL4, proto: 4, tos }, inner);
    // Outer CE over inner ECT(0) (DSCP 10 kept): CE inside, the inner header checksum still right.
    const marked = fromIpv4Outer(outer(0x2b, withEcn(0x2a))) as Uint8Array;
    expect(marked).toEqual(withEcn(0x2b));
    // Outer CE over a packet that is not ECN-capable: dropped, as the RFC asks.
    expect(fromIpv4Outer(outer(0x03, withEcn(0x00)))).toBe('ceOnNotEct');
    // Outer ECT(1) over inner ECT(0): ECT(1); outer ECT(0) or Not-ECT change nothing.
    expect(fromIpv4Outer(outer(0x01, withEcn(0x02)))).toEqual(withEcn(0x01));
    expect(fromIpv4Outer(outer(0x02, withEcn(0x01)))).toEqual(withEcn(0x01));
    expect(fromIpv4Outer(outer(0x00, withEcn(0x02)))).toEqual(withEcn(0x02));
    // IPv6 inner (6in4): the ECN bits of its traffic class.
    const v6 = (tc: number) => ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, trafficClass: tc }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT6, dst: VIP6 }));
    expect(fromIpv4Outer(ipv4({ src: LB4, dst: REAL4, proto: 41, tos: 0x03 }, v6(0x02)))).toEqual(v6(0x03));
  });

  it('an outer header with options is skipped by its IHL', () => {
    const packet = ipv4({ src: LB4, dst: REAL4, proto: 4, options: [1, 1, 1, 0] }, inner4());
    expect(fromIpv4Outer(packet)).toEqual(inner4());
  });

  it.each([
    ['fewer bytes than an IPv4 header', outer4(4, inner4()).subarray(0, 19), 'truncatedOuter'],
    ['an IHL past the bytes received', patch(outer4(4, inner4()).subarray(0, 30), 0, 0x4f), 'truncatedOuter'],
    ['an outer version 6 nibble', patch(outer4(4, inner4()), 0, 0x65), 'badOuterHeader'],
    ['an outer IHL of 4', patch(outer4(4, inner4()), 0, 0x44), 'badOuterHeader'],
    ['protocol 17 on the outer header', outer4(17, inner4()), 'badOuterHeader'],
    ['an outer total length shorter than the bytes received', concat(outer4(4, inner4()), [0]), 'badOuterLength'],
    ['no inner bytes at all', outer4(4, new Uint8Array(0)), 'truncatedInner'],
    ['inner IPv4 shorter than its header', outer4(4, inner4().subarray(0, 19)), 'truncatedInner'],
    ['protocol 4 carrying IPv6', outer4(4, inner6()), 'innerVersionMismatch'],
    ['protocol 41 carrying IPv4', outer4(41, inner4()), 'innerVersionMismatch'],
    ['an inner IHL of 4', outer4(4, patch(inner4(), 0, 0x44)), 'badInnerHeader'],
    ['an inner total length larger than the bytes carried', outer4(4, patch(inner4(), 2, 0, 200)), 'badInnerLength'],
    ['an inner total length smaller than the bytes carried', outer4(4, concat(inner4(), [0, 0])), 'badInnerLength'],
    ['inner IPv6 payload length off by one', outer4(41, patch(inner6(), 4, 0, inner6().length - 39)), 'badInnerLength'],
    ['an inner IPv4 destination that is not a VIP', outer4(4, inner4(REAL4)), 'notVip'],
    ['the IPv4 VIP written in an IPv6 packet', outer4(41, inner6(`::ffff:${VIP4}`)), 'notVip'],
  ])('drops %s', (_name, packet, reason) => {
    expect(fromIpv4Outer(packet)).toBe(reason);
  });
});

describe('inner packets of an IPv6 raw socket (the kernel strips the outer header)', () => {
  it('the payload of next header 41 is the inner IPv6 packet', () => {
    expect(fromIpv6Outer(inner6(), 41)).toEqual(inner6());
  });

  it('the payload of next header 4 is the inner IPv4 packet (4in6)', () => {
    expect(fromIpv6Outer(inner4(), 4)).toEqual(inner4());
  });

  it('carries the outer traffic class\'s congestion mark (IPV6_TCLASS) into the inner packet (RFC 6040)', () => {
    const v4 = (tos: number) => ipv4({ src: CLIENT4, dst: VIP4, proto: 17, tos }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT4, dst: VIP4 }));
    const v6 = (tc: number) => ipv6({ src: CLIENT6, dst: VIP6, nextHeader: 17, trafficClass: tc }, udp({ sport: 40000, dport: 53 }, 'query', { src: CLIENT6, dst: VIP6 }));
    // 4in6: outer CE (DSCP 46 beside it) over inner ECT(0): CE inside, the inner checksum right.
    expect(fromIpv6Outer(v4(0x2a), 4, 0xbb)).toEqual(v4(0x2b));
    // 6in6: outer CE over ECT(1); outer ECT(1) over ECT(0).
    expect(fromIpv6Outer(v6(0x01), 41, 0x03)).toEqual(v6(0x03));
    expect(fromIpv6Outer(v6(0x02), 41, 0x01)).toEqual(v6(0x01));
    // Outer CE over a packet that is not ECN-capable: dropped.
    expect(fromIpv6Outer(v6(0x00), 41, 0x03)).toBe('ceOnNotEct');
    // Outer ECT(0), or no traffic class known: unchanged.
    expect(fromIpv6Outer(v4(0x02), 4, 0x02)).toEqual(v4(0x02));
    expect(fromIpv6Outer(v6(0x00), 41, -1)).toEqual(v6(0x00));
  });

  it.each([
    ['an empty payload', new Uint8Array(0), 41, 'truncatedInner'],
    ['a payload shorter than an IPv6 header', inner6().subarray(0, 39), 41, 'truncatedInner'],
    ['next header 41 carrying IPv4', inner4(), 41, 'innerVersionMismatch'],
    ['an inner IPv6 destination that is not a VIP', inner6(REAL6), 41, 'notVip'],
    ['a jumbogram-style zero payload length', patch(inner6(), 4, 0, 0), 41, 'badInnerLength'],
    ['a next header other than 4 or 41', inner6(), 17, 'badOuterHeader'],
  ])('drops %s', (_name, payload, protocol, reason) => {
    expect(fromIpv6Outer(payload, protocol)).toBe(reason);
  });
});

describe('VipSet', () => {
  it('matches IPv6 VIPs whatever their spelling, and refuses what is not an address', () => {
    const set = new VipSet(['2001:DB8:F:0::10', VIP4, VIP4]);
    expect(set.addresses).toEqual(['2001:db8:f::10', VIP4]);
    expect(set.containsV6(inner6(), 24)).toBe(true);
    expect(set.containsV4(inner4(), 16)).toBe(true);
    expect(set.containsV4(inner4(REAL4), 16)).toBe(false);
    expect(() => new VipSet(['10.0.0.300'])).toThrow(/not an IPv4 or IPv6 address/);
  });
});

describe('Decapsulator', () => {
  it('writes each accepted inner packet once and counts deliveries and drops by reason', () => {
    const written: string[] = [];
    let refuse = false;
    const decap = new Decapsulator(vips, (buf, offset, length) => {
      if (refuse) return -5; // EIO
      written.push(Buffer.from(buf.subarray(offset, offset + length)).toString('hex'));
      return length;
    });
    const a = outer4(4, inner4());
    expect(decap.receiveIpv4Outer(a, a.length)).toBe(0);
    expect(decap.receiveIpv6Outer(inner6(), inner6().length, 41, 0)).toBe(0);
    const b = outer4(4, inner4(REAL4));
    expect(decap.receiveIpv4Outer(b, b.length)).toBe(-DecapDrop.notVip);
    refuse = true;
    expect(decap.receiveIpv6Outer(inner4(), inner4().length, 4, -1)).toBe(-DecapDrop.tunWriteFailed);
    expect(written).toEqual([Buffer.from(inner4()).toString('hex'), Buffer.from(inner6()).toString('hex')]);
    expect(decap.counters()).toEqual({
      receivedIpv4Outer: 2,
      receivedIpv6Outer: 2,
      decapsulatedIpv4: 1,
      decapsulatedIpv6: 1,
      decapsulatedBytes: inner4().length + inner6().length,
      dropped: { notVip: 1, tunWriteFailed: 1 },
      lastTunWriteErrno: -5,
    });
  });
});

describe('SourceFilter (--allow-source)', () => {
  const bytes = (a: string) => Uint8Array.from(ipaddr.parse(a).toByteArray());
  it('takes addresses in its prefixes only, bit-exact at any length, each family apart', () => {
    const f = new SourceFilter(['192.0.2.0/25', '198.51.100.7', '2001:db8:1::/47']);
    expect(f.allows(4, bytes('192.0.2.127'), 0)).toBe(true);
    expect(f.allows(4, bytes('192.0.2.128'), 0)).toBe(false); // the 25th bit
    expect(f.allows(4, bytes('198.51.100.7'), 0)).toBe(true); // a bare address is /32
    expect(f.allows(4, bytes('198.51.100.8'), 0)).toBe(false);
    expect(f.allows(6, bytes('2001:db8:1:ffff::1'), 0)).toBe(true);
    expect(f.allows(6, bytes('2001:db8:2::1'), 0)).toBe(false); // the 47th bit
    expect(f.allows(6, bytes('::ffff:192.0.2.1'), 0)).toBe(false); // an IPv6 source never matches an IPv4 prefix
    expect(new SourceFilter([]).allows(6, bytes('2001:db8::1'), 0)).toBe(true); // no list: any source
    const header = outer4(4, inner4()); // the source sits at byte 12 of an IPv4 header
    expect(new SourceFilter([`${LB4}/32`]).allows(4, header, 12)).toBe(true);
    for (const bad of ['10.0.0.0/33', 'lb1', '2001:db8::/129', '10.0.0.0/']) expect(() => new SourceFilter([bad])).toThrow(/is not an address or CIDR prefix/);
  });

  it('drops and counts tunnel packets from other sources, over either outer family', () => {
    const written: number[] = [];
    const decap = new Decapsulator(vips, (_b, _o, length) => (written.push(length), length), new SourceFilter([`${LB4}/32`, `${LB6}/128`]));
    const fromLb = outer4(4, inner4());
    expect(decap.receiveIpv4Outer(fromLb, fromLb.length)).toBe(0);
    const spoofed = ipv4({ src: '203.0.113.9', dst: REAL4, proto: 4 }, inner4());
    expect(decap.receiveIpv4Outer(spoofed, spoofed.length)).toBe(-DecapDrop.sourceNotAllowed);
    expect(decap.receiveIpv6Outer(inner6(), inner6().length, 41, 0, bytes(LB6), 0)).toBe(0);
    expect(decap.receiveIpv6Outer(inner6(), inner6().length, 41, 0, bytes('2001:db8:9::9'), 0)).toBe(-DecapDrop.sourceNotAllowed);
    expect(decap.receiveIpv6Outer(inner6(), inner6().length, 41, 0)).toBe(-DecapDrop.sourceNotAllowed); // no source known
    expect(written).toHaveLength(2);
    expect(decap.counters().dropped).toEqual({ sourceNotAllowed: 3 });
  });
});

describe('tunnelSocketSpecs', () => {
  it('opens protocol 4 for IPv4 VIPs and 41 for IPv6 VIPs, each over both outer families', () => {
    expect(tunnelSocketSpecs(true, false, true)).toEqual([
      { outerFamily: 4, protocol: 4 },
      { outerFamily: 6, protocol: 4 },
    ]);
    expect(tunnelSocketSpecs(true, true, false)).toEqual([
      { outerFamily: 4, protocol: 4 },
      { outerFamily: 4, protocol: 41 },
    ]);
  });
});

describe('DecapHost', () => {
  const silent: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };
  // Where it would look for an earlier decap's record: a directory of the test's own, not /run/dsrlb.
  let runDir: string;
  beforeEach(() => void (runDir = mkdtempSync(join(tmpdir(), 'dsrlb-test-decap-host-'))));
  afterEach(() => rmSync(runDir, { recursive: true, force: true }));

  /** A host over fake sysctls and TUN; `ip` answers from `addresses` (the device's IPv4 ones) and `persistent`. */
  function fakes(initial: Record<string, string>, device: { addresses?: string[]; persistent?: boolean } = {}) {
    const sysctls = new Map(Object.entries(initial));
    const commands: string[] = [];
    const closed: number[] = [];
    let open = false;
    const sysctl: SysctlAccess = { read: (k) => sysctls.get(k), write: (k, v) => void sysctls.set(k, v) };
    const tun: TunOpener = {
      open: (name) => ((open = true), { fd: 42, name }),
      close: (fd) => void (closed.push(fd), (open = false)),
    };
    const runner = async (argv: readonly string[]) => {
      const line = argv.join(' ');
      commands.push(line);
      if (line.startsWith('ip -4 -o addr show dev ')) return { stdout: (device.addresses ?? []).map((a, n) => `${n + 7}: dc0    inet ${a} scope host dc0\\       valid_lft forever preferred_lft forever\n`).join('') };
      if (line.startsWith('ip -o link show dev ') && !open && device.persistent !== true) throw new Error('Device "dc0" does not exist.');
      return { stdout: '' };
    };
    return { sysctls, commands, closed, host: new DecapHost(silent, runner, sysctl, tun, runDir) };
  }

  it("brings the device up with the IPv4 dummy address 192.0.0.8 on it (scope host) and its own rp_filter loose, and never touches all's", async () => {
    const f = fakes({
      'net/ipv4/conf/all/rp_filter': '1',
      'net/ipv4/conf/dc0/rp_filter': '1',
      'net/ipv6/conf/dc0/disable_ipv6': '1',
    });
    expect(await f.host.setUp('dc0', true, true)).toEqual({ fd: 42, name: 'dc0' });
    // Not a VIP (decap must not make one a local address); up last: one that waits for the device
    // to be up finds its address there.
    expect(f.commands).toEqual(['ip -4 -o addr show dev dc0', 'ip addr add 192.0.0.8/32 dev dc0 scope host', 'ip link set dev dc0 up']);
    // max(all 1, dev 2) = 2: loose, which passes on a device with an address.
    expect(Object.fromEntries(f.sysctls)).toEqual({
      'net/ipv4/conf/all/rp_filter': '1',
      'net/ipv4/conf/dc0/rp_filter': '2',
      'net/ipv6/conf/dc0/disable_ipv6': '0',
    });
    await f.host.tearDown();
    expect(f.closed).toEqual([42]);
    // The device went with its fd, and its addresses with it: nothing to delete.
    expect(f.commands.slice(3)).toEqual(['ip -o link show dev dc0']);
    await f.host.tearDown(); // idempotent
    expect(f.closed).toEqual([42]);
    expect(f.sysctls.get('net/ipv4/conf/all/rp_filter')).toBe('1');
  });

  it('with IPv6 VIPs only, adds no address and leaves rp_filter alone (rp_filter is IPv4 only)', async () => {
    const f = fakes({ 'net/ipv4/conf/all/rp_filter': '1', 'net/ipv4/conf/dc0/rp_filter': '1', 'net/ipv6/conf/dc0/disable_ipv6': '1' });
    await f.host.setUp('dc0', true, false);
    expect(f.commands).toEqual(['ip link set dev dc0 up']);
    expect(f.sysctls.get('net/ipv4/conf/dc0/rp_filter')).toBe('1');
    expect(f.sysctls.get('net/ipv6/conf/dc0/disable_ipv6')).toBe('0');
    await f.host.tearDown();
    expect(f.commands).toEqual(['ip link set dev dc0 up']);
  });

  it('on a persistent TUN device with an address of its own adds none (any will do) and deletes none at tearDown', async () => {
    const f = fakes({ 'net/ipv4/conf/all/rp_filter': '0', 'net/ipv4/conf/dc0/rp_filter': '1' }, { addresses: ['10.0.0.1/24'], persistent: true });
    await f.host.setUp('dc0', false, true);
    expect(f.commands).toEqual(['ip -4 -o addr show dev dc0', 'ip link set dev dc0 up']);
    expect(f.sysctls.get('net/ipv4/conf/dc0/rp_filter')).toBe('2');
    await f.host.tearDown();
    expect(f.commands.slice(2)).toEqual([]);
  });

  it('on a persistent TUN device without an address, adds the dummy address and takes it off again when the device outlives it', async () => {
    const f = fakes({ 'net/ipv4/conf/all/rp_filter': '0', 'net/ipv4/conf/dc0/rp_filter': '2' }, { persistent: true });
    await f.host.setUp('dc0', false, true);
    await f.host.tearDown();
    expect(f.commands.slice(3)).toEqual(['ip -o link show dev dc0', 'ip addr del 192.0.0.8/32 dev dc0']);
  });
});

describe('decap options (--tun)', () => {
  it('takes the default TUN name and any plain interface name, and refuses a kernel name template', () => {
    const ok = parseDecapOptions({ vips: [VIP4] });
    expect(Array.isArray(ok) ? ok : ok.tunName).toBe(DEFAULT_TUN_NAME);
    const named = parseDecapOptions({ vips: [VIP4], tunName: 'dcx-1.a_b' });
    expect(Array.isArray(named) ? named : named.tunName).toBe('dcx-1.a_b');
    // '%d' would have the kernel pick the number: the device would not be the one decap names.
    for (const bad of ['dsrlb%d', '', 'a'.repeat(16), 'a/b', 'a b']) {
      expect(parseDecapOptions({ vips: [VIP4], tunName: bad })).toEqual([`--tun: ${JSON.stringify(bad)} is not a usable interface name (1 to 15 letters, digits, "_.-")`]);
    }
  });
});
