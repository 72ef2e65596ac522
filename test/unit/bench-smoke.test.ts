// The benchmark harness's pure parts: /proc parsing and the CPU-accounting arithmetic (busy from
// idle counters, other people's processes, per-thread time, per-packet and per-GB figures), and
// the text table and SVG writers. No timing is measured here.

import { describe, expect, it } from 'vitest';
import {
  differentialUs,
  median,
  medianRoundRatio,
  roundRatioCount,
  foreignTime,
  lossFraction,
  machineBusy,
  parseProcPidStat,
  parseProcStat,
  parseSchedstat,
  secondsPerGB,
  threadTime,
  usPerPacket,
  type CpuSample,
} from '../../bench/lib/cpu-accounting.js';
import { escapeXml, formatNumber, formatTable, niceScale, renderSvg } from '../../bench/lib/report.js';

const STAT_A = `cpu  300 0 100 1000 10 0 5 0 0 0
cpu0 150 0 50 500 5 0 2 0 0 0
cpu1 150 0 50 500 5 0 3 1 0 0
intr 1 2 3
`;

function sample(wallS: number, idle: [number, number], extra: Partial<CpuSample> = {}): CpuSample {
  return {
    wallNs: wallS * 1e9,
    cpus: idle.map((ticks, id) => ({ id, user: 0, nice: 0, system: 0, idle: ticks, iowait: 0, irq: 0, softirq: 0, steal: 0 })),
    threads: {},
    procs: null,
    ...extra,
  };
}

describe('bench: /proc parsing', () => {
  it('reads the per-CPU lines of /proc/stat and ignores the aggregate and other lines', () => {
    const cpus = parseProcStat(STAT_A);
    expect(cpus).toHaveLength(2);
    expect(cpus[1]).toEqual({ id: 1, user: 150, nice: 0, system: 50, idle: 500, iowait: 5, irq: 0, softirq: 3, steal: 1 });
  });

  it('takes the run time in nanoseconds from the first schedstat field', () => {
    expect(parseSchedstat('6432887 1282434 2\n')).toBe(6432887);
    expect(parseSchedstat('garbage')).toBe(0);
  });

  it('parses /proc/<pid>/stat with a command name holding spaces and parentheses', () => {
    // Fields 3..17: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    const text = '4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 10 0 0 0 250 50 7 3 20 0 1 0 100';
    expect(parseProcPidStat(text)).toEqual({ pid: 4242, comm: 'my (odd) name', ppid: 1, kernelThread: false, ticks: 300, childTicks: 10 });
    const kthread = '12 (ksoftirqd/0) S 2 0 0 0 -1 69238848 0 0 0 0 9 40 0 0 20 0 1 0 5';
    expect(parseProcPidStat(kthread)?.kernelThread).toBe(true);
  });
});

