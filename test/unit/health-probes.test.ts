// Each probe kind against real servers started here on 127.0.0.1 (ephemeral ports): the verdict,
// the failure reason, and that timeouts end on time and leave nothing running. Needs root for icmp.

import { execFileSync } from 'node:child_process';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer as createHttpServer, type RequestListener, type Server as HttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { createServer as createTcpServer, type AddressInfo, type Server as TcpServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { ExecProber } from '../../src/health/exec-probe.js';
import { HttpProber } from '../../src/health/http-probe.js';
import { BODY_LIMIT_BYTES } from '../../src/health/http-response.js';
import { IcmpProber } from '../../src/health/icmp-probe.js';
import { runProbe, type ProbeResult, type ProbeTarget, type Prober } from '../../src/health/probe.js';
import { TcpProber } from '../../src/health/tcp-probe.js';
import { UdpProber } from '../../src/health/udp-probe.js';
import { healthCheck } from '../support/health-check.js';


function target(port: number, over: Partial<HealthCheckConfig> = {}, address = '127.0.0.1'): ProbeTarget {
  return { address, port, vip: '10.0.0.100', service: 'web', check: healthCheck({ port, ...over }) };
}

async function probe(prober: Prober, t: ProbeTarget, timeoutMs = 1000): Promise<ProbeResult> {
  const running = runProbe(prober, t, timeoutMs);
  const result = await running.result;
  await running.finished;
  return result;
}

const portOf = (server: { address(): AddressInfo | string | null }): number => (server.address() as AddressInfo).port;

function readlinkSafe(path: string): string {
  try {
    return readlinkSync(path);
  } catch {
    return '';
  }
}

async function listenTcp(server: TcpServer | HttpServer): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return portOf(server);
}

/** A port nobody listens on: bound once by us, then released. */
async function closedTcpPort(): Promise<number> {
  const s = createTcpServer();
  const port = await listenTcp(s);
  await new Promise((resolve) => s.close(resolve));
  return port;
}

const servers: { close(): unknown }[] = [];
afterAll(() => {
  for (const s of servers) s.close();
});

describe('tcp probe', () => {
  it('is ok when the port accepts and refused when nobody listens', async () => {
    const server = createTcpServer((socket) => socket.destroy());
    servers.push(server);
    const port = await listenTcp(server);
    const up = await probe(new TcpProber(), target(port));
    expect(up.ok).toBe(true);
    expect(up.durationMs).toBeLessThan(100);

    const down = await probe(new TcpProber(), target(await closedTcpPort()));
    expect(down).toMatchObject({ ok: false, reason: 'refused', detail: 'connection refused (ECONNREFUSED)' });
    expect(down.durationMs).toBeLessThan(100);
  });
});

describe('a probe whose answer came in time while the main thread was busy', () => {
  it('is ok, not a timeout: a late timeout lets the waiting answer be read first', async () => {
    const server = createTcpServer((socket) => socket.destroy());
    servers.push(server);
    const port = await listenTcp(server);
    const results: string[] = [];
    for (let i = 0; i < 8; i++) {
      const running = runProbe(new TcpProber(), target(port), 30);
      // Busy for 150 ms past the start (a large reload or scrape): the connect completes in the
      // kernel meanwhile, and the 30 ms timer is due when the loop comes back.
      const t0 = Date.now();
      while (Date.now() - t0 < 150);
      const r = await running.result;
      await running.finished;
      results.push(r.ok ? 'ok' : r.reason);
    }
    // Before: the timer ran first in the loop turn, every other probe a timeout.
    expect(results).toEqual(Array(8).fill('ok'));
  });

  it('still times out, once, when no answer comes (a late timer waits one loop turn only)', async () => {
    const never: Prober = { probe: () => new Promise(() => {}) };
    const running = runProbe(never, target(1), 20);
    const t0 = Date.now();
    while (Date.now() - t0 < 60);
    const r = await running.result;
    expect(r).toMatchObject({ ok: false, reason: 'timeout', detail: 'no answer within 20 ms' });
    expect(r.durationMs).toBeLessThan(1000); // the busy 60 ms and one loop turn, not a wait for another timeout
  });
});

