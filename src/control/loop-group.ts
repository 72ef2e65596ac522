// The packet loops of one daemon, as the control plane sees them: one worker thread per loop
// (a PACKET_FANOUT group of their own spreads flows over their sockets by hash, so each flow stays
// in one loop's flow table), or a single loop on this thread for io: pcap (the cap addon polls on
// the process's default libuv loop). Counters and per-real flow counts are summed over the loops when read.

import { closeSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { Worker } from 'node:worker_threads';
import { COUNTER_SLOTS, Counter, createCounters } from '../dataplane/counters.js';
import { collectRecords, scanRecords, concatFlows, dedupeFlows, HANDOFF_GRACE_MS, type FlowBatch } from '../dataplane/flow-handoff.js';
import type { FlowTimeouts } from '../dataplane/flow-table.js';
import type { ForwardingSnapshot } from '../dataplane/forwarding-snapshot.js';
import { monotonicMs } from '../dataplane/monotonic-clock.js';
import { LoopRunner, type FanoutMembership, type LoopEvent, type LoopRequest, type LoopSettings } from '../dataplane/loop-runner.js';
import { DaemonError } from './daemon-error.js';
import { FanoutGroup } from './fanout-group.js';
import type { Logger } from './logger.js';

/** How long ask() waits for a loop that still runs; a loop answers within one wake-up (a few ms). */
export const ASK_TIMEOUT_MS = 5_000;

/**
 * A loop that ends by itself is started again in place, at most this many times in
 * RESTART_WINDOW_MS; one more loss in the window (a loop that dies on every start, or on some
 * packet that keeps coming) is handed to onLost and the daemon stops whole.
 */
export const RESTARTS_PER_WINDOW = 3;
export const RESTART_WINDOW_MS = 60_000;
/** Loops that lose their interface within this long of each other count as one restart. */
const INTERFACE_LOSS_GROUP_MS = 2_000;
/** How long a loop started again may take to be ready (a start takes well under a second). */
export const RESTART_READY_MS = 10_000;

/** Counter slots that hold a level, not a count: an ended loop's value is not carried into the sum. */
const LEVEL_SLOTS: readonly number[] = [Counter.loopHeartbeatMs, Counter.snapshotGeneration, Counter.flowTableEntries];

/**
 * Switches V8's memory reducer off for isolates created from now on, the packet loops' workers
 * among them. The reducer starts full collections on an isolate whose allocation rate fell after
 * its heap grew, to hand memory back: a loop that allocates nothing after its start is exactly
 * that, and got two mark-compact pauses (9.6 and 5.2 ms) about 8 s after each start, with more to
 * come whenever a snapshot message grew its heap. The loops' heaps are a few MiB; the pauses were
 * the only thing the reducer bought. V8 flags are per process (a worker cannot be given one), and
 * this one is read when an isolate is made, so the main thread's own isolate keeps its reducer
 * unless node was started with the flag (bin/dsrlb.js is).
 */
export function disableMemoryReducerForNewIsolates(): void {
  setFlagsFromString('--no-memory-reducer');
}

/** Closes a descriptor the group holds (once: its holder clears the field); a failure there changes nothing. */
function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // EBADF: nothing to close.
  }
}

/** Batches as one as of atMs, one row per flow (a single table's batch has no key twice). */
function merged(parts: readonly { batch: FlowBatch; atMs: number }[], atMs: number): FlowBatch {
  const joined = concatFlows(parts, atMs);
  return parts.length > 1 ? dedupeFlows(joined) : joined;
}

export class LoopError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

interface Loop {
  readonly settings: LoopSettings;
  readonly counters: Float64Array;
  active: Int32Array;
  inactive: Int32Array;
  running: boolean;
  /** Its worker thread ended (stop() must not wait for an 'exit' that already came). */
  exited: boolean;
  post(m: LoopRequest): void;
  worker: Worker | null;
  inline: LoopRunner | null;
  /** The error it reported while running (its interface gone), which ended it. */
  failure: { code: string; message: string } | null;
  /** Its flow table's records (shared memory), read when it has ended; null before it was ready. */
  flowRecords: SharedArrayBuffer | null;
  /** Stands for its socket in the fanout group's bookkeeping (passed on with a kept socket). */
  readonly holder: object;
  /** Its holder is in the fanout group on its account (until its socket is closed or handed on). */
  holdsGroup: boolean;
  /**
   * The group's descriptor of its socket (LoopEvent 'ready'), null without one: while the loop
   * runs the socket has two, so it outlives the loop's thread, and the loop that replaces it takes
   * it over.
   */
  keptSocket: number | null;
}

