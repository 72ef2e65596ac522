// The CLI side of the admin API: finds the daemon's address and token from the config file
// (or --admin / --token-file), sends one request, and turns failures into one-line errors.

import { readFile } from 'node:fs/promises';
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
  if (!baseUrl || !tokenFile) {
    const path = opts.config ?? defaultConfig;
    const admin = await loadAdminSettings(path);
    if (admin.ok) {
      baseUrl ??= `http://${formatListen(admin.listen)}`;
      tokenFile ??= admin.tokenFile;
    } else if (admin.missing === true && opts.config === undefined) {
      baseUrl ??= `http://${formatListen(DEFAULT_ADMIN_LISTEN)}`;
    } else if (!baseUrl) {
      const problems = problemLines(admin.problems, path).join('\n');
      throw new CliError(`cannot find the admin API (use --admin URL):\n${problems}`, 1);
    }
  }
  let token: string | null = null;
  if (tokenFile) {
    try {
      token = (await readFile(tokenFile, 'utf8')).trim();
    } catch (err) {
      // A loopback admin API needs no token: only fail when the daemon asks for one.
      token = null;
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      if (!/^http:\/\/(127\.|\[::1\])/.test(baseUrl!)) throw new CliError(`cannot read token file ${tokenFile}: ${code}`, 1);
    }
  }
  return { baseUrl: baseUrl!.replace(/\/$/, ''), token };
}

/** An answer that is not dsrlb's JSON (a proxy's error page, another service), in one line. */
function pageText(text: string): string {
  return oneLine(text.replace(/<[^>]*>/g, ' '), 120);
}

export async function adminRequest(target: AdminTarget, method: string, path: string, body?: unknown): Promise<{ status: number; data: Record<string, unknown> }> {
  const headers: Record<string, string> = {};
  if (target.token) headers.authorization = `Bearer ${target.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let res: Response;
  try {
    res = await fetch(target.baseUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(15_000) });
  } catch (err) {
    // undici hides the reason in `cause` (ECONNREFUSED, or a message such as "bad port").
    const e = err as Error & { cause?: { code?: string; message?: string } };
    const cause = e.cause?.code ?? e.cause?.message ?? e.message;
    throw new CliError(`cannot reach the daemon at ${target.baseUrl}: ${cause}`, 2);
  }
  const text = await res.text();
  let data: Record<string, unknown> | null = null;
  try {
    const parsed = JSON.parse(text) as unknown;
    if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) data = parsed as Record<string, unknown>;
  } catch {
    // not JSON: below
  }
  const said = data !== null && typeof data.message === 'string' ? data.message : pageText(text) || `HTTP ${res.status}`;
  if (data === null) throw new CliError(`${target.baseUrl} is not a dsrlb admin API: HTTP ${res.status} ${said}`, 2);
  if (res.status === 401 || res.status === 403) throw new CliError(`the daemon refused: ${said} (check --token-file)`, 2);
  if (res.status === 404 || res.status === 400) throw new CliError(said, 1);
  // 422: a refused reload, whose problems the caller prints.
  if ((res.status < 200 || res.status > 299) && res.status !== 422) throw new CliError(`the daemon failed: HTTP ${res.status} ${said}`, 2);
  return { status: res.status, data };
}