describe('bench: CPU accounting', () => {
  it('counts busy time as wall time minus idle, per CPU, summed over CPUs', () => {
    // 2 s of wall time; cpu0 idle 1.5 s (150 ticks), cpu1 idle 0.5 s: busy 0.5 + 1.5 = 2 CPU-seconds.
    const b = machineBusy(sample(10, [1000, 1000]), sample(12, [1150, 1050]));
    expect(b.wallS).toBe(2);
    expect(b.busyS).toBeCloseTo(2, 9);
    expect(b.cores).toBeCloseTo(1, 9);
  });

  it('never reports a CPU busier than the wall time or below zero when counters are quantised', () => {
    const b = machineBusy(sample(0, [0, 0]), sample(1, [101, 0]));
    expect(b.perCpu[0]!.busyS).toBe(0);
    expect(b.perCpu[1]!.busyS).toBe(1);
  });

  it('adds up other processes but not ours, this process, kernel threads or processes that did nothing', () => {
    const procs = (entries: Record<string, [number, number, boolean?, string?]>) =>
      Object.fromEntries(Object.entries(entries).map(([pid, [ticks, childTicks, kernelThread, comm]]) => [pid, { ticks, childTicks, kernelThread: kernelThread ?? false, comm: comm ?? 'x', ppid: 1 }]));
    const self = String(process.pid);
    const a = sample(0, [0, 0], { procs: procs({ '100': [10, 0], '200': [50, 5], '300': [0, 0, true], '400': [7, 0], [self]: [0, 0] }) });
    const b = sample(1, [0, 0], {
      procs: procs({ '100': [60, 0], '200': [60, 25, false, 'exec-ed'], '300': [90, 0, true], '400': [7, 0], '500': [20, 0], [self]: [99, 0] }),
    });
    // 100 is ours; 200: +10 run +20 reaped children; 500 is new (all 20 ticks); 300 is a kernel thread.
    const f = foreignTime(a, b, [100]);
    expect(f.seconds).toBeCloseTo(0.5, 9);
    expect(f.top.map((t) => t.pid)).toEqual([200, 500]);
  });

  it('counts a child reaped during the interval only for what it ran after the first sample', () => {
    const p = (ticks: number, childTicks: number, ppid: number) => ({ ticks, childTicks, kernelThread: false, comm: 'x', ppid });
    // 600 (a foreign shell) reaps 601, which had run 500 ticks before the interval and 30 during it.
    const a = sample(0, [0, 0], { procs: { '600': p(10, 0, 1), '601': p(500, 0, 600) } });
    const b = sample(1, [0, 0], { procs: { '600': p(12, 530, 1) } });
    expect(foreignTime(a, b, []).seconds).toBeCloseTo(0.32, 9);
  });

  it('counts a child and its parent both reaped during the interval only for what they ran in it (bash -> npm -> node)', () => {
    const p = (ticks: number, childTicks: number, ppid: number) => ({ ticks, childTicks, kernelThread: false, comm: 'x', ppid });
    // 700 (bash) reaps 701 (npm), which had reaped 702 (node): 702 ran 900 ticks before, 40 during;
    // 701 ran 100 before, 5 during. bash's children now count 1045; this interval's part is 45.
    const a = sample(0, [0, 0], { procs: { '700': p(10, 0, 1), '701': p(100, 0, 700), '702': p(900, 0, 701) } });
    const b = sample(1, [0, 0], { procs: { '700': p(10, 1045, 1) } });
    expect(foreignTime(a, b, []).seconds).toBeCloseTo(0.45, 9);
  });

  it('splits a process run time into its main thread and the others, busiest first', () => {
    const a = sample(0, [0, 0], { threads: { '10/10/node': 0, '10/11/node': 0, '10/12/node': 0 } });
    const b = sample(1, [0, 0], { threads: { '10/10/node': 1e8, '10/11/node': 5e8, '10/12/node': 2e7, '10/13/node': 9e9 } });
    const t = threadTime(a, b);
    expect(t.totalS).toBeCloseTo(0.62, 9);
    expect(t.mainS).toBeCloseTo(0.1, 9);
    expect(t.threads.map((x) => x.tid)).toEqual([11, 10, 12]);
  });

  it('turns CPU seconds into microseconds per packet and seconds per GB, and the differential', () => {
    expect(usPerPacket(0.5, 250_000)).toBeCloseTo(2, 9);
    expect(Number.isNaN(usPerPacket(1, 0))).toBe(true);
    expect(differentialUs(3.2, 2.5)).toBeCloseTo(0.7, 9);
    expect(secondsPerGB(0.25, 500_000_000)).toBeCloseTo(0.5, 9);
    expect(lossFraction(1000, 990)).toBeCloseTo(0.01, 9);
    expect(lossFraction(1000, 1005)).toBe(0); // a duplicate never makes loss negative
    expect(lossFraction(0, 0)).toBe(1);
  });

  it('takes medians, and ratios within rounds before their median', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(Number.isNaN(median([]))).toBe(true);
    // C and dsrlb in the same three rounds; the machine drifted up in round 1.
    const cref = [{ round: 0, us: 1.0 }, { round: 1, us: 2.0 }, { round: 2, us: 1.2 }];
    const dsrlb = [{ round: 0, us: 1.25 }, { round: 1, us: 2.5 }, { round: 2, us: 1.5 }];
    expect(medianRoundRatio(cref, dsrlb, 'us')).toBeCloseTo(0.8, 9);
    // A round only one of them has, or a non-positive value, does not count.
    expect(medianRoundRatio(cref, [{ round: 2, us: 1.5 }, { round: 7, us: 9 }, { round: 0, us: -1 }], 'us')).toBeCloseTo(0.8, 9);
    expect(medianRoundRatio(cref, [{ round: 5, us: 1 }], 'us')).toBeNull();
    // How many rounds it stood on: the report shows it when some were left out.
    expect(roundRatioCount(cref, dsrlb, 'us')).toBe(3);
    expect(roundRatioCount(cref, [{ round: 2, us: 1.5 }, { round: 7, us: 9 }, { round: 0, us: -1 }], 'us')).toBe(1);
  });
});

describe('bench: report writers', () => {
  it('formats numbers to about three significant digits with grouped thousands', () => {
    expect(formatNumber(1234567.8)).toBe('1,234,568');
    expect(formatNumber(123.4)).toBe('123');
    expect(formatNumber(12.34)).toBe('12.3');
    expect(formatNumber(1.234)).toBe('1.23');
    expect(formatNumber(0.01234)).toBe('0.012');
    expect(formatNumber(0)).toBe('0');
    expect(formatNumber(7)).toBe('7');
  });

  it('aligns numeric columns right and text left, with - for missing values', () => {
    const t = formatTable(['case', 'pps'], [
      ['kernel', 500_000],
      ['dsrlb pcap', null],
    ]);
    expect(t.split('\n')).toEqual(['case            pps', '----------  -------', 'kernel      500,000', 'dsrlb pcap        -']);
  });

  it('picks nice axis maxima', () => {
    expect(niceScale(7.3)).toEqual({ max: 8, step: 2 });
    expect(niceScale(480_000)).toEqual({ max: 500_000, step: 100_000 });
    expect(niceScale(0)).toEqual({ max: 1, step: 0.2 });
  });

  it('draws one bar per finite value in well-formed SVG, escaping labels', () => {
    const svg = renderSvg('runs <&>', [
      { title: 'pps', unit: 'packets/s', series: ['a', 'b'], groups: [{ label: 'kernel\n1 flow', values: [500_000, 480_000] }, { label: 'x<y', values: [100, null] }] },
      { title: 'cpu', unit: 'us', series: ['only'], groups: [{ label: 'k', values: [Number.NaN] }] },
    ]);
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg).toContain('runs &lt;&amp;&gt;');
    expect(svg).toContain('x&lt;y');
    expect(svg).not.toMatch(/x<y/);
    // Bars carry a <title>; legend swatches and the background do not.
    expect(svg.match(/<rect [^>]*><title>/g)).toHaveLength(3);
    // Every opened element is closed in order.
    const stack: string[] = [];
    for (const m of svg.matchAll(/<(\/?)([a-zA-Z]+)[^>]*?(\/?)>/g)) {
      if (m[3] === '/') continue;
      if (m[1] === '/') expect(stack.pop()).toBe(m[2]);
      else stack.push(m[2]!);
    }
    expect(stack).toEqual([]);
    expect(escapeXml('"a" & <b>')).toBe('&quot;a&quot; &amp; &lt;b&gt;');
  });
});
