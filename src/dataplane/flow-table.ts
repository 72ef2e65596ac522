// The connection table: 5-tuple key -> real, in preallocated typed arrays of a fixed capacity, with
// exact LRU eviction of the longest-idle entry, per-state idle timeouts, and per-real active/inactive
// counts kept exact on every change (what `status` shows and what wlc schedules on). Entries are
// chained in one last-seen list per state: every entry of a list has the same timeout, so each
// list is in expiry order and the sweep reads only what is due (one list over all states made it
// walk every idle established entry, 9 ms of the packet loop every 100 ms at 1M flows).

import { randomBytes } from 'node:crypto';
import { flowIndexHash, isIpv4Key } from './flow-hash.js';
import { TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN } from './parsed-packet.js';

export const FlowState = { syn: 1, established: 2, fin: 3, closed: 4, udp: 5 } as const;

export interface FlowTimeouts {
  synMs: number;
  establishedMs: number;
  finMs: number;
  closeMs: number;
  udpMs: number;
}

/** Words in a key: [0] protocol | family << 8, [1..4] source, [5..8] destination, [9] ports. */
const KEY_WORDS = 10;
/**
 * One 64-byte record per entry in `rec` (Int32 words), so that a packet's lookup and touch read one
 * record (one or two cache lines) instead of a line in each of seven arrays: the key in words 0..9,
 * then these. Word R_SEEN is the first of the two words of the last-seen time (a float64, in `seen`).
 */
const R_REAL = 10;
const R_STATE = 11;
const R_SEEN = 12;
const R_PREV = 14;
const R_NEXT = 15;
const STRIDE = 16;
/** Float64 slot of entry e's last-seen time in `seen`: (e * STRIDE + R_SEEN) / 2. */
const SEEN_STRIDE = STRIDE / 2;
const SEEN_OFFSET = R_SEEN / 2;
/** R_STATE of a free entry. */
const STATE_FREE = 0;
/**
 * The record layout, for reading the records of a table whose loop has ended (flow-handoff.ts
 * collectRecords): the key in words 0..9, then these words; a free record has state 0.
 */
export const FLOW_RECORD = { words: STRIDE, real: R_REAL, state: R_STATE, seenWord: R_SEEN } as const;
const STATE_SLOTS = 6;
/** Keeps nextPow2(2 * capacity) buckets addressable by an Int32Array index. */
const MAX_CAPACITY = 1 << 28;
/** Index buckets of a new or cleared table (fewer if the capacity needs fewer). */
const INITIAL_BUCKETS = 4096;

/**
 * The TCP state after a packet from the client, as IPVS tracks connections it only sees inbound
 * (DR and TUN set IP_VS_CONN_F_NOOUTPUT and use the INPUT-ONLY rows of tcp_states[] in
 * net/netfilter/ipvs/ip_vs_proto_tcp.c). Flag precedence is IPVS's tcp_state_idx(): RST, then SYN,
 * then FIN, then ACK; a segment with none of them changes nothing.
 * Collapsed to our five states: SYN_RECV -> syn, ESTABLISHED -> established, FIN_WAIT/TIME_WAIT ->
 * fin, CLOSE -> closed. Two departures: RST closes from every state (IPVS keeps SYN_RECV on a RST,
 * which lets a spoofed RST-flood hold entries for the syn timeout), and a SYN on a fin/closed entry
 * goes back to syn as IPVS does, but deciding whether that port reuse gets a new real is the
 * caller's (see FlowTable.isReusable).
 */
export function nextTcpState(state: number, tcpFlags: number): number {
  if ((tcpFlags & TCP_RST) !== 0) return FlowState.closed;
  if ((tcpFlags & TCP_SYN) !== 0) {
    // A retransmitted SYN keeps syn; a stray SYN on an established flow keeps it established.
    return state === FlowState.fin || state === FlowState.closed ? FlowState.syn : state;
  }
  if ((tcpFlags & TCP_FIN) !== 0) {
    return state === FlowState.syn || state === FlowState.established ? FlowState.fin : state;
  }
  if ((tcpFlags & TCP_ACK) !== 0) {
    return state === FlowState.syn ? FlowState.established : state;
  }
  return state;
}

