// The packet engine: for each frame of a batch, parse, find the service, find or create the flow,
// pick the real and rewrite the frame in place for L2 DSR. Owns the flow table and the counters
// of one packet loop; reads the forwarding snapshot, which the control plane swaps between batches.

import { randomBytes } from 'node:crypto';
import './inlining-budget.js';
import { consistentPick, midStreamPick } from './consistent-pick.js';
import { Counter, REAL_BASE, REAL_STRIDE, RealCounter } from './counters.js';
import { completePartialChecksum, ipv4HeaderChecksum } from './checksum.js';
import { FragmentTable } from './fragment-table.js';
import { DropReason } from './drop-reasons.js';
import { tunnelFlowLabel } from './flow-hash.js';
import { clientKeyScratch, placementHash } from './client-persistence.js';
import { FlowState, FlowTable, type FlowTimeouts } from './flow-table.js';
import {
  FWD_L2,
  SCHED_RENDEZVOUS,
  SCHED_WLC,
  emptySnapshot,
  findService,
  isVip,
  realServesKey,
  realServesVip,
  type ForwardingSnapshot,
} from './forwarding-snapshot.js';
import { leastConnectionsPick } from './least-connections.js';
import {
  IPPROTO_ICMP,
  IPPROTO_ICMPV6,
  IPPROTO_TCP,
  IPPROTO_UDP,
  PARSE_NOT_IP,
  ParsedPacket,
  TCP_ACK,
  TCP_FIN,
  TCP_RST,
  TCP_SYN,
} from './parsed-packet.js';
import { parseFrame } from './packet-parser.js';
import { EXTRA_FRAMES, FRAME_CSUM_PARTIAL, FRAME_GSO, FRAME_HAS_VNET_HDR, VERDICT_CONSUMED, VERDICT_PASS, VERDICT_TX, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_UDP_L4, VNET_HDR_LEN, type PacketBatch } from '../io/packet-io.js';
import { encapsulate, tunnelOverheadBytes, TUNNEL_TEMPLATE_BYTES } from '../encap/ipip.js';
import { buildEchoReply, isIcmpError, isSingleHostSource, parseEmbeddedFlow } from '../encap/icmp-to-vip.js';
import { segmentGso } from '../encap/gso-segmenter.js';
import { buildFragNeeded, buildPacketTooBig, fragmentOuter, mtuCheck, MTU_FITS, MTU_SEND_TOO_BIG, TooBigRateLimiter, tooBigMtu } from '../encap/too-big.js';

export interface EngineOptions {
  flowCapacity: number;
  timeouts: FlowTimeouts;
  maxRealIds: number;
  counters: Float64Array;
  /** The LB's own MAC on the forwarding interface: the source MAC of every forwarded frame. */
  localMac: Uint8Array;
  /** The forwarding interface's MTU (IPIP: what an encapsulated packet must fit). */
  mtu?: number;
  /** ICMP too-big messages per second (token bucket, burst = rate / 2). */
  tooBigPerSecond?: number;
  /** ICMP too-big messages per second to one client, an IPv4 address or IPv6 /64 (burst = rate). */
  tooBigPerClientPerSecond?: number;
  /** The first outer IPv4 identification / IPv6 fragment id (default: random, see nextFragmentId). */
  fragmentIdStart?: number;
  /** A flow table made beforehand (flowCapacity, timeouts and maxRealIds as here), holding flows already; default: a new one. */
  flows?: FlowTable;
}

const ICMP_ECHO_REQUEST = 8;
/** Router solicitation .. redirect: neighbour discovery, left to the kernel. */
const ICMPV6_ND_FIRST = 133;
const ICMPV6_ND_LAST = 137;
const ICMPV6_ECHO_REQUEST = 128;
/** tunnelOverheadBytes of a template with an IPv6 outer header (the only one with a flow label). */
const IPV6_OUTER_HEADER_BYTES = 40;
/** Room before each frame the engine writes into the batch's extra buffer (outer header + vnet). */
const EXTRA_HEADROOM = 64;

/** Why a flow got its real: reported by explain and by simulate; also the engine's internal switch. */
export const Placement = {
  flowTable: 1, // an existing entry
  scheduled: 2, // a new flow, placed by the service's scheduler
  consistentHash: 3, // a mid-stream packet without entry, placed by the consistent hash
  rescheduled: 4, // an entry whose real may not keep flows, moved
} as const;

/**
 * A partial L4 checksum (virtio NEEDS_CSUM) completed in place, and the frame's virtio_net_hdr
 * told so: before the engine rewrites what the checksum covers (an echo reply) or hides it from
 * the kernel's offload (a tunnel, outer fragments), since a virtual NIC (veth) hands
 * CHECKSUM_PARTIAL through to the receiver. False when the frame is partial and its field is not
 * the pseudo-header sum completePartialChecksum knows: the flag stays and the caller drops the
 * frame (badPartialChecksum), which would otherwise leave with the sum where a checksum belongs.
 */
function completeChecksum(buf: Uint8Array, pkt: ParsedPacket, flags: number): boolean {
  if ((flags & FRAME_CSUM_PARTIAL) === 0) return true;
  if (!completePartialChecksum(buf, pkt)) return false;
  if ((flags & FRAME_HAS_VNET_HDR) !== 0) buf[pkt.frameOffset - VNET_HDR_LEN] = 0;
  return true;
}

