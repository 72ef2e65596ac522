// A lab of network namespaces on one L2 segment (a bridge in its own namespace): a client, the LB
// host and N real servers provisioned with deploy/linux/dsrlb-realserver. Used by `dsrlb demo` and
// the integration tests; it never starts dsrlb itself. Control plane only: shells out to `ip`.

import { execFile, spawn as spawnChild, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { constants as osConstants } from 'node:os';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RUN_DIR } from '../control/host-setup.js';

export interface LabOptions {
  /** Every namespace name starts with it; unique per lab (e.g. `dsrt-lab-<pid>-`). */
  prefix: string;
  /** Real servers r1..rN, 1..50. */
  realCount: number;
  /** IPv4 segment, prefix length 8..24; default 10.77.0.0/24. */
  subnet?: string;
  /** Default: the subnet's .100 (10.77.0.100). */
  vip?: string;
  /** Also give every host an address in fd77::/64 (nodad) and the reals the IPv6 VIP. */
  ipv6?: boolean;
  /** Default fd77::100. */
  vip6?: string;
  /** Checkout holding deploy/ and dist/; default: two levels above this module. */
  repoRoot?: string;
}

export interface LabHost {
  /** Short name: `c`, `lb`, `r1`.. (also the HTTP server's --name on reals). */
  name: string;
  /** The host's network namespace. */
  ns: string;
  /** The interface on the segment, inside `ns`. */
  ifname: 'eth0';
  ipv4: string;
  /** Set when the lab has `ipv6`. */
  ipv6: string | null;
  /** eth0's MAC address, lower-case `aa:bb:..`. */
  mac: string;
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  /** Exit code; 128 + signal number when a signal ended it (the shell's convention). */
  code: number;
}

export interface ExecOptions {
  /** Kill the command (SIGKILL) after this long; default 30 s. */
  timeoutMs?: number;
}

export interface StartHttpServersOptions {
  /** Default 80. */
  port?: number;
  /** How long each server may take to print its ready line; default 15 s. */
  readyTimeoutMs?: number;
}

export interface Lab {
  readonly prefix: string;
  /** The IPv4 segment, e.g. `10.77.0.0/24`. */
  readonly subnet: string;
  readonly prefixLength: number;
  readonly vip: string;
  /** Set when the lab has `ipv6`. */
  readonly vip6: string | null;
  /** The IPv6 segment when the lab has `ipv6` (`fd77::/64`). */
  readonly subnet6: string | null;
  /** The namespace holding the bridge `br0`. */
  readonly switchNs: string;
  readonly client: LabHost;
  readonly lb: LabHost;
  readonly reals: readonly LabHost[];
  /** Every namespace of the lab, switch first. */
  readonly namespaces: readonly string[];
  /** The HTTP server process of each real, by real name, once startHttpServers ran. */
  readonly httpServers: ReadonlyMap<string, ChildProcess>;
  /** Runs argv inside a namespace (a name or a host); never rejects on a non-zero exit. */
  exec(ns: string | LabHost, argv: readonly string[], opts?: ExecOptions): Promise<ExecResult>;
  /** Starts argv inside a namespace; the process is killed by destroy(). */
  spawn(ns: string | LabHost, argv: readonly string[], opts?: SpawnOptions): ChildProcess;
  /** Starts real-http-server on every real (on the VIPs and the real's own addresses), waits for each ready line. */
  startHttpServers(opts?: StartHttpServersOptions): Promise<void>;
  /** The namespaces that exist now with the lab's prefix, sorted. */
  listNamespaces(): Promise<string[]>;
  /** Kills every process spawned here, then everything left in the namespaces, and deletes them. */
  destroy(): Promise<void>;
}

const DEFAULT_SUBNET = '10.77.0.0/24';
const SUBNET6 = 'fd77::/64';
const DEFAULT_VIP6 = 'fd77::100';
const LB_HOST_OFFSET = 2;
const CLIENT_HOST_OFFSET = 10;
const FIRST_REAL_HOST_OFFSET = 11;
const VIP_HOST_OFFSET = 100;
const MAX_REALS = 50;
const KILL_GRACE_MS = 3000;
const EXEC_TIMEOUT_MS = 30_000;
/** Where dsrlb-realserver keeps its per-namespace state (see that script's state_file). */
const REALSERVER_STATE_DIR = '/run/dsrlb-realserver';

export class LabError extends Error {
  override name = 'LabError';
}

