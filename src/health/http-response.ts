// Reads one HTTP/1.x response as the http probe needs it: the status, then, when the check expects
// a body text, the body as it arrives (de-chunked), searched in its first 64 KiB. It reads what
// node:http read with insecureHTTPParser, as curl and HAProxy do: bare-LF line ends, folded
// headers, control bytes in values, chunked over Content-Length. What that parser refused fails
// here with reason 'error' and the same "Parse Error: ..." text, and a connection that ends early
// with 'reset' as before. Bytes come in reads cut anywhere; the reader keeps what it needs.

import { OK, fail, oneLine, type ProbeOutcome } from './probe.js';

/** How much of the body is searched for expectBody; health pages are small. */
export const BODY_LIMIT_BYTES = 64 * 1024;
/** The most a response head may take (Node's default --max-http-header-size). */
export const HEAD_LIMIT_BYTES = 16 * 1024;

/** A connection that ended before the response did (node:http's "socket hang up" and "aborted"). */
export const CLOSED_EARLY: ProbeOutcome = fail('reset', 'connection reset (ECONNRESET)');

const LF = 0x0a;
const CR = 0x0d;

// Where the reader is. A body is framed by Content-Length, by chunks, or by the connection's end.
const HEAD = 0;
const BODY_LENGTH = 1;
const BODY_UNTIL_CLOSE = 2;
const CHUNK_SIZE = 3;
const CHUNK_EXTENSION = 4;
const CHUNK_DATA = 5;
const CHUNK_DATA_END = 6;
const TRAILERS = 7;
const DONE = 8;

/** Chunk sizes beyond this are refused (node:http: "Chunk size overflow"). */
const MAX_CHUNK_BYTES = 2 ** 48;
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

function parseError(message: string): ProbeOutcome {
  return fail('error', `Parse Error: ${message}`);
}

export class ResponseReader {
  private phase = HEAD;
  /** The head so far when it spans reads (null while it has not started or fits one read). */
  private head: Buffer | null = null;
  private headBytes = 0;
  private status = 0;
  /** Body bytes still to come: of the Content-Length, or of the current chunk. */
  private remaining = 0;
  private sizeDigits = 0;
  /** In the trailers: the current line has a byte other than CR. */
  private lineUsed = false;
  private readonly needle: Buffer | null;
  private body: Buffer | null = null;
  private bodyBytes = 0;

  constructor(
    private readonly expectStatus: readonly number[],
    private readonly expectBody: string | null,
  ) {
    this.needle = expectBody === null ? null : Buffer.from(expectBody, 'utf8');
  }

  /**
   * Reads `bytes[from, to)`, which the caller may reuse afterwards: the outcome once it is known
   * (nothing is read after it), else null.
   */
  read(bytes: Buffer, from: number, to: number): ProbeOutcome | null {
    if (this.phase === DONE) return null;
    let at = from;
    while (this.phase === HEAD) {
      const headEnd = this.readHead(bytes, at, to);
      if (typeof headEnd !== 'number') return headEnd === null ? null : this.conclude(headEnd);
      at = headEnd;
    }
    const outcome = this.readBody(bytes, at, to);
    return outcome === null ? null : this.conclude(outcome);
  }

  /** The connection ended (end of stream, not an error): the outcome. */
  end(): ProbeOutcome {
    return this.conclude(this.phase === BODY_UNTIL_CLOSE ? this.lacks() : CLOSED_EARLY);
  }

  private conclude(outcome: ProbeOutcome): ProbeOutcome {
    this.phase = DONE;
    this.head = null;
    this.body = null;
    return outcome;
  }

