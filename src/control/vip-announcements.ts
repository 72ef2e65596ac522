// Makes the VIPs' MAC known on the LB's segment whenever this host takes them (start, a packet
// loop started again after its interface was made again, a reload that adds VIPs): a gratuitous
// ARP per IPv4 VIP and an unsolicited Neighbour Advertisement per IPv6 VIP, as keepalived sends.
// Neighbours that still hold an old MAC for a VIP (an interface made again gets a new one) would
// otherwise keep sending to it until their entry fails, about a minute. The frames leave from the
// main thread through a packet socket of their own (native sendFrames), never the packet loops.

import ipaddr from 'ipaddr.js';
import { fold16, ones16 } from '../dataplane/checksum.js';
import { ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_ICMPV6 } from '../dataplane/parsed-packet.js';
import { isNativeSystemError, loadNative } from '../io/native-binding.js';
import { formatMac } from './addresses.js';
import type { Logger } from './logger.js';

/** ARPHRD_ETHER: the hardware type of Ethernet, VLAN, bond, bridge, veth and macvlan devices alike. */
const ARPHRD_ETHER = 1;
const ARPOP_REQUEST = 1;
const ND_NEIGHBOR_ADVERT = 136;
/** The NA flags word: Override (bit 29) set; Router and Solicited (bits 31, 30) clear. */
const NA_FLAG_OVERRIDE = 0x20;
const ND_OPT_TARGET_LINKADDR = 2;
/** RFC 4861 section 7.1.2: a receiver drops neighbour discovery whose hop limit is not 255. */
const ND_HOP_LIMIT = 255;
/** ff02::1, all nodes on the link, and its Ethernet group address 33:33:00:00:00:01 (RFC 2464 section 7). */
const ALL_NODES = Uint8Array.of(0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1);
const ALL_NODES_MAC = Uint8Array.of(0x33, 0x33, 0, 0, 0, 1);

/** Ethernet 14 + ARP 28. Not padded to 60: the kernel sends its own ARP this size and the NIC pads. */
export const GRATUITOUS_ARP_BYTES = 42;
/** Ethernet 14 + IPv6 40 + NA 24 + target link-layer address option 8. */
export const NEIGHBOR_ADVERT_BYTES = 86;
const NA_ICMP_OFFSET = 54;
const NA_ICMP_BYTES = NEIGHBOR_ADVERT_BYTES - NA_ICMP_OFFSET;

function addressBytes(vip: string, family: 4 | 6): Uint8Array {
  const parsed = ipaddr.parse(vip);
  if (parsed.kind() !== (family === 4 ? 'ipv4' : 'ipv6')) throw new RangeError(`${vip} is not an IPv${family} address`);
  return Uint8Array.from(parsed.toByteArray());
}

function checkMac(mac: Uint8Array): void {
  if (mac.length !== 6) throw new RangeError(`a MAC has 6 bytes, not ${mac.length}`);
}

/**
 * A gratuitous ARP for IPv4 `vip` from `mac`: Ethernet broadcast, an ARP request whose sender and
 * target protocol addresses are both the VIP, sender hardware address `mac`, target hardware
 * address zero. That is the kernel's own (arp_send without a target MAC, e.g. for arp_notify) and
 * RFC 5227 section 2.3's ARP Announcement; keepalived and arping -U send the same request with the
 * target MAC all ones, which receivers ignore in a request. A request, not a reply: Linux takes an
 * existing entry's new MAC from either, older stacks from requests only (RFC 5227 section 3).
 */
export function gratuitousArpFrame(mac: Uint8Array, vip: string): Uint8Array {
  checkMac(mac);
  const ip = addressBytes(vip, 4);
  const f = new Uint8Array(GRATUITOUS_ARP_BYTES);
  f.fill(0xff, 0, 6);
  f.set(mac, 6);
  f[12] = ETHERTYPE_ARP >> 8;
  f[13] = ETHERTYPE_ARP & 0xff;
  f[15] = ARPHRD_ETHER; // hardware type 1 (bytes 14-15)
  f[16] = ETHERTYPE_IPV4 >> 8; // protocol type 0x0800
  f[18] = 6; // hardware address length
  f[19] = 4; // protocol address length
  f[21] = ARPOP_REQUEST; // operation (bytes 20-21)
  f.set(mac, 22); // sender hardware address
  f.set(ip, 28); // sender protocol address
  // target hardware address 32-37 stays zero
  f.set(ip, 38); // target protocol address
  return f;
}

