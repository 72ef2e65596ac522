// The one config validator: YAML (or JSON) text in, a frozen normalised Config or every problem
// found out. Each problem names the field path, the value given and what was expected.

import { dirname, join, resolve } from 'node:path';
import ipaddr from 'ipaddr.js';
import { isMap, isScalar, LineCounter, parseDocument, visit } from 'yaml';
import { MAX_REAL_IDS } from '../dataplane/counters.js';
import { formatDurationMs, parseDurationMs } from './duration.js';
import { parsePlainYaml } from './plain-yaml.js';
import { locateProblems } from './problem-positions.js';
import { describe, keyPath } from './problem-text.js';
import { CONFIG_YAML_OPTIONS, toPlainData, withoutBom } from './yaml-document.js';
import type {
  AddressFamily,
  Config,
  ConfigProblem,
  ForwardingMode,
  HealthCheckConfig,
  HealthCheckType,
  IoKind,
  RingKind,
  ListenAddress,
  OnRealDown,
  Persistence,
  Protocol,
  RealConfig,
  RealIntent,
  SchedulerKind,
  ServiceConfig,
  SourcePosition,
  WhenAllDown,
} from './types.js';

export { describe, keyPath } from './problem-text.js';

export type ConfigResult = { ok: true; config: Config } | { ok: false; problems: ConfigProblem[] };

export interface ParseOptions {
  /** The file the text came from: relative stateFile/tokenFile paths and the default stateFile are resolved against its directory. */
  readonly sourcePath?: string;
  /**
   * Where the default stateFile goes instead of beside the config: systemd's $STATE_DIRECTORY
   * (the shipped unit sets StateDirectory=dsrlb and makes /etc read-only to the daemon).
   */
  readonly stateDirectory?: string;
}

export const DEFAULT_METRICS_LISTEN: ListenAddress = Object.freeze({ host: '127.0.0.1', port: 9742 });
export const DEFAULT_ADMIN_LISTEN: ListenAddress = Object.freeze({ host: '127.0.0.1', port: 9743 });
export const DEFAULT_TABLE_SIZE = 65537;
export const MIN_TABLE_SIZE = 7;
/** A prime; 40 MB of Int32 slots per service is already far past what a few hundred reals need. */
export const MAX_TABLE_SIZE = 10_000_019;
export const STATE_FILE_NAME = 'dsrlb.state.json';

const PROTOCOLS: readonly Protocol[] = ['tcp', 'udp'];
const SCHEDULERS: readonly SchedulerKind[] = ['maglev', 'rendezvous', 'wlc'];
const FORWARDINGS: readonly ForwardingMode[] = ['l2', 'ipip'];
const INTENTS: readonly RealIntent[] = ['active', 'drain', 'disabled'];
const WHEN_ALL_DOWN: readonly WhenAllDown[] = ['failOpen', 'drop'];
const ON_REAL_DOWN: readonly OnRealDown[] = ['reschedule', 'keep'];
const PERSISTENCES: readonly Persistence[] = ['none', 'client'];
const IO_KINDS: readonly IoKind[] = ['afpacket', 'pcap'];
const RING_KINDS: readonly RingKind[] = ['v2', 'v3'];
const CHECK_TYPES: readonly HealthCheckType[] = ['tcp', 'http', 'https', 'udp', 'icmp', 'exec', 'none'];

const TOP_KEYS = ['interface', 'io', 'ring', 'workers', 'cpus', 'hashSeed', 'flowTable', 'tunnel', 'metrics', 'admin', 'stateFile', 'announce', 'services'];
const ANNOUNCE_KEYS = ['enabled', 'routesFile', 'birdSocket', 'onFailOpen', 'withdrawDelay'];
export const DEFAULT_ROUTES_FILE = '/run/dsrlb/bird-routes.conf';
const DEFAULT_WITHDRAW_DELAY_MS = 300;
const FLOW_TABLE_KEYS = ['capacity', 'tcpTimeouts', 'udpTimeout'];
const TCP_TIMEOUT_KEYS = ['syn', 'established', 'fin'];
const TUNNEL_KEYS = ['sourceV4', 'sourceV6'];
const METRICS_KEYS = ['listen'];
const ADMIN_KEYS = ['listen', 'tokenFile'];
const SERVICE_KEYS = ['name', 'vip', 'port', 'protocol', 'scheduler', 'forwarding', 'whenAllDown', 'onRealDown', 'persistence', 'persistencePrefix', 'ops', 'tableSize', 'healthCheck', 'announce', 'reals'];
const CHECK_KEYS = ['type', 'port', 'path', 'host', 'expectStatus', 'expectBody', 'payload', 'expectPayload', 'command', 'interval', 'timeout', 'rise', 'fall'];
const REAL_KEYS = ['address', 'weight', 'state', 'forwarding', 'backup'];
// Keys written one level off, and where they belong.
const TOP_MISPLACED = belongsUnder([
  [SERVICE_KEYS, 'each service in services'],
  [CHECK_KEYS, "a service's healthCheck"],
  [REAL_KEYS, "each real in a service's reals"],
  [FLOW_TABLE_KEYS, 'flowTable'],
  [TCP_TIMEOUT_KEYS, 'flowTable.tcpTimeouts'],
  [TUNNEL_KEYS, 'tunnel'],
  [['tokenFile'], 'admin'],
  [['listen'], 'metrics or admin'],
  [ANNOUNCE_KEYS, 'announce'],
]);
const FLOW_TABLE_MISPLACED = belongsUnder([[TCP_TIMEOUT_KEYS, 'flowTable.tcpTimeouts']]);
const SERVICE_MISPLACED = belongsUnder([[CHECK_KEYS, 'healthCheck'], [REAL_KEYS, 'each real in reals']]);
const REAL_MISPLACED: Readonly<Record<string, string>> = {
  ...belongsUnder([[CHECK_KEYS.filter((key) => key !== 'port'), "the service's healthCheck"]]),
  port: "a real serves the service's own port on the VIP (DSR cannot translate ports)",
};

/**
 * Which health-check keys mean something for which type. A key set for a type that ignores it
 * (a `path` on a tcp check) is refused, because it shows the operator expects a check that will not
 * happen. `type: none` is exempt: switching a check off while keeping its settings is normal; the
 * values are still checked, so a mistake does not wait for the day the check is switched back on.
 */
const CHECK_KEY_TYPES: Readonly<Record<string, readonly HealthCheckType[]>> = {
  port: ['tcp', 'http', 'https', 'udp', 'exec'],
  path: ['http', 'https'],
  host: ['http', 'https'],
  expectStatus: ['http', 'https'],
  expectBody: ['http', 'https'],
  payload: ['udp'],
  expectPayload: ['udp'],
  command: ['exec'],
};
/** Check types that probe no port, so a port-0 service needs no healthCheck.port for them. */
const PORTLESS_CHECK_TYPES: readonly HealthCheckType[] = ['icmp', 'exec', 'none'];
/** "an http check", "a tcp check": the article as the type is read aloud (letter by letter or as a word). */
const CHECK_ARTICLE: Readonly<Record<HealthCheckType, 'a' | 'an'>> = { tcp: 'a', http: 'an', https: 'an', udp: 'a', icmp: 'an', exec: 'an', none: 'a' };

// IPVS-like flow timeouts (ipvsadm --set 900 120 300; SYN_RECV 60 s).
const DEFAULT_SYN_MS = 60_000;
const DEFAULT_ESTABLISHED_MS = 900_000;
const DEFAULT_FIN_MS = 120_000;
const DEFAULT_UDP_MS = 300_000;
const DEFAULT_CAPACITY = 1_000_000;
const MAX_CAPACITY = 100_000_000;
const DEFAULT_WEIGHT = 100;
const MAX_WEIGHT = 65535;
const MAX_HASH_SEED = 0xffff_ffff;

type Raw = Record<string, unknown>;

/** A real's weight as the config takes it: an integer 0..65535 (the admin API, the state file and scenarios check the same). */
export function isWeight(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= MAX_WEIGHT;
}

/** A real's intent as the config takes it: active, drain or disabled. */
export function isRealIntent(v: unknown): v is RealIntent {
  return (INTENTS as readonly unknown[]).includes(v);
}

class ProblemList {
  readonly items: ConfigProblem[] = [];
  add(path: string, message: string): void {
    this.items.push({ path, message });
  }
}

