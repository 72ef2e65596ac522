// Config validation: the contract's sample normalises as documented, and every rule reports the
// exact `path: message` line an operator sees from `dsrlb validate`.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { formatDurationMs, parseDurationMs } from '../../src/config/duration.js';
import { loadConfigFile, stateDirectoryOf } from '../../src/config/load.js';
import type { Config, ConfigProblem } from '../../src/config/types.js';
import {
  closestKey,
  formatProblems,
  parseConfigText,
  parseIpAddress,
  parseListenAddress,
  serviceAddressName,
  validateAdminSettings,
} from '../../src/config/validate.js';

const CONTRACT_SAMPLE = `
interface: eth0                # VIP traffic arrives here; forwarded frames leave here
io: afpacket                   # afpacket (native addon, default) | pcap (libpcap via the cap package)
flowTable:
  capacity: 1000000            # entries; memory is bounded by this
  tcpTimeouts: { syn: 60s, established: 900s, fin: 120s }   # IPVS-like defaults
  udpTimeout: 300s
tunnel:
  sourceV4: 192.0.2.5          # outer source for IPIP; default: the interface's first IPv4 address
  sourceV6: 2001:db8::5
metrics: { listen: 127.0.0.1:9742 }          # GET /metrics, Prometheus text format
admin:   { listen: 127.0.0.1:9743, tokenFile: /etc/dsrlb/admin.token }
                               # token required (Authorization: Bearer) unless listen is loopback
services:
  - name: web
    vip: 203.0.113.10          # IPv4 or IPv6
    port: 80                   # 0 = every port of the VIP
    protocol: tcp              # tcp | udp
    scheduler: maglev          # maglev | rendezvous | wlc
    forwarding: l2             # l2 (MAC rewrite) | ipip (IPIP / IPv6-in-IPv6)
    whenAllDown: failOpen      # failOpen: keep sending to all wanted reals | drop
    healthCheck:
      type: http               # tcp | http | https | udp | icmp | exec | none
      port: 80                 # default: the service port
      path: /healthz
      expectStatus: [200]
      interval: 2s
      timeout: 1s
      rise: 2                  # consecutive successes before a down real is up
      fall: 3                  # consecutive failures before an up real is down
    reals:
      - address: 10.0.1.11
        weight: 100            # 0..65535; 0 = no new flows (like IPVS quiescent)
      - address: 10.0.1.12
        state: drain           # active (default) | drain | disabled
        forwarding: ipip       # per-real override of the service's forwarding
`;

type Doc = Record<string, any>;

/** A small valid config as a plain object; tests change one thing and feed it in as JSON (valid YAML). */
function minimal(): Doc {
  return {
    interface: 'eth0',
    services: [{ vip: '203.0.113.10', port: 80, reals: [{ address: '10.0.1.11' }, { address: '10.0.1.12' }] }],
  };
}

function parse(doc: unknown): ReturnType<typeof parseConfigText> {
  return parseConfigText(JSON.stringify(doc));
}

function configOf(doc: unknown): Config {
  const result = parse(doc);
  if (!result.ok) throw new Error(`expected a valid config, got:\n${formatProblems(result.problems)}`);
  return result.config;
}

/** `path: message` of each problem, without the line and column formatProblems adds (config-positions.test.ts checks those). */
function pathMessages(problems: readonly ConfigProblem[]): string[] {
  return problems.map((problem) => `${problem.path}: ${problem.message}`);
}

/** The problem lines for a config with one change applied to `minimal()`. */
function problemsWith(change: (doc: Doc) => void): string[] {
  const doc = minimal();
  change(doc);
  const result = parse(doc);
  if (result.ok) return [];
  return pathMessages(result.problems);
}

function problemsOfText(text: string): string[] {
  const result = parseConfigText(text);
  return result.ok ? [] : pathMessages(result.problems);
}

describe('contract sample', () => {
  it('normalises to the documented object with defaults filled in', () => {
    const result = parseConfigText(CONTRACT_SAMPLE);
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.config).toEqual({
      interface: 'eth0',
      io: 'afpacket',
      ring: 'v3',
      hashSeed: 0,
      flowTable: {
        capacity: 1_000_000,
        tcpTimeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000 },
        udpTimeoutMs: 300_000,
      },
      tunnel: { sourceV4: '192.0.2.5', sourceV6: '2001:db8::5' },
      metrics: { listen: { host: '127.0.0.1', port: 9742 } },
      admin: { listen: { host: '127.0.0.1', port: 9743 }, tokenFile: '/etc/dsrlb/admin.token' },
      stateFile: null,
      workers: 1,
      cpus: [],
      announce: { enabled: false, routesFile: '/run/dsrlb/bird-routes.conf', birdSocket: null, onFailOpen: true, withdrawDelayMs: 300 },
      services: [
        {
          name: 'web',
          vip: '203.0.113.10',
          family: 4,
          port: 80,
          protocol: 'tcp',
          scheduler: 'maglev',
          forwarding: 'l2',
          whenAllDown: 'failOpen',
          onRealDown: 'reschedule',
          persistence: 'none',
          persistencePrefix: 32,
          ops: false,
          tableSize: 65537,
          healthCheck: {
            type: 'http',
            port: 80,
            path: '/healthz',
            host: null,
            expectStatus: [200],
            expectBody: null,
            payload: null,
            expectPayload: null,
            command: null,
            intervalMs: 2000,
            timeoutMs: 1000,
            rise: 2,
            fall: 3,
          },
          announce: true,
          reals: [
            { address: '10.0.1.11', family: 4, weight: 100, state: 'active', forwarding: 'l2', backup: false },
            { address: '10.0.1.12', family: 4, weight: 100, state: 'drain', forwarding: 'ipip', backup: false },
          ],
        },
      ],
    });
  });

  it('fills every default for a minimal config', () => {
    const config = configOf(minimal());
    expect(config.io).toBe('afpacket');
    expect(config.hashSeed).toBe(0);
    expect(config.flowTable).toEqual({
      capacity: 1_000_000,
      tcpTimeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000 },
      udpTimeoutMs: 300_000,
    });
    expect(config.tunnel).toEqual({ sourceV4: null, sourceV6: null });
    expect(config.metrics.listen).toEqual({ host: '127.0.0.1', port: 9742 });
    expect(config.admin).toEqual({ listen: { host: '127.0.0.1', port: 9743 }, tokenFile: null });
    const service = config.services[0]!;
    expect(service.name).toBe('tcp://203.0.113.10:80');
    expect(service.protocol).toBe('tcp');
    expect(service.scheduler).toBe('maglev');
    expect(service.forwarding).toBe('l2');
    expect(service.whenAllDown).toBe('failOpen');
    expect(service.onRealDown).toBe('reschedule');
    expect([service.persistence, service.persistencePrefix, service.ops]).toEqual(['none', 32, false]);
    expect(service.tableSize).toBe(65537);
    expect(service.healthCheck.type).toBe('none');
    expect(service.healthCheck.port).toBe(80);
    expect(service.reals[1]).toEqual({ address: '10.0.1.12', family: 4, weight: 100, state: 'active', forwarding: 'l2', backup: false });
  });

  it('the shipped examples/dsrlb.yaml and deploy sample are valid', async () => {
    for (const file of ['examples/dsrlb.yaml', 'deploy/linux/dsrlb.yaml.sample']) {
      const result = await loadConfigFile(file);
      if (!result.ok) throw new Error(`${file}:\n${formatProblems(result.problems)}`);
      expect(result.config.services.map((service) => service.name)).toEqual(['web', 'udp://[2001:db8::10]:53', 'all-ports']);
      expect(result.config.services[1]!.healthCheck.timeoutMs).toBe(500);
      expect(result.config.services[0]!.reals[2]).toEqual({ address: '2001:db8:1::13', family: 6, weight: 100, state: 'active', forwarding: 'ipip', backup: false });
    }
  });
});

