// `dsrlb simulate`: the example's golden trace, every scenario validation message, and the
// behaviours a trace must show (adds keep flows, removals drain, health down reschedules, wlc
// balances long flows better than maglev), all through the daemon's own builder, engine and table.

import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { formatProblems } from '../../src/config/validate.js';
import { ipv4HeaderChecksum, l4Checksum } from '../../src/dataplane/checksum.js';
import { parseFrame } from '../../src/dataplane/packet-parser.js';
import { PARSE_OK, ParsedPacket } from '../../src/dataplane/parsed-packet.js';
import { MAX_SIM_FRAME_BYTES, prepareTuple, simRealIdOfFrame, simRealMac, writeFrame } from '../../src/sim/frames.js';
import { loadScenarioFile, parseScenarioText, parseTimeMs } from '../../src/sim/scenario.js';
import { formatSimulation, runSimulateCommand, simulate, type SimulationResult, type TraceRecord } from '../../src/sim/simulate.js';

const EXAMPLE = fileURLToPath(new URL('../../examples/simulate-wlc-vs-maglev.yaml', import.meta.url));
// The committed golden trace. After an intended change to placement or to the trace format,
// regenerate it with: UPDATE_GOLDEN=1 npx vitest run test/unit/simulate.test.ts (and review the diff).
const GOLDEN = fileURLToPath(new URL('../golden/simulate-wlc-vs-maglev.json', import.meta.url));

const CONFIG = `
config:
  services:
    - name: web
      vip: 203.0.113.10
      port: 80
      scheduler: maglev
      reals:
        - address: 10.0.0.11
        - address: 10.0.0.12
        - address: 10.0.0.13
`;

function run(yaml: string): SimulationResult {
  const parsed = parseScenarioText(yaml);
  if (!parsed.ok) throw new Error(formatProblems(parsed.problems));
  return simulate(parsed.scenario);
}

function problems(yaml: string): string[] {
  const parsed = parseScenarioText(yaml);
  if (parsed.ok) return [];
  return parsed.problems.map((p) => `${p.path}: ${p.message}`);
}

/** `count` flows from distinct client ports, all at `at`, each an event line. */
function flows(prefix: string, count: number, at: string, duration: string, extra = ''): string {
  const lines: string[] = [];
  for (let i = 0; i < count; i++) {
    lines.push(`  - { at: ${at}, flow: { id: ${prefix}${i}, client: "198.51.100.${1 + (i % 7)}:${41000 + i * 13}", duration: ${duration}${extra} } }`);
  }
  return lines.join('\n');
}

const recordsOf = (r: SimulationResult, flow: string): TraceRecord[] => r.trace.filter((x) => x['flow'] === flow);
const startOf = (r: SimulationResult, flow: string): TraceRecord => recordsOf(r, flow).find((x) => x['event'] === 'start')!;
const endOf = (r: SimulationResult, flow: string): TraceRecord => recordsOf(r, flow).find((x) => x['event'] === 'end')!;
const packetsOf = (r: SimulationResult, flow: string): TraceRecord[] => recordsOf(r, flow).filter((x) => x['event'] === 'packet');

describe('simulate: the operations example (every control event)', () => {
  const result = (): SimulationResult => {
    const loaded = loadScenarioFile(fileURLToPath(new URL('../../examples/simulate-operations.yaml', import.meta.url)));
    if (!loaded.ok) throw new Error(formatProblems(loaded.problems));
    return simulate(loaded.scenario);
  };

  it('keeps the drained real\'s flows, moves the failed and the disabled real\'s, and sends no new flow to a real that takes none', () => {
    const r = result();
    expect(r.trace.filter((x) => x['event'] !== 'start' && x['event'] !== 'end' && x['event'] !== 'packet').map((x) => x['event'])).toEqual(['intent', 'health', 'addReal', 'health', 'weight', 'removeReal', 'intent']);
    const starts = r.trace.filter((x) => x['event'] === 'start');
    const on = (address: string) => starts.filter((x) => x['real'] === address).map((x) => x['flow']);
    // 10.0.1.12 takes flows until its drain at 5s, none after; they stay on it (no packet record moves them).
    const drained = on('10.0.1.12');
    expect(drained.length).toBeGreaterThan(0);
    for (const f of drained) {
      expect(Number(startOf(r, f as string)['t'])).toBeLessThan(5000);
      expect(packetsOf(r, f as string)).toEqual([]);
      expect(endOf(r, f as string)['real']).toBe('10.0.1.12');
    }
    // 10.0.1.13 is down from 10s to 20s: its flows move at their next packet, and it starts none then.
    const moved = r.trace.filter((x) => x['event'] === 'packet' && x['reason'] === 'rescheduled');
    expect(moved.filter((x) => x['t'] === 11000).length).toBeGreaterThan(0);
    for (const f of starts.filter((x) => Number(x['t']) > 10000 && Number(x['t']) < 20000)) expect(f['real']).not.toBe('10.0.1.13');
    // 10.0.1.14, disabled at 30s: its flow moves with its next packet, and the flow after goes elsewhere.
    const disabledOnes = on('10.0.1.14');
    expect(disabledOnes.length).toBeGreaterThan(0);
    for (const f of disabledOnes) expect(moved.some((x) => x['flow'] === f && x['t'] === 31000)).toBe(true);
    expect(startOf(r, 'f16')['real']).not.toBe('10.0.1.14');
    expect(r.summary.packets.dropped).toBe(0);
  });
});

