// The connection table: 5-tuple key -> real, in preallocated typed arrays of a fixed capacity, with
// exact LRU eviction of the longest-idle entry, per-state idle timeouts, and per-real active/inactive
// counts kept exact on every change (what `status` shows and what wlc schedules on).

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
/** state[] value of an entry on the free list. */
const STATE_FREE = 0;
const STATE_SLOTS = 6;
/** Keeps nextPow2(2 * capacity) buckets addressable by an Int32Array index. */
const MAX_CAPACITY = 1 << 28;

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

/** IPVS counts an entry as active only while established; live UDP flows count as active too. */
function isActiveState(state: number): boolean {
  return state === FlowState.established || state === FlowState.udp;
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
  // Open-addressing index over entry numbers: linear probing, backward-shift deletion (no tombstones).
  private readonly index: Int32Array;
  private readonly indexMask: number;
  // Entry arrays, `capacity` long each.
  private readonly hashes: Uint32Array;
  private readonly keys: Uint32Array;
  private readonly reals: Int32Array;
  private readonly states: Uint8Array;
  private readonly lastSeenMs: Float64Array;
  // LRU list in last-seen order (head = oldest). Free entries are chained through nextEntry too.
  private readonly prevEntry: Int32Array;
  private readonly nextEntry: Int32Array;
  private head = -1;
  private tail = -1;
  private freeHead = -1;
  /** Idle timeout per state value (index 0, free, unused). */
  private readonly timeoutByStateMs = new Float64Array(STATE_SLOTS);
  private minTimeoutMs = 0;
  /**
   * Where the next expire() call resumes. Without it, old entries with a long timeout at the head
   * (established, 900 s) would use up every call's work budget and hide expired entries behind them.
   * Kept valid by unlink(); -1 means start from the head.
   */
  private sweepCursor = -1;

  constructor(capacity: number, timeouts: FlowTimeouts, maxRealIds: number) {
    if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_CAPACITY) {
      throw new RangeError(`flow table capacity must be an integer in 1..${MAX_CAPACITY}, got ${capacity}`);
    }
    if (!Number.isInteger(maxRealIds) || maxRealIds < 1) {
      throw new RangeError(`maxRealIds must be an integer >= 1, got ${maxRealIds}`);
    }
    this.capacity = capacity;
    this.maxRealIds = maxRealIds;
    let buckets = 1;
    while (buckets < 2 * capacity) buckets *= 2;
    this.index = new Int32Array(buckets);
    this.indexMask = buckets - 1;
    this.hashes = new Uint32Array(capacity);
    this.keys = new Uint32Array(capacity * KEY_WORDS);
    this.reals = new Int32Array(capacity);
    this.states = new Uint8Array(capacity);
    this.lastSeenMs = new Float64Array(capacity);
    this.prevEntry = new Int32Array(capacity);
    this.nextEntry = new Int32Array(capacity);
    this.activeByReal = new Int32Array(new SharedArrayBuffer(4 * maxRealIds));
    this.inactiveByReal = new Int32Array(new SharedArrayBuffer(4 * maxRealIds));
    this.setTimeouts(timeouts);
    this.clear();
  }

  setTimeouts(t: FlowTimeouts): void {
    checkTimeouts(t);
    const tm = this.timeoutByStateMs;
    tm[FlowState.syn] = t.synMs;
    tm[FlowState.established] = t.establishedMs;
    tm[FlowState.fin] = t.finMs;
    tm[FlowState.closed] = t.closeMs;
    tm[FlowState.udp] = t.udpMs;
    this.minTimeoutMs = Math.min(t.synMs, t.establishedMs, t.finMs, t.closeMs, t.udpMs);
  }

  /** Bytes held by every typed array of this table (index, entries, scratch key, per-real counts). */
  get memoryBytes(): number {
    return (
      this.index.byteLength +
      this.hashes.byteLength +
      this.keys.byteLength +
      this.reals.byteLength +
      this.states.byteLength +
      this.lastSeenMs.byteLength +
      this.prevEntry.byteLength +
      this.nextEntry.byteLength +
      this.timeoutByStateMs.byteLength +
      this.key.byteLength +
      this.activeByReal.byteLength +
      this.inactiveByReal.byteLength
    );
  }

  /**
   * Entry index for this.key, or -1. An entry found expired at nowMs (idle for at least its state's
   * timeout) is removed, counted in expirations, and -1 returned.
   */
  lookup(hash: number, nowMs: number): number {
    const h = hash >>> 0;
    const index = this.index;
    const mask = this.indexMask;
    const hashes = this.hashes;
    // The index has at least twice as many buckets as entries, so an empty bucket ends every probe.
    let slot = h & mask;
    for (;;) {
      const e = index[slot]!;
      if (e === -1) return -1;
      if (hashes[e] === h && this.keyMatches(e)) {
        if (nowMs - this.lastSeenMs[e]! >= this.timeoutByStateMs[this.states[e]!]!) {
          this.removeLive(e);
          this.expirations++;
          return -1;
        }
        return e;
      }
      slot = (slot + 1) & mask;
    }
  }

  /**
   * Insert this.key (the caller guarantees it is absent) -> entry index. When full, the least
   * recently seen entry goes first (counted as an expiration if already idle past its timeout, else
   * as an eviction). Initial state: FlowState.syn/established for tcp (the caller decides from the
   * flags), FlowState.udp for udp.
   */
  insert(hash: number, realId: number, state: number, nowMs: number): number {
    this.checkReal(realId);
    if (!Number.isInteger(state) || state < FlowState.syn || state > FlowState.udp) {
      throw new RangeError(`flow state must be 1..5, got ${state}`);
    }
    if (this.freeHead === -1) {
      const oldest = this.head;
      if (nowMs - this.lastSeenMs[oldest]! >= this.timeoutByStateMs[this.states[oldest]!]!) {
        this.expirations++;
      } else {
        this.evictions++;
      }
      this.removeLive(oldest);
    }
    const e = this.freeHead;
    this.freeHead = this.nextEntry[e]!;

    const h = hash >>> 0;
    this.hashes[e] = h;
    this.keys.set(this.key, e * KEY_WORDS);
    this.reals[e] = realId;
    this.states[e] = state;
    this.lastSeenMs[e] = nowMs;
    this.linkTail(e);

    const index = this.index;
    const mask = this.indexMask;
    let slot = h & mask;
    while (index[slot] !== -1) slot = (slot + 1) & mask;
    index[slot] = e;

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
    this.lastSeenMs[entry] = nowMs;
    if (entry !== this.tail) {
      this.unlink(entry);
      this.linkTail(entry);
    }
    const state = this.states[entry]!;
    if (state === FlowState.udp) return;
    const next = nextTcpState(state, tcpFlags);
    if (next === state) return;
    this.states[entry] = next;
    const wasActive = isActiveState(state);
    if (wasActive !== isActiveState(next)) {
      const real = this.reals[entry]!;
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
    return this.reals[entry]!;
  }

  /** FlowState of a live entry, 0 for a free or out-of-range entry. */
  stateOf(entry: number): number {
    if (entry < 0 || entry >= this.capacity) return STATE_FREE;
    return this.states[entry]!;
  }

  /** Last-seen time of a live entry, NaN for a free or out-of-range entry. */
  lastSeenOf(entry: number): number {
    if (!this.isLive(entry)) return NaN;
    return this.lastSeenMs[entry]!;
  }

  /** True for fin/closed tcp entries: a new SYN on that tuple is a new connection (port reuse). */
  isReusable(entry: number): boolean {
    const state = this.stateOf(entry);
    return state === FlowState.fin || state === FlowState.closed;
  }

  /** Move an entry to another real (rescheduling), keeping per-real counts right. */
  setReal(entry: number, realId: number): void {
    this.checkLive(entry);
    this.checkReal(realId);
    const old = this.reals[entry]!;
    if (old === realId) return;
    this.reals[entry] = realId;
    if (isActiveState(this.states[entry]!)) {
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
   * Remove expired entries in last-seen order, examining at most maxWork entries; returns how many
   * were removed. A pass stops at the first entry idle for less than the smallest timeout, since
   * every entry after it is younger still; the next call then starts again from the oldest.
   * Otherwise the next call resumes where this one stopped.
   */
  expire(nowMs: number, maxWork: number): number {
    const lastSeen = this.lastSeenMs;
    const states = this.states;
    const timeouts = this.timeoutByStateMs;
    const minTimeout = this.minTimeoutMs;
    let e = this.sweepCursor === -1 ? this.head : this.sweepCursor;
    let examined = 0;
    let removed = 0;
    while (e !== -1 && examined < maxWork) {
      examined++;
      const idleMs = nowMs - lastSeen[e]!;
      if (idleMs < minTimeout) {
        e = -1;
        break;
      }
      const after = this.nextEntry[e]!;
      if (idleMs >= timeouts[states[e]!]!) {
        this.removeLive(e);
        this.expirations++;
        removed++;
      }
      e = after;
    }
    this.sweepCursor = e;
    return removed;
  }

  /** Copy an entry's key into out (Uint32Array of 10 words); for explain/plan in the control plane. */
  readKey(entry: number, out: Uint32Array): void {
    this.checkLive(entry);
    if (out.length < KEY_WORDS) throw new RangeError('readKey needs a Uint32Array of 10 words');
    const base = entry * KEY_WORDS;
    for (let i = 0; i < KEY_WORDS; i++) out[i] = this.keys[base + i]!;
  }

  /** Iterate live entries in LRU order (oldest first): the entry after `entry` (-1 to start), or -1 at the end. */
  next(entry: number): number {
    if (entry === -1) return this.head;
    if (!this.isLive(entry)) return -1;
    return this.nextEntry[entry]!;
  }

  /** Drop every entry and zero the per-real counts; evictions and expirations stay (they are monotonic). */
  clear(): void {
    this.index.fill(-1);
    this.states.fill(STATE_FREE);
    this.reals.fill(-1);
    this.prevEntry.fill(-1);
    const next = this.nextEntry;
    const last = this.capacity - 1;
    for (let i = 0; i < last; i++) next[i] = i + 1;
    next[last] = -1;
    this.freeHead = 0;
    this.head = -1;
    this.tail = -1;
    this.sweepCursor = -1;
    this.size = 0;
    this.activeByReal.fill(0);
    this.inactiveByReal.fill(0);
  }

  private isLive(entry: number): boolean {
    return entry >= 0 && entry < this.capacity && this.states[entry] !== STATE_FREE;
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

  private keyMatches(entry: number): boolean {
    const key = this.key;
    const keys = this.keys;
    const base = entry * KEY_WORDS;
    for (let i = 0; i < KEY_WORDS; i++) {
      if (keys[base + i] !== key[i]) return false;
    }
    return true;
  }

  private linkTail(entry: number): void {
    const tail = this.tail;
    this.prevEntry[entry] = tail;
    this.nextEntry[entry] = -1;
    if (tail === -1) this.head = entry;
    else this.nextEntry[tail] = entry;
    this.tail = entry;
  }

  private unlink(entry: number): void {
    const prev = this.prevEntry[entry]!;
    const next = this.nextEntry[entry]!;
    if (this.sweepCursor === entry) this.sweepCursor = next;
    if (prev === -1) this.head = next;
    else this.nextEntry[prev] = next;
    if (next === -1) this.tail = prev;
    else this.prevEntry[next] = prev;
  }

  private removeLive(entry: number): void {
    this.removeFromIndex(entry);
    this.unlink(entry);
    const real = this.reals[entry]!;
    if (isActiveState(this.states[entry]!)) this.activeByReal[real]!--;
    else this.inactiveByReal[real]!--;
    this.states[entry] = STATE_FREE;
    this.reals[entry] = -1;
    this.prevEntry[entry] = -1;
    this.nextEntry[entry] = this.freeHead;
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
    const hashes = this.hashes;
    let hole = hashes[entry]! & mask;
    while (index[hole] !== entry) hole = (hole + 1) & mask;
    let j = hole;
    for (;;) {
      j = (j + 1) & mask;
      const other = index[j]!;
      if (other === -1) break;
      const home = hashes[other]! & mask;
      // `other` must stay if its home lies cyclically in (hole, j]: moving it would skip its home.
      const stays = hole <= j ? hole < home && home <= j : hole < home || home <= j;
      if (stays) continue;
      index[hole] = other;
      hole = j;
    }
    index[hole] = -1;
  }
}
