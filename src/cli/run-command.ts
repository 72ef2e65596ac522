// `dsrlb run -c FILE`: the daemon in the foreground, JSON logs on stdout, SIGHUP reloads,
// SIGTERM/SIGINT stop cleanly and undo the host changes, also when they arrive during start.

import type { Config } from '../config/types.js';
import { formatProblems, problemLines } from '../config/validate.js';
import { Daemon, DaemonError } from '../control/daemon.js';
import { startAdminServer, startMetricsServer } from '../control/http-servers.js';
import { createLogger, type Logger } from '../control/logger.js';
import { SystemdNotifier } from '../control/systemd-notify.js';

/** What the supervisor needs of the daemon (Daemon; a fake in tests). */
export interface SupervisedDaemon {
  readonly config: Config;
  start(): Promise<void>;
  stop(opts?: { startFailed?: boolean }): Promise<void>;
  reload(): Promise<unknown>;
  /** Set by the supervisor: a packet loop ended by itself and could not be started again. */
  onLoopLost: ((reason: string) => void) | null;
  /** The packet loops forward (or one is being started again): what keeps systemd's watchdog fed. */
  healthy(): boolean;
}

/** What the supervisor tells the service manager (SystemdNotifier; a fake in tests). */
export interface ServiceNotifier {
  ready(): void;
  stopping(): void;
  startWatchdog(healthy: () => boolean): void;
}

export interface SupervisorDeps {
  readonly daemon: SupervisedDaemon;
  readonly log: Logger;
  /** Started in order after the daemon; each one started is closed on the way out. */
  readonly servers: readonly (() => Promise<{ close(): unknown }>)[];
  /** Where SIGTERM, SIGINT and SIGHUP arrive (process). */
  readonly signals: { on(signal: 'SIGTERM' | 'SIGINT' | 'SIGHUP', listener: () => void): unknown };
  readonly exit: (code: number) => void;
  readonly stderr: (text: string) => void;
  readonly notifier?: ServiceNotifier;
}

export async function runDaemon(configPath: string): Promise<number> {
  const log = createLogger();
  const daemon = new Daemon(configPath, log);
  return superviseDaemon({
    daemon,
    log,
    servers: [() => startMetricsServer(daemon), () => startAdminServer(daemon)],
    signals: process,
    exit: (code) => process.exit(code),
    stderr: (text) => process.stderr.write(text),
    notifier: new SystemdNotifier(log),
  });
}

/**
 * Starts the daemon and its servers and stops them on a signal. The signal handlers are in place
 * before start: a SIGTERM/SIGINT during start (the default action would kill the process with its
 * VIPs and nftables table left behind) waits for start to end, then undoes and exits as after a
 * clean run; a SIGHUP during start reloads once started. Resolves only on a refused start (in
 * tests, where exit returns); in production exit ends the process first.
 */
export async function superviseDaemon(deps: SupervisorDeps): Promise<number> {
  const { daemon, log } = deps;
  const servers: { close(): unknown }[] = [];
  let phase: 'starting' | 'running' | 'stopping' = 'starting';
  let stopSignal: string | null = null;
  let reloadPending = false;
  const stop = async (signal: string, code = 0): Promise<number> => {
    phase = 'stopping';
    deps.notifier?.stopping();
    log.info('stopping', { signal });
    for (const s of servers) s.close();
    await daemon.stop().catch((e: Error) => log.error('stop failed', { error: e.message }));
    deps.exit(code);
    return code;
  };
  // A packet loop the loop group could not start again (it ended too often, or its replacement
  // failed) leaves the VIPs dropped at the host with nothing forwarding them: stop whole and exit 2,
  // so that systemd's Restart=on-failure starts a daemon whose every loop runs. A loss while start
  // still runs (after the loops were ready) is acted on once start has ended; one while stopping is
  // expected.
  let lostDuringStart: string | null = null;
  const onLoopLost = (reason: string): void => {
    log.error('a packet loop ended: stopping so that the supervisor restarts dsrlb', { reason });
    void stop('packet loop lost', 2);
  };
  daemon.onLoopLost = (reason) => {
    if (phase === 'running') onLoopLost(reason);
    else if (phase === 'starting') lostDuringStart ??= reason;
  };
  const onStop = (signal: string): void => {
    if (phase === 'running') void stop(signal);
    else if (phase === 'starting' && stopSignal === null) {
      stopSignal = signal;
      log.info('stop requested during start: stopping once start has ended', { signal });
    }
  };
  deps.signals.on('SIGTERM', () => onStop('SIGTERM'));
  deps.signals.on('SIGINT', () => onStop('SIGINT'));
  // A reload that throws (not one refused: that is an answer) is logged; unhandled, the rejection
  // would end the daemon and its packet loop.
  const reloadOnSignal = (): void => {
    daemon.reload().catch((err: Error) => log.error('reload failed', { error: err.message }));
  };
  deps.signals.on('SIGHUP', () => {
    if (phase === 'running') {
      log.info('SIGHUP: reloading');
      reloadOnSignal();
    } else if (phase === 'starting') {
      reloadPending = true;
      log.info('SIGHUP during start: reloading once started');
    }
  });

  let code = 0;
  try {
    await daemon.start();
    for (const start of deps.servers) servers.push(await start());
  } catch (err) {
    if (err instanceof DaemonError && err.problems.length > 0) {
      deps.stderr(formatProblems(err.problems) + '\n');
      log.error('refusing to start', { code: err.code, problems: problemLines(err.problems) });
      code = err.refusedBy === 'system' ? 2 : 1;
    } else {
      const e = err as Error & { code?: string };
      deps.stderr(`dsrlb: ${e.message}\n`);
      log.error('refusing to start', { code: e.code ?? 'ERROR', error: e.message });
      code = 2;
    }
  }
  if (code !== 0) {
    // Undo only what this start did (a running daemon's host state is not ours), then exit:
    // a loop worker or socket left behind must not keep a refused daemon hanging.
    phase = 'stopping';
    for (const s of servers) s.close();
    await daemon.stop({ startFailed: true }).catch((e: Error) => log.error('stop failed', { error: e.message }));
    deps.exit(code);
    return code;
  }
  phase = 'running';
  if (stopSignal !== null) return stop(stopSignal);
  if (lostDuringStart !== null) {
    onLoopLost(lostDuringStart);
    return 2;
  }
  if (reloadPending) {
    log.info('SIGHUP: reloading');
    reloadOnSignal();
  }
  log.info('ready', {
    metrics: `${daemon.config.metrics.listen.host}:${daemon.config.metrics.listen.port}`,
    admin: `${daemon.config.admin.listen.host}:${daemon.config.admin.listen.port}`,
  });
  deps.notifier?.ready();
  deps.notifier?.startWatchdog(() => daemon.healthy());
  return new Promise<number>(() => undefined); // runs until a signal
}
