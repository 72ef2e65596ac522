// The benchmark's namespaces and the processes run in them: dsrlb's lab (client, LB, one real on a
// bridge) reused as is, plus kernel forwarding on the LB for the baseline, veth offload switches,
// dsrlb, the C reference forwarder and HAProxy start/stop, and a cleanup that runs on exit, SIGINT
// and SIGTERM.
//
// One topology serves every case, so every forwarder crosses the same veth and bridge hops:
// client eth0 -> bridge -> LB eth0 -> (forwarder) -> LB eth0 -> bridge -> sink eth0.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { createLab, destroyLabsWithPrefix } from '../../dist/lab/netns-lab.js';
import { NFT_TABLE, nftRuleset } from '../../dist/control/host-setup.js';
import { dsrlbArgv } from '../../dist/cli/command-argv.js';

export const ROOT = resolve(import.meta.dirname, '..', '..');
export const UDP_PORT = 9000;
export const HTTP_PORT = 80;
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Things to undo at exit, last registered first. */
const cleanups = [];
let cleaning = null;

export function onCleanup(fn) {
  cleanups.push(fn);
}

export async function runCleanups() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    while (cleanups.length > 0) {
      const fn = cleanups.pop();
      try {
        await fn();
      } catch (err) {
        process.stderr.write(`bench: cleanup: ${err.message}\n`);
      }
    }
  })();
  return cleaning;
}

/** Installs SIGINT/SIGTERM handlers that clean up and exit (130/143). */
export function cleanupOnSignals() {
  for (const [sig, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ]) {
    process.on(sig, () => {
      process.stderr.write(`\nbench: ${sig}, cleaning up\n`);
      void runCleanups().finally(() => process.exit(code));
    });
  }
}

