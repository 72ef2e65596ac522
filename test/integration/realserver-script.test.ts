// deploy/linux/dsrlb-realserver in fresh network namespaces: check on a bare host, setup, idempotence,
// piece-by-piece reports of a broken host (ARP sysctls as the kernel reads them: max(all, dev)),
// addresses it must refuse or leave alone, ipip with stand-in tunnel devices (this kernel has no
// ipip/ip6_tunnel: TUN devices named tunl0/ip6tnl0/dsrlb-decap0 take their place), rp_filter on
// the tunnel devices with all.rp_filter strict and the dummy address 192.0.0.8 on them (checked
// against an echo written into a TUN), upgrades from what earlier versions left, MSS and MTU,
// remove restoring only what setup changed, state per network namespace, and --persist under
// DSRLB_ROOT. Needs root, `ip netns`, nft, unshare, python3 and systemd-analyze; fails (never
// skips) without them.

import { execFile, spawn } from 'node:child_process';
import { chmod, copyFile, mkdir, mkdtemp, readFile, readdir, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const SCRIPT = fileURLToPath(new URL('../../deploy/linux/dsrlb-realserver', import.meta.url));
const DECAP_UNIT = fileURLToPath(new URL('../../deploy/linux/dsrlb-decap@.service', import.meta.url));
const DSRLB = fileURLToPath(new URL('../../bin/dsrlb.js', import.meta.url));
const PREFIX = `dsrt-rs-${process.pid}-`;
const NS = `${PREFIX}a`;
const VIP = '10.0.0.100';
const VIP6 = 'fd00:77::100';
const SBIN = '/usr/local/sbin/dsrlb-realserver';
const ARP_RULE = "the kernel takes the larger of all and the interface's value";
/** The IPv4 dummy address (RFC 7600) setup and dsrlb decap put on the tunnel devices for loose rp_filter. */
const DUMMY = '192.0.0.8';
const ADDED_DUMMY = (dev: string): string => `added ${DUMMY}/32 on ${dev} (scope host, the IPv4 dummy address: loose rp_filter needs an IPv4 address on the device)`;

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

async function mustRun(file: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<string> {
  const r = await run(file, args, env);
  if (r.code !== 0) throw new Error(`${file} ${args.join(' ')} failed (${r.code}): ${r.stderr}`);
  return r.stdout;
}

const lines = (text: string): string[] => text.split('\n').filter((l) => l !== '');

/** The ExecStart the persisted unit has for several setup groups: /bin/sh runs each, then exits with the worst status. */
const groupsExecStart = (commands: string[]): string =>
  `ExecStart=/bin/sh -c 'rc=0; run() { "$$@" || { r=$$?; [ $$r -lt $$rc ] || rc=$$r; }; };${commands.map((c) => ` run ${c} ;`).join('')} exit $$rc'`;

/** The argv systemd makes of an ExecStart line: words, '..' and ".." quoted ones, $$ for $ (no other escapes are used). */
function execArgv(line: string): string[] {
  const words = [...line.replace(/^ExecStart=/, '').matchAll(/'([^']*)'|"([^"]*)"|(\S+)/g)];
  return words.map((m) => (m[1] ?? m[2] ?? m[3] ?? '').replace(/\$\$/g, '$'));
}

/** A network namespace with a veth pair eth0/eth1 (a NIC besides lo) and its own DSRLB_ROOT. */
interface Host {
  ns: string;
  root: string;
  /** Runs the script in the namespace through dash (the strictest POSIX shell here), under `root`. */
  script(args: string[], env?: NodeJS.ProcessEnv): Promise<Result>;
  sh(command: string): Promise<string>;
  sysctl(iface: string, name: string): Promise<string>;
  state(): Promise<string>;
}

const hosts: string[] = [];

function hostFor(ns: string, root: string): Host {
  return {
    ns,
    root,
    script: (args, env = {}) => run('ip', ['netns', 'exec', ns, 'dash', SCRIPT, ...args], { DSRLB_ROOT: root, ...env }),
    sh: (command) => mustRun('ip', ['netns', 'exec', ns, 'sh', '-c', command]),
    sysctl: async (iface, name) => (await mustRun('ip', ['netns', 'exec', ns, 'cat', `/proc/sys/net/ipv4/conf/${iface}/${name}`])).trim(),
    state: () => readFile(join(root, 'run/dsrlb-realserver', `netns-${ns}.state`), 'utf8'),
  };
}

/** Runs `body` on a fresh host; the namespace and its root go afterwards, whatever happens. */
async function withHost(name: string, body: (h: Host) => Promise<void>): Promise<void> {
  const ns = `${PREFIX}${name}`;
  const root = await mkdtemp(join(tmpdir(), `${PREFIX}root-`));
  hosts.push(ns);
  try {
    await mustRun('ip', ['netns', 'add', ns]);
    await mustRun('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
    await body(hostFor(ns, root));
  } finally {
    await run('ip', ['netns', 'del', ns]);
    await rm(root, { recursive: true, force: true });
  }
}

/** eth0 up with addresses and default routes (v4 and v6) through it: the interface tunnels arrive on. */
async function routed(h: Host): Promise<void> {
  await h.sh(
    'ip link set eth0 up && ip link set eth1 up && ip addr add 192.0.2.2/24 dev eth0 && ip route add default via 192.0.2.1 && ' +
      'ip -6 addr add fd00:1::2/64 dev eth0 nodad && ip -6 route add default via fd00:1::1 dev eth0',
  );
}

/** A persistent TUN device named `name`, standing in for a kernel tunnel device or dsrlb decap's TUN. */
async function standIn(h: Host, name: string, up = true): Promise<void> {
  await h.sh(`ip tuntap add dev ${name} mode tun${up ? ` && ip link set ${name} up` : ''}`);
}

/** Device `dev`'s addresses of `family` as "ADDR/PLEN SCOPE", sorted (`ip -j addr`; the kernel orders them by scope). */
async function tunnelAddrs(h: Host, dev: string, family: 'inet' | 'inet6' = 'inet'): Promise<string[]> {
  const [link] = JSON.parse(await h.sh(`ip -j addr show dev ${dev}`)) as { addr_info: { family: string; local: string; prefixlen: number; scope: string }[] }[];
  return (link?.addr_info ?? []).filter((a) => a.family === family).map((a) => `${a.local}/${a.prefixlen} ${a.scope}`).sort();
}

/**
 * Writes an ICMP echo request from `src` to `dst` into the TUN device `dev`, as a decapsulating
 * tunnel hands the kernel its inner packet, and says whether it reached ICMP (Icmp InEchos grew):
 * what reverse-path filtering on `dev` let through.
 */
async function echoThroughTun(h: Host, dev: string, src: string, dst: string): Promise<boolean> {
  const inEchos = async (): Promise<number> => {
    const [names, values] = lines(await h.sh('cat /proc/net/snmp')).filter((l) => l.startsWith('Icmp: '));
    return Number((values ?? '').split(' ')[(names ?? '').split(' ').indexOf('InEchos')]);
  };
  const write = [
    'import fcntl, os, struct, sys',
    'def csum(b):',
    '    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))',
    '    while s >> 16: s = (s & 0xffff) + (s >> 16)',
    '    return ~s & 0xffff',
    'dev, src, dst = sys.argv[1:4]',
    'fd = os.open("/dev/net/tun", os.O_RDWR)',
    'fcntl.ioctl(fd, 0x400454ca, struct.pack("16sH", dev.encode(), 0x1001))  # TUNSETIFF, IFF_TUN | IFF_NO_PI',
    'icmp = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 1) + b"dsrlb!"',
    'icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]',
    'ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), 1, 0, 64, 1, 0, bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))',
    'os.write(fd, ip[:10] + struct.pack("!H", csum(ip)) + ip[12:] + icmp)',
  ].join('\n');
  const before = await inEchos();
  await mustRun('ip', ['netns', 'exec', h.ns, 'python3', '-c', write, dev, src, dst]);
  for (let i = 0; i < 10; i++) {
    if ((await inEchos()) > before) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

beforeAll(() => {
  if (process.getuid?.() !== 0) throw new Error('this test needs root (network namespaces)');
});

afterAll(async () => {
  const left = (await mustRun('ip', ['netns', 'list'])).split('\n').filter((l) => l.startsWith(PREFIX));
  expect(left).toEqual([]);
});

const stateFile = `/run/dsrlb-realserver/netns-${NS}.state`;

describe('dsrlb-realserver in a network namespace', () => {
  /** The script in NS, with the default state directory (/run/dsrlb-realserver). */
  const script = (args: string[], env: NodeJS.ProcessEnv = {}): Promise<Result> =>
    run('ip', ['netns', 'exec', NS, 'dash', SCRIPT, ...args], env);
  const host = hostFor(NS, '/');
  const loAddrs = async (): Promise<string[]> =>
    lines(await mustRun('ip', ['-n', NS, '-o', 'addr', 'show', 'dev', 'lo']))
      .map((l) => l.trim().split(/\s+/)[3] ?? '')
      .sort();

  beforeAll(async () => {
    hosts.push(NS);
    await mustRun('ip', ['netns', 'add', NS]);
    await mustRun('ip', ['-n', NS, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1']);
    await rm(stateFile, { force: true });
  });

  afterAll(async () => {
    await run('ip', ['netns', 'del', NS]);
    await rm(stateFile, { force: true });
  });

  it('check on a bare namespace exits 1 with one stdout line per problem, each with its fix, and the count on stderr', async () => {
    const r = await script(['check', '--vip', VIP]);
    expect(r.code).toBe(1);
    expect(lines(r.stdout)).toEqual([
      'lo is down: run: ip link set lo up',
      `VIP ${VIP} missing on lo: run: ip addr add ${VIP}/32 dev lo`,
      `net.ipv4.conf.all.arp_ignore is 0, want 1 (no higher on lo eth0 eth1, and ${ARP_RULE}): run: sysctl -w net.ipv4.conf.all.arp_ignore=1`,
      `net.ipv4.conf.all.arp_announce is 0, want 2 (no higher on lo eth0 eth1, and ${ARP_RULE}): run: sysctl -w net.ipv4.conf.all.arp_announce=2`,
    ]);
    expect(r.stderr).toBe('dsrlb-realserver: 4 problem(s) found\n');
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
      expect(await host.sysctl(iface, 'arp_ignore')).toBe('1');
      expect(await host.sysctl(iface, 'arp_announce')).toBe('2');
    }
  });

  it('check then exits 0 with an ok summary', async () => {
    const r = await script(['check', '--vip', `${VIP},${VIP6}`]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`ok: VIPs ${VIP},${VIP6} on lo, ARP hidden on lo eth0 eth1 (mode l2)\n`);
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

  it('interfaces made after setup (a veth pair, a dotted name) are covered by all: check stays ok', async () => {
    await mustRun('ip', ['-n', NS, 'link', 'add', 'vx0', 'type', 'veth', 'peer', 'name', 'vx0.7']);
    try {
      expect(await host.sysctl('vx0', 'arp_ignore')).toBe('0');
      const r = await script(['check', '--vip', VIP]);
      expect(r.stdout).toBe(`ok: VIPs ${VIP} on lo, ARP hidden on lo eth0 eth1 vx0 vx0.7 (mode l2)\n`);
      expect(r.code).toBe(0);
    } finally {
      await mustRun('ip', ['-n', NS, 'link', 'del', 'vx0']);
    }
  });

  it('reports a deliberately broken host piece by piece, each with its fix', async () => {
    await mustRun('ip', ['-n', NS, 'addr', 'del', `${VIP}/32`, 'dev', 'lo']);
    // all and eth0 both 0: eth0 answers ARP; eth1 at 3 answers whatever all says.
    await host.sh('cd /proc/sys/net/ipv4/conf && echo 0 > all/arp_ignore && echo 0 > eth0/arp_ignore && echo 3 > eth1/arp_ignore');
    await mustRun('ip', ['-n', NS, 'addr', 'add', `${VIP6}/64`, 'dev', 'eth1', 'nodad']);
    const r = await script(['check', '--vip', `${VIP},${VIP6}`]);
    expect(r.code).toBe(1);
    expect(lines(r.stdout)).toEqual([
      `VIP ${VIP} missing on lo: run: ip addr add ${VIP}/32 dev lo`,
      `VIP ${VIP6} is also on eth1 (this host would answer ARP/ND for it): run: ip addr del ${VIP6}/64 dev eth1`,
      `net.ipv4.conf.eth1.arp_ignore is 3, want 1 (${ARP_RULE}): run: sysctl -w net.ipv4.conf.eth1.arp_ignore=1`,
      `net.ipv4.conf.all.arp_ignore is 0, want 1 (no higher on eth0, and ${ARP_RULE}): run: sysctl -w net.ipv4.conf.all.arp_ignore=1`,
    ]);
    expect(r.stderr).toBe('dsrlb-realserver: 4 problem(s) found\n');
    await mustRun('ip', ['-n', NS, 'addr', 'del', `${VIP6}/64`, 'dev', 'eth1']);
    const fixed = await script(['setup', '--vip', `${VIP},${VIP6}`]);
    expect(fixed.code).toBe(0);
    expect(fixed.stdout).toContain(`added ${VIP}/32 on lo`);
    expect(fixed.stdout).toContain('set net.ipv4.conf.all.arp_ignore=1 (was 0)');
    expect(fixed.stdout).toContain('set net.ipv4.conf.eth0.arp_ignore=1 (was 0)');
    expect(fixed.stdout).toContain('set net.ipv4.conf.eth1.arp_ignore=1 (was 3)');
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
      [['remove', '--vip', '::1'], '--vip ::1: a loopback address cannot be a VIP'],
    ];
    const notVips: Array<[string, string]> = [
      ['127.0.0.1', 'a loopback address'],
      ['127.0.0.5', 'a loopback address'],
      ['0.0.0.0', 'an unspecified address'],
      ['::', 'an unspecified address'],
      ['224.0.0.1', 'a multicast address'],
      ['239.1.2.3', 'a multicast address'],
      ['ff02::1', 'a multicast address'],
      ['169.254.1.1', 'a link-local address'],
      ['FE80::1', 'a link-local address'],
      ['febf::1', 'a link-local address'],
      ['255.255.255.255', 'the broadcast address'],
      [DUMMY, 'the IPv4 dummy address (RFC 7600) setup puts on the tunnel devices'],
    ];
    for (const [address, what] of notVips) cases.push([['setup', '--vip', address], `--vip ${address}: ${what} cannot be a VIP`]);
    const addrsBefore = await loAddrs();
    for (const [args, message] of cases) {
      const r = await script(args);
      expect(r.code, args.join(' ')).toBe(1);
      expect(lines(r.stderr), args.join(' ')).toHaveLength(1);
      expect(r.stderr, args.join(' ')).toContain(`dsrlb-realserver: ${message}`);
      expect(r.stdout).toBe('');
    }
    // 127.0.0.1/8 and ::1 are where they were.
    expect(await loAddrs()).toEqual(addrsBefore);
    // Neighbours of the refused ranges are VIPs like any other.
    for (const ok of ['1.0.0.1', '192.0.0.9', '126.255.255.255', '128.0.0.1', '169.253.0.1', '223.255.255.255', '240.0.0.1', 'fe7f::1', 'fec0::1', 'ff::1']) {
      const r = await script(['check', '--vip', ok]);
      expect(r.stderr, ok).not.toContain('cannot be a VIP');
    }
    const help = await script(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: dsrlb-realserver COMMAND --vip VIP[,VIP..]');
  });

  it('refuses an IPv4-mapped IPv6 VIP, dotted or hex, with exit 1 and a line that names its IPv4 form', async () => {
    const cases: Array<[string, string]> = [
      ['::ffff:1.2.3.4', '1.2.3.4'],
      ['::FFFF:10.0.0.100', '10.0.0.100'],
      ['0:0:0:0:0:ffff:192.0.2.1', '192.0.2.1'],
      ['::ffff:c000:201', '192.0.2.1'],
    ];
    for (const [address, v4] of cases) {
      for (const command of ['setup', 'check', 'remove']) {
        const r = await script([command, '--vip', `${VIP},${address}`]);
        expect([r.code, r.stdout, r.stderr], `${command} ${address}`).toEqual([
          1,
          '',
          `dsrlb-realserver: --vip ${address}: an IPv4-mapped IPv6 address cannot be a VIP: use the IPv4 form, --vip ${v4}\n`,
        ]);
      }
    }
    // Other IPv6 text with a dot is still no address the script takes.
    const other = await script(['check', '--vip', '::ffff:1.2.3']);
    expect([other.code, other.stderr]).toEqual([1, 'dsrlb-realserver: --vip ::ffff:1.2.3: not an IPv4 or IPv6 address\n']);
  });

  it('never takes off lo an address setup did not add: a VIP there with another prefix is refused, one there already is left', async () => {
    const stateBefore = await readFile(stateFile, 'utf8');
    await mustRun('ip', ['-n', NS, 'addr', 'add', '10.0.0.200/24', 'dev', 'lo']);
    try {
      const r = await script(['setup', '--vip', '10.0.0.200']);
      expect(r.code).toBe(1);
      expect(r.stderr).toBe(
        'dsrlb-realserver: VIP 10.0.0.200 is on lo as 10.0.0.200/24, not /32; nothing was changed: if it is yours to remove: ip addr del 10.0.0.200/24 dev lo\n',
      );
      expect(await loAddrs()).toContain('10.0.0.200/24');
      expect(await loAddrs()).not.toContain('10.0.0.200/32');
      expect(await readFile(stateFile, 'utf8')).toBe(stateBefore);
    } finally {
      await mustRun('ip', ['-n', NS, 'addr', 'del', '10.0.0.200/24', 'dev', 'lo']);
    }

    await mustRun('ip', ['-n', NS, 'addr', 'add', '10.0.0.201/32', 'dev', 'lo']);
    try {
      const setup = await script(['setup', '--vip', '10.0.0.201']);
      expect(setup.code).toBe(0);
      expect(setup.stdout).not.toContain('added');
      expect(await readFile(stateFile, 'utf8')).toContain('vip 10.0.0.201 l2 - found\n');
      const removed = await script(['remove', '--vip', '10.0.0.201']);
      expect(removed.code).toBe(0);
      expect(removed.stdout).toContain('left 10.0.0.201/32 on lo: it was there before setup');
      expect(await loAddrs()).toContain('10.0.0.201/32');
      expect(await readFile(stateFile, 'utf8')).toBe(stateBefore);
    } finally {
      await mustRun('ip', ['-n', NS, 'addr', 'del', '10.0.0.201/32', 'dev', 'lo']);
    }
  });

  it('--mss clamps the MSS announced from the VIP with an nftables rule that check verifies', async () => {
    const before = await script(['check', '--vip', VIP, '--mss', '1440']);
    expect(before.code).toBe(1);
    expect(before.stdout).toBe(`TCP MSS from ${VIP} not clamped to 1440: run: dsrlb-realserver setup --vip ${VIP} --mode l2 --mss 1440\n`);
    const setup = await script(['setup', '--vip', VIP, '--mss', '1440']);
    expect(setup.code).toBe(0);
    const rules = await mustRun('ip', ['netns', 'exec', NS, 'nft', 'list', 'table', 'inet', 'dsrlb_realserver']);
    expect(rules).toContain(`ip saddr ${VIP}`);
    expect(rules).toContain('maxseg size set 1440');
    expect((await script(['check', '--vip', VIP, '--mss', '1440'])).code).toBe(0);
    // Unprivileged (a monitoring check): nft cannot read the ruleset, which is no missing clamp.
    // A copy the user can read: a checkout under /root (0700) is not.
    const readable = await mkdtemp(join(tmpdir(), `${PREFIX}nobody-`));
    try {
      await chmod(readable, 0o755);
      await copyFile(SCRIPT, join(readable, 'dsrlb-realserver'));
      await chmod(join(readable, 'dsrlb-realserver'), 0o755);
      const asNobody = await run('ip', ['netns', 'exec', NS, 'setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', 'dash', join(readable, 'dsrlb-realserver'), 'check', '--vip', VIP, '--mss', '1440']);
      expect(asNobody.stdout).not.toContain('not clamped');
      expect(asNobody.stderr).toContain(`cannot verify the TCP MSS clamp from ${VIP} to 1440: nft cannot read the ruleset (not root?)`);
    } finally {
      await rm(readable, { recursive: true, force: true });
    }
    expect((await script(['setup', '--vip', VIP, '--mss', '1440'])).stdout).toContain('nothing to change');
    // The clamp setup recorded is checked without --mss.
    await mustRun('ip', ['netns', 'exec', NS, 'nft', 'delete', 'table', 'inet', 'dsrlb_realserver']);
    const lost = await script(['check', '--vip', VIP]);
    expect(lost.code).toBe(1);
    expect(lost.stdout).toBe(`TCP MSS from ${VIP} not clamped to 1440: run: dsrlb-realserver setup --vip ${VIP} --mode l2 --mss 1440\n`);
    // A setup without --mss keeps the recorded clamp and puts it back.
    expect((await script(['setup', '--vip', VIP])).stdout).toContain(`clamped the TCP MSS from ${VIP} to 1440`);
    expect((await script(['check', '--vip', VIP])).code).toBe(0);
  });

  it('remove takes the VIPs off lo, restores the sysctls it set and drops its nftables table', async () => {
    // A sysctl changed by someone after setup is theirs: remove must leave it.
    await host.sh('echo 2 > /proc/sys/net/ipv4/conf/eth1/arp_ignore');
    const partial = await script(['remove', '--vip', VIP6]);
    expect(partial.code).toBe(0);
    expect(partial.stdout).toContain(`kept the sysctls: still set up for VIPs ${VIP}`);
    expect(await host.sysctl('all', 'arp_ignore')).toBe('1');

    const r = await script(['remove', '--vip', VIP]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('left net.ipv4.conf.eth1.arp_ignore=2 (changed since setup)');
    expect(await loAddrs()).toEqual(['127.0.0.1/8', '::1/128']);
    for (const iface of ['all', 'lo', 'eth0']) {
      expect(await host.sysctl(iface, 'arp_ignore')).toBe('0');
      expect(await host.sysctl(iface, 'arp_announce')).toBe('0');
    }
    expect(await host.sysctl('eth1', 'arp_ignore')).toBe('2');
    expect(await host.sysctl('eth1', 'arp_announce')).toBe('0');
    const nft = await run('ip', ['netns', 'exec', NS, 'nft', 'list', 'table', 'inet', 'dsrlb_realserver']);
    expect(nft.code).not.toBe(0);
    const stateLeft = (await readdir('/run/dsrlb-realserver')).filter((f) => f === `netns-${NS}.state`);
    expect(stateLeft).toEqual([]);
    // Removing again is harmless.
    const again = await script(['remove', '--vip', VIP]);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain(`VIP ${VIP} was not on lo`);
    await host.sh('echo 0 > /proc/sys/net/ipv4/conf/eth1/arp_ignore');
  });

  it('remove of the last IPv4 VIP undoes the ARP sysctls while an IPv6 VIP stays (IPv6 needs no ARP hiding); check of that VIP stays ok', async () => {
    expect((await script(['setup', '--vip', `${VIP},${VIP6}`])).code).toBe(0);
    expect(await host.sysctl('all', 'arp_ignore')).toBe('1');
    const r = await script(['remove', '--vip', VIP]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`only IPv6 VIPs left (${VIP6}): undoing the ARP sysctls, which IPv6 does not use`);
    expect(r.stdout).not.toContain('kept the sysctls');
    for (const iface of ['all', 'lo', 'eth0', 'eth1']) {
      expect(await host.sysctl(iface, 'arp_ignore'), iface).toBe('0');
      expect(await host.sysctl(iface, 'arp_announce'), iface).toBe('0');
    }
    const check = await script(['check', '--vip', VIP6]);
    expect([check.code, check.stdout]).toEqual([0, expect.stringMatching(/^ok: /)]);
    expect((await script(['remove', '--vip', VIP6])).code).toBe(0);
    expect(await loAddrs()).toEqual(['127.0.0.1/8', '::1/128']);
  });

  it('runs the same under busybox sh', async () => {
    const bb = (args: string[]): Promise<Result> => run('ip', ['netns', 'exec', NS, 'busybox', 'sh', SCRIPT, ...args]);
    expect((await bb(['setup', '--vip', `${VIP},${VIP6}`])).code).toBe(0);
    expect((await bb(['check', '--vip', `${VIP},${VIP6}`])).stdout).toBe(`ok: VIPs ${VIP},${VIP6} on lo, ARP hidden on lo eth0 eth1 (mode l2)\n`);
    const removed = await bb(['remove', '--vip', `${VIP},${VIP6}`]);
    expect(removed.code).toBe(0);
    expect(await loAddrs()).toEqual(['127.0.0.1/8', '::1/128']);
    expect(await host.sysctl('all', 'arp_ignore')).toBe('0');
  });
});

describe('mode ipip', () => {
  it('on a kernel without ipip: check gives one hint naming dsrlb decap and its unit, setup exits 2', async () => {
    await withHost('ip0', async (h) => {
      expect((await run('ip', ['-n', h.ns, 'link', 'show', 'dev', 'tunl0'])).code, 'this test expects a kernel without ipip (lab-facts.md)').not.toBe(0);
      const vips = `${VIP},${VIP6}`;
      const hint =
        `kernel has no ipip and ip6tnl support (tunl0, ip6tnl0 cannot be created): run: dsrlb decap --interface IF --vip ${vips} ` +
        `(or its unit dsrlb-decap@IF.service, VIPS= in /etc/dsrlb/decap-IF.env), then dsrlb-realserver setup --vip ${vips} --mode ipip again`;
      const check = await h.script(['check', '--vip', vips, '--mode', 'ipip']);
      expect(check.code).toBe(1);
      expect(lines(check.stdout).filter((l) => l.includes('kernel has no'))).toEqual([hint]);
      const setup = await h.script(['setup', '--vip', vips, '--mode', 'ipip']);
      expect(setup.code).toBe(2);
      expect(lines(setup.stderr)).toEqual([hint, `dsrlb-realserver: setup incomplete (mode ipip, VIPs ${vips})`]);
    });
  });

  it('says when the running dsrlb decap does not decapsulate for an ipip VIP (its packets would be dropped)', async () => {
    await withHost('ip2', async (h) => {
      await routed(h);
      await h.sh('ip link set eth0 mtu 1540'); // room for the outer header: no MSS clamp needed
      const decap = spawn('ip', ['netns', 'exec', h.ns, process.execPath, DSRLB, 'decap', '--interface', 'eth0', '--vip', VIP], { stdio: 'ignore' });
      try {
        for (let i = 0; i < 100 && (await run('ip', ['-n', h.ns, 'link', 'show', 'dev', 'dsrlb-decap0', 'up'])).stdout === ''; i++) await new Promise((r) => setTimeout(r, 100));
        const other = '10.0.0.101';
        const taken = await h.script(['setup', '--vip', VIP, '--mode', 'ipip']);
        expect([taken.code, taken.stderr]).toEqual([0, '']);
        const ok = await h.script(['check', '--vip', VIP]);
        expect([ok.code, ok.stdout]).toEqual([0, expect.stringMatching(/^ok: /)]);
        const missing = `the running dsrlb decap does not decapsulate for ${other} (not among its --vip): their packets are dropped: add them to VIPS= in /etc/dsrlb/decap-eth0.env and run: systemctl restart dsrlb-decap@eth0.service (or restart dsrlb decap with them)`;
        // Not "setup ok": its own check rejects it (exit 2, as for a missing tunnel).
        const setup = await h.script(['setup', '--vip', other, '--mode', 'ipip']);
        expect(setup.code).toBe(2);
        expect(setup.stderr).toBe(`dsrlb-realserver: ${missing}\ndsrlb-realserver: setup incomplete (mode ipip, VIPs ${other})\n`);
        expect(setup.stdout).not.toContain('setup ok');
        const check = await h.script(['check', '--vip', `${VIP},${other}`]);
        expect([check.code, check.stdout]).toEqual([1, `${missing}\n`]);
      } finally {
        decap.kill('SIGTERM');
        await new Promise((r) => decap.once('exit', r));
      }
    });
  });

  it("dsrlb decap's TUN stands in for tunl0: check says when it is down and how to bring it up, and all covers its ARP sysctls; its rp_filter and dummy address are decap's, which check verifies", async () => {
    await withHost('ip1', async (h) => {
      await standIn(h, 'dsrlb-decap0');
      const setup = await h.script(['setup', '--vip', VIP, '--mode', 'ipip']);
      expect(setup.code, setup.stderr).toBe(0);
      expect(setup.stdout).toContain('kernel has no ipip support: dsrlb-decap0 of dsrlb decap receives the tunnel instead');
      expect((await h.script(['check', '--vip', VIP])).stdout).toBe(`ok: VIPs ${VIP} on lo, ARP hidden on lo dsrlb-decap0 eth0 eth1 (mode ipip)\n`);

      // As `dsrlb decap` leaves it: started after setup, arp_ignore 0 on the device (all covers it).
      await h.sh('ip link del dsrlb-decap0');
      await standIn(h, 'dsrlb-decap0', false);
      expect(await h.sysctl('dsrlb-decap0', 'arp_ignore')).toBe('0');
      const down = await h.script(['check', '--vip', VIP]);
      expect(down.code).toBe(1);
      expect(down.stdout).toBe('dsrlb-decap0, the TUN device of dsrlb decap standing in for tunl0, is down: run: ip link set dsrlb-decap0 up\n');
      await h.sh('ip link set dsrlb-decap0 up');
      const up = await h.script(['check', '--vip', VIP]);
      expect(up.stdout).toBe(`ok: VIPs ${VIP} on lo, ARP hidden on lo dsrlb-decap0 eth0 eth1 (mode ipip)\n`);
      expect(up.code).toBe(0);

      // rp_filter on the TUN matters: max(all, dev) 1 (strict) drops what decap writes; any other
      // value but 0 drops it while the device has no IPv4 address. dsrlb decap sets both itself.
      const strict =
        'net.ipv4.conf.dsrlb-decap0.rp_filter is 1, want 2 (loose): with all at 0 the kernel takes the larger, 1 (strict), which drops the packets decapsulated on dsrlb-decap0: ' +
        'run: sysctl -w net.ipv4.conf.dsrlb-decap0.rp_filter=2 (or restart dsrlb decap, which sets it)';
      const noAddress = (eff: number): string =>
        `dsrlb-decap0 has no IPv4 address, so rp_filter (the larger of all and dsrlb-decap0's: ${eff}) drops every packet decapsulated on it: ` +
        `run: ip addr add ${DUMMY}/32 dev dsrlb-decap0 scope host (or restart dsrlb decap, which adds it)`;
      await h.sh('echo 1 > /proc/sys/net/ipv4/conf/dsrlb-decap0/rp_filter');
      const rp = await h.script(['check', '--vip', VIP]);
      expect([rp.code, lines(rp.stdout)]).toEqual([1, [strict, noAddress(1)]]);
      // setup leaves decap's device alone, and says what its check rejects there (exit 2, as for a VIP decap lacks).
      const setupRp = await h.script(['setup', '--vip', VIP]);
      expect([setupRp.code, lines(setupRp.stderr)]).toEqual([
        2,
        [`dsrlb-realserver: ${strict}`, `dsrlb-realserver: ${noAddress(1)}`, `dsrlb-realserver: setup incomplete (mode ipip, VIPs ${VIP})`],
      ]);
      expect(await h.sysctl('dsrlb-decap0', 'rp_filter')).toBe('1');
      await h.sh('echo 2 > /proc/sys/net/ipv4/conf/dsrlb-decap0/rp_filter');
      expect((await h.script(['check', '--vip', VIP])).stdout).toBe(`${noAddress(2)}\n`);
      // As dsrlb decap leaves it: the dummy address on the device as /32 scope host.
      await h.sh(`ip addr add ${DUMMY}/32 dev dsrlb-decap0 scope host`);
      const decapLike = await h.script(['check', '--vip', VIP]);
      expect([decapLike.code, decapLike.stdout]).toEqual([0, `ok: VIPs ${VIP} on lo, ARP hidden on lo dsrlb-decap0 eth0 eth1 (mode ipip)\n`]);
      const same = await h.script(['setup', '--vip', VIP]);
      expect([same.code, lines(same.stdout).at(-1)]).toEqual([0, `setup ok, nothing to change (mode ipip, VIPs ${VIP})`]);
      // The VIP itself on the TUN (as a decap before 2026-12 put it) is a local address apart from lo: reported as on any interface.
      await h.sh(`ip addr add ${VIP}/32 dev dsrlb-decap0 scope host`);
      const vipOnTun = await h.script(['check', '--vip', VIP]);
      expect([vipOnTun.code, vipOnTun.stdout]).toEqual([1, `VIP ${VIP} is also on dsrlb-decap0 (this host would answer ARP/ND for it): run: ip addr del ${VIP}/32 dev dsrlb-decap0\n`]);
      await h.sh(`ip addr del ${VIP}/32 dev dsrlb-decap0`);
      // remove takes off lo what setup added, never decap's address.
      expect((await h.script(['remove', '--vip', VIP])).code).toBe(0);
      expect(await tunnelAddrs(h, 'dsrlb-decap0')).toEqual([`${DUMMY}/32 host`]);
    });
  });

  it('with tunl0 and ip6tnl0, setup puts ip6tnl0 in mode any (IPv4-in-IPv6) with the dummy address on it and rp_filter 2; check and remove follow (ip6tnl ioctls stubbed)', async () => {
    // This kernel has no ip6_tunnel: TUN devices stand in for the devices, and an `ip` wrapper
    // answers `ip -6 tunnel show|change ip6tnl0` from a file. What runs here is the script's
    // logic; the kernel's side (mode any really taking IPv4-in-IPv6) is untested.
    await withHost('ip2', async (h) => {
      const dir = await mkdtemp(join(tmpdir(), `${PREFIX}bin-`));
      try {
        const realIp = (await mustRun('sh', ['-c', 'command -v ip'])).trim();
        const modeFile = join(dir, 'mode');
        const log = join(dir, 'log');
        await writeFile(modeFile, 'ipv6\n');
        await writeFile(
          join(dir, 'ip'),
          [
            '#!/bin/sh',
            `if [ "$1" = -6 ] && [ "$2" = tunnel ]; then`,
            `  echo "$*" >> ${log}`,
            '  case $3 in',
            `  show) echo "ip6tnl0: $(cat ${modeFile})/ipv6 remote :: local :: encaplimit 0 hoplimit 0 tclass 0x00 flowlabel 0x00000 (flowinfo 0x00000000)" ;;`,
            `  change) case $6 in any) echo any ;; ip6ip6) echo ipv6 ;; ipip6) echo ip ;; esac > ${modeFile} ;;`,
            '  esac',
            '  exit 0',
            'fi',
            `exec ${realIp} "$@"`,
            '',
          ].join('\n'),
        );
        await chmod(join(dir, 'ip'), 0o755);
        const env = { PATH: `${dir}:${process.env['PATH'] ?? ''}` };
        await standIn(h, 'tunl0', false);
        await standIn(h, 'ip6tnl0', false);
        await h.sh('cd /proc/sys/net/ipv4/conf && echo 1 > all/rp_filter && echo 1 > tunl0/rp_filter && echo 1 > ip6tnl0/rp_filter');

        const setup = await h.script(['setup', '--vip', VIP, '--mode', 'ipip'], env);
        expect(setup.code, setup.stderr).toBe(0);
        expect(lines(setup.stdout)).toEqual(
          expect.arrayContaining(['brought tunl0 up', 'brought ip6tnl0 up', 'set ip6tnl0 to mode any (was ip6ip6): it takes IPv4 and IPv6 inside IPv6']),
        );
        expect(await readFile(modeFile, 'utf8')).toBe('any\n');
        expect(await h.sysctl('all', 'rp_filter')).toBe('1');
        for (const iface of ['tunl0', 'ip6tnl0']) expect(await h.sysctl(iface, 'rp_filter'), iface).toBe('2');
        expect(await h.state()).toContain('tunmode ip6tnl0 ip6ip6\n');
        expect(await h.state()).toContain(`tunaddr tunl0 ${DUMMY}\ntunaddr ip6tnl0 ${DUMMY}\n`);
        for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([`${DUMMY}/32 host`]);
        expect((await h.script(['check', '--vip', VIP], env)).code).toBe(0);
        expect((await h.script(['setup', '--vip', VIP], env)).stdout).toContain('nothing to change');

        await writeFile(modeFile, 'ipv6\n');
        const check = await h.script(['check', '--vip', VIP], env);
        expect(check.code).toBe(1);
        expect(check.stdout).toBe(
          'ip6tnl0 is in mode ip6ip6, which drops IPv4-in-IPv6 (an IPv4 VIP whose LB reaches this real over IPv6): run: ip -6 tunnel change ip6tnl0 mode any\n',
        );
        await writeFile(modeFile, 'any\n');

        const removed = await h.script(['remove', '--vip', VIP], env);
        expect(removed.code, removed.stderr).toBe(0);
        expect(lines(removed.stdout)).toEqual(expect.arrayContaining(['set ip6tnl0 back to mode ip6ip6', 'brought tunl0 down', 'brought ip6tnl0 down']));
        expect(await readFile(modeFile, 'utf8')).toBe('ipv6\n');
        for (const iface of ['all', 'tunl0', 'ip6tnl0']) expect(await h.sysctl(iface, 'rp_filter'), iface).toBe('1');
        expect(await h.sh('ip -o -4 addr show dev tunl0; ip -o -4 addr show dev ip6tnl0')).toBe('');
        expect(lines(await readFile(log, 'utf8'))).toContain('-6 tunnel change ip6tnl0 mode any');
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });
  });

  it('check takes the mode and MSS from the record: a lost clamp, and a clamp too large for the MTU the tunnel arrives through', async () => {
    await withHost('ip3', async (h) => {
      await routed(h);
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      const setup = await h.script(['setup', '--vip', `${VIP},${VIP6}`, '--mode', 'ipip', '--mss', '1400']);
      expect(setup.code, setup.stderr).toBe(0);
      expect((await h.script(['check', '--vip', `${VIP},${VIP6}`])).stdout).toBe(
        `ok: VIPs ${VIP},${VIP6} on lo, ARP hidden on lo eth0 eth1 ip6tnl0 tunl0 (mode ipip)\n`,
      );
      // 1440 fits IPv4 in IPv4 (1440 + 40 + 20 = 1500), not IPv6 in IPv6 (1440 + 60 + 40 = 1540):
      // setup refuses it before any change (it took it, and the next check failed).
      const refused = await h.script(['setup', '--vip', `${VIP},${VIP6}`, '--mss', '1440']);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toBe(
        `dsrlb-realserver: TCP MSS 1440 from ${VIP6} is too large for ipip: a full segment arrives as a 1540-byte packet on eth0 (mtu 1500): run: dsrlb-realserver setup --vip ${VIP6} --mode ipip --mss 1400; nothing was changed\n`,
      );
      expect((await h.script(['check', '--vip', `${VIP},${VIP6}`])).code).toBe(0);
      // A path that shrinks after setup is check's to report.
      await h.sh('ip link set eth0 mtu 1600');
      expect((await h.script(['setup', '--vip', `${VIP},${VIP6}`, '--mss', '1440'])).code).toBe(0);
      await h.sh('ip link set eth0 mtu 1500');
      const v6 = await h.script(['check', '--vip', `${VIP},${VIP6}`]);
      expect(v6.stdout).toBe(
        `TCP MSS 1440 from ${VIP6} is too large for ipip: a full segment arrives as a 1540-byte packet on eth0 (mtu 1500): run: dsrlb-realserver setup --vip ${VIP6} --mode ipip --mss 1400\n`,
      );
      expect(v6.code).toBe(1);
      await h.sh('ip link set eth0 mtu 1400');
      const small = await h.script(['check', '--vip', VIP]);
      expect(small.stdout).toBe(
        `TCP MSS 1440 from ${VIP} is too large for ipip: a full segment arrives as a 1500-byte packet on eth0 (mtu 1400): run: dsrlb-realserver setup --vip ${VIP} --mode ipip --mss 1340\n`,
      );
      // The interface setup was told to use is the one measured.
      await h.sh('ip link set eth1 mtu 1600');
      expect((await h.script(['check', '--vip', VIP, '--interface', 'eth1'])).code).toBe(0);
      // Where an MSS this small cannot help, the fix is the MTU.
      await h.sh('ip link set eth0 mtu 576');
      expect((await h.script(['check', '--vip', VIP])).stdout).toContain('(mtu 576): run: ip link set eth0 mtu 1500\n');
      await h.sh('ip link set eth0 mtu 1500');

      await h.sh('nft delete table inet dsrlb_realserver');
      const lost = await h.script(['check', '--vip', VIP]);
      expect(lost.stdout).toBe(`TCP MSS from ${VIP} not clamped to 1440: run: dsrlb-realserver setup --vip ${VIP} --mode ipip --mss 1440\n`);
      expect(lost.code).toBe(1);
      // A tunnel device that is down, named with its fix.
      await h.sh('ip link set tunl0 down');
      expect((await h.script(['check', '--vip', VIP, '--mss', '1440'])).stdout).toContain('tunnel device tunl0 is down: run: ip link set tunl0 up\n');
    });
  });

  it('check reports an ipip VIP without an MSS clamp whose default MSS does not fit the path, with the --mss that fits', async () => {
    await withHost('ip6', async (h) => {
      await routed(h);
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      const vip = '203.0.113.30';
      // Set up where no clamp is needed (setup clamps where one is), then the path shrinks.
      await h.sh('ip link set eth0 mtu 9000');
      const setup = await h.script(['setup', '--vip', `${vip},${VIP6}`, '--mode', 'ipip']);
      expect(setup.code, setup.stderr).toBe(0);
      expect(setup.stdout).not.toContain('clamped');
      await h.sh('ip link set eth0 mtu 1500');
      // Unclamped, the real announces MTU - 40 (IPv6: - 60): 1460 + 40 + 20 and 1440 + 60 + 40 exceed 1500.
      const v4Line = (mtu: number, mss: number, fit: number): string =>
        `TCP MSS from ${vip} not clamped, too large for ipip: a full segment (MSS ${mss}) arrives as a ${mss + 60}-byte packet on eth0 (mtu ${mtu}), ` +
        `and the LB answers each with ICMP too-big: run: dsrlb-realserver setup --vip ${vip} --mode ipip --mss ${fit}, or raise the MTU of eth0 and of the path from the LB to 1520`;
      const v6Line =
        `TCP MSS from ${VIP6} not clamped, too large for ipip: a full segment (MSS 1440) arrives as a 1540-byte packet on eth0 (mtu 1500), ` +
        `and the LB answers each with ICMP too-big: run: dsrlb-realserver setup --vip ${VIP6} --mode ipip --mss 1400, or raise the MTU of eth0 and of the path from the LB to 1540`;
      const check = await h.script(['check', '--vip', `${vip},${VIP6}`]);
      expect(lines(check.stdout)).toEqual([v4Line(1500, 1460, 1440), v6Line]);
      expect(check.stderr).toBe('dsrlb-realserver: 2 problem(s) found\n');
      expect(check.code).toBe(1);
      // Below 1500 the default MSS follows the MTU down: still too large by the outer header.
      await h.sh('ip link set eth0 mtu 1400');
      expect((await h.script(['check', '--vip', vip])).stdout).toBe(`${v4Line(1400, 1360, 1340)}\n`);
      // A path that carries a 1500-byte client packet plus the outer header needs no clamp.
      await h.sh('ip link set eth0 mtu 1520');
      const v4ok = await h.script(['check', '--vip', `${vip},${VIP6}`]);
      expect(v4ok.stdout).toBe(`${v6Line.replace('(mtu 1500)', '(mtu 1520)').replace('--mss 1400', '--mss 1420')}\n`);
      await h.sh('ip link set eth0 mtu 9000');
      expect((await h.script(['check', '--vip', `${vip},${VIP6}`])).code).toBe(0);
      // With a clamp that fits, check is ok on 1500 as before.
      await h.sh('ip link set eth0 mtu 1500');
      expect((await h.script(['setup', '--vip', `${vip},${VIP6}`, '--mss', '1400'])).code).toBe(0);
      const clamped = await h.script(['check', '--vip', `${vip},${VIP6}`]);
      expect(clamped.stdout).toBe(`ok: VIPs ${vip},${VIP6} on lo, ARP hidden on lo eth0 eth1 ip6tnl0 tunl0 (mode ipip)\n`);
      expect(clamped.code).toBe(0);
    });
  });

  it('says when it cannot tell the interface the tunnel arrives on (MSS unchecked), and takes the one a running dsrlb decap reads', async () => {
    const vip = '203.0.113.34';
    const unknown = `dsrlb-realserver: warning: cannot tell which interface the tunnel for ${vip} arrives on (no default route, and not exactly one other interface up, nor one dsrlb decap for it): the TCP MSS is not checked against its MTU: give --interface IF\n`;
    // No default route and two interfaces up: before, check said ok without a word. (setup sets
    // what it can and leaves the saying to check.)
    await withHost('ip10', async (h) => {
      await h.sh('ip link set eth0 up && ip link set eth1 up && ip addr add 192.0.2.2/24 dev eth0');
      await standIn(h, 'tunl0');
      const setup = await h.script(['setup', '--vip', vip, '--mode', 'ipip']);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(setup.stdout).not.toContain('clamped');
      const check = await h.script(['check', '--vip', vip]);
      expect([check.code, check.stdout, check.stderr]).toEqual([0, expect.stringMatching(/^ok: /), unknown]);
      // --interface says it: the unclamped MSS does not fit eth0's 1500 bytes.
      const named = await h.script(['check', '--vip', vip, '--interface', 'eth0']);
      expect([named.code, named.stdout]).toEqual([1, expect.stringContaining(`TCP MSS from ${vip} not clamped, too large for ipip`)]);
    });
    // The same host with dsrlb decap reading eth0: that is where the tunnel arrives; setup clamps.
    await withHost('ip11', async (h) => {
      await h.sh('ip link set eth0 up && ip link set eth1 up && ip addr add 192.0.2.2/24 dev eth0');
      const decap = spawn('ip', ['netns', 'exec', h.ns, process.execPath, DSRLB, 'decap', '--interface', 'eth0', '--vip', vip], { stdio: 'ignore' });
      try {
        for (let i = 0; i < 100 && (await run('ip', ['-n', h.ns, 'link', 'show', 'dev', 'dsrlb-decap0', 'up'])).stdout === ''; i++) await new Promise((r) => setTimeout(r, 100));
        const setup = await h.script(['setup', '--vip', vip, '--mode', 'ipip']);
        expect([setup.code, setup.stderr]).toEqual([0, '']);
        expect(setup.stdout).toContain(`clamped the TCP MSS from ${vip} to 1440: the largest whose full segment fits ipip through eth0 (mtu 1500)`);
        const check = await h.script(['check', '--vip', vip]);
        expect([check.code, check.stderr]).toEqual([0, '']);
      } finally {
        decap.kill('SIGTERM');
        await new Promise((r) => decap.once('exit', r));
      }
    });
  });

  it('setup of an ipip VIP whose path cannot carry an unclamped MSS clamps it to the MSS check names, so its own check passes', async () => {
    await withHost('ip7', async (h) => {
      await routed(h);
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      const vip = '203.0.113.31';
      const setup = await h.script(['setup', '--vip', `${vip},${VIP6}`, '--mode', 'ipip']);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(lines(setup.stdout)).toEqual(
        expect.arrayContaining([
          `clamped the TCP MSS from ${vip} to 1440: the largest whose full segment fits ipip through eth0 (mtu 1500); choose another with --mss N`,
          `clamped the TCP MSS from ${VIP6} to 1400: the largest whose full segment fits ipip through eth0 (mtu 1500); choose another with --mss N`,
        ]),
      );
      // Recorded as setup's own ("auto"): a later setup in mode l2 takes it away again.
      expect(await h.state()).toContain(`mss ${vip} 1440 auto\nmss ${VIP6} 1400 auto\n`);
      const check = await h.script(['check', '--vip', `${vip},${VIP6}`]);
      expect([check.code, check.stdout, check.stderr]).toEqual([0, `ok: VIPs ${vip},${VIP6} on lo, ARP hidden on lo eth0 eth1 ip6tnl0 tunl0 (mode ipip)\n`, '']);
      expect((await h.script(['setup', '--vip', `${vip},${VIP6}`])).stdout).toBe(`setup ok, nothing to change (mode ipip, VIPs ${vip},${VIP6})\n`);
      // A recorded clamp is kept as if it had been given (the path may grow: it still fits).
      await h.sh('ip link set eth0 mtu 9000');
      expect((await h.script(['setup', '--vip', vip])).stdout).toContain('nothing to change');
      // Where no MSS of 536 or more fits, the MTU is the fix: said, and nothing is clamped.
      await h.sh('ip link set eth0 mtu 576');
      const other = '203.0.113.32';
      const tiny = await h.script(['setup', '--vip', other, '--mode', 'ipip']);
      expect(tiny.code).toBe(0);
      expect(tiny.stderr).toBe(
        `dsrlb-realserver: warning: TCP MSS from ${other} not clamped, too large for ipip: a full segment (MSS 536) arrives as a 596-byte packet on eth0 (mtu 576), ` +
          'and the LB answers each with ICMP too-big: run: ip link set eth0 mtu 1520, and the MTU of the path from the LB alike\n',
      );
      expect(await h.state()).not.toContain(`mss ${other} `);
      // Where the path carries a 1500-byte client packet plus the outer header, no clamp is needed.
      await h.sh('ip link set eth0 mtu 1520');
      const roomy = await h.script(['setup', '--vip', '203.0.113.33', '--mode', 'ipip']);
      expect([roomy.code, roomy.stderr]).toEqual([0, '']);
      expect(roomy.stdout).not.toContain('clamped');
    });
  });

  it('setup in mode l2 removes the MSS clamp setup made itself for the VIP in mode ipip, and says so; a clamp given with --mss stays', async () => {
    await withHost('ip8', async (h) => {
      await routed(h);
      await standIn(h, 'tunl0');
      const auto = '203.0.113.41';
      const given = '203.0.113.42';
      const nftRules = async (): Promise<string> => (await h.sh('nft list table inet dsrlb_realserver 2>/dev/null || true'));
      expect((await h.script(['setup', '--vip', auto, '--mode', 'ipip'])).stdout).toContain(`clamped the TCP MSS from ${auto} to 1440: the largest`);
      expect((await h.script(['setup', '--vip', given, '--mode', 'ipip', '--mss', '1400'])).code).toBe(0);
      expect(await nftRules()).toContain(`comment "dsrlb vip ${auto}"`);

      const l2 = await h.script(['setup', '--vip', `${auto},${given}`, '--mode', 'l2']);
      expect([l2.code, l2.stderr]).toEqual([0, '']);
      expect(lines(l2.stdout)).toContain(`removed the TCP MSS clamp from ${auto} to 1440 that setup made for mode ipip: mode l2 does not need it (--mss N sets one)`);
      expect(l2.stdout).not.toContain(`clamp from ${given}`);
      const state = await h.state();
      expect(state).not.toContain(`mss ${auto} `);
      expect(state).toContain(`mss ${given} 1400\n`);
      const rules = await nftRules();
      expect(rules).not.toContain(`dsrlb vip ${auto}"`);
      expect(rules).toMatch(new RegExp(`maxseg size set 1400 comment "dsrlb vip ${given.replaceAll('.', '\\.')}"`));
      const check = await h.script(['check', '--vip', `${auto},${given}`]);
      expect([check.code, check.stderr]).toEqual([0, '']);
      expect((await h.script(['setup', '--vip', `${auto},${given}`])).stdout).toBe(`setup ok, nothing to change (mode l2, VIPs ${auto},${given})\n`);

      // The operator's clamp alone in mode l2 too: it stays (and the script's own clamp, the last one, takes the table with it).
      expect((await h.script(['setup', '--vip', given, '--mode', 'ipip'])).code).toBe(0);
      expect(await h.state()).toContain(`mss ${given} 1400\n`);
      expect((await h.script(['remove', '--vip', given])).code).toBe(0);
      expect((await h.script(['setup', '--vip', auto, '--mode', 'ipip'])).stdout).toContain(`clamped the TCP MSS from ${auto} to 1440`);
      const last = await h.script(['setup', '--vip', auto, '--mode', 'l2']);
      expect(lines(last.stdout)).toEqual(
        expect.arrayContaining(['removed nftables table inet dsrlb_realserver', `removed the TCP MSS clamp from ${auto} to 1440 that setup made for mode ipip: mode l2 does not need it (--mss N sets one)`]),
      );
      expect(await nftRules()).toBe('');
    });
  });

  it('the last ipip VIP gone, remove undoes rp_filter and the tunnel link but keeps the ARP sysctls for the l2 VIPs', async () => {
    await withHost('ip4', async (h) => {
      await standIn(h, 'tunl0', false);
      await h.sh('echo 1 > /proc/sys/net/ipv4/conf/all/rp_filter && echo 1 > /proc/sys/net/ipv4/conf/tunl0/rp_filter');
      expect((await h.script(['setup', '--vip', VIP, '--mode', 'ipip'])).code).toBe(0);
      expect((await h.script(['setup', '--vip', '10.0.0.101'])).code).toBe(0);
      const r = await h.script(['remove', '--vip', VIP]);
      expect(r.code).toBe(0);
      expect(lines(r.stdout)).toEqual([
        `removed ${VIP}/32 from lo`,
        'kept the sysctls: still set up for VIPs 10.0.0.101',
        'no ipip VIP left: undoing the tunnel settings',
        'brought tunl0 down',
        `removed ${DUMMY}/32 from tunl0`,
        'restored net.ipv4.conf.tunl0.rp_filter=1',
        'remove ok',
      ]);
      expect(await h.sysctl('all', 'arp_ignore')).toBe('1');
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      expect(await tunnelAddrs(h, 'tunl0')).toEqual([]);
      expect(await h.state()).not.toMatch(/rp_filter|link tunl0|tunaddr/);
    });
  });

  it('the dummy address stays while an IPv4 ipip VIP is left; setup in mode l2 of the last one takes it off with the rp_filter, and the links stay for the IPv6 ipip VIP', async () => {
    await withHost('ip9', async (h) => {
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      const other = '10.0.0.101';
      const vips = `${VIP},${other},${VIP6}`;
      expect((await h.script(['setup', '--vip', vips, '--mode', 'ipip'])).code).toBe(0);
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([`${DUMMY}/32 host`]);
      const l2 = await h.script(['setup', '--vip', VIP, '--mode', 'l2']);
      // Only the record changes (the host is as mode l2 wants it).
      expect([l2.code, lines(l2.stdout)]).toEqual([0, [`setup ok, nothing to change (mode l2, VIPs ${VIP})`]]);
      expect(await tunnelAddrs(h, 'tunl0')).toEqual([`${DUMMY}/32 host`]);
      expect(await h.sysctl('tunl0', 'rp_filter')).toBe('2');
      const last = await h.script(['setup', '--vip', other, '--mode', 'l2']);
      expect([last.code, lines(last.stdout)]).toEqual([
        0,
        [
          "no IPv4 ipip VIP left: undoing the tunnel devices' rp_filter and dummy address",
          `removed ${DUMMY}/32 from tunl0`,
          `removed ${DUMMY}/32 from ip6tnl0`,
          'restored net.ipv4.conf.tunl0.rp_filter=0',
          'restored net.ipv4.conf.ip6tnl0.rp_filter=0',
          `setup ok (mode l2, VIPs ${other})`,
        ],
      ]);
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([]);
      expect(await h.state()).not.toMatch(/tunaddr|rp_filter/);
      const v6 = await h.script(['check', '--vip', VIP6]);
      expect([v6.code, v6.stdout]).toEqual([0, `ok: VIPs ${VIP6} on lo (IPv6: no ARP to hide; mode ipip)\n`]);
    });
  });

  it('setup puts back at once the all.rp_filter an older version set to 0 (its state holds "sysctl all rp_filter 1 0"), unless an IPv4 ipip VIP it set up waits for setup; the record for dsrlb decap\'s TUN is dropped', async () => {
    await withHost('ip5', async (h) => {
      await routed(h); // a default route: loose rp_filter wants the source to have one
      await h.sh('ip link set eth0 mtu 1600'); // room for the outer header: no MSS clamp needed
      await standIn(h, 'tunl0');
      // As an older version left the host: all and tunl0 at 0 (tunl0 bare), recorded with the operator's 1.
      await h.sh(`ip addr add ${VIP}/32 dev lo && echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && echo 0 > /proc/sys/net/ipv4/conf/tunl0/rp_filter`);
      await mkdir(join(h.root, 'run/dsrlb-realserver'), { recursive: true });
      await writeFile(
        join(h.root, 'run/dsrlb-realserver', `netns-${h.ns}.state`),
        `vip ${VIP} ipip - added\nsysctl all rp_filter 1 0\nsysctl tunl0 rp_filter 1 0\nsysctl dsrlb-decap0 rp_filter 1 0\n`,
      );
      // An l2 VIP first: the ipip VIP's tunl0 is still as the older setup left it, which needs all at 0.
      const l2 = await h.script(['setup', '--vip', '10.0.0.101']);
      expect([l2.code, l2.stderr]).toEqual([0, '']);
      expect(lines(l2.stdout)).toContain(`left net.ipv4.conf.all.rp_filter=0, which an earlier setup set for ipip: setup of VIPs ${VIP} in mode ipip puts it back`);
      expect(await h.sysctl('all', 'rp_filter')).toBe('0');
      expect(await h.state()).toContain('sysctl all rp_filter 1 0\n');
      expect(await h.state()).not.toContain('dsrlb-decap0');
      // setup of the ipip VIP: tunl0 loose with the dummy address, its record keeps the operator's value, and all goes back.
      const setup = await h.script(['setup', '--vip', VIP]);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(lines(setup.stdout).filter((l) => l.includes('rp_filter'))).toEqual([
        ADDED_DUMMY('tunl0'),
        'set net.ipv4.conf.tunl0.rp_filter=2 (was 0)',
        "restored net.ipv4.conf.all.rp_filter=1 (an earlier setup set it to 0; the tunnel devices' own loose rp_filter replaces it)",
      ]);
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      const state = await h.state();
      expect(state).not.toMatch(/sysctl all rp_filter|sysctl tunl0 rp_filter 1 0/);
      expect(state).toContain('sysctl tunl0 rp_filter 1 2\n');
      expect((await h.script(['check', '--vip', VIP])).code).toBe(0);
      expect(await echoThroughTun(h, 'tunl0', '198.51.100.7', VIP)).toBe(true);
      const r = await h.script(['remove', '--vip', VIP]);
      expect([r.code, r.stderr]).toEqual([0, '']);
      expect(lines(r.stdout)).toEqual([
        `removed ${VIP}/32 from lo`,
        'kept the sysctls: still set up for VIPs 10.0.0.101',
        'no ipip VIP left: undoing the tunnel settings',
        `removed ${DUMMY}/32 from tunl0`,
        'restored net.ipv4.conf.tunl0.rp_filter=1',
        'remove ok',
      ]);
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      expect(await h.sysctl('tunl0', 'rp_filter')).toBe('1');
    });
  });

  it('an all.rp_filter changed since an older version set it to 0 is left as it is, and its record dropped', async () => {
    await withHost('ip6', async (h) => {
      await standIn(h, 'tunl0');
      await h.sh('echo 2 > /proc/sys/net/ipv4/conf/all/rp_filter');
      await mkdir(join(h.root, 'run/dsrlb-realserver'), { recursive: true });
      await writeFile(join(h.root, 'run/dsrlb-realserver', `netns-${h.ns}.state`), 'sysctl all rp_filter 1 0\n');
      const setup = await h.script(['setup', '--vip', VIP, '--mode', 'ipip']);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(lines(setup.stdout)).toContain('left net.ipv4.conf.all.rp_filter=2 (changed since an earlier setup set it to 0)');
      expect(await h.sysctl('all', 'rp_filter')).toBe('2');
      expect(await h.state()).not.toContain('sysctl all rp_filter');
    });
  });

  it('upgrade from the version that put each IPv4 ipip VIP on the tunnel devices ("tunaddr DEV VIP"): setup and remove take the VIPs off, the dummy address in their place where an IPv4 ipip VIP stays', async () => {
    await withHost('ip7', async (h) => {
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      const other = '10.0.0.101';
      // As that version left the host: both VIPs on lo and, as /32 scope host, on both devices; rp_filter 2 there.
      const oldHost = async (): Promise<void> => {
        await h.sh(
          'ip addr flush dev tunl0 && ip addr flush dev ip6tnl0 && ' +
            [VIP, other].map((v) => `ip addr replace ${v}/32 dev lo && ip addr add ${v}/32 dev tunl0 scope host && ip addr add ${v}/32 dev ip6tnl0 scope host`).join(' && ') +
            ' && echo 2 > /proc/sys/net/ipv4/conf/tunl0/rp_filter && echo 2 > /proc/sys/net/ipv4/conf/ip6tnl0/rp_filter',
        );
        await mkdir(join(h.root, 'run/dsrlb-realserver'), { recursive: true });
        await writeFile(
          join(h.root, 'run/dsrlb-realserver', `netns-${h.ns}.state`),
          [
            `vip ${VIP} ipip - added`,
            `vip ${other} ipip - added`,
            `tunaddr tunl0 ${VIP}`,
            `tunaddr tunl0 ${other}`,
            `tunaddr ip6tnl0 ${VIP}`,
            `tunaddr ip6tnl0 ${other}`,
            'sysctl tunl0 rp_filter 0 2',
            'sysctl ip6tnl0 rp_filter 0 2',
            '',
          ].join('\n'),
        );
      };
      const replaced = (v: string, dev: string): string =>
        `removed ${v}/32 from ${dev}: an earlier setup put the VIP there, a local address apart from lo that the host answers ARP for wherever arp_ignore is 0`;
      await oldHost();
      // check reports the VIP on a tunnel device as on any interface but lo.
      const before = await h.script(['check', '--vip', VIP]);
      expect(before.code).toBe(1);
      expect(lines(before.stdout)).toEqual(
        expect.arrayContaining([
          `VIP ${VIP} is also on tunl0, where an earlier version of dsrlb-realserver put it (this host would answer ARP/ND for it): run: dsrlb-realserver setup --vip ${VIP}`,
          `VIP ${VIP} is also on ip6tnl0, where an earlier version of dsrlb-realserver put it (this host would answer ARP/ND for it): run: dsrlb-realserver setup --vip ${VIP}`,
        ]),
      );
      // setup takes them off (no "also on" warning for what the record says it put there), the dummy address first.
      const setup = await h.script(['setup', '--vip', VIP]);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(lines(setup.stdout).slice(0, 6)).toEqual([
        ADDED_DUMMY('tunl0'),
        replaced(VIP, 'tunl0'),
        replaced(other, 'tunl0'),
        ADDED_DUMMY('ip6tnl0'),
        replaced(VIP, 'ip6tnl0'),
        replaced(other, 'ip6tnl0'),
      ]);
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([`${DUMMY}/32 host`]);
      expect(lines(await h.state()).filter((l) => l.startsWith('tunaddr '))).toEqual([`tunaddr tunl0 ${DUMMY}`, `tunaddr ip6tnl0 ${DUMMY}`]);
      // No interface up here: the MSS is left unchecked, and said so.
      const check = await h.script(['check', '--vip', `${VIP},${other}`]);
      expect([check.code, lines(check.stderr).map((l) => l.replace(/ for \S+ arrives/, ' for VIP arrives'))]).toEqual([0, Array(2).fill(expect.stringMatching(/^dsrlb-realserver: warning: cannot tell which interface the tunnel for VIP arrives on/))]);
      const again = await h.script(['setup', '--vip', `${VIP},${other}`]);
      expect([again.code, lines(again.stdout)]).toEqual([0, [`setup ok, nothing to change (mode ipip, VIPs ${VIP},${other})`]]);

      // remove from the same old state: the other IPv4 ipip VIP stays, so the dummy address takes the VIPs' place.
      await oldHost();
      const one = await h.script(['remove', '--vip', VIP]);
      expect([one.code, one.stderr]).toEqual([0, '']);
      expect(lines(one.stdout)).toEqual([
        ADDED_DUMMY('tunl0'),
        replaced(VIP, 'tunl0'),
        replaced(other, 'tunl0'),
        ADDED_DUMMY('ip6tnl0'),
        replaced(VIP, 'ip6tnl0'),
        replaced(other, 'ip6tnl0'),
        `removed ${VIP}/32 from lo`,
        `kept the sysctls: still set up for VIPs ${other}`,
        'remove ok',
      ]);
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([`${DUMMY}/32 host`]);
      expect((await h.script(['check', '--vip', other])).code).toBe(0);
      // The last one: off lo, and the tunnels' dummy address and rp_filter go.
      const last = await h.script(['remove', '--vip', other]);
      expect([last.code, last.stderr]).toEqual([0, '']);
      expect(lines(last.stdout)).toEqual(
        expect.arrayContaining([`removed ${DUMMY}/32 from tunl0`, `removed ${DUMMY}/32 from ip6tnl0`, 'restored net.ipv4.conf.tunl0.rp_filter=0', 'restored net.ipv4.conf.ip6tnl0.rp_filter=0']),
      );
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev), dev).toEqual([]);
      await expect(h.state()).rejects.toThrow(/ENOENT/);

      // remove of the only IPv4 ipip VIP from the old state: nothing needs the dummy address.
      await h.sh(`ip addr add ${VIP}/32 dev lo && ip addr add ${VIP}/32 dev tunl0 scope host && echo 2 > /proc/sys/net/ipv4/conf/tunl0/rp_filter`);
      await writeFile(join(h.root, 'run/dsrlb-realserver', `netns-${h.ns}.state`), `vip ${VIP} ipip - added\ntunaddr tunl0 ${VIP}\nsysctl tunl0 rp_filter 0 2\n`);
      const only = await h.script(['remove', '--vip', VIP]);
      expect([only.code, only.stderr]).toEqual([0, '']);
      expect(lines(only.stdout)).toEqual([replaced(VIP, 'tunl0'), `removed ${VIP}/32 from lo`, 'restored net.ipv4.conf.tunl0.rp_filter=0', 'remove ok']);
      expect(await tunnelAddrs(h, 'tunl0')).toEqual([]);
    });
  });
});

describe('ipip rp_filter on a hardened host (all.rp_filter=1)', () => {
  const other = '10.0.0.101';

  it('setup leaves all at 1, puts the dummy address on tunl0 and ip6tnl0 where they have no IPv4 address and their rp_filter at 2; again changes nothing; check is ok; remove of the last IPv4 ipip VIP undoes only that', async () => {
    await withHost('rp0', async (h) => {
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      // The operator's own: all strict, the devices 1 and 0, and an address on tunl0 (any will do for loose rp_filter).
      await h.sh('cd /proc/sys/net/ipv4/conf && echo 1 > all/rp_filter && echo 1 > tunl0/rp_filter && echo 0 > ip6tnl0/rp_filter && ip addr add 192.0.2.9/32 dev tunl0');
      const vips = `${VIP},${other},${VIP6}`;
      const setup = await h.script(['setup', '--vip', vips, '--mode', 'ipip']);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      expect(lines(setup.stdout).filter((l) => /rp_filter| on (tunl0|ip6tnl0)/.test(l))).toEqual([
        ADDED_DUMMY('ip6tnl0'),
        'set net.ipv4.conf.tunl0.rp_filter=2 (was 1)',
        'set net.ipv4.conf.ip6tnl0.rp_filter=2 (was 0)',
      ]);
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await h.sysctl(dev, 'rp_filter'), dev).toBe('2');
      // No VIP on a tunnel device: the operator's address on tunl0 alone, the dummy address on ip6tnl0.
      expect(await tunnelAddrs(h, 'tunl0')).toEqual(['192.0.2.9/32 global']);
      expect(await tunnelAddrs(h, 'ip6tnl0')).toEqual([`${DUMMY}/32 host`]);
      for (const dev of ['tunl0', 'ip6tnl0']) expect(await tunnelAddrs(h, dev, 'inet6'), dev).not.toContain(`${VIP6}/128 host`);
      const state = await h.state();
      expect(lines(state).filter((l) => l.startsWith('tunaddr ') || l.includes('rp_filter'))).toEqual([
        `tunaddr ip6tnl0 ${DUMMY}`,
        'sysctl tunl0 rp_filter 1 2',
        'sysctl ip6tnl0 rp_filter 0 2',
      ]);

      const again = await h.script(['setup', '--vip', vips]);
      expect([again.code, again.stdout]).toEqual([0, `setup ok, nothing to change (mode ipip, VIPs ${vips})\n`]);
      expect(await h.state()).toBe(state);
      // No default route and no interface up: which one the tunnel arrives on is said, not guessed.
      const check = await h.script(['check', '--vip', vips]);
      const unchecked = vips.split(',').map((v) => `dsrlb-realserver: warning: cannot tell which interface the tunnel for ${v} arrives on (no default route, and not exactly one other interface up, nor one dsrlb decap for it): the TCP MSS is not checked against its MTU: give --interface IF\n`);
      expect([check.code, check.stdout, check.stderr]).toEqual([0, `ok: VIPs ${vips} on lo, ARP hidden on lo eth0 eth1 ip6tnl0 tunl0 (mode ipip)\n`, unchecked.join('')]);

      // One IPv4 VIP goes: off lo only; the tunnels stay as they are for the other.
      const one = await h.script(['remove', '--vip', VIP]);
      expect([one.code, lines(one.stdout)]).toEqual([0, [`removed ${VIP}/32 from lo`, `kept the sysctls: still set up for VIPs ${other},${VIP6}`, 'remove ok']]);
      expect(await tunnelAddrs(h, 'ip6tnl0')).toEqual([`${DUMMY}/32 host`]);
      expect(await h.sysctl('tunl0', 'rp_filter')).toBe('2');
      // The last IPv4 ipip VIP goes: the dummy address setup added and rp_filter go, the operator's address stays.
      const last = await h.script(['remove', '--vip', other]);
      expect([last.code, last.stderr]).toEqual([0, '']);
      expect(lines(last.stdout)).toEqual([
        `removed ${other}/32 from lo`,
        // IPv6 needs no ARP hiding: with only an IPv6 VIP left the ARP sysctls go back.
        `only IPv6 VIPs left (${VIP6}): undoing the ARP sysctls, which IPv6 does not use`,
        ...['all', 'lo', 'eth0', 'eth1', 'ip6tnl0', 'tunl0'].flatMap((i) => [`restored net.ipv4.conf.${i}.arp_ignore=0`, `restored net.ipv4.conf.${i}.arp_announce=0`]),
        "no IPv4 ipip VIP left: undoing the tunnel devices' rp_filter and dummy address",
        `removed ${DUMMY}/32 from ip6tnl0`,
        'restored net.ipv4.conf.tunl0.rp_filter=1',
        'restored net.ipv4.conf.ip6tnl0.rp_filter=0',
        'remove ok',
      ]);
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      expect(await tunnelAddrs(h, 'tunl0')).toEqual(['192.0.2.9/32 global']);
      expect(await tunnelAddrs(h, 'ip6tnl0')).toEqual([]);
      const rest = await h.script(['remove', '--vip', VIP6]);
      expect([rest.code, rest.stderr]).toEqual([0, '']);
      expect(await tunnelAddrs(h, 'tunl0')).toEqual(['192.0.2.9/32 global']);
      await expect(h.state()).rejects.toThrow(/ENOENT/);
    });
  });

  it('check names each tunnel device rp_filter drops on, as the kernel does: an echo written into the TUN reaches ICMP exactly when check is ok', async () => {
    await withHost('rp1', async (h) => {
      await routed(h); // a default route: loose rp_filter wants the source to have one
      await h.sh('ip link set eth0 mtu 1600');
      await standIn(h, 'tunl0');
      await standIn(h, 'ip6tnl0');
      await h.sh('echo 1 > /proc/sys/net/ipv4/conf/all/rp_filter');
      expect((await h.script(['setup', '--vip', VIP, '--mode', 'ipip'])).code).toBe(0);
      const strict = (dev: string, d: number, all: number): string =>
        `net.ipv4.conf.${dev}.rp_filter is ${d}, want 2 (loose): with all at ${all} the kernel takes the larger, 1 (strict), which drops the packets decapsulated on ${dev}: ` +
        `run: sysctl -w net.ipv4.conf.${dev}.rp_filter=2`;
      const noAddress = (dev: string, eff: number): string =>
        `${dev} has no IPv4 address, so rp_filter (the larger of all and ${dev}'s: ${eff}) drops every packet decapsulated on it: run: ip addr add ${DUMMY}/32 dev ${dev} scope host`;
      const cases: [all: number, dev: number, address: boolean, problems: string[]][] = [
        [1, 2, true, []],
        [1, 0, true, [strict('tunl0', 0, 1)]],
        [0, 1, true, [strict('tunl0', 1, 0)]],
        [1, 0, false, [strict('tunl0', 0, 1), noAddress('tunl0', 1)]],
        [2, 0, false, [noAddress('tunl0', 2)]],
        [0, 2, false, [noAddress('tunl0', 2)]],
        [0, 0, false, []],
        [2, 2, true, []],
      ];
      for (const [all, dev, address, problems] of cases) {
        const what = `all ${all}, tunl0 ${dev}, ${address ? 'with' : 'without'} an address`;
        await h.sh(
          `echo ${all} > /proc/sys/net/ipv4/conf/all/rp_filter && echo ${dev} > /proc/sys/net/ipv4/conf/tunl0/rp_filter && ` +
            (address ? `ip addr replace ${DUMMY}/32 dev tunl0 scope host` : `ip addr flush dev tunl0`),
        );
        const check = await h.script(['check', '--vip', VIP]);
        expect([check.code, problems.length === 0 ? check.stdout : lines(check.stdout)], what).toEqual(
          problems.length === 0 ? [0, `ok: VIPs ${VIP} on lo, ARP hidden on lo eth0 eth1 ip6tnl0 tunl0 (mode ipip)\n`] : [1, problems],
        );
        expect(await echoThroughTun(h, 'tunl0', '198.51.100.7', VIP), what).toBe(problems.length === 0);
      }
      // The VIP on a tunnel device, in any form, is reported as on any interface but lo: a local address apart from lo.
      for (const form of [`${VIP}/32 dev ip6tnl0 scope host`, `${VIP}/24 dev ip6tnl0`]) {
        await h.sh(`ip addr flush dev ip6tnl0 && ip addr add ${DUMMY}/32 dev ip6tnl0 scope host && ip addr add ${form}`);
        expect((await h.script(['check', '--vip', VIP])).stdout, form).toBe(
          `VIP ${VIP} is also on ip6tnl0 (this host would answer ARP/ND for it): run: ip addr del ${form.split(' ')[0]} dev ip6tnl0\n`,
        );
      }
    });
  });
});

describe('--mss without nft', () => {
  it('setup exits 2 before changing anything: no VIP, no sysctl, no state', async () => {
    await withHost('nft', async (h) => {
      // A PATH with every tool the script uses except nft.
      const dir = await mkdtemp(join(tmpdir(), `${PREFIX}nonft-`));
      try {
        for (const tool of ['dash', 'ip', 'awk', 'tr', 'grep', 'cat', 'mkdir', 'mv', 'rm', 'cp', 'chmod', 'cmp', 'id', 'uname', 'dirname', 'ls']) {
          await symlink((await mustRun('sh', ['-c', `command -v ${tool}`])).trim(), join(dir, tool));
        }
        const r = await run('ip', ['netns', 'exec', h.ns, 'env', `PATH=${dir}`, `DSRLB_ROOT=${h.root}`, 'dash', SCRIPT, 'setup', '--vip', VIP, '--mss', '1440']);
        expect(r.stderr).toBe(
          'dsrlb-realserver: --mss needs nft (nftables), which is not installed; nothing was changed (iproute2 alone can clamp only per route: ip route change ROUTE advmss N)\n',
        );
        expect(r.code).toBe(2);
        expect(r.stdout).toBe('');
        expect(await mustRun('ip', ['-n', h.ns, '-o', 'addr', 'show', 'dev', 'lo'])).toBe('');
        expect(await h.sysctl('all', 'arp_ignore')).toBe('0');
        await expect(readdir(join(h.root, 'run'))).rejects.toThrow(/ENOENT/);
        // Without --mss the same PATH is enough.
        const plain = await run('ip', ['netns', 'exec', h.ns, 'env', `PATH=${dir}`, `DSRLB_ROOT=${h.root}`, 'dash', SCRIPT, 'setup', '--vip', VIP]);
        expect(plain.stderr).toBe('');
        expect(plain.code).toBe(0);
        // ipip on a path that needs a clamp: setup cannot make it without nft, and says so with the command check will give.
        await routed(h);
        await standIn(h, 'tunl0');
        const ipip = await run('ip', ['netns', 'exec', h.ns, 'env', `PATH=${dir}`, `DSRLB_ROOT=${h.root}`, 'dash', SCRIPT, 'setup', '--vip', '203.0.113.34', '--mode', 'ipip']);
        expect(ipip.code).toBe(0);
        expect(ipip.stderr).toBe(
          'dsrlb-realserver: warning: TCP MSS from 203.0.113.34 not clamped, too large for ipip: a full segment (MSS 1460) arrives as a 1520-byte packet on eth0 (mtu 1500), ' +
            'and the LB answers each with ICMP too-big: run: dsrlb-realserver setup --vip 203.0.113.34 --mode ipip --mss 1440, or raise the MTU of eth0 and of the path from the LB to 1520 ' +
            '(--mss needs nft (nftables), which is not installed)\n',
        );
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    });
  });
});

describe('state per network namespace', () => {
  it('a namespace without a name (unshare, a container) gets its own state file, named by its inode like the daemon does', async () => {
    const dir = await mkdtemp(join(tmpdir(), `${PREFIX}state-`));
    try {
      // The second namespace is made while the first still exists (nested): one made after the
      // first was freed can get the same inode number back, which is no test of two namespaces.
      const one = `ls -iL /proc/self/ns/net | awk '{ print $1 }' && dash ${SCRIPT} setup --vip ${VIP} >/dev/null`;
      const out = await mustRun('unshare', ['-n', 'sh', '-c', `${one} && unshare -n sh -c "${one.replace(/\$/g, '\\$')}"`], {
        DSRLB_STATE_DIR: dir,
      });
      const inodes = out.trim().split('\n');
      expect(inodes).toHaveLength(2);
      expect(inodes[0]).not.toBe(inodes[1]);
      expect((await readdir(dir)).sort()).toEqual(inodes.map((n) => `host-${n}.state`).sort());
      expect(await readFile(join(dir, `host-${inodes[0]}.state`), 'utf8')).toContain(`vip ${VIP} l2 - added\n`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('--persist', () => {
  /** systemd-analyze verify of the persisted unit under the root (the host's units for the rest). */
  async function verify(root: string): Promise<Result> {
    await mkdir(join(root, 'usr/lib/systemd'), { recursive: true });
    await symlink('/lib/systemd/system', join(root, 'usr/lib/systemd/system')).catch(() => undefined);
    // A unit of several groups runs /bin/sh, which verify looks for under the root (a copy: a
    // symlink would be followed inside the root).
    await mkdir(join(root, 'bin'), { recursive: true });
    await copyFile((await mustRun('readlink', ['-f', '/bin/sh'])).trim(), join(root, 'bin/sh'));
    return run('systemd-analyze', ['verify', `--root=${root}`, '/etc/systemd/system/dsrlb-realserver.service']);
  }

  it('installs the script in /usr/local/sbin and the unit runs it from there; check --persist reports an ExecStart that is missing or not executable', async () => {
    await withHost('p0', async (h) => {
      // A copy somewhere else and without +x, as scp leaves it: the unit must not point at it.
      const copyDir = await mkdtemp(join(tmpdir(), `${PREFIX}copy-`));
      try {
        const copy = join(copyDir, 'dsrlb-realserver');
        await copyFile(SCRIPT, copy);
        await chmod(copy, 0o644);
        const r = await run('ip', ['netns', 'exec', h.ns, 'dash', copy, 'setup', '--vip', VIP, '--interface', 'eth0', '--persist'], { DSRLB_ROOT: h.root });
        expect(r.code, r.stderr).toBe(0);
        expect(r.stdout).toContain(`installed ${h.root}${SBIN} (the unit runs it from there)`);
        const installed = join(h.root, SBIN);
        expect(await readFile(installed, 'utf8')).toBe(await readFile(SCRIPT, 'utf8'));
        expect((await stat(installed)).mode & 0o777).toBe(0o755);

        const conf = await readFile(join(h.root, 'etc/sysctl.d/90-dsrlb-realserver.conf'), 'utf8');
        expect(lines(conf).filter((l) => !l.startsWith('#'))).toEqual([
          'net.ipv4.conf.all.arp_ignore = 1',
          'net.ipv4.conf.all.arp_announce = 2',
          'net.ipv4.conf.lo.arp_ignore = 1',
          'net.ipv4.conf.lo.arp_announce = 2',
          'net.ipv4.conf.eth0.arp_ignore = 1',
          'net.ipv4.conf.eth0.arp_announce = 2',
        ]);
        const unit = await readFile(join(h.root, 'etc/systemd/system/dsrlb-realserver.service'), 'utf8');
        expect(unit).toContain('Type=oneshot');
        expect(unit).toContain('RemainAfterExit=yes');
        expect(lines(unit).filter((l) => l.startsWith('Exec'))).toEqual([
          `ExecStart=${SBIN} setup --vip ${VIP} --mode l2 --interface eth0`,
          `ExecStop=${SBIN} remove --vip ${VIP}`,
        ]);
        expect(unit).toContain('WantedBy=multi-user.target');
        expect(await readdir(join(h.root, 'run/dsrlb-realserver'))).toEqual([`netns-${h.ns}.state`]);
        const verified = await verify(h.root);
        expect(verified.stderr).toBe('');
        expect(verified.code).toBe(0);

        expect((await h.script(['check', '--vip', VIP, '--persist'])).code).toBe(0);
        const again = await h.script(['setup', '--vip', VIP, '--persist']);
        expect(again.stdout).toBe(`setup ok, nothing to change (mode l2, VIPs ${VIP})\n`);

        const fix = `run: dsrlb-realserver setup --vip ${VIP} --persist`;
        const unitPath = `${h.root}/etc/systemd/system/dsrlb-realserver.service`;
        await chmod(installed, 0o644);
        const noExec = await h.script(['check', '--vip', VIP, '--persist']);
        expect(noExec.stdout).toBe(`${unitPath} runs ${SBIN}, which is missing or not executable: ${fix}\n`);
        expect(noExec.code).toBe(1);
        await rm(installed);
        expect((await h.script(['check', '--vip', VIP, '--persist'])).stdout).toBe(`${unitPath} runs ${SBIN}, which is missing or not executable: ${fix}\n`);
        expect((await h.script(['setup', '--vip', VIP, '--persist'])).stdout).toContain(`installed ${h.root}${SBIN}`);
        expect((await h.script(['check', '--vip', VIP, '--persist'])).code).toBe(0);
      } finally {
        await rm(copyDir, { recursive: true, force: true });
      }
    });
  });

  it('persists every VIP set up, keeps those of a unit written before, matches VIPs exactly, and remove --persist rewrites, then deletes', async () => {
    await withHost('p1', async (h) => {
      const unitPath = join(h.root, 'etc/systemd/system/dsrlb-realserver.service');
      const confPath = join(h.root, 'etc/sysctl.d/90-dsrlb-realserver.conf');
      const execLines = async (): Promise<string[]> => lines(await readFile(unitPath, 'utf8')).filter((l) => l.startsWith('Exec'));
      // A unit an older version wrote (one call's VIPs, run from a checkout): its VIP stays persisted.
      await mkdir(join(h.root, 'etc/systemd/system'), { recursive: true });
      await writeFile(
        unitPath,
        '# Written by dsrlb-realserver setup --persist.\n[Unit]\nDescription=old\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n' +
          'ExecStart=/home/op/dsrlb/deploy/linux/dsrlb-realserver setup --vip 192.0.2.77 --mode l2\n' +
          'ExecStop=/home/op/dsrlb/deploy/linux/dsrlb-realserver remove --vip 192.0.2.77\n\n[Install]\nWantedBy=multi-user.target\n',
      );
      expect((await h.script(['setup', '--vip', '203.0.113.10,2001:db8::10', '--mss', '1440', '--persist'])).code).toBe(0);
      expect((await h.script(['setup', '--vip', '198.51.100.5', '--persist'])).code).toBe(0);
      // One setup per set of options, its VIPs in the order they were first set up, all in one
      // ExecStart (a failing line of a oneshot unit would skip the lines after it).
      expect(await execLines()).toEqual([
        groupsExecStart([
          `${SBIN} setup --vip 192.0.2.77,198.51.100.5 --mode l2`,
          `${SBIN} setup --vip 203.0.113.10,2001:db8::10 --mode l2 --mss 1440`,
        ]),
        `ExecStop=${SBIN} remove --vip 192.0.2.77,203.0.113.10,2001:db8::10,198.51.100.5`,
      ]);
      expect((await verify(h.root)).code).toBe(0);
      expect((await h.script(['check', '--vip', '203.0.113.10,2001:db8::10', '--persist'])).code).toBe(0);
      expect((await h.script(['check', '--vip', '198.51.100.5', '--persist'])).code).toBe(0);

      // Exact matches: 203.0.113.1 begins a persisted VIP and 98.51.100.5 ends one.
      expect((await h.script(['setup', '--vip', '203.0.113.1,98.51.100.5'])).code).toBe(0);
      const partial = await h.script(['check', '--vip', '203.0.113.1,98.51.100.5', '--persist']);
      expect(partial.code).toBe(1);
      expect(lines(partial.stdout)).toEqual([
        `${unitPath} does not set up VIP 203.0.113.1: run: dsrlb-realserver setup --vip 203.0.113.1,98.51.100.5 --persist`,
        `${unitPath} does not set up VIP 98.51.100.5: run: dsrlb-realserver setup --vip 203.0.113.1,98.51.100.5 --persist`,
      ]);
      expect((await h.script(['remove', '--vip', '203.0.113.1,98.51.100.5'])).code).toBe(0);

      const removed = await h.script(['remove', '--vip', '198.51.100.5', '--persist']);
      expect(removed.code).toBe(0);
      expect(removed.stdout).toContain('kept the sysctls: still set up for VIPs 203.0.113.10,2001:db8::10');
      expect(removed.stdout).toContain(`wrote ${unitPath}`);
      expect(await execLines()).toEqual([
        groupsExecStart([`${SBIN} setup --vip 192.0.2.77 --mode l2`, `${SBIN} setup --vip 203.0.113.10,2001:db8::10 --mode l2 --mss 1440`]),
        `ExecStop=${SBIN} remove --vip 192.0.2.77,203.0.113.10,2001:db8::10`,
      ]);
      expect((await h.script(['check', '--vip', '198.51.100.5', '--persist'])).stdout).toContain(`${unitPath} does not set up VIP 198.51.100.5`);

      expect((await h.script(['remove', '--vip', '203.0.113.10,2001:db8::10', '--persist'])).code).toBe(0);
      expect(await execLines()).toEqual([`ExecStart=${SBIN} setup --vip 192.0.2.77 --mode l2`, `ExecStop=${SBIN} remove --vip 192.0.2.77`]);
      const last = await h.script(['remove', '--vip', '192.0.2.77', '--persist']);
      expect(last.code).toBe(0);
      expect(last.stdout).toContain(`removed ${unitPath}`);
      expect(last.stdout).toContain(`removed ${confPath}`);
      expect(await readdir(join(h.root, 'etc/sysctl.d'))).toEqual([]);
      expect(await readdir(join(h.root, 'etc/systemd/system'))).toEqual([]);
      const missing = await h.script(['check', '--vip', '192.0.2.77', '--persist']);
      expect(missing.code).toBe(1);
      expect(missing.stdout).toContain(`${confPath} missing (setup is not persisted)`);
    });
  });

  it('remove --persist after a reboot (setup recorded no sysctl, or its record is gone) puts the ARP sysctls back to the values the file recorded from before setup, else the kernel defaults', async () => {
    await withHost('p5', async (h) => {
      const confPath = join(h.root, 'etc/sysctl.d/90-dsrlb-realserver.conf');
      const stateDir = join(h.root, 'run/dsrlb-realserver');
      const arp = async (): Promise<string[]> => {
        const out: string[] = [];
        for (const i of ['all', 'lo', 'eth0']) for (const n of ['arp_ignore', 'arp_announce']) out.push(`${i}.${n}=${await h.sysctl(i, n)}`);
        return out;
      };
      // The kernel's defaults, but for the operator's own all.arp_announce=1.
      const operator = async (): Promise<void> => {
        await h.sh('for i in all lo eth0; do echo 0 > /proc/sys/net/ipv4/conf/$i/arp_ignore; echo 0 > /proc/sys/net/ipv4/conf/$i/arp_announce; done');
        await h.sh('echo 1 > /proc/sys/net/ipv4/conf/all/arp_announce');
      };
      const before = ['all.arp_ignore=0', 'all.arp_announce=1', 'lo.arp_ignore=0', 'lo.arp_announce=0', 'eth0.arp_ignore=0', 'eth0.arp_announce=0'];
      // A reboot: /run is empty and the VIP gone; systemd-sysctl has set what the file says (the
      // values stay as setup left them).
      const reboot = async (): Promise<void> => {
        await rm(stateDir, { recursive: true, force: true });
        await h.sh(`ip addr del ${VIP}/32 dev lo`);
      };

      await operator();
      expect(await arp()).toEqual(before);
      expect((await h.script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'])).code).toBe(0);
      const conf = lines(await readFile(confPath, 'utf8'));
      expect(conf.filter((l) => l.startsWith('# before setup: '))).toEqual([
        '# before setup: net.ipv4.conf.all.arp_ignore = 0',
        '# before setup: net.ipv4.conf.all.arp_announce = 1',
        '# before setup: net.ipv4.conf.lo.arp_ignore = 0',
        '# before setup: net.ipv4.conf.lo.arp_announce = 0',
        '# before setup: net.ipv4.conf.eth0.arp_ignore = 0',
        '# before setup: net.ipv4.conf.eth0.arp_announce = 0',
      ]);
      await reboot();
      // The unit's setup at boot finds the sysctls as wanted: it records none of them.
      const boot = await h.script(['setup', '--vip', VIP, '--mode', 'l2', '--interface', 'eth0']);
      expect([boot.code, lines(boot.stdout)]).toEqual([0, [`added ${VIP}/32 on lo`, `setup ok (mode l2, VIPs ${VIP})`]]);
      // Rewritten after the reboot, the file keeps the values from before the first setup.
      expect((await h.script(['setup', '--vip', VIP, '--persist'])).code).toBe(0);
      expect(lines(await readFile(confPath, 'utf8'))).toEqual(conf);
      const removed = await h.script(['remove', '--vip', VIP, '--persist']);
      expect([removed.code, removed.stderr]).toEqual([0, '']);
      expect(lines(removed.stdout)).toEqual([
        `removed ${VIP}/32 from lo`,
        'restored net.ipv4.conf.all.arp_ignore=0',
        'restored net.ipv4.conf.all.arp_announce=1',
        'restored net.ipv4.conf.lo.arp_ignore=0',
        'restored net.ipv4.conf.lo.arp_announce=0',
        'restored net.ipv4.conf.eth0.arp_ignore=0',
        'restored net.ipv4.conf.eth0.arp_announce=0',
        `removed ${confPath}`,
        `removed ${join(h.root, 'etc/systemd/system/dsrlb-realserver.service')}`,
        'remove ok',
      ]);
      expect(await arp()).toEqual(before);
      expect(await readdir(stateDir)).toEqual([]);

      // No runtime record at all (the unit did not run at boot): the same.
      expect((await h.script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'])).code).toBe(0);
      await reboot();
      const bare = await h.script(['remove', '--vip', VIP, '--persist']);
      expect([bare.code, bare.stderr]).toEqual([0, '']);
      expect(lines(bare.stdout)).toContain('restored net.ipv4.conf.all.arp_announce=1');
      expect(await arp()).toEqual(before);
      expect(await readdir(stateDir)).toEqual([]);

      // A file that records nothing from before setup (an older version's): the kernel's defaults.
      expect((await h.script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'])).code).toBe(0);
      const text = await readFile(confPath, 'utf8');
      await writeFile(confPath, lines(text).filter((l) => !/^# (before setup|The values before)/.test(l)).join('\n') + '\n');
      await reboot();
      expect((await h.script(['remove', '--vip', VIP, '--persist'])).code).toBe(0);
      expect(await arp()).toEqual(before.map((v) => v.replace('all.arp_announce=1', 'all.arp_announce=0')));
      // A sysctl changed since (no longer the file's value) is left as it is.
      await operator();
      expect((await h.script(['setup', '--vip', VIP, '--interface', 'eth0', '--persist'])).code).toBe(0);
      await reboot();
      await h.sh('echo 2 > /proc/sys/net/ipv4/conf/lo/arp_ignore');
      const changed = await h.script(['remove', '--vip', VIP, '--persist']);
      expect(lines(changed.stdout)).not.toContain('restored net.ipv4.conf.lo.arp_ignore=0');
      expect(await arp()).toEqual(before.map((v) => v.replace('lo.arp_ignore=0', 'lo.arp_ignore=2')));
    });
  });

  it('a unit of several setup groups runs every group at boot though one fails, and fails with the worst status', async () => {
    await withHost('p3', async (h) => {
      const unitPath = join(h.root, 'etc/systemd/system/dsrlb-realserver.service');
      expect((await h.script(['setup', '--vip', VIP, '--persist'])).code).toBe(0);
      expect((await h.script(['setup', '--vip', '10.0.0.101', '--interface', 'eth0', '--persist'])).code).toBe(0);
      const exec = lines(await readFile(unitPath, 'utf8')).filter((l) => l.startsWith('Exec'));
      // One ExecStart: in a oneshot unit a failing ExecStart line skips the lines after it.
      expect(exec).toEqual([
        groupsExecStart([`${SBIN} setup --vip ${VIP} --mode l2`, `${SBIN} setup --vip 10.0.0.101 --mode l2 --interface eth0`]),
        `ExecStop=${SBIN} remove --vip ${VIP},10.0.0.101`,
      ]);
      const verified = await verify(h.root);
      expect(verified.stderr).toBe('');
      expect(verified.code).toBe(0);
      expect((await h.script(['check', '--vip', `${VIP},10.0.0.101`, '--persist'])).code).toBe(0);
      const argv = execArgv(exec[0] ?? '');
      expect(argv.slice(0, 2)).toEqual(['/bin/sh', '-c']);
      expect(argv).toHaveLength(3);
      const body = argv[2] ?? '';

      // As at boot, with the first group failing: its VIP is also on eth1 (a warning, exit 1).
      await mustRun('ip', ['-n', h.ns, 'addr', 'del', `${VIP}/32`, 'dev', 'lo']);
      await mustRun('ip', ['-n', h.ns, 'addr', 'del', '10.0.0.101/32', 'dev', 'lo']);
      await mustRun('ip', ['-n', h.ns, 'addr', 'add', `${VIP}/24`, 'dev', 'eth1']);
      const boot = await run('ip', ['netns', 'exec', h.ns, '/bin/sh', '-c', body.replaceAll(SBIN, `dash ${h.root}${SBIN}`)], { DSRLB_ROOT: h.root });
      expect(boot.stderr).toContain(`VIP ${VIP} is also on eth1`);
      expect(boot.code).toBe(1);
      const lo = await mustRun('ip', ['-n', h.ns, '-o', 'addr', 'show', 'dev', 'lo']);
      expect(lo).toContain(`${VIP}/32`);
      expect(lo).toContain('10.0.0.101/32');

      // Every group runs, and the unit's status is the worst of theirs.
      const dir = await mkdtemp(join(tmpdir(), `${PREFIX}stub-`));
      try {
        const stub = join(dir, 'dsrlb-realserver');
        const log = join(dir, 'log');
        await writeFile(stub, `#!/bin/sh\necho "$3" >> ${log}\ncase $3 in "$FAIL2") exit 2 ;; "$FAIL1") exit 1 ;; esac\n`);
        await chmod(stub, 0o755);
        for (const [env, code] of [
          [{ FAIL2: VIP, FAIL1: '10.0.0.101' }, 2],
          [{ FAIL1: VIP, FAIL2: '10.0.0.101' }, 2],
          [{ FAIL1: VIP }, 1],
          [{ FAIL1: '10.0.0.101' }, 1],
          [{}, 0],
        ] as const) {
          await rm(log, { force: true });
          const r = await run('/bin/sh', ['-c', body.replaceAll(SBIN, stub)], { FAIL1: '', FAIL2: '', ...(env as Record<string, string>) });
          expect(r.code, JSON.stringify(env)).toBe(code);
          expect(lines(await readFile(log, 'utf8')), JSON.stringify(env)).toEqual([VIP, '10.0.0.101']);
        }
      } finally {
        await rm(dir, { recursive: true, force: true });
      }

      // check --persist finds the script inside the /bin/sh command line too.
      await chmod(join(h.root, SBIN), 0o644);
      expect((await h.script(['check', '--vip', VIP, '--persist'])).stdout).toContain(
        `${unitPath} runs ${SBIN}, which is missing or not executable: run: dsrlb-realserver setup --vip ${VIP} --persist\n`,
      );
    });
  });

  it('setup --persist over the file an older version wrote (all.rp_filter = 0) writes the tunnels\' rp_filter 2 alone and puts all back at once, and remove --persist puts tunl0 back, to the values that file recorded', async () => {
    await withHost('p4', async (h) => {
      const confPath = join(h.root, 'etc/sysctl.d/90-dsrlb-realserver.conf');
      await standIn(h, 'tunl0');
      // After a reboot with the older file: no state, the VIP gone, all and tunl0 as the file set them.
      await mkdir(join(h.root, 'etc/sysctl.d'), { recursive: true });
      await writeFile(
        confPath,
        [
          '# Written by dsrlb-realserver setup --persist: ARP hiding for the DSR VIPs on lo, and rp_filter off for ipip.',
          'net.ipv4.conf.all.rp_filter = 0',
          'net.ipv4.conf.tunl0.rp_filter = 0',
          'net.ipv4.conf.ip6tnl0.rp_filter = 0',
          '# The values before setup, which remove --persist puts back where they are still as set here:',
          '# before setup: net.ipv4.conf.all.rp_filter = 1',
          '# before setup: net.ipv4.conf.tunl0.rp_filter = 1',
          '',
        ].join('\n'),
      );
      await h.sh('echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && echo 0 > /proc/sys/net/ipv4/conf/tunl0/rp_filter');
      const setup = await h.script(['setup', '--vip', VIP, '--mode', 'ipip', '--persist']);
      expect([setup.code, setup.stderr]).toEqual([0, '']);
      const conf = lines(await readFile(confPath, 'utf8'));
      expect(conf.filter((l) => /^(net\.|# before setup: ).*rp_filter/.test(l))).toEqual([
        'net.ipv4.conf.tunl0.rp_filter = 2',
        'net.ipv4.conf.ip6tnl0.rp_filter = 2',
        '# before setup: net.ipv4.conf.tunl0.rp_filter = 1',
      ]);
      // all goes back at once to the value the file recorded (nothing needs it at 0); tunl0's record keeps the operator's value.
      expect(lines(setup.stdout)).toContain("restored net.ipv4.conf.all.rp_filter=1 (an earlier setup set it to 0; the tunnel devices' own loose rp_filter replaces it)");
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      const state = await h.state();
      expect(state).toContain('sysctl tunl0 rp_filter 1 2\n');
      expect(state).not.toContain('sysctl all rp_filter');
      expect((await h.script(['check', '--vip', VIP, '--persist'])).code).toBe(0);
      const removed = await h.script(['remove', '--vip', VIP, '--persist']);
      expect([removed.code, removed.stderr]).toEqual([0, '']);
      expect(lines(removed.stdout)).toEqual(expect.arrayContaining([`removed ${DUMMY}/32 from tunl0`, 'restored net.ipv4.conf.tunl0.rp_filter=1', `removed ${confPath}`]));
      expect(removed.stdout).not.toContain('conf.all.rp_filter');
      expect(await h.sysctl('all', 'rp_filter')).toBe('1');
      expect(await h.sysctl('tunl0', 'rp_filter')).toBe('1');
    });
  });

  it('ipip on a kernel without ipip: writes decap-IF.env and makes the unit want and follow dsrlb-decap@IF.service', async () => {
    await withHost('p2', async (h) => {
      await routed(h);
      // A path that carries a 1500-byte client packet plus the outer header: no MSS clamp needed.
      await h.sh('ip link set eth0 mtu 1540');
      const unitPath = join(h.root, 'etc/systemd/system/dsrlb-realserver.service');
      const envPath = join(h.root, 'etc/dsrlb/decap-eth0.env');
      // No decap running and its unit not installed: live setup and boot would both fail.
      const first = await h.script(['setup', '--vip', `${VIP},${VIP6}`, '--mode', 'ipip', '--persist']);
      expect(first.code).toBe(2);
      expect(first.stderr).toContain(
        'dsrlb-realserver: dsrlb-decap@.service is not installed (deploy/linux/install.sh installs it with dsrlb): until it is, dsrlb-realserver.service fails at boot\n',
      );
      expect(lines(await readFile(envPath, 'utf8')).filter((l) => !l.startsWith('#'))).toEqual([`VIPS=${VIP},${VIP6}`]);
      const unit = await readFile(unitPath, 'utf8');
      expect(unit).toContain('After=network-pre.target systemd-sysctl.service dsrlb-decap@eth0.service\n');
      expect(unit).toContain('Wants=network-pre.target dsrlb-decap@eth0.service\n');
      expect(unit).toContain(`ExecStart=${SBIN} setup --vip ${VIP},${VIP6} --mode ipip\n`);
      // The kernel tunnels' own rp_filter, loose (setup at boot adds the dummy address); never all, nor decap's TUN.
      expect(lines(await readFile(join(h.root, 'etc/sysctl.d/90-dsrlb-realserver.conf'), 'utf8')).filter((l) => l.startsWith('net.') && l.includes('rp_filter'))).toEqual([
        'net.ipv4.conf.tunl0.rp_filter = 2',
        'net.ipv4.conf.ip6tnl0.rp_filter = 2',
      ]);
      const check = await h.script(['check', '--vip', `${VIP},${VIP6}`, '--persist']);
      expect(check.stdout).toContain(`${unitPath} wants dsrlb-decap@eth0.service, but dsrlb-decap@.service is not installed`);

      // With the unit installed and decap running, both pass; the mode comes from the record.
      await copyFile(DECAP_UNIT, join(h.root, 'etc/systemd/system/dsrlb-decap@.service'));
      await standIn(h, 'dsrlb-decap0');
      const second = await h.script(['setup', '--vip', VIP, '--persist']);
      expect(second.stderr).toBe('');
      expect(second.code).toBe(0);
      expect((await h.script(['check', '--vip', `${VIP},${VIP6}`, '--persist'])).code).toBe(0);

      // A decap-IF.env the operator wrote is left alone, and what it lacks is reported.
      await writeFile(envPath, `VIPS=${VIP}\n`);
      const own = await h.script(['check', '--vip', `${VIP},${VIP6}`, '--persist']);
      expect(own.stdout).toBe(`${envPath} does not list ${VIP6} in VIPS= (dsrlb decap would drop its packets): run: dsrlb-realserver setup --vip ${VIP},${VIP6} --persist\n`);
      const kept = await h.script(['setup', '--vip', VIP6, '--persist']);
      expect(kept.code).toBe(2);
      expect(kept.stderr).toContain(`${envPath} (not written by dsrlb-realserver) does not list ${VIP6} in VIPS=`);
      expect(await readFile(envPath, 'utf8')).toBe(`VIPS=${VIP}\n`);
      await rm(envPath);

      // remove --persist takes the VIP out of the env file, and the env file out with the last one.
      expect((await h.script(['setup', '--vip', VIP6, '--persist'])).code).toBe(0);
      expect((await h.script(['remove', '--vip', VIP6, '--persist'])).code).toBe(0);
      expect(lines(await readFile(envPath, 'utf8')).filter((l) => !l.startsWith('#'))).toEqual([`VIPS=${VIP}`]);
      const last = await h.script(['remove', '--vip', VIP, '--persist']);
      expect(last.code).toBe(0);
      expect(last.stdout).toContain(`removed ${envPath}`);
      expect((await readdir(join(h.root, 'etc/systemd/system'))).sort()).toEqual(['dsrlb-decap@.service']);
    });
  });

  it('names the decap unit of an interface with a dash as systemd does (br\\x2dlan), so it binds to the device, and reads br-lan\'s env file back', async () => {
    await withHost('p3', async (h) => {
      await h.sh('ip link set eth0 name br-lan');
      await h.sh('ip link set br-lan up && ip link set eth1 up && ip addr add 192.0.2.2/24 dev br-lan && ip route add default via 192.0.2.1 && ip link set br-lan mtu 1540');
      await mkdir(join(h.root, 'etc/systemd/system'), { recursive: true });
      await copyFile(DECAP_UNIT, join(h.root, 'etc/systemd/system/dsrlb-decap@.service'));
      await standIn(h, 'dsrlb-decap0');
      const setup = await h.script(['setup', '--vip', VIP, '--mode', 'ipip', '--interface', 'br-lan', '--persist']);
      expect(setup.stderr).toBe('');
      expect(setup.code).toBe(0);
      const unit = await readFile(join(h.root, 'etc/systemd/system/dsrlb-realserver.service'), 'utf8');
      expect(unit).toContain('Wants=network-pre.target dsrlb-decap@br\\x2dlan.service\n');
      expect(lines(await readFile(join(h.root, 'etc/dsrlb/decap-br-lan.env'), 'utf8')).filter((l) => !l.startsWith('#'))).toEqual([`VIPS=${VIP}`]);
      expect((await h.script(['check', '--vip', VIP, '--persist'])).code).toBe(0);
      // The template turns the instance back into the interface name: %I, not %i.
      const template = await readFile(DECAP_UNIT, 'utf8');
      expect(template).toContain('ExecStart=/usr/local/bin/dsrlb decap --interface %I ');
      expect(template).toContain('EnvironmentFile=/etc/dsrlb/decap-%I.env\n');
      expect(template).toContain('BindsTo=sys-subsystem-net-devices-%i.device\n');
    });
  });
});
