import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { restartOnlyChanges } from '../../src/config/restart-keys.js';
import type { Config } from '../../src/config/types.js';

function config(top: string): Config {
  const r = parseConfigText(`interface: eth0\n${top}\nservices:\n  - { vip: 203.0.113.10, port: 80, reals: [] }\n`);
  if (!r.ok) throw new Error(JSON.stringify(r.problems));
  return r.config;
}

describe('restartOnlyChanges', () => {
  it('is empty when only reloadable settings differ', () => {
    expect(restartOnlyChanges(config(''), config('flowTable: { udpTimeout: 60s }'))).toEqual([]);
  });

  it('lists every restart-only key that differs, in order, with both values', () => {
    const changes = restartOnlyChanges(
      config(''),
      config('io: afpacket\nring: v2\nworkers: 2\ncpus: [0, 1]\nflowTable: { capacity: 2000 }\nhashSeed: 7'),
    );
    expect(changes).toEqual([
      { path: 'ring', what: 'the ring', before: 'v3', after: 'v2', why: null },
      { path: 'workers', what: 'the number of packet loops', before: '1', after: '2', why: null },
      { path: 'cpus', what: "the packet loops' CPUs", before: '[]', after: '[0, 1]', why: null },
      { path: 'flowTable.capacity', what: 'the flow table capacity', before: '1000000', after: '2000', why: null },
      { path: 'hashSeed', what: 'hashSeed', before: '0', after: '7', why: 'it would move every flow' },
    ]);
    expect(restartOnlyChanges(config(''), { ...config(''), interface: 'eth1', io: 'pcap' }).map((c) => c.path)).toEqual(['interface', 'io']);
  });

  it('makes the listeners restart-only (they are bound at start) but not the admin token file (re-read on reload)', () => {
    const changes = restartOnlyChanges(config(''), config('admin: { listen: 127.0.0.1:9753, tokenFile: /etc/dsrlb/t }\nmetrics: { listen: "[::1]:9752" }'));
    expect(changes.map((c) => [c.path, c.before, c.after])).toEqual([
      ['admin.listen', '127.0.0.1:9743', '127.0.0.1:9753'],
      ['metrics.listen', '127.0.0.1:9742', '[::1]:9752'],
    ]);
  });
});
