// The admin API's bearer token: required when admin.tokenFile is set, and then it must be (a
// listen address off loopback needs one). Read at start, on every reload, and when a request
// brings a token that does not match (a rotated token is taken without a SIGHUP).

import { readFile } from 'node:fs/promises';
import type { Config } from '../config/types.js';
import { isLoopback } from '../config/validate.js';
import { DaemonError } from './daemon-error.js';

/**
 * The token the admin API requires under `config`, or null: none on loopback without a token file.
 * A token file the operator configured is enforced on loopback too (any local user could otherwise
 * drain reals).
 */
export async function readAdminToken(config: Pick<Config, 'admin'>): Promise<Buffer | null> {
  const { listen, tokenFile } = config.admin;
  if (!tokenFile && isLoopback(listen.host)) return null;
  if (!tokenFile) {
    throw new DaemonError('ADMIN_TOKEN_REQUIRED', `admin.listen ${listen.host}:${listen.port} is not loopback: admin.tokenFile is required`, [
      { path: 'admin.tokenFile', message: `admin.listen ${listen.host}:${listen.port} is not loopback: a token file is required` },
    ]);
  }
  let text: string;
  try {
    text = await readFile(tokenFile, 'utf8');
  } catch (err) {
    throw new DaemonError(
      'ADMIN_TOKEN_UNREADABLE',
      `admin.tokenFile ${tokenFile}: ${(err as Error).message}`,
      [{ path: 'admin.tokenFile', message: `cannot read ${tokenFile}: ${(err as Error).message}` }],
      'system',
    );
  }
  const token = Buffer.from(text.trim());
  if (token.length === 0) {
    throw new DaemonError('ADMIN_TOKEN_EMPTY', `admin.tokenFile ${tokenFile} is empty`, [{ path: 'admin.tokenFile', message: `${tokenFile} is empty` }], 'system');
  }
  // A bearer token is one word (RFC 6750): no client could send one with a space or newline in it.
  if (/\s/.test(text.trim())) {
    throw new DaemonError(
      'ADMIN_TOKEN_WHITESPACE',
      `admin.tokenFile ${tokenFile}: the token contains whitespace`,
      [{ path: 'admin.tokenFile', message: `${tokenFile}: the token contains whitespace; a bearer token is one word (e.g. openssl rand -hex 32)` }],
      'system',
    );
  }
  return token;
}