describe('simulate: the wlc-vs-maglev example', () => {
  it('replays to the committed golden trace, byte for byte', () => {
    const output = runSimulateCommand({ scenario: EXAMPLE });
    expect(output.exitCode).toBe(0);
    expect(output.stderr).toBe('');
    if (process.env['UPDATE_GOLDEN'] === '1') writeFileSync(GOLDEN, output.stdout);
    expect(output.stdout).toBe(readFileSync(GOLDEN, 'utf8'));
    // The same input gives the same bytes on a second run in the same process (no hidden state).
    expect(runSimulateCommand({ scenario: EXAMPLE }).stdout).toBe(output.stdout);
    expect(() => JSON.parse(output.stdout)).not.toThrow();
  });

  it('shows wlc keeping peak active flows per real more even than maglev on the same flows', () => {
    const loaded = loadScenarioFile(EXAMPLE);
    if (!loaded.ok) throw new Error(formatProblems(loaded.problems));
    const { summary } = simulate(loaded.scenario);
    const maglev = summary.services.find((s) => s.name === 'web-maglev')!;
    const wlc = summary.services.find((s) => s.name === 'web-wlc')!;
    expect(maglev.flows).toBe(32);
    expect(wlc.flows).toBe(32);
    expect(maglev.reals.map((r) => r.peakActiveFlows)).toEqual([2, 7, 2, 4]);
    expect(wlc.reals.map((r) => r.peakActiveFlows)).toEqual([4, 3, 3, 3]);
    expect(maglev.peakActiveFlows).toEqual({ max: 7, min: 2 });
    expect(wlc.peakActiveFlows).toEqual({ max: 4, min: 3 });
    expect(wlc.peakActiveFlows.max - wlc.peakActiveFlows.min).toBeLessThan(maglev.peakActiveFlows.max - maglev.peakActiveFlows.min);
    expect(maglev.reals.map((r) => r.flowsStarted).reduce((a, b) => a + b)).toBe(32);
    expect(summary.movedFlows).toBe(0);
    expect(summary.packets.dropped).toBe(0);
    expect(summary.packets.forwarded).toBe(summary.packets.sent);
  });
});

