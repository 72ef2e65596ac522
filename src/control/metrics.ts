// Prometheus metrics: prom-client objects whose collect() reads the packet loop's typed-array
// counters at scrape time, and the families with a series per real (real-metrics.ts, written
// without prom-client: at thousands of reals its formatting held the main thread for a second).
// Nothing here runs on a timer and nothing touches the packet path. Labels are service and real
// (bounded by the config), never client addresses.

import client from 'prom-client';
import { Counter as Slot } from '../dataplane/counters.js';
import { DropReason, dropReasonLabels } from '../dataplane/drop-reasons.js';
import { RealMetrics } from './real-metrics.js';

/** The event-loop delay histogram's sampling interval (collectDefaultMetrics' eventLoopMonitoringPrecision). */
const EVENT_LOOP_RESOLUTION_MS = 200;

/** What the metrics need to know about each configured real, read at scrape time. */
export interface MetricsRealView {
  readonly service: string;
  readonly real: string;
  readonly id: number;
  readonly weight: number;
  readonly intent: 'active' | 'drain' | 'disabled';
  readonly up: boolean;
  /** Takes no new flows (drain, weight 0, removed) and has no established flow left. */
  readonly drainFinished: boolean;
}

export interface MetricsSource {
  counters(): Float64Array;
  /** A per-real counter (RealCounter offset) of a real id, read from `counters()`. */
  realCount(counters: Float64Array, id: number, which: number): number;
  reals(): readonly MetricsRealView[];
  activeFlows(id: number): number;
  inactiveFlows(id: number): number;
  flowTableCapacity(): number;
  panic(): readonly { service: string; panic: boolean; onBackups: boolean }[];
  /** announced: null while announce.enabled is false (the gauge then has no series). */
  /** fingerprint: null (no series) for a removed service that drains. */
  services(): readonly { service: string; fingerprint: string | null; announced: boolean | null }[];
}

export class DaemonMetrics {
  readonly registry = new client.Registry();
  readonly reloads: client.Counter<'result'>;
  readonly dropTableRestored: client.Counter;
  readonly lastReloadSuccess: client.Gauge;
  private readonly lastReloadSuccessful: client.Gauge;
  readonly tableMovedSlots: client.Counter<'service'>;
  /** Connections an HTTP listener closed at accept, at its limit (http-servers.ts). */
  readonly httpRefused: client.Counter<'listener'>;
  /** The families with a series per (service, real), written without prom-client (see real-metrics.ts). */
  private readonly reals: RealMetrics;

