// The metrics and admin listeners under load: a connection limit Node enforces at accept (the ones
// over it closed at once, logged; the ones under it still answered), a connection that sends
// nothing closed after the headers timeout while a kept-alive one survives it, and concurrent
// /metrics and /plan-input requests sharing one render / one collection of the loops' flows.
// Short limits are injected so that every wait is well under a second.

import { connect, type Socket } from 'node:net';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { Daemon } from '../../src/control/daemon.js';
import { ADMIN_LIMITS, isLoopback, METRICS_LIMITS, sameHost, sourceKey, startAdminServer, startMetricsServer, type ListenerLimits } from '../../src/control/http-servers.js';
import { createLogger } from '../../src/control/logger.js';

const LIMITS: ListenerLimits = {
  maxConnections: 3,
  perSource: 3,
  loopbackReserve: 0,
  headersTimeoutMs: 150,
  requestTimeoutMs: 150,
  keepAliveTimeoutMs: 2_000,
  idleTimeoutMs: 5_000,
  timeoutCheckIntervalMs: 20,
};

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (v: T) => void;
  reject: (e: Error) => void;
}
function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

/** A daemon stand-in with what the two listeners read; renders and flow collections are settled by the test. */
function standIn() {
  const logLines: string[] = [];
  const renders: Deferred<string>[] = [];
  const collections: Deferred<unknown>[] = [];
  const refused: string[] = [];
  const fake = {
    config: { metrics: { listen: { host: '127.0.0.1', port: 0 } }, admin: { listen: { host: '127.0.0.1', port: 0 }, tokenFile: null } },
    log: createLogger((line) => logLines.push(line)),
    adminToken: null,
    loopHealthy: () => true,
    metrics: {
      contentType: 'text/plain; version=0.0.4; charset=utf-8',
      httpRefused: { inc: (labels: { listener: string }) => refused.push(labels.listener) },
      text: () => {
        const d = deferred<string>();
        renders.push(d);
        return d.promise;
      },
    },
    configPath: '/etc/dsrlb/dsrlb.yaml',
    configText: 'interface: eth0\n',
    reals: [{ identity: 'web', address: '10.0.0.11', state: 'active' }] as unknown[],
    planReals: () => fake.reals,
    liveFlows: () => {
      const d = deferred<unknown>();
      collections.push(d);
      return d.promise;
    },
  };
  return { fake, daemon: fake as unknown as Daemon, logLines, renders, collections, refused };
}

const servers: Server[] = [];
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  // Answers a failed test left pending would hold close() until the hook's timeout.
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => (s.close(r), s.closeAllConnections()))));
});

async function started(start: Promise<Server>): Promise<{ server: Server; port: number }> {
  const server = await start;
  servers.push(server);
  return { server, port: (server.address() as AddressInfo).port };
}

function until(what: string, test: () => boolean | Promise<boolean>, withinMs = 1_000): Promise<void> {
  const end = Date.now() + withinMs;
  return new Promise((resolve, reject) => {
    const look = async (): Promise<void> => {
      if (await test()) resolve();
      else if (Date.now() > end) reject(new Error(`not within ${withinMs} ms: ${what}`));
      else setTimeout(() => void look(), 5);
    };
    void look();
  });
}

function connections(server: Server): Promise<number> {
  return new Promise((resolve, reject) => server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
}

/** A connected socket, with whether the server closed it and what it sent. */
async function open(port: number, localAddress?: string): Promise<{ socket: Socket; closed: () => boolean; received: () => string; closedAt: Promise<number> }> {
  const socket = connect({ port, host: '127.0.0.1', localAddress });
  sockets.push(socket);
  let closed = false;
  let received = '';
  socket.on('data', (c: Buffer) => (received += c.toString()));
  socket.on('error', () => undefined); // a refused connection may be reset
  const closedAt = new Promise<number>((resolve) => socket.on('close', () => ((closed = true), resolve(Date.now()))));
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return { socket, closed: () => closed, received: () => received, closedAt };
}

/** One request on a raw socket and its answer (the listeners send a Content-Length). */
function exchange(socket: Socket, path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (c: Buffer): void => {
      text += c.toString();
      const end = text.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))?.[1] ?? NaN);
      if (text.length - end - 4 < length) return;
      socket.off('data', onData);
      resolve({ status: Number(text.slice(9, 12)), body: text.slice(end + 4, end + 4 + length) });
    };
    socket.on('data', onData);
    socket.once('close', () => reject(new Error(`closed before the answer: ${JSON.stringify(text)}`)));
    socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
  });
}