describe('normalisation', () => {
  it('writes IPv6 addresses in RFC 5952 form and brackets them in the default name', () => {
    const config = configOf({
      interface: 'eth0',
      tunnel: { sourceV6: '2001:DB8:0:0:0:0:0:5' },
      services: [{ vip: '2001:0db8:0000:0000:0000:0000:0000:0010', port: 443, reals: [{ address: '2001:db8:0:0:1:0:0:1' }] }],
    });
    expect(config.tunnel.sourceV6).toBe('2001:db8::5');
    expect(config.services[0]!.vip).toBe('2001:db8::10');
    expect(config.services[0]!.family).toBe(6);
    expect(config.services[0]!.name).toBe('tcp://[2001:db8::10]:443');
    expect(config.services[0]!.reals[0]!.address).toBe('2001:db8::1:0:0:1');
  });

  it('names a udp service udp://vip:port', () => {
    expect(configOf({ ...minimal(), services: [{ vip: '203.0.113.10', port: 53, protocol: 'udp', reals: [] }] }).services[0]!.name).toBe('udp://203.0.113.10:53');
  });

  it('reads ms, s, m and bare-second durations', () => {
    const config = configOf({
      ...minimal(),
      flowTable: { tcpTimeouts: { syn: '250ms', established: '15m', fin: 30 }, udpTimeout: '1.5s' },
    });
    expect(config.flowTable.tcpTimeouts).toEqual({ synMs: 250, establishedMs: 900_000, finMs: 30_000 });
    expect(config.flowTable.udpTimeoutMs).toBe(1500);
  });

  it('parses IPv6 listen addresses in brackets', () => {
    const config = configOf({ ...minimal(), metrics: { listen: '[::1]:9100' }, admin: { listen: '[0:0:0:0:0:0:0:1]:9101' } });
    expect(config.metrics.listen).toEqual({ host: '::1', port: 9100 });
    expect(config.admin.listen).toEqual({ host: '::1', port: 9101 });
  });

  it('refuses more (service, real) pairs than the packet loop has real ids (8192), and takes exactly that many', () => {
    const reals = (n: number, base: number) => Array.from({ length: n }, (_, i) => ({ address: `10.${base}.${Math.floor(i / 250)}.${(i % 250) + 1}` }));
    const doc = minimal();
    doc.services = [
      { vip: '203.0.113.10', port: 80, reals: reals(4096, 1) },
      { vip: '203.0.113.10', port: 443, reals: reals(4096, 2) },
    ];
    expect(configOf(doc).services.map((s) => s.reals.length)).toEqual([4096, 4096]);
    doc.services[1].reals.push({ address: '10.3.0.1' });
    expect(problemsOfText(JSON.stringify(doc))).toEqual(['services: 8193 (service, real) pairs; at most 8192 in all']);
  });

  it('resolves a real forwarding override against the service mode', () => {
    const doc = minimal();
    doc.services[0].forwarding = 'ipip';
    doc.services[0].reals[1].forwarding = 'l2';
    const reals = configOf(doc).services[0]!.reals;
    expect(reals.map((real) => real.forwarding)).toEqual(['ipip', 'l2']);
  });

  it('lets an ipip real be IPv6 behind an IPv4 VIP', () => {
    const doc = minimal();
    doc.services[0].reals.push({ address: '2001:db8::11', forwarding: 'ipip' });
    expect(configOf(doc).services[0]!.reals[2]).toEqual({ address: '2001:db8::11', family: 6, weight: 100, state: 'active', forwarding: 'ipip', backup: false });
  });

  it('fills health-check defaults per type', () => {
    const doc = minimal();
    doc.services[0].port = 53;
    doc.services[0].protocol = 'udp';
    doc.services[0].healthCheck = { type: 'udp' };
    const check = configOf(doc).services[0]!.healthCheck;
    expect(check).toEqual({
      type: 'udp', port: 53, path: '/', host: null, expectStatus: [200], expectBody: null, payload: 'ping',
      expectPayload: null, command: null, intervalMs: 2000, timeoutMs: 1000, rise: 2, fall: 3,
    });
  });

  it('keeps the http-only fields of an http check', () => {
    const doc = minimal();
    doc.services[0].healthCheck = { type: 'https', port: 8443, host: 'www.example.com', expectStatus: 204, expectBody: 'ok', rise: 1, fall: 100 };
    const check = configOf(doc).services[0]!.healthCheck;
    expect(check).toMatchObject({ type: 'https', port: 8443, host: 'www.example.com', expectStatus: [204], expectBody: 'ok', rise: 1, fall: 100 });
  });

  it('lets an exec or icmp check on a port-0 service go without a port', () => {
    const doc = minimal();
    doc.services[0].port = 0;
    doc.services[0].healthCheck = { type: 'exec', command: 'true' };
    expect(configOf(doc).services[0]!.healthCheck).toMatchObject({ type: 'exec', port: 0, command: 'true' });
    doc.services[0].healthCheck = { type: 'icmp' };
    expect(configOf(doc).services[0]!.healthCheck).toMatchObject({ type: 'icmp', port: 0 });
  });

  it('keeps the settings of a check switched off with type none', () => {
    const doc = minimal();
    doc.services[0].healthCheck = { type: 'none', path: '/healthz', interval: '5s' };
    expect(configOf(doc).services[0]!.healthCheck).toMatchObject({ type: 'none', path: '/', intervalMs: 2000 });
  });

  it('accepts hashSeed, tableSize, io pcap and an empty reals list', () => {
    const doc = minimal();
    doc.io = 'pcap';
    doc.hashSeed = 4294967295;
    doc.services[0].tableSize = 7;
    doc.services.push({ vip: '203.0.113.11', port: 80, reals: [] });
    const config = configOf(doc);
    expect(config.io).toBe('pcap');
    expect(config.hashSeed).toBe(4294967295);
    expect(config.services[0]!.tableSize).toBe(7);
    expect(config.services[1]!.reals).toEqual([]);
  });

  it('takes tableSize for wlc, whose Maglev table places the packets that arrive without an entry', () => {
    const doc = minimal();
    doc.services[0].scheduler = 'wlc';
    doc.services[0].tableSize = 655373;
    expect(configOf(doc).services[0]!.tableSize).toBe(655373);
  });

  it('takes ring v3 (default) or v2 for io afpacket, and refuses it for pcap', () => {
    expect(configOf(minimal()).ring).toBe('v3');
    const doc = minimal();
    doc.ring = 'v2';
    expect(configOf(doc).ring).toBe('v2');
    expect(problemsWith((d) => { d.ring = 'v4'; })).toEqual([expect.stringMatching(/^ring: .*v4.*v2.*v3/)]);
    expect(problemsWith((d) => { d.io = 'pcap'; d.ring = 'v3'; })).toEqual(['ring: applies to io: afpacket only (io is pcap)']);
  });

  it('takes cpus, the CPUs the packet loops are pinned to, for io afpacket only', () => {
    const doc = minimal();
    doc.workers = 2;
    doc.cpus = [2, 3];
    expect(configOf(doc).cpus).toEqual([2, 3]);
    expect(configOf({ ...minimal(), cpus: 1 }).cpus).toEqual([1]);
    expect(problemsWith((d) => { d.cpus = []; })).toEqual([expect.stringMatching(/^cpus: an empty list/)]);
    expect(problemsWith((d) => { d.cpus = [0, -1, 1.5, '2', 0]; })).toEqual([
      'cpus[1]: -1 is not a CPU number (0..1023)',
      'cpus[2]: 1.5 is not a CPU number (0..1023)',
      expect.stringMatching(/^cpus\[3\]: .*2.* is not a CPU number/),
      'cpus[4]: 0 is listed twice',
    ]);
    expect(problemsWith((d) => { d.io = 'pcap'; d.cpus = [1]; })).toEqual([expect.stringMatching(/^cpus: applies to io: afpacket only/)]);
  });

  it('allows a non-loopback admin listener when a token file is given', () => {
    expect(configOf({ ...minimal(), admin: { listen: '0.0.0.0:9743', tokenFile: '/etc/dsrlb/admin.token' } }).admin.listen.host).toBe('0.0.0.0');
  });

  it('accepts JSON text', () => {
    expect(parseConfigText(JSON.stringify(minimal(), null, 2)).ok).toBe(true);
  });
});

describe('frozen result', () => {
  it('cannot be mutated at any depth', () => {
    const config = configOf(minimal());
    expect(Object.isFrozen(config)).toBe(true);
    expect(Object.isFrozen(config.services[0]!.reals[0])).toBe(true);
    expect(Object.isFrozen(config.services[0]!.healthCheck.expectStatus)).toBe(true);
    expect(Object.isFrozen(config.flowTable.tcpTimeouts)).toBe(true);
    expect(() => {
      (config as { interface: string }).interface = 'eth1';
    }).toThrow(TypeError);
    expect(() => {
      (config.services[0]!.reals[0] as { weight: number }).weight = 1;
    }).toThrow(TypeError);
    expect(() => (config.services as unknown as unknown[]).push({})).toThrow(TypeError);
    expect(config.services[0]!.reals[0]!.weight).toBe(100);
  });
});

