// The control plane of `dsrlb run`: loads the config, owns the host changes, the packet-loop
// worker, the reals' ids, intent and MACs, and builds and hands over forwarding snapshots.
// The packet loop runs in a worker thread; nothing here can stall it. Everything that changes
// the config in force or the state file (reload, intent, announce) runs one at a time (exclusive()).

import { constants } from 'node:fs';
import { access, copyFile, lstat, open, readdir, readFile, rename, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { readConfigFile } from '../config/load.js';
import { restartOnlyChanges } from '../config/restart-keys.js';
import { locateProblems } from '../config/problem-positions.js';
import type { Config, ConfigProblem, Protocol, RealConfig, RealIntent, ServiceConfig } from '../config/types.js';
import { isRealIntent, isWeight, parseClientEndpoint, parseIpAddress, parseServiceRef, problemLines, serviceAddressName } from '../config/validate.js';
import { withoutBom } from '../config/yaml-document.js';
import { FLOW_RECORD, FlowState, timeoutsByState } from '../dataplane/flow-table.js';
import { FLOW_KEY_WORDS } from '../dataplane/flow-hash.js';
import { HANDOFF_GRACE_MS } from '../dataplane/flow-handoff.js';
import { encodeLiveFlows, type LiveFlowsWire } from '../sim/live-flows-wire.js';
import { bootId, decodeSavedFlows, downtimeMs, encodeSavedFlows, type SavedFlows, type SavedReal, type SavedRemovedService } from './flows-file.js';
import { readAdminToken } from './admin-token.js';
import { DaemonError } from './daemon-error.js';
import { InstanceLock, InstanceLockError } from './instance-lock.js';
import { Counter, MAX_REAL_IDS, REAL_BASE, REAL_STRIDE, RealCounter } from '../dataplane/counters.js';
import { timeoutsOf } from './flow-timeouts.js';
import type { LoopEvent, LoopRequest } from '../dataplane/loop-runner.js';
import { LoopGroup } from './loop-group.js';
import { isWanted, type HealthFact } from '../health/eligibility.js';
import { HealthMonitor, type HealthTarget } from '../health/health-monitor.js';
import { addressWords, clientPrefixText, formatMac, normalizedAddress, wordsToAddress } from './addresses.js';
import { COMMAND_TIMEOUT_MS, HostSetup, RUN_DIR, systemRunner, writeFileAside } from './host-setup.js';
import { moveFlowsFile, movedStateFile, recordStateFile } from './state-file-record.js';
import { checkHostBeforeChanges } from './start-checks.js';
import type { Logger } from './logger.js';
import { DaemonMetrics, type MetricsRealView } from './metrics.js';
import { NeighborWatcher } from './neighbors.js';
import { monotonicMs } from '../dataplane/monotonic-clock.js';
import { RealRegistry, serviceIdentity } from './real-registry.js';
import { removalBlocker } from './service-removal.js';
import { SnapshotBuilder, type RealView, type ServiceBuildReport, type ServiceView, type TunnelSources } from './snapshot-builder.js';
import { PathMtuSockets } from './path-mtu-sockets.js';
import { RouteRefreshTrigger } from './route-refresh-trigger.js';
import { lookupRoutes } from './route-lookup.js';
import { VipAnnouncer } from './announcer.js';
import { RECOVERY_CAP_MS, RecoveryHold, type RealsRecovery } from './recovery-hold.js';
import { announceVips, type AnnouncementRounds } from './vip-announcements.js';

export const CLOSE_TIMEOUT_MS = 10_000;

export { DaemonError };

const FLOW_STATE_NAMES: Record<number, string> = {
  [FlowState.syn]: 'syn',
  [FlowState.established]: 'established',
  [FlowState.fin]: 'fin',
  [FlowState.closed]: 'closed',
  [FlowState.udp]: 'udp',
};

/** One row of dsrlb flows (GET /flows). */
export interface FlowRow {
  protocol: 'tcp' | 'udp';
  client: string;
  /** VIP:PORT the flow was sent to. */
  vip: string;
  service: string;
  real: string;
  state: string;
  idleMs: number;
  expiresInMs: number;
}

export interface FlowListing {
  /** Flows that match, listed or not. */
  total: number;
  flows: FlowRow[];
}

/** IP:PORT, IPv6 in brackets. */
function endpointText(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

/** What withdraw/announce did: the VIP is what is (un)announced, shared by `sharedWith`. */
export interface AnnounceResult {
  service: string;
  announce: boolean;
  vip: string;
  sharedWith: string[];
  /** Other services of the VIP still withdrawn: the VIP stays off until they are announced too. */
  stillWithdrawnBy: string[];
  /** The operator's withdrawal was already as asked: nothing changed. */
  unchanged: boolean;
}

/** What an intent verb did, to the service and real named canonically. */
export interface IntentResult {
  service: string;
  real: string;
  before: { state: RealIntent; weight: number };
  after: { state: RealIntent; weight: number };
  /** Why nothing changed, when the verb asked for less than the real has (a drain of a disabled real). */
  note?: string;
}

/** A reload's outcome; a refusal names its problems and whether the config or the system refused. */
/** `warnings`: what a taken reload did that the operator should know (intent it dropped, a state file it cannot write). */
export type ReloadResult = { ok: true; problems: readonly ConfigProblem[]; warnings: readonly string[] } | { ok: false; problems: readonly ConfigProblem[]; refusedBy: 'config' | 'system' };

/** An intent verb: the state or weight to set; `from`: only a real in that state changes. */
export interface IntentChange {
  state?: RealIntent;
  weight?: number;
  from?: RealIntent;
}

/** Intent set at run time through the admin API, with the config values it overrode. */
interface IntentOverride {
  state?: RealIntent;
  weight?: number;
  configState: RealIntent;
  configWeight: number;
}

/** How long queued rebuilds (health and neighbour changes) wait for more changes. */
const QUEUED_REBUILD_MS = 100;

/** Rows dsrlb flows lists at most (--limit 0): about 250 MB of JSON, under V8's largest string. */
const FLOWS_LISTED_MOST = 1_000_000;

/** Live flows sent to `dsrlb plan` at most (about 230 MB of JSON). */
const LIVE_FLOWS_LIMIT = 4_000_000;

interface TunnelRoute {
  readonly nextHop: string;
  readonly source: string | null;
  readonly mtu: number | null;
}

interface RealRuntime {
  key: string;
  id: number;
  service: string; // service identity
  serviceName: string;
  address: string;
  /** As last configured: a removed real's draining flows keep going the way they went. */
  forwarding: RealConfig['forwarding'];
  removed: boolean;
  /**
   * The first snapshot generation in which it takes no new flows (removed): until every loop runs
   * that one, a new flow may still be placed on its id, so the id is not released before.
   */
  removedGeneration: number;
}

/** How often the next hops of IPIP reals are asked again (one `ip -batch` of `route get` for all). */
const ROUTE_REFRESH_MS = 10_000;
/** How often (housekeeping ticks, 1 s) the nftables drop table is looked for: one `nft list` (about 2 ms of CPU). */
const DROP_TABLE_CHECK_TICKS = 5;
/** A real's too-big errors are logged at most once in this long. */
const TOO_BIG_LOG_MS = 600_000;
/**
 * The smallest path MTU toward an IPIP real taken from an ICMP error (a route exception): anyone
 * who knows the LB's and a real's addresses can forge one, and the kernel takes down to 552
 * (IPv6: 1280). IPv6 links carry 1280; an IPv4 underlay below it is configured (route mtu), not learned.
 */
const MIN_LEARNED_MTU = 1280;
/** How long a loop may take to hand its flows over or take them (1M flows: about a second). */
const HANDOFF_ASK_MS = 30_000;

/** The longest a service waits for its reals to settle before it may be announced anyway. */
const SETTLE_CAP_MS = 30_000;

/**
 * How long a stop waits for the loops' flows (1M flows: about a second). With the withdraw delay,
 * a sync in flight (STOP_SYNC_WAIT_MS) and the loops' stop (CLOSE_TIMEOUT_MS) a stop with a stalled
 * loop stays under the unit's TimeoutStopSec=30s: HANDOFF_ASK_MS (30 s) here went past it, and
 * systemd's SIGKILL skipped the host undo.
 */
const STOP_FLOWS_ASK_MS = 10_000;

/** The longest the start's VIP announcements on the link wait for the reals' MACs. */
const START_LINK_WAIT_MS = 2000;

/** How long a stop waits, after the withdraw delay, for an announcer sync in flight to end. */
const STOP_SYNC_WAIT_MS = 1000;

/** A wanted real whose MAC (or next hop's) stays unknown this long is logged: it takes no new flows. */
const MAC_WAIT_WARN_MS = 10_000;

export class Daemon {
  config!: Config;
  /** The text of the config in force (plan compares a candidate against it). */
  configText = '';
  readonly loops: LoopGroup;
  readonly registry = new RealRegistry(MAX_REAL_IDS);
  readonly metrics: DaemonMetrics;
  private readonly builder = new SnapshotBuilder();
  private host!: HostSetup;
  private neighbors!: NeighborWatcher;
  private readonly reals = new Map<string, RealRuntime>();
  /**
   * Services a reload removed, by identity, as last configured: while reals of theirs still hold
   * flows the service stays in the snapshot with no real for new flows, so its connections end
   * normally (as IPVS keeps a deleted service's connections, and an old HAProxy its sessions).
   */
  private removedServices = new Map<string, ServiceConfig>();
  /**
   * Removed services whose VIP was announced (and not withdrawn) when a reload removed them: the
   * route stays while their flows drain here. One that was not announced stays unannounced.
   */
  private drainAnnounced = new Set<string>();
  /** The VIPs announced when the stop began (it withdraws them before the flows are written). */
  private announcedAtStop: Set<string> | null = null;
  readonly health: HealthMonitor;
  private overrides = new Map<string, IntentOverride>();
  private lastReports: readonly ServiceBuildReport[] = [];
  /** The flows file this start took, removed once the start succeeded. */
  private takenFlowsFile: string | null = null;
  /** Sends the gratuitous ARPs / unsolicited NAs (a field, so that a test can replace it). */
  private announceVips = announceVips;
  /** Announcement rounds not finished yet: a stop cancels them before the host gives the VIPs up. */
  private readonly vipRounds = new Set<AnnouncementRounds>();
  /** Wanted reals without a MAC, by id: since when (monotonic ms), and whether that was logged. */
  private readonly macMissing = new Map<number, { sinceMs: number; warned: boolean }>();
  /** Services whose view has settled since start, and when each was first seen (announceWanted). */
  private readonly settledServices = new Set<string>();
  /** Services (by identity) whose dropping has been warned of in this episode. */
  private readonly dropWarned = new Set<string>();
  private readonly firstSeenMs = new Map<string, number>();
  /** VIPs withdrawn because no service of theirs could take new flows: back once the reals are (recovery-hold.ts). */
  private readonly reannounceHold = new RecoveryHold();
  /**
   * Services whose failOpen panic ended with some reals still down: those keep their flows (shown to
   * the builder as not proven either way) until they are back or had time to be (recovery-hold.ts).
   */
  private readonly panicEnding = new RecoveryHold();
  /** By service identity: the ids of the reals a panic kept flows on that have not been up since. */
  private readonly panicKept = new Map<string, Set<number>>();
  /** VIPs the last announcement round held back for their reals (status: NOT_ANNOUNCED(reals_rising)). */
  private heldForReals = new Set<string>();
  private rebuildQueued = false;
  private housekeeping: NodeJS.Timeout | null = null;
  private rates = new Map<number, { pps: number; bps: number; packets: number; bytes: number }>();
  /**
   * Each real id's counter block as it was when the id was handed to its current real: ids are
   * reused once a removed real is forgotten, and the loops' counters only ever grow.
   */
  private readonly counterBase = new Float64Array(MAX_REAL_IDS * REAL_STRIDE);
  /** Per IPIP real address: its next hop, outer source and route MTU (resolveTunnelRoutes). */
  private tunnelRoutes = new Map<string, TunnelRoute>();
  private tunnelSources: TunnelSources = { v4: null, v6: null };
  private announcer: VipAnnouncer | null = null;
  private announceTimer: NodeJS.Timeout | null = null;
  private announceBusy = false;
  private routesTimer: NodeJS.Timeout | null = null;
  /** Lets the kernel learn the path MTU toward IPIP reals, which the route refresh then reads (path-mtu-sockets.ts). */
  private readonly pathMtu: PathMtuSockets;
  /** The start's VIP announcements on the link, waiting for the reals' MACs (announceStartOnLink). */
  private startLinkTimer: NodeJS.Timeout | null = null;
  private routesRefreshing = false;
  /** Route refreshes that routers' too-big errors about tunnels ask for (refreshAfterTooBig). */
  private readonly tooBigRefresh: RouteRefreshTrigger;
  /** When each real's too-big error was last logged (monotonic ms). */
  private readonly tooBigLoggedAt = new Map<string, number>();
  private readonly warned = new Set<string>();
  /** A reload queued behind another change and not started yet: later reloads join it. */
  private waitingReload: Promise<ReloadResult> | null = null;
  /** Why the configured state file cannot be written (checked at start and each reload), or null. */
  private stateFileProblem: string | null = null;
  /** The announcing a reload started in the background, chained (see reloadNow). */
  private announcing: Promise<void> = Promise.resolve();
  /** Set when stop begins: announcing must not come back after its withdrawal. */
  private stopping = false;
  /** Housekeeping ticks (1 s) since the start. */
  private ticks = 0;
  private checkingDropTable = false;
  /** Services the operator withdrew (`dsrlb withdraw`), by service identity. */
  private withdrawn = new Set<string>();
  /** This network namespace's one-daemon lock, held from before the first host change to the end of stop(). */
  private lock: InstanceLock | null = null;
  /** start() completed: stop() undoes all host changes; before that, only this start's own. */
  private started = false;
  /** The tail of the queue of changes (reload, intent, announce): each runs after the previous. */
  private serial: Promise<unknown> = Promise.resolve();
  /** Told when a packet loop ended by itself after start and could not be started again (LoopGroup.onLost); `dsrlb run` stops then. */
  onLoopLost: ((reason: string) => void) | null = null;
  /** The bearer token the admin API requires (null: none, admin on loopback); re-read on reload. */
  adminToken: Buffer | null = null;
  /** The token file's mtime, size and inode when an unmatched token last made it be read again. */
  private tokenFileStamp: string | null = null;
  mtu = 1500;
  /** Where the run records and the lock go (tests use their own). */
  runDir = RUN_DIR;

  constructor(
    readonly configPath: string,
    readonly log: Logger,
  ) {
    this.loops = new LoopGroup(log);
    this.tooBigRefresh = new RouteRefreshTrigger({ ready: () => this.started && !this.routesRefreshing, refresh: (reals) => this.refreshAfterTooBig(reals), now: monotonicMs });
    this.pathMtu = new PathMtuSockets(log, undefined, (real) => this.tooBigRefresh.tooBig(real));
    this.loops.onLost = (reason) => this.onLoopLost?.(reason);
    // A loop may have ended because its interface was made again, taking the addresses dsrlb put
    // on it (IPv6 VIPs): apply the host setup again (it adds only what is missing).
    this.loops.onRestarted = ({ interfaceChanged }) =>
      void this.exclusive(async () => {
        if (this.stopping || !this.host) return;
        await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' });
        // An interface made again may have a new MAC that the neighbours do not know yet, and a new
        // switch port. After a crash nothing changed on the link: announcing would only move the
        // VIP's neighbour entries to this LB where several LBs share the segment.
        if (interfaceChanged) this.announceOnLink(this.vips(), 'packet loop started again');
      }).catch((err: Error) => this.log.error('could not put the host setup back after a packet loop restart', { error: err.message }));
    this.metrics = new DaemonMetrics({
      counters: () => this.loops.counters(),
      realCount: (counters, id, which) => this.realCount(counters, id, which),
      reals: () => this.metricsView(),
      activeFlows: (id) => this.loops.active(id),
      inactiveFlows: (id) => this.loops.inactive(id),
      flowTableCapacity: () => this.flowTableCapacity(),
      // No series for a removed service that drains: it takes no new flows by design, and a 0
      // there fired DsrlbServiceAllRealsDown (its reals are drained) for every routine removal.
      panic: () => this.lastReports.filter((r) => this.config.services.some((x) => x.name === r.name)).map((r) => ({ service: r.name, panic: inPanic(r), onBackups: r.onBackups })),
      services: () =>
        this.lastReports.map((r) => {
          const s = this.config.services.find((x) => x.name === r.name);
          // null (no series) where no announcement is meant: announce off, a service with
          // `announce: false`, a removed service draining. The alert on 0 then means a withdrawal.
          const announced = !this.config.announce.enabled || !s || !s.announce ? null : (this.announcer?.isAnnounced(s.vip) ?? false);
          // No fingerprint for a removed service that drains: LBs forget it at different times,
          // which is no disagreement (DsrlbServiceMissingOnSomeLb counts the LBs that have it).
          return { service: r.name, fingerprint: s ? r.tableFingerprint : null, announced };
        }),
    });
    this.health = new HealthMonitor({
      log,
      observer: (key, result) => {
        const r = this.reals.get(key);
        if (r) this.metrics.observeProbe(r.serviceName, r.address, result.durationMs / 1000, result.ok ? null : result.reason);
      },
    });
    this.health.on('change', (key, fact) => {
      const r = this.reals.get(key);
      if (!r) return;
      this.log[fact.state === 'up' ? 'info' : 'warn'](`real ${fact.state}`, { service: r.serviceName, real: r.address, lastError: fact.lastError });
      this.queueRebuild('health');
    });
  }

  /** A real that takes no new flows (drain, weight 0, removed) and has no established flow left (as watching ipvsadm's ActiveConn reach 0). */
  private drainFinished(r: RealView): boolean {
    const draining = r.removed || r.intent === 'drain' || r.weight === 0;
    return draining && this.loops.active(r.id) === 0;
  }

  async start(): Promise<void> {
    const { text, result: loaded } = await readConfigFile(this.configPath);
    if (!loaded.ok) throw new DaemonError('CONFIG_INVALID', `config ${this.configPath} is invalid`, loaded.problems);
    this.config = loaded.config;
    this.configText = text!;
    // Before any host change: a second daemon here would take over and later undo the first's VIPs.
    try {
      this.lock = await InstanceLock.acquire(undefined, undefined, this.runDir);
    } catch (err) {
      throw new DaemonError(err instanceof InstanceLockError ? err.code : 'LOCK_FAILED', (err as Error).message);
    }
    this.adminToken = await readAdminToken(this.config);
    // Named as a config problem, before anything on the host changes (not as ip's own message).
    const ifname = this.config.interface;
    if (!(await systemRunner(['ip', '-j', 'link', 'show', 'dev', ifname]).then(() => true, () => false))) {
      throw new DaemonError('NO_INTERFACE', `interface: "${ifname}" does not exist in this network namespace`, located(this.configText, [{ path: 'interface', message: `"${ifname}" does not exist in this network namespace` }]));
    }
    const host = new HostSetup(this.config.interface, this.log, undefined, this.runDir);
    // Before the state file or anything on the host is touched: a record another user's dsrlb
    // left is that run's to undo (a stop after this refusal would have removed it).
    await host.refuseForeignRecord();
    const clashes = vipClashProblems(this.config, await host.interfaceAddressesAmong(this.vips()));
    if (clashes.length > 0) throw new DaemonError('VIP_IS_HOST_ADDRESS', 'a VIP is an address of this host', located(this.configText, clashes));
    await checkHostBeforeChanges(this.config);
    await this.removeStaleTempFiles();
    const stateFileBefore = await this.stateFileBefore();
    await this.loadOverrides(stateFileBefore ?? this.config.stateFile);
    const pruned = this.pruneOverrides().changed;
    // The new path is recorded only once it holds the intent: else the next start looks at the old one again.
    if (stateFileBefore !== null) {
      const saved = await this.saveState(this.overrides, this.withdrawn).then(
        () => true,
        (err: Error) => {
          this.log.warn('the intent taken from the old state file could not be written to the new one: the next start takes it from the old one again', { stateFile: this.config.stateFile, error: err.message });
          return false;
        },
      );
      if (saved) await this.recordStateFile();
    } else {
      if (pruned) await this.saveStateOrWarn();
      await this.recordStateFile();
    }
    this.logRestoredIntent();
    await this.checkStateFileWritable();
    this.host = host;
    this.neighbors = new NeighborWatcher(this.config.interface, this.log);
    await this.host.adopt();
    await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' });
    await this.startWorker();
    this.syncReals();
    // Before the first snapshot: no packet has made a flow entry yet.
    await this.adoptSavedFlows();
    // Removed services restored with their flows drain: the host owns their VIPs again.
    if (this.removedServices.size > 0) await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' });
    const tunnel = await this.resolveTunnelRoutes(this.config);
    this.tunnelRoutes = tunnel.routes;
    this.tunnelSources = tunnel.sources;
    this.syncPathMtuSockets();
    this.neighbors.on('change', () => this.queueRebuild('neighbour change'));
    this.neighbors.setWanted(this.l2RealAddresses());
    this.neighbors.start();
    this.rebuild('start');
    await this.startAnnouncing();
    this.metrics.reloads.inc({ result: 'success' }, 0);
    this.metrics.lastReloadSuccess.set(Date.now() / 1000);
    this.housekeeping = setInterval(() => this.tick(), 1000);
    this.routesTimer = setInterval(() => void this.refreshTunnelRoutes(), ROUTE_REFRESH_MS);
    this.started = true;
    await this.removeTakenFlows();
    this.announceStartOnLink(monotonicMs());
    this.log.info('dsrlb running', {
      interface: this.config.interface,
      io: this.config.io,
      mac: formatMac(this.loops.localMac),
      services: this.config.services.map((s) => s.name),
    });
  }

  private async startWorker(): Promise<void> {
    const c = this.config;
    try {
      await this.loops.start(
        { io: c.io, ring: c.ring, interface: c.interface, flowCapacity: c.flowTable.capacity, timeouts: timeoutsOf(c), maxRealIds: MAX_REAL_IDS },
        c.workers,
        c.cpus,
      );
    } catch (err) {
      const e = err as Error & { code?: string };
      throw new DaemonError(e.code ?? 'LOOP_FAILED', e.message);
    }
  }

  private send(m: LoopRequest): void {
    this.loops.broadcast(m);
  }

  /** Runs fn after every change queued before it has finished (a failed one does not stop the queue). */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.serial.then(fn, fn);
    this.serial = run.catch(() => undefined);
    return run;
  }


  /** The VIPs the host must own: the config's, and those of removed services that still drain. */
  private vips(config: Config = this.config, removed = this.removedServices): string[] {
    return [...new Set([...config.services, ...this.drainingServices(config, removed)].map((s) => s.vip))];
  }

  /**
   * Removed services whose flows drain under `config` (see removalBlocker): those whose reals still
   * hold flows. One without flows goes at once, its VIP with it.
   */
  private drainingServices(config: Config = this.config, removed = this.removedServices): ServiceConfig[] {
    const out: ServiceConfig[] = [];
    for (const [sid, s] of removed) {
      if (removalBlocker(config.services, s) !== null) continue;
      if ([...this.reals.values()].some((r) => r.service === sid && this.loops.active(r.id) + this.loops.inactive(r.id) > 0)) out.push(s);
    }
    return out;
  }

  /** Scale-out: VIP gates for BIRD, re-evaluated every 200 ms (loop stalls are seen within ~1 s). */
  private async startAnnouncing(): Promise<void> {
    const a = this.config.announce;
    if (!a.enabled || this.stopping) return;
    this.announcer ??= new VipAnnouncer(this.log, a.routesFile, a.birdSocket);
    this.announcer.setFiles(a.routesFile, a.birdSocket);
    await this.syncAnnouncements();
    // A reload may have turned announcing off meanwhile, or stop begun: then no 200 ms check.
    if (this.stopping || !this.config.announce.enabled) return;
    this.announceTimer ??= setInterval(() => void this.syncAnnouncements(), 200);
  }

  /** announce.enabled turned false by a reload: no more checks, every VIP's device closed (route gone). */
  private async stopAnnouncing(): Promise<void> {
    if (this.announceTimer) clearInterval(this.announceTimer);
    this.announceTimer = null;
    if (!this.announcer) return;
    while (this.announceBusy) await new Promise((r) => setTimeout(r, 10));
    // Busy as a check is: the announcer's gates and routes file take one sync at a time.
    this.announceBusy = true;
    try {
      await this.announcer.sync(new Map());
    } catch (err) {
      this.log.error('could not stop announcing', { error: (err as Error).message });
    } finally {
      this.announceBusy = false;
    }
  }

  /**
   * Per VIP: announce while the loop runs and a service of the VIP can take new flows, or keeps
   * the flows of reals the operator drained. A service counts only once its view has settled since
   * this daemon took it: every real proven up with its MAC known, or confirmed down. An LB that
   * (re)joins the ECMP group with a half-built view (reals unproven, so fail-open, or a table of
   * the first real up) would pick other reals than its peers for the flows the router moves to it,
   * and those connections would be reset. A real up whose MAC never resolves stops the wait after
   * SETTLE_CAP_MS. Once settled, a service stays so (a reload on every LB at once that adds reals
   * must not withdraw the VIP everywhere), and a service a reload adds to a VIP announced already
   * does not hold it back while it settles (it withdrew the VIP's other services on every LB).
   * Settling is decided against the table the loops run: not while a rebuild is queued (the facts
   * are newer than the last table; announced then, the LB ran a fail-open table for up to 100 ms).
   */
  private announceWanted(): Map<string, boolean> {
    const loopOk = (this.loops.running && this.loops.heartbeatAgeMs() < 1000) || this.loops.recovering;
    // Per VIP (the route is the VIP's, shared by its services): every announced service of it
    // settled, none withdrawn by the operator, and at least one able to take new flows.
    const vips = new Map<string, { blocked: boolean; eligible: boolean }>();
    const reports = new Map<string, ServiceBuildReport>();
    for (const r of this.lastReports) if (!reports.has(r.name)) reports.set(r.name, r);
    for (const s of this.config.services) {
      if (!s.announce) continue;
      const v = vips.get(s.vip) ?? { blocked: false, eligible: false };
      vips.set(s.vip, v);
      const sid = serviceIdentity(s);
      if (this.withdrawn.has(sid)) {
        v.blocked = true;
        continue;
      }
      if (!this.settledServices.has(sid) && (this.rebuildQueued || !this.settled(s))) {
        if (this.announcer?.isAnnounced(s.vip) !== true) v.blocked = true;
        continue;
      }
      const report = reports.get(s.name);
      if (report === undefined) continue;
      if ((!report.dropping && (!inPanic(report) || this.config.announce.onFailOpen)) || report.drained) v.eligible = true;
    }
    // A service removed by a reload whose flows still drain here keeps its VIP's route while they
    // do, if it had one: without it the router sends them nowhere once every LB has reloaded.
    // New flows to it are dropped by the snapshot; the route goes with its last flow.
    for (const s of this.drainingServices()) {
      if (!this.drainAnnounced.has(serviceIdentity(s))) continue;
      const v = vips.get(s.vip) ?? { blocked: false, eligible: false };
      vips.set(s.vip, v);
      v.eligible = true;
    }
    const wanted = new Map<string, boolean>();
    const heldBack = new Set<string>();
    for (const [vip, v] of vips) {
      // Nothing but its reals holds the VIP back: one not eligible for want of reals (wanted ones
      // not up) is held until they are back; one whose reals the operator took out is not.
      const free = loopOk && !v.blocked;
      if (free && !v.eligible) {
        if (this.recoveryOf(this.announcedServicesOf(vip)).wanted > 0) this.reannounceHold.hold(vip);
        else this.reannounceHold.forget(vip);
      }
      const announce = free && v.eligible && this.mayComeBack(vip);
      if (free && v.eligible && !announce) heldBack.add(vip);
      wanted.set(vip, announce);
    }
    this.reannounceHold.keepOnly(new Set(vips.keys()));
    this.heldForReals = heldBack;
    return wanted;
  }

  /** The VIP's services meant to be announced and not withdrawn by an operator. */
  private announcedServicesOf(vip: string): ServiceConfig[] {
    return this.config.services.filter((s) => s.vip === vip && s.announce && !this.withdrawn.has(serviceIdentity(s)));
  }

  /**
   * Whether an eligible VIP may be announced now: at once, unless it could take no new flows here
   * before (its reals all found down or out) and its reals are still coming back (recovery-hold.ts).
   */
  private mayComeBack(vip: string): boolean {
    if (!this.reannounceHold.isHeld(vip)) return true;
    // Decided against the table the loops run, as settling is: the facts of a queued rebuild are
    // not in it yet (announced on them, the last real's flows met a table without it: 3 of 30 reset).
    if (this.rebuildQueued) return false;
    const d = this.reannounceHold.decide(vip, this.recoveryOf(this.announcedServicesOf(vip)), monotonicMs());
    if (!d.over) {
      if (d.began) this.log.info('VIP not announced yet: waiting for its reals to come up in this view', { vip });
      return false;
    }
    if (d.waitedMs > 0) this.log.info('VIP may be announced again', { vip, waitedMs: Math.round(d.waitedMs), realsNotUp: d.notUp });
    return true;
  }

  /** The wanted reals of `services` as this LB sees them (backups aside: they stand in for the others). */
  private recoveryOf(services: readonly ServiceConfig[]): RealsRecovery {
    let wanted = 0;
    let up = 0;
    let riseMs = 0;
    for (const s of services) {
      const sid = serviceIdentity(s);
      const hc = s.healthCheck;
      if (hc.type !== 'none') riseMs = Math.max(riseMs, (hc.rise + 1) * hc.intervalMs + hc.timeoutMs);
      for (const r of s.reals) {
        const key = RealRegistry.keyOf(sid, r.address);
        if (r.backup || !this.wantedByIntent(key, r)) continue;
        wanted++;
        if (this.healthOf(key) === 'up' && this.macOfReal(r) !== null) up++;
      }
    }
    return { wanted, up, riseMs };
  }

  /** A configured real the intent in force leaves taking new flows (isWanted, health aside). */
  private wantedByIntent(key: string, r: RealConfig): boolean {
    const intent = this.intentOf(key, r.state, r.weight);
    return intent.state === 'active' && intent.weight > 0;
  }

  /**
   * Whether the service's view has settled since this daemon took it (see announceWanted), marking
   * it so the first time. Until then its table is still being built, not moved: announcing waits,
   * and dsrlb_table_moved_slots_total does not count.
   */
  private settled(s: ServiceConfig): boolean {
    const sid = serviceIdentity(s);
    if (this.settledServices.has(sid)) return true;
    const unsettled = s.reals.filter((r) => !this.realSettled(sid, r)).map((r) => r.address);
    // The monotonic clock: a step of the system time must neither hold the VIP back nor announce it half-built.
    if (!this.firstSeenMs.has(sid)) this.firstSeenMs.set(sid, monotonicMs());
    const waitedMs = Math.round(monotonicMs() - this.firstSeenMs.get(sid)!);
    if (unsettled.length > 0 && waitedMs < SETTLE_CAP_MS) return false;
    this.settledServices.add(sid);
    // A service that drops while it settles is warned of by the next rebuild: ask for one, as
    // nothing else may come (reals whose MACs never resolve).
    if (this.lastReports.some((r) => r.name === s.name && r.dropping)) this.queueRebuild('settled while dropping');
    if (unsettled.length > 0) this.log.warn('settled before every real did (the wait is capped)', { service: s.name, unsettled, waitedMs });
    else this.log.info('health settled: every real proven up or down', { service: s.name });
    return true;
  }

  /**
   * Logs a wanted real, not known to be down, whose MAC (or next hop's) has stayed unknown for
   * MAC_WAIT_WARN_MS: the snapshot leaves it out of the candidates, so it takes no new flows while
   * status shows it active and up (a mistyped address, a host on another segment). Once per episode;
   * neighbors.ts logs the MAC when it comes.
   */
  private warnUnresolvedMacs(): void {
    const now = monotonicMs();
    const missing = new Set<number>();
    for (const v of this.serviceViews()) {
      for (const r of v.reals) {
        if (!awaitsMac(r)) continue;
        missing.add(r.id);
        let m = this.macMissing.get(r.id);
        if (m === undefined) this.macMissing.set(r.id, (m = { sinceMs: now, warned: false }));
        if (!m.warned && now - m.sinceMs >= MAC_WAIT_WARN_MS) {
          m.warned = true;
          this.log.warn('real has no MAC: it takes no new flows until ARP/neighbour discovery answers', { service: v.config.name, real: r.address, next: this.neighborOf(r), waitedS: Math.round((now - m.sinceMs) / 1000) });
        }
      }
    }
    for (const id of this.macMissing.keys()) if (!missing.has(id)) this.macMissing.delete(id);
  }

  /**
   * Tells the segment's neighbours that `vips` are at this interface's MAC, now and again a second
   * later (vip-announcements.ts): at start, when a loop started again (the interface may have been
   * made again with a new MAC), for the VIPs a reload adds. Only on a daemon that started (a test's
   * daemon that never took the host sends nothing).
   */
  private announceOnLink(vips: readonly string[], reason: string): void {
    if (!this.started || this.stopping || vips.length === 0) return;
    const rounds = this.announceVips(this.config.interface, vips, this.log, { reason });
    this.vipRounds.add(rounds);
    void rounds.done.then(() => this.vipRounds.delete(rounds));
  }

  /**
   * The start's announcements on the link, once every wanted real not known down has its MAC (or
   * START_LINK_WAIT_MS passed): sent at once, they drew the segment's traffic to this LB about
   * 250 ms before it could forward any (dropped as neighbor_unknown); until then the segment's
   * entries stay where they were (a previous LB still serving), and an ARP request for a VIP is
   * answered by the kernel all the same.
   */
  private announceStartOnLink(beganMs: number): void {
    this.startLinkTimer = null;
    if (!this.started || this.stopping) return;
    const waiting = this.serviceViews().some((v) => v.reals.some(awaitsMac));
    if (waiting && monotonicMs() - beganMs < START_LINK_WAIT_MS) {
      this.startLinkTimer = setTimeout(() => this.announceStartOnLink(beganMs), 50);
      this.startLinkTimer.unref();
      return;
    }
    this.announceOnLink(this.vips(), 'start');
  }

  /** Proven up with its MAC (or its next hop's) known, or confirmed down: see announceWanted. */
  private realSettled(sid: string, r: RealConfig): boolean {
    const fact = this.health.fact(RealRegistry.keyOf(sid, r.address));
    if (fact === undefined || !fact.settled) return false;
    return fact.state === 'down' || this.macOfReal(r) !== null;
  }

  /** The MAC a frame for real r goes to: its own (l2), or its next hop's (ipip). */
  private macOfReal(r: Pick<RealConfig, 'address' | 'forwarding'>): Uint8Array | null {
    return this.neighbors.macOf(this.neighborOf(r));
  }

  /** An IPIP real's outer source and route MTU, as its route gives them (none: the family's source, the interface's MTU). */
  private tunnelOf(r: Pick<RealConfig, 'address' | 'forwarding'>): { tunnelSource?: string | null; tunnelMtu?: number | null } {
    const route = r.forwarding === 'ipip' ? this.tunnelRoutes.get(r.address) : undefined;
    return route === undefined ? {} : { tunnelSource: route.source, tunnelMtu: route.mtu };
  }

  private async syncAnnouncements(): Promise<void> {
    if (!this.announcer || this.announceBusy || !this.config.announce.enabled || this.stopping) return;
    this.announceBusy = true;
    try {
      await this.announcer.sync(this.announceWanted());
    } catch (err) {
      this.log.error('announcement update failed', { error: (err as Error).message });
    } finally {
      this.announceBusy = false;
    }
  }

  /** Operator override (`dsrlb announce|withdraw SERVICE`), kept in the state file. */
  setAnnounce(serviceRef: string, announce: boolean): Promise<AnnounceResult> {
    return this.exclusive(() => this.setAnnounceNow(serviceRef, announce));
  }

  /**
   * The operator's withdraw/announce of a service. The route is its VIP's: withdrawing any service
   * of a VIP takes the VIP off this LB, and it comes back once none of them is withdrawn; the answer
   * names the services that share it.
   */
  private async setAnnounceNow(serviceRef: string, announce: boolean): Promise<AnnounceResult> {
    const s = this.findService(serviceRef);
    if (!s) throw this.unknownService(serviceRef);
    if (!this.config.announce.enabled) throw new DaemonError('ANNOUNCE_DISABLED', 'announce.enabled is false in the config: nothing is announced');
    const sid = serviceIdentity(s);
    // As undrain of a real not drained: said, exit 0, nothing written.
    const unchanged = this.withdrawn.has(sid) !== announce;
    const withdrawn = new Set(this.withdrawn);
    if (announce) withdrawn.delete(sid);
    else withdrawn.add(sid);
    if (!unchanged) {
      await this.saveState(this.overrides, withdrawn);
      this.withdrawn = withdrawn;
    }
    const sharing = this.config.services.filter((x) => x.vip === s.vip && x !== s && x.announce);
    const stillWithdrawn = sharing.filter((x) => withdrawn.has(serviceIdentity(x))).map((x) => x.name);
    if (!unchanged) {
      this.log.info(announce ? 'operator: announce' : 'operator: withdraw', { service: s.name, vip: s.vip, sharedWith: sharing.map((x) => x.name) });
      await this.syncAnnouncements();
    }
    return { service: s.name, announce, vip: s.vip, sharedWith: sharing.map((x) => x.name), stillWithdrawnBy: stillWithdrawn, unchanged };
  }

  /** Every real frames may go to: the configured ones, and removed ones that still drain their flows. */
  private forwardedReals(): Pick<RealConfig, 'address' | 'forwarding'>[] {
    const reals: Pick<RealConfig, 'address' | 'forwarding'>[] = this.config.services.flatMap((s) => s.reals);
    for (const r of this.reals.values()) if (r.removed) reals.push(r);
    return reals;
  }

  /** Addresses whose MACs the data plane needs: L2 reals, and the next hops of IPIP reals. */
  private l2RealAddresses(): string[] {
    return [...new Set(this.forwardedReals().map((r) => this.neighborOf(r)))];
  }

  /** The address whose MAC a real's frames go to: its own (L2), or its IPIP next hop. */
  private neighborOf(r: Pick<RealConfig, 'address' | 'forwarding'>): string {
    return r.forwarding === 'ipip' ? (this.tunnelRoutes.get(r.address)?.nextHop ?? r.address) : r.address;
  }

  /**
   * Routes of IPIP reals (removed ones that drain too) from the LB's routing table: next hop, the
   * outer source (tunnel.sourceV4/V6, else the route's prefsrc as IPVS takes it, else the
   * interface's first address of the family; never a VIP, which a real drops as a martian source)
   * and the route's MTU, for `config`; changes nothing, so a reload can ask before it commits.
   * Throws when the interface's addresses cannot be read.
   */
  private async resolveTunnelRoutes(config: Config, previous?: ReadonlyMap<string, TunnelRoute>): Promise<{ routes: Map<string, TunnelRoute>; sources: TunnelSources }> {
    const hops = new Map<string, TunnelRoute>();
    const vips = new Set(this.vips(config).map(normalizedAddress));
    const notVip = (a: string | null | undefined): string | null => (a && !vips.has(normalizedAddress(a)) ? a : null);
    let v4 = config.tunnel.sourceV4;
    let v6 = config.tunnel.sourceV6;
    if (!v4 || !v6) {
      const { stdout } = await systemRunner(['ip', '-j', 'addr', 'show', 'dev', config.interface]);
      const info = (JSON.parse(stdout || '[]') as { addr_info?: { family: string; local: string; scope: string }[] }[])[0]?.addr_info ?? [];
      // The VIPs may sit on this interface too (io: pcap, or an operator's own): they are not sources.
      v4 ??= info.find((a) => a.family === 'inet' && notVip(a.local) !== null)?.local ?? null;
      v6 ??= info.find((a) => a.family === 'inet6' && a.scope === 'global' && notVip(a.local) !== null)?.local ?? null;
    }
    // this.reals: the pairs a reload would mark removed drain their flows the way they went.
    const reals: Pick<RealConfig, 'address' | 'forwarding'>[] = [...config.services.flatMap((s) => s.reals), ...this.reals.values()];
    // Once per address (it is in the config and in this.reals), all in one `ip` run.
    const asked = [...new Set(reals.filter((r) => r.forwarding === 'ipip').map((r) => r.address))];
    const routes = await lookupRoutes(asked, COMMAND_TIMEOUT_MS, (a) => (a.includes(':') ? config.tunnel.sourceV6 : config.tunnel.sourceV4));
    for (const address of asked) {
      const route = routes.get(address);
      if (route === undefined || route instanceof Error) {
        this.warnOnce(`route ${address}`, 'no route to IPIP real', { real: address, error: route?.message ?? 'not asked' });
        // A lookup that failed once (a flap, a timeout) keeps the next hop that worked.
        const kept = previous?.get(address);
        if (kept !== undefined) hops.set(address, kept);
        continue;
      }
      const v6Real = address.includes(':');
      const configured = v6Real ? config.tunnel.sourceV6 : config.tunnel.sourceV4;
      const source = configured ?? notVip(route.prefsrc) ?? (v6Real ? v6 : v4);
      if (route.dev !== null && route.dev !== config.interface) {
        this.warnOnce(`dev ${address} ${route.dev}`, 'IPIP real is not reached through the forwarding interface', { real: address, dev: route.dev, interface: config.interface });
      }
      let mtu = route.mtu;
      if (route.mtuLearned && mtu !== null && mtu < MIN_LEARNED_MTU) {
        this.warnOnce(`learned mtu ${address}`, 'ignored a path MTU toward an IPIP real below 1280 that the kernel learned from an ICMP error (a forged one shrinks every tunnel packet): configure a smaller path with a route mtu', { real: address, mtu, routeMtu: route.routeMtu });
        mtu = route.routeMtu;
      } else this.warned.delete(`learned mtu ${address}`);
      hops.set(address, { nextHop: route.gateway ?? address, source, mtu });
      this.warned.delete(`route ${address}`); // a later loss of the route is said again
    }
    return { routes: hops, sources: { v4, v6 } };
  }

  /** A warning logged once per key (the routes are asked again every ROUTE_REFRESH_MS). */
  private warnOnce(key: string, msg: string, fields: Record<string, unknown>): void {
    if (this.warned.has(key)) return;
    this.warned.add(key);
    this.log.warn(msg, fields);
  }

  /**
   * Every ROUTE_REFRESH_MS while there are IPIP reals: their next hops (and the tunnel sources)
   * asked again, and a change rebuilds the snapshot. They were asked only at start and reload, so a
   * route change kept the tunnel going to the old gateway.
   */
  private refreshTunnelRoutes(): Promise<void> {
    // Removed IPIP reals are forgotten once drained: their sockets go with them here.
    this.syncPathMtuSockets();
    // this.reals holds every configured pair and the removed ones still draining.
    if (![...this.reals.values()].some((r) => r.forwarding === 'ipip')) return Promise.resolve();
    // One at a time: a refresh still queued behind a reload (or still asking) is not doubled.
    if (this.routesRefreshing) return Promise.resolve();
    this.routesRefreshing = true;
    return this.exclusive(async () => {
      if (this.stopping) return;
      let tunnel: Awaited<ReturnType<Daemon['resolveTunnelRoutes']>>;
      try {
        tunnel = await this.resolveTunnelRoutes(this.config, this.tunnelRoutes);
      } catch (err) {
        this.warnOnce('tunnel sources', 'cannot read the tunnel routes', { error: (err as Error).message });
        return;
      }
      const before = this.tunnelRoutes;
      const same = (x: TunnelRoute | undefined, y: TunnelRoute | undefined): boolean => x?.nextHop === y?.nextHop && x?.source === y?.source && x?.mtu === y?.mtu;
      const moved = [...new Set([...before.keys(), ...tunnel.routes.keys()])].filter((a) => !same(before.get(a), tunnel.routes.get(a)));
      const sourcesChanged = tunnel.sources.v4 !== this.tunnelSources.v4 || tunnel.sources.v6 !== this.tunnelSources.v6;
      if (moved.length === 0 && !sourcesChanged) return;
      for (const a of moved) this.log.info('IPIP real route changed', { real: a, previous: before.get(a) ?? null, now: tunnel.routes.get(a) ?? null });
      if (sourcesChanged) this.log.info('IPIP tunnel source changed', { previous: this.tunnelSources, now: tunnel.sources });
      this.tunnelRoutes = tunnel.routes;
      this.tunnelSources = tunnel.sources;
      this.syncPathMtuSockets();
      this.neighbors.setWanted(this.l2RealAddresses());
      this.rebuild('IPIP route change');
    }).finally(() => {
      this.routesRefreshing = false;
    });
  }

  /**
   * A router said tunnel packets toward these IPIP reals were too big (their path-MTU sockets'
   * errors, gathered by tooBigRefresh): the kernel has recorded the smaller MTU, so the routes are
   * asked again now, not at the next ROUTE_REFRESH_MS, during which the clients' full-size segments
   * were lost in the tunnel. Logged once per real per TOO_BIG_LOG_MS (the kernel keeps a learned
   * MTU 10 minutes; a flood of errors is not a flood of log lines).
   */
  private refreshAfterTooBig(reals: readonly string[]): void {
    const now = monotonicMs();
    for (const [real, at] of this.tooBigLoggedAt) if (now - at >= TOO_BIG_LOG_MS) this.tooBigLoggedAt.delete(real);
    // The sockets name a real in full (normalizedAddress); the log as the config writes it.
    const fresh = reals.filter((r) => !this.tooBigLoggedAt.has(r));
    for (const r of fresh) this.tooBigLoggedAt.set(r, now);
    if (fresh.length > 0) {
      const named = fresh.map((r) => [...this.reals.values()].find((x) => normalizedAddress(x.address) === r)?.address ?? r);
      this.log.info('a router says tunnel packets toward IPIP reals were too big: the routes asked again now', { reals: named });
    }
    void this.refreshTunnelRoutes();
  }

  /** The path-MTU raw sockets of the IPIP reals (configured, or removed and draining), each from its tunnel's source. */
  private syncPathMtuSockets(): void {
    this.pathMtu.sync(
      [...this.reals.values()]
        .filter((r) => r.forwarding === 'ipip')
        .map((r) => ({ address: normalizedAddress(r.address), source: this.tunnelRoutes.get(r.address)?.source ?? null })),
    );
  }

  /** Make this.reals match the config: new pairs get ids, vanished ones are marked removed (drained). */
  private syncReals(): void {
    const present = new Set<string>();
    const nameOf = new Map(this.config.services.map((s) => [serviceIdentity(s), s.name]));
    for (const s of this.config.services) {
      const sid = serviceIdentity(s);
      for (const r of s.reals) {
        const key = RealRegistry.keyOf(sid, r.address);
        present.add(key);
        const existing = this.reals.get(key);
        if (existing) {
          existing.removed = false;
          existing.forwarding = r.forwarding;
          continue;
        }
        const id = this.registry.idFor(key);
        this.rebaseCounters(id);
        this.reals.set(key, { key, id, service: sid, serviceName: s.name, address: r.address, forwarding: r.forwarding, removed: false, removedGeneration: 0 });
      }
    }
    for (const r of this.reals.values()) {
      // A renamed service is the same service (identity is the tuple): metrics and logs take the new
      // name, for its draining removed reals too.
      const name = nameOf.get(r.service);
      if (name !== undefined && name !== r.serviceName) {
        this.metrics.forgetReal(r.serviceName, r.address);
        r.serviceName = name;
      }
      if (!present.has(r.key) && !r.removed) {
        r.removed = true;
        r.removedGeneration = this.builder.lastGeneration + 1;
        this.log.info('real removed from config: draining', { service: r.serviceName, real: r.address });
      }
    }
    this.syncHealthTargets();
  }

  /** Probes for every real known (removed, draining ones too: if one dies, its flows move instead of black-holing). */
  private syncHealthTargets(): void {
    const targets: HealthTarget[] = [];
    // By identity in a Map: a find over the services per real took 1.8 s at 2,000 services.
    const byIdentity = new Map<string, ServiceConfig>();
    for (const x of this.drainingServices()) byIdentity.set(serviceIdentity(x), x);
    for (const x of this.config.services) byIdentity.set(serviceIdentity(x), x);
    for (const r of this.reals.values()) {
      const s = byIdentity.get(r.service);
      if (!s) continue;
      targets.push({ key: r.key, service: s.name, address: r.address, vip: s.vip, check: s.healthCheck });
    }
    this.health.setTargets(targets);
  }

  /** Flow-table entries over all loops (each holds its share); the config's before the loops start. */
  private flowTableCapacity(): number {
    return this.loops.flowCapacity || this.config.flowTable.capacity;
  }

  /** The damped health fact of a real (no health check: up; probes not decided yet: unknown). */
  private healthOf(key: string): HealthFact {
    const fact = this.health.fact(key);
    if (fact === undefined) return 'down';
    return fact.state === 'down' && !fact.settled ? 'unknown' : fact.state;
  }

  private intentOf(key: string, cfgState: RealIntent, cfgWeight: number): { state: RealIntent; weight: number } {
    const o = this.overrides.get(key);
    if (!o || o.configState !== cfgState || o.configWeight !== cfgWeight) return { state: cfgState, weight: cfgWeight };
    return { state: o.state ?? cfgState, weight: o.weight ?? cfgWeight };
  }

  private serviceViews(): ServiceView[] {
    const views: ServiceView[] = [];
    const services = [...this.config.services.map((s) => ({ s, removed: false })), ...this.drainingServices().map((s) => ({ s, removed: true }))];
    // Removed reals by service, once: a scan of every real per service was quadratic.
    const removedBy = new Map<string, RealRuntime[]>();
    for (const rt of this.reals.values()) {
      if (!rt.removed) continue;
      const list = removedBy.get(rt.service);
      if (list === undefined) removedBy.set(rt.service, [rt]);
      else list.push(rt);
    }
    for (const { s, removed } of services) {
      const sid = serviceIdentity(s);
      const reals: RealView[] = [];
      for (const r of removed ? [] : s.reals) {
        const key = RealRegistry.keyOf(sid, r.address);
        const rt = this.reals.get(key)!;
        const intent = this.intentOf(key, r.state, r.weight);
        reals.push({
          id: rt.id,
          address: r.address,
          weight: intent.weight,
          intent: intent.state,
          forwarding: r.forwarding,
          health: this.healthOf(key),
          removed: false,
          mac: this.macOfReal(r),
          backup: r.backup,
          ...this.tunnelOf(r),
        });
      }
      const kept = removed ? undefined : this.panicKept.get(sid);
      if (kept !== undefined) keepRisingReals(reals, kept);
      for (const rt of removedBy.get(sid) ?? []) {
        reals.push({
          id: rt.id,
          address: rt.address,
          weight: 0,
          intent: 'drain',
          forwarding: rt.forwarding,
          health: this.healthOf(rt.key),
          removed: true,
          mac: this.macOfReal(rt),
          ...this.tunnelOf(rt),
        });
      }
      views.push({ config: s, reals, removed });
    }
    return views;
  }

  /**
   * One rebuild for the changes that come within QUEUED_REBUILD_MS: probe results arrive one by
   * one, and with 1,000 reals flapping each rebuilt every service (529 rebuilds in 30 s, 87% of
   * the main thread). Health is damped over seconds already; 100 ms more changes nothing.
   */
  private queueRebuild(why: string): void {
    if (this.rebuildQueued) return;
    this.rebuildQueued = true;
    const timer = setTimeout(() => {
      this.rebuildQueued = false;
      this.rebuild(why);
    }, QUEUED_REBUILD_MS);
    timer.unref();
  }

  /** Build a snapshot from the current view and hand it to the packet loop. */
  rebuild(why: string): void {
    const views = this.serviceViews();
    const { snapshot, services } = this.builder.build(views, this.config.hashSeed, MAX_REAL_IDS, this.tunnelSources);
    // By name in Maps: finds over the services per service were quadratic (2,000 services).
    const built = new Set(services.map((s) => s.name));
    for (const gone of this.lastReports) {
      if (!built.has(gone.name)) this.metrics.forgetService(gone.name);
    }
    const configs = new Map(this.config.services.map((c) => [c.name, c]));
    // First wins, as find did: a draining removed service may share a configured one's name.
    const previous = new Map<string, ServiceBuildReport>();
    for (const p of this.lastReports) if (!previous.has(p.name)) previous.set(p.name, p);
    const dropping = new Set<string>();
    // The builder reports the services in the order of the views it was given.
    for (const [i, s] of services.entries()) {
      const view = views[i]!;
      const cfg = configs.get(s.name);
      // A service still settling (reals proving up, MACs arriving) has its table built, not moved.
      const wasSettled = cfg !== undefined && this.settledServices.has(serviceIdentity(cfg));
      if (cfg !== undefined) this.settled(cfg);
      if (s.movedSlots > 0) {
        if (wasSettled) this.metrics.tableMovedSlots.inc({ service: s.name }, s.movedSlots);
        this.log.info('forwarding table rebuilt', { service: s.name, movedSlots: s.movedSlots, tableSize: s.tableSize, why, ...(wasSettled ? {} : { settling: true }) });
      }
      const prev = previous.get(s.name);
      if (inPanic(s) && !(prev !== undefined && inPanic(prev))) this.log.warn('no real is up: failOpen, forwarding to all wanted reals', { service: s.name });
      if (s.onBackups && !prev?.onBackups) this.log.warn('no real but the backups can take new flows: the backups take them', { service: s.name });
      else if (!s.onBackups && prev?.onBackups === true) this.log.info('the backups take no new flows again', { service: s.name });
      // Once per dropping episode (a service by identity: a removed one draining may share the
      // name). A service still settling whose wanted reals only wait for their first check or
      // their MACs (a second or so at start or after a reload) is worth no warning; if it then
      // drops for another reason (its reals found down, or settled without), the warning comes.
      if (s.dropping && view.removed !== true) {
        const sid = serviceIdentity(view.config);
        dropping.add(sid);
        if (!this.dropWarned.has(sid)) {
          if (!this.settledServices.has(sid) && stillSettling(view)) {
            if (!prev?.dropping) this.log.info("waiting for the reals' first checks and MACs before forwarding", { service: s.name });
          } else {
            this.dropWarned.add(sid);
            this.log.warn('no real can take new flows: dropping', { service: s.name, reason: droppingReason(view) });
          }
        }
      }
    }
    for (const sid of this.dropWarned) if (!dropping.has(sid)) this.dropWarned.delete(sid);
    const configured = new Set(this.config.services.map(serviceIdentity));
    this.panicEnding.keepOnly(configured);
    for (const sid of this.panicKept.keys()) if (!configured.has(sid)) this.panicKept.delete(sid);
    for (const [i, s] of services.entries()) {
      const cfg = configs.get(s.name);
      if (cfg === undefined || views[i]!.removed === true) continue;
      const sid = serviceIdentity(cfg);
      // With onRealDown keep a down real keeps its flows anyway: nothing to wait for.
      if (inPanic(s) && cfg.onRealDown === 'reschedule') {
        this.panicEnding.hold(sid);
        this.panicKept.set(sid, new Set(views[i]!.reals.filter(isWanted).map((r) => r.id)));
      } else this.endPanicWait(cfg, s.dropping);
    }
    this.lastReports = services;
    this.send({ type: 'snapshot', snapshot });
  }

  /**
   * After a failOpen panic: whether the reals still down may lose the flows the panic kept (see
   * panicEnding). Asked at every rebuild and once a second; a rebuild follows the end of the wait.
   */
  private endPanicWait(cfg: ServiceConfig, dropping: boolean): void {
    const sid = serviceIdentity(cfg);
    const panicKept = this.panicKept.get(sid);
    if (panicKept === undefined) return;
    // Only the reals the panic kept flows on that are still down, wanted and in the config: one
    // seen up since falls as any real does, one the operator took out loses its flows as it says.
    const kept = new Set<number>();
    for (const r of cfg.reals) {
      const key = RealRegistry.keyOf(sid, r.address);
      const id = this.reals.get(key)?.id;
      if (id !== undefined && panicKept.has(id) && this.wantedByIntent(key, r) && this.healthOf(key) === 'down') kept.add(id);
    }
    this.panicKept.set(sid, kept);
    // Dropping (the operator took every real out, or a reload said whenAllDown: drop): nothing is
    // kept across that. And none left to wait for: no wait.
    // (Neither case had a real shown otherwise: keepRisingReals needs one up.)
    if (dropping || kept.size === 0) {
      this.panicEnding.forget(sid);
      this.panicKept.delete(sid);
      return;
    }
    const recovery = this.recoveryOf([cfg]);
    const d = this.panicEnding.decide(sid, recovery, monotonicMs());
    if (!d.over) {
      if (d.began) this.log.info('failOpen panic over: the reals still down keep their flows while they may still come up', { service: cfg.name, realsDown: kept.size, atMostMs: Math.min(recovery.riseMs, RECOVERY_CAP_MS) });
      return;
    }
    this.panicKept.delete(sid);
    this.log.info('reals not back after the failOpen panic: their flows move', { service: cfg.name, realsNotUp: kept.size, waitedMs: Math.round(d.waitedMs) });
    this.queueRebuild('failOpen panic over');
  }

  /** Once a second: rates, and forgetting removed reals whose last flow is gone. */
  private tick(): void {
    this.warnUnresolvedMacs();
    if (this.panicKept.size > 0) for (const s of this.config.services) if (this.panicEnding.isWaiting(serviceIdentity(s))) this.endPanicWait(s, false);
    if (++this.ticks % DROP_TABLE_CHECK_TICKS === 0) void this.checkDropTable();
    let forget = false;
    const counters = this.loops.counters();
    // The oldest snapshot a loop still runs: a removed real's id is free only once none runs one that schedules onto it.
    const applied = counters[Counter.snapshotGeneration]!;
    for (const r of [...this.reals.values()]) {
      const packets = this.realCount(counters, r.id, RealCounter.forwardedPackets);
      const bytes = this.realCount(counters, r.id, RealCounter.forwardedBytes);
      const prev = this.rates.get(r.id);
      this.rates.set(r.id, { packets, bytes, pps: prev ? packets - prev.packets : 0, bps: prev ? bytes - prev.bytes : 0 });
      if (r.removed && applied >= r.removedGeneration && this.loops.active(r.id) === 0 && this.loops.inactive(r.id) === 0) {
        this.reals.delete(r.key);
        this.registry.release(r.key);
        // The id's next owner starts its rates afresh (its counters start from a new base).
        this.rates.delete(r.id);
        this.metrics.forgetReal(r.serviceName, r.address);
        this.log.info('removed real drained: forgotten', { service: r.serviceName, real: r.address });
        forget = true;
      }
    }
    if (forget) {
      const drained: string[] = [];
      for (const [sid, s] of this.removedServices) {
        if ([...this.reals.values()].some((r) => r.service === sid)) continue;
        this.removedServices.delete(sid);
        drained.push(s.name);
        this.log.info('removed service drained: forgotten', { service: s.name });
      }
      // One host change releases the VIPs of every service forgotten here.
      if (drained.length > 0) {
        void this.exclusive(() => this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' })).catch((err: Error) =>
          this.log.warn('could not release a drained service\'s VIP', { services: drained, error: err.message }),
        );
      }
      this.neighbors.setWanted(this.l2RealAddresses());
      // Forgotten reals are probed no more.
      this.syncHealthTargets();
      this.rebuild('removed real drained');
    }
  }

  /**
   * Puts the nftables drop table back when someone removed it: `systemctl reload nftables` and
   * firewalld flush the whole ruleset, and then the kernel, holding the VIPs, answered every
   * client packet the loops also forward with a RST. Logged as an error and counted.
   */
  private async checkDropTable(): Promise<void> {
    if (this.checkingDropTable || !this.started || this.stopping) return;
    this.checkingDropTable = true;
    try {
      // Looked at outside the queue of changes (no wait behind a reload), and again in it: a
      // change that ran meanwhile may have put the table back.
      if ((await this.host.dropTablePresent()) !== false) return;
      await this.exclusive(async () => {
        if (this.stopping || (await this.host.dropTablePresent()) !== false) return;
        await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' });
        this.metrics.dropTableRestored.inc();
        this.log.error('the nftables table inet dsrlb was removed from outside (an nftables or firewalld reload flushes the whole ruleset): put back; meanwhile the kernel answered the VIPs\' clients with resets', {
          fix: 'exclude table inet dsrlb from the flush (nftables.conf: flush only your own tables), or reload dsrlb after the firewall',
        });
      });
    } catch (err) {
      this.log.error('could not put back the nftables table inet dsrlb', { error: (err as Error).message });
    } finally {
      this.checkingDropTable = false;
    }
  }

  /** Reload the config file: all or nothing; reloads (SIGHUP, admin API) run one after the other. */
  reload(): Promise<ReloadResult> {
    // Reloads asked for while one waits its turn share it: it reads the file when it starts, so it
    // takes every edit made before. A SIGHUP storm queued one reload each, and a SIGTERM (or a
    // drain) behind them waited for all of them.
    if (this.waitingReload) return this.waitingReload;
    const reload = this.exclusive(() => {
      this.waitingReload = null;
      return this.reloadNow();
    });
    this.waitingReload = reload;
    return reload;
  }

  /** A reload refused: counted (the config in force stays), logged with every problem. */
  private refuseReload(problems: readonly ConfigProblem[], refusedBy: 'config' | 'system', message = 'reload refused'): ReloadResult {
    this.metrics.reloadRefused();
    this.log.error(message, { problems: problemLines(problems) });
    return { ok: false, problems, refusedBy };
  }

  private async reloadNow(): Promise<ReloadResult> {
    const vipsBefore = new Set(this.vips());
    const { text, result: loaded } = await readConfigFile(this.configPath);
    if (!loaded.ok) return this.refuseReload(loaded.problems, 'config', 'reload refused: config invalid, the running config stays');
    const next = loaded.config;
    const refusals = this.unreloadable(next);
    if (refusals.length > 0) return this.refuseReload(located(text!, refusals), 'config');
    let token: Buffer | null;
    try {
      token = await readAdminToken(next);
    } catch (err) {
      const problems = (err as DaemonError).problems ?? [{ path: 'admin.tokenFile', message: (err as Error).message }];
      return this.refuseReload(problems, err instanceof DaemonError ? err.refusedBy : 'system');
    }
    // Services this reload removes drain (see removedServices); one it brings back is configured
    // again. Taken only with the reload, like the config.
    const removed = new Map(this.removedServices);
    const nextIds = new Set(next.services.map((s) => serviceIdentity(s)));
    for (const s of this.config.services) if (!nextIds.has(serviceIdentity(s))) removed.set(serviceIdentity(s), s);
    for (const sid of nextIds) removed.delete(sid);
    // Everything that can fail runs before the config is swapped: a reload is all or nothing.
    const idProblem = this.realIdShortage(next);
    if (idProblem !== null) return this.refuseReload(located(text!, [idProblem]), 'config');
    const clashes = vipClashProblems(next, await this.host.interfaceAddressesAmong(this.vips(next, removed)).catch(() => new Map<string, string>()));
    if (clashes.length > 0) return this.refuseReload(located(text!, clashes), 'config');
    let tunnel: Awaited<ReturnType<Daemon['resolveTunnelRoutes']>>;
    try {
      tunnel = await this.resolveTunnelRoutes(next);
    } catch (err) {
      return this.refuseReload([{ path: '(host)', message: `reading the addresses of ${next.interface}: ${(err as Error).message}` }], 'system');
    }
    try {
      await this.host.apply(this.vips(next, removed), { disableGro: next.io === 'pcap' });
    } catch (err) {
      const refused = this.refuseReload([{ path: '(host)', message: (err as Error).message }], 'system', 'reload refused: host change failed');
      await this.restoreHost();
      return refused;
    }
    // A new stateFile gets the intent in force before the swap, as the last step that can fail (a
    // refusal after it would leave that copy behind). One that cannot take it refuses the reload:
    // the intent would be on disk nowhere (a restart loses it) and every later change refused.
    const stateFileMoved = next.stateFile !== this.config.stateFile;
    if (stateFileMoved && next.stateFile) {
      try {
        await this.saveState(this.overrides, this.withdrawn, next.stateFile);
      } catch (err) {
        const why = (err as Error).message.replace(/^nothing changed: /, '');
        if (this.intentKeptBy(next)) {
          const refused = this.refuseReload([{ path: 'stateFile', message: `${why}: the operator intent in force (drains, weights, withdrawals) would be lost` }], 'system');
          await this.restoreHost();
          return refused;
        }
        this.log.warn('the state file cannot be written: operator intent changes will be refused', { stateFile: next.stateFile, error: why });
      }
    }
    const draining = this.drainingServices(next, removed);
    for (const [sid, s] of removed) {
      if (this.removedServices.has(sid)) continue;
      const blocker = removalBlocker(next.services, s);
      if (draining.includes(s)) this.log.info('service removed from config: its flows drain', { service: s.name });
      else if (blocker === null) this.log.info('service removed from config: it had no flows', { service: s.name });
      else this.log.warn('service removed from config: its flows are cut', { service: s.name, why: blocker });
    }
    // Whether each newly removed service's VIP was announced, before the swap prunes its
    // withdrawal (a withdrawn service must not come back on the air as it drains).
    const drainAnnounced = new Set([...this.drainAnnounced].filter((sid) => removed.has(sid)));
    for (const [sid, s] of removed) {
      if (this.removedServices.has(sid)) continue;
      if (s.announce && !this.withdrawn.has(sid) && this.announcer?.isAnnounced(s.vip) === true) drainAnnounced.add(sid);
    }
    // The swap, up to the new snapshot, has no await in it: a timer (tick, a queued rebuild, the
    // announce check) must never see the new config with the old reals.
    this.removedServices = removed;
    this.drainAnnounced = drainAnnounced;
    // A service that leaves the config settles again if it comes back (its reals, MACs and table are new).
    const kept = new Set(next.services.map(serviceIdentity));
    for (const sid of [...this.settledServices]) if (!kept.has(sid)) this.settledServices.delete(sid);
    for (const sid of [...this.firstSeenMs.keys()]) if (!kept.has(sid)) this.firstSeenMs.delete(sid);
    this.config = next;
    this.configText = text!;
    this.adminToken = token;
    const { changed: pruned, dropped } = this.pruneOverrides();
    this.send({ type: 'timeouts', timeouts: timeoutsOf(next) });
    this.syncReals();
    this.tunnelRoutes = tunnel.routes;
    this.tunnelSources = tunnel.sources;
    this.syncPathMtuSockets();
    this.neighbors.setWanted(this.l2RealAddresses());
    this.rebuild('reload');
    this.metrics.reloadTaken();
    this.log.info('reload taken', { services: next.services.map((s) => s.name) });
    this.announceOnLink(this.vips().filter((v) => !vipsBefore.has(v)), 'reload');
    // Taken: what follows only follows the new config, and says so in the log when it cannot.
    if (pruned) await this.saveStateOrWarn();
    if (stateFileMoved) await this.recordStateFile();
    const stateFileProblem = await this.checkStateFileWritable();
    // Announcing follows the new config without holding the answer (a BIRD that did not answer
    // made a reload already taken look failed), chained so that a reload turning it off and the
    // next turning it on again never run their syncs at once. The 200 ms check retries failures.
    this.announcing = this.announcing
      .then(() => (this.config.announce.enabled ? this.startAnnouncing() : this.stopAnnouncing()))
      .catch((err: Error) => this.log.error('announcement update failed', { error: err.message }));
    return { ok: true, problems: [], warnings: stateFileProblem === null ? dropped : [...dropped, stateFileProblem] };
  }

  /** A refused reload puts the host back as the config in force wants it (best effort). */
  private async restoreHost(): Promise<void> {
    await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' }).catch(() => undefined);
  }

  /** Why `next` cannot be taken for lack of real ids (new pairs beyond the free ids), or null. */
  private realIdShortage(next: Config): ConfigProblem | null {
    let wanted = 0;
    for (const s of next.services) for (const r of s.reals) if (!this.registry.has(RealRegistry.keyOf(serviceIdentity(s), r.address))) wanted++;
    const free = this.registry.available();
    if (wanted <= free) return null;
    const draining = [...this.reals.values()].filter((r) => r.removed).length;
    return { path: 'services', message: `${wanted} new (service, real) pairs but only ${free} real ids free of ${MAX_REAL_IDS}: ${draining} removed reals keep theirs until their flows end` };
  }

  /**
   * A request brought a token that is not the one held: read the token file again if it changed
   * since the last such read (a stat per unmatched request, a read per change), so that a rotated
   * token works for `dsrlb reload` itself. True if the token changed.
   */
  async rereadAdminToken(): Promise<boolean> {
    const file = this.config.admin.tokenFile;
    if (this.adminToken === null || !file) return false;
    const st = await stat(file).catch(() => null);
    const stamp = st ? `${st.mtimeMs}:${st.size}:${st.ino}` : 'missing';
    if (stamp === this.tokenFileStamp) return false;
    this.tokenFileStamp = stamp;
    let token: Buffer | null;
    try {
      token = await readAdminToken(this.config);
    } catch (err) {
      this.log.warn('admin token file unreadable: the token read before stays', { error: (err as Error).message });
      return false;
    }
    if (token === null || token.equals(this.adminToken)) return false;
    this.adminToken = token;
    this.log.info('admin token file changed: the new token is taken', { tokenFile: this.config.admin.tokenFile });
    return true;
  }

  /** Keys a running daemon cannot change without a restart. */
  private unreloadable(next: Config): ConfigProblem[] {
    return restartOnlyChanges(this.config, next).map((c) => ({ path: c.path, message: `changing ${c.what} (${c.before} -> ${c.after}) needs a restart${c.why === null ? '' : ` (${c.why})`}` }));
  }

  /**
   * A service by name, by `tcp://VIP:PORT` / `udp://[V6]:PORT`, or by `VIP:PORT` as status prints
   * it (ipvsadm's `-t VIP:PORT`) when only one protocol has that address; any spelling of the address.
   */
  findService(ref: string): ServiceConfig | null {
    const byName = this.config.services.find((s) => s.name === ref);
    if (byName) return byName;
    const a = parseServiceRef(ref);
    if (a === null) return null;
    const found = this.servicesAt(a, a.port);
    if (found.length > 1) throw new DaemonError('AMBIGUOUS_SERVICE', `"${ref}" is ${found.map((s) => `${serviceAddressName(s.protocol, s.vip, s.port)} (${s.name})`).join(' and ')}: name one`);
    return found[0] ?? null;
  }

  /**
   * The services on `port` of the VIP `a` names, of its protocol (either when it names none): the
   * configured ones, or those of `among` (the removed ones that drain).
   */
  private servicesAt(a: { protocol: string | null; vip: string }, port: number, among: Iterable<ServiceConfig> = this.config.services): ServiceConfig[] {
    return [...among].filter((s) => (a.protocol === null || s.protocol === a.protocol) && s.vip === a.vip && s.port === port);
  }

  /** UNKNOWN_SERVICE, with the ways a service can be named. */
  private unknownService(ref: string): DaemonError {
    const removed = this.findRemovedService(ref);
    if (removed !== null) {
      return new DaemonError(
        'UNKNOWN_SERVICE_REMOVED',
        `service "${removed.name}" was removed from the config by a reload: its flows drain on their reals (dsrlb status and dsrlb flows list them) and it takes no new ones; it cannot be changed (put it back in the config to manage it)`,
      );
    }
    const names = firstFew(this.config.services.map((s) => s.name));
    return new DaemonError('UNKNOWN_SERVICE', `unknown service "${ref}": name it (${names || 'none configured'}) or give its address, VIP:PORT or tcp://VIP:PORT`);
  }

  /** The removed service that drains (a reload took it out) `ref` names by name or address, or null. */
  private findRemovedService(ref: string): ServiceConfig | null {
    const byName = [...this.removedServices.values()].find((s) => s.name === ref);
    if (byName) return byName;
    const a = parseServiceRef(ref);
    return a === null ? null : (this.servicesAt(a, a.port, this.removedServices.values())[0] ?? null);
  }

  /**
   * The service and destination port explain asks the packet loop about. `tcp://VIP:PORT` with no
   * service on that exact port falls to the VIP's port-0 service, as packets do; a port-0 service
   * named without a port cannot be explained (no TCP or UDP packet has destination port 0).
   */
  private explainTarget(ref: string): { s: ServiceConfig; dstPort: number } {
    const s = this.findService(ref);
    const a = parseServiceRef(ref);
    if (s !== null && s.port !== 0) return { s, dstPort: s.port };
    if (a !== null && a.port !== 0) {
      const any = this.servicesAt(a, 0);
      if (any.length > 1) throw new DaemonError('AMBIGUOUS_SERVICE', `"${ref}" is served by ${any.map((c) => `${c.name} (${c.protocol})`).join(' and ')}: write tcp:// or udp://`);
      if (any.length === 1) return { s: any[0]!, dstPort: a.port };
      // A removed port-0 service of that VIP, as packets to that port still find it while it drains.
      const removedAny = any.length === 0 && s === null ? this.servicesAt(a, 0, this.removedServices.values()) : [];
      if (removedAny.length === 1) return { s: removedAny[0]!, dstPort: a.port };
    }
    // A removed service that drains is still in the loops' snapshots: where do its flows go?
    const removed = s === null ? this.findRemovedService(ref) : null;
    if (removed !== null && removed.port !== 0) return { s: removed, dstPort: removed.port };
    const portless = s ?? removed;
    if (portless !== null) {
      const vip = portless.family === 6 ? `[${portless.vip}]` : portless.vip;
      throw new DaemonError('BAD_SERVICE', `service "${portless.name}" serves every port of ${vip}: name the port, e.g. ${portless.protocol}://${vip}:443`);
    }
    throw this.unknownService(ref);
  }

  /**
   * A real of s by its address in any spelling (upper case, non-canonical IPv6), or as status
   * prints it, ADDRESS:PORT / [V6]:PORT with the service's port (DSR keeps the port: there is no other).
   */
  private findReal(s: ServiceConfig, address: string): RealConfig {
    // Port 0 for a real of a service of every port, as status prints it.
    const endpoint = parseClientEndpoint(address, 0);
    // A real of a port-0 service takes every port.
    const portFits = !('error' in endpoint) && (endpoint.port === s.port || s.port === 0);
    const canonical = 'error' in endpoint || !portFits ? parseIpAddress(address)?.address : endpoint.address;
    const found = canonical === undefined ? undefined : s.reals.find((r) => r.address === canonical);
    if (found !== undefined) return found;
    const sid = serviceIdentity(s);
    if (canonical !== undefined && [...this.reals.values()].some((r) => r.removed && r.service === sid && r.address === canonical)) {
      throw new DaemonError(
        'UNKNOWN_REAL_REMOVED',
        `real ${canonical} was removed from service "${s.name}" by a reload: its flows drain on it (dsrlb status and dsrlb flows list them) and it takes no new ones; it cannot be changed (put it back in the config to manage it)`,
      );
    }
    const port = !('error' in endpoint) && !portFits ? ` (its reals take port ${s.port}: DSR does not change the port)` : '';
    throw new DaemonError('UNKNOWN_REAL', `service "${s.name}" has no real "${address}"${port}; its reals: ${firstFew(s.reals.map((r) => r.address))}`);
  }

  /** Operator intent for one real (admin API); persisted beside the config before it takes effect. */
  setIntent(serviceRef: string, realAddress: string, change: IntentChange): Promise<IntentResult> {
    return this.exclusive(() => this.setIntentNow(serviceRef, realAddress, change));
  }

  private async setIntentNow(serviceRef: string, realAddress: string, request: IntentChange): Promise<IntentResult> {
    const s = this.findService(serviceRef);
    if (!s) throw this.unknownService(serviceRef);
    const r = this.findReal(s, realAddress);
    const key = RealRegistry.keyOf(serviceIdentity(s), r.address);
    const before = this.intentOf(key, r.state, r.weight);
    const { from, ...change } = request;
    if (from !== undefined && before.state !== from) {
      // undrain lifts only a drain, enable only a disable (as HAProxy's enable server leaves a
      // drain): the other operator's state stays and the answer says so. Not an error: a deploy
      // script's drain, work, undrain around another operator's disable would fail at its end.
      if (before.state === change.state) return { service: s.name, real: r.address, before, after: before };
      const note = before.state === 'disabled'
        ? 'undrain lifts only a drain: left disabled; enable lifts it'
        : 'enable lifts only a disable: left draining; undrain lifts it';
      this.log.info('intent left as it was', { service: s.name, real: r.address, asked: change.state, intent: before, note });
      return { service: s.name, real: r.address, before, after: before, note };
    }
    // A drain of a disabled real would loosen it (and an undrain after it make the real active,
    // lifting another operator's disable): disabled already takes no new flows, so it stays.
    if (change.state === 'drain' && before.state === 'disabled') {
      this.log.info('intent left as it was', { service: s.name, real: r.address, asked: 'drain', intent: before });
      return { service: s.name, real: r.address, before, after: before, note: 'disabled takes no flows at all, new ones included: left disabled; enable lifts it' };
    }
    // Already so (a repeated drain): nothing to save, log or rebuild; the answer says so.
    if ((change.state === undefined || change.state === before.state) && (change.weight === undefined || change.weight === before.weight)) {
      return { service: s.name, real: r.address, before, after: before };
    }
    const o = this.overrides.get(key);
    const base: IntentOverride = o && o.configState === r.state && o.configWeight === r.weight ? o : { configState: r.state, configWeight: r.weight };
    const overrides = new Map(this.overrides).set(key, { ...base, ...change });
    // Saved first: a change that cannot be kept is not made (status and the packet loop stay as they were).
    await this.saveState(overrides, this.withdrawn);
    this.overrides = overrides;
    const after = this.intentOf(key, r.state, r.weight);
    this.log.info('intent changed', { service: s.name, real: r.address, before, after });
    this.rebuild('intent');
    return { service: s.name, real: r.address, before, after };
  }

  /**
   * Drops every override whose real the config itself changed (state or weight differ from the
   * values it overrode) or no longer has: the contract keeps intent "until the config file itself
   * changes that real", so a later revert of the config must not bring it back. A withdrawal
   * goes with its service's removal from the config, for the same reason. True when any went: the
   * caller saves the state file.
   */
  /**
   * Drops the intent the config file overrode or no longer names: `changed` when anything went
   * (the state file is written again), `dropped` a sentence for each real the file changed (reload
   * prints them).
   */
  private pruneOverrides(): { changed: boolean; dropped: string[] } {
    const configReals = realsByKey(this.config);
    const services = new Map(this.config.services.map((s) => [serviceIdentity(s), s]));
    const dropped: string[] = [];
    let changed = false;
    for (const [key, o] of this.overrides) {
      const r = configReals.get(key);
      if (r && o.configState === r.state && o.configWeight === r.weight) continue;
      this.overrides.delete(key);
      changed = true;
      const at = key.lastIndexOf('#');
      const sid = key.slice(0, at);
      const service = services.get(sid);
      const real = key.slice(at + 1);
      const serviceName = service?.name ?? identityAddressName(sid);
      this.log.info('operator intent dropped: the config changed this real', { service: serviceName, real, override: o });
      // A real the file removes (the usual end of a drain) is no news; one it changed is, and so is
      // one whose service the file no longer has (moved to another port, VIP or protocol).
      if (!r && service) continue;
      const set = [o.state, o.weight === undefined ? undefined : `weight ${o.weight}`].filter((x) => x !== undefined).join(', ');
      if (r && service) {
        dropped.push(`operator intent on ${serviceName} ${real} (${set}) dropped: the config file changed that real (now ${r.state}, weight ${r.weight})`);
      } else {
        dropped.push(`operator intent on ${serviceName} ${real} (${set}) dropped: the config file has no service there any more (one moved to another VIP, port or protocol is a new service)`);
      }
    }
    for (const sid of this.withdrawn) {
      if (services.has(sid)) continue;
      this.withdrawn.delete(sid);
      this.log.info('withdrawal dropped: the service left the config', { service: identityAddressName(sid) });
      changed = true;
    }
    return { changed, dropped };
  }

  /**
   * True when operator intent that `next` keeps (pruneOverrides would not drop it) differs from
   * what `next` says: a drain, disable or weight of a real it keeps unchanged, or a withdrawal of a
   * service it keeps. An undrain back to the config's own state is no intent to lose.
   */
  private intentKeptBy(next: Config): boolean {
    const configReals = realsByKey(next);
    for (const [key, o] of this.overrides) {
      const r = configReals.get(key);
      if (!r || o.configState !== r.state || o.configWeight !== r.weight) continue;
      if ((o.state !== undefined && o.state !== r.state) || (o.weight !== undefined && o.weight !== r.weight)) return true;
    }
    const services = new Set(next.services.map((s) => serviceIdentity(s)));
    return [...this.withdrawn].some((sid) => services.has(sid));
  }

  /** Writes the state file as it stands, a failure only logged (the change it records is made). */
  private async saveStateOrWarn(): Promise<void> {
    await this.saveState(this.overrides, this.withdrawn).catch((e: Error) => this.log.warn('could not save the state file', { error: e.message }));
  }

  /**
   * The state file's intent and withdrawals. None yet (no file) is normal. A file that cannot be
   * read or parsed is said loudly and, if unparsable, set aside as FILE.corrupt-TIME (the next
   * intent change would overwrite it): the daemon still runs, on the config's intent.
   */
  private async loadOverrides(file = this.config.stateFile): Promise<void> {
    if (!file) return;
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code !== 'ENOENT') this.log.error('state file unreadable: operator intent from before this start is not applied', { stateFile: file, error: e.message });
      return;
    }
    try {
      const raw = JSON.parse(text) as unknown;
      if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Error('not a JSON object');
      const { intent, withdrawn } = raw as { intent?: unknown; withdrawn?: unknown };
      if (intent !== undefined && (intent === null || typeof intent !== 'object' || Array.isArray(intent))) throw new Error('"intent" is not an object');
      if (withdrawn !== undefined && (!Array.isArray(withdrawn) || !withdrawn.every((w) => typeof w === 'string'))) throw new Error('"withdrawn" is not a list of services');
      const overrides = new Map(Object.entries((intent ?? {}) as Record<string, IntentOverride>));
      // Every field checked as the admin API checks it: a weight of -5 here reached the Maglev
      // build, whose RangeError stopped the daemon at every start (the file is read each time).
      // A bad entry is dropped alone: the file's other drains and disables stay in force.
      const dropped: { intent: string; problem: string }[] = [];
      for (const [key, o] of overrides) {
        let problem: string | null = null;
        if (o === null || typeof o !== 'object' || !isRealIntent(o.configState) || !isWeight(o.configWeight)) problem = 'malformed';
        else if (o.state !== undefined && !isRealIntent(o.state)) problem = `state ${JSON.stringify(o.state)} is not active, drain or disabled`;
        else if (o.weight !== undefined && !isWeight(o.weight)) problem = `weight ${JSON.stringify(o.weight)} is not an integer 0..65535`;
        if (problem === null) continue;
        overrides.delete(key);
        dropped.push({ intent: key, problem });
      }
      if (dropped.length > 0) {
        // The next intent change rewrites the file without them: its bytes are kept beside it.
        const aside = `${file}.corrupt-${new Date().toISOString().replace(/[:.]/g, '-')}`;
        // EXCL: never through a symlink planted at the name (the directory is the service user's).
        const kept = await copyFile(file, aside, constants.COPYFILE_EXCL).then(() => aside, () => null);
        this.log.error('state file entries unusable: those intents are not applied, the others are', { stateFile: file, dropped, keptAs: kept });
      }
      this.overrides = overrides;
      this.withdrawn = new Set(withdrawn as string[] | undefined);
    } catch (err) {
      const aside = `${file}.corrupt-${new Date().toISOString().replace(/[:.]/g, '-')}`;
      const kept = await rename(file, aside).then(() => aside, () => null);
      this.log.error('state file unusable: operator intent from before this start is not applied', { stateFile: file, error: (err as Error).message, keptAs: kept });
    }
  }

  /** Says at start which operator intent from the state file overrides the config (status marks it too). */
  private logRestoredIntent(): void {
    for (const [key, o] of this.overrides) {
      this.log.info('operator intent from the state file in force', {
        real: key,
        ...(o.state !== undefined ? { intent: o.state } : {}),
        ...(o.weight !== undefined ? { weight: o.weight } : {}),
        config: { intent: o.configState, weight: o.configWeight },
      });
    }
    for (const sid of this.withdrawn) {
      this.log.info('operator withdrawal from the state file in force', { service: this.config.services.find((x) => serviceIdentity(x) === sid)?.name ?? identityAddressName(sid) });
    }
  }

  /**
   * The state file the daemon before used when `stateFile` was edited since (a reload copies the
   * intent itself; a restart did not): its flows file is moved beside the new path here, and
   * start reads the intent from it and writes it to the new one. Null when nothing moved.
   */
  private async stateFileBefore(): Promise<string | null> {
    const file = this.config.stateFile;
    if (!file) return null;
    const before = await movedStateFile(this.runDir, resolve(this.configPath), file, this.log).catch(() => null);
    if (before === null) return null;
    const flows = await moveFlowsFile(before, file).catch((err: Error) => {
      this.log.warn('the flows file of the daemon before could not be moved beside the new state file: its flows are not taken', { from: `${before}.flows`, error: err.message });
      return false;
    });
    this.log.info('stateFile changed since the daemon before: its operator intent and flows are taken from the file it used', { from: before, stateFile: file, flows });
    return before;
  }

  /**
   * The files a write aside (writeFileAside) left beside the state file when the process died
   * between writing and renaming (a stop that passed TimeoutStopSec while writing 49 MB of flows):
   * random names, so nothing else would ever remove them. Only this user's.
   */
  private async removeStaleTempFiles(): Promise<void> {
    const file = this.config.stateFile;
    if (!file) return;
    const base = basename(file);
    const dir = dirname(file);
    const left = new RegExp(`^${base.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(\\.flows)?\\.[0-9a-f]{16}\\.tmp$`);
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      if (!left.test(name)) continue;
      const path = join(dir, name);
      const st = await lstat(path).catch(() => null);
      if (st === null || !st.isFile() || st.uid !== process.geteuid!()) continue;
      await unlink(path).catch(() => undefined);
      this.log.info('removed a state or flows file half written by a run that died', { file: path });
    }
  }

  /** Which state file this daemon uses, for the next start (see state-file-record.ts). */
  private async recordStateFile(): Promise<void> {
    const file = this.config.stateFile;
    if (!file) return;
    await recordStateFile(this.runDir, resolve(this.configPath), file).catch((err: Error) =>
      this.log.warn('which state file is in use could not be recorded: a stateFile edited before a restart will not find this intent', { error: err.message }),
    );
  }

  /**
   * Says at start and at each reload, not at the first drain, that intent changes cannot be kept:
   * logged, kept for status (stateFileProblem) and returned for the reload's answer.
   */
  private async checkStateFileWritable(): Promise<string | null> {
    const file = this.config.stateFile;
    this.stateFileProblem = null;
    if (!file) return null;
    await access(dirname(file), constants.W_OK).catch((e: Error) => {
      this.log.warn('the state file cannot be written: operator intent changes will be refused', { stateFile: file, error: e.message });
      this.stateFileProblem = `the state file ${file} cannot be written (${e.message}): drain, disable, weight and withdraw are refused, and flows are not kept across a restart`;
    });
    return this.stateFileProblem;
  }

  /** Writes the state file aside and renames it; throws STATE_NOT_SAVED (nothing changed) on failure. */
  private async saveState(overrides: ReadonlyMap<string, IntentOverride>, withdrawn: ReadonlySet<string>, file = this.config.stateFile): Promise<void> {
    if (!file) return;
    try {
      // Through a new file of a random name (writeFileAside): the state directory is the service
      // user's, and a symlink planted at a fixed FILE.tmp made a root run write through it. 0640
      // as the unit's UMask gave it before (group dsrlb reads it).
      await writeFileAside(file, JSON.stringify({ intent: Object.fromEntries(overrides), withdrawn: [...withdrawn] }, null, 2), 0o640, { sync: true, directoryOwner: true });
      // The rename itself is on disk only once the directory is: after a power cut, an
      // acknowledged drain must not come back as the old file. Best effort: the new file is in
      // place already, so a directory that cannot be synced must not turn this into "not saved".
      await syncDirectory(dirname(file));
    } catch (err) {
      throw new DaemonError('STATE_NOT_SAVED', `nothing changed: the state file ${file} cannot be written (${(err as Error).message})`);
    }
  }

  /** Where a new connection from client (IP:PORT, [V6]:PORT) would go (explain), asked of the packet loop itself. */
  async explain(serviceRef: string, client: string): Promise<Record<string, unknown>> {
    const { s, dstPort } = this.explainTarget(serviceRef);
    const ip = parseClientEndpoint(client);
    if ('error' in ip) throw new DaemonError('BAD_CLIENT', ip.error);
    const port = ip.port;
    if (ip.family !== s.family) throw new DaemonError('BAD_CLIENT', `client "${client}" is IPv${ip.family} but service "${s.name}" is IPv${s.family}`);
    const addr = new Uint32Array(8);
    addr.set(addressWords(ip.address), 0);
    addr.set(addressWords(s.vip), 4);
    const answers = await this.loops.ask((id) => ({ type: 'explain', id, family: s.family, protocol: s.protocol === 'tcp' ? 6 : 17, addr, srcPort: port, dstPort }));
    // With several loops the flow lives in one of them: a flow-table hit wins, then an entry a SYN replaces.
    const e = answers.find((a) => a.type === 'explained' && a.placement === 'flow-table') ?? answers.find((a) => a.type === 'explained' && a.entryReal >= 0) ?? answers[0];
    if (!e || e.type !== 'explained') throw new DaemonError('INTERNAL', 'no packet loop answered');
    const real = [...this.reals.values()].find((r) => r.id === e.real);
    const entryReal = e.entryReal >= 0 ? [...this.reals.values()].find((r) => r.id === e.entryReal) : undefined;
    // Why no real, or why a down one: the service's state as status shows it.
    const report = this.lastReports.find((r) => r.name === s.name);
    const dropping = report?.dropping ?? false;
    return {
      service: s.name,
      // The destination port asked about: a port-0 service's answer depends on it.
      port: dstPort,
      servicePort: s.port,
      client: ip.family === 6 ? `[${ip.address}]:${port}` : `${ip.address}:${port}`,
      real: real?.address ?? null,
      // Another service's real: a connection the VIP's port-0 service placed before this port got
      // a service of its own keeps it (null otherwise).
      realService: real !== undefined && real.serviceName !== s.name ? real.serviceName : null,
      reason: e.placement,
      scheduler: s.scheduler,
      // Client persistence: the prefix whose connections all go where this one does.
      persistentClient: s.persistence === 'client' ? clientPrefixText(ip.address, s.persistencePrefix) : null,
      // One-packet scheduling: no entry is ever made; every datagram goes as this one does.
      ops: s.ops,
      slot: e.slot >= 0 ? e.slot : null,
      flowState: FLOW_STATE_NAMES[e.flowState] ?? null,
      // A fin/closed entry: where that closing connection's packets still go until a new SYN.
      entryReal: entryReal?.address ?? null,
      generation: e.generation,
      realHealth: real ? this.healthOf(real.key) : null,
      panic: report !== undefined && inPanic(report),
      dropping,
      droppingReason: dropping ? droppingReason(this.serviceViews().find((v) => v.config.name === s.name)) : null,
    };
  }

  /**
   * The connection table (dsrlb flows, as ipvsadm -Lnc): the live flows of every loop, read from
   * their records without asking the loops, optionally of one service (configured, or removed and
   * draining; `tcp://VIP:PORT` of a port-0 service: that port's flows), one of its reals, one
   * client address; at most `limit` rows (0: FLOWS_LISTED_MOST), `total` the flows that match.
   * The filter runs on each record's words, so only listed rows are built. Expiry as the loops
   * judge it: the state's timeout less the idle time.
   */
  flows(q: { service?: string; real?: string; client?: string; limit: number }): FlowListing {
    // Real ids to list (null: every one), and a VIP port of a port-0 service.
    let ids: Uint8Array | null = null;
    let vipPort = -1;
    if (q.service !== undefined) {
      let s = this.findService(q.service) ?? this.findRemovedService(q.service);
      const a = parseServiceRef(q.service);
      if (s === null && a !== null && a.port !== 0) {
        const any = [...this.servicesAt(a, 0), ...this.servicesAt(a, 0, this.removedServices.values())];
        if (any.length === 1) {
          s = any[0]!;
          vipPort = a.port;
        }
      }
      if (s === null) throw this.unknownService(q.service);
      const identity = serviceIdentity(s);
      const address = q.real === undefined ? null : this.listedRealAddress(s, q.real);
      ids = new Uint8Array(MAX_REAL_IDS);
      for (const r of this.reals.values()) if (r.service === identity && (address === null || r.address === address)) ids[r.id] = 1;
    } else if (q.real !== undefined) {
      const address = parseIpAddress(q.real)?.address;
      if (address === undefined) throw new DaemonError('BAD_REAL', `"${q.real}" is not an IPv4 or IPv6 address`);
      ids = new Uint8Array(MAX_REAL_IDS);
      let any = false;
      for (const r of this.reals.values()) {
        if (r.address !== address) continue;
        ids[r.id] = 1;
        any = true;
      }
      // As drain and explain answer a real no service has (a typo listed nothing, exit 0).
      if (!any) throw new DaemonError('UNKNOWN_REAL', `no service has a real "${q.real}"; reals: ${firstFew([...new Set([...this.reals.values()].map((r) => r.address))])}`);
    }
    let client: Uint32Array | null = null;
    let clientFamily = 0;
    // A client port too when given (IP:PORT, [V6]:PORT, as ipvsadm -Lnc prints a source).
    let clientPort = -1;
    if (q.client !== undefined) {
      let c = parseIpAddress(q.client);
      if (c === null) {
        const endpoint = parseClientEndpoint(q.client, 0);
        if ('error' in endpoint) throw new DaemonError('BAD_CLIENT', `client "${q.client}" is not an IPv4 or IPv6 address, IP:PORT or [IPv6]:PORT`);
        c = endpoint;
        clientPort = endpoint.port;
      }
      client = addressWords(c.address);
      clientFamily = c.family;
    }
    const realWord = FLOW_RECORD.real;
    const keep =
      ids === null && client === null && vipPort < 0
        ? null
        : (rec: Int32Array, base: number): boolean => {
            if (ids !== null) {
              const id = rec[base + realWord]!;
              if (id < 0 || id >= MAX_REAL_IDS || ids[id] !== 1) return false;
            }
            if (vipPort >= 0 && (rec[base + 9]! & 0xffff) !== vipPort) return false;
            if (client === null) return true;
            if (clientPort >= 0 && rec[base + 9]! >>> 16 !== clientPort) return false;
            return rec[base]! >>> 8 === clientFamily && rec[base + 1]! >>> 0 === client[0] && rec[base + 2]! >>> 0 === client[1] && rec[base + 3]! >>> 0 === client[2] && rec[base + 4]! >>> 0 === client[3];
          };
    const limit = q.limit === 0 ? FLOWS_LISTED_MOST : Math.min(q.limit, FLOWS_LISTED_MOST);
    const { batch, matched } = this.loops.flowsNow(keep, limit);
    const byId = new Map([...this.reals.values()].map((r) => [r.id, r]));
    const timeoutOf = timeoutsByState(timeoutsOf(this.config));
    const rows: FlowRow[] = [];
    const W = FLOW_KEY_WORDS;
    const keys = batch.keys;
    for (let i = 0; i < batch.count && rows.length < limit; i++) {
      const r = byId.get(batch.reals[i]!);
      if (r === undefined) continue; // an id released meanwhile (its flow just ended)
      const k = i * W;
      const family = keys[k]! >>> 8;
      const state = batch.states[i]!;
      rows.push({
        protocol: (keys[k]! & 0xff) === 6 ? 'tcp' : 'udp',
        client: endpointText(wordsToAddress(keys, k + 1, family), keys[k + 9]! >>> 16),
        vip: endpointText(wordsToAddress(keys, k + 5, family), keys[k + 9]! & 0xffff),
        service: r.serviceName,
        real: r.address,
        state: FLOW_STATE_NAMES[state] ?? String(state),
        idleMs: Math.round(batch.idleMs[i]!),
        expiresInMs: Math.max(0, Math.round(timeoutOf[state]! - batch.idleMs[i]!)),
      });
    }
    return { total: matched, flows: rows };
  }

  /** The address of REAL in service s, as findReal reads it; also a real a reload removed that still drains. */
  private listedRealAddress(s: ServiceConfig, real: string): string {
    const endpoint = parseClientEndpoint(real, 0);
    const address = 'error' in endpoint ? parseIpAddress(real)?.address : endpoint.address;
    const draining = [...this.reals.values()].find((r) => r.removed && r.service === serviceIdentity(s) && r.address === address);
    return draining?.address ?? this.findReal(s, real).address;
  }

  /**
   * Live flows for plan: flow keys with the (service identity, address) of their real, at most
   * `most` of them (split over the loops): more would not fit the answer's JSON (V8's largest
   * string is 536M characters, 57 a flow).
   */
  async liveFlows(most = LIVE_FLOWS_LIMIT): Promise<LiveFlowsWire> {
    const limit = Math.floor(most / Math.max(1, this.loops.size));
    const answers = await this.loops.ask((id) => ({ type: 'flows', id, limit }));
    const g = this.gatherFlows(answers);
    const cut = answers.some((e) => e.type === 'flows' && e.count >= limit);
    return encodeLiveFlows(g.keys, g.realIndex, g.reals, cut);
  }

  /**
   * The loops' 'flows' answers as one list, each flow's real named once in `reals` by (service
   * identity, address); flows of a real this daemon no longer knows are left out.
   */
  private gatherFlows(answers: readonly LoopEvent[]): { count: number; keys: Uint32Array; realIndex: Int32Array; states: Uint8Array; idleMs: Float64Array; reals: { identity: string; address: string }[] } {
    const byId = new Map([...this.reals.values()].map((r) => [r.id, r]));
    let total = 0;
    for (const e of answers) if (e.type === 'flows') total += e.count;
    const keys = new Uint32Array(total * FLOW_KEY_WORDS);
    const realIndex = new Int32Array(total);
    const states = new Uint8Array(total);
    const idleMs = new Float64Array(total);
    const reals: { identity: string; address: string }[] = [];
    const indexOfId = new Map<number, number>();
    let n = 0;
    for (const e of answers) {
      if (e.type !== 'flows') continue;
      for (let i = 0; i < e.count; i++) {
        const id = e.reals[i]!;
        let index = indexOfId.get(id);
        if (index === undefined) {
          const r = byId.get(id);
          if (!r) continue;
          index = reals.push({ identity: r.service, address: r.address }) - 1;
          indexOfId.set(id, index);
        }
        keys.set(e.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS), n * FLOW_KEY_WORDS);
        realIndex[n] = index;
        states[n] = e.states[i]!;
        idleMs[n++] = e.idleMs[i]!;
      }
    }
    return { count: n, keys: keys.subarray(0, n * FLOW_KEY_WORDS), realIndex: realIndex.subarray(0, n), states: states.subarray(0, n), idleMs: idleMs.subarray(0, n), reals };
  }

  /** Where a clean stop leaves the flows for the next start: beside the state file (none without one). */
  private flowsFile(): string | null {
    return this.config.stateFile === null ? null : `${this.config.stateFile}.flows`;
  }

  /**
   * At a clean stop: every loop's live flows to flowsFile(), for the next daemon. Failing here
   * loses only the hand-over (logged); the stop goes on.
   */
  private async saveFlows(): Promise<void> {
    const file = this.flowsFile();
    if (file === null) return;
    // A loop lost for good (the reason of a stop with exit 2) left its flows: kept with the others.
    const orphans = this.loops.orphanFlows();
    if (this.loops.size === 0 && orphans === null) return;
    const began = monotonicMs();
    try {
      const answers = this.loops.size === 0 ? [] : await this.loops.ask((id) => ({ type: 'flows', id, limit: this.config.flowTable.capacity }), STOP_FLOWS_ASK_MS);
      const g = this.gatherFlows(orphans === null ? answers : [...answers, { type: 'flows', id: 0, ...orphans }]);
      const idleMs = Uint32Array.from(g.idleMs, (ms) => Math.min(Math.round(ms), 0xffffffff));
      const { reals, removedServices } = this.removedToSave(g.reals);
      const boot = bootId();
      const bytes = encodeSavedFlows({ writtenAtMs: Date.now(), count: g.count, keys: g.keys, realIndex: g.realIndex, idleMs, states: g.states, reals, removedServices, ...(boot === null ? {} : { boot: { id: boot, monotonicMs: monotonicMs() } }) });
      await writeFileAside(file, bytes, 0o600, { directoryOwner: true });
      this.log.info('flows kept for the next start', { flows: g.count, file, ms: Math.round(monotonicMs() - began) });
    } catch (err) {
      this.log.warn('flows not kept for the next start: its packets go where the consistent hash puts them then', { file, error: (err as Error).message });
    }
  }

  /**
   * The saved flows' reals, each marked with the way its flows went, and the services those are
   * of, as configured (or last configured, for one a reload removed) with whether their VIP is
   * announced: what the next start needs to go on draining a real or service its config no longer
   * names (restoreRemoved), whether a reload removed it before the stop or an edit of the file
   * before the start does (the usual way with a restart-only key: the edit on its own drained
   * them when reloaded, and cut them when restarted). A removed service whose flows this daemon
   * already cuts (removalBlocker) is not kept, nor is a service without a flow in the file.
   */
  private removedToSave(reals: readonly SavedReal[]): { reals: SavedReal[]; removedServices: SavedRemovedService[] } {
    const out = reals.map((r): SavedReal => {
      const rt = this.reals.get(RealRegistry.keyOf(r.identity, r.address));
      return rt === undefined ? r : { ...r, removed: { forwarding: rt.forwarding } };
    });
    const withFlows = new Set(reals.map((r) => r.identity));
    const removedServices: SavedRemovedService[] = [];
    for (const [sid, s] of this.removedServices) {
      if (withFlows.has(sid) && removalBlocker(this.config.services, s) === null) removedServices.push({ config: s, announced: this.drainAnnounced.has(sid) });
    }
    for (const s of this.config.services) {
      const sid = serviceIdentity(s);
      // Announced as a reload's removal would find it: by this daemon, not withdrawn by the operator
      // (as it was before the stop withdrew every VIP).
      const announced = this.announcedAtStop?.has(s.vip) ?? this.announcer?.isAnnounced(s.vip) === true;
      if (withFlows.has(sid)) removedServices.push({ config: s, announced: s.announce && !this.withdrawn.has(sid) && announced });
    }
    return { reals: out, removedServices };
  }

  /**
   * At a start, before the saved flows are given to the loops: the reals and services with flows
   * that this config does not name (a reload removed them before the stop, or an edit of the file
   * before this start), removed and draining as after a reload of this config would leave them
   * (no new flows, probed, a service's VIP owned and announced as it was), so that
   * their connections stay where they were, as IPVS's connection table outlives a restart of
   * keepalived. One the config names again is simply configured (syncReals made it so); a service
   * the config no longer lets drain (removalBlocker) is not restored, as a reload would cut it. Each
   * is forgotten with its last flow (tick), as before.
   */
  private restoreRemoved(saved: SavedFlows): { reals: string[]; services: string[] } {
    const nameOf = new Map(this.config.services.map((s) => [serviceIdentity(s), s.name]));
    const candidates = new Map<string, SavedRemovedService>();
    for (const r of saved.removedServices ?? []) {
      const sid = serviceIdentity(r.config);
      if (nameOf.has(sid)) continue;
      const blocker = removalBlocker(this.config.services, r.config);
      if (blocker === null) candidates.set(sid, r);
      else this.log.warn('service removed before the restart: its flows are cut', { service: r.config.name, why: blocker });
    }
    const reals: string[] = [];
    const services = new Set<string>();
    for (const r of saved.reals) {
      const key = RealRegistry.keyOf(r.identity, r.address);
      const serviceName = nameOf.get(r.identity) ?? candidates.get(r.identity)?.config.name;
      if (r.removed === undefined || serviceName === undefined || this.reals.has(key)) continue;
      // The config's own reals came first: a removed one never takes an id a configured one needs.
      if (this.registry.available() === 0) {
        this.log.warn('no real id left for a removed real from before the restart: its flows are placed anew', { service: serviceName, real: r.address });
        continue;
      }
      const id = this.registry.idFor(key);
      this.rebaseCounters(id);
      this.reals.set(key, { key, id, service: r.identity, serviceName, address: r.address, forwarding: r.removed.forwarding, removed: true, removedGeneration: this.builder.lastGeneration + 1 });
      reals.push(`${serviceName} ${r.address}`);
      if (!nameOf.has(r.identity)) services.add(r.identity);
    }
    for (const sid of services) {
      const r = candidates.get(sid)!;
      this.removedServices.set(sid, r.config);
      if (r.announced) this.drainAnnounced.add(sid);
    }
    return { reals, services: [...services].map((sid) => candidates.get(sid)!.config.name) };
  }

  /**
   * At a start: the flows the daemon before left (saveFlows), given to the loops on the reals they
   * were on, by (service, address), reals and services this config does not name too, draining
   * (restoreRemoved). The file is
   * removed once the start has succeeded (removeTakenFlows): a start that fails leaves it to the
   * next, and a later start (after a crash) never takes flows this old.
   */
  private async adoptSavedFlows(): Promise<void> {
    const file = this.flowsFile();
    if (file === null) return;
    let bytes: Buffer;
    try {
      bytes = await readFile(file);
      this.takenFlowsFile = file;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') this.log.warn('flows of the daemon before not taken', { file, error: (err as Error).message });
      return;
    }
    try {
      const saved = decodeSavedFlows(bytes);
      const restored = this.restoreRemoved(saved);
      const gapMs = downtimeMs(saved, bootId(), monotonicMs(), Date.now());
      const idOf = saved.reals.map((r) => this.reals.get(RealRegistry.keyOf(r.identity, r.address))?.id ?? -1);
      const keep: number[] = [];
      for (let i = 0; i < saved.count; i++) if (idOf[saved.realIndex[i]!]! >= 0) keep.push(i);
      const n = keep.length;
      const flows = { count: n, keys: new Uint32Array(n * FLOW_KEY_WORDS), reals: new Int32Array(n), states: new Uint8Array(n), idleMs: new Float64Array(n) };
      keep.forEach((i, j) => {
        flows.keys.set(saved.keys.subarray(i * FLOW_KEY_WORDS, (i + 1) * FLOW_KEY_WORDS), j * FLOW_KEY_WORDS);
        flows.reals[j] = idOf[saved.realIndex[i]!]!;
        flows.states[j] = saved.states[i]!;
        flows.idleMs[j] = saved.idleMs[i]! + gapMs;
      });
      const graceMs = this.loops.size > 1 ? HANDOFF_GRACE_MS : null;
      const answers = await this.loops.ask((id) => ({ type: 'adoptFlows', id, flows, graceMs }), HANDOFF_ASK_MS);
      const adopted = Math.max(0, ...answers.map((e) => (e.type === 'adopted' ? e.count : 0)));
      this.log.info('flows taken over from the daemon before', { saved: saved.count, ofRealsGone: saved.count - n, adopted, stoppedForMs: Math.round(gapMs) });
      if (restored.reals.length > 0) {
        this.log.info('removed before the restart: draining again', { reals: restored.reals, services: restored.services });
        // Probed as draining removed reals are; a removed service's only once its flows are in the loops (drainingServices).
        this.syncHealthTargets();
      }
    } catch (err) {
      this.log.warn('flows of the daemon before not taken', { file, error: (err as Error).message });
    }
  }

  /** After a successful start: the flows file taken at start goes (see adoptSavedFlows). */
  private async removeTakenFlows(): Promise<void> {
    const file = this.takenFlowsFile;
    this.takenFlowsFile = null;
    if (file !== null) await unlink(file).catch((err: Error) => this.log.warn('the flows file taken at start could not be removed: a start after a crash would take its flows again', { file, error: err.message }));
  }

  /**
   * Plan's view of every real (removed ones that still drain too): the intent in force (config or
   * operator override) and the health fact, by service identity and address.
   */
  planReals(): { identity: string; service: string; address: string; state: RealIntent; weight: number; up: boolean; health: HealthFact; removed: boolean }[] {
    return this.serviceViews().flatMap((v) =>
      v.reals.map((r) => ({ identity: serviceIdentity(v.config), service: v.config.name, address: r.address, state: r.intent, weight: r.weight, up: r.health === 'up', health: r.health, removed: r.removed })),
    );
  }

  /** For systemd's watchdog: the loops forward, or one that ended is being started again. */
  healthy(): boolean {
    return this.loopHealthy() || this.loops.recovering;
  }

  loopHealthy(): boolean {
    return this.loops.running && this.loops.heartbeatAgeMs() < 5000;
  }

  /**
   * Everything status shows; with `service` (a name or address, as the intent commands take it; a
   * removed one that drains too), that service only, as `ipvsadm -Ln -t VIP:PORT`.
   */
  status(service?: string): Record<string, unknown> {
    const configReals = realsByKey(this.config);
    let views = this.serviceViews();
    if (service !== undefined) {
      const s = this.findService(service) ?? this.findRemovedService(service);
      if (s === null) throw this.unknownService(service);
      const identity = serviceIdentity(s);
      views = views.filter((v) => serviceIdentity(v.config) === identity);
    }
    const counters = this.loops.counters();
    const keyById = new Map([...this.reals.values()].map((x) => [x.id, x.key]));
    return {
      interface: this.config.interface,
      io: this.config.io,
      mac: formatMac(this.loops.localMac),
      loop: { running: this.loops.running, loops: this.loops.size, healthy: this.loopHealthy(), snapshotGeneration: counters[Counter.snapshotGeneration], restarts: this.loops.restarts },
      flowTable: { entries: counters[Counter.flowTableEntries], capacity: this.flowTableCapacity() },
      stateFileProblem: this.stateFileProblem,
      services: views.map((v) => {
        const report = this.lastReports.find((r) => r.name === v.config.name);
        return {
          name: v.config.name,
          vip: v.config.vip,
          port: v.config.port,
          protocol: v.config.protocol,
          scheduler: v.config.scheduler,
          forwarding: v.config.forwarding,
          whenAllDown: v.config.whenAllDown,
          persistence: v.config.persistence,
          persistencePrefix: v.config.persistencePrefix,
          ops: v.config.ops,
          panic: report !== undefined && inPanic(report),
          onBackups: report?.onBackups ?? false,
          dropping: report?.dropping ?? false,
          droppingReason: report?.dropping ? droppingReason(v) : null,
          tableFingerprint: report?.tableFingerprint ?? null,
          // Whether an announcement is meant at all (announce.enabled and the service's announce).
          announce: this.config.announce.enabled && v.config.announce && v.removed !== true,
          announced: this.announcer?.isAnnounced(v.config.vip) ?? false,
          // Eligible again after its reals were all out here, not announced until they are back.
          announceWaitingForReals: this.heldForReals.has(v.config.vip),
          // Its failOpen panic over, the reals still down keeping their flows while they may come up.
          panicEnding: v.removed !== true && this.panicEnding.isWaiting(serviceIdentity(v.config)),
          announceDevice: this.announcer?.deviceOf(v.config.vip) ?? null,
          operatorWithdrawn: this.withdrawn.has(serviceIdentity(v.config)),
          removed: v.removed === true,
          reals: v.reals.map((r) => {
            const fact = this.health.fact(keyById.get(r.id)!);
            const rate = this.rates.get(r.id);
            return {
              address: r.address,
              forwarding: r.forwarding,
              weight: r.weight,
              intent: r.intent,
              backup: r.backup === true,
              removed: r.removed,
              // Beside the intent in force: what the config file says (an operator override differs).
              configIntent: r.removed ? null : configIntentOf(configReals.get(RealRegistry.keyOf(serviceIdentity(v.config), r.address))),
              health: {
                state: fact?.state ?? 'down',
                since: new Date(fact?.since ?? Date.now()).toISOString(),
                lastError: fact?.lastError ?? null,
                check: v.config.healthCheck.type,
              },
              drainFinished: this.drainFinished(r),
              mac: r.mac ? formatMac(r.mac) : null,
              activeFlows: this.loops.active(r.id),
              inactiveFlows: this.loops.inactive(r.id),
              packets: this.realCount(counters, r.id, RealCounter.forwardedPackets),
              bytes: this.realCount(counters, r.id, RealCounter.forwardedBytes),
              pps: rate?.pps ?? 0,
              bytesPerSecond: rate?.bps ?? 0,
            };
          }),
        };
      }),
    };
  }

  /** A per-real counter (RealCounter) of `id` since the id was given to its current real. */
  realCount(counters: Float64Array, id: number, which: number): number {
    const i = id * REAL_STRIDE + which;
    return counters[REAL_BASE + i]! - this.counterBase[i]!;
  }

  /** Start a newly handed-out id's counters from zero (the loops' slots keep what a forgotten real counted). */
  private rebaseCounters(id: number): void {
    const counters = this.loops.counters();
    const i = id * REAL_STRIDE;
    for (let k = 0; k < REAL_STRIDE; k++) this.counterBase[i + k] = counters[REAL_BASE + i + k]!;
  }

  /**
   * The reals as metrics show them, built once per scrape: nine collectors ask for it, and at
   * 8,000 reals each build was a full serviceViews(). Kept until the scrape's turn of the event
   * loop ends (prom-client runs the collectors back to back).
   */
  private metricsView(): MetricsRealView[] {
    if (this.metricsViewCache !== null) return this.metricsViewCache;
    const view = this.buildMetricsView();
    this.metricsViewCache = view;
    setImmediate(() => (this.metricsViewCache = null));
    return view;
  }

  private metricsViewCache: MetricsRealView[] | null = null;

  private buildMetricsView(): MetricsRealView[] {
    if (!this.config) return [];
    const out: MetricsRealView[] = [];
    for (const v of this.serviceViews()) {
      for (const r of v.reals) {
        out.push({ service: v.config.name, real: r.address, id: r.id, weight: r.weight, intent: r.intent, up: r.health === 'up', drainFinished: this.drainFinished(r) });
      }
    }
    return out;
  }

  /**
   * Stops the daemon after any queued change and undoes the host changes: all of them after a
   * clean run, only this process's own when start() (or what the caller starts after it) failed.
   */
  stop(opts: { startFailed?: boolean } = {}): Promise<void> {
    return this.exclusive(() => this.stopNow(opts.startFailed === true || !this.started, opts.startFailed === true));
  }

  private async stopNow(ownOnly: boolean, startFailed: boolean): Promise<void> {
    // From here nothing announces again: a reload's background announcing that ends later must
    // neither re-announce a withdrawn VIP nor start the 200 ms check anew.
    this.stopping = true;
    if (this.housekeeping) clearInterval(this.housekeeping);
    if (this.routesTimer) clearInterval(this.routesTimer);
    this.tooBigRefresh.stop();
    if (this.startLinkTimer) clearTimeout(this.startLinkTimer);
    if (this.announceTimer) clearInterval(this.announceTimer);
    this.announceTimer = null;
    for (const r of this.vipRounds) r.cancel();
    if (this.announcer) {
      // What was announced, for the flows file: a start that drains a service it no longer names announces it as it was.
      this.announcedAtStop = new Set(this.vips().filter((v) => this.announcer!.isAnnounced(v)));
      // Withdraw first and give BGP time to move the flows away while the loop still forwards. At
      // once: a sync in flight may wait on birdc (up to 10 s a call; with the loops' stop that
      // passed TimeoutStopSec and systemd's SIGKILL skipped the host undo), and sets nothing up after this.
      await this.announcer.withdrawAll();
      await new Promise((r) => setTimeout(r, this.config.announce.withdrawDelayMs));
      // A quick sync may end cleanly; one stuck on birdc is not waited for (close() leaves it no device).
      const idle = (async () => {
        await this.announcing;
        while (this.announceBusy) await new Promise((r) => setTimeout(r, 10));
      })();
      await Promise.race([idle, new Promise((r) => setTimeout(r, STOP_SYNC_WAIT_MS))]);
    }
    this.health.stop();
    this.neighbors?.stop();
    if (!ownOnly) await this.saveFlows();
    await this.loops.stop(CLOSE_TIMEOUT_MS);
    this.pathMtu.close();
    this.announcer?.close();
    if (ownOnly) await this.host?.undoOwn();
    else await this.host?.undo();
    this.started = false;
    this.lock?.release();
    this.lock = null;
    // A start that failed said so ("refusing to start"): what follows is its undo, not a stop.
    if (startFailed) this.log.info('what the refused start changed is undone');
    else this.log.info('dsrlb stopped');
  }
}