export class Engine {
  readonly flows: FlowTable;
  readonly counters: Float64Array;
  private snap: ForwardingSnapshot = emptySnapshot();
  private readonly pkt = new ParsedPacket();
  private readonly localMac: Uint8Array;
  private readonly mtu: number;
  private readonly fragments = new FragmentTable();
  private readonly tooBig: TooBigRateLimiter;
  private readonly seg = new ParsedPacket();
  private readonly encapOut = new Int32Array(2);
  private readonly fragOut = new Int32Array(2 + 2 * 64);
  /**
   * Segment offsets and lengths of one GSO frame: as many as a batch has extra frames, so any frame
   * whose segments can be queued can be cut (64 KiB at a client MSS of 536 is 123 segments).
   */
  private readonly segOut = new Int32Array(2 * EXTRA_FRAMES);
  private readonly icmpAddr = new Uint32Array(8);
  /** Per real id, 1 when its service had one-packet scheduling in the last snapshot (forgetOpsEntries). */
  private opsReals: Uint8Array;
  private opsRealsSpare: Uint8Array;
  /** The masked key of clientPlacementHash. */
  private readonly clientKey = clientKeyScratch();
  /** Write position in the current batch's extra buffer. */
  private extraPos = 0;
  /**
   * Outer IPv4 identification / IPv6 fragment id for packets the engine fragments. A random start
   * per engine: with several packet loops, fragments to one real from two loops should not share
   * ids (RFC 6864), which a common start of 1 made likely. An int32 (the same 32 bits; users take
   * `& 0xffff` or bytes): as a uint32, half of all starts are 2^31 or more, a heap number stored
   * here for every encapsulated packet, GSO segment and outer fragment (test/unit/engine-no-alloc).
   */
  private nextFragmentId: number;
  /**
   * The snapshot's hash seed as an int32 (flowHashInt32 takes its bits), taken once per snapshot:
   * the snapshot's field is a uint32, a heap number from 2^31 on, boxed again wherever it is
   * passed to a call V8 does not inline (a new or rescheduled flow, a too-big message without an
   * entry: 16 bytes each with a seed of 2^31 or more).
   */
  private hashSeed = 0;
  /** Set by place(): how the last placed packet got its real (a Placement value). */
  lastPlacement = 0;
  /** Set by explain(): the Maglev table slot of its hash pick, or -1 (rendezvous, wlc, a hit). */
  explainSlot = -1;
  /** Set by explain(): the FlowState of the flow's entry, or 0 when there is none. */
  explainFlowState = 0;
  /** Set by explain(): the real of a fin/closed entry a new SYN replaces (its closing connection's packets go there), or -1. */
  explainEntryReal = -1;

  constructor(opts: EngineOptions) {
    this.flows = opts.flows ?? new FlowTable(opts.flowCapacity, opts.timeouts, opts.maxRealIds);
    this.opsReals = new Uint8Array(opts.maxRealIds);
    this.opsRealsSpare = new Uint8Array(opts.maxRealIds);
    this.counters = opts.counters;
    this.localMac = new Uint8Array(6);
    this.localMac.set(opts.localMac.subarray(0, 6));
    this.mtu = opts.mtu ?? 1500;
    // 200 a second for the loop, and a quarter of that for one client: one address may be a NAT
    // whose every host needs its own message (a host caches the MTU per destination).
    const rate = opts.tooBigPerSecond ?? 200;
    const perClient = opts.tooBigPerClientPerSecond ?? 50;
    this.tooBig = new TooBigRateLimiter(rate, Math.max(1, rate / 2), perClient, Math.max(1, perClient));
    this.nextFragmentId = (opts.fragmentIdStart ?? randomBytes(4).readUInt32LE(0)) | 0;
  }

  /** Swap in a new snapshot. Called between batches only (JS runs one batch to completion). */
  setSnapshot(snap: ForwardingSnapshot): void {
    this.snap = snap;
    this.hashSeed = snap.hashSeed | 0;
    this.counters[Counter.snapshotGeneration] = snap.generation;
    this.forgetOpsEntries(snap);
  }

  /**
   * A service that has one-packet scheduling now keeps no flow entry: the entries of a real that
   * was not under it before (made before a reload turned it on) are removed, so that its datagrams
   * go by the hash and nothing counts them. A walk of the table, only when such a real appears.
   */
  private forgetOpsEntries(snap: ForwardingSnapshot): void {
    // Two arrays in turn, so that a swap allocates nothing (a snapshot can come every batch).
    const n = Math.min(snap.realIdLimit, this.opsReals.length);
    const now = this.opsRealsSpare;
    now.fill(0);
    let gained = false;
    for (let id = 0; id < n; id++) {
      const svc = snap.realService[id]!;
      if (svc < 0 || snap.svcOps[svc] !== 1) continue;
      now[id] = 1;
      if (this.opsReals[id] !== 1) gained = true;
    }
    this.opsRealsSpare = this.opsReals;
    this.opsReals = now;
    if (!gained) return;
    const flows = this.flows;
    for (let e = flows.next(-1); e >= 0; ) {
      const after = flows.next(e);
      const real = flows.realOf(e);
      if (real >= 0 && real < n && now[real] === 1) flows.remove(e);
      e = after;
    }
  }

  snapshot(): ForwardingSnapshot {
    return this.snap;
  }

  setTimeouts(t: FlowTimeouts): void {
    this.flows.setTimeouts(t);
  }

