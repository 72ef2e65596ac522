// `dsrlb demo`: a client, the LB and three real servers in network namespaces on one L2
// segment; dsrlb runs in the LB namespace, the client sends real HTTP requests to the VIP, and
// the demo prints which real answered each share and how many reply bytes crossed the LB (none:
// the reals answer the client directly). The lab stays up for poking; `--down` removes it.

import { spawn } from 'node:child_process';
import { existsSync, openSync } from 'node:fs';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLab, destroyLabsWithPrefix, type Lab } from '../lab/netns-lab.js';
import { InstanceLock } from '../control/instance-lock.js';
import { dsrlbArgv } from './command-argv.js';

const PREFIX = 'dsrlb-demo-';
const RUN_DIR = '/run/dsrlb-demo';
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

function say(line = ''): void {
  process.stdout.write(line + '\n');
}

async function waitFor(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

export function demoConfig(lab: Lab): string {
  return [
    '# dsrlb demo: one VIP, three real servers on the same L2 segment (L2 DSR).',
    'interface: eth0',
    'io: afpacket',
    'metrics: { listen: 127.0.0.1:9742 }',
    'admin: { listen: 127.0.0.1:9743 }',
    `stateFile: ${RUN_DIR}/dsrlb.state.json`,
    'services:',
    '  - name: web',
    `    vip: ${lab.vip}`,
    '    port: 80',
    '    protocol: tcp',
    '    scheduler: maglev',
    '    forwarding: l2',
    '    reals:',
    ...lab.reals.map((r) => `      - address: ${r.ipv4}`),
    '',
  ].join('\n');
}

/**
 * Held while a demo is set up and run: two at once tear each other's lab down. Its file is in
 * /run/dsrlb (`demo-<netns inode>.lock`), not in RUN_DIR, which a demo removes and makes again.
 */
const DEMO_LOCK_KIND = 'demo';
const DEMO_BUSY = 'another dsrlb demo is running on this host (two would tear down each other\'s lab): wait for it to end';

export async function demoUp(opts: { requests: number }): Promise<number> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('dsrlb demo: needs root (network namespaces)\n');
    return 2;
  }
  let lock: InstanceLock;
  try {
    lock = await InstanceLock.acquire(DEMO_LOCK_KIND, DEMO_BUSY);
  } catch (err) {
    process.stderr.write(`dsrlb demo: ${(err as Error).message}\n`);
    return 2;
  }
  // Ctrl-C (or a SIGTERM) while the lab is built or the requests run: a half-built lab is of no
  // use to anyone, and its daemon runs detached, so the signal would not reach it. Take it down.
  let interrupted: string | null = null;
  const onSignal = (signal: string): void => {
    if (interrupted !== null) return;
    interrupted = signal;
    process.stderr.write(`\ndsrlb demo: ${signal}: stopping, the lab is removed...\n`);
  };
  const onInt = (): void => onSignal('SIGINT');
  const onTerm = (): void => onSignal('SIGTERM');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  try {
    const { code } = await runDemo(opts, () => interrupted);
    // A signal after the last check (the requests done, the lab up): it said the lab is removed.
    if (interrupted !== null) throw new Error('interrupted');
    return code;
  } catch (err) {
    if (interrupted === null) process.stderr.write(`dsrlb demo: ${(err as Error).message}\n`);
    // An interrupt is no failure: the daemon's log would only look like one.
    if (interrupted === null) await showDaemonLog();
    if (interrupted === null) process.stderr.write('dsrlb demo: removing the lab\n');
    await demoDown({ quiet: true });
    return interrupted === 'SIGINT' ? 130 : interrupted === 'SIGTERM' ? 143 : 2;
  } finally {
    process.removeListener('SIGINT', onInt);
    process.removeListener('SIGTERM', onTerm);
    lock.release();
  }
}

/** The daemon's last log lines on stderr, before a failed demo removes them with the lab. */
async function showDaemonLog(): Promise<void> {
  try {
    const lines = (await readFile(`${RUN_DIR}/dsrlb.log`, 'utf8')).trimEnd().split('\n').slice(-15);
    if (lines.length > 0 && lines[0] !== '') process.stderr.write(`dsrlb demo: the daemon's last log lines:\n${lines.map((l) => `  ${l}`).join('\n')}\n`);
  } catch {
    // no daemon started yet
  }
}

/** The lab's reply capture: frames to and from the VIP on the LB's interface. */
interface Capture {
  requests: number;
  replies: number;
  replyBytes: number;
  /** Frames tcpdump itself missed (its "dropped by kernel" at exit): the counts above are short by these. */
  missed: number;
  /** Ends tcpdump and counts what it had still to print. */
  stop(): Promise<void>;
}

