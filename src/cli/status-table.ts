// `dsrlb status` as a table in the layout of `ipvsadm -Ln`: a header line for service rows and one
// for real rows, each over what is under it; then notes (operator overrides, drops, failed checks,
// the loops).

/** A real's intent as the config file says it (GET /status `configIntent`); absent from older daemons. */
interface ConfigIntent {
  state: string;
  weight: number;
}
interface RealStatus {
  address: string;
  forwarding: string;
  weight: number;
  intent: string;
  /** A backup real (new flows only while no other real can); absent from older daemons. */
  backup?: boolean;
  removed: boolean;
  /** The config's intent, beside the one in force (`intent`, `weight`); null for a removed real. */
  configIntent?: ConfigIntent | null;
  health: { state: string; since: string; lastError: string | null };
  /** The real's MAC (IPIP: its next hop's), null while unresolved; absent from older daemons. */
  mac?: string | null;
  /** Takes no new flows (drain, weight 0, removed) and has no established flow left; absent from older daemons. */
  drainFinished?: boolean;
  activeFlows: number;
  inactiveFlows: number;
  pps: number;
  bytesPerSecond: number;
}
interface ServiceStatus {
  name: string;
  protocol: string;
  vip: string;
  port: number;
  scheduler: string;
  forwarding: string;
  /** `client` with client persistence, and its prefix length; absent from older daemons. */
  persistence?: string;
  persistencePrefix?: number;
  /** One-packet scheduling; absent from older daemons. */
  ops?: boolean;
  panic: boolean;
  /** No real but the backups takes new flows; absent from older daemons. */
  onBackups?: boolean;
  dropping: boolean;
  droppingReason?: string | null;
  /** Removed by a reload, its flows draining. */
  removed?: boolean;
  /** An announcement through BIRD is meant (announce.enabled and the service's announce); absent from older daemons. */
  announce?: boolean;
  announced?: boolean;
  operatorWithdrawn?: boolean;
  /** Eligible again after its reals were all out here: not announced until they are back (scale-out). */
  announceWaitingForReals?: boolean;
  /** Its failOpen panic over: the reals still down keep their flows while they may come up. */
  panicEnding?: boolean;
  reals: RealStatus[];
}

