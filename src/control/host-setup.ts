// What the daemon changes on the LB host, and undoes on stop: each IPv4 VIP on lo (so the kernel
// answers ARP for it), each IPv6 VIP on the interface itself, deprecated (preferred_lft 0: the
// kernel answers neighbour solicitations for it but never picks it as a source; proxy NDP would
// need IPv6 forwarding on), and an nftables table
// that drops IP to the VIPs at prerouting (raw) so the LB's own kernel never answers or
// resets VIP traffic while the packet socket still sees it (lab-facts: "Owning the VIP").
// While it holds IPv6 VIPs there it also sets net.ipv6.conf.<if>.keep_addr_on_down to 1: with the
// default 0, taking the interface down and up again (a carrier loss does not) removes every IPv6
// address of it, the VIPs too, and nothing would put them back (such a flap restarts no packet loop).
// A run-state file remembers what we added, so a restart after a crash adopts and later undoes it.
// Only one daemon per network namespace may hold these (instance-lock.ts sees to that, before
// anything here runs); a start that fails undoes only what its own process added.

import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants, statSync, type Stats } from 'node:fs';
import { lstat, mkdir, open, readFile, readdir, rename, rm, stat, unlink, writeFile, type FileHandle } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { DaemonError } from './daemon-error.js';
import type { Logger } from './logger.js';

/** Runs a host command; injectable so tests and simulate run without privileges. */
export type CommandRunner = (argv: readonly string[], stdin?: string) => Promise<{ stdout: string }>;

/**
 * How long a host command may take. None of ours (ip, nft, ethtool, birdc) takes more than a
 * fraction of a second; one that hangs (birdc on a wedged BIRD) must not hold the daemon's queue of
 * changes, nor its stop, for ever.
 */
export const COMMAND_TIMEOUT_MS = 10_000;

/** A CommandRunner that kills a command still running after timeoutMs. */
export function commandRunner(timeoutMs: number): CommandRunner {
  return (argv, stdin) =>
    new Promise((resolve, reject) => {
      const child = execFile(argv[0]!, argv.slice(1), { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
        if (!err) return resolve({ stdout });
        const timedOut = (err as { killed?: boolean }).killed === true;
        const why = timedOut ? `no answer within ${timeoutMs / 1000} s (killed)` : stderr.trim() || err.message;
        reject(new Error(`${argv.join(' ')}: ${why}`));
      });
      child.stdin!.end(stdin);
    });
}

export const systemRunner: CommandRunner = commandRunner(COMMAND_TIMEOUT_MS);

export const NFT_TABLE = 'dsrlb';

/** Where the daemon and `dsrlb decap` keep the records of what they changed on the host. */
export const RUN_DIR = '/run/dsrlb';

/**
 * The path of a run-state record: `${runDir}/${kind}-${netns inode}${suffix}.json`. /run is shared
 * by every network namespace, and each holds its own VIPs and sysctls: the name carries ours.
 */
export function runRecordPath(runDir: string, kind: string, suffix = ''): string {
  return `${runDir}/${kind}-${netnsInode()}${suffix}.json`;
}

/** The path of a lock file (instance-lock.ts): `${runDir}/${kind}-${netns inode}.lock`, per namespace as runRecordPath. */
export function runLockPath(runDir: string, kind: string): string {
  return `${runDir}/${kind}-${netnsInode()}.lock`;
}

function netnsInode(): number {
  return statSync('/proc/self/ns/net').ino;
}

/**
 * What to do about a host record another user's dsrlb left (HostSetup.refuseForeignRecord), said
 * for either owner: the service's daemon (root runs by hand after it crashed) or a root run (the
 * service starts after it crashed).
 */
