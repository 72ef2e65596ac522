// The control plane's error with a stable code (the admin API answers with it) and, for config
// problems, every `path: message`. refusedBy says whose the problems are: the config's (exit 1)
// or the system's, as a file the config names that cannot be read (exit 2), at start as on reload.

import type { ConfigProblem } from '../config/types.js';

export class DaemonError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly problems: readonly ConfigProblem[] = [],
    readonly refusedBy: 'config' | 'system' = 'config',
  ) {
    super(message);
  }
}
