// The BIRD side of scale-out announcements: device names every LB agrees on, and the routes file.

import { describe, expect, it } from 'vitest';
import { announceDeviceName, birdRoutes } from '../../src/control/announcer.js';

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
});