describe('top-level rules', () => {
  it.each<[string, (doc: Doc) => void, string]>([
    ['interface missing', (d) => delete d.interface, 'interface: missing; expected a network interface name, e.g. eth0'],
    ['interface empty string', (d) => (d.interface = ''), 'interface: "" is not a network interface name, e.g. eth0'],
    ['interface not a string', (d) => (d.interface = 3), 'interface: 3 is not a network interface name, e.g. eth0'],
    ['interface too long', (d) => (d.interface = 'averyveryverylongname'), 'interface: "averyveryverylongname" is not a network interface name (1..15 characters, no "/", ":" or whitespace)'],
    ['io unknown', (d) => (d.io = 'xdp'), 'io: "xdp" is not afpacket or pcap'],
    ['io wrong case', (d) => (d.io = 'PCAP'), 'io: "PCAP" is not afpacket or pcap (did you mean "pcap"?)'],
    ['hashSeed negative', (d) => (d.hashSeed = -1), 'hashSeed: -1 is not a hash seed (0..4294967295)'],
    ['hashSeed too big', (d) => (d.hashSeed = 4294967296), 'hashSeed: 4294967296 is not a hash seed (0..4294967295)'],
    ['flowTable not a mapping', (d) => (d.flowTable = 5), 'flowTable: expected a mapping of flow table settings, got 5'],
    ['capacity zero', (d) => (d.flowTable = { capacity: 0 }), 'flowTable.capacity: 0 is not a flow table capacity (1..100000000)'],
    ['capacity too big', (d) => (d.flowTable = { capacity: 100000001 }), 'flowTable.capacity: 100000001 is not a flow table capacity (1..100000000)'],
    ['capacity fractional', (d) => (d.flowTable = { capacity: 1.5 }), 'flowTable.capacity: 1.5 is not a flow table capacity (1..100000000)'],
    ['capacity quoted', (d) => (d.flowTable = { capacity: '1000' }), 'flowTable.capacity: "1000" is not a flow table capacity (1..100000000); write the number without quotes'],
    ['duration without unit', (d) => (d.flowTable = { udpTimeout: '300' }), 'flowTable.udpTimeout: "300" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)'],
    ['duration unknown unit', (d) => (d.flowTable = { tcpTimeouts: { syn: '2d' } }), 'flowTable.tcpTimeouts.syn: "2d" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)'],
    ['duration zero', (d) => (d.flowTable = { tcpTimeouts: { fin: '0s' } }), 'flowTable.tcpTimeouts.fin: "0s" is not a positive duration'],
    ['duration negative number', (d) => (d.flowTable = { udpTimeout: -5 }), 'flowTable.udpTimeout: -5 is not a positive duration'],
    ['duration sub-millisecond', (d) => (d.flowTable = { udpTimeout: '0.5ms' }), 'flowTable.udpTimeout: "0.5ms" is not a whole number of milliseconds'],
    ['duration too long', (d) => (d.flowTable = { udpTimeout: '40000m' }), 'flowTable.udpTimeout: "40000m" is longer than the maximum of 2147483647ms'],
    ['tunnel.sourceV4 is IPv6', (d) => (d.tunnel = { sourceV4: '2001:db8::5' }), 'tunnel.sourceV4: "2001:db8::5" is not an IPv4 address'],
    ['tunnel.sourceV6 is IPv4', (d) => (d.tunnel = { sourceV6: '192.0.2.5' }), 'tunnel.sourceV6: "192.0.2.5" is not an IPv6 address'],
    ['tunnel.sourceV4 invalid', (d) => (d.tunnel = { sourceV4: '192.0.2' }), 'tunnel.sourceV4: "192.0.2" is not an IPv4 or IPv6 address'],
    ['metrics.listen without port', (d) => (d.metrics = { listen: '127.0.0.1' }), 'metrics.listen: "127.0.0.1" is not a listen address (host:port, e.g. 127.0.0.1:9742 or [::1]:9742)'],
    ['metrics.listen port 0', (d) => (d.metrics = { listen: '127.0.0.1:0' }), 'metrics.listen: "127.0.0.1:0" is not a listen address: "0" is not a port (1..65535)'],
    ['metrics.listen port too big', (d) => (d.metrics = { listen: '127.0.0.1:70000' }), 'metrics.listen: "127.0.0.1:70000" is not a listen address: "70000" is not a port (1..65535)'],
    ['metrics.listen hostname', (d) => (d.metrics = { listen: 'localhost:9742' }), 'metrics.listen: "localhost:9742" is not a listen address: "localhost" is not an IP address (e.g. 127.0.0.1:9742 or [::1]:9742)'],
    ['admin.listen bare IPv6', (d) => (d.admin = { listen: '::1:9743' }), 'admin.listen: "::1:9743" is not a listen address; put an IPv6 host in brackets, e.g. [::1]:9743'],
    ['admin.listen IPv4 in brackets', (d) => (d.admin = { listen: '[127.0.0.1]:9743' }), 'admin.listen: "[127.0.0.1]:9743" is not a listen address: only IPv6 hosts go in brackets'],
    ['admin.listen a number', (d) => (d.admin = { listen: 9743 }), 'admin.listen: 9743 is not a listen address (host:port, e.g. 127.0.0.1:9743 or [::1]:9743)'],
    ['admin.tokenFile not a string', (d) => (d.admin = { tokenFile: 12 }), 'admin.tokenFile: 12 is not a file path; put it in quotes'],
    ['admin on a public address without token', (d) => (d.admin = { listen: '0.0.0.0:9743' }), 'admin.tokenFile: missing; a token file is required when admin.listen (0.0.0.0:9743) is not a loopback address'],
    ['admin and metrics on one port', (d) => (d.admin = { listen: '127.0.0.1:9742' }), 'admin.listen: 127.0.0.1:9742 clashes with metrics.listen (127.0.0.1:9742, the default); they need different ports'],
    ['metrics on the default admin port', (d) => (d.metrics = { listen: '127.0.0.1:9743' }), 'metrics.listen: 127.0.0.1:9743 clashes with admin.listen (127.0.0.1:9743, the default); they need different ports'],
    ['both written on one port', (d) => ((d.metrics = { listen: '127.0.0.1:9000' }), (d.admin = { listen: '127.0.0.1:9000' })), 'admin.listen: 127.0.0.1:9000 clashes with metrics.listen (127.0.0.1:9000); they need different ports'],
    ['stateFile empty', (d) => (d.stateFile = ''), 'stateFile: "" is not a file path'],
    ['services missing', (d) => delete d.services, 'services: missing; expected a list of services'],
    ['services empty', (d) => (d.services = []), 'services: an empty list; expected at least one service'],
    ['services a mapping', (d) => (d.services = { web: {} }), 'services: expected a list of services, got a mapping'],
  ])('%s', (_name, change, expected) => {
    expect(problemsWith(change)).toEqual([expected]);
  });
});

