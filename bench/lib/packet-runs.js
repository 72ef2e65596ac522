// Packet-rate runs: build the C generator and sink, run one paced (or unpaced) burst of UDP frames
// from the client either through the LB or straight to the sink, and measure delivery, loss and
// CPU (machine busy time from precise idle counters, plus the LB process's threads) in a window
// that skips the start-up and the tail of the run.

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { foreignTime, ksoftirqdPids, lossFraction, machineBusy, takeSample, threadTime, usPerPacket } from './cpu-accounting.js';
import { ROOT, UDP_PORT, runHere, sleep, spawnIn, stopProcess } from './bench-lab.js';

/** Compiles bench/trafgen/*.c into outDir/bin; returns the binaries' paths. */
export async function buildTrafgen(outDir) {
  const bin = join(outDir, 'bin');
  mkdirSync(bin, { recursive: true });
  const gen = join(bin, 'udpgen');
  const sink = join(bin, 'udpsink');
  const ping = join(bin, 'udpping');
  const ringfwd = join(bin, 'ringfwd');
  await runHere(['cc', '-O2', '-Wall', '-Wextra', '-o', gen, join(ROOT, 'bench', 'trafgen', 'udpgen.c')]);
  await runHere(['cc', '-O2', '-Wall', '-Wextra', '-o', sink, join(ROOT, 'bench', 'trafgen', 'udpsink.c')]);
  await runHere(['cc', '-O2', '-Wall', '-Wextra', '-o', ping, join(ROOT, 'bench', 'trafgen', 'udpping.c')]);
  await runHere(['cc', '-O2', '-Wall', '-Wextra', '-o', ringfwd, join(ROOT, 'bench', 'trafgen', 'ringfwd.c')]);
  return { gen, sink, ping, ringfwd };
}

/** Each run's frames carry their own magic, so a late frame of an earlier run is never counted. */
let magicCounter = 0x64730000;

function lastJson(lines, what) {
  for (let i = lines.length - 1; i >= 0; i--) {
    const l = lines[i];
    if (l.startsWith('{')) {
      try {
        return JSON.parse(l);
      } catch {
        // not a JSON line
      }
    }
  }
  throw new Error(`${what}: no JSON result:\n${lines.join('\n')}`);
}

async function waitReady(p, what, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (p.lines.some((l) => l.includes('"ready":true'))) return;
    if (p.child.exitCode !== null) break;
    await sleep(10);
  }
  throw new Error(`${what} not ready:\n${p.lines.join('\n')}`);
}

/**
 * One run of `durationS` seconds. via 'lb': frames addressed to the LB's MAC (forwarded by whatever
 * runs there); via 'direct': to the sink's MAC (generator and sink alone, the baseline).
 * ratePps 0 = as fast as the generator can.
 * @param {{ lab: any, sink: any }} bl
 * @param {{ gen: string, sink: string, ping: string }} bins
 * @param {{ via: 'lb' | 'direct', flows: number, ratePps: number, durationS: number, pids?: number[] }} o
 */
