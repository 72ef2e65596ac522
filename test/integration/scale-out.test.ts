// Scale-out behind ECMP in network namespaces: two LB hosts, each running dsrlb and BIRD 2 with the
// shipped deploy/linux/bird configs, announce the VIPs over eBGP to a router that spreads the
// client's connections over them. Checks the spread, DSR replies bypassing both LBs, withdrawal
// (no eligible real, operator, clean stop), survival of connections when an LB dies or comes back,
// failure detection with and without BFD, and that both LBs build the same forwarding table.

import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  captureVipSourced,
  httpCount,
  LbDaemon,
  metricSum,
  parseSegment,
  ScaleOutLab,
  sleep,
  startCapture,
  tcpCounters,
  type LbHost,
  type Segment,
  type Status,
} from '../support/scale-out-lab.js';
import { KeepAliveClient, type KeepAliveRound } from '../support/keepalive-client.js';

const PREFIX = `dsrt-so-${process.pid}-`;
const VIP_WEB = '10.79.0.100';
const VIP_EDGE = '10.79.0.101';
/** BFD in deploy/linux/bird/*.conf: 100 ms x 3. */
const BFD_DETECTION_MS = 300;
/** BGP hold time in deploy/linux/bird/*.conf. */
const HOLD_TIME_MS = 3000;
const ROUTE_TIMEOUT_MS = 20_000;

let lab: ScaleOutLab;
const daemons = new Map<string, LbDaemon>();
/** Figures for the report, printed once at the end. */
const figures: Record<string, unknown> = {};

function requireRoot(): void {
  if (process.getuid?.() !== 0) throw new Error('namespace tests need root: run as root (CI does)');
}

interface LbConfigOptions {
  /** Weight of r1 in service web (default 100). */
  webWeightR1?: number;
  /** State of every real of service edge (default active). */
  edgeRealState?: 'active' | 'disabled';
  /** An http health check on service web (its reals start down and come up one by one). */
  webHealthCheck?: boolean;
  /** An http health check on service edge (whenAllDown: drop: withdrawn when its probes all fail). */
  edgeHealthCheck?: boolean;
}

function lbConfig(lb: LbHost, opts: LbConfigOptions = {}): string {
  const reals = (weightR1: number, state: string): string[] =>
    lab.reals.flatMap((r, i) => [`      - address: ${r.ipv4}`, `        weight: ${i === 0 ? weightR1 : 100}`, `        state: ${state}`]);
  return [
    'interface: eth0',
    'metrics: { listen: 127.0.0.1:9742 }',
    'admin: { listen: 127.0.0.1:9743 }',
    'announce:',
    '  enabled: true',
    `  routesFile: ${lb.routesFile}`,
    `  birdSocket: ${lb.birdSocket}`,
    'services:',
    '  - name: web',
    `    vip: ${VIP_WEB}`,
    '    port: 80',
    '    protocol: tcp',
    '    scheduler: maglev',
    ...(opts.webHealthCheck ? ['    healthCheck: { type: http, interval: 500ms, timeout: 400ms, rise: 2, fall: 2 }'] : []),
    '    reals:',
    ...reals(opts.webWeightR1 ?? 100, 'active'),
    '  - name: edge',
    `    vip: ${VIP_EDGE}`,
    '    port: 80',
    '    protocol: tcp',
    '    scheduler: maglev',
    '    whenAllDown: drop',
    // A reals' wait of (rise 2 + 1) x 1 s + 500 ms = 3.5 s after the first is back.
    ...(opts.edgeHealthCheck ? ['    healthCheck: { type: http, interval: 1s, timeout: 500ms, rise: 2, fall: 2 }'] : []),
    '    reals:',
    ...reals(100, opts.edgeRealState ?? 'active'),
    '',
  ].join('\n');
}

function configPath(lb: LbHost): string {
  return join(lb.dir, 'dsrlb.yaml');
}

function lb(i: number): LbHost {
  return lab.lbs[i]!;
}

function daemon(l: LbHost): LbDaemon {
  const d = daemons.get(l.name);
  if (!d) throw new Error(`no dsrlb running on ${l.name}`);
  return d;
}

const readyAndAnnounced = (s: Status): boolean => s.services.every((svc) => svc.announced && svc.reals.every((r) => r.mac !== null));

async function startDaemon(l: LbHost, opts: LbConfigOptions = {}): Promise<LbDaemon> {
  await writeFile(configPath(l), lbConfig(l, opts));
  const d = await LbDaemon.start(lab, l, configPath(l), readyAndAnnounced);
  daemons.set(l.name, d);
  return d;
}

/** Rewrites an LB's config and has the running daemon take it (`dsrlb reload`). */
async function reload(l: LbHost, opts: LbConfigOptions): Promise<void> {
  await writeFile(configPath(l), lbConfig(l, opts));
  const r = await daemon(l).cli(['reload']);
  if (r.code !== 0) throw new Error(`dsrlb reload on ${l.name}: exit ${r.code} ${r.stdout}${r.stderr}`);
}

