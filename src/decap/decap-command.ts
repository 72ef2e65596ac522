// `dsrlb decap`: user-space IPIP / IPv6-in-IPv6 (and 4in6, 6in4) decapsulation for a real server
// whose kernel has no ipip/ip6_tunnel: raw sockets read the tunnel packets, inner packets to the
// given VIPs go to the local stack through a TUN device, everything else is counted and dropped.

import { existsSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { unicastProblem } from '../config/validate.js';
import { InstanceLock, InstanceLockError } from '../control/instance-lock.js';
import { createLogger, type Logger } from '../control/logger.js';
import { isNativeSystemError, loadNative, type DsrlbNative } from '../io/native-binding.js';
import { DecapHost } from './decap-host.js';
import { Decapsulator } from './decapsulator.js';
import { VipSet } from './inner-packet.js';
import { SourceFilter } from './source-filter.js';
import { openTunnelSocket, tunnelSocketSpecs, type TunnelSocket, type TunnelSocketSpec } from './tunnel-sockets.js';

export const DEFAULT_TUN_NAME = 'dsrlb-decap0';

/**
 * One decapsulator per network namespace: two would both deliver every tunnelled packet. Its lock
 * file is /run/dsrlb/decap-<netns inode>.lock.
 */
export const DECAP_LOCK_KIND = 'decap';
const DECAP_BUSY = 'another dsrlb decap is running in this network namespace (two would deliver every tunnelled packet twice): stop it first';

/** How often the counters are logged while they change (and on SIGHUP). */
const COUNTERS_LOG_INTERVAL_MS = 60_000;
/** How often decap checks that its TUN device still exists (every write into a deleted one fails). */
const TUN_CHECK_INTERVAL_MS = 1000;

export interface DecapOptions {
  /** Read tunnel packets arriving on this interface only (default: any). */
  interface?: string;
  /** IPv4/IPv6 VIPs; an element may hold several separated by commas. */
  vips: string[];
  tunName?: string;
  /** Outer sources taken (CIDR prefixes; an element may hold several separated by commas); none: any. */
  allowSources?: string[];
}

const EXIT_OK = 0;
const EXIT_USER = 1;
const EXIT_SYSTEM = 2;

function problem(message: string): void {
  process.stderr.write(`dsrlb decap: ${message}\n`);
}

/**
 * The items of a list option given repeated and/or comma-separated (yargs hands over a string
 * for a single value unless the option is declared as an array).
 */
function listItems(value: string | readonly string[] | undefined): string[] {
  return ([] as unknown[]).concat(value ?? []).flatMap((v) => String(v).split(',')).map((v) => v.trim()).filter((v) => v !== '');
}

/** The command's options parsed, or its problems (runDecap prints one line each and exits 1). */
export function parseDecapOptions(opts: DecapOptions): { vips: VipSet; ifname: string | undefined; tunName: string; sources: SourceFilter | null } | string[] {
  const problems: string[] = [];
  const texts = listItems(opts.vips);
  let vips: VipSet | undefined;
  if (texts.length === 0) problems.push('--vip: at least one VIP is required (e.g. --vip 203.0.113.10)');
  // The config's rule for a VIP: a unicast address, every bad one reported.
  const bad = texts.map((t) => unicastProblem(t, 'a VIP')).filter((why): why is string => why !== null);
  for (const why of bad) problems.push(`--vip: ${why}`);
  if (texts.length > 0 && bad.length === 0) vips = new VipSet(texts);
  const ifname = opts.interface;
  if (ifname !== undefined && (ifname === '' || ifname.includes('/') || !existsSync(`/sys/class/net/${ifname}`))) {
    problems.push(`--interface: no such network interface ${JSON.stringify(ifname)}`);
  }
  const tunName = opts.tunName ?? DEFAULT_TUN_NAME;
  // No '%': the kernel would number a template (dsrlb%d) itself, and the name decap reports, the
  // real-server script and the unit look for would not be the device's.
  if (!/^[A-Za-z0-9_.-]{1,15}$/.test(tunName)) {
    problems.push(`--tun: ${JSON.stringify(tunName)} is not a usable interface name (1 to 15 letters, digits, "_.-")`);
  }
  const sourceTexts = listItems(opts.allowSources);
  let sources: SourceFilter | null = null;
  try {
    if (sourceTexts.length > 0) sources = new SourceFilter(sourceTexts);
  } catch (err) {
    problems.push(`--allow-source: ${(err as Error).message}`);
  }
  if (problems.length > 0 || vips === undefined) return problems;
  return { vips, ifname, tunName, sources };
}

/**
 * Whether interface `name` is gone from this network namespace: the ioctl afpacket-io's
 * interfaceLost() asks (a socket's namespace is the process's, whoever mounted /sys). Only ENODEV
 * is gone; any other failure is no answer, and decap goes on.
 */
function interfaceGone(native: DsrlbNative, name: string): boolean {
  try {
    native.interfaceInfo(name);
    return false;
  } catch (err) {
    return isNativeSystemError(err) && err.code === 'ENODEV';
  }
}

/** VIPs that are not local addresses: the kernel would route their inner packets away, not deliver them. */
function nonLocalVips(vips: VipSet): string[] {
  const local = new Set<string>();
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) local.add(a.address.toLowerCase());
  return vips.addresses.filter((vip) => !local.has(vip));
}

