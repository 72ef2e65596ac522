// deploy/linux operations files: the units pass systemd-analyze, and the installed tree runs under each
// unit's user, capabilities, umask and read-only kernel tunables in a network namespace; alert rules and
// scrape config pass promtool (with rule unit tests); the dashboard's PromQL parses and names only
// exported metrics; install.sh --root lays out an idempotent install whose sysusers.d entry makes the
// user; the sample config shows every key. Needs root, `ip netns`, setpriv, systemd-analyze,
// systemd-sysusers and promtool.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { appendFile, chmod, chown, cp, lstat, mkdir, mkdtemp, readFile, readdir, readlink, rm, rmdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { createCounters, Counter as Slot, REAL_BASE, REAL_STRIDE, RealCounter } from '../../src/dataplane/counters.js';
import { DropReason } from '../../src/dataplane/drop-reasons.js';
import { DaemonMetrics, type MetricsRealView } from '../../src/control/metrics.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const deployDir = join(repoRoot, 'deploy', 'linux');
const UNIT = join(deployDir, 'dsrlb.service');
const DECAP_UNIT = join(deployDir, 'dsrlb-decap@.service');
const SAMPLE = join(deployDir, 'dsrlb.yaml.sample');
const ALERTS = join(deployDir, 'dsrlb-alerts.yml');
const DASHBOARD = join(deployDir, 'grafana-dashboard.json');
const INSTALL = join(deployDir, 'install.sh');
const PREFIX = `dsrt-deploy-${process.pid}-`;
const NS = `${PREFIX}lb`;

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

function run(file: string, args: readonly string[], opts: { cwd?: string; input?: string } = {}): Promise<Result> {
  return new Promise((done) => {
    const child = execFile(file, args, { cwd: opts.cwd, encoding: 'utf8', maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 255;
      done({ code, stdout, stderr });
    });
    // A program that exits without reading its stdin must not fail the test run with EPIPE.
    child.stdin!.on('error', () => undefined);
    child.stdin!.end(opts.input ?? '');
  });
}

async function mustRun(file: string, args: readonly string[], opts: { cwd?: string; input?: string } = {}): Promise<string> {
  const r = await run(file, args, opts);
  if (r.code !== 0) throw new Error(`${file} ${args.join(' ')} exited ${r.code}:\n${r.stdout}${r.stderr}`);
  return r.stdout;
}

/** `Key=value` lines of a unit file, every value of a key in order. */
function unitSettings(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const line of text.split('\n')) {
    const m = /^([A-Za-z]+)=(.*)$/.exec(line);
    if (!m) continue;
    out.set(m[1]!, [...(out.get(m[1]!) ?? []), m[2]!]);
  }
  return out;
}

const unitText = readFileSync(UNIT, 'utf8');
const unit = unitSettings(unitText);
const oneOf = (settings: Map<string, string[]>, name: string) => (key: string): string => {
  const v = settings.get(key);
  if (v?.length !== 1) throw new Error(`${name}: expected one ${key}=, found ${v?.length ?? 0}`);
  return v[0]!;
};
const one = oneOf(unit, 'dsrlb.service');
const decapUnitText = readFileSync(DECAP_UNIT, 'utf8');
const decapOne = oneOf(unitSettings(decapUnitText), 'dsrlb-decap@.service');

/** setpriv options that give what AmbientCapabilities= gives: those capabilities and no others. */
function setprivCaps(capabilities: string): string {
  const list = capabilities.split(/\s+/).map((c) => `+${c.replace(/^CAP_/, '').toLowerCase()}`).join(',');
  return `--inh-caps=-all,${list} --ambient-caps=-all,${list} --bounding-set=-all,${list}`;
}

/** Shell lines that make /proc/sys and /sys read-only in a private mount namespace, as ProtectKernelTunables=yes does. */
const READ_ONLY_TUNABLES = [
  'mount --bind /proc/sys /proc/sys',
  'mount -o remount,bind,ro /proc/sys',
  'mount --bind /sys /sys',
  'mount -o remount,bind,ro /sys',
  'if (echo 0 > /proc/sys/net/ipv4/ip_forward) 2>/dev/null; then echo "/proc/sys is writable" >&2; exit 9; fi',
];

/**
 * Shell lines that make the unit's ReadWritePaths= under /proc/sys writable again, as systemd does
 * (a bind mount of the path onto itself, remounted read-write); `-` paths only where they exist.
 */
function writableTunables(paths: string): string[] {
  return paths
    .split(/\s+/)
    .filter((p) => p.replace(/^-/, '').startsWith('/proc/sys/'))
    .flatMap((p) => {
      const path = p.replace(/^-/, '');
      const lines = [`mount --bind ${path} ${path}`, `mount -o remount,bind,rw ${path}`];
      return p.startsWith('-') ? [`if [ -e ${path} ]; then ${lines.join('; ')}; fi`] : lines;
    });
}

// ---- What the daemon exports ----

/** A fake packet loop and registry view: two reals of "web", one draining and finished. */
function fakeMetrics(): DaemonMetrics {
  const counters = createCounters();
  counters[Slot.rxPackets] = 1000;
  counters[Slot.rxBytes] = 64_000;
  counters[Slot.flowTableEntries] = 12;
  counters[Slot.dropBase + DropReason.neighborUnknown] = 3;
  counters[REAL_BASE + 0 * REAL_STRIDE + RealCounter.forwardedPackets] = 600;
  counters[REAL_BASE + 1 * REAL_STRIDE + RealCounter.forwardedBytes] = 25_600;
  const reals: MetricsRealView[] = [
    { service: 'web', real: '10.0.1.11', id: 0, weight: 100, intent: 'active', up: true, drainFinished: false },
    { service: 'web', real: '10.0.1.12', id: 1, weight: 50, intent: 'drain', up: false, drainFinished: true },
  ];
  const m = new DaemonMetrics({
    counters: () => counters,
    realCount: (c, id, which) => c[REAL_BASE + id * REAL_STRIDE + which]!,
    reals: () => reals,
    activeFlows: (id) => (id === 0 ? 7 : 0),
    inactiveFlows: (id) => (id === 0 ? 2 : 0),
    // dns: announce off for it would be announce off for the daemon; one daemon suffices to show no series.
    services: () => [
      { service: 'web', fingerprint: '0a1b2c3d', announced: true },
      { service: 'dns', fingerprint: '4e5f6a7b', announced: null },
    ],
    flowTableCapacity: () => 1000,
    panic: () => [{ service: 'web', panic: false, onBackups: false }],
  });
  m.reloads.inc({ result: 'success' });
  m.lastReloadSuccess.set(1_700_000_000);
  m.tableMovedSlots.inc({ service: 'web' }, 32_769);
  m.observeProbe('web', '10.0.1.11', 0.004, null);
  m.observeProbe('web', '10.0.1.12', 1.0, 'timeout');
  return m;
}

/** Announced by the lead as part of the metrics contract (some may be registered outside metrics.ts). */
const ANNOUNCED = ['dsrlb_healthcheck_duration_seconds', 'dsrlb_healthcheck_failures_total', 'dsrlb_service_panic', 'dsrlb_drain_finished'];

let exposition = '';
const known = new Set<string>();
const sourceNames = new Set<string>();

