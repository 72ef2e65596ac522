// What `dsrlb run` can check about the host before it changes anything there: the listen
// addresses can be bound and the configured CPUs are ones this process may run on. Found only
// later (after the VIPs, the nftables table and the loops were up), these failed the start after
// host changes, without the config path, and a unit with Restart=on-failure repeated that.

import { createServer } from 'node:net';
import { readFile } from 'node:fs/promises';
import type { Config, ConfigProblem } from '../config/types.js';
import { DaemonError } from './daemon-error.js';

/** Binds each listen address once and lets it go; a problem per address that cannot be bound. */
export async function listenProblems(config: Pick<Config, 'metrics' | 'admin'>): Promise<{ problems: ConfigProblem[]; byConfig: boolean }> {
  const problems: ConfigProblem[] = [];
  let byConfig = false;
  for (const [path, at] of [['metrics.listen', config.metrics.listen], ['admin.listen', config.admin.listen]] as const) {
    const error = await new Promise<NodeJS.ErrnoException | null>((resolve) => {
      const server = createServer();
      server.once('error', resolve);
      server.listen({ port: at.port, host: at.host, exclusive: true }, () => server.close(() => resolve(null)));
    });
    if (error === null) continue;
    const where = at.host.includes(':') ? `[${at.host}]:${at.port}` : `${at.host}:${at.port}`;
    // Not an address of this host: the config's mistake. In use or not allowed: the system's.
    if (error.code === 'EADDRNOTAVAIL') {
      byConfig = true;
      problems.push({ path, message: `${where}: ${at.host} is not an address of this host` });
    } else {
      problems.push({ path, message: `${where} cannot be bound: ${error.code ?? error.message}${error.code === 'EADDRINUSE' ? ' (another process listens there)' : ''}` });
    }
  }
  return { problems, byConfig };
}

/** CPU numbers of a list such as "0-3,8,10-11" (/proc/self/status Cpus_allowed_list). */
export function parseCpuList(text: string): Set<number> {
  const out = new Set<number>();
  for (const part of text.trim().split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) continue;
    for (let c = Number(m[1]); c <= Number(m[2] ?? m[1]); c++) out.add(c);
  }
  return out;
}

/**
 * A problem per `cpus` entry a loop would run on (loop i on cpus[i % length], `workers` loops) that
 * this process may not run on (its affinity mask and cpuset). Entries no loop uses are not asked.
 */
export function cpuProblems(config: Pick<Config, 'cpus' | 'workers'>, allowedList: string): ConfigProblem[] {
  const allowed = parseCpuList(allowedList);
  if (allowed.size === 0) return [];
  const used = Math.min(config.cpus.length, Math.max(config.workers, 1));
  return config.cpus.slice(0, used).flatMap((cpu, i) => (allowed.has(cpu) ? [] : [{ path: `cpus[${i}]`, message: `CPU ${cpu} is not one this process may run on (${allowedList.trim()})` }]));
}

/** Both checks; throws a DaemonError naming every problem (exit 1; 2 when only the system refused, as a port in use). */
export async function checkHostBeforeChanges(config: Config): Promise<void> {
  const status = await readFile('/proc/self/status', 'utf8').catch(() => '');
  const allowed = /^Cpus_allowed_list:\s*(.*)$/m.exec(status)?.[1] ?? '';
  const cpus = config.io === 'afpacket' ? cpuProblems(config, allowed) : [];
  const listen = await listenProblems(config);
  const problems = [...cpus, ...listen.problems];
  if (problems.length > 0) {
    throw new DaemonError('HOST_NOT_READY', 'the host cannot run this config', problems, cpus.length > 0 || listen.byConfig ? 'config' : 'system');
  }
}
