// A `dsrlb simulate` scenario: a config (inline or a file beside the scenario) and a timed list of
// flow arrivals and control events. Parsed and validated whole before anything runs; every problem
// is a `path: message` line, as for the config file.

import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseDocument } from 'yaml';
import { MAX_REAL_IDS } from '../dataplane/counters.js';
import type { Config, ConfigProblem, Protocol, RealIntent, ServiceConfig, SourcePosition } from '../config/types.js';
import { describe, isMapping, isWeight, listWords, parseConfigText, parseIpAddress, parseListenAddress, serviceAddressName, unicastProblem, validateConfig, keyPath, unknownKeyMessage, yamlProblem } from '../config/validate.js';
import { locateProblems } from '../config/problem-positions.js';
import type { SimTuple } from './frames.js';

/** Events of a scenario are applied in file order; `at` never goes backwards. */
export type ScenarioEvent = FlowEvent | AddRealEvent | RemoveRealEvent | WeightEvent | HealthEvent | IntentEvent;

interface EventBase {
  /** Position in the scenario's `events` list. */
  readonly index: number;
  readonly atMs: number;
}

export interface FlowEvent extends EventBase {
  readonly kind: 'flow';
  readonly id: string;
  /** The service's name (the config's, after defaults). */
  readonly service: string;
  readonly tuple: SimTuple;
  readonly durationMs: number;
  readonly packetsPerSecond: number;
}

export interface AddRealEvent extends EventBase {
  readonly kind: 'addReal';
  readonly service: string;
  readonly address: string;
  readonly weight: number;
  /** A backup real (RealConfig.backup). */
  readonly backup: boolean;
}

export interface RemoveRealEvent extends EventBase {
  readonly kind: 'removeReal';
  readonly service: string;
  readonly address: string;
}

export interface WeightEvent extends EventBase {
  readonly kind: 'weight';
  readonly service: string;
  readonly address: string;
  readonly weight: number;
}

export interface HealthEvent extends EventBase {
  readonly kind: 'health';
  readonly service: string;
  readonly address: string;
  /** The damped fact, as the daemon holds it: unknown is a real its probes have not decided yet. */
  readonly state: 'up' | 'down' | 'unknown';
}

export interface IntentEvent extends EventBase {
  readonly kind: 'intent';
  readonly service: string;
  readonly address: string;
  readonly state: RealIntent;
}

export interface Scenario {
  readonly description: string | null;
  readonly config: Config;
  readonly events: readonly ScenarioEvent[];
}

export type ScenarioResult = { ok: true; scenario: Scenario } | { ok: false; problems: ConfigProblem[] };

export interface ScenarioParseOptions {
  /** The scenario file: a config path in it is taken from this file's directory (else the cwd). */
  readonly sourcePath?: string;
}

/** Longest scenario time accepted: a day of virtual time is far past any useful replay. */
export const MAX_SCENARIO_MS = 86_400_000;
/** Packets one flow may send per second; keeps one packet per virtual millisecond at most. */
export const MAX_PACKETS_PER_SECOND = 1000;
/** Packets a whole scenario may send; the replay keeps one trace state per flow, not per packet, but time is finite. */
export const MAX_SCENARIO_PACKETS = 2_000_000;
/** Inline configs may leave out `interface`: a simulation opens none. */
export const SIM_INTERFACE = 'sim0';
const DEFAULT_WEIGHT = 100;

const TOP_KEYS = ['description', 'config', 'events'];
const ACTIONS = ['flow', 'addReal', 'removeReal', 'weight', 'health', 'intent'] as const;
type Action = (typeof ACTIONS)[number];
const EVENT_KEYS = ['at', ...ACTIONS];
const ACTION_KEYS: Readonly<Record<Action, readonly string[]>> = {
  flow: ['id', 'client', 'duration', 'protocol', 'service', 'port', 'packetsPerSecond'],
  addReal: ['service', 'address', 'weight', 'backup'],
  removeReal: ['service', 'address'],
  weight: ['service', 'address', 'weight'],
  health: ['service', 'address', 'state'],
  intent: ['service', 'address', 'state'],
};
const TIME_RE = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/;
const UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

