// The daemon's two HTTP listeners: /metrics (Prometheus text) on metrics.listen, and the admin
// API (JSON) on admin.listen, with a bearer token required unless the admin API is on loopback.
// Both addresses are restart-only keys (restart-keys.ts); the token is re-read on reload.

import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { timingSafeEqual } from 'node:crypto';
import { realpath } from 'node:fs/promises';
import { isIP, type Socket } from 'node:net';
import { isAbsolute, resolve } from 'node:path';
import type { ListenAddress } from '../config/types.js';
import { formatListen, isWeight, problemLines } from '../config/validate.js';
import { clientPrefixText } from './addresses.js';
import { DaemonError, type Daemon, type IntentChange } from './daemon.js';
import { singleFlight } from './http-single-flight.js';

/**
 * How many connections one listener holds and for how long. Node 20's defaults hold a connection
 * that sends nothing 60-90 s (headersTimeout, looked for every 30 s), with no limit on how many:
 * about 1,100 new silent connections a second took all of the unit's 65,536 descriptors, and then
 * every health probe failed with EMFILE (every real down). A connection over maxConnections is
 * closed by Node as it is accepted, before a byte is read.
 */
export interface ListenerLimits {
  readonly maxConnections: number;
  /** Connections one address other than loopback may hold: one busy client cannot take every slot. */
  readonly perSource: number;
  /** Slots only loopback may take: the CLI on the LB gets in while other addresses hold the rest. */
  readonly loopbackReserve: number;
  /** Whether a peer counts as this host (a test stands in another); default sameHost. */
  readonly local?: (remote: string, local: string) => boolean;
  /** From a request's first byte (a new connection's: its accept) to the end of its head. */
  readonly headersTimeoutMs: number;
  /** From a request's first byte to the end of its body; at least headersTimeoutMs (Node refuses less). */
  readonly requestTimeoutMs: number;
  /** Between two requests on a kept-alive connection (Node adds 1 s, so the client closes first). */
  readonly keepAliveTimeoutMs: number;
  /** Nothing moving either way: a client that stops reading its answer, which Node buffers meanwhile. */
  readonly idleTimeoutMs: number;
  /** How often Node looks for requests past headersTimeoutMs or requestTimeoutMs (a request can outlive them by this). */
  readonly timeoutCheckIntervalMs: number;
}

/**
 * The timeouts both listeners share. Prometheus, the CLI and curl send a request's head at once,
 * so 3 s for it is ample even across a WAN, and a connection that sends nothing holds a slot 3-4 s
 * (at 10 s, 32 silent connections shut the admin API and its /healthz out for 10-12 s); a body (at
 * most 64 KiB here) has 10 s. Kept-alive connections idle 2 s, below the head's timeout (so a
 * client that reuses one within the Keep-Alive time it was told is not cut by that): Prometheus
 * scrapes every 15 s or more and connects again when it finds its connection closed, and a longer
 * wait would only hold slots. 60 s without progress is far beyond
 * any answer's making (the loops answer within 5 s; the CLI gives up after 15 s).
 */
const TIMEOUTS = {
  headersTimeoutMs: 3_000,
  requestTimeoutMs: 10_000,
  keepAliveTimeoutMs: 2_000,
  idleTimeoutMs: 60_000,
  timeoutCheckIntervalMs: 1_000,
} as const;

/**
 * 64 connections: a Prometheus server keeps one per target, so an HA pair, a second scraper and a
 * few curls stay under 10. At 64 descriptors of 65,536, the probes keep the rest. 16 from one
 * address: a curl loop on one host leaves the scrapers theirs.
 */
export const METRICS_LIMITS: ListenerLimits = { maxConnections: 64, perSource: 16, loopbackReserve: 8, ...TIMEOUTS };

