// A reload is all or nothing: what can fail (real ids, the interface's addresses, the host change)
// runs before the config is swapped, and from the swap to the new snapshot nothing awaits, so no
// timer sees the new config with the old reals. A reload that turns announcing off closes every
// VIP's device and stops the checks. No root, no loop: the host, loops and neighbours stood in for.

import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { stubbedDaemon } from '../support/stubbed-daemon.js';
import { bootId, decodeSavedFlows } from '../../src/control/flows-file.js';
import { MAX_REAL_IDS } from '../../src/dataplane/counters.js';
import { FLOW_KEY_WORDS } from '../../src/dataplane/flow-hash.js';
import type { ForwardingSnapshot } from '../../src/dataplane/forwarding-snapshot.js';
import { TUNNEL_TEMPLATE_BYTES } from '../../src/encap/ipip.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-reload-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

/** A config with explicit tunnel sources (no `ip addr` asked) and `reals` reals from 10.<base>.0.1 up. */
function configText(opts: { base?: number; reals?: number; announce?: boolean; iface?: string; tunnel?: boolean; weight?: number; state?: string; port?: number } = {}): string {
  const n = opts.reals ?? 2;
  const reals = Array.from({ length: n }, (_, i) => `{ address: 10.${opts.base ?? 93}.${Math.floor(i / 250)}.${(i % 250) + 1}, weight: ${opts.weight ?? 1} }`);
  return `interface: ${opts.iface ?? 'eth0'}
${opts.tunnel === false ? '' : 'tunnel: { sourceV4: 10.93.255.1, sourceV6: "fd00::1" }\n'}announce: { enabled: ${opts.announce ?? false} }
stateFile: ${join(dir, opts.state ?? 'state.json')}
services:
  - name: web
    vip: 10.99.0.100
    port: ${opts.port ?? 80}
    healthCheck: { type: none }
    reals: [${reals.join(', ')}]
`;
}

function daemonRunning(text: string) {
  const path = join(dir, 'dsrlb.yaml');
  const logs: { level: string; msg: string }[] = [];
  const hostApplied: string[][] = [];
  const sent: { type: string }[] = [];
  // The interface's own addresses: what `ip -j addr show` would list (none is a VIP unless a test says so).
  const interfaceAddresses = new Map<string, string>();
  const { daemon, inside } = stubbedDaemon(path, text, {
    // Every real holds a flow: removed reals keep their ids.
    activeFlows: 1,
    broadcast: (m) => void sent.push(m),
    host: { apply: async (vips: string[]) => void hostApplied.push(vips), interfaceAddressesAmong: async (vips: string[]) => new Map([...interfaceAddresses].filter(([a]) => vips.includes(a))) },
    log: (l) => logs.push(JSON.parse(l) as { level: string; msg: string }),
  });
  (inside.syncReals as () => void).call(daemon);
  daemon.rebuild('start');
  const reload = (next: string) => {
    writeFileSync(path, next);
    return daemon.reload();
  };
  return { daemon, inside, reload, logs, hostApplied, sent, interfaceAddresses };
}

/** The stand-ins a stop goes through (loops as `loops` says, their stop a no-op unless given; neighbours, host undo), on a daemon marked started. */
function startedForStop(inside: Record<string, unknown>, loops: Record<string, unknown>): void {
  Object.assign(inside.loops as Record<string, unknown>, { stop: async () => undefined, ...loops });
  (inside.neighbors as Record<string, unknown>).stop = () => undefined;
  inside.host = { ...(inside.host as object), undo: async () => undefined };
  inside.started = true;
}

