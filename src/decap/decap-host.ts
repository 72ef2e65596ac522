// What `dsrlb decap` changes on the real server, and undoes on exit: a TUN device (IFF_TUN |
// IFF_NO_PI) brought up with rp_filter 0, net.ipv4.conf.all.rp_filter 0 (the kernel applies
// max(all, dev), and the inner source routes out of another interface), and IPv6 enabled on the
// device. No nftables rule is needed: an open raw socket for protocol 4/41 already stops the
// kernel's protocol-unreachable answers, and an input-hook drop would hide the packets from it.
// As the daemon does, a run-state record in /run/dsrlb keeps the operator's value of each
// host-wide sysctl before it is changed, so that a decap started after one that was killed
// (SIGKILL, OOM) takes the operator's value from it, not the 0 the dead one left.

import { closeSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { readRunRecord, runRecordPath, RUN_DIR, systemRunner, writeRunRecord, type CommandRunner } from '../control/host-setup.js';
import type { Logger } from '../control/logger.js';
import { loadNative } from '../io/native-binding.js';

/** Reads and writes /proc/sys values; injectable so the undo logic runs in unit tests. */
export interface SysctlAccess {
  /** The value, or undefined when the key does not exist. */
  read(key: string): string | undefined;
  write(key: string, value: string): void;
}

/** Keys are sysctl names with slashes: "net/ipv4/conf/all/rp_filter". */
export const procSysctl: SysctlAccess = {
  read: (key) => {
    const path = `/proc/sys/${key}`;
    return existsSync(path) ? readFileSync(path, 'utf8').trim() : undefined;
  },
  write: (key, value) => writeFileSync(`/proc/sys/${key}`, `${value}\n`),
};

/** Opens a TUN device by name and closes it; the native addon in production. */
export interface TunOpener {
  open(name: string): { fd: number; name: string };
  close(fd: number): void;
}

export const nativeTunOpener: TunOpener = {
  open: (name) => loadNative().openTun(name),
  close: (fd) => closeSync(fd),
};

interface ChangedSysctl {
  key: string;
  previous: string;
  setTo: string;
}

/** The run-state record: every host-wide sysctl decap changed, with the operator's value. */
interface DecapRecord {
  sysctls: ChangedSysctl[];
}

/** The one host-wide sysctl decap changes (the kernel applies max(all, dev)); the TUN device's own go with it. */
const ALL_RP_FILTER = 'net/ipv4/conf/all/rp_filter';

/**
 * Each sysctl a record may name, with the values it may hold: only what setUp records (restore),
 * as setUp writes and reads it (rp_filter: 0 off, 1 strict, 2 loose; Documentation/networking/
 * ip-sysctl.rst). A record names a /proc/sys path that tearDown writes as root when decap runs by
 * hand: taken unchecked, one a compromised service wrote set kernel/core_pattern, or with `../`
 * wrote any file.
 */
const RECORDED_SYSCTLS: ReadonlyMap<string, RegExp> = new Map([[ALL_RP_FILTER, /^[0-2]$/]]);

/** A record's entry that names a sysctl decap records, with values it may hold. */
function isRecordedSysctl(entry: unknown): entry is ChangedSysctl {
  if (typeof entry !== 'object' || entry === null) return false;
  const { key, previous, setTo } = entry as Partial<Record<keyof ChangedSysctl, unknown>>;
  const values = typeof key === 'string' ? RECORDED_SYSCTLS.get(key) : undefined;
  return values !== undefined && typeof previous === 'string' && values.test(previous) && typeof setTo === 'string' && values.test(setTo);
}

export class DecapHost {
  private tun: { fd: number; name: string } | undefined;
  private readonly changed: ChangedSysctl[] = [];
  /** "key=value (was v)" of every sysctl setUp wrote, for its log line. */
  private readonly applied: string[] = [];
  private readonly recordPath: string;
  /** A record is (or may be) at recordPath: ours, or the one adopted. */
  private recordKept = false;

  constructor(
    private readonly log: Logger,
    private readonly runner: CommandRunner = systemRunner,
    private readonly sysctl: SysctlAccess = procSysctl,
    private readonly tunOpener: TunOpener = nativeTunOpener,
    runDir = RUN_DIR,
  ) {
    this.recordPath = runRecordPath(runDir, 'decap');
  }

  /**
   * Adopts the record a previous decap in this network namespace left: with the instance lock
   * held, one there is from a decap that died without undoing its changes. Each sysctl still as it
   * set it is put back to the operator's value at tearDown (and keeps it when setUp sets it again);
   * one changed since is the operator's now, and left. Only a record this user wrote is read
   * (readRunRecord), and from it only the sysctls decap records (RECORDED_SYSCTLS).
   */
  async adopt(): Promise<void> {
    const prev = await readRunRecord<{ sysctls?: unknown }>(this.recordPath, this.log);
    if (prev === null || !Array.isArray(prev.sysctls)) return;
    this.recordKept = true;
    const left: string[] = [];
    for (const change of prev.sysctls as unknown[]) {
      if (!isRecordedSysctl(change)) {
        this.log.warn('ignored an entry of the decap record that names no sysctl decap changes, or a value it never writes', {
          path: this.recordPath,
          entry: JSON.stringify(change).slice(0, 200),
        });
        continue;
      }
      if (this.sysctl.read(change.key) === change.setTo) this.changed.push({ key: change.key, previous: change.previous, setTo: change.setTo });
      else left.push(change.key.replaceAll('/', '.'));
    }
    this.log.info('adopted the record of a decap that did not stop: its sysctls go back to the values before it at stop', {
      sysctls: this.changed.map((c) => `${c.key.replaceAll('/', '.')}=${c.setTo} (was ${c.previous})`),
      ...(left.length > 0 ? { changedSince: left } : {}),
    });
  }

  /** The open TUN device's fd and name (after setUp). */
  get device(): { fd: number; name: string } {
    if (this.tun === undefined) throw new Error('DecapHost.setUp() has not run');
    return this.tun;
  }

  /** Creates the TUN device and makes the kernel accept what is written to it. Undo with tearDown(). */
  async setUp(tunName: string, ipv6: boolean): Promise<{ fd: number; name: string }> {
    this.tun = this.tunOpener.open(tunName);
    const name = this.tun.name;
    // Without IFF_UP the kernel refuses every write; no address is needed to receive.
    await this.runner(['ip', 'link', 'set', 'dev', name, 'up']);
    await this.set(`net/ipv4/conf/${name}/rp_filter`, '0', false);
    await this.set(ALL_RP_FILTER, '0', true);
    if (ipv6) await this.set(`net/ipv6/conf/${name}/disable_ipv6`, '0', false);
    this.log.info('decap tun device up', { tun: name, changedSysctls: this.applied.splice(0) });
    return this.tun;
  }

  /** Restores the host-wide sysctls it changed (unless changed since) and removes the TUN device. */
  tearDown(): void {
    for (const change of this.changed.splice(0).reverse()) {
      try {
        const current = this.sysctl.read(change.key);
        if (current === change.setTo) this.sysctl.write(change.key, change.previous);
        else this.log.warn('left a sysctl changed since decap set it', { key: change.key, value: current });
      } catch (err) {
        this.log.error('cannot restore sysctl', { key: change.key, value: change.previous, error: (err as Error).message });
      }
    }
    if (this.recordKept) {
      this.recordKept = false;
      try {
        rmSync(this.recordPath, { force: true });
      } catch (err) {
        this.log.warn('cannot remove the record of the sysctls decap changed', { path: this.recordPath, error: (err as Error).message });
      }
    }
    if (this.tun !== undefined) {
      const { fd, name } = this.tun;
      this.tun = undefined;
      // The device goes with its last fd, and with it its own sysctls.
      this.tunOpener.close(fd);
      this.log.info('decap tun device removed', { tun: name });
    }
  }

  /**
   * Sets key to value; `restore` records the old value for tearDown (per-device keys die with the
   * device), in the run-state record first. An adopted change of the key keeps the operator's value.
   */
  private async set(key: string, value: string, restore: boolean): Promise<void> {
    const previous = this.sysctl.read(key);
    if (previous === undefined) throw new Error(`sysctl ${key.replaceAll('/', '.')} does not exist`);
    if (previous === value) return;
    const before = [...this.changed];
    if (restore) {
      const adopted = this.changed.findIndex((c) => c.key === key);
      const change = { key, previous: adopted >= 0 ? this.changed[adopted]!.previous : previous, setTo: value };
      if (adopted >= 0) this.changed[adopted] = change;
      else this.changed.push(change);
      await this.saveRecord();
    }
    try {
      this.sysctl.write(key, value);
    } catch (err) {
      // Not changed: nothing of it to put back (the record goes at tearDown).
      this.changed.splice(0, this.changed.length, ...before);
      throw err;
    }
    this.applied.push(`${key.replaceAll('/', '.')}=${value} (was ${previous})`);
  }

  /**
   * The record of the changes, before they are made. One that cannot be written (a read-only /run)
   * stops nothing: decap works, but a decap killed without stopping would lose the operator's values.
   */
  private async saveRecord(): Promise<void> {
    const record: DecapRecord = { sysctls: this.changed };
    try {
      await writeRunRecord(this.recordPath, record);
      this.recordKept = true;
    } catch (err) {
      this.log.warn("cannot write the record of the sysctls decap changes: if decap is killed (not stopped), the values before it are lost", {
        path: this.recordPath,
        error: (err as Error).message,
      });
    }
  }
}
