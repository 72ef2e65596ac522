// What every probe kind shares: the target, the outcome with a short failure reason (a metric
// label), the Prober interface, the injectable clock, and runProbe, the one place a probe's
// timeout is enforced.

import type { HealthCheckConfig } from '../config/types.js';

/** Why a probe failed; a small fixed set so it can label `dsrlb_healthcheck_failures_total`. */
export const PROBE_REASONS = ['timeout', 'refused', 'reset', 'status', 'body', 'exit', 'unreachable', 'error'] as const;
export type ProbeReason = (typeof PROBE_REASONS)[number];

/** One real as a probe sees it. `port` is the check's port (0 for icmp/exec on a port-0 service). */
export interface ProbeTarget {
  readonly address: string;
  readonly port: number;
  readonly vip: string;
  readonly service: string;
  readonly check: HealthCheckConfig;
}

/** What a prober reports. `detail` is a short human text for `lastError`. */
export type ProbeOutcome =
  | { readonly ok: true }
  | {
      readonly ok: false;
      readonly reason: ProbeReason;
      readonly detail: string;
      /**
       * The probe could not leave this host (no route, the LB's own link down or its address
       * gone): it says nothing about the real, whose health stays as it was (health-monitor.ts).
       */
      readonly local?: boolean;
    };

/** An outcome with its timing, as the monitor records and hands to observers. */
export type ProbeResult = ProbeOutcome & { readonly startedAtMs: number; readonly durationMs: number };

/**
 * How runProbe tells a prober to give up: at the timeout, or when the monitor drops the probe. Not
 * an AbortSignal: an AbortController, its signal and one listener took about 10 us a probe, and an
 * abort 25 us more (it builds a DOMException with a stack, and node:http another error on top),
 * where a whole tcp probe takes about 100 us of the main thread.
 */
export interface ProbeSignal {
  readonly aborted: boolean;
  /** Runs `fn` once at the abort (at once if it came already). */
  onAbort(fn: () => void): void;
}

/**
 * One probe kind. `probe` never rejects; it stops and releases its socket or process when `signal`
 * aborts (the outcome is then ignored: runProbe has already reported a timeout).
 */
export interface Prober {
  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome>;
}

export type TimerHandle = unknown;

/** Time as the health code sees it; tests inject a manual one. */
export interface Clock {
  /** Wall-clock milliseconds (Date.now() by default): what `since` is measured in. */
  now(): number;
  setTimeout(fn: () => void, delayMs: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
  /** Monotonic, sub-millisecond time for probe durations; falls back to now(). */
  monotonicMs?(): number;
}

export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, delayMs) => setTimeout(fn, delayMs),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
  monotonicMs: () => performance.now(),
};

export const OK: ProbeOutcome = Object.freeze({ ok: true });

export function fail(reason: ProbeReason, detail: string): ProbeOutcome {
  return { ok: false, reason, detail };
}

/** The outcome of a probe that was aborted by its timeout. */
export function timedOut(): ProbeOutcome {
  return fail('timeout', 'aborted at the timeout');
}

/** Maps a socket error (errno code) to a reason; the text keeps the code for the operator. */
export function failFromError(err: unknown): ProbeOutcome {
  const e = err as { code?: unknown; name?: unknown; message?: unknown } | null;
  const code = e && typeof e.code === 'string' ? e.code : '';
  const message = e && typeof e.message === 'string' ? e.message : String(err);
  if (e && (e.name === 'AbortError' || code === 'ABORT_ERR')) return timedOut();
  switch (code) {
    case 'ECONNREFUSED':
      return fail('refused', `connection refused (${code})`);
    case 'ECONNRESET':
    case 'EPIPE':
    case 'ECONNABORTED':
      return fail('reset', `connection reset (${code})`);
    case 'EHOSTUNREACH':
    case 'EHOSTDOWN':
      // The real did not answer ARP / neighbour discovery: about the real.
      return fail('unreachable', `${code}`);
    case 'ENETUNREACH':
    case 'ENETDOWN':
    case 'EADDRNOTAVAIL':
      // No route, this host's link down, its source address gone (an IPv6 one tentative again
      // after a flap): about this host. A flap of the LB's link took every real down with these,
      // and the way back out of that reset the connections of the reals still marked down.
      return { ok: false, reason: 'unreachable', detail: `${code} (on this host: the real's health is left as it was)`, local: true };
    case 'ETIMEDOUT':
      return fail('timeout', `${code}`);
    default:
      return fail('error', oneLine(message));
  }
}

