// Operating dsrlb against a running daemon in namespaces: the admin API's token rule, every
// mutation verb through the CLI, status/explain, reloads that are refused (nothing changes) or that
// remove a real (it drains: a live transfer completes), and the metrics as Prometheus sees them.

import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dsrlbArgv } from '../../src/cli/command-argv.js';
import { createLab, deleteNamespace, destroyLabsWithPrefix, type Lab } from '../../src/lab/netns-lab.js';
import { patternBytes } from '../../src/lab/real-http-server.js';
import { httpCount, labConfig, LabDaemon, metricValue, requireRoot, ROOT, sleep } from '../support/lab-daemon.js';

const run = promisify(execFile);
const PREFIX = `dsrt-op-${process.pid}-`;
let lab: Lab;
let dir: string;
let configPath: string;
let daemon: LabDaemon;

function configText(reals: readonly string[], extra: string[] = []): string {
  return labConfig(lab, { reals, top: [`stateFile: ${dir}/dsrlb.state.json`, ...extra] });
}

const addresses = () => lab.reals.map((r) => r.ipv4);

/**
 * A namespace of its own (a second daemon beside the running one would share its host state):
 * eth0 (192.0.2.1/24) on a veth, deleted afterwards whatever happens.
 */
async function inBareNamespace(suffix: string, fn: (ns: string, inNs: (...argv: string[]) => Promise<{ stdout: string }>) => Promise<void>): Promise<void> {
  const ns = `${PREFIX}${suffix}`;
  await run('ip', ['netns', 'add', ns]);
  try {
    await run('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
    for (const dev of ['lo', 'eth0', 'eth1']) await run('ip', ['-n', ns, 'link', 'set', dev, 'up']);
    await run('ip', ['-n', ns, 'addr', 'add', '192.0.2.1/24', 'dev', 'eth0']);
    await fn(ns, (...argv) => run('ip', ['netns', 'exec', ns, ...argv]));
  } finally {
    await deleteNamespace(ns);
  }
}

beforeAll(async () => {
  requireRoot();
  await destroyLabsWithPrefix(PREFIX);
  lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  dir = await mkdtemp(join(tmpdir(), 'dsrlb-op-'));
  configPath = join(dir, 'dsrlb.yaml');
  await writeFile(configPath, configText(addresses()));
  daemon = await LabDaemon.start(lab, configPath);
}, 120_000);

afterAll(async () => {
  if (daemon) expect(await daemon.stop()).toBe(0);
  await lab?.destroy();
}, 60_000);

describe('admin API and CLI', () => {
  it('runs every intent verb, status and explain through the CLI against the running daemon', async () => {
    const real = lab.reals[0]!.ipv4;
    for (const [verb, intent] of [
      ['drain', 'drain'],
      ['undrain', 'active'],
      ['disable', 'disabled'],
      ['enable', 'active'],
    ] as const) {
      const r = await daemon.cli([verb, 'web', real]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toContain(intent);
      const s = await daemon.status();
      expect(s.services[0]!.reals.find((x) => x.address === real)!.intent).toBe(intent);
    }
    // undrain lifts only a drain and enable only a disable: neither ends the other's maintenance,
    // and neither fails (a deploy script's drain, work, undrain under set -e).
    const intentNow = async () => (await daemon.status()).services[0]!.reals.find((x) => x.address === real)!.intent;
    for (const [set, wrong, message] of [
      ['disable', 'undrain', /disabled, weight \d+ \(undrain lifts only a drain: left disabled; enable lifts it\)/],
      ['drain', 'enable', /drain, weight \d+ \(enable lifts only a disable: left draining; undrain lifts it\)/],
    ] as const) {
      expect((await daemon.cli([set, 'web', real])).code).toBe(0);
      const left = await daemon.cli([wrong, 'web', real]);
      expect(left.code, left.stderr).toBe(0);
      expect(left.stdout).toMatch(message);
      expect(await intentNow()).toBe(set === 'disable' ? 'disabled' : 'drain');
      expect((await daemon.cli([set === 'disable' ? 'enable' : 'undrain', 'web', real])).code).toBe(0);
    }
    const again = await daemon.cli(['undrain', 'web', real]); // already active: nothing to do
    expect(again.code, again.stderr).toBe(0);
    expect(await intentNow()).toBe('active');
    const w = await daemon.cli(['weight', `tcp://${lab.vip}:80`, real, '250']);
    expect(w.code, w.stderr).toBe(0);
    expect((await daemon.status()).services[0]!.reals.find((x) => x.address === real)!.weight).toBe(250);
    expect((await daemon.cli(['weight', 'web', real, '100'])).code).toBe(0);

    const table = await daemon.cli(['status']);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(/TCP\s+10\.77\.0\.100:80\s+maglev\s+l2/);
    for (const r of lab.reals) expect(table.stdout).toContain(`-> ${r.ipv4}:80`);
    const json = JSON.parse((await daemon.cli(['status', '--json'])).stdout);
    expect(json.services[0].reals).toHaveLength(3);
    // One service, as ipvsadm -Ln -t VIP:PORT; an unknown one is a user error.
    const one = await daemon.cli(['status', `${lab.vip}:80`]);
    expect([one.code, one.stdout.match(/^(TCP|UDP) /gm)?.length]).toEqual([0, 1]);
    expect(one.stdout).toMatch(/TCP\s+10\.77\.0\.100:80\s+maglev\s+l2/);
    const none = await daemon.cli(['status', 'nosuch']);
    expect([none.code, none.stderr.trim()]).toEqual([1, 'dsrlb: unknown service "nosuch": name it (web) or give its address, VIP:PORT or tcp://VIP:PORT']);

    const explain = await daemon.cli(['explain', 'web', `${lab.client.ipv4}:40000`]);
    expect(explain.code).toBe(0);
    expect(explain.stdout).toMatch(/-> 10\.77\.0\.1[123] \(scheduler: maglev slot \d+\)/);

    // One-line errors and the contract's exit codes.
    const unknown = await daemon.cli(['drain', 'nosuch', real]);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr.trim().split('\n')).toHaveLength(1);
    const down = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'status', '--admin', 'http://127.0.0.1:9']);
    expect(down.code).toBe(2);
    expect(down.stderr).toMatch(/cannot reach the daemon/);
  }, 60_000);

  it('refuses to start with the admin API off loopback and no token file; answers 401 without the token', async () => {
    const lbAddress = lab.lb.ipv4;
    const noToken = join(dir, 'no-token.yaml');
    await writeFile(noToken, configText(addresses()).replace('admin: { listen: 127.0.0.1:9743 }', `admin: { listen: ${lbAddress}:9753 }`).replace('127.0.0.1:9742', '127.0.0.1:9752'));
    const refused = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'run', '-c', noToken], { timeoutMs: 20_000 });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/admin\.tokenFile/);

    // A second daemon would fight over the VIP: check the token rule on a config the running one validates.
    const tokenFile = join(dir, 'admin.token');
    await writeFile(tokenFile, 's3cret-token\n');
    await writeFile(configPath, configText(addresses()).replace('admin: { listen: 127.0.0.1:9743 }', `admin: { listen: ${lbAddress}:9743, tokenFile: ${tokenFile} }`));
    expect(await daemon.stop()).toBe(0);
    daemon = await LabDaemon.startWith(lab, configPath, `http://${lbAddress}:9743`, tokenFile);
    const anon = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', `http://${lbAddress}:9743/status`]);
    expect(anon.stdout).toBe('401');
    const bad = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '-H', 'Authorization: Bearer wrong', `http://${lbAddress}:9743/status`]);
    expect(bad.stdout).toBe('401');
    const good = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '-H', 'Authorization: Bearer s3cret-token', `http://${lbAddress}:9743/status`]);
    expect(good.stdout).toBe('200');
    // The token file is re-read on reload: a rotated token is taken at once, the old one no more.
    const oldTokenFile = join(dir, 'admin.token.old');
    await writeFile(oldTokenFile, 's3cret-token\n');
    await writeFile(tokenFile, 'rotated-token\n');
    const rotated = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'reload', '--admin', `http://${lbAddress}:9743`, '--token-file', oldTokenFile]);
    expect(rotated.code, rotated.stderr).toBe(0);
    const old = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '-H', 'Authorization: Bearer s3cret-token', `http://${lbAddress}:9743/status`]);
    expect(old.stdout).toBe('401');
    // The scheme is case-insensitive (RFC 7235).
    const lower = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '-H', 'Authorization: bearer rotated-token', `http://${lbAddress}:9743/status`]);
    expect(lower.stdout).toBe('200');
    // Rotated again, and the reload sent with the new token (no SIGHUP first): the daemon reads the
    // file again for a token it does not hold.
    await writeFile(tokenFile, 'third-token\n');
    const withNew = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'reload', '--admin', `http://${lbAddress}:9743`, '--token-file', tokenFile]);
    expect(withNew.code, withNew.stderr).toBe(0);
    const cli = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'drain', 'web', lab.reals[1]!.ipv4, '--admin', `http://${lbAddress}:9743`, '--token-file', tokenFile]);
    expect(cli.code, cli.stderr).toBe(0);
    const noTok = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'undrain', 'web', lab.reals[1]!.ipv4, '--admin', `http://${lbAddress}:9743`]);
    expect(noTok.code).toBe(2);
    expect(noTok.stderr).toMatch(/refused/);
    expect((await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'undrain', 'web', lab.reals[1]!.ipv4, '--admin', `http://${lbAddress}:9743`, '--token-file', tokenFile])).code).toBe(0);
    // Mutations are logged with what changed.
    expect(daemon.logs.some((l) => l.includes('"intent changed"') && l.includes(lab.reals[1]!.ipv4))).toBe(true);

    expect(await daemon.stop()).toBe(0);
    await writeFile(configPath, configText(addresses()));
    daemon = await LabDaemon.start(lab, configPath);
  }, 90_000);
});

