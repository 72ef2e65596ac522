// The admin section alone (validateAdminSettings, loadAdminSettings): what the CLI's admin commands
// read, so they keep working while another part of the config file is broken.

import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadAdminSettings } from '../../src/config/load.js';
import { parseConfigText, validateAdminSettings } from '../../src/config/validate.js';

/** A file whose services are broken (typo, bad address) but whose admin section is fine. */
const BROKEN_SERVICES = {
  interface: 'eth0',
  admin: { listen: '[::1]:19743', tokenFile: '/etc/dsrlb/admin.token' },
  services: [{ vip: '203.0.113.10', port: 80, helthCheck: { type: 'tcp' }, reals: [{ address: '10.0.1.300' }] }],
};

describe('validateAdminSettings', () => {
  it('takes a valid admin section from a file whose other parts are broken', () => {
    expect(parseConfigText(JSON.stringify(BROKEN_SERVICES)).ok).toBe(false);
    expect(validateAdminSettings(BROKEN_SERVICES)).toEqual({ ok: true, listen: { host: '::1', port: 19743 }, tokenFile: '/etc/dsrlb/admin.token' });
  });

  it('gives the defaults when there is no admin section, or no document at all', () => {
    const defaults = { ok: true, listen: { host: '127.0.0.1', port: 9743 }, tokenFile: null };
    expect(validateAdminSettings({ services: 'garbage' })).toEqual(defaults);
    expect(validateAdminSettings({ admin: null })).toEqual(defaults);
    expect(validateAdminSettings(null)).toEqual(defaults);
  });

  it('reports every problem of a broken admin section at its path, and nothing else', () => {
    const result = validateAdminSettings({ interface: '', admin: { listen: '0.0.0.0:70000', tokenfile: '/x' }, services: [] });
    expect(result).toEqual({
      ok: false,
      problems: [
        { path: 'admin.tokenfile', message: 'unknown key (did you mean "tokenFile"?)' },
        { path: 'admin.listen', message: '"0.0.0.0:70000" is not a listen address: "70000" is not a port (1..65535)' },
      ],
    });
    expect(validateAdminSettings({ admin: { listen: '0.0.0.0:9743' } })).toEqual({
      ok: false,
      problems: [{ path: 'admin.tokenFile', message: 'missing; a token file is required when admin.listen (0.0.0.0:9743) is not a loopback address' }],
    });
    expect(validateAdminSettings({ admin: 'localhost' })).toEqual({
      ok: false,
      problems: [{ path: 'admin', message: 'expected a mapping of admin API settings, got "localhost"' }],
    });
    expect(validateAdminSettings(['a'])).toEqual({
      ok: false,
      problems: [{ path: '(file)', message: 'expected a mapping with at least interface and services, got a list' }],
    });
  });

  it('finds the same admin problems as the full validation', () => {
    for (const admin of [{ listen: '::1:9743' }, { listen: '[::]:9743', tokenFile: 12 }, { listen: '10.0.0.1:9743' }, { lisen: '127.0.0.1:1' }]) {
      const full = parseConfigText(JSON.stringify({ ...BROKEN_SERVICES, admin }));
      // validateAdminSettings has no text to give positions in: path and message compared.
      const fullAdmin = full.ok ? [] : full.problems.filter((problem) => problem.path.startsWith('admin')).map(({ path, message }) => ({ path, message }));
      const alone = validateAdminSettings({ admin });
      expect(alone.ok).toBe(false);
      expect(alone.ok ? [] : alone.problems).toEqual(fullAdmin);
    }
  });

  it('resolves a relative tokenFile against the config file\'s directory', () => {
    expect(validateAdminSettings({ admin: { tokenFile: 'admin.token' } }, { sourcePath: '/etc/dsrlb/dsrlb.yaml' })).toEqual({
      ok: true,
      listen: { host: '127.0.0.1', port: 9743 },
      tokenFile: '/etc/dsrlb/admin.token',
    });
  });
});