/** Resolves once `server` has seen `n` more requests and each handler has run up to its first wait. */
function requestsSeen(server: Server, n: number): Promise<void> {
  return new Promise((resolve) => {
    let seen = 0;
    const onRequest = (): void => {
      if (++seen < n) return;
      server.off('request', onRequest);
      setImmediate(resolve);
    };
    server.on('request', onRequest);
  });
}

describe('listener limits in force', () => {
  it('hold far fewer connections than the unit\'s 65,536 descriptors, a silent one 3-4 s', () => {
    expect(METRICS_LIMITS.maxConnections).toBe(64);
    expect(ADMIN_LIMITS.maxConnections).toBe(32);
    for (const l of [METRICS_LIMITS, ADMIN_LIMITS]) {
      expect([l.headersTimeoutMs, l.requestTimeoutMs, l.timeoutCheckIntervalMs]).toEqual([3_000, 10_000, 1_000]);
      expect(l.keepAliveTimeoutMs).toBeLessThan(l.headersTimeoutMs);
    }
  });
});

describe('connection limit', () => {
  it('closes connections over the limit at once, logs them once, answers on the ones held, and takes new ones when some close', async () => {
    const { daemon, logLines, renders, refused } = standIn();
    const { server, port } = await started(startMetricsServer(daemon, LIMITS));
    const held = [];
    for (let i = 0; i < LIMITS.maxConnections; i++) held.push(await open(port));
    await until('the server holds the first 3', async () => (await connections(server)) === 3);

    const over = [];
    for (let i = 0; i < 5; i++) over.push(await open(port));
    await Promise.all(over.map((o) => o.closedAt));
    expect(over.map((o) => o.received())).toEqual(['', '', '', '', '']);
    expect(held.map((h) => h.closed())).toEqual([false, false, false]);
    // The first refusal is logged at once with its peer; the next ones are counted for the minute's summary.
    const refusals = logLines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.level === 'warn');
    expect(refusals).toEqual([expect.objectContaining({ msg: 'metrics listener holds its limit of connections: refusing new ones', maxConnections: 3, from: '127.0.0.1' })]);
    // Each one counted in dsrlb_http_connections_refused_total{listener="metrics"}.
    expect(refused).toEqual(['metrics', 'metrics', 'metrics', 'metrics', 'metrics']);

    const answer = exchange(held[0]!.socket, '/metrics');
    await until('a render was asked for', () => renders.length === 1);
    renders[0]!.resolve('dsrlb_up 1\n');
    expect(await answer).toEqual({ status: 200, body: 'dsrlb_up 1\n' });

    held[1]!.socket.destroy();
    held[2]!.socket.destroy();
    await until('the server let two go', async () => (await connections(server)) === 1);
    const fresh = [await open(port), await open(port)];
    await until('the server holds the new ones', async () => (await connections(server)) === 3);
    const again = exchange(fresh[1]!.socket, '/metrics');
    await until('a second render was asked for', () => renders.length === 2);
    renders[1]!.resolve('dsrlb_up 1\n');
    expect((await again).status).toBe(200);
    expect(fresh.map((f) => f.closed())).toEqual([false, false]);
  });
});

