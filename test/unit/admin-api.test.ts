// The admin API's HTTP surface over a stand-in daemon: status codes (400 for a body that is not
// JSON, 405 with Allow for a wrong method, 503 when the state file cannot be written), and the
// bearer token (scheme case-insensitive, re-read by the daemon on reload).

import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { mkdtemp, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaemonError } from '../../src/control/daemon-error.js';
import type { Daemon } from '../../src/control/daemon.js';
import { request } from 'node:http';
import { bearerToken, browserRefusal, startAdminServer } from '../../src/control/http-servers.js';

/** A raw request (fetch will not set Host), answered with its status and body. */
function raw(port: number, method: string, path: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

const calls: string[] = [];
const fake = {
  config: { admin: { listen: { host: '127.0.0.1', port: 0 }, tokenFile: null } },
  adminToken: null as Buffer | null,
  /** Stands in for re-reading the token file: the "file" holds `rotated`. */
  rotated: null as Buffer | null,
  rereads: 0,
  rereadAdminToken: async () => {
    fake.rereads++;
    if (fake.rotated === null || fake.rotated.equals(fake.adminToken ?? Buffer.alloc(0))) return false;
    fake.adminToken = fake.rotated;
    return true;
  },
  loopHealthy: () => true,
  status: () => ({ services: [] }),
  /** Stands in for a body JSON cannot hold (more than V8's largest string: 2M flows in the old format). */
  planReals: () => [],
  liveFlows: async () => ({ toJSON: () => { throw new RangeError('Invalid string length'); } }),
  configPath: '/etc/dsrlb/dsrlb.yaml',
  configText: '',
  reloads: 0,
  reloadResult: { ok: true, problems: [] } as { ok: boolean; problems: { path: string; message: string }[]; refusedBy?: string },
  reload: async () => {
    fake.reloads++;
    return fake.reloadResult;
  },
  setIntent: async (service: string, real: string, change: object) => {
    calls.push(`${service} ${real} ${JSON.stringify(change)}`);
    if (real === '10.0.0.99') throw new DaemonError('STATE_NOT_SAVED', 'nothing changed: the state file /x cannot be written');
    return { before: {}, after: change };
  },
};
let server: Server;
let base: string;

beforeAll(async () => {
  server = await startAdminServer(fake as unknown as Daemon);
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => server.close());

describe('admin API status codes', () => {
  it('answers a weight body that is not JSON with 400 BAD_BODY', async () => {
    const r = await fetch(`${base}/services/web/reals/10.0.0.11/weight`, { method: 'PUT', body: 'nope' });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: string }).error).toBe('BAD_BODY');
  });

  it('answers explain without its parameters and a weight body without "weight" with 400 and what to send', async () => {
    const e = await fetch(`${base}/explain`);
    expect(e.status).toBe(400);
    expect(((await e.json()) as { message: string }).message).toBe('explain needs ?service=SERVICE&client=IP:PORT');
    const w = await fetch(`${base}/services/web/reals/10.0.0.11/weight`, { method: 'PUT', body: '{}' });
    expect(w.status).toBe(400);
    expect(((await w.json()) as { message: string }).message).toBe('the body has no "weight": send {"weight": N}');
    // As the config file refuses unknown keys: a misspelt key is not "no change".
    for (const [body, message] of [
      ['{"weight": 5, "extra": 1}', 'unknown key "extra" in the body: send {"weight": N}'],
      ['{"weigth": 0}', 'unknown key "weigth" in the body: send {"weight": N}'],
      ['[5]', 'the body is not a JSON object: send {"weight": N}'],
      ['5', 'the body is not a JSON object: send {"weight": N}'],
    ]) {
      const r = await fetch(`${base}/services/web/reals/10.0.0.11/weight`, { method: 'PUT', body });
      expect([r.status, ((await r.json()) as { message: string }).message], body).toEqual([400, message]);
    }
  });

  it('answers a path that is not valid percent-encoding with 400 BAD_PATH, not 500', async () => {
    const r = await fetch(`${base}/services/%E0%A4%A/reals/10.0.0.11/drain`, { method: 'POST' });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: string }).error).toBe('BAD_PATH');
  });

  it('answers a wrong method with 405 and an Allow header', async () => {
    for (const [method, path, allow] of [
      ['GET', '/services/web/reals/10.0.0.11/drain', 'POST'],
      ['POST', '/services/web/reals/10.0.0.11/weight', 'PUT'],
      ['GET', '/reload', 'POST'],
      ['POST', '/status', 'GET'],
    ] as const) {
      const r = await fetch(`${base}${path}`, { method });
      expect(r.status, `${method} ${path}`).toBe(405);
      expect(r.headers.get('allow')).toBe(allow);
    }
  });

  it('answers a body over 64 KiB with 413, and a 401 with WWW-Authenticate: Bearer', async () => {
    const big = await fetch(`${base}/services/web/reals/10.0.0.11/weight`, { method: 'PUT', body: `{"weight": 1, "x": "${'x'.repeat(70_000)}"}` });
    expect(big.status).toBe(413);
    fake.adminToken = Buffer.from('t');
    const denied = await fetch(`${base}/status`);
    expect(denied.status).toBe(401);
    expect(denied.headers.get('www-authenticate')).toBe('Bearer realm="dsrlb"');
    fake.adminToken = null;
  });

  it('answers a body JSON cannot hold with a clean 500 and stays up (the head went out first, and the second answer threw)', async () => {
    const r = await fetch(`${base}/plan-input`);
    expect(r.status).toBe(500);
    expect(((await r.json()) as { message: string }).message).toBe('Invalid string length');
    expect((await fetch(`${base}/status`)).status).toBe(200);
  });

  it('refuses what a web page can send: any Origin, and without a token a Host that is a name (DNS rebinding)', async () => {
    const port = (server.address() as AddressInfo).port;
    // A page's "simple" cross-origin POST: no preflight, so without this the drain happened.
    const csrf = await raw(port, 'POST', '/services/web/reals/10.0.0.11/disable', { origin: 'http://evil.example', 'content-type': 'text/plain' });
    expect(csrf.status).toBe(403);
    expect(JSON.parse(csrf.body).message).toMatch(/requests from web pages \(Origin "http:\/\/evil\.example"\) are refused/);
    const rebound = await raw(port, 'GET', '/status', { host: `evil.example:${port}` });
    expect(rebound.status).toBe(403);
    expect(JSON.parse(rebound.body).message).toMatch(/without an admin token/);
    expect(calls.some((c) => c.includes('disabled'))).toBe(false);
    for (const host of [`127.0.0.1:${port}`, `[::1]:${port}`, `localhost:${port}`, '127.0.0.1']) expect((await raw(port, 'GET', '/status', { host })).status, host).toBe(200);
    // With a token a page cannot authenticate anyway: names are fine (an operator's --admin http://lb1:9743).
    expect(browserRefusal({ host: 'lb1.example:9743' }, false)).toBeNull();
    expect(browserRefusal({ host: 'lb1.example:9743' }, true)).toMatch(/Host "lb1.example:9743" is refused/);
    expect(browserRefusal({ host: 'lb1', origin: 'null' }, false)).toMatch(/Origin "null"/);
  });

  it('answers an intent that could not be saved with 503 STATE_NOT_SAVED and the reason', async () => {
    const r = await fetch(`${base}/services/web/reals/10.0.0.99/drain`, { method: 'POST' });
    expect(r.status).toBe(503);
    const body = (await r.json()) as { error: string; message: string };
    expect(body.error).toBe('STATE_NOT_SAVED');
    expect(body.message).toMatch(/nothing changed/);
  });
});