beforeAll(async () => {
  for (const file of ['metrics.ts', 'real-metrics.ts']) {
    const source = readFileSync(join(repoRoot, 'src', 'control', file), 'utf8');
    for (const m of source.matchAll(/['"`](dsrlb_[a-z0-9_]+)['"`]/g)) sourceNames.add(m[1]!);
  }
  exposition = await fakeMetrics().text();
  const histograms = new Set(['dsrlb_healthcheck_duration_seconds']);
  for (const m of exposition.matchAll(/^# TYPE (dsrlb_\w+) histogram$/gm)) histograms.add(m[1]!);
  for (const name of [...sourceNames, ...ANNOUNCED]) known.add(name);
  for (const h of histograms) for (const suffix of ['_bucket', '_sum', '_count']) known.add(h + suffix);
});

function dsrlbNames(expr: string): string[] {
  return [...expr.matchAll(/\bdsrlb_[a-zA-Z0-9_]+/g)].map((m) => m[0]);
}

describe('metric names', () => {
  it('every dsrlb_* name in metrics.ts and real-metrics.ts is exported, and the contract names are among them', () => {
    const families = new Set([...exposition.matchAll(/^# TYPE (dsrlb_\w+) /gm)].map((m) => m[1]!));
    expect(sourceNames.size).toBeGreaterThanOrEqual(25);
    for (const name of sourceNames) expect(families, name).toContain(name);
    for (const name of ANNOUNCED) expect(families, name).toContain(name);
    expect(families).toContain('dsrlb_forwarded_bytes_total');
    expect(exposition).toContain('dsrlb_flows_active{service="web",real="10.0.1.11"} 7');
    expect(exposition).toContain('dsrlb_drain_finished{service="web",real="10.0.1.12"} 1');
    // No announce: no series (an alert on 0 would fire for a VIP never meant to be announced).
    expect(exposition).toContain('dsrlb_vip_announced{service="web"} 1');
    expect(exposition).not.toContain('dsrlb_vip_announced{service="dns"}');
  });

  it('promtool check metrics finds no problem in a scrape of DaemonMetrics', async () => {
    const r = await run('promtool', ['check', 'metrics'], { input: exposition });
    expect(r.stdout + r.stderr).toBe('');
    expect(r.code).toBe(0);
  });
});

// ---- systemd unit ----

describe('dsrlb.service', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), PREFIX));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /**
   * verify checks that ExecStart's program exists and is executable; /usr/local/bin/dsrlb exists only
   * once install.sh has run on this machine. So verify reads a copy whose ExecStart names the
   * checkout's bin/dsrlb.js (the file /usr/local/bin/dsrlb links to); every other line is the unit's.
   */
  async function verifiableCopy(text: string, name: string): Promise<string> {
    const path = join(dir, name);
    const copy = text.replace(/^ExecStart=\/usr\/local\/bin\/dsrlb /m, `ExecStart=${join(repoRoot, 'bin', 'dsrlb.js')} `);
    expect(copy).not.toBe(text);
    await writeFile(path, copy);
    return path;
  }

  it('passes systemd-analyze verify without a warning', async () => {
    const r = await run('systemd-analyze', ['verify', await verifiableCopy(unitText, 'dsrlb.service')]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
  });

  it('scores at most 3.0 ("OK") in systemd-analyze security', async () => {
    const r = await run('systemd-analyze', ['security', '--offline=yes', '--no-pager', await verifiableCopy(unitText, 'dsrlb.service')]);
    const m = /Overall exposure level for dsrlb\.service: ([\d.]+) (\w+)/.exec(r.stdout);
    expect(m, r.stdout + r.stderr).not.toBeNull();
    expect(Number(m![1])).toBeLessThanOrEqual(3.0);
    expect(m![2]).toBe('OK');
  });

  it('dsrlb-decap@.service passes verify as an instance and scores at most 3.0 ("OK")', async () => {
    await verifiableCopy(decapUnitText, 'dsrlb-decap@.service');
    const verified = await run('systemd-analyze', ['verify', join(dir, 'dsrlb-decap@eth0.service')]);
    expect(verified.stderr).toBe('');
    expect(verified.code).toBe(0);
    const r = await run('systemd-analyze', ['security', '--offline=yes', '--no-pager', join(dir, 'dsrlb-decap@.service')]);
    const m = /Overall exposure level for dsrlb-decap@\S*: ([\d.]+) (\w+)/.exec(r.stdout);
    expect(m, r.stdout + r.stderr).not.toBeNull();
    expect(Number(m![1])).toBeLessThanOrEqual(3.0);
    expect(m![2]).toBe('OK');
  });

  it('dsrlb-decap@.service runs `dsrlb decap` on the instance interface with the VIPs of its EnvironmentFile, as dsrlb with two capabilities', () => {
    const install = readFileSync(INSTALL, 'utf8');
    const bin = /^BIN_LINK=(\S+)$/m.exec(install)![1]!;
    // The script's file, and the operator's own options (optional: "-"), which the script never writes.
    expect(unitSettings(decapUnitText).get('EnvironmentFile')).toEqual(['/etc/dsrlb/decap-%I.env', '-/etc/dsrlb/decap-%I.options']);
    expect(decapOne('ExecStart')).toBe(`${bin} decap --interface %I --vip \${VIPS} $DECAP_OPTIONS`);
    expect(decapOne('User')).toBe('dsrlb');
    expect(decapOne('AmbientCapabilities')).toBe(one('AmbientCapabilities'));
    expect(decapOne('CapabilityBoundingSet')).toBe(one('CapabilityBoundingSet'));
    expect(decapOne('BindsTo')).toBe('sys-subsystem-net-devices-%i.device');
    // dsrlb-realserver.service (setup --mode ipip) must find the TUN device when it starts.
    expect(decapOne('Before')).toBe('dsrlb-realserver.service');
    expect(decapOne('ExecStartPost')).toContain('ip link show dev dsrlb-decap0 up');
    // decap writes the TUN device's rp_filter and disable_ipv6 (and all.rp_filter to put back what an
    // earlier version left): only their directories are writable, and /run/dsrlb for its lock (and
    // that version's record), required: without it decap cannot take its lock.
    expect(decapOne('ProtectKernelTunables')).toBe('yes');
    expect(decapOne('ReadWritePaths').split(/\s+/).sort()).toEqual(['-/proc/sys/net/ipv6/conf', '/proc/sys/net/ipv4/conf', '/run/dsrlb']);
  });

  it('runs the installed binary and config as user dsrlb with only CAP_NET_RAW and CAP_NET_ADMIN', async () => {
    const install = await readFile(INSTALL, 'utf8');
    const bin = /^BIN_LINK=(\S+)$/m.exec(install)![1]!;
    const conf = /^CONF=\$CONF_DIR\/(\S+)$/m.exec(install)![1]!;
    const confDir = /^CONF_DIR=(\S+)$/m.exec(install)![1]!;
    expect(one('ExecStart')).toBe(`${bin} run -c ${confDir}/${conf}`);
    expect(one('ExecReload')).toBe('/bin/kill -HUP $MAINPID');
    expect(one('User')).toBe('dsrlb');
    expect(one('AmbientCapabilities').split(/\s+/).sort()).toEqual(['CAP_NET_ADMIN', 'CAP_NET_RAW']);
    expect(one('CapabilityBoundingSet').split(/\s+/).sort()).toEqual(['CAP_NET_ADMIN', 'CAP_NET_RAW']);
    expect(one('NoNewPrivileges')).toBe('yes');
    expect(one('Restart')).toBe('on-failure');
    expect(one('ProtectSystem')).toBe('strict');
    expect(one('ReadWritePaths').split(/\s+/).sort()).toEqual(['-/proc/sys/net/ipv6/conf', '/run/dsrlb', '/var/lib/dsrlb']);
    // The daemon writes one sysctl, an IPv6 interface setting (the test below runs it with the rest
    // of /proc/sys read-only); it needs a JIT.
    expect(one('ProtectKernelTunables')).toBe('yes');
    expect(unit.has('MemoryDenyWriteExecute')).toBe(false);
    expect(one('RestrictAddressFamilies').split(/\s+/)).toContain('AF_PACKET');
  });
});

// ---- install.sh, then the installed tree under the unit's privileges ----

interface Entry {
  kind: string;
  mode: number;
  size: number;
  mtimeMs: number;
  link: string;
}

async function snapshot(root: string): Promise<Map<string, Entry>> {
  const out = new Map<string, Entry>();
  const walk = async (dir: string): Promise<void> => {
    for (const name of await readdir(dir)) {
      const path = join(dir, name);
      const st = await lstat(path);
      const kind = st.isSymbolicLink() ? 'link' : st.isDirectory() ? 'dir' : 'file';
      out.set(path.slice(root.length), { kind, mode: st.mode, size: st.size, mtimeMs: kind === 'dir' ? 0 : st.mtimeMs, link: kind === 'link' ? await readlink(path) : '' });
      if (kind === 'dir') await walk(path);
    }
  };
  await walk(root);
  return out;
}

describe('install.sh --root', () => {
  let root = '';
  let firstRun: Result;
  let createdVarLib = false;
  let createdEtc = false;
  let daemon: ChildProcess | null = null;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), PREFIX));
    await chmod(root, 0o755); // the daemon test runs as nobody and must reach the installed tree
    firstRun = await run('dash', [INSTALL, '--root', root]);
  }, 120_000);

  afterAll(async () => {
    if (daemon && daemon.exitCode === null) daemon.kill('SIGKILL');
    await run('ip', ['netns', 'del', NS]);
    if (createdVarLib) await rmdir('/var/lib/dsrlb').catch(() => undefined);
    if (createdEtc) await rmdir('/etc/dsrlb').catch(() => undefined);
    await rm(root, { recursive: true, force: true });
    const left = (await mustRun('ip', ['netns', 'list'])).split('\n').filter((l) => l.startsWith(PREFIX));
    expect(left).toEqual([]);
  });

  it('lays out the code, the link, the config, the unit and the realserver script', async () => {
    expect(firstRun.stderr).toBe('');
    expect(firstRun.code).toBe(0);
    const link = await readlink(join(root, 'usr/local/bin/dsrlb'));
    expect(link).toBe('/opt/dsrlb/bin/dsrlb.js');
    for (const f of ['bin/dsrlb.js', 'dist/cli/main.js', 'native/build/Release/dsrlb_native.node', 'package.json', 'deploy/linux/dsrlb-realserver']) {
      expect(existsSync(join(root, 'opt/dsrlb', f)), f).toBe(true);
    }
    // Production dependencies only.
    expect(existsSync(join(root, 'opt/dsrlb/node_modules/prom-client/package.json'))).toBe(true);
    expect(existsSync(join(root, 'opt/dsrlb/node_modules/yargs/package.json'))).toBe(true);
    expect(existsSync(join(root, 'opt/dsrlb/node_modules/vitest'))).toBe(false);
    expect(existsSync(join(root, 'opt/dsrlb/node_modules/typescript'))).toBe(false);
    expect(await readFile(join(root, 'etc/systemd/system/dsrlb.service'), 'utf8')).toBe(unitText);
    expect((await lstat(join(root, 'etc/systemd/system/dsrlb.service'))).mode & 0o777).toBe(0o644);
    expect(await readFile(join(root, 'etc/systemd/system/dsrlb-decap@.service'), 'utf8')).toBe(decapUnitText);
    expect((await lstat(join(root, 'etc/systemd/system/dsrlb-decap@.service'))).mode & 0o777).toBe(0o644);
    expect(await readFile(join(root, 'usr/local/lib/sysusers.d/dsrlb.conf'), 'utf8')).toBe(await readFile(join(deployDir, 'dsrlb.sysusers.conf'), 'utf8'));
    expect(await readFile(join(root, 'usr/local/sbin/dsrlb-realserver'), 'utf8')).toBe(await readFile(join(deployDir, 'dsrlb-realserver'), 'utf8'));
    expect((await lstat(join(root, 'usr/local/sbin/dsrlb-realserver'))).mode & 0o777).toBe(0o755);
    const conf = await readFile(join(root, 'etc/dsrlb/dsrlb.yaml'), 'utf8');
    expect((await lstat(join(root, 'etc/dsrlb/dsrlb.yaml'))).mode & 0o777).toBe(0o640);
    expect(conf).toMatch(/^stateFile: \/var\/lib\/dsrlb\/dsrlb\.state\.json$/m);
    // The sample's admin.tokenFile, enforced by the daemon: a random token, not world-readable.
    expect(conf).toMatch(/^\s*tokenFile: \/etc\/dsrlb\/admin\.token/m);
    expect(await readFile(join(root, 'etc/dsrlb/admin.token'), 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
    expect((await lstat(join(root, 'etc/dsrlb/admin.token'))).mode & 0o777).toBe(0o640);
  });

  it('systemd-sysusers creates the units\' user dsrlb from the installed sysusers.d entry', async () => {
    const sysroot = await mkdtemp(join(tmpdir(), PREFIX));
    try {
      // The installed entry at its path in an empty image, found by the search path alone (no file named).
      await mkdir(join(sysroot, 'etc'));
      await cp(join(root, 'usr/local/lib/sysusers.d'), join(sysroot, 'usr/local/lib/sysusers.d'), { recursive: true });
      await mustRun('systemd-sysusers', [`--root=${sysroot}`]);
      const passwd = await readFile(join(sysroot, 'etc/passwd'), 'utf8');
      expect(passwd).toMatch(/^dsrlb:x:\d+:\d+:dsrlb load balancer:\/var\/lib\/dsrlb:\/usr\/sbin\/nologin$/m);
      expect(await readFile(join(sysroot, 'etc/group'), 'utf8')).toMatch(/^dsrlb:x:\d+:$/m);
      for (const u of [unit, unitSettings(decapUnitText)]) expect(u.get('User')).toEqual(['dsrlb']);
      // Then systemd-tmpfiles, from the installed entry, gives the config and the token to group
      // dsrlb: as built with --root they belong to the builder, and the daemon could not read the token.
      await cp(join(root, 'etc/dsrlb'), join(sysroot, 'etc/dsrlb'), { recursive: true });
      await cp(join(root, 'usr/local/lib/tmpfiles.d'), join(sysroot, 'usr/local/lib/tmpfiles.d'), { recursive: true });
      await mustRun('systemd-tmpfiles', [`--root=${sysroot}`, '--create']);
      const gid = Number(/^dsrlb:x:(\d+):$/m.exec(await readFile(join(sysroot, 'etc/group'), 'utf8'))![1]);
      for (const [path, mode] of [['etc/dsrlb', 0o750], ['etc/dsrlb/dsrlb.yaml', 0o640], ['etc/dsrlb/admin.token', 0o640]] as const) {
        const st = await lstat(join(sysroot, path));
        expect([st.uid, st.gid, st.mode & 0o777], path).toEqual([0, gid, mode]);
      }
      // /run/dsrlb exists from boot on (BIRD's include of the routes file needs the directory).
      const uid = Number(/^dsrlb:x:(\d+):/m.exec(await readFile(join(sysroot, 'etc/passwd'), 'utf8'))![1]);
      const runDir = await lstat(join(sysroot, 'run/dsrlb'));
      expect([runDir.isDirectory(), runDir.uid, runDir.gid, runDir.mode & 0o777]).toEqual([true, uid, gid, 0o755]);
    } finally {
      await rm(sysroot, { recursive: true, force: true });
    }
  });

  it('the installed tree validates the installed config', async () => {
    const out = await mustRun(process.execPath, [join(root, 'opt/dsrlb/bin/dsrlb.js'), 'validate', '-c', join(root, 'etc/dsrlb/dsrlb.yaml')]);
    expect(out).toMatch(/: ok \(\d+ services?\)/);
  });

  it('a second run changes nothing, and an edited config survives reinstalling', async () => {
    const before = await snapshot(root);
    expect(before.size).toBeGreaterThan(100);
    const second = await run('dash', [INSTALL, '--root', root]);
    expect(second.code).toBe(0);
    expect(second.stdout).toContain(`dsrlb is up to date in ${root}`);
    expect(second.stdout).not.toMatch(/^installed /m);
    expect(await snapshot(root)).toEqual(before);

    const confPath = join(root, 'etc/dsrlb/dsrlb.yaml');
    await appendFile(confPath, '# edited by the operator\n');
    const edited = await readFile(confPath, 'utf8');
    await rm(join(root, 'etc/systemd/system/dsrlb.service'));
    const third = await run('dash', [INSTALL, '--root', root]);
    expect(third.code).toBe(0);
    expect(third.stdout).toContain(`kept ${confPath} (never overwritten)`);
    expect(await readFile(confPath, 'utf8')).toBe(edited);
    expect(await readFile(join(root, 'etc/systemd/system/dsrlb.service'), 'utf8')).toBe(unitText);
  });

  it('refuses unknown arguments and a missing --root directory with exit 1', async () => {
    expect((await run('dash', [INSTALL, '--bogus'])).code).toBe(1);
    const r = await run('dash', [INSTALL, '--root', join(root, 'missing')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/no such directory/);
  });

  it('the installed daemon runs with the unit settings that setpriv and mounts can apply: user, capabilities, no-new-privs, umask, read-only tunables', async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces, setpriv)');
    // User dsrlb does not exist here: nobody stands in.
    const umask = one('UMask');
    // StateDirectory and RuntimeDirectory as systemd makes them: owned by the service user.
    const stateDir = join(root, 'var/lib/dsrlb');
    const runDir = join(root, 'run/dsrlb');
    for (const d of [stateDir, runDir]) {
      await mkdir(d, { recursive: true });
      await chown(d, 65534, 65534);
    }
    await chmod(join(root, 'etc/dsrlb/dsrlb.yaml'), 0o644); // root:dsrlb 0640 on a real install
    await chmod(join(root, 'etc/dsrlb/admin.token'), 0o644);
    const token = (await readFile(join(root, 'etc/dsrlb/admin.token'), 'utf8')).trim();
    // The installed config is the sample: drive the daemon with its first named IPv4 service.
    const config = parseYaml(await readFile(join(root, 'etc/dsrlb/dsrlb.yaml'), 'utf8')) as { services: { name?: string; vip: string; reals: { address: string }[] }[] };
    const service = config.services.find((s) => s.name !== undefined && !s.vip.includes(':') && s.reals.length > 0)!;
    expect(service).toBeDefined();
    // Bind mounts in a private mount namespace put them at the unit's paths; the mount points must exist.
    if (!existsSync('/var/lib/dsrlb')) {
      await mkdir('/var/lib/dsrlb');
      createdVarLib = true;
    }
    await mkdir('/run/dsrlb', { recursive: true });
    if (!existsSync('/etc/dsrlb')) {
      await mkdir('/etc/dsrlb');
      createdEtc = true;
    }

    await mustRun('ip', ['netns', 'add', NS]);
    await mustRun('ip', ['-n', NS, 'link', 'set', 'lo', 'up']);
    await mustRun('ip', ['-n', NS, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
    await mustRun('ip', ['-n', NS, 'addr', 'add', '10.0.1.1/24', 'dev', 'eth0']);
    await mustRun('ip', ['-n', NS, 'link', 'set', 'eth0', 'up']);
    await mustRun('ip', ['-n', NS, 'link', 'set', 'eth1', 'up']);

    const script = [
      'set -e',
      'mount --make-rprivate /',
      `mount --bind ${runDir} /run/dsrlb`,
      `mount --bind ${stateDir} /var/lib/dsrlb`,
      `mount --bind ${join(root, 'etc/dsrlb')} /etc/dsrlb`, // the config's absolute tokenFile
      ...(one('ProtectKernelTunables') === 'yes' ? [...READ_ONLY_TUNABLES, ...writableTunables(one('ReadWritePaths'))] : []),
      `umask ${umask}`,
      `exec setpriv --reuid=65534 --regid=65534 --clear-groups ${setprivCaps(one('AmbientCapabilities'))} --no-new-privs` +
        ` ${process.execPath} ${join(root, 'opt/dsrlb/bin/dsrlb.js')} run -c ${join(root, 'etc/dsrlb/dsrlb.yaml')}`,
    ].join('\n');
    // ip netns exec, unshare and sh all exec: the pid is the daemon's.
    const child = spawn('ip', ['netns', 'exec', NS, 'unshare', '-m', 'sh', '-c', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    daemon = child;
    let log = '';
    child.stdout!.on('data', (b: Buffer) => (log += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (log += b.toString()));
    const exited = new Promise<number | null>((done) => child.on('exit', (code) => done(code)));
    const deadline = Date.now() + 20_000;
    while (!log.includes('"msg":"ready"')) {
      if (child.exitCode !== null || Date.now() > deadline) throw new Error(`daemon did not become ready:\n${log}`);
      await new Promise((r) => setTimeout(r, 100));
    }

    const status = await readFile(`/proc/${child.pid}/status`, 'utf8').catch((err: Error) => {
      throw new Error(`daemon gone right after ready (${err.message}); exit ${child.exitCode}:\n${log}`);
    });
    const field = (name: string): string => new RegExp(`^${name}:\\s*(.*)$`, 'm').exec(status)![1]!.trim();
    expect(field('Uid').split(/\s+/)).toEqual(['65534', '65534', '65534', '65534']);
    // CAP_NET_ADMIN is bit 12, CAP_NET_RAW bit 13.
    for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb']) expect(field(set), set).toBe('0000000000003000');
    expect(field('NoNewPrivs')).toBe('1');

    // What needs the capabilities worked: VIPs on lo (ip), the nftables table (nft), the packet socket.
    const lo = await mustRun('ip', ['-n', NS, '-br', 'addr', 'show', 'dev', 'lo']);
    expect(lo).toContain(`${service.vip}/32`);
    // The sample's IPv6 service: its VIP on the interface (IPv6 VIPs go there, see host-setup.ts),
    // and keep_addr_on_down set for the interface through the one writable part of /proc/sys
    // (with all of it read-only the daemon only logged a warning, and a link flap lost the VIP).
    const v6 = config.services.find((s) => s.vip.includes(':'));
    expect(v6).toBeDefined();
    expect(await mustRun('ip', ['-n', NS, '-br', 'addr', 'show', 'dev', 'eth0'])).toContain(`${v6!.vip}/128`);
    const keepAddr = ['netns', 'exec', NS, 'cat', '/proc/sys/net/ipv6/conf/eth0/keep_addr_on_down'];
    expect((await mustRun('ip', keepAddr)).trim()).toBe('1');
    expect(log).toContain('IPv6 addresses now kept when the interface goes down');
    expect(log).not.toContain('could not set keep_addr_on_down');
    expect(await mustRun('ip', ['netns', 'exec', NS, 'nft', 'list', 'tables'])).toContain('table inet dsrlb');
    const metrics = await mustRun('ip', ['netns', 'exec', NS, 'curl', '-sf', 'http://127.0.0.1:9742/metrics']);
    expect(metrics).toMatch(/^dsrlb_flow_table_capacity \d+$/m);
    // Operator intent is written to the state directory, with the unit's umask.
    await mustRun('ip', ['netns', 'exec', NS, 'curl', '-sf', '-X', 'POST', '-H', `Authorization: Bearer ${token}`, `http://127.0.0.1:9743/services/${service.name}/reals/${service.reals[0]!.address}/drain`]);
    const stateFile = join(stateDir, 'dsrlb.state.json');
    expect(await readFile(stateFile, 'utf8')).toContain('"drain"');
    expect((await lstat(stateFile)).mode & 0o777).toBe(0o640);
    expect((await readdir(runDir)).some((f) => /^host-\d+-eth0\.json$/.test(f))).toBe(true);

    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(await mustRun('ip', ['-n', NS, '-br', 'addr', 'show', 'dev', 'lo'])).not.toContain(service.vip);
    // Put back as the host had it.
    expect((await mustRun('ip', keepAddr)).trim()).toBe('0');
    expect(log).toContain('"msg":"dsrlb stopped"');
  }, 60_000);

  it('the installed dsrlb decap runs as dsrlb-decap@eth0.service would: its user and capabilities, TUN up for ExecStartPost, undone on SIGTERM', async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces, setpriv, mknod)');
    const ns = `${PREFIX}rs`;
    const vips = '203.0.113.10,2001:db8::10';
    // systemd reads VIPS from the EnvironmentFile and puts it in for ${VIPS}; the instance is eth0.
    const envFile = `# decap-eth0.env\nVIPS=${vips}\n`;
    const fromEnv = /^VIPS=(.*)$/m.exec(envFile)![1]!;
    const bin = /^BIN_LINK=(\S+)$/m.exec(await readFile(INSTALL, 'utf8'))![1]!;
    const execStart = decapOne('ExecStart')
      .replace(bin, `${process.execPath} ${join(root, 'opt/dsrlb/bin/dsrlb.js')}`)
      .replaceAll('%I', 'eth0')
      .replace('${VIPS}', fromEnv)
      // No options file: systemd puts nothing for an unset $VAR (unbraced).
      .replace(' $DECAP_OPTIONS', '');
    const post = /^\/bin\/sh -c '(.*)'$/.exec(decapOne('ExecStartPost'))![1]!.replaceAll('$$', '$');
    // Where udev runs, /dev/net/tun is 0666 (50-udev-default.rules); here it is 0600: a node with
    // the udev mode is bound over it in the private mount namespace.
    const tun = join(root, 'tun-0666');
    await mustRun('mknod', ['-m', '0666', tun, 'c', '10', '200']);
    // /run/dsrlb as the tmpfiles entry makes it: the service user's (decap keeps its lock there).
    const runDir = join(root, 'run/dsrlb-decap');
    await mkdir(runDir, { recursive: true });
    await chown(runDir, 65534, 65534);
    await mkdir('/run/dsrlb', { recursive: true });
    try {
      await mustRun('ip', ['netns', 'add', ns]);
      await mustRun('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
      await mustRun('ip', ['netns', 'exec', ns, 'sh', '-c', 'ip link set lo up && ip link set eth0 up && ip addr add 203.0.113.10/32 dev lo && echo 1 > /proc/sys/net/ipv4/conf/all/rp_filter']);
      const script = [
        'set -e',
        'mount --make-rprivate /',
        `mount --bind ${tun} /dev/net/tun`,
        `mount --bind ${runDir} /run/dsrlb`,
        ...(decapOne('ProtectKernelTunables') === 'yes' ? [...READ_ONLY_TUNABLES, ...writableTunables(decapOne('ReadWritePaths'))] : []),
        `umask ${decapOne('UMask')}`,
        `exec setpriv --reuid=65534 --regid=65534 --clear-groups ${setprivCaps(decapOne('AmbientCapabilities'))} --no-new-privs ${execStart}`,
      ].join('\n');
      const child = spawn('ip', ['netns', 'exec', ns, 'unshare', '-m', 'sh', '-c', script], { stdio: ['ignore', 'pipe', 'pipe'] });
      let log = '';
      child.stdout!.on('data', (b: Buffer) => (log += b.toString()));
      child.stderr!.on('data', (b: Buffer) => (log += b.toString()));
      const exited = new Promise<number | null>((done) => child.on('exit', (code) => done(code)));
      try {
        // ExecStartPost as the unit runs it (as the service user): it returns once the TUN device is up.
        const ready = await run('ip', ['netns', 'exec', ns, 'setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'sh', '-c', post]);
        expect(ready.code, log).toBe(0);
        // The device is up once complete (addresses, sysctls); decap logs "running" after it opens its sockets.
        for (const deadline = Date.now() + 5000; !log.includes('"msg":"decap running"') && Date.now() < deadline; ) await new Promise((r) => setTimeout(r, 50));
        expect(log).toContain('"msg":"decap running"');
        expect(log).toContain('"interface":"eth0"');
        expect(log).toContain('"vips":["203.0.113.10","2001:db8::10"]');
        const rp = async (dev: string): Promise<string> => (await mustRun('ip', ['netns', 'exec', ns, 'cat', `/proc/sys/net/ipv4/conf/${dev}/rp_filter`])).trim();
        // The operator's strict all.rp_filter stays; the TUN device is loose and holds the dummy address 192.0.0.8.
        expect(await rp('all')).toBe('1');
        expect(await rp('dsrlb-decap0')).toBe('2');
        expect(await mustRun('ip', ['-n', ns, '-4', '-o', 'addr', 'show', 'dev', 'dsrlb-decap0'])).toContain('inet 192.0.0.8/32 scope host');
        child.kill('SIGTERM');
        expect(await exited).toBe(0);
        expect(await rp('all')).toBe('1');
        expect((await run('ip', ['-n', ns, 'link', 'show', 'dev', 'dsrlb-decap0'])).code).not.toBe(0);
      } finally {
        if (child.exitCode === null) child.kill('SIGKILL');
      }
    } finally {
      await run('ip', ['netns', 'del', ns]);
      await rm(tun, { force: true });
    }
  }, 60_000);
});

// ---- Sample config ----

describe('shell scripts', () => {
  it('pass shellcheck as POSIX sh (each deliberate exception annotated in the script)', async () => {
    const scripts = [join(deployDir, 'dsrlb-realserver'), INSTALL, join(repoRoot, 'scripts', 'bootstrap'), join(repoRoot, '.ci', 'run'), join(repoRoot, 'bench', 'setup.sh')];
    const r = await run('shellcheck', ['-s', 'sh', ...scripts]);
    expect(r.stdout + r.stderr).toBe('');
    expect(r.code).toBe(0);
  });
});

describe('dsrlb.yaml.sample', () => {
  it('is the same file as examples/dsrlb.yaml', () => {
    expect(readFileSync(join(repoRoot, 'examples', 'dsrlb.yaml'), 'utf8')).toBe(readFileSync(SAMPLE, 'utf8'));
  });

  it('shows every key the config validator accepts (a commented-out line counts)', () => {
    const validate = readFileSync(join(repoRoot, 'src', 'config', 'validate.ts'), 'utf8');
    const lists = [...validate.matchAll(/^const ([A-Z_]+_KEYS) = \[([^\]]*)\]/gm)];
    expect(lists.map((l) => l[1])).toContain('TOP_KEYS');
    expect(lists.length).toBeGreaterThanOrEqual(10);
    const sample = readFileSync(SAMPLE, 'utf8');
    for (const [, list, body] of lists) {
      const keys = [...body!.matchAll(/'(\w+)'/g)].map((m) => m[1]!);
      expect(keys.length, list).toBeGreaterThan(0);
      for (const key of keys) expect(sample, `${list}: ${key}`).toMatch(new RegExp(`(^|[\\s{,#-])${key}:`, 'm'));
    }
  });
});

// ---- Prometheus ----

describe('prometheus.yml and dsrlb-alerts.yml', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), PREFIX));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('promtool check rules passes', async () => {
    const out = await mustRun('promtool', ['check', 'rules', ALERTS]);
    expect(out).toContain('SUCCESS: 14 rules found');
  });

  it('promtool check config passes, with the rule file found relative to it', async () => {
    const out = await mustRun('promtool', ['check', 'config', 'prometheus.yml'], { cwd: deployDir });
    expect(out).toContain('SUCCESS: 1 rule files found');
    const cfg = parseYaml(await readFile(join(deployDir, 'prometheus.yml'), 'utf8')) as {
      scrape_configs: { job_name: string; static_configs: { targets: string[] }[] }[];
    };
    expect(cfg.scrape_configs.map((s) => [s.job_name, s.static_configs[0]!.targets])).toEqual([['dsrlb', ['127.0.0.1:9742']]]);
  });

  interface Rule {
    alert: string;
    expr: string;
    for?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  }
  const rules = (): Rule[] => (parseYaml(readFileSync(ALERTS, 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

  it('every alert has a severity, a summary and a description, and names only exported metrics', () => {
    const all = rules();
    expect(all.map((r) => r.alert).sort()).toEqual([
      'DsrlbConfigReloadFailed', 'DsrlbDown', 'DsrlbDropTableRestored', 'DsrlbDropsRising', 'DsrlbFlowTableEvicting',
      'DsrlbFlowTableNearFull', 'DsrlbPacketLoopRestarted', 'DsrlbRealDown', 'DsrlbServiceAllRealsDown', 'DsrlbServiceMissingOnSomeLb', 'DsrlbServiceOnBackups', 'DsrlbServicePanic',
      'DsrlbTableFingerprintMismatch', 'DsrlbVipNoLongerAnnounced',
    ]);
    for (const r of all) {
      expect(['warning', 'critical'], r.alert).toContain(r.labels?.['severity']);
      expect(r.annotations?.['summary'], r.alert).toBeTruthy();
      expect((r.annotations?.['description'] ?? '').length, r.alert).toBeGreaterThan(40);
      for (const name of dsrlbNames(r.expr)) expect(known, `${r.alert}: ${name}`).toContain(name);
    }
  });

  it('promtool test rules: each alert fires in its scenario and stays quiet otherwise', async () => {
    // Annotations are checked by `check rules` (templates) and the test above; promtool's unit tests
    // would compare their rendered text, so a copy without them keeps this test on expressions.
    const doc = parseYaml(await readFile(ALERTS, 'utf8')) as { groups: { rules: Rule[] }[] };
    for (const g of doc.groups) for (const r of g.rules) delete r.annotations;
    await writeFile(join(dir, 'alerts.yml'), stringifyYaml(doc));
    const at = 'job="dsrlb", instance="lb1:9742"';
    const lb = { job: 'dsrlb', instance: 'lb1:9742' };
    const alert = (labels: Record<string, string>) => ({ exp_labels: { ...lb, ...labels } });
    const tests = {
      rule_files: ['alerts.yml'],
      evaluation_interval: '1m',
      tests: [
        {
          interval: '1m',
          input_series: [
            { series: `up{${at}}`, values: '1 1 0 0 0 0' },
            // web: .11 active goes down at 2m; .12 is down but drained; .13 stays up.
            { series: `dsrlb_real_up{${at}, service="web", real="10.0.1.11"}`, values: '1 1 0 0 0 0' },
            { series: `dsrlb_real_state{${at}, service="web", real="10.0.1.11", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="web", real="10.0.1.11"}`, values: '1x5' },
            { series: `dsrlb_real_up{${at}, service="web", real="10.0.1.12"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="web", real="10.0.1.12", state="active"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="web", real="10.0.1.12", state="drain"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="web", real="10.0.1.12"}`, values: '1x5' },
            { series: `dsrlb_real_up{${at}, service="web", real="10.0.1.13"}`, values: '1x5' },
            { series: `dsrlb_real_state{${at}, service="web", real="10.0.1.13", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="web", real="10.0.1.13"}`, values: '2x5' },
            { series: `dsrlb_service_panic{${at}, service="web"}`, values: '0x5' },
            // api fails open (panic); dns drops: only dns is "all reals down" without panic.
            { series: `dsrlb_real_up{${at}, service="api", real="10.0.2.11"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="api", real="10.0.2.11", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="api", real="10.0.2.11"}`, values: '1x5' },
            { series: `dsrlb_service_panic{${at}, service="api"}`, values: '0 1 1 1 1 1' },
            { series: `dsrlb_real_up{${at}, service="dns", real="10.0.3.11"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="dns", real="10.0.3.11", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="dns", real="10.0.3.11"}`, values: '1x5' },
            { series: `dsrlb_service_panic{${at}, service="dns"}`, values: '0x5' },
            { series: `dsrlb_service_on_backups{${at}, service="dns"}`, values: '0x5' },
            { series: `dsrlb_service_on_backups{${at}, service="web"}`, values: '0 0 1 1 1 1' },
            // shop drops (no panic): its only wanted real (.11, active, weight 1) goes down at 2m
            // while reals it sends no new flow to are up: .12 drained, .13 disabled, .14 active at
            // weight 0. It counts as all down on lb1; on lb2 its active real stays up (no alert).
            { series: `dsrlb_real_up{${at}, service="shop", real="10.0.4.11"}`, values: '1 1 0 0 0 0' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.11", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="shop", real="10.0.4.11"}`, values: '1x5' },
            { series: `dsrlb_real_up{${at}, service="shop", real="10.0.4.12"}`, values: '1x5' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.12", state="active"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.12", state="drain"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="shop", real="10.0.4.12"}`, values: '1x5' },
            { series: `dsrlb_real_up{${at}, service="shop", real="10.0.4.13"}`, values: '1x5' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.13", state="active"}`, values: '0x5' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.13", state="disabled"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="shop", real="10.0.4.13"}`, values: '1x5' },
            { series: `dsrlb_real_up{${at}, service="shop", real="10.0.4.14"}`, values: '1x5' },
            { series: `dsrlb_real_state{${at}, service="shop", real="10.0.4.14", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{${at}, service="shop", real="10.0.4.14"}`, values: '0x5' },
            { series: `dsrlb_service_panic{${at}, service="shop"}`, values: '0x5' },
            { series: `dsrlb_real_up{job="dsrlb", instance="lb2:9742", service="shop", real="10.0.4.11"}`, values: '1x5' },
            { series: `dsrlb_real_state{job="dsrlb", instance="lb2:9742", service="shop", real="10.0.4.11", state="active"}`, values: '1x5' },
            { series: `dsrlb_real_weight{job="dsrlb", instance="lb2:9742", service="shop", real="10.0.4.11"}`, values: '1x5' },
            { series: `dsrlb_service_panic{job="dsrlb", instance="lb2:9742", service="shop"}`, values: '0x5' },
            // 20 drops/s for neighbor_unknown, 1/s for tx_failed.
            { series: `dsrlb_dropped_packets_total{${at}, reason="neighbor_unknown"}`, values: '0+1200x10' },
            { series: `dsrlb_dropped_packets_total{${at}, reason="tx_failed"}`, values: '0+60x10' },
            { series: `dsrlb_flow_table_entries{${at}}`, values: '500000 950000x10' },
            { series: `dsrlb_flow_table_capacity{${at}}`, values: '1000000x10' },
            { series: `dsrlb_flow_table_evictions_total{${at}}`, values: '0 0 0 10x8' },
            // One loop restart at 2m.
            { series: `dsrlb_loop_restarts_total{${at}}`, values: '0 0 1x30' },
            { series: `dsrlb_drop_table_restored_total{${at}}`, values: '0 0 0 1x30' },
            { series: `dsrlb_config_reloads_total{${at}, result="failure"}`, values: '0 0 1x20' },
            { series: `dsrlb_config_reloads_total{${at}, result="success"}`, values: '0x22' },
            // Refused at 2m, taken again at 6m.
            { series: `dsrlb_config_last_reload_successful{${at}}`, values: '1 1 0 0 0 0 1x16' },
            // Two LBs: the same web table throughout; for api lb2's table differs from 3m on.
            { series: `dsrlb_table_fingerprint{${at}, service="web", fingerprint="aaaa"}`, values: '1x10' },
            { series: `dsrlb_table_fingerprint{job="dsrlb", instance="lb2:9742", service="web", fingerprint="aaaa"}`, values: '1x10' },
            { series: `dsrlb_table_fingerprint{${at}, service="api", fingerprint="bbbb"}`, values: '1x10' },
            { series: `dsrlb_table_fingerprint{job="dsrlb", instance="lb2:9742", service="api", fingerprint="bbbb"}`, values: '1 1 1 _x8' },
            { series: `dsrlb_table_fingerprint{job="dsrlb", instance="lb2:9742", service="api", fingerprint="cccc"}`, values: '_ _ _ 1x7' },
            // web announced, withdrawn from 2m on and still withdrawn 2 h later (announce off: no series).
            { series: `dsrlb_vip_announced{${at}, service="web"}`, values: '1 1 0x130' },
          ],
          alert_rule_test: [
            { eval_time: '1m', alertname: 'DsrlbDown', exp_alerts: [] },
            { eval_time: '4m', alertname: 'DsrlbDown', exp_alerts: [alert({ severity: 'critical' })] },
            // api's and dns's only reals are active and down throughout.
            {
              eval_time: '1m',
              alertname: 'DsrlbRealDown',
              exp_alerts: [alert({ severity: 'warning', service: 'api', real: '10.0.2.11' }), alert({ severity: 'warning', service: 'dns', real: '10.0.3.11' })],
            },
            {
              eval_time: '4m',
              alertname: 'DsrlbRealDown',
              exp_alerts: [
                alert({ severity: 'warning', service: 'web', real: '10.0.1.11' }),
                alert({ severity: 'warning', service: 'api', real: '10.0.2.11' }),
                alert({ severity: 'warning', service: 'dns', real: '10.0.3.11' }),
                alert({ severity: 'warning', service: 'shop', real: '10.0.4.11' }),
              ],
            },
            { eval_time: '4m', alertname: 'DsrlbServicePanic', exp_alerts: [alert({ severity: 'critical', service: 'api' })] },
            { eval_time: '2m', alertname: 'DsrlbServiceOnBackups', exp_alerts: [] },
            { eval_time: '4m', alertname: 'DsrlbServiceOnBackups', exp_alerts: [alert({ severity: 'warning', service: 'web' })] },
            { eval_time: '1m', alertname: 'DsrlbServiceAllRealsDown', exp_alerts: [alert({ severity: 'critical', service: 'dns' })] },
            {
              eval_time: '4m',
              alertname: 'DsrlbServiceAllRealsDown',
              exp_alerts: [alert({ severity: 'critical', service: 'dns' }), alert({ severity: 'critical', service: 'shop' })],
            },
            { eval_time: '3m', alertname: 'DsrlbDropsRising', exp_alerts: [] },
            { eval_time: '8m', alertname: 'DsrlbDropsRising', exp_alerts: [alert({ severity: 'warning', reason: 'neighbor_unknown' })] },
            { eval_time: '3m', alertname: 'DsrlbFlowTableNearFull', exp_alerts: [] },
            { eval_time: '8m', alertname: 'DsrlbFlowTableNearFull', exp_alerts: [alert({ severity: 'warning' })] },
            { eval_time: '1m', alertname: 'DsrlbFlowTableEvicting', exp_alerts: [] },
            { eval_time: '4m', alertname: 'DsrlbFlowTableEvicting', exp_alerts: [alert({ severity: 'warning' })] },
            { eval_time: '10m', alertname: 'DsrlbFlowTableEvicting', exp_alerts: [] },
            { eval_time: '1m', alertname: 'DsrlbPacketLoopRestarted', exp_alerts: [] },
            { eval_time: '3m', alertname: 'DsrlbPacketLoopRestarted', exp_alerts: [alert({ severity: 'warning' })] },
            { eval_time: '20m', alertname: 'DsrlbPacketLoopRestarted', exp_alerts: [] },
            { eval_time: '2m', alertname: 'DsrlbDropTableRestored', exp_alerts: [] },
            { eval_time: '4m', alertname: 'DsrlbDropTableRestored', exp_alerts: [alert({ severity: 'warning' })] },
            { eval_time: '25m', alertname: 'DsrlbDropTableRestored', exp_alerts: [] },
            { eval_time: '1m', alertname: 'DsrlbConfigReloadFailed', exp_alerts: [] },
            { eval_time: '3m', alertname: 'DsrlbConfigReloadFailed', exp_alerts: [alert({ severity: 'warning' })] },
            { eval_time: '7m', alertname: 'DsrlbConfigReloadFailed', exp_alerts: [] },
            { eval_time: '3m', alertname: 'DsrlbTableFingerprintMismatch', exp_alerts: [] },
            { eval_time: '6m', alertname: 'DsrlbTableFingerprintMismatch', exp_alerts: [{ exp_labels: { job: 'dsrlb', service: 'api', severity: 'critical' } }] },
            { eval_time: '5m', alertname: 'DsrlbVipNoLongerAnnounced', exp_alerts: [] },
            { eval_time: '8m', alertname: 'DsrlbVipNoLongerAnnounced', exp_alerts: [alert({ severity: 'warning', service: 'web' })] },
            // It cleared about an hour after the withdrawal, though the VIP was still withdrawn.
            { eval_time: '90m', alertname: 'DsrlbVipNoLongerAnnounced', exp_alerts: [alert({ severity: 'warning', service: 'web' })] },
          ],
        },
        {
          // Two running LBs; lb2's config loses service shop at 2m (web stays on both). lb3 is down
          // and counts for nothing.
          interval: '1m',
          input_series: [
            { series: 'up{job="dsrlb", instance="lb1:9742"}', values: '1x10' },
            { series: 'up{job="dsrlb", instance="lb2:9742"}', values: '1x10' },
            { series: 'up{job="dsrlb", instance="lb3:9742"}', values: '0x10' },
            { series: 'dsrlb_table_fingerprint{job="dsrlb", instance="lb1:9742", service="web", fingerprint="aaaa"}', values: '1x10' },
            { series: 'dsrlb_table_fingerprint{job="dsrlb", instance="lb2:9742", service="web", fingerprint="aaaa"}', values: '1x10' },
            { series: 'dsrlb_table_fingerprint{job="dsrlb", instance="lb1:9742", service="shop", fingerprint="dddd"}', values: '1x10' },
            { series: 'dsrlb_table_fingerprint{job="dsrlb", instance="lb2:9742", service="shop", fingerprint="dddd"}', values: '1 1 stale' },
          ],
          alert_rule_test: [
            { eval_time: '1m', alertname: 'DsrlbServiceMissingOnSomeLb', exp_alerts: [] },
            { eval_time: '3m', alertname: 'DsrlbServiceMissingOnSomeLb', exp_alerts: [] },
            { eval_time: '5m', alertname: 'DsrlbServiceMissingOnSomeLb', exp_alerts: [{ exp_labels: { job: 'dsrlb', service: 'shop', severity: 'critical' } }] },
          ],
        },
      ],
    };
    await writeFile(join(dir, 'alerts-test.yml'), stringifyYaml(tests));
    const r = await run('promtool', ['test', 'rules', 'alerts-test.yml'], { cwd: dir });
    expect(r.stdout + r.stderr).toContain('SUCCESS');
    expect(r.code).toBe(0);
  });
});

// ---- Grafana ----

interface Target {
  expr: string;
  refId: string;
  datasource?: { type: string; uid: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: { type: string; uid: string };
  targets?: Target[];
}
interface Dashboard {
  schemaVersion: number;
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: unknown; datasource?: { uid: string } }[] };
}

describe('grafana-dashboard.json', () => {
  const dash = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as Dashboard;
  const graphs = dash.panels.filter((p) => p.type !== 'row');
  const exprs = graphs.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), PREFIX));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('is a schemaVersion 36+ dashboard whose panels all query ${DS_PROMETHEUS}', () => {
    expect(dash.schemaVersion).toBeGreaterThanOrEqual(36);
    expect(dash.uid).toBe('dsrlb');
    const dsVar = dash.templating.list.find((v) => v.name === 'DS_PROMETHEUS');
    expect(dsVar).toMatchObject({ type: 'datasource', query: 'prometheus' });
    expect(graphs.length).toBeGreaterThanOrEqual(12);
    for (const p of graphs) {
      expect(p.datasource, p.title).toEqual({ type: 'prometheus', uid: '${DS_PROMETHEUS}' });
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
      for (const t of p.targets!) expect(t.datasource?.uid, p.title).toBe('${DS_PROMETHEUS}');
    }
    for (const v of dash.templating.list.filter((x) => x.type === 'query')) expect(v.datasource?.uid).toBe('${DS_PROMETHEUS}');
  });

  it('has unique panel ids and a layout without overlaps inside 24 columns', () => {
    const ids = dash.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    const boxes = dash.panels.map((p) => p.gridPos);
    for (const b of boxes) expect(b.x + b.w).toBeLessThanOrEqual(24);
    for (let i = 0; i < boxes.length; i++) {
      for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i]!;
        const b = boxes[j]!;
        const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
        expect(overlap, `${dash.panels[i]!.title} / ${dash.panels[j]!.title}`).toBe(false);
      }
    }
  });

  it('references only metric names the daemon exports', () => {
    const queries = [...exprs.map((e) => e.expr), ...dash.templating.list.filter((v) => v.type === 'query').map((v) => JSON.stringify(v.query))];
    let count = 0;
    for (const q of queries) {
      for (const name of dsrlbNames(q)) {
        expect(known, `${q}`).toContain(name);
        count++;
      }
    }
    expect(count).toBeGreaterThanOrEqual(30);
  });

  it('shows traffic, flows, health, drops, flow table and reloads', () => {
    const panelFor = (metric: string): Panel[] => graphs.filter((p) => (p.targets ?? []).some((t) => dsrlbNames(t.expr).includes(metric)));
    for (const m of [
      'dsrlb_forwarded_packets_total', 'dsrlb_forwarded_bytes_total', 'dsrlb_flows_active', 'dsrlb_flows_inactive',
      'dsrlb_dropped_packets_total', 'dsrlb_flow_table_entries', 'dsrlb_flow_table_capacity', 'dsrlb_config_reloads_total',
      'dsrlb_service_panic', 'dsrlb_drain_finished', 'dsrlb_healthcheck_failures_total', 'dsrlb_healthcheck_duration_seconds_bucket',
    ]) {
      expect(panelFor(m).length, m).toBeGreaterThan(0);
    }
    expect(panelFor('dsrlb_real_up').map((p) => p.type)).toContain('state-timeline');
    const bits = panelFor('dsrlb_forwarded_bytes_total')[0]!;
    expect(bits.targets![0]!.expr).toMatch(/^8 \* /);
  });

  it('every panel query is valid PromQL (promtool check rules on them as recording rules)', async () => {
    // Grafana's variables become what they expand to: $__rate_interval a duration, a multi-value
    // variable with "All" a regex.
    const substitute = (e: string): string => e.replaceAll('$__rate_interval', '1m').replace(/\$(instance|service|real)\b/g, '.*');
    const rulesDoc = {
      groups: [{ name: 'dashboard', rules: exprs.map((e, i) => ({ record: `dsrlb:dashboard_query:${i}`, expr: substitute(e.expr) })) }],
    };
    for (const r of rulesDoc.groups[0]!.rules) expect(r.expr).not.toContain('$');
    await writeFile(join(dir, 'dashboard-rules.yml'), stringifyYaml(rulesDoc));
    const out = await mustRun('promtool', ['check', 'rules', join(dir, 'dashboard-rules.yml')]);
    expect(out).toContain(`SUCCESS: ${exprs.length} rules found`);
  });
});
