// The http and https probes: GET the check path on a fresh connection, expect a status from the
// list and, optionally, a body substring. https does NOT verify the real's certificate: reals are
// addressed by IP and often carry self-signed certificates; the probe asks "is it serving", not
// "is it who it claims to be". Use an exec check with curl when verification matters.
//
// Over a plain (or TLS) socket, the request written as node:http wrote it and the response read by
// ResponseReader, not through node:http: its per-request agent, request and response objects,
// parser and streams took half of an http probe's main-thread time (about 240 us a probe against
// 105 now, bench/micro/probe-cost.js).

import { connect as netConnect, isIP, isIPv6, type ConnectOpts, type Socket } from 'node:net';
import { connect as tlsConnect, type ConnectionOptions } from 'node:tls';
import { ResponseReader } from './http-response.js';
import { fail, failFromError, timedOut, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from './probe.js';

/**
 * What every probe's socket reads into (with `onread`, no buffer is allocated per read). One is
 * enough: the main thread hands each read to its reader, which copies what it keeps, before the next.
 */
const readBuffer = Buffer.allocUnsafe(16 * 1024);

/** A check's request, made once per target: its bytes, or why it cannot be sent. */
type Request = { readonly bytes: Buffer; readonly servername: string } | ProbeOutcome;

export class HttpProber implements Prober {
  /** By target object: the monitor keeps one per real and probe, so a reload that changes the check makes a new one. */
  private readonly requests = new WeakMap<ProbeTarget, Request>();

  constructor(private readonly scheme: 'http' | 'https') {}

  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      let request = this.requests.get(target);
      if (request === undefined) {
        request = makeRequest(target, this.scheme === 'https' ? 443 : 80);
        this.requests.set(target, request);
      }
      if (!('bytes' in request)) return resolve(request);
      const { bytes } = request;
      const reader = new ResponseReader(target.check.expectStatus, target.check.expectBody);
      let settled = false;
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        socket.destroy();
        resolve(outcome);
      };
      const onread = {
        buffer: readBuffer,
        callback: (length: number): boolean => {
          const outcome = reader.read(readBuffer, 0, length);
          if (outcome !== null) done(outcome);
          return !settled;
        },
      };
      let socket: Socket;
      if (this.scheme === 'https') {
        // tls.connect hands `onread` to the socket it makes, as net.connect does; its types omit it.
        const options: ConnectionOptions & ConnectOpts = { host: target.address, port: target.port, rejectUnauthorized: false, onread };
        if (request.servername !== '') options.servername = request.servername;
        socket = tlsConnect(options);
      } else {
        socket = netConnect({ host: target.address, port: target.port, onread });
      }
      signal.onAbort(() => done(timedOut()));
      socket.on(this.scheme === 'https' ? 'secureConnect' : 'connect', () => socket.write(bytes));
      socket.on('error', (err) => done(failFromError(err)));
      // The end of the stream ends a body sent until the close; any other response it cuts short.
      const ended = (): void => {
        if (!settled) done(reader.end());
      };
      socket.on('end', ended);
      socket.on('close', ended);
    });
  }
}

/**
 * The request node:http sent for the check (header names and order, Latin-1 bytes), and the TLS
 * server name it derived from the Host header (none for an IP address).
 */
function makeRequest(target: ProbeTarget, defaultPort: number): Request {
  const { check } = target;
  const host = check.host ?? hostHeader(target.address, target.port, defaultPort);
  // node:http refused a header value with a character beyond Latin-1 (the config allows any).
  if (/[^\t\x20-\x7e\x80-\xff]/.test(host)) return fail('error', 'Invalid character in header content ["host"]');
  // Bytes outside printable ASCII go as UTF-8 percent-escapes (/café -> /caf%C3%A9): node:http
  // refused some raw (/健康) and sent others as Latin-1.
  const path = check.path.replace(/[^\x21-\x7e]+/g, encodeURIComponent);
  // A fresh connection per probe, closed by us: a kept-alive one would hide a real that stopped accepting.
  const text = `GET ${path} HTTP/1.1\r\nhost: ${host}\r\nuser-agent: dsrlb-health\r\naccept: */*\r\nconnection: close\r\n\r\n`;
  return { bytes: Buffer.from(text, 'latin1'), servername: serverName(host) };
}

/** The default Host header: the real's address, bracketed for IPv6, with a non-default port. */
export function hostHeader(address: string, port: number, defaultPort: number): string {
  const host = isIPv6(address) ? `[${address}]` : address;
  return port === defaultPort ? host : `${host}:${port}`;
}

/** The TLS server name (SNI) of a Host header, as node:https took it: the name without port or brackets; none for an IP. */
function serverName(host: string): string {
  let name: string;
  if (host.startsWith('[')) {
    const close = host.indexOf(']');
    name = close < 0 ? host : host.slice(1, close);
  } else {
    name = host.split(':', 1)[0]!;
  }
  return isIP(name) ? '' : name;
}