/**
 * 32 connections: the CLI opens one per command and closes it with the answer, and the daemon
 * carries out changes one at a time (Daemon.exclusive), so commands run side by side only queue;
 * 32 leaves room for scripts running a few at once beside an operator and a /healthz checker.
 * An admin API on another address than loopback: 8 from any one address (a token or not, the
 * connection is held until its head comes), and 8 slots kept for the CLI on the LB itself.
 */
export const ADMIN_LIMITS: ListenerLimits = { maxConnections: 32, perSource: 8, loopbackReserve: 8, ...TIMEOUTS };

/** A refused connection is logged at once, then how many more each minute while they go on. */
const DROP_LOG_INTERVAL_MS = 60_000;

function limitedServer(limits: ListenerLimits, onRequest: RequestListener): Server {
  const server = createServer(
    {
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      keepAliveTimeout: limits.keepAliveTimeoutMs,
      connectionsCheckingInterval: limits.timeoutCheckIntervalMs,
    },
    onRequest,
  );
  server.maxConnections = limits.maxConnections;
  server.timeout = limits.idleTimeoutMs;
  limitBySource(server, limits);
  return server;
}

/**
 * Node's maxConnections counts every peer alike: silent connections from one address (each held
 * until its head's timeout) shut out every other client, the operator on the LB too. Here a peer
 * other than loopback may hold `perSource` connections, and all of them together leave
 * `loopbackReserve` slots free; a connection over either is closed as it is accepted and counted
 * as Node's refusals are (a 'drop' event).
 */
function limitBySource(server: Server, limits: ListenerLimits): void {
  const local = limits.local ?? sameHost;
  const bySource = new Map<string, number>();
  let remote = 0;
  server.on('connection', (socket: Socket) => {
    const from = socket.remoteAddress ?? '';
    if (local(from, socket.localAddress ?? '')) return;
    const source = sourceKey(from);
    const held = bySource.get(source) ?? 0;
    if (held >= limits.perSource || remote >= limits.maxConnections - limits.loopbackReserve) {
      socket.destroy();
      server.emit('drop', { remoteAddress: from, limit: held >= limits.perSource ? 'source' : 'remote' });
      return;
    }
    bySource.set(source, held + 1);
    remote++;
    socket.once('close', () => {
      remote--;
      const left = bySource.get(source)! - 1;
      if (left === 0) bySource.delete(source);
      else bySource.set(source, left);
    });
  });
}

/**
 * This host: loopback, or a peer whose address is the one it connected to (the CLI on the LB to an
 * admin.listen on the host's own address; Linux drops packets from outside that claim a local
 * source, so a TCP peer cannot fake it).
 */
export function sameHost(remote: string, local: string): boolean {
  return isLoopback(remote) || (remote !== '' && remote === local);
}

/** 127.0.0.0/8 and ::1, as an IPv4 or IPv4-mapped peer address. */
export function isLoopback(address: string): boolean {
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  return address === '::1' || (isIP(v4) === 4 && v4.startsWith('127.'));
}

/** What one peer is for the per-source limit: its IPv4 address, or its IPv6 /64 (one host's usual share). */
export function sourceKey(address: string): string {
  if (isIP(address) !== 6 || address.startsWith('::ffff:')) return address;
  try {
    return clientPrefixText(address, 64);
  } catch {
    return address; // a form ipaddr does not take (a zone id): the address alone
  }
}

/**
 * Logs the connections Node refused at the limit: the first at once, with the peer; then, while
 * they go on, their count once a minute (an attack refuses a thousand a second).
 */