describe('limits by peer address', () => {
  it('tells loopback peers from others', () => {
    expect(['127.0.0.1', '127.1.2.3', '::1', '::ffff:127.0.0.1'].map(isLoopback)).toEqual([true, true, true, true]);
    expect(['10.0.0.1', '::ffff:10.0.0.1', '2001:db8::1', '::', '128.0.0.1', ''].map(isLoopback)).toEqual([false, false, false, false, false, false]);
    // The CLI on the LB to an admin API on the host's own address connects from that address.
    expect(sameHost('10.0.0.5', '10.0.0.5')).toBe(true);
    expect(sameHost('10.0.0.6', '10.0.0.5')).toBe(false);
    expect(sameHost('', '')).toBe(false);
  });

  it('counts an IPv6 peer by its /64 (one host may use any address of it), an IPv4 peer by its address', () => {
    expect(sourceKey('2001:db8:1:2:aaaa::1')).toBe(sourceKey('2001:db8:1:2::bbbb'));
    expect(sourceKey('2001:db8:1:2::1')).toBe('2001:db8:1:2::/64');
    expect(sourceKey('2001:db8:1:3::1')).not.toBe(sourceKey('2001:db8:1:2::1'));
    expect(sourceKey('fe80::1')).toBe('fe80::/64');
    expect(sourceKey('10.0.0.1')).toBe('10.0.0.1');
    expect(sourceKey('::ffff:10.0.0.1')).toBe('::ffff:10.0.0.1');
  });

  it('lets one address hold perSource connections, all others together leave the loopback reserve free, and counts what it closes', async () => {
    const { daemon, logLines, refused } = standIn();
    // 127.0.0.2-4 stand in for other hosts: only 127.0.0.1 counts as loopback here.
    const limits: ListenerLimits = { ...LIMITS, maxConnections: 6, perSource: 2, loopbackReserve: 2, local: (a) => a === '127.0.0.1' };
    const { server, port } = await started(startMetricsServer(daemon, limits));
    const a = [await open(port, '127.0.0.2'), await open(port, '127.0.0.2'), await open(port, '127.0.0.2')];
    await a[2]!.closedAt;
    const b = [await open(port, '127.0.0.3'), await open(port, '127.0.0.3')];
    // Four held by others: a fifth from a third address would take the reserve.
    const c = await open(port, '127.0.0.4');
    await c.closedAt;
    // The operator on the LB gets in (before, silent connections from elsewhere shut it out).
    const local = [await open(port), await open(port)];
    await until('the server holds 4 + 2', async () => (await connections(server)) === 6);
    expect((await exchange(local[1]!.socket, '/healthz')).status).toBe(200);
    expect([...a.slice(0, 2), ...b].map((x) => x.closed())).toEqual([false, false, false, false]);
    expect(refused).toEqual(['metrics', 'metrics']);
    const warnings = logLines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.level === 'warn');
    expect(warnings).toEqual([expect.objectContaining({ msg: 'metrics listener: one address holds its limit of connections: refusing its new ones', from: '127.0.0.2', perSource: 2 })]);
    // (The refusal at the others' share is counted in the minute's summary: one log line a minute.)
    // One of .3's closes: .4 gets its slot.
    b[0]!.socket.destroy();
    await until('the server let it go', async () => (await connections(server)) === 5);
    const d = await open(port, '127.0.0.4');
    await until('the server holds it', async () => (await connections(server)) === 6);
    expect((await exchange(d.socket, '/healthz')).status).toBe(200);
  });

  it('in force: 16 (metrics) and 8 (admin) from one address, 8 slots kept for loopback on each', () => {
    expect([METRICS_LIMITS.perSource, METRICS_LIMITS.loopbackReserve, ADMIN_LIMITS.perSource, ADMIN_LIMITS.loopbackReserve]).toEqual([16, 8, 8, 8]);
  });
});

describe('timeouts', () => {
  for (const [name, start] of [
    ['metrics', startMetricsServer],
    ['admin', startAdminServer],
  ] as const) {
    it(`${name}: closes a connection that sends nothing after the headers timeout (408), which frees its slot`, async () => {
      const { daemon } = standIn();
      const { server, port } = await started(start(daemon, LIMITS));
      const openedAt = Date.now();
      const silent = await open(port);
      const closedAt = await silent.closedAt;
      expect(closedAt - openedAt).toBeGreaterThanOrEqual(LIMITS.headersTimeoutMs - 10);
      expect(closedAt - openedAt).toBeLessThan(800);
      expect(silent.received()).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
      await until('the slot is free', async () => (await connections(server)) === 0);
    });
  }

  it('keeps a kept-alive connection idle for longer than the headers timeout (a Prometheus scrape reusing its connection)', async () => {
    const { daemon, renders } = standIn();
    const { port } = await started(startMetricsServer(daemon, LIMITS));
    const scraper = await open(port);
    for (const n of [1, 2]) {
      const answer = exchange(scraper.socket, '/metrics');
      await until('a render was asked for', () => renders.length === n);
      renders[n - 1]!.resolve(`scrape ${n}\n`);
      expect(await answer).toEqual({ status: 200, body: `scrape ${n}\n` });
      // Idle between scrapes for twice the headers timeout: only the keep-alive timeout applies.
      if (n === 1) await new Promise((r) => setTimeout(r, 2 * LIMITS.headersTimeoutMs + LIMITS.timeoutCheckIntervalMs));
    }
    expect(scraper.closed()).toBe(false);
  });
});

