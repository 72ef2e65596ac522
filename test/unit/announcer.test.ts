// The BIRD side of scale-out announcements: device names every LB agrees on, the routes file, and
// an announcer that keeps going when one VIP, the file or birdc fails (fake TUN devices, no root).

import { existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { announceDeviceName, birdRoutes, VipAnnouncer, writeRoutesFile, type TunControl } from '../../src/control/announcer.js';
import { commandRunner, systemRunner, type CommandRunner } from '../../src/control/host-setup.js';
import { createLogger } from '../../src/control/logger.js';

describe('VIP announcement for BIRD', () => {
  it('names each VIP a stable TUN device that fits IFNAMSIZ', () => {
    expect(announceDeviceName('10.77.0.100')).toBe('dsv481be04e');
    expect(announceDeviceName('10.77.0.100')).toBe(announceDeviceName('10.77.0.100'));
    expect(announceDeviceName('10.77.0.101')).not.toBe(announceDeviceName('10.77.0.100'));
    for (const v of ['10.0.0.1', '2001:db8::1', 'fd77::100']) expect(announceDeviceName(v).length).toBeLessThanOrEqual(15);
  });

  it('writes one static protocol per family with check link on and a device route per VIP', () => {
    const text = birdRoutes(['10.77.0.100', 'fd77::100']);
    expect(text).toContain('protocol static dsrlb_v4 {\n  ipv4;\n  check link on;\n  route 10.77.0.100/32 via "dsv481be04e";\n}');
    expect(text).toContain(`protocol static dsrlb_v6 {\n  ipv6;\n  check link on;\n  route fd77::100/128 via "${announceDeviceName('fd77::100')}";\n}`);
    // No VIP of a family still gives a valid (empty) protocol, so the BIRD config keeps parsing.
    expect(birdRoutes([])).toContain('protocol static dsrlb_v6 {\n  ipv6;\n  check link on;\n}');
  });

  it('writes the routes file world-readable under the unit\'s UMask=0027, and only when it changes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-routes-'));
    const old = process.umask(0o027);
    try {
      const file = join(dir, 'run', 'bird-routes.conf');
      const text = birdRoutes(['10.77.0.100']);
      expect(await writeRoutesFile(file, text)).toBe(true);
      expect(readFileSync(file, 'utf8')).toBe(text);
      // BIRD parses it as user bird: 0640 (what the umask alone gives) would be refused.
      expect(statSync(file).mode & 0o777).toBe(0o644);
      expect(statSync(join(dir, 'run')).mode & 0o777).toBe(0o755);
      expect(await writeRoutesFile(file, text)).toBe(false);
      expect(await writeRoutesFile(file, birdRoutes([]))).toBe(true);
      expect(statSync(file).mode & 0o777).toBe(0o644);
    } finally {
      process.umask(old);
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('writes through no symlink planted in its directory (the service user\'s, written by root runs too): the links\' target keeps its text and mode', async () => {
    const dir = mkdtempSync('/tmp/dsrlb-test-routes-');
    try {
      const victim = join(dir, 'victim');
      writeFileSync(victim, 'root:x:0:0\n', { mode: 0o600 });
      const file = join(dir, 'bird-routes.conf');
      symlinkSync(victim, `${file}.tmp`);
      symlinkSync(victim, file);
      const text = birdRoutes(['10.77.0.100']);
      expect(await writeRoutesFile(file, text)).toBe(true);
      expect(readFileSync(victim, 'utf8')).toBe('root:x:0:0\n');
      expect(statSync(victim).mode & 0o777).toBe(0o600);
      // The link at the file itself is replaced by the file, 0644 for BIRD; nothing is left aside.
      expect(lstatSync(file).isFile()).toBe(true);
      expect(lstatSync(file).mode & 0o777).toBe(0o644);
      expect(readFileSync(file, 'utf8')).toBe(text);
      expect(readdirSync(dir).sort()).toEqual(['bird-routes.conf', 'bird-routes.conf.tmp', 'victim']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** `birdc show protocols` of a BIRD 2.0.12 that includes dsrlb's routes file. */
const BIRD_PROTOCOLS = `BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     05:20:01.000
dsrlb_v4   Static     master4    up     05:20:01.000
dsrlb_v6   Static     master6    up     05:20:01.000
upstream   BGP        ---        up     05:20:03.000  Established
`;

/** Fake TUN devices: which fds are open, each one up (IFF_UP) or down; new ones are down, as a new TUN is. */
function fakeTun() {
  const open = new Map<number, { name: string; up: boolean }>();
  let next = 100;
  const tun: TunControl = {
    open: (name) => {
      const fd = next++;
      open.set(fd, { name, up: false });
      return { name, fd };
    },
    setUp: (name, up) => {
      const d = [...open.values()].find((x) => x.name === name);
      if (!d) throw new Error('ENODEV');
      d.up = up;
    },
    close: (fd) => void open.delete(fd),
  };
  const upOf = (vip: string): boolean | undefined => [...open.values()].find((d) => d.name === announceDeviceName(vip))?.up;
  return { tun, open, upOf };
}

function logLines() {
  const lines: { level: string; msg: string; what?: string }[] = [];
  return { lines, log: createLogger((l) => lines.push(JSON.parse(l) as { level: string; msg: string })) };
}

describe('VIP announcer: one failure stops nothing else', () => {
  it('a VIP whose device cannot be made is left out and the others announce; it joins once it can', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      const file = join(dir, 'routes.conf');
      const bad = announceDeviceName('10.77.0.2');
      let ipWorks = false;
      const t = fakeTun();
      // A device of that name held by someone else (TUNSETIFF: EBUSY), until it is not.
      const tun: TunControl = {
        ...t.tun,
        open: (name) => {
          if (name === bad && !ipWorks) throw new Error('ioctl(TUNSETIFF) on ' + name + ': Device or resource busy (EBUSY)');
          return t.tun.open(name);
        },
      };
      const { lines, log } = logLines();
      const a = new VipAnnouncer(log, file, null, async () => ({ stdout: '' }), tun);
      const wanted = new Map([
        ['10.77.0.1', true],
        ['10.77.0.2', true],
      ]);
      for (let i = 0; i < 3; i++) await a.sync(wanted);
      expect(a.isAnnounced('10.77.0.1')).toBe(true);
      expect(t.upOf('10.77.0.1')).toBe(true);
      expect(a.isAnnounced('10.77.0.2')).toBe(false);
      expect(t.open.size).toBe(1);
      expect(readFileSync(file, 'utf8')).toBe(birdRoutes(['10.77.0.1']));
      // Said once, not every 200 ms.
      expect(lines.filter((l) => l.msg === 'announcement update failed')).toHaveLength(1);
      ipWorks = true;
      await a.sync(wanted);
      expect(a.isAnnounced('10.77.0.2')).toBe(true);
      expect(readFileSync(file, 'utf8')).toBe(birdRoutes(['10.77.0.1', '10.77.0.2']));
      expect(lines.filter((l) => l.msg === 'announcement update works again')).toHaveLength(1);
      a.close();
      expect(t.open.size).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a routes file that cannot be written is tried again at every sync, carriers go on meanwhile; a new routesFile is written', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      writeFileSync(join(dir, 'blocker'), '');
      const t = fakeTun();
      const { lines, log } = logLines();
      const a = new VipAnnouncer(log, join(dir, 'blocker', 'routes.conf'), null, async () => ({ stdout: '' }), t.tun);
      const wanted = new Map([['10.77.0.1', true]]);
      await a.sync(wanted);
      await a.sync(wanted);
      expect(a.isAnnounced('10.77.0.1')).toBe(true);
      expect(lines.filter((l) => l.msg === 'announcement update failed')).toHaveLength(1);
      // A reload moves the file: written at the next sync though the set of VIPs did not change.
      const file = join(dir, 'routes.conf');
      a.setFiles(file, null);
      await a.sync(wanted);
      expect(readFileSync(file, 'utf8')).toBe(birdRoutes(['10.77.0.1']));
      a.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a failed birdc configure is tried again every 5 s until BIRD takes the file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      const calls: string[] = [];
      let birdUp = false;
      const runner: CommandRunner = async (argv) => {
        if (argv[0] === 'birdc') {
          if (argv.includes('show')) return { stdout: BIRD_PROTOCOLS };
          calls.push(argv.join(' '));
          if (!birdUp) throw new Error('birdc: Unable to connect to server control socket');
        }
        return { stdout: '' };
      };
      let t0 = 1_000_000;
      const a = new VipAnnouncer(logLines().log, join(dir, 'routes.conf'), '/run/bird/bird.ctl', runner, fakeTun().tun, () => t0);
      const wanted = new Map([['10.77.0.1', true]]);
      await a.sync(wanted);
      expect(calls).toHaveLength(1);
      t0 += 1000;
      await a.sync(wanted);
      expect(calls).toHaveLength(1);
      birdUp = true;
      t0 += 4000;
      await a.sync(wanted);
      expect(calls).toEqual(['birdc -s /run/bird/bird.ctl configure', 'birdc -s /run/bird/bird.ctl configure']);
      t0 += 10_000;
      await a.sync(wanted);
      expect(calls).toHaveLength(2);
      // A reload that points at another BIRD socket tells that BIRD at once, the file unchanged.
      a.setFiles(join(dir, 'routes.conf'), '/run/bird2/bird.ctl');
      await a.sync(wanted);
      expect(calls.at(-1)).toBe('birdc -s /run/bird2/bird.ctl configure');
      a.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('VIP announcer: a restart and a moved routes file', () => {
  it('tells BIRD at its first sync even when the routes file a daemon before it left is unchanged (that daemon\'s birdc may have failed)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      const file = join(dir, 'routes.conf');
      const calls: string[] = [];
      let birdOk = false;
      const runner: CommandRunner = async (argv) => {
        calls.push(argv.slice(3).join(' '));
        if (!birdOk) throw new Error('birdc: Permission denied');
        return { stdout: argv.includes('show') ? BIRD_PROTOCOLS : '' };
      };
      const first = new VipAnnouncer(logLines().log, file, '/run/bird/bird.ctl', runner, fakeTun().tun, () => 0);
      await first.sync(new Map([['10.77.0.1', true]]));
      expect(calls).toEqual(['configure']);
      first.close(); // stopped, or killed: the file stays in /run/dsrlb
      // The operator fixes the group and restarts dsrlb: the same VIPs, the same file text.
      birdOk = true;
      const again = new VipAnnouncer(logLines().log, file, '/run/bird/bird.ctl', runner, fakeTun().tun, () => 0);
      await again.sync(new Map([['10.77.0.1', true]]));
      // Before: no configure (the file was not written) and no check, yet "announced".
      expect(calls).toEqual(['configure', 'configure', 'show protocols']);
      expect(again.isAnnounced('10.77.0.1')).toBe(true);
      await again.sync(new Map([['10.77.0.1', true]]));
      expect(calls).toHaveLength(3);
      again.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a reload that moves routesFile removes the old file, so a BIRD that still includes the old path is seen lacking the routes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      const oldFile = join(dir, 'old.conf');
      const newFile = join(dir, 'new.conf');
      // BIRD includes the old path only: its protocols exist while that file does.
      const runner: CommandRunner = async (argv) => ({ stdout: argv.includes('show') ? (existsSync(oldFile) ? BIRD_PROTOCOLS : BIRD_PROTOCOLS.replace(/^dsrlb_v[46].*\n/gm, '')) : '' });
      const { lines, log } = logLines();
      const a = new VipAnnouncer(log, oldFile, '/run/bird/bird.ctl', runner, fakeTun().tun, () => 0);
      await a.sync(new Map([['10.77.0.1', true]]));
      expect(a.isAnnounced('10.77.0.1')).toBe(true);
      a.setFiles(newFile, '/run/bird/bird.ctl');
      await a.sync(new Map([['10.77.0.1', true], ['10.77.0.2', true]]));
      expect(existsSync(oldFile)).toBe(false);
      expect(readFileSync(newFile, 'utf8')).toBe(birdRoutes(['10.77.0.1', '10.77.0.2']));
      // Before: the old file stayed, the check passed, and 10.77.0.2 was "announced" but never routed.
      expect(a.isAnnounced('10.77.0.2')).toBe(false);
      expect(JSON.stringify(lines.filter((l) => l.msg === 'announcement update failed'))).toContain('does not include announce.routesFile');
      a.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('VIP announcer: what BIRD really has', () => {
  it('calls nothing announced while BIRD lacks the routes file\'s protocols after configure (its include names another path), says so once, and sees the fix', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      let protocols = BIRD_PROTOCOLS.replace(/^dsrlb_v[46].*\n/gm, '');
      const shows: number[] = [];
      let t = 1_000_000;
      const runner: CommandRunner = async (argv) => {
        if (argv.includes('show')) shows.push(t);
        return { stdout: argv.includes('show') ? protocols : '' };
      };
      const { lines, log } = logLines();
      const a = new VipAnnouncer(log, join(dir, 'routes.conf'), '/run/bird/bird.ctl', runner, fakeTun().tun, () => t);
      await a.sync(new Map([['10.77.0.1', true]]));
      await a.sync(new Map([['10.77.0.1', true]]));
      expect(a.isAnnounced('10.77.0.1')).toBe(false);
      const failures = lines.filter((l) => l.msg === 'announcement update failed');
      expect(failures).toHaveLength(1);
      expect(JSON.stringify(failures[0])).toContain('BIRD has no protocol dsrlb_v4 or dsrlb_v6 after configure: its config does not include announce.routesFile');
      // Asked again every 5 s while they are missing, not at every 200 ms sync.
      expect(shows).toHaveLength(1);
      t += 5000;
      await a.sync(new Map([['10.77.0.1', true]]));
      expect(shows).toHaveLength(2);
      // The operator fixes BIRD's include (and reloads BIRD): seen at the next check, no VIP change needed.
      protocols = BIRD_PROTOCOLS;
      t += 5000;
      await a.sync(new Map([['10.77.0.1', true]]));
      expect(a.isAnnounced('10.77.0.1')).toBe(true);
      expect(lines.filter((l) => l.msg === 'announcement update works again')).toHaveLength(1);
      // Found: no more checks until the next configure.
      t += 60_000;
      await a.sync(new Map([['10.77.0.1', true]]));
      expect(shows).toHaveLength(3);
      a.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('host commands', () => {
  it('a command that does not answer is killed after the timeout and named in the error', async () => {
    const started = Date.now();
    await expect(commandRunner(300)(['sleep', '30'])).rejects.toThrow('sleep 30: no answer within 0.3 s (killed)');
    expect(Date.now() - started).toBeLessThan(5000);
    await expect(commandRunner(300)(['sh', '-c', 'echo no >&2; exit 3'])).rejects.toThrow('sh -c echo no >&2; exit 3: no');
    expect(await systemRunner(['sh', '-c', 'cat'], 'in')).toEqual({ stdout: 'in' });
  });

  it('logs a device that cannot be set up or down once, and its recovery, so the next failure is logged again', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsrlb-announce-'));
    try {
      const { tun, upOf } = fakeTun();
      let setWorks = false;
      const flaky: TunControl = { ...tun, setUp: (name, up) => (setWorks ? tun.setUp(name, up) : (() => { throw new Error('EIO'); })()) };
      const { lines, log } = logLines();
      const a = new VipAnnouncer(log, join(dir, 'routes.conf'), null, async () => ({ stdout: '' }), flaky);
      const wanted = new Map([['10.77.0.1', true]]);
      await a.sync(wanted);
      await a.sync(wanted);
      expect(upOf('10.77.0.1')).toBe(false);
      setWorks = true;
      await a.sync(wanted);
      expect(upOf('10.77.0.1')).toBe(true);
      setWorks = false;
      await a.sync(new Map([['10.77.0.1', false]]));
      const msgs = lines.map((l) => l.msg).filter((m) => m.startsWith('announcement update'));
      expect(msgs).toEqual(['announcement update failed', 'announcement update works again', 'announcement update failed']);
      a.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
