// The state file that keeps operator intent across restarts: a missing file is normal, a corrupt
// one is said loudly and set aside (not silently overwritten by the next intent change), a good
// one is applied. No root, no loop.

import { mkdtemp, readdir, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

async function daemonWithState(stateFile: string): Promise<{ daemon: Daemon; lines: Record<string, unknown>[]; load: () => Promise<void>; overrides: () => Map<string, unknown> }> {
  const parsed = parseConfigText(`interface: eth0
stateFile: ${stateFile}
services:
  - { name: web, vip: 10.93.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }] }
`);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  const lines: Record<string, unknown>[] = [];
  const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)));
  daemon.config = parsed.config;
  const inner = daemon as unknown as { loadOverrides(): Promise<void>; overrides: Map<string, unknown> };
  return { daemon, lines, load: () => inner.loadOverrides(), overrides: () => inner.overrides };
}

describe('the state file at start', () => {
  it('is optional: no file, no log line, no intent', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-state-'));
    const d = await daemonWithState(join(dir, 'dsrlb.state.json'));
    await d.load();
    expect(d.lines).toEqual([]);
    expect(d.overrides().size).toBe(0);
    d.daemon.health.stop();
  });

  it('applies a good file', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-state-'));
    const file = join(dir, 'dsrlb.state.json');
    await writeFile(file, JSON.stringify({ intent: { 'tcp|10.93.0.100|80#10.93.0.11': { state: 'drain', configState: 'active', configWeight: 100 } }, withdrawn: [] }));
    const d = await daemonWithState(file);
    await d.load();
    expect(d.lines).toEqual([]);
    expect(d.overrides().get('tcp|10.93.0.100|80#10.93.0.11')).toMatchObject({ state: 'drain' });
    // Said at start (it was applied silently), and status gives the config's intent beside it.
    const inner = d.daemon as unknown as { logRestoredIntent(): void; syncReals(): void; neighbors: { macOf(a: string): null } };
    inner.logRestoredIntent();
    expect(d.lines).toMatchObject([{ msg: 'operator intent from the state file in force', real: 'tcp|10.93.0.100|80#10.93.0.11', intent: 'drain', config: { intent: 'active', weight: 100 } }]);
    inner.syncReals();
    inner.neighbors = { macOf: () => null };
    const real = (d.daemon.status() as { services: { reals: Record<string, unknown>[] }[] }).services[0]!.reals[0]!;
    expect(real).toMatchObject({ intent: 'drain', weight: 100, configIntent: { state: 'active', weight: 100 } });
    d.daemon.health.stop();
  });

  it('says so and sets a corrupt file aside, keeping its bytes, instead of dropping intent silently', async () => {
    for (const bad of ['{"intent": {"tcp|10.93.0.100|80#10.93.0.11": {"state": "dra', '[1, 2]', '{"withdrawn": "web"}']) {
      const dir = await mkdtemp(join(tmpdir(), 'dsrlb-state-'));
      const file = join(dir, 'dsrlb.state.json');
      await writeFile(file, bad);
      const d = await daemonWithState(file);
      await d.load();
      expect(d.overrides().size, bad).toBe(0);
      const line = d.lines.find((l) => l.msg === 'state file unusable: operator intent from before this start is not applied');
      expect(line, bad).toMatchObject({ level: 'error', stateFile: file });
      const names = await readdir(dir);
      expect(names, bad).toHaveLength(1);
      expect(names[0]).toMatch(/^dsrlb\.state\.json\.corrupt-/);
      expect(line!.keptAs).toBe(join(dir, names[0]!));
      expect(await readFile(join(dir, names[0]!), 'utf8')).toBe(bad);
      d.daemon.health.stop();
    }
  });

  it('drops a bad entry alone, said and its bytes kept: the other drains stay in force', async () => {
    const good = 'tcp|10.93.0.100|80#10.93.0.11';
    const other = 'tcp|10.93.0.100|80#10.93.0.12';
    const entry = (o: Record<string, unknown>) => ({ configState: 'active', configWeight: 100, ...o });
    // Hand-edited values the admin API never writes: a weight of -5 made the Maglev build throw at every start.
    for (const bad of [{ weight: -5 }, { weight: 1e12 }, { weight: '7' }, { weight: 1.5 }, { state: 'bogus' }, { configState: 'up' }, { configWeight: 70_000 }, 5]) {
      const dir = await mkdtemp(join(tmpdir(), 'dsrlb-state-'));
      const file = join(dir, 'dsrlb.state.json');
      const text = JSON.stringify({ intent: { [good]: entry({ state: 'drain' }), [other]: typeof bad === 'number' ? bad : entry(bad) } });
      await writeFile(file, text);
      const d = await daemonWithState(file);
      await d.load();
      const what = JSON.stringify(bad);
      expect([...d.overrides().keys()], what).toEqual([good]);
      const line = d.lines.find((l) => l.msg === 'state file entries unusable: those intents are not applied, the others are');
      expect(line, what).toMatchObject({ level: 'error', stateFile: file, dropped: [{ intent: other }] });
      const names = (await readdir(dir)).sort();
      expect(names, what).toHaveLength(2);
      expect(await readFile(join(dir, names[1]!), 'utf8')).toBe(text);
      d.daemon.health.stop();
    }
  });
});
