// Micro-benchmark: what health probes cost the main thread, and how late they start. The real
// HealthMonitor (from dist/, with its real probers) probes N targets at interval 2 s, timeout 1 s
// (the config's defaults), N = rate x 2: tcp probes to a listening port (`tcp`), to a port nobody
// listens on (`refused`), http probes (GET /healthz, 200) and, when asked, https ones. The servers
// run in a child process (so their CPU is not counted), bound to 0.0.0.0; the targets are 127.1.x.y,
// each with its own 4-tuple space, so TIME_WAIT never runs out of ports. Each result goes to the
// daemon's own metrics observer (DaemonMetrics.observeProbe, 8 services).
//
// Per case, after a warm-up of an interval and a half (all first probes come in the first second),
// over a window: main-thread CPU per probe (the main thread's schedstat; process CPU, user and
// system, for all threads), the event-loop delay, the server's CPU, and each probe's lateness: when
// the prober was called against its slot in the monitor's schedule (a first probe at start +
// floor(r x 1 s), then phase + k x interval, phase = start + floor(r x interval); `random` is
// injected, and its call marks the watch's start). Slots the monitor skipped because the loop was
// late count as missed. Then each prober alone through runProbe, 20 probes in flight (`direct`),
// next to net.connect + destroy alone (`floor`), and observeProbe alone, per call.
//
// `--dist DIR` measures another build (tsc --outDir DIR); default ../../dist. `--dist A,B` measures
// each case on A then B (`--repeat N` times), close in time: an A/B on a machine whose speed wanders.
// `--rates 1000,4000`, `--kinds tcp,refused,http,https`, `--seconds S` (window), `--observer none`;
// `--quick`: 2 s windows, rates 1,000 and 4,000.

import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseSchedstat } from '../lib/cpu-accounting.js';
import { flags, printResult } from './micro-setup.js';

const opts = flags();
const quick = opts.quick === true;
const distDirs = typeof opts.dist === 'string' ? opts.dist.split(',').map((d) => resolve(d)) : [new URL('../../dist/', import.meta.url).pathname];
/** The health modules of each build: several are measured case by case, in turn, on a noisy machine. */
const builds = [];
for (const dir of distDirs) {
  const dist = (path) => import(pathToFileURL(join(dir, path)).href);
  const [{ HealthMonitor }, { runProbe }, { TcpProber }, { HttpProber }] = await Promise.all(
    ['health/health-monitor.js', 'health/probe.js', 'health/tcp-probe.js', 'health/http-probe.js'].map(dist),
  );
  builds.push({ dir, HealthMonitor, runProbe, TcpProber, HttpProber });
}
const { DaemonMetrics } = await import(pathToFileURL(join(distDirs[0], 'control/metrics.js')).href);
const { healthCheckDefaults } = await import(pathToFileURL(join(distDirs[0], 'config/validate.js')).href);

const rates = String(opts.rates ?? (quick ? '1000,4000' : '1000,4000,8000')).split(',').map(Number);
const kinds = String(opts.kinds ?? 'tcp,refused,http').split(',');
const windowS = Number(opts.seconds ?? (quick ? 2 : 5));
const repeat = Number(opts.repeat ?? 1);
const withObserver = opts.observer !== 'none';
const INTERVAL_MS = 2000;
const TIMEOUT_MS = 1000;
const FIRST_SPREAD_MS = 1000; // FIRST_PROBE_SPREAD_MS of the monitor
const EARLY_MS = 3;
const SERVICES = 8;

