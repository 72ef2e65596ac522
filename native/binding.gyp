{
  "targets": [
    {
      "target_name": "dsrlb_native",
      "sources": ["src/packet_ring.c", "src/tun_device.c", "src/raw_tunnel.c", "src/frame_send.c", "src/file_lock.c"],
      "defines": ["NAPI_VERSION=8", "_GNU_SOURCE"],
      "cflags": ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    }
  ]
}
