# Another program on the LB's interface, for test/support/fanout-group.mjs (root, in a namespace):
#
#   member IFNAME GROUP_ID TYPE_FLAGS  a packet socket in PACKET_FANOUT group GROUP_ID, as a capture
#                                      tool or IDS would make it; prints "ready", then for each line
#                                      read on stdin the frames its socket took so far (it never reads
#                                      them: PACKET_STATISTICS counts the dropped ones too). "error
#                                      ERRNO" if the kernel refused the group.
#   flood IFNAME COUNT DST_MAC DST_IP  COUNT UDP frames to DST_IP:9999 (a socket bound there takes
#                                      them, so no ICMP error adds frames), 16 source ports, sent
#                                      straight onto IFNAME (the peer end of the LB's veth).
import socket
import struct
import sys

SOL_PACKET = 263
PACKET_FANOUT = 18
PACKET_STATISTICS = 6
ETH_P_ALL = 0x0003
PORT = 9999


def member(ifname, group_id, type_flags):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, ETH_P_ALL))
    try:
        s.setsockopt(SOL_PACKET, PACKET_FANOUT, group_id | (type_flags << 16))
    except OSError as e:
        print('error', e.errno, flush=True)
        return
    print('ready', flush=True)
    taken = 0
    for _ in sys.stdin:
        packets, _drops = struct.unpack('II', s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        taken += packets  # the kernel resets the counts on each read; packets includes drops
        print(taken, flush=True)


def checksum(header):
    total = sum(struct.unpack('!10H', header))
    while total > 0xffff:
        total = (total & 0xffff) + (total >> 16)
    return ~total & 0xffff


def flood(ifname, count, dst_mac, dst_ip):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind((dst_ip, PORT))
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out.bind((ifname, 0))
    src_mac = out.getsockname()[4]
    dst = bytes.fromhex(dst_mac.replace(':', ''))
    src_ip = socket.inet_aton('10.200.0.2')
    dst_ip4 = socket.inet_aton(dst_ip)
    frames = []
    for port in range(16):
        payload = bytes(18)
        udp = struct.pack('!HHHH', 20000 + port, PORT, 8 + len(payload), 0) + payload
        ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), port, 0, 64, 17, 0, src_ip, dst_ip4)
        ip = ip[:10] + struct.pack('!H', checksum(ip)) + ip[12:]
        frames.append(dst + src_mac + b'\x08\x00' + ip + udp)
    for i in range(count):
        out.send(frames[i % 16])
    print(count, flush=True)


if __name__ == '__main__':
    if sys.argv[1] == 'member':
        member(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        flood(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