describe('IPv6 reals', () => {
  it('tcp, http (Host header in brackets) and udp work on ::1', async () => {
    const hosts: (string | undefined)[] = [];
    const server = createHttpServer((req, res) => {
      hosts.push(req.headers.host);
      res.end('ok');
    });
    servers.push({ close: () => server.close() && server.closeAllConnections() });
    await new Promise<void>((resolve) => server.listen(0, '::1', resolve));
    const port = portOf(server);
    expect((await probe(new TcpProber(), target(port, {}, '::1'))).ok).toBe(true);
    expect((await probe(new HttpProber('http'), target(port, { type: 'http' }, '::1'))).ok).toBe(true);
    expect(hosts).toEqual([`[::1]:${port}`]);

    const echo = createSocket('udp6');
    echo.on('message', (msg, rinfo) => echo.send(msg, rinfo.port, rinfo.address));
    servers.push(echo);
    await new Promise<void>((resolve) => echo.bind(0, '::1', resolve));
    expect((await probe(new UdpProber(), target(portOf(echo), { type: 'udp', payload: 'x', expectPayload: 'x' }, '::1'))).ok).toBe(true);
  });
});

describe('http probe', () => {
  const seen: { path: string; host: string | undefined }[] = [];
  const handler: RequestListener = (req, res) => {
    seen.push({ path: req.url ?? '', host: req.headers.host });
    if (req.url === '/ok') return void res.end('status: all good\n');
    if (req.url === '/error') return void res.writeHead(500).end('broken');
    if (req.url === '/never') return; // holds the request open: the probe must time out
    if (req.url === '/stream') return void res.writeHead(200).write('status: READY\n'); // and never ends
    // The text past the first 64 KiB, in one write (the kernel may hand it over in one chunk).
    if (req.url === '/late') return void res.end(`${'x'.repeat(BODY_LIMIT_BYTES)}READY`);
    // The text across the 64 KiB line: its first byte inside, the rest after.
    if (req.url === '/edge') return void res.end(`${'x'.repeat(BODY_LIMIT_BYTES - 1)}READY`);
    res.writeHead(404).end();
  };
  let port = 0;
  beforeAll(async () => {
    const server = createHttpServer(handler);
    servers.push({ close: () => server.close() && server.closeAllConnections() });
    port = await listenTcp(server);
  });
  const http = new HttpProber('http');

  it('200 with the expected body substring is ok; the Host header defaults to the address', async () => {
    const r = await probe(http, target(port, { type: 'http', path: '/ok', expectBody: 'all good' }));
    expect(r.ok).toBe(true);
    expect(seen.at(-1)).toEqual({ path: '/ok', host: `127.0.0.1:${port}` });
    const withHost = await probe(http, target(port, { type: 'http', path: '/ok', host: 'www.example.test' }));
    expect(withHost.ok).toBe(true);
    expect(seen.at(-1)!.host).toBe('www.example.test');
  });

  it('500 fails with reason status; a 500 listed in expectStatus is ok', async () => {
    const r = await probe(http, target(port, { type: 'http', path: '/error' }));
    expect(r).toMatchObject({ ok: false, reason: 'status', detail: 'HTTP 500, expected 200' });
    const listed = await probe(http, target(port, { type: 'http', path: '/error', expectStatus: [200, 500] }));
    expect(listed.ok).toBe(true);
  });

  it('a body without the expected substring fails with reason body', async () => {
    const r = await probe(http, target(port, { type: 'http', path: '/ok', expectBody: 'READY' }));
    expect(r).toMatchObject({ ok: false, reason: 'body' });
    expect(r.ok ? '' : r.detail).toContain('READY');
  });

  it('expectBody is searched as the body arrives, in exactly its first 64 KiB', async () => {
    // A streaming health page that sends the text and keeps the response open passes at once.
    const started = performance.now();
    const running = runProbe(http, target(port, { type: 'http', path: '/stream', expectBody: 'READY' }), 2000);
    expect(await running.result).toMatchObject({ ok: true });
    expect(performance.now() - started).toBeLessThan(1000);
    const late = await probe(http, target(port, { type: 'http', path: '/late', expectBody: 'READY' }));
    expect(late).toMatchObject({ ok: false, reason: 'body' });
    expect(late.ok ? '' : late.detail).toContain('in its first 64 KiB');
    expect(await probe(http, target(port, { type: 'http', path: '/edge', expectBody: 'READY' }))).toMatchObject({ ok: false, reason: 'body' });
    expect(await probe(http, target(port, { type: 'http', path: '/edge', expectBody: 'xR' }))).toMatchObject({ ok: true });
  });

  it('a server that never answers fails with reason timeout within timeout + 100 ms', async () => {
    const started = performance.now();
    const running = runProbe(http, target(port, { type: 'http', path: '/never' }), 300);
    const r = await running.result;
    const resultMs = performance.now() - started;
    await running.finished; // the prober let go of its socket after the abort
    const finishedMs = performance.now() - started;
    expect(r).toMatchObject({ ok: false, reason: 'timeout' });
    expect(resultMs).toBeGreaterThanOrEqual(299);
    expect(resultMs).toBeLessThan(400);
    expect(r.durationMs).toBeLessThan(400);
    expect(finishedMs).toBeLessThan(400);
  });

  it('sends a path with non-ASCII characters percent-encoded as UTF-8', async () => {
    expect((await probe(http, target(port, { type: 'http', path: '/café/健康' }))).ok).toBe(false); // 404 from the handler
    expect(seen.at(-1)!.path).toBe('/caf%C3%A9/%E5%81%A5%E5%BA%B7');
  });

  it('reads what curl and HAProxy read: bare-LF line ends and a folded header (nc or busybox health endpoints)', async () => {
    const raw = createTcpServer((socket) => {
      socket.once('data', () => socket.end('HTTP/1.0 200 OK\nContent-Type: text/plain\nX-Note: one\n  two\n\nREADY\n'));
    });
    servers.push(raw);
    const rawPort = await listenTcp(raw);
    const r = await probe(http, target(rawPort, { type: 'http', path: '/', expectBody: 'READY' }));
    expect(r).toMatchObject({ ok: true });
  });

  it('refused when nobody listens', async () => {
    const r = await probe(http, target(await closedTcpPort(), { type: 'http' }));
    expect(r).toMatchObject({ ok: false, reason: 'refused' });
  });

  it('sends the bytes node:http sent: header names and order, the Host header in Latin-1; a Host beyond Latin-1 is an error', async () => {
    const requests: string[] = [];
    const raw = createTcpServer((socket) => {
      let text = '';
      socket.on('data', (d) => {
        text += d.toString('latin1');
        if (!text.includes('\r\n\r\n')) return;
        requests.push(text);
        socket.end('HTTP/1.1 200 OK\r\n\r\n');
      });
    });
    servers.push(raw);
    const rawPort = await listenTcp(raw);
    expect((await probe(http, target(rawPort, { type: 'http', path: '/healthz' }))).ok).toBe(true);
    expect((await probe(http, target(rawPort, { type: 'http', path: '/x y', host: 'bücher.example' }))).ok).toBe(true);
    expect(requests).toEqual([
      `GET /healthz HTTP/1.1\r\nhost: 127.0.0.1:${rawPort}\r\nuser-agent: dsrlb-health\r\naccept: */*\r\nconnection: close\r\n\r\n`,
      'GET /x%20y HTTP/1.1\r\nhost: b\xfccher.example\r\nuser-agent: dsrlb-health\r\naccept: */*\r\nconnection: close\r\n\r\n',
    ]);
    const r = await probe(http, target(rawPort, { type: 'http', host: '健康.example' }));
    expect(r).toMatchObject({ ok: false, reason: 'error', detail: 'Invalid character in header content ["host"]' });
    expect(requests).toHaveLength(2);
  });
});