function defaultRepoRoot(): string {
  // src/lab/netns-lab.ts and dist/lab/netns-lab.js both sit two levels below the checkout.
  return resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
}

function ipv4ToInt(text: string): number | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  let value = 0;
  for (const p of parts) {
    if (!/^(0|[1-9]\d{0,2})$/.test(p) || Number(p) > 255) return null;
    value = value * 256 + Number(p);
  }
  return value;
}

function intToIpv4(value: number): string {
  return [value >>> 24, (value >>> 16) & 255, (value >>> 8) & 255, value & 255].join('.');
}

function signalExitCode(signal: NodeJS.Signals | null | undefined): number {
  const signo = signal ? osConstants.signals[signal] : undefined;
  return signo === undefined ? 1 : 128 + signo;
}

/** Runs a program; rejects only when it cannot be started (e.g. ENOENT). */
function run(file: string, args: readonly string[], timeoutMs = EXEC_TIMEOUT_MS): Promise<ExecResult> {
  return new Promise((resolvePromise, reject) => {
    execFile(
      file,
      args,
      { maxBuffer: 256 * 1024 * 1024, timeout: timeoutMs, killSignal: 'SIGKILL', encoding: 'utf8' },
      (err, stdout, stderr) => {
        if (err === null) {
          resolvePromise({ stdout, stderr, code: 0 });
          return;
        }
        const e = err as NodeJS.ErrnoException & { code?: number | string; signal?: NodeJS.Signals | null };
        if (typeof e.code === 'number') resolvePromise({ stdout, stderr, code: e.code });
        else if (e.signal) resolvePromise({ stdout, stderr, code: signalExitCode(e.signal) });
        else reject(new LabError(`cannot run ${file}: ${e.message}`));
      },
    );
  });
}

