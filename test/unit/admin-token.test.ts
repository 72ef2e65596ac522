// The admin token rule, with validate's loopback test: none on loopback, required elsewhere.

import { describe, expect, it } from 'vitest';
import { readAdminToken } from '../../src/control/admin-token.js';

const admin = (host: string, tokenFile: string | null = null) => ({ admin: { listen: { host, port: 9743 }, tokenFile } });

describe('readAdminToken', () => {
  it('needs no token on any loopback address, and a token file anywhere else', async () => {
    for (const host of ['127.0.0.1', '127.3.2.1', '::1']) expect(await readAdminToken(admin(host)), host).toBeNull();
    for (const host of ['10.0.0.1', '0.0.0.0', '::', 'fd00::1']) {
      await expect(readAdminToken(admin(host)), host).rejects.toMatchObject({ code: 'ADMIN_TOKEN_REQUIRED' });
    }
  });
});