  processBatch(batch: PacketBatch, nowMs: number): void {
    const c = this.counters;
    const buf = batch.buf;
    const n = batch.count;
    const verdicts = batch.verdicts;
    const offsets = batch.offsets;
    const lengths = batch.lengths;
    const flags = batch.flags;
    batch.extraCount = 0;
    this.extraPos = 0;
    // Batch totals in locals, one store each per batch (per-reason drops stay per packet: rare).
    let rxBytes = 0;
    let txPackets = 0;
    let txBytes = 0;
    let passed = 0;
    for (let i = 0; i < n; i++) {
      const len = lengths[i]!;
      rxBytes += len;
      const v = this.processFrame(batch, i, buf, offsets[i]!, len, flags[i]!, nowMs);
      verdicts[i] = v;
      if (v === VERDICT_TX) {
        txPackets++;
        txBytes += batch.txLengths[i]!;
      } else if (v === VERDICT_PASS) {
        passed++;
      } else if (v < 0) {
        c[Counter.dropBase - v]++;
      }
    }
    // The frames the engine built (ICMP errors, outer fragments, GSO segments) go out too.
    const extras = batch.extraCount;
    for (let e = 0; e < extras; e++) txBytes += batch.extraLengths[e]!;
    c[Counter.rxPackets] += n;
    c[Counter.rxBytes] += rxBytes;
    c[Counter.txPackets] += txPackets + extras;
    c[Counter.txBytes] += txBytes;
    c[Counter.passedPackets] += passed;
    c[Counter.batches]++;
    c[Counter.loopHeartbeatMs] = nowMs;
    c[Counter.extraFrames] += batch.extraCount;
    c[Counter.flowTableEntries] = this.flows.size;
    c[Counter.flowTableEvictions] = this.flows.evictions;
  }

  /** Expire idle flows, a bounded amount of work; the loop calls this between batches. */
  housekeeping(nowMs: number, maxWork: number): void {
    this.flows.expire(nowMs, maxWork);
    this.counters[Counter.flowTableEntries] = this.flows.size;
    this.counters[Counter.flowTableExpirations] = this.flows.expirations;
    this.counters[Counter.loopHeartbeatMs] = nowMs;
  }

  private processFrame(batch: PacketBatch, i: number, buf: Uint8Array, off: number, len: number, flags: number, nowMs: number): number {
    // A frame to a group MAC (broadcast, multicast) is no frame to forward, as for the kernel's
    // ip_forward: every LB on the segment would forward it, and an echo answered from it would
    // carry the group address as its source MAC.
    if (len > 0 && (buf[off]! & 1) !== 0) return VERDICT_PASS;
    const pkt = this.pkt;
    const r = parseFrame(buf, off, len, pkt);
    if (r === PARSE_NOT_IP) return VERDICT_PASS;
    if (r < 0) return r;
    const proto = pkt.ipProtocol;
    const snap = this.snap;
    if (proto === IPPROTO_ICMP || proto === IPPROTO_ICMPV6) {
      if (!isVip(snap, pkt.family, pkt.addr)) return VERDICT_PASS;
      // A fragmented ICMP message to a VIP (a large ping, for MTU checks) is the kernel's to
      // reassemble and answer: it holds the VIP, and the nftables rules let such fragments through.
      if (pkt.isFragment === 1) return VERDICT_PASS;
      return this.icmpToVip(batch, i, buf, off, len, flags, nowMs);
    }
    if (pkt.fragmentOffset !== 0) {
      // A later fragment carries no ports: it follows the first fragment of its datagram, keyed by
      // what all its fragments name alike (its own ipProtocol may be an IPv6 extension header).
      if (!isVip(snap, pkt.family, pkt.addr)) return VERDICT_PASS;
      const frags = this.fragments;
      // `| 0`: an IPv6 fragment id is a uint32, a heap number from 2^31 on when passed as it is.
      frags.setKey(pkt.fragmentProtocol, pkt.family, pkt.addr, pkt.fragmentId | 0);
      const real = frags.lookup(nowMs);
      // The real must still serve this VIP: its id may have been freed and reused meanwhile. Not
      // the service index, which a reload that reorders services changes under the fragment.
      if (real < 0) return orphanFragmentVerdict(snap, pkt);
      if (real >= snap.realIdLimit || !realServesVip(snap, real, pkt.family, pkt.addr)) return -DropReason.fragmentUnplaceable;
      return this.forward(batch, i, buf, off, len, flags, real, nowMs);
    }
    if (proto !== IPPROTO_TCP && proto !== IPPROTO_UDP) return VERDICT_PASS;
    const svc = findService(snap, pkt.family, proto, pkt.addr, pkt.dstPort);
    if (svc < 0) return VERDICT_PASS;
    const real = this.place(svc, pkt, nowMs);
    if (real < 0) return -snap.svcDropReason[svc]!;
    if (pkt.isFragment === 1) {
      this.fragments.setKey(pkt.fragmentProtocol, pkt.family, pkt.addr, pkt.fragmentId | 0);
      this.fragments.record(real, nowMs);
    }
    return this.forward(batch, i, buf, off, len, flags, real, nowMs);
  }

  /** Sends the parsed frame to `real`: L2 MAC rewrite, or IPIP encapsulation. Returns a verdict. */
  private forward(batch: PacketBatch, i: number, buf: Uint8Array, off: number, len: number, flags: number, real: number, nowMs: number): number {
    const snap = this.snap;
    if (snap.realMacKnown[real] === 0) return -DropReason.neighborUnknown;
    let v: number;
    if (snap.realForwarding[real] === FWD_L2) {
      // L2 DSR: only the Ethernet addresses change; the IP packet goes on untouched.
      const m = real * 6;
      const mac = snap.realMac;
      buf[off] = mac[m]!;
      buf[off + 1] = mac[m + 1]!;
      buf[off + 2] = mac[m + 2]!;
      buf[off + 3] = mac[m + 3]!;
      buf[off + 4] = mac[m + 4]!;
      buf[off + 5] = mac[m + 5]!;
      const lm = this.localMac;
      buf[off + 6] = lm[0]!;
      buf[off + 7] = lm[1]!;
      buf[off + 8] = lm[2]!;
      buf[off + 9] = lm[3]!;
      buf[off + 10] = lm[4]!;
      buf[off + 11] = lm[5]!;
      batch.txOffsets[i] = off;
      batch.txLengths[i] = len;
      v = VERDICT_TX;
    } else {
      v = this.encapsulateTo(batch, i, buf, flags, real, nowMs);
    }
    if (v >= 0) {
      const rc = REAL_BASE + real * REAL_STRIDE;
      this.counters[rc + RealCounter.forwardedPackets]++;
      this.counters[rc + RealCounter.forwardedBytes] += len;
    }
    return v;
  }