/** A real the operator wants, not known down, whose MAC (or next hop's) is unknown: it takes no new flows yet. */
function awaitsMac(r: RealView): boolean {
  return r.mac === null && isWanted(r) && r.health !== 'down';
}

/** Up to five of `items` for a message, "..." after them when there are more. */
function firstFew(items: readonly string[]): string {
  return items.length > 5 ? `${items.slice(0, 5).join(', ')}, ...` : items.join(', ');
}

/** A real's intent as its config says it, for status beside the one in force. */
function configIntentOf(r: RealConfig | undefined): { state: RealIntent; weight: number } | null {
  return r === undefined ? null : { state: r.state, weight: r.weight };
}

/** The config's reals by (service identity, address) key, as overrides are kept. */
function realsByKey(config: Config): Map<string, RealConfig> {
  const reals = new Map<string, RealConfig>();
  for (const s of config.services) for (const r of s.reals) reals.set(RealRegistry.keyOf(serviceIdentity(s), r.address), r);
  return reals;
}

/** Problems the daemon finds in a config it read from `text`, with where the file writes them (as validation's). */
function located(text: string, problems: ConfigProblem[]): ConfigProblem[] {
  return locateProblems(withoutBom(text), problems);
}

/** A problem at services[i].vip for each service whose VIP is an interface's own address. */
function vipClashProblems(config: Config, holders: ReadonlyMap<string, string>): ConfigProblem[] {
  return config.services.flatMap((s, i) => {
    const where = holders.get(s.vip);
    return where === undefined ? [] : [{ path: `services[${i}].vip`, message: `${s.vip} is an address of this host: ${where}; as a VIP all traffic to it is dropped at the host (SSH, BGP, probe replies): give the service an address of its own` }];
  });
}

