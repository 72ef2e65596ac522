// HostSetup with a recording command runner: what a clean stop undoes (everything, adopted state
// too) and what a failed start undoes (only what its own process added).

import { mkdtemp, readFile, readdir, writeFile } from 'node:fs/promises';
import { statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HostSetup, parseOffloads, type CommandRunner } from '../../src/control/host-setup.js';
import { createLogger } from '../../src/control/logger.js';

function fakeHost(onLo: string[], offloads = ETHTOOL_K) {
  const calls: string[] = [];
  const lo = new Set(onLo);
  const runner: CommandRunner = async (argv, stdin) => {
    calls.push(argv.join(' ') + (stdin ? ` <<${stdin.match(/daddr \{ ([^}]*) \}/)?.[1] ?? ''}` : ''));
    if (argv[0] === 'ethtool' && argv[1] === '-k') return { stdout: offloads };
    if (argv[1] === '-j') {
      const info = argv[5] === 'lo' ? [...lo].map((c) => ({ local: c.split('/')[0], prefixlen: Number(c.split('/')[1]) })) : [];
      return { stdout: JSON.stringify([{ addr_info: info }]) };
    }
    if (argv[1] === 'addr' && argv[2] === 'add') lo.add(argv[3]!);
    if (argv[1] === 'addr' && argv[2] === 'del') lo.delete(argv[3]!);
    return { stdout: '' };
  };
  return { calls, lo, runner };
}

const quiet = createLogger(() => undefined);

/** `ethtool -k` of a NIC (trimmed), GRO on and LRO settable. */
const ETHTOOL_K = `Features for eth0:
rx-checksumming: on
tx-checksumming: on
generic-segmentation-offload: on
generic-receive-offload: on
large-receive-offload: off
rx-vlan-offload: on [fixed]
`;

async function runDir(prev: object | null): Promise<{ dir: string; file: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'dsrlb-host-'));
  const file = join(dir, `host-${statSync('/proc/self/ns/net').ino}-eth0.json`);
  if (prev) await writeFile(file, JSON.stringify(prev));
  return { dir, file };
}

describe('HostSetup', () => {
  it('after a failed start removes only the VIPs its own process added and keeps the adopted record', async () => {
    const { dir, file } = await runDir({ interface: 'eth0', addedAddresses: ['198.51.100.1/32'], groDisabled: false });
    const host = fakeHost(['198.51.100.1/32']);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    expect([...host.lo].sort()).toEqual(['198.51.100.1/32', '198.51.100.2/32']);
    host.calls.length = 0;
    await setup.undoOwn();
    expect([...host.lo]).toEqual(['198.51.100.1/32']);
    expect(host.calls).toContain('ip addr del 198.51.100.2/32 dev lo');
    expect(host.calls).not.toContain('ip addr del 198.51.100.1/32 dev lo');
    // The predecessor's table stays, dropping its VIP only.
    expect(host.calls).toContain('nft -f - <<198.51.100.1');
    expect(host.calls.some((c) => c.startsWith('nft delete'))).toBe(false);
    expect(JSON.parse(await readFile(file, 'utf8')).addedAddresses).toEqual(['198.51.100.1/32']);
  });

  it('after a failed start with nothing adopted leaves no VIP, no table and no record', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.2'], { disableGro: false });
    await setup.undoOwn();
    expect([...host.lo]).toEqual([]);
    expect(host.calls).toContain('nft delete table inet dsrlb');
    expect(await readdir(dir)).toEqual([]);
  });

  it('on a clean stop undoes everything it recorded, adopted VIPs too', async () => {
    const { dir } = await runDir({ interface: 'eth0', addedAddresses: ['198.51.100.1/32'], groDisabled: false });
    const host = fakeHost(['198.51.100.1/32']);
    const setup = new HostSetup('eth0', quiet, host.runner, dir);
    await setup.adopt();
    await setup.apply(['198.51.100.1', '198.51.100.2'], { disableGro: false });
    await setup.undo();
    expect([...host.lo]).toEqual([]);
    expect(await readdir(dir)).toEqual([]);
  });

  it('turns GRO/LRO off for io: pcap and puts back, on stop, exactly what was on before', async () => {
    for (const [name, text, off, on] of [
      ['GRO on, LRO off', ETHTOOL_K, 'ethtool -K eth0 gro off', 'ethtool -K eth0 gro on'],
      ['both on', ETHTOOL_K.replace('large-receive-offload: off', 'large-receive-offload: on'), 'ethtool -K eth0 gro off lro off', 'ethtool -K eth0 gro on lro on'],
      ['GRO off, LRO fixed (veth)', 'generic-receive-offload: off\nlarge-receive-offload: off [fixed]\n', null, null],
    ] as const) {
      const { dir } = await runDir(null);
      const host = fakeHost([], text);
      const setup = new HostSetup('eth0', quiet, host.runner, dir);
      await setup.adopt();
      await setup.apply(['198.51.100.2'], { disableGro: true });
      const set = host.calls.filter((c) => c.startsWith('ethtool -K'));
      expect(set, name).toEqual(off ? [off] : []);
      host.calls.length = 0;
      await setup.undo();
      expect(host.calls.filter((c) => c.startsWith('ethtool -K')), name).toEqual(on ? [on] : []);
    }
  });

  it('restores GRO from an adopted record of a crashed run, older records (no offloads recorded) meaning GRO on', async () => {
    for (const [prev, on] of [
      [{ interface: 'eth0', addedAddresses: [], groDisabled: true }, ['ethtool -K eth0 gro on']],
      [{ interface: 'eth0', addedAddresses: [], groDisabled: true, offloadsBefore: { gro: false, lro: true } }, ['ethtool -K eth0 lro on']],
    ] as const) {
      const { dir } = await runDir(prev);
      const host = fakeHost([], 'generic-receive-offload: off\nlarge-receive-offload: off\n');
      const setup = new HostSetup('eth0', quiet, host.runner, dir);
      await setup.adopt();
      await setup.apply([], { disableGro: true });
      await setup.undo();
      expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(on);
    }
  });

  it('turns GRO/LRO off anyway when ethtool -k fails, says so, and puts GRO back at stop', async () => {
    const { dir } = await runDir(null);
    const host = fakeHost([]);
    const runner: CommandRunner = async (argv, stdin) => {
      if (argv[0] === 'ethtool' && argv[1] === '-k') throw new Error('ethtool: no such device');
      return host.runner(argv, stdin);
    };
    const lines: string[] = [];
    const setup = new HostSetup('eth0', createLogger((l) => lines.push(l)), runner, dir);
    await setup.adopt();
    await setup.apply([], { disableGro: true });
    expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(['ethtool -K eth0 gro off lro off']);
    expect(lines.some((l) => l.includes('could not read GRO/LRO'))).toBe(true);
    host.calls.length = 0;
    await setup.undo();
    expect(host.calls.filter((c) => c.startsWith('ethtool -K'))).toEqual(['ethtool -K eth0 gro on']);
  });

  it('reads GRO and LRO from ethtool -k, a [fixed] feature as not ours to set', () => {
    expect(parseOffloads(ETHTOOL_K)).toEqual({ gro: true, lro: false });
    expect(parseOffloads('generic-receive-offload: off\nlarge-receive-offload: off [fixed]\n')).toEqual({ gro: false, lro: null });
    expect(parseOffloads('')).toEqual({ gro: null, lro: null });
  });
});
