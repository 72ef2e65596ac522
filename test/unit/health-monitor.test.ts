// The monitor with real timers and real sockets: 200 reals on 200 loopback addresses answered by one
// HTTP listener (in a child process) go up after rise and down after fall, probes stay within their timeout, first probes
// are spread over the interval; plus the target diff, no self-overlap and stop().

import { spawn } from 'node:child_process';
import { createServer as createTcpServer, type AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { HealthMonitor, type HealthFactRecord, type HealthTarget } from '../../src/health/health-monitor.js';
import { HttpProber } from '../../src/health/http-probe.js';
import { failFromError, OK, runProbe, timedOut, type ProbeOutcome, type ProbeResult, type Prober } from '../../src/health/probe.js';
import { healthCheck } from '../support/health-check.js';
import { createLogger } from '../../src/control/logger.js';

function check(over: Partial<HealthCheckConfig> = {}): HealthCheckConfig {
  return healthCheck({ intervalMs: 200, timeoutMs: 150, fall: 2, ...over });
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function waitUntil(what: string, deadlineMs: number, cond: () => boolean): Promise<number> {
  const started = performance.now();
  while (!cond()) {
    if (performance.now() - started > deadlineMs) throw new Error(`timed out after ${deadlineMs} ms waiting for ${what}`);
    await sleep(5);
  }
  return performance.now() - started;
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

const cleanups: (() => unknown)[] = [];
afterEach(() => {
  while (cleanups.length) cleanups.pop()!();
});

/**
 * The one HTTP listener for the 200 reals, in a child process so its work does not share the
 * monitor's event loop (as on a real LB). It binds 0.0.0.0 (loopback holds all of 127/8), prints its
 * port, and on "close" on stdin closes the listener and prints how many of 127.0.10.0/24 it served.
 */
const LISTENER = `
const http = require('node:http');
const seen = new Set();
const server = http.createServer((req, res) => { if (req.socket.localAddress.startsWith('127.0.10.')) seen.add(req.socket.localAddress); res.end('ok'); });
server.listen(0, '0.0.0.0', () => process.stdout.write('port ' + server.address().port + '\\n'));
process.stdin.on('data', () => { server.close(); server.closeAllConnections(); process.stdout.write('served ' + seen.size + '\\n'); });
`;

async function startListener(): Promise<{ port: number; close(): Promise<number>; kill(): void }> {
  const child = spawn(process.execPath, ['-e', LISTENER], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines: string[] = [];
  let waiting: (() => void) | null = null;
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
    lines.push(...chunk.split('\n').filter(Boolean));
    waiting?.();
  });
  const line = async (prefix: string): Promise<string> => {
    for (;;) {
      const found = lines.find((l) => l.startsWith(prefix));
      if (found) return found.slice(prefix.length);
      await new Promise<void>((resolve, reject) => {
        waiting = resolve;
        child.once('exit', () => reject(new Error('the listener process exited')));
      });
    }
  };
  const port = Number(await line('port '));
  return {
    port,
    close: async () => {
      child.stdin.write('close\n');
      return Number(await line('served '));
    },
    kill: () => child.kill('SIGKILL'),
  };
}

describe('HealthMonitor, 200 reals on loopback', () => {
  it('all go up at their first probe, down after fall, within timeouts, with spread-out first probes', async () => {
    const listener = await startListener();
    cleanups.push(() => listener.kill());
    // As the issue asks: probes at 1 s intervals to 200 reals (a 500 ms timeout, as a real config would have).
    const intervalMs = 1000;
    const timeoutMs = 500;
    const rise = 2;
    const fall = 2;
    const httpCheck = check({ type: 'http', port: listener.port, path: '/healthz', intervalMs, timeoutMs, rise, fall });
    // Warm the client code paths first so the figures are steady-state ones, not JIT start-up.
    for (let i = 0; i < 20; i++) {
      const warm = runProbe(new HttpProber('http'), { address: '127.0.0.1', port: listener.port, vip: '', service: '', check: httpCheck }, 1000);
      expect((await warm.result).ok).toBe(true);
    }

    const results: { key: string; result: ProbeResult }[] = [];
    const monitor = new HealthMonitor({ observer: (key, result) => results.push({ key, result }) });
    cleanups.push(() => monitor.stop());
    const changes: { key: string; fact: HealthFactRecord }[] = [];
    monitor.on('change', (key, fact) => changes.push({ key, fact }));

    const targets: HealthTarget[] = Array.from({ length: 200 }, (_, i) => ({
      key: `web/127.0.10.${i + 1}`,
      service: 'web',
      address: `127.0.10.${i + 1}`,
      vip: '10.0.0.100',
      check: httpCheck,
    }));
    const startedAt = Date.now();
    monitor.setTargets(targets);
    expect(targets.every((t) => monitor.fact(t.key)!.state === 'down')).toBe(true);

    const upAfterMs = await waitUntil('all 200 up', 5000, () => targets.every((t) => monitor.fact(t.key)!.state === 'up'));
    const upResults = results.map((r) => r.result);
    const durations = upResults.map((r) => r.durationMs);
    const upFailures = upResults.filter((r) => !r.ok);
    const upChanges = [...changes];

    // First-probe times: uniform offsets in [0, interval) spread over most of it.
    const firstAt = new Map<string, number>();
    for (const { key, result } of results) if (!firstAt.has(key)) firstAt.set(key, result.startedAtMs - startedAt);
    const offsets = [...firstAt.values()];
    const spreadMs = Math.max(...offsets) - Math.min(...offsets);
    const busiest = Math.max(...countBy(offsets).values());
    const tenths = new Set(offsets.map((o) => Math.min(9, Math.floor((o / intervalMs) * 10))));

    // Take the listener away: every real goes down after fall consecutive refusals.
    const upCount = results.length;
    const served = await listener.close();
    const downAfterMs = await waitUntil('all 200 down', 5000, () => targets.every((t) => monitor.fact(t.key)!.state === 'down'));
    const failed = results.slice(upCount).map((r) => r.result).filter((r) => !r.ok);
    const failedMaxMs = Math.max(...failed.map((r) => r.durationMs));

    console.log(
      `[health-monitor] 200 http reals, interval ${intervalMs} ms, timeout ${timeoutMs} ms, rise ${rise}, fall ${fall}: ` +
        `all up after ${upAfterMs.toFixed(0)} ms (${upResults.length} probes, ${upFailures.length} failed), ` +
        `all down ${downAfterMs.toFixed(0)} ms after the listener closed; ok-probe duration p50 ${percentile(durations, 50).toFixed(2)} ms, ` +
        `p99 ${percentile(durations, 99).toFixed(2)} ms, max ${Math.max(...durations).toFixed(2)} ms; ` +
        `refused-probe max ${failedMaxMs.toFixed(2)} ms; first-probe offsets ${Math.min(...offsets)}..${Math.max(...offsets)} ms ` +
        `(spread ${spreadMs} ms, ${tenths.size}/10 tenths of the interval used, at most ${busiest} in one ms)`,
    );

    // Up: each real flipped at its first success (unknown until then: the first result decides, rise
    // is for a real seen down), once, having been probed at its own address.
    expect(served).toBe(200);
    expect(upChanges.length).toBe(200);
    expect(upChanges.every((c) => c.fact.state === 'up' && c.fact.successes === 1 && c.fact.failures === 0 && c.fact.settled)).toBe(true);
    // Without failures this takes at most the first probe's offset (under a second) and one probe;
    // the margin is for a loaded machine (the two cores are shared), and a timed-out first probe.
    expect(upAfterMs).toBeLessThan(2 * intervalMs + 300);
    // Durations never exceed the timeout by more than timer lateness; on loopback almost all succeed.
    expect(Math.max(...durations)).toBeLessThan(timeoutMs + 100);
    expect(upFailures.length).toBeLessThanOrEqual(Math.ceil(upResults.length * 0.02));
    expect(upFailures.every((r) => !r.ok && r.reason === 'timeout')).toBe(true);
    expect(offsets.length).toBe(200);
    expect(spreadMs).toBeGreaterThan(0.7 * intervalMs);
    expect(busiest).toBeLessThan(20);
    expect(tenths.size).toBeGreaterThanOrEqual(9);

    // Down: each real flipped at its fall-th consecutive failure, each failure a fast refusal.
    const downs = changes.slice(200);
    expect(downs.length).toBe(200);
    expect(downs.every((c) => c.fact.state === 'down' && c.fact.failures === fall && c.fact.lastError!.startsWith('refused: '))).toBe(true);
    expect(downAfterMs).toBeLessThan(fall * intervalMs + 300);
    expect(failed.length).toBeGreaterThanOrEqual(fall * 200);
    expect(failedMaxMs).toBeLessThan(timeoutMs);
  });
});

function countBy(values: number[]): Map<number, number> {
  const m = new Map<number, number>();
  for (const v of values) m.set(v, (m.get(v) ?? 0) + 1);
  return m;
}

describe('HealthMonitor bookkeeping', () => {
  it('logs a change listener that throws and goes on probing (from a probe\'s answer it was an unhandled rejection, which ends the process)', async () => {
    const lines: Record<string, unknown>[] = [];
    const fails: Prober = { probe: async () => ({ ok: false, reason: 'refused', detail: 'stand-in' }) };
    const monitor = new HealthMonitor({ probers: { tcp: fails }, log: createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)) });
    cleanups.push(() => monitor.stop());
    let calls = 0;
    monitor.on('change', () => {
      calls++;
      throw new Error('listener bug');
    });
    const target: HealthTarget = { key: 'a', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ port: 1, intervalMs: 20, timeoutMs: 10, fall: 1, rise: 1 }) };
    monitor.setTargets([target]);
    await waitUntil('the first probe answered', 2000, () => calls > 0);
    expect(monitor.fact('a')).toMatchObject({ state: 'down' });
    expect(lines).toEqual([expect.objectContaining({ level: 'error', msg: 'a health change listener failed', real: 'a', error: 'listener bug' })]);
  });

  it('leaves a real\'s health as it was while its probes cannot leave this host (ENETUNREACH, ENETDOWN, EADDRNOTAVAIL); EHOSTUNREACH is the real\'s', async () => {
    // A flap of the LB's own link: every probe failed with ENETUNREACH, every real went down, and
    // the way back out reset the connections of those still marked down.
    const lines: Record<string, unknown>[] = [];
    let error: string | null = null;
    let probes = 0;
    const prober: Prober = {
      probe: async () => {
        probes++;
        return error === null ? OK : failFromError(Object.assign(new Error(error), { code: error }));
      },
    };
    const monitor = new HealthMonitor({ probers: { tcp: prober }, log: createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)) });
    cleanups.push(() => monitor.stop());
    monitor.setTargets([{ key: 'a', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ port: 1, intervalMs: 20, timeoutMs: 10, fall: 2, rise: 1 }) }]);
    await waitUntil('up', 2000, () => monitor.fact('a')?.state === 'up');
    for (const code of ['ENETUNREACH', 'ENETDOWN', 'EADDRNOTAVAIL']) {
      error = code;
      const from = probes;
      await waitUntil(`five probes failing with ${code}`, 2000, () => probes >= from + 5);
      expect(monitor.fact('a')?.state, code).toBe('up');
    }
    // Logged once for the episode, not per probe.
    expect(lines.filter((l) => l['msg'] === 'health probe cannot leave this host: the real\'s health is left as it was')).toHaveLength(1);
    error = 'EHOSTUNREACH';
    await waitUntil('down after fall failures of its own', 2000, () => monitor.fact('a')?.state === 'down');
  });

  it('setTargets keeps unchanged keys, keeps state over timing-only changes, restarts changed probes, stops removed ones', async () => {
    const server = createTcpServer((s) => s.destroy());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => server.close());
    const port = (server.address() as AddressInfo).port;
    const monitor = new HealthMonitor();
    cleanups.push(() => monitor.stop());
    const t = (key: string, over: Partial<HealthCheckConfig> = {}): HealthTarget => ({
      key,
      service: 'web',
      address: '127.0.0.1',
      vip: '10.0.0.100',
      check: check({ port, intervalMs: 50, timeoutMs: 40, rise: 1, ...over }),
    });
    monitor.setTargets([t('a'), t('b'), t('c'), t('d')]);
    await waitUntil('all up', 2000, () => ['a', 'b', 'c', 'd'].every((k) => monitor.fact(k)!.state === 'up'));
    const sinceA = monitor.fact('a')!.since;
    const sinceB = monitor.fact('b')!.since;
    const sinceC = monitor.fact('c')!.since;

    // a: unchanged (a fresh but equal config object); b: only timing changed; c: the probe changed
    // (to a closed port: up goes on until the new probe fails `fall` times); d: removed; e: new.
    monitor.setTargets([t('a'), t('b', { intervalMs: 60, fall: 5 }), t('c', { port: port + 1 === 65536 ? 1 : port + 1 }), t('e', { type: 'none' })]);
    expect(monitor.fact('a')).toMatchObject({ state: 'up', since: sinceA });
    expect(monitor.fact('b')).toMatchObject({ state: 'up', since: sinceB });
    expect(monitor.fact('c')).toMatchObject({ state: 'up', since: sinceC, settled: true, successes: 0, failures: 0, lastError: null });
    expect(monitor.fact('d')).toBeUndefined();
    expect(monitor.fact('e')).toMatchObject({ state: 'up', probing: false });
    await sleep(200);
    expect(monitor.fact('a')!.since).toBe(sinceA);
    expect(monitor.fact('b')!.since).toBe(sinceB);
    expect(monitor.fact('c')).toMatchObject({ state: 'down' });
    expect(monitor.fact('c')!.lastError).toMatch(/^refused: /);

    expect(() => monitor.setTargets([t('x'), t('x')])).toThrow(/appears twice/);
  });

  it('a probe never overlaps itself; a hung prober counts as a timeout at the timeout', async () => {
    let inFlight = 0;
    let maxInFlight = 0;
    const startedAt: number[] = [];
    // Ignores the abort signal and takes 250 ms: a slot that comes while it runs starts its probe as it ends.
    const slow: Prober = {
      async probe(): Promise<ProbeOutcome> {
        startedAt.push(performance.now());
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await sleep(250);
        inFlight--;
        return OK;
      },
    };
    const results: ProbeResult[] = [];
    const monitor = new HealthMonitor({ random: () => 0, probers: { tcp: slow }, observer: (_k, r) => results.push(r) });
    cleanups.push(() => monitor.stop());
    monitor.setTargets([{ key: 'k', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ intervalMs: 100, timeoutMs: 60, rise: 1, fall: 1 }) }]);
    await sleep(80);
    expect(monitor.fact('k')).toMatchObject({ state: 'down', probing: true, failures: 1 });
    expect(monitor.fact('k')!.lastError).toBe('timeout: no answer within 60 ms');
    expect(results[0]!.durationMs).toBeGreaterThanOrEqual(59);
    expect(results[0]!.durationMs).toBeLessThan(100);
    await sleep(900);
    expect(maxInFlight).toBe(1);
    // Starts at 0, 250, 500, 750 (each as the 250 ms prober before it ends): 3 to 4 in 980 ms
    // where a free-running schedule would have made 10.
    expect(startedAt.length).toBeGreaterThanOrEqual(3);
    expect(startedAt.length).toBeLessThanOrEqual(4);
    const gaps = startedAt.slice(1).map((t, i) => t - startedAt[i]!);
    // Back to back at most: a timer may fire a millisecond early against performance.now().
    expect(gaps.every((g) => g >= 245), JSON.stringify(gaps)).toBe(true);
    expect(results.every((r) => !r.ok && r.reason === 'timeout')).toBe(true);
  });

  it('with the timeout equal to the interval, a dead real still goes down after fall probes, not twice as many intervals', async () => {
    let started = 0;
    // A blackholed real: never answers, gives up at the timeout.
    const blackhole: Prober = {
      probe: (_t, signal) => {
        started++;
        return new Promise((resolve) => signal.onAbort(() => resolve(timedOut())));
      },
    };
    const monitor = new HealthMonitor({ random: () => 0, probers: { tcp: blackhole } });
    cleanups.push(() => monitor.stop());
    monitor.setTargets([{ key: 'k', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ intervalMs: 100, timeoutMs: 100, rise: 1, fall: 3 }) }]);
    await sleep(1000);
    // About 10 in a second, back to back; skipping the slot that finds the probe still running
    // made it one probe per two intervals (5).
    expect(started).toBeGreaterThanOrEqual(8);
    expect(monitor.fact('k')).toMatchObject({ state: 'down', settled: true });
  });

  it('stop() aborts probes in flight and nothing runs or changes afterwards', async () => {
    const aborted: boolean[] = [];
    let calls = 0;
    const hanging: Prober = {
      probe(_t, signal): Promise<ProbeOutcome> {
        calls++;
        return new Promise((resolve) =>
          signal.onAbort(() => {
            aborted.push(true);
            resolve(timedOut());
          }),
        );
      },
    };
    const monitor = new HealthMonitor({ random: () => 0, probers: { tcp: hanging } });
    let changes = 0;
    monitor.on('change', () => changes++);
    monitor.setTargets([{ key: 'k', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ intervalMs: 1000, timeoutMs: 900 }) }]);
    await sleep(30);
    expect(monitor.fact('k')!.probing).toBe(true);
    monitor.stop();
    expect(aborted).toEqual([true]);
    expect(monitor.fact('k')).toBeUndefined();
    await sleep(100);
    expect([calls, changes]).toEqual([1, 0]);
  });

  it('an observer that throws does not stop health checking', async () => {
    const monitor = new HealthMonitor({
      random: () => 0,
      probers: { tcp: { probe: async () => OK } },
      observer: () => {
        throw new Error('metrics broke');
      },
    });
    cleanups.push(() => monitor.stop());
    monitor.setTargets([{ key: 'k', service: 'web', address: '127.0.0.1', vip: '10.0.0.100', check: check({ intervalMs: 30, timeoutMs: 20, rise: 2 }) }]);
    await waitUntil('up', 1000, () => monitor.fact('k')!.state === 'up');
  });

  it('a renamed service keeps its reals\' health, and later probes carry the new name', async () => {
    const names: string[] = [];
    const monitor = new HealthMonitor({ random: () => 0, probers: { tcp: { probe: async (t) => (names.push(t.service), OK) } } });
    cleanups.push(() => monitor.stop());
    const t = (service: string): HealthTarget => ({ key: 'k', service, address: '127.0.0.1', vip: '10.0.0.100', check: check({ intervalMs: 30, timeoutMs: 20, rise: 2 }) });
    monitor.setTargets([t('web')]);
    await waitUntil('up', 1000, () => monitor.fact('k')!.state === 'up');
    const since = monitor.fact('k')!.since;
    monitor.setTargets([t('www')]);
    expect(monitor.fact('k')).toMatchObject({ state: 'up', since });
    const seen = names.length;
    await waitUntil('a probe as www', 1000, () => names.length > seen + 1);
    expect(names.slice(seen + 1).every((n) => n === 'www')).toBe(true);
    expect(monitor.fact('k')).toMatchObject({ state: 'up', since });
  });
});
