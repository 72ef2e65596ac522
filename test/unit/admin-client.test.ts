// How the CLI finds the admin API: --admin, else only the config's admin section, else (no file at
// the default path) the default address. No daemon needed.

import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CliError, resolveAdminTarget } from '../../src/cli/admin-client.js';

async function scratch(name: string, text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-admin-'));
  const file = join(dir, name);
  await writeFile(file, text);
  return file;
}

describe('resolveAdminTarget', () => {
  it('reads only the admin section: a broken service elsewhere does not lock the operator out', async () => {
    const file = await scratch('broken.yaml', 'interface: eth0\nadmin: { listen: "127.0.0.1:19743" }\nservices:\n  - vip: 10.0.0.100\n    port: 80\n    helthCheck: { type: tcp }\n    reals: [ { address: 10.0.1.300 } ]\n');
    expect(await resolveAdminTarget({ config: file })).toEqual({ baseUrl: 'http://127.0.0.1:19743', token: null });
  });

  it('reads the token file the admin section names, relative to the config', async () => {
    const file = await scratch('dsrlb.yaml', 'admin: { listen: "[::1]:19744", tokenFile: admin.token }\n');
    await writeFile(join(file, '..', 'admin.token'), 's3cret\n');
    expect(await resolveAdminTarget({ config: file })).toEqual({ baseUrl: 'http://[::1]:19744', token: 's3cret' });
  });

  it('names every problem of a broken admin section with its path', async () => {
    const file = await scratch('bad-admin.yaml', 'admin: { listen: "127.0.0.1:99999", tokenFle: x }\n');
    const err = await resolveAdminTarget({ config: file }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CliError);
    expect((err as CliError).exitCode).toBe(1);
    const lines = (err as CliError).message.split('\n');
    expect(lines[0]).toBe('cannot find the admin API (use --admin URL):');
    expect(lines.slice(1).every((l) => l.startsWith(`${file}: admin.`))).toBe(true);
    expect(lines.some((l) => l.includes('admin.listen'))).toBe(true);
    expect(lines.some((l) => l.includes('admin.tokenFle'))).toBe(true);
  });

  it('falls back to the default address when the default config file does not exist', async () => {
    const target = await resolveAdminTarget({}, join(tmpdir(), 'no-such-dir-dsrlb', 'dsrlb.yaml'));
    expect(target).toEqual({ baseUrl: 'http://127.0.0.1:9743', token: null });
  });

  it('a config file named with -c that does not exist is a user error', async () => {
    const missing = join(tmpdir(), 'no-such-dir-dsrlb', 'x.yaml');
    const err = await resolveAdminTarget({ config: missing }).catch((e: unknown) => e);
    expect((err as CliError).exitCode).toBe(1);
    expect((err as CliError).message).toContain(missing);
  });
});
