// A host record another user's dsrlb left (the service user's daemon crashed, and root runs
// dsrlb by hand; or the other way round): the start is refused before the state file or anything
// on the host is touched, and the stop that follows a failed start leaves the record (and so the
// VIPs it names) to that user's next run. Before, the refusal came from adopt(), after the state
// file was rewritten, and the failed start's stop removed the record and the nftables table.

import { chown, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

describe('a host record another user left', () => {
  it('refuses the start, naming the user and what to do, and leaves the record and the state file alone', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-foreign-'));
    try {
      const runDir = join(dir, 'run');
      await mkdir(runDir, { mode: 0o755 });
      const record = join(runDir, `host-${statSync('/proc/self/ns/net').ino}-lo.json`);
      await writeFile(record, JSON.stringify({ interface: 'lo', addedAddresses: ['198.51.100.1/32'], groDisabled: false }));
      await chown(record, 65534, 65534);
      const stateFile = join(dir, 'dsrlb.state.json');
      const state = JSON.stringify({ intent: { 'tcp|198.51.100.1|80#10.93.0.11': { state: 'drain', configState: 'active', configWeight: 100 } }, withdrawn: [] });
      await writeFile(stateFile, state);
      const before = await stat(stateFile);
      const config = join(dir, 'dsrlb.yaml');
      // The intent names a real the config has as active, weight 100: a start that got as far as the
      // state file would keep it (prune) and rewrite the file; one with another weight would prune it.
      await writeFile(config, `interface: lo
stateFile: ${stateFile}
services:
  - { name: web, vip: 198.51.100.1, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11, weight: 7 }] }
`);
      const lines: Record<string, unknown>[] = [];
      const daemon = new Daemon(config, createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)));
      daemon.runDir = runDir;
      const refused = await daemon.start().then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
      expect(refused).toMatchObject({ code: 'FOREIGN_HOST_RECORD' });
      expect(refused!.message).toContain(`${record} was left by dsrlb running as user nobody (uid 65534), which did not stop cleanly`);
      expect(refused!.message).toContain('systemctl start dsrlb');
      await daemon.stop({ startFailed: true });
      // Its log says the refused start was undone, not that a running daemon stopped.
      expect(lines.map((l) => l.msg)).toContain('what the refused start changed is undone');
      expect(lines.map((l) => l.msg)).not.toContain('dsrlb stopped');
      // The record is still there for its owner; the state file was not rewritten (its stale entry
      // would have been pruned); no state-file record was made.
      expect(await readdir(runDir)).toEqual(expect.arrayContaining([`host-${statSync('/proc/self/ns/net').ino}-lo.json`]));
      expect((await readdir(runDir)).filter((f) => f.startsWith('state-'))).toEqual([]);
      expect(await readFile(stateFile, 'utf8')).toBe(state);
      expect((await stat(stateFile)).mtimeMs).toBe(before.mtimeMs);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
