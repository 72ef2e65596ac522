// `dsrlb simulate`: replays a scenario on a virtual clock through the daemon's own SnapshotBuilder,
// eligibility, Engine and FlowTable, one synthetic frame at a time, and reports where every flow
// went and why. Same scenario in, byte-identical trace out: nothing here reads the wall clock.

import { timeoutsOf } from '../control/flow-timeouts.js';
import type { Config } from '../config/types.js';
import { formatProblems } from '../config/validate.js';
import { RealRegistry } from '../control/real-registry.js';
import { SnapshotBuilder, type ServiceBuildReport } from '../control/snapshot-builder.js';
import { COUNTER_SLOTS, Counter, MAX_REAL_IDS, REAL_BASE, REAL_STRIDE, RealCounter } from '../dataplane/counters.js';
import { dropReasonLabels } from '../dataplane/drop-reasons.js';
import { Engine, Placement } from '../dataplane/engine.js';
import { TCP_ACK, TCP_FIN, TCP_PSH, TCP_SYN } from '../dataplane/parsed-packet.js';
import { createPacketBatch, VERDICT_PASS, VERDICT_TX, type PacketBatch } from '../io/packet-io.js';
import { flowKeyOf, MAX_SIM_FRAME_BYTES, prepareTuple, SIM_LB_MAC, simRealIdOfFrame, simRealMac, writeFrame, type PreparedTuple } from './frames.js';
import { loadScenarioFile, type FlowEvent, type Scenario, type ScenarioEvent } from './scenario.js';
import { initialServiceStates, viewsOf, type RealState, type ServiceState } from './service-views.js';

/** Why a packet went where it did, as the trace names it (the engine's Placement values). */
export type PlacementReason = 'flow-table' | 'scheduler' | 'consistent-hash' | 'rescheduled';

export const PLACEMENT_REASONS: Readonly<Record<number, PlacementReason>> = {
  [Placement.flowTable]: 'flow-table',
  [Placement.scheduled]: 'scheduler',
  [Placement.consistentHash]: 'consistent-hash',
  [Placement.rescheduled]: 'rescheduled',
};

/**
 * One line of the trace. Flow records: `start` (the opening packet: TCP SYN, or the first
 * datagram), `end` (the TCP FIN, or the last datagram) and `packet`, written only for a packet whose
 * outcome is news: it went to another real than the flow's previous packet, it was dropped (first of
 * a run of drops), or it was placed by anything other than a flow-table hit. A flow that stays put
 * therefore shows as two lines. Control records carry the event's own fields.
 */
export type TraceRecord = Readonly<Record<string, string | number | boolean | null>>;

export interface RealSummary {
  readonly address: string;
  /** Flows whose opening packet this real got. */
  readonly flowsStarted: number;
  /**
   * Highest count of its active flow-table entries at any moment, counted as the daemon (and wlc)
   * counts them: TCP from the handshake's ACK to the FIN, UDP until the entry's idle timeout.
   */
  readonly peakActiveFlows: number;
  readonly packets: number;
}

export interface ServiceSummary {
  readonly name: string;
  readonly scheduler: string;
  readonly flows: number;
  readonly movedFlows: number;
  /** Highest and lowest peakActiveFlows over the service's reals: how even the load was. */
  readonly peakActiveFlows: { readonly max: number; readonly min: number };
  readonly reals: readonly RealSummary[];
}

export interface SimulationSummary {
  readonly endMs: number;
  readonly flows: number;
  /** Flows that saw more than one real during their life (rescheduled, or lost their entry). */
  readonly movedFlows: number;
  readonly packets: { readonly sent: number; readonly forwarded: number; readonly dropped: number };
  /** Drop counts by the engine's reason label (dsrlb_dropped_packets_total{reason}); only reasons seen. */
  readonly droppedByReason: Readonly<Record<string, number>>;
  readonly services: readonly ServiceSummary[];
}

export interface SimulationResult {
  readonly trace: readonly TraceRecord[];
  readonly summary: SimulationSummary;
}

/** What a CLI command hands back for main.ts to print and exit with. */
export interface CommandOutput {
  readonly exitCode: 0 | 1 | 2;
  readonly stdout: string;
  readonly stderr: string;
}

/** Room before the frame, as a capture backend leaves it, in case the engine prepends a header. */
const FRAME_HEADROOM = 128;

