// The CLI side of the admin API: finds the daemon's address and token from the config file
// (or --admin / --token-file), sends one request, and turns failures into one-line errors.

import { readFile } from 'node:fs/promises';
import { loadConfigFile } from '../config/load.js';

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

export async function resolveAdminTarget(opts: { config?: string; admin?: string; tokenFile?: string }): Promise<AdminTarget> {
  let baseUrl = opts.admin ?? null;
  let tokenFile = opts.tokenFile ?? null;
  if (!baseUrl || !tokenFile) {
    const path = opts.config ?? '/etc/dsrlb/dsrlb.yaml';
    const loaded = await loadConfigFile(path);
    if (loaded.ok) {
      const l = loaded.config.admin.listen;
      const host = l.host.includes(':') ? `[${l.host}]` : l.host;
      baseUrl ??= `http://${host}:${l.port}`;
      tokenFile ??= loaded.config.admin.tokenFile;
    } else if (!baseUrl) {
      throw new CliError(`cannot find the admin API: ${path}: ${loaded.problems[0]?.message ?? 'invalid'} (use --admin URL)`, 1);
    }
  }
  let token: string | null = null;
  if (tokenFile) {
    try {
      token = (await readFile(tokenFile, 'utf8')).trim();
    } catch (err) {
      // A loopback admin API needs no token: only fail when the daemon asks for one.
      token = null;
      if (!/^http:\/\/(127\.|\[::1\])/.test(baseUrl!)) throw new CliError(`cannot read token file ${tokenFile}: ${(err as Error).message}`, 1);
    }
  }
  return { baseUrl: baseUrl!.replace(/\/$/, ''), token };
}

export async function adminRequest(target: AdminTarget, method: string, path: string, body?: unknown): Promise<{ status: number; data: Record<string, unknown> }> {
  const headers: Record<string, string> = {};
  if (target.token) headers.authorization = `Bearer ${target.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let res: Response;
  try {
    res = await fetch(target.baseUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(15_000) });
  } catch (err) {
    const cause = (err as Error & { cause?: { code?: string } }).cause?.code ?? (err as Error).message;
    throw new CliError(`cannot reach the daemon at ${target.baseUrl}: ${cause}`, 2);
  }
  const text = await res.text();
  let data: Record<string, unknown>;
  try {
    data = JSON.parse(text) as Record<string, unknown>;
  } catch {
    data = { message: text.trim() };
  }
  if (res.status === 401) throw new CliError(`the daemon refused: ${String(data.message ?? 'unauthorized')} (check --token-file)`, 2);
  if (res.status === 404 || res.status === 400) throw new CliError(String(data.message ?? `HTTP ${res.status}`), 1);
  if (res.status >= 500) throw new CliError(`the daemon failed: ${String(data.message ?? res.status)}`, 2);
  return { status: res.status, data };
}