/** HTTP status (and body) of a curl to the admin API from inside the LB namespace. */
async function adminCurl(args: readonly string[]): Promise<{ status: number; body: string; headers: string }> {
  const r = await lab.exec(lab.lb, ['curl', '-s', '-D', '-', '-o', '-', ...args]);
  const [head, ...rest] = r.stdout.split('\r\n\r\n');
  return { status: Number(/^HTTP\/1\.1 (\d+)/.exec(head ?? '')?.[1] ?? 0), headers: head ?? '', body: rest.join('\r\n\r\n') };
}

const lbHas = async (vip: string) => ({
  onLo: (await lab.exec(lab.lb, ['ip', '-o', 'addr', 'show', 'dev', 'lo'])).stdout.includes(`${vip}/32`),
  inNft: (await lab.exec(lab.lb, ['nft', 'list', 'table', 'inet', 'dsrlb'])).stdout.includes(vip),
});

describe('one daemon per namespace, one change at a time', () => {
  it('refuses a second `dsrlb run` (same config, or a broken one) with exit 2 before it touches the running one', async () => {
    const bad = join(dir, 'second-badif.yaml');
    await writeFile(bad, configText(addresses()).replace('interface: eth0', 'interface: nosuch0').replace('9742', '9772').replace('9743', '9773'));
    for (const cfg of [configPath, bad]) {
      const r = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'run', '-c', cfg], { timeoutMs: 20_000 });
      expect(r.code, r.stdout + r.stderr).toBe(2);
      expect(r.stderr.trim().split('\n')).toEqual([expect.stringMatching(/^dsrlb: another dsrlb daemon is running in this network namespace/)]);
      expect(r.stdout).not.toMatch(/"msg":"(added VIP|removed VIP|adopted host state)/);
    }
    expect(await lbHas(lab.vip)).toEqual({ onLo: true, inNft: true });
    await lab.exec(lab.client, ['ip', 'neigh', 'flush', 'all']);
    const traffic = await httpCount(lab, 30);
    expect(traffic.ok).toBe(30);
  }, 60_000);

  it('runs overlapping reloads (admin API and SIGHUP) one after the other: all taken, the new VIP stays', async () => {
    const before = metricValue(await daemon.metrics(), 'dsrlb_config_reloads_total', 'result="failure"');
    const web2 = ['  - name: web2', '    vip: 10.77.0.101', '    port: 8080', '    protocol: tcp', '    reals:', ...addresses().map((a) => `      - address: ${a}`)];
    await writeFile(configPath, labConfig(lab, { reals: addresses(), top: [`stateFile: ${dir}/dsrlb.state.json`], after: web2 }));
    const posts = Array.from({ length: 4 }, () => adminCurl(['-X', 'POST', 'http://127.0.0.1:9743/reload']));
    daemon.proc.kill('SIGHUP');
    daemon.proc.kill('SIGHUP');
    const answers = await Promise.all(posts);
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200]);
    await sleep(1500);
    expect(metricValue(await daemon.metrics(), 'dsrlb_config_reloads_total', 'result="failure"')).toBe(before);
    expect(await lbHas('10.77.0.101')).toEqual({ onLo: true, inNft: true });
    expect((await daemon.status()).services.map((x) => x.name)).toEqual(['web', 'web2']);
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    expect(await lbHas('10.77.0.101')).toEqual({ onLo: false, inNft: false });
  }, 60_000);

  it('runs overlapping intent changes one after the other, and a change whose state file cannot be written changes nothing', async () => {
    const verbs = Array.from({ length: 12 }, (_, i) => adminCurl(['-X', 'POST', `http://127.0.0.1:9743/services/web/reals/${addresses()[i % 3]}/${i < 6 ? 'drain' : 'undrain'}`]));
    expect((await Promise.all(verbs)).map((a) => a.status)).toEqual(Array(12).fill(200));
    for (const a of addresses()) expect((await daemon.cli(['undrain', 'web', a])).code).toBe(0);
    JSON.parse(await readFile(join(dir, 'dsrlb.state.json'), 'utf8'));

    await writeFile(configPath, labConfig(lab, { reals: addresses(), top: [`stateFile: ${dir}/no-such-dir/dsrlb.state.json`] }));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    const r1 = lab.reals[0]!;
    const refused = await daemon.cli(['drain', 'web', r1.ipv4]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/nothing changed: the state file .*no-such-dir.* cannot be written/);
    expect((await daemon.status()).services[0]!.reals.find((x) => x.address === r1.ipv4)!.intent).toBe('active');
    const traffic = await httpCount(lab, 40);
    expect(traffic.ok).toBe(40);
    expect(traffic.byReal[r1.name] ?? 0).toBeGreaterThan(0);
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
  }, 60_000);

  it('drops an override for good once the config changes that real: reverting the config does not bring the drain back', async () => {
    const real = lab.reals[1]!.ipv4;
    expect((await daemon.cli(['drain', 'web', real])).code).toBe(0);
    const weighted = configText(addresses()).replace(`      - address: ${real}`, `      - address: ${real}\n        weight: 90`);
    await writeFile(configPath, weighted);
    expect((await daemon.cli(['reload'])).code).toBe(0);
    const changed = (await daemon.status()).services[0]!.reals.find((x) => x.address === real)!;
    expect([changed.intent, changed.weight]).toEqual(['active', 90]);
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    const reverted = (await daemon.status()).services[0]!.reals.find((x) => x.address === real)!;
    expect([reverted.intent, reverted.weight]).toEqual(['active', 100]);
    expect(JSON.stringify(JSON.parse(await readFile(join(dir, 'dsrlb.state.json'), 'utf8')).intent)).not.toContain(real);
  }, 60_000);

  it('refuses a reload that moves the admin or metrics listener (restart-only) and keeps answering where it was', async () => {
    await writeFile(configPath, configText(addresses()).replace('127.0.0.1:9743', '127.0.0.1:9753'));
    const r = await daemon.cli(['reload']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/admin\.listen: changing the admin API's address \(127\.0\.0\.1:9743 -> 127\.0\.0\.1:9753\) needs a restart/);
    await writeFile(configPath, configText(addresses()).replace('127.0.0.1:9742', '127.0.0.1:9752'));
    expect((await daemon.cli(['reload'])).stderr).toMatch(/metrics\.listen: .* needs a restart/);
    // Every restart-only change is named, not only the first.
    await writeFile(configPath, configText(addresses()).replace('127.0.0.1:9743', '127.0.0.1:9753').replace('127.0.0.1:9742', '127.0.0.1:9752'));
    const both = await daemon.cli(['reload']);
    expect(both.code).toBe(1);
    expect(both.stderr).toMatch(/admin\.listen: .* needs a restart/);
    expect(both.stderr).toMatch(/metrics\.listen: .* needs a restart/);
    // A refusal by the system (here a token file that cannot be read) exits 2, as the contract has it.
    await writeFile(configPath, configText(addresses()).replace('admin: { listen: 127.0.0.1:9743 }', `admin: { listen: 127.0.0.1:9743, tokenFile: ${dir}/no-such.token }`));
    const system = await daemon.cli(['reload']);
    expect(system.code, system.stderr).toBe(2);
    expect(system.stderr).toMatch(/admin\.tokenFile: cannot read .*no-such\.token/);
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.status()).services).toHaveLength(1);
  }, 30_000);
});