interface FlowRun {
  readonly event: FlowEvent;
  readonly order: number;
  readonly tuple: PreparedTuple;
  readonly startMs: number;
  readonly endMs: number;
  /** Next data packet number (k-th packet after the opening one). */
  k: number;
  nextMs: number;
  closing: boolean;
  packets: number;
  /** Outcome of the previous packet: real id, or -1 - drop reason. */
  lastOutcome: number;
  /** The last real the flow was forwarded to, -1 before any. */
  lastReal: number;
  seq: number;
}

interface Outcome {
  realId: number; // -1 when dropped
  reason: PlacementReason | null;
  existingEntry: boolean;
  drop: string | null;
  /** realId, or -1 - drop reason: equal outcomes compare equal. */
  code: number;
}

/** Runs a validated scenario to the end. Deterministic: no clock, no randomness, fixed iteration orders. */
export function simulate(scenario: Scenario): SimulationResult {
  return new Simulation(scenario).run();
}

class Simulation {
  private readonly config: Config;
  private readonly states: ServiceState[];
  private readonly registry = new RealRegistry(MAX_REAL_IDS);
  private readonly builder = new SnapshotBuilder();
  private readonly engine: Engine;
  private readonly counters = new Float64Array(COUNTER_SLOTS);
  private readonly batch: PacketBatch;
  private readonly trace: TraceRecord[] = [];
  /** Real id -> (service name, address), for naming where frames went. */
  private readonly realName = new Map<number, { service: string; address: string }>();
  /** Removed reals whose flows still drain (forgetDrained frees their ids once they are gone). */
  private readonly draining: { state: ServiceState; real: RealState }[] = [];
  private readonly peakActive = new Map<number, number>();
  private readonly flowsStarted = new Map<number, number>();
  private readonly heap: FlowRun[] = [];
  private packetsSent = 0;
  /** Packets the engine forwarded (VERDICT_TX; tx counters also count frames it built). */
  private packetsForwarded = 0;
  /** Ids of flows forwarded to more than one real. */
  private readonly moved = new Set<string>();

  constructor(private readonly scenario: Scenario) {
    this.config = scenario.config;
    this.states = initialServiceStates(this.config.services);
    const flowCount = scenario.events.filter((e) => e.kind === 'flow').length;
    // Each flow uses one entry; below the configured capacity eviction cannot happen, so the smaller
    // table behaves the same and saves the daemon-sized allocation.
    const capacity = Math.max(1, Math.min(this.config.flowTable.capacity, flowCount));
    this.engine = new Engine({ flowCapacity: capacity, timeouts: timeoutsOf(this.config), maxRealIds: MAX_REAL_IDS, counters: this.counters, localMac: SIM_LB_MAC });
    this.batch = createPacketBatch(1);
    this.batch.headroom = FRAME_HEADROOM;
    this.batch.buf = new Uint8Array(FRAME_HEADROOM + MAX_SIM_FRAME_BYTES);
  }

  run(): SimulationResult {
    this.rebuild();
    const events = this.scenario.events;
    let next = 0;
    let endMs = 0;
    while (next < events.length || this.heap.length > 0) {
      const eventMs = next < events.length ? events[next]!.atMs : Infinity;
      const flowMs = this.heap.length > 0 ? this.heap[0]!.nextMs : Infinity;
      const nowMs = Math.min(eventMs, flowMs);
      endMs = nowMs;
      this.engine.housekeeping(nowMs, this.engine.flows.capacity);
      this.forgetDrained();
      // Packets of running flows first (a flow ending now frees its real before anything new
      // arrives), then the scenario's events at this time in file order.
      while (this.heap.length > 0 && this.heap[0]!.nextMs === nowMs) {
        const run = this.heapPop();
        this.step(run, nowMs);
        if (run.nextMs > nowMs) this.heapPush(run);
      }
      while (next < events.length && events[next]!.atMs === nowMs) {
        this.apply(events[next]!, nowMs, next);
        next++;
      }
    }
    return { trace: this.trace, summary: this.summary(endMs) };
  }

  // -------------------------------------------------------------------------------------------

