// Client persistence (a service's `persistence: client`): every connection of one client address,
// cut to the service's prefix, is placed on the same real, as IPVS's persistent services and
// Katran's hashing without the source port do. IPVS remembers a client's real in a template entry;
// here the placement hash leaves the ports out and masks the client address, so every packet loop
// and every LB of a group computes the same real without sharing state. Flow entries keep each
// connection on its real as before; only where a new connection goes changes.

import { FLOW_KEY_WORDS, flowHashInt32 } from './flow-hash.js';
import type { ForwardingSnapshot } from './forwarding-snapshot.js';

/**
 * The hash that places a new connection of service `svc` with flow key `key` (int32; `seed` is the
 * snapshot's hashSeed as an int32): the flow hash of the whole key, or with client persistence
 * clientPlacementHash (in `scratch`). The engine's schedulers and consistent hash and plan's
 * estimates all place by this.
 */
export function placementHash(snap: ForwardingSnapshot, svc: number, key: Uint32Array, scratch: Uint32Array, seed: number): number {
  if (snap.svcPersistent[svc] === 1) return clientPlacementHash(key, snap.svcClientMask, svc * 4, scratch, seed);
  return flowHashInt32(key, seed);
}

/**
 * Writes the mask of a `prefix`-bit client prefix as four int32 words at `at` (the words of an
 * address as ParsedPacket.addr holds it: IPv4 in word 0, most significant bits first).
 */
export function writeClientMask(family: number, prefix: number, out: Int32Array, at: number): void {
  const bits = family === 4 ? 32 : 128;
  if (!Number.isInteger(prefix) || prefix < 1 || prefix > bits) throw new RangeError(`client prefix must be 1..${bits}, got ${prefix}`);
  for (let w = 0; w < 4; w++) {
    const inWord = family === 4 && w > 0 ? 0 : Math.min(32, Math.max(0, prefix - 32 * w));
    out[at + w] = inWord === 0 ? 0 : inWord === 32 ? -1 : -1 << (32 - inWord);
  }
}

/**
 * The placement hash of flow key `key` (FlowTable's layout: word 0 family and protocol, 1-4 the
 * client, 5-8 the VIP, 9 the ports) for a service with client persistence: flowHashInt32 of the
 * same key with the client masked by `mask` (words at `at`) and both ports zero, computed in
 * `scratch` (FLOW_KEY_WORDS words). The VIP stays in: two services of one VIP with the same reals
 * send a client to the same real (HTTP and HTTPS on one server); the VIP port does not, so a
 * port-0 service keeps a client's connections to every port together (FTP's control and data).
 */
export function clientPlacementHash(key: Uint32Array, mask: Int32Array, at: number, scratch: Uint32Array, seed: number): number {
  scratch[0] = key[0]!;
  scratch[1] = key[1]! & mask[at]!;
  scratch[2] = key[2]! & mask[at + 1]!;
  scratch[3] = key[3]! & mask[at + 2]!;
  scratch[4] = key[4]! & mask[at + 3]!;
  scratch[5] = key[5]!;
  scratch[6] = key[6]!;
  scratch[7] = key[7]!;
  scratch[8] = key[8]!;
  scratch[9] = 0;
  return flowHashInt32(scratch, seed);
}

/** A scratch key for clientPlacementHash. */
export function clientKeyScratch(): Uint32Array {
  return new Uint32Array(FLOW_KEY_WORDS);
}