function logDrops(server: Server, daemon: Pick<Daemon, 'log' | 'metrics'>, listener: 'metrics' | 'admin', at: ListenAddress, limits: ListenerLimits): void {
  const log = daemon.log;
  const fields = { listen: formatListen(at), maxConnections: limits.maxConnections };
  let more = 0;
  let timer: NodeJS.Timeout | null = null;
  const summary = (): void => {
    timer = null;
    if (more === 0) return;
    log.warn(`${listener} listener: ${more} more connections refused in the last minute, at its limit`, fields);
    more = 0;
    timer = setTimeout(summary, DROP_LOG_INTERVAL_MS).unref();
  };
  server.on('drop', (data?: { remoteAddress?: string; limit?: 'source' | 'remote' }) => {
    daemon.metrics.httpRefused.inc({ listener });
    if (timer !== null) {
      more++;
      return;
    }
    const from = data?.remoteAddress ?? null;
    if (data?.limit === 'source') log.warn(`${listener} listener: one address holds its limit of connections: refusing its new ones`, { ...fields, from, perSource: limits.perSource });
    else if (data?.limit === 'remote') log.warn(`${listener} listener: other hosts hold every slot not kept for this host: refusing their new ones`, { ...fields, from, remoteLimit: limits.maxConnections - limits.loopbackReserve });
    else log.warn(`${listener} listener holds its limit of connections: refusing new ones`, { ...fields, from });
    timer = setTimeout(summary, DROP_LOG_INTERVAL_MS).unref();
  });
  server.on('close', () => {
    if (timer !== null) clearTimeout(timer);
  });
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

/** An answer every request that shares it writes as is: a Buffer is sent without a copy per connection. */
function sendBytes(res: ServerResponse, status: number, contentType: string, bytes: Buffer): void {
  res.writeHead(status, { 'content-type': contentType, 'content-length': bytes.length });
  res.end(bytes);
}

export async function startMetricsServer(daemon: Daemon, limits: ListenerLimits = METRICS_LIMITS): Promise<Server> {
  // Scrapes that arrive while a render is in flight share it (0.1-0.2 s of the main thread at
  // 8,000 reals); one that arrives after gets a new render.
  const render = singleFlight(async () => Buffer.from(await daemon.metrics.text()));
  const server = limitedServer(limits, (req, res) => {
    if (req.method === 'GET' && req.url?.split('?')[0] === '/metrics') {
      render()
        .then((bytes) => sendBytes(res, 200, daemon.metrics.contentType, bytes))
        .catch((err: Error) => {
          // Too late for an answer (the head went out): end the connection, never throw from here.
          if (res.headersSent) res.destroy();
          else {
            res.writeHead(500);
            res.end(err.message);
          }
        });
      return;
    }
    // /healthz here too, as on the admin listener: a checker that reaches the metrics port needs
    // no admin access, and shares no connection slots with admin commands.
    if (req.method === 'GET' && req.url?.split('?')[0] === '/healthz') {
      healthz(res, daemon);
      return;
    }
    if (req.url?.split('?')[0] === '/metrics') {
      // HEAD as GET without a body would need the whole scrape; Prometheus only GETs.
      res.writeHead(405, { 'content-type': 'text/plain', allow: 'GET' });
      res.end(`method ${req.method ?? '?'} not allowed here: use GET\n`);
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found: try /metrics or /healthz\n');
  });
  logDrops(server, daemon, 'metrics', daemon.config.metrics.listen, limits);
  await listen(server, daemon.config.metrics.listen);
  return server;
}

/** GET /healthz, on either listener: 200 while every packet loop runs and beats, else 503. */
function healthz(res: ServerResponse, daemon: Pick<Daemon, 'loopHealthy'>): void {
  const ok = daemon.loopHealthy();
  json(res, ok ? 200 : 503, { loop: ok ? 'running' : 'stalled' });
}

/** Serialized before the head is written: a body that cannot be (too large a string) is still a clean 500. */
function json(res: ServerResponse, status: number, body: unknown, indent = 2): void {
  const text = JSON.stringify(body, null, indent) + '\n';
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** An unindented JSON answer as bytes, for sendBytes; throws as JSON.stringify does, before any head is written. */
function jsonBytes(body: unknown): Buffer {
  return Buffer.from(JSON.stringify(body) + '\n');
}

async function readBody(req: IncomingMessage): Promise<string> {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 65536) throw new DaemonError('BODY_TOO_LARGE', 'request body too large');
  }
  return body;
}

const INTENT_VERBS: Record<string, IntentChange> = {
  drain: { state: 'drain' },
  undrain: { state: 'active', from: 'drain' },
  disable: { state: 'disabled' },
  enable: { state: 'active', from: 'disabled' },
};

/** The HTTP status for a DaemonError code. */
function statusOf(code: string): number {
  if (code.startsWith('UNKNOWN')) return 404;
  if (code === 'STATE_NOT_SAVED' || code === 'LOOP_UNANSWERED') return 503;
  if (code === 'INTERNAL') return 500;
  if (code === 'BODY_TOO_LARGE') return 413;
  if (code === 'NOT_THE_DAEMONS_CONFIG') return 409;
  return 400;
}

class MethodError extends DaemonError {
  constructor(
    method: string | undefined,
    readonly allow: string,
  ) {
    super('METHOD', `method ${method ?? '?'} not allowed here: use ${allow}`);
  }
}

/** The file a path names, symlinks followed; the path itself when it cannot be resolved (gone, or not visible here). */
async function realpathOr(path: string): Promise<string> {
  return realpath(path).catch(() => path);
}

/**
 * POST /reload's optional body `{"configPath": "/abs/path", "configRealPath": "/abs/path"}`: the
 * file the caller means to load (`dsrlb reload -c FILE`, as typed and as resolved on its host).
 * A reload reads the daemon's own file (as SIGHUP), so one meant for another file is refused
 * before anything is reloaded: "reload taken" of a file that was never read told the operator
 * the new config was in force. Compared by real path on the daemon's side, so a symlink to the
 * daemon's file (or the daemon started through one) is the same file.
 */
async function checkReloadTarget(body: string, configPath: string): Promise<void> {
  if (body.trim() === '') return;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    throw new DaemonError('BAD_BODY', 'the body is not JSON: send nothing, or {"configPath": "/absolute/path"}');
  }
  const { configPath: wanted, configRealPath } = (parsed ?? {}) as { configPath?: unknown; configRealPath?: unknown };
  if (wanted === undefined) return;
  const candidates: string[] = [];
  for (const [key, value] of [['configPath', wanted], ['configRealPath', configRealPath]] as const) {
    if (value === undefined && key === 'configRealPath') continue;
    // A relative path would be read from the daemon's working directory, not the caller's.
    if (typeof value !== 'string' || !isAbsolute(value)) throw new DaemonError('BAD_BODY', `${key} ${JSON.stringify(value)} is not an absolute path`);
    candidates.push(value);
  }
  const own = resolve(configPath);
  const ownReal = await realpathOr(own);
  for (const c of candidates) if (c === own || (await realpathOr(c)) === ownReal) return;
  const given = candidates[0]!;
  throw Object.assign(
    new DaemonError(
      'NOT_THE_DAEMONS_CONFIG',
      `reload refused, nothing reloaded: ${given} is not the daemon's config file ${own} (a reload reads the daemon's own file again, never another): ` +
        `check the new file with dsrlb plan -c ${given}, then put it in place of ${own}`,
    ),
    { configPath: own },
  );
}

