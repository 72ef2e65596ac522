// The daemon's two HTTP listeners: /metrics (Prometheus text) on metrics.listen, and the admin
// API (JSON) on admin.listen, with a bearer token required unless the admin API is on loopback.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { readFile } from 'node:fs/promises';
import { timingSafeEqual } from 'node:crypto';
import type { ListenAddress } from '../config/types.js';
import { DaemonError, type Daemon } from './daemon.js';

export function isLoopback(host: string): boolean {
  return host === '::1' || host.startsWith('127.');
}

async function listen(server: Server, at: ListenAddress): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(at.port, at.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

export async function startMetricsServer(daemon: Daemon): Promise<Server> {
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.url?.split('?')[0] === '/metrics') {
      daemon.metrics.registry
        .metrics()
        .then((text) => {
          res.writeHead(200, { 'content-type': daemon.metrics.registry.contentType });
          res.end(text);
        })
        .catch((err: Error) => {
          res.writeHead(500);
          res.end(err.message);
        });
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found: try /metrics\n');
  });
  await listen(server, daemon.config.metrics.listen);
  return server;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body, null, 2) + '\n');
}

async function readBody(req: IncomingMessage): Promise<string> {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 65536) throw new DaemonError('BODY_TOO_LARGE', 'request body too large');
  }
  return body;
}

const INTENT_VERBS: Record<string, { state: 'active' | 'drain' | 'disabled' }> = {
  drain: { state: 'drain' },
  undrain: { state: 'active' },
  disable: { state: 'disabled' },
  enable: { state: 'active' },
};

export async function startAdminServer(daemon: Daemon): Promise<Server> {
  const at = daemon.config.admin.listen;
  let token: Buffer | null = null;
  if (!isLoopback(at.host)) {
    if (!daemon.config.admin.tokenFile) {
      throw new DaemonError('ADMIN_TOKEN_REQUIRED', `admin.listen ${at.host}:${at.port} is not loopback: admin.tokenFile is required`);
    }
    token = Buffer.from((await readFile(daemon.config.admin.tokenFile, 'utf8')).trim());
    if (token.length === 0) throw new DaemonError('ADMIN_TOKEN_EMPTY', `admin.tokenFile ${daemon.config.admin.tokenFile} is empty`);
  }
  const authorized = (req: IncomingMessage): boolean => {
    if (!token) return true;
    const h = req.headers.authorization ?? '';
    const given = Buffer.from(h.startsWith('Bearer ') ? h.slice(7).trim() : '');
    return given.length === token.length && timingSafeEqual(given, token);
  };
  const server = createServer((req, res) => {
    void handle(req, res).catch((err: unknown) => {
      if (err instanceof DaemonError) {
        const status = err.code.startsWith('UNKNOWN') ? 404 : 400;
        json(res, status, { error: err.code, message: err.message });
      } else {
        json(res, 500, { error: 'INTERNAL', message: (err as Error).message });
      }
    });
  });
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://admin');
    const path = url.pathname;
    if (path === '/healthz' && req.method === 'GET') {
      const ok = daemon.loopHealthy();
      json(res, ok ? 200 : 503, { loop: ok ? 'running' : 'stalled' });
      return;
    }
    if (!authorized(req)) {
      json(res, 401, { error: 'UNAUTHORIZED', message: 'a valid bearer token is required' });
      return;
    }
    if (path === '/status' && req.method === 'GET') {
      json(res, 200, daemon.status());
      return;
    }
    if (path === '/reload' && req.method === 'POST') {
      const r = await daemon.reload();
      json(res, r.ok ? 200 : 422, { result: r.ok ? 'taken' : 'refused', problems: r.problems.map((p) => `${p.path}: ${p.message}`) });
      return;
    }
    if (path === '/plan-input' && req.method === 'GET') {
      json(res, 200, { configPath: daemon.configPath, configText: daemon.configText, flows: await daemon.liveFlows() });
      return;
    }
    if (path === '/explain' && req.method === 'GET') {
      const service = url.searchParams.get('service') ?? '';
      const client = url.searchParams.get('client') ?? '';
      const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(client);
      if (!m) throw new DaemonError('BAD_CLIENT', `client "${client}" is not IP:PORT`);
      json(res, 200, await daemon.explain(service, m[1]!, Number(m[2])));
      return;
    }
    const announce = /^\/services\/([^/]+)\/(announce|withdraw)$/.exec(path);
    if (announce && req.method === 'POST') {
      json(res, 200, await daemon.setAnnounce(decodeURIComponent(announce[1]!), announce[2] === 'announce'));
      return;
    }
    const intent = /^\/services\/([^/]+)\/reals\/([^/]+)\/(drain|undrain|disable|enable|weight)$/.exec(path);
    if (intent) {
      const service = decodeURIComponent(intent[1]!);
      const real = decodeURIComponent(intent[2]!);
      const verb = intent[3]!;
      if (verb === 'weight') {
        if (req.method !== 'PUT') throw new DaemonError('METHOD', 'use PUT for weight');
        const body = JSON.parse((await readBody(req)) || '{}') as { weight?: unknown };
        const w = body.weight;
        if (typeof w !== 'number' || !Number.isInteger(w) || w < 0 || w > 65535) {
          throw new DaemonError('BAD_WEIGHT', `weight ${JSON.stringify(w)} is not an integer 0..65535`);
        }
        json(res, 200, await daemon.setIntent(service, real, { weight: w }));
        return;
      }
      if (req.method !== 'POST') throw new DaemonError('METHOD', `use POST for ${verb}`);
      json(res, 200, await daemon.setIntent(service, real, INTENT_VERBS[verb]!));
      return;
    }
    json(res, 404, { error: 'NOT_FOUND', message: `no route ${req.method} ${path}` });
  };
  await listen(server, at);
  return server;
}