type Raw = Record<string, unknown>;

/** Time for messages and traces: 0s, 250ms, 1.5s, 90s. */
export function formatTimeMs(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  return `${ms / 1000}s`;
}

/**
 * A scenario time: a number (milliseconds) or text with a unit (ms, s, m, h), e.g. 0s, 1.5s, 250ms.
 * Unlike the config file, where a bare number means seconds, a bare number here is milliseconds:
 * the trace counts milliseconds, and a scenario is read against its trace.
 */
export function parseTimeMs(value: unknown): { ok: true; ms: number } | { ok: false; message: string } {
  const example = '(e.g. 0s, 1.5s, 250ms, or a number of milliseconds)';
  let ms: number;
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0) return { ok: false, message: `${String(value)} is not a time ${example}` };
    ms = value;
  } else if (typeof value === 'string') {
    const match = TIME_RE.exec(value);
    if (match === null) return { ok: false, message: `${JSON.stringify(value)} is not a time ${example}` };
    ms = Number(match[1]) * (UNIT_MS[match[2] as string] as number);
  } else {
    return { ok: false, message: `${describe(value)} is not a time ${example}` };
  }
  const shown = typeof value === 'string' ? JSON.stringify(value) : String(value);
  const rounded = Math.round(ms);
  if (Math.abs(ms - rounded) > 1e-6) return { ok: false, message: `${shown} is not a whole number of milliseconds` };
  if (rounded > MAX_SCENARIO_MS) return { ok: false, message: `${shown} is later than the simulator's limit of ${formatTimeMs(MAX_SCENARIO_MS)}` };
  return { ok: true, ms: rounded };
}

/** Reads and validates a scenario file. A file that cannot be read is one problem at `(file)`. */
export function loadScenarioFile(path: string): ScenarioResult {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    return { ok: false, problems: [{ path: '(file)', message: `cannot read ${JSON.stringify(path)}: ${fsError(error)}` }] };
  }
  return parseScenarioText(text, { sourcePath: path });
}

/** Scenario text from this size up that starts with "{" is read with JSON.parse. */
const JSON_FAST_PATH_BYTES = 1 << 20;

/** Parses YAML or JSON scenario text and validates all of it, the config included. */
export function parseScenarioText(text: string, opts: ScenarioParseOptions = {}): ScenarioResult {
  const body = text.startsWith('\uFEFF') ? text.slice(1) : text;
  // A large generated scenario in JSON: JSON.parse reads 100,000 flows in 0.2 s, the YAML parser in
  // 15 s and a GB of memory. Small files keep the YAML parser's checks (a duplicated key in JSON
  // is taken silently by JSON.parse).
  if (body.length > JSON_FAST_PATH_BYTES && body.trimStart().startsWith('{')) {
    let raw: unknown;
    try {
      raw = JSON.parse(body);
    } catch {
      raw = undefined; // not JSON after all: the YAML parser says where
    }
    if (raw !== undefined) return validateScenario(raw, opts);
  }
  const doc = parseDocument(body, { uniqueKeys: true, prettyErrors: true });
  if (doc.errors.length > 0) {
    return { ok: false, problems: doc.errors.map((e) => yamlProblem(e.code === 'MULTIPLE_DOCS' ? 'the file holds more than one YAML document' : e.message, e.linePos?.[0])) };
  }
  let raw: unknown;
  try {
    raw = doc.toJS({ maxAliasCount: 100 });
  } catch (error) {
    return { ok: false, problems: [yamlProblem(error instanceof Error ? error.message : String(error), undefined)] };
  }
  // Each problem with where the scenario writes it, as validate gives a config's.
  const result = validateScenario(raw, opts);
  return result.ok ? result : { ok: false, problems: locateProblems(body, result.problems) };
}

