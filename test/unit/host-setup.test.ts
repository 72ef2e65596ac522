// HostSetup with a recording command runner: what a clean stop undoes (everything, adopted state
// too) and what a failed start undoes (only what its own process added); keep_addr_on_down, set
// while it holds IPv6 VIPs, through a fake /proc/sys.

import { spawnSync } from 'node:child_process';
import { chown, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HostSetup, nftRuleset, parseOffloads, procSysctl, type CommandRunner, type Sysctl } from '../../src/control/host-setup.js';
import { createLogger } from '../../src/control/logger.js';

function fakeHost(onLo: string[], offloads = ETHTOOL_K) {
  const calls: string[] = [];
  const lo = new Set(onLo);
  const runner: CommandRunner = async (argv, stdin) => {
    calls.push(argv.join(' ') + (stdin ? ` <<${stdin.match(/daddr \{ ([^}]*) \}/)?.[1] ?? ''}` : ''));
    if (argv[0] === 'ethtool' && argv[1] === '-k') return { stdout: offloads };
    if (argv[1] === '-j') {
      const info = argv[5] === 'lo' ? [...lo].map((c) => ({ local: c.split('/')[0], prefixlen: Number(c.split('/')[1]) })) : [];
      return { stdout: JSON.stringify([{ addr_info: info }]) };
    }
    if (argv[1] === 'addr' && argv[2] === 'add') lo.add(argv[3]!);
    if (argv[1] === 'addr' && argv[2] === 'del') lo.delete(argv[3]!);
    return { stdout: '' };
  };
  return { calls, lo, runner };
}

const quiet = createLogger(() => undefined);

/** `ethtool -k` of a NIC (trimmed), GRO on and LRO settable. */
const ETHTOOL_K = `Features for eth0:
rx-checksumming: on
tx-checksumming: on
generic-segmentation-offload: on
generic-receive-offload: on
large-receive-offload: off
rx-vlan-offload: on [fixed]
`;

async function runDir(prev: object | null): Promise<{ dir: string; file: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-host-'));
  const file = join(dir, `host-${statSync('/proc/self/ns/net').ino}-eth0.json`);
  if (prev) await writeFile(file, JSON.stringify(prev));
  return { dir, file };
}

