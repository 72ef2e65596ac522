// The next hops of IPIP reals come from one `ip -j -force -batch -` of `route get` lines. Vectors
// are ip's own output (iproute2 6.1): one JSON line per answered lookup, and for a failed one its
// error and "Command failed -:N" on stderr. The real ip is asked too, for loopback addresses.

import { describe, expect, it } from 'vitest';
import { lookupRoutes, parseRouteBatch, withRoute, type Route } from '../../src/control/route-lookup.js';

const gw = '[{"dst":"10.255.255.1","gateway":"192.0.2.1","dev":"eth0","prefsrc":"192.0.2.2","flags":[],"uid":0,"cache":[]}]';
const connected = '[{"dst":"192.0.2.7","dev":"eth0","prefsrc":"192.0.2.2","flags":[],"uid":0,"cache":[]}]';
const v6 = '[{"dst":"2001:db8::1","gateway":"fe80::1","dev":"eth0","protocol":"kernel","metric":1024,"flags":[],"pref":"medium"}]';

describe('parseRouteBatch', () => {
  it('gives each address its gateway, or none on a connected network', () => {
    const r = parseRouteBatch(['10.255.255.1', '192.0.2.7'], `${gw}\n${connected}\n`, '');
    expect(r.get('10.255.255.1')).toMatchObject({ gateway: '192.0.2.1', dev: 'eth0' });
    expect(r.get('192.0.2.7')).toMatchObject({ gateway: null, dev: 'eth0' });
  });

  it('gives each route its source address and its MTU metric (ip route ... mtu N), null without them', () => {
    // iproute2 6.1, `ip route add 10.6.0.0/24 via 10.5.0.2 mtu 1400` (and `mtu lock 1380`: the same JSON).
    const withMtu = '[{"dst":"10.6.0.9","gateway":"10.5.0.2","dev":"a0","prefsrc":"10.5.0.1","flags":[],"uid":0,"cache":[],"metrics":[{"mtu":1400}]}]';
    const r = parseRouteBatch(['10.6.0.9', '192.0.2.7', '2001:db8::1'], `${withMtu}\n${connected}\n${v6}\n`, '');
    expect(r.get('10.6.0.9')).toEqual({ gateway: '10.5.0.2', dev: 'a0', prefsrc: '10.5.0.1', mtu: 1400, mtuLearned: false, routeMtu: 1400, exception: false });
    expect(r.get('192.0.2.7')).toEqual({ gateway: null, dev: 'eth0', prefsrc: '192.0.2.2', mtu: null, mtuLearned: false, routeMtu: null, exception: false });
    expect(r.get('2001:db8::1')).toEqual({ gateway: 'fe80::1', dev: 'eth0', prefsrc: null, mtu: null, mtuLearned: false, routeMtu: null, exception: false });
  });

  it('tells a path MTU the kernel learned from an ICMP error (a route exception, with an expiry) from a configured one', () => {
    // iproute2 6.1 after a router's fragmentation-needed (MTU 1400) about a packet to 10.2.0.3.
    const learned = '[{"dst":"10.2.0.3","gateway":"10.1.0.2","dev":"a0","prefsrc":"10.1.0.1","flags":[],"uid":0,"cache":[],"expires":599,"metrics":[{"mtu":1400}]}]';
    const answer = parseRouteBatch(['10.2.0.3'], `${learned}\n`, '').get('10.2.0.3') as Route;
    expect(answer).toEqual({ gateway: '10.1.0.2', dev: 'a0', prefsrc: '10.1.0.1', mtu: 1400, mtuLearned: true, routeMtu: 1400, exception: true });
    // The route itself (`route get fibmatch`), configured with mtu 1450: its metric is kept apart from the learned one.
    expect(withRoute(answer, { dst: '10.2.0.0/24', gateway: '10.1.0.2', dev: 'a0', metrics: [{ mtu: 1450 }] })).toEqual({ ...answer, routeMtu: 1450 });
  });

  it("takes the next hop from the route, not from a redirect (anyone can forge one)", () => {
    // iproute2 6.1 after an ICMP redirect to 10.9.0.3 about a tunnel packet to 10.20.1.2.
    const redirected = '[{"dst":"10.20.1.2","gateway":"10.9.0.3","dev":"a0","prefsrc":"10.9.0.1","flags":[],"uid":0,"cache":["redirected"],"expires":299}]';
    const answer = parseRouteBatch(['10.20.1.2'], `${redirected}\n`, '').get('10.20.1.2') as Route;
    expect(answer).toMatchObject({ gateway: '10.9.0.3', mtu: null, mtuLearned: false, exception: true });
    expect(withRoute(answer, { dst: '10.20.1.0/24', gateway: '10.9.0.2', dev: 'a0' })).toMatchObject({ gateway: '10.9.0.2', dev: 'a0', mtu: null, routeMtu: null });
    expect(withRoute(answer, null)).toBe(answer);
  });

  it('gives a failed lookup its own error, and the lookups after it their own answers', () => {
    const stderr = 'RTNETLINK answers: Network is unreachable\nCommand failed -:2\nRTNETLINK answers: No route to host\nCommand failed -:4\n';
    const r = parseRouteBatch(['10.255.255.1', '10.9.9.9', '192.0.2.7', '10.8.8.8'], `${gw}\n${connected}\n`, stderr);
    expect(r.get('10.255.255.1')).toMatchObject({ gateway: '192.0.2.1', dev: 'eth0' });
    expect(r.get('10.9.9.9')).toEqual(new Error('RTNETLINK answers: Network is unreachable'));
    expect(r.get('192.0.2.7')).toMatchObject({ gateway: null, dev: 'eth0' });
    expect(r.get('10.8.8.8')).toEqual(new Error('RTNETLINK answers: No route to host'));
  });

  it('matches answers by address, not by order or spelling', () => {
    // The IPv6 real written another way in the config; the answers in another order.
    const r = parseRouteBatch(['2001:DB8:0::1', '10.255.255.1'], `${gw}\n${v6}\n`, '');
    expect(r.get('2001:DB8:0::1')).toMatchObject({ gateway: 'fe80::1', dev: 'eth0' });
    expect(r.get('10.255.255.1')).toMatchObject({ gateway: '192.0.2.1', dev: 'eth0' });
  });

  it('fails an address ip did not answer for, with what ip said', () => {
    const r = parseRouteBatch(['10.255.255.1', '10.9.9.9'], `${gw}\nnot json\n`, 'Error: any valid prefix is expected rather than "x".\n');
    expect(r.get('10.255.255.1')).toMatchObject({ gateway: '192.0.2.1', dev: 'eth0' });
    expect(r.get('10.9.9.9')).toEqual(new Error('Error: any valid prefix is expected rather than "x".'));
    expect(parseRouteBatch(['10.9.9.9'], '', '').get('10.9.9.9')).toEqual(new Error('no answer from ip route get'));
  });
});

