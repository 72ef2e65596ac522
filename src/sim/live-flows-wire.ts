// The live flows as /plan-input carries them from the daemon to `dsrlb plan`: the flow keys and
// each flow's real as base64 of little-endian 32-bit words, and the reals once each. As a JSON
// object per flow it took 270 bytes a flow, and from about 2M flows the answer was longer than
// V8's largest string (the daemon died writing it).

import { endianness } from 'node:os';
import { FLOW_KEY_WORDS } from '../dataplane/flow-hash.js';

export interface LiveFlowsWire {
  readonly count: number;
  /** A loop held more flows than the answer's limit let it send: the flows are the first ones only. */
  readonly cut?: boolean;
  /** count x FLOW_KEY_WORDS uint32 words. */
  readonly keys: string;
  /** count int32 indexes into `reals`. */
  readonly realIndex: string;
  readonly reals: readonly { identity: string; address: string }[];
}

const BIG_ENDIAN = endianness() === 'BE';

function toBase64(words: Uint32Array | Int32Array): string {
  const b = Buffer.from(words.buffer, words.byteOffset, words.byteLength);
  return (BIG_ENDIAN ? Buffer.from(b).swap32() : b).toString('base64');
}

function fromBase64(text: string, count: number, what: string): Uint32Array {
  const b = Buffer.from(text, 'base64');
  if (b.length !== count * 4) throw new Error(`live flows: ${what} holds ${b.length} bytes, not ${count * 4}`);
  if (BIG_ENDIAN) b.swap32();
  const words = new Uint32Array(count);
  new Uint8Array(words.buffer).set(b);
  return words;
}

export function encodeLiveFlows(keys: Uint32Array, realIndex: Int32Array, reals: LiveFlowsWire['reals'], cut = false): LiveFlowsWire {
  return { count: realIndex.length, cut, keys: toBase64(keys), realIndex: toBase64(realIndex), reals };
}

/** What a daemon before this format sent: every key word as a number, a real per flow. */
interface OldLiveFlows {
  readonly keys: number[];
  readonly reals: LiveFlowsWire['reals'];
}

export function decodeLiveFlows(wire: LiveFlowsWire | OldLiveFlows): { keys: Uint32Array; realIndex: Int32Array; reals: LiveFlowsWire['reals']; cut: boolean } {
  // A daemon not yet restarted after an upgrade: its plan still works.
  if (Array.isArray(wire.keys) && Array.isArray(wire.reals) && wire.keys.length === wire.reals.length * FLOW_KEY_WORDS) {
    return { keys: Uint32Array.from(wire.keys), realIndex: Int32Array.from(wire.reals.keys()), reals: wire.reals, cut: false };
  }
  if (!('count' in wire) || !Number.isInteger(wire.count) || wire.count < 0 || !Array.isArray(wire.reals)) {
    throw new Error('live flows: not the format this dsrlb reads (a daemon of another version?)');
  }
  const count = wire.count;
  const keys = fromBase64(wire.keys, count * FLOW_KEY_WORDS, 'keys');
  const realIndex = new Int32Array(fromBase64(wire.realIndex, count, 'realIndex').buffer);
  return { keys, realIndex, reals: wire.reals, cut: wire.cut === true };
}
