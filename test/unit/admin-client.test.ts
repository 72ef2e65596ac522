// How the CLI finds the admin API (--admin, else only the config's admin section, else, with no file
// at the default path, the default address) and talks to it (node:http against stand-in daemons).

import { mkdtemp, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { adminRequest, CliError, resolveAdminTarget } from '../../src/cli/admin-client.js';

async function scratch(name: string, text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-admin-'));
  const file = join(dir, name);
  await writeFile(file, text);
  return file;
}

describe('resolveAdminTarget', () => {
  it('reads only the admin section: a broken service elsewhere does not lock the operator out', async () => {
    const file = await scratch('broken.yaml', 'interface: eth0\nadmin: { listen: "127.0.0.1:19743" }\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    helthCheck: { type: tcp }\n    reals: [ { address: 10.0.1.300 } ]\n');
    expect(await resolveAdminTarget({ config: file })).toEqual({ baseUrl: 'http://127.0.0.1:19743', token: null, configFile: file });
  });

  it('reads the token file the admin section names, relative to the config', async () => {
    const file = await scratch('dsrlb.yaml', 'admin: { listen: "[::1]:19744", tokenFile: admin.token }\n');
    await writeFile(join(file, '..', 'admin.token'), 's3cret\n');
    expect(await resolveAdminTarget({ config: file })).toEqual({ baseUrl: 'http://[::1]:19744', token: 's3cret', configFile: file });
  });

  it('names every problem of a broken admin section with its path', async () => {
    const file = await scratch('bad-admin.yaml', 'admin: { listen: "127.0.0.1:99999", tokenFle: x }\n');
    const err = await resolveAdminTarget({ config: file }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CliError);
    expect((err as CliError).exitCode).toBe(1);
    const lines = (err as CliError).message.split('\n');
    expect(lines[0]).toBe('cannot find the admin API (use --admin URL):');
    expect(lines.slice(1).every((l) => l.startsWith(`${file}: admin.`))).toBe(true);
    expect(lines.some((l) => l.includes('admin.listen'))).toBe(true);
    expect(lines.some((l) => l.includes('admin.tokenFle'))).toBe(true);
  });

  it('--admin wins over the config file, whose token file is still read', async () => {
    const file = await scratch('dsrlb.yaml', 'admin: { listen: "127.0.0.1:19746", tokenFile: admin.token }\n');
    await writeFile(join(file, '..', 'admin.token'), 'tok\n');
    expect(await resolveAdminTarget({ config: file, admin: 'http://127.0.0.1:19747/' })).toEqual({ baseUrl: 'http://127.0.0.1:19747', token: 'tok' });
  });

  it('sends the config\'s token only to this host: an --admin URL elsewhere needs --token-file', async () => {
    const file = await scratch('dsrlb.yaml', 'admin: { listen: "127.0.0.1:19746", tokenFile: admin.token }\n');
    await writeFile(join(file, '..', 'admin.token'), 'tok\n');
    const elsewhere = await resolveAdminTarget({ config: file, admin: 'http://192.0.2.7:9743' });
    expect(elsewhere).toMatchObject({ baseUrl: 'http://192.0.2.7:9743', token: null });
    expect(elsewhere.tokenProblem).toMatch(/is not sent to http:\/\/192\.0\.2\.7:9743, which is not this host: name it with --token-file/);
    const named = await resolveAdminTarget({ config: file, admin: 'http://192.0.2.7:9743', tokenFile: join(file, '..', 'admin.token') });
    expect(named.token).toBe('tok');
    expect((await resolveAdminTarget({ config: file, admin: 'http://localhost:9743' })).token).toBe('tok');
    expect((await resolveAdminTarget({ config: file, admin: 'http://[::1]:9743' })).token).toBe('tok');
    // The config's own admin address, not on loopback: this host, the token goes.
    const own = await scratch('own.yaml', 'admin: { listen: "192.0.2.5:9743", tokenFile: admin.token }\n');
    await writeFile(join(own, '..', 'admin.token'), 'tok\n');
    expect((await resolveAdminTarget({ config: own, admin: 'http://192.0.2.5:9743/' })).token).toBe('tok');
  });

  it('a --token-file that cannot be read is a user error at once, even for a loopback daemon', async () => {
    const missing = join(tmpdir(), 'no-such-dir-dsrlb', 'nope.token');
    for (const admin of ['http://127.0.0.1:9743', 'http://[::1]:9743', undefined]) {
      const err = await resolveAdminTarget({ admin, tokenFile: missing }, join(tmpdir(), 'no-such-dir-dsrlb', 'dsrlb.yaml')).catch((e: unknown) => e);
      expect(err, String(admin)).toBeInstanceOf(CliError);
      expect([(err as CliError).exitCode, (err as CliError).message]).toEqual([1, `--token-file ${missing}: cannot read token file: ENOENT`]);
    }
  });

  it('falls back to the default address when the default config file does not exist', async () => {
    const target = await resolveAdminTarget({}, join(tmpdir(), 'no-such-dir-dsrlb', 'dsrlb.yaml'));
    expect(target).toEqual({ baseUrl: 'http://127.0.0.1:9743', token: null });
  });

  it('a config file named with -c that does not exist is a user error', async () => {
    const missing = join(tmpdir(), 'no-such-dir-dsrlb', 'x.yaml');
    const err = await resolveAdminTarget({ config: missing }).catch((e: unknown) => e);
    expect((err as CliError).exitCode).toBe(1);
    expect((err as CliError).message).toContain(missing);
  });
});

/** A node:http server on 127.0.0.1 answering with `handler`; the first free port of `ports` (0: any). */
async function adminServer(ports: readonly number[], handler: http.RequestListener): Promise<{ server: http.Server; port: number }> {
  for (const port of ports) {
    const server = http.createServer(handler);
    const bound = await new Promise<boolean>((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' || err.code === 'EACCES' ? resolve(false) : reject(err)));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (bound) return { server, port: (server.address() as AddressInfo).port };
  }
  throw new Error(`none of the ports ${ports.join(', ')} is free`);
}

function close(server: http.Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}

/** Ports fetch refuses (WHATWG "bad ports"); the admin API may listen on any of them. */
const FETCH_BAD_PORTS = [6000, 6665, 6666, 6667, 6668, 6669, 10080, 5060, 2049, 6697];

async function failure(p: Promise<unknown>): Promise<CliError> {
  const err = await p.then(
    () => new Error('expected a CliError'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(CliError);
  return err as CliError;
}

describe('adminRequest', () => {
  const servers: http.Server[] = [];
  afterEach(async () => {
    vi.unstubAllGlobals();
    await Promise.all(servers.splice(0).map(close));
  });

  /** A stand-in daemon: echoes the method, path, bearer token and JSON body it got. */
  async function echoDaemon(ports: readonly number[] = [0]): Promise<number> {
    const { server, port } = await adminServer(ports, (req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (chunk: string) => (body += chunk));
      req.on('end', () => {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ method: req.method, url: req.url, authorization: req.headers.authorization ?? null, contentType: req.headers['content-type'] ?? null, body: body === '' ? null : JSON.parse(body) }));
      });
    });
    servers.push(server);
    return port;
  }

  it('reaches a daemon on a port fetch refuses (6000, 10080, ...), without fetch', async () => {
    // fetch would refuse before connecting ("bad port"); the client must not use it at all.
    vi.stubGlobal('fetch', () => Promise.reject(new TypeError('fetch failed', { cause: new Error('bad port') })));
    const port = await echoDaemon([...FETCH_BAD_PORTS, 0]);
    const { status, data } = await adminRequest({ baseUrl: `http://127.0.0.1:${port}`, token: null }, 'GET', '/status');
    expect(status).toBe(200);
    expect(data).toEqual({ method: 'GET', url: '/status', authorization: null, contentType: null, body: null });
  });

  it('sends the bearer token and a JSON body, and keeps a path under the base URL', async () => {
    const port = await echoDaemon();
    const target = { baseUrl: `http://127.0.0.1:${port}/lb`, token: 's3cret' };
    const { data } = await adminRequest(target, 'PUT', '/services/web/reals/10.0.1.11/weight', { weight: 7 });
    expect(data).toEqual({ method: 'PUT', url: '/lb/services/web/reals/10.0.1.11/weight', authorization: 'Bearer s3cret', contentType: 'application/json', body: { weight: 7 } });
  });

  it('reaches a daemon on IPv6 loopback', async () => {
    const server = http.createServer((_req, res) => res.end('{"ok":true}'));
    const bound = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(0, '::1', () => resolve(true));
    });
    if (!bound) return; // no IPv6 loopback on this host
    servers.push(server);
    const port = (server.address() as AddressInfo).port;
    expect((await adminRequest({ baseUrl: `http://[::1]:${port}`, token: null }, 'GET', '/healthz')).data).toEqual({ ok: true });
  });

  it('turns each status into the exit code and one-line message the commands expect', async () => {
    const answers: Record<string, [number, string]> = {
      '/401': [401, '{"message":"a bearer token is required"}'],
      '/404': [404, '{"message":"unknown service \\"nosuch\\""}'],
      '/400': [400, '{"message":"bad weight"}'],
      '/422': [422, '{"result":"refused","problems":["services[0].port: 70000 is not a port (0..65535)"]}'],
      '/500': [500, '{"message":"state file not writable"}'],
      '/html': [502, '<html><body><h1>502 Bad Gateway</h1>\n</body></html>'],
    };
    const { server, port } = await adminServer([0], (req, res) => {
      const [status, body] = answers[req.url ?? ''] ?? [200, '{}'];
      res.statusCode = status;
      res.end(body);
    });
    servers.push(server);
    const target = { baseUrl: `http://127.0.0.1:${port}`, token: null };
    const refused = await failure(adminRequest(target, 'GET', '/401'));
    expect([refused.exitCode, refused.message]).toEqual([2, 'the daemon refused: a bearer token is required (check --token-file)']);
    // A loopback daemon is tried without the token the CLI could not read; if it wants one, say why there was none.
    const file = await scratch('unreadable-token.yaml', `admin: { listen: "127.0.0.1:${port}", tokenFile: ${join(tmpdir(), 'no-such-dir-dsrlb', 'admin.token')} }\n`);
    const resolved = await resolveAdminTarget({ config: file });
    expect(resolved.token).toBeNull();
    const noToken = await failure(adminRequest(resolved, 'GET', '/401'));
    expect([noToken.exitCode, noToken.message]).toEqual([2, `the daemon refused: a bearer token is required (cannot read token file ${join(tmpdir(), 'no-such-dir-dsrlb', 'admin.token')}: ENOENT)`]);
    const unknown = await failure(adminRequest(target, 'POST', '/404'));
    expect([unknown.exitCode, unknown.message]).toEqual([1, 'unknown service "nosuch"']);
    expect((await failure(adminRequest(target, 'PUT', '/400', { weight: 1 }))).exitCode).toBe(1);
    expect(await adminRequest(target, 'POST', '/422')).toEqual({ status: 422, data: { result: 'refused', problems: ['services[0].port: 70000 is not a port (0..65535)'] } });
    const failed = await failure(adminRequest(target, 'POST', '/500'));
    expect([failed.exitCode, failed.message]).toEqual([2, 'the daemon failed: HTTP 500 state file not writable']);
    const page = await failure(adminRequest(target, 'GET', '/html'));
    expect([page.exitCode, page.message]).toEqual([2, `${target.baseUrl} is not a dsrlb admin API: HTTP 502 502 Bad Gateway`]);
  });

  it('gives up on a daemon that does not answer, after the timeout', async () => {
    const { server, port } = await adminServer([0], () => {
      // never answers
    });
    servers.push(server);
    const target = { baseUrl: `http://127.0.0.1:${port}`, token: null };
    const err = await failure(adminRequest(target, 'GET', '/status', undefined, { timeoutMs: 200 }));
    expect(err.exitCode).toBe(2);
    expect(err.message).toBe(`cannot reach the daemon at ${target.baseUrl}: no answer within 0.2 s`);
    // A change the daemon took whole but did not answer (a reload held up): it may still be carried out.
    const change = await failure(adminRequest(target, 'POST', '/reload', undefined, { timeoutMs: 200 }));
    expect([change.exitCode, change.message]).toEqual([
      2,
      `the daemon at ${target.baseUrl} took the request but gave no answer within 0.2 s: it may still be carried out; see dsrlb status and the daemon's log`,
    ]);
  });

  it('refuses a token file whose token has whitespace in it (a header cannot carry it) as a token-file problem', async () => {
    const tokenFile = await scratch('two-line.token', 'abc\ndef\n');
    const file = await scratch('two-line-token.yaml', `admin: { listen: "127.0.0.1:9743", tokenFile: ${tokenFile} }\n`);
    const err = await failure(resolveAdminTarget({ config: file }));
    expect([err.exitCode, err.message]).toEqual([1, `token file ${tokenFile}: the token contains whitespace; a bearer token is one word (e.g. openssl rand -hex 32)`]);
  });

  it('after a 401 to a reload, says the daemon may still want the token of the file named before the edit', async () => {
    const { server, port } = await adminServer([0], (_req, res) => {
      res.statusCode = 401;
      res.end('{"message":"a valid bearer token is required"}');
    });
    servers.push(server);
    const tokenFile = await scratch('new.token', 'n3w\n');
    const file = await scratch('moved-token.yaml', `admin: { listen: "127.0.0.1:${port}", tokenFile: ${tokenFile} }\n`);
    const target = await resolveAdminTarget({ config: file });
    const err = await failure(adminRequest(target, 'POST', '/reload'));
    expect(err.message).toBe(
      `the daemon refused: a valid bearer token is required (check --token-file; if admin.tokenFile in ${file} changed since the last reload, the daemon still wants the old file's token: pass it with --token-file OLD, or send the daemon SIGHUP)`,
    );
    expect((await failure(adminRequest(target, 'GET', '/status'))).message).toBe('the daemon refused: a valid bearer token is required (check --token-file)');
  });

  it('names the reason when nothing listens, in one line', async () => {
    const port = await freePort();
    const err = await failure(adminRequest({ baseUrl: `http://127.0.0.1:${port}`, token: null }, 'GET', '/status'));
    expect(err.exitCode).toBe(2);
    expect(err.message).toBe(`cannot reach the daemon at http://127.0.0.1:${port}: ECONNREFUSED (is the daemon running? see systemctl status dsrlb (one in another network namespace, as the demo\'s: run the command there with ip netns exec))`);
  });

  it('an https URL to a plain HTTP server is an unreachable daemon, not a crash', async () => {
    const port = await echoDaemon();
    const err = await failure(adminRequest({ baseUrl: `https://127.0.0.1:${port}`, token: null }, 'GET', '/status'));
    expect(err.exitCode).toBe(2);
    expect(err.message).toMatch(new RegExp(`^cannot reach the daemon at https://127\\.0\\.0\\.1:${port}: \\S`));
    expect(err.message).not.toContain('\n');
  });
});

