// The tcp probe: a real is up when a TCP connection to its check port completes. The connection
// is closed at once; nothing is sent. An address literal connects without a DNS lookup.

import { connect } from 'node:net';
import { OK, failFromError, timedOut, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from './probe.js';

export class TcpProber implements Prober {
  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const socket = connect(target.port, target.address);
      let settled = false;
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        socket.destroy();
        resolve(outcome);
      };
      signal.onAbort(() => done(timedOut()));
      socket.on('connect', () => done(OK));
      socket.on('error', (err) => done(failFromError(err)));
    });
  }
}