describe('reload: all or nothing', () => {
  it('refuses a config that needs more real ids than are free, naming them, and changes nothing', async () => {
    const before = configText({ base: 93, reals: 5000 });
    const d = daemonRunning(before);
    const config = d.daemon.config;
    // 5000 new pairs while the 5000 removed ones still hold flows (and their ids).
    const result = await d.reload(configText({ base: 94, reals: 5000 }));
    expect(result.ok).toBe(false);
    expect(result.problems).toEqual([
      // Where the file writes what the path names, as validation's own problems say.
      { path: 'services', message: `5000 new (service, real) pairs but only ${MAX_REAL_IDS - 5000} real ids free of ${MAX_REAL_IDS}: 0 removed reals keep theirs until their flows end`, position: { line: 5, column: 1 } },
    ]);
    expect(d.daemon.config).toBe(config);
    expect(d.daemon.configText).toBe(before);
    expect(d.hostApplied).toEqual([]);
    expect(d.sent.filter((m) => m.type === 'snapshot')).toHaveLength(1);
    d.daemon.health.stop();
  }, 30_000);

  it('takes the same reals again, and refuses while reals removed by the previous reload still drain', async () => {
    const d = daemonRunning(configText({ base: 93, reals: 5000 }));
    expect((await d.reload(configText({ base: 93, reals: 5000, weight: 2 }))).ok).toBe(true);
    // The 5000 removed (draining, ids kept) and 2000 new: 7000 ids in use, and 2000 more wanted.
    expect((await d.reload(configText({ base: 95, reals: 2000 }))).ok).toBe(true);
    const refused = await d.reload(configText({ base: 96, reals: 2000 }));
    expect(refused.ok).toBe(false);
    expect(refused.problems[0]!.message).toBe(`2000 new (service, real) pairs but only ${MAX_REAL_IDS - 7000} real ids free of ${MAX_REAL_IDS}: 5000 removed reals keep theirs until their flows end`);
    d.daemon.health.stop();
  }, 30_000);

  it('refuses, before any host change, when the interface\'s addresses (the IPIP outer source) cannot be read', async () => {
    const text = configText({ iface: 'dsrlbnosuch0', tunnel: false });
    const d = daemonRunning(text);
    const config = d.daemon.config;
    const result = await d.reload(configText({ iface: 'dsrlbnosuch0', tunnel: false, reals: 3 }));
    expect(result).toMatchObject({ ok: false, refusedBy: 'system' });
    expect(result.problems[0]!.path).toBe('(host)');
    expect(result.problems[0]!.message).toMatch(/^reading the addresses of dsrlbnosuch0: /);
    expect(d.daemon.config).toBe(config);
    expect(d.hostApplied).toEqual([]);
    d.daemon.health.stop();
  });

  it('lets no timer run between the swap and the new snapshot: one that rebuilds meanwhile sees a whole view', async () => {
    const d = daemonRunning(configText({ reals: 2 }));
    // An operator drain on the first real: the reload changes that real's weight, so the intent
    // is dropped and the state file written. Saving yields to timers: it must come after the rebuild.
    (d.inside.overrides as Map<string, unknown>).set('tcp|10.99.0.100|80#10.93.0.1', { configState: 'active', configWeight: 1, state: 'drain' });
    let viewDuringSave: unknown = null;
    d.inside.saveState = async () => {
      try {
        d.daemon.rebuild('a timer');
        viewDuringSave = 'whole';
      } catch (err) {
        viewDuringSave = err;
      }
    };
    const result = await d.reload(configText({ reals: 4, weight: 3 }));
    expect(result.ok).toBe(true);
    expect(viewDuringSave).toBe('whole');
    expect((d.inside.overrides as Map<string, unknown>).size).toBe(0);
    d.daemon.health.stop();
  });
});

describe('reload: a VIP that is the host\'s own address', () => {
  it('is refused as a config problem before any host change, naming the interface', async () => {
    const d = daemonRunning(configText());
    const config = d.daemon.config;
    d.interfaceAddresses.set('10.99.0.7', 'eth0 (10.99.0.7/24)');
    const result = await d.reload(configText().replace('vip: 10.99.0.100', 'vip: 10.99.0.7'));
    expect(result).toMatchObject({ ok: false, refusedBy: 'config' });
    expect(result.problems).toEqual([
      {
        path: 'services[0].vip',
        message: '10.99.0.7 is an address of this host: eth0 (10.99.0.7/24); as a VIP all traffic to it is dropped at the host (SSH, BGP, probe replies): give the service an address of its own',
        position: { line: 7, column: 5 },
      },
    ]);
    expect(d.hostApplied).toEqual([]);
    expect(d.daemon.config).toBe(config);
    d.daemon.health.stop();
  });
});

describe('reload: announcing turned off', () => {
  it('closes every VIP\'s device, stops the 200 ms check, and the checks do nothing after', async () => {
    const d = daemonRunning(configText({ announce: true }));
    const syncs: Map<string, boolean>[] = [];
    d.inside.announcer = { sync: async (w: Map<string, boolean>) => void syncs.push(new Map(w)), setFiles: () => undefined, isAnnounced: () => false };
    d.inside.announceTimer = setInterval(() => undefined, 200);
    const result = await d.reload(configText({ announce: false }));
    expect(result.ok).toBe(true);
    expect(d.inside.announceTimer).toBeNull();
    expect(syncs).toEqual([new Map()]);
    await (d.inside.syncAnnouncements as () => Promise<void>).call(d.daemon);
    expect(syncs).toHaveLength(1);
    d.daemon.health.stop();
  });
});