/** Validates an already parsed scenario document. */
export function validateScenario(raw: unknown, opts: ScenarioParseOptions = {}): ScenarioResult {
  const problems: ConfigProblem[] = [];
  const add = (path: string, message: string, position?: SourcePosition): void => {
    problems.push(position === undefined ? { path, message } : { path, message, position });
  };
  if (!isMapping(raw)) {
    add('(file)', `expected a mapping with config and events, got ${raw === null || raw === undefined ? 'an empty file' : describe(raw)}`);
    return { ok: false, problems };
  }
  checkKeys(add, raw, '', TOP_KEYS);
  let description: string | null = null;
  if (raw['description'] !== undefined && raw['description'] !== null) {
    if (typeof raw['description'] === 'string') description = raw['description'];
    else add('description', `${describe(raw['description'])} is not text`);
  }
  const config = scenarioConfig(add, raw['config'], opts);
  const events = raw['events'];
  let parsed: ScenarioEvent[] = [];
  if (events === undefined || events === null) {
    add('events', `${events === null ? 'is empty' : 'missing'}; expected a list of events`);
  } else if (!Array.isArray(events)) {
    add('events', `expected a list of events, got ${describe(events)}`);
  } else if (config !== null) {
    parsed = eventList(add, problems, events, config);
  }
  if (problems.length > 0 || config === null) return { ok: false, problems };
  return { ok: true, scenario: { description, config, events: parsed } };
}

// ---------------------------------------------------------------------------------------------

type Add = (path: string, message: string, position?: SourcePosition) => void;

function scenarioConfig(add: Add, value: unknown, opts: ScenarioParseOptions): Config | null {
  if (value === undefined || value === null) {
    add('config', `${value === null ? 'is empty' : 'missing'}; expected a config (a mapping) or the path of a config file`);
    return null;
  }
  if (typeof value === 'string') {
    const base = opts.sourcePath === undefined ? process.cwd() : dirname(resolve(opts.sourcePath));
    const path = resolve(base, value);
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (error) {
      add('config', `cannot read ${JSON.stringify(value)}: ${fsError(error)}`);
      return null;
    }
    const result = parseConfigText(text, { sourcePath: path });
    if (!result.ok) {
      for (const p of result.problems) add(`config(${value}).${p.path}`, p.message, p.position);
      return null;
    }
    return result.config;
  }
  if (!isMapping(value)) {
    add('config', `expected a config (a mapping) or the path of a config file, got ${describe(value)}`);
    return null;
  }
  const withInterface = value['interface'] === undefined ? { interface: SIM_INTERFACE, ...value } : value;
  const result = validateConfig(withInterface);
  if (!result.ok) {
    for (const p of result.problems) add(p.path === '(file)' ? 'config' : `config.${p.path}`, p.message);
    return null;
  }
  return result.config;
}

/** What validation tracks of each service while walking the events: which reals exist and which drain. */
interface RealPresence {
  removed: boolean;
}