describe('https probe', () => {
  // A self-signed certificate made with the openssl CLI: the probe must accept it (no verification).
  let port = 0;
  let dir = '';
  const serverNames: (string | false | null)[] = [];
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsrlb-health-tls-'));
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
      '-subj', '/CN=real.example.test', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
    ], { stdio: 'ignore' });
    const server = createHttpsServer({ key: readFileSync(join(dir, 'key.pem')), cert: readFileSync(join(dir, 'cert.pem')) }, (req, res) => {
      if (req.url === '/healthz') return void res.end('ok');
      res.writeHead(503).end('starting');
    });
    server.on('secureConnection', (socket) => serverNames.push(socket.servername));
    servers.push({ close: () => server.close() && server.closeAllConnections() });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = portOf(server);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const https = new HttpProber('https');

  it('accepts a self-signed certificate and checks status and body', async () => {
    expect((await probe(https, target(port, { type: 'https', path: '/healthz', expectBody: 'ok' }))).ok).toBe(true);
    expect(await probe(https, target(port, { type: 'https', path: '/other' }))).toMatchObject({ ok: false, reason: 'status', detail: 'HTTP 503, expected 200' });
  });

  it('names the Host header\'s server in the TLS handshake (SNI), as node:https did; none for an address', async () => {
    serverNames.length = 0;
    expect((await probe(https, target(port, { type: 'https', path: '/healthz', host: 'www.example.test:8443' }))).ok).toBe(true);
    expect((await probe(https, target(port, { type: 'https', path: '/healthz' }))).ok).toBe(true);
    expect((await probe(https, target(port, { type: 'https', path: '/healthz', host: '[2001:db8::1]:443' }))).ok).toBe(true);
    expect(serverNames).toEqual(['www.example.test', false, false]);
  });

  it('plain http to a TLS port is not ok', async () => {
    const r = await probe(new HttpProber('http'), target(port, { type: 'http', path: '/healthz' }));
    expect(r.ok).toBe(false);
  });
});

