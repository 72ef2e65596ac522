// Namespace test helper, a minimal tunnelling LB for the sender side of test/integration/decap.test.ts
// (this kernel has no ipip module to do it): `ip netns exec NS node test/support/ipip-sender.mjs
// --tun NAME --mtu N --outer4 ADDR --outer6 ADDR [--map INNER_DST=OUTER_DST ..]` opens TUN device NAME,
// and every packet the kernel routes into it goes out again inside a raw socket for protocol 4
// (inner IPv4) or 41 (inner IPv6): the kernel adds the outer header (IPv4 or IPv6, by the outer
// address) and fragments it when it exceeds the path MTU. The outer destination is --outer4 /
// --outer6 by inner family, or --map's for that inner destination (to send 4in6 and 6in4).
// --outer-tclass INNER_DST=N gives the outer IPv6 header of that destination's packets traffic
// class N (IPV6_TCLASS; 3 marks them CE, as a congested hop between LB and real would).
// Prints {"ready":...} once the device is up and {"counters":...} on SIGTERM/SIGINT.
import { execFileSync } from 'node:child_process';
import { read } from 'node:fs';
import { createRequire } from 'node:module';
import { isIPv6 } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const native = require(join(repoRoot, 'native', 'build', 'Release', 'dsrlb_native.node'));
const raw = require('raw-socket');

const { values } = parseArgs({
  options: {
    tun: { type: 'string' },
    mtu: { type: 'string', default: '1500' },
    outer4: { type: 'string' },
    outer6: { type: 'string' },
    map: { type: 'string', multiple: true, default: [] },
    'outer-tclass': { type: 'string', multiple: true, default: [] },
  },
});

const counters = { read: 0, sentInner4: 0, sentInner6: 0, sentBytes: 0, sendErrors: 0, unknown: 0, lastError: '' };
const mapped = new Map(values.map.map((m) => m.split('=')));
const sockets = new Map();

const IPPROTO_IPV6 = 41;
const IPV6_TCLASS = 67;

function socketFor(outer, protocol, tclass) {
  const key = `${isIPv6(outer) ? 6 : 4}/${protocol}/${tclass ?? ''}`;
  let socket = sockets.get(key);
  if (socket === undefined) {
    socket = raw.createSocket({
      protocol,
      addressFamily: isIPv6(outer) ? raw.AddressFamily.IPv6 : raw.AddressFamily.IPv4,
    });
    // Send-only: pausing receive stops the package from reading (and the socket sees the replies
    // the decapsulating side never sends, but keep it quiet anyway).
    socket.pauseRecv();
    if (tclass !== undefined && isIPv6(outer)) socket.setOption(IPPROTO_IPV6, IPV6_TCLASS, tclass);
    socket.on('error', (error) => {
      counters.sendErrors++;
      counters.lastError = error.message;
    });
    sockets.set(key, socket);
  }
  return socket;
}

function innerDestination(packet, length) {
  const version = packet[0] >> 4;
  if (version === 4 && length >= 20) return [4, `${packet[16]}.${packet[17]}.${packet[18]}.${packet[19]}`];
  if (version === 6 && length >= 40) {
    const groups = [];
    for (let i = 24; i < 40; i += 2) groups.push(((packet[i] << 8) | packet[i + 1]).toString(16));
    return [6, groups.join(':')];
  }
  return [0, ''];
}

function canonical(address) {
  // Compare IPv6 addresses in one spelling: expand "::" into zero groups.
  if (!isIPv6(address)) return address;
  const [head, tail = ''] = address.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = tail === '' ? [] : tail.split(':');
  const groups = address.includes('::') ? [...h, ...Array(8 - h.length - t.length).fill('0'), ...t] : h;
  return groups.map((g) => parseInt(g, 16).toString(16)).join(':');
}
const mappedCanonical = new Map([...mapped].map(([inner, outer]) => [canonical(inner), outer]));
const tclassOf = new Map(values['outer-tclass'].map((m) => m.split('=')).map(([inner, tc]) => [canonical(inner), Number(tc)]));

const tun = native.openTun(values.tun);
execFileSync('ip', ['link', 'set', 'dev', tun.name, 'mtu', values.mtu, 'up']);

let stopping = false;
function readNext() {
  if (stopping) return;
  // A fresh buffer per packet: raw-socket keeps it until the send completes.
  const packet = Buffer.allocUnsafe(65536);
  read(tun.fd, packet, 0, packet.length, null, (error, length) => {
    if (stopping) return;
    if (error) {
      counters.lastError = error.message;
      setTimeout(readNext, 10);
      return;
    }
    counters.read++;
    const [family, destination] = innerDestination(packet, length);
    // The kernel's own chatter through the device (router solicitations, MLD reports) is not
    // traffic an LB would forward: only unicast goes into the tunnel.
    const multicast = family === 4 ? packet[16] >= 224 : packet[24] === 0xff;
    if (family === 0 || multicast) {
      counters.unknown++;
      return readNext();
    }
    const outer = mappedCanonical.get(canonical(destination)) ?? (family === 4 ? values.outer4 : values.outer6);
    const socket = socketFor(outer, family === 4 ? 4 : 41, tclassOf.get(canonical(destination)));
    socket.send(packet, 0, length, outer, (sendError) => {
      if (sendError) {
        counters.sendErrors++;
        counters.lastError = sendError.message;
      } else {
        if (family === 4) counters.sentInner4++;
        else counters.sentInner6++;
        counters.sentBytes += length;
      }
    });
    readNext();
  });
}
readNext();
process.stdout.write(`${JSON.stringify({ ready: { tun: tun.name, mtu: Number(values.mtu) } })}\n`);

function stop() {
  stopping = true;
  // process.exit() would wait for the thread-pool read blocked on the TUN fd (about 2 s).
  process.stdout.write(`${JSON.stringify({ counters })}\n`, () => process.kill(process.pid, 'SIGKILL'));
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
