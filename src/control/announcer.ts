// VIP announcement for scale-out behind ECMP, through BIRD (dsrlb never speaks BGP). Per VIP the
// daemon holds a non-persistent TUN device open and BIRD exports `route VIP via "<tun>"` from a
// static protocol with `check link on` (lab-facts: the fastest withdrawal measured, 3-4 ms): the
// carrier is on while the VIP should be announced and off otherwise, and a crash closes the fd,
// which deletes the device and withdraws the route without anyone's help (a "dead man's switch").

import { closeSync } from 'node:fs';
import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { stringHash } from '../dataplane/flow-hash.js';
import { loadNative } from '../io/native-binding.js';
import { systemRunner, type CommandRunner } from './host-setup.js';
import type { Logger } from './logger.js';

/** The TUN device of a VIP: stable across restarts and LBs, so BIRD configs can name it. */
export function announceDeviceName(vip: string): string {
  return `dsv${stringHash(vip, 0x5eed).toString(16).padStart(8, '0')}`;
}

/** The BIRD snippet for a set of VIPs: one static protocol per family, routes via their devices. */
export function birdRoutes(vips: readonly string[]): string {
  const block = (proto: string, channel: string, list: readonly string[], prefix: number): string[] => [
    `protocol static ${proto} {`,
    `  ${channel};`,
    '  check link on;',
    ...list.map((v) => `  route ${v}/${prefix} via "${announceDeviceName(v)}";`),
    '}',
  ];
  return [
    '# Written by dsrlb (announce.routesFile): the VIPs this LB may announce. Do not edit.',
    ...block('dsrlb_v4', 'ipv4', vips.filter((v) => !v.includes(':')), 32),
    ...block('dsrlb_v6', 'ipv6', vips.filter((v) => v.includes(':')), 128),
    '',
  ].join('\n');
}

/**
 * Replaces `file` with `text` (through a temporary file and a rename) unless it holds it already;
 * true when it was written. The file is 0644 whatever the umask: BIRD reads it as its own user
 * (`bird` on Debian) and the packaged unit runs dsrlb with UMask=0027.
 */
export async function writeRoutesFile(file: string, text: string): Promise<boolean> {
  const current = await readFile(file, 'utf8').catch(() => null);
  if (current === text) return false;
  await mkdir(dirname(file), { recursive: true });
  const tmp = `${file}.tmp`;
  await writeFile(tmp, text);
  await chmod(tmp, 0o644);
  await rename(tmp, file);
  return true;
}

interface Gate {
  readonly name: string;
  readonly fd: number;
  carrier: boolean | null;
}

export class VipAnnouncer {
  private readonly gates = new Map<string, Gate>();

  constructor(
    private readonly log: Logger,
    private routesFile: string,
    private birdSocket: string | null,
    private readonly runner: CommandRunner = systemRunner,
  ) {}

  setFiles(routesFile: string, birdSocket: string | null): void {
    this.routesFile = routesFile;
    this.birdSocket = birdSocket;
  }

  deviceOf(vip: string): string | null {
    return this.gates.get(vip)?.name ?? null;
  }

  isAnnounced(vip: string): boolean {
    return this.gates.get(vip)?.carrier === true;
  }

  /** Make the gates match `wanted` (VIP -> announce now?): open/close devices, flip carriers. */
  async sync(wanted: ReadonlyMap<string, boolean>): Promise<void> {
    let setChanged = false;
    for (const vip of wanted.keys()) {
      if (this.gates.has(vip)) continue;
      const name = announceDeviceName(vip);
      const native = loadNative();
      const tun = native.openTun(name);
      // A new TUN has its carrier on: turn it off before the device goes up, or BIRD would
      // announce the VIP before we decided to.
      native.tunSetCarrier(tun.fd, false);
      await this.runner(['ip', 'link', 'set', 'dev', tun.name, 'up']);
      this.gates.set(vip, { name: tun.name, fd: tun.fd, carrier: false });
      setChanged = true;
    }
    for (const [vip, gate] of [...this.gates]) {
      if (wanted.has(vip)) continue;
      closeSync(gate.fd);
      this.gates.delete(vip);
      setChanged = true;
      this.log.info('VIP no longer announced: device closed', { vip, device: gate.name });
    }
    if (setChanged) await this.writeRoutes([...this.gates.keys()]);
    for (const [vip, on] of wanted) {
      const gate = this.gates.get(vip)!;
      if (gate.carrier === on) continue;
      loadNative().tunSetCarrier(gate.fd, on);
      gate.carrier = on;
      this.log[on ? 'info' : 'warn'](on ? 'VIP announced' : 'VIP withdrawn', { vip, device: gate.name });
    }
  }

  /** Carrier off everywhere (clean stop, stalled loop); the devices stay open. */
  async withdrawAll(): Promise<void> {
    for (const [vip, gate] of this.gates) {
      if (gate.carrier === false) continue;
      try {
        loadNative().tunSetCarrier(gate.fd, false);
      } catch {
        // the device is gone already: nothing to announce either
      }
      gate.carrier = false;
      this.log.warn('VIP withdrawn', { vip, device: gate.name });
    }
  }

  close(): void {
    for (const gate of this.gates.values()) {
      try {
        closeSync(gate.fd);
      } catch {
        // already closed
      }
    }
    this.gates.clear();
  }

  private async writeRoutes(vips: readonly string[]): Promise<void> {
    if (!(await writeRoutesFile(this.routesFile, birdRoutes(vips)))) return;
    this.log.info('BIRD routes file written', { file: this.routesFile, vips });
    if (this.birdSocket) {
      await this.runner(['birdc', '-s', this.birdSocket, 'configure']).catch((e: Error) =>
        this.log.warn('birdc configure failed', { socket: this.birdSocket, error: e.message }),
      );
    }
  }
}
