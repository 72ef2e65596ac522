// PathMtuSockets: which raw sockets the LB keeps open so that its kernel takes a router's
// fragmentation-needed / packet-too-big about the tunnel (fake opener; the kernel side is in
// test/integration/ipip-path-mtu.test.ts).
import { describe, expect, it } from 'vitest';
import { PathMtuSockets, pathMtuSpecs, type PathMtuSocketOpener, type PathMtuSocketSpec } from '../../src/control/path-mtu-sockets.js';

function fakes(refuse: (spec: PathMtuSocketSpec) => boolean = () => false) {
  const events: string[] = [];
  const warned: { msg: string; fields: Record<string, unknown> | undefined }[] = [];
  const failers = new Map<string, (error: Error) => void>();
  const opener: PathMtuSocketOpener = (spec, onError) => {
    const key = `${spec.outerFamily}/${spec.protocol}${spec.peer !== null ? ` ${spec.peer}` : ''}`;
    if (refuse(spec)) throw new Error('EPERM: operation not permitted');
    events.push(`open ${key}`);
    failers.set(key, onError);
    return { spec, close: () => void events.push(`close ${key}`) };
  };
  const sockets = new PathMtuSockets({ warn: (msg, fields) => void warned.push({ msg, fields }) }, opener);
  return { sockets, events, warned, failers };
}

describe('PathMtuSockets', () => {
  it('takes one unconnected socket for protocol 4 over IPv4, and per IPv6 real one connected socket each for 41 and 4', () => {
    expect(pathMtuSpecs(['192.0.2.1', '192.0.2.2', '192.0.2.1'])).toEqual([{ outerFamily: 4, protocol: 4, peer: null }]);
    expect(pathMtuSpecs(['2001:db8::1', '192.0.2.1'])).toEqual([
      { outerFamily: 4, protocol: 4, peer: null },
      { outerFamily: 6, protocol: 41, peer: '2001:db8::1' },
      { outerFamily: 6, protocol: 4, peer: '2001:db8::1' },
    ]);
    expect(pathMtuSpecs([])).toEqual([]);
  });

  it('opens what the IPIP reals need, once, and closes what they no longer need', () => {
    const f = fakes();
    f.sockets.sync(['192.0.2.1']);
    f.sockets.sync(['192.0.2.1', '192.0.2.2']);
    expect(f.events).toEqual(['open 4/4']);
    f.sockets.sync(['192.0.2.1', '2001:db8::1']);
    expect(f.events.slice(1)).toEqual(['open 6/41 2001:db8::1', 'open 6/4 2001:db8::1']);
    expect(f.sockets.openSockets).toEqual(['4/4', '6/41 2001:db8::1', '6/4 2001:db8::1']);
    f.sockets.sync(['2001:db8::2']);
    expect(f.events.slice(3)).toEqual(['close 4/4', 'close 6/41 2001:db8::1', 'close 6/4 2001:db8::1', 'open 6/41 2001:db8::2', 'open 6/4 2001:db8::2']);
    f.sockets.close();
    expect(f.events.slice(8)).toEqual(['close 6/41 2001:db8::2', 'close 6/4 2001:db8::2']);
    expect(f.sockets.openSockets).toEqual([]);
  });

  it('a socket it cannot open (no CAP_NET_RAW) is warned about once, never thrown, and opened when it can be', () => {
    let refusing = true;
    const f = fakes(() => refusing);
    f.sockets.sync(['192.0.2.1']);
    f.sockets.sync(['192.0.2.1']);
    expect(f.warned).toHaveLength(1);
    expect(f.warned[0]!.fields).toEqual({ socket: '4/4', error: 'EPERM: operation not permitted' });
    refusing = false;
    f.sockets.sync(['192.0.2.1']);
    expect(f.sockets.openSockets).toEqual(['4/4']);
    expect(f.warned).toHaveLength(1);
  });

  it('a socket that failed reading is logged and opened again at the next sync', () => {
    const f = fakes();
    f.sockets.sync(['192.0.2.1']);
    f.failers.get('4/4')!(new Error('raw IPv4 socket for protocol 4: recvmsg failed (errno 5)'));
    expect(f.sockets.openSockets).toEqual([]);
    expect(f.warned.map((w) => w.fields)).toEqual([{ socket: '4/4', error: 'raw IPv4 socket for protocol 4: recvmsg failed (errno 5)' }]);
    f.sockets.sync(['192.0.2.1']);
    expect(f.events).toEqual(['open 4/4', 'open 4/4']);
  });
});
