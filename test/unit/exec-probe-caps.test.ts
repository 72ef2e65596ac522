// Exec checks get none of the daemon's capabilities: run from a node process that holds ambient
// CAP_NET_RAW and CAP_NET_ADMIN as the unit's user (setpriv simulates dsrlb.service), the command
// sees empty inheritable, permitted, effective and ambient sets. The decision table, and the exec
// probe's behaviours (exit status, environment, group kill) with the setpriv wrapper in place.
// Needs root (it starts its child as nobody with capabilities), as the namespace tests do.

import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { Logger } from '../../src/control/logger.js';
import { SETPRIV_CLEAR_ARGS, findSetpriv, parseInheritedCapabilities, planExecLaunch } from '../../src/health/exec-capabilities.js';
import { ExecProber } from '../../src/health/exec-probe.js';
import { runProbe, type ProbeResult, type ProbeTarget } from '../../src/health/probe.js';
import { healthCheck } from '../support/health-check.js';

const NET_RAW_ADMIN = '0000000000003000';
const NONE = '0000000000000000';
const SETPRIV = findSetpriv();

/** dsrlb.service as setpriv can make it: user nobody, bounding set and ambient set NET_RAW and NET_ADMIN, no new privileges. */
const AS_UNIT = [
  'setpriv',
  '--reuid=65534',
  '--regid=65534',
  '--clear-groups',
  '--bounding-set=-all,+net_raw,+net_admin',
  '--no-new-privs',
  '--inh-caps=+net_raw,+net_admin',
  '--ambient-caps=+net_raw,+net_admin',
];

const root = new URL('../../', import.meta.url);
/** Runs an ExecProber (argv[1]: `setpriv` as found, or `none`) on `grep Cap /proc/self/status`; prints its own sets, the result and the warnings. */
const CHILD = `
  import { readFileSync } from 'node:fs';
  import { ExecProber } from '${new URL('src/health/exec-probe.ts', root).href}';
  import { runProbe } from '${new URL('src/health/probe.ts', root).href}';
  const warnings = [];
  const log = { debug() {}, info() {}, error() {}, warn: (msg) => warnings.push(msg) };
  const prober = new ExecProber('/bin/sh', process.argv[1] === 'none' ? { log, setpriv: null } : { log });
  const check = { type: 'exec', command: 'grep Cap /proc/self/status; exit 3' };
  const target = { address: '127.0.0.7', port: 8080, vip: '10.0.0.100', service: 'web', check };
  const running = runProbe(prober, target, 5000);
  const result = await running.result;
  await running.finished;
  const self = readFileSync('/proc/self/status', 'utf8');
  console.log(JSON.stringify({ self, result, warnings }));
`;

interface ChildReport {
  self: string;
  result: ProbeResult;
  warnings: string[];
}

