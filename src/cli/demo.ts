// `dsrlb demo`: a client, the LB and three real servers in network namespaces on one L2
// segment; dsrlb runs in the LB namespace, the client sends real HTTP requests to the VIP, and
// the demo prints which real answered each share and how many reply bytes crossed the LB (none:
// the reals answer the client directly). The lab stays up for poking; `--down` removes it.

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLab, destroyLabsWithPrefix, type Lab } from '../lab/netns-lab.js';
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

export async function demoUp(opts: { requests: number }): Promise<number> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('dsrlb demo: needs root (network namespaces)\n');
    return 2;
  }
  // A demo lab already up is replaced, and said so (it may be someone else's on a shared host).
  if (existsSync(RUN_DIR)) say('dsrlb demo: a demo lab is already up: replacing it');
  await demoDown({ quiet: true });
  say('dsrlb demo: building the lab (client, LB, 3 real servers on one bridge)...');
  const lab = await createLab({ prefix: PREFIX, realCount: 3 });
  await lab.startHttpServers();
  await mkdir(RUN_DIR, { recursive: true });
  const configPath = `${RUN_DIR}/dsrlb.yaml`;
  await writeFile(configPath, demoConfig(lab));
  const logPath = `${RUN_DIR}/dsrlb.log`;
  const { openSync } = await import('node:fs');
  const logFd = openSync(logPath, 'a');
  const daemon = spawn('ip', ['netns', 'exec', lab.lb.ns, ...dsrlbArgv(repoRoot), 'run', '-c', configPath], {
    detached: true,
    stdio: ['ignore', logFd, logFd],
  });
  daemon.unref();
  await writeFile(`${RUN_DIR}/dsrlb.pid`, String(daemon.pid));
  say(`dsrlb demo: dsrlb runs in namespace ${lab.lb.ns} (log: ${logPath})`);
  await waitFor(async () => (await lab.exec(lab.lb, ['curl', '-sf', 'http://127.0.0.1:9743/healthz'])).code === 0, 20_000, 'the daemon to start');
  // Capture on the LB's interface every frame whose source is the VIP: replies that crossed the LB.
  const capture = lab.spawn(lab.lb, ['tcpdump', '-i', 'eth0', '-nn', '-l', '-q', '--immediate-mode', 'tcp', 'and', 'src', 'host', lab.vip], { stdio: ['ignore', 'pipe', 'pipe'] });
  let viaLbFrames = 0;
  let viaLbBytes = 0;
  capture.stdout!.on('data', (chunk: Buffer) => {
    for (const line of chunk.toString().split('\n')) {
      const m = /length (\d+)/.exec(line);
      if (m) {
        viaLbFrames++;
        viaLbBytes += Number(m[1]);
      }
    }
  });
  await new Promise((r) => setTimeout(r, 1000));
  say(`dsrlb demo: ${opts.requests} HTTP requests from ${lab.client.ipv4} to http://${lab.vip}/, one connection each...`);
  const run = await lab.exec(lab.client, [process.execPath, resolve(repoRoot, 'dist/lab/http-client.js'), '--host', lab.vip, '--count', String(opts.requests)], { timeoutMs: 120_000 });
  await new Promise((r) => setTimeout(r, 500));
  capture.kill('SIGTERM');
  if (run.code !== 0) throw new Error(`http client failed: ${run.stderr.trim()}`);
  const result = JSON.parse(run.stdout.trim().split('\n').pop()!) as { ok: number; failed: number; byReal: Record<string, number> };
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
  say(`  TCP frames from ${lab.vip} (replies) seen on the LB's interface: ${viaLbFrames}, ${viaLbBytes} bytes`);
  say(viaLbFrames === 0 ? '  -> zero response bytes crossed the LB: the reals answered the client directly (DSR).' : '  -> some replies crossed the LB!');
  say('');
  say('Try it yourself:');
  say(`  ip netns exec ${lab.client.ns} curl -s http://${lab.vip}/`);
  say(`  ip netns exec ${lab.lb.ns} ${resolve(repoRoot, 'bin/dsrlb.js')} status -c ${configPath}`);
  say(`  ip netns exec ${lab.lb.ns} curl -s http://127.0.0.1:9742/metrics | grep ^dsrlb_`);
  say('  npx dsrlb demo --down     # removes the lab');
  // The lab stays up: let its processes run on without holding this command open.
  for (const child of lab.httpServers.values()) {
    child.stdout?.destroy();
    child.stderr?.destroy();
    child.unref();
  }
  return result.failed === 0 && viaLbFrames === 0 ? 0 : 2;
}

export async function demoDown(opts: { quiet?: boolean } = {}): Promise<number> {
  try {
    const pid = Number(await readFile(`${RUN_DIR}/dsrlb.pid`, 'utf8'));
    if (pid > 0) {
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
  await destroyLabsWithPrefix(PREFIX);
  await rm(RUN_DIR, { recursive: true, force: true });
  if (!opts.quiet) say('dsrlb demo: removed');
  return 0;
}