describe('IPIP next hops asked again while running', () => {
  it('takes a changed gateway of an IPIP real: the neighbours wanted and the snapshot follow it', async () => {
    const text = configText().replace('healthCheck: { type: none }', 'healthCheck: { type: none }\n    forwarding: ipip');
    const wanted: string[][] = [];
    const d = daemonRunning(text);
    d.inside.neighbors = { setWanted: (a: Iterable<string>) => void wanted.push([...a]), macOf: () => new Uint8Array(6) };
    let gateway = '192.0.2.13';
    const route = () => ({ nextHop: gateway, source: '10.93.255.1', mtu: null });
    d.inside.resolveTunnelRoutes = async () => ({ routes: new Map([['10.93.0.1', route()], ['10.93.0.2', route()]]), sources: { v4: '10.93.255.1', v6: 'fd00::1' } });
    const refresh = () => (d.inside.refreshTunnelRoutes as () => Promise<void>).call(d.daemon);
    await refresh();
    const snapshots = d.sent.filter((m) => m.type === 'snapshot').length;
    expect(wanted.at(-1)).toEqual(['192.0.2.13']);
    await refresh(); // unchanged: nothing rebuilt
    expect(d.sent.filter((m) => m.type === 'snapshot').length).toBe(snapshots);
    gateway = '192.0.2.12'; // ip route replace ... via 192.0.2.12
    await refresh();
    expect(wanted.at(-1)).toEqual(['192.0.2.12']);
    expect(d.sent.filter((m) => m.type === 'snapshot').length).toBe(snapshots + 1);
    expect(d.logs).toContainEqual(expect.objectContaining({ msg: 'IPIP real route changed' }));
    d.daemon.health.stop();
  });
});

describe('rebuilds queued by health changes', () => {
  it('takes the changes of 100 ms in one rebuild (one per probe result rebuilt every service 30 times a second)', async () => {
    const d = daemonRunning(configText({ reals: 50 }));
    const snapshots = () => d.sent.filter((m) => m.type === 'snapshot').length;
    const before = snapshots();
    const keys = [...(d.inside.reals as Map<string, unknown>).keys()];
    const fact = { state: 'down', since: 0, lastError: 'refused', successes: 0, failures: 1, lastDurationMs: 1, probing: false, settled: true };
    for (const key of keys) (d.inside.health as { emit(e: string, k: string, f: unknown): boolean }).emit('change', key, fact);
    await new Promise((r) => setTimeout(r, 30));
    expect(snapshots()).toBe(before);
    await new Promise((r) => setTimeout(r, 150));
    expect(snapshots()).toBe(before + 1);
    d.daemon.health.stop();
  });
});

describe('IPIP routes: outer source and MTU', () => {
  it('takes the route\'s source (never a VIP) and its MTU per real into the snapshot', async () => {
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    // A stand-in ip: the interface lists the VIP first; 10.93.0.1's route has prefsrc 192.0.2.50
    // and mtu 1400 (a VPN underlay), 10.93.0.2's route names the VIP as its prefsrc.
    writeFileSync(
      join(bin, 'ip'),
      `#!/bin/sh
if [ "$2" = addr ]; then echo '[{"addr_info":[{"family":"inet","local":"10.99.0.100","scope":"global"},{"family":"inet","local":"192.0.2.2","scope":"global"}]}]'; exit 0; fi
while read -r _ _ a _; do
if [ "$a" = 10.93.0.1 ]; then echo '[{"dst":"'$a'","gateway":"192.0.2.13","dev":"eth0","prefsrc":"192.0.2.50","metrics":[{"mtu":1400}]}]'
else echo '[{"dst":"'$a'","gateway":"192.0.2.13","dev":"eth0","prefsrc":"10.99.0.100"}]'; fi
done
`,
    );
    chmodSync(join(bin, 'ip'), 0o755);
    const oldPath = process.env.PATH;
    process.env.PATH = `${bin}:${oldPath}`;
    try {
      const d = daemonRunning(configText({ tunnel: false }).replace('healthCheck: { type: none }', 'healthCheck: { type: none }\n    forwarding: ipip'));
      d.inside.neighbors = { setWanted: () => undefined, macOf: () => new Uint8Array(6) };
      await (d.inside.refreshTunnelRoutes as () => Promise<void>).call(d.daemon);
      const routes = d.inside.tunnelRoutes as Map<string, unknown>;
      expect(routes.get('10.93.0.1')).toEqual({ nextHop: '192.0.2.13', source: '192.0.2.50', mtu: 1400 });
      // A VIP as source is a martian on the real: the interface's first address that is no VIP instead.
      expect(routes.get('10.93.0.2')).toEqual({ nextHop: '192.0.2.13', source: '192.0.2.2', mtu: null });
      const snap = (d.sent.filter((m) => m.type === 'snapshot').at(-1) as unknown as { snapshot: ForwardingSnapshot }).snapshot;
      const ids = [...(d.inside.reals as Map<string, { address: string; id: number }>).values()].sort((a, b) => a.address.localeCompare(b.address)).map((r) => r.id);
      expect([snap.realTunnelMtu[ids[0]!], snap.realTunnelMtu[ids[1]!]]).toEqual([1400, 0]);
      const sourceOf = (id: number) => [...snap.realTunnelTemplates.subarray(id * TUNNEL_TEMPLATE_BYTES + 12, id * TUNNEL_TEMPLATE_BYTES + 16)].join('.');
      expect([sourceOf(ids[0]!), sourceOf(ids[1]!)]).toEqual(['192.0.2.50', '192.0.2.2']);
      d.daemon.health.stop();
    } finally {
      process.env.PATH = oldPath;
    }
  });
});

