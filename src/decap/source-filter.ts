// Which outer sources `dsrlb decap` takes tunnel packets from (--allow-source CIDR,..): the LBs.
// Without a list every source is taken, as a kernel tunl0 takes them; with one, a host that can
// reach the real cannot hand the VIP traffic that bypasses the LB and its source filtering.
// Prefixes are kept as bytes and compared per packet without allocating.

import ipaddr from 'ipaddr.js';

export class SourceFilter {
  /** 16 bytes per prefix (IPv4 in the first 4), its length in bits and its family. */
  private readonly prefixes: Uint8Array;
  private readonly lengths: Uint8Array;
  private readonly families: Uint8Array;
  readonly count: number;

  /** Throws with the offending text when one is not ADDRESS/LENGTH (a bare address is /32 or /128). */
  constructor(readonly texts: readonly string[]) {
    this.count = texts.length;
    this.prefixes = new Uint8Array(16 * texts.length);
    this.lengths = new Uint8Array(texts.length);
    this.families = new Uint8Array(texts.length);
    texts.forEach((text, i) => {
      let address: ipaddr.IPv4 | ipaddr.IPv6;
      let bits: number;
      try {
        [address, bits] = text.includes('/') ? ipaddr.parseCIDR(text) : [ipaddr.parse(text), text.includes(':') ? 128 : 32];
      } catch {
        throw new Error(`${JSON.stringify(text)} is not an address or CIDR prefix (e.g. 192.0.2.0/24, 2001:db8::/64)`);
      }
      const bytes = address.toByteArray();
      this.prefixes.set(bytes, i * 16);
      this.lengths[i] = bits;
      this.families[i] = bytes.length === 4 ? 4 : 6;
    });
  }

  /** Whether `source` (4 or 16 bytes at `offset`) of `family` is in a prefix, or no prefix was given. */
  allows(family: number, source: Uint8Array, offset: number): boolean {
    if (this.count === 0) return true;
    for (let i = 0; i < this.count; i++) {
      if (this.families[i] !== family) continue;
      const bits = this.lengths[i]!;
      const base = i * 16;
      const whole = bits >>> 3;
      let match = true;
      for (let b = 0; b < whole; b++) {
        if (source[offset + b] !== this.prefixes[base + b]) {
          match = false;
          break;
        }
      }
      const rest = bits & 7;
      if (match && rest !== 0) {
        const mask = (0xff << (8 - rest)) & 0xff;
        match = (source[offset + whole]! & mask) === (this.prefixes[base + whole]! & mask);
      }
      if (match) return true;
    }
    return false;
  }
}
