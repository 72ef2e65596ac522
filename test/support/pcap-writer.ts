// A minimal pcap (libpcap 2.4, Ethernet link type) writer for tests: frames in, file bytes out,
// so external dissectors (tshark) can judge what the data plane produced, and tshark run on them.

import { execFileSync } from 'node:child_process';

/** LINKTYPE_ETHERNET */
const LINKTYPE_ETHERNET = 1;
const GLOBAL_HEADER_BYTES = 24;
const RECORD_HEADER_BYTES = 16;

/** The bytes of a pcap file holding `frames` in order, one microsecond apart from `startSeconds`. */
export function pcapFile(frames: readonly Uint8Array[], startSeconds = 1_700_000_000): Uint8Array {
  const total = GLOBAL_HEADER_BYTES + frames.reduce((n, f) => n + RECORD_HEADER_BYTES + f.length, 0);
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  // Little-endian file: magic a1b2c3d4 reads back as d4c3b2a1.
  view.setUint32(0, 0xa1b2c3d4, true);
  view.setUint16(4, 2, true);
  view.setUint16(6, 4, true);
  view.setInt32(8, 0, true); // thiszone
  view.setUint32(12, 0, true); // sigfigs
  view.setUint32(16, 262_144, true); // snaplen
  view.setUint32(20, LINKTYPE_ETHERNET, true);
  let pos = GLOBAL_HEADER_BYTES;
  frames.forEach((frame, i) => {
    view.setUint32(pos, startSeconds, true);
    view.setUint32(pos + 4, i, true);
    view.setUint32(pos + 8, frame.length, true); // captured
    view.setUint32(pos + 12, frame.length, true); // on the wire
    out.set(frame, pos + RECORD_HEADER_BYTES);
    pos += RECORD_HEADER_BYTES + frame.length;
  });
  return out;
}

/** tshark's version line; throws (a test needing tshark fails, never skips) when it is not installed. */
export function requireTshark(): string {
  let version = '';
  try {
    version = execFileSync('tshark', ['--version'], { encoding: 'utf8' });
  } catch (error) {
    throw new Error(`tshark is required for this test (apt-get install -y tshark): ${String(error)}`);
  }
  return version;
}

/** tshark's output on the pcap `file` with `args`; its profile writes go to `home`, not the real home. */
export function runTshark(file: string, args: readonly string[], home: string): string {
  return execFileSync('tshark', ['-r', file, ...args], { encoding: 'utf8', env: { ...process.env, HOME: home }, maxBuffer: 64 << 20 });
}
