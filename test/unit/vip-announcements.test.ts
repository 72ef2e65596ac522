// The frames that announce the VIPs (gratuitous ARP, unsolicited Neighbour Advertisement) byte by
// byte, read back by tshark (checksum validation on; the test fails, never skips, without tshark),
// and announceVips' rounds, re-reads and failures against a fake link (no root).

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/control/logger.js';
import {
  announceVips,
  GRATUITOUS_ARP_BYTES,
  gratuitousArpFrame,
  NEIGHBOR_ADVERT_BYTES,
  unsolicitedNeighborAdvertFrame,
  type AnnouncementLink,
} from '../../src/control/vip-announcements.js';
import { fromHex, hex, mac } from '../support/packet-builder.js';
import { pcapFile, requireTshark, runTshark } from '../support/pcap-writer.js';
import { LB_MAC, VIP4, VIP6 } from '../support/test-net.js';

const LB = mac(LB_MAC);
const OTHER_MAC = '5a:1b:2c:3d:4e:5f';

const GARP_VIP4 = fromHex(`
  ffffffffffff 0200000000fe 0806   # broadcast, from the LB, ARP
  0001 0800 06 04 0001             # Ethernet, IPv4, 6- and 4-byte addresses, request
  0200000000fe cb00710a            # sender: the LB's MAC, the VIP 203.0.113.10
  000000000000 cb00710a            # target: MAC zero, the VIP again
`);

const NA_VIP6 = fromHex(`
  333300000001 0200000000fe 86dd               # all-nodes group, from the LB, IPv6
  60000000 0020 3a ff                          # payload 32, ICMPv6, hop limit 255
  20010db8000f00000000000000000010             # source: the VIP 2001:db8:f::10
  ff020000000000000000000000000001             # destination: ff02::1
  88 00 f7f1 20000000                          # NA, code 0, checksum, flags: Override only
  20010db8000f00000000000000000010             # target: the VIP
  02 01 0200000000fe                           # target link-layer address option: the LB's MAC
`);

const NA_FD77 = fromHex(`
  333300000001 5a1b2c3d4e5f 86dd
  60000000 0020 3a ff
  fd770000000000000000000000000100
  ff020000000000000000000000000001
  88 00 84f8 20000000
  fd770000000000000000000000000100
  02 01 5a1b2c3d4e5f
`);

