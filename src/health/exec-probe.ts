// The exec probe: run the check command through /bin/sh -c with DSRLB_REAL, DSRLB_PORT, DSRLB_VIP
// and DSRLB_SERVICE set; exit status 0 means up. The command runs in its own process group, which
// is killed (SIGKILL) at the timeout, or when the shell exits leaving children that hold its pipes.

import { spawn } from 'node:child_process';
import { OK, fail, failFromError, oneLine, timedOut, type ProbeOutcome, type ProbeTarget, type Prober } from './probe.js';

/** How much of the command's output is kept for lastError. */
const OUTPUT_TAIL_BYTES = 512;
/** How long after the shell exits we wait for its pipes to close. */
const EXIT_GRACE_MS = 20;

export class ExecProber implements Prober {
  constructor(private readonly shell = '/bin/sh') {}

  probe(target: ProbeTarget, signal: AbortSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const command = target.check.command;
      if (command === null) return resolve(fail('error', 'exec check without a command'));
      const child = spawn(this.shell, ['-c', command], {
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
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        signal.removeEventListener('abort', onAbort);
        // Open pipes mean the shell, or a child it left behind, still runs: its process group is
        // alive, so the id cannot have been reused. After 'close' there is nothing left to kill.
        if (!pipesClosed) killGroup(child.pid);
        child.stdout.destroy();
        child.stderr.destroy();
        resolve(outcome);
      };
      const onAbort = (): void => done(timedOut());
      signal.addEventListener('abort', onAbort, { once: true });
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
        setTimeout(() => verdict(code, signalName), EXIT_GRACE_MS);
      });
    });
  }
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // ESRCH: the group is already gone, which is the usual case after a clean exit.
  }
}
