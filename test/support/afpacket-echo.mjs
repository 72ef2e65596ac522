// Namespace test helper: `ip netns exec NS node test/support/afpacket-echo.mjs --ifname IF --mode
// forward|observe --vip A.B.C.D [--to-mac MAC] [--expect-src-mac MAC --expect-dst-mac MAC]` opens
// AfPacketIo on IF inside NS (Node cannot setns) and, for IPv4 frames to the VIP, either rewrites
// the MACs and sends them back out (a mini L2 DSR forwarder) or only checks and counts them.
// Prints {"ready":...} once listening and the counters as one JSON line on SIGTERM or SIGINT.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import ts from 'typescript';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Transpiles src/io/afpacket-io.ts and its relative imports (Node 20 cannot run TypeScript). */
async function importAfPacketIo() {
  const outDir = join(repoRoot, 'node_modules', '.cache', `dsrlb-afpacket-echo-${process.pid}`);
  mkdirSync(outDir, { recursive: true });
  // Below node_modules the repo's "type": "module" does not apply.
  writeFileSync(join(outDir, 'package.json'), '{"type":"module"}\n');
  const pending = [join(repoRoot, 'src', 'io', 'afpacket-io.ts')];
  const done = new Set();
  while (pending.length > 0) {
    const source = pending.pop();
    if (done.has(source)) continue;
    done.add(source);
    const text = readFileSync(source, 'utf8');
    for (const match of text.matchAll(/from '(\.{1,2}\/[^']+)\.js'/g)) {
      pending.push(resolve(dirname(source), `${match[1]}.ts`));
    }
    const output = ts.transpileModule(text, {
      compilerOptions: { module: ts.ModuleKind.ES2022, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: false },
    }).outputText;
    const target = join(outDir, relative(repoRoot, source)).replace(/\.ts$/, '.js');
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, output);
  }
  try {
    const io = await import(pathToFileURL(join(outDir, 'src', 'io', 'afpacket-io.js')).href);
    const packetIo = await import(pathToFileURL(join(outDir, 'src', 'io', 'packet-io.js')).href);
    return { ...io, ...packetIo };
  } finally {
    rmSync(outDir, { recursive: true, force: true });
  }
}

function parseMac(text) {
  const bytes = text.split(':').map((part) => Number.parseInt(part, 16));
  if (bytes.length !== 6 || bytes.some((b) => !(b >= 0 && b <= 255))) throw new Error(`bad MAC ${text}`);
  return Uint8Array.from(bytes);
}

function formatMac(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join(':');
}

function parseIpv4(text) {
  const parts = text.split('.').map(Number);
  return ((parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]) >>> 0;
}

const { values } = parseArgs({
  options: {
    ifname: { type: 'string' },
    mode: { type: 'string', default: 'forward' },
    vip: { type: 'string' },
    'to-mac': { type: 'string' },
    'expect-src-mac': { type: 'string' },
    'expect-dst-mac': { type: 'string' },
    'retire-timeout-ms': { type: 'string', default: '1' },
    'vnet-hdr': { type: 'string', default: 'true' },
    ring: { type: 'string', default: '3' },
  },
});
if (!values.ifname || !values.vip) throw new Error('--ifname and --vip are required');

const { AfPacketIo, VERDICT_PASS, VERDICT_TX, FRAME_GSO, FRAME_CSUM_PARTIAL, FRAME_HAS_VNET_HDR } =
  await importAfPacketIo();
const io = AfPacketIo.open({
  interface: values.ifname,
  retireTimeoutMs: Number(values['retire-timeout-ms']),
  vnetHdr: values['vnet-hdr'] === 'true',
  ringVersion: Number(values.ring),
});
const forward = values.mode === 'forward';
const vip = parseIpv4(values.vip);
const toMac = values['to-mac'] ? parseMac(values['to-mac']) : undefined;
const expectSrc = values['expect-src-mac'] ? parseMac(values['expect-src-mac']) : undefined;
const expectDst = values['expect-dst-mac'] ? parseMac(values['expect-dst-mac']) : undefined;
if (forward && !toMac) throw new Error('--to-mac is required in forward mode');
const localMac = io.localMac;

const counters = {
  frames: 0,
  framesFromSelf: 0,
  vipFrames: 0,
  vipUdp: 0,
  vipTcp: 0,
  vipGso: 0,
  vipCsumPartial: 0,
  vipVnetHdr: 0,
  vipVlanTagged: 0,
  vipMaxFrameBytes: 0,
  vipMacMismatches: 0,
  vipVlanTci: -1,
  l4ChecksumsVerified: 0,
  l4ChecksumsBad: 0,
  forwarded: 0,
  batches: 0,
  maxBatch: 0,
  minHeadroom: Number.MAX_SAFE_INTEGER,
};

