// The metric families with a series per (service, real), written as Prometheus text here rather
// than through prom-client objects. With 8,000 reals they are 216,000 lines; prom-client, which
// hashes every series' labels when it is set and formats each line from label objects, took the
// main thread 0.7-1.0 s per scrape for them (probes late, the admin API stalled), most of it its
// formatting and the garbage it made. Here each real's label text is made once per scrape and the
// lines are joined: the same text, line for line (test/unit/real-metrics.test.ts checks it against
// prom-client's). The daemon's other families stay prom-client objects (metrics.ts).

import { RealCounter } from '../dataplane/counters.js';
import { PROBE_REASONS } from '../health/probe.js';
import type { MetricsSource } from './metrics.js';

/** Upper bounds of dsrlb_healthcheck_duration_seconds, seconds (+Inf implied). */
export const PROBE_DURATION_BUCKETS: readonly number[] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

const PROBE_DURATION = { name: 'dsrlb_healthcheck_duration_seconds', help: 'Health probe durations.', type: 'histogram' } as const;
const PROBE_FAILURES = {
  name: 'dsrlb_healthcheck_failures_total',
  help: `Failed health probes, by reason (${PROBE_REASONS.join(', ')}).`,
  type: 'counter',
} as const;

type Family = { readonly name: string; readonly help: string; readonly type: 'counter' | 'gauge' | 'histogram' };

/** Families read from the packet loop's counters and the daemon's view of each real at scrape time, in output order. */
const SCRAPED = {
  forwardedPackets: { name: 'dsrlb_forwarded_packets_total', help: 'Frames forwarded to a real.', type: 'counter' },
  forwardedBytes: { name: 'dsrlb_forwarded_bytes_total', help: 'Bytes forwarded to a real.', type: 'counter' },
  flowsCreated: { name: 'dsrlb_flows_created_total', help: 'Flow entries created for a real.', type: 'counter' },
  flowsActive: {
    name: 'dsrlb_flows_active',
    help: 'Flow entries per real: established TCP (IPVS ActiveConn) and live UDP (which IPVS counts in InActConn).',
    type: 'gauge',
  },
  flowsInactive: { name: 'dsrlb_flows_inactive', help: 'Flow entries per real in TCP SYN, FIN or closed state (IPVS InActConn, less UDP).', type: 'gauge' },
  up: { name: 'dsrlb_real_up', help: 'Observed health of a real: 1 up, 0 down (fact, from probes).', type: 'gauge' },
  weight: { name: 'dsrlb_real_weight', help: 'Weight of a real in force.', type: 'gauge' },
  state: { name: 'dsrlb_real_state', help: 'Operator intent for a real: 1 for the state in force (active, drain, disabled).', type: 'gauge' },
  drainFinished: {
    name: 'dsrlb_drain_finished',
    help: '1 when a draining (or removed, or weight 0) real has no established flow left (half-open and closing entries may remain, as ActiveConn 0 in ipvsadm).',
    type: 'gauge',
  },
} as const satisfies Record<string, Family>;

const INTENTS = ['active', 'drain', 'disabled'] as const;

/** One real's probe-duration histogram: per-bucket (not cumulative) counts, as prom-client keeps them. */
interface DurationSeries {
  readonly labels: string;
  readonly buckets: Float64Array;
  sum: number;
  count: number;
}

/** The per-real families: the probe results as they come (event-driven), the rest read at scrape time. */
export class RealMetrics {
  /** By seriesKey(service, real), in the order of each series' first probe (prom-client's order). */
  private readonly durations = new Map<string, DurationSeries>();
  /** By seriesKey(service, real) + reason, in the order of each series' first failure. */
  private readonly failures = new Map<string, { readonly labels: string; count: number }>();

  constructor(private readonly src: MetricsSource) {}

  /** One finished health probe: its duration, and its failure reason (null when it passed). */
  observeProbe(service: string, real: string, seconds: number, failureReason: string | null): void {
    if (!Number.isFinite(seconds)) throw new TypeError(`probe duration is not a finite number: ${seconds}`);
    const key = seriesKey(service, real);
    let series = this.durations.get(key);
    if (series === undefined) {
      series = { labels: realLabels(service, real), buckets: new Float64Array(PROBE_DURATION_BUCKETS.length), sum: 0, count: 0 };
      this.durations.set(key, series);
    }
    const bucket = PROBE_DURATION_BUCKETS.findIndex((bound) => seconds <= bound);
    if (bucket !== -1) series.buckets[bucket]!++;
    series.sum += seconds;
    series.count += 1;
    if (failureReason) {
      const failureKey = `${key}\u0000${failureReason}`;
      const failure = this.failures.get(failureKey);
      if (failure === undefined) this.failures.set(failureKey, { labels: `${realLabels(service, real)},reason="${escapeLabelValue(failureReason)}"`, count: 1 });
      else failure.count++;
    }
  }

