// How to start the `dsrlb` command from node itself (the demo, the tests, the bench): with the node
// flags its `#!/usr/bin/env -S node ...` line gives, read from that line so there is one list.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/** The node flags on bin/dsrlb.js's `#!` line (after `env -S node`). */
export function commandNodeFlags(repoRoot: string): string[] {
  const first = readFileSync(join(repoRoot, 'bin', 'dsrlb.js'), 'utf8').split('\n', 1)[0]!;
  const words = first.replace(/^#!\S*env\s+(-S\s+)?/, '').trim().split(/\s+/);
  return words.slice(1);
}

/** argv that runs `dsrlb` under this node as the installed command runs: [node, ...flags, bin/dsrlb.js]. */
export function dsrlbArgv(repoRoot: string): string[] {
  return [process.execPath, ...commandNodeFlags(repoRoot), join(repoRoot, 'bin', 'dsrlb.js')];
}
