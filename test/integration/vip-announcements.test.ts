// Gratuitous ARP and unsolicited Neighbour Advertisements against real Linux clients: when the LB's
// interface is made again with a new MAC, a client keeps the old MAC for the VIPs (REACHABLE, then
// PROBE and FAILED: about a minute of lost packets) until announceVips tells it the new one.
// What a client with default sysctls does (checked here, Linux 6.x): an existing entry that is not
// PERMANENT, in any state, takes the new MAC and becomes STALE (a gratuitous ARP request counts as
// one, arp_process's is_garp; an NA with Override replaces the address); no entry is made where
// there was none (arp_accept=0, accept_untracked_na=0), so a client that never asked is left alone.
// The LB holds the VIPs as host-setup.ts puts them (IPv4 on lo, IPv6 on the interface, deprecated),
// without its nftables table, so the LB's kernel answers a client's ping to a VIP: a ping answered
// means the client's frames reach the LB's MAC.

import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadNative } from '../../src/io/native-binding.js';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { requireRoot, ROOT, sleep } from '../support/lab-daemon.js';

const PREFIX = `dsrt-ann-${process.pid}-`;
const SCRIPT = join(ROOT, 'test', 'support', 'announce-vips.mjs');
/** No host on the segment has it: frames to it are flooded and dropped by every NIC. */
const WRONG_MAC = '02:de:ad:00:00:01';
let lab: Lab;
let vips: string[];

const sh = async (ns: string, cmd: string): Promise<string> => {
  const r = await lab.exec(ns, ['sh', '-c', cmd]);
  expect(r.code, `${cmd}: ${r.stderr}`).toBe(0);
  return r.stdout;
};

/** The client's neighbour entries for the VIPs: address -> "mac STATE" (absent: none). */
async function clientEntries(): Promise<Record<string, string>> {
  const entries = JSON.parse(await sh(lab.client.ns, 'ip -j neigh show dev eth0')) as { dst: string; lladdr?: string; state?: string[] }[];
  const out: Record<string, string> = {};
  for (const e of entries) if (vips.includes(e.dst)) out[e.dst] = `${e.lladdr ?? '-'} ${(e.state ?? []).join(',')}`;
  return out;
}

/** Whether one of two pings from the client to `vip` is answered within a second each. */
async function pingAnswered(vip: string): Promise<boolean> {
  const r = await lab.exec(lab.client, ['ping', '-n', '-c', '2', '-i', '0.2', '-W', '1', vip]);
  return r.code === 0;
}

/** Runs announceVips in the LB's namespace until its rounds are done; its log lines. */
async function announce(repeatMs: number): Promise<Record<string, unknown>[]> {
  const r = await lab.exec(lab.lb, [process.execPath, SCRIPT, 'eth0', String(repeatMs), ...vips]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
}

async function lbMac(): Promise<string> {
  const [link] = JSON.parse(await sh(lab.lb.ns, 'ip -j link show dev eth0')) as { address: string }[];
  return link!.address;
}

/** The VIPs as HostSetup.apply adds them (see host-setup.ts addressCommand). */
async function addVipsToLb(): Promise<void> {
  await sh(lab.lb.ns, `ip addr replace ${lab.vip}/32 dev lo && ip addr replace ${lab.vip6}/128 dev eth0 nodad preferred_lft 0`);
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 1, ipv6: true });
  vips = [lab.vip, lab.vip6!];
  await addVipsToLb();
  // A client as a distribution ships it: the behaviour below is the default one.
  const sysctls = await sh(lab.client.ns, 'sysctl -n net.ipv4.conf.eth0.arp_accept net.ipv4.conf.eth0.drop_gratuitous_arp net.ipv6.conf.eth0.accept_untracked_na net.ipv6.conf.eth0.drop_unsolicited_na');
  expect(sysctls.trim().split('\n')).toEqual(['0', '0', '0', '0']);
}, 120_000);

afterAll(async () => {
  await lab?.destroy();
}, 60_000);