/**
 * An unsolicited Neighbour Advertisement for IPv6 `vip` from `mac` (RFC 4861 sections 4.4 and
 * 7.2.6): to ff02::1 (33:33:00:00:00:01), hop limit 255, Override set so receivers replace the MAC
 * they hold, Solicited clear (it answers nobody; one sent to a multicast address must have it
 * clear), Router clear (the VIP is no router), target the VIP, a target link-layer address option.
 * The source address is the VIP itself, as Linux's ndisc_send_na uses the target when it is an
 * address of the interface (host-setup puts IPv6 VIPs on it) and keepalived does: RFC 4861 asks
 * only "an address assigned to the interface" of an NA (a link-local one only of router
 * advertisements and redirects), and an interface just made again may still hold its link-local
 * address tentative, unusable as a source.
 */
export function unsolicitedNeighborAdvertFrame(mac: Uint8Array, vip: string): Uint8Array {
  checkMac(mac);
  const ip = addressBytes(vip, 6);
  const f = new Uint8Array(NEIGHBOR_ADVERT_BYTES);
  f.set(ALL_NODES_MAC, 0);
  f.set(mac, 6);
  f[12] = ETHERTYPE_IPV6 >> 8;
  f[13] = ETHERTYPE_IPV6 & 0xff;
  f[14] = 0x60; // version 6, traffic class 0, flow label 0
  f[19] = NA_ICMP_BYTES; // payload length (bytes 18-19)
  f[20] = IPPROTO_ICMPV6;
  f[21] = ND_HOP_LIMIT;
  f.set(ip, 22); // source
  f.set(ALL_NODES, 38); // destination
  const icmp = NA_ICMP_OFFSET;
  f[icmp] = ND_NEIGHBOR_ADVERT; // code 0, checksum below
  f[icmp + 4] = NA_FLAG_OVERRIDE; // flags, then 29 reserved bits
  f.set(ip, icmp + 8); // target address
  f[icmp + 24] = ND_OPT_TARGET_LINKADDR;
  f[icmp + 25] = 1; // option length in units of 8 bytes
  f.set(mac, icmp + 26);
  // RFC 8200 section 8.1 pseudo-header: addresses, upper-layer length, next header.
  let sum = ones16(f, 22, NA_ICMP_OFFSET, NA_ICMP_BYTES + IPPROTO_ICMPV6);
  sum = ones16(f, icmp, NEIGHBOR_ADVERT_BYTES, sum);
  const checksum = ~fold16(sum) & 0xffff;
  f[icmp + 2] = checksum >> 8;
  f[icmp + 3] = checksum & 0xff;
  return f;
}

/** The kernel seams of announceVips: the native addon, or a fake in tests. */
export interface AnnouncementLink {
  /** The interface as it is now: its index, MAC and ARPHRD_* type. Throws when there is none. */
  interfaceInfo(ifname: string): { ifindex: number; mac: Uint8Array; hardwareType: number };
  /** Sends whole frames out of `ifindex`; how many went (fewer: no room for the rest). Throws on a refusal. */
  sendFrames(ifindex: number, frames: readonly Uint8Array[]): number;
}

export const nativeAnnouncementLink: AnnouncementLink = {
  interfaceInfo: (ifname) => loadNative().interfaceInfo(ifname),
  sendFrames: (ifindex, frames) => loadNative().sendFrames(ifindex, frames),
};

/**
 * How long after the first round the second goes out. The first may race with the interface
 * becoming ready: until the kernel activates a new link's qdisc, frames sent to it are dropped
 * without an error, and the send fails outright (ENETDOWN) while it is down.
 */
export const ANNOUNCE_REPEAT_MS = 1000;
/** VIPs named in one log line; the rest are counted. */
const LOGGED_VIPS = 32;

export interface AnnounceOptions {
  /** Why the VIPs are announced ("start", "loop restart", "reload"), for the log. */
  reason?: string;
  link?: AnnouncementLink;
  /** Delay of the second round; default ANNOUNCE_REPEAT_MS. */
  repeatMs?: number;
}

