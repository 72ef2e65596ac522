// The LB's routes to a set of addresses (the next hops of IPIP reals), asked in one
// `ip -j -force -batch -` for all of them: asked every 10 s, one `ip route get` per real forked
// the daemon 5 times a second with 50 IPIP reals. With -force ip carries on past a lookup that
// fails (no route) and reports it on stderr by line number ("Command failed -:N"); the answers
// are matched to addresses by their `dst`, so a failure that is not reported by line cannot
// shift the others.

import { execFile } from 'node:child_process';
import { normalizedAddress } from './addresses.js';

export interface Route {
  /** The gateway, or null for an address on a connected network. */
  readonly gateway: string | null;
  readonly dev: string | null;
  /** The source address the kernel would choose (what IPVS's tunnel uses), or null. */
  readonly prefsrc: string | null;
  /**
   * The route's MTU metric (`ip route ... mtu N`: a VPN or GRE underlay), or the path MTU the kernel
   * learned from an ICMP error about a tunnel packet (a route exception, path-mtu-sockets.ts), or
   * null without either.
   */
  readonly mtu: number | null;
  /** `mtu` is a learned one: the answer is a route exception (it has an expiry). */
  readonly mtuLearned: boolean;
}


/**
 * Parses the output of `ip -j -force -batch -` run on `route get A` lines for `addresses`: each
 * address's route, or the error ip gave for it (or "no answer" when it gave none).
 */
export function parseRouteBatch(addresses: readonly string[], stdout: string, stderr: string): Map<string, Route | Error> {
  const routes = new Map<string, Route>();
  for (const line of stdout.split('\n')) {
    if (!line.trim().startsWith('[')) continue;
    let answer: { dst?: string; gateway?: string; dev?: string; prefsrc?: string; expires?: number; metrics?: { mtu?: number }[] }[];
    try {
      answer = JSON.parse(line) as typeof answer;
    } catch {
      continue;
    }
    const r = answer[0];
    if (r?.dst === undefined) continue;
    const mtu = r.metrics?.find((m) => typeof m.mtu === 'number')?.mtu ?? null;
    routes.set(normalizedAddress(r.dst), { gateway: r.gateway ?? null, dev: r.dev ?? null, prefsrc: r.prefsrc ?? null, mtu, mtuLearned: mtu !== null && r.expires !== undefined });
  }
  // stderr: the error's own line(s), then "Command failed -:N" naming the batch line.
  const failed = new Map<number, string>();
  let message: string[] = [];
  for (const line of stderr.split('\n')) {
    const m = /^Command failed -:(\d+)/.exec(line);
    if (m) {
      failed.set(Number(m[1]), message.join('; ') || 'failed');
      message = [];
    } else if (line.trim() !== '') message.push(line.trim());
  }
  const out = new Map<string, Route | Error>();
  addresses.forEach((a, i) => {
    // By one spelling: an IPv6 address can be written many ways, and ip prints its own.
    const route = routes.get(normalizedAddress(a));
    out.set(a, route ?? new Error(failed.get(i + 1) ?? (message.join('; ') || 'no answer from ip route get')));
  });
  return out;
}

/**
 * Routes to `addresses` from one `ip` run; an `ip` that fails whole (missing, killed) fails every
 * address. `sourceOf(address)`: the source the packets to it leave from, when it is configured
 * (tunnel.sourceV4/V6): asked `from` it, so that source-based policy routing (`ip rule from ...`)
 * answers with the route they take, and the path MTU the kernel learned on it. A lookup from a
 * source that is not an address of this host fails (the kernel routes only its own sources): such
 * an address is asked again without it, in a second run, as before sources were asked.
 */
export async function lookupRoutes(addresses: readonly string[], timeoutMs: number, sourceOf: (address: string) => string | null = () => null): Promise<Map<string, Route | Error>> {
  const first = await routeBatch(addresses, timeoutMs, sourceOf);
  const again = addresses.filter((a) => first.get(a) instanceof Error && sourceOf(a) !== null);
  if (again.length === 0) return first;
  const second = await routeBatch(again, timeoutMs, () => null);
  for (const a of again) first.set(a, second.get(a)!);
  return first;
}

function routeBatch(addresses: readonly string[], timeoutMs: number, sourceOf: (address: string) => string | null): Promise<Map<string, Route | Error>> {
  if (addresses.length === 0) return Promise.resolve(new Map());
  return new Promise((resolve) => {
    const child = execFile('ip', ['-j', '-force', '-batch', '-'], { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      const killed = (err as { killed?: boolean } | null)?.killed === true;
      // A non-zero exit is normal with -force when one lookup failed: the others answered.
      if (err && (killed || typeof (err as { code?: unknown }).code !== 'number')) {
        const why = new Error(killed ? `ip route get: no answer within ${timeoutMs / 1000} s (killed)` : `ip route get: ${err.message}`);
        return resolve(new Map(addresses.map((a) => [a, why])));
      }
      resolve(parseRouteBatch(addresses, stdout, stderr));
    });
    child.stdin!.end(
      addresses
        .map((a) => {
          const from = sourceOf(a);
          return from === null ? `route get ${a}\n` : `route get ${a} from ${from}\n`;
        })
        .join(''),
    );
  });
}