describe('service rules', () => {
  it.each<[string, (service: Doc) => void, string]>([
    ['vip missing', (s) => delete s.vip, 'services[0].vip: missing; expected an IPv4 or IPv6 address'],
    ['vip invalid', (s) => (s.vip = '203.0.113.300'), 'services[0].vip: "203.0.113.300" is not an IPv4 or IPv6 address'],
    ['vip short form', (s) => (s.vip = '10.1'), 'services[0].vip: "10.1" is not an IPv4 or IPv6 address'],
    ['vip with zone', (s) => (s.vip = 'fe80::1%eth0'), 'services[0].vip: "fe80::1%eth0" is not an IPv4 or IPv6 address (zone indexes such as %eth0 are not supported)'],
    ['vip unspecified', (s) => (s.vip = '0.0.0.0'), 'services[0].vip: "0.0.0.0" is the unspecified address; a VIP must be a unicast address reachable on the network'],
    ['vip multicast', (s) => (s.vip = 'ff02::1'), 'services[0].vip: "ff02::1" is a multicast address; a VIP must be a unicast address reachable on the network'],
    ['vip IPv6 link-local', (s) => (s.vip = 'fe80::10'), 'services[0].vip: "fe80::10" is an IPv6 link-local address (it needs a zone); a VIP must be a unicast address reachable on the network'],
    ['vip IPv4-mapped', (s) => (s.vip = '::ffff:203.0.113.10'), 'services[0].vip: "::ffff:203.0.113.10" is an IPv4-mapped IPv6 address; write the IPv4 address 203.0.113.10'],
    ['port missing', (s) => delete s.port, 'services[0].port: missing; expected a port (0..65535)'],
    ['port too big', (s) => (s.port = 70000), 'services[0].port: 70000 is not a port (0..65535)'],
    ['port negative', (s) => (s.port = -1), 'services[0].port: -1 is not a port (0..65535)'],
    ['protocol', (s) => (s.protocol = 'sctp'), 'services[0].protocol: "sctp" is not tcp or udp'],
    ['scheduler', (s) => (s.scheduler = 'roundrobin'), 'services[0].scheduler: "roundrobin" is not maglev, rendezvous or wlc'],
    ['forwarding', (s) => (s.forwarding = 'nat'), 'services[0].forwarding: "nat" is not l2 or ipip'],
    ['whenAllDown', (s) => (s.whenAllDown = 'failopen'), 'services[0].whenAllDown: "failopen" is not failOpen or drop (did you mean "failOpen"?)'],
    ['onRealDown', (s) => (s.onRealDown = 'move'), 'services[0].onRealDown: "move" is not reschedule or keep'],
    ['persistence', (s) => (s.persistence = 'source'), 'services[0].persistence: "source" is not none or client'],
    ['persistence client with wlc', (s) => {
      s.persistence = 'client';
      s.scheduler = 'wlc';
    }, "services[0].persistence: client persistence needs scheduler maglev or rendezvous: wlc places each connection by load, so a client's connections would go to different reals"],
    ['persistencePrefix without persistence', (s) => (s.persistencePrefix = 24), 'services[0].persistencePrefix: 24 is set but persistence is none; add persistence: client, or leave persistencePrefix out'],
    ['persistencePrefix too long for IPv4', (s) => {
      s.persistence = 'client';
      s.persistencePrefix = 64;
    }, 'services[0].persistencePrefix: 64 is not a prefix length of an IPv4 client address (1..32)'],
    ['persistencePrefix too long for IPv6', (s) => {
      s.vip = '2001:db8::10';
      s.reals = [{ address: '2001:db8::11' }];
      s.persistence = 'client';
      s.persistencePrefix = 129;
    }, 'services[0].persistencePrefix: 129 is not a prefix length of an IPv6 client address (1..128)'],
    ['ops on a TCP service', (s) => (s.ops = true), 'services[0].ops: one-packet scheduling is for UDP services: the packets of a TCP connection must all reach one real'],
    ['ops with wlc', (s) => {
      s.protocol = 'udp';
      s.scheduler = 'wlc';
      s.ops = true;
    }, 'services[0].ops: one-packet scheduling needs scheduler maglev or rendezvous: wlc places by the flow counts a service without flow entries never has'],
    ['ops not a flag', (s) => (s.ops = 'yes'), 'services[0].ops: "yes" is not true or false'],
    ['persistencePrefix 0', (s) => {
      s.persistence = 'client';
      s.persistencePrefix = 0;
    }, 'services[0].persistencePrefix: 0 is not a prefix length of an IPv4 client address (1..32)'],
    ['name empty', (s) => (s.name = ''), 'services[0].name: "" is not a service name (non-empty, no leading or trailing spaces, no control characters)'],
    ['name ..', (s) => (s.name = '..'), `services[0].name: ".." is not a service name: the admin API's paths cannot carry it`],
    ['name .', (s) => (s.name = '.'), `services[0].name: "." is not a service name: the admin API's paths cannot carry it`],
    ['name a number', (s) => (s.name = 7), 'services[0].name: 7 is not a service name (a string)'],
    ['tableSize not prime', (s) => (s.tableSize = 65536), 'services[0].tableSize: 65536 is not a prime; Maglev needs a prime table size (e.g. 65537)'],
    ['tableSize too small', (s) => (s.tableSize = 5), 'services[0].tableSize: 5 is not a Maglev table size (7..10000019)'],
    ['tableSize too big', (s) => (s.tableSize = 10000079), 'services[0].tableSize: 10000079 is not a Maglev table size (7..10000019)'],
    ['tableSize under the real count', (s) => {
      s.tableSize = 7;
      s.reals = Array.from({ length: 8 }, (_, i) => ({ address: `10.0.1.${i + 1}` }));
    }, 'services[0].tableSize: 7 is smaller than the number of reals (8); Maglev needs at least one slot per real'],
    ['tableSize with rendezvous', (s) => {
      s.scheduler = 'rendezvous';
      s.tableSize = 65537;
    }, 'services[0].tableSize: applies only to the maglev and wlc schedulers, which keep a Maglev table (scheduler is rendezvous)'],
    ['reals missing', (s) => delete s.reals, 'services[0].reals: missing; expected a list of reals (write [] for none yet)'],
    ['reals empty value', (s) => (s.reals = null), 'services[0].reals: is empty; expected a list of reals (write [] for none yet)'],
    ['reals not a list', (s) => (s.reals = '10.0.1.11'), 'services[0].reals: expected a list of reals, got "10.0.1.11"'],
  ])('%s', (_name, change, expected) => {
    expect(problemsWith((doc) => change(doc.services[0]))).toEqual([expected]);
  });

  it('client persistence: the prefix defaults to the whole client address of the VIP\'s family', () => {
    const with_ = (extra: Doc): Doc => {
      const d = minimal();
      Object.assign(d.services[0], extra);
      return d;
    };
    const v4 = configOf(with_({ persistence: 'client' })).services[0]!;
    expect([v4.persistence, v4.persistencePrefix]).toEqual(['client', 32]);
    const six = { vip: '2001:db8::10', persistence: 'client', reals: [{ address: '2001:db8::11' }] };
    const v6 = configOf(with_(six)).services[0]!;
    expect([v6.persistence, v6.persistencePrefix]).toEqual(['client', 128]);
    expect(configOf(with_({ ...six, persistencePrefix: 48 })).services[0]!.persistencePrefix).toBe(48);
  });

  it('a service entry that is not a mapping', () => {
    expect(problemsWith((doc) => doc.services.push('web'))).toEqual(['services[1]: expected a mapping with vip, port and reals, got "web"']);
  });

  it('two services on the same vip, protocol and port', () => {
    const lines = problemsWith((doc) => doc.services.push({ name: 'again', vip: '203.0.113.10', port: 80, protocol: 'tcp', reals: [] }));
    expect(lines).toEqual(['services[1]: tcp://203.0.113.10:80 is already defined by services[0] ("tcp://203.0.113.10:80")']);
  });

  it('the same address and port for tcp and udp is two services', () => {
    const doc = minimal();
    doc.services.push({ vip: '203.0.113.10', port: 80, protocol: 'udp', reals: [] });
    expect(configOf(doc).services.map((service) => service.name)).toEqual(['tcp://203.0.113.10:80', 'udp://203.0.113.10:80']);
  });

  it('duplicate IPv6 services are found through the canonical form', () => {
    const doc = minimal();
    doc.services = [
      { name: 'a', vip: '2001:db8::10', port: 443, reals: [] },
      { name: 'b', vip: '2001:DB8:0::0:10', port: 443, reals: [] },
    ];
    const result = parse(doc);
    expect(result.ok).toBe(false);
    expect(result.ok ? [] : pathMessages(result.problems)).toEqual(['services[1]: tcp://[2001:db8::10]:443 is already defined by services[0] ("a")']);
  });

  it('duplicate names', () => {
    const lines = problemsWith((doc) => {
      doc.services[0].name = 'web';
      doc.services.push({ name: 'web', vip: '203.0.113.11', port: 80, reals: [] });
    });
    expect(lines).toEqual(['services[1].name: "web" is already the name of services[0]']);
  });

  it('duplicate names where the first service has a problem of its own: both said in one run', () => {
    const lines = problemsWith((doc) => {
      doc.services[0].name = 'web';
      doc.services[0].protocol = 'sctp';
      doc.services.push({ name: 'web', vip: '203.0.113.11', port: 80, reals: [] });
    });
    expect(lines).toContain('services[1].name: "web" is already the name of services[0]');
    expect(lines.some((l) => l.startsWith('services[0].protocol: '))).toBe(true);
  });

  it('a name that is the address of another service', () => {
    const lines = problemsWith((doc) => doc.services.push({ name: 'tcp://203.0.113.10:80', vip: '203.0.113.11', port: 80, reals: [] }));
    expect(lines).toEqual(['services[1].name: "tcp://203.0.113.10:80" is the address of services[0]; choose another name']);
  });

  // Names are matched before addresses (CLI, admin API): a name that reads as an address in any
  // spelling would take that address over.
  it.each([
    ['TCP://203.0.113.10:80', '203.0.113.10'],
    ['tcp://203.0.113.10:080', '203.0.113.10'],
    ['Tcp://[2001:DB8::10]:80', '2001:db8::10'],
    ['tcp://[2001:db8:0::0:10]:80', '2001:db8::10'],
  ])('a name that is the address of another service in another spelling: %s', (name, vip) => {
    const lines = problemsWith((doc) => {
      doc.services[0].vip = vip;
      doc.services[0].reals = [];
      doc.services.push({ name, vip: '203.0.113.11', port: 80, reals: [] });
    });
    expect(lines).toEqual([`services[1].name: ${JSON.stringify(name)} is the address of services[0]; choose another name`]);
  });

  it("a name that is the service's own address, written another way", () => {
    const lines = problemsWith((doc) => (doc.services[0].name = 'TCP://203.0.113.10:80'));
    expect(lines).toEqual(['services[0].name: "TCP://203.0.113.10:80" is this service\'s address written another way; write it as "tcp://203.0.113.10:80" or choose another name']);
  });

  it('a name that is a service address no service has', () => {
    const lines = problemsWith((doc) => (doc.services[0].name = 'udp://198.51.100.1:53'));
    expect(lines).toEqual(['services[0].name: "udp://198.51.100.1:53" is written as a service address, but this service is tcp://203.0.113.10:80; choose another name']);
  });

  it("the service's own canonical address, and names that only look like URLs, are names", () => {
    const doc = minimal();
    doc.services[0].name = 'tcp://203.0.113.10:80';
    doc.services.push({ name: 'tcp://web:80', vip: '203.0.113.11', port: 80, reals: [] });
    doc.services.push({ name: 'http://203.0.113.12:80', vip: '203.0.113.12', port: 80, reals: [] });
    doc.services.push({ name: 'udp://[2001:db8::10]:0', vip: '2001:DB8::10', port: 0, protocol: 'udp', reals: [] });
    expect(configOf(doc).services.map((service) => service.name)).toEqual(['tcp://203.0.113.10:80', 'tcp://web:80', 'http://203.0.113.12:80', 'udp://[2001:db8::10]:0']);
  });
});