interface Pending {
  readonly waiting: Set<Loop>;
  readonly events: LoopEvent[];
  readonly done: (e: LoopEvent[]) => void;
  readonly timer: NodeJS.Timeout;
}

export type LoopBase = Omit<LoopSettings, 'counters' | 'fanout' | 'cpu'>;

export class LoopGroup {
  private loops: Loop[] = [];
  private readonly sum = new Float64Array(COUNTER_SLOTS);
  private seq = 0;
  // Per request: the loops that still owe an answer. A loop that ends is taken out of every
  // request (its flows go to the loop that replaces it, which answers later questions).
  private readonly pending = new Map<number, Pending>();
  localMac: Uint8Array = new Uint8Array(6);
  mtu = 1500;
  /** Flow-table entries over all loops (each holds its share of flowTable.capacity); 0 before start. */
  flowCapacity = 0;
  /** Loops started again after they ended by themselves (dsrlb_loop_restarts_total). */
  restarts = 0;
  /** Loops being started again: the group does not run whole until they are ready. */
  private restarting = 0;
  /**
   * Loops that ended and are being started again, by their replacement's settings: their last
   * per-real flow counts stand until the replacement runs (or is given up). Counted as 0 meanwhile,
   * a draining removed real was forgotten (its flows rescheduled), a removed service's VIP
   * released and a drain reported finished while its connections lived on.
   */
  private readonly replaced = new Map<object, Loop>();
  /**
   * Flows of loops that ended with no loop to take them: lost once the group gave up, or whose
   * replacement failed. The daemon stops then (exit 2) and keeps them in its flows file with the
   * living loops' (orphanFlows), so the start systemd makes next carries them on.
   */
  private readonly orphans: { batch: FlowBatch; atMs: number }[] = [];
  /** Monotonic times of the restarts in the last RESTART_WINDOW_MS. */
  private restartTimes: number[] = [];
  /** When a loop last ended because its interface went (losses of the loops together count once). */
  private lastInterfaceLossMs = -Infinity;
  /** The counts of loops that ended, so that the summed counters never go down. */
  private readonly retired = new Float64Array(COUNTER_SLOTS);
  private hasRetired = false;
  /** The last snapshot and timeouts broadcast: what a loop started again must run. */
  private lastSnapshot: ForwardingSnapshot | null = null;
  private lastTimeouts: FlowTimeouts | null = null;
  private stopped = false;
  /** Worker threads, by the settings startOne was given, until they exit (a replacement that hangs is terminated). */
  private readonly startingWorkers = new Map<Omit<LoopSettings, 'fanout'>, Worker>();
  /** A loss was handed to onLost: the group no longer runs whole, whatever its other loops do. */
  private broken = false;
  /** The loops' PACKET_FANOUT group; null for a single loop, which needs none. */
  private fanout: FanoutGroup | null = null;
  /**
   * The flows of the loops lost since the group last ran whole, one row per flow, as of atMs, and
   * how many losses made it: a loop started again is given them, and those of later losses when it
   * is ready (carryFlows).
   */
  private carried: { batch: FlowBatch; atMs: number } | null = null;
  /**
   * The flows of the loops being started again on a kept socket (by their settings) until they are
   * ready: they hold them already, but a loss without takeover meanwhile spreads them anew.
   */
  private readonly takeoverFlows = new Map<object, { batch: FlowBatch; atMs: number }>();
  private carriedLosses = 0;
  /** The carriedLosses each loop being started again was given (by its settings). */
  private readonly givenLosses = new WeakMap<object, number>();

  /**
   * Called when a loop ends by itself and cannot be started again (RESTARTS_PER_WINDOW used up, or
   * the new loop failed to start): the daemon stops, so that its supervisor (systemd's
   * Restart=on-failure) starts it whole again.
   */
  onLost: ((reason: string) => void) | null = null;
  /**
   * Told when a lost loop runs again, and whether its interface had gone (deleted, or made again:
   * the daemon puts back what it lost and announces the VIPs, whose MAC may be new) or not (a crash:
   * the same interface and MAC, nothing on the host or the segment to change).
   */
  onRestarted: ((e: { interfaceChanged: boolean }) => void) | null = null;

  private readonly now: () => number;
  private readonly restartsPerWindow: number;
  private readonly restartReadyMs: number;

