// dsrlb flows (GET /flows, ipvsadm -Lnc): the loops' flows read from their records, named by
// service and real, filtered by service, real and client, cut at a limit with the count of every
// match, expiry from the state's timeout. The daemon on stand-in loops; the table format apart.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { formatFlows } from '../../src/cli/flows-table.js';
import { addressWords } from '../../src/control/addresses.js';
import { RealRegistry } from '../../src/control/real-registry.js';
import type { FlowBatch } from '../../src/dataplane/flow-handoff.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import { FLOW_RECORD, FlowState } from '../../src/dataplane/flow-table.js';
import type { HealthMonitor } from '../../src/health/health-monitor.js';
import { stubbedDaemon } from '../support/stubbed-daemon.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-flows-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const CONFIG = (extra = ''): string => `interface: eth0
stateFile: ${join(dir, 'state.json')}
flowTable: { tcpTimeouts: { syn: 60s, established: 900s, fin: 120s }, udpTimeout: 300s }
services:
  - { name: web, vip: 10.99.0.100, port: 80, reals: [{ address: 10.0.0.1 }, { address: 10.0.0.2 }] }
  - { name: dns6, vip: "fd00::53", port: 0, protocol: udp, reals: [{ address: "fd00::11" }] }
${extra}`;

interface Flow {
  proto: number;
  family: 4 | 6;
  client: string;
  cport: number;
  vip: string;
  vport: number;
  real: number;
  state: number;
  idleMs: number;
}

/**
 * A stand-in for LoopGroup.flowsNow over `flows`: each flow as a record (the key's words, its real
 * at FLOW_RECORD.real) offered to `keep`, the first `limit` kept in the batch, all counted.
 */
function flowsNowOf(flows: Flow[]) {
  return (keep: ((rec: Int32Array, base: number) => boolean) | null, limit: number): { batch: FlowBatch; matched: number } => {
    const kept = flows.filter((f) => {
      const one = batchOf([f]);
      const rec = new Int32Array(FLOW_RECORD.words);
      rec.set(new Int32Array(one.keys.buffer), 0);
      rec[FLOW_RECORD.real] = f.real;
      return keep === null || keep(rec, 0);
    });
    return { batch: batchOf(kept.slice(0, limit)), matched: kept.length };
  };
}

function batchOf(flows: Flow[]): FlowBatch {
  const keys = new Uint32Array(flows.length * FLOW_KEY_WORDS);
  flows.forEach((f, i) => {
    const k = i * FLOW_KEY_WORDS;
    keys[k] = f.proto | (f.family << 8);
    keys.set(addressWords(f.client), k + 1);
    keys.set(addressWords(f.vip), k + 5);
    keys[k + 9] = ((f.cport << 16) | f.vport) >>> 0;
  });
  return { count: flows.length, keys, reals: Int32Array.from(flows.map((f) => f.real)), states: Uint8Array.from(flows.map((f) => f.state)), idleMs: Float64Array.from(flows.map((f) => f.idleMs)) };
}

function daemonWith(text: string) {
  const { daemon, inside } = stubbedDaemon(join(dir, 'dsrlb.yaml'), text, { activeFlows: 1 });
  (inside.syncReals as () => void).call(daemon);
  daemon.rebuild('start');
  const registry = inside.registry as RealRegistry;
  const id = (service: string, address: string): number => registry.idFor(RealRegistry.keyOf(service, address));
  return { daemon, inside, id, stop: () => (inside.health as HealthMonitor).stop() };
}

describe('dsrlb flows', () => {
  it('lists every loop\'s flows by service and real, with state and expiry, filtered and limited', () => {
    const d = daemonWith(CONFIG());
    try {
      const web1 = d.id('tcp|10.99.0.100|80', '10.0.0.1');
      const web2 = d.id('tcp|10.99.0.100|80', '10.0.0.2');
      const dns = d.id('udp|fd00::53|0', 'fd00::11');
      const flows: Flow[] = [
        { proto: 6, family: 4, client: '198.51.100.7', cport: 40000, vip: '10.99.0.100', vport: 80, real: web1, state: FlowState.established, idleMs: 1500 },
        { proto: 6, family: 4, client: '198.51.100.7', cport: 40001, vip: '10.99.0.100', vport: 80, real: web2, state: FlowState.fin, idleMs: 20_000 },
        { proto: 6, family: 4, client: '198.51.100.8', cport: 40002, vip: '10.99.0.100', vport: 80, real: web1, state: FlowState.syn, idleMs: 0 },
        { proto: 17, family: 6, client: '2001:db8::7', cport: 5353, vip: 'fd00::53', vport: 53, real: dns, state: FlowState.udp, idleMs: 60_000 },
      ];
      d.inside.loops = { ...(d.inside.loops as object), flowsNow: flowsNowOf(flows) };
      const all = d.daemon.flows({ limit: 0 });
      expect(all.total).toBe(4);
      expect(all.flows[0]).toEqual({ protocol: 'tcp', client: '198.51.100.7:40000', vip: '10.99.0.100:80', service: 'web', real: '10.0.0.1', state: 'established', idleMs: 1500, expiresInMs: 898_500 });
      expect(all.flows[3]).toEqual({ protocol: 'udp', client: '[2001:db8::7]:5353', vip: '[fd00::53]:53', service: 'dns6', real: 'fd00::11', state: 'udp', idleMs: 60_000, expiresInMs: 240_000 });
      expect(d.daemon.flows({ service: 'web', limit: 0 }).total).toBe(3);
      expect(d.daemon.flows({ service: 'tcp://10.99.0.100:80', real: '10.0.0.1:80', limit: 0 }).flows.map((f) => f.client)).toEqual(['198.51.100.7:40000', '198.51.100.8:40002']);
      expect(d.daemon.flows({ client: '198.51.100.7', limit: 0 }).flows.map((f) => [f.real, f.state])).toEqual([['10.0.0.1', 'established'], ['10.0.0.2', 'fin']]);
      expect(d.daemon.flows({ real: 'fd00::11', limit: 0 }).total).toBe(1);
      // A port-0 service named with a port, as explain takes it: that port's flows.
      expect(d.daemon.flows({ service: 'udp://[fd00::53]:53', limit: 0 }).total).toBe(1);
      expect(d.daemon.flows({ service: 'udp://[fd00::53]:54', limit: 0 }).total).toBe(0);
      expect(d.daemon.flows({ client: '2001:db8::7', limit: 0 }).flows.map((f) => f.service)).toEqual(['dns6']);
      // A limit cuts the rows, not the count.
      const two = d.daemon.flows({ limit: 2 });
      expect([two.total, two.flows.length]).toEqual([4, 2]);
      // What cannot be found is said as for the other admin commands.
      expect(() => d.daemon.flows({ service: 'nosuch', limit: 0 })).toThrow(/unknown service "nosuch"/);
      expect(() => d.daemon.flows({ service: 'web', real: '10.0.0.9', limit: 0 })).toThrow(/service "web" has no real "10.0.0.9"/);
      expect(() => d.daemon.flows({ client: 'nobody', limit: 0 })).toThrow('client "nobody" is not an IPv4 or IPv6 address, IP:PORT or [IPv6]:PORT');
      // A real no service has is an error, as drain answers it (it listed nothing, exit 0).
      expect(() => d.daemon.flows({ real: '10.0.0.99', limit: 0 })).toThrow(/no service has a real "10.0.0.99"; reals: /);
      // A client with its port (as ipvsadm -Lnc prints a source): that one connection.
      expect(d.daemon.flows({ client: '198.51.100.7:40001', limit: 0 }).flows.map((f) => [f.client, f.real])).toEqual([['198.51.100.7:40001', '10.0.0.2']]);
      expect(d.daemon.flows({ client: '[2001:db8::7]:5353', limit: 0 }).total).toBe(1);
      expect(d.daemon.flows({ client: '[2001:db8::7]:5354', limit: 0 }).total).toBe(0);
      expect(() => d.daemon.flows({ client: '198.51.100.7:70000', limit: 0 })).toThrow(/is not an IPv4 or IPv6 address, IP:PORT/);
      // As ipvsadm -Lnc prints them.
      expect(formatFlows(d.daemon.flows({ service: 'web', limit: 2 }))).toBe(
        [
          'pro expire state       source             virtual        destination service',
          'TCP 14:59  ESTABLISHED 198.51.100.7:40000 10.99.0.100:80 10.0.0.1:80 web',
          'TCP 01:40  FIN_WAIT    198.51.100.7:40001 10.99.0.100:80 10.0.0.2:80 web',
          '2 of 3 flows shown (--limit 0 lists them all)',
          '',
        ].join('\n'),
      );
    } finally {
      d.stop();
    }
  });

  it('lists the flows of a service a reload removed while they drain, under its name', async () => {
    const d = daemonWith(CONFIG('  - { name: old, vip: 10.99.0.101, port: 80, reals: [{ address: 10.0.1.1 }] }\n'));
    try {
      const old = d.id('tcp|10.99.0.101|80', '10.0.1.1');
      d.inside.loops = { ...(d.inside.loops as object), flowsNow: flowsNowOf([{ proto: 6, family: 4, client: '198.51.100.9', cport: 41000, vip: '10.99.0.101', vport: 80, real: old, state: FlowState.established, idleMs: 0 }]) };
      const { writeFileSync } = await import('node:fs');
      writeFileSync(join(dir, 'dsrlb.yaml'), CONFIG());
      expect((await d.daemon.reload()).ok).toBe(true);
      expect(d.daemon.flows({ service: 'old', real: '10.0.1.1:80', limit: 0 }).flows).toEqual([
        { protocol: 'tcp', client: '198.51.100.9:41000', vip: '10.99.0.101:80', service: 'old', real: '10.0.1.1', state: 'established', idleMs: 0, expiresInMs: 900_000 },
      ]);
    } finally {
      d.stop();
    }
  });
});
