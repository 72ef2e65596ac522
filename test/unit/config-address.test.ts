// Address parsing in the config validator, which reads every VIP and real: the same answers as
// ipaddr.js's own validity checks (which it no longer calls, they throw and catch per address of
// the other family), and the service identity checks that now go by Map.

import ipaddr from 'ipaddr.js';
import { describe, expect, it } from 'vitest';
import { parseConfigText, parseIpAddress, unicastProblem } from '../../src/config/validate.js';

/** parseIpAddress as it was written on ipaddr.js's checks: the oracle. */
function byIpaddr(text: string): { address: string; family: 4 | 6 } | null {
  if (ipaddr.IPv4.isValidFourPartDecimal(text)) return { address: ipaddr.IPv4.parse(text).toString(), family: 4 };
  if (!text.includes('%') && ipaddr.IPv6.isValid(text)) return { address: ipaddr.IPv6.parse(text).toString(), family: 6 };
  return null;
}

/** The range ipaddr.parse gives the address: what unicastProblem judges by. */
function rangeByIpaddr(text: string): string | null {
  const parsed = byIpaddr(text);
  return parsed === null ? null : ipaddr.parse(parsed.address).range();
}

const WRITTEN = [
  '10.0.0.1', '0.0.0.0', '0.1.2.3', '255.255.255.255', '256.1.1.1', '1.2.3.255', '1.2.3.256', '01.2.3.4', '1.2.3.04', '1.2.3.0', '1.2.3',
  '1.2.3.4.5', '0x1.2.3.4', '1.2.3.4 ', ' 1.2.3.4', '1.2.3.4\n', '99999999999999999999.1.1.1', '1e2.1.1.1', '-1.2.3.4', '+1.2.3.4', '1..2.3',
  '127.0.0.1', '224.0.0.1', '169.254.1.1', '100.64.0.1', '192.168.1.1', '240.0.0.1', '\u0661.2.3.4',
  '::', '::1', '2001:db8::1', '2001:DB8::0:1', '2001:0db8:0000:0000:0000:0000:0000:0001', 'fe80::1', 'fe80::1%eth0', 'febf::1', 'fec0::1',
  '::ffff:1.2.3.4', '::ffff:102:304', '::1.2.3.4', '::ffff:0:0', '1::2::3', '1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8:9', '1:2:3:4:5:6:7::',
  'ff02::1', '2001:db8::1.2.3.4', '1:2:3:4:5:6:1.2.3.4', '1.2.3.4:80', ':', '', 'abc', 'gggg::1', '12345::1', '64:ff9b::1', 'fc00::1',
  '100::1', '2002::1', '::%eth0', '2001:db8::1%1', '[::1]', '::1 ',
];

describe('parseIpAddress and unicastProblem', () => {
  it('answer as ipaddr.js checks do, for written forms and random ones', () => {
    let seed = 7;
    const next = (n: number): number => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed % n;
    };
    const random: string[] = [];
    for (let i = 0; i < 2000; i++) {
      random.push(Array.from({ length: 4 }, () => String(next(300))).join('.'));
      random.push(Array.from({ length: 1 + next(8) }, () => next(0x10000).toString(16)).join(':') + (next(3) === 0 ? '::' : `::${next(0x10000).toString(16)}`));
    }
    for (const text of [...WRITTEN, ...random]) {
      expect(parseIpAddress(text), text).toEqual(byIpaddr(text));
      const range = rangeByIpaddr(text);
      const problem = unicastProblem(text, 'a real');
      if (range === null) expect(problem, text).toMatch(/is not an IPv4 or IPv6 address/);
      else expect(problem === null, `${text} (${range})`).toBe(!['unspecified', 'multicast', 'broadcast', 'loopback', 'ipv4Mapped'].includes(range) && !(range === 'linkLocal' && text.includes(':')));
    }
  });

  it('words each refused kind of address as before', () => {
    expect(unicastProblem('::ffff:192.0.2.1', 'a VIP')).toBe('"::ffff:192.0.2.1" is an IPv4-mapped IPv6 address; write the IPv4 address 192.0.2.1');
    expect(unicastProblem('fe80::1', 'a real')).toBe('"fe80::1" is an IPv6 link-local address (it needs a zone); a real must be a unicast address reachable on the network');
    expect(unicastProblem('169.254.1.1', 'a real')).toBeNull();
    expect(unicastProblem('0.0.0.0', 'a VIP')).toBe('"0.0.0.0" is the unspecified address; a VIP must be a unicast address reachable on the network');
    expect(unicastProblem('fe80::1%eth0', 'a real')).toBe('"fe80::1%eth0" is not an IPv4 or IPv6 address (zone indexes such as %eth0 are not supported)');
    expect(unicastProblem(80, 'a real')).toBe('80 is not an IPv4 or IPv6 address');
  });
});

describe('service identity by Map', () => {
  const service = (vip: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({ vip, port: 80, reals: [], ...extra });
  const problems = (services: unknown[]): string[] => {
    const result = parseConfigText(JSON.stringify({ interface: 'eth0', services }));
    // path: message only; the positions are config-positions.test.ts's.
    return result.ok ? [] : result.problems.map((problem) => `${problem.path}: ${problem.message}`);
  };

  it('names the first service of an address taken three times, and of a name taken three times', () => {
    expect(problems([service('203.0.113.10'), service('203.0.113.11'), service('203.0.113.10'), service('203.0.113.10')])).toEqual([
      'services[2]: tcp://203.0.113.10:80 is already defined by services[0] ("tcp://203.0.113.10:80")',
      'services[3]: tcp://203.0.113.10:80 is already defined by services[0] ("tcp://203.0.113.10:80")',
    ]);
    expect(problems([service('203.0.113.10', { name: 'a' }), service('203.0.113.11', { name: 'a' }), service('203.0.113.12', { name: 'a' })])).toEqual([
      'services[1].name: "a" is already the name of services[0]',
      'services[2].name: "a" is already the name of services[0]',
    ]);
  });

  it('a name written as the address of a later service, or of its own address held twice, names the other service', () => {
    expect(problems([service('203.0.113.10', { name: 'tcp://203.0.113.11:80' }), service('203.0.113.11')])).toEqual([
      'services[0].name: "tcp://203.0.113.11:80" is the address of services[1]; choose another name',
    ]);
    expect(problems([service('203.0.113.10', { name: 'TCP://203.0.113.10:080' }), service('203.0.113.10')])).toEqual([
      'services[1]: tcp://203.0.113.10:80 is already defined by services[0] ("TCP://203.0.113.10:080")',
      'services[0].name: "TCP://203.0.113.10:080" is the address of services[1]; choose another name',
    ]);
  });
});
