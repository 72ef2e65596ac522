// The LB's routes to a set of addresses (the next hops of IPIP reals), asked in one
// `ip -j -force -batch -` for all of them: asked every 10 s, one `ip route get` per real forked
// the daemon 5 times a second with 50 IPIP reals. With -force ip carries on past a lookup that
// fails (no route) and reports it on stderr by line number ("Command failed -:N"); the answers
// are matched to addresses by their `dst`, so a failure that is not reported by line cannot
// shift the others. An answer that is a route exception (a path MTU learned from an ICMP error, a
// redirect) is checked against the route itself (`route get fibmatch`): anyone who knows the LB's
// and a real's addresses can forge those errors, so the next hop is never taken from a redirect,
// and the route's own MTU stays at hand for when a learned one is not believed.

import { execFile } from 'node:child_process';
import { networkInterfaces } from 'node:os';
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
  /** The route's own MTU metric (the configured one), whatever was learned; null without one. */
  readonly routeMtu: number | null;
  /** The kernel answered from a route exception (a learned MTU, a redirect): lookupRoutes then reads the route itself. */
  readonly exception: boolean;
}

interface RouteAnswer {
  dst?: string;
  gateway?: string;
  dev?: string;
  prefsrc?: string;
  expires?: number;
  cache?: string[];
  metrics?: { mtu?: number }[];
}

const mtuOf = (r: RouteAnswer): number | null => r.metrics?.find((m) => typeof m.mtu === 'number')?.mtu ?? null;
/** The kernel answered from a route exception: a learned MTU or a redirect (`cache expires ...`, `cache <redirected>`). */
const isException = (r: RouteAnswer): boolean => r.expires !== undefined || (r.cache ?? []).includes('redirected');


/**
 * Parses the output of `ip -j -force -batch -` run on `route get A` lines for `addresses`: each
 * address's route, or the error ip gave for it (or "no answer" when it gave none).
 */
export function parseRouteBatch(addresses: readonly string[], stdout: string, stderr: string): Map<string, Route | Error> {
  const routes = new Map<string, Route>();
  for (const line of stdout.split('\n')) {
    if (!line.trim().startsWith('[')) continue;
    let answer: RouteAnswer[];
    try {
      answer = JSON.parse(line) as typeof answer;
    } catch {
      continue;
    }
    const r = answer[0];
    if (r?.dst === undefined) continue;
    const mtu = mtuOf(r);
    routes.set(normalizedAddress(r.dst), {
      gateway: r.gateway ?? null,
      dev: r.dev ?? null,
      prefsrc: r.prefsrc ?? null,
      mtu,
      mtuLearned: mtu !== null && r.expires !== undefined,
      routeMtu: mtu,
      exception: isException(r),
    });
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
 * an address is asked again without it, in a second run, as before sources were asked. One from a
 * local source that fails (a policy rule's unreachable) stays failed.
 */
export async function lookupRoutes(addresses: readonly string[], timeoutMs: number, sourceOf: (address: string) => string | null = () => null): Promise<Map<string, Route | Error>> {
  const routes = await routeBatch(addresses, timeoutMs, sourceOf);
  const again = addresses.filter((a) => {
    const from = sourceOf(a);
    return routes.get(a) instanceof Error && from !== null && !isLocalAddress(from);
  });
  if (again.length > 0) {
    const second = await routeBatch(again, timeoutMs, () => null);
    for (const a of again) routes.set(a, second.get(a)!);
  }
  // Route exceptions, one lookup each (rare: after an ICMP error about that real).
  for (const a of addresses) {
    const r = routes.get(a);
    if (r instanceof Error || r === undefined || !r.exception) continue;
    const from = again.includes(a) ? null : sourceOf(a);
    routes.set(a, withRoute(r, await fibRoute(a, from, timeoutMs)));
  }
  return routes;
}

/** An address of one of this network namespace's interfaces. */
function isLocalAddress(address: string): boolean {
  const wanted = normalizedAddress(address);
  return Object.values(networkInterfaces()).some((list) => list?.some((i) => normalizedAddress(i.address) === wanted) === true);
}

/**
 * An exception's answer with the route's own next hop, device and MTU metric (a redirect's gateway
 * is not taken); the exception's MTU stays the learned one. Unchanged when the route cannot be read.
 */
export function withRoute(answer: Route, route: RouteAnswer | null): Route {
  if (route === null) return answer;
  return { ...answer, gateway: route.gateway ?? null, dev: route.dev ?? answer.dev, routeMtu: mtuOf(route) };
}

/** `ip -j route get fibmatch A [from S]`: the route itself (no exception), or null when ip fails. */
function fibRoute(address: string, from: string | null, timeoutMs: number): Promise<RouteAnswer | null> {
  return new Promise((resolve) => {
    execFile('ip', ['-j', 'route', 'get', 'fibmatch', address, ...(from === null ? [] : ['from', from])], { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout) => {
      if (err) return resolve(null);
      try {
        resolve((JSON.parse(stdout) as RouteAnswer[])[0] ?? null);
      } catch {
        resolve(null);
      }
    });
  });
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
