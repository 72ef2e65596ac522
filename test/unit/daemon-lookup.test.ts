// The daemon's lookups of what operators type: SERVICE and REAL in any valid spelling of the
// address, and explain's client checked before the packet loop is asked (no root, no loop needed).

import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon, DaemonError } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
const parsed = parseConfigText(`interface: eth0
services:
  - { name: web, vip: 10.93.0.100, port: 80, protocol: tcp, reals: [{ address: 10.93.0.11 }] }
  - { name: web6, vip: fd93::100, port: 443, protocol: tcp, reals: [{ address: fd93::11 }] }
  - { name: any, vip: 10.93.0.200, port: 0, protocol: udp, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }] }
  - { name: dns, vip: 10.93.0.200, port: 53, protocol: udp, reals: [{ address: 10.93.0.12 }] }
`);
if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
daemon.config = parsed.config;

async function errorOf(p: Promise<unknown>): Promise<DaemonError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  if (!(e instanceof DaemonError)) throw new Error(`expected a DaemonError, got ${String(e)}`);
  return e;
}

describe('findService', () => {
  it('matches the name, and tcp://VIP:PORT in any valid spelling of the address and port', () => {
    expect(daemon.findService('web')?.name).toBe('web');
    expect(daemon.findService('tcp://10.93.0.100:80')?.name).toBe('web');
    expect(daemon.findService('tcp://10.93.0.100:080')?.name).toBe('web');
    expect(daemon.findService('TCP://10.93.0.100:80')?.name).toBe('web');
    expect(daemon.findService('tcp://[FD93::100]:443')?.name).toBe('web6');
    expect(daemon.findService('tcp://[fd93:0:0:0::100]:443')?.name).toBe('web6');
  });

  it('matches nothing for another protocol, port, a bare IPv6 host or a non-address', () => {
    for (const ref of ['udp://10.93.0.100:80', 'tcp://10.93.0.100:81', 'tcp://fd93::100:443', 'tcp://web:80', 'nosuch']) {
      expect(daemon.findService(ref), ref).toBeNull();
    }
  });
});

describe('SERVICE and REAL as status prints them (VIP:PORT, REAL:PORT), as ipvsadm users type them', () => {
  const both = new Daemon('/nonexistent/dsrlb.yaml', createLogger(() => undefined));
  const cfg = parseConfigText(`interface: eth0
services:
  - { name: web, vip: 10.93.0.100, port: 80, protocol: tcp, reals: [{ address: 10.93.0.11 }, { address: 10.93.0.12 }] }
  - { name: dns-tcp, vip: 10.93.0.53, port: 53, protocol: tcp, reals: [{ address: 10.93.0.21 }] }
  - { name: dns-udp, vip: 10.93.0.53, port: 53, protocol: udp, reals: [{ address: 10.93.0.21 }] }
  - { name: web6, vip: fd93::100, port: 443, protocol: tcp, reals: [{ address: fd93::11 }] }
`);
  if (!cfg.ok) throw new Error(JSON.stringify(cfg.problems));
  both.config = cfg.config;

  it('finds a service by VIP:PORT when one protocol has it, and names both when two do', () => {
    expect(both.findService('10.93.0.100:80')?.name).toBe('web');
    expect(both.findService('[FD93::100]:443')?.name).toBe('web6');
    expect(both.findService('10.93.0.100:81')).toBeNull();
    expect(() => both.findService('10.93.0.53:53')).toThrow('"10.93.0.53:53" is tcp://10.93.0.53:53 (dns-tcp) and udp://10.93.0.53:53 (dns-udp): name one');
    expect(both.findService('udp://10.93.0.53:53')?.name).toBe('dns-udp');
  });

  it('finds a real by REAL:PORT with the service\'s port; another port or an unknown real is named with the reals there are', async () => {
    const findReal = (svc: string, real: string) => (both as unknown as { findReal(s: unknown, a: string): { address: string } }).findReal(both.findService(svc), real);
    expect(findReal('10.93.0.100:80', '10.93.0.12:80').address).toBe('10.93.0.12');
    expect(findReal('web', '10.93.0.12').address).toBe('10.93.0.12');
    expect(findReal('web6', '[fd93:0::11]:443').address).toBe('fd93::11');
    expect(findReal('web6', 'fd93::11').address).toBe('fd93::11');
    expect(() => findReal('web', '10.93.0.12:8080')).toThrow('service "web" has no real "10.93.0.12:8080" (its reals take port 80: DSR does not change the port); its reals: 10.93.0.11, 10.93.0.12');
    expect(() => findReal('web', '10.93.0.13')).toThrow('service "web" has no real "10.93.0.13"; its reals: 10.93.0.11, 10.93.0.12');
  });

  it('takes a port-0 service and its reals as status prints them (VIP:0, REAL:0), and a real of it by any port', () => {
    const findReal = (svc: string, real: string) => (daemon as unknown as { findReal(s: unknown, a: string): { address: string } }).findReal(daemon.findService(svc), real);
    expect(daemon.findService('10.93.0.200:0')?.name).toBe('any');
    expect(findReal('10.93.0.200:0', '10.93.0.11:0').address).toBe('10.93.0.11');
    expect(findReal('any', '10.93.0.11:443').address).toBe('10.93.0.11');
  });

  it('says how a service can be named when none matches', async () => {
    const e = await errorOf(both.setIntent('10.93.0.100:8080', '10.93.0.11', { state: 'drain' }));
    expect([e.code, e.message]).toEqual(['UNKNOWN_SERVICE', 'unknown service "10.93.0.100:8080": name it (web, dns-tcp, dns-udp, web6) or give its address, VIP:PORT or tcp://VIP:PORT']);
  });
});

