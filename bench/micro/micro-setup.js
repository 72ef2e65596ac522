// Shared set-up of the micro-benchmarks: command-line flags, IPv4/UDP|TCP frames written into one
// buffer, and an Engine with a forwarding snapshot built by the real SnapshotBuilder from a config.
// Imports the compiled modules from dist/ (npm run build first).

import { parseConfigText } from '../../dist/config/validate.js';
import { SnapshotBuilder } from '../../dist/control/snapshot-builder.js';
import { parseMac } from '../../dist/control/addresses.js';
import { Engine } from '../../dist/dataplane/engine.js';
import { flowHash } from '../../dist/dataplane/flow-hash.js';
import { createCounters, MAX_REAL_IDS } from '../../dist/dataplane/counters.js';
import { createPacketBatch } from '../../dist/io/packet-io.js';

export const LB_MAC = '02:00:00:00:00:01';
export const CLIENT_MAC = '02:00:00:00:00:0c';
export const VIP = '10.0.0.100';
export const UDP_PORT = 9000;
export const TCP_PORT = 80;
export const FRAME_BYTES = 60;
const TIMEOUTS = { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 };

/** `--quick` and `--name value` flags of a micro script. */
export function flags(argv = process.argv.slice(2)) {
  /** @type {Record<string, string | boolean>} */
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) continue;
    const next = argv[i + 1];
    if (next !== undefined && !next.startsWith('--')) {
      out[a.slice(2)] = next;
      i++;
    } else out[a.slice(2)] = true;
  }
  return out;
}