/**
 * Why a service drops new flows, real by real, as HAProxy's "no server available" leaves the
 * operator to find out: "10.0.1.14: down, no MAC known (ARP/neighbour discovery unanswered);
 * 10.0.1.11, 10.0.1.13: draining; 10.0.1.12: disabled". A wanted real's health and MAC (failOpen
 * sends to a down real, never to one without a MAC); the intent of the others.
 */
function droppingReason(view: ServiceView | undefined): string {
  if (view?.removed === true) return 'removed from the config: only its existing flows are forwarded';
  const reals = view?.reals.filter((r) => !r.removed) ?? [];
  if (reals.length === 0) return 'no reals';
  const groups = new Map<string, string[]>();
  for (const r of reals) {
    let why: string;
    if (isWanted(r)) {
      const health = r.health === 'up' ? '' : r.health === 'down' ? 'down' : 'health not known yet';
      why = [health, r.mac === null ? 'no MAC known (ARP/neighbour discovery unanswered)' : ''].filter(Boolean).join(', ') || 'up';
    } else {
      why = r.intent === 'drain' ? 'draining' : r.intent === 'disabled' ? 'disabled' : 'weight 0';
    }
    const group = groups.get(why);
    if (group === undefined) groups.set(why, [r.address]);
    else group.push(r.address);
  }
  return [...groups].map(([why, addresses]) => `${addresses.join(', ')}: ${why}`).join('; ');
}