/** Keeps lastError one short line. */
export function oneLine(text: string, maxChars = 200): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > maxChars ? `${flat.slice(0, maxChars - 3)}...` : flat;
}

export interface RunningProbe {
  /** Settles at the prober's answer or at the timeout, whichever comes first; never rejects. */
  readonly result: Promise<ProbeResult>;
  /** Settles when the prober itself has returned (after it released its resources). */
  readonly finished: Promise<void>;
  /** Aborts the probe; `result` then reports a timeout unless it already settled. */
  cancel(): void;
}

/**
 * Starts one probe, whose signal aborts at `timeoutMs`. A prober that has not answered by then
 * counts as a 'timeout' failure at that moment, whether or not it honours the signal, so a
 * recorded duration never exceeds the timeout by more than timer lateness.
 */
export function runProbe(prober: Prober, target: ProbeTarget, timeoutMs: number, clock: Clock = realClock): RunningProbe {
  return new ProbeRun(prober, target, timeoutMs, clock);
}

/** A timer this late means the main thread was busy, not the usual millisecond of timer lateness. */
const LATE_TIMER_MS = 20;

/** One probe in flight: its timeout, its result and the signal its prober is given, in one object. */
class ProbeRun implements RunningProbe, ProbeSignal {
  readonly result: Promise<ProbeResult>;
  readonly finished: Promise<void>;
  aborted = false;
  private settled = false;
  /** The timeout came late once and the answer was given a loop turn. */
  private lateChecked = false;
  private settle!: (result: ProbeResult) => void;
  private abortListener: (() => void) | null = null;
  private readonly startedAtMs: number;
  private readonly startMono: number;
  private readonly timer: TimerHandle;

  constructor(
    prober: Prober,
    target: ProbeTarget,
    private readonly timeoutMs: number,
    private readonly clock: Clock,
  ) {
    this.startedAtMs = clock.now();
    this.startMono = this.mono();
    this.result = new Promise<ProbeResult>((resolve) => (this.settle = resolve));
    this.timer = clock.setTimeout(() => this.timeUp(), timeoutMs);
    let answer: Promise<ProbeOutcome>;
    try {
      answer = prober.probe(target, this);
    } catch (err) {
      answer = Promise.resolve(failFromError(err));
    }
    this.finished = answer.then(
      (outcome) => this.answered(outcome),
      (err: unknown) => this.answered(failFromError(err)),
    );
  }

  onAbort(fn: () => void): void {
    if (this.aborted) return fn();
    const before = this.abortListener;
    this.abortListener = before === null ? fn : () => (before(), fn());
  }

  cancel(): void {
    this.finish(timedOut());
    this.abort();
  }

  private timeUp(): void {
    // A timer that fires late means the main thread was busy (a large reload or scrape, a GC): an
    // answer that came in time may be waiting unread, and timers run before I/O in a loop turn.
    // One turn (setImmediate runs after the I/O poll) lets it be read first: a 200 ms stall made
    // half of 50 ms probes to a listening port time out.
    if (!this.lateChecked && this.mono() - this.startMono >= this.timeoutMs + LATE_TIMER_MS) {
      this.lateChecked = true;
      // A 0 ms timer runs after this turn's I/O poll; on the injected clock (tests' manual ones too).
      this.clock.setTimeout(() => {
        if (!this.settled) this.timeUp();
      }, 0);
      return;
    }
    this.finish(fail('timeout', `no answer within ${this.timeoutMs} ms`));
    this.abort();
  }

  /** The prober is done (it has let go of its socket or process): nothing is left to abort. */
  private answered(outcome: ProbeOutcome): void {
    this.abortListener = null;
    this.finish(outcome);
  }

  private abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    const fn = this.abortListener;
    this.abortListener = null;
    fn?.();
  }

  private finish(outcome: ProbeOutcome): void {
    if (this.settled) return;
    this.settled = true;
    this.clock.clearTimeout(this.timer);
    this.settle({ ...outcome, startedAtMs: this.startedAtMs, durationMs: this.mono() - this.startMono });
  }

  private mono(): number {
    return this.clock.monotonicMs ? this.clock.monotonicMs() : this.clock.now();
  }
}