describe('IPIP next hops: a lookup that fails once', () => {
  it('keeps the next hop that worked (a route flap or a timeout must not cut the real off for 10 s)', async () => {
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    const flag = join(dir, 'fail');
    // A stand-in ip -j -force -batch -: each `route get A` line answers via 192.0.2.13, or fails
    // as ip does (its error, then the batch line) while the flag file exists.
    writeFileSync(
      join(bin, 'ip'),
      `#!/bin/sh\nn=0; rc=0\nwhile read -r line; do echo "$line" >> ${join(dir, 'asked')}; set -- $line; a=$3; n=$((n+1))\nif [ -e ${flag} ]; then echo 'RTNETLINK answers: Network is unreachable' >&2; echo "Command failed -:$n" >&2; rc=1\nelse echo '[{"dst":"'$a'","gateway":"192.0.2.13","dev":"eth0"}]'; fi\ndone\nexit $rc\n`,
    );
    chmodSync(join(bin, 'ip'), 0o755);
    const oldPath = process.env.PATH;
    process.env.PATH = `${bin}:${oldPath}`;
    try {
      const d = daemonRunning(configText().replace('healthCheck: { type: none }', 'healthCheck: { type: none }\n    forwarding: ipip'));
      const wanted: string[][] = [];
      d.inside.neighbors = { setWanted: (a: Iterable<string>) => void wanted.push([...a]), macOf: () => new Uint8Array(6) };
      const refresh = () => (d.inside.refreshTunnelRoutes as () => Promise<void>).call(d.daemon);
      await refresh();
      expect(wanted.at(-1)).toEqual(['192.0.2.13']);
      // Asked from the configured tunnel.sourceV4, where source-based policy routing keeps the route.
      expect(readFileSync(join(dir, 'asked'), 'utf8').split('\n').filter(Boolean).sort()).toEqual(['route get 10.93.0.1 from 10.93.255.1', 'route get 10.93.0.2 from 10.93.255.1']);
      writeFileSync(flag, '');
      await refresh();
      expect(wanted.at(-1)).toEqual(['192.0.2.13']);
      expect(d.logs.filter((l) => l.msg === 'no route to IPIP real')).toHaveLength(2); // once per real
      d.daemon.health.stop();
    } finally {
      process.env.PATH = oldPath;
    }
  });
});

describe('reload: a removed service\'s announcement while it drains', () => {
  it('keeps the VIP announced only if it was announced when removed: a withdrawn one stays withdrawn', async () => {
    const two = configText({ announce: true }) + `  - name: old
    vip: 10.99.0.200
    port: 80
    healthCheck: { type: none }
    reals: [{ address: 10.93.9.1 }]
`;
    for (const withdrawnBefore of [false, true]) {
      const d = daemonRunning(two);
      d.inside.announcer = { setFiles: () => undefined, isAnnounced: (vip: string) => vip === '10.99.0.200' && !withdrawnBefore, deviceOf: () => null, sync: async () => undefined };
      if (withdrawnBefore) d.inside.withdrawn = new Set(['tcp|10.99.0.200|80']);
      expect((await d.reload(configText({ announce: true }))).ok).toBe(true);
      // Its reals still hold flows (the harness gives every real one): it drains.
      const wanted = (d.inside.announceWanted as () => Map<string, boolean>).call(d.daemon);
      if (withdrawnBefore) expect(wanted.has('10.99.0.200'), 'withdrawn before its removal').toBe(false);
      else expect(wanted.get('10.99.0.200'), 'announced before its removal').toBe(true);
      d.daemon.health.stop();
    }
  });
});

describe('reload: a SIGHUP storm', () => {
  it('joins reloads asked for while one waits its turn: 50 SIGHUPs during a reload run one more, not 50', async () => {
    const d = daemonRunning(configText());
    const inside = d.inside as { host: { apply: (vips: string[]) => Promise<void> } };
    const plainApply = inside.host.apply;
    inside.host.apply = async (vips) => {
      await new Promise((r) => setTimeout(r, 50));
      await plainApply(vips);
    };
    const first = d.reload(configText({ reals: 3 }));
    await new Promise((r) => setTimeout(r, 10)); // the first reload is running (in its host change)
    const storm = Array.from({ length: 50 }, () => d.daemon.reload());
    const results = await Promise.all([first, ...storm]);
    expect(results.every((r) => r.ok)).toBe(true);
    expect(d.hostApplied).toHaveLength(2);
    // One asked for after those ran is a reload of its own.
    expect((await d.daemon.reload()).ok).toBe(true);
    expect(d.hostApplied).toHaveLength(3);
    d.daemon.health.stop();
  });
});