/** A service identity (serviceIdentity: `tcp|VIP|PORT`) in the CLI's address form, `tcp://VIP:PORT`. */
function identityAddressName(sid: string): string {
  const [protocol, vip, port] = sid.split('|');
  return serviceAddressName(protocol as Protocol, vip!, Number(port));
}

/**
 * While a service settles: every wanted real waits only for its first check or its MAC (none seen
 * down), which is not worth a warning yet.
 */
function stillSettling(view: ServiceView): boolean {
  const wanted = view.reals.filter(isWanted);
  return wanted.length > 0 && wanted.every((r) => r.health !== 'down' && (r.mac === null || r.health === 'unknown'));
}

/**
 * A service whose failOpen panic just ended (a real is up again): its wanted reals still down are
 * shown to the builder as not proven either way, as at start, so they keep the flows the panic kept
 * (and mid-stream packets meet the panic's table) instead of losing them to the first real up: their
 * probes may be what failed (a blocked LB, a dependency of every health endpoint).
 */
function keepRisingReals(reals: RealView[], kept: ReadonlySet<number>): void {
  if (!reals.some((r) => isWanted(r) && r.health === 'up' && r.mac !== null)) return;
  for (let i = 0; i < reals.length; i++) {
    const r = reals[i]!;
    if (kept.has(r.id) && isWanted(r) && r.health === 'down') reals[i] = { ...r, health: 'unknown' };
  }
}

/** A failOpen panic the daemon reports: not while no wanted real has been probed yet (ServiceBuildReport.unproven). */
function inPanic(r: { panic: boolean; unproven: boolean }): boolean {
  return r.panic && !r.unproven;
}

/** fsync of a directory (its entries, a rename among them); errors ignored (not every filesystem allows it). */
async function syncDirectory(dir: string): Promise<void> {
  const fh = await open(dir, 'r').catch(() => null);
  if (!fh) return;
  await fh.sync().catch(() => undefined);
  await fh.close();
}
