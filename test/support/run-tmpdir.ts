import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// vitest globalSetup: one temporary directory per test run, made TMPDIR for the test workers and
// every process they start, and removed when the run ends, passed or failed. Tests write configs,
// state files, admin sockets and captures under os.tmpdir(); this way none is left behind.
export default function setup(): () => void {
  const root = mkdtempSync(join(tmpdir(), 'dsrlb-test-'));
  // As /tmp itself: tests run daemons as unprivileged users (install.sh's units), who must reach
  // the files there.
  chmodSync(root, 0o1777);
  process.env.TMPDIR = root;
  return () => rmSync(root, { recursive: true, force: true });
}
