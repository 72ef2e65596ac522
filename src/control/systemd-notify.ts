// systemd's notification protocol (sd_notify(3)) for `dsrlb run` under Type=notify: READY=1 once
// the daemon forwards and serves its APIs, STOPPING=1 when it begins to stop, and WATCHDOG=1
// every half WatchdogSec while the packet loops are healthy. A daemon whose main thread hangs (or
// whose loops stall) stops pinging, systemd kills and restarts it, and its VIP devices close with
// it: BIRD withdraws its routes. Off when $NOTIFY_SOCKET is unset (not under systemd).

import { loadNative } from '../io/native-binding.js';
import type { Logger } from './logger.js';

/** Sends one notification: 0 or -errno. */
export type NotifySender = (socketPath: string, state: string) => number;

export class SystemdNotifier {
  private readonly socket: string | null;
  private readonly watchdogMs: number | null;
  private timer: NodeJS.Timeout | null = null;
  private failed = false;

  constructor(
    private readonly log: Logger,
    env: NodeJS.ProcessEnv = process.env,
    private readonly send: NotifySender = (path, state) => loadNative().sdNotify(path, state),
  ) {
    this.socket = env['NOTIFY_SOCKET'] || null;
    // WATCHDOG_PID, when set, names the process meant (sd_watchdog_enabled(3)).
    const usec = Number(env['WATCHDOG_USEC']);
    const forUs = env['WATCHDOG_PID'] === undefined || Number(env['WATCHDOG_PID']) === process.pid;
    this.watchdogMs = this.socket !== null && forUs && Number.isFinite(usec) && usec > 0 ? usec / 1000 : null;
  }

  /** The daemon runs: its loops forward and its servers listen. */
  ready(): void {
    this.notify('READY=1');
  }

  stopping(): void {
    this.stopWatchdog();
    this.notify('STOPPING=1');
  }

  /** Pings every half watchdog interval while `healthy()` says so (nothing without WatchdogSec). */
  startWatchdog(healthy: () => boolean): void {
    if (this.watchdogMs === null || this.timer !== null) return;
    this.timer = setInterval(() => {
      if (healthy()) this.notify('WATCHDOG=1');
    }, this.watchdogMs / 2);
    this.timer.unref();
  }

  private stopWatchdog(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  private notify(state: string): void {
    if (this.socket === null) return;
    const rc = this.send(this.socket, state);
    // Said once: a watchdog ping that cannot be sent would otherwise log twice per interval.
    if (rc < 0 && !this.failed) this.log.warn('cannot notify systemd', { socket: this.socket, state, errno: -rc });
    this.failed = rc < 0;
  }
}