/** tcpdump on the LB's eth0, once it says it is listening (it fails the demo if it cannot). */
async function startCapture(lab: Lab): Promise<Capture> {
  const child = lab.spawn(lab.lb, ['tcpdump', '-i', 'eth0', '-B', '8192', '-nn', '-l', '-q', '--immediate-mode', 'tcp', 'and', 'host', lab.vip], { stdio: ['ignore', 'pipe', 'pipe'] });
  const fromVip = `IP ${lab.vip}.`;
  const count = (line: string): void => {
    const m = /length (\d+)/.exec(line) ?? /tcp (\d+)/.exec(line);
    if (!m) return;
    if (line.includes(fromVip)) {
      c.replies++;
      c.replyBytes += Number(m[1]);
    } else c.requests++;
  };
  // Lines split across reads are joined first, and the lines still in the pipe at stop counted:
  // counted as they came, a stop lost the last frames (565 counted of 620).
  let partial = '';
  const closed = new Promise<void>((done) => child.stdout!.once('close', () => done()));
  const c: Capture = {
    requests: 0,
    replies: 0,
    replyBytes: 0,
    missed: 0,
    stop: async () => {
      child.kill('SIGTERM');
      await Promise.all([closed, new Promise((done) => child.once('exit', done))]);
      if (partial !== '') count(partial);
      partial = '';
      c.missed = Number(/(\d+) packets? dropped by kernel/.exec(stderr)?.[1] ?? 0);
    },
  };
  child.stdout!.on('data', (chunk: Buffer) => {
    const lines = (partial + chunk.toString()).split('\n');
    partial = lines.pop()!;
    for (const line of lines) count(line);
  });
  let stderr = '';
  await new Promise<void>((resolveListening, reject) => {
    const timer = setTimeout(() => reject(new Error(`tcpdump did not start listening on the LB's interface within 10 s: ${stderr.trim()}`)), 10_000);
    child.stderr!.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
      if (stderr.includes('listening on')) {
        clearTimeout(timer);
        resolveListening();
      }
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`tcpdump on the LB's interface ended (${signal ?? `exit ${code}`}): ${stderr.trim()}`));
    });
  });
  return c;
}

