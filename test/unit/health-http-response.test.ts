// The http probe's response reader alone, no sockets: each response below gives the outcome the
// node:http-based probe gave (recorded from it against a raw server sending these bytes), however
// the bytes are cut into reads, and a reader lets go of what it read.

import { describe, expect, it } from 'vitest';
import type { HealthCheckConfig } from '../../src/config/types.js';
import { BODY_LIMIT_BYTES, HEAD_LIMIT_BYTES, ResponseReader } from '../../src/health/http-response.js';
import type { ProbeOutcome } from '../../src/health/probe.js';

type Check = Partial<Pick<HealthCheckConfig, 'expectStatus' | 'expectBody'>>;
/** The response, the check, and whether the server closes the connection after sending it. */
type Case = readonly [response: string, check: Check, closes: boolean, expected: ProbeOutcome | null];

const ok: ProbeOutcome = { ok: true };
const error = (detail: string): ProbeOutcome => ({ ok: false, reason: 'error', detail: `Parse Error: ${detail}` });
const reset: ProbeOutcome = { ok: false, reason: 'reset', detail: 'connection reset (ECONNRESET)' };
const lacks = (status: number, text: string): ProbeOutcome => ({ ok: false, reason: 'body', detail: `HTTP ${status}, body lacks ${JSON.stringify(text)}` });
const CHUNKED = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n';

