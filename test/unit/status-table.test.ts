// `dsrlb status` as a table: ipvsadm -Ln's layout (a header line for services, one for reals, each
// over what is under it), the service's name always shown, why a dropping service drops, and which
// intents an operator set over the config's.

import { describe, expect, it } from 'vitest';
import { formatStatus } from '../../src/cli/status-table.js';

const now = Date.parse('2026-11-30T12:00:00Z');
const real = (address: string, health: string, lastError: string | null = null) => ({
  address,
  forwarding: 'l2',
  weight: 100,
  intent: 'active',
  removed: false,
  health: { state: health, since: '2026-11-30T11:59:30Z', lastError },
  activeFlows: 3,
  inactiveFlows: 1,
  pps: 12.4,
  bytesPerSecond: 2048,
});
const service = (name: string, extra: object) => ({ name, protocol: 'tcp', vip: '203.0.113.10', port: 80, scheduler: 'maglev', forwarding: 'l2', panic: false, dropping: false, reals: [real('10.0.1.11', 'up')], ...extra });

/** The cells of `row` under the columns of `header`: each header word starts its column, as ipvsadm's. */
function cells(header: string, row: string): Record<string, string> {
  const names = header.trim().split(/\s{2,}/);
  let from = 0;
  const starts = names.map((n) => (from = header.indexOf(n, from)));
  const out: Record<string, string> = {};
  names.forEach((n, i) => (out[n] = row.slice(starts[i], starts[i + 1] ?? row.length).trim()));
  // Text left of the first column, or a cell that runs into the next column, is misplaced.
  expect(row.slice(0, starts[0]).trim(), `row ${JSON.stringify(row)} left of ${JSON.stringify(names[0])}`).toBe('');
  names.forEach((n, i) => {
    if (i > 0 && starts[i]! > 0 && row.length > starts[i]!) expect(row[starts[i]! - 1], `column ${n} of ${JSON.stringify(row)}`).toBe(' ');
  });
  return out;
}

const SERVICE_HEADER = 'Prot LocalAddress:Port';
const REAL_HEADER = '  -> RemoteAddress:Port';

/** Every row under its own header (service rows under the first, real rows under the second), as cells. */
function table(text: string): Record<string, string>[] {
  const lines = text.split('\n');
  expect(lines[0]!.startsWith(SERVICE_HEADER), lines[0]).toBe(true);
  expect(lines[1]!.startsWith(REAL_HEADER), lines[1]).toBe(true);
  return lines.slice(2).filter((l) => /^(TCP|UDP) |^  -> /.test(l)).map((l) => cells(l.startsWith('  -> ') ? lines[1]! : lines[0]!, l));
}