// ---------------------------------------------------------------------------------------------
// Public helpers other modules use to read the same notation (CLI arguments, admin API paths).

/** Four decimal parts without leading zeros: the only IPv4 form taken (ipaddr.IPv4.isValidFourPartDecimal's pattern). */
const FOUR_PART_DECIMAL = /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$/;

/** Parses strict address text: dotted-quad IPv4 (no octal/hex/short forms) or IPv6 without a zone index. */
export function parseIpAddress(text: string): { address: string; family: AddressFamily } | null {
  const parsed = parseIp(text);
  return parsed === null ? null : { address: parsed.address, family: parsed.family };
}

/**
 * parseIpAddress with ipaddr's object, for range checks without parsing again. Checked here rather
 * than by ipaddr.IPv4.isValidFourPartDecimal and IPv6.isValid, which throw and catch an error for
 * every address of the other family (about 20 us each: half the time of validating 2,000 services
 * with IPv6 among them); text of four decimal parts is already canonical, as IPv4's toString() writes it.
 */
function parseIp(text: string): { address: string; family: AddressFamily; ip: ipaddr.IPv4 | ipaddr.IPv6 } | null {
  const v4 = FOUR_PART_DECIMAL.exec(text);
  if (v4 !== null) {
    const octets = [Number(v4[1]), Number(v4[2]), Number(v4[3]), Number(v4[4])];
    return octets.every((octet) => octet <= 255) ? { address: text, family: 4, ip: new ipaddr.IPv4(octets) } : null;
  }
  if (!text.includes(':') || text.includes('%')) return null;
  let ip: ipaddr.IPv6;
  try {
    ip = ipaddr.IPv6.parse(text);
  } catch {
    return null;
  }
  return { address: ip.toString(), family: 6, ip };
}

/**
 * A client endpoint as `explain` takes it, IP:PORT or [IPv6]:PORT: the address and port, or what is
 * wrong with it (the same words from the CLI, before it asks, and from the daemon).
 */
export function parseClientEndpoint(client: string, minPort = 1): { address: string; family: AddressFamily; port: number } | { error: string } {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(client);
  if (!m) return { error: `client "${client}" is not IP:PORT (or [IPv6]:PORT)` };
  const ip = parseIpAddress(m[1] ?? m[2]!);
  if (!ip) return { error: `client "${client}": "${m[1] ?? m[2]}" is not an IP address` };
  if (m[1] !== undefined && ip.family !== 6) return { error: `client "${client}": brackets are for IPv6 addresses only` };
  const port = Number(m[3]);
  if (port < minPort || port > 65535) return { error: `client "${client}": port ${port} is not ${minPort}..65535` };
  return { ...ip, port };
}

/** The address form of a service, as the CLI accepts it: tcp://203.0.113.10:80, udp://[2001:db8::10]:53. */
export function serviceAddressName(protocol: Protocol, vip: string, port: number): string {
  return `${protocol}://${vip.includes(':') ? `[${vip}]` : vip}:${port}`;
}

/** Parses `host:port` or `[v6]:port` with an IP host and a port 1..65535. */
export function parseListenAddress(text: string): ListenAddress | null {
  const match = /^(?:\[([^\]]*)\]|([^:[\]]*)):(\d{1,5})$/.exec(text);
  if (match === null) return null;
  const host = match[1] ?? match[2] ?? '';
  const parsed = parseIpAddress(host);
  if (parsed === null || (match[1] !== undefined) !== (parsed.family === 6)) return null;
  const port = Number(match[3]);
  if (port < 1 || port > 65535) return null;
  return { host: parsed.address, port };
}

/**
 * A `path: message` line per problem (`file: path: message` when a file is named), in the order
 * found, with where the file writes it after the message: `(line 14, column 9)`, and `, through
 * the alias on line 41` when that place is an anchor's. The path stays first: it is what scripts
 * and the contract key on, and the position is for the operator's editor.
 */
export function problemLines(problems: readonly ConfigProblem[], file?: string): string[] {
  const prefix = file === undefined ? '' : `${file}: `;
  return problems.map((problem) => `${prefix}${problem.path}: ${problem.message}${positionText(problem.position)}`);
}

function positionText(position: SourcePosition | undefined): string {
  if (position === undefined) return '';
  const alias = position.aliasLine === undefined ? '' : `, through the alias on line ${position.aliasLine}`;
  return ` (line ${position.line}, column ${position.column}${alias})`;
}

/** One `path: message` line per problem, in the order found. */
export function formatProblems(problems: readonly ConfigProblem[]): string {
  return problemLines(problems).join('\n');
}

// ---------------------------------------------------------------------------------------------

/**
 * Parses YAML or JSON config text and validates it (see validateConfig); each problem whose path
 * points into the text carries its line and column (looked up only when there are problems).
 */
export function parseConfigText(text: string, opts: ParseOptions = {}): ConfigResult {
  const parsed = parseConfigYaml(text);
  if (!parsed.ok) return parsed;
  const result = validateConfig(parsed.raw, opts);
  return result.ok ? result : { ok: false, problems: locateProblems(withoutBom(text), result.problems) };
}

/**
 * The one way config text becomes a plain document: YAML 1.2 (JSON is a subset), a leading BOM
 * dropped, duplicate keys and several documents refused, the expansion by aliases bounded against
 * alias bombs (yaml-document.ts). Merge keys (`<<: *defaults`, from YAML 1.1) are taken, as docker
 * compose and Kubernetes tools take them: the mapping's own keys win over merged ones.
 */
export function parseConfigYaml(text: string): { ok: true; raw: unknown } | { ok: false; problems: ConfigProblem[] } {
  const source = withoutBom(text);
  // The common file (plain block YAML, no errors) is read without building yaml's document, which
  // takes about 0.8 s for 2,000 services of 4 reals; anything else, and every error, goes through
  // the yaml library, so each YAML problem is told from its document with its line and column.
  const plain = parsePlainYaml(source);
  return plain !== undefined ? { ok: true, raw: plain } : parseConfigYamlDocument(source);
}

/**
 * parseConfigYaml through the yaml library alone (the path every file with a YAML problem takes),
 * BOM already dropped: a document with lines and columns for each problem.
 */
export function parseConfigYamlDocument(source: string): { ok: true; raw: unknown } | { ok: false; problems: ConfigProblem[] } {
  const lineCounter = new LineCounter();
  const doc = parseDocument(source, { ...CONFIG_YAML_OPTIONS, prettyErrors: true, lineCounter });
  if (doc.errors.length > 0) {
    // The first syntax error, and every repeated key (each stands alone); the parser's other later
    // errors mostly follow from the first (an unclosed `[80` gave four more, on lines that are fine).
    const shown = doc.errors.filter((error, i) => i === 0 || error.code === 'DUPLICATE_KEY');
    // yaml's own text for this one advises an API call, which helps no operator.
    const problems = shown.map((error) => yamlProblem(error.code === 'MULTIPLE_DOCS' ? 'the file holds more than one YAML document' : error.message, error.linePos?.[0]));
    const more = doc.errors.length - shown.length;
    if (more > 0) problems.push({ path: '(yaml)', message: `${more} more YAML error${more === 1 ? '' : 's'} after the first, most likely caused by it: fix it and check again` });
    return { ok: false, problems };
  }
  // A key that is a list or a mapping (`[a, b]: 1`) would be stringified by toJS, with a warning
  // from yaml on stderr: it is no key of ours, said here with its position.
  let complexKey: ConfigProblem | null = null;
  visit(doc, {
    Pair(_, pair) {
      if (pair.key === null || isScalar(pair.key)) return;
      const offset = (pair.key as { range?: [number, number, number] }).range?.[0];
      complexKey = yamlProblem('a key must be a plain word or number, not a list or a mapping', offset === undefined ? undefined : lineCounter.linePos(offset));
      return visit.BREAK;
    },
  });
  if (complexKey !== null) return { ok: false, problems: [complexKey] };
  const plain = toPlainData(doc);
  if (plain.ok) return { ok: true, raw: plain.value };
  const { message, offset } = plain.problem;
  return { ok: false, problems: [yamlProblem(message, offset === undefined ? undefined : lineCounter.linePos(offset))] };
}

/**
 * The admin section of a file with YAML errors, when the errors are all outside it: `{ admin }`
 * (`{}` when the file has no admin key at all, so the defaults apply), or undefined when the
 * section itself may be what is broken. The CLI finds the daemon with it, so a syntax error
 * elsewhere in the file does not cut the operator off (reload can still say why it refuses).
 */