describe('lookupRoutes', () => {
  it('asks the real ip once for all addresses', async () => {
    const r = await lookupRoutes(['127.0.0.1', '::1', '127.0.0.2'], 10_000);
    expect(r.get('127.0.0.1')).toMatchObject({ gateway: null, dev: 'lo' });
    expect(r.get('::1')).toMatchObject({ gateway: null, dev: 'lo' });
    expect(r.get('127.0.0.2')).toMatchObject({ gateway: null, dev: 'lo' });
  });

  it('asks from the given source where there is one, and again without it where that source is not local (the kernel refuses the lookup)', async () => {
    const sources: Record<string, string> = { '127.0.0.2': '127.0.0.1', '127.0.0.3': '192.0.2.201' };
    const r = await lookupRoutes(['127.0.0.1', '127.0.0.2', '127.0.0.3'], 10_000, (a) => sources[a] ?? null);
    expect(r.get('127.0.0.1')).toMatchObject({ gateway: null, dev: 'lo' });
    expect(r.get('127.0.0.2')).toMatchObject({ gateway: null, dev: 'lo' });
    expect(r.get('127.0.0.3')).toMatchObject({ gateway: null, dev: 'lo' });
  });

  it('asks nothing for no address', async () => {
    expect((await lookupRoutes([], 10_000)).size).toBe(0);
  });
});