  constructor(
    private readonly log: Logger,
    opts: { now?: () => number; restartsPerWindow?: number; restartReadyMs?: number } = {},
  ) {
    this.now = opts.now ?? monotonicMs;
    this.restartsPerWindow = opts.restartsPerWindow ?? RESTARTS_PER_WINDOW;
    this.restartReadyMs = opts.restartReadyMs ?? RESTART_READY_MS;
  }

  /**
   * Starts `count` loops (1 for pcap), loop i pinned to cpus[i % length], and resolves when all are
   * ready. With more than one, the first makes their fanout group, and the others are started once
   * it is ready, to join it (one worker's start, 0.1-0.2 s here, before the others start together).
   */
  async start(base: LoopBase, count: number, cpus: readonly number[] = []): Promise<void> {
    const n = base.io === 'pcap' ? 1 : count;
    this.fanout = n > 1 ? new FanoutGroup() : null;
    const cpuOf = (i: number): number | null => (cpus.length > 0 ? cpus[i % cpus.length]! : null);
    // flowTable.capacity is the daemon's, as memory is: each loop holds its share (fanout spreads
    // flows evenly by hash), not a whole table each.
    const flowCapacity = Math.ceil(base.flowCapacity / n);
    this.flowCapacity = flowCapacity * n;
    await Promise.all(Array.from({ length: n }, (_, i) => this.startOne({ ...base, flowCapacity, counters: createCounters(), cpu: cpuOf(i) })));
  }

  /** The PACKET_FANOUT group the loops are in, null without one (a single loop) or while none is (being made). */
  get fanoutGroupId(): number | null {
    return this.fanout?.id ?? null;
  }

