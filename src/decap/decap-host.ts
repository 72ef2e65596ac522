// What `dsrlb decap` changes on the real server, and undoes on exit: a TUN device (IFF_TUN |
// IFF_NO_PI) brought up with rp_filter 0, net.ipv4.conf.all.rp_filter 0 (the kernel applies
// max(all, dev), and the inner source routes out of another interface), and IPv6 enabled on the
// device. No nftables rule is needed: an open raw socket for protocol 4/41 already stops the
// kernel's protocol-unreachable answers, and an input-hook drop would hide the packets from it.

import { closeSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { systemRunner, type CommandRunner } from '../control/host-setup.js';
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

export class DecapHost {
  private tun: { fd: number; name: string } | undefined;
  private readonly changed: ChangedSysctl[] = [];
  /** "key=value (was v)" of every sysctl setUp wrote, for its log line. */
  private readonly applied: string[] = [];

  constructor(
    private readonly log: Logger,
    private readonly runner: CommandRunner = systemRunner,
    private readonly sysctl: SysctlAccess = procSysctl,
    private readonly tunOpener: TunOpener = nativeTunOpener,
  ) {}

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
    this.set(`net/ipv4/conf/${name}/rp_filter`, '0', false);
    this.set('net/ipv4/conf/all/rp_filter', '0', true);
    if (ipv6) this.set(`net/ipv6/conf/${name}/disable_ipv6`, '0', false);
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
    if (this.tun !== undefined) {
      const { fd, name } = this.tun;
      this.tun = undefined;
      // The device goes with its last fd, and with it its own sysctls.
      this.tunOpener.close(fd);
      this.log.info('decap tun device removed', { tun: name });
    }
  }

  /** Sets key to value; `restore` records the old value for tearDown (per-device keys die with the device). */
  private set(key: string, value: string, restore: boolean): void {
    const previous = this.sysctl.read(key);
    if (previous === undefined) throw new Error(`sysctl ${key.replaceAll('/', '.')} does not exist`);
    if (previous === value) return;
    this.sysctl.write(key, value);
    this.applied.push(`${key.replaceAll('/', '.')}=${value} (was ${previous})`);
    if (restore) this.changed.push({ key, previous, setTo: value });
  }
}
