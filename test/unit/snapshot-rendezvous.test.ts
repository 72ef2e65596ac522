// A rendezvous service carries no Maglev table: its picks score the candidates (consistent-pick.ts),
// so the builder gives it the shared empty NO_TABLE (size 0) instead of megabytes it never reads,
// while its picks stay rendezvousPick's and maglev/wlc services keep their tables across reloads.

import { describe, expect, it } from 'vitest';
import type { ServiceConfig } from '../../src/config/types.js';
import { formatProblems, parseConfigText } from '../../src/config/validate.js';
import { SnapshotBuilder, type RealView, type ServiceView } from '../../src/control/snapshot-builder.js';
import { consistentPick, midStreamPick } from '../../src/dataplane/consistent-pick.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { stringHash } from '../../src/dataplane/flow-hash.js';
import { NO_TABLE, type ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import { buildMaglevTable, countMovedSlots } from '../../src/dataplane/maglev-table.js';
import { rendezvousPick } from '../../src/dataplane/rendezvous.js';

const SEED = 7;
const MAC = Uint8Array.of(2, 0, 0, 0, 0, 9);

/** One service per line of `lines` (flow-style YAML), parsed as the daemon parses its config. */
function configs(lines: readonly string[]): ServiceConfig[] {
  const parsed = parseConfigText(`interface: eth0\nservices:\n${lines.map((l) => `  - ${l}`).join('\n')}\n`);
  if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
  return [...parsed.config.services];
}

function service(name: string, vip: string, scheduler: string, addresses: readonly string[], tableSize = ''): string {
  const reals = addresses.map((a) => `{ address: ${a} }`).join(', ');
  return `{ name: ${name}, vip: ${vip}, port: 80, protocol: tcp, scheduler: ${scheduler}${tableSize === '' ? '' : `, tableSize: ${tableSize}`}, reals: [${reals}] }`;
}

/** Views with stable ids per address (as RealRegistry gives), weights and health by address. */
function viewsOf(cfgs: readonly ServiceConfig[], opts: { weight?: (a: string) => number; unknown?: readonly string[] } = {}): ServiceView[] {
  return cfgs.map((config) => ({
    config,
    reals: config.reals.map((r) => ({
      id: idOf(r.address),
      address: r.address,
      weight: opts.weight?.(r.address) ?? r.weight,
      intent: r.state,
      forwarding: r.forwarding,
      health: opts.unknown?.includes(r.address) === true ? 'unknown' : 'up',
      removed: false,
      mac: MAC,
    })),
  }));
}

/** Ids by address, handed out as first seen (test order is not address order): what RealRegistry does. */
const ID_OF = new Map<string, number>(['10.0.2.14', '10.0.1.15', '10.0.1.14', '10.0.2.13'].map((a, i) => [a, i]));

function idOf(address: string): number {
  let id = ID_OF.get(address);
  if (id === undefined) {
    id = ID_OF.size;
    ID_OF.set(address, id);
  }
  return id;
}

/** rendezvousPick over `reals` laid out as every LB lists them (by address), independent of the builder. */
function expectedRendezvous(hash: number, reals: readonly RealView[]): number {
  const sorted = [...reals].sort((a, b) => (a.address < b.address ? -1 : a.address > b.address ? 1 : 0));
  const ids = Int32Array.from(sorted, (r) => r.id);
  const seeds = Uint32Array.from(sorted, (r) => stringHash(r.address, SEED));
  const weights = Float64Array.from(sorted, (r) => r.weight);
  return rendezvousPick(hash, ids, seeds, weights, 0, sorted.length);
}

function maglevOf(reals: readonly RealView[], tableSize: number): Int32Array {
  return buildMaglevTable(reals.map((r) => ({ id: r.id, key: r.address, weight: r.weight })), tableSize, SEED);
}

function hashes(count: number): Uint32Array {
  const out = new Uint32Array(count);
  let s = 0x9e3779b9;
  for (let i = 0; i < count; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = s >>> 0;
  }
  return out;
}

/** Bytes of every distinct SharedArrayBuffer the snapshot's arrays lie in (a table shared by two fields counts once). */
function sharedBytes(s: ForwardingSnapshot): number {
  const buffers = new Set<ArrayBufferLike>();
  for (const value of Object.values(s)) {
    for (const a of Array.isArray(value) ? value : [value]) if (ArrayBuffer.isView(a)) buffers.add(a.buffer);
  }
  let bytes = 0;
  for (const b of buffers) bytes += b.byteLength;
  return bytes;
}

const WEB = ['10.0.1.11', '10.0.1.12', '10.0.1.13'];
const DNS = ['10.0.2.11', '10.0.2.12', '10.0.2.13', '10.0.2.14'];
const API = ['10.0.3.11', '10.0.3.12'];

describe('snapshot: rendezvous services carry no Maglev table', () => {
  it('gives a rendezvous service the shared empty table (size 0, no bytes) for new and mid-stream picks, and maglev and wlc their tables', () => {
    const cfgs = configs([service('web', '203.0.113.10', 'maglev', WEB, '251'), service('dns', '203.0.113.11', 'rendezvous', DNS), service('api', '203.0.113.12', 'wlc', API, '257')]);
    // One unproven real per service: the mid-stream sets differ from the new-flow ones.
    const views = viewsOf(cfgs, { unknown: [WEB[0]!, DNS[0]!, API[0]!] });
    const { snapshot, services } = new SnapshotBuilder().build(views, SEED, MAX_REAL_IDS);

    for (const table of [snapshot.svcTables[1]!, snapshot.svcMidTables[1]!]) {
      expect(table).toBe(NO_TABLE);
      expect(table.length).toBe(0);
      expect(table.buffer).toBeInstanceOf(SharedArrayBuffer);
      expect(table.buffer.byteLength).toBe(0);
    }
    expect(snapshot.svcTableSize[1]).toBe(0);
    expect(services[1]).toMatchObject({ name: 'dns', tableSize: 0, movedSlots: 0, candidates: views[1]!.reals.slice(1).map((r) => r.id) });

    const up = (i: number) => views[i]!.reals.filter((r) => r.health === 'up');
    expect(Array.from(snapshot.svcTables[0]!)).toEqual(Array.from(maglevOf(up(0), 251)));
    expect(Array.from(snapshot.svcMidTables[0]!)).toEqual(Array.from(maglevOf(views[0]!.reals, 251)));
    expect(Array.from(snapshot.svcTables[2]!)).toEqual(Array.from(maglevOf(up(2), 257)));
    expect(Array.from(snapshot.svcMidTables[2]!)).toEqual(Array.from(maglevOf(views[2]!.reals, 257)));
    expect([snapshot.svcTableSize[0], snapshot.svcTableSize[2]]).toEqual([251, 257]);
    expect([services[0]!.tableSize, services[2]!.tableSize]).toEqual([251, 257]);
  });

  it("picks a rendezvous service's real exactly as rendezvousPick over its candidates by address: new flows and mid-stream, uint32 and int32 hashes", () => {
    const cfgs = configs([service('web', '203.0.113.10', 'maglev', WEB), service('dns', '203.0.113.11', 'rendezvous', DNS)]);
    const weights: Record<string, number> = { '10.0.2.11': 100, '10.0.2.12': 50, '10.0.2.13': 200, '10.0.2.14': 100 };
    const views = viewsOf(cfgs, { weight: (a) => weights[a] ?? 100, unknown: [DNS[2]!] });
    const { snapshot } = new SnapshotBuilder().build(views, SEED, MAX_REAL_IDS);
    const all = views[1]!.reals;
    const proven = all.filter((r) => r.health === 'up');
    // The service's candidates do not start at 0 (web's come first): the ranges are honoured.
    expect(snapshot.svcCandStart[1]).toBe(3);
    const seen = new Set<number>();
    let differing = 0;
    for (const h of hashes(20_000)) {
      const pick = consistentPick(snapshot, 1, h);
      const mid = expectedRendezvous(h, all);
      if (pick !== expectedRendezvous(h, proven) || consistentPick(snapshot, 1, h | 0) !== pick) differing++;
      if (midStreamPick(snapshot, 1, h) !== mid || midStreamPick(snapshot, 1, h | 0) !== mid) differing++;
      seen.add(pick);
    }
    expect(differing).toBe(0);
    expect(seen).toEqual(new Set(proven.map((r) => r.id)));
  });

  it('reloads maglev -> rendezvous -> maglev -> maglev with the right table at each step, the reals changed in between', () => {
    const builder = new SnapshotBuilder();
    const a = ['10.0.1.11', '10.0.1.12', '10.0.1.13'];
    const b = ['10.0.1.11', '10.0.1.12', '10.0.1.13', '10.0.1.14'];
    const c = ['10.0.1.11', '10.0.1.12', '10.0.1.14', '10.0.1.15'];
    const step = (scheduler: string, addresses: readonly string[], unknown: readonly string[] = []) => {
      const views = viewsOf(configs([service('web', '203.0.113.10', scheduler, addresses, scheduler === 'rendezvous' ? '' : '251')]), { unknown });
      return { views, ...builder.build(views, SEED, MAX_REAL_IDS) };
    };

    const first = step('maglev', a);
    expect(Array.from(first.snapshot.svcTables[0]!)).toEqual(Array.from(maglevOf(first.views[0]!.reals, 251)));
    expect(first.services[0]).toMatchObject({ tableSize: 251, movedSlots: 0 });

    const second = step('rendezvous', b);
    expect(second.snapshot.svcTables[0]).toBe(NO_TABLE);
    expect(second.snapshot.svcMidTables[0]).toBe(NO_TABLE);
    expect(second.snapshot.svcTableSize[0]).toBe(0);
    // Its picks read no table, so no Maglev slot moved (nor is one counted against the old table).
    expect(second.services[0]).toMatchObject({ tableSize: 0, movedSlots: 0 });
    expect(hashes(2_000).filter((h) => consistentPick(second.snapshot, 0, h) !== expectedRendezvous(h, second.views[0]!.reals)).length).toBe(0);

    // Back to maglev over other reals, one unproven: both tables built afresh, nothing cached from step one.
    const third = step('maglev', c, ['10.0.1.15']);
    const thirdUp = third.views[0]!.reals.filter((r) => r.health === 'up');
    expect(Array.from(third.snapshot.svcTables[0]!)).toEqual(Array.from(maglevOf(thirdUp, 251)));
    expect(Array.from(third.snapshot.svcMidTables[0]!)).toEqual(Array.from(maglevOf(third.views[0]!.reals, 251)));
    expect(third.snapshot.svcTables[0]).not.toBe(first.snapshot.svcTables[0]);
    // A table after none is a first build, as at a start: no move counted.
    expect(third.services[0]).toMatchObject({ tableSize: 251, movedSlots: 0 });
    expect(hashes(2_000).filter((h) => consistentPick(third.snapshot, 0, h) !== third.snapshot.svcTables[0]![h % 251]).length).toBe(0);

    // maglev -> maglev counts its moved slots against the table before, as always.
    const fourth = step('maglev', a);
    expect(Array.from(fourth.snapshot.svcTables[0]!)).toEqual(Array.from(first.snapshot.svcTables[0]!));
    const moved = countMovedSlots(third.snapshot.svcTables[0]!, fourth.snapshot.svcTables[0]!);
    expect(moved).toBeGreaterThan(0);
    expect(fourth.services[0]!.movedSlots).toBe(moved);
  });

  it('holds 100 rendezvous services at tableSize 65537 in under 64 KiB of shared memory, where 100 maglev services hold 100 tables', () => {
    const lines = (scheduler: string) =>
      Array.from({ length: 100 }, (_, i) => service(`s${i}`, `203.0.113.${i + 1}`, scheduler, [`10.0.${i}.11`, `10.0.${i}.12`, `10.0.${i}.13`]));
    const rendezvous = configs(lines('rendezvous'));
    expect(rendezvous.every((s) => s.tableSize === 65537)).toBe(true);
    const bytes = sharedBytes(new SnapshotBuilder().build(viewsOf(rendezvous), SEED, MAX_REAL_IDS).snapshot);
    expect(bytes).toBeLessThan(64 * 1024);
    const maglevBytes = sharedBytes(new SnapshotBuilder().build(viewsOf(configs(lines('maglev'))), SEED, MAX_REAL_IDS).snapshot);
    expect(maglevBytes - bytes).toBe(100 * 65537 * Int32Array.BYTES_PER_ELEMENT);
  });
});