  /**
   * Starts one loop with `unjoined` and its part in the fanout group (LoopSettings.fanout), which is
   * decided here, when it starts: the group may have been made, or be gone, since the loop it replaces
   * started. `unjoined` (the same object) names the starting worker in startingWorkers.
   */
  private async startOne(unjoined: Omit<LoopSettings, 'fanout'>, keptHolder: object | null = null): Promise<void> {
    // Stands for this loop in the fanout group's bookkeeping, from before its worker exists; a
    // socket taken over is in the group already, under the holder of the loop that opened it.
    const holder = keptHolder ?? {};
    const fanout = this.fanout;
    let membership: FanoutMembership = { mode: 'none' };
    if (unjoined.keptSocket != null && fanout !== null && fanout.id === null) {
      // The group went with the interface since (another loop's loss): the kept socket is bound to nothing.
      closeQuietly(unjoined.keptSocket);
      unjoined.keptSocket = null;
    }
    if (unjoined.keptSocket != null) {
      if (fanout !== null) membership = { mode: 'kept', groupId: fanout.id! };
    } else if (fanout !== null) {
      try {
        membership = await fanout.enter(holder);
      } catch (err) {
        fanout.leave(holder);
        throw err;
      }
      // Stopped, or given up on, while it waited for the group's id: nothing more to start.
      if (this.stopped || this.broken) {
        fanout.leave(holder);
        throw new LoopError('LOOP_STOPPED', 'the packet loops stopped before this one started');
      }
    }
    const settings: LoopSettings = { ...unjoined, fanout: membership };
    return new Promise<void>((resolve, reject) => {
      const loop: Loop = {
        settings,
        counters: settings.counters,
        active: new Int32Array(0),
        inactive: new Int32Array(0),
        running: false,
        exited: false,
        post: () => undefined,
        worker: null,
        inline: null,
        failure: null,
        flowRecords: null,
        holder,
        holdsGroup: fanout !== null,
        // The group's descriptor of a socket it takes over stays the group's: closed when this loop's
        // socket is done with (its exit, the group's stop), whatever becomes of the worker.
        keptSocket: unjoined.keptSocket ?? null,
      };
      const onEvent = (e: LoopEvent): void => {
        switch (e.type) {
          case 'ready':
            if (e.fanoutGroupId !== null) {
              // The group's id for the loops that wait to join it.
              fanout?.ready(holder, e.fanoutGroupId);
              if (membership.mode === 'make') this.log.info('packet loops share a new PACKET_FANOUT group', { fanoutGroupId: e.fanoutGroupId, interface: settings.interface });
            }
            this.localMac = e.localMac;
            this.mtu = e.mtu;
            loop.active = e.activeByReal;
            loop.inactive = e.inactiveByReal;
            loop.flowRecords = e.flowRecords;
            // A loop that took a socket over reports none: the group holds that socket's already.
            loop.keptSocket ??= e.keptSocket;
            loop.running = true;
            if (settings.adopt) this.log.info('the new packet loop holds the flows of the loop it replaces', { flows: e.adoptedFlows, given: settings.adopt.flows.count, socketTakenOver: settings.keptSocket != null });
            this.takeoverFlows.delete(unjoined);
            {
              // Loops lost without their socket since it started (or that it took over from a loop
              // that may not have been given them): the fanout spread changed, and it is given the
              // carried flows and the living loops'. Then the batch goes (it can be large).
              const given = this.givenLosses.get(unjoined) ?? 0;
              if (this.carried !== null && given < this.carriedLosses && !this.stopped && !this.broken) {
                const flows = this.withLiving(this.carried, monotonicMs(), settings.timeouts);
                if (flows.count > 0) loop.post({ type: 'adoptFlows', id: 0, flows, graceMs: HANDOFF_GRACE_MS });
              }
              settings.adopt = null;
              unjoined.adopt = null;
            }
            // Ready after stop() (a restart under way when the group stopped), or after it was given up on: it stops too.
            if (this.stopped || this.broken) {
              loop.running = false;
              loop.post({ type: 'stop' });
            } else {
              // A snapshot or timeouts broadcast while it started (it was not in the group yet).
              if (this.lastSnapshot !== null && this.lastSnapshot !== (settings.snapshot ?? null)) loop.post({ type: 'snapshot', snapshot: this.lastSnapshot });
              if (this.lastTimeouts !== null && this.lastTimeouts !== settings.timeouts) loop.post({ type: 'timeouts', timeouts: this.lastTimeouts });
              this.loops.push(loop);
            }
            resolve();
            break;
          case 'error':
            // A loop that failed to start (I/O, CPU pinning) ends its worker, or it would keep
            // the process alive after the daemon gave up. One that fails while it runs (its
            // interface gone) has closed its socket: its worker ends, and the loss takes its course.
            if (loop.running) {
              this.log.error('packet loop failed', { code: e.code, error: e.message });
              loop.failure = { code: e.code, message: e.message };
            }
            void loop.worker?.terminate();
            reject(new LoopError(e.code, e.message));
            break;
          case 'explained':
          case 'flows':
          case 'adopted': {
            const p = this.pending.get(e.id);
            if (!p || !p.waiting.delete(loop)) break;
            p.events.push(e);
            this.settleIfAnswered(e.id, p);
            break;
          }
          case 'stopped':
            loop.running = false;
            this.forgetLoop(loop);
            break;
        }
      };
      if (settings.io === 'pcap') {
        // Events arrive on a later turn, as from a worker, so both hosts behave alike.
        const runner = new LoopRunner(settings, (e) => setImmediate(() => onEvent(e)));
        loop.inline = runner;
        loop.post = (m) => setImmediate(() => runner.handle(m));
        void runner.start();
        return;
      }
      disableMemoryReducerForNewIsolates();
      const worker = this.createWorker(settings);
      this.startingWorkers.set(unjoined, worker);
      worker.once('exit', () => this.startingWorkers.delete(unjoined));
      loop.worker = worker;
      loop.post = (m) => worker.postMessage(m);
      worker.on('message', onEvent);
      // A worker that crashes emits 'error', then 'exit': the loss is handled once, at the first.
      worker.on('error', (err) => {
        const lost = loop.running;
        loop.running = false;
        this.forgetLoop(loop);
        this.log.error('packet loop crashed', { error: err.message });
        reject(err);
        if (lost) this.lose(loop, `packet loop crashed: ${err.message}`);
      });
      worker.on('exit', (code) => {
        const lost = loop.running;
        if (lost) this.log.warn('packet loop exited', { code });
        loop.running = false;
        loop.exited = true;
        this.forgetLoop(loop);
        // Its socket is closed, unless the group keeps it for the loop that replaces it: then it no
        // longer holds the fanout group (before a replacement asks for it).
        if (!(lost && this.keepsSocketOf(loop))) this.releaseSocket(loop);
        // One that ends before it was ready (a no-op once it was): its start fails, not hangs.
        reject(new LoopError('LOOP_EXITED', `packet loop exited with code ${code} before it was ready`));
        if (lost) this.lose(loop, loop.failure?.message ?? `packet loop exited with code ${code}`);
      });
    });
  }

