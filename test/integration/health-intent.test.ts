// Health checks, operator intent and drain in network namespaces, with real servers and clients:
// a dead real stops getting new connections within fall x interval + timeout + 1 s and comes
// back after rise x interval; a drained real finishes a long download byte for byte while new
// connections go elsewhere; failOpen vs drop when all are down; a 2 s blip with fall=3 is ignored;
// intent survives a restart.

import { createHash } from 'node:crypto';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLab, destroyLabsWithPrefix, type Lab, type LabHost } from '../../src/lab/netns-lab.js';
import { patternBytes } from '../../src/lab/real-http-server.js';
import { allUp, httpCount, labConfig, LabDaemon, metricValue, RealServers, requireRoot, sleep, SNAPSHOT_LAG_MS, type Status } from '../support/lab-daemon.js';

const PREFIX = `dsrt-hc-${process.pid}-`;
const INTERVAL_MS = 1000;
const TIMEOUT_MS = 500;
const RISE = 2;
const FALL = 2;
let lab: Lab;
let dir: string;
let daemon: LabDaemon;
let configPath: string;
const servers = new RealServers(() => lab);

function configText(opts: { whenAllDown?: string; fall?: number; probeService?: boolean; name?: string; reals?: string[]; top?: string[] } = {}): string {
  const text = labConfig(lab, {
    top: [`stateFile: ${dir}/dsrlb.state.json`, ...(opts.top ?? [])],
    service: [
      `    whenAllDown: ${opts.whenAllDown ?? 'failOpen'}`,
      '    healthCheck:',
      '      type: http',
      '      path: /healthz',
      `      interval: ${INTERVAL_MS}ms`,
      `      timeout: ${TIMEOUT_MS}ms`,
      `      rise: ${RISE}`,
      `      fall: ${opts.fall ?? FALL}`,
    ],
    reals: opts.reals ?? lab.reals.map((r) => r.ipv4),
    after: opts.probeService ? probeService() : [],
  });
  return opts.name === undefined ? text : text.replace('- name: web\n', `- name: ${opts.name}\n`);
}

/** 200 reals (addresses 10.77.1.1-200, all on r1) probed over HTTP every second. */
function probeService(): string[] {
  return [
    '  - name: many',
    '    vip: 10.77.0.101',
    '    port: 8081',
    '    protocol: tcp',
    '    healthCheck: { type: http, path: /, interval: 1s, timeout: 500ms, rise: 2, fall: 3 }',
    '    reals:',
    ...Array.from({ length: 200 }, (_, i) => `      - address: 10.77.1.${i + 1}`),
  ];
}

const realOf = (name: string): LabHost => lab.reals.find((r) => r.name === name)!;
const statusOf = (s: Status, name: string) => s.services[0]!.reals.find((r) => r.address === realOf(name).ipv4)!;

async function reload(text: string): Promise<void> {
  await writeFile(configPath, text);
  const r = await daemon.cli(['reload']);
  expect(r.stdout + r.stderr).toContain('reload taken');
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-hc-'));
  configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, configText());
  daemon = await LabDaemon.start(lab, configPath, allUp);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await servers.stopAll();
  await lab?.destroy();
}, 60_000);