describe('admin API input', () => {
  it('explains a scheduler pick with its slot, and a finished connection as scheduled afresh', async () => {
    const pick = await adminCurl([`http://127.0.0.1:9743/explain?service=web&client=${lab.client.ipv4}:40123`]);
    expect(pick.status).toBe(200);
    const e = JSON.parse(pick.body) as { reason: string; scheduler: string; slot: number; flowState: string | null };
    expect([e.reason, e.scheduler, e.flowState]).toEqual(['scheduler', 'maglev', null]);
    expect(e.slot).toBeGreaterThanOrEqual(0);
    expect(e.slot).toBeLessThan(65537);
    const done = await lab.exec(lab.client, ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '--local-port', '45555', `http://${lab.vip}/`]);
    expect(done.stdout).toBe('200');
    await sleep(300);
    const closed = JSON.parse((await adminCurl([`http://127.0.0.1:9743/explain?service=web&client=${lab.client.ipv4}:45555`])).body) as typeof e & { entryReal: string | null };
    expect(closed.flowState).toMatch(/^(fin|closed)$/);
    expect(closed.reason).toBe('scheduler');
    // Where that closing connection's packets still go, beside the real a new SYN gets.
    expect(addresses()).toContain(closed.entryReal);
  }, 30_000);

  it('answers bad input with 400, a wrong method with 405 and Allow, and takes SERVICE in any spelling', async () => {
    for (const client of ['1.2.3.4:99999', 'notanip:80', '[fd00::10]:5']) {
      const r = await adminCurl([`http://127.0.0.1:9743/explain?service=web&client=${encodeURIComponent(client)}`]);
      expect(r.status, client).toBe(400);
      expect(JSON.parse(r.body).error).toBe('BAD_CLIENT');
    }
    const cli = await daemon.cli(['explain', 'web', '1.2.3.4:99999']);
    expect(cli.code).toBe(1);
    expect(cli.stderr).toMatch(/port 99999 is not 1\.\.65535/);
    const weight = await adminCurl(['-X', 'PUT', '--data', 'nope', `http://127.0.0.1:9743/services/web/reals/${addresses()[0]}/weight`]);
    expect(weight.status).toBe(400);
    const method = await adminCurl([`http://127.0.0.1:9743/services/web/reals/${addresses()[0]}/drain`]);
    expect(method.status).toBe(405);
    expect(method.headers).toMatch(/^allow: POST$/im);
    // The metrics listener too: /metrics is GET only.
    const scrapePost = await adminCurl(['-X', 'POST', 'http://127.0.0.1:9742/metrics']);
    expect([scrapePost.status, scrapePost.body]).toEqual([405, 'method POST not allowed here: use GET\n']);
    expect(scrapePost.headers).toMatch(/^allow: GET$/im);
    expect((await adminCurl(['http://127.0.0.1:9742/other'])).status).toBe(404);
    const spelled = await daemon.cli(['undrain', `tcp://${lab.vip}:080`, addresses()[0]!]);
    expect(spelled.code, spelled.stderr).toBe(0);
    // The answer names the service and real as the daemon knows them, not as typed (it was active already).
    expect(spelled.stdout.trim()).toBe(`web ${addresses()[0]}: active, weight 100 (already so: nothing changed)`);
  }, 30_000);
});