/**
 * Runs until SIGTERM/SIGINT, then undoes its host changes and logs the counters (also every minute
 * while they change, and on SIGHUP). Returns the exit code.
 */
export async function runDecap(opts: DecapOptions, log: Logger = createLogger()): Promise<number> {
  const parsed = parseDecapOptions(opts);
  if (Array.isArray(parsed)) {
    parsed.forEach(problem);
    return EXIT_USER;
  }
  const { vips, ifname, tunName, sources } = parsed;
  for (const vip of nonLocalVips(vips)) {
    log.warn('VIP is not an address of this host: its packets will not be delivered', {
      vip,
      fix: `dsrlb-realserver setup --vip ${vip}`,
    });
  }

  const host = new DecapHost(log);
  const sockets: TunnelSocket[] = [];
  let finish: (code: number) => void = () => {};
  const finished = new Promise<number>((resolve) => (finish = resolve));
  const stop = (signal: string): void => {
    log.info('decap stopping', { signal });
    finish(EXIT_OK);
  };
  const onTerm = (): void => stop('SIGTERM');
  const onInt = (): void => stop('SIGINT');
  let decap: Decapsulator | undefined;
  // There is nothing to reload: SIGHUP (whose default would kill it without undoing its changes)
  // logs the counters instead.
  const onHup = (): void => log.info('SIGHUP: decap has nothing to reload; counters so far', { counters: decap?.counters() ?? null });
  process.once('SIGTERM', onTerm);
  process.once('SIGINT', onInt);
  process.on('SIGHUP', onHup);

  let lock: InstanceLock | undefined;
  let countersTimer: NodeJS.Timeout | undefined;
  let tunTimer: NodeJS.Timeout | undefined;
  let code: number;
  try {
    lock = await InstanceLock.acquire(DECAP_LOCK_KIND, DECAP_BUSY);
    // With the lock held, a record left in /run/dsrlb is a dead (earlier) decap's: the operator's values.
    await host.restoreDeadDecapRecord();
    const native = loadNative();
    const tun = await host.setUp(tunName, vips.hasV6, vips.hasV4);
    const fd = tun.fd;
    const d = new Decapsulator(vips, (buf, offset, length) => native.tunWrite(fd, buf, offset, length), sources);
    decap = d;
    const onPacket = (buf: Buffer, length: number, spec: TunnelSocketSpec, outerTrafficClass: number, source: Uint8Array): void => {
      if (spec.outerFamily === 4) d.receiveIpv4Outer(buf, length);
      else d.receiveIpv6Outer(buf, length, spec.protocol, outerTrafficClass, source);
    };
    const onError = (error: Error, spec: TunnelSocketSpec): void => {
      log.error('tunnel socket failed', { outerFamily: spec.outerFamily, protocol: spec.protocol, error: error.message });
      finish(EXIT_SYSTEM);
    };
    const outerIpv6 = existsSync('/proc/net/if_inet6');
    for (const spec of tunnelSocketSpecs(vips.hasV4, vips.hasV6, outerIpv6)) {
      sockets.push(openTunnelSocket(spec, ifname, onPacket, onError));
    }
    log.info('decap running', {
      tun: tun.name,
      interface: ifname ?? '(any)',
      vips: vips.addresses,
      allowSources: sources?.texts ?? '(any)',
      sockets: sockets.map((s) => `ipv${s.spec.outerFamily}/protocol ${s.spec.protocol}`),
    });
    let logged = '';
    countersTimer = setInterval(() => {
      const now = JSON.stringify(d.counters());
      if (now !== logged) log.info('decap counters', { counters: d.counters() });
      logged = now;
    }, COUNTERS_LOG_INTERVAL_MS);
    countersTimer.unref();
    // A TUN device deleted under decap (`ip link del`) takes every packet with it while decap
    // looks alive: stop with an error instead, for systemd to start it again with a new device.
    tunTimer = setInterval(() => {
      if (!interfaceGone(native, tun.name)) return;
      log.error('the TUN device is gone: decap stops (under systemd it is started again)', { tun: tun.name });
      finish(EXIT_SYSTEM);
    }, TUN_CHECK_INTERVAL_MS);
    tunTimer.unref();
    code = await finished;
  } catch (err) {
    const e = err as Error & { code?: string };
    problem(err instanceof InstanceLockError ? e.message : `${e.message}${e.code !== undefined && !e.message.includes(e.code) ? ` (${e.code})` : ''}`);
    code = EXIT_SYSTEM;
  } finally {
    clearInterval(countersTimer);
    clearInterval(tunTimer);
    process.removeListener('SIGTERM', onTerm);
    process.removeListener('SIGINT', onInt);
    process.removeListener('SIGHUP', onHup);
    for (const socket of sockets) socket.close();
    await host.tearDown();
    lock?.release();
  }
  if (decap !== undefined) log.info('decap stopped', { counters: decap.counters() });
  return code;
}
