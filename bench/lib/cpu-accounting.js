// CPU accounting for the benchmark: machine busy time from the precise idle counters of /proc/stat,
// per-thread run time from /proc/<pid>/task/*/schedstat, and the per-packet / per-GB arithmetic
// (including the differential "LB CPU": forwarder run minus generator+sink alone at the same rate).
//
// Why idle and not the busy columns: on this kernel (NO_HZ_IDLE, no IRQ_TIME_ACCOUNTING) user,
// system and softirq are sampled at each tick and miss timer-driven work, while idle and iowait come
// from the nohz idle entry/exit timestamps (get_cpu_idle_time_us), which are exact.

import { readdirSync, readFileSync } from 'node:fs';

/** USER_HZ: /proc/stat counts in these units; 100 on every Linux ABI that matters. */
export const USER_HZ = 100;

/**
 * Parses the per-CPU lines of /proc/stat.
 * @param {string} text
 * @returns {{ id: number, user: number, nice: number, system: number, idle: number, iowait: number, irq: number, softirq: number, steal: number }[]}
 */
export function parseProcStat(text) {
  const cpus = [];
  for (const line of text.split('\n')) {
    const m = /^cpu(\d+)\s+(.*)$/.exec(line);
    if (!m) continue;
    const v = m[2].trim().split(/\s+/).map(Number);
    cpus.push({
      id: Number(m[1]),
      user: v[0] ?? 0,
      nice: v[1] ?? 0,
      system: v[2] ?? 0,
      idle: v[3] ?? 0,
      iowait: v[4] ?? 0,
      irq: v[5] ?? 0,
      softirq: v[6] ?? 0,
      steal: v[7] ?? 0,
    });
  }
  return cpus;
}

/**
 * First field of a schedstat file: nanoseconds the task ran on a CPU (sum_exec_runtime, exact).
 * @param {string} text
 * @returns {number}
 */
export function parseSchedstat(text) {
  const first = text.trim().split(/\s+/)[0];
  const ns = Number(first);
  return Number.isFinite(ns) ? ns : 0;
}

/** PF_KTHREAD in /proc/<pid>/stat flags: a kernel thread (ksoftirqd, kworker). */
const PF_KTHREAD = 0x00200000;

/**
 * The fields of /proc/<pid>/stat the accounting needs. utime + stime add up to the process's exact
 * run time (the kernel scales the tick-sampled split to sum_exec_runtime), in 1/USER_HZ units;
 * cutime + cstime hold the children it has reaped.
 * @param {string} text
 */
export function parseProcPidStat(text) {
  const close = text.lastIndexOf(')');
  const open = text.indexOf('(');
  if (open < 0 || close < open) return null;
  const f = text.slice(close + 2).split(' ');
  // f[0] is field 3 (state): field n is f[n - 3].
  const num = (n) => Number(f[n - 3]);
  return {
    pid: Number(text.slice(0, open).trim()),
    comm: text.slice(open + 1, close),
    ppid: num(4),
    kernelThread: (num(9) & PF_KTHREAD) !== 0,
    ticks: num(14) + num(15),
    childTicks: num(16) + num(17),
  };
}

/** Every process's run time (ticks), for telling other people's work from ours. */
function readAllProcesses() {
  /** @type {Record<string, { ticks: number, childTicks: number, kernelThread: boolean, comm: string, ppid: number }>} */
  const procs = {};
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const p = parseProcPidStat(readFileSync(`/proc/${name}/stat`, 'utf8'));
      if (p) procs[name] = { ticks: p.ticks, childTicks: p.childTicks, kernelThread: p.kernelThread, comm: p.comm, ppid: p.ppid };
    } catch {
      // exited while we looked
    }
  }
  return procs;
}

/**
 * A CPU sample: wall clock and /proc/stat, the threads of the given processes (exact run time from
 * schedstat) and, when asked, every process's run time.
 * @param {readonly number[]} [pids]
 * @param {{ allProcesses?: boolean }} [opts]
 * @returns {import('./cpu-accounting.js').CpuSample}
 */