async function runDemo(opts: { requests: number }, interrupted: () => string | null): Promise<{ code: number }> {
  const stopIfInterrupted = (): void => {
    if (interrupted() !== null) throw new Error('interrupted');
  };
  // A demo lab already up is replaced, and said so (it may be someone else's on a shared host).
  if (existsSync(RUN_DIR)) say('dsrlb demo: a demo lab is already up: replacing it');
  await demoDown({ quiet: true });
  say('dsrlb demo: building the lab (client, LB, 3 real servers on one bridge)...');
  // Before the lab exists: an interrupted demo finds and removes what was made so far.
  await mkdir(RUN_DIR, { recursive: true });
  const lab = await createLab({ prefix: PREFIX, realCount: 3 });
  try {
    stopIfInterrupted();
    await lab.startHttpServers();
    stopIfInterrupted();
    const configPath = `${RUN_DIR}/dsrlb.yaml`;
    await writeFile(configPath, demoConfig(lab));
    const logPath = `${RUN_DIR}/dsrlb.log`;
    const logFd = openSync(logPath, 'a');
    const daemon = spawn('ip', ['netns', 'exec', lab.lb.ns, ...dsrlbArgv(repoRoot), 'run', '-c', configPath], {
      detached: true,
      stdio: ['ignore', logFd, logFd],
    });
    daemon.unref();
    await writeFile(`${RUN_DIR}/dsrlb.pid`, String(daemon.pid));
    say(`dsrlb demo: dsrlb runs in namespace ${lab.lb.ns} (log: ${logPath})`);
    await waitFor(async () => {
      stopIfInterrupted();
      if (daemon.exitCode !== null) throw new Error(`the daemon exited (code ${daemon.exitCode}) before it was ready`);
      return (await lab.exec(lab.lb, ['curl', '-sf', 'http://127.0.0.1:9743/healthz'])).code === 0;
    }, 20_000, 'the daemon to start');
    // Ready is the loop running; the first requests would still find a real's MAC unknown for a
    // few hundred ms and be dropped (neighbor_unknown). The demo waits until every real is up
    // with its MAC known, as status shows it.
    await waitFor(async () => {
      stopIfInterrupted();
      const status = await lab.exec(lab.lb, ['curl', '-sf', 'http://127.0.0.1:9743/status']);
      if (status.code !== 0) return false;
      const { services } = JSON.parse(status.stdout) as { services: { reals: { health: { state: string }; mac: string | null }[] }[] };
      return services.every((s) => s.reals.every((r) => r.health.state === 'up' && r.mac !== null));
    }, 10_000, 'every real to be up with its MAC known');
    const capture = await startCapture(lab);
    stopIfInterrupted();
    say(`dsrlb demo: ${opts.requests} HTTP requests from ${lab.client.ipv4} to http://${lab.vip}/, one connection each...`);
    const run = await lab.exec(lab.client, [process.execPath, resolve(repoRoot, 'dist/lab/http-client.js'), '--host', lab.vip, '--count', String(opts.requests)], { timeoutMs: 120_000 });
    stopIfInterrupted();
    await new Promise((r) => setTimeout(r, 500));
    await capture.stop();
    if (run.code !== 0) throw new Error(`http client failed: ${run.stderr.trim()}`);
    const result = JSON.parse(run.stdout.trim().split('\n').pop()!) as { ok: number; failed: number; byReal: Record<string, number> };
    // Without the requests on the capture, a count of 0 replies would prove nothing.
    if (result.ok > 0 && capture.requests === 0) throw new Error("the capture on the LB's interface saw none of the requests: it cannot tell where the replies went");
    const metrics = (await lab.exec(lab.lb, ['curl', '-sf', 'http://127.0.0.1:9742/metrics'])).stdout;
    say('');
    say('  real        address       answered   packets forwarded by the LB');
    for (const r of lab.reals) {
      const pk = new RegExp(`dsrlb_forwarded_packets_total\\{service="web",real="${r.ipv4.replaceAll('.', '\\.')}"\\} (\\d+)`).exec(metrics)?.[1] ?? '0';
      const n = result.byReal[r.name] ?? 0;
      say(`  ${r.name.padEnd(10)}  ${r.ipv4.padEnd(12)}  ${String(n).padStart(4)} (${Math.round((100 * n) / Math.max(1, result.ok))}%)  ${pk.padStart(8)}`);
    }
    say('');
    say(`  requests answered: ${result.ok}/${opts.requests}, failed: ${result.failed}`);
    // Frames the LB dropped, by reason (none expected): said, so a count that does not add up is explained.
    const drops = [...metrics.matchAll(/^dsrlb_dropped_packets_total\{reason="([^"]+)"\} (\d+)$/gm)].filter((m) => m[2] !== '0');
    if (drops.length > 0) say(`  dropped by the LB: ${drops.map((m) => `${m[2]} ${m[1]}`).join(', ')} (dsrlb_dropped_packets_total)`);
    const missed = capture.missed > 0 ? ` (tcpdump missed ${capture.missed} frames)` : '';
    say(`  on the LB's interface: ${capture.requests} TCP frames to ${lab.vip} (requests, in and forwarded), ${capture.replies} from it (replies), ${capture.replyBytes} reply bytes${missed}`);
    say(capture.replies === 0 ? '  -> zero response bytes crossed the LB: the reals answered the client directly (DSR).' : '  -> some replies crossed the LB!');
    say('');
    say('Try it yourself:');
    say(`  ip netns exec ${lab.client.ns} curl -s http://${lab.vip}/`);
    say(`  ip netns exec ${lab.lb.ns} ${resolve(repoRoot, 'bin/dsrlb.js')} status -c ${configPath}`);
    say(`  ip netns exec ${lab.lb.ns} curl -s http://127.0.0.1:9742/metrics | grep ^dsrlb_`);
    say('  npx dsrlb demo --down     # removes the lab');
    return { code: result.failed === 0 && capture.replies === 0 ? 0 : 2 };
  } finally {
    // The lab stays up (or is taken down by the caller): its processes must not hold this command open.
    for (const child of lab.httpServers.values()) {
      child.stdout?.destroy();
      child.stderr?.destroy();
      child.unref();
    }
  }
}

export async function demoDown(opts: { quiet?: boolean } = {}): Promise<number> {
  let daemon = false;
  try {
    const pid = Number(await readFile(`${RUN_DIR}/dsrlb.pid`, 'utf8'));
    if (pid > 0) {
      daemon = true;
      try {
        process.kill(pid, 'SIGTERM');
        const deadline = Date.now() + 10_000;
        while (Date.now() < deadline) {
          process.kill(pid, 0);
          await new Promise((r) => setTimeout(r, 100));
        }
      } catch {
        // gone
      }
    }
  } catch {
    // no demo daemon
  }
  const labs = await destroyLabsWithPrefix(PREFIX);
  await rm(RUN_DIR, { recursive: true, force: true });
  if (!opts.quiet) say(labs > 0 || daemon ? 'dsrlb demo: removed' : 'dsrlb demo: nothing to remove (no demo lab)');
  return 0;
}
