// The health monitor: schedules probes for every real concurrently (each on its own timer, at a
// random offset so they do not march in step), enforces timeouts, feeds results through rise/fall
// damping and emits 'change' when a real goes up or down. Control plane only.

import { EventEmitter } from 'node:events';
import type { HealthCheckConfig, HealthCheckType } from '../config/types.js';
import type { Logger } from '../control/logger.js';
import { HEALTH_TIMING_KEYS, sameCheckValue } from './check-timing.js';
import { HealthDamper } from './damper.js';
import { ExecProber } from './exec-probe.js';
import { HttpProber } from './http-probe.js';
import { IcmpProber } from './icmp-probe.js';
import { realClock, runProbe, type Clock, type ProbeResult, type ProbeTarget, type Prober, type RunningProbe, type TimerHandle } from './probe.js';
import { TcpProber } from './tcp-probe.js';
import { UdpProber } from './udp-probe.js';

export type { Clock, ProbeResult, ProbeTarget, Prober } from './probe.js';

/** One real of one service to watch; `key` is the caller's stable name for it. */
export interface HealthTarget {
  readonly key: string;
  readonly service: string;
  readonly address: string;
  readonly vip: string;
  readonly check: HealthCheckConfig;
}

/** The damped fact about one real, as status and metrics show it. */
export interface HealthFactRecord {
  readonly state: 'up' | 'down';
  /** When `state` last changed or the target was (re)started, in clock.now() milliseconds. */
  readonly since: number;
  readonly lastError: string | null;
  /** Consecutive successes and failures. */
  readonly successes: number;
  readonly failures: number;
  readonly lastDurationMs: number | null;
  /** A probe is in flight now. */
  readonly probing: boolean;
  /** The probes have decided since the (re)start: up proven, or down confirmed (see HealthDamper). */
  readonly settled: boolean;
}

/** Called after every probe (metrics: duration histogram, failures by reason); must not throw. */
export interface ProbeObserver {
  (key: string, result: ProbeResult): void;
}

export interface HealthMonitorOptions {
  readonly clock?: Clock;
  /** Uniform in [0, 1): places each target's first probe in [0, interval). */
  readonly random?: () => number;
  /** Replaces the built-in prober of a kind (tests use fakes). Type none never probes. */
  readonly probers?: Partial<Record<HealthCheckType, Prober>>;
  readonly observer?: ProbeObserver;
  /** Where the built-in probers say what they say once (the exec checks' capabilities). */
  readonly log?: Logger;
}

export interface HealthMonitor {
  on(event: 'change', listener: (key: string, fact: HealthFactRecord) => void): this;
  once(event: 'change', listener: (key: string, fact: HealthFactRecord) => void): this;
  off(event: 'change', listener: (key: string, fact: HealthFactRecord) => void): this;
  emit(event: 'change', key: string, fact: HealthFactRecord): boolean;
}

interface Watch {
  target: HealthTarget;
  /** What the prober is given; its service name follows a rename (exec probes see it). */
  probeTarget: ProbeTarget;
  readonly damper: HealthDamper;
  /** null for type none: never probed, always up. */
  readonly prober: Prober | null;
  timer: TimerHandle | null;
  running: RunningProbe | null;
  /** A slot came while the probe ran (timeout near the interval): the next probe starts when it ends. */
  slotMissed: boolean;
  nextStartMs: number;
  /** When the timer fires (the first probe's time, before it ran). */
  timerAtMs: number;
  lastDurationMs: number | null;
  stopped: boolean;
  /** Its first probe has started (until then nextStartMs is the slot before the first). */
  probed: boolean;
  /** Its last probe could not leave this host (ProbeOutcome.local). */
  localFailing?: boolean;
}

/**
 * The next slot of a probed watch whose interval becomes `newIntervalMs`: its last planned slot
 * plus the new interval (re-randomised, two probes could be nearly two intervals apart and a
 * failure seen an interval late). `oldIntervalMs`: the interval its slots were planned with.
 */
function slotAfterIntervalChange(watch: Watch, newIntervalMs: number, oldIntervalMs = watch.target.check.intervalMs): number {
  return watch.nextStartMs - oldIntervalMs + newIntervalMs;
}

/** Every real's first probe comes within this long of its start (or the interval, if shorter). */
export const FIRST_PROBE_SPREAD_MS = 1000;

export class HealthMonitor extends EventEmitter {
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly probers: Partial<Record<HealthCheckType, Prober>>;
  private readonly observer: ProbeObserver | null;
  private readonly watches = new Map<string, Watch>();
  private readonly log: Logger | null;

  constructor(opts: HealthMonitorOptions = {}) {
    super();
    this.log = opts.log ?? null;
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.observer = opts.observer ?? null;
    this.probers = {
      tcp: new TcpProber(),
      http: new HttpProber('http'),
      https: new HttpProber('https'),
      udp: new UdpProber(),
      exec: new ExecProber('/bin/sh', { log: opts.log }),
      icmp: new IcmpProber(),
      ...opts.probers,
    };
  }

