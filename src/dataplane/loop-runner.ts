// One packet loop: opens the packet I/O, runs the engine on every batch, and answers the control
// plane's requests (LoopRequest) with events (LoopEvent). Hosted by a worker thread
// (loop-worker.ts, the normal case) or, for io: pcap, on the main thread (the cap addon polls
// libpcap on the process's default libuv loop, which a worker thread cannot use).

import { performance } from 'node:perf_hooks';
import { performanceNowToMonotonicMs } from './monotonic-clock.js';
import { Counter } from './counters.js';
import { DropReason } from './drop-reasons.js';
import { Engine, Placement } from './engine.js';
import { adoptFlows, collectFlows, concatFlows, type FlowBatch } from './flow-handoff.js';
import { FlowTable, type FlowTimeouts } from './flow-table.js';
import type { ForwardingSnapshot } from './forwarding-snapshot.js';
import { ParsedPacket } from './parsed-packet.js';
import type { PacketIo } from '../io/packet-io.js';

export interface LoopSettings {
  io: 'afpacket' | 'pcap';
  /** AF_PACKET ring version (io: afpacket). */
  ring: 'v2' | 'v3';
  interface: string;
  flowCapacity: number;
  timeouts: FlowTimeouts;
  maxRealIds: number;
  counters: Float64Array;
  /** Its socket's part in the PACKET_FANOUT group of the daemon's loops. */
  fanout: FanoutMembership;
  /** The CPU this loop's thread runs on (config `cpus`), or null: wherever the kernel puts it. */
  cpu: number | null;
  /** The snapshot to run from the first packet (a loop started again after it ended); else the empty one until the first 'snapshot'. */
  snapshot?: ForwardingSnapshot | null;
  /**
   * Flows to hold before the first packet (a loop started again: the flows of the loop it
   * replaces, and with several loops the others' too), taken as of `atMs` on the process's
   * monotonic clock; graceMs as in adoptFlows.
   */
  adopt?: { flows: FlowBatch; atMs: number; graceMs: number | null } | null;
  /**
   * The socket of the loop this one replaces, kept open by the control thread (the group's
   * descriptor, which stays the group's: the I/O takes a copy): taken over with its ring, its place
   * in the fanout group and the frames that arrived meanwhile (io: afpacket, ring v3). Its fanout
   * membership is 'kept'.
   */
  keptSocket?: number | null;
}

/**
 * How a loop's socket takes part in the PACKET_FANOUT group that spreads the flows over the
 * daemon's loops: not at all (a single loop); as the socket that makes it, under an id the kernel
 * picks that no other program's group has (the loop reports it in 'ready'); or joining that group.
 */
export type FanoutMembership =
  | { readonly mode: 'none' }
  | { readonly mode: 'make' }
  | { readonly mode: 'join'; readonly groupId: number }
  /** The socket taken over (LoopSettings.keptSocket) is in the group already. */
  | { readonly mode: 'kept'; readonly groupId: number };

export type LoopRequest =
  | { type: 'snapshot'; snapshot: ForwardingSnapshot }
  | { type: 'timeouts'; timeouts: FlowTimeouts }
  | { type: 'explain'; id: number; family: number; protocol: number; addr: Uint32Array; srcPort: number; dstPort: number }
  | { type: 'flows'; id: number; limit: number }
  /** Flows to hold (flow-handoff.ts adoptFlows): the daemon's before at a start, a loop's that ended to the living loops; graceMs with several loops. */
  | { type: 'adoptFlows'; id: number; flows: FlowBatch; graceMs: number | null }
  | { type: 'stop' };

export type LoopEvent =
  /** fanoutGroupId: the PACKET_FANOUT group its socket is in, null without one. */
  /**
   * flowRecords: its flow table's records (FlowTable.records), read by the group when the loop has
   * ended; adoptedFlows: the flows of settings.adopt it holds.
   */
  /** keptSocket: a descriptor of its socket for the group to hold (LoopSettings.keptSocket), null when its I/O has none. */
  | { type: 'ready'; localMac: Uint8Array; mtu: number; activeByReal: Int32Array; inactiveByReal: Int32Array; flowRecords: SharedArrayBuffer; adoptedFlows: number; fanoutGroupId: number | null; keptSocket: number | null }
  | { type: 'error'; code: string; message: string }
  | { type: 'explained'; id: number; real: number; placement: string; generation: number; slot: number; flowState: number; entryReal: number }
  | ({ type: 'flows'; id: number } & FlowBatch)
  | { type: 'adopted'; id: number; count: number }
  | { type: 'stopped' };

