// Run inside a fresh network namespace (root): one packet socket A in a fanout group it made (the
// kernel picks the id) takes a UDP flood on lo while a second socket B joins the same group, polls for a moment and leaves, again
// and again. Every datagram carries a sequence number; one seen by two sockets was duplicated,
// which a forwarder would send twice. 16 flows (source ports), so the hash gives the joiner some. Prints {sent, received, duplicated, joins} as JSON.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const native = require(join(import.meta.dirname, '..', '..', 'native', 'build', 'Release', 'dsrlb_native.node'));
const PORT = 9998;
const SECONDS = Number(process.argv[3] ?? 4);
const JOINS = Number(process.argv[2] ?? 150);
const MAX_SEQ = 1 << 24;
const seen = new Uint8Array(MAX_SEQ);
const options = { ifname: 'lo', blockSizeBytes: 1 << 16, blockCount: 64, retireTimeoutMs: 1, reserveBytes: 128, vnetHdr: true };

/** Counts the sequence number of every flood datagram in each ready TPACKET_V3 block, then hands the block back. */
let byJoiner = 0;
function drainer(handle, joiner) {
  const bytes = new Uint8Array(handle.ring);
  const words = new Uint32Array(handle.ring);
  const halves = new Uint16Array(handle.ring);
  let cursor = 0;
  return () => {
    for (;;) {
      const start = cursor * handle.blockSizeBytes;
      if ((words[(start + 8) >> 2] & 1) === 0) return;
      let frame = start + words[(start + 16) >> 2];
      for (let i = words[(start + 12) >> 2]; i > 0; i--) {
        const mac = frame + halves[(frame + 24) >> 1];
        if (bytes[mac + 12] === 8 && bytes[mac + 13] === 0 && bytes[mac + 23] === 17 && ((bytes[mac + 36] << 8) | bytes[mac + 37]) === PORT) {
          const seq = (bytes[mac + 42] << 16) | (bytes[mac + 43] << 8) | bytes[mac + 44];
          if (seen[seq] < 255) seen[seq]++;
          if (joiner) byJoiner++;
        }
        frame += words[frame >> 2];
      }
      words[(start + 8) >> 2] = 0;
      cursor = (cursor + 1) % handle.blockCount;
    }
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const a = native.openPacketSocket({ ...options, fanoutNewGroup: true });
native.startPolling(a, drainer(a, false));

const flood = spawn('python3', ['-c', `
import socket, time
flows = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(16)]
end = time.monotonic() + ${SECONDS}
seq = 0
while time.monotonic() < end and seq < ${MAX_SEQ}:
    for _ in range(64):
        flows[seq % 16].sendto(seq.to_bytes(3, 'big') + bytes(13), ('127.0.0.1', ${PORT}))
        seq += 1
print(seq)
`], { stdio: ['ignore', 'pipe', 'inherit'] });
let sentText = '';
flood.stdout.on('data', (d) => (sentText += d));
const floodDone = new Promise((r) => flood.once('exit', r));

await sleep(100);
let joins = 0;
const floodEnd = Date.now() + SECONDS * 1000 - 200;
for (; joins < JOINS && Date.now() < floodEnd; joins++) {
  const b = native.openPacketSocket({ ...options, fanoutGroupId: a.fanoutGroupId });
  native.startPolling(b, drainer(b, true));
  await sleep(4);
  native.close(b);
}
await floodDone;
await sleep(100);
native.close(a);

let received = 0;
let duplicated = 0;
for (let i = 0; i < MAX_SEQ; i++) {
  if (seen[i] !== 0) received++;
  if (seen[i] > 1) duplicated++;
}
console.log(JSON.stringify({ sent: Number(sentText.trim()), received, duplicated, joins, byJoiner }));
