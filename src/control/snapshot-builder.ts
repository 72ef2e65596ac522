// Builds the forwarding snapshot the packet loop reads, from the configured services and the
// control plane's view of each real (intent, health, MAC, stable id). Pure apart from a cache of
// Maglev tables keyed by their inputs, so a reload rebuilds only the tables whose inputs changed.

import type { ServiceConfig } from '../config/types.js';
import {
  FWD_IPIP,
  FWD_L2,
  NO_TABLE,
  SCHED_MAGLEV,
  SCHED_RENDEZVOUS,
  SCHED_WLC,
  serviceKeyHash,
  sharedArray,
  type ForwardingSnapshot,
  type TypedArrayOf,
} from '../dataplane/forwarding-snapshot.js';
import { DropReason } from '../dataplane/drop-reasons.js';
import { stringHash } from '../dataplane/flow-hash.js';
import { writeClientMask } from '../dataplane/client-persistence.js';
import { buildMaglevTable, countMovedSlots, gcd, type MaglevReal } from '../dataplane/maglev-table.js';
import { eligibility, isWanted, type HealthFact } from '../health/eligibility.js';
import { TUNNEL_TEMPLATE_BYTES, writeTunnelTemplate } from '../encap/ipip.js';
import { addressWords } from './addresses.js';
import type { RealIntent, ForwardingMode } from '../config/types.js';

/** The control plane's view of one real of one service. */
export interface RealView {
  readonly id: number;
  readonly address: string;
  readonly weight: number;
  readonly intent: RealIntent;
  readonly forwarding: ForwardingMode;
  readonly health: HealthFact;
  readonly removed: boolean;
  /** L2: the real's MAC; IPIP: the next hop's MAC (the real when on-link, else the gateway). Null while unresolved. */
  readonly mac: Uint8Array | null;
  /** IPIP: the outer source its route gives (else the family's TunnelSources address). */
  readonly tunnelSource?: string | null;
  /** IPIP: its route's MTU metric (else the interface's MTU; the smaller one counts). */
  readonly tunnelMtu?: number | null;
  /** A backup real (RealConfig.backup): new flows only while no other real of the service takes them. */
  readonly backup?: boolean;
}

/** Outer source addresses for IPIP (config tunnel.sourceV4/V6, else the interface's addresses). */
export interface TunnelSources {
  readonly v4: string | null;
  readonly v6: string | null;
}

export interface ServiceView {
  readonly config: ServiceConfig;
  readonly reals: readonly RealView[];
  /** Removed by a reload, its reals' flows draining: no real takes new flows. */
  readonly removed?: boolean;
}

export interface ServiceBuildReport {
  readonly name: string;
  /** Ids of the reals that take new flows (the Maglev/rendezvous candidates). */
  readonly candidates: readonly number[];
  /** failOpen in effect: no real is up, so all wanted reals take flows. */
  readonly panic: boolean;
  /**
   * The panic is only that no wanted real has been probed yet (at start, or every real new in a
   * reload): they take new flows, as HAProxy and keepalived start servers up, but nothing was seen
   * failing, so the daemon reports no panic (log, metric, status, announcement).
   */
  readonly unproven: boolean;
  /** No real but backups can take new flows: the backups take them. */
  readonly onBackups: boolean;
  /** No real can take new flows and the service drops. */
  readonly dropping: boolean;
  /**
   * Dropping because the operator drained every real (drain, weight 0), one of them up and keeping
   * its flows: the VIP stays announced for them (a withdraw on every LB cut what drain keeps).
   */
  readonly drained: boolean;
  /** Maglev slots that changed against the previous snapshot's table for this service; 0 for rendezvous (no table). */
  readonly movedSlots: number;
  /** Its Maglev table's size; 0 for rendezvous, which has none. */
  readonly tableSize: number;
  /** A short fingerprint of what the service's consistent-hash picks read (equal on LBs that agree). */
  readonly tableFingerprint: string;
}

export interface BuildResult {
  readonly snapshot: ForwardingSnapshot;
  readonly services: readonly ServiceBuildReport[];
}