describe('health checks and intent', () => {
  it('counts no moved hash slots for the first table (reals whose MACs arrive move no flow)', async () => {
    // The first snapshot has no MAC for any real (an empty table); filling it is not a move.
    const m = await daemon.metrics();
    expect(m).toContain('dsrlb_forwarded_packets_total{service="web"');
    expect(metricValue(m, 'dsrlb_table_moved_slots_total', 'service="web"')).toBe(0);
  });

  it('takes a dead real out within fall x interval + timeout + 1 s and back after rise x interval', async () => {
    await servers.stop('r1');
    await sleep(FALL * INTERVAL_MS + TIMEOUT_MS + 1000);
    const whileDown = await httpCount(lab, 60);
    expect(whileDown.ok).toBe(60);
    expect(whileDown.byReal.r1 ?? 0).toBe(0);
    const s = await daemon.status();
    expect(statusOf(s, 'r1').health.state).toBe('down');
    expect(statusOf(s, 'r1').health.lastError).toMatch(/refused/);

    await servers.start('r1');
    const upAfterMs = await daemon.waitFor('r1 up', (st) => statusOf(st, 'r1').health.state === 'up', 10_000);
    expect(upAfterMs).toBeLessThanOrEqual((RISE + 1) * INTERVAL_MS + TIMEOUT_MS);
    await sleep(SNAPSHOT_LAG_MS);
    const back = await httpCount(lab, 60);
    expect(back.ok).toBe(60);
    expect(back.byReal.r1 ?? 0).toBeGreaterThan(5);
    const m = await daemon.metrics();
    expect(metricValue(m, 'dsrlb_healthcheck_failures_total', `service="web",real="${realOf('r1').ipv4}",reason="refused"`)).toBeGreaterThanOrEqual(FALL);
    console.log(`r1 up again ${upAfterMs} ms after its server restarted`);
  }, 60_000);

  it('lets a 20 s download from a drained real finish byte for byte while new connections go elsewhere', async () => {
    const size = 2_000_000;
    const rate = 100_000; // bytes/s: 20 s
    const headers = join(dir, 'download.headers');
    const body = join(dir, 'download.body');
    const download = lab.exec(lab.client, ['curl', '-s', '-D', headers, '-o', body, '-w', '%{http_code} %{size_download}', `http://${lab.vip}/bytes/${size}?rate=${rate}`], { timeoutMs: 60_000 });
    await sleep(1500);
    const real = /x-real:\s*(\S+)/i.exec(await readFile(headers, 'utf8'))![1]!;
    const drain = await daemon.cli(['drain', 'web', realOf(real).ipv4]);
    expect(drain.code).toBe(0);
    expect(drain.stdout).toContain('drain');
    const during = await httpCount(lab, 60);
    expect(during.ok).toBe(60);
    expect(during.byReal[real] ?? 0).toBe(0);
    const s = await daemon.status();
    expect(statusOf(s, real).intent).toBe('drain');
    expect(statusOf(s, real).activeFlows).toBeGreaterThanOrEqual(1);
    expect(statusOf(s, real).drainFinished).toBe(false);

    const result = await download;
    expect(result.stdout).toBe(`200 ${size}`);
    const got = await readFile(body);
    expect(createHash('sha256').update(got).digest('hex')).toBe(createHash('sha256').update(patternBytes(size)).digest('hex'));
    await daemon.waitFor('drain finished', (st) => statusOf(st, real).drainFinished, 10_000);
    const m = await daemon.metrics();
    expect(metricValue(m, 'dsrlb_drain_finished', `service="web",real="${realOf(real).ipv4}"`)).toBe(1);

    // Intent set at run time survives a restart of the daemon.
    expect(await daemon.stop()).toBe(0);
    daemon = await LabDaemon.start(lab, configPath, allUp);
    expect(statusOf(await daemon.status(), real).intent).toBe('drain');
    expect((await daemon.cli(['undrain', 'web', realOf(real).ipv4])).code).toBe(0);
    expect(statusOf(await daemon.status(), real).intent).toBe('active');
  }, 120_000);

  it('ignores an outage that spans at most two probes, with fall=3 and interval 1 s (no amplification)', async () => {
    await reload(configText({ fall: 3 }));
    await daemon.waitFor('all up', allUp, 10_000);
    // The outage is an nftables reject on the real, on for 1.5 s: stopping and restarting the server
    // process would add its start-up time (hundreds of ms under load) to the outage. It was 2 s, but
    // with probes 1 s apart a 2 s outage plus the time to lift the rule can span three probes (one
    // at its start, one at its end) and rightly take the real down: CI saw that once.
    const r2 = realOf('r2');
    const blip = 'table inet dsrlb_blip { chain input { type filter hook input priority 0; tcp dport 80 reject with tcp reset; }; }';
    const on = await lab.exec(r2, ['nft', blip]);
    expect(on.code, on.stderr).toBe(0);
    const deadline = Date.now() + 1500;
    let sawDown = false;
    let refused = 0;
    const watch = (async () => {
      while (Date.now() < deadline + 3000) {
        const st = statusOf(await daemon.status(), 'r2');
        if (st.health.state !== 'up') sawDown = true;
        if (st.health.lastError !== null) refused++;
        await sleep(100);
      }
    })();
    await sleep(deadline - Date.now());
    await lab.exec(r2, ['nft', 'delete', 'table', 'inet', 'dsrlb_blip']);
    await watch;
    expect(refused).toBeGreaterThan(0); // the outage was seen by the probes
    expect(sawDown).toBe(false);
    await reload(configText());
  }, 60_000);

  it('with every real down: failOpen still sends to the wanted reals, drop refuses and counts', async () => {
    for (const r of lab.reals) await servers.stop(r.name);
    await daemon.waitFor('panic', (s) => s.services[0]!.panic, 10_000);
    // explain says why a new flow goes to a down real.
    const explainPanic = await daemon.cli(['explain', 'web', `${lab.client.ipv4}:41000`]);
    expect(explainPanic.code, explainPanic.stderr).toBe(0);
    expect(explainPanic.stdout).toMatch(/-> 10\.77\.0\.\d+ \(scheduler: maglev slot \d+; failOpen: no real is up, every wanted real takes new flows; 10\.77\.0\.\d+ is down\)/);
    const before = await daemon.metrics();
    const failOpen = await httpCount(lab, 20, { timeoutMs: 1000 });
    expect(failOpen.ok).toBe(0); // the reals' kernels refuse: the SYNs did reach them
    expect(failOpen.errors).toHaveProperty(['connect ECONNREFUSED ' + lab.vip + ':80']);
    const mid = await daemon.metrics();
    const forwarded = (t: string) => lab.reals.reduce((n, r) => n + metricValue(t, 'dsrlb_forwarded_packets_total', `service="web",real="${r.ipv4}"`), 0);
    expect(forwarded(mid) - forwarded(before)).toBeGreaterThanOrEqual(20);

    await reload(configText({ whenAllDown: 'drop' }));
    await daemon.waitFor('dropping', (s) => s.services[0]!.dropping && !s.services[0]!.panic, 5000);
    const explainDrop = await daemon.cli(['explain', 'web', `${lab.client.ipv4}:41000`]);
    expect(explainDrop.stdout.trim()).toMatch(/-> no real \(new flows dropped: 10\.77\.0\.11, 10\.77\.0\.12, 10\.77\.0\.13: down\)$/);
    const dropped = await httpCount(lab, 10, { timeoutMs: 1000 });
    expect(dropped.ok).toBe(0);
    const after = await daemon.metrics();
    expect(metricValue(after, 'dsrlb_dropped_packets_total', 'reason="no_real_available"') - metricValue(mid, 'dsrlb_dropped_packets_total', 'reason="no_real_available"')).toBeGreaterThanOrEqual(10);
    expect(forwarded(after)).toBe(forwarded(mid));

    for (const r of lab.reals) await servers.start(r.name);
    await reload(configText());
    await daemon.waitFor('all up', allUp, 10_000);
    expect((await httpCount(lab, 30)).ok).toBe(30);
  }, 90_000);

  it('starts a re-added real from zero and moves every series of a renamed service to its new name', async () => {
    const r3 = realOf('r3').ipv4;
    const top = ['flowTable: { tcpTimeouts: { syn: 1s, established: 2s, fin: 1s } }'];
    const renamed = (reals: string[]) => configText({ top, reals, name: 'web2' });
    const forwarded = (t: string, service: string) => metricValue(t, 'dsrlb_forwarded_packets_total', `service="${service}",real="${r3}"`);
    try {
      await reload(configText({ top }));
      expect((await httpCount(lab, 30)).ok).toBe(30);
      const before = await daemon.metrics();
      expect(forwarded(before, 'web')).toBeGreaterThan(0);

      // Renamed, and r3 removed: it drains under the new name, then is forgotten with its id.
      await reload(renamed(lab.reals.slice(0, 2).map((r) => r.ipv4)));
      await daemon.waitFor('r3 forgotten', (st) => !st.services[0]!.reals.some((x) => x.address === r3), 20_000);
      await sleep(2 * INTERVAL_MS); // probes of the two left land under the new name
      const after = await daemon.metrics();
      const seriesLines = after.split('\n').filter((l) => l.startsWith('dsrlb_'));
      expect(seriesLines.filter((l) => l.includes('service="web"'))).toEqual([]);
      expect(seriesLines.filter((l) => l.includes(`real="${r3}"`))).toEqual([]);
      expect(metricValue(after, 'dsrlb_healthcheck_duration_seconds_count', `service="web2",real="${realOf('r1').ipv4}"`)).toBeGreaterThan(0);

      // Back under the new name: a new real (it gets the freed id), its counters from zero.
      await reload(renamed(lab.reals.map((r) => r.ipv4)));
      await daemon.waitFor('r3 back and up', (st) => st.services[0]!.reals.some((x) => x.address === r3 && x.health.state === 'up'), 10_000);
      const readded = await daemon.metrics();
      expect(forwarded(readded, 'web2')).toBe(0);
      expect(metricValue(readded, 'dsrlb_flows_created_total', `service="web2",real="${r3}"`)).toBe(0);
      const st = (await daemon.status()) as unknown as { services: { reals: { address: string; packets: number; bytes: number }[] }[] };
      expect(st.services[0]!.reals.find((x) => x.address === r3)).toMatchObject({ packets: 0, bytes: 0 });
      console.log(`r3 forwarded ${forwarded(before, 'web')} packets before its removal; re-added: 0`);
    } finally {
      await reload(configText());
      await daemon.waitFor('all up', allUp, 10_000);
    }
  }, 90_000);

  it('probes 200 reals at 1 s intervals, each probe within its timeout, while the packet loop keeps forwarding', async () => {
    const r1 = realOf('r1');
    await lab.exec(r1, ['sh', '-c', 'for i in $(seq 1 200); do ip addr add 10.77.1.$i/32 dev eth0; done']);
    await lab.exec(lab.lb, ['ip', 'route', 'add', '10.77.1.0/24', 'dev', 'eth0']);
    const listener = lab.spawn(r1, [process.execPath, '-e', "require('http').createServer((q, s) => s.end('ok')).listen(8081, '0.0.0.0', () => console.log('ready'))"], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => listener.stdout!.once('data', () => resolve()));
    try {
      await reload(configText({ probeService: true }));
      const many = (st: Status) => st.services.find((x) => x.name === 'many')!;
      const upMs = await daemon.waitFor('200 probed reals up', (st) => many(st).reals.every((x) => x.health.state === 'up'), 20_000);
      // Forwarding goes on while 200 probes a second run in the control plane.
      const traffic = await httpCount(lab, 200);
      expect(traffic.ok).toBe(200);
      await sleep(3000);
      const m = await daemon.metrics();
      const total = m.split('\n').filter((l) => l.startsWith('dsrlb_healthcheck_duration_seconds_count{service="many"')).reduce((n, l) => n + Number(l.split(' ').pop()), 0);
      const withinTimeout = m.split('\n').filter((l) => l.startsWith('dsrlb_healthcheck_duration_seconds_bucket{le="0.5",service="many"')).reduce((n, l) => n + Number(l.split(' ').pop()), 0);
      const failures = m.split('\n').filter((l) => l.startsWith('dsrlb_healthcheck_failures_total{service="many"')).reduce((n, l) => n + Number(l.split(' ').pop()), 0);
      expect(total).toBeGreaterThanOrEqual(200 * 4);
      expect(withinTimeout).toBe(total);
      expect(failures).toBe(0);
      expect(many(await daemon.status()).reals.every((x) => x.health.state === 'up')).toBe(true);
      console.log(`200 reals up after ${upMs} ms; ${total} probes, all within the 500 ms timeout; 200 requests forwarded meanwhile`);
    } finally {
      await reload(configText());
      listener.kill('SIGTERM');
    }
  }, 90_000);
});
