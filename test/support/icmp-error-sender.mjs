// Namespace test helper: sends the ICMP error a router sends when an IPIP packet does not fit its
// next link. `ip netns exec NS node test/support/icmp-error-sender.mjs --to LB --mtu N
// --outer-src A --outer-dst B --inner-src C --inner-dst D` sends LB an ICMP fragmentation-needed
// (type 3 code 4, next-hop MTU N) quoting a 1500-byte IPv4 outer packet A -> B of protocol 4 with
// DF, and inside it an IPv4 TCP packet C -> D; with IPv6 addresses an ICMPv6 packet-too-big (type
// 2, MTU N) quoting an IPv6 outer packet (next header 41) holding an IPv6 TCP packet. The quote is
// what RFC 1812 / RFC 4443 routers put in: headers and the start of the payload.
import { createRequire } from 'node:module';
import { isIPv6 } from 'node:net';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const raw = require('raw-socket');
const ipaddr = require('ipaddr.js');

const { values } = parseArgs({
  options: {
    to: { type: 'string' },
    mtu: { type: 'string' },
    'outer-src': { type: 'string' },
    'outer-dst': { type: 'string' },
    'inner-src': { type: 'string' },
    'inner-dst': { type: 'string' },
  },
});
const bytes = (a) => Buffer.from(ipaddr.parse(a).toByteArray());
const v6 = isIPv6(values.to);
const mtu = Number(values.mtu);
const tcp = Buffer.alloc(20);
tcp.writeUInt16BE(40000, 0);
tcp.writeUInt16BE(80, 2);
tcp[12] = 5 << 4;
tcp[13] = 0x10; // ACK

function ipv4Header(src, dst, protocol, totalLength) {
  const h = Buffer.alloc(20);
  h[0] = 0x45;
  h.writeUInt16BE(totalLength, 2);
  h.writeUInt16BE(0x4000, 6); // DF
  h[8] = 64;
  h[9] = protocol;
  bytes(src).copy(h, 12);
  bytes(dst).copy(h, 16);
  raw.writeChecksum(h, 10, raw.createChecksum(h));
  return h;
}

function ipv6Header(src, dst, nextHeader, payloadLength) {
  const h = Buffer.alloc(40);
  h.writeUInt32BE(0x60000000, 0);
  h.writeUInt16BE(payloadLength, 4);
  h[6] = nextHeader;
  h[7] = 64;
  bytes(src).copy(h, 8);
  bytes(dst).copy(h, 24);
  return h;
}

let message;
if (v6) {
  const inner = Buffer.concat([ipv6Header(values['inner-src'], values['inner-dst'], 6, 1500 - 80), tcp]);
  const outer = Buffer.concat([ipv6Header(values['outer-src'], values['outer-dst'], 41, 1500 - 40), inner]);
  const head = Buffer.alloc(8);
  head[0] = 2; // packet too big
  head.writeUInt32BE(mtu, 4);
  message = Buffer.concat([head, outer]); // the kernel fills in the ICMPv6 checksum
} else {
  const inner = Buffer.concat([ipv4Header(values['inner-src'], values['inner-dst'], 6, 1500 - 20), tcp]);
  const outer = Buffer.concat([ipv4Header(values['outer-src'], values['outer-dst'], 4, 1500), inner]);
  const head = Buffer.alloc(8);
  head[0] = 3; // destination unreachable
  head[1] = 4; // fragmentation needed and DF set
  head.writeUInt16BE(mtu, 6);
  message = Buffer.concat([head, outer]);
  raw.writeChecksum(message, 2, raw.createChecksum(message));
}

const socket = raw.createSocket({
  protocol: v6 ? raw.Protocol.ICMPv6 : raw.Protocol.ICMP,
  addressFamily: v6 ? raw.AddressFamily.IPv6 : raw.AddressFamily.IPv4,
});
socket.pauseRecv();
socket.send(message, 0, message.length, values.to, (error) => {
  socket.close();
  if (error) {
    process.stderr.write(`${error.message}\n`);
    process.exit(2);
  }
  process.stdout.write(`${JSON.stringify({ sent: v6 ? 'packet-too-big' : 'fragmentation-needed', to: values.to, mtu, bytes: message.length })}\n`);
});