/** The last line a micro script prints: its results as one JSON object (the runner reads it). */
export function printResult(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

function sum16(buf, off, len, acc) {
  for (let i = 0; i + 1 < len; i += 2) acc += (buf[off + i] << 8) | buf[off + i + 1];
  if (len & 1) acc += buf[off + len - 1] << 8;
  return acc;
}
function fold(acc) {
  while (acc > 0xffff) acc = (acc & 0xffff) + Math.floor(acc / 65536);
  return ~acc & 0xffff;
}

/**
 * Writes a 60-byte Ethernet/IPv4/UDP or TCP frame from client (srcIp, srcPort) to the VIP at buf[off].
 * @param {Uint8Array} buf
 * @param {number} off
 * @param {{ srcIp: number, srcPort: number, tcp?: boolean, tcpFlags?: number }} f
 */
export function writeFrame(buf, off, f) {
  const lb = parseMac(LB_MAC);
  const client = parseMac(CLIENT_MAC);
  buf.fill(0, off, off + FRAME_BYTES);
  buf.set(lb, off);
  buf.set(client, off + 6);
  buf[off + 12] = 0x08;
  buf[off + 13] = 0x00;
  const ip = off + 14;
  const ipLen = FRAME_BYTES - 14;
  buf[ip] = 0x45;
  buf[ip + 2] = ipLen >> 8;
  buf[ip + 3] = ipLen & 255;
  buf[ip + 6] = 0x40;
  buf[ip + 8] = 64;
  buf[ip + 9] = f.tcp ? 6 : 17;
  const s = f.srcIp >>> 0;
  buf[ip + 12] = s >>> 24;
  buf[ip + 13] = (s >>> 16) & 255;
  buf[ip + 14] = (s >>> 8) & 255;
  buf[ip + 15] = s & 255;
  const vip = VIP.split('.').map(Number);
  for (let i = 0; i < 4; i++) buf[ip + 16 + i] = vip[i];
  const ck = fold(sum16(buf, ip, 20, 0));
  buf[ip + 10] = ck >> 8;
  buf[ip + 11] = ck & 255;
  const l4 = ip + 20;
  buf[l4] = f.srcPort >> 8;
  buf[l4 + 1] = f.srcPort & 255;
  const dport = f.tcp ? TCP_PORT : UDP_PORT;
  buf[l4 + 2] = dport >> 8;
  buf[l4 + 3] = dport & 255;
  if (f.tcp) {
    buf[l4 + 12] = 0x50; // data offset 5 words
    buf[l4 + 13] = f.tcpFlags ?? 0x10;
    buf[l4 + 14] = 0xff;
    buf[l4 + 15] = 0xff;
  } else {
    const udpLen = ipLen - 20;
    buf[l4 + 4] = udpLen >> 8;
    buf[l4 + 5] = udpLen & 255;
  }
}

/** Client address of flow i: 192.0.2.0/24 and up, 50,000 source ports per address. */
export function flowAddress(i) {
  return { srcIp: (0xc0000200 + Math.floor(i / 50_000)) >>> 0, srcPort: 10_000 + (i % 50_000) };
}

/**
 * `count` UDP client addresses whose flow hash under the default hashSeed (0, public) has the same
 * low `bits` bits: what anyone can compute offline to aim flows at one bucket of a table indexed by
 * that hash. The engine's flow table uses its own seeded hash, so these should cost what any flows do.
 */
export function craftedFlowAddresses(count, bits) {
  const key = new Uint32Array(10);
  key[0] = 17 | (4 << 8);
  key[5] = VIP.split('.').reduce((acc, part) => acc * 256 + Number(part), 0);
  const mask = (1 << bits) - 1;
  const out = [];
  for (let i = 0; out.length < count; i++) {
    const a = flowAddress(i);
    key[1] = a.srcIp;
    key[9] = ((a.srcPort << 16) | UDP_PORT) >>> 0;
    if ((flowHash(key, 0) & mask) === 0x5a5) out.push(a);
  }
  return out;
}

/**
 * An Engine with a snapshot for one UDP service (port 9000) and one TCP service (port 80), each
 * with `realCount` reals up and with known MACs: what the daemon builds for such a config.
 */
export function createEngine({ realCount = 4, flowCapacity = 1_000_000 } = {}) {
  const reals = Array.from({ length: realCount }, (_, i) => `10.0.${1 + (i >> 8)}.${i & 255}`);
  const yaml = [
    'interface: eth0',
    'services:',
    ...[
      ['udp', UDP_PORT],
      ['tcp', TCP_PORT],
    ].flatMap(([proto, port]) => [
      `  - name: ${proto}`,
      `    vip: ${VIP}`,
      `    port: ${port}`,
      `    protocol: ${proto}`,
      '    reals:',
      ...reals.map((a) => `      - address: ${a}`),
    ]),
    '',
  ].join('\n');
  const parsed = parseConfigText(yaml);
  if (!parsed.ok) throw new Error(parsed.problems.map((p) => `${p.path}: ${p.message}`).join('\n'));
  const cfg = parsed.config;
  let id = 0;
  const views = cfg.services.map((s) => ({
    config: s,
    reals: s.reals.map((r) => {
      const realId = id++;
      return {
        id: realId,
        address: r.address,
        weight: r.weight,
        intent: r.state,
        forwarding: r.forwarding,
        health: 'up',
        removed: false,
        mac: Uint8Array.of(0x02, 0x00, 0x01, 0x00, realId >> 8, realId & 255),
      };
    }),
  }));
  const counters = createCounters();
  const engine = new Engine({ flowCapacity, timeouts: TIMEOUTS, maxRealIds: MAX_REAL_IDS, counters, localMac: parseMac(LB_MAC) });
  engine.setSnapshot(new SnapshotBuilder().build(views, cfg.hashSeed, MAX_REAL_IDS).snapshot);
  return { engine, counters };
}

/**
 * Batches over one buffer of `flows` frames (one per flow), `batchSize` frames each, all pointing at
 * the same memory: the engine rewrites MACs in place, which is idempotent, so every round sees the
 * same frames with no copying.
 */
export function createBatches({ flows, batchSize = 256, tcp = false, tcpFlags = 0x10, addresses = undefined }) {
  const buf = new Uint8Array(flows * FRAME_BYTES);
  for (let i = 0; i < flows; i++) writeFrame(buf, i * FRAME_BYTES, { ...(addresses ? addresses[i] : flowAddress(i)), tcp, tcpFlags });
  // At least one full batch even for 1 flow: the same frame repeated (one flow, many packets).
  const slots = Math.max(flows, batchSize);
  const batches = [];
  for (let first = 0; first < slots; first += batchSize) {
    const b = createPacketBatch(batchSize);
    b.buf = buf;
    b.count = Math.min(batchSize, slots - first);
    for (let i = 0; i < b.count; i++) {
      b.offsets[i] = ((first + i) % flows) * FRAME_BYTES;
      b.lengths[i] = FRAME_BYTES;
    }
    batches.push(b);
  }
  return { buf, batches, packetsPerRound: slots };
}