// null: no outcome yet, the probe would run into its timeout (the server keeps the connection open).
const CASES: Record<string, Case> = {
  'Content-Length body with the text': ['HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  'status alone decides without expectBody': ['HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc', {}, false, ok],
  'a status not listed': ['HTTP/1.1 503\r\n\r\n', {}, false, { ok: false, reason: 'status', detail: 'HTTP 503, expected 200' }],
  'a status listed among several': ['HTTP/1.1 503 Busy\r\n\r\n', { expectStatus: [200, 503] }, false, ok],
  'status 999': ['HTTP/1.1 999 Odd\r\n\r\n', {}, false, { ok: false, reason: 'status', detail: 'HTTP 999, expected 200' }],
  'chunked, the text across two chunks': [`${CHUNKED}2\r\nRE\r\n3\r\nADY\r\n0\r\n\r\n`, { expectBody: 'READY' }, false, ok],
  'chunked framing is not body': [`${CHUNKED}2\r\nRE\r\n3\r\nADY\r\n0\r\n\r\n`, { expectBody: '\r\n3' }, false, lacks(200, '3')],
  'chunked without the text': [`${CHUNKED}4\r\ngood\r\n0\r\n\r\n`, { expectBody: 'READY' }, false, lacks(200, 'READY')],
  'chunk extensions and trailers': [`${CHUNKED}5;x=y\r\nREADY\r\n0\r\nTrailer: a\r\n\r\n`, { expectBody: 'READY' }, false, ok],
  'chunked with bare LF': ['HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n5\nREADY\n0\n\n', { expectBody: 'READY' }, false, ok],
  'a space after the chunk size': [`${CHUNKED}5 \r\nREADY\r\n0\r\n\r\n`, { expectBody: 'READY' }, false, ok],
  'a bad chunk size': [`${CHUNKED}zz\r\nREADY\r\n0\r\n\r\n`, { expectBody: 'READY' }, false, error('Invalid character in chunk size')],
  'chunk data longer than its size': [`${CHUNKED}2\r\nREx\r\n0\r\n\r\n`, { expectBody: 'READY' }, false, error('Invalid character in chunk size')],
  'Chunked in capitals': ['HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nREADY\r\n0\r\n\r\n', { expectBody: 'READY' }, false, ok],
  'gzip, chunked is chunked': ['HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nREADY\r\n0\r\n\r\n', { expectBody: 'READY' }, false, ok],
  'chunked, gzip runs to the close': ['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nREADY', { expectBody: 'READY' }, true, ok],
  'chunked wins over Content-Length': ['HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nREADY\r\n0\r\n\r\n', { expectBody: 'READY' }, false, ok],
  'Content-Length short, then the close': ['HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc', { expectBody: 'READY' }, true, reset],
  'a chunk cut by the close': [`${CHUNKED}5\r\nab`, { expectBody: 'READY' }, true, reset],
  'closed before any byte': ['', {}, true, reset],
  'closed inside the head': ['HTTP/1.1 200 OK\r\nContent-Len', {}, true, reset],
  'an SSH banner, connection kept': ['SSH-2.0-OpenSSH_9.2\r\n', {}, false, error('Expected HTTP/, RTSP/ or ICE/')],
  'an SSH banner cut before its line end': ['SSH-2.0-Open', {}, false, error('Expected HTTP/, RTSP/ or ICE/')],
  'lower-case http': ['http/1.1 200 OK\r\n\r\n', {}, false, error('Expected HTTP/, RTSP/ or ICE/')],
  'HTTP/2 status line': ['HTTP/2 200\r\n\r\n', {}, false, error('Expected dot')],
  'letters for the version': ['HTTP/x.1 200 OK\r\n\r\n', {}, false, error('Invalid major version')],
  'a two-digit status': ['HTTP/1.1 20 OK\r\n\r\n', {}, false, error('Invalid status code')],
  'a tab after the status': ['HTTP/1.1 200\tOK\r\n\r\n', {}, false, error('Invalid response status')],
  'no space after the status': ['HTTP/1.1 200OK\r\n\r\n', {}, false, error('Invalid response status')],
  'any version digits': ['HTTP/3.0 200 OK\r\n\r\n', {}, false, ok],
  RTSP: ['RTSP/1.0 200 OK\r\n\r\n', {}, false, ok],
  '100 Continue, then the response': ['HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  '199, then the response': ['HTTP/1.1 199 Odd\r\n\r\nHTTP/1.1 200 OK\r\n\r\n', {}, false, ok],
  '204 has no body': ['HTTP/1.1 204 No Content\r\n\r\n', { expectStatus: [204], expectBody: 'x' }, false, lacks(204, 'x')],
  '304 has no body, whatever its Content-Length': ['HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n', { expectStatus: [304], expectBody: 'x' }, false, lacks(304, 'x')],
  'a body that runs to the close, with the text': ['HTTP/1.0 200 OK\r\n\r\nall READY', { expectBody: 'READY' }, true, ok],
  'a body that runs to the close, without it': ['HTTP/1.0 200 OK\r\n\r\nall good', { expectBody: 'READY' }, true, lacks(200, 'READY')],
  'Content-Length ends the body on a kept connection': ['HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood', { expectBody: 'READY' }, false, lacks(200, 'READY')],
  'Content-Length 0': ['HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n', { expectBody: 'READY' }, false, lacks(200, 'READY')],
  'a bad Content-Length': ['HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\ngood', {}, false, error('Invalid character in Content-Length')],
  'two Content-Lengths': ['HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nREADY', {}, false, error('Duplicate Content-Length')],
  'spaces around Content-Length and before the colon': ['HTTP/1.1 200 OK\r\nContent-Length :   5  \r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  'a folded Content-Length': ['HTTP/1.1 200 OK\r\nContent-Length:\r\n 5\r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  'a folded header': ['HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\nContent-Length: 5\r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  'bare LF line ends': ['HTTP/1.1 200 OK\nContent-Length: 5\n\nREADY', { expectBody: 'READY' }, false, ok],
  'empty lines before the status line': ['\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nREADY', { expectBody: 'READY' }, false, ok],
  'a CR without LF': ['HTTP/1.1 200 OK\rContent-Length: 5\r\r', {}, false, error('Missing expected LF after header value')],
  'a header line without a colon': ['HTTP/1.1 200 OK\r\nno colon here\r\n\r\n', {}, false, error('Invalid header token')],
  'a space inside a header name': ['HTTP/1.1 200 OK\r\nX Y: 1\r\n\r\n', {}, false, error('Invalid header token')],
  'an empty header name': ['HTTP/1.1 200 OK\r\n: 1\r\n\r\n', {}, false, error('Invalid header token')],
  'control bytes in a value and in the reason': ['HTTP/1.1 200 O\x01K\r\nX: a\x00b\r\n\r\n', {}, false, ok],
  'a head over 16 KiB': [`HTTP/1.1 200 OK\r\nX: ${'a'.repeat(HEAD_LIMIT_BYTES + 100)}\r\n\r\n`, {}, false, error('Header overflow')],
  'a head not ended yet': ['HTTP/1.1 200 OK\r\nContent-Length: 5\r\n', {}, false, null],
  'a body not complete yet': ['HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nnot yet', { expectBody: 'READY' }, false, null],
};

function check(over: Check): { expectStatus: readonly number[]; expectBody: string | null } {
  return { expectStatus: over.expectStatus ?? [200], expectBody: over.expectBody ?? null };
}

/** Feeds the bytes cut at `cuts` (offsets), then the close if the server closes; the outcome (null: none yet). */
function readInPieces(bytes: Buffer, c: Check, closes: boolean, cuts: readonly number[]): ProbeOutcome | null {
  const { expectStatus, expectBody } = check(c);
  const reader = new ResponseReader(expectStatus, expectBody);
  // Every piece in one reused buffer at an offset, as the probe's shared read buffer hands them over.
  const shared = Buffer.alloc(bytes.length + 16);
  let from = 0;
  for (const to of [...cuts, bytes.length]) {
    if (to <= from) continue;
    shared.fill(0x7e);
    bytes.copy(shared, 3, from, to);
    const outcome = reader.read(shared, 3, 3 + (to - from));
    if (outcome !== null) return outcome;
    from = to;
  }
  return closes ? reader.end() : null;
}

describe('http response reader', () => {
  for (const [name, [response, c, closes, expected]] of Object.entries(CASES)) {
    it(`${name}: as node:http read it, in one read and in every cut into two and three`, () => {
      const bytes = Buffer.from(response, 'latin1');
      expect(readInPieces(bytes, c, closes, [])).toEqual(expected);
      // Two pieces at every offset; three with the second cut a few bytes on (long heads: sampled).
      const step = bytes.length > 1000 ? 97 : 1;
      for (let cut = 1; cut < bytes.length; cut += step) {
        expect(readInPieces(bytes, c, closes, [cut]), `cut at ${cut}`).toEqual(expected);
        expect(readInPieces(bytes, c, closes, [cut, cut + 3]), `cuts at ${cut}, ${cut + 3}`).toEqual(expected);
      }
    });
  }

  it('byte by byte, a whole chunked response still reads (each read a single byte)', () => {
    const bytes = Buffer.from(`HTTP/1.1 100 Continue\r\n\r\n${CHUNKED}2\r\nRE\r\n3;e\r\nADY\r\n0\r\n\r\n`, 'latin1');
    const cuts = Array.from({ length: bytes.length }, (_, i) => i + 1);
    expect(readInPieces(bytes, { expectBody: 'READY' }, false, cuts)).toEqual(ok);
  });

  it('searches exactly the first 64 KiB of the body, across the limit and however it is cut', () => {
    const head = 'HTTP/1.1 200 OK\r\n\r\n';
    const late = Buffer.from(`${head}${'x'.repeat(BODY_LIMIT_BYTES)}READY`, 'latin1');
    const limited: ProbeOutcome = { ok: false, reason: 'body', detail: 'HTTP 200, body lacks "READY" in its first 64 KiB' };
    expect(readInPieces(late, { expectBody: 'READY' }, false, [])).toEqual(limited);
    expect(readInPieces(late, { expectBody: 'READY' }, false, [head.length + 1000, head.length + 40_000])).toEqual(limited);
    const edge = Buffer.from(`${head}${'x'.repeat(BODY_LIMIT_BYTES - 1)}READY`, 'latin1');
    expect(readInPieces(edge, { expectBody: 'READY' }, true, [])).toEqual(limited);
    expect(readInPieces(edge, { expectBody: 'xR' }, false, [head.length + 5000])).toEqual(ok);
  });

  it('the body text is UTF-8, and its failure names it on one line', () => {
    const body = 'status: prêt';
    const bytes = Buffer.from(`HTTP/1.1 200 OK\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`, 'utf8');
    expect(readInPieces(bytes, { expectBody: 'prêt' }, false, [bytes.length - 1])).toEqual(ok);
    expect(readInPieces(bytes, { expectBody: 'not\n  ready' }, false, [])).toEqual(lacks(200, 'not ready'));
  });

  it('reads nothing more once it has an outcome', () => {
    const reader = new ResponseReader([200], null);
    expect(reader.read(Buffer.from('HTTP/1.1 200 OK\r\n\r\n'), 0, 19)).toEqual(ok);
    expect(reader.read(Buffer.from('garbage'), 0, 7)).toBeNull();
  });
});