export function adminSectionDespiteErrors(text: string): { admin?: unknown } | undefined {
  const doc = parseDocument(withoutBom(text), CONFIG_YAML_OPTIONS);
  if (!isMap(doc.contents)) return undefined;
  const pairs = doc.contents.items.filter((item) => isScalar(item.key) && item.key.value === 'admin');
  // No admin key parsed: the defaults, unless a line that looks like one was lost in the errors.
  if (pairs.length === 0) return /^admin\s*:/m.test(text) ? undefined : {};
  if (pairs.length > 1) return undefined;
  // The section runs from its key to the next top-level key: an error in between (a bad line the
  // parser left out of the section) may have taken part of it.
  const items = doc.contents.items;
  const at = items.indexOf(pairs[0]!);
  const rangeOf = (node: unknown): [number, number, number] | undefined => (node as { range?: [number, number, number] } | null)?.range;
  const start = rangeOf(items[at]!.key)?.[0];
  const end = at + 1 < items.length ? rangeOf(items[at + 1]!.key)?.[0] : text.length;
  if (start === undefined || end === undefined) return undefined;
  if (doc.errors.some((e) => e.pos[0] < end && e.pos[1] > start)) return undefined;
  if (doc.get('admin') === undefined) return { admin: null };
  const plain = toPlainData(doc);
  return plain.ok ? { admin: (plain.value as Record<string, unknown>)['admin'] } : undefined;
}

/** Validates an already parsed document (plain objects, arrays, scalars) into a frozen Config. */
export function validateConfig(raw: unknown, opts: ParseOptions = {}): ConfigResult {
  const p = new ProblemList();
  const configDir = configDirOf(opts);
  if (raw === null || raw === undefined) {
    p.add('(file)', 'the file is empty; expected a mapping with at least interface and services');
    return { ok: false, problems: p.items };
  }
  if (!isMapping(raw)) {
    p.add('(file)', notAMapping(raw));
    return { ok: false, problems: p.items };
  }
  // Top-level keys that start with x- are the file's own (a place for YAML anchors, as in docker compose).
  checkKeys(p, withoutExtensionKeys(raw), '', TOP_KEYS, TOP_MISPLACED);

  const iface = interfaceName(p, raw);
  const io = oneOf(p, raw, 'io', '', IO_KINDS, 'afpacket');
  const ring = oneOf(p, raw, 'ring', '', RING_KINDS, 'v3');
  if (io === 'pcap' && raw['ring'] !== undefined && raw['ring'] !== null) p.add('ring', 'applies to io: afpacket only (io is pcap)');
  const hashSeed = integer(p, raw, 'hashSeed', '', 0, MAX_HASH_SEED, 'a hash seed', 0);
  const workers = integer(p, raw, 'workers', '', 1, 64, 'a number of packet loops', 1);
  if (io === 'pcap' && workers !== undefined && workers > 1) p.add('workers', `${workers} packet loops need io: afpacket; io: pcap runs one`);
  const cpus = cpuList(p, raw);
  if (io === 'pcap' && cpus !== undefined && cpus.length > 0) p.add('cpus', 'applies to io: afpacket only (the pcap loop runs on the main thread, with the control plane)');
  const flowTable = flowTableSection(p, raw);
  const vipOwners = vipOwnersOf(raw);
  const tunnel = tunnelSection(p, raw, vipOwners);
  const metrics = section(p, raw, 'metrics', '', METRICS_KEYS, 'metrics settings');
  const metricsListen = listen(p, metrics, 'metrics', DEFAULT_METRICS_LISTEN);
  const { listen: adminListen, tokenFile } = adminSection(p, raw, configDir);
  if (metricsListen !== null && adminListen !== null && listensClash(metricsListen, adminListen)) {
    // Blame the one the user wrote: a default is not in the file to be fixed.
    const written = (key: string): boolean => isMapping(raw[key]) && (raw[key] as Record<string, unknown>)['listen'] !== undefined;
    if (!written('admin') && written('metrics')) {
      p.add('metrics.listen', `${formatListen(metricsListen)} clashes with admin.listen (${formatListen(adminListen)}, the default); they need different ports`);
    } else {
      p.add('admin.listen', `${formatListen(adminListen)} clashes with metrics.listen (${formatListen(metricsListen)}${written('metrics') ? '' : ', the default'}); they need different ports`);
    }
  }
  const explicitStateFile = filePath(p, raw, 'stateFile', '', configDir);
  const defaultStateDir = opts.stateDirectory ?? configDir;
  const stateFile = explicitStateFile ?? (defaultStateDir === null ? null : join(defaultStateDir, STATE_FILE_NAME));
  const announce = announceSection(p, raw, configDir);
  const services = serviceList(p, raw, vipOwners);

  if (p.items.length > 0) return { ok: false, problems: p.items };
  const config: Config = {
    interface: iface as string,
    io: io as IoKind,
    ring: ring as RingKind,
    workers: workers as number,
    cpus: cpus as number[],
    hashSeed: hashSeed as number,
    flowTable: flowTable as Config['flowTable'],
    tunnel,
    metrics: { listen: metricsListen as ListenAddress },
    admin: { listen: adminListen as ListenAddress, tokenFile },
    stateFile,
    announce: announce as Config['announce'],
    services,
  };
  return { ok: true, config: deepFreeze(config) };
}

export type AdminSettingsResult = { ok: true; listen: ListenAddress; tokenFile: string | null } | { ok: false; problems: ConfigProblem[] };

/**
 * Validates only the `admin` section of a parsed document, with the rules, defaults and messages
 * of validateConfig and ignoring every other key: the CLI's admin commands need just this much,
 * and must keep working while another part of the file is being fixed. A document with no admin
 * section (or an empty one) gets the defaults.
 */
export function validateAdminSettings(raw: unknown, opts: ParseOptions = {}): AdminSettingsResult {
  const p = new ProblemList();
  if (raw === null || raw === undefined) return { ok: true, listen: DEFAULT_ADMIN_LISTEN, tokenFile: null };
  if (!isMapping(raw)) {
    p.add('(file)', notAMapping(raw));
    return { ok: false, problems: p.items };
  }
  const { listen: adminListen, tokenFile } = adminSection(p, raw, configDirOf(opts));
  if (p.items.length > 0 || adminListen === null) return { ok: false, problems: p.items };
  return { ok: true, listen: adminListen, tokenFile };
}

// ---------------------------------------------------------------------------------------------
// Sections

function interfaceName(p: ProblemList, raw: Raw): string | undefined {
  const name = requiredString(p, raw, 'interface', '', 'a network interface name, e.g. eth0');
  if (name === undefined) return undefined;
  // Linux dev_valid_name(): shorter than IFNAMSIZ (16), not "." or "..", no "/", ":" or whitespace.
  if (name.length > 15 || name === '.' || name === '..' || /[/:\s]/.test(name) || hasControl(name)) {
    p.add('interface', `${describe(name)} is not a network interface name (1..15 characters, no "/", ":" or whitespace)`);
    return undefined;
  }
  return name;
}

function flowTableSection(p: ProblemList, raw: Raw): Config['flowTable'] | undefined {
  const table = section(p, raw, 'flowTable', '', FLOW_TABLE_KEYS, 'flow table settings', FLOW_TABLE_MISPLACED);
  if (table === null) return undefined;
  const capacity = integer(p, table, 'capacity', 'flowTable', 1, MAX_CAPACITY, 'a flow table capacity', DEFAULT_CAPACITY);
  const tcp = section(p, table, 'tcpTimeouts', 'flowTable', TCP_TIMEOUT_KEYS, 'TCP timeouts (syn, established, fin)');
  const synMs = tcp === null ? undefined : duration(p, tcp, 'syn', 'flowTable.tcpTimeouts', DEFAULT_SYN_MS);
  const establishedMs = tcp === null ? undefined : duration(p, tcp, 'established', 'flowTable.tcpTimeouts', DEFAULT_ESTABLISHED_MS);
  const finMs = tcp === null ? undefined : duration(p, tcp, 'fin', 'flowTable.tcpTimeouts', DEFAULT_FIN_MS);
  const udpTimeoutMs = duration(p, table, 'udpTimeout', 'flowTable', DEFAULT_UDP_MS);
  if (capacity === undefined || synMs === undefined || establishedMs === undefined || finMs === undefined || udpTimeoutMs === undefined) {
    return undefined;
  }
  return { capacity, tcpTimeouts: { synMs, establishedMs, finMs }, udpTimeoutMs };
}