describe('VIP announcement frames', () => {
  it('builds a gratuitous ARP request with the VIP as sender and target and a zero target MAC', () => {
    const frame = gratuitousArpFrame(LB, VIP4);
    expect(frame.length).toBe(GRATUITOUS_ARP_BYTES);
    expect(hex(frame)).toBe(hex(GARP_VIP4));
  });

  it('builds an unsolicited NA to ff02::1 from the VIP, hop limit 255, Override set, Solicited and Router clear, with its checksum', () => {
    const frame = unsolicitedNeighborAdvertFrame(LB, VIP6);
    expect(frame.length).toBe(NEIGHBOR_ADVERT_BYTES);
    expect(hex(frame)).toBe(hex(NA_VIP6));
    expect(hex(unsolicitedNeighborAdvertFrame(mac(OTHER_MAC), 'fd77::100'))).toBe(hex(NA_FD77));
  });

  it('refuses an address of the other family and a MAC that is not 6 bytes', () => {
    expect(() => gratuitousArpFrame(LB, VIP6)).toThrow(/not an IPv4 address/);
    expect(() => unsolicitedNeighborAdvertFrame(LB, VIP4)).toThrow(/not an IPv6 address/);
    expect(() => gratuitousArpFrame(LB.subarray(0, 5), VIP4)).toThrow(/6 bytes/);
  });

  it('reads as a gratuitous ARP and an NA with a good checksum in tshark', () => {
    expect(requireTshark()).toMatch(/TShark/);
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-tshark-'));
    try {
      const file = join(dir, 'announce.pcap');
      writeFileSync(file, pcapFile([gratuitousArpFrame(LB, VIP4), unsolicitedNeighborAdvertFrame(LB, VIP6), unsolicitedNeighborAdvertFrame(mac(OTHER_MAC), 'fd77::100')]));
      const args = ['-n']; // tshark always verifies ICMPv6 checksums
      const verbose = runTshark(file, [...args, '-V'], dir);
      expect(verbose.split('\n').filter((line) => /malformed|bad|incorrect|exception|Expert Info \((Error|Warning)/i.test(line))).toEqual([]);
      expect(verbose.split('\n').filter((line) => /\[Checksum Status: Good\]/.test(line))).toHaveLength(2);
      const fields = (...names: string[]) =>
        runTshark(file, [...args, '-T', 'fields', '-E', 'separator=|', ...names.flatMap((n) => ['-e', n])], dir)
          .trim()
          .split('\n');
      expect(fields('frame.protocols')).toEqual(['eth:ethertype:arp', 'eth:ethertype:ipv6:icmpv6', 'eth:ethertype:ipv6:icmpv6']);
      const [arp] = fields('eth.dst', 'arp.opcode', 'arp.isgratuitous', 'arp.src.hw_mac', 'arp.src.proto_ipv4', 'arp.dst.hw_mac', 'arp.dst.proto_ipv4');
      expect(arp).toBe(`ff:ff:ff:ff:ff:ff|1|1|${LB_MAC}|${VIP4}|00:00:00:00:00:00|${VIP4}`);
      const na = fields(
        'eth.dst',
        'ipv6.src',
        'ipv6.dst',
        'ipv6.hlim',
        'icmpv6.type',
        'icmpv6.code',
        'icmpv6.checksum.status',
        'icmpv6.nd.na.flag.r',
        'icmpv6.nd.na.flag.s',
        'icmpv6.nd.na.flag.o',
        'icmpv6.nd.na.target_address',
        'icmpv6.opt.linkaddr',
      ).slice(1);
      expect(na).toEqual([
        `33:33:00:00:00:01|${VIP6}|ff02::1|255|136|0|1|0|0|1|${VIP6}|${LB_MAC}`,
        `33:33:00:00:00:01|fd77::100|ff02::1|255|136|0|1|0|0|1|fd77::100|${OTHER_MAC}`,
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** A fake interface whose MAC, type and failures tests set; records every frame sent. */
function fakeLink(initialMac = LB_MAC) {
  const state = {
    mac: mac(initialMac),
    ifindex: 7,
    hardwareType: 1,
    infoError: null as Error | null,
    sendError: null as Error | null,
    /** Frames sendFrames takes before it reports no room. */
    room: Infinity,
    sent: [] as { ifindex: number; frames: string[] }[],
  };
  const link: AnnouncementLink = {
    interfaceInfo: () => {
      if (state.infoError) throw state.infoError;
      return { ifindex: state.ifindex, mac: state.mac, hardwareType: state.hardwareType };
    },
    sendFrames: (ifindex, frames) => {
      if (state.sendError) throw state.sendError;
      const taken = frames.slice(0, Math.min(frames.length, state.room));
      state.sent.push({ ifindex, frames: taken.map(hex) });
      return taken.length;
    },
  };
  return { state, link };
}

function logs() {
  const lines: Record<string, unknown>[] = [];
  return { lines, log: createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>), 'debug') };
}

const nativeError = (code: string, message: string) => Object.assign(new Error(message), { code, errno: -100, syscall: 'sendto(AF_PACKET)' });

describe('announceVips', () => {
  it('sends one frame per VIP at once and again after the repeat delay, logging each round', async () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    const rounds = announceVips('eth0', [VIP4, VIP6, VIP4], log, { link, repeatMs: 20, reason: 'start' });
    expect(state.sent).toEqual([{ ifindex: 7, frames: [hex(GARP_VIP4), hex(NA_VIP6)] }]);
    await rounds.done;
    expect(state.sent).toHaveLength(2);
    expect(state.sent[1]).toEqual(state.sent[0]);
    expect(lines.map((l) => [l.level, l.msg, l.round, l.reason, l.mac, l.gratuitousArp, l.neighborAdvert])).toEqual([
      ['info', 'VIP announcements sent', 1, 'start', LB_MAC, [VIP4], [VIP6]],
      ['info', 'VIP announcements sent', 2, 'start', LB_MAC, [VIP4], [VIP6]],
    ]);
  });

  it('reads the MAC again for the second round (the interface may have been made again in between)', async () => {
    const { state, link } = fakeLink();
    const { log } = logs();
    const rounds = announceVips('eth0', [VIP4], log, { link, repeatMs: 20 });
    state.mac = mac(OTHER_MAC);
    state.ifindex = 9;
    await rounds.done;
    expect(state.sent[0]!.frames[0]!.slice(12, 24)).toBe('0200000000fe');
    expect(state.sent[1]).toEqual({ ifindex: 9, frames: [hex(gratuitousArpFrame(mac(OTHER_MAC), VIP4))] });
  });

  it('logs a refused send as a warning with its errno name, never throws, and still sends the second round', async () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    state.sendError = nativeError('ENETDOWN', 'sendto(AF_PACKET) on ifindex 7: Network is down (ENETDOWN)');
    const rounds = announceVips('eth0', [VIP4, VIP6], log, { link, repeatMs: 20 });
    expect(lines).toEqual([expect.objectContaining({ level: 'warn', msg: 'VIP announcements not sent', interface: 'eth0', round: 1, code: 'ENETDOWN' })]);
    state.sendError = null;
    await rounds.done;
    expect(state.sent).toHaveLength(1);
    expect(lines[1]).toEqual(expect.objectContaining({ level: 'info', msg: 'VIP announcements sent', round: 2 }));
  });

  it('logs a missing interface as a warning and tries again in the second round', async () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    state.infoError = Object.assign(new Error('ioctl(SIOCGIFINDEX) on eth0: No such device (ENODEV)'), { code: 'ENODEV', errno: -19, syscall: 'ioctl(SIOCGIFINDEX)' });
    const rounds = announceVips('eth0', [VIP4], log, { link, repeatMs: 20 });
    state.infoError = null;
    await rounds.done;
    expect(lines.map((l) => [l.level, l.round, l.code])).toEqual([
      ['warn', 1, 'ENODEV'],
      ['info', 2, undefined],
    ]);
    expect(state.sent).toHaveLength(1);
  });

  it('says how many frames found no room in the socket', () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    state.room = 1;
    announceVips('eth0', [VIP4, VIP6], log, { link, repeatMs: 20 }).cancel();
    expect(lines.map((l) => [l.level, l.msg, l.gratuitousArp, l.neighborAdvert, l.sent, l.unsent])).toEqual([
      ['info', 'VIP announcements sent', [VIP4], [], undefined, undefined],
      ['warn', 'VIP announcements partly sent: the socket had no room for the rest', undefined, undefined, 1, 1],
    ]);
  });

  it('names at most 32 VIPs of a family in a log line and counts the rest', () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    const vips = Array.from({ length: 40 }, (_, i) => `10.0.0.${i + 1}`);
    announceVips('eth0', vips, log, { link }).cancel();
    expect(state.sent[0]!.frames).toHaveLength(40);
    expect((lines[0]!.gratuitousArp as string[]).length).toBe(32);
    expect(lines[0]!.more).toBe(8);
  });

  it('sends nothing on an interface that is not Ethernet, and no second round', async () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    state.hardwareType = 65534; // ARPHRD_NONE: a TUN or WireGuard device
    await announceVips('wg0', [VIP4], log, { link, repeatMs: 20 }).done;
    expect(state.sent).toEqual([]);
    expect(lines).toEqual([expect.objectContaining({ level: 'warn', msg: 'VIP announcements not sent: the interface is not Ethernet', hardwareType: 65534 })]);
  });

  it('drops the second round when cancelled, and settles at once', async () => {
    const { state, link } = fakeLink();
    const { log } = logs();
    const rounds = announceVips('eth0', [VIP4], log, { link, repeatMs: 20 });
    rounds.cancel();
    await rounds.done;
    await new Promise((r) => setTimeout(r, 40));
    expect(state.sent).toHaveLength(1);
  });

  it('does nothing for no VIPs, and skips text that is no address with a warning', async () => {
    const { state, link } = fakeLink();
    const { lines, log } = logs();
    await announceVips('eth0', [], log, { link, repeatMs: 20 }).done;
    expect(state.sent).toEqual([]);
    expect(lines).toEqual([]);
    announceVips('eth0', ['not-an-address', VIP4], log, { link, repeatMs: 20 }).cancel();
    expect(lines[0]).toEqual(expect.objectContaining({ level: 'warn', vip: 'not-an-address' }));
    expect(state.sent).toEqual([{ ifindex: 7, frames: [hex(GARP_VIP4)] }]);
  });
});
