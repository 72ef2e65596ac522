// The admin token rule, with validate's loopback test: none on loopback without a token file,
// required elsewhere; a configured token file is enforced everywhere; a rotated file is re-read.

import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/types.js';
import { readAdminToken } from '../../src/control/admin-token.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

const admin = (host: string, tokenFile: string | null = null) => ({ admin: { listen: { host, port: 9743 }, tokenFile } });

describe('readAdminToken', () => {
  it('needs no token on any loopback address, and a token file anywhere else', async () => {
    for (const host of ['127.0.0.1', '127.3.2.1', '::1']) expect(await readAdminToken(admin(host)), host).toBeNull();
    for (const host of ['10.0.0.1', '0.0.0.0', '::', 'fd00::1']) {
      await expect(readAdminToken(admin(host)), host).rejects.toMatchObject({ code: 'ADMIN_TOKEN_REQUIRED' });
    }
  });

  it('enforces a configured token file on loopback too, and refuses one it cannot read', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-token-'));
    await writeFile(join(dir, 'admin.token'), 's3cret\n');
    for (const host of ['127.0.0.1', '::1', '10.0.0.1']) {
      expect((await readAdminToken(admin(host, join(dir, 'admin.token'))))?.toString(), host).toBe('s3cret');
    }
    await expect(readAdminToken(admin('127.0.0.1', join(dir, 'missing')))).rejects.toMatchObject({ code: 'ADMIN_TOKEN_UNREADABLE' });
    // `openssl rand -base64 64` writes two lines: no client could send that as one bearer token.
    await writeFile(join(dir, 'two-lines.token'), 'aGVsbG8g\nd29ybGQ=\n');
    await expect(readAdminToken(admin('127.0.0.1', join(dir, 'two-lines.token')))).rejects.toMatchObject({
      code: 'ADMIN_TOKEN_WHITESPACE',
      refusedBy: 'system',
      problems: [{ path: 'admin.tokenFile', message: `${join(dir, 'two-lines.token')}: the token contains whitespace; a bearer token is one word (e.g. openssl rand -hex 32)` }],
    });
  });
});

describe('Daemon.rereadAdminToken', () => {
  it('takes a rotated token from the file when the file changed, and keeps the old one if the file is empty', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-token-'));
    const file = join(dir, 'admin.token');
    await writeFile(file, 'one\n');
    const lines: Record<string, unknown>[] = [];
    const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)));
    daemon.config = admin('127.0.0.1', file) as unknown as Config;
    daemon.adminToken = await readAdminToken(daemon.config);
    await writeFile(file, 'two\n');
    expect(await daemon.rereadAdminToken()).toBe(true);
    expect(daemon.adminToken?.toString()).toBe('two');
    expect(lines.some((l) => l.msg === 'admin token file changed: the new token is taken')).toBe(true);
    expect(await daemon.rereadAdminToken()).toBe(false); // unchanged: not read again
    await writeFile(file, '');
    expect(await daemon.rereadAdminToken()).toBe(false); // empty: refused, the old token stays
    expect(daemon.adminToken?.toString()).toBe('two');
    daemon.health.stop();
  });
});
