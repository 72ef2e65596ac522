// explain() follows what the engine does with a new connection: a live entry is a flow-table hit,
// a fin/closed entry (a reused port) is scheduled afresh, and a hash pick names its Maglev slot.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import type { Config } from '../../src/config/types.js';
import { addressWords, parseMac } from '../../src/control/addresses.js';
import { SnapshotBuilder } from '../../src/control/snapshot-builder.js';
import { createCounters, MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { Engine, Placement } from '../../src/dataplane/engine.js';
import { FlowState } from '../../src/dataplane/flow-table.js';
import { ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { MemoryIo } from '../../src/io/memory-io.js';
import { ETH_IPV4, ethernet, ipv4, tcp } from '../support/packet-builder.js';

const LB_MAC = '02:00:00:00:00:01';
const VIP = '10.0.0.100';
const CLIENT = '192.0.2.7';
const SYN = 0x02;
const ACK = 0x10;
const FIN = 0x01;

function setup(scheduler: string) {
  const r = parseConfigText(`interface: eth0
services:
  - { name: web, vip: ${VIP}, port: 80, protocol: tcp, scheduler: ${scheduler}, reals: [{ address: 10.0.0.11 }, { address: 10.0.0.12 }, { address: 10.0.0.13 }] }
`);
  if (!r.ok) throw new Error(JSON.stringify(r.problems));
  const cfg: Config = r.config;
  const engine = new Engine({
    flowCapacity: 1024,
    timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
    maxRealIds: MAX_REAL_IDS,
    counters: createCounters(),
    localMac: parseMac(LB_MAC),
  });
  const views = cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((real, i) => ({ id: i, address: real.address, weight: real.weight, intent: real.state, forwarding: real.forwarding, health: 'up' as const, removed: false, mac: parseMac(`02:00:00:00:01:1${i}`) })),
  }));
  engine.setSnapshot(new SnapshotBuilder().build(views, cfg.hashSeed, MAX_REAL_IDS).snapshot);
  const io = new MemoryIo({ localMac: parseMac(LB_MAC) });
  const now = 1_000_000;
  io.start((b) => engine.processBatch(b, now));
  const send = (sport: number, flags: number) =>
    io.inject([ethernet({ dst: LB_MAC, src: '02:00:00:00:00:0c', type: ETH_IPV4 }, ipv4({ src: CLIENT, dst: VIP, proto: 6, id: 1 }, tcp({ sport, dport: 80, flags, seq: 1, ack: flags & ACK ? 1 : 0 }, [], { src: CLIENT, dst: VIP })))]);
  const explain = (sport: number) => {
    const p = new ParsedPacket();
    p.reset();
    p.family = 4;
    p.ipProtocol = 6;
    p.addr.set(addressWords(CLIENT), 0);
    p.addr.set(addressWords(VIP), 4);
    p.srcPort = sport;
    p.dstPort = 80;
    const real = engine.explain(p, now);
    return { real, placement: engine.lastPlacement, slot: engine.explainSlot, flowState: engine.explainFlowState };
  };
  return { engine, send, explain };
}

describe('engine explain', () => {
  it('names the Maglev slot of a scheduler pick, and the real in that slot is the one a SYN gets', () => {
    const { engine, send, explain } = setup('maglev');
    const e = explain(40000);
    expect(e.placement).toBe(Placement.scheduled);
    expect(e.flowState).toBe(0);
    expect(e.slot).toBeGreaterThanOrEqual(0);
    expect(e.slot).toBeLessThan(engine.snapshot().svcTableSize[0]!);
    expect(engine.snapshot().svcTables[0]![e.slot]).toBe(e.real);
    const [out] = send(40000, SYN);
    expect(out![5]! - 0x10).toBe(e.real);
  });

  it('calls a live entry a flow-table hit, but a fin entry (a SYN would reuse the port) a fresh scheduler pick', () => {
    const { send, explain } = setup('maglev');
    send(40001, SYN);
    send(40001, ACK);
    const hit = explain(40001);
    expect(hit.placement).toBe(Placement.flowTable);
    expect(hit.flowState).toBe(FlowState.established);
    expect(hit.slot).toBe(-1);
    send(40001, FIN | ACK);
    const fresh = explain(40001);
    expect(fresh.flowState).toBe(FlowState.fin);
    expect(fresh.placement).toBe(Placement.scheduled);
    expect(fresh.slot).toBeGreaterThanOrEqual(0);
  });

  it('gives no slot for wlc and rendezvous picks (they have no table)', () => {
    expect(setup('wlc').explain(40002).slot).toBe(-1);
    expect(setup('rendezvous').explain(40002).slot).toBe(-1);
  });
});
