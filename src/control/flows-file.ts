// The flows one daemon leaves to the next (a restart, an upgrade): written at a clean stop beside the
// state file, read and removed at the next start. Each flow names its real by (service identity,
// address), since real ids are a run's own. Binary, little-endian: 1M flows take 49 MB, and they
// are written while the VIPs are already withdrawn, so it must be quick.
//
//   "DSRLBFLW" | u32 version | u32 header bytes | header JSON { writtenAtMs, count, reals }
//   | count x 10 u32 keys | count i32 real indexes into header.reals | count u32 idle ms | count u8 states

import { FLOW_KEY_WORDS } from '../dataplane/flow-hash.js';

const MAGIC = 'DSRLBFLW';
const VERSION = 1;
const PER_FLOW_BYTES = FLOW_KEY_WORDS * 4 + 4 + 4 + 1;

export interface SavedFlows {
  /** Wall-clock time of the writing (Date.now()): the gap until the next start adds to every flow's idle time. */
  readonly writtenAtMs: number;
  readonly count: number;
  readonly keys: Uint32Array;
  /** Index into `reals` per flow. */
  readonly realIndex: Int32Array;
  readonly idleMs: Uint32Array;
  readonly states: Uint8Array;
  readonly reals: readonly { identity: string; address: string }[];
}

export function encodeSavedFlows(f: SavedFlows): Buffer {
  const header = Buffer.from(JSON.stringify({ writtenAtMs: f.writtenAtMs, count: f.count, reals: f.reals }));
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

/** The flows in `b`; throws an Error that says what is wrong when `b` is not such a file. */
export function decodeSavedFlows(b: Buffer): SavedFlows {
  const fail = (why: string): never => {
    throw new Error(`not a dsrlb flows file of version ${VERSION}: ${why}`);
  };
  if (b.length < MAGIC.length + 8 || b.toString('latin1', 0, MAGIC.length) !== MAGIC) fail('no DSRLBFLW mark at its start');
  const version = b.readUInt32LE(MAGIC.length);
  if (version !== VERSION) fail(`it is version ${version}`);
  const headerBytes = b.readUInt32LE(MAGIC.length + 4);
  let at = MAGIC.length + 8;
  if (at + headerBytes > b.length) fail('its header runs past its end');
  let header: { writtenAtMs?: unknown; count?: unknown; reals?: unknown };
  try {
    header = JSON.parse(b.toString('utf8', at, at + headerBytes)) as typeof header;
  } catch {
    return fail('its header is not JSON');
  }
  at += headerBytes;
  if (header === null || typeof header !== 'object' || Array.isArray(header)) return fail('its header is not a JSON object');
  const { writtenAtMs, count, reals } = header;
  if (typeof writtenAtMs !== 'number' || !Number.isFinite(writtenAtMs)) return fail('no writtenAtMs');
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 0) return fail('no flow count');
  if (!Array.isArray(reals) || !reals.every((r: { identity?: unknown; address?: unknown }) => typeof r?.identity === 'string' && typeof r?.address === 'string')) return fail('no list of reals');
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
  return { writtenAtMs, count, keys, realIndex, idleMs, states, reals: reals as SavedFlows['reals'] };
}