  /** L3 DSR: wrap the parsed packet in IPIP / IPv6-in-IPv6 to `real`, minding the MTU. */
  private encapsulateTo(batch: PacketBatch, i: number, buf: Uint8Array, flags: number, real: number, nowMs: number): number {
    const snap = this.snap;
    const pkt = this.pkt;
    const templates = snap.realTunnelTemplates;
    const tpl = real * TUNNEL_TEMPLATE_BYTES;
    const overhead = tunnelOverheadBytes(templates, tpl);
    if (overhead <= 0) return -DropReason.ipipUnsupported;
    // The route's MTU toward the real (a VPN or GRE underlay) when it is below the interface's.
    const routeMtu = snap.realTunnelMtu[real]!;
    const mtu = routeMtu !== 0 && routeMtu < this.mtu ? routeMtu : this.mtu;
    const out = this.encapOut;
    if ((flags & FRAME_GSO) !== 0) return this.segmentAndEncapsulate(batch, buf, flags, real, overhead, mtu, nowMs);
    const fit = mtuCheck(pkt, overhead, mtu);
    if (fit === MTU_SEND_TOO_BIG) {
      this.sendTooBig(batch, buf, overhead, mtu, nowMs);
      return -DropReason.packetTooBig;
    }
    // Complete a partial checksum here: a virtual NIC (veth) hands CHECKSUM_PARTIAL through to the
    // receiver, and a real that decapsulates in user space (dsrlb decap) would see the inner
    // checksum unfinished; outer fragments carry no offload metadata either.
    if (!completeChecksum(buf, pkt, flags)) return -DropReason.badPartialChecksum;
    const id = this.nextFragmentId;
    this.nextFragmentId = (id + 1) | 0;
    const plainFlags = flags & ~FRAME_CSUM_PARTIAL;
    const rc = encapsulate(buf, pkt, batch.headroom, plainFlags, templates, tpl, snap.realMac, real * 6, this.localMac, id & 0xffff, flowLabelOf(pkt, overhead), out);
    if (rc < 0) return rc;
    if (fit === MTU_FITS) {
      batch.txOffsets[i] = out[0]!;
      batch.txLengths[i] = out[1]!;
      return VERDICT_TX;
    }
    const gap = batch.extraVnetHdr ? VNET_HDR_LEN : 0;
    const frag = this.fragOut;
    const n = fragmentOuter(buf, out[0]!, out[1]!, batch.headroom - overhead, plainFlags, mtu, id, batch.extraBuf, this.extraPos, gap, frag);
    if (n < 0) return n;
    // All fragments or none: a datagram missing its tail can never be reassembled.
    if (n - 1 > batch.extraOffsets.length - batch.extraCount) return -DropReason.batchFull;
    batch.txOffsets[i] = frag[1]!;
    batch.txLengths[i] = frag[2]!;
    for (let k = 1; k < n; k++) {
      const o = frag[1 + 2 * k]!;
      const l = frag[2 + 2 * k]!;
      this.pushExtra(batch, o, l);
    }
    return VERDICT_TX;
  }

