// The control plane's error with a stable code (the admin API answers with it) and, for config
// problems, every `path: message`.

import type { ConfigProblem } from '../config/types.js';

export class DaemonError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly problems: readonly ConfigProblem[] = [],
  ) {
    super(message);
  }
}
