// The control plane of `dsrlb run`: loads the config, owns the host changes, the packet-loop
// worker, the reals' ids, intent and MACs, and builds and hands over forwarding snapshots.
// The packet loop runs in a worker thread; nothing here can stall it.

import { readFile, rename, writeFile } from 'node:fs/promises';
import { readConfigFile } from '../config/load.js';
import { restartOnlyChanges } from '../config/restart-keys.js';
import type { Config, ConfigProblem, RealIntent, ServiceConfig } from '../config/types.js';
import { Counter, MAX_REAL_IDS, REAL_BASE, REAL_STRIDE, RealCounter } from '../dataplane/counters.js';
import { timeoutsOf } from './flow-timeouts.js';
import type { LoopRequest } from '../dataplane/loop-runner.js';
import { LoopGroup } from './loop-group.js';
import type { HealthFact } from '../health/eligibility.js';
import { HealthMonitor, type HealthTarget } from '../health/health-monitor.js';
import { addressWords, formatMac } from './addresses.js';
import { HostSetup } from './host-setup.js';
import type { Logger } from './logger.js';
import { DaemonMetrics, type MetricsRealView } from './metrics.js';
import { NeighborWatcher } from './neighbors.js';
import { RealRegistry, serviceIdentity } from './real-registry.js';
import { SnapshotBuilder, type RealView, type ServiceBuildReport, type ServiceView, type TunnelSources } from './snapshot-builder.js';
import { systemRunner } from './host-setup.js';
import { VipAnnouncer } from './announcer.js';

export const CLOSE_TIMEOUT_MS = 10_000;

export class DaemonError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly problems: readonly ConfigProblem[] = [],
  ) {
    super(message);
  }
}

/** Intent set at run time through the admin API, with the config values it overrode. */
interface IntentOverride {
  state?: RealIntent;
  weight?: number;
  configState: RealIntent;
  configWeight: number;
}

