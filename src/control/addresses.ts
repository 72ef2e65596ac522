// Address and MAC conversions for the control plane (strings are fine here, never in the loop).

import ipaddr from 'ipaddr.js';

/** An address as 4 big-endian words, IPv4 in word 0 (the layout of ParsedPacket.addr). */
export function addressWords(text: string): Uint32Array {
  const a = ipaddr.parse(text);
  const bytes = a.toByteArray();
  const w = new Uint32Array(4);
  for (let i = 0; i < bytes.length / 4; i++) {
    w[i] = ((bytes[i * 4]! << 24) | (bytes[i * 4 + 1]! << 16) | (bytes[i * 4 + 2]! << 8) | bytes[i * 4 + 3]!) >>> 0;
  }
  return w;
}

/** The network of `address` at `prefix` bits as CIDR text ("10.1.2.0/24"): the clients client persistence treats as one. */
export function clientPrefixText(address: string, prefix: number): string {
  const a = ipaddr.parse(address);
  const network = a.kind() === 'ipv4' ? ipaddr.IPv4.networkAddressFromCIDR(`${address}/${prefix}`) : ipaddr.IPv6.networkAddressFromCIDR(`${address}/${prefix}`);
  return `${network.toString()}/${prefix}`;
}

/** Words (as in ParsedPacket.addr) back to canonical text. */
export function wordsToAddress(words: Uint32Array, offset: number, family: number): string {
  if (family === 4) {
    const v = words[offset]!;
    return `${v >>> 24}.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
  }
  const bytes: number[] = [];
  for (let i = 0; i < 4; i++) {
    const v = words[offset + i]!;
    bytes.push(v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255);
  }
  return ipaddr.fromByteArray(bytes).toString();
}

/** One spelling of an address, to compare IPv6 addresses however they are written (text that is no address comes back as it is). */
export function normalizedAddress(text: string): string {
  try {
    return ipaddr.parse(text).toNormalizedString();
  } catch {
    return text;
  }
}

export function familyOf(text: string): 4 | 6 {
  return ipaddr.parse(text).kind() === 'ipv6' ? 6 : 4;
}

export function isIpAddress(text: string): boolean {
  return ipaddr.isValid(text);
}

export function parseMac(text: string): Uint8Array {
  const parts = text.split(':');
  if (parts.length !== 6 || parts.some((p) => !/^[0-9a-fA-F]{1,2}$/.test(p))) throw new Error(`"${text}" is not a MAC address`);
  return Uint8Array.from(parts.map((p) => parseInt(p, 16)));
}

export function formatMac(mac: Uint8Array): string {
  return Array.from(mac.subarray(0, 6), (b) => b.toString(16).padStart(2, '0')).join(':');
}
