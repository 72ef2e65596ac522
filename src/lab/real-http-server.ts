// The HTTP server each lab real runs on its VIP: tells who answered, streams a deterministic
// byte pattern for download tests (optionally paced) and hashes uploads. Run as a program:
// `node dist/lab/real-http-server.js --name r1 --host 10.77.0.100[,10.77.0.11] --port 80`.

import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { pathToFileURL } from 'node:url';

/** The pattern repeats with this period, so any range of it can be served from one block. */
export const PATTERN_PERIOD_BYTES = 65_536;

/** Byte at `offsetBytes` of every /bytes/<n> body (not periodic within 256 bytes, so shifts show). */
export function patternByte(offsetBytes: number): number {
  const i = offsetBytes % PATTERN_PERIOD_BYTES;
  return (i + (i >>> 8) * 7) & 0xff;
}

const PATTERN_BLOCK = Buffer.alloc(PATTERN_PERIOD_BYTES);
for (let i = 0; i < PATTERN_PERIOD_BYTES; i++) PATTERN_BLOCK[i] = patternByte(i);

/** The first `lengthBytes` of the pattern, as a test's expected body. */
export function patternBytes(lengthBytes: number): Buffer {
  const out = Buffer.allocUnsafe(lengthBytes);
  for (let done = 0; done < lengthBytes; done += PATTERN_PERIOD_BYTES) {
    PATTERN_BLOCK.copy(out, done, 0, Math.min(PATTERN_PERIOD_BYTES, lengthBytes - done));
  }
  return out;
}

/** Largest body /bytes/<n> serves: well past any test, small enough to reject typos. */
export const MAX_BYTES = 1e12;
const PACING_TICK_MS = 10;

export interface RealHttpServerOptions {
  name: string;
  hosts: string[];
  port: number;
}

export interface RealHttpServer {
  servers: Server[];
  close(): Promise<void>;
}

function sendText(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

// Writes pattern bytes [0, total) with backpressure; with rateBytesPerSec > 0 never runs ahead of
// rate * elapsed, so a transfer lasts total / rate seconds (for flow-drain and failover tests).
function streamPattern(res: ServerResponse, total: number, rateBytesPerSec: number): void {
  let sent = 0;
  let stopped = false;
  const startMs = Date.now();
  res.on('close', () => {
    stopped = true;
  });
  const pump = (): void => {
    while (!stopped && sent < total) {
      // One write never crosses the end of the pattern block, so it is a subarray, not a copy.
      const at = sent % PATTERN_PERIOD_BYTES;
      let n = Math.min(PATTERN_PERIOD_BYTES - at, total - sent);
      if (rateBytesPerSec > 0) {
        const allowed = Math.floor((rateBytesPerSec * (Date.now() - startMs)) / 1000) - sent;
        if (allowed <= 0) {
          setTimeout(pump, PACING_TICK_MS);
          return;
        }
        n = Math.min(n, allowed);
      }
      sent += n;
      const more = res.write(PATTERN_BLOCK.subarray(at, at + n));
      if (!more && sent < total) {
        res.once('drain', pump);
        return;
      }
    }
    if (!stopped) res.end();
  };
  pump();
}

function handle(name: string, req: IncomingMessage, res: ServerResponse): void {
  res.setHeader('X-Real', name);
  // DSR keeps the client's address: tests read it here to prove no proxy sat in between.
  res.setHeader('X-Client-Address', `${req.socket.remoteAddress ?? ''}:${req.socket.remotePort ?? 0}`);
  const url = new URL(req.url ?? '/', 'http://lab');
  const path = url.pathname;

  if (req.method === 'GET' || req.method === 'HEAD') {
    if (path === '/') return sendText(res, 200, `real=${name}\n`);
    if (path === '/healthz') return sendText(res, 200, 'ok\n');
    const m = /^\/bytes\/(\d{1,13})$/.exec(path);
    if (m) {
      const total = Number(m[1]);
      const rateText = url.searchParams.get('rate');
      const rate = rateText === null ? 0 : Number(rateText);
      if (total > MAX_BYTES || !Number.isSafeInteger(rate) || rate < 0) {
        return sendText(res, 400, `bad /bytes request: n <= ${MAX_BYTES}, rate a whole number of bytes per second\n`);
      }
      res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': total });
      if (req.method === 'HEAD') {
        res.end();
        return;
      }
      streamPattern(res, total, rate);
      return;
    }
    return sendText(res, 404, 'not found\n');
  }

  if (req.method === 'POST' && path === '/upload') {
    const hash = createHash('sha256');
    let bytes = 0;
    req.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      hash.update(chunk);
    });
    req.on('end', () => {
      const body = `${JSON.stringify({ real: name, bytes, sha256: hash.digest('hex') })}\n`;
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
      res.end(body);
    });
    req.on('error', () => res.destroy());
    return;
  }

  res.setHeader('Allow', 'GET, HEAD, POST');
  sendText(res, 405, 'method not allowed\n');
}

/** Listens on every host (one server each, same handler); resolves once all listen. */
export async function startRealHttpServer(opts: RealHttpServerOptions): Promise<RealHttpServer> {
  const servers: Server[] = [];
  const close = async (): Promise<void> => {
    await Promise.all(
      servers.map(
        (s) =>
          new Promise<void>((resolve) => {
            s.close(() => resolve());
            s.closeAllConnections();
          }),
      ),
    );
  };
  try {
    for (const host of opts.hosts) {
      const server = createServer({ keepAlive: true }, (req, res) => handle(opts.name, req, res));
      server.keepAliveTimeout = 60_000;
      servers.push(server);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host, port: opts.port }, () => {
          server.off('error', reject);
          resolve();
        });
      });
    }
  } catch (err) {
    await close();
    throw err;
  }
  return { servers, close };
}

function parseArgs(argv: string[]): RealHttpServerOptions {
  let name = '';
  let hosts: string[] = [];
  let port = 80;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = argv[i + 1];
    if ((arg === '--name' || arg === '--host' || arg === '--port') && value === undefined) {
      throw new Error(`${arg} needs a value`);
    }
    if (arg === '--name') name = value as string;
    else if (arg === '--host') hosts = hosts.concat((value as string).split(',').filter((h) => h !== ''));
    else if (arg === '--port') port = Number(value);
    else throw new Error(`unknown argument ${arg} (want --name N --host ADDR[,ADDR..] --port P)`);
    i++;
  }
  if (name === '') throw new Error('--name is required');
  if (hosts.length === 0) throw new Error('--host is required');
  if (!Number.isInteger(port) || port < 1 || port > 65_535) throw new Error(`--port ${port}: want 1..65535`);
  return { name, hosts, port };
}

async function main(): Promise<void> {
  let opts: RealHttpServerOptions;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`real-http-server: ${(err as Error).message}\n`);
    process.exit(1);
  }
  let running: RealHttpServer;
  try {
    running = await startRealHttpServer(opts);
  } catch (err) {
    process.stderr.write(`real-http-server: cannot listen: ${(err as Error).message}\n`);
    process.exit(2);
  }
  const stop = (): void => {
    void running.close().then(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  // The demo leaves servers running after it exits: a closed stdout must not take them down.
  process.stdout.on('error', () => undefined);
  process.stdout.write(
    `${JSON.stringify({ ready: true, name: opts.name, hosts: opts.hosts, port: opts.port, pid: process.pid })}\n`,
  );
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  void main();
}
