// The http and https probes: GET the check path on a fresh connection, expect a status from the
// list and, optionally, a body substring. https does NOT verify the real's certificate: reals are
// addressed by IP and often carry self-signed certificates; the probe asks "is it serving", not
// "is it who it claims to be". Use an exec check with curl when verification matters.

import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { isIPv6 } from 'node:net';
import { OK, fail, failFromError, oneLine, timedOut, type ProbeOutcome, type ProbeTarget, type Prober } from './probe.js';

/** How much of the body is searched for expectBody; health pages are small. */
export const BODY_LIMIT_BYTES = 64 * 1024;

export class HttpProber implements Prober {
  constructor(private readonly scheme: 'http' | 'https') {}

  probe(target: ProbeTarget, signal: AbortSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const { check } = target;
      const defaultPort = this.scheme === 'https' ? 443 : 80;
      const common = {
        host: target.address,
        port: target.port,
        method: 'GET',
        // Bytes outside printable ASCII go as UTF-8 percent-escapes (/café -> /caf%C3%A9): Node
        // refuses some raw (/健康) and sends others as Latin-1.
        path: check.path.replace(/[^\x21-\x7e]+/g, encodeURIComponent),
        // A fresh connection per probe: a kept-alive socket would hide a real that stopped accepting.
        agent: false as const,
        // Read as HAProxy, keepalived and curl read: bare-LF line ends (nc and busybox health
        // endpoints) and folded headers are fine. Only the status and the body are looked at.
        insecureHTTPParser: true,
        headers: {
          host: check.host ?? hostHeader(target.address, target.port, defaultPort),
          'user-agent': 'dsrlb-health',
          accept: '*/*',
          connection: 'close',
        },
        signal,
      };
      let settled = false;
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        req.destroy();
        resolve(outcome);
      };
      const onResponse = (res: IncomingMessage): void => {
        const status = res.statusCode ?? 0;
        if (!check.expectStatus.includes(status)) {
          res.resume();
          return done(fail('status', `HTTP ${status}, expected ${check.expectStatus.join('|')}`));
        }
        if (check.expectBody === null) {
          res.resume();
          return done(OK);
        }
        // Searched as the body arrives: a streaming or long-polling health page that never ends
        // passes once the text is there (judged at the end, it timed out), and the first
        // BODY_LIMIT_BYTES are searched however the body is cut into chunks.
        const needle = Buffer.from(check.expectBody, 'utf8');
        // Grown as the body comes (a health page is small): 64 KiB a probe was 32 MB/s of garbage
        // with 1000 reals probed every 2 s.
        let body = Buffer.allocUnsafe(Math.min(BODY_LIMIT_BYTES, 4096));
        let sizeBytes = 0;
        const lacks = (): void => done(fail('body', `HTTP ${status}, body lacks ${JSON.stringify(oneLine(check.expectBody!, 60))}${sizeBytes >= BODY_LIMIT_BYTES ? ` in its first ${BODY_LIMIT_BYTES / 1024} KiB` : ''}`));
        res.on('data', (chunk: Buffer) => {
          const from = Math.max(0, sizeBytes - needle.length + 1);
          if (sizeBytes + chunk.length > body.length && body.length < BODY_LIMIT_BYTES) {
            const grown = Buffer.allocUnsafe(Math.min(BODY_LIMIT_BYTES, Math.max(2 * body.length, sizeBytes + chunk.length)));
            body.copy(grown, 0, 0, sizeBytes);
            body = grown;
          }
          sizeBytes += chunk.copy(body, sizeBytes);
          if (body.subarray(0, sizeBytes).indexOf(needle, from) >= 0) done(OK);
          else if (sizeBytes >= BODY_LIMIT_BYTES) lacks();
        });
        res.once('end', lacks);
        res.once('error', (err) => done(failFromError(err)));
        // After 'end' this is a no-op; before it, the connection died mid-body.
        res.once('close', () => done(fail('reset', 'connection closed before the body ended')));
      };
      const req =
        this.scheme === 'https'
          ? httpsRequest({ ...common, rejectUnauthorized: false }, onResponse)
          : httpRequest(common, onResponse);
      req.once('error', (err) => done(signal.aborted ? timedOut() : failFromError(err)));
      req.end();
    });
  }
}

/** The default Host header: the real's address, bracketed for IPv6, with a non-default port. */
export function hostHeader(address: string, port: number, defaultPort: number): string {
  const host = isIPv6(address) ? `[${address}]` : address;
  return port === defaultPort ? host : `${host}:${port}`;
}