describe('simulate: behaviour', () => {
  it('keeps existing flows on their real when a real is added, while new flows reach it', () => {
    const r = run(`${CONFIG}
events:
${flows('f', 12, '0s', '10s')}
  - { at: 5s, addReal: { service: web, address: 10.0.0.14 } }
${flows('n', 24, '6s', '2s').replaceAll('198.51.100.', '192.0.2.')}
`);
    for (let i = 0; i < 12; i++) {
      const start = startOf(r, `f${i}`);
      const end = endOf(r, `f${i}`);
      expect(packetsOf(r, `f${i}`)).toEqual([]);
      expect(end).toMatchObject({ t: 10_000, real: start['real'], reason: 'flow-table', existingEntry: true, packets: 12 });
    }
    const add = r.trace.find((x) => x['event'] === 'addReal')!;
    expect(add).toMatchObject({ t: 5000, service: 'web', address: '10.0.0.14', weight: 100, candidates: 4 });
    // 3 -> 4 equal reals: a quarter of the table changes owner.
    expect(Math.abs((add['movedSlots'] as number) / 65537 - 0.25)).toBeLessThan(0.01);
    const toNew = Array.from({ length: 24 }, (_, i) => startOf(r, `n${i}`)['real']).filter((x) => x === '10.0.0.14').length;
    expect(toNew).toBeGreaterThan(0);
    expect(r.summary.movedFlows).toBe(0);
  });

  it('gives no movedSlots for a rendezvous service (it has no Maglev table), and the Maglev count for maglev', () => {
    const scenario = (scheduler: string) => `${CONFIG.replace('scheduler: maglev', `scheduler: ${scheduler}`)}
events:
${flows('f', 6, '0s', '4s')}
  - { at: 2s, addReal: { service: web, address: 10.0.0.14 } }
`;
    const add = (r: SimulationResult) => r.trace.find((x) => x['event'] === 'addReal')!;
    const rendezvous = run(scenario('rendezvous'));
    expect(add(rendezvous)).toMatchObject({ t: 2000, service: 'web', address: '10.0.0.14', candidates: 4 });
    expect(add(rendezvous)).not.toHaveProperty('movedSlots');
    expect(rendezvous.summary.movedFlows).toBe(0);
    expect(add(run(scenario('maglev')))['movedSlots']).toBeGreaterThan(0);
  });

  it('drains a removed real: its flows stay on it until they end, new flows never reach it', () => {
    const r = run(`${CONFIG}
events:
${flows('f', 12, '0s', '10s')}
  - { at: 5s, removeReal: { service: web, address: 10.0.0.11 } }
${flows('n', 24, '6s', '2s').replaceAll('198.51.100.', '192.0.2.')}
`);
    const onRemoved = Array.from({ length: 12 }, (_, i) => `f${i}`).filter((f) => startOf(r, f)['real'] === '10.0.0.11');
    expect(onRemoved.length).toBeGreaterThan(0);
    for (const f of onRemoved) {
      expect(packetsOf(r, f)).toEqual([]);
      expect(endOf(r, f)).toMatchObject({ real: '10.0.0.11', reason: 'flow-table', existingEntry: true });
    }
    expect(r.trace.find((x) => x['event'] === 'removeReal')).toMatchObject({ t: 5000, flowEntries: onRemoved.length, candidates: 2 });
    for (let i = 0; i < 24; i++) expect(startOf(r, `n${i}`)['real']).not.toBe('10.0.0.11');
    expect(r.summary.movedFlows).toBe(0);
  });

  it('reschedules the flows of a real whose health goes down at their next packet', () => {
    const r = run(`${CONFIG}
events:
${flows('f', 12, '0s', '10s')}
  - { at: 5s, health: { service: web, address: 10.0.0.12, state: down } }
`);
    const ids = Array.from({ length: 12 }, (_, i) => `f${i}`);
    const onDown = ids.filter((f) => startOf(r, f)['real'] === '10.0.0.12');
    expect(onDown.length).toBeGreaterThan(0);
    for (const f of onDown) {
      // The 5s data packet goes before the 5s health event (running flows first); the 6s one moves.
      const [moved, ...rest] = packetsOf(r, f);
      expect(rest).toEqual([]);
      expect(moved).toMatchObject({ t: 6000, event: 'packet', reason: 'rescheduled', existingEntry: true });
      expect(moved!['real']).not.toBe('10.0.0.12');
      expect(endOf(r, f)).toMatchObject({ real: moved!['real'], reason: 'flow-table', existingEntry: true });
    }
    for (const f of ids.filter((x) => !onDown.includes(x))) expect(packetsOf(r, f)).toEqual([]);
    expect(r.trace.find((x) => x['event'] === 'health')).toMatchObject({ t: 5000, state: 'down', flowEntries: onDown.length, candidates: 2 });
    expect(r.summary.movedFlows).toBe(onDown.length);
    expect(r.summary.services[0]!.movedFlows).toBe(onDown.length);
  });

  it('keeps flows on a drained real and moves them off a disabled one', () => {
    const r = run(`${CONFIG}
events:
${flows('f', 12, '0s', '10s')}
  - { at: 2s, intent: { service: web, address: 10.0.0.11, state: drain } }
  - { at: 4s, intent: { service: web, address: 10.0.0.13, state: disabled } }
`);
    const ids = Array.from({ length: 12 }, (_, i) => `f${i}`);
    for (const f of ids.filter((x) => startOf(r, x)['real'] === '10.0.0.11')) expect(packetsOf(r, f)).toEqual([]);
    const onDisabled = ids.filter((x) => startOf(r, x)['real'] === '10.0.0.13');
    expect(onDisabled.length).toBeGreaterThan(0);
    // Drained .11 takes no new flows, disabled .13 none at all: everything lands on .12.
    for (const f of onDisabled) expect(packetsOf(r, f)[0]).toMatchObject({ t: 5000, real: '10.0.0.12', reason: 'rescheduled' });
  });

  it('drops with whenAllDown: drop and names the drop reason; failOpen keeps forwarding', () => {
    const scenario = (whenAllDown: string): string => `
config:
  services:
    - { name: dns, vip: 203.0.113.53, port: 53, protocol: udp, whenAllDown: ${whenAllDown}, reals: [ { address: 10.0.0.21 } ] }
events:
  - { at: 0s, flow: { id: q, client: "198.51.100.9:5000", duration: 5s } }
  - { at: 2s, health: { service: dns, address: 10.0.0.21, state: down } }
`;
    const dropped = run(scenario('drop'));
    expect(packetsOf(dropped, 'q')).toEqual([{ t: 3000, flow: 'q', event: 'packet', real: null, reason: null, existingEntry: true, drop: 'no_real_available' }]);
    expect(endOf(dropped, 'q')).toMatchObject({ t: 5000, real: null, drop: 'no_real_available', packets: 6 });
    expect(dropped.trace.find((x) => x['event'] === 'health')).toMatchObject({ candidates: 0, dropping: true });
    expect(dropped.summary.droppedByReason).toEqual({ no_real_available: 3 });
    expect(dropped.summary.packets).toEqual({ sent: 6, forwarded: 3, dropped: 3 });

    const open = run(scenario('failOpen'));
    expect(packetsOf(open, 'q')).toEqual([]);
    expect(endOf(open, 'q')).toMatchObject({ real: '10.0.0.21', reason: 'flow-table' });
    expect(open.trace.find((x) => x['event'] === 'health')).toMatchObject({ candidates: 1, failOpen: true });
  });

  it('replays IPv6 UDP flows to a port-0 service: datagrams at the packet rate, the last at the end', () => {
    const r = run(`
config:
  services:
    - { name: any6, vip: "2001:db8::10", port: 0, protocol: udp, scheduler: rendezvous, reals: [ { address: "2001:db8::21" }, { address: "2001:db8::22" } ] }
events:
  - { at: 0, flow: { id: u, client: "[2001:db8:1::7]:5353", port: 9999, duration: 1500, packetsPerSecond: 2 } }
`);
    const start = startOf(r, 'u');
    expect(start).toMatchObject({ t: 0, service: 'any6', reason: 'scheduler', existingEntry: false });
    expect(['2001:db8::21', '2001:db8::22']).toContain(start['real']);
    // 0, 500, 1000 ms, then the last datagram at 1500 ms.
    expect(endOf(r, 'u')).toMatchObject({ t: 1500, real: start['real'], packets: 4 });
    expect(r.summary.services[0]!.reals.find((x) => x.address === start['real'])!.peakActiveFlows).toBe(1);
  });

  it('reuses a client port after the earlier flow ended: a new SYN on the closing entry is scheduled afresh', () => {
    const r = run(`${CONFIG}
events:
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duration: 2s } }
  - { at: 2s, flow: { id: b, client: "198.51.100.1:40000", duration: 2s } }
`);
    expect(startOf(r, 'b')).toMatchObject({ t: 2000, reason: 'scheduler', existingEntry: true });
  });

  it('formats the trace as one JSON document with one record per line', () => {
    const r = run(`${CONFIG}
events:
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duration: 1s } }
`);
    const text = formatSimulation(r);
    const lines = text.split('\n');
    expect(lines[0]).toBe('{');
    expect(lines[1]).toBe('  "trace": [');
    expect(lines[2]).toMatch(/^ {4}\{"t":0,"flow":"a","event":"start","service":"web","real":"10\.0\.0\.1[123]","reason":"scheduler","existingEntry":false\},$/);
    expect(JSON.parse(text)).toEqual(JSON.parse(JSON.stringify(r)));
  });
});