function eventList(add: Add, problems: readonly ConfigProblem[], events: readonly unknown[], config: Config): ScenarioEvent[] {
  const out: ScenarioEvent[] = [];
  const reals = new Map<string, Map<string, RealPresence>>();
  for (const s of config.services) reals.set(s.name, new Map(s.reals.map((r) => [r.address, { removed: false }])));
  // Reals configured at once, as the daemon counts them against its real ids.
  let configured = config.services.reduce((n, s) => n + s.reals.length, 0);
  const flowIds = new Map<string, number>();
  // 5-tuple -> end of the flow that uses it: a second flow on the same tuple may start only after.
  const tupleBusyUntil = new Map<string, { id: string; endMs: number }>();
  let previousMs = 0;
  let packets = 0;

  events.forEach((item, index) => {
    const path = `events[${index}]`;
    if (!isMapping(item)) {
      add(path, `expected a mapping with at and one of ${ACTIONS.join(', ')}, got ${describe(item)}`);
      return;
    }
    checkKeys(add, item, path, EVENT_KEYS);
    const actions = ACTIONS.filter((a) => item[a] !== undefined);
    let atMs: number | null = null;
    if (item['at'] === undefined || item['at'] === null) {
      add(`${path}.at`, `${item['at'] === null ? 'is empty' : 'missing'}; expected a time such as 0s, 1.5s or 250ms`);
    } else {
      const t = parseTimeMs(item['at']);
      if (!t.ok) add(`${path}.at`, t.message);
      else if (t.ms < previousMs) add(`${path}.at`, `${formatTimeMs(t.ms)} is before the previous event (${formatTimeMs(previousMs)})`);
      else atMs = t.ms;
      if (t.ok) previousMs = Math.max(previousMs, t.ms);
    }
    if (actions.length === 0) {
      add(path, `no action; expected one of ${ACTIONS.join(', ')}`);
      return;
    }
    if (actions.length > 1) {
      add(path, `has ${actions.join(' and ')}; one action per event`);
      return;
    }
    const action = actions[0] as Action;
    const at = `${path}.${action}`;
    const body = item[action];
    if (!isMapping(body)) {
      add(at, `expected a mapping (${ACTION_KEYS[action].join(', ')}), got ${describe(body)}`);
      return;
    }
    checkKeys(add, body, at, ACTION_KEYS[action]);
    const before = problems.length;
    if (action === 'flow') {
      const flow = flowEvent(add, body, at, config, index, atMs ?? 0, flowIds);
      if (flow === null || atMs === null) return;
      const key = `${flow.tuple.protocol}|${flow.tuple.clientAddress}|${flow.tuple.clientPort}|${flow.tuple.vip}|${flow.tuple.vipPort}`;
      const busy = tupleBusyUntil.get(key);
      if (busy !== undefined && busy.endMs > atMs) {
        add(`${at}.client`, `${clientText(flow.tuple)} to ${flow.service} is in use by flow "${busy.id}" until ${formatTimeMs(busy.endMs)}`);
        return;
      }
      tupleBusyUntil.set(key, { id: flow.id, endMs: atMs + flow.durationMs });
      packets += packetsOfFlow(flow.durationMs, flow.packetsPerSecond);
      out.push(flow);
      return;
    }
    const service = serviceRef(add, body, at, config);
    const address = typeof body['address'] === 'string' || typeof body['address'] === 'number' ? String(body['address']) : null;
    if (body['address'] === undefined || body['address'] === null) add(`${at}.address`, `${body['address'] === null ? 'is empty' : 'missing'}; expected a real's address`);
    else if (address === null) add(`${at}.address`, `${describe(body['address'])} is not an address`);
    let canonical: string | null = null;
    if (address !== null) {
      const parsed = parseIpAddress(address);
      if (parsed === null) add(`${at}.address`, `${JSON.stringify(address)} is not an IPv4 or IPv6 address`);
      else canonical = parsed.address;
      if (parsed !== null && service !== null) {
        const present = reals.get(service.name)!;
        const entry = present.get(parsed.address);
        if (action === 'addReal') {
          if (entry !== undefined && !entry.removed) add(`${at}.address`, `${address} is already a real of service ${service.name}`);
          else if (configured >= MAX_REAL_IDS) add(`${at}.address`, `would make ${configured + 1} reals at once; the daemon (and the simulator) hold at most ${MAX_REAL_IDS}`);
          else if (parsed.address === service.vip) add(`${at}.address`, `${address} is the VIP of service ${service.name}; a real must be another host`);
          // An added real takes the service's forwarding, and ipip carries an IPv4 VIP to IPv6 reals too (as the config allows).
          else if (parsed.family !== service.family && !(service.family === 4 && service.forwarding === 'ipip')) {
            add(`${at}.address`, `${address} is IPv${parsed.family} but the VIP of service ${service.name} is IPv${service.family}${service.family === 4 ? ' and its forwarding is l2 (ipip can carry IPv4 in IPv6)' : ''}`);
          }
          else {
            // As the config refuses them: not a unicast host, or another service's VIP.
            const why = unicastProblem(address, 'a real');
            const owner = config.services.find((s) => s.vip === parsed.address);
            if (why !== null) add(`${at}.address`, why);
            else if (owner !== undefined) add(`${at}.address`, `${address} is the VIP of service ${owner.name}; traffic to a VIP goes to the load balancer, so this real could never be reached`);
          }
        } else if (action === 'health') {
          // A removed real still drains its flows, so its health still matters.
          if (entry === undefined) add(`${at}.address`, `${address} is not a real of service ${service.name}`);
        } else if (entry === undefined || entry.removed) {
          add(`${at}.address`, `${address} is not a real of service ${service.name}`);
        }
      }
    }
    let weight = DEFAULT_WEIGHT;
    if (action === 'addReal' || action === 'weight') {
      const w = body['weight'];
      if (w === undefined || w === null) {
        if (action === 'weight') add(`${at}.weight`, `${w === null ? 'is empty' : 'missing'}; expected a weight (0..65535)`);
      } else if (!isWeight(w)) {
        add(`${at}.weight`, `${describe(w)} is not a weight (0..65535)`);
      } else {
        weight = w;
      }
    }
    let backup = false;
    if (action === 'addReal' && body['backup'] !== undefined && body['backup'] !== null) {
      if (typeof body['backup'] === 'boolean') backup = body['backup'];
      else add(`${at}.backup`, `${describe(body['backup'])} is not true or false`);
    }
    let state: string | null = null;
    if (action === 'health' || action === 'intent') {
      const allowed = action === 'health' ? ['up', 'down', 'unknown'] : ['active', 'drain', 'disabled'];
      const s = body['state'];
      if (s === undefined || s === null) add(`${at}.state`, `${s === null ? 'is empty' : 'missing'}; expected ${listWords(allowed, 'or')}`);
      else if (typeof s === 'string' && allowed.includes(s)) state = s;
      else {
        // Worded as the config's own one-of errors (src/config/validate.ts oneOf).
        const folded = typeof s === 'string' ? allowed.find((option) => option.toLowerCase() === s.toLowerCase()) : undefined;
        add(`${at}.state`, `${describe(s)} is not ${listWords(allowed, 'or')}${folded === undefined ? '' : ` (did you mean "${folded}"?)`}`);
      }
    }
    if (problems.length > before || service === null || canonical === null || atMs === null) return;
    const presence = reals.get(service.name)!;
    const base = { index, atMs, service: service.name, address: canonical };
    switch (action) {
      case 'addReal':
        presence.set(canonical, { removed: false });
        configured++;
        out.push({ ...base, kind: 'addReal', weight, backup });
        break;
      case 'removeReal':
        presence.get(canonical)!.removed = true;
        configured--;
        out.push({ ...base, kind: 'removeReal' });
        break;
      case 'weight':
        out.push({ ...base, kind: 'weight', weight });
        break;
      case 'health':
        out.push({ ...base, kind: 'health', state: state as 'up' | 'down' | 'unknown' });
        break;
      case 'intent':
        out.push({ ...base, kind: 'intent', state: state as RealIntent });
        break;
    }
  });
  if (packets > MAX_SCENARIO_PACKETS) {
    add('events', `the flows send ${packets} packets; the simulator replays at most ${MAX_SCENARIO_PACKETS}`);
  }
  return out;
}