describe('reload: announcing off, then on again', () => {
  it('never runs two announcer syncs at once (the background announcing of reloads is chained)', async () => {
    const d = daemonRunning(configText({ announce: true }));
    let inFlight = 0;
    let maxInFlight = 0;
    const calls: string[] = [];
    d.inside.announcer = {
      setFiles: () => undefined,
      isAnnounced: () => false,
      withdrawAll: async () => undefined,
      close: () => undefined,
      // a birdc configure that takes 300 ms
      sync: async (wanted: Map<string, boolean>) => {
        calls.push(wanted.size === 0 ? 'sync(off)' : 'sync(on)');
        maxInFlight = Math.max(maxInFlight, ++inFlight);
        await new Promise((r) => setTimeout(r, 300));
        inFlight--;
      },
    };
    expect((await d.reload(configText({ announce: false }))).ok).toBe(true);
    expect((await d.reload(configText({ announce: true }))).ok).toBe(true);
    await new Promise((r) => setTimeout(r, 700));
    clearInterval(d.inside.announceTimer as NodeJS.Timeout);
    d.daemon.health.stop();
    expect(calls.slice(0, 2)).toEqual(['sync(off)', 'sync(on)']);
    expect(maxInFlight).toBe(1);
  });
});

describe('reload: announcing held up', () => {
  it('answers once the config is swapped, while a BIRD that does not answer still holds the announcement', async () => {
    const d = daemonRunning(configText({ announce: true }));
    let syncs = 0;
    d.inside.announcer = { sync: () => (syncs++, new Promise(() => undefined)), setFiles: () => undefined, isAnnounced: () => false };
    const answered = await Promise.race([d.reload(configText({ announce: true, reals: 3 })), new Promise((r) => setTimeout(() => r('no answer'), 2000))]);
    expect(answered).toEqual({ ok: true, problems: [], warnings: [] });
    expect(syncs).toBe(1);
    expect(d.daemon.config.services[0]!.reals).toHaveLength(3);
    d.daemon.health.stop();
  });
});

describe('reload: a stop queued behind it (SIGHUP, then SIGTERM)', () => {
  it('does not re-announce a VIP during the withdraw delay of a stop queued behind a reload, nor leave the 200 ms check running', async () => {
    const text = `interface: eth0
tunnel: { sourceV4: 10.93.255.1, sourceV6: "fd00::1" }
announce: { enabled: true, routesFile: ${dir}/routes.conf, withdrawDelay: 1s }
stateFile: ${dir}/state.json
services:
  - { name: web, vip: 10.99.0.100, port: 80, healthCheck: { type: none }, reals: [{ address: 10.93.0.1 }] }
`;
    const path = join(dir, 'dsrlb.yaml');
    const { daemon, inside } = stubbedDaemon(path, text, { activeFlows: 0 });
    const events: string[] = [];
    const t0 = Date.now();
    const carrier = new Map<string, boolean>();
    let final = false;
    inside.announcer = {
      setFiles: () => undefined,
      isAnnounced: (v: string) => carrier.get(v) === true,
      deviceOf: () => null,
      // as VipAnnouncer.sync: a routes-file write takes a few ms of I/O; nothing set up after withdrawAll
      sync: async (wanted: Map<string, boolean>) => {
        await new Promise((r) => setTimeout(r, 5));
        for (const [vip, want] of wanted) {
          const on = want && !final;
          if (carrier.get(vip) !== on) events.push(`${Date.now() - t0}ms ${on ? 'ANNOUNCE' : 'withdraw'} ${vip}`);
          carrier.set(vip, on);
        }
      },
      withdrawAll: async () => {
        final = true;
        for (const vip of carrier.keys()) carrier.set(vip, false);
        events.push(`${Date.now() - t0}ms withdrawAll`);
      },
      close: () => events.push(`${Date.now() - t0}ms close`),
    };
    (inside.loops as Record<string, unknown>).stop = async () => void events.push(`${Date.now() - t0}ms loops stopped`);
    (inside.neighbors as Record<string, unknown>).stop = () => undefined;
    inside.host = { ...(inside.host as object), undo: async () => undefined };
    (inside.syncReals as () => void).call(daemon);
    daemon.rebuild('start');
    await (inside.startAnnouncing as () => Promise<void>).call(daemon);
    inside.started = true;
    await new Promise((r) => setTimeout(r, 300));
    expect(carrier.get('10.99.0.100')).toBe(true);
    // SIGHUP, then SIGTERM while the reload runs (systemctl reload; systemctl stop)
    writeFileSync(path, text.replace('port: 80', 'port: 81'));
    const reload = daemon.reload();
    const stop = daemon.stop();
    await reload;
    await stop;
    const timerLeft = inside.announceTimer !== null;
    await new Promise((r) => setTimeout(r, 500));
    clearInterval(inside.announceTimer as NodeJS.Timeout);
    daemon.health.stop();
    const afterWithdraw = events.slice(events.findIndex((e) => e.endsWith('withdrawAll')));
    expect(afterWithdraw.filter((e) => e.includes('ANNOUNCE'))).toEqual([]);
    expect(timerLeft).toBe(false);
  });
});

