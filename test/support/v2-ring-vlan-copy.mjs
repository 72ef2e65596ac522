// Run in a network namespace holding the veth pair veth0/veth1 (root, MTU 1500): opens a
// `ring: v2` RX ring on veth1 (its slots sized for the MTU), raises the MTU, and sends a 4000-byte
// frame tagged VLAN 100 from veth0: too large for its slot, the kernel hands it over as a copy
// (TP_STATUS_COPY) with the tag moved into the slot header. Prints what the loop was given.
import { execFileSync } from 'node:child_process';
import { AfPacketIo } from '../../dist/io/afpacket-io.js';
import { loadNative } from '../../dist/io/native-binding.js';

const native = loadNative();
const io = AfPacketIo.open({ interface: 'veth1', ringVersion: 2, vnetHdr: false });
for (const dev of ['veth0', 'veth1']) execFileSync('ip', ['link', 'set', dev, 'mtu', '9000']);
const mine = native.interfaceInfo('veth1').mac;
const tx = native.openPacketSocket({ ifname: 'veth0', blockSizeBytes: 1 << 16, blockCount: 1, retireTimeoutMs: 0, reserveBytes: 0, vnetHdr: false });
const frame = new Uint8Array(4000);
frame.set(mine, 0);
frame.set(tx.mac, 6);
frame.set([0x81, 0x00, 0x00, 100, 0x88, 0xb5], 12);
const seen = [];
io.start((b) => {
  for (let k = 0; k < b.count; k++) {
    const o = b.offsets[k];
    const u8 = b.buf;
    if (b.lengths[k] < 1000) continue; // the veths' own small frames
    seen.push({ length: b.lengths[k], tpid: (u8[o + 12] << 8) | u8[o + 13], tci: (u8[o + 14] << 8) | u8[o + 15], ethertype: (u8[o + 16] << 8) | u8[o + 17] });
  }
});
native.sendCopy(tx, frame, Int32Array.of(0), Int32Array.of(frame.length), 1, 0);
await new Promise((r) => setTimeout(r, 300));
console.log(JSON.stringify({ seen, copied: io.stats().rxCopied }));
io.close();
native.close(tx);