  /**
   * Reads head bytes: the index in `bytes` after the head once it is complete and decides nothing
   * yet (the phase then says what comes next: a body, or another head after a 1xx), the outcome
   * when it decides one, or null while it goes on in the next read.
   */
  private readHead(bytes: Buffer, from: number, to: number): number | ProbeOutcome | null {
    let buf = bytes;
    let start = from;
    let scanFrom = from;
    let end = to;
    const before = this.headBytes;
    if (this.head === null) {
      // Empty lines before the status line are skipped, as node:http did.
      while (start < to && (bytes[start] === CR || bytes[start] === LF)) start++;
      if (start === to) return null;
      scanFrom = start;
    } else {
      // The end of the head may straddle the reads: scan again from two bytes back.
      this.keepHead(bytes, from, to);
      buf = this.head;
      start = 0;
      scanFrom = Math.max(0, before - 2);
      end = this.headBytes;
    }
    const found = headEnd(buf, scanFrom, end);
    if (typeof found !== 'number') return found;
    if (found < 0) {
      if (end - start > HEAD_LIMIT_BYTES) return parseError('Header overflow');
      // A status line that cannot be one fails now, as node:http failed it (an SSH banner, say).
      // What statusOf checks lies in its first 16 bytes.
      const first = buf.subarray(start, Math.min(end, start + 16));
      const lf = first.indexOf(LF);
      const status = statusOf(stripCr(first.toString('latin1', 0, lf < 0 ? first.length : lf)), lf >= 0);
      if (typeof status === 'object' && status !== null) return status;
      if (this.head === null) this.keepHead(bytes, start, to);
      return null;
    }
    if (found - start > HEAD_LIMIT_BYTES) return parseError('Header overflow');
    // Where the head ends in `bytes` (a kept head has at least its last byte in this read).
    const consumed = this.head === null ? found : from + (found - before);
    this.head = null;
    this.headBytes = 0;
    const decided = this.takeHead(buf.toString('latin1', start, found));
    if (decided !== null) return decided;
    return consumed;
  }

  private keepHead(bytes: Buffer, from: number, to: number): void {
    const needed = this.headBytes + (to - from);
    if (this.head === null || needed > this.head.length) {
      // Grown as it comes, to just past the limit (beyond it the head is refused anyway).
      const grown = Buffer.allocUnsafe(Math.min(HEAD_LIMIT_BYTES + 4, Math.max(needed, 2 * (this.head?.length ?? 512))));
      this.head?.copy(grown, 0, 0, this.headBytes);
      this.head = grown;
    }
    this.headBytes += bytes.copy(this.head, this.headBytes, from, to);
  }

  /**
   * A complete head (its text, ending with the empty line): the outcome when it decides one,
   * else null with the phase set to what comes next.
   */
  private takeHead(text: string): ProbeOutcome | null {
    const lines = text.split('\n');
    const status = statusOf(stripCr(lines[0]!), true);
    if (typeof status !== 'number') return status!;
    const framing = framingOf(lines);
    if (!('chunked' in framing)) return framing;
    // An interim response (100 Continue, 103 Early Hints): the real one follows.
    if (status >= 100 && status < 200 && status !== 101) return null;
    this.status = status;
    if (!this.expectStatus.includes(status)) return fail('status', `HTTP ${status}, expected ${this.expectStatus.join('|')}`);
    if (this.needle === null) return OK;
    if (status < 200 || status === 204 || status === 304) return this.lacks();
    if (framing.chunked) {
      this.phase = CHUNK_SIZE;
    } else if (framing.contentLength !== null) {
      if (framing.contentLength === 0) return this.lacks();
      this.phase = BODY_LENGTH;
      this.remaining = framing.contentLength;
    } else {
      this.phase = BODY_UNTIL_CLOSE;
    }
    return null;
  }

