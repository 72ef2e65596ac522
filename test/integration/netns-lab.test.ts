// The namespace lab (src/lab/netns-lab.ts) and the real servers' HTTP server: two reals provisioned
// by dsrlb-realserver, their servers on the VIP, the segment reachable from the client, and
// destroy leaving nothing behind. Needs root, `ip netns` and a built dist/ (npx tsc -p tsconfig.json).

import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { patternBytes } from '../../src/lab/real-http-server.js';

const PREFIX = `dsrt-lab-${process.pid}-`;
const PREFIX6 = `dsrt-lab6-${process.pid}-`;
const REALSERVER_SCRIPT = fileURLToPath(new URL('../../deploy/linux/dsrlb-realserver', import.meta.url));
const REAL_SERVER_JS = fileURLToPath(new URL('../../dist/lab/real-http-server.js', import.meta.url));

function sha256(data: Buffer | string): string {
  return createHash('sha256').update(data).digest('hex');
}

describe('netns lab with two reals', () => {
  let lab: Lab;

  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces)');
    if (!existsSync(REAL_SERVER_JS)) throw new Error(`${REAL_SERVER_JS} missing: run npx tsc -p tsconfig.json first`);
    lab = await createLab({ prefix: PREFIX, realCount: 2 });
    await lab.startHttpServers();
  });

  afterAll(async () => {
    // Also when beforeAll failed half-way: the prefix finds whatever was made.
    await destroyLabsWithPrefix(PREFIX);
  });

  it('names the namespaces and addresses as documented', async () => {
    expect(lab.switchNs).toBe(`${PREFIX}sw`);
    expect(lab.vip).toBe('10.77.0.100');
    expect(lab.subnet).toBe('10.77.0.0/24');
    expect(lab.vip6).toBeNull();
    expect(lab.client).toMatchObject({ name: 'c', ns: `${PREFIX}c`, ipv4: '10.77.0.10', ifname: 'eth0', ipv6: null });
    expect(lab.lb).toMatchObject({ name: 'lb', ns: `${PREFIX}lb`, ipv4: '10.77.0.2' });
    expect(lab.reals.map((r) => [r.name, r.ns, r.ipv4])).toEqual([
      ['r1', `${PREFIX}r1`, '10.77.0.11'],
      ['r2', `${PREFIX}r2`, '10.77.0.12'],
    ]);
    for (const h of [lab.client, lab.lb, ...lab.reals]) expect(h.mac).toMatch(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/);
    expect(await lab.listNamespaces()).toEqual(
      [`${PREFIX}c`, `${PREFIX}lb`, `${PREFIX}r1`, `${PREFIX}r2`, `${PREFIX}sw`].sort(),
    );
    expect([...lab.namespaces].sort()).toEqual(await lab.listNamespaces());
  });

  it('leaves veth offloads at their defaults (the LB must cope with TSO and partial checksums)', async () => {
    const r = await lab.exec(lab.lb, ['ethtool', '-k', 'eth0']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/tcp-segmentation-offload: on/);
    expect(r.stdout).toMatch(/tx-checksumming: on/);
  });

  it('provisions every real with dsrlb-realserver: its check passes in each real namespace', async () => {
    for (const r of lab.reals) {
      const check = await lab.exec(r, ['sh', REALSERVER_SCRIPT, 'check', '--vip', lab.vip]);
      expect(check.stdout).toMatch(/^ok: VIPs 10\.77\.0\.100 on lo/);
      expect(check.code).toBe(0);
    }
  });

  it('serves GET / on the VIP inside each real: curl from the real to its own VIP', async () => {
    for (const r of lab.reals) {
      const res = await lab.exec(r, ['curl', '-s', '-i', '--max-time', '5', `http://${lab.vip}/`]);
      expect(res.code).toBe(0);
      expect(res.stdout).toMatch(new RegExp(`^X-Real: ${r.name}\\r$`, 'mi'));
      expect(res.stdout.endsWith(`\r\n\r\nreal=${r.name}\n`)).toBe(true);
    }
  });

  it('reaches every real from the client with ping over the bridge', async () => {
    for (const r of lab.reals) {
      const res = await lab.exec(lab.client, ['ping', '-c', '1', '-W', '2', r.ipv4]);
      expect(res.stdout, res.stderr).toContain('1 received');
      expect(res.code).toBe(0);
    }
  });

  it('hides the VIP from ARP on the reals: a client probe for the VIP gets no answer', async () => {
    // No LB owns the VIP yet, and the reals must not answer for it (arp_ignore=1).
    const res = await lab.exec(lab.client, ['ping', '-c', '1', '-W', '1', lab.vip]);
    expect(res.code).not.toBe(0);
    const neigh = await lab.exec(lab.client, ['ip', 'neigh', 'show', lab.vip]);
    expect(neigh.stdout).not.toMatch(/lladdr/);
  });

  it('real-http-server answers healthz, streams the byte pattern, paces with ?rate and hashes uploads', async () => {
    const r1 = lab.reals[0]!;
    const base = `http://${r1.ipv4}`;
    const health = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', `${base}/healthz`]);
    expect(health.stdout).toBe('200');

    const sizeBytes = 300_000; // crosses the 64 KiB pattern period four times
    const dl = await lab.exec(lab.client, ['sh', '-c', `curl -s --max-time 10 ${base}/bytes/${sizeBytes} | sha256sum`]);
    expect(dl.stdout.split(' ')[0]).toBe(sha256(patternBytes(sizeBytes)));

    const t0 = Date.now();
    const paced = await lab.exec(lab.client, [
      'curl', '-s', '--max-time', '10', '-o', '/dev/null', '-w', '%{size_download}', `${base}/bytes/40000?rate=50000`,
    ]);
    const elapsedMs = Date.now() - t0;
    expect(paced.stdout).toBe('40000');
    expect(elapsedMs).toBeGreaterThanOrEqual(700); // 40000 B at 50000 B/s: 0.8 s less one pacing tick

    const up = await lab.exec(lab.client, [
      'sh', '-c', `head -c 200000 /dev/zero | curl -s --max-time 10 --data-binary @- ${base}/upload`,
    ]);
    expect(JSON.parse(up.stdout)).toEqual({ real: 'r1', bytes: 200_000, sha256: sha256(Buffer.alloc(200_000)) });

    const notFound = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', `${base}/nope`]);
    expect(notFound.stdout).toBe('404');
  });

  it('keeps connections alive: two requests on one curl reuse the connection', async () => {
    const r2 = lab.reals[1]!;
    const res = await lab.exec(lab.client, [
      'curl', '-s', '-v', `http://${r2.ipv4}/`, `http://${r2.ipv4}/healthz`,
    ]);
    expect(res.stdout).toBe('real=r2\nok\n');
    expect(res.stderr).toMatch(/Re-using existing connection/);
  });

  it('destroy stops the HTTP servers cleanly (SIGTERM, exit 0) and leaves no namespace with the prefix', async () => {
    const servers = [...lab.httpServers.values()];
    expect(servers).toHaveLength(2);
    const exits = servers.map((c) => new Promise<number | null>((done) => c.once('exit', (code) => done(code))));
    await lab.destroy();
    expect(await Promise.all(exits)).toEqual([0, 0]);
    expect(await lab.listNamespaces()).toEqual([]);
    expect(existsSync(`/run/dsrlb-realserver/netns-${PREFIX}r1.state`)).toBe(false);
  });
});

