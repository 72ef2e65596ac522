// The packet loop's thread: opens the packet I/O, runs the engine on every batch, and takes new
// snapshots from the control plane between batches. Nothing here blocks: no config parsing,
// no health checks, no HTTP. Messages in and out are described by LoopRequest / LoopEvent.

import { parentPort, workerData } from 'node:worker_threads';
import { performance } from 'node:perf_hooks';
import { Engine, Placement } from './engine.js';
import type { FlowTimeouts } from './flow-table.js';
import type { ForwardingSnapshot } from './forwarding-snapshot.js';
import { ParsedPacket } from './parsed-packet.js';
import type { PacketIo } from '../io/packet-io.js';

export interface LoopWorkerData {
  io: 'afpacket' | 'pcap';
  interface: string;
  flowCapacity: number;
  timeouts: FlowTimeouts;
  maxRealIds: number;
  counters: Float64Array;
}

export type LoopRequest =
  | { type: 'snapshot'; snapshot: ForwardingSnapshot }
  | { type: 'timeouts'; timeouts: FlowTimeouts }
  | { type: 'explain'; id: number; family: number; protocol: number; addr: Uint32Array; srcPort: number; dstPort: number }
  | { type: 'flows'; id: number; limit: number }
  | { type: 'stop' };

export type LoopEvent =
  | { type: 'ready'; localMac: Uint8Array; mtu: number; activeByReal: Int32Array; inactiveByReal: Int32Array }
  | { type: 'error'; code: string; message: string }
  | { type: 'explained'; id: number; real: number; placement: string; generation: number }
  | { type: 'flows'; id: number; keys: Uint32Array; reals: Int32Array; count: number }
  | { type: 'stopped' };

const placementNames: Record<number, string> = {
  [Placement.flowTable]: 'flow-table',
  [Placement.scheduled]: 'scheduler',
  [Placement.consistentHash]: 'consistent-hash',
  [Placement.rescheduled]: 'rescheduled',
};

function post(e: LoopEvent): void {
  parentPort!.postMessage(e);
}

async function openIo(data: LoopWorkerData): Promise<PacketIo> {
  if (data.io === 'pcap') {
    const { PcapIo } = await import('../io/pcap-io.js');
    return PcapIo.open({ interface: data.interface });
  }
  const { AfPacketIo } = await import('../io/afpacket-io.js');
  return AfPacketIo.open({ interface: data.interface });
}

async function main(): Promise<void> {
  const data = workerData as LoopWorkerData;
  let io: PacketIo;
  try {
    io = await openIo(data);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    post({ type: 'error', code: e.code ?? 'EIO', message: `opening ${data.io} on ${data.interface}: ${e.message}` });
    return;
  }
  const engine = new Engine({
    flowCapacity: data.flowCapacity,
    timeouts: data.timeouts,
    maxRealIds: data.maxRealIds,
    counters: data.counters,
    localMac: io.localMac,
  });
  const origin = performance.timeOrigin;
  io.start((batch) => engine.processBatch(batch, origin + performance.now()));
  const housekeeping = setInterval(() => engine.housekeeping(origin + performance.now(), 50_000), 100);
  const scratch = new ParsedPacket();

  parentPort!.on('message', (m: LoopRequest) => {
    switch (m.type) {
      case 'snapshot':
        engine.setSnapshot(m.snapshot);
        break;
      case 'timeouts':
        engine.setTimeouts(m.timeouts);
        break;
      case 'explain': {
        scratch.reset();
        scratch.family = m.family;
        scratch.ipProtocol = m.protocol;
        scratch.addr.set(m.addr);
        scratch.srcPort = m.srcPort;
        scratch.dstPort = m.dstPort;
        const real = engine.explain(scratch, origin + performance.now());
        post({
          type: 'explained',
          id: m.id,
          real,
          placement: placementNames[engine.lastPlacement] ?? 'none',
          generation: engine.snapshot().generation,
        });
        break;
      }
      case 'flows': {
        const flows = engine.flows;
        const limit = Math.min(m.limit, flows.size);
        const keys = new Uint32Array(limit * 10);
        const reals = new Int32Array(limit);
        const k = new Uint32Array(10);
        let count = 0;
        for (let e = flows.next(-1); e >= 0 && count < limit; e = flows.next(e)) {
          flows.readKey(e, k);
          keys.set(k, count * 10);
          reals[count] = flows.realOf(e);
          count++;
        }
        post({ type: 'flows', id: m.id, keys, reals, count });
        break;
      }
      case 'stop':
        clearInterval(housekeeping);
        io.close();
        post({ type: 'stopped' });
        parentPort!.close();
        break;
    }
  });
  post({
    type: 'ready',
    localMac: io.localMac,
    mtu: io.mtu,
    activeByReal: engine.flows.activeByReal,
    inactiveByReal: engine.flows.inactiveByReal,
  });
}

void main();