describe('health-check rules', () => {
  const at = 'services[0].healthCheck';
  it.each<[string, unknown, string]>([
    ['not a mapping', 'http', `${at}: expected a mapping with a type (tcp, http, https, udp, icmp, exec, none), got "http"`],
    ['type missing', { port: 80 }, `${at}.type: missing; expected one of tcp, http, https, udp, icmp, exec, none`],
    ['type unknown', { type: 'grpc' }, `${at}.type: "grpc" is not tcp, http, https, udp, icmp, exec or none`],
    ['port zero', { type: 'tcp', port: 0 }, `${at}.port: 0 is not a health-check port (1..65535)`],
    ['path without slash', { type: 'http', path: 'healthz' }, `${at}.path: "healthz" is not a URL path (it must start with "/" and have no spaces)`],
    ['path with space', { type: 'http', path: '/a b' }, `${at}.path: "/a b" is not a URL path (it must start with "/" and have no spaces)`],
    ['status out of range', { type: 'http', expectStatus: [200, 700] }, `${at}.expectStatus[1]: 700 is not an HTTP status (100..599)`],
    ['status quoted', { type: 'http', expectStatus: ['200'] }, `${at}.expectStatus[0]: "200" is not an HTTP status (100..599)`],
    ['status list empty', { type: 'http', expectStatus: [] }, `${at}.expectStatus: an empty list; expected at least one HTTP status, e.g. [200]`],
    ['host with space', { type: 'http', host: 'a b' }, `${at}.host: "a b" is not a Host header value`],
    ['expectBody empty', { type: 'http', expectBody: '' }, `${at}.expectBody: "" is not a non-empty body substring`],
    ['payload a number', { type: 'udp', payload: 7 }, `${at}.payload: 7 is not a UDP payload string; put it in quotes`],
    ['exec without command', { type: 'exec' }, `${at}.command: missing; an exec check needs a command (run with /bin/sh -c)`],
    ['exec blank command', { type: 'exec', command: '  ' }, `${at}.command: "  " is not a shell command`],
    ['timeout above interval', { type: 'tcp', interval: '1s', timeout: '1500ms' }, `${at}.timeout: 1500ms is longer than the interval (1s); a probe must end before the next one starts`],
    ['default timeout above a short interval', { type: 'tcp', interval: '500ms' }, `${at}.timeout: 1s is longer than the interval (500ms); a probe must end before the next one starts`],
    ['interval bad', { type: 'tcp', interval: 'often' }, `${at}.interval: "often" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)`],
    ['rise zero', { type: 'tcp', rise: 0 }, `${at}.rise: 0 is not a success count (1..100)`],
    ['fall too big', { type: 'tcp', fall: 101 }, `${at}.fall: 101 is not a failure count (1..100)`],
    ['path on a tcp check', { type: 'tcp', path: '/healthz' }, `${at}.path: applies only to http and https checks (type is tcp)`],
    ['command on an http check', { type: 'http', command: 'true' }, `${at}.command: applies only to exec checks (type is http)`],
    ['port on an icmp check', { type: 'icmp', port: 80 }, `${at}.port: applies only to tcp, http, https, udp and exec checks (type is icmp)`],
    ['payload on a tcp check', { type: 'tcp', payload: 'x' }, `${at}.payload: applies only to udp checks (type is tcp)`],
  ])('%s', (_name, check, expected) => {
    expect(problemsWith((doc) => (doc.services[0].healthCheck = check))).toEqual([expected]);
  });

  it.each([['tcp', 'a'], ['http', 'an'], ['https', 'an'], ['udp', 'a']])('a %s check on a port-0 service needs a port', (type, article) => {
    const lines = problemsWith((doc) => {
      doc.services[0].port = 0;
      doc.services[0].healthCheck = { type };
    });
    expect(lines).toEqual([`${at}.port: missing; ${article} ${type} check needs a port because the service port is 0 (every port)`]);
  });

  it('checks every value of a check switched off with type none, as if it were on', () => {
    const lines = problemsWith((doc) => {
      doc.services[0].healthCheck = { type: 'none', interval: 'xx', timeout: -1, rise: 0, fall: 'abc', path: 'nope', expectStatus: 999, port: 0, command: 7 };
    });
    expect(lines).toEqual([
      `${at}.port: 0 is not a health-check port (1..65535)`,
      `${at}.path: "nope" is not a URL path (it must start with "/" and have no spaces)`,
      `${at}.expectStatus: 999 is not an HTTP status (100..599)`,
      `${at}.command: 7 is not a shell command; put it in quotes`,
      `${at}.interval: "xx" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)`,
      `${at}.timeout: -1 is not a positive duration`,
      `${at}.rise: 0 is not a success count (1..100)`,
      `${at}.fall: "abc" is not a failure count (1..100)`,
    ]);
  });

  it('lets a check switched off keep keys of any type, but not keys of no type, nor a timeout past its interval', () => {
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { type: 'none', path: '/h', payload: 'x', command: 'true', port: 8080 }))).toEqual([]);
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { type: 'none', bogus: 1 }))).toEqual([
      `${at}.bogus: unknown key (expected one of type, port, path, host, expectStatus, expectBody, payload, expectPayload, command, interval, timeout, rise, fall)`,
    ]);
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { type: 'none', interval: '500ms' }))).toEqual([
      `${at}.timeout: 1s is longer than the interval (500ms); a probe must end before the next one starts`,
    ]);
  });

  it('still checks the other values when the type is unknown or missing', () => {
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { type: 'grpc', interval: 'xx', rise: 0, bogus: 1 }))).toEqual([
      expect.stringMatching(/^services\[0\]\.healthCheck\.bogus: unknown key/),
      `${at}.type: "grpc" is not tcp, http, https, udp, icmp, exec or none`,
      `${at}.interval: "xx" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)`,
      `${at}.rise: 0 is not a success count (1..100)`,
    ]);
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { interval: 'xx', rise: 0 }))).toEqual([
      `${at}.type: missing; expected one of tcp, http, https, udp, icmp, exec, none`,
      `${at}.interval: "xx" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)`,
      `${at}.rise: 0 is not a success count (1..100)`,
    ]);
  });

  it('makes no rule of an unknown type: no port demanded on a port-0 service, no key refused as inapplicable', () => {
    const lines = problemsWith((doc) => {
      doc.services[0].port = 0;
      doc.services[0].healthCheck = { type: 'HTTP', path: '/h', command: 'true' };
    });
    expect(lines).toEqual([`${at}.type: "HTTP" is not tcp, http, https, udp, icmp, exec or none (did you mean "http"?)`]);
  });

  it('reports a key refused for its type once, without also judging its value', () => {
    expect(problemsWith((doc) => (doc.services[0].healthCheck = { type: 'tcp', payload: 7, path: 'nope' }))).toEqual([
      `${at}.path: applies only to http and https checks (type is tcp)`,
      `${at}.payload: applies only to udp checks (type is tcp)`,
    ]);
  });
});