async function foreignRecordProblem(record: { path: string; uid: number }): Promise<string> {
  const who = record.uid === 0 ? 'root' : `user ${(await userName(record.uid)) ?? '?'} (uid ${record.uid})`;
  const left = `${record.path} was left by dsrlb running as ${who}, which did not stop cleanly: its VIPs may still be on lo and its nftables table inet dsrlb in place. This run trusts no record another user wrote and changes nothing:`;
  return record.uid === 0
    ? `${left} run dsrlb as root once more (dsrlb run -c CONFIG) and stop it (Ctrl-C), which undoes them, then start this one`
    : `${left} start the service (systemctl start dsrlb), which takes them over, and stop it cleanly (systemctl stop dsrlb) before running dsrlb by hand`;
}

/** The name /etc/passwd gives `uid`, or null. */
async function userName(uid: number): Promise<string | null> {
  const passwd = await readFile('/etc/passwd', 'utf8').catch(() => '');
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f.length >= 3 && f[2] === String(uid)) return f[0]!;
  }
  return null;
}

/**
 * The record a previous run left at `path`, or null when there is none, it cannot be read, or it
 * is not this process's own: a regular file, not reached through a symlink, owned by the euid and
 * with no other name. Only its own, for root too: /run/dsrlb belongs to the service user, and a
 * root run (`dsrlb run` or `decap` by hand) that trusted a record that user wrote would let a
 * compromised daemon name the addresses, sysctls and files root then changes. So what the
 * service's daemon recorded is not undone by a root run but left to that daemon's own restart,
 * and the service never takes over a record root left. `log` is told why a record was ignored.
 */