describe('reload: the state file', () => {
  const saved = (name: string) => JSON.parse(readFileSync(join(dir, name), 'utf8')) as { intent: Record<string, { state: string }>; withdrawn: string[] };

  it('writes the intent in force to a new stateFile at once (a restart would otherwise start without it)', async () => {
    const d = daemonRunning(configText());
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    expect(saved('state.json').intent['tcp|10.99.0.100|80#10.93.0.1']).toMatchObject({ state: 'drain' });
    const result = await d.reload(configText({ state: 'moved.json' }));
    expect(result.ok).toBe(true);
    expect(saved('moved.json').intent['tcp|10.99.0.100|80#10.93.0.1']).toMatchObject({ state: 'drain' });
    d.daemon.health.stop();
  });

  it('refuses a reload that moves stateFile where it cannot be written while intent is in force, and changes nothing', async () => {
    const d = daemonRunning(configText());
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    const unwritable = join('no-such-dir', 'state.json');
    const result = await d.reload(configText({ state: unwritable }));
    expect(result).toMatchObject({ ok: false, refusedBy: 'system', problems: [{ path: 'stateFile', message: expect.stringMatching(/cannot be written .*: the operator intent in force \(drains, weights, withdrawals\) would be lost$/) }] });
    expect(d.daemon.config.stateFile).toBe(join(dir, 'state.json'));
    // The last step that can fail (nothing is left at the new path by an earlier refusal): the host change is rolled back.
    expect(d.hostApplied.at(-1)).toEqual(['10.99.0.100']);
    expect(existsSync(join(dir, 'no-such-dir'))).toBe(false);
    // Undrained back to what the config says: nothing left to lose, so it is taken.
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'active' });
    expect((await d.reload(configText({ state: unwritable }))).ok).toBe(true);
    d.daemon.health.stop();
    // No intent in force, nothing to lose: taken, with a warning (as at start).
    const fresh = daemonRunning(configText());
    const taken = await fresh.reload(configText({ state: unwritable }));
    expect(fresh.logs).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'the state file cannot be written: operator intent changes will be refused' }));
    // ... and in the reload's answer (dsrlb reload prints it) and in status, not only in the log.
    const problem = expect.stringMatching(/^the state file \S*\/no-such-dir\/state\.json cannot be written \(.*ENOENT.*\): drain, disable, weight and withdraw are refused, and flows are not kept across a restart$/);
    expect(taken).toEqual({ ok: true, problems: [], warnings: [problem] });
    expect(fresh.inside.stateFileProblem).toEqual(problem);
    expect((await fresh.reload(configText())).ok && fresh.inside.stateFileProblem).toBe(null);
    fresh.daemon.health.stop();
  });

  it('says in the reload\'s answer which operator intent the config file overrode', async () => {
    const d = daemonRunning(configText());
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    await d.daemon.setIntent('web', '10.93.0.2', { weight: 7 });
    const result = await d.reload(configText({ weight: 5 }));
    expect(result).toEqual({
      ok: true,
      problems: [],
      warnings: [
        'operator intent on web 10.93.0.1 (drain) dropped: the config file changed that real (now active, weight 5)',
        'operator intent on web 10.93.0.2 (weight 7) dropped: the config file changed that real (now active, weight 5)',
      ],
    });
    // Nothing left to drop: the next reload has nothing to say.
    expect(await d.reload(configText({ weight: 5 }))).toEqual({ ok: true, problems: [], warnings: [] });
    // A drained real the file then removes (the usual end of a drain): no warning, the intent goes quietly.
    await d.daemon.setIntent('web', '10.93.0.2', { state: 'drain' });
    expect(await d.reload(configText({ weight: 5, reals: 1 }))).toEqual({ ok: true, problems: [], warnings: [] });
    expect(d.logs).toContainEqual(expect.objectContaining({ msg: 'operator intent dropped: the config changed this real' }));
    // The service moved to another port: a disable there is gone, and the answer says so.
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'disabled' });
    expect(await d.reload(configText({ weight: 5, reals: 1, port: 8080 }))).toEqual({
      ok: true,
      problems: [],
      warnings: ['operator intent on tcp://10.99.0.100:80 10.93.0.1 (disabled) dropped: the config file has no service there any more (one moved to another VIP, port or protocol is a new service)'],
    });
    d.daemon.health.stop();
  });

  it('drops a withdrawal when its service leaves the config, so a later service of that name starts announced', async () => {
    const d = daemonRunning(configText({ announce: true }));
    d.inside.announcer = { sync: async () => undefined, setFiles: () => undefined, isAnnounced: () => false };
    expect(await d.daemon.setAnnounce('web', false)).toMatchObject({ announce: false, unchanged: false });
    expect(saved('state.json').withdrawn).toEqual(['tcp|10.99.0.100|80']);
    // Again: nothing to change, said so (the CLI prints "withdrawn already (no change)"), not logged again.
    const logged = d.logs.filter((l) => l.msg === 'operator: withdraw').length;
    expect(await d.daemon.setAnnounce('web', false)).toMatchObject({ announce: false, unchanged: true });
    expect(d.logs.filter((l) => l.msg === 'operator: withdraw')).toHaveLength(logged);
    // Port 81: another service (identity) under the same name; web on port 80 is gone.
    const result = await d.reload(configText({ announce: true, port: 81 }));
    expect(result.ok).toBe(true);
    expect(saved('state.json').withdrawn).toEqual([]);
    expect(d.logs).toContainEqual(expect.objectContaining({ msg: 'withdrawal dropped: the service left the config' }));
    expect(existsSync(join(dir, 'state.json.tmp'))).toBe(false);
    await (d.inside.stopAnnouncing as () => Promise<void>).call(d.daemon);
    d.daemon.health.stop();
  });
});