describe('real rules', () => {
  const at = 'services[0].reals';
  it.each<[string, (reals: Doc[], service: Doc) => void, string]>([
    ['address invalid', (r) => (r[1]!.address = '10.0.1.300'), `${at}[1].address: "10.0.1.300" is not an IPv4 or IPv6 address`],
    ['address missing', (r) => delete r[0]!.address, `${at}[0].address: missing; expected an IPv4 or IPv6 address`],
    ['address a number', (r) => (r[0]!.address = 10), `${at}[0].address: 10 is not an IPv4 or IPv6 address`],
    ['address loopback', (r) => (r[0]!.address = '127.0.0.1'), `${at}[0].address: "127.0.0.1" is a loopback address; a real must be a unicast address reachable on the network`],
    ['address broadcast', (r) => (r[0]!.address = '255.255.255.255'), `${at}[0].address: "255.255.255.255" is the broadcast address; a real must be a unicast address reachable on the network`],
    ['real a plain string', (r) => (r[0] = '10.0.1.11' as unknown as Doc), `${at}[0]: expected a mapping with an address, got "10.0.1.11"`],
    ['weight too big', (r) => (r[0]!.weight = 65536), `${at}[0].weight: 65536 is not a weight (0..65535)`],
    ['weight negative', (r) => (r[0]!.weight = -1), `${at}[0].weight: -1 is not a weight (0..65535)`],
    ['state', (r) => (r[0]!.state = 'draining'), `${at}[0].state: "draining" is not active, drain or disabled`],
    ['forwarding override', (r) => (r[0]!.forwarding = 'dr'), `${at}[0].forwarding: "dr" is not l2 or ipip`],
    ['duplicate address', (r) => (r[1]!.address = '10.0.1.11'), `${at}[1].address: "10.0.1.11" is the same address as ${at}[0]`],
    ['duplicate IPv6 address in another spelling', (r, s) => {
      s.vip = '2001:db8::10';
      r[0]!.address = '2001:db8::11';
      r[1]!.address = '2001:DB8:0:0::11';
    }, `${at}[1].address: "2001:DB8:0:0::11" is the same address as ${at}[0]`],
    ['address equals the VIP', (r) => (r[0]!.address = '203.0.113.10'), `${at}[0].address: "203.0.113.10" is the VIP itself; a real must be another host`],
    ['IPv6 l2 real for an IPv4 VIP', (r) => (r[0]!.address = '2001:db8::11'), `${at}[0].address: "2001:db8::11" is IPv6 but the VIP 203.0.113.10 is IPv4; l2 forwarding needs the same family (ipip can carry IPv4 in IPv6)`],
    ['IPv6 real under an ipip service inherits ipip and passes, l2 override does not', (r, s) => {
      s.forwarding = 'ipip';
      r[0]!.address = '2001:db8::11';
      r[1]!.address = '2001:db8::12';
      r[1]!.forwarding = 'l2';
    }, `${at}[1].address: "2001:db8::12" is IPv6 but the VIP 203.0.113.10 is IPv4; l2 forwarding needs the same family (ipip can carry IPv4 in IPv6)`],
    ['IPv4 ipip real for an IPv6 VIP', (r, s) => {
      s.vip = '2001:db8::10';
      s.forwarding = 'ipip';
      r[1]!.address = '2001:db8::12';
    }, `${at}[0].address: "10.0.1.11" is IPv4 but the VIP 2001:db8::10 is IPv6; an IPv6 VIP needs IPv6 reals`],
  ])('%s', (_name, change, expected) => {
    expect(problemsWith((doc) => change(doc.services[0].reals, doc.services[0]))).toEqual([expected]);
  });
});

describe('backup reals', () => {
  it('refuses a service whose reals are all backups (it would run on them for good), naming the list', () => {
    expect(problemsWith((doc) => {
      for (const r of doc.services[0].reals) r.backup = true;
    })).toEqual([
      'services[0].reals: every real is a backup (backup: true): backups take new flows only while no other real can, so the service would always run on them (status ON_BACKUPS, alert DsrlbServiceOnBackups); make at least one a primary (backup: false)',
    ]);
    // One primary is enough, a disabled one too (the backups then take over, as intended).
    expect(problemsWith((doc) => {
      for (const r of doc.services[0].reals) r.backup = true;
      doc.services[0].reals[0].backup = false;
      doc.services[0].reals[0].state = 'disabled';
    })).toEqual([]);
  });
});

describe('unknown keys', () => {
  it('hints at a near key', () => {
    expect(problemsWith((doc) => (doc.services[0].schedular = 'maglev'))).toEqual(['services[0].schedular: unknown key (did you mean "scheduler"?)']);
  });

  it('hints at a key in another case', () => {
    expect(problemsWith((doc) => (doc.flowTable = { udptimeout: '5s' }))).toEqual(['flowTable.udptimeout: unknown key (did you mean "udpTimeout"?)']);
  });

  it('lists the known keys when nothing is close', () => {
    expect(problemsWith((doc) => (doc.services[0].reals[0].sorry = true))).toEqual([
      'services[0].reals[0].sorry: unknown key (expected one of address, weight, state, forwarding, backup)',
    ]);
  });

  it('is found in every mapping', () => {
    const lines = problemsWith((doc) => {
      doc.interfce = 'eth0';
      doc.admin = { tokenfile: '/x' };
      doc.services[0].healthCheck = { type: 'tcp', intervall: '2s' };
      doc.flowTable = { tcpTimeouts: { synn: '1s' } };
    });
    expect(lines).toEqual([
      'interfce: unknown key (did you mean "interface"?)',
      'flowTable.tcpTimeouts.synn: unknown key (did you mean "syn"?)',
      'admin.tokenfile: unknown key (did you mean "tokenFile"?)',
      'services[0].healthCheck.intervall: unknown key (did you mean "interval"?)',
    ]);
  });

  // One problem per line: a key is shown as written only when it is a plain word; otherwise quoted,
  // escaped and cut like any value, so it can neither break the line nor reach the terminal raw.
  it.each<[string, (doc: Doc) => void, string]>([
    ['a newline', (d) => (d['bad\nkey: x'] = 1), '"bad\\nkey: x": unknown key'],
    ['a BEL byte', (d) => (d.services[0]['port\u0007'] = 1), 'services[0]."port\\u0007": unknown key (did you mean "port"?)'],
    ['DEL and a C1 control', (d) => (d.admin = { 'a\u007fb\u009bc': 1 }), 'admin."a\\u007fb\\u009bc": unknown key'],
    ['a line separator', (d) => (d.flowTable = { 'x\u2028y': 1 }), 'flowTable."x\\u2028y": unknown key'],
    ['a space and a dot', (d) => (d.services[0].reals[0]['my.weight is'] = 1), 'services[0].reals[0]."my.weight is": unknown key'],
    ['the empty key', (d) => (d[''] = 1), '"": unknown key'],
    ['a long key', (d) => (d['k'.repeat(500)] = 1), `"${'k'.repeat(60)}"... (500 characters): unknown key`],
  ])('an odd key is quoted in the path: %s', (_name, change, start) => {
    const lines = problemsWith(change);
    expect(lines).toHaveLength(1);
    expect(lines[0]!.startsWith(start)).toBe(true);
    expect(lines[0]).not.toMatch(/[\x00-\x1f\x7f-\x9f\u2028\u2029]/);
  });

  it('plain keys keep their path as written (letters, digits, _ and -)', () => {
    expect(problemsWith((doc) => (doc['health-check'] = 1))).toEqual(['health-check: unknown key (expected one of interface, io, ring, workers, cpus, hashSeed, flowTable, tunnel, metrics, admin, stateFile, announce, services)']);
    expect(problemsWith((doc) => (doc.services[0].reals[0].weight_2 = 1))[0]).toMatch(/^services\[0\]\.reals\[0\]\.weight_2: unknown key/);
  });

  it('an odd key in the admin section is quoted for the admin commands too', () => {
    const result = validateAdminSettings({ admin: { 'tokenFile\r\n': 'x' } });
    expect(result.ok ? [] : pathMessages(result.problems)).toEqual(['admin."tokenFile\\r\\n": unknown key (did you mean "tokenFile"?)']);
  });

  it('a value with DEL or C1 controls is shown escaped', () => {
    expect(problemsWith((doc) => (doc.interface = 7))).toEqual(['interface: 7 is not a network interface name, e.g. eth0']);
    const lines = problemsWith((doc) => (doc.services[0].protocol = 'tcp\u007f\u0085'));
    expect(lines).toEqual(['services[0].protocol: "tcp\\u007f\\u0085" is not tcp or udp']);
  });

  it('closestKey keeps distance-2 hints from matching unrelated short keys', () => {
    expect(closestKey('ip', ['io', 'interface'])).toBe('io');
    expect(closestKey('xy', ['io'])).toBeNull();
    expect(closestKey('PORT', ['port'])).toBe('port');
    expect(closestKey('weigth', ['address', 'weight'])).toBe('weight');
  });
});