describe('start-up failures', () => {
  it('a CPU this process may not run on (cpus: [1023]) is a config problem: exit 1, cpus[0] named, before any host change', async () => {
    await inBareNamespace('pin', async (_ns, inNs) => {
      const cfg = join(dir, 'pinned.yaml');
      await writeFile(cfg, ['interface: eth0', 'cpus: [1023]', 'services:', '  - { name: web, vip: 198.51.100.7, port: 80, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
      const started = Date.now();
      const r = await inNs(...dsrlbArgv(ROOT), 'run', '-c', cfg).then(
        () => ({ code: 0, stdout: '', stderr: '' }),
        (e: { code: number; stdout: string; stderr: string }) => e,
      );
      expect(r.code, r.stdout).toBe(1);
      expect(r.stderr).toMatch(/^cpus\[0\]: CPU 1023 is not one this process may run on \(\S+\)$/m);
      expect(r.stdout).not.toContain('added VIP');
      expect(Date.now() - started).toBeLessThan(15_000);
      expect((await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout).not.toContain('198.51.100.7');
      expect((await inNs('nft', 'list', 'tables')).stdout).not.toContain('dsrlb');
    });
  }, 30_000);
});

describe('start-up failure after the packet loop started', () => {
  it('exits 1 (a config problem) naming the interface when it does not exist, before any host change', async () => {
    await inBareNamespace('noif', async (_ns, inNs) => {
      const cfg = join(dir, 'no-interface.yaml');
      await writeFile(cfg, ['interface: nosuch0', 'services:', '  - { name: web, vip: 198.51.100.9, port: 80, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
      const r = await inNs('timeout', '30', ...dsrlbArgv(ROOT), 'run', '-c', cfg).then(
        () => ({ code: 0, stdout: '', stderr: '' }),
        (e: { code: number; stdout: string; stderr: string }) => e,
      );
      expect(r.code, r.stdout).toBe(1);
      expect(r.stderr).toContain('interface: "nosuch0" does not exist in this network namespace');
      expect((await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout).not.toContain('198.51.100.9');
      expect((await inNs('nft', 'list', 'tables')).stdout).not.toContain('dsrlb');
    });
  }, 40_000);

  it('exits 2 promptly and undoes its own host changes when the metrics port is taken', async () => {
    await inBareNamespace('port', async (ns, inNs) => {
      const holder = lab.spawn(ns, [process.execPath, '-e', "require('net').createServer().listen(9742, '127.0.0.1', () => console.log('ready'))"], { stdio: ['ignore', 'pipe', 'inherit'] });
      try {
        await new Promise<void>((res) => holder.stdout!.once('data', () => res()));
        const cfg = join(dir, 'port-taken.yaml');
        await writeFile(cfg, ['interface: eth0', 'services:', '  - { name: web, vip: 198.51.100.8, port: 80, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
        const started = Date.now();
        const r = await inNs('timeout', '30', ...dsrlbArgv(ROOT), 'run', '-c', cfg).then(
          () => ({ code: 0, stdout: '' }),
          (e: { code: number; stdout: string }) => e,
        );
        expect(r.code, r.stdout).toBe(2);
        expect(r.stdout).toContain('EADDRINUSE');
        // Found before any host change (the listen addresses are tried first).
        expect(r.stdout).not.toContain('added VIP');
        expect(Date.now() - started).toBeLessThan(15_000);
        expect((await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout).not.toContain('198.51.100.8');
        expect((await inNs('nft', 'list', 'tables')).stdout).not.toContain('dsrlb');
      } finally {
        holder.kill('SIGTERM');
      }
    });
  }, 40_000);

  it('refuses, as config problems (exit 1, before any host change), a VIP that is the host\'s own address and a listen address the host does not have', async () => {
    await inBareNamespace('own', async (ns, inNs) => {
      // Something on the host's own address (as SSH or BGP would be) must stay reachable.
      const holder = lab.spawn(ns, [process.execPath, '-e', "require('net').createServer((c) => c.end('up')).listen(2222, '192.0.2.1', () => console.log('ready'))"], { stdio: ['ignore', 'pipe', 'inherit'] });
      try {
        await new Promise<void>((res) => holder.stdout!.once('data', () => res()));
        const cfg = join(dir, 'own-address.yaml');
        await writeFile(cfg, ['interface: eth0', 'metrics: { listen: "10.9.9.9:9742" }', 'services:', '  - { name: web, vip: 192.0.2.1, port: 80, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
        const r = await inNs('timeout', '30', ...dsrlbArgv(ROOT), 'run', '-c', cfg).then(
          () => ({ code: 0, stdout: '', stderr: '' }),
          (e: { code: number; stdout: string; stderr: string }) => e,
        );
        expect(r.code, r.stdout).toBe(1);
        expect(r.stderr).toContain('services[0].vip: 192.0.2.1 is an address of this host: eth0 (192.0.2.1/24)');
        expect((await inNs('nft', 'list', 'tables')).stdout).not.toContain('dsrlb');
        await writeFile(cfg, ['interface: eth0', 'metrics: { listen: "10.9.9.9:9742" }', 'services:', '  - { name: web, vip: 198.51.100.10, port: 80, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
        const listen = await inNs('timeout', '30', ...dsrlbArgv(ROOT), 'run', '-c', cfg).then(
          () => ({ code: 0, stdout: '', stderr: '' }),
          (e: { code: number; stdout: string; stderr: string }) => e,
        );
        expect(listen.code, listen.stdout).toBe(1);
        expect(listen.stderr).toContain('metrics.listen: 10.9.9.9:9742: 10.9.9.9 is not an address of this host');
        expect(listen.stdout).not.toContain('added VIP');
        expect((await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout).not.toContain('198.51.100.10');
        const reach = await inNs('timeout', '5', process.execPath, '-e', "require('net').connect(2222, '192.0.2.1').on('data', (d) => process.stdout.write(d))");
        expect(reach.stdout).toBe('up');
      } finally {
        holder.kill('SIGTERM');
      }
    });
  }, 60_000);

  it('undoes its host changes and exits 0 on a SIGTERM that arrives during start', async () => {
    await inBareNamespace('sig', async (ns, inNs) => {
      // Start looks up the route to an IPIP real after the VIP and the nftables table are in place;
      // an `ip` that takes 3 s over that lookup holds start open while the signal arrives.
      const bin = join(dir, 'slow-ip');
      await mkdir(bin, { recursive: true });
      await writeFile(join(bin, 'ip'), '#!/bin/sh\ncase "$*" in *"-batch"*) sleep 3;; esac\nexec /usr/sbin/ip "$@"\n', { mode: 0o755 });
      const cfg = join(dir, 'signal-in-start.yaml');
      await writeFile(cfg, ['interface: eth0', 'services:', '  - { name: web, vip: 198.51.100.9, port: 80, forwarding: ipip, reals: [{ address: 192.0.2.2 }] }', ''].join('\n'));
      const child = lab.spawn(ns, ['env', `PATH=${bin}:${process.env.PATH}`, ...dsrlbArgv(ROOT), 'run', '-c', cfg], { stdio: ['ignore', 'pipe', 'inherit'] });
      let stdout = '';
      child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
      const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));
      try {
        const deadline = Date.now() + 10_000;
        while (!(await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout.includes('198.51.100.9')) {
          if (Date.now() > deadline) throw new Error(`the VIP never appeared:\n${stdout}`);
          await sleep(50);
        }
        expect(stdout).not.toContain('dsrlb running');
        child.kill('SIGTERM');
        expect(await exited, stdout).toBe(0);
        expect(stdout).toContain('stop requested during start');
        expect(stdout).toContain('dsrlb stopped');
        expect((await inNs('ip', '-o', 'addr', 'show', 'dev', 'lo')).stdout).not.toContain('198.51.100.9');
        expect((await inNs('nft', 'list', 'tables')).stdout).not.toContain('dsrlb');
      } finally {
        child.kill('SIGKILL');
      }
    });
  }, 40_000);
});

describe('reload', () => {
  it('refuses a broken file, keeps forwarding unchanged and reports every reason', async () => {
    const before = await daemon.metrics();
    const fingerprint = (await daemon.status()).services[0]!.tableFingerprint;
    await writeFile(configPath, configText([...addresses(), '10.77.0.300']).replace('protocol: tcp', 'protocol: sctp'));
    const r = await daemon.cli(['reload']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('reload refused');
    expect(r.stderr).toContain('services[0].protocol');
    expect(r.stderr).toContain('services[0].reals[3].address');
    const after = await daemon.metrics();
    expect(metricValue(after, 'dsrlb_config_reloads_total', 'result="failure"')).toBe(metricValue(before, 'dsrlb_config_reloads_total', 'result="failure"') + 1);
    expect((await daemon.status()).services[0]!.tableFingerprint).toBe(fingerprint);
    const traffic = await httpCount(lab, 60);
    expect(traffic.ok).toBe(60);
    expect(Object.keys(traffic.byReal).sort()).toEqual(['r1', 'r2', 'r3']);
    // SIGHUP with the same broken file: logged and counted, nothing changes.
    daemon.proc.kill('SIGHUP');
    await sleep(1000);
    expect(metricValue(await daemon.metrics(), 'dsrlb_config_reloads_total', 'result="failure"')).toBe(metricValue(before, 'dsrlb_config_reloads_total', 'result="failure"') + 2);
    expect(daemon.logs.some((l) => l.includes('reload refused'))).toBe(true);
    // Keys only a restart changes (here: the loops' CPUs) are refused with their path.
    await writeFile(configPath, configText(addresses(), ['cpus: [0]']));
    const pinned = await daemon.cli(['reload']);
    expect(pinned.code).toBe(1);
    expect(pinned.stderr).toMatch(/cpus: changing the packet loops' CPUs \(\[\] -> \[0\]\) needs a restart/);
    expect(/^dsrlb_config_last_reload_successful (\S+)$/m.exec(await daemon.metrics())?.[1]).toBe('0');
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    // The next reload taken clears it (an alert on it too).
    expect(/^dsrlb_config_last_reload_successful (\S+)$/m.exec(await daemon.metrics())?.[1]).toBe('1');
  }, 60_000);

  it('drains a real removed by a reload: its live transfer completes, new flows avoid it', async () => {
    const size = 600_000;
    const body = join(dir, 'removed.body');
    const headers = join(dir, 'removed.headers');
    const download = lab.exec(lab.client, ['curl', '-s', '-D', headers, '-o', body, '-w', '%{http_code} %{size_download}', `http://${lab.vip}/bytes/${size}?rate=100000`], { timeoutMs: 60_000 });
    await sleep(1200);
    const realName = /x-real:\s*(\S+)/i.exec(await readFile(headers, 'utf8'))![1]!;
    const removed = lab.reals.find((r) => r.name === realName)!;
    await writeFile(configPath, configText(addresses().filter((a) => a !== removed.ipv4)));
    const r = await daemon.cli(['reload']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('reload taken');
    const s = await daemon.status();
    const drained = s.services[0]!.reals.find((x) => x.address === removed.ipv4)!;
    expect(drained.activeFlows).toBeGreaterThanOrEqual(1);
    const fresh = await httpCount(lab, 40);
    expect(fresh.ok).toBe(40);
    expect(fresh.byReal[realName] ?? 0).toBe(0);
    const result = await download;
    expect(result.stdout).toBe(`200 ${size}`);
    expect(createHash('sha256').update(await readFile(body)).digest('hex')).toBe(createHash('sha256').update(patternBytes(size)).digest('hex'));
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
  }, 60_000);

  it('drains a service removed by a reload: its live transfer completes, new connections get nothing, then it and its VIP go', async () => {
    const timeouts = 'flowTable: { tcpTimeouts: { syn: 60s, established: 900s, fin: 1s } }';
    await writeFile(configPath, configText(addresses(), [timeouts]));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    const size = 500_000;
    const body = join(dir, 'removed-service.body');
    const download = lab.exec(lab.client, ['curl', '-s', '-o', body, '-w', '%{http_code} %{size_download}', `http://${lab.vip}/bytes/${size}?rate=100000`], { timeoutMs: 60_000 });
    await sleep(1200);
    // Only another service (another VIP, no traffic) is left: web is removed.
    const otherOnly = configText([lab.reals[0]!.ipv4], [timeouts]).replace('- name: web\n', '- name: other\n').replace(`vip: ${lab.vip}`, 'vip: 10.77.0.150').replace('port: 80', 'port: 81');
    await writeFile(configPath, otherOnly);
    const r = await daemon.cli(['reload']);
    expect(r.code, r.stderr).toBe(0);
    const during = (await daemon.status()) as unknown as { services: { name: string; removed: boolean; reals: { activeFlows: number }[] }[] };
    const web = during.services.find((x) => x.name === 'web');
    expect(web).toMatchObject({ removed: true });
    expect(web!.reals.reduce((n, x) => n + x.activeFlows, 0)).toBeGreaterThanOrEqual(1);
    expect((await daemon.cli(['status'])).stdout).toMatch(/ web +REMOVED\(draining\)/);
    expect(metricValue(await daemon.metrics(), 'dsrlb_flow_table_entries', '')).toBeGreaterThanOrEqual(1);
    const fresh = await httpCount(lab, 5, { timeoutMs: 1000 });
    expect(fresh.ok).toBe(0);
    const result = await download;
    expect(result.stdout).toBe(`200 ${size}`);
    expect(createHash('sha256').update(await readFile(body)).digest('hex')).toBe(createHash('sha256').update(patternBytes(size)).digest('hex'));
    // Its last flow gone (fin timeout 1 s), it is forgotten and its VIP released.
    await daemon.waitFor('web forgotten', (st) => !st.services.some((x) => x.name === 'web'), 15_000);
    const forgotten = () => daemon.logs.some((l) => l.includes('"removed service drained: forgotten"') && l.includes('"web"'));
    const deadline = Date.now() + 5000;
    while (!forgotten() && Date.now() < deadline) await sleep(100); // the once-a-second tick forgets it
    expect(forgotten()).toBe(true);
    while ((await lbHas(lab.vip)).onLo && Date.now() < deadline) await sleep(200);
    expect(await lbHas(lab.vip)).toEqual({ onLo: false, inNft: false });
    await writeFile(configPath, configText(addresses()));
    expect((await daemon.cli(['reload'])).code).toBe(0);
    await daemon.waitFor('web back', (st) => st.services.some((x) => x.name === 'web' && x.reals.every((y) => y.mac !== null)), 10_000);
    expect((await httpCount(lab, 20)).ok).toBe(20);
  }, 90_000);
});

describe('plan against the running daemon', () => {
  it('reports the hash space that moves and the live flows that would change real', async () => {
    const client = lab.spawn(lab.client, [process.execPath, join(ROOT, 'dist/lab/http-client.js'), '--host', lab.vip, '--keepalive', '20'], { stdio: ['pipe', 'pipe', 'inherit'] });
    try {
      await sleep(1500);
      const candidate = join(dir, 'candidate.yaml');
      // Disable one real: its live flows must move; the others stay.
      await writeFile(candidate, configText(addresses()).replace(`      - address: ${lab.reals[0]!.ipv4}`, `      - address: ${lab.reals[0]!.ipv4}\n        state: disabled`));
      const r = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'plan', '-c', candidate, '--admin', 'http://127.0.0.1:9743', '--json']);
      expect(r.code, r.stderr).toBe(0);
      const report = JSON.parse(r.stdout);
      const text = JSON.stringify(report);
      expect(text).toContain('web');
      const onDisabled = (await daemon.status()).services[0]!.reals.find((x) => x.address === lab.reals[0]!.ipv4)!;
      expect(text).toMatch(/changingRealNow"?:\s*\d+/);
      const changing = Number(/changingRealNow"?:\s*(\d+)/.exec(text)![1]);
      expect(changing).toBeGreaterThan(0);
      expect(changing).toBe(onDisabled.activeFlows + onDisabled.inactiveFlows);
      console.log('plan (disable one real):', r.stdout.slice(0, 400));
    } finally {
      client.stdin!.end('quit\n');
      await new Promise((res) => client.once('exit', res));
    }
  }, 60_000);

  it('takes the intent in force: with one real drained through the CLI, a config keeping only that real leaves no eligible real', async () => {
    const kept = lab.reals[0]!.ipv4;
    const drain = await daemon.cli(['drain', 'web', kept]);
    expect(drain.code, drain.stderr).toBe(0);
    try {
      const candidate = join(dir, 'only-drained.yaml');
      await writeFile(candidate, configText([kept]));
      const plan = (json: boolean) => lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'plan', '-c', candidate, '--admin', 'http://127.0.0.1:9743', ...(json ? ['--json'] : [])]);
      const text = await plan(false);
      expect(text.code, text.stderr).toBe(0);
      expect(text.stdout).toContain('reals taking new flows: 2 -> 0');
      expect(text.stdout).toMatch(/NO_ELIGIBLE_REAL: web is left with no real that takes new flows .*by the intent and health in force/);
      const report = JSON.parse((await plan(true)).stdout);
      expect(report.liveRealsKnown).toBe(true);
      expect(report.warnings.map((w: { code: string }) => w.code)).toContain('NO_ELIGIBLE_REAL');
      // Against the file alone (no daemon view) the drained real still counts: no such warning.
      const against = await lab.exec(lab.lb, [...dsrlbArgv(ROOT), 'plan', '-c', candidate, '--against', configPath]);
      expect(against.code, against.stderr).toBe(0);
      expect(against.stdout).not.toContain('NO_ELIGIBLE_REAL');
    } finally {
      expect((await daemon.cli(['undrain', 'web', kept])).code).toBe(0);
    }
  }, 60_000);
});

describe('metrics', () => {
  it('pass promtool check metrics on a live scrape', async () => {
    await httpCount(lab, 20);
    const text = await daemon.metrics();
    const file = join(dir, 'scrape.txt');
    await writeFile(file, text);
    const { stdout, stderr } = await run('sh', ['-c', `promtool check metrics < ${file}`]).catch((e: { stdout: string; stderr: string; code: number }) => {
      throw new Error(`promtool check metrics failed:\n${e.stdout}${e.stderr}`);
    });
    expect(stdout + stderr).not.toMatch(/error/i);
    for (const name of [
      'dsrlb_rx_packets_total',
      'dsrlb_rx_bytes_total',
      'dsrlb_forwarded_packets_total',
      'dsrlb_forwarded_bytes_total',
      'dsrlb_dropped_packets_total',
      'dsrlb_flows_active',
      'dsrlb_flows_created_total',
      'dsrlb_flow_table_entries',
      'dsrlb_flow_table_capacity',
      'dsrlb_flow_table_evictions_total',
      'dsrlb_real_up',
      'dsrlb_real_weight',
      'dsrlb_real_state',
      'dsrlb_icmp_too_big_sent_total',
      'dsrlb_config_reloads_total',
      'dsrlb_config_last_reload_success_timestamp_seconds',
      'dsrlb_config_last_reload_successful',
      'process_cpu_seconds_total',
    ]) {
      expect(text, name).toContain(`# TYPE ${name.replace(/_total$/, '')}`);
    }
    // The loop's own time, from two clock reads per wake-up: positive after traffic, the engine a part of it.
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
    const busy = value('dsrlb_loop_busy_seconds_total');
    const engine = value('dsrlb_loop_engine_seconds_total');
    expect(busy).toBeGreaterThan(0);
    expect(engine).toBeGreaterThan(0);
    expect(engine).toBeLessThan(busy);
  }, 60_000);

  it('are scraped by a real Prometheus server: forwarded packets by real are non-zero for every real that got traffic', async () => {
    const promDir = await mkdtemp(join(tmpdir(), 'dsrlb-prom-'));
    await writeFile(join(promDir, 'prometheus.yml'), ['global: { scrape_interval: 1s }', 'scrape_configs:', '  - job_name: dsrlb', '    static_configs: [ { targets: ["127.0.0.1:9742"] } ]', ''].join('\n'));
    const prom = lab.spawn(lab.lb, ['prometheus', `--config.file=${join(promDir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(promDir, 'data')}`, '--web.listen-address=127.0.0.1:9790'], { stdio: ['ignore', 'ignore', 'ignore'] });
    try {
      const traffic = await httpCount(lab, 60);
      expect(traffic.ok).toBe(60);
      let result: { metric: { real: string }; value: [number, string] }[] = [];
      const deadline = Date.now() + 30_000;
      while (Date.now() < deadline) {
        // -f: Prometheus answers 503 "Service Unavailable" until its storage is ready; keep asking.
        const q = await lab.exec(lab.lb, ['curl', '-sf', '--data-urlencode', 'query=sum by (real) (dsrlb_forwarded_packets_total)', 'http://127.0.0.1:9790/api/v1/query']);
        if (q.code === 0 && q.stdout) {
          const parsed = JSON.parse(q.stdout) as { data?: { result: typeof result } };
          result = parsed.data?.result ?? [];
          if (result.length === 3 && result.every((r) => Number(r.value[1]) > 0)) break;
        }
        await sleep(1000);
      }
      expect(result.map((r) => r.metric.real).sort()).toEqual(addresses().sort());
      for (const r of result) expect(Number(r.value[1])).toBeGreaterThan(0);
    } finally {
      prom.kill('SIGTERM');
      await new Promise((r) => prom.once('exit', r));
    }
  }, 90_000);
});