  /**
   * Makes the watched set equal to `targets`. A key whose real and probe are unchanged keeps its
   * state, also when only its service's name changed (a rename probes the same real the same way;
   * later probes carry the new name); one whose only changes are interval, timeout, rise or fall
   * keeps its state and its place in time; any other change starts the new probe from what the
   * old one decided (an up real stays up until the new probe fails `fall` times: a reload of every
   * LB at once must not make every real unknown, which withdrew the VIPs or sent fail-open services
   * into panic), at the old probe's next slot. A check switched on where there was none keeps the
   * reals up until their first probe, within FIRST_PROBE_SPREAD_MS, which decides.
   */
  setTargets(targets: readonly HealthTarget[]): void {
    const wanted = new Map<string, HealthTarget>();
    const flipped: Watch[] = [];
    for (const t of targets) {
      if (wanted.has(t.key)) throw new Error(`health target key ${JSON.stringify(t.key)} appears twice`);
      wanted.set(t.key, t);
    }
    for (const [key, watch] of this.watches) {
      if (!wanted.has(key)) {
        this.stopWatch(watch);
        this.watches.delete(key);
      }
    }
    for (const [key, target] of wanted) {
      const old = this.watches.get(key);
      if (old && sameProbe(old.target, target)) {
        if (!sameTiming(old.target.check, target.check)) this.retime(old, target);
        old.target = target;
        if (old.probeTarget.service !== target.service) old.probeTarget = { ...old.probeTarget, service: target.service };
        continue;
      }
      if (old) this.stopWatch(old);
      const watch = this.startWatch(target, old);
      this.watches.set(key, watch);
      // A check switched off: a real seen down (or not yet seen) is up now, said as a probe's change is.
      if (old && old.damper.state !== watch.damper.state) flipped.push(watch);
    }
    for (const watch of flipped) this.tell(watch);
  }

  fact(key: string): HealthFactRecord | undefined {
    const watch = this.watches.get(key);
    return watch ? record(watch) : undefined;
  }

  /** Stops every timer and aborts probes in flight; results that arrive later are ignored. */
  stop(): void {
    for (const watch of this.watches.values()) this.stopWatch(watch);
    this.watches.clear();
  }

  /** A new watch; `previous` is the same real's watch with another probe (a reload changed it). */
  private startWatch(target: HealthTarget, previous?: Watch): Watch {
    const { check } = target;
    const now = this.clock.now();
    const startMs = this.mono();
    const prober = check.type === 'none' ? null : (this.probers[check.type] ?? null);
    if (check.type !== 'none' && prober === null) throw new Error(`no prober for health-check type ${check.type}`);
    const carried = prober !== null && previous !== undefined && previous.prober !== null;
    let damper: HealthDamper;
    if (carried) damper = HealthDamper.continuing(check, previous.damper);
    else if (prober !== null && previous !== undefined) damper = HealthDamper.firstProbeAfterNone(check, previous.damper);
    else damper = new HealthDamper(check, now, prober === null ? 'up' : 'down');
    const watch: Watch = {
      target,
      probeTarget: { address: target.address, port: check.port, vip: target.vip, service: target.service, check },
      damper,
      prober,
      timer: null,
      running: null,
      slotMissed: false,
      nextStartMs: startMs,
      timerAtMs: startMs,
      lastDurationMs: null,
      stopped: false,
      // A probe carried over from the old one is scheduled on its slots, not a first probe's.
      probed: carried,
    };
    if (prober === null) return watch;
    if (carried) {
      // On the old probe's slots; when the interval changed too, as for a change of timing alone
      // (at the old one's next slot, a shorter interval waited up to a whole old interval).
      const next = previous.probed ? slotAfterIntervalChange(previous, check.intervalMs) : previous.nextStartMs;
      this.schedule(watch, Math.max(startMs, next));
      return watch;
    }
    // Spread over the interval so that probes do not march in step, but the first within
    // FIRST_PROBE_SPREAD_MS: until it a real is unknown (no new flows, or in a fail-open panic new
    // flows whether dead or alive), and keepalived users run intervals of 60 s. The slot before the
    // first is set so that the probes after it keep the spread over the whole interval.
    const r = Math.min(Math.max(this.random(), 0), 0.999999);
    const phaseMs = startMs + Math.floor(r * check.intervalMs);
    this.schedule(watch, startMs + Math.floor(r * Math.min(check.intervalMs, FIRST_PROBE_SPREAD_MS)), phaseMs - check.intervalMs);
    return watch;
  }

  /** New interval, timeout, rise or fall: the counts go on, and the next probe keeps its place in time. */
  private retime(watch: Watch, target: HealthTarget): void {
    watch.damper.retune(target.check);
    const oldIntervalMs = watch.target.check.intervalMs;
    watch.target = target;
    if (watch.prober === null || target.check.intervalMs === oldIntervalMs) return;
    if (!watch.probed) {
      // The first probe is still to come, within its second: it stays; the probes after it keep
      // their place in the interval (the slot before the first is phase - interval), taken
      // modulo the new interval so that the second probe comes within one new interval of the
      // first (a 60 s interval cut to 2 s had waited for the old phase, up to 60 s).
      const newIntervalMs = target.check.intervalMs;
      let slot = watch.nextStartMs + oldIntervalMs - newIntervalMs;
      if (slot > watch.timerAtMs) slot -= Math.ceil((slot - watch.timerAtMs) / newIntervalMs) * newIntervalMs;
      watch.nextStartMs = slot;
      return;
    }
    if (watch.timer !== null) this.clock.clearTimeout(watch.timer);
    watch.timer = null;
    this.schedule(watch, Math.max(this.mono(), slotAfterIntervalChange(watch, target.check.intervalMs, oldIntervalMs)));
  }