  private apply(event: ScenarioEvent, nowMs: number, order: number): void {
    if (event.kind === 'flow') {
      this.startFlow(event, nowMs, order);
      return;
    }
    const state = this.states.find((s) => s.config.name === event.service)!;
    const existing = state.reals.find((r) => r.address === event.address);
    const entriesBefore = existing === undefined ? 0 : this.entriesOn(state, existing);
    switch (event.kind) {
      case 'addReal':
        if (existing !== undefined) {
          // A removed real still draining comes back with its id, as the daemon's syncReals does.
          existing.removed = false;
          existing.weight = event.weight;
          existing.intent = 'active';
          existing.backup = event.backup;
        } else {
          state.reals.push({ address: event.address, weight: event.weight, intent: 'active', forwarding: state.config.forwarding, health: 'up', removed: false, backup: event.backup });
        }
        break;
      case 'removeReal':
        existing!.removed = true;
        this.draining.push({ state, real: existing! });
        break;
      case 'weight':
        existing!.weight = event.weight;
        break;
      case 'health':
        existing!.health = event.state;
        break;
      case 'intent':
        existing!.intent = event.state;
        break;
    }
    const report = this.rebuild().find((r) => r.name === state.config.name)!;
    const record: Record<string, string | number | boolean | null> = { t: nowMs, event: event.kind, service: event.service, address: event.address };
    if (event.kind === 'addReal' || event.kind === 'weight') record['weight'] = event.weight;
    if (event.kind === 'addReal' && event.backup) record['backup'] = true;
    if (event.kind === 'health' || event.kind === 'intent') record['state'] = event.state;
    if (event.kind !== 'addReal') record['flowEntries'] = entriesBefore;
    // Rendezvous has no table (tableSize 0): 0 would read as "nothing moved", so no figure at all.
    if (report.tableSize > 0) record['movedSlots'] = report.movedSlots;
    record['candidates'] = report.candidates.length;
    if (report.dropping) record['dropping'] = true;
    if (report.panic) record['failOpen'] = true;
    if (report.onBackups) record['onBackups'] = true;
    this.trace.push(record);
  }

  private rebuild(): readonly ServiceBuildReport[] {
    const views = viewsOf(this.states, this.registry, { macOf: simRealMac, forceL2: true });
    for (const v of views) for (const r of v.reals) this.realName.set(r.id, { service: v.config.name, address: r.address });
    const { snapshot, services } = this.builder.build(views, this.config.hashSeed, MAX_REAL_IDS);
    this.engine.setSnapshot(snapshot);
    return services;
  }

  /**
   * Removed reals whose last flow has ended are forgotten and their ids freed, as the daemon does
   * (it kept every one: a scenario that added and removed reals ran out of the 8192 ids).
   */
  private forgetDrained(): void {
    if (this.draining.length === 0) return;
    let kept = 0;
    for (const d of this.draining) {
      if (!d.real.removed) continue; // added again
      if (this.entriesOn(d.state, d.real) > 0) {
        this.draining[kept++] = d;
        continue;
      }
      const i = d.state.reals.indexOf(d.real);
      if (i >= 0) d.state.reals.splice(i, 1);
      this.registry.release(RealRegistry.keyOf(d.state.identity, d.real.address));
    }
    this.draining.length = kept;
  }

  private entriesOn(state: ServiceState, real: RealState): number {
    const id = this.registry.idFor(RealRegistry.keyOf(state.identity, real.address));
    return this.engine.flows.activeByReal[id]! + this.engine.flows.inactiveByReal[id]!;
  }

  // -------------------------------------------------------------------------------------------

  private startFlow(event: FlowEvent, nowMs: number, order: number): void {
    const run: FlowRun = {
      event,
      order,
      tuple: prepareTuple(event.tuple),
      startMs: nowMs,
      endMs: nowMs + event.durationMs,
      k: 1,
      nextMs: 0,
      closing: false,
      packets: 0,
      lastOutcome: 0,
      lastReal: -1,
      seq: 1000,
    };
    const isTcp = event.tuple.protocol === 'tcp';
    const first = this.send(run, isTcp ? TCP_SYN : 0, nowMs);
    this.observe(run, first);
    this.flowRecord(run, nowMs, 'start', first, { service: event.service });
    if (first.realId >= 0) this.flowsStarted.set(first.realId, (this.flowsStarted.get(first.realId) ?? 0) + 1);
    if (isTcp) {
      // The handshake's closing ACK follows at once (a zero RTT): wlc counts a flow as active
      // only once it is established, as IPVS does.
      this.packetOf(run, TCP_ACK, nowMs);
    }
    this.advance(run);
    this.heapPush(run);
  }

