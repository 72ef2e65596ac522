// PathMtuSockets: which raw sockets the LB keeps open so that its kernel takes a router's
// fragmentation-needed / packet-too-big about a tunnel (fake opener; the kernel side, with the
// native sockets, is in test/integration/ipip-path-mtu.test.ts).
import { describe, expect, it } from 'vitest';
import { PathMtuSockets, pathMtuSpecs, type PathMtuSocketOpener, type PathMtuSocketSpec } from '../../src/control/path-mtu-sockets.js';

const key = (s: PathMtuSocketSpec): string => `${s.outerFamily}/${s.protocol} ${s.source ?? '*'} > ${s.peer}`;

function fakes(refuse: (spec: PathMtuSocketSpec) => boolean = () => false) {
  const events: string[] = [];
  const warned: Record<string, unknown>[] = [];
  const opener: PathMtuSocketOpener = (spec) => {
    if (refuse(spec)) throw new Error('EPERM: operation not permitted');
    events.push(`open ${key(spec)}`);
    return { close: () => void events.push(`close ${key(spec)}`) };
  };
  const sockets = new PathMtuSockets({ warn: (_msg, fields) => void warned.push(fields ?? {}) }, opener);
  return { sockets, events, warned };
}

const R4 = { address: '192.0.2.1', source: '198.51.100.5' };
const R6 = { address: '2001:db8::1', source: '2001:db8:5::5' };

describe('PathMtuSockets', () => {
  it('takes per real one socket for protocol 4 over IPv4, 41 and 4 over IPv6, bound to its source and connected to it', () => {
    expect(pathMtuSpecs([R4, R4])).toEqual([{ outerFamily: 4, protocol: 4, peer: '192.0.2.1', source: '198.51.100.5' }]);
    expect(pathMtuSpecs([R6, { address: '192.0.2.2', source: null }])).toEqual([
      { outerFamily: 6, protocol: 41, peer: '2001:db8::1', source: '2001:db8:5::5' },
      { outerFamily: 6, protocol: 4, peer: '2001:db8::1', source: '2001:db8:5::5' },
      { outerFamily: 4, protocol: 4, peer: '192.0.2.2', source: null },
    ]);
    expect(pathMtuSpecs([])).toEqual([]);
  });

  it('opens what the tunnels need once, closes what they no longer need, and opens anew for a new source', () => {
    const f = fakes();
    f.sockets.sync([R4]);
    f.sockets.sync([R4]);
    expect(f.events).toEqual(['open 4/4 198.51.100.5 > 192.0.2.1']);
    f.sockets.sync([R4, R6]);
    expect(f.events.slice(1)).toEqual(['open 6/41 2001:db8:5::5 > 2001:db8::1', 'open 6/4 2001:db8:5::5 > 2001:db8::1']);
    f.sockets.sync([{ ...R4, source: '198.51.100.6' }]);
    expect(f.events.slice(3)).toEqual([
      'close 4/4 198.51.100.5 > 192.0.2.1',
      'close 6/41 2001:db8:5::5 > 2001:db8::1',
      'close 6/4 2001:db8:5::5 > 2001:db8::1',
      'open 4/4 198.51.100.6 > 192.0.2.1',
    ]);
    expect(f.sockets.openSockets).toEqual(['4/4 198.51.100.6 > 192.0.2.1']);
    f.sockets.close();
    expect(f.events.at(-1)).toBe('close 4/4 198.51.100.6 > 192.0.2.1');
    expect(f.sockets.openSockets).toEqual([]);
  });

  it('sockets it cannot open (no CAP_NET_RAW) are one warning, never thrown, and opened when they can be', () => {
    let refusing = true;
    const f = fakes(() => refusing);
    f.sockets.sync([R4, R6]);
    f.sockets.sync([R4, R6]);
    expect(f.warned).toEqual([
      {
        sockets: ['4/4 198.51.100.5 > 192.0.2.1', '6/41 2001:db8:5::5 > 2001:db8::1', '6/4 2001:db8:5::5 > 2001:db8::1'],
        count: 3,
        error: 'EPERM: operation not permitted',
      },
    ]);
    refusing = false;
    f.sockets.sync([R4, R6]);
    expect(f.sockets.openSockets).toHaveLength(3);
    expect(f.warned).toHaveLength(1);
  });

  it("names the real a socket's too-big error is about, for the daemon to ask its route again", () => {
    const reported = new Map<string, () => void>();
    const said: string[] = [];
    const sockets = new PathMtuSockets({ warn: () => {} }, (spec, tooBig) => {
      reported.set(key(spec), tooBig);
      return { close: () => {} };
    }, (peer) => void said.push(peer));
    sockets.sync([R4, R6]);
    reported.get('6/4 2001:db8:5::5 > 2001:db8::1')!();
    reported.get('4/4 198.51.100.5 > 192.0.2.1')!();
    expect(said).toEqual(['2001:db8::1', '192.0.2.1']);
  });
});
