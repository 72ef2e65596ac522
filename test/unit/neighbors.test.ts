import { createSocket } from 'node:dgram';
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/control/logger.js';
import { NeighborWatcher, REVALIDATE_MS, parseProcArp } from '../../src/control/neighbors.js';

const ARP = `IP address       HW type     Flags       HW address            Mask     Device
10.77.0.11       0x1         0x2         02:aa:00:00:00:11     *        eth0
10.77.0.12       0x1         0x0         00:00:00:00:00:00     *        eth0
10.77.0.13       0x1         0x6         02:AA:00:00:00:13     *        eth0
10.77.0.14       0x1         0x2         02:aa:00:00:00:14     *        eth1
`;

describe('parseProcArp', () => {
  it('keeps complete and permanent entries of the interface, drops incomplete ones and other interfaces', () => {
    expect(parseProcArp(ARP, 'eth0')).toEqual([
      { dst: '10.77.0.11', lladdr: '02:aa:00:00:00:11', state: ['REACHABLE'] },
      { dst: '10.77.0.13', lladdr: '02:AA:00:00:00:13', state: ['PERMANENT'] },
    ]);
    expect(parseProcArp(ARP, 'eth1').map((e) => e.dst)).toEqual(['10.77.0.14']);
    expect(parseProcArp('IP address HW type Flags HW address Mask Device\n', 'eth0')).toEqual([]);
  });
});

describe('NeighborWatcher', () => {
  // Loopback addresses: the datagrams that make the kernel resolve a real go nowhere.
  const table = `IP address       HW type     Flags       HW address            Mask     Device
127.0.0.11       0x1         0x2         02:aa:00:00:00:11     *        eth0
`;
  function watcher() {
    let now = 1_000_000;
    const w = new NeighborWatcher('eth0', createLogger(() => undefined), async () => ({ stdout: '[]', stderr: '' }), async () => table, () => now);
    return { w, advance: (ms: number) => (now += ms) };
  }

  it('revalidates a real that has an entry every 30 s (a STALE entry is probed only when something is sent), and kicks an unresolved one every second', async () => {
    const { w, advance } = watcher();
    w.setWanted(['127.0.0.11', '127.0.0.12']);
    await w.refresh();
    expect(w.kicks).toBe(2); // both at once: one to resolve, one to revalidate
    advance(1_500);
    await w.refresh();
    expect(w.kicks).toBe(3); // only the unresolved one
    advance(REVALIDATE_MS);
    await w.refresh();
    expect(w.kicks).toBe(5);
  });

  it('sends its datagrams from one socket per family, closed by stop() (a socket each was 8,000 binds a second at 8,000 unresolved reals)', async () => {
    // Port 9 on a loopback address of the test's own: needs root, as the daemon does.
    const sink = createSocket('udp4');
    sink.bind(9, '127.0.0.31');
    await once(sink, 'listening');
    const ports: number[] = [];
    sink.on('message', (_m, rinfo) => ports.push(rinfo.port));
    const { w, advance } = watcher();
    try {
      w.setWanted(['127.0.0.31']);
      for (let i = 0; i < 3; i++) {
        await w.refresh();
        advance(1_500);
      }
      for (let waited = 0; ports.length < 3 && waited < 2000; waited += 10) await new Promise((r) => setTimeout(r, 10));
      expect(ports).toHaveLength(3);
      expect(new Set(ports).size).toBe(1);
    } finally {
      w.stop();
      sink.close();
    }
  });

  it('schedules and sends nothing after stop() when a refresh was still running', async () => {
    let release!: (text: string) => void;
    const w = new NeighborWatcher('eth0', createLogger(() => undefined), async () => ({ stdout: '[]', stderr: '' }), () => new Promise<string>((r) => (release = r)));
    w.setWanted(['127.0.0.41']);
    w.start();
    w.stop();
    release('IP address HW type Flags HW address Mask Device\n');
    await new Promise((r) => setTimeout(r, 20));
    expect(w.kicks).toBe(0);
    expect((w as unknown as { timer: unknown }).timer).toBe(null);
  });

  it('polls an unresolved real every 250 ms for 10 s after it is wanted, then every 2 s; a resolved set every 2 s', async () => {
    const { w, advance } = watcher();
    w.setWanted(['127.0.0.11']);
    await w.refresh();
    expect(w.nextPollMs()).toBe(2000);
    w.setWanted(['127.0.0.11', 'fd00::99']); // an IPv6 real that never answers: `ip -6 neigh` each poll
    expect(w.nextPollMs()).toBe(250);
    advance(10_001);
    expect(w.nextPollMs()).toBe(2000);
  });
});