describe('misplaced keys', () => {
  it.each<[string, (doc: Doc) => void, string]>([
    ['a health-check key directly under a service', (d) => (d.services[0].interval = '2s'), 'services[0].interval: unknown key; it belongs under healthCheck'],
    ['host under a service, not taken for a typo of port', (d) => (d.services[0].host = 'www'), 'services[0].host: unknown key; it belongs under healthCheck'],
    ['a real key directly under a service', (d) => (d.services[0].weight = 10), 'services[0].weight: unknown key; it belongs under each real in reals'],
    ['a health-check key under a real', (d) => (d.services[0].reals[0].rise = 2), "services[0].reals[0].rise: unknown key; it belongs under the service's healthCheck"],
    ['a port under a real', (d) => (d.services[0].reals[0].port = 8080), "services[0].reals[0].port: unknown key; a real serves the service's own port on the VIP (DSR cannot translate ports)"],
    ['a service key at the top', (d) => (d.vip = '203.0.113.10'), 'vip: unknown key; it belongs under each service in services'],
    ['a flow-table key at the top', (d) => (d.udpTimeout = '30s'), 'udpTimeout: unknown key; it belongs under flowTable'],
    ['a TCP timeout directly under flowTable', (d) => (d.flowTable = { syn: '30s' }), 'flowTable.syn: unknown key; it belongs under flowTable.tcpTimeouts'],
    ['listen at the top', (d) => (d.listen = '127.0.0.1:9743'), 'listen: unknown key; it belongs under metrics or admin'],
  ])('%s', (_name, change, expected) => {
    expect(problemsWith(change)).toEqual([expected]);
  });
});

describe('VIPs are neither reals nor tunnel sources', () => {
  function twoServices(doc: Doc): void {
    doc.services.push({ name: 'dns', vip: '203.0.113.20', port: 53, protocol: 'udp', reals: [{ address: '10.0.1.21' }] });
  }

  it('refuses a real that is another service\'s VIP, before or after it in the file', () => {
    expect(problemsWith((doc) => {
      twoServices(doc);
      doc.services[0].reals[1].address = '203.0.113.20';
      doc.services[1].reals.push({ address: '203.0.113.10' });
    })).toEqual([
      'services[0].reals[1].address: "203.0.113.20" is the VIP of services[1] ("dns"); traffic to a VIP goes to the load balancer, so this real could never be reached',
      'services[1].reals[1].address: "203.0.113.10" is the VIP of services[0]; traffic to a VIP goes to the load balancer, so this real could never be reached',
    ]);
  });

  it('names a real equal to its own VIP once, even when another service shares that VIP', () => {
    expect(problemsWith((doc) => {
      doc.services.push({ vip: '203.0.113.10', port: 53, protocol: 'udp', reals: [] });
      doc.services[0].reals[0].address = '203.0.113.10';
    })).toEqual(['services[0].reals[0].address: "203.0.113.10" is the VIP itself; a real must be another host']);
  });

  it('refuses a tunnel source that is a VIP, in either family', () => {
    expect(problemsWith((doc) => {
      twoServices(doc);
      doc.services.push({ vip: '2001:DB8::10', port: 80, reals: [] });
      doc.tunnel = { sourceV4: '203.0.113.20', sourceV6: '2001:db8::10' };
    })).toEqual([
      'tunnel.sourceV4: "203.0.113.20" is the VIP of services[1] ("dns"); the outer source must be an address of the load balancer that is not a VIP (real servers hold the VIPs on lo and drop packets from them)',
      'tunnel.sourceV6: "2001:db8::10" is the VIP of services[2]; the outer source must be an address of the load balancer that is not a VIP (real servers hold the VIPs on lo and drop packets from them)',
    ]);
  });
});

describe('message wording', () => {
  it('names several packet loops under io pcap without repeating the value after the path', () => {
    expect(problemsWith((d) => { d.io = 'pcap'; d.workers = 4; })).toEqual(['workers: 4 packet loops need io: afpacket; io: pcap runs one']);
  });

  it('shows at most about 60 characters of a long or binary value, with its length', () => {
    const garbage = '\uFFFD\uFFFDPNG\u0001\u0002' + '\uFFFD'.repeat(730);
    const [line] = problemsOfText(garbage);
    expect(line).toBe(
      `(file): expected a mapping with at least interface and services, got "\uFFFD\uFFFDPNG\\u0001\\u0002${'\uFFFD'.repeat(43)}"... (737 characters)`,
    );
    expect(problemsWith((d) => (d.interface = 'x'.repeat(100)))).toEqual([
      `interface: "${'x'.repeat(60)}"... (100 characters) is not a network interface name (1..15 characters, no "/", ":" or whitespace)`,
    ]);
    expect(problemsWith((d) => (d.services[0].vip = 'y'.repeat(61)))).toEqual([`services[0].vip: "${'y'.repeat(60)}"... (61 characters) is not an IPv4 or IPv6 address`]);
    expect(problemsWith((d) => (d.services[0].vip = 'y'.repeat(60)))).toEqual([`services[0].vip: "${'y'.repeat(60)}" is not an IPv4 or IPv6 address`]);
  });
});

describe('many problems at once', () => {
  it('reports every problem in file order, not just the first', () => {
    const text = `
interface: ""
io: xdp
flowTable: { capacity: 0 }
services:
  - vip: 10.0.0.300
    port: 70000
    schedular: maglev
    healthCheck: { type: http, path: nope, timeout: 5s }
    reals:
      - address: 10.0.1.300
      - { address: 10.0.1.1, weight: -3, state: up }
`;
    expect(problemsOfText(text)).toEqual([
      'interface: "" is not a network interface name, e.g. eth0',
      'io: "xdp" is not afpacket or pcap',
      'flowTable.capacity: 0 is not a flow table capacity (1..100000000)',
      'services[0].schedular: unknown key (did you mean "scheduler"?)',
      'services[0].vip: "10.0.0.300" is not an IPv4 or IPv6 address',
      'services[0].port: 70000 is not a port (0..65535)',
      'services[0].healthCheck.path: "nope" is not a URL path (it must start with "/" and have no spaces)',
      'services[0].healthCheck.timeout: 5s is longer than the interval (2s); a probe must end before the next one starts',
      'services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address',
      'services[0].reals[1].weight: -3 is not a weight (0..65535)',
      'services[0].reals[1].state: "up" is not active, drain or disabled',
    ]);
  });

  it('checks every service, including after a broken one', () => {
    const lines = problemsWith((doc) => {
      doc.services[0].port = 'http';
      doc.services.push({ vip: 'nope', port: 80, reals: [] }, { vip: '203.0.113.12', port: 80, reals: [{ address: '203.0.113.12' }] });
    });
    expect(lines).toEqual([
      'services[0].port: "http" is not a port (0..65535)',
      'services[1].vip: "nope" is not an IPv4 or IPv6 address',
      'services[2].reals[0].address: "203.0.113.12" is the VIP itself; a real must be another host',
    ]);
  });
});

describe('file-level problems', () => {
  it('reports a YAML syntax error with its line', () => {
    expect(problemsOfText('interface: eth0\nservices:\n  - vip: [1.2.3.4\n')).toEqual([
      expect.stringMatching(/^\(yaml\) line \d+, column \d+: \S/),
    ]);
    const [line] = problemsOfText('interface: eth0\nservices: []\ninterface: eth1\n');
    expect(line).toBe('(yaml) line 3, column 1: the key "interface" is given twice in one mapping (YAML keys must be unique)');
    expect(problemsOfText('interface: eth0\nservices:\n  - name: web\n    "port": 80\n    port: 81\n')).toEqual([
      '(yaml) line 5, column 5: the key "port" is given twice in one mapping (YAML keys must be unique)',
    ]);
    expect(problemsOfText('interface: eth0\n---\nservices: []\n')).toEqual(['(yaml) line 2, column 1: the file holds more than one YAML document']);
    // A list or mapping as a key: said at its place (yaml stringified it, with a warning on stderr).
    expect(problemsOfText('interface: eth0\n? [a, b]\n: 1\nservices: []\n')).toEqual(['(yaml) line 2, column 3: a key must be a plain word or number, not a list or a mapping']);
    expect(problemsOfText('interface: eth0\nservices:\n  - { {a: 1}: 2 }\n')).toEqual(['(yaml) line 3, column 7: a key must be a plain word or number, not a list or a mapping']);
  });

  it('reports an empty file and a non-mapping document', () => {
    expect(problemsOfText('')).toEqual(['(file): the file is empty; expected a mapping with at least interface and services']);
    expect(problemsOfText('- a\n- b\n')).toEqual(['(file): expected a mapping with at least interface and services, got a list']);
  });

  it('formatProblems writes one path: message line each', () => {
    expect(formatProblems([{ path: 'a.b', message: 'x' }, { path: 'c', message: 'y' }])).toBe('a.b: x\nc: y');
    expect(formatProblems([])).toBe('');
  });
});