  /**
   * A loop ended by itself: its counts are kept, it leaves the group, and a new loop with the same
   * settings, the last snapshot and fresh counters takes its place (its socket joins the loops'
   * fanout group, or makes a new one when no loop holds that any more, as after the interface
   * was made again). Its flows are read from its table's shared records and given to the new loop
   * before its first packet (carryFlows), so that connections stay on their reals (draining ones,
   * and wlc's picks, which the consistent hash would not find again). The VIPs, the announcements
   * and the health state carry on untouched, which a restart of the whole daemon would not.
   */
  private lose(loop: Loop, reason: string): void {
    const i = this.loops.indexOf(loop);
    if (i < 0) return;
    this.loops.splice(i, 1);
    for (let s = 0; s < COUNTER_SLOTS; s++) this.retired[s]! += loop.counters[s]!;
    for (const s of LEVEL_SLOTS) this.retired[s] = 0;
    this.hasRetired = true;
    // Given up already (onLost was told): the daemon is stopping, nothing more to start.
    if (this.broken) {
      this.keepOrphans(loop);
      this.releaseSocket(loop);
      return;
    }
    const takeOver = this.keepsSocketOf(loop);
    const now = this.now();
    this.restartTimes = this.restartTimes.filter((t) => now - t < RESTART_WINDOW_MS);
    // Every loop sees its interface go within a second of the others: one event for the budget,
    // or 4 workers used it up at once and the daemon stopped.
    let interfaceLoss = loop.failure?.code === 'EINTERFACE';
    const sameEvent = interfaceLoss && now - this.lastInterfaceLossMs < INTERFACE_LOSS_GROUP_MS;
    if (interfaceLoss) this.lastInterfaceLossMs = now;
    if (this.stopped || (!sameEvent && this.restartTimes.length >= this.restartsPerWindow)) {
      if (!this.stopped) this.log.error('packet loop lost too often: not starting it again', { restarts: this.restartTimes.length, windowSeconds: RESTART_WINDOW_MS / 1000 });
      this.keepOrphans(loop);
      this.releaseSocket(loop);
      this.broken = true;
      this.onLost?.(reason);
      return;
    }
    if (!sameEvent) this.restartTimes.push(now);
    this.restarts++;
    this.retired[Counter.loopRestarts] = this.restarts;
    this.restarting++;
    // Its part in the fanout group is decided anew when it starts (startOne).
    const { fanout: _previous, adopt: _adopted, keptSocket: _kept, ...same } = loop.settings;
    const settings: Omit<LoopSettings, 'fanout'> = {
      ...same,
      counters: createCounters(),
      timeouts: this.lastTimeouts ?? loop.settings.timeouts,
      snapshot: this.lastSnapshot ?? loop.settings.snapshot,
    };
    this.replaced.set(settings, loop);
    let keptHolder: object | null = null;
    const ended = this.endedFlows(loop);
    if (takeOver) {
      // The descriptor and the socket's place in the group pass to the new loop (startOne).
      settings.keptSocket = loop.keptSocket;
      loop.keptSocket = null;
      keptHolder = loop.holder;
      loop.holdsGroup = false;
      // Exactly its own flows: the same socket sees the same flows. Until it is ready they count as
      // a living loop's for a loss without takeover (carryFlows), and it is given the carried flows
      // when ready (given 0) in case the loop it replaces had not taken them in yet.
      settings.adopt = ended !== null && ended.batch.count > 0 ? { flows: ended.batch, atMs: ended.atMs, graceMs: null } : null;
      if (ended !== null) this.takeoverFlows.set(settings, ended);
      this.givenLosses.set(settings, 0);
    } else {
      settings.adopt = this.carryFlows(ended, settings.timeouts);
      this.givenLosses.set(settings, this.carriedLosses);
    }
    this.log.warn('starting the packet loop again', { reason, restartsInWindow: this.restartTimes.length, socketKept: takeOver });
    // A replacement that neither gets ready nor fails is given up on: `recovering` would otherwise
    // keep the VIPs announced (and systemd's watchdog fed) for a loop that never runs.
    let settled = false;
    const settle = (failure: string | null): void => {
      if (settled) return;
      settled = true;
      clearTimeout(giveUp);
      this.takeoverFlows.delete(settings);
      this.replaced.delete(settings);
      this.restarting--;
      // The group runs whole again (or has given up): what was carried has been given.
      if (this.restarting === 0) {
        this.carried = null;
        this.carriedLosses = 0;
      }
      if (failure === null) {
        if (!this.stopped) {
          this.log.info('packet loop started again');
          this.onRestarted?.({ interfaceChanged: interfaceLoss });
        }
        return;
      }
      // A stop under way ended it: nothing failed. Given up already (another loss): told once.
      if (this.stopped) return;
      // The ended loop's flows were to go to this replacement: kept for the flows file instead.
      if (ended !== null && ended.batch.count > 0) this.orphans.push(ended);
      const first = !this.broken;
      this.broken = true;
      this.log.error('packet loop could not be started again', { error: failure });
      if (first) this.onLost?.(`${reason}; starting it again failed: ${failure}`);
    };
    const giveUp = setTimeout(() => {
      void this.startingWorkers.get(settings)?.terminate();
      settle(`not ready within ${this.restartReadyMs / 1000} s`);
    }, this.restartReadyMs);
    giveUp.unref();
    this.startOne(settings, keptHolder).then(
      () => settle(null),
      (err: Error & { code?: string }) => {
        // Its interface was deleted (or made again) before the loop noticed: the socket is bound to
        // nothing. A new socket on the interface as it is now, once, as for a loop lost without one.
        if (takeOver && err.code === 'ENODEV' && !this.stopped && !this.broken) {
          this.log.warn('the ended packet loop\'s socket lost its interface: opening a new one', { error: err.message });
          interfaceLoss = true;
          const own = this.takeoverFlows.get(settings) ?? null;
          this.takeoverFlows.delete(settings);
          settings.keptSocket = null;
          settings.adopt = this.carryFlows(own, settings.timeouts);
          this.givenLosses.set(settings, this.carriedLosses);
          this.startOne(settings).then(
            () => settle(null),
            (again: Error) => settle(again.message),
          );
          return;
        }
        settle(err.message);
      },
    );
  }