describe('VIP announcements reach real clients', () => {
  it('the LB interface made again with a new MAC: the client loses the VIPs until announceVips, then reaches them at the new MAC', async () => {
    for (const vip of vips) expect(await pingAnswered(vip), vip).toBe(true);
    const oldMac = await lbMac();
    expect(await clientEntries()).toEqual({ [lab.vip]: `${oldMac} REACHABLE`, [lab.vip6!]: `${oldMac} REACHABLE` });

    // As a driver reload or a container's veth made again does: the pair goes and comes back, and
    // the new eth0 has a new MAC. The LB's addresses and VIPs are put back (the daemon's host setup).
    await sh(lab.switchNs, `ip link del sw-lb && ip link add sw-lb type veth peer name eth0 netns ${lab.lb.ns} && ip link set sw-lb master br0 up`);
    await sh(lab.lb.ns, `ip addr add ${lab.lb.ipv4}/${lab.prefixLength} dev eth0 && ip -6 addr add ${lab.lb.ipv6}/64 dev eth0 nodad && ip link set eth0 up`);
    await addVipsToLb();
    const newMac = await lbMac();
    expect(newMac).not.toBe(oldMac);

    // Without an announcement: the LB's kernel sends none (arp_notify and ndisc_notify are off),
    // the client keeps sending to the old MAC and nothing answers.
    await sleep(500);
    for (const vip of vips) expect(await pingAnswered(vip), `${vip} before the announcement`).toBe(false);
    expect(await clientEntries()).toEqual({ [lab.vip]: `${oldMac} REACHABLE`, [lab.vip6!]: `${oldMac} REACHABLE` });

    const logs = await announce(1000);
    expect(logs.map((l) => [l.level, l.msg, l.round, l.mac, l.gratuitousArp, l.neighborAdvert])).toEqual([
      ['info', 'VIP announcements sent', 1, newMac, [lab.vip], [lab.vip6]],
      ['info', 'VIP announcements sent', 2, newMac, [lab.vip], [lab.vip6]],
    ]);
    expect(await clientEntries()).toEqual({ [lab.vip]: `${newMac} STALE`, [lab.vip6!]: `${newMac} STALE` });
    for (const vip of vips) expect(await pingAnswered(vip), `${vip} after the announcement`).toBe(true);
  }, 60_000);

  it('a default client takes the new MAC into a REACHABLE or STALE entry, makes no entry it did not have, and leaves a PERMANENT one', async () => {
    const mac = await lbMac();
    const seen: Record<string, Record<string, string>> = {};
    for (const state of ['reachable', 'stale', 'none', 'permanent']) {
      for (const vip of vips) {
        await sh(lab.client.ns, `ip neigh del ${vip} dev eth0 2>/dev/null; true`);
        if (state !== 'none') await sh(lab.client.ns, `ip neigh replace ${vip} lladdr ${WRONG_MAC} dev eth0 nud ${state}`);
      }
      await announce(50);
      seen[state] = await clientEntries();
    }
    for (const vip of vips) await sh(lab.client.ns, `ip neigh del ${vip} dev eth0`);
    const both = (entry: string) => ({ [lab.vip]: entry, [lab.vip6!]: entry });
    expect(seen).toEqual({
      reachable: both(`${mac} STALE`),
      stale: both(`${mac} STALE`),
      none: {},
      permanent: both(`${WRONG_MAC} PERMANENT`),
    });
  }, 60_000);

  it('a first round on an interface still down fails with ENETDOWN (a warning); the second, once it is up, updates the client', async () => {
    for (const vip of vips) await sh(lab.client.ns, `ip neigh replace ${vip} lladdr ${WRONG_MAC} dev eth0 nud reachable`);
    await sh(lab.lb.ns, 'ip link set eth0 down');
    const child = lab.spawn(lab.lb, [process.execPath, SCRIPT, 'eth0', '1000', ...vips], { stdio: ['ignore', 'pipe', 'inherit'] });
    const lines: Record<string, unknown>[] = [];
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    const first = new Promise<void>((resolve) =>
      createInterface({ input: child.stdout! }).on('line', (line) => {
        lines.push(JSON.parse(line) as Record<string, unknown>);
        resolve();
      }),
    );
    await first;
    // Down, the link lost the IPv6 VIP (keep_addr_on_down=0); the daemon's host setup puts it back.
    await sh(lab.lb.ns, 'ip link set eth0 up');
    await addVipsToLb();
    expect(await exited).toBe(0);
    const mac = await lbMac();
    expect(lines.map((l) => [l.level, l.msg, l.round, l.code ?? null])).toEqual([
      ['warn', 'VIP announcements not sent', 1, 'ENETDOWN'],
      ['info', 'VIP announcements sent', 2, null],
    ]);
    expect(await clientEntries()).toEqual({ [lab.vip]: `${mac} STALE`, [lab.vip6!]: `${mac} STALE` });
  }, 60_000);

  it('sendFrames checks every frame before it sends any, and throws a refusal with its errno name', () => {
    const native = loadNative();
    const frame = new Uint8Array(60);
    expect(() => native.sendFrames(1, [frame, new Uint8Array(13)])).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }));
    expect(() => native.sendFrames(1, [frame, [1, 2] as unknown as Uint8Array])).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }));
    expect(() => native.sendFrames(0, [frame])).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }));
    // An index no interface has (one made again gets a new index): nothing sent, ENXIO named.
    expect(() => native.sendFrames(0x7fffffff, [frame])).toThrow(
      expect.objectContaining({ code: 'ENXIO', errno: -6, syscall: 'sendto(AF_PACKET)', message: expect.stringMatching(/on ifindex 2147483647: .*\(ENXIO\)/) }),
    );
    expect(native.sendFrames(1, [])).toBe(0);
  });
});
