// The CLI side of the admin API: finds the daemon's address and token from the config file
// (or --admin / --token-file), sends one request, and turns failures into one-line errors.

import { readFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import { loadAdminSettings } from '../config/load.js';
import { DEFAULT_ADMIN_LISTEN, formatListen, problemLines } from '../config/validate.js';
import { oneLine } from '../health/probe.js';

export const DEFAULT_CONFIG_PATH = '/etc/dsrlb/dsrlb.yaml';

export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: 1 | 2,
  ) {
    super(message);
  }
}

export interface AdminTarget {
  baseUrl: string;
  token: string | null;
  /** The config file whose admin.listen gave baseUrl; absent when it came from --admin or the default address. */
  configFile?: string;
  /** Why the token file could not be read (loopback: tried without a token), said if the daemon then asks for one. */
  tokenProblem?: string;
}

/**
 * The admin API's URL and token: --admin / --token-file, else the `admin` section of the config
 * file (-c, default /etc/dsrlb/dsrlb.yaml). Only that section is read, so a typo elsewhere in the
 * file does not lock the operator out of status, drain or reload (which says why it refused).
 * With no file at the default path the default address (127.0.0.1:9743) is used.
 */
export async function resolveAdminTarget(
  opts: { config?: string; admin?: string; tokenFile?: string },
  defaultConfig = DEFAULT_CONFIG_PATH,
): Promise<AdminTarget> {
  let baseUrl = opts.admin ?? null;
  let tokenFile = opts.tokenFile ?? null;
  let configFile: string | undefined;
  let withheld: string | undefined;
  if (!baseUrl || !tokenFile) {
    const path = opts.config ?? defaultConfig;
    const admin = await loadAdminSettings(path);
    if (admin.ok) {
      if (!baseUrl) {
        baseUrl = `http://${formatListen(admin.listen)}`;
        configFile = path;
      }
      // This host's token goes to this host only: an --admin URL elsewhere gets it from --token-file
      // (over plain http it would go out in the clear, and to any host the URL names).
      const ownUrl = `http://${formatListen(admin.listen)}`;
      if (tokenFile === null && admin.tokenFile !== null && !configFile && !isLoopbackUrl(baseUrl) && baseUrl.replace(/\/$/, '') !== ownUrl) {
        withheld = `the token file of ${path} is not sent to ${baseUrl}, which is not this host: name it with --token-file`;
      } else tokenFile ??= admin.tokenFile;
    } else if (admin.missing === true && opts.config === undefined) {
      baseUrl ??= `http://${formatListen(DEFAULT_ADMIN_LISTEN)}`;
    } else if (!baseUrl) {
      const problems = problemLines(admin.problems, path).join('\n');
      throw new CliError(`cannot find the admin API (use --admin URL):\n${problems}`, 1);
    }
  }
  let token: string | null = null;
  let tokenProblem: string | undefined;
  if (tokenFile) {
    try {
      token = (await readFile(tokenFile, 'utf8')).trim();
      // An HTTP header cannot carry it, and the daemon refuses such a file at start and reload.
      if (/\s/.test(token)) throw new CliError(`token file ${tokenFile}: the token contains whitespace; a bearer token is one word (e.g. openssl rand -hex 32)`, 1);
    } catch (err) {
      if (err instanceof CliError) throw err;
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      // A file the user named is the user's to fix, whatever the daemon would say (it was asked
      // without a token, and its 401 read as "the daemon refused", exit 2).
      if (opts.tokenFile !== undefined) throw new CliError(`--token-file ${tokenFile}: cannot read token file: ${code}`, 1);
      // The config's token file: a loopback admin API needs no token, so only fail when the daemon asks for one.
      token = null;
      if (!isLoopbackUrl(baseUrl!) || baseUrl!.startsWith('https')) throw new CliError(`cannot read token file ${tokenFile}: ${code}`, 1);
      tokenProblem = `cannot read token file ${tokenFile}: ${code}`;
    }
  }
  const target: AdminTarget = { baseUrl: baseUrl!.replace(/\/$/, ''), token };
  if (configFile !== undefined) target.configFile = configFile;
  if (tokenProblem !== undefined) target.tokenProblem = tokenProblem;
  else if (withheld !== undefined) target.tokenProblem = withheld;
  return target;
}

/** http(s) to 127.0.0.0/8, ::1 or localhost. */
function isLoopbackUrl(url: string): boolean {
  return /^https?:\/\/(127\.|\[::1\]|localhost(:|\/|$))/i.test(url);
}

/** An answer that is not dsrlb's JSON (a proxy's error page, another service), in one line. */
function pageText(text: string): string {
  return oneLine(text.replace(/<[^>]*>/g, ' '), 120);
}

/** How long a command waits for the daemon's whole answer. */
const ADMIN_TIMEOUT_MS = 15_000;

