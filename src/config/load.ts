// Reads a config file from disk and validates it; the only config code that touches the filesystem.

import { readFile } from 'node:fs/promises';
import { adminSectionDespiteErrors, parseConfigText, parseConfigYaml, validateAdminSettings, type ConfigResult } from './validate.js';
import { locateProblems } from './problem-positions.js';
import type { ConfigProblem } from './types.js';
import { withoutBom } from './yaml-document.js';

export { formatProblems, parseConfigText, validateAdminSettings, type AdminSettingsResult, type ConfigResult } from './validate.js';

/**
 * Loads and validates the config at `path`. A file that cannot be read is one problem at `(file)`;
 * the default stateFile is `dsrlb.state.json` in systemd's state directory when the daemon runs
 * under a unit with StateDirectory=, else beside the config.
 */
export async function loadConfigFile(path: string): Promise<ConfigResult> {
  return (await readConfigFile(path)).result;
}

/** As loadConfigFile, also returning the text that was validated (the daemon keeps the text in force). */
export async function readConfigFile(path: string): Promise<{ text: string | null; result: ConfigResult }> {
  const read = await readText(path);
  if (!read.ok) return { text: null, result: { ok: false, problems: [read.problem] } };
  return { text: read.text, result: parseConfigText(read.text, { sourcePath: path, ...stateDirectoryOf(process.env) }) };
}

/** The first of systemd's $STATE_DIRECTORY (a colon-separated list of absolute paths), if set. */
export function stateDirectoryOf(env: NodeJS.ProcessEnv): { stateDirectory?: string } {
  const first = env.STATE_DIRECTORY?.split(':')[0];
  return first !== undefined && first.startsWith('/') ? { stateDirectory: first } : {};
}

/**
 * Only the admin section of the config at `path` (see validateAdminSettings): the CLI's admin
 * commands use it, so a mistake elsewhere in the file does not cut the operator off from the
 * daemon. A file that does not exist is `ok: false` with `missing: true`, so the caller can fall
 * back to the default admin address. YAML errors outside the admin section leave it usable; any
 * other read or YAML error is a plain problem.
 */
export async function loadAdminSettings(path: string): Promise<ReturnType<typeof validateAdminSettings> & { missing?: boolean }> {
  const read = await readText(path);
  if (!read.ok) return read.missing ? { ok: false, problems: [read.problem], missing: true } : { ok: false, problems: [read.problem] };
  const parsed = parseConfigYaml(read.text);
  let admin: unknown;
  if (parsed.ok) {
    admin = parsed.raw;
  } else {
    admin = adminSectionDespiteErrors(read.text);
    if (admin === undefined) return parsed;
  }
  const settings = validateAdminSettings(admin, { sourcePath: path });
  return settings.ok ? settings : { ok: false, problems: locateProblems(withoutBom(read.text), settings.problems) };
}

async function readText(path: string): Promise<{ ok: true; text: string } | { ok: false; problem: ConfigProblem; missing: boolean }> {
  try {
    return { ok: true, text: await readFile(path, 'utf8') };
  } catch (error) {
    const missing = (error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT';
    return { ok: false, problem: { path: '(file)', message: `cannot read ${JSON.stringify(path)}: ${describeFsError(error)}` }, missing };
  }
}

/** "ENOENT: no such file or directory, open '/x'" -> "ENOENT: no such file or directory"; the path is already named. */
function describeFsError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  return error.message.replace(/, \w+ '.*'$/, '');
}
