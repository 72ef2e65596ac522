// What dsrlb run checks before it changes anything on the host: the listen addresses can be bound,
// the configured CPUs are ones the process may run on, and no VIP is an interface's own address.

import { createServer, type Server } from 'node:net';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { interfaceAddressesAmong } from '../../src/control/host-setup.js';
import { cpuProblems, listenProblems, parseCpuList } from '../../src/control/start-checks.js';

/** `ip -j addr show` (trimmed) of a host with its own address on eth0, a VIP on lo and an IPv6 /64 and /128. */
const IP_ADDR = JSON.stringify([
  { ifname: 'lo', addr_info: [{ family: 'inet', local: '127.0.0.1', prefixlen: 8 }, { family: 'inet', local: '203.0.113.10', prefixlen: 32 }] },
  {
    ifname: 'eth0',
    addr_info: [
      { family: 'inet', local: '10.99.0.2', prefixlen: 24 },
      { family: 'inet', local: '10.99.0.50', prefixlen: 32 },
      { family: 'inet6', local: '2001:db8::2', prefixlen: 64 },
      { family: 'inet6', local: '2001:db8::100', prefixlen: 128 },
    ],
  },
]);

describe('interfaceAddressesAmong', () => {
  it('finds VIPs that are a subnet address of an interface; host addresses (/32, /128: VIPs placed on purpose) pass', () => {
    const found = interfaceAddressesAmong(IP_ADDR, ['10.99.0.2', '10.99.0.50', '203.0.113.10', '2001:db8::2', '2001:db8::100', '198.51.100.1']);
    expect([...found]).toEqual([
      ['10.99.0.2', 'eth0 (10.99.0.2/24)'],
      ['2001:db8::2', 'eth0 (2001:db8::2/64)'],
    ]);
    expect(interfaceAddressesAmong('', ['10.99.0.2']).size).toBe(0);
  });
});

describe('cpus', () => {
  it('reads a CPU list as /proc/self/status gives it', () => {
    expect([...parseCpuList('0-3,8,10-11\n')]).toEqual([0, 1, 2, 3, 8, 10, 11]);
    expect([...parseCpuList('1')]).toEqual([1]);
  });

  it('names each configured CPU outside the allowed list', () => {
    expect(cpuProblems({ cpus: [0, 1], workers: 2 }, '0-1')).toEqual([]);
    // One loop runs on cpus[0] only: an entry no loop uses is not refused.
    expect(cpuProblems({ cpus: [1, 99], workers: 1 }, '0-1')).toEqual([]);
    expect(cpuProblems({ cpus: [1, 99, 4], workers: 3 }, '0-1\n')).toEqual([
      { path: 'cpus[1]', message: 'CPU 99 is not one this process may run on (0-1)' },
      { path: 'cpus[2]', message: 'CPU 4 is not one this process may run on (0-1)' },
    ]);
    // Unknown (no /proc): nothing refused here; the loop's own pinning still reports a failure.
    expect(cpuProblems({ cpus: [99], workers: 1 }, '')).toEqual([]);
  });
});

describe('listenProblems', () => {
  it('passes free addresses, calls one the host does not have a config problem and a port in use the system\'s', async () => {
    const holder: Server = createServer();
    await new Promise<void>((r) => holder.listen(0, '127.0.0.1', () => r()));
    const taken = (holder.address() as AddressInfo).port;
    try {
      const free = await listenProblems({ metrics: { listen: { host: '127.0.0.1', port: 0 } }, admin: { listen: { host: '127.0.0.1', port: 0 }, tokenFile: null } });
      expect(free).toEqual({ problems: [], byConfig: false });
      const inUse = await listenProblems({ metrics: { listen: { host: '127.0.0.1', port: taken } }, admin: { listen: { host: '127.0.0.1', port: 0 }, tokenFile: null } });
      expect(inUse).toEqual({ problems: [{ path: 'metrics.listen', message: `127.0.0.1:${taken} cannot be bound: EADDRINUSE (another process listens there)` }], byConfig: false });
      const absent = await listenProblems({ metrics: { listen: { host: '127.0.0.1', port: 0 } }, admin: { listen: { host: '192.0.2.254', port: 9743 }, tokenFile: null } });
      expect(absent).toEqual({ problems: [{ path: 'admin.listen', message: '192.0.2.254:9743: 192.0.2.254 is not an address of this host' }], byConfig: true });
    } finally {
      holder.close();
    }
  });
});