const allLbs = (): string[] => lab.lbs.map((l) => l.ipv4);

async function flowsCreated(l: LbHost, service: string): Promise<number> {
  return metricSum(await daemon(l).metrics(), 'dsrlb_flows_created_total', `service="${service}"`);
}

/** dsrlb_dropped_packets_total of an LB by reason, the non-zero ones. */
async function drops(l: LbHost): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const line of (await daemon(l).metrics()).split('\n')) {
    const m = /^dsrlb_dropped_packets_total\{reason="([^"]+)"\} (\S+)$/.exec(line);
    if (m && Number(m[2]) > 0) out[m[1]!] = Number(m[2]);
  }
  return out;
}

function dropsSince(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [reason, n] of Object.entries(after)) if (n - (before[reason] ?? 0) > 0) out[reason] = n - (before[reason] ?? 0);
  return out;
}

/** Answers of a round that failed or came from another real than in `before` (by connection). */
function changed(before: KeepAliveRound, after: KeepAliveRound): string[] {
  const out: string[] = [];
  after.answers.forEach((a, i) => {
    const b = before.answers[i]!;
    if ('error' in a) out.push(`port ${a.port}: ${a.error}`);
    else if (!('real' in b) || a.real !== b.real) out.push(`port ${a.port}: ${'real' in b ? b.real : '?'} -> ${a.real}`);
  });
  return out;
}

function allAnswered(r: KeepAliveRound): boolean {
  return r.answers.every((a) => 'real' in a && a.real !== null);
}

/** A SYN the client sent again, and where its first attempt went (ms from the test's origin). */
interface LostSyn {
  client: string;
  firstMs: number;
  againMs: number;
  /** Per LB: when the first attempt arrived there and when it was forwarded (null: not seen). */
  lbs: Record<string, { inMs: number | null; outMs: number | null }>;
}

function describeSyn(x: LostSyn): string {
  const where = Object.entries(x.lbs)
    .map(([name, v]) => `${name} in ${v.inMs ?? '-'} out ${v.outMs ?? '-'}`)
    .join(', ');
  return `${x.client}: SYN at ${x.firstMs} ms (${where}), again at ${x.againMs} ms`;
}

/**
 * Watches SYNs at the client and on every LB (received, and forwarded to a real) while a test
 * runs. stop() lists the SYNs the client sent again: a port whose SYN got no SYN-ACK and that sent
 * another one after the kernel's retransmission time (ports are reused, so they are paired).
 */
async function watchSyns(): Promise<{ stop(originMs: number): Promise<LostSyn[]> }> {
  const client = await startCapture(lab, lab.client.ns, 'eth0', ['tcp[tcpflags] & tcp-syn != 0']);
  const perLb = await Promise.all(
    lab.lbs.map(async (l) => ({
      name: l.name,
      in: await startCapture(lab, l.ns, 'eth0', ['-Q', 'in', 'tcp[tcpflags] == tcp-syn']),
      out: await startCapture(lab, l.ns, 'eth0', ['-Q', 'out', 'tcp[tcpflags] == tcp-syn']),
    })),
  );
  const segments = (lines: string[]): Segment[] => lines.map(parseSegment).filter((x) => x !== null);
  return {
    async stop(originMs: number): Promise<LostSyn[]> {
      const atClient = segments(await client.stop());
      const atLbs = await Promise.all(perLb.map(async (c) => ({ name: c.name, in: segments(await c.in.stop()), out: segments(await c.out.stop()) })));
      const pending = new Map<string, number>();
      const out: LostSyn[] = [];
      for (const seg of atClient) {
        if (seg.flags !== 'S') {
          pending.delete(seg.to);
          continue;
        }
        const first = pending.get(seg.from);
        // Linux resends a SYN after 1 s, then 2 s more; any other gap is the port reused by a new
        // connection whose SYN-ACK this capture missed (tcpdump drops frames when starved of CPU).
        const gapMs = first === undefined ? 0 : seg.atMs - first;
        if (first === undefined || !((gapMs > 850 && gapMs < 1250) || (gapMs > 2700 && gapMs < 3400))) {
          pending.set(seg.from, seg.atMs);
          continue;
        }
        const near = (list: Segment[]): number | null => {
          const hit = list.find((x) => x.from === seg.from && x.atMs >= first - 50 && x.atMs < seg.atMs);
          return hit ? hit.atMs - originMs : null;
        };
        const lbs: LostSyn['lbs'] = {};
        for (const l of atLbs) lbs[l.name] = { inMs: near(l.in), outMs: near(l.out) };
        out.push({ client: seg.from, firstMs: first - originMs, againMs: seg.atMs - originMs, lbs });
      }
      return out;
    },
  };
}