/**
 * Why a request that may come from a web page is refused, or null. The admin API is for the CLI
 * and scripts, which send no Origin. A page on the LB host (or behind `ssh -L`) can POST to a
 * loopback API without a token as a "simple" cross-origin request, and after DNS rebinding read
 * it under its own host name; browsers send Origin with every cross-origin request and with
 * same-origin POSTs, and the Host of a rebound name. So: no Origin, and without a token, the Host
 * an address or localhost.
 */
export function browserRefusal(headers: IncomingMessage['headers'], tokenless: boolean): string | null {
  if (headers.origin !== undefined) return `requests from web pages (Origin ${JSON.stringify(headers.origin)}) are refused: use the dsrlb CLI or curl`;
  if (!tokenless || headers.host === undefined) return null;
  const host = /^\[([0-9a-fA-F:.]+)\](?::\d+)?$/.exec(headers.host)?.[1] ?? /^([^:]+)(?::\d+)?$/.exec(headers.host)?.[1] ?? '';
  if (host.toLowerCase() === 'localhost' || isIP(host) !== 0) return null;
  return `Host ${JSON.stringify(headers.host)} is refused without an admin token: ask by address (127.0.0.1, ::1) or set admin.tokenFile`;
}

/** The bearer token of an Authorization header (the scheme is case-insensitive, RFC 7235 section 2.1). */
export function bearerToken(header: string | undefined): string | null {
  const m = /^bearer[ \t]+(\S+)[ \t]*$/i.exec(header ?? '');
  return m ? m[1]! : null;
}

