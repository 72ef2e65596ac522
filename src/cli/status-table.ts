// `dsrlb status` as a table in the spirit of `ipvsadm -Ln`: one line per service, one per real.

interface RealStatus {
  address: string;
  forwarding: string;
  weight: number;
  intent: string;
  removed: boolean;
  health: { state: string; since: string; lastError: string | null };
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
  panic: boolean;
  dropping: boolean;
  droppingReason?: string | null;
  /** Removed by a reload, its flows draining. */
  removed?: boolean;
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

export function formatStatus(status: { services: ServiceStatus[]; loop?: LoopStatus }, now = Date.now()): string {
  const rows: string[][] = [['Prot', 'LocalAddress:Port', 'Scheduler', 'Forward', 'Weight', 'Intent', 'Health', 'ActiveConn', 'InActConn', 'Pkt/s', 'Bytes/s']];
  const lines: string[] = [];
  const notes: string[] = [];
  for (const s of status.services) {
    const vip = s.vip.includes(':') ? `[${s.vip}]` : s.vip;
    // The Health column of a service row names it, and says when it runs fail-open or drops.
    // A removed service drops new flows by definition: REMOVED says it all.
    const flags = s.removed ? `${s.name} REMOVED(draining)` : [s.name, s.panic ? 'PANIC(failOpen)' : '', s.dropping ? 'DROPPING' : ''].filter(Boolean).join(' ');
    if (s.dropping && s.droppingReason && !s.removed) notes.push(`${s.name}: dropping: ${s.droppingReason}`);
    rows.push([s.protocol.toUpperCase(), `${vip}:${s.port}`, s.scheduler, s.forwarding, '', '', flags, '', '', '', '']);
    for (const r of s.reals) {
      const addr = r.address.includes(':') ? `[${r.address}]` : r.address;
      const health = `${r.health.state} ${since(r.health.since, now)}${r.health.lastError ? ` (${r.health.lastError})` : ''}`;
      rows.push(['', `  -> ${addr}:${s.port}`, '', r.forwarding, String(r.weight), r.removed ? 'removed' : r.intent, health, String(r.activeFlows), String(r.inactiveFlows), String(Math.round(r.pps)), String(Math.round(r.bytesPerSecond))]);
    }
  }
  // The loops are not a service's: said after the table, only when something is wrong or was.
  const loop = status.loop;
  if (loop !== undefined && !loop.healthy) notes.push("packet loops: NOT HEALTHY (ended or stalled; the daemon's log says why)");
  if (loop !== undefined && (loop.restarts ?? 0) > 0) notes.push(`packet loops: started again ${loop.restarts} time${loop.restarts === 1 ? '' : 's'} after a crash (the daemon's log says why)`);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const r of rows) lines.push(r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd());
  return [...lines, ...notes].join('\n');
}
