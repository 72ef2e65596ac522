// An acknowledged drain must survive a power cut: the state file is written aside and synced, then
// renamed, and the rename is made durable by syncing the directory. Seen through node:fs/promises
// (the calls the daemon makes, in order). No root, no loop.

import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';

const calls = vi.hoisted(() => [] as string[]);

vi.mock('node:fs/promises', async (importOriginal) => {
  const real = await importOriginal<typeof import('node:fs/promises')>();
  return {
    ...real,
    open: async (...args: Parameters<typeof real.open>) => {
      const fh = await real.open(...args);
      const path = String(args[0]);
      const sync = fh.sync.bind(fh);
      fh.sync = async () => {
        calls.push(`sync ${path}`);
        return sync();
      };
      return fh;
    },
    rename: async (from: string, to: string) => {
      calls.push(`rename ${from} -> ${to}`);
      return real.rename(from, to);
    },
  };
});

const { parseConfigText } = await import('../../src/config/validate.js');
const { Daemon } = await import('../../src/control/daemon.js');
const { createLogger } = await import('../../src/control/logger.js');

describe('saving the state file', () => {
  it('syncs the new file, renames it over the old one, then syncs the directory', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-state-'));
    const file = join(dir, 'dsrlb.state.json');
    const parsed = parseConfigText(`interface: eth0\nstateFile: ${file}\nservices:\n  - { name: web, vip: 10.93.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }] }\n`);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
    daemon.config = parsed.config;
    try {
      calls.length = 0;
      await (daemon as unknown as { saveState(o: Map<string, unknown>, w: Set<string>): Promise<void> }).saveState(new Map(), new Set(['web']));
      // Written aside under a random name (a fixed FILE.tmp could be a planted symlink).
      const tmp = /^sync (.*\.[0-9a-f]{16}\.tmp)$/.exec(calls[0] ?? '')?.[1];
      expect(tmp, calls.join('; ')).toBeDefined();
      expect(tmp!.startsWith(`${file}.`)).toBe(true);
      expect(calls).toEqual([`sync ${tmp}`, `rename ${tmp} -> ${file}`, `sync ${dir}`]);
    } finally {
      daemon.health.stop();
    }
  });
});
