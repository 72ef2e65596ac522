// A packet socket joining a PACKET_FANOUT group that is already taking traffic (a second loop of
// `workers: 2` starting beside the first): before it has joined, a bound socket sees every frame of
// the interface, the same frames the group's members forward, so those went out twice. A UDP flood
// on lo in a namespace of our own, with a socket joining and leaving the group ~60 times; needs
// root, fails loudly otherwise.

import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { requireRoot } from '../support/lab-daemon.js';

const run = promisify(execFile);
const NS = `dsrt-fanj-${process.pid}`;
const SCRIPT = join(import.meta.dirname, '..', 'support', 'fanout-join.mjs');

beforeAll(async () => {
  requireRoot();
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
  await run('ip', ['netns', 'add', NS]);
  await run('ip', ['-n', NS, 'link', 'set', 'lo', 'up']);
});

afterAll(async () => {
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
});

describe('a socket joining a busy fanout group', () => {
  it('never sees a frame that a member of the group also gets', async () => {
    const { stdout } = await run('ip', ['netns', 'exec', NS, process.execPath, SCRIPT, '1000', '4'], { timeout: 60_000 });
    const result = JSON.parse(stdout) as { sent: number; received: number; duplicated: number; joins: number; byJoiner: number };
    console.log('fanout join:', result);
    expect(result.joins).toBeGreaterThanOrEqual(20);
    expect(result.received).toBeGreaterThan(result.sent / 4);
    // The joiner took its share of the flows while it was in the group, and never a copy.
    expect(result.byJoiner).toBeGreaterThan(0);
    expect(result.duplicated).toBe(0);
  });
});
