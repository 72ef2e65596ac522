// What an exec check's command must not get from the daemon: its ambient and inheritable
// capabilities. Ambient ones survive execve, so under the unit's AmbientCapabilities= every check
// script held CAP_NET_ADMIN and CAP_NET_RAW. Node cannot prctl() between fork and exec, so util-linux
// setpriv clears them and then execs the shell (same pid: the probe still kills the group it leads).

import { accessSync, constants, readFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** The daemon's capability sets that an exec'd command can inherit, as /proc/self/status shows them. */
export interface InheritedCapabilities {
  /** Effective uid. */
  readonly uid: number;
  /** CapInh and CapAmb, 16 hex digits each. */
  readonly inheritable: string;
  readonly ambient: string;
}

/** How exec checks start their shell: an argv prefix, and what to log once at the first check. */
export interface ExecLaunch {
  readonly prefix: readonly string[];
  readonly warning: { readonly msg: string; readonly fields: Record<string, unknown> } | null;
}

/**
 * setpriv's options: `-all` only lowers, which needs no capability. Not `--bounding-set=-all`:
 * without CAP_SETPCAP (the unit's user has none) libcap-ng skips the drop without an error, so it
 * would promise what it does not do; and as root it makes execve of a file-capability binary fail
 * with EPERM (Debian's ping is cap_net_raw=ep: a `ping` check would fail), while uid 0 without
 * capabilities still owns /etc and everything root owns, so it would not make a check unprivileged.
 */
export const SETPRIV_CLEAR_ARGS: readonly string[] = Object.freeze(['--inh-caps=-all', '--ambient-caps=-all', '--']);

/** Searched before PATH: the daemon's PATH, which its checks share, should not choose the program that drops their privileges. */
const SYSTEM_BIN_DIRS = ['/usr/bin', '/bin', '/usr/sbin', '/sbin'];

const ZERO_CAPS = /^0+$/;

export function parseInheritedCapabilities(status: string, uid: number): InheritedCapabilities {
  const field = (name: string): string => new RegExp(`^${name}:\\s*([0-9a-f]+)`, 'm').exec(status)?.[1] ?? '0';
  // A kernel without CapAmb (before 4.3) has no ambient set: nothing to inherit from it.
  return { uid, inheritable: field('CapInh'), ambient: field('CapAmb') };
}

/** Without a readable /proc the sets are unknown, which planExecLaunch takes as set: clearing is harmless. */
export function readInheritedCapabilities(): InheritedCapabilities {
  const uid = process.geteuid?.() ?? -1;
  try {
    return parseInheritedCapabilities(readFileSync('/proc/self/status', 'utf8'), uid);
  } catch {
    return { uid, inheritable: 'unknown', ambient: 'unknown' };
  }
}

/** setpriv's path, or null where util-linux's setpriv is not installed. */
export function findSetpriv(path = process.env.PATH ?? ''): string | null {
  const dirs = [...SYSTEM_BIN_DIRS, ...path.split(delimiter).filter((d) => d.startsWith('/'))];
  for (const dir of dirs) {
    const candidate = join(dir, 'setpriv');
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return null;
}

/**
 * The decision, as a pure function of the daemon's sets and where setpriv is:
 * - ambient or inheritable set: wrap with setpriv, which clears both; without setpriv the command
 *   keeps them, and that is logged (the check itself still runs).
 * - neither set, not root: nothing to clear (capabilities held only in the permitted and effective
 *   sets do not pass execve), no wrapper and no extra exec per check.
 * - root: a command run as uid 0 gets every capability of the bounding set at execve whatever the
 *   ambient and inheritable sets hold, and taking them away breaks checks that need root (see
 *   SETPRIV_CLEAR_ARGS), so it runs as root, as keepalived's scripts do without script_user, and
 *   as keepalived it is logged once. Ambient or inheritable sets are still cleared (a check that
 *   switches to another user must not carry them over).
 */
export function planExecLaunch(caps: InheritedCapabilities, setprivPath: string | null): ExecLaunch {
  const fields = { uid: caps.uid, capInh: caps.inheritable, capAmb: caps.ambient };
  const inherits = !ZERO_CAPS.test(caps.inheritable) || !ZERO_CAPS.test(caps.ambient);
  const prefix = inherits && setprivPath !== null ? [setprivPath, ...SETPRIV_CLEAR_ARGS] : [];
  if (inherits && setprivPath === null) {
    return {
      prefix,
      warning: { msg: "exec checks keep the daemon's ambient and inheritable capabilities: setpriv (util-linux) was not found to clear them", fields },
    };
  }
  if (caps.uid === 0) {
    return {
      prefix,
      warning: { msg: "exec checks run as root with the daemon's capabilities, as keepalived's scripts without script_user; the unit runs dsrlb as user dsrlb, whose checks get none", fields },
    };
  }
  return { prefix, warning: null };
}