describe('POST /reload', () => {
  /** The daemon's config file (relative, as `dsrlb run -c dsrlb.yaml` gives it) and another file beside it. */
  async function files(): Promise<{ own: string; other: string; link: string }> {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-reload-'));
    const own = join(dir, 'dsrlb.yaml');
    const other = join(dir, 'bad1.yaml');
    await writeFile(own, 'interface: eth0\n');
    await writeFile(other, 'interface: eth0\n');
    const link = join(dir, 'current.yaml');
    await symlink(own, link);
    return { own, other, link };
  }
  const reload = async (body?: unknown): Promise<{ status: number; data: Record<string, unknown> }> => {
    const r = await fetch(`${base}/reload`, { method: 'POST', ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
    return { status: r.status, data: (await r.json()) as Record<string, unknown> };
  };

  it('answers with the path of the config file the daemon read, taken or refused', async () => {
    const { own } = await files();
    fake.configPath = own;
    fake.reloads = 0;
    expect(await reload()).toEqual({ status: 200, data: { result: 'taken', configPath: own, problems: [] } });
    fake.reloadResult = { ok: false, refusedBy: 'config', problems: [{ path: 'services[0].port', message: '70000 is not a port (0..65535)' }] };
    expect(await reload()).toEqual({ status: 422, data: { result: 'refused', refusedBy: 'config', configPath: own, problems: ['services[0].port: 70000 is not a port (0..65535)'] } });
    fake.reloadResult = { ok: true, problems: [] };
    expect(fake.reloads).toBe(2);
  });

  it('refuses (409, nothing reloaded) a reload that names a config file other than the daemon\'s, by real path', async () => {
    const { own, other, link } = await files();
    fake.configPath = own;
    fake.reloads = 0;
    const wrong = await reload({ configPath: other });
    expect(wrong.status).toBe(409);
    expect(wrong.data.error).toBe('NOT_THE_DAEMONS_CONFIG');
    expect(wrong.data.configPath).toBe(own);
    expect(wrong.data.message).toBe(
      `reload refused, nothing reloaded: ${other} is not the daemon's config file ${own} (a reload reads the daemon's own file again, never another): ` +
        `check the new file with dsrlb plan -c ${other}, then put it in place of ${own}`,
    );
    expect(fake.reloads).toBe(0);
    // The same file by another name (a symlink), by the name the CLI resolved, or as the daemon's own: taken.
    expect((await reload({ configPath: link })).status).toBe(200);
    expect((await reload({ configPath: '/nowhere/x.yaml', configRealPath: own })).status).toBe(200);
    expect((await reload({ configPath: own })).data).toEqual({ result: 'taken', configPath: own, problems: [] });
    expect(fake.reloads).toBe(3);
    // A daemon started through the symlink reads the file it points to.
    fake.configPath = link;
    expect((await reload({ configPath: own })).data).toEqual({ result: 'taken', configPath: link, problems: [] });
    expect((await reload({ configPath: other })).status).toBe(409);
  });

  it('answers a body it cannot use with 400 and what to send', async () => {
    fake.reloads = 0;
    for (const [body, message] of [
      ['nope', 'the body is not JSON: send nothing, or {"configPath": "/absolute/path"}'],
      ['{"configPath": "dsrlb.yaml"}', 'configPath "dsrlb.yaml" is not an absolute path'],
      ['{"configPath": 5}', 'configPath 5 is not an absolute path'],
    ] as const) {
      const r = await fetch(`${base}/reload`, { method: 'POST', body });
      expect(r.status, body).toBe(400);
      expect(((await r.json()) as { message: string }).message, body).toBe(message);
    }
    expect(fake.reloads).toBe(0);
  });
});

describe('bearer token', () => {
  it('takes the scheme in any case (RFC 7235) and nothing but a bearer token', () => {
    expect(bearerToken('Bearer abc')).toBe('abc');
    expect(bearerToken('bearer abc')).toBe('abc');
    expect(bearerToken('BEARER  abc ')).toBe('abc');
    expect(bearerToken('Basic abc')).toBeNull();
    expect(bearerToken('Bearer')).toBeNull();
    expect(bearerToken(undefined)).toBeNull();
  });

  it('checks the token the daemon holds now (a reload may have replaced it)', async () => {
    fake.adminToken = Buffer.from('old');
    expect((await fetch(`${base}/status`, { headers: { authorization: 'bearer old' } })).status).toBe(200);
    fake.adminToken = Buffer.from('new');
    expect((await fetch(`${base}/status`, { headers: { authorization: 'Bearer old' } })).status).toBe(401);
    expect((await fetch(`${base}/status`, { headers: { authorization: 'Bearer new' } })).status).toBe(200);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    fake.adminToken = null;
  });

  it('reads the token file again for a token it does not hold, so a rotated token works without a SIGHUP', async () => {
    fake.adminToken = Buffer.from('old');
    fake.rotated = Buffer.from('new');
    fake.rereads = 0;
    expect((await fetch(`${base}/status`)).status).toBe(401); // no token: nothing to re-read for
    expect(fake.rereads).toBe(0);
    expect((await fetch(`${base}/status`, { headers: { authorization: 'Bearer new' } })).status).toBe(200);
    expect(fake.rereads).toBe(1);
    expect(fake.adminToken.toString()).toBe('new');
    expect((await fetch(`${base}/status`, { headers: { authorization: 'Bearer old' } })).status).toBe(401);
    fake.adminToken = null;
    fake.rotated = null;
  });
});

describe('listener limits', () => {
  it('starts with the admin limits: 32 connections, 10 s for a request head and body, 5 s kept alive idle, 60 s without progress', () => {
    expect([server.maxConnections, server.headersTimeout, server.requestTimeout, server.keepAliveTimeout, server.timeout]).toEqual([32, 3_000, 10_000, 2_000, 60_000]);
  });
});
