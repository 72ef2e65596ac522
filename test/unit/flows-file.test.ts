// The flows file a clean stop leaves to the next start (flows-file.ts): version 2 carries the reals
// and services a reload removed that still drain, so that the next daemon goes on draining them;
// version 1 files (the daemon an upgrade replaces writes them) are still read; damage is refused
// with a message that says what is wrong.

import { describe, expect, it } from 'vitest';
import { bootId, decodeSavedFlows, downtimeMs, encodeSavedFlows, type SavedFlows } from '../../src/control/flows-file.js';
import type { ServiceConfig } from '../../src/config/types.js';
import { parseConfigText } from '../../src/config/validate.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { FlowState } from '../../src/dataplane/flow-table.js';

function keyOf(id: number): Uint32Array {
  const k = new Uint32Array(FLOW_KEY_WORDS);
  k[0] = 6 | (4 << 8);
  k[1] = (0x0a000000 | id) >>> 0;
  k[5] = 0xcb00710a;
  k[9] = ((40000 + (id & 0xfff)) << 16) | 80;
  return k;
}

/** A removed service as the daemon holds it: validated and normalised from YAML. */
function serviceConfig(): ServiceConfig {
  const r = parseConfigText(
    [
      'interface: eth0',
      'services:',
      '  - name: old-api',
      '    vip: 2001:db8::20',
      '    port: 443',
      '    protocol: tcp',
      '    scheduler: rendezvous',
      '    healthCheck: { type: https, path: /healthz, expectStatus: [200, 204], interval: 3s, rise: 3 }',
      '    reals:',
      '      - address: 2001:db8::21',
      '        forwarding: ipip',
      '        weight: 7',
      '',
    ].join('\n'),
  );
  if (!r.ok) throw new Error(JSON.stringify(r.problems));
  return r.config.services[0]!;
}

const flows: SavedFlows = {
  writtenAtMs: 1_764_000_000_000,
  count: 3,
  keys: Uint32Array.from([...keyOf(1), ...keyOf(0xffffff), ...keyOf(7)]),
  realIndex: Int32Array.from([1, 0, 2]),
  idleMs: Uint32Array.from([5, 4_000_000_000, 12]),
  states: Uint8Array.from([FlowState.established, FlowState.udp, FlowState.fin]),
  reals: [
    { identity: 'tcp|203.0.113.10|80', address: '10.0.0.11' },
    { identity: 'tcp|203.0.113.10|80', address: '10.0.0.12', removed: { forwarding: 'ipip' } },
    { identity: 'tcp|2001:db8::20|443', address: '2001:db8::21', removed: { forwarding: 'l2' } },
  ],
  removedServices: [{ config: serviceConfig(), announced: true }],
};

const plain = (f: SavedFlows) => ({ ...f, keys: [...f.keys], realIndex: [...f.realIndex], idleMs: [...f.idleMs], states: [...f.states] });

/** A version 1 file as the daemon before version 2 wrote it (the writer of that release, kept here). */
function versionOne(f: Pick<SavedFlows, 'writtenAtMs' | 'count' | 'keys' | 'realIndex' | 'idleMs' | 'states' | 'reals'>): Buffer {
  const header = Buffer.from(JSON.stringify({ writtenAtMs: f.writtenAtMs, count: f.count, reals: f.reals }));
  const out = Buffer.alloc(16 + header.length + f.count * (FLOW_KEY_WORDS * 4 + 9));
  let at = out.write('DSRLBFLW', 0, 'latin1');
  at = out.writeUInt32LE(1, at);
  at = out.writeUInt32LE(header.length, at);
  at += header.copy(out, at);
  for (const w of f.keys) at = out.writeUInt32LE(w, at);
  for (const i of f.realIndex) at = out.writeInt32LE(i, at);
  for (const ms of f.idleMs) at = out.writeUInt32LE(ms, at);
  out.set(f.states, at);
  return out;
}

/** `good` with its header JSON replaced (its length field adjusted). */
function withHeader(good: Buffer, edit: (header: Record<string, unknown>) => void): Buffer {
  const length = good.readUInt32LE(12);
  const header = JSON.parse(good.toString('utf8', 16, 16 + length)) as Record<string, unknown>;
  edit(header);
  const text = Buffer.from(JSON.stringify(header));
  const lengthField = Buffer.alloc(4);
  lengthField.writeUInt32LE(text.length);
  return Buffer.concat([good.subarray(0, 12), lengthField, text, good.subarray(16 + length)]);
}

