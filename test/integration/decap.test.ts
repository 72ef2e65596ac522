// `dsrlb decap` on real veths in network namespaces: a sender namespace tunnels its traffic for the
// VIPs to the real (test/support/ipip-sender.mjs, a minimal tunnelling LB), the real decapsulates
// in user space and answers directly. Covers 4in4, 6in6, 4in6 and 6in4, outer packets fragmented
// on the way, the outer IPv6 header's ECN carried inside, refusal of inner packets to non-VIPs,
// exit codes, undo on exit, strict rp_filter host-wide left as it is (the TUN device carries the
// IPv4 VIPs and loose rp_filter of its own), and the record an earlier decap killed without undoing
// left put back at start.
// Needs root and `ip netns`; fails otherwise.
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteNamespace } from '../../src/lab/netns-lab.js';

const execFileAsync = promisify(execFile);
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const decapEntry = join(repoRoot, 'test', 'support', 'run-decap.mjs');
const senderEntry = join(repoRoot, 'test', 'support', 'ipip-sender.mjs');
const realserverScript = join(repoRoot, 'deploy', 'linux', 'dsrlb-realserver');
const addonPath = join(repoRoot, 'native', 'build', 'Release', 'dsrlb_native.node');

const PREFIX = `dsrt-dc-${process.pid}-`;
const NS = { sender: `${PREFIX}a`, real: `${PREFIX}r` };
const STATE_DIR = join(tmpdir(), `${PREFIX}state`);
// Created inside the namespaces, so short names cannot collide with anyone's.
const SENDER_IF = 'a0';
const REAL_IF = 'r0';
const SENDER_TUN = 'dca0';
const REAL_TUN = 'dcr0';
const SENDER4 = '10.88.0.1';
const REAL4 = '10.88.0.2';
const SENDER6 = 'fd88::1';
const REAL6 = 'fd88::2';
const VIP4 = '10.99.0.10'; // reached 4in4
const VIP4_OVER6 = '10.99.0.11'; // reached 4in6
const VIP6 = 'fd99::10'; // reached 6in6
const VIP6_OVER4 = 'fd99::11'; // reached 6in4
// Reached 4in6 and 6in6 with the outer traffic class CE, as if congested between LB and real.
const VIP4_CE = '10.99.0.12';
const VIP6_CE = 'fd99::12';
const VIPS = [VIP4, VIP4_OVER6, VIP6, VIP6_OVER4, VIP4_CE, VIP6_CE];
// Local addresses of the real that are not VIPs: decap must not deliver to them.
const OTHER4 = '10.66.0.7';
const OTHER6 = 'fd66::7';
const UDP_PORT = 9000;
const LARGE_BYTES = 3000;
const NON_VIP_DATAGRAMS = 5;
/** Not-ECT pings sent under an outer CE mark: decap drops them (RFC 6040). */
const CE_ON_NOT_ECT = 2;

interface RunningProcess {
  child: ChildProcess;
  lines: string[];
  stderr: string[];
  exit: Promise<number | null>;
}

const running: RunningProcess[] = [];

function ip(...args: string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8' });
}

function inNs(ns: string, command: string, args: string[], env?: NodeJS.ProcessEnv): string {
  return execFileSync('ip', ['netns', 'exec', ns, command, ...args], { encoding: 'utf8', env: env ?? process.env });
}

async function inNsAsync(ns: string, command: string, args: string[], timeoutMs = 20_000): Promise<string> {
  const { stdout } = await execFileAsync('ip', ['netns', 'exec', ns, command, ...args], { encoding: 'utf8', timeout: timeoutMs });
  return stdout;
}