describe('simulate: scenario validation', () => {
  it('accepts times as text with a unit or as a number of milliseconds', () => {
    expect(parseTimeMs('0s')).toEqual({ ok: true, ms: 0 });
    expect(parseTimeMs('1.5s')).toEqual({ ok: true, ms: 1500 });
    expect(parseTimeMs('250ms')).toEqual({ ok: true, ms: 250 });
    expect(parseTimeMs(1500)).toEqual({ ok: true, ms: 1500 });
    expect(parseTimeMs('2m')).toEqual({ ok: true, ms: 120_000 });
    expect(parseTimeMs('0.5ms')).toEqual({ ok: false, message: '"0.5ms" is not a whole number of milliseconds' });
  });

  it('refuses an event earlier than the one before it', () => {
    expect(
      problems(`${CONFIG}
events:
  - { at: 5s, flow: { id: a, client: "198.51.100.1:40000", duration: 1s } }
  - { at: 2s, flow: { id: b, client: "198.51.100.1:40001", duration: 1s } }
`),
    ).toEqual(['events[1].at: 2s is before the previous event (5s)']);
  });

  it('names each bad field of a flow', () => {
    expect(
      problems(`${CONFIG}
events:
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duration: 0s } }
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40001", duration: 1s } }
  - { at: 0s, flow: { id: c, client: "198.51.100.1", duration: soon } }
  - { at: 0s, flow: { id: d, client: "[2001:db8::1]:40000", duration: 1s, packetsPerSecond: 5000 } }
  - { at: 0s, flow: { id: e, client: "198.51.100.1:40002", duration: 1s, service: nope } }
  - { at: 0s, flow: { id: f, client: "198.51.100.1:40003", duration: 1s, protocol: udp, service: web } }
`),
    ).toEqual([
      'events[0].flow.duration: must be positive',
      'events[1].flow.id: duplicate flow id "a"',
      'events[2].flow.client: "198.51.100.1" is not IP:PORT (e.g. 198.51.100.7:40000 or [2001:db8::7]:40000)',
      'events[2].flow.duration: "soon" is not a duration (e.g. 0s, 1.5s, 250ms, or a number of milliseconds)',
      'events[3].flow.client: [2001:db8::1]:40000 is IPv6 but the VIP of service web is IPv4',
      'events[3].flow.packetsPerSecond: 5000 is not a packet rate (more than 0, at most 1000)',
      'events[4].flow.service: "nope" is not a service (services: web)',
      'events[5].flow.protocol: udp does not match service web, which is tcp',
    ]);
  });

  it('refuses a second flow on a 5-tuple that is still in use', () => {
    expect(
      problems(`${CONFIG}
events:
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duration: 10s } }
  - { at: 5s, flow: { id: b, client: "198.51.100.1:40000", duration: 1s } }
`),
    ).toEqual(['events[1].flow.client: 198.51.100.1:40000 to web is in use by flow "a" until 10s']);
  });

  it('checks control events against the reals the service has at that point', () => {
    expect(
      problems(`${CONFIG}
events:
  - { at: 0s, removeReal: { service: web, address: 10.0.0.11 } }
  - { at: 1s, removeReal: { service: web, address: 10.0.0.11 } }
  - { at: 2s, weight: { service: web, address: 10.0.0.11, weight: 5 } }
  - { at: 3s, addReal: { service: web, address: 10.0.0.12 } }
  - { at: 4s, addReal: { service: web, address: "2001:db8::5" } }
  - { at: 5s, removeReal: { service: web, address: 10.0.0.9 } }
  - { at: 6s, intent: { service: web, address: 10.0.0.12, state: sleeping } }
  - { at: 7s, health: { service: web, address: 10.0.0.11, state: down } }
  - { at: 8s, weight: { service: web, address: 10.0.0.12, weight: 70000 } }
  - { at: 9s, addReal: { service: web, address: 10.0.0.11, weight: 50 } }
  - { at: 10s, addReal: { service: web, address: 0.0.0.0 } }
  - { at: 11s, addReal: { service: web, address: 224.0.0.1 } }
`),
    ).toEqual([
      'events[1].removeReal.address: 10.0.0.11 is not a real of service web',
      'events[2].weight.address: 10.0.0.11 is not a real of service web',
      'events[3].addReal.address: 10.0.0.12 is already a real of service web',
      'events[4].addReal.address: 2001:db8::5 is IPv6 but the VIP of service web is IPv4 and its forwarding is l2 (ipip can carry IPv4 in IPv6)',
      'events[5].removeReal.address: 10.0.0.9 is not a real of service web',
      'events[6].intent.state: "sleeping" is not active, drain or disabled',
      'events[8].weight.weight: 70000 is not a weight (0..65535)',
      'events[10].addReal.address: "0.0.0.0" is the unspecified address; a real must be a unicast address reachable on the network',
      'events[11].addReal.address: "224.0.0.1" is a multicast address; a real must be a unicast address reachable on the network',
    ]);
  });

  it('adds an IPv6 real to an IPv4 VIP whose service forwards by ipip, as the config allows', () => {
    const result = run(`
config:
  tunnel: { sourceV4: 192.0.2.1, sourceV6: "2001:db8::1" }
  services:
    - { name: web, vip: 203.0.113.10, port: 80, forwarding: ipip, reals: [ { address: "2001:db8::11" } ] }
events:
  - { at: 0s, addReal: { service: web, address: "2001:db8::12" } }
${flows('f', 40, '1s', '1s')}`);
    const reals = result.summary.services[0]!.reals;
    expect(reals.map((r) => r.address)).toEqual(['2001:db8::11', '2001:db8::12']);
    expect(reals[1]!.flowsStarted).toBeGreaterThan(0);
    expect(reals[0]!.flowsStarted + reals[1]!.flowsStarted).toBe(40);
  });

  it('refuses to add another service\'s VIP as a real, as the config does', () => {
    expect(
      problems(`${CONFIG}    - name: dns
      vip: 203.0.113.20
      port: 53
      protocol: udp
      reals: [ { address: 10.0.0.21 } ]
events:
  - { at: 0s, addReal: { service: web, address: 203.0.113.20 } }
`),
    ).toEqual(['events[0].addReal.address: 203.0.113.20 is the VIP of service dns; traffic to a VIP goes to the load balancer, so this real could never be reached']);
  });

  it('refuses a flow named for a port-0 service on a port that another service has exactly (the engine gives it to that one)', () => {
    const twoOnOneVip = `${CONFIG}    - name: rest
      vip: 203.0.113.10
      port: 0
      reals: [ { address: 10.0.0.21 } ]
`;
    expect(
      problems(`${twoOnOneVip}events:
  - { at: 0s, flow: { id: a, service: rest, client: 198.51.100.7:40000, port: 80, duration: 1s } }
`),
    ).toEqual(["events[0].flow.port: 80 of 203.0.113.10 belongs to service web (an exact port wins over service rest's every port); name web"]);
    // Any other port is the port-0 service's, and its flows say so.
    const result = run(`${twoOnOneVip}events:
  - { at: 0s, flow: { id: a, service: rest, client: 198.51.100.7:40000, port: 8080, duration: 1s } }
`);
    expect(result.summary.services.find((s) => s.name === 'rest')!.reals[0]!.flowsStarted).toBe(1);
  });

  it('frees the id of a removed real once its flows are gone, as the daemon does: 8,300 reals added and removed one at a time', () => {
    // It kept every one: past 8,192 reals over time the run stopped with "more than 8192 reals" (exit 2).
    const events = Array.from({ length: 8300 }, (_, i) => {
      const address = `10.1.${Math.floor(i / 250)}.${(i % 250) + 1}`;
      return `  - { at: ${2 * i + 1}, addReal: { service: web, address: ${address} } }\n  - { at: ${2 * i + 2}, removeReal: { service: web, address: ${address} } }`;
    });
    const result = run(`config:
  services:
    - { name: web, vip: 203.0.113.10, port: 80, tableSize: 7, reals: [{ address: 10.0.0.11 }] }
events:
${events.join('\n')}
`);
    expect(result.trace.filter((r) => r.event === 'removeReal')).toHaveLength(8300);
  });

  it('refuses more reals at once than the daemon holds, naming the event', () => {
    const reals = Array.from({ length: 8192 }, (_, i) => `{ address: 10.1.${Math.floor(i / 250)}.${(i % 250) + 1} }`).join(', ');
    expect(
      problems(`config:
  services:
    - { name: web, vip: 203.0.113.10, port: 80, tableSize: 8209, reals: [${reals}] }
events:
  - { at: 1s, addReal: { service: web, address: 10.2.0.1 } }
`),
    ).toEqual(['events[0].addReal.address: would make 8193 reals at once; the daemon (and the simulator) hold at most 8192']);
  });

  it('takes health unknown (a real its probes have not decided): no new flows, its flows stay; and refuses a flow id past 2^53', () => {
    const result = run(`${CONFIG}events:
  - { at: 0, flow: { id: a, client: 198.51.100.1:40000, duration: 10s } }
  - { at: 1s, health: { service: web, address: 10.0.0.11, state: unknown } }
  - { at: 1s, health: { service: web, address: 10.0.0.12, state: unknown } }
  - { at: 1s, health: { service: web, address: 10.0.0.13, state: unknown } }
  - { at: 2s, flow: { id: b, client: 198.51.100.2:40000, duration: 1s } }
`);
    const start = (id: string) => result.trace.find((r) => r.flow === id && r.event === 'start');
    expect(start('a')).toBeDefined();
    // Every real unknown: none is up, so fail-open (the default) gives new flows to every wanted real.
    expect(result.trace.filter((r) => r.event === 'health').at(-1)).toMatchObject({ state: 'unknown', failOpen: true });
    expect(result.trace.some((r) => r.flow === 'a' && r.event === 'moved')).toBe(false);
    expect(problems(`${CONFIG}events:\n  - { at: 0, flow: { id: 12345678901234567890, client: 198.51.100.1:40000, duration: 1s } }\n`)).toEqual([
      'events[0].flow.id: 12345678901234567000 is too large a number to be read exactly: write the id in quotes',
    ]);
  });

  it('words a bad intent or health state as the config words its one-of errors, with a hint for a wrong case', () => {
    expect(
      problems(`${CONFIG}
events:
  - { at: 0s, intent: { service: web, address: 10.0.0.11, state: Drain } }
  - { at: 1s, health: { service: web, address: 10.0.0.11, state: sick } }
  - { at: 2s, intent: { service: web, address: 10.0.0.11 } }
`),
    ).toEqual([
      'events[0].intent.state: "Drain" is not active, drain or disabled (did you mean "drain"?)',
      'events[1].health.state: "sick" is not up, down or unknown',
      'events[2].intent.state: missing; expected active, drain or disabled',
    ]);
  });

  it('refuses unknown keys, with a hint when they look like a known one, and malformed events', () => {
    expect(
      problems(`${CONFIG}
evnets: []
events:
  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duraton: 1s } }
  - { at: 1s, flow: { id: b, client: "198.51.100.1:40001", duration: 1s }, addReal: { service: web, address: 10.0.0.14 } }
  - { at: 2s }
  - { at: 3s, drain: { service: web, address: 10.0.0.11 } }
  - { flow: { id: c, client: "198.51.100.1:40002", duration: 1s } }
  - { at: soon, health: { service: web, address: 10.0.0.11, state: down } }
`),
    ).toEqual([
      'evnets: unknown key (did you mean "events"?)',
      'events[0].flow.duraton: unknown key (did you mean "duration"?)',
      'events[0].flow.duration: missing; expected a duration such as 30s',
      'events[1]: has flow and addReal; one action per event',
      'events[2]: no action; expected one of flow, addReal, removeReal, weight, health, intent',
      'events[3].drain: unknown key: dsrlb drain is an intent event here: intent: { service: web, address: 10.0.1.11, state: drain }',
      'events[3]: no action; expected one of flow, addReal, removeReal, weight, health, intent',
      'events[4].at: missing; expected a time such as 0s, 1.5s or 250ms',
      'events[5].at: "soon" is not a time (e.g. 0s, 1.5s, 250ms, or a number of milliseconds)',
    ]);
  });

  it('adds a backup real: it takes no new flow while another real can, every one once they are down', () => {
    const r = run(`${CONFIG}
events:
  - { at: 0s, addReal: { service: web, address: 10.0.0.19, backup: true } }
${flows('a', 30, '1s', '1s')}
  - { at: 3s, health: { service: web, address: 10.0.0.11, state: down } }
  - { at: 3s, health: { service: web, address: 10.0.0.12, state: down } }
  - { at: 3s, health: { service: web, address: 10.0.0.13, state: down } }
${flows('b', 10, '4s', '1s')}
`);
    expect(r.trace.find((x) => x['event'] === 'addReal')).toMatchObject({ address: '10.0.0.19', backup: true });
    const starts = r.trace.filter((x) => x['event'] === 'start');
    expect(starts.filter((x) => String(x['flow']).startsWith('a')).map((x) => x['real'])).not.toContain('10.0.0.19');
    expect(new Set(starts.filter((x) => String(x['flow']).startsWith('b')).map((x) => x['real']))).toEqual(new Set(['10.0.0.19']));
    // The trace says when the service runs on its backups, as status flags ON_BACKUPS.
    const health = r.trace.filter((x) => x['event'] === 'health');
    expect(health.map((x) => x['onBackups'] === true)).toEqual([false, false, true]);
    expect(r.trace.find((x) => x['event'] === 'addReal')!['onBackups']).toBeUndefined();
    expect(problems(`${CONFIG}\nevents:\n  - { at: 0s, addReal: { service: web, address: 10.0.0.19, backup: 1 } }\n`)).toEqual(['events[0].addReal.backup: 1 is not true or false']);
  });

  it('gives each problem the line and column the scenario writes it at, as validate does for a config', () => {
    const text = `${CONFIG}\nevents:\n  - { at: 2s, weight: { service: web, address: 10.0.0.11, weight: 5 } }\n  - { at: 1s, weight: { service: web, address: 10.0.0.11, weight: 7 } }\n`;
    const parsed = parseScenarioText(text);
    expect(parsed.ok).toBe(false);
    if (parsed.ok) return;
    const line = text.split('\n').findIndex((l) => l.includes('at: 1s')) + 1;
    expect(parsed.problems.map((p) => [p.path, p.position?.line, p.position?.column])).toEqual([['events[1].at', line, 7]]);
  });

  it('says that a real is named by its address, as in the config file', () => {
    expect(problems(`${CONFIG}\nevents:\n  - { at: 0s, weight: { service: web, real: 10.0.0.11, weight: 5 } }\n`)).toEqual([
      'events[0].weight.real: unknown key: a real is named by its address here, as in the config file (address: 10.0.1.11)',
      "events[0].weight.address: missing; expected a real's address",
    ]);
  });

  it('reports config problems under config., and a missing config or event list', () => {
    expect(
      problems(`
config:
  services:
    - { name: web, vip: 203.0.113.10, port: 70000, reals: [] }
events: []
`),
    ).toEqual(['config.services[0].port: 70000 is not a port (0..65535)']);
    expect(problems('description: nothing here\n')).toEqual([
      'config: missing; expected a config (a mapping) or the path of a config file',
      'events: missing; expected a list of events',
    ]);
    expect(problems('events: [\n')[0]).toMatch(/^\(yaml\) line \d+, column \d+: /);
  });
});

