// The tcp probe: a real is up when a TCP connection to its check port completes. The connection
// is closed at once; nothing is sent.

import { connect } from 'node:net';
import { OK, failFromError, timedOut, type ProbeOutcome, type ProbeTarget, type Prober } from './probe.js';

export class TcpProber implements Prober {
  probe(target: ProbeTarget, signal: AbortSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const socket = connect({ host: target.address, port: target.port });
      const done = (outcome: ProbeOutcome): void => {
        signal.removeEventListener('abort', onAbort);
        socket.destroy();
        resolve(outcome);
      };
      const onAbort = (): void => done(timedOut());
      signal.addEventListener('abort', onAbort, { once: true });
      socket.once('connect', () => done(OK));
      socket.once('error', (err) => done(failFromError(err)));
    });
  }
}
