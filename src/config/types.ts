// The validated, normalised configuration: what every other module reads. Produced only by
// src/config/validate.ts from the YAML file; durations are in milliseconds, addresses in
// canonical text form (ipaddr.js toString()), defaults filled in, the whole object frozen.

export type Protocol = 'tcp' | 'udp';
export type SchedulerKind = 'maglev' | 'rendezvous' | 'wlc';
export type ForwardingMode = 'l2' | 'ipip';
export type RealIntent = 'active' | 'drain' | 'disabled';
export type WhenAllDown = 'failOpen' | 'drop';
/** What a real marked down by its health check does with its flows: they move (reschedule), or stay on it (keep). */
export type OnRealDown = 'reschedule' | 'keep';
/** none: each connection placed by its own 5-tuple; client: every connection of a client address (cut to persistencePrefix) to one real. */
export type Persistence = 'none' | 'client';
export type IoKind = 'afpacket' | 'pcap';
/** AF_PACKET ring: v2 hands each frame over as it arrives, v3 a block at a time (up to 1 ms later). */
export type RingKind = 'v2' | 'v3';
export type HealthCheckType = 'tcp' | 'http' | 'https' | 'udp' | 'icmp' | 'exec' | 'none';
export type AddressFamily = 4 | 6;

export interface ListenAddress {
  readonly host: string; // canonical address text, e.g. "127.0.0.1" or "::1"
  readonly port: number;
}

export interface HealthCheckConfig {
  readonly type: HealthCheckType;
  readonly port: number; // default: the service port (for port-0 services: required unless type is icmp/exec/none)
  readonly path: string; // http/https, default "/"
  readonly host: string | null; // http/https Host header, default: the real's address
  readonly expectStatus: readonly number[]; // http/https, default [200]
  readonly expectBody: string | null; // http/https: substring the body must contain
  readonly payload: string | null; // udp: datagram to send (default "ping")
  readonly expectPayload: string | null; // udp: substring the reply must contain (null: any reply)
  readonly command: string | null; // exec: run through /bin/sh -c with DSRLB_REAL, DSRLB_PORT, DSRLB_VIP set
  readonly intervalMs: number; // default 2000
  readonly timeoutMs: number; // default 1000, must be <= intervalMs
  readonly rise: number; // default 2
  readonly fall: number; // default 3
}

export interface RealConfig {
  readonly address: string;
  readonly family: AddressFamily;
  readonly weight: number; // 0..65535, default 100
  readonly state: RealIntent; // default active
  readonly forwarding: ForwardingMode; // resolved: the real's override or the service's mode
  /** Takes new flows only while no other real of the service can (HAProxy's backup servers, keepalived's sorry_server); default false. */
  readonly backup: boolean;
}

export interface ServiceConfig {
  readonly name: string; // default "<protocol>://<vip>:<port>" (IPv6 in brackets)
  readonly vip: string;
  readonly family: AddressFamily;
  readonly port: number; // 0 = every port of the VIP
  readonly protocol: Protocol;
  readonly scheduler: SchedulerKind; // default maglev
  readonly forwarding: ForwardingMode; // default l2
  readonly whenAllDown: WhenAllDown; // default failOpen
  readonly onRealDown: OnRealDown; // default reschedule
  readonly persistence: Persistence; // default none
  /** With persistence client: the client address's prefix length that counts; default 32 (IPv4) / 128 (IPv6). */
  readonly persistencePrefix: number;
  /** One-packet scheduling (ipvsadm -o, Katran's LRU bypass): UDP only; no flow entries, every datagram placed on its own. Default false. */
  readonly ops: boolean;
  readonly tableSize: number; // Maglev table size, a prime; default 65537
  readonly healthCheck: HealthCheckConfig; // default type none
  /** Announce this service's VIP through BIRD when announce.enabled (default true). */
  readonly announce: boolean;
  readonly reals: readonly RealConfig[];
}

/** Scale-out: VIP announcement through BIRD (a TUN "dead man's switch" per VIP, see docs/scale-out.md). */
export interface AnnounceConfig {
  readonly enabled: boolean; // default false
  /** The BIRD snippet dsrlb writes (static protocols dsrlb_v4 / dsrlb_v6); default /run/dsrlb/bird-routes.conf */
  readonly routesFile: string;
  /** BIRD control socket: `birdc -s PATH configure` after routesFile changes; null: the operator reloads BIRD. */
  readonly birdSocket: string | null;
  /** Keep announcing a VIP whose service is in failOpen panic (default true). */
  readonly onFailOpen: boolean;
  /** On a clean stop: the announce devices down, then wait this long before the packet loop stops (default 300 ms). */
  readonly withdrawDelayMs: number;
}

export interface FlowTableConfig {
  readonly capacity: number; // default 1000000
  readonly tcpTimeouts: { readonly synMs: number; readonly establishedMs: number; readonly finMs: number };
  readonly udpTimeoutMs: number; // default 300000
}

export interface Config {
  readonly interface: string;
  readonly io: IoKind; // default afpacket
  readonly ring: RingKind; // io: afpacket only; default v3
  /** Packet loops (worker threads, PACKET_FANOUT by flow hash); default 1; io: pcap allows only 1. */
  readonly workers: number;
  /** CPUs the packet loops run on: loop i on cpus[i % length]; empty (default): unpinned. afpacket only. */
  readonly cpus: readonly number[];
  readonly hashSeed: number; // uint32, default 0; must be equal on every LB of a scale-out group
  readonly flowTable: FlowTableConfig;
  readonly tunnel: { readonly sourceV4: string | null; readonly sourceV6: string | null };
  readonly metrics: { readonly listen: ListenAddress }; // default 127.0.0.1:9742
  readonly admin: { readonly listen: ListenAddress; readonly tokenFile: string | null }; // default 127.0.0.1:9743
  readonly stateFile: string | null; // runtime intent; default: "<config dir>/dsrlb.state.json"
  readonly announce: AnnounceConfig;
  readonly services: readonly ServiceConfig[];
}

/** One problem found in a config file: `path: message`, e.g. `services[0].port: 70000 is not a port (0..65535)`. */
export interface ConfigProblem {
  readonly path: string;
  readonly message: string;
  /** Where in the config text the path points, when it points at something written there (see problem-positions.ts). */
  readonly position?: SourcePosition;
}

/** A place in the config text: 1-based line and column (UTF-16 units, as the yaml library counts; a BOM not counted). */
export interface SourcePosition {
  readonly line: number;
  readonly column: number;
  /** The line of the alias (`*name`, `<<: *name`) the path went through, when the place is inside the anchor it names. */
  readonly aliasLine?: number;
}
