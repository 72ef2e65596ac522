// The packet engine: for each frame of a batch, parse, find the service, find or create the flow,
// pick the real and rewrite the frame in place for L2 DSR. Owns the flow table and the counters
// of one packet loop; reads the forwarding snapshot, which the control plane swaps between batches.

import { Counter, REAL_BASE, REAL_STRIDE, RealCounter } from './counters.js';
import { DropReason } from './drop-reasons.js';
import { flowHash } from './flow-hash.js';
import { FlowState, FlowTable, type FlowTimeouts } from './flow-table.js';
import {
  FWD_L2,
  SCHED_RENDEZVOUS,
  SCHED_WLC,
  emptySnapshot,
  findService,
  type ForwardingSnapshot,
} from './forwarding-snapshot.js';
import { leastConnectionsPick } from './least-connections.js';
import { PARSE_NOT_IP, ParsedPacket, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_RST, TCP_SYN } from './parsed-packet.js';
import { parseFrame } from './packet-parser.js';
import { rendezvousPick } from './rendezvous.js';
import { VERDICT_PASS, VERDICT_TX, type PacketBatch } from '../io/packet-io.js';

export interface EngineOptions {
  flowCapacity: number;
  timeouts: FlowTimeouts;
  maxRealIds: number;
  counters: Float64Array;
  /** The LB's own MAC on the forwarding interface: the source MAC of every forwarded frame. */
  localMac: Uint8Array;
}

/** Why a flow got its real: reported by explain and by simulate; also the engine's internal switch. */
export const Placement = {
  flowTable: 1, // an existing entry
  scheduled: 2, // a new flow, placed by the service's scheduler
  consistentHash: 3, // a mid-stream packet without entry, placed by the consistent hash
  rescheduled: 4, // an entry whose real may not keep flows, moved
} as const;

export class Engine {
  readonly flows: FlowTable;
  readonly counters: Float64Array;
  private snap: ForwardingSnapshot = emptySnapshot();
  private readonly pkt = new ParsedPacket();
  private readonly localMac: Uint8Array;
  /** Set by place(): how the last placed packet got its real (a Placement value). */
  lastPlacement = 0;

  constructor(opts: EngineOptions) {
    this.flows = new FlowTable(opts.flowCapacity, opts.timeouts, opts.maxRealIds);
    this.counters = opts.counters;
    this.localMac = new Uint8Array(6);
    this.localMac.set(opts.localMac.subarray(0, 6));
  }

  /** Swap in a new snapshot. Called between batches only (JS runs one batch to completion). */
  setSnapshot(snap: ForwardingSnapshot): void {
    this.snap = snap;
    this.counters[Counter.snapshotGeneration] = snap.generation;
  }

  snapshot(): ForwardingSnapshot {
    return this.snap;
  }

  setTimeouts(t: FlowTimeouts): void {
    this.flows.setTimeouts(t);
  }

  processBatch(batch: PacketBatch, nowMs: number): void {
    const c = this.counters;
    const buf = batch.buf;
    const n = batch.count;
    const verdicts = batch.verdicts;
    c[Counter.batches]++;
    c[Counter.loopHeartbeatMs] = nowMs;
    for (let i = 0; i < n; i++) {
      const off = batch.offsets[i]!;
      const len = batch.lengths[i]!;
      c[Counter.rxPackets]++;
      c[Counter.rxBytes] += len;
      const v = this.processFrame(buf, off, len, nowMs);
      verdicts[i] = v;
      if (v === VERDICT_TX) {
        batch.txOffsets[i] = off;
        batch.txLengths[i] = len;
        c[Counter.txPackets]++;
        c[Counter.txBytes] += len;
      } else if (v === VERDICT_PASS) {
        c[Counter.passedPackets]++;
      } else {
        c[Counter.dropBase - v]++;
      }
    }
    c[Counter.flowTableEntries] = this.flows.size;
    c[Counter.flowTableEvictions] = this.flows.evictions;
  }

