// Run inside a fresh network namespace (root) that holds the veth pair lb0 (10.200.0.1) / inj0, by
// test/integration/fanout-group.test.ts: two packet loops (the built LoopGroup in dist/, as the
// daemon runs it) on lb0, while another program (fanout-peer.py) has its own PACKET_FANOUT group
// there under the id that dsrlb used to take, (pid & 0xfffe) + 1, with the same type and flags.
// Floods of COUNT frames from inj0 show who took them:
//   1. after the start: our loops take every frame once between them, the other group all of them;
//   2. after one loop's worker is terminated and started again: the same, the new loop with a share
//      (it joined our group, not a group of its own nor the other program's);
//   3. after lb0 is deleted and made again (every loop ends): the same, in a group with a new id.
// Prints one JSON line; every number the test checks is in it.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { execFile } from 'node:child_process';

const run = promisify(execFile);
const dist = new URL('../../dist/', import.meta.url);
const { LoopGroup } = await import(new URL('control/loop-group.js', dist).href);
const { createLogger } = await import(new URL('control/logger.js', dist).href);
const { Counter, MAX_REAL_IDS } = await import(new URL('dataplane/counters.js', dist).href);

const PEER = join(import.meta.dirname, 'fanout-peer.py');
const COUNT = Number(process.argv[2] ?? 20000);
const PACKET_FANOUT_HASH = 0;
const PACKET_FANOUT_FLAG_IGNORE_OUTGOING = 0x4000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A LoopGroup that keeps every loop's settings (its counters stay readable after it ended). */
class WatchedLoops extends LoopGroup {
  workers = [];
  settings = [];
  createWorker(settings) {
    const w = super.createWorker(settings);
    this.workers.push(w);
    this.settings.push(settings);
    return w;
  }
}

/** The other program: one packet socket in its own fanout group `groupId` on lb0. */
async function otherProgram(groupId) {
  const child = spawn('python3', [PEER, 'member', 'lb0', String(groupId), String(PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_IGNORE_OUTGOING)], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = (await lines.next()).value;
  if (first !== 'ready') throw new Error(`the other program could not make fanout group ${groupId}: ${first}`);
  return {
    /** Frames its socket took since it joined. */
    async taken() {
      child.stdin.write('\n');
      return Number((await lines.next()).value);
    },
    stop: () => child.kill(),
  };
}

async function macOf(ifname) {
  const { stdout } = await run('ip', ['-j', 'link', 'show', ifname]);
  return JSON.parse(stdout)[0].address;
}

async function flood() {
  const { stdout } = await run('python3', [PEER, 'flood', 'inj0', String(COUNT), await macOf('lb0'), '10.200.0.1']);
  if (Number(stdout.trim()) !== COUNT) throw new Error(`flood sent ${stdout}`);
}

/** Frames each loop (by the order they were started) took, kernel drops included. */
function takenByLoop(g) {
  return g.settings.map((s) => s.counters[Counter.rxPackets] + s.counters[Counter.rxKernelDrops]);
}

async function until(what, cond, ms = 10_000) {
  for (const end = Date.now() + ms; !cond(); await sleep(20)) if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
}

/** One flood: what each loop and the other program took of it. */
async function measure(g, other) {
  const loopsBefore = takenByLoop(g);
  const otherBefore = await other.taken();
  await flood();
  // The loops read the frames within a wake-up or two (a V3 block is handed over after 1 ms), on
  // cores shared with other work: wait for them all, then a little longer for any frame seen twice.
  const delta = () => takenByLoop(g).reduce((sum, n, i) => sum + n - (loopsBefore[i] ?? 0), 0);
  await until('the loops to read the flood', () => delta() >= COUNT, 5_000).catch(() => undefined);
  await sleep(300);
  const loops = takenByLoop(g).map((n, i) => n - (loopsBefore[i] ?? 0));
  return { loops, ours: loops.reduce((a, b) => a + b, 0), other: (await other.taken()) - otherBefore, groupId: g.fanoutGroupId ?? null };
}

const oldId = (process.pid & 0xfffe) + 1;
const other = await otherProgram(oldId);
const logged = [];
const g = new WatchedLoops(createLogger((line) => void logged.push(line)));
const lost = [];
g.onLost = (reason) => void lost.push(reason);
const timeouts = { synMs: 30_000, establishedMs: 300_000, finMs: 30_000, closeMs: 10_000, udpMs: 60_000 };
const result = { count: COUNT, otherGroupId: oldId };
try {
  await g.start({ io: 'afpacket', ring: 'v3', interface: 'lb0', flowCapacity: 4096, timeouts, maxRealIds: MAX_REAL_IDS }, 2);
  result.started = await measure(g, other);

  await g.workers[0].terminate();
  await until('the loop started again', () => g.workers.length === 3 && g.running);
  result.restarted = await measure(g, other);

  // Every loop ends (its socket bound to an interface that is gone) and is started again.
  other.stop();
  await run('ip', ['link', 'del', 'lb0']);
  await run('ip', ['link', 'add', 'lb0', 'type', 'veth', 'peer', 'name', 'inj0']);
  await run('ip', ['addr', 'add', '10.200.0.1/24', 'dev', 'lb0']);
  await run('ip', ['link', 'set', 'lb0', 'up']);
  await run('ip', ['link', 'set', 'inj0', 'up']);
  await until('both loops started again', () => g.workers.length === 5 && g.running, 15_000);
  const otherAgain = await otherProgram(oldId);
  result.recreated = await measure(g, otherAgain);
  otherAgain.stop();
  result.restarts = g.restarts;
} catch (err) {
  result.error = err.message;
} finally {
  other.stop();
  await g.stop(2000);
}
result.lost = lost;
result.logged = logged.filter((l) => !l.includes('"level":"info"') || l.includes('fanout'));
console.log(JSON.stringify(result));
