// An IPv6 VIP survives a flap of the LB's interface (`ip link set IF down; ip link set IF up`).
// dsrlb puts IPv6 VIPs on the interface itself (the kernel answers neighbour solicitations for
// them); with the default net.ipv6.conf.<if>.keep_addr_on_down=0 the kernel removes every IPv6
// address of an interface taken down, and a flap restarts no packet loop, so nothing put the VIP
// back: the LB answered no solicitation for it and IPv6 service traffic went nowhere until dsrlb
// was restarted. dsrlb now sets the value to 1 while it holds IPv6 VIPs and puts the old one back
// at stop. The LB's interface has a dot in its name, as a VLAN device's: the setting's path keeps it.

import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { httpCount, LabDaemon, requireRoot, sleep } from '../support/lab-daemon.js';

const PREFIX = `dsrlb-v6flap-${process.pid}-`;
/** The LB's interface, renamed from the lab's eth0: a dotted name like a VLAN device (eth0.100). */
const LB_IF = 'lan0.100';
const KEEP = `/proc/sys/net/ipv6/conf/${LB_IF}/keep_addr_on_down`;
let lab: Lab | undefined;
let daemon: LabDaemon | undefined;

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  try {
    lab = await createLab({ prefix: PREFIX, realCount: 2, ipv6: true });
    const lb = lab.lb;
    // A rename wants the link down, which (keep_addr_on_down 0) takes the LB's IPv6 address.
    const rename = await lab.exec(lb, ['sh', '-ec', `ip link set eth0 down; ip link set eth0 name ${LB_IF}; ip link set ${LB_IF} up; ip -6 addr add ${lb.ipv6}/64 dev ${LB_IF} nodad`]);
    expect(rename.code, rename.stderr).toBe(0);
    await lab.startHttpServers();
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-v6flap-'));
    const config = join(dir, 'dsrlb.yaml');
    await writeFile(
      config,
      [
        `interface: ${LB_IF}`,
        'metrics: { listen: 127.0.0.1:9742 }',
        'admin: { listen: 127.0.0.1:9743 }',
        `stateFile: ${join(dir, 'state.json')}`,
        'services:',
        '  - name: web6',
        `    vip: "${lab.vip6}"`,
        '    port: 80',
        '    protocol: tcp',
        // Reals up at once: the test is about the VIP, not about probes.
        '    healthCheck: { type: none }',
        '    reals:',
        ...lab.reals.map((r) => `      - address: "${r.ipv6}"`),
        '',
      ].join('\n'),
    );
    // The kernel's default: the flap would take the VIP.
    expect(await sysctl()).toBe('0');
    daemon = await LabDaemon.start(lab, config);
  } catch (err) {
    await destroyLabsWithPrefix(PREFIX).catch(() => undefined);
    throw err;
  }
}, 120_000);

afterAll(async () => {
  try {
    if (daemon) await daemon.stop();
    await lab?.destroy();
  } finally {
    await destroyLabsWithPrefix(PREFIX);
  }
}, 60_000);

/** The LB's keep_addr_on_down, read inside its namespace. */
async function sysctl(): Promise<string> {
  const r = await lab!.exec(lab!.lb, ['cat', KEEP]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout.trim();
}

/** The LB interface's IPv6 addresses, as `ADDR/LEN`. */
async function lbAddresses6(): Promise<string[]> {
  const r = await lab!.exec(lab!.lb, ['ip', '-6', '-j', 'addr', 'show', 'dev', LB_IF]);
  expect(r.code, r.stderr).toBe(0);
  const links = JSON.parse(r.stdout) as { addr_info?: { local: string; prefixlen: number }[] }[];
  return links.flatMap((l) => (l.addr_info ?? []).map((a) => `${a.local}/${a.prefixlen}`));
}

describe('an IPv6 VIP across a flap of the LB interface', () => {
  it('stays on the interface, the LB answers solicitations for it and the service is reached again', async () => {
    const l = lab!;
    const vip6 = l.vip6!;
    const before = await httpCount(l, 20, { host: vip6, timeoutMs: 3000 });
    expect(before.ok, JSON.stringify(before)).toBe(20);

    // Down and up, as an operator or a network manager does; the VIP is looked for while it is
    // down, so what keeps it is the kernel and not dsrlb adding it again afterwards.
    const flap = await l.exec(l.lb, ['sh', '-ec', `ip link set ${LB_IF} down; ip -6 -br addr show dev ${LB_IF}; ip link set ${LB_IF} up`]);
    expect(flap.code, flap.stderr).toBe(0);
    // The LB's own address is kept the same way; were it not, the host's network configuration
    // would put it back, so the test would fail for the VIP alone.
    if (!(await lbAddresses6()).includes(`${l.lb.ipv6}/64`)) {
      expect((await l.exec(l.lb, ['ip', '-6', 'addr', 'add', `${l.lb.ipv6}/64`, 'dev', LB_IF, 'nodad'])).code).toBe(0);
    }

    // The client forgets the VIP's MAC, as it would after the minutes of an outage: it must ask
    // the LB again, with a neighbour solicitation the LB's kernel answers only while it holds the VIP.
    expect((await l.exec(l.client, ['ip', '-6', 'neigh', 'flush', 'dev', 'eth0'])).code).toBe(0);
    await sleep(300); // the bridge's port to the LB forwards again at once (no STP), the rest settles
    const after = await httpCount(l, 20, { host: vip6, timeoutMs: 3000 });
    // Soft: when the service is not reached, the checks below say why.
    expect.soft(after.ok, JSON.stringify(after) + '\n' + daemon!.logs.slice(-20).join('\n')).toBe(20);
    const neigh = await l.exec(l.client, ['ip', '-j', '-6', 'neigh', 'show', vip6, 'dev', 'eth0']);
    expect.soft((JSON.parse(neigh.stdout || '[]') as { lladdr?: string }[])[0]?.lladdr, `the client's neighbour entry for the VIP: ${neigh.stdout}`).toBe(l.lb.mac);
    expect.soft(flap.stdout, 'the VIP while the interface is down').toContain(`${vip6}/128`);
    expect.soft(await lbAddresses6(), 'the VIP after the flap').toContain(`${vip6}/128`);
    expect(await sysctl()).toBe('1');
  }, 60_000);

  it('puts keep_addr_on_down back as it was, and the VIP off the interface, when dsrlb stops', async () => {
    expect(await daemon!.stop()).toBe(0);
    expect(await sysctl()).toBe('0');
    expect(await lbAddresses6()).not.toContain(`${lab!.vip6}/128`);
    expect(daemon!.logs.some((l) => l.includes('IPv6 addresses now kept when the interface goes down') && l.includes(LB_IF))).toBe(true);
  }, 30_000);
});
