#!/usr/bin/env node
// What a packet loop's crash costs in frames: a steady UDP stream (64 flows) into a veth while the
// first loop's worker is terminated (a crash: nothing handed over) and started again by the group,
// as the daemon does. Every frame sent is either read by a loop (rx) or dropped by the kernel
// because a ring was full (drops, dsrlb_rx_kernel_drops_total); `lost` is what no socket saw at all.
// Needs root and a built tree (dist/, the addon). Makes and removes its own network namespace.
//   node bench/loop-crash.js [--workers 1,2] [--rates 2000,20000,50000] [--seconds 3]
// Prints one JSON line per case.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const { values } = parseArgs({ options: { workers: { type: 'string', default: '1,2' }, rates: { type: 'string', default: '2000,20000,50000' }, seconds: { type: 'string', default: '3' }, child: { type: 'string' } } });

if (values.child === undefined) {
  const ns = `dsrb-crash-${process.pid}`;
  const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'inherit'] });
  ip('netns', 'add', ns);
  try {
    // No IPv6: no router solicitation or MLD report joins the stream.
    execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1']);
    ip('-n', ns, 'link', 'add', 'lb0', 'type', 'veth', 'peer', 'name', 'inj0');
    ip('-n', ns, 'link', 'set', 'lb0', 'up');
    ip('-n', ns, 'link', 'set', 'inj0', 'up');
    for (const workers of values.workers.split(',')) {
      for (const rate of values.rates.split(',')) {
        const out = execFileSync('ip', ['netns', 'exec', ns, process.execPath, fileURLToPath(import.meta.url), '--child', `${workers},${rate},${values.seconds}`], { encoding: 'utf8', timeout: 60_000 });
        process.stdout.write(out);
      }
    }
  } finally {
    ip('netns', 'del', ns);
  }
} else {
  await child(...values.child.split(',').map(Number));
}

async function child(workers, rate, seconds) {
  const dist = new URL('../dist/', import.meta.url);
  const { LoopGroup } = await import(new URL('control/loop-group.js', dist).href);
  const { createLogger } = await import(new URL('control/logger.js', dist).href);
  const { Counter, MAX_REAL_IDS } = await import(new URL('dataplane/counters.js', dist).href);
  const { AfPacketIo } = await import(new URL('io/afpacket-io.js', dist).href);
  class Watched extends LoopGroup {
    workers = [];
    settings = [];
    createWorker(s) {
      const w = super.createWorker(s);
      this.workers.push(w);
      this.settings.push(s);
      return w;
    }
  }
  const g = new Watched(createLogger(() => undefined));
  const timeouts = { synMs: 30_000, establishedMs: 300_000, finMs: 30_000, closeMs: 10_000, udpMs: 60_000 };
  await g.start({ io: 'afpacket', ring: 'v3', interface: 'lb0', flowCapacity: 4096, timeouts, maxRealIds: MAX_REAL_IDS }, workers);
  const sender = AfPacketIo.open({ interface: 'inj0', blockCount: 2 });
  // 64 UDP flows to 10.200.0.1:9 (no service there: each loop counts and passes them), each frame
  // after a zero virtio_net_hdr.
  const flows = 64;
  const len = 10 + 60;
  const buf = new Uint8Array(flows * len);
  for (let f = 0; f < flows; f++) {
    const o = f * len + 10;
    buf.set(g.localMac, o);
    buf.set([2, 0, 0, 0, 0, 9], o + 6);
    buf.set([8, 0], o + 12);
    const ip = o + 14;
    buf.set([0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0, 10, 200, 0, 2, 10, 200, 0, 1], ip);
    let sum = 0;
    for (let i = 0; i < 20; i += 2) sum += (buf[ip + i] << 8) | buf[ip + i + 1];
    while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
    buf.set([(~sum >> 8) & 0xff, ~sum & 0xff], ip + 10);
    buf.set([0x9c, f, 0, 9, 0, 26], ip + 20);
  }
  const offsets = Int32Array.from({ length: flows }, (_, f) => f * len);
  const lengths = new Int32Array(flows).fill(len);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  let sent = 0;
  let killedAt = 0;
  let backAt = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < seconds * 1000) {
    const due = Math.floor(((performance.now() - t0) * rate) / 1000);
    while (sent < due) sent += sender.sendFrames(buf, offsets, lengths, Math.min(flows, due - sent));
    if (killedAt === 0 && performance.now() - t0 > 1000) {
      killedAt = performance.now();
      void g.workers[0].terminate();
    }
    if (killedAt !== 0 && backAt === 0 && g.workers.length > workers && g.running) backAt = performance.now();
    await sleep(1);
  }
  await sleep(500);
  const sum = (slot) => g.settings.reduce((n, s) => n + s.counters[slot], 0);
  const rx = sum(Counter.rxPackets);
  const drops = sum(Counter.rxKernelDrops);
  console.log(JSON.stringify({ workers, rate, sent, rx, drops, lost: sent - rx - drops, restartMs: Math.round(backAt - killedAt), restarts: g.restarts }));
  sender.close();
  await g.stop(2000);
  process.exit(0);
}
