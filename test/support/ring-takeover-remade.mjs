// Namespace test helper: `ip netns exec NS node test/support/ring-takeover-remade.mjs IFNAME` opens
// AfPacketIo on IFNAME (a veth whose peer is IFNAME-p), keeps a descriptor of its socket, closes it,
// deletes and makes the veth again, then takes the kept socket over. Prints {"code", "fdClosed"}:
// the takeover's error code (ENODEV expected: the socket is bound to the old interface) and whether
// the kept descriptor was closed by the failed takeover. Imports the compiled dist/ tree.
import { execFileSync } from 'node:child_process';
import { closeSync, fstatSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const { AfPacketIo } = await import(pathToFileURL(resolve(root, 'dist/io/afpacket-io.js')).href);
const ifname = process.argv[2];
const remake = () => {
  execFileSync('ip', ['link', 'add', ifname, 'type', 'veth', 'peer', 'name', `${ifname}-p`]);
  execFileSync('ip', ['link', 'set', ifname, 'up']);
  execFileSync('ip', ['link', 'set', `${ifname}-p`, 'up']);
};
const first = AfPacketIo.open({ interface: ifname, blockCount: 4 });
const fd = first.keepSocket();
first.close();
execFileSync('ip', ['link', 'del', ifname]);
remake();
let code = 'none';
try {
  AfPacketIo.open({ interface: ifname, blockCount: 4, keptSocket: { fd, fanoutGroupId: null } }).close();
} catch (err) {
  code = err.code ?? String(err);
}
let keptOpen = true;
try {
  fstatSync(fd);
  closeSync(fd);
} catch {
  keptOpen = false;
}
process.stdout.write(JSON.stringify({ code, keptOpen }) + '\n');
