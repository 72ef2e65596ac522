// SCRATCH: topology check before the daemon's announce code exists.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { metricSum, captureVipSourced, httpCount, KeepAliveClient, LbDaemon, ROOT, ScaleOutLab, sleep } from '../support/scale-out-lab.js';

const PREFIX = `dsrt-so-${process.pid}-`;
const VIP = '10.79.0.100';
let lab: ScaleOutLab;
const holders: import('node:child_process').ChildProcess[] = [];

beforeAll(async () => {
  lab = await ScaleOutLab.create({ prefix: PREFIX, vips: [VIP] });
  await lab.startHttpServers();
  await lab.startRouterBird(true);
  for (const lb of lab.lbs) {
    const cfg = ['interface: eth0', 'services:', '  - name: web', `    vip: ${VIP}`, '    port: 80', '    protocol: tcp', '    reals:', ...lab.reals.map((r) => `      - address: ${r.ipv4}`), ''].join('\n');
    await writeFile(join(lb.dir, 'dsrlb.yaml'), cfg);
    ((globalThis as any).daemons ??= []).push(await LbDaemon.start(lab, lb, join(lb.dir, 'dsrlb.yaml'), (s) => s.services.every((x) => x.reals.every((r) => r.mac !== null))));
    const h = lab.spawn(lb.ns, ['python3', '/tmp/proto/tunhold.py', 'dsvtest01'], { stdio: ['ignore', 'pipe', 'inherit'] });
    holders.push(h);
    await sleep(500);
    await lab.exec(lb.ns, ['ip', 'link', 'set', 'dsvtest01', 'up']);
    await writeFile(lb.routesFile, `protocol static dsrlb_v4 { ipv4; check link on; route ${VIP}/32 via "dsvtest01"; }\nprotocol static dsrlb_v6 { ipv6; check link on; }\n`);
    await lab.startLbBird(lb, true);
  }
  const t = await lab.waitForNexthops(VIP, lab.lbs.map((l) => l.ipv4), 20_000);
  console.log('routes up after', t);
}, 120_000);

afterAll(async () => {
  await lab?.destroy();
}, 60_000);

it('spreads', async () => {
  const caps = await Promise.all(lab.lbs.map((lb) => captureVipSourced(lab, lb, VIP)));
  const t0 = Date.now();
  const daemons = (globalThis as any).daemons as LbDaemon[];
  const before = await Promise.all(daemons.map(async (d) => metricSum(await d.metrics(), 'dsrlb_flows_created_total')));
  const r = await httpCount(lab, VIP, 200);
  const after = await Promise.all(daemons.map(async (d) => metricSum(await d.metrics(), 'dsrlb_flows_created_total')));
  console.log('per LB', after.map((a, i) => a - before[i]!));
  console.log('200 in', Date.now() - t0, JSON.stringify(r));
  console.log('frames', await Promise.all(caps.map((c) => c.stop())));
  const ka = await KeepAliveClient.open(lab, VIP, 30, 10_000);
  console.log(ka.opened);
  const kb = await Promise.all(daemons.map(async (d) => metricSum(await d.metrics(), 'dsrlb_flows_created_total')));
  const r1 = await ka.client.round();
  console.log('ka per LB', kb.map((a, i) => a - after[i]!));
  await lab.setLbSilent(lab.lbs[0]!, true);
  const t1 = Date.now();
  const [conv, r2] = await Promise.all([lab.waitForNexthops(VIP, [lab.lbs[1]!.ipv4], 10_000, { sinceMs: t1 }), ka.client.round()]);
  console.log('conv', conv, 'r2', r2.durationMs, r2.answers.filter((a, i) => 'error' in a || (a as any).real !== (r1.answers[i] as any).real).length);
  await ka.client.close();
  expect(r.ok).toBe(200);
}, 120_000);