const PROTO = { tcp: 6, udp: 17 } as const;

function serviceIdentity(s: ServiceConfig): string {
  return `${s.protocol}|${s.vip}|${s.port}`;
}

/** Keeps the previous tables so unchanged services reuse them and moved slots can be counted. */
export class SnapshotBuilder {
  private generation = 0;
  /** The generation of the last snapshot built (0: none yet). */
  get lastGeneration(): number {
    return this.generation;
  }
  private tables = new Map<string, { inputs: string; table: Int32Array }>();
  /** Each table's fingerprint, by the service identity and scheduler it was taken for. */
  private readonly fingerprints = new WeakMap<Int32Array, { key: string; value: string }>();

  build(services: readonly ServiceView[], hashSeed: number, maxRealIds: number, tunnel: TunnelSources = { v4: null, v6: null }): BuildResult {
    const n = services.length;
    const svcFamily = sharedArray(Uint8Array, n);
    const svcProtocol = sharedArray(Uint8Array, n);
    const svcPort = sharedArray(Uint16Array, n);
    const svcVip = sharedArray(Uint32Array, n * 4);
    const svcScheduler = sharedArray(Uint8Array, n);
    const svcPersistent = sharedArray(Uint8Array, n);
    const svcClientMask = sharedArray(Int32Array, n * 4);
    const svcOps = sharedArray(Uint8Array, n);
    const svcDropAll = sharedArray(Uint8Array, n);
    const svcDropReason = sharedArray(Uint8Array, n);
    const svcTables: Int32Array[] = [];
    const svcTableSize = sharedArray(Int32Array, n);
    const svcCandStart = sharedArray(Int32Array, n);
    const svcCandCount = sharedArray(Int32Array, n);
    const svcMidTables: Int32Array[] = [];
    const svcMidCandStart = sharedArray(Int32Array, n);
    const svcMidCandCount = sharedArray(Int32Array, n);
    const svcMidDropAll = sharedArray(Uint8Array, n);
    const candIds: number[] = [];
    const candSeeds: number[] = [];
    const candWeights: number[] = [];

    let realIdLimit = 0;
    for (const s of services) for (const r of s.reals) realIdLimit = Math.max(realIdLimit, r.id + 1);
    if (realIdLimit > maxRealIds) throw new RangeError(`too many reals: id ${realIdLimit - 1} >= ${maxRealIds}`);
    const realKeepExisting = sharedArray(Uint8Array, realIdLimit);
    const realForwarding = sharedArray(Uint8Array, realIdLimit);
    const realMac = sharedArray(Uint8Array, realIdLimit * 6);
    const realMacKnown = sharedArray(Uint8Array, realIdLimit);
    const realService = sharedArray(Int32Array, realIdLimit).fill(-1);
    const realTunnelTemplates = sharedArray(Uint8Array, realIdLimit * TUNNEL_TEMPLATE_BYTES);
    const realTunnelMtu = sharedArray(Uint16Array, realIdLimit);
    const vips: { family: number; words: Uint32Array; text: string }[] = [];

    /** Appends reals (sorted) to the candidate arrays; returns where they start. */
    const pushCandidates = (reals: readonly RealView[]): number => {
      const start = candIds.length;
      for (const r of reals) {
        candIds.push(r.id);
        candSeeds.push(stringHash(r.address, hashSeed));
        candWeights.push(r.weight);
      }
      return start;
    };
    const reports: ServiceBuildReport[] = [];
    const nextTables = new Map<string, { inputs: string; table: Int32Array }>();

    services.forEach((sv, si) => {
      const cfg = sv.config;
      svcFamily[si] = cfg.family;
      svcProtocol[si] = PROTO[cfg.protocol];
      svcPort[si] = cfg.port;
      svcVip.set(addressWords(cfg.vip), si * 4);
      if (!vips.some((v) => v.text === cfg.vip)) vips.push({ family: cfg.family, words: addressWords(cfg.vip), text: cfg.vip });
      svcScheduler[si] = cfg.scheduler === 'wlc' ? SCHED_WLC : cfg.scheduler === 'rendezvous' ? SCHED_RENDEZVOUS : SCHED_MAGLEV;
      svcOps[si] = cfg.ops ? 1 : 0;
      if (cfg.persistence === 'client') {
        svcPersistent[si] = 1;
        writeClientMask(cfg.family, cfg.persistencePrefix, svcClientMask, si * 4);
      }

      // A real whose MAC (or next hop's) is not known yet takes no new flows: they would be dropped,
      // and an LB whose every real is unresolved (just started) must not be announced yet.
      const reachable = (r: RealView): boolean => r.mac !== null;
      // Backups take new flows only while no other real can (HAProxy's backup servers), and in a
      // failOpen panic only when no other real is wanted: a sorry server must not take users at
      // every start, while the reals are not proven up yet.
      const takesNew = (r: RealView): boolean => eligibility(r) === 'new' && reachable(r);
      let candidates = sv.reals.filter((r) => takesNew(r) && r.backup !== true);
      const onBackups = candidates.length === 0 && sv.reals.some((r) => takesNew(r) && r.backup === true);
      if (onBackups) candidates = sv.reals.filter((r) => takesNew(r) && r.backup === true);
      const panic = candidates.length === 0 && cfg.whenAllDown === 'failOpen' && sv.reals.some((r) => isWanted(r) && reachable(r));
      if (panic) {
        const wanted = sv.reals.filter((r) => isWanted(r) && reachable(r));
        const primaries = wanted.filter((r) => r.backup !== true);
        candidates = primaries.length > 0 ? primaries : wanted;
      }
      for (const r of sv.reals) {
        const e = eligibility(r, cfg.onRealDown);
        // In a panic every wanted real keeps its flows, backups too (the checks may be what is wrong).
        realKeepExisting[r.id] = e !== 'none' || (panic && isWanted(r)) ? 1 : 0;
        realForwarding[r.id] = r.forwarding === 'ipip' ? FWD_IPIP : FWD_L2;
        realService[r.id] = si;
        if (r.forwarding === 'ipip') {
          // No outer source for the real's family: the slot stays empty and the engine drops (ipip_unsupported).
          const source = r.tunnelSource ?? (r.address.includes(':') ? tunnel.v6 : tunnel.v4);
          realTunnelMtu[r.id] = Math.min(r.tunnelMtu ?? 0, 0xffff);
          if (source) writeTunnelTemplate(source, r.address, cfg.family, realTunnelTemplates, r.id * TUNNEL_TEMPLATE_BYTES);
        }
        if (r.mac) {
          realMac.set(r.mac.subarray(0, 6), r.id * 6);
          realMacKnown[r.id] = 1;
        }
      }
      svcDropAll[si] = candidates.length === 0 ? 1 : 0;
      // Counted as neighbor_unknown (the alert for an unresolved MAC) when a real would take the
      // flow but for its MAC; else no_real_available.
      const waitsForMac = sv.reals.some((r) => r.mac === null && (eligibility(r) === 'new' || (cfg.whenAllDown === 'failOpen' && isWanted(r))));
      svcDropReason[si] = waitsForMac ? DropReason.neighborUnknown : DropReason.noRealAvailable;
      svcCandCount[si] = candidates.length;
      // Candidates sorted by address: the order other LBs see too.
      const sorted = sortedByAddress(candidates);
      svcCandStart[si] = pushCandidates(sorted);
      const identity = serviceIdentity(cfg);
      const prev = this.tables.get(identity);
      // Rendezvous scores the candidates themselves (consistent-pick.ts): a Maglev table would go unread.
      const hasTable = cfg.scheduler !== 'rendezvous';
      const table = hasTable ? this.maglevTable(identity, sorted, cfg.tableSize, hashSeed, nextTables) : NO_TABLE;
      svcTables.push(table);
      svcTableSize[si] = table.length;
      // Mid-stream packets without an entry also reach the wanted reals not proven up or down yet.
      // A backup not proven yet only while the backups are what takes new flows (or all there is).
      const primaryWanted = sv.reals.some((r) => r.backup !== true && isWanted(r));
      const unproven = panic ? [] : sv.reals.filter((r) => r.health === 'unknown' && isWanted(r) && (r.backup !== true || onBackups || !primaryWanted));
      if (unproven.length === 0) {
        svcMidTables.push(table);
        svcMidCandStart[si] = svcCandStart[si]!;
        svcMidCandCount[si] = candidates.length;
      } else {
        const mid = sortedByAddress([...candidates, ...unproven]);
        svcMidCandStart[si] = pushCandidates(mid);
        svcMidCandCount[si] = mid.length;
        svcMidTables.push(hasTable ? this.maglevTable(`${identity}|mid`, mid, cfg.tableSize, hashSeed, nextTables) : NO_TABLE);
      }
      svcMidDropAll[si] = svcMidCandCount[si] === 0 ? 1 : 0;
      // A table reused whole (its inputs unchanged) moved nothing, and keeps its fingerprint: at
      // 8,000 reals these two walks over every slot of every service were most of a rebuild.
      // Rendezvous has no slots to move (NO_TABLE), whatever table the service had before.
      const movedSlots = !hasTable || prev?.table === table ? 0 : prev && prev.table.length === table.length ? countMovedSlots(prev.table, table) : prev ? table.length : 0;
      reports.push({
        name: cfg.name,
        candidates: sorted.map((r) => r.id),
        panic,
        unproven: panic && sv.reals.every((r) => !isWanted(r) || !reachable(r) || r.health === 'unknown'),
        onBackups,
        dropping: candidates.length === 0,
        // Every real out by the operator's intent (none by health), one of them drained and up.
        drained:
          candidates.length === 0 &&
          !panic &&
          sv.reals.every((r) => r.removed || r.intent !== 'active' || r.weight === 0) &&
          sv.reals.some((r) => !r.removed && r.health === 'up' && r.intent !== 'disabled' && (r.intent === 'drain' || r.weight === 0)),
        movedSlots,
        tableSize: table.length,
        tableFingerprint: hasTable ? this.tableFingerprint(identity, table, sv.reals, placementKind(cfg)) : rendezvousFingerprint(identity, sorted, hashSeed, placementKind(cfg)),
      });
    });
    this.tables = nextTables;

    let buckets = 1;
    while (buckets < n * 2) buckets <<= 1;
    const lookupBuckets = sharedArray(Int32Array, buckets).fill(-1);
    for (let si = 0; si < n; si++) {
      let b = serviceKeyHash(svcFamily[si]!, svcProtocol[si]!, svcVip, si * 4, svcPort[si]!) & (buckets - 1);
      while (lookupBuckets[b] !== -1) b = (b + 1) & (buckets - 1);
      lookupBuckets[b] = si;
    }

    this.generation++;
    const snapshot: ForwardingSnapshot = {
      generation: this.generation,
      hashSeed: hashSeed >>> 0,
      serviceCount: n,
      svcFamily,
      svcProtocol,
      svcPort,
      svcVip,
      svcScheduler,
      svcPersistent,
      svcClientMask,
      svcOps,
      svcDropAll,
      svcDropReason,
      svcTables,
      svcTableSize,
      svcCandStart,
      svcCandCount,
      candIds: sharedFrom(Int32Array, candIds),
      candSeeds: sharedFrom(Uint32Array, candSeeds),
      candWeights: sharedFrom(Float64Array, candWeights),
      svcMidTables,
      svcMidCandStart,
      svcMidCandCount,
      svcMidDropAll,
      lookupBuckets,
      lookupMask: buckets - 1,
      realIdLimit,
      realKeepExisting,
      realForwarding,
      realMac,
      realMacKnown,
      realService,
      realTunnelTemplates,
      realTunnelMtu,
      vipCount: vips.length,
      vipWords: sharedFrom(Uint32Array, vips.flatMap((v) => [...v.words])),
      vipFamily: sharedFrom(Uint8Array, vips.map((v) => v.family)),
    };
    return { snapshot, services: reports };
  }