  /** A GSO super-frame for an IPIP real: cut into MSS-sized segments, each encapsulated. */
  private segmentAndEncapsulate(batch: PacketBatch, buf: Uint8Array, flags: number, real: number, overhead: number, mtu: number, nowMs: number): number {
    const pkt = this.pkt;
    if ((flags & FRAME_HAS_VNET_HDR) === 0) return -DropReason.gsoUnsupported;
    const vnet = pkt.frameOffset - VNET_HDR_LEN;
    let gsoSize = buf[vnet + 4]! | (buf[vnet + 5]! << 8);
    const headerL3Bytes = pkt.payloadOffset - pkt.l3Offset;
    const gsoType = buf[vnet + 1]! & ~VIRTIO_NET_HDR_GSO_ECN;
    const udp = gsoType === VIRTIO_NET_HDR_GSO_UDP_L4;
    if (udp ? pkt.ipProtocol !== IPPROTO_UDP : pkt.ipProtocol !== IPPROTO_TCP) return -DropReason.gsoUnsupported;
    // Each UDP segment is one of the sender's datagrams (a QUIC packet): never cut smaller. Too big
    // for the tunnel, the sender is told when it can go smaller (IPv4 with DF, as QUIC sends;
    // IPv6 above 1280); else (IPv4 without DF, IPv6 at its 1280 floor) each goes as outer
    // fragments, as such a datagram sent alone does.
    let fragmentSegments = false;
    if (udp && headerL3Bytes + gsoSize + overhead > mtu) {
      if ((pkt.family === 4 && pkt.dontFragment !== 0) || (pkt.family === 6 && headerL3Bytes + gsoSize > tooBigMtu(6, overhead, mtu))) {
        this.quoteFirstSegment(buf, headerL3Bytes + gsoSize);
        this.sendTooBig(batch, buf, overhead, mtu, nowMs);
        return -DropReason.packetTooBig;
      }
      fragmentSegments = true;
    } else if (headerL3Bytes + gsoSize + overhead > mtu) {
      // Too big is said only when the client can go below its segments: an IPv6 client is never
      // told less than 1280, so at 1280 (a tunnel MTU under 1320) its segments are cut smaller here.
      if ((pkt.family === 6 || pkt.dontFragment !== 0) && headerL3Bytes + gsoSize > tooBigMtu(pkt.family, overhead, mtu)) {
        this.quoteFirstSegment(buf, headerL3Bytes + gsoSize);
        this.sendTooBig(batch, buf, overhead, mtu, nowMs);
        return -DropReason.packetTooBig;
      }
      // DF clear: the path may cut these packets anyway. Smaller TCP segments that fit with the
      // outer header carry the same bytes without fragments (and without an ICMP the client
      // would not act on).
      gsoSize = mtu - overhead - headerL3Bytes;
      if (gsoSize < 8) return -DropReason.packetTooBig;
    }
    const gap = batch.extraVnetHdr ? VNET_HDR_LEN : 0;
    const scratch = batch.extraBuf;
    const segOut = this.segOut;
    const n = segmentGso(buf, pkt, gsoSize, scratch, this.extraPos, EXTRA_HEADROOM, this.seg, segOut);
    if (n < 0) return n;
    // All segments or none: they must all fit the batch's extra slots, and a failure half-way takes
    // back the ones already queued, and their bytes (pushExtra moved extraPos past them) for the
    // next frame to reuse.
    if (n > batch.extraOffsets.length - batch.extraCount) return -DropReason.batchFull;
    const queuedBefore = batch.extraCount;
    const posBefore = this.extraPos;
    const snap = this.snap;
    const tpl = real * TUNNEL_TEMPLATE_BYTES;
    const out = this.encapOut;
    const frag = this.fragOut;
    const label = flowLabelOf(pkt, overhead);
    // Outer fragments of the segments go after the last segment.
    let fragPos = segOut[2 * (n - 1)]! + segOut[2 * (n - 1) + 1]!;
    for (let k = 0; k < n; k++) {
      const start = segOut[2 * k]!;
      const length = segOut[2 * k + 1]!;
      const id = this.nextFragmentId;
      this.nextFragmentId = (id + 1) | 0;
      let rc = parseFrame(scratch, start, length, this.seg) === 0 ? 0 : -DropReason.gsoUnsupported;
      if (rc === 0) rc = encapsulate(scratch, this.seg, EXTRA_HEADROOM, 0, snap.realTunnelTemplates, tpl, snap.realMac, real * 6, this.localMac, id & 0xffff, label, out);
      // The frames to queue, as fragmentOuter lists them: [count, offset, length, ...].
      let pieces = 1;
      if (rc >= 0) {
        for (let g = 1; g <= gap; g++) scratch[out[0]! - g] = 0;
        frag[1] = out[0]!;
        frag[2] = out[1]!;
      }
      if (rc >= 0 && fragmentSegments) {
        // The bytes before this frame, down to the end of the one before it, are its headroom.
        const slotStart = k === 0 ? this.extraPos : segOut[2 * (k - 1)]! + segOut[2 * (k - 1) + 1]!;
        pieces = fragmentOuter(scratch, out[0]!, out[1]!, out[0]! - slotStart - gap, gap > 0 ? FRAME_HAS_VNET_HDR : 0, mtu, id, scratch, fragPos, gap, frag);
        if (pieces < 0) rc = pieces;
        else if (pieces > batch.extraOffsets.length - batch.extraCount) rc = -DropReason.batchFull;
      }
      if (rc < 0) {
        batch.extraCount = queuedBefore;
        this.extraPos = posBefore;
        return rc;
      }
      for (let f = 0; f < pieces; f++) this.pushExtra(batch, frag[1 + 2 * f]!, frag[2 + 2 * f]!);
      if (pieces > 1) fragPos = frag[1 + 2 * (pieces - 1)]! + frag[2 + 2 * (pieces - 1)]!;
    }
    this.counters[Counter.gsoSegmented]++;
    this.extraPos = fragPos;
    return VERDICT_CONSUMED;
  }

  /** ICMP fragmentation-needed / ICMPv6 packet-too-big back to the client, rate-limited. */
  private sendTooBig(batch: PacketBatch, buf: Uint8Array, overhead: number, linkMtu: number, nowMs: number): void {
    const pkt = this.pkt;
    // Never about a non-initial fragment (RFC 1122 3.2.2): it quotes no ports. IPv6 may (RFC 4443).
    if (pkt.family === 4 && pkt.fragmentOffset !== 0) return;
    // Never about an ICMP error (RFC 1122 3.2.2, RFC 4443 2.4 e.1): a too-big one forwarded to an IPIP real.
    if (isIcmpError(pkt)) return;
    // Never to a source that is no single host (broadcast, multicast, unspecified).
    if (!isSingleHostSource(buf, pkt.family, pkt.l3Offset)) return;
    const gap = batch.extraVnetHdr ? VNET_HDR_LEN : 0;
    const pos = this.extraPos + gap;
    const scratch = batch.extraBuf;
    if (pos + 1400 > scratch.length || batch.extraCount >= batch.extraOffsets.length) return;
    if (!this.tooBig.allow(nowMs, pkt.family, pkt.addr)) return;
    const mtu = tooBigMtu(pkt.family, overhead, linkMtu);
    const len = pkt.family === 4 ? buildFragNeeded(buf, pkt, mtu, this.localMac, scratch, pos) : buildPacketTooBig(buf, pkt, mtu, this.localMac, scratch, pos);
    if (len <= 0) return;
    for (let g = 1; g <= gap; g++) scratch[pos - g] = 0;
    this.pushExtra(batch, pos, len);
    this.counters[Counter.icmpTooBigSent]++;
  }

