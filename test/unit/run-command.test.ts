// `dsrlb run`'s start/stop sequencing with a fake daemon: a stop signal during start waits for
// start to end, then undoes and exits as after a clean run; a refused start undoes only its own.

import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { superviseDaemon, type SupervisedDaemon } from '../../src/cli/run-command.js';
import type { Config } from '../../src/config/types.js';
import { readAdminToken } from '../../src/control/admin-token.js';
import { DaemonError } from '../../src/control/daemon-error.js';
import type { Logger } from '../../src/control/logger.js';

function deferred(): { promise: Promise<void>; resolve: () => void; reject: (e: Error) => void } {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const tick = () => new Promise((r) => setImmediate(r));

function harness(reload: () => Promise<void> = async () => undefined) {
  const events: string[] = [];
  const errors: string[] = [];
  const starting = deferred();
  const daemon: SupervisedDaemon = {
    config: { metrics: { listen: { host: '127.0.0.1', port: 9742 } }, admin: { listen: { host: '127.0.0.1', port: 9743 } } } as Config,
    start: async () => {
      events.push('start');
      await starting.promise;
      events.push('started');
    },
    stop: async (opts) => void events.push(opts?.startFailed ? 'stop(startFailed)' : 'stop'),
    reload: async () => {
      events.push('reload');
      await reload();
    },
    onLoopLost: null,
  };
  const log: Logger = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: (msg, fields) => void errors.push(`${msg} ${JSON.stringify(fields)}`) };
  const signals = new EventEmitter();
  const exits: number[] = [];
  const run = superviseDaemon({
    daemon,
    log,
    servers: [async () => (events.push('metrics'), { close: () => events.push('close metrics') }), async () => (events.push('admin'), { close: () => events.push('close admin') })],
    signals,
    exit: (code) => {
      events.push(`exit ${code}`);
      exits.push(code);
    },
    stderr: () => undefined,
  });
  return { events, errors, starting, signals, exits, run, daemon };
}

describe('dsrlb run: signals and start', () => {
  it('a SIGTERM during start waits for start, then stops the servers and the daemon (full undo) and exits 0', async () => {
    const h = harness();
    await tick();
    // Handlers are in place before start: emitting with none would leave the event unheard.
    expect(h.signals.listenerCount('SIGTERM')).toBe(1);
    expect(h.signals.listenerCount('SIGINT')).toBe(1);
    h.signals.emit('SIGTERM');
    h.signals.emit('SIGINT'); // a second signal does not stop twice
    await tick();
    expect(h.events).toEqual(['start']);
    h.starting.resolve();
    expect(await h.run).toBe(0);
    expect(h.events).toEqual(['start', 'started', 'metrics', 'admin', 'close metrics', 'close admin', 'stop', 'exit 0']);
  });

  it('a SIGINT during start whose start then fails undoes only this start and exits with the start failure', async () => {
    const h = harness();
    await tick();
    h.signals.emit('SIGINT');
    h.starting.reject(new DaemonError('LOOP_FAILED', 'no such interface'));
    expect(await h.run).toBe(2);
    expect(h.events).toEqual(['start', 'stop(startFailed)', 'exit 2']);
  });

  it('a start refused by the config exits 1; one refused because a file it names cannot be read (token) exits 2, as reload does', async () => {
    const h = harness();
    await tick();
    h.starting.reject(new DaemonError('NO_INTERFACE', 'interface: "eth9" does not exist', [{ path: 'interface', message: '"eth9" does not exist' }]));
    expect(await h.run).toBe(1);
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-token-'));
    try {
      const unreadable = await readAdminToken({ admin: { listen: { host: '127.0.0.1', port: 9743 }, tokenFile: join(dir, 'missing') } }).catch((e: unknown) => e);
      const h2 = harness();
      await tick();
      h2.starting.reject(unreadable as Error);
      expect(await h2.run).toBe(2);
      writeFileSync(join(dir, 'empty'), '\n');
      const empty = await readAdminToken({ admin: { listen: { host: '127.0.0.1', port: 9743 }, tokenFile: join(dir, 'empty') } }).catch((e: unknown) => e);
      const h3 = harness();
      await tick();
      h3.starting.reject(empty as Error);
      expect(await h3.run).toBe(2);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a SIGHUP during start reloads once started; after start, SIGTERM stops at once', async () => {
    const h = harness();
    await tick();
    h.signals.emit('SIGHUP');
    h.starting.resolve();
    await tick();
    await tick();
    expect(h.events).toEqual(['start', 'started', 'metrics', 'admin', 'reload']);
    h.signals.emit('SIGTERM');
    await tick();
    expect(h.events.slice(5)).toEqual(['close metrics', 'close admin', 'stop', 'exit 0']);
    expect(h.exits).toEqual([0]);
  });

  it('a packet loop that ends by itself stops the daemon whole and exits 2 (systemd restarts it)', async () => {
    const h = harness();
    await tick();
    h.starting.resolve();
    await tick();
    await tick();
    h.daemon.onLoopLost!('packet loop crashed: boom');
    h.daemon.onLoopLost!('packet loop exited with code 1'); // the second loop of two: one stop
    await tick();
    expect(h.events.slice(4)).toEqual(['close metrics', 'close admin', 'stop', 'exit 2']);
    expect(h.errors).toEqual(['a packet loop ended: stopping so that the supervisor restarts dsrlb {"reason":"packet loop crashed: boom"}']);
  });

  it('a packet loop lost while start still runs (after its loops were ready) stops the daemon once start has ended', async () => {
    const h = harness();
    await tick();
    h.daemon.onLoopLost!('packet loop exited with code 1');
    expect(h.events).toEqual(['start']);
    h.starting.resolve();
    await tick();
    await tick();
    await tick();
    expect(h.events).toEqual(['start', 'started', 'metrics', 'admin', 'close metrics', 'close admin', 'stop', 'exit 2']);
  });

  it('a SIGHUP whose reload throws is logged and the daemon runs on (no unhandled rejection)', async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown): void => void unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      const h = harness(async () => {
        throw new Error('ip: cannot talk to the kernel');
      });
      await tick();
      h.starting.resolve();
      await tick();
      await tick();
      h.signals.emit('SIGHUP');
      await tick();
      await tick();
      expect(h.events.slice(4)).toEqual(['reload']);
      expect(h.errors).toEqual(['reload failed {"error":"ip: cannot talk to the kernel"}']);
      expect(h.exits).toEqual([]);
      h.signals.emit('SIGTERM');
      await tick();
      expect(h.exits).toEqual([0]);
    } finally {
      await tick();
      process.off('unhandledRejection', onUnhandled);
    }
    expect(unhandled).toEqual([]);
  });
});
