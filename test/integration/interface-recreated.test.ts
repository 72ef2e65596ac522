// The LB's interface deleted and made again under the same name (a driver reload, a VLAN or bond
// rebuilt by networkd, a container veth re-created): a packet socket stays bound to the old
// interface index and receives nothing for good. Before, dsrlb then forwarded nothing while its
// /healthz said running and its VIPs stayed announced. Each loop now sees it within a second and
// ends; the group opens a new loop on the interface as it is, and the host setup is applied again.
// The new loops hold the old loops' flows (read from their tables' shared records), so that
// connections stay on their reals.

import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { KeepAliveClient } from '../support/keepalive-client.js';
import { httpCount, labConfig, LabDaemon, metricValue, requireRoot, sleep } from '../support/lab-daemon.js';

const PREFIX = `dsrt-if-${process.pid}-`;
let lab: Lab;
let daemon: LabDaemon;

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 2 });
  await lab.startHttpServers();
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-if-'));
  const configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, labConfig(lab, { top: ['workers: 2'], service: ['    healthCheck: { type: none }'], reals: lab.reals.map((r) => r.ipv4) }));
  daemon = await LabDaemon.start(lab, configPath);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await lab?.destroy();
}, 60_000);

describe('the LB interface made again', () => {
  it('starts each loop again on the new interface within seconds: requests are answered again', async () => {
    expect((await httpCount(lab, 20)).ok).toBe(20);
    const sh = (ns: string, cmd: string) => lab.exec(ns, ['sh', '-c', cmd]);
    // The switch side of the LB's veth goes, and with it the LB's eth0; the pair is made again,
    // with the LB's MAC and address as before.
    const swIf = 'sw-lb';
    const del = await sh(lab.switchNs, `ip link del ${swIf} && ip link add ${swIf} type veth peer name eth0 netns ${lab.lb.ns} && ip link set ${swIf} master br0 up`);
    expect(del.code, del.stderr).toBe(0);
    const up = await sh(lab.lb.ns, `ip link set eth0 address ${lab.lb.mac} && ip addr add ${lab.lb.ipv4}/${lab.prefixLength} dev eth0 && ip link set eth0 up`);
    expect(up.code, up.stderr).toBe(0);
    let restarts = 0;
    for (let i = 0; i < 100 && restarts < 2; i++) {
      await sleep(100);
      restarts = metricValue(await daemon.metrics(), 'dsrlb_loop_restarts_total', '');
    }
    expect(restarts).toBe(2);
    await sleep(500);
    const after = await httpCount(lab, 20, { timeoutMs: 3000 });
    expect(after.ok, JSON.stringify(after)).toBe(20);
    const failed = daemon.logs.filter((l) => l.includes('"packet loop failed"'));
    expect(failed).toHaveLength(2);
    expect(failed[0]).toMatch(/"code":"EINTERFACE".*eth0 (is gone|was made again)/);
    expect(daemon.logs.some((l) => l.includes('"packet loop started again"'))).toBe(true);
  }, 60_000);

  it('tells the segment the VIP\'s new MAC when the interface comes back with another one (gratuitous ARP)', async () => {
    expect((await httpCount(lab, 5)).ok).toBe(5); // the client holds the VIP's MAC now
    const sent = () => daemon.logs.filter((l) => l.includes('VIP announcements sent') && l.includes('packet loop started again')).length;
    const sentBefore = sent();
    const sh = (ns: string, cmd: string) => lab.exec(ns, ['sh', '-c', cmd]);
    const del = await sh(lab.switchNs, `ip link del sw-lb && ip link add sw-lb type veth peer name eth0 netns ${lab.lb.ns} && ip link set sw-lb master br0 up`);
    expect(del.code, del.stderr).toBe(0);
    const up = await sh(lab.lb.ns, `ip addr add ${lab.lb.ipv4}/${lab.prefixLength} dev eth0 && ip link set eth0 up && cat /sys/class/net/eth0/address`);
    expect(up.code, up.stderr).toBe(0);
    const newMac = up.stdout.trim();
    expect(newMac).not.toBe(lab.lb.mac);
    for (let i = 0; i < 100 && sent() < sentBefore + 2; i++) await sleep(100);
    expect(sent() - sentBefore, daemon.logs.slice(-20).join('\n')).toBeGreaterThanOrEqual(2); // both rounds
    // Without it the client kept the old MAC (REACHABLE, then PROBE, FAILED) for about a minute.
    const neigh = await lab.exec(lab.client, ['ip', '-j', 'neigh', 'show', lab.vip]);
    expect((JSON.parse(neigh.stdout) as { lladdr?: string }[])[0]?.lladdr, neigh.stdout).toBe(newMac);
    const after = await httpCount(lab, 20, { timeoutMs: 3000 });
    expect(after.ok, JSON.stringify(after)).toBe(20);
  }, 60_000);

  it('keeps connections on their reals across it, a drained real\'s too: the new loops hold the old loops\' flows', async () => {
    const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, lab.vip, 30);
    expect(opened).toBe(30);
    const round = async () => (await client.round()).answers.map((a) => ('real' in a ? a.real : a.error));
    const first = await round();
    const drained = lab.reals.find((r) => first.filter((x) => x === r.name).length >= 3)!;
    expect(drained, first.join(',')).toBeDefined();
    expect((await daemon.cli(['drain', 'web', drained.ipv4])).code).toBe(0);
    try {
      expect(await round()).toEqual(first);
      const restartsBefore = metricValue(await daemon.metrics(), 'dsrlb_loop_restarts_total', '');
      const held = () => daemon.logs.filter((l) => l.includes('the new packet loop holds the flows of the loop it replaces'));
      const heldBefore = held().length;
      const sh = (ns: string, cmd: string) => lab.exec(ns, ['sh', '-c', cmd]);
      const mac = (await sh(lab.lb.ns, 'cat /sys/class/net/eth0/address')).stdout.trim();
      const del = await sh(lab.switchNs, `ip link del sw-lb && ip link add sw-lb type veth peer name eth0 netns ${lab.lb.ns} && ip link set sw-lb master br0 up`);
      expect(del.code, del.stderr).toBe(0);
      const up = await sh(lab.lb.ns, `ip link set eth0 address ${mac} && ip addr add ${lab.lb.ipv4}/${lab.prefixLength} dev eth0 && ip link set eth0 up`);
      expect(up.code, up.stderr).toBe(0);
      for (let i = 0; i < 100 && held().length < heldBefore + 2; i++) await sleep(100);
      expect(metricValue(await daemon.metrics(), 'dsrlb_loop_restarts_total', '') - restartsBefore).toBe(2);
      // Each new loop was given every flow (two loops: the kernel's fanout hash picks the loop).
      for (const line of held().slice(heldBefore)) expect(JSON.parse(line).flows, line).toBeGreaterThanOrEqual(30);
      await sleep(500);
      // Without the carried flows the drained real's connections went to the other real and were reset.
      expect(await round()).toEqual(first);
      const fresh = await httpCount(lab, 20, { timeoutMs: 3000 });
      expect(fresh.ok).toBe(20);
      expect(fresh.byReal[drained.name] ?? 0).toBe(0);
    } finally {
      await client.close();
      expect((await daemon.cli(['undrain', 'web', drained.ipv4])).code).toBe(0);
    }
  }, 60_000);
});