/** The rounds of one announceVips call. */
export interface AnnouncementRounds {
  /** Settles (never rejects) once the last round went out, failed, or was cancelled. */
  readonly done: Promise<void>;
  /** Drops the rounds not sent yet: on stop (the VIPs are given up), or when a newer call replaces this one. */
  cancel(): void;
}

interface ParsedVip {
  address: string;
  family: 4 | 6;
}

/**
 * Sends one gratuitous ARP (IPv4) or unsolicited Neighbour Advertisement (IPv6) per VIP out of
 * `ifname`, from its MAC as it is now, at once and again after `repeatMs` (the MAC is read again
 * then). Untagged: a VLAN is its own device, which `ifname` then names. Never throws: what could
 * not be sent is logged as a warning (a missing or down interface, one that is not Ethernet).
 * `vips` are addresses as text, the family read from each (as HostSetup.apply takes them).
 */
export function announceVips(ifname: string, vips: readonly string[], log: Logger, options: AnnounceOptions = {}): AnnouncementRounds {
  const link = options.link ?? nativeAnnouncementLink;
  const reason = options.reason ?? 'host setup';
  const parsed: ParsedVip[] = [];
  for (const address of new Set(vips)) {
    if (!ipaddr.isValid(address)) {
      log.warn('VIP announcement skipped: not an IP address', { interface: ifname, vip: address });
      continue;
    }
    parsed.push({ address, family: ipaddr.parse(address).kind() === 'ipv6' ? 6 : 4 });
  }
  let timer: NodeJS.Timeout | null = null;
  let settle: () => void = () => undefined;
  const done = new Promise<void>((resolve) => (settle = resolve));
  const cancel = (): void => {
    if (timer !== null) clearTimeout(timer);
    timer = null;
    settle();
  };
  if (parsed.length === 0 || !sendRound(ifname, parsed, log, link, 1, reason)) {
    settle();
    return { done, cancel };
  }
  timer = setTimeout(() => {
    timer = null;
    sendRound(ifname, parsed, log, link, 2, reason);
    settle();
  }, options.repeatMs ?? ANNOUNCE_REPEAT_MS);
  timer.unref();
  return { done, cancel };
}

/** One round; false when another would be pointless (the interface is not Ethernet). */
function sendRound(ifname: string, vips: readonly ParsedVip[], log: Logger, link: AnnouncementLink, round: number, reason: string): boolean {
  const context = { interface: ifname, round, reason };
  const failed = (err: unknown): boolean => {
    const code = isNativeSystemError(err) ? err.code : (err as { code?: unknown }).code;
    log.warn('VIP announcements not sent', { ...context, error: (err as Error).message, ...(typeof code === 'string' ? { code } : {}) });
    return true;
  };
  let info: ReturnType<AnnouncementLink['interfaceInfo']>;
  try {
    info = link.interfaceInfo(ifname);
  } catch (err) {
    return failed(err);
  }
  if (info.hardwareType !== ARPHRD_ETHER) {
    log.warn('VIP announcements not sent: the interface is not Ethernet', { ...context, hardwareType: info.hardwareType });
    return false;
  }
  const frames = vips.map((v) => (v.family === 4 ? gratuitousArpFrame(info.mac, v.address) : unsolicitedNeighborAdvertFrame(info.mac, v.address)));
  let sent: number;
  try {
    sent = link.sendFrames(info.ifindex, frames);
  } catch (err) {
    return failed(err);
  }
  const named = (family: 4 | 6) => vips.slice(0, sent).filter((v) => v.family === family).map((v) => v.address);
  const fields = { ...context, mac: formatMac(info.mac), gratuitousArp: named(4).slice(0, LOGGED_VIPS), neighborAdvert: named(6).slice(0, LOGGED_VIPS) };
  const unnamed = Math.max(0, sent - fields.gratuitousArp.length - fields.neighborAdvert.length);
  log.info('VIP announcements sent', unnamed > 0 ? { ...fields, more: unnamed } : fields);
  if (sent < frames.length) {
    log.warn('VIP announcements partly sent: the socket had no room for the rest', { ...context, sent, unsent: frames.length - sent });
  }
  return true;
}
