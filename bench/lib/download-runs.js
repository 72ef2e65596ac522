// Download runs: the client fetches 10 MiB objects over one keep-alive connection (curl) from
// the real directly, through HAProxy, or through dsrlb; machine busy time, the LB core's busy time
// and the LB process's thread time are taken over the whole transfer.

import { foreignTime, ksoftirqdPids, machineBusy, reapedChildrenSeconds, secondsPerGB, takeSample, threadTime } from './cpu-accounting.js';
import { HTTP_PORT } from './bench-lab.js';

export const OBJECT_BYTES = 10 * 1024 * 1024;

/**
 * @param {{ lab: any }} bl
 * @param {{ host: string, objects: number, pids?: number[], serverPids?: number[], timeoutS?: number, clientCpu?: number, lbCpu?: number }} o
 * pids: the LB process (its threads are timed); serverPids: other processes of ours (the HTTP server);
 * clientCpu: the CPU curl runs on (taskset); lbCpu: the CPU whose busy time is the LB core's.
 */
export async function downloadRun(bl, o) {
  const { lab } = bl;
  const url = `http://${o.host}:${HTTP_PORT}/bytes/${OBJECT_BYTES}?n=[1-${o.objects}]`;
  const pin = o.clientCpu === undefined ? [] : ['taskset', '-c', String(o.clientCpu)];
  const argv = [...pin, 'curl', '-s', '-o', '/dev/null', '--max-time', String(o.timeoutS ?? 300), '-w', '%{http_code} %{size_download}\\n', url];
  const own = [...(o.pids ?? []), ...(o.serverPids ?? [])];
  // Method B's tasks: the LB's threads, the HTTP server, ksoftirqd, and curl (a child we reap).
  const tasks = [...own, ...ksoftirqdPids()];
  const a = takeSample(tasks, { allProcesses: true });
  const curl0 = reapedChildrenSeconds();
  const r = await lab.exec(lab.client, argv, { timeoutMs: ((o.timeoutS ?? 300) + 30) * 1000 });
  const curlS = reapedChildrenSeconds() - curl0;
  const b = takeSample(tasks, { allProcesses: true });
  let bytes = 0;
  let ok = 0;
  for (const line of r.stdout.trim().split('\n')) {
    const [code, size] = line.split(' ');
    if (code === '200') ok++;
    bytes += Number(size) || 0;
  }
  if (r.code !== 0 || ok !== o.objects) {
    throw new Error(`download from ${o.host}: curl exit ${r.code}, ${ok}/${o.objects} objects: ${r.stderr.trim()} ${r.stdout.slice(0, 200)}`);
  }
  const busy = machineBusy(a, b);
  const all = threadTime(a, b);
  const lbPids = new Set(o.pids ?? []);
  const lbThreads = all.threads.filter((t) => lbPids.has(t.pid));
  const threads = {
    totalS: lbThreads.reduce((sum, t) => sum + t.seconds, 0),
    mainS: lbThreads.filter((t) => t.main).reduce((sum, t) => sum + t.seconds, 0),
    threads: lbThreads,
  };
  const tasksS = all.totalS + curlS;
  // curl is a child of `ip netns exec`, which this process reaps: it is ours, not foreign.
  const foreign = foreignTime(a, b, own);
  const busyS = Math.max(0, busy.busyS - foreign.seconds);
  const lbCoreBusyS = o.lbCpu === undefined ? null : (busy.perCpu.find((c) => c.id === o.lbCpu)?.busyS ?? null);
  return {
    host: o.host,
    objects: o.objects,
    bytes,
    seconds: busy.wallS,
    megabytesPerSecond: bytes / 1e6 / busy.wallS,
    busyS,
    cores: busyS / busy.wallS,
    machineBusyS: busy.busyS,
    foreignS: foreign.seconds,
    foreignTop: foreign.top,
    busySecondsPerGB: secondsPerGB(busyS, bytes),
    lbCoreBusyS,
    tasksS,
    tasksSecondsPerGB: secondsPerGB(tasksS, bytes),
    processS: threads.totalS,
    processSecondsPerGB: secondsPerGB(threads.totalS, bytes),
    processMainS: threads.mainS,
    threads: threads.threads.slice(0, 4),
  };
}
