// The udp probe: send the payload from a connected socket and wait for a reply (holding
// expectPayload when set). Connecting the socket makes the kernel hand us ICMP port-unreachable
// as ECONNREFUSED, so a closed port fails at once instead of at the timeout.

import { createSocket } from 'node:dgram';
import { isIPv6 } from 'node:net';
import { OK, fail, failFromError, oneLine, timedOut, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from './probe.js';

export class UdpProber implements Prober {
  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      const { check } = target;
      const payload = Buffer.from(check.payload ?? 'ping', 'utf8');
      const socket = createSocket(isIPv6(target.address) ? 'udp6' : 'udp4');
      let settled = false;
      const done = (outcome: ProbeOutcome): void => {
        if (settled) return;
        settled = true;
        socket.close();
        resolve(outcome);
      };
      signal.onAbort(() => done(timedOut()));
      socket.on('error', (err) => done(failFromError(err)));
      // A connected socket only receives from the real, so the first reply is the answer.
      socket.on('message', (reply: Buffer) => {
        const expected = check.expectPayload;
        if (expected === null || reply.toString('utf8').includes(expected)) return done(OK);
        done(fail('body', `reply ${oneLine(JSON.stringify(reply.toString('utf8')), 60)} lacks ${JSON.stringify(oneLine(expected, 60))}`));
      });
      // A failed connect (no route, EACCES) comes to this callback as its argument, not as an
      // 'error' event; sending on the unconnected socket would then throw out of the daemon.
      socket.connect(target.port, target.address, (err?: Error) => {
        if (settled) return;
        if (err) return done(failFromError(err));
        socket.send(payload, (sendErr) => {
          if (sendErr) done(failFromError(sendErr));
        });
      });
    });
  }
}