interface RealRuntime {
  key: string;
  id: number;
  service: string; // service identity
  serviceName: string;
  address: string;
  removed: boolean;
}

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
  readonly health: HealthMonitor;
  private overrides = new Map<string, IntentOverride>();
  private lastReports: readonly ServiceBuildReport[] = [];
  private rebuildQueued = false;
  private housekeeping: NodeJS.Timeout | null = null;
  private rates = new Map<number, { pps: number; bps: number; packets: number; bytes: number }>();
  /** IPIP reals: the address whose MAC the outer frame goes to (the real on-link, else its gateway). */
  private nextHops = new Map<string, string>();
  private tunnelSources: TunnelSources = { v4: null, v6: null };
  private announcer: VipAnnouncer | null = null;
  private announceTimer: NodeJS.Timeout | null = null;
  private announceBusy = false;
  /** Services the operator withdrew (`dsrlb withdraw`), by service identity. */
  private withdrawn = new Set<string>();
  mtu = 1500;

  constructor(
    readonly configPath: string,
    readonly log: Logger,
  ) {
    this.loops = new LoopGroup(log);
    this.metrics = new DaemonMetrics({
      counters: () => this.loops.counters(),
      reals: () => this.metricsView(),
      activeFlows: (id) => this.loops.active(id),
      inactiveFlows: (id) => this.loops.inactive(id),
      flowTableCapacity: () => this.config.flowTable.capacity,
      panic: () => this.lastReports.map((r) => ({ service: r.name, panic: r.panic })),
      services: () =>
        this.lastReports.map((r) => {
          const s = this.config.services.find((x) => x.name === r.name);
          return { service: r.name, fingerprint: r.tableFingerprint, announced: s ? (this.announcer?.isAnnounced(s.vip) ?? false) : false };
        }),
    });
    this.health = new HealthMonitor({
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
    await this.loadOverrides();
    this.host = new HostSetup(this.config.interface, this.log);
    this.neighbors = new NeighborWatcher(this.config.interface, this.log);
    await this.host.adopt();
    await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' });
    await this.startWorker();
    this.syncReals();
    await this.resolveTunnelRoutes();
    this.neighbors.on('change', () => this.queueRebuild('neighbour change'));
    this.neighbors.setWanted(this.l2RealAddresses());
    this.neighbors.start();
    this.rebuild('start');
    await this.startAnnouncing();
    this.metrics.reloads.inc({ result: 'success' }, 0);
    this.metrics.lastReloadSuccess.set(Date.now() / 1000);
    this.housekeeping = setInterval(() => this.tick(), 1000);
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


  private vips(): string[] {
    return [...new Set(this.config.services.map((s) => s.vip))];
  }

  /** Scale-out: VIP gates for BIRD, re-evaluated every 200 ms (loop stalls are seen within ~1 s). */
  private async startAnnouncing(): Promise<void> {
    const a = this.config.announce;
    if (!a.enabled) return;
    this.announcer ??= new VipAnnouncer(this.log, a.routesFile, a.birdSocket);
    this.announcer.setFiles(a.routesFile, a.birdSocket);
    await this.syncAnnouncements();
    this.announceTimer ??= setInterval(() => void this.syncAnnouncements(), 200);
  }

  /** Per VIP: announce while the loop runs and a service of the VIP can take new flows. */
  private announceWanted(): Map<string, boolean> {
    const loopOk = this.loops.running && this.loops.heartbeatAgeMs() < 1000;
    const wanted = new Map<string, boolean>();
    for (const s of this.config.services) {
      if (!s.announce) continue;
      const report = this.lastReports.find((r) => r.name === s.name);
      const eligible = report !== undefined && !report.dropping && (!report.panic || this.config.announce.onFailOpen);
      const on = loopOk && eligible && !this.withdrawn.has(serviceIdentity(s));
      wanted.set(s.vip, (wanted.get(s.vip) ?? false) || on);
    }
    return wanted;
  }

  private async syncAnnouncements(): Promise<void> {
    if (!this.announcer || this.announceBusy) return;
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
  async setAnnounce(serviceRef: string, announce: boolean): Promise<{ service: string; announce: boolean }> {
    const s = this.findService(serviceRef);
    if (!s) throw new DaemonError('UNKNOWN_SERVICE', `unknown service "${serviceRef}"`);
    if (!this.config.announce.enabled) throw new DaemonError('ANNOUNCE_DISABLED', 'announce.enabled is false in the config: nothing is announced');
    if (announce) this.withdrawn.delete(serviceIdentity(s));
    else this.withdrawn.add(serviceIdentity(s));
    await this.saveOverrides();
    this.log.info(announce ? 'operator: announce' : 'operator: withdraw', { service: s.name });
    await this.syncAnnouncements();
    return { service: s.name, announce };
  }

  /** Addresses whose MACs the data plane needs: L2 reals, and the next hops of IPIP reals. */
  private l2RealAddresses(): string[] {
    const out = new Set<string>();
    for (const s of this.config.services) {
      for (const r of s.reals) out.add(r.forwarding === 'l2' ? r.address : (this.nextHops.get(r.address) ?? r.address));
    }
    for (const r of this.reals.values()) if (r.removed) out.add(r.address);
    return [...out];
  }

  /** Next hops of IPIP reals from the LB's routing table, and the outer source addresses. */
  private async resolveTunnelRoutes(): Promise<void> {
    const hops = new Map<string, string>();
    for (const s of this.config.services) {
      for (const r of s.reals) {
        if (r.forwarding !== 'ipip' || hops.has(r.address)) continue;
        try {
          const { stdout } = await systemRunner(['ip', '-j', 'route', 'get', r.address]);
          const route = (JSON.parse(stdout) as { gateway?: string; dev?: string }[])[0];
          if (route?.dev && route.dev !== this.config.interface) {
            this.log.warn('IPIP real is not reached through the forwarding interface', { real: r.address, dev: route.dev, interface: this.config.interface });
          }
          hops.set(r.address, route?.gateway ?? r.address);
        } catch (err) {
          this.log.warn('no route to IPIP real', { real: r.address, error: (err as Error).message });
        }
      }
    }
    this.nextHops = hops;
    let v4 = this.config.tunnel.sourceV4;
    let v6 = this.config.tunnel.sourceV6;
    if (!v4 || !v6) {
      const { stdout } = await systemRunner(['ip', '-j', 'addr', 'show', 'dev', this.config.interface]);
      const info = (JSON.parse(stdout || '[]') as { addr_info?: { family: string; local: string; scope: string }[] }[])[0]?.addr_info ?? [];
      v4 ??= info.find((a) => a.family === 'inet')?.local ?? null;
      v6 ??= info.find((a) => a.family === 'inet6' && a.scope === 'global')?.local ?? null;
    }
    this.tunnelSources = { v4, v6 };
  }

  /** Make this.reals match the config: new pairs get ids, vanished ones are marked removed (drained). */
  private syncReals(): void {
    const present = new Set<string>();
    for (const s of this.config.services) {
      const sid = serviceIdentity(s);
      for (const r of s.reals) {
        const key = RealRegistry.keyOf(sid, r.address);
        present.add(key);
        const existing = this.reals.get(key);
        if (existing) {
          existing.removed = false;
          continue;
        }
        this.reals.set(key, { key, id: this.registry.idFor(key), service: sid, serviceName: s.name, address: r.address, removed: false });
      }
    }
    for (const r of this.reals.values()) {
      if (!present.has(r.key) && !r.removed) {
        r.removed = true;
        this.log.info('real removed from config: draining', { service: r.service, real: r.address });
      }
    }
    // Removed (draining) reals stay probed: if one dies, its flows move instead of black-holing.
    const targets: HealthTarget[] = [];
    for (const r of this.reals.values()) {
      const s = this.config.services.find((x) => serviceIdentity(x) === r.service);
      if (!s) continue;
      targets.push({ key: r.key, service: s.name, address: r.address, vip: s.vip, check: s.healthCheck });
    }
    this.health.setTargets(targets);
  }

  /** The damped health fact of a real (no health check: up). */
  private healthOf(key: string): HealthFact {
    return this.health.fact(key)?.state ?? 'down';
  }

  private intentOf(key: string, cfgState: RealIntent, cfgWeight: number): { state: RealIntent; weight: number } {
    const o = this.overrides.get(key);
    if (!o || o.configState !== cfgState || o.configWeight !== cfgWeight) return { state: cfgState, weight: cfgWeight };
    return { state: o.state ?? cfgState, weight: o.weight ?? cfgWeight };
  }

  private serviceViews(): ServiceView[] {
    const views: ServiceView[] = [];
    for (const s of this.config.services) {
      const sid = serviceIdentity(s);
      const reals: RealView[] = [];
      for (const r of s.reals) {
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
          mac: this.neighbors.macOf(r.forwarding === 'ipip' ? (this.nextHops.get(r.address) ?? r.address) : r.address),
        });
      }
      for (const rt of this.reals.values()) {
        if (rt.service !== sid || !rt.removed) continue;
        reals.push({
          id: rt.id,
          address: rt.address,
          weight: 0,
          intent: 'drain',
          forwarding: 'l2',
          health: this.healthOf(rt.key),
          removed: true,
          mac: this.neighbors.macOf(rt.address),
        });
      }
      views.push({ config: s, reals });
    }
    return views;
  }

  private queueRebuild(why: string): void {
    if (this.rebuildQueued) return;
    this.rebuildQueued = true;
    setImmediate(() => {
      this.rebuildQueued = false;
      this.rebuild(why);
    });
  }

  /** Build a snapshot from the current view and hand it to the packet loop. */
  rebuild(why: string): void {
    const { snapshot, services } = this.builder.build(this.serviceViews(), this.config.hashSeed, MAX_REAL_IDS, this.tunnelSources);
    for (const s of services) {
      if (s.movedSlots > 0) {
        this.metrics.tableMovedSlots.inc({ service: s.name }, s.movedSlots);
        this.log.info('forwarding table rebuilt', { service: s.name, movedSlots: s.movedSlots, tableSize: s.tableSize, why });
      }
      const prev = this.lastReports.find((p) => p.name === s.name);
      if (s.panic && !prev?.panic) this.log.warn('no real is up: failOpen, forwarding to all wanted reals', { service: s.name });
      if (s.dropping && !prev?.dropping) this.log.warn('no real can take new flows: dropping', { service: s.name });
    }
    this.lastReports = services;
    this.send({ type: 'snapshot', snapshot });
  }

  /** Once a second: rates, and forgetting removed reals whose last flow is gone. */
  private tick(): void {
    let forget = false;
    const counters = this.loops.counters();
    for (const r of [...this.reals.values()]) {
      const c = REAL_BASE + r.id * REAL_STRIDE;
      const packets = counters[c + RealCounter.forwardedPackets]!;
      const bytes = counters[c + RealCounter.forwardedBytes]!;
      const prev = this.rates.get(r.id);
      this.rates.set(r.id, { packets, bytes, pps: prev ? packets - prev.packets : 0, bps: prev ? bytes - prev.bytes : 0 });
      if (r.removed && this.loops.active(r.id) === 0 && this.loops.inactive(r.id) === 0) {
        this.reals.delete(r.key);
        this.registry.release(r.key);
        this.log.info('removed real drained: forgotten', { service: r.service, real: r.address });
        forget = true;
      }
    }
    if (forget) {
      this.neighbors.setWanted(this.l2RealAddresses());
      this.rebuild('removed real drained');
    }
  }

  /** Reload the config file: all or nothing. */
  async reload(): Promise<{ ok: boolean; problems: readonly ConfigProblem[] }> {
    const { text, result: loaded } = await readConfigFile(this.configPath);
    if (!loaded.ok) {
      this.metrics.reloads.inc({ result: 'failure' });
      this.log.error('reload refused: config invalid, the running config stays', {
        problems: loaded.problems.map((p) => `${p.path}: ${p.message}`),
      });
      return { ok: false, problems: loaded.problems };
    }
    const next = loaded.config;
    const refusal = this.unreloadable(next);
    if (refusal) {
      this.metrics.reloads.inc({ result: 'failure' });
      this.log.error('reload refused', { problems: [`${refusal.path}: ${refusal.message}`] });
      return { ok: false, problems: [refusal] };
    }
    try {
      await this.host.apply([...new Set(next.services.map((s) => s.vip))], { disableGro: next.io === 'pcap' });
    } catch (err) {
      this.metrics.reloads.inc({ result: 'failure' });
      const p = { path: '(host)', message: (err as Error).message };
      this.log.error('reload refused: host change failed', { problems: [`${p.path}: ${p.message}`] });
      await this.host.apply(this.vips(), { disableGro: this.config.io === 'pcap' }).catch(() => undefined);
      return { ok: false, problems: [p] };
    }
    this.config = next;
    this.configText = text!;
    this.send({ type: 'timeouts', timeouts: timeoutsOf(next) });
    this.syncReals();
    await this.resolveTunnelRoutes();
    this.neighbors.setWanted(this.l2RealAddresses());
    this.rebuild('reload');
    if (next.announce.enabled) {
      await this.startAnnouncing();
    } else if (this.announcer) {
      await this.announcer.sync(new Map());
    }
    this.metrics.reloads.inc({ result: 'success' });
    this.metrics.lastReloadSuccess.set(Date.now() / 1000);
    this.log.info('reload taken', { services: next.services.map((s) => s.name) });
    return { ok: true, problems: [] };
  }

  /** Keys a running daemon cannot change without a restart. */
  private unreloadable(next: Config): ConfigProblem | null {
    const c = restartOnlyChanges(this.config, next)[0];
    if (c === undefined) return null;
    return { path: c.path, message: `changing ${c.what} (${c.before} -> ${c.after}) needs a restart${c.why === null ? '' : ` (${c.why})`}` };
  }

  findService(ref: string): ServiceConfig | null {
    for (const s of this.config.services) {
      if (s.name === ref) return s;
      const host = s.family === 6 ? `[${s.vip}]` : s.vip;
      if (ref === `${s.protocol}://${host}:${s.port}`) return s;
    }
    return null;
  }

  /** Operator intent for one real (admin API); persisted beside the config. */
  async setIntent(serviceRef: string, realAddress: string, change: { state?: RealIntent; weight?: number }): Promise<{ before: { state: RealIntent; weight: number }; after: { state: RealIntent; weight: number } }> {
    const s = this.findService(serviceRef);
    if (!s) throw new DaemonError('UNKNOWN_SERVICE', `unknown service "${serviceRef}"`);
    const r = s.reals.find((x) => x.address === realAddress);
    if (!r) throw new DaemonError('UNKNOWN_REAL', `service "${s.name}" has no real "${realAddress}"`);
    const key = RealRegistry.keyOf(serviceIdentity(s), r.address);
    const before = this.intentOf(key, r.state, r.weight);
    const o = this.overrides.get(key);
    const base: IntentOverride = o && o.configState === r.state && o.configWeight === r.weight ? o : { configState: r.state, configWeight: r.weight };
    const next: IntentOverride = { ...base, ...change };
    this.overrides.set(key, next);
    await this.saveOverrides();
    const after = this.intentOf(key, r.state, r.weight);
    this.log.info('intent changed', { service: s.name, real: r.address, before, after });
    this.rebuild('intent');
    return { before, after };
  }

  private async loadOverrides(): Promise<void> {
    if (!this.config.stateFile) return;
    try {
      const raw = JSON.parse(await readFile(this.config.stateFile, 'utf8')) as { intent?: Record<string, IntentOverride>; withdrawn?: string[] };
      this.overrides = new Map(Object.entries(raw.intent ?? {}));
      this.withdrawn = new Set(raw.withdrawn ?? []);
    } catch {
      this.overrides = new Map();
    }
  }

  private async saveOverrides(): Promise<void> {
    if (!this.config.stateFile) return;
    const tmp = `${this.config.stateFile}.tmp`;
    await writeFile(tmp, JSON.stringify({ intent: Object.fromEntries(this.overrides), withdrawn: [...this.withdrawn] }, null, 2));
    await rename(tmp, this.config.stateFile);
  }

  /** Where a flow from client would go (explain), asked of the packet loop itself. */
  async explain(serviceRef: string, clientIp: string, clientPort: number): Promise<Record<string, unknown>> {
    const s = this.findService(serviceRef);
    if (!s) throw new DaemonError('UNKNOWN_SERVICE', `unknown service "${serviceRef}"`);
    const addr = new Uint32Array(8);
    addr.set(addressWords(clientIp), 0);
    addr.set(addressWords(s.vip), 4);
    const answers = await this.loops.ask((id) => ({ type: 'explain', id, family: s.family, protocol: s.protocol === 'tcp' ? 6 : 17, addr, srcPort: clientPort, dstPort: s.port }));
    // With several loops the flow lives in one of them: a flow-table hit wins.
    const e = answers.find((a) => a.type === 'explained' && a.placement === 'flow-table') ?? answers[0];
    if (!e || e.type !== 'explained') throw new DaemonError('INTERNAL', 'no packet loop answered');
    const real = [...this.reals.values()].find((r) => r.id === e.real);
    return { service: s.name, client: `${clientIp}:${clientPort}`, real: real?.address ?? null, reason: e.placement, generation: e.generation };
  }

  /** Live flows for plan: flow keys with the (service identity, address) of their real. */
  async liveFlows(limit = 2_000_000): Promise<{ keys: number[]; reals: { identity: string; address: string }[] }> {
    const answers = await this.loops.ask((id) => ({ type: 'flows', id, limit }));
    const byId = new Map([...this.reals.values()].map((r) => [r.id, r]));
    const keys: number[] = [];
    const reals: { identity: string; address: string }[] = [];
    for (const e of answers) {
      if (e.type !== 'flows') continue;
      for (let i = 0; i < e.count; i++) {
        const r = byId.get(e.reals[i]!);
        if (!r) continue;
        for (let w = 0; w < 10; w++) keys.push(e.keys[i * 10 + w]!);
        reals.push({ identity: r.service, address: r.address });
      }
    }
    return { keys, reals };
  }

  loopHealthy(): boolean {
    return this.loops.running && this.loops.heartbeatAgeMs() < 5000;
  }

  status(): Record<string, unknown> {
    const views = this.serviceViews();
    const counters = this.loops.counters();
    const keyById = new Map([...this.reals.values()].map((x) => [x.id, x.key]));
    return {
      interface: this.config.interface,
      io: this.config.io,
      mac: formatMac(this.loops.localMac),
      loop: { running: this.loops.running, loops: this.loops.size, healthy: this.loopHealthy(), snapshotGeneration: counters[Counter.snapshotGeneration] },
      flowTable: { entries: counters[Counter.flowTableEntries], capacity: this.config.flowTable.capacity },
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
          panic: report?.panic ?? false,
          dropping: report?.dropping ?? false,
          tableFingerprint: report?.tableFingerprint ?? null,
          announced: this.announcer?.isAnnounced(v.config.vip) ?? false,
          announceDevice: this.announcer?.deviceOf(v.config.vip) ?? null,
          operatorWithdrawn: this.withdrawn.has(serviceIdentity(v.config)),
          reals: v.reals.map((r) => {
            const fact = this.health.fact(keyById.get(r.id)!);
            const c = REAL_BASE + r.id * REAL_STRIDE;
            const rate = this.rates.get(r.id);
            return {
              address: r.address,
              forwarding: r.forwarding,
              weight: r.weight,
              intent: r.intent,
              removed: r.removed,
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
              packets: counters[c + RealCounter.forwardedPackets],
              bytes: counters[c + RealCounter.forwardedBytes],
              pps: rate?.pps ?? 0,
              bytesPerSecond: rate?.bps ?? 0,
            };
          }),
        };
      }),
    };
  }

  private metricsView(): MetricsRealView[] {
    if (!this.config) return [];
    const out: MetricsRealView[] = [];
    for (const v of this.serviceViews()) {
      for (const r of v.reals) {
        out.push({ service: v.config.name, real: r.address, id: r.id, weight: r.weight, intent: r.intent, up: r.health === 'up', drainFinished: this.drainFinished(r) });
      }
    }
    return out;
  }

  async stop(): Promise<void> {
    if (this.housekeeping) clearInterval(this.housekeeping);
    if (this.announceTimer) clearInterval(this.announceTimer);
    this.announceTimer = null;
    if (this.announcer) {
      // Withdraw first and give BGP time to move the flows away while the loop still forwards.
      while (this.announceBusy) await new Promise((r) => setTimeout(r, 10));
      await this.announcer.withdrawAll();
      await new Promise((r) => setTimeout(r, this.config.announce.withdrawDelayMs));
    }
    this.health.stop();
    this.neighbors?.stop();
    await this.loops.stop(CLOSE_TIMEOUT_MS);
    this.announcer?.close();
    await this.host?.undo();
    this.log.info('dsrlb stopped');
  }
}