const placementNames: Record<number, string> = {
  [Placement.flowTable]: 'flow-table',
  [Placement.scheduled]: 'scheduler',
  [Placement.consistentHash]: 'consistent-hash',
  [Placement.rescheduled]: 'rescheduled',
};

async function openIo(s: LoopSettings): Promise<PacketIo> {
  if (s.io === 'pcap') {
    const { PcapIo } = await import('../io/pcap-io.js');
    return PcapIo.open({ interface: s.interface });
  }
  const { AfPacketIo } = await import('../io/afpacket-io.js');
  const kept = s.keptSocket ?? null;
  return AfPacketIo.open({
    interface: s.interface,
    fanoutGroupId: s.fanout.mode === 'join' ? s.fanout.groupId : undefined,
    fanoutNewGroup: s.fanout.mode === 'make',
    ringVersion: s.ring === 'v2' ? 2 : 3,
    keptSocket: kept === null ? undefined : { fd: kept, fanoutGroupId: s.fanout.mode === 'kept' ? s.fanout.groupId : null },
  });
}

export class LoopRunner {
  private engine: Engine | null = null;
  private io: PacketIo | null = null;
  private housekeeping: NodeJS.Timeout | null = null;
  private readonly scratch = new ParsedPacket();
  /** Flows of settings.adopt the table held after the start. */
  private adopted = 0;
  /** performance.now() + origin = the process's monotonic clock, shared with the control plane's heartbeat check. */
  private readonly origin = performanceNowToMonotonicMs();

  constructor(
    private readonly settings: LoopSettings,
    private readonly emit: (e: LoopEvent) => void,
    /** Opens the I/O (a seam: tests give an in-memory one). */
    private readonly open: (s: LoopSettings) => Promise<PacketIo> = openIo,
    /**
     * Whether 'ready' hands the group a descriptor of the socket (keepSocket): in a worker, whose
     * thread can end while the group lives on; not for a loop on the group's own thread.
     */
    private readonly keepsSocket = false,
  ) {}

  async start(): Promise<boolean> {
    const s = this.settings;
    if (s.cpu !== null && !(await this.pin(s.cpu))) return false;
    // Flows given to a loop started again go in before its socket opens: with many of them (1M take
    // about 0.6 s) the ring would overflow meanwhile.
    const flows = new FlowTable(s.flowCapacity, s.timeouts, s.maxRealIds);
    if (s.adopt) {
      const now = this.origin + performance.now();
      this.adopted = adoptFlows(flows, concatFlows([{ batch: s.adopt.flows, atMs: s.adopt.atMs }], now), now, s.adopt.graceMs, s.maxRealIds);
      // Taken: the batch (49 bytes a flow) need not live as long as the loop.
      s.adopt = null;
    }
    let io: PacketIo;
    try {
      io = await this.open(s);
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      this.emit({ type: 'error', code: e.code ?? 'EIO', message: `opening ${s.io} on ${s.interface}: ${e.message}` });
      return false;
    }
    if (s.fanout.mode !== 'none' && (io.fanoutGroupId ?? null) === null) {
      // The other loops would wait for (or share flows with) a group this I/O is not in.
      io.close();
      this.emit({ type: 'error', code: 'EINVAL', message: `opening ${s.io} on ${s.interface}: this I/O cannot take part in a PACKET_FANOUT group (workers > 1 needs io: afpacket)` });
      return false;
    }
    const engine = new Engine({ flowCapacity: s.flowCapacity, timeouts: s.timeouts, maxRealIds: s.maxRealIds, counters: s.counters, localMac: io.localMac, mtu: io.mtu, flows });
    if (s.snapshot) engine.setSnapshot(s.snapshot);
    this.io = io;
    this.engine = engine;
    const origin = this.origin;
    const c = s.counters;
    // The engine's share of the loop's time (one more clock read per batch), published with the
    // I/O's busy time every 100 ms so that a scrape sees the two from the same moment. In a typed
    // array: a double in a closure variable is a new heap number on every store.
    const engineMs = new Float64Array(1);
    io.start((batch) => {
      const t = performance.now();
      engine.processBatch(batch, origin + t);
      engineMs[0] += performance.now() - t;
    });
    let ticks = 0;
    this.housekeeping = setInterval(() => {
      // Once a second: an interface deleted (or deleted and made again) leaves the socket bound to
      // nothing, forwarding nothing for good while the loop looks healthy. The loop ends instead,
      // and the group opens a new one on the interface as it is now.
      if (++ticks % 10 === 0) {
        const lost = io.interfaceLost?.() ?? null;
        if (lost !== null) {
          this.shutDown();
          this.emit({ type: 'error', code: 'EINTERFACE', message: lost });
          return;
        }
      }
      engine.housekeeping(origin + performance.now(), 50_000);
      const st = io.stats();
      c[Counter.rxKernelDrops] = st.rxKernelDrops;
      c[Counter.rxOtherHost] = st.rxOtherHost ?? 0;
      // Dropped by the backend before the engine saw them: counted with the engine's drops.
      c[Counter.dropBase + DropReason.captureTruncated] = st.rxTruncated ?? 0;
      // The engine counted these as sent when it chose to send them; the kernel refused them.
      c[Counter.dropBase + DropReason.txFailed] = st.txErrors;
      c[Counter.loopBusySeconds] = (st.busyMs ?? 0) / 1000;
      c[Counter.loopEngineSeconds] = engineMs[0]! / 1000;
    }, 100);
    // A heartbeat from the start: a loop started again is not taken for a stalled one until its first housekeeping.
    c[Counter.loopHeartbeatMs] = origin + performance.now();
    // Made in the same turn as 'ready' is posted: the group holds it from the moment it could need
    // it. A socket taken over has the group's descriptor already.
    const keptSocket = s.keptSocket != null ? null : this.keepSocket(io);
    this.emit({ type: 'ready', localMac: io.localMac, mtu: io.mtu, activeByReal: engine.flows.activeByReal, inactiveByReal: engine.flows.inactiveByReal, flowRecords: engine.flows.records, adoptedFlows: this.adopted, fanoutGroupId: io.fanoutGroupId ?? null, keptSocket });
    return true;
  }