  /** tableFingerprint of a Maglev table, kept with the table: computed again only for a new table or scheduler. */
  private tableFingerprint(identity: string, table: Int32Array, reals: readonly RealView[], scheduler: string): string {
    const key = `${identity}|${scheduler}`;
    let fingerprint = this.fingerprints.get(table);
    if (fingerprint?.key !== key) {
      fingerprint = { key, value: tableFingerprint(identity, table, reals, scheduler) };
      this.fingerprints.set(table, fingerprint);
    }
    return fingerprint.value;
  }

  /** The Maglev table over `sorted`, reused from the previous build when its inputs are the same. */
  private maglevTable(
    cacheKey: string,
    sorted: readonly RealView[],
    tableSize: number,
    hashSeed: number,
    nextTables: Map<string, { inputs: string; table: Int32Array }>,
  ): Int32Array {
    const maglevReals: MaglevReal[] = sorted.map((r) => ({ id: r.id, key: r.address, weight: r.weight }));
    const inputs = `${tableSize}|${hashSeed}|` + maglevReals.map((r) => `${r.key}=${r.weight}@${r.id}`).join(',');
    const prev = this.tables.get(cacheKey);
    const table = prev && prev.inputs === inputs ? prev.table : buildMaglevTable(maglevReals, tableSize, hashSeed);
    nextTables.set(cacheKey, { inputs, table });
    return table;
  }
}

