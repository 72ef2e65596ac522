// The BIRD side of scale-out announcements: device names every LB agrees on, and the routes file.

import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { announceDeviceName, birdRoutes, writeRoutesFile } from '../../src/control/announcer.js';

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
      expect(await writeRoutesFile(file, text)).toBe(false);
      expect(await writeRoutesFile(file, birdRoutes([]))).toBe(true);
      expect(statSync(file).mode & 0o777).toBe(0o644);
    } finally {
      process.umask(old);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
