// The icmp probe: an echo request to the real, up on the matching echo reply. One raw socket per
// address family (the `raw-socket` package) serves every concurrent probe; replies are matched by
// identifier, sequence and source. The socket is opened on demand and closed when no probe waits.

import { createRequire } from 'node:module';
import { isIPv6 } from 'node:net';
import { normalizedAddress } from '../control/addresses.js';
import { OK, fail, oneLine, timedOut, type ProbeOutcome, type ProbeSignal, type ProbeTarget, type Prober } from './probe.js';

/** The part of `raw-socket` used here; the package ships no types, so this is its whole surface. */
interface RawSocket {
  on(event: 'message', listener: (buffer: Buffer, source: string) => void): this;
  on(event: 'error', listener: (error: Error) => void): this;
  on(event: 'close', listener: () => void): this;
  send(buffer: Buffer, offset: number, length: number, address: string, afterSend: (error: Error | null, bytes: number) => void): this;
  close(): this;
}
interface RawSocketModule {
  createSocket(options: { protocol: number; addressFamily?: number; bufferSize?: number }): RawSocket;
  createChecksum(...buffers: Buffer[]): number;
  writeChecksum(buffer: Buffer, offset: number, checksum: number): Buffer;
  readonly Protocol: { readonly ICMP: number; readonly ICMPv6: number };
  readonly AddressFamily: { readonly IPv4: number; readonly IPv6: number };
}

const raw = createRequire(import.meta.url)('raw-socket') as RawSocketModule;

// ICMP types: RFC 792 (IPv4) and RFC 4443 (IPv6).
const ECHO_REQUEST_V4 = 8;
const ECHO_REPLY_V4 = 0;
const UNREACHABLE_V4 = 3;
const ECHO_REQUEST_V6 = 128;
const ECHO_REPLY_V6 = 129;
const UNREACHABLE_V6 = 1;
const HEADER_BYTES = 8;
const DATA = Buffer.from('dsrlb-health-probe', 'ascii');

interface Waiter {
  readonly address: string;
  readonly resolve: (outcome: ProbeOutcome) => void;
}

/** One family's socket and the probes waiting on it, keyed by sequence number. */
class EchoChannel {
  private socket: RawSocket | null = null;
  private readonly waiting = new Map<number, Waiter>();
  private sequence = 0;

  constructor(
    private readonly v6: boolean,
    private readonly identifier: number,
  ) {}

  get pending(): number {
    return this.waiting.size;
  }