export async function startAdminServer(daemon: Daemon, limits: ListenerLimits = ADMIN_LIMITS): Promise<Server> {
  const at = daemon.config.admin.listen;
  // The token is the daemon's (read at start, on every reload, and again for an unmatched one).
  const matches = (given: Buffer): boolean => {
    const token = daemon.adminToken;
    return token === null || (given.length === token.length && timingSafeEqual(given, token));
  };
  const authorized = async (req: IncomingMessage): Promise<boolean> => {
    const given = Buffer.from(bearerToken(req.headers.authorization) ?? '');
    if (matches(given)) return true;
    // A token was given that is not ours: the file may hold a rotated one.
    return given.length > 0 && (await daemon.rereadAdminToken()) && matches(given);
  };
  // Requests that arrive while one is in flight share its answer: each collection stalls every
  // packet loop while it copies its flows (0.12-0.19 s at a million flows), so `dsrlb plan` from
  // several terminals, or a client asking in parallel, would keep the loops stalled. The answer is
  // one Buffer (tens of MB at a million flows) that every request writes without a copy.
  const planInput = singleFlight(async () => {
    // The intent and health in force beside the config text: plan carries them over to the candidate.
    const head = { configPath: daemon.configPath, configText: daemon.configText, reals: daemon.planReals() };
    // Not indented: a million flows are tens of MB of base64 already.
    return jsonBytes({ ...head, flows: await daemon.liveFlows() });
  });
  const server = limitedServer(limits, (req, res) => {
    void handle(req, res).catch((err: unknown) => {
      // Too late for an answer (the head went out): end the connection, never throw from here.
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (err instanceof MethodError) {
        res.setHeader('allow', err.allow);
        json(res, 405, { error: err.code, message: err.message });
      } else if (err instanceof DaemonError) {
        const configPath = (err as { configPath?: string }).configPath;
        json(res, statusOf(err.code), { error: err.code, message: err.message, ...(configPath === undefined ? {} : { configPath }) });
      } else if (err instanceof URIError) {
        // decodeURIComponent of a SERVICE or REAL that is not valid percent-encoding: the client's mistake.
        json(res, 400, { error: 'BAD_PATH', message: `the path is not valid percent-encoding: ${req.url ?? ''}` });
      } else {
        json(res, 500, { error: 'INTERNAL', message: (err as Error).message });
      }
    });
  });
  const only = (req: IncomingMessage, allow: string): void => {
    if (req.method !== allow) throw new MethodError(req.method, allow);
  };
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? '/', 'http://admin');
    const path = url.pathname;
    if (path === '/healthz') {
      only(req, 'GET');
      healthz(res, daemon);
      return;
    }
    const refusal = browserRefusal(req.headers, daemon.adminToken === null);
    if (refusal !== null) {
      json(res, 403, { error: 'FORBIDDEN', message: refusal });
      return;
    }
    if (!(await authorized(req))) {
      res.setHeader('www-authenticate', 'Bearer realm="dsrlb"');
      json(res, 401, { error: 'UNAUTHORIZED', message: 'a valid bearer token is required' });
      return;
    }
    if (path === '/status') {
      only(req, 'GET');
      json(res, 200, daemon.status(url.searchParams.get('service') ?? undefined));
      return;
    }
    if (path === '/reload') {
      only(req, 'POST');
      await checkReloadTarget(await readBody(req), daemon.configPath);
      const r = await daemon.reload();
      // The file read (absolute, as the daemon names it): the operator sees which config was taken or refused.
      const configPath = resolve(daemon.configPath);
      json(res, r.ok ? 200 : 422, r.ok ? { result: 'taken', configPath, problems: [], warnings: r.warnings } : { result: 'refused', refusedBy: r.refusedBy, configPath, problems: problemLines(r.problems) });
      return;
    }
    if (path === '/plan-input') {
      only(req, 'GET');
      sendBytes(res, 200, 'application/json', await planInput());
      return;
    }
    if (path === '/flows') {
      only(req, 'GET');
      const param = (name: string): string | undefined => url.searchParams.get(name) ?? undefined;
      const limitText = param('limit') ?? '1000';
      if (!/^\d{1,8}$/.test(limitText)) throw new DaemonError('BAD_QUERY', `limit "${limitText}" is not a whole number (0: every flow)`);
      json(res, 200, daemon.flows({ service: param('service'), real: param('real'), client: param('client'), limit: Number(limitText) }));
      return;
    }
    if (path === '/explain') {
      only(req, 'GET');
      const service = url.searchParams.get('service');
      const client = url.searchParams.get('client');
      if (!service || !client) throw new DaemonError('BAD_QUERY', 'explain needs ?service=SERVICE&client=IP:PORT');
      json(res, 200, await daemon.explain(service, client));
      return;
    }
    const announce = /^\/services\/([^/]+)\/(announce|withdraw)$/.exec(path);
    if (announce) {
      only(req, 'POST');
      json(res, 200, await daemon.setAnnounce(decodeURIComponent(announce[1]!), announce[2] === 'announce'));
      return;
    }
    const intent = /^\/services\/([^/]+)\/reals\/([^/]+)\/(drain|undrain|disable|enable|weight)$/.exec(path);
    if (intent) {
      const service = decodeURIComponent(intent[1]!);
      const real = decodeURIComponent(intent[2]!);
      const verb = intent[3]!;
      if (verb === 'weight') {
        only(req, 'PUT');
        const text = await readBody(req);
        let body: unknown;
        try {
          body = JSON.parse(text || '{}');
        } catch {
          throw new DaemonError('BAD_BODY', 'the body is not JSON: send {"weight": N}');
        }
        if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new DaemonError('BAD_BODY', 'the body is not a JSON object: send {"weight": N}');
        // As the config file: an unknown key is an error, not ignored ({"weigth": 0} must not pass as "no change").
        const extra = Object.keys(body).filter((k) => k !== 'weight');
        if (extra.length > 0) throw new DaemonError('BAD_BODY', `unknown key${extra.length === 1 ? '' : 's'} ${extra.map((k) => JSON.stringify(k)).join(', ')} in the body: send {"weight": N}`);
        const w = (body as { weight?: unknown }).weight;
        if (w === undefined) throw new DaemonError('BAD_BODY', 'the body has no "weight": send {"weight": N}');
        if (!isWeight(w)) {
          throw new DaemonError('BAD_WEIGHT', `weight ${JSON.stringify(w)} is not an integer 0..65535`);
        }
        json(res, 200, await daemon.setIntent(service, real, { weight: w }));
        return;
      }
      only(req, 'POST');
      json(res, 200, await daemon.setIntent(service, real, INTENT_VERBS[verb]!));
      return;
    }
    json(res, 404, { error: 'NOT_FOUND', message: `no route ${req.method} ${path}` });
  };
  logDrops(server, daemon, 'admin', at, limits);
  await listen(server, at);
  return server;
}