describe('flows file', () => {
  it('writes version 2 and reads back removed reals (with their forwarding) and removed services (whole, with their announcement)', () => {
    const bytes = encodeSavedFlows(flows);
    expect(bytes.readUInt32LE(8)).toBe(2);
    const back = decodeSavedFlows(bytes);
    expect(plain(back)).toEqual(plain(flows));
    // Frozen as the config's own services are: the daemon holds it as one.
    expect(Object.isFrozen(back.removedServices![0]!.config)).toBe(true);
    expect(Object.isFrozen(back.removedServices![0]!.config.healthCheck)).toBe(true);
  });

  it('writes no removedServices when nothing was removed, and reads that as none', () => {
    const { removedServices: _, ...none } = flows;
    const back = decodeSavedFlows(encodeSavedFlows(none));
    expect(back.removedServices).toBeUndefined();
    expect(back.reals).toEqual(flows.reals);
  });

  it('still reads a version 1 file (an upgrade: the old daemon wrote it), as flows with nothing removed', () => {
    const v1 = { ...flows, reals: flows.reals.map(({ identity, address }) => ({ identity, address })) };
    const back = decodeSavedFlows(versionOne(v1));
    const { removedServices: _, ...expected } = v1;
    expect(plain(back)).toEqual(plain(expected));
    // A version 1 header never marks reals removed: a field of that name is not read as such.
    const odd = decodeSavedFlows(versionOne({ ...v1, reals: [...v1.reals.slice(0, 2), { ...v1.reals[2]!, removed: 'yes' } as never] }));
    expect(odd.reals[2]).toEqual({ identity: v1.reals[2]!.identity, address: v1.reals[2]!.address });
  });

  it('measures the downtime on CLOCK_MONOTONIC within one boot (a wall-clock step back made it 0), on the wall clock across a reboot or for an older file', () => {
    const boot = { id: 'b0', monotonicMs: 1_000_000 };
    const back = decodeSavedFlows(encodeSavedFlows({ ...flows, boot }));
    expect(back.boot).toEqual(boot);
    // Written at wall 5,000,000; the clock was stepped back an hour; 30 s passed on the monotonic clock.
    expect(downtimeMs(back, 'b0', 1_030_000, 5_000_000 - 3_600_000)).toBe(30_000);
    // Another boot: the monotonic clock restarted; the wall clock is all there is.
    expect(downtimeMs(back, 'b1', 5_000, back.writtenAtMs + 45_000)).toBe(45_000);
    // A file without it (older, or boot_id unreadable): the wall clock, never negative.
    const { boot: _, ...older } = back;
    expect(downtimeMs(older, 'b0', 1_030_000, older.writtenAtMs - 3_600_000)).toBe(0);
    expect(decodeSavedFlows(encodeSavedFlows(flows)).boot).toBeUndefined();
    expect(bootId()).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('refuses what is not such a file, saying why', () => {
    const good = encodeSavedFlows(flows);
    expect(() => decodeSavedFlows(Buffer.from('{"flows": []}'))).toThrow(/^not a dsrlb flows file of version 1 or 2: no DSRLBFLW mark at its start$/);
    const v3 = Buffer.from(good);
    v3.writeUInt32LE(3, 8);
    expect(() => decodeSavedFlows(v3)).toThrow(/^not a dsrlb flows file of version 1 or 2: it is version 3$/);
    expect(() => decodeSavedFlows(good.subarray(0, good.length - 1))).toThrow(/^not a dsrlb flows file of version 2: \d+ bytes for 3 flows$/);
    expect(() => decodeSavedFlows(encodeSavedFlows({ ...flows, realIndex: Int32Array.from([0, 3, 1]) }))).toThrow(/flow 1 names real 3 of 3/);
    const garbled = Buffer.from(good);
    garbled.write('{{', 16, 'latin1');
    expect(() => decodeSavedFlows(garbled)).toThrow(/its header is not JSON/);
    expect(() => decodeSavedFlows(withHeader(good, (h) => delete h['reals']))).toThrow(/no list of reals/);
    expect(() => decodeSavedFlows(withHeader(good, (h) => ((h['reals'] as object[])[1] = { identity: 'tcp|203.0.113.10|80', address: '10.0.0.12', removed: { forwarding: 'gre' } })))).toThrow(
      /removed real 1 has no forwarding l2 or ipip/,
    );
    expect(() => decodeSavedFlows(withHeader(good, (h) => (h['removedServices'] = { web: 1 })))).toThrow(/no list of removed services/);
    const service = (edit: (s: Record<string, unknown>) => void) =>
      withHeader(good, (h) => {
        const s = (h['removedServices'] as { config: Record<string, unknown> }[])[0]!;
        edit(s.config);
      });
    expect(() => decodeSavedFlows(service((s) => (s['tableSize'] = 1e12)))).toThrow(/removed service 0 is not a service: tableSize$/);
    expect(() => decodeSavedFlows(service((s) => (s['vip'] = '2001:DB8::20')))).toThrow(/removed service 0 is not a service: vip$/);
    expect(() => decodeSavedFlows(service((s) => delete (s['healthCheck'] as Record<string, unknown>)['rise']))).toThrow(/not a service: healthCheck.rise$/);
    expect(() => decodeSavedFlows(service((s) => ((s['reals'] as Record<string, unknown>[])[0]!['weight'] = -1)))).toThrow(/not a service: reals\[0\]$/);
    expect(() => decodeSavedFlows(withHeader(good, (h) => delete (h['removedServices'] as Record<string, unknown>[])[0]!['announced']))).toThrow(/removed service 0 has no announced flag/);
  });
});