describe('YAML anchors and merge keys', () => {
  const SHARED = `
interface: eth0
x-check: &check { type: tcp, interval: 2s, fall: 2 }
x-service: &service
  protocol: tcp
  scheduler: rendezvous
  healthCheck: *check
services:
  - <<: *service
    name: web
    vip: 203.0.113.10
    port: 80
    reals: [{ address: 10.0.1.11 }]
  - <<: *service
    name: dns
    protocol: udp
    vip: 203.0.113.10
    port: 53
    reals: [{ address: 10.0.1.12 }]
`;

  it('merges a mapping with <<, its own keys winning, and ignores top-level x- keys', () => {
    const r = parseConfigText(SHARED);
    if (!r.ok) throw new Error(formatProblems(r.problems));
    expect(r.config.services.map((s) => [s.name, s.protocol, s.scheduler, s.healthCheck.type, s.healthCheck.intervalMs, s.healthCheck.fall])).toEqual([
      ['web', 'tcp', 'rendezvous', 'tcp', 2000, 2],
      ['dns', 'udp', 'rendezvous', 'tcp', 2000, 2],
    ]);
  });

  it('checks merged keys where they land, and still refuses other unknown top-level keys', () => {
    expect(problemsOfText(SHARED.replace('scheduler: rendezvous', 'schedular: rendezvous'))).toEqual([
      'services[0].schedular: unknown key (did you mean "scheduler"?)',
      'services[1].schedular: unknown key (did you mean "scheduler"?)',
    ]);
    expect(problemsOfText(SHARED.replace('x-check:', 'check:'))).toEqual([expect.stringMatching(/^check: unknown key/)]);
  });
});

describe('loadConfigFile', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'dsrlb-config-test-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('defaults stateFile to dsrlb.state.json beside the config', async () => {
    const file = join(dir, 'a.yaml');
    await writeFile(file, JSON.stringify(minimal()));
    vi.stubEnv('STATE_DIRECTORY', undefined);
    const result = await loadConfigFile(file);
    vi.unstubAllEnvs();
    expect(result.ok && result.config.stateFile).toBe(join(dir, 'dsrlb.state.json'));
  });

  it('puts the default stateFile in systemd\'s $STATE_DIRECTORY when set (/etc is read-only to the shipped unit); an explicit one wins', async () => {
    const file = join(dir, 'a2.yaml');
    await writeFile(file, JSON.stringify(minimal()));
    vi.stubEnv('STATE_DIRECTORY', '/var/lib/dsrlb:/var/lib/other');
    try {
      const result = await loadConfigFile(file);
      expect(result.ok && result.config.stateFile).toBe('/var/lib/dsrlb/dsrlb.state.json');
      await writeFile(file, JSON.stringify({ ...minimal(), stateFile: 'mine.json' }));
      const explicit = await loadConfigFile(file);
      expect(explicit.ok && explicit.config.stateFile).toBe(join(dir, 'mine.json'));
    } finally {
      vi.unstubAllEnvs();
    }
    expect(stateDirectoryOf({ STATE_DIRECTORY: '' })).toEqual({});
    expect(stateDirectoryOf({ STATE_DIRECTORY: 'relative' })).toEqual({});
    expect(stateDirectoryOf({})).toEqual({});
  });

  it('resolves relative stateFile and tokenFile against the config directory', async () => {
    const file = join(dir, 'b.yaml');
    await writeFile(file, JSON.stringify({ ...minimal(), stateFile: 'state/x.json', admin: { tokenFile: 'token' } }));
    const result = await loadConfigFile(file);
    expect(result.ok && result.config.stateFile).toBe(join(dir, 'state/x.json'));
    expect(result.ok && result.config.admin.tokenFile).toBe(join(dir, 'token'));
  });

  it('keeps an absolute stateFile', async () => {
    const file = join(dir, 'c.yaml');
    await writeFile(file, JSON.stringify({ ...minimal(), stateFile: '/var/lib/dsrlb/state.json' }));
    const result = await loadConfigFile(file);
    expect(result.ok && result.config.stateFile).toBe('/var/lib/dsrlb/state.json');
  });

  it('turns a read error into one (file) problem', async () => {
    const missing = join(dir, 'missing.yaml');
    const result = await loadConfigFile(missing);
    expect(result).toEqual({ ok: false, problems: [{ path: '(file)', message: `cannot read "${missing}": ENOENT: no such file or directory` }] });
  });
});

describe('helpers', () => {
  it('parseDurationMs and formatDurationMs', () => {
    expect(parseDurationMs('250ms')).toEqual({ ok: true, ms: 250 });
    expect(parseDurationMs('2s')).toEqual({ ok: true, ms: 2000 });
    expect(parseDurationMs('15m')).toEqual({ ok: true, ms: 900_000 });
    expect(parseDurationMs('1h')).toEqual({ ok: true, ms: 3_600_000 });
    expect(parseDurationMs(2)).toEqual({ ok: true, ms: 2000 });
    expect(parseDurationMs(0.1)).toEqual({ ok: true, ms: 100 });
    expect(parseDurationMs('2 s').ok).toBe(false);
    expect(parseDurationMs(true)).toEqual({ ok: false, message: 'true is not a duration (e.g. 250ms, 2s, 15m)' });
    expect([1500, 2000, 900_000, 3_600_000, 0].map(formatDurationMs)).toEqual(['1500ms', '2s', '15m', '1h', '0ms']);
  });

  it('parseIpAddress is strict and canonical', () => {
    expect(parseIpAddress('10.0.0.1')).toEqual({ address: '10.0.0.1', family: 4 });
    expect(parseIpAddress('2001:DB8::0:1')).toEqual({ address: '2001:db8::1', family: 6 });
    expect(parseIpAddress('010.0.0.1')).toBeNull();
    expect(parseIpAddress('0x0a.0.0.1')).toBeNull();
    expect(parseIpAddress('fe80::1%eth0')).toBeNull();
    expect(parseIpAddress(' 10.0.0.1')).toBeNull();
  });

  it('parseListenAddress and serviceAddressName', () => {
    expect(parseListenAddress('[::]:80')).toEqual({ host: '::', port: 80 });
    expect(parseListenAddress('0.0.0.0:65535')).toEqual({ host: '0.0.0.0', port: 65535 });
    expect(parseListenAddress('[10.0.0.1]:80')).toBeNull();
    expect(parseListenAddress('::1:80')).toBeNull();
    expect(serviceAddressName('udp', '2001:db8::10', 53)).toBe('udp://[2001:db8::10]:53');
    expect(serviceAddressName('tcp', '203.0.113.10', 0)).toBe('tcp://203.0.113.10:0');
  });
});

describe('announce (scale-out)', () => {
  it('parses the announce section and the per-service switch, with path: message errors', () => {
    const ok = parseConfigText(
      'interface: eth0\nannounce: { enabled: true, routesFile: /run/x/routes.conf, birdSocket: /run/bird.ctl, onFailOpen: false, withdrawDelay: 1s }\n' +
        'services:\n  - vip: 10.0.0.1\n    port: 80\n    announce: false\n    reals: []\n',
    );
    expect(ok.ok).toBe(true);
    if (!ok.ok) return;
    expect(ok.config.announce).toEqual({ enabled: true, routesFile: '/run/x/routes.conf', birdSocket: '/run/bird.ctl', onFailOpen: false, withdrawDelayMs: 1000 });
    expect(ok.config.services[0]!.announce).toBe(false);
    const bad = parseConfigText('interface: eth0\nannounce: { enabled: yes please, onfailopen: true }\nservices:\n  - vip: 10.0.0.1\n    port: 80\n    announce: 1\n    reals: []\n');
    expect(bad.ok).toBe(false);
    if (bad.ok) return;
    const lines = bad.problems.map((p) => `${p.path}: ${p.message}`);
    expect(lines).toContain('announce.enabled: "yes please" is not true or false');
    expect(lines.some((l) => l.startsWith('announce.onfailopen: unknown key (did you mean "onFailOpen"?)'))).toBe(true);
    expect(lines).toContain('services[0].announce: 1 is not true or false');
  });
});