/**
 * One request to the admin API and its JSON answer. node:http, not fetch: fetch refuses the WHATWG
 * "bad ports" (6000, 10080, 5060, ...), which admin.listen may name. Exit 2 when the daemon cannot be
 * reached, refuses or fails; exit 1 for what the daemon calls a user error (400, 404, 409). A 422 (a
 * refused reload) is returned for the caller to print.
 */
export async function adminRequest(
  target: AdminTarget,
  method: string,
  path: string,
  body?: unknown,
  opts: { timeoutMs?: number } = {},
): Promise<{ status: number; data: Record<string, unknown> }> {
  const headers: Record<string, string> = {};
  if (target.token) headers.authorization = `Bearer ${target.token}`;
  const payload = body === undefined ? null : Buffer.from(JSON.stringify(body));
  if (payload !== null) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(payload.length);
  }
  let answer: { status: number; text: string };
  try {
    answer = await send(new URL(target.baseUrl + path), method, headers, payload, opts.timeoutMs ?? ADMIN_TIMEOUT_MS);
  } catch (err) {
    if ((err as { sentWhole?: boolean }).sentWhole === true && method !== 'GET') {
      throw new CliError(`the daemon at ${target.baseUrl} took the request but gave no answer within ${(opts.timeoutMs ?? ADMIN_TIMEOUT_MS) / 1000} s: it may still be carried out; see dsrlb status and the daemon's log`, 2);
    }
    // The errno name when there is one (ECONNREFUSED, ENOTFOUND, EPROTO), else what went wrong.
    const reason = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new CliError(`cannot reach the daemon at ${target.baseUrl}: ${oneLine(reason, 200)}${reason === 'ECONNREFUSED' ? movedHint(target) : ''}`, 2);
  }
  const { status, text } = answer;
  let data: Record<string, unknown> | null = null;
  try {
    const parsed = JSON.parse(text) as unknown;
    if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) data = parsed as Record<string, unknown>;
  } catch {
    // not JSON: below
  }
  const said = data !== null && typeof data.message === 'string' ? data.message : pageText(text) || `HTTP ${status}`;
  if (data === null) throw new CliError(`${target.baseUrl} is not a dsrlb admin API: HTTP ${status} ${said}`, 2);
  if (status === 401 || status === 403) throw new CliError(`the daemon refused: ${said} (${target.tokenProblem ?? tokenHint(target, path)})`, 2);
  // 409: a reload that names a config file other than the daemon's (the user's to fix).
  if (status === 404 || status === 400 || status === 409) throw new CliError(said, 1);
  // 422: a refused reload, whose problems the caller prints.
  if ((status < 200 || status > 299) && status !== 422) throw new CliError(`the daemon failed: HTTP ${status} ${said}`, 2);
  return { status, data };
}

/** What to check after a 401: for a reload, the token file may have changed in the config it loads. */
function tokenHint(target: AdminTarget, path: string): string {
  if (path !== '/reload' || target.configFile === undefined) return 'check --token-file';
  return `check --token-file; if admin.tokenFile in ${target.configFile} changed since the last reload, the daemon still wants the old file's token: pass it with --token-file OLD, or send the daemon SIGHUP`;
}

/**
 * Nothing listens where the config file says: the file may have moved admin.listen since the
 * daemon started (a restart-only key), and the daemon still answers at the old address.
 */
function movedHint(target: AdminTarget): string {
  // Nothing listens there: most often no daemon runs at all.
  const running = 'is the daemon running? see systemctl status dsrlb (one in another network namespace, as the demo\'s: run the command there with ip netns exec)';
  if (target.configFile === undefined) return ` (${running})`;
  return ` (${running}; the address is admin.listen in ${target.configFile}; if that was edited since the daemon started, the daemon still listens at the old address: use --admin URL)`;
}

/** The status and body text of one HTTP(S) exchange; rejects on a network error or after `timeoutMs` for the whole answer. */
function send(url: URL, method: string, headers: Record<string, string>, payload: Buffer | null, timeoutMs: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    // agent: false: one connection, closed after the answer, so nothing keeps the CLI alive.
    const req = (url.protocol === 'https:' ? https : http).request(url, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('error', fail); // the connection closed before the answer's end (ECONNRESET)
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') });
      });
    });
    // A request the daemon has whole but does not answer in time may still be carried out.
    let sent = false;
    req.on('finish', () => (sent = true));
    const timer = setTimeout(() => fail(Object.assign(new Error(`no answer within ${timeoutMs / 1000} s`), { sentWhole: sent })), timeoutMs);
    function fail(err: Error): void {
      clearTimeout(timer);
      req.destroy();
      reject(err);
    }
    req.on('error', fail);
    req.end(payload ?? undefined);
  });
}