  /**
   * Whether the loop started in place of `loop` takes its socket over: the group holds a descriptor
   * of it and the socket still has its interface. Then nothing moves: the kernel's fanout keeps its
   * members, so the other loops see the same flows as before, and what arrived for this loop while
   * none ran waits in its ring for the new one (a full ring drops and counts the rest).
   */
  private keepsSocketOf(loop: Loop): boolean {
    return loop.keptSocket !== null && loop.failure?.code !== 'EINTERFACE' && !this.stopped && !this.broken;
  }

  /** The loop's socket is closed (or never opened) for good: the group's descriptor goes, and its place in the fanout group. */
  private releaseSocket(loop: Loop): void {
    if (loop.keptSocket !== null) {
      closeQuietly(loop.keptSocket);
      loop.keptSocket = null;
    }
    if (loop.holdsGroup) {
      loop.holdsGroup = false;
      this.fanout?.leave(loop.holder, loop.failure?.code === 'EINTERFACE');
    }
  }

  /**
   * The flows of the loop that ended, read from its table's records (shared memory, which outlives
   * its thread: a crashed thread cannot hand anything over) as of now; null when it never got
   * ready, or on a failure (a warning: it costs the flows, never the restart).
   */
  /** A loop lost with no replacement: its flows for orphanFlows. */
  private keepOrphans(lost: Loop): void {
    const ended = this.endedFlows(lost);
    if (ended !== null && ended.batch.count > 0) this.orphans.push(ended);
  }

  /** The flows of loops lost with no loop to take them (see `orphans`), as of now; null when none. */
  orphanFlows(): FlowBatch | null {
    if (this.orphans.length === 0) return null;
    return merged(this.orphans, monotonicMs());
  }

  private endedFlows(lost: Loop): { batch: FlowBatch; atMs: number } | null {
    const records = lost.flowRecords;
    lost.flowRecords = null;
    if (records === null) return null;
    try {
      const atMs = monotonicMs();
      return { batch: collectRecords(records, this.lastTimeouts ?? lost.settings.timeouts, atMs), atMs };
    } catch (err) {
      this.log.warn('the flows of the ended packet loop are not carried: their packets go where the consistent hash puts them', { error: (err as Error).message });
      return null;
    }
  }

