// runProbe's timeout and signal with scripted probers; then the tcp, http and https probers against
// servers in child processes (so that every socket left in this process is a probe's), for every way
// a probe ends: each ends by its timeout at the latest and leaves no socket open.

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { HttpProber } from '../../src/health/http-probe.js';
import { OK, runProbe, timedOut, type Clock, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from '../../src/health/probe.js';
import { TcpProber } from '../../src/health/tcp-probe.js';
import { healthCheck } from '../support/health-check.js';

/** Timers that run only when the test advances time. */
class ManualClock implements Clock {
  t = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();
  private seq = 0;
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, delayMs: number): number {
    this.timers.set(++this.seq, { at: this.t + delayMs, fn });
    return this.seq;
  }
  clearTimeout(handle: unknown): void {
    this.timers.delete(handle as number);
  }
  get pending(): number {
    return this.timers.size;
  }
  advance(ms: number): void {
    this.t += ms;
    for (const [id, timer] of [...this.timers].sort((a, b) => a[1].at - b[1].at)) {
      if (timer.at > this.t) break;
      this.timers.delete(id);
      timer.fn();
    }
  }
}

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const target = (port: number, over: Partial<HealthCheckConfig> = {}, address = '127.0.0.1'): ProbeTarget => ({
  address,
  port,
  vip: '10.0.0.100',
  service: 'web',
  check: healthCheck({ port, ...over }),
});

/** A prober the test answers by hand, which records its signal. */
function handProber(): { prober: Prober; signals: ProbeSignal[]; answer(outcome: ProbeOutcome): void } {
  const signals: ProbeSignal[] = [];
  let answer: (outcome: ProbeOutcome) => void = () => {};
  return {
    signals,
    prober: {
      probe: (_t, signal) => {
        signals.push(signal);
        return new Promise((resolve) => (answer = resolve));
      },
    },
    answer: (outcome) => answer(outcome),
  };
}

describe('runProbe', () => {
  it('reports a timeout at the timeout and aborts the prober once, whether or not it stops', async () => {
    const clock = new ManualClock();
    const hand = handProber();
    const running = runProbe(hand.prober, target(80), 500, clock);
    let aborts = 0;
    hand.signals[0]!.onAbort(() => aborts++);
    hand.signals[0]!.onAbort(() => aborts++); // a second listener runs too
    clock.advance(499);
    expect(hand.signals[0]!.aborted).toBe(false);
    clock.advance(1);
    expect(hand.signals[0]!.aborted).toBe(true);
    expect(aborts).toBe(2);
    expect(await running.result).toEqual({ ok: false, reason: 'timeout', detail: 'no answer within 500 ms', startedAtMs: 0, durationMs: 500 });
    // A listener added after the abort runs at once.
    hand.signals[0]!.onAbort(() => aborts++);
    expect(aborts).toBe(3);
    // `finished` waits for the prober itself, however late it answers; a late OK changes nothing.
    let finished = false;
    void running.finished.then(() => (finished = true));
    await flush();
    expect(finished).toBe(false);
    hand.answer(OK);
    await running.finished;
    expect((await running.result).ok).toBe(false);
    running.cancel();
    expect(aborts).toBe(3);
  });

  it('an answer clears the timer; cancel after it changes nothing and aborts nothing', async () => {
    const clock = new ManualClock();
    const hand = handProber();
    const running = runProbe(hand.prober, target(80), 500, clock);
    let aborted = false;
    hand.signals[0]!.onAbort(() => (aborted = true));
    clock.advance(20);
    hand.answer(OK);
    await running.finished;
    expect(await running.result).toEqual({ ok: true, startedAtMs: 0, durationMs: 20 });
    expect(clock.pending).toBe(0);
    running.cancel();
    expect(aborted).toBe(false);
  });

  it('cancel reports a timeout at once and aborts the prober', async () => {
    const clock = new ManualClock();
    const hand = handProber();
    const running = runProbe(hand.prober, target(80), 500, clock);
    let aborted = 0;
    hand.signals[0]!.onAbort(() => (aborted++, hand.answer(timedOut())));
    running.cancel();
    expect(aborted).toBe(1);
    expect(await running.result).toMatchObject({ ok: false, reason: 'timeout', detail: 'aborted at the timeout' });
    await running.finished;
    expect(clock.pending).toBe(0);
  });

  it('a prober that throws or rejects fails the probe with its error mapped to a reason', async () => {
    const throws: Prober = {
      probe: () => {
        throw new Error('no socket for you');
      },
    };
    expect(await runProbe(throws, target(80), 500).result).toMatchObject({ ok: false, reason: 'error', detail: 'no socket for you' });
    const rejects: Prober = { probe: () => Promise.reject(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })) };
    expect(await runProbe(rejects, target(80), 500).result).toMatchObject({ ok: false, reason: 'refused' });
  });
});

