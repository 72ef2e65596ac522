// The immutable forwarding snapshot the packet loop reads: services, their lookup index, the
// per-service consistent-hash tables and candidate lists, and per-real forwarding facts, all in
// typed arrays indexed by service index or real id. The control plane builds a new one aside
// (src/control/snapshot-builder.ts) and the loop swaps it in between batches with one assignment.

export type TypedArrayOf<T> = { new (buffer: SharedArrayBuffer): T; readonly BYTES_PER_ELEMENT: number };

/**
 * A zeroed typed array of `length` elements over a SharedArrayBuffer. Every array of a snapshot is
 * made this way: posted to a packet loop it is shared, not copied. A copy of 81 services' Maglev
 * tables (21 MiB) stalled each loop 4-11 ms per snapshot and grew its memory by as much until a
 * collection. Sharing is safe because nothing writes a snapshot's arrays once it is built.
 */
export function sharedArray<T>(ctor: TypedArrayOf<T>, length: number): T {
  return new ctor(new SharedArrayBuffer(length * ctor.BYTES_PER_ELEMENT));
}

export const SCHED_MAGLEV = 0;
export const SCHED_RENDEZVOUS = 1;
export const SCHED_WLC = 2;

/**
 * The table of a service that reads none: rendezvous scores its candidates (consistent-pick.ts),
 * so a Maglev table for it would be megabytes built per reload and never read. One length-0
 * array, shared like every snapshot array, stands for it in every snapshot (svcTableSize 0).
 */
export const NO_TABLE: Int32Array = sharedArray(Int32Array, 0);

export const FWD_L2 = 0;
export const FWD_IPIP = 1;

export interface ForwardingSnapshot {
  readonly generation: number;
  /** Seed of the flow hash; equal on every LB of a group so they all pick the same real. */
  readonly hashSeed: number;

  readonly serviceCount: number;
  readonly svcFamily: Uint8Array; // 4 | 6
  readonly svcProtocol: Uint8Array; // 6 | 17
  readonly svcPort: Uint16Array; // 0 = every port
  readonly svcVip: Uint32Array; // 4 words per service, IPv4 in word 0
  readonly svcScheduler: Uint8Array; // SCHED_*
  /**
   * Client persistence: 1 when new connections of service s are placed by the client's address
   * (cut to the service's prefix by svcClientMask, words 4s..4s+3, one bit per address bit as
   * ParsedPacket.addr holds it) instead of their whole 5-tuple (clientPlacementHash).
   */
  readonly svcPersistent: Uint8Array;
  readonly svcClientMask: Int32Array;
  /** 1 for one-packet scheduling (`ops`): no flow entries; every datagram placed as one without an entry. */
  readonly svcOps: Uint8Array;
  /** 1 when no real may take new flows and the service says whenAllDown: drop. */
  readonly svcDropAll: Uint8Array;
  /** The DropReason counted when the service places a packet on no real: neighborUnknown when MACs are what is missing. */
  readonly svcDropReason: Uint8Array;
  /** Maglev table per service over its candidates (wlc's fallback too); NO_TABLE for rendezvous. */
  readonly svcTables: readonly Int32Array[];
  /** Each svcTables entry's length: 0 for rendezvous, whose picks never index a table. */
  readonly svcTableSize: Int32Array;
  /** Candidates for new flows of service s: candIds[svcCandStart[s] .. + svcCandCount[s]]. */
  readonly svcCandStart: Int32Array;
  readonly svcCandCount: Int32Array;
  readonly candIds: Int32Array;
  readonly candSeeds: Uint32Array; // rendezvous per-real seed
  readonly candWeights: Float64Array;
  /**
   * Where a mid-stream packet without an entry goes (an LB restarted, or the flow came from another
   * LB): the candidates plus the wanted reals whose probes have not decided yet, as on an LB that
   * has seen them up. The same table and candidate range as above when no real is unproven;
   * NO_TABLE for rendezvous, as above.
   */
  readonly svcMidTables: readonly Int32Array[];
  readonly svcMidCandStart: Int32Array;
  readonly svcMidCandCount: Int32Array;
  /** 1 when that set is empty too. */
  readonly svcMidDropAll: Uint8Array;

  /** Open-addressing index: bucket -> service index or -1; size lookupMask + 1 (a power of two). */
  readonly lookupBuckets: Int32Array;
  readonly lookupMask: number;

  /** Per real id (0 .. realIdLimit-1). */
  readonly realIdLimit: number;
  /** 1 when the real may keep the flows it has (active, drain, failOpen panic); else they move. */
  readonly realKeepExisting: Uint8Array;
  readonly realForwarding: Uint8Array; // FWD_*
  readonly realMac: Uint8Array; // 6 bytes per id
  readonly realMacKnown: Uint8Array;
  readonly realService: Int32Array;
  /** IPIP outer header templates, TUNNEL_TEMPLATE_BYTES per real id (src/encap/ipip.ts); empty slot = no tunnel. */
  readonly realTunnelTemplates: Uint8Array;
  /** Per real id: its route's MTU toward an IPIP real (0: none, the interface's MTU holds). */
  readonly realTunnelMtu: Uint16Array;

  /** Every VIP once (4 words each, IPv4 in word 0) with its family: ICMP and fragments to a VIP. */
  readonly vipCount: number;
  readonly vipWords: Uint32Array;
  readonly vipFamily: Uint8Array;
}