  /**
   * What a loop started without the ended loop's socket is given before its first packet: the
   * flows of the loops lost since the group last ran whole (`ended` the latest), and with several
   * loops the living loops' flows too, read from their records while they run (a record being
   * written at that instant may be read torn: one flow), and those of loops taking a socket over
   * that are not ready yet (takeoverFlows). With several loops the kernel's fanout hash, which user
   * space cannot compute, spreads every flow anew as a member leaves and joins: every loop is given
   * every flow (the living ones the others' at once, those taking a socket over when ready), and
   * the copies no packet touches go after HANDOFF_GRACE_MS. Synchronous, so that a loss while
   * another loop is being started again finds everything carried so far. A failure here costs the
   * flows (a warning), never the restart.
   */
  private carryFlows(ended: { batch: FlowBatch; atMs: number } | null, timeouts: FlowTimeouts): LoopSettings['adopt'] {
    try {
      const atMs = monotonicMs();
      if (ended !== null) this.carried = { batch: merged(this.carried === null ? [ended] : [ended, this.carried], atMs), atMs };
      this.carriedLosses++;
      const carried = this.carried ?? { batch: concatFlows([], atMs), atMs };
      if (this.fanout === null) return carried.batch.count > 0 ? { flows: carried.batch, atMs: carried.atMs, graceMs: null } : null;
      const living = this.living(atMs, timeouts);
      for (const { loop } of living) {
        if (loop === null) continue;
        const flows = merged([carried, ...living.filter((o) => o.loop !== loop)], atMs);
        if (flows.count > 0) loop.post({ type: 'adoptFlows', id: 0, flows, graceMs: HANDOFF_GRACE_MS });
      }
      const flows = merged([carried, ...living], atMs);
      return flows.count > 0 ? { flows, atMs, graceMs: HANDOFF_GRACE_MS } : null;
    } catch (err) {
      this.log.warn('the flows of the ended packet loop are not carried: their packets go where the consistent hash puts them', { error: (err as Error).message });
      return null;
    }
  }

  /** The running loops' flows (from their records) and those of loops taking a socket over (loop null), as of atMs. */
  private living(atMs: number, timeouts: FlowTimeouts): { loop: Loop | null; batch: FlowBatch; atMs: number }[] {
    const running = this.loops.filter((l) => l.running && l.flowRecords !== null).map((l) => ({ loop: l as Loop | null, batch: collectRecords(l.flowRecords!, timeouts, atMs), atMs }));
    const taking = [...this.takeoverFlows.values()].map((t) => ({ loop: null, batch: t.batch, atMs: t.atMs }));
    return [...running, ...taking];
  }

  /**
   * The running loops' live flows now that `keep` takes (dsrlb flows), read from their tables'
   * records in shared memory on this thread: the loops are not asked. `matched` counts every one
   * (a flow two loops hold for a minute after a hand-over counts twice), the batch holds at most
   * `limit` per loop, a flow listed by two loops once (its most recent copy). A record written at
   * that instant may be read torn (one flow).
   */
  flowsNow(keep: ((rec: Int32Array, base: number) => boolean) | null, limit: number): { batch: FlowBatch; matched: number } {
    const atMs = monotonicMs();
    let matched = 0;
    let complete = true;
    const parts: { batch: FlowBatch; atMs: number }[] = [];
    for (const l of this.loops) {
      if (!l.running || l.flowRecords === null) continue;
      const r = scanRecords(l.flowRecords, this.lastTimeouts ?? l.settings.timeouts, atMs, keep, limit, true);
      matched += r.matched;
      if (r.matched > limit) complete = false;
      parts.push({ batch: r.batch, atMs });
    }
    const batch = merged(parts, atMs);
    // A flow two loops hold (a hand-over's grace copy; a UDP flow whose fragments the fanout hash
    // gave to the other loop) is one flow: counted once when every match was read, which the
    // listing dedups anyway. (Cut by the limit, the sum of the loops' matches is all there is.)
    return { batch, matched: complete ? batch.count : matched };
  }

  /** `carried` with every living loop's flows, for a loop that was not among them when they were carried. */
  private withLiving(carried: { batch: FlowBatch; atMs: number }, atMs: number, timeouts: FlowTimeouts): FlowBatch {
    return merged([carried, ...this.living(atMs, timeouts)], atMs);
  }

  /** The thread that runs one loop (a seam: tests give a worker that speaks the same messages). */
  protected createWorker(settings: LoopSettings): Worker {
    return new Worker(new URL('../dataplane/loop-worker.js', import.meta.url), { workerData: settings });
  }

  get size(): number {
    return this.loops.length;
  }

  /** Every loop runs (a crashed worker makes the group unhealthy until its replacement is ready). */
  get running(): boolean {
    return !this.broken && this.restarting === 0 && this.loops.length > 0 && this.loops.every((l) => l.running);
  }

  /**
   * A loop that ended is being started again (within RESTARTS_PER_WINDOW): not running whole, but
   * not given up either. The VIPs stay announced meanwhile: a withdrawal and a new announcement
   * over the few hundred ms a restart takes would flap the route on every router, which costs more
   * than the packets lost in the gap (the fanout group spreads a lost loop's share over the others).
   */
  get recovering(): boolean {
    return !this.broken && !this.stopped && this.restarting > 0;
  }