  ping(address: string, signal: ProbeSignal): Promise<ProbeOutcome> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve(timedOut());
      let socket: RawSocket;
      try {
        socket = this.open();
      } catch (err) {
        return resolve(fail('error', `raw ICMP socket: ${oneLine(String((err as Error).message ?? err))}`));
      }
      const sequence = this.nextFreeSequence();
      if (sequence < 0) return resolve(fail('error', 'more than 65535 ICMP probes in flight'));
      const finish = (outcome: ProbeOutcome): void => {
        if (this.waiting.get(sequence)?.resolve !== finish) return;
        this.waiting.delete(sequence);
        this.closeIfIdle();
        resolve(outcome);
      };
      signal.onAbort(() => finish(timedOut()));
      this.waiting.set(sequence, { address, resolve: finish });
      const packet = this.echoRequest(sequence);
      socket.send(packet, 0, packet.length, address, (error) => {
        if (error) finish(failFromSendError(error));
      });
    });
  }

  private nextFreeSequence(): number {
    for (let i = 0; i < 0x10000; i++) {
      this.sequence = (this.sequence + 1) & 0xffff;
      if (!this.waiting.has(this.sequence)) return this.sequence;
    }
    return -1;
  }

  private echoRequest(sequence: number): Buffer {
    const packet = Buffer.alloc(HEADER_BYTES + DATA.length);
    packet[0] = this.v6 ? ECHO_REQUEST_V6 : ECHO_REQUEST_V4;
    packet.writeUInt16BE(this.identifier, 4);
    packet.writeUInt16BE(sequence, 6);
    DATA.copy(packet, HEADER_BYTES);
    // The kernel fills the ICMPv6 checksum (it covers a pseudo-header we do not see).
    if (!this.v6) raw.writeChecksum(packet, 2, raw.createChecksum(packet));
    return packet;
  }

  private open(): RawSocket {
    if (this.socket) return this.socket;
    const socket = raw.createSocket(
      this.v6
        ? { protocol: raw.Protocol.ICMPv6, addressFamily: raw.AddressFamily.IPv6 }
        : { protocol: raw.Protocol.ICMP, addressFamily: raw.AddressFamily.IPv4 },
    );
    socket.on('message', (buffer, source) => this.onMessage(buffer, source));
    // Fail the waiting probes and reopen next time. raw-socket closes the socket itself after a
    // send or poll error but not after a receive error, so close it here too (closing twice is
    // harmless): a socket dropped open would go on receiving every ICMP packet of the host.
    socket.on('error', (error) => {
      if (this.socket === socket) this.socket = null;
      try {
        socket.close();
      } catch {
        // closed already
      }
      const outcome = fail('error', `raw ICMP socket: ${oneLine(error.message)}`);
      for (const waiter of [...this.waiting.values()]) waiter.resolve(outcome);
    });
    this.socket = socket;
    return socket;
  }

  private closeIfIdle(): void {
    if (this.waiting.size > 0 || this.socket === null) return;
    const socket = this.socket;
    this.socket = null;
    socket.close();
  }

  private onMessage(buffer: Buffer, source: string): void {
    // IPv4 raw sockets deliver the IP header too; IPv6 ones start at the ICMPv6 header.
    let offset = 0;
    if (!this.v6) {
      if (buffer.length < 20) return;
      offset = (buffer[0]! & 0x0f) * 4;
    }
    if (buffer.length < offset + HEADER_BYTES) return;
    const type = buffer[offset]!;
    if (type === (this.v6 ? ECHO_REPLY_V6 : ECHO_REPLY_V4)) {
      if (buffer.readUInt16BE(offset + 4) !== this.identifier) return;
      const waiter = this.waiting.get(buffer.readUInt16BE(offset + 6));
      if (waiter && sameAddress(waiter.address, source)) waiter.resolve(OK);
      return;
    }
    if (type === (this.v6 ? UNREACHABLE_V6 : UNREACHABLE_V4)) this.onUnreachable(buffer, offset, source);
  }

  /** Destination unreachable quoting one of our requests: fail that probe now, not at the timeout. */
  private onUnreachable(buffer: Buffer, offset: number, source: string): void {
    const code = buffer[offset + 1]!;
    const quoted = offset + HEADER_BYTES;
    let inner: number;
    if (this.v6) {
      inner = quoted + 40; // fixed IPv6 header; our requests carry no extension headers
    } else {
      if (buffer.length < quoted + 20) return;
      inner = quoted + (buffer[quoted]! & 0x0f) * 4;
    }
    if (buffer.length < inner + HEADER_BYTES) return;
    if (buffer[inner] !== (this.v6 ? ECHO_REQUEST_V6 : ECHO_REQUEST_V4)) return;
    if (buffer.readUInt16BE(inner + 4) !== this.identifier) return;
    const waiter = this.waiting.get(buffer.readUInt16BE(inner + 6));
    if (waiter) waiter.resolve(fail('unreachable', `ICMP destination unreachable (code ${code}) from ${source}`));
  }
}

export class IcmpProber implements Prober {
  private readonly v4: EchoChannel;
  private readonly v6: EchoChannel;

  /** `identifier` tells our replies from other pingers' on the same host. */
  constructor(identifier: number = (process.pid ^ Math.floor(Math.random() * 0x10000)) & 0xffff) {
    this.v4 = new EchoChannel(false, identifier);
    this.v6 = new EchoChannel(true, identifier);
  }

  /** Probes waiting for a reply (both families); the sockets are closed when this is 0. */
  get pending(): number {
    return this.v4.pending + this.v6.pending;
  }

  probe(target: ProbeTarget, signal: ProbeSignal): Promise<ProbeOutcome> {
    return (isIPv6(target.address) ? this.v6 : this.v4).ping(target.address, signal);
  }
}

function sameAddress(expected: string, source: string): boolean {
  return normalizedAddress(expected) === normalizedAddress(source);
}

function failFromSendError(error: Error): ProbeOutcome {
  const text = oneLine(error.message);
  return /unreachable|no route/i.test(text) ? fail('unreachable', text) : fail('error', `send: ${text}`);
}