describe('HostSetup', () => {
  it('records a VIP before it adds it: a crash in between leaves no VIP that no record names', async () => {
    const { dir, file } = await runDir(null);
    const host = fakeHost([]);
    const seenInRecord: boolean[] = [];
    const runner: CommandRunner = async (argv, stdin) => {
      if (argv[1] === 'addr' && argv[2] === 'add') {
        const record = JSON.parse(await readFile(file, 'utf8').catch(() => '{"addedAddresses":[]}')) as { addedAddresses: string[] };
        seenInRecord.push(record.addedAddresses.includes(argv[3]!));
      }
      return host.runner(argv, stdin);
    };
    const setup = new HostSetup('eth0', quiet, runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    // Before: written only once every address was on, so a crash in between lost them.
    expect(seenInRecord).toEqual([true, true]);
    // An add that fails: the addresses of that apply not added go from the record again.
    const failing: CommandRunner = async (argv, stdin) => {
      if (argv[1] === 'addr' && argv[2] === 'add' && argv[3] === '198.51.100.4/32') throw new Error('RTNETLINK answers: Operation not permitted');
      return runner(argv, stdin);
    };
    const again = new HostSetup('eth0', quiet, failing, dir);
    await again.adopt();
    await expect(again.apply(['198.51.100.1', '198.51.100.2', '198.51.100.3', '198.51.100.4'], { disableGro: false })).rejects.toThrow(/not permitted/);
    expect((JSON.parse(await readFile(file, 'utf8')) as { addedAddresses: string[] }).addedAddresses.sort()).toEqual(['198.51.100.1/32', '198.51.100.2/32', '198.51.100.3/32']);
    await rm(dir, { recursive: true, force: true });
  });

  it('undoes at start what a crashed run left on another interface of this netns (the config\'s interface changed meanwhile), and adopts its own', async () => {
    const { dir } = await runDir(null);
    const ino = statSync('/proc/self/ns/net').ino;
    const otherFile = join(dir, `host-${ino}-d0.json`);
    await writeFile(otherFile, JSON.stringify({ interface: 'd0', addedAddresses: ['203.0.113.10/32', '203.0.113.11/32'], groDisabled: true, offloadsBefore: { gro: true, lro: null } }));
    // Another netns's record is not ours to touch.
    const foreign = join(dir, `host-${ino + 1}-d0.json`);
    await writeFile(foreign, JSON.stringify({ interface: 'd0', addedAddresses: ['198.51.100.9/32'], groDisabled: false }));
    const host = fakeHost(['203.0.113.10/32', '203.0.113.11/32']);
    const setup = new HostSetup('d1', quiet, host.runner, dir);
    await setup.adopt();
    // Before: the d0 record was adopted by nobody and 203.0.113.11 stayed on lo after every stop.
    expect(host.calls).toContain('ip addr del 203.0.113.10/32 dev lo');
    expect(host.calls).toContain('ip addr del 203.0.113.11/32 dev lo');
    expect(host.calls).toContain('ethtool -K d0 gro on');
    // The table stays until apply replaces it: it guards this interface's adopted VIPs too.
    expect(host.calls.some((c) => c.startsWith('nft delete'))).toBe(false);
    await expect(readFile(otherFile, 'utf8')).rejects.toThrow(/ENOENT/);
    expect(JSON.parse(await readFile(foreign, 'utf8')).addedAddresses).toEqual(['198.51.100.9/32']);
    // The VIP still wanted is this run's now: added, recorded, and undone at its stop.
    await setup.apply(['203.0.113.10'], { disableGro: false });
    expect([...host.lo]).toEqual(['203.0.113.10/32']);
    await setup.undo();
    expect([...host.lo]).toEqual([]);
    await rm(dir, { recursive: true, force: true });
  });

  it('after a failed start removes only the VIPs its own process added and keeps the adopted record', async () => {
    const { dir, file } = await runDir({ interface: 'eth0', addedAddresses: ['198.51.100.1/32'], groDisabled: false });
    const host = fakeHost(['198.51.100.1/32']);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    expect([...host.lo].sort()).toEqual(['198.51.100.1/32', '198.51.100.2/32']);
    host.calls.length = 0;
    await setup.undoOwn();
    expect([...host.lo]).toEqual(['198.51.100.1/32']);
    expect(host.calls).toContain('ip addr del 198.51.100.2/32 dev lo');
    expect(host.calls).not.toContain('ip addr del 198.51.100.1/32 dev lo');
    // The predecessor's table stays, dropping its VIP only.
    expect(host.calls).toContain('nft -f - <<198.51.100.1');
    expect(host.calls.some((c) => c.startsWith('nft delete'))).toBe(false);
    expect(JSON.parse(await readFile(file, 'utf8')).addedAddresses).toEqual(['198.51.100.1/32']);
  });

  it('after a failed start with nothing adopted leaves no VIP, no table and no record', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.2'], { disableGro: false });
    await setup.undoOwn();
    expect([...host.lo]).toEqual([]);
    expect(host.calls).toContain('nft delete table inet dsrlb');
    expect(await readdir(dir)).toEqual([]);
  });

  it('on a clean stop undoes everything it recorded, adopted VIPs too', async () => {
    const { dir } = await runDir({ interface: 'eth0', addedAddresses: ['198.51.100.1/32'], groDisabled: false });
    const host = fakeHost(['198.51.100.1/32']);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    await setup.undo();
    expect([...host.lo]).toEqual([]);
    expect(await readdir(dir)).toEqual([]);
  });

  it('never leaves the kernel a VIP without its drop rule: the rule before the address at start, the address before the rule at stop and on a reload', async () => {
    // Without the rule the kernel, holding the VIP, answers the clients itself: a restart under
    // traffic reset every connection the loop carried (the rule came off before the addresses).
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    const lines = (from: number) => host.calls.slice(from).filter((c) => !c.startsWith('ip -j'));
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    expect(lines(0)).toEqual(['nft -f - <<198.51.100.1, 198.51.100.2', 'ip addr add 198.51.100.1/32 dev lo', 'ip addr add 198.51.100.2/32 dev lo']);
    // A reload: .3 comes in, .2 goes; .2 keeps its rule until its address is gone.
    let at = host.calls.length;
    await setup.apply(['198.51.100.1', '198.51.100.3'], { disableGro: false });
    expect(lines(at)).toEqual(['nft -f - <<198.51.100.1, 198.51.100.3, 198.51.100.2', 'ip addr add 198.51.100.3/32 dev lo', 'ip addr del 198.51.100.2/32 dev lo', 'nft -f - <<198.51.100.1, 198.51.100.3']);
    at = host.calls.length;
    await setup.undo();
    expect(lines(at)).toEqual(['ip addr del 198.51.100.1/32 dev lo', 'ip addr del 198.51.100.3/32 dev lo', 'nft delete table inet dsrlb']);
    await rm(dir, { recursive: true, force: true });
  });

  it('keeps a VIP whose removal failed guarded and recorded (apply, undo, undoOwn), and only such a failure', async () => {
    // `ip addr del` refused (a timeout, EPERM) with the address still there: before, it left the
    // record and the table, and the kernel held it unguarded for good.
    const { dir, file } = await runDir(null);
    const host = fakeHost([]);
    let refuse = '';
    const runner: CommandRunner = async (argv, stdin) => {
      if (argv[1] === 'addr' && argv[2] === 'del' && argv[3] === refuse) throw new Error(`${argv.join(' ')}: RTNETLINK answers: Operation not permitted`);
      return host.runner(argv, stdin);
    };
    const lines = (from: number) => host.calls.slice(from).filter((c) => !c.startsWith('ip -j'));
    const setup = new HostSetup('eth0', quiet, runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    refuse = '198.51.100.2/32';
    let at = host.calls.length;
    await setup.apply(['198.51.100.1'], { disableGro: false });
    // The table keeps guarding .2: loaded once, not narrowed.
    expect(lines(at)).toEqual(['nft -f - <<198.51.100.1, 198.51.100.2']);
    expect(JSON.parse(await readFile(file, 'utf8')).addedAddresses).toEqual(['198.51.100.1/32', '198.51.100.2/32']);
    // At stop: .1 goes with the table kept for .2, and the record names .2 for the next start.
    at = host.calls.length;
    await setup.undo();
    expect(lines(at)).toEqual(['ip addr del 198.51.100.1/32 dev lo', 'nft -f - <<198.51.100.2']);
    expect(JSON.parse(await readFile(file, 'utf8')).addedAddresses).toEqual(['198.51.100.2/32']);
    // The next start adopts it and removes it once it can.
    refuse = '';
    const next = new HostSetup('eth0', quiet, runner, dir);
    await next.adopt();
    await next.apply(['198.51.100.1'], { disableGro: false });
    expect([...host.lo].sort()).toEqual(['198.51.100.1/32']);
    // A failed start whose own VIP will not go: guarded and recorded as well.
    refuse = '198.51.100.1/32';
    await next.undo();
    expect([...host.lo]).toEqual(['198.51.100.1/32']);
    refuse = '';
    await next.undo();
    expect([...host.lo]).toEqual([]);
    expect(await readdir(dir)).toEqual([]);
    const failing = new HostSetup('eth0', quiet, runner, dir);
    await failing.adopt();
    await failing.apply(['198.51.100.3'], { disableGro: false });
    refuse = '198.51.100.3/32';
    at = host.calls.length;
    await failing.undoOwn();
    // (the refused del is not in the fake's calls) the table narrowed to it, not deleted.
    expect(lines(at)).toEqual(['nft -f - <<198.51.100.3']);
    expect(JSON.parse(await readFile(file, 'utf8')).addedAddresses).toEqual(['198.51.100.3/32']);
    await rm(dir, { recursive: true, force: true });
  });

  it('puts VIPs back on an interface made again though nft fails, when the table in place guards them all; not a new VIP', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    let nftFails = false;
    let tables = 'table inet dsrlb\n';
    const runner: CommandRunner = async (argv, stdin) => {
      if (argv[0] === 'nft' && argv[1] === 'list') return { stdout: tables };
      if (nftFails && argv[0] === 'nft') throw new Error('nft -f -: no answer within 10 s (killed)');
      return host.runner(argv, stdin);
    };
    const setup = new HostSetup('eth0', quiet, runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    host.lo.clear(); // the addresses went with the interface
    nftFails = true;
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    expect([...host.lo].sort()).toEqual(['198.51.100.1/32', '198.51.100.2/32']);
    // A VIP the table does not guard yet is not added unguarded.
    await expect(setup.apply(['198.51.100.1', '198.51.100.2', '198.51.100.3'], { disableGro: false })).rejects.toThrow(/killed/);
    expect(host.lo.has('198.51.100.3/32')).toBe(false);
    // Nor once the table was found gone (flushed from outside): then a failed nft is an error.
    expect(await setup.dropTablePresent()).toBe(true);
    tables = '';
    expect(await setup.dropTablePresent()).toBe(false);
    host.lo.clear();
    await expect(setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false })).rejects.toThrow(/killed/);
    expect([...host.lo]).toEqual([]);
    await rm(dir, { recursive: true, force: true });
  });

  it('refuses to start, as root, over a record another user owns (the service user may write /run/dsrlb): its VIPs are neither removed nor forgotten', async () => {
    if (process.geteuid?.() !== 0) throw new Error('this test needs root (files of another uid)');
    for (const which of ['eth0', 'eth9']) {
      const dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-host-'));
      const file = join(dir, `host-${statSync('/proc/self/ns/net').ino}-${which}.json`);
      await writeFile(file, JSON.stringify({ interface: which, addedAddresses: ['198.51.100.1/32'], groDisabled: true, keepAddrOnDownBefore: 0 }));
      await chown(file, 65534, 65534);
      const host = fakeHost(['198.51.100.1/32']);
      const setup = new HostSetup('eth0', quiet, host.runner, dir);
      // Trusted, it named what root removes; written over or removed, its VIPs stayed on lo for good.
      await expect(setup.adopt()).rejects.toMatchObject({ code: 'FOREIGN_HOST_RECORD', message: expect.stringMatching(/was left by dsrlb running as user nobody \(uid 65534\), which did not stop cleanly/) });
      expect(host.calls.filter((c) => c.startsWith('ip addr del') || c.startsWith('ethtool'))).toEqual([]);
      expect([...host.lo]).toEqual(['198.51.100.1/32']);
      expect(await readdir(dir)).toEqual([basename(file)]);
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('turns GRO/LRO off for io: pcap and puts back, on stop, exactly what was on before', async () => {
    for (const [name, text, off, on] of [
      ['GRO on, LRO off', ETHTOOL_K, 'ethtool -K eth0 gro off', 'ethtool -K eth0 gro on'],
      ['both on', ETHTOOL_K.replace('large-receive-offload: off', 'large-receive-offload: on'), 'ethtool -K eth0 gro off lro off', 'ethtool -K eth0 gro on lro on'],
      ['GRO off, LRO fixed (veth)', 'generic-receive-offload: off\nlarge-receive-offload: off [fixed]\n', null, null],
    ] as const) {
      const { dir } = await runDir(null);
      const host = fakeHost([], text);
      const setup = new HostSetup('eth0', quiet, host.runner, dir);
      await setup.adopt();
      await setup.apply(['198.51.100.2'], { disableGro: true });
      const set = host.calls.filter((c) => c.startsWith('ethtool -K'));
      expect(set, name).toEqual(off ? [off] : []);
      host.calls.length = 0;
      await setup.undo();
      expect(host.calls.filter((c) => c.startsWith('ethtool -K')), name).toEqual(on ? [on] : []);
    }
  });

  it('restores GRO from an adopted record of a crashed run, older records (no offloads recorded) meaning GRO on', async () => {
    for (const [prev, on] of [
      [{ interface: 'eth0', addedAddresses: [], groDisabled: true }, ['ethtool -K eth0 gro on']],
      [{ interface: 'eth0', addedAddresses: [], groDisabled: true, offloadsBefore: { gro: false, lro: true } }, ['ethtool -K eth0 lro on']],
    ] as const) {
      const { dir } = await runDir(prev);
      const host = fakeHost([], 'generic-receive-offload: off\nlarge-receive-offload: off\n');
      const setup = new HostSetup('eth0', quiet, host.runner, dir);
      await setup.adopt();
      await setup.apply([], { disableGro: true });
      await setup.undo();
      expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(on);
    }
  });

  it('turns GRO/LRO off anyway when ethtool -k fails, says so, and puts GRO back at stop', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const runner: CommandRunner = async (argv, stdin) => {
      if (argv[0] === 'ethtool' && argv[1] === '-k') throw new Error('ethtool: no such device');
      return host.runner(argv, stdin);
    };
    const lines: string[] = [];
    const setup = new HostSetup('eth0', createLogger((l) => lines.push(l)), runner, dir);
    await setup.adopt();
    await setup.apply([], { disableGro: true });
    expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(['ethtool -K eth0 gro off lro off']);
    expect(lines.some((l) => l.includes('could not read GRO/LRO'))).toBe(true);
    host.calls.length = 0;
    await setup.undo();
    expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(['ethtool -K eth0 gro on']);
  });

  it('reads GRO and LRO from ethtool -k, a [fixed] feature as not ours to set', () => {
    expect(parseOffloads(ETHTOOL_K)).toEqual({ gro: true, lro: false });
    expect(parseOffloads('generic-receive-offload: off\nlarge-receive-offload: off [fixed]\n')).toEqual({ gro: false, lro: null });
    expect(parseOffloads('')).toEqual({ gro: null, lro: null });
  });
});

const KEEP = 'net/ipv6/conf/eth0/keep_addr_on_down';
const KEEP_ALL = 'net/ipv6/conf/all/keep_addr_on_down';

/**
 * /proc/sys as a map (a key left out does not exist: no IPv6); its writes go into `calls`, the
 * host's list of commands, so their order against the `ip addr` commands shows.
 */
function fakeSysctl(calls: string[], values: Record<string, string>) {
  const reads: string[] = [];
  const sysctl: Sysctl = {
    read: async (key) => {
      reads.push(key);
      return values[key] ?? null;
    },
    write: async (key, value) => {
      if (!(key in values)) throw new Error(`ENOENT: /proc/sys/${key}`);
      calls.push(`sysctl ${key}=${value}`);
      values[key] = value;
    },
  };
  return { sysctl, reads, values };
}

/** A run dir (with `prev` recorded), a host with `onLo` on lo, sysctls at `values`, and the HostSetup over them. */
async function sysctlRig(prev: object | null, onLo: string[], values: Record<string, string>) {
  const { dir, file } = await runDir(prev);
  const host = fakeHost(onLo);
  const sys = fakeSysctl(host.calls, values);
  return { dir, file, host, sys, setup: new HostSetup('eth0', quiet, host.runner, dir, sys.sysctl) };
}

const sysctlCalls = (calls: string[]) => calls.filter((c) => c.startsWith('sysctl '));

describe('HostSetup: net.ipv6.conf.<if>.keep_addr_on_down while it holds IPv6 VIPs', () => {
  it('sets it to 1 before the first IPv6 VIP goes on, records the old value and puts it back at stop', async () => {
    const { dir, file, host, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '0' });
    await setup.adopt();
    await setup.apply(['198.51.100.1', '2001:db8::10'], { disableGro: false });
    const v6Add = host.calls.indexOf('ip addr add 2001:db8::10/128 dev eth0 nodad preferred_lft 0');
    expect(host.calls.indexOf(`sysctl ${KEEP}=1`)).toBeGreaterThanOrEqual(0);
    expect(host.calls.indexOf(`sysctl ${KEEP}=1`)).toBeLessThan(v6Add);
    expect(JSON.parse(await readFile(file, 'utf8')).keepAddrOnDownBefore).toBe(0);
    // A reload that keeps the VIP writes nothing more (the value is 1 now).
    await setup.apply(['198.51.100.1', '2001:db8::10'], { disableGro: false });
    expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=1`]);
    host.calls.length = 0;
    await setup.undo();
    expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=0`]);
    // After the VIP is gone.
    expect(host.calls.indexOf(`sysctl ${KEEP}=0`)).toBeGreaterThan(host.calls.indexOf('ip addr del 2001:db8::10/128 dev eth0'));
    expect(await readdir(dir)).toEqual([]);
  });

  it('puts back -1, the value an interface may have had', async () => {
    const { file, sys, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '-1' });
    await setup.apply(['2001:db8::10'], { disableGro: false });
    expect(sys.values[KEEP]).toBe('1');
    expect(JSON.parse(await readFile(file, 'utf8')).keepAddrOnDownBefore).toBe(-1);
    await setup.undo();
    expect(sys.values[KEEP]).toBe('-1');
  });

  it('leaves it alone without IPv6 VIPs: not even read', async () => {
    const { file, host, sys, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '0' });
    await setup.apply(['198.51.100.1'], { disableGro: false });
    expect(JSON.parse(await readFile(file, 'utf8'))).not.toHaveProperty('keepAddrOnDownBefore');
    await setup.undo();
    expect(sys.reads).toEqual([]);
    expect(sysctlCalls(host.calls)).toEqual([]);
  });

  it('writes nothing and records nothing where the kernel keeps the addresses already (the interface or `all` above 0)', async () => {
    for (const values of [
      { [KEEP_ALL]: '0', [KEEP]: '1' },
      { [KEEP_ALL]: '1', [KEEP]: '0' },
      { [KEEP_ALL]: '1', [KEEP]: '-1' }, // `all` wins when it is not 0
    ]) {
      const { file, host, setup } = await sysctlRig(null, [], { ...values });
      await setup.apply(['2001:db8::10'], { disableGro: false });
      expect(JSON.parse(await readFile(file, 'utf8')), JSON.stringify(values)).not.toHaveProperty('keepAddrOnDownBefore');
      await setup.undo();
      expect(sysctlCalls(host.calls), JSON.stringify(values)).toEqual([]);
    }
  });

  it('with `all` at -1 (the interface value would not count) writes nothing and says the VIPs are lost on a flap', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const sys = fakeSysctl(host.calls, { [KEEP_ALL]: '-1', [KEEP]: '0' });
    const lines: string[] = [];
    const setup = new HostSetup('eth0', createLogger((l) => lines.push(l)), host.runner, dir, sys.sysctl);
    await setup.apply(['2001:db8::10'], { disableGro: false });
    expect(sysctlCalls(host.calls)).toEqual([]);
    expect(lines.some((l) => l.includes('all.keep_addr_on_down is -1'))).toBe(true);
  });

  it('on a host without IPv6 (no such setting) does nothing, and a setting it cannot write (read-only /proc/sys) is only a warning', async () => {
    {
      const { file, host, setup } = await sysctlRig(null, [], {});
      await setup.apply(['2001:db8::10'], { disableGro: false });
      expect(sysctlCalls(host.calls)).toEqual([]);
      expect(JSON.parse(await readFile(file, 'utf8'))).not.toHaveProperty('keepAddrOnDownBefore');
    }
    {
      const { dir, file } = await runDir(null);
      const host = fakeHost([]);
      const sys = fakeSysctl(host.calls, { [KEEP_ALL]: '0', [KEEP]: '0' });
      sys.sysctl.write = async () => {
        throw new Error('EROFS: read-only file system');
      };
      const lines: string[] = [];
      const setup = new HostSetup('eth0', createLogger((l) => lines.push(l)), host.runner, dir, sys.sysctl);
      await setup.apply(['2001:db8::10'], { disableGro: false });
      expect(host.calls).toContain('ip addr add 2001:db8::10/128 dev eth0 nodad preferred_lft 0');
      expect(lines.some((l) => l.includes('could not set keep_addr_on_down') && l.includes('EROFS'))).toBe(true);
      expect(JSON.parse(await readFile(file, 'utf8'))).not.toHaveProperty('keepAddrOnDownBefore');
    }
  });

  it('puts it back when a reload removes the last IPv6 VIP, and sets it again when one comes back', async () => {
    const { file, host, sys, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '0' });
    await setup.apply(['198.51.100.1', '2001:db8::10'], { disableGro: false });
    await setup.apply(['198.51.100.1'], { disableGro: false });
    expect(sys.values[KEEP]).toBe('0');
    expect(JSON.parse(await readFile(file, 'utf8'))).not.toHaveProperty('keepAddrOnDownBefore');
    await setup.apply(['198.51.100.1', '2001:db8::20'], { disableGro: false });
    expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=1`, `sysctl ${KEEP}=0`, `sysctl ${KEEP}=1`]);
    expect(JSON.parse(await readFile(file, 'utf8')).keepAddrOnDownBefore).toBe(0);
  });

  it('sets it again on an interface made again (back at the default) and keeps the value recorded first', async () => {
    const { file, sys, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '-1' });
    await setup.apply(['2001:db8::10'], { disableGro: false });
    sys.values[KEEP] = '0'; // the new interface has net.ipv6.conf.default's value
    await setup.apply(['2001:db8::10'], { disableGro: false }); // as after a loop restart
    expect(sys.values[KEEP]).toBe('1');
    expect(JSON.parse(await readFile(file, 'utf8')).keepAddrOnDownBefore).toBe(-1);
    await setup.undo();
    expect(sys.values[KEEP]).toBe('-1');
  });

  it('adopts the value a crashed run recorded and puts it back at stop', async () => {
    const prev = { interface: 'eth0', addedAddresses: ['2001:db8::10/128'], groDisabled: false, keepAddrOnDownBefore: -1 };
    const { file, host, setup } = await sysctlRig(prev, ['2001:db8::10/128'], { [KEEP_ALL]: '0', [KEEP]: '1' }); // as the crashed run left it
    await setup.adopt();
    await setup.apply(['2001:db8::10'], { disableGro: false });
    expect(sysctlCalls(host.calls)).toEqual([]);
    expect(JSON.parse(await readFile(file, 'utf8')).keepAddrOnDownBefore).toBe(-1);
    await setup.undo();
    expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=-1`]);
  });

  it('adopted with a config that has no IPv6 VIP any more: puts it back at once', async () => {
    const prev = { interface: 'eth0', addedAddresses: ['2001:db8::10/128'], groDisabled: false, keepAddrOnDownBefore: 0 };
    const { file, host, setup } = await sysctlRig(prev, ['2001:db8::10/128'], { [KEEP_ALL]: '0', [KEEP]: '1' });
    await setup.adopt();
    await setup.apply(['198.51.100.1'], { disableGro: false });
    expect([...host.lo]).toEqual(['198.51.100.1/32']);
    expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=0`]);
    expect(JSON.parse(await readFile(file, 'utf8'))).not.toHaveProperty('keepAddrOnDownBefore');
  });

  it('after a failed start puts back only the value its own process set', async () => {
    // Nothing adopted: this start set it, so it goes back.
    {
      const { dir, host, setup } = await sysctlRig(null, [], { [KEEP_ALL]: '0', [KEEP]: '0' });
      await setup.adopt();
      await setup.apply(['2001:db8::10'], { disableGro: false });
      await setup.undoOwn();
      expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=1`, `sysctl ${KEEP}=0`]);
      expect(await readdir(dir)).toEqual([]);
    }
    // A crashed predecessor set it: it stays set and recorded, with the predecessor's VIP.
    {
      const prev = { interface: 'eth0', addedAddresses: ['2001:db8::10/128'], groDisabled: false, keepAddrOnDownBefore: -1 };
      const { file, host, sys, setup } = await sysctlRig(prev, ['2001:db8::10/128'], { [KEEP_ALL]: '0', [KEEP]: '1' });
      await setup.adopt();
      await setup.apply(['2001:db8::10', '2001:db8::20'], { disableGro: false });
      await setup.undoOwn();
      expect(sysctlCalls(host.calls)).toEqual([]);
      expect(sys.values[KEEP]).toBe('1');
      expect(JSON.parse(await readFile(file, 'utf8'))).toMatchObject({ addedAddresses: ['2001:db8::10/128'], keepAddrOnDownBefore: -1 });
    }
    // A predecessor from before this setting was kept left an IPv6 VIP and the value at 0: this
    // start set it, so it goes back; the predecessor's VIP and record stay as they were.
    {
      const prev = { interface: 'eth0', addedAddresses: ['2001:db8::10/128'], groDisabled: false };
      const { file, host, setup } = await sysctlRig(prev, ['2001:db8::10/128'], { [KEEP_ALL]: '0', [KEEP]: '0' });
      await setup.adopt();
      await setup.apply(['2001:db8::10'], { disableGro: false });
      await setup.undoOwn();
      expect(sysctlCalls(host.calls)).toEqual([`sysctl ${KEEP}=1`, `sysctl ${KEEP}=0`]);
      expect([...host.lo]).toEqual(['2001:db8::10/128']);
      const record = JSON.parse(await readFile(file, 'utf8'));
      expect(record.addedAddresses).toEqual(['2001:db8::10/128']);
      expect(record).not.toHaveProperty('keepAddrOnDownBefore');
    }
  });

  it('procSysctl reads and writes the files below its root, a VLAN interface\'s dot as it is; a missing one reads as null', async () => {
    const root = await mkdtemp(join(tmpdir(), 'dsrlb-sysctl-'));
    await mkdir(join(root, 'net/ipv6/conf/eth0.100'), { recursive: true });
    await writeFile(join(root, 'net/ipv6/conf/eth0.100/keep_addr_on_down'), '0\n');
    const sysctl = procSysctl(root);
    expect(await sysctl.read('net/ipv6/conf/eth0.100/keep_addr_on_down')).toBe('0');
    await sysctl.write('net/ipv6/conf/eth0.100/keep_addr_on_down', '1');
    expect(await readFile(join(root, 'net/ipv6/conf/eth0.100/keep_addr_on_down'), 'utf8')).toBe('1');
    expect(await sysctl.read('net/ipv6/conf/eth1/keep_addr_on_down')).toBeNull();
  });
});

describe('the nftables table', () => {
  it('loads where /etc/protocols is missing (a minimal Debian without netbase): no protocol named, only nft keywords and numbers', async () => {
    // Checked by nft itself (-c: parse and check, nothing applied) in a mount namespace where
    // /etc/protocols is an empty file (where it exists at all); as root, which the suite runs as.
    if (process.getuid?.() !== 0) throw new Error('this test needs root (nft -c asks the kernel)');
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-test-nft-'));
    try {
      const file = join(dir, 'rules.nft');
      await writeFile(file, nftRuleset(['198.51.100.1', '2001:db8::10']));
      const empty = join(dir, 'protocols');
      await writeFile(empty, '');
      const r = spawnSync('unshare', ['-m', 'sh', '-c', `{ [ ! -e /etc/protocols ] || mount --bind ${empty} /etc/protocols; } && nft -c -f ${file}`], { encoding: 'utf8' });
      // Before: "Could not resolve protocol name ... frag nexthdr ipv6-icmp", and no daemon with an IPv6 VIP started.
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