/**
 * nextTcpState as a table, for the packet path: indexed by the state and the four flags it reads
 * (FIN, SYN, RST in bits 0-2, ACK in bit 3). A load instead of branches: optimized code that met a
 * flag for the first time (the first FIN on a flow-table hit) was thrown away for want of type
 * feedback and compiled again, 8-18 ms of V8's threads inside a measured download; a load has
 * nothing to learn.
 */
const TCP_NEXT = (() => {
  const table = new Uint8Array(STATE_SLOTS << 4);
  for (let state = 0; state < STATE_SLOTS; state++) {
    for (let f = 0; f < 16; f++) table[(state << 4) | f] = nextTcpState(state, (f & 7) | ((f & 8) << 1));
  }
  return table;
})();

/** nextTcpState(state, tcpFlags) from TCP_NEXT; state a tcp state (1..4). */
export function tcpNext(state: number, tcpFlags: number): number {
  return TCP_NEXT[(state << 4) | (tcpFlags & 7) | ((tcpFlags >> 1) & 8)]!;
}

/** The idle timeout of each state value (index 0, free: 0), into `out`. */
export function timeoutsByState(t: FlowTimeouts, out = new Float64Array(STATE_SLOTS)): Float64Array {
  checkTimeouts(t);
  out[FlowState.syn] = t.synMs;
  out[FlowState.established] = t.establishedMs;
  out[FlowState.fin] = t.finMs;
  out[FlowState.closed] = t.closeMs;
  out[FlowState.udp] = t.udpMs;
  return out;
}

/**
 * Whether the key at key[at..at+10) is as the packet path makes them: an IPv4 key (isIpv4Key)
 * has zeros in words 2-4 and 6-8.
 */
export function isCanonicalKey(key: Uint32Array, at: number): boolean {
  if (!isIpv4Key(key[at]!)) return true;
  return (key[at + 2]! | key[at + 3]! | key[at + 4]! | key[at + 6]! | key[at + 7]! | key[at + 8]!) === 0;
}

/** IPVS counts an entry as active only while established; live UDP flows count as active too. */
function isActiveState(state: number): boolean {
  return state === FlowState.established || state === FlowState.udp;
}

function checkState(state: number): void {
  if (!Number.isInteger(state) || state < FlowState.syn || state > FlowState.udp) {
    throw new RangeError(`flow state must be 1..5, got ${state}`);
  }
}

function checkTimeouts(t: FlowTimeouts): void {
  const values = [t.synMs, t.establishedMs, t.finMs, t.closeMs, t.udpMs];
  for (const v of values) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
      throw new RangeError(`flow timeouts must be finite numbers >= 0 ms, got ${String(v)}`);
    }
  }
}

export class FlowTable {
  readonly capacity: number;
  /** Scratch key the caller fills before lookup()/insert(). */
  readonly key = new Uint32Array(KEY_WORDS);
  /** This table's seed of indexHash(): random unless the constructor is given one (tests). */
  readonly indexSeed: number;
  /**
   * Live entries per real id, split as IPVS does: active = established (and live udp), inactive =
   * syn/fin/closed. Backed by SharedArrayBuffer so the control thread can read them.
   */
  readonly activeByReal: Int32Array;
  readonly inactiveByReal: Int32Array;
  /** Live entries. */
  size = 0;
  /** Entries evicted because the table was full (monotonic). */
  evictions = 0;
  /** Entries removed by timeout (monotonic), by lookup(), expire() or a full table's oldest entry. */
  expirations = 0;