export async function readRunRecord<T>(path: string, log?: Pick<Logger, 'warn'>): Promise<T | null> {
  let fh: FileHandle;
  try {
    fh = await openWithoutFollowing(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ELOOP') log?.warn('ignored a run-state record that is a symbolic link', { path });
    return null;
  }
  try {
    const st = await fh.stat();
    const why = whyNotOwnFile(st) ?? (st.nlink !== 1 ? `it has ${st.nlink} names (a hard link)` : null);
    if (why !== null) {
      log?.warn('ignored a run-state record this process did not write', { path, why });
      return null;
    }
    return JSON.parse(await fh.readFile('utf8')) as T;
  } catch {
    return null;
  } finally {
    await fh.close().catch(() => undefined);
  }
}

/** Writes a run-state record aside (0600) and renames it, so a crash never leaves half a record. */
export async function writeRunRecord(path: string, record: unknown): Promise<void> {
  await mkdir(path.slice(0, path.lastIndexOf('/')), { recursive: true });
  await writeFileAside(path, JSON.stringify(record), 0o600);
}

/**
 * Replaces `path` with `data` through a file beside it: a new random name made by this open
 * (O_EXCL, O_NOFOLLOW), given `mode` through its fd whatever the umask, renamed over `path`, and
 * removed if any step fails; with `sync`, flushed to disk before the rename; with
 * `directoryOwner`, given to the directory's owner when root writes it. Not a fixed `${path}.tmp`: in a directory another user may write
 * (/run/dsrlb is the service user's), a symlink planted at that name made root write through it
 * into any file. rename() replaces a symlink at `path` itself, never the file it points to.
 */
export async function writeFileAside(path: string, data: string | Uint8Array, mode: number, opts: { sync?: boolean; directoryOwner?: boolean } = {}): Promise<void> {
  const tmp = `${path}.${randomBytes(8).toString('hex')}.tmp`;
  const fh = await open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  try {
    try {
      await fh.writeFile(data);
      await fh.chmod(mode);
      // directoryOwner: root, run by hand, leaves the service's data (state, flows) to the
      // directory's owner (/var/lib/dsrlb is the service user's): root:root 0640 was unreadable
      // to the service, whose next start ran without the drains root had made.
      if (opts.directoryOwner === true && process.geteuid!() === 0) {
        const dir = await stat(dirname(path));
        if (dir.uid !== 0) await fh.chown(dir.uid, dir.gid);
      }
      // On disk before the rename (sync): a crash leaves the old file or the new one, never an empty one.
      if (opts.sync === true) await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
}

/**
 * Opens a file another user may have planted, for reading: a symlink at `path` is refused (ELOOP),
 * never followed, and a FIFO opens at once (O_NONBLOCK) instead of waiting for a writer. The
 * caller checks what it opened (fstat) before it reads.
 */
export function openWithoutFollowing(path: string): Promise<FileHandle> {
  return open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
}

/** Why a file (lstat or fstat) is not one this process may trust, or null: a regular file owned by its euid. */
export function whyNotOwnFile(st: Stats): string | null {
  if (st.isSymbolicLink()) return 'it is a symbolic link';
  if (!st.isFile()) return 'it is not a regular file';
  const euid = process.geteuid!();
  return st.uid === euid ? null : `it belongs to uid ${st.uid}, not to this process (uid ${euid})`;
}

interface HostState {
  interface: string;
  addedAddresses: string[]; // "VIP/32" (on lo) or "VIP/128" (on the interface)
  groDisabled: boolean;
  /** GRO and LRO as they were before groDisabled (LRO null: fixed, not ours to set); absent in older records. */
  offloadsBefore?: Offloads;
  /**
   * net.ipv6.conf.<if>.keep_addr_on_down as it was before we set it to 1 for our IPv6 VIPs;
   * absent when we did not set it (nothing to put back), as in records from before it was kept.
   */
  keepAddrOnDownBefore?: number;
}

/** Reads and writes kernel settings under /proc/sys; injectable so unit tests run without privileges. */
export interface Sysctl {
  /** The value, trimmed; null when there is no such setting (no IPv6 on this host or interface). */
  read(key: string): Promise<string | null>;
  write(key: string, value: string): Promise<void>;
}

/**
 * Sysctl on the files of /proc/sys, keys as paths below it (`net/ipv6/conf/eth0.100/...`): a VLAN
 * interface's dot stays as it is, where `sysctl`'s dotted key would want it written as a slash.
 * /proc/sys/net is the network namespace of the process that opens it: the daemon's own.
 */
export function procSysctl(root = '/proc/sys'): Sysctl {
  return {
    read: (key) =>
      readFile(`${root}/${key}`, 'utf8').then(
        (text) => text.trim(),
        (e: NodeJS.ErrnoException) => {
          if (e.code === 'ENOENT') return null;
          throw e;
        },
      ),
    write: (key, value) => writeFile(`${root}/${key}`, value),
  };
}

const KEEP_ADDR_ALL = 'net/ipv6/conf/all/keep_addr_on_down';

export interface Offloads {
  gro: boolean;
  lro: boolean | null;
}

/** GRO and LRO from `ethtool -k` output; a feature marked [fixed] (or missing) is null. */
export function parseOffloads(text: string): { gro: boolean | null; lro: boolean | null } {
  const feature = (name: string): boolean | null => {
    const m = new RegExp(`^${name}: (on|off)( \\[fixed\\])?$`, 'm').exec(text);
    return m && !m[2] ? m[1] === 'on' : null;
  };
  return { gro: feature('generic-receive-offload'), lro: feature('large-receive-offload') };
}

export class HostSetup {
  private state: HostState;
  private readonly statePath: string;
  /** What a crashed predecessor left (adopted), or null. */
  private adopted: HostState | null = null;
  /** Addresses this process added itself (a failed start removes only these). */
  private readonly ownAdded = new Set<string>();
  /** The VIPs the nftables table this process last loaded guards (empty: not known to be in place). */
  private rulesFor = new Set<string>();
  private ownGroDisabled = false;
  /** keepAddrOnDownBefore was recorded by this process (a failed start puts back only that). */
  private ownKeepAddrOnDown = false;

  constructor(
    private readonly ifname: string,
    private readonly log: Logger,
    private readonly runner: CommandRunner = systemRunner,
    private readonly runDir = RUN_DIR,
    private readonly sysctl: Sysctl = procSysctl(),
  ) {
    this.statePath = runRecordPath(runDir, 'host', `-${ifname}`);
    this.state = { interface: ifname, addedAddresses: [], groDisabled: false };
  }

  /**
   * Adopt what a previous run (that crashed) left behind, so stop() can undo it. A record it left
   * for another interface of this network namespace (the config's `interface` changed before this
   * start) is undone at once, as that run's stop would have: adopted by nobody, its VIPs stayed on
   * lo for good, and the kernel answered ARP and reset TCP for them.
   */
  async adopt(): Promise<void> {
    await this.refuseForeignRecord();
    const ours = basename(this.statePath);
    for (const { name, ifname } of await this.hostRecords()) {
      if (name === ours) continue;
      const left = new HostSetup(ifname, this.log, this.runner, this.runDir, this.sysctl);
      await left.adoptOwn();
      if (left.adopted === null) continue;
      this.log.warn('undoing the host changes a crashed run left on another interface', { interface: ifname, addresses: left.state.addedAddresses });
      // The table stays: it guards this interface's VIPs (a crashed run's, adopted next) too, until
      // apply replaces it.
      await left.undo({ keepTable: true });
    }
    await this.adoptOwn();
  }

  /**
   * Throws FOREIGN_HOST_RECORD when a host record of this network namespace (any interface) is
   * another user's: a dsrlb of theirs did not stop cleanly (the service user's, for a root run by
   * hand, or the other way round). Such a record is neither trusted (readRunRecord) nor written over
   * or removed, which would lose its VIPs for good: the daemon calls this before it changes anything.
   */
  async refuseForeignRecord(): Promise<void> {
    for (const { name } of await this.hostRecords()) {
      const path = `${this.runDir}/${name}`;
      const uid = await lstat(path).then((st) => st.uid, () => null);
      if (uid !== null && uid !== process.geteuid!()) throw new DaemonError('FOREIGN_HOST_RECORD', await foreignRecordProblem({ path, uid }), [], 'system');
    }
  }

  /** This network namespace's host records, whatever their interface (`host-<netns inode>-IF.json`). */
  private async hostRecords(): Promise<{ name: string; ifname: string }[]> {
    const prefix = basename(runRecordPath(this.runDir, 'host', '-'), '.json');
    const names = await readdir(this.runDir).catch(() => [] as string[]);
    return names.filter((n) => n.startsWith(prefix) && n.endsWith('.json')).map((name) => ({ name, ifname: name.slice(prefix.length, -'.json'.length) }));
  }

  /** The record of a crashed run on this interface, adopted (one of another user: see refuseForeignRecord). */
  private async adoptOwn(): Promise<void> {
    const prev = await readRunRecord<HostState>(this.statePath, this.log);
    if (prev === null || !Array.isArray(prev.addedAddresses)) return;
    this.state = { ...prev, addedAddresses: [...prev.addedAddresses], interface: this.ifname };
    this.adopted = prev;
    this.log.info('adopted host state from a previous run', { ...prev });
  }

  /** Make the host match this VIP set: add missing VIPs, remove ones we added that are gone. */
  async apply(vips: readonly string[], opts: { disableGro: boolean }): Promise<void> {
    const wanted = new Set(vips.map((v) => (v.includes(':') ? `${v}/128` : `${v}/32`)));
    const present = new Set([...(await this.addressesOn('lo')), ...(await this.addressesOn(this.ifname))]);
    const holdsV6 = [...wanted].some((cidr) => cidr.endsWith('/128'));
    // Before the IPv6 VIPs go on: a flap in between would take them away. Again on every apply: an
    // interface made again (a loop restart applies again) has its settings back at the defaults.
    if (holdsV6) await this.keepAddressesOnDown();
    // The drop rule goes on before a VIP and comes off after it: a VIP the kernel holds without
    // the rule is answered by the kernel itself, a RST to every connection the loop carries for
    // it (a restart under traffic reset them all) and to every SYN. One removed by this apply
    // keeps its rule until its address is gone.
    const toRemove = this.state.addedAddresses.filter((cidr) => !wanted.has(cidr));
    const guarded = [...vips, ...toRemove.map(withoutPrefix)];
    try {
      await this.loadRules(guarded);
    } catch (err) {
      // The table in place guards them all already (an interface made again, its VIPs to put
      // back): a failed nft must not keep them off it.
      if (!guarded.every((vip) => this.rulesFor.has(vip))) throw err;
      this.log.warn('could not load the nftables table; the one in place covers every VIP', { error: (err as Error).message });
    }
    // Recorded before they are added: a crash in between must not leave a VIP no record names.
    const toAdd = [...wanted].filter((cidr) => !present.has(cidr));
    // Added again (its interface was made again): recorded once.
    const unrecorded = toAdd.filter((cidr) => !this.state.addedAddresses.includes(cidr));
    if (unrecorded.length > 0) {
      this.state.addedAddresses.push(...unrecorded);
      await this.save();
    }
    for (const cidr of toAdd) {
      try {
        await this.runner(this.addressCommand('add', cidr));
      } catch (err) {
        // Not on the host: those recorded for this apply and not added go from the record again.
        const notAdded = new Set(unrecorded.filter((c) => !this.ownAdded.has(c)));
        this.state.addedAddresses = this.state.addedAddresses.filter((c) => !notAdded.has(c));
        await this.save().catch(() => undefined);
        throw err;
      }
      this.ownAdded.add(cidr);
      this.log.info('added VIP', { address: cidr, dev: this.devFor(cidr) });
    }
    const stuck: string[] = [];
    for (const cidr of toRemove) {
      if (!(await this.removeAddress(cidr))) {
        stuck.push(cidr);
        continue;
      }
      this.state.addedAddresses = this.state.addedAddresses.filter((a) => a !== cidr);
      this.ownAdded.delete(cidr);
      this.log.info('removed VIP', { address: cidr });
    }
    if (!holdsV6 && this.state.keepAddrOnDownBefore !== undefined) await this.restoreKeepAddrOnDown();
    if (toRemove.length > stuck.length) await this.loadRules([...vips, ...stuck.map(withoutPrefix)]);
    if (opts.disableGro && !this.state.groDisabled) {
      // libpcap gives no GSO metadata: keep the kernel from merging frames beyond the MTU. What
      // was set before is recorded, so stop puts it back as it was (GRO off stays off).
      const before = await this.runner(['ethtool', '-k', this.ifname]).then(
        (r) => parseOffloads(r.stdout),
        (e: Error) => {
          // Unknown: turn both off all the same, and put GRO back on at stop (the usual default).
          this.log.warn('could not read GRO/LRO', { error: e.message });
          return { gro: true, lro: true, unknown: true };
        },
      );
      const off = [...(before.gro === true ? ['gro', 'off'] : []), ...(before.lro === true ? ['lro', 'off'] : [])];
      if (off.length > 0) {
        await this.runner(['ethtool', '-K', this.ifname, ...off]).catch((e: Error) => this.log.warn('could not turn GRO/LRO off', { error: e.message }));
      }
      this.state.groDisabled = true;
      this.state.offloadsBefore = 'unknown' in before ? { gro: true, lro: null } : { gro: before.gro === true, lro: before.lro };
      this.ownGroDisabled = true;
    }
    await this.save();
  }

  /**
   * Whether the nftables table is in place: false when nft says it is not (someone flushed the
   * ruleset), null when nft could not tell (not run, timed out).
   */
  async dropTablePresent(): Promise<boolean | null> {
    // The table names only, read from stdout: nft's error text is in the locale's language.
    const listed = await this.runner(['nft', 'list', 'tables']).catch(() => null);
    if (listed === null) return null;
    const present = listed.stdout.split('\n').some((line) => line.trim() === `table inet ${NFT_TABLE}`);
    if (!present) this.rulesFor.clear();
    return present;
  }

  /** Undo everything this daemon (or a crashed predecessor) added. */
  async undo(opts: { keepTable?: boolean } = {}): Promise<void> {
    // The addresses first, then their drop rule (see apply). One that would not go keeps its rule
    // and its record, for the next start to remove.
    const stuck: string[] = [];
    for (const cidr of this.state.addedAddresses) if (!(await this.removeAddress(cidr))) stuck.push(cidr);
    if (stuck.length > 0) await this.loadRules(stuck.map(withoutPrefix)).catch(() => undefined);
    else if (opts.keepTable !== true) await this.runner(['nft', 'delete', 'table', 'inet', NFT_TABLE]).catch(() => undefined);
    if (opts.keepTable !== true || stuck.length > 0) this.rulesFor.clear();
    if (this.state.groDisabled) await this.restoreOffloads(this.state.offloadsBefore);
    if (this.state.keepAddrOnDownBefore !== undefined) await this.restoreKeepAddrOnDown();
    this.log.info('host changes undone', { addresses: this.state.addedAddresses.filter((c) => !stuck.includes(c)), ...(stuck.length > 0 ? { notRemoved: stuck } : {}) });
    this.ownAdded.clear();
    if (stuck.length > 0) {
      this.state = { interface: this.ifname, addedAddresses: stuck, groDisabled: false };
      await this.save().catch(() => undefined);
      return;
    }
    this.state = { interface: this.ifname, addedAddresses: [], groDisabled: false };
    await rm(this.statePath, { force: true });
  }

  /**
   * Removes one VIP address; false when it is still there afterwards (the del failed: a timeout,
   * EPERM), true when it is gone, also when it was gone before.
   */
  private async removeAddress(cidr: string): Promise<boolean> {
    const failed = await this.runner(this.addressCommand('del', cidr)).then(
      () => null,
      (err: Error) => err,
    );
    if (failed === null) return true;
    const still = await this.addressesOn(this.devFor(cidr)).then(
      (present) => present.has(cidr),
      () => true,
    );
    if (still) this.log.warn('could not remove a VIP: it stays, with its drop rule and in the record', { address: cidr, error: failed.message });
    return !still;
  }

  /** Replaces the nftables table with one guarding `vips`, and remembers what it guards. */
  private async loadRules(vips: readonly string[]): Promise<void> {
    await this.runner(['nft', '-f', '-'], nftRuleset(vips));
    this.rulesFor = new Set(vips);
  }

  /**
   * After a failed start: remove only what this process added. What a crashed predecessor left
   * stays as it was recorded (its VIPs, its nftables table), for the next start to adopt.
   */
  async undoOwn(): Promise<void> {
    // One that would not go stays guarded and recorded, as a crashed predecessor's (see undo).
    const stuck: string[] = [];
    for (const cidr of this.ownAdded) if (!(await this.removeAddress(cidr))) stuck.push(cidr);
    const kept = this.state.addedAddresses.filter((a) => !this.ownAdded.has(a) || stuck.includes(a));
    if (this.ownGroDisabled && !(this.adopted?.groDisabled ?? false)) await this.restoreOffloads(this.state.offloadsBefore);
    // A value a crashed predecessor set stays set (its VIPs may stay too), recorded as it was.
    if (this.ownKeepAddrOnDown) await this.restoreKeepAddrOnDown();
    if (this.adopted || stuck.length > 0) {
      await this.loadRules(kept.map(withoutPrefix)).catch(() => undefined);
      this.state = {
        interface: this.ifname,
        addedAddresses: kept,
        groDisabled: this.adopted?.groDisabled ?? false,
        offloadsBefore: this.adopted?.offloadsBefore,
        keepAddrOnDownBefore: this.state.keepAddrOnDownBefore,
      };
      await this.save().catch(() => undefined);
    } else {
      await this.runner(['nft', 'delete', 'table', 'inet', NFT_TABLE]).catch(() => undefined);
      this.rulesFor.clear();
      await rm(this.statePath, { force: true });
    }
    this.log.info('host changes of this start undone', { addresses: [...this.ownAdded], keptFromPreviousRun: kept });
    this.ownAdded.clear();
  }

  /** GRO and LRO back as recorded; a record from before they were recorded meant GRO on. */
  private async restoreOffloads(before: Offloads | undefined): Promise<void> {
    const on = before === undefined ? ['gro', 'on'] : [...(before.gro ? ['gro', 'on'] : []), ...(before.lro === true ? ['lro', 'on'] : [])];
    if (on.length > 0) await this.runner(['ethtool', '-K', this.ifname, ...on]).catch(() => undefined);
  }

  /**
   * Makes the kernel keep the interface's IPv6 addresses (our VIPs) when it goes down, recording
   * the value it had the first time. The kernel reads `all` when it is not 0, else the interface's
   * own value, and keeps them when that is above 0 (-1: never).
   */
  private async keepAddressesOnDown(): Promise<void> {
    const key = this.keepAddrKey();
    const [all, own] = await Promise.all([this.sysctl.read(KEEP_ADDR_ALL), this.sysctl.read(key)]).catch((e: Error) => {
      this.log.warn('could not read keep_addr_on_down: IPv6 VIPs are lost if the interface goes down', { error: e.message });
      return [null, null];
    });
    // No setting: no IPv6 here, so no IPv6 VIP either (adding one fails and says why).
    if (own === null) return;
    const allValue = Number(all ?? 0);
    if ((allValue !== 0 ? allValue : Number(own)) > 0) return;
    if (allValue < 0) {
      // Only `all` could change that, and that is every interface's business, not ours.
      this.log.warn('net.ipv6.conf.all.keep_addr_on_down is -1: IPv6 VIPs are lost if the interface goes down, until a reload or restart of dsrlb', { interface: this.ifname });
      return;
    }
    try {
      await this.sysctl.write(key, '1');
    } catch (e) {
      this.log.warn('could not set keep_addr_on_down: IPv6 VIPs are lost if the interface goes down', { sysctl: key, error: (e as Error).message });
      return;
    }
    // Set again on an interface made again: the value recorded first is the host's own.
    if (this.state.keepAddrOnDownBefore === undefined) {
      this.state.keepAddrOnDownBefore = Number(own);
      this.ownKeepAddrOnDown = true;
    }
    this.log.info('IPv6 addresses now kept when the interface goes down', { sysctl: key, before: Number(own) });
  }

  /** keep_addr_on_down back as recorded, and the record dropped. */
  private async restoreKeepAddrOnDown(): Promise<void> {
    const before = this.state.keepAddrOnDownBefore;
    if (before === undefined) return;
    await this.sysctl.write(this.keepAddrKey(), String(before)).catch((e: Error) =>
      this.log.warn('could not put keep_addr_on_down back', { sysctl: this.keepAddrKey(), value: before, error: e.message }),
    );
    delete this.state.keepAddrOnDownBefore;
    this.ownKeepAddrOnDown = false;
  }

  private keepAddrKey(): string {
    return `net/ipv6/conf/${this.ifname}/keep_addr_on_down`;
  }

  private devFor(cidr: string): string {
    return cidr.endsWith('/128') ? this.ifname : 'lo';
  }

  private addressCommand(verb: 'add' | 'del', cidr: string): string[] {
    const argv = ['ip', 'addr', verb, cidr, 'dev', this.devFor(cidr)];
    if (verb === 'add' && cidr.endsWith('/128')) argv.push('nodad', 'preferred_lft', '0');
    return argv;
  }

  /**
   * VIPs that are an interface's own address (a subnet address, not a /32 or /128 host address):
   * VIP -> "eth0 (10.99.0.2/24)". Such a VIP would take the host's own address away (the nftables
   * table drops everything to a VIP), SSH, BGP and the probes' replies with it.
   */
  async interfaceAddressesAmong(vips: readonly string[]): Promise<Map<string, string>> {
    const { stdout } = await this.runner(['ip', '-j', 'addr', 'show']);
    return interfaceAddressesAmong(stdout, vips);
  }

  private async addressesOn(dev: string): Promise<Set<string>> {
    const { stdout } = await this.runner(['ip', '-j', 'addr', 'show', 'dev', dev]);
    return new Set(ipAddresses(stdout).map((a) => `${a.local}/${a.prefixlen}`));
  }

  private async save(): Promise<void> {
    await writeRunRecord(this.statePath, this.state);
  }
}

/** "VIP/32" -> "VIP". */
function withoutPrefix(cidr: string): string {
  return cidr.slice(0, cidr.lastIndexOf('/'));
}

/** The whole nftables table, replaced atomically on every apply (nft -f is one transaction). */
export function nftRuleset(vips: readonly string[]): string {
  const v4 = vips.filter((v) => !v.includes(':'));
  const v6 = vips.filter((v) => v.includes(':'));
  const lines = [
    `table inet ${NFT_TABLE} {}`,
    `delete table inet ${NFT_TABLE}`,
    `table inet ${NFT_TABLE} {`,
    `  chain prerouting {`,
    `    type filter hook prerouting priority raw; policy accept;`,
  ];
  // All IP to a VIP: the packet loop forwards TCP/UDP, answers echo and routes too-big messages.
  // Fragmented ICMP to a VIP (a large ping) is the kernel's to reassemble and answer; the packet
  // loop passes it. Unfragmented echo is answered by the loop.
  if (v4.length > 0) lines.push(`    ip daddr { ${v4.join(', ')} } ip protocol icmp ip frag-off & 0x3fff != 0 accept`);
  if (v4.length > 0) lines.push(`    ip daddr { ${v4.join(', ')} } drop`);
  // Neighbour discovery to an IPv6 VIP is the kernel's (it holds the VIP): a router's unicast
  // NUD probe left unanswered makes it drop its entry for the VIP.
  if (v6.length > 0) lines.push(`    ip6 daddr { ${v6.join(', ')} } icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept`);
  // 58 (ICMPv6) by number: nft resolves a protocol name through /etc/protocols, which a minimal
  // Debian (no netbase) lacks, and the daemon then refused to start with an IPv6 VIP.
  if (v6.length > 0) lines.push(`    ip6 daddr { ${v6.join(', ')} } frag nexthdr 58 accept`);
  if (v6.length > 0) lines.push(`    ip6 daddr { ${v6.join(', ')} } drop`);
  lines.push('  }', '}');
  return lines.join('\n') + '\n';
}

/** See HostSetup.interfaceAddressesAmong; `ipAddrJson` is `ip -j addr show` output. */
export function interfaceAddressesAmong(ipAddrJson: string, vips: readonly string[]): Map<string, string> {
  const wanted = new Set(vips);
  const out = new Map<string, string>();
  for (const a of ipAddresses(ipAddrJson)) {
    const hostRoute = a.local.includes(':') ? 128 : 32;
    if (wanted.has(a.local) && a.prefixlen < hostRoute) out.set(a.local, `${a.ifname} (${a.local}/${a.prefixlen})`);
  }
  return out;
}

/** Every address of `ip -j addr show` output, with its interface. */
function ipAddresses(ipAddrJson: string): { ifname: string; local: string; prefixlen: number }[] {
  const links = JSON.parse(ipAddrJson || '[]') as { ifname?: string; addr_info?: { local: string; prefixlen: number }[] }[];
  return links.flatMap((link) => (link.addr_info ?? []).map((a) => ({ ifname: link.ifname ?? '?', local: a.local, prefixlen: a.prefixlen })));
}