describe('netns lab with IPv6', () => {
  let lab: Lab;

  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces)');
    lab = await createLab({ prefix: PREFIX6, realCount: 1, ipv6: true });
    await lab.startHttpServers();
  });

  afterAll(async () => {
    await destroyLabsWithPrefix(PREFIX6);
  });

  it('gives every host an fd77::/64 address and the real the IPv6 VIP, served over HTTP', async () => {
    const r1 = lab.reals[0]!;
    expect(lab.vip6).toBe('fd77::100');
    expect(lab.client.ipv6).toBe('fd77::10');
    expect(r1.ipv6).toBe('fd77::11');
    const own = await lab.exec(r1, ['curl', '-s', '--max-time', '5', `http://[${lab.vip6}]/`]);
    expect(own.stdout).toBe('real=r1\n');
    const ping = await lab.exec(lab.client, ['ping', '-6', '-c', '1', '-W', '2', r1.ipv6!]);
    expect(ping.stdout, ping.stderr).toContain('1 received');
    const viaSegment = await lab.exec(lab.client, ['curl', '-s', '--max-time', '5', `http://[${r1.ipv6}]/`]);
    expect(viaSegment.stdout).toBe('real=r1\n');
  });

  it('refuses a second lab with the same prefix while the first exists', async () => {
    await expect(createLab({ prefix: PREFIX6, realCount: 1 })).rejects.toThrow(/already exist/);
  });
});