/** Starts a process in a namespace; with `readyWhen`, waits for a stdout line it accepts. */
async function startInNs(ns: string, args: string[], readyWhen?: (line: string) => boolean, timeoutMs = 15_000): Promise<RunningProcess> {
  const child = spawn('ip', ['netns', 'exec', ns, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exit = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const proc: RunningProcess = { child, lines: [], stderr: [], exit };
  running.push(proc);
  let buffered = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    buffered += chunk;
    const parts = buffered.split('\n');
    buffered = parts.pop()!;
    proc.lines.push(...parts.filter((line) => line.length > 0));
  });
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => proc.stderr.push(chunk));
  if (readyWhen === undefined) return proc;
  const started = Date.now();
  while (!proc.lines.some(readyWhen)) {
    if (child.exitCode !== null || Date.now() - started > timeoutMs) {
      throw new Error(`${args.join(' ')} in ${ns} did not start: ${proc.lines.join('\n')} ${proc.stderr.join('')}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return proc;
}

function jsonLines(proc: RunningProcess): Record<string, unknown>[] {
  return proc.lines.flatMap((line) => {
    try {
      return [JSON.parse(line) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
}

/** A counter from /proc/net/snmp ("Ip", "ReasmOKs") or /proc/net/snmp6 ("Ip6ReasmOKs"), read in `ns`. */
function snmp(ns: string, proto: string, name: string): number {
  const lines = inNs(ns, 'cat', ['/proc/net/snmp']).split('\n');
  const [header, values] = lines.filter((line) => line.startsWith(`${proto}:`));
  return Number(values!.split(/\s+/)[header!.split(/\s+/).indexOf(name)]);
}

/** A counter of /proc/net/netstat (IpExt, TcpExt), laid out as /proc/net/snmp. */
function netstat(ns: string, proto: string, name: string): number {
  const lines = inNs(ns, 'cat', ['/proc/net/netstat']).split('\n');
  const [header, values] = lines.filter((line) => line.startsWith(`${proto}:`));
  return Number(values!.split(/\s+/)[header!.split(/\s+/).indexOf(name)]);
}

function snmp6(ns: string, name: string): number {
  const line = inNs(ns, 'cat', ['/proc/net/snmp6']).split('\n').find((l) => l.split(/\s+/)[0] === name);
  return Number(line!.split(/\s+/)[1]);
}

/** The named nftables counters of the sender's table, in packets. */
function senderCounters(): Record<string, number> {
  const listed = JSON.parse(inNs(NS.sender, 'nft', ['-j', 'list', 'counters', 'table', 'inet', 'dsrt_dc'])) as {
    nftables: { counter?: { name: string; packets: number } }[];
  };
  return Object.fromEntries(listed.nftables.flatMap((o) => (o.counter ? [[o.counter.name, o.counter.packets]] : [])));
}

// The real's services: HTTP on every VIP naming the VIP and the client address it saw, a UDP
// service answering with the size and hash of each datagram, and UDP listeners on the non-VIP
// addresses that only count (they would answer nothing either way).
const serverScript = `
import dgram from 'node:dgram'; import http from 'node:http'; import { createHash } from 'node:crypto';
const vips = ${JSON.stringify(VIPS)};
let listening = 0; const want = vips.length * 2 + 2;
const ready = () => { if (++listening === want) console.log(JSON.stringify({ ready: true })); };
let nonVipReceived = 0; let udpReceived = 0;
for (const vip of vips) {
  http.createServer((req, res) => res.end(JSON.stringify({ vip, client: req.socket.remoteAddress })))
    .listen(80, vip, ready);
  const udp = dgram.createSocket(vip.includes(':') ? 'udp6' : 'udp4');
  udp.on('message', (msg, rinfo) => {
    udpReceived++;
    const answer = JSON.stringify({ vip, bytes: msg.length, sha256: createHash('sha256').update(msg).digest('hex') });
    udp.send(answer, rinfo.port, rinfo.address);
  });
  udp.bind(${UDP_PORT}, vip, ready);
}
for (const other of ['${OTHER4}', '${OTHER6}']) {
  const udp = dgram.createSocket(other.includes(':') ? 'udp6' : 'udp4');
  udp.on('message', () => { nonVipReceived++; console.log(JSON.stringify({ nonVip: other })); });
  udp.bind(${UDP_PORT}, other, ready);
}
process.on('SIGTERM', () => process.stdout.write(JSON.stringify({ udpReceived, nonVipReceived }) + '\\n', () => process.exit(0)));
`;

/** Sends `count` datagrams of `size` pattern bytes to target, one at a time; reports the answers. */
function udpClientScript(target: string, size: number, count: number, timeoutMs: number): string {
  return `
import dgram from 'node:dgram'; import { createHash } from 'node:crypto';
const socket = dgram.createSocket('${target.includes(':') ? 'udp6' : 'udp4'}');
await new Promise((r) => socket.bind(0, r));
const payload = Buffer.alloc(${size}); for (let i = 0; i < payload.length; i++) payload[i] = (i * 31 + 7) & 0xff;
const answers = [];
for (let i = 0; i < ${count}; i++) {
  const answer = await new Promise((resolve) => {
    const timer = setTimeout(() => { socket.off('message', onMessage); resolve(null); }, ${timeoutMs});
    function onMessage(msg) { clearTimeout(timer); socket.off('message', onMessage); resolve(JSON.parse(msg.toString())); }
    socket.on('message', onMessage);
    socket.send(payload, ${UDP_PORT}, '${target}');
  });
  if (answer) answers.push(answer);
}
socket.close();
console.log(JSON.stringify({ sent: ${count}, sha256: createHash('sha256').update(payload).digest('hex'), answers }));
`;
}

async function udpExchange(target: string, size: number, count: number, timeoutMs: number) {
  const output = await inNsAsync(NS.sender, 'node', ['--input-type=module', '-e', udpClientScript(target, size, count, timeoutMs)]);
  return JSON.parse(output) as { sent: number; sha256: string; answers: { vip: string; bytes: number; sha256: string }[] };
}

async function httpGet(vip: string): Promise<{ vip: string; client: string }> {
  const url = vip.includes(':') ? `http://[${vip}]/` : `http://${vip}/`;
  return JSON.parse(await inNsAsync(NS.sender, 'curl', ['-sS', '--max-time', '5', url])) as { vip: string; client: string };
}

describe('dsrlb decap (namespaces)', () => {
  let decap: RunningProcess;
  let server: RunningProcess;
  let sender: RunningProcess;
  let icmpBefore: { unreachable: number; parameterProblems: number };
  let rpFilterBefore: string;

  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('decap.test.ts needs root (network namespaces, TUN, raw sockets)');
    if (!existsSync(addonPath)) throw new Error(`native addon missing at ${addonPath}: run npm run build:native`);
    for (const ns of Object.values(NS)) ip('netns', 'add', ns);
    ip('link', 'add', SENDER_IF, 'netns', NS.sender, 'type', 'veth', 'peer', 'name', REAL_IF, 'netns', NS.real);
    for (const [ns, ifname, v4, v6] of [
      [NS.sender, SENDER_IF, SENDER4, SENDER6],
      [NS.real, REAL_IF, REAL4, REAL6],
    ] as const) {
      ip('-n', ns, 'link', 'set', 'lo', 'up');
      ip('-n', ns, 'addr', 'add', `${v4}/24`, 'dev', ifname);
      ip('-n', ns, '-6', 'addr', 'add', `${v6}/64`, 'dev', ifname, 'nodad');
      ip('-n', ns, 'link', 'set', ifname, 'up'); // MTU 1500: larger outer packets get fragmented
    }
    // Answers come from the VIPs, which the sender routes into its tunnel: strict rp_filter would drop them.
    inNs(NS.sender, 'sysctl', ['-qw', 'net.ipv4.conf.all.rp_filter=0', `net.ipv4.conf.${SENDER_IF}.rp_filter=0`]);
    // Strict on the real (a CIS-hardened host): decap must work without changing it.
    inNs(NS.real, 'sysctl', ['-qw', 'net.ipv4.conf.all.rp_filter=1']);
    rpFilterBefore = inNs(NS.real, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim();
    inNs(NS.real, realserverScript, ['setup', '--vip', VIPS.join(',')], { ...process.env, DSRLB_STATE_DIR: STATE_DIR });
    ip('-n', NS.real, 'addr', 'add', `${OTHER4}/32`, 'dev', 'lo');
    ip('-n', NS.real, '-6', 'addr', 'add', `${OTHER6}/128`, 'dev', 'lo', 'nodad');
    // What reaches the sender from the real: plain TCP from the VIPs, or (never) tunnel packets.
    execFileSync('ip', ['netns', 'exec', NS.sender, 'nft', '-f', '-'], {
      input: `table inet dsrt_dc {
  counter direct_tcp4 {}
  counter direct_tcp6 {}
  counter tunnel_in {}
  chain pre {
    type filter hook prerouting priority 0; policy accept;
    iifname "${SENDER_IF}" ip saddr 10.99.0.0/24 tcp sport 80 counter name direct_tcp4
    iifname "${SENDER_IF}" ip6 saddr fd99::/64 tcp sport 80 counter name direct_tcp6
    iifname "${SENDER_IF}" meta l4proto { 4, 41 } counter name tunnel_in
  }
}
`,
    });

    server = await startInNs(NS.real, ['node', '--input-type=module', '-e', serverScript], (l) => l.includes('"ready"'));
    decap = await startInNs(
      NS.real,
      ['node', decapEntry, '--interface', REAL_IF, '--vip', VIPS.join(','), '--tun', REAL_TUN],
      (l) => l.includes('"decap running"'),
    );
    sender = await startInNs(
      NS.sender,
      [
        'node', senderEntry, '--tun', SENDER_TUN, '--mtu', '9000', '--outer4', REAL4, '--outer6', REAL6,
        '--map', `${VIP4_OVER6}=${REAL6}`, '--map', `${VIP6_OVER4}=${REAL4}`,
        '--map', `${VIP4_CE}=${REAL6}`, '--outer-tclass', `${VIP4_CE}=3`, '--outer-tclass', `${VIP6_CE}=3`,
      ],
      (l) => l.includes('"ready"'),
    );
    for (const address of [VIP4, VIP4_OVER6, VIP4_CE, OTHER4]) ip('-n', NS.sender, 'route', 'add', `${address}/32`, 'dev', SENDER_TUN, 'src', SENDER4);
    for (const address of [VIP6, VIP6_OVER4, VIP6_CE, OTHER6]) {
      ip('-n', NS.sender, '-6', 'route', 'add', `${address}/128`, 'dev', SENDER_TUN, 'src', SENDER6);
    }
    icmpBefore = {
      unreachable: snmp(NS.sender, 'Icmp', 'InDestUnreachs'),
      parameterProblems: snmp6(NS.sender, 'Icmp6InParmProblems'),
    };
  });

  afterAll(async () => {
    for (const proc of running) if (proc.child.exitCode === null) proc.child.kill('SIGKILL');
    await Promise.all(running.map((p) => p.exit));
    for (const ns of Object.values(NS)) await deleteNamespace(ns);
    rmSync(STATE_DIR, { recursive: true, force: true });
  });

  it('carries an HTTP GET to an IPv4 VIP inside IPIP, and the answer comes back directly as plain IP from the VIP', async () => {
    const before = senderCounters();
    const reply = await httpGet(VIP4);
    expect(reply).toEqual({ vip: VIP4, client: SENDER4 });
    const after = senderCounters();
    // SYN-ACK, data, FIN at least; and nothing from the real arrived tunnelled.
    expect(after.direct_tcp4! - before.direct_tcp4!).toBeGreaterThanOrEqual(3);
    expect(after.tunnel_in).toBe(0);
  });

  it('carries an HTTP GET to an IPv6 VIP inside IPv6-in-IPv6', async () => {
    const before = senderCounters();
    expect(await httpGet(VIP6)).toEqual({ vip: VIP6, client: SENDER6 });
    expect(senderCounters().direct_tcp6! - before.direct_tcp6!).toBeGreaterThanOrEqual(3);
  });

  it('carries IPv4-in-IPv6 and IPv6-in-IPv4 too', async () => {
    expect(await httpGet(VIP4_OVER6)).toEqual({ vip: VIP4_OVER6, client: SENDER4 });
    expect(await httpGet(VIP6_OVER4)).toEqual({ vip: VIP6_OVER4, client: SENDER6 });
    expect(senderCounters().tunnel_in).toBe(0);
  });

  it('delivers 3000-byte datagrams whose outer packets were fragmented on the 1500-byte path, reassembled', async () => {
    const reasm4 = snmp(NS.real, 'Ip', 'ReasmOKs');
    const reasm6 = snmp6(NS.real, 'Ip6ReasmOKs');
    for (const vip of [VIP4, VIP6]) {
      const result = await udpExchange(vip, LARGE_BYTES, 3, 2000);
      expect(result.answers).toEqual([1, 2, 3].map(() => ({ vip, bytes: LARGE_BYTES, sha256: result.sha256 })));
    }
    // Each 3000-byte datagram crossed as one fragmented outer packet that the real's kernel
    // reassembled before the raw socket read it (decap itself never sees a fragment).
    expect(snmp(NS.real, 'Ip', 'ReasmOKs') - reasm4).toBe(3);
    expect(snmp6(NS.real, 'Ip6ReasmOKs') - reasm6).toBe(3);
  });

  it('drops and counts inner packets to local addresses that are not VIPs', async () => {
    for (const other of [OTHER4, OTHER6]) {
      const result = await udpExchange(other, 100, NON_VIP_DATAGRAMS, 200);
      expect(result.answers).toEqual([]);
    }
    // The same path still works for a VIP right after.
    expect((await udpExchange(VIP4, 100, 1, 2000)).answers).toHaveLength(1);
    expect(server.lines.filter((l) => l.includes('"nonVip"'))).toEqual([]);
  });

  it('refuses bad VIPs (exit 1, each named) and a second decap in the namespace (exit 2), changing nothing', async () => {
    const bad = await startInNs(NS.real, ['node', decapEntry, '--vip', `${VIP4},10.99.0.300,224.0.0.1`, '--tun', 'dcx0']);
    expect(await bad.exit).toBe(1);
    expect(bad.stderr.join('').trim().split('\n')).toEqual([
      'dsrlb decap: --vip: "10.99.0.300" is not an IPv4 or IPv6 address',
      'dsrlb decap: --vip: "224.0.0.1" is a multicast address; a VIP must be a unicast address reachable on the network',
    ]);
    // Two decapsulators would both deliver every packet: a second one is refused, whatever its TUN.
    for (const tun of [REAL_TUN, 'dcx1']) {
      const busy = await startInNs(NS.real, ['node', decapEntry, '--vip', VIP4, '--tun', tun]);
      expect(await busy.exit).toBe(2);
      expect(busy.stderr.join('').trim()).toBe('dsrlb decap: another dsrlb decap is running in this network namespace (two would deliver every tunnelled packet twice): stop it first');
    }
    expect(ip('-n', NS.real, '-o', 'link', 'show')).not.toContain('dcx1');
    // The running decapsulator's device and sysctls are untouched; all.rp_filter is the operator's strict 1.
    expect(inNs(NS.real, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe('1');
    expect((await httpGet(VIP4)).vip).toBe(VIP4);
  });

  it('answers SIGHUP with its counters and keeps running (it has nothing to reload)', async () => {
    decap.child.kill('SIGHUP');
    const deadline = Date.now() + 5000;
    while (!jsonLines(decap).some((l) => String(l.msg).startsWith('SIGHUP')) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const hup = jsonLines(decap).find((l) => String(l.msg).startsWith('SIGHUP'));
    expect(hup?.counters).toMatchObject({ dropped: { notVip: NON_VIP_DATAGRAMS * 2 } });
    expect(decap.child.exitCode).toBeNull();
    expect((await httpGet(VIP4)).vip).toBe(VIP4);
  });

  it('carries the CE mark of an outer IPv6 header into the inner packet, and drops CE over a packet that is not ECN-capable (RFC 6040)', async () => {
    // ECT(0) pings (-Q 2): each echo request reaches the real marked CE, and is answered.
    const ce4 = netstat(NS.real, 'IpExt', 'InCEPkts');
    await inNsAsync(NS.sender, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', '-Q', '2', VIP4_CE]);
    expect(netstat(NS.real, 'IpExt', 'InCEPkts') - ce4).toBe(3);
    // 6in6: the real's kernel counts the outer headers (CE) and the inner ones (CE only if carried).
    const ce6 = snmp6(NS.real, 'Ip6InCEPkts');
    await inNsAsync(NS.sender, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', '-Q', '2', VIP6_CE]);
    expect(snmp6(NS.real, 'Ip6InCEPkts') - ce6).toBe(6);
    // Not-ECT pings under an outer CE: dropped by decap (the congestion cannot be signalled).
    await expect(inNsAsync(NS.sender, 'ping', ['-c', String(CE_ON_NOT_ECT), '-i', '0.2', '-W', '1', '-Q', '0', VIP4_CE])).rejects.toThrow();
    const hups = () => jsonLines(decap).filter((l) => String(l.msg).startsWith('SIGHUP'));
    const before = hups().length;
    decap.child.kill('SIGHUP');
    const deadline = Date.now() + 5000;
    while (hups().length === before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(hups().at(-1)?.counters).toMatchObject({ dropped: { ceOnNotEct: CE_ON_NOT_ECT } });
  });

  it("takes IPv4 VIPs on a host with strict rp_filter because the TUN device has an address: without one there, reverse-path filtering drops every packet", async () => {
    await inNsAsync(NS.sender, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', VIP4]);
    // The control: the dummy address off the device.
    ip('-n', NS.real, 'addr', 'del', '192.0.0.8/32', 'dev', REAL_TUN);
    try {
      const dropped = netstat(NS.real, 'TcpExt', 'IPReversePathFilter');
      await expect(inNsAsync(NS.sender, 'ping', ['-c', '2', '-i', '0.2', '-W', '1', VIP4])).rejects.toThrow();
      expect(netstat(NS.real, 'TcpExt', 'IPReversePathFilter') - dropped).toBe(2);
    } finally {
      ip('-n', NS.real, 'addr', 'add', '192.0.0.8/32', 'dev', REAL_TUN, 'scope', 'host');
    }
    await inNsAsync(NS.sender, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', VIP4]);
  });

  it('lets no ICMP protocol-unreachable or parameter problem reach the sender', () => {
    expect(snmp(NS.sender, 'Icmp', 'InDestUnreachs')).toBe(icmpBefore.unreachable);
    expect(snmp6(NS.sender, 'Icmp6InParmProblems')).toBe(icmpBefore.parameterProblems);
  });

  it('stops on SIGTERM with exit 0, logs its counters and undoes what it changed', async () => {
    const link = JSON.parse(ip('-n', NS.real, '-j', 'link', 'show', REAL_TUN)) as { flags: string[] }[];
    expect(link[0]!.flags).toContain('UP');
    // Loose on the TUN device, which holds the IPv4 dummy address (scope host): max(all 1, dev 2) is
    // loose, which passes on a device with an address; all.rp_filter stays the operator's.
    expect(inNs(NS.real, 'sysctl', ['-n', `net.ipv4.conf.${REAL_TUN}.rp_filter`]).trim()).toBe('2');
    expect(inNs(NS.real, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe('1');
    const addresses = JSON.parse(ip('-n', NS.real, '-j', 'addr', 'show', 'dev', REAL_TUN)) as { addr_info: { family: string; local: string; prefixlen: number; scope: string }[] }[];
    expect(addresses[0]!.addr_info.filter((a) => a.family === 'inet').map((a) => `${a.local}/${a.prefixlen} ${a.scope}`)).toEqual(['192.0.0.8/32 host']);

    decap.child.kill('SIGTERM');
    expect(await decap.exit).toBe(0);
    const stopped = jsonLines(decap).find((l) => l.msg === 'decap stopped');
    const counters = stopped?.counters as Record<string, unknown>;
    console.log('decap counters:', JSON.stringify(counters));
    expect(counters).toMatchObject({
      dropped: { notVip: NON_VIP_DATAGRAMS * 2, ceOnNotEct: CE_ON_NOT_ECT },
      lastTunWriteErrno: 0,
    });
    const n = counters as { receivedIpv4Outer: number; receivedIpv6Outer: number; decapsulatedIpv4: number; decapsulatedIpv6: number };
    // Every tunnel packet received was either delivered or a counted drop (non-VIP, CE over Not-ECT).
    expect(n.receivedIpv4Outer + n.receivedIpv6Outer).toBe(n.decapsulatedIpv4 + n.decapsulatedIpv6 + NON_VIP_DATAGRAMS * 2 + CE_ON_NOT_ECT);
    expect(n.decapsulatedIpv4).toBeGreaterThan(0);
    expect(n.decapsulatedIpv6).toBeGreaterThan(0);
    expect(decap.stderr.join('')).toBe('');

    expect(ip('-n', NS.real, '-o', 'link', 'show')).not.toContain(REAL_TUN);
    expect(inNs(NS.real, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe(rpFilterBefore);
    // With no raw socket open, the real's kernel refuses the tunnel again (what the earlier ICMP
    // check would have seen had decap let one through).
    const unreachableBefore = snmp(NS.sender, 'Icmp', 'InDestUnreachs');
    expect((await udpExchange(VIP4, 100, 1, 300)).answers).toEqual([]);
    expect(snmp(NS.sender, 'Icmp', 'InDestUnreachs')).toBe(unreachableBefore + 1);
  });

  it('with --allow-source, takes tunnel packets from those outer sources only, and counts the rest', async () => {
    const bad = await startInNs(NS.real, ['node', decapEntry, '--vip', VIP4, '--tun', 'dcx0', '--allow-source', '10.0.0.0/33']);
    expect(await bad.exit).toBe(1);
    expect(bad.stderr.join('').trim()).toBe('dsrlb decap: --allow-source: "10.0.0.0/33" is not an address or CIDR prefix (e.g. 192.0.2.0/24, 2001:db8::/64)');
    // The IPv4 sender's address allowed, no IPv6 source: IPv4 outer packets pass, IPv6 ones do not.
    const filtered = await startInNs(
      NS.real,
      ['node', decapEntry, '--interface', REAL_IF, '--vip', VIPS.join(','), '--tun', REAL_TUN, '--allow-source', `${SENDER4}/32,192.0.2.0/24`],
      (l) => l.includes('"decap running"'),
    );
    expect(await httpGet(VIP4)).toEqual({ vip: VIP4, client: SENDER4 });
    expect((await udpExchange(VIP6, 100, 3, 300)).answers).toEqual([]);
    filtered.child.kill('SIGTERM');
    expect(await filtered.exit).toBe(0);
    const counters = jsonLines(filtered).find((l) => l.msg === 'decap stopped')?.counters as { dropped: Record<string, number>; decapsulatedIpv4: number; decapsulatedIpv6: number };
    expect(counters.dropped.sourceNotAllowed).toBeGreaterThanOrEqual(3);
    expect(counters.decapsulatedIpv4).toBeGreaterThan(0);
    expect(counters.decapsulatedIpv6).toBe(0);
    const report = JSON.parse(await stopLast(server)) as { udpReceived: number; nonVipReceived: number };
    expect(report.nonVipReceived).toBe(0);
    const senderReport = JSON.parse(await stopLast(sender)) as { counters: { sendErrors: number } };
    expect(senderReport.counters.sendErrors).toBe(0);
  });
});

describe('dsrlb decap from the CLI (namespace)', () => {
  const ns = `${PREFIX}cli`;
  afterAll(async () => {
    await deleteNamespace(ns);
  });

  it('keeps running when its log reader goes away, and removes its device at SIGTERM as ever', async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (a network namespace, TUN, raw sockets)');
    ip('netns', 'add', ns);
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    inNs(ns, 'sysctl', ['-qw', 'net.ipv4.conf.all.rp_filter=1']);
    const proc = await startInNs(ns, ['node', join(repoRoot, 'bin', 'dsrlb.js'), 'decap', '--vip', VIP4, '--tun', 'dcl0'], (l) => l.includes('"decap running"'));
    expect(inNs(ns, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe('1');
    expect(inNs(ns, 'sysctl', ['-n', 'net.ipv4.conf.dcl0.rp_filter']).trim()).toBe('2');
    // The reader leaves; the next log line (SIGHUP: the counters) meets a closed pipe (EPIPE).
    proc.child.stdout!.destroy();
    proc.child.kill('SIGHUP');
    await new Promise((r) => setTimeout(r, 1000));
    expect(proc.child.exitCode).toBeNull();
    expect(ip('-n', ns, '-o', 'link', 'show')).toContain('dcl0');
    proc.child.kill('SIGTERM');
    expect(await proc.exit).toBe(0);
    expect(proc.stderr.join('')).toBe('');
    expect(ip('-n', ns, '-o', 'link', 'show')).not.toContain('dcl0');
    expect(inNs(ns, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe('1');
  });

  it('stops with exit 2 when its TUN device is deleted under it', async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (a network namespace, TUN, raw sockets)');
    const proc = await startInNs(ns, ['node', join(repoRoot, 'bin', 'dsrlb.js'), 'decap', '--vip', VIP4, '--tun', 'dcl1'], (l) => l.includes('"decap running"'));
    ip('-n', ns, 'link', 'del', 'dcl1');
    const code = await Promise.race([proc.exit, new Promise((r) => setTimeout(() => r('still running'), 5000))]);
    expect(code).toBe(2);
    expect(jsonLines(proc).some((l) => l.level === 'error' && String(l.msg).startsWith('the TUN device is gone'))).toBe(true);
    expect(inNs(ns, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim()).toBe('1');
  });
});

describe('dsrlb decap killed (namespace)', () => {
  const ns = `${PREFIX}kill`;
  /** Where an earlier decap kept its record, named by the network namespace's inode as the daemon's. */
  let recordPath = '';
  afterAll(async () => {
    for (const proc of running) if (proc.child.exitCode === null) proc.child.kill('SIGKILL');
    if (recordPath !== '') rmSync(recordPath, { force: true });
    await deleteNamespace(ns);
  });

  it("killed by SIGKILL leaves nothing behind; the record an earlier decap left (all.rp_filter set to 0) is put back by the next start", async () => {
    if (process.getuid?.() !== 0) throw new Error('this test needs root (a network namespace, TUN, raw sockets)');
    ip('netns', 'add', ns);
    recordPath = `/run/dsrlb/decap-${statSync(`/run/netns/${ns}`).ino}.json`;
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    inNs(ns, 'sysctl', ['-qw', 'net.ipv4.conf.all.rp_filter=2']);
    const rpFilter = (): string => inNs(ns, 'sysctl', ['-n', 'net.ipv4.conf.all.rp_filter']).trim();
    const start = () => startInNs(ns, ['node', decapEntry, '--vip', VIP4, '--tun', 'dck0'], (l) => l.includes('"decap running"'));

    const first = await start();
    expect(existsSync(recordPath)).toBe(false);
    first.child.kill('SIGKILL');
    await first.exit;
    // Its device went with the process, and everything decap set was on it.
    expect(ip('-n', ns, '-o', 'link', 'show')).not.toContain('dck0');
    expect(rpFilter()).toBe('2');
    expect(existsSync(recordPath)).toBe(false);

    // What a decap before 2026-12 left when killed: all.rp_filter at its 0, the operator's 2 in the record.
    inNs(ns, 'sysctl', ['-qw', 'net.ipv4.conf.all.rp_filter=0']);
    mkdirSync('/run/dsrlb', { recursive: true });
    writeFileSync(recordPath, JSON.stringify({ sysctls: [{ key: 'net/ipv4/conf/all/rp_filter', previous: '2', setTo: '0' }] }), { mode: 0o600 });
    const second = await start();
    expect(jsonLines(second).find((l) => String(l.msg).startsWith('put back what an earlier decap'))?.sysctls).toEqual(['net.ipv4.conf.all.rp_filter=2 (was 0)']);
    expect(rpFilter()).toBe('2');
    expect(existsSync(recordPath)).toBe(false);
    second.child.kill('SIGTERM');
    expect(await second.exit).toBe(0);
    expect(second.stderr.join('')).toBe('');
    expect(rpFilter()).toBe('2');
  });
});

/** SIGTERM, then the process's last stdout line. */
async function stopLast(proc: RunningProcess): Promise<string> {
  proc.child.kill('SIGTERM');
  await proc.exit;
  const last = proc.lines[proc.lines.length - 1];
  if (last === undefined) throw new Error(`no report: ${proc.stderr.join('')}`);
  return last;
}