async function runAsUnit(setpriv: 'setpriv' | 'none'): Promise<ChildReport> {
  const argv = [...AS_UNIT, process.execPath, '--import', new URL('test/support/ts-loader.mjs', root).href, '--input-type=module', '-e', CHILD, setpriv];
  const child = spawn(argv[0]!, argv.slice(1), { cwd: '/', stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  expect({ code, err }).toEqual({ code: 0, err: '' });
  return JSON.parse(out) as ChildReport;
}

/** The capability sets in a `grep Cap` output (as status text or a probe's one-line detail). */
function capSets(text: string): Record<string, string> {
  return Object.fromEntries([...text.matchAll(/(Cap\w+):\s*([0-9a-f]{16})/g)].map((m) => [m[1]!, m[2]!]));
}

describe('exec checks from a daemon with ambient CAP_NET_RAW and CAP_NET_ADMIN (the unit)', () => {
  it('the command sees empty inheritable, permitted, effective and ambient sets', async () => {
    expect(SETPRIV).not.toBeNull();
    const r = await runAsUnit('setpriv');
    // The daemon (the node child) holds them; its command does not.
    expect(capSets(r.self)).toMatchObject({ CapInh: NET_RAW_ADMIN, CapPrm: NET_RAW_ADMIN, CapEff: NET_RAW_ADMIN, CapAmb: NET_RAW_ADMIN });
    expect(r.result).toMatchObject({ ok: false, reason: 'exit' });
    if (r.result.ok) return;
    expect(r.result.detail).toMatch(/^exit status 3: /);
    expect(capSets(r.result.detail)).toEqual({ CapInh: NONE, CapPrm: NONE, CapEff: NONE, CapBnd: NET_RAW_ADMIN, CapAmb: NONE });
    expect(r.warnings).toEqual([]);
  });

  it('without setpriv the command keeps them (what the fix prevents), and that is logged once', async () => {
    const r = await runAsUnit('none');
    expect(r.result).toMatchObject({ ok: false, reason: 'exit' });
    if (r.result.ok) return;
    expect(capSets(r.result.detail)).toMatchObject({ CapInh: NET_RAW_ADMIN, CapEff: NET_RAW_ADMIN, CapAmb: NET_RAW_ADMIN });
    expect(r.warnings).toHaveLength(1);
    expect(r.warnings[0]).toMatch(/keep the daemon's ambient and inheritable capabilities/);
  });
});

describe('planExecLaunch: when to wrap the shell in setpriv', () => {
  const wrapped = ['/usr/bin/setpriv', ...SETPRIV_CLEAR_ARGS];
  const cases: { name: string; uid: number; inh: string; amb: string; setpriv: string | null; prefix: readonly string[]; warns: RegExp | null }[] = [
    { name: 'the unit (ambient set, not root): wrapped, nothing logged', uid: 999, inh: NET_RAW_ADMIN, amb: NET_RAW_ADMIN, setpriv: '/usr/bin/setpriv', prefix: wrapped, warns: null },
    { name: 'only inheritable set: wrapped', uid: 999, inh: NET_RAW_ADMIN, amb: NONE, setpriv: '/usr/bin/setpriv', prefix: wrapped, warns: null },
    { name: 'the unit without setpriv: not wrapped, logged', uid: 999, inh: NET_RAW_ADMIN, amb: NET_RAW_ADMIN, setpriv: null, prefix: [], warns: /setpriv \(util-linux\) was not found/ },
    { name: 'an unprivileged user with nothing to pass on: no wrapper, no extra exec', uid: 999, inh: NONE, amb: NONE, setpriv: '/usr/bin/setpriv', prefix: [], warns: null },
    { name: 'root with nothing to clear: runs as root (as keepalived without script_user), logged', uid: 0, inh: NONE, amb: NONE, setpriv: '/usr/bin/setpriv', prefix: [], warns: /run as root/ },
    { name: 'root with an ambient set: cleared, and still logged as root', uid: 0, inh: NET_RAW_ADMIN, amb: NET_RAW_ADMIN, setpriv: '/usr/bin/setpriv', prefix: wrapped, warns: /run as root/ },
    { name: 'sets unknown (no /proc): wrapped, clearing is harmless', uid: 999, inh: 'unknown', amb: 'unknown', setpriv: '/usr/bin/setpriv', prefix: wrapped, warns: null },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const plan = planExecLaunch({ uid: c.uid, inheritable: c.inh, ambient: c.amb }, c.setpriv);
      expect(plan.prefix).toEqual(c.prefix);
      if (c.warns === null) expect(plan.warning).toBeNull();
      else expect(plan.warning?.msg).toMatch(c.warns);
    });
  }

  it('never drops the bounding set (a no-op without CAP_SETPCAP; as root it breaks file-capability binaries such as ping)', () => {
    expect(SETPRIV_CLEAR_ARGS.some((a) => a.startsWith('--bounding-set'))).toBe(false);
  });

  it('reads CapInh and CapAmb from /proc/self/status text', () => {
    const status = `Name:\tnode\nCapInh:\t${NET_RAW_ADMIN}\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nCapAmb:\t${NONE}\n`;
    expect(parseInheritedCapabilities(status, 5)).toEqual({ uid: 5, inheritable: NET_RAW_ADMIN, ambient: NONE });
    // Before Linux 4.3 there is no ambient set.
    expect(parseInheritedCapabilities('CapInh:\t0000000000000000\n', 5).ambient).toBe('0');
  });
});

describe('the exec probe through the setpriv wrapper', () => {
  const warnings: string[] = [];
  const log: Logger = { debug() {}, info() {}, error() {}, warn: (msg) => warnings.push(msg) };
  // As the unit's user would: the sets are set, so every command goes through setpriv.
  const exec = new ExecProber('/bin/sh', { log, capabilities: { uid: 999, inheritable: NET_RAW_ADMIN, ambient: NET_RAW_ADMIN } });
  const target: ProbeTarget = { address: '127.0.0.7', port: 8080, vip: '10.0.0.100', service: 'web', check: healthCheck({ port: 8080, type: 'exec' }) };
  const probe = async (command: string, timeoutMs = 1000): Promise<ProbeResult> => {
    const running = runProbe(exec, { ...target, check: { ...target.check, command } }, timeoutMs);
    const result = await running.result;
    await running.finished;
    return result;
  };

  it('exit 0 is ok, exit 3 fails with its output; DSRLB_* are set; nothing is logged', async () => {
    expect((await probe('exit 0')).ok).toBe(true);
    expect(await probe('echo not ready >&2; exit 3')).toMatchObject({ ok: false, reason: 'exit', detail: 'exit status 3: not ready' });
    const r = await probe('echo "$DSRLB_REAL $DSRLB_PORT $DSRLB_VIP $DSRLB_SERVICE"; exit 9');
    expect(r).toMatchObject({ ok: false, reason: 'exit', detail: 'exit status 9: 127.0.0.7 8080 10.0.0.100 web' });
    expect(warnings).toEqual([]);
  });

  it('setpriv became the shell: child of this process, leader of its own session and process group (the pid the probe kills)', async () => {
    // /proc/PID/stat: pid (comm) state ppid pgrp session
    const r = await probe(`set -- $(cat /proc/$$/stat); [ "$2" = "(sh)" ] && [ "$4" = ${process.pid} ] && [ "$5" = $$ ] && [ "$6" = $$ ]`);
    expect(r.ok).toBe(true);
  });

  it('a timeout kills the whole process group, sleep 10 included', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-exec-caps-'));
    try {
      const pidFile = join(dir, 'sleep.pid');
      const started = performance.now();
      const r = await probe(`sleep 10 & echo $! > ${pidFile}; wait`, 300);
      expect(r).toMatchObject({ ok: false, reason: 'timeout' });
      expect(performance.now() - started).toBeLessThan(2000);
      const pid = Number(readFileSync(pidFile, 'utf8'));
      expect(pid).toBeGreaterThan(1);
      await new Promise((resolve) => setTimeout(resolve, 50));
      const stat = existsSync(`/proc/${pid}/stat`) ? readFileSync(`/proc/${pid}/stat`, 'utf8') : '';
      expect(stat === '' || /^\d+ \((sleep|sh)\) Z/.test(stat)).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a timeout also kills what left the shell's group (timeout 30 sleep ...)", async () => {
    const marker = `5${Math.floor(Math.random() * 1e6)}.5`;
    const r = await probe(`timeout 30 sleep ${marker}; true`, 300);
    expect(r).toMatchObject({ ok: false, reason: 'timeout' });
    await new Promise((resolve) => setTimeout(resolve, 100));
    const left = execFileSync('ps', ['-eo', 'stat=,args='], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes(marker) && !/^\s*Z/.test(l));
    expect(left).toEqual([]);
  });
});
