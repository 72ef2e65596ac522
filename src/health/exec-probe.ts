// The exec probe: run the check command through /bin/sh -c with DSRLB_REAL, DSRLB_PORT, DSRLB_VIP
// and DSRLB_SERVICE set; exit status 0 means up. The command runs in its own process group, which
// is killed (SIGKILL) when the shell exits and at the timeout, then together with every process
// below the shell (some, like timeout(1), leave its group). It gets none of the daemon's ambient or
// inheritable capabilities (exec-capabilities.ts).

import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createLogger, type Logger } from '../control/logger.js';
import { loadNative } from '../io/native-binding.js';
import { findSetpriv, planExecLaunch, readInheritedCapabilities, type ExecLaunch, type InheritedCapabilities } from './exec-capabilities.js';
import { OK, fail, failFromError, oneLine, timedOut, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from './probe.js';

/** How much of the command's output is kept for lastError. */
const OUTPUT_TAIL_BYTES = 512;
/** How long after the shell exits we wait for its pipes to close. */
const EXIT_GRACE_MS = 20;

export interface ExecProberOptions {
  /** Where the one-time note about the commands' capabilities goes (the daemon's log). */
  readonly log?: Logger;
  /** Instead of /proc/self/status (tests). */
  readonly capabilities?: InheritedCapabilities;
  /** setpriv's path, or null for none; looked up when absent (tests). */
  readonly setpriv?: string | null;
}

export class ExecProber implements Prober {
  /** Decided at the first check (the daemon's capability sets do not change while it runs). */
  private launch: ExecLaunch | null = null;

  constructor(
    private readonly shell = '/bin/sh',
    private readonly opts: ExecProberOptions = {},
  ) {}

  /** The argv prefix that clears the capabilities the command would inherit; logs once what it cannot clear. */
  private launchPrefix(): readonly string[] {
    if (this.launch === null) {
      const setpriv = this.opts.setpriv !== undefined ? this.opts.setpriv : findSetpriv();
      this.launch = planExecLaunch(this.opts.capabilities ?? readInheritedCapabilities(), setpriv);
      const warning = this.launch.warning;
      if (warning !== null) (this.opts.log ?? createLogger()).warn(warning.msg, warning.fields);
    }
    return this.launch.prefix;
  }

  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const command = target.check.command;
      if (command === null) return resolve(fail('error', 'exec check without a command'));
      // Sockets that packages opened without close-on-exec must not live on in the command.
      closeOnExecAll();
      // setpriv execs the shell in its own process: child.pid is the shell's, and the group leader.
      const argv = [...this.launchPrefix(), this.shell, '-c', command];
      const child = spawn(argv[0]!, argv.slice(1), {
        // detached: setsid(), so the shell leads a process group we can kill as a whole.
        detached: true,
        stdio: ['ignore', 'pipe', 'pipe'],
        env: {
          ...process.env,
          DSRLB_REAL: target.address,
          DSRLB_PORT: String(target.port),
          DSRLB_VIP: target.vip,
          DSRLB_SERVICE: target.service,
        },
      });
      let tail = Buffer.alloc(0);
      const keep = (chunk: Buffer): void => {
        tail = Buffer.concat([tail, chunk]);
        if (tail.length > OUTPUT_TAIL_BYTES) tail = tail.subarray(tail.length - OUTPUT_TAIL_BYTES);
      };
      child.stdout.on('data', keep);
      child.stderr.on('data', keep);
      let settled = false;
      let pipesClosed = false;
      let exited = false;
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        // Before the shell has exited its process group is alive, so the id cannot have been
        // reused. After 'exit' the group was killed then (below); what still holds the pipes left
        // the group, and the id may be free by now: it is not killed again.
        if (!pipesClosed && !exited) killTree(child.pid);
        child.stdout.destroy();
        child.stderr.destroy();
        resolve(outcome);
      };
      signal.onAbort(() => done(timedOut()));
      child.once('error', (err) => done(failFromError(err)));
      const verdict = (code: number | null, signalName: NodeJS.Signals | null): void => {
        if (code === 0) return done(OK);
        const output = oneLine(tail.toString('utf8'), 160);
        const how = code !== null ? `exit status ${code}` : `killed by ${signalName ?? 'a signal'}`;
        done(fail('exit', output ? `${how}: ${output}` : how));
      };
      // 'close' comes once the pipes are drained, so the output tail is complete; but a background
      // child holding stdout must not delay the verdict past a short grace after the shell's exit.
      child.once('close', (code, signalName) => {
        pipesClosed = true;
        verdict(code, signalName);
      });
      child.once('exit', (code, signalName) => {
        exited = true;
        // What the shell left in its group (a background job with its output redirected holds no
        // pipe, so 'close' does not wait for it) goes with it. The group id cannot have been
        // reused while a member lives; with none left the kill finds nothing.
        if (child.pid !== undefined) kill(-child.pid);
        setTimeout(() => verdict(code, signalName), EXIT_GRACE_MS);
      });
    });
  }
}

/**
 * SIGKILL the shell's process group and every process below the shell, with the groups they lead:
 * `timeout 5 curl ...` (GNU timeout) moves itself and its child into a group of their own, which
 * the shell's group no longer holds.
 */
function killTree(pid: number | undefined): void {
  if (pid === undefined) return;
  const below = descendants(pid);
  kill(-pid);
  for (const p of below) {
    kill(-p);
    kill(p);
  }
}

/** Best effort: without the addon (never in a daemon, which needs it) a command may inherit descriptors. */
function closeOnExecAll(): void {
  try {
    loadNative().closeOnExecAll();
  } catch {
    // no addon: nothing to do
  }
}

function kill(target: number): void {
  try {
    process.kill(target, 'SIGKILL');
  } catch {
    // ESRCH: gone already (or not a group leader), the usual case.
  }
}

/** Every process below pid, read from /proc/PID/task/TID/children (none when /proc cannot tell). */
function descendants(pid: number): number[] {
  const found: number[] = [];
  const pending = [pid];
  while (pending.length > 0 && found.length < 10_000) {
    const p = pending.pop()!;
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      let text = '';
      try {
        text = readFileSync(`/proc/${p}/task/${t}/children`, 'utf8');
      } catch {
        continue;
      }
      for (const word of text.split(' ')) {
        const child = Number(word);
        if (Number.isInteger(child) && child > 0) {
          found.push(child);
          pending.push(child);
        }
      }
    }
  }
  return found;
}
