// Run in a network namespace holding the veth pair veth0/veth1 (root): fills a `ring: v2` RX ring
// on veth1 before the loop starts, then starts it and reports what it saw; then sends 4 more frames
// for veth1 and reports again. Argument: "full" (a 4-slot ring, more frames for veth1 than it holds)
// or "otherhost" (the default 8192-slot ring filled with frames for another MAC, and one for veth1).
// Prints one JSON line per phase.
import { AfPacketIo } from '../../dist/io/afpacket-io.js';
import { loadNative } from '../../dist/io/native-binding.js';

const native = loadNative();
const mode = process.argv[2] ?? 'full';
const io = AfPacketIo.open(
  mode === 'full'
    ? { interface: 'veth1', ringVersion: 2, blockSizeBytes: 4096, blockCount: 2, vnetHdr: false }
    : { interface: 'veth1', ringVersion: 2, vnetHdr: false },
);
const mine = native.interfaceInfo('veth1').mac;
const tx = native.openPacketSocket({ ifname: 'veth0', blockSizeBytes: 4096, blockCount: 1, retireTimeoutMs: 0, reserveBytes: 0, vnetHdr: false });
const count = mode === 'full' ? 8 : 9000;
const buf = new Uint8Array(64 * count);
const offsets = new Int32Array(count);
const lengths = new Int32Array(count);
for (let i = 0; i < count; i++) {
  const o = i * 64;
  offsets[i] = o;
  lengths[i] = 60;
  // "otherhost": all for another MAC but the last.
  buf.set(mode === 'full' || i === count - 1 ? mine : [2, 0, 0, 0, 0, 0x99], o);
  buf.set(tx.mac, o + 6);
  buf[o + 12] = 0x88; // a local experimental ethertype: the kernel ignores it
  buf[o + 13] = 0xb5;
}
const sendAll = (n) => {
  let sent = 0;
  while (sent < n) {
    const r = native.sendCopy(tx, buf, offsets, lengths, n, sent);
    if (r === 0) break;
    sent += r;
  }
  return sent;
};
sendAll(count);
await new Promise((r) => setTimeout(r, 100));
let batches = 0;
let frames = 0;
// Only our frames count (the veths' own IPv6 traffic arrives too).
io.start((b) => {
  batches++;
  for (let k = 0; k < b.count; k++) {
    const o = b.offsets[k];
    if (b.buf[o + 12] === 0x88 && b.buf[o + 13] === 0xb5) frames++;
  }
});
await new Promise((r) => setTimeout(r, 500));
console.log(JSON.stringify({ phase: 'filled', batches, frames, rxOtherHost: io.stats().rxOtherHost }));
for (let i = 0; i < 4; i++) buf.set(mine, i * 64);
sendAll(4);
await new Promise((r) => setTimeout(r, 300));
console.log(JSON.stringify({ phase: 'after', batches, frames, rxOtherHost: io.stats().rxOtherHost }));
io.close();
native.close(tx);