describe('loadAdminSettings', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'dsrlb-admin-settings-test-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads the admin section of a file whose services are broken, with a relative tokenFile taken from the file\'s directory', async () => {
    const file = join(dir, 'broken.yaml');
    await writeFile(file, JSON.stringify({ ...BROKEN_SERVICES, admin: { listen: '192.0.2.5:9743', tokenFile: 'secrets/admin.token' } }));
    expect(await loadAdminSettings(file)).toEqual({ ok: true, listen: { host: '192.0.2.5', port: 9743 }, tokenFile: join(dir, 'secrets/admin.token') });
  });

  it('says missing: true for a file that does not exist, and only then', async () => {
    const missing = join(dir, 'nope.yaml');
    expect(await loadAdminSettings(missing)).toEqual({
      ok: false,
      missing: true,
      problems: [{ path: '(file)', message: `cannot read "${missing}": ENOENT: no such file or directory` }],
    });
    const directory = join(dir, 'a-directory');
    await mkdir(directory);
    const unreadable = await loadAdminSettings(directory);
    expect(unreadable).toEqual({ ok: false, problems: [{ path: '(file)', message: expect.stringMatching(/^cannot read ".*": EISDIR/) }] });
  });

  it('reports a YAML error the way the full validation does', async () => {
    const file = join(dir, 'syntax.yaml');
    await writeFile(file, 'admin: { listen: 127.0.0.1:9743 }\nadmin: {}\n');
    expect(await loadAdminSettings(file)).toEqual({ ok: false, problems: [{ path: '(yaml) line 2, column 1', message: 'the key "admin" is given twice in one mapping (YAML keys must be unique)' }] });
  });

  it('finds the admin section past a YAML syntax error elsewhere in the file, and refuses when the error may be in it', async () => {
    const load = async (text: string) => {
      const file = join(dir, 'tabs.yaml');
      await writeFile(file, text);
      return loadAdminSettings(file);
    };
    const tabbedService = 'services:\n  - name: web\n\tvip: 203.0.113.10\n';
    // A tab-indented line in services, after or before the admin section: the operator still reaches the daemon.
    expect(await load(`interface: eth0\nadmin:\n  listen: 127.0.0.1:9800\n${tabbedService}`)).toEqual({ ok: true, listen: { host: '127.0.0.1', port: 9800 }, tokenFile: null });
    expect(await load(`interface: eth0\n${tabbedService}admin:\n  listen: 127.0.0.1:9801\n`)).toEqual({ ok: true, listen: { host: '127.0.0.1', port: 9801 }, tokenFile: null });
    // No admin section at all: the defaults.
    expect(await load(`interface: eth0\n${tabbedService}`)).toEqual({ ok: true, listen: { host: '127.0.0.1', port: 9743 }, tokenFile: null });
    // The bad line sits in the admin section (its tokenFile would be lost): the YAML error, as before.
    expect(await load('interface: eth0\nadmin:\n  listen: 127.0.0.1:9802\n\ttokenFile: /etc/dsrlb/admin.token\nservices: []\n')).toEqual({
      ok: false,
      problems: [{ path: '(yaml) line 4, column 1', message: 'Tabs are not allowed as indentation' }],
    });
  });

  it('reports a broken admin section with its paths', async () => {
    const file = join(dir, 'bad-admin.yaml');
    await writeFile(file, 'interface: eth0\nadmin:\n  listen: localhost:9743\nservices: []\n');
    expect(await loadAdminSettings(file)).toEqual({
      ok: false,
      problems: [{ path: 'admin.listen', message: '"localhost:9743" is not a listen address: "localhost" is not an IP address (e.g. 127.0.0.1:9743 or [::1]:9743)', position: { line: 3, column: 3 } }],
    });
    // Past a YAML error elsewhere (a tab in services), the admin section's problems keep their lines too.
    await writeFile(file, 'interface: eth0\nservices:\n  - name: web\n\tvip: 203.0.113.10\nadmin: { listen: "0.0.0.0:9743" }\n');
    expect(await loadAdminSettings(file)).toEqual({
      ok: false,
      problems: [{ path: 'admin.tokenFile', message: 'missing; a token file is required when admin.listen (0.0.0.0:9743) is not a loopback address', position: { line: 5, column: 1 } }],
    });
  });
});