/** Ones'-complement sum of IPv4 pseudo header + L4 segment: 0xffff when the checksum is right. */
function l4ChecksumOk(buf, l3, end) {
  const ihl = (buf[l3] & 0x0f) * 4;
  const totalLength = (buf[l3 + 2] << 8) | buf[l3 + 3];
  const l4 = l3 + ihl;
  const l4End = l3 + totalLength;
  if (l4End > end || l4 >= l4End) return false;
  let sum = buf[l3 + 9] + (l4End - l4);
  for (let p = l3 + 12; p < l3 + 20; p += 2) sum += (buf[p] << 8) | buf[p + 1];
  let p = l4;
  for (; p + 1 < l4End; p += 2) sum += (buf[p] << 8) | buf[p + 1];
  if (p < l4End) sum += buf[p] << 8;
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return sum === 0xffff;
}

function sameMac(buf, at, mac) {
  for (let i = 0; i < 6; i++) if (buf[at + i] !== mac[i]) return false;
  return true;
}

io.start((batch) => {
  const buf = batch.buf;
  counters.batches++;
  if (batch.count > counters.maxBatch) counters.maxBatch = batch.count;
  if (batch.headroom < counters.minHeadroom) counters.minHeadroom = batch.headroom;
  for (let i = 0; i < batch.count; i++) {
    const at = batch.offsets[i];
    const length = batch.lengths[i];
    const flags = batch.flags[i];
    batch.verdicts[i] = VERDICT_PASS;
    counters.frames++;
    if (sameMac(buf, at + 6, localMac)) counters.framesFromSelf++;
    let l3 = at + 14;
    let etherType = (buf[at + 12] << 8) | buf[at + 13];
    if (etherType === 0x8100 && length >= 18) {
      etherType = (buf[at + 16] << 8) | buf[at + 17];
      l3 += 4;
    }
    if (etherType !== 0x0800 || l3 + 20 > at + length) continue;
    const dst = ((buf[l3 + 16] << 24) | (buf[l3 + 17] << 16) | (buf[l3 + 18] << 8) | buf[l3 + 19]) >>> 0;
    if (dst !== vip) continue;
    counters.vipFrames++;
    if (l3 !== at + 14) {
      counters.vipVlanTagged++;
      counters.vipVlanTci = (buf[at + 14] << 8) | buf[at + 15];
    }
    const protocol = buf[l3 + 9];
    // A complete frame (not partial, not a super-frame) must carry a correct L4 checksum.
    const udpWithoutChecksum = protocol === 17 && buf[l3 + (buf[l3] & 0x0f) * 4 + 6] === 0 && buf[l3 + (buf[l3] & 0x0f) * 4 + 7] === 0;
    if ((protocol === 6 || protocol === 17) && (flags & (FRAME_CSUM_PARTIAL | FRAME_GSO)) === 0 && !udpWithoutChecksum) {
      if (l4ChecksumOk(buf, l3, at + length)) counters.l4ChecksumsVerified++;
      else counters.l4ChecksumsBad++;
    }
    if (protocol === 17) counters.vipUdp++;
    if (protocol === 6) counters.vipTcp++;
    if (flags & FRAME_GSO) counters.vipGso++;
    if (flags & FRAME_CSUM_PARTIAL) counters.vipCsumPartial++;
    if (flags & FRAME_HAS_VNET_HDR) counters.vipVnetHdr++;
    if (length > counters.vipMaxFrameBytes) counters.vipMaxFrameBytes = length;
    if (forward) {
      buf.set(toMac, at);
      buf.set(localMac, at + 6);
      batch.verdicts[i] = VERDICT_TX;
      batch.txOffsets[i] = at;
      batch.txLengths[i] = length;
      counters.forwarded++;
    } else if ((expectSrc && !sameMac(buf, at + 6, expectSrc)) || (expectDst && !sameMac(buf, at, expectDst))) {
      counters.vipMacMismatches++;
    }
  }
});

/** On-CPU time of the main thread (schedstat is exact; cpuUsage is tick-sampled on these VMs). */
function mainThreadCpuNs() {
  return Number(readFileSync(`/proc/self/task/${process.pid}/schedstat`, 'utf8').split(' ')[0]);
}

let finished = false;
function finish() {
  if (finished) return;
  finished = true;
  const stats = io.stats();
  io.close();
  process.stdout.write(`${JSON.stringify({ mode: values.mode, counters, stats, cpuUs: process.cpuUsage(cpuAtReady), mainThreadCpuNs: mainThreadCpuNs() - cpuNsAtReady })}\n`, () => process.exit(0));
}
process.on('SIGTERM', finish);
process.on('SIGINT', finish);
const cpuAtReady = process.cpuUsage();
const cpuNsAtReady = mainThreadCpuNs();
process.stdout.write(
  `${JSON.stringify({ ready: true, mac: formatMac(localMac), mtu: io.mtu, vnetHdr: io.vnetHdr })}\n`,
);