describe('reload: a service removed and added back', () => {
  it('settles again: its settled mark and first-seen time go with it (before, it came back settled and was announced while its reals were unproven)', async () => {
    const d = daemonRunning(configText({ port: 80 }));
    const settled = d.inside.settledServices as Set<string>;
    const firstSeen = d.inside.firstSeenMs as Map<string, number>;
    expect(settled.has('tcp|10.99.0.100|80')).toBe(true); // type none: settled at the first rebuild
    expect((await d.reload(configText({ port: 81 }))).ok).toBe(true);
    expect([...settled]).toEqual(['tcp|10.99.0.100|81']);
    expect([...firstSeen.keys()]).toEqual(['tcp|10.99.0.100|81']);
    d.daemon.health.stop();
  });
});

describe('stop: an announcer sync stuck on birdc', () => {
  it('withdraws at once and does not wait for it (before: up to 10 s a birdc call, then the loops\' stop, past TimeoutStopSec)', async () => {
    const d = daemonRunning(configText({ announce: true }));
    const events: string[] = [];
    const t0 = Date.now();
    d.inside.announcer = {
      setFiles: () => undefined,
      isAnnounced: () => true,
      deviceOf: () => null,
      sync: () => new Promise(() => undefined), // birdc that never answers
      withdrawAll: async () => void events.push(`withdrawAll ${Date.now() - t0}`),
      close: () => void events.push('close'),
    };
    startedForStop(d.inside, { stop: async () => void events.push('loops stopped') });
    void (d.inside.syncAnnouncements as () => Promise<void>).call(d.daemon); // in flight, never ends
    expect(d.inside.announceBusy).toBe(true);
    await d.daemon.stop();
    const took = Date.now() - t0;
    expect(events[0]).toMatch(/^withdrawAll \d+$/);
    expect(Number(events[0]!.split(' ')[1])).toBeLessThan(1000); // at once, not after the stuck sync
    expect(events.slice(1)).toEqual(['loops stopped', 'close']);
    // withdrawDelay (300 ms default) + at most 1 s for the sync in flight (before: never done).
    expect(took).toBeLessThan(5000);
    d.daemon.health.stop();
  });
});

describe('operator intent asked for again', () => {
  it('a repeated drain (or a weight set to what it is) changes, saves and logs nothing, and answers before = after', async () => {
    const d = daemonRunning(configText());
    const first = await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    expect([first.before.state, first.after.state]).toEqual(['active', 'drain']);
    const snapshots = d.sent.filter((m) => m.type === 'snapshot').length;
    const saved = readFileSync(join(dir, 'state.json'), 'utf8');
    const again = await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    expect(again.before).toEqual(again.after);
    const sameWeight = await d.daemon.setIntent('web', '10.93.0.1', { weight: 1 });
    expect(sameWeight.before).toEqual(sameWeight.after);
    // Before: "intent changed" with identical before and after, a state-file write and a rebuild each time.
    expect(d.logs.filter((l) => l.msg === 'intent changed')).toHaveLength(1);
    expect(d.sent.filter((m) => m.type === 'snapshot')).toHaveLength(snapshots);
    expect(readFileSync(join(dir, 'state.json'), 'utf8')).toBe(saved);
    d.daemon.health.stop();
  });
});

