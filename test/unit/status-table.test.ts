// `dsrlb status` as a table: ipvsadm -Ln's columns, the service's name always shown, and why a
// dropping service drops.

import { describe, expect, it } from 'vitest';
import { formatStatus } from '../../src/cli/status-table.js';

const now = Date.parse('2026-11-30T12:00:00Z');
const real = (address: string, health: string, lastError: string | null = null) => ({
  address,
  forwarding: 'l2',
  weight: 100,
  intent: 'active',
  removed: false,
  health: { state: health, since: '2026-11-30T11:59:30Z', lastError },
  activeFlows: 3,
  inactiveFlows: 1,
  pps: 12.4,
  bytesPerSecond: 2048,
});
const service = (name: string, extra: object) => ({ name, protocol: 'tcp', vip: '203.0.113.10', port: 80, scheduler: 'maglev', forwarding: 'l2', panic: false, dropping: false, reals: [real('10.0.1.11', 'up')], ...extra });

describe('status table', () => {
  it('shows each service by address and name, and each real with weight, intent, health and flows', () => {
    const text = formatStatus({ services: [service('web', {})] }, now);
    expect(text.split('\n').map((l) => l.split(/\s{2,}/))).toEqual([
      ['Prot', 'LocalAddress:Port', 'Scheduler', 'Forward', 'Weight', 'Intent', 'Health', 'ActiveConn', 'InActConn', 'Pkt/s', 'Bytes/s'],
      ['TCP', '203.0.113.10:80', 'maglev', 'l2', 'web'],
      ['', '-> 10.0.1.11:80', 'l2', '100', 'active', 'up 30s', '3', '1', '12', '2048'],
    ]);
  });

  it('keeps the name beside PANIC or DROPPING and says after the table why a service drops', () => {
    const text = formatStatus(
      {
        services: [
          service('web', { panic: true, reals: [real('10.0.1.11', 'down', 'connect ECONNREFUSED')] }),
          service('api', { dropping: true, droppingReason: 'no MAC known for 10.0.1.12 (ARP/neighbour discovery unanswered)', reals: [] }),
        ],
      },
      now,
    );
    const lines = text.split('\n');
    expect(lines[1]).toMatch(/ web PANIC\(failOpen\)$/);
    expect(lines[2]).toMatch(/down 30s \(connect ECONNREFUSED\)/);
    expect(lines[3]).toMatch(/ api DROPPING$/);
    expect(lines.at(-1)).toBe('api: dropping: no MAC known for 10.0.1.12 (ARP/neighbour discovery unanswered)');
  });

  it('marks a service removed by a reload whose flows drain, without a dropping note', () => {
    const text = formatStatus({ services: [service('old', { removed: true, dropping: true, droppingReason: 'removed from the config', reals: [real('10.0.1.11', 'up', null)] })] }, now);
    const lines = text.split('\n');
    expect(lines[1]).toMatch(/ old REMOVED\(draining\)$/);
    expect(lines).toHaveLength(3);
  });

  it('says after the table when the packet loops do not run, or were started again after a crash', () => {
    const quiet = formatStatus({ services: [service('web', {})], loop: { healthy: true, restarts: 0 } }, now);
    expect(quiet.split('\n')).toHaveLength(3);
    const restarted = formatStatus({ services: [service('web', {})], loop: { healthy: true, restarts: 1 } }, now).split('\n');
    expect(restarted.at(-1)).toBe("packet loops: started again 1 time after a crash (the daemon's log says why)");
    const down = formatStatus({ services: [service('web', {})], loop: { healthy: false, restarts: 2 } }, now).split('\n');
    expect(down.slice(3)).toEqual([
      "packet loops: NOT HEALTHY (ended or stalled; the daemon's log says why)",
      "packet loops: started again 2 times after a crash (the daemon's log says why)",
    ]);
  });
});