/** admin.listen (default 127.0.0.1:9743) and admin.tokenFile, which a listener off loopback requires. */
function adminSection(p: ProblemList, raw: Raw, configDir: string | null): { listen: ListenAddress | null; tokenFile: string | null } {
  const admin = section(p, raw, 'admin', '', ADMIN_KEYS, 'admin API settings');
  const adminListen = listen(p, admin, 'admin', DEFAULT_ADMIN_LISTEN);
  const tokenFile = filePath(p, admin, 'tokenFile', 'admin', configDir);
  if (adminListen !== null && admin !== null && tokenFile === null && admin['tokenFile'] == null && !isLoopback(adminListen.host)) {
    p.add('admin.tokenFile', `missing; a token file is required when admin.listen (${formatListen(adminListen)}) is not a loopback address`);
  }
  return { listen: adminListen, tokenFile };
}

function announceSection(p: ProblemList, raw: Raw, configDir: string | null): Config['announce'] | undefined {
  const a = section(p, raw, 'announce', '', ANNOUNCE_KEYS, 'announce settings (enabled, routesFile, birdSocket, onFailOpen, withdrawDelay)');
  if (a === null) return { enabled: false, routesFile: DEFAULT_ROUTES_FILE, birdSocket: null, onFailOpen: true, withdrawDelayMs: DEFAULT_WITHDRAW_DELAY_MS };
  const enabled = flag(p, a, 'enabled', 'announce', false);
  const onFailOpen = flag(p, a, 'onFailOpen', 'announce', true);
  const routesFile = filePath(p, a, 'routesFile', 'announce', configDir) ?? DEFAULT_ROUTES_FILE;
  const birdSocket = filePath(p, a, 'birdSocket', 'announce', configDir);
  const withdrawDelayMs = duration(p, a, 'withdrawDelay', 'announce', DEFAULT_WITHDRAW_DELAY_MS);
  if (enabled === undefined || onFailOpen === undefined || withdrawDelayMs === undefined) return undefined;
  return { enabled, routesFile, birdSocket, onFailOpen, withdrawDelayMs };
}

function flag(p: ProblemList, obj: Raw, key: string, path: string, fallback: boolean): boolean | undefined {
  const value = obj[key];
  if (value === undefined || value === null) return fallback;
  if (typeof value === 'boolean') return value;
  p.add(join2(path, key), `${describe(value)} is not true or false`);
  return undefined;
}

function tunnelSection(p: ProblemList, raw: Raw, vipOwners: VipOwners): Config['tunnel'] {
  const tunnel = section(p, raw, 'tunnel', '', TUNNEL_KEYS, 'tunnel settings (sourceV4, sourceV6)');
  if (tunnel === null) return { sourceV4: null, sourceV6: null };
  const v4 = tunnelSource(p, tunnel, 'sourceV4', 4, vipOwners);
  const v6 = tunnelSource(p, tunnel, 'sourceV6', 6, vipOwners);
  return { sourceV4: v4, sourceV6: v6 };
}

function tunnelSource(p: ProblemList, tunnel: Raw, key: string, family: AddressFamily, vipOwners: VipOwners): string | null {
  const value = tunnel[key];
  if (value === undefined || value === null) return null;
  const at = join2('tunnel', key);
  const parsed = unicastAddress(p, value, at, 'a tunnel source');
  if (parsed === null) return null;
  if (parsed.family !== family) {
    p.add(at, `${describe(value)} is not an IPv${family} address`);
    return null;
  }
  const owner = vipOwners.get(parsed.address);
  if (owner !== undefined) {
    // Real servers hold every VIP on lo, and Linux drops a packet whose source is a local address (martian source).
    p.add(at, `${describe(value)} is the VIP of ${owner}; the outer source must be an address of the load balancer that is not a VIP (real servers hold the VIPs on lo and drop packets from them)`);
    return null;
  }
  return parsed.address;
}

/** Each VIP in the file (canonical text) -> the first service that has it, as `services[0] ("web")`. */
type VipOwners = ReadonlyMap<string, string>;

/**
 * Read ahead of the services themselves, so a real or tunnel source checked before a later
 * service still sees its VIP; a VIP that does not parse is reported by its own service.
 */
function vipOwnersOf(raw: Raw): VipOwners {
  const owners = new Map<string, string>();
  const services = raw['services'];
  if (!Array.isArray(services)) return owners;
  services.forEach((item: unknown, index: number) => {
    if (!isMapping(item) || typeof item['vip'] !== 'string') return;
    const vip = parseIpAddress(item['vip']);
    const name = typeof item['name'] === 'string' ? ` (${describe(item['name'])})` : '';
    if (vip !== null && !owners.has(vip.address)) owners.set(vip.address, `services[${index}]${name}`);
  });
  return owners;
}

function listen(p: ProblemList, obj: Raw | null, path: string, fallback: ListenAddress): ListenAddress | null {
  if (obj === null) return null;
  const value = obj['listen'];
  if (value === undefined || value === null) return fallback;
  const at = join2(path, 'listen');
  const example = `e.g. ${formatListen(fallback)} or [::1]:${fallback.port}`;
  if (typeof value !== 'string') {
    p.add(at, `${describe(value)} is not a listen address (host:port, ${example})`);
    return null;
  }
  const parsed = parseListenAddress(value);
  if (parsed !== null) return parsed;
  const match = /^(?:\[([^\]]*)\]|(.*)):([^:\]]*)$/.exec(value);
  if (match === null) {
    p.add(at, `${describe(value)} is not a listen address (host:port, ${example})`);
  } else if (match[1] === undefined && (match[2] ?? '').includes(':')) {
    p.add(at, `${describe(value)} is not a listen address; put an IPv6 host in brackets, e.g. [::1]:${fallback.port}`);
  } else if (parseIpAddress(match[1] ?? match[2] ?? '') === null) {
    p.add(at, `${describe(value)} is not a listen address: ${describe(match[1] ?? match[2])} is not an IP address (${example})`);
  } else if (match[1] !== undefined && !(match[1] ?? '').includes(':')) {
    p.add(at, `${describe(value)} is not a listen address: only IPv6 hosts go in brackets`);
  } else {
    p.add(at, `${describe(value)} is not a listen address: ${describe(match[3])} is not a port (1..65535)`);
  }
  return null;
}

function serviceList(p: ProblemList, raw: Raw, vipOwners: VipOwners): ServiceConfig[] {
  const value = raw['services'];
  if (value === undefined) {
    p.add('services', 'missing; expected a list of services');
    return [];
  }
  if (!Array.isArray(value)) {
    p.add('services', `expected a list of services, got ${describe(value)}`);
    return [];
  }
  if (value.length === 0) {
    p.add('services', 'an empty list; expected at least one service');
    return [];
  }
  const services: ServiceConfig[] = [];
  const explicitNames: (string | null)[] = [];
  const slots: (ServiceConfig | null)[] = [];
  value.forEach((item: unknown, index: number) => {
    const parsed = serviceEntry(p, item, `services[${index}]`, vipOwners);
    slots.push(parsed?.service ?? null);
    explicitNames.push(parsed?.explicitName ?? null);
    if (parsed !== null && parsed.service !== null) services.push(parsed.service);
  });
  checkServiceIdentity(p, slots, explicitNames);
  // The packet loop's counters and flow table name reals by a small id, one per (service, real) pair.
  // (A service with a problem in its reals holds none here.)
  const pairs = services.reduce((n, s) => n + ((s.reals as RealConfig[] | null)?.length ?? 0), 0);
  if (pairs > MAX_REAL_IDS) p.add('services', `${pairs} (service, real) pairs; at most ${MAX_REAL_IDS} in all`);
  return services;
}

/**
 * (vip, protocol, port) must be unique; no name may equal another service's name, nor read as a
 * service address in any spelling (`TCP://203.0.113.10:080`) unless it is the service's own address
 * as written canonically: the CLI and admin API match names before addresses, so such a name would
 * take another service's address over.
 */
