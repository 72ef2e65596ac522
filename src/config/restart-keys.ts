// Top-level keys a running daemon takes only on a restart: a reload that changes one is refused,
// and `dsrlb plan` warns about it. One list, so the two never disagree.
import type { Config } from './types.js';
import { formatListen } from './validate.js';

/** A restart-only key whose value differs between two configs. */
export interface RestartChange {
  /** Its config path, e.g. 'flowTable.capacity'. */
  readonly path: string;
  /** What it is, for a sentence ("the number of packet loops"). */
  readonly what: string;
  readonly before: string;
  readonly after: string;
  /** Why it matters beyond the restart, or null. */
  readonly why: string | null;
}

const RESTART_KEYS: readonly { path: string; what: string; value: (c: Config) => string; why?: string }[] = [
  { path: 'interface', what: 'the interface', value: (c) => c.interface },
  { path: 'io', what: 'io', value: (c) => c.io },
  { path: 'ring', what: 'the ring', value: (c) => c.ring },
  { path: 'workers', what: 'the number of packet loops', value: (c) => String(c.workers) },
  { path: 'cpus', what: "the packet loops' CPUs", value: (c) => `[${c.cpus.join(', ')}]` },
  { path: 'flowTable.capacity', what: 'the flow table capacity', value: (c) => String(c.flowTable.capacity) },
  { path: 'hashSeed', what: 'hashSeed', value: (c) => String(c.hashSeed), why: 'it would move every flow' },
  // The listeners are bound once, at start; admin.tokenFile (and the token in it) is re-read on reload.
  { path: 'admin.listen', what: "the admin API's address", value: (c) => formatListen(c.admin.listen) },
  { path: 'metrics.listen', what: "the metrics' address", value: (c) => formatListen(c.metrics.listen) },
];

/** The restart-only keys that `next` changes, in the order above. */
export function restartOnlyChanges(current: Config, next: Config): RestartChange[] {
  const out: RestartChange[] = [];
  for (const k of RESTART_KEYS) {
    const before = k.value(current);
    const after = k.value(next);
    if (before !== after) out.push({ path: k.path, what: k.what, before, after, why: k.why ?? null });
  }
  return out;
}