  /** One packet of a running flow at nowMs: a data packet, or the closing one. */
  private step(run: FlowRun, nowMs: number): void {
    const isTcp = run.event.tuple.protocol === 'tcp';
    if (run.closing) {
      const last = this.send(run, isTcp ? TCP_FIN | TCP_ACK : 0, nowMs);
      this.observe(run, last);
      this.flowRecord(run, nowMs, 'end', last, { packets: run.packets });
      run.nextMs = -1;
      return;
    }
    this.packetOf(run, isTcp ? TCP_ACK | TCP_PSH : 0, nowMs);
    run.k++;
    this.advance(run);
  }

  /** A mid-flow packet: traced only when its outcome is news (see TraceRecord). */
  private packetOf(run: FlowRun, flags: number, nowMs: number): void {
    const out = this.send(run, flags, nowMs);
    const changed = out.code !== run.lastOutcome;
    this.observe(run, out);
    if (changed || (out.drop === null && out.reason !== 'flow-table')) this.flowRecord(run, nowMs, 'packet', out, {});
  }

  /** Remembers a packet's outcome; a flow forwarded to a second real counts as moved. */
  private observe(run: FlowRun, out: Outcome): void {
    run.lastOutcome = out.code;
    if (out.realId < 0) return;
    if (run.lastReal >= 0 && out.realId !== run.lastReal) this.moved.add(run.event.id);
    run.lastReal = out.realId;
  }

  private advance(run: FlowRun): void {
    const offsetMs = Math.round((run.k * 1000) / run.event.packetsPerSecond);
    if (offsetMs < run.event.durationMs) {
      run.nextMs = run.startMs + offsetMs;
    } else {
      run.closing = true;
      run.nextMs = run.endMs;
    }
  }

  private send(run: FlowRun, flags: number, nowMs: number): Outcome {
    const engine = this.engine;
    const flows = engine.flows;
    // Ask the table first, with the same key and bucket hash the engine uses; a lookup that finds the
    // entry expired removes it exactly as the engine's own lookup would a moment later.
    flowKeyOf(run.tuple, flows.key);
    const existingEntry = flows.lookup(flows.indexHash(), nowMs) >= 0;
    const b = this.batch;
    b.offsets[0] = FRAME_HEADROOM;
    b.lengths[0] = writeFrame(b.buf, FRAME_HEADROOM, run.tuple, flags, run.seq);
    b.flags[0] = 0;
    b.count = 1;
    run.seq = (run.seq + 1) >>> 0;
    run.packets++;
    this.packetsSent++;
    engine.lastPlacement = 0;
    engine.processBatch(b, nowMs);
    const verdict = b.verdicts[0]!;
    if (verdict === VERDICT_TX) {
      this.packetsForwarded++;
      const realId = simRealIdOfFrame(b.buf, b.txOffsets[0]!);
      if (realId < 0) throw new Error('simulate: a frame left for a MAC that is no simulated real');
      const active = flows.activeByReal[realId]!;
      // Counts rise only on the real a packet was placed on, so checking it alone finds every peak.
      if (active > (this.peakActive.get(realId) ?? 0)) this.peakActive.set(realId, active);
      return { realId, reason: PLACEMENT_REASONS[engine.lastPlacement] ?? null, existingEntry, drop: null, code: realId };
    }
    if (verdict === VERDICT_PASS) throw new Error(`simulate: flow ${run.event.id} matched no service`);
    return { realId: -1, reason: null, existingEntry, drop: dropReasonLabels[-verdict] ?? `reason_${-verdict}`, code: -1 + verdict };
  }

  private flowRecord(run: FlowRun, nowMs: number, event: 'start' | 'packet' | 'end', out: Outcome, extra: Record<string, string | number>): void {
    const record: Record<string, string | number | boolean | null> = { t: nowMs, flow: run.event.id, event };
    if (extra['service'] !== undefined) record['service'] = extra['service'];
    record['real'] = out.realId >= 0 ? this.realName.get(out.realId)!.address : null;
    record['reason'] = out.reason;
    record['existingEntry'] = out.existingEntry;
    if (out.drop !== null) record['drop'] = out.drop;
    if (extra['packets'] !== undefined) record['packets'] = extra['packets'];
    this.trace.push(record);
  }