  /**
   * A GSO super-frame about to be answered with too-big (and dropped): its IP length made its
   * first segment's, so the error quotes a packet the client sent, not the merged one (7,292
   * bytes for five segments, which Linux takes but a stricter stack may not match).
   */
  private quoteFirstSegment(buf: Uint8Array, segmentL3Bytes: number): void {
    const pkt = this.pkt;
    const l3 = pkt.l3Offset;
    const l3Bytes = Math.min(segmentL3Bytes, pkt.l3End - l3);
    // The quote ends with the segment too (the frame is dropped after: nothing else reads l3End).
    pkt.l3End = l3 + l3Bytes;
    if (pkt.family === 4) {
      buf[l3 + 2] = l3Bytes >> 8;
      buf[l3 + 3] = l3Bytes & 0xff;
      const sum = ipv4HeaderChecksum(buf, l3, (buf[l3]! & 0x0f) * 4);
      buf[l3 + 10] = sum >> 8;
      buf[l3 + 11] = sum & 0xff;
    } else {
      const payload = l3Bytes - 40;
      buf[l3 + 4] = payload >> 8;
      buf[l3 + 5] = payload & 0xff;
    }
  }

  private pushExtra(batch: PacketBatch, offset: number, length: number): void {
    if (batch.extraCount >= batch.extraOffsets.length) return;
    batch.extraOffsets[batch.extraCount] = offset;
    batch.extraLengths[batch.extraCount] = length;
    batch.extraCount++;
    this.extraPos = offset + length;
  }

  /**
   * ICMP to a VIP: echo requests are answered here; errors about a reply a real sent from the VIP
   * (too big, unreachable, time exceeded: isErrorAboutFlow) go to the real that owns the quoted
   * flow; anything else is dropped and counted.
   */
  private icmpToVip(batch: PacketBatch, i: number, buf: Uint8Array, off: number, len: number, flags: number, nowMs: number): number {
    const pkt = this.pkt;
    const type = pkt.icmpType;
    const v4 = pkt.family === 4;
    if ((v4 && type === ICMP_ECHO_REQUEST) || (!v4 && type === ICMPV6_ECHO_REQUEST)) {
      // The reply's checksum is updated from the request's, which must be whole: a partial one
      // (an ICMPv6 sender offloading it) holds the pseudo-header sum, not a checksum.
      if (!completeChecksum(buf, pkt, flags)) return -DropReason.badPartialChecksum;
      const replyLength = buildEchoReply(buf, pkt);
      if (replyLength < 0) return replyLength;
      batch.txOffsets[i] = off;
      batch.txLengths[i] = replyLength;
      this.counters[Counter.icmpEchoReplied]++;
      return VERDICT_TX;
    }
    // Neighbour discovery (RFC 4861 types 133-137): a router's unicast NUD probe of an IPv6 VIP is
    // the kernel's to answer (it holds the VIP), or the router's entry fails and the VIP goes dark.
    if (!v4 && type >= ICMPV6_ND_FIRST && type <= ICMPV6_ND_LAST) return VERDICT_PASS;
    const flows = this.flows;
    const key = flows.key;
    // Anything but an error about a flow (isErrorAboutFlow) comes back as -icmpToVip.
    const rc = parseEmbeddedFlow(buf, pkt, key);
    if (rc < 0) return rc;
    const a = this.icmpAddr;
    a[4] = key[5]!;
    a[5] = key[6]!;
    a[6] = key[7]!;
    a[7] = key[8]!;
    const protocol = key[0]! & 0xff;
    const dstPort = key[9]! & 0xffff;
    const snap = this.snap;
    const svc = findService(snap, pkt.family, protocol, a, dstPort);
    if (svc < 0) return -DropReason.icmpToVip;
    const entry = flows.lookup(flows.indexHash(), nowMs);
    let real = entry >= 0 ? flows.realOf(entry) : -1;
    // As place() checks: the entry's real may have been freed and its id given to another service's.
    if (real < 0 || !this.keepsEntry(real, svc)) real = midStreamPick(snap, svc, this.placementHash(svc));
    if (real < 0) return -snap.svcDropReason[svc]!;
    return this.forward(batch, i, buf, off, len, flags, real, nowMs);
  }

  /** Fill the flow table's scratch key from the parsed packet. */
  private keyFromPacket(pkt: ParsedPacket): void {
    const k = this.flows.key;
    const a = pkt.addr;
    k[0] = pkt.ipProtocol | (pkt.family << 8);
    k[1] = a[0]!;
    k[2] = a[1]!;
    k[3] = a[2]!;
    k[4] = a[3]!;
    k[5] = a[4]!;
    k[6] = a[5]!;
    k[7] = a[6]!;
    k[8] = a[7]!;
    k[9] = ((pkt.srcPort << 16) | pkt.dstPort) >>> 0;
  }

  /**
   * The placement hash of the scratch key for service svc (int32), which every LB with the same
   * config computes alike (client-persistence.ts). Not needed for a flow-table hit, which goes by
   * the table's own bucket hash.
   */
  private placementHash(svc: number): number {
    return placementHash(this.snap, svc, this.flows.key, this.clientKey, this.hashSeed);
  }

  /**
   * The real for this packet of service svc, creating or updating its flow entry; -1 if none.
   * Sets lastPlacement. Also used by explain (with a synthetic packet) through placeForExplain.
   */
  private place(svc: number, pkt: ParsedPacket, nowMs: number): number {
    const flows = this.flows;
    this.keyFromPacket(pkt);
    const bucketHash = flows.indexHash();
    const entry = flows.lookup(bucketHash, nowMs);
    if (entry < 0) return this.placeNew(svc, pkt, bucketHash, nowMs);
    // An existing entry whose real keeps it: the common case, kept small, for everything V8 inlines
    // into the packet path counts against one budget (inlining-budget.ts); the rare cases live in
    // placeNew and placeExisting.
    const snap = this.snap;
    const current = flows.realOf(entry);
    const flags = pkt.tcpFlags;
    // A new SYN on a closing entry is a new connection on a reused port: scheduled afresh.
    const reused = pkt.ipProtocol === IPPROTO_TCP && (flags & (TCP_SYN | TCP_ACK | TCP_RST)) === TCP_SYN && flows.isReusable(entry);
    if (!reused && current < snap.realIdLimit && snap.realKeepExisting[current] === 1 && snap.realService[current] === svc) {
      flows.touch(entry, flags, nowMs);
      this.lastPlacement = Placement.flowTable;
      return current;
    }
    return this.placeExisting(svc, entry, current, reused, flags, nowMs);
  }

