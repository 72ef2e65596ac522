// The preallocated slot a parser fills for one frame. One instance per packet loop, reused for
// every frame: the parser writes numbers into it and allocates nothing.

export const ETHERTYPE_IPV4 = 0x0800;
export const ETHERTYPE_IPV6 = 0x86dd;
export const ETHERTYPE_VLAN = 0x8100;
export const ETHERTYPE_ARP = 0x0806;

export const IPPROTO_ICMP = 1;
export const IPPROTO_IPIP = 4;
export const IPPROTO_TCP = 6;
export const IPPROTO_UDP = 17;
export const IPPROTO_IPV6 = 41;
export const IPPROTO_ICMPV6 = 58;

export const TCP_FIN = 0x01;
export const TCP_SYN = 0x02;
export const TCP_RST = 0x04;
export const TCP_PSH = 0x08;
export const TCP_ACK = 0x10;

/** parseFrame() result when the frame parsed and is IPv4 or IPv6. */
export const PARSE_OK = 0;
/** parseFrame() result for a well-formed frame that is not IP (ARP, LLDP, ...): leave it alone. */
export const PARSE_NOT_IP = 1;

export class ParsedPacket {
  /** Offset of the frame in its buffer and its length, as given to the parser. */
  frameOffset = 0;
  frameLength = 0;
  /** The 802.1Q TCI (PCP, DEI, VID) when the frame carries one tag, else -1. */
  vlanTci = -1;
  /** Ethertype after the VLAN tag (0x0800 or 0x86dd when PARSE_OK). */
  etherType = 0;
  /** 4 or 6. */
  family = 0;
  /** Absolute offsets into the buffer. l4Offset is -1 for non-first fragments. */
  l3Offset = 0;
  l4Offset = -1;
  /** Absolute offset one past the IP packet's last byte (from IPv4 total length / IPv6 payload length). */
  l3End = 0;
  /** IPv4 header length in bytes (IHL*4), or IPv6 40 + extension headers walked before the L4 header. */
  l3HeaderLength = 0;
  /** The upper-layer protocol: IPv4 protocol field, or the last IPv6 next-header value. */
  ipProtocol = 0;
  /** IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN). */
  trafficClass = 0;
  /** IPv4 TTL / IPv6 hop limit. */
  ttl = 0;
  /** IPv4 DF flag set (always 1 for IPv6, which routers never fragment). */
  dontFragment = 0;
  /** 1 when the packet is a fragment (IPv4 MF or offset != 0; IPv6 fragment header present). */
  isFragment = 0;
  /** Fragment offset in bytes (0 for the first fragment and for unfragmented packets). */
  fragmentOffset = 0;
  /** 1 when more fragments follow. */
  moreFragments = 0;
  /** IPv4 identification (16 bits) or IPv6 fragment identification (32 bits); 0 when not fragmented. */
  fragmentId = 0;
  /**
   * What every fragment of the datagram names the same: the IPv4 protocol, or the IPv6 Fragment
   * header's next header (a later fragment's ipProtocol is that too, which may be an extension
   * header such as destination options where the first fragment's is TCP or UDP). 0 when not fragmented.
   */
  fragmentProtocol = 0;
  /**
   * Source and destination addresses as big-endian 32-bit words: [src0..3, dst0..3].
   * IPv4 uses word 0 only (src = addr[0], dst = addr[4]) and leaves words 1..3 and 5..7 zero.
   */
  readonly addr = new Uint32Array(8);
  /** TCP/UDP ports (0 for other protocols and non-first fragments). */
  srcPort = 0;
  dstPort = 0;
  /** TCP flags byte (FIN, SYN, RST, PSH, ACK, URG, ECE, CWR), 0 for non-TCP. */
  tcpFlags = 0;
  /** ICMP/ICMPv6 type and code, -1 when not ICMP. */
  icmpType = -1;
  icmpCode = -1;
  /** Absolute offset of the L4 payload (after TCP options / UDP header / 4-byte ICMP header), -1 if none. */
  payloadOffset = -1;

  reset(): void {
    this.frameOffset = 0;
    this.frameLength = 0;
    this.vlanTci = -1;
    this.etherType = 0;
    this.family = 0;
    this.l3Offset = 0;
    this.l4Offset = -1;
    this.l3End = 0;
    this.l3HeaderLength = 0;
    this.ipProtocol = 0;
    this.trafficClass = 0;
    this.ttl = 0;
    this.dontFragment = 0;
    this.isFragment = 0;
    this.fragmentOffset = 0;
    this.moreFragments = 0;
    this.fragmentId = 0;
    this.fragmentProtocol = 0;
    // Word by word: fill() is a builtin call the optimiser does not inline on this hot path.
    const a = this.addr;
    a[0] = 0;
    a[1] = 0;
    a[2] = 0;
    a[3] = 0;
    a[4] = 0;
    a[5] = 0;
    a[6] = 0;
    a[7] = 0;
    this.srcPort = 0;
    this.dstPort = 0;
    this.tcpFlags = 0;
    this.icmpType = -1;
    this.icmpCode = -1;
    this.payloadOffset = -1;
  }
}