beforeAll(async () => {
  requireRoot();
  lab = await ScaleOutLab.create({ prefix: PREFIX, vips: [VIP_WEB, VIP_EDGE] });
  await lab.startHttpServers();
  await lab.startRouterBird(true);
  for (const l of lab.lbs) {
    // BIRD first: the shipped include is a glob, so a routes file dsrlb has not written yet is no error.
    await lab.startLbBird(l, true);
    await startDaemon(l);
  }
  for (const vip of lab.vips) await lab.waitForNexthops(vip, allLbs(), ROUTE_TIMEOUT_MS);
}, 120_000);

afterAll(async () => {
  if (Object.keys(figures).length > 0) console.log(`scale-out figures: ${JSON.stringify(figures, null, 1)}`);
  await lab?.destroy();
}, 60_000);

describe('scale-out: two dsrlb LBs behind an ECMP router (BIRD 2, BGP + BFD)', () => {
  it('both LBs announce every VIP through their TUN gates, and the router holds one nexthop per LB', async () => {
    for (const vip of lab.vips) expect(await lab.nexthops(vip)).toEqual(allLbs());
    for (const l of lab.lbs) {
      const s = await daemon(l).status();
      for (const svc of s.services) {
        expect(svc.announced).toBe(true);
        expect(svc.announceDevice).toMatch(/^dsv[0-9a-f]{8}$/);
        // The gate: a TUN device, up (with its carrier, LOWER_UP) while announced.
        const link = JSON.parse((await lab.exec(l.ns, ['ip', '-j', 'link', 'show', 'dev', svc.announceDevice!])).stdout) as { flags: string[] }[];
        expect(link[0]!.flags).toEqual(expect.arrayContaining(['UP', 'LOWER_UP']));
        expect(metricSum(await daemon(l).metrics(), 'dsrlb_vip_announced', `service="${svc.name}"`)).toBe(1);
      }
      // The device name is a function of the VIP alone, so every LB's BIRD sees the same routes.
      expect(s.services.map((x) => x.announceDevice)).toEqual((await daemon(lb(0)).status()).services.map((x) => x.announceDevice));
      const birdRoutes = (await lab.lbBirds.get(l.name)!.birdc(['show', 'route', 'protocol', 'dsrlb_v4'])).stdout;
      for (const vip of lab.vips) expect(birdRoutes).toContain(`${vip}/32`);
    }
  });

  it("the LB's BIRD exports host routes only: a wider route in the routes file stays on the LB", async () => {
    const l = lb(0);
    const bird = lab.lbBirds.get(l.name)!;
    const original = await readFile(l.routesFile, 'utf8');
    const gate = (await daemon(l).status()).services[0]!.announceDevice!;
    // As a hand edit (or anyone who can write /run/dsrlb) would add it: 10.0.0.0/8 via a live gate.
    await writeFile(l.routesFile, original.replace(/(protocol static dsrlb_v4 \{\n)/, `$1  route 10.0.0.0/8 via "${gate}";\n`));
    try {
      expect((await bird.birdc(['configure'])).code).toBe(0);
      expect((await bird.birdc(['show', 'route', 'protocol', 'dsrlb_v4'])).stdout).toContain('10.0.0.0/8');
      const exported = (await bird.birdc(['show', 'route', 'export', 'upstream'])).stdout;
      expect(exported).not.toContain('10.0.0.0/8');
      for (const vip of lab.vips) expect(exported).toContain(`${vip}/32`);
    } finally {
      await writeFile(l.routesFile, original);
      await bird.birdc(['configure']);
    }
    for (const vip of lab.vips) expect(await lab.nexthops(vip)).toEqual(allLbs());
  });

  it('both LBs compute the same table fingerprint from the same config, and a different one when a weight differs', async () => {
    const prints = async (l: LbHost): Promise<Record<string, string>> =>
      Object.fromEntries((await daemon(l).status()).services.map((s) => [s.name, s.tableFingerprint]));
    const same1 = await prints(lb(0));
    const same2 = await prints(lb(1));
    expect(same1.web).toMatch(/\S/);
    expect(same2).toEqual(same1);
    const metrics = await daemon(lb(1)).metrics();
    expect(metricSum(metrics, 'dsrlb_table_fingerprint', `service="web",fingerprint="${same1.web}"`)).toBe(1);

    // A reload changes the table, not the announcement: the router must see no route change.
    const monitor = await lab.monitorRoutes();
    await reload(lb(1), { webWeightR1: 200 });
    const deadline = Date.now() + 10_000;
    let differ = await prints(lb(1));
    while (differ.web === same1.web && Date.now() < deadline) {
      await sleep(200);
      differ = await prints(lb(1));
    }
    expect(differ.web).not.toBe(same1.web);
    expect(differ.edge).toBe(same1.edge);
    expect(metricSum(await daemon(lb(1)).metrics(), 'dsrlb_table_fingerprint', `service="web",fingerprint="${differ.web}"`)).toBe(1);
    figures.fingerprints = { sameConfig: same1.web, r1Weight200: differ.web };

    await reload(lb(1), {});
    const back = Date.now() + 10_000;
    while ((await prints(lb(1))).web !== same1.web && Date.now() < back) await sleep(200);
    expect(await prints(lb(1))).toEqual(same1);
    await sleep(500);
    expect(await monitor.stop()).toEqual([]);
    for (const vip of lab.vips) expect(await lab.nexthops(vip)).toEqual(allLbs());
  });

  it('200 connections from distinct ports spread over both LBs and every real, and no reply crosses an LB', async () => {
    expect(await lab.nexthops(VIP_WEB)).toEqual(allLbs());
    const before = await Promise.all(lab.lbs.map((l) => flowsCreated(l, 'web')));
    const captures = await Promise.all(lab.lbs.map((l) => captureVipSourced(lab, l, VIP_WEB)));
    const result = await httpCount(lab, VIP_WEB, 200);
    const vipSourcedFrames = await Promise.all(captures.map((c) => c.stop()));
    const after = await Promise.all(lab.lbs.map((l) => flowsCreated(l, 'web')));
    const perLb = after.map((a, i) => a - before[i]!);

    expect(result).toMatchObject({ ok: 200, failed: 0 });
    // Many flows: the client's kernel may reuse a port whose connection closed (see l2-dsr.test.ts).
    expect(result.distinctPorts).toBeGreaterThanOrEqual(170);
    // Each connection is one new flow on exactly one LB: the router keeps a 5-tuple on one path.
    expect(perLb[0]! + perLb[1]!).toBe(200);
    for (const n of perLb) expect(n).toBeGreaterThanOrEqual(40);
    for (const r of lab.reals) expect(result.byReal[r.name] ?? 0).toBeGreaterThanOrEqual(20);
    expect(vipSourcedFrames).toEqual([0, 0]);
    figures.spread = { connectionsPerLb: Object.fromEntries(lab.lbs.map((l, i) => [l.name, perLb[i]])), perReal: result.byReal, vipSourcedFramesOnLbs: vipSourcedFrames };
  });

  it('a service left with no eligible real (whenAllDown: drop) is withdrawn from that LB only, and announced again', async () => {
    const d1 = daemon(lb(0));
    for (const r of lab.reals) {
      const res = await d1.cli(['disable', 'edge', r.ipv4]);
      expect(res.code, res.stderr).toBe(0);
    }
    const withdrawMs = await lab.waitForNexthops(VIP_EDGE, [lb(1).ipv4], ROUTE_TIMEOUT_MS);
    const edge = await d1.service('edge');
    expect(edge.announced).toBe(false);
    expect(metricSum(await d1.metrics(), 'dsrlb_vip_announced', 'service="edge"')).toBe(0);
    // The other VIP, and the other LB, are untouched; the VIP still works through lb2.
    expect(await lab.nexthops(VIP_WEB)).toEqual(allLbs());
    const through2 = await httpCount(lab, VIP_EDGE, 40);
    expect(through2).toMatchObject({ ok: 40, failed: 0 });

    for (const r of lab.reals) expect((await d1.cli(['enable', 'edge', r.ipv4])).code).toBe(0);
    const announceMs = await lab.waitForNexthops(VIP_EDGE, allLbs(), ROUTE_TIMEOUT_MS);

    // The same from the config file: every real `state: disabled`.
    await reload(lb(0), { edgeRealState: 'disabled' });
    const byConfigMs = await lab.waitForNexthops(VIP_EDGE, [lb(1).ipv4], ROUTE_TIMEOUT_MS);
    await reload(lb(0), {});
    await lab.waitForNexthops(VIP_EDGE, allLbs(), ROUTE_TIMEOUT_MS);
    figures.noEligibleReal = { withdrawnAfterLastDisableMs: withdrawMs, announcedAfterEnableMs: announceMs, withdrawnAfterReloadMs: byConfigMs };
  });

  it('dsrlb withdraw / announce SERVICE moves the VIP off one LB and back', async () => {
    const d2 = daemon(lb(1));
    const w = await d2.cli(['withdraw', 'web']);
    expect(w.code, w.stderr).toBe(0);
    await lab.waitForNexthops(VIP_WEB, [lb(0).ipv4], ROUTE_TIMEOUT_MS);
    expect((await d2.service('web')).announced).toBe(false);
    expect((await d2.cli(['status', 'web'])).stdout).toMatch(/ web +WITHDRAWN\(operator\)/);
    const again = await d2.cli(['withdraw', 'web']);
    expect([again.code, again.stdout.trim()]).toEqual([0, 'web: withdrawn already (no change)']);
    expect(await lab.nexthops(VIP_EDGE)).toEqual(allLbs());
    const a = await d2.cli(['announce', 'web']);
    expect(a.code, a.stderr).toBe(0);
    await lab.waitForNexthops(VIP_WEB, allLbs(), ROUTE_TIMEOUT_MS);
  });

  it("an LB whose probes alone failed takes the VIP back only once its reals are back in its view: 30 keep-alive connections keep their reals while they come back one by one", async () => {
    const l1 = lb(0);
    const d1 = daemon(l1);
    await reload(l1, { edgeHealthCheck: true });
    await d1.waitFor('edge checked and announced', (s) => {
      const edge = s.services.find((x) => x.name === 'edge')!;
      return edge.announced && edge.reals.every((r) => r.health.state === 'up');
    });
    // The probes from lb1 to every real dropped by a firewall on lb1 (its forwarding, AF_PACKET, passes).
    const nft = (cmd: string) => lab.exec(l1.ns, ['nft', cmd]);
    const reals = lab.reals.map((r) => r.ipv4);
    const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, VIP_EDGE, 30, 10_000);
    try {
      expect(opened).toBe(30);
      const first = await client.round();
      expect(allAnswered(first)).toBe(true);
      expect((await nft(`add table inet dsrt_probes; add set inet dsrt_probes reals { type ipv4_addr; }; add chain inet dsrt_probes out { type filter hook output priority 0; }; add rule inet dsrt_probes out ip daddr @reals tcp dport 80 drop; add element inet dsrt_probes reals { ${reals.join(', ')} }`)).code).toBe(0);
      await lab.waitForNexthops(VIP_EDGE, [lb(1).ipv4], ROUTE_TIMEOUT_MS);
      const withdrawn = await client.round();
      expect(changed(first, withdrawn)).toEqual([]);
      // Requests on every connection all along the return. The reals come back one by one (the
      // last after the others were seen up; it rises within 2.3 s, in the 3.5 s wait): lb1 must not
      // take the VIP back with a table of the first ones, or the connections ECMP moves to it for
      // the last are placed elsewhere and reset.
      let returning = true;
      const duringReturn: KeepAliveRound[] = [];
      const pump = (async () => {
        while (returning) duringReturn.push(await client.round());
      })();
      const [last, ...others] = reals;
      let backMs: number;
      try {
        const unblockedAt = Date.now();
        expect((await nft(`delete element inet dsrt_probes reals { ${others.join(', ')} }`)).code).toBe(0);
        await d1.waitFor('a real of edge up again', (s) => s.services.find((x) => x.name === 'edge')!.reals.some((r) => r.health.state === 'up'));
        await new Promise((r) => setTimeout(r, 300));
        expect((await nft(`delete element inet dsrt_probes reals { ${last} }`)).code).toBe(0);
        await lab.waitForNexthops(VIP_EDGE, allLbs(), ROUTE_TIMEOUT_MS);
        backMs = Date.now() - unblockedAt;
        await new Promise((r) => setTimeout(r, 1500));
      } finally {
        returning = false;
        await pump;
      }
      expect(duringReturn.length).toBeGreaterThan(1);
      for (const r of duringReturn) expect(changed(first, r)).toEqual([]);
      expect((await d1.cli(['status', 'edge'])).stdout).not.toContain('NOT_ANNOUNCED');
      expect(d1.logs.join('\n')).toContain('VIP not announced yet: waiting for its reals to come up in this view');
      figures.probesBlockedOnOneLb = { connections: 30, rounds: duringReturn.length, routeBackAfterFirstUnblockMs: backMs };
    } finally {
      await client.close();
      await nft('delete table inet dsrt_probes');
      await reload(l1, {});
    }
  });

  it('SIGTERM withdraws the routes before dsrlb exits: a client opening connections all along loses none', async () => {
    const l1 = lb(0);
    const d1 = daemon(l1);
    const counters = ['TcpExtTCPSynRetrans', 'TcpRetransSegs'];
    // Retransmitted SYNs (black-holed attempts), and whatever still reaches lb1.
    const syns = await watchSyns();
    const atLb1 = await startCapture(lab, l1.ns, 'eth0', ['-Q', 'in', 'tcp', 'and', 'dst', 'host', VIP_WEB]);
    const before = await tcpCounters(lab, lab.client.ns, counters);
    const lb2DropsBefore = await drops(lb(1));
    // New connections, batch after batch, until 500 ms after dsrlb exited (a fixed count could
    // end before a slower stop did: the stop now hands its flows over first).
    let exitedAtMs = Number.POSITIVE_INFINITY;
    let clientDoneAtMs = 0;
    const load = (async () => {
      const total = { ok: 0, failed: 0 };
      while (Date.now() < exitedAtMs + 500) {
        const r = await httpCount(lab, VIP_WEB, 300, { concurrency: 10 });
        total.ok += r.ok;
        total.failed += r.failed;
      }
      clientDoneAtMs = Date.now();
      return total;
    })();
    await sleep(700);
    // An unrelated link changes state on the host just before: the kernel's link watch then holds
    // carrier news back for up to a second, which a withdrawal by carrier waited for (the route
    // outlived withdrawDelay and SYNs reached a stopped loop). Up and down are told at once.
    await lab.exec(lab.router.ns, ['ip', 'link', 'add', 'dsrt-x0', 'type', 'veth', 'peer', 'name', 'dsrt-x1']);
    await lab.exec(lab.router.ns, ['ip', 'link', 'set', 'dsrt-x1', 'up']);
    await lab.exec(lab.router.ns, ['ip', 'link', 'set', 'dsrt-x0', 'up']);
    await lab.exec(lab.router.ns, ['ip', 'link', 'set', 'dsrt-x0', 'down']);
    await sleep(100);
    const signalAtMs = Date.now();
    const exited = d1.stop('SIGTERM');
    const routeMs = await lab.waitForNexthops(VIP_WEB, [lb(1).ipv4], ROUTE_TIMEOUT_MS, { sinceMs: signalAtMs });
    const exitCode = await exited;
    exitedAtMs = d1.exitedAtMs!;
    daemons.delete(l1.name);
    const result = await load;
    const after = await tcpCounters(lab, lab.client.ns, counters);
    const lb2Drops = dropsSince(lb2DropsBefore, await drops(lb(1)));
    const lb1Frames = (await atLb1.stop()).map(parseSegment).filter((x) => x !== null);
    const retransmitted = await syns.stop(signalAtMs);
    const exitMs = d1.exitedAtMs! - signalAtMs;
    const lastAtLb1Ms = Math.max(...lb1Frames.map((f) => f.atMs)) - signalAtMs;

    expect(exitCode).toBe(0);
    expect(routeMs).toBeLessThan(exitMs);
    // Traffic was still flowing when dsrlb had gone.
    expect(clientDoneAtMs).toBeGreaterThan(d1.exitedAtMs!);
    expect(result.failed).toBe(0);
    expect(result.ok).toBeGreaterThanOrEqual(600);
    // Nothing reached lb1 once the router had dropped it (routeMs is when the poll saw it: later).
    expect(lastAtLb1Ms).toBeLessThanOrEqual(routeMs);
    // No attempt was black-holed: a SYN sent into a dead path would have been retransmitted.
    // No attempt was black-holed by the stop: none sent after SIGTERM had to be retransmitted
    // because it went to lb1 or to no LB (lb2 drops are counted apart, with their reasons).
    const blackHoled = retransmitted.filter((x) => x.firstMs >= 0 && x.lbs.lb2!.inMs === null).map(describeSyn);
    expect({ blackHoled, lb2Drops }).toEqual({ blackHoled: [], lb2Drops: {} });
    const synRetransmits = after.TcpExtTCPSynRetrans! - before.TcpExtTCPSynRetrans!;
    figures.cleanStop = {
      routeWithoutLb1AfterSigtermMs: routeMs,
      lastFrameAtLb1AfterSigtermMs: lastAtLb1Ms,
      dsrlbExitAfterSigtermMs: exitMs,
      connections: result.ok + result.failed,
      failed: result.failed,
      synRetransmits,
      synsLostNotByTheStop: retransmitted.filter((x) => x.firstMs < 0 || x.lbs.lb2!.inMs !== null).map(describeSyn),
      retransmittedSegments: after.TcpRetransSegs! - before.TcpRetransSegs!,
    };
  });

  it('an LB that starts again takes its share of new connections without dropping an attempt', async () => {
    const l1 = lb(0);
    expect(await lab.nexthops(VIP_WEB)).toEqual([lb(1).ipv4]);
    const syns = await watchSyns();
    // New connections, batch after batch, from before dsrlb starts until 2 s after it joined.
    let joinedAtMs = Number.POSITIVE_INFINITY;
    const load = (async () => {
      const total = { ok: 0, failed: 0 };
      while (Date.now() < joinedAtMs + 2000) {
        const r = await httpCount(lab, VIP_WEB, 300, { concurrency: 10 });
        total.ok += r.ok;
        total.failed += r.failed;
      }
      return total;
    })();
    await sleep(500);
    const startAtMs = Date.now();
    await startDaemon(l1);
    const joinMs = await lab.waitForNexthops(VIP_WEB, allLbs(), ROUTE_TIMEOUT_MS, { sinceMs: startAtMs });
    joinedAtMs = startAtMs + joinMs;
    const result = await load;
    const retransmitted = await syns.stop(startAtMs);
    await lab.waitForNexthops(VIP_EDGE, allLbs(), ROUTE_TIMEOUT_MS);
    const flowsOnLb1 = await flowsCreated(l1, 'web');
    const neighborUnknownDrops = metricSum(await daemon(l1).metrics(), 'dsrlb_dropped_packets_total', 'reason="neighbor_unknown"');
    // SYNs the joining LB received and did not forward: it was announced before it could forward
    // (packet loop not running, reals' MACs not resolved yet).
    const lostAtJoiningLb = retransmitted.filter((x) => x.lbs.lb1!.inMs !== null && x.lbs.lb1!.outMs === null).map(describeSyn);
    figures.join = {
      routeWithLb1AfterStartMs: joinMs,
      connections: result.ok + result.failed,
      viaStartedLb: flowsOnLb1,
      failed: result.failed,
      synsLostAtJoiningLb: lostAtJoiningLb.length,
      synsLostElsewhere: retransmitted.filter((x) => x.lbs.lb1!.inMs === null).map(describeSyn),
      neighborUnknownDropsOnJoiningLb: neighborUnknownDrops,
    };

    expect(flowsOnLb1).toBeGreaterThan(50);
    expect(result.failed).toBe(0);
    expect({ lostAtJoiningLb, neighborUnknownDrops }).toEqual({ lostAtJoiningLb: [], neighborUnknownDrops: 0 });
  });

  it('SIGKILL of dsrlb alone: its TUN gates vanish with the process and BIRD withdraws its routes (dead man\'s switch)', async () => {
    const l1 = lb(0);
    const d1 = daemon(l1);
    const devices = (await d1.status()).services.map((s) => s.announceDevice!);
    const killedAtMs = Date.now();
    const killed = d1.stop('SIGKILL');
    daemons.delete(l1.name);
    const webMs = await lab.waitForNexthops(VIP_WEB, [lb(1).ipv4], ROUTE_TIMEOUT_MS, { sinceMs: killedAtMs });
    const edgeMs = await lab.waitForNexthops(VIP_EDGE, [lb(1).ipv4], ROUTE_TIMEOUT_MS, { sinceMs: killedAtMs });
    await killed;
    // BIRD itself stayed up with its session: only the gates went.
    expect(lab.lbBirds.get(l1.name)!.running).toBe(true);
    expect(await lab.routerSessionState(l1)).toBe('Established');
    for (const dev of devices) expect((await lab.exec(l1.ns, ['ip', 'link', 'show', 'dev', dev])).code).not.toBe(0);
    expect(Math.max(webMs, edgeMs)).toBeLessThanOrEqual(1000);
    figures.sigkillDsrlbOnly = { routeWithoutLb1Ms: Math.max(webMs, edgeMs) };
    await startDaemon(l1);
    for (const vip of lab.vips) await lab.waitForNexthops(vip, allLbs(), ROUTE_TIMEOUT_MS);
  });

  it('30 keep-alive connections survive SIGKILL of one LB (dsrlb and its BIRD) and its return, each answered by the same real', async () => {
    const l1 = lb(0);
    const before = await flowsCreated(l1, 'web');
    const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, VIP_WEB, 30, 10_000);
    try {
      expect(opened).toBe(30);
      const first = await client.round();
      expect(allAnswered(first)).toBe(true);
      const viaLb1 = (await flowsCreated(l1, 'web')) - before;
      // Without connections on lb1 the kill would prove nothing.
      expect(viaLb1).toBeGreaterThanOrEqual(3);
      const device = (await daemon(l1).service('web')).announceDevice!;

      const killedAtMs = Date.now();
      const d1 = daemon(l1);
      const killed = Promise.all([d1.stop('SIGKILL'), lab.lbBirds.get(l1.name)!.stop('SIGKILL')]);
      daemons.delete(l1.name);
      // A request on every connection at once: those on lb1 are lost until the route moves.
      const [convergenceMs, duringFailover] = await Promise.all([
        lab.waitForNexthops(VIP_WEB, [lb(1).ipv4], ROUTE_TIMEOUT_MS, { sinceMs: killedAtMs }),
        client.round(),
      ]);
      await killed;
      expect(changed(first, duringFailover)).toEqual([]);
      expect(convergenceMs).toBeLessThanOrEqual(BFD_DETECTION_MS + 1000);
      // The dead man's switch: the kernel deleted the TUN device with the process.
      expect((await lab.exec(l1.ns, ['ip', 'link', 'show', 'dev', device])).code).not.toBe(0);
      const afterFailover = await client.round();
      expect(changed(first, afterFailover)).toEqual([]);

      // lb1 comes back (after a crash: dsrlb adopts what the killed run left), now with a health
      // check, so its reals start down and come up one by one; the router rehashes, so connections
      // move between the LBs again, and keep their real. Requests run on every connection all along
      // the return: an LB that announced before its view settled (the table of the first real up)
      // would send the moved ones elsewhere, and they would be reset.
      await lab.startLbBird(l1, true);
      let returning = true;
      const duringReturn: KeepAliveRound[] = [];
      const pump = (async () => {
        while (returning) duringReturn.push(await client.round());
      })();
      let returnMs: number;
      try {
        await startDaemon(l1, { webHealthCheck: true });
        returnMs = await lab.waitForNexthops(VIP_WEB, allLbs(), ROUTE_TIMEOUT_MS);
        await new Promise((r) => setTimeout(r, 1000));
      } finally {
        returning = false;
        await pump;
      }
      expect(duringReturn.length).toBeGreaterThan(1);
      for (const r of duringReturn) expect(changed(first, r)).toEqual([]);
      const afterReturn = await client.round();
      expect(changed(first, afterReturn)).toEqual([]);
      figures.sigkill = {
        connectionsOnKilledLb: viaLb1,
        routeConvergenceMs: convergenceMs,
        roundDuringFailoverMs: duringFailover.durationMs,
        connectionsLostOrMoved: changed(first, duringFailover).length + changed(first, afterFailover).length + changed(first, afterReturn).length,
        routeBackAfterRestartMs: returnMs,
      };
    } finally {
      await client.close();
    }
  });

  /** Silences lb1 as a dead host; returns the router's detection time and what 30 connections saw. */
  async function deadHost(bfd: boolean): Promise<{ convergenceMs: number; roundDuringFailoverMs: number; lost: number }> {
    const l1 = lb(0);
    const before = await flowsCreated(l1, 'web');
    const { client, opened } = await KeepAliveClient.open(lab, lab.client.ns, VIP_WEB, 30, 15_000);
    try {
      expect(opened).toBe(30);
      const first = await client.round();
      expect(allAnswered(first)).toBe(true);
      expect((await flowsCreated(l1, 'web')) - before).toBeGreaterThanOrEqual(3);
      const silentAtMs = Date.now();
      await lab.setLbSilent(l1, true);
      let convergenceMs: number;
      let during: KeepAliveRound & { durationMs: number };
      try {
        [convergenceMs, during] = await Promise.all([lab.waitForNexthops(VIP_WEB, [lb(1).ipv4], ROUTE_TIMEOUT_MS, { sinceMs: silentAtMs }), client.round()]);
      } finally {
        await lab.setLbSilent(l1, false);
      }
      const lost = changed(first, during);
      for (const vip of lab.vips) await lab.waitForNexthops(vip, allLbs(), ROUTE_TIMEOUT_MS);
      const afterReturn = await client.round();
      return { convergenceMs, roundDuringFailoverMs: during.durationMs, lost: lost.length + changed(first, afterReturn).length };
    } finally {
      await client.close();
    }
  }

  it('a dead LB host is detected by BFD within its detection time + 1 s, by the hold time without BFD, and no connection is lost', async () => {
    const withBfd = await deadHost(true);
    expect(withBfd.lost).toBe(0);
    expect(withBfd.convergenceMs).toBeLessThanOrEqual(BFD_DETECTION_MS + 1000);

    // Same sessions without BFD: only the 3 s hold timer (keepalives every 1 s) notices.
    await lab.routerBird!.reconfigure(lab.routerBirdConfig(false));
    for (const l of lab.lbs) await lab.lbBirds.get(l.name)!.reconfigure(lab.lbBirdConfig(l, false));
    await sleep(500);
    for (const vip of lab.vips) await lab.waitForNexthops(vip, allLbs(), ROUTE_TIMEOUT_MS);
    for (const l of lab.lbs) expect(await lab.routerSessionState(l)).toBe('Established');
    expect((await lab.routerBird!.birdc(['show', 'bfd', 'sessions'])).stdout).not.toMatch(/\bUp\b/);
    const holdOnly = await deadHost(false);
    expect(holdOnly.lost).toBe(0);
    expect(holdOnly.convergenceMs).toBeGreaterThan(withBfd.convergenceMs);
    expect(holdOnly.convergenceMs).toBeLessThanOrEqual(HOLD_TIME_MS + 1000);
    figures.deadHost = { withBfd, holdTimeOnly: holdOnly };

    await lab.routerBird!.reconfigure(lab.routerBirdConfig(true));
    for (const l of lab.lbs) await lab.lbBirds.get(l.name)!.reconfigure(lab.lbBirdConfig(l, true));
  }, 120_000);


  it('a restarting LB never announces a VIP it must not, not even for a moment (routes file of the previous run)', async () => {
    const l1 = lb(0);
    await daemon(l1).stop('SIGTERM');
    daemons.delete(l1.name);
    await lab.waitForNexthops(VIP_EDGE, [lb(1).ipv4], ROUTE_TIMEOUT_MS);
    // The routes file still names edge's gate: BIRD routes it as soon as such a device is up.
    const monitor = await lab.monitorRoutes();
    let records: string[] = [];
    try {
      await writeFile(configPath(l1), lbConfig(l1, { edgeRealState: 'disabled' }));
      const d1 = await LbDaemon.start(lab, l1, configPath(l1), (s) => s.services.some((x) => x.name === 'web' && x.announced));
      daemons.set(l1.name, d1);
      await lab.waitForNexthops(VIP_WEB, allLbs(), ROUTE_TIMEOUT_MS);
      await sleep(1000);
      expect((await d1.service('edge')).announced).toBe(false);
    } finally {
      records = await monitor.stop();
    }
    const edgeViaLb1 = records.filter((r) => r.includes(VIP_EDGE) && r.includes(`via ${l1.ipv4} `));
    expect(edgeViaLb1).toEqual([]);
    expect(await lab.nexthops(VIP_EDGE)).toEqual([lb(1).ipv4]);
    await reload(l1, {});
    await lab.waitForNexthops(VIP_EDGE, allLbs(), ROUTE_TIMEOUT_MS);
  });
});