describe('a drain of a disabled real', () => {
  it('leaves it disabled and says why, so that an undrain after it (a deploy script) neither lifts another operator\'s disable nor fails', async () => {
    const d = daemonRunning(configText());
    await d.daemon.setIntent('web', '10.93.0.1', { state: 'disabled' });
    const saved = readFileSync(join(dir, 'state.json'), 'utf8');
    const drained = await d.daemon.setIntent('web', '10.93.0.1', { state: 'drain' });
    expect(drained).toEqual({
      service: 'web',
      real: '10.93.0.1',
      before: { state: 'disabled', weight: 1 },
      after: { state: 'disabled', weight: 1 },
      note: 'disabled takes no flows at all, new ones included: left disabled; enable lifts it',
    });
    expect(readFileSync(join(dir, 'state.json'), 'utf8')).toBe(saved);
    // The script's undrain leaves the disable and says so (exit 0 in the CLI: a set -e script
    // does not fail at its end); nothing is saved.
    const undrained = await d.daemon.setIntent('web', '10.93.0.1', { state: 'active', from: 'drain' });
    expect(undrained.after).toEqual({ state: 'disabled', weight: 1 });
    expect(undrained.note).toBe('undrain lifts only a drain: left disabled; enable lifts it');
    expect(readFileSync(join(dir, 'state.json'), 'utf8')).toBe(saved);
    // A disable of a draining real still makes it disabled (stricter).
    await d.daemon.setIntent('web', '10.93.0.2', { state: 'drain' });
    expect((await d.daemon.setIntent('web', '10.93.0.2', { state: 'disabled' })).after.state).toBe('disabled');
    d.daemon.health.stop();
  });
});

describe('stop: a stalled packet loop', () => {
  it('waits at most 10 s for its flows, so the whole stop stays under the unit\'s TimeoutStopSec (past it, SIGKILL skipped the host undo)', async () => {
    const d = daemonRunning(configText());
    const asked: number[] = [];
    startedForStop(d.inside, {
      size: 1,
      // As LoopGroup.ask: rejects after timeoutMs when a loop does not answer; here at once, noting the bound.
      ask: async (_make: unknown, timeoutMs: number) => {
        asked.push(timeoutMs);
        throw new Error(`1 of 1 packet loops did not answer within ${timeoutMs / 1000} s`);
      },
    });
    await d.daemon.stop();
    expect(asked).toEqual([10_000]);
    const unit = readFileSync(join(import.meta.dirname, '../../deploy/linux/dsrlb.service'), 'utf8');
    const stopSec = Number(/^TimeoutStopSec=(\d+)s$/m.exec(unit)![1]);
    // withdraw delay (default 300 ms) + a sync in flight (1 s) + the flows (10 s) + the loops' stop (10 s).
    expect(0.3 + 1 + 10 + 10).toBeLessThan(stopSec);
    d.daemon.health.stop();
  });
});

describe('stop after a packet loop was lost for good (exit 2)', () => {
  it('keeps the lost loop\'s flows in the flows file (before: none, with one loop; its share missing with several)', async () => {
    const d = daemonRunning(configText());
    const real = [...(d.inside.reals as Map<string, { id: number; address: string }>).values()][0]!;
    const keys = new Uint32Array(FLOW_KEY_WORDS).fill(7);
    startedForStop(d.inside, {
      size: 0,
      orphanFlows: () => ({ count: 1, keys, reals: Int32Array.of(real.id), states: Uint8Array.of(2), idleMs: Float64Array.of(1500) }),
      ask: async () => {
        throw new Error('no loop to ask');
      },
    });
    await d.daemon.stop();
    const saved = decodeSavedFlows(readFileSync(join(dir, 'state.json.flows')));
    expect(saved.count).toBe(1);
    expect(saved.reals[saved.realIndex[0]!]).toEqual({ identity: 'tcp|10.99.0.100|80', address: real.address, removed: { forwarding: 'l2' } });
    expect([...saved.keys]).toEqual([...keys]);
    d.daemon.health.stop();
  });
});

describe('stop: the flows file names what was announced', () => {
  it('as before the stop withdrew every VIP, so a start whose config no longer names a service announces it as it was while it drains', async () => {
    const d = daemonRunning(configText({ announce: true }));
    const real = [...(d.inside.reals as Map<string, { id: number }>).values()][0]!;
    let up = true;
    d.inside.announcer = {
      isAnnounced: () => up,
      withdrawAll: async () => void (up = false),
      close: () => undefined,
      sync: async () => undefined,
      setFiles: () => undefined,
    };
    startedForStop(d.inside, {
      size: 1,
      ask: async () => [{ type: 'flows', id: 1, count: 1, keys: new Uint32Array(FLOW_KEY_WORDS), reals: Int32Array.of(real.id), states: Uint8Array.of(2), idleMs: Float64Array.of(0) }],
    });
    await d.daemon.stop();
    const saved = decodeSavedFlows(readFileSync(join(dir, 'state.json.flows')));
    expect(saved.removedServices?.map((s) => [s.config.name, s.announced])).toEqual([['web', true]]);
    // This boot and its monotonic time: the next start in it measures the downtime on that clock.
    expect(saved.boot?.id).toBe(bootId());
    d.daemon.health.stop();
  });
});