/**
 * The servers, in a child so that their sockets are not counted here: an HTTP server (paths below),
 * the same over TLS and a TCP port that accepts. Prints the ports as JSON.
 */
const SERVERS = `
const http = require('node:http');
const https = require('node:https');
const net = require('node:net');
const fs = require('node:fs');
const [key, cert] = process.argv.slice(1);
const handler = (req, res) => {
  if (req.url === '/healthz') return void res.end('ok');
  if (req.url === '/never') return; // holds the request open
  if (req.url === '/error') return void res.writeHead(500).end('broken');
  if (req.url === '/hangup') return void req.socket.destroy();
  if (req.url === '/trickle') { // one byte of the head every 20 ms, never its end
    const text = 'HTTP/1.1 200 OK\\r\\nX: ' + 'a'.repeat(1000);
    let i = 0;
    const t = setInterval(() => (i < text.length && !req.socket.destroyed ? req.socket.write(text[i++]) : clearInterval(t)), 20);
    return;
  }
  if (req.url === '/switch') return void req.socket.write('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: x\\r\\nConnection: Upgrade\\r\\n\\r\\n');
  res.writeHead(404).end();
};
const plain = http.createServer(handler);
const tls = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert) }, handler);
const tcp = net.createServer((s) => { s.on('error', () => {}); s.destroy(); });
const listen = (server) => new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server.address().port)));
Promise.all([listen(plain), listen(tls), listen(tcp)]).then(([http, https, tcp]) => {
  process.stdout.write(JSON.stringify({ http, https, tcp }) + '\\n');
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

/** A listening port whose accept queue is full, so connects to it hang (python: Node accepts by itself). */
const STALLED = `
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(0)
fill = []
for _ in range(3):
    c = socket.socket(); c.setblocking(False); c.connect_ex(s.getsockname()); fill.append(c)
