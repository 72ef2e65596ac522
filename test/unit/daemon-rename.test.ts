// A renamed service is the same service to the daemon: its reals keep their health facts, and
// the log lines (and probe metrics, from the same record) name it by its new name. No root, no loop.

import { describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/types.js';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';

const configNamed = (name: string): Config => {
  const parsed = parseConfigText(`interface: eth0
services:
  - { name: ${name}, vip: 10.93.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.11 }] }
`);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  return parsed.config;
};

describe('a service renamed by a reload', () => {
  it('keeps its reals\' health record and logs them under the new name', () => {
    const lines: Record<string, unknown>[] = [];
    const daemon = new Daemon('/nonexistent/dsrlb.yaml', createLogger((l) => lines.push(JSON.parse(l) as Record<string, unknown>)));
    // syncReals is what start and reload run after taking a config; no rebuild is asked here.
    const sync = (config: Config): void => {
      daemon.config = config;
      (daemon as unknown as { syncReals(): void }).syncReals();
    };
    (daemon as unknown as { queueRebuild(why: string): void }).queueRebuild = () => undefined;
    sync(configNamed('web'));
    const key = 'tcp|10.93.0.100|80#10.93.0.11';
    const before = daemon.health.fact(key);
    expect(before).toMatchObject({ state: 'up' });
    sync(configNamed('www'));
    expect(daemon.health.fact(key)).toEqual(before);
    daemon.health.emit('change', key, { ...before!, state: 'down', lastError: 'refused' });
    expect(lines.find((l) => l.msg === 'real down')).toMatchObject({ service: 'www', real: '10.93.0.11' });
    daemon.health.stop();
  });
});