describe('udp probe', () => {
  let port = 0;
  beforeAll(async () => {
    const echo: UdpSocket = createSocket('udp4');
    echo.on('message', (msg, rinfo) => echo.send(Buffer.concat([Buffer.from('pong:'), msg]), rinfo.port, rinfo.address));
    servers.push(echo);
    await new Promise<void>((resolve) => echo.bind(0, '127.0.0.1', resolve));
    port = portOf(echo);
  });
  const udp = new UdpProber();

  it('an echo server is ok, with or without an expected substring', async () => {
    expect((await probe(udp, target(port, { type: 'udp', payload: 'hello' }))).ok).toBe(true);
    expect((await probe(udp, target(port, { type: 'udp', payload: 'hello', expectPayload: 'pong:hello' }))).ok).toBe(true);
  });

  it('a reply without the expected substring fails with reason body', async () => {
    const r = await probe(udp, target(port, { type: 'udp', payload: 'hello', expectPayload: 'READY' }));
    expect(r).toMatchObject({ ok: false, reason: 'body' });
  });

  it('a connect that fails (here EACCES: broadcast without SO_BROADCAST; in a lab, no route) is a failed probe, not a thrown error', async () => {
    const r = await probe(udp, target(9, { type: 'udp', payload: 'hello' }, '255.255.255.255'));
    expect(r).toMatchObject({ ok: false });
    expect(r).toMatchObject({ reason: 'error', detail: expect.stringMatching(/EACCES/) });
  });

  it('no listener: refused at once through ICMP port unreachable', async () => {
    const s = createSocket('udp4');
    await new Promise<void>((resolve) => s.bind(0, '127.0.0.1', resolve));
    const closedPort = portOf(s);
    await new Promise<void>((resolve) => s.close(resolve));
    const r = await probe(udp, target(closedPort, { type: 'udp', payload: 'hello' }));
    expect(r).toMatchObject({ ok: false, reason: 'refused' });
    expect(r.durationMs).toBeLessThan(100);
  });
});