function since(iso: string, now: number): string {
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

/** The daemon's packet loops (GET /status `loop`); absent from older daemons. */
interface LoopStatus {
  healthy: boolean;
  restarts?: number;
}

const SERVICE_HEADER = ['Prot LocalAddress:Port', 'Scheduler', 'Forward', 'Name', 'Flags'];
const REAL_HEADER = ['  -> RemoteAddress:Port', 'Forward', 'Weight', 'Intent', 'Health', 'ActiveConn', 'InActConn', 'Pkt/s', 'Bytes/s'];

/** What an operator set over the config's intent, as "drain", "weight 100" or "drain, weight 10" (the config's values); null when nothing. */
function overridden(r: RealStatus): { state: boolean; weight: boolean; config: string } | null {
  const c = r.configIntent;
  if (c === undefined || c === null || r.removed) return null;
  const state = c.state !== r.intent;
  const weight = c.weight !== r.weight;
  if (!state && !weight) return null;
  return { state, weight, config: [state ? c.state : '', weight ? `weight ${c.weight}` : ''].filter(Boolean).join(', ') };
}

/**
 * What ipvsadm -Ln writes after a service's scheduler: " persistent" (with " /N" for a client
 * prefix shorter than the address) and " ops".
 */
function schedulerFlags(s: ServiceStatus): string {
  const whole = s.vip.includes(':') ? 128 : 32;
  const persistent = s.persistence !== 'client' ? '' : s.persistencePrefix !== undefined && s.persistencePrefix < whole ? ` persistent /${s.persistencePrefix}` : ' persistent';
  return `${persistent}${s.ops === true ? ' ops' : ''}`;
}

export function formatStatus(status: { services: ServiceStatus[]; loop?: LoopStatus; stateFileProblem?: string | null }, now = Date.now()): string {
  // The first column (service or real address) is shared, so both kinds' other columns start at the
  // same place; the rest are aligned within their kind, each under its own header line.
  const serviceRows: string[][] = [SERVICE_HEADER];
  const realRows: string[][] = [REAL_HEADER];
  const order: { kind: 'service' | 'real'; row: string[] }[] = [];
  const overrides: string[] = [];
  const notes: string[] = [];
  const checkNotes: string[] = [];
  for (const s of status.services) {
    const vip = s.vip.includes(':') ? `[${s.vip}]` : s.vip;
    // A removed service drops new flows by definition: REMOVED says it all.
    // Where the VIP is meant to be announced: not announced now, by an operator or by the daemon
    // (no eligible real, a stalled loop, not settled yet, its reals still coming back): the other LBs carry its traffic.
    const announceFlag =
      s.announce !== true ? '' : s.operatorWithdrawn === true ? 'WITHDRAWN(operator)' : s.announced !== false ? '' : s.announceWaitingForReals === true ? 'NOT_ANNOUNCED(reals_rising)' : 'NOT_ANNOUNCED';
    const flags = s.removed ? 'REMOVED(draining)' : [s.panic ? 'PANIC(failOpen)' : '', s.panicEnding ? 'PANIC_ENDING(reals_rising)' : '', s.onBackups ? 'ON_BACKUPS' : '', s.dropping ? 'DROPPING' : '', announceFlag].filter(Boolean).join(' ');
    if (s.dropping && s.droppingReason && !s.removed) notes.push(`${s.name}: dropping: ${s.droppingReason}`);
    const row = [`${s.protocol.toUpperCase().padEnd(4)} ${vip}:${s.port}`, `${s.scheduler}${schedulerFlags(s)}`, s.forwarding, s.name, flags];
    serviceRows.push(row);
    order.push({ kind: 'service', row });
    for (const r of s.reals) {
      const addr = r.address.includes(':') ? `[${r.address}]` : r.address;
      // The last failed check after the table: an error message in the cell widened the column
      // for every row and pushed the counters off the screen.
      const health = `${r.health.state} ${since(r.health.since, now)}`;
      if (r.health.lastError) checkNotes.push(`${s.name} ${r.address}: last check failed${r.health.state === 'up' ? ' (still up)' : ''}: ${r.health.lastError}`);
      // An intent an operator set (this run, or restored from the state file at start) is marked:
      // the config file alone no longer tells what the real does.
      const o = overridden(r);
      if (o !== null) overrides.push(`  ${s.name} ${r.address}: ${o.config}`);
      // The snapshot leaves a real without a MAC out of the candidates, whatever its health says
      // (a service that drops for it says so already).
      if (r.mac === null && !s.dropping && !r.removed && r.intent === 'active' && r.weight > 0) {
        notes.push(`${s.name} ${r.address}: no MAC known (ARP/neighbour discovery unanswered): takes no new flows`);
      }
      // What an operator waits for before taking the real down (ipvsadm: watching ActiveConn reach 0):
      // a drain, a removal or a weight set to 0; not a standby the config gives weight 0.
      const drained = r.intent === 'drain' || r.removed || (r.weight === 0 && o?.weight === true);
      if (r.drainFinished === true && drained) notes.push(`${s.name} ${r.address}: drain finished: no established flow left`);
      const weight = `${r.weight}${o?.weight ? '*' : ''}`;
      const intent = r.removed ? 'removed' : `${r.intent}${o?.state ? '*' : ''}${r.backup === true ? ' backup' : ''}`;
      const realRow = [`  -> ${addr}:${s.port}`, r.forwarding, weight, intent, health, String(r.activeFlows), String(r.inactiveFlows), String(Math.round(r.pps)), String(Math.round(r.bytesPerSecond))];
      realRows.push(realRow);
      order.push({ kind: 'real', row: realRow });
    }
  }
  if (overrides.length > 0) {
    notes.unshift(
      '* set by an operator (dsrlb drain|undrain|disable|enable|weight), kept in the state file across restarts until the config file changes that real; the config says:',
      ...overrides,
    );
  }
  notes.push(...checkNotes);
  // The loops are not a service's: said after the table, only when something is wrong or was.
  const loop = status.loop;
  if (typeof status.stateFileProblem === 'string') notes.push(status.stateFileProblem);
  if (loop !== undefined && !loop.healthy) notes.push("packet loops: NOT HEALTHY (ended or stalled; the daemon's log says why)");
  if (loop !== undefined && (loop.restarts ?? 0) > 0) notes.push(`packet loops: started again ${loop.restarts} time${loop.restarts === 1 ? '' : 's'} after they ended (a crash, or their interface made again: the daemon's log says which)`);
  const first = Math.max(...[...serviceRows, ...realRows].map((r) => r[0]!.length));
  const widthsOf = (rows: string[][]): number[] => rows[0]!.map((_, i) => (i === 0 ? first : Math.max(...rows.map((r) => r[i]!.length))));
  const serviceWidths = widthsOf(serviceRows);
  const realWidths = widthsOf(realRows);
  const line = (r: string[], widths: number[]): string => r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd();
  const lines = [line(SERVICE_HEADER, serviceWidths), line(REAL_HEADER, realWidths)];
  for (const { kind, row } of order) lines.push(line(row, kind === 'service' ? serviceWidths : realWidths));
  return [...lines, ...notes].join('\n');
}
