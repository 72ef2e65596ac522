// Every reason the data plane drops a frame, as a stable small integer (a counter slot) and the
// label used in dsrlb_dropped_packets_total{reason}. Parsers and encap functions return the
// negative of one of these; 0 and positive values mean success.

export const DropReason = {
  // Parsing (src/dataplane/packet-parser.ts)
  truncatedEthernet: 1,
  truncatedVlan: 2,
  truncatedIpv4: 3,
  badIpv4Version: 4,
  badIpv4HeaderLength: 5,
  badIpv4TotalLength: 6,
  truncatedIpv6: 7,
  badIpv6PayloadLength: 8,
  ipv6ExtensionHeaderLimit: 9,
  truncatedIpv6ExtensionHeader: 10,
  truncatedTcp: 11,
  badTcpDataOffset: 12,
  truncatedUdp: 13,
  badUdpLength: 14,
  truncatedIcmp: 15,
  // Capture and I/O
  captureTruncated: 16, // cut short by the capture (snap length below the frame's, ring frame too small): never shown to the engine
  gsoUnsupported: 17, // a GSO super-frame the I/O backend cannot hand back to the kernel
  txFailed: 18,
  // Forwarding decisions (src/dataplane/engine.ts)
  noRealAvailable: 19, // whenAllDown: drop, or no real configured
  neighborUnknown: 20, // the chosen real's MAC is not resolved yet
  fragmentUnplaceable: 21, // a non-first IP fragment with no known flow
  icmpToVip: 22, // ICMP to a VIP that is neither echo nor an error about a flow (isErrorAboutFlow)
  ipipUnsupported: 23, // an ipip real in a build that cannot encapsulate yet
  packetTooBig: 24, // encapsulated packet would exceed the MTU
  // 25 unused: DSR forwards without touching the TTL (as IPVS DR), so nothing drops for it.
  batchFull: 26, // the batch's extra frames or bytes (GSO segments, outer fragments) are used up: dropped whole
  badIpv4Checksum: 27, // the IPv4 header checksum does not verify (the kernel's ip_rcv drops these too)
  // A partial checksum (virtio NEEDS_CSUM) the engine cannot finish, going where the kernel will not
  // either (into a tunnel, an echo reply): its field is not the pseudo-header sum over the header's
  // addresses (a source route: the sender summed the final destination), or ICMP over IPv4
  badPartialChecksum: 28,
} as const;

export type DropReasonName = keyof typeof DropReason;

/** Highest reason number + 1: the size of the per-reason counter array. */
export const DROP_REASON_SLOTS = 32;

/** Counter slot -> metric label (snake_case), e.g. 12 -> "bad_tcp_data_offset". */
export const dropReasonLabels: readonly string[] = (() => {
  const labels: string[] = new Array<string>(DROP_REASON_SLOTS).fill('');
  for (const [name, slot] of Object.entries(DropReason)) {
    labels[slot] = name.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toLowerCase();
  }
  return labels;
})();
