// Real servers' MAC addresses for L2 DSR, taken from the kernel's neighbour table of the
// forwarding interface. A real with no entry is made resolvable by sending it one UDP datagram
// (the kernel then ARPs / solicits for it); until then its frames are dropped and counted. One
// with an entry gets such a datagram every 30 s, so the kernel revalidates it and a changed MAC is seen.
// IPv4 entries come from /proc/net/arp: running `ip` every 2 s forks the whole daemon, whose
// copy-on-write faults cost it more CPU than the rest of its idle time. `ip -6 neigh` runs only
// when there are IPv6 reals.

import { createSocket, type Socket } from 'node:dgram';
import { readFile } from 'node:fs/promises';
import { EventEmitter } from 'node:events';
import { monotonicMs } from '../dataplane/monotonic-clock.js';
import { formatMac, parseMac } from './addresses.js';
import { systemRunner, type CommandRunner } from './host-setup.js';
import type { Logger } from './logger.js';

const USABLE_STATES = new Set(['REACHABLE', 'STALE', 'DELAY', 'PROBE', 'PERMANENT', 'NOARP']);
/**
 * How often a real that has an entry is sent a datagram anyway. The data path never goes through
 * the kernel's neighbour table, so without it a STALE entry is never revalidated: a real whose MAC
 * changed (a new NIC, a VM moved) kept getting frames at the old one for good.
 */
export const REVALIDATE_MS = 30_000;
/** After the wanted set changes, unresolved reals are looked for every 250 ms this long, then every 2 s. */
const FAST_POLL_MS = 10_000;
// /proc/net/arp flags (linux/if_arp.h): a complete or a permanent entry has a usable address.
const ATF_COM = 0x02;
const ATF_PERM = 0x04;
const EMPTY = Buffer.alloc(0);

/** Usable IPv4 neighbours of `ifname` from the text of /proc/net/arp, as `ip -j neigh` entries. */
export function parseProcArp(text: string, ifname: string): NeighEntry[] {
  const out: NeighEntry[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 6 || f[5] !== ifname) continue;
    const flags = Number.parseInt(f[2]!, 16);
    if ((flags & (ATF_COM | ATF_PERM)) === 0 || f[3] === '00:00:00:00:00:00') continue;
    out.push({ dst: f[0]!, lladdr: f[3]!, state: [(flags & ATF_PERM) !== 0 ? 'PERMANENT' : 'REACHABLE'] });
  }
  return out;
}

export interface NeighEntry {
  dst: string;
  lladdr?: string;
  state?: string[];
}

export class NeighborWatcher extends EventEmitter {
  private readonly known = new Map<string, string>();
  private wanted = new Set<string>();
  private timer: NodeJS.Timeout | null = null;
  private lastKick = new Map<string, number>();
  /** Until when (monotonic ms) unresolved reals are polled every 250 ms; then every 2 s. */
  private fastUntil = 0;
  /** stop() was called: a refresh still running schedules and sends nothing. */
  private stopped = false;
  /** Datagrams sent to make the kernel resolve or revalidate a real (for tests). */
  kicks = 0;
  /** One socket per family for those datagrams: a socket each cost 8,000 binds and closes a second at 8,000 unresolved reals. */
  private readonly kickSockets: { udp4: Socket | null; udp6: Socket | null } = { udp4: null, udp6: null };

  constructor(
    private readonly ifname: string,
    private readonly log: Logger,
    private readonly runner: CommandRunner = systemRunner,
    private readonly readArp: () => Promise<string> = () => readFile('/proc/net/arp', 'utf8'),
    private readonly clock: () => number = monotonicMs,
  ) {
    super();
  }

  /** The addresses whose MACs the data plane needs. */
  setWanted(addresses: Iterable<string>): void {
    const next = new Set(addresses);
    if ([...next].some((a) => !this.wanted.has(a))) this.fastUntil = this.clock() + FAST_POLL_MS;
    this.wanted = next;
  }

  macOf(address: string): Uint8Array | null {
    const m = this.known.get(address);
    return m ? parseMac(m) : null;
  }

  start(): void {
    this.stopped = false;
    const tick = async (): Promise<void> => {
      await this.refresh().catch((e: Error) => this.log.warn('neighbour refresh failed', { error: e.message }));
      // A refresh that was running when stop() came schedules nothing.
      if (!this.stopped) this.timer = setTimeout(() => void tick(), this.nextPollMs());
    };
    void tick();
  }

  /**
   * When to read the table again: 250 ms while a real is unresolved, but only for a while after
   * the wanted set changed (a real that never answers, gone or mistyped, must not keep the daemon
   * forking `ip -6 neigh` four times a second); else 2 s.
   */
  nextPollMs(): number {
    const unresolved = [...this.wanted].some((a) => !this.known.has(a));
    return unresolved && this.clock() < this.fastUntil ? 250 : 2000;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    for (const type of ['udp4', 'udp6'] as const) {
      this.kickSockets[type]?.close();
      this.kickSockets[type] = null;
    }
  }

  /** Read the neighbour table once; emits 'change' when a wanted real's MAC appears or changes. */
  async refresh(): Promise<void> {
    const entries = parseProcArp(await this.readArp(), this.ifname);
    if ([...this.wanted].some((a) => a.includes(':'))) {
      const { stdout } = await this.runner(['ip', '-j', '-6', 'neigh', 'show', 'dev', this.ifname]);
      entries.push(...(JSON.parse(stdout || '[]') as NeighEntry[]));
    }
    let changed = false;
    const seen = new Set<string>();
    for (const e of entries) {
      if (!e.lladdr || !e.state || !e.state.some((s) => USABLE_STATES.has(s))) continue;
      seen.add(e.dst);
      const mac = formatMac(parseMac(e.lladdr));
      if (this.wanted.has(e.dst) && this.known.get(e.dst) !== mac) {
        this.log.info('real MAC resolved', { real: e.dst, mac, previous: this.known.get(e.dst) ?? null });
        this.known.set(e.dst, mac);
        changed = true;
      }
    }
    const now = this.clock();
    for (const a of this.wanted) {
      // Kick resolution for reals with no usable entry every second, and revalidation of those
      // with one every REVALIDATE_MS (a STALE entry is probed again only when something is sent).
      const since = now - (this.lastKick.get(a) ?? -Infinity);
      if (since > (seen.has(a) ? REVALIDATE_MS : 1000)) {
        this.lastKick.set(a, now);
        this.kick(a);
      }
    }
    if (changed) this.emit('change');
  }

  private kick(address: string): void {
    if (this.stopped) return; // a refresh still running at stop() opens no socket that nothing closes
    this.kicks++;
    const type = address.includes(':') ? 'udp6' : 'udp4';
    let sock = this.kickSockets[type];
    if (sock === null) {
      const made = createSocket(type);
      made.unref();
      // A socket that failed is made again at the next kick; a send's own error (no route) is the callback's.
      made.on('error', () => {
        made.close();
        if (this.kickSockets[type] === made) this.kickSockets[type] = null;
      });
      sock = this.kickSockets[type] = made;
    }
    // Port 9 (discard): the datagram only makes the kernel resolve the neighbour.
    sock.send(EMPTY, 9, address, () => {});
  }
}
