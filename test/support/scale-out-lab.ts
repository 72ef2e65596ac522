// A scale-out lab of network namespaces: a client behind a router, and on one bridged segment
// behind that router several dsrlb LB hosts, each running its own BIRD that announces the VIPs to
// the router's BIRD over eBGP (ECMP there), plus real servers whose default gateway is the router.

import { spawn as spawnChild, execFile, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { dsrlbArgv } from '../../src/cli/command-argv.js';
import { destroyLabsWithPrefix } from '../../src/lab/netns-lab.js';

export const ROOT = resolve(import.meta.dirname, '../..');
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const SEGMENT_PREFIX_LENGTH = 24;
const ROUTER_SEGMENT_ADDR = '10.77.0.1';
const ROUTER_CLIENT_ADDR = '10.78.0.1';
const CLIENT_ADDR = '10.78.0.2';
/** VIPs live in their own range, reached only through the BGP routes (as on a real network). */
export const VIP_NET = '10.79.0.0/24';
const ROUTER_ASN = 65000;
const FIRST_LB_ASN = 65001;
const EXEC_TIMEOUT_MS = 30_000;
const KILL_GRACE_MS = 3000;
const BIRD_READY_TIMEOUT_MS = 10_000;

export interface ExecResult {
  stdout: string;
  stderr: string;
  code: number;
}

export interface Host {
  name: string;
  ns: string;
  /** The address on the segment (router: the reals' and LBs' gateway; client: its own link). */
  ipv4: string;
}

export interface LbHost extends Host {
  asn: number;
  /** Holds this LB's dsrlb config, state file, routes file and BIRD files. */
  dir: string;
  /** announce.routesFile: dsrlb writes it, this LB's BIRD includes it. */
  routesFile: string;
  /** announce.birdSocket: this LB's BIRD control socket. */
  birdSocket: string;
  /** The switch-side end of the LB's cable (a bridge port in the switch namespace). */
  switchPort: string;
}

export interface ScaleOutLabOptions {
  /** Every namespace name starts with it (e.g. `dsrt-so-<pid>-`); 3..40 characters. */
  prefix: string;
  /** LBs lb1..lbN, 2..8; default 2. */
  lbCount?: number;
  /** Reals r1..rN, 1..20; default 3. */
  realCount?: number;
  /** VIPs, each inside VIP_NET (10.79.0.0/24). */
  vips: readonly string[];
}

export class ScaleOutLabError extends Error {
  override name = 'ScaleOutLabError';
}

function run(file: string, args: readonly string[], timeoutMs = EXEC_TIMEOUT_MS): Promise<ExecResult> {
  return new Promise((done, reject) => {
    execFile(file, args, { encoding: 'utf8', timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err === null) return done({ stdout, stderr, code: 0 });
      const e = err as NodeJS.ErrnoException & { code?: number | string; signal?: string | null };
      if (typeof e.code === 'number') done({ stdout, stderr, code: e.code });
      else if (e.signal) done({ stdout, stderr, code: 137 });
      else reject(new ScaleOutLabError(`cannot run ${file}: ${e.message}`));
    });
  });
}