/** `values` in a shared typed array (forwarding-snapshot.ts sharedArray). */
function sharedFrom<T extends { set(values: ArrayLike<number>): void }>(ctor: TypedArrayOf<T>, values: readonly number[]): T {
  const out = sharedArray(ctor, values.length);
  out.set(values);
  return out;
}

function sortedByAddress(reals: readonly RealView[]): RealView[] {
  return [...reals].sort((a, b) => (a.address < b.address ? -1 : a.address > b.address ? 1 : 0));
}

/**
 * The service (protocol|VIP|port) and its table's contents named by real address (not by local
 * id), so two LBs with the same config agree, and two that disagree on the service's address
 * differ too (a port typo on one LB drops the flows the router sends there).
 */
function tableFingerprint(identity: string, table: Int32Array, reals: readonly RealView[], scheduler: string): string {
  const addrHash = new Map<number, number>();
  for (const r of reals) addrHash.set(r.id, stringHash(r.address, 0x5eed));
  let h = fingerprintBasis(identity, scheduler);
  for (let i = 0; i < table.length; i++) {
    const id = table[i]!;
    const v = id < 0 ? 0xffffffff : (addrHash.get(id) ?? 0);
    h = Math.imul(h ^ v, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

/**
 * A rendezvous service's fingerprint, from what its picks read (rendezvous.ts): the hash seed and
 * its candidates' addresses and weights in address order, as every LB lists them. It has no table.
 * The weights divided by their greatest common divisor: scores scale with the weights, so 2:2 picks
 * as 1:1 does, and LBs that write them so agree.
 */
function rendezvousFingerprint(identity: string, sorted: readonly RealView[], hashSeed: number, kind: string): string {
  let divisor = 0;
  for (const r of sorted) divisor = gcd(divisor, r.weight);
  let h = Math.imul(fingerprintBasis(identity, kind) ^ (hashSeed >>> 0), 0x01000193) >>> 0;
  for (const r of sorted) {
    h = Math.imul(h ^ stringHash(r.address, 0x5eed), 0x01000193) >>> 0;
    h = Math.imul(h ^ (divisor > 0 ? r.weight / divisor : r.weight), 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

/**
 * What decides the picks besides the table or the candidates: the scheduler, and client
 * persistence with its prefix (the same table indexed by another hash). Without persistence just
 * the scheduler, so the fingerprints of such services are those of releases before it.
 */
function placementKind(cfg: ServiceConfig): string {
  return cfg.persistence === 'client' ? `${cfg.scheduler}|client/${cfg.persistencePrefix}` : cfg.scheduler;
}

/** Where a fingerprint starts: the same reals pick differently under another scheduler (and wlc is local). */
function fingerprintBasis(identity: string, scheduler: string): number {
  return (0x811c9dc5 ^ stringHash(`${identity}|${scheduler}`, 0x5eed)) >>> 0;
}