print(s.getsockname()[1], flush=True)
time.sleep(300)
`;

async function firstLine(child: ChildProcess): Promise<string> {
  let text = '';
  return new Promise((resolve, reject) => {
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      text += chunk;
      if (text.includes('\n')) resolve(text.split('\n')[0]!);
    });
    child.once('exit', () => reject(new Error('the server process exited')));
  });
}

/** This process's sockets (by inode) and the socket handles Node holds. */
function openSockets(): { fds: number; handles: string[] } {
  let fds = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) fds++;
    } catch {
      // the listing's own descriptor, closed already
    }
  }
  const handles = process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap' || r === 'TLSWrap' || r === 'TCPConnectWrap');
  return { fds, handles };
}

describe('probes release their sockets, whatever the outcome', () => {
  let dir = '';
  let servers: ChildProcess;
  let stalledServer: ChildProcess;
  let ports = { http: 0, https: 0, tcp: 0, stalled: 0, closed: 0 };
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsrlb-probe-release-'));
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
      '-subj', '/CN=real.example.test', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
    ], { stdio: 'ignore' });
    servers = spawn(process.execPath, ['-e', SERVERS, join(dir, 'key.pem'), join(dir, 'cert.pem')], { stdio: ['pipe', 'pipe', 'inherit'] });
    stalledServer = spawn('python3', ['-c', STALLED], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [listening, stalled] = await Promise.all([firstLine(servers), firstLine(stalledServer)]);
    ports = { ...JSON.parse(listening), stalled: Number(stalled), closed: await closedPort() };
  });
  afterAll(() => {
    servers?.stdin?.end();
    stalledServer?.kill();
    rmSync(dir, { recursive: true, force: true });
  });

  const cases: [name: string, prober: () => Prober, target: () => ProbeTarget, expected: { ok: boolean; reason?: string }][] = [
    ['tcp up', () => new TcpProber(), () => target(ports.tcp), { ok: true }],
    ['tcp refused', () => new TcpProber(), () => target(ports.closed), { ok: false, reason: 'refused' }],
    ['tcp, a handshake that never completes', () => new TcpProber(), () => target(ports.stalled), { ok: false, reason: 'timeout' }],
    ['http up', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/healthz', expectBody: 'ok' }), { ok: true }],
    ['http 500', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/error' }), { ok: false, reason: 'status' }],
    ['http body lacking', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/healthz', expectBody: 'READY' }), { ok: false, reason: 'body' }],
    ['http refused', () => new HttpProber('http'), () => target(ports.closed, { type: 'http' }), { ok: false, reason: 'refused' }],
    ['http hang-up', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/hangup' }), { ok: false, reason: 'reset' }],
    ['http, no answer', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/never' }), { ok: false, reason: 'timeout' }],
    ['http, a head that trickles', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/trickle' }), { ok: false, reason: 'timeout' }],
    ['http, a handshake that never completes', () => new HttpProber('http'), () => target(ports.stalled, { type: 'http' }), { ok: false, reason: 'timeout' }],
    // node:http handed a 101 to an upgrade listener and the probe never ended: the real was never probed again.
    ['http 101', () => new HttpProber('http'), () => target(ports.http, { type: 'http', path: '/switch' }), { ok: false, reason: 'status' }],
    ['https up', () => new HttpProber('https'), () => target(ports.https, { type: 'https', path: '/healthz', expectBody: 'ok' }), { ok: true }],
    ['https, no answer', () => new HttpProber('https'), () => target(ports.https, { type: 'https', path: '/never' }), { ok: false, reason: 'timeout' }],
    ['https to a plain port', () => new HttpProber('https'), () => target(ports.http, { type: 'https', path: '/healthz' }), { ok: false, reason: 'error' }],
    ['https, a handshake that never completes', () => new HttpProber('https'), () => target(ports.stalled, { type: 'https' }), { ok: false, reason: 'timeout' }],
  ];

  for (const [name, makeProber, makeTarget, expected] of cases) {
    it(`${name}: ${expected.ok ? 'up' : expected.reason}, within the timeout, and no socket left`, async () => {
      const before = openSockets();
      const timeoutMs = 300;
      const prober = makeProber();
      const started = performance.now();
      // Ten at once, as the monitor runs them.
      const runs = Array.from({ length: 10 }, () => runProbe(prober, makeTarget(), timeoutMs));
      const results = await Promise.all(runs.map((r) => r.result));
      await Promise.all(runs.map((r) => r.finished));
      const finishedMs = performance.now() - started;
      for (const r of results) expect(r).toMatchObject(expected);
      expect(Math.max(...results.map((r) => r.durationMs))).toBeLessThan(timeoutMs + 100);
      expect(finishedMs).toBeLessThan(timeoutMs + 150);
      // Handles close in the loop turn after destroy().
      await flush();
      await flush();
      expect(openSockets()).toEqual(before);
    });
  }
});

/** A port nobody listens on: bound once, then released. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const { port } = s.address() as AddressInfo;
  await new Promise((resolve) => s.close(resolve));
  return port;
}
