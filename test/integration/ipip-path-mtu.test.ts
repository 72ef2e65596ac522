// The path MTU toward an IPIP real, learned from the underlay: a router between the LB and the real
// answers a tunnel packet too big for its next link with ICMP fragmentation-needed (ICMPv6
// packet-too-big) to the LB's outer source. dsrlb holds raw sockets for the tunnel protocols
// (src/control/path-mtu-sockets.ts), so the LB's kernel takes the error and records the smaller
// MTU toward the real and reports the error on the socket, on which the daemon asks the route
// again at once and makes that the real's tunnel MTU; a client's
// full-size segments then get fragmentation-needed (packet-too-big) from the LB with the path MTU
// less the outer header, and an upload through the tunnel completes. The sockets are connected to
// the reals and bound to the tunnel source (here a second IPv6 address, tunnel.sourceV6, routed by
// its own policy rule and table, where the kernel keeps what it learns and the daemon asks `from`
// it): an error about another destination changes nothing, and a learned MTU below 1280 (what a
// forged error brings) is ignored. This lab has one segment: the real's namespace sends the router's error
// (test/support/icmp-error-sender.mjs); everything after that is the kernels' and dsrlb's own.

import { createHash } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dsrlbArgv } from '../../src/cli/command-argv.js';
import { createLab, destroyLabsWithPrefix, type Lab, type LabHost } from '../../src/lab/netns-lab.js';
import { LabDaemon, metricValue, requireRoot, ROOT, sleep, stopProcess } from '../support/lab-daemon.js';

const PREFIX = `dsrt-pm-${process.pid}-`;
const PATH_MTU = 1400;
/** The LB's outer IPv6 source (tunnel.sourceV6), a second address on its eth0. */
const SOURCE6 = 'fd77::99';
let lab: Lab;
let real: LabHost;
let dir: string;
let decap: ChildProcess;
let daemon: LabDaemon;

/** The MTU `ip route get` reports toward `address` (from `source`) in the namespace, or null without one. */
async function routeMtu(host: LabHost, address: string, source?: string): Promise<number | null> {
  const r = await lab.exec(host, ['ip', '-j', 'route', 'get', address, ...(source !== undefined ? ['from', source] : [])]);
  const route = (JSON.parse(r.stdout) as { metrics?: { mtu?: number }[] }[])[0];
  return route?.metrics?.find((m) => typeof m.mtu === 'number')?.mtu ?? null;
}

/** The daemon's log lines that say a router's too-big error about a tunnel had the routes asked again. */
const tooBigLogs = (): string[] => daemon.logs.filter((l) => l.includes('a router says tunnel packets toward IPIP reals were too big'));

