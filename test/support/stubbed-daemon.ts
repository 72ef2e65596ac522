// A Daemon on stand-ins for its packet loops, host setup and neighbour watcher, with `text` as its
// config (written to `file`, which reload() reads again). Nothing is started: the caller wires
// health and calls syncReals/rebuild as its test needs. No root.

import { writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { parseConfigText } from '../../src/config/validate.js';
import { Daemon } from '../../src/control/daemon.js';
import { createLogger } from '../../src/control/logger.js';
import { createCounters } from '../../src/dataplane/counters.js';
import type { LoopRequest } from '../../src/dataplane/loop-runner.js';

export interface StubOptions {
  /** Active flows every real holds (0: removed reals may be forgotten; above: they keep their ids). */
  readonly activeFlows: number;
  /** Every message the daemon posts to its loops (snapshots among them). */
  readonly broadcast?: (m: LoopRequest) => void;
  /** The host setup stand-in; default: changes nothing, no interface address is a VIP. */
  readonly host?: object;
  /** Each log line (JSON). */
  readonly log?: (line: string) => void;
}

export function stubbedDaemon(file: string, text: string, opts: StubOptions): { daemon: Daemon; inside: Record<string, unknown>; counters: Float64Array } {
  const parsed = parseConfigText(text);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  writeFileSync(file, text);
  const daemon = new Daemon(file, createLogger(opts.log ?? (() => undefined)));
  daemon.config = parsed.config;
  daemon.configText = text;
  // Run records (the state file's, after a reload moves it) beside the config, not in /run/dsrlb.
  daemon.runDir = dirname(file);
  const inside = daemon as unknown as Record<string, unknown>;
  const counters = createCounters();
  inside.loops = {
    running: true,
    heartbeatAgeMs: () => 0,
    broadcast: opts.broadcast ?? (() => undefined),
    counters: () => counters,
    active: () => opts.activeFlows,
    inactive: () => 0,
    orphanFlows: () => null,
  };
  inside.host = opts.host ?? { apply: async () => undefined, interfaceAddressesAmong: async () => new Map() };
  inside.neighbors = { setWanted: () => undefined, macOf: () => new Uint8Array(6) };
  return { daemon, inside, counters };
}
