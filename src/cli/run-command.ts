// `dsrlb run -c FILE`: the daemon in the foreground, JSON logs on stdout, SIGHUP reloads,
// SIGTERM/SIGINT stop cleanly and undo the host changes.

import type { Server } from 'node:http';
import { formatProblems } from '../config/validate.js';
import { Daemon, DaemonError } from '../control/daemon.js';
import { startAdminServer, startMetricsServer } from '../control/http-servers.js';
import { createLogger } from '../control/logger.js';

export async function runDaemon(configPath: string): Promise<number> {
  const log = createLogger();
  const daemon = new Daemon(configPath, log);
  const servers: Server[] = [];
  let stopping = false;
  const stop = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    log.info('stopping', { signal });
    for (const s of servers) s.close();
    await daemon.stop().catch((e: Error) => log.error('stop failed', { error: e.message }));
    process.exit(0);
  };
  let code = 0;
  try {
    await daemon.start();
    servers.push(await startMetricsServer(daemon));
    servers.push(await startAdminServer(daemon));
  } catch (err) {
    if (err instanceof DaemonError && err.problems.length > 0) {
      process.stderr.write(formatProblems(err.problems) + '\n');
      log.error('refusing to start', { code: err.code, problems: err.problems.map((p) => `${p.path}: ${p.message}`) });
      code = 1;
    } else {
      const e = err as Error & { code?: string };
      process.stderr.write(`dsrlb: ${e.message}\n`);
      log.error('refusing to start', { code: e.code ?? 'ERROR', error: e.message });
      code = 2;
    }
  }
  if (code !== 0) {
    // Undo only what this start did (a running daemon's host state is not ours), then exit:
    // a loop worker or socket left behind must not keep a refused daemon hanging.
    for (const s of servers) s.close();
    await daemon.stop({ startFailed: true }).catch((e: Error) => log.error('stop failed', { error: e.message }));
    process.exit(code);
  }
  process.on('SIGHUP', () => {
    log.info('SIGHUP: reloading');
    void daemon.reload();
  });
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
  log.info('ready', {
    metrics: `${daemon.config.metrics.listen.host}:${daemon.config.metrics.listen.port}`,
    admin: `${daemon.config.admin.listen.host}:${daemon.config.admin.listen.port}`,
  });
  return new Promise<number>(() => undefined); // runs until a signal
}