describe('simulate: frames', () => {
  it('writes frames the parser reads back, with correct IPv4 header and L4 checksums', () => {
    const buf = new Uint8Array(8 + MAX_SIM_FRAME_BYTES);
    const pkt = new ParsedPacket();
    const cases = [
      { family: 4, protocol: 'tcp', clientAddress: '198.51.100.7', clientPort: 40000, vip: '203.0.113.10', vipPort: 80 },
      { family: 4, protocol: 'udp', clientAddress: '198.51.100.7', clientPort: 5353, vip: '203.0.113.53', vipPort: 53 },
      { family: 6, protocol: 'tcp', clientAddress: '2001:db8:1::7', clientPort: 40000, vip: '2001:db8::10', vipPort: 443 },
      { family: 6, protocol: 'udp', clientAddress: '2001:db8:1::7', clientPort: 5353, vip: '2001:db8::10', vipPort: 9999 },
    ] as const;
    for (const t of cases) {
      const length = writeFrame(buf, 8, prepareTuple(t), 0x12, 77);
      expect(parseFrame(buf, 8, length, pkt)).toBe(PARSE_OK);
      expect([pkt.family, pkt.ipProtocol, pkt.srcPort, pkt.dstPort, pkt.tcpFlags]).toEqual([t.family, t.protocol === 'tcp' ? 6 : 17, t.clientPort, t.vipPort, t.protocol === 'tcp' ? 0x12 : 0]);
      const stored = (at: number): number => (buf[at]! << 8) | buf[at + 1]!;
      if (t.family === 4) expect(stored(pkt.l3Offset + 10)).toBe(ipv4HeaderChecksum(buf, pkt.l3Offset, 20));
      expect(stored(pkt.l4Offset + (t.protocol === 'tcp' ? 16 : 6))).toBe(l4Checksum(buf, pkt));
    }
    const mac = simRealMac(0x1234);
    expect(Array.from(mac)).toEqual([0x02, 0xd5, 0x1b, 0x00, 0x12, 0x34]);
    expect(simRealIdOfFrame(mac, 0)).toBe(0x1234);
    expect(simRealIdOfFrame(Uint8Array.of(2, 0, 0, 0, 0, 1), 0)).toBe(-1);
  });
});