async function must(file: string, args: readonly string[]): Promise<string> {
  const r = await run(file, args);
  if (r.code !== 0) throw new ScaleOutLabError(`${file} ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

/** Replaces each `^key ...$` line of a shipped config once; throws when the file has no such line. */
export function substituteLines(text: string, lines: Readonly<Record<string, string>>): string {
  let out = text;
  for (const [start, line] of Object.entries(lines)) {
    const re = new RegExp(`^${start.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*$`, 'gm');
    const hits = out.match(re)?.length ?? 0;
    if (hits !== 1) throw new ScaleOutLabError(`expected one line starting "${start}" in the BIRD config, found ${hits}`);
    out = out.replace(re, line);
  }
  return out;
}

/** Sets every `bfd on;`/`bfd off;` line of a BIRD config. */
export function withBfd(text: string, bfd: boolean): string {
  const re = /^(\s*)bfd (on|off);$/gm;
  if (!re.test(text)) throw new ScaleOutLabError('no "bfd on;" line in the BIRD config');
  return text.replace(re, `$1bfd ${bfd ? 'on' : 'off'};`);
}

/** A BIRD 2 daemon in the foreground inside a namespace, with its own socket, pid file and config. */
export class BirdProcess {
  readonly logs: string[] = [];
  private constructor(
    readonly proc: ChildProcess,
    readonly configPath: string,
    readonly socketPath: string,
  ) {}

  static async start(lab: ScaleOutLab, ns: string, configPath: string, socketPath: string, pidPath: string): Promise<BirdProcess> {
    await rm(socketPath, { force: true });
    const proc = lab.spawn(ns, ['bird', '-f', '-c', configPath, '-s', socketPath, '-P', pidPath], { stdio: ['ignore', 'pipe', 'pipe'] });
    const b = new BirdProcess(proc, configPath, socketPath);
    createInterface({ input: proc.stdout! }).on('line', (l) => b.logs.push(l));
    createInterface({ input: proc.stderr! }).on('line', (l) => b.logs.push(l));
    const deadline = Date.now() + BIRD_READY_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new ScaleOutLabError(`bird in ${ns} exited ${proc.exitCode}:\n${b.logs.join('\n')}`);
      if (existsSync(socketPath) && (await b.birdc(['show', 'status'])).code === 0) return b;
      await sleep(100);
    }
    throw new ScaleOutLabError(`bird in ${ns} not ready after ${BIRD_READY_TIMEOUT_MS} ms:\n${b.logs.join('\n')}`);
  }

  birdc(args: readonly string[]): Promise<ExecResult> {
    return run('birdc', ['-s', this.socketPath, ...args]);
  }

  /** Writes a new config and has BIRD take it (`birdc configure`). */
  async reconfigure(text: string): Promise<void> {
    await writeFile(this.configPath, text);
    const r = await this.birdc(['configure']);
    if (r.code !== 0 || !/Reconfigured|Reconfiguration in progress/.test(r.stdout)) {
      throw new ScaleOutLabError(`birdc configure: ${r.stdout}${r.stderr}`);
    }
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (!this.running) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    this.proc.kill(signal);
    await exited;
  }
}

export interface ServiceStatus {
  name: string;
  panic: boolean;
  dropping: boolean;
  tableFingerprint: string;
  announced: boolean;
  announceDevice: string | null;
  reals: { address: string; intent: string; weight: number; mac: string | null; health: { state: string } }[];
}
export interface Status {
  services: ServiceStatus[];
}

/** `dsrlb run` in an LB's namespace, driven through its admin API and metrics from inside. */
export class LbDaemon {
  readonly logs: string[] = [];
  exitedAtMs: number | null = null;
  private constructor(
    readonly lab: ScaleOutLab,
    readonly lb: LbHost,
    readonly proc: ChildProcess,
  ) {
    proc.once('exit', () => {
      this.exitedAtMs = Date.now();
    });
  }

  /** Starts dsrlb; resolves once its admin API answers and `ready(status)` holds. */
  static async start(lab: ScaleOutLab, lb: LbHost, configPath: string, ready: (s: Status) => boolean): Promise<LbDaemon> {
    const proc = lab.spawn(lb.ns, [...dsrlbArgv(ROOT), 'run', '-c', configPath], { stdio: ['ignore', 'pipe', 'pipe'] });
    const d = new LbDaemon(lab, lb, proc);
    createInterface({ input: proc.stdout! }).on('line', (l) => d.logs.push(l));
    createInterface({ input: proc.stderr! }).on('line', (l) => d.logs.push(`stderr: ${l}`));
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new ScaleOutLabError(`dsrlb in ${lb.ns} exited ${proc.exitCode}:\n${d.logs.join('\n')}`);
      const s = await d.status().catch(() => null);
      if (s && ready(s)) return d;
      await sleep(200);
    }
    throw new ScaleOutLabError(`dsrlb in ${lb.ns} did not become ready:\n${d.logs.slice(-40).join('\n')}`);
  }

  async status(): Promise<Status> {
    const r = await this.lab.exec(this.lb.ns, ['curl', '-sf', 'http://127.0.0.1:9743/status']);
    if (r.code !== 0) throw new ScaleOutLabError(`status from ${this.lb.name}: curl exit ${r.code}`);
    return JSON.parse(r.stdout) as Status;
  }

  /** Resolves once `ok(status)` holds; throws (with the last log lines) after timeoutMs. */
  async waitFor(what: string, ok: (s: Status) => boolean, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (ok(await this.status())) return;
      await sleep(50);
    }
    throw new ScaleOutLabError(`${this.lb.name}: not ${what} within ${timeoutMs} ms:\n${this.logs.slice(-20).join('\n')}`);
  }

  async service(name: string): Promise<ServiceStatus> {
    const s = (await this.status()).services.find((x) => x.name === name);
    if (!s) throw new ScaleOutLabError(`${this.lb.name}: no service ${name} in status`);
    return s;
  }

  async metrics(): Promise<string> {
    const r = await this.lab.exec(this.lb.ns, ['curl', '-sf', 'http://127.0.0.1:9742/metrics']);
    if (r.code !== 0) throw new ScaleOutLabError(`metrics from ${this.lb.name}: curl exit ${r.code}`);
    return r.stdout;
  }

  /** Runs the dsrlb CLI inside this LB's namespace against its admin API. */
  cli(args: readonly string[]): Promise<ExecResult> {
    return this.lab.exec(this.lb.ns, [...dsrlbArgv(ROOT), ...args, '--admin', 'http://127.0.0.1:9743']);
  }

  get running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** Sends the signal and resolves with the exit code once the process is gone. */
  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<number | null> {
    if (!this.running) return this.proc.exitCode;
    const exited = new Promise<number | null>((r) => this.proc.once('exit', (code) => r(code)));
    this.proc.kill(signal);
    return exited;
  }
}

/** Sum of every sample of a metric whose label set contains `labelsInclude` (e.g. `service="web"`). */
export function metricSum(text: string, name: string, labelsInclude = ''): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (labelsInclude !== '' && !line.includes(labelsInclude)) continue;
    sum += Number(line.split(' ').pop());
  }
  return sum;
}

export class ScaleOutLab {
  readonly httpServers = new Map<string, ChildProcess>();
  readonly routerAsn = ROUTER_ASN;
  routerBird: BirdProcess | null = null;
  readonly lbBirds = new Map<string, BirdProcess>();
  private readonly children = new Set<ChildProcess>();

  private constructor(
    readonly prefix: string,
    readonly dir: string,
    readonly switchNs: string,
    readonly router: Host,
    readonly client: Host,
    readonly lbs: readonly LbHost[],
    readonly reals: readonly Host[],
    readonly vips: readonly string[],
  ) {}

  /** Builds the namespaces, links and sysctls; on failure removes what it made and rethrows. */
  static async create(opts: ScaleOutLabOptions): Promise<ScaleOutLab> {
    const p = opts.prefix;
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{2,39}$/.test(p)) throw new ScaleOutLabError(`prefix "${p}": want 3..40 of A-Z a-z 0-9 _ . -`);
    const lbCount = opts.lbCount ?? 2;
    const realCount = opts.realCount ?? 3;
    if (lbCount < 2 || lbCount > 8 || realCount < 1 || realCount > 20) throw new ScaleOutLabError('want 2..8 LBs and 1..20 reals');
    for (const v of opts.vips) {
      if (!/^10\.79\.0\.\d{1,3}$/.test(v)) throw new ScaleOutLabError(`vip ${v}: must be inside ${VIP_NET}`);
    }
    for (const tool of ['bird', 'birdc', 'tcpdump', 'curl', 'nft']) {
      if ((await run('sh', ['-c', `command -v ${tool}`])).code !== 0) {
        throw new ScaleOutLabError(`${tool} not found: run scripts/bootstrap (it installs bird2, tcpdump, curl, nftables)`);
      }
    }
    await destroyLabsWithPrefix(p);
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-scale-out-'));
    const ns = (name: string): string => `${p}${name}`;
    const switchNs = ns('sw');
    const router: Host = { name: 'rt', ns: ns('rt'), ipv4: ROUTER_SEGMENT_ADDR };
    const client: Host = { name: 'c', ns: ns('c'), ipv4: CLIENT_ADDR };
    const lbs: LbHost[] = [];
    for (let i = 1; i <= lbCount; i++) {
      const lbDir = join(dir, `lb${i}`);
      lbs.push({
        name: `lb${i}`,
        ns: ns(`lb${i}`),
        ipv4: `10.77.0.${1 + i}`,
        asn: FIRST_LB_ASN + i - 1,
        dir: lbDir,
        routesFile: join(lbDir, 'bird-routes.conf'),
        birdSocket: join(lbDir, 'bird.ctl'),
        switchPort: `sw-lb${i}`,
      });
    }
    const reals: Host[] = [];
    for (let i = 1; i <= realCount; i++) reals.push({ name: `r${i}`, ns: ns(`r${i}`), ipv4: `10.77.0.${10 + i}` });
    const lab = new ScaleOutLab(p, dir, switchNs, router, client, lbs, reals, [...opts.vips]);
    try {
      await lab.build();
    } catch (err) {
      await lab.destroy().catch(() => undefined);
      throw err;
    }
    return lab;
  }

  private async build(): Promise<void> {
    const sw = this.switchNs;
    const segmentHosts: Host[] = [this.router, ...this.lbs, ...this.reals];
    for (const n of [sw, this.client.ns, ...segmentHosts.map((h) => h.ns)]) {
      await must('ip', ['netns', 'add', n]);
      await must('ip', ['-n', n, 'link', 'set', 'lo', 'up']);
    }
    for (const lb of this.lbs) await mkdir(lb.dir, { recursive: true });
    await must('ip', ['-n', sw, 'link', 'add', 'br0', 'type', 'bridge', 'stp_state', '0', 'mcast_snooping', '0']);
    await must('ip', ['-n', sw, 'link', 'set', 'br0', 'up']);
    for (const family of ['iptables', 'ip6tables', 'arptables']) {
      if (existsSync(`/proc/sys/net/bridge/bridge-nf-call-${family}`)) {
        await run('ip', ['netns', 'exec', sw, 'sysctl', '-qw', `net.bridge.bridge-nf-call-${family}=0`]);
      }
    }
    // Each segment host's eth0 is a veth whose peer sw-<name> is a bridge port (created in the
    // switch namespace, so no name ever exists in the root namespace).
    for (const h of segmentHosts) {
      await must('ip', ['-n', sw, 'link', 'add', `sw-${h.name}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', h.ns]);
      await must('ip', ['-n', sw, 'link', 'set', `sw-${h.name}`, 'master', 'br0', 'up']);
      await must('ip', ['-n', h.ns, 'addr', 'add', `${h.ipv4}/${SEGMENT_PREFIX_LENGTH}`, 'dev', 'eth0']);
      await must('ip', ['-n', h.ns, 'link', 'set', 'eth0', 'up']);
    }
    // The client's only link goes to the router (eth1 there).
    await must('ip', ['-n', this.router.ns, 'link', 'add', 'eth1', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.client.ns]);
    await must('ip', ['-n', this.router.ns, 'addr', 'add', `${ROUTER_CLIENT_ADDR}/24`, 'dev', 'eth1']);
    await must('ip', ['-n', this.router.ns, 'link', 'set', 'eth1', 'up']);
    await must('ip', ['-n', this.client.ns, 'addr', 'add', `${CLIENT_ADDR}/24`, 'dev', 'eth0']);
    await must('ip', ['-n', this.client.ns, 'link', 'set', 'eth0', 'up']);
    await must('ip', ['-n', this.client.ns, 'route', 'add', 'default', 'via', ROUTER_CLIENT_ADDR]);
    // Reals and LBs send everything off-segment to the router, never through an LB.
    for (const h of [...this.lbs, ...this.reals]) await must('ip', ['-n', h.ns, 'route', 'add', 'default', 'via', ROUTER_SEGMENT_ADDR]);
    // Router: forwarding; loose rp_filter (replies from the reals carry the VIP as source);
    // ECMP hash on the 5-tuple (policy 3 = the fields below: src/dst IP, proto, src/dst port),
    // since veth frames carry no L4 hash the kernel could reuse.
    const sysctls = [
      'net.ipv4.ip_forward=1',
      'net.ipv4.conf.all.rp_filter=2',
      'net.ipv4.conf.default.rp_filter=2',
      'net.ipv4.conf.eth0.rp_filter=2',
      'net.ipv4.conf.eth1.rp_filter=2',
      'net.ipv4.fib_multipath_hash_policy=3',
      'net.ipv4.fib_multipath_hash_fields=0x37',
    ];
    await must('ip', ['netns', 'exec', this.router.ns, 'sysctl', '-qw', ...sysctls]);
    const script = join(ROOT, 'deploy', 'linux', 'dsrlb-realserver');
    await Promise.all(
      this.reals.map(async (r) => {
        const res = await run('ip', ['netns', 'exec', r.ns, 'sh', script, 'setup', '--vip', this.vips.join(',')]);
        if (res.code !== 0) throw new ScaleOutLabError(`dsrlb-realserver setup in ${r.ns}: ${(res.stderr + res.stdout).trim()}`);
      }),
    );
  }

  exec(ns: string, argv: readonly string[], opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    return run('ip', ['netns', 'exec', ns, ...argv], opts.timeoutMs ?? EXEC_TIMEOUT_MS);
  }

  /** Starts argv in a namespace (`ip netns exec` execs in place: the child's pid is the command's). */
  spawn(ns: string, argv: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    const child = spawnChild('ip', ['netns', 'exec', ns, ...argv], opts);
    this.children.add(child);
    child.once('exit', () => this.children.delete(child));
    child.once('error', () => this.children.delete(child));
    return child;
  }

  /** The lab HTTP server on every real, listening on each VIP and the real's own address. */
  async startHttpServers(): Promise<void> {
    const script = join(ROOT, 'dist', 'lab', 'real-http-server.js');
    if (!existsSync(script)) throw new ScaleOutLabError(`${script} not found: build first (npx tsc -p tsconfig.json)`);
    await Promise.all(
      this.reals.map(async (r) => {
        const p = this.spawn(r.ns, [process.execPath, script, '--name', r.name, '--host', [...this.vips, r.ipv4].join(','), '--port', '80'], {
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        this.httpServers.set(r.name, p);
        await new Promise<void>((done, reject) => {
          createInterface({ input: p.stdout! }).on('line', (l) => {
            if (l.includes('"ready"')) done();
          });
          p.once('exit', (c) => reject(new ScaleOutLabError(`HTTP server on ${r.name} exited ${c}`)));
        });
      }),
    );
  }

  /** deploy/linux/bird/router-bird.conf with this lab's addresses (one `bgp lbN` per LB). */
  routerBirdConfig(bfd: boolean): string {
    const shipped = readFileSync(join(ROOT, 'deploy', 'linux', 'bird', 'router-bird.conf'), 'utf8');
    const [lb1, lb2, ...more] = this.lbs as [LbHost, LbHost, ...LbHost[]];
    let text = substituteLines(shipped, {
      'define ROUTER_ADDR =': `define ROUTER_ADDR = ${ROUTER_SEGMENT_ADDR};`,
      'define ROUTER_ASN =': `define ROUTER_ASN = ${ROUTER_ASN};`,
      'define LB1_ADDR =': `define LB1_ADDR = ${lb1.ipv4};`,
      'define LB1_ASN =': `define LB1_ASN = ${lb1.asn};`,
      'define LB2_ADDR =': `define LB2_ADDR = ${lb2.ipv4};`,
      'define LB2_ASN =': `define LB2_ASN = ${lb2.asn};`,
      'define VIP_NETS =': `define VIP_NETS = [ ${VIP_NET}{32,32} ];`,
    });
    for (const lb of more) text += `\nprotocol bgp ${lb.name} from dsrlb_lb {\n\tneighbor ${lb.ipv4} as ${lb.asn};\n}\n`;
    return withBfd(text, bfd);
  }

  /** deploy/linux/bird/lb-bird.conf for one LB, including that LB's dsrlb routes file. */
  lbBirdConfig(lb: LbHost, bfd: boolean): string {
    const shipped = readFileSync(join(ROOT, 'deploy', 'linux', 'bird', 'lb-bird.conf'), 'utf8');
    const text = substituteLines(shipped, {
      'define LB_ADDR =': `define LB_ADDR = ${lb.ipv4};`,
      'define LB_ASN =': `define LB_ASN = ${lb.asn};`,
      'define ROUTER_ADDR =': `define ROUTER_ADDR = ${ROUTER_SEGMENT_ADDR};`,
      'define ROUTER_ASN =': `define ROUTER_ASN = ${ROUTER_ASN};`,
      // The shipped glob ([f]) tolerates a missing file; keep that with the lab's path.
      'include "/run/dsrlb/bird-routes.con[f]";': `include "${lb.routesFile.replace(/f$/, '[f]')}";`,
    });
    return withBfd(text, bfd);
  }

  async startRouterBird(bfd = true): Promise<BirdProcess> {
    const conf = join(this.dir, 'router-bird.conf');
    await writeFile(conf, this.routerBirdConfig(bfd));
    this.routerBird = await BirdProcess.start(this, this.router.ns, conf, join(this.dir, 'router-bird.ctl'), join(this.dir, 'router-bird.pid'));
    return this.routerBird;
  }

  async startLbBird(lb: LbHost, bfd = true): Promise<BirdProcess> {
    const conf = join(lb.dir, 'bird.conf');
    await writeFile(conf, this.lbBirdConfig(lb, bfd));
    const b = await BirdProcess.start(this, lb.ns, conf, lb.birdSocket, join(lb.dir, 'bird.pid'));
    this.lbBirds.set(lb.name, b);
    return b;
  }

  /** The BGP session state towards one LB as the router's BIRD sees it (e.g. "Established"). */
  async routerSessionState(lb: LbHost): Promise<string> {
    if (!this.routerBird) return 'no router BIRD';
    const r = await this.routerBird.birdc(['show', 'protocols', lb.name]);
    const line = r.stdout.split('\n').find((l) => l.startsWith(`${lb.name} `)) ?? '';
    return line.trim().split(/\s+/)[5] ?? line;
  }

  /** The gateways of the router's kernel route to `vip`, sorted ([] when it has none). */
  async nexthops(vip: string): Promise<string[]> {
    const r = await run('ip', ['-n', this.router.ns, '-j', 'route', 'show', `${vip}/32`]);
    if (r.code !== 0) throw new ScaleOutLabError(`ip route show ${vip}: ${r.stderr}`);
    const routes = JSON.parse(r.stdout || '[]') as { gateway?: string; nexthops?: { gateway?: string }[] }[];
    const out: string[] = [];
    for (const route of routes) {
      if (route.gateway) out.push(route.gateway);
      for (const nh of route.nexthops ?? []) if (nh.gateway) out.push(nh.gateway);
    }
    return out.sort();
  }

  /**
   * Polls the router's route to `vip` every `pollMs` until its gateways are exactly `want`
   * (LB addresses); resolves with the time that took from `sinceMs` (default: now).
   */
  async waitForNexthops(vip: string, want: readonly string[], timeoutMs: number, opts: { pollMs?: number; sinceMs?: number } = {}): Promise<number> {
    const since = opts.sinceMs ?? Date.now();
    const wanted = [...want].sort().join(',');
    let last: string[] = [];
    while (Date.now() - since < timeoutMs) {
      last = await this.nexthops(vip);
      if (last.join(',') === wanted) return Date.now() - since;
      await sleep(opts.pollMs ?? 20);
    }
    const sessions = await Promise.all(this.lbs.map(async (lb) => `${lb.name}=${await this.routerSessionState(lb)}`));
    throw new ScaleOutLabError(`router route to ${vip}: want nexthops [${wanted}], still [${last.join(',')}] after ${timeoutMs} ms (BGP ${sessions.join(' ')})`);
  }

  /**
   * Records every change of the router's routes (`ip monitor route`), one string per route with
   * its nexthops joined in (multipath routes print as a first line and indented nexthop lines).
   */
  async monitorRoutes(): Promise<{ stop(): Promise<string[]> }> {
    const p = this.spawn(this.router.ns, ['ip', 'monitor', 'route'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const records: string[] = [];
    createInterface({ input: p.stdout! }).on('line', (line) => {
      if (/^\s/.test(line) && records.length > 0) records[records.length - 1] += ` ${line.trim()}`;
      else records.push(line);
    });
    // ip monitor prints nothing when it is ready: give it time to open its netlink socket.
    await sleep(300);
    return {
      stop: async () => {
        await sleep(200);
        const exited = new Promise((r) => p.once('exit', r));
        p.kill('SIGTERM');
        await exited;
        return records;
      },
    };
  }

  /**
   * Makes an LB host go silent (or come back) as a frozen or powered-off host does: the switch
   * drops every frame to and from its port, so no FIN and no BFD packet leaves it. The port stays
   * up and keeps its MAC in the bridge's table: taking the link down instead would flush that
   * entry and flood the LB's frames to every port, the other LBs included.
   */
  async setLbSilent(lb: LbHost, silent: boolean): Promise<void> {
    const table = `dsrt_cut_${lb.name}`;
    if (silent) {
      const rules = `table bridge ${table} {\n\tchain cut {\n\t\ttype filter hook forward priority 0; policy accept;\n\t\tiifname "${lb.switchPort}" drop\n\t\toifname "${lb.switchPort}" drop\n\t}\n}\n`;
      const r = await new Promise<ExecResult>((done) => {
        const child = execFile('ip', ['netns', 'exec', this.switchNs, 'nft', '-f', '-'], { encoding: 'utf8' }, (err, stdout, stderr) =>
          done({ stdout, stderr, code: err === null ? 0 : 1 }),
        );
        child.stdin!.end(rules);
      });
      if (r.code !== 0) throw new ScaleOutLabError(`nft in ${this.switchNs}: ${r.stderr}`);
    } else {
      await run('ip', ['netns', 'exec', this.switchNs, 'nft', 'delete', 'table', 'bridge', table]);
    }
  }

  /** Kills every process started here, then whatever else lives in the namespaces, and deletes them. */
  async destroy(): Promise<void> {
    await Promise.all(
      [...this.children].map(
        (c) =>
          new Promise<void>((done) => {
            if (c.exitCode !== null || c.signalCode !== null) return done();
            const t = setTimeout(() => c.kill('SIGKILL'), KILL_GRACE_MS);
            c.once('exit', () => {
              clearTimeout(t);
              done();
            });
            c.kill('SIGTERM');
          }),
      ),
    );
    this.httpServers.clear();
    try {
      await destroyLabsWithPrefix(this.prefix);
    } finally {
      await rm(this.dir, { recursive: true, force: true });
    }
  }
}

export interface CountResult {
  ok: number;
  failed: number;
  byReal: Record<string, number>;
  distinctPorts: number;
  errors: Record<string, number>;
}

/** `n` HTTP requests from the client, each on a new connection (dist/lab/http-client.js --count). */
export async function httpCount(lab: ScaleOutLab, vip: string, n: number, opts: { concurrency?: number; timeoutMs?: number } = {}): Promise<CountResult> {
  const args = [process.execPath, join(ROOT, 'dist/lab/http-client.js'), '--host', vip, '--count', String(n)];
  if (opts.concurrency) args.push('--concurrency', String(opts.concurrency));
  if (opts.timeoutMs) args.push('--timeout', String(opts.timeoutMs));
  const r = await lab.exec(lab.client.ns, args, { timeoutMs: 180_000 });
  if (r.code !== 0) throw new ScaleOutLabError(`http-client: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as CountResult;
}


/** A running tcpdump; stop() ends it and returns its lines, each starting with epoch seconds (-tt). */
export interface Capture {
  stop(): Promise<string[]>;
}

/** Starts tcpdump on `ifname` in a namespace with a pcap filter; resolves once it listens. */
export async function startCapture(lab: ScaleOutLab, ns: string, ifname: string, filter: readonly string[]): Promise<Capture> {
  const p = lab.spawn(ns, ['tcpdump', '-i', ifname, '-nn', '-l', '-tt', '--immediate-mode', ...filter], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  createInterface({ input: p.stdout! }).on('line', (l) => lines.push(l));
  // tcpdump says "listening on" once the capture is open: traffic before that would be missed.
  await new Promise<void>((done, reject) => {
    const t = setTimeout(() => reject(new ScaleOutLabError(`tcpdump in ${ns} did not start`)), 10_000);
    createInterface({ input: p.stderr! }).on('line', (l) => {
      if (l.includes('listening on')) {
        clearTimeout(t);
        done();
      }
    });
    p.once('exit', (c) => reject(new ScaleOutLabError(`tcpdump in ${ns} exited ${c}`)));
  });
  return {
    stop: async () => {
      await sleep(300);
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGTERM');
      await exited;
      return lines;
    },
  };
}

/** Counts IPv4 frames with source `vip` on an LB's eth0 (replies that crossed the LB: DSR wants none). */
export async function captureVipSourced(lab: ScaleOutLab, lb: LbHost, vip: string): Promise<{ stop: () => Promise<number> }> {
  const c = await startCapture(lab, lb.ns, 'eth0', ['ip', 'and', 'src', 'host', vip]);
  return { stop: async () => (await c.stop()).filter((l) => l.includes(' IP ')).length };
}

/** One TCP segment from a `tcpdump -nn -tt` line: time (ms), endpoints and flags (e.g. "S", "S."). */
export interface Segment {
  atMs: number;
  from: string;
  to: string;
  flags: string;
}

export function parseSegment(line: string): Segment | null {
  const m = /^(\d+\.\d+) .*?IP (\S+) > (\S+): Flags \[([^\]]+)\]/.exec(line);
  if (!m) return null;
  return { atMs: Math.round(Number(m[1]) * 1000), from: m[2]!, to: m[3]!.replace(/:$/, ''), flags: m[4]! };
}

/** Absolute TCP counters of a namespace (nstat -as: no history file touched), e.g. TcpExtTCPSynRetrans. */
export async function tcpCounters(lab: ScaleOutLab, ns: string, names: readonly string[]): Promise<Record<string, number>> {
  const r = await lab.exec(ns, ['nstat', '-asz', ...names]);
  if (r.code !== 0) throw new ScaleOutLabError(`nstat in ${ns}: ${r.stderr}`);
  const out: Record<string, number> = {};
  for (const name of names) out[name] = 0;
  for (const line of r.stdout.split('\n')) {
    const [name, value] = line.trim().split(/\s+/);
    if (name !== undefined && name in out) out[name] = Number(value);
  }
  return out;
}
