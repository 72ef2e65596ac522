// The flow table's timeouts from the config (the daemon, simulate and plan use the same).

import type { Config } from '../config/types.js';
import type { FlowTimeouts } from '../dataplane/flow-table.js';

/** After a RST, as IPVS's CLOSE state: not in the contract's tcpTimeouts. */
export const CLOSE_TIMEOUT_MS = 10_000;

export function timeoutsOf(cfg: Config): FlowTimeouts {
  return {
    synMs: cfg.flowTable.tcpTimeouts.synMs,
    establishedMs: cfg.flowTable.tcpTimeouts.establishedMs,
    finMs: cfg.flowTable.tcpTimeouts.finMs,
    closeMs: CLOSE_TIMEOUT_MS,
    udpMs: cfg.flowTable.udpTimeoutMs,
  };
}
