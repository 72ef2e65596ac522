// The packet loops' PACKET_FANOUT group is the daemon's alone. Fanout group ids are shared by every
// program in a network namespace: dsrlb used to take (pid & 0xfffe) + 1, and when another program
// (a capture tool, an IDS, another dsrlb) had a group with that id on the interface, the loops
// joined it without a word, and that program took a share of the traffic (or the start failed
// with EINVAL when its type differed). Now the kernel picks an id no group uses
// (PACKET_FANOUT_FLAG_UNIQUEID), the other loops join it, a loop started again joins it, and when
// no loop holds it any more (the interface made again) a new one is made. Needs root, fails
// loudly otherwise.

import { execFile, spawn } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { requireRoot } from '../support/lab-daemon.js';

const run = promisify(execFile);
const NS = `dsrt-fgrp-${process.pid}`;
const SCRIPT = join(import.meta.dirname, '..', 'support', 'fanout-group.mjs');
const PEER = join(import.meta.dirname, '..', 'support', 'fanout-peer.py');
const COUNT = 20_000;

interface Flood {
  /** Frames each of our loops took, in the order the loops were started. */
  loops: number[];
  ours: number;
  /** Frames the other program's socket took. */
  other: number;
  groupId: number | null;
}

interface Result {
  count: number;
  otherGroupId: number;
  started?: Flood;
  restarted?: Flood;
  recreated?: Flood;
  restarts?: number;
  error?: string;
  lost: string[];
  logged: string[];
}

const ns = (...cmd: string[]) => run('ip', ['netns', 'exec', NS, ...cmd]);

beforeAll(async () => {
  requireRoot();
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
  await run('ip', ['netns', 'add', NS]);
  // No IPv6: no router solicitation or MLD report may add frames to the counts.
  await ns('sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1');
  await ns('ip', 'link', 'add', 'lb0', 'type', 'veth', 'peer', 'name', 'inj0');
  await ns('ip', 'addr', 'add', '10.200.0.1/24', 'dev', 'lb0');
  await ns('ip', 'link', 'set', 'lb0', 'up');
  await ns('ip', 'link', 'set', 'inj0', 'up');
});

afterAll(async () => {
  await run('ip', ['netns', 'del', NS]).catch(() => undefined);
});

describe("the packet loops' fanout group", () => {
  it('is not shared with another program that has a group under the id dsrlb used to take, also after a loop is started again and after the interface is made again', async () => {
    const { stdout } = await ns(process.execPath, SCRIPT, String(COUNT));
    const r = JSON.parse(stdout) as Result;
    console.log('fanout group:', JSON.stringify({ ...r, logged: r.logged.length }), r.logged.join('\n'));
    // Every frame reached our loops once between them (none went to the other program's socket,
    // none was taken twice), and the other program's group still saw every frame, as before we came.
    const shared = (f: Flood | undefined) => ({ ours: f?.ours, other: f?.other });
    expect(shared(r.started)).toEqual({ ours: COUNT, other: COUNT });
    expect(r.started!.groupId).not.toBe(r.otherGroupId);
    // Both loops take a share (16 flows spread by the hash).
    expect(r.started!.loops.every((n) => n > 0)).toBe(true);
    expect(r.error).toBeUndefined();
    expect(r.lost).toEqual([]);

    // The loop started again joined the same group: it takes a share, and no frame is taken twice.
    expect(shared(r.restarted)).toEqual({ ours: COUNT, other: COUNT });
    expect(r.restarted!.loops[2]).toBeGreaterThan(0);
    expect(r.restarted!.groupId).toBe(r.started!.groupId);

    // The interface made again: both loops ended and were started again in one new group (the old
    // one went with their sockets); the other program made its group again under the old id.
    expect(shared(r.recreated)).toEqual({ ours: COUNT, other: COUNT });
    expect(r.recreated!.loops.slice(3).every((n) => n > 0)).toBe(true);
    expect(r.recreated!.groupId).not.toBe(r.started!.groupId);
    expect(r.recreated!.groupId).not.toBe(r.otherGroupId);
    expect(r.restarts).toBe(3);
  }, 90_000);

  it('fails to start with an error that names the group when the kernel refuses to let a loop join it', async () => {
    // Another program's group of another type (round robin) under the id a loop is told to join.
    const peer = spawn('ip', ['netns', 'exec', NS, 'python3', PEER, 'member', 'lb0', '4242', '1'], { stdio: ['pipe', 'pipe', 'inherit'] });
    try {
      const [line] = await Promise.race([
        new Promise<string[]>((resolve) => peer.stdout.once('data', (d: Buffer) => resolve([d.toString().trim()]))),
        new Promise<never>((_, reject) => setTimeout(() => reject(new Error('the other program did not start')), 10_000)),
      ]);
      expect(line).toBe('ready');
      const probe = `
        const { AfPacketIo } = await import(${JSON.stringify(new URL('../../dist/io/afpacket-io.js', import.meta.url).href)});
        try { AfPacketIo.open({ interface: 'lb0', fanoutGroupId: 4242 }); console.log(JSON.stringify({ opened: true })); }
        catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`;
      const { stdout } = await ns(process.execPath, '--input-type=module', '-e', probe);
      const refused = JSON.parse(stdout) as { code?: string; message?: string };
      expect(refused.code).toBe('EINVAL');
      expect(refused.message).toMatch(/the kernel refused to let the socket on lb0 join PACKET_FANOUT group 4242, which another packet loop of this daemon made \(setsockopt\(PACKET_FANOUT\) on lb0: Invalid argument \(EINVAL\)\)/);
    } finally {
      peer.kill();
    }
  });
});
