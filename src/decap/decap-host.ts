// What `dsrlb decap` changes on the real server, and undoes on exit: a TUN device (IFF_TUN |
// IFF_NO_PI), brought up, with IPv6 enabled on it and, for IPv4 VIPs, the IPv4 dummy address
// 192.0.0.8/32 (RFC 7600) in scope host and the device's own rp_filter at 2 (loose). Why: the
// kernel drops a packet that arrives on a device without an IPv4 address whenever rp_filter
// (max(all, dev)) is not 0 (__fib_validate_source, last_resort), and strict mode drops a tunnelled
// one anyway (the route back to the client leaves by another interface). Loose mode on a device
// with an address passes every source that has a route, whatever the operator's all.rp_filter:
// that one is never touched. Any address will do; not the VIP, which would then be a local
// address of the host by decap's doing, answered in ARP wherever arp_ignore is 0 (a real whose
// dsrlb-realserver setup was removed while decap ran). No nftables rule is needed: an open raw
// socket for protocol 4/41 already stops the kernel's protocol-unreachable answers, and an
// input-hook drop would hide the packets from it.
//
// Before 2026-12 decap set all.rp_filter to 0 and kept the operator's value in a run-state record
// in /run/dsrlb: one killed (SIGKILL, OOM) left the record and the 0. The next decap puts that value
// back at start (restoreDeadDecapRecord) and removes the record.

import { closeSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { readRunRecord, runRecordPath, RUN_DIR, systemRunner, type CommandRunner } from '../control/host-setup.js';
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

/** One host-wide change an earlier decap recorded: the operator's value (previous) and its own (setTo). */
interface ChangedSysctl {
  key: string;
  previous: string;
  setTo: string;
}

/** The one host-wide sysctl an earlier decap changed and recorded. */
const ALL_RP_FILTER = 'net/ipv4/conf/all/rp_filter';

/**
 * Each sysctl a record may name, with the values it may hold (rp_filter: 0 off, 1 strict, 2 loose;
 * Documentation/networking/ip-sysctl.rst). A record names a /proc/sys path that decap writes as
 * root when it runs by hand: taken unchecked, one a compromised service wrote set
 * kernel/core_pattern, or with `../` wrote any file.
 */
const RECORDED_SYSCTLS: ReadonlyMap<string, RegExp> = new Map([[ALL_RP_FILTER, /^[0-2]$/]]);

/** A record's entry that names a sysctl decap recorded, with values it may hold. */
function isRecordedSysctl(entry: unknown): entry is ChangedSysctl {
  if (typeof entry !== 'object' || entry === null) return false;
  const { key, previous, setTo } = entry as Partial<Record<keyof ChangedSysctl, unknown>>;
  const values = typeof key === 'string' ? RECORDED_SYSCTLS.get(key) : undefined;
  return values !== undefined && typeof previous === 'string' && values.test(previous) && typeof setTo === 'string' && values.test(setTo);
}

/** Loose reverse-path filtering: passes any source with a route, on a device with an IPv4 address. */
const RP_FILTER_LOOSE = '2';
/** The IPv4 dummy address (RFC 7600), scope host: the address loose rp_filter needs on the device. */
const DUMMY_ADDRESS = '192.0.0.8/32';

export class DecapHost {
  private tun: { fd: number; name: string } | undefined;
  /** setUp put DUMMY_ADDRESS on the device: tearDown takes it off a device that outlives decap. */
  private addedDummy = false;
  private readonly recordPath: string;

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
   * Puts back what an earlier decap in this network namespace recorded and did not undo: with the
   * instance lock held, a record there is from one that died. Each sysctl still at the value it set
   * goes back to the operator's; one changed since is the operator's now, and left. Only a record
   * this user wrote is read (readRunRecord), and from it only the sysctls decap recorded
   * (RECORDED_SYSCTLS). The record goes once nothing of it is left to put back.
   */
  async restoreDeadDecapRecord(): Promise<void> {
    const prev = await readRunRecord<{ sysctls?: unknown }>(this.recordPath, this.log);
    if (prev === null || !Array.isArray(prev.sysctls)) return;
    const restored: string[] = [];
    const left: string[] = [];
    let failed = false;
    for (const change of prev.sysctls as unknown[]) {
      if (!isRecordedSysctl(change)) {
        this.log.warn('ignored an entry of the decap record that names no sysctl decap changed, or a value it never wrote', {
          path: this.recordPath,
          entry: JSON.stringify(change).slice(0, 200),
        });
        continue;
      }
      const name = change.key.replaceAll('/', '.');
      if (this.sysctl.read(change.key) !== change.setTo) {
        left.push(name);
        continue;
      }
      try {
        this.sysctl.write(change.key, change.previous);
        restored.push(`${name}=${change.previous} (was ${change.setTo})`);
      } catch (err) {
        failed = true;
        this.log.error('cannot put back a sysctl an earlier decap changed', { key: name, value: change.previous, error: (err as Error).message });
      }
    }
    this.log.info('put back what an earlier decap that did not stop changed (this one changes no host-wide sysctl)', {
      sysctls: restored,
      ...(left.length > 0 ? { changedSince: left } : {}),
    });
    if (failed) return; // kept, for a later start to try again
    try {
      rmSync(this.recordPath, { force: true });
    } catch (err) {
      this.log.warn('cannot remove the record of an earlier decap', { path: this.recordPath, error: (err as Error).message });
    }
  }

  /** The open TUN device's fd and name (after setUp). */
  get device(): { fd: number; name: string } {
    if (this.tun === undefined) throw new Error('DecapHost.setUp() has not run');
    return this.tun;
  }

  /**
   * Creates the TUN device and makes the kernel accept what is written to it: up, IPv6 enabled for
   * IPv6 VIPs, and for IPv4 VIPs the dummy address with the device's rp_filter loose (see the top
   * of this file). Undo with tearDown().
   */
  async setUp(tunName: string, ipv6: boolean, ipv4: boolean): Promise<{ fd: number; name: string }> {
    this.tun = this.tunOpener.open(tunName);
    const name = this.tun.name;
    const applied: string[] = [];
    const addresses: string[] = [];
    if (ipv4) {
      // A persistent device of that name (decap attaches to it) may have an address of its own: any will do.
      const have = (await this.runner(['ip', '-4', '-o', 'addr', 'show', 'dev', name])).stdout.match(/(?<=\binet )\S+/g) ?? [];
      if (have.length === 0) {
        await this.runner(['ip', 'addr', 'add', DUMMY_ADDRESS, 'dev', name, 'scope', 'host']);
        this.addedDummy = true;
        addresses.push(DUMMY_ADDRESS);
      }
      this.setDevice(`net/ipv4/conf/${name}/rp_filter`, RP_FILTER_LOOSE, applied);
    }
    if (ipv6) this.setDevice(`net/ipv6/conf/${name}/disable_ipv6`, '0', applied);
    // Without IFF_UP the kernel refuses every write. Up last: whoever waits for the device to be up
    // (the unit's ExecStartPost, then dsrlb-realserver's check) finds it complete.
    await this.runner(['ip', 'link', 'set', 'dev', name, 'up']);
    this.log.info('decap tun device up', { tun: name, addedAddresses: addresses, changedSysctls: applied });
    return this.tun;
  }

  /**
   * Closes the TUN device, which removes it with everything set on it. A persistent device (made
   * with `ip tuntap add`) outlives decap: it loses the address setUp added, and keeps the sysctls
   * (rp_filter 2 and IPv6 on are what a device decapsulating into it needs anyway).
   */
  async tearDown(): Promise<void> {
    if (this.tun === undefined) return;
    const { fd, name } = this.tun;
    this.tun = undefined;
    this.tunOpener.close(fd);
    const added = this.addedDummy;
    this.addedDummy = false;
    if (added && (await this.runner(['ip', '-o', 'link', 'show', 'dev', name]).then(() => true, () => false))) {
      await this.runner(['ip', 'addr', 'del', DUMMY_ADDRESS, 'dev', name]).catch((err: Error) =>
        this.log.warn('cannot remove the address decap added to its TUN device', { tun: name, address: DUMMY_ADDRESS, error: err.message }),
      );
    }
    this.log.info('decap tun device removed', { tun: name });
  }

  /** Sets a sysctl of the device (it lives and goes with the device: nothing to record or undo). */
  private setDevice(key: string, value: string, applied: string[]): void {
    const previous = this.sysctl.read(key);
    if (previous === undefined) throw new Error(`sysctl ${key.replaceAll('/', '.')} does not exist`);
    if (previous === value) return;
    this.sysctl.write(key, value);
    applied.push(`${key.replaceAll('/', '.')}=${value} (was ${previous})`);
  }
}
