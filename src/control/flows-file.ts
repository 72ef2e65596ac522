// The flows one daemon leaves to the next (a restart, an upgrade): written at a clean stop beside the
// state file, read and removed at the next start. Each flow names its real by (service identity,
// address), since real ids are a run's own. Binary, little-endian: 1M flows take 49 MB, and they
// are written while the VIPs are already withdrawn, so it must be quick.
//
//   "DSRLBFLW" | u32 version | u32 header bytes | header JSON { writtenAtMs, count, reals, removedServices, boot }
//   | count x 10 u32 keys | count i32 real indexes into header.reals | count u32 idle ms | count u8 states
//
// Version 2 added what the next daemon needs to go on draining what its config does not name (a
// reload removed it before the stop, or an edit of the file before the start): per real
// `removed: { forwarding }` (the way its flows went), and `removedServices` (each service with
// flows, as last configured, and whether its VIP was announced); both absent when none. Version 1 files are still
// read (as having nothing removed): an upgrade stops the old daemon, which writes version 1, and
// the new one must take those flows.

import { readFileSync } from 'node:fs';
import type { ForwardingMode, ServiceConfig } from '../config/types.js';
import { FLOW_KEY_WORDS } from '../dataplane/flow-hash.js';
import { savedServiceConfig } from './saved-service.js';

const MAGIC = 'DSRLBFLW';
const VERSION = 2;
/** The versions this daemon reads: its own, and version 1 (written by the daemon an upgrade replaces). */
const READABLE = [1, 2];
const PER_FLOW_BYTES = FLOW_KEY_WORDS * 4 + 4 + 4 + 1;

export interface SavedReal {
  readonly identity: string;
  readonly address: string;
  /** The way its flows went, for a start whose config does not name the real (it drains it then). */
  readonly removed?: { readonly forwarding: ForwardingMode };
}

/** A service with flows, as last configured: drained by a start whose config does not name it. */
export interface SavedRemovedService {
  readonly config: ServiceConfig;
  /** Its VIP stayed announced while it drained (it was announced when the reload removed it). */
  readonly announced: boolean;
}

export interface SavedFlows {
  /** Wall-clock time of the writing (Date.now()): the gap until the next start adds to every flow's idle time. */
  readonly writtenAtMs: number;
  /**
   * The boot (/proc/sys/kernel/random/boot_id) and CLOCK_MONOTONIC ms of the writing: a start in
   * the same boot measures the gap on that clock, which a step of the wall clock does not move.
   * Absent from older files (a reader before it ignores it): the gap is the wall clock's then.
   */
  readonly boot?: { readonly id: string; readonly monotonicMs: number };
  readonly count: number;
  readonly keys: Uint32Array;
  /** Index into `reals` per flow. */
  readonly realIndex: Int32Array;
  readonly idleMs: Uint32Array;
  readonly states: Uint8Array;
  readonly reals: readonly SavedReal[];
  /** None when absent (as `removed` of a real): so is a version 1 file, and a stop with nothing removed writes none. */
  readonly removedServices?: readonly SavedRemovedService[];
}

export function encodeSavedFlows(f: SavedFlows): Buffer {
  const removed = f.removedServices !== undefined && f.removedServices.length > 0 ? { removedServices: f.removedServices } : {};
  const header = Buffer.from(JSON.stringify({ writtenAtMs: f.writtenAtMs, count: f.count, reals: f.reals, ...removed, ...(f.boot === undefined ? {} : { boot: f.boot }) }));
  const out = Buffer.alloc(MAGIC.length + 8 + header.length + f.count * PER_FLOW_BYTES);
  let at = out.write(MAGIC, 0, 'latin1');
  at = out.writeUInt32LE(VERSION, at);
  at = out.writeUInt32LE(header.length, at);
  at += header.copy(out, at);
  for (let i = 0; i < f.count * FLOW_KEY_WORDS; i++) at = out.writeUInt32LE(f.keys[i]!, at);
  for (let i = 0; i < f.count; i++) at = out.writeInt32LE(f.realIndex[i]!, at);
  for (let i = 0; i < f.count; i++) at = out.writeUInt32LE(Math.min(f.idleMs[i]!, 0xffffffff), at);
  out.set(f.states.subarray(0, f.count), at);
  return out;
}