  /** Expire idle flows, a bounded amount of work; the loop calls this between batches. */
  housekeeping(nowMs: number, maxWork: number): void {
    this.flows.expire(nowMs, maxWork);
    this.counters[Counter.flowTableEntries] = this.flows.size;
    this.counters[Counter.flowTableExpirations] = this.flows.expirations;
    this.counters[Counter.loopHeartbeatMs] = nowMs;
  }

  private processFrame(buf: Uint8Array, off: number, len: number, nowMs: number): number {
    const pkt = this.pkt;
    const r = parseFrame(buf, off, len, pkt);
    if (r === PARSE_NOT_IP) return VERDICT_PASS;
    if (r < 0) return r;
    const proto = pkt.ipProtocol;
    if (proto !== IPPROTO_TCP && proto !== IPPROTO_UDP) return VERDICT_PASS;
    const snap = this.snap;
    const svc = findService(snap, pkt.family, proto, pkt.addr, pkt.dstPort);
    if (svc < 0) {
      // A non-first fragment carries no ports: it cannot match a port service yet.
      return VERDICT_PASS;
    }
    if (pkt.l4Offset < 0) return -DropReason.fragmentUnplaceable;

    const real = this.place(svc, pkt, nowMs);
    if (real < 0) return -DropReason.noRealAvailable;

    if (snap.realForwarding[real] !== FWD_L2) return -DropReason.ipipUnsupported;
    if (snap.realMacKnown[real] === 0) return -DropReason.neighborUnknown;
    // L2 DSR: only the Ethernet addresses change; the IP packet goes on untouched.
    const m = real * 6;
    const mac = snap.realMac;
    buf[off] = mac[m]!;
    buf[off + 1] = mac[m + 1]!;
    buf[off + 2] = mac[m + 2]!;
    buf[off + 3] = mac[m + 3]!;
    buf[off + 4] = mac[m + 4]!;
    buf[off + 5] = mac[m + 5]!;
    const lm = this.localMac;
    buf[off + 6] = lm[0]!;
    buf[off + 7] = lm[1]!;
    buf[off + 8] = lm[2]!;
    buf[off + 9] = lm[3]!;
    buf[off + 10] = lm[4]!;
    buf[off + 11] = lm[5]!;
    const rc = REAL_BASE + real * REAL_STRIDE;
    this.counters[rc + RealCounter.forwardedPackets]++;
    this.counters[rc + RealCounter.forwardedBytes] += len;
    return VERDICT_TX;
  }

  /** Fill the flow key of the table's scratch key from the parsed packet; returns its hash. */
  private keyFromPacket(pkt: ParsedPacket): number {
    const k = this.flows.key;
    const a = pkt.addr;
    k[0] = pkt.ipProtocol | (pkt.family << 8);
    k[1] = a[0]!;
    k[2] = a[1]!;
    k[3] = a[2]!;
    k[4] = a[3]!;
    k[5] = a[4]!;
    k[6] = a[5]!;
    k[7] = a[6]!;
    k[8] = a[7]!;
    k[9] = ((pkt.srcPort << 16) | pkt.dstPort) >>> 0;
    return flowHash(k, this.snap.hashSeed);
  }

