// What a clean stop writes for the reals and services whose flows it keeps (those a reload removed
// that still drain among them), and how the next start takes back one its config does not name:
// removed and draining, as a reload of that config would have left it, unless its config names it
// again (then simply configured) or no longer lets a removed service drain. No root, no loop.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { decodeSavedFlows, encodeSavedFlows, type SavedFlows, type SavedReal } from '../../src/control/flows-file.js';
import type { Daemon } from '../../src/control/daemon.js';
import { stubbedDaemon } from '../support/stubbed-daemon.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'dsrlb-removed-restart-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const WEB = 'tcp|10.99.0.100|80';
const API = 'tcp|10.99.0.101|80';

/** web (10.99.0.100) with `web` reals; api (10.99.0.101, one real) unless null; `extra` services after. */
function configText(web: readonly string[], api: string | null, extra = ''): string {
  const service = (name: string, vip: string, reals: readonly string[]) => `  - name: ${name}\n    vip: ${vip}\n    port: 80\n    healthCheck: { type: none }\n    reals: [${reals.map((a) => `{ address: ${a} }`).join(', ')}]\n`;
  return `interface: eth0
tunnel: { sourceV4: 10.93.255.1 }
stateFile: ${join(dir, 'state.json')}
services:
${service('web', '10.99.0.100', web)}${api === null ? '' : service('api', '10.99.0.101', [api])}${extra}`;
}

function daemonWith(text: string) {
  const path = join(dir, 'dsrlb.yaml');
  const logs: { msg: string }[] = [];
  // Every real holds a flow: removed ones drain.
  const { daemon, inside } = stubbedDaemon(path, text, { activeFlows: 1, log: (l) => logs.push(JSON.parse(l) as { msg: string }) });
  (inside.syncReals as () => void).call(daemon);
  daemon.rebuild('start');
  const reload = (next: string) => {
    writeFileSync(path, next);
    return daemon.reload();
  };
  return { daemon, inside, reload, logs };
}

const realsOf = (d: Daemon) => d.planReals().map((r) => `${r.service} ${r.address}${r.removed ? ' removed' : ''}`).sort();

/** What saveFlows would write for one flow per real in `reals`, read back as the next start reads it. */
function savedBy(inside: Record<string, unknown>, daemon: Daemon, reals: SavedReal[]): SavedFlows {
  const kept = (inside.removedToSave as (r: SavedReal[]) => Pick<SavedFlows, 'reals' | 'removedServices'>).call(daemon, reals);
  const count = reals.length;
  return decodeSavedFlows(encodeSavedFlows({ writtenAtMs: 0, count, keys: new Uint32Array(count * 10), realIndex: Int32Array.from(reals.keys()), idleMs: new Uint32Array(count), states: new Uint8Array(count).fill(2), ...kept }));
}

const allReals: SavedReal[] = [
  { identity: WEB, address: '10.93.0.1' },
  { identity: WEB, address: '10.93.0.2' },
  { identity: API, address: '10.93.0.3' },
];