export function takeSample(pids = [], opts = {}) {
  const statText = readFileSync('/proc/stat', 'utf8');
  const wallNs = Number(process.hrtime.bigint());
  /** @type {Record<string, number>} */
  const threads = {};
  for (const pid of pids) {
    let tids = [];
    try {
      tids = readdirSync(`/proc/${pid}/task`);
    } catch {
      continue; // the process is gone
    }
    for (const tid of tids) {
      try {
        const ns = parseSchedstat(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8'));
        const comm = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
        threads[`${pid}/${tid}/${comm}`] = ns;
      } catch {
        // the thread ended between readdir and read
      }
    }
  }
  return { wallNs, cpus: parseProcStat(statText), threads, procs: opts.allProcesses ? readAllProcesses() : null };
}

/**
 * CPU seconds that user-space processes other than `own` (and this one) used between two samples:
 * other people's work on a shared machine. Kernel threads are left out (softirq work pushed to
 * ksoftirqd belongs to the traffic). A process's counters include the children it reaped; a child
 * that was alive at the first sample and was reaped since brings its whole life into its parent's
 * counters, so what it had used by the first sample is taken off again. A process that started and
 * ended between the samples is seen only through its parent.
 * @param {import('./cpu-accounting.js').CpuSample} a
 * @param {import('./cpu-accounting.js').CpuSample} b
 * @param {readonly number[]} own
 * @param {number} [userHz]
 */
export function foreignTime(a, b, own, userHz = USER_HZ) {
  if (!a.procs || !b.procs) return { seconds: 0, top: [] };
  const ours = new Set([...own.map(String), String(process.pid)]);
  const foreignPid = (pid, p) => !p.kernelThread && !ours.has(pid);
  // Children reaped since the first sample: what they had used by then is not this interval's.
  /** @type {Map<string, number>} */
  const reapedBefore = new Map();
  const vanished = (pid) => a.procs[pid] !== undefined && b.procs[pid] === undefined;
  for (const [pid, pa] of Object.entries(a.procs)) {
    if (b.procs[pid]) continue;
    // To the first ancestor still there: a parent reaped too (bash -> npm -> node, npm and node
    // gone) passed its child's counts up with its own, and a correction filed under it was lost,
    // which charged the survivor the child's whole life (foreign time above the machine's busy).
    let up = String(pa.ppid);
    for (let hops = 0; hops < 64 && vanished(up); hops++) up = String(a.procs[up].ppid);
    reapedBefore.set(up, (reapedBefore.get(up) ?? 0) + pa.ticks + pa.childTicks);
  }
  // No process can have used more than every CPU for the whole interval (guards pid reuse).
  const capTicks = ((b.wallNs - a.wallNs) / 1e9) * b.cpus.length * userHz;
  let ticks = 0;
  const top = [];
  for (const [pid, pb] of Object.entries(b.procs)) {
    if (!foreignPid(pid, pb)) continue;
    const pa = a.procs[pid];
    // Present in both: the difference (an exec keeps the counters); new: all of it, it started here.
    const total = pb.ticks + pb.childTicks;
    const before = pa && total >= pa.ticks + pa.childTicks ? pa.ticks + pa.childTicks : 0;
    const d = Math.min(capTicks, Math.max(0, total - before - (reapedBefore.get(pid) ?? 0)));
    if (d > 0) {
      ticks += d;
      top.push({ pid: Number(pid), comm: pb.comm, seconds: d / userHz });
    }
  }
  top.sort((x, y) => y.seconds - x.seconds);
  return { seconds: ticks / userHz, top: top.slice(0, 3) };
}

let ksoftirqd = null;
/** Pids of the ksoftirqd/N threads (softirq work the kernel deferred to a thread). */
export function ksoftirqdPids() {
  if (ksoftirqd) return ksoftirqd;
  ksoftirqd = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/comm`, 'utf8').startsWith('ksoftirqd/')) ksoftirqd.push(Number(name));
    } catch {
      // gone
    }
  }
  return ksoftirqd;
}

/** Run time of this process's reaped children (seconds, 1/USER_HZ resolution). */
export function reapedChildrenSeconds(userHz = USER_HZ) {
  const p = parseProcPidStat(readFileSync('/proc/self/stat', 'utf8'));
  return p ? p.childTicks / userHz : 0;
}

/**
 * Busy CPU seconds between two samples, summed over CPUs: wall time minus (idle + iowait).
 * @param {import('./cpu-accounting.js').CpuSample} a
 * @param {import('./cpu-accounting.js').CpuSample} b
 * @param {number} [userHz]
 */
export function machineBusy(a, b, userHz = USER_HZ) {
  const wallS = (b.wallNs - a.wallNs) / 1e9;
  let busyS = 0;
  let stealS = 0;
  let tickBusyS = 0;
  const perCpu = [];
  for (const cb of b.cpus) {
    const ca = a.cpus.find((c) => c.id === cb.id);
    if (!ca) continue;
    const idleS = (cb.idle - ca.idle + (cb.iowait - ca.iowait)) / userHz;
    // Never below 0 or above the wall time: the counters are quantised to 1/USER_HZ.
    const busy = Math.min(wallS, Math.max(0, wallS - idleS));
    busyS += busy;
    stealS += (cb.steal - ca.steal) / userHz;
    tickBusyS += (cb.user - ca.user + cb.nice - ca.nice + cb.system - ca.system + cb.irq - ca.irq + cb.softirq - ca.softirq) / userHz;
    perCpu.push({ id: cb.id, busyS: busy, softirqTickS: (cb.softirq - ca.softirq) / userHz });
  }
  return { wallS, busyS, cores: wallS > 0 ? busyS / wallS : 0, stealS, tickBusyS, perCpu };
}

/**
 * Run time of the sampled threads between two samples (seconds): the total, the main threads
 * (tid = pid) and every thread, busiest first (Node names all its threads "node": the busiest
 * other thread of dsrlb is its packet loop worker).
 * @param {import('./cpu-accounting.js').CpuSample} a
 * @param {import('./cpu-accounting.js').CpuSample} b
 */
export function threadTime(a, b) {
  let totalS = 0;
  let mainS = 0;
  const threads = [];
  for (const [key, ns] of Object.entries(b.threads)) {
    const before = a.threads[key];
    if (before === undefined) continue;
    const s = (ns - before) / 1e9;
    const [pid, tid, ...comm] = key.split('/');
    totalS += s;
    if (pid === tid) mainS += s;
    threads.push({ pid: Number(pid), tid: Number(tid), comm: comm.join('/'), main: pid === tid, seconds: s });
  }
  threads.sort((x, y) => y.seconds - x.seconds);
  return { totalS, mainS, threads };
}

/**
 * Microseconds of CPU per packet.
 * @param {number} cpuS
 * @param {number} packets
 */
export function usPerPacket(cpuS, packets) {
  return packets > 0 ? (cpuS * 1e6) / packets : NaN;
}

/**
 * The forwarder's share: CPU per packet of the run through it minus that of generator and sink alone
 * at the same paced rate (both whole-machine, so kernel work on either core is counted).
 * @param {number} withForwarderUs
 * @param {number} baselineUs
 */
export function differentialUs(withForwarderUs, baselineUs) {
  return withForwarderUs - baselineUs;
}

/**
 * CPU seconds per 10^9 bytes delivered.
 * @param {number} cpuS
 * @param {number} bytes
 */
export function secondsPerGB(cpuS, bytes) {
  return bytes > 0 ? (cpuS * 1e9) / bytes : NaN;
}

/**
 * Loss of a run as a fraction of what the generator sent.
 * @param {number} sent
 * @param {number} received
 */
export function lossFraction(sent, received) {
  if (sent <= 0) return 1;
  return Math.max(0, (sent - received) / sent);
}

/**
 * Median of a list of numbers (NaN for none; the mean of the middle two for an even count).
 * @param {number[]} values
 */
export function median(values) {
  const v = [...values].sort((a, b) => a - b);
  return v.length === 0 ? NaN : v.length % 2 === 1 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
}

/**
 * reference / subject for one field, within each round both were measured in, then the median of
 * those ratios (null when they share no round with positive values). Measured in turn, two
 * forwarders meet the same drift of the machine; a ratio of medians would mix rounds.
 * @param {{ round: number }[]} reference
 * @param {{ round: number }[]} subject
 * @param {string} field
 */
export function medianRoundRatio(reference, subject, field) {
  const ratios = roundRatios(reference, subject, field);
  return ratios.length > 0 ? median(ratios) : null;
}

/**
 * How many rounds medianRoundRatio used (a round whose differential came out non-positive, noise,
 * is left out: the report says so, since it moves the median).
 * @param {{ round: number }[]} reference
 * @param {{ round: number }[]} subject
 * @param {string} field
 */
export function roundRatioCount(reference, subject, field) {
  return roundRatios(reference, subject, field).length;
}

function roundRatios(reference, subject, field) {
  const ratios = [];
  for (const p of subject) {
    const q = reference.find((x) => x.round === p.round);
    if (q && q[field] > 0 && p[field] > 0) ratios.push(q[field] / p[field]);
  }
  return ratios;
}
