// A ServiceConfig read back from a file the daemon wrote (the flows file keeps those of removed
// services that still drain). The config validator takes YAML's raw form, not this normalised one,
// so this checks the shape the daemon relies on: a damaged file must be refused, not half taken
// (a tableSize of 1e12 would reach the Maglev build, a missing healthCheck the prober).

import type { HealthCheckConfig, ServiceConfig } from '../config/types.js';
import { isRealIntent, isWeight, MAX_TABLE_SIZE, MIN_TABLE_SIZE, parseIpAddress } from '../config/validate.js';

const oneOf = (values: readonly unknown[]) => (v: unknown) => values.includes(v);
const int = (lo: number, hi: number) => (v: unknown) => typeof v === 'number' && Number.isInteger(v) && v >= lo && v <= hi;
const str = (v: unknown) => typeof v === 'string';
const strOrNull = (v: unknown) => v === null || typeof v === 'string';
/** Address text as the config writes it (canonical), of the family named beside it. */
const address = (v: unknown, family: unknown) => typeof v === 'string' && parseIpAddress(v)?.address === v && parseIpAddress(v)?.family === family;

// Typed by the config's own interfaces: a field added there fails the build here until it is checked.
const CHECK_FIELDS: Record<keyof HealthCheckConfig, (v: unknown) => boolean> = {
  type: oneOf(['tcp', 'http', 'https', 'udp', 'icmp', 'exec', 'none']),
  port: int(0, 65535),
  path: str,
  host: strOrNull,
  expectStatus: (v) => Array.isArray(v) && v.every(int(100, 599)),
  expectBody: strOrNull,
  payload: strOrNull,
  expectPayload: strOrNull,
  command: strOrNull,
  intervalMs: int(1, 2 ** 31),
  timeoutMs: int(1, 2 ** 31),
  rise: int(1, 100),
  fall: int(1, 100),
};

const SERVICE_FIELDS: Record<Exclude<keyof ServiceConfig, 'vip' | 'healthCheck' | 'reals'>, (v: unknown) => boolean> = {
  name: str,
  family: oneOf([4, 6]),
  port: int(0, 65535),
  protocol: oneOf(['tcp', 'udp']),
  scheduler: oneOf(['maglev', 'rendezvous', 'wlc']),
  forwarding: oneOf(['l2', 'ipip']),
  whenAllDown: oneOf(['failOpen', 'drop']),
  // Absent from a state file an earlier release wrote: reschedule, as it did.
  onRealDown: (v) => v === undefined || oneOf(['reschedule', 'keep'])(v),
  // Absent before client persistence: none (the prefix is then the whole address, checked below).
  persistence: (v) => v === undefined || oneOf(['none', 'client'])(v),
  persistencePrefix: (v) => v === undefined || int(1, 128)(v),
  ops: (v) => v === undefined || typeof v === 'boolean',
  tableSize: int(MIN_TABLE_SIZE, MAX_TABLE_SIZE),
  announce: (v) => typeof v === 'boolean',
};

/** The first field of `v` that is not as a ServiceConfig has it ("healthCheck.rise"), or null. */
export function serviceConfigProblem(v: unknown): string | null {
  if (!isObject(v)) return 'not an object';
  for (const [field, ok] of Object.entries(SERVICE_FIELDS)) if (!ok(v[field])) return field;
  if (!address(v['vip'], v['family'])) return 'vip';
  if (typeof v['persistencePrefix'] === 'number' && v['persistencePrefix'] > (v['family'] === 4 ? 32 : 128)) return 'persistencePrefix';
  const check = v['healthCheck'];
  if (!isObject(check)) return 'healthCheck';
  for (const [field, ok] of Object.entries(CHECK_FIELDS)) if (!ok(check[field])) return `healthCheck.${field}`;
  const reals = v['reals'];
  if (!Array.isArray(reals)) return 'reals';
  for (const [i, r] of reals.entries()) {
    if (!isObject(r) || !address(r['address'], r['family']) || !isWeight(r['weight']) || !isRealIntent(r['state']) || !oneOf(['l2', 'ipip'])(r['forwarding']) || !(r['backup'] === undefined || typeof r['backup'] === 'boolean')) return `reals[${i}]`;
  }
  return null;
}

/** `v` as a ServiceConfig, frozen as the config's are; throws naming the field when it is not one. */
export function savedServiceConfig(v: unknown): ServiceConfig {
  const problem = serviceConfigProblem(v);
  if (problem !== null) throw new Error(`not a service: ${problem}`);
  const saved = v as Omit<ServiceConfig, 'onRealDown' | 'persistence' | 'persistencePrefix' | 'ops'> & Partial<Pick<ServiceConfig, 'onRealDown' | 'persistence' | 'persistencePrefix' | 'ops'>>;
  const s: ServiceConfig = {
    ...saved,
    onRealDown: saved.onRealDown ?? 'reschedule',
    persistence: saved.persistence ?? 'none',
    persistencePrefix: saved.persistencePrefix ?? (saved.family === 4 ? 32 : 128),
    ops: saved.ops ?? false,
  };
  return Object.freeze({ ...s, healthCheck: Object.freeze({ ...s.healthCheck, expectStatus: Object.freeze([...s.healthCheck.expectStatus]) }), reals: Object.freeze(s.reals.map((r) => Object.freeze({ ...r, backup: r.backup ?? false }))) });
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}