function flowEvent(add: Add, body: Raw, at: string, config: Config, index: number, atMs: number, ids: Map<string, number>): FlowEvent | null {
  let ok = true;
  const fail = (path: string, message: string): void => {
    ok = false;
    add(path, message);
  };
  let id: string | null = null;
  const idValue = body['id'];
  if (idValue === undefined || idValue === null) fail(`${at}.id`, `${idValue === null ? 'is empty' : 'missing'}; expected a flow id (text)`);
  else if ((typeof idValue !== 'string' || idValue.length === 0) && !(typeof idValue === 'number' && Number.isInteger(idValue))) fail(`${at}.id`, `${describe(idValue)} is not a flow id (text)`);
  // Past 2^53 a number is rounded: two ids would come out as one, shown mangled.
  else if (typeof idValue === 'number' && !Number.isSafeInteger(idValue)) fail(`${at}.id`, `${idValue} is too large a number to be read exactly: write the id in quotes`);
  else {
    id = String(idValue);
    if (ids.has(id)) fail(`${at}.id`, `duplicate flow id ${JSON.stringify(id)}`);
    else ids.set(id, index);
  }

  let protocol: Protocol | null = null;
  const protocolValue = body['protocol'];
  if (protocolValue !== undefined && protocolValue !== null) {
    if (protocolValue === 'tcp' || protocolValue === 'udp') protocol = protocolValue;
    else fail(`${at}.protocol`, `${describe(protocolValue)} is not tcp or udp`);
  }
  let service: ServiceConfig | null;
  if (body['service'] === undefined || body['service'] === null) {
    // The first service, or with a protocol given the first service of that protocol.
    service = config.services.find((s) => protocol === null || s.protocol === protocol) ?? null;
    if (service === null) fail(`${at}.protocol`, `no service is ${protocol}; name a service`);
  } else {
    service = serviceRef(fail, body, at, config);
    if (service !== null && protocol !== null && service.protocol !== protocol) {
      fail(`${at}.protocol`, `${protocol} does not match service ${service.name}, which is ${service.protocol}`);
    }
  }

  let client: { address: string; family: 4 | 6; port: number } | null = null;
  const clientValue = body['client'];
  if (clientValue === undefined || clientValue === null) {
    fail(`${at}.client`, `${clientValue === null ? 'is empty' : 'missing'}; expected IP:PORT, e.g. 198.51.100.7:40000 or [2001:db8::7]:40000`);
  } else {
    const parsed = typeof clientValue === 'string' ? parseListenAddress(clientValue) : null;
    if (parsed === null) fail(`${at}.client`, `${describe(clientValue)} is not IP:PORT (e.g. 198.51.100.7:40000 or [2001:db8::7]:40000)`);
    else {
      const family = parsed.host.includes(':') ? 6 : 4;
      if (service !== null && family !== service.family) {
        fail(`${at}.client`, `${clientValue} is IPv${family} but the VIP of service ${service.name} is IPv${service.family}`);
      } else {
        client = { address: parsed.host, family, port: parsed.port };
      }
    }
  }

  let vipPort: number | null = service?.port ?? null;
  const portValue = body['port'];
  if (portValue !== undefined && portValue !== null) {
    if (typeof portValue !== 'number' || !Number.isInteger(portValue) || portValue < 1 || portValue > 65535) {
      fail(`${at}.port`, `${describe(portValue)} is not a port (1..65535)`);
    } else if (service !== null && service.port !== 0 && portValue !== service.port) {
      fail(`${at}.port`, `${portValue} is not the port of service ${service.name} (${service.port})`);
    } else {
      // As the engine matches: a service with this exact port wins over the port-0 one.
      const exact = service?.port === 0 ? config.services.find((o) => o.vip === service.vip && o.protocol === service.protocol && o.port === portValue) : undefined;
      if (exact !== undefined && service !== null) {
        fail(`${at}.port`, `${portValue} of ${service.vip} belongs to service ${exact.name} (an exact port wins over service ${service.name}'s every port); name ${exact.name}`);
      } else {
        vipPort = portValue;
      }
    }
  } else if (service !== null && service.port === 0) {
    fail(`${at}.port`, `missing; service ${service.name} takes every port, so the flow needs a destination port`);
  }

  let durationMs = 0;
  const durationValue = body['duration'];
  if (durationValue === undefined || durationValue === null) {
    fail(`${at}.duration`, `${durationValue === null ? 'is empty' : 'missing'}; expected a duration such as 30s`);
  } else {
    const d = parseTimeMs(durationValue);
    if (!d.ok) fail(`${at}.duration`, d.message.replace('is not a time', 'is not a duration'));
    else if (d.ms === 0) fail(`${at}.duration`, 'must be positive');
    else if (atMs + d.ms > MAX_SCENARIO_MS) fail(`${at}.duration`, `ends after the simulator's limit of ${formatTimeMs(MAX_SCENARIO_MS)}`);
    else durationMs = d.ms;
  }

  let packetsPerSecond = 1;
  const ppsValue = body['packetsPerSecond'];
  if (ppsValue !== undefined && ppsValue !== null) {
    if (typeof ppsValue !== 'number' || !Number.isFinite(ppsValue) || ppsValue <= 0 || ppsValue > MAX_PACKETS_PER_SECOND) {
      fail(`${at}.packetsPerSecond`, `${describe(ppsValue)} is not a packet rate (more than 0, at most ${MAX_PACKETS_PER_SECOND})`);
    } else {
      packetsPerSecond = ppsValue;
    }
  }

  if (!ok || id === null || service === null || client === null || vipPort === null) return null;
  return {
    kind: 'flow',
    index,
    atMs,
    id,
    service: service.name,
    tuple: { family: client.family, protocol: service.protocol, clientAddress: client.address, clientPort: client.port, vip: service.vip, vipPort },
    durationMs,
    packetsPerSecond,
  };
}