  private readBody(bytes: Buffer, from: number, to: number): ProbeOutcome | null {
    if (this.phase === BODY_UNTIL_CLOSE) return this.search(bytes, from, to);
    if (this.phase === BODY_LENGTH) {
      const n = Math.min(this.remaining, to - from);
      this.remaining -= n;
      return this.search(bytes, from, from + n) ?? (this.remaining === 0 ? this.lacks() : null);
    }
    let i = from;
    while (i < to) {
      const b = bytes[i]!;
      switch (this.phase) {
        case CHUNK_SIZE: {
          const digit = hexDigit(b);
          if (digit >= 0) {
            this.remaining = this.remaining * 16 + digit;
            this.sizeDigits++;
            if (this.remaining > MAX_CHUNK_BYTES) return parseError('Chunk size overflow');
          } else if (b === LF) {
            const ended = this.chunkSizeEnded();
            if (ended !== null) return ended;
          } else if (this.sizeDigits > 0 && (b === 0x3b || b === 0x20 || b === 0x09)) {
            this.phase = CHUNK_EXTENSION; // ";name=value", ignored
          } else if (b !== CR) {
            return parseError('Invalid character in chunk size');
          }
          i++;
          break;
        }
        case CHUNK_EXTENSION: {
          if (b === LF) {
            const ended = this.chunkSizeEnded();
            if (ended !== null) return ended;
          }
          i++;
          break;
        }
        case CHUNK_DATA: {
          const n = Math.min(this.remaining, to - i);
          this.remaining -= n;
          const found = this.search(bytes, i, i + n);
          if (found !== null) return found;
          i += n;
          if (this.remaining === 0) this.phase = CHUNK_DATA_END;
          break;
        }
        case CHUNK_DATA_END: {
          // CRLF, LF, or (leniently, as node:http) nothing before the next size line.
          if (b === CR) i++;
          else {
            if (b === LF) i++;
            this.phase = CHUNK_SIZE;
            this.sizeDigits = 0;
          }
          break;
        }
        default: {
          // TRAILERS: header lines, ignored, up to the empty line that ends the message.
          if (b === LF) {
            if (!this.lineUsed) return this.lacks();
            this.lineUsed = false;
          } else if (b !== CR) {
            this.lineUsed = true;
          }
          i++;
        }
      }
    }
    return null;
  }

  private chunkSizeEnded(): ProbeOutcome | null {
    if (this.sizeDigits === 0) return parseError('Invalid character in chunk size');
    this.phase = this.remaining === 0 ? TRAILERS : CHUNK_DATA;
    this.lineUsed = false;
    return null;
  }

  /**
   * Adds body bytes and searches them as they come: a streaming or long-polling health page that
   * never ends passes once the text is there, and the first BODY_LIMIT_BYTES are searched however
   * the body is cut. OK when found, the 'body' failure once the limit is reached, else null.
   */
  private search(bytes: Buffer, from: number, to: number): ProbeOutcome | null {
    if (to <= from) return null;
    const needle = this.needle!;
    const searchFrom = Math.max(0, this.bodyBytes - needle.length + 1);
    let body = this.body;
    if (body === null || (this.bodyBytes + (to - from) > body.length && body.length < BODY_LIMIT_BYTES)) {
      // Grown as the body comes (a health page is small): 64 KiB a probe was 32 MB/s of garbage
      // with 1000 reals probed every 2 s.
      const grown = Buffer.allocUnsafe(Math.min(BODY_LIMIT_BYTES, Math.max(2 * (body?.length ?? 2048), this.bodyBytes + (to - from))));
      body?.copy(grown, 0, 0, this.bodyBytes);
      this.body = body = grown;
    }
    this.bodyBytes += bytes.copy(body, this.bodyBytes, from, to);
    if (body.subarray(0, this.bodyBytes).indexOf(needle, searchFrom) >= 0) return OK;
    return this.bodyBytes >= BODY_LIMIT_BYTES ? this.lacks() : null;
  }

  private lacks(): ProbeOutcome {
    const limited = this.bodyBytes >= BODY_LIMIT_BYTES ? ` in its first ${BODY_LIMIT_BYTES / 1024} KiB` : '';
    return fail('body', `HTTP ${this.status}, body lacks ${JSON.stringify(oneLine(this.expectBody ?? '', 60))}${limited}`);
  }
}

/**
 * Where the head ends in `buf[from, to)`: the index after its empty line (LF LF or LF CR LF), -1
 * when it has not ended yet, or a failure for a CR that no LF follows.
 */