  // A binary min-heap of running flows by (next packet time, scenario order).

  private before(a: FlowRun, b: FlowRun): boolean {
    return a.nextMs < b.nextMs || (a.nextMs === b.nextMs && a.order < b.order);
  }

  private heapPush(run: FlowRun): void {
    const h = this.heap;
    let i = h.length;
    h.push(run);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.before(run, h[parent]!)) break;
      h[i] = h[parent]!;
      i = parent;
    }
    h[i] = run;
  }

  private heapPop(): FlowRun {
    const h = this.heap;
    const top = h[0]!;
    const last = h.pop()!;
    if (h.length > 0) {
      let i = 0;
      for (;;) {
        const left = 2 * i + 1;
        if (left >= h.length) break;
        const right = left + 1;
        const child = right < h.length && this.before(h[right]!, h[left]!) ? right : left;
        if (!this.before(h[child]!, last)) break;
        h[i] = h[child]!;
        i = child;
      }
      h[i] = last;
    }
    return top;
  }

  // -------------------------------------------------------------------------------------------

  private summary(endMs: number): SimulationSummary {
    const c = this.counters;
    const droppedByReason: Record<string, number> = {};
    let dropped = 0;
    dropReasonLabels.forEach((label, reason) => {
      const n = c[Counter.dropBase + reason] ?? 0;
      if (label !== '' && n > 0) {
        droppedByReason[label] = n;
        dropped += n;
      }
    });
    const flowRecords = this.trace.filter((r) => r['event'] === 'start');
    const movedIds = this.moved;
    const services: ServiceSummary[] = this.states.map((s) => {
      const reals: RealSummary[] = s.reals.map((r) => {
        const id = this.registry.idFor(RealRegistry.keyOf(s.identity, r.address));
        return {
          address: r.address,
          flowsStarted: this.flowsStarted.get(id) ?? 0,
          peakActiveFlows: this.peakActive.get(id) ?? 0,
          packets: c[REAL_BASE + id * REAL_STRIDE + RealCounter.forwardedPackets] ?? 0,
        };
      });
      const peaks = reals.map((r) => r.peakActiveFlows);
      const serviceFlows = flowRecords.filter((r) => r['service'] === s.config.name);
      return {
        name: s.config.name,
        scheduler: s.config.scheduler,
        flows: serviceFlows.length,
        movedFlows: serviceFlows.filter((r) => movedIds.has(r['flow'] as string)).length,
        peakActiveFlows: { max: peaks.length > 0 ? Math.max(...peaks) : 0, min: peaks.length > 0 ? Math.min(...peaks) : 0 },
        reals,
      };
    });
    return {
      endMs,
      flows: flowRecords.length,
      movedFlows: movedIds.size,
      packets: { sent: this.packetsSent, forwarded: this.packetsForwarded, dropped },
      droppedByReason,
      services,
    };
  }
}

/**
 * The trace as JSON text: `{"trace": [...], "summary": {...}}` with one trace record per line, so
 * the output reads (and diffs) line by line and still parses as one document.
 */
export function formatSimulation(result: SimulationResult): string {
  const records = result.trace.map((r) => `    ${JSON.stringify(r)}`).join(',\n');
  const trace = records.length === 0 ? '[]' : `[\n${records}\n  ]`;
  const summary = JSON.stringify(result.summary, null, 2).replace(/\n/g, '\n  ');
  return `{\n  "trace": ${trace},\n  "summary": ${summary}\n}\n`;
}

/**
 * `dsrlb simulate SCENARIO`: exit 0 with the trace on stdout, or exit 1 with one `path: message`
 * line per problem of the scenario (its config included) on stderr.
 */
export function runSimulateCommand(args: { readonly scenario: string }): CommandOutput {
  const loaded = loadScenarioFile(args.scenario);
  if (!loaded.ok) return { exitCode: 1, stdout: '', stderr: `${formatProblems(loaded.problems)}\n` };
  return { exitCode: 0, stdout: formatSimulation(simulate(loaded.scenario)), stderr: '' };
}