/** The flows in `b` (version 1 or 2); throws an Error that says what is wrong when `b` is not such a file. */
export function decodeSavedFlows(b: Buffer): SavedFlows {
  let version = 0;
  const fail = (why: string): never => {
    throw new Error(`not a dsrlb flows file of version ${version === 0 ? READABLE.join(' or ') : version}: ${why}`);
  };
  if (b.length < MAGIC.length + 8 || b.toString('latin1', 0, MAGIC.length) !== MAGIC) fail('no DSRLBFLW mark at its start');
  const written = b.readUInt32LE(MAGIC.length);
  if (!READABLE.includes(written)) fail(`it is version ${written}`);
  version = written;
  const headerBytes = b.readUInt32LE(MAGIC.length + 4);
  let at = MAGIC.length + 8;
  if (at + headerBytes > b.length) fail('its header runs past its end');
  let header: { writtenAtMs?: unknown; count?: unknown; reals?: unknown; removedServices?: unknown; boot?: { id?: unknown; monotonicMs?: unknown } };
  try {
    header = JSON.parse(b.toString('utf8', at, at + headerBytes)) as typeof header;
  } catch {
    return fail('its header is not JSON');
  }
  at += headerBytes;
  if (header === null || typeof header !== 'object' || Array.isArray(header)) return fail('its header is not a JSON object');
  const { writtenAtMs, count } = header;
  if (typeof writtenAtMs !== 'number' || !Number.isFinite(writtenAtMs)) return fail('no writtenAtMs');
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 0) return fail('no flow count');
  const reals = savedReals(header.reals, version, fail);
  const removedServices = version === 1 || header.removedServices === undefined ? [] : savedRemovedServices(header.removedServices, fail);
  if (b.length !== at + count * PER_FLOW_BYTES) fail(`${b.length} bytes for ${count} flows`);
  const keys = new Uint32Array(count * FLOW_KEY_WORDS);
  for (let i = 0; i < keys.length; i++, at += 4) keys[i] = b.readUInt32LE(at);
  const realIndex = new Int32Array(count);
  for (let i = 0; i < count; i++, at += 4) {
    realIndex[i] = b.readInt32LE(at);
    if (realIndex[i]! < 0 || realIndex[i]! >= reals.length) fail(`flow ${i} names real ${realIndex[i]} of ${reals.length}`);
  }
  const idleMs = new Uint32Array(count);
  for (let i = 0; i < count; i++, at += 4) idleMs[i] = b.readUInt32LE(at);
  const states = Uint8Array.from(b.subarray(at, at + count));
  const w = header.boot;
  const boot = typeof w === 'object' && w !== null && typeof w.id === 'string' && typeof w.monotonicMs === 'number' && Number.isFinite(w.monotonicMs) ? { boot: { id: w.id, monotonicMs: w.monotonicMs } } : {};
  return { writtenAtMs, count, keys, realIndex, idleMs, states, reals, ...(removedServices.length > 0 ? { removedServices } : {}), ...boot };
}

/** The header's reals; only version 2 may mark one removed (a version 1 file has no such field). */
function savedReals(v: unknown, version: number, fail: (why: string) => never): SavedReal[] {
  if (!Array.isArray(v)) return fail('no list of reals');
  return v.map((r: { identity?: unknown; address?: unknown; removed?: { forwarding?: unknown } }, i) => {
    if (typeof r?.identity !== 'string' || typeof r?.address !== 'string') return fail(`real ${i} has no identity and address`);
    if (version === 1 || r.removed === undefined) return { identity: r.identity, address: r.address };
    const forwarding = r.removed?.forwarding;
    if (forwarding !== 'l2' && forwarding !== 'ipip') return fail(`removed real ${i} has no forwarding l2 or ipip`);
    return { identity: r.identity, address: r.address, removed: { forwarding } };
  });
}

function savedRemovedServices(v: unknown, fail: (why: string) => never): SavedRemovedService[] {
  if (!Array.isArray(v)) return fail('no list of removed services');
  return v.map((s: { config?: unknown; announced?: unknown }, i) => {
    if (typeof s?.announced !== 'boolean') return fail(`removed service ${i} has no announced flag`);
    try {
      return { config: savedServiceConfig(s.config), announced: s.announced };
    } catch (err) {
      return fail(`removed service ${i} is ${(err as Error).message}`);
    }
  });
}

/** This boot's id (changes at every boot), or null where it cannot be read. */
export function bootId(): string | null {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return null;
  }
}

/**
 * How long the daemon was down, added to every saved flow's idle time: on CLOCK_MONOTONIC when the
 * file was written in this boot (a wall-clock step back made the gap 0, and flows outlived their
 * timeout by up to one timeout), else on the wall clock.
 */
export function downtimeMs(saved: Pick<SavedFlows, 'writtenAtMs' | 'boot'>, bootNow: string | null, monotonicNowMs: number, wallNowMs: number): number {
  if (saved.boot !== undefined && bootNow !== null && saved.boot.id === bootNow) return Math.max(0, monotonicNowMs - saved.boot.monotonicMs);
  return Math.max(0, wallNowMs - saved.writtenAtMs);
}