function checkServiceIdentity(p: ProblemList, slots: readonly (ServiceConfig | null)[], explicitNames: readonly (string | null)[]): void {
  // Looked up by Map, not by a scan of the services per service: 2,000 services are 2 million
  // comparisons each way.
  const indexesByAddress = new Map<string, number[]>();
  const firstByName = new Map<string, number>();
  slots.forEach((service, index) => {
    if (service === null) return;
    const key = serviceAddressName(service.protocol, service.vip, service.port);
    const indexes = indexesByAddress.get(key);
    if (indexes === undefined) {
      indexesByAddress.set(key, [index]);
    } else {
      indexes.push(index);
      p.add(`services[${index}]`, `${key} is already defined by services[${indexes[0]}] (${describe(slots[indexes[0]!]?.name)})`);
    }
  });
  // Names in order, a service with problems elsewhere (`protocol: sctp`) by its written name too:
  // a name it repeats is found in the same run, not after the other problem is fixed.
  slots.forEach((service, index) => {
    const name = explicitNames[index] ?? service?.name;
    if (name !== undefined && name !== null && !firstByName.has(name)) firstByName.set(name, index);
  });
  explicitNames.forEach((name, index) => {
    if (name === null) return;
    const addressProblem = nameAsAddressProblem(name, index, slots, indexesByAddress);
    if (addressProblem !== null) {
      p.add(`services[${index}].name`, addressProblem);
      return;
    }
    const other = firstByName.get(name);
    if (other !== undefined && other < index) p.add(`services[${index}].name`, `${describe(name)} is already the name of services[${other}]`);
  });
}

/**
 * Why services[index] may not be called `name`, which reads as a service address; null when it
 * does not, or is its own canonical address. `indexesByAddress`: each service address -> the
 * indexes of the services that have it, in order.
 */
function nameAsAddressProblem(name: string, index: number, slots: readonly (ServiceConfig | null)[], indexesByAddress: ReadonlyMap<string, readonly number[]>): string | null {
  const address = parseServiceAddressName(name);
  if (address === null) return null;
  const own = slots[index] ?? null;
  const ownName = own === null ? null : serviceAddressName(own.protocol, own.vip, own.port);
  if (name === ownName) return null;
  // The first service other than this one with that address.
  const other = indexesByAddress.get(address)?.find((i) => i !== index) ?? -1;
  if (other !== -1) return `${describe(name)} is the address of services[${other}]; choose another name`;
  // A service whose address did not parse has its own problems; whose address this is cannot be told.
  if (ownName === null) return null;
  if (address === ownName) return `${describe(name)} is this service's address written another way; write it as ${JSON.stringify(ownName)} or choose another name`;
  return `${describe(name)} is written as a service address, but this service is ${ownName}; choose another name`;
}

/**
 * `tcp://VIP:PORT` / `udp://[V6]:PORT` as the CLI and admin API read a SERVICE (protocol in any
 * case, any spelling of the address, leading zeros in the port) -> its parts, the VIP canonical;
 * else null.
 */