  private readonly maxRealIds: number;
  /**
   * Open-addressing index: linear probing, backward-shift deletion (no tombstones). Two words per
   * bucket, [2b] entry number (-1 empty) and [2b + 1] its hash, in one cache line: a probe rejects
   * other keys and finds a bucket's home without reading any entry. indexMask + 1 buckets, at least
   * twice the live entries: the index doubles as the table fills (growIndex), so that the buckets
   * of a few thousand flows span a few hundred KiB, not the 16 MiB a full 1M table needs (a random
   * read there is a TLB miss, the largest cost of a packet).
   */
  private index: Int32Array;
  private indexMask: number;
  /** Buckets of the full-size index: nextPow2(2 * capacity). */
  private readonly maxBuckets: number;
  /** Preallocated homes of the index as it doubles, used in turn: maxBuckets in one, half that in the other. */
  private readonly indexFull: Int32Array;
  private readonly indexHalf: Int32Array;
  /**
   * Entry records (see STRIDE), `capacity` of them; `seen` is the float64 view of the same memory.
   * Shared memory, so that the control thread can still read the flows when the loop that owns the
   * table has ended (a crash, its interface gone) and give them to the loop that replaces it.
   */
  readonly records: SharedArrayBuffer;
  private readonly rec: Int32Array;
  private readonly seen: Float64Array;
  /** Each entry's hash, to find its bucket when it is removed (off the per-packet path). */
  private readonly hashes: Int32Array;
  // Per state, a list in last-seen order (heads[state] = oldest) through R_PREV/R_NEXT; the oldest
  // entry of the table is the oldest of the heads. Freed entries are chained through R_NEXT (the
  // most recently freed is reused first); entries from `unused` on were never used since the last
  // clear(), so their memory is not touched until the table needs it.
  private readonly heads = new Int32Array(STATE_SLOTS);
  private readonly tails = new Int32Array(STATE_SLOTS);
  private freeHead = -1;
  private unused = 0;
  /** Idle timeout per state value (index 0, free, unused). */
  private readonly timeoutByStateMs = new Float64Array(STATE_SLOTS);