/** Runs `ip ARGS` and throws with its stderr when it fails: for set-up steps that must work. */
async function ip(args: readonly string[]): Promise<string> {
  const r = await run('ip', args);
  if (r.code !== 0) throw new LabError(`ip ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

function checkPrefix(prefix: string): void {
  // A short or odd prefix could match someone else's namespaces, and destroy kills their processes.
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{2,63}$/.test(prefix)) {
    throw new LabError(`lab prefix "${prefix}": want 3..64 characters of A-Z a-z 0-9 _ . - (e.g. "dsrt-lab-123-")`);
  }
}

async function allNamespaces(): Promise<string[]> {
  const out = await ip(['netns', 'list']);
  // Lines look like "name (id: 3)" or just "name".
  return out
    .split('\n')
    .map((line) => line.trim().split(/\s+/)[0] ?? '')
    .filter((name) => name !== '');
}

async function namespacesWithPrefix(prefix: string): Promise<string[]> {
  return (await allNamespaces()).filter((n) => n.startsWith(prefix)).sort();
}

async function pidsIn(ns: string): Promise<number[]> {
  const r = await run('ip', ['netns', 'pids', ns]);
  if (r.code !== 0) return [];
  return r.stdout
    .split('\n')
    .filter((s) => /^\d+$/.test(s.trim()))
    .map(Number);
}

function killQuietly(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // Already gone.
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Deletes every namespace whose name starts with `prefix`, first ending the processes inside
 * (SIGTERM, then SIGKILL after 3 s): a namespace with a live process outlives `ip netns del`.
 * Usable without a Lab object (`dsrlb demo --down`, a test's afterAll after a crash). Resolves to
 * how many there were.
 */
export async function destroyLabsWithPrefix(prefix: string): Promise<number> {
  checkPrefix(prefix);
  const names = await namespacesWithPrefix(prefix);
  for (const ns of names) for (const pid of await pidsIn(ns)) killQuietly(pid, 'SIGTERM');
  const deadline = Date.now() + KILL_GRACE_MS;
  for (const ns of names) {
    let pids = await pidsIn(ns);
    while (pids.length > 0 && Date.now() < deadline) {
      await sleep(50);
      pids = await pidsIn(ns);
    }
    for (const pid of pids) killQuietly(pid, 'SIGKILL');
  }
  const failures: string[] = [];
  for (const ns of names) {
    const r = await deleteNamespace(ns);
    if (r.code !== 0 && (await allNamespaces()).includes(ns)) failures.push(`${ns}: ${r.stderr.trim()}`);
  }
  await removeRealserverState(prefix);
  if (failures.length > 0) throw new LabError(`cannot delete namespaces: ${failures.join('; ')}`);
  return names.length;
}

/**
 * `ip netns del ns`, and once it is gone its entries in the daemon's run directory (run records,
 * the state file record, locks: all named `KIND-INODE...`): nothing can use them any more, and a
 * later namespace may get the same inode. For tests that make a namespace of their own.
 */
export async function deleteNamespace(ns: string): Promise<{ code: number; stderr: string }> {
  const inode = namespaceInode(ns);
  const r = await run('ip', ['netns', 'del', ns]);
  if (inode !== null && !existsSync(`/run/netns/${ns}`)) await removeRunRecords(inode);
  return r;
}

function namespaceInode(ns: string): number | null {
  try {
    return statSync(`/run/netns/${ns}`).ino;
  } catch {
    return null;
  }
}

async function removeRunRecords(inode: number): Promise<void> {
  let files: string[];
  try {
    files = await readdir(RUN_DIR);
  } catch {
    return;
  }
  const ours = files.filter((f) => new RegExp(`^[a-z]+-${inode}[-.]`).test(f));
  await Promise.all(ours.map((f) => rm(resolve(RUN_DIR, f), { force: true })));
}

async function removeRealserverState(prefix: string): Promise<void> {
  let files: string[];
  try {
    files = await readdir(REALSERVER_STATE_DIR);
  } catch {
    return;
  }
  const stale = files.filter((f) => f.startsWith(`netns-${prefix}`) && f.endsWith('.state'));
  await Promise.all(stale.map((f) => rm(resolve(REALSERVER_STATE_DIR, f), { force: true })));
}

function parseSubnet(subnet: string): { base: number; prefixLength: number } {
  const m = /^([0-9.]+)\/(\d{1,2})$/.exec(subnet);
  const addr = m ? ipv4ToInt(m[1] as string) : null;
  const prefixLength = m ? Number(m[2]) : NaN;
  if (addr === null || !(prefixLength >= 8 && prefixLength <= 24)) {
    throw new LabError(`lab subnet "${subnet}": want an IPv4 prefix of length 8..24, e.g. ${DEFAULT_SUBNET}`);
  }
  const mask = prefixLength === 0 ? 0 : (0xffffffff << (32 - prefixLength)) >>> 0;
  return { base: (addr & mask) >>> 0, prefixLength };
}

async function macOf(ns: string, ifname: string): Promise<string> {
  const links = JSON.parse(await ip(['-n', ns, '-j', 'link', 'show', 'dev', ifname])) as Array<{ address?: string }>;
  const mac = links[0]?.address;
  if (mac === undefined) throw new LabError(`no MAC address for ${ifname} in ${ns}`);
  return mac.toLowerCase();
}

/** Builds the lab; on any failure removes what it made and rethrows. */
export async function createLab(opts: LabOptions): Promise<Lab> {
  checkPrefix(opts.prefix);
  if (!Number.isInteger(opts.realCount) || opts.realCount < 1 || opts.realCount > MAX_REALS) {
    throw new LabError(`realCount ${opts.realCount}: want 1..${MAX_REALS}`);
  }
  const subnet = opts.subnet ?? DEFAULT_SUBNET;
  const { base, prefixLength } = parseSubnet(subnet);
  const vip = opts.vip ?? intToIpv4(base + VIP_HOST_OFFSET);
  if (ipv4ToInt(vip) === null) throw new LabError(`lab vip "${vip}": not an IPv4 address`);
  const ipv6 = opts.ipv6 === true;
  const vip6 = ipv6 ? (opts.vip6 ?? DEFAULT_VIP6) : null;
  const repoRoot = opts.repoRoot ?? defaultRepoRoot();
  const realserverScript = resolve(repoRoot, 'deploy', 'linux', 'dsrlb-realserver');
  if (!existsSync(realserverScript)) throw new LabError(`${realserverScript} not found (repoRoot ${repoRoot})`);

  const existing = await namespacesWithPrefix(opts.prefix);
  if (existing.length > 0) {
    throw new LabError(
      `namespaces with prefix "${opts.prefix}" already exist (${existing.join(', ')}): remove them first (dsrlb demo --down, or destroyLabsWithPrefix)`,
    );
  }
  await removeRealserverState(opts.prefix);

  const p = opts.prefix;
  const plan: Array<{ name: string; offset: number; v6: string }> = [
    { name: 'c', offset: CLIENT_HOST_OFFSET, v6: 'fd77::10' },
    { name: 'lb', offset: LB_HOST_OFFSET, v6: 'fd77::2' },
  ];
  for (let i = 1; i <= opts.realCount; i++) {
    // IPv6 suffixes mirror the IPv4 last octet as text (r1 = .11 and fd77::11) for readability.
    plan.push({ name: `r${i}`, offset: FIRST_REAL_HOST_OFFSET + i - 1, v6: `fd77::${FIRST_REAL_HOST_OFFSET + i - 1}` });
  }
  const switchNs = `${p}sw`;

  try {
    await ip(['netns', 'add', switchNs]);
    await ip(['-n', switchNs, 'link', 'set', 'lo', 'up']);
    // No STP (ports forward at once) and no multicast snooping (it can swallow IPv6 ND on a fresh bridge).
    await ip(['-n', switchNs, 'link', 'add', 'br0', 'type', 'bridge', 'stp_state', '0', 'mcast_snooping', '0']);
    await ip(['-n', switchNs, 'link', 'set', 'br0', 'up']);
    // A switch forwards frames, it does not judge IP headers: where br_netfilter is loaded (Docker
    // hosts), bridged IPv4/IPv6 would be validated and malformed frames dropped before the LB.
    for (const family of ['iptables', 'ip6tables', 'arptables']) {
      const knob = `/proc/sys/net/bridge/bridge-nf-call-${family}`;
      if (existsSync(knob)) await run('ip', ['netns', 'exec', switchNs, 'sysctl', '-qw', `net.bridge.bridge-nf-call-${family}=0`]);
    }

    const hosts: LabHost[] = [];
    for (const h of plan) {
      const ns = `${p}${h.name}`;
      const swIf = `sw-${h.name}`; // at most 6 characters: IFNAMSIZ is 16 with the NUL
      const ipv4 = intToIpv4(base + h.offset);
      await ip(['netns', 'add', ns]);
      await ip(['-n', ns, 'link', 'set', 'lo', 'up']);
      // Created from the switch side with the peer moved straight into the host: no name ever
      // lives in the root namespace, so labs and the host cannot collide. Offloads stay at defaults.
      await ip(['-n', switchNs, 'link', 'add', swIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      await ip(['-n', switchNs, 'link', 'set', swIf, 'master', 'br0', 'up']);
      await ip(['-n', ns, 'addr', 'add', `${ipv4}/${prefixLength}`, 'dev', 'eth0']);
      if (ipv6) await ip(['-n', ns, '-6', 'addr', 'add', `${h.v6}/64`, 'dev', 'eth0', 'nodad']);
      await ip(['-n', ns, 'link', 'set', 'eth0', 'up']);
      hosts.push({ name: h.name, ns, ifname: 'eth0', ipv4, ipv6: ipv6 ? h.v6 : null, mac: await macOf(ns, 'eth0') });
    }
    const [client, lb, ...reals] = hosts as [LabHost, LabHost, ...LabHost[]];

    const vipList = vip6 === null ? vip : `${vip},${vip6}`;
    await Promise.all(
      reals.map(async (r) => {
        const res = await run('ip', ['netns', 'exec', r.ns, 'sh', realserverScript, 'setup', '--vip', vipList]);
        if (res.code !== 0) {
          throw new LabError(`dsrlb-realserver setup in ${r.ns} failed (exit ${res.code}): ${(res.stderr + res.stdout).trim()}`);
        }
      }),
    );

    return new NetnsLab({
      prefix: p,
      subnet: `${intToIpv4(base)}/${prefixLength}`,
      prefixLength,
      vip,
      vip6,
      subnet6: ipv6 ? SUBNET6 : null,
      switchNs,
      client,
      lb,
      reals,
      namespaces: [switchNs, ...hosts.map((h) => h.ns)],
      repoRoot,
    });
  } catch (err) {
    await destroyLabsWithPrefix(p).catch(() => undefined);
    throw err;
  }
}

interface LabFacts {
  prefix: string;
  subnet: string;
  prefixLength: number;
  vip: string;
  vip6: string | null;
  subnet6: string | null;
  switchNs: string;
  client: LabHost;
  lb: LabHost;
  reals: LabHost[];
  namespaces: string[];
  repoRoot: string;
}

class NetnsLab implements Lab {
  readonly prefix: string;
  readonly subnet: string;
  readonly prefixLength: number;
  readonly vip: string;
  readonly vip6: string | null;
  readonly subnet6: string | null;
  readonly switchNs: string;
  readonly client: LabHost;
  readonly lb: LabHost;
  readonly reals: readonly LabHost[];
  readonly namespaces: readonly string[];
  readonly httpServers = new Map<string, ChildProcess>();
  private readonly repoRoot: string;
  private readonly children = new Set<ChildProcess>();

  constructor(f: LabFacts) {
    this.prefix = f.prefix;
    this.subnet = f.subnet;
    this.prefixLength = f.prefixLength;
    this.vip = f.vip;
    this.vip6 = f.vip6;
    this.subnet6 = f.subnet6;
    this.switchNs = f.switchNs;
    this.client = f.client;
    this.lb = f.lb;
    this.reals = f.reals;
    this.namespaces = f.namespaces;
    this.repoRoot = f.repoRoot;
  }

  exec(ns: string | LabHost, argv: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    return run('ip', ['netns', 'exec', nsName(ns), ...argv], opts.timeoutMs ?? EXEC_TIMEOUT_MS);
  }

  spawn(ns: string | LabHost, argv: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    // `ip netns exec` execs the command in place, so the child's pid is the command's own.
    const child = spawnChild('ip', ['netns', 'exec', nsName(ns), ...argv], opts);
    this.children.add(child);
    child.once('exit', () => this.children.delete(child));
    child.once('error', () => this.children.delete(child));
    return child;
  }

  async startHttpServers(opts: StartHttpServersOptions = {}): Promise<void> {
    const port = opts.port ?? 80;
    const readyTimeoutMs = opts.readyTimeoutMs ?? 15_000;
    const script = resolve(this.repoRoot, 'dist', 'lab', 'real-http-server.js');
    if (!existsSync(script)) throw new LabError(`${script} not found: build first (npx tsc -p tsconfig.json)`);
    await Promise.all(
      this.reals.map((r) => {
        const running = this.httpServers.get(r.name);
        if (running !== undefined && running.exitCode === null && running.signalCode === null) return undefined;
        // The real's own addresses too: health checks from the LB reach a real there, not on the VIP.
        const hosts = [this.vip, r.ipv4];
        if (this.vip6 !== null && r.ipv6 !== null) hosts.push(this.vip6, r.ipv6);
        const child = this.spawn(
          r,
          [process.execPath, script, '--name', r.name, '--host', hosts.join(','), '--port', String(port)],
          { stdio: ['ignore', 'pipe', 'pipe'] },
        );
        this.httpServers.set(r.name, child);
        return waitReady(child, `${r.name} (${r.ns})`, readyTimeoutMs);
      }),
    );
  }

  listNamespaces(): Promise<string[]> {
    return namespacesWithPrefix(this.prefix);
  }

  async destroy(): Promise<void> {
    const children = [...this.children];
    await Promise.all(children.map((c) => stopChild(c)));
    this.httpServers.clear();
    await destroyLabsWithPrefix(this.prefix);
  }
}

function nsName(ns: string | LabHost): string {
  return typeof ns === 'string' ? ns : ns.ns;
}

function waitReady(child: ChildProcess, what: string, timeoutMs: number): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    let out = '';
    let err = '';
    let done = false;
    const finish = (e: Error | null): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      child.off('exit', onExit);
      if (e === null) resolvePromise();
      else reject(e);
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void => {
      finish(new LabError(`HTTP server ${what} exited (${code ?? signal}) before it was ready: ${err.trim()}`));
    };
    const timer = setTimeout(() => {
      finish(new LabError(`HTTP server ${what} not ready after ${timeoutMs} ms: ${err.trim()}`));
    }, timeoutMs);
    // Keep reading both pipes for the server's whole life, so a full pipe never blocks it.
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      if (err.length < 8192) err += chunk;
    });
    child.stdout?.setEncoding('utf8');
    child.stdout?.on('data', (chunk: string) => {
      if (done) return;
      out += chunk;
      for (const line of out.split('\n').slice(0, -1)) {
        try {
          if ((JSON.parse(line) as { ready?: unknown }).ready === true) finish(null);
        } catch {
          // Not the ready line.
        }
      }
    });
    child.once('exit', onExit);
  });
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return Promise.resolve();
  return new Promise((resolvePromise) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), KILL_GRACE_MS);
    child.once('exit', () => {
      clearTimeout(timer);
      resolvePromise();
    });
    child.kill('SIGTERM');
  });
}