export function parseServiceAddress(text: string): { protocol: Protocol; vip: string; port: number } | null {
  const match = /^(tcp|udp):\/\/(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/i.exec(text);
  if (match === null) return null;
  const vip = parseIpAddress(match[2] ?? match[3] ?? '');
  if (vip === null || (match[2] !== undefined) !== (vip.family === 6)) return null;
  return { protocol: match[1]!.toLowerCase() as Protocol, vip: vip.address, port: Number(match[4]) };
}

/**
 * A SERVICE given by address, as the CLI and admin API take it: `tcp://VIP:PORT` (see
 * parseServiceAddress), or `VIP:PORT` / `[V6]:PORT` as status prints it, protocol null (either).
 */
export function parseServiceRef(text: string): { protocol: Protocol | null; vip: string; port: number } | null {
  const a = parseServiceAddress(text);
  if (a !== null) return a;
  // Port 0 too: a service of every port of its VIP, as status prints it (VIP:0).
  const e = parseClientEndpoint(text, 0);
  return 'error' in e ? null : { protocol: null, vip: e.address, port: e.port };
}

/** A SERVICE written as an address (see parseServiceAddress) -> its canonical form; else null. */
export function parseServiceAddressName(text: string): string | null {
  const a = parseServiceAddress(text);
  return a === null ? null : serviceAddressName(a.protocol, a.vip, a.port);
}

interface ServiceEntry {
  readonly service: ServiceConfig | null;
  readonly explicitName: string | null;
}

function serviceEntry(p: ProblemList, item: unknown, path: string, vipOwners: VipOwners): ServiceEntry | null {
  if (!isMapping(item)) {
    p.add(path, `expected a mapping with vip, port and reals, got ${describe(item)}`);
    return null;
  }
  const before = p.items.length;
  checkKeys(p, item, path, SERVICE_KEYS, SERVICE_MISPLACED);
  const explicitName = serviceName(p, item, path);
  const vipValue = item['vip'];
  let vip: { address: string; family: AddressFamily } | null = null;
  if (vipValue === undefined || vipValue === null) {
    p.add(join2(path, 'vip'), `${vipValue === null ? 'is empty' : 'missing'}; expected an IPv4 or IPv6 address`);
  } else {
    vip = unicastAddress(p, vipValue, join2(path, 'vip'), 'a VIP');
  }
  const port = integer(p, item, 'port', path, 0, 65535, 'a port', undefined);
  const protocol = oneOf(p, item, 'protocol', path, PROTOCOLS, 'tcp');
  const scheduler = oneOf(p, item, 'scheduler', path, SCHEDULERS, 'maglev');
  const forwarding = oneOf(p, item, 'forwarding', path, FORWARDINGS, 'l2');
  const whenAllDown = oneOf(p, item, 'whenAllDown', path, WHEN_ALL_DOWN, 'failOpen');
  const onRealDown = oneOf(p, item, 'onRealDown', path, ON_REAL_DOWN, 'reschedule');
  const persistence = oneOf(p, item, 'persistence', path, PERSISTENCES, 'none');
  const persistencePrefix = persistencePrefixField(p, item, path, persistence, scheduler, vip?.family);
  const ops = opsField(p, item, path, protocol, scheduler);
  const tableSize = tableSizeField(p, item, path, scheduler);
  const healthCheck = healthCheckSection(p, item, path, port);
  const announce = flag(p, item, 'announce', path, true);
  const reals = realList(p, item, path, vip, forwarding, vipOwners);
  if (tableSize !== undefined && reals !== null && reals.length > tableSize) {
    p.add(join2(path, 'tableSize'), `${tableSize} is smaller than the number of reals (${reals.length}); Maglev needs at least one slot per real`);
  }
  // The address form is known as soon as its three parts are, so duplicate checks still run
  // when something else in the service is wrong.
  if (vip === null || port === undefined || protocol === undefined) return { service: null, explicitName };
  const name = explicitName ?? serviceAddressName(protocol, vip.address, port);
  if (p.items.length > before) {
    // Enough of the service for identity checks; the rest is never returned because problems exist.
    return { service: { name, vip: vip.address, family: vip.family, port, protocol } as ServiceConfig, explicitName };
  }
  const service: ServiceConfig = {
    name,
    vip: vip.address,
    family: vip.family,
    port,
    protocol,
    scheduler: scheduler as SchedulerKind,
    forwarding: forwarding as ForwardingMode,
    whenAllDown: whenAllDown as WhenAllDown,
    onRealDown: onRealDown as OnRealDown,
    persistence: persistence as Persistence,
    persistencePrefix: persistencePrefix as number,
    ops: ops as boolean,
    tableSize: tableSize ?? DEFAULT_TABLE_SIZE,
    healthCheck: healthCheck as HealthCheckConfig,
    announce: announce as boolean,
    reals: reals as RealConfig[],
  };
  return { service, explicitName };
}

/**
 * `persistencePrefix` (a prefix length of the VIP's family; default the whole address), checked
 * with `persistence` and `scheduler`: client persistence hashes the client address, which wlc
 * does not place by. Without a VIP family the prefix is not checked (the VIP has its own problem).
 */
function persistencePrefixField(p: ProblemList, item: Raw, path: string, persistence: string | undefined, scheduler: string | undefined, family: AddressFamily | undefined): number | undefined {
  if (persistence === 'client' && scheduler === 'wlc') {
    p.add(join2(path, 'persistence'), 'client persistence needs scheduler maglev or rendezvous: wlc places each connection by load, so a client\'s connections would go to different reals');
  }
  const bits = family === 6 ? 128 : 32;
  const value = item['persistencePrefix'];
  if (value === undefined || value === null) return bits;
  if (persistence !== 'client') {
    p.add(join2(path, 'persistencePrefix'), `${describe(value)} is set but persistence is ${persistence ?? 'not valid'}; add persistence: client, or leave persistencePrefix out`);
    return undefined;
  }
  if (family === undefined) return undefined;
  return integer(p, item, 'persistencePrefix', path, 1, bits, `a prefix length of an IPv${family} client address`, bits);
}

/**
 * `ops` (one-packet scheduling): UDP only, as IPVS has it (a TCP connection's packets must meet on
 * one real), and a hashing scheduler (wlc places by the flow counts ops never makes).
 */
function opsField(p: ProblemList, item: Raw, path: string, protocol: string | undefined, scheduler: string | undefined): boolean | undefined {
  const ops = flag(p, item, 'ops', path, false);
  if (ops !== true) return ops;
  if (protocol === 'tcp') p.add(join2(path, 'ops'), 'one-packet scheduling is for UDP services: the packets of a TCP connection must all reach one real');
  else if (scheduler === 'wlc') p.add(join2(path, 'ops'), 'one-packet scheduling needs scheduler maglev or rendezvous: wlc places by the flow counts a service without flow entries never has');
  return ops;
}

function serviceName(p: ProblemList, item: Raw, path: string): string | null {
  const value = item['name'];
  if (value === undefined || value === null) return null;
  const at = join2(path, 'name');
  if (typeof value !== 'string') {
    p.add(at, `${describe(value)} is not a service name (a string)`);
    return null;
  }
  if (value.length === 0 || value.trim() !== value || hasControl(value)) {
    p.add(at, `${describe(value)} is not a service name (non-empty, no leading or trailing spaces, no control characters)`);
    return null;
  }
  // URL paths drop these segments (also written %2e%2e): `dsrlb drain .. REAL` could not reach it.
  if (value === '.' || value === '..') {
    p.add(at, `${describe(value)} is not a service name: the admin API's paths cannot carry it`);
    return null;
  }
  return value;
}

function tableSizeField(p: ProblemList, item: Raw, path: string, scheduler: SchedulerKind | undefined): number | undefined {
  const value = item['tableSize'];
  if (value === undefined || value === null) return undefined;
  const at = join2(path, 'tableSize');
  // wlc has a Maglev table too: it places the packets that arrive without an entry (another LB's
  // flows, or any after a restart), so its size is the operator's to choose as for maglev.
  if (scheduler === 'rendezvous') {
    p.add(at, `applies only to the maglev and wlc schedulers, which keep a Maglev table (scheduler is ${scheduler})`);
    return undefined;
  }
  const size = integer(p, item, 'tableSize', path, MIN_TABLE_SIZE, MAX_TABLE_SIZE, 'a Maglev table size', undefined);
  if (size === undefined) return undefined;
  if (!isPrime(size)) {
    p.add(at, `${size} is not a prime; Maglev needs a prime table size (e.g. 65537)`);
    return undefined;
  }
  return size;
}

/** A health check's settings where the config leaves them out; `port` is the service's. */
export function healthCheckDefaults(port: number): Omit<HealthCheckConfig, 'type'> {
  return {
    port,
    path: '/',
    host: null,
    expectStatus: [200],
    expectBody: null,
    payload: null,
    expectPayload: null,
    command: null,
    intervalMs: 2000,
    timeoutMs: 1000,
    rise: 2,
    fall: 3,
  };
}

function healthCheckSection(p: ProblemList, item: Raw, path: string, servicePort: number | undefined): HealthCheckConfig | undefined {
  const at = join2(path, 'healthCheck');
  const value = item['healthCheck'];
  const base = healthCheckDefaults(servicePort ?? 0);
  if (value === undefined || value === null) return { type: 'none', ...base };
  if (!isMapping(value)) {
    p.add(at, `expected a mapping with a type (${CHECK_TYPES.join(', ')}), got ${describe(value)}`);
    return undefined;
  }
  const before = p.items.length;
  checkKeys(p, value, at, CHECK_KEYS);
  // A bad or missing type does not stop the checks below: every problem is reported in one pass.
  let type: HealthCheckType | undefined;
  if (value['type'] === undefined || value['type'] === null) {
    p.add(join2(at, 'type'), `${value['type'] === null ? 'is empty' : 'missing'}; expected one of ${CHECK_TYPES.join(', ')}`);
  } else {
    type = oneOf(p, value, 'type', at, CHECK_TYPES, 'none');
  }
  // `none` and an unknown type take every key; a key refused for its type is not checked further.
  const check: Raw = { ...value };
  if (type !== undefined && type !== 'none') {
    for (const [key, types] of Object.entries(CHECK_KEY_TYPES)) {
      if (value[key] !== undefined && !types.includes(type)) {
        p.add(join2(at, key), `applies only to ${listWords(types, 'and')} checks (type is ${type})`);
        delete check[key];
      }
    }
  }
  let port: number | undefined = base.port;
  if (check['port'] !== undefined && check['port'] !== null) {
    port = integer(p, check, 'port', at, 1, 65535, 'a health-check port', undefined);
  } else if (servicePort === 0 && type !== undefined && !PORTLESS_CHECK_TYPES.includes(type)) {
    p.add(join2(at, 'port'), `missing; ${CHECK_ARTICLE[type]} ${type} check needs a port because the service port is 0 (every port)`);
  }
  let checkPath = base.path;
  const pathValue = check['path'];
  if (pathValue !== undefined && pathValue !== null) {
    if (typeof pathValue !== 'string' || !pathValue.startsWith('/') || /\s/.test(pathValue) || hasControl(pathValue)) {
      p.add(join2(at, 'path'), `${describe(pathValue)} is not a URL path (it must start with "/" and have no spaces)`);
    } else {
      checkPath = pathValue;
    }
  }
  const host = optionalString(p, check, 'host', at, 'a Host header value', /^[^\s\x00-\x1f\x7f]+$/);
  const expectStatus = statusList(p, check, at, base.expectStatus);
  const expectBody = optionalString(p, check, 'expectBody', at, 'a non-empty body substring', /^[\s\S]+$/);
  const payload = optionalString(p, check, 'payload', at, 'a UDP payload string', /^[\s\S]*$/);
  const expectPayload = optionalString(p, check, 'expectPayload', at, 'a non-empty reply substring', /^[\s\S]+$/);
  const command = optionalString(p, check, 'command', at, 'a shell command', /\S/);
  if (type === 'exec' && command === null && (check['command'] === undefined || check['command'] === null)) {
    p.add(join2(at, 'command'), 'missing; an exec check needs a command (run with /bin/sh -c)');
  }
  const intervalMs = duration(p, check, 'interval', at, base.intervalMs);
  const timeoutMs = duration(p, check, 'timeout', at, base.timeoutMs);
  if (intervalMs !== undefined && timeoutMs !== undefined && timeoutMs > intervalMs) {
    p.add(join2(at, 'timeout'), `${formatDurationMs(timeoutMs)} is longer than the interval (${formatDurationMs(intervalMs)}); a probe must end before the next one starts`);
  }
  const rise = integer(p, check, 'rise', at, 1, 100, 'a success count', base.rise);
  const fall = integer(p, check, 'fall', at, 1, 100, 'a failure count', base.fall);
  if (type === undefined || p.items.length > before) return undefined;
  // A check switched off keeps its (now valid) settings in the file only: the running config
  // carries the defaults, so editing an idle check's values is not a change to plan or reload.
  if (type === 'none') return { type, ...base };
  return {
    type,
    port: port as number,
    path: checkPath,
    host,
    expectStatus: expectStatus as number[],
    expectBody,
    payload: type === 'udp' ? (payload ?? 'ping') : null,
    expectPayload,
    command: type === 'exec' ? command : null,
    intervalMs: intervalMs as number,
    timeoutMs: timeoutMs as number,
    rise: rise as number,
    fall: fall as number,
  };
}

function statusList(p: ProblemList, check: Raw, path: string, fallback: readonly number[]): number[] | undefined {
  const value = check['expectStatus'];
  if (value === undefined || value === null) return [...fallback];
  return integerList(p, value, join2(path, 'expectStatus'), {
    min: 100,
    max: 599,
    what: 'an HTTP status',
    ifEmpty: 'expected at least one HTTP status, e.g. [200]',
    unique: false,
  });
}

/** `cpus: [2, 3]`: the CPUs the packet loops are pinned to, one each in turn. */
function cpuList(p: ProblemList, raw: Raw): number[] | undefined {
  const value = raw['cpus'];
  if (value === undefined || value === null) return [];
  return integerList(p, value, 'cpus', {
    min: 0,
    max: 1023,
    what: 'a CPU number',
    ifEmpty: 'leave cpus out to let the kernel place the packet loops',
    unique: true,
  });
}

/**
 * A non-empty list of integers in [min, max] at `at`; a single one is accepted as a list of one.
 * Every bad item is reported at its own path; then the result is undefined.
 */
function integerList(
  p: ProblemList,
  value: unknown,
  at: string,
  o: { min: number; max: number; what: string; ifEmpty: string; unique: boolean },
): number[] | undefined {
  const items: unknown[] = Array.isArray(value) ? value : [value];
  if (items.length === 0) {
    p.add(at, `an empty list; ${o.ifEmpty}`);
    return undefined;
  }
  const out: number[] = [];
  items.forEach((item, index) => {
    const itemPath = Array.isArray(value) ? `${at}[${index}]` : at;
    if (typeof item !== 'number' || !Number.isInteger(item) || item < o.min || item > o.max) {
      p.add(itemPath, `${describe(item)} is not ${o.what} (${o.min}..${o.max})`);
    } else if (o.unique && out.includes(item)) {
      p.add(itemPath, `${item} is listed twice`);
    } else {
      out.push(item);
    }
  });
  return out.length === items.length ? out : undefined;
}

function realList(
  p: ProblemList,
  item: Raw,
  path: string,
  vip: { address: string; family: AddressFamily } | null,
  serviceForwarding: ForwardingMode | undefined,
  vipOwners: VipOwners,
): RealConfig[] | null {
  const at = join2(path, 'reals');
  const value = item['reals'];
  if (value === undefined || value === null) {
    p.add(at, `${value === null ? 'is empty' : 'missing'}; expected a list of reals (write [] for none yet)`);
    return null;
  }
  if (!Array.isArray(value)) {
    p.add(at, `expected a list of reals, got ${describe(value)}`);
    return null;
  }
  const reals: RealConfig[] = [];
  const firstByAddress = new Map<string, number>();
  value.forEach((entry: unknown, index: number) => {
    const realPath = `${at}[${index}]`;
    if (!isMapping(entry)) {
      p.add(realPath, `expected a mapping with an address, got ${describe(entry)}`);
      return;
    }
    checkKeys(p, entry, realPath, REAL_KEYS, REAL_MISPLACED);
    const addressPath = join2(realPath, 'address');
    const addressValue = entry['address'];
    let address: { address: string; family: AddressFamily } | null = null;
    if (addressValue === undefined || addressValue === null) {
      p.add(addressPath, `${addressValue === null ? 'is empty' : 'missing'}; expected an IPv4 or IPv6 address`);
    } else {
      address = unicastAddress(p, addressValue, addressPath, 'a real');
    }
    const weight = integer(p, entry, 'weight', realPath, 0, MAX_WEIGHT, 'a weight', DEFAULT_WEIGHT);
    const state = oneOf(p, entry, 'state', realPath, INTENTS, 'active');
    const override = oneOf(p, entry, 'forwarding', realPath, FORWARDINGS, null);
    const backup = flag(p, entry, 'backup', realPath, false);
    const forwarding = override ?? serviceForwarding;
    if (address !== null) {
      const first = firstByAddress.get(address.address);
      if (first !== undefined) {
        p.add(addressPath, `${describe(addressValue)} is the same address as ${at}[${first}]`);
      } else {
        firstByAddress.set(address.address, index);
      }
      const otherOwner = vipOwners.get(address.address);
      if (vip !== null && address.address === vip.address) {
        p.add(addressPath, `${describe(addressValue)} is the VIP itself; a real must be another host`);
      } else if (otherOwner !== undefined) {
        p.add(addressPath, `${describe(addressValue)} is the VIP of ${otherOwner}; traffic to a VIP goes to the load balancer, so this real could never be reached`);
      } else if (vip !== null && address.family !== vip.family) {
        if (vip.family === 6) {
          p.add(addressPath, `${describe(addressValue)} is IPv4 but the VIP ${vip.address} is IPv6; an IPv6 VIP needs IPv6 reals`);
        } else if (forwarding === 'l2') {
          p.add(addressPath, `${describe(addressValue)} is IPv6 but the VIP ${vip.address} is IPv4; l2 forwarding needs the same family (ipip can carry IPv4 in IPv6)`);
        }
      }
    }
    if (address !== null && weight !== undefined && state !== undefined && forwarding !== undefined && backup !== undefined) {
      reals.push({ address: address.address, family: address.family, weight, state, forwarding, backup });
    }
  });
  // Backups only would run the service on its backups for good, flagged and alerted as a fault.
  if (reals.length > 0 && reals.length === value.length && reals.every((r) => r.backup)) {
    p.add(at, `every real is a backup (backup: true): backups take new flows only while no other real can, so the service would always run on them (status ON_BACKUPS, alert DsrlbServiceOnBackups); make at least one a primary (backup: false)`);
  }
  return reals;
}

// ---------------------------------------------------------------------------------------------
// Field readers: each reports its own problem and returns undefined (or null) when the value is bad.

function section(p: ProblemList, obj: Raw, key: string, path: string, keys: readonly string[], what: string, misplaced: Readonly<Record<string, string>> = {}): Raw | null {
  const value = obj[key];
  const at = join2(path, key);
  if (value === undefined || value === null) return {};
  if (!isMapping(value)) {
    p.add(at, `expected a mapping of ${what}, got ${describe(value)}`);
    return null;
  }
  checkKeys(p, value, at, keys, misplaced);
  return value;
}

function requiredString(p: ProblemList, obj: Raw, key: string, path: string, what: string): string | undefined {
  const value = obj[key];
  const at = join2(path, key);
  if (value === undefined || value === null) {
    p.add(at, `${value === null ? 'is empty' : 'missing'}; expected ${what}`);
    return undefined;
  }
  if (typeof value !== 'string' || value.length === 0) {
    p.add(at, `${describe(value)} is not ${what}`);
    return undefined;
  }
  return value;
}

function optionalString(p: ProblemList, obj: Raw, key: string, path: string, what: string, shape: RegExp): string | null {
  const value = obj[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || !shape.test(value)) {
    const quoteHint = typeof value === 'number' || typeof value === 'boolean' ? '; put it in quotes' : '';
    p.add(join2(path, key), `${describe(value)} is not ${what}${quoteHint}`);
    return null;
  }
  return value;
}

/** A file path; a relative one is taken from the config file's directory, so the daemon's cwd never matters. */
function filePath(p: ProblemList, obj: Raw | null, key: string, path: string, configDir: string | null): string | null {
  if (obj === null) return null;
  const value = optionalString(p, obj, key, path, 'a file path', /^[^\x00]+$/);
  if (value === null) return null;
  return configDir === null ? value : resolve(configDir, value);
}

function integer(p: ProblemList, obj: Raw, key: string, path: string, min: number, max: number, what: string, fallback: number | undefined): number | undefined {
  const value = obj[key];
  const at = join2(path, key);
  if (value === undefined || value === null) {
    if (fallback !== undefined) return fallback;
    p.add(at, `${value === null ? 'is empty' : 'missing'}; expected ${what} (${min}..${max})`);
    return undefined;
  }
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    const quoteHint = typeof value === 'string' && /^\d+$/.test(value) ? '; write the number without quotes' : '';
    p.add(at, `${describe(value)} is not ${what} (${min}..${max})${quoteHint}`);
    return undefined;
  }
  return value;
}