  constructor(capacity: number, timeouts: FlowTimeouts, maxRealIds: number, indexSeed?: number) {
    if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_CAPACITY) {
      throw new RangeError(`flow table capacity must be an integer in 1..${MAX_CAPACITY}, got ${capacity}`);
    }
    if (!Number.isInteger(maxRealIds) || maxRealIds < 1) {
      throw new RangeError(`maxRealIds must be an integer >= 1, got ${maxRealIds}`);
    }
    this.capacity = capacity;
    this.maxRealIds = maxRealIds;
    this.indexSeed = (indexSeed ?? randomBytes(4).readInt32LE(0)) | 0;
    let buckets = 1;
    while (buckets < 2 * capacity) buckets *= 2;
    this.maxBuckets = buckets;
    this.indexFull = new Int32Array(2 * buckets);
    this.indexHalf = new Int32Array(buckets > INITIAL_BUCKETS ? buckets : 0);
    this.index = this.indexFull;
    this.indexMask = buckets - 1;
    this.records = new SharedArrayBuffer(capacity * STRIDE * 4);
    this.rec = new Int32Array(this.records);
    this.seen = new Float64Array(this.records);
    this.hashes = new Int32Array(capacity);
    // Touch the index memory now: page faults inside growIndex() made its pause four times longer
    // (40 ms instead of 10 at 512k entries). Entry records are touched as they are first used, so
    // the process holds memory for the most flows it has had, not for the capacity.
    this.indexFull.fill(-1);
    this.indexHalf.fill(-1);
    this.activeByReal = new Int32Array(new SharedArrayBuffer(4 * maxRealIds));
    this.inactiveByReal = new Int32Array(new SharedArrayBuffer(4 * maxRealIds));
    this.setTimeouts(timeouts);
    this.clear();
  }

  setTimeouts(t: FlowTimeouts): void {
    timeoutsByState(t, this.timeoutByStateMs);
  }

  /** Bytes held by this table's typed arrays (index, records, hashes, scratch key, per-real counts), each buffer once. */
  get memoryBytes(): number {
    return (
      this.indexFull.byteLength +
      this.indexHalf.byteLength +
      this.rec.byteLength +
      this.hashes.byteLength +
      this.timeoutByStateMs.byteLength +
      this.heads.byteLength +
      this.tails.byteLength +
      this.key.byteLength +
      this.activeByReal.byteLength +
      this.inactiveByReal.byteLength
    );
  }

  /**
   * The bucket hash of this.key: flowIndexHash under this table's own seed, so that nobody who
   * knows the LBs' common flow hash can pick keys that pile up in one probe run. What the packet
   * path passes to lookup() and insert().
   */
  indexHash(): number {
    return flowIndexHash(this.key, this.indexSeed);
  }

  /**
   * Entry index for this.key, or -1. An entry found expired at nowMs (idle for at least its state's
   * timeout) is removed, counted in expirations, and -1 returned. `hash` is indexHash() (as int32
   * or uint32, the same bits); the table works with any function of the key, and tests pass others.
   */
  lookup(hash: number, nowMs: number): number {
    const h = hash | 0;
    const index = this.index;
    const mask = this.indexMask;
    const rec = this.rec;
    const key = this.key;
    // The index has at least twice as many buckets as entries, so an empty bucket ends every probe.
    let b = h & mask;
    for (;;) {
      const e = index[2 * b]!;
      if (e === -1) return -1;
      if (index[2 * b + 1] === h) {
        // The key compare, written out: less bytecode to inline into the packet path (inlining-budget.ts).
        // An IPv4 key's words 2-4 and 6-8 are zero in every key the table holds (insert checks it).
        const base = e * STRIDE;
        const k0 = key[0]! | 0;
        let same: boolean;
        if (isIpv4Key(k0)) {
          same = rec[base] === k0 && rec[base + 1] === (key[1]! | 0) && rec[base + 5] === (key[5]! | 0) && rec[base + 9] === (key[9]! | 0);
        } else {
          let i = 0;
          while (i < KEY_WORDS && rec[base + i] === (key[i]! | 0)) i++;
          same = i === KEY_WORDS;
        }
        if (same) {
          if (nowMs - this.seen[e * SEEN_STRIDE + SEEN_OFFSET]! >= this.timeoutByStateMs[rec[base + R_STATE]!]!) {
            this.removeLive(e);
            this.expirations++;
            return -1;
          }
          return e;
        }
      }
      b = (b + 1) & mask;
    }
  }

  /**
   * Insert this.key (the caller guarantees it is absent) -> entry index. When full, an entry idle
   * past its timeout goes first (counted as an expiration), else victim()'s (an eviction). The initial state is the caller's to choose from the packet: syn for a SYN
   * and for tcp seen mid-stream (fin if it carries a FIN), udp for udp. `hash` as for lookup().
   * The entry goes to the tail of its state's list, last seen at nowMs: a caller that gives a time
   * before that list's tail (adoptFlows) calls relinkInSeenOrder() once it is done inserting.
   */
  insert(hash: number, realId: number, state: number, nowMs: number): number {
    this.checkReal(realId);
    checkState(state);
    if (!isCanonicalKey(this.key, 0)) throw new RangeError('an IPv4 flow key must have words 2-4 and 6-8 zero');
    const rec = this.rec;
    if (this.freeHead === -1 && this.unused === this.capacity) {
      const expired = this.oldestExpired(nowMs);
      if (expired !== -1) {
        this.expirations++;
        this.removeLive(expired);
      } else {
        this.evictions++;
        this.removeLive(this.victim());
      }
    }
    let e = this.freeHead;
    if (e === -1) e = this.unused++;
    else this.freeHead = rec[e * STRIDE + R_NEXT]!;
    const base = e * STRIDE;

    const h = hash | 0;
    // Keep the load at most 1/2; never true at full size, where 2 * capacity <= maxBuckets.
    if (2 * (this.size + 1) > this.indexMask + 1) this.growIndex();
    this.hashes[e] = h;
    const key = this.key;
    for (let i = 0; i < KEY_WORDS; i++) rec[base + i] = key[i]!;
    rec[base + R_REAL] = realId;
    rec[base + R_STATE] = state;
    this.seen[e * SEEN_STRIDE + SEEN_OFFSET] = nowMs;
    this.linkTail(e, state);

    const index = this.index;
    const mask = this.indexMask;
    let b = h & mask;
    while (index[2 * b] !== -1) b = (b + 1) & mask;
    index[2 * b] = e;
    index[2 * b + 1] = h;

    this.size++;
    if (isActiveState(state)) this.activeByReal[realId]!++;
    else this.inactiveByReal[realId]!++;
    return e;
  }

  /**
   * A packet of the flow was seen: refresh last-seen (move to the LRU tail) and, for tcp entries,
   * run the state machine on the client->server flags. A SYN moves a fin/closed entry back to syn,
   * so ask isReusable() before touch() when port reuse should be rescheduled.
   */
  touch(entry: number, tcpFlags: number, nowMs: number): void {
    this.checkLive(entry);
    this.seen[entry * SEEN_STRIDE + SEEN_OFFSET] = nowMs;
    const state = this.rec[entry * STRIDE + R_STATE]!;
    const next = state === FlowState.udp ? state : tcpNext(state, tcpFlags);
    if (next !== state) {
      this.changeState(entry, state, next);
    } else if (entry !== this.tails[state]) {
      this.unlink(entry, state);
      this.linkTail(entry, state);
    }
  }

  // Apart from touch() so that touch stays small (its bytecode counts against inlining-budget.ts).
  // The entry goes to the tail of its new state's list (its last-seen is the caller's now).
  private changeState(entry: number, state: number, next: number): void {
    const base = entry * STRIDE;
    this.unlink(entry, state);
    this.rec[base + R_STATE] = next;
    this.linkTail(entry, next);
    const wasActive = isActiveState(state);
    if (wasActive !== isActiveState(next)) {
      const real = this.rec[base + R_REAL]!;
      if (wasActive) {
        this.activeByReal[real]!--;
        this.inactiveByReal[real]!++;
      } else {
        this.inactiveByReal[real]!--;
        this.activeByReal[real]!++;
      }
    }
  }

  /** Real id of a live entry, -1 for a free or out-of-range entry. */
  realOf(entry: number): number {
    if (!this.isLive(entry)) return -1;
    return this.rec[entry * STRIDE + R_REAL]!;
  }

  /** FlowState of a live entry, 0 for a free or out-of-range entry. */
  stateOf(entry: number): number {
    if (entry < 0 || entry >= this.capacity) return STATE_FREE;
    return this.rec[entry * STRIDE + R_STATE]!;
  }

  /** Last-seen time of a live entry, NaN for a free or out-of-range entry. */
  lastSeenOf(entry: number): number {
    if (!this.isLive(entry)) return NaN;
    return this.seen[entry * SEEN_STRIDE + SEEN_OFFSET]!;
  }

  /** The idle timeout of FlowState `state` (0 for a value that is not a state). */
  timeoutOf(state: number): number {
    return state >= FlowState.syn && state <= FlowState.udp ? this.timeoutByStateMs[state]! : 0;
  }

  /** True for a live entry idle past its state's timeout (removed by the next lookup or sweep). */
  isExpired(entry: number, nowMs: number): boolean {
    return this.isLive(entry) && this.idlePastTimeout(entry, nowMs);
  }

  /** A live entry idle for at least its state's timeout (lookup() writes this test out: see there). */
  private idlePastTimeout(entry: number, nowMs: number): boolean {
    return nowMs - this.seen[entry * SEEN_STRIDE + SEEN_OFFSET]! >= this.timeoutByStateMs[this.rec[entry * STRIDE + R_STATE]!]!;
  }

  /** True for fin/closed tcp entries: a new SYN on that tuple is a new connection (port reuse). */
  isReusable(entry: number): boolean {
    const state = this.stateOf(entry);
    return state === FlowState.fin || state === FlowState.closed;
  }

  /**
   * A packet of the flow was seen, and the entry starts again in `state` whatever the state machine
   * would say (a rescheduled TCP flow on a real that never saw it, as insert() would start it);
   * per-real counts kept right.
   */
  restart(entry: number, state: number, nowMs: number): void {
    this.checkLive(entry);
    checkState(state);
    const current = this.rec[entry * STRIDE + R_STATE]!;
    if (current !== state) this.changeState(entry, current, state);
    this.touch(entry, 0, nowMs); // no flags: last-seen and LRU only
  }

  /** Move an entry to another real (rescheduling), keeping per-real counts right. */
  setReal(entry: number, realId: number): void {
    this.checkLive(entry);
    this.checkReal(realId);
    const rec = this.rec;
    const base = entry * STRIDE;
    const old = rec[base + R_REAL]!;
    if (old === realId) return;
    rec[base + R_REAL] = realId;
    if (isActiveState(rec[base + R_STATE]!)) {
      this.activeByReal[old]!--;
      this.activeByReal[realId]!++;
    } else {
      this.inactiveByReal[old]!--;
      this.inactiveByReal[realId]!++;
    }
  }

  remove(entry: number): void {
    this.checkLive(entry);
    this.removeLive(entry);
  }

  /**
   * Remove expired entries, at most maxWork of them; returns how many were removed. Each state's
   * list is in expiry order, so a list is read only up to its first entry that is not yet due:
   * the work is the entries removed plus one look per state, however many idle entries wait.
   */
  expire(nowMs: number, maxWork: number): number {
    const rec = this.rec;
    const seen = this.seen;
    const heads = this.heads;
    let removed = 0;
    for (let state = FlowState.syn; state <= FlowState.udp && removed < maxWork; state++) {
      const timeout = this.timeoutByStateMs[state]!;
      let e = heads[state]!;
      while (e !== -1 && removed < maxWork && nowMs - seen[e * SEEN_STRIDE + SEEN_OFFSET]! >= timeout) {
        const after = rec[e * STRIDE + R_NEXT]!;
        this.removeLive(e);
        this.expirations++;
        removed++;
        e = after;
      }
    }
    return removed;
  }

  /**
   * Puts each state's list back in last-seen order after insert() was given last-seen times older
   * than their list's tail (adoptFlows: flows of another loop, idle for a while, into a table that
   * holds fresher ones). insert() appends at the tail, which the packet path's `now` keeps in order;
   * expire(), oldestExpired() and victim() read only the heads and would never reach an older entry
   * behind a fresher one. Off the packet path: a stable natural merge sort, one pass over a list
   * already in order and linear in its length for a few ordered runs (the table's own entries,
   * then the adopted ones); a list out of order gets scratch arrays of its length (24 bytes an entry).
   */
  relinkInSeenOrder(): void {
    for (let state = FlowState.syn; state <= FlowState.udp; state++) this.relinkState(state);
  }

  private relinkState(state: number): void {
    const rec = this.rec;
    const seen = this.seen;
    let n = 0;
    let runs = 1;
    let last = -Infinity;
    for (let e = this.heads[state]!; e !== -1; e = rec[e * STRIDE + R_NEXT]!) {
      const t = seen[e * SEEN_STRIDE + SEEN_OFFSET]!;
      if (t < last) runs++;
      last = t;
      n++;
    }
    if (runs === 1) return;
    let ids = new Int32Array(n);
    let times = new Float64Array(n);
    // bounds[r] is where run r starts; bounds[runs] = n.
    const bounds = new Int32Array(runs + 1);
    let i = 0;
    let r = 0;
    for (let e = this.heads[state]!; e !== -1; e = rec[e * STRIDE + R_NEXT]!, i++) {
      ids[i] = e;
      times[i] = seen[e * SEEN_STRIDE + SEEN_OFFSET]!;
      if (i > 0 && times[i]! < times[i - 1]!) bounds[++r] = i;
    }
    bounds[runs] = n;
    let ids2 = new Int32Array(n);
    let times2 = new Float64Array(n);
    while (runs > 1) {
      // Merge runs 2w and 2w + 1 into run w of the other arrays; bounds[w] is rewritten in place
      // (w <= 2w: no bound still to be read is overwritten).
      let w = 0;
      for (let k = 0; k < runs; k += 2) {
        const lo = bounds[k]!;
        const mid = bounds[k + 1]!;
        const hi = k + 2 <= runs ? bounds[k + 2]! : mid;
        let a = lo;
        let b = mid;
        let o = lo;
        while (a < mid && b < hi) {
          // `<=`: equal times keep their list order (stable).
          if (times[a]! <= times[b]!) {
            ids2[o] = ids[a]!;
            times2[o++] = times[a++]!;
          } else {
            ids2[o] = ids[b]!;
            times2[o++] = times[b++]!;
          }
        }
        while (a < mid) {
          ids2[o] = ids[a]!;
          times2[o++] = times[a++]!;
        }
        while (b < hi) {
          ids2[o] = ids[b]!;
          times2[o++] = times[b++]!;
        }
        bounds[w++] = lo;
      }
      bounds[w] = n;
      runs = w;
      const ti = ids;
      ids = ids2;
      ids2 = ti;
      const tt = times;
      times = times2;
      times2 = tt;
    }
    let prev = -1;
    for (let k = 0; k < n; k++) {
      const e = ids[k]!;
      rec[e * STRIDE + R_PREV] = prev;
      if (prev === -1) this.heads[state] = e;
      else rec[prev * STRIDE + R_NEXT] = e;
      prev = e;
    }
    rec[prev * STRIDE + R_NEXT] = -1;
    this.tails[state] = prev;
  }

  /** Copy an entry's key into out (Uint32Array of 10 words); for explain/plan in the control plane. */
  readKey(entry: number, out: Uint32Array): void {
    this.checkLive(entry);
    if (out.length < KEY_WORDS) throw new RangeError('readKey needs a Uint32Array of 10 words');
    const base = entry * STRIDE;
    for (let i = 0; i < KEY_WORDS; i++) out[i] = this.rec[base + i]!;
  }

  /**
   * The longest distance, in buckets, from a live entry's home bucket to where it sits: what the
   * slowest lookup walks. About log(entries) for a hash nobody steers. Control plane and tests only:
   * it reads the whole index.
   */
  longestProbe(): number {
    const index = this.index;
    const mask = this.indexMask;
    let longest = 0;
    for (let b = 0; b <= mask; b++) {
      if (index[2 * b] === -1) continue;
      const distance = (b - (index[2 * b + 1]! & mask)) & mask;
      if (distance > longest) longest = distance;
    }
    return longest;
  }

  /**
   * Iterate live entries, state by state and oldest first within a state: the entry after `entry`
   * (-1 to start), or -1 at the end.
   */
  next(entry: number): number {
    if (entry === -1) return this.firstFrom(FlowState.syn);
    if (!this.isLive(entry)) return -1;
    const after = this.rec[entry * STRIDE + R_NEXT]!;
    return after !== -1 ? after : this.firstFrom(this.rec[entry * STRIDE + R_STATE]! + 1);
  }

  /** The oldest entry of the first non-empty list from `state` on, or -1. */
  private firstFrom(state: number): number {
    for (let s = state; s <= FlowState.udp; s++) if (this.heads[s] !== -1) return this.heads[s]!;
    return -1;
  }

  /** The longest-idle entry already past its state's timeout (each list's head is its oldest), or -1. */
  private oldestExpired(nowMs: number): number {
    let oldest = -1;
    for (let s = FlowState.syn; s <= FlowState.udp; s++) {
      const e = this.heads[s]!;
      if (e !== -1 && this.idlePastTimeout(e, nowMs) && (oldest === -1 || this.seenOf(e) < this.seenOf(oldest))) oldest = e;
    }
    return oldest;
  }

  /**
   * The entry a full table gives up for a new one: the longest-idle of the connections being set
   * up or ending (syn, fin, closed); when there is none, the longest-idle udp flow; and only
   * then an established connection. A flood of SYNs or of stray segments (which start in syn)
   * replaces its own entries, as IPVS's drop_entry defense takes SYN_RECV entries first, and a
   * flood of datagrams (any source makes a udp entry) replaces udp flows, not the established
   * TCP connections of every service (two segments per spoofed tuple make an established entry,
   * which one direction cannot tell from a real one). A full table is not empty.
   */
  private victim(): number {
    const transient = this.olderHead(this.olderHead(this.heads[FlowState.syn]!, this.heads[FlowState.fin]!), this.heads[FlowState.closed]!);
    if (transient !== -1) return transient;
    const udp = this.heads[FlowState.udp]!;
    return udp !== -1 ? udp : this.heads[FlowState.established]!;
  }

  /** The longer idle of two entries (-1: none). */
  private olderHead(a: number, b: number): number {
    if (a === -1) return b;
    if (b === -1) return a;
    return this.seenOf(b) < this.seenOf(a) ? b : a;
  }

  private seenOf(entry: number): number {
    return this.seen[entry * SEEN_STRIDE + SEEN_OFFSET]!;
  }

  /** Drop every entry and zero the per-real counts; evictions and expirations stay (they are monotonic). */
  clear(): void {
    const buckets = Math.min(INITIAL_BUCKETS, this.maxBuckets);
    this.index = this.indexFor(buckets);
    this.indexMask = buckets - 1;
    this.index.fill(-1, 0, 2 * buckets);
    // Only entries used since the last clear() can be anything but zero (free).
    this.rec.fill(0, 0, this.unused * STRIDE);
    this.unused = 0;
    this.freeHead = -1;
    this.heads.fill(-1);
    this.tails.fill(-1);
    this.size = 0;
    this.activeByReal.fill(0);
    this.inactiveByReal.fill(0);
  }

  private isLive(entry: number): boolean {
    return entry >= 0 && entry < this.capacity && this.rec[entry * STRIDE + R_STATE] !== STATE_FREE;
  }

  // A free or out-of-range entry here is a bug in the caller, not something a packet can cause.
  private checkLive(entry: number): void {
    if (!this.isLive(entry)) throw new RangeError(`flow entry ${entry} is not live`);
  }

  private checkReal(realId: number): void {
    if (!Number.isInteger(realId) || realId < 0 || realId >= this.maxRealIds) {
      throw new RangeError(`real id must be an integer in 0..${this.maxRealIds - 1}, got ${realId}`);
    }
  }

  /** The preallocated array that holds an index of `buckets` buckets (the full size lives in indexFull). */
  private indexFor(buckets: number): Int32Array {
    return ((Math.clz32(buckets) - Math.clz32(this.maxBuckets)) & 1) === 0 ? this.indexFull : this.indexHalf;
  }

  /**
   * Doubles the index. One pass over the old buckets; an entry's new home is its old home or that
   * plus the old size, so the writes go nearly in order too. At most log2(capacity / 2048) times
   * after a clear(), each in time linear in the live entries (a few ms at 500k).
   */
  private growIndex(): void {
    const old = this.index;
    const oldBuckets = this.indexMask + 1;
    const buckets = 2 * oldBuckets;
    const index = this.indexFor(buckets);
    const mask = buckets - 1;
    index.fill(-1, 0, 2 * buckets);
    for (let b = 0; b < oldBuckets; b++) {
      const e = old[2 * b]!;
      if (e === -1) continue;
      const h = old[2 * b + 1]!;
      let n = h & mask;
      while (index[2 * n] !== -1) n = (n + 1) & mask;
      index[2 * n] = e;
      index[2 * n + 1] = h;
    }
    this.index = index;
    this.indexMask = mask;
  }

  /** Appends an entry to the list of `state` (the state it is in). */
  private linkTail(entry: number, state: number): void {
    const rec = this.rec;
    const tail = this.tails[state]!;
    rec[entry * STRIDE + R_PREV] = tail;
    rec[entry * STRIDE + R_NEXT] = -1;
    if (tail === -1) this.heads[state] = entry;
    else rec[tail * STRIDE + R_NEXT] = entry;
    this.tails[state] = entry;
  }

  /** Takes an entry out of the list of `state` (the state it is in). */
  private unlink(entry: number, state: number): void {
    const rec = this.rec;
    const prev = rec[entry * STRIDE + R_PREV]!;
    const next = rec[entry * STRIDE + R_NEXT]!;
    if (prev === -1) this.heads[state] = next;
    else rec[prev * STRIDE + R_NEXT] = next;
    if (next === -1) this.tails[state] = prev;
    else rec[next * STRIDE + R_PREV] = prev;
  }

  private removeLive(entry: number): void {
    this.removeFromIndex(entry);
    const rec = this.rec;
    const base = entry * STRIDE;
    const state = rec[base + R_STATE]!;
    this.unlink(entry, state);
    const real = rec[base + R_REAL]!;
    if (isActiveState(state)) this.activeByReal[real]!--;
    else this.inactiveByReal[real]!--;
    rec[base + R_STATE] = STATE_FREE;
    rec[base + R_REAL] = -1;
    rec[base + R_PREV] = -1;
    rec[base + R_NEXT] = this.freeHead;
    this.freeHead = entry;
    this.size--;
  }

  /**
   * Backward-shift deletion (Knuth 6.4 algorithm R): after emptying a bucket, pull later members of
   * the probe run into the hole unless that would put them before their home bucket, so lookups
   * never need tombstones and every remaining key stays reachable from its home bucket.
   */
  private removeFromIndex(entry: number): void {
    const index = this.index;
    const mask = this.indexMask;
    let hole = this.hashes[entry]! & mask;
    while (index[2 * hole] !== entry) hole = (hole + 1) & mask;
    let j = hole;
    for (;;) {
      j = (j + 1) & mask;
      const other = index[2 * j]!;
      if (other === -1) break;
      const otherHash = index[2 * j + 1]!;
      const home = otherHash & mask;
      // `other` must stay if its home lies cyclically in (hole, j]: moving it would skip its home.
      const stays = hole <= j ? hole < home && home <= j : hole < home || home <= j;
      if (stays) continue;
      index[2 * hole] = other;
      index[2 * hole + 1] = otherHash;
      hole = j;
    }
    index[2 * hole] = -1;
  }
}