/** A port nothing listens on (bound, then closed). */
async function freePort(): Promise<number> {
  const { server, port } = await adminServer([0], () => undefined);
  await close(server);
  return port;
}

describe('a refused connection to an address taken from the config file', () => {
  it('hints that admin.listen may have been edited since the daemon started, and names --admin', async () => {
    const port = await freePort();
    const file = await scratch('dsrlb.yaml', `admin: { listen: "127.0.0.1:${port}" }\n`);
    const err = await failure(resolveAdminTarget({ config: file }).then((target) => adminRequest(target, 'POST', '/reload')));
    expect(err.exitCode).toBe(2);
    expect(err.message).toBe(
      `cannot reach the daemon at http://127.0.0.1:${port}: ECONNREFUSED (is the daemon running? see systemctl status dsrlb (one in another network namespace, as the demo\'s: run the command there with ip netns exec); the address is admin.listen in ${file}; ` +
        'if that was edited since the daemon started, the daemon still listens at the old address: use --admin URL)',
    );
  });

  it('says nothing of the config file when the URL came from --admin, only that no daemon may run', async () => {
    const port = await freePort();
    const file = await scratch('dsrlb.yaml', 'admin: { listen: "127.0.0.1:19745" }\n');
    const err = await failure(resolveAdminTarget({ config: file, admin: `http://127.0.0.1:${port}` }).then((target) => adminRequest(target, 'GET', '/status')));
    expect(err.message).toBe(`cannot reach the daemon at http://127.0.0.1:${port}: ECONNREFUSED (is the daemon running? see systemctl status dsrlb (one in another network namespace, as the demo\'s: run the command there with ip netns exec))`);
  });
});