export async function packetRun(bl, bins, o) {
  const { lab, sink } = bl;
  const magic = (magicCounter++ >>> 0) & 0x7fffffff;
  const dstMac = o.via === 'lb' ? lab.lb.mac : sink.mac;
  const sinkProc = spawnIn(lab, sink, [
    bins.sink,
    '--bind', lab.vip,
    '--port', String(UDP_PORT),
    '--duration', String(o.durationS + 4),
    '--idle-stop-ms', '250',
    '--magic', String(magic),
  ]);
  let gen = null;
  try {
    await waitReady(sinkProc, 'udpsink');
    gen = spawnIn(lab, lab.client, [
      bins.gen,
      '--ifname', 'eth0',
      '--src-mac', lab.client.mac,
      '--dst-mac', dstMac,
      '--src-ip', lab.client.ipv4,
      '--dst-ip', lab.vip,
      '--dst-port', String(UDP_PORT),
      '--flows', String(o.flows),
      '--rate', String(Math.round(o.ratePps)),
      '--duration', String(o.durationS),
      '--magic', String(magic),
    ]);
    const t0 = Date.now();
    // The CPU window: skip the first 15% (process start, flow creation, ring warm-up) and the last 10%.
    const startMs = Math.max(150, o.durationS * 150);
    const windowMs = Math.max(200, o.durationS * 1000 * 0.75);
    await sleep(startMs - (Date.now() - t0));
    // Every task that does this traffic's work: generator, sink, the LB's threads, ksoftirqd.
    const tasks = [gen.pid, sinkProc.pid, ...(o.pids ?? []), ...ksoftirqdPids()];
    const a = takeSample(tasks, { allProcesses: true });
    await sleep(windowMs);
    const b = takeSample(tasks, { allProcesses: true });
    const genExit = await gen.exited;
    if (genExit.code !== 0) throw new Error(`udpgen exited ${genExit.code ?? genExit.signal}:\n${gen.lines.join('\n')}`);
    const g = lastJson(gen.lines, 'udpgen');
    await sinkProc.exited;
    const s = lastJson(sinkProc.lines, 'udpsink');
    const deliveredPps = s.received / g.durationS;
    const busy = machineBusy(a, b);
    const all = threadTime(a, b);
    const lbPids = new Set(o.pids ?? []);
    const threads = { ...all, threads: all.threads.filter((t) => lbPids.has(t.pid)) };
    threads.totalS = threads.threads.reduce((sum, t) => sum + t.seconds, 0);
    threads.mainS = threads.threads.filter((t) => t.main).reduce((sum, t) => sum + t.seconds, 0);
    const foreign = foreignTime(a, b, [...(o.pids ?? []), gen.pid, sinkProc.pid]);
    // Other people's processes on a shared machine are not the forwarder's cost.
    const ownBusyS = Math.max(0, busy.busyS - foreign.seconds);
    const windowPackets = deliveredPps * busy.wallS;
    return {
      via: o.via,
      flows: o.flows,
      targetPps: o.ratePps,
      sent: g.sent,
      sentPps: g.sentPps,
      sendErrors: g.sendErrors,
      received: s.received,
      deliveredPps,
      loss: lossFraction(g.sent, s.received),
      sinkRcvbufErrors: s.udpRcvbufErrors,
      cpu: {
        windowS: busy.wallS,
        busyS: ownBusyS,
        cores: ownBusyS / busy.wallS,
        machineBusyS: busy.busyS,
        foreignS: foreign.seconds,
        foreignTop: foreign.top,
        stealS: busy.stealS,
        tickBusyS: busy.tickBusyS,
        usPerPacket: usPerPacket(ownBusyS, windowPackets),
        // Method B: exact run time of the tasks above; blind to irq work charged to the idle task,
        // immune to other people's processes.
        tasksS: all.totalS,
        tasksUsPerPacket: usPerPacket(all.totalS, windowPackets),
        genS: all.threads.filter((t) => t.pid === gen.pid).reduce((sum, t) => sum + t.seconds, 0),
        sinkS: all.threads.filter((t) => t.pid === sinkProc.pid).reduce((sum, t) => sum + t.seconds, 0),
        processS: threads.totalS,
        processUsPerPacket: usPerPacket(threads.totalS, windowPackets),
        processMainS: threads.mainS,
        threads: threads.threads.slice(0, 4),
      },
      genCpuS: g.cpuS,
      sinkCpuS: s.cpuS,
    };
  } finally {
    if (gen) await stopProcess(gen, 'SIGTERM', 1000);
    await stopProcess(sinkProc, 'SIGTERM', 1000);
  }
}

/**
 * Round-trip times of single datagrams, one at a time: through the LB to the VIP (the client has a
 * static neighbour entry VIP -> LB MAC, as for a VIP the LB does not own) or straight to the sink.
 * The sink echoes from the address the datagram was sent to, so via the LB the reply comes from the
 * VIP and goes straight back to the client, as DSR replies do.
 */
export async function latencyRun(bl, bins, via, count) {
  const { lab, sink, must } = bl;
  const target = via === 'lb' ? lab.vip : sink.ipv4;
  if (via === 'lb') await must(lab.client, ['ip', 'neigh', 'replace', lab.vip, 'lladdr', lab.lb.mac, 'dev', 'eth0', 'nud', 'permanent']);
  const echo = spawnIn(lab, sink, [bins.sink, '--echo', '--bind', target, '--port', String(UDP_PORT), '--duration', '120']);
  try {
    await waitReady(echo, 'udpsink --echo');
    const r = await lab.exec(lab.client, [bins.ping, '--dst', target, '--port', String(UDP_PORT), '--count', String(count), '--interval-us', '2000']);
    if (r.code !== 0) throw new Error(`udpping: exit ${r.code}: ${r.stderr}`);
    return { via, ...JSON.parse(r.stdout.trim().split('\n').pop()) };
  } finally {
    await stopProcess(echo, 'SIGTERM', 1000);
    if (via === 'lb') await lab.exec(lab.client, ['ip', 'neigh', 'del', lab.vip, 'dev', 'eth0']);
  }
}
