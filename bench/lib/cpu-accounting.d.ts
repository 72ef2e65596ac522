// Types of cpu-accounting.js (plain JavaScript so `npm run bench` needs no build step).

export declare const USER_HZ: number;

export interface ProcStatCpu {
  id: number;
  user: number;
  nice: number;
  system: number;
  idle: number;
  iowait: number;
  irq: number;
  softirq: number;
  steal: number;
}

export interface ProcessTicks {
  ticks: number;
  childTicks: number;
  kernelThread: boolean;
  comm: string;
  ppid: number;
}

export interface CpuSample {
  wallNs: number;
  cpus: ProcStatCpu[];
  /** "pid/tid/comm" -> nanoseconds run (schedstat). */
  threads: Record<string, number>;
  /** pid -> run time in 1/USER_HZ, when the sample was taken with allProcesses. */
  procs: Record<string, ProcessTicks> | null;
}

export interface ThreadTime {
  pid: number;
  tid: number;
  comm: string;
  main: boolean;
  seconds: number;
}

export declare function parseProcStat(text: string): ProcStatCpu[];
export declare function parseSchedstat(text: string): number;
export declare function parseProcPidStat(
  text: string,
): { pid: number; comm: string; ppid: number; kernelThread: boolean; ticks: number; childTicks: number } | null;
export declare function takeSample(pids?: readonly number[], opts?: { allProcesses?: boolean }): CpuSample;
export declare function machineBusy(
  a: CpuSample,
  b: CpuSample,
  userHz?: number,
): { wallS: number; busyS: number; cores: number; stealS: number; tickBusyS: number; perCpu: { id: number; busyS: number; softirqTickS: number }[] };
export declare function foreignTime(
  a: CpuSample,
  b: CpuSample,
  own: readonly number[],
  userHz?: number,
): { seconds: number; top: { pid: number; comm: string; seconds: number }[] };
export declare function threadTime(a: CpuSample, b: CpuSample): { totalS: number; mainS: number; threads: ThreadTime[] };
export declare function usPerPacket(cpuS: number, packets: number): number;
export declare function differentialUs(withForwarderUs: number, baselineUs: number): number;
export declare function secondsPerGB(cpuS: number, bytes: number): number;
export declare function lossFraction(sent: number, received: number): number;
export declare function ksoftirqdPids(): number[];
export declare function reapedChildrenSeconds(userHz?: number): number;
export declare function median(values: number[]): number;
export declare function medianRoundRatio<T extends { round: number }>(reference: T[], subject: T[], field: keyof T & string): number | null;
export declare function roundRatioCount<T extends { round: number }>(reference: T[], subject: T[], field: keyof T & string): number;