  /** A descriptor of the socket for the group (a v3 ring in a worker), or null; a failure only costs the takeover. */
  private keepSocket(io: PacketIo): number | null {
    if (!this.keepsSocket || this.settings.ring !== 'v3' || !io.keepSocket) return null;
    try {
      return io.keepSocket();
    } catch {
      return null;
    }
  }

  private shutDown(): void {
    if (this.housekeeping) clearInterval(this.housekeeping);
    this.housekeeping = null;
    this.io?.close();
    this.engine = null;
  }

  /** Pins this thread (a worker: afpacket only, config validation sees to that) to `cpu`. */
  private async pin(cpu: number): Promise<boolean> {
    try {
      const { loadNative } = await import('../io/native-binding.js');
      loadNative().pinThread(cpu);
      return true;
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      this.emit({ type: 'error', code: e.code ?? 'EINVAL', message: `pinning the packet loop to CPU ${cpu}: ${e.message}` });
      return false;
    }
  }

  handle(m: LoopRequest): void {
    const engine = this.engine;
    if (!engine) return;
    switch (m.type) {
      case 'snapshot':
        engine.setSnapshot(m.snapshot);
        break;
      case 'timeouts':
        engine.setTimeouts(m.timeouts);
        break;
      case 'explain': {
        const p = this.scratch;
        p.reset();
        p.family = m.family;
        p.ipProtocol = m.protocol;
        p.addr.set(m.addr);
        p.srcPort = m.srcPort;
        p.dstPort = m.dstPort;
        const real = engine.explain(p, this.origin + performance.now());
        this.emit({ type: 'explained', id: m.id, real, placement: placementNames[engine.lastPlacement] ?? 'none', generation: engine.snapshot().generation, slot: engine.explainSlot, flowState: engine.explainFlowState, entryReal: engine.explainEntryReal });
        break;
      }
      case 'flows': {
        const b = collectFlows(engine.flows, this.origin + performance.now(), m.limit);
        this.emit({ type: 'flows', id: m.id, keys: b.keys, reals: b.reals, states: b.states, idleMs: b.idleMs, count: b.count });
        break;
      }
      case 'adoptFlows': {
        const count = adoptFlows(engine.flows, m.flows, this.origin + performance.now(), m.graceMs, this.settings.maxRealIds);
        this.emit({ type: 'adopted', id: m.id, count });
        break;
      }
      case 'stop':
        this.shutDown();
        this.emit({ type: 'stopped' });
        break;
    }
  }
}
