// Reads a config file from disk and validates it; the only config code that touches the filesystem.

import { readFile } from 'node:fs/promises';
import { parseConfigText, type ConfigResult } from './validate.js';

export { formatProblems, parseConfigText, type ConfigResult } from './validate.js';

/**
 * Loads and validates the config at `path`. A file that cannot be read is one problem at `(file)`;
 * the default stateFile is `dsrlb.state.json` beside the config.
 */
export async function loadConfigFile(path: string): Promise<ConfigResult> {
  return (await readConfigFile(path)).result;
}

/** As loadConfigFile, also returning the text that was validated (the daemon keeps the text in force). */
export async function readConfigFile(path: string): Promise<{ text: string | null; result: ConfigResult }> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    return { text: null, result: { ok: false, problems: [{ path: '(file)', message: `cannot read ${JSON.stringify(path)}: ${describeFsError(error)}` }] } };
  }
  return { text, result: parseConfigText(text, { sourcePath: path }) };
}

/** "ENOENT: no such file or directory, open '/x'" -> "ENOENT: no such file or directory"; the path is already named. */
function describeFsError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  return error.message.replace(/, \w+ '.*'$/, '');
}
