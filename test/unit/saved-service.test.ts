// A removed service saved in the flows file (its config, so that its flows drain after a restart):
// read back as the config has it, and one written by an earlier release, without onRealDown or
// persistence, as that release behaved (reschedule, no persistence).
import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { savedServiceConfig, serviceConfigProblem } from '../../src/control/saved-service.js';

const parsed = parseConfigText('interface: eth0\nservices:\n  - { name: web, vip: 203.0.113.10, port: 80, onRealDown: keep, persistence: client, persistencePrefix: 24, reals: [ { address: 10.0.1.1 } ] }\n');
if (!parsed.ok) throw new Error('the test config does not parse');
const service = parsed.config.services[0]!;

describe('savedServiceConfig', () => {
  it('reads back what was saved', () => {
    expect(savedServiceConfig(JSON.parse(JSON.stringify(service)))).toEqual(service);
  });

  it('takes a service an earlier release saved without onRealDown as reschedule', () => {
    const { onRealDown: _, ...older } = JSON.parse(JSON.stringify(service)) as Record<string, unknown>;
    expect(savedServiceConfig(older)).toEqual({ ...service, onRealDown: 'reschedule' });
  });

  it('names onRealDown when it holds a value no release wrote', () => {
    expect(serviceConfigProblem({ ...JSON.parse(JSON.stringify(service)), onRealDown: 'move' })).toBe('onRealDown');
  });

  it('takes a service an earlier release saved without persistence as none, its prefix the whole address', () => {
    const { persistence: _p, persistencePrefix: _n, ops: _o, ...older } = JSON.parse(JSON.stringify(service)) as Record<string, unknown>;
    expect(savedServiceConfig(older)).toEqual({ ...service, persistence: 'none', persistencePrefix: 32, ops: false });
    // A real saved before backups: not one.
    const realBefore = { ...(older.reals as Record<string, unknown>[])[0] };
    delete realBefore.backup;
    expect(savedServiceConfig({ ...older, reals: [realBefore] }).reals[0]!.backup).toBe(false);
    expect(serviceConfigProblem({ ...older, reals: [{ ...realBefore, backup: 'no' }] })).toBe('reals[0]');
    const six = { ...older, vip: '2001:db8::10', family: 6, reals: [] };
    expect(savedServiceConfig(six).persistencePrefix).toBe(128);
  });

  it('names persistence and persistencePrefix when they hold values no release wrote', () => {
    expect(serviceConfigProblem({ ...JSON.parse(JSON.stringify(service)), persistence: 'source' })).toBe('persistence');
    expect(serviceConfigProblem({ ...JSON.parse(JSON.stringify(service)), persistencePrefix: 33 })).toBe('persistencePrefix');
    expect(serviceConfigProblem({ ...JSON.parse(JSON.stringify(service)), persistencePrefix: 0 })).toBe('persistencePrefix');
    expect(serviceConfigProblem({ ...JSON.parse(JSON.stringify(service)), ops: 'yes' })).toBe('ops');
  });
});
