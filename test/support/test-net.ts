// The addressing plan the packet-level unit tests share (documentation prefixes: clients in
// TEST-NET-2, VIPs in TEST-NET-3, the LB's tunnel source in TEST-NET-1, reals in 10.0.1.0/24;
// 2001:db8::/32 for IPv6), and a frame from the client to the LB.
import { ethernet } from './packet-builder.js';

export const CLIENT_MAC = '02:00:00:00:00:01';
export const LB_MAC = '02:00:00:00:00:fe';
/** The MAC of a real (or of the router towards it). */
export const NEXT_HOP_MAC = '02:00:00:00:00:11';
export const CLIENT4 = '198.51.100.7';
export const VIP4 = '203.0.113.10';
export const REAL4 = '10.0.1.11';
/** The LB's own address: source of its tunnels. */
export const SOURCE4 = '192.0.2.5';
export const CLIENT6 = '2001:db8:c::7';
export const VIP6 = '2001:db8:f::10';
export const REAL6 = '2001:db8:1::11';
export const SOURCE6 = '2001:db8::5';

/** `packet` in an Ethernet frame from the client to the LB (802.1Q-tagged when vlan is given). */
export const toLb = (type: number, packet: Uint8Array, vlan?: number): Uint8Array =>
  ethernet({ dst: LB_MAC, src: CLIENT_MAC, type, vlan }, packet);