describe('/healthz on the metrics listener', () => {
  it('answers as the admin listener does, without a render and without the admin listener\'s slots', async () => {
    const { fake, daemon, renders } = standIn();
    const { port } = await started(startMetricsServer(daemon, LIMITS));
    const checker = await open(port);
    expect(await exchange(checker.socket, '/healthz')).toEqual({ status: 200, body: '{\n  "loop": "running"\n}\n' });
    fake.loopHealthy = () => false;
    expect(await exchange(checker.socket, '/healthz')).toEqual({ status: 503, body: '{\n  "loop": "stalled"\n}\n' });
    expect(renders).toHaveLength(0);
  });
});

describe('shared answers', () => {
  it('/metrics: concurrent scrapes share one render; a scrape after it gets a new one (nothing kept)', async () => {
    const { daemon, renders } = standIn();
    const { server, port } = await started(startMetricsServer(daemon, { ...LIMITS, maxConnections: 16 }));
    const url = `http://127.0.0.1:${port}/metrics`;
    const both = requestsSeen(server, 2);
    const [a, b] = [fetch(url), fetch(url)];
    await both;
    expect(renders).toHaveLength(1);
    renders[0]!.resolve('dsrlb_rx_packets_total 1\n');
    const answers = await Promise.all([a, b]);
    expect(answers.map((r) => r.status)).toEqual([200, 200]);
    expect(await Promise.all(answers.map((r) => r.text()))).toEqual(['dsrlb_rx_packets_total 1\n', 'dsrlb_rx_packets_total 1\n']);
    expect(answers[0]!.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');

    const third = fetch(url);
    await until('a second render was asked for', () => renders.length === 2);
    renders[1]!.resolve('dsrlb_rx_packets_total 2\n');
    expect(await (await third).text()).toBe('dsrlb_rx_packets_total 2\n');

    // A failed render fails every scrape that shared it, and the next one renders again.
    const failing = requestsSeen(server, 2);
    const [c, d] = [fetch(url), fetch(url)];
    await failing;
    expect(renders).toHaveLength(3);
    renders[2]!.reject(new Error('collect failed'));
    expect(await Promise.all([c, d].map(async (r) => [(await r).status, await (await r).text()]))).toEqual([
      [500, 'collect failed'],
      [500, 'collect failed'],
    ]);
    const after = fetch(url);
    await until('a fourth render was asked for', () => renders.length === 4);
    renders[3]!.resolve('ok 1\n');
    expect((await after).status).toBe(200);
  });

  it('/plan-input: concurrent requests share one collection of the loops\' flows and one answer; one after it collects again', async () => {
    const { fake, daemon, collections } = standIn();
    const { server, port } = await started(startAdminServer(daemon, { ...LIMITS, maxConnections: 16 }));
    const url = `http://127.0.0.1:${port}/plan-input`;
    const both = requestsSeen(server, 2);
    const [a, b] = [fetch(url), fetch(url)];
    await both;
    expect(collections).toHaveLength(1);
    collections[0]!.resolve({ count: 1, flows: 'AAAA' });
    const texts = await Promise.all([a, b].map(async (r) => (await r).text()));
    expect(texts[1]).toBe(texts[0]);
    expect(JSON.parse(texts[0]!)).toEqual({
      configPath: '/etc/dsrlb/dsrlb.yaml',
      configText: 'interface: eth0\n',
      reals: [{ identity: 'web', address: '10.0.0.11', state: 'active' }],
      flows: { count: 1, flows: 'AAAA' },
    });
    expect(collections).toHaveLength(1);

    // After the answer, a drain: the next request sees it and the loops' flows as they are now.
    fake.reals = [{ identity: 'web', address: '10.0.0.11', state: 'drain' }];
    const third = fetch(url);
    await until('a second collection was asked for', () => collections.length === 2);
    collections[1]!.resolve({ count: 0, flows: '' });
    const body = (await (await third).json()) as { reals: { state: string }[]; flows: unknown };
    expect(body.reals[0]!.state).toBe('drain');
    expect(body.flows).toEqual({ count: 0, flows: '' });
  });
});
