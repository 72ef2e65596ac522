// IPv6 L2 DSR end to end: a client reaches an IPv6 VIP through dsrlb (the LB answers neighbour
// solicitations for the VIP), the reals answer from the VIP directly, and ping to the VIP is
// answered by the packet loop.

import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { httpCount, LabDaemon, metricValue, requireRoot } from '../support/lab-daemon.js';

const PREFIX = `dsrt-v6-${process.pid}-`;
let lab: Lab;
let daemon: LabDaemon;

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3, ipv6: true });
  await lab.startHttpServers();
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-v6-'));
  const config = join(dir, 'dsrlb.yaml');
  await writeFile(
    config,
    [
      'interface: eth0',
      'services:',
      '  - name: web6',
      `    vip: "${lab.vip6}"`,
      '    port: 80',
      '    protocol: tcp',
      '    reals:',
      ...lab.reals.map((r) => `      - address: "${r.ipv6}"`),
      '',
    ].join('\n'),
  );
  daemon = await LabDaemon.start(lab, config);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await lab?.destroy();
}, 60_000);

describe('IPv6 L2 DSR', () => {
  // Only TCP counts: a real's neighbour solicitation for the client may carry the VIP as source
  // (IPv6 has no arp_announce) and is multicast to every port, the LB's included; it is no reply.
  it('serves 150 requests to the IPv6 VIP over all reals, replies bypassing the LB', async () => {
    const cap = lab.spawn(lab.lb, ['tcpdump', '-i', 'eth0', '-nn', '-l', '-q', '--immediate-mode', 'ip6', 'and', 'tcp', 'and', 'src', 'host', lab.vip6!], { stdio: ['ignore', 'pipe', 'pipe'] });
    let viaLb = 0;
    cap.stdout!.on('data', (b: Buffer) => (viaLb += b.toString().split('\n').filter((l) => l.includes('IP6')).length));
    await new Promise((r) => setTimeout(r, 500));
    const r = await httpCount(lab, 150, { host: lab.vip6! });
    await new Promise((r2) => setTimeout(r2, 300));
    cap.kill('SIGTERM');
    expect(r.errors).toEqual({});
    expect(r.ok).toBe(150);
    for (const name of ['r1', 'r2', 'r3']) expect(r.byReal[name] ?? 0).toBeGreaterThanOrEqual(20);
    expect(viaLb).toBe(0);
    console.log('IPv6 distribution', r.byReal);
  }, 60_000);

  it('answers ping to the IPv6 VIP from the packet loop', async () => {
    const ping = await lab.exec(lab.client, ['ping', '-6', '-c', '3', '-i', '0.2', '-W', '2', lab.vip6!]);
    expect(ping.code).toBe(0);
    expect(metricValue(await daemon.metrics(), 'dsrlb_icmp_echo_replied_total', '')).toBe(3);
  }, 30_000);

  it('answers a large ping to the IPv6 VIP (its fragments left to the LB kernel, as for IPv4)', async () => {
    const before = metricValue(await daemon.metrics(), 'dsrlb_icmp_echo_replied_total', '');
    const big = await lab.exec(lab.client, ['ping', '-6', '-c', '2', '-i', '0.3', '-W', '2', '-s', '3000', lab.vip6!]);
    expect(big.code, big.stdout + big.stderr).toBe(0);
    expect(big.stdout).toMatch(/2 received/);
    expect(metricValue(await daemon.metrics(), 'dsrlb_icmp_echo_replied_total', '')).toBe(before); // the kernel answered
  }, 30_000);

  it('answers a unicast neighbour probe (NUD) for the VIP, so the neighbour entry stays reachable', async () => {
    // As a router re-checks the VIP: a stale entry is probed with a unicast solicitation to the VIP itself.
    const c = lab.client;
    for (const [key, value] of [['delay_first_probe_time', '1'], ['retrans_time_ms', '300'], ['ucast_solicit', '3']]) {
      expect((await lab.exec(c, ['sysctl', '-qw', `net.ipv6.neigh.eth0.${key}=${value}`])).code).toBe(0);
    }
    expect((await lab.exec(c, ['ip', '-6', 'neigh', 'replace', lab.vip6!, 'dev', 'eth0', 'lladdr', lab.lb.mac, 'nud', 'stale'])).code).toBe(0);
    const probe = lab.spawn(lab.lb, ['tcpdump', '-i', 'eth0', '-nn', '-l', '--immediate-mode', 'icmp6', 'and', 'ip6[40] == 135', 'and', 'dst', 'host', lab.vip6!], { stdio: ['ignore', 'pipe', 'pipe'] });
    let unicastProbes = 0;
    probe.stdout!.on('data', (b: Buffer) => (unicastProbes += b.toString().split('\n').filter((l) => l.includes('neighbor solicitation')).length));
    await new Promise((r) => setTimeout(r, 500));
    await lab.exec(c, ['ping', '-6', '-c', '1', '-W', '1', lab.vip6!]);
    let state = '';
    for (let i = 0; i < 40 && !/REACHABLE|FAILED|INCOMPLETE/.test(state); i++) {
      await new Promise((r) => setTimeout(r, 100));
      if (i >= 12) state = (await lab.exec(c, ['ip', '-6', 'neigh', 'show', lab.vip6!, 'dev', 'eth0'])).stdout;
    }
    probe.kill('SIGTERM');
    expect(unicastProbes).toBeGreaterThanOrEqual(1);
    expect(state).toMatch(/REACHABLE/);
  }, 30_000);
});