describe('simulate: scenario files and the command', () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsrlb-sim-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('reads a config file named relative to the scenario, and prefixes its problems with its name', () => {
    writeFileSync(join(dir, 'lb.yaml'), 'interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, reals: [ { address: 10.0.0.11 } ] }\n');
    writeFileSync(join(dir, 'bad.yaml'), 'interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, reals: [ { address: 10.0.0.300 } ] }\n');
    writeFileSync(join(dir, 'ok.yaml'), 'config: lb.yaml\nevents:\n  - { at: 0s, flow: { id: a, client: "198.51.100.1:40000", duration: 1s } }\n');
    writeFileSync(join(dir, 'bad-scenario.yaml'), 'config: bad.yaml\nevents: []\n');
    writeFileSync(join(dir, 'missing.yaml'), 'config: nowhere.yaml\nevents: []\n');

    const ok = runSimulateCommand({ scenario: join(dir, 'ok.yaml') });
    expect(ok.exitCode).toBe(0);
    expect(JSON.parse(ok.stdout).trace[0]).toMatchObject({ flow: 'a', event: 'start', real: '10.0.0.11' });

    const bad = runSimulateCommand({ scenario: join(dir, 'bad-scenario.yaml') });
    expect(bad).toEqual({ exitCode: 1, stdout: '', stderr: 'config(bad.yaml).services[0].reals[0].address: "10.0.0.300" is not an IPv4 or IPv6 address (line 3, column 58)\n' });

    const missing = runSimulateCommand({ scenario: join(dir, 'missing.yaml') });
    expect(missing.exitCode).toBe(1);
    // Where the scenario names the file.
    expect(missing.stderr).toBe('config: cannot read "nowhere.yaml": ENOENT: no such file or directory (line 1, column 1)\n');

    const none = runSimulateCommand({ scenario: join(dir, 'absent.yaml') });
    expect(none.exitCode).toBe(1);
    expect(none.stderr).toMatch(/^\(file\): cannot read ".*absent\.yaml": ENOENT: no such file or directory\n$/);
  });
});
