// `dsrlb flows` as a table: ipvsadm -Lnc's columns (pro, expire, state, source, virtual,
// destination), the state in IPVS's words, plus the service's name; then how many were shown.

/** A row of GET /flows. */
export interface FlowRowView {
  protocol: string;
  client: string;
  vip: string;
  service: string;
  real: string;
  state: string;
  expiresInMs: number;
}

/** dsrlb's flow states as ipvsadm -Lnc names the IPVS states they follow. */
const IPVS_STATE: Readonly<Record<string, string>> = { syn: 'SYN_RECV', established: 'ESTABLISHED', fin: 'FIN_WAIT', closed: 'CLOSE', udp: 'UDP' };

/** mm:ss, as ipvsadm's expire column. */
function expire(ms: number): string {
  const s = Math.ceil(ms / 1000);
  return `${String(Math.floor(s / 60)).padStart(2, '0')}:${String(s % 60).padStart(2, '0')}`;
}

/** The real as ipvsadm's destination: its address with the port the flow was sent to (DSR keeps it). */
function destination(row: FlowRowView): string {
  const port = row.vip.slice(row.vip.lastIndexOf(':') + 1);
  return row.real.includes(':') ? `[${row.real}]:${port}` : `${row.real}:${port}`;
}

/** `limited`: a --limit other than 0 was given (the hint to pass --limit 0 is for it alone). */
export function formatFlows(listing: { total: number; flows: readonly FlowRowView[] }, limited = true): string {
  const rows = [['pro', 'expire', 'state', 'source', 'virtual', 'destination', 'service']];
  for (const f of listing.flows) rows.push([f.protocol.toUpperCase(), expire(f.expiresInMs), IPVS_STATE[f.state] ?? f.state.toUpperCase(), f.client, f.vip, destination(f), f.service]);
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  const lines = rows.map((r) => r.map((cell, c) => (c === r.length - 1 ? cell : cell.padEnd(widths[c]!))).join(' '));
  const shown = listing.flows.length;
  const more = shown < listing.total ? (limited ? ' (--limit 0 lists them all)' : ' (1,000,000 at most: narrow by --real or --client)') : '';
  lines.push(`${shown} of ${listing.total} flow${listing.total === 1 ? '' : 's'} shown${more}`);
  return `${lines.join('\n')}\n`;
}