  /** Age in ms of the stalest loop's heartbeat (both on the monotonic clock), Infinity before any loop ran. */
  heartbeatAgeMs(now = monotonicMs()): number {
    if (this.loops.length === 0) return Infinity;
    let oldest = Infinity;
    for (const l of this.loops) oldest = Math.min(oldest, l.counters[Counter.loopHeartbeatMs]!);
    return now - oldest;
  }

  broadcast(m: LoopRequest): void {
    if (m.type === 'snapshot') this.lastSnapshot = m.snapshot;
    else if (m.type === 'timeouts') this.lastTimeouts = m.timeouts;
    for (const l of this.loops) l.post(m);
  }

  /**
   * Asks every running loop (explain, flows) and resolves with their answers; a loop that ends
   * meanwhile is not waited for. Rejects (LOOP_UNANSWERED) when a running loop has not answered
   * within timeoutMs: a stalled loop must not hang the admin request that asked.
   */
  ask(make: (id: number) => LoopRequest, timeoutMs = ASK_TIMEOUT_MS): Promise<LoopEvent[]> {
    const id = ++this.seq;
    const asked = this.loops.filter((l) => l.running);
    return new Promise((resolve, reject) => {
      if (asked.length === 0) return resolve([]);
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new DaemonError('LOOP_UNANSWERED', `${p.waiting.size} of ${asked.length} packet loops did not answer within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      const p: Pending = { waiting: new Set(asked), events: [], done: resolve, timer };
      this.pending.set(id, p);
      const m = make(id);
      for (const l of asked) l.post(m);
    });
  }

  private settleIfAnswered(id: number, p: Pending): void {
    if (p.waiting.size > 0) return;
    this.pending.delete(id);
    clearTimeout(p.timer);
    p.done(p.events);
  }

  private forgetLoop(loop: Loop): void {
    for (const [id, p] of this.pending) if (p.waiting.delete(loop)) this.settleIfAnswered(id, p);
  }

  /** The counters summed over the loops (gauge-like slots such as the heartbeat are not summed). */
  counters(): Float64Array {
    // The common case, one loop that never ended: its own counters, nothing to add up.
    if (this.loops.length === 1 && !this.hasRetired) return this.loops[0]!.counters;
    const sum = this.sum;
    sum.set(this.retired);
    for (const l of this.loops) for (let i = 0; i < COUNTER_SLOTS; i++) sum[i]! += l.counters[i]!;
    if (this.loops.length > 0) {
      let oldest = Infinity;
      for (const l of this.loops) oldest = Math.min(oldest, l.counters[Counter.loopHeartbeatMs]!);
      sum[Counter.loopHeartbeatMs] = oldest;
      // The snapshot every living loop runs: an ended loop's is frozen.
      const living = this.loops.filter((l) => !l.exited);
      sum[Counter.snapshotGeneration] = Math.min(...(living.length > 0 ? living : this.loops).map((l) => l.counters[Counter.snapshotGeneration]!));
    }
    return sum;
  }

  /**
   * Flows on real `id` in the loops that run (an ended loop's are counted again by the loop that
   * takes them), and in a loop being started again, until its replacement runs (see `replaced`).
   */
  active(id: number): number {
    let n = 0;
    for (const l of this.loops) if (!l.exited) n += l.active[id] ?? 0;
    for (const l of this.replaced.values()) n += l.active[id] ?? 0;
    return n;
  }

  inactive(id: number): number {
    let n = 0;
    for (const l of this.loops) if (!l.exited) n += l.inactive[id] ?? 0;
    for (const l of this.replaced.values()) n += l.inactive[id] ?? 0;
    return n;
  }

  async stop(timeoutMs: number): Promise<void> {
    this.stopped = true;
    this.replaced.clear();
    const loops = this.loops;
    this.loops = [];
    await Promise.all(
      loops.map(async (l) => {
        l.running = false;
        this.forgetLoop(l);
        if (l.inline) {
          l.inline.handle({ type: 'stop' });
          return;
        }
        const w = l.worker!;
        if (l.exited) return;
        const exited = new Promise((r) => w.once('exit', r));
        w.postMessage({ type: 'stop' } satisfies LoopRequest);
        const timer = setTimeout(() => void w.terminate(), timeoutMs);
        await exited;
        clearTimeout(timer);
      }),
    );
    for (const l of loops) this.releaseSocket(l);
  }
}
