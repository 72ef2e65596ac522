// VIP announcement for scale-out behind ECMP, through BIRD (dsrlb never speaks BGP). Per VIP the
// daemon holds a non-persistent TUN device open and BIRD exports `route VIP via "<tun>"` from a
// static protocol with `check link on` (lab-facts: the fastest withdrawal measured, 3-4 ms): the
// device is up (IFF_UP) while the VIP should be announced and down otherwise, and a crash closes
// the fd, which deletes the device and withdraws the route without anyone's help (a "dead man's
// switch"). Up and down, not the carrier: the kernel tells BIRD of an administrative change at
// once, but of a carrier change only through its link watch, up to a second later when any link
// of the host changed in the last second (a withdrawal on stop then outlasted withdrawDelay).

import { closeSync, constants } from 'node:fs';
import { mkdir, open, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { stringHash } from '../dataplane/flow-hash.js';
import { monotonicMs } from '../dataplane/monotonic-clock.js';
import { loadNative } from '../io/native-binding.js';
import { openWithoutFollowing, systemRunner, writeFileAside, type CommandRunner } from './host-setup.js';
import type { Logger } from './logger.js';

/** The TUN device of a VIP: stable across restarts and LBs, so BIRD configs can name it. */
export function announceDeviceName(vip: string): string {
  return `dsv${stringHash(vip, 0x5eed).toString(16).padStart(8, '0')}`;
}

/** The BIRD snippet for a set of VIPs: one static protocol per family, routes via their devices. */
export function birdRoutes(vips: readonly string[]): string {
  const block = (proto: string, channel: string, list: readonly string[], prefix: number): string[] => [
    `protocol static ${proto} {`,
    `  ${channel};`,
    '  check link on;',
    ...list.map((v) => `  route ${v}/${prefix} via "${announceDeviceName(v)}";`),
    '}',
  ];
  return [
    '# Written by dsrlb (announce.routesFile): the VIPs this LB may announce. Do not edit.',
    ...block('dsrlb_v4', 'ipv4', vips.filter((v) => !v.includes(':')), 32),
    ...block('dsrlb_v6', 'ipv6', vips.filter((v) => v.includes(':')), 128),
    '',
  ].join('\n');
}

/**
 * Replaces `file` with `text` (through a file aside and a rename: writeFileAside) unless it holds
 * it already; true when it was written. The file is 0644 whatever the umask (and a directory made
 * for it 0755): BIRD reads it as its own user (`bird` on Debian) and the packaged unit runs dsrlb
 * with UMask=0027. Its directory (/run/dsrlb) is the service user's: nothing there is followed
 * through a symlink, as root runs by hand write it too.
 */
export async function writeRoutesFile(file: string, text: string): Promise<boolean> {
  if ((await currentRoutesText(file)) === text) return false;
  // Directories made here are 0755 as well: under the umask a 0750 one hides the file from BIRD.
  const made = await mkdir(dirname(file), { recursive: true });
  if (made !== undefined) await chmodDirectoriesMade(made, dirname(file));
  await writeFileAside(file, text, 0o644);
  return true;
}

/** The routes file's text, or null when it is missing, unreadable or not a regular file (a symlink is not followed). */
async function currentRoutesText(file: string): Promise<string | null> {
  const fh = await openWithoutFollowing(file).catch(() => null);
  if (fh === null) return null;
  try {
    return (await fh.stat()).isFile() ? await fh.readFile('utf8') : null;
  } catch {
    return null;
  } finally {
    await fh.close().catch(() => undefined);
  }
}

/**
 * Sets 0755 on each directory mkdir made, `made` down to `deepest`, through an fd: each is opened
 * without following a symlink (O_NOFOLLOW, O_DIRECTORY) and must be this process's, so one swapped
 * for a symlink after mkdir (its parent may be another user's) is never a chmod of its target.
 */
async function chmodDirectoriesMade(made: string, deepest: string): Promise<void> {
  const dirs: string[] = [];
  for (let d = deepest; d.startsWith(made); d = dirname(d)) dirs.unshift(d);
  const euid = process.geteuid!();
  for (const d of dirs) {
    const fh = await open(d, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      const { uid } = await fh.stat();
      if (uid !== euid) throw new Error(`${d}, made for the routes file, belongs to uid ${uid}, not to this process (uid ${euid}): not made 0755`);
      await fh.chmod(0o755);
    } finally {
      await fh.close();
    }
  }
}

interface Gate {
  readonly name: string;
  readonly fd: number;
  /** IFF_UP as last set: the VIP is announced while it is up. */
  up: boolean;
}

/** The TUN calls the announcer makes: the native addon, or a fake in tests. */
export interface TunControl {
  open(name: string): { name: string; fd: number };
  /** IFF_UP on or off. */
  setUp(name: string, up: boolean): void;
  close(fd: number): void;
}

const nativeTun: TunControl = {
  open: (name) => loadNative().openTun(name),
  setUp: (name, up) => loadNative().linkSetUp(name, up),
  close: (fd) => closeSync(fd),
};

/** Failure keys that are not a VIP's (the others are VIPs, and go with their VIP). */
const BIRD_FAILURE_KEYS: ReadonlySet<string> = new Set(['routes', 'birdc', 'bird-include']);

/** How often a failed `birdc configure` is tried again while the routes file is newer than BIRD's view. */
const BIRDC_RETRY_MS = 5000;

export class VipAnnouncer {
  private readonly gates = new Map<string, Gate>();
  /** The routes file does not list exactly the open gates yet (a write failed, or the file moved). */
  private routesStale = false;
  /**
   * BIRD has not been told of the last routes file (birdc failed); when it was last tried. True
   * at first: a routes file left by a daemon before this one (/run/dsrlb outlives a restart) is
   * not written again when its text is the same, and BIRD may never have read it (that daemon's
   * birdc failed, e.g. before the dsrlb user was in the bird group).
   */
  private birdStale = true;
  private birdTriedMs = -Infinity;
  /**
   * BIRD took `configure` but has no dsrlb_v4/dsrlb_v6 protocol: its config does not include the
   * routes file (another path, a typo). Nothing is announced then, whatever the devices say.
   */
  private birdLacksRoutes = false;
  /** The last protocols check failed or found them missing: it is asked again every BIRDC_RETRY_MS. */
  private birdUnchecked = false;
  /** The last failure said per VIP (or 'routes', 'birdc', 'bird-include'): each is logged once, and once when it ends. */
  private readonly failures = new Map<string, string>();
  /** withdrawAll ran (a stop): no sync sets a device up after it, one waiting on birdc included. */
  private withdrawn = false;
  /** The routes file a reload moved away from, removed once the new one is written. */
  private oldRoutesFile: string | null = null;

  constructor(
    private readonly log: Logger,
    private routesFile: string,
    private birdSocket: string | null,
    private readonly runner: CommandRunner = systemRunner,
    private readonly tun: TunControl = nativeTun,
    /** The birdc retry clock: monotonic, so a step of the system time neither stops nor hurries it. */
    private readonly nowMs: () => number = monotonicMs,
  ) {}

  /**
   * A reload's routesFile and birdSocket: a new file is written at the next sync, and the old one
   * removed (left, BIRD still read it through its include and the protocols check passed, while
   * the new file BIRD does not include went unread).
   */
  setFiles(routesFile: string, birdSocket: string | null): void {
    if (routesFile !== this.routesFile || birdSocket !== this.birdSocket) this.routesStale = true;
    // The first file moved away from: one moved to and never written (the write failed) holds nothing.
    if (routesFile !== this.routesFile) this.oldRoutesFile ??= this.routesFile;
    // A new BIRD must read the file even where its text is unchanged (no write, so no configure otherwise).
    if (birdSocket !== this.birdSocket && birdSocket !== null) {
      this.birdStale = true;
      this.birdTriedMs = -Infinity;
    }
    this.routesFile = routesFile;
    this.birdSocket = birdSocket;
  }

  deviceOf(vip: string): string | null {
    return this.gates.get(vip)?.name ?? null;
  }

  isAnnounced(vip: string): boolean {
    return this.gates.get(vip)?.up === true && !this.birdLacksRoutes;
  }

  /**
   * Make the gates match `wanted` (VIP -> announce now?): open/close devices, set them up or down. A VIP
   * whose device cannot be made is left out (logged, tried again at the next sync); the others go
   * on. Never throws: every failure is logged once and retried.
   */
  async sync(wanted: ReadonlyMap<string, boolean>): Promise<void> {
    for (const vip of wanted.keys()) {
      if (this.gates.has(vip)) continue;
      const gate = await this.openGate(vip);
      if (gate === null) continue;
      this.gates.set(vip, gate);
      this.routesStale = true;
    }
    for (const [vip, gate] of [...this.gates]) {
      if (wanted.has(vip)) continue;
      this.closeFd(gate.fd);
      this.gates.delete(vip);
      this.routesStale = true;
      this.log.info('VIP no longer announced: device closed', { vip, device: gate.name });
    }
    // A VIP no longer wanted has no failure left to report.
    for (const key of [...this.failures.keys()]) if (!BIRD_FAILURE_KEYS.has(key) && !wanted.has(key)) this.failures.delete(key);
    if (this.routesStale) await this.writeRoutes();
    if (this.birdStale && this.nowMs() - this.birdTriedMs >= BIRDC_RETRY_MS) await this.tellBird();
    // BIRD lacked the protocols (or could not be asked): ask again, so a fixed include is seen
    // without waiting for the next change of VIPs.
    else if (this.birdUnchecked && this.nowMs() - this.birdTriedMs >= BIRDC_RETRY_MS) await this.checkBirdProtocols();
    for (const [vip, want] of wanted) {
      const on = want && !this.withdrawn;
      const gate = this.gates.get(vip);
      if (gate === undefined || gate.up === on) continue;
      try {
        this.tun.setUp(gate.name, on);
      } catch (err) {
        this.failed(vip, `setting ${gate.name} ${on ? 'up' : 'down'}: ${(err as Error).message}`);
        continue;
      }
      gate.up = on;
      this.succeeded(vip);
      this.log[on ? 'info' : 'warn'](on ? 'VIP announced' : 'VIP withdrawn', { vip, device: gate.name });
    }
  }

  /** Every device down for good (a clean stop), at once; the devices stay open until close(). */
  async withdrawAll(): Promise<void> {
    this.withdrawn = true;
    for (const [vip, gate] of this.gates) {
      if (!gate.up) continue;
      try {
        this.tun.setUp(gate.name, false);
      } catch {
        // the device is gone already: nothing to announce either
      }
      gate.up = false;
      this.log.warn('VIP withdrawn', { vip, device: gate.name });
    }
  }

  close(): void {
    for (const gate of this.gates.values()) this.closeFd(gate.fd);
    this.gates.clear();
  }

  /**
   * A VIP's device, down (as a new TUN is: BIRD routes nothing through it until sync sets it up);
   * null (logged) when it cannot be made, nothing left open.
   */
  private async openGate(vip: string): Promise<Gate | null> {
    let fd = -1;
    try {
      const tun = this.tun.open(announceDeviceName(vip));
      fd = tun.fd;
      this.succeeded(vip);
      return { name: tun.name, fd, up: false };
    } catch (err) {
      // Closing the fd deletes the half-made device; the next sync starts again.
      if (fd >= 0) this.closeFd(fd);
      this.failed(vip, `making its announce device: ${(err as Error).message}`);
      return null;
    }
  }

  private closeFd(fd: number): void {
    try {
      this.tun.close(fd);
    } catch {
      // already closed
    }
  }

  private async writeRoutes(): Promise<void> {
    const vips = [...this.gates.keys()];
    let written: boolean;
    try {
      written = await writeRoutesFile(this.routesFile, birdRoutes(vips));
    } catch (err) {
      this.failed('routes', `writing the BIRD routes file ${this.routesFile}: ${(err as Error).message}`);
      return;
    }
    this.succeeded('routes');
    this.routesStale = false;
    if (this.oldRoutesFile !== null && this.oldRoutesFile !== this.routesFile) {
      await unlink(this.oldRoutesFile).catch(() => undefined);
      this.log.info('BIRD routes file moved: the old one removed', { old: this.oldRoutesFile, file: this.routesFile });
      written = true;
    }
    this.oldRoutesFile = null;
    if (!written) return;
    this.log.info('BIRD routes file written', { file: this.routesFile, vips });
    await this.tellBird();
  }

  /** `birdc configure`: BIRD reads the routes file again. A failure is retried every BIRDC_RETRY_MS. */
  private async tellBird(): Promise<void> {
    if (!this.birdSocket) {
      this.birdStale = false;
      return;
    }
    this.birdTriedMs = this.nowMs();
    try {
      await this.runner(['birdc', '-s', this.birdSocket, 'configure']);
      this.birdStale = false;
      this.succeeded('birdc');
    } catch (err) {
      this.birdStale = true;
      this.failed('birdc', `birdc configure (socket ${this.birdSocket}): ${(err as Error).message}`);
      return;
    }
    await this.checkBirdProtocols();
  }

  /**
   * After a configure: does BIRD have the routes file's protocols? The include is a glob that
   * matches nothing when it names another path, which BIRD takes silently: without this check the
   * daemon would call its VIPs announced while BIRD announces nothing.
   */
  private async checkBirdProtocols(): Promise<void> {
    if (!this.birdSocket) return;
    this.birdTriedMs = this.nowMs();
    this.birdUnchecked = true;
    let listed: string;
    try {
      listed = (await this.runner(['birdc', '-s', this.birdSocket, 'show', 'protocols'])).stdout;
    } catch (err) {
      this.failed('birdc', `birdc show protocols (socket ${this.birdSocket}): ${(err as Error).message}`);
      return;
    }
    this.succeeded('birdc');
    const missing = ['dsrlb_v4', 'dsrlb_v6'].filter((p) => !new RegExp(`^${p}\\s`, 'm').test(listed));
    this.birdLacksRoutes = missing.length > 0;
    this.birdUnchecked = this.birdLacksRoutes;
    if (this.birdLacksRoutes) {
      this.failed('bird-include', `BIRD has no protocol ${missing.join(' or ')} after configure: its config does not include announce.routesFile (${this.routesFile}); nothing is announced`);
    } else {
      this.succeeded('bird-include');
    }
  }

  private failed(what: string, message: string): void {
    if (this.failures.get(what) === message) return;
    this.failures.set(what, message);
    this.log.error('announcement update failed', { what, error: message });
  }

  private succeeded(what: string): void {
    if (!this.failures.delete(what)) return;
    this.log.info('announcement update works again', { what });
  }
}