/** True when the packet's destination (addr words 4..7) is one of the snapshot's VIPs. */
export function isVip(s: ForwardingSnapshot, family: number, addr: Uint32Array): boolean {
  const w = s.vipWords;
  for (let i = 0; i < s.vipCount; i++) {
    const v = i * 4;
    if (s.vipFamily[i] === family && w[v] === addr[4] && w[v + 1] === addr[5] && w[v + 2] === addr[6] && w[v + 3] === addr[7]) return true;
  }
  return false;
}

/** True when real id `real` belongs to a service whose VIP is the packet's destination (addr words 4..7). */
export function realServesVip(s: ForwardingSnapshot, real: number, family: number, addr: Uint32Array): boolean {
  const svc = s.realService[real]!;
  return svc >= 0 && serviceHasVip(s, svc, family, addr, 4);
}

/**
 * True when real id `real` belongs to a service that also matches the flow of `key` (a flow
 * table key: family << 8 | protocol, source words 1..4, destination words 5..8, client port << 16
 * | VIP port): its VIP, protocol, and port 0 or the key's port. So is the VIP's port-0 service
 * for a connection it placed before a reload added a service on that exact port.
 */
export function realServesKey(s: ForwardingSnapshot, real: number, key: Uint32Array): boolean {
  const svc = s.realService[real]!;
  if (svc < 0) return false;
  const port = s.svcPort[svc]!;
  return s.svcProtocol[svc] === (key[0]! & 0xff) && (port === 0 || port === (key[9]! & 0xffff)) && serviceHasVip(s, svc, key[0]! >>> 8, key, 5);
}

/**
 * True when service `svc`'s VIP is the destination in `family`: words at..at+3 of `addr` (4 in a
 * ParsedPacket's addr, 5 in a flow-table key).
 */
function serviceHasVip(s: ForwardingSnapshot, svc: number, family: number, addr: Uint32Array, at: number): boolean {
  const v = svc * 4;
  return s.svcFamily[svc] === family && s.svcVip[v] === addr[at] && s.svcVip[v + 1] === addr[at + 1] && s.svcVip[v + 2] === addr[at + 2] && s.svcVip[v + 3] === addr[at + 3];
}

/**
 * Hash of (family, protocol, VIP, port) for the service index, as an int32 (callers take `& mask`):
 * a uint32 from 2^31 up is a heap number wherever V8 does not inline this, one per lookup.
 * The builder uses the same function.
 */
export function serviceKeyHash(family: number, protocol: number, vip: Uint32Array, vipOffset: number, port: number): number {
  let h = Math.imul(family * 256 + protocol, 0x9e3779b1) ^ port;
  h = Math.imul(h ^ vip[vipOffset], 0x85ebca6b);
  h = Math.imul(h ^ vip[vipOffset + 1], 0xc2b2ae35);
  h = Math.imul(h ^ vip[vipOffset + 2], 0x85ebca6b);
  h = Math.imul(h ^ vip[vipOffset + 3], 0xc2b2ae35);
  h ^= h >>> 16;
  return h;
}

function findExact(s: ForwardingSnapshot, family: number, protocol: number, addr: Uint32Array, port: number): number {
  const mask = s.lookupMask;
  let b = serviceKeyHash(family, protocol, addr, 4, port) & mask;
  for (let probes = 0; probes <= mask; probes++) {
    const svc = s.lookupBuckets[b];
    if (svc < 0) return -1;
    if (s.svcPort[svc] === port && s.svcProtocol[svc] === protocol && serviceHasVip(s, svc, family, addr, 4)) return svc;
    b = (b + 1) & mask;
  }
  return -1;
}

/**
 * The service for a packet's (protocol, destination address, destination port), or -1.
 * `addr` is ParsedPacket.addr (destination in words 4..7). An exact port wins over port 0.
 */
export function findService(s: ForwardingSnapshot, family: number, protocol: number, addr: Uint32Array, dstPort: number): number {
  if (s.serviceCount === 0) return -1;
  const exact = findExact(s, family, protocol, addr, dstPort);
  if (exact >= 0 || dstPort === 0) return exact;
  return findExact(s, family, protocol, addr, 0);
}

/** A snapshot with no services: the loop passes everything until the first real one arrives. */
export function emptySnapshot(): ForwardingSnapshot {
  return {
    generation: 0,
    hashSeed: 0,
    serviceCount: 0,
    svcFamily: new Uint8Array(0),
    svcProtocol: new Uint8Array(0),
    svcPort: new Uint16Array(0),
    svcVip: new Uint32Array(0),
    svcScheduler: new Uint8Array(0),
    svcPersistent: new Uint8Array(0),
    svcClientMask: new Int32Array(0),
    svcOps: new Uint8Array(0),
    svcDropAll: new Uint8Array(0),
    svcDropReason: new Uint8Array(0),
    svcTables: [],
    svcTableSize: new Int32Array(0),
    svcCandStart: new Int32Array(0),
    svcCandCount: new Int32Array(0),
    candIds: new Int32Array(0),
    candSeeds: new Uint32Array(0),
    candWeights: new Float64Array(0),
    svcMidTables: [],
    svcMidCandStart: new Int32Array(0),
    svcMidCandCount: new Int32Array(0),
    svcMidDropAll: new Uint8Array(0),
    lookupBuckets: new Int32Array(1).fill(-1),
    lookupMask: 0,
    realIdLimit: 0,
    realKeepExisting: new Uint8Array(0),
    realForwarding: new Uint8Array(0),
    realMac: new Uint8Array(0),
    realMacKnown: new Uint8Array(0),
    realService: new Int32Array(0),
    realTunnelTemplates: new Uint8Array(0),
    realTunnelMtu: new Uint16Array(0),
    vipCount: 0,
    vipWords: new Uint32Array(0),
    vipFamily: new Uint8Array(0),
  };
}