/**
 * The background `sleep` of an exec check, 50 ms after its probe: gone, or a zombie waiting for a
 * reaper (a container's PID 1 may not reap), so not running. (sh): the background job's fork,
 * killed before it ran sleep.
 */
async function expectNotRunning(pid: number): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 50));
  const stat = existsSync(`/proc/${pid}/stat`) ? readFileSync(`/proc/${pid}/stat`, 'utf8') : '';
  expect(stat === '' || /^\d+ \((sleep|sh)\) Z/.test(stat)).toBe(true);
}

describe('exec probe', () => {
  const exec = new ExecProber();
  const execTarget = (command: string): ProbeTarget => ({ ...target(8080, { type: 'exec', command }), address: '127.0.0.7' });

  it('exit 0 is ok, exit 3 fails with reason exit and the output', async () => {
    expect((await probe(exec, execTarget('exit 0'))).ok).toBe(true);
    const r = await probe(exec, execTarget('echo not ready >&2; exit 3'));
    expect(r).toMatchObject({ ok: false, reason: 'exit', detail: 'exit status 3: not ready' });
  });

  it('sees DSRLB_REAL, DSRLB_PORT, DSRLB_VIP and DSRLB_SERVICE', async () => {
    const r = await probe(exec, execTarget('echo "$DSRLB_REAL $DSRLB_PORT $DSRLB_VIP $DSRLB_SERVICE"; exit 9'));
    expect(r).toMatchObject({ ok: false, reason: 'exit', detail: 'exit status 9: 127.0.0.7 8080 10.0.0.100 web' });
    const ok = await probe(exec, execTarget('[ "$DSRLB_REAL" = 127.0.0.7 ] && [ "$DSRLB_PORT" = 8080 ] && [ "$DSRLB_SERVICE" = web ]'));
    expect(ok.ok).toBe(true);
  });

  it('a timeout kills the whole process group, sleep 10 included', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-health-exec-'));
    try {
      const pidFile = join(dir, 'sleep.pid');
      const started = performance.now();
      const r = await probe(exec, execTarget(`sleep 10 & echo $! > ${pidFile}; wait`), 300);
      expect(r).toMatchObject({ ok: false, reason: 'timeout' });
      expect(performance.now() - started).toBeLessThan(400);
      const pid = Number(readFileSync(pidFile, 'utf8'));
      expect(pid).toBeGreaterThan(1);
      await expectNotRunning(pid);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a timeout also kills what left the shell\'s group: timeout(1) wrapping the check (timeout 30 curl ...)', async () => {
    const marker = `4${Math.floor(Math.random() * 1e6)}.5`; // an argument no other sleep has
    const r = await probe(exec, execTarget(`timeout 30 sleep ${marker}; true`), 300);
    expect(r).toMatchObject({ ok: false, reason: 'timeout' });
    await new Promise((resolve) => setTimeout(resolve, 100));
    const left = execFileSync('ps', ['-eo', 'stat=,args='], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes(marker) && !/^\s*Z/.test(l));
    expect(left).toEqual([]);
  });

  it('the command inherits no descriptor the daemon holds: a raw socket opened without close-on-exec stays behind', async () => {
    const raw = createRequire(import.meta.url)('raw-socket') as { createSocket(o: { protocol: number }): { close(): void } };
    // By target, not by number: the listing's own directory descriptor takes a number that the socket reuses.
    const sockets = () => readdirSync('/proc/self/fd').map((fd) => readlinkSafe(`/proc/self/fd/${fd}`)).filter((l) => l.startsWith('socket:'));
    const before = new Set(sockets());
    const icmp = raw.createSocket({ protocol: 1 }); // as the icmp probe opens it (needs root, as the tests do)
    try {
      // The raw socket, and any other a test before this one opened meanwhile (a late probe): none may be inherited.
      const opened = sockets().filter((l) => !before.has(l));
      expect(opened.length).toBeGreaterThanOrEqual(1);
      const r = await probe(exec, execTarget(`ls -l /proc/$$/fd | grep -cF ${opened.map((o) => `-e '${o}'`).join(' ')} ; exit 7`));
      expect(r).toMatchObject({ ok: false, reason: 'exit', detail: 'exit status 7: 0' });
    } finally {
      icmp.close();
    }
  });

  it('a child left running in the background does not delay the verdict and is killed', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-health-exec-'));
    try {
      const pidFile = join(dir, 'sleep.pid');
      const started = performance.now();
      const r = await probe(exec, execTarget(`sleep 10 & echo $! > ${pidFile}; exit 0`), 1000);
      expect(r.ok).toBe(true);
      expect(performance.now() - started).toBeLessThan(200);
      const pid = Number(readFileSync(pidFile, 'utf8'));
      await expectNotRunning(pid);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a background child with its output redirected (no pipe held) is killed when the shell exits too', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-health-exec-'));
    try {
      const pidFile = join(dir, 'sleep.pid');
      const r = await probe(exec, execTarget(`sleep 10 >/dev/null 2>&1 & echo $! > ${pidFile}; exit 0`), 1000);
      expect(r.ok).toBe(true);
      const pid = Number(readFileSync(pidFile, 'utf8'));
      expect(pid).toBeGreaterThan(1);
      await expectNotRunning(pid);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('icmp probe (raw sockets: runs as root)', () => {
  it('127.0.0.1 and ::1 answer; the shared sockets close when no probe waits', async () => {
    expect(process.getuid?.()).toBe(0);
    const icmp = new IcmpProber();
    const v4 = await probe(icmp, target(0, { type: 'icmp' }));
    expect(v4.ok).toBe(true);
    const v6 = await probe(icmp, target(0, { type: 'icmp' }, '::1'));
    expect(v6.ok).toBe(true);
    expect(icmp.pending).toBe(0);
  });

  it('100 concurrent pings to 127.0.20.1..100 share one socket and all match their replies', async () => {
    const icmp = new IcmpProber();
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) => probe(icmp, target(0, { type: 'icmp' }, `127.0.20.${i + 1}`))),
    );
    expect(results.filter((r) => r.ok).length).toBe(100);
    expect(Math.max(...results.map((r) => r.durationMs))).toBeLessThan(500);
    expect(icmp.pending).toBe(0);
  });

  it('a socket error closes the socket (raw-socket leaves it open after a receive error) and the next probe opens another', async () => {
    const icmp = new IcmpProber();
    const sockets = () => readdirSync('/proc/self/fd').filter((fd) => readlinkSafe(`/proc/self/fd/${fd}`).startsWith('socket:')).length;
    const before = sockets();
    type Channel = { socket: { emit(e: string, err: Error): void } | null; open(): { emit(e: string, err: Error): void } };
    const channel = (icmp as unknown as { v4: Channel }).v4;
    const socket = channel.open();
    expect(sockets()).toBe(before + 1);
    // As raw-socket's receive path reports one: 'error' without closing.
    socket.emit('error', new Error('recv failed'));
    await new Promise((r) => setTimeout(r, 20));
    expect(channel.socket).toBeNull();
    expect(sockets()).toBe(before);
    expect((await probe(icmp, target(0, { type: 'icmp' }))).ok).toBe(true);
    expect(icmp.pending).toBe(0);
  });

  it('an address that does not answer fails with timeout (or unreachable), on time', async () => {
    const icmp = new IcmpProber();
    // TEST-NET-1 (RFC 5737): nothing answers; without a route the send fails as unreachable.
    const r = await probe(icmp, target(0, { type: 'icmp' }, '192.0.2.200'), 300);
    expect(r.ok).toBe(false);
    expect(['timeout', 'unreachable']).toContain(r.ok ? '' : r.reason);
    expect(r.durationMs).toBeLessThan(400);
    expect(icmp.pending).toBe(0);
  });
});