describe('setIntent', () => {
  it('names an unknown real, and finds one written in another spelling before anything else', async () => {
    expect((await errorOf(daemon.setIntent('web', '10.93.0.12', { state: 'drain' }))).code).toBe('UNKNOWN_REAL');
    expect((await errorOf(daemon.setIntent('web', 'not-an-ip', { state: 'drain' }))).code).toBe('UNKNOWN_REAL');
  });
});

describe('explain input', () => {
  it('refuses a bad client with BAD_CLIENT and a clear message before asking the packet loop', async () => {
    const cases: [string, string, RegExp][] = [
      ['web', '1.2.3.4:99999', /port 99999 is not 1\.\.65535/],
      ['web', '1.2.3.4:0', /port 0 is not 1\.\.65535/],
      ['web', 'notanip:80', /"notanip" is not an IP address/],
      ['web', '1.2.3.4', /is not IP:PORT/],
      ['web', '[fd93::10]:5', /is IPv6 but service "web" is IPv4/],
      ['web6', '10.93.0.10:5', /is IPv4 but service "web6" is IPv6/],
      ['web', '[10.93.0.10]:5', /brackets are for IPv6 addresses only/],
      ['web6', 'fd93::10:5', /is not IP:PORT \(or \[IPv6\]:PORT\)/],
    ];
    for (const [service, client, message] of cases) {
      const e = await errorOf(daemon.explain(service, client));
      expect(e.code, client).toBe('BAD_CLIENT');
      expect(e.message, client).toMatch(message);
    }
    expect((await errorOf(daemon.explain('nosuch', '1.2.3.4:5'))).code).toBe('UNKNOWN_SERVICE');
  });
});

describe('explain of a port-0 service', () => {
  // Stands in for the packet loops: records what explain asks them.
  const asked: { dstPort: number; srcPort: number }[] = [];
  (daemon as unknown as { loops: unknown }).loops = {
    ask: async (build: (id: number) => { dstPort: number; srcPort: number }) => {
      asked.push(build(1));
      return [{ type: 'explained', id: 1, real: -1, placement: 'scheduler', generation: 1, slot: 7, flowState: -1, entryReal: -1 }];
    },
  };

  it('asks about the port given in udp://VIP:PORT, as packets to that port are placed', async () => {
    const r = await daemon.explain('udp://10.93.0.200:5555', '192.0.2.7:40000');
    expect(r.service).toBe('any');
    expect(asked.at(-1)).toMatchObject({ dstPort: 5555, srcPort: 40000 });
    // An exact-port service wins over port 0, as in the packet path.
    expect((await daemon.explain('udp://10.93.0.200:53', '192.0.2.7:40000')).service).toBe('dns');
    expect(asked.at(-1)).toMatchObject({ dstPort: 53 });
  });

  it('refuses the port-0 service by name: no packet goes to port 0', async () => {
    const e = await errorOf(daemon.explain('any', '192.0.2.7:40000'));
    expect(e.code).toBe('BAD_SERVICE');
    expect(e.message).toBe('service "any" serves every port of 10.93.0.200: name the port, e.g. udp://10.93.0.200:443');
  });
});