describe('removed reals and services across a clean restart', () => {
  it('writes a removed real with its forwarding and a removed service whole; the next start drains them again', async () => {
    const before = daemonWith(configText(['10.93.0.1', '10.93.0.2'], '10.93.0.3'));
    expect((await before.reload(configText(['10.93.0.1'], null))).ok).toBe(true);
    // api's VIP was announced when the reload removed it: its route stays while it drains.
    (before.inside.drainAnnounced as Set<string>).add(API);
    const saved = savedBy(before.inside, before.daemon, allReals);
    // Every real with the way its flows went, every service with flows as configured: a start whose
    // config no longer names one drains it.
    expect(saved.reals).toEqual(allReals.map((r) => ({ ...r, removed: { forwarding: 'l2' } })));
    expect(saved.removedServices?.map((s) => [s.config.name, s.announced])).toEqual([['api', true], ['web', false]]);

    const after = daemonWith(configText(['10.93.0.1'], null));
    (after.inside.restoreRemoved as (s: SavedFlows) => unknown).call(after.daemon, saved);
    after.daemon.rebuild('start');
    // As the daemon before showed them after its reload.
    expect(realsOf(after.daemon)).toEqual(realsOf(before.daemon));
    expect(realsOf(after.daemon)).toEqual(['api 10.93.0.3 removed', 'web 10.93.0.1', 'web 10.93.0.2 removed']);
    const views = (after.inside.serviceViews as () => { config: { name: string }; removed: boolean }[]).call(after.daemon);
    expect(views.map((v) => [v.config.name, v.removed])).toEqual([['web', false], ['api', true]]);
    // Announced as the daemon before announced it while it drained.
    expect((after.inside.announceWanted as () => Map<string, boolean>).call(after.daemon).get('10.99.0.101')).toBe(true);
    // Stopped again, it writes them again: the next start after that drains them too.
    expect(savedBy(after.inside, after.daemon, allReals)).toEqual(saved);
  });

  it('drains what an edit of the config before the restart removed, as a reload of that edit would (before: its flows were cut)', async () => {
    // No reload: the file is edited and the daemon restarted (as a restart-only key makes it).
    const before = daemonWith(configText(['10.93.0.1', '10.93.0.2'], '10.93.0.3'));
    before.inside.announcer = { isAnnounced: () => true };
    const saved = savedBy(before.inside, before.daemon, allReals);
    const after = daemonWith(configText(['10.93.0.1'], null));
    (after.inside.restoreRemoved as (s: SavedFlows) => unknown).call(after.daemon, saved);
    after.daemon.rebuild('start');
    expect(realsOf(after.daemon)).toEqual(['api 10.93.0.3 removed', 'web 10.93.0.1', 'web 10.93.0.2 removed']);
    // api's VIP was announced at the stop: it stays announced while api drains, as after a reload.
    expect((after.inside.announceWanted as () => Map<string, boolean>).call(after.daemon).get('10.99.0.101')).toBe(true);
  });

  it('configures again what the new config names, and leaves out a removed service the new config would cut', async () => {
    const before = daemonWith(configText(['10.93.0.1', '10.93.0.2'], '10.93.0.3'));
    expect((await before.reload(configText(['10.93.0.1'], null))).ok).toBe(true);
    const saved = savedBy(before.inside, before.daemon, allReals);
    // web's 10.93.0.2 is back; api's name now belongs to another service (a reload would cut api's flows).
    const after = daemonWith(configText(['10.93.0.1', '10.93.0.2'], null, '  - name: api\n    vip: 10.99.0.102\n    port: 80\n    reals: [{ address: 10.93.0.4 }]\n'));
    (after.inside.restoreRemoved as (s: SavedFlows) => unknown).call(after.daemon, saved);
    after.daemon.rebuild('start');
    expect(realsOf(after.daemon)).toEqual(['api 10.93.0.4', 'web 10.93.0.1', 'web 10.93.0.2']);
    expect(after.logs.some((l) => l.msg === 'service removed before the restart: its flows are cut')).toBe(true);
  });

  it('takes back no real that was configured when the daemon before stopped (a version 1 file: none marked removed)', () => {
    const after = daemonWith(configText(['10.93.0.1'], null));
    const saved = decodeSavedFlows(encodeSavedFlows({ writtenAtMs: 0, count: 3, keys: new Uint32Array(30), realIndex: Int32Array.from([0, 1, 2]), idleMs: new Uint32Array(3), states: new Uint8Array(3).fill(2), reals: allReals }));
    (after.inside.restoreRemoved as (s: SavedFlows) => unknown).call(after.daemon, saved);
    after.daemon.rebuild('start');
    expect(realsOf(after.daemon)).toEqual(['web 10.93.0.1']);
  });
});