  /**
   * placeNew() for a service with one-packet scheduling: a datagram goes where one without an
   * entry goes (midStreamPick: where every LB, and this one before, sent its 5-tuple) and makes no
   * entry, so a table of millions of one-query DNS flows never fills. Such a service has no entry
   * to find (forgetOpsEntries), so explain and ICMP errors go by the same hash.
   */
  private placeOnePacket(svc: number): number {
    this.lastPlacement = Placement.scheduled;
    return midStreamPick(this.snap, svc, this.placementHash(svc));
  }

  /** place() for an entry on a reused port, or whose real may not keep it. */
  private placeExisting(svc: number, entry: number, current: number, reused: boolean, flags: number, nowMs: number): number {
    const snap = this.snap;
    const flows = this.flows;
    if (reused) {
      const real = this.schedule(svc, this.placementHash(svc));
      if (real < 0) return -1;
      if (real !== current) flows.setReal(entry, real);
      flows.touch(entry, flags, nowMs);
      this.counters[REAL_BASE + real * REAL_STRIDE + RealCounter.flowsCreated]++;
      this.lastPlacement = Placement.scheduled;
      return real;
    }
    // The entry of another service that takes this packet too (the VIP's port-0 service, before a
    // reload added one on this exact port): the connection keeps its real, as IPVS looks up
    // connections before services; new connections go to the new service.
    if (this.keepsEntry(current, svc)) {
      flows.touch(entry, flags, nowMs);
      this.lastPlacement = Placement.flowTable;
      return current;
    }
    // Its real was disabled, failed or removed: the connection is broken anyway; move it. The new
    // real never saw the connection (it answers with a reset): a TCP entry starts again in syn, as
    // one placed mid-stream does, so that it is not counted active on its new real for the
    // established timeout; a second packet makes it established again.
    const real = this.consistentPick(svc, this.placementHash(svc));
    if (real < 0) return -1;
    flows.setReal(entry, real);
    if (flows.stateOf(entry) === FlowState.udp) flows.touch(entry, flags, nowMs);
    else flows.restart(entry, (flags & TCP_RST) !== 0 ? FlowState.closed : (flags & TCP_FIN) !== 0 ? FlowState.fin : FlowState.syn, nowMs);
    this.counters[Counter.flowsRescheduled]++;
    if (current < snap.realIdLimit) this.counters[REAL_BASE + current * REAL_STRIDE + RealCounter.flowsRescheduledAway]++;
    this.lastPlacement = Placement.rescheduled;
    return real;
  }

  /**
   * place() for a packet without an entry: schedule (or consistent-hash) it, and create the entry.
   * `bucketHash` is the flow table's indexHash() of the key.
   */
  private placeNew(svc: number, pkt: ParsedPacket, bucketHash: number, nowMs: number): number {
    // One-packet scheduling: never an entry (setSnapshot removes those made before it was on).
    // Checked here, after a lookup that misses, not before it: a test in place() cost the hit path
    // of every service (TCP ACKs 267 -> 358 ns a packet in memory).
    if (this.snap.svcOps[svc] === 1) return this.placeOnePacket(svc);
    const hash = this.placementHash(svc);
    const isTcp = pkt.ipProtocol === IPPROTO_TCP;
    const flags = pkt.tcpFlags;
    const opensConnection = isTcp ? (flags & (TCP_SYN | TCP_ACK | TCP_RST)) === TCP_SYN : true;
    let real: number;
    if (!this.mayBeMidStream(svc, isTcp, opensConnection)) {
      real = this.schedule(svc, hash);
      this.lastPlacement = Placement.scheduled;
    } else {
      // Mid-stream without entry (LB restart, or the flow came from another LB): the consistent
      // hash puts it where every LB with the same config put it, unproven reals included.
      real = midStreamPick(this.snap, svc, hash);
      this.lastPlacement = isTcp ? Placement.consistentHash : Placement.scheduled;
    }
    if (real < 0) return -1;
    if (isTcp && (flags & TCP_RST) !== 0) return real; // never create state for a reset
    // Mid-stream, one packet proves little: the entry starts in syn (its short timeout, counted
    // inactive) and a second packet of the connection makes it established, so stray or spoofed
    // ACKs cannot fill the table with 900 s entries or load wlc's active counts. A FIN starts it in fin.
    const state = isTcp ? (opensConnection || (flags & TCP_FIN) === 0 ? FlowState.syn : FlowState.fin) : FlowState.udp;
    this.flows.insert(bucketHash, real, state, nowMs);
    this.counters[REAL_BASE + real * REAL_STRIDE + RealCounter.flowsCreated]++;
    return real;
  }

  /**
   * Whether a packet without an entry may belong to a flow placed before (by another LB, or before a
   * restart), so that it goes by midStreamPick: TCP that is not a SYN, and a UDP datagram, which
   * nothing tells from a new flow (QUIC, a VPN; for a new flow the two picks differ only while a
   * wanted real is unproven). Not under wlc for UDP: its picks are this LB's own.
   */
  private mayBeMidStream(svc: number, isTcp: boolean, opensConnection: boolean): boolean {
    return isTcp ? !opensConnection : this.snap.svcScheduler[svc] !== SCHED_WLC;
  }