  /**
   * The real for this packet of service svc, creating or updating its flow entry; -1 if none.
   * Sets lastPlacement. Also used by explain (with a synthetic packet) through placeForExplain.
   */
  private place(svc: number, pkt: ParsedPacket, nowMs: number): number {
    const snap = this.snap;
    const flows = this.flows;
    const hash = this.keyFromPacket(pkt);
    const isTcp = pkt.ipProtocol === IPPROTO_TCP;
    const flags = pkt.tcpFlags;
    const opensConnection = isTcp ? (flags & (TCP_SYN | TCP_ACK | TCP_RST)) === TCP_SYN : true;
    const entry = flows.lookup(hash, nowMs);
    if (entry >= 0) {
      const current = flows.realOf(entry);
      if (isTcp && opensConnection && flows.isReusable(entry)) {
        // A new SYN on a closing entry is a new connection on a reused port: schedule afresh.
        const real = this.schedule(svc, hash);
        if (real < 0) return -1;
        if (real !== current) flows.setReal(entry, real);
        flows.touch(entry, flags, nowMs);
        this.counters[REAL_BASE + real * REAL_STRIDE + RealCounter.flowsCreated]++;
        this.lastPlacement = Placement.scheduled;
        return real;
      }
      if (current < snap.realIdLimit && snap.realKeepExisting[current] === 1 && snap.realService[current] === svc) {
        flows.touch(entry, flags, nowMs);
        this.lastPlacement = Placement.flowTable;
        return current;
      }
      // Its real was disabled, failed or removed: the connection is broken anyway; move it.
      const real = this.consistentPick(svc, hash);
      if (real < 0) return -1;
      flows.setReal(entry, real);
      flows.touch(entry, flags, nowMs);
      this.counters[Counter.flowsRescheduled]++;
      if (current < snap.realIdLimit) this.counters[REAL_BASE + current * REAL_STRIDE + RealCounter.flowsRescheduledAway]++;
      this.lastPlacement = Placement.rescheduled;
      return real;
    }
    let real: number;
    if (opensConnection) {
      real = this.schedule(svc, hash);
      this.lastPlacement = Placement.scheduled;
    } else {
      // Mid-stream without entry (LB restart, or the flow came from another LB): the consistent
      // hash puts it where every LB with the same config put it.
      real = this.consistentPick(svc, hash);
      this.lastPlacement = Placement.consistentHash;
    }
    if (real < 0) return -1;
    if (isTcp && (flags & TCP_RST) !== 0) return real; // never create state for a reset
    const state = isTcp ? (opensConnection ? FlowState.syn : FlowState.established) : FlowState.udp;
    flows.insert(hash, real, state, nowMs);
    this.counters[REAL_BASE + real * REAL_STRIDE + RealCounter.flowsCreated]++;
    return real;
  }

  /** The scheduler's pick for a new flow of service svc. */
  private schedule(svc: number, hash: number): number {
    const snap = this.snap;
    if (snap.svcDropAll[svc] === 1) return -1;
    const sched = snap.svcScheduler[svc];
    if (sched === SCHED_WLC) {
      return leastConnectionsPick(snap.candIds, snap.candWeights, snap.svcCandStart[svc]!, snap.svcCandCount[svc]!, this.flows.activeByReal);
    }
    return this.consistentPick(svc, hash);
  }

  /** The consistent-hash pick: rendezvous for rendezvous services, the Maglev table otherwise. */
  private consistentPick(svc: number, hash: number): number {
    const snap = this.snap;
    if (snap.svcDropAll[svc] === 1) return -1;
    if (snap.svcScheduler[svc] === SCHED_RENDEZVOUS) {
      return rendezvousPick(hash, snap.candIds, snap.candSeeds, snap.candWeights, snap.svcCandStart[svc]!, snap.svcCandCount[svc]!);
    }
    const table = snap.svcTables[svc]!;
    return table[hash % snap.svcTableSize[svc]!]!;
  }

  /**
   * Explain (control plane, via the loop's thread): where a packet described by `pkt` would go,
   * without creating or changing state. Returns the real id or -1 and sets lastPlacement.
   */
  explain(pkt: ParsedPacket, nowMs: number): number {
    const snap = this.snap;
    const svc = findService(snap, pkt.family, pkt.ipProtocol, pkt.addr, pkt.dstPort);
    if (svc < 0) return -2;
    const hash = this.keyFromPacket(pkt);
    const entry = this.flows.lookup(hash, nowMs);
    if (entry >= 0) {
      const current = this.flows.realOf(entry);
      if (snap.realKeepExisting[current] === 1) {
        this.lastPlacement = Placement.flowTable;
        return current;
      }
    }
    this.lastPlacement = Placement.scheduled;
    return this.schedule(svc, hash);
  }
}