function headEnd(buf: Buffer, from: number, to: number): number | ProbeOutcome {
  for (let i = from; i < to; i++) {
    const b = buf[i];
    if (b === LF) {
      if (i + 1 < to && buf[i + 1] === LF) return i + 2;
      if (i + 2 < to && buf[i + 1] === CR && buf[i + 2] === LF) return i + 3;
    } else if (b === CR && i + 1 < to && buf[i + 1] !== LF) {
      return parseError('Missing expected LF after header value');
    }
  }
  return -1;
}

function stripCr(line: string): string {
  return line.endsWith('\r') ? line.slice(0, -1) : line;
}

const isDigit = (c: string): boolean => c >= '0' && c <= '9';
const PROTOCOLS = ['HTTP/', 'RTSP/', 'ICE/'];
/** After the protocol: what each character of "1.1 200 " must be, and node:http's text when it is not. */
const STATUS_LINE: readonly (readonly [offset: number, valid: (c: string) => boolean, message: string])[] = [
  [0, isDigit, 'Invalid major version'],
  [1, (c) => c === '.', 'Expected dot'],
  [2, isDigit, 'Invalid minor version'],
  [3, (c) => c === ' ', 'Expected space after version'],
  [4, isDigit, 'Invalid status code'],
  [5, isDigit, 'Invalid status code'],
  [6, isDigit, 'Invalid status code'],
  [7, (c) => c === ' ', 'Invalid response status'],
];

/**
 * The status of a status line ("HTTP/1.1 200 OK"), checked as node:http checked it; of the start
 * of one (`complete` false), null while it can still become one.
 */
function statusOf(line: string, complete: boolean): number | ProbeOutcome | null {
  const protocol = PROTOCOLS.find((p) => line.startsWith(p));
  if (protocol === undefined) {
    return !complete && PROTOCOLS.some((p) => p.startsWith(line)) ? null : parseError('Expected HTTP/, RTSP/ or ICE/');
  }
  for (const [offset, valid, message] of STATUS_LINE) {
    const c = line[protocol.length + offset];
    if (c === undefined) {
      if (!complete) return null;
      if (offset === 7) break; // no reason phrase
      return parseError(message);
    }
    if (!valid(c)) return parseError(message);
  }
  return Number(line.slice(protocol.length + 4, protocol.length + 7));
}

/** How the body is framed, from the header lines (after the status line; folded lines join theirs). */
function framingOf(lines: readonly string[]): { chunked: boolean; contentLength: number | null } | ProbeOutcome {
  let contentLength: string | null = null;
  let transferEncoding: string | null = null;
  let current: 'length' | 'encoding' | null = null;
  for (let n = 1; n < lines.length; n++) {
    const line = stripCr(lines[n]!);
    if (line === '') continue;
    if (line[0] === ' ' || line[0] === '\t') {
      // A folded line continues the header before it.
      if (current === 'length') contentLength += ` ${line.trim()}`;
      else if (current === 'encoding') transferEncoding += ` ${line.trim()}`;
      continue;
    }
    const colon = line.indexOf(':');
    const name = colon < 0 ? '' : line.slice(0, colon).replace(/[ \t]+$/, '');
    if (!HEADER_NAME.test(name)) return parseError('Invalid header token');
    current = null;
    if (name.length === 14 && name.toLowerCase() === 'content-length') {
      if (contentLength !== null) return parseError('Duplicate Content-Length');
      contentLength = line.slice(colon + 1);
      current = 'length';
    } else if (name.length === 17 && name.toLowerCase() === 'transfer-encoding') {
      transferEncoding = line.slice(colon + 1);
      current = 'encoding';
    }
  }
  if (contentLength !== null && !/^\s*\d+\s*$/.test(contentLength)) return parseError('Invalid character in Content-Length');
  // Chunked when it is the last coding (gzip, chunked); then any Content-Length is ignored.
  const chunked = transferEncoding !== null && transferEncoding.split(',').at(-1)!.trim().toLowerCase() === 'chunked';
  return { chunked, contentLength: contentLength === null ? null : Number(contentLength.trim()) };
}

function hexDigit(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  if (b >= 0x41 && b <= 0x46) return b - 0x41 + 10;
  if (b >= 0x61 && b <= 0x66) return b - 0x61 + 10;
  return -1;
}
