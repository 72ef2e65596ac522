// deploy/linux/dsrlb-realserver in a fresh network namespace: check on a bare host, setup, idempotence,
// piece-by-piece reports of a broken host, remove restoring only what setup changed, and --persist
// files under DSRLB_ROOT. Needs root and `ip netns`; fails (never skips) without them.

import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const SCRIPT = fileURLToPath(new URL('../../deploy/linux/dsrlb-realserver', import.meta.url));
const PREFIX = `dsrt-rs-${process.pid}-`;
const NS = `${PREFIX}a`;
const VIP = '10.0.0.100';
const VIP6 = 'fd00:77::100';

interface Result {
  stdout: string;
  stderr: string;
  code: number;
}

function run(file: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<Result> {
  return new Promise((done) => {
    execFile(file, args, { env: { ...process.env, ...env }, encoding: 'utf8' }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : 255;
      done({ stdout, stderr, code });
    });
  });
}

async function mustRun(file: string, args: string[]): Promise<string> {
  const r = await run(file, args);
  if (r.code !== 0) throw new Error(`${file} ${args.join(' ')} failed (${r.code}): ${r.stderr}`);
  return r.stdout;
}

/** Runs the script inside the test namespace through dash, the strictest POSIX shell here. */
function script(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Result> {
  return run('ip', ['netns', 'exec', NS, 'dash', SCRIPT, ...args], env);
}

async function sysctl(iface: string, name: string): Promise<string> {
  return (await mustRun('ip', ['netns', 'exec', NS, 'cat', `/proc/sys/net/ipv4/conf/${iface}/${name}`])).trim();
}

async function loAddrs(): Promise<string[]> {
  const out = await mustRun('ip', ['-n', NS, '-o', 'addr', 'show', 'dev', 'lo']);
  return out
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => (l.trim().split(/\s+/)[3] ?? ''))
    .sort();
}

const stateFile = `/run/dsrlb-realserver/netns-${NS}.state`;

