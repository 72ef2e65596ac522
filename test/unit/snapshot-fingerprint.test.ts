// dsrlb_table_fingerprint: LBs that would pick differently for the same flow must show different
// fingerprints (DsrlbTableFingerprintMismatch), LBs that pick alike the same one.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { SnapshotBuilder, type ServiceView } from '../../src/control/snapshot-builder.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';

function fingerprint(scheduler: string, firstId = 0, address = { vip: '203.0.113.10', port: 80, protocol: 'tcp' }, extra = ''): string {
  const parsed = parseConfigText(`interface: eth0
services:
  - { name: web, vip: ${address.vip}, port: ${address.port}, protocol: ${address.protocol}, scheduler: ${scheduler}${extra}, reals: [{ address: 10.0.1.11 }, { address: 10.0.1.12 }, { address: 10.0.1.13 }, { address: 10.0.1.14 }] }
`);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  const s = parsed.config.services[0]!;
  const view: ServiceView = {
    config: s,
    reals: s.reals.map((r, i) => ({ id: firstId + i, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: new Uint8Array(6) })),
  };
  return new SnapshotBuilder().build([view], 0, MAX_REAL_IDS).services[0]!.tableFingerprint;
}

/** A rendezvous service's fingerprint over reals .11-.14 with weights and health as given. */
function rendezvousPrint(opts: { hashSeed?: number; tableSize?: number; weightOf12?: number; down12?: boolean; scale?: number } = {}): string {
  const parsed = parseConfigText(`interface: eth0
services:
  - { name: dns, vip: 203.0.113.11, port: 53, protocol: udp, scheduler: rendezvous, reals: [{ address: 10.0.2.11 }, { address: 10.0.2.12 }, { address: 10.0.2.13 }, { address: 10.0.2.14 }] }
`);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  const s = parsed.config.services[0]!;
  const view: ServiceView = {
    config: opts.tableSize === undefined ? s : { ...s, tableSize: opts.tableSize },
    reals: s.reals.map((r, i) => {
      const is12 = r.address === '10.0.2.12';
      const weight = (is12 ? (opts.weightOf12 ?? r.weight) : r.weight) * (opts.scale ?? 1);
      return { id: i, address: r.address, weight, intent: r.state, forwarding: r.forwarding, health: is12 && opts.down12 === true ? 'down' : 'up', removed: false, mac: new Uint8Array(6) };
    }),
  };
  return new SnapshotBuilder().build([view], opts.hashSeed ?? 0, MAX_REAL_IDS).services[0]!.tableFingerprint;
}

describe('table fingerprint', () => {
  it('differs with client persistence and its prefix (the same table, indexed by another hash), for maglev and rendezvous', () => {
    const at = { vip: '203.0.113.10', port: 80, protocol: 'tcp' };
    for (const s of ['maglev', 'rendezvous']) {
      const none = fingerprint(s, 0, at);
      const client = fingerprint(s, 0, at, ', persistence: client');
      const slash24 = fingerprint(s, 0, at, ', persistence: client, persistencePrefix: 24');
      expect(new Set([none, client, slash24]).size, s).toBe(3);
      // Without persistence, as before it existed; with it, alike on every LB.
      expect(fingerprint(s, 0, at, ', persistence: none')).toBe(none);
      expect(fingerprint(s, 40, at, ', persistence: client, persistencePrefix: 24')).toBe(slash24);
    }
  });

  it('differs between schedulers over the same reals, and not with the LB-local real ids', () => {
    expect(fingerprint('maglev')).not.toBe(fingerprint('rendezvous'));
    expect(fingerprint('maglev')).not.toBe(fingerprint('wlc'));
    expect(fingerprint('rendezvous')).not.toBe(fingerprint('wlc'));
    for (const s of ['maglev', 'rendezvous', 'wlc']) expect(fingerprint(s, 40), s).toBe(fingerprint(s, 0));
  });

  it('differs when the LBs disagree on the service\'s address (a port typo on one LB drops the flows sent there)', () => {
    const base = fingerprint('maglev');
    expect(fingerprint('maglev', 0, { vip: '203.0.113.10', port: 8080, protocol: 'tcp' })).not.toBe(base);
    expect(fingerprint('maglev', 0, { vip: '203.0.113.99', port: 80, protocol: 'tcp' })).not.toBe(base);
    expect(fingerprint('maglev', 0, { vip: '203.0.113.10', port: 80, protocol: 'udp' })).not.toBe(base);
    expect(fingerprint('maglev', 0, { vip: '203.0.113.10', port: 80, protocol: 'tcp' })).toBe(base);
  });

  it('names a rendezvous service by what its picks read (hash seed, candidates, weights), not by a Maglev table size it has no table of', () => {
    const base = rendezvousPrint();
    expect(base).toMatch(/^[0-9a-f]{8}$/);
    expect(rendezvousPrint({ tableSize: 251 })).toBe(base);
    expect(rendezvousPrint({ hashSeed: 7 })).not.toBe(base);
    expect(rendezvousPrint({ weightOf12: 50 })).not.toBe(base);
    // Every weight times three picks alike (scores scale with weights): one fingerprint.
    expect(rendezvousPrint({ scale: 3 })).toBe(base);
    expect(rendezvousPrint({ weightOf12: 50, scale: 3 })).toBe(rendezvousPrint({ weightOf12: 50 }));
    expect(rendezvousPrint({ down12: true })).not.toBe(base);
    expect(rendezvousPrint()).toBe(base);
  });
});