  /** Drops a real's probe series (a forgotten real, or the old name of a renamed service). */
  forgetReal(service: string, real: string): void {
    const key = seriesKey(service, real);
    this.durations.delete(key);
    for (const reason of PROBE_REASONS) this.failures.delete(`${key}\u0000${reason}`);
  }

  /** The families as Prometheus text: each as prom-client writes one, joined by a blank line, no final newline. */
  text(): string {
    const src = this.src;
    const reals = src.reals();
    const counters = src.counters();
    const labels = reals.map((r) => realLabels(r.service, r.real));
    const families: string[] = [];
    const perReal = (family: Family, value: (index: number) => number): void => {
      const lines = head(family);
      const name = family.name;
      for (let i = 0; i < reals.length; i++) lines.push(`${name}{${labels[i]}} ${valueText(value(i))}`);
      families.push(lines.join('\n'));
    };
    perReal(SCRAPED.forwardedPackets, (i) => src.realCount(counters, reals[i]!.id, RealCounter.forwardedPackets));
    perReal(SCRAPED.forwardedBytes, (i) => src.realCount(counters, reals[i]!.id, RealCounter.forwardedBytes));
    perReal(SCRAPED.flowsCreated, (i) => src.realCount(counters, reals[i]!.id, RealCounter.flowsCreated));
    perReal(SCRAPED.flowsActive, (i) => src.activeFlows(reals[i]!.id));
    perReal(SCRAPED.flowsInactive, (i) => src.inactiveFlows(reals[i]!.id));
    perReal(SCRAPED.up, (i) => (reals[i]!.up ? 1 : 0));
    perReal(SCRAPED.weight, (i) => reals[i]!.weight);
    const state = head(SCRAPED.state);
    for (let i = 0; i < reals.length; i++) {
      for (const s of INTENTS) state.push(`${SCRAPED.state.name}{${labels[i]},state="${s}"} ${reals[i]!.intent === s ? 1 : 0}`);
    }
    families.push(state.join('\n'));
    perReal(SCRAPED.drainFinished, (i) => (reals[i]!.drainFinished ? 1 : 0));

    const durations = head(PROBE_DURATION);
    const bucketName = `${PROBE_DURATION.name}_bucket`;
    for (const d of this.durations.values()) {
      let cumulative = 0;
      for (let b = 0; b < PROBE_DURATION_BUCKETS.length; b++) {
        cumulative += d.buckets[b]!;
        durations.push(`${bucketName}{le="${PROBE_DURATION_BUCKETS[b]}",${d.labels}} ${cumulative}`);
      }
      durations.push(`${bucketName}{le="+Inf",${d.labels}} ${d.count}`);
      durations.push(`${PROBE_DURATION.name}_sum{${d.labels}} ${valueText(d.sum)}`);
      durations.push(`${PROBE_DURATION.name}_count{${d.labels}} ${d.count}`);
    }
    families.push(durations.join('\n'));
    const failures = head(PROBE_FAILURES);
    for (const f of this.failures.values()) failures.push(`${PROBE_FAILURES.name}{${f.labels}} ${f.count}`);
    families.push(failures.join('\n'));
    return families.join('\n\n');
  }
}

function seriesKey(service: string, real: string): string {
  return `${service}\u0000${real}`;
}

function realLabels(service: string, real: string): string {
  return `service="${escapeLabelValue(service)}",real="${escapeLabelValue(real)}"`;
}

function head(family: Family): string[] {
  return [`# HELP ${family.name} ${escapeText(family.help)}`, `# TYPE ${family.name} ${family.type}`];
}

// The text format's escapes, as prom-client writes them: backslash and newline in HELP text, and
// also the double quote in label values.
function escapeText(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function escapeLabelValue(value: string): string {
  return escapeText(value).replace(/"/g, '\\"');
}

/** A sample value as the text format spells it (prom-client writes NaN as `Nan`, which it is not). */
function valueText(value: number): string {
  if (Number.isNaN(value)) return 'NaN';
  if (!Number.isFinite(value)) return value < 0 ? '-Inf' : '+Inf';
  return `${value}`;
}