/** A scratch directory under the system temp dir, removed at cleanup. */
export function scratchDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onCleanup(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Builds the lab with one real (the sink and the HTTP server) and the LB's forwarding sysctls. */
export async function createBenchLab(prefix) {
  await destroyLabsWithPrefix(prefix);
  onCleanup(() => destroyLabsWithPrefix(prefix));
  const lab = await createLab({ prefix, realCount: 1, repoRoot: ROOT });
  const must = async (ns, argv) => {
    const r = await lab.exec(ns, argv);
    if (r.code !== 0) throw new Error(`${argv.join(' ')} in ${typeof ns === 'string' ? ns : ns.ns}: exit ${r.code}: ${r.stderr.trim()}`);
    return r.stdout;
  };
  // Forwarding back out of the interface a packet came in on: no ICMP redirects to the client.
  for (const conf of ['all', 'default', 'eth0']) await must(lab.lb, ['sysctl', '-qw', `net.ipv4.conf.${conf}.send_redirects=0`]);
  await must(lab.lb, ['sysctl', '-qw', 'net.ipv4.ip_forward=0']);
  // The sink never sends: once its learned entry aged out (300 s) the bridge would flood every
  // frame to all ports, and the client and the LB would pay for copies. Pin every host's port.
  for (const h of [lab.client, lab.lb, ...lab.reals]) {
    await must(lab.switchNs, ['bridge', 'fdb', 'replace', h.mac, 'dev', `sw-${h.name}`, 'master', 'static']);
  }
  return { lab, must, sink: lab.reals[0] };
}

/** Kernel IPv4 forwarding on the LB: VIP routed to the sink, ip_forward on. Returns the undo. */
export async function enableKernelForwarding(bl) {
  const { lab, must, sink } = bl;
  await must(lab.lb, ['ip', 'route', 'replace', `${lab.vip}/32`, 'via', sink.ipv4, 'dev', 'eth0']);
  await must(lab.lb, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  // Resolve the next hop now, not with the first measured packets.
  await lab.exec(lab.lb, ['ping', '-c', '1', '-W', '1', sink.ipv4]);
  return async () => {
    await must(lab.lb, ['sysctl', '-qw', 'net.ipv4.ip_forward=0']);
    await lab.exec(lab.lb, ['ip', 'route', 'del', `${lab.vip}/32`]);
  };
}

/** Every veth end of the lab: [namespace, device]. */
function vethEnds(lab) {
  const ends = [];
  for (const h of [lab.client, lab.lb, ...lab.reals]) {
    ends.push([h.ns, 'eth0']);
    ends.push([lab.switchNs, `sw-${h.name}`]);
  }
  return ends;
}

const OFFLOAD_FEATURES = ['rx', 'tx', 'sg', 'tso', 'gso', 'gro'];

/**
 * Turns the usual offloads (rx/tx checksum, scatter-gather, TSO, GSO, GRO) on or off on every veth
 * end; returns the resulting state of the client's eth0 as `ethtool -k` reports it.
 */
export async function setOffloads(bl, on) {
  const { lab } = bl;
  const value = on ? 'on' : 'off';
  for (const [ns, dev] of vethEnds(lab)) {
    const args = ['ethtool', '-K', dev];
    for (const f of OFFLOAD_FEATURES) args.push(f, value);
    // ethtool exits non-zero when one feature is fixed; the state is read back below.
    await lab.exec(ns, args);
  }
  const r = await lab.exec(lab.client, ['ethtool', '-k', 'eth0']);
  const state = {};
  for (const line of r.stdout.split('\n')) {
    const m = /^([a-z-]+(?:-offload|-checksumming|-gather|segmentation)?):\s+(on|off)/.exec(line.trim());
    if (m && /checksumming|scatter-gather|segmentation-offload|receive-offload/.test(m[1])) state[m[1]] = m[2];
  }
  return state;
}

/** A child process in a namespace whose stdout/stderr lines are kept. */
export function spawnIn(lab, ns, argv, { keepLines = 400 } = {}) {
  const child = lab.spawn(ns, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = [];
  const keep = (prefix) => (l) => {
    lines.push(prefix + l);
    if (lines.length > keepLines) lines.shift();
  };
  createInterface({ input: child.stdout }).on('line', keep(''));
  createInterface({ input: child.stderr }).on('line', keep('stderr: '));
  const exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  return { child, pid: child.pid, lines, exited };
}

export async function stopProcess(p, signal = 'SIGTERM', graceMs = 5000) {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return p.exited;
  p.child.kill(signal);
  const timer = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
  const r = await p.exited;
  clearTimeout(timer);
  return r;
}

export function dsrlbConfig(bl, io, ring = null) {
  const { lab, sink } = bl;
  return [
    '# written by bench/run.js',
    'interface: eth0',
    `io: ${io}`,
    ...(ring ? [`ring: ${ring}`] : []),
    'metrics: { listen: 127.0.0.1:9742 }',
    'admin: { listen: 127.0.0.1:9743 }',
    'services:',
    '  - name: udp-sink',
    `    vip: ${lab.vip}`,
    `    port: ${UDP_PORT}`,
    '    protocol: udp',
    '    reals:',
    `      - address: ${sink.ipv4}`,
    '  - name: web',
    `    vip: ${lab.vip}`,
    `    port: ${HTTP_PORT}`,
    '    protocol: tcp',
    '    reals:',
    `      - address: ${sink.ipv4}`,
    '',
  ].join('\n');
}

/**
 * Starts `dsrlb run` in the LB namespace, with node started as the installed command starts it;
 * resolves once its admin API shows every real's MAC. `ring`: 'v2' | 'v3' for io afpacket (null:
 * the default); `nodeArgs`: more node flags.
 */
export async function startDsrlb(bl, dir, io, ring = null, nodeArgs = []) {
  const { lab } = bl;
  const cfg = join(dir, `dsrlb-${io}${ring ? `-${ring}` : ''}.yaml`);
  writeFileSync(cfg, dsrlbConfig(bl, io, ring));
  const [node, ...rest] = dsrlbArgv(ROOT);
  const p = spawnIn(lab, lab.lb, [node, ...nodeArgs, ...rest, 'run', '-c', cfg]);
  onCleanup(() => stopProcess(p));
  const deadline = Date.now() + 30_000;
  // The sink never sends, so have the LB learn its MAC the way it would from any real's traffic.
  while (Date.now() < deadline) {
    if (p.child.exitCode !== null) throw new Error(`dsrlb (${io}) exited ${p.child.exitCode}:\n${p.lines.join('\n')}`);
    const r = await lab.exec(lab.lb, ['curl', '-sf', 'http://127.0.0.1:9743/status']);
    if (r.code === 0) {
      const s = JSON.parse(r.stdout);
      if (s.services.every((svc) => svc.reals.every((x) => x.mac !== null))) return p;
    }
    await sleep(200);
  }
  await stopProcess(p);
  throw new Error(`dsrlb (${io}) did not become ready:\n${p.lines.join('\n')}`);
}

/**
 * Starts the C reference forwarder (bench/trafgen/ringfwd.c: TPACKET_V3 ring + sendmmsg, one core)
 * in the LB namespace, with the host set up as dsrlb's daemon sets it up (src/control/host-setup.ts):
 * the VIP on lo, so the LB's kernel answers ARP for it, and the kernel's own copy of every frame to
 * the VIP dropped in nftables at raw prerouting. ip_forward stays as the lab set it (0). Resolves
 * once it is ready; stop() ends it (SIGTERM: it finishes its block and prints its counts, returned
 * as `result`) and removes the table and the VIP again. Undone at cleanup too if never stopped.
 */
export async function startRingForwarder(bl, bins, extraArgs = []) {
  const { lab, must, sink } = bl;
  let p = null;
  let stopped = null;
  const stop = () => {
    stopped ??= (async () => {
      const exit = p ? await stopProcess(p) : null;
      await lab.exec(lab.lb, ['nft', 'delete', 'table', 'inet', NFT_TABLE]);
      await lab.exec(lab.lb, ['ip', 'addr', 'del', `${lab.vip}/32`, 'dev', 'lo']);
      const last = p ? [...p.lines].reverse().find((l) => l.startsWith('{"forwarded"')) : undefined;
      return { ...exit, result: last ? JSON.parse(last) : null };
    })();
    return stopped;
  };
  // Registered first: a failure half-way through set-up is undone as well.
  onCleanup(stop);
  // The daemon's own ruleset (nft takes it as one argument as well as on stdin).
  await must(lab.lb, ['nft', nftRuleset([lab.vip])]);
  await must(lab.lb, ['ip', 'addr', 'add', `${lab.vip}/32`, 'dev', 'lo']);
  p = spawnIn(lab, lab.lb, [bins.ringfwd, '--ifname', 'eth0', '--dst-mac', sink.mac, '--vip', lab.vip, '--duration', '3600', ...extraArgs]);
  const deadline = Date.now() + 5000;
  while (!p.lines.some((l) => l.includes('"ready":true'))) {
    if (p.child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`ringfwd not ready (exit ${p.child.exitCode}):\n${p.lines.join('\n')}`);
    }
    await sleep(10);
  }
  return { pid: p.pid, child: p.child, lines: p.lines, exited: p.exited, stop };
}

/** The daemon's counters from its metrics endpoint (inside the LB namespace). */
export async function dsrlbMetrics(bl) {
  const r = await bl.lab.exec(bl.lab.lb, ['curl', '-sf', 'http://127.0.0.1:9742/metrics']);
  const out = { rx: 0, tx: 0, flowTableEntries: 0, dropped: {}, loopBusyS: 0, loopEngineS: 0 };
  for (const line of r.stdout.split('\n')) {
    if (line.startsWith('dsrlb_rx_packets_total ')) out.rx = Number(line.split(' ').pop());
    else if (line.startsWith('dsrlb_loop_busy_seconds_total ')) out.loopBusyS = Number(line.split(' ').pop());
    else if (line.startsWith('dsrlb_loop_engine_seconds_total ')) out.loopEngineS = Number(line.split(' ').pop());
    else if (line.startsWith('dsrlb_tx_packets_total ')) out.tx = Number(line.split(' ').pop());
    else if (line.startsWith('dsrlb_flow_table_entries ')) out.flowTableEntries = Number(line.split(' ').pop());
    else {
      const m = /^dsrlb_dropped_packets_total\{reason="([^"]+)"\} (\S+)$/.exec(line);
      if (m && Number(m[2]) > 0) out.dropped[m[1]] = Number(m[2]);
    }
  }
  return out;
}

/** HAProxy in TCP mode on VIP:80 in the LB namespace, the sink's HTTP server as its one backend. */
export async function startHaproxy(bl, dir) {
  const { lab, must, sink } = bl;
  const cfg = join(dir, 'haproxy.cfg');
  writeFileSync(
    cfg,
    [
      '# written by bench/run.js: TCP mode, one thread, no splicing (the Debian defaults otherwise)',
      'global',
      '    maxconn 1000',
      '    nbthread 1',
      'defaults',
      '    mode tcp',
      '    timeout connect 5s',
      '    timeout client 120s',
      '    timeout server 120s',
      'frontend web',
      `    bind ${lab.vip}:${HTTP_PORT}`,
      '    default_backend reals',
      'backend reals',
      `    server r1 ${sink.ipv4}:${HTTP_PORT}`,
      '',
    ].join('\n'),
  );
  // The VIP on the LB's lo: the LB answers ARP for it and HAProxy can bind it.
  await must(lab.lb, ['ip', 'addr', 'add', `${lab.vip}/32`, 'dev', 'lo']);
  const removeVip = () => lab.exec(lab.lb, ['ip', 'addr', 'del', `${lab.vip}/32`, 'dev', 'lo']);
  onCleanup(removeVip);
  const p = spawnIn(lab, lab.lb, ['haproxy', '-db', '-f', cfg]);
  onCleanup(() => stopProcess(p));
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    if (p.child.exitCode !== null) throw new Error(`haproxy exited ${p.child.exitCode}:\n${p.lines.join('\n')}`);
    const r = await lab.exec(lab.client, ['curl', '-sf', '-o', '/dev/null', '--max-time', '2', `http://${lab.vip}/`]);
    if (r.code === 0) {
      return {
        proc: p,
        stop: async () => {
          await stopProcess(p);
          await removeVip();
        },
      };
    }
    await sleep(200);
  }
  throw new Error(`haproxy did not answer on ${lab.vip}:${HTTP_PORT}:\n${p.lines.join('\n')}`);
}

/** Spawns a process in the root namespace and waits for it (for cc). */
export function runHere(argv) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolvePromise(out) : reject(new Error(`${argv.join(' ')}: exit ${code}\n${out}`))));
  });
}

/** Binds every thread of a process to one CPU (threads it starts later inherit the binding). */
export function pinProcess(pid, cpu) {
  return runHere(['taskset', '-a', '-p', '-c', String(cpu), String(pid)]);
}