function oneOf<T extends string, F extends T | null>(p: ProblemList, obj: Raw, key: string, path: string, allowed: readonly T[], fallback: F): T | F | undefined {
  const value = obj[key];
  if (value === undefined || value === null) return fallback;
  if (typeof value === 'string' && (allowed as readonly string[]).includes(value)) return value as T;
  const folded = typeof value === 'string' ? allowed.find((option) => option.toLowerCase() === value.toLowerCase()) : undefined;
  const hint = folded === undefined ? '' : ` (did you mean "${folded}"?)`;
  p.add(join2(path, key), `${describe(value)} is not ${listWords(allowed, 'or')}${hint}`);
  return undefined;
}

function duration(p: ProblemList, obj: Raw, key: string, path: string, fallbackMs: number): number | undefined {
  const value = obj[key];
  if (value === undefined || value === null) return fallbackMs;
  const parsed = parseDurationMs(value);
  if (parsed.ok) return parsed.ms;
  p.add(join2(path, key), parsed.message);
  return undefined;
}

/** An address for a VIP, real or tunnel source: unicast, and IPv4 written as IPv4. */
function unicastAddress(p: ProblemList, value: unknown, at: string, role: string): { address: string; family: AddressFamily } | null {
  const checked = checkUnicast(value, role);
  if (typeof checked === 'string') {
    p.add(at, checked);
    return null;
  }
  return checked;
}