  /**
   * The clock probes are scheduled on: monotonic, so a step of the system time (NTP, date -s)
   * neither stops the probes for the size of a backward step nor fires a burst; damper times
   * (`since`) stay on the wall clock, as status shows them.
   */
  private mono(): number {
    return this.clock.monotonicMs ? this.clock.monotonicMs() : this.clock.now();
  }

  /** The next probe at `atMs`, counted as the slot `slotMs` (the next slots follow it by the interval). */
  private schedule(watch: Watch, atMs: number, slotMs = atMs): void {
    watch.nextStartMs = slotMs;
    watch.timerAtMs = atMs;
    watch.timer = this.clock.setTimeout(() => this.tick(watch), Math.max(0, atMs - this.mono()));
  }

  private tick(watch: Watch): void {
    watch.timer = null;
    if (watch.stopped) return;
    // A probe never overlaps itself: if the last one is still running, this slot's probe starts
    // as it ends (skipped, a timeout equal to the interval halved the probe rate: a dead real
    // took twice `fall` intervals to go down).
    if (watch.running === null) this.startProbe(watch);
    else watch.slotMissed = true;
    // Fixed rate from the planned start, so the spread of first probes is kept; slots missed
    // while the event loop was busy are skipped rather than fired in a burst.
    const intervalMs = watch.target.check.intervalMs;
    const now = this.mono();
    let next = watch.nextStartMs + intervalMs;
    if (next <= now) next += Math.ceil((now - next + 1) / intervalMs) * intervalMs;
    this.schedule(watch, next);
  }

  private startProbe(watch: Watch): void {
    watch.probed = true;
    const running = runProbe(watch.prober!, watch.probeTarget, watch.target.check.timeoutMs, this.clock);
    watch.running = running;
    void running.result.then((result) => {
      if (!watch.stopped) this.onResult(watch, result);
    });
    void running.finished.then(() => {
      if (watch.running !== running) return;
      watch.running = null;
      if (watch.slotMissed && !watch.stopped) {
        watch.slotMissed = false;
        this.startProbe(watch);
      }
    });
  }

  private onResult(watch: Watch, result: ProbeResult): void {
    watch.lastDurationMs = result.durationMs;
    const error = result.ok ? null : `${result.reason}: ${result.detail}`;
    // A probe that could not leave this host counts neither way (rise nor fall): logged once an episode.
    const local = !result.ok && result.local === true;
    if (local && !watch.localFailing) this.log?.warn('health probe cannot leave this host: the real\'s health is left as it was', { real: watch.target.key, error });
    watch.localFailing = local;
    const flipped = local ? false : watch.damper.record(result.ok, this.clock.now(), error);
    if (this.observer) {
      try {
        this.observer(watch.target.key, result);
      } catch {
        // Metrics must not stop health checking.
      }
    }
    if (flipped) this.tell(watch);
  }

  /**
   * 'change' for a watch whose state flipped. A listener that throws is logged, not thrown on:
   * from a probe's answer it would be an unhandled rejection, which ends the process.
   */
  private tell(watch: Watch): void {
    try {
      this.emit('change', watch.target.key, record(watch));
    } catch (err) {
      this.log?.error('a health change listener failed', { real: watch.target.key, error: (err as Error).message });
    }
  }

  private stopWatch(watch: Watch): void {
    watch.stopped = true;
    if (watch.timer !== null) this.clock.clearTimeout(watch.timer);
    watch.timer = null;
    watch.running?.cancel();
  }
}

function record(watch: Watch): HealthFactRecord {
  const d = watch.damper;
  return {
    state: d.state,
    since: d.since,
    lastError: d.lastError,
    successes: d.successes,
    failures: d.failures,
    lastDurationMs: watch.lastDurationMs,
    probing: watch.running !== null,
    settled: d.settled,
  };
}

/** Same real behind the same VIP and the same probe (everything but the timing); the service's name is no part of it. */
function sameProbe(a: HealthTarget, b: HealthTarget): boolean {
  if (a.address !== b.address || a.vip !== b.vip) return false;
  for (const key of Object.keys(a.check) as (keyof HealthCheckConfig)[]) {
    if (!HEALTH_TIMING_KEYS.has(key) && !sameCheckValue(a.check[key], b.check[key])) return false;
  }
  return Object.keys(a.check).length === Object.keys(b.check).length;
}

function sameTiming(a: HealthCheckConfig, b: HealthCheckConfig): boolean {
  for (const key of HEALTH_TIMING_KEYS) if (a[key] !== b[key]) return false;
  return true;
}
