// `dsrlb run`'s start/stop sequencing with a fake daemon: a stop signal during start waits for
// start to end, then undoes and exits as after a clean run; a refused start undoes only its own.
// What systemd is told (READY, STOPPING, watchdog pings only while healthy), through a fake
// notifier and through the real one to a Unix datagram socket.

import { spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { superviseDaemon, type SupervisedDaemon } from '../../src/cli/run-command.js';
import type { Config } from '../../src/config/types.js';
import { readAdminToken } from '../../src/control/admin-token.js';
import { DaemonError } from '../../src/control/daemon-error.js';
import { createLogger, type Logger } from '../../src/control/logger.js';
import { SystemdNotifier } from '../../src/control/systemd-notify.js';
import { loadNative } from '../../src/io/native-binding.js';

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
  const watchdog: { check: (() => boolean) | null } = { check: null };
  const notified: string[] = [];
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
    healthy: () => healthy.value,
  };
  const healthy = { value: true };
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
    notifier: {
      ready: () => void notified.push('READY'),
      stopping: () => void notified.push('STOPPING'),
      startWatchdog: (check) => void (watchdog.check = check),
    },
  });
  return { events, errors, starting, signals, exits, run, daemon, healthy, watchdog, notified };
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

describe('dsrlb run: what systemd is told', () => {
  it('READY once the servers listen, the watchdog fed only while the daemon is healthy, STOPPING on stop; nothing for a refused start', async () => {
    const h = harness();
    await tick();
    expect(h.notified).toEqual([]);
    h.starting.resolve();
    await tick();
    await tick();
    expect(h.notified).toEqual(['READY']);
    expect(h.watchdog.check?.()).toBe(true);
    h.healthy.value = false; // loops stalled or gone: no ping, systemd kills and restarts dsrlb
    expect(h.watchdog.check?.()).toBe(false);
    h.signals.emit('SIGTERM');
    for (let i = 0; i < 10 && h.exits.length === 0; i++) await tick();
    expect(h.exits).toEqual([0]);
    expect(h.notified).toEqual(['READY', 'STOPPING']);

    const refused = harness();
    await tick();
    refused.starting.reject(new Error('no such interface'));
    expect(await refused.run).toBe(2);
    expect(refused.notified).toEqual([]);
  });

  it('SystemdNotifier sends sd_notify datagrams to $NOTIFY_SOCKET (a path or @abstract), pings at half WATCHDOG_USEC while healthy, and is silent without it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-notify-'));
    const path = join(dir, 'notify.sock');
    // A stand-in for systemd: python3 reads the datagrams (Node has no Unix datagram sockets).
    const receiver = spawn('python3', ['-c', `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print('bound', flush=True)
while True:
    print(s.recv(1024).decode(), flush=True)
`, path]);
    const got: string[] = [];
    let buffered = '';
    receiver.stdout.on('data', (d: Buffer) => {
      buffered += d.toString();
      const lines = buffered.split('\n');
      buffered = lines.pop()!;
      got.push(...lines);
    });
    try {
      for (let i = 0; i < 100 && !got.includes('bound'); i++) await new Promise((r) => setTimeout(r, 20));
      const logged: string[] = [];
      const log = createLogger((l) => void logged.push(l));
      const n = new SystemdNotifier(log, { NOTIFY_SOCKET: path, WATCHDOG_USEC: '200000' });
      let healthy = true;
      n.ready();
      n.startWatchdog(() => healthy);
      await new Promise((r) => setTimeout(r, 550)); // pings at 100, 200, ... ms
      healthy = false;
      const pings = got.filter((l) => l === 'WATCHDOG=1').length;
      await new Promise((r) => setTimeout(r, 350));
      n.stopping();
      for (let i = 0; i < 100 && !got.includes('STOPPING=1'); i++) await new Promise((r) => setTimeout(r, 20));
      expect(got[0]).toBe('bound');
      expect(got[1]).toBe('READY=1');
      expect(pings).toBeGreaterThanOrEqual(3);
      expect(got.filter((l) => l === 'WATCHDOG=1').length).toBeLessThanOrEqual(pings + 1); // none once unhealthy
      expect(got.at(-1)).toBe('STOPPING=1');
      expect(logged).toEqual([]);
      // A socket that is not there: said once, not at every ping.
      const missing = new SystemdNotifier(log, { NOTIFY_SOCKET: join(dir, 'gone.sock') });
      missing.ready();
      missing.stopping();
      expect(logged.filter((l) => l.includes('cannot notify systemd'))).toHaveLength(1);
      // Not under systemd: nothing to send, nothing sent.
      const sent: string[] = [];
      const off = new SystemdNotifier(log, {}, (_p, state) => (sent.push(state), 0));
      off.ready();
      off.startWatchdog(() => true);
      off.stopping();
      expect(sent).toEqual([]);
      // An abstract socket name goes as written after the '@'.
      const abstract = new SystemdNotifier(log, { NOTIFY_SOCKET: '@dsrlb-test-none' }, (p, state) => (sent.push(`${p} ${state}`), 0));
      abstract.ready();
      expect(sent).toEqual(['@dsrlb-test-none READY=1']);
    } finally {
      receiver.kill();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the native sdNotify refuses what sun_path or its buffer cannot hold, instead of sending it cut short', () => {
    const { sdNotify } = loadNative();
    const path = (n: number) => `/${'p'.repeat(n - 1)}`;
    // A path needs its NUL inside the 108 bytes of sun_path: 107 characters fit (nobody listens there).
    expect(sdNotify(path(107), 'READY=1')).toBe(-2); // ENOENT
    expect(() => sdNotify(path(108), 'READY=1')).toThrow(RangeError);
    expect(() => sdNotify(path(200), 'READY=1')).toThrow(RangeError);
    // An abstract name needs no NUL: '@' and 107 characters are the 108 bytes.
    expect(sdNotify(`@${'a'.repeat(107)}`, 'READY=1')).toBe(-111); // ECONNREFUSED
    expect(() => sdNotify(`@${'a'.repeat(108)}`, 'READY=1')).toThrow(RangeError);
    expect(() => sdNotify(path(20), `STATUS=${'x'.repeat(1017)}`)).toThrow(/longer than 1023 bytes/);
    expect(sdNotify(path(20), `STATUS=${'x'.repeat(1016)}`)).toBe(-2);
  });
});