/**
 * Why `value` cannot be a VIP, a real or a tunnel source (`role`, e.g. "a VIP"): not an address,
 * IPv4-mapped, or not unicast (unspecified, multicast, broadcast, loopback). Null when it can.
 */
export function unicastProblem(value: unknown, role: string): string | null {
  const checked = checkUnicast(value, role);
  return typeof checked === 'string' ? checked : null;
}

/** The parsed unicast address, or why `value` is not one (see unicastProblem): the text parsed once. */
function checkUnicast(value: unknown, role: string): { address: string; family: AddressFamily } | string {
  const parsed = typeof value === 'string' ? parseIp(value) : null;
  if (parsed === null) {
    const zoneHint = typeof value === 'string' && value.includes('%') ? ' (zone indexes such as %eth0 are not supported)' : '';
    return `${describe(value)} is not an IPv4 or IPv6 address${zoneHint}`;
  }
  const range = parsed.ip.range();
  if (range === 'ipv4Mapped') {
    const v4 = (parsed.ip as ipaddr.IPv6).toIPv4Address().toString();
    return `${describe(value)} is an IPv4-mapped IPv6 address; write the IPv4 address ${v4}`;
  }
  const refused: Readonly<Record<string, string>> = {
    unspecified: 'the unspecified address',
    multicast: 'a multicast address',
    broadcast: 'the broadcast address',
    loopback: 'a loopback address',
  };
  // An IPv6 link-local address means nothing without its zone (probes, routes, BIRD), which the config cannot give.
  const what = parsed.family === 6 && range === 'linkLocal' ? 'an IPv6 link-local address (it needs a zone)' : refused[range];
  return what === undefined ? { address: parsed.address, family: parsed.family } : `${describe(value)} is ${what}; ${role} must be a unicast address reachable on the network`;
}

/** `raw` without its `x-` keys (extension fields: ignored, so anchors can be defined there). */
function withoutExtensionKeys(raw: Raw): Raw {
  return Object.fromEntries(Object.entries(raw).filter(([key]) => !key.startsWith('x-')));
}

/**
 * Refuses keys not in `known`. A key that is right one level off (`interval` directly under a
 * service) is told where it belongs; otherwise a near known key is suggested, or the list given.
 */
function checkKeys(p: ProblemList, obj: Raw, path: string, known: readonly string[], misplaced: Readonly<Record<string, string>> = {}): void {
  for (const key of Object.keys(obj)) {
    const message = unknownKeyMessage(key, known, misplaced);
    if (message !== null) p.add(keyPath(path, key), message);
  }
}

/**
 * The problem with `key` in a mapping whose keys are `known`, or null if it is one of them: where it
 * belongs when `misplaced` says so, else the near known key, else the list. Shared with scenarios.
 */
export function unknownKeyMessage(key: string, known: readonly string[], misplaced: Readonly<Record<string, string>> = {}): string | null {
  if (known.includes(key)) return null;
  if (Object.hasOwn(misplaced, key)) return `unknown key; ${misplaced[key]}`;
  const hint = closestKey(key, known);
  return hint === null ? `unknown key (expected one of ${known.join(', ')})` : `unknown key (did you mean "${hint}"?)`;
}

/** Hints for keys written in the wrong mapping: each key of a group -> "it belongs under <where>"; the first group naming a key wins. */
function belongsUnder(groups: readonly (readonly [readonly string[], string])[]): Readonly<Record<string, string>> {
  const hints: Record<string, string> = {};
  for (const [keys, where] of groups) {
    for (const key of keys) hints[key] ??= `it belongs under ${where}`;
  }
  return hints;
}

/** The known key a typo most likely meant: same letters in another case, or within edit distance 2. */
export function closestKey(key: string, known: readonly string[]): string | null {
  const folded = known.find((candidate) => candidate.toLowerCase() === key.toLowerCase());
  if (folded !== undefined) return folded;
  let best: string | null = null;
  let bestDistance = 3;
  const lowered = key.toLowerCase();
  for (const candidate of known) {
    const other = candidate.toLowerCase();
    // The edit distance is at least the length difference: a long pasted key is not compared in full.
    if (Math.abs(lowered.length - other.length) >= bestDistance) continue;
    const distance = levenshtein(lowered, other);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  // Two edits turn any two-letter key into any other: demand the key be longer than the edits.
  return best !== null && bestDistance < Math.max(key.length, best.length) ? best : null;
}

function levenshtein(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      current.push(Math.min((previous[j] as number) + 1, (current[j - 1] as number) + 1, (previous[j - 1] as number) + cost));
    }
    previous = current;
  }
  return previous[b.length] as number;
}

// ---------------------------------------------------------------------------------------------
// Small utilities

/** A YAML parse error as a problem: the first line of the message, the position in the path. */
export function yamlProblem(message: string, pos: { line: number; col: number } | undefined): ConfigProblem {
  // yaml's pretty errors append " at line L, column C:" and a code frame; the position goes in the path.
  const lines = message.split('\n');
  let text = (lines[0] ?? message).replace(/ at line \d+, column \d+:?\s*$/, '');
  if (text === 'Map keys must be unique' && pos !== undefined) {
    // The code frame's line above the caret holds the repeated key, at the error's column.
    const caret = lines.findIndex((l) => /^\s*\^+\s*$/.test(l));
    const key = caret > 0 ? /^\s*(?:"([^"]*)"|'([^']*)'|([^:#]+?))\s*:/.exec(lines[caret - 1]!.slice(pos.col - 1)) : null;
    if (key) text = `the key "${key[1] ?? key[2] ?? key[3]}" is given twice in one mapping (YAML keys must be unique)`;
  }
  return { path: pos === undefined ? '(yaml)' : `(yaml) line ${pos.line}, column ${pos.col}`, message: text };
}

function configDirOf(opts: ParseOptions): string | null {
  return opts.sourcePath === undefined ? null : dirname(resolve(opts.sourcePath));
}

function notAMapping(raw: unknown): string {
  return `expected a mapping with at least interface and services, got ${describe(raw)}`;
}

export function isMapping(value: unknown): value is Raw {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** `a, b or c` (or `and`), as error messages list the values a key takes. */
export function listWords(words: readonly string[], conjunction: 'and' | 'or'): string {
  if (words.length <= 1) return words.join('');
  return `${words.slice(0, -1).join(', ')} ${conjunction} ${words[words.length - 1]}`;
}

function join2(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`;
}

function hasControl(text: string): boolean {
  return /[\x00-\x1f\x7f]/.test(text);
}

function isPrime(n: number): boolean {
  if (n < 2) return false;
  if (n % 2 === 0) return n === 2;
  for (let d = 3; d * d <= n; d += 2) if (n % d === 0) return false;
  return true;
}

/** A loopback IP address (127.0.0.0/8, ::1): an admin API there needs no token. */
export function isLoopback(host: string): boolean {
  return ipaddr.parse(host).range() === 'loopback';
}

/** `host:port`, `[v6]:port`: how messages, restart-keys and the CLI write a listen address. */
export function formatListen(address: ListenAddress): string {
  return address.host.includes(':') ? `[${address.host}]:${address.port}` : `${address.host}:${address.port}`;
}

/** Two listeners clash on the same port when the hosts are equal or one is the wildcard of that family. */
function listensClash(a: ListenAddress, b: ListenAddress): boolean {
  if (a.port !== b.port) return false;
  if (a.host === b.host) return true;
  const wildcard = (host: string): boolean => host === '0.0.0.0' || host === '::';
  // Linux binds [::] dual-stack by default, so it overlaps IPv4 listeners too.
  return wildcard(a.host) && (a.host === '::' || !b.host.includes(':')) || wildcard(b.host) && (b.host === '::' || !a.host.includes(':'));
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value as object)) deepFreeze(child);
  }
  return value;
}