describe('status table', () => {
  it('ends with why the state file cannot be written, when the daemon says so', () => {
    const problem = 'the state file /var/lib/dsrlb/typo/state.json cannot be written (ENOENT): drain, disable, weight and withdraw are refused, and flows are not kept across a restart';
    expect(formatStatus({ services: [service('web', {})], stateFileProblem: problem }, now).split('\n')).toContain(problem);
    expect(formatStatus({ services: [service('web', {})], stateFileProblem: null }, now)).not.toContain('state file');
  });

  it('writes a persistent service as ipvsadm -Ln does, after its scheduler, with the client prefix when it is not the whole address', () => {
    const text = formatStatus(
      {
        services: [
          service('web', { persistence: 'client', persistencePrefix: 32 }),
          service('net', { port: 443, persistence: 'client', persistencePrefix: 24 }),
          service('six', { vip: '2001:db8::10', persistence: 'client', persistencePrefix: 128, reals: [] }),
          service('plain', { port: 8080, persistence: 'none', persistencePrefix: 32 }),
          service('dns', { protocol: 'udp', port: 53, persistence: 'none', persistencePrefix: 32, ops: true }),
          service('dns2', { protocol: 'udp', port: 5353, persistence: 'client', persistencePrefix: 32, ops: true }),
        ],
      },
      now,
    );
    expect(table(text).filter((r) => 'Scheduler' in r).map((r) => r.Scheduler)).toEqual(['maglev persistent', 'maglev persistent /24', 'maglev persistent', 'maglev', 'maglev ops', 'maglev persistent ops']);
  });

  it('has a header line for services and one for reals, as ipvsadm -Ln, and every value sits under its own header', () => {
    const text = formatStatus({ services: [service('web', {}), service('dns', { protocol: 'udp', vip: '2001:db8::53', port: 53, scheduler: 'wlc', reals: [real('2001:db8::11', 'up')] })] }, now);
    const lines = text.split('\n');
    expect(lines[0]!.split(/\s{2,}/)).toEqual([SERVICE_HEADER, 'Scheduler', 'Forward', 'Name', 'Flags']);
    expect(lines[1]!.split(/\s{2,}/)).toEqual(['', '-> RemoteAddress:Port', 'Forward', 'Weight', 'Intent', 'Health', 'ActiveConn', 'InActConn', 'Pkt/s', 'Bytes/s']);
    expect(table(text)).toEqual([
      { [SERVICE_HEADER]: 'TCP  203.0.113.10:80', Scheduler: 'maglev', Forward: 'l2', Name: 'web', Flags: '' },
      { '-> RemoteAddress:Port': '-> 10.0.1.11:80', Forward: 'l2', Weight: '100', Intent: 'active', Health: 'up 30s', ActiveConn: '3', InActConn: '1', 'Pkt/s': '12', 'Bytes/s': '2048' },
      { [SERVICE_HEADER]: 'UDP  [2001:db8::53]:53', Scheduler: 'wlc', Forward: 'l2', Name: 'dns', Flags: '' },
      { '-> RemoteAddress:Port': '-> [2001:db8::11]:53', Forward: 'l2', Weight: '100', Intent: 'active', Health: 'up 30s', ActiveConn: '3', InActConn: '1', 'Pkt/s': '12', 'Bytes/s': '2048' },
    ]);
  });

  it('puts PANIC or DROPPING under Flags beside the name, and says after the table why a service drops', () => {
    const text = formatStatus(
      {
        services: [
          service('web', { panic: true, reals: [real('10.0.1.11', 'down', 'connect ECONNREFUSED')] }),
          service('api', { dropping: true, droppingReason: 'no MAC known for 10.0.1.12 (ARP/neighbour discovery unanswered)', reals: [] }),
        ],
      },
      now,
    );
    const rows = table(text);
    expect(rows[0]).toMatchObject({ Name: 'web', Flags: 'PANIC(failOpen)' });
    expect(rows[1]).toMatchObject({ Health: 'down 30s' });
    expect(rows[2]).toMatchObject({ Name: 'api', Flags: 'DROPPING' });
    expect(text.split('\n').slice(-2)).toEqual(['api: dropping: no MAC known for 10.0.1.12 (ARP/neighbour discovery unanswered)', 'web 10.0.1.11: last check failed: connect ECONNREFUSED']);
  });

  it("keeps the Health cell short: a real's last failed check is said after the table, an up one's too (it may be going down)", () => {
    const text = formatStatus({ services: [service('web', { reals: [real('10.0.1.11', 'up', 'timeout: no answer within 1000 ms'), real('10.0.1.12', 'up')] })] }, now);
    expect(table(text).slice(1).map((r) => r.Health)).toEqual(['up 30s', 'up 30s']);
    expect(text.split('\n').filter((l) => l.includes('last check'))).toEqual(['web 10.0.1.11: last check failed (still up): timeout: no answer within 1000 ms']);
  });

  it('says after the table which wanted real has no MAC: it takes no new flows though its health says up', () => {
    const text = formatStatus(
      {
        services: [
          service('web', {
            reals: [
              { ...real('10.0.1.11', 'up'), mac: '02:00:00:00:00:11' },
              { ...real('10.0.1.98', 'up'), mac: null },
              { ...real('10.0.1.99', 'up'), intent: 'disabled', mac: null },
              real('10.0.1.12', 'up'), // an older daemon: no mac field, no note
            ],
          }),
        ],
      },
      now,
    );
    expect(text.split('\n').slice(7)).toEqual(['web 10.0.1.98: no MAC known (ARP/neighbour discovery unanswered): takes no new flows']);
  });

  it('says after the table which drained real has no established flow left (what an operator waits for before taking it down)', () => {
    const text = formatStatus(
      {
        services: [
          service('web', {
            reals: [
              { ...real('10.0.1.11', 'up'), intent: 'drain', drainFinished: true },
              { ...real('10.0.1.12', 'up'), intent: 'drain', drainFinished: false, activeFlows: 2 },
              real('10.0.1.13', 'up'), // an older daemon: no drainFinished field, no note
              // A standby the config gives weight 0: no drain to finish, no note every time.
              { ...real('10.0.1.14', 'up'), weight: 0, configIntent: { state: 'active', weight: 0 }, drainFinished: true },
            ],
          }),
        ],
      },
      now,
    );
    expect(text.split('\n').slice(7)).toEqual(['web 10.0.1.11: drain finished: no established flow left']);
  });

  it('says under Flags when a VIP meant to be announced is not (withdrawn by an operator, or by the daemon, or waiting for its reals), and when a panic is ending', () => {
    const text = formatStatus(
      {
        services: [
          service('web', { announce: true, announced: false, operatorWithdrawn: true, reals: [] }),
          service('api', { announce: true, announced: false, dropping: true, droppingReason: 'no real is up', reals: [] }),
          service('dns', { announce: true, announced: true, reals: [] }),
          service('ntp', { announce: false, announced: false, reals: [] }),
          service('img', { announce: true, announced: false, announceWaitingForReals: true, reals: [] }),
          service('dl', { announce: true, announced: true, panicEnding: true, reals: [] }),
        ],
      },
      now,
    );
    expect(table(text).map((r) => [r['Name'], r['Flags'] ?? ''])).toEqual([
      ['web', 'WITHDRAWN(operator)'],
      ['api', 'DROPPING NOT_ANNOUNCED'],
      ['dns', ''],
      ['ntp', ''],
      ['img', 'NOT_ANNOUNCED(reals_rising)'],
      ['dl', 'PANIC_ENDING(reals_rising)'],
    ]);
  });

  it('marks a service removed by a reload whose flows drain, without a dropping note', () => {
    const text = formatStatus({ services: [service('old', { removed: true, dropping: true, droppingReason: 'removed from the config', reals: [real('10.0.1.11', 'up', null)] })] }, now);
    expect(table(text)[0]).toMatchObject({ Name: 'old', Flags: 'REMOVED(draining)' });
    expect(text.split('\n')).toHaveLength(4);
  });

  it("marks an intent an operator set over the config's (a drain restored from the state file at start too), and says after the table what the config says", () => {
    const text = formatStatus(
      {
        services: [
          service('web', {
            reals: [
              { ...real('10.0.1.11', 'up'), configIntent: { state: 'active', weight: 100 } },
              { ...real('10.0.1.12', 'up'), intent: 'drain', configIntent: { state: 'active', weight: 100 } },
              { ...real('10.0.1.13', 'up'), weight: 5, configIntent: { state: 'active', weight: 100 } },
              { ...real('10.0.1.14', 'up'), intent: 'disabled', weight: 0, configIntent: { state: 'drain', weight: 10 } },
              // A daemon that does not send the config's intent: nothing to compare, no marker.
              { ...real('10.0.1.15', 'up'), intent: 'drain' },
            ],
          }),
        ],
      },
      now,
    );
    const rows = table(text).slice(1);
    expect(rows.map((r) => [r['-> RemoteAddress:Port'], r.Weight, r.Intent])).toEqual([
      ['-> 10.0.1.11:80', '100', 'active'],
      ['-> 10.0.1.12:80', '100', 'drain*'],
      ['-> 10.0.1.13:80', '5*', 'active'],
      ['-> 10.0.1.14:80', '0*', 'disabled*'],
      ['-> 10.0.1.15:80', '100', 'drain'],
    ]);
    expect(text.split('\n').slice(8)).toEqual([
      '* set by an operator (dsrlb drain|undrain|disable|enable|weight), kept in the state file across restarts until the config file changes that real; the config says:',
      '  web 10.0.1.12: active',
      '  web 10.0.1.13: weight 100',
      '  web 10.0.1.14: drain, weight 10',
    ]);
  });

  it('says after the table when the packet loops do not run, or were started again after they ended', () => {
    const quiet = formatStatus({ services: [service('web', {})], loop: { healthy: true, restarts: 0 } }, now);
    expect(quiet.split('\n')).toHaveLength(4);
    const restarted = formatStatus({ services: [service('web', {})], loop: { healthy: true, restarts: 1 } }, now).split('\n');
    expect(restarted.at(-1)).toBe("packet loops: started again 1 time after they ended (a crash, or their interface made again: the daemon's log says which)");
    const down = formatStatus({ services: [service('web', {})], loop: { healthy: false, restarts: 2 } }, now).split('\n');
    expect(down.slice(4)).toEqual([
      "packet loops: NOT HEALTHY (ended or stalled; the daemon's log says why)",
      "packet loops: started again 2 times after they ended (a crash, or their interface made again: the daemon's log says which)",
    ]);
  });
});