  constructor(src: MetricsSource) {
    const registry = this.registry;
    this.reals = new RealMetrics(src);
    // The event-loop delay histogram samples on a libuv timer (10 ms by default): 100 wake-ups a
    // second were most of an idle daemon's CPU. A 200 ms resolution still shows stalls.
    client.collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_RESOLUTION_MS });
    // prom-client names these gauges *_total, which Prometheus conventions (and promtool) reserve
    // for counters; the process_* and other nodejs_* defaults stay.
    for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(name);
    // Node's delay histogram records each whole timer interval, the resolution included: an idle
    // daemon read 0.200 s in every one of these, and a stall showed as 0.2 s more than it was.
    // The same names, less the interval (stddev is not shifted by it).
    for (const stat of ['min', 'max', 'mean', 'p50', 'p90', 'p99']) {
      const name = `nodejs_eventloop_lag_${stat}_seconds`;
      const original = registry.getSingleMetric(name) as client.Gauge | undefined;
      if (original === undefined) continue;
      registry.removeSingleMetric(name);
      new client.Gauge({
        name,
        help: `${(original as unknown as { help: string }).help.replace(/\.$/, '')}, less the ${EVENT_LOOP_RESOLUTION_MS} ms sampling interval.`,
        registers: [registry],
        // Runs after nodejs_eventloop_lag_seconds's collect, which sets the original from the histogram.
        async collect() {
          const recorded = (await original.get()).values[0]?.value ?? 0;
          this.set(Math.max(0, recorded - EVENT_LOOP_RESOLUTION_MS / 1000));
        },
      });
    }
    const global = (name: string, help: string, slot: number): void => {
      new client.Counter({
        name,
        help,
        registers: [registry],
        collect() {
          this.reset();
          this.inc(src.counters()[slot]!);
        },
      });
    };
    global('dsrlb_rx_packets_total', 'Frames received by the packet loop.', Slot.rxPackets);
    global('dsrlb_rx_bytes_total', 'Bytes received by the packet loop.', Slot.rxBytes);
    global('dsrlb_passed_packets_total', 'Frames not for a service, left to the kernel.', Slot.passedPackets);
    global('dsrlb_tx_packets_total', 'Frames the packet loop handed to the kernel to send (those it refused are dsrlb_dropped_packets_total{reason="tx_failed"} too).', Slot.txPackets);
    global('dsrlb_tx_bytes_total', 'Bytes sent by the packet loop.', Slot.txBytes);
    global('dsrlb_flows_rescheduled_total', 'Existing flows moved because their real could no longer keep them.', Slot.flowsRescheduled);
    global('dsrlb_flow_table_evictions_total', 'Flow entries evicted because the table was full.', Slot.flowTableEvictions);
    global('dsrlb_icmp_too_big_sent_total', 'ICMP fragmentation-needed / ICMPv6 packet-too-big messages sent to clients (IPIP).', Slot.icmpTooBigSent);
    global('dsrlb_icmp_echo_replied_total', 'ICMP echo requests to a VIP answered by the packet loop.', Slot.icmpEchoReplied);
    global('dsrlb_rx_kernel_drops_total', 'Frames the kernel dropped before the packet loop read them (receive ring full).', Slot.rxKernelDrops);
    global('dsrlb_rx_other_host_total', 'Frames for another host\'s MAC (promiscuous interface, flooding switch), ignored.', Slot.rxOtherHost);
    global('dsrlb_gso_segmented_total', 'GSO super-frames segmented in software for IPIP reals.', Slot.gsoSegmented);
    global('dsrlb_loop_busy_seconds_total', 'Time the packet loops spent on wake-ups (ring, engine, send), summed over loops: its rate is the cores they keep busy (io: afpacket).', Slot.loopBusySeconds);
    global('dsrlb_loop_engine_seconds_total', 'Of the packet loops\' busy time, the time in the engine (parse, lookup, pick, rewrite), summed over loops.', Slot.loopEngineSeconds);
    global('dsrlb_loop_restarts_total', 'Packet loops started again after they ended by themselves (a crash, or their interface deleted and made again), each holding the flows of the loop it replaced.', Slot.loopRestarts);

    new client.Counter({
      name: 'dsrlb_dropped_packets_total',
      help: 'Frames dropped by the packet loop, by reason.',
      labelNames: ['reason'],
      registers: [registry],
      collect() {
        this.reset();
        const c = src.counters();
        for (const slot of Object.values(DropReason)) this.inc({ reason: dropReasonLabels[slot]! }, c[Slot.dropBase + slot]!);
      },
    });
    new client.Gauge({
      name: 'dsrlb_flow_table_entries',
      help: 'Live entries in the flow table.',
      registers: [registry],
      collect() {
        this.set(src.counters()[Slot.flowTableEntries]!);
      },
    });
    new client.Gauge({
      name: 'dsrlb_flow_table_capacity',
      help: 'Capacity of the flow tables of all packet loops together (flowTable.capacity, shared out over the loops).',
      registers: [registry],
      collect() {
        this.set(src.flowTableCapacity());
      },
    });
    this.reloads = new client.Counter({
      name: 'dsrlb_config_reloads_total',
      help: 'Configuration reloads, by result.',
      labelNames: ['result'],
      registers: [registry],
    });
    this.reloads.inc({ result: 'success' }, 0);
    this.reloads.inc({ result: 'failure' }, 0);
    this.dropTableRestored = new client.Counter({
      name: 'dsrlb_drop_table_restored_total',
      help: 'Times the nftables table inet dsrlb was found gone (removed from outside: an nftables or firewalld reload flushing the ruleset) and put back.',
      registers: [registry],
    });
    this.httpRefused = new client.Counter({
      name: 'dsrlb_http_connections_refused_total',
      help: 'Connections the metrics or admin listener closed as it accepted them, at its connection limit or at the limit of one peer address.',
      labelNames: ['listener'],
      registers: [registry],
    });
    this.httpRefused.inc({ listener: 'metrics' }, 0);
    this.httpRefused.inc({ listener: 'admin' }, 0);
    this.lastReloadSuccess = new client.Gauge({
      name: 'dsrlb_config_last_reload_success_timestamp_seconds',
      help: 'When the configuration in force was loaded.',
      registers: [registry],
    });
    // As prometheus_config_last_reload_successful: an alert on it clears with the next good reload.
    this.lastReloadSuccessful = new client.Gauge({
      name: 'dsrlb_config_last_reload_successful',
      help: '1 when the last configuration reload (or the start) was taken, 0 when it was refused.',
      registers: [registry],
    });
    this.lastReloadSuccessful.set(1);
    new client.Gauge({
      name: 'dsrlb_service_panic',
      help: '1 while no wanted real (active, weight > 0) is up and whenAllDown: failOpen sends new flows to all wanted reals; no series for a removed service that drains.',
      labelNames: ['service'],
      registers: [registry],
      collect() {
        this.reset();
        for (const p of src.panic()) this.set({ service: p.service }, p.panic ? 1 : 0);
      },
    });
    new client.Gauge({
      name: 'dsrlb_service_on_backups',
      help: '1 while no real but the backup reals (backup: true) can take new flows, so the backups take them; no series for a removed service that drains.',
      labelNames: ['service'],
      registers: [registry],
      collect() {
        this.reset();
        for (const p of src.panic()) this.set({ service: p.service }, p.onBackups ? 1 : 0);
      },
    });
    new client.Gauge({
      name: 'dsrlb_table_fingerprint',
      help: 'Always 1; the fingerprint label names the service forwarding table: LBs that agree show the same value.',
      labelNames: ['service', 'fingerprint'],
      registers: [registry],
      collect() {
        this.reset();
        for (const s of src.services()) if (s.fingerprint !== null) this.set({ service: s.service, fingerprint: s.fingerprint }, 1);
      },
    });
    new client.Gauge({
      name: 'dsrlb_vip_announced',
      help: '1 while the service VIP is announced to BIRD, else 0; no series where no announcement is meant (announce.enabled false, the service announce: false).',
      labelNames: ['service'],
      registers: [registry],
      collect() {
        this.reset();
        for (const s of src.services()) if (s.announced !== null) this.set({ service: s.service }, s.announced ? 1 : 0);
      },
    });
    this.tableMovedSlots = new client.Counter({
      name: 'dsrlb_table_moved_slots_total',
      help: 'Consistent-hash table slots that changed real on rebuilds.',
      labelNames: ['service'],
      registers: [registry],
    });
  }

  /** The Content-Type of text(). */
  get contentType(): string {
    return this.registry.contentType;
  }

  /** A scrape: prom-client's families, then the per-real ones (Prometheus text format). */
  async text(): Promise<string> {
    return `${await this.registry.metrics()}\n${this.reals.text()}\n`;
  }

  /** One finished health probe (event-driven: probes are control-plane work, not the packet loop). */
  observeProbe(service: string, real: string, seconds: number, failureReason: string | null): void {
    this.reals.observeProbe(service, real, seconds, failureReason);
  }

  /** A reload taken: counted, timestamped, and the last one marked successful (the start sets the timestamp only; the gauge starts at 1). */
  reloadTaken(): void {
    this.reloads.inc({ result: 'success' });
    this.lastReloadSuccess.set(Date.now() / 1000);
    this.lastReloadSuccessful.set(1);
  }

  /** A reload refused: counted, and the last one marked failed (the config in force stays). */
  reloadRefused(): void {
    this.reloads.inc({ result: 'failure' });
    this.lastReloadSuccessful.set(0);
  }

  /**
   * Drops the event-driven series of a real under a service name (a forgotten real, or the old name
   * of a renamed service); the scrape-time series follow the daemon's view by themselves.
   */
  forgetReal(service: string, real: string): void {
    this.reals.forgetReal(service, real);
  }

  /** Drops the event-driven series of a service name no longer in use (removed, or renamed). */
  forgetService(service: string): void {
    this.tableMovedSlots.remove({ service });
  }
}