async function waitFor<T>(what: string, get: () => Promise<T>, ok: (v: T) => boolean, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = await get();
  while (!ok(v)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${JSON.stringify(v)}):\n${daemon.logs.slice(-20).join('\n')}`);
    await sleep(200);
    v = await get();
  }
  return v;
}

/** The router's error about a tunnel packet to `outerDst` (default: the real), sent from the real's namespace to the LB. */
async function routerSaysTooBig(family: 4 | 6, mtu = PATH_MTU, outerDst?: string): Promise<void> {
  const v6 = family === 6;
  const r = await lab.exec(real, [
    process.execPath,
    join(ROOT, 'test', 'support', 'icmp-error-sender.mjs'),
    '--to', v6 ? lab.lb.ipv6! : lab.lb.ipv4,
    '--mtu', String(mtu),
    '--outer-src', v6 ? SOURCE6 : lab.lb.ipv4,
    '--outer-dst', outerDst ?? (v6 ? real.ipv6! : real.ipv4),
    '--inner-src', v6 ? lab.client.ipv6! : lab.client.ipv4,
    '--inner-dst', v6 ? lab.vip6! : lab.vip,
  ]);
  expect(r.code, r.stderr).toBe(0);
}

/** A 200 kB POST from the client through the tunnel; its reply names the real and the body's hash. */
async function upload(host: string): Promise<void> {
  const data = Buffer.alloc(200_000, 0x5a);
  const file = join(dir, 'upload.bin');
  await writeFile(file, data);
  const url = host.includes(':') ? `http://[${host}]/upload` : `http://${host}/upload`;
  const r = await lab.exec(lab.client, ['curl', '-s', '-m', '30', '--data-binary', `@${file}`, url], { timeoutMs: 40_000 });
  expect(r.code, r.stderr).toBe(0);
  expect(JSON.parse(r.stdout)).toEqual({ real: real.name, bytes: data.length, sha256: createHash('sha256').update(data).digest('hex') });
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 1, ipv6: true });
  real = lab.reals[0]!;
  await lab.startHttpServers();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-pmtu-'));
  decap = lab.spawn(real, [...dsrlbArgv(ROOT), 'decap', '--interface', 'eth0', '--vip', `${lab.vip},${lab.vip6}`], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: decap.stdout! }).on('line', (l) => l.includes('decap running') && resolve());
    decap.once('exit', (c) => reject(new Error(`decap exited ${c}`)));
  });
  for (const argv of [
    ['ip', '-6', 'addr', 'add', `${SOURCE6}/64`, 'dev', 'eth0', 'nodad'],
    ['ip', '-6', 'rule', 'add', 'from', SOURCE6, 'lookup', '100', 'pref', '100'],
    ['ip', '-6', 'route', 'add', lab.subnet6!, 'dev', 'eth0', 'table', '100'],
  ]) {
    const r = await lab.exec(lab.lb, argv);
    expect(r.code, `${argv.join(' ')}: ${r.stderr}`).toBe(0);
  }
  const config = join(dir, 'dsrlb.yaml');
  await writeFile(
    config,
    [
      'interface: eth0',
      'metrics: { listen: 127.0.0.1:9742 }',
      'admin: { listen: 127.0.0.1:9743 }',
      `tunnel: { sourceV6: "${SOURCE6}" }`,
      'services:',
      ...[
        ['web', lab.vip, real.ipv4],
        ['web6', lab.vip6!, real.ipv6!],
      ].flatMap(([name, vip, address]) => [
        `  - name: ${name}`,
        `    vip: "${vip}"`,
        '    port: 80',
        '    protocol: tcp',
        '    forwarding: ipip',
        '    reals:',
        `      - address: "${address}"`,
      ]),
      '',
    ].join('\n'),
  );
  daemon = await LabDaemon.start(lab, config);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  if (decap) await stopProcess(decap);
  await lab?.destroy();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('IPIP path MTU learned from the underlay', () => {
  it.each([4, 6] as const)('IPv%i: a router\'s error about the tunnel lowers the real\'s tunnel MTU, and clients get too-big from the LB', async (family) => {
    const v6 = family === 6;
    const realAddress = v6 ? real.ipv6! : real.ipv4;
    const vip = v6 ? lab.vip6! : lab.vip;
    const outerHeader = v6 ? 40 : 20;
    // Before: the tunnel's MTU is the LB interface's (1500), and the client learns 1500 less the
    // outer header from the LB.
    const lbSource = v6 ? SOURCE6 : undefined;
    await upload(vip);
    expect(await routeMtu(lab.lb, realAddress, lbSource)).toBeNull();
    expect(await routeMtu(lab.client, vip)).toBe(1500 - outerHeader);
    const tooBigBefore = metricValue(await daemon.metrics(), 'dsrlb_icmp_too_big_sent_total', '');

    await routerSaysTooBig(family);
    // The LB's kernel took it: a route exception toward the real (without dsrlb's raw socket for
    // the tunnel protocol there is no taker, and the error is dropped).
    await waitFor('the LB kernel to record the path MTU', () => routeMtu(lab.lb, realAddress, lbSource), (m) => m === PATH_MTU, 3000);
    // IPv6: on the policy table's route, which the main table's answer does not show.
    if (v6) expect(await routeMtu(lab.lb, realAddress)).toBeNull();
    // The kernel also reported the error on the socket, which makes the daemon ask the route
    // again at once (not at its next refresh, up to 10 s later): the real's tunnel MTU.
    // (At most one such refresh a second: the IPv6 case may wait for the IPv4 one's second. 3 s
    // leaves room for a loaded machine; the periodic refresh comes every 10 s, and the log line
    // is the trigger's own.)
    await waitFor(
      'the daemon to hear of the error',
      async () => tooBigLogs().filter((l) => l.includes(`"${realAddress}"`)).length,
      (n) => n === 1,
      3000,
    );
    await waitFor(
      'the daemon to take the tunnel MTU',
      async () => daemon.logs.some((l) => l.includes('IPIP real route changed') && l.includes(`"real":"${realAddress}"`) && l.includes(`"mtu":${PATH_MTU}`)),
      (seen) => seen,
      3000,
    );

    await upload(vip);
    expect(await routeMtu(lab.client, vip)).toBe(PATH_MTU - outerHeader);
    expect(metricValue(await daemon.metrics(), 'dsrlb_icmp_too_big_sent_total', '')).toBeGreaterThan(tooBigBefore);
  }, 60_000);

  it('takes no error about a destination that is not a real: the sockets are connected to the reals', async () => {
    const other = '10.77.0.250';
    const logged = tooBigLogs().length;
    const refreshes = daemon.logs.length;
    await routerSaysTooBig(4, PATH_MTU, other);
    // Longer than the trigger's 50 ms and its one-second gap after the IPv6 case's refresh.
    await sleep(1200);
    expect(await routeMtu(lab.lb, other)).toBeNull();
    // No socket took it: no refresh was asked (the log says it for every real a refresh is for).
    expect(tooBigLogs()).toHaveLength(logged);
    expect(daemon.logs.slice(refreshes).filter((l) => l.includes('IPIP real route changed'))).toEqual([]);
    expect(await routeMtu(lab.lb, real.ipv4)).toBe(PATH_MTU);
  });

  it("ignores a learned path MTU below 1280 (as a forged error brings), with a warning, and keeps the route's own MTU", async () => {
    // The operator's route toward the real, with an MTU of its own (a VPN underlay).
    const route = await lab.exec(lab.lb, ['ip', 'route', 'add', `${real.ipv4}/32`, 'dev', 'eth0', 'mtu', '1450']);
    expect(route.code, route.stderr).toBe(0);
    const changedTo = (mtu: number | null) =>
      daemon.logs.filter((l) => l.includes('IPIP real route changed') && l.includes(`"real":"${real.ipv4}"`) && new RegExp(`"now":\\{[^}]*"mtu":${mtu}\\}`).test(l));
    await waitFor('the daemon to take the route MTU', async () => changedTo(1450).length, (n) => n > 0, 15_000);
    await routerSaysTooBig(4, 600);
    await waitFor('the LB kernel to record 600', () => routeMtu(lab.lb, real.ipv4), (m) => m === 600, 3000);
    await waitFor(
      'the daemon to ignore it',
      async () => daemon.logs.some((l) => l.includes('ignored a path MTU toward an IPIP real below 1280') && l.includes(`"real":"${real.ipv4}"`) && l.includes('"mtu":600') && l.includes('"routeMtu":1450')),
      (seen) => seen,
      15_000,
    );
    // One more refresh: the tunnel MTU stayed the route's.
    await sleep(11_000);
    expect(changedTo(1450)).toHaveLength(1);
    expect(changedTo(null)).toHaveLength(0);
    expect(changedTo(600)).toHaveLength(0);
    await upload(lab.vip);
    await lab.exec(lab.lb, ['ip', 'route', 'del', `${real.ipv4}/32`]);
  }, 60_000);
});
