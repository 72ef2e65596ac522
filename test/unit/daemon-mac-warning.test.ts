// A wanted real whose MAC never resolves takes no new flows while status shows it active and up:
// the daemon says so in its log after 10 s, once, and forgets it when the MAC comes. No root, no loop.

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

describe('a real without a MAC', () => {
  it('is logged once after 10 s, with the address asked for, and forgotten when its MAC is known', () => {
    const parsed = parseConfigText(`interface: eth0
stateFile: null
services:
  - { name: web, vip: 10.93.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }, { address: 10.93.0.98 }, { address: 10.93.0.12, state: disabled }] }
`);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    const lines: Record<string, unknown>[] = [];
    const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)));
    daemon.config = parsed.config;
    const macs = new Map<string, Uint8Array>([['10.93.0.11', new Uint8Array([2, 0, 0, 0, 0, 0x11])]]);
    const inner = daemon as unknown as {
      syncReals(): void;
      warnUnresolvedMacs(): void;
      neighbors: { macOf(a: string): Uint8Array | null };
      macMissing: Map<number, { sinceMs: number; warned: boolean }>;
    };
    inner.neighbors = { macOf: (a) => macs.get(a) ?? null };
    inner.syncReals();
    const warnings = () => lines.filter((l) => l['msg'] === 'real has no MAC: it takes no new flows until ARP/neighbour discovery answers');
    inner.warnUnresolvedMacs();
    expect(warnings()).toEqual([]);
    // Only the wanted real without a MAC is waited for (not the disabled one).
    expect(inner.macMissing.size).toBe(1);
    for (const m of inner.macMissing.values()) m.sinceMs -= 10_000;
    inner.warnUnresolvedMacs();
    inner.warnUnresolvedMacs();
    expect(warnings()).toMatchObject([{ level: 'warn', service: 'web', real: '10.93.0.98', next: '10.93.0.98', waitedS: 10 }]);
    macs.set('10.93.0.98', new Uint8Array([2, 0, 0, 0, 0, 0x98]));
    inner.warnUnresolvedMacs();
    expect(inner.macMissing.size).toBe(0);
    daemon.health.stop();
  });
});