  /** The scheduler's pick for a new flow of service svc. */
  private schedule(svc: number, hash: number): number {
    const snap = this.snap;
    if (snap.svcDropAll[svc] === 1) return -1;
    const sched = snap.svcScheduler[svc];
    if (sched === SCHED_WLC) {
      return leastConnectionsPick(snap.candIds, snap.candWeights, snap.svcCandStart[svc]!, snap.svcCandCount[svc]!, this.flows.activeByReal, this.flows.inactiveByReal);
    }
    return this.consistentPick(svc, hash);
  }

  /**
   * Whether a flow entry on real id `real` keeps it for a packet service `svc` matched (the flow
   * table's scratch key holds the packet's): the real keeps existing flows and is `svc`'s, or
   * another service's that takes the packet too (realServesKey). place() tests the common case
   * inline; an id past the snapshot's (a real forgotten) keeps nothing.
   */
  private keepsEntry(real: number, svc: number): boolean {
    const snap = this.snap;
    if (real >= snap.realIdLimit || snap.realKeepExisting[real] !== 1) return false;
    return snap.realService[real] === svc || realServesKey(snap, real, this.flows.key);
  }

  private consistentPick(svc: number, hash: number): number {
    return consistentPick(this.snap, svc, hash);
  }

  /**
   * Explain (control plane, via the loop's thread): where a new connection described by `pkt`
   * (a SYN, or any UDP datagram) would go, without creating or changing state, following place():
   * a live entry whose real keeps it is a hit, a fin/closed entry is a reused port and scheduled
   * afresh, an entry whose real may not keep flows is rescheduled by the consistent hash.
   * Returns the real id, -1 (no real) or -2 (no service); sets lastPlacement, and explainSlot
   * (the Maglev slot of a hash pick, else -1), explainFlowState (the entry's, else 0) and
   * explainEntryReal (a reused entry's real, else -1).
   */
  explain(pkt: ParsedPacket, nowMs: number): number {
    const snap = this.snap;
    this.explainSlot = -1;
    this.explainFlowState = 0;
    this.explainEntryReal = -1;
    const svc = findService(snap, pkt.family, pkt.ipProtocol, pkt.addr, pkt.dstPort);
    if (svc < 0) return -2;
    this.keyFromPacket(pkt);
    const hash = this.placementHash(svc);
    const entry = this.flows.lookup(this.flows.indexHash(), nowMs);
    const slot = snap.svcScheduler[svc] === SCHED_RENDEZVOUS || snap.svcDropAll[svc] === 1 ? -1 : (hash >>> 0) % snap.svcTableSize[svc]!;
    if (entry >= 0) {
      this.explainFlowState = this.flows.stateOf(entry);
      const current = this.flows.realOf(entry);
      const reused = pkt.ipProtocol === IPPROTO_TCP && this.flows.isReusable(entry);
      if (!reused && this.keepsEntry(current, svc)) {
        this.lastPlacement = Placement.flowTable;
        return current;
      }
      if (!reused) {
        this.lastPlacement = Placement.rescheduled;
        this.explainSlot = slot;
        return this.consistentPick(svc, hash);
      }
      // Where a packet of the closing connection goes, as placeExisting sends it: its real while
      // that real keeps flows, else the consistent hash's pick (a disabled or dead real's).
      this.explainEntryReal = this.keepsEntry(current, svc) ? current : this.consistentPick(svc, hash);
    }
    this.lastPlacement = Placement.scheduled;
    if (snap.svcScheduler[svc] !== SCHED_WLC) this.explainSlot = slot;
    // As placeNew for a new connection (a SYN, or any UDP datagram).
    return this.mayBeMidStream(svc, pkt.ipProtocol === IPPROTO_TCP, true) ? midStreamPick(snap, svc, hash) : this.schedule(svc, hash);
  }
}

/**
 * A later fragment to a VIP with no record of its first fragment: passed to the kernel (whose
 * nftables table drops IP to a VIP) when no service of the VIP serves its protocol, for then its
 * first fragment was passed too (no service, or not TCP/UDP); counted as fragmentUnplaceable only
 * when a service might have taken the first (lost, late, or its record replaced). An IPv6
 * Fragment header naming an extension header the parser walks (destination options, AH, ...)
 * hides the upper layer: unplaceable. A scan of the services, on this rare path only.
 */
function orphanFragmentVerdict(snap: ForwardingSnapshot, pkt: ParsedPacket): number {
  const protocol = pkt.fragmentProtocol;
  const family = pkt.family;
  // Hop-by-hop, routing, fragment, AH, destination options: as packet-parser.ts walks them.
  if (family === 6 && (protocol === 0 || protocol === 43 || protocol === 44 || protocol === 51 || protocol === 60)) return -DropReason.fragmentUnplaceable;
  const a = pkt.addr;
  const vip = snap.svcVip;
  for (let svc = 0; svc < snap.serviceCount; svc++) {
    const v = svc * 4;
    if (snap.svcProtocol[svc] === protocol && snap.svcFamily[svc] === family && vip[v] === a[4] && vip[v + 1] === a[5] && vip[v + 2] === a[6] && vip[v + 3] === a[7]) {
      return -DropReason.fragmentUnplaceable;
    }
  }
  return VERDICT_PASS;
}

/**
 * The outer flow label for the parsed inner packet: one per flow (see tunnelFlowLabel) under an
 * IPv6 outer header (`overhead` 40), none to compute under an IPv4 one.
 */
function flowLabelOf(pkt: ParsedPacket, overhead: number): number {
  if (overhead !== IPV6_OUTER_HEADER_BYTES) return 0;
  // Fragments by the protocol every fragment of the datagram names (the first one's ipProtocol is
  // the upper layer's, a later one's may be an IPv6 extension header): one label per datagram.
  if (pkt.isFragment !== 0) return tunnelFlowLabel(pkt.addr, pkt.fragmentProtocol, 0);
  return tunnelFlowLabel(pkt.addr, pkt.ipProtocol, (pkt.srcPort << 16) | pkt.dstPort);
}