/** Data packets (after the opening packet) of a flow: one per 1000/pps ms strictly before its end. */
export function dataPacketTimes(durationMs: number, packetsPerSecond: number): number[] {
  const times: number[] = [];
  for (let k = 1; ; k++) {
    const offsetMs = Math.round((k * 1000) / packetsPerSecond);
    if (offsetMs >= durationMs) break;
    times.push(offsetMs);
  }
  return times;
}

function packetsOfFlow(durationMs: number, packetsPerSecond: number): number {
  // Opening packet(s), the data packets, the closing packet.
  return 3 + Math.max(0, Math.ceil((durationMs * packetsPerSecond) / 1000));
}

/** A service by its name or its address form (tcp://VIP:PORT), as the CLI accepts it. */
function serviceRef(add: Add, body: Raw, at: string, config: Config): ServiceConfig | null {
  const value = body['service'];
  if (value === undefined || value === null) {
    add(`${at}.service`, `${value === null ? 'is empty' : 'missing'}; expected a service name`);
    return null;
  }
  const service =
    typeof value === 'string' ? config.services.find((s) => s.name === value || serviceAddressName(s.protocol, s.vip, s.port) === value) : undefined;
  if (service === undefined) {
    add(`${at}.service`, `${describe(value)} is not a service (services: ${config.services.map((s) => s.name).join(', ')})`);
    return null;
  }
  return service;
}

function clientText(t: SimTuple): string {
  return t.family === 6 ? `[${t.clientAddress}]:${t.clientPort}` : `${t.clientAddress}:${t.clientPort}`;
}

/** The command line's intent verbs, as the state an intent event sets. */
const INTENT_VERBS: Readonly<Record<string, RealIntent>> = { drain: 'drain', undrain: 'active', disable: 'disabled', enable: 'active' };

function checkKeys(add: Add, obj: Raw, path: string, known: readonly string[]): void {
  for (const key of Object.keys(obj)) {
    const message = unknownKeyMessage(key, known);
    // The command line's REAL is the config's `address`, and so it is here; its verbs are intents.
    const verb = INTENT_VERBS[key];
    const hint =
      key === 'real' && known.includes('address')
        ? 'unknown key: a real is named by its address here, as in the config file (address: 10.0.1.11)'
        : verb !== undefined && known.includes('intent')
          ? `unknown key: dsrlb ${key} is an intent event here: intent: { service: web, address: 10.0.1.11, state: ${verb} }`
          : message;
    if (hint !== null) add(keyPath(path, key), hint);
  }
}


function fsError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  return error.message.replace(/, \w+ '.*'$/, '');
}
