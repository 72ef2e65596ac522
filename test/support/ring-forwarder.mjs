// Namespace test helper: `ip netns exec NS node test/support/ring-forwarder.mjs '<json>'` runs the
// real engine on the native RX ring (AfPacketIo) of an interface, with a snapshot built from a config
// and fixed real MACs, exactly as ring-vs-memory.test.ts builds its in-memory twin. Prints
// {"ready":true} once the socket is open; on SIGTERM prints {"stats":...} (AfPacketIo's) and exits.
// Imports the compiled dist/ tree.
import { resolve, dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const load = (p) => import(pathToFileURL(resolve(root, 'dist', p)).href);
const { parseConfigText } = await load('config/validate.js');
const { SnapshotBuilder } = await load('control/snapshot-builder.js');
const { Engine } = await load('dataplane/engine.js');
const { createCounters, MAX_REAL_IDS } = await load('dataplane/counters.js');
const { AfPacketIo } = await load('io/afpacket-io.js');
const { parseMac } = await load('control/addresses.js');

const args = JSON.parse(process.argv[2]);
const parsed = parseConfigText(args.config);
if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
const io = AfPacketIo.open({ interface: args.ifname, ringVersion: args.ringVersion, blockSizeBytes: args.blockSizeBytes, batchCapacity: args.batchCapacity });
const engine = new Engine({
  flowCapacity: 4096,
  timeouts: { synMs: 60_000, establishedMs: 900_000, finMs: 120_000, closeMs: 10_000, udpMs: 300_000 },
  maxRealIds: MAX_REAL_IDS,
  counters: createCounters(),
  localMac: io.localMac,
  mtu: io.mtu,
  fragmentIdStart: 1, // as the in-memory engine of the test: the same outer ids on both paths
});
let id = 0;
const views = parsed.config.services.map((s) => ({
  config: s,
  reals: s.reals.map((r) => ({ id: id++, address: r.address, weight: r.weight, intent: r.state, forwarding: r.forwarding, health: 'up', removed: false, mac: parseMac(args.macs[r.address]) })),
}));
engine.setSnapshot(new SnapshotBuilder().build(views, parsed.config.hashSeed, MAX_REAL_IDS, { v4: args.tunnelV4 ?? null, v6: null }).snapshot);
io.start((batch) => engine.processBatch(batch, 1_000_000));
process.stdout.write(JSON.stringify({ ready: true }) + '\n');
process.on('SIGTERM', () => {
  process.stdout.write(JSON.stringify({ stats: io.stats() }) + '\n');
  io.close();
  process.exit(0);
});