/** The servers, in a child so their CPU is not ours: prints "ports TCP HTTP HTTPS". */
const SERVERS = `
const fs = require('node:fs');
const net = require('node:net');
const http = require('node:http');
const https = require('node:https');
const [key, cert] = process.argv.slice(1);
const handler = (req, res) => {
  if (req.url === '/healthz') return void res.end('ok');
  res.statusCode = 404; res.end();
};
const tcp = net.createServer((s) => { s.on('error', () => {}); s.destroy(); });
const web = http.createServer(handler);
const tls = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert) }, handler);
const listen = (server) => new Promise((resolve) => server.listen({ port: 0, host: '0.0.0.0', backlog: 4096 }, () => resolve(server.address().port)));
Promise.all([listen(tcp), listen(web), listen(tls)]).then((ports) => process.stdout.write('ports ' + ports.join(' ') + '\\n'));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

async function startServers() {
  // A self-signed certificate for the https server (the probe does not verify it).
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-probe-cost-'));
  const key = join(dir, 'key.pem');
  const cert = join(dir, 'cert.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1', '-subj', '/CN=real.example.test', '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const child = spawn(process.execPath, ['-e', SERVERS, key, cert], { stdio: ['pipe', 'pipe', 'inherit'] });
  const line = await new Promise((resolveLine, reject) => {
    let text = '';
    child.stdout.setEncoding('utf8').on('data', (chunk) => {
      text += chunk;
      if (text.includes('\n')) resolveLine(text.trim());
    });
    child.once('exit', () => reject(new Error('the server process exited')));
  });
  await rm(dir, { recursive: true, force: true });
  const [, tcp, http, https] = line.split(' ').map(Number);
  return { tcp, http, https, pid: child.pid, stop: () => child.stdin.end() };
}

/** A port nobody listens on: bound once, then released. */
async function closedPort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const mainThreadNs = () => parseSchedstat(readFileSync(`/proc/self/task/${process.pid}/schedstat`, 'utf8'));
const childCpuMs = (pid) => {
  const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10; // utime + stime, in 1/100 s
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const round = (x, digits = 1) => Math.round(x * 10 ** digits) / 10 ** digits;

const LOOP_DELAY_RESOLUTION_MS = 10;
/** monitorEventLoopDelay records the whole gap between its timer's runs: the delay is what exceeds the resolution. */
const loopDelayMs = (ns) => round(Math.max(0, ns / 1e6 - LOOP_DELAY_RESOLUTION_MS));

function percentile(sorted, p) {
  return sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

/** The config's defaults for `port` (validate.ts healthCheckDefaults), on /healthz at this bench's interval and timeout. */
function healthCheck(type, port) {
  return { type, ...healthCheckDefaults(port), path: '/healthz', intervalMs: INTERVAL_MS, timeoutMs: TIMEOUT_MS };
}

const address = (i) => `127.1.${i >> 8}.${i & 255}`;

function makeMetrics() {
  const source = {
    counters: () => new Float64Array(4096),
    realCount: () => 0,
    reals: () => [],
    activeFlows: () => 0,
    inactiveFlows: () => 0,
    flowTableCapacity: () => 0,
    panic: () => [],
    services: () => [],
  };
  return new DaemonMetrics(source);
}

/** One monitor at `rate` probes a second; returns the window's figures. */
async function runCase(build, kind, rate, ports, metrics) {
  const { HealthMonitor, TcpProber, HttpProber } = build;
  const n = rate * (INTERVAL_MS / 1000);
  const type = kind === 'http' || kind === 'https' ? kind : 'tcp';
  const port = { tcp: ports.tcp, refused: ports.refused, http: ports.http, https: ports.https }[kind];
  if (port === undefined) throw new Error(`--kinds: unknown kind ${kind} (tcp, refused, http, https)`);
  const check = healthCheck(type, port);
  const inner = type === 'tcp' ? new TcpProber() : new HttpProber(type);
  const index = new Map();
  const startMs = new Float64Array(n);
  const rs = new Float64Array(n);
  const nextSlot = new Float64Array(n).fill(NaN);
  let win = null; // the measurement window: { from, to, open, lateness, started, missed }
  let k = 0;
  const random = () => {
    // The monitor draws once per new watch, just after reading the watch's start on the monotonic clock.
    const i = k++;
    startMs[i] = performance.now();
    rs[i] = (i * 0.6180339887) % 1; // spread evenly, in no particular order
    nextSlot[i] = startMs[i] + Math.floor(rs[i] * Math.min(INTERVAL_MS, FIRST_SPREAD_MS));
    return rs[i];
  };
  const inWindow = (t) => win !== null && t >= win.from && t < win.to;
  const prober = {
    probe(...args) {
      const t = performance.now();
      const i = index.get(args[0].address);
      const first = startMs[i] + Math.floor(rs[i] * Math.min(INTERVAL_MS, FIRST_SPREAD_MS));
      // The slot this call is for: the next one planned, unless the monitor passed over it (it skips
      // slots that came while the loop was late rather than firing them in a burst).
      let slot = nextSlot[i];
      // A timer may fire up to a few ms early against performance.now() (libuv's cached loop time).
      while (slot + INTERVAL_MS <= t + EARLY_MS) {
        if (inWindow(slot)) win.missed++;
        slot += INTERVAL_MS;
      }
      if (inWindow(t)) {
        win.started++;
        win.lateness.push(t - slot);
      }
      const answer = inner.probe(...args);
      // After the first probe the slots are phase + k x interval; as the monitor does, a slot
      // already past once this one's probe has started is skipped.
      const after = performance.now();
      let next = slot === first ? startMs[i] + Math.floor(rs[i] * INTERVAL_MS) : slot + INTERVAL_MS;
      while (next <= after) {
        if (inWindow(next)) win.missed++;
        next += INTERVAL_MS;
      }
      nextSlot[i] = next;
      return answer;
    },
  };
  const outcomes = new Map();
  const observer = (key, result) => {
    if (win !== null && win.open) {
      const label = result.ok ? 'ok' : result.reason;
      outcomes.set(label, (outcomes.get(label) ?? 0) + 1);
    }
    if (metrics) metrics.observeProbe(`svc${Number(key) % SERVICES}`, address(Number(key)), result.durationMs / 1000, result.ok ? null : result.reason);
  };
  const monitor = new HealthMonitor({ random, probers: { [type]: prober }, observer });
  const targets = [];
  for (let i = 0; i < n; i++) {
    index.set(address(i), i);
    targets.push({ key: String(i), service: `svc${i % SERVICES}`, address: address(i), vip: '10.0.0.100', check });
  }
  const t0 = performance.now();
  monitor.setTargets(targets);
  const setTargetsMs = performance.now() - t0;
  await sleep(INTERVAL_MS * 1.5);

  const delay = monitorEventLoopDelay({ resolution: LOOP_DELAY_RESOLUTION_MS });
  const from = performance.now();
  win = { from, to: from + windowS * 1000, lateness: [], started: 0, missed: 0, open: true };
  const cpu0 = process.cpuUsage();
  const main0 = mainThreadNs();
  const child0 = childCpuMs(ports.pid);
  delay.enable();
  await sleep(windowS * 1000);
  delay.disable();
  const main1 = mainThreadNs();
  const cpu1 = process.cpuUsage(cpu0);
  const child1 = childCpuMs(ports.pid);
  const wallS = (performance.now() - from) / 1000;
  win.open = false;
  monitor.stop();
  await sleep(300); // aborted probes let go of their sockets

  const started = win.started;
  const late = win.lateness.sort((a, b) => a - b);
  return {
    dist: build.dir,
    kind,
    rate,
    targets: n,
    setTargetsMs: round(setTargetsMs),
    probesPerS: round(started / wallS, 0),
    missedSlots: win.missed,
    mainThreadUsPerProbe: round((main1 - main0) / 1000 / started, 1),
    processUsPerProbe: round((cpu1.user + cpu1.system) / started, 1),
    processUserUs: round(cpu1.user / started, 1),
    processSystemUs: round(cpu1.system / started, 1),
    mainThreadCores: round((main1 - main0) / 1e9 / wallS, 2),
    serverCores: round((child1 - child0) / 1000 / wallS, 2),
    lateMs: { p50: round(percentile(late, 50)), p99: round(percentile(late, 99)), max: round(late.at(-1) ?? 0), over10ms: late.filter((x) => x > 10).length },
    loopDelayMs: { p50: loopDelayMs(delay.percentile(50)), p99: loopDelayMs(delay.percentile(99)), max: loopDelayMs(delay.max) },
    outcomes: Object.fromEntries(outcomes),
  };
}

/**
 * The probe alone, without the monitor's spread in time: `count` probes through runProbe, 20 at a
 * time (each loop turn serves several), main-thread microseconds per probe. Steadier than the
 * monitor's figures, whose loop wakes for nearly every probe; `floor` is net.connect + destroy alone.
 */
async function directCost(build, kind, ports, count) {
  const type = kind === 'http' || kind === 'https' ? kind : 'tcp';
  const port = { tcp: ports.tcp, refused: ports.refused, http: ports.http, https: ports.https }[kind];
  const check = healthCheck(type, port);
  const prober = type === 'tcp' ? new build.TcpProber() : new build.HttpProber(type);
  let next = 0;
  const one = () => {
    const i = next++;
    return build.runProbe(prober, { address: `127.2.${(i >> 8) & 255}.${i & 255}`, port, vip: '10.0.0.100', service: 'svc0', check }, TIMEOUT_MS).finished;
  };
  return closedLoop(one, count);
}

async function floorCost(ports, count) {
  let next = 0;
  const one = () =>
    new Promise((resolveOne) => {
      const i = next++;
      const socket = connect(ports.tcp, `127.2.${(i >> 8) & 255}.${i & 255}`);
      const done = () => (socket.destroy(), resolveOne());
      socket.on('connect', done);
      socket.on('error', done);
    });
  return closedLoop(one, count);
}

/** Main-thread microseconds per call of `one` (a promise), 20 in flight, after a warm-up. */
async function closedLoop(one, count) {
  const worker = async (n) => {
    for (let j = 0; j < n; j++) await one();
  };
  const inFlight = 20;
  await Promise.all(Array.from({ length: inFlight }, () => worker(100)));
  const main0 = mainThreadNs();
  await Promise.all(Array.from({ length: inFlight }, () => worker(count / inFlight)));
  return round((mainThreadNs() - main0) / 1000 / count, 1);
}

/** observeProbe alone: microseconds per call over the series of 8,000 reals. */
function observerCost(metrics) {
  const reals = 8000;
  const calls = quick ? 100_000 : 400_000;
  for (let i = 0; i < reals; i++) metrics.observeProbe(`svc${i % SERVICES}`, address(i), 0.0004, null);
  const t0 = performance.now();
  for (let c = 0; c < calls; c++) {
    const i = c % reals;
    metrics.observeProbe(`svc${i % SERVICES}`, address(i), 0.0004, c % 16 === 0 ? 'refused' : null);
  }
  return { reals, calls, usPerCall: round(((performance.now() - t0) * 1000) / calls, 2) };
}

const ports = await startServers();
ports.refused = await closedPort();
const cases = [];
try {
  const metrics = withObserver ? makeMetrics() : null;
  for (const kind of kinds) {
    for (const rate of rates) {
      for (let r = 0; r < repeat; r++) {
        for (const build of builds) {
          cases.push(await runCase(build, kind, rate, ports, metrics));
          process.stderr.write(`${JSON.stringify(cases.at(-1))}\n`); // progress: a full run takes minutes
        }
      }
    }
  }
  const direct = [];
  const count = quick ? 4000 : 20_000;
  for (let r = 0; r < repeat; r++) {
    direct.push({ kind: 'floor', mainThreadUsPerProbe: await floorCost(ports, count) });
    for (const kind of kinds) {
      // A TLS handshake costs a millisecond or more: fewer of them.
      const n = kind === 'https' ? count / 10 : count;
      for (const build of builds) direct.push({ dist: build.dir, kind, mainThreadUsPerProbe: await directCost(build, kind, ports, n) });
    }
  }
  const observeProbe = withObserver ? observerCost(makeMetrics()) : null;
  printResult({ bench: 'probe-cost', dists: distDirs, intervalMs: INTERVAL_MS, timeoutMs: TIMEOUT_MS, windowS, observer: withObserver, cases, direct, observeProbe });
} finally {
  ports.stop();
}
