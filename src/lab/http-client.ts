// A test and demo HTTP client run inside a lab namespace. Two modes:
//   --count N: N requests, each on a new TCP connection (so each from a distinct source port);
//              prints {"ok","failed","byReal","distinctPorts","errors"} as JSON.
//   --source ADDR: connect from this local address (a client namespace holding several).
//   --keepalive N: opens N keep-alive connections and, for every line read on stdin, sends one
//              request on each and prints {"round","answers":[{"port","real"} | {"port","error"}]}.
// The real that answered is read from the X-Real header (src/lab/real-http-server.ts).

import { connect, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    host: { type: 'string' },
    port: { type: 'string', default: '80' },
    path: { type: 'string', default: '/' },
    count: { type: 'string' },
    keepalive: { type: 'string' },
    concurrency: { type: 'string', default: '10' },
    timeout: { type: 'string', default: '5000' },
    source: { type: 'string' },
  },
});
const host = values.host!;
const port = Number(values.port);
const timeoutMs = Number(values.timeout);

interface Answer {
  real: string | null;
  status: number;
  bodyBytes: number;
}

/** Reads one HTTP/1.1 response (Content-Length bodies only) from a socket. */
function readResponse(sock: Socket): Promise<Answer> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error('timeout')), timeoutMs);
    const onData = (chunk: Buffer): void => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = buf.subarray(0, end).toString('latin1');
      const len = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? '0');
      if (buf.length < end + 4 + len) return;
      const status = Number(/^HTTP\/1\.[01] (\d+)/.exec(head)?.[1] ?? '0');
      const real = /x-real:\s*(\S+)/i.exec(head)?.[1] ?? null;
      finish(null, { real, status, bodyBytes: len });
    };
    const onErr = (e: Error): void => finish(e);
    const onClose = (): void => finish(new Error('connection closed'));
    function finish(err: Error | null, a?: Answer): void {
      clearTimeout(timer);
      sock.off('data', onData);
      sock.off('error', onErr);
      sock.off('close', onClose);
      if (err) reject(err);
      else resolve(a!);
    }
    sock.on('data', onData);
    sock.on('error', onErr);
    sock.on('close', onClose);
  });
}

function open(): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const sock = connect({ host, port, ...(values.source === undefined ? {} : { localAddress: values.source }) });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error('connect timeout'));
    }, timeoutMs);
    sock.once('connect', () => {
      clearTimeout(timer);
      resolve(sock);
    });
    sock.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
  });
}

async function request(sock: Socket, keepAlive: boolean): Promise<Answer> {
  const answer = readResponse(sock);
  sock.write(`GET ${values.path} HTTP/1.1\r\nHost: ${host}\r\nConnection: ${keepAlive ? 'keep-alive' : 'close'}\r\n\r\n`);
  return answer;
}

async function countMode(n: number): Promise<void> {
  const byReal: Record<string, number> = {};
  const ports = new Set<number>();
  const errors: Record<string, number> = {};
  let ok = 0;
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < n) {
      next++;
      try {
        const sock = await open();
        ports.add(sock.localPort!);
        const a = await request(sock, false);
        sock.destroy();
        if (a.status !== 200 || !a.real) throw new Error(`status ${a.status}`);
        byReal[a.real] = (byReal[a.real] ?? 0) + 1;
        ok++;
      } catch (err) {
        const m = (err as Error).message;
        errors[m] = (errors[m] ?? 0) + 1;
      }
    }
  };
  await Promise.all(Array.from({ length: Number(values.concurrency) }, worker));
  process.stdout.write(JSON.stringify({ ok, failed: n - ok, byReal, distinctPorts: ports.size, errors }) + '\n');
}

async function keepAliveMode(n: number): Promise<void> {
  const socks: (Socket | null)[] = [];
  const portsOf: number[] = [];
  for (let i = 0; i < n; i++) {
    const s = await open().catch(() => null);
    socks.push(s);
    portsOf.push(s?.localPort ?? 0);
  }
  process.stdout.write(JSON.stringify({ opened: socks.filter(Boolean).length, ports: portsOf }) + '\n');
  let round = 0;
  const rl = createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === 'quit') break;
    round++;
    const answers = await Promise.all(
      socks.map(async (s, i) => {
        if (!s) return { port: portsOf[i], error: 'not connected' };
        try {
          const a = await request(s, true);
          return { port: portsOf[i], real: a.real };
        } catch (err) {
          return { port: portsOf[i], error: (err as Error).message };
        }
      }),
    );
    process.stdout.write(JSON.stringify({ round, answers }) + '\n');
  }
  for (const s of socks) s?.destroy();
}

if (values.count) await countMode(Number(values.count));
else if (values.keepalive) await keepAliveMode(Number(values.keepalive));
else {
  process.stderr.write('usage: http-client --host H [--port P] [--source ADDR] (--count N | --keepalive N)\n');
  process.exitCode = 1;
}