describe('dsrlb-realserver in a network namespace', () => {
  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces)');
    await mustRun('ip', ['netns', 'add', NS]);
    // A NIC besides lo, so the per-interface ARP sysctls have something to cover.
    await mustRun('ip', ['-n', NS, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
    await rm(stateFile, { force: true });
  });

  afterAll(async () => {
    await run('ip', ['netns', 'del', NS]);
    await rm(stateFile, { force: true });
    const left = (await mustRun('ip', ['netns', 'list'])).split('\n').filter((l) => l.startsWith(PREFIX));
    expect(left).toEqual([]);
  });

  it('check on a bare namespace exits 1 and names the missing VIP, arp_ignore and arp_announce with fixes', async () => {
    const r = await script(['check', '--vip', VIP]);
    expect(r.code).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toContain(`VIP ${VIP} missing on lo: run: ip addr add ${VIP}/32 dev lo`);
    expect(lines).toContain('lo is down: run: ip link set lo up');
    for (const iface of ['all', 'lo', 'eth0', 'eth1']) {
      expect(lines).toContain(
        `net.ipv4.conf.${iface}.arp_ignore is 0, want 1: run: sysctl -w net.ipv4.conf.${iface}.arp_ignore=1`,
      );
      expect(lines).toContain(
        `net.ipv4.conf.${iface}.arp_announce is 0, want 2: run: sysctl -w net.ipv4.conf.${iface}.arp_announce=2`,
      );
    }
    expect(lines.at(-1)).toBe('10 problem(s) found');
  });

  it('setup exits 0 and puts both VIPs on lo and the ARP sysctls in place', async () => {
    // The IPv6 VIP is given in a non-canonical form on purpose: the script compares RFC 5952 text.
    const r = await script(['setup', '--vip', `${VIP},fd00:77:0::0100`]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`added ${VIP}/32 on lo`);
    expect(r.stdout).toContain(`added ${VIP6}/128 on lo`);
    expect(await loAddrs()).toEqual(['10.0.0.100/32', '127.0.0.1/8', '::1/128', `${VIP6}/128`].sort());
    for (const iface of ['all', 'lo', 'eth0', 'eth1']) {
      expect(await sysctl(iface, 'arp_ignore')).toBe('1');
      expect(await sysctl(iface, 'arp_announce')).toBe('2');
    }
  });

  it('check then exits 0 with an ok summary', async () => {
    const r = await script(['check', '--vip', `${VIP},${VIP6}`]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`ok: VIPs ${VIP},${VIP6} on lo, ARP hidden on all lo eth0 eth1 (mode l2)\n`);
  });

  it('setup a second time changes nothing and exits 0', async () => {
    const addrsBefore = await loAddrs();
    const stateBefore = await readFile(stateFile, 'utf8');
    const r = await script(['setup', '--vip', `${VIP},${VIP6}`]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`setup ok, nothing to change (mode l2, VIPs ${VIP},${VIP6})\n`);
    expect(await loAddrs()).toEqual(addrsBefore);
    expect(await readFile(stateFile, 'utf8')).toBe(stateBefore);
  });

  it('reports a deliberately broken host piece by piece, each with its fix', async () => {
    await mustRun('ip', ['-n', NS, 'addr', 'del', `${VIP}/32`, 'dev', 'lo']);
    await mustRun('ip', ['netns', 'exec', NS, 'sh', '-c', 'echo 0 > /proc/sys/net/ipv4/conf/eth0/arp_ignore']);
    await mustRun('ip', ['-n', NS, 'addr', 'add', `${VIP6}/64`, 'dev', 'eth1', 'nodad']);
    const r = await script(['check', '--vip', `${VIP},${VIP6}`]);
    expect(r.code).toBe(1);
    expect(r.stdout.trim().split('\n')).toEqual([
      `VIP ${VIP} missing on lo: run: ip addr add ${VIP}/32 dev lo`,
      `VIP ${VIP6} is also on eth1 (this host would answer ARP/ND for it): run: ip addr del ${VIP6}/64 dev eth1`,
      'net.ipv4.conf.eth0.arp_ignore is 0, want 1: run: sysctl -w net.ipv4.conf.eth0.arp_ignore=1',
      '3 problem(s) found',
    ]);
    await mustRun('ip', ['-n', NS, 'addr', 'del', `${VIP6}/64`, 'dev', 'eth1']);
    const fixed = await script(['setup', '--vip', `${VIP},${VIP6}`]);
    expect(fixed.code).toBe(0);
    expect(fixed.stdout).toContain(`added ${VIP}/32 on lo`);
    expect(fixed.stdout).toContain('set net.ipv4.conf.eth0.arp_ignore=1 (was 0)');
    expect((await script(['check', '--vip', `${VIP},${VIP6}`])).code).toBe(0);
  });

  it('refuses bad input with exit 1 and one line naming the problem', async () => {
    const cases: Array<[string[], string]> = [
      [['setup', '--vip', '10.0.0.300'], '--vip 10.0.0.300: not an IPv4 or IPv6 address'],
      [['setup', '--vip', '10.0.0.1/24'], '--vip 10.0.0.1/24: give the address without a prefix length'],
      [['check', '--vip', VIP, '--mode', 'dr'], '--mode dr: want l2 or ipip'],
      [['check'], '--vip is required'],
      [['frobnicate', '--vip', VIP], "unknown command 'frobnicate'"],
      [['check', '--vip', VIP, '--interface', 'nope0'], '--interface nope0: no such interface'],
    ];
    for (const [args, message] of cases) {
      const r = await script(args);
      expect(r.code, args.join(' ')).toBe(1);
      expect(r.stderr).toContain(message);
    }
    const help = await script(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: dsrlb-realserver COMMAND --vip VIP[,VIP..]');
  });

  it('mode ipip on a kernel without ipip says to use dsrlb decap: check exits 1, setup exits 2', async () => {
    const tunnelMissing = (await run('ip', ['-n', NS, 'link', 'show', 'dev', 'tunl0'])).code !== 0;
    const check = await script(['check', '--vip', VIP, '--mode', 'ipip']);
    expect(check.code).toBe(1);
    if (tunnelMissing) {
      // This machine's kernel has no ipip module (see shared/design/lab-facts.md).
      expect(check.stdout).toContain(`kernel has no ipip support (tunl0 cannot be created): run: dsrlb decap --interface IF --vip ${VIP}`);
      const setup = await script(['setup', '--vip', VIP, '--mode', 'ipip']);
      expect(setup.code).toBe(2);
      expect(setup.stderr).toContain('kernel has no ipip support');
    } else {
      expect(check.stdout).toMatch(/tunl0 is down|rp_filter/);
    }
  });

  it('--mss clamps the MSS announced from the VIP with an nftables rule that check verifies', async () => {
    const before = await script(['check', '--vip', VIP, '--mss', '1440']);
    expect(before.code).toBe(1);
    expect(before.stdout).toContain(`TCP MSS from ${VIP} not clamped to 1440: run: dsrlb-realserver setup --vip ${VIP} --mss 1440`);
    const setup = await script(['setup', '--vip', VIP, '--mss', '1440']);
    expect(setup.code).toBe(0);
    const rules = await mustRun('ip', ['netns', 'exec', NS, 'nft', 'list', 'table', 'inet', 'dsrlb_realserver']);
    expect(rules).toContain(`ip saddr ${VIP}`);
    expect(rules).toContain('maxseg size set 1440');
    expect((await script(['check', '--vip', VIP, '--mss', '1440'])).code).toBe(0);
    expect((await script(['setup', '--vip', VIP, '--mss', '1440'])).stdout).toContain('nothing to change');
  });

  it('remove takes the VIPs off lo, restores the sysctls it set and drops its nftables table', async () => {
    // A sysctl changed by someone after setup is theirs: remove must leave it.
    await mustRun('ip', ['netns', 'exec', NS, 'sh', '-c', 'echo 2 > /proc/sys/net/ipv4/conf/eth1/arp_ignore']);
    const partial = await script(['remove', '--vip', VIP6]);
    expect(partial.code).toBe(0);
    expect(partial.stdout).toContain(`kept the sysctls: still set up for VIPs ${VIP}`);
    expect(await sysctl('all', 'arp_ignore')).toBe('1');

    const r = await script(['remove', '--vip', VIP]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('left net.ipv4.conf.eth1.arp_ignore=2 (changed since setup)');
    expect(await loAddrs()).toEqual(['127.0.0.1/8', '::1/128']);
    for (const iface of ['all', 'lo', 'eth0']) {
      expect(await sysctl(iface, 'arp_ignore')).toBe('0');
      expect(await sysctl(iface, 'arp_announce')).toBe('0');
    }
    expect(await sysctl('eth1', 'arp_ignore')).toBe('2');
    expect(await sysctl('eth1', 'arp_announce')).toBe('0');
    const nft = await run('ip', ['netns', 'exec', NS, 'nft', 'list', 'table', 'inet', 'dsrlb_realserver']);
    expect(nft.code).not.toBe(0);
    const stateLeft = (await readdir('/run/dsrlb-realserver')).filter((f) => f === `netns-${NS}.state`);
    expect(stateLeft).toEqual([]);
    // Removing again is harmless.
    const again = await script(['remove', '--vip', VIP]);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain(`VIP ${VIP} was not on lo`);
    await mustRun('ip', ['netns', 'exec', NS, 'sh', '-c', 'echo 0 > /proc/sys/net/ipv4/conf/eth1/arp_ignore']);
  });

  it('--persist writes the sysctl.d file and the systemd unit under DSRLB_ROOT, and remove --persist deletes them', async () => {
    const root = await mkdtemp(join(tmpdir(), 'dsrt-rs-root-'));
    try {
      const env = { DSRLB_ROOT: root };
      const r = await script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'], env);
      expect(r.code).toBe(0);
      const conf = await readFile(join(root, 'etc/sysctl.d/90-dsrlb-realserver.conf'), 'utf8');
      const confLines = conf.split('\n').filter((l) => l !== '' && !l.startsWith('#'));
      expect(confLines).toEqual([
        'net.ipv4.conf.all.arp_ignore = 1',
        'net.ipv4.conf.all.arp_announce = 2',
        'net.ipv4.conf.lo.arp_ignore = 1',
        'net.ipv4.conf.lo.arp_announce = 2',
        'net.ipv4.conf.eth0.arp_ignore = 1',
        'net.ipv4.conf.eth0.arp_announce = 2',
      ]);
      const unit = await readFile(join(root, 'etc/systemd/system/dsrlb-realserver.service'), 'utf8');
      expect(unit).toContain('Type=oneshot');
      expect(unit).toContain('RemainAfterExit=yes');
      expect(unit).toContain(`ExecStart=${SCRIPT} setup --vip ${VIP} --mode l2 --interface eth0`);
      expect(unit).toContain(`ExecStop=${SCRIPT} remove --vip ${VIP}`);
      expect(unit).toContain('WantedBy=multi-user.target');
      // The state went under the root too, not into the host's /run.
      expect(await readdir(join(root, 'run/dsrlb-realserver'))).toEqual([`netns-${NS}.state`]);

      const check = await script(['check', '--vip', VIP, '--interface', 'eth0', '--persist'], env);
      expect(check.code).toBe(0);
      const again = await script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'], env);
      expect(again.stdout).toContain('nothing to change');

      const removed = await script(['remove', '--vip', VIP, '--persist'], env);
      expect(removed.code).toBe(0);
      expect(await readdir(join(root, 'etc/sysctl.d'))).toEqual([]);
      expect(await readdir(join(root, 'etc/systemd/system'))).toEqual([]);
      const missing = await script(['check', '--vip', VIP, '--persist'], env);
      expect(missing.code).toBe(1);
      expect(missing.stdout).toContain(`${root}/etc/sysctl.d/90-dsrlb-realserver.conf missing (setup is not persisted)`);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
